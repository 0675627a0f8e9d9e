"""``GET /metrics`` (gateway.metrics) of a running gateway (tests/gw.py), scraped as Prometheus
would: with Basic credentials, parsed by prometheus_client's own text parser.

Messages go in through real clients (paho-mqtt, stomp.py) and out to real subscribers; each
test waits on the broker's state (wait_for), never on time, then checks that the counters moved
by exactly what was sent. The per-protocol figures count from the gateway's start, so they
are compared as the difference between a scrape before and one after.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
import stomp
from adminapi import admin_request
from gw import GatewayThread, wait_for
from paho.mqtt.enums import CallbackAPIVersion
from prometheus_client.parser import text_string_to_metric_families

from gateway.message import DeliveryMode, Destination, Message

PASSWORD = "metrics-s3cret"
USERS = (f'admin:{PASSWORD}:"the predefined administrator"\n'
         'watcher:watchpw:"view-server only"\n'
         'nobody:nobodypw:"no administrator permission"\n')
ACL = "ADMIN USER=watcher PERM=view-server\n"
LISTEN = ("listen = mqtt://127.0.0.1:0\nlisten = stomp://127.0.0.1:0\n"
          "listen = http://127.0.0.1:0\n")

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # paho's callbacks

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayThread]:
    with GatewayThread(tmp_path, gateway=LISTEN, users=USERS, acl=ACL) as g:
        yield g


def fetch(g: GatewayThread, user: str = "admin", password: str = PASSWORD) -> tuple[int, str]:
    """``GET /metrics`` with Basic credentials: (status, body)."""
    req = admin_request(f"http://127.0.0.1:{g.port('http')}/metrics", user=user,
                        password=password)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def scrape(g: GatewayThread) -> Samples:
    """Every sample of the page, by name and labels."""
    status, text = fetch(g)
    assert status == 200, text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    """How much a per-protocol sample moved (absent before: from 0)."""
    key = (name, tuple(sorted(labels.items())))
    return after[key] - before.get(key, 0.0)


def labels_of(samples: Samples, name: str, label: str, **labels: str) -> set[str]:
    """The values of ``label`` among the samples of ``name`` that have ``labels``."""
    return {dict(k)[label] for (n, k) in samples
            if n == name and all(dict(k).get(a) == v for a, v in labels.items())}


class MqttSubscriber:
    """A paho client subscribed at QoS 1 to ``pattern``, keeping the payloads it receives."""

    def __init__(self, port: int, pattern: str) -> None:
        self.received: list[bytes] = []
        self.subscribed = threading.Event()
        self.client = paho.Client(CallbackAPIVersion.VERSION2)
        self.client.on_message = lambda _c, _u, m: self.received.append(m.payload)
        self.client.on_subscribe = lambda *_: self.subscribed.set()
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        self.client.subscribe(pattern, qos=1)
        assert self.subscribed.wait(10)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def mqtt_publish(port: int, topic: str, payloads: list[bytes]) -> paho.Client:
    """Publish ``payloads`` at QoS 1, each acknowledged; the client stays connected."""
    client = paho.Client(CallbackAPIVersion.VERSION2)
    client.connect("127.0.0.1", port)
    client.loop_start()
    for p in payloads:
        client.publish(topic, p, qos=1).wait_for_publish(10)
    return client


def stomp_client(g: GatewayThread) -> stomp.Connection12:
    c = stomp.Connection12([("127.0.0.1", g.port("stomp"))], reconnect_attempts_max=1)
    c.connect(wait=True)
    return c


def stomp_send(c: stomp.Connection12, queue: str, bodies: list[str]) -> None:
    """Send ``bodies`` to ``queue``, persistent, each with a receipt."""
    for i, body in enumerate(bodies):
        c.send(f"/queue/{queue}", body, headers={"persistent": "true", "receipt": f"r{i}"})


def test_counters_move_by_what_was_sent_and_delivered(gateway):
    g = gateway
    before = scrape(g)
    subscriber = MqttSubscriber(g.port("mqtt"), "sensors/+/temp")
    consumer = stomp_client(g)
    consumer.subscribe("/queue/work", id="1", ack="auto")
    sender = stomp_client(g)
    payloads = [f"reading {i}".encode() for i in range(5)]
    publisher = mqtt_publish(g.port("mqtt"), "sensors/a/temp", payloads)
    try:
        stomp_send(sender, "work", ["job 1", "job 2", "job 3"])
        stomp_send(sender, "backlog", ["later 1", "later 2", "later 3", "later 4"])
        wait_for(lambda: len(subscriber.received) == 5, what="5 MQTT deliveries")
        wait_for(lambda: g.broker.queues.get("backlog") is not None
                 and g.broker.queues["backlog"].count == 4, what="the backlog queue filled")
        work_queue = g.broker.queues["work"]
        wait_for(lambda: work_queue.stats_out == 3 and not work_queue.count,
                 what="3 STOMP deliveries settled")
        after = scrape(g)
        work = {"kind": "queue", "destination": "work"}
        assert value(after, "gateway_destination_messages_in_total", **work) == 3
        assert value(after, "gateway_destination_messages_out_total", **work) == 3
        bytes_in = value(after, "gateway_destination_bytes_in_total", **work)
        assert bytes_in > 0 and value(after, "gateway_destination_bytes_out_total",
                                      **work) == bytes_in
        assert value(after, "gateway_destination_pending_messages", **work) == 0
        assert value(after, "gateway_destination_in_flight_messages", **work) == 0
        assert value(after, "gateway_destination_consumers", **work) == 1
        backlog = {"kind": "queue", "destination": "backlog"}
        assert value(after, "gateway_destination_messages_in_total", **backlog) == 4
        assert value(after, "gateway_destination_messages_out_total", **backlog) == 0
        assert value(after, "gateway_destination_pending_messages", **backlog) == 4
        assert value(after, "gateway_destination_message_bytes", **backlog) > 0
        assert value(after, "gateway_destination_consumers", **backlog) == 0
        # a topic: in as published to its name, out from the subscription's pattern
        assert value(after, "gateway_destination_messages_in_total", kind="topic",
                     destination="sensors.a.temp") == 5
        pattern = {"kind": "topic", "destination": "sensors.*.temp"}
        assert value(after, "gateway_destination_messages_out_total", **pattern) == 5
        assert value(after, "gateway_destination_bytes_out_total", **pattern) > 0
        assert value(after, "gateway_destination_consumers", **pattern) == 1
        assert value(after, "gateway_destination_bytes_in_total", kind="topic",
                     destination="sensors.a.temp") > 0
        # per protocol
        assert value(after, "gateway_connections", protocol="mqtt") == 2
        assert value(after, "gateway_connections", protocol="stomp") == 2
        assert delta(before, after, "gateway_protocol_messages_out_total", protocol="mqtt") == 5
        assert delta(before, after, "gateway_protocol_messages_out_total", protocol="stomp") == 3
        assert delta(before, after, "gateway_protocol_bytes_out_total", protocol="stomp") \
            == bytes_in
        assert delta(before, after, "gateway_protocol_messages_in_total", protocol="mqtt") == 5
        assert delta(before, after, "gateway_protocol_messages_in_total", protocol="stomp") == 7
        assert delta(before, after, "gateway_protocol_bytes_in_total", protocol="mqtt") == \
            value(after, "gateway_destination_bytes_in_total", kind="topic",
                  destination="sensors.a.temp")
        for protocol, n in (("mqtt", 5), ("stomp", 3)):
            assert delta(before, after, "gateway_delivery_latency_seconds_count",
                         protocol=protocol) == n
            assert delta(before, after, "gateway_delivery_latency_seconds_bucket",
                         protocol=protocol, le="+Inf") == n
            assert after[("gateway_delivery_latency_seconds_sum",
                          (("protocol", protocol),))] >= 0
        assert value(after, "gateway_messages_published_total") == 12
        assert value(after, "gateway_store_commits_total") >= 7  # the persistent sends
        assert value(after, "gateway_store_batches_total") >= 1


        def store_settled() -> Any:
            """A scrape whose histograms agree with the counters (the store's writer thread
            updates them one after the other)."""
            s = scrape(g)
            batches = value(s, "gateway_store_batches_total")
            return s if (value(s, "gateway_store_batch_seconds_count") == batches
                         and value(s, "gateway_store_batch_seconds_bucket", le="+Inf") == batches
                         and value(s, "gateway_store_batch_commits_sum")
                         == value(s, "gateway_store_commits_total")) else None

        wait_for(store_settled, what="the store's histograms")
        assert value(after, "gateway_delivery_log_pending_records") >= 0
    finally:
        publisher.disconnect()
        publisher.loop_stop()
        subscriber.close()
        consumer.disconnect()
        sender.disconnect()


def test_latency_buckets_are_cumulative_and_count_first_deliveries_only(gateway):
    g = gateway
    before = scrape(g)
    consumer = stomp_client(g)
    received = threading.Event()
    ids: list[str] = []

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame: Any) -> None:
            ids.append(frame.headers["ack"])
            received.set()

    consumer.set_listener("l", Listener())
    consumer.subscribe("/queue/retry", id="1", ack="client-individual")
    sender = stomp_client(g)
    try:
        stomp_send(sender, "retry", ["once"])
        wait_for(lambda: len(ids) == 1, what="the first delivery")
        consumer.nack(ids[0])  # back on the queue: delivered again
        wait_for(lambda: len(ids) == 2, what="the redelivery")
        after = scrape(g)
        assert value(after, "gateway_destination_messages_out_total", kind="queue",
                     destination="retry") == 2
        assert delta(before, after, "gateway_protocol_messages_out_total", protocol="stomp") == 2
        assert delta(before, after, "gateway_delivery_latency_seconds_count",
                     protocol="stomp") == 1
        buckets = sorted((float(dict(k)["le"]), v) for (n, k), v in after.items()
                         if n == "gateway_delivery_latency_seconds_bucket"
                         and dict(k)["protocol"] == "stomp")
        counts = [v for _, v in buckets]
        assert counts == sorted(counts) and buckets[-1][0] == float("inf")
    finally:
        consumer.disconnect()
        sender.disconnect()


def test_destinations_past_the_limit_add_up_in_other(tmp_path):
    gw_conf = LISTEN + "metrics_max_destinations = 2\n"
    with GatewayThread(tmp_path, gateway=gw_conf, users=USERS, acl=ACL) as g:
        sender = stomp_client(g)
        try:
            for name, n in (("q.c", 3), ("q.a", 1), ("q.b", 2)):
                stomp_send(sender, name, [f"{name} {i}" for i in range(n)])
            wait_for(lambda: sum(g.broker.queues[q].count for q in ("q.a", "q.b", "q.c")
                                 if q in g.broker.queues) == 6, what="6 messages queued")
        finally:
            sender.disconnect()

        def temporary() -> None:  # a temporary queue: always in _other
            session = g.broker.connect().session()
            tq = session.connection.temporary_queue()
            session.producer(tq, delivery_mode=DeliveryMode.NON_PERSISTENT).send(
                Message.text("temp"))

        g.call(temporary)
        samples = scrape(g)
        name = "gateway_destination_messages_in_total"
        # name order: "$sys.undelivered" < "q.a" < "q.b" < "q.c" < "$TMP$..." aside
        assert labels_of(samples, name, "destination", kind="queue") == {
            "$sys.undelivered", "q.a", "_other"}
        assert value(samples, name, kind="queue", destination="q.a") == 1
        assert value(samples, name, kind="queue", destination="_other") == 2 + 3 + 1
        assert value(samples, "gateway_destination_pending_messages", kind="queue",
                     destination="_other") == 6


def test_a_topic_wildcard_and_queue_names_stay_apart(gateway):
    """A queue and a topic of the same name are two series (``kind``)."""
    g = gateway

    def publish() -> None:
        session = g.broker.connect().session()
        for dest in (Destination.queue("same"), Destination.topic("same")):
            session.producer(dest, delivery_mode=DeliveryMode.NON_PERSISTENT).send(
                Message.text("x"))

    g.call(publish)
    samples = scrape(g)
    for kind in ("queue", "topic"):
        assert value(samples, "gateway_destination_messages_in_total", kind=kind,
                     destination="same") == 1


def test_credentials_and_the_view_server_permission_are_needed(gateway):
    url = f"http://127.0.0.1:{gateway.port('http')}/metrics"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=10)
    assert refused.value.code == 401
    assert refused.value.headers["WWW-Authenticate"] == 'Basic realm="gateway"'
    assert "error" in refused.value.read().decode()
    assert fetch(gateway, "admin", "wrong")[0] == 401
    status, body = fetch(gateway, "nobody", "nobodypw")
    assert status == 403 and "view-server" in body
    status, body = fetch(gateway, "watcher", "watchpw")
    assert status == 200 and "gateway_connections" in body


def test_the_page_is_the_prometheus_text_format_unless_openmetrics_is_asked(gateway):
    url = f"http://127.0.0.1:{gateway.port('http')}/metrics"
    req = admin_request(url, password=PASSWORD)
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    req = admin_request(url, password=PASSWORD)
    req.add_header("Accept", "application/openmetrics-text; version=1.0.0")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("application/openmetrics-text")
        assert r.read().decode().rstrip().endswith("# EOF")
