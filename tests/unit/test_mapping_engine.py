"""The declarative mapping engine (mappings/engine.py), step by step, as mappings/README.md says."""

from __future__ import annotations

import base64
import math
from pathlib import Path
from typing import Any

import pytest
from corehelp import not_compiled
from hypothesis import HealthCheck, given, settings
from strategies import map_bodies, same_value, stream_bodies

from gateway.errors import ConfigErrors, GatewayError
from gateway.message import MESSAGE_SLOTS, BodyKind, DeliveryMode, Destination, Message
from gateway.types import Char, Float32, Int8, Int16, Int16Array, Int32, Int64, UInt16, UInt64
from mappings.engine import MappingFailed, MappingSet, _copy_message

T = Destination.topic("sensors.plant1.temp")
Q = Destination.queue("orders.eu")


def rules(*steps: str, match: str = "{destination: '>', direction: both}") -> MappingSet:
    """One rule with these steps (each a YAML flow text)."""
    body = "".join(f"      - {s}\n" for s in steps)
    return MappingSet.from_text(f"mappings:\n  - name: r\n    match: {match}\n    steps:\n{body}",
                                "t.yaml")


def run(ms: MappingSet, msg: Message, dest: Destination = T, **kw: Any) -> Message:
    kw.setdefault("protocol", "mqtt")
    kw.setdefault("direction", "in")
    fn = ms.compile_for(dest, **kw)
    assert fn is not None
    return fn(msg)


def apply(msg: Message, *steps: str) -> Message:
    return run(rules(*steps), msg)


def errors(text: str, filename: str = "m.yaml") -> list[str]:
    with pytest.raises(ConfigErrors) as info:
        MappingSet.from_text(text, filename)
    return [str(e) for e in info.value.errors]


def one_rule(steps: str, match: str = "{destination: '>', direction: in}") -> str:
    return f"mappings:\n  - match: {match}\n    steps:\n{steps}"


# -- decode_json / encode_json -----------------------------------------------------------------


def test_decode_json_object_keeps_nesting_and_json_types() -> None:
    m = apply(Message.text('{"t": 21.5, "n": 3, "ok": true, "no": null, "s": "x", '
                           '"meta": {"ids": [1, [2, {"z": -1}]]}, "big": 18446744073709551615}'),
              "decode_json: {}")
    assert m.body_kind is BodyKind.MAP
    expected = {"t": 21.5, "n": 3, "ok": True, "no": None, "s": "x",
                "meta": {"ids": [1, [2, {"z": -1}]]}, "big": UInt64(2**64 - 1)}
    assert same_value(m.body, expected)


def test_decode_json_array_bytes_and_bodies_left_alone() -> None:
    m = apply(Message.binary(b'[1, "a", {"b": false}]'), "decode_json:")
    assert m.body_kind is BodyKind.STREAM and same_value(m.body, [1, "a", {"b": False}])
    for msg in (Message.binary(b""), Message.text(""), Message(), Message.map({"a": 1}),
                Message(b"\xac\xed", body_kind=BodyKind.OBJECT)):
        out = apply(msg, "decode_json: {}")
        assert (out.body_kind, out.body) == (msg.body_kind, msg.body)


@pytest.mark.parametrize("body, detail", [
    ("{'a': 1}", "the body is not JSON: Expecting property name enclosed in double quotes: "
                 "line 1 column 2 (char 1)"),
    ('{"a": NaN}', "the body is not JSON: NaN is not JSON"),
    ("42", "the JSON body is int64, not an object or array"),
    ('"x"', "the JSON body is string, not an object or array"),
    ('{"a": 18446744073709551616}', "number 18446744073709551616 fits neither a long nor a uint64"),
    ("[" * 66 + "]" * 66, "the JSON body nests deeper than 64 levels"),
    ("[" * 100000 + "]" * 100000, "the JSON body nests too deep"),
])  # fmt: skip
def test_decode_json_failures(body: str, detail: str) -> None:
    with pytest.raises(MappingFailed) as info:
        apply(Message.text(body), "decode_json: {}")
    assert info.value.detail == detail
    assert (info.value.step, info.value.field, info.value.line) == ("decode_json", "body", 5)


def test_decode_json_bytes_that_are_not_utf8() -> None:
    with pytest.raises(MappingFailed, match="the body is not JSON: 'utf-8' codec"):
        apply(Message.binary(b'{"a": "\xff"}'), "decode_json: {}")


def test_encode_json_documented_form_keeps_nothing_but_values() -> None:
    body = {"t": Float32(21.1), "n": Int16(-3), "u": UInt64(2**64 - 1), "c": Char("A"),
            "b": b"\x00\xff", "nan": math.nan, "arr": Int16Array([1, 2]),
            "nest": [{"x": None}, True]}
    m = apply(Message.map(body), "encode_json: {}")
    assert m.body_kind is BodyKind.TEXT
    assert m.body == ('{"t":21.1,"n":-3,"u":18446744073709551615,"c":"A","b":"AP8=",'
                      '"nan":"NaN","arr":[1,2],"nest":[{"x":null},true]}')
    m = apply(Message.stream([1, "é"]), "encode_json: {as: bytes}")
    assert (m.body_kind, m.body) == (BodyKind.BYTES, '[1,"é"]'.encode())
    text = Message.text("not json")
    assert apply(text, "encode_json: {}").body == "not json"


