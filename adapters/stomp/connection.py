"""One STOMP connection on the core: frames in, frames out, no I/O of its own.

How this works. :class:`StompConnection` is given bytes by its transport (TCP, TLS or a
WebSocket) through :meth:`~StompConnection.data_received`, parses them with
:class:`adapters.stomp.codec.Parser` and handles each frame in order with the method of
:data:`_HANDLERS` for its command. Everything it sends goes through the ``write`` callable
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
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from adapters.stomp.codec import Frame, Parser, StompError, encode, escape
from gateway.client import AckMode
from gateway.errors import GatewayError, IllegalStateError, SecurityError
from gateway.message import QUEUE, TEMP_PREFIX, TOPIC, Destination
from mappings.engine import MappingFailed
from mappings.stomp import SEND_TRANSFORMATIONS, SUBSCRIBE_TRANSFORMATIONS, stomp_to_message

if TYPE_CHECKING:
    import asyncio

    from adapters.stomp.server import StompServer
    from gateway.client import Connection, MessageConsumer, Session, Transaction
    from gateway.consumer import Delivery

log = logging.getLogger("adapters.stomp")

VERSIONS = ("1.0", "1.1", "1.2")
SERVER_NAME = "gateway/0.1"
MAX_UNCONFIRMED = 1000  # sends waiting for the core before the connection stops reading
RESUME_UNCONFIRMED = 500
DEFAULT_PREFETCH = 1000  # unacknowledged messages per client-ack subscription
HEARTBEAT_MIN_MS = 100  # the shortest heart-beat interval the gateway sends or asks for
HEARTBEAT_GRACE = 2.0  # a client is dead after this many of its intervals in silence

# Prefixes of STOMP destinations and the core kind (and temporariness) they name.
PREFIXES = {"/queue/": (QUEUE, False), "/topic/": (TOPIC, False),
            "/temp-queue/": (QUEUE, True), "/temp-topic/": (TOPIC, True)}
DURABLE_HEADERS = ("activemq.subscriptionName", "durable-subscription-name")
# RabbitMQ's destinations (its STOMP plugin's "Destinations"): /amq/queue/ names a queue that
# must exist; of the exchanges, those every RabbitMQ node has and the core can be: amq.topic
# (the topics), amq.direct (a topic named by the routing key, no wildcards) and amq.fanout
# (one topic, FANOUT_TOPIC, whatever the routing key). /reply-queue/ is RabbitMQ's name of a
# temporary reply queue in a rewritten reply-to.
AMQ_QUEUE_PREFIX = "/amq/queue/"
EXCHANGE_PREFIX = "/exchange/"
REPLY_QUEUE_PREFIX = "/reply-queue/"
FANOUT_TOPIC = "amq.fanout"
RABBIT_DURABLE_HEADERS = ("durable", "persistent")  # SUBSCRIBE: RabbitMQ's, then its older one
PREFETCH_HEADERS = ("activemq.prefetchSize", "prefetch-count")
NO_LOCAL_HEADERS = ("activemq.noLocal", "no-local")
ACK_MODES = ("auto", "client", "client-individual")


class ProtocolError(Exception):
    """A frame the connection refuses: the ERROR frame's ``message`` and body."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail


