"""The ``mqtt`` transport: the gateway as an MQTT 3.1.1 / 5.0 client of another broker.

How this works. paho-mqtt does the protocol; the gateway's event loop does the I/O, so every
paho callback runs on the gateway's loop and touches core state directly. Only the blocking
TCP (and TLS) connect runs in an executor thread. Once connected, paho's socket I/O is
buffered (:class:`_Client`): what paho writes in one loop iteration goes out at once, and
paho's reads are served from what arrived. Over plain TCP the socket is handed to the loop
as a transport (:class:`_Wire`): the loop reads and writes it (uvloop does so without
releasing the GIL, which a ``send`` from Python does -- and then waits for the store's or the
delivery log's thread to give it back), and paho's reader is run on what arrives. Over TLS
the socket stays paho's ``SSLSocket``, watched with ``add_reader`` as paho's
``loop_asyncio`` example does: a read takes all the socket has, a write is one ``send``
(``add_writer`` only while the socket is full).

Three per-message steps of paho cost more than everything else the transport does per
message, and :class:`_Client` takes them over for the common case only: reading a plain
success PUBACK / PUBCOMP (paho builds a ``ReasonCode``, which copies a table of names, and
``Properties`` for each; a run of them is settled straight from the input buffer), reading
a QoS 0 / 1 PUBLISH (with the MQTT adapter's own codec helpers instead of paho's
``MQTTMessage`` and ``Properties``), and encoding a QoS 1 / 2 export (with the adapter's
encoder; the message is entered in paho's session as paho's ``publish`` enters it, with a
progress record that needs no ``threading.Condition``). paho keeps the session state either way (in-flight exports,
packet ids, resends after a reconnect); anything unusual goes to paho's own code.

* Names: core subject ``a.b`` ↔ topic ``<remote_prefix>a/b`` (``adapters/mqtt/topics.py``,
  the same reversible escapes as the MQTT adapter); a wildcard entry ``a.*`` / ``a.>``
  subscribes ``a/+`` / ``a/#``.
* Messages: the MQTT adapter's default mapping (:mod:`mappings.mqtt`) both ways, so an
  exported message keeps its properties and their types in MQTT 5 user properties (and only
  its payload over 3.1.1). Loop markers ride in user properties: ``gw-origin`` (the gateway
  id) and ``gw-hops``; the trace id is the mapping's ``gw-trace-id``.
* Export: QoS ``qos`` (1 by default); a QoS 1 / 2 export is acknowledged to the core on
  PUBACK / PUBCOMP (``on_publish``), a QoS 0 one once written. at most the far side's
  Receive Maximum (MQTT 5) are unconfirmed at once: beyond it the export consumers pause. One paho client serves the transport's whole life: reconnecting it
  keeps its session, so unconfirmed exports are resent with their packet ids.
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
import struct
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from adapters.mqtt.encoding import encode_publish
from adapters.mqtt.packets import PUBLISH, MqttRemoteProtocolError
from adapters.mqtt.properties import encode_properties, read_properties
from adapters.mqtt.topics import _element_to_level, mqtt_topic_to_subject, subject_to_mqtt_topic
from gateway import subject
from gateway.errors import GatewayError
from gateway.message import QUEUE, TEMP_PREFIX, Destination
from mappings.mqtt import message_to_mqtt, mqtt_to_message
from transports.base import (
    EXPORT_WINDOW,
    ExportBinding,
    ImportBinding,
    RetryLater,
    Transport,
)

if TYPE_CHECKING:
    from gateway.endpoint import Delivery

log = logging.getLogger("transports.mqtt")

ORIGIN = "gw-origin"
HOPS = "gw-hops"
CONNECT_TIMEOUT = 10.0
MISC_INTERVAL = 1.0  # seconds between paho's loop_misc calls (keepalive, retries)
RECENT_EXPORTS = 10_000  # exports remembered for 3.1.1 loop detection
READ_BATCH = 1000  # packets read per readable callback at most (then the loop runs others)
READ_SIZE = 65536  # bytes asked of the socket at once
IMPORT_DESTINATIONS = 10_000  # far-side topics whose core destination is remembered
_PUBACK = struct.Struct("!BBH")  # fixed header, remaining length 2, packet id

# MQTT 5 PUBLISH properties: the codec's names (mappings.mqtt) ↔ paho's.
_PAHO_NAMES = {
    "payload_format_indicator": "PayloadFormatIndicator",
    "message_expiry_interval": "MessageExpiryInterval",
    "content_type": "ContentType",
    "response_topic": "ResponseTopic",
    "correlation_data": "CorrelationData",
    "user_property": "UserProperty",
}


class _Client(paho.Client):
    """paho's client with its socket I/O buffered (paho reads a packet in three or more
    ``recv`` calls and writes each packet with its own ``send``: on a busy link those system
    calls cost more than the rest of paho).

    While :attr:`buffered` is on (the transport sets it once connected; the blocking connect
    in an executor thread runs unbuffered), reads are served from one ``recv`` of up to
    :data:`READ_SIZE` bytes, and writes are collected in :attr:`out` for the transport to send
    once per loop iteration (:meth:`flush`). Both buffers are dropped with the socket; what
    was unconfirmed is resent by paho after reconnecting, as without buffers.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.buffered = False
        self.tls = False  # a TLS socket may hold decrypted bytes that a readable event misses
        self.drained = False  # set by a short read; the transport clears it per readable event
        self.inbuf = b""
        self.inpos = 0
        self.out = bytearray()
        # Called for each QoS 0 / 1 PUBLISH instead of on_message (see _handle_publish).
        self.on_publish_packet: Callable[..., None] | None = None
        # The event loop's transport over the socket (plain TCP), when it does the I/O.
        self.wire: asyncio.Transport | None = None
        self.wire_loop: asyncio.AbstractEventLoop | None = None
        self.eof = False  # the wire's connection is gone: reads end once the input is taken
        self.hold = False  # the transport paused reading: take_packets stops

    def feed(self, data: bytes) -> None:
        """Bytes the wire received: paho reads them through :meth:`_sock_recv`."""
        pos = self.inpos
        if pos >= len(self.inbuf):
            self.inbuf = data
        else:
            self.inbuf = self.inbuf[pos:] + data
        self.inpos = 0

    def _sock_recv(self, bufsize: int) -> bytes:
        data, pos = self.inbuf, self.inpos
        if pos >= len(data) and self.wire is not None:
            if self.eof:
                return b""
            raise BlockingIOError
        if pos >= len(data):
            if self.drained:  # the last recv took less than asked: the socket is empty
                raise BlockingIOError
            data = super()._sock_recv(READ_SIZE)  # BlockingIOError when empty, b"" at EOF
            self.drained = self.buffered and not self.tls and 0 < len(data) < READ_SIZE
            if len(data) <= bufsize:
                self.inbuf, self.inpos = b"", 0
                return data
            self.inbuf, pos = data, 0
        end = pos + bufsize
        self.inpos = end
        return data[pos:end]

    def _sock_send(self, buf: bytes | bytearray) -> int:
        if not self.buffered:
            return super()._sock_send(buf)
        self.out += buf
        return len(buf)

    def _handle_pubackcomp(self, cmd: Any) -> MQTTErrorCode:
        """paho's PUBACK / PUBCOMP handler, without its cost for the usual acknowledgement.

        An acknowledgement without properties (remaining length 2: success, MQTT 5.0
        3.4.2.1; or 3 / 4 with a reason code and an empty property block -- mosquitto says
        0x10 "No matching subscribers" for a topic nobody reads) is what nearly every
        acknowledgement is: paho decodes each into a fresh ``ReasonCode`` (which copies a
        table of ~50 names) and ``Properties``, and rescans every in-flight message
        afterwards; together that costs more than the rest of an export. Here such an
        acknowledgement does what paho's ``_do_on_publish`` does -- ``on_publish`` with a
        shared reason code object of the same value, then the message leaves
        ``_out_messages`` and the in-flight count -- and paho's own handler takes everything
        else (properties, a code the packet type does not allow).
        """
        packet = self._in_packet["packet"]
        n = len(packet)
        codes = _ACK_REASONS[cmd]
        reason: ReasonCode | None = None
        if n == 2:
            reason = codes[0]
        elif n == 3 or (n == 4 and not packet[3]):
            reason = codes.get(packet[2])
        if reason is None:  # properties, or a code this packet type does not have
            return super()._handle_pubackcomp(cmd)  # type: ignore[no-any-return]
        return self._settle((packet[0] << 8) | packet[1], reason)

    def _settle(self, mid: int, reason: ReasonCode) -> MQTTErrorCode:
        """What paho's ``_do_on_publish`` does for a plain acknowledgement of ``mid``."""
        with self._out_message_mutex:
            out = self._out_messages
            msg = out.get(mid)
            if msg is None:
                return MQTTErrorCode.MQTT_ERR_SUCCESS
            on_publish: Any = self.on_publish  # the VERSION2 signature (the transport's)
            if on_publish is not None:
                on_publish(self, self._userdata, mid, reason, _NO_PROPERTIES)
            out.pop(mid, None)
            msg.info._set_as_published()
            if msg.qos > 0:
                self._inflight_messages -= 1
                if len(out) > self._inflight_messages:  # some wait for a free slot
                    return self._update_inflight()  # type: ignore[no-any-return]
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def take_packets(self, limit: int) -> tuple[int, MQTTErrorCode]:
        """Handle the whole packets at the head of the buffered input that need nothing of
        paho's reader (a dict of read state and three ``recv`` calls a packet, on a busy
        link most of what the transport does per message): plain PUBACK / PUBCOMP (four
        bytes each: success, MQTT 5.0 3.4.2.1), settled as :meth:`_handle_pubackcomp`
        settles them, and QoS 0 / 1 PUBLISH packets, handed on as :meth:`_handle_publish`
        hands them. Stops at anything else, at a packet not wholly buffered, after
        ``limit`` packets, and when :attr:`hold` is set (the transport paused reading).

        Only between packets (paho is not half-way through one). Returns how many it took
        and the result of the last (an error from resending what waited for a free slot is
        for paho's loop to handle).
        """
        rc = MQTTErrorCode.MQTT_ERR_SUCCESS
        if self._in_packet["command"]:
            return 0, rc
        data = self.inbuf
        pos = self.inpos
        end = len(data)
        deliver = self.on_publish_packet if self._manual_ack else None
        taken = 0
        while taken < limit and pos + 2 <= end and not self.hold:
            first = data[pos]
            if first == 0x40 or first == 0x70:
                if data[pos + 1] != 2 or pos + 4 > end:
                    break
                mid = (data[pos + 2] << 8) | data[pos + 3]
                pos += 4
                self.inpos = pos
                rc = self._settle(mid, _ACK_SUCCESS if first == 0x40 else _COMP_SUCCESS)
            elif (first & 0xF0) == 0x30 and (first & 0x06) < 4 and deliver is not None:
                p = pos + 1  # the Remaining Length: one to four bytes
                length = mult = 0
                while True:
                    if p >= end or mult > 21:
                        length = -1
                        break
                    byte = data[p]
                    p += 1
                    length |= (byte & 0x7F) << mult
                    mult += 7
                    if not byte & 0x80:
                        break
                stop = p + length
                if length < 2 or stop > end:
                    break
                parsed = self._parse_publish(first, data, p, stop)
                if parsed is None:
                    break
                pos = stop
                self.inpos = pos
                deliver(self, *parsed)
            else:
                break
            taken += 1
            if rc or self.inbuf is not data:  # an error, or the socket went with its buffer
                break
        if taken:
            with self._msgtime_mutex:
                self._last_bytes_received = paho.time_func()
        return taken, rc

    def _handle_publish(self) -> MQTTErrorCode:
        """paho's PUBLISH handler, without its cost for a QoS 0 / 1 message.

        paho decodes each PUBLISH into an ``MQTTMessage`` with a ``Properties`` object and
        matches it against its callback filters: more than the transport's own import work.
        A QoS 0 / 1 PUBLISH is read here with the MQTT adapter's codec helpers and handed to
        :attr:`on_publish_packet` with its properties by the codec's names (the six a
        message keeps, as the transport reads them from paho); with ``manual_ack`` on, as
        the transport has it, paho would do nothing else for it. QoS 2 (paho keeps its
        exchange state), a packet that does not parse (paho reports it its own way) and
        one with properties a message does not keep (a Topic Alias the transport never
        allowed) go to paho's handler.
        """
        deliver = self.on_publish_packet
        command = self._in_packet["command"]
        if deliver is None or (command >> 1) & 3 > 1 or not self._manual_ack:
            return super()._handle_publish()  # type: ignore[no-any-return]
        data = bytes(self._in_packet["packet"])  # paho reads into a bytearray
        parsed = self._parse_publish(command, data, 0, len(data))
        if parsed is None:
            return super()._handle_publish()  # type: ignore[no-any-return]
        deliver(self, *parsed)
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def _parse_publish(self, command: int, data: bytes, p: int,
                       end: int) -> tuple[str, bytes, int, bool, int, dict[str, Any]] | None:
        """The QoS 0 / 1 PUBLISH whose variable header starts at ``data[p]`` and which ends at
        ``end``, as :attr:`on_publish_packet`'s arguments; None for what paho must judge."""
        qos = (command >> 1) & 3
        try:
            start = p + 2
            p = start + ((data[p] << 8) | data[p + 1])
            topic = data[start:p].decode()
            mid = 0
            if qos:
                mid = (data[p] << 8) | data[p + 1]
                p += 2
            props: dict[str, Any] = {}
            if self._protocol == paho.MQTTv5:
                props, p = read_properties(data, p, end, PUBLISH)
        except (IndexError, UnicodeDecodeError, MqttRemoteProtocolError):
            return None
        if p > end or not topic or not _KEPT_PROPERTIES.issuperset(props):
            return None
        return topic, data[p:end], qos, bool(command & 1), mid, props

    def publish_fields(self, topic: str, payload: bytes, qos: int,
                       fields: dict[str, Any] | None) -> int | None:
        """paho's ``publish`` of a QoS 1 / 2 message, with the PUBLISH encoded by the MQTT
        adapter's encoder (``fields``: MQTT 5 properties by the codec's names).

        The message is entered in paho's ``_out_messages`` and in-flight count exactly as
        paho's ``publish`` enters it, so paho acknowledges it, and resends it after a
        reconnect, as its own; only the per-message objects paho builds on the way (a topic
        check on bytes, a packet built byte by byte, its logging calls) are not made.
        Returns the packet id, or None when paho's ``publish`` must take the message (QoS 0,
        not connected, paho's window full: paho queues or refuses it its own way).

        Raises:
            MqttLocalProtocolError: the topic is not a valid topic name.
        """
        if (qos == 0 or self._sock is None or not self.buffered
                or self._inflight_messages >= self._max_inflight_messages > 0):
            return None
        v5 = self._protocol == paho.MQTTv5
        mid = self._mid_generate()
        data = encode_publish(topic, payload, qos, False, False, mid, fields if v5 else None,
                              5 if v5 else 4)
        message = _OutMessage(mid, topic.encode())
        message.timestamp = paho.time_func()
        message.payload = payload
        message.qos = qos
        message.properties = _Packed(fields) if v5 and fields else None  # type: ignore[assignment]
        with self._out_message_mutex:
            out = self._out_messages
            if mid in out:  # 65,535 unconfirmed: paho refuses it (MQTT_ERR_QUEUE_SIZE)
                return None
            out[mid] = message
            self._inflight_messages += 1
            message.state = (paho.mqtt_ms_wait_for_puback if qos == 1
                             else paho.mqtt_ms_wait_for_pubrec)
            self._packet_queue(data[0], data, mid, qos, message.info)
        return mid

    def send_puback(self, mid: int) -> None:
        """paho's ``ack(mid, 1)``: the PUBACK of an imported QoS 1 message (success, no
        properties: four bytes in both versions, MQTT 5.0 3.4.2.1) put straight into
        :attr:`out`, without the packet record and log call paho makes for it. paho's own
        path when something of paho's still waits to be written (the order is kept) or the
        buffer is off."""
        if self.buffered and self._sock is not None and not self._out_packet:
            self.out += _PUBACK.pack(0x40, 2, mid)
            self._call_socket_register_write()
            return
        self.ack(mid, 1)

    def has_input(self) -> bool:
        """Bytes read from the socket and not yet taken by paho: no readable event will come
        for them."""
        return self.inpos < len(self.inbuf)

    def _sock_close(self) -> None:
        self.buffered = False
        self.inbuf, self.inpos = b"", 0
        self.out.clear()
        wire, self.wire = self.wire, None
        if wire is not None:
            # The wire holds a reference on the socket: paho's close below leaves the file
            # descriptor to it, and closing the wire closes it (on the loop's thread).
            loop = self.wire_loop
            assert loop is not None
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                wire.close()
            else:
                loop.call_soon_threadsafe(wire.close)
        super()._sock_close()

    def flush(self) -> bool:
        """Send what is buffered; False while some is left (the socket is full)."""
        out = self.out
        wire = self.wire
        if wire is not None:
            if out:
                wire.write(bytes(out))  # the loop's transport keeps what the socket refuses
                out.clear()
            return True
        while out:
            try:
                n = super()._sock_send(out)
            except BlockingIOError:
                return False
            del out[:n]
        return True


