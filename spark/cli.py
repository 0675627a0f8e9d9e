"""``gateway reconcile``: the reconciliation job (``spark.job.reconcile``) as a command.

    gateway reconcile LOGDIR [LOGDIR ...] --out DIR [the options of python -m spark.job]
                      [--json] [--no-progress] [--master URL] [--driver-memory SIZE]
                      [--conf KEY=VALUE ...]

``gateway.cli`` hands its arguments over to ``main`` only when the subcommand is given, so
the gateway never loads pyspark otherwise; this module imports pyspark (through
``spark.job``) only inside ``main``, after checking that it is there, so a gateway installed
without the ``spark`` extra says what to install instead of a traceback.

While Spark works, a progress bar on stderr (when stderr is a terminal; ``--no-progress``
turns it off) follows the run's jobs through Spark's public status API: every job the run
starts is in one job group, and a thread polls ``SparkContext.statusTracker()`` for the
group's jobs and their stages' task counts. A finished job's counts no longer change and are
kept; a running job's are asked again at each poll. The last poll is made after the work, so
the bar's final line counts every job of the run. Spark's own console progress bar is turned
off (it would draw over this one).

Without ``--json`` the number of rows of each verdict is printed, as ``python -m spark.job``
does; with it, one JSON object (``json_result``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import DataFrame

PROG = "gateway reconcile"
MISSING_PYSPARK = (f"{PROG}: pyspark is not installed; install it with "
                   "pip install 'gateway[spark]' (it needs a Java 17+ runtime)")
JOB_GROUP = "gateway-reconcile"
POLL_S = 0.25  # a bar that moves four times a second; each poll is a few calls to the JVM


class _Parser(argparse.ArgumentParser):
    """A usage error is one line on stderr and exit status 2 (``-h`` shows the usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")


def parser() -> argparse.ArgumentParser:
    from spark.job import add_options

    ap = _Parser(prog=PROG, description="Reconcile delivery logs: verdicts per message and "
                                        "route, written to DIR (needs gateway[spark]).")
    add_options(ap)
    ap.add_argument("--json", action="store_true",
                    help="print one JSON object on stdout: out, records, verdict counts, "
                         "counts per route")
    ap.add_argument("--no-progress", action="store_true",
                    help="no progress bar (there is none when stderr is not a terminal)")
    ap.add_argument("--master", default=None, metavar="URL",
                    help="Spark master (default: local[*] when run directly; under "
                         "spark-submit, the master given there)")
    ap.add_argument("--driver-memory", default=None, metavar="SIZE",
                    help="the driver's memory, e.g. 4g (when run directly; under "
                         "spark-submit give spark-submit's --driver-memory)")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    type=_conf_pair, help="a Spark setting (repeatable)")
    return ap


def _conf_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"not KEY=VALUE: {text!r}")
    return key, value


def main(argv: Sequence[str] | None = None) -> int:
    try:
        import pyspark.sql  # noqa: F401  (only to know it is there)
    except ImportError:
        print(MISSING_PYSPARK, file=sys.stderr)
        return 2
    from spark.external import MappingError
    from spark.job import (
        follow_logs,
        options_error,
        reconcile,
        reconcile_options,
        session,
        verdict_counts,
    )
    from spark.summary import route_totals

    ap = parser()
    args = ap.parse_args(argv)
    why = options_error(args)
    if why:
        ap.error(why)
    if args.driver_memory and "PYSPARK_GATEWAY_PORT" in os.environ:
        # spark-submit started the JVM (and this process): too late to size it
        print(f"{PROG}: --driver-memory has no effect under spark-submit; give it to "
              "spark-submit", file=sys.stderr)
    show = not args.no_progress and sys.stderr.isatty()
    conf = [("spark.ui.showConsoleProgress", "false"), *args.conf]
    try:
        spark = session(args.master, args.driver_memory, conf)
    except Exception as exc:  # no Java, a master that cannot be reached: say it in one line
        print(f"{PROG}: cannot start Spark: {_first_line(exc)}", file=sys.stderr)
        return 1
    if args.follow:  # a stream has no end to count towards: no bar
        return follow_logs(spark, args)
    sc = spark.sparkContext
    if show:
        sc.setLogLevel("ERROR")  # a warning would tear the bar; without a bar they stay
    sc.setJobGroup(JOB_GROUP, PROG)
    with SparkProgress(sc, JOB_GROUP, show):
        try:
            done = reconcile(spark, args.logdirs, **reconcile_options(args))
        except MappingError as e:  # a mapped column the external file does not have
            ap.error(str(e))
        counts = verdict_counts(done.verdicts)
        result = json_result(args.out, done.records.count(), counts,
                             route_totals(done.summary, done.verdicts)) if args.json else None
    done.unpersist()
    if result is not None:
        print(json.dumps(result))
    else:
        for verdict, count in counts.items():
            print(f"{verdict}\t{count}")
    return 0


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# --- --json ---------------------------------------------------------------------------------


