"""stomp.py (an independent STOMP client, 1.0 / 1.1 / 1.2) against the running gateway's STOMP
adapter over real sockets: send and subscribe on queues and topics, wildcards, the three ack
modes, NACK and dead-lettering, transactions, durable subscriptions, selectors, temporary
reply queues, receipts, the header and body mappings of ``mappings/stomp.py``, login and
ACLs, heart-beats, STOMP over WebSocket (aiohttp) and over TLS.

Most tests share one gateway (module fixture) and keep apart by destination names that carry
the STOMP version. Waiting is done on receipts: a frame's RECEIPT means it took effect, and
:meth:`Peer.sync` (a BEGIN with a receipt) proves every frame the gateway wrote to that
connection before has arrived -- so "nothing more came" is checked without sleeping.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
import time
from typing import Any

import aiohttp
import pytest
import stomp
from gw import GatewayThread
from stomp.exception import ConnectFailedException

from adapters.stomp.connection import HEARTBEAT_GRACE
from gateway.broker import UNDELIVERED
from gateway.message import BodyKind
from gateway.types import Int32

VERSIONS = ("1.0", "1.1", "1.2")
NACK_VERSIONS = ("1.1", "1.2")  # NACK is STOMP 1.1 and later
CLASSES = {"1.0": stomp.Connection10, "1.1": stomp.Connection11, "1.2": stomp.Connection12}
WAIT = 5.0  # seconds to wait for anything the gateway should send
_ids = itertools.count(1)


def tag(version: str) -> str:
    """A destination name part per version ("1.2" → "v12"): core names use '.' separators."""
    return "v" + version.replace(".", "")


class Peer(stomp.ConnectionListener):
    """One stomp.py connection and everything it has received, with waits on it."""

    def __init__(self, port: int, version: str = "1.2", *, login: str | None = None,
                 passcode: str | None = None, client_id: str | None = None,
                 heartbeats: tuple[int, int] = (0, 0), auto_content_length: bool = True,
                 auto_decode: bool = True, ssl_ca: str | None = None,
                 connect: bool = True) -> None:
        self.version = version
        self.cond = threading.Condition()
        self.messages: list[Any] = []
        self.receipts: list[str] = []
        self.errors: list[Any] = []
        self.heartbeats_seen = 0
        self.heartbeat_timeouts = 0
        self.disconnected = False
        self.connected: dict[str, str] = {}
        self.taken = 0
        kw: dict[str, Any] = {"auto_content_length": auto_content_length,
                              "auto_decode": auto_decode, "reconnect_attempts_max": 1}
        if version != "1.0":
            kw["heartbeats"] = heartbeats
        self.conn = CLASSES[version]([("127.0.0.1", port)], **kw)
        if ssl_ca is not None:
            self.conn.set_ssl(for_hosts=[("127.0.0.1", port)], ca_certs=ssl_ca)
        self.conn.set_listener("peer", self)
        self.connect_headers = {"client-id": client_id} if client_id else {}
        if connect:
            self.conn.connect(login, passcode, wait=True, headers=self.connect_headers)

    # -- listener side (stomp.py's receiver thread) ---------------------------------------------

    def on_connected(self, frame: Any) -> None:
        with self.cond:
            self.connected = dict(frame.headers)
            self.cond.notify_all()

    def on_message(self, frame: Any) -> None:
        with self.cond:
            self.messages.append(frame)
            self.cond.notify_all()

    def on_receipt(self, frame: Any) -> None:
        with self.cond:
            self.receipts.append(frame.headers["receipt-id"])
            self.cond.notify_all()

    def on_error(self, frame: Any) -> None:
        with self.cond:
            self.errors.append(frame)
            self.cond.notify_all()

    def on_heartbeat(self) -> None:
        with self.cond:
            self.heartbeats_seen += 1
            self.cond.notify_all()

    def on_heartbeat_timeout(self) -> None:
        with self.cond:
            self.heartbeat_timeouts += 1
            self.cond.notify_all()

    def on_disconnected(self) -> None:
        with self.cond:
            self.disconnected = True
            self.cond.notify_all()

    # -- test side -------------------------------------------------------------------------------

    def wait_until(self, pred: Any, what: str, timeout: float = WAIT) -> None:
        with self.cond:
            if not self.cond.wait_for(pred, timeout):
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")

    def rid(self) -> str:
        return f"r{next(_ids)}"

    def receipt(self, rid: str) -> None:
        self.wait_until(lambda: rid in self.receipts, f"RECEIPT {rid}")

    def get(self, timeout: float = WAIT) -> Any:
        """The next MESSAGE frame not taken yet."""
        self.wait_until(lambda: len(self.messages) > self.taken, "a MESSAGE", timeout)
        with self.cond:
            frame = self.messages[self.taken]
            self.taken += 1
        return frame

    def take(self, n: int) -> list[Any]:
        return [self.get() for _ in range(n)]

    def bodies(self, n: int) -> list[Any]:
        return [f.body for f in self.take(n)]

    def sync(self) -> None:
        """Everything the gateway wrote to this connection before now has arrived."""
        rid = self.rid()
        self.conn.begin(transaction="sync-" + rid, receipt=rid)
        self.receipt(rid)
        self.conn.abort(transaction="sync-" + rid)

    def quiet(self) -> None:
        """No MESSAGE beyond those taken (checked after a sync, not by sleeping)."""
        self.sync()
        with self.cond:
            extra = [(f.headers.get("destination"), f.body) for f in self.messages[self.taken:]]
        assert extra == []

    def send(self, dest: str, body: Any, headers: dict[str, str] | None = None, *,
             content_type: str | None = None, receipt: bool = True) -> None:
        h = dict(headers or {})
        rid = self.rid()
        if receipt:
            h["receipt"] = rid
        self.conn.send(dest, body, content_type=content_type, headers=h)
        if receipt:
            self.receipt(rid)

    def sub(self, dest: str, sid: str, ack: str = "auto",
            headers: dict[str, str] | None = None) -> None:
        rid = self.rid()
        self.conn.subscribe(dest, id=sid, ack=ack, headers={**(headers or {}), "receipt": rid})
        self.receipt(rid)

    def unsub(self, sid: str, headers: dict[str, str] | None = None) -> None:
        rid = self.rid()
        self.conn.unsubscribe(id=sid, headers={**(headers or {}), "receipt": rid})
        self.receipt(rid)

    def ack(self, frame: Any, transaction: str | None = None) -> None:
        rid = self.rid()
        h = frame.headers
        if self.version == "1.0":
            self.conn.ack(h["message-id"], transaction=transaction, receipt=rid)
        elif self.version == "1.1":
            self.conn.ack(h["message-id"], h["subscription"], transaction=transaction,
                          receipt=rid)
        else:
            self.conn.ack(h["ack"], transaction=transaction, receipt=rid)
        self.receipt(rid)

    def nack(self, frame: Any, transaction: str | None = None) -> None:
        rid = self.rid()
        h = frame.headers
        if self.version == "1.1":
            self.conn.nack(h["message-id"], h["subscription"], transaction=transaction,
                           receipt=rid)
        else:
            self.conn.nack(h["ack"], transaction=transaction, receipt=rid)
        self.receipt(rid)

    def error(self) -> Any:
        """The ERROR frame the gateway sent, once the connection has been closed after it."""
        self.wait_until(lambda: bool(self.errors), "an ERROR frame")
        self.wait_until(lambda: self.disconnected, "the connection to close")
        return self.errors[0]

    def close(self) -> None:
        if self.conn.is_connected():
            self.conn.disconnect()
        self.wait_until(lambda: self.disconnected, "the connection to close")


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    g = GatewayThread(
        tmp_path_factory.mktemp("stomp") / "gw",
        gateway="listen = stomp://127.0.0.1:0\nlisten = http://127.0.0.1:0\n",
        queues=">\nnack.> maxRedelivery=2\n",
    ).start()
    yield g
    g.stop()


@pytest.fixture
def peers(gw):
    """Make connections to the shared gateway; all are closed when the test ends."""
    made: list[Peer] = []

    def make(version: str = "1.2", **kw: Any) -> Peer:
        p = Peer(gw.port("stomp"), version, **kw)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def pending(gw, queue: str) -> list[Any]:
    """The messages waiting on a queue (read on the gateway's loop)."""
    return gw.call(lambda: list(gw.broker.queues[queue].iter_pending()))


def wait_for(gw, fn: Any, what: str, timeout: float = WAIT) -> Any:
    """Poll ``fn`` on the gateway's loop until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = gw.call(fn)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


# -- send and subscribe ----------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_queue_send_and_subscribe(peers, version):
    c = peers(version)
    assert (c.connected["version"], c.connected["heart-beat"]) == (version, "0,0")
    dest = f"/queue/basic.{tag(version)}"
    c.sub(dest, "s1")
    for i in range(3):
        c.send(dest, f"hello {i}", content_type="text/plain")
    got = c.take(3)
    assert [f.body for f in got] == ["hello 0", "hello 1", "hello 2"]
    for f in got:
        assert f.cmd == "MESSAGE"
        assert f.headers["destination"] == dest
        assert f.headers["subscription"] == "s1"
        assert f.headers["content-type"] == "text/plain"
        assert f.headers["message-id"].startswith("ID:")
        assert "redelivered" not in f.headers
        assert "ack" not in f.headers  # ack:auto has nothing to acknowledge
    assert len({f.headers["message-id"] for f in got}) == 3
    c.quiet()


@pytest.mark.parametrize("version", VERSIONS)
def test_queue_competing_receivers_share_the_messages(peers, version):
    dest = f"/queue/jobs.{tag(version)}"
    a, b, producer = peers(version), peers(version), peers(version)
    a.sub(dest, "a")
    b.sub(dest, "b")
    for i in range(10):
        producer.send(dest, str(i))
    a.sync()
    b.sync()
    got_a = [f.body for f in a.messages]
    got_b = [f.body for f in b.messages]
    assert sorted(got_a + got_b, key=int) == [str(i) for i in range(10)]
    assert got_a and got_b  # both receivers took part


@pytest.mark.parametrize("version", VERSIONS)
def test_topic_fans_out_to_every_subscriber(peers, version):
    dest = f"/topic/fan.{tag(version)}"
    subs = [peers(version) for _ in range(3)]
    for i, s in enumerate(subs):
        s.sub(dest, f"s{i}")
    producer = peers(version)
    producer.send(dest, "news")
    for i, s in enumerate(subs):
        f = s.get()
        assert (f.body, f.headers["destination"], f.headers["subscription"]) == (
            "news", dest, f"s{i}")
        s.quiet()


@pytest.mark.parametrize("version", VERSIONS)
def test_topic_wildcards(peers, version):
    t = tag(version)
    one, many, exact = peers(version), peers(version), peers(version)
    one.sub(f"/topic/wild.{t}.*", "one")
    many.sub(f"/topic/wild.{t}.>", "many")
    exact.sub(f"/topic/wild.{t}.a.b", "exact")
    producer = peers(version)
    for name in ("a", "a.b", "x.y.z"):
        producer.send(f"/topic/wild.{t}.{name}", name)
    assert [(f.headers["destination"], f.body) for f in one.take(1)] == [
        (f"/topic/wild.{t}.a", "a")]
    assert [(f.headers["destination"], f.body) for f in many.take(3)] == [
        (f"/topic/wild.{t}.a", "a"), (f"/topic/wild.{t}.a.b", "a.b"),
        (f"/topic/wild.{t}.x.y.z", "x.y.z")]
    assert [f.body for f in exact.take(1)] == ["a.b"]
    for s in (one, many, exact):
        s.quiet()


# -- acknowledgement -------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_ack_auto_settles_on_delivery(gw, peers, version):
    name = f"auto.{tag(version)}"
    c = peers(version)
    c.sub(f"/queue/{name}", "s")
    c.send(f"/queue/{name}", "once")
    assert c.get().body == "once"
    c.close()
    assert gw.call(lambda: gw.broker.queues[name].count) == 0
    again = peers(version)
    again.sub(f"/queue/{name}", "s")
    again.quiet()


@pytest.mark.parametrize("version", VERSIONS)
def test_ack_client_is_cumulative(gw, peers, version):
    name = f"cack.{tag(version)}"
    c = peers(version)
    c.sub(f"/queue/{name}", "s", ack="client")
    for i in range(1, 6):
        c.send(f"/queue/{name}", f"m{i}")
    got = c.take(5)
    assert [f.body for f in got] == ["m1", "m2", "m3", "m4", "m5"]
    if version == "1.2":
        assert all(f.headers["ack"] for f in got)
    c.ack(got[2])  # acknowledges m1, m2 and m3
    assert gw.call(lambda: gw.broker.queues[name].count) == 2
    c.close()
    assert [m.body for m in pending(gw, name)] == [b"m4", b"m5"]
    again = peers(version)
    again.sub(f"/queue/{name}", "s", ack="client")
    back = again.take(2)
    assert [(f.body, f.headers.get("redelivered")) for f in back] == [
        ("m4", "true"), ("m5", "true")]
    again.ack(back[1])
    again.quiet()
    assert gw.call(lambda: gw.broker.queues[name].count) == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_ack_client_individual(gw, peers, version):
    name = f"iack.{tag(version)}"
    c = peers(version)
    c.sub(f"/queue/{name}", "s", ack="client-individual")
    for i in range(1, 4):
        c.send(f"/queue/{name}", f"m{i}")
    got = c.take(3)
    c.ack(got[1])  # m2 only
    c.close()
    assert [m.body for m in pending(gw, name)] == [b"m1", b"m3"]
    again = peers(version)
    again.sub(f"/queue/{name}", "s", ack="client-individual")
    back = again.take(2)
    assert [(f.body, f.headers.get("redelivered")) for f in back] == [
        ("m1", "true"), ("m3", "true")]
    for f in back:
        again.ack(f)
    assert gw.call(lambda: gw.broker.queues[name].count) == 0


@pytest.mark.parametrize("version", NACK_VERSIONS)
def test_nack_redelivers_then_dead_letters_past_max_redelivery(gw, peers, version):
    name = f"nack.{tag(version)}"  # queues.conf: nack.> maxRedelivery=2
    c = peers(version)
    c.sub(f"/queue/{name}", "s", ack="client-individual")
    c.send(f"/queue/{name}", "poison", {"JMS_GW_PRESERVE_UNDELIVERED": "true",
                                        "gw-types": "JMS_GW_PRESERVE_UNDELIVERED:boolean"})
    first = c.get()
    assert (first.body, first.headers.get("redelivered")) == ("poison", None)
    c.nack(first)
    second = c.get()
    assert (second.body, second.headers.get("redelivered")) == ("poison", "true")
    c.nack(second)  # the second failed delivery: maxRedelivery reached
    c.quiet()
    assert gw.call(lambda: gw.broker.queues[name].count) == 0
    dead = [(m.body, m.destination.name) for m in pending(gw, UNDELIVERED)
            if m.destination is not None and m.destination.name == name]
    assert dead == [(b"poison", name)]


# -- transactions ----------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_transaction_commit_delivers_and_abort_discards(peers, version):
    dest = f"/queue/tx.{tag(version)}"
    consumer, producer = peers(version), peers(version)
    consumer.sub(dest, "s")
    producer.conn.begin(transaction="t1")
    producer.send(dest, "a", {"transaction": "t1"})
    producer.send(dest, "b", {"transaction": "t1"})
    consumer.quiet()  # nothing before the commit
    rid = producer.rid()
    producer.conn.commit(transaction="t1", receipt=rid)
    producer.receipt(rid)
    assert consumer.bodies(2) == ["a", "b"]
    producer.conn.begin(transaction="t2")
    producer.send(dest, "discarded", {"transaction": "t2"})
    rid = producer.rid()
    producer.conn.abort(transaction="t2", receipt=rid)
    producer.receipt(rid)
    producer.send(dest, "after")
    assert consumer.bodies(1) == ["after"]
    consumer.quiet()


@pytest.mark.parametrize("version", VERSIONS)
def test_transacted_ack_is_undone_by_abort_and_kept_by_commit(gw, peers, version):
    name = f"txack.{tag(version)}"
    c = peers(version)
    c.sub(f"/queue/{name}", "s", ack="client-individual")
    c.send(f"/queue/{name}", "job")
    f = c.get()
    c.conn.begin(transaction="ta")
    c.ack(f, transaction="ta")
    rid = c.rid()
    c.conn.abort(transaction="ta", receipt=rid)
    c.receipt(rid)
    back = c.get()
    assert (back.body, back.headers.get("redelivered")) == ("job", "true")
    c.conn.begin(transaction="tc")
    c.ack(back, transaction="tc")
    assert gw.call(lambda: gw.broker.queues[name].count) == 1  # not before the commit
    rid = c.rid()
    c.conn.commit(transaction="tc", receipt=rid)
    c.receipt(rid)
    assert gw.call(lambda: gw.broker.queues[name].count) == 0
    c.close()
    assert pending(gw, name) == []


@pytest.mark.parametrize("version", NACK_VERSIONS)
def test_transacted_nack_takes_effect_at_commit(peers, version):
    dest = f"/queue/txnack.{tag(version)}"
    c = peers(version)
    c.sub(dest, "s", ack="client-individual")
    c.send(dest, "retry me")
    f = c.get()
    c.conn.begin(transaction="tn")
    c.nack(f, transaction="tn")
    c.quiet()  # not given back before the commit
    rid = c.rid()
    c.conn.commit(transaction="tn", receipt=rid)
    c.receipt(rid)
    back = c.get()
    assert (back.body, back.headers.get("redelivered")) == ("retry me", "true")
    c.ack(back)


# -- durable subscriptions -------------------------------------------------------------------


@pytest.mark.parametrize("header", ["activemq.subscriptionName", "durable-subscription-name"])
@pytest.mark.parametrize("version", VERSIONS)
def test_durable_subscription_keeps_messages_while_away(gw, peers, version, header):
    t = tag(version)
    dest = f"/topic/dur.{t}.{header[0]}"
    cid, name = f"dur-{t}-{header[0]}", "prices"
    durable = {header: name}
    c = peers(version, client_id=cid)
    c.sub(dest, "d", headers=durable)
    c.close()
    producer = peers(version)
    producer.send(dest, "while away 1")
    producer.send(dest, "while away 2")
    back = peers(version, client_id=cid)
    back.sub(dest, "d", headers=durable)
    assert back.bodies(2) == ["while away 1", "while away 2"]
    back.unsub("d", headers=durable)
    assert gw.call(lambda: f"sub:{cid}:{name}" in gw.broker.durables) is False
    back.close()
    producer.send(dest, "nobody keeps this")
    again = peers(version, client_id=cid)
    again.sub(dest, "d", headers=durable)  # a new subscription: it starts empty
    again.quiet()
    producer.send(dest, "fresh")
    assert again.bodies(1) == ["fresh"]


@pytest.mark.parametrize("version", VERSIONS)
def test_durable_subscription_without_client_id_is_an_error(peers, version):
    c = peers(version)
    c.conn.subscribe(f"/topic/dur.anon.{tag(version)}", id="d", ack="auto",
                     headers={"durable-subscription-name": "x"})
    err = c.error()
    assert err.headers["message"] == "durable subscription needs a client-id"


# -- selectors -------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_selector_on_typed_and_string_headers(peers, version):
    t = tag(version)
    typed, text = peers(version), peers(version)
    typed.sub(f"/topic/sel.{t}", "typed", headers={"selector": "colour = 'red' AND n > 2"})
    text.sub(f"/topic/sel.{t}", "text", headers={"selector": "colour = 'red' AND size = 'L'"})
    producer = peers(version)
    for body, colour, n, size in [("r1", "red", 1, "S"), ("r5", "red", 5, "L"),
                                  ("b7", "blue", 7, "L"), ("r3", "red", 3, "M")]:
        producer.send(f"/topic/sel.{t}", body, {"colour": colour, "n": str(n), "size": size,
                                                "gw-types": "n:int32"})
    assert typed.bodies(2) == ["r5", "r3"]
    assert text.bodies(1) == ["r5"]
    typed.quiet()
    text.quiet()


@pytest.mark.parametrize("version", VERSIONS)
def test_invalid_selector_is_an_error(peers, version):
    c = peers(version)
    c.conn.subscribe(f"/queue/badsel.{tag(version)}", id="s", ack="auto",
                     headers={"selector": "colour = = 'red'"})
    assert c.error().headers["message"] == "invalid selector"


# -- temporary reply queues ------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_request_reply_over_a_temporary_queue(gw, peers, version):
    service = f"/queue/svc.{tag(version)}"
    responder, requester = peers(version), peers(version)
    responder.sub(service, "svc")
    requester.sub("/temp-queue/r1", "replies")
    requester.send(service, "ping", {"reply-to": "/temp-queue/r1", "correlation-id": "c-1"})
    req = responder.get()
    reply_to = req.headers["reply-to"]
    assert reply_to.startswith("/temp-queue/$TMP$")
    assert req.headers["correlation-id"] == "c-1"
    responder.send(reply_to, "pong", {"correlation-id": req.headers["correlation-id"]})
    rep = requester.get()
    assert (rep.body, rep.headers["correlation-id"], rep.headers["destination"]) == (
        "pong", "c-1", "/temp-queue/r1")
    core_name = reply_to[len("/temp-queue/"):]
    assert gw.call(lambda: core_name in gw.broker.queues)
    requester.close()
    wait_for(gw, lambda: core_name not in gw.broker.queues, "the temporary queue to go")


# -- receipts --------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_receipts_for_every_frame_that_asks(peers, version):
    dest = f"/queue/rcpt.{tag(version)}"
    c = peers(version)
    conn = c.conn
    conn.subscribe(dest, id="s", ack="client", headers={"receipt": "sub-1"})
    conn.send(dest, "x", headers={"receipt": "send-1"})
    conn.begin(transaction="t", receipt="begin-1")
    conn.commit(transaction="t", receipt="commit-1")
    f = c.get()
    if version == "1.0":
        conn.ack(f.headers["message-id"], receipt="ack-1")
    elif version == "1.1":
        conn.ack(f.headers["message-id"], "s", receipt="ack-1")
    else:
        conn.ack(f.headers["ack"], receipt="ack-1")
    conn.unsubscribe(id="s", headers={"receipt": "unsub-1"})
    c.receipt("unsub-1")
    conn.disconnect(receipt="disc-1")  # returns once the receipt came and the socket closed
    # stomp.py may return from disconnect() before its receiver thread has called the
    # listener with that RECEIPT: wait for the listener too.
    c.receipt("disc-1")
    assert c.receipts == ["sub-1", "send-1", "begin-1", "commit-1", "ack-1", "unsub-1",
                          "disc-1"]
    assert c.errors == []


# -- headers and bodies ------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_jms_headers_and_properties_round_trip(peers, version):
    dest = f"/queue/hdr.{tag(version)}"
    c = peers(version)
    c.sub(dest, "s")
    custom = {"plain": "value", "with-colon": "a:b:c", "accents": "grüße ☃ 東京",
              "clé-ünïcode": "v"}
    if version != "1.0":  # 1.0 has no header escapes
        custom["multi-line"] = "line1\nline2"
        custom["backslash"] = "C:\\temp\\x"
    if version == "1.2":
        custom["carriage"] = "a\rb"
    c.send(dest, "body", {"persistent": "true", "priority": "7", "correlation-id": "corr:42",
                          "reply-to": "/queue/replies.x", "type": "Order", **custom})
    c.send(dest, "plain")
    h = c.get().headers
    assert (h["persistent"], h["priority"], h["correlation-id"], h["reply-to"], h["type"]) == (
        "true", "7", "corr:42", "/queue/replies.x", "Order")
    assert {k: h.get(k) for k in custom} == custom
    assert int(h["timestamp"]) > 1_600_000_000_000
    h = c.get().headers
    assert ("persistent" in h, h["priority"], "correlation-id" in h, "type" in h) == (
        False, "4", False, False)


@pytest.mark.parametrize("version", VERSIONS)
def test_priority_orders_a_waiting_queue(peers, version):
    dest = f"/queue/prio.{tag(version)}"
    c = peers(version)
    for body, prio in [("low", "1"), ("high", "9"), ("mid", "5")]:
        c.send(dest, body, {"priority": prio})
    c.sub(dest, "s")
    assert c.bodies(3) == ["high", "mid", "low"]


@pytest.mark.parametrize("version", VERSIONS)
def test_expired_message_is_not_delivered(gw, peers, version):
    name = f"exp.{tag(version)}"
    c = peers(version)
    now = int(time.time() * 1000)
    later = str(now + 600_000)
    c.send(f"/queue/{name}", "stale, waiting", {"expires": str(now - 1000)})
    c.sub(f"/queue/{name}", "s")
    c.send(f"/queue/{name}", "stale, consumer ready", {"expires": str(now - 1000)})
    c.send(f"/queue/{name}", "fresh", {"expires": later})
    f = c.get()
    assert (f.body, f.headers["expires"]) == ("fresh", later)
    c.quiet()
    assert gw.call(lambda: gw.broker.queues[name].count) == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_gw_types_give_typed_properties(gw, peers, version):
    name = f"typed.{tag(version)}"
    c = peers(version)
    c.send(f"/queue/{name}", "t", {"n": "5", "ok": "true", "gw-types": "n:int32,ok:boolean"})
    (msg,) = pending(gw, name)
    props = dict(msg.properties)
    assert (type(props["n"]), props["n"], props["ok"]) == (Int32, 5, True)
    c.sub(f"/queue/{name}", "s")
    h = c.get().headers
    assert (h["n"], h["ok"], h["gw-types"]) == ("5", "true", "n:int32,ok:boolean")


@pytest.mark.parametrize("version", VERSIONS)
def test_map_and_stream_bodies_as_json(gw, peers, version):
    t = tag(version)
    c = peers(version)
    c.sub(f"/queue/map.{t}", "m")
    c.sub(f"/queue/stream.{t}", "s")
    map_text = '{"zeta": 1, "alpha": {"nested": [1, 2.5, "x"], "flag": true}, "mid": "text"}'
    c.send(f"/queue/map.{t}", map_text, {"transformation": "jms-map-json"})
    f = c.get()
    assert (f.headers["transformation"], f.headers["content-type"]) == (
        "jms-map-json", "application/json")
    got = json.loads(f.body)
    assert got == {"zeta": 1, "alpha": {"nested": [1, 2.5, "x"], "flag": True}, "mid": "text"}
    assert list(got) == ["zeta", "alpha", "mid"]
    assert list(got["alpha"]) == ["nested", "flag"]
    c.send(f"/queue/stream.{t}", '[3, "two", 1.5, false]',
           {"transformation": "jms-stream-json"})
    f = c.get()
    assert (f.headers["transformation"], f.headers["content-type"]) == (
        "jms-stream-json", "application/json")
    assert json.loads(f.body) == [3, "two", 1.5, False]


@pytest.mark.parametrize("version", VERSIONS)
def test_bad_json_body_is_an_error(peers, version):
    c = peers(version)
    c.conn.send(f"/queue/map.bad.{tag(version)}", "{not json",
                headers={"transformation": "jms-map-json"})
    err = c.error()
    assert err.headers["message"] == "malformed message"
    assert "not JSON" in err.body


@pytest.mark.parametrize("version", VERSIONS)
def test_text_or_bytes_by_content_type_and_length(gw, peers, version):
    name = f"kind.{tag(version)}"
    with_length = peers(version)
    with_length.send(f"/queue/{name}", "typed text", content_type="text/plain")
    with_length.send(f"/queue/{name}", "has a length")  # stomp.py adds content-length
    no_length = peers(version, auto_content_length=False)
    no_length.send(f"/queue/{name}", "no length")
    no_length.send(f"/queue/{name}", "json bytes", content_type="application/octet-stream")
    kinds = [(m.body, m.body_kind) for m in pending(gw, name)]
    assert kinds == [("typed text", BodyKind.TEXT), (b"has a length", BodyKind.BYTES),
                     ("no length", BodyKind.TEXT), (b"json bytes", BodyKind.BYTES)]
    no_length.sub(f"/queue/{name}", "s")
    got = [(f.body, f.headers.get("content-type")) for f in no_length.take(4)]
    assert got == [("typed text", "text/plain"), ("has a length", None),
                   ("no length", "text/plain;charset=utf-8"),
                   ("json bytes", "application/octet-stream")]


def test_binary_body_with_nul_bytes(peers):
    c = peers("1.2", auto_decode=False)
    c.sub("/queue/binary", "s")
    payload = bytes(range(256)) * 4
    c.send("/queue/binary", payload)
    f = c.get()
    assert f.body == payload
    assert f.headers["content-length"] == "1024"


# -- security --------------------------------------------------------------------------------


def test_login_and_acl(tmp_path):
    with GatewayThread(
        tmp_path / "gw",
        gateway="listen = stomp://127.0.0.1:0\nauthorization = enabled\n"
                "allow_anonymous = disabled\n",
        users='alice:pw1:"Alice"\nbob:pw2:"Bob"\n',
        queues=">\nsecret secure\n",
        acl="QUEUE=secret USER=alice PERM=send,receive\n",
    ) as g:
        port = g.port("stomp")
        for login, passcode in [("alice", "wrong"), ("nobody", "pw1"), (None, None)]:
            bad = Peer(port, "1.2", login=login, passcode=passcode, connect=False)
            with pytest.raises(ConnectFailedException):
                bad.conn.connect(login, passcode, wait=True)
            assert bad.error().headers["message"] == "authentication failed"
        alice = Peer(port, "1.2", login="alice", passcode="pw1")
        alice.sub("/queue/secret", "s")
        alice.send("/queue/secret", "for alice")
        assert alice.get().body == "for alice"
        alice.close()
        bob = Peer(port, "1.1", login="bob", passcode="pw2")
        bob.conn.send("/queue/secret", "denied", headers={"receipt": "r"})
        err = bob.error()
        assert (err.headers["message"], err.headers["receipt-id"]) == ("not authorized", "r")
        bob = Peer(port, "1.0", login="bob", passcode="pw2")
        bob.conn.subscribe("/queue/secret", id="s", ack="auto")
        assert bob.error().headers["message"] == "not authorized"
        assert g.call(lambda: [m.body for m in g.broker.queues["secret"].iter_pending()]) == []


# -- heart-beats -----------------------------------------------------------------------------


def test_heartbeats_keep_an_idle_stomp_py_connection(peers):
    c = peers("1.2", heartbeats=(200, 200))
    c.sub("/queue/hb", "s")
    # Bursts of traffic then idle time: the gateway must still write something at least
    # every 200 ms (stomp.py allows 1.5 x that before it gives up on the connection).
    start = time.monotonic()
    for i in range(5):
        c.send("/queue/hb", f"beat {i}")
        assert c.get().body == f"beat {i}"
        time.sleep(0.4)  # idle on purpose: heart-beats are what this test is about
    assert time.monotonic() - start >= 2.0
    assert (c.heartbeat_timeouts, c.disconnected, c.conn.is_connected()) == (0, False, True)
    assert c.heartbeats_seen >= 5
    c.send("/queue/hb", "still here")
    assert c.get().body == "still here"


def read_frame(sock: socket.socket) -> bytes:
    data = b""
    while b"\x00" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise AssertionError(f"closed before a whole frame: {data!r}")
        data += chunk
    return data


def test_silent_client_is_closed_after_its_heartbeat_grace(gw):
    with socket.create_connection(("127.0.0.1", gw.port("stomp")), timeout=WAIT) as s:
        s.sendall(b"CONNECT\naccept-version:1.2\nhost:x\nheart-beat:100,0\n\n\x00")
        connected = read_frame(s)
        t0 = time.monotonic()
        assert connected.startswith(b"CONNECTED\n")
        assert b"\nheart-beat:0,100\n" in connected
        rest = b""
        while chunk := s.recv(4096):  # the gateway sends nothing (0 asked) and closes
            rest += chunk
        elapsed = time.monotonic() - t0
    assert rest == b""
    grace = 0.1 * HEARTBEAT_GRACE
    assert grace * 0.75 <= elapsed <= 2 * grace + 0.5


def test_client_heartbeats_keep_a_raw_connection(gw):
    with socket.create_connection(("127.0.0.1", gw.port("stomp")), timeout=WAIT) as s:
        s.sendall(b"CONNECT\naccept-version:1.2\nhost:x\nheart-beat:100,0\n\n\x00")
        read_frame(s)
        for _ in range(10):  # 1 s, well past the grace, with a heart-beat every 100 ms
            time.sleep(0.1)
            s.sendall(b"\n")
        s.sendall(b"SUBSCRIBE\nid:0\ndestination:/queue/raw.hb\nreceipt:alive\n\n\x00")
        assert read_frame(s) == b"RECEIPT\nreceipt-id:alive\n\n\x00"


# -- WebSocket and TLS -----------------------------------------------------------------------


def split_frames(data: bytes) -> list[tuple[str, dict[str, str], bytes]]:
    """STOMP frames in one WebSocket message (they may be several; EOL heart-beats skipped)."""
    out = []
    while data:
        if data[:1] in (b"\n", b"\r"):
            data = data[1:]
            continue
        head, _, rest = data.partition(b"\n\n")
        lines = head.decode().split("\n")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers.setdefault(k, v)
        n = int(headers["content-length"]) if "content-length" in headers else rest.index(b"\0")
        out.append((lines[0], headers, rest[:n]))
        assert rest[n:n + 1] == b"\0"
        data = rest[n + 1:]
    return out


class WsClient:
    """The frames a WebSocket peer receives, each with the kind of message it came in."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.frames: list[tuple[str, dict[str, str], bytes]] = []
        self.kinds: list[aiohttp.WSMsgType] = []

    async def next(self) -> tuple[str, dict[str, str], bytes]:
        return (await self.next_kind())[1]

    async def next_kind(self) -> tuple[aiohttp.WSMsgType, tuple[str, dict[str, str], bytes]]:
        while not self.frames:
            await self._fill()
        return self.kinds.pop(0), self.frames.pop(0)

    async def _fill(self) -> None:
        msg = await self.ws.receive(timeout=WAIT)
        assert msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY), msg
        data = msg.data.encode() if msg.type == aiohttp.WSMsgType.TEXT else msg.data
        for frame in split_frames(data):
            self.frames.append(frame)
            self.kinds.append(msg.type)


