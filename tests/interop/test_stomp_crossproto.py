"""STOMP ↔ MQTT 5, STOMP ↔ AMQP 1.0 and STOMP ↔ the core's JMS-style clients through one
gateway, field by field: the rows of ``mappings/stomp.py`` (SEND → core, core → MESSAGE) met
with the MQTT and AMQP tables of ``mappings/README.md``.

How this works. One gateway listens for STOMP, MQTT and AMQP on loopback ports. The STOMP side
is :class:`test_stomp_errors.RawStomp` (literal frames in, frames parsed back), the MQTT side
paho-mqtt (``Client`` of test_mqtt_paho.py), the AMQP side python-qpid-proton's blocking API
(amqpclient.py), and the core's clients run on the gateway's loop through ``gw.call``. A STOMP
destination ``/topic/a.b`` is the gateway topic ``a.b``, the MQTT topic ``a/b`` and the AMQP
address ``topic://a.b``. Every expected value is a literal; values the gateway makes up (a
message id, a trace id, a timestamp) are checked by form or against each other.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Iterator
from typing import Any

import cproton
import proton
import pytest
from amqpclient import connect
from gw import GatewayThread, wait_for
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from test_mqtt_paho import V5, Client
from test_stomp_errors import Frame, RawStomp, frame
from transportlog import log_records

from gateway.message import DeliveryMode, Destination, Message
from gateway.types import Char, Float32, Int8, Int16, Int32, Int64, UInt16


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    g = GatewayThread(tmp_path_factory.mktemp("stomp-cross") / "gw",
                      gateway="listen = stomp://127.0.0.1:0\nlisten = mqtt://127.0.0.1:0\n"
                              "listen = amqp://127.0.0.1:0\n").start()
    yield g
    g.stop()


@pytest.fixture
def stomp(gw: GatewayThread) -> Iterator[Any]:
    """``stomp(version="1.2")``: a connected RawStomp; all are closed after the test."""
    made: list[RawStomp] = []

    def make(version: str = "1.2") -> RawStomp:
        c = RawStomp(gw.port("stomp"))
        made.append(c)
        c.connect(version)
        return c

    yield make
    for c in made:
        c.close()


@pytest.fixture
def mqtt(gw: GatewayThread) -> Iterator[Any]:
    """``mqtt(client_id)``: a connected MQTT 5 paho client; all are closed after the test."""
    made: list[Client] = []

    def make(cid: str) -> Client:
        c = Client(gw.port("mqtt"), cid, V5)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


@pytest.fixture
def amqp(gw: GatewayThread) -> Iterator[Any]:
    c = connect(gw.port("amqp"))
    yield c
    c.close()


@pytest.fixture
def core(gw: GatewayThread) -> Iterator[Any]:
    """``core()``: a connection of the core's client API, made on the gateway's loop and
    closed after the test (use it on the loop too, through ``gw.call``)."""
    made: list[Any] = []

    def make() -> Any:
        conn = gw.call(lambda: gw.broker.connect())
        made.append(conn)
        return conn

    yield make
    for conn in made:
        gw.call(conn.close)


def subscribe(c: RawStomp, destination: str, sid: str = "1", **headers: str) -> None:
    c.request(frame("SUBSCRIBE", {"id": sid, "destination": destination, **headers,
                                  "receipt": "sub-" + sid}), "sub-" + sid)


def send(c: RawStomp, headers: dict[str, str] | list[tuple[str, str]], body: bytes) -> None:
    """A SEND with a receipt, waited for."""
    items = list(headers.items()) if isinstance(headers, dict) else list(headers)
    c.request(frame("SEND", [*items, ("receipt", "snd")], body), "snd")


def publish_props(**fields: Any) -> Properties:
    p = Properties(PacketTypes.PUBLISH)
    for name, value in fields.items():
        setattr(p, name, value)
    return p


def without(headers: list[tuple[str, str]], *names: str) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers if k not in names]


def forwarded(m: Frame, destination: str, *, length: bool = False) -> list[tuple[str, str]]:
    """The headers of a SEND that forwards MESSAGE ``m`` to ``destination`` as it came: all
    but the delivery's own and ``content-length``, which ``length=True`` sends again (a body
    with neither a content-type nor a content-length is text, ActiveMQ's rule, so a forwarder
    of a bytes body must keep its length)."""
    headers = [("destination", destination)] + without(
        m.headers, "subscription", "message-id", "ack", "destination", "content-length")
    if length:
        headers.append(("content-length", str(len(m.body))))
    return headers


def now_ms() -> int:
    return int(time.time() * 1000)


def is_message_id(text: str) -> bool:
    return text.startswith("ID:gateway.")


def is_trace_id(text: str) -> bool:
    return text.startswith("gateway-") and ":" in text


# --- STOMP → MQTT 5 ---------------------------------------------------------------------------


def test_stomp_text_send_reaches_mqtt5_field_by_field(gw, stomp, mqtt):
    sub = mqtt("s2m-text")
    sub.sub("s2m/#", qos=2)
    c = stomp()
    expires = now_ms() + 60000
    send(c, [("destination", "/topic/s2m.text"), ("content-type", "text/plain"),
             ("persistent", "true"), ("x-custom", "hello"), ("n", "5"), ("on", "true"),
             ("gw-types", "n:int32,on:boolean"), ("correlation-id", "c-1"),
             ("reply-to", "/queue/replies.x"), ("expires", str(expires)), ("type", "greeting"),
             ("priority", "7")], b"hi there")
    m = sub.get()
    assert (m.topic, m.qos, m.payload) == ("s2m/text", 2, b"hi there")  # persistent → QoS 2
    p = m.properties
    assert p.PayloadFormatIndicator == 1  # TEXT
    assert p.ContentType == "text/plain"
    assert p.CorrelationData == b"c-1"
    assert p.ResponseTopic == "replies/x"  # the queue replies.x, rendered as a topic
    assert 58 <= p.MessageExpiryInterval <= 60
    props = p.UserProperty
    assert props[:5] == [("x-custom", "hello"), ("n", "5"), ("on", "true"),
                         ("JMSType", "greeting"), ("JMSPriority", "7")]
    assert props[5][0] == "JMSMessageID" and is_message_id(props[5][1])
    assert props[6] == ("gw-types", "n:int32,on:boolean")  # the STOMP sender's types
    assert len(props) == 7  # no trace id: it is in the delivery log (mappings/README.md)


# (id, SEND headers after the destination, body, payload format indicator, content type)
STOMP_TO_MQTT_BODIES = [
    ("text-plain", {"content-type": "text/plain"}, b"t", 1, "text/plain"),
    ("json", {"content-type": "application/json"}, b'{"a":1}', 1, "application/json"),
    ("no-headers-is-text", {}, "grüße".encode(), 1, None),  # ActiveMQ: no length → text
    ("content-length-is-bytes", {"content-length": "3"}, b"\x00\x01\x02", None, None),
    ("octet-stream", {"content-type": "application/octet-stream"}, b"\xff", None,
     "application/octet-stream"),
    ("text-not-utf8", {"content-type": "text/plain", "content-length": "2"}, b"\xff\xfe", None,
     "text/plain"),
    ("jms-byte", {"content-type": "text/plain", "transformation": "jms-byte"}, b"abc", None,
     "text/plain"),
    ("map-json", {"transformation": "jms-map-json"}, b'{"b":[1,"x"]}', 1, "application/json"),
]


@pytest.mark.parametrize(("headers", "body", "pfi", "content_type"),
                         [row[1:] for row in STOMP_TO_MQTT_BODIES],
                         ids=[row[0] for row in STOMP_TO_MQTT_BODIES])
def test_stomp_body_reaches_mqtt5(gw, stomp, mqtt, headers, body, pfi, content_type):
    sub = mqtt("s2m-body")
    sub.sub("s2m/body", qos=2)
    send(stomp(), {"destination": "/topic/s2m.body", **headers}, body)
    m = sub.get()
    assert m.payload == body
    assert m.qos == 1  # not persistent → QoS 1
    assert getattr(m.properties, "PayloadFormatIndicator", None) == pfi
    assert getattr(m.properties, "ContentType", None) == content_type
    names = [k for k, _ in m.properties.UserProperty]
    assert names == ["JMSMessageID"]  # nothing else was sent


@pytest.mark.parametrize(("reply_to", "topic"), [
    ("/queue/replies.q", "replies/q"), ("/topic/a.b.c", "a/b/c")])
def test_stomp_reply_to_becomes_the_response_topic(gw, stomp, mqtt, reply_to, topic):
    sub = mqtt("s2m-reply")
    sub.sub("s2m/reply", qos=1)
    send(stomp(), {"destination": "/topic/s2m.reply", "reply-to": reply_to}, b"r")
    assert sub.get().properties.ResponseTopic == topic


@pytest.mark.parametrize(("persistent", "granted", "qos"), [
    ("true", 2, 2), ("true", 1, 1), (None, 2, 1), ("false", 2, 1), (None, 0, 0)])
def test_stomp_persistent_becomes_mqtt_qos(gw, stomp, mqtt, persistent, granted, qos):
    sub = mqtt("s2m-qos")
    sub.sub("s2m/qos", qos=granted)
    headers = {"destination": "/topic/s2m.qos"}
    if persistent is not None:
        headers["persistent"] = persistent
    send(stomp(), headers, b"q")
    assert sub.get().qos == qos


# --- MQTT 5 → STOMP ---------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "text", "ctype"), [
    (b"corr-7", "corr-7", "utf8bytes"), (b"\x00\xffc", "AP9j", "bytes")],
    ids=["utf8", "binary"])
def test_mqtt5_publish_reaches_a_stomp_subscriber_field_by_field(gw, stomp, mqtt, data, text,
                                                                  ctype):
    c = stomp()
    subscribe(c, "/topic/m2s.>")
    pub = mqtt("m2s-pub")
    before = now_ms()
    pub.pub("m2s/line1", "21.5", qos=1, props=publish_props(
        ContentType="text/plain", CorrelationData=data, ResponseTopic="re/ply",
        MessageExpiryInterval=60,
        UserProperty=[("unit", "C"), ("n", "5"), ("gw-types", "n:int32"),
                      ("JMSType", "reading"), ("JMSPriority", "7"), ("gw-trace-id", "t-m2s")]))
    m = c.frame()
    assert (m.command, m.body) == ("MESSAGE", b"21.5")
    assert is_message_id(m["message-id"])
    stamp = int(m["timestamp"])
    assert before <= stamp <= now_ms()
    assert int(m["expires"]) == stamp + 60000
    assert without(m.headers, "message-id", "timestamp", "expires") == [
        ("subscription", "1"), ("destination", "/topic/m2s.line1"),
        ("content-type", "text/plain"), ("persistent", "true"),  # QoS 1 → PERSISTENT
        ("priority", "7"), ("correlation-id", text), ("reply-to", "/topic/re.ply"),
        ("type", "reading"), ("unit", "C"), ("n", "5"), ("JMS_GW_MQTT_QOS", "1"),
        ("gw-types", f"correlation-id:{ctype},n:int32,JMS_GW_MQTT_QOS:int8"),
        ("gw-trace-id", "t-m2s"), ("content-length", "4")]


def test_mqtt5_bytes_publish_reaches_stomp_with_a_content_length(gw, stomp, mqtt):
    c = stomp()
    subscribe(c, "/topic/m2s.raw")
    mqtt("m2s-raw").pub("m2s/raw", b"\x00\x01\x00", qos=0)
    m = c.frame()
    assert m.body == b"\x00\x01\x00"
    assert m.get("content-type") is None  # BYTES: no content type; content-length says it
    assert m["content-length"] == "3"
    assert m.get("persistent") is None  # QoS 0 → NON_PERSISTENT
    assert (m["JMS_GW_MQTT_QOS"], m["gw-types"]) == ("0", "JMS_GW_MQTT_QOS:int8")


def test_mqtt5_to_stomp_to_mqtt5_keeps_everything(gw, stomp, mqtt):
    """A STOMP client that forwards what it got (all headers but the delivery's own) hands
    the MQTT fields and the user property types back to an MQTT 5 subscriber."""
    relay = stomp()
    subscribe(relay, "/topic/rt.in")
    out = mqtt("rt-out")
    out.sub("rt/out", qos=2)
    user = [("unit", "C"), ("n", "5"), ("ratio", "0.5"), ("on", "true"), ("empty", ""),
            ("gw-types", "n:int32,ratio:float32,on:boolean")]
    mqtt("rt-pub").pub("rt/in", b"\x00payload", qos=1, props=publish_props(
        ContentType="application/x-thing", CorrelationData=b"\x00\xff\x01",
        ResponseTopic="rt/replies", MessageExpiryInterval=120, UserProperty=user))
    m = relay.frame()
    assert m.get("content-type") == "application/x-thing"
    send(relay, forwarded(m, "/topic/rt.out", length=True), m.body)
    got = out.get()
    assert (got.topic, got.payload) == ("rt/out", b"\x00payload")
    assert got.qos == 1  # JMS_GW_MQTT_QOS came back as an int8: the publisher's QoS
    p = got.properties
    assert getattr(p, "PayloadFormatIndicator", None) is None
    assert p.ContentType == "application/x-thing"
    assert p.CorrelationData == b"\x00\xff\x01"
    assert p.ResponseTopic == "rt/replies"
    assert 118 <= p.MessageExpiryInterval <= 120
    props = p.UserProperty
    assert props[:5] == user[:5]
    # Forwarded with its JMS_GW_MQTT_QOS, it is the MQTT publisher's message still: neither
    # a JMSMessageID nor the trace id is added (mappings/README.md, core → MQTT).
    assert props[5:] == [("gw-types", "n:int32,ratio:float32,on:boolean")]


# --- AMQP → STOMP -----------------------------------------------------------------------------


def test_amqp_message_reaches_a_stomp_subscriber_field_by_field(gw, stomp, amqp):
    c = stomp()
    subscribe(c, "/queue/a2s.fields")
    amqp.create_sender("queue://a2s.fields").send(proton.Message(
        body="hello", durable=True, priority=6, ttl=60, id="mid-1", correlation_id="corr-1",
        subject="greeting", reply_to="topic://replies.amqp", content_type="text/plain",
        properties={"i": proton.int32(-7), "sh": proton.short(3), "b": True, "d": 0.5,
                    "s": "str", "l": 5, "ub": proton.ubyte(200), "by": proton.byte(-1),
                    "f": proton.float32(0.25)}))
    m = c.frame()
    assert m.body == b"hello"
    stamp = int(m["timestamp"])
    assert int(m["expires"]) == stamp + 60000  # ttl 60 s
    assert without(m.headers, "timestamp", "expires", "gw-trace-id") == [
        ("subscription", "1"), ("message-id", "mid-1"), ("destination", "/queue/a2s.fields"),
        ("content-type", "text/plain"), ("persistent", "true"), ("priority", "6"),
        ("correlation-id", "corr-1"), ("reply-to", "/topic/replies.amqp"),
        ("type", "greeting"),  # subject → JMSType
        ("i", "-7"), ("sh", "3"), ("b", "true"), ("d", "0.5"), ("s", "str"), ("l", "5"),
        ("ub", "200"), ("by", "-1"), ("f", "0.25"),
        ("gw-types", "i:int32,sh:int16,b:boolean,d:float64,l:long,ub:uint8,by:int8,"
                     "f:float32"),
        ("content-length", "5")]


def test_amqp_map_body_reaches_stomp_as_jms_map_json(gw, stomp, amqp):
    c = stomp()
    subscribe(c, "/queue/a2s.map")
    body = {"a": proton.int32(1), "n": {"x": [proton.short(1), "y", {"z": None}],
                                        "t": True}, "f": 0.25, "bin": b"\x00\xff"}
    amqp.create_sender("queue://a2s.map").send(proton.Message(
        body=body, annotations={proton.symbol("x-opt-jms-msg-type"): proton.byte(2)}))
    m = c.frame()
    assert (m["content-type"], m["transformation"]) == ("application/json", "jms-map-json")
    assert m.body == b'{"a":1,"n":{"x":[1,"y",{"z":null}],"t":true},"f":0.25,"bin":"AP8="}'


def test_amqp_sequence_body_reaches_stomp_as_jms_stream_json(gw, stomp, amqp):
    c = stomp()
    subscribe(c, "/queue/a2s.stream")
    msg = proton.Message(body=[proton.int32(1), "two", [True, None]], inferred=True)
    amqp.create_sender("queue://a2s.stream").send(msg)
    m = c.frame()
    assert (m["content-type"], m["transformation"]) == ("application/json", "jms-stream-json")
    assert m.body == b'[1,"two",[true,null]]'


# --- STOMP → AMQP -----------------------------------------------------------------------------


def receive(amqp: Any, address: str) -> proton.Message:
    r = amqp.create_receiver(address, credit=10)
    m = r.receive(timeout=5)
    r.accept()
    r.close()
    return m


def test_stomp_send_reaches_amqp_field_by_field(gw, stomp, amqp):
    c = stomp()
    expires = now_ms() + 60000
    send(c, [("destination", "/queue/s2a.fields"), ("content-type", "text/plain"),
             ("i", "-7"), ("sh", "3"), ("b", "true"), ("d", "0.5"), ("s", "str"),
             ("ub", "200"), ("plain", "5"),
             ("gw-types", "i:int32,sh:int16,b:boolean,d:float64,ub:uint8"),
             ("persistent", "true"), ("priority", "7"), ("correlation-id", "c-9"),
             ("reply-to", "/topic/rep.x"), ("type", "greet"), ("expires", str(expires))],
         b"hi")
    m = receive(amqp, "queue://s2a.fields")
    assert m.body == "hi"  # amqp-value string
    assert (m.durable, m.priority, m.subject, m.content_type) == (True, 7, "greet", "text/plain")
    assert (m.correlation_id, m.reply_to, m.address) == (
        "c-9", "topic://rep.x", "queue://s2a.fields")
    assert is_message_id(m.id)
    assert round(m.expiry_time * 1000) == expires
    assert 58 <= m.ttl <= 60
    assert [(k, type(v).__name__, v) for k, v in m.properties.items()] == [
        ("i", "int32", -7), ("sh", "short", 3), ("b", "bool", True), ("d", "float", 0.5),
        ("s", "str", "str"), ("ub", "ubyte", 200), ("plain", "str", "5")]
    assert m.annotations[proton.symbol("x-opt-jms-msg-type")] == 5
    assert m.annotations[proton.symbol("x-opt-jms-reply-to")] == 1  # a topic


def test_stomp_map_json_reaches_amqp_as_a_map(gw, stomp, amqp):
    send(stomp(), {"destination": "/queue/s2a.map", "transformation": "jms-map-json"},
         b'{"a":1,"n":{"x":[1,"y",{"z":null}],"t":true},"f":0.25,"s":"\\u00e9"}')
    m = receive(amqp, "queue://s2a.map")
    assert m.body == {"a": 1, "n": {"x": [1, "y", {"z": None}], "t": True}, "f": 0.25,
                      "s": "é"}
    assert type(m.body["n"]["x"]) is list and type(m.body["n"]) is dict
    assert m.annotations[proton.symbol("x-opt-jms-msg-type")] == 2  # MapMessage


def test_stomp_stream_json_reaches_amqp_as_a_sequence(gw, stomp, amqp):
    send(stomp(), {"destination": "/queue/s2a.stream", "transformation": "jms-stream-json"},
         b'[1,"x",{"k":[true]}]')
    m = receive(amqp, "queue://s2a.stream")
    assert m.body == [1, "x", {"k": [True]}]
    assert m.annotations[proton.symbol("x-opt-jms-msg-type")] == 4  # StreamMessage


def test_stomp_text_and_bytes_reach_amqp_as_value_and_data(gw, stomp, amqp):
    c = stomp()
    send(c, {"destination": "/queue/s2a.bodies", "content-type": "text/plain"}, b"text")
    send(c, {"destination": "/queue/s2a.bodies", "content-length": "3"}, b"\x00\x01\x02")
    r = amqp.create_receiver("queue://s2a.bodies", credit=10)
    text, raw = r.receive(timeout=5), r.receive(timeout=5)
    r.accept()
    assert (text.body, text.inferred) == ("text", False)  # amqp-value string
    assert text.annotations[proton.symbol("x-opt-jms-msg-type")] == 5
    assert (bytes(raw.body), raw.inferred) == (b"\x00\x01\x02", True)  # a data section
    assert raw.annotations[proton.symbol("x-opt-jms-msg-type")] == 3
    assert cproton.pn_message_get_content_type(raw._msg) is None  # (proton's getter: 'None')


# --- the core's JMS clients → STOMP → the core -------------------------------------------------

CORE_PROPERTIES = {
    "i8": Int8(-8), "i16": Int16(-16), "i32": Int32(-32), "i64": Int64(-64), "long": 7,
    "f32": Float32(0.1), "f64": 0.1, "on": True, "off": False, "letter": Char("é"),
    "nothing": None, "raw": b"\x00\xff", "u16": UInt16(65535), "text": "plain",
    "spaced": "a b:c",
}
# the MESSAGE headers the properties become (mappings/README.md, "User properties", Out)
CORE_HEADERS = [
    ("i8", "-8"), ("i16", "-16"), ("i32", "-32"), ("i64", "-64"), ("long", "7"),
    ("f32", "0.1"), ("f64", "0.1"), ("on", "true"), ("off", "false"), ("letter", "é"),
    ("nothing", ""), ("raw", "AP8="), ("u16", "65535"), ("text", "plain"), ("spaced", "a b:c"),
]
CORE_TYPES = ("correlation-id:utf8bytes,i8:int8,i16:int16,i32:int32,i64:int64,long:long,"
              "f32:float32,f64:float64,on:boolean,off:boolean,letter:char,nothing:null,"
              "raw:bytes,u16:uint16")


def shape(props: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    return {k: (type(v).__name__, v) for k, v in props.items()}


def test_the_expected_shape_describes_the_core_properties():
    assert shape(CORE_PROPERTIES) == {
        "i8": ("Int8", -8), "i16": ("Int16", -16), "i32": ("Int32", -32),
        "i64": ("Int64", -64), "long": ("int", 7), "f32": ("Float32", Float32(0.1)),
        "f64": ("float", 0.1), "on": ("bool", True), "off": ("bool", False),
        "letter": ("Char", "é"), "nothing": ("NoneType", None), "raw": ("bytes", b"\x00\xff"),
        "u16": ("UInt16", 65535), "text": ("str", "plain"), "spaced": ("str", "a b:c")}


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_core_message_reaches_stomp_and_a_forwarded_copy_comes_back_identical(gw, stomp, core,
                                                                              version):
    c = stomp(version)
    subscribe(c, f"/queue/jms.out.{version}", ack="client-individual")
    receiver = core()
    back = gw.call(lambda: receiver.session().consumer(Destination.queue(f"jms.back.{version}")))
    sent = Message.text("grüße", properties=dict(CORE_PROPERTIES), correlation_id=b"corr-b",
                        reply_to=Destination.topic("jms.replies"), type="order")

    conn = core()

    async def publish() -> None:
        producer = conn.session().producer(Destination.queue(f"jms.out.{version}"),
                                           validate=False)
        await producer.send_async(sent, priority=8, ttl=60000,
                                  delivery_mode=DeliveryMode.PERSISTENT)

    gw.call(publish)
    m = c.frame()
    assert m.body == "grüße".encode()
    assert m["message-id"] == sent.message_id and is_message_id(sent.message_id)
    assert m["timestamp"] == str(sent.timestamp)
    assert m["expires"] == str(sent.timestamp + 60000)
    assert m["gw-trace-id"] == sent.trace_id
    assert without(m.headers, "message-id", "timestamp", "expires", "ack", "gw-trace-id") == [
        ("subscription", "1"), ("destination", f"/queue/jms.out.{version}"),
        ("content-type", "text/plain;charset=utf-8"), ("persistent", "true"),
        ("priority", "8"), ("correlation-id", "corr-b"), ("reply-to", "/topic/jms.replies"),
        ("type", "order"), *CORE_HEADERS, ("gw-types", CORE_TYPES),
        ("content-length", str(len("grüße".encode())))]
    send(c, forwarded(m, f"/queue/jms.back.{version}"), m.body)
    if version == "1.2":
        c.request(frame("ACK", {"id": m["ack"], "receipt": "ack"}), "ack")
    else:  # 1.0 and 1.1 acknowledge by message id
        c.request(frame("ACK", {"message-id": m["message-id"], "subscription": "1",
                                "receipt": "ack"}), "ack")
    assert gw.call(lambda: gw.broker.queues[f"jms.out.{version}"].info()["count"]) == 0
    d = gw.call(lambda: back.receive(5))
    got = d.msg
    assert shape(got.properties) == shape(CORE_PROPERTIES)
    assert list(got.properties) == list(CORE_PROPERTIES)  # in order
    assert (got.body_kind.name, got.body) == ("TEXT", "grüße")
    assert got.correlation_id == b"corr-b"
    assert got.reply_to == Destination.topic("jms.replies")
    assert (got.type, got.priority, got.delivery_mode) == ("order", 8, DeliveryMode.PERSISTENT)
    assert got.expiration == sent.timestamp + 60000
    assert got.trace_id == sent.trace_id
    assert got.destination == Destination.queue(f"jms.back.{version}")
    assert got.message_id != sent.message_id


def test_core_map_message_reaches_stomp_as_json_and_comes_back_as_a_map(gw, stomp, core):
    c = stomp()
    subscribe(c, "/queue/jms.map")
    receiver = core()
    back = gw.call(lambda: receiver.session().consumer(Destination.queue("jms.map.back")))
    body = {"line": "L1", "count": Int32(7), "nested": {"list": [Int16(1), "x", None],
                                                         "deeper": {"on": True}}}
    conn = core()

    async def publish() -> None:
        producer = conn.session().producer(Destination.queue("jms.map"))
        await producer.send_async(Message.map(body, properties={"shift": Int32(3)}))

    gw.call(publish)
    m = c.frame()
    assert (m["content-type"], m["transformation"]) == ("application/json", "jms-map-json")
    assert json.loads(m.body) == {"line": "L1", "count": 7,
                                  "nested": {"list": [1, "x", None], "deeper": {"on": True}}}
    assert m.body == b'{"line":"L1","count":7,"nested":{"list":[1,"x",null],"deeper":{"on":true}}}'
    assert (m["shift"], m["gw-types"]) == ("3", "shift:int32")
    send(c, forwarded(m, "/queue/jms.map.back"), m.body)
    got = gw.call(lambda: back.receive(5)).msg
    assert got.body_kind.name == "MAP"
    # JSON has no widths: the numbers come back as plain integers (mappings/README.md)
    assert got.body == {"line": "L1", "count": 7,
                        "nested": {"list": [1, "x", None], "deeper": {"on": True}}}
    assert shape(got.properties) == {"shift": ("Int32", 3)}


def test_binary_correlation_id_survives_stomp_as_base64(gw, stomp, core):
    c = stomp()
    subscribe(c, "/queue/jms.corr")
    receiver = core()
    back = gw.call(lambda: receiver.session().consumer(Destination.queue("jms.corr.back")))
    conn = core()

    async def publish() -> None:
        producer = conn.session().producer(Destination.queue("jms.corr"))
        await producer.send_async(Message.binary(b"\x01", correlation_id=b"\x00\xff\xfe"))

    gw.call(publish)
    m = c.frame()
    assert m["correlation-id"] == base64.b64encode(b"\x00\xff\xfe").decode() == "AP/+"
    assert m["gw-types"] == "correlation-id:bytes"
    send(c, forwarded(m, "/queue/jms.corr.back", length=True), m.body)
    got = gw.call(lambda: back.receive(5)).msg
    assert (got.correlation_id, got.body_kind.name, got.body) == (b"\x00\xff\xfe", "BYTES",
                                                                  b"\x01")


def test_the_delivery_log_hashes_an_mqtt_publish_alike_at_stomp_and_amqp(gw, stomp, mqtt, amqp):
    """The log's body and properties hashes (docs/delivery-log.md, "Hashes") of an MQTT
    publish are those of its STOMP and AMQP deliveries: the message did not change."""
    c = stomp()
    subscribe(c, "/topic/dlog.hash")
    r = amqp.create_receiver("topic://dlog.hash", credit=10)
    pub = mqtt("dlog-hash")
    pub.pub("dlog/hash", b"21.5", qos=1, props=publish_props(UserProperty=[("unit", "C")]))
    assert c.frame().body == b"21.5"
    assert r.receive(timeout=5).body == b"21.5"
    r.accept()
    r.close()

    def of_it() -> list[dict[str, Any]]:
        return [x for x in log_records(gw) if x["dest"] == "topic:dlog.hash"]

    records = wait_for(lambda: len(of_it()) >= 3 and of_it(), what="publish and deliveries")
    publish = [x for x in records if x["event"] == "publish"]
    delivers = [x for x in records if x["event"] == "deliver"]
    assert len(publish) == 1 and len(delivers) == 2
    assert len({x["client"] for x in delivers}) == 2  # the STOMP and the AMQP consumer
    body_hash = hashlib.blake2b(b"21.5", digest_size=8).hexdigest()
    props_hash = publish[0]["props_hash"]
    assert props_hash is not None  # the user property and the MQTT QoS property
    for x in delivers:
        assert x["trace_id"] == publish[0]["trace_id"] and x["v"] == 2
        assert (x["body_hash"], x["props_hash"]) == (body_hash, props_hash)
