"""The default mapping between AMQP 1.0 messages and core messages (OASIS AMQP JMS Mapping).

How this works. The AMQP adapter decodes a transfer into a :class:`proton.Message` and calls
:func:`amqp_to_message` with the destination it resolved (link target or ``to``); for every
delivery to an AMQP receiver it calls :func:`message_to_amqp` and encodes what it gets back.
The rules are the rows of the tables in ``mappings/README.md`` ("AMQP 1.0"), and the code
follows them section by section: application properties, body, properties, annotations,
header. :func:`parse_address`, :func:`format_address` and :func:`dest_type_code` are the
``queue://`` / ``topic://`` address rules and the ``x-opt-jms-dest`` type codes.

AMQP has types the core lacks (timestamp, uuid, symbol, decimals, described values, arrays
of anything, maps with any keys) and the core makes distinctions AMQP cannot (``Int64``
versus a plain ``int``, strings with lone surrogates). Neither side drops a value: each
converts it to its nearest own value and writes what it was into one compact JSON list, the
property ``JMS_GW_AMQP_TYPES`` (entries ``[where, path..., type]``, README "Types record"),
which the other direction reads to restore the exact value. Values are converted
copy-on-write: a map or list with nothing to convert is passed on as it is, never copied.

proton's ``Message`` gives the times as float seconds (and truncates when setting them) and
an unset content type as ``symbol('None')``, so those fields are read and written through
``cproton`` on ``pm._msg`` in integer milliseconds. proton's ``Message`` holds one body
section and no footer: several data or sequence sections and footers cannot be seen here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import Any
from uuid import UUID

import cproton
import proton
from proton import UNDESCRIBED, Array, Data, Described, symbol, ulong

from gateway import types as gt
from gateway.message import QUEUE, TOPIC, BodyKind, DeliveryMode, Destination, DestKind, Message
from mappings.mqtt import CONTENT_TYPE_PROPERTY, is_text_content_type, wire_escape, wire_unescape

__all__ = [
    "CONTENT_ENCODING_PROPERTY", "CONTENT_TYPE_PROPERTY", "DA_PREFIX", "MA_PREFIX",
    "PRIORITY_PROPERTY", "REPLY_TO_GROUP_ID_PROPERTY", "REPLY_TO_PROPERTY", "TYPES_PROPERTY",
    "amqp_to_message", "dest_type_code", "format_address", "message_to_amqp", "parse_address",
]  # fmt: skip

# -- names -------------------------------------------------------------------------------------

TYPES_PROPERTY = "JMS_GW_AMQP_TYPES"  # the types record (JSON), written and read by both sides
MA_PREFIX = "JMS_GW_AMQP_MA_"  # + key: a message annotation the mapping does not consume
DA_PREFIX = "JMS_GW_AMQP_DA_"  # + key: a delivery annotation
CONTENT_ENCODING_PROPERTY = "JMS_GW_AMQP_CONTENT_ENCODING"
REPLY_TO_GROUP_ID_PROPERTY = "JMS_GW_AMQP_REPLY_TO_GROUP_ID"  # Qpid JMS: JMS_AMQP_REPLY_TO_GROUP_ID
REPLY_TO_PROPERTY = "JMS_GW_AMQP_REPLY_TO"  # a reply-to naming no destination (empty name)
PRIORITY_PROPERTY = "JMS_GW_AMQP_PRIORITY"  # uint8: an AMQP priority above 9 (JMS caps it at 9)
USER_ID, GROUP_ID, GROUP_SEQ = "JMSXUserID", "JMSXGroupID", "JMSXGroupSeq"

MSG_TYPE = symbol("x-opt-jms-msg-type")
JMS_DEST = symbol("x-opt-jms-dest")
JMS_REPLY_TO = symbol("x-opt-jms-reply-to")
DELIVERY_TIME = symbol("x-opt-delivery-time")
DELIVERY_DELAY = symbol("x-opt-delivery-delay")
TRACE_ID = symbol("x-opt-gw-trace-id")
GW_DELIVERY_MODE = symbol("x-opt-gw-delivery-mode")
RELIABLE = symbol("RELIABLE")

SERIALIZED_OBJECT = "application/x-java-serialized-object"
QUEUE_PREFIX, TOPIC_PREFIX = "queue://", "topic://"
UINT_MAX = 0xFFFFFFFF  # header.ttl is a uint of milliseconds

# x-opt-jms-msg-type values (Qpid JMS AmqpMessageSupport), sent as AMQP bytes.
JMS_MESSAGE, JMS_OBJECT, JMS_MAP, JMS_BYTES, JMS_STREAM, JMS_TEXT = 0, 1, 2, 3, 4, 5
_BYTE = tuple(proton.byte(i) for i in range(6))

_NONE, _TEXT, _BYTES = BodyKind.NONE, BodyKind.TEXT, BodyKind.BYTES
_MAP, _STREAM, _OBJECT = BodyKind.MAP, BodyKind.STREAM, BodyKind.OBJECT
_PERSISTENT, _NON_PERSISTENT = DeliveryMode.PERSISTENT, DeliveryMode.NON_PERSISTENT
_RELIABLE = DeliveryMode.RELIABLE
_NO_BODY, _DATA, _VALUE, _SEQUENCE = 0, 1, 2, 3  # body sections, as proton tells them apart

# -- addresses ---------------------------------------------------------------------------------

_KIND_BY_HINT: dict[int, DestKind] = {0: QUEUE, 1: TOPIC, 2: QUEUE, 3: TOPIC}
_ADDRESS_CACHE: dict[tuple[str, DestKind], Destination] = {}
_ADDRESS_CACHE_MAX = 4096  # distinct addresses in use are few; past this, parse each time


def parse_address(
    address: str, *, hint: int | None = None, default: DestKind = QUEUE
) -> Destination:
    """The destination an AMQP address names (JMS Mapping, JMSDestination and JMSReplyTo).

    A ``queue://`` or ``topic://`` prefix decides the kind; otherwise ``hint``, the
    ``x-opt-jms-dest`` / ``x-opt-jms-reply-to`` byte (0 queue, 1 topic, 2 temporary queue,
    3 temporary topic; any other value is ignored); otherwise ``default``. A temporary hint
    gives the same kind: a destination is temporary by its name (``Destination.is_temporary``).

    Raises:
        ValueError: the name is empty.
    """
    if address.startswith(QUEUE_PREFIX):
        kind, name = QUEUE, address[8:]
    elif address.startswith(TOPIC_PREFIX):
        kind, name = TOPIC, address[8:]
    else:
        # a boolean is an int to Python, not a type byte to AMQP: ignored like any other value
        ok = isinstance(hint, int) and not isinstance(hint, bool)
        kind = _KIND_BY_HINT.get(hint, default) if ok else default  # type: ignore[arg-type]
        name = address
    dest = _ADDRESS_CACHE.get((name, kind))
    if dest is None:
        if not name:
            raise ValueError(f"AMQP address {address!r} names no destination")
        dest = Destination(kind, name)
        if len(_ADDRESS_CACHE) < _ADDRESS_CACHE_MAX:
            _ADDRESS_CACHE[name, kind] = dest
    return dest


def format_address(dest: Destination) -> str:
    """``queue://name`` or ``topic://name``: the prefix tells any AMQP peer the kind."""
    return (TOPIC_PREFIX if dest.kind is TOPIC else QUEUE_PREFIX) + dest.name


