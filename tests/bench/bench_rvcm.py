"""Certified delivery's rate between two processes, against the plain bus in the same run.

    .venv/bin/python tests/bench/bench_rvcm.py                  # defaults below
    .venv/bin/python tests/bench/bench_rvcm.py --n 5000 --runs 1 --json out.json

How this works. This process sends; for every run it starts a receiver, this script again
with ``--role receive``, in a second process. Both open the bus on a free service port and
a 239.192.x.y group joined on 127.0.0.1, multicast TTL 0: nothing leaves the host. Three
modes, their runs interleaved (plain, certified, certified synced, plain, ...) so that a
machine that drifts moves them alike:

* **plain**: a ``Transport`` sends ``--n`` messages of about ``--size`` bytes as fast as it
  can; the receiver's ``Listener`` counts them. The figure is messages / seconds from the
  first send to the receiver's last message (the receiver reports when it has all N; a run
  whose receiver misses some is reported as lost).
* **certified**: the same through a ``CmTransport`` on each side (correspondents
  ``BENCH.SENDER`` and ``BENCH.RECEIVER``, file ledgers in a temporary directory,
  ``sync_ledger`` off); before the clock starts the sender repeats a message until the
  receiver is registered (REGISTRATION.CERTIFIED), so every timed message is certified. The
  clock stops when the receiver has all N certified messages *and* the sender's ledger is
  empty: every message was confirmed, which is what certified delivery costs.
* **certified synced**: the same with ``sync_ledger`` on (an fsync per turn on both sides).

Target: certified (ledger not synced) at least 25% of the plain bus's rate. The ledgers'
disk matters for the synced figure; on a machine that other work shares, all figures are
indicative only.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from transports.rv import Dispatcher, Listener, Message, Transport, default_queue  # noqa: E402
from transports.rv.cmtransport import CmTransport  # noqa: E402

SUBJECT = "BENCH.CM"
MODES = ("plain", "certified", "certified-synced")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("", 0))
        port: int = s.getsockname()[1]
        return port


def out(obj: object) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def receive(service: str, network: str, mode: str, n: int, ledger: str) -> None:
    """The receiver: count messages until all N came, print when."""
    t = Transport(service, network, ttl=0)
    got = 0
    done = threading.Event()

    def on_msg(msg: Message, _: object) -> None:
        nonlocal got
        if msg.get("n") < 0:  # a warm-up message
            return
        if mode != "plain" and not (msg.cm and msg.cm.sequence):
            return
        got += 1
        if got == n:
            out({"done": time.time()})
            done.set()

    cm = None
    if mode == "plain":
        Listener(t, SUBJECT, on_msg)
        Listener(t, "BENCH.WARM", lambda m, _: out({"warm": True}))
    else:
        cm = CmTransport(t, "BENCH.RECEIVER", ledger_file=ledger,
                         sync_ledger=mode == "certified-synced", request_interval=0.5)
        Listener(t, "_RV.INFO.RVCM.REGISTRATION.CERTIFIED.>", lambda m, _: out({"warm": True}))
        cm.listen(SUBJECT, on_msg)
    out({"ready": True})
    dispatcher = Dispatcher(default_queue())
    for _ in sys.stdin:
        pass
    dispatcher.stop()
    if cm is not None:
        cm.close()
    t.close()


def message(n: int, size: int) -> Message:
    return Message(SUBJECT).add("n", n).add("pad", b"x" * max(0, size - 40))


def run(mode: str, n: int, size: int, workdir: Path, timeout: float) -> float | None:
    service = str(free_port())
    network = f"127.0.0.1;239.192.{random.randrange(1, 255)}.{random.randrange(1, 255)}"
    ledgers = workdir / f"{mode}-{time.monotonic_ns()}"
    ledgers.mkdir()
    child = subprocess.Popen(
        [sys.executable, __file__, "--role", "receive", "--service", service,
         "--network", network, "--mode", mode, "--n", str(n),
         "--ledger", str(ledgers / "receiver.ledger")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    lines: list[dict[str, object]] = []
    got_line = threading.Condition()

    def read() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            with got_line:
                lines.append(json.loads(line))
                got_line.notify_all()

    def wait_line(key: str, deadline: float) -> dict[str, object] | None:
        with got_line:
            while True:
                for obj in lines:
                    if key in obj:
                        return obj
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                got_line.wait(min(left, 0.05))

    threading.Thread(target=read, daemon=True).start()
    t = Transport(service, network, ttl=0)
    cm = None
    try:
        deadline = time.monotonic() + timeout
        if wait_line("ready", deadline) is None:
            raise SystemExit(f"{mode}: the receiver did not start")
        if mode != "plain":
            cm = CmTransport(t, "BENCH.SENDER", ledger_file=ledgers / "sender.ledger",
                             sync_ledger=mode == "certified-synced", request_interval=0.5)
        pause = 0.01
        while wait_line("warm", time.monotonic() + pause) is None:  # registered / heard
            if time.monotonic() > deadline:
                raise SystemExit(f"{mode}: no warm-up reached the receiver")
            if cm is None:
                t.send(Message("BENCH.WARM").add("n", -1))
            else:
                cm.send(Message(SUBJECT).add("n", -1))
            pause = min(pause * 2, 0.5)
        if cm is not None:  # the warm-ups confirmed: the ledger starts empty
            while cm.stored_count() and time.monotonic() < deadline:
                time.sleep(0.01)
        msgs = [message(i, size) for i in range(n)]
        start = time.time()
        send = t.send if cm is None else cm.send
        for m in msgs:
            send(m)
        done = wait_line("done", deadline)
        if done is None:
            print(f"{mode}: the receiver did not get all {n} messages in {timeout:g} s",
                  file=sys.stderr)
            return None
        end = float(done["done"])  # type: ignore[arg-type]
        if cm is not None:
            while cm.stored_count():
                if time.monotonic() > deadline:
                    print(f"{mode}: the sender's ledger did not empty", file=sys.stderr)
                    return None
                time.sleep(0.001)
            end = max(end, time.time())
        return n / (end - start)
    finally:
        if cm is not None:
            cm.close()
        t.close()
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=20_000, help="messages per run")
    p.add_argument("--size", type=int, default=100, help="bytes per message, about")
    p.add_argument("--runs", type=int, default=3, help="runs per mode; the median counts")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--json", type=Path, help="also write the results to this file")
    p.add_argument("--role", choices=["send", "receive"], default="send")
    p.add_argument("--service", help=argparse.SUPPRESS)
    p.add_argument("--network", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--ledger", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "receive":
        receive(args.service, args.network, args.mode, args.n, args.ledger)
        return
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="bench-rvcm-") as tmp:
        for r in range(args.runs):
            for mode in MODES:
                rate = run(mode, args.n, args.size, Path(tmp), args.timeout)
                if rate is not None:
                    rates[mode].append(rate)
                    print(f"{mode} run {r + 1}: {rate:,.0f} msgs/s", flush=True)
    medians = {m: statistics.median(v) for m, v in rates.items() if v}
    plain = medians.get("plain")
    print(f"\n{'mode':<18} | {'msgs/s (median)':>15} | of plain")
    print(f"{'-' * 18}-+-{'-' * 15}-+---------")
    for mode in MODES:
        if mode not in medians:
            print(f"{mode:<18} | {'failed':>15} |")
            continue
        share = f"{medians[mode] / plain:.2f}" if plain else "n/a"
        print(f"{mode:<18} | {medians[mode]:>15,.0f} | {share}")
    if plain and "certified" in medians:
        ratio = medians["certified"] / plain
        print(f"\ncertified (ledger not synced) / plain: {ratio:.2f} "
              f"(target >= 0.25: {'meets' if ratio >= 0.25 else 'MISSES'})")
    print(f"{args.n} messages of about {args.size} bytes, {args.runs} runs a mode")
    if args.json:
        args.json.write_text(json.dumps({"runs": rates, "medians": medians}, indent=1))


if __name__ == "__main__":
    main()
