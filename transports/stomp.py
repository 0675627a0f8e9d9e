"""The ``stomp`` transport: the gateway as a STOMP 1.2 client of another broker (ActiveMQ,
RabbitMQ's STOMP plugin, another gateway).

How this works. stomp.py (v8/v9) does the protocol. It is a threaded library: a receiver
thread reads the socket and calls the listener, a heart-beat thread sends and watches
heart-beats, and every send is a blocking ``sendall`` in the caller's thread. The gateway's
loop never runs any of it:

* **One writer thread per connection** does every blocking call, in order: the TCP (and TLS)
  connect with the CONNECT frame (stomp.py's ``connect``), every SEND, SUBSCRIBE, UNSUBSCRIBE
  and ACK, and the DISCONNECT. The loop only puts frames on its queue. The thread is the
  connection's executor (``connect`` awaits the CONNECTED frame, not a thread), and a single
  thread keeps the frames in the order the loop made them, which a pool would not. Sending
  straight from the loop was measured (20,000 SENDs of 100 bytes, stomp.py on loopback,
  2 CPUs): a ``send_frame`` takes 8 µs at the median, but whenever the socket buffer is full
  it blocks until the broker reads again -- 4 to 42 ms at worst per run on ActiveMQ and
  RabbitMQ, whose flow control stops reading from a publisher that is too fast (and, during
  a memory or disk alarm, for as long as the alarm lasts). On the loop such a stall stops
  the whole gateway; in the writer it stops only this transport, whose exports wait in the
  spool's window. Throughput is the same either way within 10% (9,000 to 12,000 exports/s
  with receipts, 23,000 to 25,000 without, through the gateway to either broker).
* **The listener** (stomp.py's receiver and heart-beat threads) touches no gateway state: it
  appends each event (CONNECTED, MESSAGE, RECEIPT, ERROR, lost) to a deque and wakes the loop
  with ``call_soon_threadsafe`` only when the deque was empty, so a burst of frames costs one
  wake-up (blocking libraries hand work to the loop). The loop drains the deque;
  events of a connection that is no longer the current one are dropped.

Names: core topic ``a.b`` ↔ ``<topic_prefix>a.b`` (``/topic/a.b``), queue ``q`` ↔
``<queue_prefix>q``. A wildcard entry is subscribed as it is written (``/topic/a.>``):
EMS's syntax, which ActiveMQ's STOMP destinations share; RabbitMQ reads ``/topic/`` names as
AMQP 0-9-1 routing keys (``*`` one word, ``#`` many), so there a wildcard import entry only
matches the literal name (``transports/README.md``).

Messages: the STOMP adapter's mapping (:mod:`mappings.stomp`) both ways, so properties keep
their types (``gw-types``) and map / stream bodies travel as ``jms-map-json`` /
``jms-stream-json``. Every SEND has a ``content-length`` (bodies may hold NUL) except a text
body without NUL: ActiveMQ makes a SEND with one a JMS BytesMessage, without one a
TextMessage, and a JMS consumer there should get text as text. Every SEND carries the loop
markers ``gw-origin`` and ``gw-hops`` as headers; the trace id is the mapping's
``gw-trace-id``. Header names are escaped here (STOMP 1.2 "Value Encoding"), because stomp.py
escapes only the values.

Export: with ``receipts = true`` (the default) every SEND asks for a RECEIPT and the message
leaves the spool when it arrives (RabbitMQ holds the receipt of a ``persistent:true`` SEND
until its own publisher confirm); an ERROR frame naming the receipt refuses the message. With
``receipts = false`` a message leaves the spool once the writer has written it. A message
that was the oldest unconfirmed one at :data:`POISON_LOSSES` connection losses in a row is
refused too, so a broker that drops the connection on one message does not stop the spool.

Import: SUBSCRIBE with ``ack:client-individual``, one subscription id per far-side pattern,
a prefetch of :data:`~transports.base.IMPORT_WINDOW` (ActiveMQ's ``activemq.prefetchSize``,
RabbitMQ's ``prefetch-count``); the ACK of a message is written only after the core took it.
``pause_reading`` holds stomp.py's receiver thread, so TCP holds the broker back. A message
whose ACK was lost with the connection comes again: one another gateway sent is dropped by
base.py's (trace id, destination) check; for any other the transport remembers the
(destination, ``message-id``) of the last :data:`SETTLED_WINDOW` it took, which catches the
redelivery where the broker keeps the message-id (ActiveMQ does, tested); RabbitMQ makes a
new one per delivery, so there such a message is imported twice, the second with
``redelivered:true`` (at least once, tested).

Durable topic imports (``durable_subscriptions = true``): the SUBSCRIBE of a topic import is
durable in every dialect at once, named ``<client_id>:<pattern>`` (:meth:`durable_name`), with
``client-id`` on CONNECT; after a reconnect the same names pick up what the far side kept.
The last local subscription going removes it on the far side, in the dialect the CONNECTED
frame's ``server`` names (:meth:`_durable_unsubscribe`); one whose import ended while the
link was down is removed on the next connection.

Temporary reply-to (TIBCO EMS User's Guide, chapter "Working With TIBCO Rendezvous",
"Export Issues"): an export whose JMSReplyTo is a temporary destination of the gateway gets
``reply-to:<topic_prefix>gw-reply.<gateway id>.<q|t><n>``; the transport subscribes that topic
(again after every reconnect) and imports what arrives there into the temporary destination
while it exists (:class:`~transports.reply.ReplyRoutes`). Every :data:`~transports.reply.REPLY_SWEEP`
seconds routes whose destination is gone are dropped and unsubscribed.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

import stomp  # type: ignore[import-untyped]
from stomp.exception import ConnectFailedException  # type: ignore[import-untyped]

from gateway import subject
from gateway.errors import GatewayError
from gateway.message import QUEUE, TOPIC, BodyKind, Destination, Message
from transports.base import IMPORT_WINDOW, ExportBinding, RetryLater, Transport

if TYPE_CHECKING:
    from gateway.consumer import Delivery

log = logging.getLogger("transports.stomp")

ORIGIN = "gw-origin"
HOPS = "gw-hops"
CONNECT_TIMEOUT = 10.0  # seconds for TCP + TLS, and again for the CONNECTED frame
DISCONNECT_TIMEOUT = 2.0  # seconds the writer waits for the DISCONNECT receipt
WRITE_BATCH = 256  # frames the writer takes per wake-up (one loop wake-up per batch written)
PREFETCH = str(IMPORT_WINDOW)  # unacknowledged MESSAGEs per subscription
DISCONNECT_RECEIPT = "gw-disconnect"
# An export that was the oldest unconfirmed one when the connection was lost this many times
# in a row is refused (``failed``): a broker that closes the connection on a message (Debian's
# ActiveMQ does on a jms-map-json SEND, its XStream library missing) would otherwise get it
# again after every reconnect, and nothing behind it would ever leave the spool.
POISON_LOSSES = 3
# The "kind" of a reply route's far-side subscription in ``subs`` / ``sub_by_id`` (an import
# entry's is QUEUE or TOPIC).
REPLY = None
# (destination, message-id) of the imports taken lately, to know a redelivery whose ACK was
# lost. Those are the last ones taken before a connection dropped: at most the prefetch of
# each subscription (IMPORT_WINDOW) were unacknowledged at the broker then.
SETTLED_WINDOW = 10 * IMPORT_WINDOW

# Events the listener hands to the loop (the first item of each deque entry).
_CONNECTED, _MESSAGE, _RECEIPT, _ERROR, _LOST, _WRITTEN = range(6)

# Writer items that are not frames.
# TCP (+ TLS) connect, stomp.py's receiver thread, the CONNECT frame. One item: stomp.py's
# Connection12.connect starts the transport itself, and starting it twice makes two receiver
# threads read the same socket (frames come out torn).
_CONNECT = "connect"
_CLOSE = "close"  # DISCONNECT with a receipt, then close the socket
_ABORT = "abort"  # close the socket

_NAME_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", ":": "\\c"})
_NO_BODY = b""


def escape_name(name: str) -> str:
    """A header name as STOMP 1.2 writes it (section "Value Encoding"); stomp.py escapes
    header values but writes names as given."""
    if "\\" in name or ":" in name or "\n" in name or "\r" in name:
        return name.translate(_NAME_ESCAPES)
    return name


class Link:
    """One STOMP connection: stomp.py's connection, its listener and our writer thread.

    The ``on_*`` methods run in stomp.py's threads; ``put`` and ``drain``'s callers run on the
    loop. Nothing here touches gateway state.
    """

    def __init__(self, owner: StompTransport, conn: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.owner = owner
        self.conn = conn
        self.loop = loop
        self.events: collections.deque[tuple[int, Any, Any]] = collections.deque()
        self.scheduled = False
        self.frames: queue.SimpleQueue[tuple[str, Any, bytes, Any]] = queue.SimpleQueue()
        self.readable = threading.Event()  # cleared while the transport stops reading
        self.readable.set()
        self.gone = threading.Event()  # set when the socket is closed
        self.reason: str | None = None
        self.writer = threading.Thread(target=self._write_loop, daemon=True,
                                       name=f"stomp-writer-{owner.name}")

    def put(self, cmd: str, headers: Any = None, body: bytes = _NO_BODY,
            token: Any = None) -> None:
        """Queue one frame (or a writer command) for the writer; runs on the loop."""
        self.frames.put((cmd, headers, body, token))

    # -- stomp.py's threads -------------------------------------------------------------------

    def _post(self, kind: int, a: Any = None, b: Any = None) -> None:
        self.events.append((kind, a, b))
        if not self.scheduled:
            self.scheduled = True
            try:
                self.loop.call_soon_threadsafe(self.owner._drain, self)
            except RuntimeError:  # the loop is closed: the gateway has stopped
                pass

    def on_connected(self, frame: Any) -> None:
        self._post(_CONNECTED, frame.headers)

    def on_message(self, frame: Any) -> None:
        if not self.readable.is_set():
            # pause_reading: holding the receiver thread stops reading the socket, so TCP
            # holds the broker back (heart-beats are not read either; a pause longer than
            # the broker's heart-beat ends the connection and the broker redelivers).
            self.readable.wait()
        self._post(_MESSAGE, frame.headers, frame.body)

    def on_receipt(self, frame: Any) -> None:
        self._post(_RECEIPT, frame.headers.get("receipt-id"))

    def on_error(self, frame: Any) -> None:
        self._post(_ERROR, frame.headers, frame.body)

    def on_heartbeat_timeout(self) -> None:
        self.reason = "heart-beat timeout"

    def on_disconnected(self) -> None:
        self.gone.set()
        self.readable.set()
        reason = self.reason
        if reason is None:
            # stomp.py's heart-beat thread closes the socket first and tells the listeners
            # (on_heartbeat_timeout) after: read its clock to name the cause now.
            last = getattr(self.conn, "received_heartbeat", None)
            limit = getattr(self.conn, "receive_sleep", 0)
            if last is not None and limit and time.monotonic() - last > limit:
                reason = "heart-beat timeout"
        self._post(_LOST, reason or "connection closed")

    # -- the writer thread --------------------------------------------------------------------

    def _write_loop(self) -> None:
        frames = self.frames
        conn = self.conn
        while True:
            batch = [frames.get()]
            try:
                while len(batch) < WRITE_BATCH:
                    batch.append(frames.get_nowait())
            except queue.Empty:
                pass
            written: list[Any] = []
            for cmd, headers, body, token in batch:
                try:
                    if cmd == _CONNECT:
                        login, passcode, extra = headers
                        conn.connect(login, passcode, wait=False, headers=extra,
                                     with_connect_command=True)
                        continue
                    if cmd == _CLOSE or cmd == _ABORT:
                        self._close(graceful=cmd == _CLOSE)
                        return
                    conn.send_frame(cmd, headers, body)
                except ConnectFailedException:
                    host, port = self.owner.address
                    self._post(_LOST, f"cannot connect to {host}:{port}")
                    self._close(graceful=False)
                    return
                except Exception as exc:  # noqa: BLE001 - the socket failed: the connection is lost
                    self._post(_LOST, f"write failed: {type(exc).__name__}: {exc}")
                    self._close(graceful=False)  # what is still queued is never written
                    return
                if token is not None:
                    written.append(token)
            if written:
                self._post(_WRITTEN, written)

    def _close(self, graceful: bool) -> None:
        conn = self.conn
        transport = conn.transport
        if graceful and conn.is_connected():
            try:
                conn.set_receipt(DISCONNECT_RECEIPT, "DISCONNECT")
                conn.send_frame("DISCONNECT", {"receipt": DISCONNECT_RECEIPT})
                # stomp.py closes the socket when the receipt arrives; the broker has then
                # taken every frame before it (the ACKs above all).
                self.gone.wait(DISCONNECT_TIMEOUT)
            except Exception:  # noqa: BLE001, S110 - closing anyway
                pass
        if transport.socket is not None:
            try:
                transport.disconnect_socket()
            except Exception:  # noqa: BLE001, S110 - already closed
                pass
        transport.running = False
        self.readable.set()


class StompTransport(Transport):
    type = "stomp"

    def __init__(self, manager: Any, tdef: Any) -> None:
        super().__init__(manager, tdef)
        p = self.params
        self.address: tuple[str, int] = (p["host"], int(p["port"]))
        self.topic_prefix = str(p["topic_prefix"])
        self.queue_prefix = str(p["queue_prefix"])
        self.receipts = bool(p["receipts"])
        self.loop = self.broker.loop
        self.link: Link | None = None
        self.connected: asyncio.Future[None] | None = None
        self.pending: dict[str, tuple[Delivery, ExportBinding]] = {}  # receipt id → export
        # (core pattern, kind) → subscription id; a reply route's is (far name, REPLY)
        self.subs: dict[tuple[str, Any], str] = {}
        self.sub_by_id: dict[str, tuple[str, Any]] = {}
        self.ids = itertools.count(1)
        self.error: str | None = None  # the last ERROR frame's message, for the lost reason
        self.suspect: str | None = None  # message id of the oldest unconfirmed export at losses
        self.suspect_losses = 0
        self.server = ""  # the CONNECTED frame's server header: the far side's dialect
        self.durable = bool(p.get("durable_subscriptions"))
        self.client_id = str(p.get("client_id") or f"gw-{self.broker.name}-{self.name}")
        # Far-side durable subscriptions made (name → far destination), kept across
        # connections: one whose import ended while the link was down is removed on the next.
        self.durables: dict[str, str] = {}
        self.settled: collections.OrderedDict[tuple[str, str], None] = collections.OrderedDict()
        # Temporary reply destinations of exports, subscribed on the far side as topics.
        self.quiet: set[str] = set()  # receipts of frames whose ERROR is only logged

    # -- connecting ---------------------------------------------------------------------------

    def _make_connection(self) -> Any:
        p = self.params
        cx, cy = p["heartbeat"]
        conn = stomp.Connection12(
            host_and_ports=[self.address], prefer_localhost=False, try_loopback_connect=False,
            reconnect_sleep_initial=0.0, reconnect_sleep_increase=0.0,
            reconnect_sleep_jitter=0.0, reconnect_attempts_max=1,  # base.py reconnects
            timeout=CONNECT_TIMEOUT, heartbeats=(int(cx), int(cy)), vhost=p.get("vhost"),
            auto_decode=False, auto_content_length=False,
        )
        if p["url"].tls:
            conn.set_ssl(for_hosts=[self.address], ca_certs=p.get("tls_ca"),
                         cert_file=p.get("tls_cert"), key_file=p.get("tls_key"))
        return conn

    async def connect(self) -> None:
        """Connect (in the writer thread), send CONNECT and wait for CONNECTED."""
        conn = self._make_connection()
        link = Link(self, conn, self.loop)
        conn.set_listener("gateway", link)
        self.link = link
        self.error = None
        self.subs.clear()
        self.sub_by_id.clear()
        fut = self.connected = self.loop.create_future()
        if self.reading_paused:
            link.readable.clear()
        link.writer.start()
        # client-id names durable subscriptions (ActiveMQ, the gateway); sent only when they
        # are wanted or it is configured, since a broker refuses a second connection with the
        # same client-id (a reconnect racing with the broker's notice of the old one's loss).
        extra = ({"client-id": self.client_id}
                 if self.durable or self.params.get("client_id") else {})
        link.put(_CONNECT, (self.params.get("login"), self.params.get("passcode"), extra))
        try:
            await asyncio.wait_for(fut, 2 * CONNECT_TIMEOUT)
        except BaseException:
            self._teardown(link, graceful=False)
            raise
        finally:
            self.connected = None

    def disconnect(self) -> None:
        link = self.link
        if link is not None:
            self._teardown(link, graceful=True)

    def _teardown(self, link: Link, graceful: bool) -> None:
        if self.link is link:
            self.link = None
        link.put(_CLOSE if graceful else _ABORT)
        link.readable.set()
        self.pending.clear()
        self.subs.clear()
        self.sub_by_id.clear()
        self.quiet.clear()

    def pause_reading(self) -> None:
        if self.link is not None:
            self.link.readable.clear()

    def resume_reading(self) -> None:
        if self.link is not None:
            self.link.readable.set()

    # -- events from the listener (on the loop) -----------------------------------------------

    def _drain(self, link: Link) -> None:
        link.scheduled = False
        events = link.events
        while events:
            kind, a, b = events.popleft()
            if link is not self.link:
                continue  # a connection given up already
            if kind == _MESSAGE:
                self._on_message(link, a, b)
            elif kind == _RECEIPT:
                entry = self.pending.pop(a, None)
                if entry is None:
                    self.quiet.discard(a)
                else:
                    if self.suspect is not None and entry[0].msg.message_id == self.suspect:
                        self.suspect = None
                    self.confirmed(*entry)
            elif kind == _WRITTEN:
                for d, binding in a:
                    self.confirmed(d, binding)
            elif kind == _CONNECTED:
                fut = self.connected
                if fut is not None and not fut.done():
                    self.server = str(a.get("server", ""))
                    fut.set_result(None)
            elif kind == _ERROR:
                self._on_error(link, a, b)
            elif kind == _LOST:
                self._lost(link, a)

    def _on_error(self, link: Link, headers: dict[str, str], body: bytes) -> None:
        """An ERROR frame (STOMP 1.2 "ERROR"): the broker closes the connection after it.
        When it names the receipt of an export, that message is refused for good."""
        message = headers.get("message") or "ERROR"
        detail = body.decode("utf-8", "replace").strip() if body else ""
        text = f"{message}: {detail}" if detail else message
        fut = self.connected
        if fut is not None and not fut.done():
            fut.set_exception(ConnectionRefusedError(f"ERROR frame: {text}"))
            return
        rid = headers.get("receipt-id", "")
        entry = self.pending.pop(rid, None)
        if entry is not None:
            self.failed(*entry, text)
            return
        if rid in self.quiet:
            self.quiet.discard(rid)
            log.warning("transport %s: the broker refused a durable subscription's removal: "
                        "%s", self.name, text)
            return
        self.error = text
        log.warning("transport %s: ERROR frame from the broker: %s", self.name, text)

    def _lost(self, link: Link, reason: str) -> None:
        if self.error is not None:
            reason = f"{reason} after ERROR {self.error}"
        fut = self.connected
        oldest = next(iter(self.pending.values()), None)
        self._teardown(link, graceful=False)
        if fut is not None and not fut.done():
            fut.set_exception(ConnectionError(reason))
            return
        if oldest is not None and self.state == "up":
            self._poison_check(*oldest, reason)
        self.lost(reason)

    def _poison_check(self, d: Delivery, binding: ExportBinding, reason: str) -> None:
        """Count the losses with the same oldest unconfirmed export; refuse it at
        :data:`POISON_LOSSES` (before ``lost`` gives the rest back to the spool)."""
        msg_id = d.msg.message_id
        if msg_id is None:
            return
        if msg_id == self.suspect:
            self.suspect_losses += 1
        else:
            self.suspect, self.suspect_losses = msg_id, 1
        if self.suspect_losses >= POISON_LOSSES:
            self.suspect = None
            self.failed(d, binding, f"the broker closed the connection {POISON_LOSSES} times "
                                    f"while it was unconfirmed ({reason})")

    # -- subscriptions ------------------------------------------------------------------------

    def remote_name(self, name: str, kind: Any) -> str:
        return (self.queue_prefix if kind == QUEUE else self.topic_prefix) + name

    def remote_subscribe(self, pattern: str, kind: Any) -> None:
        headers: dict[str, str] = {}
        sid = None
        if self.durable and kind == TOPIC:
            sid = self.durable_name(pattern)
            headers = self._durable_headers(sid)
            self.durables[sid] = self.remote_name(pattern, kind)
        self._subscribe((pattern, kind), self.remote_name(pattern, kind), headers, sid)

    def _subscribe(self, key: tuple[str, Any], destination: str, extra: dict[str, str],
                   sid: str | None = None) -> None:
        link = self.link
        if link is None or key in self.subs:
            return
        if sid is None:
            sid = f"gw-{next(self.ids)}"
        self.subs[key] = sid
        self.sub_by_id[sid] = key
        link.put("SUBSCRIBE", {
            "destination": destination, "id": sid,
            "ack": "client-individual", "activemq.prefetchSize": PREFETCH,
            "prefetch-count": PREFETCH, **extra,
        })

    def remote_unsubscribe(self, pattern: str, kind: Any) -> None:
        sid = self.subs.pop((pattern, kind), None)
        if sid is None:
            return
        del self.sub_by_id[sid]
        link = self.link
        if link is None:
            return
        if sid in self.durables:
            # The last local subscription went: the far side need not keep messages for it.
            self._durable_unsubscribe(link, sid, active=True)
        else:
            link.put("UNSUBSCRIBE", {"id": sid})

    # -- durable subscriptions ----------------------------------------------------------------

    def durable_name(self, pattern: str) -> str:
        """The far-side durable subscription of a topic import narrowed to ``pattern``: the
        same on every connection and after a restart, and apart from other gateways' (the
        client id is in it, for RabbitMQ, which names the queue after the destination and
        the subscription id alone)."""
        return f"{self.client_id}:{pattern}"

    @staticmethod
    def _durable_headers(name: str) -> dict[str, str]:
        """SUBSCRIBE headers for a durable topic subscription in every dialect at once (each
        broker ignores the others'): ActiveMQ 5 ``activemq.subscriptionName`` (with CONNECT's
        ``client-id``); RabbitMQ ``durable`` and ``auto-delete:false`` (its STOMP guide,
        "Durable Topic Subscriptions"; the ``id`` is the name); the gateway's STOMP adapter and
        ActiveMQ Artemis ``durable-subscription-name``."""
        return {"activemq.subscriptionName": name, "durable-subscription-name": name,
                "durable": "true", "auto-delete": "false"}

    def _durable_unsubscribe(self, link: Link, name: str, active: bool) -> None:
        """Remove durable subscription ``name`` on the far side, in its dialect; ``active``:
        it is subscribed on this connection. Each frame asks a receipt so an ERROR about it
        (the broker lost it meanwhile) is logged, not taken for the connection's end."""
        destination = self.durables.pop(name, "")
        rid = f"u{next(self.ids)}"
        self.quiet.add(rid)
        if self.server.startswith("ActiveMQ/"):
            # ActiveMQ 5 refuses to remove a durable subscription in use ("Durable consumer is
            # in use"), and handles UNSUBSCRIBE with activemq.subscriptionName as removal only.
            if active:
                link.put("UNSUBSCRIBE", {"id": name})
            link.put("UNSUBSCRIBE", {"id": name, "activemq.subscriptionName": name,
                                     "receipt": rid})
        elif self.server.startswith("RabbitMQ/"):
            # RabbitMQ deletes the queue behind a subscription of this connection only.
            if not active:
                link.put("SUBSCRIBE", {"destination": destination, "id": name,
                                       "ack": "client-individual", "prefetch-count": "1",
                                       **self._durable_headers(name)})
            link.put("UNSUBSCRIBE", {"id": name, "durable": "true", "receipt": rid})
        else:
            link.put("UNSUBSCRIBE", {"id": name, "durable-subscription-name": name,
                                     "receipt": rid})

    def _remove_orphans(self) -> None:
        """Remove the far-side durable subscriptions whose import ended while the link was
        down (base.py drops the pattern then without telling)."""
        link = self.link
        if link is None:
            return
        for name in list(self.durables):
            key = self.sub_by_id.get(name)
            if key is None:
                self._durable_unsubscribe(link, name, active=False)

    # -- reply routes (a temporary JMSReplyTo) ------------------------------------------------
    # EMS User's Guide, chapter "Working With TIBCO Rendezvous", "Export Issues".

    def _reply_name(self, *parts: str) -> str:
        return self.topic_prefix + ".".join(parts)

    def reply_subscribe(self, name: str) -> None:
        self._subscribe((name, REPLY), name, {})

    def reply_unsubscribe(self, name: str) -> None:
        sid = self.subs.pop((name, REPLY), None)
        if sid is None:
            return
        del self.sub_by_id[sid]
        if self.link is not None:
            self.link.put("UNSUBSCRIBE", {"id": sid})

    def _on_up(self) -> None:
        # Reply routes first: the exports that super() resumes may name them, and a reply
        # must find the far-side subscription there.
        for name in self.replies.names:
            self.reply_subscribe(name)
        super()._on_up()  # the import subscriptions (durable ones again by their names)
        self._remove_orphans()

    # -- export -------------------------------------------------------------------------------

    def far_name(self, msg: Message) -> tuple[str | None, str | None]:
        """The far broker gives the message its ``message-id`` (not known here); the
        ``destination`` it was sent to."""
        dest = msg.destination
        return None, self.remote_name(dest.name, TOPIC) if dest is not None else None

    def export(self, d: Delivery, binding: ExportBinding) -> bool:
        link = self.link
        if link is None:
            raise RetryLater("not connected")
        msg = self.outgoing(d.msg)  # mappings, export_headers / export_properties
        dest = msg.destination
        assert dest is not None
        rt = msg.reply_to
        reply = None
        if rt is not None:
            # A temporary destination exists only here: the far side gets a topic of its own
            # whose messages come back to it (ReplyRoutes; subscribed before this SEND).
            reply = (self.replies.route(rt, self._reply_name) if rt.is_temporary
                     else self.remote_name(rt.name, rt.kind))
        to_stomp = self.wire_mapping(dest, "out")
        pairs, payload = to_stomp(msg, destination=self.remote_name(dest.name, TOPIC),
                                  reply_to=reply)
        headers: dict[str, str] = {}
        for name, value in pairs:
            name = escape_name(name)
            if name not in headers:
                headers[name] = value
        if msg.body_kind is not BodyKind.TEXT or b"\x00" in payload:
            headers["content-length"] = str(len(payload))
        headers[ORIGIN] = msg.origin or self.broker.id
        headers[HOPS] = str(msg.hops)
        if self.receipts:
            rid = f"e{next(self.ids)}"
            headers["receipt"] = rid
            self.pending[rid] = (d, binding)
            link.put("SEND", headers, payload)
        else:
            link.put("SEND", headers, payload, (d, binding))
        return False

    # -- import -------------------------------------------------------------------------------

    def _on_message(self, link: Link, headers: dict[str, str], body: bytes) -> None:
        sid = headers.get("subscription", "")
        ack_id = headers.get("ack") or headers.get("message-id")
        message_id = headers.get("message-id")
        key = (headers.get("destination", ""), message_id) if message_id else None
        settled = self.settled

        def ack() -> None:
            # The message is taken (or refused for good): a redelivery of it is a duplicate.
            if key is not None:
                settled[key] = None
                if len(settled) > SETTLED_WINDOW:
                    settled.popitem(last=False)
            # Only on the connection that got it, and while its subscription lasts (an ACK
            # for a subscription gone is an error to ActiveMQ).
            if self.link is link and sid in self.sub_by_id and ack_id is not None:
                link.put("ACK", {"id": ack_id})

        entry = self.sub_by_id.get(sid)
        if entry is None:
            return  # unsubscribed meanwhile: the broker drops or redelivers it
        pattern, kind = entry
        origin = headers.pop(ORIGIN, None)
        hops_text = headers.pop(HOPS, None)
        hops = int(hops_text) if hops_text is not None and hops_text.isdigit() else 0
        try:
            if kind is REPLY:
                # None: the temporary destination is gone, and the route with it (its
                # UNSUBSCRIBE is queued; the broker drops what it still had for it).
                dest = self.replies.target(pattern) if pattern in self.replies else None
                if dest is None:
                    return
            else:
                dest = self._import_destination(headers.get("destination", ""), pattern, kind)
            reply = self._reply_to(headers.get("reply-to"))
            to_message = self.wire_mapping(dest, "in")
            msg = to_message(headers, body, has_length="content-length" in headers,
                             destination=dest, reply_to=reply, now_ms=self.broker.now())
        except (GatewayError, ValueError) as exc:
            self.stats["failed"] += 1
            log.warning("transport %s: cannot import from %r: %s", self.name,
                        headers.get("destination"), exc)
            ack()
            return
        # Taken already when its key was settled: its ACK was lost with the connection.
        # ActiveMQ keeps a message's message-id on redelivery (RabbitMQ makes one per
        # delivery: never found here). Dropped as a duplicate by imported().
        self.imported(msg, origin, hops, ack, headers.get("destination"), message_id,
                      duplicate=key is not None and key in settled)

    def _import_destination(self, remote: str, pattern: str, kind: Any) -> Destination:
        """The core destination of a MESSAGE of the subscription for ``pattern``: the subject
        its ``destination`` header names, which must match the pattern (a wildcard queue
        entry puts it into the child queue of that name)."""
        prefix = self.queue_prefix if kind == QUEUE else self.topic_prefix
        name = remote[len(prefix):] if remote.startswith(prefix) else ""
        if not name or not subject.matches(pattern, name):
            if subject.is_wildcard(pattern):
                raise ValueError(f"destination {remote!r} is outside {pattern!r}")
            name = pattern  # the broker renamed it (RabbitMQ /amq/queue/...): the entry's
        return Destination(QUEUE if kind == QUEUE else TOPIC, name)

    def _reply_to(self, text: str | None) -> Destination | None:
        if not text:
            return None
        if text.startswith(self.topic_prefix):
            return Destination.topic(text[len(self.topic_prefix):])
        if text.startswith(self.queue_prefix):
            return Destination.queue(text[len(self.queue_prefix):])
        return None


def start(manager: Any, tdef: Any) -> StompTransport:
    """Registry entry for ``type = stomp`` in transports.conf."""
    return StompTransport(manager, tdef)