def json_result(out: str, records: int, counts: dict[str, int],
                totals: DataFrame) -> dict[str, Any]:
    """The ``--json`` object: {"out", "records" (read, within since/until), "verdicts"
    ({verdict: rows}), "routes" (the rows of ``summary.route_totals``, one per (gw, dest,
    exit, via), in that order with nulls first: ``messages``, the rows of each verdict, the
    loss and duplicate rates, latency percentiles and maximum)}."""
    from pyspark.sql import functions as F

    from spark.summary import ROUTE_COLUMNS

    rows = totals.orderBy(*[F.col(c).asc_nulls_first() for c in ROUTE_COLUMNS]).collect()
    return {"out": out, "records": records, "verdicts": counts,
            "routes": [row.asDict() for row in rows]}


# --- the progress bar -----------------------------------------------------------------------

@dataclass
class Snapshot:
    """Where the group's jobs are: jobs finished of those started, tasks completed of those
    known (a running job's stages' tasks, a finished job's completed ones), and the stage
    running now (None between stages)."""

    jobs_done: int = 0
    jobs: int = 0
    tasks_done: int = 0
    tasks: int = 0
    stage: int | None = None
    _finished: dict[int, int] = field(default_factory=dict)  # job id -> its tasks completed


def poll(sc: SparkContext, group: str, snap: Snapshot) -> Snapshot:
    """Updates ``snap`` from ``sc.statusTracker()`` (the public status API) and returns it."""
    tracker = sc.statusTracker()
    tasks_done = tasks = 0
    stage: int | None = None
    job_ids = tracker.getJobIdsForGroup(group)
    for job_id in job_ids:
        if job_id in snap._finished:
            continue
        job = tracker.getJobInfo(job_id)
        if job is None:
            continue
        job_done = job_tasks = 0
        for stage_id in job.stageIds:
            info = tracker.getStageInfo(stage_id)
            if info is None:
                continue
            job_done += info.numCompletedTasks
            job_tasks += info.numTasks
            if info.numActiveTasks > 0:
                stage = stage_id
        if job.status in ("SUCCEEDED", "FAILED"):
            # a skipped stage (its shuffle output was there already) never runs its tasks
            snap._finished[job_id] = job_done
        else:
            tasks_done += job_done
            tasks += job_tasks
    finished = sum(snap._finished.values())
    snap.jobs_done, snap.jobs = len(snap._finished), len(job_ids)
    snap.tasks_done, snap.tasks = tasks_done + finished, tasks + finished
    snap.stage = stage
    return snap


class SparkProgress:
    """A rich progress bar on stderr following ``poll`` from a thread while the ``with``
    block runs; does nothing when ``show`` is false."""

    def __init__(self, sc: SparkContext, group: str, show: bool) -> None:
        self._sc, self._group, self._show = sc, group, show
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._snap = Snapshot()

    def __enter__(self) -> SparkProgress:
        if self._show:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

            self._progress = Progress("{task.description}", BarColumn(),
                                      MofNCompleteColumn(), "tasks", TimeElapsedColumn(),
                                      console=Console(stderr=True), auto_refresh=False)
            self._task = self._progress.add_task("Spark: starting", total=None)
            self._progress.start()
            self._thread = threading.Thread(target=self._run, name="spark-progress",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        try:
            if exc_type is None:  # (after a failure Spark itself may be gone)
                self._update()  # the last poll: every job of the run has been started
        finally:
            self._progress.stop()

    def _run(self) -> None:
        try:
            while not self._stop.wait(POLL_S):
                self._update()
        except Exception:  # Spark stopping under it (a failed run): the bar stops, the run
            return         # goes on to report its own error

    def _update(self) -> None:
        snap = poll(self._sc, self._group, self._snap)
        where = f", stage {snap.stage}" if snap.stage is not None else ""
        self._progress.update(self._task, total=snap.tasks, completed=snap.tasks_done,
                              description=f"Spark: {snap.jobs_done}/{snap.jobs} jobs{where}")
        self._progress.refresh()


if __name__ == "__main__":  # under spark-submit: spark-submit spark/cli.py LOGDIR --out DIR
    sys.exit(main())
