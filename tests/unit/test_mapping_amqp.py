"""The default AMQP 1.0 ⇄ core mapping (mappings/amqp.py), row by row, both ways, and round trips.

Every AMQP message here goes through ``proton.Message.encode()`` / ``decode()`` before it is
mapped, and every mapped message is encoded and decoded again, so what is tested is the wire
form. AMQP values are compared by their AMQP encoding (type, width and order exact); core
values with ``same_value`` (type exact at every level). Expected values are written out
literally, never taken from the code under test.
"""

from __future__ import annotations

import json
import math
import struct
import uuid
from typing import Any

import cproton
import proton
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from proton import (
    UNDESCRIBED,
    Array,
    Data,
    Described,
    byte,
    char,
    decimal32,
    decimal64,
    decimal128,
    float32,
    int32,
    short,
    symbol,
    timestamp,
    ubyte,
    uint,
    ulong,
    ushort,
)
from strategies import (
    any_text,
    map_bodies,
    message_differences,
    messages,
    names,
    property_values,
    same_value,
    stream_bodies,
)

from gateway.message import (
    QUEUE,
    TOPIC,
    BodyKind,
    DeliveryMode,
    Destination,
    Message,
)
from gateway.types import (
    ARRAY_TYPES,
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
)
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
from mappings.amqp_address import dest_type_code, format_address, parse_address

T0 = 1_700_000_000_000
DEST = Destination.queue("orders")
SERIALIZED = "application/x-java-serialized-object"
MSG_TYPE = symbol("x-opt-jms-msg-type")
JMS_DEST = symbol("x-opt-jms-dest")
JMS_REPLY_TO = symbol("x-opt-jms-reply-to")
DELIVERY_TIME = symbol("x-opt-delivery-time")
DELIVERY_DELAY = symbol("x-opt-delivery-delay")
TRACE = symbol("x-opt-gw-trace-id")
GW_MODE = symbol("x-opt-gw-delivery-mode")


def wire(pm: proton.Message) -> proton.Message:
    """``pm`` as a peer receives it: encoded to bytes and decoded into a fresh Message."""
    out = proton.Message()
    out.decode(pm.encode())
    return out


def amqp(body: Any = None, *, inferred: bool = False, **fields: Any) -> proton.Message:
    pm = proton.Message(body=body)
    pm.inferred = inferred
    for name, value in fields.items():
        if name in ("expiry_ms", "creation_ms", "ttl_ms", "group_seq"):
            setter = {
                "expiry_ms": cproton.pn_message_set_expiry_time,
                "creation_ms": cproton.pn_message_set_creation_time,
                "ttl_ms": cproton.pn_message_set_ttl,
                "group_seq": cproton.pn_message_set_group_sequence,
            }[name]
            setter(pm._msg, value)
        elif name == "content_type":
            cproton.pn_message_set_content_type(pm._msg, value)
        else:
            setattr(pm, name, value)
    return pm


def a2c(
    pm: proton.Message, *, destination: Destination = DEST, now_ms: int = T0, **kw: Any
) -> Message:
    return amqp_to_message(
        wire(pm), destination=destination, default_kind=kw.get("default_kind", QUEUE), now_ms=now_ms
    )


def c2a(msg: Message, *, delivery_count: int = 1, now_ms: int = T0) -> proton.Message:
    return wire(message_to_amqp(msg, delivery_count=delivery_count, now_ms=now_ms))


def enc(value: Any) -> bytes:
    """The AMQP encoding of a value: equal encodings are equal AMQP values, types and all."""
    data = Data()
    data.put_object(value)
    return bytes(data.encode())


def enc_id(value: Any) -> bytes:
    """An id's encoding (proton gives a ulong message-id back as a plain int)."""
    return enc(ulong(value) if type(value) is int else value)


def field_ms(pm: proton.Message, name: str) -> int:
    get = {"expiry": cproton.pn_message_get_expiry_time, "creation": cproton.pn_message_get_creation_time,
           "ttl": cproton.pn_message_get_ttl}[name]  # fmt: skip
    return int(get(pm._msg))


def content_type(pm: proton.Message) -> str | None:
    return cproton.pn_message_get_content_type(pm._msg)  # type: ignore[no-any-return]


def record(msg: Message) -> list[Any]:
    return json.loads(msg.properties[TYPES_PROPERTY])  # type: ignore[no-any-return]


def a2c2a(pm: proton.Message) -> tuple[proton.Message, Message, proton.Message]:
    """(what the peer sent as received, the core message, what the gateway sends on)."""
    sent = wire(pm)
    core = amqp_to_message(sent, destination=DEST, default_kind=QUEUE, now_ms=T0)
    return sent, core, c2a(core)


def assert_same_amqp(a: proton.Message, b: proton.Message) -> None:
    """Body, application properties, annotations, ids: the same AMQP values."""
    assert a.inferred == b.inferred
    assert enc(a.body) == enc(b.body), (a.body, b.body)
    assert enc(a.properties) == enc(b.properties), (a.properties, b.properties)
    assert enc_id(a.id) == enc_id(b.id) and enc_id(a.correlation_id) == enc_id(b.correlation_id)


# == addresses ==================================================================================


@pytest.mark.parametrize(
    ("address", "hint", "default", "kind", "name"),
    [
        ("queue://orders", None, TOPIC, QUEUE, "orders"),
        ("topic://prices.eu", None, QUEUE, TOPIC, "prices.eu"),
        ("queue://x", 1, TOPIC, QUEUE, "x"),  # the prefix wins over the hint
        ("topic://x", 0, QUEUE, TOPIC, "x"),
        ("plain", 0, TOPIC, QUEUE, "plain"),
        ("plain", 1, QUEUE, TOPIC, "plain"),
        ("tmp1", 2, TOPIC, QUEUE, "tmp1"),
        ("tmp2", 3, QUEUE, TOPIC, "tmp2"),
        ("plain", None, TOPIC, TOPIC, "plain"),
        ("plain", None, QUEUE, QUEUE, "plain"),
        ("plain", 9, TOPIC, TOPIC, "plain"),  # an unknown hint: the default
        ("queue://topic://a", None, TOPIC, QUEUE, "topic://a"),
        ("Queue://a", None, TOPIC, TOPIC, "Queue://a"),  # prefixes are case-sensitive
        ("$TMP$.q1", 2, QUEUE, QUEUE, "$TMP$.q1"),
    ],
)
def test_parse_address(address, hint, default, kind, name):
    d = parse_address(address, hint=hint, default=default)
    assert (d.kind, d.name) == (kind, name)


def test_parse_address_takes_the_hint_as_a_proton_byte():
    assert parse_address("a", hint=byte(1)).kind is TOPIC


@pytest.mark.parametrize("hint", ["1", [1], {"a": 1}, Described(symbol("d"), 1), 1.0])
def test_parse_address_ignores_a_hint_that_is_not_an_integer(hint):
    assert parse_address("a", hint=hint, default=TOPIC).kind is TOPIC


