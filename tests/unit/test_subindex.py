"""The subscription index against the EMS wildcard catalogue and a brute-force reference."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import InvalidDestinationError
from gateway.subindex import EMPTY, SubIndex
from gateway.subject import intersects, matches


class Sub:
    """A subscription stand-in: identity matters, equality must not."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:  # every Sub compares equal: index must use identity
        return isinstance(other, Sub)

    __hash__ = None  # type: ignore[assignment]  # unhashable, like a mutable dataclass

    def __repr__(self) -> str:
        return f"Sub({self.name})"


def names(result: tuple[object, ...]) -> list[str]:
    return sorted(s.name for s in result)  # type: ignore[attr-defined]


def one(pattern: str, **kw: bool) -> tuple[SubIndex, Sub]:
    idx = SubIndex()
    s = Sub(pattern)
    idx.insert(pattern, s, **kw)
    return idx, s


# -- wildcards (TIBCO EMS User's Guide, "Wildcards") -----------------------------------------

CATALOGUE = [
    # (pattern, matching names, non-matching names)
    ("foo.*", ["foo.bar", "foo.boo"], ["foo.bar.boo", "foo", "bar.foo"]),  # W1
    ("foo.>", ["foo.bar", "foo.boo", "foo.boo.bar", "foo.bar.boo"], ["foo", "bar.foo"]),  # W2
    ("foo.*.bar", ["foo.boo.bar"], ["foo.bar", "foo.boo.bar.x", "foo.boo.baz"]),  # W3
    (">", ["foo", "foo.bar", "a.b.c.d.e", "NEWS.LOCAL.POLITICS.CITY_COUNCIL"], []),  # W4
    ("*", ["foo", "x"], ["foo.bar"]),
    ("*.*", ["a.b"], ["a", "a.b.c"]),
    ("*.>", ["a.b", "a.b.c"], ["a"]),
    ("foo.bar", ["foo.bar"], ["foo", "foo.bar.baz", "foo.baz"]),
    ("a.*.c.>", ["a.b.c.d", "a.x.c.d.e"], ["a.b.c", "a.b.d.e"]),
    ("Roger\\.Federer", ["Roger\\.Federer"], ["Roger.Federer"]),  # N2: backslash is literal
]


@pytest.mark.parametrize(("pattern", "yes", "no"), CATALOGUE)
def test_ems_wildcard_catalogue(pattern: str, yes: list[str], no: list[str]) -> None:
    idx, s = one(pattern)
    for name in yes:
        assert idx.match(name) == (s,), (pattern, name)
    for name in no:
        assert idx.match(name) is EMPTY, (pattern, name)


def test_many_patterns_one_name() -> None:
    idx = SubIndex()
    subs = {p: Sub(p) for p in ["foo.bar", "foo.*", "foo.>", ">", "*.bar", "*.*", "*", "foo.bar.>"]}
    for p, s in subs.items():
        idx.insert(p, s)
    assert names(idx.match("foo.bar")) == sorted(["foo.bar", "foo.*", "foo.>", ">", "*.bar", "*.*"])
    assert names(idx.match("foo.bar.x")) == sorted(["foo.>", ">", "foo.bar.>"])
    assert names(idx.match("zap")) == sorted([">", "*"])


def test_invalid_pattern_is_refused() -> None:
    idx = SubIndex()
    for bad in ["", "a..b", "a.>.b", "a.b*", "a."]:
        with pytest.raises(InvalidDestinationError):
            idx.insert(bad, Sub(bad))
    assert len(idx) == 0
    assert idx.genid == 0


# -- parent match (MQTT a/# matches a) -------------------------------------------------------


def test_parent_match() -> None:
    idx, s = one("a.b.>", parent_match=True)
    assert idx.match("a.b") == (s,)
    assert idx.match("a.b.c") == (s,)
    assert idx.match("a.b.c.d") == (s,)
    assert idx.match("a") is EMPTY
    assert idx.match("a.c") is EMPTY


