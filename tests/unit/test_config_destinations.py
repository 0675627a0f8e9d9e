"""topics.conf / queues.conf: syntax, per-kind rules, inheritance (TIBCO EMS User's Guide,
"Inheritance") and wildcard-gated dynamic creation (EMS User's Guide,
"Wildcards and Dynamically Created Destinations")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway import subject
from gateway.config import DestinationProps, DestinationTable, OverflowPolicy, load_config
from gateway.config import destinations as dmod
from gateway.config.destinations import load_destinations, parse_entry
from gateway.config.files import SourceLine
from gateway.errors import ConfigError, ConfigErrors, InvalidDestinationError


def table(kind: str, text: str) -> DestinationTable:
    """A table from file text; fails the test on any error."""
    errors: list[ConfigError] = []
    lines = [SourceLine("f.conf", i, t.strip()) for i, t in enumerate(text.splitlines(), 1)]
    t = load_destinations([sl for sl in lines if sl.text], kind, errors)  # type: ignore[arg-type]
    assert errors == []
    return t


def bad(kind: str, text: str) -> list[ConfigError]:
    errors: list[ConfigError] = []
    lines = [SourceLine("f.conf", i, t.strip()) for i, t in enumerate(text.splitlines(), 1)]
    load_destinations([sl for sl in lines if sl.text], kind, errors)  # type: ignore[arg-type]
    assert errors, "expected errors"
    return errors


def props(t: DestinationTable, name: str) -> DestinationProps:
    p = t.resolve(name)
    assert p is not None
    return p


def write(d: Path, **files: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / f"{name}.conf").write_text(text)
    return d


# -- syntax --------------------------------------------------------------------------


def test_guide_example_line() -> None:
    """EMS User's Guide, "topics.conf" (transport names checked by the loader, not here)."""
    t = table("topic", 'business.inventory global, import="RV01,RV02", export="RV03", maxbytes=1MB')
    p = props(t, "business.inventory")
    assert p.global_ and p.imports == ("RV01", "RV02") and p.exports == ("RV03",)
    assert p.maxbytes == 1024 * 1024
    assert p.inherited == frozenset()


def test_queue_example_line_and_jndi_names() -> None:
    """EMS User's Guide, "queues.conf": test store=mystore,secure,prefetch=2 — with JNDI names
    in brackets."""
    t = table("queue", "[jq1, jq2]test store=mystore,secure,prefetch=2")
    e = t.get("test")
    assert e is not None and e.jndi_names == ("jq1", "jq2")
    p = props(t, "test")
    assert (p.store, p.secure, p.prefetch) == ("mystore", True, 2)


def test_every_property_is_typed() -> None:
    t = table(
        "queue",
        "q maxmsgs=10, maxbytes=2KB, overflowPolicy=discardOld, prefetch=none, exclusive, "
        "expiration=10min, maxRedelivery=3, redeliveryDelay=30sec, flowControl=1MB, secure, "
        'sender_name, sender_name_enforced, trace=body, import="a", store=s1',
    )
    assert props(t, "q") == DestinationProps(
        maxmsgs=10,
        maxbytes=2048,
        overflow_policy=OverflowPolicy.DISCARD_OLD,
        prefetch=None,
        exclusive=True,
        expiration_ms=600_000,
        max_redelivery=3,
        redelivery_delay_ms=30_000,
        flow_control_bytes=1024 * 1024,
        secure=True,
        sender_name=True,
        sender_name_enforced=True,
        trace="body",
        imports=("a",),
        store="s1",
    )


def test_topic_only_properties() -> None:
    p = props(table("topic", 't export="x", channel=m1, prefetch=7'), "t")
    assert (p.exports, p.channel, p.prefetch) == (("x",), "m1", 7)


def test_property_names_are_case_insensitive_and_blanks_allowed() -> None:
    p = props(table("queue", "q  MAXREDELIVERY = 4 ,OverflowPolicy=REJECTINCOMING"), "q")
    assert p.max_redelivery == 4 and p.overflow_policy is OverflowPolicy.REJECT_INCOMING


