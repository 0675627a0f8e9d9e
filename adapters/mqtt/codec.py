"""The MQTT codec: bytes in, packets out, bytes to send. Sans-I/O, one class for both sides.

Theory of operation. :class:`MqttCodec` owns a receive buffer (a ``bytearray``).
:meth:`~MqttCodec.receive_data` appends to it; :meth:`~MqttCodec.events_received` takes one
``bytes`` snapshot of it, parses *every* complete packet in it with a moving offset, and
compacts the buffer once at the end. A packet is complete when its
fixed header and all ``Remaining Length`` bytes are in; the size limit is checked as soon as
the Remaining Length is known, so an oversized packet is refused without being buffered.
While a packet is incomplete the codec remembers how many bytes it needs and does not look
at the buffer again until they are there, so a large packet arriving in many reads costs
O(size), not O(size^2). PUBLISH is parsed inline in the loop; every other type goes through
a per-type parser.

The protocol level (3 = MQTT 3.1 "MQIsdp", 4 = 3.1.1, 5 = 5.0) decides the wire format of
everything after CONNECT. A server codec learns it from the CONNECT it parses -- as soon as
the protocol name and level bytes are read, so a CONNACK can still answer a CONNECT that
fails further on -- and until then accepts nothing but CONNECT ([MQTT-3.1.0-1]). A client
codec takes it from the CONNECT it sends. MQTT 5 fields that a lower level cannot carry
(properties, acknowledgement reason codes, subscription options other than QoS) are parsed
as empty and left out when writing; a CONNACK reason code is translated to and from the
3.1.1 return code (:data:`~adapters.mqtt.packets.V3_CONNACK_RETURN_CODES`).

Errors. Only :class:`MqttRemoteProtocolError` (from :meth:`~MqttCodec.events_received`) and
:class:`MqttLocalProtocolError` (from ``send*``) leave the codec; anything else is a bug and
the fuzz tests say so. Both carry the MQTT 5 ``reason_code`` the shell answers with. Malformed
Packet versus Protocol Error follows MQTT 5.0 1.2: what cannot be parsed (bad flags, lengths,
UTF-8, trailing bytes) is MALFORMED_PACKET, what parses but is not allowed (packet id 0, a
repeated property, a packet in the wrong direction) is PROTOCOL_ERROR. The remote error also
carries, on ``events``, the good packets that preceded the bad one in the same batch. After
it the codec is failed: it ignores further input, but can still send (the CONNACK or
DISCONNECT that reports the error).

Not here, on purpose: topic filter semantics (a SUBSCRIBE is returned with its filters as
sent; :func:`validate_topic_filter` lets the session answer 0x8F per filter in SUBACK),
topic alias mapping, receive maximum, keepalive timing and packet-id bookkeeping -- all state
that belongs to the connection and the session (``connection.py``, ``session.py``).

Hot path. No logging, no f-strings (except in error messages), and PUBLISH parsed inline.
Encoding lives in :mod:`adapters.mqtt.encoding` (:func:`encode_packet`, and
:func:`encode_publish` / :func:`publish_with_packet_id` for one PUBLISH encoding shared by
many subscribers); this module re-exports it, and ``send*`` uses it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import Enum

from adapters.mqtt.encoding import (
    _FLAGS,
    DISCONNECT_BYTES,
    PINGREQ_BYTES,
    PINGRESP_BYTES,
    _encode_connect,
    encode_packet,
    encode_publish,
    publish_with_packet_id,
    validate_topic_name,
)
from adapters.mqtt.packets import (
    AUTH,
    CONNACK,
    CONNECT,
    DISCONNECT,
    MQTT_3_1,
    MQTT_5,
    PINGREQ,
    PINGRESP,
    PROTOCOL_NAMES,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    REASON_CODE_BY_VALUE,
    REASON_CODES_ALLOWED,
    SUBACK,
    SUBSCRIBE,
    UNSUBACK,
    UNSUBSCRIBE,
    V3_SUBACK_FAILURE,
    V5_REASON_FOR_V3_CONNACK,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    MqttLocalProtocolError,
    MqttRemoteProtocolError,
    Packet,
    PacketType,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    ReasonCode,
    SubAck,
    Subscribe,
    SubscriptionOptions,
    UnsubAck,
    Unsubscribe,
    UnsupportedProtocolVersion,
    Will,
)
from adapters.mqtt.properties import (
    MAX_VARIABLE_BYTE_INTEGER,
    WILL,
    read_binary,
    read_properties,
    read_utf8,
)

__all__ = [
    "CLIENT", "DEFAULT_MAX_PACKET_SIZE", "DISCONNECT_BYTES", "MAX_PACKET_SIZE",
    "MAX_REMAINING_LENGTH", "PINGREQ_BYTES", "PINGRESP_BYTES", "SERVER", "MqttCodec",
    "MqttLocalProtocolError", "MqttRemoteProtocolError", "Side", "UnsupportedProtocolVersion",
    "encode_packet", "encode_publish", "publish_with_packet_id", "validate_topic_filter",
    "validate_topic_name",
]

MAX_REMAINING_LENGTH = MAX_VARIABLE_BYTE_INTEGER  # 268,435,455: MQTT 5.0 2.1.4, 3.1.1 2.2.3
MAX_PACKET_SIZE = MAX_REMAINING_LENGTH + 5  # plus the first byte and a 4-byte length
DEFAULT_MAX_PACKET_SIZE = 1024 * 1024
# The largest packet we accept by default: 1 MiB, EMQX's default ``max_packet_size``
# (mosquitto defaults to MQTT's own 256 MiB, AWS IoT Core caps payloads at 128 KiB). An IoT
# gateway buffers at most this per connection; raise it per listener if devices need more.


class Side(Enum):
    """Which end of the connection a codec plays."""

    CLIENT = "client"
    SERVER = "server"


CLIENT = Side.CLIENT
SERVER = Side.SERVER

_MALFORMED = ReasonCode.MALFORMED_PACKET
_PROTOCOL_ERROR = ReasonCode.PROTOCOL_ERROR

_FROM_CLIENT = frozenset({CONNECT, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBSCRIBE,
                          UNSUBSCRIBE, PINGREQ, DISCONNECT, AUTH})
_FROM_SERVER = frozenset({CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK,
                          PINGRESP, DISCONNECT, AUTH})
_ACK_CLASSES: dict[int, type[PubAck | PubRec | PubRel | PubComp]] = {
    PUBACK: PubAck, PUBREC: PubRec, PUBREL: PubRel, PUBCOMP: PubComp}
_V3_OPTIONS = [SubscriptionOptions(qos) for qos in range(3)]
_V3_SUBACK_CODES = frozenset({0, 1, 2, V3_SUBACK_FAILURE})  # 3.1.1 [MQTT-3.9.3-2]
_SHARE_PREFIX = "$share/"


def _malformed(message: str) -> MqttRemoteProtocolError:
    return MqttRemoteProtocolError(message, _MALFORMED)


def _protocol_error(message: str) -> MqttRemoteProtocolError:
    return MqttRemoteProtocolError(message, _PROTOCOL_ERROR)


def _bad_topic(topic: str) -> MqttRemoteProtocolError:
    if "\x00" in topic:
        return _malformed("topic contains U+0000 [MQTT-1.5.4-2]")
    return MqttRemoteProtocolError("wildcard in a PUBLISH topic [MQTT-3.3.2-2]",
                                   ReasonCode.TOPIC_NAME_INVALID)


# ---------------------------------------------------------------------------- topic filter


def validate_topic_filter(topic_filter: str, *, shared: bool = True) -> bool:
    """Whether ``topic_filter`` is a syntactically valid Topic Filter (MQTT 5.0 4.7, 4.8.2).

    ``#`` must be a whole level and the last one ([MQTT-4.7.1-1]); ``+`` must be a whole
    level ([MQTT-4.7.1-2]); at least one character, no U+0000, at most 65,535 bytes
    ([MQTT-4.7.3-1..3]). With ``shared`` (MQTT 5), ``$share/{ShareName}/{filter}`` needs a
    non-empty ShareName without ``/``, ``+`` or ``#`` and a filter after it
    ([MQTT-4.8.2-1], [MQTT-4.8.2-2]). The session answers a False with SUBACK 0x8F (MQTT 5)
    or 0x80 (3.1.1) for that filter alone.
    """
    if not validate_topic_name(topic_filter.replace("+", "a").replace("#", "a")):
        return False
    if shared and topic_filter.startswith(_SHARE_PREFIX):
        share_name, slash, topic_filter = topic_filter[len(_SHARE_PREFIX):].partition("/")
        if not share_name or not slash or not topic_filter:
            return False
        if "+" in share_name or "#" in share_name:
            return False
    if "+" not in topic_filter and "#" not in topic_filter:
        return True
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != last):
            return False
        if "+" in level and level != "+":
            return False
    return True


# ------------------------------------------------------------------------------ the codec


class MqttCodec:
    """One MQTT connection's codec, for either side.

    Args:
        side: :data:`SERVER` parses what clients send, :data:`CLIENT` what servers send.
        max_packet_size: the largest incoming packet, in bytes, fixed header included (the
            MQTT 5 Maximum Packet Size semantics, 3.1.2.11.4); larger ones are refused with
            PACKET_TOO_LARGE as soon as their fixed header is read.

    Attributes:
        protocol_level: 3, 4 or 5 once known (see module doc), else None. The shell may set
            it to answer a CONNECT that could not be parsed.
        peer_max_packet_size: the largest packet the peer takes (its MQTT 5 Maximum Packet
            Size, set from the parsed CONNECT or CONNACK), or None for no limit; sending a
            larger packet raises PACKET_TOO_LARGE ([MQTT-3.1.2-24], [MQTT-3.2.2-15]).
    """

    def __init__(self, side: Side, *, max_packet_size: int = DEFAULT_MAX_PACKET_SIZE) -> None:
        self.side = side
        self.max_packet_size = max_packet_size
        self.peer_max_packet_size: int | None = None
        self.protocol_level: int | None = None
        self._server = side is Side.SERVER
        self._receivable = _FROM_CLIENT if self._server else _FROM_SERVER
        self._sendable = _FROM_SERVER if self._server else _FROM_CLIENT
        self._buf = bytearray()
        self._need = 2  # bytes the buffer must hold before a packet can be complete
        self._out: list[bytes] = []
        self._eof = False
        self._failed = False

    # -- receiving --------------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Receive bytes from the network; then call :meth:`events_received`.

        Raises:
            MqttLocalProtocolError: after :meth:`receive_eof`.
        """
        if self._eof:
            raise MqttLocalProtocolError("data received after EOF")
        if not self._failed:
            self._buf += data

    def receive_eof(self) -> None:
        """The peer closed its side; a packet left incomplete is reported by the next
        :meth:`events_received` as MALFORMED_PACKET."""
        self._eof = True

    @property
    def failed(self) -> bool:
        """Whether a remote protocol error was raised; input is ignored from then on."""
        return self._failed

    def events_received(self) -> list[Packet]:
        """Parse and return every complete packet received so far, in order.

        Raises:
            MqttRemoteProtocolError: the peer broke the protocol; ``reason_code`` says how to
                answer, ``events`` holds the valid packets before the bad one. The codec is
                failed afterwards and returns no more packets.
        """
        buf = self._buf
        n = len(buf)
        if n < self._need or self._failed:
            if self._eof and n and not self._failed:
                self._fail(_malformed("connection closed inside a packet"), [])
            return []
        data = bytes(buf)
        events: list[Packet] = []
        append = events.append
        level = self.protocol_level
        pos = 0
        need = 2
        try:
            while True:
                avail = n - pos
                if avail < 2:
                    need = 2
                    break
                first = data[pos]
                rl = data[pos + 1]
                if rl < 0x80:
                    p = pos + 2
                    total = rl + 2
                else:
                    rl, p = self._long_remaining_length(data, pos, n)
                    if rl < 0:
                        need = p
                        break
                    total = p - pos + rl
                if total > self.max_packet_size:
                    raise MqttRemoteProtocolError(
                        f"packet of {total} bytes exceeds the limit of {self.max_packet_size}",
                        ReasonCode.PACKET_TOO_LARGE)
                if avail < total:
                    self._check_header(first)  # refuse early: do not wait for a bad packet
                    need = total
                    break
                end = pos + total
                if first >> 4 == 3 and level:
                    # PUBLISH, inline: the hot path (MQTT 5.0 3.3; 3.1.1 3.3).
                    qos = (first >> 1) & 3
                    if qos == 3 or (not qos and first & 8):
                        self._check_header(first)
                    q = p + 2 + ((data[p] << 8) | data[p + 1]) if end - p >= 2 else end + 1
                    if q > end:
                        raise _malformed("PUBLISH topic runs past the end")
                    try:
                        topic = data[p + 2:q].decode()
                    except UnicodeDecodeError:
                        raise _malformed("topic is not well-formed UTF-8 [MQTT-1.5.4-1]") from None
                    if "+" in topic or "#" in topic or "\x00" in topic:
                        raise _bad_topic(topic)
                    if qos:
                        if q + 2 > end:
                            raise _malformed("PUBLISH too short for its packet identifier")
                        packet_id: int | None = (data[q] << 8) | data[q + 1]
                        if not packet_id:
                            raise _protocol_error("PUBLISH with packet identifier 0 [MQTT-2.2.1-3]")
                        q += 2
                    else:
                        packet_id = None
                    if level == MQTT_5:
                        if q < end and data[q] == 0:
                            props: Properties = {}
                            q += 1
                        else:
                            props, q = self._publish_properties(data, q, end)
                        if not topic and "topic_alias" not in props:
                            raise _protocol_error("empty topic without a topic alias (3.3.2.1)")
                    elif topic:
                        props = {}
                    else:
                        raise _protocol_error("empty topic name [MQTT-4.7.3-1]")
                    append(Publish(topic, data[q:end], qos, (first & 1) == 1, (first & 8) == 8,
                                   packet_id, props))
                else:
                    append(self._parse_other(first, data, p, end))
                    level = self.protocol_level
                pos = end
        except MqttRemoteProtocolError as exc:
            self._fail(exc, events)
        del buf[:pos]
        self._need = need
        if self._eof and buf:
            self._fail(_malformed("connection closed inside a packet"), events)
        return events

    def _fail(self, exc: MqttRemoteProtocolError, events: list[Packet]) -> None:
        exc.events = events
        self._failed = True
        self._buf.clear()
        raise exc

    @staticmethod
    def _long_remaining_length(data: bytes, pos: int, n: int) -> tuple[int, int]:
        """Decode a Remaining Length of 2-4 bytes; ``(-1, bytes needed)`` if incomplete."""
        value = 0
        shift = 0
        for i in range(1, 5):
            if pos + i >= n:
                return -1, n - pos + 1
            b = data[pos + i]
            value |= (b & 0x7F) << shift
            if b < 0x80:
                if b == 0:
                    raise _malformed("remaining length not in its shortest form [MQTT-1.5.5-1]")
                return value, pos + i + 1
            shift += 7
        raise _malformed("remaining length longer than four bytes (MQTT 5.0 2.1.4)")

    def _publish_properties(self, data: bytes, p: int, end: int) -> tuple[Properties, int]:
        props, p = read_properties(data, p, end, PUBLISH)
        if self._server and "subscription_identifier" in props:
            raise _protocol_error("a client's PUBLISH has a subscription identifier "
                                  "[MQTT-3.3.4-6]")
        return props, p

    def _check_header(self, first: int) -> None:
        """Refuse a packet on its first byte alone: type, direction, state and flags.

        Runs once the Remaining Length is known, before the body has to arrive, and again
        (cheaply) when the packet is complete, so the error is the same however the bytes
        were split.
        """
        ptype = first >> 4
        level = self.protocol_level
        if ptype == 0 or (ptype == AUTH and level is not None and level < MQTT_5):
            raise _malformed(f"reserved packet type {ptype} (MQTT 5.0 2.1.2, 3.1.1 2.2.1)")
        if ptype not in self._receivable:
            raise _protocol_error(
                f"a {self.side.value} does not receive {PacketType(ptype).name}")
        if ptype == CONNECT:
            if level is not None:
                raise _protocol_error("second CONNECT [MQTT-3.1.0-2]")
            if first & 0x0F:
                raise _malformed("CONNECT with fixed-header flags set [MQTT-2.1.3-1]")
            return
        if level is None:
            raise _protocol_error(f"{PacketType(ptype).name} before CONNECT [MQTT-3.1.0-1]")
        if ptype == PUBLISH:
            if first & 0x06 == 0x06:
                raise _malformed("PUBLISH with QoS 3 [MQTT-3.3.1-4]")
            if first & 0x0E == 0x08:
                raise _malformed("QoS 0 PUBLISH with DUP set [MQTT-3.3.1-2]")
            return
        if level < MQTT_5 and ptype == DISCONNECT and not self._server:
            raise _protocol_error("a 3.1.1 server does not send DISCONNECT")
        flags = first & 0x0F
        if flags != _FLAGS[ptype] and not (level == MQTT_3_1 and flags == 0x0A and ptype in (
                PUBREL, SUBSCRIBE, UNSUBSCRIBE)):
            raise _malformed(f"{PacketType(ptype).name} with reserved flags {flags:#06b} "
                             "[MQTT-2.1.3-1] [MQTT-3.6.1-1] [MQTT-3.8.1-1] [MQTT-3.10.1-1]")

    def _parse_other(self, first: int, data: bytes, p: int, end: int) -> Packet:
        """Every packet but PUBLISH on a connection of known level."""
        self._check_header(first)
        ptype = first >> 4
        level = self.protocol_level
        if level is None:  # _check_header let it through, so it is the first CONNECT
            return self._parse_connect(data, p, end)
        # (PUBLISH never gets here once the level is known: the loop parses it inline.)
        if PUBACK <= ptype <= PUBCOMP:
            return self._parse_ack(ptype, data, p, end, level)
        if ptype == SUBSCRIBE:
            return self._parse_subscribe(data, p, end, level)
        if ptype == SUBACK or ptype == UNSUBACK:
            return self._parse_suback(ptype, data, p, end, level)
        if ptype == UNSUBSCRIBE:
            return self._parse_unsubscribe(data, p, end, level)
        if ptype == PINGREQ or ptype == PINGRESP:
            if p != end:
                raise _malformed(f"{PacketType(ptype).name} with a body")
            return PingReq() if ptype == PINGREQ else PingResp()
        if ptype == CONNACK:
            return self._parse_connack(data, p, end, level)
        return self._parse_disconnect_or_auth(ptype, data, p, end, level)

    def _parse_connect(self, data: bytes, p: int, end: int) -> Connect:
        """CONNECT (MQTT 5.0 3.1; 3.1.1 3.1; MQTT 3.1)."""
        name, p = read_utf8(data, p, end)
        if p >= end:
            raise _malformed("CONNECT ends before its protocol level")
        level = data[p]
        if PROTOCOL_NAMES.get(level) != name:
            raise UnsupportedProtocolVersion(name, level)
        self.protocol_level = level
        if p + 4 > end:
            raise _malformed("CONNECT ends inside its variable header")
        flags = data[p + 1]
        keepalive = (data[p + 2] << 8) | data[p + 3]
        p += 4
        if flags & 0x01:
            raise _malformed("CONNECT reserved flag set [MQTT-3.1.2-3]")
        will_flag, will_qos, will_retain = flags & 0x04, (flags >> 3) & 3, flags & 0x20
        if not will_flag and (will_qos or will_retain):
            raise _malformed("will QoS or retain without the will flag [MQTT-3.1.2-11] "
                             "[MQTT-3.1.2-13] (3.1.1 [MQTT-3.1.2-13] [MQTT-3.1.2-15])")
        if will_qos == 3:
            raise _malformed("will QoS 3 [MQTT-3.1.2-12] (3.1.1 [MQTT-3.1.2-14])")
        if flags & 0x40 and not flags & 0x80 and level < MQTT_5:
            raise _malformed("password flag without user name flag (3.1.1 [MQTT-3.1.2-22])")
        props: Properties = {}
        if level >= MQTT_5:
            props, p = read_properties(data, p, end, CONNECT)
            if "authentication_data" in props and "authentication_method" not in props:
                raise _protocol_error("authentication data without a method (3.1.2.11.10)")
        client_id, p = read_utf8(data, p, end)
        will = None
        if will_flag:
            will_props: Properties = {}
            if level >= MQTT_5:
                will_props, p = read_properties(data, p, end, WILL)
            will_topic, p = read_utf8(data, p, end)
            if not validate_topic_name(will_topic):
                raise MqttRemoteProtocolError(f"invalid will topic {will_topic!r}",
                                              ReasonCode.TOPIC_NAME_INVALID)
            will_payload, p = read_binary(data, p, end)
            will = Will(will_topic, will_payload, will_qos, will_retain != 0, will_props)
        username = password = None
        if flags & 0x80:
            username, p = read_utf8(data, p, end)
        if flags & 0x40:
            password, p = read_binary(data, p, end)
        if p != end:
            raise _malformed("trailing bytes after the CONNECT payload [MQTT-3.1.3-1]")
        if "maximum_packet_size" in props:
            self.peer_max_packet_size = props["maximum_packet_size"]
        return Connect(name, level, (flags & 0x02) == 2, keepalive, client_id, will, username,
                       password, props)

    def _parse_connack(self, data: bytes, p: int, end: int, level: int) -> ConnAck:
        """CONNACK (MQTT 5.0 3.2; 3.1.1 3.2)."""
        if end - p < 2:
            raise _malformed("CONNACK shorter than two bytes")
        ack_flags, code = data[p], data[p + 1]
        p += 2
        if ack_flags & 0xFE:
            raise _malformed("CONNACK reserved flags set [MQTT-3.2.2-1]")
        props: Properties = {}
        if level < MQTT_5 or p == end:
            # Below MQTT 5 -- or an older server answering an MQTT 5 CONNECT in its own
            # format, as MQTT 5.0 3.1.2.2 lets it: a two-byte CONNACK, return code 0-5.
            if p != end:
                raise _malformed("trailing bytes in CONNACK")
            reason = V5_REASON_FOR_V3_CONNACK.get(code)
            if reason is None:
                raise _protocol_error(f"reserved CONNACK return code {code} (3.1.1 3.2.2.3)")
        else:
            reason = self._reason(CONNACK, code)
            props, p = read_properties(data, p, end, CONNACK)
            if p != end:
                raise _malformed("trailing bytes in CONNACK")
            if "maximum_packet_size" in props:
                self.peer_max_packet_size = props["maximum_packet_size"]
        if ack_flags and reason:
            raise _protocol_error("session present with a refusal [MQTT-3.2.2-6] "
                                  "(3.1.1 [MQTT-3.2.2-4])")
        return ConnAck(ack_flags == 1, reason, props)

    @staticmethod
    def _reason(t: PacketType, code: int) -> ReasonCode:
        if code not in REASON_CODES_ALLOWED[t]:
            raise _protocol_error(f"reason code {code:#04x} is not one of {t.name}'s (2.4)")
        return REASON_CODE_BY_VALUE[code]

    @staticmethod
    def _packet_id(t: int, data: bytes, p: int, end: int) -> int:
        if end - p < 2:
            raise _malformed(f"{PacketType(t).name} too short for its packet identifier")
        packet_id = (data[p] << 8) | data[p + 1]
        if not packet_id:
            raise _protocol_error(f"{PacketType(t).name} with packet identifier 0 "
                                  "[MQTT-2.2.1-3] (3.1.1 [MQTT-2.3.1-1])")
        return packet_id

    def _parse_ack(self, t: int, data: bytes, p: int, end: int,
                   level: int) -> PubAck | PubRec | PubRel | PubComp:
        """PUBACK, PUBREC, PUBREL, PUBCOMP (MQTT 5.0 3.4-3.7; 3.1.1 3.4-3.7)."""
        packet_id = self._packet_id(t, data, p, end)
        p += 2
        cls = _ACK_CLASSES[t]
        if level < MQTT_5:
            if p != end:
                raise _malformed(f"{PacketType(t).name} with remaining length other than 2")
            return cls(packet_id, ReasonCode.SUCCESS, {})
        reason = ReasonCode.SUCCESS
        props: Properties = {}
        if p < end:  # "If the Remaining Length is 2, there is no Reason Code" (3.4.2.1)
            reason = self._reason(PacketType(t), data[p])
            if p + 1 < end:  # "less than 4 ... there is no Property Length" (3.4.2.2)
                props, p = read_properties(data, p + 1, end, t)
                if p != end:
                    raise _malformed(f"trailing bytes in {PacketType(t).name}")
        return cls(packet_id, reason, props)

    def _parse_subscribe(self, data: bytes, p: int, end: int, level: int) -> Subscribe:
        """SUBSCRIBE (MQTT 5.0 3.8; 3.1.1 3.8). Filters are returned unvalidated."""
        packet_id = self._packet_id(SUBSCRIBE, data, p, end)
        p += 2
        props: Properties = {}
        if level >= MQTT_5:
            props, p = read_properties(data, p, end, SUBSCRIBE)
        subscriptions: list[tuple[str, SubscriptionOptions]] = []
        while p < end:
            topic_filter, p = read_utf8(data, p, end)
            if p >= end:
                raise _malformed("topic filter without subscription options")
            o = data[p]
            p += 1
            qos = o & 3
            if level >= MQTT_5:
                if o & 0xC0:
                    raise _malformed("subscription options reserved bits set [MQTT-3.8.3-5]")
                if qos == 3:
                    raise _protocol_error("subscription Maximum QoS 3 (3.8.3.1)")
                retain_handling = (o >> 4) & 3
                if retain_handling == 3:
                    raise _protocol_error("Retain Handling 3 (3.8.3.1)")
                no_local = (o & 4) == 4
                if no_local and topic_filter.startswith(_SHARE_PREFIX):
                    raise _protocol_error("No Local on a shared subscription [MQTT-3.8.3-4]")
                options = SubscriptionOptions(qos, no_local, (o & 8) == 8, retain_handling)
            else:
                if o & 0xFC or qos == 3:
                    raise _malformed("requested QoS byte not 0, 1 or 2 "
                                     "(3.1.1 [MQTT-3-8.3-4])")
                options = _V3_OPTIONS[qos]
            subscriptions.append((topic_filter, options))
        if not subscriptions:
            raise _protocol_error("SUBSCRIBE without a topic filter [MQTT-3.8.3-2] "
                                  "(3.1.1 [MQTT-3.8.3-3])")
        return Subscribe(packet_id, subscriptions, props)

    def _parse_unsubscribe(self, data: bytes, p: int, end: int, level: int) -> Unsubscribe:
        """UNSUBSCRIBE (MQTT 5.0 3.10; 3.1.1 3.10)."""
        packet_id = self._packet_id(UNSUBSCRIBE, data, p, end)
        p += 2
        props: Properties = {}
        if level >= MQTT_5:
            props, p = read_properties(data, p, end, UNSUBSCRIBE)
        filters: list[str] = []
        while p < end:
            topic_filter, p = read_utf8(data, p, end)
            filters.append(topic_filter)
        if not filters:
            raise _protocol_error("UNSUBSCRIBE without a topic filter [MQTT-3.10.3-2]")
        return Unsubscribe(packet_id, filters, props)

    def _parse_suback(self, t: int, data: bytes, p: int, end: int,
                      level: int) -> SubAck | UnsubAck:
        """SUBACK and UNSUBACK (MQTT 5.0 3.9, 3.11; 3.1.1 3.9, 3.11)."""
        packet_id = self._packet_id(t, data, p, end)
        p += 2
        if t == UNSUBACK and level < MQTT_5:
            if p != end:
                raise _malformed("UNSUBACK with remaining length other than 2")
            return UnsubAck(packet_id, [], {})
        props: Properties = {}
        if level >= MQTT_5:
            props, p = read_properties(data, p, end, t)
            codes = [self._reason(PacketType(t), c) for c in data[p:end]]
        else:
            if any(c not in _V3_SUBACK_CODES for c in data[p:end]):
                raise _protocol_error("SUBACK return code not 0, 1, 2 or 0x80 "
                                      "(3.1.1 [MQTT-3.9.3-2])")
            codes = [REASON_CODE_BY_VALUE[c] for c in data[p:end]]
        if not codes:
            raise _protocol_error(f"{PacketType(t).name} without reason codes "
                                  "[MQTT-3.8.4-6] [MQTT-3.11.3-1]")
        if t == SUBACK:
            return SubAck(packet_id, list(codes), props)
        return UnsubAck(packet_id, list(codes), props)

    def _parse_disconnect_or_auth(self, t: int, data: bytes, p: int, end: int,
                                  level: int) -> Disconnect | Auth:
        """DISCONNECT and AUTH (MQTT 5.0 3.14, 3.15; 3.1.1 3.14)."""
        if level < MQTT_5:
            if p != end:
                raise _malformed("DISCONNECT with a body (3.1.1 3.14)")
            return Disconnect(ReasonCode.NORMAL_DISCONNECTION, {})
        reason = ReasonCode.SUCCESS
        props: Properties = {}
        if p < end:  # remaining length 0: reason 0x00, no properties (3.14.2.1, 3.15.2.1)
            reason = self._reason(PacketType(t), data[p])
            if p + 1 < end:  # "less than 2 ... a value of 0 is used" (3.14.2.2.1)
                props, p = read_properties(data, p + 1, end, t)
                if p != end:
                    raise _malformed(f"trailing bytes in {PacketType(t).name}")
        if t == AUTH:
            return Auth(reason, props)
        if not self._server and "session_expiry_interval" in props:
            raise _protocol_error("a server's DISCONNECT has a session expiry interval "
                                  "[MQTT-3.14.2-2]")
        return Disconnect(reason, props)

    # -- sending ----------------------------------------------------------------------------

    def send(self, packet: Packet) -> None:
        """Encode ``packet`` into the output buffer (collect it with :meth:`data_to_send`).

        A client's CONNECT sets :attr:`protocol_level`; nothing else may be sent before the
        level is known ([MQTT-3.1.0-1]).

        Raises:
            MqttLocalProtocolError: the packet breaks MQTT, is not this side's to send, or
                is larger than :attr:`peer_max_packet_size` (PACKET_TOO_LARGE).
        """
        t = packet.packet_type
        if t not in self._sendable:
            raise MqttLocalProtocolError(f"a {self.side.value} does not send {t.name}")
        level = self.protocol_level
        if isinstance(packet, Connect):
            if level is not None:
                raise MqttLocalProtocolError("CONNECT already sent [MQTT-3.1.0-2]")
            data = _encode_connect(packet)
            self._append(data)
            self.protocol_level = packet.protocol_level
            return
        if level is None:
            raise MqttLocalProtocolError(f"{t.name} before CONNECT [MQTT-3.1.0-1]")
        if t == DISCONNECT and self._server and level < MQTT_5:
            raise MqttLocalProtocolError("a 3.1.1 server does not send DISCONNECT; it closes")
        self._append(encode_packet(packet, level))

    def send_encoded(self, data: bytes) -> None:
        """Queue a packet encoded elsewhere (e.g. one :func:`encode_publish` result shared by
        many subscribers), checking only the peer's Maximum Packet Size."""
        self._append(data)

    def _append(self, data: bytes) -> None:
        limit = self.peer_max_packet_size
        if limit is not None and len(data) > limit:
            raise MqttLocalProtocolError(
                f"{len(data)}-byte packet exceeds the peer's Maximum Packet Size {limit} "
                "[MQTT-3.1.2-24] [MQTT-3.2.2-15]", ReasonCode.PACKET_TOO_LARGE)
        self._out.append(data)

    def data_to_send(self) -> bytes:
        """Return (and forget) everything queued for sending, as one write."""
        out = self._out
        if not out:
            return b""
        self._out = []
        return out[0] if len(out) == 1 else b"".join(out)

    @property
    def has_data(self) -> bool:
        """Whether :meth:`data_to_send` would return anything."""
        return bool(self._out)

    def send_connect(self, client_id: str = "", *, protocol_level: int = 4,
                     clean_start: bool = True, keepalive: int = 0, will: Will | None = None,
                     username: str | None = None, password: bytes | None = None,
                     properties: Properties | None = None) -> None:
        """Send CONNECT (client); the protocol name follows from the level."""
        self.send(Connect(PROTOCOL_NAMES.get(protocol_level, "MQTT"), protocol_level,
                          clean_start, keepalive, client_id, will, username, password,
                          properties or {}))

    def send_connack(self, session_present: bool = False, reason_code: int = ReasonCode.SUCCESS,
                     properties: Properties | None = None) -> None:
        """Send CONNACK (server)."""
        self.send(ConnAck(session_present, reason_code, properties or {}))

    def send_publish(self, topic: str, payload: bytes = b"", qos: int = 0, *,
                     retain: bool = False, dup: bool = False, packet_id: int | None = None,
                     properties: Properties | None = None) -> None:
        """Send PUBLISH (either side), without building a :class:`Publish` first."""
        level = self.protocol_level
        if level is None:
            raise MqttLocalProtocolError("PUBLISH before CONNECT [MQTT-3.1.0-1]")
        self._append(encode_publish(topic, payload, qos, retain, dup, packet_id, properties,
                                    level))

    def send_puback(self, packet_id: int, reason_code: int = ReasonCode.SUCCESS,
                    properties: Properties | None = None) -> None:
        """Send PUBACK (either side)."""
        self.send(PubAck(packet_id, reason_code, properties or {}))

    def send_pubrec(self, packet_id: int, reason_code: int = ReasonCode.SUCCESS,
                    properties: Properties | None = None) -> None:
        """Send PUBREC (either side)."""
        self.send(PubRec(packet_id, reason_code, properties or {}))

    def send_pubrel(self, packet_id: int, reason_code: int = ReasonCode.SUCCESS,
                    properties: Properties | None = None) -> None:
        """Send PUBREL (either side)."""
        self.send(PubRel(packet_id, reason_code, properties or {}))

    def send_pubcomp(self, packet_id: int, reason_code: int = ReasonCode.SUCCESS,
                     properties: Properties | None = None) -> None:
        """Send PUBCOMP (either side)."""
        self.send(PubComp(packet_id, reason_code, properties or {}))

    def send_subscribe(self, packet_id: int,
                       subscriptions: Iterable[tuple[str, SubscriptionOptions]],
                       properties: Properties | None = None) -> None:
        """Send SUBSCRIBE (client)."""
        self.send(Subscribe(packet_id, list(subscriptions), properties or {}))

    def send_suback(self, packet_id: int, reason_codes: Sequence[int],
                    properties: Properties | None = None) -> None:
        """Send SUBACK (server)."""
        self.send(SubAck(packet_id, list(reason_codes), properties or {}))

    def send_unsubscribe(self, packet_id: int, filters: Iterable[str],
                         properties: Properties | None = None) -> None:
        """Send UNSUBSCRIBE (client)."""
        self.send(Unsubscribe(packet_id, list(filters), properties or {}))

    def send_unsuback(self, packet_id: int, reason_codes: Sequence[int] = (),
                      properties: Properties | None = None) -> None:
        """Send UNSUBACK (server); ``reason_codes`` are needed on MQTT 5 only."""
        self.send(UnsubAck(packet_id, list(reason_codes), properties or {}))

    def send_pingreq(self) -> None:
        """Send PINGREQ (client)."""
        self.send(PingReq())

    def send_pingresp(self) -> None:
        """Send PINGRESP (server) [MQTT-3.12.4-1]."""
        self.send(PingResp())

    def send_disconnect(self, reason_code: int = ReasonCode.NORMAL_DISCONNECTION,
                        properties: Properties | None = None) -> None:
        """Send DISCONNECT (client; server too on MQTT 5)."""
        self.send(Disconnect(reason_code, properties or {}))

    def send_auth(self, reason_code: int = ReasonCode.SUCCESS,
                  properties: Properties | None = None) -> None:
        """Send AUTH (MQTT 5, either side)."""
        self.send(Auth(reason_code, properties or {}))
