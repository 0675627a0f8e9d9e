"""The summary table: the verdicts counted per route and per hour (``route_hour_summary``),
and the same over all hours (``route_totals``).

A row's route is (gw, dest, exit, via). For a verdict on a way out of a gateway (delivered,
duplicated, changed, reordered, and a transit verdict, ``lost_in_transit`` or its
``pending``) it is the way out: ``exit`` = ``deliver`` (every consumer of that destination on
that gateway together; ``via`` null) or ``export`` (``via`` = the transport, the verdict's
``exit_client``). For a verdict on a message that left by no way out (``lost`` or its
``pending``: nothing left; ``expired``, ``dead_lettered``, ``dropped``, ``discarded``: the
gateway let it go on purpose) the route is the *entry* itself, ``exit`` and ``via`` null: the
message entered ``gw`` on ``dest``. The entry row's ``messages`` counts every message that
entered ``gw`` on ``dest`` in the hour, whatever became of it, so its ``loss_rate`` is the
share of the destination's messages that the gateway lost; a way out's ``messages`` counts the
messages that left by it (a topic message delivered to three consumers is one message and three
``delivered`` rows of its ``deliver`` route).

``hour`` is the entry's time (``entry_ts``, the gateway's clock) truncated to the hour, in
UTC: a message counts in the hour it entered, even when it left in the next one. A decision
whose message's entry is not in the logs read (and a bus's DATALOSS advisory, which names no
message) has no entry time: it counts in the hour of the decision (``exit_ts``), in its
verdict's column, and in no ``messages`` (no entry was seen).

``late`` counts the ``delivered`` rows with ``late`` set. The latency percentiles and maximum
are over the ``delivered`` rows' ``latency_ms`` (entry to first copy out, one gateway's clock),
null when the route delivered nothing in the hour. The percentiles are Spark's
``percentile_approx`` at its default accuracy (10000): each is a latency of the set (no
interpolation) whose rank is within n / 10000 of the exact one, n being the number of
latencies, so exact for a set of up to 10000 (and p50 of 1..100 ms is 50 ms). An exact
percentile keeps every latency of a group in one task's memory, which a busy route's hour can
make a lot.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark.schema import DELIVER, EXPORT
from spark.verdicts import (
    CHANGED,
    DEAD_LETTERED,
    DELIVERED,
    DISCARDED,
    DROPPED,
    DUPLICATED,
    EXPIRED,
    LOST,
    LOST_IN_TRANSIT,
    PENDING,
    REORDERED,
)

ROUTE_COLUMNS = ["gw", "dest", "exit", "via"]

# The verdicts the summary counts, in the order of its columns (``late`` after delivered).
COUNTED_VERDICTS = [DELIVERED, LOST, PENDING, LOST_IN_TRANSIT, DUPLICATED, CHANGED,
                    REORDERED, EXPIRED, DEAD_LETTERED, DROPPED, DISCARDED]

COUNT_COLUMNS = [DELIVERED, "late", *COUNTED_VERDICTS[1:]]
RATE_COLUMNS = ["loss_rate", "duplicate_rate"]
LATENCY_COLUMNS = ["latency_p50_ms", "latency_p95_ms", "latency_p99_ms", "latency_max_ms"]
PERCENTILES = [0.5, 0.95, 0.99]
PERCENTILE_ACCURACY = 10000  # Spark's default for percentile_approx

SUMMARY_COLUMNS = ["hour", *ROUTE_COLUMNS, "messages", *COUNT_COLUMNS, *RATE_COLUMNS,
                   *LATENCY_COLUMNS]
TOTALS_COLUMNS = SUMMARY_COLUMNS[1:]

# Verdicts on a way out of the gateway (the route has an exit); the others, bar a transit
# verdict's pending, are on the entry.
_WAY_OUT = [DELIVERED, DUPLICATED, CHANGED, REORDERED, LOST_IN_TRANSIT]


def route_hour_summary(verdicts: DataFrame, routes: DataFrame | None = None) -> DataFrame:
    """One row per route and hour with ``SUMMARY_COLUMNS`` (module docstring), from the
    verdict rows (``spark.verdicts.VERDICT_COLUMNS``). ``routes`` (``spark.routes.routes``
    of the same records) is where ``messages`` is counted from when given: the same numbers
    as from the verdict rows, every route and every entry having a verdict row, as long as
    the verdicts are all of those routes' (not a subset)."""
    counted = _routed(verdicts)
    if routes is not None:
        # The verdict rows then count verdicts only; the messages come from the routes,
        # one row each (no distinct count: its shuffle of every row, twice).
        rows = counted.drop("trace_id").unionByName(_entered_once(routes),
                                                    allowMissingColumns=True)
        messages = F.coalesce(F.sum("entered"), F.lit(0))
    else:
        rows = counted.unionByName(_entered(verdicts), allowMissingColumns=True)
        messages = F.count_distinct("trace_id")
    summary = (rows.groupBy("hour", *ROUTE_COLUMNS)
               .agg(messages.alias("messages"), *_count_aggs(), *_latency_aggs()))
    return _finish(summary, SUMMARY_COLUMNS)


