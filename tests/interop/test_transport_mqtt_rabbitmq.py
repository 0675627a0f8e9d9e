"""The mqtt transport against RabbitMQ's MQTT plugin (MQTT 3.1.1): export and import at QoS 1,
and the 3.1.1 loop check, with independent paho clients on the RabbitMQ side."""

from __future__ import annotations

import time
import uuid

import peers.rabbitmq as rabbitmq_peer
import pytest
from gw import GatewayThread, wait_for
from peers.test_rabbitmq_peer import Paho
from test_transport_mqtt import info

from gateway.message import Destination, Message
from gateway.types import Int16

rabbitmq = rabbitmq_peer.rabbitmq  # the module-scoped node (this directory has no conftest.py)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def gateway(tmp, port: int, topics: str, queues: str = ">\n") -> GatewayThread:
    return GatewayThread(
        tmp, gateway="listen = http://127.0.0.1:0\nmqtt_transports = enabled\n",
        transports=(f"[far]\ntype = mqtt\nurl = mqtt://127.0.0.1:{port}\n"
                    "protocol_version = 3.1.1\nusername = guest\npassword = guest\n"
                    f"client_id = gw-{uuid.uuid4().hex[:8]}\n"
                    "reconnect_min = 100msec\nreconnect_max = 500msec\n"),
        topics=topics, queues=queues, uvloop=True).start()


def test_export_and_import_at_qos_1(tmp_path, rabbitmq):
    g = gateway(tmp_path / "gw", rabbitmq.mqtt_port, 'rx.> export="far"\nri.> import="far"\n>\n')
    far = Paho(rabbitmq.mqtt_port, f"far-{uuid.uuid4().hex[:8]}")
    got: list = []
    try:
        far.subscribe("rx/#", qos=1)
        wait_for(lambda: info(g)["far"]["state"] == "up", 20, "transport up")
        g.call(lambda: g.broker.connect().session().consumer(
            Destination.topic("ri.>"), listener=got.append))
        wait_for(lambda: info(g)["far"]["imports"] == {"ri.>": ["ri.>"]}, 20,
                 "the import's subscription")

        def send() -> None:
            p = g.broker.connect().session().producer(Destination.topic("rx.a"))
            for i in range(20):
                p.send(Message.binary(b"%02d" % i, properties={"n": Int16(i)}))

        g.call(send)
        out = [far.messages.get(timeout=10) for _ in range(20)]
        assert [(m.topic, m.payload, m.qos) for m in out] == [
            ("rx/a", b"%02d" % i, 1) for i in range(20)]
        wait_for(lambda: info(g)["far"]["exported"] == 20, 20, "the PUBACKs")
        time.sleep(0.2)  # RabbitMQ binds the transport's subscription after its SUBACK
        for i in range(20):
            far.publish("ri/b", b"in%02d" % i, qos=1)
        wait_for(lambda: len(got) == 20, 20, "the imports")
        assert [d.msg.body for d in got] == [b"in%02d" % i for i in range(20)]
        assert {d.msg.destination.name for d in got} == {"ri.b"}
        wait_for(lambda: info(g)["far"]["imported"] == 20, 20, "imports counted")
    finally:
        far.close()
        g.stop()


def test_an_export_coming_back_is_not_imported_again(tmp_path, rabbitmq):
    """MQTT 3.1.1 carries no origin: the transport drops the copy of its own export that comes
    back when it imports the topic it exports."""
    g = gateway(tmp_path / "gw", rabbitmq.mqtt_port, 'loop.> export="far",import="far"\n>\n')
    got: list = []
    far = Paho(rabbitmq.mqtt_port, f"far-{uuid.uuid4().hex[:8]}")
    try:
        far.subscribe("loop/#", qos=1)
        g.call(lambda: g.broker.connect().session().consumer(
            Destination.topic("loop.>"), listener=got.append))
        wait_for(lambda: info(g)["far"]["state"] == "up", 20, "transport up")
        wait_for(lambda: info(g)["far"]["imports"] == {"loop.>": ["loop.>"]}, 20,
                 "the import's subscription")
        time.sleep(0.2)
        g.call(lambda: g.broker.connect().session().producer(
            Destination.topic("loop.x")).send(Message.binary(b"once")))
        assert far.messages.get(timeout=10).payload == b"once"
        wait_for(lambda: info(g)["far"]["dropped_loop"] == 1, 20, "the copy dropped")
        assert [d.msg.body for d in got] == [b"once"]  # the local delivery only
    finally:
        far.close()
        g.stop()
