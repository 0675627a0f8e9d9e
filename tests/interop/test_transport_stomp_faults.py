"""The stomp transport when the link fails: reset, delayed, cut, and the far broker killed.

The gateway under test reaches the broker through the fault proxy of tests/faultproxy.py
(toxiproxy's API, driven with toxiproxy-python); every other client connects directly. Each
stream of 300 persistent messages is paced by a ``bandwidth`` toxic in its data direction so
the fault comes mid-stream, and its confirmations (RECEIPTs of exports, ACKs of imports) are
held back 200 ms by a ``latency`` toxic, so some are always on the wire when the link fails:
the resends and redeliveries those cause are what the checks are about.

What is promised, and checked per sequence number:

* **Export** (gateway topic → far topic, ``receipts = true``): a message leaves the spool
  only on its RECEIPT, so none is lost; one whose RECEIPT was lost is sent again, so the far
  broker may hold two copies. Another gateway importing the far topic drops the second by
  its (trace id, destination): it gets every message exactly once, in order. A plain STOMP
  subscriber beside it gets every message at least once, first copies in order.
* **Import** (far queue → gateway queue, ``queue_import_dm = PERSISTENT``): a message is
  ACKed only once the gateway stored it, so none is lost; one whose ACK was lost is
  redelivered. From ActiveMQ (which keeps a message's ``message-id`` on redelivery) the
  transport knows it and drops it: exactly once, in order. From RabbitMQ (a new
  ``message-id`` per delivery) a message another gateway sent is still caught by its trace
  id (exactly once), but one from a plain STOMP client is imported again: at least once, the
  extra copies only of messages the gateway had taken before the link failed.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from faultproxy import toxiproxy_fixture  # noqa: F401
from gw import GatewayThread
from peers.activemq import ActiveMQ, activemq_argv, start_activemq, stomp_ping
from peers.rabbitmq import RabbitMQ, start_rabbitmq
from test_transport_stomp import Remote, gateway, info, subscribe, wait_for
from transportlog import check_resend_drops, log_records

from gateway.message import DeliveryMode, Destination, Message

N = 300
RECOVERY = 90.0  # seconds to get every message after a fault (2 shared CPUs, a JVM restart)
RATE = 20  # KB/s through the proxy in the data direction: about 80 messages a second
CONFIRM_DELAY = 200  # ms the proxy holds back RECEIPTs / ACKs


def seq(i: int) -> bytes:
    return f"m{i:04d}".encode()


def expected(n: int = N) -> list[bytes]:
    return [seq(i) for i in range(n)]


@pytest.fixture(scope="module")
def amq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ActiveMQ]:
    with start_activemq(tmp_path_factory.mktemp("activemq")) as broker:
        yield broker


@pytest.fixture(scope="module")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitMQ]:
    with start_rabbitmq(tmp_path_factory.mktemp("rabbitmq")) as broker:
        yield broker


def proxy_to(toxiproxy: Any, port: int) -> tuple[Any, int]:
    proxy = toxiproxy.create(upstream=f"127.0.0.1:{port}", name="far", listen="127.0.0.1:0")
    return proxy, int(proxy.listen.rsplit(":", 1)[1])


def pace(proxy: Any, data: str) -> None:
    """Slow the data direction (``upstream``: exports, ``downstream``: imports) and hold the
    confirmations of the other back."""
    confirm = "downstream" if data == "upstream" else "upstream"
    proxy.add_toxic(name="pace", type="bandwidth", stream=data, attributes={"rate": RATE})
    proxy.add_toxic(name="confirm", type="latency", stream=confirm,
                    attributes={"latency": CONFIRM_DELAY})


def unpace(proxy: Any) -> None:
    proxy.destroy_toxic("pace")
    proxy.destroy_toxic("confirm")


def exported(g: GatewayThread, n: int) -> bool:
    return bool(info(g)["far"]["exported"] == n)


def send_persistent(g: GatewayThread, topic: str, n: int = N) -> None:
    def run() -> None:
        p = g.broker.connect().session().producer(Destination.topic(topic),
                                                  delivery_mode=DeliveryMode.PERSISTENT)
        for i in range(n):
            p.send(Message(seq(i)))

    g.call(run)


def reset(g: GatewayThread, proxy: Any) -> None:
    """(a) Both TCP connections through the proxy are reset (RST to the gateway)."""
    proxy.add_toxic(name="reset", type="reset_peer", attributes={"timeout": 0})
    wait_for(lambda: info(g)["far"]["state"] != "up", what="the transport to notice")
    proxy.destroy_toxic("reset")
    unpace(proxy)


def delay(g: GatewayThread, proxy: Any) -> None:
    """(b) Both directions get slower for a while; the connection stays."""
    for stream in ("upstream", "downstream"):
        proxy.add_toxic(name=f"slow_{stream}", type="latency", stream=stream,
                        attributes={"latency": 400, "jitter": 150})
    time.sleep(2.0)
    for stream in ("upstream", "downstream"):
        proxy.destroy_toxic(f"slow_{stream}")
    unpace(proxy)


def cut(g: GatewayThread, proxy: Any) -> None:
    """(c) The proxy is disabled (live connections closed, new ones refused), then back."""
    proxy.disable()
    wait_for(lambda: info(g)["far"]["state"] != "up", what="the transport to notice")
    time.sleep(1.0)  # reconnect attempts fail meanwhile
    unpace(proxy)
    proxy.enable()


FAULTS = {"reset": reset, "latency": delay, "cut": cut}


def kill_and_restart(broker: ActiveMQ) -> None:
    """(d) SIGKILL the broker's JVM and start it again on the same port and store."""
    broker.proc.send_signal(signal.SIGKILL)
    broker.proc.wait(timeout=30)
    with (broker.workdir / "activemq.out").open("ab") as out:
        broker.proc = subprocess.Popen(
            activemq_argv(broker.workdir), cwd=broker.workdir, stdin=subprocess.DEVNULL,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    wait_for(lambda: stomp_ping(broker.host, broker.stomp_port, timeout=2.0) is None,
             timeout=RECOVERY, what="the broker to restart")


class Collector:
    """A gateway importing the far topic ``topic`` (directly, not through the proxy), and a
    plain STOMP subscriber beside it when ``plain``."""

    def __init__(self, tmp: Path, port: int, topic: str, plain: bool = True,
                 **extra: str) -> None:
        root = topic.split(".")[0]
        self.g = gateway(tmp, port, False, f'{root}.> import="far"\n>\n', **extra)
        self.got: list[Any] = []
        subscribe(self.g, Destination.topic(topic), self.got)
        self.remote = Remote(port, False)
        wait_for(partial(self.probe, f"/topic/{topic}"), what="the collector's subscription")
        if plain:
            self.remote.subscribe(f"/topic/{topic}", "plain")
        time.sleep(0.3)  # the last probes arrive

    def probe(self, destination: str) -> bool:
        """Send a probe; True once one came through the collector gateway."""
        self.remote.send(destination, b"probe")
        return bool(self.got)

    def bodies(self) -> list[bytes]:
        return [d.msg.body for d in self.got if d.msg.body != b"probe"]

    def plain(self) -> list[bytes]:
        return [f.body for f in self.remote.got]

    def close(self) -> None:
        try:
            self.remote.close()
        except Exception:  # noqa: BLE001, S110 - its broker was killed under it
            pass
        self.g.stop()


def check_export(sender: GatewayThread, far: Collector, plain: bool = True) -> None:
    wait_for(lambda: len(set(far.bodies())) >= N and info(sender)["far"]["spooled"] == 0,
             timeout=RECOVERY, what="every export")
    time.sleep(1.0)  # a duplicate would arrive now
    assert far.bodies() == expected()  # exactly once, in order
    if plain:
        copies = far.plain()
        assert set(copies) == set(expected())  # at least once
        assert list(dict.fromkeys(copies)) == expected()  # first copies in order
    assert info(sender)["far"]["exported"] >= N


# -- export ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_exports_survive_a_fault_mid_stream_exactly_once(tmp_path: Path, toxiproxy: Any,
                                                         amq: ActiveMQ, fault: str) -> None:
    topic = f"fx{fault}.t"
    far = Collector(tmp_path / "far", amq.stomp_port, topic)
    proxy, port = proxy_to(toxiproxy, amq.stomp_port)
    g = gateway(tmp_path / "gw", port, False, f'fx{fault}.> export="far"\n>\n')
    try:
        pace(proxy, "upstream")
        send_persistent(g, topic)
        wait_for(lambda: len(far.bodies()) >= 30, what="the stream to start")
        assert len(far.bodies()) < N // 2
        FAULTS[fault](g, proxy)
        check_export(g, far)
        t = info(g)["far"]
        assert t["connects"] == (1 if fault == "latency" else 2)
        if fault != "latency":  # RECEIPTs were lost: the collector dropped resent copies
            assert info(far.g)["far"]["duplicates"] > 0
    finally:
        g.stop()
        far.close()


