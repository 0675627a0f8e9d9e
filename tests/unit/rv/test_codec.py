"""The RV-style wire format: byte-exact vectors both ways, every type's round trip, limits,
what the decoder refuses, string encodings, and hypothesis (round trips; arbitrary and mutated
bytes raise only FormatError)."""

from __future__ import annotations

import math
from array import array
from ipaddress import IPv4Address

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transports.rv.codec import (
    DEFAULT_MAX_DEPTH,
    MAX_MESSAGE,
    FormatError,
    MessageTooLarge,
    decode,
    encode,
    peek_subject,
)
from transports.rv.message import (
    DATETIME_MAX,
    DATETIME_MIN,
    CmLabel,
    FieldError,
    Message,
    Origin,
    Route,
    RvDateTime,
    RvType,
)

from .rvgen import messages, top_messages


def h(s: str) -> bytes:
    return bytes.fromhex(s)


def _nested(depth: int) -> Message:
    """``depth`` levels of messages, the top one included."""
    m = Message().add("leaf", 1, RvType.U8)
    for i in range(depth - 1):
        m = Message().add(f"l{i}", m)
    return m


# (id, message, its bytes), written by hand from README "Messages and the wire format".
VECTORS = [
    ("empty", Message(), "01 00 00"),
    ("i32", Message("A.B").add("n", 5, RvType.I32),
     "01 00 03 412e42  12 01 0000 00000004 6e 00000005"),
    ("string with id", Message().add("s", "hi", fid=258),
     "01 00 00  08 01 0102 00000003 73 686900"),
    ("nested msg", Message().add("m", Message().add(None, True)),
     "01 00 00  01 01 0000 00000009 6d  09 00 0000 00000001 01"),
    ("datetimes", Message().add("t", RvDateTime(1, 2)).add("u", RvDateTime(-1, 999_999)),
     "01 00 00  03 01 0000 00000008 74 0000000001000002"
     "          03 01 0000 00000008 75 ffffffffff0f423f"),
    ("u16array", Message().add("a", [1, 0x0203], RvType.U16ARRAY),
     "01 00 00  25 01 0000 00000004 61 0001 0203"),
    ("stringarray", Message().add(None, ["a", ""]),
     "01 00 00  30 00 0000 0000000f 00000002 00000002 6100 00000001 00"),
    ("msgarray", Message().add(None, [Message(), Message().add(None, 7, RvType.U8)]),
     "01 00 00  31 00 0000 00000015 00000002 00000000 00000009 0f 00 0000 00000001 07"),
    ("ip", Message().add("ip", IPv4Address("1.2.3.4")).add("p", 80, RvType.IPPORT16),
     "01 00 00  1b 02 0000 00000004 6970 01020304  1a 01 0000 00000002 70 0050"),
    ("scalars", Message().add("f", 1.5, RvType.F32).add("b", -1, RvType.I8)
     .add("u", 2**64 - 1, RvType.U64).add("d", False),
     "01 00 00  18 01 0000 00000004 66 3fc00000  0e 01 0000 00000001 62 ff"
     "          15 01 0000 00000008 75 ffffffffffffffff  09 01 0000 00000001 64 00"),
    ("bytes types", Message().add("o", b"\x00\xff").add("x", b"<a/>", RvType.XML)
     .add(None, b"\xff", RvType.ENCRYPTED).add("x", b"\x01\x02", 200),
     "01 00 00  07 01 0000 00000002 6f 00ff  2f 01 0000 00000004 78 3c612f3e"
     "          20 00 0000 00000001 ff  c8 01 0000 00000002 78 0102"),
]


def _envelope() -> Message:
    m = Message("A", "R")
    m.cm = CmLabel("c", 7, 1.5)
    m.origin = Origin("g", 2)
    m.route = Route("N", 3)
    return m


def _latin1() -> Message:
    m = Message("A").add("s", "é")
    m.encoding = "latin-1"
    return m


VECTORS += [
    ("envelope", _envelope(),
     "01 1d 01 41  01 52  01 63 0000000000000007 3ff8000000000000  01 67 02  01 4e 03"),
    ("latin-1", _latin1(),
     "01 02 01 41  07 6c6174696e2d31  08 01 0000 00000002 73 e900"),
]


@pytest.mark.parametrize(("msg", "wire"), [(m, w) for _, m, w in VECTORS],
                         ids=[i for i, _, _ in VECTORS])
def test_vectors_both_ways(msg, wire):
    data = h(wire)
    assert encode(msg) == data
    assert decode(data) == msg
    assert decode(bytearray(data)) == msg
    assert decode(memoryview(b"xx" + data)[2:]) == msg
    assert encode(decode(data)) == data


