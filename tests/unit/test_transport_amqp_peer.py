"""transports/amqp.py against a scripted AMQP 1.0 peer on loopback: SASL, dispositions, link
credit, imports, loops, connection loss, idle timeout. The peer is proton's engine in server
mode behind the adapter's SaslServer, driven by the test's own event loop."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import proton
from corehelp import not_compiled, running_broker
from proton import Collector, Connection, Delivery, Endpoint, Event, Transport

import transports.amqp as amqp_transport
import transports.amqp_export as amqp_export
import transports.reply
from adapters.amqp.sasl import SaslError, SaslServer
from gateway.errors import GatewayError
from gateway.message import PROP_IMPORTED, DeliveryMode, Destination, Message
from transports.amqp import far_address, name_candidates
from transports.manager import TransportManager

ORIGIN = proton.symbol("x-opt-gw-origin")
HOPS = proton.symbol("x-opt-gw-hops")
TRACE = proton.symbol("x-opt-gw-trace-id")  # with it, the core keeps the message's origin


class FakePeer:
    """A scripted AMQP 1.0 server. ``outcome(message)`` answers each transfer it gets
    (``None``: leave it unsettled); it grants ``credit`` on each link the client sends on."""

    def __init__(self, *, credit: int = 100, password: str = "secret", idle_timeout: float = 0,
                 outcome: Callable[[proton.Message], int | None] = lambda pm: Delivery.ACCEPTED,
                 refuse: Callable[[str], bool] = lambda address: False,
                 relay: bool = False) -> None:
        self.credit = credit
        self.relay = relay  # offer ANONYMOUS-RELAY; refuse(None) then refuses the relay link
        self.password = password
        self.idle_timeout = idle_timeout  # advertised in its open; it never ticks itself
        self.outcome = outcome
        self.refuse = refuse
        self.received: list[tuple[str, proton.Message]] = []  # (link target, message)
        self.outcomes: list[tuple[Any, int]] = []  # (body, the client's outcome) of what we sent
        self.users: list[str | None] = []
        self.containers: list[str] = []
        self.sources: list[str] = []  # addresses the client subscribed to
        self.ended: list[tuple[str, bool]] = []  # (link name, closed) of links the client ended
        self.protos: list[_PeerProtocol] = []
        self.server: asyncio.AbstractServer | None = None
        self.port = 0

    async def start(self, tls: ssl.SSLContext | None = None) -> FakePeer:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: _PeerProtocol(self), "127.0.0.1", 0,
                                               ssl=tls)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        self.drop()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    def drop(self) -> None:
        """Cut every connection (no close frame: as a crash or a network failure)."""
        for p in list(self.protos):
            p.abort()

    def links(self, address: str) -> list[Any]:
        return [lk for p in self.protos for lk in p.out_links if lk.source.address == address]

    def send(self, address: str, pm: proton.Message) -> None:
        """Send to the client's receiver on ``address`` (it must have credit)."""
        link = self.links(address)[-1]
        assert link.credit > 0
        dlv = link.delivery(str(time.monotonic_ns()))
        dlv.body = pm.body
        link.send(pm.encode())
        link.advance()
        for p in self.protos:
            p.flush()

    def detach_senders(self) -> None:
        """Close every link the client sends on (no error: as on a peer's housekeeping)."""
        for p in self.protos:
            for link in p.in_links:
                link.close()
            p.in_links.clear()
            p.flush()

    def grant(self, n: int) -> None:
        for p in self.protos:
            for link in p.in_links:
                link.flow(n)
            p.flush()


