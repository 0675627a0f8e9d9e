"""The AMQP fast path (mappings/amqp_fast.py, amqp_fast_out.py) against the default mapping,
both ways.

The reference is always the slow path run on the same input: ``proton.Message().decode()`` then
``amqp_to_message`` for :func:`decode`, ``message_to_amqp(...).encode()`` for :func:`encode`.
Messages are compared slot by slot with the exact type of every value (``Int8(5)`` is not
``5``), bytes byte for byte. Inputs inside the subset must be taken (else a fast path that
always declined would pass); inputs outside it must be declined; garbage must give ``None`` or
the slow path's own answer, and nothing may raise.

The wire messages are built here with a small encoder of our own (AMQP 1.0 Part 1 §1.6), which
can pick the wide or the compact form of every value (proton-c writes only the compact ones;
proton-j, rhea and others choose differently), as well as by proton itself. A few vectors are
written out as Qpid JMS, rhea and python-qpid-proton send them, with their expected core
messages spelled out literally.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

import proton
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proton import symbol
from strategies import messages, same_value

from gateway.message import (
    MESSAGE_SLOTS,
    QUEUE,
    TOPIC,
    BodyKind,
    DeliveryMode,
    Destination,
    DestKind,
    Message,
)
from gateway.types import Char, Float32, Int8, Int16, Int32, Int64, UInt8, UInt16, UInt32, UInt64
from mappings import amqp_fast, amqp_fast_out
from mappings.amqp import (
    CONTENT_ENCODING_PROPERTY,
    CONTENT_TYPE_PROPERTY,
    PRIORITY_PROPERTY,
    REPLY_TO_GROUP_ID_PROPERTY,
    REPLY_TO_PROPERTY,
    TYPES_PROPERTY,
    amqp_to_message,
    message_to_amqp,
)
from mappings.amqp_address import parse_address

T0 = 1_700_000_000_000
DEST = Destination.queue("orders")
SERIALIZED = "application/x-java-serialized-object"
SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# == the two paths ==============================================================================


class SlowFailed(Exception):
    """The default mapping (or proton's decode before it) raised."""


def slow_decode(
    data: bytes, *, destination: Destination | None = DEST, kind: DestKind = QUEUE, now: int = T0
) -> Message:
    """proton's decode and ``amqp_to_message``; ``destination=None`` resolves ``to`` as the
    AMQP adapter does for an anonymous link (adapters/amqp/links.py ``on_delivery``)."""
    try:
        pm = proton.Message()
        pm.decode(data)
        if destination is None:
            if not pm.address:
                raise ValueError("no address")
            ann = pm.annotations
            hint = ann.get(symbol("x-opt-jms-dest")) if ann else None
            destination = parse_address(pm.address, hint=hint, default=kind)
        return amqp_to_message(pm, destination=destination, default_kind=kind, now_ms=now)
    except Exception as exc:
        raise SlowFailed(repr(exc)) from exc


def fast_decode(
    data: bytes, *, destination: Destination | None = DEST, kind: DestKind = QUEUE, now: int = T0
) -> Message | None:
    return amqp_fast.decode(data, destination=destination, default_kind=kind, now_ms=now)


def differences(a: Message, b: Message) -> list[str]:
    """Every slot of the two messages that differs, by value and exact type at every level."""
    out = []
    for f in MESSAGE_SLOTS:
        x, y = getattr(a, f), getattr(b, f)
        if f in ("destination", "reply_to"):
            same = (
                x is None
                and y is None
                or (
                    type(x) is Destination
                    and type(y) is Destination
                    and x == y
                    and x.kind is y.kind
                )
            )
        elif f in ("delivery_mode", "body_kind"):
            same = x is y
        elif f == "properties":
            same = same_value(x, y) and [type(k) for k in x] == [type(k) for k in y]
        else:
            same = same_value(x, y)
        if not same:
            out.append(f"{f}: {x!r} != {y!r}")
    return out


def assert_decodes_same(data: bytes, *, taken: bool, **kw: Any) -> Message | None:
    """``taken``: the fast path must give a message (equal to the slow path's); otherwise
    it may also decline. Either way it must never give a different answer or raise."""
    fast = fast_decode(data, **kw)
    try:
        slow = slow_decode(data, **kw)
    except SlowFailed as exc:
        assert fast is None, f"the slow path fails ({exc}) but the fast one gave {fast!r}"
        assert not taken, f"expected a message, the slow path failed: {exc}"
        return None
    if taken:
        assert fast is not None, f"declined: {data.hex(' ')}"
    if fast is not None:
        assert not differences(fast, slow), differences(fast, slow)
    return fast


def assert_encodes_same(msg: Message, *, taken: bool, count: int = 1, now: int = T0) -> None:
    fast = amqp_fast_out.encode(msg, delivery_count=count, now_ms=now)
    try:
        slow = message_to_amqp(msg, delivery_count=count, now_ms=now).encode()
    except Exception as exc:
        assert fast is None, f"the slow path fails ({exc!r}) but the fast one encoded"
        assert not taken, repr(exc)
        return
    if taken:
        assert fast is not None, f"declined: {msg!r}"
    if fast is not None:
        assert fast.hex(" ") == slow.hex(" ")


# == an AMQP encoder of our own (Part 1 §1.6), compact or wide forms ==========================

_FIXED = {
    "ubyte": (0x50, ">B"), "byte": (0x51, ">b"), "ushort": (0x60, ">H"), "short": (0x61, ">h"),
    "float": (0x72, ">f"), "double": (0x82, ">d"), "char": (0x73, ">I"),
    "timestamp": (0x83, ">q"),
}  # fmt: skip
_VARIABLE = {"binary": (0xA0, 0xB0), "string": (0xA1, 0xB1), "symbol": (0xA3, 0xB3)}


def enc(tag: str, v: Any, wide: bool = False) -> bytes:
    """One value: ``tag`` is its AMQP type; ``wide`` picks the widest form of it."""
    if tag == "null":
        return b"\x40"
    if tag == "bool":
        return bytes((0x56, int(v))) if wide else b"\x41" if v else b"\x42"
    if tag in _FIXED:
        code, fmt = _FIXED[tag]
        return bytes((code,)) + struct.pack(fmt, v)
    if tag in ("uint", "ulong"):
        zero, small, big, fmt = (
            (0x43, 0x52, 0x70, ">I") if tag == "uint" else (0x44, 0x53, 0x80, ">Q")
        )
        if not wide and v == 0:
            return bytes((zero,))
        if not wide and v < 256:
            return bytes((small, v))
        return bytes((big,)) + struct.pack(fmt, v)
    if tag in ("int", "long"):
        small, big, fmt = (0x54, 0x71, ">i") if tag == "int" else (0x55, 0x81, ">q")
        if not wide and -128 <= v <= 127:
            return bytes((small,)) + struct.pack(">b", v)
        return bytes((big,)) + struct.pack(fmt, v)
    if tag == "uuid":
        return b"\x98" + v.bytes
    if tag in _VARIABLE:
        raw = v.encode() if isinstance(v, str) else v
        c8, c32 = _VARIABLE[tag]
        if wide or len(raw) > 255:
            return bytes((c32,)) + struct.pack(">I", len(raw)) + raw
        return bytes((c8, len(raw))) + raw
    raise AssertionError(tag)


def enc_list(items: list[bytes], wide: bool = False) -> bytes:
    content = b"".join(items)
    if not items and not wide:
        return b"\x45"
    if not wide and len(content) + 1 <= 255 and len(items) <= 255:
        return bytes((0xC0, len(content) + 1, len(items))) + content
    return b"\xd0" + struct.pack(">II", len(content) + 4, len(items)) + content


def enc_map(pairs: list[bytes], wide: bool = False) -> bytes:
    """``pairs``: each key and value encoded and joined."""
    content = b"".join(pairs)
    if not wide and len(content) + 1 <= 255:
        return bytes((0xC1, len(content) + 1, 2 * len(pairs))) + content
    return b"\xd1" + struct.pack(">II", len(content) + 4, 2 * len(pairs)) + content


def section(code: int, value: bytes, long_descriptor: bool = False) -> bytes:
    if long_descriptor:
        return b"\x00\x80" + struct.pack(">Q", code) + value
    return bytes((0x00, 0x53, code)) + value


HEADER, DELIVERY_ANN, MESSAGE_ANN, PROPERTIES, APP_PROPS = 0x70, 0x71, 0x72, 0x73, 0x74
DATA, SEQUENCE, VALUE, FOOTER = 0x75, 0x76, 0x77, 0x78


# == strategies ===============================================================================

# AMQP strings (UTF-8: no lone surrogate); C-string fields also hold no U+0000.
amqp_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=30)
c_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=30)
ascii_text = st.text(st.characters(max_codepoint=127, exclude_characters="\x00"), max_size=30)
ids_text = st.one_of(
    amqp_text,
    st.sampled_from(["ID:AMQP_ULONG:5", "ID:AMQP_UUID:00000000-0000-0000-0000-000000000001",
                     "ID:AMQP_BINARY:0A0B", "ID:AMQP_STRING:ID:AMQP_ULONG:5", "ID:AMQP_ULONG:007",
                     "ID:AMQP_BINARY:0a0b", "ID:c3c1d5e2-1:1:1:1-1"]),
)  # fmt: skip
widths = st.booleans()  # compact or wide form