def test_exports_survive_the_far_broker_killed_and_restarted(tmp_path: Path,
                                                             toxiproxy: Any) -> None:
    with start_activemq(tmp_path / "amq", persistent=True) as broker:
        topic = "fxkill.t"
        # The collector's subscription must outlive the broker: durable, in KahaDB.
        far = Collector(tmp_path / "far", broker.stomp_port, topic, plain=False,
                        durable_subscriptions="true", client_id="collector")
        proxy, port = proxy_to(toxiproxy, broker.stomp_port)
        g = gateway(tmp_path / "gw", port, False, 'fxkill.> export="far"\n>\n')
        try:
            pace(proxy, "upstream")
            send_persistent(g, topic)
            wait_for(lambda: len(far.bodies()) >= 30, what="the stream to start")
            assert len(far.bodies()) < N // 2
            kill_and_restart(broker)
            unpace(proxy)
            check_export(g, far, plain=False)
            assert info(g)["far"]["connects"] >= 2 and info(far.g)["far"]["connects"] >= 2
        finally:
            g.stop()
            far.close()


# -- import ------------------------------------------------------------------------------------


def load_queue(port: int, rabbit: bool, queue: str, n: int = N) -> None:
    """Put n persistent messages on a far queue, each confirmed by its RECEIPT."""
    remote = Remote(port, rabbit)
    try:
        for i in range(n):
            remote.send(f"/queue/{queue}", seq(i), persistent="true")
    finally:
        remote.close()