def route_totals(summary: DataFrame, verdicts: DataFrame) -> DataFrame:
    """``route_hour_summary`` over all hours, one row per route (``TOTALS_COLUMNS``): the
    counts summed, the rates recomputed from the sums, the largest maximum kept, and the
    percentiles taken again over the route's ``delivered`` rows of every hour (``verdicts``,
    those the summary was made from): a percentile of the whole is no mean of the hours'."""
    key = [F.col(c).eqNullSafe(F.col(f"p_{c}")) for c in ROUTE_COLUMNS]
    sums = (summary.groupBy(*ROUTE_COLUMNS)
            .agg(*[F.sum(c).alias(c) for c in ["messages", *COUNT_COLUMNS]],
                 F.max("latency_max_ms").alias("latency_max_ms")))
    pct = (_routed(verdicts).where(F.col("verdict") == F.lit(DELIVERED))
           .groupBy(*ROUTE_COLUMNS).agg(*_latency_aggs()[:3]))
    pct = pct.select(*[F.col(c).alias(f"p_{c}") for c in ROUTE_COLUMNS],
                     *LATENCY_COLUMNS[:3])
    cond = key[0]
    for k in key[1:]:
        cond = cond & k
    return _finish(sums.join(pct, cond, how="left"), TOTALS_COLUMNS)


def _hour(ts: Column) -> Column:
    """The UTC hour an epoch-milliseconds time falls in (a timestamp; whole hours in UTC
    whatever the session's time zone)."""
    return F.timestamp_seconds(F.floor(ts / F.lit(3_600_000.0)) * F.lit(3600))


def _routed(verdicts: DataFrame) -> DataFrame:
    """The counted verdict rows with their summary route (``exit`` null on the entry's) and
    hour."""
    way_out = (F.col("verdict").isin(_WAY_OUT)
               | ((F.col("verdict") == F.lit(PENDING)) & F.col("exit").isNotNull()))
    exit_ = F.when(way_out, F.col("exit"))
    via = F.when(way_out & (F.col("exit") == F.lit(EXPORT)), F.col("exit_client"))
    return (verdicts
            .where(F.col("verdict").isin(COUNTED_VERDICTS))
            .select("verdict", F.when(F.col("entry_ts").isNotNull(), F.col("trace_id"))
                    .alias("trace_id"), "gw", "dest", "late", "latency_ms",
                    _hour(F.coalesce("entry_ts", "exit_ts")).alias("hour"),
                    exit_.alias("exit"), via.alias("via")))


def _entered(rows: DataFrame) -> DataFrame:
    """(hour, route, trace_id) rows that only count ``messages`` (no verdict): each message on each way
    out it left by, and on its entry (every message that entered ``gw`` on ``dest``). ``rows``
    are verdict rows or route rows: both have ``trace_id``, ``gw``, ``dest``, ``exit``,
    ``exit_client`` and ``entry_ts``; a decision's ``exit`` is no way out."""
    seen = rows.where(F.col("entry_ts").isNotNull() & F.col("trace_id").isNotNull())
    hour = _hour(F.col("entry_ts")).alias("hour")
    is_way_out = F.col("exit").isin(DELIVER, EXPORT)
    if "verdict" in rows.columns:
        is_way_out = is_way_out & F.col("verdict").isin(_WAY_OUT)
    ways = seen.where(is_way_out).select(
        hour, "gw", "dest", "exit",
        F.when(F.col("exit") == F.lit(EXPORT), F.col("exit_client")).alias("via"),
        "trace_id")
    entries = seen.select(hour, "gw", "dest", F.lit(None).cast("string").alias("exit"),
                          F.lit(None).cast("string").alias("via"), "trace_id")
    return ways.unionByName(entries)


def _entered_once(routes: DataFrame) -> DataFrame:
    """(hour, route, ``entered`` = 1) rows, one per message on each way out it left by and
    on each entry, from route rows (``spark.routes.routes``: ``entry_first`` marks an entry's
    first route row, ``way_first`` the first of its rows on each way out)."""
    seen = routes.where(F.col("entry_ts").isNotNull() & F.col("trace_id").isNotNull())
    hour = _hour(F.col("entry_ts")).alias("hour")
    one = F.lit(1).alias("entered")
    ways = seen.where(F.col("way_first")).select(
        hour, "gw", "dest", "exit",
        F.when(F.col("exit") == F.lit(EXPORT), F.col("exit_client")).alias("via"), one)
    entries = seen.where(F.col("entry_first")).select(
        hour, "gw", "dest", F.lit(None).cast("string").alias("exit"),
        F.lit(None).cast("string").alias("via"), one)
    return ways.unionByName(entries)


def _count_aggs() -> list[Column]:
    counts = [F.count(F.when(F.col("verdict") == F.lit(v), 1)).alias(v)
              for v in COUNTED_VERDICTS]
    late = F.count(F.when((F.col("verdict") == F.lit(DELIVERED)) & F.col("late"), 1))
    return [counts[0], late.alias("late"), *counts[1:]]


def _latency_aggs() -> list[Column]:
    """p50, p95, p99 and the maximum of the delivered rows' latency (null when none)."""
    latency = F.when(F.col("verdict") == F.lit(DELIVERED), F.col("latency_ms"))
    pct = F.percentile_approx(latency, PERCENTILES, PERCENTILE_ACCURACY)
    return [*[pct[i].alias(name) for i, name in enumerate(LATENCY_COLUMNS[:3])],
            F.max(latency).alias("latency_max_ms")]


def _finish(df: DataFrame, columns: list[str]) -> DataFrame:
    """The rates from the counts (null when no message entered), every column its type."""
    messages = F.col("messages")
    rates = {
        "loss_rate": F.when(messages > 0, (F.col(LOST) + F.col(LOST_IN_TRANSIT)) / messages),
        "duplicate_rate": F.when(messages > 0, F.col(DUPLICATED) / messages),
    }
    typed = {c: F.col(c).cast("long") for c in ["messages", *COUNT_COLUMNS]}
    typed.update({c: F.col(c).cast("double") for c in LATENCY_COLUMNS})
    typed.update({c: r.cast("double") for c, r in rates.items()})
    if "hour" in columns:
        typed["hour"] = F.col("hour").cast("timestamp")
    return df.select(*[typed[c].alias(c) if c in typed else F.col(c) for c in columns])
