"""Hypothesis strategies for typed values and messages, and an exact comparison for them.

Reusable by every test that needs gateway values: ``scalars()`` (every width-typed scalar,
``bool``, ``str``, ``Char``), ``property_values()`` (what a JMS property may hold),
``typed_arrays()`` (every :data:`gateway.types.ARRAY_TYPES` class), ``nested_values()`` (map
and stream bodies nesting each other, arrays, bytes and ``None``), ``destinations()`` and
``messages()`` (every header, gateway tag and body kind).

``same_value(a, b)`` is stricter than ``==``: ``Int16(5) == 5`` is true in Python, but a
codec that turned one into the other has lost the width, so it also compares ``type()`` at
every level and treats two NaNs of the same type as the same value (and ``-0.0`` as not ``0.0``).
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

from gateway.message import BodyKind, DeliveryMode, Destination, DestKind, Message
from gateway.types import (
    ARRAY_TYPES,
    Char,
    Float32,
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

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# Text with everything a Java string can carry, lone surrogates included.
any_text = st.text(st.characters(exclude_categories=()), max_size=40)
names = st.text(min_size=1, max_size=20)


def _width(t: Any) -> st.SearchStrategy[Any]:
    return st.integers(t.MIN, t.MAX).map(t)


def element_values(element: type) -> st.SearchStrategy[Any]:
    """Values of one typed-array element type (``bool``, a width type, ``Float32``, ``float``)."""
    if element is bool:
        return st.booleans()
    if element is float:
        return st.floats()
    if element is Float32:
        return st.floats(width=32).map(Float32)
    return _width(element)


def scalars() -> st.SearchStrategy[Any]:
    """Every scalar type, each keeping its own Python type (plain ``int`` is not ``Int64``)."""
    return st.one_of(
        st.booleans(),
        st.integers(INT64_MIN, INT64_MAX),
        *(_width(t) for t in (Int8, Int16, Int32, Int64, UInt8, UInt16, UInt32, UInt64)),
        st.floats(),
        st.floats(width=32).map(Float32),
        st.integers(0, 0xFFFF).map(lambda c: Char(chr(c))),
        any_text,
    )


def property_values() -> st.SearchStrategy[Any]:
    """Legal property values (no bytes, maps, streams or arrays: TIBCO EMS User's Guide,
    "Data Type Conversion")."""
    return st.one_of(scalars(), st.none())


def typed_arrays() -> st.SearchStrategy[TypedArray]:
    return st.one_of(
        *(st.lists(element_values(cls.ELEMENT), max_size=8).map(cls) for cls in ARRAY_TYPES)
    )


def nested_values(max_leaves: int = 30) -> st.SearchStrategy[Any]:
    """Anything a map or stream body may hold, nesting maps and streams inside each other."""
    leaves = st.one_of(scalars(), st.binary(max_size=40), st.none(), typed_arrays())
    return st.recursive(
        leaves,
        lambda children: st.one_of(
            st.lists(children, max_size=6),
            st.dictionaries(any_text, children, max_size=6),
        ),
        max_leaves=max_leaves,
    )


def map_bodies() -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(any_text, nested_values(), max_size=8)


def stream_bodies() -> st.SearchStrategy[list[Any]]:
    return st.lists(nested_values(), max_size=8)


def destinations() -> st.SearchStrategy[Destination]:
    return st.builds(Destination, st.sampled_from(list(DestKind)), any_text)


def bodies() -> st.SearchStrategy[tuple[BodyKind, Any]]:
    return st.one_of(
        st.just((BodyKind.NONE, None)),
        any_text.map(lambda t: (BodyKind.TEXT, t)),
        st.binary(max_size=64).map(lambda b: (BodyKind.BYTES, b)),
        st.binary(max_size=64).map(lambda b: (BodyKind.OBJECT, b)),
        map_bodies().map(lambda m: (BodyKind.MAP, m)),
        stream_bodies().map(lambda s: (BodyKind.STREAM, s)),
    )


_times = st.one_of(st.just(0), st.integers(INT64_MIN, INT64_MAX))
_opt_text = st.none() | any_text


@st.composite
def messages(draw: st.DrawFn) -> Message:
    """A message with every JMS header, gateway tag and body kind drawn."""
    kind, body = draw(bodies())
    m = Message(
        body,
        body_kind=kind,
        properties=draw(st.dictionaries(names, property_values(), max_size=6)),
        destination=draw(st.none() | destinations()),
        delivery_mode=draw(st.sampled_from(list(DeliveryMode))),
        priority=draw(st.integers(0, 9)),
        correlation_id=draw(st.none() | any_text | st.binary(max_size=32)),
        reply_to=draw(st.none() | destinations()),
        type=draw(_opt_text),
        expiration=draw(_times),
        delivery_time=draw(_times),
        timestamp=draw(_times),
        message_id=draw(_opt_text),
    )
    m.redelivered = draw(st.booleans())
    m.trace_id = draw(_opt_text)
    m.origin = draw(_opt_text)
    m.hops = draw(st.integers(0, 2**32 - 1))
    m.producer_conn = draw(_opt_text)
    m.expires_at = draw(_times)
    return m


def same_value(a: Any, b: Any) -> bool:
    """Equal and of the same type at every level; NaN equals NaN, -0.0 differs from 0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a):
            return math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


# The attributes a durable encoding keeps (everything but wire, size, store_id and refs).
DURABLE_FIELDS = (
    "destination", "delivery_mode", "expiration", "delivery_time", "priority", "message_id",
    "timestamp", "correlation_id", "reply_to", "type", "redelivered", "properties",
    "body_kind", "body", "trace_id", "origin", "hops", "producer_conn", "expires_at",
)  # fmt: skip


def message_differences(a: Message, b: Message) -> list[str]:
    """Names of the durable fields in which ``a`` and ``b`` differ (by :func:`same_value`)."""
    diffs = []
    for f in DURABLE_FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        if isinstance(x, Destination) or isinstance(y, Destination):
            same = type(x) is type(y) and x == y and x.kind is y.kind
        else:
            same = same_value(x, y)
        if not same:
            diffs.append(f"{f}: {x!r} != {y!r}")
    return diffs
