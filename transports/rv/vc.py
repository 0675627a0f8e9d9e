"""Virtual circuits on the RV-style bus: an exclusive, monitored connection of two terminals.

The model is TIBCO Rendezvous Concepts, Transports, "Virtual Circuits": a circuit joins
exactly two *terminal* transports; every message on it goes point to point to the other
terminal, even one sent to a public subject, in order, and nobody else can send into it or
listen in. A failure -- the other terminal's heartbeat lost, or a message lost on the way --
ends the circuit for good: both terminals present ``VC.DISCONNECTED``, sends fail, and a new
circuit needs new terminals.

Setting one up (Transports, "Establishing a Virtual Circuit"): program B makes an *accept*
terminal, :meth:`VcTransport.create_accept`, whose :attr:`~VcTransport.connect_subject` is
an inbox; it invites program A with an ordinary message whose *reply subject* is that
connect subject; A makes a *connect* terminal from it, :meth:`VcTransport.create_connect`.
When the two have found each other both present ``_RV.INFO.SYSTEM.VC.CONNECTED`` (which a
program may miss: :meth:`~VcTransport.wait_for_vc_connection` asks). Then ``send`` and
listeners work on the terminal as on any transport::

    vc = VcTransport.create_accept(t)               # B
    t.send(Message("SVC.INVITE", reply_subject=vc.connect_subject))
    ...
    vc = VcTransport.create_connect(t, invite.reply_subject)   # A
    vc.wait_for_vc_connection(5.0)
    Listener(vc, "RESULTS.>", on_result)
    vc.send(Message("ORDERS.NEW").add("id", 7))

The protocol is this bus's own. Each terminal has an inbox of its own on the transport
under it; the terminals' messages go between the two inboxes (the bus's point-to-point
streams: reliable and ordered) with ``op``: ``CONNECT`` (the connect terminal, to the
connect subject, every heartbeat until accepted; its inbox is the reply subject), ``ACCEPT``
(the accept terminal answers the first one only: the circuit is exclusive), ``HB`` (each
terminal, every ``heartbeat`` seconds), ``DATA`` (``seq`` U64 from 1, ``msg`` OPAQUE: the
message sent, encoded with its subject) and ``CLOSE``. A terminal that hears nothing from the
other for ``3 * heartbeat`` seconds, or gets a DATA out of sequence, disconnects with
``_RV.ERROR.SYSTEM.VC.DISCONNECTED``; ``close`` sends CLOSE, and the other terminal presents
``_RV.INFO.SYSTEM.VC.DISCONNECTED``; both carry ``description`` (STRING).

:class:`VcCore` is that protocol for one terminal, sans I/O (it reads no clock and opens no
socket, so the tests run it on a virtual clock); :class:`VcTransport` runs it on the loop of
the bus engine under the transport.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Final

from transports.rv.advisory import advisory_message
from transports.rv.codec import FormatError, decode
from transports.rv.message import Message, RvType
from transports.rv.queue import Queue
from transports.rv.transport import Listener, TransportError, _BaseTransport

VC_CONNECTED: Final = "_RV.INFO.SYSTEM.VC.CONNECTED"
VC_DISCONNECTED_ERROR: Final = "_RV.ERROR.SYSTEM.VC.DISCONNECTED"
VC_DISCONNECTED_INFO: Final = "_RV.INFO.SYSTEM.VC.DISCONNECTED"
HEARTBEAT_S: Final = 1.0
LOST_HEARTBEATS: Final = 3


class VcData:
    """A message the other terminal sent on the circuit (``size``: its encoded bytes)."""

    __slots__ = ("msg", "size")

    def __init__(self, msg: Message, size: int) -> None:
        self.msg = msg
        self.size = size


class VcCore:
    """The protocol of one terminal (module docstring). ``peer`` None makes an accept
    terminal (its connect subject is its inbox); else a connect terminal, ``peer`` the
    connect subject. ``now`` is any clock, the same for every call."""

    def __init__(self, inbox: str, *, peer: str | None, heartbeat: float, now: float) -> None:
        if heartbeat <= 0:
            raise ValueError("the heartbeat interval must be positive")
        self.inbox = inbox
        self.peer = peer
        self.accepting = peer is None
        self.heartbeat = heartbeat
        self.connected = False
        self.disconnected = False
        self._sent = 0  # DATA sequence numbers
        self._received = 0
        self._heard = now
        self._next = now if peer is not None else now + heartbeat  # CONNECT at once
        self._out: list[Message] = []
        self._events: list[Message | VcData] = []

    def send(self, data: bytes) -> None:
        """Queue ``data`` (a message, encoded) for the other terminal; the circuit must be
        connected."""
        if self.disconnected or not self.connected:
            raise TransportError("the virtual circuit is "
                                 + ("disconnected" if self.disconnected else "not connected yet"))
        self._sent += 1
        self._control("DATA").add("seq", self._sent, RvType.U64).add("msg", data, RvType.OPAQUE)

    def close(self) -> None:
        """This terminal is destroyed: the other one is told (CLOSE)."""
        if self.peer is not None and self.connected and not self.disconnected:
            self._control("CLOSE")
        self._disconnect(None, "this terminal was closed")

    def receive(self, msg: Message, now: float) -> None:
        """A message that came to this terminal's inbox."""
        if self.disconnected:
            return
        op = msg.get("op") if "op" in msg else None
        sender = msg.reply_subject
        if self.peer is None:  # an accept terminal, not connected yet
            if op != "CONNECT" or not sender:
                return
            self.peer = sender
            self._control("ACCEPT")
            self._connected(now)
            return
        if sender != self.peer:
            return  # nobody else gets into the circuit
        self._heard = now
        if op == "ACCEPT":
            if not self.connected:
                self._connected(now)
        elif op == "DATA":
            self._on_data(msg)
        elif op == "CLOSE":
            self._disconnect(VC_DISCONNECTED_INFO, "the other terminal closed the circuit")

    def tick(self, now: float) -> None:
        """Every heartbeat: CONNECT again (a connect terminal not accepted yet), or check the
        other terminal's heartbeat and send this one's."""
        if self.disconnected or now < self._next:
            return
        self._next = now + self.heartbeat
        if not self.connected:
            if not self.accepting:
                self._control("CONNECT")  # asks again until accepted
            return
        if now - self._heard > LOST_HEARTBEATS * self.heartbeat:
            self._disconnect(VC_DISCONNECTED_ERROR, "lost the other terminal's heartbeat")
            return
        self._control("HB")

    def next_deadline(self) -> float | None:
        return None if self.disconnected else self._next

    def flush(self) -> tuple[list[Message], list[Message | VcData]]:
        """The messages to send (to the other terminal's inbox, or the connect subject) and
        the events: advisories to present, and the circuit's messages to deliver."""
        out, self._out = self._out, []
        events, self._events = self._events, []
        return out, events

    def _control(self, op: str) -> Message:
        assert self.peer is not None
        msg = Message(self.peer, reply_subject=self.inbox)
        msg.add("op", op, RvType.STRING)
        self._out.append(msg)
        return msg

    def _connected(self, now: float) -> None:
        self._heard = now
        self._next = now + self.heartbeat
        self.connected = True
        self._events.append(advisory_message(VC_CONNECTED, {}))

    def _on_data(self, msg: Message) -> None:
        seq = msg.get("seq") if "seq" in msg else 0
        data = msg.get("msg") if "msg" in msg else None
        if seq != self._received + 1 or not isinstance(data, bytes):
            self._disconnect(VC_DISCONNECTED_ERROR, "data lost on the circuit")
            return
        self._received = seq
        try:
            inner = decode(data)
        except (FormatError, ValueError):
            self._disconnect(VC_DISCONNECTED_ERROR, "data lost on the circuit")
            return
        self._events.append(VcData(inner, len(data)))

    def _disconnect(self, advisory: str | None, description: str) -> None:
        if self.disconnected:
            return
        self.disconnected = True
        if advisory is not None:
            self._events.append(advisory_message(advisory, {"description": description}))