def _ranged(tag: str, lo: int, hi: int) -> st.SearchStrategy[tuple[str, Any]]:
    return st.integers(lo, hi).map(lambda v: (tag, v))


def typed_scalars() -> st.SearchStrategy[tuple[str, Any]]:
    """AMQP scalars the default mapping maps to core types without a types record."""
    return st.one_of(
        st.just(("null", None)),
        st.booleans().map(lambda v: ("bool", v)),
        _ranged("ubyte", 0, 255), _ranged("byte", -128, 127),
        _ranged("ushort", 0, 0xFFFF), _ranged("short", -(2**15), 2**15 - 1),
        _ranged("uint", 0, 2**32 - 1), _ranged("int", -(2**31), 2**31 - 1),
        _ranged("ulong", 0, 2**64 - 1), _ranged("long", -(2**63), 2**63 - 1),
        st.sampled_from([0, 1, 127, 128, 255, 256, -1, -128, -129]).flatmap(
            lambda v: st.sampled_from(["int", "long"]).map(lambda t: (t, v))
        ),
        st.floats(width=32).map(lambda v: ("float", v)),
        st.floats().map(lambda v: ("double", v)),
        _ranged("char", 0, 0xFFFF),
        amqp_text.map(lambda v: ("string", v)),
        st.binary(max_size=40).map(lambda v: ("binary", v)),
        st.text(max_size=300, alphabet="xy").map(lambda v: ("string", v)),  # str8 / str32
    )  # fmt: skip


def recorded_scalars() -> st.SearchStrategy[bytes]:
    """Encoded values the default mapping records in the types record: never taken."""
    return st.one_of(
        st.integers(0x10000, 0x10FFFF).map(lambda v: enc("char", v)),
        st.integers(-(2**63), 2**63 - 1).map(lambda v: enc("timestamp", v)),
        st.uuids().map(lambda v: enc("uuid", v)),
        ascii_text.map(lambda v: enc("symbol", v)),
        st.just(b"\x74\x00\x00\x00\x01"),  # decimal32
        st.just(b"\x45"),  # an empty list
        st.just(b"\xc1\x01\x00"),  # an empty map
        st.just(b"\xe0\x02\x01\x50"),  # an empty array of ubyte
        st.just(b"\x00\xa3\x01d\x40"),  # a described null
    )


def scalar_bytes(draw: st.DrawFn) -> bytes:
    tag, v = draw(typed_scalars())
    return enc(tag, v, draw(widths))


KNOWN_KEYS = [
    "x-opt-jms-msg-type", "x-opt-jms-dest", "x-opt-jms-reply-to", "x-opt-delivery-time",
    "x-opt-delivery-delay", "x-opt-gw-trace-id", "x-opt-gw-delivery-mode",
]  # fmt: skip
CONTENT_TYPES = [
    "text/plain", "text/plain; charset=utf-8", "application/json", "application/octet-stream",
    SERIALIZED, "application/xml; charset=UTF-8", "",
]  # fmt: skip