def imported(g: GatewayThread, queue: str) -> list[bytes]:
    def run() -> list[bytes]:
        q = g.broker.queues.get(queue)
        return [m.body for m in q.iter_pending()] if q is not None else []

    result: list[bytes] = g.call(run)
    return result


def import_gateway(tmp: Path, port: int, rabbit: bool, queue: str) -> GatewayThread:
    return gateway(tmp, port, rabbit, ">\n", queues=f'{queue} import="far"\n>\n',
                   queue_import_dm="PERSISTENT")


def wait_imports(g: GatewayThread, queue: str) -> list[bytes]:
    wait_for(lambda: len(set(imported(g, queue))) >= N, timeout=RECOVERY, what="every import")
    time.sleep(1.0)  # a redelivery would arrive now
    got = imported(g, queue)
    assert set(got) == set(expected())  # none missing
    return got


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_queue_imports_survive_a_fault_mid_stream_exactly_once(
        tmp_path: Path, toxiproxy: Any, amq: ActiveMQ, fault: str) -> None:
    queue = f"fi{fault}.q"
    load_queue(amq.stomp_port, False, queue)
    proxy, port = proxy_to(toxiproxy, amq.stomp_port)
    pace(proxy, "downstream")
    g = import_gateway(tmp_path / "gw", port, False, queue)
    try:
        wait_for(lambda: len(imported(g, queue)) >= 30, what="the stream to start")
        assert len(imported(g, queue)) < N // 2
        FAULTS[fault](g, proxy)
        assert wait_imports(g, queue) == expected()  # exactly once, in order
        t = info(g)["far"]
        assert t["connects"] == (1 if fault == "latency" else 2)
        if fault != "latency":  # ACKs were lost: redeliveries known by their message-id
            assert t["duplicates"] > 0
        # each written as its import would have been (docs/delivery-log.md)
        assert check_resend_drops(log_records(g), "far") == t["duplicates"]
    finally:
        g.stop()