def test_decode_then_encode_gives_the_compact_form() -> None:
    m = apply(Message.text('{ "a" : [1, 2.5, {"b": null}], "c": "\\u00e9" }'),
              "decode_json: {}", "encode_json: {}")
    assert m.body == '{"a":[1,2.5,{"b":null}],"c":"é"}'


def _json_same(orig: Any, back: Any) -> bool:
    """What encode_json then decode_json must give for a body value (README: widths lost)."""
    if orig is None or type(orig) is bool:
        return back is orig
    if isinstance(orig, dict):
        return (type(back) is dict and list(back) == list(orig)
                and all(_json_same(v, back[k]) for k, v in orig.items()))
    if isinstance(orig, (list, tuple)):
        return (type(back) is list and len(back) == len(orig)
                and all(_json_same(a, b) for a, b in zip(orig, back, strict=True)))
    if type(orig) is bytes:
        return back == base64.b64encode(orig).decode()
    if isinstance(orig, str):
        return type(back) is str and back == str(orig)
    if isinstance(orig, float):
        if math.isnan(orig):
            return back == "NaN"
        if math.isinf(orig):
            return back == ("Infinity" if orig > 0 else "-Infinity")
        if type(back) is not float or math.copysign(1, back) != math.copysign(1, orig):
            return False
        return Float32(back) == orig if type(orig) is Float32 else back == orig
    assert isinstance(orig, int)
    if orig > 2**63 - 1:
        return type(back) is UInt64 and back == orig
    return type(back) is int and back == int(orig)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(map_bodies(), stream_bodies())
def test_encode_decode_round_trip(mbody: dict[str, Any], sbody: list[Any]) -> None:
    ms = rules("encode_json: {}", "decode_json: {}")
    for msg in (Message.map(mbody), Message.stream(sbody)):
        out = run(ms, msg)
        assert out.body_kind is msg.body_kind
        assert _json_same(msg.body, out.body), (msg.body, out.body)


def test_round_trip_comparison_can_fail() -> None:
    assert not _json_same({"a": Int16(1)}, {"a": 1.0})
    assert not _json_same([Float32(0.1)], [0.2])
    assert not _json_same({"a": 1, "b": 2}, {"b": 2, "a": 1})


# -- lift, copy, move, rename --------------------------------------------------------------------


def test_lift_with_and_without_type() -> None:
    m = apply(Message.map({"temp": 21.1, "n": Int16(7), "s": "12"}),
              "lift: {from: body.temp, to: property.temp, type: float32}",
              "lift: {from: body.n, to: property.n}",
              "lift: {from: body.s, to: property.s, type: short}",
              "lift: {from: body.absent, to: property.x}",
              "lift: {from: body.n, to: header.JMSPriority}")
    assert same_value(m.properties, {"temp": Float32(21.1), "n": Int16(7), "s": Int16(12)})
    assert same_value(m.body, {"temp": 21.1, "n": Int16(7), "s": "12"}) and m.priority == 7


def test_copy_headers_into_a_map_body() -> None:
    src = Message.map({}, type="reading", priority=9, correlation_id=b"\x01", timestamp=5,
                      reply_to=Destination.queue("replies"), destination=T,
                      delivery_mode=DeliveryMode.RELIABLE)
    names = ("JMSType", "JMSPriority", "JMSCorrelationID", "JMSTimestamp", "JMSReplyTo",
             "JMSDestination", "JMSDeliveryMode", "JMSRedelivered", "JMSMessageID",
             "JMSExpiration")
    m = apply(src, *(f"copy: {{from: header.{h}, to: body.{h}}}" for h in names))
    assert same_value(m.body, {
        "JMSType": "reading", "JMSPriority": Int32(9), "JMSCorrelationID": b"\x01",
        "JMSTimestamp": 5, "JMSReplyTo": "queue:replies",
        "JMSDestination": "topic:sensors.plant1.temp",
        "JMSDeliveryMode": "RELIABLE", "JMSRedelivered": False, "JMSExpiration": 0,
    })  # fmt: skip  (JMSMessageID is null: absent, so not copied)


def test_copy_within_the_body_does_not_share() -> None:
    m = apply(Message.map({"a": {"x": [1]}}), "copy: {from: body.a, to: body.b}",
              "set: {field: 'body.b.x[0]', value: 2}")
    assert same_value(m.body, {"a": {"x": [1]}, "b": {"x": [2]}})


def test_move_into_nested_body_and_wrap_unwrap() -> None:
    m = apply(Message.map({"t": 1}, properties={"site": "s1", "k": True}),
              "move: {from: property.site, to: body.meta.site}",
              "move: {from: property.nope, to: body.nope}")
    assert same_value(m.body, {"t": 1, "meta": {"site": "s1"}}) and m.properties == {"k": True}
    m = apply(Message.map({"payload": {"v": 1}, "env": "x"}),
              "move: {from: body.payload, to: body}")
    assert same_value(m.body, {"v": 1}) and m.body_kind is BodyKind.MAP
    m = apply(Message.stream([1, 2]), "move: {from: body, to: body.data}")
    assert same_value(m.body, {"data": [1, 2]}) and m.body_kind is BodyKind.MAP
    m = apply(Message.map({"v": "hi"}), "move: {from: body.v, to: body}")
    assert (m.body_kind, m.body) == (BodyKind.TEXT, "hi")
    m = apply(Message.text("hi"), "move: {from: body, to: property.text}")
    assert (m.body_kind, m.body, m.properties) == (BodyKind.NONE, None, {"text": "hi"})


