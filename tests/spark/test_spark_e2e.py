"""Reconciliation end to end: real traffic through two running gateways, faults planted on
purpose, and ``gateway reconcile`` must name exactly the messages they hit.

The path: a paho publisher sends to the MQTT listener of ``gw-edge`` (a ``gateway serve``
process), which exports through two mqtt transports to mosquitto, each link through the fault
proxy of tests/faultproxy.py: ``cloud5`` (MQTT 5, QoS 1: the trace id rides along) and
``cloud3`` (MQTT 3.1.1, QoS 0: no trace id, so the reconciliation links the hop by its
fallback key). ``gw-core`` (a gateway in this process) imports both into queues, where a
python-qpid-proton receiver takes them over AMQP; at the end a second paho publisher sends to
``gw-core`` directly (MQTT in, AMQP out through one gateway). Every gateway writes its
delivery log into its own directory under the test's tmp dir.

The faults, each made so that the test knows which message it hit:

- *loss in transit*: the ``cloud3`` link blackholes what ``gw-edge`` sends, two messages are
  written into it (``gw-edge`` counts them exported, QoS 0), and the link is cut before the
  blackhole goes: nothing resends a QoS 0 message;
- *a duplicate*: the ``cloud5`` link blackholes mosquitto's PUBACKs, one message goes out and
  reaches the receiver, the link is cut; after reconnecting ``gw-edge`` sends it again (QoS 1,
  unconfirmed), mosquitto forwards the second copy and ``gw-core`` drops it by its trace id;
- *a crash*: three messages accepted by ``gw-edge`` (PUBACK) are handed to ``cloud5`` and
  written into a blackhole (in flight, unconfirmed), the link goes down, two more accepted
  wait in the export spool, and ``gw-edge`` is killed with SIGKILL.

The reconciliation then runs once, over both logs, on the session of tests/spark/conftest.py
(``spark.cli.main`` with ``--json``, as ``gateway reconcile`` runs it), with a grace period
that the last traffic, sent after it passed, puts the crash behind the watermark of. The
non-delivered verdicts must be exactly ``lost_in_transit`` for the two, ``dropped``
(reason ``duplicate``) for the copy and ``lost`` for the five, every other route of every
message ``delivered``, and each message one trace across both gateways.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gw as gwmod
import paho.mqtt.client as paho
import pytest
from adminapi import admin_get
from corehelp import write_config
from faultproxy import toxiproxy_fixture  # noqa: F401
from gw import GatewayThread
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from peers.mosquitto import Mosquitto, start_mosquitto
from proton.utils import BlockingConnection, BlockingReceiver
from pyspark.sql import SparkSession
from serveproc import ServeProcess

from spark.cli import main as reconcile_main

pytestmark = [pytest.mark.spark, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

ROOT = Path(__file__).resolve().parents[2]
GRACE_MS = 1500.0  # the crash's messages must be older than this when the last traffic runs
LINK_WINDOW_MS = 30_000.0  # the 3.1.1 hop: one body per message, so a wide window is safe
TIMEOUT = 30.0  # bound on every wait for a positive result (never a result by itself)


def wait_for(cond: Callable[[], Any], what: str, timeout: float = TIMEOUT) -> Any:
    return gwmod.wait_for(cond, timeout, what)


def body_hash(body: bytes) -> str:
    """The delivery log's ``body_hash`` of a bytes body (docs/delivery-log.md, "Hashes")."""
    return hashlib.blake2b(body, digest_size=8).hexdigest()


# --- the pieces -------------------------------------------------------------------------------


def transports(name: str, port: int, version: str, qos: int, client_id: str) -> str:
    return (f"[{name}]\ntype = mqtt\nurl = mqtt://127.0.0.1:{port}\n"
            f"protocol_version = {version}\nqos = {qos}\nclient_id = {client_id}\n"
            "reconnect_min = 100msec\nreconnect_max = 300msec\n")


def in_flight_of(http_port: int, durable: str) -> int:
    """How many messages of durable subscription ``durable`` are out unacknowledged."""
    rows = admin_get(http_port, "/api/v1/durables", timeout=5)
    return next(int(d["in_flight"]) for d in rows if d["name"] == durable)


def transport_info(http_port: int) -> dict[str, Any]:
    return {t["name"]: t for t in admin_get(http_port, "/api/v1/transports", timeout=5)}


