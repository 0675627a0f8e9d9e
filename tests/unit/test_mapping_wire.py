"""User rules on the wire side (mappings/README.md, "Overriding the defaults"): rules that
replace or extend a default rule, or address wire fields, per destination and per transport,
and the errors of such files."""

from __future__ import annotations

from typing import Any

import cproton
import proton
import pytest

from gateway.errors import ConfigErrors, MessageFormatError
from gateway.message import QUEUE, BodyKind, DeliveryMode, Destination, Message
from gateway.types import Int32, UInt8
from mappings.amqp import amqp_to_message
from mappings.engine import MappingFailed, MappingSet
from mappings.stomp import message_to_stomp, stomp_to_message

PLANT = Destination.queue("plant.line1")
OTHER = Destination.queue("office")
NOW = 1_700_000_000_000


def rules(text: str) -> MappingSet:
    return MappingSet.from_text(text, "m.yaml")


def send(ms: MappingSet, headers: dict[str, str], body: bytes = b"x", dest: Destination = PLANT,
         transport: str | None = None) -> Message:
    fn = ms.wire_for(dest, protocol="stomp", direction="in", transport=transport)
    msg: Message = fn(headers, body, has_length=False, destination=dest, reply_to=None,
                      now_ms=NOW)
    return msg


def deliver(ms: MappingSet, msg: Message, transport: str | None = None) -> dict[str, str]:
    assert msg.destination is not None
    fn = ms.wire_for(msg.destination, protocol="stomp", direction="out", transport=transport)
    headers, _ = fn(msg, destination="/queue/x", reply_to=None)
    assert len({n for n, _ in headers}) == len(headers), headers
    return dict(headers)


# -- replacing and extending a default rule ------------------------------------------------------

LENIENT_PRIORITY = """\
mappings:
  - name: lenient priority
    replaces: stomp.in.priority
    match: {destination: "plant.>"}
    steps:
      - copy: {from: wire.header.priority, to: header.JMSPriority}
"""


def test_a_replaced_rule_runs_instead_of_the_default_for_its_destinations_only() -> None:
    ms = rules(LENIENT_PRIORITY)
    assert send(ms, {"priority": "07"}).priority == 7  # the default refuses "07"
    with pytest.raises(MessageFormatError, match="priority must be a digit"):
        send(ms, {"priority": "07"}, dest=OTHER)
    assert ms.wire_for(OTHER, protocol="stomp", direction="in") is stomp_to_message


def test_a_replacing_rule_fails_as_a_mapping_and_the_defaults_fail_as_before() -> None:
    ms = rules(LENIENT_PRIORITY)
    with pytest.raises(MappingFailed, match=r"'lenient priority' \(m.yaml:6\) copy "
                                            r"wire.header.priority -> header.JMSPriority"):
        send(ms, {"priority": "12"})
    with pytest.raises(MessageFormatError, match="expires must be"):
        send(ms, {"expires": "soon"})


def test_an_empty_replacement_removes_the_row() -> None:
    ms = rules("""\
mappings:
  - replaces: stomp.in.properties
    match: {destination: ">"}
    steps: []
""")
    msg = send(ms, {"a": "1", "content-type": "text/x", "type": "t"})
    assert msg.properties == {"JMS_GW_CONTENT_TYPE": "text/x"} and msg.type == "t"


def test_an_extension_runs_right_after_its_rule() -> None:
    ms = rules("""\
mappings:
  - name: device as JMSType
    extends: stomp.in.type
    match: {destination: "plant.>"}
    steps:
      - copy: {from: wire.header.x-device, to: header.JMSType}
      - drop: [property.x-device]
""")
    msg = send(ms, {"x-device": "press-4", "type": "ignored", "n": "1"})
    assert msg.type == "press-4" and msg.properties == {"n": "1"}
    # gw-types (a later default rule) still applies to what the extension wrote:
    msg = send(ms, {"x-device": "a%00b", "gw-types": "type:string:esc"})
    assert msg.type == "a\x00b"


