"""Tests for gateway.serial: exact round trips, a byte-exact vector, fuzzing and truncation."""

from __future__ import annotations

import math
from typing import Any

import pytest
from corehelp import not_compiled
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import (
    message_differences,
    messages,
    nested_values,
    same_value,
    typed_arrays,
)

from gateway.errors import MessageFormatError
from gateway.message import BodyKind, DeliveryMode, Destination, Message, estimate_size
from gateway.serial import (
    VERSION,
    decode_message,
    decode_value,
    encode_message,
    encode_value,
    read_value,
    write_value,
)
from gateway.types import (
    ARRAY_TYPES,
    MAX_NESTING,
    BoolArray,
    Char,
    Float32,
    Float32Array,
    Float64Array,
    Int8,
    Int8Array,
    Int16,
    Int16Array,
    Int32,
    Int32Array,
    Int64,
    Int64Array,
    UInt8,
    UInt8Array,
    UInt16,
    UInt16Array,
    UInt32,
    UInt32Array,
    UInt64,
    UInt64Array,
    check_value,
)

# One value of every scalar type at both ends of its range.
EVERY_SCALAR: list[Any] = [
    True, False, None,
    0, -1, 2**63 - 1, -(2**63),
    Int8(-128), Int8(127), Int16(-32768), Int16(32767), Int32(-(2**31)), Int32(2**31 - 1),
    Int64(-(2**63)), Int64(2**63 - 1),
    UInt8(0), UInt8(255), UInt16(65535), UInt32(2**32 - 1), UInt64(2**64 - 1),
    Float32(1.5), Float32(-3.4028234663852886e38), Float32(float("inf")),
    0.1, -0.0, float("inf"), 1e308,
    Char("x"), Char("\u20ac"), Char("\ud800"),
    "", "hello", "ünïcödé ✓ 🚀", "lone \udc80 surrogate", "x" * 300,
    b"", b"\x00\xff", bytes(range(256)) * 2,
]  # fmt: skip


def roundtrip(msg: Message) -> Message:
    out = decode_message(encode_message(msg))
    assert message_differences(msg, out) == []
    return out


def full_message(body: Any, kind: BodyKind) -> Message:
    m = Message(
        body,
        body_kind=kind,
        properties={"s": "v", "i": Int32(7), "b": True, "d": 2.5, "l": 12, "c": Char("z")},
        destination=Destination.queue("orders.eu"),
        delivery_mode=DeliveryMode.RELIABLE,
        priority=9,
        correlation_id=b"\x00\x01corr",
        reply_to=Destination.topic("replies.>"),
        type="order",
        expiration=1_700_000_060_000,
        delivery_time=1_700_000_010_000,
        timestamp=1_700_000_000_000,
        message_id="ID:gw-1:42",
    )
    m.redelivered = True
    m.trace_id = "trace-1"
    m.origin = "gw-1"
    m.hops = 3
    m.producer_conn = "conn-9"
    m.expires_at = 1_700_000_050_000
    m.wire = {"mqtt": b"raw"}
    m.store_id = 99
    m.refs = 4
    return m


# -- hand-written round trips ----------------------------------------------------------------


@pytest.mark.parametrize("value", EVERY_SCALAR, ids=lambda v: f"{type(v).__name__}:{v!r}"[:40])
def test_every_scalar_round_trips_with_its_type(value: Any) -> None:
    out = decode_value(encode_value(value))
    assert same_value(value, out), (value, out)
    # ... inside a stream, a map, and as a property.
    m = Message.stream([value, [value]], properties={"p": value})
    out_m = roundtrip(m)
    assert type(out_m.body[0]) is type(value)
    assert type(out_m.properties["p"]) is type(value)
    roundtrip(Message.map({"k": value, "n": {"k": value}}))


