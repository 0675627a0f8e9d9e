"""Raw UDP multicast over loopback: message rate and latency, the baseline for the RV-style bus.

    .venv/bin/python tests/bench/bench_rv.py                       # defaults below
    .venv/bin/python tests/bench/bench_rv.py --n 50000 --sizes 100 --runs 1 --json out.json

Defaults: --sizes 100,10240 bytes per message, --n 200000 messages per rate run, --runs 3
(the median run is reported), --latency-n 20000 messages at --latency-rate 5000 msgs/s,
--ttl 0. This script measures raw UDP only: a plain blocking-socket sender and receiver,
nothing of the bus. The bus (the reliable multicast engine under its asyncio shell) is to
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

Results on a machine that other work shares are indicative only.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import struct
import subprocess
import sys
import time
from array import array
from dataclasses import asdict, dataclass

HEADER = struct.Struct("!QQ")  # sequence number, send time (monotonic ns)
END = 2**64 - 1  # the sequence number of the end marker
END_COPIES = 5  # the end marker is a datagram too: send it more than once
IDLE_STOP = 2.0  # seconds without traffic after which the receiver stops anyway
RECEIVE_BUFFER = 4 * 1024 * 1024
INTERFACE = "127.0.0.1"


@dataclass
class Result:
    part: str  # "raw"
    mode: str  # "rate" or "latency"
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100,10240")
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latency-n", type=int, default=20_000)
    parser.add_argument("--latency-rate", type=float, default=5000.0)
    parser.add_argument("--ttl", type=int, choices=[0, 1], default=0)
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--role", choices=["send", "receive"], default="send",
                        help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--group", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "receive":
        receive(args.port, args.group, args.size)
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
            print(f"{r.part:5} {r.mode:8} {r.size:>6} {r.sent:>8} {r.received:>8} "
                  f"{r.loss:>6.1%} {r.send_rate:>9.0f} {r.receive_rate:>9.0f} "
                  f"{r.receive_rate * r.size / 1e6:>7.1f} {r.p50_us:>8.1f} {r.p99_us:>8.1f}",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": [asdict(r) | {"loss": r.loss} for r in results]}, f, indent=2)


if __name__ == "__main__":
    main()
