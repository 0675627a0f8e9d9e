"""The ``mqtt`` transport: the gateway as an MQTT 3.1.1 / 5.0 client of another broker.

How this works. The MQTT session is :class:`transports.mqtt_session.ClientSession`, sans-I/O on
the MQTT adapter's codec in its CLIENT role; this module is its asyncio shell. The connection
is the event loop's (``loop.create_connection``, TLS by asyncio's ``ssl`` for ``mqtts://``),
and :class:`Wire`, its protocol, feeds what arrives to the session; the events the session
raises are handled at once and what it has to write leaves once per loop turn (many exports
and acknowledgements in one write). A timer ticks the session every second (keepalive,
the CONNACK timeout).

* Names: core subject ``a.b`` ↔ topic ``<remote_prefix>a/b`` (``adapters/mqtt/topics.py``,
  the same reversible escapes as the MQTT adapter); a wildcard entry ``a.*`` / ``a.>``
  subscribes ``a/+`` / ``a/#``.
* Messages: the MQTT adapter's default mapping (:mod:`mappings.mqtt`) both ways, so an
  exported message keeps its properties and their types in MQTT 5 user properties (and only
  its payload over 3.1.1). Loop markers ride in user properties: ``gw-origin`` (the gateway
  id) and ``gw-hops``; and the trace id as ``gw-trace-id``, which the transport adds itself
  (:func:`mappings.mqtt.trace_user_property`: the default mapping sends it to nobody) and
  the mapping reads back on import, so the duplicate window and the delivery logs of both
  gateways see one trace.
* Export: QoS ``qos`` (1 by default); a QoS 1 / 2 export is acknowledged to the core on
  PUBACK / PUBCOMP (:class:`~transports.mqtt_session.Published`), a QoS 0 one once written.
  At most the far side's Receive Maximum (MQTT 5) are unconfirmed at once, and nothing more
  is exported while the connection's write buffer is full: the export consumers pause. One
  session serves the transport's whole life: reconnecting keeps it, so unconfirmed exports
  are resent with their packet ids (MQTT 5.0 §4.4); when the far side has no session for us
  (``clean_start``, or a broker that lost it) they go back to the spool and are sent again
  as new messages.
* Import: subscriptions at QoS ``qos`` (MQTT 5: with no-local, so the transport does not get
  its own exports back); the PUBACK / PUBREC of each imported message waits until the core
  has taken it.
* MQTT 3.1.1 has no user properties, so no origin can travel: the transport remembers the
  (topic, payload) of its recent exports and drops one matching import for each, which is
  what comes back when it imports a topic it exports.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from adapters.mqtt.packets import ReasonCode, SubscriptionOptions
from adapters.mqtt.topics import element_to_level, mqtt_topic_to_subject, subject_to_mqtt_topic
from gateway import subject
from gateway.errors import GatewayError
from gateway.message import QUEUE, TEMP_PREFIX, Destination, Message
from gateway.tls import make_client_context
from mappings.mqtt import trace_user_property
from transports.base import (
    EXPORT_WINDOW,
    ExportBinding,
    ImportBinding,
    RetryLater,
    Transport,
)
from transports.mqtt_session import (
    CONNECTED,
    DISCONNECTED,
    NEVER_EXPIRES,
    Abandoned,
    ClientSession,
    Closed,
    Connected,
    MessageReceived,
    Published,
    Subscribed,
)

if TYPE_CHECKING:
    from gateway.consumer import Delivery

log = logging.getLogger("transports.mqtt")

ORIGIN = "gw-origin"
HOPS = "gw-hops"
CONNECT_TIMEOUT = 10.0
TICK_INTERVAL = 1.0  # seconds between session ticks (keepalive, the CONNACK timeout)
RECENT_EXPORTS = 10_000  # exports remembered for 3.1.1 loop detection
IMPORT_DESTINATIONS = 10_000  # far-side topics whose core destination is remembered

def pattern_to_filter(pattern: str) -> str:
    """A core pattern as an MQTT topic filter (``*`` → ``+``, ``>`` → ``#``)."""
    return "/".join("+" if el == subject.STAR else "#" if el == subject.GT
                    else element_to_level(el) for el in pattern.split("."))


def reason_name(code: int) -> str:
    """An MQTT 5 reason code as its name (MQTT 5.0 §2.4), for logs and errors."""
    try:
        return f"{ReasonCode(code).name} ({code:#04x})"
    except ValueError:
        return f"reason code {code:#04x}"


class Wire(asyncio.Protocol):
    """The event loop's protocol over the connection to the far broker: what arrives goes to
    the transport's session, and a full write buffer holds the exports back."""

    def __init__(self, owner: MqttTransport) -> None:
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # (uvloop's is no subclass)
        self.owner.wire = self

    def data_received(self, data: bytes) -> None:
        owner = self.owner
        if owner.wire is self:
            owner.mqtt.receive_data(data)
            if not owner.reading_paused:
                owner.process()

    def eof_received(self) -> bool | None:
        return None  # close: connection_lost tells the session

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        owner = self.owner
        if owner.wire is self:
            if not owner.reading_paused:
                owner.process()  # the packets that came with the end
            owner.mqtt.connection_lost(f"connection lost: {exc}" if exc is not None
                                       else "connection closed by the far side")
            owner.process()

    def pause_writing(self) -> None:
        if self.owner.wire is self:
            self.owner.write_full = True

    def resume_writing(self) -> None:
        if self.owner.wire is self:
            self.owner.write_full = False
            self.owner.unthrottle()


class MqttTransport(Transport):
    type = "mqtt"
    keeps_inflight = True  # the session resends unconfirmed exports after reconnecting

    def __init__(self, manager: Any, tdef: Any) -> None:
        super().__init__(manager, tdef)
        p = self.params
        self.v5 = p["protocol_version"] == "5"
        self.qos = int(p["qos"])
        self.prefix = str(p.get("remote_prefix") or "")
        clean = bool(p.get("clean_start"))
        password = p.get("password")
        self.mqtt = ClientSession(
            str(p.get("client_id") or f"gw-{self.broker.id}-{self.name}"[:64]),
            protocol_level=5 if self.v5 else 4, clean_start=clean,
            keepalive=max(1, int(float(p.get("keepalive", 60.0)))),
            username=p.get("username"),
            password=None if password is None else str(password).encode(),
            session_expiry=0 if clean else NEVER_EXPIRES, max_inflight=EXPORT_WINDOW,
            connect_timeout=CONNECT_TIMEOUT)
        self.loop = self.broker.loop
        self.wire: Wire | None = None
        self.write_soon = False  # a _write call is scheduled
        self.write_full = False  # the connection's write buffer is above its high-water mark
        self.throttled = False  # export consumers paused: window full or write buffer full
        self.connack: asyncio.Future[None] | None = None
        self.ticker: asyncio.TimerHandle | None = None
        # The far side's sessions counted: an import's acknowledgement from an earlier one
        # (whose packet id may name another message now) is not sent.
        self.epoch = 0
        self.recent: OrderedDict[tuple[str, bytes], int] = OrderedDict()
        # Far-side topic → core destination of its imports (cleared when an entry is bound).
        self.import_dests: dict[str, Destination] = {}
        self.subscribing: dict[int, str] = {}  # SUBSCRIBE packet id -> topic filter

    # -- the connection -----------------------------------------------------------------------

    async def connect(self) -> None:
        p = self.params
        url = p["url"]
        self._teardown()
        ctx = None
        if url.tls:
            ctx = make_client_context(p.get("tls_cert"), p.get("tls_key"), p.get("tls_ca"))
        self.connack = self.loop.create_future()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                wire = Wire(self)
                await self.loop.create_connection(
                    lambda: wire, url.host, url.port, ssl=ctx,
                    server_hostname=url.host if ctx is not None else None)
                if wire.closed or self.wire is not wire:
                    raise ConnectionError("connection closed by the far side")
                self.mqtt.connect(self.loop.time())
                self.process()  # CONNECT (and what a clean start abandons)
                self.ticker = self.loop.call_later(TICK_INTERVAL, self._tick)
                await self.connack
        except BaseException:
            self._teardown()
            raise

    def _teardown(self) -> None:
        """Close the connection, if any, and end the session's side of it quietly."""
        wire, self.wire = self.wire, None
        if wire is not None and wire.transport is not None:
            wire.transport.close()
        if self.ticker is not None:
            self.ticker.cancel()
            self.ticker = None
        self.write_full = False
        self.subscribing.clear()  # a SUBACK cannot come on another connection
        m = self.mqtt
        if m.state is not DISCONNECTED:
            m.connection_lost("closed by the gateway")
            m.data_to_send()  # (nothing can carry it now)
            self._handle([ev for ev in m.events_received(packets=False)
                          if type(ev) is not Closed])

    def disconnect(self) -> None:
        if self.mqtt.state is CONNECTED:
            self.mqtt.disconnect()
            self.process()  # Closed: the DISCONNECT written, the connection closed
        self._teardown()

    def process(self) -> None:
        """Handle the packets received (unless reading is paused) and the events raised since
        the last call; the session's output leaves at the end of this loop turn."""
        self._handle(self.mqtt.events_received(packets=not self.reading_paused))
        self._write_soon()

    def _handle(self, events: list[Any]) -> None:
        for ev in events:
            kind = type(ev)
            if kind is MessageReceived:
                self._received(ev)
            elif kind is Published:
                self._export_done(ev)
            elif kind is Connected:
                self._connected(ev)
            elif kind is Subscribed:
                self._subscribed(ev)
            elif kind is Abandoned:
                self._abandoned(ev)
            elif kind is Closed:
                self._closed(ev)

    def _write_soon(self) -> None:
        if not self.write_soon and self.wire is not None:
            self.write_soon = True
            self.loop.call_soon(self._write)

    def _write(self) -> None:
        self.write_soon = False
        data = self.mqtt.data_to_send()
        wire = self.wire
        if data and wire is not None and wire.transport is not None:
            wire.transport.write(data)

    def _tick(self) -> None:
        self.ticker = None
        if self.wire is None:
            return
        self.mqtt.tick(self.loop.time())
        self.process()
        if self.wire is not None:
            self.ticker = self.loop.call_later(TICK_INTERVAL, self._tick)

    def _connected(self, ev: Connected) -> None:
        if not ev.session_present:
            self.epoch += 1
        fut = self.connack
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _closed(self, ev: Closed) -> None:
        wire = self.wire
        if wire is not None and wire.transport is not None:
            data = self.mqtt.data_to_send()  # a DISCONNECT the session sent as it ended
            if data:
                wire.transport.write(data)
        self._teardown()
        reason = f"{reason_name(ev.reason_code)}: {ev.reason}"
        fut = self.connack
        if fut is not None and not fut.done():
            fut.set_exception(ConnectionRefusedError(f"CONNACK: {reason}") if ev.by_server
                              else ConnectionError(reason))
            return
        self.lost(f"disconnected: {reason}")

    def _abandoned(self, ev: Abandoned) -> None:
        """The far side has no session for us: what it had not confirmed goes back to the
        spool, to be exported again as new messages (in their order)."""
        deliveries = []
        for token in ev.tokens:
            d, binding = cast("tuple[Delivery, ExportBinding]", token)
            binding.inflight -= 1
            deliveries.append(d)
        self.session.release_all(deliveries, count_delivery=False)

    def may_export(self) -> bool:
        m = self.mqtt
        self.throttled = self.write_full or m.inflight + m.queued >= m.window
        return not self.throttled

    def unthrottle(self) -> None:
        """Resume the export consumers the window or a full write buffer held back."""
        if self.throttled and self.state == "up" and self.may_export():
            for b in self.exports.values():
                b.consumer.core.resume()

    def _on_up(self) -> None:
        super()._on_up()
        for topic in self.replies.names:
            self.reply_subscribe(topic)

    def pause_reading(self) -> None:
        wire = self.wire
        if wire is not None and wire.transport is not None:
            wire.transport.pause_reading()

    def resume_reading(self) -> None:
        wire = self.wire
        if wire is not None and wire.transport is not None:
            wire.transport.resume_reading()
            self.loop.call_soon(self.process)  # what arrived before the pause

    # -- subscriptions ------------------------------------------------------------------------

    def _subscribe(self, topic_filter: str, no_local: bool) -> None:
        if self.mqtt.state is CONNECTED:
            pid = self.mqtt.subscribe([(topic_filter, SubscriptionOptions(
                qos=self.qos, no_local=no_local and self.v5))])
            self.subscribing[pid] = topic_filter
            self._write_soon()

    def _unsubscribe(self, topic_filter: str) -> None:
        if self.mqtt.state is CONNECTED:
            self.mqtt.unsubscribe([topic_filter])
            self._write_soon()

    def _subscribed(self, ev: Subscribed) -> None:
        topic_filter = self.subscribing.pop(ev.packet_id, "?")
        for code in ev.reason_codes:
            if code >= 0x80:
                log.warning("transport %s: the far side refused the subscription %r: %s",
                            self.name, topic_filter, reason_name(code))

    def info(self) -> dict[str, Any]:
        out = super().info()
        out["subscribing"] = len(self.subscribing)  # SUBSCRIBEs the far side has not answered
        return out

    def remote_subscribe(self, pattern: str, kind: Any) -> None:
        self._subscribe(self.prefix + pattern_to_filter(pattern), True)

    def remote_unsubscribe(self, pattern: str, kind: Any) -> None:
        self._unsubscribe(self.prefix + pattern_to_filter(pattern))

    def reply_subscribe(self, topic: str) -> None:
        self._subscribe(topic, False)

    def reply_unsubscribe(self, topic: str) -> None:
        self._unsubscribe(topic)

    # -- export -------------------------------------------------------------------------------

    def far_name(self, msg: Message) -> tuple[str | None, str | None]:
        """MQTT gives an application message no id; the topic it was published on."""
        dest = msg.destination
        return None, (self.prefix + subject_to_mqtt_topic(dest.name) if dest is not None
                      else None)

    def export(self, d: Delivery, binding: ExportBinding) -> bool:
        m = self.mqtt
        if m.state is not CONNECTED:
            raise RetryLater("not connected")
        msg = self.outgoing(d.msg)
        dest = msg.destination
        assert dest is not None
        rt = msg.reply_to
        reply_topic = None
        if rt is not None:
            reply_topic = (self.replies.route(rt, self._reply_topic)
                           if rt.name.startswith(TEMP_PREFIX)
                           else self.prefix + subject_to_mqtt_topic(rt.name))
        to_mqtt = self.wire_mapping(dest, "out")
        out = to_mqtt(msg, level=5 if self.v5 else 4, now_ms=self.broker.now(),
                      reply_topic=reply_topic)
        topic = self.prefix + subject_to_mqtt_topic(dest.name)
        fields = None
        if self.v5:
            fields = dict(out.properties)
            marks = [(ORIGIN, msg.origin or self.broker.id), (HOPS, str(msg.hops))]
            fields["user_property"] = trace_user_property(
                fields.get("user_property"), msg.trace_id) + marks
        qos = self.qos
        m.publish(topic, out.payload, qos, properties=fields, token=(d, binding))
        self._write_soon()
        if not self.v5:
            key = (topic, out.payload)
            self.recent[key] = self.recent.get(key, 0) + 1
            if len(self.recent) > RECENT_EXPORTS:
                self.recent.popitem(last=False)
        if not qos:
            return True
        if not self.throttled and (self.write_full or m.inflight + m.queued >= m.window):
            self.throttled = True
            for b in self.exports.values():
                b.consumer.core.pause()
        return False

    def _reply_topic(self, *parts: str) -> str:
        return self.prefix + "/".join(parts)

    def _export_done(self, ev: Published) -> None:
        d, binding = cast("tuple[Delivery, ExportBinding]", ev.token)
        if ev.reason_code >= 0x80:
            self.failed(d, binding, reason_name(ev.reason_code))
        else:
            self.confirmed(d, binding)
        if self.throttled:
            self.unthrottle()

    # -- import -------------------------------------------------------------------------------

    def _received(self, ev: MessageReceived) -> None:
        """One PUBLISH from the far side."""
        topic = ev.topic
        payload = ev.payload
        qos = ev.qos
        ack: Callable[[], None] | None = None
        if qos:
            epoch = self.epoch
            pid = ev.packet_id

            def ack() -> None:
                if self.epoch == epoch:
                    self.mqtt.ack(pid)
                    self._write_soon()

        if not topic.startswith(self.prefix):
            if ack is not None:
                ack()
            return
        if not self.v5:
            key = (topic, payload)
            n = self.recent.get(key)
            if n:
                if n == 1:
                    del self.recent[key]
                else:
                    self.recent[key] = n - 1
                self.stats["dropped_loop"] += 1
                if ack is not None:
                    ack()
                return
        props = ev.properties
        try:
            if topic in self.replies:
                dest = self.replies.target(topic)  # None: the temporary destination is gone
            else:
                dest = self.import_dests.get(topic)
                if dest is None:
                    dest = self._import_destination(
                        mqtt_topic_to_subject(topic[len(self.prefix):]))
                    if dest is not None and len(self.import_dests) < IMPORT_DESTINATIONS:
                        self.import_dests[topic] = dest
            if dest is None:
                if ack is not None:
                    ack()
                return
            origin, hops, reply = self._markers(props)
            msg = self.wire_mapping(dest, "in")(
                payload=payload, qos=qos, retain=ev.retain, properties=props,
                level=5 if self.v5 else 4, destination=dest, reply_to=reply,
                now_ms=self.broker.now())
        except Exception as exc:  # noqa: BLE001 - a message the core cannot take
            self.stats["failed"] += 1
            log.warning("transport %s: cannot import from %r: %s", self.name, topic, exc)
            if ack is not None:
                ack()
            return
        self.imported(msg, origin, hops, ack, topic)

    def bind_import(self, pattern: str, kind: Any) -> bool:
        self.import_dests.clear()  # a new entry may send a topic elsewhere (a queue)
        return super().bind_import(pattern, kind)

    def _import_destination(self, name: str) -> Destination | None:
        """The destination an imported subject goes to: a queue entry's (a wildcard entry's
        child queue of that name) or a topic entry's."""
        found: ImportBinding | None = None
        for b in self.imports.values():
            if subject.matches(b.pattern, name):
                if b.kind == QUEUE:
                    return Destination(QUEUE, name)
                found = b
        return Destination.topic(name) if found is not None else None

    def _markers(self, props: dict[str, Any]) -> tuple[str | None, int, Destination | None]:
        """Take the loop markers out of ``props``' user properties; the reply destination
        of its response topic."""
        origin = None
        hops = 0
        reply = None
        user = props.get("user_property")
        if user:
            kept = []
            for k, v in user:
                if k == ORIGIN and origin is None:
                    origin = v
                elif k == HOPS:
                    hops = int(v) if v.isdigit() else 0
                else:
                    kept.append((k, v))
            props["user_property"] = kept
        rt = props.get("response_topic")
        if rt and rt.startswith(self.prefix):
            try:
                reply = Destination.topic(mqtt_topic_to_subject(rt[len(self.prefix):]))
            except GatewayError:
                reply = None
        return origin, hops, reply


def start(manager: Any, tdef: Any) -> MqttTransport:
    """Registry entry for ``type = mqtt`` in transports.conf."""
    return MqttTransport(manager, tdef)
