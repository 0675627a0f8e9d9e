"""Tests for gateway.store: interface round trips, recovery, group commit, errors, a crash."""

from __future__ import annotations

import asyncio
import functools
import os
import queue
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import message_differences

from gateway.errors import MessageFormatError
from gateway.message import Destination, Message
from gateway.store import MemoryStore, Recovered, SqliteStore, Store, StoreError, open_store
from gateway.store import sqlite as sqlite_module
from gateway.types import Int16, Int16Array, UInt64


class LoopStub:
    """Stands in for ``loop.call_soon_threadsafe``: queues calls; ``run()`` runs them here."""

    def __init__(self, on_post: Callable[[], None] | None = None) -> None:
        self.calls: queue.Queue[tuple[Callable[..., Any], tuple[Any, ...], int]] = queue.Queue()
        self.on_post = on_post
        self.posts = 0

    def __call__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.posts += 1
        if self.on_post is not None:
            self.on_post()
        self.calls.put((fn, args, threading.get_ident()))

    def run(self) -> int:
        n = 0
        while True:
            try:
                fn, args, _ = self.calls.get_nowait()
            except queue.Empty:
                return n
            fn(*args)
            n += 1


def text(body: str, **kw: Any) -> Message:
    return Message.text(body, destination=Destination.queue("q"), **kw)


@pytest.fixture(params=["sqlite", "memory"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Store]]:
    """A factory of stores over the same place, so a second one recovers the first's data."""
    made: list[Store] = []
    memory = MemoryStore(retain=True)

    def make() -> Store:
        store: Store = (
            SqliteStore(str(tmp_path / "db" / "s.db")) if request.param == "sqlite" else memory
        )
        made.append(store)
        return store

    yield make
    for s in made:
        s.close()


def reopen(store: Store, make: Callable[[], Store]) -> tuple[Store, Recovered, LoopStub]:
    store.close()
    again = make()
    stub = LoopStub()
    return again, again.open(stub), stub


# -- interface round trips and recovery (both stores) ------------------------------------------


def test_round_trip_and_recovery(make_store: Callable[[], Store]) -> None:
    store = make_store()
    stub = LoopStub()
    assert store.open(stub) == Recovered()
    done: list[str] = []
    store.put_endpoint("queue:a", {"type": "queue", "name": "a"})
    store.put_endpoint("durable:c:s", {"type": "durable", "pattern": "x.>", "selector": None})
    m1 = text("one", properties={"p": Int16(-3)}, correlation_id=b"\x00c")
    m2 = Message.map({"nested": [Int16Array([1, 2]), {"u": UInt64(2**64 - 1)}]})
    m3 = Message.stream([None, b"x", 1.5])
    ids = [store.put_message(m) for m in (m1, m2, m3)]
    assert ids == sorted(ids) and len(set(ids)) == 3
    assert [m.store_id for m in (m1, m2, m3)] == ids
    store.add_entry("queue:a", ids[2])
    store.add_entry("queue:a", ids[0], 2)
    store.add_entry("durable:c:s", ids[1])
    store.add_entry("durable:c:s", ids[0])
    store.put_kv("retained", "a/b", b"\x01payload")
    store.put_kv("gateway", "id", b"gw-1")
    store.commit(lambda: done.append("first"))
    store.update_entry("queue:a", ids[2], 5)
    store.commit(lambda: done.append("second"))
    store.flush()
    stub.run()
    assert done == ["first", "second"]

    store, rec, _ = reopen(store, make_store)
    assert rec.endpoints == {
        "queue:a": {"type": "queue", "name": "a"},
        "durable:c:s": {"type": "durable", "pattern": "x.>", "selector": None},
    }
    assert rec.entries == {
        "queue:a": [(ids[2], 5), (ids[0], 2)],
        "durable:c:s": [(ids[1], 0), (ids[0], 0)],
    }
    assert sorted(rec.messages) == ids
    for sid, original in zip(ids, (m1, m2, m3), strict=True):
        got = rec.messages[sid]
        assert message_differences(original, got) == []
        assert got.store_id == sid and got.size > 0
    assert rec.kv == {"retained": {"a/b": b"\x01payload"}, "gateway": {"id": b"gw-1"}}


