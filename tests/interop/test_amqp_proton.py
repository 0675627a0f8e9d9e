"""python-qpid-proton clients against the gateway's AMQP 1.0 server: send, receive,
request/reply, selectors, durable and shared subscriptions, transactions, browsing,
settlement outcomes and credit."""

from __future__ import annotations

import time

import pytest
from amqpclient import connect
from gw import GatewayThread
from proton import Message, Terminus, Timeout, symbol
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import (
    AtMostOnce,
    Container,
    Copy,
    DurableSubscription,
    LinkOption,
    Selector,
)
from proton.utils import LinkDetached


@pytest.fixture
def gw(tmp_path):
    g = GatewayThread(tmp_path / "gw", gateway="listen = amqp://127.0.0.1:0\n").start()
    yield g
    g.stop()


def drain(receiver, n: int, timeout: float = 5) -> list:
    out = []
    for _ in range(n):
        out.append(receiver.receive(timeout=timeout))
        receiver.accept()
    return out


def nothing_more(receiver, wait: float = 0.5) -> bool:
    try:
        receiver.receive(timeout=wait)
    except Timeout:
        return True
    return False


def everything(*receivers) -> list:  # type: ignore[no-untyped-def]
    """The bodies each receiver gets (accepting them) until it has been quiet for 0.5 s."""
    seen = []
    for r in receivers:
        while True:
            try:
                seen.append(r.receive(timeout=0.5).body)
                r.accept()
            except Timeout:
                break
    return seen


def pending(gw, queue: str) -> list:
    return gw.call(lambda: [m.body for m in gw.broker.queues[queue].iter_pending()])


class Capabilities(LinkOption):
    def __init__(self, *caps: str, source: bool = True) -> None:
        self.caps = caps
        self.source = source

    def apply(self, link):  # type: ignore[no-untyped-def]
        t = link.source if self.source else link.target
        t.capabilities.put_object([symbol(c) for c in self.caps])


def test_queue_send_and_receive_in_order(gw):
    c = connect(gw.port("amqp"))
    s = c.create_sender("queue://orders")
    for i in range(20):
        s.send(Message(body=f"order {i}", properties={"i": i}, durable=True))
    r = c.create_receiver("queue://orders", credit=5)
    got = drain(r, 20)
    assert [m.body for m in got] == [f"order {i}" for i in range(20)]
    assert [m.properties["i"] for m in got] == list(range(20))
    assert all(m.durable for m in got)
    assert nothing_more(r)
    c.close()


def test_competing_receivers_share_a_queue(gw):
    port = gw.port("amqp")
    a, b = connect(port), connect(port)
    ra = a.create_receiver("queue://jobs", credit=10)
    rb = b.create_receiver("queue://jobs", credit=10)
    s = a.create_sender("queue://jobs")
    for i in range(10):
        s.send(Message(body=i))
    assert sorted(everything(ra, rb)) == list(range(10))
    a.close()
    b.close()


def test_topic_fans_out_to_every_subscriber(gw):
    port = gw.port("amqp")
    c = connect(port)
    subs = [c.create_receiver("topic://news.sport", credit=10, name=f"s{i}") for i in range(3)]
    wild = c.create_receiver("topic://news.>", credit=10, name="wild")
    c.create_sender("topic://news.sport").send(Message(body="goal"))
    for r in [*subs, wild]:
        assert drain(r, 1)[0].body == "goal"
    c.close()


def test_bare_address_uses_capabilities_then_the_default(tmp_path):
    g = GatewayThread(tmp_path / "gw", gateway="listen = amqp://127.0.0.1:0\n"
                      "amqp_default_destination = topic\n").start()
    try:
        c = connect(g.port("amqp"))
        t = c.create_receiver("prices", credit=10, name="t")  # default: a topic
        q = c.create_receiver("prices", credit=10, name="q", options=Capabilities("queue"))
        c.create_sender("topic://prices").send(Message(body="topic"))
        c.create_sender("queue://prices", name="qs").send(Message(body="queue"))
        assert drain(t, 1)[0].body == "topic"
        assert drain(q, 1)[0].body == "queue"
        c.close()
    finally:
        g.stop()


def test_request_reply_with_a_dynamic_reply_queue(gw):
    port = gw.port("amqp")
    server = connect(port)
    requests = server.create_receiver("queue://service", credit=10)
    client = connect(port)
    replies = client.create_receiver(None, dynamic=True, credit=10)
    reply_to = replies.link.remote_source.address
    assert reply_to.startswith("queue://$TMP$.")
    client.create_sender("queue://service").send(
        Message(body="ping", reply_to=reply_to, correlation_id="req-1"))
    req = drain(requests, 1)[0]
    assert req.reply_to == reply_to and req.correlation_id == "req-1"
    server.create_sender(req.reply_to).send(
        Message(body="pong", correlation_id=req.correlation_id))
    rep = drain(replies, 1)[0]
    assert (rep.body, rep.correlation_id) == ("pong", "req-1")
    client.close()
    # the temporary queue goes with its connection
    time.sleep(0.2)
    name = reply_to[len("queue://"):]
    assert gw.call(lambda: name not in gw.broker.queues)
    with pytest.raises(LinkDetached):
        server.create_receiver(reply_to)
    server.close()


