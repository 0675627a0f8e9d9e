"""Three ``gateway serve`` processes on a three-server NATS cluster (JetStream, loopback
ports) acting as one gateway for topics: a message published on any node reaches every
matching subscriber on every node once, in order, whatever protocol each speaks; a node
receives from NATS only the subjects it has a subscriber for; two nodes share a listener port
(``SO_REUSEPORT``)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
import stomp
from adminapi import admin_call, admin_get, admin_post, admin_text
from amqpclient import connect as amqp_connect
from clusternodes import StompQueueClient, cluster_info, node
from corehelp import write_config
from gw import wait_for
from paho.mqtt.enums import CallbackAPIVersion
from peers.mosquitto import free_port
from peers.natsserver import NatsCluster, start_nats_cluster
from prometheus_client.parser import text_string_to_metric_families
from serveproc import ROOT, ServeProcess


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    with start_nats_cluster(tmp_path / "nats") as c:
        yield c


@pytest.fixture
def nodes(tmp_path: Path, nats_cluster: NatsCluster) -> Iterator[list[ServeProcess]]:
    started: list[ServeProcess] = []
    try:
        for i in (1, 2, 3):
            started.append(node(tmp_path, nats_cluster, i))
        yield started
    finally:
        for p in started:
            p.stop()


class MqttClient:
    """A paho client on a node, collecting what it receives (topic, payload)."""

    def __init__(self, port: int, client_id: str = "") -> None:
        self.got: list[tuple[str, bytes]] = []
        self.lock = threading.Lock()
        self.c = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id)
        self.c.on_message = self._message
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()

    def _message(self, _c: Any, _u: Any, m: paho.MQTTMessage) -> None:
        with self.lock:
            self.got.append((m.topic, m.payload))

    def subscribe(self, pattern: str, qos: int = 1) -> None:
        done = threading.Event()
        self.c.on_subscribe = lambda *a: done.set()
        self.c.subscribe(pattern, qos)
        assert done.wait(10), "no SUBACK"

    def publish(self, topic: str, payload: bytes, qos: int = 1) -> None:
        self.c.publish(topic, payload, qos).wait_for_publish(10)

    def payloads(self, prefix: bytes = b"") -> list[bytes]:
        with self.lock:
            return [p for _, p in self.got if p.startswith(prefix)]

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def text(body: Any) -> str:
    """An AMQP body as text: a STOMP SEND without content-type is a bytes message."""
    return body if isinstance(body, str) else bytes(body).decode()


def wait_routed(publish: Any, receivers: list[Any], what: str) -> None:
    """Publish probes until every receiver has one: the subscriptions made on other nodes
    have then reached the publisher's NATS server (interest travels between servers)."""
    n = 0

    def probe() -> bool:
        nonlocal n
        n += 1
        publish(f"probe {n}".encode())
        return all(r() for r in receivers)

    wait_for(probe, timeout=30, what=what)


def test_mqtt_messages_reach_subscribers_on_every_node_once_in_order(nodes):
    publisher = MqttClient(nodes[0].port("mqtt"))
    local = MqttClient(nodes[0].port("mqtt"))
    remote2 = MqttClient(nodes[1].port("mqtt"))
    remote3 = MqttClient(nodes[2].port("mqtt"))
    try:
        for c in (local, remote2, remote3):
            c.subscribe("plant/+/temp")
        wait_routed(lambda b: publisher.publish("plant/probe/temp", b),
                    [lambda: remote2.payloads(b"probe"), lambda: remote3.payloads(b"probe")],
                    "interest of nodes 2 and 3 at node 1")
        sent = [f"m{i}".encode() for i in range(200)]
        for b in sent:
            publisher.publish("plant/line1/temp", b)
        for c in (local, remote2, remote3):
            wait_for(lambda c=c: len(c.payloads(b"m")) >= 200, timeout=30, what="200 messages")
        for c in (local, remote2, remote3):
            assert c.payloads(b"m") == sent  # once each, in order
        # each node's delivery log is written under its node id (its writer flushes in
        # batches: wait for the first file's first whole record)
        for i, p in enumerate(nodes, start=1):
            logs = p.config_dir / "data" / "delivery-log"

            def first_line(logs: Path = logs) -> str | None:
                files = sorted(logs.glob("dlog-*.jsonl"))
                text = files[0].read_text() if files else ""
                return text.split("\n", 1)[0] if "\n" in text else None

            first = json.loads(wait_for(first_line, timeout=30, what="a delivery log record"))
            files = sorted(logs.glob("dlog-*.jsonl"))
            assert all(f.name.startswith(f"dlog-t_n{i}-") for f in files)
            assert first["gw"] == f"t/n{i}"  # the cluster, and the node
    finally:
        for c in (publisher, local, remote2, remote3):
            c.close()


def test_stomp_to_amqp_and_stomp_across_nodes(nodes):
    receiver_conn = amqp_connect(nodes[2].port("amqp"))
    receiver = receiver_conn.create_receiver("topic://news.>")
    listener_msgs: list[str] = []

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame: Any) -> None:
            listener_msgs.append(frame.body)

    watcher = stomp.Connection12([("127.0.0.1", nodes[1].port("stomp"))])
    watcher.set_listener("", Listener())
    watcher.connect(wait=True)
    watcher.subscribe("/topic/news.>", id="1", ack="auto")
    sender = stomp.Connection12([("127.0.0.1", nodes[0].port("stomp"))])
    sender.connect(wait=True)
    amqp_got: list[str] = []

    def amqp_has_probe() -> bool:
        try:
            m = receiver.receive(timeout=0.05)
        except Exception:  # noqa: BLE001 - proton's Timeout: nothing yet
            return False
        receiver.accept()
        amqp_got.append(text(m.body))
        return True

    try:
        wait_routed(lambda b: sender.send("/topic/news.probe", b.decode()),
                    [amqp_has_probe, lambda: any(x.startswith("probe") for x in listener_msgs)],
                    "interest of nodes 2 and 3 at node 1")
        sent = [f"story {i}" for i in range(50)]
        for body in sent:
            sender.send("/topic/news.world", body, headers={"receipt": body})
        got: list[str] = []
        while len(got) < 50:
            m = receiver.receive(timeout=30)
            receiver.accept()
            if text(m.body).startswith("story"):
                got.append(text(m.body))
        assert got == sent
        wait_for(lambda: len([x for x in listener_msgs if x.startswith("story")]) == 50,
                 timeout=30, what="the STOMP subscriber on node 2")
        assert [x for x in listener_msgs if x.startswith("story")] == sent
    finally:
        sender.disconnect()
        watcher.disconnect()
        receiver_conn.close()