def test_type_is_kept_on_a_round_trip():
    m = Message().add("a", 7, RvType.U8).add("b", 7, RvType.I16).add("c", 7)
    d = decode(encode(m))
    assert [f.type for f in d] == [RvType.U8, RvType.I16, RvType.I64]
    assert d.get("a") == 7


ALL_TYPES = [
    (RvType.MSG, Message().add("x", 1)),
    (RvType.DATETIME, RvDateTime(1_700_000_000, 123_456)),
    (RvType.OPAQUE, b"\x00\x01\xff"),
    (RvType.STRING, "héllo ✓"),
    (RvType.XML, b"<a>b</a>"),
    (RvType.BOOL, True),
    (RvType.I8, -128), (RvType.U8, 255), (RvType.I16, -32768), (RvType.U16, 65535),
    (RvType.I32, -(2**31)), (RvType.U32, 2**32 - 1), (RvType.I64, -(2**63)),
    (RvType.U64, 2**64 - 1), (RvType.F32, -2.5), (RvType.F64, 1e300),
    (RvType.IPPORT16, 65535), (RvType.IPADDR32, IPv4Address("255.0.0.1")),
    (RvType.ENCRYPTED, b"secret"),
    (RvType.I8ARRAY, [-128, 0, 127]), (RvType.U8ARRAY, [0, 255]),
    (RvType.I16ARRAY, [-32768, 32767]), (RvType.U16ARRAY, [0, 65535]),
    (RvType.I32ARRAY, [-(2**31), 2**31 - 1]), (RvType.U32ARRAY, [0, 2**32 - 1]),
    (RvType.I64ARRAY, [-(2**63), 2**63 - 1]), (RvType.U64ARRAY, [0, 2**64 - 1]),
    (RvType.F32ARRAY, [1.5, -math.inf, math.nan]), (RvType.F64ARRAY, [0.1, -0.0, math.inf]),
    (RvType.STRINGARRAY, ["a", "", "ü"]),
    (RvType.MSGARRAY, [Message(), Message().add("y", "z")]),
    (99, b"unknown type"),
]


@pytest.mark.parametrize(("t", "value"), ALL_TYPES, ids=[str(t) for t, _ in ALL_TYPES])
def test_every_type_round_trips(t, value):
    m = Message("S").add("f", value, t, fid=9)
    d = decode(encode(m))
    assert d == m
    assert d.fields[0].type == t and d.fields[0].fid == 9


def test_extremes_round_trip():
    m = Message("X")
    m.add("dmin", RvDateTime(DATETIME_MIN, 999_999)).add("dmax", RvDateTime(DATETIME_MAX, 0))
    assert DATETIME_MIN == -(2**39) and DATETIME_MAX == 2**39 - 1
    for v in (-(2**63), 2**63 - 1):
        m.add("i64", v)
    m.add("u64", 0, RvType.U64).add("u64", 2**64 - 1, RvType.U64)
    for f in (math.nan, math.inf, -math.inf, -0.0, 5e-324):
        m.add("f64", f).add("f32", f if abs(f) != 5e-324 else 1e-45, RvType.F32)
    m.add("s", "").add("o", b"").add("sub", Message()).add("arr", [], RvType.I32ARRAY)
    m.add("sa", [], RvType.STRINGARRAY).add("ma", [], RvType.MSGARRAY)
    d = decode(encode(m))
    assert d == m
    assert math.isnan(d.get_all("f64")[0]) and math.copysign(1, d.get_all("f64")[3]) == -1
    assert d.get("dmin") == RvDateTime(-(2**39), 999_999)


def test_deep_nesting_and_msgarrays_of_nested_messages():
    deep = _nested(20)
    arr = Message().add("arr", [_nested(5), _nested(12), Message()])
    for m in (deep, arr):
        assert decode(encode(m)) == m
    inner = decode(encode(deep))
    for i in range(18, -1, -1):
        inner = inner.get(f"l{i}")
    assert inner.get("leaf") == 1


