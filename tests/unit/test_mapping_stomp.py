"""The default STOMP mapping (mappings/stomp.py), row by row of adapters/stomp/README.md."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import any_text, map_bodies, names, property_values, same_value, stream_bodies

from adapters.stomp.codec import Parser, encode
from gateway.errors import MessageFormatError
from gateway.message import BodyKind, DeliveryMode, Destination, Message
from gateway.types import Char, Float32, Int8, Int16, Int32, UInt16, UInt64
from mappings.stomp import OUT_HEADERS, message_to_stomp, stomp_to_message

Q = Destination.queue("orders")
NOW = 1_700_000_000_000


def send(headers: dict[str, str], body: bytes = b"", *, has_length: bool | None = None,
         reply_to: Destination | None = None) -> Message:
    if has_length is None:
        has_length = "content-length" in headers
    return stomp_to_message(headers, body, has_length=has_length, destination=Q,
                            reply_to=reply_to, now_ms=NOW)


def out(msg: Message, **kw: str | None) -> tuple[dict[str, str], list[tuple[str, str]], bytes]:
    headers, body = message_to_stomp(msg, destination=kw.get("destination", "/queue/orders") or "",
                                     reply_to=kw.get("reply_to"))
    return dict(headers), headers, body


def forward(msg: Message) -> Message:
    """core → MESSAGE → (a client forwarding the frame, parsed by the gateway) → core."""
    headers, body = message_to_stomp(msg, destination="/queue/orders", reply_to=None)
    frame = encode("SEND", headers + [("content-length", str(len(body)))], body)
    parsed = Parser()
    parsed.version = "1.2"
    (f,) = parsed.feed(frame)
    first: dict[str, str] = {}
    for n, v in f.headers:
        first.setdefault(n, v)
    return stomp_to_message(first, f.body, has_length=True, destination=Q, reply_to=None,
                            now_ms=NOW)


# -- SEND → core: body kinds ------------------------------------------------------------------


def test_no_content_type_and_no_length_is_text():
    m = send({"destination": "/queue/orders"}, b"hello")
    assert m.body_kind is BodyKind.TEXT and m.body == "hello"


def test_no_content_type_with_length_is_bytes_as_activemq_does():
    m = send({"destination": "/queue/orders", "content-length": "5"}, b"hello")
    assert m.body_kind is BodyKind.BYTES and m.body == b"hello"


def test_no_length_but_not_utf8_stays_bytes():
    m = send({}, b"\xff\xfe")
    assert m.body_kind is BodyKind.BYTES and m.body == b"\xff\xfe"


@pytest.mark.parametrize("ct", ["text/plain", "application/json", "application/xml;charset=utf-8",
                                "TEXT/HTML"])
def test_text_content_types_give_text_even_with_a_length(ct):
    m = send({"content-type": ct, "content-length": "3"}, "äb".encode())
    assert m.body_kind is BodyKind.TEXT and m.body == "äb"
    assert m.properties["JMS_GW_CONTENT_TYPE"] == ct


def test_the_gateway_default_text_type_is_not_kept_as_a_property():
    m = send({"content-type": "text/plain;charset=utf-8", "content-length": "2"}, b"hi")
    assert m.body_kind is BodyKind.TEXT and "JMS_GW_CONTENT_TYPE" not in m.properties


def test_text_content_type_with_bad_utf8_is_bytes():
    m = send({"content-type": "text/plain"}, b"\xc3")
    assert m.body_kind is BodyKind.BYTES and m.body == b"\xc3"


def test_other_content_type_is_bytes():
    m = send({"content-type": "image/png"}, b"\x89PNG")
    assert m.body_kind is BodyKind.BYTES and m.properties["JMS_GW_CONTENT_TYPE"] == "image/png"


def test_java_serialized_object_content_type_is_an_object_body():
    m = send({"content-type": "application/x-java-serialized-object"}, b"\xac\xed\x00\x05")
    assert m.body_kind is BodyKind.OBJECT and m.body == b"\xac\xed\x00\x05"
    assert "JMS_GW_CONTENT_TYPE" not in m.properties


def test_jms_byte_transformation_forces_bytes():
    m = send({"transformation": "jms-byte", "content-type": "text/plain"}, b"abc")
    assert m.body_kind is BodyKind.BYTES and m.body == b"abc"


def test_map_json_keeps_nesting_and_order():
    body = b'{"b":1,"a":{"x":[1,2.5,"s",null,true]},"c":"t"}'
    m = send({"transformation": "jms-map-json"}, body)
    assert m.body_kind is BodyKind.MAP
    assert list(m.body) == ["b", "a", "c"]
    assert m.body == {"b": 1, "a": {"x": [1, 2.5, "s", None, True]}, "c": "t"}


def test_json_integers_above_a_long_are_uint64():
    m = send({"transformation": "jms-stream-json"}, b'[18446744073709551615,{"a":[9223372036854775808]}]')
    assert type(m.body[0]) is UInt64 and m.body[0] == 2**64 - 1
    assert type(m.body[1]["a"][0]) is UInt64


def test_stream_json_and_jms_json_of_an_array():
    for t in ("jms-stream-json", "jms-json"):
        m = send({"transformation": t}, b'[1,{"a":[]},"x"]')
        assert m.body_kind is BodyKind.STREAM and m.body == [1, {"a": []}, "x"]
    m = send({"transformation": "jms-json"}, b'{"a":1}')
    assert m.body_kind is BodyKind.MAP


@pytest.mark.parametrize(("t", "body", "error"), [
    ("jms-map-json", b"[1]", "jms-map-json body must be an object"),
    ("jms-stream-json", b'{"a":1}', "jms-stream-json body must be an array"),
    ("jms-json", b'"s"', "jms-json body must be an object or array"),
    ("jms-map-json", b"{nope", "jms-map-json body is not JSON"),
    ("jms-map-json", b'{"a":NaN}', "jms-map-json body is not JSON"),
    ("jms-map-json", b'{"a":99999999999999999999}', "fits neither a long nor a uint64"),
    ("jms-stream-json", b'[-9223372036854775809]', "fits neither a long nor a uint64"),
    ("jms-object-json", b"{}", "unsupported transformation 'jms-object-json'"),
    ("jms-map-xml", b"<map><entry><string>a</string></entry></map>", "not an <entry> of two"),
    ("jms-map-xml", b"<string>a</string>", "must be a <map> or a <list>"),
    ("jms-map-xml", b'<!DOCTYPE m [<!ENTITY x "y">]><map/>', "DOCTYPE"),
])
def test_bad_json_bodies_are_refused(t, body, error):
    with pytest.raises(MessageFormatError, match=error):
        send({"transformation": t}, body)


# -- SEND → core: header fields -----------------------------------------------------------------


def test_jms_header_fields():
    rt = Destination.topic("replies")
    m = send({"persistent": "TRUE", "priority": "7", "expires": str(NOW + 5000),
              "correlation-id": "c-1", "type": "order", "AMQ_SCHEDULED_DELAY": "2500",
              "gw-trace-id": "t-9"}, b"x", reply_to=rt)
    assert m.delivery_mode is DeliveryMode.PERSISTENT
    assert m.priority == 7 and m.expiration == NOW + 5000
    assert m.correlation_id == "c-1" and m.type == "order" and m.reply_to == rt
    assert m.delivery_time == NOW + 2500 and m.trace_id == "t-9" and m.timestamp == NOW
    assert m.properties == {}


def test_defaults_are_non_persistent_priority_4_no_expiry():
    m = send({}, b"x")
    assert m.delivery_mode is DeliveryMode.NON_PERSISTENT
    assert m.priority == 4 and m.expiration == 0 and m.delivery_time == 0


@pytest.mark.parametrize(("headers", "error"), [
    ({"priority": "high"}, "priority must be a digit 0-9, not 'high'"),
    ({"priority": "10"}, "priority must be a digit"),
    ({"expires": "-1"}, "expires must be a number of milliseconds"),
    ({"expires": "soon"}, "expires must be a number"),
    ({"AMQ_SCHEDULED_DELAY": "1.5"}, "AMQ_SCHEDULED_DELAY must be a number"),
])
def test_bad_header_values_are_refused(headers, error):
    with pytest.raises(MessageFormatError, match=error):
        send(headers, b"x")


def test_other_headers_become_string_properties_and_stomp_ones_do_not():
    m = send({"destination": "/queue/orders", "receipt": "r", "transaction": "t",
              "message-id": "ID:old", "subscription": "s", "ack": "1", "redelivered": "true",
              "timestamp": "5", "colour": "red", "n": "5", "JMS_GW_CONTENT_TYPE": "forged"}, b"")
    assert m.properties == {"colour": "red", "n": "5"}


def test_gw_types_restores_types():
    m = send({"n": "5", "b": "-3", "ok": "true", "f": "0.1", "u": "65535", "c": "x",
              "gw-types": "n:int32,b:int8,ok:boolean,f:float32,u:uint16,c:char"}, b"")
    p = m.properties
    assert type(p["n"]) is Int32 and p["n"] == 5
    assert type(p["b"]) is Int8 and p["b"] == -3
    assert p["ok"] is True
    assert type(p["f"]) is Float32 and p["f"] == Float32(0.1)
    assert type(p["u"]) is UInt16 and p["u"] == 65535
    assert type(p["c"]) is Char and p["c"] == "x"


def test_correlation_id_marked_utf8bytes_or_bytes_comes_back_as_bytes():
    m = send({"correlation-id": "req-1", "gw-types": "correlation-id:utf8bytes"}, b"")
    assert m.correlation_id == b"req-1"
    m = send({"correlation-id": "/w8=", "gw-types": "correlation-id:bytes"}, b"")
    assert m.correlation_id == b"\xff\x0f"
    assert m.properties == {}


# -- core → MESSAGE ---------------------------------------------------------------------------


def test_text_message_headers_in_order():
    msg = Message("héllo", destination=Q, priority=6, timestamp=NOW, correlation_id="c",
                  type="t", properties={"colour": "red", "n": Int16(-2)}, expiration=NOW + 1)
    msg.trace_id = "tr"
    _, headers, body = out(msg, reply_to="/topic/r")
    assert body == "héllo".encode()
    assert headers == [
        ("destination", "/queue/orders"), ("content-type", "text/plain;charset=utf-8"),
        ("persistent", "true"), ("priority", "6"), ("timestamp", str(NOW)),
        ("expires", str(NOW + 1)), ("correlation-id", "c"), ("reply-to", "/topic/r"),
        ("type", "t"), ("colour", "red"), ("n", "-2"), ("gw-types", "n:int16"),
        ("gw-trace-id", "tr"),
    ]


def test_bytes_with_and_without_content_type():
    h, _, body = out(Message(b"\x00\x01", delivery_mode=DeliveryMode.NON_PERSISTENT))
    assert body == b"\x00\x01" and "content-type" not in h and "persistent" not in h
    h, _, _ = out(Message(b"x", properties={"JMS_GW_CONTENT_TYPE": "image/png"}))
    assert h["content-type"] == "image/png" and "JMS_GW_CONTENT_TYPE" not in h


def test_map_and_stream_bodies_are_json_with_a_transformation():
    h, _, body = out(Message({"a": Int8(1), "b": [1.5, "x", True], "c": {"d": None}}))
    assert body == b'{"a":1,"b":[1.5,"x",true],"c":{"d":null}}'
    assert h["transformation"] == "jms-map-json" and h["content-type"] == "application/json"
    h, _, body = out(Message([1, "two"], body_kind=BodyKind.STREAM))
    assert body == b'[1,"two"]' and h["transformation"] == "jms-stream-json"


def test_bytes_correlation_ids():
    h, _, _ = out(Message(b"", correlation_id=b"req-1"))
    assert h["correlation-id"] == "req-1" and h["gw-types"] == "correlation-id:utf8bytes"
    h, _, _ = out(Message(b"", correlation_id=b"\xff\x0f"))
    assert h["correlation-id"] == "/w8=" and h["gw-types"] == "correlation-id:bytes"


def test_properties_named_like_stomp_headers_are_not_sent():
    props = {name: "v" for name in OUT_HEADERS} | {"ok": "yes"}
    h, headers, _ = out(Message("", properties=props))
    names_sent = [n for n, _ in headers]
    assert names_sent.count("destination") == 1 and h["destination"] == "/queue/orders"
    assert h["ok"] == "yes" and "subscription" not in h and "receipt" not in h


def test_nul_and_surrogates_are_escaped_and_marked():
    h, _, _ = out(Message("", properties={"a\x00b": "x\ud800y"}))
    assert h["a%00b"] == "x%uD800y" and h["gw-types"] == "a%2500b:string:esc"


def test_an_escaped_trace_id_is_listed_in_gw_types_before_it():
    msg = Message("", properties={"n": Int32(1)})
    msg.trace_id = "t\x00"
    _, headers, _ = out(msg)
    assert headers[-2:] == [("gw-types", "n:int32,gw-trace-id:string:esc"),
                            ("gw-trace-id", "t%00")]
    assert forward(msg).trace_id == "t\x00"


# -- round trips --------------------------------------------------------------------------------


def test_every_header_field_survives_a_forwarding_stomp_client():
    msg = Message("t", destination=Q, priority=9, timestamp=NOW, correlation_id=b"\x00\xff",
                  type="ty\x00pe", expiration=NOW + 10,
                  properties={"i8": Int8(-8), "u16": UInt16(7), "f": Float32(1.5), "d": 0.1,
                              "n": None, "c": Char("z"), "s": "a:b\nc\\d", "l": 2**40,
                              "bool": False})
    back = forward(msg)
    assert back.correlation_id == b"\x00\xff" and back.type == "ty\x00pe"
    assert back.priority == 9 and back.expiration == NOW + 10
    assert back.delivery_mode is DeliveryMode.PERSISTENT
    assert back.body_kind is BodyKind.TEXT and back.body == "t"
    assert same_value(back.properties, msg.properties)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(names, property_values(), max_size=8), st.none() | any_text,
       st.none() | any_text)
def test_typed_properties_survive_core_stomp_core(props, msg_type, trace):
    props = {k: v for k, v in props.items() if k not in OUT_HEADERS}
    msg = Message(b"body", properties=props, type=msg_type)
    if trace is not None:
        msg.trace_id = trace
    back = forward(msg)
    assert same_value(back.properties, props)
    assert back.type == msg_type
    if trace is not None:
        assert back.trace_id == trace


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(map_bodies(), stream_bodies()))
def test_map_and_stream_json_is_what_a_json_reader_reads(body):
    kind = BodyKind.MAP if isinstance(body, dict) else BodyKind.STREAM
    h, _, payload = out(Message(body, body_kind=kind))
    parsed = json.loads(payload)
    assert isinstance(parsed, dict if kind is BodyKind.MAP else list)
    if isinstance(parsed, dict):
        assert list(parsed) == list(body)
    back = forward(Message(body, body_kind=kind))
    assert back.body_kind is kind
