"""The ``mqtt`` transport: the gateway as an MQTT 3.1.1 / 5.0 client of another broker.

How this works. paho-mqtt does the protocol; the gateway's event loop does the I/O, so every
paho callback runs on the gateway's loop and touches core state directly. The client is
paho's with the I/O and per-message fast paths of :mod:`transports.mqtt_client`. Only the
blocking TCP (and TLS) connect runs in an executor thread.

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
  PUBACK / PUBCOMP (``on_publish``), a QoS 0 one once written. At most the far side's
  Receive Maximum (MQTT 5) are unconfirmed at once: beyond it the export consumers pause.
  One paho client serves the transport's whole life: reconnecting it keeps its session, so
  unconfirmed exports are resent with their packet ids.
* Import: subscriptions at QoS ``qos`` (MQTT 5: with no-local, so the transport does not get
  its own exports back); paho's ``manual_ack`` holds the PUBACK / PUBCOMP of each imported
  message until the core has taken it.
* MQTT 3.1.1 has no user properties, so no origin can travel: the transport remembers the
  (topic, payload) of its recent exports and drops one matching import for each, which is
  what comes back when it imports a topic it exports.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from adapters.mqtt.topics import element_to_level, mqtt_topic_to_subject, subject_to_mqtt_topic
from gateway import subject
from gateway.errors import GatewayError
from gateway.message import QUEUE, TEMP_PREFIX, Destination, Message
from mappings.mqtt import message_to_mqtt, mqtt_to_message, trace_user_property
from transports.base import (
    EXPORT_WINDOW,
    ExportBinding,
    ImportBinding,
    RetryLater,
    Transport,
)
from transports.mqtt_client import FAST_FIRST, PAHO_NAMES, Client, Packed, Wire

if TYPE_CHECKING:
    from gateway.consumer import Delivery

log = logging.getLogger("transports.mqtt")

ORIGIN = "gw-origin"
HOPS = "gw-hops"
CONNECT_TIMEOUT = 10.0
MISC_INTERVAL = 1.0  # seconds between paho's loop_misc calls (keepalive, retries)
RECENT_EXPORTS = 10_000  # exports remembered for 3.1.1 loop detection
READ_BATCH = 1000  # packets read per readable callback at most (then the loop runs others)
IMPORT_DESTINATIONS = 10_000  # far-side topics whose core destination is remembered


def pattern_to_filter(pattern: str) -> str:
    """A core pattern as an MQTT topic filter (``*`` → ``+``, ``>`` → ``#``)."""
    return "/".join("+" if el == subject.STAR else "#" if el == subject.GT
                    else element_to_level(el) for el in pattern.split("."))


class MqttTransport(Transport):
    type = "mqtt"
    keeps_inflight = True

    def __init__(self, manager: Any, tdef: Any) -> None:
        super().__init__(manager, tdef)
        p = self.params
        self.v5 = p["protocol_version"] == "5"
        self.qos = int(p["qos"])
        self.prefix = str(p.get("remote_prefix") or "")
        self.client: Client | None = None
        self.write_soon = False  # a _writable call is scheduled
        self.write_waits = False  # the socket was full: the writer callback is registered
        self.sock: int | None = None  # the socket's file descriptor while connected
        self.polled = False  # the loop watches the socket (TLS); plain TCP goes through a Wire
        self.pending: dict[int, tuple[Delivery, ExportBinding]] = {}
        self.recent: OrderedDict[tuple[str, bytes], int] = OrderedDict()
        self.connack: asyncio.Future[None] | None = None
        self.misc: asyncio.TimerHandle | None = None
        self.loop = self.broker.loop
        self.receive_max = EXPORT_WINDOW  # the far side's Receive Maximum (MQTT 5)
        self.throttled = False  # export consumers paused: receive_max exports unconfirmed
        # Far-side topic → core destination of its imports (cleared when an entry is bound).
        self.import_dests: dict[str, Destination] = {}
        # Temporary reply destinations exported as a response topic, both ways.

    # -- connecting ---------------------------------------------------------------------------

    def _make_client(self) -> Client:
        p = self.params
        client_id = p.get("client_id") or f"gw-{self.broker.id}-{self.name}"[:64]
        clean = bool(p.get("clean_start"))
        c = Client(
            CallbackAPIVersion.VERSION2, client_id=client_id,
            protocol=MQTTProtocolVersion.MQTTv5 if self.v5 else MQTTProtocolVersion.MQTTv311,
            clean_session=None if self.v5 else clean, manual_ack=True,
            reconnect_on_failure=False,
        )
        if p.get("username") is not None:
            c.username_pw_set(p["username"], p.get("password"))
        url = p["url"]
        if url.tls:
            ctx = ssl.create_default_context(cafile=p.get("tls_ca"))
            if p.get("tls_cert"):
                ctx.load_cert_chain(p["tls_cert"], p.get("tls_key"))
            c.tls_set_context(ctx)
        c.max_inflight_messages_set(EXPORT_WINDOW)
        c.max_queued_messages_set(0)
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_message = self._on_message
        c.on_publish_packet = self._on_publish_packet
        c.on_publish = self._on_publish
        if log.isEnabledFor(logging.DEBUG):
            c.enable_logger(log)
        return c

    async def connect(self) -> None:
        p = self.params
        url = p["url"]
        c = self.client
        first = c is None
        if c is None:
            c = self.client = self._make_client()
        self.connack = self.loop.create_future()
        props = None
        if self.v5:
            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            props.SessionExpiryInterval = 0 if p.get("clean_start") else 0xFFFFFFFF
        keepalive = max(1, int(float(p.get("keepalive", 60.0))))

        def blocking_connect() -> None:
            # One paho client for the transport's life: reconnecting it keeps its session
            # state, so unconfirmed QoS 1/2 exports are resent with their packet ids (and a
            # QoS 2 one is not duplicated) and a re-sent PUBREL finds its import done.
            if first:
                c.connect(url.host, url.port, keepalive,
                          clean_start=bool(p.get("clean_start")) if self.v5 else 3,
                          properties=props)
            else:
                c.reconnect()

        try:
            await self.loop.run_in_executor(None, blocking_connect)
            paho_sock = c.socket()
            if paho_sock is None:
                raise ConnectionError("no socket after connect")
            if not url.tls:
                # paho leaves Nagle's algorithm on: a PUBLISH written while the previous
                # one is unacknowledged would wait for the far side's TCP ACK.
                paho_sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # type: ignore[attr-defined]
            sock = self.sock = paho_sock.fileno()  # by number: paho closes the socket itself
            c.on_socket_register_write = self._register_write
            c.on_socket_close = self._socket_closed
            c.buffered = True
            if url.tls:
                self.polled = True
                self.loop.add_reader(sock, self._readable)
            else:
                c.eof = False
                c.wire_loop = self.loop
                await self.loop.connect_accepted_socket(lambda: Wire(self, c), sock=paho_sock)
            if c.want_write():
                self._register_write(c, None, None)
            self.misc = self.loop.call_later(MISC_INTERVAL, self._tick)
            await asyncio.wait_for(self.connack, CONNECT_TIMEOUT)
        except BaseException:
            self._teardown()
            raise

    def _on_connect(self, client: paho.Client, userdata: Any, flags: Any, reason: Any,
                    properties: Any) -> None:
        fut = self.connack
        if fut is None or fut.done():
            return
        if reason.is_failure:
            fut.set_exception(ConnectionRefusedError(f"CONNACK: {reason}"))
            return
        # MQTT 5 3.2.2.3.3: never more QoS 1/2 PUBLISHes in flight than the server's Receive
        # Maximum (mosquitto says 20 and silently drops QoS 2 messages beyond it). paho cannot
        # change its window once connected, so the transport holds the core back instead.
        receive_max = getattr(properties, "ReceiveMaximum", None) if self.v5 else None
        self.receive_max = min(EXPORT_WINDOW, receive_max or EXPORT_WINDOW)
        fut.set_result(None)

    def _on_disconnect(self, client: paho.Client, userdata: Any, flags: Any, reason: Any,
                       properties: Any) -> None:
        self._teardown()
        if self.params.get("clean_start"):
            # The far side forgets the session: paho's resends would be new messages.
            self.pending.clear()
            self.release_inflight()
        self.lost(f"disconnected: {reason}")

    def _teardown(self) -> None:
        sock = self.sock
        self.write_waits = False
        if sock is not None:
            if self.polled:
                self.loop.remove_reader(sock)
                self.loop.remove_writer(sock)
                self.polled = False
            self.sock = None
        if self.misc is not None:
            self.misc.cancel()
            self.misc = None

    def _register_write(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        # paho has packets to write: they go to its buffer once in this loop iteration.
        if self.sock is not None and not self.write_soon:
            self.write_soon = True
            self.loop.call_soon(self._writable)

    def _socket_closed(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        self._teardown()

    def _readable(self) -> None:
        # paho's loop_read() reads one packet per call when nothing of ours is in flight (it
        # ignores max_packets) and reports "nothing more to read" as success, so a burst
        # would cost a callback, or a select(), per packet. Its packet reader (paho 2.x) is
        # called directly instead until the socket is empty; loop_read() is the fallback.
        c = self.client
        if c is None:
            return
        read = getattr(c, "_packet_read", None)
        handle = getattr(c, "_loop_rc_handle", None)
        if read is None or handle is None:
            c.loop_read()
            return
        again = MQTTErrorCode.MQTT_ERR_AGAIN
        budget = READ_BATCH
        while budget > 0:
            if c is not self.client or self.sock is None or self.reading_paused:
                return  # (resume_reading comes back for what is buffered)
            if c.inpos < len(c.inbuf) and c.inbuf[c.inpos] in FAST_FIRST:
                taken, rc = c.take_packets(budget)  # whole packets in the buffer, if plain
                if rc > 0:
                    handle(rc)
                    return
                if taken:
                    budget -= taken
                    continue
            rc = read()  # paho's reader: from the socket, a partial packet, anything else
            budget -= 1
            if rc == again:
                return
            if rc > 0:
                handle(rc)
                return
        if c.has_input():  # READ_BATCH packets taken; the rest is buffered here, not in the socket
            self.loop.call_soon(self._readable)

    def _writable(self) -> None:
        self.write_soon = False
        c = self.client
        if c is None or self.sock is None:
            return
        c.loop_write()
        if c.buffered and not self.write_waits:
            self._flush()

    def _flush(self) -> None:
        c = self.client
        sock = self.sock
        if c is None or sock is None:
            return
        try:
            done = c.flush()
        except OSError as exc:  # the connection broke: paho finds out on its next read
            log.info("transport %s: write failed: %s", self.name, exc)
            done = True
            c.out.clear()
        if done:
            if self.write_waits:
                self.write_waits = False
                self.loop.remove_writer(sock)
        elif not self.write_waits:
            self.write_waits = True
            self.loop.add_writer(sock, self._flush)

    def _tick(self) -> None:
        c = self.client
        if c is None or self.sock is None:
            return
        c.loop_misc()
        if self.sock is not None:
            self.misc = self.loop.call_later(MISC_INTERVAL, self._tick)

    def may_export(self) -> bool:
        # paho resends what was unconfirmed when the connection dropped: those count.
        self.throttled = len(self.pending) >= self.receive_max
        return not self.throttled

    def _on_up(self) -> None:
        super()._on_up()
        c = self.client
        if c is not None:
            for topic in self.replies.names:
                c.subscribe(topic, qos=self.qos)

    def disconnect(self) -> None:
        c = self.client
        if c is not None:
            c.on_disconnect = None
            c.disconnect()
            c.loop_write()
            if c.buffered:
                try:
                    c.flush()  # the DISCONNECT, if the socket takes it now
                except OSError:
                    pass
        self._teardown()
        self.pending.clear()

    def pause_reading(self) -> None:
        c = self.client
        if c is None:
            return
        c.hold = True  # (take_packets stops between packets)
        if c.wire is not None:
            c.wire.pause_reading()
        elif self.polled and self.sock is not None:
            self.loop.remove_reader(self.sock)

    def resume_reading(self) -> None:
        c = self.client
        if c is None:
            return
        c.hold = False
        if c.wire is not None:
            c.wire.resume_reading()
        elif self.polled and self.sock is not None:
            self.loop.add_reader(self.sock, self._readable)
        if self.sock is not None and (c.has_input() or c.eof):
            self.loop.call_soon(self._readable)

    # -- subscriptions ------------------------------------------------------------------------

    def remote_subscribe(self, pattern: str, kind: Any) -> None:
        c = self.client
        if c is None:
            return
        topic_filter = self.prefix + pattern_to_filter(pattern)
        if self.v5:
            c.subscribe(topic_filter, options=SubscribeOptions(qos=self.qos, noLocal=True))
        else:
            c.subscribe(topic_filter, qos=self.qos)

    def remote_unsubscribe(self, pattern: str, kind: Any) -> None:
        c = self.client
        if c is not None:
            c.unsubscribe(self.prefix + pattern_to_filter(pattern))

    # -- export -------------------------------------------------------------------------------

    def far_name(self, msg: Message) -> tuple[str | None, str | None]:
        """MQTT gives an application message no id; the topic it was published on."""
        dest = msg.destination
        return None, (self.prefix + subject_to_mqtt_topic(dest.name) if dest is not None
                      else None)

    def export(self, d: Delivery, binding: ExportBinding) -> bool:
        c = self.client
        if c is None:
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
        to_mqtt = self.wire_mapping(dest, "out", message_to_mqtt)
        out = to_mqtt(msg, level=5 if self.v5 else 4, now_ms=self.broker.now(),
                      reply_topic=reply_topic)
        topic = self.prefix + subject_to_mqtt_topic(dest.name)
        fields = None
        if self.v5:
            fields = dict(out.properties)
            marks = [(ORIGIN, msg.origin or self.broker.id), (HOPS, str(msg.hops))]
            fields["user_property"] = trace_user_property(
                fields.get("user_property"), msg.trace_id) + marks
        else:
            key = (topic, out.payload)
            self.recent[key] = self.recent.get(key, 0) + 1
            if len(self.recent) > RECENT_EXPORTS:
                self.recent.popitem(last=False)
        mid = c.publish_fields(topic, out.payload, self.qos, fields)
        if mid is None:
            info = c.publish(topic, out.payload, qos=self.qos,
                             properties=Packed(fields) if fields else None)  # type: ignore[arg-type]
            if info.rc == MQTTErrorCode.MQTT_ERR_NO_CONN:
                raise RetryLater("not connected")
            if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                raise GatewayError(f"publish failed: {paho.error_string(info.rc)}")
            if self.qos == 0:
                return True
            mid = info.mid
        self.pending[mid] = (d, binding)
        if len(self.pending) >= self.receive_max and not self.throttled:
            self.throttled = True
            for b in self.exports.values():
                b.consumer.core.pause()
        return False

    def _reply_topic(self, *parts: str) -> str:
        return self.prefix + "/".join(parts)

    def reply_subscribe(self, topic: str) -> None:
        c = self.client
        if c is not None:
            c.subscribe(topic, qos=self.qos)

    def reply_unsubscribe(self, topic: str) -> None:
        c = self.client
        if c is not None and self.sock is not None:
            c.unsubscribe(topic)

    def _on_publish(self, client: paho.Client, userdata: Any, mid: int, reason: Any,
                    properties: Any) -> None:
        entry = self.pending.pop(mid, None)
        if entry is None:
            return
        d, binding = entry
        if reason is not None and getattr(reason, "is_failure", False):
            self.failed(d, binding, str(reason))
        else:
            self.confirmed(d, binding)
        if self.throttled and len(self.pending) < self.receive_max and self.state == "up":
            self.throttled = False
            for b in self.exports.values():
                b.consumer.core.resume()

    # -- import -------------------------------------------------------------------------------

    def _on_message(self, client: paho.Client, userdata: Any, message: Any) -> None:
        """paho's callback, for what the fast path (:meth:`Client._handle_publish`) leaves
        to paho: QoS 2, and PUBLISH packets paho itself must judge."""
        props: dict[str, Any] = {}
        pp = message.properties
        if pp is not None and self.v5:
            for codec_name, paho_name in PAHO_NAMES.items():
                if hasattr(pp, paho_name):
                    props[codec_name] = getattr(pp, paho_name)
        self._on_publish_packet(client, message.topic, bytes(message.payload), message.qos,
                                bool(message.retain), message.mid, props)

    def _on_publish_packet(self, client: paho.Client, topic: str, payload: bytes, qos: int,
                           retain: bool, mid: int, props: dict[str, Any]) -> None:
        """One PUBLISH from the far side (``props`` by the MQTT codec's names)."""

        def ack() -> None:
            if qos and self.client is client and self.sock is not None:
                if qos == 1:
                    client.send_puback(mid)
                else:
                    client.ack(mid, qos)

        if not topic.startswith(self.prefix):
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
                ack()
                return
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
                ack()
                return
            origin, hops, reply = self._markers(props)
            msg = self.wire_mapping(dest, "in", mqtt_to_message)(
                payload=payload, qos=qos, retain=retain, properties=props,
                level=5 if self.v5 else 4, destination=dest, reply_to=reply,
                now_ms=self.broker.now())
        except Exception as exc:  # noqa: BLE001 - a message the core cannot take
            self.stats["failed"] += 1
            log.warning("transport %s: cannot import from %r: %s", self.name, topic, exc)
            ack()
            return
        self.imported(msg, origin, hops, ack if qos else None, topic)

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
