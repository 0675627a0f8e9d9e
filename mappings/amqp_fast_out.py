"""The AMQP 1.0 fast path's encoding side: a core message → the bytes
``message_to_amqp(msg, ...).encode()`` gives, byte for byte, or ``None`` outside the subset.

The subset, the reasons for writing it by hand and the rules both sides keep ("exact or
nothing") are in :mod:`mappings.amqp_fast`, which holds the decoding side; this module writes
what proton-c writes: lists without their trailing nulls, list8 up to 255 bytes, map32
always, the shortest integer forms.
"""

from __future__ import annotations

import struct
from typing import Any
from uuid import UUID

from gateway.message import QUEUE, TOPIC, Destination, Message
from gateway.types import Char, Float32, Int8, Int16, Int32, UInt8, UInt16, UInt32, UInt64
from mappings.amqp import (  # the default mapping's own rules, where they are not per field
    DA_PREFIX,
    MA_PREFIX,
    UINT_MAX,
    _id_out,
    _utf8,
)
from mappings.amqp_fast import (  # the subset's shared names (mappings/amqp_fast.py)
    _BYTES,
    _DECLINE,
    _NONE,
    _OBJECT,
    _PERSISTENT,
    _RELIABLE,
    _TEXT,
    DATA_RECORD,
    SERIALIZED_OBJECT,
    VALUE_RECORD,
    _Decline,
)
from mappings.amqp_rows import (  # the names the default rows give (mappings/amqp_rows.py)
    CONTENT_ENCODING_PROPERTY,
    CONTENT_TYPE_PROPERTY,
    DELIVERY_TIME,
    GROUP_ID,
    GROUP_SEQ,
    GW_DELIVERY_MODE,
    JMS_DEST,
    JMS_REPLY_TO,
    MSG_TYPE,
    PRIORITY_PROPERTY,
    REPLY_TO_GROUP_ID_PROPERTY,
    SPECIAL_ORDER,
    TRACE_ID,
    TYPES_PROPERTY,
    USER_ID,
)
from mappings.amqp_values import _field_safe

__all__ = ["encode"]

_P8 = struct.Struct(">B").pack
_P32 = struct.Struct(">I").pack
_P64, _PI64 = struct.Struct(">Q").pack, struct.Struct(">q").pack
_PI8, _PI16, _PU16 = struct.Struct(">b").pack, struct.Struct(">h").pack, struct.Struct(">H").pack
_PI32 = struct.Struct(">i").pack
_PF32, _PF64 = struct.Struct(">f").pack, struct.Struct(">d").pack
_STR8 = tuple(bytes((0xA1, k)) for k in range(256))
_SYM8 = tuple(bytes((0xA3, k)) for k in range(256))
_BIN8 = tuple(bytes((0xA0, k)) for k in range(256))
_SMALL = range(-128, 128)
_BYTE_OUT = tuple(b"\x51" + _P8(k) for k in range(6))  # x-opt-jms-msg-type / -dest codes


def _str(b: bytes) -> bytes:
    """str8-utf8 or str32-utf8 of UTF-8 bytes (proton-c picks the short form up to 255)."""
    k = len(b)
    return _STR8[k] + b if k < 256 else b"\xb1" + _P32(k) + b


def _sym(b: bytes) -> bytes:
    k = len(b)
    return _SYM8[k] + b if k < 256 else b"\xb3" + _P32(k) + b


def _bin(b: bytes) -> bytes:
    k = len(b)
    return _BIN8[k] + b if k < 256 else b"\xb0" + _P32(k) + b


def _uint(v: int) -> bytes:
    return b"\x43" if not v else b"\x52" + _P8(v) if v < 256 else b"\x70" + _P32(v)


def _ulong(v: int) -> bytes:
    return b"\x44" if not v else b"\x53" + _P8(v) if v < 256 else b"\x80" + _P64(v)


def _long(v: int) -> bytes:
    return b"\x55" + _PI64(v)[7:] if v in _SMALL else b"\x81" + _PI64(v)


def _int(v: int) -> bytes:
    return b"\x54" + _PI32(v)[3:] if v in _SMALL else b"\x71" + _PI32(v)