def test_a_rule_for_one_transport_leaves_the_adapter_and_other_transports_alone() -> None:
    ms = rules("""\
mappings:
  - name: content type from a property, for far
    match: {destination: ">", direction: out, protocol: stomp, transport: far}
    steps:
      - copy: {from: property.kind, to: wire.header.content-type}
""")
    msg = Message(b"\x01", destination=PLANT, properties={"kind": "application/cbor"})
    assert deliver(ms, msg, transport="far")["content-type"] == "application/cbor"
    assert "content-type" not in deliver(ms, msg)
    assert "content-type" not in deliver(ms, msg, transport="near")
    assert ms.wire_for(PLANT, protocol="stomp", direction="out") is message_to_stomp
    # it runs after the defaults: the header the default wrote is replaced in place
    msg.properties["JMS_GW_CONTENT_TYPE"] = "application/octet-stream"
    headers = list(deliver(ms, msg, transport="far").items())
    assert headers[1] == ("content-type", "application/cbor")


def test_out_rules_see_the_core_message_and_may_rewrite_any_header() -> None:
    ms = rules("""\
mappings:
  - name: priority as text
    replaces: stomp.out.priority
    match: {destination: ">"}
    steps:
      - convert: {from: header.JMSPriority, to: wire.header.x-priority, via: ms-text}
  - name: no persistent header
    match: {destination: ">", protocol: stomp, direction: out}
    steps:
      - drop: [wire.header.persistent]
  - name: a body field lifted on the way
    extends: stomp.out.body
    match: {destination: ">"}
    steps:
      - set: {field: body.seen, value: true}
      - copy: {from: body.seen, to: wire.header.seen, type: string}
""")
    shared = {"a": Int32(1)}
    msg = Message(shared, destination=PLANT, priority=6, delivery_mode=DeliveryMode.PERSISTENT)
    headers = deliver(ms, msg)
    assert headers["x-priority"] == "6" and "priority" not in headers
    assert "persistent" not in headers and headers["seen"] == "true"
    assert shared == {"a": 1} and msg.body is shared  # the delivered message is untouched


def test_answers_are_cached_per_destination_and_transport() -> None:
    ms = rules(LENIENT_PRIORITY)
    a = ms.wire_for(PLANT, protocol="stomp", direction="in")
    assert ms.wire_for(PLANT, protocol="stomp", direction="in") is a
    assert ms.wire_for(PLANT, protocol="stomp", direction="in", transport="t") is not a


def test_wire_rules_are_not_core_rules() -> None:
    ms = rules(LENIENT_PRIORITY + """\
  - name: tag
    match: {destination: ">", direction: in}
    steps:
      - set: {field: property.tag, value: 1}
""")
    assert ms.compile_for(PLANT, protocol="stomp", direction="in") is not None
    msg = send(ms, {"priority": "07"})
    assert "tag" not in msg.properties  # the caller applies compile_for's function after
    assert ms.apply(msg, protocol="stomp", direction="in").properties["tag"] == 1
    assert [r.get("replaces") for r in ms.rules()] == ["stomp.in.priority", None]


def test_the_new_fields_and_steps_work_on_core_messages_too() -> None:
    ms = rules("""\
mappings:
  - match: {destination: ">", direction: in}
    steps:
      - copy: {from: trace_id, to: property.trace}
      - copy: {from: body_kind, to: property.kind}
      - copy: {from: expiry, to: property.until}
      - set: {field: trace_id, value: abc}
""")
    msg = Message("t", destination=PLANT, expiration=NOW)
    msg.trace_id = "old"
    out = ms.apply(msg, protocol="mqtt", direction="in")
    assert out.properties == {"trace": "old", "kind": "TEXT", "until": NOW}
    assert out.trace_id == "abc" and msg.trace_id == "old" and out.body_kind is BodyKind.TEXT


# -- errors ---------------------------------------------------------------------------------------


def errors(text: str) -> list[str]:
    with pytest.raises(ConfigErrors) as info:
        rules(text)
    return [str(e) for e in info.value.errors]


