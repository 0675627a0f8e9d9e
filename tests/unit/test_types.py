"""Typed values, the JMS conversion table, destination names and the message model."""

from __future__ import annotations

import pytest

from gateway import subject
from gateway.errors import InvalidDestinationError, MessageFormatError
from gateway.message import MESSAGE_SLOTS, BodyKind, Destination, Message, new_message
from gateway.types import (
    Char,
    Float32,
    Int8,
    Int16,
    Int16Array,
    Int32,
    Int64,
    UInt8,
    UInt16,
    UInt32,
    UInt64,
    check_value,
    convert,
    type_name,
)


@pytest.mark.parametrize(
    "cls,lo,hi",
    [(Int8, -128, 127), (Int16, -32768, 32767), (Int32, -(2**31), 2**31 - 1),
     (Int64, -(2**63), 2**63 - 1), (UInt8, 0, 255), (UInt16, 0, 65535),
     (UInt32, 0, 2**32 - 1), (UInt64, 0, 2**64 - 1)],
)
def test_width_ranges_are_enforced(cls, lo, hi):
    assert cls(lo) == lo and cls(hi) == hi
    with pytest.raises(OverflowError):
        cls(lo - 1)
    with pytest.raises(OverflowError):
        cls(hi + 1)


def test_widths_keep_their_type_and_still_compute():
    v = UInt16(65535)
    assert type(v) is UInt16 and type_name(v) == "uint16"
    assert v + 1 == 65536 and type(v + 1) is int  # arithmetic yields plain numbers
    assert Float32(0.1) != 0.1 and Float32(0.1) == Float32(0.1)
    assert type_name(Float32(1.5)) == "float32" and type_name(1.5) == "float64"
    assert type_name(5) == "int64" and type_name(True) == "boolean"
    assert type_name(Int16Array([1, 2])) == "int16[]"
    assert type_name({"a": 1}) == "map" and type_name([1]) == "stream"
    with pytest.raises(ValueError):
        Char("ab")


# The JMS conversion table (TIBCO EMS User's Guide, "Data Type Conversion"): (value, target,
# expected or exception).
CONVERSIONS = [
    (True, "boolean", True), (True, "String", "true"), (True, "int", MessageFormatError),
    (Int8(5), "byte", Int8(5)), (Int8(5), "short", Int16(5)), (Int8(5), "int", Int32(5)),
    (Int8(5), "long", Int64(5)), (Int8(5), "String", "5"), (Int8(5), "float", MessageFormatError),
    (Int16(5), "byte", MessageFormatError), (Int16(5), "int", Int32(5)),
    (Int32(7), "long", Int64(7)), (Int32(7), "short", MessageFormatError),
    (Int64(7), "int", MessageFormatError), (Int64(7), "String", "7"),
    (Float32(1.5), "float", Float32(1.5)), (Float32(1.5), "double", 1.5),
    (Float32(1.5), "String", "1.5"), (Float32(0.1), "String", "0.1"),
    (Float32(1.5), "long", MessageFormatError),
    (2.5, "double", 2.5), (2.5, "float", MessageFormatError), (2.5, "String", "2.5"),
    (Char("x"), "char", Char("x")), (Char("x"), "String", "x"), (Char("x"), "int", MessageFormatError),
    ("true", "boolean", True), ("yes", "boolean", False), ("12", "byte", Int8(12)),
    ("300", "byte", MessageFormatError), ("12", "long", Int64(12)), ("1.25", "double", 1.25),
    ("1.25", "float", Float32(1.25)), ("abc", "int", MessageFormatError),
    ("abc", "String", "abc"), ("a", "char", MessageFormatError),
    (b"\x01", "byte[]", b"\x01"), (b"\x01", "String", MessageFormatError),
    (None, "String", None), (None, "boolean", False), (None, "int", MessageFormatError),
]


@pytest.mark.parametrize("value,target,expected", CONVERSIONS)
def test_jms_conversion_table(value, target, expected):
    if isinstance(expected, type) and issubclass(expected, Exception):
        with pytest.raises(expected):
            convert(value, target)
    else:
        got = convert(value, target)
        assert got == expected and type(got) is type(expected)


def test_property_values_cannot_be_bytes_or_containers_but_bodies_can_nest():
    with pytest.raises(MessageFormatError):
        check_value(b"x", nested=False)
    with pytest.raises(MessageFormatError):
        check_value({"a": 1}, nested=False)
    check_value({"a": [1, {"b": Int16Array([1])}, b"raw", None]})
    with pytest.raises(MessageFormatError):
        check_value({1: "non-string key"})
    with pytest.raises(MessageFormatError):
        check_value(2**70)
    deep: dict = {}
    cur = deep
    for _ in range(100):
        cur["x"] = {}
        cur = cur["x"]
    with pytest.raises(MessageFormatError):
        check_value(deep)


