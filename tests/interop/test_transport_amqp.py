"""The amqp transport against a real RabbitMQ 3.10 (AMQP 1.0 plugin): export, import, spool,
loops and a nested map body (TIBCO EMS User's Guide, chapter "Working With TIBCO Rendezvous",
"Topics" and "Queues"). One node serves the module (it takes ~10 s to start); the spool test
stops and starts its application, so it runs last."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import paho.mqtt.client as paho
import peers.rabbitmq as rabbitmq_peer
import proton
import pytest
from gw import GatewayThread, wait_for
from paho.mqtt.enums import CallbackAPIVersion
from peers.rabbitmq import RabbitMQ
from proton import Endpoint
from proton.utils import BlockingConnection
from transportlog import check_duplicate_drop, exported_records, log_records

from gateway.message import PROP_IMPORTED, DeliveryMode, Destination, Message
from gateway.types import Char, Float32, Int8, Int16, Int32, UInt16

rabbitmq = rabbitmq_peer.rabbitmq  # the module-scoped node (this directory has no conftest.py)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ANN_ORIGIN = proton.symbol("x-opt-gw-origin")
ANN_HOPS = proton.symbol("x-opt-gw-hops")
ANN_TRACE = proton.symbol("x-opt-gw-trace-id")


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:6]}"


def transports_conf(port: int, **extra: str) -> str:
    params = {"type": "amqp", "url": f"amqp://127.0.0.1:{port}",
              "address_prefix_topic": "/topic/", "address_prefix_queue": "/queue/",
              "reconnect_min": "100msec", "reconnect_max": "500msec", **extra}
    return "[far]\n" + "".join(f"{k} = {v}\n" for k, v in params.items())


def gateway(tmp: Any, port: int, topics: str, queues: str = ">\n", **extra: str) -> GatewayThread:
    return GatewayThread(
        tmp, gateway="listen = http://127.0.0.1:0\namqp_transports = enabled\n",
        transports=transports_conf(port, **extra), topics=topics, queues=queues,
    ).start()


def info(g: GatewayThread) -> dict[str, Any]:
    return {t["name"]: t for t in g.admin_get("/api/v1/transports")}


def up(g: GatewayThread) -> None:
    wait_for(lambda: info(g)["far"]["state"] == "up", what="transport up")


def attached(g: GatewayThread, n: int) -> None:
    """Wait until the transport has ``n`` receiver links and RabbitMQ answered each attach
    (it answers once the queue is declared and bound: from then on nothing is missed)."""
    t = g.gateway.transports.transports["far"]

    def ready() -> bool:
        links = g.call(lambda: [h.link for h in t.receivers.values()])
        return len(links) == n and all(lk.state & Endpoint.REMOTE_ACTIVE for lk in links)

    wait_for(ready, what=f"{n} far-side subscriptions")


@pytest.fixture
def amqp(rabbitmq: RabbitMQ) -> Iterator[BlockingConnection]:
    """A python-qpid-proton client of the node (no SASL: RabbitMQ's default user applies)."""
    conn = BlockingConnection(f"amqp://127.0.0.1:{rabbitmq.amqp_port}", timeout=10)
    yield conn
    conn.close()


def test_export_field_by_field_with_property_types_and_loop_markers(tmp_path, rabbitmq, amqp):
    g = gateway(tmp_path / "gw", rabbitmq.amqp_port, 'out.> export="far"\n>\n',
                username="guest", password="guest")  # SASL PLAIN
    try:
        receiver = amqp.create_receiver("/topic/out.#", credit=10)
        up(g)
        props = {"b": Int8(-3), "s": Int16(7), "i": Int32(70000), "l": 2**40, "f": Float32(1.5),
                 "d": 2.25, "t": True, "str": "x", "c": Char("Z"),
                 "u": UInt16(65535)}
        sent: list[Message] = []

        def send() -> None:
            m = Message.text("hello", properties=dict(props), type="t1", correlation_id="c-1",
                             reply_to=Destination.topic("replies.x"))
            s = g.broker.connect().session()
            s.producer(Destination.topic("out.a")).send(m, priority=7)
            sent.append(m)

        g.call(send)
        got = receiver.receive(timeout=10)
        receiver.accept()
        assert got.body == "hello"
        assert got.subject == "t1" and got.correlation_id == "c-1" and got.priority == 7
        assert got.reply_to == "/topic/replies.x"  # the far side's name for it
        assert got.address == "topic://out.a" and got.durable is True
        assert got.id == sent[0].message_id
        p = got.properties
        assert (type(p["b"]), p["b"]) == (proton.byte, -3)
        assert (type(p["s"]), p["s"]) == (proton.short, 7)
        assert (type(p["i"]), p["i"]) == (proton.int32, 70000)
        assert (type(p["l"]), p["l"]) == (int, 2**40)
        assert (type(p["f"]), p["f"]) == (proton.float32, 1.5)
        assert (type(p["d"]), p["d"]) == (float, 2.25)
        assert p["t"] is True and p["str"] == "x"
        assert (type(p["c"]), p["c"]) == (proton.char, "Z")
        assert (type(p["u"]), p["u"]) == (proton.ushort, 65535)
        ann = got.annotations
        assert ann[ANN_ORIGIN] == g.broker.id and ann[ANN_HOPS] == 0
        assert ann[ANN_TRACE] == sent[0].trace_id and sent[0].trace_id
        wait_for(lambda: info(g)["far"]["exported"] == 1 and info(g)["far"]["spooled"] == 0,
                 what="the export confirmed (RabbitMQ's accepted)")
    finally:
        g.stop()


def test_at_most_once_sends_presettled_and_without_headers(tmp_path, rabbitmq, amqp):
    g = gateway(tmp_path / "gw", rabbitmq.amqp_port, 'amo.> export="far"\n>\n',
                settle="at-most-once", export_headers="false", export_properties="false")
    try:
        receiver = amqp.create_receiver("/topic/amo.#", credit=10)
        up(g)
        g.call(lambda: g.broker.connect().session().producer(Destination.topic("amo.x")).send(
            Message.text("m", properties={"k": "v"}, type="t", correlation_id="c")))
        got = receiver.receive(timeout=10)
        receiver.accept()
        assert got.body == "m" and got.subject is None and got.correlation_id is None
        assert not got.properties  # export_properties = false
        assert got.annotations[ANN_ORIGIN] == g.broker.id
        wait_for(lambda: info(g)["far"]["exported"] == 1, what="export counted")
        assert info(g)["far"]["spooled"] == 0
    finally:
        g.stop()


def test_topic_import_only_while_subscribed_and_marked_imported(tmp_path, rabbitmq, amqp):
    g = gateway(tmp_path / "gw", rabbitmq.amqp_port, 'in.> import="far"\n>\n')
    try:
        up(g)
        assert info(g)["far"]["imports"] == {"in.>": []}
        sender = amqp.create_sender("/topic/in.x")
        sender.send(proton.Message(body="nobody listens"))  # no far-side binding: dropped
        got: list[Any] = []
        consumer = g.call(lambda: g.broker.connect().session().consumer(
            Destination.topic("in.x"), listener=got.append))
        assert info(g)["far"]["imports"] == {"in.>": ["in.x"]}
        attached(g, 1)
        sender.send(proton.Message(body="42", properties={"k": "v", "n": proton.short(3)},
                                   subject="jt", durable=False))
        wait_for(lambda: got, what="the import")
        msg = got[0].msg
        assert msg.body == "42" and msg.destination == Destination.topic("in.x")
        assert msg.properties["k"] == "v" and type(msg.properties["n"]) is Int16
        assert msg.type == "jt"  # on a concrete link the subject stays the JMSType
        assert msg.properties[PROP_IMPORTED] == "far"
        assert msg.delivery_mode == DeliveryMode.NON_PERSISTENT  # topic_import_dm default
        g.call(lambda: consumer.close())
        assert info(g)["far"]["imports"] == {"in.>": []}
        # RabbitMQ answers no detach of a /topic link, and may still deliver on it: whatever
        # comes is taken and dropped, never imported.
        sender.send(proton.Message(body="after"))
        time.sleep(0.5)
        assert info(g)["far"]["imported"] == 1 and len(got) == 1
    finally:
        g.stop()


def test_wildcard_import_names_messages_by_to_or_routing_key(tmp_path, rabbitmq, amqp):
    g = gateway(tmp_path / "gw", rabbitmq.amqp_port, 'wild.> import="far"\n>\n')
    mq = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    try:
        up(g)
        got: list[Any] = []
        g.call(lambda: g.broker.connect().session().consumer(
            Destination.topic("wild.>"), listener=got.append))
        attached(g, 1)  # /topic/wild.# : EMS `>` is AMQP 0-9-1's `#`
        mq.connect("127.0.0.1", rabbitmq.mqtt_port)
        mq.loop_start()
        mq.publish("wild/a/b", b"from mqtt", qos=1).wait_for_publish(5)
        wait_for(lambda: len(got) == 1, what="the MQTT-published import")
        amqp.create_sender("/topic/wild.c").send(
            proton.Message(body="from amqp", address="/topic/wild.c", subject="jt"))
        mq.publish("wild", b"zero words", qos=1).wait_for_publish(5)  # `#` matches, `>` not
        wait_for(lambda: len(got) == 2, what="the AMQP-published import")
        time.sleep(0.3)
        by_body = {d.msg.body if isinstance(d.msg.body, str) else bytes(d.msg.body): d.msg
                   for d in got}
        assert set(by_body) == {b"from mqtt", "from amqp"}
        m1 = by_body[b"from mqtt"]
        assert m1.destination == Destination.topic("wild.a.b") and m1.type is None
        m2 = by_body["from amqp"]
        assert m2.destination == Destination.topic("wild.c") and m2.type == "jt"
    finally:
        mq.loop_stop()
        mq.disconnect()
        g.stop()


def test_queue_import_is_persistent_and_accepted_only_once_stored(tmp_path, rabbitmq, amqp):
    name = unique("jobs")
    g = gateway(tmp_path / "gw", rabbitmq.amqp_port, ">\n", queues=f'{name} import="far"\n>\n',
                queue_import_dm="PERSISTENT")
    try:
        up(g)
        attached(g, 1)  # a queue entry imports at once, with no receiver on the gateway
        sender = amqp.create_sender(f"/queue/{name}")
        for i in range(5):
            sender.send(proton.Message(body=f"j{i}", durable=False))
        wait_for(lambda: g.call(lambda: name in g.broker.queues and
                                g.broker.queues[name].count == 5), what="the queue filled")
        msgs = g.call(lambda: list(g.broker.queues[name].iter_pending()))
        assert [m.body for m in msgs] == [f"j{i}" for i in range(5)]
        assert {m.delivery_mode for m in msgs} == {DeliveryMode.PERSISTENT}

        def far_count() -> int:
            rows = rabbitmq.ctl("list_queues", "name", "messages", "--quiet").stdout.split("\n")
            return next(int(r.split()[1]) for r in rows if r.split()[:1] == [name])

        wait_for(lambda: far_count() == 0, timeout=20, what="RabbitMQ's queue emptied (accepted)")
    finally:
        g.stop()


def test_two_gateways_bridged_through_rabbitmq_neither_loop_nor_duplicate(tmp_path, rabbitmq):
    topics = 'b.> import="far",export="far"\n>\n'
    g1 = gateway(tmp_path / "g1", rabbitmq.amqp_port, topics)
    g2 = gateway(tmp_path / "g2", rabbitmq.amqp_port, topics)
    try:
        for g in (g1, g2):
            up(g)
        got1: list[Any] = []
        got2: list[Any] = []
        g1.call(lambda: g1.broker.connect().session().consumer(
            Destination.topic("b.x"), listener=got1.append))
        g2.call(lambda: g2.broker.connect().session().consumer(
            Destination.topic("b.x"), listener=got2.append))
        attached(g1, 1)
        attached(g2, 1)

        def send(g: GatewayThread, text: str) -> None:
            g.broker.connect().session().producer(Destination.topic("b.x")).send(
                Message.text(text))

        for i in range(10):
            g1.call(lambda i=i: send(g1, f"from1-{i}"))
            g2.call(lambda i=i: send(g2, f"from2-{i}"))
        wait_for(lambda: len(got1) == 20 and len(got2) == 20, what="both sides")
        time.sleep(0.5)  # anything looping would arrive now
        expected = sorted([f"from1-{i}" for i in range(10)] + [f"from2-{i}" for i in range(10)])
        for got in (got1, got2):
            assert sorted(d.msg.body for d in got) == expected
        for g in (g1, g2):
            t = info(g)["far"]
            assert (t["exported"], t["imported"]) == (10, 10)
            assert t["dropped_loop"] == 10  # its own exports, back from RabbitMQ
    finally:
        g1.stop()
        g2.stop()


def test_nested_map_body_round_trip_between_two_gateways(tmp_path, rabbitmq):
    g1 = gateway(tmp_path / "g1", rabbitmq.amqp_port, 'nm.> export="far"\n>\n')
    g2 = gateway(tmp_path / "g2", rabbitmq.amqp_port, 'nm.> import="far"\n>\n')
    try:
        up(g1)
        up(g2)
        got: list[Any] = []
        g2.call(lambda: g2.broker.connect().session().consumer(
            Destination.topic("nm.m"), listener=got.append))
        attached(g2, 1)

        def body() -> dict[str, Any]:
            return {"a": Int16(1), "name": "n", "inner": {"x": [Int8(1), "two", 3.5],
                                                        "deep": {"bin": b"\x00\x01", "f": Float32(0.5)}},
                    "list": [{"k": Int32(9)}, [True, None]]}

        g1.call(lambda: g1.broker.connect().session().producer(Destination.topic("nm.m")).send(
            Message.map(body(), properties={"p": Int8(5)})))
        wait_for(lambda: got, what="the map message")
        msg = got[0].msg
        expected = body()
        assert msg.body == expected and msg.body_kind == Message.map({}).body_kind
        assert type(msg.body["a"]) is Int16
        inner = msg.body["inner"]
        assert [type(v) for v in inner["x"]] == [Int8, str, float]
        assert type(inner["deep"]["f"]) is Float32 and inner["deep"]["bin"] == b"\x00\x01"
        assert type(msg.body["list"][0]["k"]) is Int32
        assert type(msg.properties["p"]) is Int8 and msg.origin == g1.broker.id and msg.hops == 1
    finally:
        g1.stop()
        g2.stop()


def test_a_temporary_reply_to_is_answered_across_the_bridge(tmp_path, rabbitmq, amqp):
    """EMS arranges replies to a temporary JMSReplyTo across a transport (EMS User's Guide,
    chapter "Working With TIBCO Rendezvous", "Export Issues"): the request goes out with a far
    address that leads back, a proton responder on RabbitMQ answers it, and the reply reaches
    the temporary queue; the route goes with the queue."""
    g = gateway(tmp_path / "gw", rabbitmq.amqp_port, 'svc.> export="far"\n>\n')
    t = g.gateway.transports.transports["far"]
    try:
        requests = amqp.create_receiver("/topic/svc.#", credit=10)
        up(g)
        replies: list[Any] = []

        def request() -> tuple[Any, Destination]:
            conn = g.broker.connect()
            s = conn.session()
            temp = conn.temporary_queue()
            s.consumer(temp, listener=replies.append)
            s.producer(Destination.topic("svc.echo")).send(
                Message.text("ping", reply_to=temp, correlation_id="c-1"))
            return conn, temp

        conn, temp = g.call(request)
        req = requests.receive(timeout=10)
        requests.accept()
        route = f"/topic/gw-reply.{g.broker.id}.q{temp.name.rsplit('.', 1)[-1]}"
        assert req.body == "ping" and req.reply_to == route
        responder = amqp.create_sender(req.reply_to)  # the far side answers where it was told
        responder.send(proton.Message(body="pong", correlation_id=req.correlation_id))
        wait_for(lambda: replies, what="the reply on the temporary queue")
        reply = replies[0].msg
        assert reply.body == "pong" and reply.correlation_id == "c-1"
        assert reply.destination == temp and reply.properties[PROP_IMPORTED] == "far"
        g.call(conn.close)  # the temporary queue is deleted with its connection
        wait_for(lambda: g.call(lambda: route not in t.replies and not t.reply_links),
                 timeout=30, what="the route dropped")
        responder.send(proton.Message(body="too late"))
        time.sleep(0.5)
        assert len(replies) == 1 and info(g)["far"]["imported"] == 1
    finally:
        g.stop()


@pytest.mark.parametrize("durable", [True, False])
def test_a_durable_subscription_outlives_a_gateway_restart(tmp_path, durable):
    """``durable_subscriptions = true`` against another gateway (whose AMQP adapter keeps a
    durable subscription per container id and link name): what the far side publishes while
    this gateway is stopped reaches its durable subscriber after the restart. The container
    id (``gw-<gateway id>-<name>``) is the same after a restart: the id is in the store."""
    far = GatewayThread(tmp_path / "far", gateway="listen = amqp://127.0.0.1:0\n"
                        "listen = http://127.0.0.1:0\n").start()
    g = gateway(tmp_path / "gw", far.port("amqp"), 'dur.> import="far"\n>\n',
                address_prefix_topic="topic://", address_prefix_queue="queue://",
                topic_import_dm="PERSISTENT", durable_subscriptions=str(durable).lower())
    got: list[Any] = []

    def subscribe() -> Any:
        conn = g.broker.connect(client_id="app")
        conn.session().consumer(Destination.topic("dur.r"), durable_name="keep",
                                listener=got.append)
        return conn

    def publish(start: int, n: int) -> None:
        def send() -> None:
            p = far.broker.connect().session().producer(
                Destination.topic("dur.r"), delivery_mode=DeliveryMode.PERSISTENT)
            for i in range(start, start + n):
                p.send(Message.text(f"r{i}"))
        far.call(send)

    try:
        up(g)
        app = g.call(subscribe)
        attached(g, 1)
        publish(0, 3)
        wait_for(lambda: len(got) == 3, what="the first messages")

        def acknowledged() -> bool:
            return all(sub.count == 0 for sub in g.broker.all_subscriptions()
                       if sub.name == "keep")

        wait_for(lambda: g.call(acknowledged), what="the first messages acknowledged")
        g.call(app.close)  # the local durable subscription stays, and so does the import
        gid = g.broker.id
        g.stop()
        publish(3, 3)  # while this gateway is stopped
        g.start()
        assert g.broker.id == gid
        up(g)
        attached(g, 1)  # the restored local subscription asked for the far side again
        publish(6, 3)
        g.call(subscribe)
        wait_for(lambda: "r8" in [d.msg.body for d in got], what="the later messages")
        time.sleep(0.5)
        bodies = [d.msg.body for d in got]
        kept = range(9) if durable else [0, 1, 2, 6, 7, 8]  # without it, lost while away
        assert bodies == [f"r{i}" for i in kept]
    finally:
        g.stop()
        far.stop()


def test_the_delivery_log_writes_a_transport_s_traffic_as_its_own(tmp_path, rabbitmq, amqp):
    """docs/delivery-log.md, "Events", through RabbitMQ: the imports and the export name the
    transport with no reason, each import is its message's one entry record (before its
    delivery to a local consumer), the export has no deliver or ack of its hand-off to the
    transport; a second copy of an import (the same trace id) is dropped with a record that
    carries what its import would have (the copy's AMQP message-id)."""
    name = unique("dl")
    g = gateway(tmp_path / "gw", rabbitmq.amqp_port, 'out.> export="far"\n>\n',
                queues=f'{name} import="far"\n>\n')
    got: list[Any] = []
    try:
        receiver = amqp.create_receiver("/topic/out.#", credit=10)
        up(g)
        attached(g, 1)
        g.call(lambda: g.broker.connect().session().consumer(Destination.queue(name),
                                                             listener=got.append))
        sender = amqp.create_sender(f"/queue/{name}")
        sender.send(proton.Message(id="once", body="once"))
        for _ in range(2):
            sender.send(proton.Message(id="twice", body="twice",
                                       annotations={ANN_TRACE: "trace-twice"}))
        wait_for(lambda: len(got) == 2 and info(g)["far"]["duplicates"] == 1,
                 what="two imports, the second copy dropped")
        g.call(lambda: g.broker.connect().session().producer(Destination.topic("out.dl"))
               .send(Message.text("out")))
        assert receiver.receive(timeout=10).body == "out"
        receiver.accept()
        wait_for(lambda: info(g)["far"]["exported"] == 1, what="the export confirmed")
        records = exported_records(g, "far")
        drop = check_duplicate_drop(records, "far", "trace-twice")
        assert drop["msg_id"] == drop["far_id"] == "twice"
    finally:
        g.stop()


def test_exports_wait_in_the_spool_while_rabbitmq_is_down(tmp_path, rabbitmq):
    """Last in the module: stops and starts the node's application. The far address is a
    queue (``address_prefix_topic = /queue/``) so that what is drained waits there for the
    receiver instead of racing it."""
    name = unique("sp")
    g = gateway(tmp_path / "gw", rabbitmq.amqp_port, f'{name}.> export="far"\n>\n',
                address_prefix_topic="/queue/")
    try:
        up(g)
        rabbitmq.ctl("stop_app")
        wait_for(lambda: info(g)["far"]["state"] != "up", what="transport down")

        def send(n: int) -> None:
            p = g.broker.connect().session().producer(Destination.topic(f"{name}.t"))
            for i in range(n):
                p.send(Message.text(f"m{i}"))

        g.call(lambda: send(20))
        assert info(g)["far"]["spooled"] == 20 and info(g)["far"]["exported"] == 0
        rabbitmq.ctl("start_app")
        up(g)
        wait_for(lambda: info(g)["far"]["spooled"] == 0, timeout=15, what="spool drained")
        assert info(g)["far"]["exported"] == 20 and info(g)["far"]["connects"] == 2
        conn = BlockingConnection(f"amqp://127.0.0.1:{rabbitmq.amqp_port}", timeout=10)
        try:
            receiver = conn.create_receiver(f"/queue/{name}.t", credit=50)
            bodies = []
            for _ in range(20):
                bodies.append(receiver.receive(timeout=10).body)
                receiver.accept()
            assert bodies == [f"m{i}" for i in range(20)]
        finally:
            conn.close()
    finally:
        g.stop()


def test_the_delivery_log_names_the_far_side_of_an_import_and_an_export(tmp_path, rabbitmq,
                                                                        amqp):
    """``far_id`` and ``far_dest`` of the import and export records (docs/delivery-log.md):
    the AMQP message-id and address a message came with, and went out with."""
    name = unique("dl")
    g = gateway(tmp_path / "gw", rabbitmq.amqp_port, 'out.> export="far"\n>\n',
                queues=f'{name} import="far"\n>\n')
    try:
        receiver = amqp.create_receiver("/topic/out.#", credit=10)
        up(g)
        attached(g, 1)
        amqp.create_sender(f"/queue/{name}").send(proton.Message(id="far-7", body="j"))
        sent: list[Message] = []

        def send() -> None:
            m = Message.text("hello")
            g.broker.connect().session().producer(Destination.topic("out.dl")).send(m)
            sent.append(m)

        g.call(send)
        assert receiver.receive(timeout=10).body == "hello"
        receiver.accept()

        def events() -> dict[str, dict[str, Any]]:
            return {r["event"]: r for r in log_records(g) if r["event"] in ("import", "export")}

        got = wait_for(lambda: len(events()) == 2 and events(), what="import and export")
        imp, exp = got["import"], got["export"]
        assert (imp["dest"], imp["far_id"], imp["far_dest"]) == (
            f"queue:{name}", "far-7", f"/queue/{name}")
        assert (exp["dest"], exp["far_id"], exp["far_dest"]) == (
            "topic:out.dl", sent[0].message_id, "/topic/out.dl")
    finally:
        g.stop()