def test_parent_match_is_per_insertion() -> None:
    idx = SubIndex()
    plain, pm = Sub("plain"), Sub("pm")
    idx.insert("a.>", plain)
    idx.insert("a.>", pm, parent_match=True)
    assert names(idx.match("a")) == ["pm"]
    assert names(idx.match("a.x")) == ["plain", "pm"]
    assert len(idx) == 2
    # Removing the plain insertion of pm does nothing; the parent-match one stays.
    assert idx.remove("a.>", pm) is False
    assert idx.remove("a.>", pm, parent_match=True) is True
    assert idx.match("a") is EMPTY
    assert names(idx.match("a.x")) == ["plain"]


def test_parent_match_with_wildcards_before() -> None:
    idx, s = one("*.b.>", parent_match=True)
    assert idx.match("x.b") == (s,)
    assert idx.match("x.b.c") == (s,)
    assert idx.match("x.c") is EMPTY


def test_parent_match_on_non_gt_pattern_is_plain() -> None:
    idx, s = one("a.b", parent_match=True)
    assert idx.match("a.b") == (s,)
    assert idx.remove("a.b", s, parent_match=True) is True
    assert len(idx) == 0


def test_root_gt_parent_match_matches_everything_once() -> None:
    idx, s = one(">", parent_match=True)
    assert idx.match("a") == (s,)
    assert idx.match("a.b") == (s,)


# -- the $ rule [MQTT-4.7.2-1] ---------------------------------------------------------------


def test_leading_wildcard_does_not_match_dollar_names() -> None:
    idx = SubIndex()
    subs = {p: Sub(p) for p in [">", "*.monitor.>", "*", "*.>", "$sys.>", "$sys.monitor.*"]}
    for p, s in subs.items():
        idx.insert(p, s)
    assert names(idx.match("$sys.monitor.connection")) == ["$sys.>", "$sys.monitor.*"]
    assert names(idx.match("$sys.x.y")) == ["$sys.>"]
    assert idx.match("$sys") is EMPTY
    assert idx.match("$other") is EMPTY
    assert names(idx.match("sys.monitor.x")) == sorted([">", "*.monitor.>", "*.>"])


def test_dollar_parent_match() -> None:
    idx, s = one("$sys.>", parent_match=True)
    assert idx.match("$sys") == (s,)
    assert idx.match("$sys.x") == (s,)


def test_dollar_in_later_element_is_ordinary() -> None:
    idx, s = one("a.*")
    assert idx.match("a.$b") == (s,)
    idx2, s2 = one(">")
    assert idx2.match("a.$b") == (s2,)


# -- dedupe and identity ---------------------------------------------------------------------


def test_same_sub_under_two_matching_patterns_appears_once() -> None:
    idx = SubIndex()
    s, t = Sub("s"), Sub("t")
    idx.insert("a.*", s)
    idx.insert("a.>", s)
    idx.insert("a.b", t)
    idx.insert(">", s)
    r = idx.match("a.b")
    assert len(r) == 2
    assert sorted(id(x) for x in r) == sorted([id(s), id(t)])
    assert len(idx) == 4


def test_equal_but_distinct_subs_are_kept_apart() -> None:
    idx = SubIndex()
    a, b = Sub("a"), Sub("b")
    idx.insert("x", a)
    idx.insert("x", b)
    assert names(idx.match("x")) == ["a", "b"]
    assert idx.remove("x", a) is True
    assert idx.match("x")[0] is b


def test_duplicate_insert_is_a_no_op() -> None:
    idx, s = one("a.b")
    gen = idx.genid
    idx.insert("a.b", s)
    assert len(idx) == 1
    assert idx.genid == gen
    assert idx.match("a.b") == (s,)
    assert idx.remove("a.b", s) is True
    assert idx.remove("a.b", s) is False


def test_insertion_order_on_one_node() -> None:
    idx = SubIndex()
    subs = [Sub(str(i)) for i in range(5)]
    for s in subs:
        idx.insert("q", s)
    assert [x.name for x in idx.match("q")] == ["0", "1", "2", "3", "4"]  # type: ignore[attr-defined]


def test_single_pattern_result_is_shared_not_rebuilt() -> None:
    idx = SubIndex(cache_size=0)
    s = Sub("s")
    idx.insert("a.b", s)
    assert idx.match("a.b") is idx.match("a.b")


# -- remove, pruning, len, patterns, genid ---------------------------------------------------


