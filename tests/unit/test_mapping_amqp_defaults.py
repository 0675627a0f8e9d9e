"""The default AMQP 1.0 mapping rules (mappings/defaults/amqp.yaml) against the fast path.

The rules run by the engine (``MappingSet().wire_for(..., fast=False)``) and the hand-written
``amqp_to_message`` / ``message_to_amqp`` must give the same answer for every input: the same
core message field by field (every value with its exact type, properties in the same order,
the types record byte for byte), the same AMQP message (compared by its encoding, byte for
byte: every section, field, annotation and value with its AMQP type and in the same order),
and the same error for what is refused. Inputs are drawn by hypothesis: AMQP messages with
every header and properties field, annotations (the ones the mapping reads, with right and
wrong types, and any other, with symbol and ulong keys), delivery annotations, application
properties and bodies of every AMQP type (arrays, maps with any keys, lists, described values,
decimals, chars, timestamps, uuids) in every body section; and core messages of every body
kind and property type, with the properties that have AMQP fields of their own, fed back in
after a core → AMQP hop (so with types records).
"""

from __future__ import annotations

from typing import Any

import cproton
import proton
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proton import byte, symbol, timestamp, ubyte, uint, ulong
from strategies import any_text, message_differences, messages, same_value
from test_mapping_amqp import _SCALARS, amqp_values

from gateway.message import QUEUE, TOPIC, BodyKind, DeliveryMode, Destination, Message
from gateway.types import Int32, Int64, UInt8
from mappings.amqp import TYPES_PROPERTY, amqp_to_message, message_to_amqp
from mappings.engine import MappingSet
from mappings.rows import is_fast, why_not_fast
from mappings.rules import default_rules

# The fast path is the default mapping only while the rows are the ones it is written for
# (mappings/rows.py); when a row changes, the engine runs the rows and these comparisons wait
# for the fast path to follow, saying so.
pytestmark = pytest.mark.skipif(
    not (is_fast("amqp", "in") and is_fast("amqp", "out")),
    reason=f"the amqp fast path is off: {why_not_fast('amqp', 'in') or why_not_fast('amqp', 'out')}")

Q = Destination.queue("orders")
NOW = 1_700_000_000_000
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

EMPTY = MappingSet()
RULES_IN = EMPTY.wire_for(Q, protocol="amqp", direction="in", fast=False)
RULES_OUT = EMPTY.wire_for(Q, protocol="amqp", direction="out", fast=False)


def received(pm: proton.Message) -> proton.Message:
    """``pm`` as the adapter has it: encoded, then decoded into a fresh Message."""
    out = proton.Message()
    out.decode(pm.encode())
    return out


def both_in(pm: proton.Message, default_kind: Any = QUEUE) -> tuple[Any, Any]:
    """(fast, rules): each a Message or the (type, text) of what it raised."""
    results = []
    for fn in (amqp_to_message, RULES_IN):
        try:
            results.append(fn(received(pm), destination=Q, default_kind=default_kind,
                              now_ms=NOW))
        except Exception as exc:  # noqa: BLE001 - the error is part of the answer
            results.append((type(exc), str(exc)))
    return results[0], results[1]


def assert_same_in(pm: proton.Message, default_kind: Any = QUEUE) -> Any:
    fast, rules = both_in(pm, default_kind)
    if isinstance(fast, Message) and isinstance(rules, Message):
        assert message_differences(fast, rules) == []
        assert same_value(list(fast.properties.items()), list(rules.properties.items()))
        assert type(rules) is Message and rules.size == fast.size
        assert rules.expires_at == fast.expires_at == 0
    else:
        assert fast == rules
    return fast


def assert_same_out(msg: Message, count: int = 1, now: int = NOW) -> bytes:
    fast = message_to_amqp(msg, delivery_count=count, now_ms=now).encode()
    rules = RULES_OUT(msg, delivery_count=count, now_ms=now).encode()
    assert rules == fast
    return fast  # type: ignore[no-any-return]


def decoded(data: bytes) -> proton.Message:
    pm = proton.Message()
    pm.decode(data)
    return pm


