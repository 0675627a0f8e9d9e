"""Benchmark: persistent put_message + add_entry + commit throughput of the SQLite store.

Usage::

    python tests/bench/bench_store.py --count 50000             # fsync on (sync=True)
    python tests/bench/bench_store.py --count 50000 --producers 500
    python tests/bench/bench_store.py --count 50000 --no-sync --consume

Each message is one unit of work, as the broker submits a persistent send to a queue:
``put_message``, ``add_entry``, ``commit(callback)``. With ``--producers 0`` (the default) all
units are issued at once without waiting, as from very many concurrent producers; with
``--producers P`` each of P producers sends its next message only when the callback of its
previous one has fired (a synchronous JMS send). ``--consume`` also acknowledges every
message once it is stored (``remove_entry`` + ``delete_message`` + ``commit``). The figure
is messages whose commit callback ran, per second of wall time from the first put to the last
callback.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from gateway.message import Destination, Message  # noqa: E402
from gateway.store import SqliteStore  # noqa: E402
from gateway.types import Int32  # noqa: E402

ENDPOINT = "queue:bench"


def make_message(i: int) -> Message:
    return Message.text(
        f"bench message body of a typical small size, number {i}",
        destination=Destination.queue("bench"),
        properties={"region": "eu", "seq": Int32(i), "urgent": False},
        message_id=f"ID:bench:{i}",
        timestamp=1_700_000_000_000 + i,
    )


async def run(args: argparse.Namespace, path: str) -> None:
    loop = asyncio.get_running_loop()
    store = SqliteStore(path, sync=not args.no_sync)
    store.open(loop.call_soon_threadsafe)
    count = args.count
    done = loop.create_future()
    acked = 0

    def stored(msg: Message) -> None:
        nonlocal acked
        acked += 1
        if args.consume:
            store.remove_entry(ENDPOINT, msg.store_id)
            store.delete_message(msg.store_id)
            store.commit(None)
        if acked == count and not done.done():
            done.set_result(None)

    def send(i: int, next_send: bool) -> None:
        msg = make_message(i)
        store.put_message(msg)
        store.add_entry(ENDPOINT, msg.store_id, 0)

        def callback() -> None:
            stored(msg)
            if next_send and i + args.producers < count:
                send(i + args.producers, True)

        store.commit(callback)

    start = time.perf_counter()
    if args.producers <= 0:
        for i in range(count):
            send(i, False)
    else:
        for i in range(min(args.producers, count)):
            send(i, True)
    issued = time.perf_counter() - start
    await done
    elapsed = time.perf_counter() - start
    store.close()
    s = store.stats
    print(
        f"sync={'on' if not args.no_sync else 'off'} producers={args.producers or 'all-at-once'} "
        f"consume={args.consume}"
    )
    print(f"  issued {count} units in {issued:.3f}s (loop thread)")
    print(f"  {count} messages durable in {elapsed:.3f}s: {count / elapsed:,.0f} msgs/s")
    print(
        f"  batches={s['batches']} commits={s['commits']} avg_batch={s['commits'] / max(1, s['batches']):.1f}"
        f" max_batch={s['max_batch']} netted_ops={s['netted']} errors={s['errors']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=50000)
    parser.add_argument("--producers", type=int, default=0, help="0: issue everything at once")
    parser.add_argument("--no-sync", action="store_true", help="synchronous=NORMAL (no fsync)")
    parser.add_argument("--consume", action="store_true", help="also acknowledge each message")
    parser.add_argument("--dir", default=None, help="directory for the database (default: tmp)")
    parser.add_argument("--uvloop", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = os.path.join(tmp, "bench.db")
        if args.uvloop:
            import uvloop

            uvloop.run(run(args, path))
        else:
            asyncio.run(run(args, path))


if __name__ == "__main__":
    main()
