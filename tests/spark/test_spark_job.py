"""The job end to end on log files: read, filter by time, give verdicts, write them, the
summary, the pending records and the report, count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dlogrecords import rec, write_log
from pyspark.sql import SparkSession

from spark.job import main, parse_time
from spark.schema import DLOG_SCHEMA
from spark.summary import SUMMARY_COLUMNS

pytestmark = pytest.mark.spark


def test_job_writes_the_verdicts_of_two_gateways_within_since_until(
        spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    write_log(tmp_path / "logs" / "a" / "dlog-gw-a-20260514T093012-0001.jsonl", [
        rec(500.0, "gw-a", "publish", "before", client="p"),  # before --since: not read
        rec(1000.0, "gw-a", "publish", "t1", client="p"),
        rec(1001.0, "gw-a", "export", "t1", client="to-b"),
        rec(1100.0, "gw-a", "publish", "t2", client="p"),
    ])
    write_log(tmp_path / "logs" / "b" / "dlog-gw-b-20260514T093012-0001.jsonl", [
        rec(1005.0, "gw-b", "import", "t1", client="from-a"),
        rec(1006.0, "gw-b", "deliver", "t1", client="c", count=1),
        rec(1007.0, "gw-b", "redeliver", "t1", client="c", count=2),
        rec(5000.0, "gw-b", "publish", "t3", client="p"),
        rec(9000.0, "gw-b", "publish", "after", client="p"),  # at --until: not read
    ])
    out = tmp_path / "out"

    rc = main([str(tmp_path / "logs" / "a"), str(tmp_path / "logs" / "b"),
               "--out", str(out), "--grace-ms", "1000", "--since", "1000",
               "--until", "9000", "--skew-ms", "500", "--format", "json"])

    assert rc == 0
    rows = [json.loads(line) for part in sorted((out / "verdicts").glob("part-*.json"))
            for line in part.read_text().splitlines()]
    got = sorted((r["verdict"], r["trace_id"], r["gw"], r.get("exit_client")) for r in rows)
    assert got == [
        ("delivered", "t1", "gw-a", "to-b"),
        ("delivered", "t1", "gw-b", "c"),
        ("duplicated", "t1", "gw-b", "c"),
        ("lost", "t2", "gw-a", None),
        ("pending", "t3", "gw-b", None),
    ]
    assert capsys.readouterr().out == "delivered\t2\nduplicated\t1\nlost\t1\npending\t1\n"
    summary = spark.read.parquet(str(out / "summary"))
    assert summary.columns == SUMMARY_COLUMNS
    got_summary = [(r["gw"], r["exit"], r["messages"], r["delivered"], r["lost"],
                    r["pending"]) for r in summary.collect()]
    assert sorted(got_summary, key=str) == sorted([
        ("gw-a", None, 2, 0, 1, 0), ("gw-a", "export", 1, 1, 0, 0),
        ("gw-b", None, 2, 0, 0, 1), ("gw-b", "deliver", 1, 1, 0, 0)], key=str)
    pending = spark.read.parquet(str(out / "pending"))
    assert pending.schema.fieldNames() == DLOG_SCHEMA.fieldNames()
    assert [(r["ts"], r["trace_id"]) for r in pending.collect()] == [(5000.0, "t3")]
    page = (out / "report.html").read_text()
    assert "<svg" in page and "t2" in page  # the plots, and the lost message among the worst


def test_parse_time_takes_epoch_ms_or_iso_8601():
    assert parse_time("1795324332362.5") == 1795324332362.5
    assert parse_time("2026-05-14T09:30:12Z") == 1778751012000.0
    assert parse_time("2026-05-14T09:30:12") == 1778751012000.0  # UTC when no offset
    assert parse_time("2026-05-14T11:30:12+02:00") == 1778751012000.0
