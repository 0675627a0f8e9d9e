"""Raw UDP multicast over loopback: message rate and latency, the baseline for the RV-style bus.

    .venv/bin/python tests/bench/bench_rv.py                       # defaults below
    .venv/bin/python tests/bench/bench_rv.py --n 50000 --sizes 100 --runs 1 --json out.json
    .venv/bin/python tests/bench/bench_rv.py --bus                 # and the bus's API

Defaults: --sizes 100,10240 bytes per message, --n 200000 messages per rate run, --runs 3
(the median run is reported), --latency-n 20000 messages at --latency-rate 5000 msgs/s,
--ttl 0. Without ``--bus`` this script measures raw UDP only: a plain blocking-socket sender
and receiver, nothing of the bus. The bus (the reliable multicast engine under its asyncio shell) is to
reach at least 30% of the raw rate measured here, on the same machine, in the same run.

How this works. This process is the sender; for every run it starts a receiver, this script
again with ``--role receive``, in a second process. Both use only the loopback interface:
the receiver binds ``('', port)`` (``SO_REUSEADDR``, 4 MiB ``SO_RCVBUF``) and joins a
239.192.75.x group on 127.0.0.1; the sender sets ``IP_MULTICAST_IF = 127.0.0.1``,
``IP_MULTICAST_LOOP = 1`` and ``IP_MULTICAST_TTL = --ttl`` (0 or 1), and sends with
``sendto``. Each message starts with a sequence number and the sender's
``time.monotonic_ns()`` (one clock for every process on a Linux host) and is padded to its
size. The receiver reads with ``recv_into`` into one buffer, keeps the receive time minus the
send time of each message, and stops at the end marker (sent a few times) or after 2 s
without traffic; it prints one JSON line.

Two measurements per size:

* **rate**: the sender sends --n messages as fast as it can. Reported: the sender's rate,
  the receiver's rate (messages received / time from the first to the last), the loss (UDP
  drops what the receiver's buffer cannot hold), and the latencies under that load (mostly
  time spent queued in the receive buffer).
* **latency**: --latency-n messages paced at --latency-rate msgs/s (sent in 1 ms slots),
  so nothing queues: p50 / p99 of one-way latency, in microseconds.

With ``--bus``, the same measurements through the bus's programming interface
(:mod:`transports.rv.transport`) between two processes: this process sends
:class:`~transports.rv.message.Message`s (fields ``seq``, ``t`` and an OPAQUE pad, encoded to
the given size) with a ``Transport``; the receiver (``--role bus-receive``) listens with a
``Listener`` and dispatches its queue in its main thread, taking the latency in the callback
(so it includes the reliable multicast engine, the asyncio shell, decoding, the queue and the
dispatch). Before the clock starts the sender repeats a warm-up message until the receiver
has one (a receiver's first contact with a stream is the first packet it hears), and it
ends with an end message: the stream is delivered in order, so when the end is delivered
every message before it was delivered or reported lost. Three measurements per size:
**rate** (as fast as the sender can; a message lost past the reliability interval is
counted), **latency** (paced, as above), and **loss** -- the loss-free rate at 1% injected
loss: the receiver drops 1% of the datagrams it reads (``random.Random(--seed)``) before
``receive_datagram``, the sender paces at the rate the loss-free bus run reached, halving it
until every message arrives (at most three tries). ``--bus-n`` (200,000, as ``--n``) caps the
messages per bus run (fewer for 10 KB messages: the sender keeps every packet for the
reliability interval). The sender's small messages share packets when they wait for the same
write (the engine's batches), as any program's that sends faster than one datagram at a
time; the raw pair sends one datagram per message, as a plain UDP program does. The
bus is to reach at least 30% of the raw receive rate for 100-byte messages; the script
prints that ratio.

Results on a machine that other work shares are indicative only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import struct
import subprocess
import sys
import time
from array import array
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# the bus part imports this checkout's transports.rv, whatever is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

HEADER = struct.Struct("!QQ")  # sequence number, send time (monotonic ns)
END = 2**64 - 1  # the sequence number of the end marker
END_COPIES = 5  # the end marker is a datagram too: send it more than once
IDLE_STOP = 2.0  # seconds without traffic after which the receiver stops anyway
RECEIVE_BUFFER = 4 * 1024 * 1024
INTERFACE = "127.0.0.1"


@dataclass
class Result:
    part: str  # "raw" or "bus"
    mode: str  # "rate", "latency", or "loss" (bus at 1% injected loss)
    size: int
    sent: int
    received: int
    send_rate: float  # messages/s
    receive_rate: float  # messages/s
    p50_us: float
    p99_us: float

    @property
    def loss(self) -> float:
        return 1 - self.received / self.sent if self.sent else 0.0


# -- receiver (the second process) -----------------------------------------------------------


def receive(port: int, group: str, size: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
    sock.bind(("", port))
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                    socket.inet_aton(group) + socket.inet_aton(INTERFACE))
    sock.settimeout(IDLE_STOP)
    buf = bytearray(max(size, HEADER.size) + 1)
    view = memoryview(buf)
    latencies = array("q")
    unpack = HEADER.unpack_from
    now_ns = time.monotonic_ns
    print(json.dumps({"ready": True}), flush=True)
    first = last = 0
    count = 0
    sock.settimeout(60)  # the first message: the sender starts when it reads "ready"
    while True:
        try:
            n = sock.recv_into(view)
        except TimeoutError:
            break
        t = now_ns()
        seq, sent_ns = unpack(buf)
        if seq == END:
            break
        if n != size:
            continue
        if not count:
            first = t
            sock.settimeout(IDLE_STOP)
        last = t
        count += 1
        latencies.append(t - sent_ns)
    lat = sorted(latencies)
    print(json.dumps({
        "received": count,
        "seconds": (last - first) / 1e9,
        "p50_ns": lat[len(lat) // 2] if lat else 0,
        "p99_ns": lat[min(len(lat) - 1, len(lat) * 99 // 100)] if lat else 0,
    }), flush=True)


# -- the bus: receiver (the second process) --------------------------------------------------

BUS_SUBJECT = "BENCH.X"
BUS_WARM = "BENCH.WARM"
BUS_END = "BENCH.END"


class _Dropper:
    """Stands between the shell and the engine: drops a fraction of the datagrams read."""

    def __init__(self, engine: Any, fraction: float, seed: int) -> None:
        self.receive = engine.receive_datagram  # the engine's own, bound before the swap
        self.fraction = fraction
        self.random = random.Random(seed).random
        self.dropped = 0

    def receive_datagram(self, data: bytes, addr: tuple[str, int], now: float) -> None:
        if self.random() < self.fraction:
            self.dropped += 1
            return
        self.receive(data, addr, now)


def bus_receive(service: int, network: str, ttl: int, drop: float, seed: int) -> None:
    from transports.rv import Listener, Queue, Transport

    t = Transport(str(service), network, ttl=ttl)
    dropper = None
    if drop > 0:
        assert t.host is not None
        dropper = _Dropper(t.host.engine, drop, seed)
        # the shell reads ``receive_datagram`` off the engine for every datagram
        t.host.engine.receive_datagram = dropper.receive_datagram  # type: ignore[method-assign]
    now_ns = time.monotonic_ns
    latencies = array("q")
    state = {"first": 0, "last": 0, "count": 0, "end": False, "warm": False, "expected": 0}

    def on_data(msg: Any, _: Any) -> None:
        tn = now_ns()
        if not state["count"]:
            state["first"] = tn
        state["last"] = tn
        state["count"] += 1
        latencies.append(tn - msg.get("t"))

    def on_control(msg: Any, _: Any) -> None:
        if msg.send_subject == BUS_WARM:
            if not state["warm"]:
                state["warm"] = True
                print(json.dumps({"warm": True}), flush=True)
        else:
            state["end"] = True
            state["expected"] = msg.get("n")

    q = Queue("bench")
    Listener(t, BUS_SUBJECT, on_data, queue=q)
    Listener(t, BUS_WARM, on_control, queue=q)
    Listener(t, BUS_END, on_control, queue=q)
    errors: list[str] = []
    Listener(t, "_RV.ERROR.>", lambda m, _: errors.append(m.send_subject), queue=q)
    print(json.dumps({"ready": True}), flush=True)
    idle_since = time.monotonic()
    while not state["end"]:
        if q.timed_dispatch(0.5):
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > 30:  # the end never came
            break
    lat = sorted(latencies)
    print(json.dumps({
        "received": state["count"],
        "expected": state["expected"],
        "seconds": (state["last"] - state["first"]) / 1e9,
        "p50_ns": lat[len(lat) // 2] if lat else 0,
        "p99_ns": lat[min(len(lat) - 1, len(lat) * 99 // 100)] if lat else 0,
        "dropped": dropper.dropped if dropper else 0,
        "errors": sorted(set(errors)),
        "engine": t.host.engine.stats.host_status() if t.host is not None else {},
    }), flush=True)
    t.close()


# -- the bus: sender (this process) ------------------------------------------------------------


def _bus_message(size: int) -> tuple[Any, int]:
    """A message whose encoding is ``size`` bytes (at least its fixed part), and its pad."""
    from transports.rv import Message, encode

    def make(pad: int) -> Any:
        return Message(BUS_SUBJECT).add("seq", 0).add("t", 0).add("pad", bytes(pad))

    base = len(encode(make(0)))
    pad = max(0, size - base)
    return make(pad), pad


def run_bus(mode: str, size: int, n: int, rate: float, ttl: int, drop: float = 0.0,
            seed: int = 1) -> Result:
    """One run through the bus's API: a receiver process, this process sending."""
    import queue as queue_mod
    import threading

    from transports.rv import Message, Transport

    port = _free_port()
    network = f"{INTERFACE};239.192.76.{random.randrange(1, 255)}"
    receiver = subprocess.Popen(
        [sys.executable, __file__, "--role", "bus-receive", "--port", str(port),
         "--group", network, "--ttl", str(ttl), "--drop", str(drop), "--seed", str(seed)],
        stdout=subprocess.PIPE, text=True,
    )
    assert receiver.stdout is not None
    lines: queue_mod.Queue[dict[str, Any]] = queue_mod.Queue()

    def read() -> None:
        assert receiver.stdout is not None
        for line in receiver.stdout:
            lines.put(json.loads(line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    t = None
    sender_stats: dict[str, Any] = {}
    try:
        assert lines.get(timeout=60).get("ready")
        t = Transport(str(port), network, ttl=ttl)
        warm = Message(BUS_WARM)
        while True:  # until the receiver has heard this sender's stream
            t.send(warm)
            try:
                if lines.get(timeout=0.05).get("warm"):
                    break
            except queue_mod.Empty:
                pass
        msg, _ = _bus_message(size)
        seq_field = msg.get_field("seq")
        t_field = msg.get_field("t")
        assert seq_field is not None and t_field is not None
        send = t.send
        now_ns = time.monotonic_ns
        start = time.perf_counter()
        if mode == "rate":
            for seq in range(n):
                seq_field.value = seq
                t_field.value = now_ns()
                send(msg)
        else:
            per_slot = rate / 1000.0
            seq = 0
            slot = 0
            while seq < n:
                due = min(n, int((slot + 1) * per_slot))
                while seq < due:
                    seq_field.value = seq
                    t_field.value = now_ns()
                    send(msg)
                    seq += 1
                slot += 1
                delay = start + slot / 1000.0 - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
        send_seconds = time.perf_counter() - start
        t.send(Message(BUS_END).add("n", n))
        report = lines.get(timeout=600)
    finally:
        if t is not None:
            if t.host is not None:
                st = t.host.engine.stats
                sender_stats = {k: getattr(st, k) for k in st.__slots__}
                sender_stats["shell"] = {k: getattr(t.host.shell.stats, k)
                                         for k in t.host.shell.stats.__slots__}
            t.close()
        receiver.wait(timeout=120)
        reader.join(timeout=5)
        receiver.stdout.close()
    received = report["received"]
    if os.environ.get("BENCH_RV_DEBUG"):
        print(f"# {report}", flush=True)
        if sender_stats:
            print(f"# sender {sender_stats}", flush=True)
    if report["errors"]:
        print(f"# receiver advisories: {', '.join(report['errors'])}", flush=True)
    return Result(
        "bus", mode if not drop else "loss", size, n, received,
        send_rate=n / send_seconds if send_seconds else 0.0,
        receive_rate=received / report["seconds"] if report["seconds"] else 0.0,
        p50_us=report["p50_ns"] / 1000, p99_us=report["p99_ns"] / 1000,
    )


# -- sender (this process) -------------------------------------------------------------------


def _sender_socket(ttl: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(INTERFACE))
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)
    sock.bind((INTERFACE, 0))
    return sock


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("", 0))
        port: int = s.getsockname()[1]
        return port


