"""A durable subscription's backlog past ``destination_backlog_swapout`` lives in the store
(its tail), not in memory: accounting, order, shared message rows, restart, expiry, limits.

Through the in-process client API on a broker with an SQLite store (tests/corehelp.py); the
store's tables are read with a second SQLite connection after a flush.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

from corehelp import Q, T, collect, running_broker, until

from gateway.backlog import MESSAGE_OVERHEAD
from gateway.message import DeliveryMode, Message

NP = DeliveryMode.NON_PERSISTENT
BODY = 1024
BACKLOG = 100
GW = f"destination_backlog_swapout = {BACKLOG}\nmax_msg_memory = 0\n"
# What one message held in memory costs: body, size estimate's 64 bytes, the property, the
# object overhead.
PER_MSG = BODY + 64 + 8 + 1 + MESSAGE_OVERHEAD


def numbered(i: int) -> Message:
    m = Message.binary(i.to_bytes(4, "big") * (BODY // 4))
    m.properties["n"] = i
    return m


def number(d: Any) -> int:
    return int.from_bytes(d.msg.body[:4], "big")


def rows(tmp_path: Path, broker: Any) -> tuple[int, int]:
    """(message rows, entries) in the store, after everything submitted is written."""
    broker.store.flush()
    db = sqlite3.connect(str(tmp_path / "data" / "gateway.db"))
    try:
        nmsgs = db.execute("SELECT count(*) FROM messages").fetchone()[0]
        nents = db.execute("SELECT count(*) FROM entries").fetchone()[0]
    finally:
        db.close()
    return nmsgs, nents


async def offline_durable(b: Any, client_id: str = "cid", name: str = "d",
                          topic: str = "tail.t") -> Any:
    conn = b.connect(client_id=client_id)
    conn.session().consumer(T(topic), durable_name=name).close()
    conn.close()
    return b.durables[f"sub:{client_id}:{name}"]


async def publish(b: Any, n: int, topic: str = "tail.t", start: int = 0) -> None:
    p = b.connect().session().producer(T(topic))
    futures = [p.send(numbered(i)) for i in range(start, start + n)]
    await asyncio.gather(*[f for f in futures if f is not None])


def attach(b: Any, client_id: str = "cid", name: str = "d", topic: str = "tail.t") -> list[Any]:
    got, listener = collect()
    conn = b.connect(client_id=client_id)
    conn.session().consumer(T(topic), durable_name=name, listener=listener)
    return got


async def test_a_deep_durable_backlog_costs_the_store_not_memory_and_comes_back_in_order_once(
        tmp_path):
    n = 3000
    async with running_broker(tmp_path, gateway=GW, log=False) as b:
        sub = await offline_durable(b)
        await publish(b, n)
        # The first BACKLOG in memory, the rest only counted.
        assert sub.npending == BACKLOG
        assert sub.tail == n - BACKLOG and sub.info()["stored"] == n - BACKLOG
        assert sub.count == n and sub.bytes >= n * BODY
        assert b.memory <= BACKLOG * PER_MSG + PER_MSG
        assert rows(tmp_path, b) == (n, n)
        got = attach(b)
        await until(lambda: len(got) >= n and sub.count == 0, what="the whole backlog")
        assert [number(d) for d in got] == list(range(n))
        assert sub.tail == 0 and sub.bytes == 0 and b.memory == 0
        assert rows(tmp_path, b) == (0, 0)


async def test_messages_shared_by_two_durables_and_a_live_subscriber_reach_all_and_leave_no_rows(
        tmp_path):
    n = 1000
    async with running_broker(tmp_path, gateway=GW, log=False) as b:
        d1 = await offline_durable(b, "c1")
        d2 = await offline_durable(b, "c2")
        live, listener = collect()
        b.connect().session().consumer(T("tail.t"), listener=listener)
        await publish(b, n)
        assert [number(d) for d in live] == list(range(n))
        assert d1.tail == d2.tail == n - BACKLOG
        assert rows(tmp_path, b) == (n, 2 * n)
        got1 = attach(b, "c1")
        await until(lambda: len(got1) >= n and d1.count == 0, what="the first durable")
        assert [number(d) for d in got1] == list(range(n))
        # The rows the first durable is done with are still there for the second one.
        assert rows(tmp_path, b) == (n, n)
        got2 = attach(b, "c2")
        await until(lambda: len(got2) >= n and d2.count == 0, what="the second durable")
        assert [number(d) for d in got2] == list(range(n))
        assert rows(tmp_path, b) == (0, 0)
        assert b.memory == 0


async def test_a_live_durable_consumer_reading_the_tail_while_more_arrive_gets_each_once(
        tmp_path):
    n = 2000
    async with running_broker(tmp_path, gateway=GW, log=False) as b:
        sub = await offline_durable(b)
        await publish(b, 500)
        assert sub.tail == 500 - BACKLOG
        got = attach(b)
        await publish(b, n - 500, start=500)
        await until(lambda: len(got) >= n and sub.count == 0, what="everything")
        assert [number(d) for d in got] == list(range(n))
        assert rows(tmp_path, b) == (0, 0)


async def test_a_restart_keeps_the_tail_in_the_store_and_delivers_everything_once(tmp_path):
    n = 3000
    first = 250
    async with running_broker(tmp_path, gateway=GW, log=False) as b:
        sub = await offline_durable(b)
        await publish(b, n)
        got = attach(b)
        await until(lambda: len(got) >= first, what="a first part")
        taken = [number(d) for d in got]
    async with running_broker(tmp_path, gateway=GW, log=False) as b:
        sub = b.durables["sub:cid:d"]
        # Only the first BACKLOG of what is left came back into memory at start.
        assert sub.npending == BACKLOG
        assert sub.count == n - len(taken)
        assert sub.tail == n - len(taken) - BACKLOG and sub.tail_bytes > 0
        assert b.memory <= BACKLOG * PER_MSG + PER_MSG
        got = attach(b)
        await until(lambda: sub.count == 0, what="the rest")
        rest = [number(d) for d in got]
        assert taken + rest == list(range(n))
        assert sub.bytes == 0
        assert rows(tmp_path, b) == (0, 0)


async def test_expired_messages_of_the_tail_expire_when_read_back(tmp_path):
    n = 600
    live = 50
    async with running_broker(tmp_path, gateway=GW, log=False) as b:
        sub = await offline_durable(b)
        p = b.connect().session().producer(T("tail.t"))
        futures = [p.send(numbered(i), ttl=300) for i in range(n - live)]
        futures += [p.send(numbered(i)) for i in range(n - live, n)]
        await asyncio.gather(*[f for f in futures if f is not None])
        assert sub.tail == n - BACKLOG
        await asyncio.sleep(0.4)  # past every TTL
        got = attach(b)
        await until(lambda: sub.count == 0, what="the backlog to go")
        assert [number(d) for d in got] == list(range(n - live, n))
        assert b.stats["expired"] == n - live
        assert rows(tmp_path, b) == (0, 0)


async def test_maxmsgs_counts_the_tail_default_policy_drops_past_it(tmp_path):
    async with running_broker(tmp_path, gateway=GW, log=False,
                              topics="tail.t maxmsgs=300\n>\n") as b:
        sub = await offline_durable(b)
        await publish(b, 500)
        assert sub.count == 300 and sub.tail == 200
        assert sub.dropped == 200
        got = attach(b)
        await until(lambda: sub.count == 0, what="the backlog")
        assert [number(d) for d in got] == list(range(300))
        assert rows(tmp_path, b) == (0, 0)


async def test_maxmsgs_counts_the_tail_discard_old_discards_the_oldest(tmp_path):
    async with running_broker(tmp_path, gateway=GW, log=False,
                              topics="tail.t maxmsgs=300,overflowPolicy=discardOld\n>\n") as b:
        sub = await offline_durable(b)
        p = b.connect().session().producer(T("tail.t"))
        for i in range(1000):  # one at a time: the tail's reads come back between sends
            fut = p.send(numbered(i))
            if fut is not None:
                await fut
            assert sub.count <= 300
        assert sub.count == 300
        assert sub.tail > 0
        got = attach(b)
        await until(lambda: sub.count == 0, what="the backlog")
        assert [number(d) for d in got] == list(range(700, 1000))
        assert rows(tmp_path, b) == (0, 0)


async def test_non_persistent_messages_stay_in_memory_while_a_tail_exists(tmp_path):
    async with running_broker(tmp_path, gateway=GW, log=False) as b:
        sub = await offline_durable(b)
        await publish(b, 300)
        p = b.connect().session().producer(T("tail.t"), delivery_mode=NP)
        for i in range(300, 310):
            p.send(numbered(i))
        assert sub.tail == 200 and sub.npending == BACKLOG + 10
        got = attach(b)
        await until(lambda: sub.count == 0, what="the backlog")
        # Persistent ones in their order, non-persistent ones in theirs (JMS 1.1 §4.4.10
        # leaves the order between the two delivery modes undefined).
        nums = [number(d) for d in got]
        assert sorted(nums) == list(range(310))
        assert [x for x in nums if x < 300] == list(range(300))
        assert [x for x in nums if x >= 300] == list(range(300, 310))


async def test_deleting_a_durable_with_a_tail_leaves_no_rows(tmp_path):
    async with running_broker(tmp_path, gateway=GW, log=False) as b:
        d1 = await offline_durable(b, "c1")
        d2 = await offline_durable(b, "c2")
        await publish(b, 500)
        assert d1.tail == d2.tail == 500 - BACKLOG
        b.connect(client_id="c1").session().unsubscribe("d")
        assert rows(tmp_path, b) == (500, 500)  # the other durable's entries need them
        b.connect(client_id="c2").session().unsubscribe("d")
        assert rows(tmp_path, b) == (0, 0)


async def test_past_the_swap_mark_a_durable_keeps_new_persistent_messages_in_the_store(tmp_path):
    async with running_broker(tmp_path, gateway="max_msg_memory = 1MB\n", log=False,
                              queues="held\n>\n") as b:
        sub = await offline_durable(b)
        p = b.connect().session().producer(delivery_mode=NP)
        while b.memory <= b.swap_at:  # non-persistent queue messages: cannot be swapped
            p.send(numbered(0), Q("held"))
        before = b.memory
        await publish(b, 20)
        assert sub.npending == 0 and sub.tail == 20 and sub.count == 20
        assert b.memory == before
        got = attach(b)
        await until(lambda: len(got) >= 20 and sub.count == 0, what="the tail")
        assert [number(d) for d in got] == list(range(20))


async def test_at_the_memory_limit_a_message_only_durable_tails_take_is_still_accepted(tmp_path):
    from gateway.errors import LimitExceededError

    async with running_broker(tmp_path, gateway="max_msg_memory = 1MB\n", log=False,
                              queues="held\n>\n") as b:
        sub = await offline_durable(b)
        p = b.connect().session().producer(delivery_mode=NP)
        try:
            while True:  # non-persistent queue messages up to the limit
                p.send(numbered(0), Q("held"))
        except LimitExceededError:
            pass
        before = b.memory
        await publish(b, 20)  # to the offline durable alone: its tail, no memory
        assert sub.tail == 20 and b.memory == before
        assert b.stats["rejected"] == 1