def test_parse_address_ignores_a_boolean_hint():
    assert parse_address("a", hint=True, default=QUEUE).kind is QUEUE  # True is not 1 here


@pytest.mark.parametrize("address", ["", "queue://", "topic://"])
def test_parse_address_raises_on_an_empty_name(address):
    with pytest.raises(ValueError):
        parse_address(address, hint=1)


def test_format_address_always_has_the_prefix():
    assert format_address(Destination.queue("a.b")) == "queue://a.b"
    assert format_address(Destination.topic("a.>")) == "topic://a.>"
    assert format_address(Destination.queue("$TMP$.x")) == "queue://$TMP$.x"


@pytest.mark.parametrize(
    ("dest", "code"),
    [
        (Destination.queue("q"), 0),
        (Destination.topic("t"), 1),
        (Destination.queue("$TMP$.q"), 2),
        (Destination.topic("$TMP$.t"), 3),
    ],
)
def test_dest_type_code(dest, code):
    assert dest_type_code(dest) == code


@given(st.sampled_from([QUEUE, TOPIC]), st.text(min_size=1), st.sampled_from([QUEUE, TOPIC]))
def test_format_then_parse_gives_the_destination_back(kind, name, default):
    d = Destination(kind, name)
    back = parse_address(format_address(d), hint=dest_type_code(d), default=default)
    assert (back.kind, back.name) == (kind, name)


# == header =====================================================================================


@pytest.mark.parametrize(
    ("durable", "mode"), [(True, DeliveryMode.PERSISTENT), (False, DeliveryMode.NON_PERSISTENT)]
)
def test_durable_gives_the_delivery_mode(durable, mode):
    assert a2c(amqp("x", durable=durable)).delivery_mode is mode


@pytest.mark.parametrize(
    ("mode", "durable"),
    [
        (DeliveryMode.PERSISTENT, True),
        (DeliveryMode.NON_PERSISTENT, False),
        (DeliveryMode.RELIABLE, False),
    ],
)
def test_delivery_mode_gives_durable(mode, durable):
    out = c2a(Message.text("x", delivery_mode=mode))
    assert out.durable is durable
    assert (GW_MODE in out.annotations) is (mode is DeliveryMode.RELIABLE)


def test_reliable_is_kept_in_an_annotation_and_comes_back():
    out = c2a(Message.text("x", delivery_mode=DeliveryMode.RELIABLE))
    assert out.annotations[GW_MODE] == "RELIABLE" and type(out.annotations[GW_MODE]) is symbol
    assert a2c(out).delivery_mode is DeliveryMode.RELIABLE


def test_reliable_annotation_on_a_durable_message_is_persistent_and_carried():
    m = a2c(amqp("x", durable=True, annotations={GW_MODE: symbol("RELIABLE")}))
    assert m.delivery_mode is DeliveryMode.PERSISTENT
    assert m.properties["JMS_GW_AMQP_MA_x-opt-gw-delivery-mode"] == "RELIABLE"


@pytest.mark.parametrize("priority", [0, 1, 4, 7, 9])
def test_priority_both_ways(priority):
    assert a2c(amqp("x", priority=priority)).priority == priority
    assert c2a(Message.text("x", priority=priority)).priority == priority


def test_priority_unset_is_4():
    assert a2c(amqp("x")).priority == 4


def test_priority_above_9_is_9_and_the_original_comes_back():
    m = a2c(amqp("x", priority=200))
    assert m.priority == 9
    assert same_value(m.properties[PRIORITY_PROPERTY], UInt8(200))
    assert c2a(m).priority == 200


def test_absolute_expiry_time_is_the_expiration():
    assert a2c(amqp("x", expiry_ms=T0 + 1234, ttl_ms=99)).expiration == T0 + 1234


def test_ttl_alone_gives_now_plus_ttl():
    assert a2c(amqp("x", ttl_ms=5000), now_ms=T0).expiration == T0 + 5000


def test_no_expiry_is_zero():
    assert a2c(amqp("x")).expiration == 0


def test_expiration_goes_out_as_absolute_expiry_time_and_ttl_left():
    out = c2a(Message.text("x", expiration=T0 + 60_000), now_ms=T0 + 10_000)
    assert field_ms(out, "expiry") == T0 + 60_000
    assert field_ms(out, "ttl") == 50_000


def test_ttl_is_computed_from_expires_at_when_set():
    m = Message.text("x", expiration=T0 + 60_000)
    m.expires_at = T0 + 20_000  # a destination's shorter limit
    out = c2a(m, now_ms=T0)
    assert field_ms(out, "ttl") == 20_000
    assert field_ms(out, "expiry") == T0 + 60_000


def test_expires_at_without_expiration_sends_only_a_ttl():
    m = Message.text("x")
    m.expires_at = T0 + 3000
    out = c2a(m, now_ms=T0)
    assert (field_ms(out, "ttl"), field_ms(out, "expiry")) == (3000, 0)


def test_an_expired_message_gets_a_ttl_of_1_and_a_huge_one_the_uint_maximum():
    assert field_ms(c2a(Message.text("x", expiration=T0 - 5), now_ms=T0), "ttl") == 1
    assert field_ms(c2a(Message.text("x", expiration=T0 + 2**40), now_ms=T0), "ttl") == 2**32 - 1


def test_no_expiration_sends_no_ttl():
    out = c2a(Message.text("x"))
    assert (field_ms(out, "ttl"), field_ms(out, "expiry")) == (0, 0)


@pytest.mark.parametrize(
    ("count", "amqp_count", "first"), [(1, 0, True), (2, 1, False), (7, 6, False)]
)
def test_delivery_count_and_first_acquirer(count, amqp_count, first):
    out = c2a(Message.text("x"), delivery_count=count)
    assert (out.delivery_count, out.first_acquirer) == (amqp_count, first)


def test_inbound_delivery_count_and_first_acquirer_are_not_kept():
    m = a2c(amqp("x", delivery_count=5, first_acquirer=True))
    assert m.properties == {} and not m.redelivered


# == properties section =========================================================================