def test_flow_control_without_value_is_256kb() -> None:
    """EMS User's Guide, "Destination Properties", flowControl."""
    assert props(table("queue", "q flowControl"), "q").flow_control_bytes == 256 * 1024


def test_expiration_bare_number_is_seconds_and_zero_means_never() -> None:
    assert props(table("topic", "t expiration=5"), "t").expiration_ms == 5000
    assert props(table("topic", "t expiration=0"), "t").expiration_ms == 0
    assert props(table("topic", "t"), "t").expiration_ms is None


def test_trace_plain_and_body() -> None:
    assert props(table("topic", "t trace"), "t").trace == "on"
    assert props(table("topic", "t trace=body"), "t").trace == "body"


def test_zero_values_mean_not_set() -> None:
    p = props(
        table("queue", "q maxRedelivery=0, redeliveryDelay=0, prefetch=0, flowControl=0"), "q"
    )
    assert (p.max_redelivery, p.redelivery_delay_ms, p.prefetch, p.flow_control_bytes) == (
        0, 0, 5, 0,
    )  # fmt: skip


def test_flag_accepts_boolean_value() -> None:
    t = table("topic", "a secure=true\nb secure=false")
    assert props(t, "a").secure and not props(t, "b").secure


def test_defaults_per_kind() -> None:
    # EMS User's Guide, "Destination Properties", prefetch
    assert props(table("queue", "q"), "q").prefetch == 5
    assert props(table("topic", "t"), "t").prefetch == 64
    assert DestinationTable("queue").default_props().prefetch == 5
    assert DestinationTable("topic").default_props().prefetch == 64


@pytest.mark.parametrize(
    ("kind", "line", "message"),
    [
        ("topic", "t exclusive", "property 'exclusive' is not allowed for a topic"),
        ("topic", "t maxRedelivery=3", "'maxRedelivery' is not allowed for a topic"),
        ("topic", "t redeliveryDelay=1min", "'redeliveryDelay' is not allowed for a topic"),
        ("queue", 'q export="x"', "property 'export' is not allowed for a queue"),
        ("queue", "q channel=m", "property 'channel' is not allowed for a queue"),
        ("topic", "t prefetch=none", "prefetch=none is not allowed for a topic"),
        ("queue", "q global, exclusive", "global queue cannot be exclusive"),
        ("queue", "q global, prefetch=none", "not allowed for a global queue"),
        ("queue", "q colour=red", "unknown property 'colour'"),
        ("queue", "q maxmsgs", "maxmsgs: needs a value"),
        ("queue", "q maxmsgs=-1", "maxmsgs"),
        ("queue", "q maxbytes=1TB", "not a size"),
        ("queue", "q overflowPolicy=dropAll", "not one of default, discardOld, rejectIncoming"),
        ("queue", "q prefetch=lots", "not an integer"),
        ("queue", "q maxRedelivery=1", "out of range; use 2 to 255"),
        ("queue", "q maxRedelivery=256", "out of range"),
        ("queue", "q redeliveryDelay=10sec", "use 15sec to 8hour"),
        ("queue", "q redeliveryDelay=9hour", "use 15sec to 8hour"),
        ("queue", "q expiration=soon", "not a duration"),
        ("queue", "q trace=loud", "use 'trace' or 'trace=body'"),
        ("queue", "q secure=perhaps", "not a boolean"),
        ("queue", "q secure, secure", "given twice"),
        ("queue", "q secure,,trace", "empty property"),
        ("queue", "q secure,", "empty property"),
        ("queue", 'q import="a,b', "unterminated double quote"),
        ("queue", 'q import="a,a"', "duplicate transport name 'a'"),
        ("queue", 'q import=""', "empty element"),
        ("queue", "q store=", "needs a value"),
        ("queue", "a..b", "empty element"),
        ("queue", "foo.*x", "whole elements"),
        ("queue", "$bad", "may not start with '$'"),
        ("queue", "foo.bar,secure", "put a blank between the name and its properties"),
        ("queue", "[j1 q", "missing ']'"),
        ("queue", "[j1,]q", "empty JNDI name"),
    ],
)
def test_bad_destination_line(kind: str, line: str, message: str) -> None:
    errors = bad(kind, f"ok.one\n{line}\nok.two")
    assert [(e.file, e.line) for e in errors] == [("f.conf", 2)]
    assert message in errors[0].detail