def dest_type_code(dest: Destination) -> int:
    """The ``x-opt-jms-dest`` / ``x-opt-jms-reply-to`` byte: 0/1 queue/topic, 2/3 temporary."""
    return (1 if dest.kind is TOPIC else 0) + (2 if dest.is_temporary else 0)


# -- message-id and correlation-id (Qpid JMS AmqpMessageIdHelper encodings) ---------------------

_ID_PREFIX = "ID:AMQP_"


def _id_out(text: str, binary: bool) -> Any:
    """A JMS id string → the AMQP id it encodes (``ID:AMQP_ULONG:5`` → ulong 5), else itself.

    Only canonical encodings (as :func:`_id_in` writes them) are decoded, and ``AMQP_STRING:``
    only when what follows would itself be decoded, so ``_id_in(_id_out(s)) == s`` for every
    string and ``_id_out(_id_in(a)) == a`` for every AMQP id. ``binary`` is False for the
    correlation-id, whose binary form is ``bytes`` in the core.
    """
    if not text.startswith(_ID_PREFIX):
        return text
    rest = text[8:]
    try:
        if rest.startswith("ULONG:"):
            digits = rest[6:]
            if digits.isdigit() and digits.isascii() and str(int(digits)) == digits:
                if int(digits) <= 0xFFFFFFFFFFFFFFFF:
                    return ulong(int(digits))
        elif rest.startswith("UUID:"):
            if str(UUID(rest[5:])) == rest[5:]:
                return UUID(rest[5:])
        elif rest.startswith("BINARY:"):
            if binary and bytes.fromhex(rest[7:]).hex().upper() == rest[7:]:
                return bytes.fromhex(rest[7:])
        elif rest.startswith("STRING:") and _id_out(rest[7:], binary) is not rest[7:]:
            return rest[7:]
    except ValueError:
        pass
    return text


def _id_in(value: Any, binary: bool) -> str | bytes:
    """An AMQP message-id / correlation-id → the JMS id (a binary correlation-id → bytes)."""
    t = type(value)
    if t is str:
        text: str = value
        if text.startswith(_ID_PREFIX) and _id_out(text, binary) is not text:
            return "ID:AMQP_STRING:" + text
        return text
    if t is memoryview or t is bytes:
        return "ID:AMQP_BINARY:" + bytes(value).hex().upper() if binary else bytes(value)
    if t is UUID:
        return "ID:AMQP_UUID:" + str(value)
    return "ID:AMQP_ULONG:" + str(int(value))


# -- values: AMQP → core -----------------------------------------------------------------------

_PLAIN = frozenset((str, int, float, bool, type(None)))  # the same value on both sides
_NO = object()  # "this recorded type does not apply here"
_UNDESCRIBED: Any = UNDESCRIBED
Path = tuple[Any, ...]
Marks = list[list[Any]]  # types records entries being written: [where, path..., type]
Node = dict[Any, Any]  # a parsed types record: child key → Node, None → this value's type


def _cast(cls: type) -> Callable[[Any], Any]:
    """Re-type a value without a range check (it fits already): ``int.__new__(Int8, v)``."""
    base = float if issubclass(cls, float) else str if issubclass(cls, str) else int
    return partial(base.__new__, cls)


