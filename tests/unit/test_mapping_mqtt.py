"""The default MQTT ⇄ core mapping (mappings/mqtt.py), rule by rule, both ways, and round trips.

Every rule of the two tables in mappings/README.md has a test here; expected values are
written out literally (or computed by an independent reader of the documented JSON form),
never taken from the code under test.
"""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import names, nested_values, property_values, same_value

from gateway.message import BodyKind, DeliveryMode, Destination, Message
from gateway.types import (
    ARRAY_TYPES,
    BoolArray,
    Char,
    Float32,
    Float32Array,
    Float64Array,
    Int8,
    Int16,
    Int16Array,
    Int32,
    Int64,
    TypedArray,
    UInt8,
    UInt16,
    UInt32,
    UInt64,
)
from mappings.mqtt import (
    CONTENT_TYPE_PROPERTY,
    PFI_PROPERTY,
    QOS_PROPERTY,
    RETAIN_PROPERTY,
    TRACE_USER_PROPERTY,
    TYPES_USER_PROPERTY,
    USER_RECORD_PROPERTY,
    MqttOut,
    PayloadFormatInvalid,
    message_to_mqtt,
    mqtt_to_message,
    trace_user_property,
)

T0 = 1_700_000_000_000
DEST = Destination.topic("sensors.room1.temp")


def m_in(
    payload: bytes = b"21.5",
    *,
    qos: int = 1,
    retain: bool = False,
    level: int = 5,
    reply_to: Destination | None = None,
    now_ms: int = T0,
    **properties: Any,
) -> Message:
    return mqtt_to_message(
        payload=payload,
        qos=qos,
        retain=retain,
        properties=properties,
        level=level,
        destination=DEST,
        reply_to=reply_to,
        now_ms=now_ms,
    )


def m_out(
    msg: Message, *, level: int = 5, now_ms: int = T0, reply_topic: str | None = None
) -> MqttOut:
    return message_to_mqtt(msg, level=level, now_ms=now_ms, reply_topic=reply_topic)


def user_props(msg: Message, **kw: Any) -> list[tuple[str, str]]:
    return list(m_out(msg, **kw).properties.get("user_property", []))


# == MQTT → core ==============================================================================

# -- body ---------------------------------------------------------------------------------------


def test_payload_without_properties_is_a_bytes_body():
    m = m_in(b"\x00\x01\xff")
    assert m.body_kind is BodyKind.BYTES
    assert m.body == b"\x00\x01\xff"
    assert type(m.body) is bytes


def test_empty_payload_is_an_empty_bytes_body():
    m = m_in(b"")
    assert (m.body_kind, m.body) == (BodyKind.BYTES, b"")


def test_payload_format_indicator_1_gives_a_text_body():
    m = m_in("21,5 °C".encode(), payload_format_indicator=1)
    assert m.body_kind is BodyKind.TEXT
    assert m.body == "21,5 °C"


def test_payload_format_indicator_0_keeps_bytes_even_if_it_is_valid_utf8():
    m = m_in(b"hello", payload_format_indicator=0)
    assert (m.body_kind, m.body) == (BodyKind.BYTES, b"hello")


@pytest.mark.parametrize(
    "bad",
    [b"\xff\xfe", b"abc\x80", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80"],
    ids=["ff-fe", "lone-continuation", "encoded-surrogate", "overlong", "above-10ffff"],
)
def test_payload_format_indicator_1_with_invalid_utf8_raises(bad):
    with pytest.raises(PayloadFormatInvalid) as err:
        m_in(bad, payload_format_indicator=1)
    assert err.value.reason_code == 0x99


def test_invalid_utf8_with_indicator_raises_even_with_a_text_content_type():
    with pytest.raises(PayloadFormatInvalid):
        m_in(b"\xff", payload_format_indicator=1, content_type="text/plain")


@pytest.mark.parametrize(
    "ct",
    [
        "text/plain",
        "TEXT/CSV",
        "text/plain; charset=iso-8859-1",
        "application/json",
        "Application/JSON; charset=utf-8",
        "application/octet-stream;charset=utf-8",
        'application/xml; charset="UTF-8"',
        "application/xml; q=1; charset = utf-8",
    ],
)
def test_text_content_types_give_a_text_body(ct):
    m = m_in("é1".encode(), content_type=ct)
    assert (m.body_kind, m.body) == (BodyKind.TEXT, "é1")


@pytest.mark.parametrize(
    "ct",
    ["application/octet-stream", "image/png", "application/jsonx", "application/xml; charset=utf-16",
     "application/cbor", "textual/x"],
)  # fmt: skip
def test_other_content_types_keep_bytes(ct):
    m = m_in(b"abc", content_type=ct)
    assert (m.body_kind, m.body) == (BodyKind.BYTES, b"abc")


def test_text_content_type_with_invalid_utf8_keeps_bytes_without_error():
    m = m_in(b"\xff\xfe", content_type="text/plain")
    assert (m.body_kind, m.body) == (BodyKind.BYTES, b"\xff\xfe")
    assert m.properties[CONTENT_TYPE_PROPERTY] == "text/plain"


def test_a_non_bytes_payload_buffer_becomes_bytes():
    m = m_in(memoryview(b"xyz"))  # type: ignore[arg-type]
    assert type(m.body) is bytes and m.body == b"xyz"


# -- delivery mode, QoS, retain -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("qos", "mode"),
    [(0, DeliveryMode.NON_PERSISTENT), (1, DeliveryMode.PERSISTENT), (2, DeliveryMode.PERSISTENT)],
)
def test_qos_gives_delivery_mode_and_is_kept_as_an_int8(qos, mode):
    m = m_in(qos=qos)
    assert m.delivery_mode is mode
    assert same_value(m.properties[QOS_PROPERTY], Int8(qos))


