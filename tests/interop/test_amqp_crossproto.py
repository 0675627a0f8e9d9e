"""AMQP 1.0 ↔ MQTT and AMQP 1.0 ↔ the core's JMS-style clients, through one gateway: each
field checked against the tables of ``mappings/README.md`` ("MQTT" and "AMQP 1.0").

How this works: paho-mqtt clients (``Client`` of test_mqtt_paho.py, MQTT 5 and 3.1.1) and
rhea (tests/peers/rhea/; receive.js prints every value with its AMQP type) talk to the same
gateway; the core's clients run on the gateway's loop through ``gw.call``, as in
test_mqtt_crossproto.py. An MQTT topic ``a/b`` is the gateway topic ``a.b``, which AMQP
addresses as ``topic://a.b``. Every expected value is a literal.
"""

from __future__ import annotations

import copy
import json
import subprocess
import time
from typing import Any

import proton
import pytest
from amqpclient import connect
from gw import GatewayThread
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from peers.rhea import RheaRun, finish_rhea, read_event, run_rhea, start_rhea, typed
from proton import UNDESCRIBED, Array, Data
from test_mqtt_paho import V5, V311, Client

from gateway.message import DeliveryMode, Destination, Message
from gateway.types import (
    BoolArray,
    Char,
    Float32,
    Float32Array,
    Float64Array,
    Int8,
    Int16,
    Int16Array,
    Int32,
    Int64Array,
    TypedArray,
    UInt16,
    UInt32,
    UInt64,
    UInt64Array,
)

STEP = 10  # the rhea scripts' own time limit (s); every step takes well under a second
BOTH = pytest.mark.parametrize("proto", [V311, V5], ids=["3.1.1", "5.0"])


@pytest.fixture
def gw(tmp_path):
    g = GatewayThread(tmp_path / "gw", gateway="listen = amqp://127.0.0.1:0\n"
                      "listen = mqtt://127.0.0.1:0\n").start()
    yield g
    g.stop()


# --- helpers ---------------------------------------------------------------------------------


def T(type_: str, value: Any, **extra: Any) -> dict[str, Any]:
    """An expected typed value, as receive.js prints it."""
    return {"type": type_, "value": value, **extra}


def S(text: str) -> dict[str, Any]:
    return T("string", text)


def M(**entries: Any) -> dict[str, Any]:
    """An expected map with string keys, in this order."""
    return T("map", [[S(k), v] for k, v in entries.items()])


def app_props(msg: dict[str, Any]) -> list[tuple[str, Any]]:
    """The application properties of a received message, in order."""
    return [(k["value"], v) for k, v in msg.get("application_properties", T("map", []))["value"]]


def annotations(msg: dict[str, Any]) -> dict[str, Any]:
    return {k["value"]: v for k, v in msg.get("message_annotations", T("map", []))["value"]}


@pytest.fixture
def listen(gw):  # type: ignore[no-untyped-def]
    """``listen(address, count, **spec)``: a rhea receiver on the gateway, attached when it
    returns; ``collect`` gets its messages. One still running when the test ends (it failed
    first) is stopped."""
    procs: list[subprocess.Popen[str]] = []

    def start(address: str, count: int, **spec: Any) -> subprocess.Popen[str]:
        p = start_rhea("receive", {"port": gw.port("amqp"), "address": address,
                                   "count": count, "timeout": STEP, **spec})
        procs.append(p)
        read_event(p, "attached")
        return p

    yield start
    for p in procs:
        stop_process(p)


