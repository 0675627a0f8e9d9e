"""Follow mode: log files dropped (and grown) step by step, the stream driven with
``processAllAvailable`` after each step; verdicts appear once the watermark has passed them,
and only once, across batches and across a restart from the checkpoint."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dlogrecords import rec
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from spark.follow import BatchStopped, _Reconcile, follow, tail
from spark.job import main
from spark.verdicts import VERDICT_COLUMNS

# Every micro-batch runs the whole batch plan (routes, verdicts) and writes Parquet, and a
# test runs several: more than the suite's default per-test time on a busy machine.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

GRACE = 1000.0


class Logs:
    """A log directory, a follow query on it, and the steps of a test."""

    def __init__(self, spark: SparkSession, tmp_path: Path) -> None:
        self.spark = spark
        self.dir = tmp_path / "logs"
        self.dir.mkdir()
        self.out = tmp_path / "out"
        self.query: StreamingQuery | None = None

    def start(self, **kw: Any) -> StreamingQuery:
        kw.setdefault("tail_in_thread", False)
        kw.setdefault("link_window_ms", 0.0)  # no test here needs the fallback key
        self.query = follow(self.spark, [str(self.dir)], str(self.out), GRACE,
                            trigger_ms=50, **kw)
        return self.query

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()
            self.query = None

    def drop(self, name: str, records: list[dict[str, Any]], tail: str = "") -> Path:
        """A whole file at once, as a rotated file appears (written aside, renamed)."""
        path = self.dir / name
        hidden = self.dir / f".{name}.tmp"
        hidden.write_text(_lines(records) + tail)
        hidden.rename(path)
        return path

    def step(self) -> list[tuple[Any, ...]]:
        """Tail, process everything, and return every verdict written so far."""
        tail([str(self.dir)], str(self.out))
        assert self.query is not None
        self.query.processAllAvailable()
        return self.given()

    def given(self) -> list[tuple[Any, ...]]:
        if not list((self.out / "verdicts").glob("part-*.parquet")):
            return []  # no batch had a final message yet
        rows = self.spark.read.parquet(str(self.out / "verdicts")).collect()
        return sorted(((r["verdict"], r["trace_id"], r["gw"], r["exit_client"], r["late"])
                       for r in rows), key=repr)


def _lines(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)


@pytest.fixture
def logs(spark: SparkSession, tmp_path: Path) -> Iterator[Logs]:
    logs = Logs(spark, tmp_path)
    yield logs
    logs.stop()


def test_verdicts_appear_once_the_watermark_has_passed_them(logs: Logs):
    logs.start()
    logs.drop("dlog-gw-a-20260514T093012-0001.jsonl", [
        rec(1000.0, "gw-a", "publish", "t1", client="p"),
        rec(1010.0, "gw-a", "deliver", "t1", client="c", count=1),
        rec(1500.0, "gw-a", "publish", "t2", client="p"),
    ])
    assert logs.step() == []  # watermark 500: nothing is final

    logs.drop("dlog-gw-a-20260514T093013-0002.jsonl", [
        rec(2020.0, "gw-a", "publish", "t3", client="p"),
    ])
    # Watermark 1020: t1's last record (1010) is behind it; t2 (1500) is not.
    assert logs.step() == [("delivered", "t1", "gw-a", "c", False)]

    logs.drop("dlog-gw-a-20260514T093014-0003.jsonl", [
        rec(2600.0, "gw-a", "publish", "t4", client="p"),
    ])
    assert logs.step() == [("delivered", "t1", "gw-a", "c", False),
                           ("lost", "t2", "gw-a", None, None)]
    lost = logs.spark.read.parquet(str(logs.out / "verdicts")).where("verdict = 'lost'")
    assert lost.columns == VERDICT_COLUMNS
    assert lost.first()["watermark"] == 1600.0


def test_a_message_leaving_late_before_it_is_final_is_delivered_late_not_lost(logs: Logs):
    logs.start()
    logs.drop("dlog-gw-a-20260514T093012-0001.jsonl", [
        rec(1000.0, "gw-a", "publish", "t", client="p"),
    ])
    assert logs.step() == []
    logs.drop("dlog-gw-a-20260514T093013-0002.jsonl", [
        rec(2100.0, "gw-a", "publish", "u", client="p"),
        rec(2500.0, "gw-a", "deliver", "t", client="c", count=1),  # 1500 ms after entry
    ])
    # Watermark 1500 is past t's entry, but t has a record after it: not final yet.
    assert logs.step() == []
    logs.drop("dlog-gw-a-20260514T093014-0003.jsonl", [
        rec(3600.0, "gw-a", "publish", "v", client="p"),
    ])
    assert logs.step() == [("delivered", "t", "gw-a", "c", True),
                           ("lost", "u", "gw-a", None, None)]

    # u's lost is final: a copy of it delivered afterwards gives no further verdict.
    logs.drop("dlog-gw-a-20260514T093015-0004.jsonl", [
        rec(3700.0, "gw-a", "deliver", "u", client="c", count=1),
        rec(5000.0, "gw-a", "publish", "w", client="p"),
    ])
    assert logs.step() == [("delivered", "t", "gw-a", "c", True),
                           ("lost", "u", "gw-a", None, None),
                           ("lost", "v", "gw-a", None, None)]


def test_a_copy_in_a_later_batch_is_a_duplicate(logs: Logs):
    logs.start()
    logs.drop("dlog-gw-a-20260514T093012-0001.jsonl", [
        rec(1000.0, "gw-a", "publish", "t", client="p"),
        rec(1010.0, "gw-a", "deliver", "t", client="c", count=1),
    ])
    assert logs.step() == []
    logs.drop("dlog-gw-a-20260514T093013-0002.jsonl", [
        rec(1900.0, "gw-a", "redeliver", "t", client="c", count=2),
    ])
    assert logs.step() == []  # watermark 900
    logs.drop("dlog-gw-a-20260514T093014-0003.jsonl", [
        rec(3000.0, "gw-a", "publish", "x", client="p"),
    ])
    assert logs.step() == [("delivered", "t", "gw-a", "c", False),
                           ("duplicated", "t", "gw-a", "c", None)]
    dup = logs.spark.read.parquet(str(logs.out / "verdicts")).where("verdict = 'duplicated'")
    assert (dup.first()["copies"], dup.first()["flagged"]) == (2, True)


def test_lines_appended_to_a_file_are_read_once_complete(logs: Logs):
    logs.start()
    path = logs.drop("dlog-gw-a-20260514T093012-0001.jsonl",
                     [rec(1000.0, "gw-a", "publish", "t", client="p")])
    deliver = _lines([rec(1010.0, "gw-a", "deliver", "t", client="c", count=1)])
    with open(path, "a") as f:  # the writer is half-way through a line
        f.write(deliver[:40])
    assert logs.step() == []
    with open(path, "a") as f:
        f.write(deliver[40:] + _lines([rec(2100.0, "gw-a", "publish", "u", client="p")]))
    assert logs.step() == [("delivered", "t", "gw-a", "c", False)]


def test_lost_in_transit_after_the_message_that_showed_the_route_is_done(logs: Logs):
    logs.start()
    logs.drop("dlog-gw-a-20260514T093012-0001.jsonl", [
        rec(1000.0, "gw-a", "publish", "m1", client="p"),
        rec(1001.0, "gw-a", "export", "m1", client="to-b"),
        rec(1005.0, "gw-b", "import", "m1", client="from-a"),
        rec(1006.0, "gw-b", "deliver", "m1", client="c", count=1),
        rec(2100.0, "gw-a", "publish", "f1", client="q"),
    ])
    assert logs.step() == [("delivered", "m1", "gw-a", "to-b", False),
                           ("delivered", "m1", "gw-b", "c", False)]
    # m1 has left the state; the next message through to-b never reaches gw-b.
    logs.drop("dlog-gw-a-20260514T093013-0002.jsonl", [
        rec(3000.0, "gw-a", "publish", "m2", client="p"),
        rec(3001.0, "gw-a", "export", "m2", client="to-b"),
        rec(4100.0, "gw-a", "publish", "f2", client="q"),
    ])
    assert [v for v in logs.step() if v[1] == "m2"] == [
        ("delivered", "m2", "gw-a", "to-b", False),
        ("lost_in_transit", "m2", "gw-a", "to-b", None)]


def test_a_restart_from_the_checkpoint_gives_nothing_twice(logs: Logs):
    logs.start()
    logs.drop("dlog-gw-a-20260514T093012-0001.jsonl", [
        rec(1000.0, "gw-a", "publish", "t1", client="p"),
        rec(1010.0, "gw-a", "deliver", "t1", client="c", count=1),
        rec(1500.0, "gw-a", "publish", "t2", client="p"),
    ])
    logs.step()
    logs.drop("dlog-gw-a-20260514T093013-0002.jsonl", [
        rec(2020.0, "gw-a", "publish", "t3", client="p"),
    ])
    first = logs.step()
    assert first == [("delivered", "t1", "gw-a", "c", False)]
    logs.stop()
    # As if the process had died after the batch's verdicts were written but before Spark
    # recorded the batch as committed: Spark runs the last batch again on restart.
    commits = logs.out / "_checkpoint" / "stream" / "commits"
    last = max((p for p in commits.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    last.unlink()
    (commits / f".{last.name}.crc").unlink()

    logs.start()
    assert logs.step() == first  # the replayed batch gave nothing again
    logs.drop("dlog-gw-a-20260514T093014-0003.jsonl", [
        rec(2600.0, "gw-a", "publish", "t4", client="p"),
    ])
    # t2 kept in the state across the restart; nothing re-read from the first two files.
    assert logs.step() == [("delivered", "t1", "gw-a", "c", False),
                           ("lost", "t2", "gw-a", None, None)]


def test_the_follow_thread_tails_the_logs_every_trigger(logs: Logs):
    query = logs.start(tail_in_thread=True)
    logs.drop("dlog-gw-a-20260514T093012-0001.jsonl", [
        rec(1000.0, "gw-a", "publish", "t", client="p"),
        rec(1010.0, "gw-a", "deliver", "t", client="c", count=1),
        rec(2100.0, "gw-a", "publish", "u", client="p"),
    ])
    deadline = time.monotonic() + 60.0
    while not logs.given():
        assert time.monotonic() < deadline, "the thread never tailed the new file"
        query.processAllAvailable()
    assert logs.given() == [("delivered", "t", "gw-a", "c", False)]


def test_the_job_follows_in_parquet_only(capsys: pytest.CaptureFixture[str], tmp_path: Path):
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--out", str(tmp_path / "out"), "--follow", "--format", "json"])
    assert "--follow writes Parquet only" in capsys.readouterr().err


# Spark's test of a batch function's error for the stop's interruption
# (StreamExecution.isInterruptionException), as a Python regular expression.
SPARK_INTERRUPTED = re.compile(
    r"py4j.protocol.Py4JJavaError: An error occurred while calling((.|\r\n|\r|\n)*)"
    r"(java.lang.InterruptedException|java.io.InterruptedIOException|"
    r"java.nio.channels.ClosedByInterruptException)")


def test_a_batch_cut_short_by_stopping_fails_with_a_short_interruption(tmp_path: Path,
                                                                       monkeypatch):
    # Stopping the query cancels the batch's jobs; the error they raise (a Java stack trace
    # tens of kilobytes long) must reach Spark short, and read as the stop's interruption.
    reconcile = _Reconcile(tmp_path / "out", tmp_path / "state", 1000.0, 0.0, False, 0.0)
    trace = "\n\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages" * 2000

    def cancelled(batch: Any, batch_id: int) -> None:
        raise RuntimeError("An error occurred while calling o97.parquet.\n: "
                           "org.apache.spark.SparkException: Job 12 cancelled" + trace)

    monkeypatch.setattr(reconcile, "_batch", cancelled)
    with pytest.raises(RuntimeError, match="Job 12 cancelled"):
        reconcile(None, 7)  # not stopping: the error as it is (the query fails)

    reconcile.stopping.set()
    with pytest.raises(BatchStopped) as stopped:
        reconcile(None, 7)
    text = str(stopped.value)
    assert len(text) < 400 and "o97.parquet" in text
    assert SPARK_INTERRUPTED.search(text)
    assert stopped.value.__suppress_context__  # the long error is not printed with it