def test_move_headers() -> None:
    m = apply(Message.map({"p": "3"}, type="t", expiration=99),
              "move: {from: header.JMSType, to: property.type}",
              "move: {from: body.p, to: header.JMSPriority}",
              "move: {from: header.JMSExpiration, to: body.exp}")
    assert (m.type, m.priority, m.expiration, m.expires_at) == (None, 3, 0, 0)
    assert m.properties == {"type": "t"} and same_value(m.body, {"exp": 99})


def test_rename_keeps_order_and_replaces() -> None:
    m = apply(Message.map({"m": {"a": 1, "b": 2, "c": 3}}, properties={"x": 1, "dev": "d", "y": 2}),
              "rename: {from: property.dev, to: property.device}",
              "rename: {from: body.m.b, to: body.m.c}",
              "rename: {from: property.none, to: property.other}")
    assert list(m.properties.items()) == [("x", 1), ("device", "d"), ("y", 2)]
    assert list(m.body["m"].items()) == [("a", 1), ("c", 2)]


def test_stream_indices_and_quoted_keys() -> None:
    m = apply(Message.map({"a.b": {"x[1]": 5}, "l": [10, 20, 30], 'q"': 1}),
              """lift: {from: 'body."a.b"."x[1]"', to: property.ab}""",
              "lift: {from: 'body.l[-1]', to: property.last}",
              "lift: {from: 'body.l[5]', to: property.none}",
              """lift: {from: 'body."q\\""', to: property.q}""",
              "set: {field: 'body.l[0]', value: 11}",
              "drop: 'body.l[1]'")
    assert m.properties == {"ab": 5, "last": 30, "q": 1}
    assert same_value(m.body["l"], [11, 30])
    m = apply(Message.stream([{"a": 1}, 2]), "move: {from: 'body[0].a', to: property.a}")
    assert m.properties == {"a": 1} and same_value(m.body, [{}, 2])


# -- set, default, set_type, drop, require -----------------------------------------------------


def test_set_every_kind_of_target() -> None:
    m = apply(Message(),
              "set: {field: property.source, value: plant-1}",
              "set: {field: property.n, value: 5, type: int16}",
              "set: {field: property.big, value: 18446744073709551615}",
              "set: {field: body.meta, value: {a: [1, 2.5, null], b: !!binary AP8=}}",
              "set: {field: header.JMSPriority, value: '8'}",
              "set: {field: header.JMSReplyTo, value: 'topic:replies.x'}",
              "set: {field: header.JMSDeliveryMode, value: non_persistent}",
              "set: {field: header.JMSType, value: 12}",
              "set: {field: header.JMSExpiration, value: 1700000000000}",
              "set: {field: header.JMSCorrelationID, value: c1}")
    assert same_value(m.properties, {"source": "plant-1", "n": Int16(5), "big": UInt64(2**64 - 1)})
    assert same_value(m.body, {"meta": {"a": [1, 2.5, None], "b": b"\x00\xff"}})
    assert (m.priority, m.reply_to, m.delivery_mode, m.type, m.correlation_id) == (
        8, Destination.topic("replies.x"), DeliveryMode.NON_PERSISTENT, "12", "c1")
    assert m.expiration == m.expires_at == 1_700_000_000_000


def test_set_whole_body_and_constants_are_not_shared() -> None:
    ms = rules("set: {field: body, value: {a: {b: 1}}}", "set: {field: body.a.c, value: 2}")
    first = run(ms, Message.text("x"))
    second = run(ms, Message())
    assert same_value(first.body, {"a": {"b": 1, "c": 2}}) and first.body_kind is BodyKind.MAP
    first.body["a"]["b"] = 99
    assert same_value(second.body, {"a": {"b": 1, "c": 2}})
    assert apply(Message.map({}), "set: {field: body, value: hello}").body_kind is BodyKind.TEXT
    assert apply(Message.map({}), "set: {field: body, value: null}").body_kind is BodyKind.NONE


def test_default_only_when_absent_or_null() -> None:
    steps = ("default: {field: property.site, value: s0}",
             "default: {field: header.JMSPriority, value: 7}",
             "default: {field: header.JMSType, value: reading}",
             "default: {field: body.n, value: 1, type: int8}",
             "default: {field: header.JMSExpiration, value: 60000}")
    m = apply(Message.map({"n": None}, properties={"other": 1}), *steps)
    assert (m.properties, m.priority, m.type, m.expiration) == (
        {"other": 1, "site": "s0"}, 7, "reading", 60000)
    assert same_value(m.body, {"n": Int8(1)})
    m = apply(Message.map({"n": 5}, properties={"site": "s9"}, priority=5, type="t", expiration=9),
              *steps)
    assert (m.properties, m.priority, m.type, m.expiration) == ({"site": "s9"}, 5, "t", 9)
    assert same_value(m.body, {"n": 5})


