"""The default RV ⇄ core mapping (mappings/rv.py), row by row of EMS's translation tables.

TIBCO EMS User's Guide, "Working With TIBCO Rendezvous", "Message Translation": the header
table (``JMSHeaders``), the properties submessage (``JMSProperties``), the body tables (both
directions) and the datatype table (both directions, and the rows that go one way only). Every
RV message crosses the bus's codec (``encode`` / ``decode``) between the two halves, so the
types checked are the ones that travel.
"""

from __future__ import annotations

import math
from array import array
from ipaddress import IPv4Address
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rv.rvgen import value_of
from strategies import INT64_MAX, INT64_MIN, same_value

from gateway import types as gt
from gateway.errors import MessageFormatError
from gateway.message import BodyKind, DeliveryMode, Destination, Message
from mappings.rv import core_value, message_to_rv, rv_to_message, rv_value
from transports.rv import CmLabel, RvDateTime, RvType, decode, encode
from transports.rv import Message as RvMessage

T = Destination.topic("plant.a")
NOW = 1_700_000_000_000
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def wire(rv: RvMessage) -> RvMessage:
    """``rv`` as another process on the bus receives it."""
    return decode(encode(rv))


def out(msg: Message, **kw: Any) -> RvMessage:
    return wire(message_to_rv(msg, send_subject="plant.a", reply_subject=kw.pop("reply", None),
                              **kw))


def back(rv: RvMessage, **kw: Any) -> Message:
    kw.setdefault("reply_to", None)
    return rv_to_message(wire(rv), destination=T, now_ms=NOW, **kw)


def field(rv: RvMessage, name: str) -> tuple[int, Any]:
    f = rv.get_field(name)
    assert f is not None, f"no field {name!r} in {rv}"
    return f.type, f.value


# -- core → RV: structure, headers, properties ----------------------------------------------


def test_export_is_headers_then_properties_then_the_body() -> None:
    m = Message.map({"temp": gt.Float32(21.5), "site": "a"}, properties={"unit": "C"})
    rv = out(m, reply="_INBOX.h.1")
    assert rv.names() == ["JMSHeaders", "JMSProperties", "temp", "site"]
    assert rv.send_subject == "plant.a" and rv.reply_subject == "_INBOX.h.1"


def test_headers_submessage_has_each_header_in_its_table_type() -> None:
    m = Message("x", delivery_mode=DeliveryMode.RELIABLE, priority=7, correlation_id="c-1",
                type="reading", expiration=NOW + 5000, delivery_time=NOW + 10,
                timestamp=NOW, message_id="ID:1")
    m.redelivered = True
    h = field(out(m), "JMSHeaders")[1]
    assert [(f.name, f.type, f.value) for f in h] == [
        ("JMSDeliveryMode", RvType.U8, 22),
        ("JMSDeliveryTime", RvType.U64, NOW + 10),
        ("JMSPriority", RvType.U8, 7),
        ("JMSTimestamp", RvType.U64, NOW),
        ("JMSExpiration", RvType.U64, NOW + 5000),
        ("JMSType", RvType.STRING, "reading"),
        ("JMSMessageID", RvType.STRING, "ID:1"),
        ("JMSCorrelationID", RvType.STRING, "c-1"),
        ("JMSRedelivered", RvType.BOOL, True),
    ]


def test_null_headers_are_left_out_and_a_binary_correlation_id_is_opaque() -> None:
    m = Message("x", correlation_id=b"\x00\xff")
    h = field(out(m), "JMSHeaders")[1]
    assert h.names() == ["JMSDeliveryMode", "JMSPriority", "JMSExpiration",
                         "JMSCorrelationID", "JMSRedelivered"]
    assert field(h, "JMSCorrelationID") == (RvType.OPAQUE, b"\x00\xff")
    assert field(h, "JMSExpiration") == (RvType.U64, 0)


