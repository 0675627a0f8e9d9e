"""``max_msg_memory`` in the core: accounting, message swapping, producers held or refused.

Through the in-process client API on a broker with an SQLite store (tests/corehelp.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from corehelp import Q, T, collect, running_broker, until

from gateway.backlog import MESSAGE_OVERHEAD, Swapped
from gateway.client import AckMode
from gateway.errors import LimitExceededError
from gateway.message import DeliveryMode, Message

NP = DeliveryMode.NON_PERSISTENT
MB = 1024 * 1024
BODY = 1024
# Swapped messages still cost their headers and properties (about 550 bytes each, see
# MESSAGE_OVERHEAD): the swapping tests send 4 KB bodies, so that N messages held in memory
# are several times the limit while N swapped ones fit under it.
BIG = 4096


def numbered(i: int, size: int = BODY) -> Message:
    m = Message.binary(i.to_bytes(4, "big") * (size // 4))
    m.properties["n"] = i
    return m


def number(d: Any) -> int:
    return int.from_bytes(d.msg.body[:4], "big")


async def test_memory_charges_every_held_message_with_its_overhead_and_returns_to_zero(tmp_path):
    async with running_broker(tmp_path, gateway="max_msg_memory = 0\n") as b:
        p = b.connect().session().producer(Q("acct"), delivery_mode=NP)
        for i in range(100):
            p.send(numbered(i))
        # Body, the 64 bytes of size's estimate, the property, and the object overhead.
        per = b.memory / 100
        assert per >= BODY + 64 + MESSAGE_OVERHEAD
        assert b.info()["memory"] == b.memory
        got, listener = collect()
        b.connect().session().consumer(Q("acct"), listener=listener)
        assert len(got) == 100
        assert b.memory == 0


async def test_persistent_messages_far_past_the_limit_are_swapped_and_all_come_back_in_order(
        tmp_path):
    n = 10_000  # about 46 MB charged when held in memory, against an 8 MB limit
    async with running_broker(tmp_path, gateway="max_msg_memory = 8MB\n", log=False) as b:
        p = b.connect().session().producer(Q("deep"))
        futures = []
        peak = 0
        for i in range(n):
            fut = p.send(numbered(i, BIG))
            futures.append(fut)
            peak = max(peak, b.memory)
        assert peak <= 8 * MB, "the core's memory figure went past max_msg_memory"
        q = b.queues["deep"]
        assert q.count == n
        assert b.swapped > n // 2 and b.info()["swapped"] == b.swapped
        assert b.stats["rejected"] == 0
        await asyncio.gather(*[f for f in futures if f is not None])  # all durable
        got: list[int] = []
        b.connect().session().consumer(Q("deep"), listener=lambda d: got.append(number(d)))
        await until(lambda: len(got) == n, what=f"{n} messages")
        assert got == list(range(n))
        assert b.swapped == 0 and q.count == 0
        assert b.memory == 0
        assert b.stats["swapped_in"] == b.stats["swapped_out"] > 0


async def test_swapped_messages_keep_priority_order(tmp_path):
    n = 8000
    async with running_broker(tmp_path, gateway="max_msg_memory = 8MB\n", log=False) as b:
        p = b.connect().session().producer(Q("prio"))
        for i in range(n):
            p.send(numbered(i, BIG), priority=i % 10)
        assert b.swapped > 0
        got: list[Any] = []
        s = b.connect().session(AckMode.CLIENT)
        c = s.consumer(Q("prio"), listener=lambda d: (got.append((d.msg.priority, number(d))),
                                                      s.ack(d)), window=100)
        assert c is not None
        await until(lambda: len(got) == n, what=f"{n} messages")
        expected = sorted(((i % 10, i) for i in range(n)), key=lambda t: (-t[0], t[1]))
        assert got == expected
        assert b.memory == 0


async def test_a_selector_consumer_takes_only_its_swapped_messages_with_their_bodies(tmp_path):
    n = 8000
    async with running_broker(tmp_path, gateway="max_msg_memory = 8MB\n", log=False) as b:
        p = b.connect().session().producer(Q("sel"))
        for i in range(n):
            p.send(numbered(i, BIG))
        assert b.swapped > 0
        got: list[Any] = []
        b.connect().session().consumer(Q("sel"), selector="n >= 6000",
                                       listener=lambda d: got.append(d.msg.body))
        await until(lambda: len(got) == n - 6000, what="the selected messages")
        assert got == [numbered(i, BIG).body for i in range(6000, n)]
        assert b.queues["sel"].count == 6000


async def test_a_browser_sees_the_bodies_of_swapped_messages_and_they_stay_swapped(tmp_path):
    async with running_broker(tmp_path, gateway="max_msg_memory = 8MB\n", log=False) as b:
        p = b.connect().session().producer(Q("browse"))
        for i in range(8000):
            p.send(numbered(i, BIG))
        swapped = b.swapped
        assert swapped > 0
        memory = b.memory
        snapshot = b.connect().session().browser(Q("browse"))
        assert [m.body for m in snapshot] == [numbered(i, BIG).body for i in range(8000)]
        assert b.swapped == swapped and b.memory == memory


async def test_purge_and_expiry_of_swapped_messages_give_their_memory_back(tmp_path):
    async with running_broker(tmp_path, gateway="max_msg_memory = 8MB\n", log=False) as b:
        p = b.connect().session().producer(Q("gone"))
        for i in range(5000):
            p.send(numbered(i, BIG))
        p2 = b.connect().session().producer(Q("ttl"), ttl=2000)
        for i in range(5000):
            p2.send(numbered(i, BIG))
        assert any(type(m.body) is Swapped for m in b.queues["ttl"].iter_pending())
        assert b.purge_queue("gone") == 5000
        await until(lambda: b.queues["ttl"].count == 0, what="the expiry sweep")
        assert b.swapped == 0 and b.memory == 0


async def test_a_consumer_arriving_while_a_read_is_on_its_way_and_a_purge(tmp_path):
    async with running_broker(tmp_path, gateway="max_msg_memory = 8MB\n", log=False) as b:
        p = b.connect().session().producer(Q("race"))
        for i in range(8000):
            p.send(numbered(i, BIG))
        q = b.queues["race"]
        got: list[int] = []
        c = b.connect().session().consumer(Q("race"), listener=lambda d: got.append(number(d)))
        if not q.loading:  # the head was in memory: take it, up to the first swapped one
            await until(lambda: q.loading, what="a read of swapped messages")
        c.close()
        b.purge_queue("race")  # the read answers for messages that are gone
        await until(lambda: not q.loading, what="the read's answer")
        assert q.count == 0 and b.swapped == 0 and b.memory == 0
        assert got == list(range(len(got)))


async def test_swapped_messages_survive_a_restart_and_are_swapped_again(tmp_path):
    n = 8000
    conf = "max_msg_memory = 8MB\n"
    async with running_broker(tmp_path, gateway=conf, log=False) as b:
        p = b.connect().session().producer(Q("kept"))
        futures = [p.send(numbered(i, BIG)) for i in range(n)]
        await asyncio.gather(*[f for f in futures if f is not None])
    async with running_broker(tmp_path, log=False) as b:
        # Recovery holds every message for a moment; a swap pass follows at once.
        await until(lambda: b.memory <= 8 * MB * 3 // 4, what="the swap pass after recovery")
        got: list[int] = []
        b.connect().session().consumer(Q("kept"), listener=lambda d: got.append(number(d)))
        await until(lambda: len(got) == n, what=f"{n} messages")
        assert got == list(range(n))


async def test_without_swapping_persistent_messages_are_refused_at_the_limit(tmp_path):
    conf = "max_msg_memory = 8MB\nmsg_swapping = disabled\n"
    async with running_broker(tmp_path, gateway=conf, log=False) as b:
        assert not b.swapping
        p = b.connect().session().producer(Q("full"))
        sent = 0
        with pytest.raises(LimitExceededError, match="max_msg_memory"):
            for i in range(20_000):
                p.send(numbered(i))
                sent += 1
        assert 8 * MB // (BODY + 200 + MESSAGE_OVERHEAD) < sent < 8 * MB // (BODY + MESSAGE_OVERHEAD)
        assert b.memory <= 8 * MB and b.swapped == 0


async def test_flow_control_holds_producers_past_the_limit_and_loses_nothing(tmp_path):
    conf = "max_msg_memory = 8MB\nflow_control = enabled\n"
    async with running_broker(tmp_path, gateway=conf, log=False) as b:
        p = b.connect().session().producer(Q("held"), delivery_mode=NP)  # cannot be swapped
        futures = [p.send(numbered(i, 10_000)) for i in range(1000)]  # about 10 MB
        held = [f for f in futures if f is not None]
        assert held, "no producer was held past max_msg_memory"
        assert b.memory > 8 * MB and b.info()["memory_held_producers"] == len(held)
        assert b.stats["rejected"] == 0
        await asyncio.sleep(0.05)
        assert not any(f.done() for f in held)  # nothing drains: they stay held
        got: list[int] = []
        b.connect().session().consumer(Q("held"), listener=lambda d: got.append(number(d)))
        await until(lambda: all(f.done() for f in held), what="the held producers")
        assert got == list(range(1000))
        assert b.memory == 0 and b.info()["memory_held_producers"] == 0


async def test_flow_control_off_refuses_non_persistent_messages_past_the_limit(tmp_path):
    async with running_broker(tmp_path, gateway="max_msg_memory = 8MB\n", log=False) as b:
        p = b.connect().session().producer(Q("np"), delivery_mode=NP)
        accepted = 0
        with pytest.raises(LimitExceededError, match="max_msg_memory"):
            for i in range(2000):
                p.send(numbered(i, 10_000))
                accepted += 1
        got: list[int] = []
        b.connect().session().consumer(Q("np"), listener=lambda d: got.append(number(d)))
        assert got == list(range(accepted))  # everything accepted is delivered


async def test_topic_subscribers_are_charged_and_held_like_queues(tmp_path):
    conf = "max_msg_memory = 8MB\nflow_control = enabled\n"
    async with running_broker(tmp_path, gateway=conf, log=False) as b:
        got: list[int] = []
        s = b.connect().session(AckMode.CLIENT)
        c = s.consumer(T("t"), listener=lambda d: got.append(number(d)), window=None)
        p = b.connect().session().producer(T("t"), delivery_mode=NP)
        futures = [p.send(numbered(i, 10_000)) for i in range(1000)]
        held = [f for f in futures if f is not None]
        assert held and len(got) == 1000
        s.acknowledge()
        await until(lambda: all(f.done() for f in held), what="the held producers")
        assert b.memory == 0
        c.close()


async def test_a_queue_keeps_its_backlog_in_memory_and_swaps_what_is_behind_it(tmp_path):
    conf = "max_msg_memory = 0\ndestination_backlog_swapout = 100\n"
    async with running_broker(tmp_path, gateway=conf, log=False) as b:
        p = b.connect().session().producer(Q("backlog"))
        futures = [p.send(numbered(i)) for i in range(1000)]
        await asyncio.gather(*[f for f in futures if f is not None])
        q = b.queues["backlog"]
        assert q.swapped == 900  # with no memory limit at all
        kinds = [type(m.body) is Swapped for m in q.iter_pending()]
        assert kinds == [False] * 100 + [True] * 900
        got: list[int] = []
        b.connect().session().consumer(Q("backlog"), listener=lambda d: got.append(number(d)))
        await until(lambda: len(got) == 1000, what="1000 messages")
        assert got == list(range(1000))
        assert b.memory == 0 and b.swapped == 0


async def test_nothing_is_swapped_while_a_consumer_keeps_up(tmp_path):
    async with running_broker(tmp_path, gateway="max_msg_memory = 8MB\n", log=False) as b:
        got: list[int] = []
        b.connect().session().consumer(Q("live"), listener=lambda d: got.append(number(d)))
        p = b.connect().session().producer(Q("live"))
        futures = [p.send(numbered(i)) for i in range(5000)]
        await asyncio.gather(*[f for f in futures if f is not None])
        assert got == list(range(5000))
        assert b.stats["swapped_out"] == 0 and b.stats["swapped_in"] == 0


class LosingReads:
    """The broker's store, with one message left out of every read (a row gone bad)."""

    def __init__(self, store: Any, lost: int) -> None:
        self.store = store
        self.lost = lost

    def read_messages(self, ids: list[int], callback: Any) -> None:
        self.store.read_messages(
            ids, lambda found: callback({k: v for k, v in found.items() if k != self.lost}))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


