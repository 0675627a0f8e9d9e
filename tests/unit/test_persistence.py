"""Persistent messages, durable subscriptions and delivery state survive restarts and kill -9."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from corehelp import CommitHook, Q, T, collect, running_broker, write_config

from gateway.client import AckMode
from gateway.message import DeliveryMode, Message

HERE = Path(__file__).resolve().parent.parent


async def test_persistent_queue_messages_survive_restart_but_non_persistent_do_not(tmp_path):
    write_config(tmp_path)
    async with running_broker(tmp_path) as b:
        p = b.connect().session().producer(Q("keep"))
        await p.send_async(Message.text("durable", properties={"n": 1}))
        p.send(Message.text("volatile"), delivery_mode=DeliveryMode.NON_PERSISTENT)
    async with running_broker(tmp_path) as b:
        c = b.connect().session().consumer(Q("keep"))
        d = await c.receive(1)
        assert d.msg.body == "durable" and d.msg.properties == {"n": 1}
        assert await c.receive(0.05) is None


async def test_acknowledged_messages_do_not_come_back(tmp_path):
    write_config(tmp_path)
    async with running_broker(tmp_path) as b:
        s = b.connect().session()
        p = s.producer(Q("q"))
        for i in range(3):
            await p.send_async(Message.text(str(i)))
        c = s.consumer(Q("q"))
        assert (await c.receive(1)).msg.body == "0"
    async with running_broker(tmp_path) as b:
        c = b.connect().session().consumer(Q("q"))
        got = [(await c.receive(1)).msg.body for _ in range(2)]
        assert got == ["1", "2"]


async def test_durable_subscription_and_its_messages_survive_restart(tmp_path):
    write_config(tmp_path)
    async with running_broker(tmp_path) as b:
        conn = b.connect(client_id="cid")
        conn.session().consumer(T("a.b"), durable_name="dur", selector="x > 1").close()
        p = b.connect().session().producer(T("a.b"))
        for x in (1, 2, 3):
            await p.send_async(Message.text(str(x), properties={"x": x}))
    async with running_broker(tmp_path) as b:
        assert "sub:cid:dur" in b.durables
        assert b.durables["sub:cid:dur"].selector.text == "x > 1"
        c = b.connect(client_id="cid").session().consumer(T("a.b"), durable_name="dur",
                                                          selector="x > 1")
        got = [(await c.receive(1)).msg.body for _ in range(2)]
        assert got == ["2", "3"]
        assert await c.receive(0.05) is None


async def test_delivery_count_survives_restart(tmp_path):
    write_config(tmp_path)
    async with running_broker(tmp_path) as b:
        s = b.connect().session(AckMode.CLIENT)
        await s.producer(Q("dc")).send_async(Message.text("x"))
        c = s.consumer(Q("dc"))
        await c.receive(1)
        s.recover()
        d = await c.receive(1)
        assert d.count == 2
    async with running_broker(tmp_path) as b:
        d = await b.connect().session().consumer(Q("dc")).receive(1)
        assert d.count == 3 and d.redelivered


async def test_typed_values_survive_the_store(tmp_path):
    from gateway.types import Char, Float32, Int8, UInt64, UInt64Array

    write_config(tmp_path)
    body = {"u": UInt64(2**64 - 1), "s": [Int8(-1), Char("z"), {"deep": UInt64Array([1])}]}
    async with running_broker(tmp_path) as b:
        await b.connect().session().producer(Q("typed")).send_async(
            Message.map(body, properties={"f": Float32(0.25)}, correlation_id=b"\x00\xff")
        )
    async with running_broker(tmp_path) as b:
        d = await b.connect().session().consumer(Q("typed")).receive(1)
        assert d.msg.body == body
        assert type(d.msg.body["s"][2]["deep"]) is UInt64Array
        assert type(d.msg.properties["f"]) is Float32
        assert d.msg.correlation_id == b"\x00\xff"


@pytest.mark.slow
async def test_kill_9_in_the_middle_of_persistent_traffic_loses_no_confirmed_message(tmp_path):
    write_config(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "crash_producer.py"), str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(HERE.parent)},
    )
    confirmed: list[int] = []
    assert proc.stdout is not None
    while len(confirmed) < 1500:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError("producer died: " + (proc.stderr.read() if proc.stderr else ""))
        confirmed.append(int(line))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.stdout is not None
    confirmed.extend(int(x) for x in proc.stdout.read().split())
    proc.stdout.close()
    assert proc.stderr is not None
    proc.stderr.close()
    async with running_broker(tmp_path) as b:
        qmsgs = {int(m.body) for m in b.queues["crash.queue"].iter_pending()}
        # The durable's backlog past destination_backlog_swapout is in the store only (its
        # tail): a consumer takes all of it.
        sub = b.durables["sub:crash-sub:d"]
        got, listener = collect()
        b.connect(client_id="crash-sub").session().consumer(T("crash.topic"), durable_name="d",
                                                            listener=listener)
        for _ in range(6000):
            if not sub.count:
                break
            await asyncio.sleep(0.01)
        tmsgs = {int(d.msg.body) for d in got}
    missing_q = set(confirmed) - qmsgs
    missing_t = set(confirmed) - tmsgs
    assert not missing_q, f"confirmed queue messages lost: {sorted(missing_q)[:10]}"
    assert not missing_t, f"confirmed topic messages lost: {sorted(missing_t)[:10]}"


def _hold_commit_callbacks(broker) -> list:
    """Make the store's commits slow as seen from the loop: the writes happen, their
    callbacks wait in the returned list until the test runs them."""
    held: list = []
    commit = broker.store.commit

    def slow_commit(callback=None, on_error=None):
        if callback is not None:
            held.append(callback)
        commit(None, on_error)

    broker.store = CommitHook(broker.store, slow_commit)
    return held


async def test_a_send_is_confirmed_by_the_commit_or_by_the_last_ack_before_it(tmp_path):
    """Concurrent store and dispatch: a persistent message every stored copy of which was
    acknowledged before its group commit is confirmed then; one still held waits for the
    commit."""
    write_config(tmp_path)
    async with running_broker(tmp_path) as b:
        held = _hold_commit_callbacks(b)
        s = b.connect(client_id="c1").session(AckMode.EXPLICIT)
        c1 = s.consumer(T("t.x"), durable_name="one")
        c2 = s.consumer(T("t.x"), durable_name="two")
        fut = s.producer(T("t.x")).send(Message.text("fan-out"))
        assert fut is not None and held
        d1, d2 = await c1.receive(1), await c2.receive(1)
        s.ack(d1)
        await asyncio.sleep(0.01)
        assert not fut.done()  # one stored copy is left
        s.ack(d2)
        await asyncio.sleep(0)
        assert fut.done() and fut.exception() is None

        kept = s.producer(Q("q.kept")).send(Message.text("nobody reads it"))
        await asyncio.sleep(0.01)
        assert kept is not None and not kept.done()
        for callback in held:
            callback()
        await asyncio.sleep(0)
        assert kept.done() and not b.confirming
    async with running_broker(tmp_path) as b:  # the consumed one is gone, the other kept
        c = b.connect().session().consumer(Q("q.kept"))
        assert (await c.receive(1)).msg.body == "nobody reads it"
        assert b.connect(client_id="c1").session().consumer(
            T("t.x"), durable_name="one").endpoint.count == 0