@pytest.mark.parametrize(("text", "expected"), [
    ("mappings:\n  - replaces: stomp.in.prio\n    match: {destination: '>'}\n    steps: []\n",
     "m.yaml:2: mappings[0].replaces: unknown default rule 'stomp.in.prio'"),
    ("mappings:\n  - replaces: stomp.in.type\n    extends: stomp.in.type\n"
     "    match: {destination: '>'}\n    steps: []\n",
     "m.yaml:3: mappings[0].extends: a rule replaces or extends, not both"),
    ("mappings:\n  - replaces: stomp.in.type\n    match: {destination: '>', direction: out}\n"
     "    steps: []\n",
     "m.yaml:3: mappings[0].match.direction: must be in (that of stomp.in.type) or left out"),
    ("mappings:\n  - replaces: stomp.in.type\n    match: {destination: '>', protocol: mqtt}\n"
     "    steps: []\n",
     "m.yaml:3: mappings[0].match.protocol: must be stomp (that of stomp.in.type) or left out"),
    ("mappings:\n  - extends: stomp.in.type\n    match: {destination: '>'}\n    steps: []\n",
     "m.yaml:4: mappings[0].steps: must be a list of one or more steps (or [] with replaces)"),
    ("mappings:\n  - match: {destination: '>', direction: in}\n    steps:\n"
     "      - copy: {from: wire.header.a, to: property.a}\n",
     "m.yaml:4: mappings[0].steps[0].copy.from: bad field 'wire.header.a': a wire field needs "
     "one protocol with a wire form"),
    ("mappings:\n  - match: {destination: '>', direction: both, protocol: stomp}\n    steps:\n"
     "      - copy: {from: wire.body, to: property.a}\n",
     "m.yaml:4: mappings[0].steps[0].copy.from: bad field 'wire.body': a wire field needs"),
    ("mappings:\n  - match: {destination: '>', direction: in, protocol: stomp}\n    steps:\n"
     "      - set: {field: wire.header.a, value: x}\n",
     "m.yaml:4: mappings[0].steps[0].set.field: wire.header.a is read-only: the wire form of "
     "an incoming message is what was received"),
    ("mappings:\n  - match: {destination: '>', direction: out, protocol: stomp}\n    steps:\n"
     "      - copy: {from: wire.frame, to: property.a}\n",
     "m.yaml:4: mappings[0].steps[0].copy.from: bad field 'wire.frame': a STOMP frame sent has"),
    ("mappings:\n  - match: {destination: '>', direction: out, protocol: stomp}\n    steps:\n"
     "      - convert: {from: body, to: wire.body, via: rot13}\n",
     "m.yaml:4: mappings[0].steps[0].convert.via: unknown converter 'rot13' (one of "),
    ("mappings:\n  - match: {destination: '>', direction: out, protocol: stomp}\n    steps:\n"
     "      - convert: {from: body, to: wire.body, via: stomp-body-out}\n",
     "m.yaml:4: mappings[0].steps[0].convert.via: stomp-body-out reads 3 and writes 3 fields, "
     "not 1 and 1"),
    ("mappings:\n  - match: {destination: '>', direction: out, protocol: stomp}\n    steps:\n"
     "      - copy: {from: wire.destination, to: wire.reply_to}\n",
     "m.yaml:4: mappings[0].steps[0].copy.to: wire.reply_to is read-only"),
    ("mappings:\n  - match: {destination: '>', direction: in, protocol: stomp}\n    steps:\n"
     "      - copy_all: {from: property, to: wire.header}\n",
     "m.yaml:4: mappings[0].steps[0].copy_all.to: wire.header is read-only"),
    ("mappings:\n  - match: {destination: '>', direction: in}\n    steps:\n"
     "      - copy_all: {from: headers, to: property}\n",
     "m.yaml:4: mappings[0].steps[0].copy_all.from: 'headers' is not a section"),
    ("mappings:\n  - match: {destination: '>', direction: in}\n    steps:\n"
     "      - set: {field: expiry, value: 5}\n",
     "m.yaml:4: mappings[0].steps[0].set.field: expiry is read-only"),
])  # fmt: skip
def test_config_errors_name_file_line_and_field(text: str, expected: str) -> None:
    got = errors(text)
    assert len(got) == 1 and got[0].startswith(expected), got


# -- MQTT ---------------------------------------------------------------------------------------

SENSORS = Destination.topic("sensors.a")


def publish(ms: MappingSet, props: dict[str, object], payload: bytes = b"x", level: int = 5,
            transport: str | None = None) -> Message:
    fn = ms.wire_for(SENSORS, protocol="mqtt", direction="in", transport=transport)
    msg: Message = fn(payload=payload, qos=1, retain=False, properties=props, level=level,
                      destination=SENSORS, reply_to=None, now_ms=NOW)
    return msg


def to_mqtt(ms: MappingSet, msg: Message, level: int = 5, transport: str | None = None) -> Any:
    fn = ms.wire_for(SENSORS, protocol="mqtt", direction="out", transport=transport)
    return fn(msg, level=level, now_ms=NOW, reply_topic=None)