MESSAGE_IDS = [
    ("ID:c0ffee:1:1:1-1", "ID:c0ffee:1:1:1-1"),
    ("plain-id", "plain-id"),
    ("", ""),
    (5, "ID:AMQP_ULONG:5"),
    (2**64 - 1, "ID:AMQP_ULONG:18446744073709551615"),
    (uuid.UUID(int=0xA1), "ID:AMQP_UUID:00000000-0000-0000-0000-0000000000a1"),
    (b"\x00\xab\xff", "ID:AMQP_BINARY:00ABFF"),
    (b"", "ID:AMQP_BINARY:"),
    ("ID:AMQP_ULONG:5", "ID:AMQP_STRING:ID:AMQP_ULONG:5"),
    ("ID:AMQP_STRING:x", "ID:AMQP_STRING:x"),  # "x" needs no escape, so this is not one
    ("ID:AMQP_STRING:ID:AMQP_UUID:00000000-0000-0000-0000-000000000000",
     "ID:AMQP_STRING:ID:AMQP_STRING:ID:AMQP_UUID:00000000-0000-0000-0000-000000000000"),
    ("ID:AMQP_ULONG:007", "ID:AMQP_ULONG:007"),  # not canonical: a plain string
    ("ID:AMQP_BINARY:ab", "ID:AMQP_BINARY:ab"),  # lower case: not how it is written
    ("ID:AMQP_UUID:nope", "ID:AMQP_UUID:nope"),
    ("ID:AMQP_NO_PREFIX:abc", "ID:AMQP_NO_PREFIX:abc"),
]  # fmt: skip


@pytest.mark.parametrize(("amqp_id", "jms_id"), MESSAGE_IDS)
def test_message_id_both_ways(amqp_id, jms_id):
    m = a2c(amqp("x", id=amqp_id))
    assert m.message_id == jms_id and type(m.message_id) is str
    out = c2a(Message.text("x", message_id=jms_id))
    assert enc_id(out.id) == enc_id(wire(amqp("x", id=amqp_id)).id)


@pytest.mark.parametrize(
    ("amqp_id", "core_id"),
    [
        ("corr-1", "corr-1"),
        (b"\x01\x02", b"\x01\x02"),
        (ulong(7), "ID:AMQP_ULONG:7"),
        (uuid.UUID(int=2), "ID:AMQP_UUID:00000000-0000-0000-0000-000000000002"),
        ("ID:AMQP_UUID:00000000-0000-0000-0000-000000000002",
         "ID:AMQP_STRING:ID:AMQP_UUID:00000000-0000-0000-0000-000000000002"),
        ("ID:AMQP_BINARY:0102", "ID:AMQP_BINARY:0102"),  # binary is bytes in the core
    ],
)  # fmt: skip
def test_correlation_id_both_ways(amqp_id, core_id):
    m = a2c(amqp("x", correlation_id=amqp_id))
    assert same_value(m.correlation_id, core_id)
    out = c2a(Message.text("x", correlation_id=core_id))
    assert enc_id(out.correlation_id) == enc_id(
        wire(amqp("x", correlation_id=amqp_id)).correlation_id
    )


def test_message_ids_as_qpid_jms_reads_them_round_trip_exactly():
    for amqp_id, _ in MESSAGE_IDS:
        sent, core, back = a2c2a(amqp("x", id=amqp_id, correlation_id=amqp_id))
        assert enc_id(back.id) == enc_id(sent.id)
        assert enc_id(back.correlation_id) == enc_id(sent.correlation_id)


@pytest.mark.parametrize(
    ("user_id", "prop"), [(b"alice", "alice"), ("é".encode(), "é"), (b"\xff\x00", b"\xff\x00")]
)
def test_user_id_is_jmsxuserid(user_id, prop):
    m = a2c(amqp("x", user_id=user_id))
    assert same_value(m.properties["JMSXUserID"], prop)
    out = c2a(m)
    assert out.user_id == user_id and "JMSXUserID" not in (out.properties or {})


@pytest.mark.parametrize("prop", [b"valid-utf8", "", b""])
def test_a_jmsxuserid_the_user_id_cannot_give_back_stays_a_property(prop):
    out = c2a(Message.text("x", properties={"JMSXUserID": prop}))
    assert out.user_id == b""
    assert same_value(a2c(out).properties["JMSXUserID"], prop)


def test_to_is_the_formatted_destination_with_its_type_annotation():
    out = c2a(Message.text("x", destination=Destination.topic("$TMP$.t1")))
    assert out.address == "topic://$TMP$.t1"
    assert out.annotations[JMS_DEST] == 3 and type(out.annotations[JMS_DEST]) is byte


def test_no_destination_sends_no_to():
    out = c2a(Message.text("x"))
    assert out.address is None and JMS_DEST not in out.annotations


def test_the_destination_is_the_adapters():
    other = Destination.topic("elsewhere")
    assert a2c(amqp("x", address="queue://orders"), destination=other).destination is other


def test_subject_is_jmstype():
    assert a2c(amqp("x", subject="order.created")).type == "order.created"
    assert c2a(Message.text("x", type="order.created")).subject == "order.created"
    assert c2a(Message.text("x")).subject is None


@pytest.mark.parametrize(
    ("reply_to", "hint", "default", "expected"),
    [
        ("queue://r", None, TOPIC, Destination.queue("r")),
        ("topic://r", 0, QUEUE, Destination.topic("r")),
        ("r", byte(1), QUEUE, Destination.topic("r")),
        ("r", byte(2), TOPIC, Destination.queue("r")),
        ("r", None, TOPIC, Destination.topic("r")),
    ],
)
def test_reply_to_is_parsed_with_its_hint_and_default(reply_to, hint, default, expected):
    ann = {JMS_REPLY_TO: hint} if hint is not None else None
    m = a2c(amqp("x", reply_to=reply_to, annotations=ann), default_kind=default)
    assert m.reply_to == expected and m.reply_to.kind is expected.kind
    assert "JMS_GW_AMQP_MA_x-opt-jms-reply-to" not in m.properties


def test_reply_to_goes_out_formatted_with_its_type_annotation():
    out = c2a(Message.text("x", reply_to=Destination.queue("$TMP$.r")))
    assert out.reply_to == "queue://$TMP$.r" and out.annotations[JMS_REPLY_TO] == 2


def test_a_reply_to_naming_nothing_is_kept_and_sent_back():
    m = a2c(amqp("x", reply_to="queue://"))
    assert m.reply_to is None and m.properties[REPLY_TO_PROPERTY] == "queue://"
    assert c2a(m).reply_to == "queue://"


def test_content_type_is_the_shared_content_type_property():
    m = a2c(amqp(b"{}", inferred=True, content_type="application/cbor"))
    assert m.properties[CONTENT_TYPE_PROPERTY] == "application/cbor"
    assert content_type(c2a(m)) == "application/cbor"


def test_a_non_ascii_content_type_property_stays_an_application_property():
    out = c2a(Message.binary(b"x", properties={CONTENT_TYPE_PROPERTY: "text/plain; x=é"}))
    assert content_type(out) is None
    assert out.properties[CONTENT_TYPE_PROPERTY] == "text/plain; x=é"


def test_content_encoding():
    m = a2c(amqp(b"x", inferred=True, content_encoding="gzip"))
    assert m.properties[CONTENT_ENCODING_PROPERTY] == "gzip"
    assert cproton.pn_message_get_content_encoding(c2a(m)._msg) == "gzip"