@st.composite
def ids(draw: st.DrawFn) -> bytes:
    """A message-id or correlation-id of each type proton keeps."""
    w = draw(widths)
    return draw(
        st.one_of(
            ids_text.map(lambda v: enc("string", v, w)),
            st.integers(0, 2**64 - 1).map(lambda v: enc("ulong", v, w)),
            st.uuids().map(lambda v: enc("uuid", v)),
            st.binary(max_size=20).map(lambda v: enc("binary", v, w)),
        )
    )


def opt(draw: st.DrawFn, strategy: st.SearchStrategy[bytes]) -> bytes:
    return draw(st.one_of(st.just(b"\x40"), strategy))


def fields_list(draw: st.DrawFn, fields: list[bytes]) -> bytes:
    """A list of fields, trailing nulls left out or kept (both are valid)."""
    k = len(fields)
    while k and fields[k - 1] == b"\x40":
        k -= 1
    k = draw(st.integers(k, len(fields)))
    return enc_list(fields[:k], draw(widths))


@st.composite
def wire_messages(draw: st.DrawFn) -> bytes:
    """A bare message inside the fast path's subset, in any valid mix of encodings."""
    out = []
    long_desc = draw(st.booleans())
    durable = False
    if draw(st.booleans()):
        durable = draw(st.booleans())
        w = draw(widths)
        header = [
            enc("bool", durable, w) if durable or draw(st.booleans()) else b"\x40",
            opt(draw, st.integers(0, 9).map(lambda v: enc("ubyte", v))),
            opt(draw, st.integers(0, 2**32 - 1).map(lambda v: enc("uint", v, w))),
            opt(draw, st.booleans().map(lambda v: enc("bool", v, w))),
            opt(draw, st.integers(0, 2**32 - 1).map(lambda v: enc("uint", v, w))),
        ]
        out.append(section(HEADER, fields_list(draw, header), long_desc))
    body = draw(st.sampled_from(["none", "data", "text", "binary", "null"]))
    if draw(st.booleans()):
        keys = draw(st.lists(st.sampled_from(KNOWN_KEYS) | ascii_text, max_size=6, unique=True))
        pairs = []
        for key in keys:
            if key == "x-opt-jms-msg-type" and draw(st.booleans()):
                value = enc("byte", draw(st.integers(0, 5)))
            elif key == "x-opt-gw-delivery-mode" and not durable and draw(st.booleans()):
                value = enc("symbol", "RELIABLE", draw(widths))
            elif key in ("x-opt-jms-dest", "x-opt-jms-reply-to") and draw(st.booleans()):
                value = enc("byte", draw(st.integers(0, 4)))
            else:
                value = scalar_bytes(draw)
            pairs.append(enc("symbol", key, draw(widths)) + value)
        out.append(section(MESSAGE_ANN, enc_map(pairs, draw(widths)), long_desc))
    if draw(st.booleans()):
        w = draw(widths)
        props = [
            opt(draw, ids()),
            opt(draw, st.one_of(amqp_text.map(str.encode), st.binary(max_size=8)).map(
                lambda v: enc("binary", v, w))),
            # `to` is not read when the destination is given: any string, even not UTF-8.
            opt(draw, st.one_of(amqp_text.map(str.encode), st.binary(max_size=8)).map(
                lambda v: enc("string", v, w))),
            opt(draw, c_text.map(lambda v: enc("string", v, w))),
            opt(draw, st.one_of(c_text, st.sampled_from(
                ["queue://replies", "topic://news", "queue://", "", "$TMP$.q1"])).map(
                lambda v: enc("string", v, w))),
            opt(draw, ids()),
            opt(draw, (st.sampled_from(CONTENT_TYPES) | ascii_text).map(
                lambda v: enc("symbol", v, w))),
            opt(draw, ascii_text.map(lambda v: enc("symbol", v, w))),
            opt(draw, st.integers(-(2**63), 2**63 - 1).map(lambda v: enc("timestamp", v))),
            opt(draw, st.integers(-(2**63), 2**63 - 1).map(lambda v: enc("timestamp", v))),
            opt(draw, c_text.map(lambda v: enc("string", v, w))),
            opt(draw, st.integers(0, 2**32 - 1).map(lambda v: enc("uint", v, w))),
            opt(draw, c_text.map(lambda v: enc("string", v, w))),
        ]  # fmt: skip
        out.append(section(PROPERTIES, fields_list(draw, props), long_desc))
    if draw(st.booleans()):
        names = draw(st.lists(amqp_text.filter(lambda k: k != TYPES_PROPERTY), max_size=6,
                              unique=True))  # fmt: skip
        pairs = [enc("string", k, draw(widths)) + scalar_bytes(draw) for k in names]
        out.append(section(APP_PROPS, enc_map(pairs, draw(widths)), long_desc))
    w = draw(widths)
    if body == "data":
        raw = draw(st.binary(max_size=300) | amqp_text.map(str.encode))
        out.append(section(DATA, enc("binary", raw, w), long_desc))
    elif body == "text":
        out.append(section(VALUE, enc("string", draw(amqp_text), w), long_desc))
    elif body == "binary":
        out.append(section(VALUE, enc("binary", draw(st.binary(max_size=64)), w), long_desc))
    elif body == "null":
        out.append(section(VALUE, b"\x40", long_desc))
    data = b"".join(out)
    return data if data else section(HEADER, b"\x45")


def proton_scalars() -> st.SearchStrategy[Any]:
    """The subset's scalars as python-qpid-proton values."""
    return st.one_of(
        st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
        st.integers(-128, 127).map(proton.byte), st.integers(-(2**15), 2**15 - 1).map(proton.short),
        st.integers(-(2**31), 2**31 - 1).map(proton.int32), st.integers(0, 255).map(proton.ubyte),
        st.integers(0, 0xFFFF).map(proton.ushort), st.integers(0, 2**32 - 1).map(proton.uint),
        st.integers(0, 2**64 - 1).map(proton.ulong), st.floats(width=32).map(proton.float32),
        st.floats(), st.integers(0, 0xFFFF).map(lambda c: proton.char(chr(c))), amqp_text,
        st.binary(max_size=20),
    )  # fmt: skip


