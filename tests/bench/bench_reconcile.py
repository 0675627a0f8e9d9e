"""The reconciliation job against a plain scan of the same delivery logs: wall time, peak
memory, and whether it finds the verdicts planted in the logs.

    .venv/bin/python tests/bench/bench_reconcile.py                    # 10,000,000 records
    .venv/bin/python tests/bench/bench_reconcile.py --records 1000000 --stages --json out.json

The logs are made by ``tests/bench/dloggen.py`` (three gateways, 2 to 4 records a message,
0.1% lost, 0.1% duplicated; its docstring says what else) into ``--data`` (default
``<tmp>/dlog-bench-<records>-<seed>``), or reused from there when its ``manifest.json`` says
it holds the same ``--records``, ``--seed`` and ``--rate`` (``--regen`` makes them again). The generator's
time is printed apart; it is not part of either measurement.

Then, in one Spark session on ``local[2]`` with Spark's default driver memory (no setting is
given; Spark's default is 1 GiB of JVM heap) and no UI, one after the other:

* **scan**: ``spark.read_dlog`` of the same directories (the same explicit schema, the same
  reader options and version filter) and ``count()``: what reading and parsing the files
  costs, the floor of any job over them;
* **floor** (with ``--floor``): ``floor`` below, the least any reconciliation of the logs
  does, written as plain Spark: what the job could at best come down to;
* **full**: ``spark.job.main`` on the same directories with ``--out`` (Parquet): the job's
  own wiring (read, link, routes, verdicts, summary, pending records, report, write),
  unchanged, with its default grace period and clock-skew tolerance; as nothing sets
  ``spark.sql.shuffle.partitions``, the job chooses it from the size of the logs (the line
  printed before the scan shows Spark's default, before the job changed it).

Reported: the wall time of each, their ratio (the target is full <= 3 x scan), and the peak
resident memory of this process and every process it started (the driver JVM, Python
workers), sampled from ``/proc`` every ``SAMPLE_S`` seconds during each part. Then the rows of
each verdict the job wrote are compared with those the generator planted (``expected`` in the
manifest: delivered, lost, duplicated, and none pending, lost in transit, changed or
reordered); a mismatch is printed loudly and the exit status is 1. ``--stages`` prints, for
the full run, each Spark stage's duration, tasks and shuffle bytes (from the status store,
which Spark keeps with the UI off), and the number of shuffles (stages that wrote shuffle
data).

Results on a machine that other work shares are indicative only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's spark package, whatever is installed
sys.path.insert(0, str(Path(__file__).resolve().parent))

import dloggen  # noqa: E402

SAMPLE_S = 0.2  # how often the process tree's memory is read
PAGE = os.sysconf("SC_PAGE_SIZE")


# -- memory ----------------------------------------------------------------------------------


def _tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, ()))
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                total += int(f.read().split()[1]) * PAGE
        except OSError:
            pass
    return total


class PeakRss:
    """Samples the resident memory of this process tree in a thread, keeping the peak."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        pid = os.getpid()
        while True:
            self.peak = max(self.peak, _tree_rss(pid))
            if self._stop.wait(SAMPLE_S):
                return

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _tree_rss(os.getpid()))


# -- Spark -----------------------------------------------------------------------------------


def session() -> Any:
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder
             .master("local[2]")
             .appName("bench-reconcile")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _stage_list(spark: Any) -> Any:
    """An iterator over the status store's stages (the JVM's ``AppStatusStore.stageList``
    with its defaults: every status, no task details)."""
    store = spark.sparkContext._jsc.sc().statusStore()
    every = spark.sparkContext._jvm.java.util.ArrayList()
    return store.stageList(every, False, False, getattr(store, "stageList$default$4")(),
                           getattr(store, "stageList$default$5")()).iterator()


def stages(spark: Any, after: int) -> list[dict[str, Any]]:
    """The completed stages with an id above ``after``, from the status store."""
    out = []
    it = _stage_list(spark)
    while it.hasNext():
        s = it.next()
        if s.stageId() <= after:
            continue
        done, started = s.completionTime(), s.submissionTime()
        ms = (done.get().getTime() - started.get().getTime()
              if done.isDefined() and started.isDefined() else -1)
        out.append({"stage": s.stageId(), "name": s.name(), "tasks": s.numTasks(),
                    "ms": ms, "input_mb": s.inputBytes() / 2**20,
                    "shuffle_read_mb": s.shuffleReadBytes() / 2**20,
                    "shuffle_write_mb": s.shuffleWriteBytes() / 2**20,
                    "status": str(s.status())})
    return sorted(out, key=lambda s: s["stage"])