def test_plain_int_and_int64_stay_distinct() -> None:
    out = decode_message(encode_message(Message.stream([5, Int64(5)])))
    assert type(out.body[0]) is int
    assert type(out.body[1]) is Int64


def test_full_headers_and_bytes_correlation_id() -> None:
    m = full_message("text body", BodyKind.TEXT)
    out = roundtrip(m)
    assert out.correlation_id == b"\x00\x01corr" and type(out.correlation_id) is bytes
    assert out.destination == Destination.queue("orders.eu")
    assert out.reply_to is not None and out.reply_to.is_topic
    assert out.delivery_mode is DeliveryMode.RELIABLE
    assert out.redelivered is True and out.hops == 3 and out.expires_at == 1_700_000_050_000
    # Runtime-only attributes are not kept; size is re-estimated.
    assert out.wire is None and out.store_id == 0 and out.refs == 0
    assert out.size == estimate_size(out) > 0


def test_text_correlation_id_and_absent_fields() -> None:
    m = Message.text("t", correlation_id="c-1")
    out = roundtrip(m)
    assert out.correlation_id == "c-1"
    empty = roundtrip(Message())
    assert empty.body_kind is BodyKind.NONE and empty.body is None
    assert empty.destination is None and empty.message_id is None and empty.properties == {}


def test_empty_strings_differ_from_absent() -> None:
    m = Message.text("", message_id="", type="", correlation_id="")
    m.trace_id = ""
    out = roundtrip(m)
    assert out.message_id == "" and out.type == "" and out.trace_id == ""


@pytest.mark.parametrize("kind", [BodyKind.BYTES, BodyKind.OBJECT])
def test_binary_bodies(kind: BodyKind) -> None:
    out = roundtrip(Message(b"\x00\x01" * 1000, body_kind=kind))
    assert out.body_kind is kind


def test_deeply_nested_map_and_stream_with_typed_arrays() -> None:
    arrays = [
        Int8Array([-128, 0, 127]), Int16Array([-32768, 32767]), Int32Array([1, -1]),
        Int64Array([2**63 - 1]), UInt8Array([255]), UInt16Array([65535]),
        UInt32Array([2**32 - 1]), UInt64Array([2**64 - 1, 0]), Float32Array([1.5, -0.25]),
        Float64Array([0.1, 1e300]), BoolArray([True, False, True]), Int16Array([]),
    ]  # fmt: skip
    assert {type(a) for a in arrays} == set(ARRAY_TYPES)
    inner: Any = {"arrays": arrays, "none": None, "blob": b"\x01"}
    for level in range(20):
        inner = {"level": Int16(level), "child": [inner, Char("c"), None, UInt64(level)]}
    m = Message.map({"root": inner, "stream": [[[]], {}, [{"x": [Float32(2.0)]}]]})
    out = roundtrip(m)
    node = out.body["root"]
    for _ in range(20):
        node = node["child"][0]
    for original, decoded in zip(arrays, node["arrays"], strict=True):
        assert type(decoded) is type(original)
        assert all(type(x) is type(y) for x, y in zip(original, decoded, strict=True))


def test_large_containers_use_long_lengths() -> None:
    big_map = {f"k{i}": Int32(i) for i in range(300)}
    big_stream = list(range(70000))
    out = roundtrip(Message.map({"m": big_map, "s": big_stream, "t": "y" * 70000}))
    assert len(out.body["s"]) == 70000
    props = {f"p{i}": i for i in range(300)}
    roundtrip(Message.text("x", properties=props, message_id="i" * 1000))


def test_nesting_limit_matches_check_value() -> None:
    ok: Any = []
    for _ in range(MAX_NESTING):
        ok = [ok]
    assert same_value(decode_value(encode_value(ok)), ok)
    check_value(ok)
    too_deep = [ok]
    with pytest.raises(MessageFormatError):
        check_value(too_deep)
    with pytest.raises(MessageFormatError):
        encode_value(too_deep)


