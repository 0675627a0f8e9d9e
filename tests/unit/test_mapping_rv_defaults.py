"""The default RV mapping rules (mappings/defaults/rv.yaml) against the fast path.

The rules run by the engine (``MappingSet().wire_for(..., fast=False)``) and the hand-written
``rv_to_message`` / ``message_to_rv`` must give the same answer for every input: the same core
message field by field (every value with its exact type, nested maps and streams), the same
RV message (fields, names, types, values, order and envelope), and the same error when a
message cannot be sent. Inputs are drawn by hypothesis: core messages of every body kind and
property type, and RV messages of every field type with the names the mapping reads
(``JMSHeaders``, ``JMSProperties``, the body fields) holding values of any type, and
certified-delivery labels. A user rule can replace or extend each default rule.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rv.rvgen import field_types, names, top_messages, value_of
from strategies import message_differences, messages

from gateway.message import BodyKind, DeliveryMode, Destination, Message
from gateway.types import Int16
from mappings.engine import MappingFailed, MappingSet
from mappings.rules import default_rules
from mappings.rv import message_to_rv, rv_to_message
from transports.rv import CmLabel, RvDateTime, RvType
from transports.rv import Message as RvMessage

T = Destination.topic("plant.a")
NOW = 1_700_000_000_000
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

EMPTY = MappingSet()
RULES_IN = EMPTY.wire_for(T, protocol="rv", direction="in", fast=False)
RULES_OUT = EMPTY.wire_for(T, protocol="rv", direction="out", fast=False)


def assert_same_in(rv: RvMessage, mode: DeliveryMode = DeliveryMode.NON_PERSISTENT,
                   reply_to: Destination | None = None) -> Message:
    kw: dict[str, Any] = {"destination": T, "reply_to": reply_to, "delivery_mode": mode,
                          "now_ms": NOW}
    fast = rv_to_message(rv, **kw)
    rules = RULES_IN(rv, **kw)
    assert message_differences(fast, rules) == []
    assert type(rules) is Message and rules.expires_at == 0
    return fast


def assert_same_out(msg: Message, headers: bool = True, properties: bool = True) -> Any:
    results = []
    for fn in (message_to_rv, RULES_OUT):
        try:
            results.append(fn(msg, send_subject="plant.a", reply_subject="_INBOX.x",
                              export_headers=headers, export_properties=properties))
        except Exception as exc:  # noqa: BLE001 - the error is part of the answer
            results.append((type(exc), str(exc)))
    assert results[0] == results[1]
    return results[0]


_jms_names = st.sampled_from(["JMSHeaders", "JMSProperties", "JMSText", "JMSBytes", "JMSStream",
                              "JMSObject"])
_header_names = st.sampled_from(["JMSDeliveryMode", "JMSDeliveryTime", "JMSPriority",
                                 "JMSTimestamp", "JMSExpiration", "JMSType", "JMSMessageID",
                                 "JMSCorrelationID", "JMSRedelivered"])


@st.composite
def submessages(draw: st.DrawFn, field_names: st.SearchStrategy[str]) -> RvMessage:
    m = RvMessage()
    for _ in range(draw(st.integers(0, 6))):
        t = draw(field_types)
        m.add(draw(field_names | names), draw(value_of(t, 2)), t, internal=True)
    return m


@st.composite
def rv_messages(draw: st.DrawFn) -> RvMessage:
    """An RV message with the fields the mapping reads, of any type, among others."""
    m = draw(top_messages())
    for _ in range(draw(st.integers(0, 4))):
        name = draw(_jms_names)
        if draw(st.booleans()):
            inner = _header_names if name == "JMSHeaders" else names
            m.add(name, draw(submessages(inner)), RvType.MSG)
        else:
            t = draw(field_types)
            m.add(name, draw(value_of(t, 2)), t, internal=True)
        fields = m.fields
        fields.insert(draw(st.integers(0, len(fields) - 1)), fields.pop())
    return m


@SETTINGS
@given(rv_messages(), st.sampled_from(list(DeliveryMode)))
def test_any_rv_message_maps_alike(rv: RvMessage, mode: DeliveryMode) -> None:
    assert_same_in(rv, mode, Destination.topic("r"))


@SETTINGS
@given(messages(), st.booleans(), st.booleans())
def test_any_message_maps_alike_out_and_back(msg: Message, headers: bool,
                                             properties: bool) -> None:
    rv = assert_same_out(msg, headers, properties)
    if isinstance(rv, RvMessage):
        assert_same_in(rv)


def test_a_header_of_zero_and_a_certified_label_map_alike() -> None:
    rv = RvMessage().add("JMSHeaders", RvMessage().add("JMSExpiration", 0, RvType.U64)
                         .add("JMSTimestamp", NOW - 5, RvType.U64))
    rv.cm = CmLabel("p", 2**64 - 1, 1.5)
    m = assert_same_in(rv)
    assert m.expiration == NOW - 5 + 1500


def test_the_rules_are_one_per_row_in_order() -> None:
    assert [r["name"] for r in default_rules("rv", "in")] == [
        "rv.in.body", "rv.in.delivery-mode", "rv.in.timestamp", "rv.in.headers",
        "rv.in.cm-expiry", "rv.in.properties", "rv.in.msg-ext", "rv.in.cm"]
    assert [r["name"] for r in default_rules("rv", "out")] == [
        "rv.out.headers", "rv.out.properties", "rv.out.body"]


def test_without_a_user_rule_the_fast_path_is_used() -> None:
    assert EMPTY.wire_for(T, protocol="rv", direction="in") is rv_to_message
    assert EMPTY.wire_for(T, protocol="rv", direction="out") is message_to_rv


USER_RULES = """\
mappings:
  - name: EMS's own import
    replaces: rv.in.headers
    match: {destination: "plant.>"}
    steps: []
  - name: a field of the bus as a property
    extends: rv.in.properties
    match: {destination: "plant.>"}
    steps:
      - copy: {from: wire.field.station, to: property.station}
  - name: no headers submessage
    replaces: rv.out.headers
    match: {destination: "plant.>"}
    steps: []
  - name: the source on the bus
    match: {protocol: rv, direction: out, destination: "plant.>"}
    steps:
      - set: {field: wire.field.source, value: 7, type: int16}