def test_creation_time_is_jmstimestamp():
    assert a2c(amqp("x", creation_ms=T0 + 7)).timestamp == T0 + 7
    assert field_ms(c2a(Message.text("x", timestamp=T0 + 7)), "creation") == T0 + 7
    assert a2c(amqp("x")).timestamp == 0  # the broker stamps it


def test_group_id_and_sequence_are_jmsx_properties():
    m = a2c(amqp("x", group_id="g1", group_seq=3))
    assert m.properties["JMSXGroupID"] == "g1"
    assert same_value(m.properties["JMSXGroupSeq"], Int32(3))
    out = c2a(m)
    assert (out.group_id, out.group_sequence) == ("g1", 3)
    assert not out.properties


def test_a_group_sequence_above_the_java_int_wraps_and_comes_back():
    m = a2c(amqp("x", group_seq=2**32 - 1))
    assert same_value(m.properties["JMSXGroupSeq"], Int32(-1))
    assert c2a(m).group_sequence == 2**32 - 1


@pytest.mark.parametrize("value", ["5", 5, Int64(5), Int32(0)])
def test_a_jmsxgroupseq_that_is_not_a_nonzero_int32_stays_a_property(value):
    out = c2a(Message.text("x", properties={"JMSXGroupSeq": value}))
    assert out.group_sequence == 0
    assert same_value(a2c(out).properties["JMSXGroupSeq"], value)


def test_reply_to_group_id():
    m = a2c(amqp("x", reply_to_group_id="rg"))
    assert m.properties[REPLY_TO_GROUP_ID_PROPERTY] == "rg"
    assert c2a(m).reply_to_group_id == "rg"


# == application properties =====================================================================

# AMQP value → core value (types with a core equivalent: no types record).
NATIVE = [
    (byte(-128), Int8(-128)),
    (short(-32768), Int16(-32768)),
    (int32(2**31 - 1), Int32(2**31 - 1)),
    (-(2**63), -(2**63)),
    (ubyte(255), UInt8(255)),
    (ushort(65535), UInt16(65535)),
    (uint(2**32 - 1), UInt32(2**32 - 1)),
    (ulong(2**64 - 1), UInt64(2**64 - 1)),
    (float32(1.5), Float32(1.5)),
    (0.1, 0.1),
    (char("€"), Char("€")),
    (True, True),
    (False, False),
    ("text ✓", "text ✓"),
    (b"\x00bin", b"\x00bin"),
    (None, None),
]