def test_remove_delete_and_kv_changes_survive(make_store: Callable[[], Store]) -> None:
    store = make_store()
    store.open(LoopStub())
    store.put_endpoint("queue:a", {"n": 1})
    m1, m2 = text("1"), text("2")
    store.put_message(m1)
    store.put_message(m2)
    store.add_entry("queue:a", m1.store_id)
    store.add_entry("queue:a", m2.store_id)
    store.put_kv("ns", "k1", b"v1")
    store.put_kv("ns", "k2", b"v2")
    store.put_kv("other", "k", b"v")
    store.commit()
    store.flush()
    store.remove_entry("queue:a", m1.store_id)
    store.delete_message(m1.store_id)
    store.put_kv("ns", "k1", b"v1-new")
    store.delete_kv("ns", "k2")
    store.delete_kv("other", "k")
    store.put_endpoint("queue:a", {"n": 2})
    store.commit()
    store, rec, _ = reopen(store, make_store)
    assert rec.entries == {"queue:a": [(m2.store_id, 0)]}
    assert list(rec.messages) == [m2.store_id]
    assert rec.kv == {"ns": {"k1": b"v1-new"}}
    assert rec.endpoints == {"queue:a": {"n": 2}}


def test_entry_order_is_insertion_order(make_store: Callable[[], Store]) -> None:
    store = make_store()
    store.open(LoopStub())
    msgs = [text(str(i)) for i in range(6)]
    for m in msgs:
        store.put_message(m)
    store.commit()
    order = [4, 1, 5, 0, 3, 2]  # not id order
    for i in order[:3]:
        store.add_entry("q", msgs[i].store_id)
        store.commit()
    for i in order[3:]:
        store.add_entry("q", msgs[i].store_id)
    store.commit()
    store.flush()
    # Removing an entry and adding it again moves it to the end.
    store.remove_entry("q", msgs[1].store_id)
    store.add_entry("q", msgs[1].store_id, 7)
    store.commit()
    store, rec, _ = reopen(store, make_store)
    expected = [msgs[i].store_id for i in (4, 5, 0, 3, 2, 1)]
    assert [sid for sid, _ in rec.entries["q"]] == expected
    assert rec.entries["q"][-1] == (msgs[1].store_id, 7)


def test_delete_endpoint_deletes_its_entries(make_store: Callable[[], Store]) -> None:
    store = make_store()
    store.open(LoopStub())
    a, b, c = text("a"), text("b"), text("c")
    for m in (a, b, c):
        store.put_message(m)
    store.put_endpoint("sub:1", {"v": 1})
    store.add_entry("sub:1", a.store_id)
    store.add_entry("sub:2", a.store_id)
    store.commit()
    store.flush()
    # In one unit: more entries, delete the endpoint, re-create it with a new entry.
    store.add_entry("sub:1", b.store_id)
    store.delete_endpoint("sub:1")
    store.put_endpoint("sub:1", {"v": 2})
    store.add_entry("sub:1", c.store_id)
    store.commit()
    store, rec, _ = reopen(store, make_store)
    assert rec.endpoints == {"sub:1": {"v": 2}}
    assert rec.entries == {"sub:1": [(c.store_id, 0)], "sub:2": [(a.store_id, 0)]}
    assert sorted(rec.messages) == [a.store_id, c.store_id]  # b is referenced by nothing


def test_open_drops_dangling_entries_and_unreferenced_messages(
    make_store: Callable[[], Store],
) -> None:
    store = make_store()
    store.open(LoopStub())
    kept, gone, loose = text("kept"), text("gone"), text("loose")
    for m in (kept, gone, loose):
        store.put_message(m)
    store.add_entry("q", kept.store_id)
    store.add_entry("q", gone.store_id)
    store.add_entry("r", gone.store_id)
    store.commit()
    store.flush()
    store.delete_message(gone.store_id)  # caller bug: entries still reference it
    store.commit()
    store, rec, _ = reopen(store, make_store)
    assert rec.entries == {"q": [(kept.store_id, 0)]}
    assert list(rec.messages) == [kept.store_id]  # "loose" had no entry


def test_ids_are_never_reused(make_store: Callable[[], Store]) -> None:
    store = make_store()
    store.open(LoopStub())
    msgs = [text(str(i)) for i in range(3)]
    for m in msgs:
        store.put_message(m)
        store.add_entry("q", m.store_id)
    store.commit()
    store.flush()
    top = msgs[-1].store_id
    store.remove_entry("q", top)
    store.delete_message(top)  # the highest id is gone before the restart
    store.commit()
    store, rec, _ = reopen(store, make_store)
    assert top not in rec.messages
    fresh = text("new")
    assert store.put_message(fresh) > top


