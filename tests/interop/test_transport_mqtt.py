"""The mqtt transport against a real mosquitto: export, import, spool, loops
(TIBCO EMS User's Guide, chapter "Working With TIBCO Rendezvous", "Topics" and "Queues")."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

import gw
import paho.mqtt.client as paho
import pytest
from gw import GatewayThread
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from peers.mosquitto import start_mosquitto
from transportlog import check_duplicate_drop, exported_records, log_records

from gateway.message import PROP_IMPORTED, DeliveryMode, Destination, Message
from gateway.types import Int16

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def wait_for(cond: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    return gw.wait_for(cond, timeout, what)


class Remote:
    """A paho client on the far side (mosquitto), collecting what it receives."""

    def __init__(self, port: int, v5: bool = True) -> None:
        self.got: list[paho.MQTTMessage] = []
        self.c = paho.Client(CallbackAPIVersion.VERSION2,
                             protocol=MQTTProtocolVersion.MQTTv5 if v5 else
                             MQTTProtocolVersion.MQTTv311)
        self.c.on_message = lambda c, u, m: self.got.append(m)
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()

    def subscribe(self, topic: str, qos: int = 1) -> None:
        done: list[int] = []
        self.c.on_subscribe = lambda *a: done.append(1)
        self.c.subscribe(topic, qos)
        wait_for(lambda: done, what="SUBACK")

    def publish(self, topic: str, payload: bytes, qos: int = 1, **props: Any) -> None:
        pp = None
        if props:
            pp = Properties(PacketTypes.PUBLISH)
            for k, v in props.items():
                setattr(pp, k, v)
        self.c.publish(topic, payload, qos, properties=pp).wait_for_publish(5)

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()
        # paho closes its wake-up socket pair only here (or when the client is collected)
        self.c.reinitialise()


def transports_conf(port: int, **extra: str) -> str:
    lines = ["[far]", "type = mqtt", f"url = mqtt://127.0.0.1:{port}", "reconnect_min = 100msec",
             "reconnect_max = 500msec"]
    lines += [f"{k} = {v}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def gateway(tmp, port: int, topics: str, queues: str = ">\n", uvloop: bool = True,
            **extra: str) -> GatewayThread:
    """The gateway under test on uvloop, as ``gateway serve`` runs it (the transport's
    connection is the loop's, which differs between the two loops)."""
    return GatewayThread(
        tmp, gateway="listen = http://127.0.0.1:0\nmqtt_transports = enabled\n",
        transports=transports_conf(port, **extra), topics=topics, queues=queues, uvloop=uvloop,
    ).start()


def info(g: GatewayThread) -> dict[str, Any]:
    return {t["name"]: t for t in g.admin_get("/api/v1/transports")}


def subscribed(g: GatewayThread) -> bool:
    """Transport ``far`` is up and the far side answered every SUBSCRIBE it sent, so what is
    published there from now on is imported."""
    far = info(g)["far"]
    return far["state"] == "up" and far["subscribing"] == 0


@pytest.fixture
def mosq(tmp_path):
    with start_mosquitto(tmp_path / "mosq") as m:
        yield m


@pytest.mark.parametrize("uvloop", [True, False], ids=["uvloop", "asyncio"])
def test_export_keeps_payload_properties_and_types(tmp_path, mosq, uvloop):
    g = gateway(tmp_path / "gw", mosq.port, 'out.> export="far"\n>\n', uvloop=uvloop)
    remote = Remote(mosq.port)
    try:
        remote.subscribe("out/#")
        wait_for(lambda: info(g)["far"]["state"] == "up", what="transport up")

        def send() -> None:
            s = g.broker.connect().session()
            s.producer(Destination.topic("out.a")).send(
                Message.text("hello", properties={"n": Int16(7), "s": "x"}, type="t1"))

        g.call(send)
        wait_for(lambda: remote.got, what="the export")
        m = remote.got[0]
        assert m.topic == "out/a" and m.payload == b"hello" and m.qos == 1
        user = dict(m.properties.UserProperty)
        assert user["n"] == "7" and user["s"] == "x" and user["JMSType"] == "t1"
        assert "n:int16" in user["gw-types"]
        assert user["gw-origin"] == g.broker.id and user["gw-hops"] == "0"
        wait_for(lambda: info(g)["far"]["exported"] == 1, what="export counted")
        t = g.gateway.transports.transports["far"]  # type: ignore[union-attr]
        assert t.wire.transport.get_extra_info("sslcontext") is None  # plain TCP
    finally:
        remote.close()
        g.stop()


@pytest.mark.parametrize("version", ["3.1.1", "5"])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_export_and_import_at_every_qos_and_version(tmp_path, mosq, version, qos):
    g = gateway(tmp_path / "gw", mosq.port, 'ex.> export="far"\nim.> import="far"\n>\n',
                qos=str(qos), protocol_version=version)
    remote = Remote(mosq.port, v5=version == "5")
    got: list[Any] = []
    try:
        remote.subscribe("ex/#", qos=2)
        wait_for(lambda: info(g)["far"]["state"] == "up", what="transport up")
        g.call(lambda: g.broker.connect().session().consumer(
            Destination.topic("im.>"), listener=got.append))
        wait_for(lambda: subscribed(g), what="the far side's SUBACK")
        g.call(lambda: g.broker.connect().session().producer(Destination.topic("ex.q")).send(
            Message(b"out")))
        remote.publish("im/q", b"in", qos=2)
        wait_for(lambda: remote.got and got, what="both directions")
        assert remote.got[0].payload == b"out" and remote.got[0].qos == qos
        assert got[0].msg.body == b"in" and got[0].msg.destination == Destination.topic("im.q")
        wait_for(lambda: info(g)["far"]["exported"] == 1 and info(g)["far"]["imported"] == 1,
                 what="counters")
        assert info(g)["far"]["spooled"] == 0
    finally:
        remote.close()
        g.stop()


def test_topic_import_only_while_subscribed_and_marked_imported(tmp_path, mosq):
    g = gateway(tmp_path / "gw", mosq.port, 'in.> import="far"\n>\n')
    remote = Remote(mosq.port)
    try:
        wait_for(lambda: info(g)["far"]["state"] == "up", what="transport up")
        assert info(g)["far"]["imports"] == {"in.>": []}
        got: list[Any] = []

        def subscribe() -> Any:
            s = g.broker.connect().session()
            return s.consumer(Destination.topic("in.x"), listener=got.append)

        consumer = g.call(subscribe)
        assert info(g)["far"]["imports"] == {"in.>": ["in.x"]}
        wait_for(lambda: subscribed(g), what="the far side's SUBACK")
        remote.publish("in/x", b"42", qos=1, UserProperty=[("k", "v")])
        wait_for(lambda: got, what="the import")
        msg = got[0].msg
        assert msg.body == b"42" and msg.properties["k"] == "v"
        assert msg.properties[PROP_IMPORTED] == "far"
        assert msg.delivery_mode == DeliveryMode.NON_PERSISTENT  # topic_import_dm default
        g.call(lambda: consumer.close())
        assert info(g)["far"]["imports"] == {"in.>": []}
    finally:
        remote.close()
        g.stop()


def test_wildcard_queue_import_creates_child_queues_without_receivers(tmp_path, mosq):
    g = gateway(tmp_path / "gw", mosq.port, ">\n", queues='jobs.* import="far"\n>\n',
                queue_import_dm="PERSISTENT")
    remote = Remote(mosq.port)
    try:
        wait_for(lambda: info(g)["far"]["state"] == "up", what="transport up")
        wait_for(lambda: subscribed(g), what="the far side's SUBACK")
        remote.publish("jobs/a", b"1")
        remote.publish("jobs/b", b"2")
        wait_for(lambda: g.call(lambda: "jobs.a" in g.broker.queues and
                                "jobs.b" in g.broker.queues), what="child queues")
        bodies = g.call(lambda: [m.body for n in ("jobs.a", "jobs.b")
                                 for m in g.broker.queues[n].iter_pending()])
        assert bodies == [b"1", b"2"]
        modes = g.call(lambda: {m.delivery_mode for m in g.broker.queues["jobs.a"].iter_pending()})
        assert modes == {DeliveryMode.PERSISTENT}
    finally:
        remote.close()
        g.stop()


@pytest.mark.parametrize("version", ["3.1.1", "5"])
def test_two_gateways_bridged_through_mosquitto_neither_loop_nor_duplicate(tmp_path, mosq,
                                                                           version):
    topics = 'b.> import="far",export="far"\n>\n'
    g1 = gateway(tmp_path / "g1", mosq.port, topics, protocol_version=version)
    g2 = gateway(tmp_path / "g2", mosq.port, topics, protocol_version=version)
    try:
        for g in (g1, g2):
            wait_for(lambda g=g: info(g)["far"]["state"] == "up", what="transport up")
        got1: list[Any] = []
        got2: list[Any] = []
        g1.call(lambda: g1.broker.connect().session().consumer(
            Destination.topic("b.x"), listener=got1.append))
        g2.call(lambda: g2.broker.connect().session().consumer(
            Destination.topic("b.x"), listener=got2.append))
        wait_for(lambda: subscribed(g1) and subscribed(g2), what="the far side's SUBACKs")

        def send(g: GatewayThread, text: str) -> None:
            g.broker.connect().session().producer(Destination.topic("b.x")).send(
                Message.text(text))

        for i in range(10):
            g1.call(lambda i=i: send(g1, f"from1-{i}"))
            g2.call(lambda i=i: send(g2, f"from2-{i}"))
        wait_for(lambda: len(got1) == 20 and len(got2) == 20, what="both sides")
        time.sleep(0.5)  # anything looping would arrive now
        for got in (got1, got2):
            # over 3.1.1 an imported text arrives as bytes (no payload format indicator)
            bodies = sorted(b.decode() if isinstance(b, bytes) else b
                            for b in (d.msg.body for d in got))
            assert bodies == sorted([f"from1-{i}" for i in range(10)] +
                                    [f"from2-{i}" for i in range(10)])
        assert info(g1)["far"]["exported"] == 10 and info(g2)["far"]["exported"] == 10
        assert info(g1)["far"]["imported"] == 10 and info(g2)["far"]["imported"] == 10
    finally:
        g1.stop()
        g2.stop()


def test_a_temporary_reply_to_is_answered_across_the_bridge(tmp_path, mosq):
    g = gateway(tmp_path / "gw", mosq.port, 'svc.> export="far"\n>\n')
    responder = Remote(mosq.port)
    try:
        responder.subscribe("svc/#")
        wait_for(lambda: info(g)["far"]["state"] == "up", what="transport up")
        replies: list[Any] = []

        def request() -> str:
            conn = g.broker.connect()
            s = conn.session()
            temp = conn.temporary_queue()
            s.consumer(temp, listener=replies.append)
            s.producer(Destination.topic("svc.echo")).send(
                Message.text("ping", reply_to=temp, correlation_id="c-1"))
            return temp.name

        temp_name = g.call(request)
        wait_for(lambda: responder.got, what="the request")
        req = responder.got[0]
        rt = req.properties.ResponseTopic
        assert rt == f"gw-reply/{g.broker.id}/q{temp_name.rsplit('.', 1)[-1]}"
        responder.publish(rt, b"pong", qos=1, CorrelationData=req.properties.CorrelationData)
        wait_for(lambda: replies, what="the reply")
        reply = replies[0].msg
        assert reply.body == b"pong" and reply.correlation_id == b"c-1"
        assert reply.destination.name == temp_name
    finally:
        responder.close()
        g.stop()


def post(g: GatewayThread, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return g.admin_post(path, body)  # type: ignore[no-any-return]


def test_import_and_export_bound_at_run_time_through_the_admin_api(tmp_path, mosq):
    g = gateway(tmp_path / "gw", mosq.port, ">\n")
    remote = Remote(mosq.port)
    try:
        remote.subscribe("live/#")
        wait_for(lambda: info(g)["far"]["state"] == "up", what="transport up")
        assert post(g, "/api/v1/topics/live.>", {"properties": 'export="far"'}) == (
            200, {"name": "live.>", "kind": "topic", "properties": 'export="far"'})
        status, err = post(g, "/api/v1/topics/x", {"properties": 'export="nope"'})
        assert status == 400 and "nope" in err["error"]
        assert post(g, "/api/v1/queues/inq", {"properties": 'import="far"'})[0] == 200
        assert info(g)["far"]["exports"] == ["live.>"]
        assert info(g)["far"]["imports"] == {"inq": ["inq"]}
        g.call(lambda: g.broker.connect().session().producer(Destination.topic("live.a"))
               .send(Message.text("now")))
        wait_for(lambda: remote.got, what="the export")
        assert remote.got[0].payload == b"now"
        wait_for(lambda: subscribed(g), what="the far side's SUBACK")
        remote.publish("inq", b"queued")
        wait_for(lambda: g.call(lambda: "inq" in g.broker.queues and
                                [m.body for m in g.broker.queues["inq"].iter_pending()]),
                 what="the import")
    finally:
        remote.close()
        g.stop()


def test_a_burst_read_in_one_go_is_imported_whole_and_in_order(tmp_path, mosq):
    """300 PUBLISHes arrive in a few reads (many packets each): every one is imported, in
    the order sent."""
    g = gateway(tmp_path / "gw", mosq.port, ">\n", queues='burst import="far"\n>\n')
    remote = Remote(mosq.port)
    try:
        wait_for(lambda: info(g)["far"]["state"] == "up", what="transport up")
        wait_for(lambda: info(g)["far"]["imports"], what="the far-side subscription")
        wait_for(lambda: subscribed(g), what="the far side's SUBACK")
        infos = [remote.c.publish("burst", b"%04d" % i, qos=0) for i in range(300)]
        for i in infos:
            i.wait_for_publish(5)

        def count() -> int:
            q = g.broker.queues.get("burst")
            return 0 if q is None else sum(1 for _ in q.iter_pending())

        wait_for(lambda: g.call(count) == 300, timeout=10, what="all 300 imported")
        assert g.call(lambda: [m.body for m in g.broker.queues["burst"].iter_pending()]) == [
            b"%04d" % i for i in range(300)]
    finally:
        remote.close()
        g.stop()


def test_mqtts_to_another_gateway_both_ways(tmp_path):
    """Over TLS (asyncio's ssl on the loop's connection) export and import both work."""
    from test_mqtt_tls_and_cli import make_cert

    cert, key = make_cert(tmp_path)
    far = GatewayThread(tmp_path / "far", gateway=(
        f"listen = mqtts://127.0.0.1:0\nlisten = http://127.0.0.1:0\n"
        f"tls_cert = {cert}\ntls_key = {key}\n")).start()
    got_far: list[Any] = []
    far.call(lambda: far.broker.connect().session().consumer(
        Destination.topic("tls.out"), listener=got_far.append))
    g = GatewayThread(
        tmp_path / "gw", uvloop=True,
        gateway="listen = http://127.0.0.1:0\nmqtt_transports = enabled\n",
        transports=(f"[far]\ntype = mqtt\nurl = mqtts://127.0.0.1:{far.port('mqtts')}\n"
                    f"tls_ca = {cert}\nreconnect_min = 100msec\nreconnect_max = 500msec\n"),
        topics='tls.out export="far"\ntls.in import="far"\n>\n').start()
    try:
        wait_for(lambda: info(g)["far"]["state"] == "up", what="transport up over TLS")
        got: list[Any] = []
        g.call(lambda: g.broker.connect().session().consumer(
            Destination.topic("tls.in"), listener=got.append))
        wait_for(lambda: info(g)["far"]["imports"] == {"tls.in": ["tls.in"]},
                 what="the import's subscription")

        def send(gw: GatewayThread, name: str, n: int) -> None:
            p = gw.broker.connect().session().producer(Destination.topic(name))
            for i in range(n):
                p.send(Message.text(f"m{i}", properties={"n": Int16(i)}))

        g.call(lambda: send(g, "tls.out", 50))
        wait_for(lambda: len(got_far) == 50, what="the exports over TLS")
        assert [d.msg.body for d in got_far] == [f"m{i}" for i in range(50)]
        assert type(got_far[7].msg.properties["n"]) is Int16
        wait_for(lambda: info(g)["far"]["exported"] == 50, what="the PUBACKs over TLS")
        t = g.gateway.transports.transports["far"]  # type: ignore[union-attr]
        assert t.wire.transport.get_extra_info("sslcontext") is not None  # TLS
        wait_for(lambda: subscribed(g), what="the far side's SUBACK")
        far.call(lambda: send(far, "tls.in", 50))
        wait_for(lambda: len(got) == 50, what="the imports over TLS")
        assert [d.msg.body for d in got] == [f"m{i}" for i in range(50)]
    finally:
        g.stop()
        far.stop()


def test_the_delivery_log_names_the_far_side_of_an_import_and_an_export(tmp_path, mosq):
    """``far_dest`` (and ``far_id``: MQTT has no message id) of the import and export
    records, docs/delivery-log.md; the exported message is unchanged (same hashes)."""
    g = gateway(tmp_path / "gw", mosq.port, 'out.> export="far"\n>\n',
                queues='in.q import="far"\n>\n')
    remote = Remote(mosq.port)
    try:
        remote.subscribe("out/#")
        wait_for(lambda: info(g)["far"]["state"] == "up", what="transport up")
        # retained: the gateway's asynchronous SUBSCRIBE gets it whenever it is made
        remote.c.publish("in/q", b"42", qos=1, retain=True).wait_for_publish(5)
        g.call(lambda: g.broker.connect().session().producer(Destination.topic("out.a"))
               .send(Message.text("hello", properties={"n": Int16(7)})))
        wait_for(lambda: remote.got, what="the export")

        def events() -> dict[str, dict[str, Any]]:
            return {r["event"]: r for r in log_records(g) if r["event"] in ("import", "export")}

        records = wait_for(lambda: len(events()) == 2 and events(), what="import and export")
        imp, exp = records["import"], records["export"]
        assert (imp["dest"], imp["far_dest"], imp["far_id"]) == ("queue:in.q", "in/q", None)
        assert imp["body_hash"] == hashlib.blake2b(b"42", digest_size=8).hexdigest()
        assert (exp["dest"], exp["far_dest"], exp["far_id"]) == ("topic:out.a", "out/a", None)
        (pub,) = [r for r in log_records(g) if r["event"] == "publish" and r["dest"] == "topic:out.a"]
        assert (exp["body_hash"], exp["props_hash"], exp["rules"]) == (
            pub["body_hash"], pub["props_hash"], None)
        assert exp["body_hash"] == hashlib.blake2b(b"hello", digest_size=8).hexdigest()
    finally:
        remote.c.publish("in/q", b"", qos=1, retain=True).wait_for_publish(5)
        remote.close()
        g.stop()


def test_the_delivery_log_writes_a_transport_s_traffic_as_its_own(tmp_path, mosq):
    """docs/delivery-log.md, "Events": the import and the export name the transport (``far``,
    not its core connection) with no reason; the import is the imported message's one entry
    record, before its delivery to a local consumer (whose deliver and ack are written as
    ever); the export is the exported message's way out, with no deliver or ack of its
    hand-off to the transport."""
    g = gateway(tmp_path / "gw", mosq.port, 'out.> export="far"\n>\n',
                queues='in.q import="far"\n>\n')
    remote = Remote(mosq.port)
    got: list[Any] = []
    try:
        remote.subscribe("out/#")
        wait_for(lambda: info(g)["far"]["state"] == "up", what="transport up")
        local = g.call(lambda: g.broker.connect())
        g.call(lambda: local.session().consumer(Destination.queue("in.q"), listener=got.append))
        # the far-side SUBSCRIBE is asynchronous: publish until one is imported
        wait_for(lambda: remote.publish("in/q", b"in") or got, what="an import")
        g.call(lambda: g.broker.connect().session().producer(Destination.topic("out.a"))
               .send(Message.text("out")))
        wait_for(lambda: remote.got, what="the export")
        wait_for(lambda: info(g)["far"]["exported"] == 1, what="the export confirmed")
        records = exported_records(g, "far")
        assert [r["client"] for r in records if r["event"] in ("deliver", "ack")] == [
            local.id, local.id] * info(g)["far"]["imported"]
    finally:
        remote.close()
        g.stop()


def test_a_duplicate_import_s_drop_record_carries_what_its_import_would_have(tmp_path, mosq):
    """Two copies of one message from the far side (the same trace id, as a resend after a
    lost PUBACK brings it): the second is dropped, and its ``drop`` record (docs/delivery-log.md,
    "Events", reason ``duplicate``) names the transport and carries a message id of its own
    and the import's trace id, far-side destination, hashes, delivery mode and size."""
    g = gateway(tmp_path / "gw", mosq.port, ">\n", queues='in.q import="far"\n>\n')
    remote = Remote(mosq.port)
    try:
        wait_for(lambda: info(g)["far"]["state"] == "up", what="transport up")
        wait_for(lambda: remote.publish("in/q", b"probe") or info(g)["far"]["imported"],
                 what="an import")
        for _ in range(2):
            remote.publish("in/q", b"twice", UserProperty=[("gw-trace-id", "trace-twice"),
                                                           ("colour", "red")])
        wait_for(lambda: info(g)["far"]["duplicates"] == 1, what="the second copy dropped")
        records = wait_for(lambda: (r := log_records(g)) and any(
            x["event"] == "drop" for x in r) and r, what="the drop record")
        drop = check_duplicate_drop(records, "far", "trace-twice")
        (imported,) = [r for r in records if r["event"] == "import"
                       and r["trace_id"] == "trace-twice"]
        assert drop["msg_id"] != imported["msg_id"]  # the copy's own: MQTT gives none
        assert drop["far_id"] is None and drop["far_dest"] == "in/q"
        assert drop["props_hash"] is not None and drop["mode"] == "NON_PERSISTENT"  # queue_import_dm
    finally:
        remote.close()
        g.stop()