def run_raw(mode: str, size: int, n: int, rate: float, ttl: int) -> Result:
    """One run of the raw pair: a receiver process, this process sending."""
    port = _free_port()
    group = f"239.192.75.{random.randrange(1, 255)}"
    receiver = subprocess.Popen(
        [sys.executable, __file__, "--role", "receive", "--port", str(port),
         "--group", group, "--size", str(size)],
        stdout=subprocess.PIPE, text=True,
    )
    assert receiver.stdout is not None
    try:
        assert json.loads(receiver.stdout.readline()).get("ready")
        sock = _sender_socket(ttl)
        dest = (group, port)
        buf = bytearray(size)
        pack = HEADER.pack_into
        sendto = sock.sendto
        now_ns = time.monotonic_ns
        start = time.perf_counter()
        if mode == "rate":
            for seq in range(n):
                pack(buf, 0, seq, now_ns())
                sendto(buf, dest)
        else:
            per_slot = rate / 1000.0  # 1 ms slots
            seq = 0
            slot = 0
            while seq < n:
                due = min(n, int((slot + 1) * per_slot))
                while seq < due:
                    pack(buf, 0, seq, now_ns())
                    sendto(buf, dest)
                    seq += 1
                slot += 1
                delay = start + slot / 1000.0 - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
        send_seconds = time.perf_counter() - start
        end = bytearray(max(size, HEADER.size))
        HEADER.pack_into(end, 0, END, 0)
        for _ in range(END_COPIES):
            time.sleep(0.05)
            sendto(end, dest)
        sock.close()
        report = json.loads(receiver.stdout.readline())
    finally:
        receiver.wait(timeout=120)
        receiver.stdout.close()
    received = report["received"]
    return Result(
        "raw", mode, size, n, received,
        send_rate=n / send_seconds if send_seconds else 0.0,
        receive_rate=received / report["seconds"] if report["seconds"] else 0.0,
        p50_us=report["p50_ns"] / 1000, p99_us=report["p99_ns"] / 1000,
    )


