"""Declarative mappings (<config dir>/mappings/*.yaml) applied by the adapters and transports."""

from __future__ import annotations

import hashlib
import json
import socket
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from gw import GatewayThread
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from peers.mosquitto import start_mosquitto
from test_transport_mqtt import Remote, info, transports_conf, wait_for

from gateway.errors import ConfigErrors
from gateway.message import Destination, Message
from gateway.types import Float32

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

RULES = """\
mappings:
  - name: readings in
    match: {destination: "topic:sensors.>", direction: in, protocol: mqtt}
    steps:
      - decode_json: {}
      - lift: {from: body.temp, to: property.temp, type: float32}
      - require: [body.site]
  - name: no secrets out
    match: {destination: ">", direction: out}
    steps:
      - drop: [property.secret]
  - name: export as text
    match: {destination: "topic:out.>", direction: out, transport: far}
    steps:
      - set: {field: property.via, value: far}
"""


def with_mappings(tmp: Path, text: str, **files: str) -> GatewayThread:
    folder = tmp / "mappings"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "plant.yaml").write_text(text)
    return GatewayThread(tmp, **files)


def stomp(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"CONNECT\naccept-version:1.2\nhost:/\n\n\x00")
    s.recv(4096)
    return s


def read_frame(s: socket.socket) -> tuple[dict[str, str], bytes]:
    buf = b""
    while b"\x00" not in buf or b"\n\n" not in buf:
        buf += s.recv(65536)
    head, _, rest = buf.partition(b"\n\n")
    lines = head.decode().split("\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers.setdefault(k, v.replace("\\c", ":"))  # the one escape these values need
    n = int(headers.get("content-length", "0"))
    return headers, rest[:n]


def mqtt5(port: int) -> paho.Client:
    c = paho.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
    c.connect("127.0.0.1", port)
    c.loop_start()
    return c


def test_mqtt_json_in_reaches_stomp_as_a_map_with_a_lifted_typed_property(tmp_path):
    g = with_mappings(tmp_path / "gw", RULES,
                      gateway="listen = mqtt://127.0.0.1:0\nlisten = stomp://127.0.0.1:0\n").start()
    try:
        s = stomp(g.port("stomp"))
        s.sendall(b"SUBSCRIBE\nid:1\ndestination:/topic/sensors.>\nselector:temp > 20\n"
                  b"receipt:r\n\n\x00")
        s.recv(4096)
        c = mqtt5(g.port("mqtt"))
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = [("secret", "s3"), ("colour", "red")]
        c.publish("sensors/room1", json.dumps({"temp": 19.5, "site": "A"}), 1,
                  properties=props).wait_for_publish(5)
        c.publish("sensors/room1", json.dumps({"temp": 21.5, "site": "A"}), 1,
                  properties=props).wait_for_publish(5)
        headers, body = read_frame(s)
        assert json.loads(body) == {"temp": 21.5, "site": "A"}
        assert headers["transformation"] == "jms-map-json"
        assert headers["temp"] == "21.5" and "temp:float32" in headers["gw-types"]
        assert headers["colour"] == "red" and "secret" not in headers  # dropped on the way out
        c.loop_stop()
        c.disconnect()
        s.close()
    finally:
        g.stop()


def test_a_failing_in_rule_refuses_the_publish_in_the_protocols_way(tmp_path):
    g = with_mappings(tmp_path / "gw", RULES,
                      gateway="listen = mqtt://127.0.0.1:0\n").start()
    try:
        acks: list[Any] = []
        c = mqtt5(g.port("mqtt"))
        c.on_publish = lambda cl, u, mid, rc, p: acks.append(rc)
        c.publish("sensors/x", json.dumps({"temp": 1}), 1)  # no site: require fails
        wait_for(lambda: acks, what="the PUBACK")
        assert acks[0].value == 0x83  # implementation specific error
        assert g.call(lambda: g.broker.stats["rejected"]) == 0  # refused before the core
        c.loop_stop()
        c.disconnect()
    finally:
        g.stop()


def test_a_transport_rule_applies_to_its_exports(tmp_path):
    with start_mosquitto(tmp_path / "mosq") as mosq:
        g = with_mappings(
            tmp_path / "gw", RULES,
            gateway="listen = http://127.0.0.1:0\nmqtt_transports = enabled\n",
            transports=transports_conf(mosq.port), topics='out.> export="far"\n>\n').start()
        remote = Remote(mosq.port)
        try:
            remote.subscribe("out/#")
            wait_for(lambda: info(g)["far"]["state"] == "up", what="transport up")
            g.call(lambda: g.broker.connect().session().producer(Destination.topic("out.a"))
                   .send(Message.text("x", properties={"secret": "no", "t": Float32(1.5)})))
            wait_for(lambda: remote.got, what="the export")
            user = dict(remote.got[0].properties.UserProperty)
            assert user["via"] == "far" and "secret" not in user and user["t"] == "1.5"
        finally:
            remote.close()
            g.stop()


def test_a_bad_mapping_file_stops_the_gateway_naming_file_and_line(tmp_path):
    bad = "mappings:\n  - match: {destination: '>', direction: in}\n    steps:\n      - explode: {}\n"
    g = with_mappings(tmp_path / "gw", bad, gateway="listen = mqtt://127.0.0.1:0\n")
    with pytest.raises(ConfigErrors, match=r"plant.yaml:4: .*explode"):
        g.start()
    time.sleep(0.1)


STOMP_OVERRIDES = """\
mappings:
  - name: device header as JMSType
    extends: stomp.in.type
    match: {destination: "queue:plant.>"}
    steps:
      - copy: {from: wire.header.x-device, to: header.JMSType}
      - drop: [property.x-device]
  - name: lenient priority
    replaces: stomp.in.priority
    match: {destination: "queue:plant.>"}
    steps:
      - copy: {from: wire.header.priority, to: header.JMSPriority}
  - name: kind as content type
    match: {destination: "queue:plant.>", direction: out, protocol: stomp}
    steps:
      - copy: {from: property.kind, to: wire.header.content-type}
"""


def test_stomp_default_rules_overridden_for_one_destination(tmp_path):
    g = with_mappings(tmp_path / "gw", STOMP_OVERRIDES,
                      gateway="listen = stomp://127.0.0.1:0\n").start()
    try:
        s = stomp(g.port("stomp"))
        s.sendall(b"SUBSCRIBE\nid:1\ndestination:/queue/plant.a\nreceipt:r\n\n\x00"
                  b"SUBSCRIBE\nid:2\ndestination:/queue/office\nreceipt:r2\n\n\x00")
        got = b""
        while got.count(b"\x00") < 2:  # both receipts: the subscriptions are in place
            got += s.recv(4096)
        s.sendall(b"SEND\ndestination:/queue/plant.a\nx-device:press-4\npriority:07\n"
                  b"kind:text/csv\ncontent-length:3\n\na,b\x00")
        headers, body = read_frame(s)
        assert headers["type"] == "press-4" and "x-device" not in headers
        assert headers["priority"] == "7" and headers["content-type"] == "text/csv"
        assert body == b"a,b"
        # another destination keeps the defaults: "07" is refused as a malformed message
        s.sendall(b"SEND\ndestination:/queue/office\nx-device:press-4\npriority:07\n\nx\x00")
        headers, body = read_frame(s)
        assert b"malformed message" in body or headers.get("message") == "malformed message"
        s.close()
    finally:
        g.stop()


MQTT_OVERRIDES = """\
mappings:
  - name: device as JMSType
    extends: mqtt.in.user-headers
    match: {destination: "topic:plant.>"}
    steps:
      - copy: {from: wire.user.device, to: header.JMSType}
  - name: kind as content type
    match: {destination: "topic:plant.>", direction: out, protocol: mqtt}
    steps:
      - copy: {from: property.kind, to: wire.content_type}
"""


def test_mqtt_default_rules_overridden_for_one_destination(tmp_path):
    g = with_mappings(tmp_path / "gw", MQTT_OVERRIDES,
                      gateway="listen = mqtt://127.0.0.1:0\n").start()
    try:
        got: list[Any] = []
        sub = mqtt5(g.port("mqtt"))
        subacks: list[Any] = []
        sub.on_message = lambda cl, u, m: got.append(m)
        sub.on_subscribe = lambda cl, u, mid, rc, p: subacks.append(mid)
        sub.subscribe("plant/#", 1)
        sub.subscribe("office/#", 1)
        wait_for(lambda: len(subacks) == 2, what="both SUBACKs")
        pub = mqtt5(g.port("mqtt"))
        for topic in ("plant/a", "office/a"):
            props = Properties(PacketTypes.PUBLISH)
            props.UserProperty = [("device", "press-4"), ("kind", "text/csv")]
            pub.publish(topic, b"a,b", 1, properties=props).wait_for_publish(5)
        wait_for(lambda: len(got) == 2, what="both messages")
        by_topic = {m.topic: m for m in got}
        plant = dict(by_topic["plant/a"].properties.UserProperty)
        assert plant["JMSType"] == "press-4"
        assert by_topic["plant/a"].properties.ContentType == "text/csv"
        office = by_topic["office/a"].properties
        assert "JMSType" not in dict(office.UserProperty)
        assert not hasattr(office, "ContentType")
        for c in (sub, pub):
            c.loop_stop()
            c.disconnect()
    finally:
        g.stop()


def test_a_transport_wire_rule_applies_to_its_exports_only(tmp_path):
    rules = """\
mappings:
  - name: kind as content type, for far
    match: {destination: "topic:out.>", direction: out, protocol: mqtt, transport: far}
    steps:
      - copy: {from: property.kind, to: wire.content_type}
      - drop: [wire.user.kind]
"""
    with start_mosquitto(tmp_path / "mosq") as mosq:
        g = with_mappings(
            tmp_path / "gw", rules,
            gateway="listen = http://127.0.0.1:0\nmqtt_transports = enabled\n",
            transports=transports_conf(mosq.port), topics='out.> export="far"\n>\n').start()
        remote = Remote(mosq.port)
        try:
            remote.subscribe("out/#")
            wait_for(lambda: info(g)["far"]["state"] == "up", what="transport up")
            g.call(lambda: g.broker.connect().session().producer(Destination.topic("out.a"))
                   .send(Message.binary(b"\x01", properties={"kind": "application/cbor"})))
            wait_for(lambda: remote.got, what="the export")
            props = remote.got[0].properties
            assert props.ContentType == "application/cbor"
            assert "kind" not in dict(props.UserProperty)
        finally:
            remote.close()
            g.stop()


AMQP_OVERRIDES = """\
mappings:
  - name: kind as subject
    extends: amqp.in.subject
    match: {destination: "queue:plant.>"}
    steps:
      - copy: {from: wire.application.kind, to: header.JMSType}
      - drop: [property.kind]
  - name: line annotation out
    match: {destination: "queue:plant.>", direction: out, protocol: amqp}
    steps:
      - copy: {from: header.JMSType, to: wire.annotation.x-opt-line}
"""


def test_amqp_default_rules_overridden_for_one_destination(tmp_path):
    from amqpclient import connect
    from proton import Message as ProtonMessage
    from proton import symbol

    g = with_mappings(tmp_path / "gw", AMQP_OVERRIDES,
                      gateway="listen = amqp://127.0.0.1:0\n").start()
    try:
        c = connect(g.port("amqp"))
        receivers = {q: c.create_receiver(f"queue://{q}") for q in ("plant.a", "office")}
        sender = c.create_sender(None)
        for q in receivers:
            sender.send(ProtonMessage(address=f"queue://{q}", body="a,b",
                                      properties={"kind": "csv", "n": 1}))
        plant = receivers["plant.a"].receive(timeout=10)
        receivers["plant.a"].accept()
        assert plant.subject == "csv" and plant.properties == {"n": 1}
        assert plant.annotations[symbol("x-opt-line")] == "csv"
        office = receivers["office"].receive(timeout=10)
        receivers["office"].accept()
        assert office.subject is None and office.properties == {"kind": "csv", "n": 1}
        assert symbol("x-opt-line") not in office.annotations
        c.close()
    finally:
        g.stop()


BROWSE_RULES = """\
mappings:
  - name: tagged out
    match: {destination: "queue:stock.>", direction: out, protocol: amqp}
    steps:
      - set: {field: property.seen, value: mapped}
      - drop: [property.secret]
  - name: type as annotation
    match: {destination: "queue:stock.>", direction: out, protocol: amqp}
    steps:
      - copy: {from: header.JMSType, to: wire.annotation.x-opt-kind}
  - name: refused
    match: {destination: "queue:stock.>", direction: out, protocol: amqp}
    steps:
      - require: [property.n]
"""


def test_an_amqp_browser_gets_messages_as_a_consumer_would(tmp_path):
    from amqpclient import connect
    from proton import Message as ProtonMessage
    from proton import symbol
    from proton.reactor import Copy

    g = with_mappings(tmp_path / "gw", BROWSE_RULES,
                      gateway="listen = amqp://127.0.0.1:0\n").start()
    try:
        c = connect(g.port("amqp"))
        sender = c.create_sender("queue://stock.a")
        sender.send(ProtonMessage(body="kept", subject="csv",
                                  properties={"n": 1, "secret": "x"}))
        sender.send(ProtonMessage(body="refused", properties={"secret": "y"}))  # no n
        sender.send(ProtonMessage(body="last", properties={"n": 3}))
        browser = c.create_receiver("queue://stock.a", credit=10, options=Copy(), name="b")
        browsed = [browser.receive(timeout=10) for _ in range(2)]
        consumer = c.create_receiver("queue://stock.a", credit=10)
        consumed = [consumer.receive(timeout=10) for _ in range(2)]
        consumer.accept()
        for got in (browsed, consumed):
            assert [m.body for m in got] == ["kept", "last"]
            assert got[0].properties == {"n": 1, "seen": "mapped"}
            assert got[0].annotations[symbol("x-opt-kind")] == "csv"
        c.close()
    finally:
        g.stop()


def test_the_delivery_log_names_the_rules_that_changed_an_export(tmp_path):
    """An export changed by mapping rules: its record names them (``rules``) and hashes the
    message as changed; the publish record hashes it as it was (docs/delivery-log.md)."""
    rules = RULES + """\
  - name: json out
    match: {destination: "topic:out.json", direction: out, transport: far}
    steps:
      - decode_json: {}
      - set: {field: body.via, value: far}
      - encode_json: {}
"""
    with start_mosquitto(tmp_path / "mosq") as mosq:
        g = with_mappings(
            tmp_path / "gw", rules,
            gateway="listen = http://127.0.0.1:0\nmqtt_transports = enabled\n",
            transports=transports_conf(mosq.port), topics='out.> export="far"\n>\n').start()
        remote = Remote(mosq.port)
        try:
            remote.subscribe("out/#")
            wait_for(lambda: info(g)["far"]["state"] == "up", what="transport up")
            g.call(lambda: g.broker.connect().session().producer(Destination.topic("out.json"))
                   .send(Message.text('{"a": 1}')))
            wait_for(lambda: remote.got, what="the export")
            assert json.loads(remote.got[0].payload) == {"a": 1, "via": "far"}

            def records() -> dict[str, dict[str, Any]]:
                g.call(lambda: g.broker.dlog.flush())
                out = {}
                for f in sorted(Path(g.broker.config.gateway.delivery_log_dir).iterdir()):
                    for line in f.read_text("utf-8").splitlines():
                        r = json.loads(line)
                        if r["dest"] == "topic:out.json":
                            out[r["event"]] = r
                return out

            got = wait_for(lambda: {"publish", "export"} <= set(records()) and records(),
                           what="the publish and export records")
            pub, exp = got["publish"], got["export"]
            assert pub["rules"] is None and pub["body_hash"] == hashlib.blake2b(
                b'{"a": 1}', digest_size=8).hexdigest()
            # every rule that ran on it, in order ("no secrets out" found nothing to drop)
            assert exp["rules"] == "no secrets out,export as text,json out"
            assert exp["trace_id"] == pub["trace_id"]
            assert exp["body_hash"] is not None and exp["body_hash"] != pub["body_hash"]
            assert exp["far_dest"] == "out/json"
        finally:
            remote.close()
            g.stop()


def test_the_delivery_log_names_the_rules_an_adapter_ran_on_a_delivery(tmp_path):
    """An adapter applies its out rules after the core has logged the delivery: the deliver
    record names the rules that ran on that consumer's copy and hashes the copy as it left;
    a delivery no rule ran on has ``rules`` null and the publish's hashes
    (docs/delivery-log.md, ``rules``)."""
    from gateway.dlog_format import canonical_properties

    rules = """\
mappings:
  - name: stamp mqtt
    match: {destination: "topic:changed.>", direction: out, protocol: mqtt}
    steps:
      - set: {field: property.via, value: mqtt}
  - name: stamp stomp
    match: {destination: "topic:changed.>", direction: out, protocol: stomp}
    steps:
      - set: {field: property.via, value: stomp}
"""
    g = with_mappings(tmp_path / "gw", rules, gateway=(
        "listen = mqtt://127.0.0.1:0\nlisten = stomp://127.0.0.1:0\n")).start()
    try:
        s = stomp(g.port("stomp"))
        s.sendall(b"SUBSCRIBE\nid:1\ndestination:/topic/changed.a\n\n\x00"
                  b"SUBSCRIBE\nid:2\ndestination:/topic/plain.a\nreceipt:r\n\n\x00")
        s.recv(4096)
        got: list[paho.MQTTMessage] = []
        c = mqtt5(g.port("mqtt"))
        c.on_message = lambda cl, u, m: got.append(m)
        subscribed: list[Any] = []
        c.on_subscribe = lambda *a: subscribed.append(a)
        c.subscribe([("changed/a", 1), ("plain/a", 1)])
        wait_for(lambda: subscribed, what="the SUBACK")
        for name in ("changed.a", "plain.a"):
            m = Message.text("hello")
            m.properties = {"k": "v"}
            g.call(lambda m=m, name=name: g.broker.connect().session()
                   .producer(Destination.topic(name)).send(m))
        wait_for(lambda: len(got) == 2, what="both messages over MQTT")
        changed = next(m for m in got if m.topic == "changed/a")
        assert ("via", "mqtt") in changed.properties.UserProperty

        def records() -> list[dict[str, Any]]:
            g.call(lambda: g.broker.dlog.flush())
            return [json.loads(line)
                    for f in sorted(Path(g.broker.config.gateway.delivery_log_dir).iterdir())
                    for line in f.read_text("utf-8").splitlines()]

        def of(dest: str, event: str) -> list[dict[str, Any]]:
            return [r for r in records() if r["dest"] == dest and r["event"] == event]

        wait_for(lambda: len(of("topic:changed.a", "deliver")) == 2
                 and len(of("topic:plain.a", "deliver")) == 2, what="the deliver records")
        blake = lambda b: hashlib.blake2b(b, digest_size=8).hexdigest()  # noqa: E731
        protocols = g.call(lambda: {i: c.protocol for i, c in g.broker.connections.items()})
        for dest in ("topic:changed.a", "topic:plain.a"):
            (pub,) = of(dest, "publish")
            assert pub["rules"] is None
            assert pub["props_hash"] == blake(canonical_properties({"k": "v"}))
            delivers = {protocols[r["client"]]: r for r in of(dest, "deliver")}
            assert set(delivers) == {"mqtt", "stomp"}, delivers
            for protocol, r in delivers.items():
                assert r["body_hash"] == pub["body_hash"]
                if dest == "topic:plain.a":
                    assert r["rules"] is None and r["props_hash"] == pub["props_hash"]
                else:
                    assert r["rules"] == f"stamp {protocol}"
                    assert r["props_hash"] == blake(
                        canonical_properties({"k": "v", "via": protocol}))
        c.loop_stop()
        c.disconnect()
        s.close()
    finally:
        g.stop()