def test_retain_flag_sets_the_retain_property_only_when_set():
    assert m_in(retain=True).properties[RETAIN_PROPERTY] is True
    assert RETAIN_PROPERTY not in m_in(retain=False).properties


def test_user_properties_cannot_forge_the_gateway_mqtt_properties():
    m = m_in(
        qos=0,
        user_property=[
            (QOS_PROPERTY, "2"),
            (RETAIN_PROPERTY, "true"),
            (CONTENT_TYPE_PROPERTY, "text/html"),
        ],
    )
    assert same_value(m.properties[QOS_PROPERTY], Int8(0))
    assert RETAIN_PROPERTY not in m.properties
    assert CONTENT_TYPE_PROPERTY not in m.properties


# -- headers --------------------------------------------------------------------------------


def test_message_expiry_interval_becomes_an_absolute_expiration():
    assert m_in(message_expiry_interval=30).expiration == T0 + 30_000
    assert m_in(message_expiry_interval=0xFFFFFFFF).expiration == T0 + 0xFFFFFFFF * 1000


def test_no_message_expiry_interval_means_no_expiration():
    assert m_in().expiration == 0


def test_message_expiry_interval_zero_is_a_lifetime_of_zero():
    assert m_in(message_expiry_interval=0).expiration == T0


def test_correlation_data_becomes_the_correlation_id_as_bytes():
    m = m_in(correlation_data=b"\x00req-1\xff\x00")
    assert m.correlation_id == b"\x00req-1\xff\x00"
    assert type(m.correlation_id) is bytes


def test_content_type_is_kept_as_a_property():
    assert m_in(content_type="application/cbor").properties[CONTENT_TYPE_PROPERTY] == (
        "application/cbor"
    )
    assert CONTENT_TYPE_PROPERTY not in m_in().properties


def test_reply_to_is_what_the_adapter_gives_and_the_raw_response_topic_is_not_kept():
    reply = Destination.topic("replies.dev1")
    m = m_in(reply_to=reply, response_topic="replies/dev1")
    assert m.reply_to == reply
    assert "response_topic" not in m.properties
    assert all(v != "replies/dev1" for v in m.properties.values())
    assert m_in().reply_to is None


def test_hop_by_hop_properties_are_not_kept():
    m = m_in(topic_alias=3, subscription_identifier=[7])
    assert set(m.properties) == {QOS_PROPERTY}


def test_destination_timestamp_and_defaults():
    m = m_in()
    assert m.destination == DEST
    assert m.timestamp == T0
    assert m.priority == 4
    assert m.type is None
    assert m.message_id is None
    assert m.trace_id is None


def test_below_level_5_the_properties_are_ignored():
    for level in (3, 4):
        m = m_in(
            b"\xff",
            level=level,
            payload_format_indicator=1,
            content_type="text/plain",
            message_expiry_interval=5,
            correlation_data=b"c",
            user_property=[("a", "b")],
        )
        assert (m.body_kind, m.body) == (BodyKind.BYTES, b"\xff")
        assert m.expiration == 0
        assert m.correlation_id is None
        assert set(m.properties) == {QOS_PROPERTY}


# -- user properties ----------------------------------------------------------------------------


def test_user_properties_become_string_properties_in_order():
    m = m_in(user_property=[("zeta", "1"), ("alpha", "two"), ("mid", "")])
    assert list(m.properties.items()) == [
        ("zeta", "1"),
        ("alpha", "two"),
        ("mid", ""),
        (QOS_PROPERTY, Int8(1)),
    ]
    assert all(type(m.properties[k]) is str for k in ("zeta", "alpha", "mid"))


