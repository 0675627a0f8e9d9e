"""Distributed queues on the RV-style bus: one-of-n certified delivery, sans I/O.

The model is TIBCO Rendezvous Concepts, Distributed Queue: a group of processes that share
one correspondent name and look like one CM listener from outside. Senders need nothing
special: they send certified messages to ordinary subjects, and each message -- a *task* --
goes to exactly one member. Every member is a *worker*; one of them, chosen by fault
tolerance (:mod:`transports.rv.ft`, goal 1, the *scheduler weight*), is also the
*scheduler*: it alone holds the certified delivery agreements with the senders
(:class:`~transports.rv.cm.CmCore` under the queue's name, its ledger in memory, asking for
old messages), gives each task to a worker, and confirms it to its sender when the worker
has finished it.

:class:`DqCore` is one member, both roles. Like :mod:`transports.rv.cm` and
:mod:`transports.rv.ft` it reads no clock and opens no socket: a driver
(:mod:`transports.rv.dqtransport`) feeds it the bus's messages and the time, sends what
:meth:`DqCore.flush` gives out and hands the tasks to the program, whose completions come
back through :meth:`DqCore.complete`.

The protocol is this bus's own (Rendezvous does not publish its wire protocol). Besides the
fault-tolerance statuses, members talk on ``_RVCMQ.<name>`` (multicast) and on each
member's inbox (point to point), with ``op`` and ``member`` (the member's id):

=========== ============================ ================================================
op          from -> to                   fields, meaning
=========== ============================ ================================================
``WORKER``  member -> all                ``inbox``, ``weight``, ``tasks`` (its task
                                         capacity), ``busy`` (the tasks it holds); every
                                         heartbeat. Answering a ``QUERY`` also ``query``
                                         (the scheduler's id) and ``done`` (tasks finished
                                         whose completion the scheduler has not
                                         acknowledged); ``leaving`` when it closes
``QUERY``   new scheduler -> all         ``inbox``: tell me what you hold
``TASK``    scheduler -> worker inbox    ``key``, ``inbox`` (the scheduler's), ``msg``
                                         (the task, encoded, with its CM label)
``ACCEPT``  worker -> scheduler inbox    ``key``: received, being worked on
``DONE``    worker -> scheduler inbox    ``key``: finished
``ACK``     scheduler -> worker inbox    ``key``: the sender has the confirmation; forget it
=========== ============================ ================================================

A task's key is ``[sender, subject, sequence]`` as JSON for a certified task (the same at
every scheduler, so a task sent again after a hand-over is recognised), and
``["", scheduler id, n]`` for one that is not certified.

The rules, with the sections of Distributed Queue they follow:

* **Assignment** ("Task Scheduling"): to the available worker with the highest worker
  weight, round robin among equal weights; a worker is available while it holds fewer tasks
  than its capacity. The scheduler gives itself a task only when every other worker is
  busy (a capacity of 0 makes a dedicated scheduler). With no worker available the task
  waits in the scheduler's backlog; past ``backlog_limit`` messages (or ``backlog_bytes``)
  it is discarded, confirmed to its sender, and ``QUEUE.SCHEDULER.OVERFLOW`` presented.
* **Completion**: a worker confirms a task by finishing it (``DONE``); the scheduler
  confirms it to the sender, and acknowledges the worker only once the sender's confirmed
  position covers the task (certified delivery confirms in sequence: a task finished while
  an earlier one is still worked on is not confirmed yet). Until then the worker keeps the
  task's key.
* **Exceptional cases** ("Exceptional Cases"): a worker unheard for the activation interval,
  or leaving, has its unfinished tasks assigned again; a task not accepted within the
  activation interval is assigned again; with a *complete time* a task not finished within
  it after its assignment is assigned again (it may then be done twice, as Rendezvous
  warns); complete time 0 waits for ever.
* **Scheduler hand-over**: a new scheduler asks every member what it holds (``QUERY``) and
  assigns nothing until each live member (heard within the activation interval) has
  answered -- asking again every heartbeat, and waiting at most five activation
  intervals for a member that heartbeats but does not answer. The senders send it again what the old scheduler had not confirmed
  (its agreements ask for old messages); a task some worker holds stays with that worker,
  and one already finished is confirmed without being done again. So a hand-over neither
  loses nor doubles a certified task, where Rendezvous assigns the incomplete ones again.
  Tasks that are not certified are not recovered.
* **Advisories** (TIBCO Rendezvous Concepts, Appendix B): ``QUEUE.SCHEDULER.ACTIVE`` and
  ``INACTIVE`` (``name``) when a member becomes or stops being the scheduler;
  ``QUEUE.SCHEDULER.OVERFLOW`` (``name``, ``subject``, ``sender``, ``seqno``, ``reason``)
  at the scheduler; the certified-delivery advisories of the scheduler's agreements.
"""

