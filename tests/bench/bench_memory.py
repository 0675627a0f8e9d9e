"""Resident memory of a gateway holding a deep persistent queue (``max_msg_memory``, swapping).

How this works. A ``gateway serve`` process is started on a fresh store with a STOMP and an
HTTP listener (``max_msg_memory`` and ``msg_swapping`` as given). A raw-socket STOMP 1.2
producer sends ``--count`` persistent messages of ``--size`` bytes to one queue that has no
consumer, in batches of 1,000 frames whose last asks for a receipt; the next batch waits for
it, so every message is in the store when the producer ends. The gateway's resident set
(``VmRSS`` of ``/proc/<pid>/status``) is read before the first message and after the last
receipt (after a short settle, so that a swap pass has run), with the core's own figures
from ``GET /api/v1/server`` (``memory``, ``swapped``). With ``--consume`` a consumer then
takes every message and the count is checked.

    python tests/bench/bench_memory.py                      # 300,000 x 1 KB, defaults
    python tests/bench/bench_memory.py --swapping disabled  # the same without swapping

Before message swapping, 300,000 persistent 1 KB messages left the gateway at 655 MB
resident (52 MB before) with the default 512 MB ``max_msg_memory``. With it (one run on a
loaded 2-core machine): 283 MB resident (49 MB before), a memory figure of 157 MB with
298,976 messages swapped (the queue keeps its first 1,024); all 300,000 consumed in 16 s. ``--swapping disabled``: 588 MB
resident, a figure of 449 MB. The figures vary with the machine and its load; compare runs
made side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HOST = "127.0.0.1"
BATCH = 1000


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def server_info(http_port: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://{HOST}:{http_port}/api/v1/server", timeout=30) as r:
        data: dict[str, object] = json.loads(r.read())
    return data


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway exited with status {proc.returncode}")
        try:
            socket.create_connection((HOST, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("gateway did not start listening")


class Stomp:
    """A blocking STOMP 1.2 client, enough for a producer and a counting consumer."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection((HOST, port))
        self.buf = b""
        self.sock.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\0")
        self.read_until(b"CONNECTED")

    def read_until(self, command: bytes) -> None:
        while True:
            while b"\0" in self.buf:
                frame, _, self.buf = self.buf.partition(b"\0")
                frame = frame.lstrip(b"\n")
                if frame.startswith(b"ERROR"):
                    raise RuntimeError(frame.decode(errors="replace"))
                if frame.startswith(command):
                    return
            data = self.sock.recv(1 << 20)
            if not data:
                raise RuntimeError("connection closed")
            self.buf += data

    def produce(self, dest: str, count: int, size: int) -> None:
        body = b"m" * size
        plain = (f"SEND\ndestination:{dest}\npersistent:true\ncontent-length:{size}\n\n"
                 .encode() + body + b"\0")
        sent = 0
        while sent < count:
            n = min(BATCH, count - sent)
            last = (f"SEND\ndestination:{dest}\npersistent:true\nreceipt:r{sent}\n"
                    f"content-length:{size}\n\n").encode() + body + b"\0"
            self.sock.sendall(plain * (n - 1) + last)
            self.read_until(b"RECEIPT")
            sent += n

    def consume(self, dest: str, count: int, size: int) -> None:
        self.sock.sendall(f"SUBSCRIBE\nid:1\ndestination:{dest}\nack:auto\n\n\0".encode())
        got = 0
        while got < count:
            data = self.sock.recv(1 << 20)
            if not data:
                raise RuntimeError(f"connection closed after {got} messages")
            self.buf += data
            got += self.buf.count(b"\0")
            self.buf = self.buf[self.buf.rfind(b"\0") + 1:]

    def close(self) -> None:
        self.sock.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=300_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--max-msg-memory", default="512MB")
    ap.add_argument("--swapping", default="enabled", choices=("enabled", "disabled"))
    ap.add_argument("--consume", action="store_true", help="then take every message back")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    stomp_port, http_port = free_port(), free_port()
    conf = work / "conf"
    conf.mkdir()
    (conf / "gateway.conf").write_text(
        f"listen = stomp://{HOST}:{stomp_port}\nlisten = http://{HOST}:{http_port}\n"
        f"store = {work / 'data'}\ndelivery_log = disabled\n"
        f"max_msg_memory = {args.max_msg_memory}\nmsg_swapping = {args.swapping}\n")
    (conf / "queues.conf").write_text(">\n")
    (conf / "topics.conf").write_text(">\n")
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config-dir", str(conf)],
                            cwd=os.getcwd(), stdin=subprocess.DEVNULL,
                            stdout=(work / "gateway.out").open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        wait_port(stomp_port, proc)
        wait_port(http_port, proc)
        before = rss_mb(proc.pid)
        client = Stomp(stomp_port)
        start = time.monotonic()
        client.produce("/queue/bench.memory", args.count, args.size)
        took = time.monotonic() - start
        time.sleep(2.0)  # a swap pass runs on the loop after the last batch
        after = rss_mb(proc.pid)
        info = server_info(http_port)
        print(f"{args.count:,} persistent messages of {args.size} B, max_msg_memory "
              f"{args.max_msg_memory}, msg_swapping {args.swapping}")
        print(f"  sent in {took:.1f} s ({args.count / took:,.0f} msg/s)")
        print(f"  resident: {before:.0f} MB before, {after:.0f} MB after")
        print(f"  core memory figure: {int(info['memory']) / 2**20:.0f} MB "  # type: ignore[call-overload]
              f"(limit {args.max_msg_memory}), swapped {info.get('swapped')}")
        if args.consume:
            start = time.monotonic()
            Stomp(stomp_port).consume("/queue/bench.memory", args.count, args.size)
            print(f"  consumed all {args.count:,} in {time.monotonic() - start:.1f} s; "
                  f"resident {rss_mb(proc.pid):.0f} MB")
        client.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
