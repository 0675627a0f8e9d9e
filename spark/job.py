"""The reconciliation job: read delivery logs, give verdicts, write them. Wiring only; every
transform is in ``spark.read``, ``spark.routes`` and ``spark.verdicts``.

    python -m spark.job LOGDIR [LOGDIR ...] --out DIR [--grace-ms MS]
                        [--since TIME] [--until TIME] [--format parquet|json|csv]

runs locally (``local[*]``) when started with ``python``, and unchanged under
``spark-submit`` (the master given there is kept). It writes the verdict rows to DIR and
prints the number of rows of each verdict.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import UTC, datetime

from pyspark.sql import SparkSession

from spark.read import between, read_dlog
from spark.verdicts import verdicts

DEFAULT_GRACE_MS = 30_000.0  # longer than a transport's reconnect and spool replay usually takes


def parse_time(text: str) -> float:
    """Epoch milliseconds from a number of epoch milliseconds or an ISO 8601 time (UTC when
    it names no offset)."""
    try:
        return float(text)
    except ValueError:
        pass
    when = datetime.fromisoformat(text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp() * 1000.0


def session() -> SparkSession:
    """The running session (spark-submit's, or a caller's), else a new one; with no master
    given, Spark's default is local[*]."""
    return SparkSession.builder.appName("gateway-reconcile").getOrCreate()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="spark.job", description=__doc__.splitlines()[0])
    ap.add_argument("logdirs", nargs="+", metavar="LOGDIR",
                    help="delivery-log directories (searched recursively) or files")
    ap.add_argument("--out", required=True, help="directory the verdicts are written to")
    ap.add_argument("--grace-ms", type=float, default=DEFAULT_GRACE_MS,
                    help="how long after entering a message may still leave before it "
                         "counts as lost (default %(default)s)")
    ap.add_argument("--since", type=parse_time, default=None,
                    help="only records at or after this time (epoch ms or ISO 8601)")
    ap.add_argument("--until", type=parse_time, default=None,
                    help="only records before this time (epoch ms or ISO 8601)")
    ap.add_argument("--format", choices=("parquet", "json", "csv"), default="parquet")
    args = ap.parse_args(argv)

    spark = session()
    # Every verdict reads the records again (entries, exits, decisions, the watermark): the
    # files are parsed once.
    records = between(read_dlog(spark, args.logdirs), args.since, args.until).cache()
    out = verdicts(records, args.grace_ms).cache()
    writer = out.write.mode("overwrite")
    if args.format == "csv":
        writer = writer.option("header", "true")
    writer.format(args.format).save(args.out)
    for row in out.groupBy("verdict").count().orderBy("verdict").collect():
        print(f"{row['verdict']}\t{row['count']}")
    out.unpersist()
    records.unpersist()
    return 0


if __name__ == "__main__":
    sys.exit(main())