@st.composite
def proton_messages(draw: st.DrawFn) -> bytes:
    """A message inside the subset as python-qpid-proton builds and encodes it."""
    pm = proton.Message()
    pm.durable = draw(st.booleans())
    pm.priority = draw(st.integers(0, 9))
    pm.ttl = draw(st.sampled_from([0, 1.5, 60]))
    pm.first_acquirer = draw(st.booleans())
    pm.delivery_count = draw(st.integers(0, 5))
    pm.id = draw(
        st.none() | ids_text | st.integers(0, 2**64 - 1) | st.uuids() | st.binary(max_size=9)
    )
    pm.correlation_id = draw(st.none() | ids_text | st.uuids() | st.binary(max_size=9))
    pm.user_id = draw(st.binary(max_size=8))
    pm.address = draw(st.none() | c_text)
    pm.subject = draw(st.none() | c_text)
    pm.reply_to = draw(st.none() | c_text)
    pm.group_id = draw(st.none() | c_text)
    pm.reply_to_group_id = draw(st.none() | c_text)
    if draw(st.booleans()):
        pm.content_type = draw(st.sampled_from(CONTENT_TYPES[:-1]))
    if draw(st.booleans()):
        pm.content_encoding = "gzip"
    pm.group_sequence = draw(st.integers(0, 2**32 - 1))
    pm.creation_time = draw(st.integers(0, 2**40)) / 1000
    pm.expiry_time = draw(st.integers(0, 2**40)) / 1000
    pm.properties = draw(st.dictionaries(amqp_text.filter(lambda k: k != TYPES_PROPERTY),
                                         proton_scalars(), max_size=5))  # fmt: skip
    keys = st.sampled_from(KNOWN_KEYS[:-1]).map(symbol) | ascii_text.map(symbol)
    ann = draw(st.dictionaries(keys, proton_scalars(), max_size=4))
    if ann:
        pm.annotations = ann
    kind = draw(st.sampled_from(["none", "data", "text", "binary"]))
    if kind == "data":
        pm.body, pm.inferred = draw(st.binary(max_size=64)), True
    elif kind == "text":
        pm.body = draw(amqp_text)
    elif kind == "binary":
        pm.body = draw(st.binary(max_size=64))
    return pm.encode()  # type: ignore[no-any-return]


# == decode: inside the subset ================================================================


@SETTINGS
@given(data=wire_messages(), now=st.integers(0, 2**45), kind=st.sampled_from([QUEUE, TOPIC]))
def test_decode_equals_slow_path_for_every_encoding(data: bytes, now: int, kind: DestKind) -> None:
    assert_decodes_same(data, taken=True, now=now, kind=kind)


@SETTINGS
@given(data=proton_messages())
def test_decode_equals_slow_path_for_what_proton_sends(data: bytes) -> None:
    assert_decodes_same(data, taken=True)


@SETTINGS
@given(data=wire_messages() | proton_messages(), kind=st.sampled_from([QUEUE, TOPIC]))
def test_decode_resolves_to_as_the_adapter_does(data: bytes, kind: DestKind) -> None:
    """``destination=None``: ``to`` and ``x-opt-jms-dest`` decide it, or the input is
    declined (the adapter then rejects it through the slow path)."""
    assert_decodes_same(data, taken=False, destination=None, kind=kind)


def test_decode_resolution_takes_to_and_its_hint() -> None:
    data = (
        section(MESSAGE_ANN, enc_map([enc("symbol", "x-opt-jms-dest") + enc("byte", 1)]))
        + section(PROPERTIES, enc_list([b"\x40", b"\x40", enc("string", "prices")]))
        + section(VALUE, enc("string", "x"))
    )
    msg = assert_decodes_same(data, taken=True, destination=None, kind=QUEUE)
    assert msg is not None and msg.destination == Destination.topic("prices")
    assert fast_decode(data[: data.index(b"\x00\x53\x77")] + b"\x00\x53\x77\x40",
                       destination=None) is not None  # fmt: skip
    no_to = section(PROPERTIES, enc_list([b"\x40", b"\x40", enc("string", "")]))
    assert fast_decode(no_to, destination=None) is None
    assert fast_decode(section(PROPERTIES, enc_list([])), destination=None) is None


# == decode: outside the subset ===============================================================


def _base(draw: st.DrawFn) -> list[bytes]:
    """The sections of a plain message, for one feature outside the subset to go into."""
    return [
        section(HEADER, enc_list([enc("bool", draw(st.booleans()))])),
        section(MESSAGE_ANN, enc_map([enc("symbol", "x-opt-jms-msg-type") + enc("byte", 5)])),
        section(PROPERTIES, enc_list([enc("string", "id-1"), b"\x40", enc("string", "q")])),
        section(APP_PROPS, enc_map([enc("string", "k") + enc("string", "v")])),
        section(VALUE, enc("string", "hello")),
    ]


