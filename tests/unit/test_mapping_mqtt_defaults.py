"""The default MQTT mapping rules (mappings/defaults/mqtt.yaml) against the fast path.

The rules run by the engine (``MappingSet().wire_for(..., fast=False)``) and the hand-written
``mqtt_to_message`` / ``message_to_mqtt`` must give the same answer for every input: the same
core message field by field (every value with its exact type, nested map and stream bodies,
typed properties, the size estimate), the same payload, QoS and MQTT 5 properties (in the same
order, user properties included), and the same error when a PUBLISH is refused. Inputs are
drawn by hypothesis: PUBLISH packets of every protocol level with the properties the mapping
reads, valid and not, and messages of every body kind and property type, including what a
core → MQTT 5 hop writes, fed back in.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import any_text, map_bodies, message_differences, messages, names, stream_bodies

from gateway.message import BodyKind, Destination, Message
from gateway.types import Float32, Int8, Int32
from mappings.engine import MappingSet
from mappings.mqtt import PayloadFormatInvalid, message_to_mqtt, mqtt_to_message
from mappings.rows import is_fast, why_not_fast
from mappings.rules import default_rules

# The fast path is the default mapping only while the rows are the ones it is written for
# (mappings/rows.py); when a row changes, the engine runs the rows and these comparisons wait
# for the fast path to follow, saying so.
pytestmark = pytest.mark.skipif(
    not (is_fast("mqtt", "in") and is_fast("mqtt", "out")),
    reason=f"the mqtt fast path is off: {why_not_fast('mqtt', 'in') or why_not_fast('mqtt', 'out')}")

T = Destination.topic("sensors.a")
NOW = 1_700_000_000_000
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

EMPTY = MappingSet()
RULES_IN = EMPTY.wire_for(T, protocol="mqtt", direction="in", fast=False)
RULES_OUT = EMPTY.wire_for(T, protocol="mqtt", direction="out", fast=False)


def both_in(payload: bytes, qos: int, retain: bool, props: dict[str, Any], level: int,
            reply_to: Destination | None = None) -> tuple[Any, Any]:
    results = []
    for fn in (mqtt_to_message, RULES_IN):
        try:
            results.append(fn(payload=payload, qos=qos, retain=retain, properties=props,
                              level=level, destination=T, reply_to=reply_to, now_ms=NOW))
        except Exception as exc:  # noqa: BLE001 - the error is part of the answer
            results.append((type(exc), str(exc)))
    return results[0], results[1]


def assert_same_in(payload: bytes, qos: int, retain: bool, props: dict[str, Any], level: int,
                   reply_to: Destination | None = None) -> Any:
    fast, rules = both_in(payload, qos, retain, props, level, reply_to)
    if isinstance(fast, Message) and isinstance(rules, Message):
        assert message_differences(fast, rules) == []
        assert type(rules) is Message and fast.size == rules.size
        assert fast.expires_at == rules.expires_at == 0
    else:
        assert fast == rules
    return fast


def assert_same_out(msg: Message, level: int, now: int, reply_topic: str | None) -> Any:
    fast = message_to_mqtt(msg, level=level, now_ms=now, reply_topic=reply_topic)
    rules = RULES_OUT(msg, level=level, now_ms=now, reply_topic=reply_topic)
    assert (rules.payload, rules.qos) == (fast.payload, fast.qos)
    assert type(rules.qos) is int and type(rules.payload) is type(fast.payload)
    assert list(rules.properties.items()) == list(fast.properties.items())
    return fast


# -- packets -------------------------------------------------------------------------------------

_TYPE_NAMES = ["int8", "int32", "uint64", "long", "boolean", "float32", "float64", "char", "null",
               "bytes", "json", "string", "nonsense"]
_special = st.sampled_from(["JMSType", "JMSPriority", "gw-trace-id", "JMSMessageID",
                            "JMS_GW_MQTT_PFI", "JMS_GW_MQTT_USER_PROPERTIES", "JMS_GW_MQTT_QOS", "JMS_GW_MQTT_RETAIN", "JMS_GW_CONTENT_TYPE", ""])
_values = any_text | st.sampled_from(["0", "7", "9", "12", "x", "true", "1.5"])


@st.composite
def user_properties(draw: st.DrawFn) -> list[tuple[str, str]]:
    pairs = draw(st.lists(st.tuples(_special | names, _values), max_size=8))
    if draw(st.booleans()):
        listed = draw(st.lists(st.sampled_from([n for n, _ in pairs] or ["x"]), max_size=4))
        entries = [f"{n}:{draw(st.sampled_from(_TYPE_NAMES))}" + draw(st.sampled_from(["", ":esc"]))
                   for n in listed]
        pairs.insert(draw(st.integers(0, len(pairs))), ("gw-types", ",".join(entries)))
    return pairs


@st.composite
def publishes(draw: st.DrawFn) -> tuple[bytes, int, bool, dict[str, Any], int]:
    props: dict[str, Any] = {}
    if draw(st.booleans()):
        props["payload_format_indicator"] = draw(st.sampled_from([0, 1]))
    if draw(st.booleans()):
        props["content_type"] = draw(st.sampled_from(
            ["text/plain", "application/json", "application/octet-stream", "x;charset=UTF-8"])
            | any_text)  # fmt: skip
    if draw(st.booleans()):
        props["message_expiry_interval"] = draw(st.integers(0, 2**32 - 1))
    if draw(st.booleans()):
        props["correlation_data"] = draw(st.binary(max_size=16))
    if draw(st.booleans()):
        props["response_topic"] = "r/1"
    if draw(st.booleans()):
        props["user_property"] = draw(user_properties())
    if draw(st.booleans()):
        props["topic_alias"] = 3
    payload = draw(st.binary(max_size=40) | any_text.map(lambda t: t.encode("utf-8",
                                                                                  "surrogatepass")))
    return payload, draw(st.integers(0, 2)), draw(st.booleans()), props, draw(
        st.sampled_from([3, 4, 5]))  # fmt: skip


@SETTINGS
@given(publishes())
def test_any_publish_maps_alike(p: tuple[bytes, int, bool, dict[str, Any], int]) -> None:
    assert_same_in(*p)


@SETTINGS
@given(messages(), st.sampled_from([4, 5]), st.integers(NOW - 10**6, NOW + 10**6),
       st.none() | st.just("replies/1"))
def test_any_message_maps_alike_out_and_back(msg: Message, level: int, now: int,
                                             reply_topic: str | None) -> None:
    out = assert_same_out(msg, level, now, reply_topic)
    assert_same_in(out.payload, out.qos, False, out.properties, level)


_foreign = st.one_of(st.binary(max_size=8), map_bodies(), stream_bodies())


@SETTINGS
@given(st.dictionaries(names, _foreign, min_size=1, max_size=3))
def test_properties_of_no_jms_type_render_alike(props: dict[str, Any]) -> None:
    out = assert_same_out(Message("x", properties=props, destination=T), 5, NOW, None)
    assert_same_in(out.payload, out.qos, True, out.properties, 5)


# -- fixed vectors ---------------------------------------------------------------------------------


def test_a_payload_that_lies_about_utf8_is_the_same_error() -> None:
    fast, rules = both_in(b"\xff", 1, False, {"payload_format_indicator": 1}, 5)
    assert fast == rules and fast[0] is PayloadFormatInvalid


def test_a_typed_publish_maps_alike() -> None:
    msg = assert_same_in(b'{"a": 1}', 2, True, {
        "content_type": "application/json", "message_expiry_interval": 60,
        "correlation_data": b"\x00id", "user_property": [
            ("n", "-8"), ("n", "9"), ("JMSType", "t%00"), ("JMSPriority", "7"),
            ("gw-types", "n:int8,JMSType:string:esc,f:float32"), ("f", "0.1"),
            ("gw-trace-id", "tr"), ("JMS_GW_MQTT_QOS", "0")],
    }, 5)  # fmt: skip
    assert msg.properties == {"n": Int8(-8), "f": Float32(0.1),
                              "JMS_GW_MQTT_USER_PROPERTIES": '[["n","-8"],["n","9"],["f","0.1"]]',
                              "JMS_GW_CONTENT_TYPE": "application/json",
                              "JMS_GW_MQTT_QOS": Int8(2), "JMS_GW_MQTT_RETAIN": True}
    assert (msg.type, msg.priority, msg.trace_id) == ("t\x00", 7, "tr")
    assert msg.body == '{"a": 1}' and msg.body_kind is BodyKind.TEXT
    assert (msg.expiration, msg.correlation_id) == (NOW + 60_000, b"\x00id")


def test_a_typed_message_renders_alike() -> None:
    msg = Message({"m": [Int32(1), None]}, destination=T, type="ty", priority=9,
                  properties={"n": Int32(-3), "JMS_GW_MQTT_QOS": Int8(1)}, message_id="ID:1",
                  correlation_id="c\udc00", expiration=NOW + 1500)
    msg.trace_id = "t\x00"
    out = assert_same_out(msg, 5, NOW, "replies/1")
    assert out.qos == 1 and out.payload == b'{"m":[1,null]}'
    # From an MQTT publisher (JMS_GW_MQTT_QOS): no JMSMessageID; never the trace id.
    assert out.properties["user_property"] == [
        ("n", "-3"), ("JMSType", "ty"), ("JMSPriority", "9"), ("gw-types", "n:int32")]
    assert out.properties["message_expiry_interval"] == 2
    assert assert_same_out(msg, 4, NOW, None).properties == {}


def test_the_rules_are_one_per_row_in_order() -> None:
    names_in = [r["name"] for r in default_rules("mqtt", "in")]
    names_out = [r["name"] for r in default_rules("mqtt", "out")]
    assert names_in[0] == "mqtt.in.body" and len(names_in) == 12
    assert names_out[-2:] == ["mqtt.out.message-id", "mqtt.out.gw-types"] and len(names_out) == 12


def test_without_a_user_rule_the_fast_path_is_used() -> None:
    assert EMPTY.wire_for(T, protocol="mqtt", direction="in") is mqtt_to_message
    assert EMPTY.wire_for(T, protocol="mqtt", direction="out") is message_to_mqtt


@pytest.mark.parametrize("level", [3, 4])
def test_below_mqtt5_properties_are_not_read(level: int) -> None:
    msg = assert_same_in(b"x", 1, False, {"payload_format_indicator": 1,
                                          "user_property": [("a", "b")]}, level)
    assert msg.body_kind is BodyKind.BYTES and list(msg.properties) == ["JMS_GW_MQTT_QOS"]


def test_properties_named_like_the_gateways_own_render_alike() -> None:
    names_out = ["JMS_GW_MQTT_QOS", "JMS_GW_MQTT_RETAIN", "JMS_GW_CONTENT_TYPE", "JMS_GW_TRACE_ID",
                 "JMS_GW_MQTT_PFI", "JMS_GW_MQTT_USER_PROPERTIES", "gw-trace-id", "gw-types", "JMSType", "JMSPriority", "JMSMessageID", "n"]
    msg = Message("x", destination=T, properties={n: "v" for n in names_out})
    out = assert_same_out(msg, 5, NOW, None)
    assert [n for n, _ in out.properties["user_property"]] == [
        "JMSType", "JMSPriority", "JMSMessageID", "n"]
    assert_same_in(out.payload, out.qos, False, out.properties, 5)


@pytest.mark.parametrize("pfi", [None, 0, 1])
@pytest.mark.parametrize("content_type", [None, "text/plain"])
def test_an_mqtt5_publishers_indicator_and_user_properties_go_out_unaltered(
        pfi: int | None, content_type: str | None) -> None:
    """[MQTT-3.3.2-4], [MQTT-3.3.2-17], [MQTT-3.3.2-18]: in, then out, by both paths."""
    props: dict[str, Any] = {"user_property": [("b", "2"), ("a", "1"), ("b", "3"), ("", "e")]}
    if pfi is not None:
        props["payload_format_indicator"] = pfi
    if content_type is not None:
        props["content_type"] = content_type
    msg = assert_same_in(b"text", 1, False, props, 5)
    msg.message_id, msg.trace_id = "ID:gw.1", "gw.1"  # as the broker stamps them
    out = assert_same_out(msg, 5, NOW, None)
    assert out.properties.get("payload_format_indicator") == pfi
    assert out.properties["user_property"] == [("b", "2"), ("a", "1"), ("b", "3"), ("", "e")]


def test_rules_turn_the_message_id_off_and_the_trace_id_on() -> None:
    """mappings/README.md: each JMS header row is a rule a user rule can turn off, and the
    trace id goes to MQTT subscribers where a rule asks for it ("Trace ids on the wire")."""
    ms = MappingSet.from_text("""\
