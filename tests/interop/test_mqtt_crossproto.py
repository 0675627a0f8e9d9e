"""MQTT ↔ the core's JMS-style clients: selectors on MQTT properties, map bodies to MQTT."""

from __future__ import annotations

import json

import pytest
from gw import GatewayThread
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from test_mqtt_paho import V5, V311, Client

from gateway.message import DeliveryMode, Destination, Message
from gateway.types import Float32, Int16Array, Int32


@pytest.fixture
def gw(tmp_path):
    g = GatewayThread(tmp_path / "gw").start()
    yield g
    g.stop()


def test_mqtt_publish_reaches_a_jms_consumer_with_a_selector(gw):
    consumer = gw.call(lambda: gw.broker.connect().session().consumer(
        Destination.topic("plant.*.temp"), selector="unit = 'C' AND JMSDeliveryMode = 'PERSISTENT'"))
    pub = Client(gw.port("mqtt"), "dev", V5)
    for unit, qos in (("F", 1), ("C", 0), ("C", 1)):
        p = Properties(PacketTypes.PUBLISH)
        p.UserProperty = [("unit", unit)]
        p.CorrelationData = b"\x01\x02"
        p.ContentType = "text/plain"
        pub.pub("plant/line1/temp", f"21.5{unit}{qos}", qos=qos, props=p)
    d = gw.call(lambda: consumer.receive(5))
    msg = d.msg
    assert msg.body == "21.5C1"  # text: the content type says so
    assert msg.destination == Destination.topic("plant.line1.temp")
    assert msg.properties["unit"] == "C"
    assert msg.delivery_mode == DeliveryMode.PERSISTENT
    assert msg.correlation_id == b"\x01\x02"
    assert msg.trace_id
    assert gw.call(lambda: consumer.receive(0.2)) is None


@pytest.mark.parametrize("proto", [V311, V5], ids=["3.1.1", "5.0"])
def test_a_jms_map_message_reaches_mqtt_as_json(gw, proto):
    sub = Client(gw.port("mqtt"), "app", proto)
    sub.sub("reports/#", qos=2)
    body = {"line": "L1", "count": Int32(7), "ratio": Float32(0.5),
            "nested": {"series": Int16Array([1, 2, 3]), "raw": b"\x00\xff"}, "list": [1, "a"]}

    def send():
        s = gw.broker.connect().session()
        return s.producer(Destination.topic("reports.daily")).send_async(
            Message.map(body, properties={"shift": Int32(3), "ok": True}, type="daily",
                        reply_to=Destination.topic("reports.replies")))

    gw.call(send)
    m = sub.get()
    assert m.topic == "reports/daily"
    assert m.qos == 2  # PERSISTENT → QoS 2, capped by the subscription
    doc = json.loads(m.payload)
    assert doc == {"line": "L1", "count": 7, "ratio": 0.5,
                   "nested": {"series": [1, 2, 3], "raw": "AP8="}, "list": [1, "a"]}
    if proto == V5:
        props = dict(m.properties.UserProperty)
        assert props["shift"] == "3" and props["ok"] == "true" and props["JMSType"] == "daily"
        assert m.properties.ContentType == "application/json"
        assert m.properties.ResponseTopic == "reports/replies"


def test_request_reply_between_mqtt_and_jms(gw):
    """An MQTT 5 requester and a JMS responder that answers to JMSReplyTo."""

    def responder():
        s = gw.broker.connect().session()

        def on_request(d):
            reply = Message.binary(d.msg.body.upper(), correlation_id=d.msg.correlation_id)
            s.producer().send(reply, d.msg.reply_to)

        s.consumer(Destination.topic("svc.upper"), listener=on_request)

    gw.call(responder)
    req = Client(gw.port("mqtt"), "req", V5)
    req.sub("replies/req")
    p = Properties(PacketTypes.PUBLISH)
    p.ResponseTopic = "replies/req"
    p.CorrelationData = b"id-7"
    req.pub("svc/upper", "ping", props=p)
    m = req.get()
    assert m.payload == b"PING" and m.properties.CorrelationData == b"id-7"
