"""A compact, versioned binary encoding of a core :class:`~gateway.message.Message`.

How this works. The store (TIBCO EMS User's Guide, "How EMS Manages Persistent Messages":
persistent messages are written on receipt and must come back unchanged after a restart) and
any other module that keeps typed values on disk use this codec. It keeps everything the
message model holds: the JMS headers (EMS User's Guide, "JMS Message Header Fields"), the
gateway tags (``trace_id``, ``origin``, ``hops``, ``producer_conn``, ``expires_at``), typed
properties and the body, where map and stream bodies nest to any depth (EMS extension,
EMS User's Guide, "EMS Extensions to JMS Messages") and every value keeps its exact Python type
-- ``Int16(5)`` comes back as ``Int16(5)``, a plain ``int`` as a plain ``int`` (both are int64
on the wire, under different tags). Runtime-only attributes (``wire``, ``store_id``, ``refs``)
are not written; ``size`` is recomputed with :func:`~gateway.message.estimate_size` on decode.

A message is::

    version:u8  flags:u32  delivery_mode:u8  priority:u8  body_kind:u8
    [expiration:i64] [delivery_time:i64] [timestamp:i64] [expires_at:i64] [hops:u32]
    [destination:str] [reply_to:str] [message_id:str] [correlation_id:str|bytes] [type:str]
    [trace_id:str] [origin:str] [producer_conn:str]
    [property count:len, then (name:str, value)...]
    body:value

Bracketed fields are present only when their ``F_*`` flag bit is set (a zero time, zero hops
and absent strings cost nothing). ``str`` is a length then UTF-8 (lone surrogates pass
through, as Java strings may carry them); ``len`` is one byte below 255, else 255 and a u32.
A *value* is a one-byte tag and its payload (``T_*``); all integers are little-endian. A value
written alone (:func:`encode_value`) is the version byte and one value.

Decoding is strict: unknown version, tag or flag bits, a length past the end, bad UTF-8,
nesting deeper than :data:`~gateway.types.MAX_NESTING` or bytes left over all raise
:class:`~gateway.errors.MessageFormatError`, and nothing else escapes (the fuzz tests hold
us to it). So any truncation of a valid encoding is an error, never a shorter message.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Callable
from typing import Any

from gateway.errors import MessageFormatError
from gateway.message import QUEUE, TOPIC, BodyKind, DeliveryMode, Destination, Message
from gateway.message import estimate_size as _estimate_size
from gateway.types import (
    ARRAY_TYPES,
    MAX_NESTING,
    BoolArray,
    Char,
    Float32,
    Float64Array,
    Int8,
    Int16,
    Int32,
    Int64,
    TypedArray,
    UInt8,
    UInt16,
    UInt32,
    UInt64,
)

VERSION = 1

# -- value tags ------------------------------------------------------------------------------
T_NONE = 0x00
T_FALSE = 0x01
T_TRUE = 0x02
T_INT = 0x03  # a plain int: int64 on the wire, decoded as int
T_INT8 = 0x04
T_INT16 = 0x05
T_INT32 = 0x06
T_INT64 = 0x07
T_UINT8 = 0x08
T_UINT16 = 0x09
T_UINT32 = 0x0A
T_UINT64 = 0x0B
T_FLOAT32 = 0x0C
T_FLOAT64 = 0x0D
T_CHAR = 0x0E  # one UTF-16 code unit as u16
T_STR8 = 0x0F  # u8 length
T_STR32 = 0x10  # u32 length
T_BYTES8 = 0x11
T_BYTES32 = 0x12
T_MAP8 = 0x13  # u8 count, then (name, value) pairs
T_MAP32 = 0x14
T_LIST8 = 0x15  # u8 count, then values
T_LIST32 = 0x16
T_ARRAY = 0x20  # T_ARRAY + index in ARRAY_TYPES: u32 count, then packed elements

# -- message flag bits -------------------------------------------------------------------------
F_DEST = 1 << 0
F_DEST_QUEUE = 1 << 1
F_REPLY = 1 << 2
F_REPLY_QUEUE = 1 << 3
F_MESSAGE_ID = 1 << 4
F_CORR_STR = 1 << 5
F_CORR_BYTES = 1 << 6
F_TYPE = 1 << 7
F_TRACE = 1 << 8
F_ORIGIN = 1 << 9
F_PRODUCER = 1 << 10
F_REDELIVERED = 1 << 11
F_EXPIRATION = 1 << 12
F_DELIVERY_TIME = 1 << 13
F_TIMESTAMP = 1 << 14
F_EXPIRES_AT = 1 << 15
F_HOPS = 1 << 16
F_PROPS = 1 << 17
_F_KNOWN = (1 << 18) - 1

_HEAD = struct.Struct("<BIBBB")  # version, flags, delivery_mode, priority, body_kind
_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")
_TAG_U8 = struct.Struct("<BB")
_TAG_U32 = struct.Struct("<BI")
_LONG = 255  # a length byte of 255 means "a u32 length follows"

# Fixed-size scalars: type -> (struct packing tag and value, tag).
_SCALARS: list[tuple[type, int, str]] = [
    (int, T_INT, "q"),
    (Int8, T_INT8, "b"),
    (Int16, T_INT16, "h"),
    (Int32, T_INT32, "i"),
    (Int64, T_INT64, "q"),
    (UInt8, T_UINT8, "B"),
    (UInt16, T_UINT16, "H"),
    (UInt32, T_UINT32, "I"),
    (UInt64, T_UINT64, "Q"),
    (Float32, T_FLOAT32, "f"),
    (float, T_FLOAT64, "d"),
]
_ENC_FIXED: dict[type, tuple[Callable[..., bytes], int]] = {
    t: (struct.Struct("<B" + code).pack, tag) for t, tag, code in _SCALARS
}


def _maker(t: type) -> Callable[[Any], Any]:
    """A constructor that wraps an already range-checked number without checking it again."""
    if t is int or t is float:
        return t
    base: Any = float if issubclass(t, float) else int
    new = base.__new__
    return lambda v: new(t, v)


# Tag -> (unpack_from, size, constructor) for fixed-size scalars.
_DEC_FIXED: dict[int, tuple[Callable[..., tuple[Any, ...]], int, Callable[[Any], Any]]] = {}
for _t, _tag, _code in _SCALARS:
    _s = struct.Struct("<" + _code)
    _DEC_FIXED[_tag] = (_s.unpack_from, _s.size, _maker(_t))

# Typed arrays: element storage codes for array.array (standard sizes checked below).
_ARRAY_CODES: dict[type, str] = {
    Int8: "b", Int16: "h", Int32: "i", Int64: "q", UInt8: "B", UInt16: "H", UInt32: "I",
    UInt64: "Q", Float32: "f", float: "d", bool: "B",
}  # fmt: skip
_ARRAY_ENC: dict[type, tuple[int, str]] = {}
_ARRAY_DEC: dict[int, tuple[type[TypedArray], str, int, Callable[[Any], Any]]] = {}
for _i, _cls in enumerate(ARRAY_TYPES):
    _code = _ARRAY_CODES[_cls.ELEMENT]
    _size = array(_code).itemsize
    assert _size == struct.calcsize("<" + _code), f"array code {_code} has a non-standard size"
    _ARRAY_ENC[_cls] = (T_ARRAY + _i, _code)
    _ARRAY_DEC[T_ARRAY + _i] = (_cls, _code, _size, _maker(_cls.ELEMENT))
_SWAP = sys.byteorder == "big"

_DELIVERY_MODES = {int(m): m for m in DeliveryMode}
_BODY_KINDS = {int(k): k for k in BodyKind}


# -- encoding ----------------------------------------------------------------------------------


def _put_str(out: bytearray, s: str) -> None:
    b = s.encode("utf-8", "surrogatepass")
    n = len(b)
    if n < _LONG:
        out.append(n)
    else:
        out.append(_LONG)
        out += _U32.pack(n)
    out += b


def write_value(out: bytearray, v: Any, depth: int = 0) -> None:
    """Append the tagged encoding of ``v`` to ``out`` (for modules that embed typed values).

    ``depth`` is the nesting level of ``v`` (0 for a body). A ``bytearray`` is written as
    ``bytes`` and reads back as ``bytes``.

    Raises:
        MessageFormatError: ``v`` (or something inside it) has no encoding, an ``int`` does
            not fit int64, or maps/streams nest deeper than ``MAX_NESTING``.
    """
    t = type(v)
    if t is str:
        b = v.encode("utf-8", "surrogatepass")
        n = len(b)
        out += _TAG_U8.pack(T_STR8, n) if n < 256 else _TAG_U32.pack(T_STR32, n)
        out += b
        return
    fixed = _ENC_FIXED.get(t)
    if fixed is not None:
        out += fixed[0](fixed[1], v)
        return
    if t is bool:
        out.append(T_TRUE if v else T_FALSE)
    elif v is None:
        out.append(T_NONE)
    elif t is bytes or t is bytearray:
        n = len(v)
        out += _TAG_U8.pack(T_BYTES8, n) if n < 256 else _TAG_U32.pack(T_BYTES32, n)
        out += v
    elif t is Char:
        out.append(T_CHAR)
        out += ord(v).to_bytes(2, "little")
    elif t is dict:
        if depth > MAX_NESTING:
            raise MessageFormatError(f"values nest deeper than {MAX_NESTING} levels")
        n = len(v)
        out += _TAG_U8.pack(T_MAP8, n) if n < 256 else _TAG_U32.pack(T_MAP32, n)
        depth += 1
        for k, x in v.items():
            if type(k) is not str:
                raise MessageFormatError(f"map field names must be strings, not {type(k).__name__}")
            _put_str(out, k)
            write_value(out, x, depth)
    elif t is list:
        if depth > MAX_NESTING:
            raise MessageFormatError(f"values nest deeper than {MAX_NESTING} levels")
        n = len(v)
        out += _TAG_U8.pack(T_LIST8, n) if n < 256 else _TAG_U32.pack(T_LIST32, n)
        depth += 1
        for x in v:
            write_value(out, x, depth)
    else:
        spec = _ARRAY_ENC.get(t)
        if spec is None:
            raise MessageFormatError(f"cannot encode a value of type {t.__name__}")
        out += _TAG_U32.pack(spec[0], len(v))
        a = array(spec[1], v)
        if _SWAP:
            a.byteswap()
        out += a.tobytes()


def encode_value(v: Any) -> bytes:
    """One typed value, with the version byte in front (see :func:`decode_value`)."""
    out = bytearray((VERSION,))
    try:
        write_value(out, v)
    except (struct.error, OverflowError, ValueError, TypeError) as exc:
        raise MessageFormatError(f"cannot encode value: {exc}") from None
    return bytes(out)


def encode_message(msg: Message) -> bytes:
    """Everything durable about ``msg`` as bytes (layout in the module docstring).

    Raises:
        MessageFormatError: a header, property or body value has no encoding.
    """
    try:
        return _encode_message(msg)
    except (struct.error, OverflowError, ValueError, TypeError, AttributeError) as exc:
        raise MessageFormatError(f"cannot encode message: {exc}") from None


def _encode_message(msg: Message) -> bytes:
    flags = 0
    tail = bytearray()
    ints = bytearray()
    if msg.expiration:
        flags |= F_EXPIRATION
        ints += _I64.pack(msg.expiration)
    if msg.delivery_time:
        flags |= F_DELIVERY_TIME
        ints += _I64.pack(msg.delivery_time)
    if msg.timestamp:
        flags |= F_TIMESTAMP
        ints += _I64.pack(msg.timestamp)
    if msg.expires_at:
        flags |= F_EXPIRES_AT
        ints += _I64.pack(msg.expires_at)
    if msg.hops:
        flags |= F_HOPS
        ints += _U32.pack(msg.hops)
    d = msg.destination
    if d is not None:
        flags |= F_DEST_QUEUE | F_DEST if d.kind == QUEUE else F_DEST
        _put_str(tail, d.name)
    d = msg.reply_to
    if d is not None:
        flags |= F_REPLY_QUEUE | F_REPLY if d.kind == QUEUE else F_REPLY
        _put_str(tail, d.name)
    s: Any = msg.message_id
    if s is not None:
        flags |= F_MESSAGE_ID
        _put_str(tail, s)
    s = msg.correlation_id
    if s is not None:
        if type(s) is str:
            flags |= F_CORR_STR
            _put_str(tail, s)
        else:
            flags |= F_CORR_BYTES
            n = len(s)
            if n < _LONG:
                tail.append(n)
            else:
                tail.append(_LONG)
                tail += _U32.pack(n)
            tail += s
    s = msg.type
    if s is not None:
        flags |= F_TYPE
        _put_str(tail, s)
    s = msg.trace_id
    if s is not None:
        flags |= F_TRACE
        _put_str(tail, s)
    s = msg.origin
    if s is not None:
        flags |= F_ORIGIN
        _put_str(tail, s)
    s = msg.producer_conn
    if s is not None:
        flags |= F_PRODUCER
        _put_str(tail, s)
    if msg.redelivered:
        flags |= F_REDELIVERED
    props = msg.properties
    if props:
        flags |= F_PROPS
        n = len(props)
        if n < _LONG:
            tail.append(n)
        else:
            tail.append(_LONG)
            tail += _U32.pack(n)
        for k, v in props.items():
            if type(k) is not str:
                raise MessageFormatError(f"property names must be strings, not {type(k).__name__}")
            _put_str(tail, k)
            write_value(tail, v, 1)
    write_value(tail, msg.body)
    return b"".join(
        (_HEAD.pack(VERSION, flags, msg.delivery_mode, msg.priority, msg.body_kind), ints, tail)
    )


# -- decoding ----------------------------------------------------------------------------------


def _short() -> MessageFormatError:
    return MessageFormatError("encoded message is truncated")


def _get_len(data: bytes, pos: int) -> tuple[int, int]:
    n = data[pos]
    if n == _LONG:
        return _U32.unpack_from(data, pos + 1)[0], pos + 5
    return n, pos + 1


def _get_str(data: bytes, pos: int) -> tuple[str, int]:
    n = data[pos]
    pos += 1
    if n == _LONG:
        n = _U32.unpack_from(data, pos)[0]
        pos += 4
    end = pos + n
    if end > len(data):
        raise _short()
    return data[pos:end].decode("utf-8", "surrogatepass"), end


def read_value(data: bytes, pos: int, depth: int = 0) -> tuple[Any, int]:
    """Decode one tagged value at ``data[pos:]``; returns it and the position after it.

    May raise ``IndexError``, ``struct.error`` or ``ValueError`` on corrupt input; the public
    decoders turn those into :class:`MessageFormatError`.
    """
    tag = data[pos]
    pos += 1
    if tag == T_STR8 or tag == T_STR32:
        if tag == T_STR8:
            end = pos + 1 + data[pos]
            pos += 1
        else:
            end = pos + 4 + _U32.unpack_from(data, pos)[0]
            pos += 4
        if end > len(data):
            raise _short()
        return data[pos:end].decode("utf-8", "surrogatepass"), end
    fixed = _DEC_FIXED.get(tag)
    if fixed is not None:
        return fixed[2](fixed[0](data, pos)[0]), pos + fixed[1]
    if tag == T_TRUE:
        return True, pos
    if tag == T_FALSE:
        return False, pos
    if tag == T_NONE:
        return None, pos
    if tag == T_BYTES8 or tag == T_BYTES32:
        if tag == T_BYTES8:
            end = pos + 1 + data[pos]
            pos += 1
        else:
            end = pos + 4 + _U32.unpack_from(data, pos)[0]
            pos += 4
        if end > len(data):
            raise _short()
        return data[pos:end], end
    if tag == T_CHAR:
        if pos + 2 > len(data):
            raise _short()
        return str.__new__(Char, chr(data[pos] | data[pos + 1] << 8)), pos + 2
    if tag == T_MAP8 or tag == T_MAP32 or tag == T_LIST8 or tag == T_LIST32:
        if depth > MAX_NESTING:
            raise MessageFormatError(f"values nest deeper than {MAX_NESTING} levels")
        if tag == T_MAP8 or tag == T_LIST8:
            n = data[pos]
            pos += 1
        else:
            n = _U32.unpack_from(data, pos)[0]
            pos += 4
        if n > len(data) - pos:  # every entry takes at least one byte
            raise _short()
        depth += 1
        if tag == T_LIST8 or tag == T_LIST32:
            items = []
            for _ in range(n):
                x, pos = read_value(data, pos, depth)
                items.append(x)
            return items, pos
        fields = {}
        for _ in range(n):
            k, pos = _get_str(data, pos)
            fields[k], pos = read_value(data, pos, depth)
        return fields, pos
    spec = _ARRAY_DEC.get(tag)
    if spec is None:
        raise MessageFormatError(f"unknown value tag 0x{tag:02x}")
    cls, code, size, make = spec
    n = _U32.unpack_from(data, pos)[0]
    pos += 4
    end = pos + n * size
    if end > len(data):
        raise _short()
    raw = data[pos:end]
    if cls is BoolArray:
        if raw.translate(None, b"\x00\x01"):
            raise MessageFormatError("a boolean array element is neither 0 nor 1")
        return tuple.__new__(cls, [b == 1 for b in raw]), end
    a = array(code)
    a.frombytes(raw)
    if _SWAP:
        a.byteswap()
    if cls is Float64Array:
        return tuple.__new__(cls, a.tolist()), end
    return tuple.__new__(cls, map(make, a.tolist())), end


_DECODE_ERRORS = (IndexError, struct.error, ValueError, OverflowError, RecursionError)


def decode_value(data: bytes | bytearray | memoryview) -> Any:
    """The value :func:`encode_value` wrote.

    Raises:
        MessageFormatError: ``data`` is not exactly one encoded value of a known version.
    """
    b = bytes(data) if type(data) is not bytes else data
    try:
        if not b or b[0] != VERSION:
            raise MessageFormatError(f"unknown value encoding version {b[:1]!r}")
        v, pos = read_value(b, 1)
    except _DECODE_ERRORS as exc:
        raise MessageFormatError(f"corrupt encoded value: {exc}") from None
    if pos != len(b):
        raise MessageFormatError(f"{len(b) - pos} bytes left over after an encoded value")
    return v


def decode_message(data: bytes | bytearray | memoryview) -> Message:
    """The message :func:`encode_message` wrote (``size`` re-estimated, ``store_id`` 0).

    Raises:
        MessageFormatError: ``data`` is truncated, corrupt, or of an unknown version.
    """
    b = bytes(data) if type(data) is not bytes else data
    try:
        return _decode_message(b)
    except _DECODE_ERRORS as exc:
        raise MessageFormatError(f"corrupt encoded message: {exc}") from None


def _decode_message(data: bytes) -> Message:
    version, flags, mode, priority, kind = _HEAD.unpack_from(data, 0)
    if version != VERSION:
        raise MessageFormatError(f"unknown message encoding version {version}")
    if flags & ~_F_KNOWN:
        raise MessageFormatError(f"unknown message flags 0x{flags:08x}")
    m = Message.__new__(Message)
    m.log_head = None
    delivery_mode = _DELIVERY_MODES.get(mode)
    if delivery_mode is None:
        raise MessageFormatError(f"unknown delivery mode {mode}")
    m.delivery_mode = delivery_mode
    body_kind = _BODY_KINDS.get(kind)
    if body_kind is None:
        raise MessageFormatError(f"unknown body kind {kind}")
    m.body_kind = body_kind
    m.priority = priority
    pos = _HEAD.size
    unpack_i64 = _I64.unpack_from
    if flags & F_EXPIRATION:
        m.expiration = unpack_i64(data, pos)[0]
        pos += 8
    else:
        m.expiration = 0
    if flags & F_DELIVERY_TIME:
        m.delivery_time = unpack_i64(data, pos)[0]
        pos += 8
    else:
        m.delivery_time = 0
    if flags & F_TIMESTAMP:
        m.timestamp = unpack_i64(data, pos)[0]
        pos += 8
    else:
        m.timestamp = 0
    if flags & F_EXPIRES_AT:
        m.expires_at = unpack_i64(data, pos)[0]
        pos += 8
    else:
        m.expires_at = 0
    if flags & F_HOPS:
        m.hops = _U32.unpack_from(data, pos)[0]
        pos += 4
    else:
        m.hops = 0
    get_str = _get_str
    if flags & F_DEST:
        name, pos = get_str(data, pos)
        m.destination = Destination(QUEUE if flags & F_DEST_QUEUE else TOPIC, name)
    elif flags & F_DEST_QUEUE:
        raise MessageFormatError("queue flag set on an absent destination")
    else:
        m.destination = None
    if flags & F_REPLY:
        name, pos = get_str(data, pos)
        m.reply_to = Destination(QUEUE if flags & F_REPLY_QUEUE else TOPIC, name)
    elif flags & F_REPLY_QUEUE:
        raise MessageFormatError("queue flag set on an absent reply-to")
    else:
        m.reply_to = None
    m.message_id, pos = get_str(data, pos) if flags & F_MESSAGE_ID else (None, pos)
    if flags & F_CORR_STR:
        if flags & F_CORR_BYTES:
            raise MessageFormatError("correlation id flagged both text and bytes")
        m.correlation_id, pos = get_str(data, pos)
    elif flags & F_CORR_BYTES:
        n, pos = _get_len(data, pos)
        end = pos + n
        if end > len(data):
            raise _short()
        m.correlation_id = data[pos:end]
        pos = end
    else:
        m.correlation_id = None
    m.type, pos = get_str(data, pos) if flags & F_TYPE else (None, pos)
    m.trace_id, pos = get_str(data, pos) if flags & F_TRACE else (None, pos)
    m.origin, pos = get_str(data, pos) if flags & F_ORIGIN else (None, pos)
    m.producer_conn, pos = get_str(data, pos) if flags & F_PRODUCER else (None, pos)
    m.redelivered = bool(flags & F_REDELIVERED)
    props: dict[str, Any] = {}
    if flags & F_PROPS:
        n, pos = _get_len(data, pos)
        if n > len(data) - pos:
            raise _short()
        for _ in range(n):
            k, pos = get_str(data, pos)
            props[k], pos = read_value(data, pos, 1)
    m.properties = props
    m.body, pos = read_value(data, pos)
    if pos != len(data):
        raise MessageFormatError(f"{len(data) - pos} bytes left over after an encoded message")
    m.wire = None
    m.store_id = 0
    m.refs = 0
    m.size = _estimate_size(m)
    return m