def test_remove_and_prune() -> None:
    idx = SubIndex()
    s, t = Sub("s"), Sub("t")
    idx.insert("a.b.c", s)
    idx.insert("a.*.>", t)
    assert idx.remove("a.b", s) is False  # node exists, sub is not on it
    assert idx.remove("a.b.c.d", s) is False
    assert idx.remove("a.b.c", t) is False
    assert idx.remove("a.b.c", s) is True
    assert idx.match("a.b.c") == (t,)
    assert idx.remove("a.*.>", t) is True
    assert idx.match("a.b.c") is EMPTY
    assert len(idx) == 0
    assert idx.patterns() == []
    assert idx._root.is_empty()  # every node pruned
    assert idx.has_interest(">") is False


def test_len_and_patterns() -> None:
    idx = SubIndex()
    s, t = Sub("s"), Sub("t")
    idx.insert("a.b", s)
    idx.insert("a.b", t)
    idx.insert("c.>", s, parent_match=True)
    assert len(idx) == 3
    assert idx.patterns() == ["a.b", "c.>"]
    idx.remove("a.b", s)
    assert idx.patterns() == ["a.b", "c.>"]
    idx.remove("a.b", t)
    assert idx.patterns() == ["c.>"]
    assert len(idx) == 1


def test_genid_moves_on_every_change() -> None:
    idx = SubIndex()
    s = Sub("s")
    seen = [idx.genid]
    idx.insert("a", s)
    seen.append(idx.genid)
    idx.insert("b.*", s)
    seen.append(idx.genid)
    idx.remove("a", s)
    seen.append(idx.genid)
    assert seen == [0, 1, 2, 3]
    idx.remove("a", s)  # not there: nothing changed
    idx.match("b.x")  # queries never move it
    assert idx.genid == 3


# -- cache -----------------------------------------------------------------------------------


def test_cache_invalidated_on_insert_and_remove() -> None:
    idx = SubIndex()
    s, t = Sub("s"), Sub("t")
    idx.insert("a.b", s)
    assert idx.match("a.b") == (s,)
    assert idx.match("x.y") is EMPTY  # negative results are cached too
    assert idx.cache_len() == 2
    idx.insert("x.*", t)
    assert idx.cache_len() == 0
    assert idx.match("x.y") == (t,)
    idx.insert("a.>", t)
    assert names(idx.match("a.b")) == ["s", "t"]
    idx.remove("a.b", s)
    assert idx.match("a.b") == (t,)
    idx.remove("a.>", t)
    assert idx.match("a.b") is EMPTY


def test_cache_hit_returns_cached_object() -> None:
    idx = SubIndex()
    idx.insert("a.*", Sub("s"))
    idx.insert("a.b", Sub("t"))
    first = idx.match("a.b")  # merged result: a new tuple
    assert idx.match("a.b") is first


def test_cache_is_bounded() -> None:
    idx = SubIndex(cache_size=8)
    s = Sub("s")
    idx.insert(">", s)
    for i in range(100):
        assert idx.match(f"n{i}") == (s,)
        assert idx.cache_len() <= 8
    assert idx.cache_len() >= 4
    assert idx.match("n99") == (s,)


def test_cache_disabled() -> None:
    idx = SubIndex(cache_size=0)
    s = Sub("s")
    idx.insert("a.*", s)
    assert idx.match("a.b") == (s,)
    assert idx.cache_len() == 0


# -- has_interest ----------------------------------------------------------------------------


def test_has_interest() -> None:
    idx = SubIndex()
    idx.insert("foo.bar.*", Sub("1"))
    idx.insert("news.>", Sub("2"), parent_match=True)
    assert idx.has_interest("foo.bar.x")
    assert not idx.has_interest("foo.bar")
    assert idx.has_interest("foo.>")
    # intersects foo.bar.* at foo.bar.baz (EMS User's Guide,
    # "Implications of Wildcards on Permissions")
    assert idx.has_interest("foo.*.baz")
    assert not idx.has_interest("foo.*")
    assert idx.has_interest("*.*.*")
    assert not idx.has_interest("foo.*.*.*")  # news.> would meet *.*.*.*, not foo.*.*.*
    assert idx.has_interest("news")  # parent match
    assert idx.has_interest("*")  # '*' meets 'news' through the parent match
    assert idx.has_interest(">")
    assert not idx.has_interest("other.>")


