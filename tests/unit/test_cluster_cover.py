"""Which patterns a cluster node subscribes to in NATS: the local subscriptions' patterns that
no other one contains, kept so as local subscriptions come and go (cluster.link)."""

from __future__ import annotations

import random
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.link import ClusterLink
from gateway import subject


def link() -> ClusterLink:
    return ClusterLink(SimpleNamespace(), ("nats://127.0.0.1:4222",), "t", "n1")  # type: ignore[arg-type]


def change(lk: ClusterLink, pattern: str, added: bool) -> None:
    lk._subscription_changed(SimpleNamespace(pattern=pattern), added)


def ops(lk: ClusterLink) -> list[tuple[bool, str]]:
    out = []
    while not lk.ops.empty():
        out.append(lk.ops.get_nowait())
    return out


def test_a_broader_pattern_replaces_the_narrower_ones_after_it_is_subscribed():
    lk = link()
    change(lk, "a.b", True)
    change(lk, "a.c", True)
    change(lk, "a.>", True)
    assert sorted(lk.cover) == ["a.>"]
    assert ops(lk) == [(True, "a.b"), (True, "a.c"), (True, "a.>"), (False, "a.b"),
                       (False, "a.c")]
    change(lk, "a.>", False)
    assert sorted(lk.cover) == ["a.b", "a.c"]
    assert ops(lk) == [(False, "a.>"), (True, "a.b"), (True, "a.c")]


def test_counts_and_system_topics():
    lk = link()
    change(lk, "x.*", True)
    change(lk, "x.*", True)
    change(lk, "$sys.monitor.>", True)
    change(lk, "x.*", False)
    assert list(lk.cover) == ["x.*"]
    change(lk, "x.*", False)
    assert lk.cover == {} and lk.patterns == {}


patterns = st.lists(st.sampled_from(["a", "b", "a.b", "a.*", "a.>", "*.b", ">", "a.b.c",
                                     "*.*", "b.>"]), min_size=1, max_size=12)


@settings(max_examples=200, derandomize=True, database=None)
@given(patterns, st.randoms(use_true_random=False))
def test_the_cover_is_always_the_minimal_one(pats, rnd: random.Random):
    lk = link()
    live: list[str] = []
    for p in pats:
        change(lk, p, True)
        live.append(p)
        if rnd.random() < 0.4:
            gone = live.pop(rnd.randrange(len(live)))
            change(lk, gone, False)
        expected = {p for p in live
                    if not any(q != p and subject.contains(q, p) for q in set(live))}
        assert set(lk.cover) == expected


def test_literal_patterns_are_not_compared_with_each_other(monkeypatch):
    """A device fleet's subscriptions (one literal topic each): adding and removing one
    compares it only with the few patterns that have wildcards, not with every other."""
    calls = 0
    for name in ("contains", "matches"):
        real = getattr(subject, name)

        def counted(a: str, b: str, real=real) -> bool:
            nonlocal calls
            calls += 1
            return bool(real(a, b))

        monkeypatch.setattr(subject, name, counted)
    lk = link()
    change(lk, "fleet.*.status", True)
    change(lk, "alerts.>", True)
    calls = 0
    for i in range(5000):
        change(lk, f"devices.d{i}.cmd", True)
    for i in range(0, 5000, 2):
        change(lk, f"devices.d{i}.cmd", False)
    assert len(lk.cover) == 2 + 2500
    assert calls <= 2 * 5000  # each against the two wildcard patterns, once


def test_a_heartbeat_lists_a_bounded_cover_and_others_read_a_long_one_as_every_topic():
    from cluster.link import COVER_MAX
    from cluster.members import Members

    lk = link()
    lk.broker = SimpleNamespace(info=lambda: {})  # type: ignore[assignment]
    for i in range(COVER_MAX):
        change(lk, f"d.{i}", True)
    assert len(lk._figures()["cover"]) == COVER_MAX
    change(lk, "d.extra", True)
    beat = lk._figures()
    assert beat["cover"] is None and beat["cover_size"] == COVER_MAX + 1
    members = Members(SimpleNamespace(), "t", "n2", dict, clock=lambda: 0.0)  # type: ignore[arg-type]
    members.nodes["n1"] = (0.0, {"up": True, **beat})
    members.nodes["n3"] = (0.0, {"up": True, "cover": ["x.y"]})
    assert members.remote_patterns() == {">", "x.y"}
