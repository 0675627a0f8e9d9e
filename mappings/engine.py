"""The declarative mapping engine: YAML rules compiled once into plain functions.

How this works. A mapping file (``<config dir>/mappings/*.yaml``) is a list of *rules*; each
rule has a ``match`` (destination patterns, the direction, and optionally protocols and
transports) and a list of ``steps`` (``decode_json``, ``lift``, ``copy``, ``move``, ``rename``,
``set``, ``default``, ``set_type``, ``drop``, ``require``, ``encode_json``). Loading composes
the YAML into nodes (so every error names file, line and field), parses every field path
once and turns every step into a small closure ``step(msg, work)``; nothing is parsed per
message.

A caller (an adapter or a transport) asks :meth:`MappingSet.compile_for` for the function of
one destination, protocol, direction and transport: the steps of every matching rule, in file
order (files sorted by name), run by one loop; or ``None`` when no rule matches (the fast
path). Answers are cached in a bounded dict. The function never changes the message it is
given (a delivered message is shared by every subscriber): it works on a copy (the fields, a
new property dict and, when a matching rule changes fields inside it, a deep copy of a map or
stream body) and returns the copy, or raises :class:`MappingFailed`; a message is never half
transformed. The copy has no ``wire`` encodings (they would no longer match it).

Field paths are ``header.<JMS name>``, ``property.<name>``, ``body`` and ``body.<key>``,
``body."a.b"``, ``body.list[2]`` into nested maps and streams. Types are the gateway's names
(:data:`gateway.types.SCALAR_TYPES`) or the JMS names (``byte`` … ``double``), converted by the
JMS table (:func:`gateway.types.convert`, seed L1817-1840) plus the three extensions JSON
values need (:func:`_coercer`). ``mappings/README.md`` ("Declarative mappings (YAML)")
documents the format, every step, the matching and the failure behaviour.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from gateway import types as gt
from gateway.errors import ConfigError, ConfigErrors, GatewayError, MessageFormatError
from gateway.message import DEFAULT_PRIORITY, BodyKind, DeliveryMode, Destination, DestKind, Message
from gateway.subject import matches as subject_matches
from gateway.subject import validate as validate_subject
from gateway.types import Char, Float32, Int64, UInt64, convert, type_name
from mappings.mqtt import json_payload

__all__ = ["DIRECTIONS", "PROTOCOLS", "STEP_KINDS", "MappingFailed", "MappingSet"]

PROTOCOLS = ("mqtt", "amqp", "stomp", "rv", "inproc")
DIRECTIONS = ("in", "out", "both")
STEP_KINDS = (
    "decode_json", "encode_json", "lift", "copy", "move", "rename", "set", "default",
    "set_type", "drop", "require",
)  # fmt: skip
TYPE_NAMES = tuple(gt.SCALAR_TYPES) + tuple(n for n in gt.JMS_NAMES if n not in gt.SCALAR_TYPES)
CACHE_SIZE = 4096  # compile_for keys (destination, protocol, direction, transport) kept
_TRANSPORT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # as a transports.conf section

_MISSING: Any = object()  # what reading an absent field gives
_NONE, _TEXT, _BYTES = BodyKind.NONE, BodyKind.TEXT, BodyKind.BYTES
_MAP, _STREAM = BodyKind.MAP, BodyKind.STREAM
_STEP_ERRORS = (GatewayError, ValueError, OverflowError)  # what a step raises for bad data


class MappingFailed(GatewayError):
    """A rule could not be applied to a message; the caller's message was not changed.

    ``str()`` is ``mapping 'RULE' (FILE:LINE) STEP FIELD: DETAIL``; each part is an attribute.
    """

    reason = "mapping-failed"

    def __init__(self, rule: str, file: str, line: int, step: str, field: str, detail: str):
        self.rule, self.file, self.line = rule, file, line
        self.step, self.field, self.detail = step, field, detail
        super().__init__(f"mapping {rule!r} ({file}:{line}) {step} {field}: {detail}")


Step = Callable[[Message], None]


def _copy_message(s: Message, new: Any = object.__new__, cls: type = Message) -> Message:
    """``Message.copy`` written out (5× faster), without ``wire``, ``store_id`` and ``refs``.

    Every slot of :class:`Message` is listed (a unit test checks it)."""
    m: Message = new(cls)
    m.destination, m.delivery_mode, m.expiration = s.destination, s.delivery_mode, s.expiration
    m.delivery_time, m.priority, m.message_id = s.delivery_time, s.priority, s.message_id
    m.timestamp, m.correlation_id, m.reply_to = s.timestamp, s.correlation_id, s.reply_to
    m.type, m.redelivered, m.properties = s.type, s.redelivered, dict(s.properties)
    m.body_kind, m.body, m.trace_id, m.origin = s.body_kind, s.body, s.trace_id, s.origin
    m.hops, m.producer_conn, m.expires_at = s.hops, s.producer_conn, s.expires_at
    m.wire, m.size, m.store_id, m.refs = None, s.size, 0, 0
    return m


def _deep(v: Any) -> Any:
    """A copy of the maps and streams in ``v`` (scalars, bytes and typed arrays are immutable)."""
    t = type(v)
    if t is dict:
        return {k: _deep(x) if type(x) in (dict, list) else x for k, x in v.items()}
    if t is list:
        return [_deep(x) if type(x) in (dict, list) else x for x in v]
    return v


_NUMERIC = frozenset(n for n in gt.SCALAR_TYPES if n[0] in "uif")  # int*, uint*, float*


def _coercer(name: str) -> Callable[[Any], Any]:
    """The conversion to type ``name``: the JMS table (:func:`convert`) with three extensions.

    JSON gives every number as a long or a double and the JMS table never narrows, so a
    number converts to any numeric width its value fits (a float to an integer only when it is
    integral; to ``float32`` rounded), and a one-character string converts to ``char``.
    ``None`` (null) stays ``None``.
    """
    gw = gt.JMS_NAMES.get(name, name)
    cls, numeric, is_number = gt.SCALAR_TYPES[gw], gw in _NUMERIC, gt.is_number

    def coerce(v: Any) -> Any:
        if type(v) is cls or v is None:
            return v
        try:
            if numeric and is_number(v):
                return cls(v)
            if cls is Char and type(v) is str and len(v) == 1:
                return Char(v)
            return convert(v, gw)
        except (ValueError, OverflowError) as exc:
            raise MessageFormatError(f"cannot read {type_name(v)} {v!r} as {name}: {exc}") from None

    return coerce


# -- field paths: header.<name>, property.<name>, body[.<key>|[n]]... ---------------------------


class _Field(NamedTuple):
    """A parsed field path compiled into how to read, write, delete and test it."""

    text: str
    section: str  # "header", "property" or "body"
    path: tuple[str | int, ...]  # (header or property name,) or the keys and indices below body
    read: Callable[[Message], Any]  # the value, or _MISSING
    write: Callable[[Message, Any], None]  # checks (a header: converts) the value
    delete: Callable[[Message], None]  # nothing when absent
    unset: Callable[[Message], bool]  # what ``default`` fills: absent or null (headers: table)


def _text_header(v: Any) -> Any:
    return convert(v, "string")  # every scalar reads as a String; None stays None


def _correlation(v: Any) -> Any:
    return v if type(v) is bytes else convert(v, "string")


def _mode(v: Any) -> DeliveryMode:
    if type(v) is str and v.upper() in DeliveryMode.__members__:
        return DeliveryMode[v.upper()]
    if type(v) is not bool and isinstance(v, int) and v in (1, 2, 22):
        return DeliveryMode(int(v))
    raise MessageFormatError(f"{v!r} is not a delivery mode (PERSISTENT, NON_PERSISTENT, RELIABLE)")


def _int_header(lo: int, hi: int) -> Callable[[Any], int]:
    def coerce(v: Any) -> int:
        n = convert(v, "long") if type(v) is str else v
        if type(n) is bool or not isinstance(n, int) or not lo <= n <= hi:
            raise MessageFormatError(f"{v!r} is not an integer in {lo}..{hi}")
        return int(n)

    return coerce


def _reply_to(v: Any) -> Destination | None:
    if v is None:
        return None
    d = Destination.parse(convert(v, "string"))  # ValueError without topic: / queue:
    validate_subject(d.name, system=True)
    return d


def _same(v: Any) -> Any:
    return v


def _header(get: Callable[[Message], Any], coerce: Callable[[Any], Any] | None,
            attrs: tuple[str, ...] = (), reset: Any = _MISSING,
            unset: Callable[[Message], bool] | None = None) -> _Field:  # fmt: skip
    """A header field: ``coerce`` None is read-only, ``reset`` what ``drop`` puts back."""

    def write(m: Message, v: Any) -> None:
        if coerce is None:
            raise MessageFormatError("read-only")
        v = coerce(v)
        for a in attrs:
            setattr(m, a, v)

    def delete(m: Message) -> None:
        if reset is not _MISSING:
            for a in attrs:
                setattr(m, a, reset)

    return _Field("", "header", (), get, write, delete, unset or (lambda m: False))


def _nullable(attr: str, coerce: Callable[[Any], Any], show: Any = _same) -> _Field:
    def get(m: Message) -> Any:
        v = getattr(m, attr)
        return _MISSING if v is None else show(v)

    return _header(get, coerce, (attr,), None, lambda m: getattr(m, attr) is None)


def _millis(*attrs: str) -> _Field:
    a = attrs[0]
    return _header(lambda m: int(getattr(m, a)), _int_header(0, Int64.MAX), attrs, 0,
                   lambda m: not getattr(m, a))  # fmt: skip


_PRIORITIES = tuple(gt.Int32(p) for p in range(10))  # JMSPriority reads as a JMS int

# The JMS header fields by JMS name (seed L836-929) and what a mapping may do with each.
# Setting JMSExpiration sets the effective expiry too: that is what the mappings out send.
HEADERS: dict[str, _Field] = {
    "JMSType": _nullable("type", _text_header),
    "JMSMessageID": _nullable("message_id", _text_header),
    "JMSCorrelationID": _nullable("correlation_id", _correlation),
    "JMSReplyTo": _nullable("reply_to", _reply_to, str),
    "JMSPriority": _header(lambda m: _PRIORITIES[m.priority], _int_header(0, 9), ("priority",),
                           DEFAULT_PRIORITY, lambda m: m.priority == DEFAULT_PRIORITY),
    "JMSDeliveryMode": _header(lambda m: DeliveryMode(m.delivery_mode).name, _mode,
                               ("delivery_mode",)),
    "JMSExpiration": _millis("expiration", "expires_at"),
    "JMSDeliveryTime": _millis("delivery_time"),
    "JMSTimestamp": _millis("timestamp"),
    "JMSDestination": _header(lambda m: _MISSING if m.destination is None else str(m.destination),
                              None),
    "JMSRedelivered": _header(lambda m: m.redelivered, None),
}  # fmt: skip
_READ_ONLY = frozenset(("JMSDestination", "JMSRedelivered"))  # routing is decided outside
_ALWAYS_SET = frozenset(("JMSDeliveryMode",))  # no null value: never dropped nor defaulted


_PROPERTY_TYPES = frozenset((str, bool, int, float, Float32, Char, type(None)))


def _property_field(text: str, name: str) -> _Field:
    def write(m: Message, v: Any) -> None:
        if type(v) not in _PROPERTY_TYPES:
            gt.check_value(v, nested=False)  # widths pass; bytes, maps, streams, arrays raise
        m.properties[name] = v

    return _Field(
        text, "property", (name,), lambda m: m.properties.get(name, _MISSING), write,
        lambda m: m.properties.pop(name, None), lambda m: m.properties.get(name) is None,
    )  # fmt: skip


def _walk(body: Any, path: Sequence[str | int]) -> Any:
    """The value at ``path`` below ``body``; _MISSING if absent or a step has the wrong kind."""
    cur = body
    for p in path:
        if isinstance(p, str):
            cur = cur.get(p, _MISSING) if type(cur) is dict else _MISSING
        elif type(cur) is list or isinstance(cur, gt.TypedArray):
            cur = cur[p] if -len(cur) <= p < len(cur) else _MISSING
        else:
            return _MISSING
        if cur is _MISSING:
            return _MISSING
    return cur


def _not_a(at: str, p: str | int, cur: Any) -> MessageFormatError:
    have = "null" if cur is None else type_name(cur)
    return MessageFormatError(f"{at} is {have}, not a {'map' if type(p) is str else 'stream'}")


def _body_field(text: str, path: tuple[str | int, ...]) -> _Field:
    if not path:
        return _Field(text, "body", path, _read_body, _write_body, _delete_body,
                      lambda m: m.body_kind is _NONE)  # fmt: skip
    first, last = path[0], path[-1]
    labels = ["body"]  # labels[i]: the text of path[:i], for errors
    for p in path[:-1]:
        labels.append(f"{labels[-1]}[{p}]" if type(p) is int else f"{labels[-1]}.{p}")
    inner = tuple(zip(path[:-1], labels, strict=False))
    if len(path) == 1 and isinstance(first, str):
        def read(m: Message) -> Any:
            b = m.body
            return b.get(first, _MISSING) if type(b) is dict else _MISSING
    else:
        def read(m: Message) -> Any:
            return _walk(m.body, path)

    def parent(m: Message, create: bool) -> Any:
        """The container of the last key or index; _MISSING, or raise if ``create``."""
        kind = m.body_kind
        if kind is _NONE and create and type(first) is str:
            m.body, m.body_kind = {}, _MAP
        elif kind is not _MAP and kind is not _STREAM:
            if create:
                raise MessageFormatError(f"a {kind.name} body has no fields (decode_json first?)")
            return _MISSING
        cur = m.body
        for p, at in inner:
            if isinstance(p, str) and type(cur) is dict:
                nxt = cur.get(p)
                if nxt is None and create:
                    nxt = cur[p] = {}  # a missing (or null) map on the way is made
            elif isinstance(p, int) and type(cur) is list and -len(cur) <= p < len(cur):
                nxt = cur[p]
            elif not create:
                return _MISSING
            elif isinstance(p, int) and type(cur) is list:
                raise MessageFormatError(f"{at} has no element [{p}]")
            else:
                raise _not_a(at, p, cur)
            cur = nxt
        if type(cur) is not (dict if type(last) is str else list):
            if create:
                raise _not_a(labels[-1], last, cur)
            return _MISSING
        return cur

    def write(m: Message, v: Any) -> None:
        c = parent(m, True)
        if isinstance(last, int) and not -len(c) <= last < len(c):
            raise MessageFormatError(f"{text} does not exist (a stream of {len(c)})")
        c[last] = v

    def delete(m: Message) -> None:
        c = parent(m, False)
        if type(c) is dict:
            c.pop(last, None)
        elif type(c) is list and isinstance(last, int) and -len(c) <= last < len(c):
            del c[last]

    def unset(m: Message) -> bool:
        v = read(m)
        return v is _MISSING or v is None

    return _Field(text, "body", path, read, write, delete, unset)


def _read_body(m: Message) -> Any:
    return _MISSING if m.body_kind is _NONE else m.body


_KIND_BY_TYPE: dict[type, BodyKind] = {
    str: _TEXT, Char: _TEXT, bytes: _BYTES, dict: _MAP, list: _STREAM,
}  # fmt: skip


def _write_body(m: Message, v: Any) -> None:
    kind = _NONE if v is None else _KIND_BY_TYPE.get(type(v))
    if kind is None:
        raise MessageFormatError(f"a body cannot be {type_name(v)} (convert it: type: string)")
    m.body, m.body_kind = str(v) if type(v) is Char else v, kind


def _delete_body(m: Message) -> None:
    m.body, m.body_kind = None, _NONE


def parse_field(text: str) -> _Field:
    """Parse and compile a field path (the grammar is in the README); raises ``ValueError``."""
    if text.startswith("header."):
        if text[7:] not in HEADERS:
            raise ValueError(f"unknown header {text[7:]!r} (one of {', '.join(HEADERS)})")
        return HEADERS[text[7:]]._replace(text=text, path=(text[7:],))
    if text.startswith("property."):
        if len(text) == 9:
            raise ValueError("empty property name")
        return _property_field(text, text[9:])
    if text == "body" or text.startswith(("body.", "body[")):
        return _body_field(text, _parse_body_path(text))
    raise ValueError("a field is header.<JMS name>, property.<name>, body or body.<key>...")


_KEY = re.compile(r'\.([^.\["\]]+)|\.("(?:[^"\\]|\\["\\])*")|\[(-?\d+)\]')


def _parse_body_path(s: str) -> tuple[str | int, ...]:
    """``.key``, ``."quoted key"`` (``\\"`` and ``\\\\`` escaped) and ``[n]``, after ``body``."""
    path: list[str | int] = []
    i = 4
    while i < len(s):
        m = _KEY.match(s, i)
        if m is None:
            raise ValueError(f"cannot read a key or [index] at character {i + 1}")
        key, quoted, index = m.groups()
        path.append(int(index) if index else key if key else json.loads(quoted))
        i = m.end()
    if len(path) > gt.MAX_NESTING:
        raise ValueError(f"more than {gt.MAX_NESTING} levels")
    return tuple(path)


# -- steps: each a closure step(msg) made at load -----------------------------------------------


def _step_copy(src: _Field, dst: _Field, coerce: Callable[[Any], Any] | None, move: bool) -> Step:
    read, write, delete = src.read, dst.write, src.delete
    fresh = _deep if src.section == dst.section == "body" and not move else _same  # unshared

    def step(m: Message) -> None:
        v = read(m)
        if v is not _MISSING:
            if coerce is not None:
                v = coerce(v)
            if move:
                delete(m)
            write(m, fresh(v))

    return step


def _step_rename(src: _Field, dst: _Field) -> Step:
    """The new name takes the old one's place (property order and map order are kept)."""
    old, new, below = src.path[-1], str(dst.path[-1]), src.path[:-1]

    def step(m: Message) -> None:
        if src.section == "property":
            if old in m.properties:
                m.properties = {new if k == old else k: v for k, v in m.properties.items()
                                if k != new}  # fmt: skip
            return
        c = _walk(m.body, below) if m.body_kind is _MAP else None
        if type(c) is dict and old in c:
            items = list(c.items())
            c.clear()
            c.update((new if k == old else k, v) for k, v in items if k != new)

    return step


def _step_set(dst: _Field, value: Any, only_unset: bool) -> Step:
    write, unset = dst.write, dst.unset
    fresh = _deep if type(value) in (dict, list) else _same

    def step(m: Message) -> None:
        if not only_unset or unset(m):
            write(m, fresh(value))

    return step


def _step_set_type(f: _Field, coerce: Callable[[Any], Any]) -> Step:
    read, write = f.read, f.write

    def step(m: Message) -> None:
        v = read(m)
        if v is not _MISSING and v is not None:
            c = coerce(v)
            if type(c) is not type(v):
                write(m, c)

    return step


def _step_require(f: _Field) -> Step:
    read = f.read

    def step(m: Message) -> None:
        v = read(m)
        if v is _MISSING or v is None:
            raise MessageFormatError("is missing")

    return step


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _adopt_json(value: Any) -> None:
    """Integers beyond a long become ``UInt64`` (as the STOMP mapping reads JSON), larger ones
    are refused, and nesting is bounded by :data:`MAX_NESTING` as :func:`check_value` does."""
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if depth > gt.MAX_NESTING:
            raise MessageFormatError(f"the JSON body nests deeper than {gt.MAX_NESTING} levels")
        for k, x in v.items() if type(v) is dict else enumerate(v):
            t = type(x)
            if t is int and not Int64.MIN <= x <= Int64.MAX:
                if not 0 <= x <= UInt64.MAX:
                    raise MessageFormatError(f"number {x} fits neither a long nor a uint64")
                v[k] = UInt64(x)
            elif t is dict or t is list:
                stack.append((x, depth + 1))


def _step_decode_json(m: Message) -> None:
    kind = m.body_kind
    if (kind is _TEXT or kind is _BYTES) and m.body:
        try:
            v = json.loads(m.body, parse_constant=_no_constant)
        except RecursionError:
            raise MessageFormatError("the JSON body nests too deep") from None
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
            raise MessageFormatError(f"the body is not JSON: {exc}") from None
        if type(v) is not dict and type(v) is not list:
            raise MessageFormatError(f"the JSON body is {type_name(v)}, not an object or array")
        _adopt_json(v)
        m.body, m.body_kind = v, _MAP if type(v) is dict else _STREAM


def _step_encode_json(as_text: bool) -> Step:
    def step(m: Message) -> None:
        if m.body_kind is _MAP or m.body_kind is _STREAM:
            data = json_payload(m.body)
            m.body, m.body_kind = (data.decode(), _TEXT) if as_text else (data, _BYTES)

    return step


class _Where(NamedTuple):
    rule: str
    file: str
    line: int
    step: str
    field: str


def _run_steps(
    steps: tuple[tuple[Step, _Where], ...], into_body: bool
) -> Callable[[Message], Message]:
    """One function for the steps of every matching rule. ``into_body``: some step changes a
    map or stream body in place, so the (shared) body is copied first."""

    def run(msg: Message) -> Message:
        m = _copy_message(msg)
        if into_body and (m.body_kind is _MAP or m.body_kind is _STREAM):
            m.body = _deep(m.body)
        try:
            for step, _where in steps:
                step(m)
        except _STEP_ERRORS as exc:
            raise MappingFailed(*_where, str(exc)) from exc
        return m

    return run


# -- loading: YAML nodes → rules, every error with file, line and field -------------------------

_Node = yaml.Node
_NULL_TAG = "tag:yaml.org,2002:null"
_FROM_TO, _FIELD_VALUE = ("from", "to"), ("field", "value")
_STEP_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {  # (required, optional)
    "decode_json": ((), ()), "encode_json": ((), ("as",)), "lift": (_FROM_TO, ("type",)),
    "copy": (_FROM_TO, ("type",)), "move": (_FROM_TO, ("type",)), "rename": (_FROM_TO, ()),
    "set": (_FIELD_VALUE, ("type",)), "default": (_FIELD_VALUE, ("type",)),
    "set_type": (("field", "type"), ()),
}  # fmt: skip


class _Rule(NamedTuple):
    patterns: tuple[tuple[DestKind | None, str], ...]
    protocols: frozenset[str] | None
    transports: frozenset[str] | None
    directions: frozenset[str]
    steps: tuple[tuple[Step, _Where], ...]
    into_body: bool  # a step changes a map or stream body in place
    info: dict[str, Any]

    def matches(self, d: Destination, protocol: str, direction: str, transport: str | None) -> bool:
        return (
            direction in self.directions
            and (self.protocols is None or protocol in self.protocols)
            and (self.transports is None or transport in self.transports)
            and any((k is None or k is d.kind) and subject_matches(p, d.name)
                    for k, p in self.patterns)
        )  # fmt: skip


def _problem(f: _Field, use: str) -> str:
    """Why ``f`` cannot be used so (``write``, ``drop``, ``move``, ``default``, ``set_type``)."""
    name = f.path[0] if f.section == "header" else None
    if name in _READ_ONLY and use not in ("copy", "require"):
        return f"{f.text} is read-only"
    if use == "set_type" and (name is not None or f.text == "body"):
        return f"{f.text} has no type to set (set_type takes a property or a body field)"
    if use == "default" and name in _ALWAYS_SET:
        return f"{f.text} always has a value (use set)"
    if use in ("drop", "move") and name in _ALWAYS_SET:
        return f"{f.text} cannot be dropped" + (" (use copy)" if use == "move" else "")
    return ""


def _check_constant(v: Any, depth: int = 0) -> Any:
    """A YAML value as a message value (an int beyond a long → ``UInt64``), or raise."""
    t = type(v)
    if v is None or t in (bool, float, str, bytes):
        return v
    if t is int:
        return v if Int64.MIN <= v <= Int64.MAX else UInt64(v)  # OverflowError beyond
    if depth < gt.MAX_NESTING and t is list:
        return [_check_constant(x, depth + 1) for x in v]
    if depth < gt.MAX_NESTING and t is dict and all(type(k) is str for k in v):
        return {k: _check_constant(x, depth + 1) for k, x in v.items()}
    raise ValueError(f"a YAML {t.__name__} is not a message value (quote it to make a string)")


class _Loader:
    """Builds the rules of one file from its YAML nodes, collecting every error with its line."""

    def __init__(self, file: str, errors: list[ConfigError]) -> None:
        self.file, self.errors = file, errors
        self.constructor = yaml.constructor.SafeConstructor()
        self.into_body = False  # of the rule being read

    def changes(self, *fields: _Field) -> None:
        """Note fields written or removed in place (below ``body``: the body is copied first)."""
        self.into_body = self.into_body or any(f.section == "body" and f.path for f in fields)

    def error(self, node: _Node, field: str, message: str) -> None:
        self.errors.append(ConfigError(self.file, node.start_mark.line + 1, f"{field}: {message}"))

    def mapping(self, node: _Node, field: str, required: Sequence[str],
                optional: Sequence[str] = ()) -> dict[str, _Node] | None:  # fmt: skip
        if not isinstance(node, yaml.MappingNode):
            self.error(node, field, "must be a mapping of keys to values")
            return None
        out: dict[str, _Node] = {}
        for k, v in node.value:
            key = k.value if isinstance(k, yaml.ScalarNode) else None
            if key is None or key not in required and key not in optional:
                known = ", ".join((*required, *optional)) or "none"
                self.error(k, field, f"unknown key {key!r} (known: {known})")
            elif key in out:
                self.error(k, f"{field}.{key}", "given twice")
            else:
                out[key] = v
        missing = [k for k in required if k not in out]
        if missing:
            self.error(node, field, f"missing {missing[0]!r}")
            return None
        return out

    def text(self, node: _Node, field: str) -> str | None:
        if isinstance(node, yaml.ScalarNode) and node.tag != _NULL_TAG and node.value != "":
            return str(node.value)
        self.error(node, field, "must be a text")
        return None

    def texts(self, node: _Node, field: str) -> list[tuple[_Node, str]]:
        """A text or a list of texts, each with its node (for the line of an error)."""
        items = node.value if isinstance(node, yaml.SequenceNode) else [node]
        if not items:
            self.error(node, field, "is an empty list")
        return [(n, t) for n in items if (t := self.text(n, field)) is not None]

    def field(self, node: _Node, label: str, use: str) -> _Field | None:
        text = self.text(node, label)
        if text is None:
            return None
        try:
            f = parse_field(text)
        except ValueError as exc:
            self.error(node, label, f"bad field {text!r}: {exc}")
            return None
        problem = _problem(f, use)
        if problem:
            self.error(node, label, problem)
        return None if problem else f

    def rule(self, node: _Node, index: int) -> _Rule | None:
        where, before = f"mappings[{index}]", len(self.errors)
        self.into_body = False
        top = self.mapping(node, where, ("match", "steps"), ("name",))
        if top is None:
            return None
        line = node.start_mark.line + 1
        name = (self.text(top["name"], f"{where}.name") if "name" in top else None) or (
            f"{self.file}:{line}")  # fmt: skip
        match = self.match(top["match"], f"{where}.match")
        steps: list[tuple[Step, _Where]] = []
        kinds: list[str] = []
        if not isinstance(top["steps"], yaml.SequenceNode) or not top["steps"].value:
            self.error(top["steps"], f"{where}.steps", "must be a list of one or more steps")
        else:
            for i, s in enumerate(top["steps"].value):
                made = self.step(s, f"{where}.steps[{i}]", name)
                steps.extend(made)
                if made:
                    kinds.append(made[0][1].step)
        if match is None or len(self.errors) > before:
            return None
        patterns, protocols, transports, directions, info = match
        info = {"name": name, "file": self.file, "line": line, "match": info,
                "steps": kinds}  # fmt: skip
        return _Rule(patterns, protocols, transports, directions, tuple(steps), self.into_body,
                     info)  # fmt: skip

    def match(self, node: _Node, where: str) -> Any:
        m = self.mapping(node, where, ("destination", "direction"), ("protocol", "transport"))
        if m is None:
            return None
        patterns: list[tuple[DestKind | None, str]] = []
        destinations = self.texts(m["destination"], f"{where}.destination")
        for n, text in destinations:
            prefixed = text.startswith(("topic:", "queue:"))
            kind, name = (text[:5], text[6:]) if prefixed else ("", text)
            try:
                validate_subject(name, wildcards=True, system=True)
                patterns.append((DestKind[kind.upper()] if kind else None, name))
            except GatewayError as exc:
                self.error(n, f"{where}.destination", str(exc))
        info: dict[str, Any] = {"destination": [t for _, t in destinations]}
        filters: list[frozenset[str] | None] = []
        for key in ("protocol", "transport"):
            values: list[str] = []
            for n, text in self.texts(m[key], f"{where}.{key}") if key in m else ():
                if key == "protocol" and text not in PROTOCOLS:
                    self.error(n, f"{where}.protocol",
                               f"unknown protocol {text!r} (one of {', '.join(PROTOCOLS)})")
                elif key == "transport" and not _TRANSPORT_NAME.fullmatch(text):
                    self.error(n, f"{where}.transport", f"invalid transport name {text!r}")
                values.append(text)
            filters.append(frozenset(values) if key in m else None)
            info[key] = values if key in m else None
        direction = info["direction"] = self.text(m["direction"], f"{where}.direction")
        if direction is not None and direction not in DIRECTIONS:
            self.error(m["direction"], f"{where}.direction",
                       f"must be in, out or both, not {direction!r}")  # fmt: skip
        directions = frozenset(("in", "out") if direction == "both" else (direction,))
        return tuple(patterns), filters[0], filters[1], directions, info

    def step(self, node: _Node, where: str, rule: str) -> list[tuple[Step, _Where]]:
        kinds = ", ".join(STEP_KINDS)
        if not isinstance(node, yaml.MappingNode) or len(node.value) != 1:
            self.error(node, where, f"a step is one key, its kind ({kinds}), with its arguments")
            return []
        key_node, args = node.value[0]
        kind = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else ""
        if kind not in STEP_KINDS:
            self.error(key_node, where, f"unknown step {kind!r} (one of {kinds})")
            return []
        label, line = f"{where}.{kind}", node.start_mark.line + 1

        def at(field: str) -> _Where:
            return _Where(rule, self.file, line, kind, field)

        if kind in ("drop", "require"):
            fields = [f for n, _ in self.texts(args, label) if (f := self.field(n, label, kind))]
            if kind == "require":
                return [(_step_require(f), at(f.text)) for f in fields]
            self.changes(*fields)
            return [(f.delete, at(f.text)) for f in fields]
        required, optional = _STEP_KEYS[kind]
        empty = isinstance(args, yaml.ScalarNode) and args.tag == _NULL_TAG and not required
        a = {} if empty else self.mapping(args, label, required, optional)
        if a is None:
            return []
        if kind == "decode_json":
            return [(_step_decode_json, at("body"))]
        if kind == "encode_json":
            form = self.text(a["as"], f"{label}.as") if "as" in a else "text"
            if form not in ("text", "bytes", None):
                self.error(a["as"], f"{label}.as", f"must be text or bytes, not {form!r}")
            return [(_step_encode_json(form != "bytes"), at("body"))]
        coerce = None
        if "type" in a:
            t = self.text(a["type"], f"{label}.type")
            if t not in TYPE_NAMES:
                if t is not None:
                    self.error(a["type"], f"{label}.type",
                               f"unknown type {t!r} (one of {', '.join(TYPE_NAMES)})")
                return []
            coerce = _coercer(t)
        if kind in ("set", "default", "set_type"):
            f = self.field(a["field"], f"{label}.field", kind if kind != "set" else "write")
            if f is None:
                return []
            self.changes(f)
            if kind == "set_type" and coerce is not None:
                return [(_step_set_type(f, coerce), at(f.text))]
            try:  # a constant is converted once, and tried on an empty message
                value = _check_constant(self.constructor.construct_object(a["value"], deep=True))
                value = coerce(value) if coerce is not None else value
                if f.section != "body" or not f.path:  # any value may go into a body field
                    f.write(Message(), value)
            except (yaml.YAMLError, *_STEP_ERRORS) as exc:
                self.error(a["value"], f"{label}.value", f"cannot go in {f.text}: {exc}")
                return []
            return [(_step_set(f, value, kind == "default"), at(f.text))]
        moves = kind in ("move", "rename")
        src = self.field(a["from"], f"{label}.from", "move" if moves else "copy")
        dst = self.field(a["to"], f"{label}.to", "write")
        if src is None or dst is None:
            return []
        problem = ""
        if src.text == dst.text:
            problem = "from and to are the same field"
        elif kind == "lift" and (src.section != "body" or dst.section == "body"):
            problem = "lift takes a body field to a property or a header (else use copy or move)"
        elif kind == "rename" and not (
            src.section == dst.section == "property" or src.section == dst.section == "body"
            and src.path and dst.path and src.path[:-1] == dst.path[:-1]
            and type(src.path[-1]) is str and type(dst.path[-1]) is str
        ):  # fmt: skip
            problem = "rename gives a property or map field a new name in its place (else move)"
        if problem:
            self.error(node, label, problem)
            return []
        self.changes(dst, *([src] if kind in ("move", "rename") else []))
        made = _step_rename(src, dst) if kind == "rename" else _step_copy(
            src, dst, coerce, kind == "move")  # fmt: skip
        return [(made, at(f"{src.text} -> {dst.text}"))]


def _load_text(text: str, file: str, errors: list[ConfigError]) -> list[_Rule]:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        errors.append(ConfigError(file, line, f"not valid YAML: {exc.problem or exc.context}"))
        return []
    except yaml.YAMLError as exc:
        errors.append(ConfigError(file, None, f"not valid YAML: {exc}"))
        return []
    if root is None:
        return []  # an empty file
    loader = _Loader(file, errors)
    top = loader.mapping(root, "top level", ("mappings",))
    if top is None:
        return []
    if not isinstance(top["mappings"], yaml.SequenceNode):
        loader.error(top["mappings"], "mappings", "must be a list of rules")
        return []
    rules = (loader.rule(node, i) for i, node in enumerate(top["mappings"].value))
    return [r for r in rules if r is not None]


class MappingSet:
    """The compiled rules of one or more mapping files, in order."""

    def __init__(self, rules: Sequence[_Rule] = (), *, cache_size: int = CACHE_SIZE) -> None:
        self._rules = tuple(rules)
        self._cache: dict[tuple[Destination, str, str, str | None], Any] = {}
        self._cache_size = cache_size

    @classmethod
    def load(cls, paths: Iterable[str | Path], *, cache_size: int = CACHE_SIZE) -> MappingSet:
        """Load the files, and the ``*.yaml`` files of the directories (by name), in order.

        Raises:
            ConfigErrors: every problem found, each as ``file:line: field: message``.
        """
        errors: list[ConfigError] = []
        rules: list[_Rule] = []
        for p in map(Path, paths):
            for f in sorted(p.glob("*.yaml")) if p.is_dir() else [p]:
                try:
                    text = f.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError) as exc:
                    errors.append(ConfigError(str(f), None, f"cannot read: {exc}"))
                    continue
                rules.extend(_load_text(text, str(f), errors))
        if errors:
            raise ConfigErrors(errors)
        return cls(rules, cache_size=cache_size)

    @classmethod
    def from_text(cls, text: str, filename: str = "<text>") -> MappingSet:
        """The rules of YAML ``text``; raises :class:`ConfigErrors` as :meth:`load` does."""
        errors: list[ConfigError] = []
        rules = _load_text(text, filename, errors)
        if errors:
            raise ConfigErrors(errors)
        return cls(rules)

    def compile_for(self, destination: Destination, *, protocol: str, direction: str,
                    transport: str | None = None) -> Callable[[Message], Message] | None:
        """The function mapping messages of ``destination``, or ``None`` if no rule matches.

        ``protocol``: the adapter's or transport's (``mqtt``, ``amqp``, ``stomp``, ``rv``,
        ``inproc``). ``direction``: ``in`` (after the protocol's default mapping into the core)
        or ``out`` (before the default mapping out of it). ``transport``: the
        ``transports.conf`` name, ``None`` for an adapter's client. The function returns a new
        message, leaves its argument alone, and raises :class:`MappingFailed`. Cached per key
        (a hit is one dict lookup).
        """
        key = (destination, protocol, direction, transport)
        fn = self._cache.get(key, _MISSING)
        if fn is not _MISSING:
            return fn  # type: ignore[no-any-return]
        if protocol not in PROTOCOLS or direction not in ("in", "out"):
            raise ValueError(f"unknown protocol {protocol!r} or direction {direction!r}")
        rules = [r for r in self._rules if r.matches(destination, protocol, direction, transport)]
        steps = tuple(s for r in rules for s in r.steps)
        fn = _run_steps(steps, any(r.into_body for r in rules)) if steps else None
        cache = self._cache
        if len(cache) >= self._cache_size:
            for k in list(islice(cache, (len(cache) + 1) // 2)):  # drop the older half
                del cache[k]
        if self._cache_size:
            cache[key] = fn
        return fn

    def apply(self, msg: Message, *, protocol: str, direction: str,
              transport: str | None = None) -> Message:
        """``msg`` through the rules that match its destination (itself when none match).

        Raises:
            MappingFailed: a step failed; the message is refused (in) or not sent (out).
        """
        dest = msg.destination
        if dest is None or not self._rules:
            return msg
        fn = self.compile_for(dest, protocol=protocol, direction=direction, transport=transport)
        return msg if fn is None else fn(msg)

    def rules(self) -> list[dict[str, Any]]:
        """Each rule's name, file, line, match and step kinds, in order (for the admin API)."""
        return [dict(r.info) for r in self._rules]

    def __len__(self) -> int:
        return len(self._rules)

    @property
    def cache_len(self) -> int:
        return len(self._cache)
