"""The delivery log's ``dest`` of a message delivered to a wildcard subscription: the topic
the message was published to, as its ``publish`` says, never the subscription's pattern
(docs/delivery-log.md, "Fields"), so the reconciliation (``spark/``) matches each exit and
decision with the message's entry on the same gateway and destination.

How this works. One gateway listens for MQTT, STOMP and AMQP on loopback ports; independent
clients subscribe on wildcards in their own syntax (paho-mqtt ``in/#``, ``in/+`` and a
shared ``$share/g/in/#``; stomp.py ``/topic/in.>``, ``/topic/in.*`` and RabbitMQ's
``/topic/in.#``; python-qpid-proton ``topic://in.>`` and ``topic://in.*``), a message is
published to the topic ``in.a`` of each test's own prefix, and every record of the
message's trace id in the delivery-log files is compared with its ``publish``. A persistent
MQTT session away while its message waits (and a gateway restart meanwhile, so the message
comes back from the store), its session queue full (``max_queued`` drops), the topic's
``discardOld`` policy and expiry (``expire``, and ``undeliverable`` for a message that asks
to be kept) cover the other records a wildcard subscription's messages get.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from amqpclient import connect
from gw import GatewayThread, wait_for
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from proton import Message as AmqpMessage
from test_amqp_proton import failed, nothing_more
from test_mqtt_paho import V5, Client
from test_stomp_py import Peer

LONG = 3600  # a Session Expiry Interval (s) that outlives every test
MAX_QUEUED = 2  # mqtt_max_queued_messages of these gateways: a session queue fills soon

GATEWAY_CONF = f"""
listen = mqtt://127.0.0.1:0
listen = stomp://127.0.0.1:0
listen = amqp://127.0.0.1:0
listen = http://127.0.0.1:0
mqtt_max_queued_messages = {MAX_QUEUED}
"""
TOPICS_CONF = ">\nwl.d.> overflowPolicy=discardOld\n"


def start_gateway(directory: Path) -> GatewayThread:
    return GatewayThread(directory, gateway=GATEWAY_CONF, topics=TOPICS_CONF).start()


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    g = start_gateway(tmp_path_factory.mktemp("dlog-wild") / "gw")
    yield g
    g.stop()


@pytest.fixture
def mqtt() -> Iterator[Any]:
    """``mqtt(port, client_id, **kw)``: a connected MQTT 5 paho client, closed after the test."""
    made: list[Client] = []

    def make(port: int, cid: str, **kw: Any) -> Client:
        c = Client(port, cid, V5, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def persistent() -> Properties:
    p = Properties(PacketTypes.CONNECT)
    p.SessionExpiryInterval = LONG
    return p


def records(gw: GatewayThread) -> list[dict[str, Any]]:
    """Every delivery-log record the gateway has written so far (its files flushed first)."""
    gw.call(lambda: gw.broker.dlog.flush())
    out: list[dict[str, Any]] = []
    for f in sorted(Path(gw.broker.config.gateway.delivery_log_dir).iterdir()):
        out += [json.loads(line) for line in f.read_text("utf-8").splitlines() if line]
    return out


def published(gw: GatewayThread, dest: str) -> list[dict[str, Any]]:
    """The ``publish`` records on ``dest`` (one per message sent there)."""
    return [r for r in records(gw) if r["event"] == "publish" and r["dest"] == dest]


def of_message(gw: GatewayThread, publish: dict[str, Any], want: dict[str, int]
               ) -> list[dict[str, Any]]:
    """The records of ``publish``'s message once they include ``want`` (event → how many),
    waited for (records are written in batches)."""
    def enough() -> list[dict[str, Any]] | None:
        mine = [r for r in records(gw) if r["trace_id"] == publish["trace_id"]]
        counts = {e: sum(1 for r in mine if r["event"] == e) for e in want}
        return mine if all(counts[e] >= n for e, n in want.items()) else None

    found: list[dict[str, Any]] = wait_for(enough, what=f"records {want}")
    return found


def events_on(found: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(event, dest) of each record, sorted."""
    return sorted((r["event"], r["dest"]) for r in found)


