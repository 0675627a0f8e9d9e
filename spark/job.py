"""The reconciliation job: read delivery logs, give verdicts, write them. Wiring only; every
transform is in ``spark.read``, ``spark.external``, ``spark.incremental``, ``spark.link``,
``spark.routes``, ``spark.verdicts`` and ``spark.summary``; the page in ``spark.report``.

    python -m spark.job LOGDIR [LOGDIR ...] --out DIR [--grace-ms MS] [--skew-ms MS]
                        [--link-window-ms MS] [--sender-spans-gateways]
                        [--since TIME] [--until TIME] [--format parquet|json|csv]
                        [--external PATH=MAPPING.yaml ...] [--previous DIR] [--no-report]
                        [--follow [--trigger-ms MS] [--checkpoint DIR]]

runs locally (``local[*]``) when started with ``python``, and unchanged under
``spark-submit`` (the master given there is kept). It writes the verdict rows to
DIR/verdicts, the summary per route and hour to DIR/summary, the records of the messages
still pending to DIR/pending (which the next run reads with ``--previous DIR``) and the
report to DIR/report.html, and prints the number of rows of each verdict. With ``--follow`` it keeps running
instead (``spark.follow``) until stopped with Ctrl-C or SIGTERM.

``reconcile`` is the job itself, for this entry point and for ``gateway reconcile``
(``spark.cli``): both parse the same options (``add_options``) and hand them over as they are
(``reconcile_options``).
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from spark.external import ExternalMapping, MappingError, link_senders, load_mapping, read_external
from spark.follow import DEFAULT_TRIGGER_MS, follow, run
from spark.incremental import (
    carry_in,
    not_reported_before,
    pending_records,
    read_pending,
    read_verdicts,
    run_path,
)
from spark.link import content_links, relink
from spark.read import FILE_GLOB, between, read_dlog
from spark.report import write_report
from spark.routes import messages, routes
from spark.summary import route_hour_summary
from spark.verdicts import verdicts

DEFAULT_GRACE_MS = 30_000.0  # longer than a transport's reconnect and spool replay usually takes
DEFAULT_SKEW_MS = 500.0  # NTP keeps the clocks of a site's hosts well within this
FORMATS = ("parquet", "json", "csv")
VERDICTS_DIR = "verdicts"  # DIR/verdicts: the verdict rows
SUMMARY_DIR = "summary"  # DIR/summary: per route per hour (spark.summary)
PENDING_DIR = "pending"  # DIR/pending: the records the next run carries in (spark.incremental)
REPORT_FILE = "report.html"  # DIR/report.html (spark.report)
# Input per shuffle partition when the job chooses their number: a partition of the records
# then takes some tens of MiB in a task (the JSON is several times larger than its rows).
SHUFFLE_PARTITION_BYTES = 128 * 2**20


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


def time_arg(text: str) -> float:
    """``parse_time`` for argparse: a time it cannot read is a usage error saying what it
    takes, not a traceback."""
    try:
        return parse_time(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not epoch milliseconds or an ISO 8601 time: {text!r}") from None


def missing_paths(paths: Iterable[str]) -> list[str]:
    """The local paths of ``paths`` that do not exist (a URL, ``hdfs://…``, ``s3a://…``, is
    Spark's to find)."""
    return [p for p in paths if "://" not in p and not os.path.exists(p)]


def session(master: str | None = None, driver_memory: str | None = None,
            conf: Iterable[tuple[str, str]] = ()) -> SparkSession:
    """The running session (spark-submit's, or a caller's), else a new one; with no master
    given, Spark's default is local[*] (spark-submit's when it started this process). The
    driver's memory takes effect only when this starts the JVM, i.e. not under spark-submit."""
    builder = SparkSession.builder.appName("gateway-reconcile")
    if master:
        builder = builder.master(master)
    if driver_memory:
        builder = builder.config("spark.driver.memory", driver_memory)
    for key, value in conf:
        builder = builder.config(key, value)
    return builder.getOrCreate()


def add_options(ap: argparse.ArgumentParser) -> None:
    """The job's options, the same for ``python -m spark.job`` and ``gateway reconcile``."""
    ap.add_argument("logdirs", nargs="+", metavar="LOGDIR",
                    help="delivery-log directories (searched recursively) or files")
    ap.add_argument("--out", required=True, metavar="DIR",
                    help="directory the results are written to (DIR/verdicts)")
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
    ap.add_argument("--since", type=time_arg, default=None,
                    help="only records at or after this time (epoch ms or ISO 8601)")
    ap.add_argument("--until", type=time_arg, default=None,
                    help="only records before this time (epoch ms or ISO 8601)")
    ap.add_argument("--format", choices=FORMATS, default="parquet",
                    help="of the verdict rows (default %(default)s)")
    ap.add_argument("--external", type=external_arg, action="append", default=[],
                    metavar="PATH=MAPPING.yaml",
                    help="another system's records (CSV or JSON Lines at PATH) read as a "
                         "pseudo-gateway's by the mapping (spark/README.md, \"External "
                         "records\"); repeatable")
    ap.add_argument("--previous", default=None, metavar="DIR",
                    help="the --out of the previous run (same --format): its pending "
                         "messages are judged again with these records, and its verdicts "
                         "are not given again")
    ap.add_argument("--no-report", action="store_true",
                    help="do not write DIR/report.html")
    ap.add_argument("--follow", action="store_true",
                    help="keep running: read the logs as they grow and append each "
                         "message's verdicts to DIR/verdicts once the watermark has passed "
                         "it (Parquet; Ctrl-C or SIGTERM stops)")
    ap.add_argument("--trigger-ms", type=float, default=DEFAULT_TRIGGER_MS,
                    help="with --follow, how often the logs are read (default %(default)s)")
    ap.add_argument("--checkpoint", default=None, metavar="DIR",
                    help="with --follow, where its progress and state are kept (default "
                         "OUT/_checkpoint); a restart with it goes on where it stopped")


def options_error(args: argparse.Namespace) -> str | None:
    """Why the options cannot be used (a path that is not there, options that do not go
    together), or None."""
    missing = missing_paths(args.logdirs)
    if missing:
        return f"no such delivery-log path: {missing[0]}"
    if args.previous is not None and args.previous.rstrip("/") == args.out.rstrip("/"):
        return ("--previous must be another directory than --out (its pending records are "
                "read while this run's are written)")
    if args.follow and args.previous is not None:
        return "--follow keeps its own state (--checkpoint), not --previous"
    if args.follow and args.format != "parquet":
        return "--follow writes Parquet only"
    if args.follow and args.external:
        return "--follow reads delivery logs only, not --external files"
    return None


def follow_logs(spark: SparkSession, args: argparse.Namespace) -> int:
    """``--follow``: the streaming query, run until Ctrl-C or SIGTERM."""
    return run(follow(spark, args.logdirs, args.out, args.grace_ms, args.skew_ms,
                      args.sender_spans_gateways, args.link_window_ms, args.since,
                      args.until, trigger_ms=args.trigger_ms, checkpoint=args.checkpoint))


def external_arg(spec: str) -> tuple[str, ExternalMapping]:
    """``--external PATH=MAPPING.yaml``: the path and its mapping, loaded and checked."""
    path, sep, mapping_file = spec.rpartition("=")
    if not sep or not path:
        raise argparse.ArgumentTypeError(f"{spec}: expected PATH=MAPPING.yaml")
    try:
        return path, load_mapping(mapping_file)
    except MappingError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def reconcile_options(args: argparse.Namespace) -> dict[str, Any]:
    """``reconcile``'s keyword arguments from the options of ``add_options``."""
    return {"out": args.out, "grace_ms": args.grace_ms, "skew_ms": args.skew_ms,
            "link_window_ms": args.link_window_ms,
            "sender_spans_gateways": args.sender_spans_gateways,
            "since_ms": args.since, "until_ms": args.until, "fmt": args.format,
            "externals": args.external, "previous": args.previous,
            "report": not args.no_report}


@dataclass(frozen=True)
class Reconciled:
    """What one run made: the records as read (within since/until), the same relinked,
    their routes and the summary, cached, and the verdict rows (read back from the Parquet
    files written, checkpointed in another format). ``unpersist`` when done with them."""

    read: DataFrame
    records: DataFrame
    routes: DataFrame
    verdicts: DataFrame
    summary: DataFrame

    def unpersist(self) -> None:
        for df in (self.summary, self.verdicts, self.routes, self.records, self.read):
            df.unpersist()


def reconcile(spark: SparkSession, paths: Sequence[str], *, out: str,
              grace_ms: float = DEFAULT_GRACE_MS, skew_ms: float = DEFAULT_SKEW_MS,
              link_window_ms: float | None = None, sender_spans_gateways: bool = False,
              since_ms: float | None = None, until_ms: float | None = None,
              fmt: str = "parquet",
              externals: Sequence[tuple[str, ExternalMapping]] = (),
              previous: str | None = None, report: bool = True) -> Reconciled:
    """Reads the delivery logs under ``paths`` (``since_ms <= ts < until_ms``), links the
    hops that lost their trace id (within ``link_window_ms``, default the grace period; 0
    links nothing), gives the verdicts and writes them to ``out``/verdicts in ``fmt``
    (replacing what was there). ``externals`` are other systems' records, each a path and
    its mapping (``spark.external``); a mapped column a file lacks raises ``MappingError``.
    ``previous`` is the ``out`` of the previous run: its pending records are judged again
    and its verdicts not given again (``spark.incremental``). The summary goes to
    ``out``/summary, the pending records to ``out``/pending, and, with ``report`` and a local
    ``out``, the report to ``out``/report.html."""
    if fmt not in FORMATS:
        raise ValueError(f"not an output format: {fmt!r}")
    if previous is not None and previous.rstrip("/") == out.rstrip("/"):
        raise ValueError("--previous must be another directory than --out (its pending "
                         "records are read while this run's are written)")
    choose_shuffle_partitions(spark, paths)
    # The records as read are cached: the fallback key, the watermark, the pending records
    # and the report read them again.
    read = between(read_dlog(spark, paths), since_ms, until_ms)
    for path, mapping in externals:
        read = read.unionByName(between(read_external(spark, path, mapping),
                                        since_ms, until_ms))
    if previous is not None:
        # Checkpointed: the carried records' plan would be analysed again in every plan
        # that reads the records.
        read = carry_in(read, read_pending(spark, previous)).localCheckpoint()
    read = read.cache()
    records = read
    window = grace_ms if link_window_ms is None else link_window_ms
    links = None
    if window > 0:
        # Found once (the pending records need them again). Relinking joins every record
        # (a shuffle of them all), so it is done only when something is to be relinked:
        # normally every hop carries the trace id and nothing is.
        links = content_links(read, window, skew_ms).localCheckpoint()
        if not links.isEmpty():
            records = relink(read, links)
    if externals:  # after the gateway-to-gateway links: a relayed import is no sender's hop
        records = link_senders(records, [m.gw for _, m in externals], window, skew_ms)
    if records is not read:
        # Checkpointed, not cached: a cached plan is still analysed whole in every plan
        # that reads it (the driver's heap).
        records = records.localCheckpoint()
    # Every message's records in one row (the one shuffle of the records), then its routes:
    # every verdict is derived from these two. Cached (columnar: each verdict reads only
    # the columns it needs), not checkpointed: their plans are short.
    message_rows = messages(records).cache()
    route_rows = routes(records, message_rows).cache()
    out_df = verdicts(records, grace_ms, skew_ms, sender_spans_gateways, route_rows,
                      message_rows)
    if previous is not None:
        out_df = not_reported_before(out_df, read_verdicts(spark, previous, fmt))
    verdicts_path = run_path(out, VERDICTS_DIR)
    if fmt == "parquet":
        # Computed once, while written; the summary, the pending records and the report
        # then read the file (only the columns each needs).
        out_df.write.mode("overwrite").parquet(verdicts_path)
        out_df = spark.read.parquet(verdicts_path)
    else:  # read back, JSON or CSV would not give the same types
        out_df = out_df.localCheckpoint()
        writer = out_df.write.mode("overwrite")
        if fmt == "csv":
            writer = writer.option("header", "true")
        writer.format(fmt).save(verdicts_path)
    # The messages are counted from the route rows, unless the verdicts are not all of
    # theirs (those reported by the previous run are left out).
    summary = route_hour_summary(out_df, route_rows if previous is None else None).cache()
    summary.write.mode("overwrite").parquet(run_path(out, SUMMARY_DIR))
    pending_records(read, out_df, window, skew_ms, links).write.mode("overwrite").parquet(
        run_path(out, PENDING_DIR))
    if report and "://" not in out:
        write_report(os.path.join(out, REPORT_FILE), out_df, summary, records,
                     route_rows=route_rows)
    message_rows.unpersist()
    return Reconciled(read, records, route_rows, out_df, summary)


def choose_shuffle_partitions(spark: SparkSession, paths: Sequence[str]) -> None:
    """Sets ``spark.sql.shuffle.partitions`` from the size of the logs when nobody set it
    (``--conf``, spark-submit, the caller's session): Spark's default, 200, makes hundreds
    of tiny tasks on a day's logs and a few hundred MiB of JSON, and too few on a month's.
    One partition per ``SHUFFLE_PARTITION_BYTES`` of input, at least two per core."""
    key = "spark.sql.shuffle.partitions"
    if spark.sparkContext.getConf().contains(key) or spark.conf.get(key) != "200":
        return
    if any("://" in p for p in paths):
        return  # not local files: their size is not known here
    size = 0
    for p in paths:
        if os.path.isfile(p):
            size += os.path.getsize(p)
        for root, _, files in os.walk(p):
            size += sum(os.path.getsize(os.path.join(root, f)) for f in files
                        if fnmatch.fnmatch(f, FILE_GLOB))
    cores = spark.sparkContext.defaultParallelism
    spark.conf.set(key, str(max(2 * cores, -(-size // SHUFFLE_PARTITION_BYTES))))


def verdict_counts(verdict_rows: DataFrame) -> dict[str, int]:
    """The number of rows of each verdict, by verdict name."""
    return {row["verdict"]: int(row["count"])
            for row in verdict_rows.groupBy("verdict").count().orderBy("verdict").collect()}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="spark.job", description=__doc__.splitlines()[0])
    add_options(ap)
    args = ap.parse_args(argv)
    why = options_error(args)
    if why:
        ap.error(why)
    if args.follow:
        return follow_logs(session(), args)
    try:
        done = reconcile(session(), args.logdirs, **reconcile_options(args))
    except MappingError as e:
        ap.error(str(e))
    for verdict, count in verdict_counts(done.verdicts).items():
        print(f"{verdict}\t{count}")
    done.unpersist()
    return 0


if __name__ == "__main__":
    sys.exit(main())