MQTT_RULES = """\
mappings:
  - name: device as JMSType
    extends: mqtt.in.user-headers
    match: {destination: "sensors.>"}
    steps:
      - copy: {from: wire.user.device, to: header.JMSType}
  - name: no content type property
    replaces: mqtt.in.content-type
    match: {destination: "sensors.>"}
    steps: []
  - name: kind as content type, for far
    match: {destination: "sensors.>", direction: out, protocol: mqtt, transport: far}
    steps:
      - copy: {from: property.kind, to: wire.content_type}
      - copy: {from: header.JMSPriority, to: wire.user.prio, type: string}
"""


def test_mqtt_user_property_to_jms_type_and_a_row_removed() -> None:
    ms = rules(MQTT_RULES)
    msg = publish(ms, {"content_type": "text/plain",
                       "user_property": [("device", "d1"), ("JMSType", "t")]})
    assert msg.type == "d1" and msg.properties["device"] == "d1"
    assert "JMS_GW_CONTENT_TYPE" not in msg.properties
    assert msg.body_kind is BodyKind.TEXT  # the content type still picked the body kind
    assert publish(ms, {"user_property": [("device", "d1")]}, level=4).type is None


def test_mqtt_content_type_from_a_property_for_one_transport() -> None:
    ms = rules(MQTT_RULES)
    msg = Message(b"\x01", destination=SENSORS, properties={"kind": "application/cbor"})
    out = to_mqtt(ms, msg, transport="far")
    assert out.properties["content_type"] == "application/cbor"
    assert out.properties["user_property"][-1] == ("prio", "4")
    assert "content_type" not in to_mqtt(ms, msg).properties
    assert to_mqtt(ms, msg, level=4, transport="far").properties == {}


def test_an_mqtt_field_that_does_not_fit_fails_the_mapping() -> None:
    ms = rules("""\
mappings:
  - match: {destination: ">", direction: out, protocol: mqtt}
    steps:
      - copy: {from: property.q, to: wire.qos}
""")
    with pytest.raises(MappingFailed, match=r"wire.qos: qos is an integer in 0..2, not 7"):
        to_mqtt(ms, Message("x", destination=SENSORS, properties={"q": 7}))
    assert to_mqtt(ms, Message("x", destination=SENSORS, properties={"q": 0})).qos == 0


# -- AMQP 1.0 -------------------------------------------------------------------------------------


def amqp_in(ms: MappingSet, pm: Any, dest: Destination = PLANT,
            transport: str | None = None) -> Message:
    fn = ms.wire_for(dest, protocol="amqp", direction="in", transport=transport)
    msg: Message = fn(pm, destination=dest, default_kind=QUEUE, now_ms=NOW)
    return msg


def amqp_out(ms: MappingSet, msg: Message, transport: str | None = None) -> Any:
    assert msg.destination is not None
    fn = ms.wire_for(msg.destination, protocol="amqp", direction="out", transport=transport)
    sent = proton.Message()
    sent.decode(fn(msg, delivery_count=1, now_ms=NOW).encode())
    return sent


AMQP_RULES = """\
mappings:
  - name: kind as subject
    extends: amqp.in.subject
    match: {destination: "queue:plant.>"}
    steps:
      - copy: {from: wire.application.kind, to: header.JMSType}
      - drop: [property.kind]
  - name: no creation time
    replaces: amqp.in.creation-time
    match: {destination: "queue:plant.>"}
    steps: []
  - name: reliable is persistent
    replaces: amqp.in.durable
    match: {destination: "queue:plant.>"}
    steps:
      - set: {field: header.JMSDeliveryMode, value: PERSISTENT}
"""


def test_amqp_rows_replaced_extended_and_removed_for_some_destinations() -> None:
    ms = rules(AMQP_RULES)
    pm = proton.Message(body="x", subject="orig", properties={"kind": "csv", "n": 1})
    cproton.pn_message_set_creation_time(pm._msg, NOW - 5)
    msg = amqp_in(ms, pm)
    assert msg.type == "csv" and msg.properties == {"n": 1}
    assert msg.timestamp == 0 and msg.delivery_mode is DeliveryMode.PERSISTENT
    other = amqp_in(ms, pm, OTHER)  # the defaults, by the hand-written function
    assert other.type == "orig" and other.properties == {"kind": "csv", "n": 1}
    assert other.timestamp == NOW - 5 and other.delivery_mode is DeliveryMode.NON_PERSISTENT
    assert ms.wire_for(OTHER, protocol="amqp", direction="in") is amqp_to_message