def test_a_node_receives_only_what_it_has_subscribers_for(nodes):
    publisher = MqttClient(nodes[0].port("mqtt"))
    sub2 = MqttClient(nodes[1].port("mqtt"))
    try:
        sub2.subscribe("wanted/#")
        wait_routed(lambda b: publisher.publish("wanted/probe", b),
                    [lambda: sub2.payloads(b"probe")], "interest of node 2 at node 1")
        # node 1 knows node 2's cover from its heartbeats (for its delivery log)
        wait_for(lambda: any("wanted.>" in row.get("cover", ()) for row in admin_get(
            nodes[0].port("http"), "/api/v1/cluster")["nodes"]), timeout=30,
            what="node 2's cover heard by node 1")
        for i in range(20):
            publisher.publish("unwanted/x", b"u%d" % i)
            publisher.publish("wanted/x", b"w%d" % i)
        wait_for(lambda: len(sub2.payloads(b"w")) == 20, timeout=30, what="20 wanted")
        # node 1 logs as dropped, for want of subscribers, what no node wanted, and not
        # what node 2 delivered: the cluster is one gateway to the reconciliation
        logs = nodes[0].config_dir / "data" / "delivery-log"

        def drops() -> dict[str, int]:
            out: dict[str, int] = {}
            for f in logs.glob("dlog-*.jsonl"):
                for line in f.read_text().splitlines():
                    r = json.loads(line)
                    if r["event"] == "drop" and r["reason"] == "no_subscribers":
                        out[r["dest"]] = out.get(r["dest"], 0) + 1
            return out

        wait_for(lambda: drops().get("topic:unwanted.x") == 20, timeout=30,
                 what="the unwanted messages logged dropped")
        assert "topic:wanted.x" not in drops()
        assert cluster_info(nodes[0])["forwarded"] >= 40
        node2, node3 = cluster_info(nodes[1]), cluster_info(nodes[2])
        assert node2["subscriptions"] == ["wanted.>"]
        assert node3["received"] == 0 and node3["subscriptions"] == []
        received2 = node2["received"]
        assert received2 == len(sub2.payloads()), "nothing unwanted reached node 2"
    finally:
        publisher.close()
        sub2.close()


def test_nodes_on_one_machine_share_the_listener_port(tmp_path, nats_cluster):
    port = free_port()
    a = node(tmp_path, nats_cluster, 1, mqtt_port=port)
    b = node(tmp_path, nats_cluster, 2, mqtt_port=port)
    clients: list[MqttClient] = []
    try:
        for i in range(40):
            c = MqttClient(port, client_id=f"dev{i}")
            c.subscribe("share/#")
            clients.append(c)

        def mqtt_connections(p: ServeProcess) -> int:
            rows = admin_get(p.port("http"), "/api/v1/connections")
            return sum(1 for r in rows if r["protocol"] == "mqtt")

        wait_for(lambda: mqtt_connections(a) + mqtt_connections(b) == 40, timeout=30,
                 what="40 connections")
        assert mqtt_connections(a) > 0 and mqtt_connections(b) > 0  # the kernel spread them
        wait_routed(lambda x: clients[0].publish("share/probe", x),
                    [lambda c=c: c.payloads(b"probe") for c in clients], "every client")
        clients[0].publish("share/all", b"hello")
        for c in clients:
            wait_for(lambda c=c: b"hello" in c.payloads(), timeout=30, what="hello")
            assert c.payloads(b"hello") == [b"hello"]
    finally:
        for c in clients:
            c.close()
        a.stop()
        b.stop()


def test_any_node_shows_every_node(nodes):
    client = MqttClient(nodes[2].port("mqtt"))
    try:
        def view() -> dict[str, dict[str, Any]]:
            answer = admin_get(nodes[0].port("http"), "/api/v1/cluster")
            return {row["node_id"]: row for row in answer["nodes"]}

        wait_for(lambda: set(view()) == {"n1", "n2", "n3"}
                 and all(r["up"] for r in view().values())
                 and view()["n3"]["connections"] >= 1, timeout=30, what="three nodes up")


        def up_in_metrics() -> dict[str, float]:
            page = admin_text(nodes[1].port("http"), "/metrics")
            return {s.labels["node"]: s.value for f in text_string_to_metric_families(page)
                    if f.name == "gateway_cluster_node_up" for s in f.samples}

        wait_for(lambda: up_in_metrics() == {"n1": 1.0, "n2": 1.0, "n3": 1.0}, timeout=30,
                 what="node 2's metrics showing every node up")
        # every node's connections, from any node
        rows = admin_get(nodes[0].port("http"), "/api/v1/cluster/connections")
        assert {r["node_id"] for r in rows if r["protocol"] == "mqtt"} == {"n3"}
        assert {r["node_id"] for r in rows} == {"n1", "n2", "n3"}  # the links at least
        nodes[2].stop()
        wait_for(lambda: not view()["n3"]["up"], timeout=30, what="n3 shown down")
    finally:
        client.close()


