"""MQTT 5 properties, table-driven, and the data representations they are built from.

How this works. :data:`PROPERTIES` is MQTT 5.0 2.2.2.2 (Table 2-4) as data: for each
property its identifier, snake_case name, data type, the packets it may appear in, where it
may repeat, and the range its value must lie in. Everything else is derived from that one
table, so a property is added or corrected in one place: the per-packet allowed sets, the
readers and the writers.

A property set is a plain ``dict`` keyed by name, in the order first seen. Single-valued
properties map to their value (``int``, ``str`` or ``bytes``); the two that may repeat map to
a ``list``: ``user_property`` to ``(name, value)`` string pairs, order kept as the spec asks
([MQTT-3.3.2-18]), and ``subscription_identifier`` to ints (repeatable only in PUBLISH,
[MQTT-3.3.4-4]; in SUBSCRIBE it is still a one-element list). Byte-valued flags such as
``retain_available`` stay ``0``/``1``, as on the wire.

Reading (:func:`read_properties`) raises :class:`MqttRemoteProtocolError`, writing
(:func:`encode_properties`) :class:`MqttLocalProtocolError`. The error kinds follow MQTT 5.0:
an identifier not valid for the packet, or a value running past the Property Length, is a
Malformed Packet (2.2.2.2); a single-valued property given twice, or a value outside its
range (e.g. Receive Maximum 0, Maximum QoS 2), is a Protocol Error (3.1.2.11.x, 3.2.2.3.x);
a Topic Alias of 0 is "Topic Alias invalid" (3.3.2.3.4, [MQTT-3.3.2-8]).

The data representations of MQTT 5.0 1.5 (Variable Byte Integer, UTF-8 Encoded String,
Binary Data) live here too, because properties are made of them; the codec reuses them.
They read from ``bytes`` between a position and an end and return ``(value, new_position)``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from adapters.mqtt.packets import (
    AUTH,
    CONNACK,
    CONNECT,
    DISCONNECT,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBACK,
    SUBSCRIBE,
    UNSUBACK,
    UNSUBSCRIBE,
    MqttLocalProtocolError,
    MqttRemoteProtocolError,
    PacketType,
    Properties,
    ReasonCode,
)

WILL = 0
"""The property context of a CONNECT's Will Properties (MQTT 5.0 3.1.3.2). They belong to no
packet type of their own, so 0, the reserved packet type value, stands for them."""

MAX_VARIABLE_BYTE_INTEGER = 268_435_455  # MQTT 5.0 1.5.5: four 7-bit groups
MAX_UINT16 = 0xFFFF
MAX_UINT32 = 0xFFFF_FFFF

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_MALFORMED = ReasonCode.MALFORMED_PACKET
_PROTOCOL_ERROR = ReasonCode.PROTOCOL_ERROR


class PropertyType(IntEnum):
    """The data types of MQTT 5.0 1.5 that properties use."""

    BYTE = 1
    TWO_BYTE_INTEGER = 2
    FOUR_BYTE_INTEGER = 3
    VARIABLE_BYTE_INTEGER = 4
    UTF8_STRING = 5
    BINARY_DATA = 6
    UTF8_STRING_PAIR = 7


_TYPE_MAX = {
    PropertyType.BYTE: 0xFF,
    PropertyType.TWO_BYTE_INTEGER: MAX_UINT16,
    PropertyType.FOUR_BYTE_INTEGER: MAX_UINT32,
    PropertyType.VARIABLE_BYTE_INTEGER: MAX_VARIABLE_BYTE_INTEGER,
}


def _no_wildcards(value: Any) -> bool:
    return "+" not in value and "#" not in value


@dataclass(frozen=True, slots=True)
class PropertySpec:
    """One row of MQTT 5.0 Table 2-4, plus the value rules of the property's own section."""

    identifier: int
    name: str
    type: PropertyType
    contexts: frozenset[int]
    repeatable_in: frozenset[int] = frozenset()
    low: int = 0
    high: int | None = None  # None: the largest value of the type
    out_of_range: ReasonCode = ReasonCode.PROTOCOL_ERROR
    check: Callable[[Any], bool] | None = None  # an extra rule for string values

    @property
    def multiple(self) -> bool:
        """Whether the dict holds a list (the property may repeat in some packet)."""
        return bool(self.repeatable_in)