def test_memoryview_and_bytearray_input() -> None:
    data = encode_message(full_message({"a": [1, 2]}, BodyKind.MAP))
    assert decode_message(memoryview(data)) == decode_message(bytearray(data))
    assert decode_value(memoryview(encode_value(Int8(3)))) == 3


def test_write_value_and_read_value_embed() -> None:
    out = bytearray(b"prefix")
    write_value(out, {"a": UInt16(1)})
    write_value(out, "next")
    v1, pos = read_value(bytes(out), 6)
    v2, end = read_value(bytes(out), pos)
    assert same_value(v1, {"a": UInt16(1)}) and v2 == "next" and end == len(out)


# -- a byte-exact vector, both ways ------------------------------------------------------------

VECTOR_MESSAGE_BYTES = bytes.fromhex(
    "01"  # version
    "13400200"  # flags: DEST | DEST_QUEUE | MESSAGE_ID | TIMESTAMP | PROPS (0x00024013)
    "02"  # delivery mode PERSISTENT
    "04"  # priority 4
    "01"  # body kind TEXT
    "0100000000000000"  # timestamp 1
    "03 712e61"  # destination name "q.a"
    "04 49443a31"  # message id "ID:1"
    "01"  # one property
    "01 6e 05 feff"  # "n": int16 -2
    "0f 02 6869"  # body: short string "hi"
)


def vector_message() -> Message:
    return Message.text(
        "hi",
        destination=Destination.queue("q.a"),
        properties={"n": Int16(-2)},
        timestamp=1,
        message_id="ID:1",
    )


def test_vector_encodes_exactly() -> None:
    assert encode_message(vector_message()) == VECTOR_MESSAGE_BYTES


def test_vector_decodes_exactly() -> None:
    out = decode_message(VECTOR_MESSAGE_BYTES)
    assert message_differences(out, vector_message()) == []


VALUE_VECTORS = [
    (None, "0100"),
    (True, "0102"),
    (5, "01030500000000000000"),
    (Int64(5), "01070500000000000000"),
    (UInt16(258), "01090201"),
    (Float32(1.0), "010c0000803f"),
    (Char("A"), "010e4100"),
    (b"\x07", "01110107"),
    ([Int8(1), None], "011502040100"),
    ({"a": False}, "0113010161" + "01"),
    (Int16Array([1, -1]), "0121020000000100ffff"),
]


@pytest.mark.parametrize(("value", "hexdata"), VALUE_VECTORS, ids=lambda v: repr(v)[:30])
def test_value_vectors_both_ways(value: Any, hexdata: str) -> None:
    assert encode_value(value).hex() == hexdata
    assert same_value(decode_value(bytes.fromhex(hexdata)), value)


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [2**63, -(2**63) - 1, {1: "x"}, (1, 2), {1, 2}, object(), [[complex(1, 2)]], 1j],
    ids=lambda v: "object()" if type(v) is object else repr(v),  # the same in every process
)
def test_unencodable_values_raise_message_format_error(bad: Any) -> None:
    with pytest.raises(MessageFormatError):
        encode_value(bad)
    with pytest.raises(MessageFormatError):
        encode_message(Message.stream([bad]))


@not_compiled
def test_unencodable_headers_raise_message_format_error() -> None:
    m = Message.text("x")
    m.priority = 300
    with pytest.raises(MessageFormatError):
        encode_message(m)
    m = Message.text("x")
    m.hops = -1
    with pytest.raises(MessageFormatError):
        encode_message(m)
    m = Message.text("x", message_id=12)
    with pytest.raises(MessageFormatError):
        encode_message(m)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x02" + VECTOR_MESSAGE_BYTES[1:],  # unknown version
        VECTOR_MESSAGE_BYTES + b"\x00",  # bytes left over
        VECTOR_MESSAGE_BYTES[:1] + b"\x00\x00\x00\x80" + VECTOR_MESSAGE_BYTES[5:],  # flag bit
        VECTOR_MESSAGE_BYTES[:5] + b"\x07" + VECTOR_MESSAGE_BYTES[6:],  # delivery mode 7
        VECTOR_MESSAGE_BYTES[:7] + b"\x09" + VECTOR_MESSAGE_BYTES[8:],  # body kind 9
        VECTOR_MESSAGE_BYTES[:-2] + b"\xff\xfe",  # bad UTF-8
        VECTOR_MESSAGE_BYTES[:-4] + b"\x1f\x00\x00\x00",  # unknown tag
    ],
)
def test_corrupt_messages_raise_message_format_error(data: bytes) -> None:
    with pytest.raises(MessageFormatError):
        decode_message(data)


