"""A gateway cluster under faults, judged by the reconciliation of its nodes' delivery logs.

Three ``gateway serve`` nodes on a private three-server NATS cluster (JetStream, replicas 3).
A stomp.py producer on node 1 sends persistent messages to queue ``orders`` (each confirmed
by a receipt) while consumers on nodes 2 and 3 take them. Mid-stream, node 2's consumer stops
acknowledging (what it then holds is unacknowledged) and node 2 is killed with SIGKILL; later
the NATS server under node 3 is killed too, and node 3 reconnects to another. Every message
must reach a consumer: those node 2 held go to node 3 once JetStream's ``ack_wait`` passes.

The reconciliation (``gateway reconcile --json`` over the three nodes' log directories) then
sees one gateway, the cluster (each record's ``gw`` is ``t/<node>``): every message entered on
node 1 and left on node 2 or 3, and none is lost or duplicated.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clusternodes import StompQueueClient, cluster_info, node
from gw import wait_for
from peers.natsserver import NatsCluster, start_nats_cluster

from spark.cli import main as reconcile_main

pytestmark = [pytest.mark.spark, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

MESSAGES = 400
GRACE_MS = 1500.0


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    with start_nats_cluster(tmp_path / "nats") as c:
        yield c


def records(log_dir: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted(log_dir.glob("dlog-*.jsonl")):
        for line in f.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:  # a line cut short by the kill
                pass
    return out


def test_a_node_killed_mid_stream_then_a_nats_server_lose_and_duplicate_nothing(
        tmp_path: Path, nats_cluster: NatsCluster, spark: Any, capsys: Any) -> None:
    extra = "cluster_ack_wait = 3 sec\n"
    nodes = [node(tmp_path, nats_cluster, i, extra=extra) for i in (1, 2, 3)]
    n1, n2, n3 = nodes
    c2 = StompQueueClient(n2.port("stomp"))
    c3 = StompQueueClient(n3.port("stomp"))
    sender = StompQueueClient(n1.port("stomp"))
    sent = [f"order {i:04d}" for i in range(MESSAGES)]
    failures: list[BaseException] = []

    def produce() -> None:
        try:
            for body in sent:
                sender.send("/queue/orders", body)
                assert not sender.errors, sender.errors
                time.sleep(0.005)  # a stream, not a burst: the faults land in its middle
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            failures.append(exc)

    producer = threading.Thread(target=produce, daemon=True)
    try:
        c2.consume("/queue/orders")
        c3.consume("/queue/orders")
        producer.start()
        wait_for(lambda: len(c2.acked) >= 50, timeout=60, what="node 2 consuming")
        c2.stop_acking()  # what node 2 delivers from now on stays unacknowledged
        wait_for(lambda: len(c2.got) > len(c2.acked) + 5, timeout=60,
                 what="node 2 holding unacknowledged orders")
        with c2.cond:
            acked_ids = {h["message-id"] for b, h in c2.got if b in set(c2.acked)}
        # the log trails the node by its flush interval: a record it never wrote is no
        # message the reconciliation could know of
        wait_for(lambda: acked_ids <= {r["msg_id"] for r in records(n2.config_dir / "data"
                                                                     / "delivery-log")
                                       if r["event"] == "ack"},
                 timeout=30, what="node 2's ack records")
        n2.kill()
        before = len(c3.acked)
        wait_for(lambda: len(c3.acked) >= before + 20, timeout=60, what="node 3 going on")
        nats_cluster.servers[2].kill()  # node 3's NATS server
        producer.join(120)
        assert not producer.is_alive() and not failures, failures
        wait_for(lambda: set(c2.acked) | set(c3.acked) == set(sent), timeout=90,
                 what="every order consumed")
        assert len(c3.acked) == len(set(c3.acked)), "node 3 delivered an order twice"
        assert not set(c2.acked) & set(c3.acked), "an order acknowledged on both nodes"
        redelivered = {b for b, h in c3.got if h.get("redelivered") == "true"}
        held = {b for b, _ in c2.got} - set(c2.acked)
        assert held <= redelivered  # JMSRedelivered: node 2 had delivered them
        assert cluster_info(n1)["feeds"]["queued"] == MESSAGES
    finally:
        producer.join(10)
        for c in (c2, c3, sender):
            if c.conn.is_connected():
                c.close()
        for p in nodes:
            p.stop()

    out = tmp_path / "reconciled"
    capsys.readouterr()
    status = reconcile_main([str(p.config_dir / "data" / "delivery-log") for p in nodes]
                            + ["--out", str(out), "--json", "--grace-ms", str(GRACE_MS),
                               "--no-progress", "--no-report"])
    printed = capsys.readouterr().out
    assert status == 0, printed
    result = json.loads(printed)
    verdicts = result["verdicts"]
    assert set(verdicts) == {"delivered"}, verdicts  # nothing lost, nothing duplicated
    rows = spark.read.parquet(str(out / "verdicts")).collect()
    assert {r.gw for r in rows} == {"t"}  # the cluster, one gateway
    publishes = [r for r in records(n1.config_dir / "data" / "delivery-log")
                 if r["event"] == "publish" and r["dest"] == "queue:orders"]
    assert len(publishes) == MESSAGES
    assert {r.trace_id for r in rows} == {r["trace_id"] for r in publishes}