_B, _U2, _U4, _VBI = (PropertyType.BYTE, PropertyType.TWO_BYTE_INTEGER,
                      PropertyType.FOUR_BYTE_INTEGER, PropertyType.VARIABLE_BYTE_INTEGER)
_STR, _BIN, _PAIR = PropertyType.UTF8_STRING, PropertyType.BINARY_DATA, PropertyType.UTF8_STRING_PAIR
_MSG = frozenset({PUBLISH, WILL})
_ACKS = frozenset({PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK})
_USER_CONTEXTS = frozenset({CONNECT, CONNACK, PUBLISH, WILL, SUBSCRIBE, UNSUBSCRIBE,
                            DISCONNECT, AUTH}) | _ACKS

PROPERTIES: tuple[PropertySpec, ...] = (
    # MQTT 5.0 2.2.2.2 Table 2-4; value rules from the section named on each line.
    PropertySpec(0x01, "payload_format_indicator", _B, _MSG, high=1),  # 3.3.2.3.2
    PropertySpec(0x02, "message_expiry_interval", _U4, _MSG),  # 3.3.2.3.3
    PropertySpec(0x03, "content_type", _STR, _MSG),  # 3.3.2.3.9
    PropertySpec(0x08, "response_topic", _STR, _MSG,
                 check=_no_wildcards),  # 3.3.2.3.5 [MQTT-3.3.2-14]
    PropertySpec(0x09, "correlation_data", _BIN, _MSG),  # 3.3.2.3.6
    PropertySpec(0x0B, "subscription_identifier", _VBI, frozenset({PUBLISH, SUBSCRIBE}),
                 repeatable_in=frozenset({PUBLISH}), low=1),  # 3.3.2.3.8, 3.8.2.1.2
    PropertySpec(0x11, "session_expiry_interval", _U4,
                 frozenset({CONNECT, CONNACK, DISCONNECT})),  # 3.1.2.11.2
    PropertySpec(0x12, "assigned_client_identifier", _STR, frozenset({CONNACK})),
    PropertySpec(0x13, "server_keep_alive", _U2, frozenset({CONNACK})),  # 3.2.2.3.14
    PropertySpec(0x15, "authentication_method", _STR, frozenset({CONNECT, CONNACK, AUTH})),
    PropertySpec(0x16, "authentication_data", _BIN, frozenset({CONNECT, CONNACK, AUTH})),
    PropertySpec(0x17, "request_problem_information", _B, frozenset({CONNECT}),
                 high=1),  # 3.1.2.11.7
    PropertySpec(0x18, "will_delay_interval", _U4, frozenset({WILL})),  # 3.1.3.2.2
    PropertySpec(0x19, "request_response_information", _B, frozenset({CONNECT}),
                 high=1),  # 3.1.2.11.6
    PropertySpec(0x1A, "response_information", _STR, frozenset({CONNACK})),
    PropertySpec(0x1C, "server_reference", _STR, frozenset({CONNACK, DISCONNECT})),
    PropertySpec(0x1F, "reason_string", _STR,
                 frozenset({CONNACK, DISCONNECT, AUTH}) | _ACKS),
    PropertySpec(0x21, "receive_maximum", _U2, frozenset({CONNECT, CONNACK}),
                 low=1),  # 3.1.2.11.3: "a Protocol Error ... for it to have the value 0"
    PropertySpec(0x22, "topic_alias_maximum", _U2, frozenset({CONNECT, CONNACK})),
    PropertySpec(0x23, "topic_alias", _U2, frozenset({PUBLISH}), low=1,
                 out_of_range=ReasonCode.TOPIC_ALIAS_INVALID),  # 3.3.2.3.4 [MQTT-3.3.2-8]
    PropertySpec(0x24, "maximum_qos", _B, frozenset({CONNACK}), high=1),  # 3.2.2.3.4
    PropertySpec(0x25, "retain_available", _B, frozenset({CONNACK}), high=1),  # 3.2.2.3.5
    PropertySpec(0x26, "user_property", _PAIR, _USER_CONTEXTS,
                 repeatable_in=_USER_CONTEXTS),  # 3.1.2.11.8 and every packet's own
    PropertySpec(0x27, "maximum_packet_size", _U4, frozenset({CONNECT, CONNACK}),
                 low=1),  # 3.1.2.11.4: "a Protocol Error ... for the value to be set to zero"
    PropertySpec(0x28, "wildcard_subscription_available", _B, frozenset({CONNACK}), high=1),
    PropertySpec(0x29, "subscription_identifier_available", _B, frozenset({CONNACK}), high=1),
    PropertySpec(0x2A, "shared_subscription_available", _B, frozenset({CONNACK}), high=1),
)

