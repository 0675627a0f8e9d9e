"""AMQP 1.0 benchmark: the gateway against RabbitMQ, same load, same run.

    .venv/bin/python tests/bench/bench_amqp.py                      # defaults below
    .venv/bin/python tests/bench/bench_amqp.py --brokers rabbitmq --queue-count 20000 \\
        --qos0-count 20000 --qos1-count 10000 --repeat 1

How this works. Each broker is started by this script on free ports of 127.0.0.1 and stopped
at the end: RabbitMQ 3.10 through tests/peers/rabbitmq.py (a private node with its AMQP 1.0
and MQTT plugins; installed by ``bash tests/peers/install.sh``), the gateway as
``python -m gateway serve --config-dir DIR`` with a generated ``gateway.conf``
(``listen = amqp://127.0.0.1:PORT``, ``listen = mqtt://127.0.0.1:PORT2``,
``store = DIR/data``) and a ``topics.conf`` and a ``queues.conf`` that each hold the single
line ``>`` (any destination may be created). A broker that does not come up (it exits,
never listens, does not answer an MQTT CONNECT with a CONNACK or an AMQP open with an open)
is reported as "failed to start: <its output's tail>" and the others still run; a broker
that exits during the runs has its remaining figures skipped.

The clients are fast, so that they are not what is measured: rhea (tests/peers/rhea/, npm;
send.js pipelines its transfers up to the link credit, receive.js keeps --credit
outstanding) and mosquitto_pub -l; rhea connects with SASL ANONYMOUS (--sasl none: no SASL
layer). Every figure is a number of messages of 64 bytes divided by the time from the first
send to the last receive, the median of --repeat runs; an untimed run of --warmup messages
before each path lets the JITs and the broker settle (and creates the queue). Each client's
CPU time (user + system, from wait4, less what it used before the window) and the broker's
(from /proc/PID/stat) are reported as a share of that time: a client near 100% of its one
core is the bottleneck, and the table marks it with "!"; the "machine" column adds them up
as a share of all the CPUs.

(a) AMQP queue: receive.js attaches to the queue (gateway ``queue://bench``, RabbitMQ
``/queue/bench``) and asks for N messages; once it is attached, send.js sends N messages
(one data section of 64 bytes each), either unsettled, the receiver accepting each (at least
once: the sender is done when every outcome is in), or presettled on both links (at most
once; send.js then keeps its connection open until the receiver has all N, because
RabbitMQ 3.10 drops the presettled messages it has not routed yet when the connection
closes). The time runs from send.js's first send to receive.js's N-th message (both clocks
are the machine's wall clock, in ms); every message must arrive whole and, unsettled, be
accepted.

(b) MQTT to AMQP: receive.js attaches to the topic (gateway ``topic://bench.t``, RabbitMQ
``/topic/bench.t``: its MQTT plugin publishes MQTT ``bench/t`` to amq.topic with routing
key ``bench.t``), presettled for QoS 0 and accepting for QoS 1, and asks for N + 1 messages;
one warm-up message (``mosquitto_pub -q 1 -m warm-up``) must arrive first, which proves the
subscription is in place; then the clock starts, ``mosquitto_pub -q QOS -l`` is fed N lines
of 64 bytes through a pipe, and the clock stops at the last message. RabbitMQ 3.10 never
deletes the queues of ``/topic`` links, so those of earlier runs are deleted (rabbitmqctl)
before each run; otherwise they would collect copies of every later message.

Target: the gateway at least matches RabbitMQ on both paths, so every ratio
gateway / RabbitMQ should be >= 1. Measured on one machine, clients and broker share its
CPUs: read the CPU columns before the ratios.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import queue
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

from bench_mqtt import (  # noqa: E402
    HOST,
    PAYLOAD_SIZE,
    WARMUP,
    BenchError,
    BrokerFailed,
    client_args,
    feed,
    log,
    run_process,
)
from peers.mosquitto import (  # noqa: E402
    PeerFailedToStart,
    PeerMissing,
    find_command,
    free_port,
    stop_process,
    wait_listening,
)
from peers.rabbitmq import RabbitMQ, start_rabbitmq  # noqa: E402
from peers.rhea import RHEA_DIR, rhea_argv  # noqa: E402

BROKERS = ("gateway", "rabbitmq")
START_TIMEOUT = 20.0  # the gateway opens its store before it listens
# A run whose receiver sees no message for this long has lost messages (or the broker hangs).
STALL_TIMEOUT = 30.0
# A client using more than this share of its one core is probably what limits the figure.
CLIENT_BOUND = 0.9
TARGET_VS_RABBITMQ = 1.0  # the gateway at least matches RabbitMQ on both paths
CLK_TCK = os.sysconf("SC_CLK_TCK")

# The figures: key, label, path.
FIGURES = (
    ("queue-unsettled", "AMQP queue, at-least-once", "queue"),
    ("queue-presettled", "AMQP queue, presettled", "queue"),
    ("mqtt-qos0", "MQTT QoS 0 -> AMQP topic", "mqtt"),
    ("mqtt-qos1", "MQTT QoS 1 -> AMQP topic", "mqtt"),
)
PAYLOAD_B64 = base64.b64encode(b"m" * PAYLOAD_SIZE).decode()


# --- brokers ---------------------------------------------------------------------------------


@dataclass
class Broker:
    """A started broker: its ports, its pid (for CPU), its addresses and what its output says."""

    name: str
    amqp_port: int
    mqtt_port: int
    pid: int
    queue_address: str
    topic_address: str
    output_tail: Callable[[], str]
    before_topic_run: Callable[[], None] = lambda: None


def amqp_ping(host: str, port: int, timeout: float = 5.0) -> str | None:
    """None when an AMQP 1.0 connection opens (python-qpid-proton, SASL ANONYMOUS if the
    broker offers SASL), else why not."""
    from proton.utils import BlockingConnection

    try:
        BlockingConnection(f"amqp://{host}:{port}", timeout=timeout).close()
    except Exception as exc:  # proton raises its own and OS errors
        return f"no AMQP 1.0 open on {host}:{port}: {exc!r}"
    return None


def delete_topic_queues(node: RabbitMQ) -> None:
    """Delete the amq.gen- queues that earlier /topic links left behind (RabbitMQ 3.10 makes
    them neither exclusive nor auto-delete)."""
    names = node.ctl("list_queues", "name", "--quiet", "--no-table-headers").stdout.split()
    for name in names:
        if name.startswith("amq.gen-"):
            node.ctl("delete_queue", name)


@contextlib.contextmanager
def start_broker(name: str, workdir: Path) -> Iterator[Broker]:
    workdir.mkdir(parents=True, exist_ok=True)
    if name == "rabbitmq":
        try:
            with start_rabbitmq(workdir) as node:
                log(f"rabbitmq: started in {node.startup_seconds:.1f} s")
                problem = amqp_ping(HOST, node.amqp_port)
                if problem:
                    raise BrokerFailed(f"{problem}\n{node.log_tail(15)}")
                yield Broker(
                    name,
                    node.amqp_port,
                    node.mqtt_port,
                    node.pid,
                    "/queue/bench",
                    "/topic/bench.t",
                    node.log_tail,
                    lambda: delete_topic_queues(node),
                )
        except (PeerMissing, PeerFailedToStart) as exc:
            raise BrokerFailed(str(exc)) from None
        return
    if name != "gateway":
        raise BrokerFailed(f"unknown broker {name!r}")
    amqp_port, mqtt_port = free_port(HOST), free_port(HOST)
    conf = workdir / "conf"
    conf.mkdir(exist_ok=True)
    (conf / "gateway.conf").write_text(
        f"listen = amqp://{HOST}:{amqp_port}\nlisten = mqtt://{HOST}:{mqtt_port}\n"
        f"store = {workdir / 'data'}\n"
    )
    (conf / "topics.conf").write_text(">\n")  # any topic may be created
    (conf / "queues.conf").write_text(">\n")  # any queue may be created
    argv = [sys.executable, "-m", "gateway", "serve", "--config-dir", str(conf)]
    # run_process waits for the MQTT listener and a CONNACK; then the AMQP one must answer.
    with run_process(name, argv, workdir, mqtt_port) as running:
        try:
            wait_listening(HOST, amqp_port, None, START_TIMEOUT)
            problem = amqp_ping(HOST, amqp_port)
        except PeerFailedToStart as exc:
            problem = str(exc)
        if problem is not None:
            raise BrokerFailed(f"{problem}\n{running.output_tail()}".rstrip())
        yield Broker(
            name,
            amqp_port,
            mqtt_port,
            running.pid,
            "queue://bench",
            "topic://bench.t",
            running.output_tail,
        )


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (exists and is not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) that process ``pid`` has used, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)


# --- clients ---------------------------------------------------------------------------------


def wait_cpu(proc: subprocess.Popen[Any], timeout: float) -> float:
    """Wait for ``proc`` (killing it after ``timeout`` seconds) and return the CPU seconds it
    used, from wait4's rusage; sets ``proc.returncode``."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return usage.ru_utime + usage.ru_stime
        if time.monotonic() > deadline:
            proc.kill()
            deadline = float("inf")
        time.sleep(0.005)