_WIDTHS = (
    (proton.byte, gt.Int8), (proton.short, gt.Int16), (proton.int32, gt.Int32),
    (proton.ubyte, gt.UInt8), (proton.ushort, gt.UInt16), (proton.uint, gt.UInt32),
    (proton.ulong, gt.UInt64), (proton.float32, gt.Float32), (proton.char, gt.Char),
)  # fmt: skip
_IN_WIDTH: dict[type, Callable[[Any], Any]] = {p: _cast(g) for p, g in _WIDTHS}
_OUT_WIDTH: dict[type, Callable[[Any], Any]] = {g: _cast(p) for p, g in _WIDTHS}
del _IN_WIDTH[proton.char]  # an AMQP char is any code point, a core Char one UTF-16 unit

# AMQP types with no core type: value → nearest core value, and the name recorded for it.
_IN_MARKED: dict[type, tuple[Callable[[Any], Any], str]] = {
    proton.timestamp: (int, "timestamp"),
    UUID: (str, "uuid"),
    symbol: (str, "symbol"),
    proton.char: (str, "char"),
    proton.decimal32: (lambda v: int(v).to_bytes(4, "big"), "decimal32"),
    proton.decimal64: (lambda v: int(v).to_bytes(8, "big"), "decimal64"),
    proton.decimal128: (bytes, "decimal128"),
}

# proton type codes ↔ AMQP type names (used in the types record) and gateway array classes.
_TYPE_NAMES: dict[int, str] = {
    Data.NULL: "null", Data.BOOL: "boolean", Data.UBYTE: "ubyte", Data.BYTE: "byte",
    Data.USHORT: "ushort", Data.SHORT: "short", Data.UINT: "uint", Data.INT: "int",
    Data.CHAR: "char", Data.ULONG: "ulong", Data.LONG: "long", Data.TIMESTAMP: "timestamp",
    Data.FLOAT: "float", Data.DOUBLE: "double", Data.DECIMAL32: "decimal32",
    Data.DECIMAL64: "decimal64", Data.DECIMAL128: "decimal128", Data.UUID: "uuid",
    Data.BINARY: "binary", Data.STRING: "string", Data.SYMBOL: "symbol",
    Data.DESCRIBED: "described", Data.ARRAY: "array", Data.LIST: "list", Data.MAP: "map",
}  # fmt: skip
_TYPE_CODES = {name: code for code, name in _TYPE_NAMES.items()}
_ARRAY_CLASSES: dict[int, type[gt.TypedArray]] = {
    Data.BYTE: gt.Int8Array, Data.SHORT: gt.Int16Array, Data.INT: gt.Int32Array,
    Data.LONG: gt.Int64Array, Data.UBYTE: gt.UInt8Array, Data.USHORT: gt.UInt16Array,
    Data.UINT: gt.UInt32Array, Data.ULONG: gt.UInt64Array, Data.FLOAT: gt.Float32Array,
    Data.DOUBLE: gt.Float64Array, Data.BOOL: gt.BoolArray,
}  # fmt: skip
_ARRAY_CODES = {cls: code for code, cls in _ARRAY_CLASSES.items()}
# Elements of an array of a scalar type with no gateway array: AMQP → core (the array's
# recorded type says what they were, so they are not recorded one by one).
_ELEMENT_IN: dict[int, Callable[[Any], Any]] = {
    Data.TIMESTAMP: int, Data.UUID: str, Data.SYMBOL: str, Data.CHAR: str, Data.STRING: str,
    Data.BINARY: bytes, Data.NULL: lambda v: None,
    Data.DECIMAL32: _IN_MARKED[proton.decimal32][0],
    Data.DECIMAL64: _IN_MARKED[proton.decimal64][0], Data.DECIMAL128: bytes,
}  # fmt: skip


def _descriptor_json(d: Any) -> Any:
    """A descriptor in the types record: a ulong as a number, a symbol as a string (AMQP 1.0
    §1.5 reserves every other descriptor type; one is recorded as its text, a symbol)."""
    return int(d) if type(d) is ulong else str(d)


def _descriptor_from_json(j: Any) -> Any:
    return ulong(j) if type(j) is int else symbol(j)


def _in_value(v: Any, node: Node | None, path: Path, marks: Marks) -> Any:
    """An AMQP value → its core value; AMQP-only types are recorded in ``marks``.

    ``node`` holds what the core → AMQP side recorded for this value (``int64``, ``string``,
    ``ekeys``). A container's own type is recorded before its children's.
    """
    if node is not None and None in node:
        r = _in_restore(v, node[None], node, path, marks)
        if r is not _NO:
            return r
    t = type(v)
    conv = _IN_WIDTH.get(t)
    if conv is not None:
        return conv(v)
    if t in _PLAIN:
        return v
    if t is memoryview or t is bytes:
        return bytes(v)
    if t is dict:
        return _map(v, node, path, marks, False)
    if t is list:
        return _list(v, node, path, marks, False)
    if t is proton.char and ord(v) <= 0xFFFF:
        return str.__new__(gt.Char, v)
    special = _IN_MARKED.get(t)
    if special is not None:
        marks.append([*path, special[1]])
        return special[0](v)
    if t is Array:
        return _in_array(v, path, marks)
    if t is Described:
        n = len(marks)
        value = _in_value(v.value, None, path, marks)
        own = ["described", _descriptor_json(v.descriptor)]
        if len(marks) > n and len(marks[n]) == len(path) + 1:  # the value's own type
            own.append(marks[n][-1])
            marks[n][-1] = own
        else:
            marks.insert(n, [*path, own])
        return value
    raise TypeError(f"cannot map an AMQP value of type {t.__name__}")