def test_put_message_keeps_an_assigned_id(make_store: Callable[[], Store]) -> None:
    store = make_store()
    store.open(LoopStub())
    m = text("v1")
    sid = store.put_message(m)
    store.add_entry("q", sid)
    store.commit()
    m.body = "v2"
    assert store.put_message(m) == sid  # rewritten under the same id
    store.commit()
    _, rec, _ = reopen(store, make_store)
    assert rec.messages[sid].body == "v2"


def test_unencodable_message_changes_nothing(make_store: Callable[[], Store]) -> None:
    store = make_store()
    store.open(LoopStub())
    bad = Message.stream([{1, 2}])
    with pytest.raises(MessageFormatError):
        store.put_message(bad)
    assert bad.store_id == 0
    good = text("ok")
    store.put_message(good)
    store.add_entry("q", good.store_id)
    store.commit()
    _, rec, _ = reopen(store, make_store)
    assert list(rec.messages) == [good.store_id]


# -- the SQLite store: group commit, durability, errors ----------------------------------------


def sqlite_store(tmp_path: Path, **kw: Any) -> SqliteStore:
    return SqliteStore(str(tmp_path / "s.db"), **kw)


def visible_ids(path: str) -> set[int]:
    """Message ids a second, independent connection sees right now."""
    conn = sqlite3.connect(path)
    try:
        return {row[0] for row in conn.execute("SELECT id FROM messages")}
    finally:
        conn.close()


def test_group_commit_callbacks_after_durability(tmp_path: Path) -> None:
    store = sqlite_store(tmp_path)
    seen_at_post: list[set[int]] = []
    stub = LoopStub(on_post=lambda: seen_at_post.append(visible_ids(store.path)))
    store.open(stub)
    n = 2000
    posted_sets: dict[int, int] = {}
    fired: list[int] = []

    def make_cb(sid: int) -> Callable[[], None]:
        def cb() -> None:
            # This batch's post is the latest one recorded before this callback was queued.
            fired.append(sid)

        return cb

    main = threading.get_ident()
    for i in range(n):
        m = text(str(i))
        sid = store.put_message(m)
        store.add_entry("q", sid)
        store.commit(make_cb(sid))
    store.flush()
    # Match callbacks to the snapshot taken when their batch was posted.
    batch_no = 0
    while True:
        try:
            fn, args, thread = stub.calls.get_nowait()
        except queue.Empty:
            break
        assert thread != main  # posted from the writer thread ...
        before = len(fired)
        fn(*args)  # ... and run here, on "the loop"
        for sid in fired[before:]:
            posted_sets[sid] = batch_no
            assert sid in seen_at_post[batch_no], "callback posted before its data was durable"
        batch_no += 1
    assert sorted(fired) == sorted(posted_sets) and len(fired) == n
    assert fired == sorted(fired)  # callbacks run in commit order
    stats = store.stats
    assert stats["commits"] >= n and stats["batches"] < n // 4, stats
    assert stats["max_batch"] > 1 and stats["errors"] == 0
    store.close()


def test_all_waiting_units_go_in_one_batch_and_cancel_out(tmp_path: Path) -> None:
    store = sqlite_store(tmp_path)
    stub = LoopStub()
    store.open(stub)
    keep = text("keep")
    store.put_message(keep)
    store.add_entry("q", keep.store_id)
    store.commit()
    store.flush()
    batches = store.stats["batches"]
    done: list[int] = []
    with store._cv:  # holding the writer's lock: units queue up and go as one batch
        for i in range(50):
            m = text(str(i))
            store.put_message(m)
            store.add_entry("q", m.store_id)
            store.commit(functools.partial(done.append, i))
            store.remove_entry("q", m.store_id)
            store.delete_message(m.store_id)
            store.commit()
        store.update_entry("q", keep.store_id, 3)
        store.commit()
    store.flush()
    stub.run()
    assert done == list(range(50))
    # The 101 held units went as one batch (flush's own unit may or may not have joined it).
    assert store.stats["max_batch"] >= 101
    assert store.stats["batches"] - batches in (1, 2)
    assert store.stats["netted"] == 200  # 50 x (put+delete, add+remove)
    assert visible_ids(store.path) == {keep.store_id}
    store.close()
    store = sqlite_store(tmp_path)
    assert store.open(LoopStub()).entries == {"q": [(keep.store_id, 3)]}
    store.close()


def put_on_queue(store: Store, body: str, then: Callable[[], None] | None) -> Message:
    """A message put on queue q in a unit of its own, committed with callback ``then``."""
    m = text(body)
    store.put_message(m)
    store.add_entry("q", m.store_id)
    store.commit(then)
    return m