from __future__ import annotations

import heapq
import itertools
import json
import random
from collections import deque
from typing import Final

from transports.rv.advisory import advisory_message
from transports.rv.cm import CONTROL_PREFIX, CmCore, CmDelivery
from transports.rv.codec import FormatError, decode, encode
from transports.rv.ft import FtAction, FtCore
from transports.rv.message import Message, RvType
from transports.rv.subject import validate_listen_subject, validate_send_subject

DQ_PREFIX: Final = "_RVCMQ."

SCHEDULER_ACTIVE: Final = "_RV.INFO.RVCM.QUEUE.SCHEDULER.ACTIVE."
SCHEDULER_INACTIVE: Final = "_RV.INFO.RVCM.QUEUE.SCHEDULER.INACTIVE."
SCHEDULER_OVERFLOW: Final = "_RV.WARN.RVCM.QUEUE.SCHEDULER.OVERFLOW."
OVERFLOW_REASON: Final = "Task backlog limit reached."
# A new scheduler waits for every live member's answer; past this many activation intervals
# it stops waiting for one that heartbeats but does not answer.
HOLD_LIMIT: Final = 5

_FT_OPS: Final = ("STATUS", "LEAVE")
_TYPES: Final = {"weight": RvType.U32, "tasks": RvType.U32, "busy": RvType.STRINGARRAY,
                 "done": RvType.STRINGARRAY, "msg": RvType.OPAQUE, "leaving": RvType.BOOL}


class DqTask:
    """A task for this member's program: ``msg`` (with its CM label when certified); finish
    it with :meth:`DqCore.complete` (``key``)."""

    __slots__ = ("key", "msg")

    def __init__(self, key: str, msg: Message) -> None:
        self.key = key
        self.msg = msg

    def __repr__(self) -> str:
        return f"DqTask({self.key})"


class _Worker:
    """Scheduler side: one member as a worker."""

    __slots__ = ("inbox", "weight", "capacity", "last", "tasks")

    def __init__(self, inbox: str) -> None:
        self.inbox = inbox
        self.weight = 1
        self.capacity = 1
        self.last = 0.0
        self.tasks: set[str] = set()


class _Task:
    """Scheduler side: one task not finished yet."""

    __slots__ = ("msg", "size", "sender", "subject", "seq", "worker", "accepted",
                 "assigned_at")

    def __init__(self, msg: Message, sender: str, subject: str, seq: int) -> None:
        self.msg = msg
        self.size = 0
        self.sender = sender
        self.subject = subject
        self.seq = seq  # 0: not certified
        self.worker: str | None = None
        self.accepted = False
        self.assigned_at = 0.0


def task_key(sender: str, subject: str, seq: int) -> str:
    """The key of a certified task, the same at every scheduler."""
    return json.dumps([sender, subject, seq], ensure_ascii=False)