def test_selector_filters_and_is_echoed(gw):
    c = connect(gw.port("amqp"))
    s = c.create_sender("queue://sel")
    for i in range(6):
        s.send(Message(body=f"m{i}", properties={"n": i, "color": "red" if i % 2 else "blue"}))
    r = c.create_receiver("queue://sel", credit=10, options=Selector("n > 1 AND color = 'red'"))
    filters = r.link.remote_source.filter
    filters.rewind()
    filters.next()
    echoed = filters.get_object()
    assert any(str(v.descriptor) == "apache.org:selector-filter:string" for v in echoed.values())
    assert [m.body for m in drain(r, 2)] == ["m3", "m5"]
    assert nothing_more(r)
    assert pending(gw, "sel") == ["m0", "m1", "m2", "m4"]
    c.close()


class NoLocal(LinkOption):
    def apply(self, link):  # type: ignore[no-untyped-def]
        from proton import Described

        link.source.filter.put_dict(
            {symbol("no-local"): Described(symbol("apache.org:no-local-filter:list"), [])})


def test_no_local_skips_the_connections_own_messages(gw):
    port = gw.port("amqp")
    me, other = connect(port), connect(port)
    r = me.create_receiver("topic://chat", credit=10, options=NoLocal())
    me.create_sender("topic://chat").send(Message(body="mine"))
    other.create_sender("topic://chat").send(Message(body="theirs"))
    assert drain(r, 1)[0].body == "theirs"
    assert nothing_more(r)
    me.close()
    other.close()


def test_durable_subscription_survives_detach_and_ends_on_close(gw):
    port = gw.port("amqp")
    c = connect(port, container_id="app-1")
    r = c.create_receiver("topic://alerts", name="my-sub", credit=10,
                          options=DurableSubscription())
    r.link.detach()  # detach, not close: the subscription stays
    time.sleep(0.2)
    assert gw.call(lambda: "sub:app-1:my-sub" in gw.broker.durables)
    p = connect(port)
    p.create_sender("topic://alerts").send(Message(body="while away", durable=True))
    p.close()
    c.close()
    c = connect(port, container_id="app-1")
    r = c.create_receiver("topic://alerts", name="my-sub", credit=10,
                          options=DurableSubscription())
    assert drain(r, 1)[0].body == "while away"
    r.close()  # detach with closed = true: unsubscribe
    time.sleep(0.2)
    assert gw.call(lambda: "sub:app-1:my-sub" not in gw.broker.durables)
    c.close()


def test_durable_subscription_survives_a_gateway_restart(gw):
    port = gw.port("amqp")
    c = connect(port, container_id="app-2")
    r = c.create_receiver("topic://orders.new", name="keep", credit=10,
                          options=DurableSubscription())
    r.link.detach()
    c.close()
    p = connect(port)
    p.create_sender("topic://orders.new").send(Message(body="kept", durable=True))
    p.close()
    gw.restart()
    c = connect(gw.port("amqp"), container_id="app-2")
    r = c.create_receiver("topic://orders.new", name="keep", credit=10,
                          options=DurableSubscription())
    assert drain(r, 1)[0].body == "kept"
    c.close()


def test_shared_subscription_splits_messages(gw):
    port = gw.port("amqp")
    a, b = connect(port, container_id="shared-a"), connect(port, container_id="shared-b")
    opts = Capabilities("shared", "global")
    ra = a.create_receiver("topic://work.items", name="workers|global", credit=10, options=opts)
    rb = b.create_receiver("topic://work.items", name="workers|global", credit=10, options=opts)
    s = a.create_sender("topic://work.items")
    for i in range(10):
        s.send(Message(body=i))
    assert sorted(everything(ra, rb)) == list(range(10))
    a.close()
    b.close()


def test_browse_sees_everything_and_consumes_nothing(gw):
    c = connect(gw.port("amqp"))
    s = c.create_sender("queue://stock")
    for i in range(4):
        s.send(Message(body=f"item {i}"))
    b = c.create_receiver("queue://stock", credit=10, options=Copy(), name="browser")
    # a browser's transfers come settled: there is nothing to acknowledge
    assert [b.receive(timeout=5).body for _ in range(4)] == [f"item {i}" for i in range(4)]
    assert nothing_more(b)
    assert pending(gw, "stock") == [f"item {i}" for i in range(4)]
    c.close()


