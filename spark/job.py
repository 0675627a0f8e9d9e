"""The reconciliation job: read delivery logs, give verdicts, write them. Wiring only; every
transform is in ``spark.read``, ``spark.link``, ``spark.routes`` and ``spark.verdicts``.

    python -m spark.job LOGDIR [LOGDIR ...] --out DIR [--grace-ms MS] [--skew-ms MS]
                        [--link-window-ms MS] [--sender-spans-gateways]
                        [--since TIME] [--until TIME] [--format parquet|json|csv]
                        [--previous DIR]

runs locally (``local[*]``) when started with ``python``, and unchanged under
``spark-submit`` (the master given there is kept). It writes the verdict rows to
DIR/verdicts, the summary per route and hour to DIR/summary (``spark.summary``) and the
records of the messages still pending to DIR/pending, which the next run reads with
``--previous DIR`` (``spark.incremental``), and prints the number of rows of each verdict.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import UTC, datetime

from pyspark.sql import SparkSession

from spark.incremental import (
    carry_in,
    not_reported_before,
    pending_records,
    read_pending,
    read_verdicts,
    run_path,
)
from spark.link import link_by_content
from spark.read import between, read_dlog
from spark.routes import routes
from spark.summary import route_hour_summary
from spark.verdicts import verdicts

DEFAULT_GRACE_MS = 30_000.0  # longer than a transport's reconnect and spool replay usually takes
DEFAULT_SKEW_MS = 500.0  # NTP keeps the clocks of a site's hosts well within this


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
    ap.add_argument("--out", required=True,
                    help="directory the verdicts, summary and pending records are written to")
    ap.add_argument("--grace-ms", type=float, default=DEFAULT_GRACE_MS,
                    help="how long after entering a message may still leave before it "
                         "counts as lost (default %(default)s)")
    ap.add_argument("--skew-ms", type=float, default=DEFAULT_SKEW_MS,
                    help="how far two gateways' clocks may differ: a negative end-to-end "
                         "latency within it reads 0 (default %(default)s)")
    ap.add_argument("--link-window-ms", type=float, default=None,
                    help="how long after an export with no trace id on the far side its "
                         "import is looked for by destination and body hash (default: the "
                         "grace period; 0 turns the fallback key off)")
    ap.add_argument("--sender-spans-gateways", action="store_true",
                    help="a client id names one sender on every gateway (for reordering; "
                         "sends within --skew-ms on two gateways have no known order)")
    ap.add_argument("--since", type=parse_time, default=None,
                    help="only records at or after this time (epoch ms or ISO 8601)")
    ap.add_argument("--until", type=parse_time, default=None,
                    help="only records before this time (epoch ms or ISO 8601)")
    ap.add_argument("--format", choices=("parquet", "json", "csv"), default="parquet")
    ap.add_argument("--previous", default=None, metavar="DIR",
                    help="the --out of the previous run (same --format): its pending "
                         "messages are judged again with these records, and its verdicts "
                         "are not given again")
    args = ap.parse_args(argv)
    if args.previous is not None and args.previous.rstrip("/") == args.out.rstrip("/"):
        ap.error("--previous must be another directory than --out (its pending records "
                 "are read while this run's are written)")

    spark = session()
    # Every verdict reads the records again (entries, exits, decisions, the watermark) and
    # most read the routes: the files are parsed, and the routes joined, once.
    records = between(read_dlog(spark, args.logdirs), args.since, args.until)
    if args.previous is not None:
        # Checkpointed: the verdicts' plan names the records a dozen times, and the carried
        # records' plan in each would make it too large to print (the driver runs out of heap).
        records = carry_in(records, read_pending(spark, args.previous)).localCheckpoint()
    unlinked = records
    window = args.grace_ms if args.link_window_ms is None else args.link_window_ms
    if window > 0:
        records = link_by_content(records, window, args.skew_ms)
    records = records.cache()
    route_rows = routes(records).cache()
    out = verdicts(records, args.grace_ms, args.skew_ms, args.sender_spans_gateways,
                   route_rows)
    if args.previous is not None:
        out = not_reported_before(out, read_verdicts(spark, args.previous, args.format))
    out = out.cache()
    writer = out.write.mode("overwrite")
    if args.format == "csv":
        writer = writer.option("header", "true")
    writer.format(args.format).save(run_path(args.out, "verdicts"))
    route_hour_summary(out).write.mode("overwrite").parquet(run_path(args.out, "summary"))
    pending_records(unlinked, out, window, args.skew_ms).write.mode("overwrite").parquet(
        run_path(args.out, "pending"))
    for row in out.groupBy("verdict").count().orderBy("verdict").collect():
        print(f"{row['verdict']}\t{row['count']}")
    out.unpersist()
    route_rows.unpersist()
    records.unpersist()
    return 0


if __name__ == "__main__":
    sys.exit(main())