def test_several_problems_on_one_line_are_all_reported() -> None:
    errors = bad("topic", "t exclusive, colour=red, maxbytes=x")
    assert [e.line for e in errors] == [1, 1, 1]


def test_system_names_may_be_configured() -> None:
    t = table("queue", "$sys.undelivered maxmsgs=100\n$TMP$.> maxbytes=1MB")
    assert props(t, "$sys.undelivered").maxmsgs == 100
    assert props(t, "$TMP$.x.y").maxbytes == 1024 * 1024


def test_duplicate_definition_names_first_line() -> None:
    errors = bad("topic", "a\nb\na secure")
    assert [e.line for e in errors] == [3]
    assert "already defined at f.conf:1" in errors[0].detail


def test_to_line_round_trips() -> None:
    text = '[j]q maxbytes=2KB,secure,expiration=90sec,import="a,b",prefetch=none,trace=body'
    t = table("queue", text)
    e = t.get("q")
    assert e is not None
    again = table("queue", e.to_line())
    assert props(again, "q") == props(t, "q")
    assert e.to_line().startswith("[j]q ")


# -- inheritance (EMS User's Guide, "Inheritance") -----------------------------------


def test_i1_flags_add_up() -> None:
    """EMS User's Guide, "Inheritance of Properties": foo.* secure + foo.bar sender_name -> both."""
    t = table("topic", "foo.* secure\nfoo.bar sender_name")
    p = props(t, "foo.bar")
    assert p.secure and p.sender_name
    assert p.inherited == {"secure"}


def test_multiple_ancestors_union() -> None:
    """EMS User's Guide, "Inheritance of Properties": > sender_name, foo.* secure, foo.bar trace."""
    p = props(table("topic", "> sender_name\nfoo.* secure\nfoo.bar trace"), "foo.bar")
    assert p.sender_name and p.secure and p.trace == "on"
    assert p.inherited == {"sender_name", "secure"}


def test_i2_smallest_parent_value_wins() -> None:
    """EMS User's Guide, "Inheritance of Properties"."""
    t = table("queue", "> maxbytes=2000\nfoo.* maxbytes=200")
    assert props(t, "foo.bar").maxbytes == 200
    assert props(t, "other").maxbytes == 2000
    assert "maxbytes" in props(t, "foo.bar").inherited


def test_i2_same_with_literal_child_entry_without_value() -> None:
    t = table("queue", "> maxbytes=2000\nfoo.* maxbytes=200\nfoo.bar")
    assert props(t, "foo.bar").maxbytes == 200


def test_i3_child_value_overrides_parent() -> None:
    """EMS User's Guide, "Inheritance of Properties"."""
    p = props(table("queue", "foo.* maxbytes=200\nfoo.bar maxbytes=2000"), "foo.bar")
    assert p.maxbytes == 2000 and "maxbytes" not in p.inherited


def test_i4_disjoint_channel_overlap_fails_at_load() -> None:
    """EMS User's Guide, "Overlapping Wildcards and Disjoint Properties": the second definition
    fails, naming the first."""
    errors = bad(
        "topic",
        "topic.multicast.> channel=m1\nother\ntopic.multicast.quotes.* channel=m2",
    )
    assert [e.line for e in errors] == [3]
    assert "channel=m2 conflicts with channel=m1" in errors[0].detail
    assert "f.conf:1" in errors[0].detail