# -- AMQP messages -------------------------------------------------------------------------------

_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=12)
_ascii = st.text(st.characters(max_codepoint=127, exclude_characters="\x00"), max_size=12)
_ids = st.one_of(_text, _text.map(lambda t: "ID:AMQP_" + t),
                 st.sampled_from(["ID:AMQP_ULONG:5", "ID:AMQP_UUID:x", "ID:AMQP_STRING:ID:AMQP_ULONG:1"]),
                 st.integers(0, 2**64 - 1).map(ulong), st.uuids(), st.binary(max_size=8))  # fmt: skip
_addresses = st.one_of(_text, st.sampled_from(["", "queue://", "topic://", "queue://a.b",
                                               "topic://t", "$TMP$.x", "x%00y"]))  # fmt: skip
_times = st.integers(-(2**62), 2**62)  # AMQP timestamps are signed
_hints = st.one_of(st.integers(-1, 4).map(byte), st.sampled_from([True, "1", ubyte(1)]))
_any = amqp_values()
_special_annotations: dict[Any, st.SearchStrategy[Any]] = {
    symbol("x-opt-jms-msg-type"): st.integers(-1, 6).map(byte) | _any,
    symbol("x-opt-jms-dest"): _hints,
    symbol("x-opt-jms-reply-to"): _hints,
    symbol("x-opt-delivery-time"): st.one_of(_times, _times.map(timestamp), _any),
    symbol("x-opt-delivery-delay"): st.one_of(st.integers(0, 10**6), _any),
    symbol("x-opt-gw-trace-id"): st.one_of(_text, _any),
    symbol("x-opt-gw-delivery-mode"): st.one_of(st.just(symbol("RELIABLE")), _any),
}
_annotation_keys = st.one_of(_ascii.map(symbol), st.integers(0, 99).map(ulong))


@st.composite
def annotations(draw: st.DrawFn, special: bool) -> dict[Any, Any]:
    ann: dict[Any, Any] = {}
    for key, values in _special_annotations.items() if special else ():
        if draw(st.booleans()):
            ann[key] = draw(values)
    for key in draw(st.lists(_annotation_keys, max_size=3)):
        ann[key] = draw(_any)
    keys = list(ann)
    order = draw(st.permutations(keys))
    return {k: ann[k] for k in order}


_app_names = st.one_of(_text, st.sampled_from([
    "JMSXUserID", "JMSXGroupID", "JMS_GW_CONTENT_TYPE", "JMS_GW_AMQP_MA_x", TYPES_PROPERTY, "",
    "JMS_GW_AMQP_PRIORITY", "JMS_GW_AMQP_REPLY_TO"]))  # fmt: skip


@st.composite
def bodies(draw: st.DrawFn) -> tuple[Any, bool]:
    section = draw(st.sampled_from(["none", "data", "value", "sequence"]))
    if section == "none":
        return None, False
    if section == "data":
        data = draw(st.binary(max_size=16) | _text.map(lambda t: t.encode()))
        return data, True
    if section == "sequence":
        return draw(st.lists(_any, max_size=4)), True
    return draw(_any | _text | st.binary(max_size=8) | map_of_strings()), False


def map_of_strings() -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(_text, _any, max_size=4)