def failed(receiver) -> None:  # type: ignore[no-untyped-def]
    """Settle the oldest unsettled delivery as modified(delivery-failed = true)."""
    from proton import Delivery

    dlv = receiver.fetcher.unsettled.popleft()
    dlv.local.failed = True
    dlv.update(Delivery.MODIFIED)
    dlv.settle()


def test_outcomes_released_rejected_modified(tmp_path):
    g = GatewayThread(tmp_path / "gw", gateway="listen = amqp://127.0.0.1:0\n",
                      queues=">\nretry maxRedelivery=2\n").start()
    try:
        c = connect(g.port("amqp"))
        s = c.create_sender("queue://retry")
        s.send(Message(body="a"))
        r = c.create_receiver("queue://retry", credit=1)
        m = r.receive(timeout=5)
        assert m.delivery_count == 0
        r.release(delivered=False)  # released: not an attempt
        m = r.receive(timeout=5)
        assert m.body == "a" and m.delivery_count == 0
        r.release(delivered=True)  # modified without delivery-failed: not counted either
        m = r.receive(timeout=5)
        assert m.body == "a" and m.delivery_count == 0
        failed(r)  # modified(delivery-failed), as Qpid JMS sends it: counted
        m = r.receive(timeout=5)
        assert m.body == "a" and m.delivery_count == 1
        failed(r)  # the second failed attempt: maxRedelivery reached
        assert nothing_more(r)
        s.send(Message(body="b"))
        assert r.receive(timeout=5).body == "b"
        r.reject()  # rejected: undeliverable at once
        assert nothing_more(r)
        assert g.call(lambda: g.broker.queues["retry"].count) == 0
        c.close()
    finally:
        g.stop()


def test_presettled_both_ways(gw):
    c = connect(gw.port("amqp"))
    s = c.create_sender("queue://fast", options=AtMostOnce())
    for i in range(50):
        s.send(Message(body=i))
    r = c.create_receiver("queue://fast", credit=100, options=AtMostOnce())
    got = [r.receive(timeout=5).body for _ in range(50)]
    assert got == list(range(50))
    assert gw.call(lambda: gw.broker.queues["fast"].count) == 0  # nothing awaits an ack
    c.close()


def test_credit_limits_what_is_sent(gw):
    c = connect(gw.port("amqp"))
    s = c.create_sender("queue://credit")
    for i in range(10):
        s.send(Message(body=i))
    r = c.create_receiver("queue://credit", credit=3)
    time.sleep(0.3)
    assert len(pending(gw, "credit")) == 7  # three went out against the credit
    got = [r.receive(timeout=5).body for _ in range(3)]
    assert got == [0, 1, 2]
    c.close()


def test_unsettled_deliveries_return_when_the_link_closes(gw):
    c = connect(gw.port("amqp"))
    c.create_sender("queue://back").send(Message(body="x"))
    r = c.create_receiver("queue://back", credit=1)
    assert r.receive(timeout=5).body == "x"
    r.close()  # never settled
    r = c.create_receiver("queue://back", credit=1, name="again")
    m = r.receive(timeout=5)
    assert m.body == "x" and m.delivery_count == 1
    r.accept()
    c.close()


class _Tx(MessagingHandler, TransactionHandler):
    """Declare, send two messages and consume one inside, then commit or abort."""

    def __init__(self, url: str, commit: bool) -> None:
        super().__init__(auto_accept=False)
        self.url = url
        self.commit = commit
        self.done = False
        self.received: list = []

    def on_start(self, event):  # type: ignore[no-untyped-def]
        self.conn = event.container.connect(self.url)
        self.sender = event.container.create_sender(self.conn, "queue://tx.out")
        event.container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event):  # type: ignore[no-untyped-def]
        self.txn = event.transaction
        self.txn.send(self.sender, Message(body="out-1"))
        self.txn.send(self.sender, Message(body="out-2"))
        event.container.create_receiver(self.conn, "queue://tx.in")

    def on_message(self, event):  # type: ignore[no-untyped-def]
        if self.received:
            return  # after an abort the message comes back; it stays unsettled here
        self.received.append(event.message.body)
        self.txn.accept(event.delivery)
        if self.commit:
            self.txn.commit()
        else:
            self.txn.abort()

    def on_transaction_committed(self, event):  # type: ignore[no-untyped-def]
        self.done = "committed"
        self.conn.close()

    def on_transaction_aborted(self, event):  # type: ignore[no-untyped-def]
        self.done = "aborted"
        self.conn.close()


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_local_transaction_send_and_acknowledge(gw, commit):
    port = gw.port("amqp")
    c = connect(port)
    c.create_sender("queue://tx.in").send(Message(body="in-1"))
    c.close()
    h = _Tx(f"amqp://127.0.0.1:{port}", commit)
    Container(h).run()
    assert h.done == ("committed" if commit else "aborted")
    assert h.received == ["in-1"]
    if commit:
        assert pending(gw, "tx.out") == ["out-1", "out-2"]
        assert gw.call(lambda: gw.broker.queues["tx.in"].count) == 0
    else:
        assert gw.call(lambda: "tx.out" not in gw.broker.queues or
                       not gw.broker.queues["tx.out"].count)
        assert pending(gw, "tx.in") == ["in-1"]  # returned by the rollback