def test_disjoint_store_same_value_or_no_overlap_is_fine() -> None:
    t = table("queue", "a.> store=s1\na.b.* store=s1\nb.* store=s2\n> secure")
    assert props(t, "a.b.c").store == "s1"
    assert props(t, "b.x").store == "s2"
    assert props(t, "c").store is None


def test_disjoint_store_on_literal_child_conflicts_with_parent() -> None:
    errors = bad("queue", "> store=s1\nq store=s2")
    assert [e.line for e in errors] == [2]


def test_disjoint_conflict_at_resolve_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """If two clashing entries get into a table, resolve refuses the destination."""
    monkeypatch.setattr(subject, "intersects", lambda a, b: False)
    t = table("topic", "a.> store=s1\n*.b store=s2")
    monkeypatch.undo()
    with pytest.raises(InvalidDestinationError, match="disjoint") as ei:
        t.resolve("a.b")
    assert ei.value.reason == "disjoint-property"
    assert props(t, "a.c").store == "s1"


def test_i5_prefetch_largest_non_zero_parent() -> None:
    """EMS User's Guide, "Destination Properties", prefetch: parents none and 10 -> 10."""
    t = table("queue", "foo.* prefetch=none\nfoo.> prefetch=10\n*.bar prefetch=3")
    p = props(t, "foo.bar")
    assert p.prefetch == 10 and "prefetch" in p.inherited


def test_prefetch_all_parents_none_gives_none() -> None:
    t = table("queue", "foo.* prefetch=none\n> prefetch=none\nfoo.bar")
    assert props(t, "foo.bar").prefetch is None


def test_prefetch_no_parent_sets_it_gives_kind_default() -> None:
    assert props(table("queue", "> secure"), "x").prefetch == 5
    assert props(table("topic", "> secure"), "x").prefetch == 64


def test_prefetch_child_own_value_wins() -> None:
    t = table("queue", "> prefetch=50\nq prefetch=none\nr prefetch=2")
    assert props(t, "q").prefetch is None
    assert props(t, "r").prefetch == 2


def test_prefetch_none_is_reset_for_an_inherited_global_queue() -> None:
    """EMS User's Guide, appendix "Error and Status Messages": none is illegal for global
    queues; reset to default."""
    t = table("queue", "> global\nq.* prefetch=none")
    assert props(t, "q.x").prefetch == 5


def test_i6_reject_incoming_beats_discard_old() -> None:
    """EMS User's Guide, "Destination Properties", overflowPolicy."""
    t = table("queue", "a.* overflowPolicy=discardOld\n*.b overflowPolicy=rejectIncoming\n>")
    assert props(t, "a.b").overflow_policy is OverflowPolicy.REJECT_INCOMING
    assert props(t, "a.c").overflow_policy is OverflowPolicy.DISCARD_OLD
    assert props(t, "c.c").overflow_policy is OverflowPolicy.DEFAULT


def test_overflow_child_non_default_wins_default_does_not() -> None:
    t = table(
        "topic",
        "> overflowPolicy=rejectIncoming\na overflowPolicy=discardOld\nb overflowPolicy=default",
    )
    assert props(t, "a").overflow_policy is OverflowPolicy.DISCARD_OLD
    assert props(t, "b").overflow_policy is OverflowPolicy.REJECT_INCOMING
    assert "overflowPolicy" in props(t, "b").inherited


def test_i7_inherited_properties_are_marked() -> None:
    """EMS User's Guide, "Command Listing", show queues: inherited values show with '*'."""
    t = table("queue", "foo.* secure, maxbytes=200\nfoo.bar maxmsgs=5, trace")
    p = props(t, "foo.bar")
    assert p.inherited == {"secure", "maxbytes"}
    assert t.describe("foo.bar") == "maxmsgs=5,maxbytes=200*,secure*,trace"
    assert t.describe("foo.baz") == "maxbytes=200*,secure*"
    assert t.describe("nothing.here") is None