class Publisher:
    """A paho publisher; ``send`` returns once the gateway accepted the message (PUBACK)."""

    def __init__(self, port: int, client_id: str, v5: bool = True) -> None:
        self.c = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                             protocol=MQTTProtocolVersion.MQTTv5 if v5 else
                             MQTTProtocolVersion.MQTTv311)
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()

    def send(self, topic: str, *bodies: bytes) -> None:
        for body in bodies:
            info = self.c.publish(topic, body, qos=1)
            info.wait_for_publish(TIMEOUT)
            assert info.is_published(), f"{body!r} not accepted"

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()
        self.c.reinitialise()  # releases paho's wake-up socket pair


class Receiver:
    """python-qpid-proton receivers on ``gw-core``; every message taken is accepted."""

    def __init__(self, port: int, addresses: list[str]) -> None:
        self.conn = BlockingConnection(f"amqp://127.0.0.1:{port}", timeout=TIMEOUT)
        self.links: dict[str, BlockingReceiver] = {
            a: self.conn.create_receiver(a, credit=100, name=a) for a in addresses}
        self.got: dict[str, list[bytes]] = {a: [] for a in addresses}

    def expect(self, address: str, *bodies: bytes) -> None:
        """Take messages from ``address`` until every one of ``bodies`` came."""
        link = self.links[address]
        got = self.got[address]
        deadline = time.monotonic() + TIMEOUT
        while not set(bodies) <= set(got):
            left = deadline - time.monotonic()
            assert left > 0, f"{address}: waited for {bodies}, got {got}"
            with contextlib.suppress(Exception):  # proton's Timeout: try again until the end
                m = link.receive(timeout=min(left, 1.0))
                link.accept()
                got.append(bytes(m.body) if not isinstance(m.body, str) else m.body.encode())

    def close(self) -> None:
        self.conn.close()


def dlog_records(directory: Path) -> list[dict[str, Any]]:
    """Every complete record of a delivery log directory."""
    out = []
    for path in sorted(directory.glob("dlog-*.jsonl")):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):  # a line cut short by the crash
                out.append(json.loads(line))
    return out


def logged(directory: Path, event: str, sent: list[bytes]) -> bool:
    """Whether the log under ``directory`` has an ``event`` record of each of ``sent``."""
    hashes = {r["body_hash"] for r in dlog_records(directory) if r["event"] == event}
    return {body_hash(b) for b in sent} <= hashes


def bodies(prefix: str, start: int, stop: int) -> list[bytes]:
    return [f"{prefix}-{i:03d}".encode() for i in range(start, stop)]


# --- the test ---------------------------------------------------------------------------------


@pytest.fixture
def mosq(tmp_path: Path) -> Iterator[Mosquitto]:
    # log_type subscribe: the test waits for gw-core's far-side subscriptions in its log
    with start_mosquitto(tmp_path / "mosquitto", extra_config=["log_type subscribe"]) as m:
        yield m