def test_anonymous_relay_routes_by_to(gw):
    c = connect(gw.port("amqp"))
    s = c.create_sender(None)
    s.send(Message(address="queue://relay.a", body="A"))
    s.send(Message(address="topic://relay.t", body="T"))
    r = c.create_receiver("queue://relay.a", credit=1)
    assert r.receive(timeout=5).body == "A"
    r.accept()
    c.close()


def test_tls_listener(tmp_path):
    import subprocess

    d = tmp_path / "gw"
    d.mkdir()
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    g = GatewayThread(d, gateway=f"listen = amqps://127.0.0.1:0\ntls_cert = {cert}\n"
                      f"tls_key = {key}\n").start()
    try:
        from proton import SSLDomain
        from proton.utils import BlockingConnection

        dom = SSLDomain(SSLDomain.MODE_CLIENT)
        dom.set_trusted_ca_db(str(cert))
        dom.set_peer_authentication(SSLDomain.VERIFY_PEER)
        c = BlockingConnection(f"amqps://127.0.0.1:{g.port('amqps')}", ssl_domain=dom,
                               timeout=10)
        c.create_sender("queue://secure").send(Message(body="over tls"))
        r = c.create_receiver("queue://secure", credit=1)
        assert r.receive(timeout=5).body == "over tls"
        r.accept()
        c.close()
    finally:
        g.stop()


def test_terminus_durability_is_answered(gw):
    c = connect(gw.port("amqp"), container_id="app-3")
    r = c.create_receiver("topic://t.d", name="d1", credit=1, options=DurableSubscription())
    src = r.link.remote_source
    assert src.durability != Terminus.NONDURABLE and src.expiry_policy == Terminus.EXPIRE_NEVER
    c.close()


def test_heartbeats_keep_an_idle_connection_open(gw):
    # The client asks for frames at least every second (idle-time-out 1 s, proton sends it as
    # half): without our empty frames it would close the connection as idle.
    c = connect(gw.port("amqp"), heartbeat=1)
    with pytest.raises(Timeout):
        c.wait(lambda: False, timeout=3.5, msg="idling")
    c.create_sender("queue://idle").send(Message(body="still here"))
    r = c.create_receiver("queue://idle", credit=1)
    assert r.receive(timeout=5).body == "still here"
    r.accept()
    c.close()


def test_shared_durable_subscription_outlives_its_consumers(gw):
    port = gw.port("amqp")
    opts = Capabilities("shared")
    c = connect(port, container_id="sd-app")
    r = c.create_receiver("topic://sd.t", name="sd-sub", credit=10,
                          options=[DurableSubscription(), opts])
    r.link.detach()
    time.sleep(0.2)
    p = connect(port)
    p.create_sender("topic://sd.t").send(Message(body="kept for the group", durable=True))
    p.close()
    c.close()
    c = connect(port, container_id="sd-app")
    r = c.create_receiver("topic://sd.t", name="sd-sub", credit=10,
                          options=[DurableSubscription(), opts])
    assert drain(r, 1)[0].body == "kept for the group"
    c.close()


def test_a_producer_is_held_back_while_the_core_pushes_back(tmp_path):
    """flowControl on a queue with a receiver that takes nothing: the sends past the limit
    get no outcome (and the link no new credit) until the receiver drains the queue."""
    g = GatewayThread(tmp_path / "gw", gateway="listen = amqp://127.0.0.1:0\n"
                      "flow_control = enabled\n", queues=">\nheld flowControl=2KB\n").start()
    try:
        port = g.port("amqp")
        c = connect(port)
        r = c.create_receiver("queue://held", credit=0)  # a receiver, but no credit yet
        s = c.create_sender("queue://held")
        body = b"x" * 512
        held = None
        for i in range(20):
            try:
                s.send(Message(body=body, properties={"i": i}), timeout=1)
            except Timeout:
                held = i
                break
        assert held is not None and held < 10  # ~2 KB got in, then the sends were held
        given = s.link.credit
        time.sleep(0.5)
        assert s.link.credit <= given  # no new credit while held
        r.flow(100)
        got = [r.receive(timeout=5).properties["i"] for _ in range(held + 1)]
        r.accept()
        assert got == list(range(held + 1))  # the held one too, nothing lost
        c.close()
    finally:
        g.stop()
