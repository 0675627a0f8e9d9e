"""MQTT benchmark: the gateway against mosquitto and amqtt, same load, same run.

    .venv/bin/python tests/bench/bench_mqtt.py                       # defaults below
    .venv/bin/python tests/bench/bench_mqtt.py --qos0-count 20000 --qos1-count 5000 \\
        --repeat 1 --idle-conns 1000 --brokers mosquitto,amqtt

How this works. Each broker is started by this script as its own process on a free port of
127.0.0.1 and stopped at the end: mosquitto through tests/peers/mosquitto.py (installed by
``bash tests/peers/install.sh``), amqtt from PyPI in its own virtualenv ``.bench-venv/``
(created on first use: amqtt pins websockets==15.0.1 and brings typer, psutil and transitions,
none of which belong in the project's environment), and the gateway as
``python -m gateway serve --config-dir DIR`` with a generated ``gateway.conf`` (one
``listen = mqtt://127.0.0.1:PORT`` line, ``store = DIR/data``) and a ``topics.conf`` that
lets any topic be created. A broker that does not come up (it exits, never listens, or does
not answer an MQTT CONNECT with a CONNACK) is reported as "failed to start: <its output's
tail>" and the others still run.

Throughput, for QoS 0 and QoS 1: ``mosquitto_sub -t bench/t -q QOS -C N+1`` starts first. A
warm-up message is published (``mosquitto_pub -m``), again and again with growing pauses,
until the subscriber prints it, which proves its subscription is in place; then the clock starts, ``mosquitto_pub -l``
is fed N lines of 64 bytes through a pipe, and the clock stops when mosquitto_sub exits
after the N-th message. The figure is N / elapsed, the median of --repeat runs. All brokers
run at once (each on its own port) and their runs are interleaved -- gateway, mosquitto,
amqtt, gateway, ... -- so that a machine that drifts during the bench moves every broker's
figures alike. (Should a
slow warm-up arrive twice, each extra copy counts against the N+1, and the figure counts
only the messages that arrived in the timed window.) The subscriber's output is counted and
its size checked: every message must arrive whole.

Idle connections: on a freshly started broker, K TCP connections each complete an MQTT 3.1.1
CONNECT / CONNACK (written by hand below, keep-alive 0) and stay open; the figure is the
growth of the broker's VmRSS (/proc/PID/status) divided by K. The broker is stopped before
the client sockets close, so the client side is left with no TIME_WAIT ports.

mosquitto runs with ``max_queued_messages 0`` (no limit) and the gateway with its equivalent
``mqtt_max_queued_messages = 0``: the default of 1000 queued QoS 1 messages per client, in
both, drops messages whenever the subscriber falls behind, and the run would never reach N.
amqtt's queues are not limited either.

Targets: QoS 0 at least 0.75 of mosquitto's and at least 5x amqtt's; QoS 1 at least 1.5x
mosquitto's; under 8 KB per idle connection.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from peers.mosquitto import (  # noqa: E402
    PeerFailedToStart,
    PeerMissing,
    find_command,
    free_port,
    start_mosquitto,
    stop_process,
    tail,
    wait_listening,
)

HOST = "127.0.0.1"
TOPIC = "bench/t"
PAYLOAD_SIZE = 64
WARMUP = b"warm-up"
BROKERS = ("gateway", "mosquitto", "amqtt")
AMQTT_REQUIREMENT = "amqtt==0.12.1"  # the version this script was verified with
START_TIMEOUT = 20.0  # the gateway opens its store before it listens
# A run with no message arriving for this long has lost messages (or the broker hangs).
STALL_TIMEOUT = 30.0
STALL_AFTER_PUBLISHER = 5.0  # ... or this long once the publisher has exited
FD_MARGIN = 200  # descriptors kept free beyond the idle connections (pipes, logs, venv, ...)

# The targets (module docstring).
TARGET_QOS0_VS_MOSQUITTO = 0.75
TARGET_QOS0_VS_AMQTT = 5.0
TARGET_QOS1_VS_MOSQUITTO = 1.5
TARGET_IDLE_BYTES = 8 * 1024

AMQTT_LAUNCHER = r"""
import asyncio, logging, sys
from amqtt.broker import Broker
logging.basicConfig(level=logging.WARNING)
config = {
    "listeners": {"default": {"type": "tcp", "bind": sys.argv[1]}},
    "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
}
async def main():
    broker = Broker(config)
    await broker.start()
    await asyncio.Event().wait()