def test_properties_submessage_keeps_order_and_types_and_leaves_out_null() -> None:
    props = {"b": gt.Int16(-2), "a": "x", "n": None, "f": gt.Float32(0.5), "ok": True,
             "big": gt.UInt64(2**64 - 1), "c": gt.Char("z")}
    p = field(out(Message("x", properties=props)), "JMSProperties")[1]
    assert [(f.name, f.type, f.value) for f in p] == [
        ("b", RvType.I16, -2), ("a", RvType.STRING, "x"), ("f", RvType.F32, 0.5),
        ("ok", RvType.BOOL, True), ("big", RvType.U64, 2**64 - 1), ("c", RvType.STRING, "z"),
    ]


@pytest.mark.parametrize(("headers", "properties"),
                         [(True, True), (False, True), (True, False), (False, False)])
def test_export_headers_and_export_properties_switch_the_submessages(
        headers: bool, properties: bool) -> None:
    m = Message("hello", properties={"p": 1}, type="t")
    rv = out(m, export_headers=headers, export_properties=properties)
    assert rv.names() == (["JMSHeaders"] * headers + ["JMSProperties"] * properties
                          + ["JMSText"])


def test_no_properties_no_properties_submessage() -> None:
    assert out(Message("x")).names() == ["JMSHeaders", "JMSText"]


# -- core → RV: bodies ------------------------------------------------------------------------


@pytest.mark.parametrize(("msg", "name", "rv_type", "value"), [
    (Message("héllo"), "JMSText", RvType.STRING, "héllo"),
    (Message(b"\x00\x01"), "JMSBytes", RvType.OPAQUE, b"\x00\x01"),
    (Message(b"\xac\xed", body_kind=BodyKind.OBJECT), "JMSObject", RvType.OPAQUE, b"\xac\xed"),
])
def test_body_export_rows(msg: Message, name: str, rv_type: int, value: Any) -> None:
    rv = out(msg, export_headers=False)
    assert rv.names() == [name]
    assert field(rv, name) == (rv_type, value)


def test_a_map_body_is_top_level_fields_of_the_same_names() -> None:
    rv = out(Message.map({"a": 1, "b": {"c": "d"}, "e": gt.Int16Array([1, -1])}),
             export_headers=False)
    assert rv.names() == ["a", "b", "e"]
    assert field(rv, "a") == (RvType.I64, 1)
    t, sub = field(rv, "b")
    assert t == RvType.MSG and field(sub, "c") == (RvType.STRING, "d")
    assert field(rv, "e") == (RvType.I16ARRAY, array("h", [1, -1]))


def test_a_stream_body_is_a_submessage_of_unnamed_fields_in_order() -> None:
    rv = out(Message.stream([gt.Int8(1), "two", [3.0], {"k": True}]), export_headers=False)
    t, s = field(rv, "JMSStream")
    assert t == RvType.MSG
    assert [(f.name, f.type) for f in s] == [(None, RvType.I8), (None, RvType.STRING),
                                             (None, RvType.MSG), (None, RvType.MSG)]
    assert [(f.name, f.type, f.value) for f in s.fields[2].value] == [(None, RvType.F64, 3.0)]
    assert field(s.fields[3].value, "k") == (RvType.BOOL, True)


def test_no_body_is_only_the_submessages() -> None:
    assert out(Message(None, properties={"p": 1})).names() == ["JMSHeaders", "JMSProperties"]


def test_what_rv_cannot_carry_fails_the_export() -> None:
    with pytest.raises(MessageFormatError, match="NUL"):
        message_to_rv(Message("a\x00b"), send_subject="s", reply_subject=None)
    with pytest.raises(MessageFormatError, match="_x"):
        message_to_rv(Message.map({"_x": 1}), send_subject="s", reply_subject=None)


# -- the datatype table, core → RV ------------------------------------------------------------