# The traffic takes seconds; the Spark run some thirty jobs: under a minute on a quiet
# machine, several on a loaded one. A bound against a hang, never a result.
@pytest.mark.timeout(600)
def test_reconcile_names_exactly_the_dropped_duplicated_and_crashed_messages(
        tmp_path: Path, spark: SparkSession, mosq: Mosquitto, toxiproxy: Any,
        capsys: pytest.CaptureFixture[str]) -> None:
    dlogs = tmp_path / "dlog"
    p5 = toxiproxy.create(upstream=f"127.0.0.1:{mosq.port}", name="cloud5", listen="127.0.0.1:0")
    p3 = toxiproxy.create(upstream=f"127.0.0.1:{mosq.port}", name="cloud3", listen="127.0.0.1:0")

    def listen_port(proxy: Any) -> int:
        return int(proxy.listen.rsplit(":", 1)[1])

    # gw-core: imports both far topics into queues; MQTT, AMQP and HTTP listeners
    core = GatewayThread(
        tmp_path / "core", uvloop=True,
        gateway=("server = gw-core\nlisten = mqtt://127.0.0.1:0\nlisten = amqp://127.0.0.1:0\n"
                 "listen = http://127.0.0.1:0\nmqtt_transports = enabled\n"
                 f"delivery_log_dir = {dlogs / 'gw-core'}\n"),
        transports=(transports("cloud5", mosq.port, "5", 1, "gw-core-cloud5")
                    + transports("cloud3", mosq.port, "3.1.1", 1, "gw-core-cloud3")),
        queues='e2e.a import="cloud5"\ne2e.b import="cloud3"\n>\n', topics=">\n").start()
    edge_dir = write_config(
        tmp_path / "edge",
        gateway=("server = gw-edge\nlisten = mqtt://127.0.0.1:0\nlisten = http://127.0.0.1:0\n"
                 "mqtt_transports = enabled\n"
                 f"delivery_log_dir = {dlogs / 'gw-edge'}\n"),
        transports=(transports("cloud5", listen_port(p5), "5", 1, "gw-edge-cloud5")
                    + transports("cloud3", listen_port(p3), "3.1.1", 0, "gw-edge-cloud3")),
        topics='e2e.a export="cloud5"\ne2e.b export="cloud3"\n>\n')
    edge: ServeProcess | None = None
    closers: list[Callable[[], None]] = []
    try:
        edge = ServeProcess(edge_dir)
        edge_http = edge.port("http")

        def edge_t(name: str) -> dict[str, Any]:
            return transport_info(edge_http)[name]

        def core_t(name: str) -> dict[str, Any]:
            return transport_info(core.port("http"))[name]

        wait_for(lambda: all(edge_t(n)["state"] == "up" for n in ("cloud5", "cloud3"))
                 and all(core_t(n)["state"] == "up" for n in ("cloud5", "cloud3")),
                 "every transport up")
        wait_for(lambda: all(s in mosq.log_path.read_text() for s in (
            "gw-core-cloud5 1 e2e/a", "gw-core-cloud3 1 e2e/b")),
            "gw-core's far-side subscriptions")
        receiver = Receiver(core.port("amqp"), ["queue://e2e.a", "queue://e2e.b",
                                                "topic://e2e.c"])
        closers.append(receiver.close)
        pub = Publisher(edge.port("mqtt"), "sensor-1")
        closers.append(pub.close)

        # clean traffic on both links
        pub.send("e2e/a", *bodies("a", 0, 5))
        pub.send("e2e/b", *bodies("b", 0, 5))
        receiver.expect("queue://e2e.a", *bodies("a", 0, 5))
        receiver.expect("queue://e2e.b", *bodies("b", 0, 5))
        wait_for(lambda: edge_t("cloud5")["exported"] == 5 and edge_t("cloud3")["exported"] == 5,
                 "the clean exports counted")

        # loss in transit: two QoS 0 exports written into a blackhole, then the link cut
        lost_in_transit = bodies("b", 5, 7)
        connects = edge_t("cloud3")["connects"]
        p3.add_toxic(name="blackhole", type="timeout", stream="upstream",
                     attributes={"timeout": 0})
        pub.send("e2e/b", *lost_in_transit)
        wait_for(lambda: edge_t("cloud3")["exported"] == 7, "the two written (QoS 0)")
        p3.disable()  # closes the connection: what the blackhole held is gone with it
        p3.destroy_toxic("blackhole")
        p3.enable()
        wait_for(lambda: edge_t("cloud3")["state"] == "up"
                 and edge_t("cloud3")["connects"] > connects, "cloud3 reconnected")
        pub.send("e2e/b", *bodies("b", 7, 10))
        receiver.expect("queue://e2e.b", *bodies("b", 7, 10))

        # a duplicate: the PUBACK of one QoS 1 export lost, the link cut, the export resent
        duplicated = b"a-005"
        connects = edge_t("cloud5")["connects"]
        p5.add_toxic(name="no_puback", type="timeout", stream="downstream",
                     attributes={"timeout": 0})
        pub.send("e2e/a", duplicated)
        receiver.expect("queue://e2e.a", duplicated)
        assert edge_t("cloud5")["exported"] == 5  # its PUBACK never came
        p5.disable()
        p5.destroy_toxic("no_puback")
        p5.enable()
        wait_for(lambda: core_t("cloud5")["duplicates"] == 1 and
                 edge_t("cloud5")["exported"] == 6, "the resend, dropped by gw-core")
        assert edge_t("cloud5")["connects"] > connects
        pub.send("e2e/a", *bodies("a", 6, 10))
        receiver.expect("queue://e2e.a", *bodies("a", 6, 10))

        # a crash: three messages handed to cloud5 and written into a blackhole (unconfirmed,
        # in flight), two more spooled once the link is down, then SIGKILL
        in_flight, spooled = bodies("a", 10, 13), bodies("a", 13, 15)
        p5.add_toxic(name="blackhole", type="timeout", stream="upstream",
                     attributes={"timeout": 0})
        pub.send("e2e/a", *in_flight)
        # handed to cloud5 (in flight in its export spool; the hand-off writes no record:
        # docs/delivery-log.md, "Events") once every earlier export is confirmed, and their
        # publish records written (the log trails the gateway by its flush interval)
        wait_for(lambda: edge_t("cloud5")["exported"] == 10
                 and in_flight_of(edge_http, "export:e2e.a") == 3
                 and logged(dlogs / "gw-edge", "publish", in_flight),
                 "the three handed to cloud5, and their publish records")
        p5.disable()
        wait_for(lambda: edge_t("cloud5")["state"] != "up", "cloud5 down")
        pub.send("e2e/a", *spooled)
        pub.close()
        closers.remove(pub.close)
        # the log trails the gateway by its flush interval: a record it never wrote is no
        # message the reconciliation could know of
        wait_for(lambda: logged(dlogs / "gw-edge", "publish", spooled),
                 "gw-edge's publish records of the two")
        assert edge_t("cloud5")["exported"] == 10
        edge.kill()
        killed_ms = time.time() * 1000
        assert edge.proc.returncode == -signal.SIGKILL

        # MQTT in, AMQP out through gw-core alone, once the crash is older than the grace
        wait_for(lambda: time.time() * 1000 > killed_ms + GRACE_MS + 200,
                 "the grace period to pass", timeout=GRACE_MS / 1000 + 5)
        direct = bodies("c", 0, 5)
        pub3 = Publisher(core.port("mqtt"), "sensor-2", v5=False)
        closers.append(pub3.close)
        pub3.send("e2e/c", *direct)
        receiver.expect("topic://e2e.c", *direct)
        for close in reversed(closers):
            close()
        closers.clear()
        core.stop()

        # nothing the test did not plant reached the receiver
        got = receiver.got
        assert sorted(got["queue://e2e.a"]) == bodies("a", 0, 10)
        assert sorted(got["queue://e2e.b"]) == bodies("b", 0, 5) + bodies("b", 7, 10)
        assert sorted(got["topic://e2e.c"]) == direct

        # the reconciliation, as `gateway reconcile --json` runs it
        out = tmp_path / "reconciled"
        capsys.readouterr()
        status = reconcile_main([
            str(dlogs / "gw-edge"), str(dlogs / "gw-core"), "--out", str(out), "--json",
            "--grace-ms", str(GRACE_MS), "--link-window-ms", str(LINK_WINDOW_MS),
            "--no-progress", "--no-report"])
        printed = capsys.readouterr().out
        assert status == 0, printed
        result = json.loads(printed)
        rows = spark.read.parquet(str(out / "verdicts")).collect()
    finally:
        for close in reversed(closers):
            with contextlib.suppress(Exception):
                close()
        if edge is not None:
            edge.kill()
        core.stop()

    # each verdict row's message, by the body of its trace's entry
    sent = bodies("a", 0, 15) + bodies("b", 0, 10) + direct
    by_hash = {body_hash(b): b.decode() for b in sent}
    records = dlog_records(dlogs / "gw-edge") + dlog_records(dlogs / "gw-core")
    by_trace = {r["trace_id"]: by_hash.get(r["body_hash"], "?") for r in records
                if r["event"] in ("publish", "import") and r["trace_id"]}
    # a gateway's id is its server name and an instance suffix: name it by its log's directory
    names = {r["gw"]: name for name in ("gw-edge", "gw-core")
             for r in dlog_records(dlogs / name)}
    verdicts = [(by_trace.get(r.trace_id, "?"), r.verdict, names.get(r.gw, r.gw), r.reason)
                for r in rows]
    traces: dict[str, set[str]] = {}
    for r in rows:
        traces.setdefault(by_trace.get(r.trace_id, "?"), set()).add(r.trace_id)
    # every message is one trace on both gateways: carried over MQTT 5, linked over 3.1.1
    assert sorted(traces) == sorted(b.decode() for b in sent)
    assert all(len(t) == 1 for t in traces.values()), traces

    planted = {
        ("b-005", "lost_in_transit", "gw-edge", None),
        ("b-006", "lost_in_transit", "gw-edge", None),
        ("a-005", "dropped", "gw-core", "duplicate"),
        *((b.decode(), "lost", "gw-edge", None) for b in in_flight + spooled),
    }
    not_delivered = [v for v in verdicts if v[1] != "delivered"]
    assert sorted(not_delivered) == sorted(planted), sorted(verdicts)

    # delivered: every other route of every message, once. gw-edge exported a-000..a-009 and
    # b-000..b-009 (the two lost in transit left gw-edge all the same); gw-core delivered the
    # a and b messages that arrived and the direct ones.
    arrived = bodies("a", 0, 10) + bodies("b", 0, 5) + bodies("b", 7, 10)
    expected_delivered = sorted(
        [(b.decode(), "gw-edge") for b in bodies("a", 0, 10) + bodies("b", 0, 10)]
        + [(b.decode(), "gw-core") for b in arrived + direct])
    delivered = sorted((v[0], v[2]) for v in verdicts if v[1] == "delivered")
    assert delivered == expected_delivered
    assert result["verdicts"] == {"delivered": len(expected_delivered), "dropped": 1,
                                  "lost": 5, "lost_in_transit": 2}
