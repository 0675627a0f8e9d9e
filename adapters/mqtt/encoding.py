"""The MQTT encoders: packets to bytes, for either side. Sans-I/O and stateless.

How this works. :func:`encode_packet` turns any packet into its wire bytes for a protocol
level (3 = MQTT 3.1, 4 = 3.1.1, 5 = 5.0; a CONNECT carries its own): one private
``_encode_<type>`` per packet type, each checking the packet's own rules (packet id 1-65535,
reason codes the type allows, topic names) and raising :class:`MqttLocalProtocolError` when
they are broken. Who may send which packet, and when, is not checked here:
:meth:`~adapters.mqtt.codec.MqttCodec.send` does that and is the usual way in. MQTT 5 fields
that a lower level cannot carry are left out, and a CONNACK reason code is written as the
3.1.1 return code (:func:`~adapters.mqtt.packets.v3_connack_return_code`).

One PUBLISH, many subscribers. :func:`encode_publish` takes the PUBLISH fields directly
(no :class:`~adapters.mqtt.packets.Publish` is built), so the server encodes a message once
per (level, QoS, properties) variant and writes the same bytes to every subscriber that
gets that variant; :func:`publish_with_packet_id` stamps a subscriber's own packet id (and
DUP flag) into a copy of such bytes.

Hot path: no logging, no f-strings (except in error messages), precompiled ``struct.Struct``
objects and pre-encoded constants. :mod:`adapters.mqtt.codec` re-exports everything public
here, so ``from adapters.mqtt.codec import encode_publish`` keeps working.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

from adapters.mqtt.packets import (
    AUTH,
    CONNACK,
    CONNECT,
    MQTT_3_1,
    MQTT_5,
    PROTOCOL_NAMES,
    PUBLISH,
    PUBREL,
    REASON_CODES_ALLOWED,
    SUBSCRIBE,
    UNSUBACK,
    UNSUBSCRIBE,
    V3_SUBACK_FAILURE,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    MqttLocalProtocolError,
    Packet,
    PacketType,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    ReasonCode,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    v3_connack_return_code,
)
from adapters.mqtt.properties import (
    EMPTY_PROPERTIES,
    WILL,
    encode_binary,
    encode_properties,
    encode_utf8,
    encode_varint,
)

__all__ = [
    "DISCONNECT_BYTES", "PINGREQ_BYTES", "PINGRESP_BYTES", "encode_packet", "encode_publish",
    "publish_with_packet_id", "validate_topic_name",
]

PINGREQ_BYTES = b"\xc0\x00"
PINGRESP_BYTES = b"\xd0\x00"
DISCONNECT_BYTES = b"\xe0\x00"  # DISCONNECT of 3.1.1, and of MQTT 5 with reason 0x00

_U16 = struct.Struct(">H")
_ACK = struct.Struct(">BBH")  # first byte, remaining length 2, packet id
_ACK_RC = struct.Struct(">BBHB")  # ... remaining length 3, packet id, reason code
# Fixed-header flags other than PUBLISH's: 0b0010 for PUBREL, SUBSCRIBE and UNSUBSCRIBE
# ([MQTT-3.6.1-1], [MQTT-3.8.1-1], [MQTT-3.10.1-1]), zero elsewhere ([MQTT-2.1.3-1]).
_FLAGS = {int(t): (2 if t in (PUBREL, SUBSCRIBE, UNSUBSCRIBE) else 0) for t in PacketType}
_FIRST_BYTE = {int(t): (int(t) << 4) | _FLAGS[t] for t in PacketType}


# ---------------------------------------------------------------------------- topic name


def validate_topic_name(topic: str) -> bool:
    """Whether ``topic`` may be a PUBLISH Topic Name.

    At least one character ([MQTT-4.7.3-1]), no ``+`` or ``#`` ([MQTT-3.3.2-2],
    [MQTT-4.7.1-1]), no U+0000 ([MQTT-4.7.3-2]), at most 65,535 UTF-8 bytes ([MQTT-4.7.3-3]).
    """
    if not topic or "+" in topic or "#" in topic or "\x00" in topic:
        return False
    try:
        return len(topic.encode("utf-8")) <= 0xFFFF
    except UnicodeEncodeError:
        return False


# -------------------------------------------------------------------------- the encoders


def _frame(first: int, body: bytes) -> bytes:
    """Prefix ``body`` with a fixed header (MQTT 5.0 2.1.1)."""
    n = len(body)
    if n < 128:
        return bytes((first, n)) + body
    return bytes((first,)) + encode_varint(n) + body


def _check_packet_id(packet_id: int | None) -> int:
    if type(packet_id) is not int or not 0 < packet_id <= 0xFFFF:
        raise MqttLocalProtocolError(
            f"packet identifier {packet_id!r} is not in 1..65535 [MQTT-2.2.1-3]")
    return packet_id


def _check_reason(t: PacketType, reason_code: int) -> int:
    if reason_code not in REASON_CODES_ALLOWED[t]:
        raise MqttLocalProtocolError(f"reason code {reason_code!r} is not one of {t.name}'s")
    return int(reason_code)


def encode_publish(topic: str | bytes, payload: bytes, qos: int, retain: bool, dup: bool,
                   packet_id: int | None, properties: Mapping[str, Any] | None,
                   level: int) -> bytes:
    """Encode one PUBLISH (MQTT 5.0 3.3; 3.1.1 3.3) for protocol ``level``.

    The result can be written unchanged to every subscriber of the same level that gets
    the same QoS, flags and properties; for QoS > 0 give each its own packet id with
    :func:`publish_with_packet_id`. ``topic`` may be passed already encoded as UTF-8 bytes
    (trusted to be well-formed); ``properties`` are ignored below MQTT 5.

    Raises:
        MqttLocalProtocolError: QoS not 0-2; a packet id missing for QoS > 0 or present for
            QoS 0 ([MQTT-2.2.1-2]); DUP on QoS 0 ([MQTT-3.3.1-2]); a topic with wildcards or
            U+0000, or empty without a Topic Alias (TOPIC_NAME_INVALID, [MQTT-3.3.2-2]).
    """
    if isinstance(topic, str):  # (``in`` on a str is several times faster than on bytes)
        bad = "+" in topic or "#" in topic or "\x00" in topic
        try:
            tb = topic.encode()
        except UnicodeEncodeError:
            raise MqttLocalProtocolError("topic has a lone surrogate [MQTT-1.5.4-1]") from None
    else:
        tb = topic
        bad = b"+" in tb or b"#" in tb or b"\x00" in tb
    if bad or len(tb) > 0xFFFF:
        raise MqttLocalProtocolError(f"invalid topic name {topic!r} [MQTT-3.3.2-2]",
                                     ReasonCode.TOPIC_NAME_INVALID)
    if level >= MQTT_5:
        props = encode_properties(properties, PUBLISH) if properties else EMPTY_PROPERTIES
        if not tb and not (properties and "topic_alias" in properties):
            raise MqttLocalProtocolError("empty topic name without a topic alias",
                                         ReasonCode.TOPIC_NAME_INVALID)
    else:
        props = b""
        if not tb:
            raise MqttLocalProtocolError("empty topic name [MQTT-4.7.3-1]",
                                         ReasonCode.TOPIC_NAME_INVALID)
    first = 0x30 | (qos << 1) | (8 if dup else 0) | (1 if retain else 0)
    if qos == 0:
        if packet_id is not None or dup:
            raise MqttLocalProtocolError(
                "QoS 0 PUBLISH has neither packet id nor DUP [MQTT-2.2.1-2] [MQTT-3.3.1-2]")
        pid = b""
    elif qos == 1 or qos == 2:
        pid = _U16.pack(_check_packet_id(packet_id))
    else:
        raise MqttLocalProtocolError(f"QoS {qos!r} is not 0, 1 or 2 [MQTT-3.3.1-4]")
    rl = 2 + len(tb) + len(pid) + len(props) + len(payload)
    head = bytes((first, rl)) if rl < 128 else bytes((first,)) + encode_varint(rl)
    return b"".join((head, _U16.pack(len(tb)), tb, pid, props, payload))


def publish_with_packet_id(encoded: bytes, packet_id: int, *, dup: bool = False) -> bytes:
    """Return an encoded QoS 1/2 PUBLISH with its packet id (and DUP flag) replaced."""
    first = encoded[0]
    if first >> 4 != PUBLISH or not first & 0x06:
        raise MqttLocalProtocolError("not an encoded QoS 1 or 2 PUBLISH")
    i = 1
    while encoded[i] & 0x80:
        i += 1
    at = i + 3 + ((encoded[i + 1] << 8) | encoded[i + 2])
    out = bytearray(encoded)
    out[0] = (first | 0x08) if dup else (first & 0xF7)
    out[at:at + 2] = _U16.pack(_check_packet_id(packet_id))
    return bytes(out)


def _encode_connect(pk: Connect) -> bytes:
    level = pk.protocol_level
    if PROTOCOL_NAMES.get(level) != pk.protocol_name:
        raise MqttLocalProtocolError(
            f"protocol {pk.protocol_name!r} level {level!r} is not MQIsdp/3, MQTT/4 or MQTT/5",
            ReasonCode.UNSUPPORTED_PROTOCOL_VERSION)
    flags = 0x02 if pk.clean_start else 0
    will = pk.will
    if will is not None:
        if will.qos not in (0, 1, 2):
            raise MqttLocalProtocolError(f"will QoS {will.qos!r} is not 0, 1 or 2")
        if not validate_topic_name(will.topic):
            raise MqttLocalProtocolError(f"invalid will topic {will.topic!r}",
                                         ReasonCode.TOPIC_NAME_INVALID)
        flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
    if pk.username is not None:
        flags |= 0x80
    if pk.password is not None:
        flags |= 0x40
        if pk.username is None and level < MQTT_5:
            raise MqttLocalProtocolError("a password needs a user name [MQTT-3.1.2-22]")
    if type(pk.keepalive) is not int or not 0 <= pk.keepalive <= 0xFFFF:
        raise MqttLocalProtocolError(f"keepalive {pk.keepalive!r} is not in 0..65535")
    parts = [encode_utf8(pk.protocol_name), bytes((level, flags)), _U16.pack(pk.keepalive)]
    if level >= MQTT_5:
        if "authentication_data" in pk.properties and (
                "authentication_method" not in pk.properties):
            raise MqttLocalProtocolError("authentication_data without authentication_method")
        parts.append(encode_properties(pk.properties, CONNECT))
    parts.append(encode_utf8(pk.client_id))
    if will is not None:
        if level >= MQTT_5:
            parts.append(encode_properties(will.properties, WILL))
        parts.append(encode_utf8(will.topic))
        parts.append(encode_binary(will.payload))
    if pk.username is not None:
        parts.append(encode_utf8(pk.username))
    if pk.password is not None:
        parts.append(encode_binary(pk.password))
    return _frame(0x10, b"".join(parts))


def _encode_connack(pk: ConnAck, level: int) -> bytes:
    rc = pk.reason_code
    if pk.session_present and rc:
        raise MqttLocalProtocolError(
            "session present with a refusal [MQTT-3.2.2-6] (3.1.1 [MQTT-3.2.2-4])")
    flags = 1 if pk.session_present else 0
    if level < MQTT_5:  # 1-5 are taken as 3.1.1 return codes already (none is MQTT 5's)
        code = rc if 0 <= rc <= 5 else v3_connack_return_code(_check_reason(CONNACK, rc))
        return bytes((0x20, 2, flags if level > MQTT_3_1 else 0, code))  # 3.1: byte unused
    rc = _check_reason(CONNACK, rc)
    return _frame(0x20, bytes((flags, rc)) + encode_properties(pk.properties, CONNACK))


def _encode_ack(pk: PubAck | PubRec | PubRel | PubComp, level: int) -> bytes:
    first = _FIRST_BYTE[pk.packet_type]
    pid = _check_packet_id(pk.packet_id)
    if level < MQTT_5:
        return _ACK.pack(first, 2, pid)
    rc = _check_reason(pk.packet_type, pk.reason_code)
    if pk.properties:
        return _frame(first, _U16.pack(pid) + bytes((rc,))
                      + encode_properties(pk.properties, pk.packet_type))
    if rc:
        return _ACK_RC.pack(first, 3, pid, rc)
    return _ACK.pack(first, 2, pid)


def _encode_subscribe(pk: Subscribe, level: int) -> bytes:
    parts = [_U16.pack(_check_packet_id(pk.packet_id))]
    if not pk.subscriptions:
        raise MqttLocalProtocolError("SUBSCRIBE needs a topic filter [MQTT-3.8.3-2]")
    if level >= MQTT_5:
        parts.append(encode_properties(pk.properties, SUBSCRIBE))
    for topic_filter, options in pk.subscriptions:
        qos, rh = options.qos, options.retain_handling
        if qos not in (0, 1, 2) or rh not in (0, 1, 2):
            raise MqttLocalProtocolError(f"bad subscription options {options!r}")
        parts.append(encode_utf8(topic_filter))
        if level >= MQTT_5:
            qos |= (4 if options.no_local else 0) | (8 if options.retain_as_published else 0)
            qos |= rh << 4
        parts.append(bytes((qos,)))
    return _frame(0x82, b"".join(parts))


def _encode_suback(pk: SubAck | UnsubAck, level: int) -> bytes:
    t = pk.packet_type
    first = _FIRST_BYTE[t]
    head = _U16.pack(_check_packet_id(pk.packet_id))
    if t == UNSUBACK and level < MQTT_5:
        return bytes((first, 2)) + head
    if not pk.reason_codes:
        raise MqttLocalProtocolError(f"{t.name} needs a reason code per topic filter")
    codes = bytes(_check_reason(t, rc) for rc in pk.reason_codes)
    if level < MQTT_5:
        codes = bytes(c if c < 0x80 else V3_SUBACK_FAILURE for c in codes)
        return _frame(first, head + codes)
    return _frame(first, head + encode_properties(pk.properties, t) + codes)


def _encode_unsubscribe(pk: Unsubscribe, level: int) -> bytes:
    parts = [_U16.pack(_check_packet_id(pk.packet_id))]
    if not pk.filters:
        raise MqttLocalProtocolError("UNSUBSCRIBE needs a topic filter [MQTT-3.10.3-2]")
    if level >= MQTT_5:
        parts.append(encode_properties(pk.properties, UNSUBSCRIBE))
    parts.extend(encode_utf8(f) for f in pk.filters)
    return _frame(0xA2, b"".join(parts))


def _encode_disconnect_or_auth(pk: Disconnect | Auth, level: int) -> bytes:
    t = pk.packet_type
    if level < MQTT_5:
        if t == AUTH:
            raise MqttLocalProtocolError("AUTH exists only in MQTT 5")
        return DISCONNECT_BYTES
    rc = _check_reason(t, pk.reason_code)
    first = _FIRST_BYTE[t]
    if pk.properties or (rc and t == AUTH):
        return _frame(first, bytes((rc,)) + encode_properties(pk.properties, t))
    return bytes((first, 1, rc)) if rc else bytes((first, 0))


def encode_packet(packet: Packet, level: int) -> bytes:
    """Encode any packet for protocol ``level`` (the CONNECT's own level for CONNECT).

    Checks the packet's own rules but not who may send it; :meth:`MqttCodec.send` does that.
    """
    if isinstance(packet, Publish):
        return encode_publish(packet.topic, packet.payload, packet.qos, packet.retain,
                              packet.dup, packet.packet_id, packet.properties, level)
    if isinstance(packet, (PubAck, PubRec, PubRel, PubComp)):
        return _encode_ack(packet, level)
    if isinstance(packet, (SubAck, UnsubAck)):
        return _encode_suback(packet, level)
    if isinstance(packet, Subscribe):
        return _encode_subscribe(packet, level)
    if isinstance(packet, Unsubscribe):
        return _encode_unsubscribe(packet, level)
    if isinstance(packet, PingReq):
        return PINGREQ_BYTES
    if isinstance(packet, PingResp):
        return PINGRESP_BYTES
    if isinstance(packet, (Disconnect, Auth)):
        return _encode_disconnect_or_auth(packet, level)
    if isinstance(packet, ConnAck):
        return _encode_connack(packet, level)
    if isinstance(packet, Connect):
        return _encode_connect(packet)
    raise MqttLocalProtocolError(f"not an MQTT packet: {packet!r}")