def test_expiration_inheritance() -> None:
    t = table("topic", "a.* expiration=0\n*.b expiration=10min\nc.* expiration=0\nd.d expiration=0")
    assert props(t, "a.b").expiration_ms == 600_000  # 0 = never ranks as largest
    assert props(t, "c.x").expiration_ms == 0
    t2 = table("topic", "> expiration=10min\nd expiration=0")
    assert props(t2, "d").expiration_ms == 0  # the child's own value wins


def test_trace_body_beats_on_and_lists_union_in_order() -> None:
    t = table("topic", 'a.* trace=body, import="t2,t1"\na.b trace, import="t1,t3", export="x"')
    p = props(t, "a.b")
    assert p.trace == "body" and "trace" in p.inherited
    assert p.imports == ("t1", "t3", "t2")
    assert p.exports == ("x",)
    assert "import" in p.inherited and "export" not in p.inherited


def test_child_zero_does_not_override_parent_limit() -> None:
    """EMS User's Guide, "Destination Properties", maxbytes and maxmsgs: zero and unset mean
    the same (no limit)."""
    t = table("queue", "> maxmsgs=100\nq maxmsgs=0")
    assert props(t, "q").maxmsgs == 100


def test_own_literal_entry_without_parents_has_no_inherited() -> None:
    assert props(table("queue", "q secure"), "q").inherited == frozenset()


# -- dynamic creation (EMS User's Guide, "Wildcards and Dynamically Created Destinations") ---


def test_w6_topic_wildcard_allows_matching_dynamic_topic() -> None:
    t = table("topic", "foo.* secure")
    p = props(t, "foo.bar")
    assert p.secure and not t.is_static("foo.bar")
    assert t.resolve("foo.bar.baz") is None and t.resolve("foo") is None


def test_w7_queue_star_does_not_allow_deeper_names() -> None:
    t = table("queue", "foo.*")
    assert t.resolve("foo.bar") is not None
    assert t.resolve("foo.bar.bob") is None


def test_w8_lone_gt_allows_everything() -> None:
    t = table("queue", ">")
    for name in ("a", "a.b", "x.y.z.w.v"):
        assert t.resolve(name) is not None


def test_w9_wildcard_subscription_resolves_against_containing_entries() -> None:
    t = table("topic", "foo.> maxbytes=10\nfoo.* secure")
    p = props(t, "foo.*")  # own entry foo.* plus foo.> which contains it
    assert p.secure and p.maxbytes == 10
    assert t.resolve("bar.*") is None
    assert props(t, "foo.a.*").maxbytes == 10  # contained by foo.> only
    assert not props(t, "foo.a.*").secure


def test_static_queries() -> None:
    t = table("queue", "> secure\na\nb.*\nc")
    assert t.static_names() == ["a", "c"]
    assert [e.name for e in t.entries()] == [">", "a", "b.*", "c"]
    assert t.is_static("a") and not t.is_static("b.*") and not t.is_static("zz")
    assert len(t) == 4


# -- run-time changes -------------------------------------------------------------------


def test_add_and_remove_invalidate_the_cache() -> None:
    t = table("queue", "> maxbytes=100")
    assert props(t, "a.b").maxbytes == 100
    t.add("a.*", "maxbytes=10")
    assert props(t, "a.b").maxbytes == 10
    assert t.remove("a.*") is True
    assert props(t, "a.b").maxbytes == 100
    t.remove(">")
    assert t.resolve("a.b") is None
    assert t.remove(">") is False


def test_add_rejects_duplicates_unless_replacing() -> None:
    t = table("queue", "q maxmsgs=1")
    with pytest.raises(ConfigErrors, match="already defined"):
        t.add("q", "maxmsgs=2")
    t.add("q", "maxmsgs=3", replace=True)
    assert props(t, "q").maxmsgs == 3


def test_add_reports_every_problem() -> None:
    t = DestinationTable("topic")
    with pytest.raises(ConfigErrors) as ei:
        t.add("t", "exclusive, maxbytes=x")
    assert len(ei.value.errors) == 2
    assert all(e.file == "<admin>" and e.line is None for e in ei.value.errors)
    assert t.resolve("t") is None