EXPORT_ROWS = [
    (True, RvType.BOOL, True),
    (gt.Int8(-128), RvType.I8, -128),
    (gt.Int16(-32768), RvType.I16, -32768),
    (gt.Int32(2**31 - 1), RvType.I32, 2**31 - 1),
    (gt.Int64(-(2**63)), RvType.I64, -(2**63)),
    (5, RvType.I64, 5),
    (gt.Float32(1.5), RvType.F32, 1.5),
    (0.1, RvType.F64, 0.1),
    ("s", RvType.STRING, "s"),
    (b"\x00b", RvType.OPAQUE, b"\x00b"),
    # the core's own types, EMS has no Java type for
    (gt.UInt8(255), RvType.U8, 255),
    (gt.UInt16(65535), RvType.U16, 65535),
    (gt.UInt32(2**32 - 1), RvType.U32, 2**32 - 1),
    (gt.UInt64(2**64 - 1), RvType.U64, 2**64 - 1),
    (gt.Char("é"), RvType.STRING, "é"),
    (gt.Int8Array([1, -1]), RvType.I8ARRAY, array("b", [1, -1])),
    (gt.Int16Array([1, -1]), RvType.I16ARRAY, array("h", [1, -1])),
    (gt.Int32Array([1, -1]), RvType.I32ARRAY, array("i", [1, -1])),
    (gt.Int64Array([1, -(2**63)]), RvType.I64ARRAY, array("q", [1, -(2**63)])),
    (gt.UInt8Array([255]), RvType.U8ARRAY, array("B", [255])),
    (gt.UInt16Array([65535]), RvType.U16ARRAY, array("H", [65535])),
    (gt.UInt32Array([2**32 - 1]), RvType.U32ARRAY, array("I", [2**32 - 1])),
    (gt.UInt64Array([2**64 - 1]), RvType.U64ARRAY, array("Q", [2**64 - 1])),
    (gt.Float32Array([0.5]), RvType.F32ARRAY, array("f", [0.5])),
    (gt.Float64Array([0.1]), RvType.F64ARRAY, array("d", [0.1])),
]


@pytest.mark.parametrize(("value", "rv_type", "rv_value_"), EXPORT_ROWS)
def test_datatype_export_rows(value: Any, rv_type: int, rv_value_: Any) -> None:
    rv = out(Message.map({"v": value}), export_headers=False)
    t, v = field(rv, "v")
    assert t == rv_type
    assert v == rv_value_ and type(v) is type(rv_value_)


def test_boolean_array_and_null_entries() -> None:
    rv = out(Message.map({"n": None, "b": gt.BoolArray([True, False])}), export_headers=False)
    assert rv.names() == ["b"]
    t, s = field(rv, "b")
    assert t == RvType.MSG and [(f.name, f.type, f.value) for f in s] == [
        (None, RvType.BOOL, True), (None, RvType.BOOL, False)]


def test_rv_value_refuses_what_has_no_type() -> None:
    with pytest.raises(MessageFormatError):
        rv_value(object())


# -- the datatype table, RV → core ------------------------------------------------------------

IMPORT_ROWS = [
    # both ways
    (RvType.BOOL, False, False),
    (RvType.I8, -5, gt.Int8(-5)),
    (RvType.I16, -300, gt.Int16(-300)),
    (RvType.I32, -70000, gt.Int32(-70000)),
    (RvType.I64, -(2**40), -(2**40)),
    (RvType.F32, 0.25, gt.Float32(0.25)),
    (RvType.F64, 0.1, 0.1),
    (RvType.STRING, "ü", "ü"),
    (RvType.OPAQUE, b"\x00", b"\x00"),
    (RvType.I16ARRAY, [1, -2], gt.Int16Array([1, -2])),
    (RvType.I32ARRAY, [1, -2], gt.Int32Array([1, -2])),
    (RvType.I64ARRAY, [1, -2], gt.Int64Array([1, -2])),
    (RvType.F32ARRAY, [0.5], gt.Float32Array([0.5])),
    (RvType.F64ARRAY, [0.1], gt.Float64Array([0.1])),
    # import only: the unsigned types widen to the next signed Java type
    (RvType.U8, 255, gt.Int16(255)),
    (RvType.U16, 65535, gt.Int32(65535)),
    (RvType.U32, 2**32 - 1, 2**32 - 1),
    (RvType.U64, 2**63 - 1, 2**63 - 1),
    (RvType.U64, 2**64 - 1, gt.UInt64(2**64 - 1)),  # above a long: kept, not overflowed
    (RvType.U8ARRAY, [255], gt.Int16Array([255])),
    (RvType.U16ARRAY, [65535], gt.Int32Array([65535])),
    (RvType.U32ARRAY, [2**32 - 1], gt.Int64Array([2**32 - 1])),
    (RvType.U64ARRAY, [2**63 - 1], gt.Int64Array([2**63 - 1])),
    (RvType.U64ARRAY, [1, 2**64 - 1], gt.UInt64Array([1, 2**64 - 1])),
    # import only: address and port as Java reads their bits, time as a long, XML as bytes
    (RvType.IPPORT16, 7500, gt.Int16(7500)),
    (RvType.IPPORT16, 65535, gt.Int16(-1)),
    (RvType.IPADDR32, IPv4Address("10.0.0.1"), gt.Int32(0x0A000001)),
    (RvType.IPADDR32, IPv4Address("192.168.0.1"), gt.Int32(-1062731775)),
    (RvType.DATETIME, RvDateTime(1_700_000_000, 123_456), 1_700_000_000_123),
    (RvType.DATETIME, RvDateTime(-1, 500_000), -500),
    (RvType.XML, b"<a/>", b"<a/>"),
    (RvType.I8ARRAY, [1, -1], b"\x01\xff"),
    # beyond the table: arrays of strings and messages as streams
    (RvType.STRINGARRAY, ["a", "b"], ["a", "b"]),
]