def _map(d: dict[Any, Any], node: Node | None, path: Path, marks: Marks, out_: bool) -> Any:
    """Convert a map's values (AMQP → core, or core → AMQP if ``out_``), copy-on-write.

    In, a map with a key that is not a string becomes the list k1, v1, k2, v2, … recorded
    ``map``; out, a key with a lone surrogate has every key %-escaped, recorded ``ekeys``.
    """
    convert, plain = (_out_value, _PLAIN_OUT) if out_ else (_in_value, _PLAIN)
    out: dict[Any, Any] | None = None
    n = len(marks)
    for k, x in d.items():
        if type(k) is not str or (out_ and not _encodable(k)):
            del marks[n:]
            marks.append([*path, "ekeys" if out_ else "map"])
            if out_:
                return {
                    wire_escape(k): _out_value(x, node and node.get(k), (*path, k), marks)
                    for k, x in d.items()
                }
            pairs: list[Any] = []
            for k, x in d.items():
                pairs.append(_in_value(k, None, (*path, len(pairs)), marks))
                pairs.append(_in_value(x, None, (*path, len(pairs)), marks))
            return pairs
        child = None if node is None else node.get(k)
        if child is None and (type(x) in plain or (type(x) is str and x.isascii())):
            continue
        y = convert(x, child, (*path, k), marks)
        if y is not x:
            if out is None:
                out = dict(d)
            out[k] = y
    return d if out is None else out


def _list(lst: list[Any], node: Node | None, path: Path, marks: Marks, out_: bool) -> list[Any]:
    """Convert a list's elements (AMQP → core, or core → AMQP if ``out_``), copy-on-write."""
    convert, plain = (_out_value, _PLAIN_OUT) if out_ else (_in_value, _PLAIN)
    out: list[Any] | None = None
    for i, x in enumerate(lst):
        child = None if node is None else node.get(i)
        if child is None and (type(x) in plain or (type(x) is str and x.isascii())):
            continue
        y = convert(x, child, (*path, i), marks)
        if y is not x:
            if out is None:
                out = list(lst)
            out[i] = y
    return lst if out is None else out


def _in_array(a: Array, path: Path, marks: Marks) -> Any:
    code = a.type
    cls = _ARRAY_CLASSES.get(code)
    desc: Any = a.descriptor
    described = desc is not _UNDESCRIBED
    if cls is not None and not described:
        return cls(a.elements)
    mark: list[Any] = ["array", _TYPE_NAMES.get(code, "null")]
    if described:
        mark.append(_descriptor_json(desc))
    marks.append([*path, mark])
    if cls is not None:
        return cls(a.elements)
    convert = _ELEMENT_IN.get(code)
    if convert is not None:
        return [convert(e) for e in a.elements]
    return [_in_value(e, None, (*path, i), marks) for i, e in enumerate(a.elements)]


def _in_restore(v: Any, mark: Any, node: Node, path: Path, marks: Marks) -> Any:
    """Apply a type the core → AMQP side recorded (README "Types record"), or _NO."""
    t = type(v)
    try:
        if mark == "int64" and t is int:
            return int.__new__(gt.Int64, v)
        if mark == "string" and (t is memoryview or t is bytes):
            return bytes(v).decode("utf-8", "surrogatepass")
        if mark == "ekeys" and t is dict:  # every key was %-escaped (one had a lone surrogate)
            keys = [wire_unescape(k) for k in v]
            return {
                k: _in_value(x, node.get(k), (*path, k), marks)
                for k, x in zip(keys, v.values(), strict=True)
            }
    except UnicodeDecodeError:
        pass
    return _NO


# -- values: core → AMQP -----------------------------------------------------------------------

_PLAIN_OUT = frozenset((int, float, bool, type(None), bytes))  # sent as they are (str: checked)
_ELEMENT_OUT: dict[int, Callable[[Any], Any]] = {
    Data.BYTE: proton.byte, Data.SHORT: proton.short, Data.INT: proton.int32, Data.LONG: int,
    Data.UBYTE: proton.ubyte, Data.USHORT: proton.ushort, Data.UINT: proton.uint,
    Data.ULONG: ulong, Data.FLOAT: proton.float32, Data.DOUBLE: float, Data.BOOL: bool,
    Data.NULL: lambda v: None, Data.BINARY: bytes,
    Data.STRING: lambda v: v if type(v) is str else _NO,
}  # fmt: skip