class _PeerProtocol(asyncio.Protocol):
    def __init__(self, peer: FakePeer) -> None:
        self.peer = peer
        self.sasl: SaslServer | None = SaslServer(self._auth, plain=True, anonymous=True)
        self.sock: asyncio.Transport | None = None
        self.t: Transport | None = None
        self.c: Connection | None = None
        self.col = Collector()
        self.in_links: list[Any] = []
        self.out_links: list[Any] = []

    def _auth(self, user: str | None, password: str | None) -> str | None:
        if user is not None and password != self.peer.password:
            raise SaslError("bad password")
        return user

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.sock = transport  # type: ignore[assignment]
        self.peer.protos.append(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.peer.protos:
            self.peer.protos.remove(self)

    def abort(self) -> None:
        if self.sock is not None:
            self.sock.abort()

    def data_received(self, data: bytes) -> None:
        if self.sasl is not None:
            out = self.sasl.feed(data)
            if out and self.sock is not None:
                self.sock.write(out)
            if self.sasl.failed:
                assert self.sock is not None
                self.sock.close()
                return
            if not self.sasl.done:
                return
            self.peer.users.append(self.sasl.user)
            data = self.sasl.rest
            self.sasl = None
            self.t = Transport(Transport.SERVER)
            self.t.idle_timeout = self.peer.idle_timeout
            self.c = Connection()
            self.c.collect(self.col)
            self.t.bind(self.c)
        assert self.t is not None
        self.t.push(data)
        self.flush()

    def flush(self) -> None:
        t = self.t
        if t is None:
            return
        while True:
            ev = self.col.peek()
            if ev is None:
                break
            self._event(ev)
            self.col.pop()
        while (n := t.pending()) > 0:
            assert self.sock is not None
            self.sock.write(t.peek(n))
            t.pop(n)
        if n < 0 and self.sock is not None:
            self.sock.close()

    def _event(self, ev: Event) -> None:
        kind = ev.type
        if kind == Event.CONNECTION_REMOTE_OPEN:
            self.peer.containers.append(ev.connection.remote_container)
            if self.peer.relay:
                ev.connection.offered_capabilities = proton.SymbolList(
                    [proton.symbol("ANONYMOUS-RELAY")])
            ev.connection.open()
        elif kind == Event.SESSION_REMOTE_OPEN:
            ev.session.open()
        elif kind == Event.LINK_REMOTE_OPEN:
            link = ev.link
            link.source.copy(link.remote_source)
            link.target.copy(link.remote_target)
            if link.is_receiver:  # the client sends
                if self.peer.refuse(link.remote_target.address):
                    link.target.address = None
                    link.open()
                    link.condition = proton.Condition("amqp:not-found", "no such address")
                    link.close()
                    return
                self.in_links.append(link)
                link.open()
                if self.peer.credit:
                    link.flow(self.peer.credit)
            else:
                self.out_links.append(link)
                self.peer.sources.append(link.remote_source.address)
                link.open()
        elif kind == Event.DELIVERY:
            dlv = ev.delivery
            link = dlv.link
            if link.is_receiver:
                if dlv.partial:
                    return
                pm = proton.Message()
                pm.decode(link.recv(dlv.pending))
                link.advance()
                self.peer.received.append((link.target.address, pm))
                outcome = self.peer.outcome(pm)
                if outcome is not None and not dlv.settled:
                    dlv.update(outcome)
                    dlv.settle()
            elif dlv.updated:
                self.peer.outcomes.append((getattr(dlv, "body", None), dlv.remote_state))
                dlv.settle()
        elif kind in (Event.LINK_REMOTE_CLOSE, Event.LINK_REMOTE_DETACH):
            self.peer.ended.append((ev.link.name, kind == Event.LINK_REMOTE_CLOSE))
            ev.link.close()
        elif kind == Event.CONNECTION_REMOTE_CLOSE:
            ev.connection.close()


async def until(cond: Callable[[], Any], timeout: float = 5.0, what: str = "condition") -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.asynccontextmanager
async def bridge(tmp_path: Any, peer: FakePeer, topics: str = ">\n", queues: str = ">\n",
                 scheme: str = "amqp", **params: str) -> AsyncIterator[tuple[Any, Any]]:
    """A broker whose transport ``far`` is connected to ``peer``."""
    conf = {"type": "amqp", "url": f"{scheme}://127.0.0.1:{peer.port}",
            "reconnect_min": "50msec", "reconnect_max": "200msec", **params}
    text = "[far]\n" + "".join(f"{k} = {v}\n" for k, v in conf.items())
    async with running_broker(tmp_path, gateway="amqp_transports = enabled\n", topics=topics,
                              queues=queues, transports=text) as b:
        m = TransportManager(b, b.config)
        await m.start()
        try:
            yield b, m.transports["far"]
        finally:
            await m.stop()
            await peer.close()


def publish(b: Any, name: str, *bodies: str) -> None:
    p = b.connect().session().producer(Destination.topic(name),
                                       delivery_mode=DeliveryMode.NON_PERSISTENT)
    for body in bodies:
        p.send(Message.text(body))


# -- names ------------------------------------------------------------------------------------


def test_far_addresses_use_binding_key_wildcards_only_under_rabbitmq_prefixes():
    assert far_address("/topic/", "a.*.>") == "/topic/a.*.#"
    assert far_address("/exchange/amq.topic/", "a.>") == "/exchange/amq.topic/a.#"
    assert far_address("topic://", "a.*.>") == "topic://a.*.>"  # another gateway: EMS syntax
    assert far_address("/queue/", "jobs.>") == "/queue/jobs.>"


def test_wildcard_names_come_from_to_then_subject():
    assert name_candidates("/topic/a.b", "rk", "/topic/") == [("a.b", False), ("rk", True)]
    assert name_candidates("topic://a.c", None, "/topic/") == [("a.c", False)]
    assert name_candidates("elsewhere", "a.d", "/topic/") == [("a.d", True)]
    assert name_candidates(None, None, "/topic/") == []


# -- connecting -------------------------------------------------------------------------------


async def test_plain_credentials_container_id_and_default_addresses(tmp_path):
    peer = await FakePeer().start()
    async with bridge(tmp_path, peer, topics='out.> export="far"\n>\n', username="u",
                      password="secret", container_id="gw-c1") as (b, t):
        await until(lambda: t.state == "up", what="up")
        assert peer.users == ["u"] and peer.containers == ["gw-c1"]
        publish(b, "out.a", "m1")
        await until(lambda: t.stats["exported"] == 1, what="exported")
        address, pm = peer.received[0]
        assert address == "topic://out.a" and pm.body == "m1"  # the default topic prefix
        assert pm.annotations[ORIGIN] == b.id and pm.annotations[HOPS] == 0


async def test_amqps_verifies_the_peer_with_tls_ca(tmp_path):
    if shutil.which("openssl") is None:
        raise AssertionError("openssl is needed to make a test certificate")
    cert, key = tmp_path / "peer.pem", tmp_path / "peer.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    peer = await FakePeer().start(tls=ctx)
    async with bridge(tmp_path / "gw", peer, topics='out.> export="far"\n>\n', scheme="amqps",
                      tls_ca=str(cert), username="u", password="secret") as (b, t):
        await until(lambda: t.state == "up", what="up over TLS")
        publish(b, "out.a", "secret message")
        await until(lambda: t.stats["exported"] == 1, what="exported")
        assert peer.users == ["u"] and peer.received[0][1].body == "secret message"


async def test_a_wrong_password_keeps_it_down_and_says_why(tmp_path):
    peer = await FakePeer().start()
    async with bridge(tmp_path, peer, username="u", password="wrong") as (b, t):
        await until(lambda: t.last_error, what="the failure")
        await asyncio.sleep(0.3)
        assert t.state != "up" and t.stats["connects"] == 0
        assert "unauthorized" in t.last_error or "auth" in t.last_error.lower()


async def test_the_idle_timeout_drops_a_silent_peer_and_reconnects(tmp_path):
    peer = await FakePeer().start()  # it never ticks: it sends no heartbeats
    async with bridge(tmp_path, peer, idle_timeout="300msec") as (b, t):
        await until(lambda: t.stats["connects"] >= 2, timeout=30, what="a reconnect")
        assert "idle" in (t.last_error or "")


async def test_heartbeats_keep_a_peer_with_an_idle_timeout_content(tmp_path):
    peer = await FakePeer(idle_timeout=0.4).start()  # wants a frame at least every 0.2 s
    async with bridge(tmp_path, peer) as (b, t):
        await until(lambda: t.state == "up" and peer.protos, what="up")
        frames = peer.protos[0].t.frames_input
        await asyncio.sleep(1.0)  # nothing to send meanwhile but empty frames
        assert peer.protos[0].t.frames_input - frames >= 4
        assert t.stats["connects"] == 1


# -- export -----------------------------------------------------------------------------------


async def test_outcomes_accepted_rejected_released(tmp_path, monkeypatch):
    monkeypatch.setattr(amqp_export, "RELEASED_RETRY", 0.05)
    seen: dict[str, int] = {}

    def outcome(pm: proton.Message) -> int:
        seen[pm.body] = seen.get(pm.body, 0) + 1
        if pm.body == "rej":
            return Delivery.REJECTED
        if pm.body == "rel" and seen["rel"] == 1:
            return Delivery.RELEASED
        return Delivery.ACCEPTED

    peer = await FakePeer(outcome=outcome).start()
    async with bridge(tmp_path, peer, topics='out.> export="far"\n>\n') as (b, t):
        await until(lambda: t.state == "up", what="up")
        publish(b, "out.a", "acc", "rej", "rel")
        await until(lambda: t.stats["exported"] == 2, what="both accepted")
        assert seen == {"acc": 1, "rej": 1, "rel": 2}  # released once, sent again
        assert t.stats["failed"] == 1 and t.info()["spooled"] == 0
        assert t.stats["connects"] == 1  # all on the one connection


async def test_no_link_credit_keeps_exports_in_the_spool_until_the_peer_flows(tmp_path):
    peer = await FakePeer(credit=0).start()
    async with bridge(tmp_path, peer, topics='out.> export="far"\n>\n') as (b, t):
        await until(lambda: t.state == "up", what="up")
        publish(b, "out.a", "m0", "m1", "m2")
        await until(lambda: peer.protos and peer.protos[0].in_links, what="the sender link")
        await asyncio.sleep(0.2)
        assert peer.received == [] and t.info()["spooled"] == 3
        assert t.exports["out.>"].inflight == 0  # nothing handed to proton without credit
        peer.grant(2)
        await until(lambda: t.stats["exported"] == 2, what="two sent")
        await asyncio.sleep(0.1)
        assert [pm.body for _, pm in peer.received] == ["m0", "m1"]
        peer.grant(5)
        await until(lambda: t.stats["exported"] == 3, what="the third")
        assert [pm.body for _, pm in peer.received] == ["m0", "m1", "m2"]
        assert t.stats["connects"] == 1


async def test_a_refused_address_fails_its_exports(tmp_path):
    peer = await FakePeer(refuse=lambda address: address == "topic://out.bad").start()
    async with bridge(tmp_path, peer, topics='out.> export="far"\n>\n') as (b, t):
        await until(lambda: t.state == "up", what="up")
        publish(b, "out.bad", "x")
        await until(lambda: t.stats["failed"] == 1, what="the failure")
        publish(b, "out.good", "y")
        await until(lambda: t.stats["exported"] == 1, what="the other address still works")
        assert t.info()["spooled"] == 0 and t.state == "up" and t.stats["connects"] == 1


async def test_a_dropped_connection_gives_unconfirmed_exports_back_to_send_again(tmp_path):
    hold = [True]
    peer = await FakePeer(outcome=lambda pm: None if hold[0] else Delivery.ACCEPTED).start()
    async with bridge(tmp_path, peer, topics='out.> export="far"\n>\n') as (b, t):
        await until(lambda: t.state == "up", what="up")
        publish(b, "out.a", "m0", "m1")
        await until(lambda: len(peer.received) == 2, what="both sent, unanswered")
        assert t.info()["spooled"] == 2 and t.stats["exported"] == 0
        hold[0] = False
        peer.drop()
        await until(lambda: t.stats["exported"] == 2, what="sent again after reconnecting")
        assert [pm.body for _, pm in peer.received] == ["m0", "m1", "m0", "m1"]
        assert t.stats["connects"] == 2 and t.info()["spooled"] == 0


async def test_a_detached_sender_link_gives_its_unconfirmed_exports_back_in_order(tmp_path):
    hold = [True]
    peer = await FakePeer(outcome=lambda pm: None if hold[0] else Delivery.ACCEPTED).start()
    async with bridge(tmp_path, peer, topics='out.> export="far"\n>\n') as (b, t):
        await until(lambda: t.state == "up", what="up")
        publish(b, "out.a", "m0", "m1", "m2")
        await until(lambda: len(peer.received) == 3, what="all sent, unanswered")
        hold[0] = False
        peer.detach_senders()
        await until(lambda: t.stats["exported"] == 3, what="sent again on a new link")
        assert [pm.body for _, pm in peer.received] == ["m0", "m1", "m2", "m0", "m1", "m2"]
        assert t.stats["connects"] == 1 and t.info()["spooled"] == 0


async def test_a_peer_offering_anonymous_relay_gets_every_export_on_one_link(tmp_path):
    peer = await FakePeer(relay=True).start()
    async with bridge(tmp_path, peer, topics='out.> export="far"\n>\n',
                      address_prefix_topic="/topic/", anonymous_relay="true") as (b, t):
        await until(lambda: t.state == "up", what="up")
        for name in ("out.a", "out.b", "out.a", "out.c"):
            publish(b, name, name)
        await until(lambda: t.stats["exported"] == 4, what="all accepted")
        assert len(peer.protos[0].in_links) == 1  # one link, with no target address
        assert [(target, pm.address, pm.body) for target, pm in peer.received] == [
            (None, "/topic/" + n, n) for n in ("out.a", "out.b", "out.a", "out.c")]
        assert t.info()["anonymous_relay"] is True and t.info()["sender_links"] == 1


async def test_without_anonymous_relay_it_uses_a_link_per_address(tmp_path):
    peer = await FakePeer(relay=True).start()  # offered, but not asked for (the default)
    async with bridge(tmp_path, peer, topics='out.> export="far"\n>\n') as (b, t):
        await until(lambda: t.state == "up", what="up")
        publish(b, "out.a", "a")
        publish(b, "out.b", "b")
        await until(lambda: t.stats["exported"] == 2, what="both accepted")
        assert [(target, pm.body) for target, pm in peer.received] == [
            ("topic://out.a", "a"), ("topic://out.b", "b")]
        assert t.info()["anonymous_relay"] is False and t.info()["sender_links"] == 2


async def test_a_refused_relay_link_falls_back_to_a_link_per_address(tmp_path):
    peer = await FakePeer(relay=True, refuse=lambda address: address is None).start()
    async with bridge(tmp_path, peer, topics='out.> export="far"\n>\n',
                      anonymous_relay="true") as (b, t):
        await until(lambda: t.state == "up", what="up")
        publish(b, "out.a", "m0", "m1")
        publish(b, "out.b", "m2")
        await until(lambda: t.stats["exported"] == 3, what="all accepted")
        assert [(target, pm.body) for target, pm in peer.received] == [
            ("topic://out.a", "m0"), ("topic://out.a", "m1"), ("topic://out.b", "m2")]
        assert t.info()["anonymous_relay"] is False and t.stats["failed"] == 0
        assert t.stats["connects"] == 1 and t.info()["spooled"] == 0


# -- import -----------------------------------------------------------------------------------


async def test_queue_import_accepts_after_the_core_took_it_and_drops_loops(tmp_path):
    peer = await FakePeer().start()
    async with bridge(tmp_path, peer, queues='q1 import="far"\n>\n', max_hops="3",
                      queue_import_dm="PERSISTENT") as (b, t):
        await until(lambda: peer.links("queue://q1"), what="the receiver link")
        link = peer.links("queue://q1")[0]
        await until(lambda: link.credit == amqp_transport.CREDIT, what="the credit window")
        peer.send("queue://q1", proton.Message(body="own", annotations={ORIGIN: b.id}))
        peer.send("queue://q1", proton.Message(body="far", annotations={ORIGIN: "x", HOPS: 3}))
        peer.send("queue://q1", proton.Message(body="ok", annotations={ORIGIN: "x", HOPS: 1,
                                                                    TRACE: "x:1"},
                                               properties={"k": "v"}))
        await until(lambda: len(peer.outcomes) == 3, what="three outcomes")
        assert [o for _, o in peer.outcomes] == [Delivery.ACCEPTED] * 3
        msgs = list(b.queues["q1"].iter_pending())
        assert [m.body for m in msgs] == ["ok"]
        m = msgs[0]
        assert m.origin == "x" and m.hops == 2 and m.trace_id == "x:1"
        assert m.delivery_mode == DeliveryMode.PERSISTENT
        assert m.properties == {"k": "v", PROP_IMPORTED: "far"}  # markers are not properties
        assert t.stats["dropped_loop"] == 2 and t.stats["imported"] == 1
        assert link.credit == amqp_transport.CREDIT - 3  # replenished only past half
        assert t.stats["connects"] == 1


async def test_topic_import_link_follows_local_subscriptions(tmp_path):
    peer = await FakePeer().start()
    async with bridge(tmp_path, peer, topics='in.> import="far"\n>\n',
                      address_prefix_topic="/topic/") as (b, t):
        await until(lambda: t.state == "up", what="up")
        s = b.connect().session()
        got: list[Any] = []
        c1 = s.consumer(Destination.topic("in.a.>"), listener=got.append)
        c2 = s.consumer(Destination.topic("in.a.>"), listener=lambda d: None)
        await until(lambda: peer.sources == ["/topic/in.a.#"], what="one far subscription")
        link = peer.links("/topic/in.a.#")[0]
        await until(lambda: link.credit > 0, what="credit")
        peer.send("/topic/in.a.#", proton.Message(body="w", subject="in.a.b.c"))
        await until(lambda: got, what="the import")
        assert got[0].msg.destination == Destination.topic("in.a.b.c") and got[0].msg.type is None
        c1.close()
        c2.close()
        await until(lambda: link.state & Endpoint.REMOTE_CLOSED, what="the link closed")
        assert t.receivers == {}


# -- temporary reply-to, durable subscriptions, resends of foreign messages -------------------


async def test_a_temporary_reply_to_is_routed_back_while_it_exists(tmp_path, monkeypatch):
    monkeypatch.setattr(transports.reply, "REPLY_SWEEP", 0.05)
    peer = await FakePeer().start()
    async with bridge(tmp_path, peer, topics='svc.> export="far"\n>\n') as (b, t):
        await until(lambda: t.state == "up", what="up")
        conn = b.connect()
        s = conn.session()
        temp = conn.temporary_queue()
        replies: list[Any] = []
        s.consumer(temp, listener=replies.append)
        s.producer(Destination.topic("svc.echo")).send(
            Message.text("ping", reply_to=temp, correlation_id="c-1"))
        await until(lambda: peer.received, what="the request")
        route = f"topic://gw-reply.{b.id}.q{temp.name.rsplit('.', 1)[-1]}"
        assert peer.received[0][1].reply_to == route
        assert route in t.replies and peer.sources == [route]  # its link, made with the route
        link = peer.links(route)[0]
        await until(lambda: link.credit > 0, what="credit on the route")
        peer.send(route, proton.Message(body="pong", correlation_id="c-1"))
        await until(lambda: replies, what="the reply")
        assert replies[0].msg.body == "pong" and replies[0].msg.correlation_id == "c-1"
        assert replies[0].msg.destination == temp
        peer.drop()  # the route's link is attached again after reconnecting
        await until(lambda: t.stats["connects"] == 2 and peer.links(route), what="re-attached")
        await until(lambda: peer.links(route)[0].credit > 0, what="credit again")
        peer.send(route, proton.Message(body="pong2"))
        await until(lambda: len(replies) == 2, what="a reply after reconnecting")
        conn.close()  # the temporary queue is gone: the route and its link go with it
        await until(lambda: route not in t.replies, what="the route dropped")
        await until(lambda: (peer.links(route)[0].name, True) in peer.ended, what="link closed")
        assert t.reply_links == {} and t.stats["imported"] == 2


async def test_durable_subscriptions_use_a_durable_terminus_under_a_stable_name(tmp_path):
    peer = await FakePeer().start()
    async with bridge(tmp_path, peer, topics='in.> import="far"\n>\n', queues='q2 import="far"\n>\n',
                      durable_subscriptions="true", container_id="gw-dur") as (b, t):
        await until(lambda: peer.links("queue://q2"), what="the queue link")
        qlink = peer.links("queue://q2")[0]
        assert qlink.remote_source.durability == proton.Terminus.NONDURABLE  # topics only
        consumer = b.connect().session().consumer(Destination.topic("in.x"), listener=None)
        await until(lambda: peer.links("topic://in.x"), what="the topic link")
        link = peer.links("topic://in.x")[0]
        assert link.name == "far:durable:topic://in.x"
        assert link.remote_source.durability == proton.Terminus.DELIVERIES  # unsettled-state
        assert link.remote_source.expiry_policy == proton.Terminus.EXPIRE_NEVER
        peer.drop()  # a lost connection keeps the subscription: same container, same name
        await until(lambda: t.stats["connects"] == 2 and peer.links("topic://in.x"),
                    what="attached again")
        again = peer.links("topic://in.x")[0]
        assert again is not link and again.name == link.name
        assert peer.containers == ["gw-dur", "gw-dur"] and peer.ended == []
        consumer.close()  # the last local subscriber went: the subscription ends (closed)
        await until(lambda: peer.ended, what="the link ended")
        assert peer.ended == [("far:durable:topic://in.x", True)]


async def test_without_durable_subscriptions_topic_links_are_volatile(tmp_path):
    peer = await FakePeer().start()
    async with bridge(tmp_path, peer, topics='in.> import="far"\n>\n') as (b, t):
        await until(lambda: t.state == "up", what="up")
        b.connect().session().consumer(Destination.topic("in.y"), listener=None)
        await until(lambda: peer.links("topic://in.y"), what="the topic link")
        link = peer.links("topic://in.y")[0]
        assert link.remote_source.durability == proton.Terminus.NONDURABLE
        assert link.name != "far:durable:topic://in.y"


async def test_a_redelivered_copy_of_a_foreign_message_is_dropped_once_taken(tmp_path):
    peer = await FakePeer().start()
    async with bridge(tmp_path, peer, queues='q3 import="far"\n>\n') as (b, t):
        await until(lambda: peer.links("queue://q3"), what="the receiver link")
        await until(lambda: peer.links("queue://q3")[0].credit > 0, what="credit")

        def send(mid: str, body: str, first: bool) -> None:
            pm = proton.Message(id=mid, body=body)
            pm.first_acquirer = first
            peer.send("queue://q3", pm)

        send("m-1", "a", True)
        send("m-1", "a-again", False)  # the resend after a lost settlement: dropped
        send("m-2", "b", False)  # redelivered, but never imported: taken
        send("m-1", "c", True)  # the same id, yet a first acquisition: a message of its own
        await until(lambda: len(peer.outcomes) == 4, what="four outcomes")
        assert [o for _, o in peer.outcomes] == [Delivery.ACCEPTED] * 4
        assert [m.body for m in b.queues["q3"].iter_pending()] == ["a", "b", "c"]
        assert t.stats["duplicates"] == 1 and t.stats["imported"] == 3


@not_compiled
async def test_a_foreign_message_the_core_refused_is_taken_when_sent_again(tmp_path, monkeypatch):
    peer = await FakePeer().start()
    async with bridge(tmp_path, peer, queues='q4 import="far"\n>\n') as (b, t):
        await until(lambda: peer.links("queue://q4"), what="the receiver link")
        await until(lambda: peer.links("queue://q4")[0].credit > 0, what="credit")
        real = b.publish
        calls = [0]

        def publish(msg: Message, conn: Any, **kw: Any) -> Any:
            calls[0] += 1
            if calls[0] == 1:
                raise GatewayError("refused for the test")
            return real(msg, conn, **kw)

        monkeypatch.setattr(b, "publish", publish)
        pm = proton.Message(id="m-9", body="x")
        peer.send("queue://q4", pm)
        await until(lambda: t.stats["failed"] == 1, what="the refusal")
        pm.first_acquirer = False
        peer.send("queue://q4", pm)  # the far side sending it again: not a duplicate
        await until(lambda: t.stats["imported"] == 1, what="the second copy taken")
        assert [m.body for m in b.queues["q4"].iter_pending()] == ["x"]
        assert t.stats["duplicates"] == 0
