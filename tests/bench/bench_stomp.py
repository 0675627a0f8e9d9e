"""STOMP benchmark: the gateway against RabbitMQ's STOMP plugin and ActiveMQ's STOMP connector,
same load, same run: STOMP send -> STOMP subscribe through the gateway, side by side with
RabbitMQ and ActiveMQ. Target: at least RabbitMQ's throughput.

    .venv/bin/python tests/bench/bench_stomp.py                       # defaults below
    .venv/bin/python tests/bench/bench_stomp.py --brokers rabbitmq,activemq --n 50000 --runs 1

How this works. Each broker is started by this script on free ports of 127.0.0.1 and stopped
at the end: RabbitMQ 3.10 through tests/peers/rabbitmq.py (a private node; its STOMP plugin
logs CONNECT frames without login in as guest), ActiveMQ 5.17 through tests/peers/activemq.py
(a private broker with a ``stomp+nio`` connector and a KahaDB store in its work directory, so
that ``persistent:true`` takes its durable path), and the gateway as
``python -m gateway serve --config-dir DIR`` with a generated ``gateway.conf``
(``listen = stomp://127.0.0.1:PORT``, ``store = DIR/data``) and a ``topics.conf`` and a
``queues.conf`` that each hold the single line ``>`` (any destination may be created); all
installed by ``bash tests/peers/install.sh``. A broker that does not come up (it exits, never
listens, or does not answer a STOMP CONNECT with CONNECTED) is reported as "failed to start:
<its output's tail>" and the others still run; one that exits during the runs has its
remaining figures skipped.

The clients are tests/bench/stompload.py's raw-socket STOMP 1.2 clients on asyncio (uvloop),
each in a process of its own (multiprocessing, spawn), so that neither the producer nor the
consumer shares an interpreter (or, when the scheduler can help it, a core) with the other:

* the consumer SUBSCRIBEs first (with a receipt, so the subscription is in place) and counts
  N MESSAGE frames, checking that each body arrived whole;
* the producer then sends N pre-encoded SEND frames (64-byte body, ``content-length``,
  ``persistent``) in batches of --batch messages per write, the last of each batch asking
  for a ``receipt``, with at most --window receipts outstanding (a windowed publisher: the
  broker's buffers stay bounded);
* the figure is N / (time from the producer's first write to the consumer's N-th message),
  the median of --runs runs. Each destination is new (``/queue/bench.<figure>.<k>``,
  ``/topic/bench.<figure>.<k>``), so a failed run leaves nothing for the next.

Every broker runs at once (each on its own ports) and the runs are interleaved -- gateway,
RabbitMQ, ActiveMQ, gateway, ... -- so that a machine that drifts during the bench moves every
broker's figures alike. Before each figure's timed runs, untimed warm-up runs of --warmup
messages per broker let the JVM's JIT, the gateway and the Erlang VM settle: they go on until
one is within 10% of the one before (at most --warmup-runs); ActiveMQ needs 250k to 300k
messages before its rate stops climbing, so its warm-up has at least --jit-warmup (300k)
messages (half for the durable figure).

The figures:

(a) queue: ``/queue/...``, ``persistent:false``, ``ack:auto``;
(b) topic: ``/topic/...``, ``persistent:false``, ``ack:auto`` (one subscriber);
(c) durable queue: ``/queue/...``, ``persistent:true``, ``ack:client-individual`` with an ACK
    for every message (or --durable-ack client: a cumulative ACK every --ack-every messages).

Prefetch: the consumer asks for --prefetch (10000) messages in flight in both dialects,
``activemq.prefetchSize`` (ActiveMQ; its default is 1000 for a queue, 32766 for a topic) and
``prefetch-count`` (RabbitMQ; unlimited by default, and ignored with ``ack:auto``); a broker
ignores the other's header. The durable figure's acknowledging subscription asks for
--acked-prefetch (1000) instead: with 10000 and ``client-individual`` ACKs, ActiveMQ 5.17
stops dispatching a persistent queue after some thousands of messages (6k to 19k of 25k
seen; the producer had its receipts for all of them, the consumer acked all it got), which
it does not do with 1000, nor with cumulative ``client`` ACKs. At 10k msgs/s, 1000 in flight
leave 100 ms for each round trip: not the limit. ``persistent`` is sent explicitly (ActiveMQ's STOMP and
RabbitMQ's make a message without it non-persistent; the gateway might follow the JMS
default, persistent), except ``persistent:false`` to RabbitMQ: RabbitMQ 3.10 answers a SEND
with ``persistent:false`` to an existing ``/queue/`` with an ERROR (RESOURCE_LOCKED, "cannot
obtain exclusive access to locked queue"), so its non-persistent SENDs carry no such header.

Each client's CPU time (user + system, over its timed window) and the broker's (its process
and their children, from /proc/PID/stat) are reported as a share of the window: a client near 100% of its one core may
be the bottleneck, and the table marks it with "!"; the "machine" column adds them up as a
share of all the CPUs (2 here: three busy processes compete for them, so read it before the
ratios).

Target: the gateway at least matches RabbitMQ on every figure (ratio gateway / RabbitMQ >= 1);
gateway / ActiveMQ is printed for information.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "bench"))

import stompload  # noqa: E402
from bench_amqp import CLIENT_BOUND, process_alive, process_cpu  # noqa: E402
from bench_mqtt import HOST, BenchError, BrokerFailed, log  # noqa: E402
from peers.activemq import start_activemq, stomp_ping  # noqa: E402
from peers.mosquitto import (  # noqa: E402
    PeerFailedToStart,
    PeerMissing,
    free_port,
    stop_process,
    tail,
    wait_listening,
)
from peers.rabbitmq import start_rabbitmq  # noqa: E402

BROKERS = ("gateway", "rabbitmq", "activemq")
START_TIMEOUT = 20.0  # the gateway opens its store before it listens
# A client that sees no progress for this long ends the run as failed.
STALL_TIMEOUT = 30.0
# How long a client process may take to start and connect.
READY_TIMEOUT = 60.0
TARGET_VS_RABBITMQ = 1.0  # target: at least RabbitMQ's throughput
# Warm-up runs go on until one is within this share of the one before (or --warmup-runs).
# ActiveMQ's JVM needs 250k to 300k messages of a path before its JIT has compiled it (its
# rate climbs from 5k to 50k msgs/s meanwhile); RabbitMQ and the gateway have no JIT.
WARM_WITHIN = 0.10
# ... and, for a broker named here, not before --jit-warmup messages (half for the durable
# figure): ActiveMQ's climb is not steady enough for the rule above alone (10k, 19k, 18k, then
# 44k msgs/s seen).
JIT_BROKERS = ("activemq",)

# The figures: key, label, destination kind, persistent, ack mode (None: --durable-ack).
FIGURES: tuple[tuple[str, str, str, bool, str | None], ...] = (
    ("queue", "queue, non-persistent, ack auto", "queue", False, "auto"),
    ("topic", "topic, non-persistent, ack auto", "topic", False, "auto"),
    ("queue-durable", "queue, persistent, acked", "queue", True, None),
)


# --- brokers ---------------------------------------------------------------------------------


@dataclass
class Broker:
    """A started broker: its STOMP port, the ``host`` header it wants, its pid (for CPU) and
    what its output says."""

    name: str
    port: int
    pid: int
    vhost: str
    output_tail: Callable[[], str]
    # Whether SEND may say persistent:false; else non-persistent messages carry no such header.
    explicit_nonpersistent: bool = True


@contextlib.contextmanager
def run_gateway(workdir: Path) -> Iterator[Broker]:
    port = free_port(HOST)
    conf = workdir / "conf"
    conf.mkdir(exist_ok=True)
    (conf / "gateway.conf").write_text(
        f"listen = stomp://{HOST}:{port}\nstore = {workdir / 'data'}\n"
    )
    (conf / "topics.conf").write_text(">\n")  # any topic may be created
    (conf / "queues.conf").write_text(">\n")  # any queue may be created
    argv = [sys.executable, "-m", "gateway", "serve", "--config-dir", str(conf)]
    output = workdir / "gateway.out"
    with output.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        try:
            wait_listening(HOST, port, proc, START_TIMEOUT)
            problem = stomp_ping(HOST, port)
        except PeerFailedToStart as exc:
            problem = str(exc)
        if problem is None and proc.poll() is not None:
            problem = f"exited with status {proc.returncode}"
        if problem is not None:
            raise BrokerFailed(f"{problem}\n{tail(output, 15)}".rstrip())
        yield Broker("gateway", port, proc.pid, "localhost", lambda: tail(output, 15))
    finally:
        stop_process(proc)


@contextlib.contextmanager
def start_broker(name: str, workdir: Path) -> Iterator[Broker]:
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        if name == "rabbitmq":
            with start_rabbitmq(workdir) as node:
                log(f"rabbitmq: started in {node.startup_seconds:.1f} s")
                # RabbitMQ takes the CONNECT frame's host header as the virtual host. It
                # answers a SEND with persistent:false to an existing /queue/ with an ERROR
                # (RESOURCE_LOCKED): the header is left out, transient being its default.
                yield Broker(name, node.stomp_port, node.pid, "/", node.log_tail, False)
        elif name == "activemq":
            with start_activemq(workdir, persistent=True) as amq:
                log(f"activemq: started in {amq.startup_seconds:.1f} s")
                yield Broker(name, amq.stomp_port, amq.pid, "localhost", amq.log_tail)
        elif name == "gateway":
            with run_gateway(workdir) as gw:
                yield gw
        else:
            raise BrokerFailed(f"unknown broker {name!r}")
    except (PeerMissing, PeerFailedToStart) as exc:
        raise BrokerFailed(str(exc)) from None


def versions(names: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, package in (("rabbitmq", "rabbitmq-server"), ("activemq", "activemq")):
        if name in names:
            done = subprocess.run(
                ["dpkg-query", "-W", "-f", "${Version}", package], capture_output=True, text=True
            )
            out[name] = done.stdout.strip() or "not installed"
    if "gateway" in names:
        try:
            import gateway

            out["gateway"] = gateway.__version__
        except ImportError:
            out["gateway"] = "?"
    try:
        out["clients"] = f"uvloop {importlib.metadata.version('uvloop')}"
    except importlib.metadata.PackageNotFoundError:
        out["clients"] = "asyncio"
    return out


# --- one run ---------------------------------------------------------------------------------


@dataclass
class Run:
    rate: float
    client_cpu: dict[str, float]  # client -> share of the timed window
    broker_cpu: float
    producer_rate: float  # N / (first write to last receipt)
    machine_busy: float  # cores busy (all processes) during the run, from /proc/stat


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` and of its descendants that run now
    (the gateway's log writer, the Erlang VM's helpers), from /proc/PID/stat."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += process_cpu(p)
        todo.extend(children.get(p, ()))
    return total


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat's "cpu" line."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
    return total - idle, total


def expect(conn: Connection, proc: multiprocessing.process.BaseProcess, what: str,
           timeout: float) -> dict[str, Any]:
    """The next message of a client process: its payload when it is ``what``, BenchError when
    it is an error, the process died or ``timeout`` passed."""
    if not conn.poll(timeout):
        state = "exited" if not proc.is_alive() else "still running"
        raise BenchError(f"{proc.name}: no {what!r} after {timeout:g} s ({state})")
    try:
        kind, payload = conn.recv()
    except EOFError:
        raise BenchError(f"{proc.name}: exited (status {proc.exitcode}) before {what!r}") from None
    if kind == "error":
        raise BenchError(f"{proc.name}: {payload}")
    if kind != what:
        raise BenchError(f"{proc.name}: {kind!r} instead of {what!r}")
    return payload or {}


def run_once(broker: Broker, figure: tuple[str, str, str, bool, str | None], count: int,
             seq: int, args: argparse.Namespace) -> Run:
    key, _, kind, persistent, ack = figure
    ack = ack or args.durable_ack
    base = {
        "host": HOST,
        "port": broker.port,
        "vhost": broker.vhost,
        "destination": f"/{kind}/bench.{key}.{seq}",
        "count": count,
        "stall": STALL_TIMEOUT,
    }
    prefetch = args.prefetch if ack == "auto" else args.acked_prefetch
    consumer_spec = {**base, "ack": ack, "ack_every": args.ack_every, "prefetch": prefetch}
    header: bool | None = persistent if persistent or broker.explicit_nonpersistent else None
    producer_spec = {**base, "persistent": header, "batch": args.batch, "window": args.window}
    ctx = multiprocessing.get_context("spawn")
    procs: list[multiprocessing.process.BaseProcess] = []
    conns: list[Connection] = []
    finished = False
    try:
        c_conn, c_child = ctx.Pipe()
        consumer = ctx.Process(target=stompload.consumer_main, args=(c_child, consumer_spec),
                               name="consumer", daemon=True)
        consumer.start()
        c_child.close()
        procs.append(consumer)
        conns.append(c_conn)
        expect(c_conn, consumer, "ready", READY_TIMEOUT)
        p_conn, p_child = ctx.Pipe()
        producer = ctx.Process(target=stompload.producer_main, args=(p_child, producer_spec),
                               name="producer", daemon=True)
        producer.start()
        p_child.close()
        procs.append(producer)
        conns.append(p_conn)
        expect(p_conn, producer, "ready", READY_TIMEOUT)
        cpu0, wall0, jiffies0 = tree_cpu(broker.pid), time.monotonic(), machine_jiffies()
        p_conn.send("go")
        sent = expect(p_conn, producer, "done", args.timeout)
        received = expect(c_conn, consumer, "done", args.timeout)
        cpu1, wall1, jiffies1 = tree_cpu(broker.pid), time.monotonic(), machine_jiffies()
        finished = True
    finally:
        # Closing our ends first ends a client still waiting for "go"; one that finished
        # only disconnects now (a few ms), one that failed gets no time.
        for conn in conns:
            conn.close()
        for proc in procs:
            proc.join(10 if finished else 1)
            if proc.is_alive():
                proc.kill()
                proc.join()
    if received["received"] != count or received["whole"] != count:
        raise BenchError(
            f"received {received['received']} frames, {received['whole']} whole messages; "
            f"expected {count}"
        )
    elapsed = received["last_at"] - sent["started_at"]
    if elapsed <= 0:
        raise BenchError(f"the run took {elapsed * 1000:g} ms: too few messages to time")
    confirmed = sent["confirmed_at"] - sent["started_at"]
    cpu = {
        "producer": sent["cpu"] / (sent["confirmed_at"] - sent["started_at"]),
        "consumer": received["cpu"] / (received["last_at"] - sent["started_at"]),
    }
    busy = (jiffies1[0] - jiffies0[0]) / max(1, jiffies1[1] - jiffies0[1]) * (os.cpu_count() or 1)
    return Run(count / elapsed, cpu, (cpu1 - cpu0) / (wall1 - wall0), count / confirmed, busy)


# --- the run ---------------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    start_error: str | None = None
    runs: dict[str, list[Run]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    exited: bool = False
    warmups: dict[str, list[float]] = field(default_factory=dict)  # rates of the warm-up runs

    def rate(self, key: str) -> float | None:
        runs = self.runs.get(key)
        return statistics.median(r.rate for r in runs) if runs else None

    def median_run(self, key: str) -> Run | None:
        runs = sorted(self.runs.get(key, []), key=lambda r: r.rate)
        return runs[len(runs) // 2] if runs else None


def figure_count(key: str, args: argparse.Namespace) -> int:
    return int(args.durable_n if key == "queue-durable" else args.n)


def bench(names: list[str], args: argparse.Namespace, workdir: Path) -> dict[str, Result]:
    """Every broker started at once; per figure, one warm-up run each, then the timed runs
    interleaved (gateway, rabbitmq, activemq, gateway, ...)."""
    results = {name: Result(name) for name in names}
    seq = 0
    with contextlib.ExitStack() as stack:
        running: dict[str, Broker] = {}
        for name in names:
            try:
                broker = stack.enter_context(start_broker(name, workdir / name))
            except BrokerFailed as exc:
                results[name].start_error = str(exc)
                log(f"{name}: failed to start: {exc}")
                continue
            log(f"{name}: STOMP on {HOST}:{broker.port} (pid {broker.pid})")
            running[name] = broker

        def measure(name: str, figure: tuple[str, str, str, bool, str | None],
                    count: int) -> Run | None:
            nonlocal seq
            key, label = figure[0], figure[1]
            result, broker = results[name], running[name]
            if result.exited or key in result.errors:
                return None
            seq += 1
            try:
                return run_once(broker, figure, count, seq, args)
            except BenchError as exc:
                result.errors[key] = str(exc)
                log(f"{name}: {label}: {exc}\n{broker.output_tail()}")
                if not process_alive(broker.pid):
                    result.exited = True
                    result.errors[key] += f"; {name} exited:\n{broker.output_tail()}"
                    log(f"{name}: exited; its remaining figures are skipped")
                return None

        for figure in FIGURES:
            key, label = figure[0], figure[1]
            if key not in args.figures:
                continue
            count = figure_count(key, args)
            warm_count = max(1, args.warmup // 2) if key == "queue-durable" else args.warmup
            for name in running if args.warmup > 0 else ():
                previous = 0.0
                jit = args.jit_warmup if name in JIT_BROKERS else 0
                least = -(-jit // args.warmup)  # runs, rounded up
                for i in range(max(args.warmup_runs, least)):
                    run = measure(name, figure, warm_count)
                    if run is None:
                        break
                    log(f"{name}: {label}: warm-up {i + 1}: {run.rate:,.0f} msgs/s")
                    results[name].warmups.setdefault(key, []).append(run.rate)
                    steady = previous and abs(run.rate - previous) <= WARM_WITHIN * previous
                    if steady and i + 1 >= least:
                        break
                    previous = run.rate
            for rep in range(args.runs):
                for name in running:
                    run = measure(name, figure, count)
                    if run is None:
                        continue
                    cpu = ", ".join(f"{c} {v:.0%}" for c, v in run.client_cpu.items())
                    log(
                        f"{name}: {label} run {rep + 1}: {run.rate:,.0f} msgs/s "
                        f"(producer confirmed at {run.producer_rate:,.0f}/s; CPU: {cpu}, "
                        f"broker {run.broker_cpu:.0%})"
                    )
                    results[name].runs.setdefault(key, []).append(run)
        for result in results.values():  # a figure that failed once has no median
            for key in result.errors:
                result.runs.pop(key, None)
    return results


def report(results: dict[str, Result], info: dict[str, str], args: argparse.Namespace) -> None:
    cpus = os.cpu_count() or 1
    load_start = " ".join(f"{x:.2f}" for x in args.load_start)
    load_end = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = [("figure", "broker", "msgs/s", "runs", "warm-up", "client CPU", "broker CPU",
             "machine", "others")]
    for key, label, *_ in FIGURES:
        if key not in args.figures:
            continue
        for r in results.values():
            if r.start_error is not None:
                continue
            run, rate = r.median_run(key), r.rate(key)
            if run is None or rate is None:
                failed = "error" if key in r.errors else "-"
                rows.append((label, r.name, failed, "", "", "", "", "", ""))
                continue
            busiest = max(run.client_cpu.values())
            mark = " !" if busiest >= CLIENT_BOUND else ""
            clients = " ".join(f"{v:.0%}" for v in run.client_cpu.values())
            ours = sum(run.client_cpu.values()) + run.broker_cpu
            others = max(0.0, run.machine_busy - ours)
            each = "/".join(f"{x.rate / 1000:.0f}k" for x in r.runs[key])
            warmups = r.warmups.get(key, [])
            warm = "/".join(f"{x / 1000:.0f}k" for x in warmups)
            if len(warmups) > 6:
                warm = f"{len(warmups)}: {warmups[0] / 1000:.0f}k..{warmups[-1] / 1000:.0f}k"
            rows.append((label, r.name, f"{rate:,.0f}", each, warm, clients + mark,
                         f"{run.broker_cpu:.0%}", f"{ours / cpus:.0%}", f"{others:.0%}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print()
    for i, row in enumerate(rows):
        print(
            " | ".join(
                c.ljust(w) if j < 2 else c.rjust(w)
                for j, (c, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
        )
        if i == 0:
            print("-+-".join("-" * w for w in widths))
    durable_ack = (
        "client-individual, every message acked"
        if args.durable_ack == "client-individual"
        else f"client, a cumulative ACK every {args.ack_every}"
    )
    print(
        f"\nversions: {', '.join(f'{k} {v}' for k, v in info.items())}; "
        f"{stompload.PAYLOAD_SIZE}-byte bodies; N = {args.n:,} (durable {args.durable_n:,}); "
        f"median of {args.runs} run(s) (each listed in 'runs'), after warm-up runs of "
        f"{args.warmup:,} messages (until one is within {WARM_WITHIN:.0%} of the one before, "
        f"at most {args.warmup_runs}, for ActiveMQ not before {args.jit_warmup:,} messages: "
        f"'warm-up' lists them, or their number, first and last); batches of {args.batch} SENDs, {args.window} receipts outstanding; "
        f"prefetch {args.prefetch} (acked: {args.acked_prefetch}); durable figure: {durable_ack}. client CPU: share of one "
        f"core (producer, consumer), '!' at {CLIENT_BOUND:.0%} or more: the client may be the "
        f"bottleneck; broker CPU: share of one core; machine: clients and broker together, "
        f"share of all {cpus} CPUs; others: what other processes used meanwhile, in cores "
        f"(from /proc/stat; above a few %, the machine was shared and the figures are low). "
        f"Load average at the start {load_start}, at the end {load_end}"
    )
    for r in results.values():
        if r.start_error is not None:
            print(f"\n{r.name}: failed to start: {r.start_error}")
        for key, err in r.errors.items():
            print(f"\n{r.name} {key}: {err}")

    gw = results.get("gateway")
    if gw is None:
        return
    for other, target in (("rabbitmq", TARGET_VS_RABBITMQ), ("activemq", None)):
        peer = results.get(other)
        if peer is None:
            continue
        goal = f"target >= {target:g}" if target is not None else "for information"
        print(f"\nratios gateway / {other} ({goal}):")
        for key, label, *_ in FIGURES:
            if key not in args.figures:
                continue
            mine, theirs = gw.rate(key), peer.rate(key)
            if mine is None or theirs is None or theirs == 0:
                print(f"  {label:<34} n/a")
                continue
            value = mine / theirs
            verdict = ""
            if target is not None:
                verdict = "  meets" if value >= target else "  MISSES"
            print(f"  {label:<34} {value:6.2f}{verdict}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--brokers", default=",".join(BROKERS),
                   help="comma-separated, from gateway,rabbitmq,activemq (default: all)")
    p.add_argument("--figures", default=",".join(f[0] for f in FIGURES),
                   help="comma-separated, from queue,topic,queue-durable (default: all)")
    p.add_argument("--n", type=int, default=200_000,
                   help="messages per run of the queue and topic figures")
    p.add_argument("--durable-n", type=int, default=None,
                   help="messages per run of the durable figure (default: half of --n)")
    p.add_argument("--runs", type=int, default=3, help="runs per figure; the median counts")
    p.add_argument("--warmup", type=int, default=50_000,
                   help="messages per untimed warm-up run (half for the durable figure; "
                        "0: no warm-up)")
    p.add_argument("--jit-warmup", type=int, default=300_000,
                   help="ActiveMQ's warm-up has at least this many messages (half for the "
                        "durable figure), for its JIT; 0: no minimum")
    p.add_argument("--warmup-runs", type=int, default=8,
                   help=f"warm-up runs at most per broker and figure; they stop once one is "
                        f"within {WARM_WITHIN:.0%} of the one before")
    p.add_argument("--batch", type=int, default=1000,
                   help="SEND frames per write; the last asks for a receipt")
    p.add_argument("--window", type=int, default=10,
                   help="receipts the producer may have outstanding")
    p.add_argument("--prefetch", type=int, default=10_000,
                   help="activemq.prefetchSize and prefetch-count of an ack:auto subscription")
    p.add_argument("--acked-prefetch", type=int, default=1_000,
                   help="the same for the durable figure's acknowledging subscription (ActiveMQ "
                        "stalls there with 10000)")
    p.add_argument("--durable-ack", choices=("client-individual", "client"),
                   default="client-individual", help="ack mode of the durable figure")
    p.add_argument("--ack-every", type=int, default=100,
                   help="with --durable-ack client: a cumulative ACK every this many messages")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds one run may take before it counts as failed")
    p.add_argument("--json", type=Path, help="also write the results to this file")
    p.add_argument("--keep", action="store_true", help="keep the brokers' work directories")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.brokers.split(",") if n.strip()]
    unknown = sorted(set(names) - set(BROKERS))
    if unknown or not names:
        p.error(f"--brokers: unknown {', '.join(unknown) or '(none given)'}")
    figures = [f.strip() for f in args.figures.split(",") if f.strip()]
    bad = sorted(set(figures) - {f[0] for f in FIGURES})
    if bad or not figures:
        p.error(f"--figures: unknown {', '.join(bad) or '(none given)'}")
    if args.runs < 1 or args.n < 1 or args.batch < 1 or args.window < 1:
        p.error("--runs, --n, --batch and --window must be at least 1")
    if args.durable_n is None:
        args.durable_n = max(1, args.n // 2)
    args.broker_names = names
    args.figures = figures
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-stomp-"))
    args.load_start = os.getloadavg()
    try:
        results = bench(args.broker_names, args, workdir)
    finally:
        if args.keep:
            log(f"work directories kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    info = versions(args.broker_names)
    report(results, info, args)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "versions": info,
                    "payload_bytes": stompload.PAYLOAD_SIZE,
                    "n": args.n,
                    "durable_n": args.durable_n,
                    "runs": args.runs,
                    "batch": args.batch,
                    "window": args.window,
                    "prefetch": args.prefetch,
                    "acked_prefetch": args.acked_prefetch,
                    "durable_ack": args.durable_ack,
                    "results": {
                        n: {
                            "start_error": r.start_error,
                            "msgs_per_s": {k: r.rate(k) for k in r.runs},
                            "runs": {k: [vars(run) for run in v] for k, v in r.runs.items()},
                            "warmup_rates": r.warmups,
                            "errors": r.errors,
                        }
                        for n, r in results.items()
                    },
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