async def test_a_swapped_message_the_store_cannot_give_back_is_dropped_and_the_rest_flow(
        tmp_path):
    conf = "max_msg_memory = 0\ndestination_backlog_swapout = 10\n"
    async with running_broker(tmp_path, gateway=conf) as b:
        p = b.connect().session().producer(Q("bad"))
        futures = [p.send(numbered(i)) for i in range(100)]
        await asyncio.gather(*[f for f in futures if f is not None])
        q = b.queues["bad"]
        assert q.swapped == 90
        victim = q.iter_pending()[50]
        assert type(victim.body) is Swapped
        store = b.store
        b.store = LosingReads(store, victim.store_id)
        try:
            got: list[int] = []
            b.connect().session().consumer(Q("bad"), listener=lambda d: got.append(number(d)))
            await until(lambda: q.count == 0, what="the queue drained")
        finally:
            b.store = store
        assert got == [i for i in range(100) if i != 50]
        assert b.stats["dropped"] == 1 and b.memory == 0 and b.swapped == 0


async def test_claiming_a_swapped_message_reads_its_body_at_once(tmp_path):
    conf = "max_msg_memory = 0\ndestination_backlog_swapout = 0\n"
    async with running_broker(tmp_path, gateway=conf, log=False) as b:
        p = b.connect().session().producer(Q("claim"))
        futures = [p.send(numbered(i)) for i in range(5)]
        await asyncio.gather(*[f for f in futures if f is not None])
        q = b.queues["claim"]
        assert q.swapped == 5
        target = q.iter_pending()[3]
        s = b.connect().session(AckMode.CLIENT)
        c = s.consumer(Q("claim"), window=0)  # takes nothing by itself
        d = q.claim(target.store_id, c.core)
        assert d is not None and number(d) == 3 and len(d.msg.body) == BODY
        assert q.swapped == 4
        s.ack(d)
        assert q.count == 4