def test_a_repeated_user_property_keeps_its_first_value_and_all_go_out_again():
    sent = [("k", "first"), ("x", "1"), ("k", "second"), ("k", "third")]
    m = m_in(user_property=sent + [("JMSType", "t")])
    assert m.properties["k"] == "first"
    assert [k for k in m.properties if k != QOS_PROPERTY] == ["k", "x", USER_RECORD_PROPERTY]
    assert json.loads(m.properties[USER_RECORD_PROPERTY]) == [list(p) for p in sent]
    # [MQTT-3.3.2-17], [MQTT-3.3.2-18]: every one, in order, to an MQTT 5 subscriber
    assert user_props(m) == sent + [("JMSType", "t")]
    assert USER_RECORD_PROPERTY not in dict(user_props(m))


def test_a_user_property_with_an_empty_name_is_dropped_but_goes_out_again():
    m = m_in(user_property=[("", "v"), ("a", "b")])
    assert "" not in m.properties
    assert m.properties["a"] == "b"
    m.validate()
    assert user_props(m) == [("", "v"), ("a", "b")]


def test_without_repeats_no_record_is_kept():
    m = m_in(user_property=[("a", "1"), ("b", "2"), ("gw-types", "a:int8")])
    assert USER_RECORD_PROPERTY not in m.properties


def test_trace_user_property_sets_the_trace_id_not_a_property():
    m = m_in(
        user_property=[("a", "1"), (TRACE_USER_PROPERTY, "gw7.42"), (TRACE_USER_PROPERTY, "x")]
    )
    assert m.trace_id == "gw7.42"
    assert TRACE_USER_PROPERTY not in m.properties


def test_jms_type_and_priority_user_properties_set_the_headers():
    m = m_in(user_property=[("JMSType", "reading"), ("JMSPriority", "7"), ("a", "b")])
    assert m.type == "reading"
    assert m.priority == 7
    assert "JMSType" not in m.properties and "JMSPriority" not in m.properties


@pytest.mark.parametrize("bad", ["10", "-1", "high", "", " 7"])
def test_an_unusable_jms_priority_stays_a_property(bad):
    m = m_in(user_property=[("JMSPriority", bad)])
    assert m.priority == 4
    assert m.properties["JMSPriority"] == bad


def test_jms_message_id_user_property_stays_a_property():
    m = m_in(user_property=[("JMSMessageID", "ID:other.1")])
    assert m.message_id is None
    assert m.properties["JMSMessageID"] == "ID:other.1"


# -- gw-types -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tname", "text", "expected"),
    [
        ("boolean", "true", True),
        ("boolean", "false", False),
        ("int8", "-128", Int8(-128)),
        ("int16", "32767", Int16(32767)),
        ("int32", "-7", Int32(-7)),
        ("int64", "9223372036854775807", Int64(2**63 - 1)),
        ("long", "-42", -42),
        ("uint8", "255", UInt8(255)),
        ("uint16", "65535", UInt16(65535)),
        ("uint32", "4294967295", UInt32(2**32 - 1)),
        ("uint64", "18446744073709551615", UInt64(2**64 - 1)),
        ("float32", "0.1", Float32(0.1)),
        ("float32", "-inf", Float32(-math.inf)),
        ("float64", "2.5e-300", 2.5e-300),
        ("float64", "-0.0", -0.0),
        ("char", "é", Char("é")),
        ("string", "5", "5"),
        ("null", "", None),
    ],
)
def test_types_user_property_converts_listed_values(tname, text, expected):
    m = m_in(user_property=[("p", text), (TYPES_USER_PROPERTY, "p:" + tname)])
    assert same_value(m.properties["p"], expected), (m.properties["p"], expected)
    assert TYPES_USER_PROPERTY not in m.properties


def test_types_user_property_nan():
    m = m_in(
        user_property=[("a", "nan"), ("b", "nan"), (TYPES_USER_PROPERTY, "a:float32,b:float64")]
    )
    assert type(m.properties["a"]) is Float32 and math.isnan(m.properties["a"])
    assert type(m.properties["b"]) is float and math.isnan(m.properties["b"])


@pytest.mark.parametrize(
    ("tname", "text"),
    [
        ("int8", "128"),
        ("uint16", "-1"),
        ("int32", "1.5"),
        ("int32", "x"),
        ("long", "9223372036854775808"),
        ("boolean", "yes"),
        ("boolean", "True"),
        ("float32", "1e40"),
        ("float64", "one"),
        ("char", "ab"),
        ("char", ""),
        ("null", "x"),
        ("bytes", "AA=C"),
        ("json", "{not json"),
        ("no-such-type", "1"),
    ],
)
def test_a_value_that_does_not_parse_stays_a_string(tname, text):
    m = m_in(user_property=[("p", text), (TYPES_USER_PROPERTY, "p:" + tname)])
    assert same_value(m.properties["p"], text)


