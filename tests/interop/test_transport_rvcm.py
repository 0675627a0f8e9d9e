"""The rv transport with certified delivery (``cm_name``): certified RV senders and listeners
of the bus's own API (CmTransport) and clients of the gateway, over loopback multicast; the
gateway killed with SIGKILL mid-stream and restarted (TIBCO EMS User's Guide, "Configuring
Transports for Rendezvous Certified Messaging"; TIBCO Rendezvous Concepts, Certified
Message Delivery)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import proton
import pytest
from adminapi import admin_get
from amqpclient import connect as amqp_connect
from gw import wait_for
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from test_transport_rv import Bus, GatewayThread, MqttClient, gateway, info
from transportlog import log_records

from transports.rv import Listener, Message
from transports.rv.cmtransport import CmListener, CmTransport

ROOT = Path(__file__).resolve().parents[2]
SUBJECT = "orders.new"

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def bus() -> Iterator[Bus]:
    b = Bus()
    yield b
    b.close()


@pytest.fixture
def start_gw(tmp_path: Path, bus: Bus) -> Iterator[Any]:
    """Start gateways on the test's bus (as test_transport_rv.py's ``gateway``), each waited
    for until its transport is up, and stopped after the test."""
    started: list[GatewayThread] = []

    def start(topics: str, **kw: Any) -> GatewayThread:
        g = gateway(tmp_path / f"gw{len(started)}", bus, topics, **kw)
        started.append(g)
        wait_for(lambda: info(g)["state"] == "up", what="transport up")
        return g

    yield start
    for g in reversed(started):
        g.stop()


def registered(cm: CmTransport, listener: str, subject: str = SUBJECT) -> bool:
    return bool(cm._run(lambda: listener in cm.core.registered(subject)))


def warm_up(sender: CmTransport, subject: str = SUBJECT) -> None:
    """Send ``{n=0}`` on ``subject`` until the gateway (GW) registered for it: the message
    it discovers the sender by, and a few more while the registration goes round."""
    wait_for(lambda: (sender.send(Message(subject).add("n", 0)),
                      registered(sender, "GW", subject))[1], timeout=60,
             what=f"the gateway's registration on {subject}")


def test_certified_imports_are_confirmed_once_stored_and_carry_their_label(
        start_gw, bus, tmp_path):
    g = start_gw(">\n", listen=("stomp",), queues='orders.> import="bus"\n>\n',
                      transport="queue_import_dm = PERSISTENT\ncm_name = GW\n"
                                f"ledger_file = {tmp_path / 'gw.ledger'}\n")
    sender = CmTransport(bus.t, "SENDER", ledger_file=tmp_path / "sender.ledger",
                         request_interval=0.2)
    try:
        warm_up(sender)
        for n in range(1, 21):
            sender.send(Message(SUBJECT).add("n", n))
        wait_for(lambda: sender.stored_count() == 0, timeout=30, what="every confirmation")
        queue = g.call(lambda: [m for m in g.broker.queues[SUBJECT].iter_pending()])
        # (the warm-ups, n = 0, are sent until the registration is in: some are certified)
        certified = [m for m in queue
                     if m.properties.get("JMS_GW_CM_SEQUENCE") and m.body["n"] > 0]
        assert [m.body["n"] for m in certified] == list(range(1, 21))
        first_seq = certified[0].properties["JMS_GW_CM_SEQUENCE"]
        assert [m.properties["JMS_GW_CM_SEQUENCE"] for m in certified] == list(
            range(first_seq, first_seq + 20))
        assert {m.properties["JMS_GW_CM_PUBLISHER"] for m in certified} == {"SENDER"}
        assert all(m.delivery_mode == 2 for m in certified)  # PERSISTENT: stored
        imports = [r["far_id"] for r in log_records(g) if r["event"] == "import"
                   and (r.get("far_id") or "").startswith("SENDER#")]
        assert imports[-20:] == [f"SENDER#{s}" for s in range(first_seq, first_seq + 20)]
        positions = g.call(lambda: dict(g.broker.kv.get("rvcm:bus", {})))
        assert positions == {} or all(int(v) <= first_seq + 19 for v in positions.values())
    finally:
        sender.close()


def test_certified_export_leaves_the_spool_when_the_anticipated_listener_confirms(
        start_gw, bus, tmp_path):
    g = start_gw('orders.> export="bus"\n>\n',
                      transport="cm_name = GW\ncm_listener = DB orders.new\n"
                                f"ledger_file = {tmp_path / 'gw.ledger'}\n")
    mq = MqttClient(g.port("mqtt"))
    try:
        for n in range(3):
            mq.c.publish("orders/new", json.dumps({"n": n}), qos=1).wait_for_publish(10)
        wait_for(lambda: g.call(lambda: len(bridge(g).cm_exports)) == 3,
                 what="three exports kept for DB")
        assert info(g)["exported"] == 0
        seqs: list[int] = []
        db = CmTransport(bus.t, "DB", require_old=True, request_interval=0.2)
        db.listen("orders.>", lambda m, _: seqs.append(m.cm.sequence if m.cm else -1),
                  bus.queue)
        wait_for(lambda: info(g)["exported"] == 3, timeout=30, what="the exports done")
        assert g.call(lambda: len(bridge(g).cm_exports)) == 0
        assert [s for s in seqs if s > 0] == [1, 2, 3]
        exports = [r for r in log_records(g) if r["event"] == "export"]
        assert [r["far_id"] for r in exports] == ["GW#1", "GW#2", "GW#3"]
        db.close()
    finally:
        mq.close()


def test_a_certified_export_past_its_time_limit_fails(start_gw, bus, tmp_path):
    g = start_gw('orders.> export="bus"\n>\n',
                      transport="cm_name = GW\ncm_listener = NOBODY orders.new\n"
                                "default_ttl = 500 msec\n")
    mq = MqttClient(g.port("mqtt"))
    try:
        mq.c.publish("orders/new", json.dumps({"n": 1}), qos=1).wait_for_publish(10)
        wait_for(lambda: info(g)["failed"] == 1, timeout=30, what="the export failed")
        assert info(g)["exported"] == 0
        assert g.call(lambda: len(bridge(g).cm_exports)) == 0
        assert g.call(lambda: bridge(g).cm.stored_count()) == 0
    finally:
        mq.close()


def test_explicit_config_only_refuses_other_listeners(start_gw, bus, tmp_path):
    g = start_gw('orders.> export="bus"\n>\n',
                      transport="cm_name = GW\ncm_listener = DB orders.new\n"
                                "explicit_config_only = true\n")
    refused: list[Message] = []
    Listener(bus.t, "_RV.WARN.RVCM.REGISTRATION.NOT_CERTIFIED.>",
             lambda m, _: refused.append(m), bus.queue)
    other = CmTransport(bus.t, "OTHER", request_interval=0.2)
    got: list[int] = []
    other.listen("orders.>", lambda m, _: got.append(m.cm.sequence if m.cm else -1), bus.queue)
    mq = MqttClient(g.port("mqtt"))
    try:
        mq.c.publish("orders/new", json.dumps({"n": 1}), qos=1).wait_for_publish(10)
        wait_for(lambda: refused, timeout=30, what="REGISTRATION.NOT_CERTIFIED at OTHER")
        assert refused[0].get("sender") == "GW"
        mq.c.publish("orders/new", json.dumps({"n": 2}), qos=1).wait_for_publish(10)
        wait_for(lambda: len(got) == 2, timeout=30, what="both messages, uncertified")
        assert got == [0, 0]
    finally:
        mq.close()
        other.close()


def bridge(g: Any) -> Any:
    return g.gateway.transports.transports["bus"]


# -- the gateway killed mid-stream ----------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class GatewayProcess:
    """``python -m gateway serve`` with a certified rv transport importing queue orders.* and
    topic alerts.*, listening for AMQP, MQTT and HTTP. ``store`` and ``ports`` may be shared
    with another (fault-tolerant gateways); ``extra``: more lines of its gateway.conf."""

    def __init__(self, directory: Path, bus: Bus, *, store: Path | None = None,
                 ports: tuple[int, int, int] | None = None, extra: str = "") -> None:
        self.dir = directory
        self.store = store or directory / "data"
        self.amqp, self.mqtt, self.http = ports or (free_port(), free_port(), free_port())
        conf = directory / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "gateway.conf").write_text(
            f"listen = amqp://127.0.0.1:{self.amqp}\nlisten = mqtt://127.0.0.1:{self.mqtt}\n"
            f"listen = http://127.0.0.1:{self.http}\n"
            f"store = {self.store}\nrv_transports = enabled\n" + extra)
        (conf / "transports.conf").write_text(
            f"[bus]\ntype = rv\nservice = {bus.service}\nnetwork = {bus.network}\n"
            "queue_import_dm = PERSISTENT\ntopic_import_dm = PERSISTENT\ncm_name = GW\n"
            f"request_old = true\nledger_file = {self.store / 'gw.ledger'}\n")
        (conf / "queues.conf").write_text('orders.> import="bus"\n>\n')
        (conf / "topics.conf").write_text('alerts.> import="bus"\n>\n')
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready: bool = True) -> None:
        """Start it; ``ready``: wait until its transport is up."""
        self.log = open(self.dir / "gateway.out", "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config-dir", str(self.dir / "conf")],
            cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        if ready:
            self.wait_up()

    def wait_up(self, timeout: float = 60) -> None:
        wait_for(lambda: self.api("transports")[0]["state"] == "up" if self.alive() else
                 _died(self), timeout=timeout, what="the gateway's transport up")

    def said(self, text: str) -> bool:
        return text in (self.dir / "gateway.out").read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def api(self, path: str) -> Any:
        try:
            return admin_get(self.http, f"/api/v1/{path}", timeout=5)
        except OSError:
            return [{"state": "starting", "name": "", "count": 0, "imports": {}}]

    def queued(self) -> int:
        return sum(int(q.get("count", 0)) for q in self.api("queues")
                   if q.get("name", "").startswith("orders."))

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.log.close()

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self.log.closed:
            self.log.close()


def _died(g: GatewayProcess) -> bool:
    raise AssertionError("the gateway exited:\n"
                         + (g.dir / "gateway.out").read_text(errors="replace")[-3000:])


class MqttSession:
    """A paho MQTT 5 client with a persistent session, QoS 1, collecting ``n`` of each
    message and whether it came as a resend (DUP)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.got: list[tuple[int, bool]] = []
        self.c = paho.Client(CallbackAPIVersion.VERSION2, client_id="rvcm-alerts",
                             protocol=MQTTProtocolVersion.MQTTv5)
        self.c.on_message = lambda c, u, m: self.got.append((json.loads(m.payload)["n"], m.dup))
        self.c.reconnect_delay_set(0.1, 0.5)

    def connect(self) -> None:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        self.c.connect("127.0.0.1", self.port, clean_start=False, properties=props)
        self.c.loop_start()
        wait_for(self.c.is_connected, what="the MQTT session")

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