def _encodable(text: str) -> bool:
    """True if ``text`` can be an AMQP string (UTF-8: no lone surrogates)."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _restore_scalar(name: str, v: Any) -> Any:
    """A core value recorded as the AMQP type ``name`` → that AMQP value, or _NO."""
    t = type(v)
    if name == "timestamp" and t is int:
        return proton.timestamp(v)
    if name == "uuid" and t is str:
        return UUID(v)
    if name == "symbol" and t is str and v.isascii():
        return symbol(v)
    if name == "char" and (t is str or t is gt.Char) and len(v) == 1:
        return proton.char(v)
    if t is bytes and len(v) == {"decimal32": 4, "decimal64": 8, "decimal128": 16}.get(name):
        if name == "decimal128":
            return proton.decimal128(v)
        return (proton.decimal32 if len(v) == 4 else proton.decimal64)(int.from_bytes(v, "big"))
    return _NO


def _out_restore(v: Any, mark: Any, node: Node, path: Path, marks: Marks) -> Any:
    """Apply a type the AMQP → core side recorded: the exact AMQP value again, or _NO."""
    try:
        if type(mark) is str:
            if mark != "map":
                return _restore_scalar(mark, v)
            if type(v) is not list or len(v) % 2:
                return _NO
            return {
                _out_value(v[i], node.get(i), (*path, i), marks): _out_value(
                    v[i + 1], node.get(i + 1), (*path, i + 1), marks
                )
                for i in range(0, len(v), 2)
            }
        if mark[0] == "described":
            inner = dict(node)  # the described value: this node with its own recorded type
            del inner[None]
            if len(mark) > 2:
                inner[None] = mark[2]
            return Described(_descriptor_from_json(mark[1]), _out_value(v, inner, path, marks))
        if mark[0] == "array":
            code = _TYPE_CODES[mark[1]]
            desc = _descriptor_from_json(mark[2]) if len(mark) > 2 else _UNDESCRIBED
            convert = _ELEMENT_OUT.get(code)
            if convert is not None:
                els = [convert(e) for e in v]
            elif code in _ELEMENT_IN:
                els = [_restore_scalar(mark[1], e) for e in v]
            else:
                els = [_out_value(e, node.get(i), (*path, i), marks) for i, e in enumerate(v)]
            return _NO if any(e is _NO for e in els) else Array(desc, code, *els)
    except (ValueError, TypeError, KeyError, IndexError, OverflowError):
        pass
    return _NO


def _out_value(v: Any, node: Node | None, path: Path, marks: Marks) -> Any:
    """A core value → its AMQP value; core types AMQP cannot tell apart are recorded."""
    if node is not None and None in node:
        r = _out_restore(v, node[None], node, path, marks)
        if r is not _NO:
            return r
    t = type(v)
    conv = _OUT_WIDTH.get(t)
    if conv is not None:
        return conv(v)
    if t is str:
        if _encodable(v):
            return v
        marks.append([*path, "string"])
        return v.encode("utf-8", "surrogatepass")
    if t in _PLAIN_OUT:
        return v
    if t is gt.Int64:
        marks.append([*path, "int64"])
        return int(v)
    if t is dict:
        return _map(v, node, path, marks, True)
    if t is list:
        return _list(v, node, path, marks, True)
    code = _ARRAY_CODES.get(t)
    if code is not None:
        return Array(_UNDESCRIBED, code, *map(_ELEMENT_OUT[code], v))
    raise TypeError(f"cannot map a {t.__name__} value to AMQP")


# -- the types record --------------------------------------------------------------------------

_RECORD_CACHE: dict[str, Node] = {}
_RECORD_CACHE_MAX = 1024  # a producer sends the same record again and again
_RECORD_CACHE_MAX_LEN = 2048  # longer records are parsed each time, not kept
_BODY, _FIELD, _ESCAPED = 0, 1, 2  # where an entry applies, besides a property (its name)


def _parse_record(text: str) -> Node:
    """A types record (JSON list of ``[where, path..., type]``) → a tree of nodes.

    Malformed entries are ignored; a record that is not JSON is an empty one.
    """
    tree = _RECORD_CACHE.get(text)
    if tree is not None:
        return tree
    tree = {}
    try:
        entries = json.loads(text)
    except ValueError:
        entries = None
    for entry in entries if type(entries) is list else ():
        if type(entry) is list and len(entry) >= 2:
            cur = tree
            for comp in entry[:-1]:
                if type(comp) is not str and type(comp) is not int:
                    break
                cur = cur.setdefault(comp, {})
            else:
                cur[None] = entry[-1]
    if len(_RECORD_CACHE) < _RECORD_CACHE_MAX and len(text) <= _RECORD_CACHE_MAX_LEN:
        _RECORD_CACHE[text] = tree
    return tree


def _field_mark(tree: Node | None, field: str) -> Any:
    """The type recorded for a field (``[1, field, type]``), or None."""
    node = None if tree is None else tree.get(_FIELD)
    node = None if node is None else node.get(field)
    return None if node is None else node.get(None)


def _unescape(tree: Node | None, field: str, text: Any) -> Any:
    return wire_unescape(text) if type(text) is str and _field_mark(tree, field) == "esc" else text


def _field_safe(text: str) -> bool:
    """proton passes most string fields as C strings: no NUL, and UTF-8 (no lone surrogate)."""
    return "\x00" not in text and _encodable(text)


def _escape(text: Any, field: str, marks: Marks) -> Any:
    """A string field proton cannot carry (NUL, lone surrogate) goes %-escaped, recorded."""
    if type(text) is not str or _field_safe(text):
        return text
    marks.append([_FIELD, field, "esc"])
    return wire_escape(text)


# -- AMQP → core -------------------------------------------------------------------------------


# properties-section strings kept as properties: (property, get, set); proton passes them as
# C strings (no NUL); content-encoding is a symbol (ASCII).
_STRING_FIELDS = (
    (GROUP_ID, cproton.pn_message_get_group_id, cproton.pn_message_set_group_id),
    (REPLY_TO_GROUP_ID_PROPERTY, cproton.pn_message_get_reply_to_group_id,
     cproton.pn_message_set_reply_to_group_id),
    (CONTENT_ENCODING_PROPERTY, cproton.pn_message_get_content_encoding,
     cproton.pn_message_set_content_encoding),
)  # fmt: skip
_STRING_SETTERS = {name: put for name, _, put in _STRING_FIELDS}
_SYMBOLS = (CONTENT_TYPE_PROPERTY, CONTENT_ENCODING_PROPERTY)  # AMQP symbols: ASCII only


def _section_msg_type(section: int, kind: BodyKind, value: Any) -> int:
    """The x-opt-jms-msg-type sent with a body in this section (``value``: the AMQP body)."""
    if section == _NO_BODY or section == _SEQUENCE:
        return JMS_MESSAGE if section == _NO_BODY else JMS_STREAM
    if section == _DATA:
        return JMS_OBJECT if kind is _OBJECT else JMS_TEXT if kind is _TEXT else JMS_BYTES
    t = type(value)
    if t is str or t is memoryview or t is bytes:
        return JMS_TEXT if t is str else JMS_BYTES
    return JMS_MAP if t is dict else JMS_STREAM if t is list else JMS_OBJECT


def amqp_to_message(
    pm: proton.Message, *, destination: Destination, default_kind: DestKind, now_ms: int
) -> Message:
    """Build the core message for one AMQP message (table "AMQP → core" in the README).

    ``destination`` is what the adapter resolved (link target, or ``to`` with the
    ``x-opt-jms-dest`` hint); reply-to is parsed here with the ``x-opt-jms-reply-to`` hint
    and ``default_kind``. The header's delivery-count and first-acquirer are per hop and not
    kept (the core counts deliveries itself). The broker stamps the message id, timestamp
    and trace id when message-id, creation-time and ``x-opt-gw-trace-id`` did not give them.
    """
    raw = pm._msg
    marks: Marks = []
    props: dict[str, Any] = {}
    wire: Node | None = None
    # application-properties → properties, with their AMQP types.
    app: dict[Any, Any] | None = pm.properties
    if app:
        record = app.get(TYPES_PROPERTY)
        if type(record) is str:
            wire = _parse_record(record)
        for name, value in app.items():
            if name != TYPES_PROPERTY or wire is None:
                _prop_in(props, str(name), value, wire, marks)
        escaped = None if wire is None else wire.get(_ESCAPED)
        if escaped:  # names the core → AMQP side had to %-escape
            props = {(wire_unescape(k) if k in escaped else k): v for k, v in props.items()}
    # body → body kind and body (README "Body").
    body: Any = pm.body
    raw_body = body
    inferred = cproton.pn_message_is_inferred(raw)
    content_type = cproton.pn_message_get_content_type(raw)
    ann = pm.annotations
    msg_type = ann.get(MSG_TYPE) if ann else None
    form = None
    body_node = None if wire is None else wire.get(_BODY)
    if body is None:
        section, kind = _NO_BODY, _NONE
    elif inferred and type(body) is not list:  # a data section
        section, kind, body = _DATA, _BYTES, bytes(body)
        if body_node is not None and body_node.get(None) == "string":  # a core text, escaped
            text = _in_restore(body, "string", body_node, (_BODY,), marks)
            if text is not _NO:
                kind, body = _TEXT, text
        elif msg_type == JMS_TEXT or (
            msg_type is None and content_type is not None and is_text_content_type(content_type)
        ):
            try:
                kind, body, form = _TEXT, body.decode(), "data"
            except UnicodeDecodeError:
                kind = _BYTES
        elif msg_type == JMS_OBJECT or (msg_type is None and content_type == SERIALIZED_OBJECT):
            kind = _OBJECT
    else:
        section = _SEQUENCE if inferred else _VALUE
        t = type(body)
        body = _in_value(body, body_node, (_BODY,), marks)
        if t is str or t is memoryview or t is bytes:
            kind, form = (_TEXT, None) if t is str else (_BYTES, "value")
        elif t is dict:
            kind = _MAP if type(body) is dict else _STREAM
        elif t is list:
            kind, form = _STREAM, ("value" if section == _VALUE else None)
        else:  # a single value of another type: a stream of one
            kind, form, body = _STREAM, "value1", [body]
            for m in marks:  # its recorded types move under the one-element list
                if m[0] == _BODY:
                    m.insert(1, 0)
    if form is not None:
        marks.append([_FIELD, "body", form])
    # properties section → JMSX and vendor properties.
    user_id = cproton.pn_message_get_user_id(raw)
    if user_id:
        try:
            props[USER_ID] = user_id.decode()
        except UnicodeDecodeError:
            props[USER_ID] = user_id
    for name, get, _ in _STRING_FIELDS:
        text = get(raw)
        if text is not None:
            props[name] = text
    seq = cproton.pn_message_get_group_sequence(raw)
    if seq:  # a uint; JMSXGroupSeq is a Java int, so the top half wraps as Qpid JMS does
        props[GROUP_SEQ] = int.__new__(gt.Int32, seq - 0x100000000 if seq > 0x7FFFFFFF else seq)
    if content_type is not None and not (kind is _OBJECT and content_type == SERIALIZED_OBJECT):
        props[CONTENT_TYPE_PROPERTY] = content_type
    # message annotations: the JMS and gateway ones are read; any other is kept.
    trace_id = reply_hint = delay = None
    delivery_time = 0
    mode = _PERSISTENT if cproton.pn_message_is_durable(raw) else _NON_PERSISTENT
    for key, value in ann.items() if ann else ():
        if key == MSG_TYPE:
            expected = _section_msg_type(section, kind, raw_body)
            if type(value) is proton.byte and value == expected:
                continue
        elif key == JMS_DEST:
            continue  # the adapter's hint for `to`; sent again from the destination
        elif key == JMS_REPLY_TO:
            reply_hint = value
            continue
        elif key == DELIVERY_TIME:
            if isinstance(value, int) and type(value) is not bool:
                delivery_time = int(value)
                if type(value) is int:
                    continue
        elif key == DELIVERY_DELAY:
            if isinstance(value, int) and type(value) is not bool:
                delay = int(value)
        elif key == TRACE_ID:
            if type(value) is str:
                trace_id = _unescape(wire, "trace-id", value)
                continue
        elif key == GW_DELIVERY_MODE:
            if type(value) is symbol and value == RELIABLE and mode is _NON_PERSISTENT:
                mode = _RELIABLE
                continue
        _carry(props, MA_PREFIX, key, value, wire, marks)
    if delay is not None and not delivery_time:
        delivery_time = now_ms + delay
    inst = pm.instructions
    for key, value in inst.items() if inst else ():
        _carry(props, DA_PREFIX, key, value, wire, marks)
    # header.
    priority = cproton.pn_message_get_priority(raw)
    if priority > 9:
        props[PRIORITY_PROPERTY] = int.__new__(gt.UInt8, priority)
        priority = 9
    expiration = cproton.pn_message_get_expiry_time(raw)
    if not expiration:
        ttl = cproton.pn_message_get_ttl(raw)
        if ttl:
            expiration = now_ms + ttl
    # ids, reply-to.
    message_id = cproton.pn_message_get_id(raw)
    if message_id is not None:
        message_id = _id_in(_unescape(wire, "message-id", message_id), True)
    correlation_id = cproton.pn_message_get_correlation_id(raw)
    if correlation_id is not None:
        correlation_id = _id_in(_unescape(wire, "correlation-id", correlation_id), False)
    reply_to = None
    address = cproton.pn_message_get_reply_to(raw)
    if address is not None:
        address = _unescape(wire, "reply-to", address)
        hint = reply_hint if isinstance(reply_hint, int) else None
        try:
            reply_to = parse_address(address, hint=hint, default=default_kind)
        except ValueError:
            props[REPLY_TO_PROPERTY] = address
    if marks:
        props[TYPES_PROPERTY] = json.dumps(marks, ensure_ascii=True, separators=(",", ":"))
    msg = Message(
        body,
        body_kind=kind,
        properties=props,
        destination=destination,
        delivery_mode=mode,
        priority=priority,
        correlation_id=correlation_id,
        reply_to=reply_to,
        type=_unescape(wire, "subject", cproton.pn_message_get_subject(raw)),
        expiration=expiration,
        delivery_time=delivery_time,
        timestamp=cproton.pn_message_get_creation_time(raw),
        message_id=message_id,  # type: ignore[arg-type]  # always a str (binary=True)
    )
    if trace_id is not None:
        msg.trace_id = trace_id
    return msg


def _carry(
    props: dict[str, Any], prefix: str, key: Any, value: Any, wire: Node | None, marks: Marks
) -> None:
    """Keep an annotation as the vendor property ``prefix + key`` (a ulong key is recorded)."""
    if isinstance(key, str):
        _prop_in(props, prefix + key, value, wire, marks)
    elif isinstance(key, int):  # keys are symbols or ulongs (AMQP 1.0 3.2.10)
        marks.append([_FIELD, prefix + str(int(key)), "ulong"])
        _prop_in(props, prefix + str(int(key)), value, wire, marks)


def _prop_in(props: dict[str, Any], name: str, value: Any, wire: Node | None, marks: Marks) -> None:
    node = None if wire is None else wire.get(name)
    if node is None and type(value) in _PLAIN:
        props[name] = value
    else:
        props[name] = _in_value(value, node, (name,), marks)


# -- core → AMQP -------------------------------------------------------------------------------

_SPECIAL_OUT = frozenset(
    (TYPES_PROPERTY, USER_ID, GROUP_ID, GROUP_SEQ, CONTENT_TYPE_PROPERTY,
     CONTENT_ENCODING_PROPERTY, REPLY_TO_GROUP_ID_PROPERTY, REPLY_TO_PROPERTY, PRIORITY_PROPERTY)
)  # fmt: skip


def message_to_amqp(msg: Message, *, delivery_count: int, now_ms: int) -> proton.Message:
    """The AMQP rendering of a core message (table "core → AMQP" in the README).

    ``delivery_count`` is the core's JMSXDeliveryCount (1 on the first delivery): the header
    gets delivery-count = count - 1 and first-acquirer = (count == 1). The ttl sent is what is
    left of the message's life (``expires_at`` if set, else JMSExpiration); the adapter drops
    expired messages before calling this.
    """
    pm = proton.Message()
    raw = pm._msg
    marks: Marks = []
    app: dict[str, Any] = {}
    ann: dict[Any, Any] = {}
    carried: dict[Any, Any] = {}
    inst: dict[Any, Any] = {}
    tree: Node | None = None
    special: list[tuple[str, Any]] = []
    props = msg.properties
    if props:
        record = props.get(TYPES_PROPERTY)
        if type(record) is str:
            tree = _parse_record(record)
        for name, value in props.items():
            if name in _SPECIAL_OUT:
                special.append((name, value))
                continue
            if name.startswith("JMS_GW_AMQP_") and name.startswith((MA_PREFIX, DA_PREFIX)):
                key: Any = name[15:]
                if key.isascii():  # an annotation key is a symbol (ASCII) or a ulong
                    if _field_mark(tree, name) == "ulong" and key.isdigit():
                        key = ulong(int(key))
                    else:
                        key = symbol(key)
                    node = None if tree is None else tree.get(name)
                    value = _out_value(value, node, (name,), marks)
                    (carried if name[12] == "M" else inst)[key] = value
                    continue
            _app(app, name, value, tree, marks)
    # body → body section and x-opt-jms-msg-type.
    kind = msg.body_kind
    body = msg.body
    content_type = None
    form = _field_mark(tree, "body")
    if kind is _TEXT:
        code = JMS_TEXT
        if not _encodable(body):  # a Java string with a lone surrogate: a data section
            pm.body, pm.inferred = body.encode("utf-8", "surrogatepass"), True
            marks.append([_BODY, "string"])
        elif form == "data":
            pm.body, pm.inferred = body.encode(), True
        else:
            pm.body = body
    elif kind is _BYTES or kind is _OBJECT:
        pm.body, pm.inferred = body, form != "value" or kind is _OBJECT
        code = JMS_BYTES if kind is _BYTES else JMS_OBJECT
        content_type = SERIALIZED_OBJECT if kind is _OBJECT else None
    elif kind is _NONE:
        code = JMS_MESSAGE
    else:
        value = _out_value(body, None if tree is None else tree.get(_BODY), (_BODY,), marks)
        if type(value) is dict:
            code = JMS_MAP
        elif form == "value1" and len(value) == 1:
            value = value[0]
            code = _section_msg_type(_VALUE, kind, value)
        else:  # STREAM: an amqp-sequence, as Qpid JMS sends a StreamMessage
            code, pm.inferred = JMS_STREAM, form != "value"
        pm.body = value
    ann[MSG_TYPE] = _BYTE[code]
    # header.
    mode = msg.delivery_mode
    cproton.pn_message_set_durable(raw, mode is _PERSISTENT)
    if mode is _RELIABLE:
        ann[GW_DELIVERY_MODE] = RELIABLE
    priority = msg.priority
    expires = msg.expires_at or msg.expiration
    if expires:
        left = expires - now_ms
        cproton.pn_message_set_ttl(raw, min(left, UINT_MAX) if left > 0 else 1)
    if delivery_count > 1:
        cproton.pn_message_set_delivery_count(raw, delivery_count - 1)
    else:
        cproton.pn_message_set_first_acquirer(raw, True)
    # properties section and the annotations that go with it.
    if msg.message_id is not None:
        cproton.pn_message_set_id(raw, _escape(_id_out(msg.message_id, True), "message-id", marks))
    dest = msg.destination
    if dest is not None:
        cproton.pn_message_set_address(raw, _escape(format_address(dest), "to", marks))
        ann[JMS_DEST] = _BYTE[dest_type_code(dest)]
    if msg.type is not None:
        pm.subject = _escape(msg.type, "subject", marks)
    reply_to = msg.reply_to
    if reply_to is not None:
        pm.reply_to = _escape(format_address(reply_to), "reply-to", marks)
        ann[JMS_REPLY_TO] = _BYTE[dest_type_code(reply_to)]
    corr = msg.correlation_id
    if corr is not None:
        if not isinstance(corr, bytes):
            corr = _escape(_id_out(corr, False), "correlation-id", marks)
        pm.correlation_id = corr
    if msg.expiration:
        cproton.pn_message_set_expiry_time(raw, msg.expiration)
    if msg.timestamp:
        cproton.pn_message_set_creation_time(raw, msg.timestamp)
    if msg.delivery_time:
        ann[DELIVERY_TIME] = int(msg.delivery_time)  # an AMQP long, as Qpid JMS reads it
    if msg.trace_id is not None:
        ann[TRACE_ID] = _escape(msg.trace_id, "trace-id", marks)
    for name, value in special:
        t = type(value)
        if name == TYPES_PROPERTY:
            if t is str:
                continue
        elif name == USER_ID:
            if value and (t is str and _encodable(value) or t is bytes and not _utf8(value)):
                pm.user_id = value.encode() if t is str else value
                continue
        elif name == GROUP_SEQ:
            if t is gt.Int32 and value:
                cproton.pn_message_set_group_sequence(raw, value & 0xFFFFFFFF)
                continue
        elif name == PRIORITY_PROPERTY:
            if t is gt.UInt8 and value > 9 and priority == 9:
                priority = value
                continue
        elif t is str and _field_safe(value) and (value.isascii() or name not in _SYMBOLS):
            if name == CONTENT_TYPE_PROPERTY:
                content_type = value
                continue
            if name in _STRING_SETTERS:
                _STRING_SETTERS[name](raw, value)
                continue
            if name == REPLY_TO_PROPERTY and reply_to is None:  # a reply-to naming nothing
                pm.reply_to = value
                continue
        _app(app, name, value, tree, marks)
    cproton.pn_message_set_priority(raw, priority)
    if content_type is not None:
        cproton.pn_message_set_content_type(raw, content_type)
    if carried:  # last: a carried x-opt-jms-msg-type overrides the computed one
        ann.update(carried)
    if marks:
        app[TYPES_PROPERTY] = json.dumps(marks, ensure_ascii=True, separators=(",", ":"))
    if app:
        pm.properties = app  # type: ignore[assignment]  # proton declares it None
    # Keys are symbols and ulongs already: skip the setter's AnnotationDict copy (2 µs).
    pm.annotation_dict = ann  # type: ignore[assignment]
    if inst:
        pm.instructions = inst
    return pm


def _utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def _app(app: dict[str, Any], name: str, value: Any, tree: Node | None, marks: Marks) -> None:
    """One property → one application property (a name with a lone surrogate is escaped)."""
    if not _encodable(name):
        wire_name = wire_escape(name)
        marks.append([_ESCAPED, wire_name, "esc"])
    else:
        wire_name = name
    node = None if tree is None else tree.get(name)
    t = type(value)
    if node is None and (t in _PLAIN_OUT or (t is str and value.isascii())):
        app[wire_name] = value
    else:
        app[wire_name] = _out_value(value, node, (wire_name,), marks)