def test_types_entries_for_absent_names_and_malformed_entries_are_ignored():
    m = m_in(
        user_property=[
            ("a", "1"),
            (TYPES_USER_PROPERTY, "missing:int32,,garbage,a:int16,a:int32"),
        ]
    )
    assert same_value(m.properties["a"], Int16(1))  # the first entry for a name counts
    assert "missing" not in m.properties


def test_types_names_are_escaped():
    m = m_in(
        user_property=[
            ("a,b", "1"),
            ("c:d", "2"),
            ("e%f", "3"),
            ("%2C", "4"),
            (TYPES_USER_PROPERTY, "a%2Cb:int8,c%3Ad:int16,e%25f:int32,%252C:uint8"),
        ]
    )
    assert same_value(m.properties["a,b"], Int8(1))
    assert same_value(m.properties["c:d"], Int16(2))
    assert same_value(m.properties["e%f"], Int32(3))
    assert same_value(m.properties["%2C"], UInt8(4))


def test_escaped_names_and_values_are_unescaped_in_place():
    m = m_in(
        user_property=[
            ("first", "1"),
            ("a%00b", "x%00y%25%uD800"),
            ("last", "2"),
            (TYPES_USER_PROPERTY, "a%2500b:string:esc"),
        ]
    )
    assert list(m.properties)[:3] == ["first", "a\x00b", "last"]
    assert m.properties["a\x00b"] == "x\x00y%\ud800"


# == core → MQTT ==============================================================================

# -- body ---------------------------------------------------------------------------------------


def test_text_body_is_utf8_with_payload_format_indicator():
    out = m_out(Message.text("21,5 °C"))
    assert out.payload == b"21,5 \xc2\xb0C"
    assert out.properties["payload_format_indicator"] == 1
    assert "content_type" not in out.properties


def test_text_body_with_a_lone_surrogate_is_sent_but_not_claimed_as_utf8():
    out = m_out(Message.text("a\ud800"))
    assert out.payload == b"a\xed\xa0\x80"
    assert "payload_format_indicator" not in out.properties


@pytest.mark.parametrize("kind", [BodyKind.BYTES, BodyKind.OBJECT])
def test_bytes_and_object_bodies_are_sent_as_they_are(kind):
    out = m_out(Message(b"\x00\xac\xed", body_kind=kind))
    assert out.payload == b"\x00\xac\xed"
    assert "payload_format_indicator" not in out.properties


def test_no_body_is_an_empty_payload():
    out = m_out(Message(None))
    assert out.payload == b""
    assert "payload_format_indicator" not in out.properties


@pytest.mark.parametrize(
    ("body", "expected"),
    [({"a": Int32(1)}, {"a": 1}), ([Int32(1), "x"], [1, "x"])],
    ids=["map", "stream"],
)
def test_map_and_stream_bodies_are_json_with_content_type(body, expected):
    msg = Message(body, properties={CONTENT_TYPE_PROPERTY: "application/x-other"})
    out = m_out(msg)
    assert json.loads(out.payload) == expected
    assert out.properties["content_type"] == "application/json"
    assert out.properties["payload_format_indicator"] == 1


def test_the_documented_json_form():
    body = {
        "temp": Float32(21.1),
        "big": UInt64(2**64 - 1),
        "small": Int8(-3),
        "ratio": 0.1,
        "ok": True,
        "off": False,
        "grade": Char("A"),
        "none": None,
        "raw": b"\x00\xffhi",
        "shorts": Int16Array([1, -2]),
        "floats": Float32Array([0.5, 1.1]),
        "doubles": Float64Array([math.nan, math.inf, -math.inf, 1.25]),
        "flags": BoolArray([True, False]),
        "odd": [math.nan, Float32(math.inf), Float32(-math.inf)],
        "nested": {"list": [{"deep": [Int32(7), "s"]}, []], "empty": {}},
        "text": 'quote" and \\ and é and \n',
    }
    out = m_out(Message.map(body))
    assert json.loads(out.payload) == {
        "temp": 21.1,
        "big": 18446744073709551615,
        "small": -3,
        "ratio": 0.1,
        "ok": True,
        "off": False,
        "grade": "A",
        "none": None,
        "raw": "AP9oaQ==",
        "shorts": [1, -2],
        "floats": [0.5, 1.1],
        "doubles": ["NaN", "Infinity", "-Infinity", 1.25],
        "flags": [True, False],
        "odd": ["NaN", "Infinity", "-Infinity"],
        "nested": {"list": [{"deep": [7, "s"]}, []], "empty": {}},
        "text": 'quote" and \\ and é and \n',
    }
    text = out.payload.decode()
    assert '"temp":21.1,' in text  # float32 by its shortest text, not 21.100000381469727
    assert '"floats":[0.5,1.1]' in text
    assert "é" in text  # UTF-8, not \u escapes


def test_json_body_key_order_is_kept():
    out = m_out(Message.map({"z": 1, "a": 2, "m": 3}))
    assert out.payload == b'{"z":1,"a":2,"m":3}'


