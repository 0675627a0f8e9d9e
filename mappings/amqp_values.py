"""AMQP 1.0 values ⇄ core values, and the types record (``JMS_GW_AMQP_TYPES``).

How this works. AMQP has types the core lacks (timestamp, uuid, symbol, decimals, described
values, arrays of anything, maps with any keys) and the core makes distinctions AMQP cannot
(``Int64`` versus a plain ``int``, strings with lone surrogates). Neither side drops a value:
:func:`_in_value` and :func:`_out_value` convert each value to its nearest own value and write
what it was into ``marks``, entries ``[where, path..., type]`` of one compact JSON list (the
types record, ``mappings/README.md`` "Types record"), which the other direction reads
(:func:`_parse_record`, a tree of nodes) to restore the exact value. Values are converted
copy-on-write: a map or list with nothing to convert is passed on as it is, never copied. The
string fields proton cannot carry are %-escaped and recorded (:func:`_escape`). Split out of
:mod:`mappings.amqp` (the mapping's rows), which uses these for every value it maps.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import Any
from uuid import UUID

import proton
from proton import UNDESCRIBED, Array, Data, Described, symbol, ulong

from gateway import types as gt
from mappings.typedtext import wire_escape, wire_unescape

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
