"""The wire format of RV-style messages: an envelope, then typed fields (TLV), big-endian.

How this works. Rendezvous' own wire format is proprietary and undocumented (TIBCO Rendezvous
Concepts, Data, "Self-Describing Data" and "Message Structure" call it universal and
proprietary and never spell it out), and no
library implements a self-describing format of this kind for Python, so this one is written
by hand: it keeps every concept of the Rendezvous message (typed fields with optional names
and 16-bit ids, nesting, arrays, the supplementary information of Fundamentals,
"Supplementary Information for Messages") and reuses Rendezvous' public type numbers, but it is not
TIBCO's byte layout. ``README.md`` ("Messages and the wire format") documents every byte.

In short: ``VERSION FLAGS SLEN SUBJECT [REPLY] [ENCODING] [CM LABEL] [ORIGIN] [ROUTE] FIELD*``,
where each field is an 8-byte header ``TYPE:u8 NLEN:u8 FID:u16 SIZE:u32``, then ``NLEN`` bytes
of UTF-8 name, then ``SIZE`` bytes of data whose layout depends on the type. Numbers are
big-endian (network byte order, as Rendezvous requires of IPADDR32 and IPPORT16). A submessage
is the same field list, nested; the length of every container is known before its content is
read, so the decoder never scans for an end.

The decoder trusts nothing: every length is checked against what remains of its container,
every fixed-width type against its width, and anything that does not follow the format raises
:class:`FormatError` (a ``ValueError``) with a reason; no other exception leaves
:func:`decode` (the fuzz tests hold it to that). Nesting deeper than ``max_depth`` is refused
so that a small hostile message cannot exhaust Python's recursion limit (each level is one
Python call; 64 levels sit far below the interpreter's 1,000-frame limit even when the caller
is deep in its own stack, and far above what real messages nest). Strings that the envelope's
encoding cannot decode stay as raw ``bytes`` (the field keeps its STRING type) rather than
failing the message; field names and subjects are always UTF-8.

Speed: fixed-width fields are packed with precompiled ``struct.Struct`` s into one
``bytearray``; a container's size is patched in after its content is written. Decoding reads
the input ``bytes`` with offsets (``unpack_from``), slicing only the names and data it returns.
"""

from __future__ import annotations

import codecs
import math
import struct
import sys
from array import array
from ipaddress import IPv4Address
from typing import Any

# The largest encoded message (64 MB) and the error past it are the engine's too.
from transports.rv.events import MAX_MESSAGE, MessageTooLarge
from transports.rv.message import (
    ARRAY_TYPECODES,
    ARRAY_WIDTHS,
    BOOL,
    DATETIME,
    F32,
    F64,
    I8,
    I16,
    I32,
    I64,
    IPADDR32,
    IPPORT16,
    MAX_FIELD_NAME,
    MSG,
    MSGARRAY,
    STRING,
    STRINGARRAY,
    U8,
    U16,
    U32,
    U64,
    CmLabel,
    Field,
    FieldError,
    Message,
    Origin,
    Route,
    RvDateTime,
)

DEFAULT_MAX_DEPTH = 64
"""Most levels of messages (the top one included) decode and encode accept (module docstring)."""
VERSION = 1
"""The envelope's first byte; a decoder refuses any other."""

FLAG_REPLY = 0x01
FLAG_ENCODING = 0x02
FLAG_CM = 0x04
FLAG_ORIGIN = 0x08
FLAG_ROUTE = 0x10
_FLAGS_KNOWN = FLAG_REPLY | FLAG_ENCODING | FLAG_CM | FLAG_ORIGIN | FLAG_ROUTE

HEADER = struct.Struct(">BBHI")  # field: TYPE, NLEN, FID, SIZE
_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_CM = struct.Struct(">Qd")  # CM sequence number, time limit in seconds
_DT = struct.Struct(">q")  # DATETIME: seconds << 24 | microseconds
_IP = struct.Struct(">I")

