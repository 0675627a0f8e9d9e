"""Cluster benchmark: MQTT through two gateway nodes of a NATS cluster against one gateway
alone, and the CPU a message costs when it crosses from one node to the other.

    .venv/bin/python tests/bench/bench_cluster.py                     # defaults below
    .venv/bin/python tests/bench/bench_cluster.py --seconds 3 --qos 0 --runs 1 --pairs 2
    nice -n 19 .venv/bin/python tests/bench/bench_cluster.py --figures cpu-n1,cpu-across

Defaults: --seconds 5 of publishing a run, --payload 64, --qos 0,1, --pairs 4, --window 1000,
--runs 3, every figure: about five minutes on two CPUs.

How this works. Everything runs on 127.0.0.1 and is stopped at the end, also on an error or
Ctrl-C: two NATS servers routed to each other (tests/peers/natsserver.py, Debian's
``nats-server``, installed by ``bash tests/peers/install.sh``), and three ``python -m gateway
serve --config-dir DIR`` processes, each with its own ``gateway.conf`` and store: ``single``
(no ``cluster`` line: the gateway as it runs without a cluster) and the nodes ``n1`` and
``n2`` (``cluster = nats://...`` of NATS server 1 and 2 respectively, ``cluster_replicas = 2``, ``cluster_name =
bench``, ``node_id``). Each gateway has an MQTT listener of its own and an admin listener
(``http://``); the two nodes also share one more MQTT port, which a node of a cluster opens
with ``SO_REUSEPORT``, so that the kernel spreads the connections made to it over both.
The gateways get PYTHONPATH=<the tree this script is in>, so that a compiled copy of the
tree (README "The compiled build") runs its compiled modules.
``mqtt_max_queued_messages = 0`` (no limit), as in bench_mqtt.py: a subscriber that falls
behind is queued for, not dropped.

The clients are paho-mqtt (MQTT 3.1.1), one client per process (multiprocessing, spawn), so
that no client shares an interpreter with another; the processes talk to this one over a
``multiprocessing.Connection``. Subscriber *i* subscribes to ``bench/<run>/<i>`` and one
publisher publishes to that topic: every message has one subscriber. A publisher writes
64-byte payloads as fast as its socket takes them (paho without its network thread:
``publish`` writes at once, and the publisher waits for the socket while ``want_write``);
at QoS 1 with at most --window messages unacknowledged. A subscriber counts what arrives,
checks each payload's size and notes the time of the last one.

One run: the subscribers SUBSCRIBE and have their SUBACKs; then each publisher sends probes
(``probe <n>``) until its subscriber has one, which shows that the subscription has reached
the publisher's node, across the NATS servers too (as ``wait_routed`` of
tests/interop/test_cluster.py); then all publishers go at once for --seconds (or until each
sent --messages), stop, and the run waits until every subscriber has every message (QoS 1:
a missing one fails the run; QoS 0: what is still missing after 3 s of quiet is counted as
lost). The figure is messages delivered / (time from the go to the last delivery), so a
backlog left in the gateway counts against it. CPU is user + system time from /proc/PID/stat
of each gateway (and its child processes) and each NATS server, taken before the go and
after the last delivery, divided by the messages delivered; each client's own CPU is reported
as a share of one core (``!`` at 90%: the client may be the bottleneck), and what other
processes used meanwhile (from /proc/stat) as "others", in CPUs: a machine shared with other
work lowers the rates, less so the CPU a message costs. Per run every figure is measured in
turn, each QoS, so that a machine that drifts moves all figures alike; the table has the
medians.

The figures:

(1) Throughput, per QoS: --pairs publisher/subscriber pairs on ``single`` against the same
    pairs on the nodes' shared port. Where the kernel put each client is read from the
    nodes' admin API (``/api/v1/connections``), and only then is each publisher given its
    topic: its subscriber is on the other node for half of the pairs (as near as the
    kernel's spread allows), the share that crosses on average when interest falls on two
    nodes at random, without the swings of a coin toss per pair. How many messages did
    cross comes from the cluster link's counters (``received`` of ``/api/v1/server``).
    Both gateways and the clients share the machine's CPUs, so the ratio two nodes / one
    node says what the cluster costs on one machine; it is not a scaling test.
(2) CPU per message, per QoS: one pair, on ``single`` (local, no cluster); on ``n1`` alone
    (publisher and subscriber on n1: the node publishes every message to NATS all the same,
    and, having a subscriber for the topic, gets it back); and across (publisher on n1,
    subscriber on n2, by the nodes' own ports), where each node's share is shown.

The closing text, for a README to quote, works the per-message CPU into a model of how a
cluster's throughput grows with its nodes, for interest partitioned among the nodes and for
interest on every node, and states its assumptions.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "bench"))

from adminapi import admin_get  # noqa: E402
from bench_amqp import CLIENT_BOUND, process_alive  # noqa: E402
from bench_mqtt import (  # noqa: E402
    HOST,
    BenchError,
    BrokerFailed,
    Running,
    log,
    print_table,
    run_process,
)
from bench_stomp import expect, machine_jiffies, tree_cpu  # noqa: E402
from peers.mosquitto import PeerFailedToStart, PeerMissing, free_port  # noqa: E402
from peers.natsserver import NatsCluster, start_nats_cluster  # noqa: E402

PAYLOAD_SIZE = 64
PAYLOAD = (b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ+/" * 2)
CLUSTER_NAME = "bench"
READY_TIMEOUT = 60.0  # a client process starts an interpreter and connects
ROUTE_TIMEOUT = 30.0  # interest travels between NATS servers within a second or so
QUIET = 3.0  # after the publishers stop: no delivery for this long ends the drain (QoS 0)
STALL_TIMEOUT = 30.0  # ... and for QoS 1, where every message must arrive
QOS1_WINDOW = 1000  # default --window: PUBACKs a publisher may wait for
WRITE_BATCH = 64  # publishes between looks at the clock and the socket


# --- load clients (each in a process of its own) --------------------------------------------

def _paho_client(spec: dict[str, Any]) -> Any:
    """A connected paho client without its network thread (``loop`` is called by us)."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=spec["client_id"],
                         protocol=paho.MQTTv311)
    client.max_inflight_messages_set(spec.get("window", QOS1_WINDOW) + 10)
    client.max_queued_messages_set(0)
    connected: list[Any] = []
    client.on_connect = lambda _c, _u, _f, rc, _p: connected.append(rc)
    client.connect(spec["host"], spec["port"], keepalive=600)
    deadline = time.monotonic() + READY_TIMEOUT
    while not connected:
        if time.monotonic() > deadline:
            raise BenchError("no CONNACK")
        client.loop(0.05)
    if connected[0] != 0:
        raise BenchError(f"CONNACK {connected[0]}")
    return client