@st.composite
def amqp_messages(draw: st.DrawFn) -> proton.Message:
    body, inferred = draw(bodies())
    pm = proton.Message(body=body)
    pm.inferred = inferred
    raw = pm._msg
    maybe = draw(st.lists(st.booleans(), min_size=20, max_size=20))
    if maybe[0]:
        pm.durable = draw(st.booleans())
    if maybe[1]:
        pm.priority = draw(st.integers(0, 255))
    if maybe[2]:
        cproton.pn_message_set_ttl(raw, draw(st.integers(0, 2**32 - 1)))
    if maybe[3]:
        pm.first_acquirer = draw(st.booleans())
        pm.delivery_count = draw(st.integers(0, 2**32 - 1))
    if maybe[4]:
        pm.id = draw(_ids)
    if maybe[5]:
        pm.user_id = draw(st.binary(max_size=8) | _text.map(lambda t: t.encode()))
    if maybe[6]:
        pm.address = draw(_addresses)
    if maybe[7]:
        pm.subject = draw(_text | st.just("a%00b"))
    if maybe[8]:
        pm.reply_to = draw(_addresses)
    if maybe[9]:
        pm.correlation_id = draw(_ids)
    if maybe[10]:
        cproton.pn_message_set_content_type(raw, draw(st.sampled_from([
            "text/plain", "application/json", "application/x-java-serialized-object",
            "application/octet-stream", "x;charset=utf-8"]) | _ascii))  # fmt: skip
    if maybe[11]:
        cproton.pn_message_set_content_encoding(raw, draw(_ascii))
    if maybe[12]:
        cproton.pn_message_set_expiry_time(raw, draw(_times))
    if maybe[13]:
        cproton.pn_message_set_creation_time(raw, draw(_times))
    if maybe[14]:
        pm.group_id = draw(_text)
    if maybe[15]:
        cproton.pn_message_set_group_sequence(raw, draw(st.integers(0, 2**32 - 1)))
    if maybe[16]:
        pm.reply_to_group_id = draw(_text)
    if maybe[17]:
        pm.annotations = draw(annotations(True))
    if maybe[18]:
        pm.instructions = draw(annotations(False))
    if maybe[19]:
        pm.properties = draw(st.dictionaries(_app_names, _any | _text, max_size=5))
    return pm


@SETTINGS
@given(amqp_messages(), st.sampled_from([QUEUE, TOPIC]))
def test_any_amqp_message_maps_alike(pm: proton.Message, default_kind: Any) -> None:
    assert_same_in(pm, default_kind)


@SETTINGS
@given(amqp_messages(), st.integers(1, 4))
def test_any_amqp_message_maps_alike_in_and_back_out(pm: proton.Message, count: int) -> None:
    fast = assert_same_in(pm)
    if isinstance(fast, Message):
        assert_same_out(fast, count)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(list(_SCALARS)).flatmap(lambda c: _SCALARS[c]), amqp_values())
def test_every_amqp_type_as_a_property_annotation_and_body_maps_alike(scalar: Any,
                                                                     value: Any) -> None:
    for body, inferred in ((value, False), ([value, scalar], True)):
        pm = proton.Message(body=body)
        pm.inferred = inferred
        pm.properties = {"s": scalar, "v": value}
        pm.annotations = {symbol("x-a"): value, ulong(7): scalar}
        pm.instructions = {symbol("x-d"): scalar}
        fast = assert_same_in(pm)
        assert_same_out(fast)


# -- core messages ------------------------------------------------------------------------------

_special_values = st.one_of(any_text, st.binary(max_size=4), st.integers(-3, 3).map(Int32),
                            st.sampled_from([UInt8(200), UInt8(7), Int64(5), 0, None, ""]))
_special_props = st.dictionaries(st.sampled_from([
    "JMSXUserID", "JMSXGroupID", "JMSXGroupSeq", "JMS_GW_CONTENT_TYPE",
    "JMS_GW_AMQP_CONTENT_ENCODING", "JMS_GW_AMQP_REPLY_TO_GROUP_ID", "JMS_GW_AMQP_REPLY_TO",
    "JMS_GW_AMQP_PRIORITY", TYPES_PROPERTY, "JMS_GW_AMQP_MA_x-a", "JMS_GW_AMQP_DA_7",
    "JMS_GW_AMQP_MA_x-opt-jms-msg-type", "JMS_GW_AMQP_MA_\u00e9"]), _special_values, max_size=5)


@SETTINGS
@given(messages(), _special_props, st.integers(1, 4),
       st.integers(NOW - 10**6, NOW + 10**6))
def test_any_core_message_maps_alike_out_and_back(msg: Message, special: dict[str, Any],
                                                  count: int, now: int) -> None:
    for name, value in special.items():
        msg.properties.setdefault(name, value)
    data = assert_same_out(msg, count, now)
    assert_same_in(decoded(data))