def test_depth_limit_on_decode_and_encode():
    ok = encode(_nested(DEFAULT_MAX_DEPTH))
    assert decode(ok) == _nested(DEFAULT_MAX_DEPTH)
    too_deep = encode(_nested(DEFAULT_MAX_DEPTH + 1), max_depth=DEFAULT_MAX_DEPTH + 1)
    with pytest.raises(FormatError, match="deeper"):
        decode(too_deep)
    assert decode(too_deep, max_depth=DEFAULT_MAX_DEPTH + 1) == _nested(DEFAULT_MAX_DEPTH + 1)
    with pytest.raises(FieldError, match="deeper"):
        encode(_nested(DEFAULT_MAX_DEPTH + 1))
    in_array = Message().add("a", [_nested(DEFAULT_MAX_DEPTH)])
    with pytest.raises(FieldError, match="deeper"):
        encode(in_array)
    with pytest.raises(FormatError, match="deeper"):
        decode(encode(in_array, max_depth=DEFAULT_MAX_DEPTH + 1))
    # A hostile message: thousands of bytes of nested headers, no RecursionError.
    hostile = b"\x01\x00\x00" + b"".join(
        h("01 00 0000") + (8 * (5000 - i - 1)).to_bytes(4, "big") for i in range(5000))
    with pytest.raises(FormatError, match="deeper"):
        decode(hostile)


def test_a_message_that_contains_itself_is_refused():
    m = Message()
    with pytest.raises(FieldError, match="itself"):
        m.add("me", m)
    sub = Message()
    m.add("sub", sub)
    sub.fields.append(m.fields[0])  # a cycle made behind the model's back
    with pytest.raises(FieldError, match="deeper"):
        encode(m)


REFUSED = [
    ("02 00 00", "version"),
    ("01 20 00", "flags"),
    ("01 80 00", "flags"),
    ("01 10 00", "route network"),
    ("01 10 00 00", "route network"),
    ("01 10 00 01 50", "router hop count"),
    ("01 00", "shorter"),
    ("01 00 05 41", "send subject"),
    ("01 00 01 ff", "UTF-8"),
    ("01 01 00 00", "reply subject"),
    ("01 04 00 01 63 00", "CM label"),
    ("01 04 00 01 63 0000000000000000 bff0000000000000", "time limit"),
    ("01 08 00 01 67", "hop count"),
    ("01 02 00", "encoding"),
    ("01 00 00 12 00 0000 000000", "header"),
    ("01 00 00 12 05 0000 00000004 6e", "name"),
    ("01 00 00 12 80 0000 00000004" + "61" * 128 + "00000005", "name of 128"),
    ("01 00 00 12 01 0000 00000004 ff 00000005", "not UTF-8"),
    ("01 00 00 12 01 0000 00000004 00 00000005", "NUL"),
    ("01 00 00 12 00 0001 00000004 00000005", "without a name"),
    ("01 00 00 12 01 0001 00000004 6e 00000005 12 01 0001 00000004 6e 00000005", "repeated"),
    ("01 00 00 12 01 0000 00000003 6e 000005", "takes 4"),
    ("01 00 00 12 01 0000 00000008 6e 00000005", "runs past"),
    ("01 00 00 09 00 0000 00000001 02", "bool"),
    ("01 00 00 09 00 0000 00000000", "bool"),
    ("01 00 00 08 00 0000 00000002 6869", "NUL-terminated"),
    ("01 00 00 08 00 0000 00000000", "NUL-terminated"),
    ("01 00 00 08 00 0000 00000003 680000", "NUL before"),
    ("01 00 00 03 00 0000 00000008 00000000000f4240", "microseconds"),
    ("01 00 00 03 00 0000 00000004 00000000", "takes 8"),
    ("01 00 00 1b 00 0000 00000005 0102030405", "takes 4"),
    ("01 00 00 25 00 0000 00000003 000100", "whole number"),
    ("01 00 00 30 00 0000 00000002 0000", "count"),
    ("01 00 00 30 00 0000 00000008 00000001 00000005", "runs past its field"),
    ("01 00 00 30 00 0000 00000006 00000000 0000", "after"),
    ("01 00 00 30 00 0000 00000004 00000001", "runs past its field"),
    ("01 00 00 31 00 0000 0000000b 00000001 00000003 090000", "header"),
    ("01 00 00 01 00 0000 00000003 090000", "header"),
    ("01 00 00 01 00 0000 0000000a 09 00 0000 00000001 01 ff", "header"),
]


@pytest.mark.parametrize(("wire", "reason"), REFUSED)
def test_decoder_refuses(wire, reason):
    with pytest.raises(FormatError, match=reason):
        decode(h(wire))