def test_websocket_text_and_binary(gw, peers):
    tcp = peers("1.2")
    url = f"http://127.0.0.1:{gw.port('http')}/stomp"

    async def text_client() -> None:
        async with aiohttp.ClientSession() as s, s.ws_connect(url, protocols=("v12.stomp",)
                                                               ) as ws:
            assert ws.protocol == "v12.stomp"
            c = WsClient(ws)
            await ws.send_str("CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
            kind, (cmd, h, _) = await c.next_kind()
            assert (kind, cmd, h["version"]) == (aiohttp.WSMsgType.TEXT, "CONNECTED", "1.2")
            await ws.send_str("SUBSCRIBE\nid:w\ndestination:/topic/ws.text\nreceipt:s\n\n\x00")
            assert (await c.next())[:2] == ("RECEIPT", {"receipt-id": "s"})
            await ws.send_str("SEND\ndestination:/topic/ws.text\ncontent-type:text/plain\n"
                              "colour:blue\n\nfrom ws ☃\x00")
            kind, (cmd, h, body) = await c.next_kind()
            assert (kind, cmd, h["destination"], h["colour"], body.decode()) == (
                aiohttp.WSMsgType.TEXT, "MESSAGE", "/topic/ws.text", "blue", "from ws ☃")
            # a message published over TCP STOMP reaches the WebSocket subscriber
            await asyncio.to_thread(tcp.send, "/topic/ws.text", "from tcp",
                                    content_type="text/plain")
            kind, (cmd, h, body) = await c.next_kind()
            assert (kind, cmd, body) == (aiohttp.WSMsgType.TEXT, "MESSAGE", b"from tcp")
            # bytes that are not UTF-8 cannot go in a text message: they come as binary
            await asyncio.to_thread(tcp.send, "/topic/ws.text", b"\xff\x00\xfe")
            kind, (cmd, h, body) = await c.next_kind()
            assert (kind, cmd, body) == (aiohttp.WSMsgType.BINARY, "MESSAGE", b"\xff\x00\xfe")
            await ws.send_str("DISCONNECT\nreceipt:bye\n\n\x00")
            assert (await c.next())[:2] == ("RECEIPT", {"receipt-id": "bye"})

    async def binary_client() -> None:
        async with aiohttp.ClientSession() as s, s.ws_connect(url, protocols=("v11.stomp",)
                                                               ) as ws:
            assert ws.protocol == "v11.stomp"
            c = WsClient(ws)
            # a frame split over two binary messages, then two frames in one message
            await ws.send_bytes(b"CONNECT\naccept-version:1.1\nhost:localhost\n")
            await ws.send_bytes(b"\n\x00")
            kind, (cmd, _, _) = await c.next_kind()
            assert (kind, cmd) == (aiohttp.WSMsgType.BINARY, "CONNECTED")
            payload = b"\x00\x01binary\xff"
            await ws.send_bytes(
                b"SUBSCRIBE\nid:b\ndestination:/queue/ws.bin\n\n\x00"
                b"SEND\ndestination:/queue/ws.bin\ncontent-length:%d\n\n%s\x00"
                % (len(payload), payload))
            kind, (cmd, h, body) = await c.next_kind()
            assert (kind, cmd, h["destination"], body) == (
                aiohttp.WSMsgType.BINARY, "MESSAGE", "/queue/ws.bin", payload)
            assert "content-type" not in h

    asyncio.run(text_client())
    asyncio.run(binary_client())
    tcp.sub("/topic/ws.text", "t")  # the TCP client still works alongside
    tcp.send("/topic/ws.text", "end")
    assert tcp.bodies(1) == ["end"]


def test_websocket_without_stomp_subprotocol_is_refused(gw):
    url = f"http://127.0.0.1:{gw.port('http')}/stomp"

    async def run() -> tuple[Any, Any]:
        async with aiohttp.ClientSession() as s, s.ws_connect(url, protocols=("mqtt",)) as ws:
            msg = await ws.receive(timeout=WAIT)
            return msg.type, ws.close_code

    assert asyncio.run(run()) == (aiohttp.WSMsgType.CLOSE, 1002)


def test_stomp_over_tls(tmp_path):
    from test_mqtt_tls_and_cli import make_cert

    cert, key = make_cert(tmp_path)
    with GatewayThread(
        tmp_path / "gw",
        gateway=f"listen = stomps://127.0.0.1:0\nlisten = stomp://127.0.0.1:0\n"
                f"tls_cert = {cert}\ntls_key = {key}\n",
    ) as g:
        plain = Peer(g.port("stomp"), "1.2")
        plain.sub("/topic/secure.x", "p")
        secure = Peer(g.port("stomps"), "1.2", ssl_ca=cert)
        secure.sub("/queue/secure.q", "q")
        secure.send("/queue/secure.q", "over tls")
        secure.send("/topic/secure.x", "to the plain one")
        assert secure.bodies(1) == ["over tls"]
        assert plain.bodies(1) == ["to the plain one"]
        secure.close()
        plain.close()