def durable_of(gw: GatewayThread, client_id: str, flt: str) -> Any:
    """The core durable subscription of a persistent MQTT session's filter."""
    return gw.broker.durables[f"sub:{client_id}:mqtt:{flt}"]


def away(gw: GatewayThread, client_id: str) -> None:
    """Wait until the MQTT session of ``client_id`` has no network connection (the client
    left; its core consumers stay, paused, until it comes back)."""
    wait_for(lambda: gw.call(lambda: gw.broker.adapter_servers["mqtt"]
                             .sessions[client_id].conn is None),
             what=f"{client_id} to be away")


def test_mqtt5_wildcard_and_shared_deliveries_and_acks_name_the_published_topic(gw, mqtt):
    """``in/#``, ``in/+`` and ``$share/g/in/#`` subscribers (QoS 1, so each PUBACK is an
    ``ack``): each ``deliver`` and ``ack`` of a message published to ``in/a`` names
    ``topic:wl.m.in.a``, the ``publish``'s destination."""
    port = gw.port("mqtt")
    subs = [mqtt(port, "wl-m-hash"), mqtt(port, "wl-m-plus"), mqtt(port, "wl-m-shared")]
    subs[0].sub("wl/m/in/#", qos=1)
    subs[1].sub("wl/m/in/+", qos=1)
    subs[2].sub("$share/g/wl/m/in/#", qos=1)
    mqtt(port, "wl-m-pub").pub("wl/m/in/a", b"reading", qos=1)
    for s in subs:
        m = s.get()
        assert (m.topic, m.payload) == ("wl/m/in/a", b"reading")
    [publish] = published(gw, "topic:wl.m.in.a")
    found = of_message(gw, publish, {"deliver": 3, "ack": 3})
    assert events_on(found) == sorted([("publish", "topic:wl.m.in.a")]
                                      + [("deliver", "topic:wl.m.in.a")] * 3
                                      + [("ack", "topic:wl.m.in.a")] * 3)
    assert len({r["client"] for r in found if r["event"] == "deliver"}) == 3


def test_stomp_wildcard_deliveries_and_acks_name_the_published_topic(gw):
    """STOMP subscriptions on ``/topic/wl.s.in.>``, ``/topic/wl.s.in.*`` and RabbitMQ's
    ``/topic/wl.s.in.#`` (``client-individual``, each MESSAGE acknowledged): every
    ``deliver`` and ``ack`` names ``topic:wl.s.in.a``."""
    port = gw.port("stomp")
    sub = Peer(port, "1.2")
    pub = Peer(port, "1.2")
    try:
        for sid, dest in enumerate(["/topic/wl.s.in.>", "/topic/wl.s.in.*",
                                    "/topic/wl.s.in.#"]):
            sub.sub(dest, str(sid), ack="client-individual")
        pub.send("/topic/wl.s.in.a", "reading")
        for frame in sub.take(3):
            assert frame.headers["destination"] == "/topic/wl.s.in.a"
            sub.ack(frame)
        [publish] = published(gw, "topic:wl.s.in.a")
        found = of_message(gw, publish, {"deliver": 3, "ack": 3})
        assert events_on(found) == sorted([("publish", "topic:wl.s.in.a")]
                                          + [("deliver", "topic:wl.s.in.a")] * 3
                                          + [("ack", "topic:wl.s.in.a")] * 3)
    finally:
        sub.conn.disconnect()
        pub.conn.disconnect()