async def writer_waits(store: SqliteStore) -> None:
    """Until the writer thread waits for units (as it does between batches)."""
    while not store._idle:
        await asyncio.sleep(0.001)


def test_callback_runs_on_the_asyncio_loop_thread(tmp_path: Path) -> None:
    async def scenario() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        store = sqlite_store(tmp_path)
        store.open(loop.call_soon_threadsafe)
        fut: asyncio.Future[int] = loop.create_future()
        put_on_queue(store, "x", lambda: fut.set_result(threading.get_ident()))
        thread = await asyncio.wait_for(fut, 30)
        store.close()
        return thread, threading.get_ident()

    cb_thread, loop_thread = asyncio.run(scenario())
    assert cb_thread == loop_thread


def test_the_units_of_one_loop_turn_are_one_batch(tmp_path: Path) -> None:
    async def scenario() -> dict[str, int]:
        loop = asyncio.get_running_loop()
        store = sqlite_store(tmp_path)
        store.open(loop.call_soon_threadsafe)
        await writer_waits(store)
        futs = []
        for i in range(10):  # ten PUBLISH packets of one socket read, say
            fut: asyncio.Future[None] = loop.create_future()
            put_on_queue(store, str(i), lambda f=fut: f.set_result(None))  # type: ignore[misc]
            futs.append(fut)
            time.sleep(0.002)  # the GIL free a while: a writer told at once would write now
        await asyncio.wait_for(asyncio.gather(*futs), 30)
        stats = dict(store.stats)
        store.close()
        return stats

    stats = asyncio.run(scenario())
    assert (stats["batches"], stats["commits"]) == (1, 10)  # one wake, one fsync


def test_a_unit_nobody_waits_for_goes_with_the_next_one_somebody_waits_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> tuple[int, dict[str, int], set[int], set[int]]:
        loop = asyncio.get_running_loop()
        store = sqlite_store(tmp_path)
        store.open(loop.call_soon_threadsafe)
        done: asyncio.Future[None] = loop.create_future()
        first = put_on_queue(store, "acknowledged", lambda: done.set_result(None))
        await asyncio.wait_for(done, 30)
        await writer_waits(store)
        store.remove_entry("q", first.store_id)  # the consumer's ack
        store.delete_message(first.store_id)
        store.commit(None)
        await asyncio.sleep(0.2)  # far less than LAZY_S: the writer still waits
        waiting = store.stats["batches"]
        done = loop.create_future()
        second = put_on_queue(store, "next", lambda: done.set_result(None))
        await asyncio.wait_for(done, 30)
        stats = dict(store.stats)
        ids = visible_ids(store.path)
        store.close()
        return waiting, stats, ids, {second.store_id}

    monkeypatch.setattr(sqlite_module, "LAZY_S", 60.0)
    waiting, stats, ids, left = asyncio.run(scenario())
    assert waiting == 1  # the first put only
    assert (stats["batches"], stats["commits"]) == (2, 3)  # the delete went with the second
    assert ids == left


def test_a_unit_nobody_waits_for_is_written_on_its_own_too(tmp_path: Path) -> None:
    async def scenario() -> set[int]:
        loop = asyncio.get_running_loop()
        store = sqlite_store(tmp_path)
        store.open(loop.call_soon_threadsafe)
        put_on_queue(store, "x", None)
        for _ in range(3000):  # the writer commits it after LAZY_S without being asked
            if store.stats["batches"]:
                break
            await asyncio.sleep(0.01)
        ids = visible_ids(store.path)
        store.close()
        return ids

    assert len(asyncio.run(scenario())) == 1


def add_failing_trigger(path: str) -> None:
    """Make every write of kv namespace 'boom' fail inside SQLite, as a full disk would."""
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TRIGGER boom BEFORE INSERT ON kv WHEN NEW.ns = 'boom'"
        " BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
    )
    conn.commit()
    conn.close()


