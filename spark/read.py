"""Reading delivery logs: one or many log directories (many gateways, many days) into one
DataFrame of records with ``DLOG_SCHEMA``.

Spark's JSON reader reads every ``dlog-*.jsonl`` file under each path given (directories are
searched recursively, so a directory of per-day directories is one path) with the explicit
schema, never an inferred one: inference reads every file twice and would type a column from
whatever values happen to be present. A line cut short by a crash is malformed JSON and is
dropped (docs/delivery-log.md, "Files": at worst the last line of a file is cut short), as is
a record of a version this reader does not know. Keys the schema does not name are ignored,
as the format's versioning rules ask of readers.

``between`` is the ``--since`` / ``--until`` filter, on the records' own event time ``ts``
(the file names carry only the time a file was opened, which bounds nothing about its last
record).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from spark.schema import DLOG_SCHEMA, SUPPORTED_VERSIONS

FILE_GLOB = "dlog-*.jsonl"  # docs/delivery-log.md, "Files", Name


def read_dlog(spark: SparkSession, paths: Sequence[str],
              schema: StructType = DLOG_SCHEMA) -> DataFrame:
    """The records of every delivery-log file under ``paths`` (directories or files)."""
    if not paths:
        raise ValueError("no delivery log path given")
    df = (spark.read.schema(schema)
          .option("mode", "DROPMALFORMED")  # a line cut short by a crash
          .option("pathGlobFilter", FILE_GLOB)
          .option("recursiveFileLookup", "true")
          .json(list(paths)))
    return only_supported(df)


def only_supported(df: DataFrame) -> DataFrame:
    """The records of a version this reader has a schema for (docs/delivery-log.md,
    "Versioning": the reader selects on ``v``), with the fields every record must have.

    A node of a gateway cluster writes ``gw`` as ``<cluster>/<node>`` (docs/delivery-log.md,
    "Fields"): its records are the cluster's, one gateway, so ``gw`` is read as the part
    before the ``/``. A message then enters on one node and leaves on another as it would
    through one gateway."""
    gw = F.col("gw")
    return (df.where(F.col("v").isin(list(SUPPORTED_VERSIONS))
                     & F.col("ts").isNotNull() & gw.isNotNull()
                     & F.col("event").isNotNull())
            .withColumn("gw", F.substring_index(gw, "/", 1)))


def between(df: DataFrame, since_ms: float | None = None,
            until_ms: float | None = None) -> DataFrame:
    """The records with ``since_ms <= ts < until_ms`` (epoch milliseconds, UTC; either bound
    may be None). A message whose entry and exit fall on both sides of a bound is cut in two:
    give the verdicts a window wider than the one reported on by at least the grace period."""
    cond: Column = F.lit(True)
    if since_ms is not None:
        cond = cond & (F.col("ts") >= F.lit(float(since_ms)))
    if until_ms is not None:
        cond = cond & (F.col("ts") < F.lit(float(until_ms)))
    return df.where(cond)