@st.composite
def outside_messages(draw: st.DrawFn) -> bytes:
    """A message with one feature the fast path must decline."""
    s = _base(draw)
    which = draw(st.integers(0, 22))
    sym = enc("symbol", "x-opt-foo")
    if which == 0:  # delivery annotations
        s.insert(1, section(DELIVERY_ANN, enc_map([sym + enc("int", 1)])))
    elif which == 1:  # a footer
        s.append(section(FOOTER, enc_map([sym + enc("int", 1)])))
    elif which == 2:  # an amqp-sequence body
        s[4] = section(SEQUENCE, enc_list([enc("int", 1)]))
    elif which == 3:  # an amqp-value of another type
        s[4] = section(VALUE, draw(recorded_scalars() | st.just(enc("int", 5))))
    elif which == 4:  # two body sections
        s.append(section(DATA, enc("binary", b"x")))
    elif which == 5:  # an application property with a recorded type
        s[3] = section(APP_PROPS, enc_map([enc("string", "k") + draw(recorded_scalars())]))
    elif which == 6:  # the types record itself
        s[3] = section(APP_PROPS, enc_map([enc("string", TYPES_PROPERTY) + enc("string", "[]")]))
    elif which == 7:  # an application property named by a symbol
        s[3] = section(APP_PROPS, enc_map([enc("symbol", "k") + enc("int", 1)]))
    elif which == 8:  # a ulong annotation key
        s[1] = section(MESSAGE_ANN, enc_map([enc("ulong", 7) + enc("int", 1)]))
    elif which == 9:  # an annotation value with a recorded type
        s[1] = section(MESSAGE_ANN, enc_map([sym + draw(recorded_scalars())]))
    elif which == 10:  # RELIABLE on a durable message is kept as a symbol: recorded
        s[0] = section(HEADER, enc_list([enc("bool", True)]))
        mode = enc("symbol", "x-opt-gw-delivery-mode") + enc("symbol", "RELIABLE")
        s[1] = section(MESSAGE_ANN, enc_map([mode]))
    elif which == 11:  # priority above 9
        prio = enc("ubyte", draw(st.integers(10, 255)))
        s[0] = section(HEADER, enc_list([enc("bool", True), prio]))
    elif which == 12:  # U+0000 in a field proton keeps as a C string
        field = draw(st.sampled_from([3, 4, 10, 12]))
        props = [b"\x40"] * 13
        props[field] = enc("string", draw(c_text) + "\x00" + draw(c_text))
        s[2] = section(PROPERTIES, enc_list(props))
    elif which == 13:  # sections out of order
        s[0], s[2] = s[2], s[0]
    elif which == 14:  # a repeated application property or annotation key
        if draw(st.booleans()):
            pair = enc("string", "k") + enc("int", 1)
            s[3] = section(APP_PROPS, enc_map([pair, pair]))
        else:
            s[1] = section(MESSAGE_ANN, enc_map([sym + enc("int", 1), sym + enc("int", 2)]))
    elif which == 15:  # an id of a type proton drops or converts
        bad = [enc("int", 5), enc("long", -1), enc("symbol", "x"), enc("bool", True)]
        s[2] = section(PROPERTIES, enc_list([draw(st.sampled_from(bad))]))
    elif which == 16:  # a header or properties field of the wrong type (proton drops it)
        field, value = draw(st.sampled_from([
            (HEADER, enc("ubyte", 1)), (HEADER, enc("string", "4")), (1, enc("string", "u")),
            (2, enc("symbol", "q")), (3, enc("binary", b"s")), (6, enc("string", "text/plain")),
            (7, enc("timestamp", 1)), (8, enc("long", 1)), (9, enc("ulong", 1)),
            (11, enc("int", 1)), (12, enc("symbol", "g")),
        ]))  # fmt: skip
        if field == HEADER:  # as durable, or as priority
            s[0] = section(HEADER, enc_list([value] if value[0] == 0x50 else [b"\x40", value]))
        else:
            props = [b"\x40"] * 13
            props[field] = value
            s[2] = section(PROPERTIES, enc_list(props))
    elif which == 17:  # more fields than the list has
        s[0] = section(HEADER, enc_list([b"\x40"] * 6))
    elif which == 18:  # trailing bytes
        s.append(draw(st.binary(min_size=1, max_size=4)))
    elif which == 19:  # a map with an odd count
        s[3] = section(APP_PROPS, b"\xc1\x04\x01\xa1\x01k")
    elif which == 20:  # a section named by a symbol descriptor
        s[4] = b"\x00\xa3\x15amqp:amqp-value:*" + enc("string", "hello")
    elif which == 21:  # a string that is not UTF-8 (a surrogate's or a cut-off sequence)
        broken = enc("string", draw(st.sampled_from([b"\xed\xa0\x80", b"a\xc3", b"\xff"])))
        pair = draw(st.sampled_from([enc("string", "k") + broken, broken + enc("int", 1)]))
        s[3] = section(APP_PROPS, enc_map([pair]))
    else:  # a content type or encoding that is not ASCII
        props = [b"\x40"] * 13
        props[draw(st.sampled_from([6, 7]))] = enc("symbol", "t\u00e9xt")
        s[2] = section(PROPERTIES, enc_list(props))
    return b"".join(s)


@SETTINGS
@given(data=outside_messages())
def test_decode_declines_outside_the_subset(data: bytes) -> None:
    assert fast_decode(data) is None
    assert fast_decode(data, destination=None) is None


def test_decode_declines_empty_input() -> None:
    assert fast_decode(b"") is None


def test_decode_takes_any_buffer() -> None:
    for buffer in (bytearray(PROTON_BYTES), memoryview(PROTON_BYTES)):
        msg = fast_decode(buffer)  # type: ignore[arg-type]
        assert msg is not None and msg.body == bytes(64) and type(msg.body) is bytes


# == decode: truncated and garbage bytes ======================================================


@SETTINGS
@given(data=wire_messages(), cut=st.integers(0, 10_000))
def test_decode_truncated_is_declined_or_exact(data: bytes, cut: int) -> None:
    assert_decodes_same(data[: cut % (len(data) + 1)], taken=False)


@SETTINGS
@given(data=wire_messages(), where=st.integers(0, 10_000), byte=st.integers(0, 255))
def test_decode_corrupted_is_declined_or_exact(data: bytes, where: int, byte: int) -> None:
    k = where % len(data)
    assert_decodes_same(data[:k] + bytes((byte,)) + data[k + 1 :], taken=False)


@SETTINGS
@given(data=st.binary(max_size=80) | st.binary(max_size=40).map(lambda b: b"\x00\x53" + b))
def test_decode_garbage_is_declined_or_exact(data: bytes) -> None:
    assert_decodes_same(data, taken=False)


def test_decode_every_prefix_of_a_full_message() -> None:
    body = section(VALUE, enc("string", "hello"))
    app = section(APP_PROPS, enc_map([enc("string", "n") + enc("int", 7)]))
    data = JMS_TEXT[: -len(body)] + app + body
    for k in range(len(data) + 1):
        assert_decodes_same(data[:k], taken=k == len(data))


# == decode: vectors as clients send them =====================================================

# python-qpid-proton: durable, `to`, a 64-byte data body (the benchmark message).
PROTON_BYTES = bytes.fromhex(
    "005370c0020141" "005373c013034040a10e71756575653a2f2f6f7264657273" "005375a040"
) + bytes(64)  # fmt: skip