class Rhea:
    """A rhea script (tests/peers/rhea/) run in the background; a thread queues its JSON
    lines, its stderr goes to a file."""

    def __init__(self, script: str, spec: dict[str, Any], workdir: Path) -> None:
        self.script = script
        self.stderr_path = workdir / f"{script}.err"
        with self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                rhea_argv(script, spec),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                cwd=RHEA_DIR,
            )
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self.cpu_before = 0.0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip():
                self.lines.put(json.loads(line))
        self.lines.put(None)

    def expect(self, event: str, timeout: float) -> dict[str, Any]:
        """The next line with ``event``; BenchError when an error line, the end of the output
        or ``timeout`` comes first."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                obj = self.lines.get(timeout=max(deadline - time.monotonic(), 0.001))
            except queue.Empty:
                raise BenchError(
                    f"{self.script}.js: no {event!r} after {timeout:g} s "
                    f"(last lines {self.seen[-3:]})"
                ) from None
            if obj is None:
                err = self.stderr_path.read_text(errors="replace")[-500:]
                raise BenchError(
                    f"{self.script}.js ended before {event!r} (status "
                    f"{self.proc.poll()}, last lines {self.seen[-3:]}, "
                    f"stderr {err!r})"
                )
            self.seen.append(obj)
            if obj.get("event") == event:
                return obj
            if obj.get("event") == "error":
                raise BenchError(f"{self.script}.js: {obj}")

    def mark_cpu(self) -> None:
        """Note the CPU time used so far (start-up, connecting), which ``cpu`` leaves out."""
        with contextlib.suppress(OSError):
            self.cpu_before = process_cpu(self.proc.pid)

    def cpu(self, timeout: float = 10.0) -> float:
        """CPU seconds since ``mark_cpu``, once the script has exited."""
        return wait_cpu(self.proc, timeout) - self.cpu_before

    def stop(self) -> None:
        if self.proc.returncode is None:
            stop_process(self.proc, grace=2.0)
        if self.proc.stdout is not None:
            with contextlib.suppress(OSError):
                self.proc.stdout.close()


@dataclass
class Run:
    rate: float
    client_cpu: dict[str, float]  # client -> share of the timed window
    broker_cpu: float


def connection_spec(broker: Broker, args: argparse.Namespace) -> dict[str, Any]:
    spec: dict[str, Any] = {"port": broker.amqp_port, "host": HOST, "timeout": args.timeout}
    if args.sasl == "anonymous":
        spec["sasl"] = "anonymous"
    return spec


def run_queue(
    broker: Broker, settle: str, count: int, args: argparse.Namespace, workdir: Path
) -> Run:
    """Path (a): send.js -> queue -> receive.js, ``settle`` "unsettled" or "presettled"."""
    base = connection_spec(broker, args)
    address = broker.queue_address
    receiver = Rhea(
        "receive",
        {
            **base,
            "address": address,
            "count": count,
            "credit": args.credit,
            "settle": settle,
            "quiet": True,
            "idle": STALL_TIMEOUT,
        },
        workdir,
    )
    sender: Rhea | None = None
    try:
        receiver.expect("attached", 30)
        receiver.mark_cpu()
        cpu0, wall0 = process_cpu(broker.pid), time.monotonic()
        sender = Rhea(
            "send",
            {
                **base,
                "address": address,
                "count": count,
                "settle": settle,
                "quiet": True,
                # Presettled: keep the connection open until stopped below (RabbitMQ 3.10
                # drops what it has not routed yet when the connection closes).
                "linger": args.timeout if settle == "presettled" else 0,
                "messages": [
                    {"body": {"type": "binary", "value": PAYLOAD_B64}, "body_section": "data"}
                ],
            },
            workdir,
        )
        sender.expect("attached", 30)
        sender.mark_cpu()
        started = sender.expect("sent", args.timeout)["started_at"]
        received = receiver.expect("done", args.timeout)
        if settle == "unsettled":
            sent = sender.expect("done", args.timeout)
            if sent["outcomes"] != {"accepted": count}:
                raise BenchError(f"outcomes {sent['outcomes']}, expected {count} accepted")
        else:
            sender.proc.terminate()  # lingering: the receiver has what it wanted
        cpu1, wall1 = process_cpu(broker.pid), time.monotonic()
        if received["reason"] != "count" or received["received"] != count:
            raise BenchError(
                f"stalled: {received['received']} of {count} messages arrived "
                f"(nothing for {STALL_TIMEOUT:g} s)"
            )
        if received["bytes"] != count * PAYLOAD_SIZE:
            raise BenchError(
                f"received {received['bytes']} body bytes, expected {count} x {PAYLOAD_SIZE}"
            )
        elapsed = (received["last_at"] - started) / 1000
        if elapsed <= 0:
            raise BenchError(f"the run took {elapsed * 1000:g} ms: too few messages to time")
        cpu = {"send.js": sender.cpu() / elapsed, "receive.js": receiver.cpu() / elapsed}
        return Run(count / elapsed, cpu, (cpu1 - cpu0) / (wall1 - wall0))
    finally:
        for client in (sender, receiver):
            if client is not None:
                client.stop()


def run_mqtt(broker: Broker, qos: int, count: int, args: argparse.Namespace, workdir: Path) -> Run:
    """Path (b): mosquitto_pub -l -> MQTT topic bench/t -> receive.js on the AMQP topic."""
    broker.before_topic_run()
    settle = "presettled" if qos == 0 else "unsettled"
    receiver = Rhea(
        "receive",
        {
            **connection_spec(broker, args),
            "address": broker.topic_address,
            "count": count + 1,
            "credit": args.credit,
            "settle": settle,
            "quiet": True,
            "report_first": True,
            "idle": STALL_TIMEOUT,
        },
        workdir,
    )
    pub: subprocess.Popen[bytes] | None = None
    try:
        receiver.expect("attached", 30)
        warm = [
            find_command("mosquitto_pub"),
            *client_args(broker.mqtt_port, 1),
            "-m",
            WARMUP.decode(),
        ]
        done = subprocess.run(warm, capture_output=True, timeout=30)
        if done.returncode != 0:
            raise BenchError(f"mosquitto_pub (warm-up) failed: {done.stderr.decode()!r}")
        try:
            receiver.expect("first", 10)
        except BenchError as exc:
            raise BenchError(f"the receiver never got the warm-up message: {exc}") from None
        data = (b"m" * PAYLOAD_SIZE + b"\n") * count
        receiver.mark_cpu()
        cpu0, wall0 = process_cpu(broker.pid), time.monotonic()
        t0 = time.time()
        pub = subprocess.Popen(
            [find_command("mosquitto_pub"), *client_args(broker.mqtt_port, qos), "-l"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        threading.Thread(target=feed, args=(pub, data), daemon=True).start()
        received = receiver.expect("done", args.timeout)
        cpu1, wall1 = process_cpu(broker.pid), time.monotonic()
        if received["reason"] != "count" or received["received"] != count + 1:
            raise BenchError(
                f"stalled: {received['received'] - 1} of {count} messages "
                f"arrived (nothing for {STALL_TIMEOUT:g} s)"
            )
        if received["bytes"] != len(WARMUP) + count * PAYLOAD_SIZE:
            raise BenchError(
                f"received {received['bytes']} body bytes, expected the warm-up "
                f"and {count} x {PAYLOAD_SIZE}"
            )
        elapsed = received["last_at"] / 1000 - t0
        if elapsed <= 0:
            raise BenchError(f"the run took {elapsed * 1000:g} ms: too few messages to time")
        cpu = {"mosquitto_pub": wait_cpu(pub, 30) / elapsed, "receive.js": receiver.cpu() / elapsed}
        return Run(count / elapsed, cpu, (cpu1 - cpu0) / (wall1 - wall0))
    finally:
        if pub is not None and pub.returncode is None:
            stop_process(pub, grace=2.0)
        receiver.stop()


# --- the run ---------------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    start_error: str | None = None
    runs: dict[str, list[Run]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def rate(self, key: str) -> float | None:
        runs = self.runs.get(key)
        return statistics.median(r.rate for r in runs) if runs else None

    def median_run(self, key: str) -> Run | None:
        runs = sorted(self.runs.get(key, []), key=lambda r: r.rate)
        return runs[len(runs) // 2] if runs else None


def measure(key: str, broker: Broker, count: int, args: argparse.Namespace, workdir: Path) -> Run:
    if key == "queue-unsettled":
        return run_queue(broker, "unsettled", count, args, workdir)
    if key == "queue-presettled":
        return run_queue(broker, "presettled", count, args, workdir)
    return run_mqtt(broker, 0 if key == "mqtt-qos0" else 1, count, args, workdir)


def bench_broker(name: str, args: argparse.Namespace, workdir: Path) -> Result:
    result = Result(name)
    counts = {
        "queue-unsettled": args.queue_count,
        "queue-presettled": args.queue_count,
        "mqtt-qos0": args.qos0_count,
        "mqtt-qos1": args.qos1_count,
    }
    try:
        with start_broker(name, workdir / name) as broker:
            log(
                f"{name}: AMQP on {HOST}:{broker.amqp_port}, MQTT on {HOST}:{broker.mqtt_port}"
                f" (pid {broker.pid})"
            )
            warmed: set[str] = set()
            for key, label, path in FIGURES:
                if counts[key] <= 0:
                    continue
                runs: list[Run] = []
                try:
                    if args.warmup > 0 and path not in warmed:
                        warmed.add(path)
                        measure(key, broker, args.warmup, args, workdir)
                    for rep in range(args.repeat):
                        run = measure(key, broker, counts[key], args, workdir)
                        cpu = ", ".join(f"{c} {v:.0%}" for c, v in run.client_cpu.items())
                        log(
                            f"{name}: {label} run {rep + 1}: {run.rate:,.0f} msgs/s "
                            f"(CPU: {cpu}, broker {run.broker_cpu:.0%})"
                        )
                        runs.append(run)
                except BenchError as exc:
                    result.errors[key] = str(exc)
                    log(f"{name}: {label}: {exc}\n{broker.output_tail()}")
                    if not process_alive(broker.pid):
                        result.errors[key] += f"; {name} exited:\n{broker.output_tail()}"
                        log(f"{name}: exited; its remaining figures are skipped")
                        break
                    continue
                result.runs[key] = runs
    except BrokerFailed as exc:
        result.start_error = str(exc)
        log(f"{name}: failed to start: {exc}")
    return result


def versions(names: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    if "rabbitmq" in names:
        done = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Version}", "rabbitmq-server"],
            capture_output=True,
            text=True,
        )
        out["rabbitmq"] = done.stdout.strip() or "not installed"
    if "gateway" in names:
        try:
            import gateway

            out["gateway"] = gateway.__version__
        except ImportError:
            out["gateway"] = "?"
    with contextlib.suppress(OSError, ValueError):
        out["rhea"] = json.loads((RHEA_DIR / "node_modules/rhea/package.json").read_text())[
            "version"
        ]
    with contextlib.suppress(OSError, PeerMissing):
        out["node"] = subprocess.run(
            [find_command("node"), "--version"], capture_output=True, text=True
        ).stdout.strip()
    return out


def report(results: dict[str, Result], info: dict[str, str], args: argparse.Namespace) -> None:
    cpus = os.cpu_count() or 1
    rows = [("figure", "broker", "msgs/s", "client CPU", "broker CPU", "machine")]
    for key, label, _ in FIGURES:
        for r in results.values():
            if r.start_error is not None:
                continue
            run = r.median_run(key)
            rate = r.rate(key)
            if run is None or rate is None:
                rows.append((label, r.name, "error" if key in r.errors else "-", "", "", ""))
                continue
            busiest = max(run.client_cpu.values())
            mark = " !" if busiest >= CLIENT_BOUND else ""
            clients = " ".join(f"{v:.0%}" for v in run.client_cpu.values())
            machine = (sum(run.client_cpu.values()) + run.broker_cpu) / cpus
            rows.append(
                (
                    label,
                    r.name,
                    f"{rate:,.0f}",
                    clients + mark,
                    f"{run.broker_cpu:.0%}",
                    f"{machine:.0%}",
                )
            )
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
    print(
        f"\nversions: {', '.join(f'{k} {v}' for k, v in info.items())}; "
        f"{PAYLOAD_SIZE}-byte messages; median of {args.repeat} run(s); client CPU: "
        f"share of one core per client (send.js or mosquitto_pub, then receive.js), "
        f"'!' at {CLIENT_BOUND:.0%} or more: the client may be the bottleneck; broker CPU: "
        f"share of one core; machine: clients and broker together, share of all {cpus} CPUs "
        f"(near 100%: they compete for the CPUs, and the figures say more about the machine)"
    )
    for r in results.values():
        if r.start_error is not None:
            print(f"\n{r.name}: failed to start: {r.start_error}")
        for key, err in r.errors.items():
            print(f"\n{r.name} {key}: {err}")

    gw, rmq = results.get("gateway"), results.get("rabbitmq")
    if gw is None or rmq is None:
        return
    print(
        "\nratios gateway / RabbitMQ against the target (the gateway at least matches "
        "RabbitMQ):"
    )
    for key, label, _ in FIGURES:
        mine, other = gw.rate(key), rmq.rate(key)
        if mine is None or other is None or other == 0:
            print(f"  {label:<28} n/a (target >= {TARGET_VS_RABBITMQ:g})")
            continue
        value = mine / other
        verdict = "meets" if value >= TARGET_VS_RABBITMQ else "MISSES"
        print(f"  {label:<28} {value:6.2f}  target >= {TARGET_VS_RABBITMQ:g}  {verdict}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--brokers",
        default=",".join(BROKERS),
        help="comma-separated, from gateway,rabbitmq (default: both)",
    )
    p.add_argument(
        "--queue-count",
        type=int,
        default=50_000,
        help="messages per AMQP queue run, each settle mode (0: skip)",
    )
    p.add_argument(
        "--qos0-count",
        type=int,
        default=50_000,
        help="messages per MQTT QoS 0 -> AMQP run (0: skip)",
    )
    p.add_argument(
        "--qos1-count",
        type=int,
        default=20_000,
        help="messages per MQTT QoS 1 -> AMQP run (0: skip; at most 65535)",
    )
    p.add_argument("--repeat", type=int, default=3, help="runs per figure; the median counts")
    p.add_argument(
        "--warmup",
        type=int,
        default=2_000,
        help="messages of the untimed run before each path (0: none)",
    )
    p.add_argument(
        "--credit", type=int, default=5_000, help="link credit receive.js keeps outstanding"
    )
    p.add_argument(
        "--sasl",
        choices=("anonymous", "none"),
        default="anonymous",
        help="how rhea connects: SASL ANONYMOUS (default) or no SASL layer",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds one run may take before it counts as failed",
    )
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
        rhea_argv("send", {})
    except PeerMissing as exc:
        print(f"bench_amqp: {exc}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="bench-amqp-"))
    results: dict[str, Result] = {}
    try:
        for name in args.broker_names:
            results[name] = bench_broker(name, args, workdir)
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
                    "payload_bytes": PAYLOAD_SIZE,
                    "repeat": args.repeat,
                    "counts": {
                        "queue": args.queue_count,
                        "mqtt-qos0": args.qos0_count,
                        "mqtt-qos1": args.qos1_count,
                    },
                    "results": {
                        n: {
                            "start_error": r.start_error,
                            "msgs_per_s": {k: r.rate(k) for k in r.runs},
                            "runs": {k: [vars(run) for run in v] for k, v in r.runs.items()},
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