mappings:
  - name: no message ids
    replaces: mqtt.out.message-id
    match: {destination: "sensors.>"}
    steps: []
  - name: trace ids
    match: {protocol: mqtt, direction: out, destination: "sensors.>"}
    steps:
      - convert: {from: trace_id, to: wire.user.gw-trace-id, via: mqtt-text-out}
""")
    out_fn = ms.wire_for(T, protocol="mqtt", direction="out")
    msg = Message("x", destination=T, properties={"a": "1"}, message_id="ID:1", type="t")
    msg.trace_id = "tr\x00"
    assert message_to_mqtt(msg, level=5, now_ms=NOW, reply_topic=None).properties[
        "user_property"] == [("a", "1"), ("JMSType", "t"), ("JMSMessageID", "ID:1")]
    assert out_fn(msg, level=5, now_ms=NOW, reply_topic=None).properties["user_property"] == [
        ("a", "1"), ("JMSType", "t"), ("gw-types", "gw-trace-id:string:esc"),
        ("gw-trace-id", "tr%00")]


def test_recorded_user_properties_yield_to_a_changed_property() -> None:
    """The record of repeated user properties is sent only while the properties still agree
    with it: a property changed (or typed) since goes out as the property says."""
    props = {"user_property": [("a", "1"), ("a", "2"), ("b", "x")]}
    msg = assert_same_in(b"x", 1, False, props, 5)
    assert assert_same_out(msg, 5, NOW, None).properties["user_property"] == [
        ("a", "1"), ("a", "2"), ("b", "x")]
    msg.properties["b"] = "changed"
    assert assert_same_out(msg, 5, NOW, None).properties["user_property"] == [
        ("a", "1"), ("b", "changed")]
    msg.properties["b"] = Int32(5)
    assert assert_same_out(msg, 5, NOW, None).properties["user_property"] == [
        ("a", "1"), ("b", "5"), ("gw-types", "b:int32")]
    msg.properties["b"] = "x"
    msg.properties["JMS_GW_MQTT_USER_PROPERTIES"] = "not json"
    assert assert_same_out(msg, 5, NOW, None).properties["user_property"] == [
        ("a", "1"), ("b", "x")]
