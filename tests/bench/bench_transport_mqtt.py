"""The mqtt transport against mosquitto's own bridge, same load, same run.

    .venv/bin/python tests/bench/bench_transport_mqtt.py                 # defaults below
    .venv/bin/python tests/bench/bench_transport_mqtt.py --n 20000 --runs 1 \\
        --scenarios export,loss
    .venv/bin/python tests/bench/bench_transport_mqtt.py --scenarios export \\
        --transport-param "protocol_version = 3.1.1" --gateway-conf "store_sync = disabled"

Defaults: --n 50000 messages per run (at most 65,535: one ``mosquitto_pub -l`` run ends
when the PUBACK for its last message's packet id comes, and packet ids repeat past 65,535),
--runs 3, all scenarios, --loss-rate 2000 msgs/s, --outage 2 s, --quiet 5 s. ``--gateway-conf`` / ``--transport-param`` add lines to the
gateway's gateway.conf / ``[far]`` section (to see what a setting costs); ``--json FILE``
also writes the results there. The gateway process gets PYTHONPATH=<project root>, since it
runs in a work directory and an editable install made before transports/ existed does not
find that package.

How this works. Two ways to move MQTT messages between a "near" broker and a "far"
mosquitto are measured side by side, each with brokers of its own, started by this script
on free ports of 127.0.0.1 (mosquitto through tests/peers/mosquitto.py, installed by
``bash tests/peers/install.sh``; the gateway as ``python -m gateway serve --config-dir DIR``):

* **mosquitto**: the near broker is a mosquitto with a bridge section (mosquitto.conf(5))::

      connection far
      address 127.0.0.1:FARPORT
      remote_clientid bench-near       # only to find it in the far broker's log
      topic bench/# out 1              # "in 1" for the import scenario
      cleansession false               # mosquitto's default, written out

  Everything else is mosquitto 2.0's default: ``restart_timeout`` jittered 5..30 s,
  ``keepalive_interval`` 60, ``try_private true``, ``bridge_protocol_version mqttv311``,
  ``max_inflight_messages 20``, ``persistence false``.
* **gateway**: the near broker is the gateway, ``gateway.conf``::

      listen = mqtt://127.0.0.1:PORT
      listen = http://127.0.0.1:PORT   # /api/v1/transports, polled by this script
      store = DIR/data
      mqtt_transports = enabled

  so the store is the default sqlite one with ``store_sync`` (an fsync per group commit) and
  the ``delivery_log`` on (both defaults); ``transports.conf``
  ``[far] type = mqtt, url = mqtt://127.0.0.1:FARPORT`` with every other parameter at its
  default (MQTT 5, qos 1, clean_start false, spool 100000 messages / 64MB, block,
  reconnect 1..60 s); ``topics.conf`` ``bench.> export="far"`` (``import="far"`` for the
  import scenario) and ``>``. A QoS 1 publish is a PERSISTENT message: it is stored (and
  fsynced) before the publisher gets its PUBACK and leaves the spool on the far PUBACK.
  mosquitto keeps everything in memory: the gateway does more work per message.

Load: ``mosquitto_pub -l -q 1`` (MQTT 3.1.1) is fed --n lines of 64 bytes through a pipe, each
line an 8-digit sequence number padded with "m"; ``mosquitto_sub -q 1`` prints them, a
thread of this script reads them and keeps, per sequence number, how often it arrived.

Scenarios (QoS 1 everywhere):

1. ``export``: publisher → near → bridge/transport → far → subscriber on the far mosquitto.
2. ``import``: publisher on the far mosquitto → bridge ``in`` / transport import of
   ``bench.>`` → near → subscriber on the near broker. The gateway imports a topic only
   while a gateway subscription overlaps it: the subscriber makes it, and the run waits until
   ``/api/v1/transports`` shows the far-side subscription ``bench.t``.

   In 1 and 2 every mosquitto (near and far) runs with ``max_queued_messages 0`` (no
   limit), as in bench_mqtt.py, and the gateway with its equivalent
   ``mqtt_max_queued_messages = 0``: with the default of 1000, a client that falls behind
   (the bridge, the transport, the subscriber) has messages dropped by mosquitto or the
   gateway and the run never completes (``--default-queues`` shows it: such a run fails
   saying how many arrived).
   A run starts when a warm-up message, published again and again with growing pauses, has
   reached the subscriber (proving bridge and subscriptions are in place); the clock runs
   from starting the publisher until the N-th distinct message arrives; the figure is N /
   elapsed, the median of --runs runs; runs alternate mosquitto, gateway, mosquitto, ... so
   a machine that drifts moves both alike; each gateway run's ratio to the mosquitto run
   just before it is printed too, with their median. A run that loses or duplicates fails.
   Each run also counts CPU time (user + system, /proc/PID/stat) over the same span, per
   process -- the near broker (the gateway with its delivery-log writer, or the bridging
   mosquitto), the far mosquitto, mosquitto_pub, mosquitto_sub -- as microseconds a
   message, and how many CPUs' worth the whole machine was busy (/proc/stat): what one
   message costs each side, and whether the machine had CPU left for a faster run.
3. ``loss``: the export scenario with a far-side restart. The far mosquitto runs with
   ``persistence true``, ``persistence_location``, ``autosave_interval 1`` and
   ``max_queued_messages 0`` (so the far broker itself, holding the subscriber's session
   while it reconnects, is not where messages are lost); its subscriber is
   ``mosquitto_sub -c -i ID -q 1`` (a persistent session, which mosquitto_sub resumes by
   itself after the restart). The near broker keeps its defaults: mosquitto's
   ``max_queued_messages 1000`` per client (the bridge is one) and the gateway's spool. The
   publisher is paced at --loss-rate messages/s; once the far subscriber has N/3, the far
   mosquitto gets SIGTERM (it saves its database) and is started again on the same port
   --outage seconds later, while the publisher goes on. The run ends when the publisher
   is done, the bridge / transport has reconnected (far log / ``state`` up and ``spooled``
   0) and nothing arrived for --quiet seconds. Reported: sequence numbers never received
   (lost) and extra copies (duplicates), per run and summed. Fresh brokers for every run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "bench"))

from adminapi import admin_get  # noqa: E402
from bench_amqp import CLK_TCK  # noqa: E402
from bench_mqtt import BenchError, BrokerFailed, log, run_process  # noqa: E402
from bench_stomp import machine_jiffies, tree_cpu  # noqa: E402
from peers.mosquitto import (  # noqa: E402
    PeerFailedToStart,
    PeerMissing,
    find_command,
    free_port,
    start_mosquitto,
    stop_process,
)

HOST = "127.0.0.1"
TOPIC = "bench/t"
PAYLOAD_SIZE = 64
SEQ_DIGITS = 8
WARMUP = b"warm-up"
SYSTEMS = ("mosquitto", "gateway")
SCENARIOS = ("export", "import", "loss")
START_TIMEOUT = 20.0  # the gateway opens its store before it listens
STALL_TIMEOUT = 30.0  # a throughput run with nothing arriving for this long has failed
UNLIMITED = ["max_queued_messages 0"]
# Targets at QoS 1, the same run: the gateway's throughput against mosquitto's bridge, and
# the gateway's CPU time per message (its process and its delivery-log writer).
TARGET_RATIO = {"export": 0.7, "import": 1.2}
TARGET_CPU_US = {"export": 80.0, "import": 35.0}


def payloads(n: int) -> bytes:
    pad = b"m" * (PAYLOAD_SIZE - SEQ_DIGITS)
    return b"".join(b"%08d%s\n" % (i, pad) for i in range(n))


# --- the subscriber's side ------------------------------------------------------------------

class Collector(threading.Thread):
    """Reads a mosquitto_sub's stdout: per sequence number how often it arrived, the
    warm-up copies, other lines, and when the ``target``-th distinct message came."""

    def __init__(self, proc: subprocess.Popen[bytes], n: int, target: int) -> None:
        super().__init__(daemon=True)
        assert proc.stdout is not None
        self.fd = proc.stdout.fileno()
        self.n = n
        self.target = target
        self.seen = bytearray(n)  # copies per sequence number (saturating at 255)
        self.distinct = 0
        self.total = 0
        self.warmups = 0
        self.other = 0
        self.reached_at = 0.0  # perf_counter() when ``distinct`` reached ``target``
        self.last_at = time.monotonic()
        self.reached = threading.Event()

    def run(self) -> None:
        rest = b""
        seen = self.seen
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                return
            self.last_at = time.monotonic()
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            for line in lines:
                if len(line) == PAYLOAD_SIZE and line[:SEQ_DIGITS].isdigit():
                    i = int(line[:SEQ_DIGITS])
                    if i < self.n:
                        self.total += 1
                        c = seen[i]
                        if c == 0:
                            self.distinct += 1
                        if c < 255:
                            seen[i] = c + 1
                        continue
                if line == WARMUP:
                    self.warmups += 1
                else:
                    self.other += 1
            if self.distinct >= self.target and not self.reached.is_set():
                self.reached_at = time.perf_counter()
                self.reached.set()

    @property
    def duplicates(self) -> int:
        return self.total - self.distinct


def start_sub(port: int, extra: list[str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [find_command("mosquitto_sub"), "-h", HOST, "-p", str(port), "-V", "mqttv311",
         "-t", TOPIC, "-q", "1", *(extra or [])],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def start_pub(port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [find_command("mosquitto_pub"), "-h", HOST, "-p", str(port), "-V", "mqttv311",
         "-t", TOPIC, "-q", "1", "-l"],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def feed(pub: subprocess.Popen[bytes], data: bytes, rate: float = 0.0) -> None:
    """Write ``data`` (lines) to the publisher, all at once or ``rate`` lines per second."""
    assert pub.stdin is not None
    line = PAYLOAD_SIZE + 1
    with contextlib.suppress(OSError):  # the publisher may exit early on an error
        if rate <= 0:
            pub.stdin.write(data)
        else:
            step = max(1, int(rate / 100)) * line  # 100 batches a second
            t0 = time.monotonic()
            for off in range(0, len(data), step):
                pub.stdin.write(data[off:off + step])
                pub.stdin.flush()
                ahead = t0 + (off + step) / line / rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
        pub.stdin.close()


def stop_all(*procs: subprocess.Popen[bytes] | None) -> None:
    for proc in procs:
        if proc is not None:
            stop_process(proc, grace=2.0)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()


def warm_up(col: Collector, sub: subprocess.Popen[bytes], pub_port: int,
            deadline: float) -> None:
    """Publish the warm-up message (waiting 50 ms after the first, doubling up to 1 s) until
    the subscriber printed it, then 0.3 s of quiet for late copies."""
    argv = [find_command("mosquitto_pub"), "-h", HOST, "-p", str(pub_port), "-V", "mqttv311",
            "-t", TOPIC, "-q", "1", "-m", WARMUP.decode()]
    interval = 0.05
    while col.warmups == 0:
        if time.monotonic() > deadline:
            raise BenchError("the warm-up message never reached the subscriber")
        if sub.poll() is not None:
            err = sub.stderr.read().decode(errors="replace") if sub.stderr else ""
            raise BenchError(f"mosquitto_sub exited ({sub.returncode}): {err.strip()!r}")
        done = subprocess.run(argv, capture_output=True, timeout=30)
        if done.returncode != 0:
            raise BenchError(f"mosquitto_pub (warm-up) failed: {done.stderr.decode()!r}")
        end = time.monotonic() + interval
        while col.warmups == 0 and time.monotonic() < end:
            time.sleep(0.01)
        interval = min(interval * 2, 1.0)
    time.sleep(0.3)


# --- brokers --------------------------------------------------------------------------------

@dataclass
class Near:
    """A started near broker: the port clients use and how to tell it is ready / drained."""

    system: str
    port: int
    log_tail: Callable[[], str]
    pid: int
    api: int = 0  # the gateway's http port

    def transport(self) -> dict[str, Any]:
        infos: list[dict[str, Any]] = admin_get(self.api, "/api/v1/transports", host=HOST,
                                                timeout=5)
        return {t["name"]: t for t in infos}["far"]


def bridge_config(far_port: int, direction: str) -> list[str]:
    return ["connection far", f"address {HOST}:{far_port}", "remote_clientid bench-near",
            f"topic bench/# {direction} 1", "cleansession false"]


def wait_until(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, KeyError, ValueError):
            value = cond()
            if value:
                return value
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


def log_has(path: Path, text: str) -> bool:
    try:
        return text in path.read_text(errors="replace")
    except OSError:
        return False


@contextlib.contextmanager
def start_near(system: str, workdir: Path, far: Any, scenario: str, limits: list[str],
               args: argparse.Namespace) -> Iterator[Near]:
    """The near broker for ``scenario`` (export / import) bridged to ``far``; ready when
    the bridge / transport is connected."""
    workdir.mkdir(parents=True, exist_ok=True)
    direction = "in" if scenario == "import" else "out"
    if system == "mosquitto":
        try:
            with start_mosquitto(workdir, extra_config=limits + bridge_config(far.port, direction),
                                 start_timeout=START_TIMEOUT) as m:
                wait_until(lambda: log_has(far.log_path, " as bench-near"), 30,
                           "the bridge to connect")
                yield Near(system, m.port, m.log_tail, m.pid)
        except (PeerMissing, PeerFailedToStart) as exc:
            raise BrokerFailed(str(exc)) from None
        return
    port, api = free_port(HOST), free_port(HOST)
    conf = workdir / "conf"
    conf.mkdir(exist_ok=True)
    (conf / "gateway.conf").write_text(
        f"listen = mqtt://{HOST}:{port}\nlisten = http://{HOST}:{api}\n"
        f"store = {workdir / 'data'}\nmqtt_transports = enabled\n"
        + ("mqtt_max_queued_messages = 0\n" if limits else "")
        + "".join(line + "\n" for line in args.gateway_conf))
    (conf / "transports.conf").write_text(
        f"[far]\ntype = mqtt\nurl = mqtt://{HOST}:{far.port}\n"
        + "".join(line + "\n" for line in args.transport_param))
    verb = "import" if scenario == "import" else "export"
    (conf / "topics.conf").write_text(f'bench.> {verb}="far"\n>\n')
    argv = [sys.executable, "-m", "gateway", "serve", "--config-dir", str(conf)]
    with run_process("gateway", argv, workdir, port) as running:
        near = Near(system, port, running.output_tail, running.pid, api)
        wait_until(lambda: near.transport()["state"] == "up", 30, "the transport to connect")
        yield near


# --- CPU accounting -------------------------------------------------------------------------

ROLES = ("near", "far", "pub", "sub")  # the processes of a run whose CPU time is counted


@dataclass
class Cpu:
    """What one run cost in CPU time: microseconds a message per process, and how busy the
    machine was (CPUs' worth) while it ran."""

    per_msg_us: dict[str, float]
    machine_cpus: float


class CpuMeter:
    """CPU time of a run's processes (each with its live descendants: the gateway's
    delivery-log writer) between :meth:`start` and :meth:`stop`, and the machine's."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.before = {role: tree_cpu(pid) for role, pid in pids.items()}
        self.jiffies = machine_jiffies()[0]
        self.wall = time.perf_counter()

    def add(self, role: str, pid: int) -> None:
        """A process started after the meter: all of its time counts."""
        self.pids[role] = pid
        self.before[role] = 0.0

    def stop(self, n: int) -> Cpu:
        after = {role: tree_cpu(pid) for role, pid in self.pids.items()}
        busy = (machine_jiffies()[0] - self.jiffies) / CLK_TCK
        wall = time.perf_counter() - self.wall
        return Cpu({role: (after[role] - self.before[role]) * 1e6 / n for role in self.pids},
                   busy / wall if wall > 0 else 0.0)


# --- throughput -----------------------------------------------------------------------------

def run_throughput(near: Near, far: Any, scenario: str, n: int,
                   timeout: float) -> tuple[float, Cpu]:
    """One run: N / seconds from starting the publisher to the N-th distinct message, and
    the CPU time it took (from starting the publisher to the N-th message)."""
    far_port = far.port
    pub_port, sub_port = (near.port, far_port) if scenario == "export" else (far_port, near.port)
    deadline = time.monotonic() + timeout
    sub = start_sub(sub_port)
    pub: subprocess.Popen[bytes] | None = None
    try:
        col = Collector(sub, n, n)
        col.start()
        if scenario == "import" and near.system == "gateway":
            wait_until(lambda: near.transport()["imports"].get("bench.>") == ["bench.t"], 30,
                       "the far-side subscription of the import")
        warm_up(col, sub, pub_port, deadline)
        data = payloads(n)
        meter = CpuMeter({"near": near.pid, "far": far.pid, "sub": sub.pid})
        t0 = time.perf_counter()
        pub = start_pub(pub_port)
        meter.add("pub", pub.pid)
        threading.Thread(target=feed, args=(pub, data), daemon=True).start()
        while not col.reached.wait(0.2):
            now = time.monotonic()
            idle = now - col.last_at
            if now > deadline or idle > STALL_TIMEOUT or not col.is_alive():
                why = f"timed out after {timeout:g} s" if now > deadline else (
                    f"stalled for {idle:.0f} s" if col.is_alive() else "mosquitto_sub exited")
                raise BenchError(f"{why}: {col.distinct} of {n} messages arrived "
                                 f"({col.duplicates} duplicates; publisher status "
                                 f"{pub.poll()})")
        cpu = meter.stop(n)  # (the loop above notices the N-th message within 0.2 s)
        elapsed = col.reached_at - t0
        time.sleep(0.2)  # duplicates, if any, would come now
        if col.duplicates or col.other:
            raise BenchError(f"{col.duplicates} duplicates and {col.other} unexpected lines")
        return n / elapsed, cpu
    finally:
        stop_all(pub, sub)


@dataclass
class Result:
    system: str
    rates: dict[str, float] = field(default_factory=dict)
    runs: dict[str, list[float]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    loss: list[dict[str, Any]] = field(default_factory=list)
    cpu: dict[str, list[Cpu]] = field(default_factory=dict)


def bench_throughput(scenario: str, args: argparse.Namespace, workdir: Path,
                     results: dict[str, Result]) -> None:
    with contextlib.ExitStack() as stack:
        nears: dict[str, tuple[Near, Any]] = {}
        limits = [] if args.default_queues else UNLIMITED
        for system in SYSTEMS:
            base = workdir / f"{scenario}-{system}"
            try:
                far = stack.enter_context(start_mosquitto(
                    base / "far", extra_config=limits, start_timeout=START_TIMEOUT))
                near = stack.enter_context(start_near(system, base / "near", far, scenario,
                                                      limits, args))
            except (BrokerFailed, BenchError, PeerMissing, PeerFailedToStart) as exc:
                results[system].errors[scenario] = f"failed to start: {exc}"
                log(f"{system}: {scenario}: failed to start: {exc}")
                continue
            nears[system] = (near, far)
        for rep in range(args.runs):
            for system, (near, far) in nears.items():
                result = results[system]
                if scenario in result.errors:
                    continue
                try:
                    rate, cpu = run_throughput(near, far, scenario, args.n, args.timeout)
                except BenchError as exc:
                    result.errors[scenario] = str(exc)
                    log(f"{system}: {scenario}: {exc}\n{near.log_tail()}")
                    continue
                log(f"{system}: {scenario} run {rep + 1}: {rate:,.0f} msgs/s; CPU us/msg "
                    + ", ".join(f"{k} {v:.0f}" for k, v in cpu.per_msg_us.items())
                    + f"; machine busy {cpu.machine_cpus:.2f} CPUs")
                result.runs.setdefault(scenario, []).append(rate)
                result.cpu.setdefault(scenario, []).append(cpu)
        for result in results.values():
            rates = result.runs.get(scenario)
            if rates and scenario not in result.errors:
                result.rates[scenario] = statistics.median(rates)


# --- loss under a far-side restart ----------------------------------------------------------

def far_config(db: Path) -> list[str]:
    return ["persistence true", f"persistence_location {db}/", "autosave_interval 1",
            *UNLIMITED]


def run_loss(system: str, workdir: Path, rep: int, args: argparse.Namespace) -> dict[str, Any]:
    """One export run during which the far mosquitto is restarted; what arrived."""
    n = args.n
    db = workdir / "far-db"
    db.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.timeout
    sub: subprocess.Popen[bytes] | None = None
    pub: subprocess.Popen[bytes] | None = None
    with contextlib.ExitStack() as stack:
        try:
            far = stack.enter_context(start_mosquitto(workdir / "far-1",
                                                      extra_config=far_config(db),
                                                      start_timeout=START_TIMEOUT))
            near = stack.enter_context(start_near(system, workdir / "near", far, "export", [],
                                                  args))
        except (PeerMissing, PeerFailedToStart) as exc:
            raise BrokerFailed(str(exc)) from None
        far_port = far.port
        try:
            sub = start_sub(far_port, ["-c", "-i", f"bench-far-sub-{system}-{rep}"])
            col = Collector(sub, n, n // 3)
            col.start()
            warm_up(col, sub, near.port, deadline)
            pub = start_pub(near.port)
            feeder = threading.Thread(target=feed, args=(pub, payloads(n), args.loss_rate),
                                      daemon=True)
            t0 = time.monotonic()
            feeder.start()
            while not col.reached.wait(0.2):
                if time.monotonic() > deadline or (pub.poll() is not None and
                                                   time.monotonic() - col.last_at > STALL_TIMEOUT):
                    raise BenchError(f"only {col.distinct} of {n} arrived before the restart")
            stopped_at = time.monotonic() - t0
            at_stop = col.distinct
            far.stop()  # SIGTERM: mosquitto saves its database and exits
            time.sleep(args.outage)
            far2 = stack.enter_context(start_mosquitto(
                workdir / "far-2", port=far_port, extra_config=far_config(db),
                start_timeout=START_TIMEOUT))
            restarted_at = time.monotonic() - t0
            sent_during_outage = pub_progress(t0, stopped_at, restarted_at, args.loss_rate, n)
            if system == "mosquitto":
                def reconnected() -> bool:
                    return log_has(far2.log_path, " as bench-near")

                def drained() -> bool:
                    return True  # mosquitto tells nothing: the quiet period below decides
            else:
                def reconnected() -> bool:
                    return bool(near.transport()["connects"] >= 2)

                def drained() -> bool:
                    t = near.transport()
                    return bool(t["state"] == "up" and t["spooled"] == 0)
            reconnected_at = published_at = None
            while reconnected_at is None or published_at is None or not drained():
                now = time.monotonic()
                if reconnected_at is None and reconnected():
                    reconnected_at = now - t0
                if published_at is None and pub.poll() is not None:
                    published_at = now - t0
                if now > deadline:
                    raise BenchError(f"at the time limit: reconnected at {reconnected_at} s, "
                                     f"publisher done at {published_at} s, "
                                     f"{col.distinct} of {n} arrived")
                time.sleep(0.05)
            while True:  # until nothing more arrives
                quiet = args.quiet if col.distinct < n else 1.0
                if time.monotonic() - col.last_at >= quiet:
                    break
                if time.monotonic() > deadline:
                    raise BenchError("messages still arriving at the time limit")
                time.sleep(0.1)
            extra: dict[str, Any] = {}
            if system == "gateway":
                t = near.transport()
                extra = {k: t[k] for k in ("exported", "failed", "connects", "spooled")}
            else:
                near_log = workdir / "near" / "mosquitto.log"
                text = near_log.read_text(errors="replace") if near_log.exists() else ""
                extra = {"dropping_notices": text.count("being dropped")}
            return {
                "received": col.total, "distinct": col.distinct, "lost": n - col.distinct,
                "duplicates": col.duplicates, "stopped_after": at_stop,
                "stopped_at_s": round(stopped_at, 2), "restarted_at_s": round(restarted_at, 2),
                "reconnected_at_s": round(reconnected_at, 2),
                "published_by_s": round(published_at, 2),
                "published_during_outage": sent_during_outage,
                "publisher_status": pub.returncode, **extra,
            }
        finally:
            stop_all(pub, sub)


def pub_progress(t0: float, start: float, end: float, rate: float, n: int) -> int | None:
    """Messages the paced publisher was fed between ``start`` and ``end`` (None unpaced)."""
    if rate <= 0:
        return None
    return int(min(n, end * rate) - min(n, start * rate))


def bench_loss(args: argparse.Namespace, workdir: Path, results: dict[str, Result]) -> None:
    for rep in range(args.runs):
        for system in SYSTEMS:
            result = results[system]
            if "loss" in result.errors:
                continue
            try:
                run = run_loss(system, workdir / f"loss-{system}-{rep + 1}", rep + 1, args)
            except (BrokerFailed, BenchError, subprocess.TimeoutExpired) as exc:
                result.errors["loss"] = str(exc)
                log(f"{system}: loss run {rep + 1}: {exc}")
                continue
            log(f"{system}: loss run {rep + 1}: {run}")
            result.loss.append(run)


# --- report ---------------------------------------------------------------------------------

def table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for i, row in enumerate(rows):
        print(" | ".join(c.ljust(w) if j == 0 else c.rjust(w)
                         for j, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip())
        if i == 0:
            print("-+-".join("-" * w for w in widths))


def report(results: dict[str, Result], args: argparse.Namespace, info: dict[str, Any]) -> None:
    mosq, gw = results["mosquitto"], results["gateway"]

    def rate(r: Result, s: str) -> str:
        if s in r.rates:
            return f"{r.rates[s]:,.0f}"
        return "error" if s in r.errors else "-"

    print()
    rows: list[tuple[str, ...]] = [("scenario (QoS 1)", "mosquitto bridge msgs/s", "gateway msgs/s",
             "gateway/mosquitto", "target")]
    for s in ("export", "import"):
        if s not in args.scenario_names:
            continue
        m, g = mosq.rates.get(s), gw.rates.get(s)
        ratio = f"{g / m:.2f}" if m and g else "n/a"
        verdict = ("meets" if g / m >= TARGET_RATIO[s] else "MISSES") if m and g else ""
        rows.append((s, rate(mosq, s), rate(gw, s), ratio, f">= {TARGET_RATIO[s]:g} {verdict}"))
    if len(rows) > 1:
        table(rows)
        for s in ("export", "import"):
            for r in (mosq, gw):
                if s in r.runs:
                    print(f"  {r.system} {s} runs: "
                          + ", ".join(f"{x:,.0f}" for x in r.runs[s]))
            pairs = list(zip(mosq.runs.get(s, []), gw.runs.get(s, []), strict=False))
            if pairs:
                # Each gateway run against the mosquitto run just before it: a machine whose
                # speed drifts between runs moves both sides of a pair alike.
                ratios = [g / m for m, g in pairs]
                print(f"  {s} per-pair ratios: " + ", ".join(f"{x:.2f}" for x in ratios)
                      + f" (median {statistics.median(ratios):.2f})")
        cpu_table(results, args)
    if "loss" in args.scenario_names:
        pace = (f"at {args.loss_rate:g} msgs/s" if args.loss_rate > 0
                else "as fast as the publisher goes")
        print(f"\nfar-side restart during export: {args.n:,} messages {pace}, "
              f"far mosquitto down {args.outage:g} s")
        rows = [("system", "run", "far stopped after", "sender back after s", "received",
                 "lost", "duplicates")]
        for r in (mosq, gw):
            for i, run in enumerate(r.loss, 1):
                back = run["reconnected_at_s"] - run["stopped_at_s"]
                rows.append((r.system, str(i), f"{run['stopped_after']:,}", f"{back:.1f}",
                             f"{run['received']:,}", f"{run['lost']:,}",
                             f"{run['duplicates']:,}"))
            if r.loss:
                rows.append((r.system, "sum", "", "",
                             f"{sum(x['received'] for x in r.loss):,}",
                             f"{sum(x['lost'] for x in r.loss):,}",
                             f"{sum(x['duplicates'] for x in r.loss):,}"))
        table(rows)
    for r in (mosq, gw):
        for what, err in r.errors.items():
            print(f"\n{r.system} {what}: {err}")
    print(f"\nversions: {', '.join(f'{k} {v}' for k, v in info['versions'].items())}; "
          f"load average {info['load_before']} before, {info['load_after']} after "
          f"({os.cpu_count()} CPUs)")


def cpu_table(results: dict[str, Result], args: argparse.Namespace) -> None:
    """CPU microseconds a message, per process (medians over the runs), and how many CPUs'
    worth the whole machine was busy: what the machine gives and what each system spends."""
    rows: list[tuple[str, ...]] = [("scenario", "system", *(f"{r} us/msg" for r in ROLES),
                                    "sum us/msg", "machine busy (CPUs)", "gateway target")]
    for s in ("export", "import"):
        for r in results.values():
            cpus = r.cpu.get(s)
            if not cpus:
                continue
            per = [statistics.median(c.per_msg_us[role] for c in cpus) for role in ROLES]
            busy = statistics.median(c.machine_cpus for c in cpus)
            target = ""
            if r.system == "gateway":
                near = per[ROLES.index("near")]
                target = (f"near <= {TARGET_CPU_US[s]:g} "
                          + ("meets" if near <= TARGET_CPU_US[s] else "MISSES"))
            rows.append((s, r.system, *(f"{x:.0f}" for x in per), f"{sum(per):.0f}",
                         f"{busy:.2f} of {os.cpu_count()}", target))
    if len(rows) > 1:
        print("\nCPU time a message (near: the mosquitto with the bridge, or the gateway with "
              "its delivery-log writer)")
        table(rows)


def versions() -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        head = subprocess.run([find_command("mosquitto"), "-h"], capture_output=True,
                              text=True).stdout.splitlines()
        out["mosquitto"] = head[0].split()[-1] if head else "?"
    except PeerMissing:
        out["mosquitto"] = "not installed"
    try:
        import paho.mqtt

        import gateway
        out["gateway"] = gateway.__version__
        out["paho-mqtt"] = paho.mqtt.__version__
    except ImportError:
        pass
    return out


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


MAX_N = 65_535  # messages one mosquitto_pub -l run sends whole (see parse_args)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=50_000,
                   help="messages per run (default 50000, at most 65535)")
    p.add_argument("--runs", type=int, default=3, help="runs per figure; the median counts")
    p.add_argument("--scenarios", default=",".join(SCENARIOS),
                   help="comma-separated, from export,import,loss (default: all)")
    p.add_argument("--loss-rate", type=float, default=2000.0,
                   help="publishing rate of the loss scenario, msgs/s (0: as fast as it goes)")
    p.add_argument("--outage", type=float, default=2.0,
                   help="seconds the far mosquitto stays down in the loss scenario")
    p.add_argument("--quiet", type=float, default=5.0,
                   help="loss scenario: a run ends after this long with nothing arriving")
    p.add_argument("--default-queues", action="store_true",
                   help="export / import: leave every mosquitto at max_queued_messages 1000 "
                        "(runs that lose messages then fail, saying how many arrived)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds one run may take before it counts as failed")
    p.add_argument("--gateway-conf", action="append", default=[], metavar="LINE",
                   help="an extra gateway.conf line, e.g. 'store_sync = disabled' (repeatable)")
    p.add_argument("--transport-param", action="append", default=[], metavar="LINE",
                   help="an extra line of the [far] section, e.g. 'protocol_version = 3.1.1' "
                        "(repeatable)")
    p.add_argument("--json", type=Path, help="also write the results to this file")
    p.add_argument("--keep", action="store_true", help="keep the work directories")
    args = p.parse_args(argv)
    names = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown or not names:
        p.error(f"--scenarios: unknown {', '.join(unknown) or '(none given)'}")
    if args.runs < 1 or args.n < 3:
        p.error("--runs must be at least 1 and --n at least 3")
    if args.n > MAX_N:
        p.error(f"--n is at most {MAX_N:,}: mosquitto_pub -l disconnects when the PUBACK for "
                "its last message's packet id arrives, and packet ids repeat after 65,535 "
                "(so an earlier message's PUBACK ends it early: seen with 150,000 and 70,000)")
    args.scenario_names = names
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        for cmd in ("mosquitto", "mosquitto_pub", "mosquitto_sub"):
            find_command(cmd)
    except PeerMissing as exc:
        print(f"bench_transport_mqtt: {exc}", file=sys.stderr)
        return 2
    # The gateway runs in a work directory: make the project's packages importable there
    # even when the virtualenv's editable install predates one of them (transports/).
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    info: dict[str, Any] = {"versions": versions(), "load_before": load()}
    log(f"load average {info['load_before']}")
    workdir = Path(tempfile.mkdtemp(prefix="bench-transport-mqtt-"))
    results = {s: Result(s) for s in SYSTEMS}
    try:
        for scenario in ("export", "import"):
            if scenario in args.scenario_names:
                bench_throughput(scenario, args, workdir, results)
        if "loss" in args.scenario_names:
            bench_loss(args, workdir, results)
    finally:
        if args.keep:
            log(f"work directories kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    info["load_after"] = load()
    report(results, args, info)
    if args.json:
        args.json.write_text(json.dumps({
            **info, "n": args.n, "runs": args.runs, "loss_rate": args.loss_rate,
            "outage": args.outage,
            "results": {r.system: {"msgs_per_s": r.rates, "runs": r.runs, "loss": r.loss,
                                   "errors": r.errors,
                                   "cpu": {s: [{"per_msg_us": c.per_msg_us,
                                                "machine_cpus": c.machine_cpus} for c in cs]
                                           for s, cs in r.cpu.items()}}
                        for r in results.values()},
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