class VcTransport(_BaseTransport):
    """A virtual circuit terminal (module docstring); make one with :meth:`create_accept` or
    :meth:`create_connect`."""

    def __init__(self, transport: _BaseTransport, heartbeat: float,
                 connect_subject: str | None) -> None:
        super().__init__(f"virtual circuit on {transport.description or transport.id}", 0,
                         float("inf"))
        host = transport.host
        if host is None:
            raise TransportError("a virtual circuit needs a network transport")
        self.under = transport
        self.under_host = host
        self.loop: asyncio.AbstractEventLoop = host.loop
        self.inbox = transport.create_inbox()
        self.id = self.inbox
        self.core = VcCore(self.inbox, peer=connect_subject, heartbeat=heartbeat,
                           now=time.monotonic())
        self.connect_subject = self.inbox if connect_subject is None else None
        self.connected = threading.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._queue = Queue(f"vc:{self.inbox}")
        self._queue.bind_loop(self.loop)
        self._listener = Listener(transport, self.inbox, self._on_message, queue=self._queue)
        host.soon(self._turn)

    # -- making one --------------------------------------------------------------------------

    @classmethod
    def create_accept(cls, transport: _BaseTransport,
                      heartbeat: float = HEARTBEAT_S) -> VcTransport:
        """The accepting terminal: invite the other program with :attr:`connect_subject` as
        the reply subject of an ordinary message."""
        return cls(transport, heartbeat, None)

    @classmethod
    def create_connect(cls, transport: _BaseTransport, connect_subject: str,
                       heartbeat: float = HEARTBEAT_S) -> VcTransport:
        """The connecting terminal, from the connect subject an invitation brought."""
        return cls(transport, heartbeat, connect_subject)

    # -- using one ---------------------------------------------------------------------------

    @property
    def disconnected(self) -> bool:
        return self.core.disconnected

    def wait_for_vc_connection(self, timeout: float) -> bool:
        """Whether the circuit is connected, waiting at most ``timeout`` seconds (0: just
        ask); False once it is disconnected."""
        if timeout > 0 and not self.disconnected:
            self.connected.wait(timeout)
        return self.connected.is_set() and not self.disconnected

    def send(self, msg: Message) -> None:
        """Send ``msg`` to the other terminal, whatever its subject (point to point, in order).

        Raises:
            TransportError: the circuit is not connected (yet, or any more).
        """
        if self.disconnected or not self.connected.is_set():
            raise TransportError("the virtual circuit is "
                                 + ("disconnected" if self.disconnected else "not connected yet"))
        self._check_subject(msg)
        data = self._encode(msg)

        def run() -> None:
            if not self.core.disconnected:
                self.core.send(data)
                self._turn()

        self.under_host.soon(run)

    def close(self) -> None:
        """Destroy this terminal: the other one presents ``VC.DISCONNECTED`` (INFO)."""
        if self.closed:
            return

        def run() -> None:
            self.core.close()
            self._turn()

        self.under_host.call(run)
        self._close_listeners()
        self._listener.destroy()
        self._queue.destroy()

    # -- on the loop -------------------------------------------------------------------------

    def _on_message(self, msg: Message, _: Listener) -> None:
        self.core.receive(msg, time.monotonic())
        self._turn()

    def _tick(self) -> None:
        self._timer = None
        self.core.tick(time.monotonic())
        self._turn()

    def _turn(self) -> None:
        out, events = self.core.flush()
        if self.under.closed:  # the program closed the transport under the terminal
            out = []
        for msg in out:
            self.under._send(msg, internal=True)
        for event in events:
            if isinstance(event, VcData):
                subject = event.msg.send_subject or ""
                with self._lock():
                    listeners = self.matcher.match(subject)
                if listeners:
                    self.enqueue(listeners, event.msg, event.size)
                continue
            if event.send_subject == VC_CONNECTED:
                self.connected.set()
            self.present(event)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = self.core.next_deadline()
        if deadline is not None:
            self._timer = self.loop.call_later(max(0.0, deadline - time.monotonic()),
                                               self._tick)
