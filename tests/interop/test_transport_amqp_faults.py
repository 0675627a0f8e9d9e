"""The amqp transport when the link fails: reset, delayed, cut, and the far broker killed.

The gateway reaches RabbitMQ 3.10 (AMQP 1.0 plugin) through the fault proxy of
tests/faultproxy.py (toxiproxy's API, driven with toxiproxy-python); the far-side test
clients (python-qpid-proton) talk to RabbitMQ directly. The far queues are durable (declared
by a durable terminus, then addressed as ``/amq/queue/Q``, which takes an existing queue
whatever its durability) and the messages persistent, so RabbitMQ keeps what it accepted
across a SIGKILL.

What is checked, per sequence number, after recovery:

* export (gateway topic → far queue, or far topic read by a subscriber): every message
  arrives; a copy arrives twice only when RabbitMQ's ``accepted`` was lost with the link (the
  tests hold the outcomes back 300 ms so that some are), and then both copies carry the same
  ``x-opt-gw-trace-id``, which a gateway importing them uses to drop the second
  (``transports/base.py``; shown end to end by a second gateway); in order of first arrival.
* import (far queue → gateway queue, PERSISTENT): exactly once and in order. The messages come
  from a plain AMQP client (no gateway trace id): the transport drops the redelivered copy of a
  (message-id, destination) it has imported (RabbitMQ marks a requeued message
  first-acquirer = false; the tests hold the settlements back 300 ms so that some are lost).
  Without a message-id the guarantee is at least once, the extra copies being at most those
  unsettled when the link failed (tested too).

The SIGKILL tests restart the module's node on its own ports and database, so they run last.
Durable subscriptions (``durable_subscriptions = true``) are tested against another gateway,
which keeps them; RabbitMQ 3.10 does not (a test shows how it fails).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import peers.rabbitmq as rabbitmq_peer
import proton
import pytest
from faultproxy import toxiproxy_fixture  # noqa: F401
from gw import GatewayThread
from peers.mosquitto import wait_listening
from peers.rabbitmq import READY_LINE, RabbitMQ, rabbitmq_command
from proton import Terminus
from proton.reactor import ReceiverOption
from proton.utils import BlockingConnection
from test_transport_amqp import attached, gateway, info, unique, up, wait_for
from transportlog import check_resend_drops, log_records

from gateway.message import DeliveryMode, Destination, Message

rabbitmq = rabbitmq_peer.rabbitmq  # the module-scoped node

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

N = 300
RECOVERY = 90.0  # seconds for a reconnect and what waited to flow (2 CPUs, other workers)
TRACE = proton.symbol("x-opt-gw-trace-id")


class _DurableSource(ReceiverOption):
    def apply(self, link: Any) -> None:
        link.source.durability = Terminus.DELIVERIES


def declare_durable_queue(r: RabbitMQ, name: str) -> None:
    """RabbitMQ 3.10 declares ``/queue/Q`` durable when the attaching terminus is durable."""
    conn = BlockingConnection(r.amqp_url, timeout=15)
    try:
        conn.create_receiver(f"/queue/{name}", options=_DurableSource(), credit=0)
    finally:
        conn.close()


def proxied(tmp: Any, toxiproxy: Any, r: RabbitMQ, topics: str = ">\n", queues: str = ">\n",
            **extra: str) -> tuple[GatewayThread, Any]:
    proxy = toxiproxy.create(upstream=f"127.0.0.1:{r.amqp_port}", name="far",
                             listen="127.0.0.1:0")
    port = int(proxy.listen.rsplit(":", 1)[1])
    params = {"address_prefix_topic": "/amq/queue/", "address_prefix_queue": "/amq/queue/",
              "idle_timeout": "10sec", **extra}
    return gateway(tmp, port, topics, queues=queues, **params), proxy


def seq(i: int) -> str:
    return f"m{i:04d}"


def expected(n: int, start: int = 0) -> list[str]:
    return [seq(i) for i in range(start, n)]


def send_persistent(g: GatewayThread, topic: str, n: int, start: int = 0) -> None:
    def send() -> None:
        p = g.broker.connect().session().producer(Destination.topic(topic),
                                                  delivery_mode=DeliveryMode.PERSISTENT)
        for i in range(start, start + n):
            p.send(Message.text(seq(i)))
    g.call(send)


class Stream:
    """Persistent messages published on the gateway in batches of 10 every 30 ms (a thread),
    so that exports are in flight whenever a fault comes."""

    def __init__(self, g: GatewayThread, topic: str, n: int, start: int = 0) -> None:
        self.thread = threading.Thread(target=self._run, args=(g, topic, n, start), daemon=True)
        self.thread.start()

    def _run(self, g: GatewayThread, topic: str, n: int, start: int) -> None:
        for i in range(start, start + n, 10):
            send_persistent(g, topic, min(10, start + n - i), start=i)
            time.sleep(0.03)

    def join(self) -> None:
        self.thread.join(timeout=RECOVERY)
        assert not self.thread.is_alive(), "the stream did not finish"


def drain(r: RabbitMQ, queue: str, n: int) -> list[tuple[str, str]]:
    """(body, trace id) of what the far queue holds (see :func:`receive_all`)."""
    conn = BlockingConnection(r.amqp_url, timeout=15)
    try:
        return receive_all(conn.create_receiver(f"/amq/queue/{queue}", credit=500), n)
    finally:
        conn.close()


def receive_all(receiver: Any, n: int, timeout: float = RECOVERY) -> list[tuple[str, str]]:
    """(body, trace id) of at least ``n`` messages, then of any more until the receiver has
    been quiet for a second (a late duplicate would come then)."""
    got: list[tuple[str, str]] = []
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            m = receiver.receive(timeout=1.0 if len(got) >= n else 5.0)
        except proton.Timeout:
            if len(got) >= n:
                break
            continue
        receiver.accept()
        got.append((m.body, m.annotations[TRACE]))
    return got


def check_exported(copies: list[tuple[str, str]], n: int) -> int:
    """Every message once in order of first arrival, and every repeat the same message (the
    same trace id, which a gateway on the far side drops); returns the number of repeats."""
    first: dict[str, str] = {}
    order = []
    for body, trace in copies:
        if body in first:
            assert first[body] == trace, f"{body} came back under another trace id"
            continue
        first[body] = trace
        order.append(body)
    assert order == expected(n)
    assert len(set(first.values())) == n  # distinct messages, distinct trace ids
    return len(copies) - n


class FarSender:
    """A plain AMQP 1.0 publisher on RabbitMQ (no gateway markers): durable messages, each
    settled (accepted) before the next, in a thread. ``ids`` gives each a message-id."""

    def __init__(self, r: RabbitMQ, queue: str, n: int, start: int = 0,
                 ids: bool = True) -> None:
        self.error: BaseException | None = None
        self.sent = 0
        self.thread = threading.Thread(target=self._run, args=(r, queue, n, start, ids),
                                       daemon=True)
        self.thread.start()

    def _run(self, r: RabbitMQ, queue: str, n: int, start: int, ids: bool) -> None:
        try:
            conn = BlockingConnection(r.amqp_url, timeout=30)
            try:
                sender = conn.create_sender(f"/amq/queue/{queue}")
                for i in range(start, start + n):
                    sender.send(proton.Message(body=seq(i), durable=True,
                                               id=seq(i) if ids else None))
                    self.sent += 1
            finally:
                conn.close()
        except BaseException as exc:  # noqa: BLE001 - reported by join()
            self.error = exc

    def join(self) -> None:
        self.thread.join(timeout=RECOVERY)
        assert not self.thread.is_alive(), "the far sender did not finish"
        if self.error is not None:
            raise self.error


def imported(g: GatewayThread, queue: str) -> list[str]:
    def bodies() -> list[str]:
        q = g.broker.queues.get(queue)
        return [m.body for m in q.iter_pending()] if q is not None else []
    return g.call(bodies)  # type: ignore[no-any-return]


def quiet_then(check: Callable[[], Any]) -> Any:
    time.sleep(1.0)  # a duplicate would arrive now
    return check()


# -- export: gateway topic → far queue ---------------------------------------------------------


def hold_outcomes(proxy: Any) -> None:
    """Hold RabbitMQ's outcomes back 300 ms, so that some are lost with the link."""
    proxy.add_toxic(name="late", type="latency", stream="downstream",
                    attributes={"latency": 300})


