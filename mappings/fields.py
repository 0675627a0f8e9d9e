"""Field paths and steps of the declarative mapping engine (:mod:`mappings.engine`).

How this works. Every field path of a mapping file is parsed once, when the file is loaded,
into a :class:`_Field`: four small functions that read, write, delete and test one field of a
message (``header.<JMS name>``, ``property.<name>``, ``body``, ``body.<key>``,
``body."a.b"``, ``body.list[2]`` into nested maps and streams, and the gateway's own
``trace_id``, ``expiry`` and ``body_kind``; the ``wire.…`` fields of a protocol's own form
are :mod:`mappings.wire`'s). Every step becomes a closure ``step(msg)`` over those functions,
so nothing is parsed per message. Types are the gateway's names
(:data:`gateway.types.SCALAR_TYPES`) or the JMS names (``byte`` … ``double``), converted by the
JMS table (:func:`gateway.types.convert`, TIBCO EMS User's Guide, "Data Type Conversion") plus
the three extensions JSON values need (:func:`_coercer`). ``mappings/README.md``
("Declarative mappings (YAML)") documents every path and step.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from gateway import types as gt
from gateway.errors import GatewayError, MessageFormatError
from gateway.message import DEFAULT_PRIORITY, BodyKind, DeliveryMode, Destination, Message
from gateway.subject import validate as validate_subject
from gateway.types import Char, Float32, Int64, UInt64, convert, type_name
from mappings.typedtext import json_payload

TYPE_NAMES = tuple(gt.SCALAR_TYPES) + tuple(n for n in gt.JMS_NAMES if n not in gt.SCALAR_TYPES)

_MISSING: Any = object()  # what reading an absent field gives
_NONE, _TEXT, _BYTES = BodyKind.NONE, BodyKind.TEXT, BodyKind.BYTES
_MAP, _STREAM = BodyKind.MAP, BodyKind.STREAM
_STEP_ERRORS = (GatewayError, ValueError, OverflowError)  # what a step raises for bad data


Step = Callable[[Message], None]


def _copy_message(s: Message, new: Any = Message.__new__, cls: type = Message) -> Message:
    """``Message.copy`` written out (5× faster), without ``wire``, ``store_id``, ``refs`` and
    ``log_head``.

    Every slot of :class:`Message` is listed (a unit test checks it)."""
    m: Message = new(cls)
    m.destination, m.delivery_mode, m.expiration = s.destination, s.delivery_mode, s.expiration
    m.delivery_time, m.priority, m.message_id = s.delivery_time, s.priority, s.message_id
    m.timestamp, m.correlation_id, m.reply_to = s.timestamp, s.correlation_id, s.reply_to
    m.type, m.redelivered, m.properties = s.type, s.redelivered, dict(s.properties)
    m.body_kind, m.body, m.trace_id, m.origin = s.body_kind, s.body, s.trace_id, s.origin
    m.hops, m.producer_conn, m.expires_at = s.hops, s.producer_conn, s.expires_at
    m.wire, m.size, m.store_id, m.refs, m.log_head = None, s.size, 0, 0, None
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
    section: str  # "header", "property", "body", "properties", "gateway" or "wire"
    path: tuple[str | int, ...]  # (header or property name,) or the keys and indices below body
    read: Callable[[Message], Any]  # the value, or _MISSING
    write: Callable[[Message, Any], None]  # checks (a header: converts) the value
    delete: Callable[[Message], None]  # nothing when absent
    unset: Callable[[Message], bool]  # what ``default`` fills: absent or null (headers: table)
    fixed: str = ""  # why the field cannot be written or removed ("" when it can)
    core: Callable[[Any], Any] | None = None  # a wire value → a core value (copied off the wire)


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
    if v is None or type(v) is Destination:  # a converter's Destination is the protocol's own
        return v  # type: ignore[no-any-return]
    d = Destination.parse(convert(v, "string"))  # ValueError without topic: / queue:
    validate_subject(d.name, system=True)
    return d


def _same(v: Any) -> Any:
    return v


class Kept(NamedTuple):
    """A converter's value that a protocol mapping keeps as it is, although a user rule could
    not write it there: a property JMS has no type for (an AMQP binary ``user-id`` as
    ``JMSXUserID``), a time before 1970 (AMQP times are signed), an AMQP body."""

    value: Any


def _header(get: Callable[[Message], Any], coerce: Callable[[Any], Any] | None,
            attrs: tuple[str, ...] = (), reset: Any = _MISSING,
            unset: Callable[[Message], bool] | None = None) -> _Field:  # fmt: skip
    """A header field: ``coerce`` None is read-only, ``reset`` what ``drop`` puts back."""

    def write(m: Message, v: Any) -> None:
        if coerce is None:
            raise MessageFormatError("read-only")
        v = v.value if type(v) is Kept else coerce(v)  # Kept: a protocol mapping's own value
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

# The JMS header fields by JMS name (EMS User's Guide, "JMS Message Header Fields") and what a
# mapping may do with each. Setting JMSExpiration sets the effective expiry too: that is what
# the mappings out send.
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
        if type(v) is Kept:
            m.properties[name] = v.value
            return
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


class Body(NamedTuple):
    """A body with its kind, as a converter gives it (``OBJECT`` cannot be told from bytes)."""

    kind: BodyKind
    value: Any


def _write_body(m: Message, v: Any) -> None:
    if type(v) is Body:
        m.body_kind, m.body = v.kind, v.value
        return
    kind = _NONE if v is None else _KIND_BY_TYPE.get(type(v))
    if kind is None:
        raise MessageFormatError(f"a body cannot be {type_name(v)} (convert it: type: string)")
    m.body, m.body_kind = str(v) if type(v) is Char else v, kind


def _delete_body(m: Message) -> None:
    m.body, m.body_kind = None, _NONE


def _read_only(text: str, section: str, read: Callable[[Message], Any], why: str) -> _Field:
    def write(m: Message, v: Any = None) -> None:
        raise MessageFormatError(why)

    return _Field(text, section, (), read, write, write, lambda m: read(m) is _MISSING, why)


def _write_trace(m: Message, v: Any) -> None:
    m.trace_id = None if v is None else convert(v, "string")


def _write_properties(m: Message, v: Any) -> None:
    if type(v) is not dict:
        raise MessageFormatError(f"the properties are a map, not {type_name(v)}")
    m.properties = v


# The gateway's own fields: the trace id, the effective expiry, the body kind, the properties.
GATEWAY_FIELDS: dict[str, _Field] = {
    "trace_id": _Field(
        "trace_id", "gateway", (), lambda m: _MISSING if m.trace_id is None else m.trace_id,
        _write_trace, lambda m: _write_trace(m, None), lambda m: m.trace_id is None),
    "expiry": _read_only(
        "expiry", "gateway", lambda m: m.expires_at or m.expiration,
        "expiry is read-only (it is JMSExpiration, or the destination's override)"),
    "body_kind": _read_only(
        "body_kind", "gateway", lambda m: m.body_kind.name,
        "body_kind is read-only (writing body sets it)"),
    "property.*": _Field(
        "property.*", "properties", (), lambda m: m.properties, _write_properties,
        lambda m: _write_properties(m, {}), lambda m: not m.properties),
}  # fmt: skip


def parse_field(text: str, wire: Callable[[str], _Field] | None = None) -> _Field:
    """Parse and compile a field path (the grammar is in the README); raises ``ValueError``.

    ``wire`` parses what follows ``wire.`` (the protocol's own form, :mod:`mappings.wire`);
    without it a ``wire.`` path is refused."""
    if text.startswith("header."):
        if text[7:] not in HEADERS:
            raise ValueError(f"unknown header {text[7:]!r} (one of {', '.join(HEADERS)})")
        return HEADERS[text[7:]]._replace(text=text, path=(text[7:],))
    if text in GATEWAY_FIELDS:
        return GATEWAY_FIELDS[text]
    if text.startswith("property."):
        if len(text) == 9:
            raise ValueError("empty property name")
        return _property_field(text, text[9:])
    if text == "body" or text.startswith(("body.", "body[")):
        return _body_field(text, _parse_body_path(text))
    if text.startswith("wire."):
        if wire is None:
            raise ValueError("a wire field needs one protocol with a wire form (match.protocol) "
                             "and one direction")
        return wire(text[5:])
    raise ValueError("a field is header.<JMS name>, property.<name>, property.*, body, "
                     "body.<key>..., trace_id, expiry, body_kind or wire.<field>")


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
    fresh: Callable[[Any], Any] = (
        _deep if src.section == dst.section == "body" and not move else _same)  # unshared
    if src.core is not None and dst.section != "wire":  # off the wire: a core value (AMQP)
        fresh = src.core

    def step(m: Message) -> None:
        v = read(m)
        if v is not _MISSING:
            if fresh is not _same:
                v = fresh(v)
            if coerce is not None:
                v = coerce(v)
            if move:
                delete(m)
            write(m, v)

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


SKIP: Any = _MISSING  # a converter's answer for "write nothing" (and what an absent field reads)


class Converter(NamedTuple):
    """A named conversion (:mod:`mappings.converters`): ``fn(msg, *values)``.

    ``sources`` and ``targets`` are how many fields it reads and writes (``convert``'s
    ``from`` and ``to``); an ``item`` converter is ``copy_all``'s ``via``:
    ``fn(msg, name, value)`` gives ``(name, value)`` or :data:`SKIP`."""

    fn: Callable[..., Any]
    sources: int
    targets: int
    item: bool = False
    named: bool = False  # fn(msg, target name, *values): the name of the (first) target


def _step_convert(srcs: Sequence[_Field], dsts: Sequence[_Field], conv: Converter) -> Step:
    """``convert``: read every source (absent as None), call the converter, write its answer
    (one value per target; :data:`SKIP` writes nothing)."""
    reads = tuple(f.read for f in srcs)
    writes = tuple(f.write for f in dsts)
    fn = conv.fn
    if conv.named:
        target, plain = str(dsts[0].path[-1]), fn

        def fn(m: Message, *values: Any) -> Any:
            return plain(m, target, *values)
    if len(writes) == 1:
        (write,) = writes

        def step(m: Message) -> None:
            v = fn(m, *[None if x is _MISSING else x for x in (r(m) for r in reads)])
            if v is not _MISSING:
                write(m, v)

        return step

    def step_many(m: Message) -> None:
        out = fn(m, *[None if x is _MISSING else x for x in (r(m) for r in reads)])
        for w, v in zip(writes, out, strict=True):
            if v is not _MISSING:
                w(m, v)

    return step_many


class Section(NamedTuple):
    """A set of named fields ``copy_all`` reads or writes: the properties, a protocol's
    headers or user properties."""

    text: str
    items: Callable[[Message], Any]  # the (name, value) pairs, in order
    put: Callable[[Message, str, Any], None]  # one more; what "more" means is the section's
    fixed: str = ""  # why it cannot be written ("" when it can)
    empty: bool = False  # the empty name is a name here (AMQP), not skipped
    core: Callable[[Any], Any] | None = None  # a value as a core value (copied off the wire)


def _put_property(m: Message, name: str, v: Any) -> None:
    """The first value of a name counts (STOMP and MQTT both say so of repeated names)."""
    m.properties.setdefault(name, v)


PROPERTIES = Section("property", lambda m: m.properties.items(), _put_property)


def _step_copy_all(src: Section, dst: Section, skip: frozenset[str],
                   via: Callable[..., Any] | None) -> Step:
    """``copy_all``: every field of ``src`` not named in ``except`` (and not named ``""``)
    into ``dst``, in order, by the item converter ``via`` if given. (AMQP names are kept
    when empty, and its annotation keys may be ulongs: ``0`` is a name.)"""
    items, put = src.items, dst.put
    empty = src.empty or dst.empty
    core = src.core if via is None and dst.core is None else None  # off the wire, as is

    def step(m: Message) -> None:
        for name, v in list(items(m)):
            if (empty or name != "") and name not in skip:
                if core is not None:  # an AMQP key (symbol, ulong) and value off the wire
                    put(m, str(name), core(v))
                elif via is None:
                    put(m, name, v)
                else:
                    out = via(m, name, v)
                    if out is not _MISSING:
                        put(m, out[0], out[1])

    return step