@pytest.mark.parametrize(
    "hexdata",
    [
        "", "02 00", "01", "01 ff", "01 00 00", "01 14 ffffffff", "01 29 ffffffff",
        "01 2a 0200000002 00",  # boolean array element 2
        "01" + "15 01" * (MAX_NESTING + 2) + "00",  # nested too deep
        "01 10 ffffff7f 61",  # string length past the end
    ],
)  # fmt: skip
def test_corrupt_values_raise_message_format_error(hexdata: str) -> None:
    with pytest.raises(MessageFormatError):
        decode_value(bytes.fromhex(hexdata))


# -- property-based ----------------------------------------------------------------------------


@given(messages())
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_generated_messages_round_trip(m: Message) -> None:
    data = encode_message(m)
    out = decode_message(data)
    assert message_differences(m, out) == []
    assert encode_message(out) == data  # the encoding is canonical


@given(nested_values())
def test_generated_values_round_trip(v: Any) -> None:
    assert same_value(decode_value(encode_value(v)), v)


@given(typed_arrays())
def test_generated_arrays_keep_element_types(a: Any) -> None:
    out = decode_value(encode_value(a))
    assert type(out) is type(a)
    assert all(type(x) is type(a).ELEMENT for x in out)
    assert same_value(out, a)


@given(st.binary(max_size=200))
@settings(max_examples=1000)
def test_fuzz_random_bytes_raise_only_message_format_error(data: bytes) -> None:
    for blob in (data, bytes([VERSION]) + data, VECTOR_MESSAGE_BYTES[:9] + data):
        for decode in (decode_message, decode_value):
            try:
                decode(blob)
            except MessageFormatError:
                pass


@given(messages(), st.data())
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
def test_fuzz_mutated_encodings_raise_only_message_format_error(
    m: Message, data: st.DataObject
) -> None:
    blob = bytearray(encode_message(m))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(blob) - 1))
        blob[i] = data.draw(st.integers(0, 255))
    try:
        decode_message(bytes(blob))
    except MessageFormatError:
        pass


@given(messages())
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_truncation_raises(m: Message) -> None:
    data = encode_message(m)
    for n in range(len(data)):
        with pytest.raises(MessageFormatError):
            decode_message(data[:n])


def test_every_truncation_of_a_full_message_raises() -> None:
    data = encode_message(
        full_message({"a": [Int16Array([1, 2]), {"b": b"x" * 300}]}, BodyKind.MAP)
    )
    for n in range(len(data)):
        with pytest.raises(MessageFormatError):
            decode_message(data[:n])
        with pytest.raises(MessageFormatError):
            decode_message(memoryview(data)[:n])


def test_same_value_is_strict() -> None:
    """The comparison the round trips rely on must itself tell types and NaNs apart."""
    assert not same_value(Int16(5), 5)
    assert not same_value([Int8(1)], [UInt8(1)])
    assert not same_value({"a": 1, "b": 2}, {"b": 2, "a": 1})
    assert same_value(float("nan"), float("nan"))
    assert not same_value(Float32(math.nan), float("nan"))
    assert not same_value(-0.0, 0.0)
    assert not same_value(b"a", "a")