def test_set_type_converts_in_place() -> None:
    m = apply(Message.map({"t": 21.1, "n": 300, "s": "1", "z": None, "f": 5.0},
                          properties={"count": "42", "flag": "TRUE", "c": "x", "w": UInt16(9)}),
              "set_type: {field: property.count, type: int16}",
              "set_type: {field: property.flag, type: boolean}",
              "set_type: {field: property.c, type: char}",
              "set_type: {field: property.w, type: long}",
              "set_type: {field: property.absent, type: int8}",
              "set_type: {field: body.t, type: float}",
              "set_type: {field: body.n, type: uint16}",
              "set_type: {field: body.s, type: double}",
              "set_type: {field: body.z, type: int8}",
              "set_type: {field: body.f, type: int32}",
              "set_type: {field: body.n, type: string}")
    assert same_value(m.properties, {"count": Int16(42), "flag": True, "c": Char("x"),
                                     "w": Int64(9)})
    assert same_value(m.body, {"t": Float32(21.1), "n": "300", "s": 1.0, "z": None,
                               "f": Int32(5)})


@pytest.mark.parametrize("value, type_, detail", [
    ("hot", "float32", "cannot read string 'hot' as float32: could not convert string to float: "
                       "'hot'"),
    (300, "int8", "cannot read int64 300 as int8: 300 out of range for int8 [-128, 127]"),
    (5.5, "int16", "cannot read float64 5.5 as int16: 5.5 is not an integral value for int16"),
    (True, "int32", "cannot read boolean as int32"),
    (-1, "uint8", "cannot read int64 -1 as uint8: -1 out of range for uint8 [0, 255]"),
    ("ab", "char", "cannot read String as char"),
])  # fmt: skip
def test_set_type_failures(value: Any, type_: str, detail: str) -> None:
    with pytest.raises(MappingFailed) as info:
        apply(Message.map({"v": value}), f"set_type: {{field: body.v, type: {type_}}}")
    assert info.value.detail == detail


def test_drop_everything_droppable() -> None:
    m = apply(Message.map({"raw": 1, "keep": {"x": 1, "y": 2}, "l": [1, 2, 3]},
                          properties={"debug": True, "a": 1}, priority=9, type="t", expiration=5,
                          correlation_id="c", reply_to=Q),
              "drop: [property.debug, body.raw, body.keep.y, 'body.l[0]', body.none.x]",
              "drop: [header.JMSPriority, header.JMSType, header.JMSExpiration]",
              "drop: [header.JMSCorrelationID, header.JMSReplyTo, property.none]")
    assert m.properties == {"a": 1}
    assert same_value(m.body, {"keep": {"x": 1}, "l": [2, 3]})
    assert (m.priority, m.type, m.expiration, m.correlation_id, m.reply_to) == (4, None, 0, None,
                                                                               None)
    m = apply(Message.text("x"), "drop: body")
    assert (m.body_kind, m.body) == (BodyKind.NONE, None)


def test_require() -> None:
    ms = rules("require: [body.temp, property.site, header.JMSType, header.JMSPriority]")
    ok = Message.map({"temp": 0}, properties={"site": "s"}, type="t")  # priority 4 is a value
    assert run(ms, ok) == ok
    for bad, field in ((Message.map({"temp": None}, properties={"site": "s"}, type="t"),
                        "body.temp"),
                       (Message.map({"temp": 1}, type="t"), "property.site"),
                       (Message.map({"temp": 1}, properties={"site": "s"}), "header.JMSType")):
        with pytest.raises(MappingFailed) as info:
            run(ms, bad)
        assert str(info.value) == f"mapping 'r' (t.yaml:5) require {field}: is missing"
    with pytest.raises(MappingFailed, match="require header.JMSDestination: is missing"):
        apply(Message(), "require: header.JMSDestination")
    assert apply(Message(destination=Q), "require: header.JMSDestination").destination == Q


# -- per-message failures: nothing half done ---------------------------------------------------


def test_failure_leaves_the_message_alone_and_says_where() -> None:
    ms = MappingSet.from_text("""\
mappings:
  - name: first
    match: {destination: ">", direction: in}
    steps:
      - set: {field: property.a, value: 1}
      - set: {field: body.meta.x, value: 1}
  - name: readings
    match: {destination: ">", direction: in}
    steps:
      - lift: {from: body.temp, to: property.temp, type: float32}
""", "plant.yaml")
    msg = Message.map({"temp": "hot", "meta": {"y": 2}}, properties={"p": 1})
    fn = ms.compile_for(T, protocol="mqtt", direction="in")
    assert fn is not None
    with pytest.raises(MappingFailed) as info:
        fn(msg)
    e = info.value
    assert str(e) == ("mapping 'readings' (plant.yaml:10) lift body.temp -> property.temp: "
                      "cannot read string 'hot' as float32: could not convert string to float: "
                      "'hot'")
    assert (e.rule, e.file, e.line, e.step, e.field, e.reason) == (
        "readings", "plant.yaml", 10, "lift", "body.temp -> property.temp", "mapping-failed")
    assert isinstance(e, GatewayError)
    assert msg.properties == {"p": 1} and same_value(msg.body, {"temp": "hot", "meta": {"y": 2}})


