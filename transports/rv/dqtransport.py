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

How it works. As for fault tolerance, the protocol core lives on the loop of the bus engine
under the transport (:class:`~transports.rv.driver.CoreDriver`): bus listeners on the
queue's subject, on this member's inbox, on the queue's certified-delivery control subject
and on the listeners' subjects feed it, one loop timer runs it, and after each turn what it
produced is sent and its tasks queued for the program. A task is finished
when its callback returns, or, for a listener made with ``explicit_confirm``, when the
program calls :meth:`DqListener.confirm`; a callback that raises does not finish it (the
task stays with this worker; with a complete time the scheduler gives it to another).
Advisories are presented on the transport (``_RV.*.RVCM.>``, ``_RV.*.RVFT.>``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from transports.rv.cm import CONTROL_PREFIX
from transports.rv.dq import DqCore, DqTask
from transports.rv.driver import CoreDriver, ProgramListener
from transports.rv.message import Message
from transports.rv.queue import Event, Queue
from transports.rv.subject import SubjectMatcher, validate_listen_subject, validate_send_subject
from transports.rv.transport import _BaseTransport

Callback = Callable[[Message, "DqListener"], object]


class DqTransport(CoreDriver):
    """A member of distributed queue ``name`` on ``transport`` (module docstring); the other
    arguments are :class:`~transports.rv.dq.DqCore`'s."""

    core: DqCore

    def __init__(self, transport: _BaseTransport, name: str, *, worker_weight: int = 1,
                 worker_tasks: int = 1, scheduler_weight: int = 1,
                 scheduler_heartbeat: float = 1.0, scheduler_activation: float = 3.5,
                 complete_time: float = 0.0, backlog_limit: int = 0, backlog_bytes: int = 0,
                 request_interval: float = 1.0) -> None:
        super().__init__(transport, "dq:" + name, "a distributed queue")
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
        for subject in (self.core.subject, inbox, CONTROL_PREFIX + name):
            self.bus_listen(subject)
        self.call(lambda: None)  # the first status, and the timer

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
        self.call(lambda: self.core.set_worker(time.monotonic(), weight=weight))

    def set_worker_tasks(self, tasks: int) -> None:
        self.call(lambda: self.core.set_worker(time.monotonic(), tasks=tasks))

    def set_complete_time(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("the complete time must be >= 0")

        def run() -> None:
            self.core.complete_time = seconds

        self.call(run)

    def close(self) -> None:
        """Leave the queue (a scheduler hands over at once)."""
        if self.closed:
            return
        self.closed = True

        def leave() -> None:
            self.core.close(time.monotonic())
            self.flush()
            self.stop()

        self.host.call(leave)

    # -- listeners ---------------------------------------------------------------------------

    def _add(self, listener: DqListener) -> None:
        validate_listen_subject(listener.subject)  # refused in the caller's thread, as the
        validate_send_subject(listener.subject, allow_wildcard=False)  # core refuses it
        with self._lock:
            self._matcher.add(listener.subject, listener)
        self.bus_listen(listener.subject)
        self.call(lambda: self.core.listen(listener.subject, time.monotonic()))

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
        self.call(lambda: self.core.complete(key, time.monotonic()))

    # -- on the loop -------------------------------------------------------------------------

    def flush(self) -> None:
        out, events = self.core.flush(time.monotonic())
        self.send(out, f"distributed queue {self.name}")
        for event in events:
            if isinstance(event, DqTask):
                self._hand_out(event)
            else:
                self.present(event)

    def _hand_out(self, task: DqTask) -> None:
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


class DqListener(ProgramListener):
    """A queue listener (:meth:`DqTransport.listen`); :meth:`confirm` finishes a task."""

    __slots__ = ("dq",)

    def __init__(self, dq: DqTransport, subject: str, callback: Callback,
                 queue: Queue | None = None, *, explicit_confirm: bool = False) -> None:
        super().__init__(subject, callback,
                         queue if queue is not None else dq.transport.default_listener_queue,
                         explicit_confirm)
        self.dq = dq
        dq._add(self)

    def confirm(self, msg: Message) -> None:
        """The task ``msg`` is finished."""
        self.dq._finish(msg)

    def destroy(self) -> None:
        """Stop taking tasks on this subject here (the queue still listens to it)."""
        if not self.active:
            return
        self.active = False
        with self.dq._lock:
            self.dq._matcher.remove(self.subject, self)
        self.queue.purge(self)