_KEPT_PROPERTIES = frozenset(_PAHO_NAMES)  # what an imported PUBLISH's properties may hold

# What the fast acknowledgement path hands to ``on_publish`` (read-only, shared): a reason
# code object per value the packet type allows (MQTT 5.0 3.4.2.1, 3.7.2.1).
_ACK_REASONS: dict[str, dict[int, ReasonCode]] = {
    name: {code: ReasonCode(packet_type, identifier=code)  # type: ignore[no-untyped-call]
           for code, names in ReasonCode.names.items()
           if any(packet_type in types for types in names.values())}
    for name, packet_type in (("PUBACK", PacketTypes.PUBACK), ("PUBCOMP", PacketTypes.PUBCOMP))
}
_ACK_SUCCESS = _ACK_REASONS["PUBACK"][0]
_COMP_SUCCESS = _ACK_REASONS["PUBCOMP"][0]
# The first byte of what take_packets may take: PUBACK, PUBCOMP, PUBLISH at QoS 0 / 1.
_FAST_FIRST = frozenset((0x40, 0x70, 0x30, 0x31, 0x32, 0x33, 0x38, 0x39, 0x3A, 0x3B))
_NO_PROPERTIES = Properties(PacketTypes.PUBACK)  # type: ignore[no-untyped-call]