# AMQP value → nearest core value, and the type recorded for it.
CARRIED = [
    (timestamp(-5), -5, "timestamp"),
    (uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001", "uuid"),
    (symbol("sym"), "sym", "symbol"),
    (decimal32(0x2200_0001), b"\x22\x00\x00\x01", "decimal32"),
    (decimal64(2**64 - 1), b"\xff" * 8, "decimal64"),
    (decimal128(bytes(range(16))), bytes(range(16)), "decimal128"),
    (char("\U0001f600"), "\U0001f600", "char"),
    (Described(symbol("x:d"), 5), 5, ["described", "x:d"]),
    (Described(ulong(9), timestamp(3)), 3, ["described", 9, "timestamp"]),
    (Array(UNDESCRIBED, Data.SYMBOL, symbol("a"), symbol("b")), ["a", "b"], ["array", "symbol"]),
    (Array(symbol("d"), Data.INT, int32(1)), Int32Array([1]), ["array", "int", "d"]),
]


@pytest.mark.parametrize(("value", "core"), NATIVE)
def test_application_property_types_with_a_core_type(value, core):
    m = a2c(amqp("x", properties={"p": value}))
    assert same_value(m.properties["p"], core)
    assert TYPES_PROPERTY not in m.properties


@pytest.mark.parametrize(("value", "core"), NATIVE)
def test_core_property_types_go_out_as_their_amqp_type(value, core):
    out = c2a(Message.text("x", properties={"p": core}))
    assert enc(out.properties["p"]) == enc(value)
    assert TYPES_PROPERTY not in out.properties


@pytest.mark.parametrize(("value", "core", "recorded"), CARRIED)
def test_application_property_types_without_a_core_type_are_carried(value, core, recorded):
    m = a2c(amqp("x", properties={"p": value}))
    assert same_value(m.properties["p"], core)
    assert record(m) == [["p", recorded]]


@pytest.mark.parametrize("value", [v for v, _ in NATIVE] + [v for v, _, _ in CARRIED])
def test_every_application_property_type_round_trips_amqp_core_amqp(value):
    sent, core, back = a2c2a(amqp("x", properties={"before": 1, "p": value, "after": "z"}))
    assert enc(back.properties) == enc(sent.properties)


def test_plain_int_and_int64_both_go_as_long_and_come_back_as_themselves():
    out = c2a(Message.text("x", properties={"plain": 5, "wide": Int64(5)}))
    assert type(out.properties["plain"]) is int and type(out.properties["wide"]) is int
    assert json.loads(out.properties[TYPES_PROPERTY]) == [["wide", "int64"]]
    back = a2c(out)
    assert same_value(back.properties, {"plain": 5, "wide": Int64(5)})


def test_a_string_with_a_lone_surrogate_goes_as_binary_and_comes_back():
    out = c2a(Message.text("x", properties={"s": "a\ud800b"}))
    assert out.properties["s"] == b"a\xed\xa0\x80b"
    assert same_value(a2c(out).properties, {"s": "a\ud800b"})


def test_a_property_name_with_a_lone_surrogate_is_escaped_and_comes_back():
    out = c2a(Message.text("x", properties={"n\udc00%": Int8(1), "ok": 2}))
    assert "n%uDC00%25" in out.properties
    assert same_value(a2c(out).properties, {"n\udc00%": Int8(1), "ok": 2})


def test_container_property_values_are_carried_both_ways():
    sent, core, back = a2c2a(amqp("x", properties={"l": [int32(1), "a"], "m": {"k": byte(2)}}))
    assert same_value(core.properties, {"l": [Int32(1), "a"], "m": {"k": Int8(2)}})
    assert enc(back.properties) == enc(sent.properties)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(props=st.dictionaries(names, property_values(), max_size=8))
def test_core_properties_survive_core_amqp_core(props):
    assume(not any(k.startswith(("JMS_GW_", "JMSX")) for k in props))
    back = a2c(c2a(Message.text("x", properties=dict(props))))
    assert same_value(back.properties, props)


# == annotations ================================================================================


@pytest.mark.parametrize(
    ("msg", "code", "section"),
    [
        (Message(None, body_kind=BodyKind.NONE), 0, None),
        (Message(b"\xac\xed", body_kind=BodyKind.OBJECT), 1, "data"),
        (Message.map({"a": 1}), 2, "value"),
        (Message.binary(b"b"), 3, "data"),
        (Message.stream([1, "a"]), 4, "sequence"),
        (Message.text("t"), 5, "value"),
    ],
)
def test_msg_type_and_body_section_by_body_kind(msg, code, section):
    out = c2a(msg)
    assert out.annotations[MSG_TYPE] == code and type(out.annotations[MSG_TYPE]) is byte
    if section is None:
        assert out.body is None
    else:
        assert out.inferred is (section != "value")
        assert (type(out.body) is list) is (section == "sequence")


def test_jms_dest_and_reply_to_annotations_are_not_carried_as_properties():
    m = a2c(amqp("x", annotations={JMS_DEST: byte(1), JMS_REPLY_TO: byte(0)}))
    assert m.properties == {}


def test_delivery_time_as_a_long_is_jmsdeliverytime_and_goes_out_as_a_long():
    m = a2c(amqp("x", annotations={DELIVERY_TIME: T0 + 500}))
    assert m.delivery_time == T0 + 500 and m.properties == {}
    out = c2a(m)
    assert (
        type(out.annotations[DELIVERY_TIME]) is int and out.annotations[DELIVERY_TIME] == T0 + 500
    )


def test_delivery_time_as_a_timestamp_is_read_and_sent_back_as_a_timestamp():
    sent, core, back = a2c2a(amqp("x", annotations={DELIVERY_TIME: timestamp(T0 + 9)}))
    assert core.delivery_time == T0 + 9
    assert enc(back.annotations[DELIVERY_TIME]) == enc(timestamp(T0 + 9))


def test_delivery_delay_is_now_plus_delay_unless_a_time_is_given():
    assert a2c(amqp("x", annotations={DELIVERY_DELAY: 3000}), now_ms=T0).delivery_time == T0 + 3000
    m = a2c(amqp("x", annotations={DELIVERY_DELAY: 3000, DELIVERY_TIME: T0 + 1}))
    assert m.delivery_time == T0 + 1


def test_no_delivery_time_sends_none():
    assert DELIVERY_TIME not in c2a(Message.text("x")).annotations


def test_trace_id_both_ways():
    m = a2c(amqp("x", annotations={TRACE: "gw1.42"}))
    assert m.trace_id == "gw1.42" and m.properties == {}
    m = Message.text("x")
    m.trace_id = "gw2.7"
    assert c2a(m).annotations[TRACE] == "gw2.7"
    assert TRACE not in c2a(Message.text("x")).annotations


def test_other_annotations_are_vendor_properties_and_go_back():
    ann = {
        symbol("x-opt-partition-key"): "p1",
        symbol("x-opt-seq"): ulong(9),
        ulong(77): timestamp(4),
    }
    sent, core, back = a2c2a(amqp("x", annotations=ann))
    assert core.properties["JMS_GW_AMQP_MA_x-opt-partition-key"] == "p1"
    assert same_value(core.properties["JMS_GW_AMQP_MA_x-opt-seq"], UInt64(9))
    assert core.properties["JMS_GW_AMQP_MA_77"] == 4
    for key, value in ann.items():
        assert enc(back.annotations[key]) == enc(value)
    assert not any(k.startswith("JMS_GW_AMQP_MA_") for k in back.properties or {})


def test_delivery_annotations_are_vendor_properties_and_go_back():
    sent, core, back = a2c2a(amqp("x", instructions={symbol("x-opt-lock"): uuid.UUID(int=5)}))
    assert core.properties["JMS_GW_AMQP_DA_x-opt-lock"] == "00000000-0000-0000-0000-000000000005"
    assert enc(back.instructions) == enc(sent.instructions)


# == bodies =====================================================================================


def test_data_is_bytes():
    m = a2c(amqp(b"\x00\x01\xff", inferred=True))
    assert (m.body_kind, m.body) == (BodyKind.BYTES, b"\x00\x01\xff") and type(m.body) is bytes


def test_amqp_value_string_is_text():
    m = a2c(amqp("héllo"))
    assert (m.body_kind, m.body) == (BodyKind.TEXT, "héllo")


def test_amqp_value_map_is_map():
    m = a2c(amqp({"a": int32(1), "b": "x"}))
    assert m.body_kind is BodyKind.MAP
    assert same_value(m.body, {"a": Int32(1), "b": "x"})


def test_amqp_sequence_is_stream():
    m = a2c(amqp([short(1), "a", None], inferred=True))
    assert m.body_kind is BodyKind.STREAM and same_value(m.body, [Int16(1), "a", None])


def test_amqp_value_list_is_stream_and_goes_back_as_an_amqp_value():
    sent, core, back = a2c2a(amqp([1, 2]))
    assert core.body_kind is BodyKind.STREAM and core.body == [1, 2]
    assert back.inferred is False and back.body == [1, 2]


def test_amqp_value_binary_is_bytes_and_goes_back_as_an_amqp_value():
    sent, core, back = a2c2a(amqp(b"raw"))
    assert (core.body_kind, core.body) == (BodyKind.BYTES, b"raw")
    assert back.inferred is False and bytes(back.body) == b"raw"


@pytest.mark.parametrize("pm", [amqp(None), amqp(None, inferred=True)])
def test_no_body_is_none(pm):
    m = a2c(pm)
    assert (m.body_kind, m.body) == (BodyKind.NONE, None)


def test_object_is_data_with_the_serialized_content_type():
    out = c2a(Message(b"\xac\xed\x00\x05", body_kind=BodyKind.OBJECT))
    assert (out.inferred, bytes(out.body)) == (True, b"\xac\xed\x00\x05")
    assert content_type(out) == SERIALIZED
    m = a2c(out)
    assert (m.body_kind, m.body) == (BodyKind.OBJECT, b"\xac\xed\x00\x05")
    assert CONTENT_TYPE_PROPERTY not in m.properties


def test_data_with_the_serialized_content_type_and_no_msg_type_is_object():
    assert (
        a2c(amqp(b"\xac\xed", inferred=True, content_type=SERIALIZED)).body_kind is BodyKind.OBJECT
    )


def test_data_with_msg_type_5_is_text_and_goes_back_as_data():
    sent, core, back = a2c2a(amqp("né".encode(), inferred=True, annotations={MSG_TYPE: byte(5)}))
    assert (core.body_kind, core.body) == (BodyKind.TEXT, "né")
    assert back.inferred is True and bytes(back.body) == "né".encode()
    assert back.annotations[MSG_TYPE] == 5


def test_data_with_msg_type_5_that_is_not_utf8_stays_bytes_and_keeps_its_msg_type():
    sent, core, back = a2c2a(amqp(b"\xff", inferred=True, annotations={MSG_TYPE: byte(5)}))
    assert (core.body_kind, core.body) == (BodyKind.BYTES, b"\xff")
    assert enc(back.annotations[MSG_TYPE]) == enc(byte(5))


def test_data_with_a_text_content_type_is_text():
    m = a2c(amqp(b'{"a":1}', inferred=True, content_type="application/json"))
    assert (m.body_kind, m.body) == (BodyKind.TEXT, '{"a":1}')


def test_data_with_a_text_content_type_but_msg_type_3_is_bytes():
    m = a2c(amqp(b"abc", inferred=True, content_type="text/plain", annotations={MSG_TYPE: byte(3)}))
    assert m.body_kind is BodyKind.BYTES and m.properties == {CONTENT_TYPE_PROPERTY: "text/plain"}


@pytest.mark.parametrize(
    ("pm", "kind"),
    [
        (amqp(None, annotations={MSG_TYPE: byte(5)}), BodyKind.NONE),  # TextMessage, null text
        (amqp(None, annotations={MSG_TYPE: byte(3)}), BodyKind.NONE),
        (amqp({"a": 1}, annotations={MSG_TYPE: byte(1)}), BodyKind.MAP),  # an AMQP-typed object
        (amqp(b"x", inferred=True, annotations={MSG_TYPE: byte(2)}), BodyKind.BYTES),
        (amqp("t", annotations={MSG_TYPE: int32(5)}), BodyKind.TEXT),  # not a byte
    ],
)
def test_a_msg_type_the_body_does_not_imply_is_kept_and_sent_back(pm, kind):
    sent, core, back = a2c2a(pm)
    assert core.body_kind is kind
    assert enc(back.annotations[MSG_TYPE]) == enc(sent.annotations[MSG_TYPE])
    assert_same_amqp(sent, back)


def test_an_amqp_value_of_another_type_is_a_stream_of_one():
    sent, core, back = a2c2a(amqp(uuid.UUID(int=3)))
    assert core.body_kind is BodyKind.STREAM
    assert core.body == ["00000000-0000-0000-0000-000000000003"]
    assert back.inferred is False and back.body == uuid.UUID(int=3)
    assert back.annotations[MSG_TYPE] == 1


def test_text_with_a_lone_surrogate_goes_as_data_and_comes_back():
    out = c2a(Message.text("a\udfffb"))
    assert out.inferred is True and bytes(out.body) == b"a\xed\xbf\xbfb"
    assert out.annotations[MSG_TYPE] == 5
    m = a2c(out)
    assert (m.body_kind, m.body) == (BodyKind.TEXT, "a\udfffb")
    assert TYPES_PROPERTY not in m.properties


def test_a_map_key_with_a_lone_surrogate_is_escaped_and_comes_back():
    body = {"k\ud801": Int64(1), "50%": "x"}
    out = c2a(Message.map(dict(body)))
    assert set(out.body) == {"k%uD801", "50%25"}
    assert same_value(a2c(out).body, body)


def test_stream_goes_out_as_an_amqp_sequence():
    out = c2a(Message.stream([Int8(1), "a"]))
    assert out.inferred is True and enc(out.body) == enc([byte(1), "a"])


TYPED_ARRAYS = [
    (Int8Array([-1, 2]), Data.BYTE, byte),
    (Int16Array([-300]), Data.SHORT, short),
    (Int32Array([2**31 - 1]), Data.INT, int32),
    (Int64Array([-(2**63)]), Data.LONG, int),
    (UInt8Array([255]), Data.UBYTE, ubyte),
    (UInt16Array([65535]), Data.USHORT, ushort),
    (UInt32Array([2**32 - 1]), Data.UINT, uint),
    (UInt64Array([2**64 - 1]), Data.ULONG, ulong),
    (Float32Array([1.5, -0.0]), Data.FLOAT, float32),
    (Float64Array([0.1, math.inf]), Data.DOUBLE, float),
    (BoolArray([True, False]), Data.BOOL, bool),
    (Int16Array([]), Data.SHORT, short),
]


def test_every_gateway_array_type_is_listed():
    assert {type(a) for a, _, _ in TYPED_ARRAYS} == set(ARRAY_TYPES)


@pytest.mark.parametrize(("array", "code", "element"), TYPED_ARRAYS)
def test_typed_arrays_both_ways(array, code, element):
    out = c2a(Message.map({"a": array}))
    expected = Array(UNDESCRIBED, code, *[element(x) for x in array])
    assert enc(out.body["a"]) == enc(expected)
    back = a2c(out)
    assert same_value(back.body["a"], array)
    assert TYPES_PROPERTY not in back.properties


@pytest.mark.parametrize(
    "array",
    [
        Array(UNDESCRIBED, Data.STRING, "a", "b"),
        Array(UNDESCRIBED, Data.TIMESTAMP, timestamp(1), timestamp(-2)),
        Array(UNDESCRIBED, Data.UUID, uuid.UUID(int=1)),
        Array(UNDESCRIBED, Data.BINARY, b"x", b""),
        Array(UNDESCRIBED, Data.CHAR, char("a"), char("\U0001f600")),
        Array(UNDESCRIBED, Data.DECIMAL32, decimal32(1)),
        Array(UNDESCRIBED, Data.DECIMAL64, decimal64(2)),
        Array(UNDESCRIBED, Data.DECIMAL128, decimal128(b"\x01" * 16)),
        Array(UNDESCRIBED, Data.NULL, None, None),
        Array(UNDESCRIBED, Data.LIST, [1, "a"], [timestamp(2)]),
        Array(UNDESCRIBED, Data.MAP, {"a": byte(1)}, {ulong(1): "b"}),
        Array(UNDESCRIBED, Data.ARRAY, Array(UNDESCRIBED, Data.INT, int32(1)),
              Array(UNDESCRIBED, Data.INT)),
        Array(ulong(0x77), Data.SYMBOL, symbol("a")),
        Array(symbol("vendor:t"), Data.SHORT, short(1), short(2)),
        Array(UNDESCRIBED, Data.SYMBOL),
    ],
)  # fmt: skip
def test_arrays_without_a_gateway_type_are_carried_and_go_back(array):
    sent, core, back = a2c2a(amqp({"a": array, "n": [array]}))
    assert type(core.body["a"]) is not Array
    assert enc(back.body) == enc(sent.body)


def test_nested_maps_and_lists_are_kept_nested():
    body = {"l1": [{"l2": [{"l3": [int32(1), {"l4": {"l5": [timestamp(5)]}}]}]}]}
    sent, core, back = a2c2a(amqp(body))
    assert same_value(core.body, {"l1": [{"l2": [{"l3": [Int32(1), {"l4": {"l5": [5]}}]}]}]})
    assert record(core) == [[0, "l1", 0, "l2", 0, "l3", 1, "l4", "l5", 0, "timestamp"]]
    assert enc(back.body) == enc(sent.body)


def test_maps_with_keys_that_are_not_strings_are_kept_as_pairs():
    body = {ulong(1): "one", symbol("s"): [int32(2)], "k": None, uuid.UUID(int=4): timestamp(9)}
    sent, core, back = a2c2a(amqp(body))
    assert core.body_kind is BodyKind.STREAM
    assert same_value(core.body, [UInt64(1), "one", "s", [Int32(2)], "k", None,
                                  "00000000-0000-0000-0000-000000000004", 9])  # fmt: skip
    assert enc(back.body) == enc(sent.body)
    assert back.annotations[MSG_TYPE] == 2


def test_described_values_are_their_value_and_go_back():
    body = {"d": Described(symbol("a:b"), {"x": Described(ulong(3), [uuid.UUID(int=1)])})}
    sent, core, back = a2c2a(amqp(body))
    assert same_value(core.body, {"d": {"x": ["00000000-0000-0000-0000-000000000001"]}})
    assert enc(back.body) == enc(sent.body)


# == identity: nothing to convert, nothing copied ================================================


def test_a_body_with_nothing_to_convert_is_not_copied_inbound():
    pm = wire(amqp({"a": "x", "b": [1, 2.5, True, None, {"c": "d"}]}))
    m = amqp_to_message(pm, destination=DEST, default_kind=QUEUE, now_ms=T0)
    assert m.body is pm.body


def test_only_the_path_to_a_converted_value_is_copied_inbound():
    pm = wire(amqp({"same": [1, {"x": "y"}], "typed": [int32(1)]}))
    m = amqp_to_message(pm, destination=DEST, default_kind=QUEUE, now_ms=T0)
    assert m.body is not pm.body and m.body["same"] is pm.body["same"]


def test_a_body_with_nothing_to_convert_is_not_copied_outbound():
    body = {"a": "x", "b": [1, 2.5, True, None, b"z", {"c": "d"}]}
    assert message_to_amqp(Message.map(body), delivery_count=1, now_ms=T0).body is body
    stream = [1, "a", {"b": [2]}]
    assert message_to_amqp(Message.stream(stream), delivery_count=1, now_ms=T0).body is stream


def test_converting_outbound_leaves_the_core_body_unchanged():
    body = {"a": Int8(1), "b": [Int16Array([1])]}
    message_to_amqp(Message.map(body), delivery_count=1, now_ms=T0)
    assert same_value(body, {"a": Int8(1), "b": [Int16Array([1])]})


# == the types record ===========================================================================


@pytest.mark.parametrize(
    "text",
    ["not json", "{}", "[1]", '[["p"]]', '[["p","timestamp"]]', '[[0,"a","uuid"]]',
     '[[0,"a",["array","nope"]]]', '[[0,"a","map"]]', '[[1,"body","value1"]]', '[[true,"x"]]'],
)  # fmt: skip
def test_a_types_record_that_does_not_fit_is_ignored(text):
    msg = Message.map({"a": "not-a-uuid"}, properties={TYPES_PROPERTY: text, "p": "x"})
    back = a2c(c2a(msg))
    assert back.body == {"a": "not-a-uuid"} and back.properties["p"] == "x"


def test_a_types_record_that_is_not_a_string_is_an_ordinary_property():
    out = c2a(Message.text("x", properties={TYPES_PROPERTY: 5}))
    assert out.properties[TYPES_PROPERTY] == 5


# == messages as Qpid JMS sends them ============================================================


def qpid(body: Any, msg_type: int, *, inferred: bool = False, **fields: Any) -> proton.Message:
    """A message built as Qpid JMS's AmqpJmsMessageFacade encodes it for send."""
    fields.setdefault("annotations", {})
    fields["annotations"] = {MSG_TYPE: byte(msg_type), JMS_DEST: byte(0), **fields["annotations"]}
    return amqp(body, inferred=inferred, durable=True, id="ID:0b2d7a4e-1:1:1:1-1",
                address="orders", creation_ms=T0 - 10, **fields)  # fmt: skip


def test_qpid_jms_text_message():
    pm = qpid("hello", 5, expiry_ms=T0 + 30_000, ttl_ms=30_000, subject="greeting",
              reply_to="TempQueue-1", annotations={JMS_REPLY_TO: byte(2)},
              properties={"n": int32(1), "s": "v", "l": 2**40, "f": float32(0.5)})  # fmt: skip
    m = a2c(pm, destination=parse_address("orders", hint=byte(0), default=TOPIC))
    assert (m.body_kind, m.body) == (BodyKind.TEXT, "hello")
    assert m.destination == Destination.queue("orders")
    assert m.delivery_mode is DeliveryMode.PERSISTENT
    assert (m.message_id, m.timestamp, m.expiration) == (
        "ID:0b2d7a4e-1:1:1:1-1",
        T0 - 10,
        T0 + 30_000,
    )
    assert m.type == "greeting" and m.reply_to == Destination.queue("TempQueue-1")
    assert same_value(m.properties, {"n": Int32(1), "s": "v", "l": 2**40, "f": Float32(0.5)})


def test_qpid_jms_bytes_message():
    m = a2c(qpid(b"\x01\x02", 3, inferred=True, content_type="application/octet-stream"))
    assert (m.body_kind, m.body) == (BodyKind.BYTES, b"\x01\x02")
    assert m.properties == {CONTENT_TYPE_PROPERTY: "application/octet-stream"}


def test_qpid_jms_map_message():
    m = a2c(qpid({"i": int32(1), "b": b"\x00", "c": char("z"), "d": 2.5, "s": short(3)}, 2))
    assert m.body_kind is BodyKind.MAP
    assert same_value(
        m.body, {"i": Int32(1), "b": b"\x00", "c": Char("z"), "d": 2.5, "s": Int16(3)}
    )
    assert TYPES_PROPERTY not in m.properties


def test_qpid_jms_stream_message():
    m = a2c(qpid([byte(1), "two", b"\x03", float32(4.0)], 4, inferred=True))
    assert m.body_kind is BodyKind.STREAM
    assert same_value(m.body, [Int8(1), "two", b"\x03", Float32(4.0)])


def test_qpid_jms_object_message():
    m = a2c(qpid(b"\xac\xed\x00\x05", 1, inferred=True, content_type=SERIALIZED))
    assert (m.body_kind, m.body) == (BodyKind.OBJECT, b"\xac\xed\x00\x05")
    assert m.properties == {}


def test_qpid_jms_plain_message_and_delivery_time():
    m = a2c(qpid(None, 0, annotations={DELIVERY_TIME: T0 + 60_000}, group_id="g", group_seq=1))
    assert (m.body_kind, m.delivery_time) == (BodyKind.NONE, T0 + 60_000)
    assert same_value(m.properties, {"JMSXGroupID": "g", "JMSXGroupSeq": Int32(1)})


def test_qpid_jms_messages_go_back_as_qpid_jms_would_send_them():
    for pm in (qpid("t", 5), qpid(b"b", 3, inferred=True), qpid({"a": int32(1)}, 2),
               qpid([short(1)], 4, inferred=True), qpid(b"o", 1, inferred=True, content_type=SERIALIZED),
               qpid(None, 0)):  # fmt: skip
        sent, core, back = a2c2a(pm)
        assert_same_amqp(sent, back)
        assert enc(back.annotations[MSG_TYPE]) == enc(sent.annotations[MSG_TYPE])
        assert back.durable and back.address == "queue://orders"
        assert field_ms(back, "creation") == T0 - 10


# == round trips (hypothesis) ===================================================================

_long = st.integers(-(2**63), 2**63 - 1)
_amqp_text = st.text(max_size=12)  # valid UTF-8 (no lone surrogates), as an AMQP string must be
_ascii = st.text(st.characters(max_codepoint=127), max_size=12)


def _ints(cls: Any, lo: int, hi: int) -> st.SearchStrategy[Any]:
    return st.integers(lo, hi).map(cls)


_SCALARS: dict[int, st.SearchStrategy[Any]] = {
    Data.NULL: st.none(),
    Data.BOOL: st.booleans(),
    Data.UBYTE: _ints(ubyte, 0, 255),
    Data.BYTE: _ints(byte, -128, 127),
    Data.USHORT: _ints(ushort, 0, 2**16 - 1),
    Data.SHORT: _ints(short, -(2**15), 2**15 - 1),
    Data.UINT: _ints(uint, 0, 2**32 - 1),
    Data.INT: _ints(int32, -(2**31), 2**31 - 1),
    Data.ULONG: _ints(ulong, 0, 2**64 - 1),
    Data.LONG: _long,
    Data.FLOAT: st.floats(width=32, allow_nan=False).map(float32),
    Data.DOUBLE: st.floats(allow_nan=False),
    Data.CHAR: st.characters(exclude_categories=()).map(char),
    Data.TIMESTAMP: _long.map(timestamp),
    Data.UUID: st.uuids(),
    Data.BINARY: st.binary(max_size=12),
    Data.STRING: _amqp_text,
    Data.SYMBOL: _ascii.map(symbol),
    Data.DECIMAL32: _ints(decimal32, 0, 2**32 - 1),
    Data.DECIMAL64: _ints(decimal64, 0, 2**64 - 1),
    Data.DECIMAL128: st.binary(min_size=16, max_size=16).map(decimal128),
}
_descriptors = st.one_of(_ascii.map(symbol), _ints(ulong, 0, 2**64 - 1))
_keys = st.one_of(_amqp_text, _ascii.map(symbol), _ints(ulong, 0, 99), _SCALARS[Data.INT],
                  _SCALARS[Data.TIMESTAMP], st.uuids())  # fmt: skip


@st.composite
def _arrays(draw: st.DrawFn) -> Array:
    code = draw(st.sampled_from([c for c in _SCALARS if c != Data.NULL]))
    desc = draw(st.just(UNDESCRIBED) | _descriptors)
    return Array(desc, code, *draw(st.lists(_SCALARS[code], max_size=4)))


def amqp_values() -> st.SearchStrategy[Any]:
    """Every AMQP type, nested: lists, maps with any hashable keys, arrays, described values."""
    leaves = st.one_of(*_SCALARS.values(), _arrays())
    return st.recursive(
        leaves,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(_keys, children, max_size=4),
            # proton-c 0.40 mis-decodes a described value directly inside another one (it
            # drops what follows), so the strategy never nests them directly.
            st.builds(Described, _descriptors, children.filter(lambda v: type(v) is not Described)),
        ),
        max_leaves=20,
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=amqp_values(), props=st.dictionaries(_amqp_text, amqp_values(), max_size=4))
def test_every_amqp_value_survives_amqp_core_amqp(body, props):
    pm = amqp(body, properties=props)
    sent, core, back = a2c2a(pm)
    assert enc(back.body) == enc(sent.body)
    assert enc(back.properties or {}) == enc(sent.properties or {})
    assert enc(back.annotations.get(MSG_TYPE)) == enc(_expected_msg_type(sent))