def _timestamp(v: int) -> bytes:
    if type(v) is not int:
        raise _Decline
    return b"\x83" + _PI64(v)


# Core value types other than str, int, bool, None and float → their AMQP encodings
# (README "Value types"; Int64 and strings with lone surrogates are recorded: declined).
_VALUE_OUT: dict[type, Any] = {
    bytes: _bin, Int8: lambda v: b"\x51" + _PI8(v), Int16: lambda v: b"\x61" + _PI16(v),
    Int32: _int, UInt8: lambda v: b"\x50" + _P8(v), UInt16: lambda v: b"\x60" + _PU16(v),
    UInt32: _uint, UInt64: _ulong, Float32: lambda v: b"\x72" + _PF32(v),
    Char: lambda v: b"\x73" + _P32(ord(v)),
}  # fmt: skip


def _value(v: Any) -> bytes:
    """A property or annotation value's encoding, as ``_out_value`` + ``put_object`` make it."""
    t = type(v)
    if t is str:
        return _str(v.encode())  # a lone surrogate raises: recorded "string", declined
    if t is int:
        return _long(v)
    if t is bool:
        return b"\x41" if v else b"\x42"
    if v is None:
        return b"\x40"
    if t is float:
        return b"\x82" + _PF64(v)
    enc = _VALUE_OUT.get(t)
    if enc is None:
        raise _Decline
    return enc(v)  # type: ignore[no-any-return]


def _field(text: Any) -> bytes:
    """A string field proton passes as a C string (``_escape`` would escape U+0000)."""
    if type(text) is not str or "\x00" in text:
        raise _Decline
    return _str(text.encode())


_ADDRESS_CACHE: tuple[dict[str, bytes], dict[str, bytes]] = ({}, {})  # queue, topic
_ADDRESS_CACHE_MAX = 4096  # as mappings.amqp: distinct addresses in use are few


def _address(dest: Destination) -> bytes:
    """``format_address(dest)`` encoded as a string field."""
    kind = dest.kind
    if kind is not QUEUE and kind is not TOPIC:
        raise _Decline
    cache = _ADDRESS_CACHE[kind is TOPIC]
    name = dest.name
    enc = cache.get(name)
    if enc is None:
        enc = _field(("topic://" if kind is TOPIC else "queue://") + name)
        if len(cache) < _ADDRESS_CACHE_MAX:
            cache[name] = enc
    return enc


def _dest_code(dest: Destination) -> bytes:
    """``dest_type_code`` as the annotation's byte."""
    return _BYTE_OUT[
        (1 if dest.kind is TOPIC else 0) + (2 if dest.name.startswith("$TMP$.") else 0)
    ]


def _id(value: Any) -> bytes:
    """An id from ``_id_out``: string, ulong, uuid or binary."""
    t = type(value)
    if t is str:
        return _field(value)  # U+0000 or a lone surrogate: escaped and recorded
    if t is bytes:
        return _bin(value)
    if t is UUID:
        return b"\x98" + bytes(value.bytes)
    return _ulong(value)  # a proton ulong


def _section(code: bytes, fields: list[bytes]) -> bytes:
    """A described list (header, properties) as proton-c writes it: trailing nulls left out,
    list0 when empty, list8 while count and size fit a byte, else list32."""
    k = len(fields)
    while k and fields[k - 1] == b"\x40":
        k -= 1
    if not k:
        return code + b"\x45"
    content = b"".join(fields[:k])
    size = len(content) + 1
    if size <= 255:
        return code + bytes((0xC0, size, k)) + content
    return code + b"\xd0" + _P32(size + 3) + _P32(k) + content


def _map32(code: bytes, pairs: list[bytes]) -> bytes:
    """A described map: proton-c writes map32 whatever the size."""
    content = b"".join(pairs)
    return code + b"\xd1" + _P32(len(content) + 4) + _P32(2 * len(pairs)) + content