class _Info(paho.MQTTMessageInfo):
    """paho's record of a message's progress, for the exports :meth:`_Client.publish_fields`
    enters: nobody waits on one (paho's ``wait_for_publish``), so there is no
    ``threading.Condition`` a message to make and notify, only the flag."""

    __slots__ = ()

    def __init__(self, mid: int) -> None:
        self.mid = mid
        self._published = False
        self.rc = MQTTErrorCode.MQTT_ERR_SUCCESS
        self._iterpos = 0

    def _set_as_published(self) -> None:
        self._published = True

    def is_published(self) -> bool:
        return self._published

    def wait_for_publish(self, timeout: float | None = None) -> None:
        raise RuntimeError("an export's publication is reported through on_publish")


class _OutMessage(paho.MQTTMessage):
    """paho's ``MQTTMessage`` with an :class:`_Info`."""

    __slots__ = ()

    def __init__(self, mid: int, topic: bytes) -> None:
        self.timestamp = 0.0
        self.state = paho.mqtt_ms_invalid
        self.dup = False
        self.mid = mid
        self._topic = topic
        self.payload = b""
        self.qos = 0
        self.retain = False
        self.info = _Info(mid)
        self.properties = None


class _Packed:
    """PUBLISH properties by the codec's names, encoded by the MQTT adapter's codec when paho
    asks (``pack()``, which is all paho does with PUBLISH properties: its own ``Properties``
    class costs more than the rest of an export)."""

    __slots__ = ("fields",)

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields

    def pack(self) -> bytes:
        return encode_properties(self.fields, PUBLISH)

    def __repr__(self) -> str:
        return f"<properties {self.fields!r}>"


