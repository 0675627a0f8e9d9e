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


class VcTransport(_BaseTransport):
    """A virtual circuit terminal (module docstring); make one with :meth:`create_accept` or
    :meth:`create_connect`."""

    def __init__(self, transport: _BaseTransport, heartbeat: float) -> None:
        super().__init__(f"virtual circuit on {transport.description or transport.id}", 0,
                         float("inf"))
        host = transport.host
        if host is None:
            raise TransportError("a virtual circuit needs a network transport")
        self.under = transport
        self.under_host = host
        self.loop: asyncio.AbstractEventLoop = host.loop
        self.heartbeat = heartbeat
        self.inbox = transport.create_inbox()
        self.id = self.inbox
        self.peer: str | None = None  # the other terminal's inbox
        self.connect_subject: str | None = None
        self.connected = threading.Event()
        self.disconnected = False
        self._state_lock = threading.Lock()
        self._sent = 0  # DATA sequence numbers
        self._received = 0
        self._heard = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None
        self._queue = Queue(f"vc:{self.inbox}")
        self._queue.bind_loop(self.loop)
        self._listener = Listener(transport, self.inbox, self._on_message, queue=self._queue)

    # -- making one --------------------------------------------------------------------------

    @classmethod
    def create_accept(cls, transport: _BaseTransport,
                      heartbeat: float = HEARTBEAT_S) -> VcTransport:
        """The accepting terminal: invite the other program with :attr:`connect_subject` as
        the reply subject of an ordinary message."""
        vc = cls(transport, heartbeat)
        vc.connect_subject = vc.inbox
        vc.under_host.soon(vc._arm)
        return vc

    @classmethod
    def create_connect(cls, transport: _BaseTransport, connect_subject: str,
                       heartbeat: float = HEARTBEAT_S) -> VcTransport:
        """The connecting terminal, from the connect subject an invitation brought."""
        vc = cls(transport, heartbeat)
        vc.peer = connect_subject
        vc.under_host.soon(vc._connect)
        return vc

    # -- using one ---------------------------------------------------------------------------

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
        with self._state_lock:
            self._sent += 1
            wrapper = self._control("DATA")
            wrapper.add("seq", self._sent, RvType.U64).add("msg", data, RvType.OPAQUE)
            self.under._send(wrapper, internal=True)

    def close(self) -> None:
        """Destroy this terminal: the other one presents ``VC.DISCONNECTED`` (INFO)."""
        if self.closed:
            return
        if self.peer is not None and self.connected.is_set() and not self.disconnected:
            self.under._send(self._control("CLOSE"), internal=True)
        self.under_host.soon(lambda: self._disconnect(None, "this terminal was closed"))
        self._close_listeners()
        self._listener.destroy()
        self._queue.destroy()

    # -- the protocol, on the loop ------------------------------------------------------------

    def _control(self, op: str) -> Message:
        assert self.peer is not None
        msg = Message(self.peer, reply_subject=self.inbox)
        msg.add("op", op, RvType.STRING)
        return msg

    def _connect(self) -> None:
        if not self.connected.is_set() and not self.disconnected:
            self.under._send(self._control("CONNECT"), internal=True)
            self._arm()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(self.heartbeat, self._beat)

    def _beat(self) -> None:
        self._timer = None
        if self.disconnected:
            return
        if not self.connected.is_set():
            if self.connect_subject is None:
                self._connect()  # the connect terminal asks again
            else:
                self._arm()
            return
        if time.monotonic() - self._heard > LOST_HEARTBEATS * self.heartbeat:
            self._disconnect(VC_DISCONNECTED_ERROR, "lost the other terminal's heartbeat")
            return
        self.under._send(self._control("HB"), internal=True)
        self._arm()

    def _on_message(self, msg: Message, _: Listener) -> None:
        if self.disconnected:
            return
        op = msg.get("op") if "op" in msg else None
        sender = msg.reply_subject
        if self.peer is None:  # an accept terminal, not connected yet
            if op != "CONNECT" or not sender:
                return
            self.peer = sender
            self.under._send(self._control("ACCEPT"), internal=True)
            self._connected()
            return
        if sender != self.peer:
            return  # nobody else gets into the circuit
        self._heard = time.monotonic()
        if op == "ACCEPT":
            if not self.connected.is_set():
                self._connected()
        elif op == "DATA":
            self._on_data(msg)
        elif op == "CLOSE":
            self._disconnect(VC_DISCONNECTED_INFO, "the other terminal closed the circuit")

    def _connected(self) -> None:
        self._heard = time.monotonic()
        self.connected.set()
        self.present(advisory_message(VC_CONNECTED, {}))
        self._arm()

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
        subject = inner.send_subject or ""
        with self._lock():
            listeners = self.matcher.match(subject)
        if listeners:
            self.enqueue(listeners, inner, len(data))

    def _disconnect(self, advisory: str | None, description: str) -> None:
        if self.disconnected:
            return
        self.disconnected = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if advisory is not None:
            self.present(advisory_message(advisory, {"description": description}))