@pytest.mark.parametrize("msg, step, detail", [
    (Message.text("x"), "set: {field: body.a, value: 1}",
     "a TEXT body has no fields (decode_json first?)"),
    (Message.map({"a": 5}), "set: {field: body.a.b, value: 1}", "body.a is int64, not a map"),
    (Message.map({"a": [1]}), "set: {field: 'body.a[3]', value: 1}",
     "body.a[3] does not exist (a stream of 1)"),
    (Message.map({"a": [1]}), "set: {field: 'body.a[3].x', value: 1}", "body.a has no element [3]"),
    (Message.map({"a": {"b": 1}}), "lift: {from: body.a, to: property.a}",
     "a property value cannot be map"),
    (Message.map({"p": 12}), "lift: {from: body.p, to: header.JMSPriority}",
     "12 is not an integer in 0..9"),
    (Message.map({"r": "replies"}), "lift: {from: body.r, to: header.JMSReplyTo}",
     "not a destination: 'replies'"),
    (Message.map({"m": "FAST"}), "lift: {from: body.m, to: header.JMSDeliveryMode}",
     "'FAST' is not a delivery mode (PERSISTENT, NON_PERSISTENT, RELIABLE)"),
    (Message.map({"n": 5}), "move: {from: body.n, to: body}",
     "a body cannot be int64 (convert it: type: string)"),
])  # fmt: skip
def test_write_failures(msg: Message, step: str, detail: str) -> None:
    with pytest.raises(MappingFailed) as info:
        apply(msg, step)
    assert info.value.detail == detail


def test_the_caller_message_is_never_changed() -> None:
    body = {"a": {"b": [1, {"c": 2}]}, "d": 1}
    msg = Message.map(body, properties={"x": 1}, destination=T, type="t")
    msg.wire = {"mqtt5": b"..."}
    msg.store_id, msg.refs = 7, 2
    out = apply(msg, "set: {field: 'body.a.b[1].c', value: 3}",
                "rename: {from: body.d, to: body.e}", "drop: property.x",
                "set: {field: header.JMSType, value: u}")
    assert same_value(msg.body, {"a": {"b": [1, {"c": 2}]}, "d": 1}) and msg.body is body
    assert msg.properties == {"x": 1} and msg.type == "t" and msg.wire == {"mqtt5": b"..."}
    assert same_value(out.body, {"a": {"b": [1, {"c": 3}]}, "e": 1}) and out.type == "u"
    assert (out.wire, out.store_id, out.refs, out.destination) == (None, 0, 0, T)


@pytest.mark.parametrize("step, changed", [
    ("set: {field: body.a.b, value: 9}", {"a": {"b": 9}, "l": [1, {"c": 2}]}),
    ("default: {field: body.a.z, value: 9}", {"a": {"b": 1, "z": 9}, "l": [1, {"c": 2}]}),
    ("set_type: {field: body.a.b, type: int8}", {"a": {"b": Int8(1)}, "l": [1, {"c": 2}]}),
    ("drop: 'body.l[1].c'", {"a": {"b": 1}, "l": [1, {}]}),
    ("move: {from: 'body.l[1].c', to: property.c}", {"a": {"b": 1}, "l": [1, {}]}),
    ("rename: {from: body.a.b, to: body.a.x}", {"a": {"x": 1}, "l": [1, {"c": 2}]}),
    ("copy: {from: property.p, to: 'body.l[0]'}", {"a": {"b": 1}, "l": ["v", {"c": 2}]}),
])  # fmt: skip
def test_every_step_into_a_shared_body_copies_it(step: str, changed: dict[str, Any]) -> None:
    msg = Message.map({"a": {"b": 1}, "l": [1, {"c": 2}]}, properties={"p": "v"})
    out = apply(msg, step)
    assert same_value(out.body, changed)
    assert same_value(msg.body, {"a": {"b": 1}, "l": [1, {"c": 2}]})


@not_compiled
def test_copy_message_copies_every_slot() -> None:
    msg = Message.map({"a": 1})
    for i, slot in enumerate(MESSAGE_SLOTS):
        setattr(msg, slot, {"properties": {"p": i}}.get(slot, f"v{i}"))
    out = _copy_message(msg)
    reset = {"wire": None, "store_id": 0, "refs": 0, "log_head": None}
    for slot in MESSAGE_SLOTS:
        assert getattr(out, slot) == reset.get(slot, getattr(msg, slot)), slot
    assert out.properties is not msg.properties


# -- matching -----------------------------------------------------------------------------------


MATCHING = """\
mappings:
  - name: all sensors
    match: {destination: "sensors.>", direction: both}
    steps: [{set: {field: property.order, value: a}}]
  - name: plant topics over mqtt in
    match: {destination: "topic:sensors.*.temp", direction: in, protocol: [mqtt, stomp]}
    steps: [{set: {field: property.order, value: b}}, {set: {field: property.b, value: true}}]
  - name: queues out of one transport
    match:
      destination: ["queue:orders.*", "queue:other"]
      direction: out
      transport: plant-broker
    steps: [{set: {field: property.order, value: c}}]
"""