_HEADER_CODE, _ANNOTATIONS_CODE = b"\x00\x53\x70", b"\x00\x53\x72"
_PROPERTIES_CODE, _APPLICATION_CODE = b"\x00\x53\x73", b"\x00\x53\x74"
_DATA_CODE, _VALUE_CODE = b"\x00\x53\x75", b"\x00\x53\x77"
# The header of a first delivery at the default priority with no ttl, by durable.
_FIRST_HEADER = (
    _HEADER_CODE + b"\xc0\x05\x04\x40\x40\x40\x41",
    _HEADER_CODE + b"\xc0\x05\x04\x41\x40\x40\x41",
)
_KEYS = {
    k: _sym(k.encode())
    for k in (MSG_TYPE, JMS_DEST, JMS_REPLY_TO, DELIVERY_TIME, TRACE_ID, GW_DELIVERY_MODE)
}
_MSG_TYPE_PAIRS = tuple(_KEYS[MSG_TYPE] + b for b in _BYTE_OUT)
_RELIABLE_VALUE = _sym(b"RELIABLE")
_SPECIAL = frozenset(SPECIAL_ORDER)
_NULL = b"\x40"
_SPECIAL_RANK = {name: i for i, name in enumerate(SPECIAL_ORDER)}


def _rank(item: tuple[str, Any]) -> int:
    return _SPECIAL_RANK[item[0]]


def encode(msg: Message, *, delivery_count: int, now_ms: int) -> bytes | None:
    """``message_to_amqp(msg, ...).encode()`` byte for byte, or ``None``. Never raises."""
    try:
        return _encode(msg, delivery_count, now_ms)
    except _DECLINE:
        return None