FIXED: dict[int, struct.Struct] = {
    I8: struct.Struct(">b"), U8: struct.Struct(">B"),
    I16: struct.Struct(">h"), U16: struct.Struct(">H"),
    I32: struct.Struct(">i"), U32: struct.Struct(">I"),
    I64: struct.Struct(">q"), U64: struct.Struct(">Q"),
    F32: struct.Struct(">f"), F64: struct.Struct(">d"),
    IPPORT16: struct.Struct(">H"),
}
"""The fixed-width scalar types and their big-endian layouts."""
_FIXED_DEC: dict[int, tuple[int, Any]] = {t: (s.size, s.unpack_from) for t, s in FIXED.items()}
_CACHE_MAX = 4096  # entries in each of the name and subject caches below
_SWAP = sys.byteorder == "little"  # arrays are held in native order, sent big-endian


class FormatError(ValueError):
    """Bytes that are not an encoded message; the message says what is wrong and where."""


# -- encoding ---------------------------------------------------------------------------


def _short(what: str, s: str, lo: int = 1) -> bytes:
    try:
        b = s.encode()
    except (UnicodeEncodeError, AttributeError):
        raise FieldError(f"envelope: {what} must be a UTF-8 encodable str") from None
    if not lo <= len(b) <= 255 or b"\0" in b:
        raise FieldError(f"envelope: {what} must be {lo}..255 bytes without NUL")
    return b


_SUBJECT_BYTES: dict[str, bytes] = {}
"""Send subjects already checked, encoded: a program sends to few subjects, many times."""


def _name_and_hops(out: bytearray, what: str, name: str, hops_what: str, hops: int) -> None:
    """An envelope name (a byte of length, the UTF-8) and a hop count (one byte)."""
    nb = _short(what, name)
    if not (isinstance(hops, int) and 0 <= hops <= 255):
        raise FieldError(f"envelope: {hops_what} {hops!r} is not 0..255")
    out += _U8.pack(len(nb))
    out += nb
    out += _U8.pack(hops)


def encode(msg: Message, *, max_depth: int = DEFAULT_MAX_DEPTH) -> bytes:
    """The envelope and fields of ``msg`` as bytes (README, "Messages and the wire format").

    Raises:
        MessageTooLarge: the result would exceed :data:`MAX_MESSAGE`.
        FieldError: the envelope does not fit its fields (a subject over 255 bytes, a string
            the encoding cannot encode, nesting deeper than ``max_depth``).
    """
    out = bytearray(b"\x01\x00")
    flags = 0
    subject = msg.send_subject
    if subject is None:
        sb = b""
    else:
        sb = _SUBJECT_BYTES.get(subject, b"")
        if not sb:
            sb = _short("send subject", subject, 0)
            if len(_SUBJECT_BYTES) >= _CACHE_MAX:
                _SUBJECT_BYTES.clear()
            _SUBJECT_BYTES[subject] = sb
    out += _U8.pack(len(sb))
    out += sb
    if msg.reply_subject is not None:
        flags |= FLAG_REPLY
        rb = _short("reply subject", msg.reply_subject)
        out += _U8.pack(len(rb))
        out += rb
    enc = "utf-8"
    if msg.encoding is not None:
        eb = _short("encoding", msg.encoding)
        try:
            enc = codecs.lookup(msg.encoding).name
        except LookupError:
            raise FieldError(f"envelope: unknown string encoding {msg.encoding!r}") from None
        if enc != "utf-8":
            flags |= FLAG_ENCODING
            out += _U8.pack(len(eb))
            out += eb
    cm = msg.cm
    if cm is not None:
        flags |= FLAG_CM
        cb = _short("CM sender name", cm.sender)
        seq, limit = cm.sequence, cm.time_limit
        if not (isinstance(seq, int) and 0 <= seq < 1 << 64):
            raise FieldError(f"envelope: CM sequence {seq!r} is not a U64")
        if not (isinstance(limit, (int, float)) and math.isfinite(limit) and limit >= 0):
            raise FieldError(f"envelope: CM time limit {limit!r} is not a finite seconds >= 0")
        out += _U8.pack(len(cb))
        out += cb
        out += _CM.pack(seq, limit)
    origin = msg.origin
    if origin is not None:
        flags |= FLAG_ORIGIN
        _name_and_hops(out, "origin id", origin.origin_id, "hop count", origin.hops)
    route = msg.route
    if route is not None:
        flags |= FLAG_ROUTE
        _name_and_hops(out, "route network", route.network, "router hop count", route.hops)
    out[1] = flags
    _encode_fields(msg.fields, out, enc, max_depth - 1)
    if len(out) > MAX_MESSAGE:
        raise MessageTooLarge(len(out))  # the transport works out the packets lost
    return bytes(out)