def test_size_limit():
    assert MAX_MESSAGE == 64 * 1024 * 1024
    head = len(encode(Message("S").add("o", b"")))
    fits = Message("S").add("o", bytes(MAX_MESSAGE - head))
    data = encode(fits)
    assert len(data) == MAX_MESSAGE
    assert len(decode(data).get("o")) == MAX_MESSAGE - head
    del data
    with pytest.raises(MessageTooLarge) as err:
        encode(Message("S").add("o", bytes(MAX_MESSAGE - head + 1)))
    assert err.value.size == MAX_MESSAGE + 1
    assert isinstance(err.value, ValueError)
    with pytest.raises(FormatError, match="exceeds"):
        decode(bytes(MAX_MESSAGE + 1))


def test_string_encodings():
    m = _latin1()
    assert decode(encode(m)).get("s") == "é"
    m.add("sa", ["ö", "x"])
    assert decode(encode(m)) == m
    # A string that its encoding cannot decode stays bytes, and the field stays a STRING.
    bad = h("01 00 00  08 01 0000 00000003 73 ff fe 00  12 01 0000 00000004 6e 00000005")
    d = decode(bad)
    assert d.get("s") == b"\xff\xfe" and d.fields[0].type == RvType.STRING
    assert d.get("n") == 5
    assert encode(d) == bad
    # An encoding tag this side does not know: every string stays bytes.
    odd = h("01 02 00  05 6e6f6e6f6e  08 01 0000 00000002 73 6100")
    d = decode(odd)
    assert d.encoding == "nonon" and d.get("s") == b"a"
    # UTF-8 is the default; naming it adds no tag.
    m = Message("A").add("s", "é")
    m.encoding = "UTF8"
    assert encode(m) == encode(Message("A").add("s", "é"))


def test_encoding_errors():
    m = Message("A").add("s", "€")
    m.encoding = "latin-1"
    with pytest.raises(FieldError, match="cannot be encoded in"):
        encode(m)
    m.encoding = "no-such-codec"
    with pytest.raises(FieldError, match="unknown string encoding"):
        encode(m)
    m = Message("A").add("s", "a")
    m.encoding = "utf-16"
    with pytest.raises(FieldError, match="NUL"):
        encode(m)
    with pytest.raises(FieldError, match="send subject"):
        encode(Message("a" * 256))
    with pytest.raises(FieldError, match="reply subject"):
        encode(Message("a", ""))
    m = Message("a")
    m.cm = CmLabel("c", -1)
    with pytest.raises(FieldError, match="U64"):
        encode(m)
    m.cm = CmLabel("c", 1, math.nan)
    with pytest.raises(FieldError, match="time limit"):
        encode(m)
    m.cm = None
    m.origin = Origin("g", 256)
    with pytest.raises(FieldError, match="hop count"):
        encode(m)
    m.origin = None
    m.route = Route("N", -1)
    with pytest.raises(FieldError, match="router hop count"):
        encode(m)
    m.route = Route("", 1)
    with pytest.raises(FieldError, match="route network"):
        encode(m)


def test_peek_subject():
    assert peek_subject(encode(Message("A.B.C").add("x", 1))) == "A.B.C"
    assert peek_subject(memoryview(encode(Message()))) is None
    with pytest.raises(FormatError):
        peek_subject(b"\x01\x00")
    with pytest.raises(FormatError):
        peek_subject(b"\x01\x00\x09AB")


def test_arrays_decode_as_arrays_in_native_order():
    m = decode(encode(Message().add("a", array("h", [1, -2, 300]))))
    a = m.get("a")
    assert isinstance(a, array) and a.tolist() == [1, -2, 300]


# -- hypothesis ---------------------------------------------------------------------------

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _decode_or_format_error(data: bytes) -> None:
    try:
        m = decode(data)
    except FormatError:
        return
    assert encode(m) is not None  # whatever decodes encodes again


@FUZZ
@given(st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_format_errors(data):
    _decode_or_format_error(data)


@FUZZ
@given(st.binary(max_size=120))
def test_arbitrary_bodies_behind_a_valid_envelope(body):
    _decode_or_format_error(b"\x01\x00\x01A" + body)


@FUZZ
@given(messages(), st.data())
def test_mutated_encodings_raise_only_format_errors(msg, data):
    wire = bytearray(encode(msg))
    action = data.draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
    at = data.draw(st.integers(0, len(wire)))
    if action == "flip" and at < len(wire):
        wire[at] ^= data.draw(st.integers(1, 255))
    elif action == "cut":
        del wire[at:]
    elif action == "insert":
        wire[at:at] = data.draw(st.binary(min_size=1, max_size=4))
    elif at < len(wire):
        del wire[at]
    _decode_or_format_error(bytes(wire))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(top_messages())
def test_generated_messages_round_trip(msg):
    wire = encode(msg)
    back = decode(wire)
    assert back == msg
    assert encode(back) == wire