BY_ID: dict[int, PropertySpec] = {spec.identifier: spec for spec in PROPERTIES}
BY_NAME: dict[str, PropertySpec] = {spec.name: spec for spec in PROPERTIES}
ALLOWED: dict[int, frozenset[int]] = {
    context: frozenset(s.identifier for s in PROPERTIES if context in s.contexts)
    for context in (WILL, CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP,
                    SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, DISCONNECT, AUTH)
}
"""Packet type (or :data:`WILL`) -> identifiers allowed there."""

_Row = tuple[str, PropertyType, int, int, ReasonCode, "Callable[[Any], bool] | None",
             frozenset[int]]
_ROWS: dict[int, _Row] = {
    # The table flattened for the reader: one tuple unpack instead of seven attribute loads.
    s.identifier: (s.name, s.type, s.low, _TYPE_MAX.get(s.type, 0) if s.high is None else s.high,
                   s.out_of_range, s.check, s.repeatable_in)
    for s in PROPERTIES
}
_SIZE = {_B: 1, _U2: 2, _U4: 4}
_FIXED = {_U2: _U16, _U4: _U32}

EMPTY_PROPERTIES = b"\x00"
"""An empty property set: a Property Length of zero ([MQTT-2.2.2-1])."""


def _context_name(context: int) -> str:
    return "Will Properties" if context == WILL else PacketType(context).name


# ---------------------------------------------------------------- data representations


def read_varint(data: bytes, p: int, end: int) -> tuple[int, int]:
    """Read a Variable Byte Integer (MQTT 5.0 1.5.5).

    Raises a Malformed Packet error if it runs past ``end``, is longer than four bytes, or
    is not in its shortest form ([MQTT-1.5.5-1]).
    """
    if p < end and data[p] < 0x80:
        return data[p], p + 1
    value = 0
    shift = 0
    for i in range(4):
        if p + i >= end:
            raise MqttRemoteProtocolError("variable byte integer runs past the end", _MALFORMED)
        b = data[p + i]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            if b == 0 and i:
                raise MqttRemoteProtocolError(
                    "variable byte integer not in its shortest form [MQTT-1.5.5-1]", _MALFORMED)
            return value, p + i + 1
        shift += 7
    raise MqttRemoteProtocolError("variable byte integer longer than four bytes", _MALFORMED)


def read_utf8(data: bytes, p: int, end: int) -> tuple[str, int]:
    """Read a UTF-8 Encoded String (MQTT 5.0 1.5.4; 3.1.1 1.5.3).

    It must be well-formed UTF-8 -- no surrogates U+D800..U+DFFF, no overlong forms
    ([MQTT-1.5.4-1]; Python's strict decoder rejects both) -- and must not contain U+0000
    ([MQTT-1.5.4-2]). U+FEFF is kept, never stripped ([MQTT-1.5.4-3]).
    """
    q = p + 2 + ((data[p] << 8) | data[p + 1]) if p + 2 <= end else end + 1
    if q > end:
        raise MqttRemoteProtocolError("string runs past the end", _MALFORMED)
    try:
        s = data[p + 2:q].decode()  # strict UTF-8
    except UnicodeDecodeError:
        raise MqttRemoteProtocolError(
            "string is not well-formed UTF-8 [MQTT-1.5.4-1]", _MALFORMED) from None
    if "\x00" in s:
        raise MqttRemoteProtocolError("string contains U+0000 [MQTT-1.5.4-2]", _MALFORMED)
    return s, q


def read_binary(data: bytes, p: int, end: int) -> tuple[bytes, int]:
    """Read Binary Data: a two-byte length and that many bytes (MQTT 5.0 1.5.6)."""
    q = p + 2 + ((data[p] << 8) | data[p + 1]) if p + 2 <= end else end + 1
    if q > end:
        raise MqttRemoteProtocolError("binary data runs past the end", _MALFORMED)
    return data[p + 2:q], q


_VARINT_1 = [bytes((i,)) for i in range(128)]