def median_run(runs: list[Result]) -> Result:
    ordered = sorted(runs, key=lambda r: r.receive_rate)
    return ordered[len(ordered) // 2]


def _print_row(r: Result) -> None:
    print(f"{r.part:5} {r.mode:8} {r.size:>6} {r.sent:>8} {r.received:>8} "
          f"{r.loss:>6.1%} {r.send_rate:>9.0f} {r.receive_rate:>9.0f} "
          f"{r.receive_rate * r.size / 1e6:>7.1f} {r.p50_us:>8.1f} {r.p99_us:>8.1f}",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100,10240")
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latency-n", type=int, default=20_000)
    parser.add_argument("--latency-rate", type=float, default=5000.0)
    parser.add_argument("--ttl", type=int, choices=[0, 1], default=0)
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--bus", action="store_true",
                        help="also measure the bus's API between two processes")
    parser.add_argument("--bus-n", type=int, default=200_000,
                        help="messages per bus rate run (capped at 200 MB of messages)")
    parser.add_argument("--seed", type=int, default=1, help="of the injected loss")
    parser.add_argument("--role", choices=["send", "receive", "bus-receive"], default="send",
                        help=argparse.SUPPRESS)
    parser.add_argument("--drop", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--group", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "receive":
        receive(args.port, args.group, args.size)
        return
    if args.role == "bus-receive":
        bus_receive(args.port, args.group, args.ttl, args.drop, args.seed)
        return

    results: list[Result] = []
    print(f"{'part':5} {'mode':8} {'size':>6} {'sent':>8} {'recv':>8} {'loss':>6} "
          f"{'send/s':>9} {'recv/s':>9} {'MB/s':>7} {'p50 us':>8} {'p99 us':>8}")
    for size in (int(s) for s in args.sizes.split(",")):
        for mode, n in (("rate", args.n), ("latency", args.latency_n)):
            runs = [run_raw(mode, size, n, args.latency_rate, args.ttl)
                    for _ in range(args.runs if mode == "rate" else 1)]
            r = median_run(runs)
            results.append(r)
            _print_row(r)
    if args.bus:
        for size in (int(s) for s in args.sizes.split(",")):
            n = min(args.bus_n, 200_000_000 // size)
            rate_run = median_run([run_bus("rate", size, n, 0.0, args.ttl)
                                   for _ in range(args.runs)])
            runs = [rate_run, run_bus("latency", size, args.latency_n, args.latency_rate,
                                      args.ttl)]
            pace = max(rate_run.receive_rate, 1000.0)
            for _ in range(3):
                lossy = run_bus("latency", size, n, pace, args.ttl, drop=0.01, seed=args.seed)
                runs.append(lossy)
                if lossy.received == lossy.sent:
                    break
                pace /= 2
            for r in runs:
                results.append(r)
                _print_row(r)
            raw = next((x for x in results if x.part == "raw" and x.mode == "rate"
                        and x.size == size), None)
            if raw is not None and raw.receive_rate:
                print(f"# bus/raw receive rate, {size} bytes: "
                      f"{rate_run.receive_rate / raw.receive_rate:.0%}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": [asdict(r) | {"loss": r.loss} for r in results]}, f, indent=2)


if __name__ == "__main__":
    main()