# Qpid JMS (proton-j encodings: map8, smallulong descriptors) TextMessage "hello" to `orders`.
JMS_ID = "ID:c3c1d5e2-7a3b-4f11-9e1d-2b8e6c1f0a9d:1:1:1-1"
JMS_TEXT = (
    section(HEADER, enc_list([enc("bool", True)]))
    + section(MESSAGE_ANN, enc_map([enc("symbol", "x-opt-jms-msg-type") + enc("byte", 5),
                                    enc("symbol", "x-opt-jms-dest") + enc("byte", 0)]))
    + section(PROPERTIES, enc_list([enc("string", JMS_ID), b"\x40", enc("string", "orders")]
                                   + [b"\x40"] * 6 + [enc("timestamp", T0)]))
    + section(VALUE, enc("string", "hello"))
)  # fmt: skip


def jms(
    msg_type: int, body: bytes, *, content_type: str | None = None, extra: bytes = b""
) -> bytes:
    props = [enc("string", JMS_ID), b"\x40", enc("string", "orders"), b"\x40", b"\x40", b"\x40"]
    props.append(b"\x40" if content_type is None else enc("symbol", content_type))
    props += [b"\x40", b"\x40", enc("timestamp", T0)]
    return (
        section(HEADER, enc_list([enc("bool", True)]))
        + section(MESSAGE_ANN, enc_map([enc("symbol", "x-opt-jms-msg-type") + enc("byte", msg_type),
                                        enc("symbol", "x-opt-jms-dest") + enc("byte", 0)]))
        + section(PROPERTIES, enc_list(props))
        + extra
        + body
    )  # fmt: skip


def test_python_qpid_proton_data_message() -> None:
    msg = assert_decodes_same(PROTON_BYTES, taken=True)
    assert msg is not None
    assert msg.body == bytes(64) and msg.body_kind is BodyKind.BYTES
    assert msg.delivery_mode is DeliveryMode.PERSISTENT and msg.priority == 4
    assert msg.destination is DEST and msg.properties == {} and msg.message_id is None


def test_qpid_jms_text_message() -> None:
    msg = assert_decodes_same(JMS_TEXT, taken=True)
    assert msg is not None
    assert (msg.body, msg.body_kind, msg.message_id, msg.timestamp) == (
        "hello", BodyKind.TEXT, JMS_ID, T0)  # fmt: skip
    assert msg.properties == {} and msg.delivery_mode is DeliveryMode.PERSISTENT


def test_qpid_jms_bytes_object_and_empty_messages() -> None:
    octets = jms(3, section(DATA, enc("binary", b"\x01\x02")),
                 content_type="application/octet-stream")  # fmt: skip
    msg = assert_decodes_same(octets, taken=True)
    assert msg is not None and msg.body == b"\x01\x02" and msg.body_kind is BodyKind.BYTES
    assert msg.properties == {CONTENT_TYPE_PROPERTY: "application/octet-stream"}
    obj = jms(1, section(DATA, enc("binary", b"\xac\xed\x00\x05")), content_type=SERIALIZED)
    msg = assert_decodes_same(obj, taken=True)
    assert msg is not None and msg.body_kind is BodyKind.OBJECT and msg.properties == {}
    empty = jms(0, b"")
    msg = assert_decodes_same(empty, taken=True)
    assert msg is not None and msg.body_kind is BodyKind.NONE and msg.body is None
    # An empty BytesMessage has no body and type 3: the type is kept so it goes back.
    msg = assert_decodes_same(jms(3, b""), taken=True)
    assert msg is not None and msg.properties == {"JMS_GW_AMQP_MA_x-opt-jms-msg-type": Int8(3)}
    assert type(msg.properties["JMS_GW_AMQP_MA_x-opt-jms-msg-type"]) is Int8


def test_qpid_jms_properties_reply_to_and_delivery_time() -> None:
    app = section(APP_PROPS, enc_map([
        enc("string", "color") + enc("string", "red"), enc("string", "count") + enc("int", 7, True),
        enc("string", "big") + enc("long", 2**40), enc("string", "ratio") + enc("float", 0.5),
        enc("string", "flag") + enc("bool", False), enc("string", "initial") + enc("char", 65),
        enc("string", "none") + b"\x40", enc("string", "s") + enc("short", -2),
    ]))  # fmt: skip
    props = [enc("string", JMS_ID), b"\x40", enc("string", "orders"), b"\x40",
             enc("string", "$TMP$.reply-1"), enc("string", "corr-9")]  # fmt: skip
    data = (
        section(HEADER, enc_list([enc("bool", False), enc("ubyte", 7), enc("uint", 30_000)]))
        + section(MESSAGE_ANN, enc_map([
            enc("symbol", "x-opt-jms-msg-type") + enc("byte", 5),
            enc("symbol", "x-opt-jms-reply-to") + enc("byte", 2),
            enc("symbol", "x-opt-delivery-time") + enc("long", T0 + 5000)]))
        + section(PROPERTIES, enc_list(props))
        + app
        + section(VALUE, enc("string", "hi"))
    )  # fmt: skip
    msg = assert_decodes_same(data, taken=True)
    assert msg is not None
    assert msg.reply_to == Destination.queue("$TMP$.reply-1") and msg.correlation_id == "corr-9"
    assert (msg.priority, msg.expiration, msg.delivery_time) == (7, T0 + 30_000, T0 + 5000)
    assert msg.delivery_mode is DeliveryMode.NON_PERSISTENT
    expected = {"color": "red", "count": Int32(7), "big": 2**40, "ratio": Float32(0.5),
                "flag": False, "initial": Char("A"), "none": None, "s": Int16(-2)}  # fmt: skip
    assert same_value(msg.properties, expected)