def test_json_stream_body_exact_bytes():
    out = m_out(Message.stream([Float32(1.0), -0.0, Int16(5), b"", None, [True]]))
    assert out.payload == b'[1.0,-0.0,5,"",null,[true]]'


def test_json_body_with_a_lone_surrogate_is_still_valid_utf8():
    out = m_out(Message.map({"k\ud800": "v\udfff", "é": 1}))
    text = out.payload.decode("utf-8")  # strict: must not raise
    assert json.loads(text) == {"k\ud800": "v\udfff", "é": 1}


# -- QoS ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "qos"),
    [(DeliveryMode.PERSISTENT, 2), (DeliveryMode.NON_PERSISTENT, 1), (DeliveryMode.RELIABLE, 0)],
)
def test_qos_from_delivery_mode(mode, qos):
    assert m_out(Message.text("x", delivery_mode=mode)).qos == qos


@pytest.mark.parametrize("q", [0, 1, 2])
def test_qos_property_wins_over_delivery_mode(q):
    msg = Message.text("x", delivery_mode=DeliveryMode.RELIABLE, properties={QOS_PROPERTY: Int8(q)})
    assert m_out(msg).qos == q
    assert m_out(msg, level=4).qos == q


@pytest.mark.parametrize("bad", [Int8(3), Int8(-1), "1", 1.5])
def test_an_unusable_qos_property_falls_back_to_the_delivery_mode(bad):
    msg = Message.text(
        "x", delivery_mode=DeliveryMode.NON_PERSISTENT, properties={QOS_PROPERTY: bad}
    )
    assert m_out(msg).qos == 1


# -- level < 5 ----------------------------------------------------------------------------------


@pytest.mark.parametrize("level", [3, 4])
def test_below_level_5_only_the_payload_and_qos(level):
    msg = Message.text(
        "hi",
        properties={"a": "b", CONTENT_TYPE_PROPERTY: "text/plain"},
        correlation_id="c",
        expiration=T0 + 5000,
        type="t",
        priority=9,
        message_id="ID:1",
    )
    msg.trace_id = "tr"
    out = m_out(msg, level=level, reply_topic="r")
    assert out == (b"hi", 2, {})


# -- MQTT 5 properties ---------------------------------------------------------------------------


def test_content_type_from_the_content_type_property():
    out = m_out(Message.binary(b"\x89PNG", properties={CONTENT_TYPE_PROPERTY: "image/png"}))
    assert out.properties["content_type"] == "image/png"
    assert "payload_format_indicator" not in out.properties


def test_message_expiry_interval_is_the_remaining_time_rounded_up():
    assert (
        m_out(Message.text("x", expiration=T0 + 60_000)).properties["message_expiry_interval"] == 60
    )
    assert m_out(Message.text("x", expiration=T0 + 1)).properties["message_expiry_interval"] == 1
    assert m_out(Message.text("x", expiration=T0 + 1001)).properties["message_expiry_interval"] == 2
    # the time the message waited is subtracted [MQTT-3.3.2-6]
    msg = Message.text("x", expiration=T0 + 60_000)
    assert m_out(msg, now_ms=T0 + 10_500).properties["message_expiry_interval"] == 50


def test_message_expiry_uses_the_effective_expiry_first():
    msg = Message.text("x", expiration=0)
    msg.expires_at = T0 + 9_000  # a destination override: consumers see JMSExpiration 0
    assert m_out(msg).properties["message_expiry_interval"] == 9
    msg = Message.text("x", expiration=T0 + 100_000)
    msg.expires_at = T0 + 3_000
    assert m_out(msg).properties["message_expiry_interval"] == 3


def test_no_expiry_means_no_message_expiry_interval():
    assert "message_expiry_interval" not in m_out(Message.text("x")).properties


def test_an_expired_message_gets_one_second():
    assert m_out(Message.text("x", expiration=T0)).properties["message_expiry_interval"] == 1
    assert m_out(Message.text("x", expiration=5)).properties["message_expiry_interval"] == 1


def test_a_far_expiry_is_capped_to_a_four_byte_integer():
    msg = Message.text("x", expiration=2**62)
    assert m_out(msg).properties["message_expiry_interval"] == 0xFFFFFFFF


def test_response_topic_is_the_adapters_reply_topic():
    msg = Message.text("x", reply_to=Destination.queue("replies"))
    assert m_out(msg, reply_topic="replies/q").properties["response_topic"] == "replies/q"
    assert "response_topic" not in m_out(msg).properties


def test_correlation_id_becomes_correlation_data_bytes():
    assert m_out(Message.text("x", correlation_id="req-é")).properties["correlation_data"] == (
        b"req-\xc3\xa9"
    )
    assert (
        m_out(Message.text("x", correlation_id=b"\x00\x01")).properties["correlation_data"]
        == b"\x00\x01"
    )
    assert "correlation_data" not in m_out(Message.text("x")).properties


