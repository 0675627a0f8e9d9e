"""Overload benchmark: the gateway against mosquitto under fleet-sized MQTT loads, same run.

    .venv/bin/python tests/bench/bench_overload.py --quick          # every part, small (< 1 min)
    .venv/bin/python tests/bench/bench_overload.py                  # every part, full size
    .venv/bin/python tests/bench/bench_overload.py --retained --retained-count 1000000
    .venv/bin/python tests/bench/bench_overload.py --overload --duration 120 --brokers gateway

How this works. Each part starts each broker afresh, one after the other, on a free port of
127.0.0.1: mosquitto with its defaults (tests/peers/mosquitto.py: one loopback listener,
anonymous clients, no persistence; so its default limits hold, such as 1000 queued QoS 1
messages a client), and the gateway as ``python -m gateway serve`` with the embedded default
configuration (gateway/defaults/, copied) but for its listeners (MQTT and HTTP on free
loopback ports) and its store (in the run's temporary directory). The clients all live in this process on one event loop
(uvloop when installed): raw sockets driven by :class:`Client`, an asyncio protocol that
writes pre-encoded CONNECT / SUBSCRIBE / PUBLISH packets, acknowledges QoS 1 deliveries and
counts what arrives with a small packet reader; RLIMIT_NOFILE is raised to its hard limit
(the brokers, started from here, inherit it). RSS is VmRSS of the broker's process, CPU the
broker's user + system time (with its child processes).

The parts (each chosen by its flag; none given: all):

``--overload``
    ``--connections`` connections (default 10,000): ``--publishers`` publishers, the rest
    subscribers; subscriber *i* subscribes to ``load/<i mod T>`` (T = subscribers /
    ``--fanout``), at QoS 0 or 1 alternately, and every tenth (``--stuck`` 0.1) never reads
    after its SUBACK. The publishers send ``--rate`` messages a second in all (QoS 0 and 1
    alternately, to random topics) of ``--payload-size`` bytes (2 KB: with 1,000 messages a
    second over 990 topics a subscriber is owed about 2 KB a second, so a stuck one, whose
    receive buffer is made small, has its backlog pile up in the broker within a minute
    rather than in the kernel for the whole run) for ``--duration`` seconds.
    ``--stuck-filter 'load/#'`` makes the stuck ones owe the whole stream instead (each
    message then goes to every stuck subscriber: a far heavier load). Every ``--interval``
    seconds a line: the broker's RSS and CPU, messages received by the healthy subscribers
    a second, messages published a second, how many the healthy subscribers are behind
    (deliveries owed to them so far minus received) and the drops the broker itself
    reports (the gateway: ``dropped`` plus ``rejected`` of /api/v1/server, the latter the
    publishes it refused, as at its ``max_msg_memory``; polled off the load's path;
    mosquitto: ``$SYS/broker/publish/messages/dropped``, published every 10 s). After the
    load the healthy subscribers are given until they are quiet for 3 s; what they still
    miss is lost. The run stops early when the broker's RSS passes ``--rss-limit`` (4 GB).
``--storm``
    ``--storm-devices`` devices (default 10,000) connect in bursts of ``--burst`` (500): the
    next burst starts when the previous one's TCP connections are made. Each writes CONNECT
    and SUBSCRIBE (``dev/<i>/cmd``, QoS 1) at once; a device is served when it has its
    CONNACK and SUBACK. A device whose connection fails retries after 0.5 s. Figures: the
    time until all are served, the median and 99th percentile from a device's first
    attempt, and the retries.
``--commands``
    ``--cmd-devices`` devices (5,000) each subscribed to its own ``cmd/<i>``;
    ``--cmd-publishers`` connections send ``--command-count`` commands (200,000) to random
    devices at ``--command-qos`` (QoS 1 publishers keep at most 1,000 unacknowledged); the
    figure is commands / seconds from the first write to the last command received.
``--retained``
    ``--retained-count`` (1,000,000) retained messages of ``--retained-size`` bytes (32) on
    distinct topics ``ret/<i>``, pipelined at QoS 0 and closed by a QoS 1 publish whose
    PUBACK says the broker has taken them all. Figures: the broker's RSS growth per retained
    message (RSS 2 s after the last PUBACK against RSS before the first publish) and the
    seconds from a new ``ret/#`` subscriber's SUBSCRIBE until it has them all.

``--quick`` runs every part small (a few hundred connections, seconds of load, 10,000
retained): a check that the script works, in under a minute, not a measurement. The figures
are indicative on a machine shared with other work: the clients share the CPUs with the
broker, and their own CPU use is printed with each overload line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import shutil
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "bench"))

from adminapi import admin_get  # noqa: E402
from bench_amqp import process_cpu  # noqa: E402
from bench_mqtt import (  # noqa: E402
    HOST,
    BenchError,
    BrokerFailed,
    Running,
    log,
    raise_nofile,
    read_rss,
    remaining_length,
    run_process,
)
from bench_stomp import tree_cpu  # noqa: E402
from peers.mosquitto import (  # noqa: E402
    PeerFailedToStart,
    PeerMissing,
    free_port,
    start_mosquitto,
)

BROKERS = ("gateway", "mosquitto")
PARTS = ("overload", "storm", "commands", "retained")
CMD_PAYLOAD = b'{"cmd":"reboot","at":0000000000}'  # 32 bytes
PUB_WINDOW = 1000  # unacknowledged QoS 1 publishes a publisher keeps (ids stay unique)
WRITE_HIGH = 1 << 20  # bytes a client buffers before it waits for its socket
QUIET = 3.0  # seconds without a delivery that end a wait for stragglers
CONNECT_WAVE = 500  # connections opened at once when setting up a part
STUCK_RCVBUF = 4096  # SO_RCVBUF of a stuck subscriber (the kernel doubles it)


# --- MQTT 3.1.1 packets, pre-encoded ----------------------------------------------------------

def packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + remaining_length(len(body)) + body


def utf8(s: str) -> bytes:
    b = s.encode()
    return len(b).to_bytes(2, "big") + b


def connect(client_id: str, keepalive: int = 0) -> bytes:
    """CONNECT (MQTT 3.1.1 3.1): clean session, no will, no credentials."""
    return packet(0x10, b"\x00\x04MQTT\x04\x02" + keepalive.to_bytes(2, "big") + utf8(client_id))


def subscribe(topic_filter: str, qos: int, pid: int = 1) -> bytes:
    return packet(0x82, pid.to_bytes(2, "big") + utf8(topic_filter) + bytes([qos]))


def publish(topic: str, payload: bytes, qos: int = 0, pid: int = 0, retain: bool = False) -> bytes:
    first = 0x30 | (qos << 1) | (1 if retain else 0)
    return packet(first, utf8(topic) + (pid.to_bytes(2, "big") if qos else b"") + payload)


class Client(asyncio.Protocol):
    """One MQTT connection: writes ``hello`` (CONNECT, maybe SUBSCRIBE) when connected, then
    counts what arrives; QoS 1 deliveries are acknowledged, once per read. A ``stuck`` client
    stops reading once it has its SUBACK. ``on_publish`` (if set) sees each PUBLISH's first
    byte and topic."""

    def __init__(self, hello: bytes, *, stuck: bool = False,
                 on_publish: Callable[[int, bytes, bytes], None] | None = None) -> None:
        self.hello = hello
        self.stuck = stuck
        self.on_publish = on_publish
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.received = 0  # PUBLISH packets
        self.retained = 0  # of which with the retain flag
        self.pubacks = 0
        self.connack: float = 0.0  # time.monotonic() of its arrival
        self.suback: float = 0.0
        self.closed = False
        self.writable = asyncio.Event()
        self.writable.set()
        self.acked = asyncio.Event()
        self.next_pid = 1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(self.hello)  # type: ignore[attr-defined]
        transport.set_write_buffer_limits(high=WRITE_HIGH)  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.writable.set()
        self.acked.set()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        n = len(buf)
        pos = 0
        acks: list[bytes] = []
        on_publish = self.on_publish
        while n - pos >= 2:
            i = pos + 1
            length = shift = 0
            while i < n:
                b = buf[i]
                i += 1
                length |= (b & 0x7F) << shift
                shift += 7
                if b < 0x80:
                    break
            else:
                break
            end = i + length
            if end > n:
                break
            first = buf[pos]
            kind = first & 0xF0
            if kind == 0x30:
                self.received += 1
                if first & 0x01:
                    self.retained += 1
                if first & 0x06 or on_publish is not None:
                    tlen = (buf[i] << 8) | buf[i + 1]
                    if first & 0x06:
                        acks.append(b"\x40\x02" + buf[i + 2 + tlen:i + 4 + tlen])
                    if on_publish is not None:
                        q = i + 2 + tlen + (2 if first & 0x06 else 0)
                        on_publish(first, buf[i + 2:i + 2 + tlen], buf[q:end])
            elif kind == 0x40:
                self.pubacks += 1
                self.acked.set()
            elif kind == 0x20:
                self.connack = time.monotonic()
            elif kind == 0x90:
                self.suback = time.monotonic()
                if self.stuck and self.transport is not None:
                    self.transport.pause_reading()
            pos = end
        self.buf = buf[pos:] if pos < n else b""
        if acks and self.transport is not None:
            self.transport.write(b"".join(acks))

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def pid(self) -> int:
        pid = self.next_pid
        self.next_pid = pid % 65535 + 1
        return pid

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()


async def open_clients(port: int, hellos: list[bytes], *, stuck: Callable[[int], bool] | None = None,
                       timeout: float, served: Callable[[Client], bool] | None = None
                       ) -> list[Client]:
    """Connect one client per ``hellos`` entry, ``CONNECT_WAVE`` at a time, and wait until each
    is ``served`` (default: has its CONNACK)."""
    clients: list[Client] = []
    is_served = served or (lambda c: c.connack > 0)
    deadline = time.monotonic() + timeout
    for start in range(0, len(hellos), CONNECT_WAVE):
        wave = [Client(h, stuck=bool(stuck and stuck(start + k)))
                for k, h in enumerate(hellos[start:start + CONNECT_WAVE])]
        results = await asyncio.gather(*(dial(c, port) for c in wave), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for c in clients + wave:
                c.close()
            raise BenchError(f"{len(errors)} connections failed (first: {errors[0]!r})")
        clients += wave
        await wait_until(lambda wave=wave: all(is_served(c) for c in wave),  # type: ignore[misc]
                         deadline, f"{len(wave)} clients served")
    return clients


async def dial(client: Client, port: int) -> None:
    """Connect ``client``; a stuck one with a small receive buffer, so what the broker owes
    it piles up in the broker rather than in the kernel (which would hold megabytes)."""
    loop = asyncio.get_running_loop()
    if not client.stuck:
        await loop.create_connection(lambda: client, HOST, port)
        return
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, STUCK_RCVBUF)
        sock.setblocking(False)
        await loop.sock_connect(sock, (HOST, port))
    except OSError:
        sock.close()
        raise
    await loop.create_connection(lambda: client, sock=sock)


async def wait_until(cond: Callable[[], bool], deadline: float, what: str,
                     step: float = 0.05) -> None:
    while not cond():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out waiting for {what}")
        await asyncio.sleep(step)


async def send_all(client: Client, data: bytes, chunk: int = 1 << 18) -> None:
    """Write ``data`` as the socket takes it."""
    for pos in range(0, len(data), chunk):
        await client.writable.wait()
        if client.closed:
            raise BenchError("the broker closed a publisher's connection")
        client.write(data[pos:pos + chunk])


async def quiet(count: Callable[[], int], limit: float, still: float = QUIET) -> None:
    """Return once ``count()`` has not changed for ``still`` seconds (or after ``limit``)."""
    end = time.monotonic() + limit
    last, since = count(), time.monotonic()
    while time.monotonic() < end:
        await asyncio.sleep(0.2)
        now = count()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= still:
            return


def close_all(clients: list[Client]) -> None:
    for c in clients:
        c.close()


# --- brokers ----------------------------------------------------------------------------------

@dataclass
class Broker:
    running: Running
    http_port: int = 0  # the gateway's admin API

    @property
    def port(self) -> int:
        return self.running.port

    @property
    def pid(self) -> int:
        return self.running.pid

    def rss(self) -> int:
        return read_rss(self.running.pid)

    def cpu(self) -> float:
        return tree_cpu(self.running.pid)


@contextlib.contextmanager
def start_broker(name: str, workdir: Path) -> Iterator[Broker]:
    workdir.mkdir(parents=True, exist_ok=True)
    if name == "mosquitto":
        try:
            with start_mosquitto(workdir) as m:
                yield Broker(Running(name, m.port, m.pid, m.log_tail, m.stop))
        except (PeerMissing, PeerFailedToStart) as exc:
            raise BrokerFailed(str(exc)) from None
        return
    port, http = free_port(HOST), free_port(HOST)
    conf = workdir / "conf"
    shutil.copytree(ROOT / "gateway" / "defaults", conf)  # the embedded default, but for:
    kept = [line for line in (conf / "gateway.conf").read_text().splitlines()
            if not line.startswith(("listen", "store ", "store="))]
    (conf / "gateway.conf").write_text("\n".join(
        [*kept, f"listen = mqtt://{HOST}:{port}", f"listen = http://{HOST}:{http}",
         f"store = {workdir / 'data'}", ""]))
    argv = [sys.executable, "-m", "gateway", "serve", "--config-dir", str(conf)]
    with run_process(name, argv, workdir, port) as running:
        yield Broker(running, http)


def gateway_dropped(broker: Broker) -> int | None:
    """``dropped`` + ``rejected`` of the gateway's /api/v1/server (None: no answer)."""
    try:
        info = admin_get(broker.http_port, "/api/v1/server", host=HOST, timeout=30)
        return int(info.get("dropped", 0)) + int(info.get("rejected", 0))
    except (OSError, ValueError):
        return None


