"""The summary table on small hand-made logs: counts and rates per route and hour, the
entry's row (what left by no way out), percentiles on a known latency set, a route that
delivered nothing (null latencies), and the totals over all hours (percentiles taken again,
not averaged)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from chispa import assert_df_equality
from dlogrecords import frame, rec
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark.routes import routes
from spark.summary import (
    COUNT_COLUMNS,
    SUMMARY_COLUMNS,
    TOTALS_COLUMNS,
    route_hour_summary,
    route_totals,
)
from spark.verdicts import verdicts

pytestmark = pytest.mark.spark

GRACE = 1000.0
H = 1_795_323_600_000.0  # a whole hour, UTC (2026-11-21T23:00:00Z)
HOUR_MS = 3_600_000.0


def _type(column: str) -> Any:
    if column == "hour":
        return TimestampType()
    if column in ("gw", "dest", "exit", "via"):
        return StringType()
    if column == "messages" or column in COUNT_COLUMNS:
        return LongType()
    return DoubleType()


def expected(spark: SparkSession, columns: list[str],
             rows: list[dict[str, Any]]) -> DataFrame:
    """Rows of the summary (or totals): counts not given are 0, other values null."""
    schema = StructType([StructField(c, _type(c), True) for c in columns])
    counts = {"messages", *COUNT_COLUMNS}
    data = [tuple(r.get(c, 0 if c in counts else None) for c in columns) for r in rows]
    return spark.createDataFrame(data, schema)


def hour(ms: float) -> datetime:
    return datetime.fromtimestamp(ms / 1000.0, UTC).replace(tzinfo=None)


def two_hours(spark: SparkSession) -> DataFrame:
    return frame(spark, [
        # Hour H. m1: one message, two consumers.
        rec(H + 1000, "gw-a", "publish", "m1", client="p"),
        rec(H + 1010, "gw-a", "deliver", "m1", client="c1", count=1),
        rec(H + 1030, "gw-a", "deliver", "m1", client="c2", count=1),
        # m2: delivered twice to one consumer.
        rec(H + 2000, "gw-a", "publish", "m2", client="p"),
        rec(H + 2005, "gw-a", "deliver", "m2", client="c1", count=1),
        rec(H + 2006, "gw-a", "deliver", "m2", client="c1", count=1),
        # m3: nothing left: lost. m4: dropped on purpose.
        rec(H + 3000, "gw-a", "publish", "m3", client="p"),
        rec(H + 4000, "gw-a", "publish", "m4", client="p"),
        rec(H + 4001, "gw-a", "drop", "m4", reason="no_subscribers"),
        # m5: exported to a cloud broker.
        rec(H + 5000, "gw-a", "publish", "m5", client="p"),
        rec(H + 5002, "gw-a", "export", "m5", client="cloud"),
        # m6: delivered past the grace period: late.
        rec(H + 6000, "gw-a", "publish", "m6", client="p"),
        rec(H + 8000, "gw-a", "deliver", "m6", client="c1", count=1),
        # Hour H+1. m7 delivered; m8 entered within the grace period of the end: pending.
        rec(H + HOUR_MS + 100, "gw-a", "publish", "m7", client="p"),
        rec(H + HOUR_MS + 105, "gw-a", "deliver", "m7", client="c1", count=1),
        rec(H + HOUR_MS + 5000, "gw-a", "publish", "m8", client="p"),
    ])


def test_counts_rates_and_latencies_per_route_and_hour(spark: SparkSession):
    v = verdicts(two_hours(spark), GRACE)

    got = route_hour_summary(v)

    t = "topic:t"
    assert_df_equality(got, expected(spark, SUMMARY_COLUMNS, [
        {"hour": hour(H), "gw": "gw-a", "dest": t, "exit": "deliver", "messages": 3,
         "delivered": 4, "late": 1, "duplicated": 1, "loss_rate": 0.0,
         "duplicate_rate": 1 / 3, "latency_p50_ms": 10.0, "latency_p95_ms": 2000.0,
         "latency_p99_ms": 2000.0, "latency_max_ms": 2000.0},
        {"hour": hour(H), "gw": "gw-a", "dest": t, "exit": "export", "via": "cloud",
         "messages": 1, "delivered": 1, "loss_rate": 0.0, "duplicate_rate": 0.0,
         "latency_p50_ms": 2.0, "latency_p95_ms": 2.0, "latency_p99_ms": 2.0,
         "latency_max_ms": 2.0},
        # The entry: every message that entered gw-a on topic:t in the hour.
        {"hour": hour(H), "gw": "gw-a", "dest": t, "messages": 6, "lost": 1, "dropped": 1,
         "loss_rate": 1 / 6, "duplicate_rate": 0.0},
        {"hour": hour(H + HOUR_MS), "gw": "gw-a", "dest": t, "exit": "deliver",
         "messages": 1, "delivered": 1, "loss_rate": 0.0, "duplicate_rate": 0.0,
         "latency_p50_ms": 5.0, "latency_p95_ms": 5.0, "latency_p99_ms": 5.0,
         "latency_max_ms": 5.0},
        {"hour": hour(H + HOUR_MS), "gw": "gw-a", "dest": t, "messages": 2, "pending": 1,
         "loss_rate": 0.0, "duplicate_rate": 0.0},
    ]), ignore_row_order=True, ignore_nullable=True)


def test_messages_from_the_routes_are_those_from_the_verdicts(spark: SparkSession):
    records = two_hours(spark)
    v = verdicts(records, GRACE)

    assert_df_equality(route_hour_summary(v, routes(records)), route_hour_summary(v),
                       ignore_row_order=True, ignore_nullable=True)


def test_percentiles_of_a_known_latency_set(spark: SparkSession):
    # 100 messages delivered after 1, 2, ..., 100 ms; then one more late enough to set the
    # watermark past them all.
    records = [r for i in range(1, 101) for r in (
        rec(H + i * 1000, "gw-a", "publish", f"m{i}", client="p"),
        rec(H + i * 1000 + i, "gw-a", "deliver", f"m{i}", client="c", count=1))]

    got = route_hour_summary(verdicts(frame(spark, records), GRACE))

    row = got.where("exit = 'deliver'").collect()
    assert [(r["messages"], r["delivered"], r["latency_p50_ms"], r["latency_p95_ms"],
             r["latency_p99_ms"], r["latency_max_ms"]) for r in row] == [
        (100, 100, 50.0, 95.0, 99.0, 100.0)]


def test_a_route_that_delivered_nothing_has_null_latencies(spark: SparkSession):
    records = frame(spark, [
        rec(H + 1000, "gw-a", "publish", "m1", dest="queue:q", client="p"),
        rec(H + 2000, "gw-a", "publish", "m2", dest="queue:q", client="p"),
        rec(H + 2500, "gw-a", "expire", "m2", dest="queue:q", reason="expired"),
        rec(H + 9000, "gw-a", "publish", "m3", dest="queue:other", client="p"),
        rec(H + 9001, "gw-a", "deliver", "m3", dest="queue:other", client="c", count=1),
    ])
    v = verdicts(records, GRACE)

    got = route_hour_summary(v).where("dest = 'queue:q'")

    assert_df_equality(got, expected(spark, SUMMARY_COLUMNS, [
        {"hour": hour(H), "gw": "gw-a", "dest": "queue:q", "messages": 2, "lost": 1,
         "expired": 1, "loss_rate": 0.5, "duplicate_rate": 0.0},
    ]), ignore_nullable=True)
    totals = route_totals(route_hour_summary(v), v).where("dest = 'queue:q'")
    assert_df_equality(totals, expected(spark, TOTALS_COLUMNS, [
        {"gw": "gw-a", "dest": "queue:q", "messages": 2, "lost": 1, "expired": 1,
         "loss_rate": 0.5, "duplicate_rate": 0.0},
    ]), ignore_nullable=True)


def test_totals_sum_the_hours_and_take_percentiles_again(spark: SparkSession):
    # Hour H: latencies 1..10 ms (p50 5); hour H+1: one of 100 ms (p50 100). Over both, the
    # p50 of the eleven is 6 ms, not the mean of 5 and 100.
    records = [r for i in range(1, 11) for r in (
        rec(H + i * 1000, "gw-a", "publish", f"m{i}", client="p"),
        rec(H + i * 1000 + i, "gw-a", "deliver", f"m{i}", client="c", count=1))]
    records += [
        rec(H + HOUR_MS, "gw-a", "publish", "late", client="p"),
        rec(H + HOUR_MS + 100, "gw-a", "deliver", "late", client="c", count=1),
        rec(H + HOUR_MS + 200, "gw-a", "deliver", "late", client="c", count=1),
        rec(H + HOUR_MS + 300, "gw-a", "publish", "gone", client="p"),
        rec(H + HOUR_MS + 5000, "gw-a", "publish", "end", client="p"),
    ]
    v = verdicts(frame(spark, records), GRACE)
    summary = route_hour_summary(v)
    assert sorted(r["latency_p50_ms"] for r in summary.where("exit = 'deliver'").collect()) \
        == [5.0, 100.0]

    got = route_totals(summary, v)

    assert_df_equality(got, expected(spark, TOTALS_COLUMNS, [
        {"gw": "gw-a", "dest": "topic:t", "exit": "deliver", "messages": 11,
         "delivered": 11, "duplicated": 1, "loss_rate": 0.0, "duplicate_rate": 1 / 11,
         "latency_p50_ms": 6.0, "latency_p95_ms": 100.0, "latency_p99_ms": 100.0,
         "latency_max_ms": 100.0},
        {"gw": "gw-a", "dest": "topic:t", "messages": 13, "lost": 1, "pending": 1,
         "loss_rate": 1 / 13, "duplicate_rate": 0.0},
    ]), ignore_row_order=True, ignore_nullable=True)