def test_failed_unit_reports_error_and_others_succeed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = sqlite_store(tmp_path)
    stub = LoopStub()
    store.open(stub)
    add_failing_trigger(store.path)
    ok: list[str] = []
    errors: list[Exception] = []
    a, c = text("a"), text("c")
    with store._cv:  # one batch holding a good, a bad and a good unit
        store.put_message(a)
        store.add_entry("q", a.store_id)
        store.commit(lambda: ok.append("a"), errors.append)
        store.put_kv("boom", "k", b"v")
        store.put_kv("fine", "k", b"v")  # same unit: rolled back with it
        store.commit(lambda: ok.append("b"), errors.append)
        store.put_message(c)
        store.add_entry("q", c.store_id)
        store.commit(lambda: ok.append("c"), errors.append)
    with pytest.raises(StoreError, match="injected failure"):
        store.flush()  # a unit submitted before the flush failed
    stub.run()
    assert ok == ["a", "c"]
    assert len(errors) == 1 and "injected failure" in str(errors[0])
    assert store.stats["errors"] == 1 and store.stats["failed_batches"] == 2
    assert store.last_error is errors[0]
    assert "injected failure" in caplog.text
    # A unit without on_error: logged and counted, flush raises, success never reported.
    store.put_kv("boom", "k2", b"v")
    store.commit(lambda: ok.append("never"))
    with pytest.raises(StoreError, match="injected failure"):
        store.flush()
    stub.run()
    assert ok == ["a", "c"] and store.stats["errors"] >= 2
    # The store goes on working.
    store.put_kv("fine", "k2", b"v2")
    store.commit(lambda: ok.append("after"))
    store.close()
    stub.run()
    assert ok[-1] == "after"
    store = sqlite_store(tmp_path)
    rec = store.open(LoopStub())
    store.close()
    assert sorted(rec.messages) == sorted([a.store_id, c.store_id])
    assert rec.kv == {"fine": {"k2": b"v2"}}


def test_open_errors(tmp_path: Path) -> None:
    store = sqlite_store(tmp_path)
    store.open(LoopStub())
    with pytest.raises(StoreError, match="in use"):
        sqlite_store(tmp_path).open(LoopStub())
    with pytest.raises(StoreError, match="already open"):
        store.open(LoopStub())
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="not open"):
        store.commit(lambda: None)

    conn = sqlite3.connect(store.path)
    conn.execute("UPDATE meta SET value = 99 WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="schema version 99"):
        sqlite_store(tmp_path).open(LoopStub())

    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="cannot open store"):
        SqliteStore(str(junk)).open(LoopStub())
    # A failed open leaves no lock behind.
    with pytest.raises(StoreError, match="schema version 99"):
        sqlite_store(tmp_path).open(LoopStub())


def test_corrupt_record_stops_open_unless_forced(tmp_path: Path) -> None:
    store = sqlite_store(tmp_path)
    store.open(LoopStub())
    good, bad = text("good"), text("bad")
    for m in (good, bad):
        store.put_message(m)
        store.add_entry("q", m.store_id)
    store.put_endpoint("q", {"type": "queue"})
    store.commit()
    store.close()
    conn = sqlite3.connect(store.path)
    conn.execute("UPDATE messages SET data = x'01ff' WHERE id = ?", (bad.store_id,))
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match=f"message {bad.store_id} is corrupt"):
        sqlite_store(tmp_path).open(LoopStub())
    forced = sqlite_store(tmp_path, force_start=True)
    rec = forced.open(LoopStub())
    forced.close()
    assert list(rec.messages) == [good.store_id]
    assert rec.entries == {"q": [(good.store_id, 0)]}
    again = sqlite_store(tmp_path)
    rec = again.open(LoopStub())  # the bad record is gone for good
    again.close()
    assert list(rec.messages) == [good.store_id]


def test_ops_without_commit_are_written_by_flush_and_close(tmp_path: Path) -> None:
    store = sqlite_store(tmp_path, sync=False)
    store.open(LoopStub())
    store.put_kv("a", "b", b"c")
    store.close()
    store = sqlite_store(tmp_path)
    assert store.open(LoopStub()).kv == {"a": {"b": b"c"}}
    store.close()


# -- model test: the SQLite store against the memory store --------------------------------------