@pytest.mark.parametrize(("rv_type", "value", "core"), IMPORT_ROWS)
def test_datatype_import_rows(rv_type: int, value: Any, core: Any) -> None:
    m = back(RvMessage().add("v", value, rv_type))
    assert m.body_kind is BodyKind.MAP
    assert same_value(m.body["v"], core), (m.body["v"], core)


def test_ipaddr32_bits_read_back_as_the_address() -> None:
    v = core_value(RvType.IPADDR32, IPv4Address("192.168.0.1"))
    assert IPv4Address(v & 0xFFFFFFFF) == IPv4Address("192.168.0.1")


def test_a_message_array_imports_as_a_stream_of_maps() -> None:
    rv = RvMessage().add("v", [RvMessage().add("a", 1), RvMessage().add("b", "x")],
                         RvType.MSGARRAY)
    assert back(rv).body == {"v": [{"a": 1}, {"b": "x"}]}


def test_fields_without_a_name_or_of_no_importable_type_are_not_imported() -> None:
    rv = RvMessage().add(None, 1).add("e", b"\x01", RvType.ENCRYPTED).add("id", 2, fid=7)
    rv.add("id", 3)  # a repeated name: the first counts
    assert back(rv).body == {"id": 2}


def test_imported_values_round_trip_exactly_where_the_table_goes_both_ways() -> None:
    for rv_type, value, core in IMPORT_ROWS[:14]:
        rv = out(Message.map({"v": core}), export_headers=False)
        f = rv.get_field("v")
        assert f is not None and f.type == rv_type
        assert RvMessage().add("v", value, rv_type) == RvMessage().add("v", f.value, f.type)


# -- RV → core: bodies ------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "rv_type", "value", "kind", "body"), [
    ("JMSText", RvType.STRING, "hé", BodyKind.TEXT, "hé"),
    ("JMSBytes", RvType.OPAQUE, b"\x00\x01", BodyKind.BYTES, b"\x00\x01"),
    ("JMSObject", RvType.OPAQUE, b"\xac\xed", BodyKind.OBJECT, b"\xac\xed"),
    ("JMSStream", RvType.OPAQUE, b"\x01", BodyKind.BYTES, b"\x01"),  # EMS's private encoding
])
def test_body_import_rows(name: str, rv_type: int, value: Any, kind: BodyKind,
                          body: Any) -> None:
    m = back(RvMessage().add(name, value, rv_type).add("other", 1))
    assert m.body_kind is kind and m.body == body and type(m.body) is type(body)


def test_a_stream_field_imports_as_a_stream_body() -> None:
    s = RvMessage().add(None, 1, RvType.I16).add(None, "x").add(None, RvMessage().add("k", 2))
    m = back(RvMessage().add("JMSStream", s))
    assert m.body_kind is BodyKind.STREAM
    assert same_value(m.body, [gt.Int16(1), "x", {"k": 2}])


def test_the_first_body_field_of_the_table_decides() -> None:
    rv = RvMessage().add("JMSText", "t").add("JMSBytes", b"b")
    m = back(rv)
    assert m.body_kind is BodyKind.BYTES and m.body == b"b"