def test_a_map_body_with_recorded_types_maps_alike_both_ways() -> None:
    pm = proton.Message(body={"at": timestamp(5), "ids": [proton.char("\U0001f600")]},
                        properties={"n": ulong(3), "t": timestamp(NOW)})
    msg = assert_same_in(pm)
    assert msg.body_kind is BodyKind.MAP
    assert msg.properties[TYPES_PROPERTY] == ('[["t","timestamp"],[0,"at","timestamp"],'
                                              '[0,"ids",0,"char"]]')
    assert decoded(assert_same_out(msg)).body == pm.body


def test_a_qpid_jms_text_message_maps_alike() -> None:
    pm = proton.Message(body="hello", id="ID:1", address="queue://orders", durable=True,
                        properties={"a": "x", "n": proton.int32(3)}, subject="t")
    pm.annotations = {symbol("x-opt-jms-msg-type"): byte(5), symbol("x-opt-jms-dest"): byte(0),
                      symbol("x-opt-gw-trace-id"): "tr", symbol("x-k"): uint(1)}
    msg = assert_same_in(pm)
    assert (msg.body, msg.type, msg.trace_id, msg.message_id) == ("hello", "t", "tr", "ID:1")
    assert list(msg.properties) == ["a", "n", "JMS_GW_AMQP_MA_x-k"]
    assert msg.delivery_mode is DeliveryMode.PERSISTENT
    out = decoded(assert_same_out(msg))
    assert out.annotations[symbol("x-k")] == 1 and out.address == "queue://orders"


def test_a_refused_reply_to_is_kept_alike() -> None:
    pm = proton.Message(body=b"x", reply_to="topic://")
    msg = assert_same_in(pm)
    assert msg.reply_to is None and msg.properties["JMS_GW_AMQP_REPLY_TO"] == "topic://"


def test_a_value_the_core_cannot_hold_is_the_same_error() -> None:
    msg = Message({"s": {1, 2}}, body_kind=BodyKind.MAP, destination=Q)
    fast = rules = None
    try:
        message_to_amqp(msg, delivery_count=1, now_ms=NOW)
    except TypeError as exc:
        fast = (type(exc), str(exc))
    try:
        RULES_OUT(msg, delivery_count=1, now_ms=NOW)
    except TypeError as exc:
        rules = (type(exc), str(exc))
    assert fast == rules == (TypeError, "cannot map a set value to AMQP")


def test_the_rules_are_one_per_row_in_order() -> None:
    names_in = [r["name"] for r in default_rules("amqp", "in")]
    names_out = [r["name"] for r in default_rules("amqp", "out")]
    assert names_in[:2] == ["amqp.in.application-properties", "amqp.in.body"]
    assert names_in[-1] == "amqp.in.types" and len(names_in) == 21
    assert names_out[:2] == ["amqp.out.application-properties", "amqp.out.body"]
    assert names_out[-1] == "amqp.out.types" and len(names_out) == 23


def test_without_a_user_rule_the_fast_path_is_used() -> None:
    assert EMPTY.wire_for(Q, protocol="amqp", direction="in") is amqp_to_message
    assert EMPTY.wire_for(Q, protocol="amqp", direction="out") is message_to_amqp
    core_only = MappingSet.from_text(
        "mappings:\n  - match: {destination: '>', direction: both, protocol: amqp}\n"
        "    steps:\n      - set: {field: property.x, value: 1}\n")
    assert core_only.wire_for(Q, protocol="amqp", direction="in") is amqp_to_message
    assert core_only.wire_for(Q, protocol="amqp", direction="out") is message_to_amqp


def test_map_bodies_with_every_core_type_map_alike() -> None:
    body = {"a": [Int32(1), None, {"b": b"\x00"}], "c": "\ud800", "d": Int64(9)}
    msg = Message.map(body, destination=Q, properties={"p": Int64(1)})
    back = assert_same_in(decoded(assert_same_out(msg)))
    assert same_value(back.body, body)