def test_rhea_messages() -> None:
    """rhea: no header unless asked, map8 application properties, integers as smallint,
    a data section from ``message.data_section``, ids as it was given them."""
    app = section(APP_PROPS, enc_map([enc("string", "n") + enc("int", 5),
                                      enc("string", "ok") + enc("bool", True),
                                      enc("string", "price") + enc("double", 2.5)]))  # fmt: skip
    text = (
        section(PROPERTIES, enc_list([enc("ulong", 42)]))
        + app
        + section(VALUE, enc("string", "hi"))
    )
    msg = assert_decodes_same(text, taken=True)
    assert msg is not None and msg.message_id == "ID:AMQP_ULONG:42" and msg.body == "hi"
    assert same_value(msg.properties, {"n": Int32(5), "ok": True, "price": 2.5})
    assert msg.delivery_mode is DeliveryMode.NON_PERSISTENT
    json_data = section(
        PROPERTIES,
        enc_list(
            [enc("uuid", uuid.UUID(int=7))] + [b"\x40"] * 5 + [enc("symbol", "application/json")]
        ),  # fmt: skip
    ) + section(DATA, enc("binary", b'{"a":1}'))
    msg = assert_decodes_same(json_data, taken=True)
    assert msg is not None and msg.body == '{"a":1}' and msg.body_kind is BodyKind.TEXT
    assert msg.message_id == "ID:AMQP_UUID:00000000-0000-0000-0000-000000000007"
    assert msg.properties == {CONTENT_TYPE_PROPERTY: "application/json",
                              TYPES_PROPERTY: '[[1,"body","data"]]'}  # fmt: skip


def test_gateway_annotations_come_back() -> None:
    """What the gateway itself sends: trace id, RELIABLE, a long delivery time."""
    data = section(MESSAGE_ANN, enc_map([
        enc("symbol", "x-opt-jms-msg-type") + enc("byte", 3),
        enc("symbol", "x-opt-gw-delivery-mode") + enc("symbol", "RELIABLE"),
        enc("symbol", "x-opt-gw-trace-id") + enc("string", "t-1"),
        enc("symbol", "x-opt-delivery-delay") + enc("long", 250),
    ])) + section(VALUE, enc("binary", b"\x00"))  # fmt: skip
    msg = assert_decodes_same(data, taken=True, now=T0)
    assert msg is not None and msg.delivery_mode is DeliveryMode.RELIABLE
    assert msg.trace_id == "t-1" and msg.delivery_time == T0 + 250
    assert msg.properties == {"JMS_GW_AMQP_MA_x-opt-delivery-delay": 250,
                              TYPES_PROPERTY: '[[1,"body","value"]]'}  # fmt: skip


# == encode ===================================================================================

# Long names take the properties list across list8's 255 bytes, and a string past str8's.
dest_names = st.one_of(
    c_text.filter(bool), st.just("$TMP$.q1"), st.text(alphabet="ab", min_size=200, max_size=300)
)
destinations = st.builds(Destination, st.sampled_from([QUEUE, TOPIC]), dest_names)


def _width(cls: Any) -> st.SearchStrategy[Any]:
    return st.integers(cls.MIN, cls.MAX).map(cls)


def core_scalars() -> st.SearchStrategy[Any]:
    """Property values the subset carries (Int64 and lone surrogates are recorded)."""
    return st.one_of(
        st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
        st.sampled_from([0, 127, 128, -128, -129]),
        *(_width(c) for c in (Int8, Int16, Int32, UInt8, UInt16, UInt32, UInt64)),
        st.sampled_from([Int32(127), Int32(-128), Int32(128), UInt32(0), UInt32(255),
                         UInt32(256), UInt64(0), UInt64(255), UInt64(256)]),
        st.floats(), st.floats(width=32).map(Float32),
        st.integers(0, 0xFFFF).map(lambda c: Char(chr(c))), amqp_text, st.binary(max_size=20),
    )  # fmt: skip


special_props = st.fixed_dictionaries(
    {},
    optional={
        "JMSXUserID": st.one_of(amqp_text, st.binary(max_size=6)),
        "JMSXGroupID": st.one_of(amqp_text, st.integers(0, 3)),
        "JMSXGroupSeq": st.one_of(_width(Int32), st.integers(0, 3), amqp_text),
        CONTENT_TYPE_PROPERTY: st.one_of(st.sampled_from(CONTENT_TYPES), amqp_text),
        CONTENT_ENCODING_PROPERTY: st.one_of(ascii_text, amqp_text),
        REPLY_TO_GROUP_ID_PROPERTY: amqp_text,
        REPLY_TO_PROPERTY: amqp_text,
        TYPES_PROPERTY: st.sampled_from(['[[1,"body","data"]]', '[[1,"body","value"]]']),
        "JMS_GW_AMQP_MA_x-opt-jms-msg-type": st.integers(0, 5).map(Int8),
        "JMS_GW_AMQP_MA_x-opt-delivery-time": _width(Int32),
        "JMS_GW_AMQP_MA_x-opt-partition-key": amqp_text,
        "JMS_GW_AMQP_MA_x-opt-jms-dest": _width(UInt8),
    },
)


def _plain_name(name: str) -> bool:
    """Not a name the subset declines: the types record, the priority, a delivery annotation."""
    return name not in (TYPES_PROPERTY, PRIORITY_PROPERTY) and not name.startswith(
        "JMS_GW_AMQP_DA_"
    )


@st.composite
def core_messages(draw: st.DrawFn) -> Message:
    """A core message inside the subset, its fields near their edges."""
    kind = draw(st.sampled_from([BodyKind.NONE, BodyKind.TEXT, BodyKind.BYTES, BodyKind.OBJECT]))
    body = {
        BodyKind.NONE: st.none(),
        BodyKind.TEXT: amqp_text | st.text("z", min_size=256),
        BodyKind.BYTES: st.binary(max_size=300),
        BodyKind.OBJECT: st.binary(max_size=20),
    }
    props = draw(st.dictionaries(amqp_text.filter(_plain_name), core_scalars(), max_size=5))
    for name, value in draw(special_props).items():
        props.pop(name, None)
        props[name] = value
    times = st.one_of(st.just(0), st.integers(-(2**63), 2**63 - 1), st.integers(T0 - 10, T0 + 10))
    msg = Message(
        draw(body[kind]),
        body_kind=kind,
        properties=dict(draw(st.permutations(list(props.items())))),
        destination=draw(st.none() | destinations),
        delivery_mode=draw(st.sampled_from(list(DeliveryMode))),
        priority=draw(st.integers(0, 9)),
        correlation_id=draw(st.none() | ids_text.filter(lambda s: "\x00" not in s)
                            | st.binary(max_size=8)),
        reply_to=draw(st.none() | destinations),
        type=draw(st.none() | c_text),
        expiration=draw(times),
        delivery_time=draw(times),
        timestamp=draw(times),
        message_id=draw(st.none() | ids_text.filter(lambda s: "\x00" not in s)),
    )  # fmt: skip
    msg.trace_id = draw(st.none() | c_text)
    msg.expires_at = draw(times)
    return msg