def encode_varint(n: int) -> bytes:
    """Write a Variable Byte Integer in its shortest form (MQTT 5.0 1.5.5)."""
    if n < 128:
        if n < 0:
            raise MqttLocalProtocolError(f"variable byte integer {n} is negative")
        return _VARINT_1[n]
    if n > MAX_VARIABLE_BYTE_INTEGER:
        raise MqttLocalProtocolError(
            f"{n} exceeds the variable byte integer maximum {MAX_VARIABLE_BYTE_INTEGER}",
            ReasonCode.PACKET_TOO_LARGE)
    out = bytearray()
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_utf8(s: str) -> bytes:
    """Write a UTF-8 Encoded String; refuses what :func:`read_utf8` would refuse."""
    try:
        b = s.encode("utf-8")
    except UnicodeEncodeError:
        raise MqttLocalProtocolError("string has a lone surrogate [MQTT-1.5.4-1]") from None
    except AttributeError:
        raise MqttLocalProtocolError(f"expected a str, got {type(s).__name__}") from None
    if len(b) > MAX_UINT16:
        raise MqttLocalProtocolError("string longer than 65,535 bytes (MQTT 5.0 1.5.4)")
    if "\x00" in s:
        raise MqttLocalProtocolError("string contains U+0000 [MQTT-1.5.4-2]")
    return _U16.pack(len(b)) + b


def encode_binary(b: object) -> bytes:
    """Write Binary Data (MQTT 5.0 1.5.6); what is not bytes-like is refused here (the
    argument is not typed ``bytes``, which compiled code would refuse with a TypeError)."""
    if not isinstance(b, (bytes, bytearray, memoryview)):
        raise MqttLocalProtocolError(f"expected bytes, got {type(b).__name__}")
    if len(b) > MAX_UINT16:
        raise MqttLocalProtocolError("binary data longer than 65,535 bytes (MQTT 5.0 1.5.6)")
    return _U16.pack(len(b)) + bytes(b)


# ------------------------------------------------------------------------------ reading


def read_properties(data: bytes, p: int, end: int, context: int) -> tuple[Properties, int]:
    """Read a Property Length and the properties after it (MQTT 5.0 2.2.2).

    Args:
        data: the packet bytes; ``p`` is where the Property Length starts.
        end: where the packet (or the part that may hold properties) ends.
        context: the packet type, or :data:`WILL`, deciding which properties are allowed.

    Returns:
        The properties as a dict, and the position after them.

    Raises:
        MqttRemoteProtocolError: MALFORMED_PACKET for an identifier not valid here or a
            value that runs past the Property Length; PROTOCOL_ERROR for a repeated
            single-valued property or a value out of range (TOPIC_ALIAS_INVALID for a
            Topic Alias of 0).
    """
    length, p = read_varint(data, p, end)
    stop = p + length
    if stop > end:
        raise MqttRemoteProtocolError("property length runs past the end of the packet",
                                      _MALFORMED)
    props: Properties = {}
    allowed = ALLOWED[context]
    while p < stop:
        ident = data[p]
        p += 1
        if ident not in allowed:
            spec = BY_ID.get(ident)
            what = f"property {spec.name}" if spec else f"unknown property identifier {ident}"
            raise MqttRemoteProtocolError(
                f"{what} is not allowed in {_context_name(context)} (MQTT 5.0 2.2.2.2)",
                _MALFORMED)
        name, kind, low, high, out_of_range, check, repeatable_in = _ROWS[ident]
        value: Any
        if kind is _STR:
            value, p = read_utf8(data, p, stop)
            if check is not None and not check(value):
                raise MqttRemoteProtocolError(f"{name} {value!r} is not allowed", _PROTOCOL_ERROR)
        elif kind is _PAIR:
            key, p = read_utf8(data, p, stop)
            val, p = read_utf8(data, p, stop)
            value = (key, val)
        elif kind is _BIN:
            value, p = read_binary(data, p, stop)
        else:
            if kind is _VBI:
                value, p = read_varint(data, p, stop)
            else:
                size = _SIZE[kind]
                if p + size > stop:
                    raise MqttRemoteProtocolError(f"{name} runs past the property length",
                                                  _MALFORMED)
                value = data[p] if size == 1 else _FIXED[kind].unpack_from(data, p)[0]
                p += size
            if not low <= value <= high:
                raise MqttRemoteProtocolError(f"{name} value {value} is out of range",
                                              out_of_range)
        if name in props:
            if context not in repeatable_in:
                raise MqttRemoteProtocolError(
                    f"{name} included more than once in {_context_name(context)}",
                    _PROTOCOL_ERROR)
            props[name].append(value)
        elif repeatable_in:
            props[name] = [value]
        else:
            props[name] = value
    return props, stop