def test_amqp_wildcard_deliveries_redelivery_ack_and_drop_name_the_published_topic(gw):
    """AMQP receivers on ``topic://wl.a.in.>`` and ``topic://wl.a.in.*``: the first fails
    the delivery (modified, delivery-failed: a ``redeliver`` follows) and accepts the
    redelivery (``ack``), the second rejects it (a ``drop``, reason ``rejected``); every
    record names ``topic:wl.a.in.a``."""
    c = connect(gw.port("amqp"))
    try:
        gt = c.create_receiver("topic://wl.a.in.>", credit=10)
        star = c.create_receiver("topic://wl.a.in.*", credit=10)
        c.create_sender("topic://wl.a.in.a").send(AmqpMessage(body="reading"))
        assert gt.receive(timeout=5).body == "reading"
        failed(gt)
        again = gt.receive(timeout=5)
        assert (again.body, again.delivery_count) == ("reading", 1)
        gt.accept()
        assert star.receive(timeout=5).body == "reading"
        star.reject()
        assert nothing_more(star)  # (and the blocking client sends the rejection meanwhile)
        [publish] = published(gw, "topic:wl.a.in.a")
        found = of_message(gw, publish, {"deliver": 2, "redeliver": 1, "ack": 1, "drop": 1})
        dest = "topic:wl.a.in.a"
        assert events_on(found) == sorted([("publish", dest), ("deliver", dest),
                                           ("deliver", dest), ("redeliver", dest),
                                           ("ack", dest), ("drop", dest)])
        assert [r["reason"] for r in found if r["event"] == "drop"] == ["rejected"]
    finally:
        c.close()


def test_a_persistent_session_away_gets_its_wildcard_message_logged_on_its_topic(gw, mqtt):
    """A persistent MQTT 5 session with a QoS 1 ``in/#`` subscription disconnects; a message
    to ``in/a`` waits in its durable subscription; when it comes back the ``deliver`` and
    ``ack`` name ``topic:wl.p.in.a``."""
    port = gw.port("mqtt")
    c = Client(port, "wl-p", V5, clean=False, props=persistent())
    c.sub("wl/p/in/#", qos=1)
    c.close()
    away(gw, "wl-p")
    mqtt(port, "wl-p-pub").pub("wl/p/in/a", b"queued", qos=1)
    wait_for(lambda: gw.call(lambda: durable_of(gw, "wl-p", "wl/p/in/#").count) == 1,
             what="the message to wait in the session")
    back = mqtt(port, "wl-p", clean=False, props=persistent())
    assert back.session_present
    m = back.get()
    assert (m.topic, m.payload) == ("wl/p/in/a", b"queued")
    [publish] = published(gw, "topic:wl.p.in.a")
    found = of_message(gw, publish, {"deliver": 1, "ack": 1})
    assert events_on(found) == [("ack", "topic:wl.p.in.a"), ("deliver", "topic:wl.p.in.a"),
                                ("publish", "topic:wl.p.in.a")]


def test_a_wildcard_message_read_back_from_the_store_is_logged_on_its_topic(tmp_path, mqtt):
    """As above, with a gateway restart while the session is away: the message comes back
    from the store (a Destination of its own, no topic of that name yet), and its ``deliver``
    and ``ack`` still name ``topic:wl.r.in.a``."""
    g = start_gateway(tmp_path / "gw")
    try:
        c = Client(g.port("mqtt"), "wl-r", V5, clean=False, props=persistent())
        c.sub("wl/r/in/#", qos=1)
        c.close()
        away(g, "wl-r")
        mqtt(g.port("mqtt"), "wl-r-pub").pub("wl/r/in/a", b"stored", qos=1)
        wait_for(lambda: g.call(lambda: durable_of(g, "wl-r", "wl/r/in/#").count) == 1,
                 what="the message to wait in the session")
        g.restart()
        assert g.call(lambda: "wl.r.in.a" not in g.broker.topics)
        back = mqtt(g.port("mqtt"), "wl-r", clean=False, props=persistent())
        assert back.session_present
        m = back.get()
        assert (m.topic, m.payload) == ("wl/r/in/a", b"stored")
        [publish] = published(g, "topic:wl.r.in.a")
        found = of_message(g, publish, {"deliver": 1, "ack": 1})
        assert events_on(found) == [("ack", "topic:wl.r.in.a"),
                                    ("deliver", "topic:wl.r.in.a"),
                                    ("publish", "topic:wl.r.in.a")]
    finally:
        g.stop()