def stop_process(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        p.kill()
    p.wait(10)
    for pipe in (p.stdout, p.stderr):
        if pipe is not None:
            pipe.close()


def collect(p) -> RheaRun:  # type: ignore[no-untyped-def]
    run = finish_rhea(p)
    assert run.returncode == 0, run
    return run


def send(port: int, address: str, *messages: dict[str, Any]) -> None:
    run = run_rhea("send", {"port": port, "address": address, "messages": list(messages),
                            "timeout": STEP})
    assert run.returncode == 0, run
    assert run.outcomes() == ["accepted"] * len(messages), run


def publish_props(**fields: Any) -> Properties:
    p = Properties(PacketTypes.PUBLISH)
    for name, value in fields.items():
        setattr(p, name, value)
    return p


def core_consumer(gw, dest: Destination, selector: str | None = None):  # type: ignore[no-untyped-def]
    return gw.call(lambda: gw.broker.connect().session().consumer(dest, selector=selector))


def core_send(gw, dest: Destination, *messages: Message) -> None:
    async def send_all() -> None:
        producer = gw.broker.connect().session().producer(dest)
        for m in messages:
            await producer.send_async(m)

    gw.call(send_all)


# --- MQTT → AMQP -----------------------------------------------------------------------------


def test_mqtt5_publish_reaches_an_amqp_receiver_field_by_field(gw, listen):
    rx = listen("topic://plant.line1.temp", 1)
    pub = Client(gw.port("mqtt"), "dev-5", V5)
    pub.pub("plant/line1/temp", "21.5", qos=1, props=publish_props(
        PayloadFormatIndicator=1, ContentType="text/plain; charset=utf-8",
        CorrelationData=b"\x00corr\xff", ResponseTopic="replies/dev-5",
        MessageExpiryInterval=60,
        UserProperty=[("unit", "C"), ("n", "7"), ("empty", ""), ("unit", "second value"),
                      ("gw-types", "n:int32"), ("JMSType", "reading"), ("JMSPriority", "7"),
                      ("gw-trace-id", "trace-mqtt-42")]))
    (m,) = collect(rx).messages()
    pub.close()
    # header: QoS 1 → PERSISTENT → durable; JMSPriority; expiry as ttl
    h = m["header"]
    assert {k: h[k] for k in h if k != "ttl"} == {
        "durable": T("boolean", True), "priority": T("ubyte", 7),
        "first_acquirer": T("boolean", True)}
    assert h["ttl"]["type"] == "uint" and 59000 <= h["ttl"]["value"] <= 60000
    p = m["properties"]
    assert p["message_id"]["type"] == "string" and p["message_id"]["value"].startswith("ID:")
    assert p["to"] == S("topic://plant.line1.temp")
    assert p["subject"] == S("reading")  # user property JMSType → JMSType → subject
    assert p["reply_to"] == S("topic://replies.dev-5")  # Response Topic → JMSReplyTo
    assert p["correlation_id"] == T("binary", "AGNvcnL/")  # correlation data, binary-safe
    assert p["content_type"] == T("symbol", "text/plain; charset=utf-8")
    assert p["absolute_expiry_time"]["value"] - p["creation_time"]["value"] == 60000
    assert set(p) == {"message_id", "to", "subject", "reply_to", "correlation_id",
                      "content_type", "absolute_expiry_time", "creation_time"}
    assert annotations(m) == {
        "x-opt-jms-msg-type": T("byte", 5), "x-opt-jms-dest": T("byte", 1),
        "x-opt-jms-reply-to": T("byte", 1), "x-opt-gw-trace-id": S("trace-mqtt-42")}
    # user properties in order, first value of a repeated name, typed by gw-types; the QoS
    # (and all of them, as sent, for MQTT 5 subscribers: the name "unit" repeats)
    assert app_props(m) == [("unit", S("C")), ("n", T("int", 7)), ("empty", S("")),
                            ("JMS_GW_MQTT_USER_PROPERTIES", S(
                                '[["unit","C"],["n","7"],["empty",""],["unit","second value"]]')),
                            ("JMS_GW_MQTT_PFI", T("byte", 1)), ("JMS_GW_MQTT_QOS", T("byte", 1))]
    assert m["body"] == {"section": "value", "value": S("21.5")}  # PFI 1 → TEXT


def test_mqtt311_publish_reaches_an_amqp_receiver_as_bytes(gw, listen):
    rx = listen("topic://plant.line2.raw", 1)
    pub = Client(gw.port("mqtt"), "dev-3", V311)
    pub.pub("plant/line2/raw", b"\x00\x01text?\xff", qos=0, retain=True)
    (m,) = collect(rx).messages()
    pub.close()
    assert m["header"] == {"first_acquirer": T("boolean", True)}  # QoS 0: not durable
    assert m["body"] == {"section": "data", "value": [T("binary", "AAF0ZXh0P/8=")]}
    assert annotations(m)["x-opt-jms-msg-type"] == T("byte", 3)
    assert app_props(m) == [("JMS_GW_MQTT_QOS", T("byte", 0)),
                            ("JMS_GW_MQTT_RETAIN", T("boolean", True))]
    assert set(m["properties"]) == {"message_id", "to", "creation_time"}


@BOTH
def test_mqtt_qos_becomes_amqp_durable(gw, proto, listen):
    rx = listen("topic://qos.check", 3)
    pub = Client(gw.port("mqtt"), "qos-pub", proto)
    for qos in (0, 1, 2):
        pub.pub("qos/check", f"q{qos}", qos=qos)
    got = collect(rx).messages()
    pub.close()
    # a non-persistent message may overtake persistent ones (JMS orders each mode by itself)
    seen = {}
    for m in got:
        (body,) = m["body"]["value"]
        seen[body["value"]] = (m["header"].get("durable"), dict(app_props(m))["JMS_GW_MQTT_QOS"])
    assert seen == {
        "cTA=": (None, T("byte", 0)),  # "q0": QoS 0 → NON_PERSISTENT → durable absent (false)
        "cTE=": (T("boolean", True), T("byte", 1)),
        "cTI=": (T("boolean", True), T("byte", 2)),
    }


# --- AMQP → MQTT -----------------------------------------------------------------------------

AMQP_REQUEST = {
    "body": "hello", "durable": True, "priority": 6, "ttl": 60000, "message_id": "mid-1",
    "subject": "greeting", "correlation_id": "corr-1", "reply_to": "topic://replies.amqp",
    "content_type": "text/plain",
    "application_properties": {"s": "str", "n": typed("int", -7), "ok": True,
                               "u": typed("ubyte", 200), "f": typed("float", 0.5)},
    "message_annotations": {"x-opt-gw-trace-id": "trace-amqp-1"},
}


def test_amqp_send_reaches_mqtt5_field_by_field(gw):
    sub = Client(gw.port("mqtt"), "sub-5", V5)
    sub.sub("orders/#", qos=2)
    send(gw.port("amqp"), "topic://orders.new", AMQP_REQUEST)
    m = sub.get()
    sub.close()
    assert (m.topic, m.qos, m.payload) == ("orders/new", 2, b"hello")  # durable → QoS 2
    p = m.properties
    assert p.PayloadFormatIndicator == 1  # amqp-value string → TEXT
    assert p.ContentType == "text/plain"
    assert p.ResponseTopic == "replies/amqp"
    assert p.CorrelationData == b"corr-1"
    assert 59 <= p.MessageExpiryInterval <= 60
    assert p.UserProperty == [
        ("s", "str"), ("n", "-7"), ("ok", "true"), ("u", "200"), ("f", "0.5"),
        ("JMSType", "greeting"), ("JMSPriority", "6"), ("JMSMessageID", "mid-1"),
        ("gw-types", "n:int32,ok:boolean,u:uint8,f:float32")]  # no trace id (delivery log)


def test_amqp_send_reaches_mqtt311_as_payload_and_qos(gw):
    sub = Client(gw.port("mqtt"), "sub-3", V311)
    sub.sub("orders/#", qos=2)
    send(gw.port("amqp"), "topic://orders.new", AMQP_REQUEST)
    m = sub.get()
    sub.close()
    assert (m.topic, m.qos, m.payload) == ("orders/new", 2, b"hello")
    assert m.properties is None  # MQTT 3.1.1 has nowhere to put the rest


@BOTH
@pytest.mark.parametrize(("durable", "granted", "qos"), [
    (True, 2, 2), (False, 2, 1), (True, 1, 1), (False, 0, 0)])
def test_amqp_durable_becomes_mqtt_qos(gw, proto, durable, granted, qos):
    sub = Client(gw.port("mqtt"), "qos-sub", proto)
    sub.sub("dur/check", qos=granted)
    send(gw.port("amqp"), "topic://dur.check", {"body": typed("binary", "AQI="),
                                                "durable": durable})
    m = sub.get()
    sub.close()
    assert (m.qos, m.payload) == (qos, b"\x01\x02")


def test_amqp_binary_correlation_id_and_bodies_reach_mqtt5(gw):
    sub = Client(gw.port("mqtt"), "sub-b", V5)
    sub.sub("bodies/#", qos=2)
    port = gw.port("amqp")
    send(port, "topic://bodies.bin", {"body": typed("binary", "AP8A"), "durable": True,
                                      "correlation_id": typed("binary", "AAH/")})
    send(port, "topic://bodies.map", {"durable": True, "body": {
        "a": typed("int", 1), "l": [typed("short", 2), "x", typed("double", 0.1)],
        "arr": typed("array", [1.5, 2], element_type="float"), "raw": typed("binary", "AP8=")}})
    send(port, "topic://bodies.data", {"durable": True, "body_section": "data",
                                       "body": typed("binary", "3q2+7w==")})
    first, second, third = sub.get(), sub.get(), sub.get()
    sub.close()
    assert (first.topic, first.payload) == ("bodies/bin", b"\x00\xff\x00")
    assert first.properties.CorrelationData == b"\x00\x01\xff"
    assert not hasattr(first.properties, "PayloadFormatIndicator")
    assert (second.topic, second.payload) == (
        "bodies/map", b'{"a":1,"l":[2,"x",0.1],"arr":[1.5,2.0],"raw":"AP8="}')
    assert second.properties.PayloadFormatIndicator == 1
    assert second.properties.ContentType == "application/json"
    assert (third.topic, third.payload) == ("bodies/data", b"\xde\xad\xbe\xef")


# the "Bodies" table of the AMQP mapping, then the MQTT "Body rules" (out)
AMQP_TO_MQTT_BODIES = [
    # id, what rhea sends, MQTT payload, payload format indicator, content type
    ("value-string", {"body": "grüße"}, "grüße".encode(), 1, None),
    ("data-json", {"body_section": "data", "body": '{"a":1}', "content_type": "application/json"},
     b'{"a":1}', 1, "application/json"),
    ("data-text-not-utf8", {"body_section": "data", "body": typed("binary", "//4="),
                            "content_type": "text/plain"}, b"\xff\xfe", None, "text/plain"),
    ("data", {"body_section": "data", "body": typed("binary", "AP8=")}, b"\x00\xff", None, None),
    ("data-msg-type-5", {"body_section": "data", "body": "héllo",
                         "message_annotations": {"x-opt-jms-msg-type": typed("byte", 5)}},
     "héllo".encode(), 1, None),
    ("value-binary", {"body": typed("binary", "AP8=")}, b"\x00\xff", None, None),
    ("value-map", {"body": {"k": typed("uint", 1), "s": [typed("short", -2)]}},
     b'{"k":1,"s":[-2]}', 1, "application/json"),
    ("sequence", {"body_section": "sequence", "body": [typed("long", 1), "x"]}, b'[1,"x"]', 1,
     "application/json"),
    ("value-list", {"body": [typed("short", 1), "x"]}, b'[1,"x"]', 1, "application/json"),
    ("value-ubyte", {"body": typed("ubyte", 5)}, b"[5]", 1, "application/json"),
    ("no-body", {}, b"", None, None),
]


@pytest.mark.parametrize(("sent", "payload", "pfi", "content_type"),
                         [row[1:] for row in AMQP_TO_MQTT_BODIES],
                         ids=[row[0] for row in AMQP_TO_MQTT_BODIES])
def test_amqp_body_reaches_mqtt5(gw, sent, payload, pfi, content_type):
    sub = Client(gw.port("mqtt"), "body-sub", V5)
    sub.sub("bodies/out", qos=1)
    send(gw.port("amqp"), "topic://bodies.out", sent)
    m = sub.get()
    sub.close()
    assert m.payload == payload
    assert getattr(m.properties, "PayloadFormatIndicator", None) == pfi
    assert getattr(m.properties, "ContentType", None) == content_type


# the MQTT "Body rules" (in), then the AMQP mapping's "Bodies" (out)
MQTT_TO_AMQP_BODIES = [
    # id, payload, PUBLISH properties, AMQP body, x-opt-jms-msg-type, content-type
    ("format-indicator", "grüße".encode(), {"PayloadFormatIndicator": 1},
     {"section": "value", "value": S("grüße")}, 5, None),
    ("json", b'{"a":1}', {"ContentType": "application/json"},
     {"section": "value", "value": S('{"a":1}')}, 5, T("symbol", "application/json")),
    ("charset", b"<x/>", {"ContentType": "application/xml; charset=UTF-8"},
     {"section": "value", "value": S("<x/>")}, 5, T("symbol", "application/xml; charset=UTF-8")),
    ("text-not-utf8", b"\xff\xfe", {"ContentType": "text/plain"},
     {"section": "data", "value": [T("binary", "//4=")]}, 3, T("symbol", "text/plain")),
    ("bytes", b"\x00\x01", {}, {"section": "data", "value": [T("binary", "AAE=")]}, 3, None),
    ("empty", b"", {}, {"section": "data", "value": [T("binary", "")]}, 3, None),
    ("empty-text", b"", {"PayloadFormatIndicator": 1}, {"section": "value", "value": S("")}, 5,
     None),
]


@pytest.mark.parametrize(("payload", "props", "body", "msg_type", "content_type"),
                         [row[1:] for row in MQTT_TO_AMQP_BODIES],
                         ids=[row[0] for row in MQTT_TO_AMQP_BODIES])
def test_mqtt5_body_reaches_amqp(gw, payload, props, body, msg_type, content_type, listen):
    rx = listen("topic://bodies.in", 1)
    pub = Client(gw.port("mqtt"), "body-pub", V5)
    pub.pub("bodies/in", payload, qos=1, props=publish_props(**props) if props else None)
    (m,) = collect(rx).messages()
    pub.close()
    assert m["body"] == body
    assert annotations(m)["x-opt-jms-msg-type"] == T("byte", msg_type)
    assert m["properties"].get("content_type") == content_type


@pytest.mark.parametrize(("message_id", "correlation_id", "mqtt_id", "correlation_data"), [
    (typed("uuid", "0123abcd-0000-4000-8000-00000000abcd"), typed("ulong", 5),
     "ID:AMQP_UUID:0123abcd-0000-4000-8000-00000000abcd", b"ID:AMQP_ULONG:5"),
    (typed("ulong", 7), typed("uuid", "0123abcd-0000-4000-8000-00000000abcd"),
     "ID:AMQP_ULONG:7", b"ID:AMQP_UUID:0123abcd-0000-4000-8000-00000000abcd"),
    (typed("binary", "AAH/"), typed("binary", "AAH/"), "ID:AMQP_BINARY:0001FF", b"\x00\x01\xff"),
    ("ID:AMQP_ULONG:5", "ID:AMQP_ULONG:5", "ID:AMQP_STRING:ID:AMQP_ULONG:5",
     b"ID:AMQP_STRING:ID:AMQP_ULONG:5"),
    ("plain", "ré-1", "plain", "ré-1".encode()),
], ids=["uuid-ulong", "ulong-uuid", "binary", "string-like-an-encoding", "string"])
def test_amqp_ids_reach_mqtt5(gw, message_id, correlation_id, mqtt_id, correlation_data):
    """Table "Message and correlation ids": JMSMessageID goes as a user property, the
    JMSCorrelationID as correlation data (a string as its UTF-8 bytes)."""
    sub = Client(gw.port("mqtt"), "ids-sub", V5)
    sub.sub("ids/check", qos=1)
    send(gw.port("amqp"), "topic://ids.check", {"body": "x", "message_id": message_id,
                                                "correlation_id": correlation_id})
    m = sub.get()
    sub.close()
    assert dict(m.properties.UserProperty)["JMSMessageID"] == mqtt_id
    assert m.properties.CorrelationData == correlation_data


def test_amqp_expiry_reply_to_and_priority_reach_mqtt5(gw):
    sub = Client(gw.port("mqtt"), "hdr-sub", V5)
    sub.sub("hdr/check", qos=1)
    now = int(time.time() * 1000)
    # absolute-expiry-time wins over ttl; a priority above 9 is 9 plus the original
    send(gw.port("amqp"), "topic://hdr.check", {
        "body": "x", "ttl": 60000, "absolute_expiry_time": now + 30000,
        "reply_to": "queue://q.replies", "priority": 200})
    m = sub.get()
    sub.close()
    assert 28 <= m.properties.MessageExpiryInterval <= 30
    assert m.properties.ResponseTopic == "q/replies"  # the topic rendering of the destination
    props = m.properties.UserProperty
    assert dict(props)["JMSPriority"] == "9"
    assert dict(props)["JMS_GW_AMQP_PRIORITY"] == "200"
    assert dict(props)["gw-types"] == "JMS_GW_AMQP_PRIORITY:uint8"


def test_amqp_types_survive_an_mqtt5_client_that_republishes(gw, listen):
    """An MQTT 5 client that forwards what it got (payload and user properties) hands the
    AMQP types back: ``JMS_GW_AMQP_TYPES`` and ``gw-types`` travel as user properties."""
    port = gw.port("amqp")
    relay = Client(gw.port("mqtt"), "relay", V5)
    relay.sub("relay/in", qos=1)
    rx = listen("topic://relay.out", 1)
    send(port, "topic://relay.in", {"body": "x", "application_properties": {
        "ts": typed("timestamp", 1700000000000), "sym": typed("symbol", "s"),
        "id": typed("uuid", "0123abcd-0000-4000-8000-00000000abcd"), "n": typed("ubyte", 200)}})
    got = relay.get()
    assert got.properties.UserProperty[:5] == [
        ("ts", "1700000000000"), ("sym", "s"), ("id", "0123abcd-0000-4000-8000-00000000abcd"),
        ("n", "200"), ("JMS_GW_AMQP_TYPES", '[["ts","timestamp"],["sym","symbol"],["id","uuid"]]')]
    relay.pub("relay/out", got.payload, qos=1, props=publish_props(
        UserProperty=got.properties.UserProperty))
    (m,) = collect(rx).messages()
    relay.close()
    props = dict(app_props(m))
    assert props["ts"] == T("timestamp", 1700000000000)
    assert props["sym"] == T("symbol", "s")
    assert props["id"] == T("uuid", "0123abcd-0000-4000-8000-00000000abcd")
    assert props["n"] == T("ubyte", 200)
    assert "JMS_GW_AMQP_TYPES" not in props


BYTES_PROPERTY_BUG = (
    "an AMQP binary or decimal application property is a core `bytes` property (AMQP "
    "mapping, 'Value types'), but the MQTT mapping has no `bytes` row (mappings/mqtt.py: "
    "'bytes: not a legal property value'): message_to_mqtt writes str(value), the Python "
    "repr (binary AP8= goes out as the user property text \"b'\\x00\\xff'\", with no "
    "gw-types entry), and a republished copy comes back as that string, not as the binary"
)



@pytest.mark.parametrize("value", [
    typed("binary", "AP8="), typed("decimal32", "22000001")], ids=["binary", "decimal32"])
def test_amqp_bytes_property_survives_an_mqtt5_client_that_republishes(gw, listen, value):
    """mappings/README.md (MQTT, core → MQTT): "nothing of a JMS message is silently lost on
    the way to an MQTT 5 subscriber … a message that goes core → MQTT 5 → core comes back
    with the same properties (names, order, values and types)"."""
    port = gw.port("amqp")
    relay = Client(gw.port("mqtt"), "relay-b", V5)
    try:
        relay.sub("relay/in", qos=1)
        rx = listen("topic://relay.out", 1)
        send(port, "topic://relay.in", {"body": "x", "application_properties": {"v": value}})
        got = relay.get()
        text = dict(got.properties.UserProperty)["v"]
        relay.pub("relay/out", got.payload, qos=1, props=publish_props(
            UserProperty=got.properties.UserProperty))
        (m,) = collect(rx).messages()
    finally:
        relay.close()
    assert not text.startswith("b'"), f"a Python repr on the wire: {text!r}"
    assert dict(app_props(m))["v"] == T(value["type"], value["value"])


@pytest.mark.parametrize(("value", "json_text"), [
    ({"k": 1}, '{"k":1}'), ([1, "x"], '[1,"x"]'),
    (typed("array", [1, 2], element_type="short"), "[1,2]")], ids=["map", "list", "array"])
def test_amqp_compound_property_reaches_mqtt5_as_json_or_is_refused(gw, value, json_text):
    sub = Client(gw.port("mqtt"), "compound-sub", V5)
    try:
        sub.sub("compound/prop", qos=1)
        run = run_rhea("send", {"port": gw.port("amqp"), "address": "topic://compound.prop",
                                "timeout": STEP, "messages": [
                                    {"body": "x", "application_properties": {"v": value}}]})
        assert run.returncode == 0, run
        if run.outcomes() == ["rejected"]:
            assert sub.none(0.5)
        else:
            m = sub.get()
            assert dict(m.properties.UserProperty)["v"] == json_text
    finally:
        sub.close()


# --- trace id --------------------------------------------------------------------------------


def test_trace_id_is_carried_between_amqp_mqtt_and_the_core(gw, listen):
    port = gw.port("amqp")
    core = core_consumer(gw, Destination.topic("trace.>"))
    sub = Client(gw.port("mqtt"), "trace-sub", V5)
    sub.sub("trace/#", qos=1)
    rx = listen("topic://trace.>", 2)
    # AMQP → core and MQTT
    send(port, "topic://trace.a", {"body": "from amqp",
                                   "message_annotations": {"x-opt-gw-trace-id": "t-amqp"}})
    d = gw.call(lambda: core.receive(5))
    assert (d.msg.body, d.msg.trace_id) == ("from amqp", "t-amqp")
    m = sub.get()
    assert "gw-trace-id" not in dict(m.properties.UserProperty)  # in the delivery log only
    # MQTT → core and AMQP
    pub = Client(gw.port("mqtt"), "trace-pub", V5)
    pub.pub("trace/b", "from mqtt", qos=1, props=publish_props(
        UserProperty=[("gw-trace-id", "t-mqtt")]))
    d = gw.call(lambda: core.receive(5))
    assert (d.msg.body, d.msg.trace_id) == (b"from mqtt", "t-mqtt")
    first, second = collect(rx).messages()
    assert annotations(first)["x-opt-gw-trace-id"] == S("t-amqp")
    assert annotations(second)["x-opt-gw-trace-id"] == S("t-mqtt")
    assert "gw-trace-id" not in dict(app_props(second))  # the trace id is not a property
    pub.close()
    sub.close()


# --- map and stream bodies -------------------------------------------------------------------

CORE_MAP = {
    "line": "L1", "count": Int32(7), "ratio": Float32(0.1), "big": UInt64(2**64 - 1),
    "flag": True, "letter": Char("x"), "raw": b"\x00\xff", "none": None,
    "nested": {"series": Int16Array([1, -2, 3]), "weights": Float32Array([1.5, 0.25]),
               "deeper": {"ids": UInt64Array([0, 2**64 - 1]), "on": BoolArray([True, False])}},
    "list": [Int8(-1), "a", [UInt16(65535), Float64Array([0.5])]],
}
# what an AMQP receiver must see (mappings/README.md, "Value types")
WIRE_MAP = M(
    line=S("L1"), count=T("int", 7), ratio=T("float", 0.10000000149011612),
    big=T("ulong", 18446744073709551615), flag=T("boolean", True), letter=T("char", "x"),
    raw=T("binary", "AP8="), none=T("null", None),
    nested=M(series=T("array", [T("short", 1), T("short", -2), T("short", 3)],
                      element_type="short"),
             weights=T("array", [T("float", 1.5), T("float", 0.25)], element_type="float"),
             deeper=M(ids=T("array", [T("ulong", 0), T("ulong", 18446744073709551615)],
                            element_type="ulong"),
                      on=T("array", [T("boolean", True), T("boolean", False)],
                           element_type="boolean"))),
    list=T("list", [T("byte", -1), S("a"), T("list", [
        T("ushort", 65535), T("array", [T("double", 0.5)], element_type="double")])]),
)
CORE_STREAM = [
    Int16(5), "two", Int64Array([-(2**63), 1]),
    {"k": UInt32(4000000000), "arr": Float64Array([1e300, -0.0])},
    [Char("é"), b"\x01"], Float32(-0.5), None,
]
WIRE_STREAM = [
    T("short", 5), S("two"),
    T("array", [T("long", -9223372036854775808), T("long", 1)], element_type="long"),
    M(k=T("uint", 4000000000),
      arr=T("array", [T("double", 1e300), T("double", -0.0)], element_type="double")),
    T("list", [T("char", "é"), T("binary", "AQ==")]), T("float", -0.5), T("null", None),
]


def shape(v: Any) -> Any:
    """A core value as (type name, value), all the way down: the widths count."""
    if isinstance(v, dict):
        return ("dict", {k: shape(x) for k, x in v.items()})
    if isinstance(v, TypedArray):
        return (v.NAME, [shape(x) for x in v])
    if isinstance(v, list):
        return ("list", [shape(x) for x in v])
    return (type(v).__name__, v)


# the core's view of CORE_MAP and CORE_STREAM, written out
CORE_MAP_SHAPE = ("dict", {
    "line": ("str", "L1"), "count": ("Int32", 7), "ratio": ("Float32", 0.10000000149011612),
    "big": ("UInt64", 18446744073709551615), "flag": ("bool", True), "letter": ("Char", "x"),
    "raw": ("bytes", b"\x00\xff"), "none": ("NoneType", None),
    "nested": ("dict", {
        "series": ("int16[]", [("Int16", 1), ("Int16", -2), ("Int16", 3)]),
        "weights": ("float32[]", [("Float32", 1.5), ("Float32", 0.25)]),
        "deeper": ("dict", {
            "ids": ("uint64[]", [("UInt64", 0), ("UInt64", 18446744073709551615)]),
            "on": ("boolean[]", [("bool", True), ("bool", False)])})}),
    "list": ("list", [("Int8", -1), ("str", "a"), ("list", [
        ("UInt16", 65535), ("float64[]", [("float", 0.5)])])]),
})
CORE_STREAM_SHAPE = ("list", [
    ("Int16", 5), ("str", "two"), ("int64[]", [("Int64", -(2**63)), ("Int64", 1)]),
    ("dict", {"k": ("UInt32", 4000000000),
              "arr": ("float64[]", [("float", 1e300), ("float", -0.0)])}),
    ("list", [("Char", "é"), ("bytes", b"\x01")]), ("Float32", -0.5), ("NoneType", None),
])


def test_the_expected_core_shapes_describe_the_core_values():
    """The literals above and the core values say the same (so the tests below that send one
    and expect the other check the gateway, not a typo)."""
    assert shape(CORE_MAP) == CORE_MAP_SHAPE
    assert shape(CORE_STREAM) == CORE_STREAM_SHAPE


def test_core_map_and_stream_reach_an_amqp_receiver_unchanged(gw, listen):
    rx = listen("topic://reports.daily", 2)
    core_send(gw, Destination.topic("reports.daily"),
              Message.map(copy.deepcopy(CORE_MAP), properties={"shift": Int32(3)}, type="daily"),
              Message.stream(copy.deepcopy(CORE_STREAM)))
    as_map, as_stream = collect(rx).messages()
    assert as_map["body"] == {"section": "value", "value": WIRE_MAP}
    assert annotations(as_map)["x-opt-jms-msg-type"] == T("byte", 2)
    assert as_map["properties"]["subject"] == S("daily")
    assert app_props(as_map) == [("shift", T("int", 3))]
    # STREAM → one amqp-sequence section, msg-type 4 (as Qpid JMS sends a StreamMessage)
    assert as_stream["body"] == {"section": "sequence", "value": [T("list", WIRE_STREAM)]}
    assert annotations(as_stream)["x-opt-jms-msg-type"] == T("byte", 4)
    assert app_props(as_stream) == []


def _arr(code: int, *items: Any) -> Array:
    return Array(UNDESCRIBED, code, *items)


# CORE_MAP as python-qpid-proton writes it
PROTON_MAP = {
    "line": "L1", "count": proton.int32(7), "ratio": proton.float32(0.1),
    "big": proton.ulong(2**64 - 1), "flag": True, "letter": proton.char("x"),
    "raw": b"\x00\xff", "none": None,
    "nested": {"series": _arr(Data.SHORT, proton.short(1), proton.short(-2), proton.short(3)),
               "weights": _arr(Data.FLOAT, proton.float32(1.5), proton.float32(0.25)),
               "deeper": {"ids": _arr(Data.ULONG, proton.ulong(0), proton.ulong(2**64 - 1)),
                          "on": _arr(Data.BOOL, True, False)}},
    "list": [proton.byte(-1), "a", [proton.ushort(65535), _arr(Data.DOUBLE, 0.5)]],
}
# CORE_STREAM as rhea writes it (one amqp-sequence section)
RHEA_STREAM = [
    typed("short", 5), "two",
    typed("array", [str(-(2**63)), 1], element_type="long"),
    {"k": typed("uint", 4000000000), "arr": typed("array", [1e300, -0.0],
                                                  element_type="double")},
    [typed("char", "é"), typed("binary", "AQ==")], typed("float", -0.5), None,
]


def test_amqp_map_and_stream_survive_amqp_core_amqp(gw, listen):
    port = gw.port("amqp")
    core = core_consumer(gw, Destination.topic("bodies.amqp"))
    rx = listen("topic://bodies.amqp", 2)
    c = connect(port)
    try:
        c.create_sender("topic://bodies.amqp").send(
            proton.Message(body=PROTON_MAP, durable=True))
    finally:
        c.close()
    send(port, "topic://bodies.amqp", {"body_section": "sequence", "body": RHEA_STREAM,
                                       "durable": True})
    as_map, as_stream = collect(rx).messages()
    assert as_map["body"] == {"section": "value", "value": WIRE_MAP}
    assert annotations(as_map)["x-opt-jms-msg-type"] == T("byte", 2)
    assert as_stream["body"] == {"section": "sequence", "value": [T("list", WIRE_STREAM)]}
    assert annotations(as_stream)["x-opt-jms-msg-type"] == T("byte", 4)
    assert app_props(as_map) == app_props(as_stream) == []
    # the core saw the JMS bodies with their widths
    first, second = gw.call(lambda: core.receive(5)), gw.call(lambda: core.receive(5))
    assert first.msg.body_kind.name == "MAP" and shape(first.msg.body) == CORE_MAP_SHAPE
    assert second.msg.body_kind.name == "STREAM" and shape(second.msg.body) == CORE_STREAM_SHAPE


def test_core_map_reaches_an_amqp_receiver_and_mqtt_as_json(gw, listen):
    rx = listen("topic://reports.json", 1)
    sub = Client(gw.port("mqtt"), "json-sub", V5)
    sub.sub("reports/json", qos=1)
    core_send(gw, Destination.topic("reports.json"), Message.map(copy.deepcopy(CORE_MAP)))
    (m,) = collect(rx).messages()
    assert m["body"] == {"section": "value", "value": WIRE_MAP}
    got = sub.get()
    sub.close()
    assert json.loads(got.payload) == {
        "line": "L1", "count": 7, "ratio": 0.1, "big": 18446744073709551615, "flag": True,
        "letter": "x", "raw": "AP8=", "none": None,
        "nested": {"series": [1, -2, 3], "weights": [1.5, 0.25],
                   "deeper": {"ids": [0, 18446744073709551615], "on": [True, False]}},
        "list": [-1, "a", [65535, [0.5]]]}


# --- selectors -------------------------------------------------------------------------------


def test_core_selector_on_amqp_application_properties(gw):
    core = core_consumer(gw, Destination.topic("sel.core"),
                         "region = 'eu' AND level > 2 AND small = 200 AND JMSType = 'r'")
    send(gw.port("amqp"), "topic://sel.core", *[
        {"body": body, "durable": True, "subject": subject, "application_properties": {
            "region": region, "level": level, "small": typed("ubyte", 200)}}
        for body, subject, region, level in [
            ("low", "r", "eu", typed("int", 1)),
            ("us", "r", "us", typed("int", 5)),
            ("match-1", "r", "eu", typed("int", 5)),
            ("other-type", "x", "eu", typed("int", 9)),
            ("match-2", "r", "eu", typed("long", 3)),
        ]])
    first = gw.call(lambda: core.receive(5))
    second = gw.call(lambda: core.receive(5))
    assert gw.call(lambda: core.receive(0.3)) is None
    assert (first.msg.body, second.msg.body) == ("match-1", "match-2")
    assert shape(first.msg.properties) == ("dict", {
        "region": ("str", "eu"), "level": ("Int32", 5), "small": ("UInt8", 200)})
    assert shape(second.msg.properties) == ("dict", {
        "region": ("str", "eu"), "level": ("int", 3), "small": ("UInt8", 200)})
    assert first.msg.type == "r" and first.msg.delivery_mode == DeliveryMode.PERSISTENT


def test_amqp_selector_on_mqtt5_user_properties(gw, listen):
    rx = listen("topic://plant.*.temp", 2,
                selector="unit = 'C' AND reading > 20 AND JMS_GW_MQTT_QOS = 1")
    pub = Client(gw.port("mqtt"), "sensor", V5)
    for topic, body, unit, reading, qos in [
        ("plant/line1/temp", "f", "F", "30", 1),
        ("plant/line1/temp", "cold", "C", "19.5", 1),
        ("plant/line1/temp", "qos0", "C", "30", 0),
        ("plant/line1/temp", "d", "C", "21.5", 1),
        ("plant/line2/temp", "e", "C", "25", 1),
    ]:
        pub.pub(topic, body, qos=qos, props=publish_props(
            ContentType="text/plain", UserProperty=[
                ("unit", unit), ("reading", reading), ("gw-types", "reading:float64")]))
    got = collect(rx).messages()
    pub.close()
    assert [m["body"]["value"] for m in got] == [S("d"), S("e")]
    assert [app_props(m) for m in got] == [
        [("unit", S("C")), ("reading", T("double", 21.5)), ("JMS_GW_MQTT_QOS", T("byte", 1))],
        [("unit", S("C")), ("reading", T("double", 25.0)), ("JMS_GW_MQTT_QOS", T("byte", 1))]]
    assert [m["properties"]["to"] for m in got] == [
        S("topic://plant.line1.temp"), S("topic://plant.line2.temp")]


# --- request/reply ---------------------------------------------------------------------------


def test_mqtt5_request_answered_by_an_amqp_responder(gw):
    server = connect(gw.port("amqp"))
    requests = server.create_receiver("topic://svc.upper", credit=10)
    req = Client(gw.port("mqtt"), "requester", V5)
    req.sub("replies/requester", qos=1)
    req.pub("svc/upper", "ping", qos=1, props=publish_props(
        ResponseTopic="replies/requester", CorrelationData=b"\x00id-7"))
    m = requests.receive(timeout=5)
    requests.accept()
    assert m.reply_to == "topic://replies.requester"
    assert bytes(m.correlation_id) == b"\x00id-7"
    assert m.body == b"ping"  # no format indicator, no content type: BYTES
    # (proton's Message drops a memoryview correlation id when encoding: give it bytes)
    server.create_sender(m.reply_to).send(proton.Message(
        body="PONG", correlation_id=bytes(m.correlation_id),
        properties={"status": proton.ubyte(200)}))
    reply = req.get()
    req.close()
    server.close()
    assert (reply.topic, reply.payload) == ("replies/requester", b"PONG")
    assert reply.properties.CorrelationData == b"\x00id-7"
    assert dict(reply.properties.UserProperty)["status"] == "200"
    assert dict(reply.properties.UserProperty)["gw-types"] == "status:uint8"


def test_amqp_request_with_a_dynamic_queue_answered_by_an_mqtt5_responder(gw):
    responder = Client(gw.port("mqtt"), "responder", V5)
    p = None
    try:
        responder.sub("svc/lower", qos=1)
        p = start_rhea("request", {"port": gw.port("amqp"), "address": "topic://svc.lower",
                                   "timeout": 3, "message": {"body": "PING",
                                                             "correlation_id": "c-9"}})
        reply_to = read_event(p, "reply_to")["address"]
        assert reply_to.startswith("queue://$TMP$.gateway.")
        m = responder.get()
        assert m.properties.CorrelationData == b"c-9"
        responder.pub(m.properties.ResponseTopic, m.payload.lower(), qos=1, props=publish_props(
            CorrelationData=m.properties.CorrelationData))
        run = finish_rhea(p)
    finally:
        responder.close()
        if p is not None:
            stop_process(p)
    assert run.returncode == 0, run
    (reply,) = run.messages()
    assert reply["properties"]["correlation_id"] == T("binary", "Yy05")  # b"c-9"
    assert reply["body"] == {"section": "data", "value": [T("binary", "cGluZw==")]}  # b"ping"