def last_stage(spark: Any) -> int:
    ids = [-1]
    it = _stage_list(spark)
    while it.hasNext():
        ids.append(it.next().stageId())
    return max(ids)


def floor(spark: Any, dirs: list[str], out: Path) -> None:
    """The least any reconciliation of these logs does, as plain Spark: read the records,
    shuffle them once by trace id (a message's records are in every gateway's files), give
    each copy that left (``deliver``, ``export``) a row with its latency from the message's
    first entry, write those rows as Parquet, and count them with latency quantiles per
    route and hour. No fallback key, no decisions, duplicates, losses, reordering, pending
    records or report: a floor, not a job."""
    from pyspark.sql import functions as F

    from spark.read import read_dlog

    ev = F.col("event")
    traces = (read_dlog(spark, dirs).where(F.col("trace_id").isNotNull())
              .groupBy("trace_id")
              .agg(F.min(F.when(ev.isin("publish", "import"), F.col("ts"))).alias("entry_ts"),
                   F.collect_list(F.when(ev.isin("deliver", "export"), F.struct(
                       "event", "gw", "dest", "client", "ts", "msg_id", "v", "body_hash",
                       "props_hash"))).alias("exits")))
    rows = (traces.select("trace_id", "entry_ts", F.explode("exits").alias("x"))
            .select("trace_id", "entry_ts", "x.*")
            .withColumn("latency_ms", F.col("ts") - F.col("entry_ts")))
    rows.write.mode("overwrite").parquet(str(out / "rows"))
    hour = F.floor(F.col("ts") / 3_600_000).alias("hour")
    (spark.read.parquet(str(out / "rows")).groupBy("gw", "dest", "client", hour)
     .agg(F.count(F.lit(1)).alias("n"),
          F.percentile_approx("latency_ms", [0.5, 0.95, 0.99]).alias("q"),
          F.max("latency_ms").alias("max"))
     .write.mode("overwrite").parquet(str(out / "summary")))


# -- the bench -------------------------------------------------------------------------------