async def poll_gateway_dropped(broker: Broker, drops: list[int], interval: float) -> None:
    """Keep ``drops`` at the gateway's latest figure, off the load's path (a loaded gateway
    may take seconds to answer)."""
    loop = asyncio.get_running_loop()
    while True:
        value = await loop.run_in_executor(None, gateway_dropped, broker)
        if value is not None:
            drops[:] = [value]
        await asyncio.sleep(interval)


# --- the parts ----------------------------------------------------------------------------------

@dataclass
class Result:
    name: str
    figures: dict[str, Any] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    error: str | None = None


async def run_overload(name: str, broker: Broker, args: argparse.Namespace,
                       result: Result) -> None:
    n_pub = min(args.publishers, args.connections - 1)
    n_sub = args.connections - n_pub
    topics = max(1, n_sub // args.fanout)
    every = round(1 / args.stuck) if args.stuck > 0 else 0

    def is_stuck(i: int) -> bool:
        return every > 0 and i % every == every - 1

    healthy = [0] * topics
    for i in range(n_sub):
        if not is_stuck(i):
            healthy[i % topics] += 1
    rss0 = broker.rss()
    t0 = time.monotonic()
    def sub_filter(i: int) -> str:
        return args.stuck_filter if is_stuck(i) and args.stuck_filter else f"load/{i % topics}"

    subs = await open_clients(
        broker.port, [connect(f"load-sub-{i}") + subscribe(sub_filter(i), i % 2)
                      for i in range(n_sub)],
        stuck=is_stuck, timeout=args.timeout, served=lambda c: c.suback > 0)
    pubs = await open_clients(broker.port, [connect(f"load-pub-{i}") for i in range(n_pub)],
                              timeout=args.timeout)
    drops: list[int] = []  # what the broker says it dropped, latest
    monitor = None
    poller = None
    if name == "gateway":
        poller = asyncio.ensure_future(poll_gateway_dropped(broker, drops, args.interval / 2))
    if name == "mosquitto":
        def on_sys(first: int, topic: bytes, payload: bytes) -> None:
            with contextlib.suppress(ValueError):
                drops[:] = [int(payload)]
        monitor = Client(connect("load-monitor")
                         + subscribe("$SYS/broker/publish/messages/dropped", 0),
                         on_publish=on_sys)
        await asyncio.get_running_loop().create_connection(lambda: monitor, HOST, broker.port)
    setup = time.monotonic() - t0
    rss_connected = broker.rss()
    line = (f"{name}: {args.connections:,} connections ({n_pub} publishers, {n_sub:,} "
            f"subscribers on {topics:,} topics, {sum(1 for i in range(n_sub) if is_stuck(i)):,} "
            f"stuck) in {setup:.1f} s, RSS {rss0 / 2**20:.0f} -> {rss_connected / 2**20:.0f} MB")
    log(line)
    result.lines.append(line)
    healthy_subs = [c for i, c in enumerate(subs) if not is_stuck(i)]
    expected = 0
    published = 0
    topic_packets = [utf8(f"load/{k}") for k in range(topics)]
    payload = b"p" * args.payload_size
    rng = random.Random(1)
    stop = time.monotonic() + args.duration
    start = time.monotonic()
    cpu_self0 = process_cpu(os.getpid())
    cpu0 = broker.cpu()
    last = (start, 0, 0, cpu0, cpu_self0)
    next_report = start + args.interval
    tick = 0.01
    header = (f"{'t s':>6} {'RSS MB':>7} {'CPU %':>6} {'recv/s':>8} {'pub/s':>7} "
              f"{'behind':>9} {'dropped':>8} {'client CPU %':>12}")
    log(header)
    result.lines.append(header)
    samples: list[dict[str, float]] = []
    while True:
        now = time.monotonic()
        if now >= stop:
            break
        due = int((now - start) * args.rate) - published
        if due > 0:
            batches: dict[int, list[bytes]] = {}
            for _ in range(due):
                k = rng.randrange(topics)
                p = rng.randrange(n_pub)
                qos = published & 1
                pub = pubs[p]
                body = topic_packets[k] + (pub.pid().to_bytes(2, "big") if qos else b"") + payload
                batches.setdefault(p, []).append(packet(0x30 | (qos << 1), body))
                expected += healthy[k]
                published += 1
            for p, pkts in batches.items():
                pubs[p].write(b"".join(pkts))
        if now >= next_report:
            next_report += args.interval
            received = sum(c.received for c in healthy_subs)
            cpu = broker.cpu()
            cpu_self = process_cpu(os.getpid())
            t_prev, recv_prev, pub_prev, cpu_prev, self_prev = last
            span = now - t_prev
            dropped = drops[0] if drops else None
            sample = {"t": now - start, "rss_mb": broker.rss() / 2**20,
                      "cpu_pct": 100 * (cpu - cpu_prev) / span,
                      "recv_per_s": (received - recv_prev) / span,
                      "pub_per_s": (published - pub_prev) / span,
                      "behind": expected - received,
                      "dropped": -1 if dropped is None else dropped,
                      "client_cpu_pct": 100 * (cpu_self - self_prev) / span}
            samples.append(sample)
            if sample["rss_mb"] > args.rss_limit:
                stop = now  # the run ends here: the broker's memory is out of bounds
            line = (f"{sample['t']:6.0f} {sample['rss_mb']:7.0f} {sample['cpu_pct']:6.0f} "
                    f"{sample['recv_per_s']:8.0f} {sample['pub_per_s']:7.0f} "
                    f"{sample['behind']:9,} {'-' if dropped is None else f'{dropped:,}':>8} "
                    f"{sample['client_cpu_pct']:12.0f}")
            log(line)
            result.lines.append(line)
            last = (now, received, published, cpu, cpu_self)
        await asyncio.sleep(tick)
    load_s = time.monotonic() - start
    if load_s < args.duration - 1:
        line = f"{name}: stopped after {load_s:.0f} s: RSS above --rss-limit {args.rss_limit:,.0f} MB"
        log(line)
        result.lines.append(line)
    await quiet(lambda: sum(c.received for c in healthy_subs), 60)
    received = sum(c.received for c in healthy_subs)
    if poller is not None:
        poller.cancel()
        value = await asyncio.get_running_loop().run_in_executor(None, gateway_dropped, broker)
        if value is not None:
            drops[:] = [value]
    dropped = drops[0] if drops else None
    result.figures["overload"] = {
        "connections": args.connections, "publishers": n_pub, "subscribers": n_sub,
        "topics": topics, "setup_s": setup, "rss_before_mb": rss0 / 2**20,
        "rss_connected_mb": rss_connected / 2**20, "published": published,
        "publish_rate": published / load_s, "owed_to_healthy": expected,
        "received_by_healthy": received, "lost": expected - received,
        "healthy_rate": received / load_s, "broker_dropped": dropped,
        "rss_peak_mb": max([s["rss_mb"] for s in samples], default=rss_connected / 2**20),
        "rss_end_mb": broker.rss() / 2**20, "load_s": load_s, "samples": samples,
    }
    line = (f"{name}: published {published:,} in {load_s:.0f} s; healthy subscribers received "
            f"{received:,} of {expected:,} owed (lost {expected - received:,}); broker "
            f"reports {'-' if dropped is None else f'{dropped:,}'} dropped; RSS at the end "
            f"{broker.rss() / 2**20:.0f} MB")
    log(line)
    result.lines.append(line)
    broker.running.stop()
    close_all(subs + pubs + ([monitor] if monitor else []))


async def run_storm(name: str, broker: Broker, args: argparse.Namespace, result: Result) -> None:
    loop = asyncio.get_running_loop()
    n = args.storm_devices
    hellos = [connect(f"dev-{i}", 60) + subscribe(f"dev/{i}/cmd", 1) for i in range(n)]
    first_try = [0.0] * n
    clients: list[Client | None] = [None] * n
    retries = 0
    deadline = time.monotonic() + args.timeout

    async def device(i: int) -> None:
        nonlocal retries
        while True:
            c = Client(hellos[i])
            try:
                await loop.create_connection(lambda c=c: c, HOST, broker.port)  # type: ignore[misc]
                clients[i] = c
                return
            except OSError:
                retries += 1
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)

    async def watch(i: int) -> None:
        """Reconnect a device whose connection closed before it was served."""
        nonlocal retries
        c = clients[i]
        while c is not None and c.suback == 0:
            if c.closed:
                retries += 1
                await asyncio.sleep(0.5)
                await device(i)
                c = clients[i]
                continue
            await asyncio.sleep(0.05)

    start = time.monotonic()
    for b in range(0, n, args.burst):
        ids = range(b, min(n, b + args.burst))
        for i in ids:
            first_try[i] = time.monotonic()
        await asyncio.gather(*(device(i) for i in ids))
    await asyncio.wait_for(asyncio.gather(*(watch(i) for i in range(n))),
                           max(1.0, deadline - time.monotonic()))
    served = [c.suback for c in clients if c is not None]
    total = max(served) - start
    latencies = sorted(s - f for s, f in zip(served, first_try, strict=True))
    p50 = statistics.median(latencies)
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    rss = broker.rss()
    result.figures["storm"] = {"devices": n, "burst": args.burst, "all_served_s": total,
                               "p50_s": p50, "p99_s": p99, "retries": retries,
                               "rss_mb": rss / 2**20}
    line = (f"{name}: {n:,} devices in bursts of {args.burst}: all served in {total:.2f} s "
            f"(device median {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, {retries} retries), "
            f"RSS {rss / 2**20:.0f} MB")
    log(line)
    result.lines.append(line)
    broker.running.stop()
    close_all([c for c in clients if c is not None])


