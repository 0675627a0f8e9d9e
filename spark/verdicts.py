"""Verdicts, route by route (routes: ``spark.routes``): delivered (with its latency),
duplicated, lost (or still pending) after a grace period, and lost in transit between two
gateways.

Time is event time: the records' own ``ts`` (epoch milliseconds). The *watermark* is the
latest ``ts`` in the records minus the grace period; an entry at or before the watermark has
had the whole grace period to leave, so one that never left and that the gateway never let go
on purpose (expire, drop, discard, undeliverable) is ``lost``; one after it is ``pending`` (no
verdict yet). A message that did leave, but later than the grace period after it entered, is
``delivered`` with ``late`` set: it is what a reader of the logs at an earlier watermark
would have called lost.

Every function takes and returns DataFrames and nothing else; one output row per verdict, so
a route that was delivered twice has a ``delivered`` row and a ``duplicated`` row.
``verdicts`` puts them in one DataFrame with the columns of ``VERDICT_COLUMNS``.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark.routes import ENTRY_KEY, ROUTE_KEY, decisions, routes
from spark.schema import DELIVER, EXPORT, IMPORT

DELIVERED = "delivered"
DUPLICATED = "duplicated"
LOST = "lost"
LOST_IN_TRANSIT = "lost_in_transit"
PENDING = "pending"

VERDICT_COLUMNS = [
    "verdict", "trace_id", "msg_id", "gw", "dest",
    "entry_event", "entry_client", "entry_ts",
    "exit", "exit_client", "exit_ts",
    "latency_ms", "e2e_latency_ms", "late",
    "copies", "flagged",
    "origin_gw", "origin_ts", "watermark",
]


def watermark(records: DataFrame, grace_ms: float) -> DataFrame:
    """A one-row DataFrame: ``watermark`` = the latest ``ts`` of the records minus
    ``grace_ms``."""
    if grace_ms < 0:
        raise ValueError("the grace period cannot be negative")
    return records.agg((F.max("ts") - F.lit(float(grace_ms))).alias("watermark"))


def delivered(route_rows: DataFrame, grace_ms: float) -> DataFrame:
    """A ``delivered`` row per route that a message left by (to a consumer or a transport):
    ``latency_ms`` from its entry on that gateway to the first copy leaving (one clock),
    ``e2e_latency_ms`` from its first entry on any gateway (``origin_ts``; across clocks when
    the gateways differ), and ``late`` when the latency is over ``grace_ms``."""
    latency = F.col("exit_ts") - F.col("entry_ts")
    return (route_rows
            .where(F.col("exit").isNotNull())
            .select(F.lit(DELIVERED).alias("verdict"), *_route_columns(),
                    latency.alias("latency_ms"),
                    (F.col("exit_ts") - F.col("origin_ts")).alias("e2e_latency_ms"),
                    (latency > F.lit(float(grace_ms))).alias("late"),
                    F.col("exit_count").alias("copies")))


def duplicated(route_rows: DataFrame) -> DataFrame:
    """A ``duplicated`` row per route that more than one copy of a message left by: the same
    trace id delivered more than once to the same consumer, or exported more than once through
    the same transport, from the same gateway and destination. ``copies`` counts them;
    ``flagged`` says whether the gateway marked every copy after the first as a redelivery
    (JMSRedelivered, JMS 1.1 §3.4.7: a client may see a message again only so marked,
    §4.4.12). An export carries no such mark, so a duplicate export is never flagged."""
    flagged = (F.col("exit") == F.lit(DELIVER)) & (F.col("deliver_count") <= 1)
    return (route_rows
            .where(F.col("exit_count") > 1)
            .select(F.lit(DUPLICATED).alias("verdict"), *_route_columns(),
                    F.col("exit_count").alias("copies"), flagged.alias("flagged")))


def lost(records: DataFrame, route_rows: DataFrame, grace_ms: float) -> DataFrame:
    """A ``lost`` row per entry (trace_id, gw, dest) nothing left from and that the gateway
    did not let go on purpose, when the entry is at or before the watermark; a ``pending``
    row when it is after it (the grace period has not passed yet)."""
    unexited = route_rows.where(F.col("exit").isNull())
    undecided = unexited.join(decisions(records), on=ENTRY_KEY, how="left_anti")
    judged = undecided.crossJoin(watermark(records, grace_ms))
    verdict = (F.when(F.col("entry_ts") <= F.col("watermark"), F.lit(LOST))
               .otherwise(F.lit(PENDING)))
    return judged.select(verdict.alias("verdict"), *_route_columns(), "watermark")


def lost_in_transit(records: DataFrame, route_rows: DataFrame, grace_ms: float) -> DataFrame:
    """A ``lost_in_transit`` row per export through a transport that leads to another
    gateway whose log was read, when no gateway at the far end imported the message and the
    export is at or before the watermark; ``pending`` when it is after it.

    Which gateways a transport leads to is learnt from the logs themselves: transport T of
    gateway G leads to gateway H when some message exported through T was imported at H (the
    trace id is the same on both sides; the transport names on the two sides need not be).
    An export through a transport that leads to no gateway read (a cloud broker, a bus with
    no gateway listening) gets no verdict here: nothing could have written the import."""
    exported = route_rows.where(F.col("exit") == F.lit(EXPORT))
    imports = (records
               .where((F.col("event") == F.lit(IMPORT)) & F.col("trace_id").isNotNull())
               .select("trace_id", F.col("gw").alias("import_gw"))
               .distinct())
    elsewhere = ((exported["trace_id"] == imports["trace_id"])
                 & (exported["gw"] != imports["import_gw"]))
    links = (exported.join(imports, elsewhere, "inner")
             .select("gw", "exit_client", "import_gw").distinct())
    # The exports through linked transports, each with every gateway its transport leads to;
    # an export is missing when none of those imported its trace id.
    expected = exported.join(links, on=["gw", "exit_client"], how="inner")
    arrived = expected.join(imports, on=["trace_id", "import_gw"], how="left_semi")
    missing = (expected.select(*ROUTE_KEY).distinct()
               .join(arrived.select(*ROUTE_KEY).distinct(), on=ROUTE_KEY, how="left_anti"))
    judged = (exported.join(missing, on=ROUTE_KEY, how="left_semi")
              .crossJoin(watermark(records, grace_ms)))
    verdict = (F.when(F.col("exit_ts") <= F.col("watermark"), F.lit(LOST_IN_TRANSIT))
               .otherwise(F.lit(PENDING)))
    return judged.select(verdict.alias("verdict"), *_route_columns(), "watermark")


def verdicts(records: DataFrame, grace_ms: float) -> DataFrame:
    """Every verdict above for the records of one or many gateways, in one DataFrame with
    ``VERDICT_COLUMNS`` (a column a verdict does not set is null)."""
    route_rows = routes(records)
    out = (delivered(route_rows, grace_ms)
           .unionByName(duplicated(route_rows), allowMissingColumns=True)
           .unionByName(lost(records, route_rows, grace_ms), allowMissingColumns=True)
           .unionByName(lost_in_transit(records, route_rows, grace_ms),
                        allowMissingColumns=True))
    return out.select(*VERDICT_COLUMNS)


def _route_columns() -> list[str]:
    return ["trace_id", "msg_id", "gw", "dest", "entry_event", "entry_client", "entry_ts",
            "exit", "exit_client", "exit_ts", "origin_gw", "origin_ts"]