@pytest.mark.parametrize("dest, protocol, direction, transport, expected", [
    (T, "mqtt", "in", None, {"order": "b", "b": True}),
    (T, "stomp", "in", "x", {"order": "b", "b": True}),
    (T, "amqp", "in", None, {"order": "a"}),
    (T, "mqtt", "out", None, {"order": "a"}),
    (Destination.queue("sensors.plant1.temp"), "mqtt", "in", None, {"order": "a"}),
    (Destination.topic("sensors.plant1.temp.x"), "mqtt", "in", None, {"order": "a"}),
    (Destination.topic("sensors"), "mqtt", "in", None, None),
    (Q, "amqp", "out", "plant-broker", {"order": "c"}),
    (Destination.queue("other"), "rv", "out", "plant-broker", {"order": "c"}),
    (Q, "amqp", "out", None, None),
    (Q, "amqp", "in", "plant-broker", None),
    (Destination.topic("orders.eu"), "amqp", "out", "plant-broker", None),
])  # fmt: skip
def test_matching(dest: Destination, protocol: str, direction: str, transport: str | None,
                  expected: dict[str, Any] | None) -> None:
    ms = MappingSet.from_text(MATCHING, "match.yaml")
    fn = ms.compile_for(dest, protocol=protocol, direction=direction, transport=transport)
    if expected is None:
        assert fn is None
    else:
        assert fn is not None and fn(Message.text("x")).properties == expected


