"""RetainedStore: the name index and the streams new subscriptions take retained messages from."""

from __future__ import annotations

import random
from typing import Any

from adapters.mqtt import retained as retained_mod
from adapters.mqtt.retained import NAMESPACE, RetainedStore
from gateway import subject
from gateway.message import Destination, Message
from gateway.serial import encode_message


class FakeStore:
    """The store's key-value calls, recorded."""

    def __init__(self) -> None:
        self.kv: dict[str, bytes] = {}

    def put_kv(self, ns: str, key: str, value: bytes) -> None:
        assert ns == NAMESPACE
        self.kv[key] = value

    def delete_kv(self, ns: str, key: str) -> None:
        assert ns == NAMESPACE
        self.kv.pop(key, None)

    def commit(self, callback: Any) -> None:
        pass


def message(name: str, body: str = "x", expires_at: int = 0) -> Message:
    m = Message()
    m.destination = Destination.topic(name)
    m.body = body
    m.expires_at = expires_at
    return m


def take_all(store: RetainedStore, pattern: str, parent: bool, now: int = 0,
             limit: int = 7) -> list[str]:
    s = store.stream(pattern, parent)
    names: list[str] = []
    while not s.done:
        names += [m.destination.name for m in store.take(s, limit, now)]  # type: ignore[union-attr]
    return names


def expected(model: dict[str, str], pattern: str, parent: bool) -> list[str]:
    wild_first = pattern.split(".", 1)[0] in ("*", ">")
    out = [n for n in model if not (wild_first and n.startswith("$")) and (
        subject.matches(pattern, n) or (parent and pattern.endswith(".>")
                                         and n == pattern[:-2]))]
    first = [n for n in out if parent and n == pattern[:-2]]
    return first + sorted(n for n in out if n not in first)


def test_streams_match_a_brute_force_model_through_adds_clears_and_merges(monkeypatch) -> None:
    """Random retains and clears (small merge threshold, so the index is rebuilt often, with
    names cleared and retained again): every stream yields exactly the matching names, each
    once, the parent first and the rest in name order."""
    monkeypatch.setattr(retained_mod, "MERGE_MIN", 8)
    monkeypatch.setattr(retained_mod, "SCAN_PER_TAKE", 5)
    rng = random.Random(7)
    fs = FakeStore()
    store = RetainedStore(fs)
    model: dict[str, str] = {}
    levels = ["a", "b", "c", "$sys", "ab"]
    patterns = [(">", False), ("a.>", True), ("a.*", False), ("*.b", False), ("a.b.>", True),
                ("ab.>", True), ("$sys.>", False), ("a.b", False), ("a", False), ("*.*.c", False)]
    for step in range(3000):
        name = ".".join(rng.choice(levels[:4] if i == 0 else levels[:3] + ["ab"])
                        for i in range(rng.randint(1, 3)))
        if rng.random() < 0.3:
            store.set(name, None)
            model.pop(name, None)
        else:
            body = f"v{step}"
            store.set(name, message(name, body))
            model[name] = body
        if step % 250 == 0:
            for pattern, parent in patterns:
                assert take_all(store, pattern, parent) == expected(model, pattern, parent), (
                    pattern, step)
    assert set(fs.kv) == set(model) == set(store.records)
    restarted = RetainedStore(FakeStore(), dict(fs.kv))
    for pattern, parent in patterns:
        assert take_all(restarted, pattern, parent) == expected(model, pattern, parent)


def test_a_topic_changed_before_the_stream_reaches_it_is_left_to_the_live_delivery() -> None:
    store = RetainedStore(FakeStore())
    for i in range(10):
        store.set(f"t.{i}", message(f"t.{i}"))
    s = store.stream("t.>", False)
    first = [m.destination.name for m in store.take(s, 3, 0)]  # type: ignore[union-attr]
    assert first == ["t.0", "t.1", "t.2"]
    store.set("t.1", message("t.1", "new"))  # already taken: not again either way
    store.set("t.5", message("t.5", "new"))  # not reached: the subscriber gets it live
    store.set("t.55", message("t.55"))  # new and not reached: live as well
    store.set("t.7", None)  # cleared
    rest = [m.destination.name for m in store.take(s, 100, 0)]  # type: ignore[union-attr]
    assert rest == ["t.3", "t.4", "t.6", "t.8", "t.9"]
    assert s.done and s not in store.streams


def test_expired_and_damaged_records_are_not_sent_and_are_cleared() -> None:
    fs = FakeStore()
    fs.kv = {"d.bad": b"\x00garbage", "d.ok": encode_message(message("d.ok"))}
    store = RetainedStore(fs, dict(fs.kv))
    store.set("d.old", message("d.old", expires_at=1_000))
    store.set("d.new", message("d.new", expires_at=3_000))
    names = take_all(store, "d.*", False, now=2_000)
    assert names == ["d.new", "d.ok"]  # [MQTT-3.3.2-5]
    assert set(store.records) == set(fs.kv) == {"d.new", "d.ok"}
    assert store.get("d.new", 3_000) is None and "d.new" not in fs.kv


def test_a_filter_without_wildcards_is_one_look_up() -> None:
    store = RetainedStore(FakeStore())
    for i in range(50):
        store.set(f"dev.{i}.cmd", message(f"dev.{i}.cmd"))
    s = store.stream("dev.42.cmd", False)
    assert [m.destination.name for m in store.take(s, 10, 0)] == ["dev.42.cmd"]  # type: ignore[union-attr]
    assert s.done
    assert take_all(store, "dev.42", False) == []


def test_the_bytes_held_follow_every_set_replace_clear_and_a_restart() -> None:
    backing = FakeStore()
    store = RetainedStore(backing)
    rng = random.Random(7)
    for _ in range(500):
        name = f"t.{rng.randrange(40)}"
        if rng.random() < 0.3:
            store.set(name, None)
        else:
            store.set(name, message(name, "x" * rng.randrange(100)))
        assert store.nbytes == sum(len(b) for b in store.records.values())
    assert store.nbytes > 0
    again = RetainedStore(FakeStore(), dict(backing.kv))  # as recovered at start-up
    assert again.nbytes == store.nbytes and len(again) == len(store)