def _encode_str(v: str | bytes, enc: str) -> bytes:
    if isinstance(v, bytes):
        return v
    try:
        b = v.encode(enc)
    except UnicodeEncodeError as e:
        raise FieldError(f"string {v[:20]!r} cannot be encoded in {enc}: {e.reason}") from None
    if enc != "utf-8" and b"\0" in b:
        raise FieldError(f"{enc} puts NUL bytes in strings; use an ASCII-compatible encoding")
    return b


def _encode_fields(fields: list[Field], out: bytearray, enc: str, depth: int) -> None:
    if depth < 0:
        raise FieldError("message nested deeper than the depth limit (or containing itself)")
    hdr = HEADER.pack
    fixed = FIXED
    for f in fields:
        t = f.type
        v = f.value
        nb = f.name_bytes
        s = fixed.get(t)
        if s is not None:
            out += hdr(t, len(nb), f.fid, s.size)
            out += nb
            out += s.pack(v)
        elif t == STRING:
            b = _encode_str(v, enc)
            out += hdr(t, len(nb), f.fid, len(b) + 1)
            out += nb
            out += b
            out += b"\0"
        elif t == BOOL:
            out += hdr(t, len(nb), f.fid, 1)
            out += nb
            out += b"\x01" if v else b"\x00"
        elif t == MSG or t == MSGARRAY or t == STRINGARRAY:
            start = len(out)
            out += hdr(t, len(nb), f.fid, 0)
            out += nb
            body = len(out)
            if t == MSG:
                _encode_fields(v.fields, out, enc, depth - 1)
            elif t == MSGARRAY:
                out += _U32.pack(len(v))
                for m in v:
                    at = len(out)
                    out += b"\0\0\0\0"
                    _encode_fields(m.fields, out, enc, depth - 1)
                    _U32.pack_into(out, at, len(out) - at - 4)
            else:
                out += _U32.pack(len(v))
                for x in v:
                    b = _encode_str(x, enc)
                    out += _U32.pack(len(b) + 1)
                    out += b
                    out += b"\0"
            _U32.pack_into(out, start + 4, len(out) - body)
        elif t == DATETIME:
            out += hdr(t, len(nb), f.fid, 8)
            out += nb
            out += _DT.pack(v[0] << 24 | v[1])
        elif t == IPADDR32:
            out += hdr(t, len(nb), f.fid, 4)
            out += nb
            out += v.packed
        elif t in ARRAY_TYPECODES:
            if _SWAP and ARRAY_WIDTHS[t] > 1:
                a = array(v.typecode, v)
                a.byteswap()
                b = a.tobytes()
            else:
                b = v.tobytes()
            out += hdr(t, len(nb), f.fid, len(b))
            out += nb
            out += b
        else:  # OPAQUE, XML, ENCRYPTED, unknown codes: the bytes as they are
            out += hdr(t, len(nb), f.fid, len(v))
            out += nb
            out += v


# -- decoding ---------------------------------------------------------------------------


def _envelope_string(data: bytes, off: int, what: str, lo: int = 1) -> tuple[str, int]:
    if off >= len(data):
        raise FormatError(f"envelope ends before its {what}")
    n = data[off]
    end = off + 1 + n
    if n < lo or end > len(data):
        raise FormatError(f"envelope: {what} of {n} bytes at offset {off} does not fit")
    try:
        s = data[off + 1:end].decode()
    except UnicodeDecodeError:
        raise FormatError(f"envelope: {what} is not UTF-8") from None
    if "\0" in s:
        raise FormatError(f"envelope: {what} contains NUL")
    return s, end


_NAMES: dict[bytes, str] = {}
"""Field names and send subjects seen, by their bytes: most messages repeat the same few, and a
dict hit is cheaper than decoding and checking them again."""



