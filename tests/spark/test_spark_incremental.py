"""Incremental runs: records carried from one run to the next, a message pending on day 1 and
delivered (late) on day 2, reported once; one pending and still without an exit, lost; two
runs over overlapping windows, counted once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from dlogrecords import frame, rec, write_log
from pyspark.sql import SparkSession

from spark.incremental import carry_in
from spark.job import main

pytestmark = pytest.mark.spark

GRACE = "1000"


def test_carry_in_reads_a_line_read_twice_once_and_keeps_a_real_duplicate(
        spark: SparkSession):
    publish = rec(1000.0, "gw-a", "publish", "t1", client="p")
    twice = rec(1002.0, "gw-a", "deliver", "t1", client="c", count=1)
    other = rec(1003.0, "gw-a", "publish", "t2", client="p")
    dup = rec(1004.0, "gw-a", "publish", "t2", client="p")  # equal to ``other``, read once
    previous = frame(spark, [publish, twice, twice])
    now = frame(spark, [publish, twice, other, dup])

    got = carry_in(now, previous)

    assert_df_equality(got, frame(spark, [publish, twice, twice, other, dup]),
                       ignore_row_order=True, ignore_nullable=True)


DAY1 = {
    "a": [
        # d crossed to gw-b on day 1: the logs say transport to-b leads there.
        rec(1000.0, "gw-a", "publish", "d", client="p"),
        rec(1001.0, "gw-a", "export", "d", client="to-b"),
        # f was delivered well within day 1.
        rec(3400.0, "gw-a", "publish", "f", client="p"),
        rec(3500.0, "gw-a", "deliver", "f", client="w", count=1),
        # a, b: entered within the grace period of day 1's end; c: exported then too.
        rec(4500.0, "gw-a", "publish", "a", client="p"),
        rec(4600.0, "gw-a", "publish", "b", client="p"),
        rec(4700.0, "gw-a", "publish", "c", client="p"),
        rec(4701.0, "gw-a", "export", "c", client="to-b"),
    ],
    "b": [
        rec(1005.0, "gw-b", "import", "d", client="from-a"),
        rec(1006.0, "gw-b", "deliver", "d", client="u", count=1),
        rec(5000.0, "gw-b", "ack", "d", client="u", count=1),
    ],
}
DAY2 = {
    "a": [
        rec(6000.0, "gw-a", "deliver", "a", client="x", count=1),  # 1500 ms: late
        rec(8000.0, "gw-a", "publish", "e", client="p"),
        rec(8001.0, "gw-a", "deliver", "e", client="z", count=1),
        rec(9000.0, "gw-a", "ack", "e", client="z", count=1),
    ],
    "b": [
        rec(6100.0, "gw-b", "import", "c", client="from-a"),
        rec(6101.0, "gw-b", "deliver", "c", client="y", count=1),
    ],
}
DAY1_VERDICTS = [
    ("delivered", "d", "gw-a", "to-b", False), ("delivered", "d", "gw-b", "u", False),
    ("delivered", "f", "gw-a", "w", False),
    ("pending", "a", "gw-a", None, None), ("pending", "b", "gw-a", None, None),
    ("delivered", "c", "gw-a", "to-b", False), ("pending", "c", "gw-a", "to-b", None),
]
# a left late and is delivered, b never did and is lost, c arrived at gw-b; c's export and
# f, judged on day 1, are not given again.
DAY2_VERDICTS = [
    ("delivered", "a", "gw-a", "x", True), ("lost", "b", "gw-a", None, None),
    ("delivered", "c", "gw-b", "y", False), ("delivered", "e", "gw-a", "z", False),
]


def _verdicts(spark: SparkSession, out: Path) -> list[tuple[Any, ...]]:
    rows = spark.read.parquet(str(out / "verdicts")).collect()
    return sorted(((r["verdict"], r["trace_id"], r["gw"], r["exit_client"], r["late"])
                   for r in rows), key=str)


def _logs(base: Path, days: list[dict[str, list[dict[str, Any]]]]) -> list[str]:
    for gw in ("a", "b"):
        write_log(base / gw / f"dlog-gw-{gw}-20260514T000000-0001.jsonl",
                  [r for day in days for r in day[gw]])
    return [str(base / "a"), str(base / "b")]


def test_pending_on_day_1_is_delivered_late_or_lost_on_day_2_and_reported_once(
        spark: SparkSession, tmp_path: Path):
    day1, day2 = tmp_path / "out1", tmp_path / "out2"
    assert main([*_logs(tmp_path / "logs1", [DAY1]), "--out", str(day1),
                 "--grace-ms", GRACE]) == 0
    assert _verdicts(spark, day1) == sorted(DAY1_VERDICTS, key=str)
    carried = spark.read.parquet(str(day1 / "pending")).collect()
    assert sorted((r["trace_id"], r["event"]) for r in carried) == [
        ("a", "publish"), ("b", "publish"), ("c", "export"), ("c", "publish")]

    assert main([*_logs(tmp_path / "logs2", [DAY2]), "--out", str(day2),
                 "--grace-ms", GRACE, "--previous", str(day1)]) == 0

    assert _verdicts(spark, day2) == sorted(DAY2_VERDICTS, key=str)
    assert spark.read.parquet(str(day2 / "pending")).count() == 0
    summary = spark.read.parquet(str(day2 / "summary")).where("gw = 'gw-a'").collect()
    assert sorted(((r["exit"], r["messages"], r["delivered"], r["late"], r["lost"])
                   for r in summary), key=str) == sorted([
        ("deliver", 2, 2, 1, 0),  # a and e
        (None, 3, 0, 0, 1),  # a, b, e entered gw-a (c's rows there are not given again)
    ], key=str)


def test_overlapping_windows_count_each_message_once(spark: SparkSession, tmp_path: Path):
    # One set of files holding both days; day 1 reads up to 5100, day 2 from 3000 on: the
    # records of f, a, b and c are read by both runs (a, b and c are carried as well).
    logs = _logs(tmp_path / "logs", [DAY1, DAY2])
    day1, day2 = tmp_path / "out1", tmp_path / "out2"
    assert main([*logs, "--out", str(day1), "--grace-ms", GRACE, "--until", "5100"]) == 0
    assert _verdicts(spark, day1) == sorted(DAY1_VERDICTS, key=str)

    assert main([*logs, "--out", str(day2), "--grace-ms", GRACE, "--since", "3000",
                 "--previous", str(day1)]) == 0

    # No duplicated export of c (its export is one line read twice), f not again.
    assert _verdicts(spark, day2) == sorted(DAY2_VERDICTS, key=str)
