"""A STOMP client written for RabbitMQ, unchanged, against the gateway: RabbitMQ's destination
forms and headers (its STOMP plugin's documentation: "Destinations", "Temp Queue
Destinations", "Durable Topic Subscriptions", "Prefetch", NACK's ``requeue``), and STOMP's
cumulative ``client`` acknowledgement.

How this works. The scenarios marked "both" run the same stomp.py code (``Peer`` of
test_stomp_py.py) once against the gateway and once against a private RabbitMQ 3.10 node
(tests/peers/rabbitmq.py), and assert the same outcome on both: that is the evidence that a
RabbitMQ client needs no change. The rest run on the gateway only, with the other side an
MQTT (paho) or AMQP (python-qpid-proton) client, or look at where a message went in the core.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import proton
import pytest
from amqpclient import connect
from gw import GatewayThread
from peers.rabbitmq import RabbitMQ, start_rabbitmq
from test_mqtt_paho import V5, Client
from test_stomp_py import VERSIONS, Peer

from gateway.broker import UNDELIVERED

NOTHING = 0.3  # seconds to wait for "nothing more arrives"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    g = GatewayThread(tmp_path_factory.mktemp("stomp-rabbit") / "gw",
                      gateway="listen = stomp://127.0.0.1:0\nlisten = mqtt://127.0.0.1:0\n"
                              "listen = amqp://127.0.0.1:0\n").start()
    yield g
    g.stop()


@pytest.fixture(scope="module")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitMQ]:
    with start_rabbitmq(tmp_path_factory.mktemp("rabbitmq")) as node:
        yield node


@pytest.fixture(params=["gateway", "rabbitmq"])
def both(request: pytest.FixtureRequest) -> Iterator[Any]:
    """``both(version="1.2")``: a connected stomp.py Peer on the gateway, then (second run) on
    RabbitMQ; all are closed after the test."""
    if request.param == "gateway":
        g = request.getfixturevalue("gw")
        port, login = g.port("stomp"), None
    else:
        node = request.getfixturevalue("rabbit")
        port, login = node.stomp_port, "guest"
    made: list[Peer] = []

    def make(version: str = "1.2") -> Peer:
        p = Peer(port, version, connect=False)
        p.conn.transport.vhost = "/"  # RabbitMQ's host header names the virtual host
        p.conn.connect(login, login, wait=True)
        made.append(p)
        return p

    make.target = request.param  # type: ignore[attr-defined]
    yield make
    for p in made:
        if not p.disconnected:
            p.close()


@pytest.fixture
def peers(gw: GatewayThread) -> Iterator[Any]:
    made: list[Peer] = []

    def make(version: str = "1.2") -> Peer:
        p = Peer(gw.port("stomp"), version)
        made.append(p)
        return p

    yield make
    for p in made:
        if not p.disconnected:
            p.close()


def nothing_more(p: Peer) -> None:
    """No MESSAGE beyond those taken, a short while after everything before arrived."""
    p.sync()
    with p.cond:
        p.cond.wait_for(lambda: len(p.messages) > p.taken, NOTHING)
        extra = [(f.headers.get("destination"), f.body) for f in p.messages[p.taken:]]
    assert extra == []


# -- destinations (both) ----------------------------------------------------------------------


def test_topic_routing_key_wildcards(both):
    sub, pub = both(), both()
    sub.sub("/topic/rk.star.*", "star")
    sub.sub("/topic/rk.hash.#", "hash")
    pub.send("/topic/rk.star.a", "1")
    pub.send("/topic/rk.star.a.b", "2")  # '*' is one word
    pub.send("/topic/rk.hash.a.b.c", "3")  # '#' is the rest
    pub.send("/topic/rk.hash", "4")  # ... zero words too
    pub.send("/topic/rk", "5")
    got = sorted((f.headers["subscription"], f.body) for f in sub.take(3))
    assert got == [("hash", "3"), ("hash", "4"), ("star", "1")]
    nothing_more(sub)


def test_amq_topic_exchange_is_the_topic_namespace(both):
    sub, pub = both(), both()
    sub.sub("/exchange/amq.topic/xt.*", "x")
    sub.sub("/topic/xt.k", "t")
    pub.send("/topic/xt.k", "via-topic")
    pub.send("/exchange/amq.topic/xt.k", "via-exchange")
    got = sorted((f.headers["subscription"], f.body) for f in sub.take(4))
    assert got == [("t", "via-exchange"), ("t", "via-topic"),
                   ("x", "via-exchange"), ("x", "via-topic")]


def test_fanout_exchange_copies_to_every_subscriber_whatever_the_key(both):
    a, b, pub = both(), both(), both()
    a.sub("/exchange/amq.fanout", "fa")
    b.sub("/exchange/amq.fanout/ignored", "fb")
    pub.send("/exchange/amq.fanout/any.key", "fan")
    assert (a.get().body, b.get().body) == ("fan", "fan")


def test_direct_exchange_matches_the_key_exactly(both):
    sub, pub = both(), both()
    sub.sub("/exchange/amq.direct/dk.one", "d")
    pub.send("/exchange/amq.direct/dk.two", "no")
    pub.send("/exchange/amq.direct/dk.one", "yes")
    assert sub.get().body == "yes"
    nothing_more(sub)


def test_amq_queue_names_an_existing_queue_and_a_missing_one_is_an_error(both):
    p = both()
    p.send("/queue/aq.exists", "kept")  # /queue/ declares it
    p.sub("/amq/queue/aq.exists", "q")
    assert p.get().body == "kept"
    bad = both()
    bad.conn.subscribe("/amq/queue/aq.missing", id="m", headers={"receipt": "r-miss"})
    assert bad.error().cmd == "ERROR"


def test_unknown_exchange_is_an_error(both):
    p = both()
    p.conn.send("/exchange/no.such.exchange/k", "x", headers={"receipt": "r-x"})
    assert p.error().cmd == "ERROR"


def test_temp_queue_reply_to_is_rewritten_and_the_reply_comes_back(both):
    responder, requester = both(), both()
    responder.sub("/queue/rpc.svc", "svc")
    requester.send("/queue/rpc.svc", "ping", {"reply-to": "/temp-queue/answers"})
    req = responder.get()
    reply_to = req.headers["reply-to"]
    assert reply_to != "/temp-queue/answers"  # a name the responder can send to
    responder.send(reply_to, "pong")  # the responder just echoes it, as RabbitMQ's do
    rep = requester.get()  # no SUBSCRIBE: the reply-to subscribed the requester
    assert (rep.body, rep.headers["subscription"]) == ("pong", "/temp-queue/answers")
    requester.send("/queue/rpc.svc", "again", {"reply-to": "/temp-queue/answers"})
    assert responder.get().headers["reply-to"] == reply_to  # the same queue, one subscription
    responder.send(reply_to, "pong2")
    assert requester.get().body == "pong2"
    nothing_more(requester)


# -- acknowledgement (both) ---------------------------------------------------------------------


def test_nack_requeues_by_default_and_not_with_requeue_false(both):
    p, c = both(), both()
    p.send("/queue/nack.rq", "again")
    p.send("/queue/nack.rq", "dropped")
    c.sub("/queue/nack.rq", "n", ack="client-individual")
    first, second = c.take(2)
    rid = c.rid()
    c.conn.nack(second.headers["ack"], receipt=rid, requeue="false")
    c.receipt(rid)
    c.nack(first)  # RabbitMQ's default: requeue:true
    again = c.get()
    assert (again.body, again.headers.get("redelivered")) == ("again", "true")
    c.ack(again)
    nothing_more(c)


def test_prefetch_count_bounds_unacknowledged_messages(both):
    p, c = both(), both()
    for i in range(3):
        p.send("/queue/prefetch.rq", f"m{i}")
    c.sub("/queue/prefetch.rq", "p", ack="client-individual", headers={"prefetch-count": "2"})
    first, _second = c.take(2)
    nothing_more(c)
    c.ack(first)
    assert c.get().body == "m2"


def test_durable_topic_subscription_by_id_keeps_messages_while_away(both):
    headers = {"durable": "true", "auto-delete": "false"}
    a = both()
    a.sub("/topic/dur.news", "dur-sub-1", headers=headers)
    a.close()
    both().send("/topic/dur.news", "while away")
    b = both()
    b.sub("/topic/dur.news", "dur-sub-1", headers=headers)
    assert b.get().body == "while away"
    rid = b.rid()
    b.conn.unsubscribe(id="dur-sub-1", headers={**headers, "receipt": rid})
    b.receipt(rid)
    both().send("/topic/dur.news", "after delete")
    c = both()
    c.sub("/topic/dur.news", "other-id")
    nothing_more(c)


def test_durable_header_on_a_queue_subscription_changes_nothing(both):
    # RabbitMQ clients send durable:true on queue subscriptions too (how to declare the
    # queue), and on their UNSUBSCRIBE: a plain subscribe and unsubscribe.
    p = both()
    headers = {"durable": "true", "auto-delete": "false"}
    p.sub("/queue/dur.q", "dq", headers=headers)
    p.unsub("dq", headers=headers)
    p.send("/queue/dur.q", "stays")
    p.sub("/queue/dur.q", "dq2")
    assert p.get().body == "stays"


# -- cumulative client acknowledgement (gateway) ----------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_client_ack_is_cumulative_and_acked_messages_never_come_back(peers, version):
    # STOMP 1.2, SUBSCRIBE "ack": an ACK in client mode acknowledges that message and every
    # one sent before it on the subscription; in 1.0 and 1.1 (by message-id) too.
    q = f"/queue/cumulative.v{version.replace('.', '')}"
    p = peers(version)
    p.send(q, "one")
    p.send(q, "two")
    first = peers(version)
    first.sub(q, "c", ack="client")
    first.take(2)
    first.close()  # nothing acknowledged: both come back
    second = peers(version)
    second.sub(q, "c", ack="client")
    one, two = second.take(2)
    assert (one.body, two.body) == ("one", "two")
    second.ack(two)  # acknowledges "one" too
    second.close()
    third = peers(version)
    third.sub(q, "c", ack="client")
    nothing_more(third)


# -- the gateway's side of the RabbitMQ forms: other protocols and the core -------------------


def test_nack_requeue_false_dead_letters_or_drops_on_the_gateway(gw, peers):
    # Not redelivered: undeliverable at once, so dead-lettered when the message asks to be
    # kept (JMS_GW_PRESERVE_UNDELIVERED, gateway/README.md), dropped otherwise.
    p = peers()
    p.send("/queue/nack.dl", "kept dead", {"JMS_GW_PRESERVE_UNDELIVERED": "true",
                                           "gw-types": "JMS_GW_PRESERVE_UNDELIVERED:boolean"})
    p.send("/queue/nack.dl", "dropped")
    p.sub("/queue/nack.dl", "n", ack="client-individual")
    for m in p.take(2):
        rid = p.rid()
        p.conn.nack(m.headers["ack"], receipt=rid, requeue="false")
        p.receipt(rid)
    nothing_more(p)
    assert gw.call(lambda: gw.broker.queues["nack.dl"].count) == 0
    dead = [m.body for m in gw.call(lambda: list(gw.broker.queues[UNDELIVERED].iter_pending()))
            if m.destination is not None and m.destination.name == "nack.dl"]
    assert dead == [b"kept dead"]


def test_nack_requeue_false_in_a_transaction_takes_effect_at_commit(gw, peers):
    p = peers()
    p.send("/queue/nack.tx", "aborted then dropped")
    p.sub("/queue/nack.tx", "n", ack="client-individual")
    for end in ("abort", "commit"):
        m = p.get()
        rid = p.rid()
        p.conn.begin(transaction=end)
        p.conn.nack(m.headers["ack"], transaction=end, requeue="false")
        getattr(p.conn, end)(transaction=end, receipt=rid)
        p.receipt(rid)
    # the ABORT gave it back (redelivered once); the COMMIT made it undeliverable
    assert p.messages[1].headers.get("redelivered") == "true"
    nothing_more(p)
    assert gw.call(lambda: gw.broker.queues["nack.tx"].count) == 0


def test_rabbitmq_destinations_meet_mqtt_and_amqp_clients(gw, peers):
    sub = Client(gw.port("mqtt"), "rabbit-compat", V5)
    amqp = connect(gw.port("amqp"))
    try:
        sub.sub("amq/fanout", qos=1)
        sub.sub("dk/mq", qos=1)
        stomp = peers()
        stomp.sub("/topic/mq.#", "hash")
        stomp.send("/exchange/amq.fanout/whatever", "fanned")
        stomp.send("/exchange/amq.direct/dk.mq", "direct")
        got = sorted((m.topic, m.payload) for m in (sub.get(), sub.get()))
        assert got == [("amq/fanout", b"fanned"), ("dk/mq", b"direct")]
        sub.pub("mq/a/b", b"from mqtt")
        f = stomp.get()
        assert (f.headers["subscription"], f.body) == ("hash", "from mqtt")
        stomp.send("/queue/amqq.x", "declared")
        r = amqp.create_receiver("queue://amqq.x", credit=1)
        assert bytes(r.receive(timeout=5).body) == b"declared"  # content-length: bytes
        r.accept()
        r.close()
        s = amqp.create_sender("queue://amqq.x")
        s.send(proton.Message(body="via amqp"))
        stomp.sub("/amq/queue/amqq.x", "aq")
        assert stomp.get().body == "via amqp"
    finally:
        sub.close()
        amqp.close()


def test_temp_queue_reply_from_an_amqp_responder(gw, peers):
    amqp = connect(gw.port("amqp"))
    try:
        r = amqp.create_receiver("queue://rpc.amqp", credit=1)
        requester = peers()
        requester.send("/queue/rpc.amqp", "ping", {"reply-to": "/temp-queue/mine"})
        req = r.receive(timeout=5)
        r.accept()
        s = amqp.create_sender(req.reply_to)
        s.send(proton.Message(body="pong"))
        rep = requester.get()
        assert (rep.body, rep.headers["subscription"]) == ("pong", "/temp-queue/mine")
    finally:
        amqp.close()
