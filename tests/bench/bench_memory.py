"""Resident memory of a gateway holding a deep persistent queue, or an offline MQTT persistent
session's queue (``max_msg_memory``, swapping, durable subscriptions' tails).

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
    python tests/bench/bench_memory.py --mqtt-session       # to an offline MQTT session

``--mqtt-session``: a paho client opens a persistent session (``clean_session=False``),
subscribes at QoS 1 and disconnects; a paho publisher then sends the messages at QoS 1 and
waits for every PUBACK (``mqtt_max_queued_messages = 0``, no bound on the session's queue).
Its durable subscription keeps its first ``destination_backlog_swapout`` messages in memory
and the rest in the store only (``stored`` in ``GET /api/v1/durables``). With ``--consume``
the session's client comes back and takes every message.

Before message swapping, 300,000 persistent 1 KB messages left the gateway at 655 MB
resident (52 MB before) with the default 512 MB ``max_msg_memory``. With it (one run on a
loaded 2-core machine): 283 MB resident (49 MB before), a memory figure of 157 MB with
298,976 messages swapped (the queue keeps its first 1,024); all 300,000 consumed in 16 s. ``--swapping disabled``: 588 MB
resident, a figure of 449 MB. The figures vary with the machine and its load; compare runs
made side by side.

``--mqtt-session`` (one run while another benchmark loaded the shared 2-core machine; see
the figures printed for the current ones), 300,000 QoS 1 messages of 1 KB: 45 MB resident
before, 68 MB after, a memory figure of 1.6 MB, the session's durable holding 298,976 of them
in the store only (``stored``); the session took all 300,000 back in 67 s. With
``--swapping disabled --max-msg-memory 0`` -- where every durable subscription's backlog was
before it had a tail -- 603 MB after, a figure of 462 MB.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: adminapi

from adminapi import admin_get  # noqa: E402

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
    data: dict[str, object] = admin_get(http_port, "/api/v1/server", host=HOST, timeout=30)
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


def start_gateway(work: Path, listeners: str, args: argparse.Namespace,
                  extra: str = "") -> subprocess.Popen[bytes]:
    conf = work / "conf"
    conf.mkdir()
    (conf / "gateway.conf").write_text(
        f"{listeners}store = {work / 'data'}\ndelivery_log = disabled\n"
        f"max_msg_memory = {args.max_msg_memory}\nmsg_swapping = {args.swapping}\n{extra}")
    (conf / "queues.conf").write_text(">\n")
    (conf / "topics.conf").write_text(">\n")
    return subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config-dir", str(conf)],
                            cwd=os.getcwd(), stdin=subprocess.DEVNULL,
                            stdout=(work / "gateway.out").open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def durables(http_port: int) -> list[dict[str, object]]:
    data: list[dict[str, object]] = admin_get(http_port, "/api/v1/durables", host=HOST,
                                              timeout=30)
    return data


def mqtt_session(args: argparse.Namespace) -> int:
    """300,000 (``--count``) QoS 1 messages to an offline MQTT persistent session."""
    import queue

    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    work = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    mqtt_port, http_port = free_port(), free_port()
    proc = start_gateway(work, f"listen = mqtt://{HOST}:{mqtt_port}\n"
                               f"listen = http://{HOST}:{http_port}\n", args,
                         "mqtt_max_queued_messages = 0\n")
    topic = "bench/memory"
    try:
        wait_port(mqtt_port, proc)
        wait_port(http_port, proc)
        got: queue.Queue[int] = queue.Queue()

        def session() -> mqtt.Client:
            c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="bench-session",
                            clean_session=False)
            c.on_message = lambda c, u, m: got.put(1)
            c.connect(HOST, mqtt_port, 60)
            c.loop_start()
            return c

        sub = session()
        sub.subscribe(topic, qos=1)
        time.sleep(1.0)  # the SUBACK
        sub.disconnect()
        sub.loop_stop()
        before = rss_mb(proc.pid)
        pub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="bench-publisher")
        pub.max_inflight_messages_set(1000)
        pub.max_queued_messages_set(0)
        pub.connect(HOST, mqtt_port, 60)
        pub.loop_start()
        body = b"m" * args.size
        start = time.monotonic()
        infos: list[mqtt.MQTTMessageInfo] = []
        for _ in range(args.count):
            infos.append(pub.publish(topic, body, qos=1))
            if len(infos) >= 20_000:  # paho's packet ids wrap at 65,535
                for info in infos[:10_000]:
                    info.wait_for_publish(600)
                del infos[:10_000]
        for info in infos:  # every PUBACK is in
            info.wait_for_publish(600)
        took = time.monotonic() - start
        pub.disconnect()
        pub.loop_stop()
        time.sleep(2.0)
        after = rss_mb(proc.pid)
        info = server_info(http_port)
        d = [x for x in durables(http_port) if x.get("client_id") == "bench-session"]
        print(f"{args.count:,} QoS 1 messages of {args.size} B to an offline MQTT persistent "
              f"session, max_msg_memory {args.max_msg_memory}, msg_swapping {args.swapping}")
        print(f"  sent in {took:.1f} s ({args.count / took:,.0f} msg/s)")
        print(f"  resident: {before:.0f} MB before, {after:.0f} MB after")
        print(f"  core memory figure: {int(info['memory']) / 2**20:.1f} MB; the session's "  # type: ignore[call-overload]
              f"durable: count {d[0]['count'] if d else '?'}, "
              f"stored {d[0].get('stored') if d else '?'}")
        if args.consume:
            start = time.monotonic()
            back = session()
            for _ in range(args.count):
                got.get(timeout=120)
            print(f"  consumed all {args.count:,} in {time.monotonic() - start:.1f} s; "
                  f"resident {rss_mb(proc.pid):.0f} MB")
            back.disconnect()
            back.loop_stop()
    finally:
        stop(proc)
    return 0


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the gateway process: terminate, then kill after 30 s."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=300_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--max-msg-memory", default="512MB")
    ap.add_argument("--swapping", default="enabled", choices=("enabled", "disabled"))
    ap.add_argument("--consume", action="store_true", help="then take every message back")
    ap.add_argument("--mqtt-session", action="store_true",
                    help="to an offline MQTT persistent session instead of a STOMP queue")
    args = ap.parse_args(argv)
    if args.mqtt_session:
        return mqtt_session(args)
    work = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    stomp_port, http_port = free_port(), free_port()
    proc = start_gateway(work, f"listen = stomp://{HOST}:{stomp_port}\n"
                               f"listen = http://{HOST}:{http_port}\n", args)
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
        stop(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