@pytest.mark.parametrize("make, body, kind", [
    (Message.text, "t", BodyKind.TEXT), (Message.binary, b"b", BodyKind.BYTES),
    (Message.map, {"k": 1}, BodyKind.MAP), (Message.stream, [1], BodyKind.STREAM),
])  # fmt: skip
def test_body_constructors_make_what_the_class_makes(make, body, kind):
    """Without keywords they skip the class call; every slot must still be as __init__ sets it."""
    fast, full = make(body), Message(body, body_kind=kind)
    for slot in MESSAGE_SLOTS:
        a, b = getattr(fast, slot), getattr(full, slot)
        assert a == b and type(a) is type(b), slot
    assert fast.properties is not make(body).properties
    assert make(body, priority=7).priority == 7
    blank = new_message(body, kind)
    for slot in MESSAGE_SLOTS:
        assert getattr(blank, slot) == getattr(full, slot), slot


def test_message_validate_checks_body_kind_and_properties():
    Message.text("x", properties={"a": Int8(1)}).validate()
    with pytest.raises(MessageFormatError):
        Message("x", body_kind=BodyKind.BYTES).validate()
    with pytest.raises(MessageFormatError):
        Message.text("x", properties={"a": b"no"}).validate()
    with pytest.raises(MessageFormatError):
        Message.text("x", priority=10).validate()
    assert Message({"a": 1}).body_kind is BodyKind.MAP
    assert Message([1]).body_kind is BodyKind.STREAM
    assert Message(b"x").body_kind is BodyKind.BYTES
    assert Message().body_kind is BodyKind.NONE


def test_header_identifiers_read_as_selectors_expect():
    m = Message.text("x", destination=Destination.queue("q"), type="t", correlation_id=b"\xffz",
                     reply_to=Destination.topic("r"), priority=7)
    assert m.header("JMSDeliveryMode") == "PERSISTENT"
    assert m.header("JMSDestination") == "q" and m.header("JMSReplyTo") == "r"
    assert m.header("JMSPriority") == 7 and m.header("JMSType") == "t"
    assert m.header("JMSCorrelationID") == "\ufffdz"
    assert m.header("absent") is None


def test_destination_text_round_trip_and_equality():
    d = Destination.queue("a.b")
    assert Destination.parse(str(d)) == d and hash(Destination.queue("a.b")) == hash(d)
    assert Destination.topic("a.b") != d
    assert Destination.queue("$TMP$.gw.1").is_temporary


@pytest.mark.parametrize("name", ["News..Flood", "WRONG.", ".TRIPLE.WRONG..", ""])
def test_invalid_names_N1(name):
    with pytest.raises(InvalidDestinationError):
        subject.validate(name)


def test_backslash_is_literal_and_dot_still_separates_N2():
    assert subject.validate("News.Tennis.Stats.Roger\\.Federer") == [
        "News", "Tennis", "Stats", "Roger\\", "Federer"]


def test_limits_N3():
    subject.validate(".".join(["a"] * 64))
    with pytest.raises(InvalidDestinationError):
        subject.validate(".".join(["a"] * 65))
    subject.validate("a" * 127)
    with pytest.raises(InvalidDestinationError):
        subject.validate("a" * 128)
    with pytest.raises(InvalidDestinationError):
        subject.validate("a" * 100 + "." + "b" * 100 + "." + "c" * 48)  # 250 characters
    subject.validate("a" * 100 + "." + "b" * 100 + "." + "c" * 47)  # 249 is the limit


def test_wildcard_syntax():
    subject.validate("foo.*.bar", wildcards=True)
    subject.validate("foo.>", wildcards=True)
    for bad in ("foo.>.bar", "foo.b*", "foo.*"):
        with pytest.raises(InvalidDestinationError):
            subject.validate(bad, wildcards=bad != "foo.*")
    with pytest.raises(InvalidDestinationError):
        subject.validate("$sys.x")
    subject.validate("$sys.undelivered", system=True)


def test_contains_and_intersects():
    assert subject.contains("foo.>", "foo.bar.*")
    assert subject.contains("foo.>", "foo.*.baz")
    assert not subject.contains("foo.bar.*", "foo.*.baz")
    assert subject.intersects("foo.bar.*", "foo.*.baz")
    assert not subject.contains("foo.*", "foo.>")
    assert subject.contains(">", "a")
    assert not subject.intersects("a.b", "a.c")
    assert subject.matches("foo.*", "foo.bar") and not subject.matches("foo.*", "foo.bar.boo")