def test_has_interest_dollar_rule() -> None:
    idx = SubIndex()
    idx.insert("$sys.monitor.*", Sub("m"))
    assert idx.has_interest("$sys.monitor.x")
    assert idx.has_interest("$sys.>")
    assert not idx.has_interest(">")
    assert not idx.has_interest("*.monitor.*")
    idx2 = SubIndex()
    idx2.insert(">", Sub("all"))
    assert not idx2.has_interest("$sys.monitor.x")
    assert not idx2.has_interest("$sys.>")
    assert idx2.has_interest("sys.>")


# -- property test against a brute-force reference -------------------------------------------

ELEMENTS = ["a", "b", "c", "$d"]


def _first_is_wild(p: str) -> bool:
    return p.split(".")[0] in ("*", ">")


def _expand(pattern: str, parent_match: bool) -> list[str]:
    """The plain patterns equivalent to one insertion."""
    if parent_match and pattern.endswith(".>"):
        return [pattern, pattern[:-2]]
    return [pattern]


def ref_matches(pattern: str, name: str) -> bool:
    if _first_is_wild(pattern) and name.startswith("$"):
        return False
    return matches(pattern, name)


def ref_intersects(a: str, b: str) -> bool:
    for x, y in ((a, b), (b, a)):
        if _first_is_wild(x) and not _first_is_wild(y) and y.startswith("$"):
            return False
    return intersects(a, b)


@st.composite
def patterns(draw: st.DrawFn) -> str:
    n = draw(st.integers(1, 4))
    els = [draw(st.sampled_from([*ELEMENTS, "*", "*"])) for _ in range(n)]
    if draw(st.booleans()):
        els[-1] = ">"
    return ".".join(els)


literal_names = st.lists(st.sampled_from(ELEMENTS), min_size=1, max_size=5).map(".".join)


@settings(max_examples=300, deadline=None)
@given(
    subs=st.lists(st.tuples(patterns(), st.integers(0, 5), st.booleans()), max_size=25),
    removals=st.lists(st.integers(0, 30), max_size=8),
    queries=st.lists(literal_names, min_size=1, max_size=15),
    interest=st.lists(patterns(), max_size=8),
    cache_size=st.sampled_from([0, 3, 4096]),
)
def test_match_agrees_with_brute_force(
    subs: list[tuple[str, int, bool]],
    removals: list[int],
    queries: list[str],
    interest: list[str],
    cache_size: int,
) -> None:
    pool = [Sub(f"s{i}") for i in range(6)]
    idx = SubIndex(cache_size=cache_size)
    held: dict[tuple[str, int, bool], None] = {}  # reference: the set of insertions
    for k, (pattern, si, pm) in enumerate(subs):
        pm = pm and pattern.endswith(">")
        idx.insert(pattern, pool[si], parent_match=pm)
        held[(pattern, si, pm)] = None
        if k % 3 == 2:
            for q in queries[:3]:
                idx.match(q)  # warm the cache between changes
    for r in removals:
        if r < len(subs):
            pattern, si, pm = subs[r]
            pm = pm and pattern.endswith(">")
            expect = (pattern, si, pm) in held
            assert idx.remove(pattern, pool[si], parent_match=pm) is expect
            held.pop((pattern, si, pm), None)
    assert len(idx) == len(held)
    assert sorted(idx.patterns()) == sorted({p for p, _, _ in held})
    for q in queries * 2:  # second round hits the cache
        want = {si for (p, si, pm) in held if any(ref_matches(x, q) for x in _expand(p, pm))}
        got = idx.match(q)
        got_ids = [next(i for i, s in enumerate(pool) if s is g) for g in got]
        assert len(got_ids) == len(set(got_ids)), (q, got)
        assert set(got_ids) == want, (q, held)
        assert idx.has_interest(q) is bool(want)
    for q in interest:
        want_i = any(ref_intersects(x, q) for (p, _, pm) in held for x in _expand(p, pm))
        assert idx.has_interest(q) is want_i, (q, held)