def test_without_a_body_field_every_named_field_is_a_map_entry() -> None:
    rv = RvMessage().add("JMSHeaders", RvMessage().add("JMSType", "t"))
    rv.add("JMSProperties", RvMessage().add("p", 1)).add("a", 1).add("JMSText", 5)
    m = back(rv)
    assert m.body_kind is BodyKind.MAP and m.body == {"a": 1, "JMSText": 5}
    assert m.type == "t" and m.properties["p"] == 1


def test_an_empty_message_is_an_empty_map() -> None:
    m = back(RvMessage())
    assert m.body_kind is BodyKind.MAP and m.body == {}


# -- RV → core: headers and properties --------------------------------------------------------


def test_import_sets_destination_reply_to_delivery_mode_and_timestamp() -> None:
    reply = Destination.topic("$TMP$.rv.1")
    m = back(RvMessage().add("a", 1), reply_to=reply, delivery_mode=DeliveryMode.PERSISTENT)
    assert m.destination == T and m.reply_to == reply
    assert m.delivery_mode is DeliveryMode.PERSISTENT and m.timestamp == NOW
    assert m.priority == 4 and m.type is None and m.expiration == 0
    assert m.properties == {"JMS_GW_MSG_EXT": True}


def test_import_takes_headers_from_the_headers_submessage() -> None:
    src = Message("x", delivery_mode=DeliveryMode.PERSISTENT, priority=9,
                  correlation_id=b"\x01", type="t", expiration=NOW + 1, delivery_time=NOW + 2,
                  timestamp=NOW - 3, message_id="ID:far")
    src.redelivered = True
    m = back(out(src))
    assert (m.priority, m.type, m.correlation_id, m.expiration, m.delivery_time, m.timestamp) \
        == (9, "t", b"\x01", NOW + 1, NOW + 2, NOW - 3)
    # the import delivery mode, the receiving broker's id and redelivery flag
    assert m.delivery_mode is DeliveryMode.NON_PERSISTENT
    assert m.message_id is None and m.redelivered is False


def test_header_fields_of_the_wrong_type_are_ignored() -> None:
    h = RvMessage().add("JMSPriority", 12, RvType.U8).add("JMSType", 5)
    h.add("JMSTimestamp", "now")
    m = back(RvMessage().add("JMSHeaders", h))
    assert (m.priority, m.type, m.timestamp) == (4, None, NOW)


def test_import_properties_keep_only_property_values() -> None:
    p = RvMessage().add("a", 1, RvType.U16).add("b", b"x").add("c", RvMessage()).add("d", "s")
    m = back(RvMessage().add("JMSProperties", p))
    assert same_value(m.properties, {"a": gt.Int32(1), "d": "s", "JMS_GW_MSG_EXT": True})


def test_a_certified_label_gives_publisher_sequence_and_expiration() -> None:
    h = RvMessage().add("JMSTimestamp", NOW - 1000, RvType.U64)
    rv = RvMessage().add("JMSHeaders", h).add("a", 1)
    rv.cm = CmLabel("pub.1", 42, 2.5)
    m = back(rv)
    assert m.properties == {"JMS_GW_MSG_EXT": True, "JMS_GW_CM_PUBLISHER": "pub.1",
                            "JMS_GW_CM_SEQUENCE": 42}
    assert m.expiration == NOW - 1000 + 2500


# -- deep nesting and round trips -------------------------------------------------------------


def test_deeply_nested_maps_streams_and_arrays_round_trip() -> None:
    inner: Any = {"leaf": gt.Float32Array([1.5, -0.0]), "s": [gt.Int32(1), {"x": b"\x00"}]}
    for i in range(20):
        inner = {f"l{i}": inner, "n": [gt.Int16(i), inner] if i % 5 == 0 else gt.Int8(i)}
    m = Message.map(inner, properties={"k": gt.Int16(1)})
    assert same_value(back(out(m)).body, inner)