asyncio.run(main())
"""


class BrokerFailed(Exception):
    """A broker did not start; the message is what to print after "failed to start: "."""


class BenchError(Exception):
    """One measurement failed (timeout, lost or damaged messages, a client's error)."""


def print_table(rows: Sequence[tuple[str, ...]]) -> None:
    """Print ``rows`` (the first is the header) as a table: the first column left-aligned,
    the others right-aligned, a rule under the header; after a blank line."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print()
    for i, row in enumerate(rows):
        print(" | ".join(c.ljust(w) if j == 0 else c.rjust(w)
                         for j, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip())
        if i == 0:
            print("-+-".join("-" * w for w in widths))

def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# --- MQTT 3.1.1 by hand (only what the idle test and the readiness check need) -------------

def remaining_length(n: int) -> bytes:
    """The variable-length "Remaining Length" of MQTT 3.1.1 section 2.2.3."""
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | 0x80 if n else byte)
        if not n:
            return bytes(out)


def connect_packet(client_id: bytes, keepalive: int = 0) -> bytes:
    """CONNECT (MQTT 3.1.1 section 3.1): protocol "MQTT" level 4, clean session, no will,
    no credentials; keep-alive 0 turns the broker's keep-alive timeout off."""
    body = (b"\x00\x04MQTT\x04\x02" + keepalive.to_bytes(2, "big")
            + len(client_id).to_bytes(2, "big") + client_id)
    return b"\x10" + remaining_length(len(body)) + body


CONNACK_ACCEPTED = b"\x20\x02\x00\x00"  # section 3.2: session present 0, return code 0


async def mqtt_connect(host: str, port: int, client_id: bytes,
                       timeout: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    try:
        writer.write(connect_packet(client_id))
        ack = await asyncio.wait_for(reader.readexactly(4), timeout)
    except BaseException:
        writer.close()
        raise
    if ack != CONNACK_ACCEPTED:
        writer.close()
        raise BenchError(f"CONNACK {ack.hex()} instead of {CONNACK_ACCEPTED.hex()}")
    return reader, writer


def mqtt_ping(host: str, port: int, timeout: float = 5.0) -> str | None:
    """None when the broker answers a CONNECT with an accepting CONNACK, else why not."""
    async def ping() -> None:
        _, writer = await mqtt_connect(host, port, b"bench-ping", timeout)
        writer.write(b"\xe0\x00")  # DISCONNECT
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    try:
        asyncio.run(ping())
    except (OSError, EOFError, BenchError) as exc:  # TimeoutError is an OSError
        return f"no CONNACK on {host}:{port}: {exc!r}"
    return None


# --- brokers ---------------------------------------------------------------------------------

@dataclass
class Running:
    """A started broker: where it listens, its pid (for VmRSS) and what its output says."""

    name: str
    port: int
    pid: int
    output_tail: Callable[[], str]
    stop: Callable[[], None]


def read_rss(pid: int) -> int:
    """Resident set size of ``pid`` in bytes, from /proc/PID/status (VmRSS, in kB)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise BenchError(f"no VmRSS for pid {pid}")


@contextlib.contextmanager
def run_process(name: str, argv: list[str], workdir: Path, port: int) -> Iterator[Running]:
    """Start ``argv`` (a broker that will listen on HOST:port), wait until it answers MQTT,
    stop it afterwards; BrokerFailed with its output's tail when it does not come up."""
    output = workdir / f"{name}.out"
    with output.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=workdir, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            wait_listening(HOST, port, proc, START_TIMEOUT)
            problem = mqtt_ping(HOST, port)
        except PeerFailedToStart as exc:
            problem = str(exc)
        if problem is None and proc.poll() is not None:
            problem = f"exited with status {proc.returncode}"
        if problem is not None:
            stop_process(proc)
            raise BrokerFailed(f"{problem}\n{tail(output, 15)}".rstrip())
        yield Running(name, port, proc.pid, lambda: tail(output, 15),
                      lambda: stop_process(proc))
    finally:
        stop_process(proc)


def amqtt_python(venv: Path, requirement: str) -> Path:
    """The python of a virtualenv holding amqtt, created and filled on first use."""
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import amqtt.broker"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        ignore_venv(venv)
        return python
    log(f"creating {venv} with {requirement} (first run only)")
    venv.mkdir(parents=True, exist_ok=True)
    ignore_venv(venv)  # before anything else lands there
    steps = [[sys.executable, "-m", "venv", str(venv)],
             [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
              requirement]]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            lines = (done.stdout + done.stderr).strip().splitlines()[-10:]
            raise BrokerFailed(f"could not install {requirement}:\n" + "\n".join(lines))
    return python


def ignore_venv(venv: Path) -> None:
    """Keep git away from the virtualenv whatever the project's .gitignore says (as
    Python 3.13's venv module does itself)."""
    marker = venv / ".gitignore"
    if not marker.exists():
        marker.write_text("# created by tests/bench/bench_mqtt.py\n*\n")


@contextlib.contextmanager
def start_broker(name: str, workdir: Path, args: argparse.Namespace) -> Iterator[Running]:
    workdir.mkdir(parents=True, exist_ok=True)
    if name == "mosquitto":
        try:
            with start_mosquitto(workdir, extra_config=["max_queued_messages 0"],
                                 start_timeout=START_TIMEOUT) as m:
                yield Running(name, m.port, m.pid, m.log_tail, m.stop)
        except (PeerMissing, PeerFailedToStart) as exc:
            raise BrokerFailed(str(exc)) from None
        return
    port = free_port(HOST)
    if name == "amqtt":
        python = amqtt_python(args.amqtt_venv, args.amqtt_requirement)
        argv = [str(python), "-c", AMQTT_LAUNCHER, f"{HOST}:{port}"]
    elif name == "gateway":
        conf = workdir / "conf"
        conf.mkdir(exist_ok=True)
        (conf / "gateway.conf").write_text(
            f"listen = mqtt://{HOST}:{port}\nstore = {workdir / 'data'}\n"
            "mqtt_max_queued_messages = 0\n")  # no limit, as mosquitto's here
        (conf / "topics.conf").write_text(">\n")  # any topic may be created
        argv = [sys.executable, "-m", "gateway", "serve", "--config-dir", str(conf)]
    else:
        raise BrokerFailed(f"unknown broker {name!r}")
    with run_process(name, argv, workdir, port) as running:
        yield running


def versions(args: argparse.Namespace) -> dict[str, str]:
    out = {}
    names = set(args.broker_names)
    try:
        head = subprocess.run([find_command("mosquitto"), "-h"], capture_output=True,
                              text=True).stdout.splitlines()
        out["mosquitto"] = head[0].split()[-1] if head else "?"
    except PeerMissing:
        out["mosquitto"] = "not installed"
    python = args.amqtt_venv / "bin" / "python"
    if "amqtt" in names and python.exists():
        done = subprocess.run([str(python), "-c", "import amqtt; print(amqtt.__version__)"],
                              capture_output=True, text=True)
        out["amqtt"] = done.stdout.strip() or "?"
    if "gateway" in names:
        try:
            import gateway
            out["gateway"] = gateway.__version__
        except ImportError:
            out["gateway"] = "?"
    return {name: version for name, version in out.items() if name in names}


# --- throughput ------------------------------------------------------------------------------

class OutputCounter(threading.Thread):
    """Drains a subscriber's stdout, counting lines and bytes; ``ended`` is the
    perf_counter() time of end of file, that is of the subscriber's exit (Popen.wait with a
    timeout polls at up to 50 ms intervals, too coarse for a one-second run)."""

    def __init__(self, fd: int) -> None:
        super().__init__(daemon=True)
        self.fd = fd
        self.lines = 0
        self.bytes = 0
        self.ended = 0.0

    def run(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self.ended = time.perf_counter()
                return
            self.lines += chunk.count(b"\n")
            self.bytes += len(chunk)


def client_args(port: int, qos: int) -> list[str]:
    return ["-h", HOST, "-p", str(port), "-V", "mqttv311", "-t", TOPIC, "-q", str(qos)]


def wait_subscribed(sub: subprocess.Popen[bytes], port: int, qos: int,
                    deadline: float) -> int:
    """Publish a warm-up message until the subscriber prints it (waiting 50 ms after the
    first, doubling up to 1 s); return how many warm-up copies it printed (normally 1), after
    0.3 s of quiet."""
    assert sub.stdout is not None
    fd = sub.stdout.fileno()
    pub = [find_command("mosquitto_pub"), *client_args(port, qos), "-m", WARMUP.decode()]
    buf = b""
    quiet_until = 0.0
    interval = 0.05
    while True:
        now = time.monotonic()
        if buf and now >= quiet_until:
            break
        if now > deadline:
            raise BenchError("the subscriber never received the warm-up message")
        if not buf:
            done = subprocess.run(pub, capture_output=True, timeout=30)
            if done.returncode != 0:
                raise BenchError(f"mosquitto_pub (warm-up) failed: {done.stderr.decode()!r}")
        wait_end = min(quiet_until if buf else time.monotonic() + interval, deadline)
        interval = min(interval * 2, 1.0)
        while (left := wait_end - time.monotonic()) > 0:
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                err = sub.stderr.read().decode(errors="replace") if sub.stderr else ""
                raise BenchError(f"mosquitto_sub exited ({sub.wait()}): {err.strip()!r}")
            if not buf:
                quiet_until = time.monotonic() + 0.3
            buf += chunk
    copies = buf.split(b"\n")
    if copies[-1] != b"" or any(c != WARMUP for c in copies[:-1]):
        raise BenchError(f"unexpected warm-up output {buf[:200]!r}")
    return len(copies) - 1


def run_throughput(port: int, qos: int, count: int, timeout: float) -> float:
    """One run: messages per second from mosquitto_pub -l to mosquitto_sub -C through the
    broker on ``port``."""
    deadline = time.monotonic() + timeout
    sub = subprocess.Popen([find_command("mosquitto_sub"), *client_args(port, qos),
                            "-C", str(count + 1)],
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    pub: subprocess.Popen[bytes] | None = None
    try:
        warmups = wait_subscribed(sub, port, qos, deadline)
        assert sub.stdout is not None
        counter = OutputCounter(sub.stdout.fileno())
        counter.start()
        data = (b"m" * PAYLOAD_SIZE + b"\n") * count
        t0 = time.perf_counter()
        pub = subprocess.Popen([find_command("mosquitto_pub"), *client_args(port, qos), "-l"],
                               stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
        writer = threading.Thread(target=feed, args=(pub, data), daemon=True)
        writer.start()
        expected = count + 1 - warmups
        seen, progress_at = 0, time.monotonic()
        while counter.is_alive():
            counter.join(0.2)
            now = time.monotonic()
            if counter.lines != seen:
                seen, progress_at = counter.lines, now
            idle = now - progress_at
            if now > deadline or idle > STALL_TIMEOUT or (
                    pub.poll() is not None and idle > STALL_AFTER_PUBLISHER):
                why = f"timed out after {timeout:g} s" if now > deadline else (
                    f"stalled for {idle:.0f} s")
                raise BenchError(f"{why}: {counter.lines} of {expected} messages arrived "
                                 f"(publisher status {pub.poll()})")
        elapsed = counter.ended - t0
        if sub.wait(10) != 0:
            err = sub.stderr.read().decode(errors="replace") if sub.stderr else ""
            raise BenchError(f"mosquitto_sub exited with {sub.returncode}: {err.strip()!r}")
        if counter.lines != expected or counter.bytes != expected * (PAYLOAD_SIZE + 1):
            raise BenchError(f"received {counter.lines} lines / {counter.bytes} bytes, "
                             f"expected {expected} messages of {PAYLOAD_SIZE} bytes")
        try:
            pub.wait(10)
        except subprocess.TimeoutExpired:
            pass  # a publisher still flushing after the subscriber is done does not count
        return expected / elapsed
    finally:
        for proc in (pub, sub):
            if proc is not None:
                stop_process(proc, grace=2.0)
                for stream in (proc.stdin, proc.stdout, proc.stderr):
                    if stream is not None:
                        with contextlib.suppress(OSError):
                            stream.close()


def feed(pub: subprocess.Popen[bytes], data: bytes) -> None:
    assert pub.stdin is not None
    with contextlib.suppress(OSError):  # the publisher may exit early on an error
        pub.stdin.write(data)
        pub.stdin.close()


# --- idle connections ------------------------------------------------------------------------

def raise_nofile(wanted: int) -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (children, the brokers, inherit it);
    return how many idle connections fit (at most ``wanted``)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, wanted + FD_MARGIN)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return max(0, min(wanted, target - FD_MARGIN))


async def open_idle(port: int, count: int, timeout: float,
                    measure: Callable[[], None], stop: Callable[[], None]) -> None:
    """Open ``count`` MQTT connections (CONNECT / CONNACK each), call ``measure()``, then
    ``stop()`` the broker before closing the client sockets."""
    writers: list[asyncio.StreamWriter] = []
    limit = asyncio.Semaphore(64)
    deadline = time.monotonic() + timeout

    async def one(i: int) -> None:
        async with limit:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError("timed out")
            _, writer = await mqtt_connect(HOST, port, b"idle-%d" % i, left)
            writers.append(writer)

    try:
        results = await asyncio.gather(*(one(i) for i in range(count)), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise BenchError(f"{len(errors)} of {count} connections failed "
                             f"(first: {errors[0]!r})")
        measure()
    finally:
        stop()
        for w in writers:
            w.close()
        await asyncio.sleep(0)


def measure_idle(running: Running, count: int, timeout: float) -> float:
    """Bytes of broker RSS per idle MQTT connection."""
    # One connection first, so code paths loaded lazily are not charged to the K connections.
    problem = mqtt_ping(HOST, running.port)
    if problem:
        raise BenchError(problem)
    time.sleep(0.5)
    before = read_rss(running.pid)
    after = 0

    def measure() -> None:
        nonlocal after
        time.sleep(1.0)  # let the broker finish the last handshakes
        after = read_rss(running.pid)

    asyncio.run(open_idle(running.port, count, timeout, measure, running.stop))
    return (after - before) / count


# --- the run ---------------------------------------------------------------------------------

@dataclass
class Result:
    name: str
    start_error: str | None = None
    rates: dict[int, float] = field(default_factory=dict)
    runs: dict[int, list[float]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    idle_bytes: float | None = None


def bench_throughput(names: list[str], args: argparse.Namespace, workdir: Path,
                     results: dict[str, Result]) -> None:
    """Every broker started at once; runs interleaved (gateway, mosquitto, amqtt, gateway,
    ...) so that a machine that drifts slower or faster during the bench shifts every
    broker's figures alike instead of the one measured last."""
    with contextlib.ExitStack() as stack:
        running: dict[str, Running] = {}
        for name in names:
            result = results[name]
            try:
                r = stack.enter_context(start_broker(name, workdir / name, args))
            except BrokerFailed as exc:
                result.start_error = str(exc)
                log(f"{name}: failed to start: {exc}")
                continue
            log(f"{name}: listening on {HOST}:{r.port} (pid {r.pid})")
            running[name] = r
        for qos, count in ((0, args.qos0_count), (1, args.qos1_count)):
            if count <= 0:
                continue
            runs: dict[str, list[float]] = {name: [] for name in running}
            for rep in range(args.repeat):
                for name, r in running.items():
                    if f"QoS {qos}" in results[name].errors:
                        continue
                    try:
                        rate = run_throughput(r.port, qos, count, args.timeout)
                    except BenchError as exc:
                        results[name].errors[f"QoS {qos}"] = str(exc)
                        log(f"{name}: QoS {qos}: {exc}\n{r.output_tail()}")
                        continue
                    log(f"{name}: QoS {qos} run {rep + 1}: {rate:,.0f} msgs/s")
                    runs[name].append(rate)
            for name, rates in runs.items():
                if rates and f"QoS {qos}" not in results[name].errors:
                    results[name].runs[qos] = rates
                    results[name].rates[qos] = statistics.median(rates)


def bench_idle(name: str, args: argparse.Namespace, workdir: Path, idle_count: int,
               result: Result) -> None:
    """Idle-connection memory, on a freshly started broker of its own."""
    if idle_count <= 0 or result.start_error is not None:
        return
    try:
        with start_broker(name, workdir / f"{name}-idle", args) as running:
            result.idle_bytes = measure_idle(running, idle_count, args.timeout)
            log(f"{name}: {result.idle_bytes:,.0f} bytes per idle connection")
    except (BrokerFailed, BenchError, OSError) as exc:
        result.errors["idle"] = str(exc)
        log(f"{name}: idle connections: {exc}")


def fmt_rate(r: Result, qos: int) -> str:
    if qos in r.rates:
        return f"{r.rates[qos]:,.0f}"
    return "error" if f"QoS {qos}" in r.errors else "-"


def fmt_idle(r: Result) -> str:
    if r.idle_bytes is not None:
        return f"{r.idle_bytes:,.0f}"
    return "error" if "idle" in r.errors else "-"


def report(results: dict[str, Result], idle_count: int, idle_wanted: int,
           info: dict[str, str]) -> None:
    rows = [("broker", "QoS0 msgs/s", "QoS1 msgs/s", "idle bytes/conn")]
    for r in results.values():
        if r.start_error is not None:
            rows.append((r.name, "failed to start", "", ""))
        else:
            rows.append((r.name, fmt_rate(r, 0), fmt_rate(r, 1), fmt_idle(r)))
    print_table(rows)
    lowered = (f" (not {idle_wanted:,}: the RLIMIT_NOFILE hard limit is too low)"
               if idle_count < idle_wanted else "")
    print(f"\nversions: {', '.join(f'{k} {v}' for k, v in info.items())}; "
          f"{idle_count:,} idle connections{lowered}")
    for r in results.values():
        if r.start_error is not None:
            print(f"\n{r.name}: failed to start: {r.start_error}")
        for what, err in r.errors.items():
            print(f"\n{r.name} {what}: {err}")

    gw = results.get("gateway")
    if gw is None:
        return
    print("\nratios (gateway / other) against the targets:")

    def ratio(label: str, mine: float | None, other: float | None, target: float) -> None:
        if mine is None or other is None or other == 0:
            print(f"  {label:<26} n/a (target >= {target:g})")
            return
        value = mine / other
        verdict = "meets" if value >= target else "MISSES"
        print(f"  {label:<26} {value:6.2f}  target >= {target:g}  {verdict}")

    mosq = results.get("mosquitto")
    amq = results.get("amqtt")
    ratio("QoS 0 gateway/mosquitto", gw.rates.get(0), mosq.rates.get(0) if mosq else None,
          TARGET_QOS0_VS_MOSQUITTO)
    ratio("QoS 0 gateway/amqtt", gw.rates.get(0), amq.rates.get(0) if amq else None,
          TARGET_QOS0_VS_AMQTT)
    ratio("QoS 1 gateway/mosquitto", gw.rates.get(1), mosq.rates.get(1) if mosq else None,
          TARGET_QOS1_VS_MOSQUITTO)
    if gw.idle_bytes is None:
        print(f"  {'idle bytes/conn':<26} n/a (target < {TARGET_IDLE_BYTES})")
    else:
        verdict = "meets" if gw.idle_bytes < TARGET_IDLE_BYTES else "MISSES"
        print(f"  {'idle bytes/conn':<26} {gw.idle_bytes:6,.0f}  target < {TARGET_IDLE_BYTES}"
              f"  {verdict}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--brokers", default=",".join(BROKERS),
                   help="comma-separated, from gateway,mosquitto,amqtt (default: all)")
    p.add_argument("--qos0-count", type=int, default=100_000, help="messages per QoS 0 run")
    p.add_argument("--qos1-count", type=int, default=50_000,
                   help="messages per QoS 1 run (at most 65535)")
    p.add_argument("--repeat", type=int, default=3, help="runs per figure; the median counts")
    p.add_argument("--idle-conns", type=int, default=10_000,
                   help="idle connections for the memory figure (0: skip)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds one run may take before it counts as failed")
    p.add_argument("--amqtt-venv", type=Path, default=ROOT / ".bench-venv",
                   help="virtualenv for amqtt, created when missing (default: .bench-venv/)")
    p.add_argument("--amqtt-requirement", default=AMQTT_REQUIREMENT,
                   help=f"what pip installs there (default: {AMQTT_REQUIREMENT})")
    p.add_argument("--json", type=Path, help="also write the results to this file")
    p.add_argument("--keep", action="store_true", help="keep the brokers' work directories")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.brokers.split(",") if n.strip()]
    unknown = sorted(set(names) - set(BROKERS))
    if unknown or not names:
        p.error(f"--brokers: unknown {', '.join(unknown) or '(none given)'}")
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    if args.qos1_count > 65_535:
        p.error("--qos1-count is at most 65,535: mosquitto_pub -l disconnects when the PUBACK "
                "for its last message's packet id arrives, and packet ids repeat after 65,535")
    args.broker_names = names
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        find_command("mosquitto_pub")
        find_command("mosquitto_sub")
    except PeerMissing as exc:
        print(f"bench_mqtt: {exc}", file=sys.stderr)
        return 2
    idle_count = args.idle_conns
    if idle_count > 0:
        idle_count = raise_nofile(args.idle_conns)
        if idle_count < args.idle_conns:
            log(f"RLIMIT_NOFILE hard limit {resource.getrlimit(resource.RLIMIT_NOFILE)[1]} "
                f"is too low for {args.idle_conns:,} connections: measuring {idle_count:,}")
    workdir = Path(tempfile.mkdtemp(prefix="bench-mqtt-"))
    results: dict[str, Result] = {}
    try:
        for name in args.broker_names:
            results[name] = Result(name)
        bench_throughput(list(args.broker_names), args, workdir, results)
        for name in args.broker_names:
            bench_idle(name, args, workdir, idle_count, results[name])
    finally:
        if args.keep:
            log(f"work directories kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    info = versions(args)
    report(results, idle_count, args.idle_conns, info)
    if args.json:
        args.json.write_text(json.dumps({
            "versions": info, "idle_connections": idle_count,
            "qos0_count": args.qos0_count, "qos1_count": args.qos1_count,
            "repeat": args.repeat,
            "results": {n: {"start_error": r.start_error, "msgs_per_s": r.rates,
                            "runs": r.runs, "idle_bytes_per_conn": r.idle_bytes,
                            "errors": r.errors} for n, r in results.items()},
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