def test_every_property_and_the_headers_become_user_properties_in_order():
    msg = Message.text(
        "x",
        properties={
            "s": "text",
            QOS_PROPERTY: Int8(1),
            "b": True,
            "f": False,
            "i8": Int8(-8),
            "i32": Int32(32),
            "long": 2**40,
            "u16": UInt16(65535),
            "f32": Float32(0.1),
            "f64": 0.1,
            "c": Char("€"),
            RETAIN_PROPERTY: True,
            "n": None,
            CONTENT_TYPE_PROPERTY: "text/plain",
            "JMS_GW_TRACE_ID": "old-trace",
            "z": "last",
        },
        type="reading",
        priority=7,
        message_id="ID:gw1.5",
    )
    msg.trace_id = "gw1.5"
    assert user_props(msg) == [
        ("s", "text"),
        ("b", "true"),
        ("f", "false"),
        ("i8", "-8"),
        ("i32", "32"),
        ("long", "1099511627776"),
        ("u16", "65535"),
        ("f32", "0.1"),
        ("f64", "0.1"),
        ("c", "€"),
        ("n", ""),
        ("z", "last"),
        ("JMSType", "reading"),
        ("JMSPriority", "7"),
        # no JMSMessageID: the message came from an MQTT publisher (it has JMS_GW_MQTT_QOS)
        (
            TYPES_USER_PROPERTY,
            "b:boolean,f:boolean,i8:int8,i32:int32,long:long,u16:uint16,f32:float32,"
            "f64:float64,c:char,n:null",
        ),
        # and never the trace id: it is in the delivery log
    ]


def test_a_message_from_elsewhere_carries_its_message_id_but_never_the_trace_id():
    msg = Message.text("x", properties={"a": "1"}, message_id="ID:gw1.5")
    msg.trace_id = "gw1.5"
    assert user_props(msg) == [("a", "1"), ("JMSMessageID", "ID:gw1.5")]
    msg.properties[QOS_PROPERTY] = Int8(1)  # the same message from an MQTT publisher
    assert user_props(msg) == [("a", "1")]


def test_only_strings_means_no_types_user_property_and_default_priority_is_not_sent():
    msg = Message.text("x", properties={"a": "1", "b": "2"})
    assert user_props(msg) == [("a", "1"), ("b", "2")]


def test_no_properties_no_headers_means_no_user_property_at_all():
    assert "user_property" not in m_out(Message.text("x")).properties


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Float32(1.0), "1.0"),
        (Float32(-0.0), "-0.0"),
        (Float32(16777216.0), "16777216.0"),
        (Float32(3.4028234663852886e38), "3.4028235e+38"),
        (Float32(math.inf), "inf"),
        (1e300, "1e+300"),
        (-math.inf, "-inf"),
        (Int64(-(2**63)), "-9223372036854775808"),
    ],
)
def test_number_texts(value, text):
    assert user_props(Message.text("x", properties={"v": value}))[0] == ("v", text)


def test_typed_property_names_are_escaped_in_the_types_list():
    msg = Message.text("x", properties={"a,b": Int8(1), "c:d": True, "e%f": "plain"})
    assert user_props(msg) == [
        ("a,b", "1"),
        ("c:d", "true"),
        ("e%f", "plain"),
        (TYPES_USER_PROPERTY, "a%2Cb:int8,c%3Ad:boolean"),
    ]


def test_strings_mqtt_cannot_carry_are_escaped_and_marked():
    msg = Message.text(
        "x", properties={"a\x00b": "v", "k": "x\ud800%", "c": Char("\x00")}, type="t\x00"
    )
    assert user_props(msg) == [
        ("a%00b", "v"),
        ("k", "x%uD800%25"),
        ("c", "%00"),
        ("JMSType", "t%00"),
        (TYPES_USER_PROPERTY, "a%2500b:string:esc,k:string:esc,c:char:esc,JMSType:string:esc"),
    ]


def test_a_trace_id_mqtt_cannot_carry_is_escaped_and_read_back():
    """trace_user_property, as the mqtt transport adds the trace id to an export."""
    msg = Message.text("x")
    msg.trace_id = "t\x00%"
    pairs = trace_user_property(user_props(msg), msg.trace_id)
    assert pairs == [
        (TYPES_USER_PROPERTY, "gw-trace-id:string:esc"),
        (TRACE_USER_PROPERTY, "t%00%25"),
    ]
    back = m_in(user_property=pairs)
    assert back.trace_id == "t\x00%"
    assert set(back.properties) == {QOS_PROPERTY}
    typed = Message.text("x", properties={"n": Int8(1)})
    assert trace_user_property(user_props(typed), "t\x00") == [
        ("n", "1"), (TYPES_USER_PROPERTY, "n:int8,gw-trace-id:string:esc"),
        (TRACE_USER_PROPERTY, "t%00")]
    assert trace_user_property([("a", "1")], "t") == [("a", "1"), (TRACE_USER_PROPERTY, "t")]
    # one there already (a mapping rule's) is kept
    assert trace_user_property([(TRACE_USER_PROPERTY, "r")], "t") == [(TRACE_USER_PROPERTY, "r")]


