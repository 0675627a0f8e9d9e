"""Event queues of the RV-style bus: where listeners' messages wait until dispatched.

How it works (TIBCO Rendezvous Concepts, Events and Queues). A matching message becomes one
*event* (the listener and the message) appended to the listener's :class:`Queue`. The
application takes events out in its own thread and runs the listener's callback there:

* :meth:`Queue.dispatch` blocks until an event is there and runs it;
  :meth:`Queue.timed_dispatch` waits at most ``timeout`` seconds (``False``: nothing came);
  :meth:`Queue.poll` runs one event if there is one, without waiting;
* a :class:`Dispatcher` is a daemon thread that dispatches one queue until stopped;
* :func:`default_queue` is the process's default queue: unlimited, never discarding,
  priority 1 (Events and Queues, "Default Queue");
* a queue :meth:`bound <Queue.bind_loop>` to an asyncio loop dispatches itself on that loop
  (each push schedules, once, a drain of everything waiting): asyncio programs get their
  callbacks on their own loop, and never block it.

A queue may be limited (Events and Queues, "Queue Limit Policies"): ``max_events`` > 0 and a
policy, applied when a new event would overflow it. ``DISCARD_FIRST`` drops the oldest events
(the next due for dispatch), ``DISCARD_LAST`` the newest already queued, ``DISCARD_NEW`` the
arriving one, each ``discard_amount`` at a time; ``DISCARD_NONE`` never drops. Every discard
presents ``_RV.WARN.SYSTEM.QUEUE.LIMIT_EXCEEDED`` (field ``ADV_DESC``: the queue's name,
``tibrvQueue`` by default) on the intra-process transport (TIBCO Rendezvous Concepts,
Appendix A, System Advisory Messages, QUEUE.LIMIT_EXCEEDED); a discard caused while that
advisory is being queued is counted but presents no second advisory, so a listener for it on
a limited queue cannot loop.

Destroying a listener removes its waiting events (Events and Queues, "Listener Event
Semantics"); an event whose listener was destroyed meanwhile is skipped at dispatch.

Queues are thread-safe: the bus's I/O thread pushes, any thread dispatches. The bus hands
over what one read of its sockets delivered with :meth:`Queue.push_many`: one lock and one
wake-up of a waiting dispatcher per burst, not per message. A callback runs
outside the queue's lock, so it may send, create listeners and dispatch other queues.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from enum import IntEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transports.rv.message import Message

log = logging.getLogger("transports.rv")

DEFAULT_QUEUE_NAME = "tibrvQueue"


class LimitPolicy(IntEnum):
    """What a full queue discards (Events and Queues, "Queue Limit Policies")."""

    DISCARD_NONE = 0
    DISCARD_FIRST = 1
    DISCARD_LAST = 2
    DISCARD_NEW = 3


DISCARD_NONE = LimitPolicy.DISCARD_NONE
DISCARD_FIRST = LimitPolicy.DISCARD_FIRST
DISCARD_LAST = LimitPolicy.DISCARD_LAST
DISCARD_NEW = LimitPolicy.DISCARD_NEW


class Event:
    """One message for one listener, waiting in a queue.

    ``owner`` is the transport's consumer buffer accounting (slow-consumer detection) or None;
    ``size`` and ``since`` are what it accounts.
    """

    __slots__ = ("listener", "msg", "size", "since", "owner", "state")

    def __init__(self, listener: Any, msg: Message, size: int = 0, since: float = 0.0,
                 owner: Any = None) -> None:
        self.listener = listener
        self.msg = msg
        self.size = size
        self.since = since
        self.owner = owner
        self.state = 0  # 0 waiting, 1 dispatched or dropped


# Set by transports.rv.transport: presents QUEUE.LIMIT_EXCEEDED on the intra-process
# transport (kept as a hook so this module needs nothing of the transports).
limit_exceeded_hook: Callable[[str], None] | None = None
_advising = threading.local()


class Queue:
    """An event queue (module docstring). ``priority`` is recorded for queue groups."""

    def __init__(self, name: str = DEFAULT_QUEUE_NAME, *, max_events: int = 0,
                 policy: LimitPolicy = DISCARD_NONE, discard_amount: int = 1,
                 priority: int = 1) -> None:
        if max_events < 0 or discard_amount < 1:
            raise ValueError("max_events must be >= 0 and discard_amount >= 1")
        if policy != DISCARD_NONE and max_events == 0:
            raise ValueError("a discard policy needs max_events > 0")
        self.name = name
        self.max_events = max_events
        self.policy = LimitPolicy(policy)
        self.discard_amount = discard_amount
        self.priority = priority
        self.discarded = 0
        self._events: deque[Event] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._drain_scheduled = False
        self.destroyed = False

    # -- pushing (the bus's side) ------------------------------------------------------------

    def push(self, event: Event, head: bool = False) -> None:
        """Queue ``event`` (at the head: ``head``), applying the limit policy."""
        dropped: list[Event] | None = None
        with self._cond:
            if self.destroyed:
                return
            events = self._events
            limit = self.max_events
            if limit and len(events) >= limit and self.policy != DISCARD_NONE:
                policy = self.policy
                n = min(self.discard_amount, len(events))
                if policy == DISCARD_NEW:
                    dropped = [event]
                elif policy == DISCARD_FIRST:
                    dropped = [events.popleft() for _ in range(n)]
                else:
                    dropped = [events.pop() for _ in range(n)]
                self.discarded += len(dropped)
            if dropped is None or dropped[0] is not event:
                if head:
                    events.appendleft(event)
                else:
                    events.append(event)
                self._cond.notify()
        if dropped is not None:
            for ev in dropped:
                _settle(ev)
            hook = limit_exceeded_hook
            if hook is not None and not getattr(_advising, "on", False):
                _advising.on = True
                try:
                    hook(self.name)
                finally:
                    _advising.on = False
        if self._loop is not None:
            self._wake_loop()

    def push_many(self, events: list[Event]) -> None:
        """Queue ``events`` in order, as :meth:`push` each would, but with one lock and one
        wake-up for the lot: the bus hands over what one read of its sockets delivered."""
        if self.max_events and self.policy != DISCARD_NONE:
            for event in events:  # the limit policy decides event by event
                self.push(event)
            return
        with self._cond:
            if self.destroyed:
                return
            self._events.extend(events)
            self._cond.notify(len(events))
        if self._loop is not None:
            self._wake_loop()

    def remove(self, event: Event) -> bool:
        """Take ``event`` out if it still waits (the slow-consumer drop)."""
        with self._cond:
            try:
                self._events.remove(event)
            except ValueError:
                return False
            return True

    def purge(self, listener: Any) -> None:
        """Remove every waiting event of ``listener`` (it was destroyed)."""
        with self._cond:
            keep = [ev for ev in self._events if ev.listener is not listener]
            gone = [ev for ev in self._events if ev.listener is listener]
            self._events = deque(keep)
        for ev in gone:
            _settle(ev)

    # -- dispatching (the application's side) ------------------------------------------------

    @property
    def count(self) -> int:
        """Events waiting."""
        return len(self._events)

    def _take(self, timeout: float | None) -> Event | None:
        with self._cond:
            if timeout is None:
                while not self._events and not self.destroyed:
                    self._cond.wait()
            elif timeout > 0 and not self._events:
                deadline = time.monotonic() + timeout
                while not self._events and not self.destroyed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
            if not self._events:
                return None
            return self._events.popleft()

    def _run(self, event: Event) -> None:
        if not _settle(event):  # dropped meanwhile (slow consumer)
            return
        listener = event.listener
        if listener.active:
            listener.callback(event.msg, listener)

    def dispatch(self) -> None:
        """Wait for an event and run its callback (returns at once if the queue is destroyed)."""
        event = self._take(None)
        if event is not None:
            self._run(event)

    def timed_dispatch(self, timeout: float) -> bool:
        """Run one event, waiting at most ``timeout`` seconds; False if none came."""
        event = self._take(timeout)
        if event is None:
            return False
        self._run(event)
        return True

    def poll(self) -> bool:
        """Run one event if one waits; never blocks."""
        event = self._take(0)
        if event is None:
            return False
        self._run(event)
        return True

    def destroy(self) -> None:
        """Drop what waits and wake every dispatcher; the queue takes nothing more."""
        with self._cond:
            self.destroyed = True
            gone = list(self._events)
            self._events.clear()
            self._cond.notify_all()
        for ev in gone:
            _settle(ev)

    # -- asyncio ----------------------------------------------------------------------------

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Dispatch this queue on ``loop`` from now on: callbacks run on that loop."""
        self._loop = loop
        self._loop_thread = 0
        loop.call_soon_threadsafe(self._note_loop_thread)
        self._wake_loop()

    def _note_loop_thread(self) -> None:
        self._loop_thread = threading.get_ident()

    def _wake_loop(self) -> None:
        loop = self._loop
        if loop is None or self._drain_scheduled or loop.is_closed():
            return
        self._drain_scheduled = True
        if threading.get_ident() == self._loop_thread:
            loop.call_soon(self._drain)
        else:
            loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        self._drain_scheduled = False
        while True:
            event = self._take(0)
            if event is None:
                return
            try:
                self._run(event)
            except Exception:  # one callback's error must not stop the others
                log.exception("rv listener callback raised")


def _settle(event: Event) -> bool:
    """Mark ``event`` dispatched or dropped; False if it already was."""
    owner = event.owner
    if owner is not None:
        return bool(owner.settled(event))
    if event.state:
        return False
    event.state = 1
    return True


class Dispatcher:
    """A daemon thread that dispatches ``queue`` until :meth:`stop` (Events and Queues,
    "Dispatcher Threads"). A callback's exception is logged and dispatching goes on."""

    def __init__(self, queue: Queue, name: str = "rv-dispatcher") -> None:
        self.queue = queue
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set() and not self.queue.destroyed:
            try:
                self.queue.timed_dispatch(0.2)
            except Exception:
                log.exception("rv listener callback raised")

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout)


_default_queue: Queue | None = None
_default_lock = threading.Lock()


def default_queue() -> Queue:
    """The process's default queue: unlimited, never discards, priority 1."""
    global _default_queue
    q = _default_queue
    if q is None:
        with _default_lock:
            if _default_queue is None:
                _default_queue = Queue()
            q = _default_queue
    return q