class _Wire(asyncio.Protocol):
    """The event loop's protocol over a plain TCP connection of the paho client.

    A ``send`` / ``recv`` made from Python releases the GIL; when another thread of the
    gateway (the store's writer, the delivery log's) is waiting for it, the loop thread then
    waits in turn until that thread lets go (measured on an export stream: 255 µs a send, 56
    of them in the system call). The loop's own transport (uvloop) reads and writes without
    letting go, so with plain TCP paho's I/O goes through it: what arrives is handed to
    paho's reader (:meth:`_Client.feed`, then the transport's read loop), what paho writes
    leaves with ``transport.write``. TLS sockets (paho's ``SSLSocket``) stay with the loop's
    reader callbacks.
    """

    def __init__(self, owner: MqttTransport, client: _Client) -> None:
        self.owner = owner
        self.client = client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.client.wire = transport  # type: ignore[assignment]  # (uvloop's is no subclass)

    def data_received(self, data: bytes) -> None:
        c = self.client
        if c.wire is None:  # paho closed the socket: the rest is for nobody
            return
        c.feed(data)
        if self.owner.client is c and not self.owner.reading_paused:
            self.owner._readable()

    def eof_received(self) -> bool | None:
        return None  # close: paho reads the end of the stream and reports the disconnect

    def connection_lost(self, exc: Exception | None) -> None:
        c = self.client
        if c.wire is None:
            return
        c.eof = True
        if self.owner.client is c:
            self.owner._readable()