def _expected_msg_type(sent: proton.Message) -> Any:
    """What the gateway sends for an amqp-value body (an independent reading of the README)."""
    t = type(sent.body)
    if sent.body is None:
        return byte(0)
    return byte({str: 5, memoryview: 3, dict: 2, list: 4}.get(t, 1))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=amqp_values())
def test_every_amqp_value_survives_as_a_sequence_and_in_annotations(body):
    pm = amqp(
        [body], inferred=True, annotations={symbol("x-a"): body}, instructions={ulong(1): body}
    )
    sent, core, back = a2c2a(pm)
    assert back.inferred is True and enc(back.body) == enc(sent.body)
    assert enc(back.annotations[symbol("x-a")]) == enc(sent.annotations[symbol("x-a")])
    assert enc(back.instructions) == enc(sent.instructions)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=map_bodies())
def test_core_map_bodies_survive_core_amqp_core(body):
    back = a2c(c2a(Message.map(body)))
    assert back.body_kind is BodyKind.MAP and same_value(back.body, body)
    assert TYPES_PROPERTY not in back.properties


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=stream_bodies())
def test_core_stream_bodies_survive_core_amqp_core(body):
    back = a2c(c2a(Message.stream(body)))
    assert back.body_kind is BodyKind.STREAM and same_value(back.body, body)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msg=messages(), count=st.integers(1, 5))
