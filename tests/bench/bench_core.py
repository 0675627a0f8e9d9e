"""Core benchmarks (a script, not a test).

    python tests/bench/bench_core.py [--count N] [--persistent-count N] [--no-log] [--default-gc]
                                     [--properties N] [--only topic|queue|persistent ...]
                                     [--tree DIR]

The garbage collector is tuned as ``gateway serve`` tunes it (``gateway.server.tune_gc``)
unless --default-gc.

Messages are 64-byte bytes messages without properties, unless --properties N: then each
message gets a property dict of its own (as an adapter builds one per message) with N
properties: first ``JMS_GW_MQTT_QOS`` as ``int8`` (what every MQTT publish carries,
``mappings/mqtt.py``), then ``JMS_GW_MQTT_RETAIN`` ``true``, then short strings
``bench.pN``. The delivery log hashes properties (``docs/delivery-log.md``, "Hashes"), so this
is what measures that.

--tree DIR runs the benchmarks on the gateway of another tree (its ``gateway`` package and
its ``tests/corehelp.py``), e.g. a worktree of an older commit, or a compiled copy of one
(``tests/compiled_tree.py``), so that two versions are measured by the same script: to
compare the delivery log's versions, run this script with and without ``--tree`` in turn,
several times each, on the same machine (``docs/delivery-log.md``, "Cost").

1. In-process publish → deliver of NON_PERSISTENT messages: one producer, one topic, one
   subscriber (NO_ACKNOWLEDGE session, listener counts), delivery log on unless --no-log.
   Target: over 200k messages/s on one core.
2. The same through a queue with AUTO acknowledgement (publish, deliver, ack).
3. PERSISTENT sends to a queue on the SQLite store with fsync on, group commit: the producer
   keeps up to --window unconfirmed sends in flight (a sliding window: a confirmation lets
   the next send go). Target: over 20k messages/s.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def _tree() -> Path:
    """The tree whose gateway is measured: --tree DIR, else the one this script is in (a
    compiled copy, README "The compiled build"). Read before the gateway is imported."""
    for i, arg in enumerate(sys.argv):
        if arg == "--tree" and i + 1 < len(sys.argv):
            return Path(sys.argv[i + 1]).resolve()
        if arg.startswith("--tree="):
            return Path(arg[len("--tree=") :]).resolve()
    return Path(__file__).resolve().parents[2]


TREE = _tree()
sys.path.insert(0, str(TREE))
sys.path.insert(0, str(TREE / "tests"))

from corehelp import Q, T, running_broker  # noqa: E402

from gateway.client import AckMode  # noqa: E402
from gateway.message import DeliveryMode, Message  # noqa: E402
from gateway.server import tune_gc  # noqa: E402
from gateway.types import Int8  # noqa: E402


def bench_properties(n: int) -> dict[str, object]:
    """The N properties of --properties (see the module docstring), to copy per message."""
    props: dict[str, object] = {}
    for i in range(n):
        if i == 0:
            props["JMS_GW_MQTT_QOS"] = Int8(1)
        elif i == 1:
            props["JMS_GW_MQTT_RETAIN"] = True
        else:
            props[f"bench.p{i}"] = f"value {i}"
    return props


def message_maker(payload: bytes, props: dict[str, object]) -> Callable[[], Message]:
    """Makes each message sent: the payload, and a copy of ``props`` if there are any."""
    if not props:
        return lambda: Message.binary(payload)
    binary = Message.binary

    def make() -> Message:
        m = binary(payload)
        m.properties = dict(props)
        return m

    return make


def cpu_us(cpu0: float, count: int) -> float:
    """The event loop thread's CPU time per message since ``cpu0`` (``time.thread_time``),
    in µs: less disturbed than the wall clock when other programs share the cores (the
    log's writer process and its writer thread are not in it)."""
    return (time.thread_time() - cpu0) * 1e6 / count


async def bench_topic(count: int, log: bool, props: dict[str, object]) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as d:
        async with running_broker(Path(d), log=log, store_type="memory") as b:
            s = b.connect().session(AckMode.NONE)
            n = 0

            def listener(_: object) -> None:
                nonlocal n
                n += 1

            s.consumer(T("bench.topic"), listener=listener)
            p = b.connect().session().producer(T("bench.topic"),
                                               delivery_mode=DeliveryMode.NON_PERSISTENT, validate=False)
            send = p.send
            make = message_maker(b"x" * 64, props)
            t0, cpu0 = time.perf_counter(), time.thread_time()
            for _ in range(count):
                send(make())
            dt = time.perf_counter() - t0
            assert n == count, (n, count)
            return count / dt, cpu_us(cpu0, count)


async def bench_queue(count: int, log: bool, props: dict[str, object]) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as d:
        async with running_broker(Path(d), log=log, store_type="memory") as b:
            s = b.connect().session(AckMode.AUTO)
            n = 0

            def listener(_: object) -> None:
                nonlocal n
                n += 1

            s.consumer(Q("bench.queue"), listener=listener)
            p = b.connect().session().producer(Q("bench.queue"),
                                               delivery_mode=DeliveryMode.NON_PERSISTENT, validate=False)
            make = message_maker(b"x" * 64, props)
            t0, cpu0 = time.perf_counter(), time.thread_time()
            for _ in range(count):
                p.send(make())
            dt = time.perf_counter() - t0
            assert n == count and b.queues["bench.queue"].count == 0
            return count / dt, cpu_us(cpu0, count)


async def bench_persistent(count: int, window: int, log: bool,
                           props: dict[str, object]) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as d:
        async with running_broker(Path(d), log=log, gateway="store_sync = true\n") as b:
            p = b.connect().session().producer(Q("bench.persistent"))
            make = message_maker(b"x" * 64, props)
            # A sliding window, as a JMS async send, AMQP credit or MQTT's Receive Maximum
            # keeps it: each confirmation lets the next send go.
            room = asyncio.Semaphore(window)
            release = room.release
            confirmed: list[asyncio.Future[None]] = []
            t0 = time.perf_counter()
            for _ in range(count):
                await room.acquire()
                f = p.send(make())
                if f is None:
                    release()
                else:
                    f.add_done_callback(lambda f: release())
                    confirmed.append(f)
            await asyncio.gather(*confirmed)
            dt = time.perf_counter() - t0
            assert b.queues["bench.persistent"].count == count
            return count / dt, dict(b.store.stats)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=300_000)
    ap.add_argument("--persistent-count", type=int, default=50_000)
    ap.add_argument("--window", type=int, default=1000)
    ap.add_argument("--no-log", action="store_true")
    ap.add_argument("--properties", type=int, default=0, metavar="N",
                    help="N properties on every message (see the module docstring)")
    ap.add_argument("--only", choices=("topic", "queue", "persistent"), action="append",
                    help="run only this benchmark (may be given more than once)")
    ap.add_argument("--default-gc", action="store_true",
                    help="leave CPython's collector as it is (gateway serve tunes it)")
    ap.add_argument("--tree", metavar="DIR",
                    help="measure the gateway of this tree instead (see the module docstring)")
    args = ap.parse_args()
    log = not args.no_log
    if not args.default_gc:
        tune_gc()  # as `gateway serve` does once started
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    props = bench_properties(args.properties)
    only = set(args.only or ("topic", "queue", "persistent"))
    if "topic" in only:
        rate, cpu = run(bench_topic(args.count, log, props))
        print(f"topic publish->deliver (non-persistent, delivery log {'on' if log else 'off'}, "
              f"{len(props)} properties): {rate:,.0f} msgs/s, loop CPU {cpu:.2f} µs/msg")
    if "queue" in only:
        rate, cpu = run(bench_queue(args.count, log, props))
        print(f"queue send->deliver->ack (non-persistent, AUTO): {rate:,.0f} msgs/s, "
              f"loop CPU {cpu:.2f} µs/msg")
    if "persistent" in only:
        rate, stats = run(bench_persistent(args.persistent_count, args.window, log, props))
        print(f"persistent queue send, fsync on, group commit (window {args.window}): "
              f"{rate:,.0f} msgs/s  store stats: {stats}")


if __name__ == "__main__":
    main()
