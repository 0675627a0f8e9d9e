"""One STOMP connection on the core: frames in, frames out, no I/O of its own.

How this works. :class:`StompConnection` is given bytes by its transport (TCP, TLS or a
WebSocket) through :meth:`~StompConnection.data_received`, parses them with
:class:`adapters.stomp.codec.Parser` and handles each frame in order with the handler of
:data:`_HANDLERS` for its command (a method of the connection, or for subscriptions,
acknowledgements and transactions a function of :mod:`adapters.stomp.subscriptions`). Everything it sends goes through the ``write`` callable
it was made with; ``close`` ends the transport. The flow of one connection:

1. ``CONNECT`` (or ``STOMP``): the version is the highest of ``accept-version`` the gateway
   speaks (1.0 when the header is absent), ``login`` / ``passcode`` pass the core's
   credential rules (:meth:`gateway.broker.Broker.authenticate`), ``client-id`` becomes
   the core client id (it names durable subscriptions), heart-beats are negotiated (STOMP
   1.2 "Heart-beating"), and ``CONNECTED`` answers. Any other frame first is an error.
2. ``SEND`` is mapped (:func:`mappings.stomp.stomp_to_message`) and published on the core
   connection, or held in its transaction. ``SUBSCRIBE`` makes a core consumer whose
   listener writes ``MESSAGE`` frames; ``ACK`` / ``NACK`` settle them (``client`` mode
   cumulatively, ``client-individual`` one by one; RabbitMQ's ``requeue:false`` makes a
   NACKed message undeliverable); ``BEGIN`` / ``COMMIT`` / ``ABORT`` drive core
   transactions. Destinations are STOMP's usual ``/queue/``, ``/topic/``, ``/temp-queue/``,
   ``/temp-topic/`` and RabbitMQ's forms (:meth:`StompConnection._rabbit_destination`); a
   subscription's ``transformation`` (ActiveMQ's) picks the form of map and stream bodies.
3. A ``receipt`` is answered once the frame has taken effect: for a persistent SEND (and a
   COMMIT) that is after the core's group commit, and a receipt never overtakes the
   confirmation of an earlier SEND, so a client that waits for a receipt knows everything
   it sent before is safe.
4. Anything wrong -- a malformed or oversized frame, a refused login, a frame in the wrong
   state, a message the core does not take -- is answered with an ``ERROR`` frame that says
   what and why (``message`` header, detail in the body, ``receipt-id`` when the frame asked
   for a receipt), and then this connection, and only it, is closed. Its unacknowledged
   messages go back to their queues; nothing confirmed before is lost.

Producers are held back by the core's flow control through the socket: while more than
:data:`MAX_UNCONFIRMED` sends wait for the core, the connection stops reading
(``pause_reading``), so TCP pushes back on the client.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from adapters.stomp.codec import Frame, FrameRefused, Parser, StompError, encode
from adapters.stomp.subscriptions import (
    StompSubscription,
    handle_abort,
    handle_ack,
    handle_begin,
    handle_commit,
    handle_nack,
    handle_subscribe,
    handle_unsubscribe,
    reply_subscription,
    transaction,
)
from gateway.client import AckMode
from gateway.errors import GatewayError, IllegalStateError, SecurityError
from gateway.message import QUEUE, TEMP_PREFIX, TOPIC, Destination
from mappings.engine import MappingFailed
from mappings.stomp import SEND_TRANSFORMATIONS

if TYPE_CHECKING:
    import asyncio

    from adapters.stomp.server import StompServer
    from gateway.client import Connection, Session, Transaction

log = logging.getLogger("adapters.stomp")

VERSIONS = ("1.0", "1.1", "1.2")
SERVER_NAME = "gateway/0.1"
MAX_UNCONFIRMED = 1000  # sends waiting for the core before the connection stops reading
RESUME_UNCONFIRMED = 500
HEARTBEAT_MIN_MS = 100  # the shortest heart-beat interval the gateway sends or asks for
HEARTBEAT_GRACE = 2.0  # a client is dead after this many of its intervals in silence

# Prefixes of STOMP destinations and the core kind (and temporariness) they name.
PREFIXES = {"/queue/": (QUEUE, False), "/topic/": (TOPIC, False),
            "/temp-queue/": (QUEUE, True), "/temp-topic/": (TOPIC, True)}
# RabbitMQ's destinations (its STOMP plugin's "Destinations"): /amq/queue/ names a queue that
# must exist; of the exchanges, those every RabbitMQ node has and the core can be: amq.topic
# (the topics), amq.direct (a topic named by the routing key, no wildcards) and amq.fanout
# (one topic, FANOUT_TOPIC, whatever the routing key). /reply-queue/ is RabbitMQ's name of a
# temporary reply queue in a rewritten reply-to.
AMQ_QUEUE_PREFIX = "/amq/queue/"
EXCHANGE_PREFIX = "/exchange/"
REPLY_QUEUE_PREFIX = "/reply-queue/"
FANOUT_TOPIC = "amq.fanout"


class StompConnection:
    """The protocol state of one STOMP connection (see the module docstring)."""

    def __init__(self, server: StompServer, write: Callable[[bytes], None],
                 close: Callable[[], None], address: str, *,
                 pause_reading: Callable[[], None] | None = None,
                 resume_reading: Callable[[], None] | None = None) -> None:
        self.server = server
        self.broker = server.broker
        self._write = write
        self._close = close
        self.address = address
        self.pause_reading = pause_reading
        self.resume_reading = resume_reading
        self.parser = Parser(max_frame_size=server.max_frame_size,
                             max_header_bytes=server.max_header_bytes,
                             max_headers=server.max_headers)
        self.version = "1.0"
        self.core: Connection | None = None
        self.auto_session: Session | None = None  # ack:auto (nothing tracked)
        self.durable_session: Session | None = None  # ack:auto on durable subscriptions
        self.client_session: Session | None = None  # ack:client and client-individual
        self.subscriptions: dict[str, StompSubscription] = {}
        self.transactions: dict[str, Transaction] = {}
        self.tx_nacks: dict[str, list[tuple[StompSubscription, int]]] = {}
        self.tx_rejects: dict[str, list[int]] = {}  # NACKs with requeue:false, by transaction
        self.temp_by_alias: dict[tuple[Any, str], Destination] = {}
        self.alias_by_temp: dict[Destination, str] = {}
        # Receipts wait for the sends before them: (send sequence number, future).
        self.inflight: deque[tuple[int, asyncio.Future[None]]] = deque()
        self.held: deque[tuple[int, bytes]] = deque()
        self.send_seq = 0
        self.reading_paused = False
        self.write_paused = False
        self.flow: Any = None  # the shell's adapters.listener.WriteFlow (admin views)
        self.closed = False
        self.heard = True  # bytes arrived since the last heart-beat check
        self.wrote = True  # bytes were written since the last heart-beat tick
        self.beat_due = 1  # heart-beat ticks (half intervals) until one must be sent
        self.timers: list[asyncio.TimerHandle] = []

    # -- transport side ---------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        self.wrote = True
        self._write(data)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.heard = True
        bad: StompError | None = None
        try:
            frames = self.parser.feed(data)
        except StompError as exc:
            # The good frames before the bad one in this read still count, in order.
            frames, bad = exc.frames, exc
        for frame in frames:
            if self.closed:
                return
            try:
                _HANDLERS.get(frame.command, StompConnection._unknown)(self, frame)
            except FrameRefused as exc:
                self.error(exc.message, exc.detail, frame.get("receipt"))
            except GatewayError as exc:
                self.error(_refusal_title(frame.command, exc), str(exc), frame.get("receipt"))
        if bad is not None:
            self.error(_malformed_title(bad), str(bad), bad.receipt)

    def shutdown(self) -> None:
        """End the connection now (DISCONNECT, ERROR): its consumers stop at once, so nothing
        more is handed to a socket about to close; then the transport closes."""
        self.end_core()
        self._close()

    def connection_lost(self) -> None:
        """The transport is gone: unacknowledged messages return, transactions roll back."""
        self.end_core()

    def end_core(self) -> None:
        self.closed = True
        for t in self.timers:
            t.cancel()
        self.timers.clear()
        core = self.core
        if core is not None:
            for tx in self.transactions.values():
                tx.rollback()
            self.transactions.clear()
            core.close()
            self.core = None

    def core_id(self) -> str | None:
        return str(self.core.id) if self.core is not None else None

    def client_id(self) -> str | None:
        return self.core.client_id if self.core is not None else None

    def pause_writing(self) -> None:
        self.write_paused = True
        for sub in self.subscriptions.values():
            if sub.consumer is not None:
                sub.consumer.core.pause()

    def resume_writing(self) -> None:
        self.write_paused = False
        for sub in list(self.subscriptions.values()):
            if sub.consumer is not None:
                sub.consumer.core.resume()

    def error(self, message: str, detail: str = "", receipt: str | None = None) -> None:
        """Send an ERROR frame and close this connection (STOMP 1.2 "ERROR")."""
        if self.closed:
            return
        log.info("stomp %s: %s%s", self.address, message, f": {detail}" if detail else "")
        body = (detail or message).encode("utf-8", "replace")
        headers = [("message", message.replace("\n", " ").replace("\r", " ")),
                   ("content-type", "text/plain")]
        if receipt is not None:
            headers.append(("receipt-id", receipt))
        headers.append(("content-length", str(len(body))))
        self.write(encode("ERROR", headers, body, version=self.version))
        self.shutdown()

    # -- CONNECT ----------------------------------------------------------------------------------

    def _connect(self, frame: Frame) -> None:
        if self.core is not None:
            raise FrameRefused("already connected", f"a second {frame.command} frame")
        accepted = frame.get("accept-version")
        if accepted is None:
            version = "1.0"
        else:
            offered = {v.strip() for v in accepted.split(",")}
            common = [v for v in VERSIONS if v in offered]
            if not common:
                self.version = "1.2"
                body = (f"Supported protocol versions are 1.0 1.1 1.2, not {accepted}"
                        ).encode("utf-8", "replace")
                headers = [("version", ",".join(VERSIONS)), ("content-type", "text/plain"),
                           ("message", "unsupported protocol version")]
                rid = frame.get("receipt")
                if rid is not None:  # STOMP 1.2 "ERROR": receipt-id when the frame asked
                    headers.append(("receipt-id", rid))
                headers.append(("content-length", str(len(body))))
                self.write(encode("ERROR", headers, body))
                self.shutdown()
                return
            version = common[-1]
        send_ms, recv_ms = _heartbeats(frame.get("heart-beat", "0,0") or "0,0")
        login = frame.get("login")
        try:
            core = self.broker.connect(
                client_id=frame.get("client-id") or None, user=login or None,
                password=frame.get("passcode") or "", protocol="stomp", address=self.address,
            )
        except SecurityError as exc:
            raise FrameRefused("authentication failed", str(exc)) from None
        self.core = core
        self.version = version
        self.parser.version = version
        self.auto_session = core.session(AckMode.NONE)
        self.durable_session = core.session(AckMode.AUTO)
        self.client_session = core.session(AckMode.EXPLICIT)
        # Heart-beats: the client can send every send_ms and wants one every recv_ms.
        out_ms = max(recv_ms, HEARTBEAT_MIN_MS) if recv_ms else 0
        in_ms = max(send_ms, HEARTBEAT_MIN_MS) if send_ms else 0
        headers = [("version", version), ("session", core.id), ("server", SERVER_NAME),
                   ("heart-beat", f"{out_ms},{in_ms}")]
        self.write(encode("CONNECTED", headers, version=version))
        loop = self.broker.loop
        if out_ms:
            # Ticks every half interval: a write seen at one tick happened less than half an
            # interval before it, so a heart-beat at the next is within the interval.
            self.timers.append(loop.call_later(out_ms / 2000, self._beat, out_ms / 2000))
        if in_ms:
            wait = in_ms * HEARTBEAT_GRACE / 1000
            self.heard = False
            self.timers.append(loop.call_later(wait, self._check_alive, wait))

    def _beat(self, tick: float) -> None:
        """Send an EOL if nothing else was: at most one interval (two ticks) apart (STOMP
        1.2 "Heart-beating": the sender MUST send new data at least every interval)."""
        if self.closed:
            return
        if self.wrote:
            self.wrote = False
            self.beat_due = 1
        elif self.beat_due <= 1:
            self._write(b"\n")
            self.beat_due = 2
        else:
            self.beat_due -= 1
        self._rearm(tick, self._beat)

    def _rearm(self, delay: float, callback: Callable[[float], None]) -> None:
        """Schedule a heart-beat timer again, forgetting the handles that have run."""
        loop = self.broker.loop
        now = loop.time()
        self.timers = [t for t in self.timers if t.when() > now]
        self.timers.append(loop.call_later(delay, callback, delay))

    def _check_alive(self, wait: float) -> None:
        if self.closed:
            return
        if not self.heard:
            log.info("stomp %s: no heart-beat for %.1f s: closing", self.address, wait)
            self.shutdown()
            return
        self.heard = False
        self._rearm(wait, self._check_alive)

    def require_connected(self, frame: Frame) -> Connection:
        core = self.core
        if core is None:
            raise FrameRefused("not connected", f"{frame.command} before CONNECT")
        return core

    def _disconnect(self, frame: Frame) -> None:
        self.require_connected(frame)
        self.receipt(frame)
        self.shutdown()

    def _unknown(self, frame: Frame) -> None:
        raise FrameRefused("unknown command", f"{frame.command!r} is not a STOMP client frame")

    # -- receipts ---------------------------------------------------------------------------------

    def receipt(self, frame: Frame) -> None:
        rid = frame.get("receipt")
        if rid is None:
            return
        data = encode("RECEIPT", [("receipt-id", rid)], version=self.version)
        if self.inflight:
            self.held.append((self.send_seq, data))
        else:
            self.write(data)

    def wait_for_confirmation(self, fut: asyncio.Future[None]) -> None:
        self.send_seq += 1
        self.inflight.append((self.send_seq, fut))
        fut.add_done_callback(self._confirmed)
        if len(self.inflight) > MAX_UNCONFIRMED and not self.reading_paused:
            self.reading_paused = True
            if self.pause_reading is not None:
                self.pause_reading()

    def _confirmed(self, _fut: Any) -> None:
        inflight = self.inflight
        while inflight and inflight[0][1].done():
            _, fut = inflight.popleft()
            exc = fut.exception() if not fut.cancelled() else GatewayError("cancelled")
            if exc is not None:
                self.error("message not accepted", str(exc))
                return
        done = inflight[0][0] - 1 if inflight else self.send_seq
        held = self.held
        while held and held[0][0] <= done:
            self.write(held.popleft()[1])
        if self.reading_paused and len(inflight) < RESUME_UNCONFIRMED:
            self.reading_paused = False
            if self.resume_reading is not None:
                self.resume_reading()

    # -- destinations -----------------------------------------------------------------------------

    def destination(self, text: str | None, frame: Frame, *, header: str = "destination"
                    ) -> Destination:
        """The core destination a STOMP destination header names."""
        if text is None:
            raise FrameRefused(f"missing {header} header", f"{frame.command} needs {header}")
        for prefix in PREFIXES:
            if text.startswith(prefix):
                kind, temporary = PREFIXES[prefix]
                name = text[len(prefix):]
                break
        else:
            return self._rabbit_destination(text)
        if not name:
            raise FrameRefused("unknown destination", f"{text!r} names no destination")
        if not temporary:
            return Destination(kind, _rabbit_wildcard(name, text) if kind == TOPIC else name)
        dest = self.temp_by_alias.get((kind, name))
        if dest is not None:
            return dest
        if name.startswith(TEMP_PREFIX):
            dest = Destination(kind, name)
            if not self.broker.exists(dest):
                raise FrameRefused("unknown destination",
                                    f"temporary destination {text!r} no longer exists")
            return dest
        core = self.require_connected(frame)
        dest = core.temporary_queue() if kind == QUEUE else core.temporary_topic()
        self.temp_by_alias[(kind, name)] = dest
        self.alias_by_temp[dest] = name
        return dest

    def _rabbit_destination(self, text: str) -> Destination:
        """RabbitMQ's destination forms (its STOMP plugin, "Destinations"): ``/amq/queue/Q``
        (Q must exist), ``/exchange/amq.topic/RK`` (as ``/topic/RK``), ``/exchange/amq.direct/
        RK`` (the topic RK), ``/exchange/amq.fanout[/RK]`` (the topic ``amq.fanout``) and
        ``/reply-queue/N`` (a temporary queue by its core name, as a rewritten reply-to)."""
        if text.startswith(AMQ_QUEUE_PREFIX):
            name = text[len(AMQ_QUEUE_PREFIX):]
            if not name:
                raise FrameRefused("unknown destination", f"{text!r} names no queue")
            if not self.broker.exists(Destination(QUEUE, name)):
                raise FrameRefused("unknown destination", f"{text!r}: queue {name!r} does not "
                                    "exist (/amq/queue/ names an existing queue)")
            return Destination(QUEUE, name)
        if text.startswith(EXCHANGE_PREFIX):
            exchange, _, key = text[len(EXCHANGE_PREFIX):].partition("/")
            if exchange == "amq.fanout":
                return Destination(TOPIC, FANOUT_TOPIC)
            if not key and exchange in ("amq.topic", "amq.direct"):
                raise FrameRefused("unknown destination",
                                    f"{text!r}: {exchange} needs a routing key")
            if exchange == "amq.topic":
                return Destination(TOPIC, _rabbit_wildcard(key, text))
            if exchange == "amq.direct":
                if "*" in key or "#" in key or ">" in key:
                    raise FrameRefused("unknown destination", f"{text!r}: a direct "
                                        "exchange's routing key is literal; the gateway's "
                                        "topics read *, # and > as wildcards")
                return Destination(TOPIC, key)
            raise FrameRefused("unknown destination", f"{text!r}: exchange {exchange!r} is "
                                "not one the gateway has (amq.topic, amq.direct, amq.fanout)")
        if text.startswith(REPLY_QUEUE_PREFIX):
            name = text[len(REPLY_QUEUE_PREFIX):]
            dest = Destination(QUEUE, name)
            if name.startswith(TEMP_PREFIX) and self.broker.exists(dest):
                return dest
            raise FrameRefused("unknown destination",
                                f"reply queue {text!r} does not exist (any more)")
        raise FrameRefused(
            "unknown destination",
            f"{text!r}: a destination starts with /queue/, /topic/, /temp-queue/, "
            "/temp-topic/, /amq/queue/, /exchange/ or /reply-queue/",
        )

    def render_destination(self, dest: Destination) -> str:
        """The STOMP name of a core destination (this connection's own alias for its
        temporary destinations)."""
        name = dest.name
        if name.startswith(TEMP_PREFIX):
            alias = self.alias_by_temp.get(dest, name)
            return ("/temp-queue/" if dest.kind == QUEUE else "/temp-topic/") + alias
        return ("/queue/" if dest.kind == QUEUE else "/topic/") + name

    # -- SEND -------------------------------------------------------------------------------------

    def _send(self, frame: Frame) -> None:
        core = self.require_connected(frame)
        headers = frame.first_headers()
        dest = self.destination(headers.get("destination"), frame)
        transformation = headers.get("transformation")
        if transformation is not None and transformation not in SEND_TRANSFORMATIONS:
            raise FrameRefused("unsupported transformation",
                                f"{transformation!r}: a SEND may name "
                                + ", ".join(sorted(SEND_TRANSFORMATIONS)))
        rt_text = headers.get("reply-to")
        reply_to = self.destination(rt_text, frame, header="reply-to") if rt_text else None
        if reply_to is not None and rt_text is not None and rt_text.startswith("/temp-queue/") \
                and reply_to in self.alias_by_temp:
            reply_subscription(self, rt_text, reply_to)
        mappings = self.broker.mappings
        # The default mapping, or the declarative mappings' wire side for this destination
        # (the same function unless a rule replaces or extends a default rule here).
        to_message = self.server.to_message if mappings is None else mappings.wire_for(
            dest, protocol="stomp", direction="in")  # fmt: skip
        now = self.broker.now()  # one clock reading for the timestamp and a delivery delay
        try:
            msg = to_message(headers, frame.body, has_length="content-length" in headers,
                             destination=dest, reply_to=reply_to, now_ms=now)
            if mappings is not None:
                msg = mappings.apply(msg, protocol="stomp", direction="in")
        except MappingFailed as exc:
            raise FrameRefused("message refused by a mapping", str(exc)) from None
        except GatewayError as exc:
            raise FrameRefused("malformed message", str(exc)) from None
        txn = headers.get("transaction")
        if txn is not None:
            transaction(self, txn, frame).send(msg)
            self.receipt(frame)
            return
        fut = self.broker.publish(msg, core, now)
        if fut is not None:
            if not fut.done():
                self.wait_for_confirmation(fut)
            elif fut.exception() is not None:
                raise FrameRefused("message not accepted", str(fut.exception()))
        self.receipt(frame)


_HANDLERS: dict[str, Callable[[StompConnection, Frame], None]] = {
    "CONNECT": StompConnection._connect,
    "STOMP": StompConnection._connect,
    "SEND": StompConnection._send,
    "SUBSCRIBE": handle_subscribe,
    "UNSUBSCRIBE": handle_unsubscribe,
    "ACK": handle_ack,
    "NACK": handle_nack,
    "BEGIN": handle_begin,
    "COMMIT": handle_commit,
    "ABORT": handle_abort,
    "DISCONNECT": StompConnection._disconnect,
}


def _rabbit_wildcard(name: str, text: str) -> str:
    """A RabbitMQ topic routing key's ``#`` (zero or more words) as the core's ``>`` (one or
    more): only as the last word; a SUBSCRIBE adds the zero-word case (``a.#`` matches ``a``)
    with the core's parent match, as MQTT's ``a/#`` does. A ``#`` word elsewhere has no core
    equivalent."""
    if "#" not in name:
        return name
    words = name.split(".")
    if "#" not in words:
        return name  # '#' inside a word is a character of the name
    if words.index("#") != len(words) - 1:
        raise FrameRefused("unknown destination", f"{text!r}: '#' is supported only as the "
                            "last word of a routing key (the gateway's '>')")
    words[-1] = ">"
    return ".".join(words)


def _heartbeats(text: str) -> tuple[int, int]:
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise FrameRefused("bad heart-beat header", f"{text!r} is not two numbers cx,cy")
    return int(parts[0]), int(parts[1])


def _malformed_title(exc: StompError) -> str:
    from adapters.stomp.codec import FrameTooLarge

    return "frame too large" if isinstance(exc, FrameTooLarge) else "malformed frame"


def _refusal_title(command: str, exc: GatewayError) -> str:
    if isinstance(exc, SecurityError):
        return "not authorized"
    if isinstance(exc, IllegalStateError):
        return f"{command} refused"
    return {"invalid-selector": "invalid selector", "invalid-destination": "invalid destination",
            "limit-exceeded": "limit exceeded", "unavailable": "unavailable"}.get(exc.reason, f"{command} failed")
