"""The same job on a real multi-process Spark: ``gateway reconcile --master
local-cluster[2,1,1024]`` (a master and two workers in the driver's JVM, each worker running
its executor in a JVM of its own, all on 127.0.0.1) writes the verdicts a local run of the
same logs gives. Shuffles, caching and the output then cross processes, as on a cluster."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from chispa import assert_df_equality
from dlogrecords import rec, write_log
from pyspark.sql import SparkSession
from test_spark_cli import LOOPBACK, run_cli

from spark.job import reconcile

# Three JVMs start and every one of the job's stages crosses them: a minute on a quiet
# machine, ten or more on a loaded one; a bound against a hang, never a result.
RUN_TIMEOUT_S = 1500
pytestmark = [pytest.mark.spark, pytest.mark.timeout(RUN_TIMEOUT_S + 300)]

CLUSTER = ["--master", "local-cluster[2,1,1024]", *LOOPBACK,
           "--conf", "spark.sql.shuffle.partitions=2",
           "--conf", "spark.executor.memory=512m",
           "--conf", f"spark.pyspark.python={sys.executable}"]


def write_logs(root: Path) -> list[str]:
    """Two gateways, two files each: 60 messages published at gw-a and exported to gw-b,
    where they are delivered; every 7th is never exported (lost), every 11th delivered twice,
    every 13th changed on the way out, two dropped, the last ones still pending."""
    a_recs: list[list[dict[str, object]]] = [[], []]
    b_recs: list[list[dict[str, object]]] = [[], []]
    for i in range(60):
        t = f"t{i}"
        ts = 1000.0 + 1000.0 * i
        half = i % 2
        a_recs[half].append(rec(ts, "gw-a", "publish", t, client=f"p{i % 3}",
                                body_hash="b", props_hash="p"))
        if i in (20, 40):
            a_recs[half].append(rec(ts + 1, "gw-a", "drop", t, client="slow",
                                    reason="max_queued", body_hash="b", props_hash="p"))
            continue
        if i % 7 == 3:
            continue
        a_recs[half].append(rec(ts + 2, "gw-a", "export", t, client="to-b",
                                body_hash="b", props_hash="p"))
        b_recs[half].append(rec(ts + 5, "gw-b", "import", t, client="from-a",
                                body_hash="b", props_hash="p"))
        body = "b2" if i % 13 == 5 else "b"
        b_recs[half].append(rec(ts + 6 + (i % 4), "gw-b", "deliver", t, client=f"c{i % 2}",
                                count=1, body_hash=body, props_hash="p"))
        if i % 11 == 4:
            b_recs[half].append(rec(ts + 8 + (i % 4), "gw-b", "redeliver", t,
                                    client=f"c{i % 2}", count=2, body_hash=body,
                                    props_hash="p"))
    paths = []
    for gw, parts in (("gw-a", a_recs), ("gw-b", b_recs)):
        d = root / gw
        for n, part in enumerate(parts):
            write_log(d / f"dlog-{gw}-20260514T0930{n:02d}-0001.jsonl", part)
        paths.append(str(d))
    return paths


def test_a_two_worker_cluster_writes_the_verdicts_of_a_local_run(
        spark: SparkSession, tmp_path: Path):
    logs = write_logs(tmp_path / "logs")
    options = ["--grace-ms", "3000", "--skew-ms", "500"]

    rc, stdout, stderr = run_cli([*logs, "--out", str(tmp_path / "cluster"), *options,
                                  *CLUSTER], timeout_s=RUN_TIMEOUT_S)

    assert rc == 0, stderr
    assert "Spark: " not in stderr  # stderr is no terminal here: no bar
    local = reconcile(spark, logs, out=str(tmp_path / "local"), grace_ms=3000.0,
                      skew_ms=500.0)
    try:
        written = spark.read.parquet(str(tmp_path / "cluster" / "verdicts"))
        assert_df_equality(written, local.verdicts, ignore_row_order=True,
                           ignore_nullable=True)
        counts = dict(line.split("\t") for line in stdout.splitlines())
        assert {"delivered", "lost", "duplicated", "changed", "dropped",
                "pending"} <= set(counts), counts
    finally:
        local.unpersist()