# ------------------------------------------------------------------------------ writing


def _encode_int(spec: PropertySpec, value: Any) -> bytes:
    if not isinstance(value, int) or isinstance(value, bool):
        raise MqttLocalProtocolError(f"{spec.name} must be an int, not {type(value).__name__}")
    high = _TYPE_MAX[spec.type] if spec.high is None else spec.high
    if not spec.low <= value <= high:
        raise MqttLocalProtocolError(f"{spec.name} value {value} is out of range",
                                     spec.out_of_range)
    t = spec.type
    if t is _VBI:
        return encode_varint(value)
    return value.to_bytes(1 if t is _B else 2 if t is _U2 else 4, "big")


def _encode_value(spec: PropertySpec, value: Any) -> bytes:
    t = spec.type
    if t is _STR:
        if not isinstance(value, str):
            raise MqttLocalProtocolError(f"{spec.name}: expected a str, got {type(value).__name__}")
        if spec.check is not None and not spec.check(value):
            raise MqttLocalProtocolError(f"{spec.name} {value!r} is not allowed")
        return encode_utf8(value)
    if t is _BIN:
        return encode_binary(value)
    if t is _PAIR:
        if (not isinstance(value, (tuple, list)) or len(value) != 2
                or not isinstance(value[0], str) or not isinstance(value[1], str)):
            raise MqttLocalProtocolError(f"{spec.name} items must be (name, value) pairs of str")
        return encode_utf8(value[0]) + encode_utf8(value[1])
    return _encode_int(spec, value)


def _ascii_pairs(items: list[Any] | tuple[Any, ...]) -> bytes | None:
    """User Properties (identifier 0x26, name, value) for pairs of ASCII strings, the usual
    kind, written as one Latin-1 string (an ASCII character and a length byte below 256 are
    one byte each in it) instead of two :func:`encode_utf8` calls a pair. None when any pair
    needs the general path: not a pair of strings, not ASCII, a NUL, over 65,535 bytes."""
    parts = []
    for item in items:
        if type(item) is not tuple or len(item) != 2:
            return None
        k, v = item
        if (type(k) is not str or type(v) is not str or not k.isascii() or not v.isascii()
                or "\x00" in k or "\x00" in v):
            return None
        nk = len(k)
        nv = len(v)
        if nk > MAX_UINT16 or nv > MAX_UINT16:
            return None
        parts.append(f"\x26{chr(nk >> 8)}{chr(nk & 0xFF)}{k}{chr(nv >> 8)}{chr(nv & 0xFF)}{v}")
    return "".join(parts).encode("latin-1")


def encode_properties(props: Mapping[str, Any] | None, context: int) -> bytes:
    """Write a Property Length and the properties (MQTT 5.0 2.2.2), in the dict's order.

    List-valued properties are written one entry after another, in list order.

    Raises:
        MqttLocalProtocolError: an unknown name, a property not allowed in ``context``, a
            list where the property may not repeat, or a value of the wrong type or range.
    """
    if not props:
        return EMPTY_PROPERTIES
    allowed = ALLOWED[context]
    parts: list[bytes] = []
    for name, value in props.items():
        spec = BY_NAME.get(name)
        if spec is None:
            raise MqttLocalProtocolError(f"unknown MQTT 5 property {name!r}")
        if spec.identifier not in allowed:
            raise MqttLocalProtocolError(
                f"property {name} is not allowed in {_context_name(context)}")
        ident = _VARINT_1[spec.identifier]
        if spec.repeatable_in:
            if not isinstance(value, (list, tuple)):
                raise MqttLocalProtocolError(f"{name} must be a list")
            if len(value) > 1 and context not in spec.repeatable_in:
                raise MqttLocalProtocolError(
                    f"{name} may appear only once in {_context_name(context)}")
            block = _ascii_pairs(value) if spec.type is _PAIR else None
            if block is not None:
                parts.append(block)
                continue
            for item in value:
                parts.append(ident)
                parts.append(_encode_value(spec, item))
        else:
            parts.append(ident)
            parts.append(_encode_value(spec, value))
    body = b"".join(parts)
    return encode_varint(len(body)) + body