@SETTINGS
@given(msg=core_messages(), count=st.integers(0, 2**32 + 1), now=st.integers(0, 2**45))
def test_encode_equals_slow_path_byte_for_byte(msg: Message, count: int, now: int) -> None:
    assert_encodes_same(msg, taken=count <= 2**32, count=count, now=now)


@st.composite
def outside_core_messages(draw: st.DrawFn) -> Message:
    msg = draw(core_messages())
    which = draw(st.integers(0, 9))
    lone = "a\ud800"
    if which == 0:
        msg.properties["n"] = draw(_width(Int64))
    elif which == 1:
        msg.properties[draw(st.sampled_from(["v", lone]))] = lone
    elif which == 2:
        msg.type = "a\x00b"
    elif which == 3:
        msg.trace_id = draw(st.sampled_from(["a\x00", lone]))
    elif which == 4:
        msg.message_id = draw(st.sampled_from(["a\x00", lone]))
    elif which == 5:
        msg.body_kind, msg.body = draw(st.sampled_from([(BodyKind.MAP, {"a": 1}),
                                                       (BodyKind.STREAM, [1]),
                                                       (BodyKind.TEXT, lone)]))  # fmt: skip
    elif which == 6:
        msg.properties["JMS_GW_AMQP_DA_x-opt-foo"] = 1
    elif which == 7:
        msg.properties[PRIORITY_PROPERTY] = UInt8(12)
        msg.priority = 9
    elif which == 8:
        record = draw(st.sampled_from(['[[0,"string"]]', "[]", 5, None, False]))
        msg.properties[TYPES_PROPERTY] = record
    else:
        msg.destination = Destination(QUEUE, "q\x00")
    return msg


@SETTINGS
@given(msg=outside_core_messages())
def test_encode_declines_outside_the_subset(msg: Message) -> None:
    assert amqp_fast_out.encode(msg, delivery_count=1, now_ms=T0) is None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msg=messages(), count=st.integers(1, 5))
def test_encode_any_core_message_is_declined_or_exact(msg: Message, count: int) -> None:
    assert_encodes_same(msg, taken=False, count=count)


@SETTINGS
@given(msg=core_messages(), count=st.integers(1, 3))
def test_round_trip_through_both_fast_paths(msg: Message, count: int) -> None:
    """core → bytes → core by the fast path equals the same trip by the slow path."""
    data = amqp_fast_out.encode(msg, delivery_count=count, now_ms=T0)
    assert data is not None
    back = fast_decode(data, destination=msg.destination or DEST)
    slow = slow_decode(
        message_to_amqp(msg, delivery_count=count, now_ms=T0).encode(),
        destination=msg.destination or DEST,
    )
    assert back is not None and not differences(back, slow), differences(back, slow)


def test_encode_vector_of_the_benchmark_message() -> None:
    msg = fast_decode(PROTON_BYTES)
    assert msg is not None
    msg.message_id, msg.trace_id, msg.timestamp = "ID:gw-1:1:1:1", "3f2a9c1e5b7d4f60", T0
    expected = bytes.fromhex(
        "005370c00504414040410053" "72d10000005100000006a312782d6f70742d6a6d732d6d73672d74797065"
        "5103a30e782d6f70742d6a6d732d646573745100a311782d6f70742d67772d74726163652d6964a110"
        "33663261396331653562376434663630" "005373c0300aa10d49443a67772d313a313a313a3140a10e"
        "71756575653a2f2f6f72646572734040404040408300000" "18bcfe56800" "005375a040"
    ) + bytes(64)  # fmt: skip
    assert amqp_fast_out.encode(msg, delivery_count=1, now_ms=T0) == expected
    assert message_to_amqp(msg, delivery_count=1, now_ms=T0).encode() == expected


def test_encode_header_properties_and_carried_annotations() -> None:
    msg = Message.text("hi", destination=Destination.topic("$TMP$.t"), priority=7,
                       delivery_mode=DeliveryMode.RELIABLE)  # fmt: skip
    msg.expiration = T0 + 1000
    msg.properties = {"JMSXGroupID": "g", "JMS_GW_AMQP_MA_x-opt-jms-msg-type": Int8(0),
                      "JMSXGroupSeq": Int32(-1), "k": UInt32(300)}  # fmt: skip
    data = amqp_fast_out.encode(msg, delivery_count=3, now_ms=T0)
    assert data == message_to_amqp(msg, delivery_count=3, now_ms=T0).encode()
    assert data is not None
    # durable absent, priority 7, ttl 1000, first-acquirer absent, delivery-count 2.
    assert data.startswith(bytes.fromhex("005370c00c0540500770000003e8405202"))
    pm = proton.Message()
    pm.decode(data)
    assert pm.annotations == {symbol("x-opt-jms-msg-type"): 0,
                              symbol("x-opt-gw-delivery-mode"): symbol("RELIABLE"),
                              symbol("x-opt-jms-dest"): 3}  # fmt: skip
    assert type(pm.annotations[symbol("x-opt-jms-msg-type")]) is proton.byte
    assert (pm.group_id, pm.group_sequence, pm.address) == ("g", 0xFFFFFFFF, "topic://$TMP$.t")
    assert pm.properties == {"k": 300} and type(pm.properties["k"]) is proton.uint


@pytest.mark.parametrize("count", [0, 1, 2, 2**32, 2**32 + 1])
def test_encode_delivery_counts(count: int) -> None:
    assert_encodes_same(Message.binary(b"x", destination=DEST), taken=count <= 2**32, count=count)