def test_a_full_session_queue_drops_on_the_message_topic(gw, mqtt):
    """A persistent session away with a QoS 0 ``in/#`` subscription holds
    ``mqtt_max_queued_messages`` messages; the ``drop`` (reason ``max_queued``) of each
    further one names the topic it was published to."""
    port = gw.port("mqtt")
    c = Client(port, "wl-q", V5, clean=False, props=persistent())
    c.sub("wl/q/in/#", qos=0)
    c.close()
    away(gw, "wl-q")
    pub = mqtt(port, "wl-q-pub")
    for i in range(MAX_QUEUED + 1):
        pub.pub("wl/q/in/a", b"%d" % i, qos=0)
    publishes = wait_for(lambda: len(published(gw, "topic:wl.q.in.a")) == MAX_QUEUED + 1
                         and published(gw, "topic:wl.q.in.a"), what="the publishes")
    last = max(publishes, key=lambda r: r["ts"])
    found = of_message(gw, last, {"drop": 1})
    assert events_on(found) == [("drop", "topic:wl.q.in.a"), ("publish", "topic:wl.q.in.a")]
    assert [r["reason"] for r in found if r["event"] == "drop"] == ["max_queued"]
    mqtt(port, "wl-q", clean=True)  # ends the session and what it holds


def test_a_discarded_message_of_a_wildcard_subscriber_is_logged_on_its_topic(gw, mqtt):
    """``wl.d.>`` has ``overflowPolicy=discardOld``: a session away with a full queue on a
    QoS 1 ``in/#`` subscription discards its oldest message for a new one, and the
    ``discard`` names the oldest message's topic, ``topic:wl.d.in.a``."""
    port = gw.port("mqtt")
    c = Client(port, "wl-d", V5, clean=False, props=persistent())
    c.sub("wl/d/in/#", qos=1)
    c.close()
    away(gw, "wl-d")
    pub = mqtt(port, "wl-d-pub")
    pub.pub("wl/d/in/a", b"oldest", qos=1)
    for i in range(MAX_QUEUED):
        pub.pub("wl/d/in/b", b"%d" % i, qos=1)
    [oldest] = published(gw, "topic:wl.d.in.a")
    found = of_message(gw, oldest, {"discard": 1})
    assert events_on(found) == [("discard", "topic:wl.d.in.a"),
                                ("publish", "topic:wl.d.in.a")]
    mqtt(port, "wl-d", clean=True)  # ends the session and what it holds


def test_expired_messages_of_a_wildcard_subscriber_are_logged_on_their_topic(gw, mqtt):
    """Two messages with a Message Expiry Interval of 1 s wait for a session away on
    ``in/+``: the ``expire`` of one, and the ``undeliverable`` of the other (it asks to be
    kept: ``JMS_GW_PRESERVE_UNDELIVERED``), name the topic each was published to."""
    port = gw.port("mqtt")
    c = Client(port, "wl-e", V5, clean=False, props=persistent())
    c.sub("wl/e/in/+", qos=1)
    c.close()
    away(gw, "wl-e")
    pub = mqtt(port, "wl-e-pub")
    short = Properties(PacketTypes.PUBLISH)
    short.MessageExpiryInterval = 1
    pub.pub("wl/e/in/a", b"gone", qos=1, props=short)
    kept = Properties(PacketTypes.PUBLISH)
    kept.MessageExpiryInterval = 1
    kept.UserProperty = [("JMS_GW_PRESERVE_UNDELIVERED", "true")]
    pub.pub("wl/e/in/b", b"kept", qos=1, props=kept)
    [gone] = published(gw, "topic:wl.e.in.a")
    [keep] = published(gw, "topic:wl.e.in.b")
    assert events_on(of_message(gw, gone, {"expire": 1})) == [
        ("expire", "topic:wl.e.in.a"), ("publish", "topic:wl.e.in.a")]
    assert events_on(of_message(gw, keep, {"undeliverable": 1})) == [
        ("publish", "topic:wl.e.in.b"), ("undeliverable", "topic:wl.e.in.b")]
    mqtt(port, "wl-e", clean=True)  # ends the session and what it holds
