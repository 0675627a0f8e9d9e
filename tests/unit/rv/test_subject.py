"""Subject names of the RV-style bus: every example of TIBCO Rendezvous Concepts, Subject Names
(Tables 10, 11, 13, 14 and the Fundamentals chapter's wildcard table), the limits, the reserved
names, and the matcher's multiset results and cache."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transports.rv.subject import (
    SubjectError,
    SubjectMatcher,
    is_wildcard,
    validate_listen_subject,
    validate_send_subject,
)

# Table 10 (valid) and the Fundamentals chapter's examples.
VALID = [
    "NEWS.LOCAL.POLITICS.CITY_COUNCIL",
    "NEWS.NATIONAL.ARTS.MOVIES.REVIEWS",
    "CHAT.MRKTG.NEW_PRODUCTS",
    "CHAT.DEVELOPMENT.BIG_PROJECT.DESIGN",
    "News.Sports.Baseball",
    "finance",
    "This.long.subject_name.is.valid.even.though.quite.uninformative",
    "RUN.HOME",
    "RUN.for.Elected_office.President",
]

# Table 11 (invalid): empty subject and empty elements.
INVALID = [
    "",
    "News..Natural_Disasters.Flood",
    "WRONG.",
    ".TRIPLE.WRONG..",
]

# Table 13 and the Fundamentals chapter's table: (listen subject, matches, does not match).
WILDCARD_ROWS = [
    ("RUN.*", ["RUN.AWAY", "RUN.away", "RUN.Home"], ["RUN.Run.run", "Run.away", "RUN"]),
    ("Yankees.vs.*", ["Yankees.vs.Red_Sox", "Yankees.vs.Orioles"],
     ["Giants.vs.Yankees", "Yankees.beat.Sox", "Yankees.vs"]),
    ("*.your.*", ["Amaze.your.friends", "Raise.your.salary", "Darn.your.socks"],
     ["your", "Pick.up.your.foot"]),
    ("RUN.>", ["RUN.DMC", "RUN.RUN", "RUN.SWIM.BIKE.SKATE", "RUN.AWAY", "RUN.Run.run",
               "RUN.SWIM.BIKE.SKI"], ["HOME.RUN", "Run.away", "RUN"]),
]

# Table 14 (invalid wildcards).
INVALID_WILDCARDS = ["abc*xyz", "Foo.>.baz"]


@pytest.mark.parametrize("subject", VALID)
def test_table_10_subjects_are_valid_to_send_and_listen(subject):
    assert validate_send_subject(subject) == subject.split(".")
    assert validate_listen_subject(subject) == subject.split(".")


@pytest.mark.parametrize("subject", INVALID)
def test_table_11_subjects_are_refused(subject):
    with pytest.raises(SubjectError, match="empty"):
        validate_send_subject(subject)
    with pytest.raises(SubjectError, match="empty"):
        validate_listen_subject(subject)


@pytest.mark.parametrize("subject", INVALID_WILDCARDS)
def test_table_14_wildcards_are_refused(subject):
    with pytest.raises(SubjectError, match="Table 14"):
        validate_listen_subject(subject)
    with pytest.raises(SubjectError, match="Table 14"):
        validate_send_subject(subject)


@pytest.mark.parametrize(("pattern", "yes", "no"), WILDCARD_ROWS)
def test_table_13_wildcard_matching(pattern, yes, no):
    m = SubjectMatcher()
    m.add(pattern, "L")
    for s in yes:
        assert m.match(s) == ("L",), s
    for s in no:
        assert m.match(s) == (), s


@pytest.mark.parametrize(("pattern", "yes", "no"), WILDCARD_ROWS)
def test_table_13_without_the_cache(pattern, yes, no):
    m = SubjectMatcher(cache_size=0)
    m.add(pattern, "L")
    assert [m.match(s) for s in yes] == [("L",)] * len(yes)
    assert [m.match(s) for s in no] == [()] * len(no)
    assert m.cache_len() == 0


def test_total_length_counts_bytes_and_dots():
    listen = ".".join(["a" * 127, "b" * 127])  # 255 bytes
    assert validate_listen_subject(listen)
    with pytest.raises(SubjectError, match="255"):
        validate_listen_subject(listen + "c")
    with pytest.raises(SubjectError, match="255"):
        validate_listen_subject("é" * 128)  # 256 bytes in UTF-8


def test_element_limit_is_127_bytes():
    assert validate_listen_subject("a" * 127)
    with pytest.raises(SubjectError, match="127"):
        validate_listen_subject("a" * 128)
    with pytest.raises(SubjectError, match="127"):
        validate_listen_subject("x." + "é" * 64)  # 64 characters, 128 bytes


def test_send_limit_is_196_minus_the_number_of_elements():
    one = "a" * 127 + "." + "b" * 67  # 195 bytes, 2 elements: limit 194
    with pytest.raises(SubjectError, match="196 minus"):
        validate_send_subject(one)
    ok = "a" * 127 + "." + "b" * 66  # 194 bytes
    assert validate_send_subject(ok)
    assert validate_listen_subject(one)  # the send limit does not apply to listening
    five = ".".join(["abcdefghi"] * 19) + ".abcdefgh"  # 20 elements, 189 bytes > 176
    with pytest.raises(SubjectError, match="196 minus"):
        validate_send_subject(five)


def test_reserved_subjects_table_15():
    assert validate_send_subject("_INBOX.abc.1")
    assert validate_send_subject("_LOCAL.A.B.C")
    for s in ("_RV.INFO.SYSTEM.X", "_RVCM.x", "_anything.x"):
        with pytest.raises(SubjectError, match="reserved"):
            validate_send_subject(s)
        assert validate_send_subject(s, allow_internal=True)
        assert validate_listen_subject(s)
    with pytest.raises(SubjectError, match="followed by"):
        validate_send_subject("_INBOX")
    assert validate_send_subject("a._b")  # '_' is ordinary after the first element's start
    assert validate_listen_subject("_RV.*.SYSTEM.>")


def test_inbox_takes_no_wildcards():
    for s in ("_INBOX.*", "_INBOX.a.>"):
        with pytest.raises(SubjectError, match="inbox"):
            validate_listen_subject(s)
        with pytest.raises(SubjectError, match="inbox"):
            validate_send_subject(s)


def test_wildcard_sends_are_legal_unless_forbidden():
    assert validate_send_subject("A.*") == ["A", "*"]
    assert validate_send_subject("A.>") == ["A", ">"]
    with pytest.raises(SubjectError, match="wildcards are not allowed"):
        validate_send_subject("A.*", allow_wildcard=False)
    with pytest.raises(SubjectError, match="wildcards are not allowed"):
        validate_send_subject("A.>", allow_wildcard=False)
    with pytest.raises(SubjectError, match="wildcards are not allowed"):
        validate_send_subject("A.>.B", allow_wildcard=False)


def test_case_sensitive_and_other_refusals():
    m = SubjectMatcher()
    m.add("RUN.away", 1)
    assert m.match("Run.away") == ()
    assert m.match("RUN.away") == (1,)
    for bad in (None, 5, b"A.B"):
        with pytest.raises(SubjectError, match="string"):
            validate_listen_subject(bad)  # type: ignore[arg-type]
    with pytest.raises(SubjectError, match="NUL"):
        validate_send_subject("A.\0B")
    with pytest.raises(SubjectError, match="UTF-8"):
        validate_send_subject("A.\ud800")
    assert validate_send_subject("with space.and\ttab")  # only a recommendation


def test_is_wildcard():
    assert is_wildcard("a.*") and is_wildcard(">") and not is_wildcard("a.b*")


def test_two_listeners_on_one_subject_give_two_entries():
    m = SubjectMatcher()
    a, b = object(), object()
    m.add("A.B", a)
    m.add("A.B", b)
    m.add("A.*", a)
    m.add("A.>", a)
    m.add("A.B", a)  # the same listener twice on one subject: matched twice
    got = m.match("A.B")
    assert sorted(map(id, got)) == sorted(map(id, [a, b, a, a, a]))
    assert len(m) == 5
    assert m.remove("A.B", a)
    assert sorted(map(id, m.match("A.B"))) == sorted(map(id, [b, a, a, a]))


def test_remove_prunes_and_bumps_the_generation():
    m = SubjectMatcher()
    g0 = m.genid
    m.add("A.*.C", "x")
    assert m.match("A.b.C") == ("x",)
    assert m.cache_len() == 1
    assert m.genid == g0 + 1
    assert not m.remove("A.*.D", "x")
    assert not m.remove("A.*.C", "y")
    assert m.remove("A.*.C", "x")
    assert m.genid == g0 + 2 and m.cache_len() == 0
    assert m.match("A.b.C") == ()
    assert m._root.is_empty()


def test_cache_is_bounded_and_dropped_on_change():
    m = SubjectMatcher(cache_size=8)
    m.add(">", "all")
    for i in range(20):
        assert m.match(f"s{i}") == ("all",)
    assert m.cache_len() <= 8
    m.add("s1", "one")
    assert m.cache_len() == 0
    assert m.match("s1") == ("all", "one")


def test_add_refuses_bad_listen_subjects():
    m = SubjectMatcher()
    with pytest.raises(SubjectError):
        m.add("a..b", 1)
    with pytest.raises(SubjectError):
        m.add("a.>.b", 1)
    assert len(m) == 0 and m.genid == 0


def test_received_star_is_an_ordinary_element():
    m = SubjectMatcher()
    m.add("A.B", "lit")
    m.add("A.*", "star")
    assert m.match("A.*") == ("star",)


_elem = st.sampled_from(["a", "b", "c"])
_pattern_elem = st.sampled_from(["a", "b", "c", "*"])


def _reference(pattern: list[str], subject: list[str]) -> bool:
    if pattern[-1] == ">":
        head = pattern[:-1]
        if len(subject) <= len(head):
            return False
        subject = subject[:len(head)]
        pattern = head
    if len(pattern) != len(subject):
        return False
    return all(p in ("*", s) for p, s in zip(pattern, subject, strict=True))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(_pattern_elem, min_size=1, max_size=4), st.booleans()),
                min_size=1, max_size=8),
       st.lists(st.lists(_elem, min_size=1, max_size=5), min_size=1, max_size=8))
def test_matcher_agrees_with_a_direct_comparison(patterns, subjects):
    m = SubjectMatcher(cache_size=4)
    listeners = []
    for i, (elems, gt) in enumerate(patterns):
        p = elems + [">"] if gt else elems
        m.add(".".join(p), i)
        listeners.append(p)
    for _ in range(2):  # the second round reads the cache
        for s in subjects:
            want = sorted(i for i, p in enumerate(listeners) if _reference(p, s))
            assert sorted(m.match(".".join(s))) == want  # type: ignore[type-var]