class StompSubscription:
    """One SUBSCRIBE: a core consumer whose deliveries become MESSAGE frames."""

    __slots__ = ("conn", "id", "dest", "ack", "consumer", "session", "durable_name",
                 "by_message_id", "head", "transformation")

    def __init__(self, conn: StompConnection, sid: str, dest: Destination, ack: str) -> None:
        self.conn = conn
        self.id = sid
        self.dest = dest
        self.ack = ack  # "auto", "client" or "client-individual"
        self.consumer: MessageConsumer | None = None
        self.session: Session | None = None
        self.durable_name: str | None = None
        self.transformation: str | None = None  # the body form asked for (ActiveMQ's header)
        # STOMP 1.0 and 1.1 acknowledge by message-id: message id → delivery tag.
        self.by_message_id: dict[str, int] = {}
        self.head = "MESSAGE\nsubscription:" + escape(sid, conn.version) + "\nmessage-id:"

    def deliver(self, d: Delivery) -> None:
        """The core consumer's listener: one MESSAGE frame.

        The delivery's own headers come first (``subscription``, ``message-id``, ``ack``,
        ``redelivered``), then the message's, which the server renders and encodes once per
        message and version however many subscribers get it.
        """
        conn = self.conn
        msg = d.msg
        version = conn.version
        try:
            block, body = conn.server.render(msg, conn, self.transformation)
        except Exception as exc:  # a value no STOMP frame can carry: never retried forever
            log.warning("stomp %s: cannot send message %s: %s", conn.address,
                        msg.message_id, exc)
            d.consumer.session.reject(d, "unsendable")
            return
        mid = msg.message_id or str(d.tag)
        if version != "1.2" and ("\r" in mid or "\n" in mid):
            mid = mid.replace("\r", "%0D").replace("\n", "%0A")  # 1.0 / 1.1 cannot carry them
        parts = [self.head, mid if version == "1.0" else escape(mid, version)]
        if self.ack != "auto":
            if version == "1.2":
                parts.append("\nack:")
                parts.append(str(d.tag))
            else:
                self.by_message_id[mid] = d.tag
        if d.count > 1:
            parts.append("\nredelivered:true")
        parts.append("\n")
        conn.write(b"".join(("".join(parts).encode(), block, body, b"\0")))


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
            except ProtocolError as exc:
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
            raise ProtocolError("already connected", f"a second {frame.command} frame")
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
            raise ProtocolError("authentication failed", str(exc)) from None
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

    def _require_connected(self, frame: Frame) -> Connection:
        core = self.core
        if core is None:
            raise ProtocolError("not connected", f"{frame.command} before CONNECT")
        return core

    def _disconnect(self, frame: Frame) -> None:
        self._require_connected(frame)
        self.receipt(frame)
        self.shutdown()

    def _unknown(self, frame: Frame) -> None:
        raise ProtocolError("unknown command", f"{frame.command!r} is not a STOMP client frame")

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

    def _wait_for(self, fut: asyncio.Future[None]) -> None:
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
            raise ProtocolError(f"missing {header} header", f"{frame.command} needs {header}")
        for prefix in PREFIXES:
            if text.startswith(prefix):
                kind, temporary = PREFIXES[prefix]
                name = text[len(prefix):]
                break
        else:
            return self._rabbit_destination(text)
        if not name:
            raise ProtocolError("unknown destination", f"{text!r} names no destination")
        if not temporary:
            return Destination(kind, _rabbit_wildcard(name, text) if kind == TOPIC else name)
        dest = self.temp_by_alias.get((kind, name))
        if dest is not None:
            return dest
        if name.startswith(TEMP_PREFIX):
            dest = Destination(kind, name)
            exists = (self.broker.queues if kind == QUEUE else self.broker.topics).get(name)
            if exists is None:
                raise ProtocolError("unknown destination",
                                    f"temporary destination {text!r} no longer exists")
            return dest
        core = self._require_connected(frame)
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
                raise ProtocolError("unknown destination", f"{text!r} names no queue")
            if self.broker.queues.get(name) is None:
                raise ProtocolError("unknown destination", f"{text!r}: queue {name!r} does not "
                                    "exist (/amq/queue/ names an existing queue)")
            return Destination(QUEUE, name)
        if text.startswith(EXCHANGE_PREFIX):
            exchange, _, key = text[len(EXCHANGE_PREFIX):].partition("/")
            if exchange == "amq.fanout":
                return Destination(TOPIC, FANOUT_TOPIC)
            if not key and exchange in ("amq.topic", "amq.direct"):
                raise ProtocolError("unknown destination",
                                    f"{text!r}: {exchange} needs a routing key")
            if exchange == "amq.topic":
                return Destination(TOPIC, _rabbit_wildcard(key, text))
            if exchange == "amq.direct":
                if "*" in key or "#" in key or ">" in key:
                    raise ProtocolError("unknown destination", f"{text!r}: a direct "
                                        "exchange's routing key is literal; the gateway's "
                                        "topics read *, # and > as wildcards")
                return Destination(TOPIC, key)
            raise ProtocolError("unknown destination", f"{text!r}: exchange {exchange!r} is "
                                "not one the gateway has (amq.topic, amq.direct, amq.fanout)")
        if text.startswith(REPLY_QUEUE_PREFIX):
            name = text[len(REPLY_QUEUE_PREFIX):]
            if name.startswith(TEMP_PREFIX) and self.broker.queues.get(name) is not None:
                return Destination(QUEUE, name)
            raise ProtocolError("unknown destination",
                                f"reply queue {text!r} does not exist (any more)")
        raise ProtocolError(
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
        core = self._require_connected(frame)
        headers = _first(frame)
        dest = self.destination(headers.get("destination"), frame)
        transformation = headers.get("transformation")
        if transformation is not None and transformation not in SEND_TRANSFORMATIONS:
            raise ProtocolError("unsupported transformation",
                                f"{transformation!r}: a SEND may name "
                                + ", ".join(sorted(SEND_TRANSFORMATIONS)))
        rt_text = headers.get("reply-to")
        reply_to = self.destination(rt_text, frame, header="reply-to") if rt_text else None
        if reply_to is not None and rt_text is not None and rt_text.startswith("/temp-queue/") \
                and reply_to in self.alias_by_temp:
            self._reply_subscription(rt_text, reply_to)
        mappings = self.broker.mappings
        # The default mapping, or the declarative mappings' wire side for this destination
        # (the same function unless a rule replaces or extends a default rule here).
        to_message = stomp_to_message if mappings is None else mappings.wire_for(
            dest, protocol="stomp", direction="in")  # fmt: skip
        now = self.broker.now()  # one clock reading for the timestamp and a delivery delay
        try:
            msg = to_message(headers, frame.body, has_length="content-length" in headers,
                             destination=dest, reply_to=reply_to, now_ms=now)
            if mappings is not None:
                msg = mappings.apply(msg, protocol="stomp", direction="in")
        except MappingFailed as exc:
            raise ProtocolError("message refused by a mapping", str(exc)) from None
        except GatewayError as exc:
            raise ProtocolError("malformed message", str(exc)) from None
        txn = headers.get("transaction")
        if txn is not None:
            self._transaction(txn, frame).send(msg)
            self.receipt(frame)
            return
        fut = self.broker.publish(msg, core, now)
        if fut is not None:
            if not fut.done():
                self._wait_for(fut)
            elif fut.exception() is not None:
                raise ProtocolError("message not accepted", str(fut.exception()))
        self.receipt(frame)

    # -- SUBSCRIBE / UNSUBSCRIBE ------------------------------------------------------------------

    def _subscribe(self, frame: Frame) -> None:
        core = self._require_connected(frame)
        headers = _first(frame)
        text = headers.get("destination")
        sid = headers.get("id")
        if sid is None:
            if self.version != "1.0":
                raise ProtocolError("missing id header", "SUBSCRIBE needs an id (STOMP 1.1+)")
            sid = text or ""
        if sid in self.subscriptions:
            raise ProtocolError("duplicate subscription id", f"subscription {sid!r} exists")
        dest = self.destination(text, frame)
        ack = headers.get("ack", "auto")
        if ack not in ACK_MODES:
            raise ProtocolError("bad ack mode", f"ack {ack!r}: use auto, client or "
                                "client-individual")
        transformation = headers.get("transformation")
        if transformation is not None and transformation not in SUBSCRIBE_TRANSFORMATIONS:
            raise ProtocolError("unsupported transformation",
                                f"{transformation!r}: a subscription may ask for "
                                + ", ".join(sorted(SUBSCRIBE_TRANSFORMATIONS)))
        durable = _header(headers, DURABLE_HEADERS)
        if durable is not None:
            if dest.kind != TOPIC:
                raise ProtocolError("durable subscriptions are for topics", text or "")
            if not core.client_id:
                raise ProtocolError("durable subscription needs a client-id",
                                    "send client-id in CONNECT to name durable subscriptions")
        rabbit_durable = durable is None and dest.kind == TOPIC and _rabbit_durable(headers)
        if rabbit_durable:
            # RabbitMQ's durable subscription: a queue named x-queue-name (else by the id)
            # that any connection may come back to: a shared durable subscription of that
            # name in the gateway-wide scope, no client-id needed.
            durable = headers.get("x-queue-name") or sid
        implicit = self.subscriptions.get(text or "")
        if implicit is not None and implicit.id != sid and implicit.dest == dest:
            self.subscriptions.pop(implicit.id)  # the SEND's reply-to subscription, replaced
            if implicit.consumer is not None:
                implicit.consumer.close()
        prefetch_text = _header(headers, PREFETCH_HEADERS)
        window: int | None
        if ack == "auto":
            window = None
        elif prefetch_text is None:
            window = DEFAULT_PREFETCH
        else:
            if not prefetch_text.isdigit() or int(prefetch_text) < 1:
                raise ProtocolError("bad prefetch", f"{prefetch_text!r} is not a positive number")
            window = int(prefetch_text)
        no_local = (_header(headers, NO_LOCAL_HEADERS) or "").lower() == "true"
        sub = StompSubscription(self, sid, dest, ack)
        sub.transformation = transformation
        if ack != "auto":
            session = self.client_session
        elif durable is not None:
            session = self.durable_session
        else:
            session = self.auto_session
        assert session is not None
        sub.session = session
        sub.durable_name = durable
        sub.consumer = session.consumer(
            dest, selector=headers.get("selector"), no_local=no_local, listener=sub.deliver,
            window=window, durable_name=durable, name=sid,
            shared_name=durable if rabbit_durable else None,
            share_scope="" if rabbit_durable else None,
            # RabbitMQ's trailing '#' matches zero words too: a.# gets a as well as a.>
            parent_match=dest.kind == TOPIC and dest.name.endswith(".>") and
            (text or "").endswith(".#"),
        )
        self.subscriptions[sid] = sub
        if self.write_paused:
            sub.consumer.core.pause()
        self.receipt(frame)

    def _reply_subscription(self, text: str, dest: Destination) -> None:
        """RabbitMQ's temp-queue replies (its STOMP plugin, "Temp Queue Destinations"): a SEND
        whose ``reply-to`` is ``/temp-queue/x`` subscribes the connection to that queue, with
        the subscription id ``/temp-queue/x`` and ``ack:auto``, unless it already has a
        subscription on it (an ActiveMQ client subscribes itself)."""
        for sub in self.subscriptions.values():
            if sub.dest == dest:
                return
        if text in self.subscriptions:
            return
        session = self.auto_session
        assert session is not None
        sub = StompSubscription(self, text, dest, "auto")
        sub.session = session
        sub.consumer = session.consumer(dest, listener=sub.deliver, window=None, name=text)
        self.subscriptions[text] = sub
        if self.write_paused:
            sub.consumer.core.pause()

    def _unsubscribe(self, frame: Frame) -> None:
        core = self._require_connected(frame)
        headers = _first(frame)
        durable = _header(headers, DURABLE_HEADERS)
        sid = headers.get("id")
        if sid is None and self.version == "1.0":
            sid = headers.get("destination")
        known = self.subscriptions.get(sid) if sid is not None else None
        if durable is None and sid is not None and _rabbit_durable(headers) and (
                known is None or known.dest.kind == TOPIC):
            # RabbitMQ: UNSUBSCRIBE with durable:true deletes a topic subscription's queue
            # (on a queue subscription the header only repeats how the queue was declared).
            assert self.durable_session is not None
            sub = self.subscriptions.pop(sid, None)
            if sub is not None and sub.consumer is not None:
                sub.consumer.close()
            self.durable_session.unsubscribe(headers.get("x-queue-name") or sid, "")
            self.receipt(frame)
            return
        if sid is None and durable is None:
            raise ProtocolError("missing id header", "UNSUBSCRIBE needs the subscription id")
        sub = self.subscriptions.pop(sid, None) if sid is not None else None
        if sub is None and durable is None:
            raise ProtocolError("unknown subscription", f"no subscription {sid!r}")
        if sub is not None and sub.consumer is not None:
            sub.consumer.close()
        if durable is not None:
            if not core.client_id:
                raise ProtocolError("durable subscription needs a client-id",
                                    "send client-id in CONNECT to name durable subscriptions")
            assert self.durable_session is not None
            self.durable_session.unsubscribe(durable)
        self.receipt(frame)

    # -- ACK / NACK -------------------------------------------------------------------------------

    def _ack(self, frame: Frame) -> None:
        self._settle(frame, nack=False)

    def _nack(self, frame: Frame) -> None:
        if self.version == "1.0":
            raise ProtocolError("unknown command", "NACK is STOMP 1.1 and later")
        self._settle(frame, nack=True)

    def _settle(self, frame: Frame, *, nack: bool) -> None:
        self._require_connected(frame)
        headers = _first(frame)
        sub, tag = self._find_delivery(headers, frame)
        session = self.client_session
        assert session is not None
        txn = headers.get("transaction")
        tx = self._transaction(txn, frame) if txn is not None else None
        if sub is not None and tag is not None:
            tags = self._tags(sub, tag)
            drop = nack and headers.get("requeue", "true").lower() == "false"
            if drop and tx is not None:
                self.tx_rejects.setdefault(txn, []).extend(tags)  # type: ignore[arg-type]
            elif drop:  # RabbitMQ's requeue:false: dead-lettered or dropped, not redelivered
                for t in tags:
                    session.reject(t, "nacked")
            elif nack and tx is not None:
                self.tx_nacks.setdefault(txn, []).extend((sub, t) for t in tags)  # type: ignore[arg-type]
            elif nack:  # (a cumulative NACK gives them back in their order)
                self._release((sub, t) for t in tags)
            else:
                for t in tags:
                    if tx is not None:
                        d = session.unacked.get(t)
                        if d is not None:
                            tx.ack(d)
                    else:
                        session.ack(t)
        self.receipt(frame)

    def _find_delivery(self, headers: dict[str, str], frame: Frame
                       ) -> tuple[StompSubscription | None, int | None]:
        """The subscription and delivery tag an ACK or NACK names (``None``: already done)."""
        session = self.client_session
        assert session is not None
        if self.version == "1.2":
            ack_id = headers.get("id")
            if ack_id is None:
                raise ProtocolError("missing id header", f"{frame.command} needs the ack id")
            if not ack_id.isdigit() or int(ack_id) >= session.next_tag:
                raise ProtocolError("unknown ack id", f"no message was sent with ack {ack_id!r}")
            tag = int(ack_id)
            d = session.unacked.get(tag)
            if d is None:
                return None, None  # settled already (an earlier cumulative ACK, a redelivery)
            for sub in self.subscriptions.values():
                if sub.consumer is not None and sub.consumer.core is d.consumer:
                    return sub, tag
            return None, None
        mid = headers.get("message-id")
        if mid is None:
            raise ProtocolError("missing message-id header", f"{frame.command} needs message-id")
        sid = headers.get("subscription")
        if sid is not None:
            named = self.subscriptions.get(sid)
            if named is None:
                raise ProtocolError("unknown subscription", f"no subscription {sid!r}")
            candidates = [named]
        else:
            candidates = list(self.subscriptions.values())
        for candidate in candidates:
            found = candidate.by_message_id.get(mid)
            if found is not None:
                return candidate, found
        return None, None

    def _tags(self, sub: StompSubscription, tag: int) -> list[int]:
        """The deliveries an ACK of ``tag`` settles: all of the subscription's up to it in
        ``client`` mode, just it in ``client-individual`` mode."""
        session = self.client_session
        assert session is not None and sub.consumer is not None
        if sub.ack == "client":
            core = sub.consumer.core
            tags = [t for t, d in session.unacked.items() if t <= tag and d.consumer is core]
        else:
            tags = [tag] if tag in session.unacked else []
        if sub.by_message_id:
            settled = set(tags)
            for mid, t in list(sub.by_message_id.items()):
                if t in settled:
                    del sub.by_message_id[mid]
        return tags

    # -- transactions ------------------------------------------------------------------------------

    def _transaction(self, txn: str | None, frame: Frame) -> Transaction:
        tx = self.transactions.get(txn) if txn is not None else None
        if tx is None:
            raise ProtocolError("unknown transaction", f"no transaction {txn!r} was begun")
        return tx

    def _txn_header(self, frame: Frame) -> str:
        txn = frame.get("transaction")
        if txn is None:
            raise ProtocolError("missing transaction header", f"{frame.command} needs one")
        return txn

    def _begin(self, frame: Frame) -> None:
        core = self._require_connected(frame)
        txn = self._txn_header(frame)
        if txn in self.transactions:
            raise ProtocolError("transaction already begun", f"transaction {txn!r} is open")
        self.transactions[txn] = core.transaction()
        self.receipt(frame)

    def _commit(self, frame: Frame) -> None:
        self._require_connected(frame)
        txn = self._txn_header(frame)
        tx = self._transaction(txn, frame)
        del self.transactions[txn]
        nacks = self.tx_nacks.pop(txn, ())
        rejects = self.tx_rejects.pop(txn, ())
        fut = tx.commit()
        session = self.client_session
        assert session is not None
        self._release(nacks)
        for t in rejects:
            session.reject(t, "nacked")
        if fut is not None and not fut.done():
            self._wait_for(fut)
        self.receipt(frame)

    def _abort(self, frame: Frame) -> None:
        self._require_connected(frame)
        txn = self._txn_header(frame)
        tx = self._transaction(txn, frame)
        del self.transactions[txn]
        tx.rollback()
        session = self.client_session
        assert session is not None
        self._release(self.tx_nacks.pop(txn, ()))
        rejected = self.tx_rejects.pop(txn, ())
        session.release_all([session.unacked[t] for t in rejected if t in session.unacked])
        self.receipt(frame)

    def _release(self, nacks: Iterable[tuple[StompSubscription, int]]) -> None:
        """NACKed deliveries back for redelivery, in their order."""
        session = self.client_session
        assert session is not None
        unacked = session.unacked
        session.release_all([unacked[t] for _sub, t in nacks if t in unacked])


_HANDLERS: dict[str, Callable[[StompConnection, Frame], None]] = {
    "CONNECT": StompConnection._connect,
    "STOMP": StompConnection._connect,
    "SEND": StompConnection._send,
    "SUBSCRIBE": StompConnection._subscribe,
    "UNSUBSCRIBE": StompConnection._unsubscribe,
    "ACK": StompConnection._ack,
    "NACK": StompConnection._nack,
    "BEGIN": StompConnection._begin,
    "COMMIT": StompConnection._commit,
    "ABORT": StompConnection._abort,
    "DISCONNECT": StompConnection._disconnect,
}


def _first(frame: Frame) -> dict[str, str]:
    """The headers of a frame by name, the first of repeated ones winning (STOMP 1.2)."""
    out: dict[str, str] = {}
    for name, value in frame.headers:
        if name not in out:
            out[name] = value
    return out


def _header(headers: dict[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        value = headers.get(name)
        if value is not None:
            return value
    return None


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
        raise ProtocolError("unknown destination", f"{text!r}: '#' is supported only as the "
                            "last word of a routing key (the gateway's '>')")
    words[-1] = ">"
    return ".".join(words)


def _rabbit_durable(headers: dict[str, str]) -> bool:
    """RabbitMQ's durable topic subscription (its STOMP plugin, "Durable Topic
    Subscriptions"): ``durable:true`` (or the older ``persistent:true``) and not
    ``auto-delete:true``."""
    flag = _header(headers, RABBIT_DURABLE_HEADERS)
    return flag is not None and flag.lower() == "true" and \
        headers.get("auto-delete", "false").lower() != "true"


def _heartbeats(text: str) -> tuple[int, int]:
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ProtocolError("bad heart-beat header", f"{text!r} is not two numbers cx,cy")
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
            "limit-exceeded": "limit exceeded"}.get(exc.reason, f"{command} failed")