def test_amqp_out_rows_and_a_wire_rule_for_one_transport_only() -> None:
    ms = rules("""\
mappings:
  - name: no trace annotation
    replaces: amqp.out.trace-id
    match: {destination: ">"}
    steps: []
  - name: priority also as an annotation
    extends: amqp.out.priority
    match: {destination: ">"}
    steps:
      - copy: {from: header.JMSPriority, to: wire.annotation.x-opt-prio}
  - name: subject and group for far
    match: {destination: "queue:plant.>", direction: out, protocol: amqp, transport: far}
    steps:
      - copy: {from: property.kind, to: wire.properties.subject}
      - copy: {from: property.kind, to: wire.properties.group-id}
      - drop: [wire.application.kind]
""")
    msg = Message("t", destination=PLANT, priority=6, properties={"kind": "csv", "n": Int32(2)})
    msg.trace_id = "tr"
    far = amqp_out(ms, msg, "far")
    assert far.subject == "csv" and far.group_id == "csv" and far.properties == {"n": 2}
    assert far.annotations[proton.symbol("x-opt-prio")] == 6
    assert proton.symbol("x-opt-gw-trace-id") not in far.annotations
    near = amqp_out(ms, msg)
    assert near.subject is None and near.properties == {"kind": "csv", "n": 2}
    assert proton.symbol("x-opt-prio") in near.annotations
    plain = amqp_out(MappingSet(), msg)
    assert plain.annotations[proton.symbol("x-opt-gw-trace-id")] == "tr"
    assert type(plain.properties["n"]) is proton.int32  # AMQP types kept on the wire side
    assert type(far.properties["n"]) is proton.int32


def test_an_amqp_wire_field_that_does_not_fit_fails_the_mapping() -> None:
    ms = rules("""\
mappings:
  - match: {destination: ">", direction: out, protocol: amqp}
    steps:
      - copy: {from: property.p, to: wire.header.priority}
""")
    with pytest.raises(MappingFailed, match=r"wire.header.priority: header.priority is an "
                                            r"integer in 0..255, not 300"):
        amqp_out(ms, Message("x", destination=PLANT, properties={"p": 300}))
    assert amqp_out(ms, Message("x", destination=PLANT, properties={"p": 200})).priority == 200


@pytest.mark.parametrize(("text", "expected"), [
    ("mappings:\n  - match: {destination: '>', direction: in, protocol: amqp}\n    steps:\n"
     "      - set: {field: wire.properties.subject, value: x}\n",
     "m.yaml:4: mappings[0].steps[0].set.field: wire.properties.subject is read-only"),
    ("mappings:\n  - match: {destination: '>', direction: out, protocol: amqp}\n    steps:\n"
     "      - copy: {from: wire.footer, to: property.a}\n",
     "m.yaml:4: mappings[0].steps[0].copy.from: bad field 'wire.footer': an AMQP message sent has"),
    ("mappings:\n  - replaces: amqp.in.subjekt\n    match: {destination: '>'}\n    steps: []\n",
     "m.yaml:2: mappings[0].replaces: unknown default rule 'amqp.in.subjekt'"),
])  # fmt: skip
def test_amqp_config_errors(text: str, expected: str) -> None:
    got = errors(text)
    assert len(got) == 1 and got[0].startswith(expected), got


def test_amqp_wire_values_copied_into_core_fields_become_core_values() -> None:
    ms = rules("""\
mappings:
  - match: {destination: ">", direction: in, protocol: amqp}
    steps:
      - copy: {from: wire.header.priority, to: property.prio}
      - copy: {from: wire.properties.creation-time, to: property.created}
      - copy: {from: wire.annotation.x-k, to: property.k}
      - copy: {from: wire.annotation.x-k, to: header.JMSType}
""")
    pm = proton.Message(body="x", priority=7)
    cproton.pn_message_set_creation_time(pm._msg, NOW)
    pm.annotations = {proton.symbol("x-k"): proton.symbol("v")}
    props = amqp_in(ms, pm).properties
    assert [(type(props[k]), props[k]) for k in ("prio", "created", "k")] == [
        (UInt8, 7), (int, NOW), (str, "v")]
    assert amqp_in(ms, pm).type == "v"