def test_the_properties_dict_is_fresh_for_every_call():
    msg = Message.text("x", properties={"a": "b"})
    first = m_out(msg)
    first.properties["subscription_identifier"] = [1]
    first.properties["user_property"].append(("x", "y"))
    assert m_out(msg).properties == {
        "payload_format_indicator": 1,
        "user_property": [("a", "b")],
    }


# == round trips ===============================================================================


def test_round_trip_mqtt5_core_mqtt5_keeps_what_the_publisher_sent():
    sent_user = [
        ("device", "thermo-7"),
        ("unit", "°C"),
        ("b", "2"),
        ("a", "1"),
        (TRACE_USER_PROPERTY, "edge.99"),
    ]
    msg = m_in(
        b"21.5",
        qos=1,
        payload_format_indicator=1,
        content_type="text/plain; charset=utf-8",
        message_expiry_interval=60,
        correlation_data=b"\x00corr\xff\x00",
        user_property=sent_user,
        reply_to=Destination.topic("replies.thermo-7"),
    )
    msg.message_id = "ID:gw.1"  # as the broker stamps it
    out = m_out(msg, now_ms=T0 + 10_250, reply_topic="replies/thermo-7")
    assert out.payload == b"21.5"
    assert out.qos == 1
    p = out.properties
    assert p["payload_format_indicator"] == 1
    assert p["content_type"] == "text/plain; charset=utf-8"
    assert p["message_expiry_interval"] == 50  # 60 s less 10.25 s waited, rounded up
    assert p["correlation_data"] == b"\x00corr\xff\x00"
    assert p["response_topic"] == "replies/thermo-7"
    assert p["user_property"] == [
        ("device", "thermo-7"),
        ("unit", "°C"),
        ("b", "2"),
        ("a", "1"),
    ]  # neither the gateway's JMSMessageID nor the trace id (the publisher's gw-trace-id
    # is a name the gateway reserves: it set the trace id)
    assert msg.trace_id == "edge.99"


def test_round_trip_of_bytes_with_content_type():
    msg = m_in(b"\x00\x01", qos=2, content_type="application/cbor")
    out = m_out(msg)
    assert out == (b"\x00\x01", 2, {"content_type": "application/cbor"})


def test_round_trip_keeps_retain_and_qos_0_in_the_core():
    msg = m_in(b"x", qos=0, retain=True)
    assert msg.delivery_mode is DeliveryMode.NON_PERSISTENT
    assert m_out(msg).qos == 0  # not 1, as a NON_PERSISTENT message from elsewhere would get
    assert m_out(msg).properties == {}