async def test_messages_kept_when_undeliverable_stay_in_memory_and_keep_their_bodies(tmp_path):
    from gateway.message import PROP_PRESERVE_UNDELIVERED

    conf = "max_msg_memory = 0\ndestination_backlog_swapout = 0\n"
    async with running_broker(tmp_path, gateway=conf, log=False) as b:
        p = b.connect().session().producer(Q("ttl"), ttl=1000)
        futures = []
        for i in range(20):
            m = numbered(i)
            if i % 2:
                m.properties[PROP_PRESERVE_UNDELIVERED] = True
            futures.append(p.send(m))
        await asyncio.gather(*[f for f in futures if f is not None])
        assert b.queues["ttl"].swapped == 10
        await until(lambda: b.queues["ttl"].count == 0, what="the expiry sweep")
        kept = b.queues["$sys.undelivered"].iter_pending()
        assert [int.from_bytes(m.body[:4], "big") for m in kept] == list(range(1, 20, 2))


async def test_laggards_backlogs_are_trimmed_at_the_limit_before_producers_are_refused(tmp_path):
    """Non-durable subscribers whose consumers take nothing (a full window) hold backlogs
    past the limit: the oldest of those backlogs go, deepest first, down to LAGGARD_MIN each,
    whatever the delivery mode, and the producer and the subscriber that keeps up go on."""
    from gateway.memory import LAGGARD_MIN

    conf = "max_msg_memory = 8MB\n"
    async with running_broker(tmp_path, gateway=conf, log=False) as b:
        hung = [b.connect().session().consumer(T("lag"), window=0) for _ in range(3)]
        got: list[int] = []
        b.connect().session().consumer(T("lag"), listener=lambda d: got.append(number(d)))
        p = b.connect().session().producer(T("lag"))
        n = 3000  # 30 MB a subscriber
        for i in range(n):
            p.send(numbered(i, 10_000),
                   delivery_mode=NP if i % 2 else DeliveryMode.PERSISTENT)
        assert got == list(range(n))  # never refused
        for c in hung:
            sub = c.endpoint
            assert LAGGARD_MIN <= sub.npending < n and sub.dropped == n - sub.npending
        assert b.stats["dropped"] == sum(c.endpoint.dropped for c in hung)
        assert b.memory <= 8 * MB