def publisher_main(conn: Connection, spec: dict[str, Any]) -> None:
    """Connect, say ``ready``; then per command: ``("topic", name)`` sets the topic (when
    the spec's is None) and says ``topic``; ``probe`` publishes one probe (QoS 1,
    acknowledged) and says ``probed``; ``go`` publishes for ``seconds`` (or ``count``
    messages) and says ``done`` with what it sent, its start time and its CPU seconds."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        client = _paho_client(spec)
        topic, qos, window = spec["topic"], spec["qos"], spec["window"]
        payload = PAYLOAD[:spec["payload"]] if spec["payload"] <= len(PAYLOAD) else (
            b"x" * spec["payload"])
        acked = 0

        def on_publish(_c: Any, _u: Any, _mid: int, _rc: Any, _p: Any) -> None:
            nonlocal acked
            acked += 1

        client.on_publish = on_publish
        conn.send(("ready", {}))
        probes = 0
        while True:
            command = conn.recv()
            if isinstance(command, tuple):  # ("topic", name): where to publish
                topic = command[1]
                conn.send(("topic", {}))
            elif command == "probe":
                probes += 1
                info = client.publish(topic, b"probe %d" % probes, 1)
                deadline = time.monotonic() + 10
                while not info.is_published() and time.monotonic() < deadline:
                    client.loop(0.05)
                conn.send(("probed", {}))
            elif command == "go":
                break
            else:
                return
        acked = 0
        sent = 0
        cpu0 = sum(os.times()[:2])
        started = time.monotonic()
        stop_at = started + spec["seconds"]
        limit = spec["count"] or sys.maxsize
        publish, loop, want_write = client.publish, client.loop, client.want_write
        while sent < limit and time.monotonic() < stop_at:
            if qos and sent - acked >= window:
                loop(0.05)  # reads PUBACKs
                continue
            n = min(WRITE_BATCH, limit - sent, window - (sent - acked) if qos else WRITE_BATCH)
            for _ in range(n):
                publish(topic, payload, qos)
            sent += n
            while want_write():  # the socket took less than we wrote: wait for it
                loop(0.05)
            if qos:
                loop(0)
        deadline = time.monotonic() + STALL_TIMEOUT
        while (want_write() or (qos and acked < sent)) and time.monotonic() < deadline:
            loop(0.05)
        ended = time.monotonic()
        conn.send(("done", {"sent": sent, "acked": acked, "started_at": started,
                            "ended_at": ended, "cpu": sum(os.times()[:2]) - cpu0}))
        with contextlib.suppress(EOFError, OSError):
            conn.recv()  # the parent's "stop", or its end closed
        client.disconnect()
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the run
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


def subscriber_main(conn: Connection, spec: dict[str, Any]) -> None:
    """Connect, SUBSCRIBE, say ``ready`` after the SUBACK; count messages (probes apart) and
    answer each ``count`` with the counts so far, the last message's time and the CPU
    seconds since ``zero`` (which clears the counts and says ``zeroed``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        client = _paho_client(spec)
        subscribed: list[Any] = []
        client.on_subscribe = lambda _c, _u, _m, codes, _p: subscribed.append(codes)
        got = {"received": 0, "whole": 0, "probes": 0, "last_at": 0.0}
        size = spec["payload"]

        def on_message(_c: Any, _u: Any, m: Any) -> None:
            payload = m.payload
            if payload.startswith(b"probe"):
                got["probes"] += 1
                return
            got["received"] += 1
            if len(payload) == size:
                got["whole"] += 1
            got["last_at"] = time.monotonic()

        client.on_message = on_message
        client.subscribe(spec["topic"], spec["qos"])
        deadline = time.monotonic() + READY_TIMEOUT
        while not subscribed:
            if time.monotonic() > deadline:
                raise BenchError("no SUBACK")
            client.loop(0.05)
        conn.send(("ready", {}))
        cpu0 = sum(os.times()[:2])
        while True:
            client.loop(0.02)
            while conn.poll():
                command = conn.recv()
                if command == "count":
                    conn.send(("count", {**got, "cpu": sum(os.times()[:2]) - cpu0}))
                elif command == "zero":
                    got.update(received=0, whole=0, last_at=0.0)
                    cpu0 = sum(os.times()[:2])
                    conn.send(("zeroed", {}))
                else:
                    client.disconnect()
                    return
    except (EOFError, OSError):
        return  # the parent is gone
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the run
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


@dataclass
class Client:
    """A client process and this process's end of its pipe."""

    name: str
    proc: multiprocessing.process.BaseProcess
    conn: Connection


@contextlib.contextmanager
def client_processes() -> Iterator[list[Client]]:
    """Started clients go into the list; all are ended on the way out (a client still
    waiting for a command ends when its end of the pipe closes)."""
    clients: list[Client] = []
    try:
        yield clients
    finally:
        for c in clients:
            with contextlib.suppress(OSError):
                c.conn.send("stop")
            c.conn.close()
        for c in clients:
            c.proc.join(5)
            if c.proc.is_alive():
                c.proc.kill()
                c.proc.join()


def start_client(clients: list[Client], name: str, main: Any, spec: dict[str, Any]) -> Client:
    """Start ``main(conn, spec)`` in a process of its own (spawn: a fresh interpreter)."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=main, args=(child, spec), name=name, daemon=True)
    proc.start()
    child.close()
    client = Client(name, proc, parent)
    clients.append(client)
    return client


def ask(client: Client, command: Any, what: str, timeout: float = READY_TIMEOUT
        ) -> dict[str, Any]:
    """Send a client ``command`` and return its answer's payload, which must be ``what``."""
    client.conn.send(command)
    return expect(client.conn, client.proc, what, timeout)


# --- gateways and NATS -----------------------------------------------------------------------

@dataclass
class Gateway:
    """A started ``gateway serve``: its own MQTT and admin ports, its pid."""

    name: str
    running: Running
    mqtt: int
    http: int

    @property
    def pid(self) -> int:
        return self.running.pid


@contextlib.contextmanager
def start_gateway(name: str, workdir: Path, cluster: str | None = None,
                  shared_port: int | None = None) -> Iterator[Gateway]:
    """``gateway serve`` on a configuration of its own (module docstring); a node of the
    cluster when ``cluster`` names its NATS server, also listening on ``shared_port``."""
    conf = workdir / "conf"
    conf.mkdir(parents=True)
    mqtt, http = free_port(HOST), free_port(HOST)
    lines = [f"listen = mqtt://{HOST}:{mqtt}", f"listen = http://{HOST}:{http}",
             f"store = {workdir / 'data'}", "mqtt_max_queued_messages = 0"]
    if shared_port is not None:
        lines.append(f"listen = mqtt://{HOST}:{shared_port}")
    if cluster is not None:
        lines += [f"cluster = {cluster}", f"cluster_name = {CLUSTER_NAME}", f"node_id = {name}",
                  "cluster_replicas = 2"]  # two NATS servers
    (conf / "gateway.conf").write_text("\n".join(lines) + "\n")
    (conf / "topics.conf").write_text(">\n")  # any topic may be created
    (conf / "queues.conf").write_text(">\n")
    argv = [sys.executable, "-m", "gateway", "serve", "--config-dir", str(conf)]
    with run_process(name, argv, workdir, mqtt) as running:
        yield Gateway(name, running, mqtt, http)


def server_info(gw: Gateway) -> dict[str, Any]:
    info: dict[str, Any] = admin_get(gw.http, "/api/v1/server")
    return info


def cluster_received(gw: Gateway) -> int:
    return int(server_info(gw).get("cluster", {}).get("received", 0))


def mqtt_clients(gw: Gateway) -> set[str]:
    rows = admin_get(gw.http, "/api/v1/connections")
    return {str(r.get("client_id")) for r in rows if r.get("protocol") == "mqtt"}


# --- one run ---------------------------------------------------------------------------------

@dataclass
class Run:
    """What one run measured."""

    rate: float  # messages delivered a second, from the go to the last delivery
    delivered: int
    sent: int
    lost: int
    seconds: float
    gateway_cpu: dict[str, float]  # CPU seconds per gateway over the run
    nats_cpu: float  # CPU seconds of all NATS servers over the run
    client_cpu: list[float]  # each client's share of one core
    crossed: int = 0  # messages that came in through a node's cluster link
    placement: str = ""  # how the kernel spread the clients (shared port)
    machine_busy: float = 0.0  # CPUs busy meanwhile, all processes

    def others(self) -> float:
        """CPUs that processes other than the gateways, NATS and the clients kept busy."""
        ours = ((sum(self.gateway_cpu.values()) + self.nats_cpu) / self.seconds
                + sum(self.client_cpu))
        return max(0.0, self.machine_busy - ours)

    def us_per_msg(self, cpu: float) -> float:
        return cpu / self.delivered * 1e6 if self.delivered else float("nan")


def run_pairs(args: argparse.Namespace, qos: int, seq: int, pairs: list[tuple[int, int]],
              gateways: list[Gateway], nats: NatsCluster | None, shared: bool = False) -> Run:
    """``pairs`` of (publisher port, subscriber port); ``gateways`` are the processes whose
    CPU counts, ``nats`` the servers whose CPU counts (None: none); ``shared``: the pairs
    use the nodes' shared port, and where each client landed is looked up. See the module
    docstring, "One run"."""
    base = {"host": HOST, "qos": qos, "payload": args.payload, "window": args.window,
            "seconds": args.seconds, "count": args.messages}
    nats_pids = [s.proc.pid for s in nats.servers if s.proc is not None] if nats else []
    with client_processes() as clients:
        subs, pubs = [], []
        for i, (pub_port, sub_port) in enumerate(pairs):
            topic = f"bench/{seq}/{i}"
            subs.append(start_client(clients, f"sub{i}", subscriber_main, {
                **base, "port": sub_port, "topic": topic, "client_id": f"s{seq}-{i}"}))
            pubs.append(start_client(clients, f"pub{i}", publisher_main, {
                **base, "port": pub_port, "topic": None if shared else topic,
                "client_id": f"p{seq}-{i}"}))
        for c in clients:
            expect(c.conn, c.proc, "ready", READY_TIMEOUT)
        placement = ""
        if shared:  # the publishers' topics: half of the pairs across (or near it)
            where = {cid: g.name for g in gateways for cid in mqtt_clients(g)}
            pub_nodes = [where.get(f"p{seq}-{i}", "?") for i in range(len(pairs))]
            sub_nodes = [where.get(f"s{seq}-{i}", "?") for i in range(len(pairs))]
            match = pair_up(pub_nodes, sub_nodes, len(pairs) // 2)
            for i, j in enumerate(match):
                ask(pubs[i], ("topic", f"bench/{seq}/{j}"), "topic")
            pubs = [pubs[match.index(j)] for j in range(len(pairs))]  # pubs[j] feeds subs[j]
            placement = " ".join(f"{pub_nodes[i]}>{sub_nodes[j]}" for i, j in enumerate(match))
        wait_routed(pubs, subs)
        for s in subs:
            ask(s, "zero", "zeroed")
        crossed0 = sum(cluster_received(g) for g in gateways) if nats else 0
        cpu0 = {g.name: tree_cpu(g.pid) for g in gateways}
        ncpu0 = sum(tree_cpu(p) for p in nats_pids)
        jiffies0 = machine_jiffies()
        go = time.monotonic()
        for p in pubs:
            p.conn.send("go")
        done = [expect(p.conn, p.proc, "done", args.seconds + STALL_TIMEOUT + 30) for p in pubs]
        sent = sum(d["sent"] for d in done)
        counts = drain(subs, sent, qos)
        cpu1 = {g.name: tree_cpu(g.pid) for g in gateways}
        ncpu1 = sum(tree_cpu(p) for p in nats_pids)
        jiffies1 = machine_jiffies()
        crossed = sum(cluster_received(g) for g in gateways) - crossed0 if nats else 0
        for g in gateways:
            if not process_alive(g.pid):
                raise BenchError(f"{g.name} exited:\n{g.running.output_tail()}")
    delivered = sum(c["received"] for c in counts)
    whole = sum(c["whole"] for c in counts)
    if whole != delivered:
        raise BenchError(f"{delivered - whole} of {delivered} messages arrived damaged")
    if delivered > sent:
        raise BenchError(f"{delivered} messages delivered of {sent} sent: duplicates")
    last = max(c["last_at"] for c in counts)
    elapsed = last - go
    if delivered == 0 or elapsed <= 0:
        raise BenchError("nothing was delivered")
    client_cpu = [d["cpu"] / max(1e-9, d["ended_at"] - d["started_at"]) for d in done]
    client_cpu += [c["cpu"] / elapsed for c in counts]
    busy = ((jiffies1[0] - jiffies0[0]) / max(1, jiffies1[1] - jiffies0[1])
            * (os.cpu_count() or 1))
    return Run(delivered / elapsed, delivered, sent, sent - delivered, elapsed,
               {n: cpu1[n] - cpu0[n] for n in cpu0}, ncpu1 - ncpu0, client_cpu, crossed,
               placement, busy)


def pair_up(pub_nodes: list[str], sub_nodes: list[str], cross: int) -> list[int]:
    """For publisher i, the subscriber it is to feed: ``cross`` pairs on different nodes
    and the rest on one node, as near as where the kernel put the clients allows (taken
    greedily, publisher by publisher)."""
    left = list(range(len(sub_nodes)))
    match, crossed = [], 0
    for node in pub_nodes:
        other = [j for j in left if sub_nodes[j] != node]
        same = [j for j in left if sub_nodes[j] == node]
        j = (other or same)[0] if crossed < cross else (same or other)[0]
        crossed += sub_nodes[j] != node
        left.remove(j)
        match.append(j)
    return match


def wait_routed(pubs: list[Client], subs: list[Client]) -> None:
    """Each publisher sends probes until its subscriber has one (waiting 50 ms after the
    first, doubling up to 1 s): the subscription has then reached the publisher's node."""
    todo = list(range(len(pubs)))
    deadline = time.monotonic() + ROUTE_TIMEOUT
    pause = 0.05
    while todo:
        if time.monotonic() > deadline:
            raise BenchError(f"pairs {todo} never routed within {ROUTE_TIMEOUT:g} s")
        for i in todo:
            ask(pubs[i], "probe", "probed")
        time.sleep(pause)
        pause = min(pause * 2, 1.0)
        todo = [i for i in todo if ask(subs[i], "count", "count")["probes"] == 0]


def drain(subs: list[Client], sent: int, qos: int) -> list[dict[str, Any]]:
    """Ask the subscribers for their counts until they add up to ``sent``; QoS 0 gives up
    after QUIET seconds without progress (the rest is lost), QoS 1 fails after
    STALL_TIMEOUT."""
    total, progress_at = -1, time.monotonic()
    while True:
        counts = [ask(s, "count", "count") for s in subs]
        received = sum(c["received"] for c in counts)
        now = time.monotonic()
        if received >= sent:
            return counts
        if received != total:
            total, progress_at = received, now
        idle = now - progress_at
        if qos == 0 and idle > QUIET:
            return counts
        if idle > STALL_TIMEOUT:
            raise BenchError(f"QoS {qos}: {received} of {sent} messages arrived, then "
                             f"nothing for {idle:.0f} s")
        time.sleep(0.05)


# --- the figures -----------------------------------------------------------------------------

# key, label, what it runs on (module docstring, "The figures")
FIGURES = (
    ("one-node", "throughput, one node", "single"),
    ("two-nodes", "throughput, two nodes (shared port)", "shared"),
    ("cpu-single", "CPU, one pair, one node (no cluster)", "single"),
    ("cpu-n1", "CPU, one pair, both on n1 (cluster)", "n1"),
    ("cpu-across", "CPU, one pair, n1 -> n2", "across"),
)


@dataclass
class Figure:
    key: str
    label: str
    qos: int
    runs: list[Run] = field(default_factory=list)
    error: str | None = None

    def median(self, value: Any) -> float | None:
        values = [value(r) for r in self.runs]
        return statistics.median(values) if values else None

    def rate(self) -> float | None:
        return self.median(lambda r: r.rate)

    def gateway_us(self, name: str | None = None) -> float | None:
        """Median gateway CPU µs per delivered message: of ``name``, or of all gateways."""
        return self.median(lambda r: r.us_per_msg(
            sum(r.gateway_cpu.values()) if name is None else r.gateway_cpu.get(name, 0.0)))

    def nats_us(self) -> float | None:
        return self.median(lambda r: r.us_per_msg(r.nats_cpu))


def bench(args: argparse.Namespace, workdir: Path) -> dict[tuple[str, int], Figure]:
    """NATS, the single gateway and both nodes started once; per QoS and run, every figure
    in turn (so that a machine drifting during the bench moves them all alike)."""
    figures = {(key, qos): Figure(key, label, qos) for qos in args.qos
               for key, label, _ in FIGURES}
    seq = 0
    with contextlib.ExitStack() as stack:
        nats = stack.enter_context(start_nats_cluster(workdir / "nats", nodes=2,
                                                      cluster="gwbench"))
        log(f"NATS: {', '.join(nats.urls)}")
        shared = free_port(HOST)
        single = stack.enter_context(start_gateway("single", workdir / "single"))
        n1 = stack.enter_context(start_gateway("n1", workdir / "n1", nats.urls[0], shared))
        n2 = stack.enter_context(start_gateway("n2", workdir / "n2", nats.urls[1], shared))
        for g in (single, n1, n2):
            log(f"{g.name}: MQTT on {HOST}:{g.mqtt} (pid {g.pid})")
        log(f"n1 and n2 share MQTT {HOST}:{shared}")
        plans = {
            "single": ([(single.mqtt, single.mqtt)] * args.pairs, [single], None, False),
            "shared": ([(shared, shared)] * args.pairs, [n1, n2], nats, True),
            "n1": ([(n1.mqtt, n1.mqtt)], [n1, n2], nats, False),
            "across": ([(n1.mqtt, n2.mqtt)], [n1, n2], nats, False),
        }
        for rep in range(args.runs):
            for qos in args.qos:
                for key, label, plan in FIGURES:
                    fig = figures[(key, qos)]
                    if fig.error is not None or key not in args.figures:
                        continue
                    pairs, gateways, servers, on_shared = plans[plan]
                    if key.startswith("cpu"):
                        pairs = pairs[:1]
                    seq += 1
                    try:
                        run = run_pairs(args, qos, seq, pairs, gateways, servers, on_shared)
                    except BenchError as exc:
                        fig.error = str(exc)
                        log(f"QoS {qos} {label}: {exc}")
                        continue
                    fig.runs.append(run)
                    cpu = ", ".join(f"{n} {v / run.seconds:.0%}"
                                    for n, v in run.gateway_cpu.items())
                    extra = f"; {run.placement}, {run.crossed:,} crossed" if on_shared else ""
                    log(f"QoS {qos} {label} run {rep + 1}: {run.rate:,.0f} msgs/s, "
                        f"{run.us_per_msg(sum(run.gateway_cpu.values())):.1f} µs/msg "
                        f"(CPU {cpu}, NATS {run.nats_cpu / run.seconds:.0%}; "
                        f"lost {run.lost:,}){extra}")
    return figures


# --- the report ------------------------------------------------------------------------------

def fmt(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def report(figures: dict[tuple[str, int], Figure], args: argparse.Namespace) -> dict[str, Any]:
    """Print the table, the ratios and the model; return the model's numbers for --json."""
    rows: list[tuple[str, ...]] = [("figure", "QoS", "msgs/s", "runs", "gw µs/msg", "n1 µs",
                                    "n2 µs", "NATS µs", "clients", "crossed", "others")]
    for qos in args.qos:
        for key, label, _ in FIGURES:
            fig = figures[(key, qos)]
            if key not in args.figures:
                continue
            if not fig.runs:
                rows.append((label, str(qos), "error" if fig.error else "-", *[""] * 8))
                continue
            run = sorted(fig.runs, key=lambda r: r.rate)[len(fig.runs) // 2]
            busiest = max(run.client_cpu)
            clients = f"{busiest:.0%} max" + (" !" if busiest >= CLIENT_BOUND else "")
            clustered = key not in ("one-node", "cpu-single")
            crossed = (f"{statistics.median(r.crossed / r.delivered for r in fig.runs):.0%}"
                       if clustered else "")
            rows.append((label, str(qos), fmt(fig.rate()),
                         "/".join(f"{r.rate / 1000:.1f}k" for r in fig.runs),
                         fmt(fig.gateway_us(), ".1f"),
                         fmt(fig.gateway_us("n1"), ".1f") if clustered else "",
                         fmt(fig.gateway_us("n2"), ".1f") if clustered else "",
                         fmt(fig.nats_us(), ".1f") if clustered else "",
                         clients, crossed, fmt(fig.median(Run.others), ".2f")))
    print_table(rows)
    print(f"\n{args.payload}-byte payloads; {args.pairs} publisher/subscriber pairs for the "
          f"throughput, one pair for CPU; {args.seconds:g} s of publishing a run"
          + (f" (at most {args.messages:,} messages a publisher)" if args.messages else "")
          + f"; QoS 1 window {args.window}; median of {args.runs} run(s) (each in 'runs'). "
          f"gw µs/msg: CPU of the gateways (user + system) per delivered message, n1 and n2 "
          f"each node's share of it, NATS the two servers'; clients: the busiest client's "
          f"share of one core ('!' at {CLIENT_BOUND:.0%}: it may be the bottleneck); "
          f"crossed: messages that came in through a node's cluster link, per delivered "
          f"message; others: CPUs that other processes kept busy meanwhile (from /proc/stat; "
          f"above a few hundredths the machine was shared and the rates are low). "
          f"Load average at the start "
          f"{' '.join(f'{x:.2f}' for x in args.load_start)}, at the end "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} CPUs.")
    for fig in figures.values():
        if fig.error:
            print(f"\nQoS {fig.qos} {fig.label}: {fig.error}")
        lost = [r.lost for r in fig.runs if r.lost]
        if lost:
            print(f"\nQoS {fig.qos} {fig.label}: messages lost in runs: {lost}")
    model: dict[str, Any] = {}
    for qos in args.qos:
        one, two = figures[("one-node", qos)].rate(), figures[("two-nodes", qos)].rate()
        print(f"\nQoS {qos}: two nodes / one node, same machine: "
              + (f"{two / one:.2f}" if one and two else "n/a"))
        model[str(qos)] = print_model(figures, qos)
    return model


def print_model(figures: dict[tuple[str, int], Figure], qos: int) -> dict[str, Any] | None:
    """The model text (module docstring): what the per-message CPU implies for k nodes."""
    local = figures[("cpu-single", qos)].gateway_us()
    alone = figures[("cpu-n1", qos)].gateway_us("n1")
    across = figures[("cpu-across", qos)]
    pub, sub, nats = across.gateway_us("n1"), across.gateway_us("n2"), across.nats_us()
    if local is None or alone is None or pub is None or sub is None or nats is None:
        print(f"\nQoS {qos}: no model (a CPU figure is missing)")
        return None
    cross = pub + sub

    def speedup(k: int) -> float:
        """k nodes' capacity over one gateway's, interest partitioned at random."""
        return k * local / (alone / k + cross * (k - 1) / k)

    def broadcast(k: int) -> float:
        """Messages a second k nodes take in when every node subscribes to everything."""
        return k / (alone + (k - 1) * sub) * 1e6

    paragraphs = [
        f"Model, QoS {qos} (gateway CPU per message, the medians above). One gateway alone "
        f"spends L = {local:.1f} µs on a message it takes in and delivers. A node of a "
        f"cluster spends F = {alone:.1f} µs ({alone / local:.2f} L) on a message published "
        f"and delivered on it (it also encodes the message and publishes it to NATS, "
        f"whoever subscribes there); a message that "
        f"crosses costs its publisher's node P = {pub:.1f} µs and its subscriber's node "
        f"R = {sub:.1f} µs, P + R = {cross:.1f} µs ({cross / local:.2f} L), and the NATS "
        f"servers {nats:.1f} µs more.",
        "Assumptions: a node is one gateway process, whose event loop uses at most one "
        "core; each node has a core of its own and NATS and the clients have theirs; "
        "clients and topics are spread evenly over the nodes; the costs per message stay "
        "as measured here at some ten thousand messages a second (no gains from larger "
        "batches at higher rates).",
        f"* Interest partitioned (each topic's subscribers on one node, publishers "
        f"anywhere, as in this benchmark): with k nodes a message crosses with probability "
        f"(k-1)/k and costs on average F/k + (P+R)(k-1)/k, so k nodes carry k L / that "
        f"times one gateway's rate: {speedup(2):.2f}x with 2 nodes, {speedup(4):.2f}x "
        f"with 4, {speedup(8):.2f}x with 8, tending to k L/(P+R) = {local / cross:.2f} k. "
        f"NATS needs {nats:.1f} µs of CPU per crossing message besides.",
        f"* Interest everywhere (every node has a subscriber for every topic): each node "
        f"receives every other node's messages at R each, so k nodes take in at most "
        f"k / (F + (k-1) R) messages a second: {broadcast(1):,.0f} with 1, "
        f"{broadcast(2):,.0f} with 2, {broadcast(4):,.0f} with 4, and never more than "
        f"1/R = {1e6 / sub:,.0f} however many nodes; what grows with the nodes is the "
        f"number of subscribers served.",
        "* On one machine the nodes share its cores with each other, with NATS and with "
        "the clients: two nodes on two cores gain only where one gateway's loop was the "
        "limit, and the cluster's extra work (F - L, P + R - L, NATS) comes out of the "
        "same cores.",
    ]
    for text in paragraphs:
        bullet = text.startswith("*")
        if not bullet or text is paragraphs[2]:
            print()
        print(textwrap.fill(text, width=92, subsequent_indent="  " if bullet else ""))
    return {"L_us": local, "F_us": alone, "P_us": pub, "R_us": sub, "nats_us": nats,
            "speedup_2": speedup(2), "speedup_4": speedup(4), "speedup_8": speedup(8),
            "partitioned_limit_per_node": local / cross,
            "everywhere_msgs_per_s": {k: broadcast(k) for k in (1, 2, 4, 8)},
            "everywhere_ceiling_msgs_per_s": 1e6 / sub}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0,
                   help="seconds each publisher publishes in a run")
    p.add_argument("--messages", type=int, default=0,
                   help="at most this many messages a publisher in a run (0: no limit; the "
                        "run ends after --seconds all the same)")
    p.add_argument("--payload", type=int, default=PAYLOAD_SIZE, help="payload bytes")
    p.add_argument("--qos", default="0,1", help="comma-separated, from 0,1 (default: both)")
    p.add_argument("--figures", default=",".join(f[0] for f in FIGURES),
                   help="comma-separated, from " + ",".join(f[0] for f in FIGURES)
                        + " (default: all)")
    p.add_argument("--pairs", type=int, default=4,
                   help="publisher/subscriber pairs of the throughput figures")
    p.add_argument("--window", type=int, default=QOS1_WINDOW,
                   help="QoS 1: unacknowledged messages a publisher may have")
    p.add_argument("--runs", type=int, default=3, help="runs per figure; the median counts")
    p.add_argument("--json", type=Path, help="also write the results to this file")
    p.add_argument("--keep", action="store_true", help="keep the work directories")
    args = p.parse_args(argv)
    try:
        args.qos = sorted({int(q) for q in args.qos.split(",") if q.strip()})
    except ValueError:
        p.error(f"--qos: not a list of numbers: {args.qos!r}")
    if not args.qos or set(args.qos) - {0, 1}:
        p.error("--qos: from 0,1")
    args.figures = [f.strip() for f in args.figures.split(",") if f.strip()]
    unknown = sorted(set(args.figures) - {f[0] for f in FIGURES})
    if unknown or not args.figures:
        p.error(f"--figures: unknown {', '.join(unknown) or '(none given)'}")
    if args.runs < 1 or args.pairs < 1 or args.window < 1 or args.seconds <= 0:
        p.error("--runs, --pairs, --window and --seconds must be positive")
    if not 8 <= args.payload <= 256 * 1024:
        p.error("--payload: 8 bytes to 256 KB")
    return args


def versions() -> dict[str, str]:
    import importlib.metadata
    import subprocess

    out = {}
    for name, dist in (("gateway", "gateway"), ("paho-mqtt", "paho-mqtt"),
                       ("nats-py", "nats-py")):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[name] = importlib.metadata.version(dist)
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(["nats-server", "--version"], capture_output=True, text=True,
                              timeout=10)
        out["nats-server"] = done.stdout.strip().split()[-1] if done.stdout.strip() else "?"
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.load_start = os.getloadavg()
    # The gateways run in work directories: they import this tree's packages (a compiled
    # copy's too, tests/compiled_tree.py), whatever the virtualenv's editable install says.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    workdir = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    try:
        figures = bench(args, workdir)
    except (BrokerFailed, PeerFailedToStart, PeerMissing) as exc:
        print(f"bench_cluster: failed to start: {exc}", file=sys.stderr)
        return 2
    finally:
        if args.keep:
            log(f"work directories kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    info = versions()
    print(f"\nversions: {', '.join(f'{k} {v}' for k, v in info.items())}")
    model = report(figures, args)
    if args.json:
        args.json.write_text(json.dumps({
            "versions": info, "payload_bytes": args.payload, "seconds": args.seconds,
            "messages": args.messages, "pairs": args.pairs, "window": args.window,
            "runs": args.runs,
            "figures": [{"key": f.key, "label": f.label, "qos": f.qos, "msgs_per_s": f.rate(),
                         "gateway_us_per_msg": f.gateway_us(), "error": f.error,
                         "runs": [vars(r) for r in f.runs]} for f in figures.values()],
            "model": model,
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