"""


def test_user_rules_replace_and_extend_the_defaults_on_both_sides() -> None:
    ms = MappingSet.from_text(USER_RULES)
    rv_in = ms.wire_for(T, protocol="rv", direction="in")
    rv_out = ms.wire_for(T, protocol="rv", direction="out")
    assert rv_in is not rv_to_message and rv_out is not message_to_rv
    src = RvMessage().add("JMSHeaders", RvMessage().add("JMSType", "t"))
    src.add("station", 12, RvType.U8)
    m = rv_in(src, destination=T, reply_to=None, now_ms=NOW)
    assert m.type is None and m.body == {"station": 12}
    assert m.properties == {"station": Int16(12), "JMS_GW_MSG_EXT": True}
    assert type(m.properties["station"]) is Int16
    rv = rv_out(Message("x", properties={"p": 1}), send_subject="plant.a", reply_subject=None)
    assert rv.names() == ["JMSProperties", "JMSText", "source"]
    f = rv.get_field("source")
    assert f is not None and (f.type, f.value) == (RvType.I16, 7)
    # elsewhere the defaults are unchanged
    other = Destination.topic("other")
    assert ms.wire_for(other, protocol="rv", direction="out") is message_to_rv


def test_copy_all_reads_the_bus_fields_and_writes_them() -> None:
    ms = MappingSet.from_text("""\
mappings:
  - name: every field a property too
    match: {protocol: rv, direction: in, destination: ">"}
    steps:
      - copy_all: {from: wire.field, to: property, except: [JMSHeaders, blob]}
  - name: properties as top-level fields
    match: {protocol: rv, direction: out, destination: ">"}
    steps:
      - copy_all: {from: property, to: wire.field}