class CountedList(list):
    """A connection's subscription list that counts how often it is walked."""

    walks = 0

    def __iter__(self) -> Any:
        CountedList.walks += 1
        return super().__iter__()


async def test_at_the_limit_with_no_laggard_a_refused_publish_walks_no_subscriptions(tmp_path):
    """Everything held is on a queue and the topic subscribers keep up: no laggard to trim.
    Each publish refused at the limit then costs no walk over every connection's
    subscriptions (a gateway with many connections sitting at its limit)."""
    async with running_broker(tmp_path, gateway="max_msg_memory = 8MB\n", log=False) as b:
        conns = [b.connect() for _ in range(20)]
        got: list[int] = []
        for conn in conns:
            conn.session().consumer(T("live"), listener=lambda d: got.append(number(d)))
            conn.subscriptions = CountedList(conn.subscriptions)
        p = b.connect().session().producer(Q("full"), delivery_mode=NP)
        with pytest.raises(LimitExceededError):
            for i in range(2000):
                p.send(numbered(i, 10_000))
        CountedList.walks = 0
        for i in range(50):
            with pytest.raises(LimitExceededError, match="max_msg_memory"):
                p.send(numbered(i, 10_000))
        assert CountedList.walks == 0
        b.connect().session().consumer(Q("full"), listener=lambda d: None)
        t = b.connect().session().producer(T("live"), delivery_mode=NP)
        t.send(numbered(7, 10_000))  # room again: the subscribers get it
        assert got == [7] * len(conns)