async def run_commands(name: str, broker: Broker, args: argparse.Namespace,
                       result: Result) -> None:
    n, count, qos = args.cmd_devices, args.command_count, args.command_qos
    devices = await open_clients(
        broker.port, [connect(f"cmd-dev-{i}") + subscribe(f"cmd/{i}", qos) for i in range(n)],
        timeout=args.timeout, served=lambda c: c.suback > 0)
    pubs = await open_clients(broker.port,
                              [connect(f"cmd-pub-{i}") for i in range(args.cmd_publishers)],
                              timeout=args.timeout)
    rng = random.Random(2)
    topics = [utf8(f"cmd/{i}") for i in range(n)]
    share = [count // len(pubs) + (1 if k < count % len(pubs) else 0) for k in range(len(pubs))]

    async def publisher(pub: Client, todo: int) -> None:
        sent = 0
        while sent < todo:
            if qos:
                while sent - pub.pubacks >= PUB_WINDOW:
                    pub.acked.clear()
                    if pub.closed:
                        raise BenchError("the broker closed a publisher")
                    await pub.acked.wait()
                batch = min(todo - sent, PUB_WINDOW - (sent - pub.pubacks), 500)
            else:
                batch = min(todo - sent, 500)
            pkts = []
            for _ in range(batch):
                pid = pub.pid().to_bytes(2, "big") if qos else b""
                pkts.append(packet(0x30 | (qos << 1),
                                   topics[rng.randrange(n)] + pid + CMD_PAYLOAD))
            await send_all(pub, b"".join(pkts))
            sent += batch

    def received() -> int:
        return sum(d.received for d in devices)

    cpu0 = broker.cpu()
    start = time.monotonic()
    await asyncio.gather(*(publisher(p, k) for p, k in zip(pubs, share, strict=True)))
    deadline = time.monotonic() + args.timeout
    got, since = received(), time.monotonic()  # since: when the count last grew
    while got < count and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
        now = received()
        if now != got:
            got, since = now, time.monotonic()
        elif time.monotonic() - since > 10:  # the rest is not coming
            break
    elapsed = since - start
    cpu = broker.cpu() - cpu0
    rate = got / elapsed
    result.figures["commands"] = {"devices": n, "commands": count, "qos": qos,
                                  "received": got, "seconds": elapsed, "msgs_per_s": rate,
                                  "broker_cpu_us_per_msg": cpu * 1e6 / max(got, 1)}
    line = (f"{name}: {count:,} commands at QoS {qos} to {n:,} devices: {got:,} received in "
            f"{elapsed:.2f} s, {rate:,.0f} msgs/s, broker CPU {cpu * 1e6 / max(got, 1):.0f} us "
            f"a command")
    log(line)
    result.lines.append(line)
    broker.running.stop()
    close_all(devices + pubs)


async def run_retained(name: str, broker: Broker, args: argparse.Namespace,
                       result: Result) -> None:
    n, size = args.retained_count, args.retained_size
    payload = b"r" * size
    (pub,) = await open_clients(broker.port, [connect("ret-pub")], timeout=args.timeout)
    await asyncio.sleep(0.5)
    rss0 = broker.rss()
    start = time.monotonic()
    chunk = 10_000
    for b in range(0, n, chunk):
        await send_all(pub, b"".join(publish(f"ret/{i}", payload, retain=True)
                                     for i in range(b, min(n, b + chunk))))
    await send_all(pub, publish("ret-sync", b"done", qos=1, pid=1))
    await wait_until(lambda: pub.pubacks >= 1 or pub.closed, time.monotonic() + args.timeout,
                     "the PUBACK after the retained messages")
    if pub.closed:
        raise BenchError("the broker closed the publisher's connection")
    store_s = time.monotonic() - start
    await asyncio.sleep(2.0)
    rss1 = broker.rss()
    sub = Client(connect("ret-sub"))
    await asyncio.get_running_loop().create_connection(lambda: sub, HOST, broker.port)
    await wait_until(lambda: sub.connack > 0, time.monotonic() + args.timeout, "CONNACK")
    t0 = time.monotonic()
    sub.write(subscribe("ret/#", 0))
    await wait_until(lambda: sub.retained >= n or sub.closed, time.monotonic() + args.timeout,
                     f"{n:,} retained messages", step=0.005)
    serve_s = time.monotonic() - t0
    rss2 = broker.rss()
    await quiet(lambda: sub.retained, 5, 0.5)
    per_msg = (rss1 - rss0) / n
    result.figures["retained"] = {"count": n, "size": size, "store_s": store_s,
                                  "rss_before_mb": rss0 / 2**20, "rss_after_mb": rss1 / 2**20,
                                  "rss_bytes_per_retained": per_msg, "serve_s": serve_s,
                                  "rss_serving_mb": rss2 / 2**20, "received": sub.retained}
    line = (f"{name}: {n:,} retained x {size} B taken in {store_s:.1f} s; RSS "
            f"{rss0 / 2**20:.0f} -> {rss1 / 2**20:.0f} MB ({per_msg:,.0f} B each); served to "
            f"ret/# in {serve_s:.2f} s ({sub.retained:,} received, RSS then "
            f"{rss2 / 2**20:.0f} MB)")
    log(line)
    result.lines.append(line)
    broker.running.stop()
    close_all([pub, sub])


RUNNERS = {"overload": run_overload, "storm": run_storm, "commands": run_commands,
           "retained": run_retained}


def run_part(part: str, names: list[str], args: argparse.Namespace, workdir: Path,
             results: dict[str, Result]) -> None:
    for name in names:
        log(f"--- {part}: {name}")
        try:
            with start_broker(name, workdir / f"{part}-{name}") as broker:
                asyncio.run(RUNNERS[part](name, broker, args, results[name]), debug=False)
        except (BrokerFailed, BenchError, OSError, TimeoutError) as exc:
            msg = f"{part}: {exc!r}"
            log(f"{name}: {msg}")
            results[name].lines.append(f"{name}: {msg}")
            results[name].error = msg


def report(results: dict[str, Result], names: list[str], parts: list[str]) -> None:
    print("\n== bench_overload (indicative: clients and brokers share this machine) ==")
    g = results.get("gateway")
    m = results.get("mosquitto")

    def fig(r: Result | None, part: str, key: str) -> Any:
        return None if r is None else r.figures.get(part, {}).get(key)

    def ratio(key: str, part: str) -> str:
        a, b = fig(g, part, key), fig(m, part, key)
        return f"{a / b:.2f}" if a and b else "-"

    def show(v: Any, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    rows = []
    if "overload" in parts:
        rows += [("overload: healthy msgs/s", "healthy_rate", "overload", ",.0f"),
                 ("overload: lost by healthy", "lost", "overload", ","),
                 ("overload: broker dropped", "broker_dropped", "overload", ","),
                 ("overload: peak RSS MB", "rss_peak_mb", "overload", ".0f")]
    if "storm" in parts:
        rows += [("storm: all served s", "all_served_s", "storm", ".2f"),
                 ("storm: device median s", "p50_s", "storm", ".2f"),
                 ("storm: device p99 s", "p99_s", "storm", ".2f"),
                 ("storm: retries", "retries", "storm", ",")]
    if "commands" in parts:
        rows += [("commands: msgs/s", "msgs_per_s", "commands", ",.0f")]
    if "retained" in parts:
        rows += [("retained: RSS B each", "rss_bytes_per_retained", "retained", ",.0f"),
                 ("retained: serve s", "serve_s", "retained", ".2f")]
    print(f"{'figure':<28} {'gateway':>12} {'mosquitto':>12} {'gw/mosq':>8}")
    for label, key, part, spec in rows:
        print(f"{label:<28} {show(fig(g, part, key), spec):>12} "
              f"{show(fig(m, part, key), spec):>12} {ratio(key, part):>8}")
    for name in names:
        if results[name].error:
            print(f"{name}: {results[name].error}")


QUICK = {"connections": 400, "publishers": 10, "duration": 4.0, "interval": 2.0, "rate": 500,
         "storm_devices": 1000, "burst": 100, "cmd_devices": 500, "command_count": 10_000,
         "retained_count": 10_000, "timeout": 60.0}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for part in PARTS:
        p.add_argument(f"--{part}", action="store_true", help=f"run the {part} part")
    p.add_argument("--quick", action="store_true", help="every chosen part, small (smoke test)")
    p.add_argument("--brokers", default=",".join(BROKERS), help="gateway,mosquitto (default)")
    p.add_argument("--connections", type=int, default=10_000)
    p.add_argument("--publishers", type=int, default=100)
    p.add_argument("--fanout", type=int, default=10, help="subscribers a topic")
    p.add_argument("--stuck", type=float, default=0.1, help="share of subscribers that never read")
    p.add_argument("--payload-size", type=int, default=2048, help="bytes a message")
    p.add_argument("--stuck-filter", default="",
                   help="what the stuck subscribers subscribe to ('': their own topic)")
    p.add_argument("--rss-limit", type=float, default=4096,
                   help="MB of broker RSS at which the overload run stops")
    p.add_argument("--rate", type=float, default=1000.0, help="messages published a second")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of overload")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between lines")
    p.add_argument("--storm-devices", type=int, default=10_000)
    p.add_argument("--burst", type=int, default=500)
    p.add_argument("--cmd-devices", type=int, default=5_000)
    p.add_argument("--command-count", type=int, default=200_000)
    p.add_argument("--command-qos", type=int, choices=(0, 1), default=1)
    p.add_argument("--cmd-publishers", type=int, default=4)
    p.add_argument("--retained-count", type=int, default=1_000_000)
    p.add_argument("--retained-size", type=int, default=32)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a step may take")
    p.add_argument("--json", type=Path, help="also write the results to this file")
    p.add_argument("--keep", action="store_true", help="keep the brokers' work directories")
    args = p.parse_args(argv)
    args.parts = [part for part in PARTS if getattr(args, part)] or list(PARTS)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    args.broker_names = [n.strip() for n in args.brokers.split(",") if n.strip()]
    unknown = sorted(set(args.broker_names) - set(BROKERS))
    if unknown or not args.broker_names:
        p.error(f"--brokers: unknown {', '.join(unknown) or '(none given)'}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # The gateway process runs this tree's code, whatever the virtualenv was installed from.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    wanted = max(args.connections, args.storm_devices, args.cmd_devices) + 100
    fit = raise_nofile(wanted)
    if fit < wanted:
        log(f"RLIMIT_NOFILE hard limit {resource.getrlimit(resource.RLIMIT_NOFILE)[1]} is too "
            f"low for {wanted:,} connections")
        return 2
    with contextlib.suppress(ImportError):
        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    workdir = Path(tempfile.mkdtemp(prefix="bench-overload-"))
    results = {name: Result(name) for name in args.broker_names}
    try:
        for part in args.parts:
            run_part(part, args.broker_names, args, workdir, results)
    finally:
        if args.keep:
            log(f"work directories kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    report(results, args.broker_names, args.parts)
    if args.json:
        args.json.write_text(json.dumps(
            {"parts": args.parts, "args": {k: v for k, v in vars(args).items()
                                           if isinstance(v, (int, float, str, list))},
             "results": {n: {"figures": r.figures, "error": r.error, "lines": r.lines}
                         for n, r in results.items()}}, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