def pattern_to_filter(pattern: str) -> str:
    """A core pattern as an MQTT topic filter (``*`` → ``+``, ``>`` → ``#``)."""
    return "/".join("+" if el == subject.STAR else "#" if el == subject.GT
                    else _element_to_level(el) for el in pattern.split("."))


class MqttTransport(Transport):
    type = "mqtt"
    keeps_inflight = True

    def __init__(self, manager: Any, tdef: Any) -> None:
        super().__init__(manager, tdef)
        p = self.params
        self.v5 = p["protocol_version"] == "5"
        self.qos = int(p["qos"])
        self.prefix = str(p.get("remote_prefix") or "")
        self.client: _Client | None = None
        self.write_soon = False  # a _writable call is scheduled
        self.write_waits = False  # the socket was full: the writer callback is registered
        self.sock: int | None = None  # the socket's file descriptor while connected
        self.polled = False  # the loop watches the socket (TLS); plain TCP goes through a _Wire
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

    def _make_client(self) -> _Client:
        p = self.params
        client_id = p.get("client_id") or f"gw-{self.broker.id}-{self.name}"[:64]
        clean = bool(p.get("clean_start"))
        c = _Client(
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
            c.tls = bool(url.tls)
            if url.tls:
                self.polled = True
                self.loop.add_reader(sock, self._readable)
            else:
                c.eof = False
                c.wire_loop = self.loop
                await self.loop.connect_accepted_socket(lambda: _Wire(self, c), sock=paho_sock)
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
        c.drained = False
        budget = READ_BATCH
        while budget > 0:
            if c is not self.client or self.sock is None or self.reading_paused:
                return  # (resume_reading comes back for what is buffered)
            if c.inpos < len(c.inbuf) and c.inbuf[c.inpos] in _FAST_FIRST:
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
        if c is not None:
            c.hold = True
        if self.sock is None or c is None:
            return
        if c.wire is not None:
            c.wire.pause_reading()
        elif self.polled:
            self.loop.remove_reader(self.sock)

    def resume_reading(self) -> None:
        c = self.client
        if c is not None:
            c.hold = False
        if self.sock is None or c is None:
            return
        if c.wire is not None:
            c.wire.resume_reading()
        elif self.polled:
            self.loop.add_reader(self.sock, self._readable)
        if c.has_input() or c.eof:
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
            user = fields.get("user_property")
            fields["user_property"] = (list(user) if user else []) + marks
        else:
            key = (topic, out.payload)
            self.recent[key] = self.recent.get(key, 0) + 1
            if len(self.recent) > RECENT_EXPORTS:
                self.recent.popitem(last=False)
        mid = c.publish_fields(topic, out.payload, self.qos, fields)
        if mid is None:
            info = c.publish(topic, out.payload, qos=self.qos,
                             properties=_Packed(fields) if fields else None)  # type: ignore[arg-type]
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
        """paho's callback, for what the fast path (:meth:`_Client._handle_publish`) leaves
        to paho: QoS 2, and PUBLISH packets paho itself must judge."""
        props: dict[str, Any] = {}
        pp = message.properties
        if pp is not None and self.v5:
            for codec_name, paho_name in _PAHO_NAMES.items():
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
        self.imported(msg, origin, hops, ack if qos else None)

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