@pytest.mark.parametrize("far", ["queue", "topic"])
def test_exports_survive_a_reset_mid_stream(tmp_path, toxiproxy, rabbitmq, far):
    """Far queue: a durable queue (``/amq/queue/``). Far topic: ``/topic/`` (amq.topic), read
    by a subscriber attached throughout."""
    name = unique("fxr")
    conn = BlockingConnection(rabbitmq.amqp_url, timeout=15)
    if far == "queue":
        declare_durable_queue(rabbitmq, f"{name}.a")
        receiver = None
    else:
        receiver = conn.create_receiver(f"/topic/{name}.#", credit=500)
    g, proxy = proxied(tmp_path / "gw", toxiproxy, rabbitmq, f'{name}.> export="far"\n>\n',
                       address_prefix_topic="/amq/queue/" if far == "queue" else "/topic/")
    try:
        up(g)
        hold_outcomes(proxy)
        stream = Stream(g, f"{name}.a", N)
        wait_for(lambda: info(g)["far"]["exported"] > N // 3, what="the stream to flow")
        proxy.add_toxic(name="cut", type="reset_peer", attributes={"timeout": 0})
        wait_for(lambda: info(g)["far"]["state"] != "up", what="the transport to notice")
        assert info(g)["far"]["exported"] < N  # mid-stream
        proxy.destroy_toxic("cut")
        proxy.destroy_toxic("late")
        stream.join()
        wait_for(lambda: info(g)["far"]["spooled"] == 0 and info(g)["far"]["state"] == "up",
                 timeout=RECOVERY, what="the spool drained after the reset")
        assert info(g)["far"]["connects"] >= 2 and info(g)["far"]["failed"] == 0
        copies = (receive_all(receiver, N) if receiver is not None
                  else drain(rabbitmq, f"{name}.a", N))
        # What was in flight went again: RabbitMQ has those twice, under one trace id each.
        assert check_exported(copies, N) > 0
    finally:
        conn.close()
        g.stop()


def test_exports_keep_order_through_latency(tmp_path, toxiproxy, rabbitmq):
    name = unique("fxl")
    declare_durable_queue(rabbitmq, f"{name}.b")
    g, proxy = proxied(tmp_path / "gw", toxiproxy, rabbitmq, f'{name}.> export="far"\n>\n')
    try:
        up(g)
        send_persistent(g, f"{name}.b", N // 3)
        wait_for(lambda: info(g)["far"]["exported"] > 10, what="the stream to start")
        for stream in ("upstream", "downstream"):
            proxy.add_toxic(name=f"slow-{stream}", type="latency", stream=stream,
                            attributes={"latency": 50, "jitter": 20})
        send_persistent(g, f"{name}.b", N - N // 3, start=N // 3)
        wait_for(lambda: info(g)["far"]["spooled"] == 0, timeout=RECOVERY,
                 what="the delayed stream confirmed")
        assert info(g)["far"]["connects"] == 1  # slow is not broken
        assert check_exported(drain(rabbitmq, f"{name}.b", N), N) == 0  # nothing sent twice
    finally:
        g.stop()


def test_exports_wait_out_a_cut_link(tmp_path, toxiproxy, rabbitmq):
    name = unique("fxc")
    declare_durable_queue(rabbitmq, f"{name}.c")
    g, proxy = proxied(tmp_path / "gw", toxiproxy, rabbitmq, f'{name}.> export="far"\n>\n')
    try:
        up(g)
        hold_outcomes(proxy)
        stream = Stream(g, f"{name}.c", N)
        wait_for(lambda: info(g)["far"]["exported"] > N // 3, what="the stream to flow")
        proxy.disable()  # every connection closed, and no new one until enabled
        wait_for(lambda: info(g)["far"]["state"] != "up", what="the transport to notice")
        stream.join()
        time.sleep(1.0)  # reconnect attempts fail meanwhile
        assert info(g)["far"]["spooled"] > 0 and info(g)["far"]["state"] != "up"
        proxy.destroy_toxic("late")
        proxy.enable()
        wait_for(lambda: info(g)["far"]["spooled"] == 0, timeout=RECOVERY,
                 what="the spool drained after the link came back")
        assert check_exported(drain(rabbitmq, f"{name}.c", N), N) > 0
    finally:
        g.stop()


def test_a_gateway_importing_the_far_queue_gets_each_export_exactly_once(tmp_path, toxiproxy,
                                                                           rabbitmq):
    """The export side's duplicates (a lost ``accepted``) end at the first gateway that
    imports them: here a second gateway, reading the far queue directly, after resets."""
    name = unique("fxg")
    declare_durable_queue(rabbitmq, f"{name}.d")
    g1, proxy = proxied(tmp_path / "g1", toxiproxy, rabbitmq, f'{name}.> export="far"\n>\n')
    g2 = gateway(tmp_path / "g2", rabbitmq.amqp_port, ">\n", queues=f'{name}.d import="far"\n>\n',
                 address_prefix_queue="/amq/queue/", queue_import_dm="PERSISTENT")
    try:
        up(g1)
        up(g2)
        hold_outcomes(proxy)
        stream = Stream(g1, f"{name}.d", N)
        for k in (1, 2):  # two resets while the stream flows
            wait_for(lambda k=k: info(g1)["far"]["exported"] > k * (N // 3),
                     timeout=RECOVERY, what="the stream to flow")
            proxy.add_toxic(name="cut", type="reset_peer", attributes={"timeout": 0})
            wait_for(lambda: info(g1)["far"]["state"] != "up", what="the reset noticed")
            proxy.destroy_toxic("cut")
            up(g1)
        stream.join()
        wait_for(lambda: info(g1)["far"]["spooled"] == 0, timeout=RECOVERY, what="all exported")
        wait_for(lambda: len(imported(g2, f"{name}.d")) >= N, timeout=RECOVERY,
                 what="all imported by the second gateway")
        assert quiet_then(lambda: imported(g2, f"{name}.d")) == expected(N)
        assert info(g1)["far"]["exported"] == N and info(g2)["far"]["imported"] == N
        assert info(g2)["far"]["duplicates"] > 0  # g1's resends, dropped by their trace ids
    finally:
        g1.stop()
        g2.stop()


# -- import: far queue → gateway queue ---------------------------------------------------------


def import_gateway(tmp: Any, toxiproxy: Any, r: RabbitMQ, queue: str) -> tuple[GatewayThread, Any]:
    return proxied(tmp, toxiproxy, r, queues=f'{queue} import="far"\n>\n',
                   queue_import_dm="PERSISTENT")


def throttle(proxy: Any) -> None:
    """Slow the far side's transfers to ~20 KB/s, so that a fault lands mid-stream, and hold
    the gateway's settlements back 300 ms, so that some are lost with the link."""
    proxy.add_toxic(name="narrow", type="bandwidth", stream="downstream",
                    attributes={"rate": 20})
    proxy.add_toxic(name="late", type="latency", stream="upstream",
                    attributes={"latency": 300})


def unthrottle(proxy: Any) -> None:
    for name in ("narrow", "late"):
        proxy.destroy_toxic(name)


def test_imports_survive_a_reset_mid_stream_exactly_once(tmp_path, toxiproxy, rabbitmq):
    queue = unique("fir")
    declare_durable_queue(rabbitmq, queue)
    FarSender(rabbitmq, queue, N).join()
    g, proxy = import_gateway(tmp_path / "gw", toxiproxy, rabbitmq, queue)
    try:
        throttle(proxy)
        up(g)
        wait_for(lambda: len(imported(g, queue)) > N // 4, timeout=RECOVERY,
                 what="the stream to flow")
        proxy.add_toxic(name="cut", type="reset_peer", attributes={"timeout": 0})
        wait_for(lambda: info(g)["far"]["state"] != "up", what="the reset noticed")
        assert len(imported(g, queue)) < N  # mid-stream
        proxy.destroy_toxic("cut")
        unthrottle(proxy)
        wait_for(lambda: len(imported(g, queue)) >= N, timeout=RECOVERY, what="every import")
        assert quiet_then(lambda: imported(g, queue)) == expected(N)
        # Settlements were lost with the link: RabbitMQ sent those again, marked, and they
        # were dropped as duplicates (none is missing above, none is twice).
        assert info(g)["far"]["connects"] >= 2 and info(g)["far"]["duplicates"] > 0
        # each written as its import would have been (docs/delivery-log.md)
        assert check_resend_drops(log_records(g), "far") == info(g)["far"]["duplicates"]
    finally:
        g.stop()


def test_imports_keep_order_through_latency(tmp_path, toxiproxy, rabbitmq):
    queue = unique("fil")
    declare_durable_queue(rabbitmq, queue)
    g, proxy = import_gateway(tmp_path / "gw", toxiproxy, rabbitmq, queue)
    try:
        up(g)
        attached(g, 1)
        sender = FarSender(rabbitmq, queue, N)
        wait_for(lambda: len(imported(g, queue)) > 10, what="the stream to flow")
        for stream in ("upstream", "downstream"):
            proxy.add_toxic(name=f"slow-{stream}", type="latency", stream=stream,
                            attributes={"latency": 50, "jitter": 20})
        sender.join()
        wait_for(lambda: len(imported(g, queue)) >= N, timeout=RECOVERY, what="every import")
        assert quiet_then(lambda: imported(g, queue)) == expected(N)
        assert info(g)["far"]["connects"] == 1 and info(g)["far"]["duplicates"] == 0
    finally:
        g.stop()


def test_imports_survive_a_cut_link_exactly_once(tmp_path, toxiproxy, rabbitmq):
    queue = unique("fic")
    declare_durable_queue(rabbitmq, queue)
    FarSender(rabbitmq, queue, N // 2).join()
    g, proxy = import_gateway(tmp_path / "gw", toxiproxy, rabbitmq, queue)
    try:
        throttle(proxy)
        up(g)
        wait_for(lambda: len(imported(g, queue)) > N // 8, timeout=RECOVERY,
                 what="the stream to flow")
        proxy.disable()
        wait_for(lambda: info(g)["far"]["state"] != "up", what="the cut noticed")
        assert len(imported(g, queue)) < N // 2  # mid-stream
        FarSender(rabbitmq, queue, N // 2, start=N // 2).join()  # published while cut
        unthrottle(proxy)
        proxy.enable()
        wait_for(lambda: len(imported(g, queue)) >= N, timeout=RECOVERY, what="every import")
        assert quiet_then(lambda: imported(g, queue)) == expected(N)
    finally:
        g.stop()


def test_imports_without_message_ids_are_at_least_once(tmp_path, toxiproxy, rabbitmq):
    """With no message-id nothing tells a resend from a new message: every message arrives,
    and only what was unsettled when the link failed can arrive twice."""
    queue = unique("fin")
    declare_durable_queue(rabbitmq, queue)
    FarSender(rabbitmq, queue, N, ids=False).join()
    g, proxy = import_gateway(tmp_path / "gw", toxiproxy, rabbitmq, queue)
    try:
        throttle(proxy)
        up(g)
        wait_for(lambda: len(imported(g, queue)) > N // 4, timeout=RECOVERY,
                 what="the stream to flow")
        proxy.add_toxic(name="cut", type="reset_peer", attributes={"timeout": 0})
        wait_for(lambda: info(g)["far"]["state"] != "up", what="the reset noticed")
        before = len(imported(g, queue))
        proxy.destroy_toxic("cut")
        unthrottle(proxy)
        wait_for(lambda: set(imported(g, queue)) == set(expected(N)), timeout=RECOVERY,
                 what="every message at least once")
        got = quiet_then(lambda: imported(g, queue))
        extra = len(got) - N
        assert 0 < extra <= before  # twice: only copies that had come before the reset
        assert info(g)["far"]["duplicates"] == 0
    finally:
        g.stop()


# -- durable subscriptions (another gateway keeps them; RabbitMQ 3.10 does not) ---------------


@pytest.mark.parametrize("durable", [True, False])
def test_a_durable_subscription_keeps_what_is_published_while_cut(tmp_path, toxiproxy, durable):
    far = GatewayThread(tmp_path / "far", gateway="listen = amqp://127.0.0.1:0\n"
                        "listen = http://127.0.0.1:0\n").start()
    proxy = toxiproxy.create(upstream=f"127.0.0.1:{far.port('amqp')}", name="far",
                             listen="127.0.0.1:0")
    port = int(proxy.listen.rsplit(":", 1)[1])
    g = gateway(tmp_path / "gw", port, 'dur.> import="far"\n>\n',
                address_prefix_topic="topic://", address_prefix_queue="queue://",
                durable_subscriptions=str(durable).lower())
    try:
        up(g)
        got: list[Any] = []
        g.call(lambda: g.broker.connect().session().consumer(
            Destination.topic("dur.x"), listener=got.append))
        attached(g, 1)

        def publish(start: int, n: int) -> None:
            def send() -> None:
                p = far.broker.connect().session().producer(
                    Destination.topic("dur.x"), delivery_mode=DeliveryMode.PERSISTENT)
                for i in range(start, start + n):
                    p.send(Message.text(seq(i)))
            far.call(send)

        publish(0, 5)
        wait_for(lambda: len(got) == 5, what="the first messages")
        proxy.disable()
        wait_for(lambda: info(g)["far"]["state"] != "up", what="the cut noticed")
        publish(5, 5)  # while the gateway is away
        proxy.enable()
        up(g)
        attached(g, 1)
        publish(10, 5)
        wait_for(lambda: seq(14) in [d.msg.body for d in got], timeout=RECOVERY,
                 what="the messages after reconnecting")
        bodies = quiet_then(lambda: [d.msg.body for d in got])
        if durable:
            assert bodies == expected(15)  # kept by the far gateway while the link was cut
        else:
            assert bodies == expected(5) + expected(15, start=10)  # lost while away
    finally:
        g.stop()
        far.stop()


def test_rabbitmq_does_not_keep_a_durable_subscription(tmp_path, toxiproxy, rabbitmq, caplog):
    """RabbitMQ 3.10's AMQP 1.0 plugin makes a new ``amq.gen-`` queue for each attach of a
    ``/topic`` source, durable or not: what was published while away stays in the old one."""
    name = unique("drb")
    g, proxy = proxied(tmp_path / "gw", toxiproxy, rabbitmq, f'{name}.> import="far"\n>\n',
                       address_prefix_topic="/topic/", durable_subscriptions="true")
    sender = BlockingConnection(rabbitmq.amqp_url, timeout=15).create_sender(f"/topic/{name}.x")
    try:
        up(g)
        got: list[Any] = []
        g.call(lambda: g.broker.connect().session().consumer(
            Destination.topic(f"{name}.x"), listener=got.append))
        attached(g, 1)
        proxy.disable()
        wait_for(lambda: info(g)["far"]["state"] != "up", what="the cut noticed")
        sender.send(proton.Message(body="while away", durable=True))
        proxy.enable()
        up(g)
        attached(g, 1)
        sender.send(proton.Message(body="after"))
        wait_for(lambda: got, what="the message after reconnecting")
        assert quiet_then(lambda: [d.msg.body for d in got]) == ["after"]
        rows = rabbitmq.ctl("list_queues", "name", "durable", "messages", "--quiet").stdout
        stranded = [r.split() for r in rows.splitlines() if r.startswith("amq.gen-")]
        # The first attach's durable queue keeps what came while away (and all after).
        assert any(durable == "true" and int(n) >= 1 for _, durable, n in stranded)
        assert "RabbitMQ 3.10.8 does not keep durable subscriptions" in caplog.text
    finally:
        sender.connection.close()
        g.stop()


# -- the far broker killed (SIGKILL) and restarted on the same ports: last in the module -------


def on_disk(r: RabbitMQ) -> None:
    """Make the node write its metadata (the queues just declared) to disk: mnesia's
    transaction log is still in the VM for a while, and a SIGKILL would lose the queue."""
    r.ctl("eval", "ok = mnesia:sync_log(), mnesia:dump_log().")


def kill(r: RabbitMQ) -> None:
    """SIGKILL the node: its start script, the Erlang VM and its helpers (one process group)."""
    os.killpg(r.proc.pid, signal.SIGKILL)
    r.proc.wait(timeout=30)


def restart(r: RabbitMQ) -> None:
    """Start the node again with the same name, ports, configuration and database (so the
    durable queues and their persistent messages come back), as the fixture started it."""
    before = r.log_path.read_text(errors="replace").count(READY_LINE)
    with r.output_path.open("ab") as out:
        r.proc = subprocess.Popen([rabbitmq_command("rabbitmq-server")], env=r.env,
                                  cwd=r.workdir, stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)

    def ready() -> bool:
        return r.log_path.read_text(errors="replace").count(READY_LINE) > before

    wait_listening(r.host, r.amqp_port, r.proc, rabbitmq_peer.START_TIMEOUT, ready=ready)


@pytest.fixture
def killable(rabbitmq: RabbitMQ) -> Iterator[RabbitMQ]:
    yield rabbitmq
    if rabbitmq.proc.poll() is not None:  # a failed test left it dead: the next one needs it
        restart(rabbitmq)


def test_exports_survive_the_far_broker_killed_and_restarted(tmp_path, toxiproxy, killable):
    r = killable
    name = unique("fxk")
    declare_durable_queue(r, f"{name}.k")
    on_disk(r)
    g, _proxy = proxied(tmp_path / "gw", toxiproxy, r, f'{name}.> export="far"\n>\n')
    try:
        up(g)
        send_persistent(g, f"{name}.k", N // 2)
        wait_for(lambda: info(g)["far"]["exported"] > 10, what="the stream to start")
        kill(r)
        wait_for(lambda: info(g)["far"]["state"] != "up", what="the broker to be gone")
        send_persistent(g, f"{name}.k", N // 2, start=N // 2)  # spooled while it is down
        restart(r)
        wait_for(lambda: info(g)["far"]["spooled"] == 0, timeout=RECOVERY,
                 what="the spool drained after the restart")
        check_exported(drain(r, f"{name}.k", N), N)
    finally:
        g.stop()


def test_imports_survive_the_far_broker_killed_and_restarted(tmp_path, toxiproxy, killable):
    r = killable
    queue = unique("fik")
    declare_durable_queue(r, queue)
    on_disk(r)
    FarSender(r, queue, N // 2).join()
    g, proxy = import_gateway(tmp_path / "gw", toxiproxy, r, queue)
    try:
        throttle(proxy)
        up(g)
        wait_for(lambda: len(imported(g, queue)) > N // 8, timeout=RECOVERY,
                 what="the stream to flow")
        kill(r)
        wait_for(lambda: info(g)["far"]["state"] != "up", what="the broker to be gone")
        assert len(imported(g, queue)) < N // 2  # mid-stream
        unthrottle(proxy)
        restart(r)
        FarSender(r, queue, N // 2, start=N // 2).join()
        wait_for(lambda: len(imported(g, queue)) >= N, timeout=RECOVERY, what="every import")
        assert quiet_then(lambda: imported(g, queue)) == expected(N)
    finally:
        g.stop()