def _new_name(nb: bytes, off: int, what: str = "field name") -> str:
    """Check and decode a field name (or subject) not in :data:`_NAMES`, and remember it."""
    try:
        name = nb.decode()
    except UnicodeDecodeError:
        raise FormatError(f"{what} at offset {off} is not UTF-8") from None
    if 0 in nb:
        raise FormatError(f"{what} at offset {off} contains NUL")
    if len(_NAMES) >= _CACHE_MAX:
        _NAMES.clear()
    _NAMES[nb] = name
    return name


def peek_subject(data: bytes | bytearray | memoryview) -> str | None:
    """The send subject of an encoded message, without decoding its fields (so a receiver
    can skip the fields of a message no listener wants).

    Raises:
        FormatError: the envelope's start is malformed.
    """
    if len(data) < 3 or data[0] != VERSION:
        raise FormatError("not an encoded message (too short or wrong version)")
    n = data[2]
    if not n:
        return None
    if 3 + n > len(data):
        raise FormatError(f"envelope: send subject of {n} bytes does not fit")
    sb = bytes(data[3:3 + n])
    subject = _NAMES.get(sb)
    return subject if subject is not None else _new_name(sb, 3, "send subject")


def decode(data: bytes | bytearray | memoryview, *,
           max_depth: int = DEFAULT_MAX_DEPTH) -> Message:
    """The message encoded in ``data`` (README, "Messages and the wire format").

    Raises:
        FormatError: anything that does not follow the format, with the reason.
    """
    if not isinstance(data, bytes):
        data = bytes(data)
    n = len(data)
    if n > MAX_MESSAGE:
        raise FormatError(f"message of {n} bytes exceeds {MAX_MESSAGE}")
    if n < 3:
        raise FormatError(f"message of {n} bytes is shorter than the envelope")
    if data[0] != VERSION:
        raise FormatError(f"unknown format version {data[0]}")
    flags = data[1]
    if flags & ~_FLAGS_KNOWN:
        raise FormatError(f"unknown envelope flags 0x{flags:02x}")
    msg = Message()
    off = 3 + data[2]
    if off > n:
        raise FormatError(f"envelope: send subject of {data[2]} bytes does not fit")
    if off > 3:
        sb = data[3:off]
        subject = _NAMES.get(sb)
        msg.send_subject = subject if subject is not None else _new_name(sb, 3, "send subject")
    if flags & FLAG_REPLY:
        msg.reply_subject, off = _envelope_string(data, off, "reply subject")
    enc: str | None = "utf-8"
    if flags & FLAG_ENCODING:
        name, off = _envelope_string(data, off, "encoding")
        msg.encoding = name
        try:
            enc = codecs.lookup(name).name
        except LookupError:
            enc = None  # unknown here: every string stays raw bytes
    if flags & FLAG_CM:
        sender, off = _envelope_string(data, off, "CM sender name")
        if off + _CM.size > n:
            raise FormatError("envelope ends inside the CM label")
        seq, limit = _CM.unpack_from(data, off)
        off += _CM.size
        if not (math.isfinite(limit) and limit >= 0):
            raise FormatError(f"envelope: CM time limit {limit} is not finite seconds >= 0")
        msg.cm = CmLabel(sender, seq, limit)
    if flags & FLAG_ORIGIN:
        oid, off = _envelope_string(data, off, "origin id")
        if off >= n:
            raise FormatError("envelope ends before the hop count")
        msg.origin = Origin(oid, data[off])
        off += 1
    if flags & FLAG_ROUTE:
        network, off = _envelope_string(data, off, "route network")
        if off >= n:
            raise FormatError("envelope ends before the router hop count")
        msg.route = Route(network, data[off])
        off += 1
    msg.fields = _decode_fields(data, off, n, enc, max_depth - 1)
    return msg


def _decode_str(data: bytes, off: int, end: int, enc: str | None) -> str | bytes:
    """The NUL-terminated string in ``data[off:end]`` (``end`` is past the NUL)."""
    if end <= off or data[end - 1] != 0:
        raise FormatError(f"string at offset {off} is not NUL-terminated")
    if data.find(0, off, end - 1) >= 0:
        raise FormatError(f"string at offset {off} contains NUL before its end")
    b = data[off:end - 1]
    if enc is None:
        return b
    try:
        return b.decode(enc)
    except UnicodeDecodeError:
        return b