""")
    src = RvMessage().add("a", 1, RvType.U16).add("JMSHeaders", RvMessage()).add("b", "x")
    m = ms.wire_for(T, protocol="rv", direction="in")(src, destination=T, reply_to=None,
                                                      now_ms=NOW)
    assert m.properties == {"JMS_GW_MSG_EXT": True, "a": 1, "b": "x"}
    rv = ms.wire_for(T, protocol="rv", direction="out")(
        Message(None, properties={"k": Int16(3)}), send_subject="s", reply_subject=None)
    assert rv.names() == ["JMSHeaders", "JMSProperties", "k"]
    f = rv.get_field("k")
    assert f is not None and f.type == RvType.I16


@pytest.mark.parametrize("path", ["wire.field.x", "wire.message", "wire.import_dm"])
def test_the_received_message_is_read_only(path: str) -> None:
    with pytest.raises(Exception, match="read-only"):
        MappingSet.from_text(f"""\
mappings:
  - name: bad
    match: {{protocol: rv, direction: in, destination: ">"}}
    steps:
      - set: {{field: {path}, value: 1}}
""")


def test_a_body_written_by_a_rule_goes_out_as_its_fields() -> None:
    ms = MappingSet.from_text("""\
mappings:
  - name: a map body on the bus as its text
    replaces: rv.out.body
    match: {destination: ">"}
    steps:
      - encode_json: {}
      - copy: {from: body, to: wire.body}
""")
    rv = ms.wire_for(T, protocol="rv", direction="out")(
        Message.map({"a": 1}), send_subject="s", reply_subject=None, export_headers=False)
    assert rv.names() == ["JMSText"] and rv["JMSText"] == '{"a":1}'
    assert BodyKind.TEXT is rv_to_message(rv, destination=T, reply_to=None,
                                          now_ms=NOW).body_kind


def test_a_datetime_as_a_date_both_ways() -> None:
    """EMS imports a DATETIME as a long (ms); a rule may take it as a date instead, and send
    a date or a long as a DATETIME (which EMS never exports)."""
    ms = MappingSet.from_text("""\
mappings:
  - name: the reading time as a date
    extends: rv.in.body
    match: {destination: "plant.>"}
    steps:
      - copy: {from: wire.datetime.at, to: body.at}
  - name: times as DATETIME
    extends: rv.out.body
    match: {destination: "plant.>"}
    steps:
      - copy: {from: body.at, to: wire.datetime.at}
      - copy: {from: property.since, to: wire.datetime.since}
""")
    src = RvMessage().add("at", RvDateTime(1_700_000_000, 250_000)).add("v", 1)
    m = ms.wire_for(T, protocol="rv", direction="in")(src, destination=T, reply_to=None,
                                                      now_ms=NOW)
    assert m.body == {"at": "2023-11-14T22:13:20.250000Z", "v": 1}
    assert rv_to_message(src, destination=T, reply_to=None,
                         now_ms=NOW).body == {"at": 1_700_000_000_250, "v": 1}
    rv = ms.wire_for(T, protocol="rv", direction="out")(
        Message.map({"v": 1, "at": "2023-11-14T22:13:20.25+00:00"},
                    properties={"since": -1500}),
        send_subject="s", reply_subject=None, export_headers=False, export_properties=False)
    assert rv.names() == ["v", "at", "since"]
    assert [(f.type, f.value) for f in rv.fields[1:]] == [
        (RvType.DATETIME, RvDateTime(1_700_000_000, 250_000)),
        (RvType.DATETIME, RvDateTime(-2, 500_000))]


def test_a_date_that_is_not_one_fails_the_rule() -> None:
    ms = MappingSet.from_text("""\
mappings:
  - name: d
    match: {protocol: rv, direction: out, destination: ">"}
    steps:
      - set: {field: wire.datetime.at, value: "yesterday"}
""")
    with pytest.raises(MappingFailed, match="ISO 8601"):
        ms.wire_for(T, protocol="rv", direction="out")(
            Message("x"), send_subject="s", reply_subject=None)