def test_add_checks_disjoint_and_transports() -> None:
    t = table("topic", "a.> channel=m1")
    with pytest.raises(ConfigErrors, match="conflicts"):
        t.add("a.b", "channel=m2")
    t.transport_names = frozenset({"up"})
    t.add("x", 'import="up"')
    with pytest.raises(ConfigErrors, match="'down' in the export list is not defined"):
        t.add("y", 'export="down"')


def test_add_with_jndi_names() -> None:
    t = DestinationTable("queue")
    e = t.add("q", "secure", jndi_names=["jq"])
    assert e.jndi_names == ("jq",) and props(t, "q").secure


def test_resolve_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dmod, "MAX_CACHED_NAMES", 10)
    t = table("topic", ">")
    for i in range(25):
        assert t.resolve(f"n{i}") is not None
    assert len(t._cache) <= 10


def test_kind_is_checked() -> None:
    with pytest.raises(ValueError):
        DestinationTable("exchange")  # type: ignore[arg-type]


def test_parse_entry_returns_none_on_error() -> None:
    errors: list[ConfigError] = []
    assert parse_entry(SourceLine("f", 1, "q bogus"), "queue", errors) is None
    assert len(errors) == 1


# -- through the loader: files, lines, cross-file rules ------------------------------------


def test_loader_reports_destination_errors_with_file_and_line(tmp_path: Path) -> None:
    write(tmp_path, topics="# topics\n>\n\nfoo exclusive\n", queues="a\nb maxmsgs=x\n")
    with pytest.raises(ConfigErrors) as ei:
        load_config(tmp_path)
    got = [(os.path.basename(e.file), e.line) for e in ei.value.errors]
    assert got == [("topics.conf", 4), ("queues.conf", 2)]


def test_unknown_transport_in_import_list_is_an_error(tmp_path: Path) -> None:
    write(
        tmp_path,
        topics='>\nt import="up", export="up,nowhere"\n',
        queues='q import="gone"\n',
        transports="[up]\ntype = rv\n",
    )
    with pytest.raises(ConfigErrors) as ei:
        load_config(tmp_path)
    got = [(os.path.basename(e.file), e.line, e.detail) for e in ei.value.errors]
    assert got == [
        ("topics.conf", 2, "transport 'nowhere' in the export list is not defined in transports.conf"),
        ("queues.conf", 1, "transport 'gone' in the import list is not defined in transports.conf"),
    ]  # fmt: skip


def test_t6_topic_and_queue_of_one_name_may_not_both_import(tmp_path: Path) -> None:
    """EMS User's Guide, chapter "Working With TIBCO Rendezvous", "Import Issues"."""
    write(
        tmp_path,
        topics='foo.bar import="rv"\nother import="rv"\n',
        queues='x\nfoo.bar import="rv"\nother\n',
        transports="[rv]\ntype = rv\n",
        gateway="rv_transports = enabled\n",
    )
    with pytest.raises(ConfigErrors) as ei:
        load_config(tmp_path)
    [err] = ei.value.errors
    assert (os.path.basename(err.file), err.line) == ("queues.conf", 2)
    assert "topics.conf:1" in err.detail and "both import" in err.detail


def test_transport_names_are_checked_on_later_adds(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, topics=">", queues=">", transports="[up]\ntype=rv\n"))
    cfg.topics.add("a", 'import="up"')
    with pytest.raises(ConfigErrors):
        cfg.queues.add("b", 'import="down"')


def test_jndi_names_are_unique_across_topics_and_queues(tmp_path: Path) -> None:
    write(tmp_path, topics="[j1]t\n", queues="[j2]q1\n[j1]q2\n")
    with pytest.raises(ConfigErrors) as ei:
        load_config(tmp_path)
    [err] = ei.value.errors
    assert (os.path.basename(err.file), err.line) == ("queues.conf", 2)
    assert "'j1' is already used by topic 't'" in err.detail
