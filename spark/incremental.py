"""Incremental runs: a message still ``pending`` at the end of one run is judged by the next.

A run writes ``DIR/pending``: the delivery-log records (``DLOG_SCHEMA``), as read, before the
fallback key relinked anything, of every message (trace id) with a ``pending`` verdict
(``pending_records``), on every gateway: its publish, what left, its imports elsewhere. The
next run, given ``--previous DIR``, adds them to the records it reads (``carry_in``) before
linking, routes and verdicts, so a message that entered yesterday and left today is
``delivered`` today (``late`` when past the grace period) and never ``lost``; one that is
still without an exit today, past today's watermark, is ``lost``; one within today's grace
period is ``pending`` again and carried on to the next run. The records are taken before the
fallback key relinked them, so an import that continues a pending export is linked again,
with whatever the next run adds, by the same rule.

Records in both (a run over a window that overlaps the previous one's reads the carried
records again): a delivery-log line read twice is one line. The records carry no sequence
number (docs/delivery-log.md, "Fields"): two records of one message, gateway, event and
client differ by their ``ts`` (microseconds), and a redelivery by its ``count``, but two
deliveries of one message to one consumer within the same microsecond would be equal in
every column. So equal records are not simply made distinct: for the carried messages only,
each distinct record is kept as many times as the larger of its counts on either side (the
previous run's, this run's), which removes a line read by both runs and keeps a real
duplicate delivery that either run saw twice.

Reported once: the carried messages' verdicts that the previous run already gave (every
verdict but ``pending``) are given again by this one from the same records: a message
exported by gw-a and not yet imported by gw-b was ``delivered`` on gw-a's export route and
``pending`` in transit; today it is ``delivered`` on that route again, and at gw-b.
``not_reported_before`` drops a verdict row that the previous run's verdicts (``DIR/verdicts``)
have with the same verdict, trace id, gateway, destination, exit, exit client and exit time;
the same also drops, in overlapping windows, the rows of messages read by both runs that the
previous run had judged already. Pending rows are never final and are never dropped.
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark.link import content_links
from spark.schema import DLOG_SCHEMA
from spark.verdicts import PENDING

# A verdict row's identity across runs: the route (or, for a decision, its record's time).
VERDICT_KEY = ["verdict", "trace_id", "gw", "dest", "exit", "exit_client", "exit_ts"]


def run_path(directory: str, part: str) -> str:
    """``DIR/part`` of a run's output (a local path or a URI)."""
    return directory.rstrip("/") + "/" + part


def pending_records(records: DataFrame, verdicts: DataFrame, link_window_ms: float = 0.0,
                    skew_ms: float = 0.0, links: DataFrame | None = None) -> DataFrame:
    """The ``records`` (as read, before ``spark.link``) of every message with a ``pending``
    verdict, with ``DLOG_SCHEMA``'s columns. The verdicts' trace ids are those after
    linking: with ``link_window_ms`` > 0 (the window the run linked with) the import
    traces the fallback key gave a pending trace's id are found again and kept too
    (``links``: ``content_links(records, link_window_ms, skew_ms)``, when the caller has
    them already)."""
    ids = (verdicts.where(F.col("verdict") == F.lit(PENDING))
           .select("trace_id").where(F.col("trace_id").isNotNull()).distinct())
    if link_window_ms > 0:
        if links is None:
            links = content_links(records, link_window_ms, skew_ms)
        linked = (links.join(ids.withColumnRenamed("trace_id", "linked_trace_id"),
                        on="linked_trace_id", how="left_semi")
                  .select("trace_id"))
        ids = ids.unionByName(linked).distinct()
    return records.join(ids, on="trace_id", how="left_semi").select(*DLOG_SCHEMA.fieldNames())


def read_pending(spark: SparkSession, previous_dir: str) -> DataFrame:
    """The records a previous run carried over (``DIR/pending``)."""
    return spark.read.schema(DLOG_SCHEMA).parquet(run_path(previous_dir, "pending"))


def carry_in(records: DataFrame, previous: DataFrame) -> DataFrame:
    """This run's ``records`` with the previous run's pending ones: for the carried messages
    (their trace ids), each distinct record as many times as the larger of its counts on
    either side (a line read by both runs once, a duplicate either saw twice twice); every
    other record as it is."""
    cols = DLOG_SCHEMA.fieldNames()
    prev = previous.select(*cols)
    carried = prev.select("trace_id").distinct()
    again = records.join(carried, on="trace_id", how="left_semi").select(*cols)
    rest = records.join(carried, on="trace_id", how="left_anti").select(*cols)
    tagged = (again.withColumn("_now", F.lit(1)).withColumn("_before", F.lit(0))
              .unionByName(prev.withColumn("_now", F.lit(0)).withColumn("_before", F.lit(1))))
    times = F.greatest(F.sum("_now"), F.sum("_before")).cast("int")
    merged = (tagged.groupBy(*cols).agg(times.alias("_times"))
              .select(*cols, F.explode(F.array_repeat(F.lit(0), F.col("_times")))
                      .alias("_copy"))
              .select(*cols))
    return rest.unionByName(merged)


def read_verdicts(spark: SparkSession, previous_dir: str, fmt: str = "parquet") -> DataFrame:
    """The verdict keys (``VERDICT_KEY``) a previous run wrote (``DIR/verdicts``, in the
    format it was written with)."""
    reader = spark.read.format(fmt)
    if fmt == "csv":
        reader = reader.option("header", "true")
    df = reader.load(run_path(previous_dir, "verdicts"))
    return df.select(*[F.col(c).cast("double" if c == "exit_ts" else "string").alias(c)
                       for c in VERDICT_KEY])


def not_reported_before(verdicts: DataFrame, previous: DataFrame) -> DataFrame:
    """The ``verdicts`` but those the ``previous`` run gave already (same ``VERDICT_KEY``,
    nulls equal), a ``pending`` of the previous run excepted: it was no verdict yet."""
    done = (previous.where(F.col("verdict") != F.lit(PENDING)).select(*VERDICT_KEY)
            .distinct().select(*[F.col(c).alias(f"_p_{c}") for c in VERDICT_KEY]))
    same: Column = reduce(lambda a, b: a & b,
                          [F.col(c).eqNullSafe(F.col(f"_p_{c}")) for c in VERDICT_KEY])
    return verdicts.join(done, same, how="left_anti")
