"""Distributed queues for programs: :class:`DqTransport` and :class:`DqListener`.

A member of a distributed queue (:mod:`transports.rv.dq` for the protocol; TIBCO Rendezvous
Concepts, Distributed Queue) over a bus transport::

    from transports.rv import Transport, default_queue
    from transports.rv.dqtransport import DqTransport

    t = Transport(service="7500", network="127.0.0.1;239.192.75.1")
    dq = DqTransport(t, "ORDERS.WORKERS", worker_weight=1, worker_tasks=1)
    dq.listen("ORDERS.NEW", lambda msg, listener: process(msg))
    while True:
        default_queue().dispatch()

Each member of the queue runs the same program: the same name, the same subjects. Senders
send certified messages (:class:`~transports.rv.cmtransport.CmTransport`) to those
subjects; each task reaches one member's callback.

How it works. As for certified delivery and fault tolerance, the protocol core lives on the
loop of the bus engine under the transport: bus listeners on the queue's subject, on this
member's inbox, on the queue's certified-delivery control subject and on the listeners'
subjects feed it (on a queue dispatched on that loop), one loop timer runs it, and after
each turn what it produced is sent and its tasks queued for the program. A task is finished
when its callback returns, or, for a listener made with ``explicit_confirm``, when the
program calls :meth:`DqListener.confirm`; a callback that raises does not finish it (the
task stays with this worker; with a complete time the scheduler gives it to another).
Advisories are presented on the transport (``_RV.*.RVCM.>``, ``_RV.*.RVFT.>``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from transports.rv.advisory import is_logged
from transports.rv.cm import CONTROL_PREFIX
from transports.rv.dq import DqCore, DqTask
from transports.rv.message import Message
from transports.rv.queue import Event, Queue
from transports.rv.subject import SubjectMatcher, validate_listen_subject, validate_send_subject
from transports.rv.transport import Listener, TransportError, _BaseTransport

log = logging.getLogger("transports.rv")

Callback = Callable[[Message, "DqListener"], object]


class DqTransport:
    """A member of distributed queue ``name`` on ``transport`` (module docstring); the other
    arguments are :class:`~transports.rv.dq.DqCore`'s."""

    def __init__(self, transport: _BaseTransport, name: str, *, worker_weight: int = 1,
                 worker_tasks: int = 1, scheduler_weight: int = 1,
                 scheduler_heartbeat: float = 1.0, scheduler_activation: float = 3.5,
                 complete_time: float = 0.0, backlog_limit: int = 0, backlog_bytes: int = 0,
                 request_interval: float = 1.0) -> None:
        host = transport.host
        if host is None:
            raise TransportError("a distributed queue needs a network transport")
        self.transport = transport
        self.host = host
        self.loop: asyncio.AbstractEventLoop = host.loop
        inbox = transport.create_inbox()
        self.core = DqCore(name, inbox, worker_weight=worker_weight, worker_tasks=worker_tasks,
                           scheduler_weight=scheduler_weight,
                           scheduler_heartbeat=scheduler_heartbeat,
                           scheduler_activation=scheduler_activation,
                           complete_time=complete_time, backlog_limit=backlog_limit,
                           backlog_bytes=backlog_bytes, request_interval=request_interval,
                           now=time.monotonic())
        self.name = name
        self.closed = False
        self._lock = threading.Lock()  # the matcher and the tasks owed
        self._matcher = SubjectMatcher()
        self._owed: dict[int, tuple[str, int]] = {}  # id(task message) -> (key, callbacks due)
        self._queue = Queue("dq:" + name)
        self._queue.bind_loop(self.loop)
        self._timer: asyncio.TimerHandle | None = None
        self._turn_due = False
        self._bus = [Listener(transport, subject, self._on_bus, queue=self._queue)
                     for subject in (self.core.subject, inbox, CONTROL_PREFIX + name)]
        self._call(lambda: None)  # the first status, and the timer

    @property
    def is_scheduler(self) -> bool:
        """Whether this member is the queue's scheduler now."""
        return self.core.is_scheduler

    def listen(self, subject: str, callback: Callback, queue: Queue | None = None, *,
               explicit_confirm: bool = False) -> DqListener:
        """A queue listener on ``subject`` (no wildcard; every member listens to the same
        subjects): ``callback(msg, listener)`` for each task given to this member."""
        return DqListener(self, subject, callback, queue, explicit_confirm=explicit_confirm)

    def set_worker_weight(self, weight: int) -> None:
        self._call(lambda: self.core.set_worker(time.monotonic(), weight=weight))

    def set_worker_tasks(self, tasks: int) -> None:
        self._call(lambda: self.core.set_worker(time.monotonic(), tasks=tasks))

    def set_complete_time(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("the complete time must be >= 0")

        def run() -> None:
            self.core.complete_time = seconds

        self._call(run)

    def close(self) -> None:
        """Leave the queue (a scheduler hands over at once)."""
        if self.closed:
            return
        self.closed = True

        def leave() -> None:
            self.core.close(time.monotonic())
            self._flush()
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        self.host.call(leave)
        for listener in self._bus:
            listener.destroy()
        self._queue.destroy()

    # -- listeners ---------------------------------------------------------------------------

    def _add(self, listener: DqListener) -> None:
        validate_listen_subject(listener.subject)  # refused in the caller's thread, as the
        validate_send_subject(listener.subject, allow_wildcard=False)  # core refuses it
        with self._lock:
            self._matcher.add(listener.subject, listener)
        self._bus.append(Listener(self.transport, listener.subject, self._on_bus,
                                  queue=self._queue))
        self._call(lambda: self.core.listen(listener.subject, time.monotonic()))

    def _finish(self, msg: Message) -> None:
        """A callback returned (or the program confirmed): once every listener the task went
        to is done, the task is finished."""
        with self._lock:
            entry = self._owed.get(id(msg))
            if entry is None:
                return
            key, due = entry
            if due > 1:
                self._owed[id(msg)] = (key, due - 1)
                return
            del self._owed[id(msg)]
        self._call(lambda: self.core.complete(key, time.monotonic()))

    # -- on the loop -------------------------------------------------------------------------

    def _call(self, fn: Callable[[], object]) -> None:
        """``fn()`` on the loop (now, if this is the loop), then a turn."""
        def run() -> None:
            if not self.core.closed:
                fn()
                self._kick()

        self.host.soon(run)

    def _on_bus(self, msg: Message, _: Listener) -> None:
        self.core.receive(msg, time.monotonic())
        self._kick()

    def _kick(self) -> None:
        if not self._turn_due:
            self._turn_due = True
            self.loop.call_soon(self._turn)

    def _turn(self) -> None:
        self._turn_due = False
        if self.core.closed:
            return
        self._flush()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = self.core.next_deadline()
        if deadline is not None:
            self._timer = self.loop.call_later(max(0.0, deadline - time.monotonic()),
                                               self._tick)

    def _tick(self) -> None:
        self._timer = None
        self.core.tick(time.monotonic())
        self._turn()

    def _flush(self) -> None:
        out, events = self.core.flush(time.monotonic())
        if self.transport.closed:
            return
        for msg in out:
            try:
                self.transport._send(msg, internal=True)
            except Exception as exc:  # noqa: BLE001 - one unsendable message stops no other
                log.error("distributed queue %s: cannot send to %s: %s", self.name,
                          msg.send_subject, exc)
        for event in events:
            if isinstance(event, DqTask):
                self._present(event)
            elif not self.transport.present(event) and is_logged(event.send_subject or ""):
                log.warning("rv advisory %s", event.to_text())

    def _present(self, task: DqTask) -> None:
        subject = task.msg.send_subject or ""
        with self._lock:
            listeners = self._matcher.match(subject)
            if listeners:
                self._owed[id(task.msg)] = (task.key, len(listeners))
        if not listeners:
            return  # the listener is gone: the task stays with this worker, unfinished
        for listener in listeners:
            assert isinstance(listener, DqListener)
            listener.queue.push(Event(listener, task.msg))


class DqListener:
    """A queue listener (:meth:`DqTransport.listen`)."""

    __slots__ = ("dq", "subject", "user_callback", "queue", "active", "explicit")

    def __init__(self, dq: DqTransport, subject: str, callback: Callback,
                 queue: Queue | None = None, *, explicit_confirm: bool = False) -> None:
        self.dq = dq
        self.subject = subject
        self.user_callback = callback
        self.queue = queue if queue is not None else dq.transport.default_listener_queue
        self.explicit = explicit_confirm
        self.active = True
        dq._add(self)

    def callback(self, msg: Message, _: object) -> None:
        """Run by the queue: the program's callback, then the task is finished."""
        self.user_callback(msg, self)
        if not self.explicit:
            self.dq._finish(msg)

    def confirm(self, msg: Message) -> None:
        """The task ``msg`` is finished (explicit confirmation)."""
        self.dq._finish(msg)

    def destroy(self) -> None:
        """Stop taking tasks on this subject here (the queue still listens to it)."""
        if not self.active:
            return
        self.active = False
        with self.dq._lock:
            self.dq._matcher.remove(self.subject, self)
        self.queue.purge(self)

    def __repr__(self) -> str:
        return f"DqListener({self.subject!r})"
