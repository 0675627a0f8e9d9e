"""Certified delivery for programs: :class:`CmTransport` and :class:`CmListener`.

A CM transport wraps a bus transport (:class:`~transports.rv.transport.Transport` or
:class:`~transports.rv.transport.AsyncTransport`) and runs the certified-delivery protocol of
:mod:`transports.rv.cm` on it (TIBCO Rendezvous Concepts, Certified Message Delivery)::

    from transports.rv import Message, Transport, default_queue
    from transports.rv.cmtransport import CmTransport

    t = Transport(service="7500", network="127.0.0.1;239.192.75.1")
    cm = CmTransport(t, "ORDERS.ENTRY", ledger_file="orders.ledger", require_old=True)
    cm.listen("ORDERS.>", lambda msg, listener: print(msg.cm.sequence, msg))
    cm.send(Message("ORDERS.NEW").add("id", 7))
    default_queue().dispatch()

How it works. The protocol core is not thread-safe, so it lives on the loop of the bus
engine under the transport (a synchronous transport's I/O thread, or an async transport's
loop); the methods here may be called from any thread and hand their work to that loop.
The CM transport listens on the bus for its control subject and for the subjects of its CM
listeners (one bus listener per subject, on a queue dispatched on that loop), feeds what
arrives to the core, and once per turn of the loop commits the ledger and then sends what
the core produced -- so nothing leaves before the ledger has it. Certified and labeled
messages go to the CM listeners' queues (each matching CM listener gets one event, as with
ordinary listeners); a certified message is confirmed when *every* CM listener it went to
has returned from its callback, or, for a listener created with ``explicit_confirm``, has
called :meth:`CmListener.confirm`. A callback that raises does not confirm: the message
comes again after a restart of a persistent correspondent (at least once). Advisories are
presented on the underlying transport, so ordinary listeners there receive them
(``_RV.*.RVCM.>``); ERROR and WARN advisories nobody listens to are logged.

In a received message ``msg.cm`` is the label: ``sender`` (the sending correspondent),
``sequence`` (0 when the message is not certified to this listener) and ``time_limit``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from transports.rv.advisory import advisory_message, is_logged
from transports.rv.cm import (
    DELIVERY_COMPLETE,
    DELIVERY_FAILED,
    LEDGER_WRITE_FAILED,
    LEDGER_WRITE_RESUMED,
    CmCore,
    CmDelivery,
)
from transports.rv.driver import ProgramListener
from transports.rv.ledger import Ledger, LedgerError, SqliteLedger
from transports.rv.message import Message
from transports.rv.queue import Event, Queue
from transports.rv.subject import SubjectMatcher, validate_listen_subject
from transports.rv.transport import Listener, TransportError, _BaseTransport

log = logging.getLogger("transports.rv")

T = TypeVar("T")
Callback = Callable[[Message, "CmListener"], object]

LEDGER_RETRY_S = 1.0  # after a failed ledger write, the next try
_OUTCOMES = (DELIVERY_COMPLETE, DELIVERY_FAILED)


class CmTransport:
    """A CM transport on ``transport`` (module docstring).

    Args:
        transport: the bus transport it sends and listens with.
        name: the correspondent name; None makes a transient correspondent.
        ledger_file: a file ledger (a persistent correspondent when ``name`` is given too);
            None keeps the ledger in memory.
        sync_ledger: write the file ledger synchronously (fsync per turn).
        require_old: as a listener, ask returning senders for what was missed meanwhile.
        default_ttl: the time limit of a message sent without one; 0 = none.
        request_interval, registration_attempts, explicit_config_only: as
            :class:`~transports.rv.cm.CmCore`.

    ``on_outcome``, when set, is called on the loop with ``(subject, seq, complete)`` when a
    kept message leaves the ledger: ``complete`` True for ``DELIVERY.COMPLETE``, False for
    ``DELIVERY.FAILED`` (what the gateway's bridge waits for before an export leaves its
    spool).
    """

    def __init__(self, transport: _BaseTransport, name: str | None = None, *,
                 ledger_file: str | os.PathLike[str] | None = None, sync_ledger: bool = True,
                 require_old: bool = False, default_ttl: float = 0.0,
                 request_interval: float = 1.0, registration_attempts: int = 5,
                 explicit_config_only: bool = False) -> None:
        host = transport.host
        if host is None:
            raise TransportError("certified delivery needs a network transport")
        self.transport = transport
        self.host = host
        self.loop: asyncio.AbstractEventLoop = host.loop
        ledger = SqliteLedger(ledger_file, sync=sync_ledger) if ledger_file else Ledger()
        self.core = CmCore(name, ledger, now=time.time(), require_old=require_old,
                           default_ttl=default_ttl, request_interval=request_interval,
                           registration_attempts=registration_attempts,
                           explicit_config_only=explicit_config_only)
        self.name = self.core.name
        self.on_outcome: Callable[[str, int, bool], None] | None = None
        self.closed = False
        self._queue = Queue("cm:" + self.name)
        self._queue.bind_loop(self.loop)
        self._matcher = SubjectMatcher()
        self._lock = threading.Lock()  # the matcher and the bus listeners
        self._bus: dict[str, tuple[Listener, int]] = {}  # subject -> (bus listener, count)
        self._owed: dict[tuple[str, str, int], int] = {}  # certified message -> callbacks due
        self._turn_due = False
        self._timer: asyncio.TimerHandle | None = None
        self._sends: list[tuple[Message, float | None]] = []  # from other threads
        self._sends_due = False
        self._finished = False  # closed, and the ledger with it
        self._confirms: list[tuple[str, str, int]] = []  # from the dispatching threads
        self._confirms_due = False
        self._ledger_failing = False  # LEDGER.WRITE_FAILED presented, not resumed yet
        self._bus_listen(self.core.control_subject)
        self._run(self._kick)

    # -- the program's side ------------------------------------------------------------------

    def send(self, msg: Message, time_limit: float | None = None) -> None:
        """Send ``msg`` labeled, to its send subject. It is kept for the listeners registered
        on its subject until they confirm it or ``time_limit`` seconds (default:
        ``default_ttl``; 0 = none) pass. Never blocks: from another thread than the loop's,
        the message is handed over with the others of the same burst (one wake-up of the
        loop), and ``msg.cm`` gets its label there."""
        if self.closed:
            raise TransportError("CM transport closed")
        if time_limit is not None and time_limit < 0:
            raise ValueError(f"time limit {time_limit} is negative")
        self.transport._check_subject(msg)
        if self._on_loop():
            self.core.send(msg, time.time(), time_limit)
            self._kick()
            return
        with self._lock:
            self._sends.append((msg, time_limit))
            if self._sends_due:
                return
            self._sends_due = True
        self.loop.call_soon_threadsafe(self._take_sends)

    def send_on_loop(self, msg: Message, time_limit: float | None = None) -> int:
        """:meth:`send` for a caller on the transport's loop: returns the sequence number."""
        if self.closed:
            raise TransportError("CM transport closed")
        self.transport._check_subject(msg)
        seq = self.core.send(msg, time.time(), time_limit)
        self._kick()
        return seq

    def _take_sends(self) -> None:
        with self._lock:
            sends, self._sends = self._sends, []
            self._sends_due = False
        now = time.time()
        for msg, time_limit in sends:
            self.core.send(msg, now, time_limit)
        self._kick()

    def listen(self, subject: str, callback: Callback, queue: Queue | None = None, *,
               explicit_confirm: bool = False) -> CmListener:
        """A CM listener on ``subject``: ``callback(msg, listener)`` per message, run by
        whoever dispatches ``queue`` (default: the transport's default queue)."""
        return CmListener(self, subject, callback, queue, explicit_confirm=explicit_confirm)

    def add_listener(self, listener: str, subject: str) -> None:
        """Keep what is sent on ``subject`` for correspondent ``listener`` before it comes."""
        self._call(self.core.add_listener, listener, subject)

    def remove_listener(self, subject: str, listener: str) -> None:
        """End certified delivery of ``subject`` to ``listener``."""
        self._call(self.core.remove_listener, subject, listener)

    def disallow(self, listener: str) -> None:
        """Refuse certified delivery to ``listener`` (every subject) until :meth:`allow`."""
        self._call(self.core.disallow, listener)

    def allow(self, listener: str) -> None:
        self._call(self.core.allow, listener)

    def stored_count(self, subject: str | None = None) -> int:
        """Messages kept for listeners that have not confirmed them."""
        return self._run(lambda: self.core.stored_count(subject))

    def close(self) -> None:
        """Destroy the CM listeners (agreements are kept: a persistent correspondent resumes
        them when it comes back), write the ledger and close it."""
        if self.closed:
            return
        self.closed = True
        with self._lock:
            bus = [listener for listener, _ in self._bus.values()]
            self._bus.clear()
        for listener in bus:
            listener.destroy()
        self._run(self._close)
        self._queue.destroy()

    def _close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._take_sends()
        self._turn()
        self._finished = True
        self.core.ledger.close()

    # -- listeners ---------------------------------------------------------------------------

    def _add(self, listener: CmListener) -> None:
        with self._lock:
            self._matcher.add(listener.subject, listener)
        self._bus_listen(listener.subject)
        self._call(self.core.listen, listener.subject, time.time())

    def _remove(self, listener: CmListener, cancel: bool) -> None:
        with self._lock:
            if not self._matcher.remove(listener.subject, listener):
                return
            entry = self._bus.get(listener.subject)
            last = entry is not None and entry[1] == 1
            if entry is not None:
                if last:
                    del self._bus[listener.subject]
                else:
                    self._bus[listener.subject] = (entry[0], entry[1] - 1)
        if entry is not None and last:
            entry[0].destroy()
        if cancel:
            self._call(self.core.cancel, listener.subject)

    def _bus_listen(self, subject: str) -> None:
        with self._lock:
            entry = self._bus.get(subject)
            if entry is not None:
                self._bus[subject] = (entry[0], entry[1] + 1)
                return
            self._bus[subject] = (Listener(self.transport, subject, self._on_bus,
                                           queue=self._queue), 1)

    # -- on the loop -------------------------------------------------------------------------

    def _on_bus(self, msg: Message, _: Listener) -> None:
        if self.closed:
            return
        self.core.receive(msg, time.time())
        self._kick()

    def _kick(self) -> None:
        if not self._turn_due:
            self._turn_due = True
            self.loop.call_soon(self._turn)

    def _turn(self) -> None:
        """Commit the ledger, then send and present what the core produced; set the timer."""
        self._turn_due = False
        if self._finished:
            return
        try:
            out, events = self.core.flush()
        except LedgerError as exc:
            log.error("CM transport %s: %s; trying again in %g s", self.name, exc,
                      LEDGER_RETRY_S)
            if not self._ledger_failing:  # once per failure, not per retry
                self._ledger_failing = True
                self._present_ledger(LEDGER_WRITE_FAILED, str(exc))
            self._arm(time.time() + LEDGER_RETRY_S)
            return
        if self._ledger_failing:
            self._ledger_failing = False
            self._present_ledger(LEDGER_WRITE_RESUMED, "the ledger is written again")
        for msg in out:
            try:
                self.transport._send(msg, internal=True)
            except Exception as exc:  # noqa: BLE001 - one unsendable message stops no other
                log.error("CM transport %s: cannot send to %s: %s", self.name,
                          msg.send_subject, exc)
        transport = self.transport
        for event in events:
            if isinstance(event, CmDelivery):
                self._present(event)
                continue
            if self.on_outcome is not None and event.subject.startswith(_OUTCOMES):
                seqno = event.fields["seqno"]
                assert isinstance(seqno, int)
                self.on_outcome(str(event.fields["subject"]), seqno,
                                event.subject.startswith(DELIVERY_COMPLETE))
            if transport.listens(event.subject):
                transport.present(event.message())
            elif is_logged(event.subject):
                log.warning("rv advisory %s", event.message().to_text())
        if not self.closed:
            self._arm(self.core.next_deadline())

    def _present_ledger(self, head: str, description: str) -> None:
        adv = advisory_message(head + self.name, {"name": self.name,
                                                  "description": description})
        if not self.transport.present(adv) and is_logged(head):
            log.warning("rv advisory %s", adv.to_text())

    def _arm(self, deadline: float | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if deadline is not None:
            self._timer = self.loop.call_later(max(0.0, deadline - time.time()), self._tick)

    def _tick(self) -> None:
        self._timer = None
        self.core.tick(time.time())
        self._turn()

    def _present(self, d: CmDelivery) -> None:
        with self._lock:
            listeners = self._matcher.match(d.subject)
        if not listeners:
            return  # no CM listener any more: not confirmed, the sender keeps it
        if d.seq:
            key = (d.sender or "", d.subject, d.seq)
            self._owed[key] = self._owed.get(key, 0) + len(listeners)
        for listener in listeners:
            assert isinstance(listener, CmListener)
            listener.queue.push(Event(listener, d.msg))

    def _take_confirms(self) -> None:
        with self._lock:
            keys, self._confirms = self._confirms, []
            self._confirms_due = False
        for key in keys:
            self._confirmed(key)

    def _confirmed(self, key: tuple[str, str, int]) -> None:
        owed = self._owed.get(key)
        if owed is None:
            return
        if owed > 1:
            self._owed[key] = owed - 1
            return
        del self._owed[key]
        self.core.confirm(*key)
        self._kick()

    # -- threads -----------------------------------------------------------------------------

    def _on_loop(self) -> bool:
        return self.host.in_loop()

    def _call(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop (now, if this is the loop), then a turn."""
        def run() -> None:
            fn(*args)
            self._kick()

        self.host.soon(run)

    def _run(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the loop, waited for when called from another thread."""
        return self.host.call(fn)


class CmListener(ProgramListener):
    """A CM listener (:meth:`CmTransport.listen`). ``destroy(cancel_agreements=True)`` also
    ends the certified delivery agreements on its subject."""

    __slots__ = ("cm",)

    def __init__(self, cm: CmTransport, subject: str, callback: Callback,
                 queue: Queue | None = None, *, explicit_confirm: bool = False) -> None:
        validate_listen_subject(subject)
        super().__init__(subject, callback,
                         queue if queue is not None else cm.transport.default_listener_queue,
                         explicit_confirm)
        self.cm = cm
        cm._add(self)

    def confirm(self, msg: Message) -> None:
        """Confirm a certified message this listener received (explicit confirmation); a
        message that is not certified needs none."""
        label = msg.cm
        if label is None or not label.sequence or msg.send_subject is None:
            return
        key = (label.sender, msg.send_subject, label.sequence)
        cm = self.cm
        if cm._on_loop():
            cm._confirmed(key)
            return
        with cm._lock:  # handed over with the others of the same burst: one wake-up
            cm._confirms.append(key)
            if cm._confirms_due:
                return
            cm._confirms_due = True
        if not cm.loop.is_closed():
            cm.loop.call_soon_threadsafe(cm._take_confirms)

    def destroy(self, cancel_agreements: bool = False) -> None:
        if not self.active:
            return
        self.active = False
        self.cm._remove(self, cancel_agreements)
        self.queue.purge(self)