def test_core_messages_survive_core_amqp_core(msg, count):
    assume(msg.reply_to is None or msg.reply_to.name)  # an empty name is no destination
    assume(not any(k.startswith(("JMS_GW_", "JMSX")) for k in msg.properties))
    msg.expires_at = 0  # a destination limit is sent as the ttl only (tested above)
    back = a2c(c2a(msg, delivery_count=count), destination=msg.destination)
    if msg.reply_to is not None:
        assert back.reply_to.kind is msg.reply_to.kind
    diffs = message_differences(msg, back)
    ignored = ("redelivered", "origin", "hops", "producer_conn", "expires_at")  # not message fields
    assert [d for d in diffs if not d.startswith(ignored)] == []


@settings(max_examples=100, deadline=None)
@given(text=any_text, corr=any_text, subject=any_text, trace=any_text, reply=any_text.filter(bool))
def test_header_strings_with_lone_surrogates_survive_core_amqp_core(
    text, corr, subject, trace, reply
):
    msg = Message.text(text, message_id=text, correlation_id=corr, type=subject,
                       reply_to=Destination.topic(reply))  # fmt: skip
    msg.trace_id = trace
    back = a2c(c2a(msg))
    assert (back.body, back.message_id, back.correlation_id, back.type, back.trace_id) == (
        text, text, corr, subject, trace)  # fmt: skip
    assert back.reply_to == Destination.topic(reply)


def test_float_special_values_round_trip_both_ways():
    nan32 = struct.unpack("<f", struct.pack("<I", 0x7FC00001))[0]
    core = {"n": Float32(nan32), "z": -0.0, "i": Float32(-math.inf), "d": math.nan}
    back = a2c(c2a(Message.map(dict(core))))
    assert same_value(back.body, core)