def test_rules_in_order_across_files(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text(one_rule("      - copy: {from: property.v, to: property.w}\n"))
    (tmp_path / "a.yaml").write_text(one_rule("      - set: {field: property.v, value: 1}\n"))
    (tmp_path / "c.yml").write_text("not: [loaded")
    extra = tmp_path / "extra.conf"
    extra.write_text(one_rule("      - set_type: {field: property.w, type: string}\n"))
    ms = MappingSet.load([tmp_path, extra])
    assert [(Path(r["file"]).name, r["line"]) for r in ms.rules()] == [
        ("a.yaml", 2), ("b.yaml", 2), ("extra.conf", 2)]
    assert run(ms, Message()).properties == {"v": 1, "w": "1"}


def test_rules_for_the_admin_api() -> None:
    ms = MappingSet.from_text(MATCHING, "match.yaml")
    assert len(ms) == 3
    assert ms.rules()[1] == {
        "name": "plant topics over mqtt in", "file": "match.yaml", "line": 5,
        "match": {"destination": ["topic:sensors.*.temp"], "protocol": ["mqtt", "stomp"],
                  "transport": None, "direction": "in"},
        "steps": ["set", "set"],
    }
    assert ms.rules()[2]["match"]["transport"] == ["plant-broker"]
    assert rules("drop: [property.a, property.b]", "decode_json:").rules()[0]["steps"] == [
        "drop", "decode_json"]


def test_cache_returns_the_same_function_and_is_bounded() -> None:
    ms = MappingSet.from_text(MATCHING, "match.yaml")
    f1 = ms.compile_for(T, protocol="mqtt", direction="in")
    assert f1 is not None and ms.compile_for(T, protocol="mqtt", direction="in") is f1
    assert ms.compile_for(Q, protocol="mqtt", direction="in") is None
    assert ms.cache_len == 2
    small = MappingSet.load([], cache_size=4)
    for i in range(10):
        assert small.compile_for(Destination.topic(f"t{i}"), protocol="rv", direction="out") is None
        assert small.cache_len <= 4
    assert small.cache_len == 4  # at 4 the older half goes before the next is added: 3, 4, 3, 4
    small.compile_for(Destination.topic("t9"), protocol="rv", direction="out")
    assert small.cache_len == 4  # a hit
    small.compile_for(Destination.topic("t0"), protocol="rv", direction="out")
    assert small.cache_len == 3  # t0 had gone
    with pytest.raises(ValueError, match="unknown protocol 'http' or direction 'in'"):
        ms.compile_for(T, protocol="http", direction="in")
    with pytest.raises(ValueError):
        ms.compile_for(T, protocol="mqtt", direction="both")


def test_empty_files() -> None:
    assert len(MappingSet.from_text("")) == 0
    assert len(MappingSet.from_text("# only a comment\n")) == 0
    assert len(MappingSet.from_text("mappings: []\n")) == 0


# -- configuration errors ----------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("mappings: [\n",
     ["m.yaml:2: not valid YAML: expected the node content, but found '<stream end>'"]),
    ("rules: []\n", ["m.yaml:1: top level: unknown key 'rules' (known: mappings)",
                     "m.yaml:1: top level: missing 'mappings'"]),
    ("- a\n", ["m.yaml:1: top level: must be a mapping of keys to values"]),
    ("mappings: {}\n", ["m.yaml:1: mappings: must be a list of rules"]),
    ("mappings:\n  - 3\n", ["m.yaml:2: mappings[0]: must be a mapping of keys to values"]),
    ("mappings:\n  - match: {destination: a, direction: in}\n    steps: []\n    extra: 1\n",
     ["m.yaml:4: mappings[0]: unknown key 'extra' (known: match, steps, name, replaces, extends)",
      "m.yaml:3: mappings[0].steps: must be a list of one or more steps (or [] with replaces)"]),
    ("mappings:\n  - steps: [decode_json: {}]\n",
     ["m.yaml:2: mappings[0]: missing 'match'"]),
    (one_rule("      - decode_json: {}\n", "{destination: a}"),
     ["m.yaml:2: mappings[0].match: missing 'direction'"]),
    (one_rule("      - decode_json: {}\n", "{destination: a, direction: inbound}"),
     ["m.yaml:2: mappings[0].match.direction: must be in, out or both, not 'inbound'"]),
    (one_rule("      - decode_json: {}\n", "{destination: a.>.b, direction: in}"),
     ["m.yaml:2: mappings[0].match.destination: '>' must be the last element in 'a.>.b'"]),
    (one_rule("      - decode_json: {}\n", "{destination: [a, 'queue:b..c'], direction: in}"),
     ["m.yaml:2: mappings[0].match.destination: destination name 'b..c' has an empty element"]),
    (one_rule("      - decode_json: {}\n", "{destination: [], direction: in}"),
     ["m.yaml:2: mappings[0].match.destination: is an empty list"]),
    (one_rule("      - decode_json: {}\n",
              "{destination: a, direction: in, protocol: [mqtt, http]}"),
     ["m.yaml:2: mappings[0].match.protocol: unknown protocol 'http' "
      "(one of mqtt, amqp, stomp, rv, inproc)"]),
    (one_rule("      - decode_json: {}\n", "{destination: a, direction: in, transport: 'a b'}"),
     ["m.yaml:2: mappings[0].match.transport: invalid transport name 'a b'"]),
    (one_rule("      - decode_json: {}\n", "{destination: a, direction: in, direction: out}"),
     ["m.yaml:2: mappings[0].match.direction: given twice"]),
    (one_rule("      - decode: {}\n"),
     ["m.yaml:4: mappings[0].steps[0]: unknown step 'decode' (one of decode_json, encode_json, "
      "lift, copy, move, rename, set, default, set_type, drop, require, convert, copy_all)"]),
    (one_rule("      - {decode_json: {}, encode_json: {}}\n"),
     ["m.yaml:4: mappings[0].steps[0]: a step is one key, its kind (decode_json, encode_json, "
      "lift, copy, move, rename, set, default, set_type, drop, require, convert, copy_all), "
      "with its arguments"]),
    (one_rule("      - lift: {from: body.a, too: property.a}\n"),
     ["m.yaml:4: mappings[0].steps[0].lift: unknown key 'too' (known: from, to, type)",
      "m.yaml:4: mappings[0].steps[0].lift: missing 'to'"]),
    (one_rule("      - decode_json: {strict: true}\n"),
     ["m.yaml:4: mappings[0].steps[0].decode_json: unknown key 'strict' (known: none)"]),
    (one_rule("      - encode_json: {as: xml}\n"),
     ["m.yaml:4: mappings[0].steps[0].encode_json.as: must be text or bytes, not 'xml'"]),
    (one_rule("      - lift: {from: body.a, to: prop.a}\n"),
     ["m.yaml:4: mappings[0].steps[0].lift.to: bad field 'prop.a': a field is header.<JMS name>, "
      "property.<name>, property.*, body, body.<key>..., trace_id, expiry, body_kind or "
      "wire.<field>"]),
    (one_rule("      - drop: [body.a..b, 'body.a[x]', 'body.\"a', property.]\n"),
     ["m.yaml:4: mappings[0].steps[0].drop: bad field 'body.a..b': cannot read a key or [index] "
      "at character 7",
      "m.yaml:4: mappings[0].steps[0].drop: bad field 'body.a[x]': cannot read a key or [index] "
      "at character 7",
      "m.yaml:4: mappings[0].steps[0].drop: bad field 'body.\"a': cannot read a key or [index] "
      "at character 5",
      "m.yaml:4: mappings[0].steps[0].drop: bad field 'property.': empty property name"]),
    (one_rule("      - copy: {from: header.JMSTipe, to: property.a}\n"),
     ["m.yaml:4: mappings[0].steps[0].copy.from: bad field 'header.JMSTipe': unknown header "
      "'JMSTipe' (one of JMSType, JMSMessageID, JMSCorrelationID, JMSReplyTo, JMSPriority, "
      "JMSDeliveryMode, JMSExpiration, JMSDeliveryTime, JMSTimestamp, JMSDestination, "
      "JMSRedelivered)"]),
    (one_rule("      - lift: {from: body.a, to: property.a, type: float33}\n"),
     ["m.yaml:4: mappings[0].steps[0].lift.type: unknown type 'float33' (one of boolean, int8, "
      "int16, int32, int64, uint8, uint16, uint32, uint64, float32, float64, char, string, "
      "bytes, byte, short, int, long, float, double, String, byte[])"]),
    (one_rule("      - set: {field: header.JMSDestination, value: 'topic:x'}\n"),
     ["m.yaml:4: mappings[0].steps[0].set.field: header.JMSDestination is read-only"]),
    (one_rule("      - default: {field: header.JMSDeliveryMode, value: PERSISTENT}\n"),
     ["m.yaml:4: mappings[0].steps[0].default.field: header.JMSDeliveryMode always has a value "
      "(use set)"]),
    (one_rule("      - drop: header.JMSDeliveryMode\n"),
     ["m.yaml:4: mappings[0].steps[0].drop: header.JMSDeliveryMode cannot be dropped"]),
    (one_rule("      - move: {from: header.JMSRedelivered, to: property.r}\n"),
     ["m.yaml:4: mappings[0].steps[0].move.from: header.JMSRedelivered is read-only"]),
    (one_rule("      - set_type: {field: header.JMSPriority, type: int8}\n"),
     ["m.yaml:4: mappings[0].steps[0].set_type.field: header.JMSPriority has no type to set "
      "(set_type takes a property or a body field)"]),
    (one_rule("      - lift: {from: property.a, to: property.b}\n"),
     ["m.yaml:4: mappings[0].steps[0].lift: lift takes a body field to a property or a header "
      "(else use copy or move)"]),
    (one_rule("      - rename: {from: body.a.x, to: body.b.x}\n"),
     ["m.yaml:4: mappings[0].steps[0].rename: rename gives a property or map field a new name "
      "in its place (else move)"]),
    (one_rule("      - copy: {from: property.a, to: property.a}\n"),
     ["m.yaml:4: mappings[0].steps[0].copy: from and to are the same field"]),
    (one_rule("      - set: {field: header.JMSPriority, value: 12}\n"),
     ["m.yaml:4: mappings[0].steps[0].set.value: cannot go in header.JMSPriority: 12 is not an "
      "integer in 0..9"]),
    (one_rule("      - set: {field: property.m, value: {a: 1}}\n"),
     ["m.yaml:4: mappings[0].steps[0].set.value: cannot go in property.m: a property value "
      "cannot be map"]),
    (one_rule("      - set: {field: property.d, value: 2024-01-01}\n"),
     ["m.yaml:4: mappings[0].steps[0].set.value: cannot go in property.d: a YAML date is not a "
      "message value (quote it to make a string)"]),
    (one_rule("      - set: {field: property.n, value: 300, type: int8}\n"),
     ["m.yaml:4: mappings[0].steps[0].set.value: cannot go in property.n: cannot read int64 300 "
      "as int8: 300 out of range for int8 [-128, 127]"]),
    (one_rule("      - set: {field: body.n, value: 99999999999999999999}\n"),
     ["m.yaml:4: mappings[0].steps[0].set.value: cannot go in body.n: 99999999999999999999 out "
      "of range for uint64 [0, 18446744073709551615]"]),
    (one_rule("      - set: {field: body, value: 5}\n"),
     ["m.yaml:4: mappings[0].steps[0].set.value: cannot go in body: a body cannot be int64 "
      "(convert it: type: string)"]),
])  # fmt: skip
def test_config_errors(text: str, expected: list[str]) -> None:
    assert errors(text) == expected