@st.composite
def op_scripts(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    """Op sequences that keep the add_entry contract (no add of an already pending pair)."""
    script: list[tuple[Any, ...]] = []
    pending: set[tuple[str, int]] = set()
    n_messages = 0
    for _ in range(draw(st.integers(1, 60))):
        kind = draw(
            st.sampled_from(
                ["put", "put", "reput", "del", "add", "add", "remove", "update", "put_ep",
                 "del_ep", "put_kv", "del_kv", "commit", "commit", "pause"]
            )
        )  # fmt: skip
        ep = draw(st.sampled_from(["e1", "e2", "e3"]))
        mid = draw(st.integers(1, max(1, n_messages)))
        if kind == "put":
            n_messages += 1
            script.append(("put", n_messages))
        elif kind in ("reput", "del") and n_messages:
            script.append((kind, mid))
        elif kind == "add" and n_messages and (ep, mid) not in pending:
            pending.add((ep, mid))
            script.append(("add", ep, mid, draw(st.integers(0, 3))))
        elif kind == "remove":
            pending.discard((ep, mid))
            script.append(("remove", ep, mid))
        elif kind == "update":
            script.append(("update", ep, mid, draw(st.integers(0, 9))))
        elif kind == "put_ep":
            script.append(("put_ep", ep, draw(st.integers(0, 9))))
        elif kind == "del_ep":
            pending -= {p for p in pending if p[0] == ep}
            script.append(("del_ep", ep))
        elif kind == "put_kv":
            script.append(("put_kv", ep, draw(st.binary(max_size=3))))
        elif kind in ("del_kv", "commit", "pause"):
            script.append((kind, ep))
    script.append(("commit", ""))
    return script


def run_script(
    store: Store, script: list[tuple[Any, ...]], held: threading.Condition | None
) -> None:
    messages: dict[int, Message] = {}
    paused = False
    for op in script:
        kind = op[0]
        if kind == "put":
            m = text(f"m{op[1]}", properties={"n": op[1]})
            messages[op[1]] = m
            store.put_message(m)
        elif kind == "reput":
            m = messages[op[1]]
            m.properties["again"] = True
            store.put_message(m)
        elif kind == "del":
            store.delete_message(messages[op[1]].store_id)
        elif kind == "add":
            store.add_entry(op[1], messages[op[2]].store_id, op[3])
        elif kind == "remove":
            store.remove_entry(op[1], messages[op[2]].store_id if op[2] in messages else op[2])
        elif kind == "update":
            sid = messages[op[2]].store_id if op[2] in messages else op[2]
            store.update_entry(op[1], sid, op[3])
        elif kind == "put_ep":
            store.put_endpoint(op[1], {"v": op[2]})
        elif kind == "del_ep":
            store.delete_endpoint(op[1])
        elif kind == "put_kv":
            store.put_kv("ns", op[1], op[2])
        elif kind == "del_kv":
            store.delete_kv("ns", op[1])
        elif kind == "commit":
            store.commit()
        elif kind == "pause" and held is not None:
            # Hold the writer so the following units pile up into one batch.
            if paused:
                held.release()
            else:
                held.acquire()
            paused = not paused
    if paused and held is not None:
        held.release()


@given(op_scripts())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_sqlite_store_matches_the_memory_model(script: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sqlite = SqliteStore(os.path.join(tmp, "m.db"), sync=False)
        sqlite.open(LoopStub())
        model = MemoryStore(retain=True)
        model.open(LoopStub())
        run_script(sqlite, script, sqlite._cv)
        run_script(model, script, None)
        sqlite.close()
        model.close()
        reopened = SqliteStore(sqlite.path)
        got, want = reopened.open(LoopStub()), model.open(LoopStub())
        reopened.close()
    assert got.endpoints == want.endpoints
    assert got.entries == want.entries
    assert got.kv == want.kv
    assert sorted(got.messages) == sorted(want.messages)
    for sid, m in want.messages.items():
        assert message_differences(m, got.messages[sid]) == []


# -- the memory store and open_store -----------------------------------------------------------


def test_memory_store_keeps_nothing_and_calls_back_next_turn() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        store = MemoryStore()
        assert store.open(loop.call_soon_threadsafe) == Recovered()
        called: list[int] = []
        m = text("x")
        assert store.put_message(m) == 1 and store.put_message(text("y")) == 2
        store.add_entry("q", m.store_id)
        store.put_kv("a", "b", b"c")
        store.commit(lambda: called.append(1))
        assert called == []  # not synchronously ...
        await asyncio.sleep(0)
        assert called == [1]  # ... but on the next loop turn
        store.close()
        assert store.open(loop.call_soon_threadsafe) == Recovered()
        store.close()

    asyncio.run(scenario())


def test_open_store(tmp_path: Path) -> None:
    s = open_store("sqlite", str(tmp_path / "new" / "dir" / "g.db"), True)
    assert isinstance(s, SqliteStore) and s.sync
    s.open(LoopStub())
    s.close()
    assert (tmp_path / "new" / "dir" / "g.db").exists()
    assert isinstance(open_store("memory", "", False), MemoryStore)
    with pytest.raises(ValueError, match="unknown store type"):
        open_store("mstore", "x", True)


# -- crash: SIGKILL mid-stream loses nothing acknowledged ---------------------------------------

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "store_crash_child.py")


def run_child_until_killed(path: str, run: int, target: int) -> list[str]:
    """Start the child, let it store ``target`` messages, SIGKILL it; return all its lines."""
    proc = subprocess.Popen(
        [sys.executable, CHILD, path, str(run)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 60
    stored = 0
    try:
        while stored < target and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip("\n"))
            stored += line.startswith("stored ")
    finally:
        proc.send_signal(signal.SIGKILL)
        rest, _ = proc.communicate(timeout=30)
    lines.extend(rest.splitlines())
    assert proc.returncode == -signal.SIGKILL
    assert stored >= target, f"child stored only {stored} messages: {lines[-5:]}"
    return lines


@pytest.mark.slow
def test_sigkill_loses_no_acknowledged_message(tmp_path: Path) -> None:
    path = str(tmp_path / "crash.db")
    all_ids: list[int] = []
    acked: set[int] = set()
    bodies: dict[int, str] = {}
    for run in range(3):
        lines = run_child_until_killed(path, run, 300 + 200 * run)
        run_ids = []
        for line in lines:
            # A line cut by the kill may be incomplete: ignore anything that does not parse.
            parts = line.split()
            if len(parts) == 3 and parts[0] == "stored" and parts[1].isdigit():
                run_ids.append(int(parts[1]))
                bodies[int(parts[1])] = parts[2]
            elif len(parts) == 2 and parts[0] == "acked" and parts[1].isdigit():
                acked.add(int(parts[1]))
        # Ids continue after everything an earlier run had stored: never reused.
        assert not all_ids or min(run_ids) > max(all_ids)
        all_ids.extend(run_ids)
        store = SqliteStore(path)
        rec = store.open(LoopStub())
        store.close()
        recovered = {sid for sid, _ in rec.entries.get("queue:crash", [])}
        # The child removes every stored id divisible by 3 right after printing it; until
        # it prints "acked", that removal may or may not have become durable.
        lost = [sid for sid in all_ids if sid % 3 and sid not in recovered]
        assert lost == [], f"run {run}: acknowledged messages lost after SIGKILL: {lost[:10]}"
        assert not (acked & set(rec.messages)), "an acknowledged removal came back"
        assert len(acked) > 50 and not acked & recovered
        for sid in recovered:
            if sid in bodies:
                assert rec.messages[sid].body == bodies[sid]
        assert rec.endpoints == {"queue:crash": {"type": "queue", "name": "crash"}}


def test_a_commit_wakes_an_idle_writer_and_a_busy_one_is_not_notified(tmp_path: Path) -> None:
    """commit() notifies the writer only while it waits (``_idle``); no unit is left behind
    either way -- each commit here is confirmed without a flush() to push it."""
    store = sqlite_store(tmp_path)
    stub = LoopStub()
    store.open(stub)
    done: list[int] = []
    try:
        for i in range(30):
            deadline = time.monotonic() + 5
            while not store._idle:  # the writer went back to waiting
                assert time.monotonic() < deadline, "the writer never went idle"
                time.sleep(0.001)
            m = text(str(i))
            store.put_message(m)
            store.add_entry("q", m.store_id)
            store.commit(functools.partial(done.append, i))
            for j in range(3):  # while it is busy: queued, not notified
                m = text(f"{i}.{j}")
                store.put_message(m)
                store.add_entry("q", m.store_id)
                store.commit()
            fn, args, _ = stub.calls.get(timeout=5)  # the callback, without a flush
            fn(*args)
        assert done == list(range(30))
    finally:
        store.close()
    assert store.stats["commits"] == 121  # and the flush of close()


# -- durable subscriptions' tails ----------------------------------------------------------------


def test_delete_unreferenced_keeps_a_row_another_durable_still_references(
        make_store: Callable[[], Store]) -> None:
    store = make_store()
    store.open(LoopStub())
    for key in ("sub:c:a", "sub:c:b"):
        store.put_endpoint(key, {"type": "durable", "pattern": "t"})
    m = text("shared")
    store.put_message(m)
    store.add_entry("sub:c:a", m.store_id)
    store.add_entry("sub:c:b", m.store_id)
    store.commit()
    store.flush()
    store.remove_entry("sub:c:a", m.store_id)
    store.delete_unreferenced(m.store_id)
    store.commit()
    store, rec, _ = reopen(store, make_store)
    assert list(rec.messages) == [m.store_id]
    assert rec.entries == {"sub:c:b": [(m.store_id, 0)]}
    store.remove_entry("sub:c:b", m.store_id)
    store.delete_unreferenced(m.store_id)
    store.commit()
    store, rec, _ = reopen(store, make_store)
    assert rec.messages == {} and rec.entries == {}


def test_a_row_put_and_unreferenced_in_one_batch_never_reaches_the_database(
        tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "s.db"))
    store.open(LoopStub())
    try:
        store.put_endpoint("sub:c:a", {"type": "durable", "pattern": "t"})
        store.commit()
        store.flush()
        netted = store.stats["netted"]
        m, kept = text("gone"), text("kept")
        # One unit, as a publish consumed before its commit: netted like a plain delete.
        store.put_message(m)
        store.add_entry("sub:c:a", m.store_id)
        store.remove_entry("sub:c:a", m.store_id)
        store.delete_unreferenced(m.store_id)
        # A row whose entry stays is written.
        store.put_message(kept)
        store.add_entry("sub:c:a", kept.store_id)
        store.delete_unreferenced(kept.store_id)
        store.commit()
        store.flush()
        assert store.stats["netted"] == netted + 4
        db = sqlite3.connect(str(tmp_path / "s.db"))
        try:
            assert db.execute("SELECT id FROM messages").fetchall() == [(kept.store_id,)]
        finally:
            db.close()
    finally:
        store.close()


def test_open_with_a_backlog_leaves_each_durables_rest_in_the_store_and_reads_it_in_order(
        tmp_path: Path) -> None:
    path = str(tmp_path / "s.db")
    store = SqliteStore(path)
    store.open(LoopStub())
    store.put_endpoint("sub:c:d", {"type": "durable", "pattern": "t"})
    store.put_endpoint("queue:q", {"type": "queue", "name": "q"})
    msgs = [text(str(i)) for i in range(10)]
    for i, m in enumerate(msgs):
        store.put_message(m)
        store.add_entry("sub:c:d", m.store_id, 1 if i == 7 else 0)
        store.add_entry("queue:q", m.store_id)
    store.commit()
    store.close()
    store = SqliteStore(path)
    stub = LoopStub()
    rec = store.open(stub, backlog=4)
    try:
        ids = [m.store_id for m in msgs]
        assert rec.entries["sub:c:d"] == [(sid, 0) for sid in ids[:4]]
        assert rec.entries["queue:q"] == [(sid, 0) for sid in ids]  # queues: everything
        n, nbytes, cursor = rec.tails["sub:c:d"]
        assert (n, cursor) == (6, ids[3]) and nbytes > 0
        got: list[list[tuple[int, int, Message | None]]] = []
        store.read_entries("sub:c:d", cursor, 4, got.append)
        store.read_entries("sub:c:d", ids[7], 4, got.append)
        store.flush()
        for _ in range(100):
            if len(got) == 2:
                break
            stub.run()
            time.sleep(0.01)
        first, rest = got
        assert [(sid, count) for sid, count, _ in first] == [(sid, 1 if sid == ids[7] else 0)
                                                           for sid in ids[4:8]]
        assert [m.body for _, _, m in first if m is not None] == ["4", "5", "6", "7"]
        assert [sid for sid, _, _ in rest] == ids[8:]
    finally:
        store.close()


def test_a_store_made_without_the_subscription_index_opens_and_gets_it(tmp_path: Path) -> None:
    path = str(tmp_path / "s.db")
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    for stmt in (
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value) WITHOUT ROWID",
        "CREATE TABLE messages (id INTEGER PRIMARY KEY, data BLOB NOT NULL)",
        "CREATE TABLE entries (seq INTEGER PRIMARY KEY, endpoint TEXT NOT NULL,"
        " msg INTEGER NOT NULL, count INTEGER NOT NULL DEFAULT 0, UNIQUE (endpoint, msg))",
        "CREATE TABLE endpoints (key TEXT PRIMARY KEY, def TEXT NOT NULL)",
        "CREATE TABLE kv (ns TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL,"
        " PRIMARY KEY (ns, key)) WITHOUT ROWID",
        "INSERT INTO meta VALUES ('schema_version', 1)",
    ):
        db.execute(stmt)
    db.commit()
    db.close()
    store = SqliteStore(path)
    assert store.open(LoopStub(), backlog=10) == Recovered()
    store.close()
    db = sqlite3.connect(path)
    try:
        names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    finally:
        db.close()
    assert "entries_sub_msg" in names