def _decode_fields(data: bytes, off: int, limit: int, enc: str | None,
                   depth: int) -> list[Field]:
    """The fields in ``data[off:limit]``, which they must fill exactly."""
    if depth < 0:
        raise FormatError(f"message nested deeper than the depth limit at offset {off}")
    fields: list[Field] = []
    append = fields.append
    unpack_hdr = HEADER.unpack_from
    fixed = _FIXED_DEC
    fids: set[int] | None = None
    names = _NAMES
    while off < limit:
        if off + 8 > limit:
            raise FormatError(f"field header at offset {off} runs past its container")
        t, nlen, fid, size = unpack_hdr(data, off)
        off += 8
        if nlen:
            if nlen > MAX_FIELD_NAME:
                raise FormatError(f"field name of {nlen} bytes at offset {off}")
            nend = off + nlen
            if nend > limit:
                raise FormatError(f"field name at offset {off} runs past its container")
            nb = data[off:nend]
            name: str | None = names.get(nb)
            if name is None:
                name = _new_name(nb, off)
            off = nend
        else:
            if fid:
                raise FormatError(f"field id {fid} without a name at offset {off}")
            name = None
            nb = b""
        if fid:
            if fids is None:
                fids = {fid}
            elif fid in fids:
                raise FormatError(f"field id {fid} repeated in one message at offset {off}")
            else:
                fids.add(fid)
        end = off + size
        if end > limit:
            raise FormatError(f"field data of {size} bytes at offset {off} runs past its "
                              "container")
        fx = fixed.get(t)
        v: Any
        if fx is not None:
            if size != fx[0]:
                raise FormatError(f"type {t} field of {size} bytes at offset {off}; "
                                  f"it takes {fx[0]}")
            v = fx[1](data, off)[0]
        elif t == STRING:
            v = _decode_str(data, off, end, enc)
        elif t == BOOL:
            if size != 1 or data[off] > 1:
                raise FormatError(f"bool at offset {off} is not one byte 0 or 1")
            v = data[off] == 1
        elif t == MSG:
            m = Message()
            m.fields = _decode_fields(data, off, end, enc, depth - 1)
            v = m
        elif t == DATETIME:
            if size != 8:
                raise FormatError(f"datetime of {size} bytes at offset {off}; it takes 8")
            x = _DT.unpack_from(data, off)[0]
            us = x & 0xFFFFFF
            if us > 999_999:
                raise FormatError(f"datetime microseconds {us} at offset {off} exceed 999999")
            v = RvDateTime(x >> 24, us)
        elif t == IPADDR32:
            if size != 4:
                raise FormatError(f"ipaddr32 of {size} bytes at offset {off}; it takes 4")
            v = IPv4Address(_IP.unpack_from(data, off)[0])
        elif t in ARRAY_TYPECODES:
            w = ARRAY_WIDTHS[t]
            if size % w:
                raise FormatError(f"array of {size} bytes at offset {off} is not a whole "
                                  f"number of {w}-byte elements")
            a = array(ARRAY_TYPECODES[t])
            a.frombytes(data[off:end])
            if _SWAP and w > 1:
                a.byteswap()
            v = a
        elif t == STRINGARRAY or t == MSGARRAY:
            if size < 4:
                raise FormatError(f"array at offset {off} has no element count")
            count = _U32.unpack_from(data, off)[0]
            p = off + 4
            items: list[Any] = []
            for _ in range(count):
                if p + 4 > end:
                    raise FormatError(f"array element at offset {p} runs past its field")
                q = p + 4 + _U32.unpack_from(data, p)[0]
                if q > end:
                    raise FormatError(f"array element at offset {p} runs past its field")
                if t == STRINGARRAY:
                    items.append(_decode_str(data, p + 4, q, enc))
                else:
                    m = Message()
                    m.fields = _decode_fields(data, p + 4, q, enc, depth - 1)
                    items.append(m)
                p = q
            if p != end:
                raise FormatError(f"array field at offset {off} has {end - p} bytes after "
                                  f"its {count} elements")
            v = items
        else:  # OPAQUE, XML, ENCRYPTED, unknown codes
            v = data[off:end]
        append(Field(name, fid, t, v, nb))
        off = end
    return fields