def data(args: argparse.Namespace) -> tuple[Path, dict[str, Any], bool]:
    """The generated logs (made now, or reused) and their manifest."""
    path = Path(args.data or Path(tempfile.gettempdir())
                / f"dlog-bench-{args.records}-{args.seed}")
    manifest_path = path / "manifest.json"
    if not args.regen and manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        if ((manifest.get("requested_records"), manifest.get("seed"), manifest.get("rate"))
                == (args.records, args.seed, args.rate)):
            return path, manifest, True
    return path, dloggen.generate(args.records, path, args.seed, args.rate), False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=10_000_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rate", type=float, default=1000.0,
                    help="the generator's messages per second (below about 100,000 records, "
                         "give less than 1000 for lost messages to be planted: they are only "
                         "planted more than a minute before the end)")
    ap.add_argument("--data", help="the generated logs' directory (made when missing)")
    ap.add_argument("--regen", action="store_true", help="generate again even if present")
    ap.add_argument("--out", help="where the job writes (default: a temporary directory)")
    ap.add_argument("--stages", action="store_true", help="print the full run's stages")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--floor", action="store_true",
                    help="also time the least any reconciliation does (``floor``), between "
                         "the scan and the job")
    args = ap.parse_args()

    path, manifest, reused = data(args)
    print(f"# data {path}: {manifest['records']:,} records, {manifest['bytes'] / 2**20:,.0f} "
          f"MiB, {'reused' if reused else 'generated'} "
          f"(generator {manifest['seconds']:.1f} s)", flush=True)
    dirs = [str(path / gw) for gw in dloggen.GATEWAYS]

    from spark.job import main as job_main
    from spark.read import read_dlog

    with PeakRss() as startup:
        spark = session()
    memory = spark.sparkContext.getConf().get("spark.driver.memory", "1g (Spark's default)")
    print(f"# spark {spark.version} {spark.sparkContext.master}, driver memory {memory}, "
          f"shuffle partitions {spark.conf.get('spark.sql.shuffle.partitions')}, "
          f"AQE {spark.conf.get('spark.sql.adaptive.enabled')}; "
          f"started at {startup.peak / 2**20:,.0f} MiB", flush=True)

    results: dict[str, Any] = {"records": manifest["records"], "bytes": manifest["bytes"],
                               "generator_s": manifest["seconds"]}
    with PeakRss() as mem:
        t = time.perf_counter()
        n = read_dlog(spark, dirs).count()
        results["scan_s"] = time.perf_counter() - t
    results["scan_peak_rss_mib"] = mem.peak / 2**20
    if n != manifest["records"]:
        print(f"!!! MISMATCH: the scan read {n:,} records, the generator wrote "
              f"{manifest['records']:,}", flush=True)
    print(f"scan  {results['scan_s']:8.1f} s  peak RSS {results['scan_peak_rss_mib']:7,.0f} "
          f"MiB  ({n:,} records, {n / results['scan_s']:,.0f} records/s)", flush=True)

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench-reconcile-"))
    if args.floor:
        from spark.job import choose_shuffle_partitions
        choose_shuffle_partitions(spark, dirs)  # as the job does
        with PeakRss() as mem:
            t = time.perf_counter()
            floor(spark, dirs, out / "floor")
            results["floor_s"] = time.perf_counter() - t
        spark.conf.unset("spark.sql.shuffle.partitions")  # the job chooses it again
        print(f"floor {results['floor_s']:8.1f} s  peak RSS {mem.peak / 2**20:7,.0f} MiB  "
              f"(floor / scan = {results['floor_s'] / results['scan_s']:.2f})", flush=True)
    before = last_stage(spark)
    with PeakRss() as mem:
        t = time.perf_counter()
        rc = job_main([*dirs, "--out", str(out)])
        results["full_s"] = time.perf_counter() - t
    results["full_peak_rss_mib"] = mem.peak / 2**20
    ratio = results["full_s"] / results["scan_s"]
    results["ratio"] = ratio
    print(f"full  {results['full_s']:8.1f} s  peak RSS {results['full_peak_rss_mib']:7,.0f} "
          f"MiB  (job exit status {rc})", flush=True)
    print(f"# full / scan = {ratio:.2f} (target <= 3){'' if ratio <= 3 else '  OVER TARGET'}")
    if args.floor:
        print(f"# full / floor = {results['full_s'] / results['floor_s']:.2f}")

    run = stages(spark, before)
    shuffles = sum(1 for s in run if s["shuffle_write_mb"] > 0)
    results["stages"], results["shuffles"] = len(run), shuffles
    print(f"# full run: {len(run)} stages, {shuffles} shuffles, "
          f"{sum(s['shuffle_write_mb'] for s in run):,.0f} MiB shuffled")
    if args.stages:
        print(f"{'stage':>5} {'ms':>8} {'tasks':>5} {'in MiB':>8} {'shR MiB':>8} "
              f"{'shW MiB':>8}  name")
        for s in run:
            print(f"{s['stage']:5} {s['ms']:8} {s['tasks']:5} {s['input_mb']:8.1f} "
                  f"{s['shuffle_read_mb']:8.1f} {s['shuffle_write_mb']:8.1f}  "
                  f"{s['name'][:60]}")
        results["stage_list"] = run

    verdict_dir = out / "verdicts" if (out / "verdicts").is_dir() else out
    got = {r["verdict"]: r["count"] for r in
           spark.read.parquet(str(verdict_dir)).groupBy("verdict").count().collect()}
    results["verdicts"] = got
    ok = rc == 0
    print(f"{'verdict':16} {'expected':>10} {'got':>10}")
    for verdict in sorted(set(manifest["expected"]) | set(got)):
        want = manifest["expected"].get(verdict)
        have = got.get(verdict, 0)
        bad = want is not None and want != have
        ok = ok and not bad
        print(f"{verdict:16} {'-' if want is None else f'{want:,}':>10} {have:>10,}"
              f"{'   !!! MISMATCH' if bad else ''}")
    if not ok:
        print("!!! MISMATCH: the job's verdicts are not those the generator planted",
              flush=True)
    results["verdicts_match"] = ok
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    spark.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
