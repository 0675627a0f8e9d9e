"""The HTML report of a run, on small hand-made logs: the worst messages and their history,
the latency histograms binned in Spark, every string from the logs escaped, nothing fetched,
and the page as headless Chromium (Debian's ``chromium``, driven by Playwright) renders it:
every plot drawn, no console error, no request but the file's."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from dlogrecords import rec, write_log
from pyspark.sql import DataFrame, SparkSession
from report_demo import summary_of

from spark.read import read_dlog
from spark.report import (
    entries_per_destination,
    gateway_hops,
    latency_histograms,
    worst_messages,
    write_report,
)
from spark.routes import routes
from spark.summary import route_hour_summary
from spark.verdicts import verdicts

# The module's fixture runs the whole job once (read, verdicts, summary, report), which is
# many Spark jobs on a local session: more than the default per-test timeout on a busy host.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

GRACE = 1000.0
# A destination name no page should run or a plot read as mathematics.
EVIL = "topic:<script>alert('$x$')</script>"


@dataclass
class Run:
    records: DataFrame
    verdicts: DataFrame
    summary: DataFrame
    html: Path


@pytest.fixture(scope="module")
def run(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Run:
    root = tmp_path_factory.mktemp("report")
    write_log(root / "logs" / "a" / "dlog-gw-a-20260514T093012-0001.jsonl", [
        rec(1000.0, "gw-a", "publish", "t1", client="p"),
        rec(1003.0, "gw-a", "deliver", "t1", client="c1", count=1),
        rec(1004.0, "gw-a", "export", "t1", client="to-b"),
        rec(1100.0, "gw-a", "publish", "t2-lost", dest=EVIL, client="p"),  # never leaves
        rec(1200.0, "gw-a", "publish", "t3", client="p"),
        rec(1205.0, "gw-a", "export", "t3", client="to-b"),  # never imported at gw-b
        rec(5000.0, "gw-a", "publish", "t4", client="p"),
        rec(5050.0, "gw-a", "deliver", "t4", client="c1", count=1),
        rec(9000.0, "gw-a", "publish", "t5", client="p"),
        rec(9001.0, "gw-a", "deliver", "t5", client="c1", count=1),
    ])
    write_log(root / "logs" / "b" / "dlog-gw-b-20260514T093012-0001.jsonl", [
        rec(1010.0, "gw-b", "import", "t1", client="from-a"),
        rec(1020.0, "gw-b", "deliver", "t1", client="c2", count=1),
        rec(1021.0, "gw-b", "deliver", "t1", client="c2", count=1),  # a second copy
    ])
    records = read_dlog(spark, [str(root / "logs")]).cache()
    # One partition: the verdicts' union has one per part, each a task in every aggregate.
    rows = verdicts(records, GRACE, 0.0, False, routes(records)).coalesce(1).cache()
    summary = summary_of(rows).cache()
    html = root / "report.html"
    write_report(html, rows, summary, records, title="Run <1>", worst=10)
    return Run(records, rows, summary, html)


def test_worst_messages_come_by_verdict_then_latency_with_their_history(run: Run):
    got = worst_messages(run.verdicts, run.records, 10)

    assert [(m.trace_id, m.severity, m.latency_ms) for m in got] == [
        ("t2-lost", "lost", None),
        ("t3", "lost_in_transit", 5.0),
        ("t1", "duplicated", 10.0),  # gw-b: import 1010, first copy 1020
        ("t4", None, 50.0),
        ("t5", None, 1.0),
    ]
    t1 = got[2]
    # Every record of the trace id, in time order across the two gateways.
    assert [(h["ts"], h["gw"], h["event"]) for h in t1.history] == [
        (1000.0, "gw-a", "publish"), (1003.0, "gw-a", "deliver"), (1004.0, "gw-a", "export"),
        (1010.0, "gw-b", "import"), (1020.0, "gw-b", "deliver"), (1021.0, "gw-b", "deliver"),
    ]
    assert sorted((v["verdict"], v["gw"], v["exit_client"]) for v in t1.verdicts) == [
        ("delivered", "gw-a", "c1"), ("delivered", "gw-a", "to-b"),
        ("delivered", "gw-b", "c2"), ("duplicated", "gw-b", "c2"),
    ]
    assert (t1.more_history, t1.more_verdicts) == (0, 0)
    assert [m.trace_id for m in worst_messages(run.verdicts, run.records, 2)] == [
        "t2-lost", "t3"]


def test_latency_histograms_bin_every_delivered_row_of_each_route(run: Run):
    got = {h.route: h for h in latency_histograms(run.verdicts, bins=8)}

    assert {route: sum(h.counts) for route, h in got.items()} == {
        ("gw-a", "topic:t", "deliver", None): 3,  # t1 3 ms, t4 50 ms, t5 1 ms
        ("gw-a", "topic:t", "export", "to-b"): 2,  # t1 4 ms, t3 5 ms
        ("gw-b", "topic:t", "deliver", None): 1,  # t1 10 ms (the first copy)
    }
    local = got[("gw-a", "topic:t", "deliver", None)]
    assert len(local.counts) == 8 and local.edges[0] == 0.0
    assert local.edges[-1] == pytest.approx(50.0)
    assert local.counts[-1] == 1  # the highest latency is in the last bin
    # Each latency is in the bin whose edges hold it.
    for ms in (1.0, 3.0, 50.0):
        i = max(i for i, e in enumerate(local.edges[:-1]) if e <= ms)
        assert local.counts[i] >= 1
    assert list(latency_histograms(run.verdicts, bins=8, max_routes=1)[0].route) == [
        "gw-a", "topic:t", "deliver", None]


def test_route_diagram_counts_entries_and_gateway_to_gateway_hops(run: Run):
    summary = route_hour_summary(run.verdicts, routes(run.records))
    assert entries_per_destination(summary) == {
        ("gw-a", "topic:t"): 4, ("gw-a", EVIL): 1, ("gw-b", "topic:t"): 1}
    # t1 exported through to-b and imported at gw-b; t3 exported, never imported.
    assert gateway_hops(routes(run.records)) == [
        {"gw": "gw-a", "dest": "topic:t", "via": "to-b", "to_gw": "gw-b", "imported": 1}]


def test_strings_from_the_logs_are_escaped_and_nothing_is_fetched(run: Run):
    page = run.html.read_text(encoding="utf-8")

    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(&#x27;$x$&#x27;)&lt;/script&gt;" in page
    assert "<title>Run &lt;1&gt;</title>" in page
    # The only references are to the page's own elements (the SVG glyphs and clip paths).
    refs = re.findall(r"""(?:href|src)\s*=\s*["']([^"']*)""", page)
    assert refs and all(ref.startswith("#") for ref in refs)
    assert not re.search(r"url\((?!#)|@import|<link|<iframe|<object|<embed", page)


def test_report_renders_offline_in_headless_chromium(run: Run):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (bash tests/peers/install.sh)")
    from playwright.sync_api import sync_playwright

    url = run.html.resolve().as_uri()
    requests: list[str] = []
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium)
        try:
            page = browser.new_page()
            page.on("request", lambda r: requests.append(r.url))
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(url, wait_until="load")
            plots = page.query_selector_all("figure.plot")
            kinds = [f.get_attribute("data-plot") for f in plots]
            boxes: list[Any] = [f.query_selector("svg").bounding_box()  # type: ignore[union-attr]
                                for f in plots]
            drawn = [len(f.query_selector_all("svg path")) for f in plots]
            worst = page.eval_on_selector_all("table.worst td.trace",
                                              "cells => cells.map(c => c.textContent)")
            title = page.title()
        finally:
            browser.close()

    # The route diagram, the hours, and one histogram per route with a delivered row.
    assert sorted(kinds) == ["hours", "latency", "latency", "latency", "routes"]
    assert all(b is not None and b["width"] > 0 and b["height"] > 0 for b in boxes), boxes
    assert all(n > 10 for n in drawn), drawn  # axes, ticks, glyphs: a drawn plot
    assert worst == ["t2-lost", "t3", "t1", "t4", "t5"]
    assert title == "Run <1>"
    assert problems == []
    assert requests == [url]