def test_every_error_of_every_file_at_once(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(
        "mappings:\n"
        "  - name: one\n"
        "    match: {destination: a, direction: sideways}\n"
        "    steps:\n"
        "      - lift: {from: body.t, to: property.t, type: float33}\n"
        "      - drop: header.JMSRedelivered\n"
        "  - match: {destination: b, direction: in}\n"
        "    steps: [{decode_json: {}}]\n"
    )
    (tmp_path / "b.yaml").write_text("mappings:\n  - match: {destination: a, direction: in}\n"
                                     "    steps: [{frobnicate: {}}]\n")
    with pytest.raises(ConfigErrors) as info:
        MappingSet.load([tmp_path, tmp_path / "missing.yaml"])
    a, b, missing = tmp_path / "a.yaml", tmp_path / "b.yaml", tmp_path / "missing.yaml"
    lines = str(info.value).splitlines()
    assert lines[:4] == [
        f"{a}:3: mappings[0].match.direction: must be in, out or both, not 'sideways'",
        f"{a}:5: mappings[0].steps[0].lift.type: unknown type 'float33' (one of boolean, int8, "
        "int16, int32, int64, uint8, uint16, uint32, uint64, float32, float64, char, string, "
        "bytes, byte, short, int, long, float, double, String, byte[])",
        f"{a}:6: mappings[0].steps[1].drop: header.JMSRedelivered is read-only",
        f"{b}:3: mappings[0].steps[0]: unknown step 'frobnicate' (one of decode_json, "
        "encode_json, lift, copy, move, rename, set, default, set_type, drop, require, convert, "
        "copy_all)",
    ]
    assert lines[4].startswith(f"{missing}: cannot read: [Errno 2] No such file or directory")
    assert len(lines) == 5


def test_the_readme_example() -> None:
    readme = (Path(__file__).parents[2] / "mappings" / "README.md").read_text()
    section = readme[readme.index("## Declarative mappings (YAML)"):]
    start = section.index("```yaml\n") + 8
    example = section[start:section.index("```\n", start)]
    ms = MappingSet.from_text(example, "plant.yaml")
    msg = Message.text('{"temp": 21.1, "count": 5, "raw": "x"}', type="reading",
                       properties={"site": "s1", "dev": "d7", "debug": True})
    out = run(ms, msg, Destination.topic("sensors.hall.t"), protocol="mqtt", direction="in",
              transport="plant-broker")  # the first rule names its transport
    assert same_value(out.properties, {"device": "d7", "temp": Float32(21.1), "kind": "reading",
                                       "source": "plant-1"})
    assert same_value(out.body, {"temp": 21.1, "count": Int16(5), "meta": {"site": "s1"}})
    assert out.priority == 7
    back = run(ms, out, Destination.topic("sensors.hall.t"), protocol="stomp", direction="out")
    assert (back.body_kind, back.body) == (BodyKind.TEXT,
                                           '{"temp":21.1,"count":5,"meta":{"site":"s1"}}')
    assert ms.compile_for(Destination.topic("sensors.hall.t"), protocol="mqtt",
                          direction="in") is None  # not through that transport
    assert ms.compile_for(Destination.queue("sensors.hall.t"), protocol="mqtt", direction="in",
                          transport="plant-broker") is None