async def test_a_laggard_that_appears_after_fruitless_scans_is_trimmed(tmp_path):
    """Publishes refused at the limit with no laggard, then memory drained and filled again
    by a subscriber that takes nothing: its backlog is trimmed as always, and its
    producer is not refused."""
    from gateway.memory import LAGGARD_MIN

    async with running_broker(tmp_path, gateway="max_msg_memory = 8MB\n", log=False) as b:
        p = b.connect().session().producer(Q("full"), delivery_mode=NP)
        with pytest.raises(LimitExceededError):
            for i in range(2000):
                p.send(numbered(i, 10_000))
        for i in range(20):
            with pytest.raises(LimitExceededError):
                p.send(numbered(i, 10_000))
        drained: list[int] = []
        b.connect().session().consumer(Q("full"), listener=lambda d: drained.append(number(d)))
        assert b.memory == 0
        hung = b.connect().session().consumer(T("lag"), window=0)
        t = b.connect().session().producer(T("lag"), delivery_mode=NP)
        n = 3000  # 30 MB
        for i in range(n):
            t.send(numbered(i, 10_000))  # never refused
        sub = hung.endpoint
        assert LAGGARD_MIN <= sub.npending < n and sub.dropped == n - sub.npending
        assert b.memory <= 8 * MB


async def test_a_backlog_made_of_redeliveries_is_a_laggard_too(tmp_path):
    """A shared subscription's backlog that comes from redeliveries (a recovered session
    whose consumer left, the other consumer taking nothing) rather than from routing is
    trimmed at the limit like any other, before producers are refused."""
    from gateway.memory import LAGGARD_MIN

    async with running_broker(tmp_path, gateway="max_msg_memory = 8MB\n", log=False) as b:
        idle = b.connect().session().consumer(T("rq"), shared_name="grp", window=0)
        s = b.connect().session(AckMode.CLIENT)
        taker = s.consumer(T("rq"), shared_name="grp", listener=lambda d: None, window=None)
        t = b.connect().session().producer(T("rq"), delivery_mode=NP)
        for i in range(300):
            t.send(numbered(i, 10_000))
        sub = idle.endpoint
        assert sub.npending == 0 and sub.count == 300  # all delivered, not acknowledged
        taker.close()
        s.recover()
        assert sub.npending == 300
        p = b.connect().session().producer(Q("fill"), delivery_mode=NP)
        with pytest.raises(LimitExceededError):
            for i in range(2000):
                p.send(numbered(i, 10_000))
        assert sub.npending == LAGGARD_MIN and sub.dropped == 300 - LAGGARD_MIN


@pytest.mark.parametrize("flow", ["", "flow_control = enabled\n"])
async def test_sends_in_an_open_transaction_count_and_are_refused_past_the_limit(tmp_path, flow):
    """Sends wait in their transaction until commit: they are charged to memory, refused
    past the limit (flow control or not: a transacted send cannot be held), and give their
    memory back at commit, rollback or when the connection closes."""
    async with running_broker(tmp_path, gateway="max_msg_memory = 8MB\n" + flow, log=False) as b:
        conn = b.connect()
        s = conn.session(transacted=True)
        p = s.producer(Q("tx"), delivery_mode=NP)
        accepted = 0
        with pytest.raises(LimitExceededError, match="open transactions"):
            for i in range(2000):
                p.send(numbered(i, 10_000))
                accepted += 1
        assert 0 < accepted < 2000
        assert accepted * 10_000 < b.memory <= 8 * MB
        s.commit()  # what was accepted is published: the queue holds it now
        got: list[int] = []
        b.connect().session().consumer(Q("tx"), listener=lambda d: got.append(number(d)))
        assert got == list(range(accepted)) and b.memory == 0
        for i in range(10):
            p.send(numbered(i, 10_000))
        assert b.memory > 0
        s.rollback()
        assert b.memory == 0
        tx = conn.transaction()  # a connection's own (STOMP BEGIN, an AMQP coordinator)
        tx.send(numbered(0, 10_000).copy())
        assert b.memory > 0
        conn.close()  # left open: rolled back with the connection
        assert b.memory == 0