_exact_scalars = st.one_of(
    st.booleans(), st.integers(INT64_MIN, INT64_MAX),
    *(st.integers(t.MIN, t.MAX).map(t) for t in (gt.Int8, gt.Int16, gt.Int32)),
    st.floats(), st.floats(width=32).map(gt.Float32),
    st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"), max_size=10),
    st.binary(max_size=10),
)
_exact_arrays = st.one_of(
    st.lists(st.integers(-(2**15), 2**15 - 1), max_size=4).map(gt.Int16Array),
    st.lists(st.integers(-(2**31), 2**31 - 1), max_size=4).map(gt.Int32Array),
    st.lists(st.integers(INT64_MIN, INT64_MAX), max_size=4).map(gt.Int64Array),
    st.lists(st.floats(width=32), max_size=4).map(gt.Float32Array),
    st.lists(st.floats(), max_size=4).map(gt.Float64Array),
)
_keys = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"),
                min_size=1, max_size=8).filter(lambda k: not k.startswith("_"))
_exact_values = st.recursive(
    _exact_scalars | _exact_arrays,
    lambda c: st.lists(c, min_size=1, max_size=4) | st.dictionaries(_keys, c, max_size=4),
    max_leaves=20)
_exact_properties = st.dictionaries(_keys, _exact_scalars.filter(lambda v: type(v) is not bytes),
                                    max_size=4)


@SETTINGS
@given(st.dictionaries(_keys.filter(lambda k: k not in ("JMSHeaders", "JMSProperties", "JMSText",
                                                        "JMSBytes", "JMSStream", "JMSObject")),
                       _exact_values, max_size=6), _exact_properties)
def test_map_messages_round_trip_exactly(body: dict[str, Any], props: dict[str, Any]) -> None:
    m = back(out(Message.map(body, properties=props, type="t", priority=2, timestamp=NOW - 9)))
    assert m.body_kind is BodyKind.MAP and same_value(m.body, body)
    assert same_value(m.properties, {**props, "JMS_GW_MSG_EXT": True})
    assert (m.type, m.priority, m.timestamp) == ("t", 2, NOW - 9)


@SETTINGS
@given(st.lists(_exact_values, min_size=0, max_size=6))
def test_stream_messages_round_trip_exactly(body: list[Any]) -> None:
    m = back(out(Message.stream(body)))
    assert m.body_kind is BodyKind.STREAM and same_value(m.body, body)


@SETTINGS
@given(st.one_of(
    st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0")).map(Message),
    st.binary().map(Message),
    st.binary().map(lambda b: Message(b, body_kind=BodyKind.OBJECT))))
def test_text_bytes_and_object_messages_round_trip_exactly(m: Message) -> None:
    got = back(out(m))
    assert got.body_kind is m.body_kind and got.body == m.body


def test_nan_and_negative_zero_keep_their_bits() -> None:
    m = back(out(Message.map({"a": math.nan, "b": gt.Float32(-0.0)})))
    assert math.isnan(m.body["a"]) and math.copysign(1.0, m.body["b"]) == -1.0


_BOTH_WAYS = [RvType.BOOL, RvType.I8, RvType.I16, RvType.I32, RvType.I64, RvType.F32,
              RvType.F64, RvType.STRING, RvType.OPAQUE, RvType.I16ARRAY, RvType.I32ARRAY,
              RvType.I64ARRAY, RvType.F32ARRAY, RvType.F64ARRAY]


@st.composite
def _exact_rv(draw: st.DrawFn, depth: int = 3) -> RvMessage:
    """An RV message of named fields (unique names) of the types that go both ways."""
    m = RvMessage()
    for name in draw(st.lists(_keys.filter(lambda k: not k.startswith("JMS")), max_size=5,
                              unique=True)):
        if depth and draw(st.integers(0, 4)) == 0:
            m.add(name, draw(_exact_rv(depth - 1)), RvType.MSG)
        else:
            t = draw(st.sampled_from(_BOTH_WAYS))
            m.add(name, draw(value_of(t, 0)), t)
    return m


@SETTINGS
@given(_exact_rv())
def test_rv_messages_of_the_both_ways_types_round_trip_exactly(rv: RvMessage) -> None:
    rv.send_subject = "plant.a"
    m = back(rv)
    again = out(m, export_headers=False, export_properties=False)
    assert again == rv