def drain_amqp(port: int, queue: str, expect: set[int]) -> list[int]:
    """The ``n`` of every message an AMQP receiver takes from ``queue`` (accepting each)
    until all of ``expect`` came, and then any that come within half a second more."""
    got: list[int] = []
    conn = amqp_connect(port)
    try:
        receiver = conn.create_receiver(f"queue://{queue}")
        while not expect <= set(got):
            got.append(int(receiver.receive(timeout=30).body["n"]))
            receiver.accept()
        with contextlib.suppress(proton.Timeout):  # a duplicate, if any, would come now
            while True:
                got.append(int(receiver.receive(timeout=0.5).body["n"]))
                receiver.accept()
    finally:
        conn.close()
    return got


def test_gateway_killed_mid_stream_imports_every_certified_message_once(bus, tmp_path):
    """Certified RV -> gateway -> an AMQP queue and an MQTT QoS 1 subscriber (a persistent
    session), with the gateway killed with SIGKILL mid-stream and restarted: every message
    once on the far side; the delivery log shows none imported twice."""
    n = 300
    gw = GatewayProcess(tmp_path / "gw", bus)
    sender = CmTransport(bus.t, "SENDER", ledger_file=tmp_path / "sender.ledger",
                         request_interval=0.3)
    mqtt = MqttSession(gw.mqtt)
    try:
        gw.start()
        mqtt.connect()
        mqtt.c.subscribe("alerts/#", 1)
        wait_for(lambda: gw.api("transports")[0].get("imports", {}).get("alerts.>"),
                 timeout=30, what="the topic import")
        for subject in ("orders.new", "alerts.new"):
            warm_up(sender, subject)
        start = time.monotonic()
        for i in range(1, n + 1):
            sender.send(Message("orders.new" if i % 2 else "alerts.new").add("n", i))
            time.sleep(max(0.0, start + i / 300 - time.monotonic()))
            if i == n // 3:
                wait_for(lambda: gw.queued() >= n // 8, timeout=30, what="imports under way")
                gw.kill()
            if i == 2 * n // 3:
                gw.start()
        wait_for(lambda: sender.stored_count() == 0, timeout=60,
                 what="the sender's ledger to empty (every message confirmed)")
        odd = set(range(1, n + 1, 2))
        got = drain_amqp(gw.amqp, SUBJECT, odd)
        # (the warm-ups, n = 0, are sent until the registration is in)
        assert sorted(x for x in got if x) == sorted(odd), "the queue: every message once"
        even = set(range(2, n + 1, 2))
        wait_for(lambda: even <= {x for x, _ in mqtt.got}, timeout=60,
                 what="the topic's messages at the MQTT subscriber")
        firsts = [x for x, dup in mqtt.got if x and not dup]
        assert sorted(firsts) == sorted(even), "MQTT: every message once (a resend has DUP)"
        records = []
        for f in sorted((tmp_path / "gw" / "data" / "delivery-log").iterdir()):
            records += [json.loads(line) for line in f.read_text().splitlines()]
        # No message imported twice (the records of the last instant before the kill may
        # be missing: docs/delivery-log.md, "Writing"); what the sender sent again after
        # the restart is dropped as a duplicate.
        imports = [(r["far_dest"], r["far_id"]) for r in records  # seqs are per subject
                   if r["event"] == "import" and (r.get("far_id") or "").startswith("SENDER#")]
        assert len(imports) == len(set(imports)), "no message imported twice"
        assert len(imports) > n // 2
        dropped = [r for r in records if r["event"] == "drop"]
        assert all(r["reason"] == "duplicate" for r in dropped)
    finally:
        mqtt.close()
        sender.close()
        gw.stop()


def test_mqtt_qos1_subscriber_gets_certified_imports(start_gw, bus, tmp_path):
    g = start_gw('orders.> import="bus"\n>\n',
                      transport="cm_name = GW\ntopic_import_dm = PERSISTENT\n")
    c = paho.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
    got: list[Any] = []
    c.on_message = lambda cl, u, m: got.append(json.loads(m.payload))
    c.connect("127.0.0.1", g.port("mqtt"))
    c.loop_start()
    sender = CmTransport(bus.t, "SENDER", request_interval=0.2)
    try:
        c.subscribe("orders/#", 1)
        wait_for(lambda: info(g)["imports"], what="the topic import")
        warm_up(sender)
        for n in range(1, 6):
            sender.send(Message(SUBJECT).add("n", n))
        wait_for(lambda: [x["n"] for x in got if x["n"] > 0] == [1, 2, 3, 4, 5], timeout=30,
                 what="five certified at the MQTT subscriber")
        wait_for(lambda: sender.stored_count() == 0, timeout=30, what="the confirmations")
    finally:
        sender.close()
        c.loop_stop()
        c.disconnect()


def test_what_a_sender_resends_after_a_crash_is_dropped_as_imported_already(
        start_gw, bus, tmp_path, monkeypatch):
    """The crash window: the store has the imports (and the bridge's position in the
    sender's stream, in the same commit), the CM ledger and the sender do not have the
    confirmations. After the restart the sender sends them again; none is imported twice."""
    g = start_gw(">\n", listen=("stomp",), queues='orders.> import="bus"\n>\n',
                 transport="queue_import_dm = PERSISTENT\ncm_name = GW\nrequest_old = true\n"
                           f"ledger_file = {tmp_path / 'gw.ledger'}\n")
    sender = CmTransport(bus.t, "SENDER", ledger_file=tmp_path / "sender.ledger",
                         request_interval=0.2)
    try:
        warm_up(sender)
        wait_for(lambda: sender.stored_count() == 0, what="the warm-ups confirmed")
        monkeypatch.setattr(CmListener, "confirm", lambda self, msg: None)  # "killed" here
        for n in range(1, 6):
            sender.send(Message(SUBJECT).add("n", n))

        def queued() -> list[int]:
            return g.call(lambda: [m.body["n"] for m in g.broker.queues[SUBJECT].iter_pending()
                                   if m.body["n"] > 0])

        wait_for(lambda: queued() == [1, 2, 3, 4, 5], what="the five stored")
        assert sender.stored_count() == 5  # none confirmed
        g.stop()
        monkeypatch.undo()
        g.start()
        wait_for(lambda: info(g)["state"] == "up", what="transport up again")
        wait_for(lambda: sender.stored_count() == 0, timeout=30,
                 what="the resent five confirmed")
        assert queued() == [1, 2, 3, 4, 5]
        assert info(g)["duplicates"] == 5
        drops = [r for r in log_records(g) if r["event"] == "drop"]
        assert [r["reason"] for r in drops] == ["duplicate"] * 5
    finally:
        sender.close()