def _wire_legal(text: str) -> bool:
    """An MQTT UTF-8 Encoded String: no U+0000 and no surrogate [MQTT-1.5.4-1, -2]."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_header_text = st.text(st.characters(exclude_categories=()), max_size=12)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    props=st.dictionaries(names, property_values(), max_size=8),
    msg_type=st.none() | _header_text,
    priority=st.integers(0, 9),
    trace=st.none() | _header_text,
)
def test_typed_properties_survive_core_mqtt5_core(props, msg_type, priority, trace):
    reserved = {QOS_PROPERTY, RETAIN_PROPERTY, CONTENT_TYPE_PROPERTY, PFI_PROPERTY, "JMS_GW_TRACE_ID",
                TRACE_USER_PROPERTY, TYPES_USER_PROPERTY, "JMSType", "JMSPriority",
                "JMSMessageID"}  # fmt: skip
    props = {k: v for k, v in props.items() if k not in reserved}
    msg = Message.text("x", properties=dict(props), type=msg_type, priority=priority)
    msg.trace_id = trace
    out = m_out(msg)
    for name, value in out.properties.get("user_property", []):
        assert _wire_legal(name) and _wire_legal(value), (name, value)
    out.properties["user_property"] = trace_user_property(
        out.properties.get("user_property"), trace)  # as the mqtt transport sends it
    back = m_in(out.payload, qos=out.qos, **out.properties)
    got = dict(back.properties)
    assert same_value(got.pop(QOS_PROPERTY), Int8(2))
    assert same_value(got.pop(PFI_PROPERTY, Int8(1)), Int8(1))
    assert same_value(got, props), (got, props)
    assert back.type == msg_type
    assert back.priority == priority
    assert back.trace_id == trace
    back.validate()


def test_typed_properties_examples_survive_core_mqtt5_core():
    props = {
        "count": Int32(-5),
        "level": Float32(0.3),
        "on": True,
        "port": UInt16(8883),
        "grade": Char("B"),
        "name": "x",
        "big": 2**63 - 1,
        "wide": Int64(1),
        "ratio": 1 / 3,
    }
    back = m_in(**m_out(Message.text("x", properties=dict(props))).properties)
    del back.properties[QOS_PROPERTY]
    assert back.properties.pop(PFI_PROPERTY) == 1  # the indicator the hop sent
    assert same_value(back.properties, props)


# == the JSON form, read back by an independent reader ===========================================


def _reads_as(loaded: Any, v: Any) -> bool:
    """Does ``loaded`` (from json.loads) read as ``v`` by the README's documented form?"""
    t = type(v)
    if v is None:
        return loaded is None
    if t is bool:
        return loaded is v
    if t is str or t is Char:
        return type(loaded) is str and loaded == v
    if t is bytes:
        return type(loaded) is str and base64.b64decode(loaded, validate=True) == v
    if isinstance(v, float):
        if math.isnan(v):
            return loaded == "NaN"
        if math.isinf(v):
            return loaded == ("Infinity" if v > 0 else "-Infinity")
        if type(loaded) not in (int, float):
            return False
        same_sign = math.copysign(1, float(loaded)) == math.copysign(1, v)
        if t is Float32:
            return Float32(loaded) == v and same_sign
        return float(loaded) == v and same_sign
    if isinstance(v, int):
        return type(loaded) is int and loaded == v
    if t is dict:
        return (
            type(loaded) is dict
            and list(loaded) == list(v)
            and all(_reads_as(loaded[k], v[k]) for k in v)
        )
    if t is list or isinstance(v, TypedArray):
        return (
            type(loaded) is list
            and len(loaded) == len(v)
            and all(_reads_as(x, y) for x, y in zip(loaded, v, strict=True))
        )
    raise AssertionError(f"unexpected value {v!r}")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.one_of(
    st.dictionaries(st.text(max_size=10), nested_values(), max_size=6),
    st.lists(nested_values(), max_size=6),
))  # fmt: skip
def test_map_and_stream_bodies_are_json_a_reader_can_read(body):
    out = m_out(Message(body))
    loaded = json.loads(out.payload.decode("utf-8"))
    assert _reads_as(loaded, body), (loaded, body)


@pytest.mark.parametrize("cls", ARRAY_TYPES, ids=lambda c: c.NAME)
def test_every_array_type_is_a_json_array(cls):
    one = True if cls.ELEMENT is bool else 1
    loaded = json.loads(m_out(Message.stream([cls([one, one])])).payload)
    assert loaded == [[one, one]]
    assert all(type(x) is type(one) or cls.ELEMENT in (float, Float32) for x in loaded[0])


# == the README documents every rule ================================================================


def test_readme_names_every_constant_and_rule():
    readme = (Path(__file__).resolve().parents[2] / "mappings" / "README.md").read_text(
        encoding="utf-8"
    )
    for word in (
        QOS_PROPERTY,
        RETAIN_PROPERTY,
        CONTENT_TYPE_PROPERTY,
        TRACE_USER_PROPERTY,
        TYPES_USER_PROPERTY,
        PFI_PROPERTY,
        USER_RECORD_PROPERTY,
        "0x99",
        "MQTT-3.3.2-6",
        "payload_format_indicator",
        "message_expiry_interval",
        "correlation_data",
        "response_topic",
        "user_property",
        "JMSType",
        "JMSPriority",
        "JMSMessageID",
        ":esc",
        "Infinity",
        "base64",
    ):
        assert word in readme, word


def test_bytes_and_compound_properties_travel_as_base64_and_json():
    """Values JMS does not allow as properties but AMQP brings: reversible for bytes, JSON
    for maps, lists and arrays (mappings/README.md, "User properties")."""
    msg = Message.text("x", properties={"bin": b"\x00\xff", "map": {"k": Int32(1)},
                                        "list": [Int32(1), "x"], "arr": Int16Array([1, 2])})
    out = m_out(msg)
    ups = dict(out.properties["user_property"])
    assert ups["bin"] == "AP8="
    assert (ups["map"], ups["list"], ups["arr"]) == ('{"k":1}', '[1,"x"]', "[1,2]")
    assert "bin:bytes" in ups["gw-types"] and "map:json" in ups["gw-types"]
    back = m_in(out.payload, qos=1, user_property=out.properties["user_property"])
    assert back.properties["bin"] == b"\x00\xff"
    assert back.properties["map"] == {"k": 1} and back.properties["list"] == [1, "x"]
    assert back.properties["arr"] == [1, 2]