def test_a_node_whose_nats_servers_do_not_answer_refuses_to_start(tmp_path):
    d = tmp_path / "lonely"
    write_config(d, gateway=f"listen = mqtt://127.0.0.1:0\ncluster = nats://127.0.0.1:{free_port()}\n"
                 f"node_id = n9\nstore = {d / 'data'}\n")
    done = subprocess.run([sys.executable, "-m", "gateway", "serve", "--config-dir", str(d)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 1
    assert "cluster: cannot reach the NATS servers" in done.stderr


def test_an_mqtt_client_id_connecting_to_another_node_takes_the_first_over(nodes):
    from paho.mqtt.enums import MQTTProtocolVersion

    reasons: list[Any] = []
    first = paho.Client(CallbackAPIVersion.VERSION2, client_id="dev-7",
                        protocol=MQTTProtocolVersion.MQTTv5)
    first.on_disconnect = lambda c, u, flags, rc, props: reasons.append(rc)
    first.connect("127.0.0.1", nodes[0].port("mqtt"))
    first.loop_start()

    def client_ids(p: ServeProcess) -> list[str]:
        return [r["client_id"] for r in admin_get(p.port("http"), "/api/v1/connections")]

    try:
        wait_for(lambda: "dev-7" in client_ids(nodes[0]), timeout=30, what="dev-7 on node 1")
        # node 1 hears every node's heartbeats: its subscriptions are known to every server
        wait_for(lambda: [r["node_id"] for r in admin_get(nodes[0].port("http"),
                                                          "/api/v1/cluster")["nodes"]
                          if r["up"]] == ["n1", "n2", "n3"], timeout=30, what="every node heard")
        second = MqttClient(nodes[1].port("mqtt"), client_id="dev-7")
        try:
            wait_for(lambda: reasons, timeout=30, what="the first connection taken over")
            assert reasons[0].value == 0x8E  # Session taken over
            wait_for(lambda: "dev-7" not in client_ids(nodes[0]), timeout=30,
                     what="dev-7 gone from node 1")
            assert "dev-7" in client_ids(nodes[1])
        finally:
            second.close()
    finally:
        first.loop_stop()


def test_a_queue_is_one_queue_across_nodes(nodes):
    consumers = [StompQueueClient(p.port("stomp")) for p in nodes]
    sender = StompQueueClient(nodes[0].port("stomp"))
    try:
        for c in consumers:
            c.consume("/queue/jobs")
        n = 0

        def probe() -> bool:  # until every node pulls (its first request may come early)
            nonlocal n
            n += 1
            sender.send("/queue/jobs", f"probe {n}")
            return all(any(b.startswith("probe") for b in c.bodies()) for c in consumers)

        wait_for(probe, timeout=60, what="a probe on every node")
        wait_for(lambda: sum(len(c.bodies()) for c in consumers) == n, timeout=30,
                 what="every probe")
        for c in consumers:
            c.got.clear()
        # what waits in the queue is the cluster's, seen from any node
        wait_for(lambda: {q["name"]: q["messages"] for q in admin_get(
            nodes[2].port("http"), "/api/v1/cluster/store")["queues"]}.get("jobs", 0) == 0,
            timeout=30, what="the probes acknowledged")
        sent = [f"job {i}" for i in range(300)]
        for body in sent:
            sender.send("/queue/jobs", body)  # confirmed: JetStream has it
        wait_for(lambda: sum(len(c.bodies()) for c in consumers) >= 300, timeout=60,
                 what="300 jobs consumed")
        got = [b for c in consumers for b in c.bodies()]
        assert sorted(got) == sorted(sent)  # each message once, to one consumer
        assert all(c.bodies() for c in consumers), "consumers on every node had a share"
        for c in consumers:  # each one's share in the order sent
            assert c.bodies() == sorted(c.bodies(), key=sent.index)
        info = [cluster_info(p)["feeds"] for p in nodes]
        assert info[0]["queued"] == 300 + n
        assert sum(i["pulled"] for i in info) == 300 + n
        wait_for(lambda: sum(cluster_info(p)["feeds"]["acked"] for p in nodes) == 300 + n,
                 timeout=30, what="every message acknowledged to JetStream")
    finally:
        for c in [*consumers, sender]:
            c.close()


def test_what_a_killed_node_held_goes_to_a_consumer_on_another(tmp_path, nats_cluster):
    extra = "cluster_ack_wait = 2 sec\n"
    n1 = node(tmp_path, nats_cluster, 1, extra=extra)
    n2 = node(tmp_path, nats_cluster, 2, extra=extra)
    holder = StompQueueClient(n2.port("stomp"), hold=True)
    sender = StompQueueClient(n1.port("stomp"))
    receiver_conn = None
    try:
        holder.consume("/queue/orders")
        sent = [f"order {i}" for i in range(20)]
        for body in sent:
            sender.send("/queue/orders", body)
        wait_for(lambda: len(holder.bodies()) >= 1, timeout=30, what="node 2 holding orders")
        held = set(holder.bodies())
        n2.kill()  # SIGKILL: what it held was never acknowledged
        receiver_conn = amqp_connect(n1.port("amqp"))
        receiver = receiver_conn.create_receiver("queue://orders")
        got: dict[str, int] = {}
        while len(got) < 20:
            m = receiver.receive(timeout=60)
            receiver.accept()
            assert text(m.body) not in got, "delivered twice"
            got[text(m.body)] = m.delivery_count
        assert sorted(got) == sorted(sent)
        assert held <= set(got)
        # JMSRedelivered for what node 2 had delivered (and perhaps for what it had taken
        # from JetStream and not yet delivered: JetStream counts those as delivered too),
        # once: node 1's consumer takes one at a time (its link's credit), and node 1 does
        # not give back what waits for it meanwhile
        assert all(got[body] >= 1 for body in held), got
        assert max(got.values()) <= 1, got
    finally:
        holder.close()
        sender.close()
        if receiver_conn is not None:
            receiver_conn.close()
        n1.stop()
        n2.stop()


def refused_elsewhere(p: ServeProcess) -> None:
    """Persistent messages refused in each protocol's way: MQTT 5 PUBACK 0x80, MQTT 3.1.1
    a close with the message unacknowledged, AMQP ``rejected``; QoS 0 served locally."""
    from paho.mqtt.enums import MQTTProtocolVersion
    from proton import Message as AmqpMessage
    from proton.utils import SendException

    acks: list[int] = []
    v5 = paho.Client(CallbackAPIVersion.VERSION2, client_id="v5",
                     protocol=MQTTProtocolVersion.MQTTv5)
    v5.on_publish = lambda c, u, mid, rc, props: acks.append(rc.value)
    v5.connect("127.0.0.1", p.port("mqtt"))
    v5.loop_start()
    closed = threading.Event()
    v3 = paho.Client(CallbackAPIVersion.VERSION2, client_id="v3",
                     protocol=MQTTProtocolVersion.MQTTv311)
    v3.on_disconnect = lambda *a: closed.set()
    v3.connect("127.0.0.1", p.port("mqtt"))
    v3.loop_start()
    local = MqttClient(p.port("mqtt"))
    amqp = amqp_connect(p.port("amqp"))
    try:
        local.subscribe("local/#", qos=0)
        v5.publish("plant/x", b"q1", qos=1)
        wait_for(lambda: acks, timeout=30, what="MQTT 5 PUBACK")
        assert acks == [0x80]
        info = v3.publish("plant/x", b"q1", qos=1)
        assert closed.wait(30), "the 3.1.1 client closed"
        assert not info.is_published()
        v5.publish("local/x", b"q0", qos=0)
        wait_for(lambda: local.payloads(b"q0"), timeout=30, what="QoS 0 served on the node")
        sender = amqp.create_sender("queue://jobs")
        with pytest.raises(SendException):
            sender.send(AmqpMessage(body="durable", durable=True))
    finally:
        for c in (v5, v3):
            c.loop_stop()
            c.disconnect()
        local.close()
        amqp.close()


def test_a_node_without_nats_refuses_persistent_messages_and_serves_local_ones(
        tmp_path, nats_cluster):
    n1 = node(tmp_path, nats_cluster, 1)
    watcher = StompQueueClient(n1.port("stomp"))
    sender = StompQueueClient(n1.port("stomp"))
    late = None
    try:
        watcher.consume("/topic/local.news")
        for s in nats_cluster.servers:
            s.kill()
        wait_for(lambda: not cluster_info(n1)["connected"], timeout=30, what="NATS gone")
        sender.send("/topic/local.news", "non-persistent", persistent=False)
        wait_for(lambda: "non-persistent" in watcher.bodies(), timeout=30,
                 what="the local subscriber served")
        sender.send("/queue/jobs", "persistent")
        assert sender.errors and "unavailable" in sender.errors[0]
        refused_elsewhere(n1)
        for s in nats_cluster.servers:
            s.start()
        nats_cluster.wait_ready()
        wait_for(lambda: cluster_info(n1)["connected"], timeout=60, what="NATS back")
        late = StompQueueClient(n1.port("stomp"))
        n = 0

        def accepted() -> bool:  # the JetStream cluster elects its leaders again first
            nonlocal n
            n += 1
            late.errors.clear()
            late.send("/queue/jobs", f"again {n}")
            if late.errors:
                late.conn = stomp.Connection12([("127.0.0.1", n1.port("stomp"))])
                late.conn.set_listener("", late)
                late.conn.connect(wait=True)
                return False
            return True

        wait_for(accepted, timeout=60, what="persistent messages taken again")
        late.consume("/queue/jobs")
        wait_for(lambda: f"again {n}" in late.bodies(), timeout=30, what="the message")
    finally:
        for c in (watcher, sender, late):
            if c is not None:
                c.close()
        n1.stop()


def probe_durable(sender: StompQueueClient, dest: str, subscriber: StompQueueClient) -> None:
    """Send persistent probes until the durable subscriber has one: the sender's node then
    knows of the durable subscription (JetStream keeps what is sent to it from then on)."""
    n = 0

    def probe() -> bool:
        nonlocal n
        n += 1
        sender.send(dest, f"probe {n}")
        return any(b.startswith("probe") for b in subscriber.bodies())

    wait_for(probe, timeout=60, what="a probe kept for the durable")


def test_a_durable_subscription_resumes_on_another_node(nodes):
    durable = {"activemq.subscriptionName": "prices"}
    first = StompQueueClient(nodes[0].port("stomp"), client_id="app-1")
    sender = StompQueueClient(nodes[1].port("stomp"))
    try:
        first.consume("/topic/prices.>", durable)
        probe_durable(sender, "/topic/prices.probe", first)
        acked = first.stop_acking()  # what arrives after this is the subscription's still
        first.close()  # the subscription stays, its subscriber gone
        sent = [f"price {i}" for i in range(50)]
        for body in sent:
            sender.send("/topic/prices.eur", body)  # confirmed: kept in JetStream
        assert cluster_info(nodes[1])["feeds"]["stored"] >= 50
        kept = admin_get(nodes[2].port("http"), "/api/v1/cluster/store")["durables"]
        assert [d["key"] for d in kept] == ["sub:app-1:prices"]
        assert kept[0]["pending"] + kept[0]["unacknowledged"] >= 50

        def in_metrics() -> float:  # /metrics of any node, as read every few seconds
            page = admin_text(nodes[0].port("http"), "/metrics")
            return next((s.value for f in text_string_to_metric_families(page)
                         if f.name == "gateway_cluster_durable_messages" for s in f.samples
                         if s.labels["subscription"] == "sub:app-1:prices"), 0.0)

        wait_for(lambda: in_metrics() >= 50, timeout=30, what="the durable's backlog in /metrics")
        again = StompQueueClient(nodes[2].port("stomp"), client_id="app-1")
        try:
            again.consume("/topic/prices.>", durable)
            wait_for(lambda: len([b for b in again.bodies() if b.startswith("price")]) >= 50,
                     timeout=60, what="what was kept, on node 3")
            assert [b for b in again.bodies() if b.startswith("price")] == sent
            # what the first subscriber acknowledged does not come again (probes it had not
            # received yet do: they are the subscription's)
            assert not set(acked) & set(again.bodies())
        finally:
            again.close()
    finally:
        sender.close()


class Mqtt5Session:
    """A paho MQTT 5 client with a persistent session (Clean Start 0, an hour's expiry)."""

    def __init__(self, port: int, client_id: str) -> None:
        from paho.mqtt.enums import MQTTProtocolVersion
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        self.got: list[tuple[str, bytes, bool]] = []
        self.present: list[bool] = []
        self.lock = threading.Lock()
        self.c = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                             protocol=MQTTProtocolVersion.MQTTv5)
        self.c.on_message = self._message
        self.c.on_connect = lambda c, u, flags, rc, props: self.present.append(
            flags.session_present)
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        self.c.connect("127.0.0.1", port, clean_start=False, properties=props)
        self.c.loop_start()
        wait_for(lambda: self.present, timeout=30, what="CONNACK")

    def _message(self, _c: Any, _u: Any, m: paho.MQTTMessage) -> None:
        with self.lock:
            self.got.append((m.topic, m.payload, bool(m.retain)))

    def subscribe(self, pattern: str) -> None:
        done = threading.Event()
        self.c.on_subscribe = lambda *a: done.set()
        self.c.subscribe(pattern, 1)
        assert done.wait(10), "no SUBACK"

    def payloads(self, prefix: bytes) -> list[bytes]:
        with self.lock:
            return [p for _, p, _ in self.got if p.startswith(prefix)]

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def test_an_mqtt_session_resumes_on_another_node_and_retained_messages_are_everywhere(nodes):
    device = Mqtt5Session(nodes[0].port("mqtt"), "dev-42")
    publisher = MqttClient(nodes[1].port("mqtt"))
    try:
        assert device.present == [False]
        device.subscribe("plant/+/alarm")
        wait_routed(lambda b: publisher.publish("plant/probe/alarm", b),
                    [lambda: device.payloads(b"probe")], "node 2 keeping for the session")
        device.close()
        sent = [f"alarm {i}".encode() for i in range(20)]
        for body in sent:
            publisher.publish("plant/line1/alarm", body)  # QoS 1: kept by JetStream
        publisher.c.publish("plant/line1/state", b"running", qos=1,
                            retain=True).wait_for_publish(10)
        again = Mqtt5Session(nodes[2].port("mqtt"), "dev-42")
        try:
            assert again.present == [True]  # the session, resumed on node 3
            wait_for(lambda: len(again.payloads(b"alarm")) >= 20, timeout=60,
                     what="what was kept for the session")
            assert again.payloads(b"alarm") == sent
            assert cluster_info(nodes[0])["feeds"]["pulled"] >= 1
            # the retained message set on node 2 is retained on node 1 too
            late = Mqtt5Session(nodes[0].port("mqtt"), "late-1")
            try:
                late.subscribe("plant/+/state")
                wait_for(lambda: late.payloads(b"running"), timeout=30,
                         what="the retained message on node 1")
                assert late.got[0] == ("plant/line1/state", b"running", True)
            finally:
                late.close()
        finally:
            again.close()
    finally:
        publisher.close()


def far_nodes(tmp: Path, nats: NatsCluster, port: int, options: str = "",
              **files: str) -> list[ServeProcess]:
    """Nodes 1 and 2, each with transport ``far`` to the MQTT broker on ``port``."""
    files["transports"] = (f"[far]\ntype = mqtt\nurl = mqtt://127.0.0.1:{port}\n{options}"
                           "reconnect_min = 100msec\nreconnect_max = 500msec\n")
    extra = "mqtt_transports = enabled\ncluster_ack_wait = 3 sec\n"
    return [node(tmp, nats, i, extra=extra, **files) for i in (1, 2)]


def transport_row(p: ServeProcess, name: str = "far") -> dict[str, Any]:
    return dict(next(t for t in admin_get(p.port("http"), "/api/v1/transports")
                     if t["name"] == name))


def transport_state(p: ServeProcess, name: str = "far") -> str:
    return str(transport_row(p, name)["state"])


def far_subscribed(p: ServeProcess) -> bool:
    """Transport ``far`` is up on ``p`` and the far side has answered its SUBSCRIBEs, so what
    is published there from now on is imported."""
    row = transport_row(p)
    return row["state"] == "up" and row["subscribing"] == 0


def holder_and_other(both: list[ServeProcess]) -> tuple[ServeProcess, ServeProcess]:
    """The node running transport ``far`` and the other, once one runs it."""
    wait_for(lambda: sorted(transport_state(p) for p in both) == ["standby", "up"],
             timeout=30, what="the transport up on one node, on standby on the other")
    holder = next(p for p in both if transport_state(p) == "up")
    wait_for(lambda: far_subscribed(holder), timeout=30, what="the far side's SUBACKs")
    return holder, next(p for p in both if p is not holder)


def test_a_transport_runs_on_one_node_and_moves_when_that_one_dies(tmp_path, nats_cluster):
    from peers.mosquitto import start_mosquitto

    with start_mosquitto(tmp_path / "mosq") as mosq:
        both = far_nodes(tmp_path, nats_cluster, mosq.port, queues='orders import="far"\n>\n')
        far = MqttClient(mosq.port)
        consumer = None
        try:
            holder, other = holder_and_other(both)
            consumer = StompQueueClient(other.port("stomp"))
            consumer.consume("/queue/orders")
            first = [f"order {i}".encode() for i in range(10)]
            for body in first:
                far.publish("orders", body)
            wait_for(lambda: len(consumer.bodies()) >= 10, timeout=30,
                     what="imports on one node consumed on the other")
            holder.kill()  # SIGKILL: its lease expires, the other node takes it
            wait_for(lambda: far_subscribed(other), timeout=60,
                     what="the transport up and subscribed on the other node")
            then = [f"order {i}".encode() for i in range(10, 20)]
            for body in then:
                far.publish("orders", body)
            wait_for(lambda: len(consumer.bodies()) >= 20, timeout=60, what="20 orders")
            assert sorted(consumer.bodies()) == sorted(b.decode() for b in first + then)
        finally:
            far.close()
            if consumer is not None:
                consumer.close()
            for p in both:
                p.stop()


def test_a_jms_client_id_is_connected_once_in_the_cluster(nodes):
    first = StompQueueClient(nodes[0].port("stomp"), client_id="app-9")
    try:
        def refused_on_node_2() -> bool:
            errors: list[str] = []

            class Listener(stomp.ConnectionListener):
                def on_error(self, frame: Any) -> None:
                    errors.append(frame.headers.get("message", "") + frame.body)

            c = stomp.Connection12([("127.0.0.1", nodes[1].port("stomp"))],
                                   reconnect_attempts_max=1)
            c.set_listener("", Listener())
            try:
                c.connect(wait=True, headers={"client-id": "app-9"})
            except Exception:  # noqa: BLE001 - stomp.py's ConnectFailedException
                pass
            if c.is_connected():
                c.disconnect()
                return False  # node 2 has not heard of the claim yet: try again
            return any("already connected" in e for e in errors)

        wait_for(refused_on_node_2, timeout=30, what="node 2 refusing client id app-9")
    finally:
        first.close()
    # once it left, the client id may connect anywhere
    def accepted_on_node_2() -> bool:
        try:
            StompQueueClient(nodes[1].port("stomp"), client_id="app-9").close()
            return True
        except Exception:  # noqa: BLE001 - the departure not heard yet
            return False

    wait_for(accepted_on_node_2, timeout=30, what="app-9 accepted on node 2")


def test_a_will_is_published_once_in_the_cluster(nodes):
    from peers.mosquitto import find_command

    watchers = [MqttClient(p.port("mqtt")) for p in nodes[1:]]
    device = None
    try:
        for w in watchers:
            w.subscribe("plant/+/status")
        probe_from = MqttClient(nodes[0].port("mqtt"))
        try:
            wait_routed(lambda b: probe_from.publish("plant/probe/status", b),
                        [lambda w=w: w.payloads(b"probe") for w in watchers],
                        "interest of nodes 2 and 3 at node 1")
        finally:
            probe_from.close()
        device = subprocess.Popen(
            [find_command("mosquitto_sub"), "-h", "127.0.0.1", "-p", str(nodes[0].port("mqtt")),
             "-i", "dev-will", "-t", "plant/dev/cmd", "--will-topic", "plant/dev/status",
             "--will-payload", "offline", "--will-qos", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: "dev-will" in [r["client_id"] for r in admin_get(
            nodes[0].port("http"), "/api/v1/connections")], timeout=30, what="the device")
        device.kill()  # no DISCONNECT: the will goes out
        device.wait(10)
        for w in watchers:
            wait_for(lambda w=w: w.payloads(b"offline"), timeout=30, what="the will")
        time.sleep(1)  # a second copy, were there one, would have come by now
        assert [w.payloads(b"offline") for w in watchers] == [[b"offline"], [b"offline"]]
    finally:
        if device is not None and device.poll() is None:
            device.kill()
        for w in watchers:
            w.close()


def test_what_a_transport_spooled_goes_out_from_the_node_that_takes_it_over(tmp_path,
                                                                             nats_cluster):
    from adminapi import admin_post
    from peers.mosquitto import start_mosquitto

    with start_mosquitto(tmp_path / "mosq") as mosq:
        both = far_nodes(tmp_path, nats_cluster, mosq.port, "qos = 1\n",
                         topics='out.> export="far"\n>\n')
        far = MqttClient(mosq.port)
        try:
            far.subscribe("out/#")
            holder, other = holder_and_other(both)
            publisher = MqttClient(other.port("mqtt"))
            try:
                # exported by the holder, published on the other node
                wait_routed(lambda b: publisher.publish("out/probe", b),
                            [lambda: far.payloads(b"probe")], "an export across nodes")
                admin_post(holder.port("http"), "/api/v1/transports/far/stop")
                spooled = [f"spooled {i}".encode() for i in range(10)]
                for body in spooled:
                    publisher.publish("out/b", body)  # QoS 1: kept for the export's spool
                holder.kill()
                wait_for(lambda: far.payloads(b"spooled") == spooled, timeout=60,
                         what="the spool sent by the node that took the transport over")
            finally:
                publisher.close()
        finally:
            far.close()
            for p in both:
                p.stop()


def test_an_amqp_durable_subscription_resumes_on_another_node_and_ends_there(nodes):
    from proton import Message as AmqpMessage
    from proton.reactor import DurableSubscription

    def subscribe(p: ServeProcess) -> Any:
        conn = amqp_connect(p.port("amqp"), container_id="app-5")
        return conn, conn.create_receiver("topic://alerts.>", name="alerts", credit=50,
                                          options=DurableSubscription())

    def take(receiver: Any) -> str | None:
        try:
            m = receiver.receive(timeout=0.05)
        except Exception:  # noqa: BLE001 - proton's Timeout: nothing yet
            return None
        receiver.accept()
        return text(m.body)

    conn, receiver = subscribe(nodes[0])
    sender_conn = amqp_connect(nodes[1].port("amqp"))
    sender = sender_conn.create_sender("topic://alerts.fire")
    try:
        n = 0

        def probe() -> bool:  # until node 2 keeps messages for the durable subscription
            nonlocal n
            n += 1
            sender.send(AmqpMessage(body=f"probe {n}", durable=True))
            return take(receiver) is not None

        wait_for(probe, timeout=60, what="a probe kept for the durable subscription")
        while take(receiver) is not None:  # the probes in flight
            pass
        receiver.link.detach()  # detach, not close: the subscription stays
        conn.close()
        sent = [f"alert {i}" for i in range(10)]
        for body in sent:
            sender.send(AmqpMessage(body=body, durable=True))
        conn, receiver = subscribe(nodes[2])
        got: list[str] = []
        wait_for(lambda: (got.append(b) if (b := take(receiver)) is not None else None)
                 or len([g for g in got if g.startswith("alert")]) >= 10,
                 timeout=60, what="the alerts kept, on node 3")
        assert [g for g in got if g.startswith("alert")] == sent
        receiver.close()  # detach with closed = true: the subscription ends, cluster-wide
        wait_for(lambda: not admin_get(nodes[0].port("http"), "/api/v1/cluster/store")
                 ["durables"], timeout=30, what="the durable gone from JetStream")
        # and node 1 let go of its copy (its subscriber had left it there)
        wait_for(lambda: not [d for d in admin_get(nodes[0].port("http"), "/api/v1/durables")
                              if d["name"] == "alerts"], timeout=30,
                 what="node 1's copy gone")
    finally:
        conn.close()
        sender_conn.close()


def test_any_node_shows_every_nodes_destinations_and_purges_a_queue_cluster_wide(nodes):
    sender = StompQueueClient(nodes[0].port("stomp"))
    holder = StompQueueClient(nodes[1].port("stomp"), hold=True)  # acknowledges nothing
    try:
        holder.consume("/queue/purged", {"prefetch-count": "5"})
        sent = [f"m{i}" for i in range(40)]
        for body in sent:
            sender.send("/queue/purged", body)
        wait_for(lambda: holder.bodies(), timeout=30, what="node 2 holding some")

        def stored() -> int:
            view = admin_get(nodes[2].port("http"), "/api/v1/cluster/store")
            return int({q["name"]: q["messages"] for q in view["queues"]}.get("purged", 0))

        wait_for(lambda: stored() == 40, timeout=30, what="JetStream keeping the 40")
        wait_for(lambda: len(holder.bodies()) == 5, timeout=30, what="node 2 holding 5")

        def queue_rows() -> dict[str, dict[str, Any]]:
            rows = admin_get(nodes[2].port("http"), "/api/v1/cluster/queues?q=purged")
            return {r["node_id"]: r for r in rows}

        # node 3 has no queue of that name: its view of the cluster's has node 2's (once it
        # hears node 2: a node it has not heard from yet is not asked; node 1's goes when
        # idle, as a dynamic queue does)
        wait_for(lambda: "n2" in queue_rows(), timeout=30, what="node 3 showing node 2's queue")
        rows = queue_rows()
        assert "n3" not in rows
        assert (rows["n2"]["consumers"], rows["n2"]["in_flight"]) == (1, 5)
        assert all(r["node_id"] in ("n1", "n2", "n3") for r in admin_get(
            nodes[0].port("http"), "/api/v1/cluster/topics"))
        # browsed from node 3, which holds none: what JetStream keeps, in order
        browsed = admin_get(nodes[2].port("http"), "/api/v1/queues/purged/messages?limit=1000")
        assert [base64.b64decode(m["body"]).decode() for m in browsed] == sent
        assert len(admin_get(nodes[2].port("http"),
                             "/api/v1/queues/purged/messages?limit=10")) == 10
        assert admin_call(nodes[2].port("http"), "GET",
                          "/api/v1/queues/nowhere/messages")[0] == 404
        # purged from node 3: in JetStream, and on node 2 but for what its consumer holds
        assert admin_post(nodes[2].port("http"), "/api/v1/queues/purged/purge") == (
            200, {"purged": 35})
        wait_for(lambda: stored() == 0, timeout=30, what="nothing left in JetStream")
        n2 = {r["node_id"]: r for r in admin_get(
            nodes[0].port("http"), "/api/v1/cluster/queues?q=purged")}["n2"]
        assert n2["pending"] == 0 and n2["in_flight"] == 5
        # the queue goes on: what is sent now is delivered, and nothing purged comes back
        with holder.cond:
            holder.hold = False
            for _, headers in holder.got:
                holder.conn.ack(headers["ack"])
        sender.send("/queue/purged", "after")
        wait_for(lambda: "after" in holder.bodies(), timeout=30, what="a message after the purge")
        time.sleep(1)
        assert holder.bodies() == sent[:5] + ["after"]
        assert admin_post(nodes[2].port("http"), "/api/v1/queues/nowhere/purge")[0] == 404
    finally:
        for c in (sender, holder):
            c.close()


def test_an_mqtt_session_moved_to_another_node_keeps_its_qos2_exchanges(nodes):
    from conformance.mqttclient import RawClient

    from adapters.mqtt.packets import PubAck, PubComp, Publish, PubRec, PubRel

    expiry = {"session_expiry_interval": 3600}
    watcher = MqttClient(nodes[1].port("mqtt"))  # what the mover publishes, once each
    watcher.subscribe("up/#")
    publisher = MqttClient(nodes[1].port("mqtt"))
    first = RawClient(nodes[0].port("mqtt"), timeout=10)
    local = MqttClient(nodes[0].port("mqtt"))
    try:
        wait_routed(lambda b: local.publish("up/probe", b), [lambda: watcher.payloads(b"probe")],
                    "node 2's subscriber reached from node 1")
        first.connect("mover", 5, clean=False, properties=expiry)
        first.subscribe(("move/#", 2))
        n = 0

        def probe() -> bool:  # until node 2's messages reach the session's durable
            nonlocal n
            n += 1
            publisher.publish(f"move/probe{n}", b"probe", qos=1)
            p = first.recv(1)
            while p is not None:
                if isinstance(p, Publish):
                    first.send(PubAck(p.packet_id) if p.qos == 1 else PubRec(p.packet_id))
                    return True
                p = first.recv(1)
            return False

        wait_for(probe, timeout=60, what="a probe through the session's durable")
        for p in first.drain(1):  # the later probes
            if isinstance(p, Publish):
                first.send(PubAck(p.packet_id))
        for body in (b"m1", b"m2", b"m3"):
            publisher.publish("move/x", body, qos=2)
        got = [first.expect(Publish) for _ in range(3)]
        assert [p.payload for p in got] == [b"m1", b"m2", b"m3"]
        assert all(p.qos == 2 and not p.dup for p in got)
        first.send(PubRec(got[0].packet_id))  # m1 received: the PUBREL is owed to us
        assert first.expect(PubRel).packet_id == got[0].packet_id
        # and the mover's own QoS 2 publish, received by node 1, not yet released
        first.publish("up/1", b"up1", qos=2, packet_id=7)
        assert first.expect(PubRec).packet_id == 7
        wait_for(lambda: watcher.payloads(b"up1"), timeout=30, what="up1 routed")

        # the client comes back on node 3 while node 1 still has it: taken over, handed over
        second = RawClient(nodes[2].port("mqtt"), timeout=10)
        try:
            assert second.connect("mover", 5, clean=False, properties=expiry).session_present
            first.expect_disconnect({0x8E})
            rel = second.expect(PubRel)  # m1's exchange goes on where it was
            assert rel.packet_id == got[0].packet_id
            again = [second.expect(Publish) for _ in range(2)]  # m2, m3: the same packet ids
            assert [(p.payload, p.packet_id, p.dup) for p in again] == [
                (b"m2", got[1].packet_id, True), (b"m3", got[2].packet_id, True)]
            second.send(PubRel(7))  # the mover's publish: node 3 knows it was received
            done = second.expect(PubComp)
            assert (done.packet_id, done.reason_code) == (7, 0)
            second.send(PubComp(got[0].packet_id))
            second.send(PubRec(got[1].packet_id))
            assert second.expect(PubRel).packet_id == got[1].packet_id
            second.send(PubComp(got[1].packet_id))
            # m3 unacknowledged again: the client goes, and comes back on node 2
            second.close()
            third = RawClient(nodes[1].port("mqtt"), timeout=10)
            try:
                assert third.connect("mover", 5, clean=False, properties=expiry).session_present
                p = third.expect(Publish)
                assert (p.payload, p.packet_id, p.dup) == (b"m3", got[2].packet_id, True)
                third.send(PubRec(p.packet_id))
                assert third.expect(PubRel).packet_id == p.packet_id
                third.send(PubComp(p.packet_id))
                publisher.publish("move/x", b"m4", qos=2)
                p = third.expect(Publish)
                assert p.payload == b"m4" and not p.dup
                third.send(PubRec(p.packet_id))
                third.expect(PubRel)
                third.send(PubComp(p.packet_id))
                assert third.nothing(1.5)  # nothing twice
            finally:
                third.close()
        finally:
            second.close()
        assert watcher.payloads(b"up1") == [b"up1"]
    finally:
        for c in (watcher, publisher, local):
            c.close()
        first.close()


def test_admin_changes_on_one_node_are_made_on_every_node(tmp_path, nats_cluster, nodes):
    def status(p: ServeProcess, path: str, user: str = "carol", password: str = "pw") -> int:
        return admin_call(p.port("http"), "GET", path, user=user, password=password)[0]

    def everywhere(check: Any, what: str, among: list[ServeProcess] = nodes) -> None:
        for p in among:
            wait_for(lambda p=p: check(p), timeout=30, what=f"{what} on {p.config_dir.name}")

    # a queue defined on node 1 is defined on every node, and in each one's queues.conf
    assert admin_post(nodes[0].port("http"), "/api/v1/queues",
                      {"name": "orders", "properties": "maxmsgs=10"})[0] == 201
    everywhere(lambda p: "maxmsgs=10" in admin_call(p.port("http"), "GET",
                                                     "/api/v1/queues/orders")[1].get(
        "own_properties", ""), "the queue defined")
    assert all("orders" in (p.config_dir / "queues.conf").read_text() for p in nodes)
    # a user made on node 2 logs in on node 3 (403: known, not permitted), then a group
    # with her made on node 3 has her on node 1
    assert admin_post(nodes[1].port("http"), "/api/v1/users",
                      {"name": "carol", "password": "pw"})[0] == 201
    everywhere(lambda p: status(p, "/api/v1/server") == 403, "carol known")
    assert status(nodes[2], "/api/v1/server", password="wrong") == 401
    assert admin_post(nodes[2].port("http"), "/api/v1/groups", {"name": "ops"})[0] == 201
    assert admin_call(nodes[2].port("http"), "PUT", "/api/v1/groups/ops/members/carol")[0] == 200
    everywhere(lambda p: {g["name"]: g["members"] for g in admin_get(
        p.port("http"), "/api/v1/groups")}.get("ops") == ["carol"], "group ops with carol")
    # a permission granted on node 1 holds on node 2; revoked on node 3, it is gone on 1
    assert admin_post(nodes[0].port("http"), "/api/v1/acl/grant", {
        "kind": "admin", "group": "ops", "permissions": ["view-server"]})[0] == 200
    everywhere(lambda p: status(p, "/api/v1/server") == 200, "carol's view-server")
    # a node that was down when a change was made has it when it comes back
    nodes[2].stop()
    assert admin_post(nodes[0].port("http"), "/api/v1/topics",
                      {"name": "alerts", "properties": "maxbytes=1KB"})[0] == 201
    assert admin_post(nodes[1].port("http"), "/api/v1/acl/revoke", {
        "kind": "admin", "group": "ops", "permissions": ["view-server"]})[0] == 200
    nodes[2] = node(tmp_path, nats_cluster, 3)  # its own files as they were at first
    everywhere(lambda p: status(p, "/api/v1/server") == 403, "the revocation")
    assert admin_get(nodes[2].port("http"), "/api/v1/topics/alerts")["defined"]
    assert "alerts" in (nodes[2].config_dir / "topics.conf").read_text()
    assert status(nodes[2], "/api/v1/server") == 403  # carol and ops came back too
    # a queue deleted on node 2 goes everywhere, definition and file line
    assert admin_call(nodes[1].port("http"), "DELETE", "/api/v1/queues/orders")[0] == 200
    everywhere(lambda p: admin_call(p.port("http"), "GET", "/api/v1/queues/orders")[0] == 404,
               "the queue deleted")
    assert not any("orders" in (p.config_dir / "queues.conf").read_text() for p in nodes)


def test_a_resend_imported_again_after_a_transport_moved_is_dropped_by_jetstream(
        tmp_path, nats_cluster):
    from paho.mqtt.enums import MQTTProtocolVersion
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties
    from peers.mosquitto import start_mosquitto

    def send(client: paho.Client, body: bytes, trace_id: str) -> None:
        """As another gateway sends over MQTT 5: the trace id as ``gw-trace-id``."""
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = [("gw-trace-id", trace_id)]
        client.publish("orders", body, 1, properties=props).wait_for_publish(10)

    with start_mosquitto(tmp_path / "mosq") as mosq:
        both = far_nodes(tmp_path, nats_cluster, mosq.port, "protocol_version = 5\n",
                         queues='orders import="far"\n>\n')
        far = paho.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
        far.connect("127.0.0.1", mosq.port)
        far.loop_start()
        consumer = None
        try:
            holder, other = holder_and_other(both)
            consumer = StompQueueClient(other.port("stomp"))
            consumer.consume("/queue/orders")
            send(far, b"first", "trace-1")
            wait_for(lambda: consumer.bodies() == ["first"], timeout=30, what="the first copy")
            holder.kill()  # the node that imported it dies, its duplicate window with it
            wait_for(lambda: far_subscribed(other), timeout=60,
                     what="the transport up and subscribed on the other node")
            send(far, b"first", "trace-1")  # the far side's resend: the same trace id
            send(far, b"second", "trace-2")
            wait_for(lambda: "second" in consumer.bodies(), timeout=60, what="the second")
            time.sleep(1)
            assert consumer.bodies() == ["first", "second"]  # the resend dropped
        finally:
            far.disconnect()
            far.loop_stop()
            if consumer is not None:
                consumer.close()
            for p in both:
                p.stop()


def test_an_exclusive_queue_has_one_consumer_in_the_cluster(tmp_path, nats_cluster):
    both = [node(tmp_path, nats_cluster, i, queues="jobs exclusive\n>\n") for i in (1, 2)]
    consumers: list[StompQueueClient] = []
    sender = None
    try:
        consumers = [StompQueueClient(p.port("stomp")) for p in both]
        for c in consumers:
            c.consume("/queue/jobs")
        sender = StompQueueClient(both[0].port("stomp"))
        first = [f"job {i}" for i in range(30)]
        for body in first:
            sender.send("/queue/jobs", body)
        wait_for(lambda: sum(len(c.bodies()) for c in consumers) == 30, timeout=60,
                 what="30 jobs")
        time.sleep(1)
        owner = next(c for c in consumers if c.bodies())
        assert owner.bodies() == first  # every one to one consumer, in order
        standby = next(c for c in consumers if c is not owner)
        assert standby.bodies() == []
        owner.close()  # its node lets the queue go; the other node's consumer takes it
        then = [f"job {i}" for i in range(30, 40)]
        for body in then:
            sender.send("/queue/jobs", body)
        wait_for(lambda: len(standby.bodies()) == 10, timeout=60,
                 what="the standby consumer taking over")
        assert standby.bodies() == then
    finally:
        for c in [*consumers, *([sender] if sender else [])]:
            c.close()
        for p in both:
            p.stop()


def test_a_queues_limits_hold_across_nodes(tmp_path, nats_cluster):
    queues = "capped maxmsgs=5\nring maxmsgs=3,overflowPolicy=discardOld\n>\n"
    nodes3 = [node(tmp_path, nats_cluster, i, queues=queues) for i in (1, 2, 3)]

    def sent(p: ServeProcess, dest: str, body: str) -> bool:
        """Whether a persistent message sent on node ``p`` was taken (a RECEIPT, not an
        ERROR, which closes the connection)."""
        c = StompQueueClient(p.port("stomp"))
        try:
            c.send(dest, body)
            return not c.errors
        finally:
            c.close()

    consumer = None
    try:
        assert all(sent(nodes3[0], "/queue/capped", f"c{i}") for i in range(5))
        assert not sent(nodes3[1], "/queue/capped", "c5")  # full, as seen from any node
        assert not sent(nodes3[0], "/queue/capped", "c5")
        def stored(name: str) -> int:
            view = admin_get(nodes3[2].port("http"), "/api/v1/cluster/store")
            return int({q["name"]: q["messages"] for q in view["queues"]}.get(name, 0))

        consumer = StompQueueClient(nodes3[2].port("stomp"))
        consumer.consume("/queue/capped", {"prefetch-count": "1"})
        wait_for(lambda: len(consumer.acked) >= 2, timeout=30, what="two consumed")
        room = len(consumer.stop_acking())
        consumer.close()
        consumer = None
        wait_for(lambda: stored("capped") == 5 - room, timeout=30, what="the room made")
        for i in range(room):
            assert sent(nodes3[i % 2], "/queue/capped", f"c{5 + i}")
        assert not sent(nodes3[1], "/queue/capped", "one too many")
        # the limit changed on one node is the stream's, for every node
        assert admin_post(nodes3[0].port("http"), "/api/v1/queues/capped",
                          {"properties": "maxmsgs=7"})[0] == 200
        wait_for(lambda: sent(nodes3[2], "/queue/capped", "more 1"), timeout=30,
                 what="the new limit")
        assert sent(nodes3[1], "/queue/capped", "more 2")
        assert not sent(nodes3[0], "/queue/capped", "more 3")
        # discardOld: the oldest go to make room
        for i in range(6):
            assert sent(nodes3[i % 3], "/queue/ring", f"r{i}")
        kept = admin_get(nodes3[1].port("http"), "/api/v1/queues/ring/messages")
        assert [base64.b64decode(m["body"]).decode() for m in kept] == ["r3", "r4", "r5"]
        assert (stored("capped"), stored("ring")) == (7, 3)
    finally:
        if consumer is not None:
            consumer.close()
        for p in nodes3:
            p.stop()


def test_a_durable_subscriber_whose_node_is_killed_resumes_elsewhere_without_loss(
        tmp_path, nats_cluster):
    extra = "cluster_ack_wait = 2 sec\n"
    n1, n2, n3 = (node(tmp_path, nats_cluster, i, extra=extra) for i in (1, 2, 3))
    durable = {"activemq.subscriptionName": "ticks"}
    first = StompQueueClient(n2.port("stomp"), client_id="app-7")
    sender = StompQueueClient(n1.port("stomp"))
    again = None
    try:
        first.consume("/topic/ticks", durable)
        probe_durable(sender, "/topic/ticks", first)

        def kept() -> int:  # what JetStream keeps for the durable, delivered or not
            rows = admin_get(n3.port("http"), "/api/v1/cluster/store")["durables"]
            return sum(d["pending"] + d["unacknowledged"] for d in rows
                       if d["key"] == "sub:app-7:ticks")

        wait_for(lambda: kept() == 0, timeout=30, what="the probes acknowledged")
        sent = [f"tick {i}" for i in range(60)]
        for body in sent[:30]:
            sender.send("/topic/ticks", body)  # confirmed: JetStream has it
        wait_for(lambda: sum(b.startswith("tick") for b in first.bodies()) >= 10, timeout=30,
                 what="ticks on node 2")
        acked = {b for b in first.stop_acking() if b.startswith("tick")}
        received = {b for b in first.bodies() if b.startswith("tick")}
        # the acknowledgements node 2 took have reached JetStream (they go a moment after)
        wait_for(lambda: kept() == 30 - len(acked), timeout=30,
                 what="node 2's acknowledgements in JetStream")
        n2.kill()  # SIGKILL: what it held unacknowledged comes again, what was acked never
        for body in sent[30:]:
            sender.send("/topic/ticks", body)

        def resumed() -> bool:  # node 3 takes the client id once node 2 is known gone
            nonlocal again
            try:
                c = StompQueueClient(n3.port("stomp"), client_id="app-7")
            except stomp.exception.ConnectFailedException:  # still node 2's
                return False
            c.consume("/topic/ticks", durable)
            if c.errors:
                c.close()
                return False
            again = c
            return True

        wait_for(resumed, timeout=60, what="the subscriber back on node 3")
        assert again is not None
        want = set(sent) - acked
        wait_for(lambda: want <= set(again.bodies()), timeout=60, what="every tick not acked")
        time.sleep(2)  # (past an ack wait: nothing more comes)
        ticks = [b for b in again.bodies() if b.startswith("tick")]
        assert sorted(ticks) == sorted(want)  # none lost, none twice, none acked again
        flagged = {b for b, h in again.got if h.get("redelivered") == "true"} & set(ticks)
        assert received - acked <= flagged  # what node 2 delivered is flagged redelivered,
        assert flagged <= set(sent[:30])     # what came after it died is not
    finally:
        for c in (first, sender, again):
            if c is not None:
                c.close()
        for p in (n1, n2, n3):
            p.stop()


def test_a_subscription_answered_on_one_node_gets_what_another_publishes_next(nodes):
    """No probes here: a subscription's answer (SUBACK, RECEIPT, AMQP attach) comes once the
    other nodes have it, so what is published on another node right after reaches it."""
    publishers = [MqttClient(p.port("mqtt")) for p in nodes]
    senders = [StompQueueClient(p.port("stomp")) for p in nodes]
    opened: list[Any] = []
    try:
        for i in range(6):
            here, there = nodes[i % 3], i % 3 - 2  # the publisher on another node
            sub = MqttClient(here.port("mqtt"))
            opened.append(sub)
            sub.subscribe(f"fresh/{i}/#")
            publishers[there].publish(f"fresh/{i}/x", b"mqtt")
            wait_for(lambda sub=sub: sub.payloads(b"mqtt"), timeout=10, what="the MQTT one")
            session = Mqtt5Session(here.port("mqtt"), f"fresh-{i}")  # a durable
            opened.append(session)
            session.subscribe(f"kept/{i}/#")
            publishers[there].publish(f"kept/{i}/x", b"kept")
            wait_for(lambda s=session: s.payloads(b"kept"), timeout=10, what="the durable one")
            stomp_sub = StompQueueClient(here.port("stomp"))
            opened.append(stomp_sub)
            stomp_sub.consume(f"/topic/fresh.s{i}")  # with a receipt
            senders[there].send(f"/topic/fresh.s{i}", "stomp")
            wait_for(lambda s=stomp_sub: "stomp" in s.bodies(), timeout=10, what="the STOMP one")
            conn = amqp_connect(here.port("amqp"))
            opened.append(conn)
            receiver = conn.create_receiver(f"topic://fresh.a{i}")  # attached: answered
            senders[there].send(f"/topic/fresh.a{i}", "amqp")
            assert text(receiver.receive(timeout=10).body) == "amqp"
    finally:
        for c in [*publishers, *senders, *opened]:
            c.close()


def test_a_required_transport_holds_the_start_until_some_node_runs_it(tmp_path, nats_cluster):
    from peers.mosquitto import start_mosquitto

    with start_mosquitto(tmp_path / "mosq") as mosq:
        # node 1 takes the lease and connects before it is ready; node 2 starts because
        # node 1 runs it
        both = far_nodes(tmp_path, nats_cluster, mosq.port, "required = true\n")
        try:
            assert sorted(transport_state(p) for p in both) == ["standby", "up"]
        finally:
            for p in both:
                p.stop()
    # nobody can run one whose far side is not there: the node does not start
    d = tmp_path / "alone"
    write_config(d, gateway=f"listen = mqtt://127.0.0.1:0\ncluster = {nats_cluster.urls[2]}\n"
                 f"cluster_name = t\nnode_id = n3\nstore = {d / 'data'}\n"
                 "mqtt_transports = enabled\n",
                 transports=f"[far]\ntype = mqtt\nurl = mqtt://127.0.0.1:{free_port()}\n"
                 "required = true\nreconnect_min = 100msec\nreconnect_max = 2 sec\n")
    done = subprocess.run([sys.executable, "-m", "gateway", "serve", "--config-dir", str(d)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 1
    assert "transport 'far' is required and no node of the cluster runs it" in done.stderr
