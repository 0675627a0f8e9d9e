"""The stomp transport against real brokers: RabbitMQ's STOMP plugin and ActiveMQ's STOMP
connector (export, import, spool, loops; TIBCO EMS User's Guide, chapter
"Working With TIBCO Rendezvous", "Topics" and "Queues").

Each broker is started once for the module (RabbitMQ takes about 10 s); tests keep apart by
destination names. The far side is a stomp.py client of its own (:class:`Remote`). The spool
test puts tests/faultproxy.py between the gateway and ActiveMQ and disables it, which closes
the live connection and refuses new ones, as a broker that went away does.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp
from faultproxy import FaultProxyServer
from gw import GatewayThread, wait_for  # its default timeout: 10 s, as WAIT
from peers.activemq import ActiveMQ, start_activemq
from peers.rabbitmq import RabbitMQ, start_rabbitmq
from transportlog import check_duplicate_drop, exported_records

from gateway.message import PROP_IMPORTED, BodyKind, DeliveryMode, Destination, Message
from gateway.types import Int16, Int32, UInt64
from transports.stomp import POISON_LOSSES

WAIT = 10.0


@pytest.fixture(scope="module")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitMQ]:
    with start_rabbitmq(tmp_path_factory.mktemp("rabbitmq")) as broker:
        yield broker


@pytest.fixture(scope="module")
def amq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ActiveMQ]:
    with start_activemq(tmp_path_factory.mktemp("activemq")) as broker:
        yield broker


class Remote:
    """A stomp.py client on the far side, collecting the MESSAGE frames it receives."""

    def __init__(self, port: int, rabbit: bool) -> None:
        self.got: list[Any] = []
        self.receipts: set[str] = set()
        self.lock = threading.Lock()
        self.c = stomp.Connection12([("127.0.0.1", port)], auto_decode=False,
                                    vhost="/" if rabbit else None)
        self.c.set_listener("remote", self)
        self.c.connect(wait=True, with_connect_command=True)
        self.n = 0

    def on_message(self, frame: Any) -> None:
        with self.lock:
            self.got.append(frame)

    def on_receipt(self, frame: Any) -> None:
        self.receipts.add(frame.headers["receipt-id"])

    def sync(self, frame: str, headers: dict[str, str], body: bytes = b"") -> None:
        """Write a frame and wait for its RECEIPT (it took effect)."""
        self.n += 1
        rid = f"r{self.n}"
        self.c.send_frame(frame, {**headers, "receipt": rid}, body)
        wait_for(lambda: rid in self.receipts, what=f"RECEIPT of {frame}")

    def subscribe(self, dest: str, sid: str) -> None:
        self.sync("SUBSCRIBE", {"destination": dest, "id": sid, "ack": "auto"})

    def send(self, dest: str, body: bytes, **headers: str) -> None:
        self.sync("SEND", {"destination": dest, "content-length": str(len(body)), **headers},
                  body)

    def close(self) -> None:
        self.c.disconnect()


def transports_conf(port: int, rabbit: bool, **extra: str) -> str:
    lines = ["[far]", "type = stomp", f"url = stomp://127.0.0.1:{port}",
             "reconnect_min = 100msec", "reconnect_max = 500msec"]
    if rabbit:
        lines.append("vhost = /")  # RabbitMQ reads the host header as the vhost
    lines += [f"{k} = {v}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def gateway(tmp: Path, port: int, rabbit: bool, topics: str, queues: str = ">\n",
            **extra: str) -> GatewayThread:
    g = GatewayThread(
        tmp, gateway="listen = http://127.0.0.1:0\nstomp_transports = enabled\n",
        transports=transports_conf(port, rabbit, **extra), topics=topics, queues=queues,
    ).start()
    wait_for(lambda: info(g)["far"]["state"] == "up", what="transport up")
    return g


def after(action: Callable[[], None], cond: Callable[[], Any]) -> Callable[[], Any]:
    """A condition for :func:`wait_for` that does ``action`` before each look (send a probe
    until one comes through: a far-side SUBSCRIBE takes effect some time after it is made)."""

    def run() -> Any:
        action()
        return cond()

    return run


def info(g: GatewayThread) -> dict[str, Any]:
    return {t["name"]: t for t in g.admin_get("/api/v1/transports")}


def publish(g: GatewayThread, dest: str, *msgs: Message, **send: Any) -> None:
    def run() -> None:
        p = g.broker.connect().session().producer(Destination.topic(dest))
        for m in msgs:
            p.send(m, **send)

    g.call(run)


def subscribe(g: GatewayThread, dest: Destination, got: list[Any]) -> Any:
    return g.call(lambda: g.broker.connect().session().consumer(dest, listener=got.append))


def far_side(request: pytest.FixtureRequest, name: str) -> tuple[int, bool]:
    broker = request.getfixturevalue(name)
    return broker.stomp_port, name == "rabbit"


# -- export -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("broker", "receipts"), [("rabbit", "true"), ("amq", "false")])
def test_export_carries_headers_typed_properties_and_loop_markers(
        tmp_path: Path, request: pytest.FixtureRequest, broker: str, receipts: str) -> None:
    port, rabbit = far_side(request, broker)
    remote = Remote(port, rabbit)
    remote.subscribe("/topic/out.a", "s1")
    g = gateway(tmp_path / "gw", port, rabbit, 'out.> export="far"\n>\n', receipts=receipts)
    try:
        publish(g, "out.a", Message.text(
            "héllo", properties={"n": Int16(7), "s": "x", "big": UInt64(2**63), "a:b": "c"},
            type="t1", correlation_id="c-1"), priority=6)
        wait_for(lambda: remote.got, what="the export")
        h = remote.got[0].headers
        assert remote.got[0].body == "héllo".encode()
        assert h["destination"] == "/topic/out.a"
        assert h["content-type"] == "text/plain;charset=utf-8"
        if broker == "amq":  # no content-length on text: ActiveMQ made it a TextMessage
            assert "content-length" not in h
        assert h["n"] == "7" and h["s"] == "x" and h["big"] == str(2**63)
        assert h["a:b"] == "c"  # the name is escaped on the wire (\c), not cut at the colon
        types = h["gw-types"].split(",")
        assert "n:int16" in types and "big:uint64" in types
        assert h["type"] == "t1" and h["correlation-id"] == "c-1" and h["priority"] == "6"
        assert h["persistent"] == "true"
        assert h["gw-origin"] == g.broker.id and h["gw-hops"] == "0"
        assert h["gw-trace-id"].startswith(g.broker.id + ":")
        publish(g, "out.a", Message.binary(b"a\x00b\x00"), Message.text("t\x00u"))
        wait_for(lambda: len(remote.got) == 3, what="the exports with NUL")
        assert [f.body for f in remote.got[1:]] == [b"a\x00b\x00", b"t\x00u"]
        assert remote.got[1].headers["content-length"] == "4"
        assert "content-type" not in remote.got[1].headers
        wait_for(lambda: info(g)["far"]["exported"] == 3, what="exports confirmed")
        assert info(g)["far"]["spooled"] == 0
    finally:
        remote.close()
        g.stop()


def test_export_properties_false_sends_the_body_and_markers_only(
        tmp_path: Path, amq: ActiveMQ) -> None:
    remote = Remote(amq.stomp_port, False)
    remote.subscribe("/topic/np.a", "s1")
    g = gateway(tmp_path / "gw", amq.stomp_port, False, 'np.> export="far"\n>\n',
                export_properties="false", export_headers="false")
    try:
        publish(g, "np.a", Message.text("x", properties={"p": "v"}, type="t"), priority=9)
        wait_for(lambda: remote.got, what="the export")
        h = remote.got[0].headers
        assert "p" not in h and "type" not in h and h["priority"] == "4"
        assert h["gw-origin"] == g.broker.id
    finally:
        remote.close()
        g.stop()


# -- import -----------------------------------------------------------------------------------


def test_topic_import_only_while_subscribed(tmp_path: Path, rabbit: RabbitMQ) -> None:
    remote = Remote(rabbit.stomp_port, True)
    g = gateway(tmp_path / "gw", rabbit.stomp_port, True, 'in.> import="far"\n>\n')
    try:
        assert info(g)["far"]["imports"] == {"in.>": []}
        remote.send("/topic/in.x", b"before")  # nobody subscribed: not imported
        got: list[Any] = []
        consumer = subscribe(g, Destination.topic("in.x"), got)
        assert info(g)["far"]["imports"] == {"in.>": ["in.x"]}
        # The far-side SUBSCRIBE is asynchronous: send until the first one comes through.
        wait_for(after(lambda: remote.send("/topic/in.x", b"probe"), lambda: got),
                 what="the subscription")
        n = len(got)
        remote.send("/topic/in.x", b"42", k="v", n="5", **{"gw-types": "n:int32"})
        wait_for(lambda: len(got) > n, what="the import")
        msg = got[-1].msg
        assert msg.body_kind == BodyKind.BYTES and msg.body == b"42"  # content-length: bytes
        assert msg.properties["k"] == "v"
        assert msg.properties["n"] == 5 and type(msg.properties["n"]) is Int32
        assert msg.properties[PROP_IMPORTED] == "far"
        assert msg.delivery_mode == DeliveryMode.NON_PERSISTENT  # topic_import_dm default
        assert "gw-origin" not in msg.properties and "subscription" not in msg.properties
        assert all(d.msg.body != b"before" for d in got)
        g.call(lambda: consumer.close())
        assert info(g)["far"]["imports"] == {"in.>": []}
        count = info(g)["far"]["imported"]
        time.sleep(0.3)  # the UNSUBSCRIBE is asynchronous too
        remote.send("/topic/in.x", b"after")
        time.sleep(0.3)
        assert info(g)["far"]["imported"] == count
    finally:
        remote.close()
        g.stop()


def test_queue_import_is_persistent_and_acknowledged_after_the_core_took_it(
        tmp_path: Path, rabbit: RabbitMQ) -> None:
    remote = Remote(rabbit.stomp_port, True)
    g = gateway(tmp_path / "gw", rabbit.stomp_port, True, ">\n",
                queues='jobs.rq import="far"\n>\n', queue_import_dm="PERSISTENT")
    try:
        for i in range(3):
            remote.send("/queue/jobs.rq", f"j{i}".encode(), **{"content-type": "text/plain"})
        wait_for(lambda: g.call(lambda: "jobs.rq" in g.broker.queues and
                                g.broker.queues["jobs.rq"].count == 3), what="the imports")
        pending = g.call(lambda: list(g.broker.queues["jobs.rq"].iter_pending()))
        assert [m.body for m in pending] == ["j0", "j1", "j2"]
        assert {m.delivery_mode for m in pending} == {DeliveryMode.PERSISTENT}

        def left_in_rabbitmq() -> str:
            out = rabbit.ctl("list_queues", "name", "messages", "--no-table-headers").stdout
            return next(line for line in out.splitlines() if line.startswith("jobs.rq"))

        wait_for(lambda: left_in_rabbitmq().split() == ["jobs.rq", "0"], what="the ACKs")
    finally:
        remote.close()
        g.stop()


def test_the_delivery_log_writes_a_transport_s_traffic_as_its_own(
        tmp_path: Path, rabbit: RabbitMQ) -> None:
    """docs/delivery-log.md, "Events", through RabbitMQ's STOMP: the imports and the export
    name the transport with no reason, each import is its message's one entry record (before
    its delivery to a local consumer), the export has no deliver or ack of its hand-off to
    the transport; a second copy of an import (the same trace id) is dropped with a record
    that carries what its import would have (the copy's STOMP message-id)."""
    remote = Remote(rabbit.stomp_port, True)
    remote.subscribe("/topic/dlo.a", "s1")
    g = gateway(tmp_path / "gw", rabbit.stomp_port, True, 'dlo.> export="far"\n>\n',
                queues='dli.q import="far"\n>\n')
    got: list[Any] = []
    try:
        subscribe(g, Destination.queue("dli.q"), got)
        remote.send("/queue/dli.q", b"once")
        for _ in range(2):
            remote.send("/queue/dli.q", b"twice", **{"gw-trace-id": "trace-twice"})
        wait_for(lambda: len(got) == 2 and info(g)["far"]["duplicates"] == 1,
                 what="two imports, the second copy dropped")
        publish(g, "dlo.a", Message.text("out"))
        wait_for(lambda: remote.got, what="the export")
        wait_for(lambda: info(g)["far"]["exported"] == 1, what="the export confirmed")
        records = exported_records(g, "far")
        drop = check_duplicate_drop(records, "far", "trace-twice")
        (imported,) = [r for r in records if r["event"] == "import"
                       and r["trace_id"] == "trace-twice"]
        # the copy's own ids: the gateway's, and RabbitMQ's message-id (one per delivery)
        assert drop["msg_id"] != imported["msg_id"]
        assert imported["far_id"] != drop["far_id"] is not None
    finally:
        remote.close()
        g.stop()


def test_wildcard_imports_against_activemq(tmp_path: Path, amq: ActiveMQ) -> None:
    remote = Remote(amq.stomp_port, False)
    g = gateway(tmp_path / "gw", amq.stomp_port, False, 'w.> import="far"\n>\n',
                queues='wq.* import="far"\n>\n')
    try:
        got: list[Any] = []
        subscribe(g, Destination.topic("w.*"), got)
        assert info(g)["far"]["imports"]["w.>"] == ["w.*"]  # narrowed to the local pattern
        wait_for(after(lambda: remote.send("/topic/w.probe", b"p"), lambda: got),
                 what="the subscription")
        remote.send("/topic/w.a", b"1")
        remote.send("/topic/w.b.c", b"2")  # outside w.*: not subscribed on the far side
        wait_for(lambda: any(d.msg.body == b"1" for d in got), what="the import")
        time.sleep(0.3)
        names = {d.msg.destination.name for d in got}
        assert names == {"w.probe", "w.a"}
        remote.send("/queue/wq.a", b"qa")
        remote.send("/queue/wq.b", b"qb")
        wait_for(lambda: g.call(lambda: {"wq.a", "wq.b"} <= set(g.broker.queues)),
                 what="child queues")
        bodies = g.call(lambda: [m.body for n in ("wq.a", "wq.b")
                                 for m in g.broker.queues[n].iter_pending()])
        assert bodies == [b"qa", b"qb"]
    finally:
        remote.close()
        g.stop()


# -- spool, loops, bodies ---------------------------------------------------------------------


def proxy_api(server: FaultProxyServer, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", data=data,
                                 method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        text = r.read()
    return json.loads(text) if text else None


def test_exports_wait_in_the_spool_while_the_far_side_is_away(
        tmp_path: Path, amq: ActiveMQ) -> None:
    remote = Remote(amq.stomp_port, False)
    remote.subscribe("/topic/sp.t", "s1")
    with FaultProxyServer() as fp:
        proxy = proxy_api(fp, "POST", "/proxies", {
            "name": "amq", "listen": "127.0.0.1:0", "upstream": f"127.0.0.1:{amq.stomp_port}"})
        port = int(proxy["listen"].rsplit(":", 1)[1])
        g = gateway(tmp_path / "gw", port, False, 'sp.> export="far"\n>\n')
        try:
            publish(g, "sp.t", Message.text("first"))
            wait_for(lambda: info(g)["far"]["exported"] == 1, what="the first export")
            proxy_api(fp, "POST", "/proxies/amq", {"enabled": False})
            wait_for(lambda: info(g)["far"]["state"] != "up", what="transport down")
            publish(g, "sp.t", *(Message.text(f"m{i}") for i in range(20)))
            assert info(g)["far"]["spooled"] == 20
            time.sleep(0.5)  # several reconnect attempts fail meanwhile
            assert info(g)["far"]["spooled"] == 20
            proxy_api(fp, "POST", "/proxies/amq", {"enabled": True})
            wait_for(lambda: len(remote.got) == 21, what="the spooled exports")
            assert [f.body for f in remote.got] == [b"first"] + [f"m{i}".encode()
                                                                 for i in range(20)]
            wait_for(lambda: info(g)["far"]["spooled"] == 0, what="spool drained")
            t = info(g)["far"]
            assert t["exported"] == 21 and t["connects"] >= 2 and t["state"] == "up"
        finally:
            remote.close()
            g.stop()


@pytest.mark.parametrize("broker", ["rabbit", "amq"])
def test_two_gateways_bridged_through_one_broker_neither_loop_nor_duplicate(
        tmp_path: Path, request: pytest.FixtureRequest, broker: str) -> None:
    port, rabbit = far_side(request, broker)
    topics = f'{broker}.> import="far",export="far"\n>\n'
    g1 = gateway(tmp_path / "g1", port, rabbit, topics)
    g2 = gateway(tmp_path / "g2", port, rabbit, topics)
    try:
        got1: list[Any] = []
        got2: list[Any] = []
        dest = Destination.topic(f"{broker}.x")
        subscribe(g1, dest, got1)
        subscribe(g2, dest, got2)
        # Both far-side subscriptions exist once a probe from each side reached the other.
        wait_for(after(lambda: publish(g1, dest.name, Message.text("probe1")),
                       lambda: any(d.msg.body == "probe1" for d in got2)),
                 what="g2's subscription")
        wait_for(after(lambda: publish(g2, dest.name, Message.text("probe2")),
                       lambda: any(d.msg.body == "probe2" for d in got1)),
                 what="g1's subscription")
        time.sleep(0.5)  # the last probes arrive
        del got1[:], got2[:]
        s1, s2 = info(g1)["far"], info(g2)["far"]
        for i in range(10):
            publish(g1, dest.name, Message.text(f"from1-{i}"))
            publish(g2, dest.name, Message.text(f"from2-{i}"))
        wait_for(lambda: len(got1) == 20 and len(got2) == 20, what="both sides")
        time.sleep(0.5)  # anything looping would arrive now
        expected = sorted([f"from1-{i}" for i in range(10)] + [f"from2-{i}" for i in range(10)])
        for got in (got1, got2):
            assert sorted(d.msg.body for d in got) == expected
        for g, before in ((g1, s1), (g2, s2)):
            now = info(g)["far"]
            assert now["exported"] - before["exported"] == 10
            assert now["imported"] - before["imported"] == 10
            assert now["dropped_loop"] - before["dropped_loop"] == 10  # its own, come back
    finally:
        g1.stop()
        g2.stop()


def test_nested_map_body_round_trip(tmp_path: Path, rabbit: RabbitMQ) -> None:
    remote = Remote(rabbit.stomp_port, True)
    remote.subscribe("/topic/map.a", "s1")
    g1 = gateway(tmp_path / "g1", rabbit.stomp_port, True, 'map.> export="far"\n>\n')
    g2 = gateway(tmp_path / "g2", rabbit.stomp_port, True, 'map.> import="far"\n>\n')
    try:
        got: list[Any] = []
        subscribe(g2, Destination.topic("map.a"), got)
        body = {"name": "pump", "n": 3, "ok": True, "nested": {"list": [1, "two", {"x": 1.5}],
                                                              "empty": {}}}
        wait_for(after(lambda: publish(g1, "map.a", Message.map(body)), lambda: got),
                 what="g2's subscription")
        msg = got[0].msg
        assert msg.body_kind == BodyKind.MAP and msg.body == body
        assert msg.properties[PROP_IMPORTED] == "far"
        frame = wait_for(lambda: remote.got and remote.got[0], what="the far side's copy")
        assert frame.headers["transformation"] == "jms-map-json"
        assert json.loads(frame.body) == body
    finally:
        remote.close()
        g1.stop()
        g2.stop()


def test_an_export_the_broker_drops_the_connection_on_is_refused_not_retried_forever(
        tmp_path: Path, amq: ActiveMQ) -> None:
    """Debian's ActiveMQ closes the connection on a jms-map-json SEND (no XStream on its
    class path). After POISON_LOSSES such losses the map message is refused and the text
    message behind it goes out."""
    remote = Remote(amq.stomp_port, False)
    remote.subscribe("/topic/poison.a", "s1")
    g = gateway(tmp_path / "gw", amq.stomp_port, False, 'poison.> export="far"\n>\n')
    try:
        publish(g, "poison.a", Message.map({"k": 1}), Message.text("after"))
        wait_for(lambda: remote.got, what="the message behind it")
        assert [f.body for f in remote.got] == [b"after"]
        # Its RECEIPT may reach the gateway after the subscriber has the message.
        t = wait_for(lambda: (lambda t: t if t["exported"] == 1 else None)(info(g)["far"]),
                     what="the export confirmed")
        assert t["failed"] == 1 and t["spooled"] == 0
        assert t["connects"] == 1 + POISON_LOSSES
    finally:
        remote.close()
        g.stop()


def test_bulk_queue_import_beyond_the_prefetch_arrives_whole_and_in_order(
        tmp_path: Path, amq: ActiveMQ) -> None:
    """More messages than the subscription's prefetch: the rest only come as the ACKs go
    out, and every frame arrives whole (one receiver thread reads the socket)."""
    n = 2500
    remote = Remote(amq.stomp_port, False)
    bodies = [f"bulk-{i}-".encode() * (1 + i % 50) for i in range(n)]
    for b in bodies:
        remote.c.send_frame("SEND", {"destination": "/queue/bulk.q",
                                     "content-length": str(len(b))}, b)
    remote.sync("SEND", {"destination": "/queue/bulk.end"}, b"")
    g = gateway(tmp_path / "gw", amq.stomp_port, False, ">\n",
                queues='bulk.q import="far"\n>\n')
    try:
        wait_for(lambda: info(g)["far"]["imported"] == n, timeout=30, what="every import")
        got = g.call(lambda: [m.body for m in g.broker.queues["bulk.q"].iter_pending()])
        assert got == bodies
        assert info(g)["far"]["failed"] == 0
    finally:
        remote.close()
        g.stop()


def test_exports_in_flight_when_the_connection_drops_are_sent_again_in_order(
        tmp_path: Path, amq: ActiveMQ) -> None:
    remote = Remote(amq.stomp_port, False)
    remote.subscribe("/topic/mid.t", "s1")
    n = 300
    with FaultProxyServer() as fp:
        proxy = proxy_api(fp, "POST", "/proxies", {
            "name": "amq", "listen": "127.0.0.1:0", "upstream": f"127.0.0.1:{amq.stomp_port}"})
        port = int(proxy["listen"].rsplit(":", 1)[1])
        g = gateway(tmp_path / "gw", port, False, 'mid.> export="far"\n>\n')
        try:
            # About 100 SENDs a second through the proxy, so the drop comes mid-stream.
            proxy_api(fp, "POST", "/proxies/amq/toxics", {
                "type": "bandwidth", "stream": "upstream", "attributes": {"rate": 40}})
            publish(g, "mid.t", *(Message.text(f"m{i}") for i in range(n)))
            wait_for(lambda: info(g)["far"]["exported"] >= 20, what="some exports")
            proxy_api(fp, "POST", "/proxies/amq", {"enabled": False})
            wait_for(lambda: info(g)["far"]["state"] != "up", what="transport down")
            assert 0 < info(g)["far"]["exported"] < n
            proxy_api(fp, "DELETE", "/proxies/amq/toxics/bandwidth_upstream")
            proxy_api(fp, "POST", "/proxies/amq", {"enabled": True})
            wait_for(lambda: info(g)["far"]["spooled"] == 0, timeout=20, what="spool drained")
            expected = [f"m{i}".encode() for i in range(n)]
            wait_for(lambda: {f.body for f in remote.got} == set(expected),
                     what="every message at least once")
            first_seen = list(dict.fromkeys(f.body for f in remote.got))
            assert first_seen == expected
            assert info(g)["far"]["exported"] == n
        finally:
            remote.close()
            g.stop()


def test_a_far_side_gone_silent_is_found_by_heart_beats(tmp_path: Path, amq: ActiveMQ) -> None:
    with FaultProxyServer() as fp:
        proxy = proxy_api(fp, "POST", "/proxies", {
            "name": "amq", "listen": "127.0.0.1:0", "upstream": f"127.0.0.1:{amq.stomp_port}"})
        port = int(proxy["listen"].rsplit(":", 1)[1])
        g = gateway(tmp_path / "gw", port, False, 'hb.> export="far"\n>\n',
                    heartbeat="200,200")
        try:
            time.sleep(1.0)  # heart-beats flow: the connection stays up
            assert info(g)["far"]["connects"] == 1 and info(g)["far"]["state"] == "up"
            proxy_api(fp, "POST", "/proxies/amq/toxics", {
                "type": "timeout", "stream": "downstream", "attributes": {"timeout": 0}})
            wait_for(lambda: info(g)["far"]["state"] != "up", what="the heart-beat timeout")
            assert "heart-beat timeout" in info(g)["far"]["last_error"]
            proxy_api(fp, "DELETE", "/proxies/amq/toxics/timeout_downstream")
            wait_for(lambda: info(g)["far"]["state"] == "up", what="reconnected")
            assert info(g)["far"]["connects"] >= 2
        finally:
            g.stop()


def test_stomps_to_another_gateway(tmp_path: Path) -> None:
    from test_mqtt_tls_and_cli import make_cert

    cert, key = make_cert(tmp_path)
    far = GatewayThread(tmp_path / "far", gateway=(
        f"listen = stomps://127.0.0.1:0\nlisten = http://127.0.0.1:0\n"
        f"tls_cert = {cert}\ntls_key = {key}\n")).start()
    got: list[Any] = []
    subscribe(far, Destination.topic("tls.a"), got)
    g = GatewayThread(
        tmp_path / "gw", gateway="listen = http://127.0.0.1:0\nstomp_transports = enabled\n",
        transports=(f"[far]\ntype = stomp\nurl = stomps://127.0.0.1:{far.port('stomps')}\n"
                    f"tls_ca = {cert}\nreconnect_min = 100msec\nreconnect_max = 500msec\n"),
        topics='tls.> export="far"\n>\n').start()
    try:
        wait_for(lambda: info(g)["far"]["state"] == "up", what="transport up over TLS")
        publish(g, "tls.a", Message.text("over tls", properties={"n": Int16(3)}))
        wait_for(lambda: got, what="the export over TLS")
        msg = got[0].msg
        assert msg.body == "over tls" and msg.properties["n"] == 3
        assert type(msg.properties["n"]) is Int16
        wait_for(lambda: info(g)["far"]["exported"] == 1, what="the RECEIPT over TLS")
    finally:
        g.stop()
        far.stop()


# -- temporary reply-to across the bridge -----------------------------------------------------
# EMS User's Guide, chapter "Working With TIBCO Rendezvous", "Export Issues".


def transport(g: GatewayThread) -> Any:
    """The transport object itself (for what the admin API does not show)."""
    assert g.gateway is not None
    return g.gateway.transports.transports["far"]


def ask(g: GatewayThread, topic: str, replies: list[Any]) -> tuple[Any, str]:
    """An in-process requester: a temporary queue and a request naming it as JMSReplyTo.
    Returns its core connection (closing it deletes the queue) and the queue's name."""

    def run() -> tuple[Any, str]:
        conn = g.broker.connect()
        s = conn.session()
        temp = conn.temporary_queue()
        s.consumer(temp, listener=replies.append)
        s.producer(Destination.topic(topic)).send(
            Message.text("ping", reply_to=temp, correlation_id="c-1"))
        return conn, temp.name

    result: tuple[Any, str] = g.call(run)
    return result


def reply_bindings(rabbit: RabbitMQ) -> list[str]:
    out = rabbit.ctl("list_bindings", "routing_key", "--no-table-headers").stdout
    return [line.strip() for line in out.splitlines() if line.strip().startswith("gw-reply.")]


@pytest.mark.parametrize("broker", ["rabbit", "amq"])
def test_a_temporary_reply_to_is_answered_across_the_bridge(
        tmp_path: Path, request: pytest.FixtureRequest, broker: str) -> None:
    port, rabbit = far_side(request, broker)
    responder = Remote(port, rabbit)
    responder.subscribe(f"/topic/svc{broker}.echo", "s1")
    g = gateway(tmp_path / "gw", port, rabbit, f'svc{broker}.> export="far"\n>\n')
    try:
        replies: list[Any] = []
        requester, temp_name = ask(g, f"svc{broker}.echo", replies)
        wait_for(lambda: responder.got, what="the request")
        h = responder.got[0].headers
        rt = h["reply-to"]
        assert rt == f"/topic/gw-reply.{g.broker.id}.q{temp_name.rsplit('.', 1)[-1]}"
        assert h["correlation-id"] == "c-1"
        if rabbit:  # the far-side subscription is there (an exclusive queue bound to rt)
            assert reply_bindings(request.getfixturevalue("rabbit")) == [rt[len("/topic/"):]]
        responder.send(rt, b"pong", **{"correlation-id": h["correlation-id"]})
        wait_for(lambda: replies, what="the reply")
        reply = replies[0].msg
        assert reply.body == b"pong" and reply.correlation_id == "c-1"
        assert reply.destination == Destination.queue(temp_name)
        assert reply.properties[PROP_IMPORTED] == "far"
        t = transport(g)
        assert g.call(lambda: t.replies.names) == [rt]

        # The temporary queue goes with its connection: the route goes too, and with it the
        # far-side subscription (within the sweep), so a late reply is not imported.
        g.call(requester.close)
        wait_for(lambda: g.call(lambda: not t.replies.names and (rt, None) not in t.subs),
                 timeout=20, what="the route dropped")
        if rabbit:
            wait_for(lambda: not reply_bindings(request.getfixturevalue("rabbit")),
                     what="the far-side subscription gone")
        imported = info(g)["far"]["imported"]
        responder.send(rt, b"late")
        time.sleep(0.5)
        assert info(g)["far"]["imported"] == imported
        assert len(replies) == 1
    finally:
        responder.close()
        g.stop()


def test_a_reply_route_is_subscribed_again_after_a_reconnect(tmp_path: Path, amq: ActiveMQ) -> None:
    responder = Remote(amq.stomp_port, False)
    responder.subscribe("/topic/svcre.echo", "s1")
    with FaultProxyServer() as fp:
        proxy = proxy_api(fp, "POST", "/proxies", {
            "name": "amq", "listen": "127.0.0.1:0", "upstream": f"127.0.0.1:{amq.stomp_port}"})
        port = int(proxy["listen"].rsplit(":", 1)[1])
        g = gateway(tmp_path / "gw", port, False, 'svcre.> export="far"\n>\n')
        try:
            replies: list[Any] = []
            ask(g, "svcre.echo", replies)
            wait_for(lambda: responder.got, what="the request")
            rt = responder.got[0].headers["reply-to"]
            proxy_api(fp, "POST", "/proxies/amq", {"enabled": False})
            wait_for(lambda: info(g)["far"]["state"] != "up", what="transport down")
            proxy_api(fp, "POST", "/proxies/amq", {"enabled": True})
            wait_for(lambda: info(g)["far"]["state"] == "up", what="reconnected")
            # The SUBSCRIBE after the reconnect is asynchronous: reply until one comes back.
            wait_for(after(lambda: responder.send(rt, b"pong"), lambda: replies),
                     what="the reply")
            assert replies[0].msg.body == b"pong"
            assert info(g)["far"]["connects"] >= 2
        finally:
            responder.close()
            g.stop()


# -- durable far-side subscriptions for topic imports ----------------------------------------


def far_gateway(tmp: Path) -> GatewayThread:
    """Another gateway as the far side, its STOMP adapter on a free port."""
    return GatewayThread(tmp, gateway="listen = stomp://127.0.0.1:0\n"
                                      "listen = http://127.0.0.1:0\n").start()


def proxied(fp: FaultProxyServer, port: int) -> int:
    proxy = proxy_api(fp, "POST", "/proxies", {
        "name": "far", "listen": "127.0.0.1:0", "upstream": f"127.0.0.1:{port}"})
    return int(proxy["listen"].rsplit(":", 1)[1])


def far_port(request: pytest.FixtureRequest, broker: str, tmp: Path) -> tuple[int, bool, Any]:
    """(STOMP port, RabbitMQ?, a far gateway to stop or None)."""
    if broker == "gw":
        far = far_gateway(tmp / "far")
        return far.port("stomp"), False, far
    port, rabbit = far_side(request, broker)
    return port, rabbit, None


@pytest.mark.parametrize("durable", ["true", "false"])
@pytest.mark.parametrize("broker", ["rabbit", "amq", "gw"])
def test_a_durable_topic_import_gets_what_was_published_while_disconnected(
        tmp_path: Path, request: pytest.FixtureRequest, broker: str, durable: str) -> None:
    port, rabbit, far = far_port(request, broker, tmp_path)
    topic = f"dur{broker}{durable}.a"
    remote = Remote(port, rabbit)
    with FaultProxyServer() as fp:
        g = gateway(tmp_path / "gw", proxied(fp, port), rabbit,
                    f'dur{broker}{durable}.> import="far"\n>\n', durable_subscriptions=durable,
                    client_id=f"gw-test-{broker}")
        try:
            got: list[Any] = []
            consumer = subscribe(g, Destination.topic(topic), got)
            wait_for(after(lambda: remote.send(f"/topic/{topic}", b"probe"), lambda: got),
                     what="the subscription")
            time.sleep(0.3)
            proxy_api(fp, "POST", "/proxies/far", {"enabled": False})
            wait_for(lambda: info(g)["far"]["state"] != "up", what="transport down")
            del got[:]
            for i in range(5):
                remote.send(f"/topic/{topic}", f"while-down-{i}".encode(), persistent="true")
            proxy_api(fp, "POST", "/proxies/far", {"enabled": True})
            wait_for(lambda: info(g)["far"]["state"] == "up", what="reconnected")
            wait_for(after(lambda: remote.send(f"/topic/{topic}", b"after"),
                           lambda: any(d.msg.body == b"after" for d in got)),
                     what="the subscription again")
            bodies = [d.msg.body for d in got if d.msg.body not in (b"after", b"probe")]
            if durable == "true":
                assert bodies == [f"while-down-{i}".encode() for i in range(5)]
            else:  # nobody held them on the far side
                assert bodies == []

            # The last local subscription going removes the far-side durable subscription:
            # what is published after it is not kept for the gateway.
            g.call(consumer.close)
            time.sleep(0.5)  # the UNSUBSCRIBE is asynchronous
            remote.send(f"/topic/{topic}", b"nobody's")
            del got[:]
            subscribe(g, Destination.topic(topic), got)
            wait_for(after(lambda: remote.send(f"/topic/{topic}", b"probe2"), lambda: got),
                     what="the new subscription")
            assert all(d.msg.body != b"nobody's" for d in got)
            t = info(g)["far"]
            assert t["connects"] == 2 and t["state"] == "up"  # no ERROR closed the connection
        finally:
            remote.close()
            g.stop()
            if far is not None:
                far.stop()


@pytest.mark.parametrize("broker", ["rabbit", "amq", "gw"])
def test_a_durable_subscription_whose_import_ended_while_disconnected_is_removed(
        tmp_path: Path, request: pytest.FixtureRequest, broker: str) -> None:
    port, rabbit, far = far_port(request, broker, tmp_path)
    topic = f"orph{broker}.a"
    remote = Remote(port, rabbit)
    with FaultProxyServer() as fp:
        g = gateway(tmp_path / "gw", proxied(fp, port), rabbit, f'orph{broker}.> import="far"\n>\n',
                    durable_subscriptions="true", client_id=f"gw-orph-{broker}")
        try:
            got: list[Any] = []
            consumer = subscribe(g, Destination.topic(topic), got)
            wait_for(after(lambda: remote.send(f"/topic/{topic}", b"probe"), lambda: got),
                     what="the subscription")
            proxy_api(fp, "POST", "/proxies/far", {"enabled": False})
            wait_for(lambda: info(g)["far"]["state"] != "up", what="transport down")
            g.call(consumer.close)  # the import ends while the far side cannot hear of it
            remote.send(f"/topic/{topic}", b"kept-for-nobody", persistent="true")
            proxy_api(fp, "POST", "/proxies/far", {"enabled": True})
            wait_for(lambda: info(g)["far"]["state"] == "up", what="reconnected")
            t = transport(g)
            wait_for(lambda: g.call(lambda: not t.durables), what="the orphan removed")
            time.sleep(0.5)  # the removal is asynchronous
            del got[:]
            subscribe(g, Destination.topic(topic), got)
            wait_for(after(lambda: remote.send(f"/topic/{topic}", b"probe2"), lambda: got),
                     what="a new subscription")
            time.sleep(0.3)
            assert all(d.msg.body != b"kept-for-nobody" for d in got)
            assert info(g)["far"]["connects"] == 2
        finally:
            remote.close()
            g.stop()
            if far is not None:
                far.stop()