def test_queue_imports_survive_the_far_broker_killed_and_restarted(tmp_path: Path,
                                                                   toxiproxy: Any) -> None:
    with start_activemq(tmp_path / "amq", persistent=True) as broker:
        queue = "fikill.q"
        load_queue(broker.stomp_port, False, queue)
        proxy, port = proxy_to(toxiproxy, broker.stomp_port)
        pace(proxy, "downstream")
        g = import_gateway(tmp_path / "gw", port, False, queue)
        try:
            wait_for(lambda: len(imported(g, queue)) >= 30, what="the stream to start")
            assert len(imported(g, queue)) < N // 2
            kill_and_restart(broker)
            unpace(proxy)
            assert wait_imports(g, queue) == expected()  # exactly once, in order
            assert info(g)["far"]["connects"] >= 2
        finally:
            g.stop()


def test_rabbitmq_queue_import_after_a_reset_plain_at_least_once_gateway_exactly_once(
        tmp_path: Path, toxiproxy: Any, rabbit: RabbitMQ) -> None:
    """One far queue holds, in turns of ten, messages another gateway exported into it
    (``topic_prefix = /queue/``) and messages a plain STOMP client sent."""
    half, turn = N // 2, 10
    sender = gateway(tmp_path / "sender", rabbit.stomp_port, True, 'frmix.> export="far"\n>\n',
                     topic_prefix="/queue/")
    plain_client = Remote(rabbit.stomp_port, True)
    try:
        def from_gateway(start: int) -> None:
            p = sender.broker.connect().session().producer(
                Destination.topic("frmix.q"), delivery_mode=DeliveryMode.PERSISTENT)
            for i in range(start, start + turn):
                p.send(Message(b"g" + seq(i)))

        for start in range(0, half, turn):
            sender.call(partial(from_gateway, start))
            wait_for(partial(exported, sender, start + turn), what="the gateway's turn")
            for i in range(start, start + turn):
                plain_client.send("/queue/frmix.q", b"p" + seq(i), persistent="true")
    finally:
        plain_client.close()
        sender.stop()
    proxy, port = proxy_to(toxiproxy, rabbit.stomp_port)
    pace(proxy, "downstream")
    g = import_gateway(tmp_path / "gw", port, True, "frmix.q")
    try:
        wait_for(lambda: len(imported(g, "frmix.q")) >= 30, what="the stream to start")
        reset(g, proxy)
        # Taken before the reset (their ACKs may be lost), read once the link is down.
        taken = set(imported(g, "frmix.q"))
        assert len(taken) < N // 2
        wait_for(lambda: len(set(imported(g, "frmix.q"))) >= N, timeout=RECOVERY,
                 what="every import")
        time.sleep(1.0)  # a redelivery would arrive now
        got = imported(g, "frmix.q")
        gateway_copies = [b for b in got if b.startswith(b"g")]
        plain_copies = [b for b in got if b.startswith(b"p")]
        assert gateway_copies == [b"g" + b for b in expected(half)]  # exactly once, in order
        assert set(plain_copies) == {b"p" + b for b in expected(half)}  # none missing
        extra = Counter(plain_copies) - Counter(set(plain_copies))
        assert set(extra) <= taken  # copies only of what was taken before the reset
        assert list(dict.fromkeys(plain_copies)) == [b"p" + b for b in expected(half)]
        assert info(g)["far"]["duplicates"] > 0  # the other gateway's, redelivered, dropped
    finally:
        g.stop()