class DqCore:
    """One member of distributed queue ``name`` (module docstring).

    Args:
        name: the queue's correspondent name, shared by its members.
        inbox: this member's inbox on the bus (tasks and acknowledgements come there).
        worker_weight: higher gets tasks first (Rendezvous' default 1).
        worker_tasks: the task capacity, how many tasks it holds at once (default 1; 0: it
            never works, a dedicated scheduler).
        scheduler_weight: its weight in the scheduler election (higher wins).
        scheduler_heartbeat, scheduler_activation: the election's intervals, the same in
            every member (defaults 1 s and 3.5 s).
        complete_time: seconds after which an unfinished task is assigned again; 0 = never.
        backlog_limit, backlog_bytes: the scheduler's backlog of tasks no worker can take,
            in messages and in bytes; 0 = no limit.
        request_interval: the scheduler's certified-delivery request interval.
        now: the current time in seconds (any clock, the same for every call).
    """

    def __init__(self, name: str, inbox: str, *, worker_weight: int = 1,
                 worker_tasks: int = 1, scheduler_weight: int = 1,
                 scheduler_heartbeat: float = 1.0, scheduler_activation: float = 3.5,
                 complete_time: float = 0.0, backlog_limit: int = 0, backlog_bytes: int = 0,
                 request_interval: float = 1.0, now: float,
                 rng: random.Random | None = None) -> None:
        validate_send_subject(name, allow_wildcard=False)
        if name.startswith("_"):
            raise ValueError(f"queue name {name!r}: a name may not start with '_'")
        if worker_weight < 0 or worker_tasks < 0 or complete_time < 0:
            raise ValueError("worker weight, task capacity and complete time must be >= 0")
        if backlog_limit < 0 or backlog_bytes < 0:
            raise ValueError("backlog limits must be >= 0")
        self.rng = rng or random.Random()
        self.name = name
        self.subject = DQ_PREFIX + name
        self.inbox = inbox
        self.ft = FtCore(name, weight=scheduler_weight, heartbeat=scheduler_heartbeat,
                         activation=scheduler_activation, now=now, rng=self.rng,
                         subject=self.subject)
        self.id = self.ft.id
        self.heartbeat = scheduler_heartbeat
        self.activation = scheduler_activation
        self.worker_weight = worker_weight
        self.worker_tasks = worker_tasks
        self.complete_time = complete_time
        self.backlog_limit = backlog_limit
        self.backlog_bytes = backlog_bytes
        self.request_interval = request_interval
        self.patterns: list[str] = []
        self._out: list[Message] = []
        self._events: list[DqTask | Message] = []
        self.closed = False
        # worker side
        self._sched: tuple[str, str] | None = None  # the scheduler's (id, inbox)
        self._replaced: deque[str] = deque(maxlen=16)  # schedulers another one queried after
        self._given_by: dict[str, str] = {}  # task held -> the inbox of the scheduler that gave it
        self._busy: dict[str, Message] = {}  # tasks held, in order of arrival
        self._done: dict[str, None] = {}  # finished, not acknowledged
        self._next_status = now
        # scheduler side
        self.cm: CmCore | None = None
        self._workers: dict[str, _Worker] = {}
        self._tasks: dict[str, _Task] = {}
        self._backlog: deque[str] = deque()
        self._backlog_size = 0
        self._last_pick: dict[int, str] = {}  # worker weight -> the id given the last task
        self._hold_until = 0.0  # a new scheduler assigns nothing before (or all answered)
        self._unanswered: set[str] = set()
        self._next_query = 0.0  # while holding: when to ask the silent ones again
        self._claimed: dict[str, str] = {}  # task key -> worker that reports holding it
        self._finished: dict[str, float] = {}  # reported done before the task came: expiry
        # (sender, subject) -> heap of (seq, key): finished, acknowledged once confirmed
        self._to_ack: dict[tuple[str, str], list[tuple[int, str]]] = {}
        self._ack_to: dict[str, str] = {}  # task key -> the inbox to acknowledge
        self._local = itertools.count(1)

    @property
    def is_scheduler(self) -> bool:
        return self.cm is not None

    # -- the program's side ------------------------------------------------------------------

    def listen(self, pattern: str, now: float) -> None:
        """The program listens to ``pattern`` with a queue listener; every member must
        listen to the same subjects. Wildcards are refused (Distributed Queue, "Listeners")."""
        validate_listen_subject(pattern)
        validate_send_subject(pattern, allow_wildcard=False)
        if pattern not in self.patterns:
            self.patterns.append(pattern)
            if self.cm is not None:
                self.cm.listen(pattern, now)

    def complete(self, key: str, now: float) -> None:
        """The program finished task ``key``."""
        if self._busy.pop(key, None) is None:
            return
        self._done[key] = None
        given_by = self._given_by.pop(key, "")
        to = self._sched[1] if self._sched is not None else given_by
        if to:
            self._send(to, "DONE", key=key, inbox=self.inbox)

    def set_worker(self, now: float, *, weight: int | None = None,
                   tasks: int | None = None) -> None:
        """Change the worker weight or task capacity; the scheduler hears it at once."""
        if weight is not None:
            if weight < 0:
                raise ValueError("the worker weight must be >= 0")
            self.worker_weight = weight
        if tasks is not None:
            if tasks < 0:
                raise ValueError("the task capacity must be >= 0")
            self.worker_tasks = tasks
        self._status(now)

    def close(self, now: float) -> None:
        """Leave the queue: the others know at once; a scheduler hands over."""
        if self.closed:
            return
        self._status(now, leaving=True)
        if self.cm is not None:
            self._resign()
        self.ft.withdraw()
        self._out.extend(self.ft.flush()[0])
        self.closed = True

    # -- the driver's side -------------------------------------------------------------------

    def receive(self, msg: Message, now: float) -> None:
        """A message from the bus: on the queue's subject, this member's inbox, or (at the
        scheduler) a task subject or the queue's certified-delivery control subject."""
        if self.closed:
            return
        subject = msg.send_subject
        if subject == self.subject or subject == self.inbox:
            try:
                op = msg.get("op")
            except (KeyError, ValueError):
                return
            if op in _FT_OPS:
                self.ft.receive(msg, now)
            elif isinstance(op, str):
                self._on_control(op, msg, now)
            return
        if self.cm is not None:
            self.cm.receive(msg, now)

    def tick(self, now: float) -> None:
        """Run what is due: statuses, the election, lost workers, reassignments."""
        if self.closed:
            return
        self.ft.tick(now)
        if now >= self._next_status:
            self._status(now)
        if self.cm is None:
            return
        self.cm.tick(now)
        lost = [ident for ident, w in self._workers.items()
                if ident != self.id and now - w.last >= self.activation]
        for ident in lost:
            self._lose_worker(ident)
        for key, task in list(self._tasks.items()):
            if task.worker is None:
                continue
            late_accept = not task.accepted and now - task.assigned_at >= self.activation
            late_finish = (self.complete_time and task.accepted
                           and now - task.assigned_at >= self.complete_time)
            if late_accept or late_finish:
                # (past the complete time the worker still works on it: it stays busy)
                self._unassign(key, task, still_held=bool(late_finish))
                self._backlog.appendleft(key)
                self._backlog_size += task.size
        for key in [k for k, t in self._finished.items() if t <= now]:
            del self._finished[key]  # never sent again: its sender had the confirmation
            inbox = self._ack_to.pop(key, None)
            if inbox is not None:
                self._send(inbox, "ACK", key=key)
        if self._hold_until:
            # (a member gone silent is no longer waited for; the others are asked again)
            live = {ident for ident, _, _ in self.ft.ranking(now)}
            self._unanswered &= live
            if not self._unanswered or now >= self._hold_until:
                self._hold_until = 0.0
                self._unanswered.clear()
            elif now >= self._next_query:
                self._query(now)
        self._assign(now)

    def next_deadline(self) -> float | None:
        if self.closed:
            return None
        times = [self._next_status]
        ft = self.ft.next_deadline()
        if ft is not None:
            times.append(ft)
        if self.cm is not None:
            cm = self.cm.next_deadline()
            if cm is not None:
                times.append(cm)
            times.extend(w.last + self.activation for i, w in self._workers.items()
                         if i != self.id)
            for task in self._tasks.values():
                if task.worker is None:
                    continue
                if not task.accepted:
                    times.append(task.assigned_at + self.activation)
                elif self.complete_time:
                    times.append(task.assigned_at + self.complete_time)
            if self._finished:
                times.append(min(self._finished.values()))
            if self._hold_until:
                times.append(self._hold_until)
        return min(times)

    def flush(self, now: float) -> tuple[list[Message], list[DqTask | Message]]:
        """The messages to send, in order, and the events for the program: tasks for this
        worker and advisories."""
        ft_out, ft_events = self.ft.flush()
        self._out[:0] = ft_out
        for event in ft_events:
            if event is FtAction.ACTIVATE:
                self._take_over(now)
            elif event is FtAction.DEACTIVATE:
                self._resign()
            elif isinstance(event, Message):
                self._events.append(event)
        while self.cm is not None:
            # Until the agreements have nothing more: a task found finished already, or
            # discarded, is confirmed here, and that confirmation goes out in the next round.
            cm_out, cm_events = self.cm.flush()
            self._out.extend(cm_out)
            for ev in cm_events:
                if isinstance(ev, CmDelivery):
                    self._task_in(ev, now)
                else:
                    self._events.append(ev.message())
            self._assign(now)  # (also when a worker finished or came: the backlog moves)
            if not cm_events:
                self._ack_confirmed()
                break
        out, self._out = self._out, []
        events, self._events = self._events, []
        return out, events

    # -- worker side -------------------------------------------------------------------------

    def _status(self, now: float, *, query: str = "", leaving: bool = False) -> None:
        msg = self._message(self.subject, "WORKER", inbox=self.inbox,
                            weight=self.worker_weight, tasks=self.worker_tasks,
                            busy=list(self._busy))
        if query:
            msg.add("query", query, RvType.STRING)
            msg.add("done", list(self._done), RvType.STRINGARRAY)
        if leaving:
            msg.add("leaving", True, RvType.BOOL)
        self._out.append(msg)
        self._next_status = now + self.heartbeat
        if self.cm is not None:
            self._note_worker(self.id, msg, now)

    def _on_task(self, msg: Message) -> None:
        key, inbox, sched = _str(msg, "key"), _str(msg, "inbox"), _str(msg, "member")
        data = msg.get("msg") if "msg" in msg else None
        if not key or not inbox or not isinstance(data, bytes):
            return
        if sched in self._replaced:
            return  # from a scheduler that was replaced: the new one decides
        self._sched = (sched, inbox)
        if key in self._done:
            self._send(inbox, "DONE", key=key, inbox=self.inbox)
            return
        self._send(inbox, "ACCEPT", key=key)
        if key in self._busy:
            return
        try:
            task = decode(data)
        except (FormatError, ValueError):
            return
        self._busy[key] = task
        self._given_by[key] = inbox
        self._events.append(DqTask(key, task))

    def _follow(self, sched: str, inbox: str) -> None:
        """``sched`` asked what this member holds (it took over): tasks still coming from
        the one it replaced are left to it."""
        if sched in self._replaced:
            self._replaced.remove(sched)  # it took over again
        old = self._sched[0] if self._sched is not None else None
        if old is not None and old not in (sched, self.id):
            self._replaced.append(old)
        self._sched = (sched, inbox)

    # -- scheduler side ----------------------------------------------------------------------

    def _take_over(self, now: float) -> None:
        self.cm = CmCore(self.name, now=now, require_old=True,
                         request_interval=self.request_interval,
                         rng=random.Random(self.rng.random()))
        for pattern in self.patterns:
            self.cm.listen(pattern, now)
        self._workers = {}
        self._hold_until = now + HOLD_LIMIT * self.activation
        self._unanswered = {ident for ident, _, _ in self.ft.ranking(now) if ident != self.id}
        if not self._unanswered:
            self._hold_until = 0.0
        if self.id in self._replaced:
            self._replaced.remove(self.id)
        self._sched = (self.id, self.inbox)
        self._query(now)
        self._status(now, query=self.id)
        self._events.append(advisory_message(SCHEDULER_ACTIVE + self.name, {"name": self.name}))

    def _query(self, now: float) -> None:
        self._out.append(self._message(self.subject, "QUERY", inbox=self.inbox))
        self._next_query = now + self.heartbeat

    def _resign(self) -> None:
        """No longer the scheduler: the senders send the next one what is not confirmed."""
        self.cm = None
        self._workers.clear()
        self._tasks.clear()
        self._backlog.clear()
        self._backlog_size = 0
        self._claimed.clear()
        self._finished.clear()
        self._to_ack.clear()
        self._ack_to.clear()
        self._unanswered.clear()
        self._hold_until = 0.0
        if self._sched is not None and self._sched[0] == self.id:
            self._sched = None
        self._events.append(advisory_message(SCHEDULER_INACTIVE + self.name,
                                             {"name": self.name}))

    def _note_worker(self, ident: str, msg: Message, now: float) -> None:
        """A worker's status: its table entry; what it holds and finished."""
        inbox = _str(msg, "inbox")
        if not inbox:
            return
        if "leaving" in msg:
            self._lose_worker(ident)
            return
        worker = self._workers.get(ident)
        if worker is None:
            worker = self._workers[ident] = _Worker(inbox)
        worker.inbox = inbox
        worker.last = now
        weight, tasks = msg.get("weight"), msg.get("tasks")
        if isinstance(weight, int) and isinstance(tasks, int):
            worker.weight, worker.capacity = weight, tasks
        busy = _strings(msg, "busy")
        for key in busy:
            task = self._tasks.get(key)
            if task is None:
                self._claimed[key] = ident  # sent to us again later: it stays there
            elif task.worker is None:
                self._attach(key, task, ident, now)
        held = set(busy)
        for key in [k for k, owner in self._claimed.items() if owner == ident and k not in held]:
            del self._claimed[key]  # it finished (or dropped) one never sent to us again
        if _str(msg, "query") == self.id:
            self._unanswered.discard(ident)
            if not self._unanswered:
                self._hold_until = 0.0
            for key in _strings(msg, "done"):
                self._on_done(key, inbox, now)

    def _on_control(self, op: str, msg: Message, now: float) -> None:
        ident = _str(msg, "member")
        if op == "TASK":
            self._on_task(msg)
        elif op == "ACK":
            self._done.pop(_str(msg, "key"), None)
        elif op == "QUERY":
            inbox = _str(msg, "inbox")
            if ident and inbox and ident != self.id:
                self._follow(ident, inbox)
                self._status(now, query=ident)
        elif self.cm is None:
            return
        elif op == "WORKER" and ident and ident != self.id:
            self._note_worker(ident, msg, now)
        elif op == "ACCEPT":
            task = self._tasks.get(_str(msg, "key"))
            if task is not None and task.worker == ident:
                task.accepted = True
        elif op == "DONE":
            inbox = _str(msg, "inbox")
            if inbox:
                self._on_done(_str(msg, "key"), inbox, now)

    def _task_in(self, d: CmDelivery, now: float) -> None:
        """A message for the queue from the scheduler's agreements: a task."""
        if d.seq:
            key = task_key(d.sender or "", d.subject, d.seq)
        else:
            key = json.dumps(["", self.id, next(self._local)])
        if key in self._tasks:
            return
        task = _Task(d.msg, d.sender or "", d.subject, d.seq)
        if key in self._finished:  # a worker did it for the scheduler before
            del self._finished[key]
            self._confirm(key, task, self._ack_to.pop(key, ""))
            return
        self._tasks[key] = task
        owner = self._claimed.pop(key, None)
        if owner is not None and owner in self._workers:
            self._attach(key, task, owner, now)
            return
        task.size = len(encode(d.msg))
        if not self._worker_free() and not self._hold_until and (
                (self.backlog_limit and len(self._backlog) >= self.backlog_limit)
                or (self.backlog_bytes and self._backlog_size + task.size > self.backlog_bytes)):
            del self._tasks[key]
            self._events.append(advisory_message(SCHEDULER_OVERFLOW + self.name, {
                "name": self.name, "subject": d.subject, "sender": d.sender or "",
                "seqno": d.seq, "reason": OVERFLOW_REASON}))
            if d.seq and self.cm is not None:
                self.cm.confirm(task.sender, task.subject, task.seq)
            return
        self._backlog.append(key)
        self._backlog_size += task.size

    def _worker_free(self) -> bool:
        return any(len(w.tasks) < w.capacity for w in self._workers.values())

    def _pick(self, key: str) -> str | None:
        """The worker for task ``key``: the highest weight with room, round robin among
        equals; this member only when every other one is busy; never one that holds it."""
        free = [(i, w) for i, w in self._workers.items()
                if i != self.id and len(w.tasks) < w.capacity and key not in w.tasks]
        if not free:
            me = self._workers.get(self.id)
            return (self.id if me is not None and len(me.tasks) < me.capacity
                    and key not in me.tasks else None)
        best = max(w.weight for _, w in free)
        ids = sorted(i for i, w in free if w.weight == best)
        last = self._last_pick.get(best)
        pick = next((i for i in ids if last is not None and i > last), ids[0])
        self._last_pick[best] = pick
        return pick

    def _assign(self, now: float) -> None:
        if self.cm is None or self._hold_until:
            return
        skipped: list[str] = []
        while self._backlog:
            key = self._backlog[0]
            task = self._tasks.get(key)
            if task is None or task.worker is not None:
                self._backlog.popleft()
                continue
            ident = self._pick(key)
            if ident is None:
                if not self._worker_free():
                    break
                skipped.append(self._backlog.popleft())  # only its holders have room
                self._backlog_size -= task.size
                continue
            self._backlog.popleft()
            self._backlog_size -= task.size
            self._attach(key, task, ident, now, accepted=False)
            msg = self._message(self._workers[ident].inbox, "TASK", key=key,
                                inbox=self.inbox, msg=encode(task.msg))
            self._out.append(msg)
        for key in reversed(skipped):
            self._backlog.appendleft(key)
            task = self._tasks.get(key)
            self._backlog_size += task.size if task is not None else 0

    def _attach(self, key: str, task: _Task, ident: str, now: float, *,
                accepted: bool = True) -> None:
        if task.worker is None and key in self._backlog:
            self._backlog.remove(key)
            self._backlog_size -= task.size
        task.worker = ident
        task.accepted = accepted
        task.assigned_at = now
        self._workers[ident].tasks.add(key)

    def _unassign(self, key: str, task: _Task, *, still_held: bool = False) -> None:
        worker = self._workers.get(task.worker or "")
        if worker is not None and not still_held:
            worker.tasks.discard(key)
        task.worker = None
        task.accepted = False

    def _lose_worker(self, ident: str) -> None:
        worker = self._workers.pop(ident, None)
        if worker is None:
            return
        for key in sorted(worker.tasks, reverse=True):
            task = self._tasks.get(key)
            if task is not None and task.worker == ident:
                task.worker = None
                task.accepted = False
                self._backlog.appendleft(key)
                self._backlog_size += task.size
        for key in [k for k, owner in self._claimed.items() if owner == ident]:
            del self._claimed[key]

    def _on_done(self, key: str, inbox: str, now: float) -> None:
        task = self._tasks.get(key)
        if task is None:
            try:
                sender, subject, seq = json.loads(key)
            except (ValueError, TypeError):
                return
            confirmed = (self.cm.source_confirmed(sender, subject)
                         if self.cm is not None and isinstance(sender, str)
                         and isinstance(subject, str) else None)
            if (sender and isinstance(seq, int) and seq > 0
                    and (confirmed is None or confirmed < seq)):
                # Finished for an earlier scheduler, not sent to this one yet: when it comes
                # it is confirmed, not done again.
                self._finished[key] = now + 10 * self.activation
                self._ack_to[key] = inbox
            else:
                self._send(inbox, "ACK", key=key)
            return
        if key in self._backlog:
            self._backlog.remove(key)
            self._backlog_size -= task.size
        self._unassign(key, task)
        for worker in self._workers.values():
            worker.tasks.discard(key)  # also a worker whose time to finish it had passed
        del self._tasks[key]
        self._confirm(key, task, inbox)

    def _confirm(self, key: str, task: _Task, inbox: str) -> None:
        """Confirm a finished task to its sender; acknowledge it to the worker once the
        sender's confirmed position covers it."""
        if not task.seq or self.cm is None:
            if inbox:
                self._send(inbox, "ACK", key=key)
            return
        self.cm.confirm(task.sender, task.subject, task.seq)
        if inbox:
            self._ack_to[key] = inbox
            heapq.heappush(self._to_ack.setdefault((task.sender, task.subject), []),
                           (task.seq, key))

    def _ack_confirmed(self) -> None:
        """Acknowledge the finished tasks the senders' confirmed positions now cover (all of
        a source whose agreement ended)."""
        assert self.cm is not None
        for source in list(self._to_ack):
            heap = self._to_ack[source]
            confirmed = self.cm.source_confirmed(*source)
            while heap and (confirmed is None or heap[0][0] <= confirmed):
                key = heapq.heappop(heap)[1]
                inbox = self._ack_to.pop(key, None)
                if inbox is not None:
                    self._send(inbox, "ACK", key=key)
            if not heap:
                del self._to_ack[source]

    # -- messages ----------------------------------------------------------------------------

    def _message(self, subject: str, op: str, /, **fields: object) -> Message:
        msg = Message(subject)
        msg.add("op", op, RvType.STRING)
        msg.add("member", self.id, RvType.STRING)
        for name, value in fields.items():
            msg.add(name, value, _TYPES.get(name, RvType.STRING))
        return msg

    def _send(self, inbox: str, op: str, /, **fields: object) -> None:
        self._out.append(self._message(inbox, op, **fields))


def _str(msg: Message, name: str) -> str:
    value = msg.get(name) if name in msg else ""
    return value if isinstance(value, str) else ""


def _strings(msg: Message, name: str) -> list[str]:
    value = msg.get(name) if name in msg else []
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


__all__ = ["CONTROL_PREFIX", "DQ_PREFIX", "DqCore", "DqTask", "SCHEDULER_ACTIVE",
           "SCHEDULER_INACTIVE", "SCHEDULER_OVERFLOW", "task_key"]