def _encode(msg: Message, delivery_count: int, now_ms: int) -> bytes:
    app: list[bytes] = []
    carried: dict[str, bytes] | None = None
    special: list[tuple[str, Any]] | None = None
    form = None
    props = msg.properties
    if props:
        if TYPES_PROPERTY in props:
            form = props[TYPES_PROPERTY]
            if type(form) is not str or (form != DATA_RECORD and form != VALUE_RECORD):
                raise _Decline  # any other record (or value): the default mapping reads it
        for name, value in props.items():
            if type(name) is not str:
                raise _Decline
            if name in _SPECIAL:
                if special is None:
                    special = []
                special.append((name, value))
                continue
            if name.startswith("JMS_GW_AMQP_") and name.startswith((MA_PREFIX, DA_PREFIX)):
                key = name[15:]
                if key.isascii():
                    if name[12] == "D":
                        raise _Decline  # delivery annotations
                    if carried is None:
                        carried = {}
                    carried[key] = _value(value)
                    continue
            app.append(_str(name.encode()) + _value(value))
    # body → body section and x-opt-jms-msg-type.
    kind = msg.body_kind
    body = msg.body
    content_type = None
    if kind is _TEXT:
        if type(body) is not str:
            raise _Decline
        code = 5
        section = (
            _DATA_CODE + _bin(body.encode())
            if form == DATA_RECORD
            else _VALUE_CODE + _str(body.encode())
        )
    elif kind is _BYTES or kind is _OBJECT:
        if type(body) is not bytes:
            raise _Decline
        if kind is _BYTES:
            code = 3
            section = (_VALUE_CODE if form == VALUE_RECORD else _DATA_CODE) + _bin(body)
        else:
            code, content_type = 1, SERIALIZED_OBJECT
            section = _DATA_CODE + _bin(body)
    elif kind is _NONE:
        code, section = 0, b""
    else:
        raise _Decline  # map and stream bodies
    pairs = [_MSG_TYPE_PAIRS[code]]
    # header.
    mode = msg.delivery_mode
    durable = mode is _PERSISTENT
    if mode is _RELIABLE:
        pairs.append(_KEYS[GW_DELIVERY_MODE] + _RELIABLE_VALUE)
    priority = msg.priority
    if type(priority) is not int or not 0 <= priority <= 9:
        raise _Decline
    expires = msg.expires_at or msg.expiration
    ttl = 0
    if expires:
        left = expires - now_ms
        ttl = min(left, UINT_MAX) if left > 0 else 1
    # properties section and the annotations that go with it.
    fields = [_NULL] * 13
    if msg.message_id is not None:
        if type(msg.message_id) is not str:
            raise _Decline
        fields[0] = _id(_id_out(msg.message_id, True))
    dest = msg.destination
    if dest is not None:
        fields[2] = _address(dest)
        pairs.append(_KEYS[JMS_DEST] + _dest_code(dest))
    if msg.type is not None:
        fields[3] = _field(msg.type)
    reply_to = msg.reply_to
    if reply_to is not None:
        fields[4] = _address(reply_to)
        pairs.append(_KEYS[JMS_REPLY_TO] + _dest_code(reply_to))
    corr = msg.correlation_id
    if corr is not None:
        if type(corr) is bytes:
            fields[5] = _bin(corr)
        elif type(corr) is str:
            fields[5] = _id(_id_out(corr, False))
        else:
            raise _Decline
    if msg.expiration:
        fields[8] = _timestamp(msg.expiration)
    if msg.timestamp:
        fields[9] = _timestamp(msg.timestamp)
    if msg.delivery_time:
        if type(msg.delivery_time) is not int:
            raise _Decline
        pairs.append(_KEYS[DELIVERY_TIME] + _long(msg.delivery_time))
    if msg.trace_id is not None:
        pairs.append(_KEYS[TRACE_ID] + _field(msg.trace_id))
    group_id = False
    group_seq = 0
    if special is not None and len(special) > 1:  # in their rows' order, as the mapping
        special.sort(key=_rank)
    for name, value in special or ():
        t = type(value)
        if name == TYPES_PROPERTY:
            continue
        if name == USER_ID:
            if value and t is str:
                fields[1] = _bin(value.encode())  # a lone surrogate: recorded, declined
                continue
            if value and t is bytes and not _utf8(value):
                fields[1] = _bin(value)
                continue
        elif name == GROUP_SEQ:
            if t is Int32 and value:
                group_seq = value & 0xFFFFFFFF
                continue
        elif name == PRIORITY_PROPERTY:
            raise _Decline
        elif t is str and _field_safe(value):
            if name == CONTENT_TYPE_PROPERTY or name == CONTENT_ENCODING_PROPERTY:
                if value.isascii():
                    if name == CONTENT_TYPE_PROPERTY:
                        content_type = value
                    else:
                        fields[7] = _sym(value.encode())
                    continue
            elif name == GROUP_ID:
                fields[10] = _str(value.encode())
                group_id = True
                continue
            elif name == REPLY_TO_GROUP_ID_PROPERTY:
                fields[12] = _str(value.encode())
                continue
            elif reply_to is None:  # REPLY_TO_PROPERTY: a reply-to naming nothing
                fields[4] = _str(value.encode())
                continue
        app.append(_str(name.encode()) + _value(value))
    if content_type is not None:
        fields[6] = _sym(content_type.encode())
    if group_id or group_seq:  # proton-c writes the sequence whenever a group-id is set
        fields[11] = _uint(group_seq)
    if carried:  # last: a carried annotation replaces a computed one in its place
        for key, enc in carried.items():
            kb = _KEYS.get(key) or _sym(key.encode())
            for k, pair in enumerate(pairs):
                if pair.startswith(kb):  # the length byte makes the key match exact
                    pairs[k] = kb + enc
                    break
            else:
                pairs.append(kb + enc)
    if delivery_count <= 1 and ttl == 0 and priority == 4:
        header = _FIRST_HEADER[durable]
    else:  # a delivery-count past a uint cannot be packed: declined (proton raises)
        header = _section(
            _HEADER_CODE,
            [
                b"\x41" if durable else _NULL,
                _NULL if priority == 4 else b"\x50" + _P8(priority),
                _uint(ttl) if ttl else _NULL,
                _NULL if delivery_count > 1 else b"\x41",
                _uint(delivery_count - 1) if delivery_count > 1 else _NULL,
            ],
        )
    out = [header, _map32(_ANNOTATIONS_CODE, pairs), _section(_PROPERTIES_CODE, fields)]
    if app:
        out.append(_map32(_APPLICATION_CODE, app))
    out.append(section)
    return b"".join(out)
