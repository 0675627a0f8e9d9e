"""Following the logs: the reconciliation run continuously, as Spark Structured Streaming,
giving each message's verdicts once the event-time watermark has passed it.

What is read. The gateway appends to its current ``dlog-*.jsonl`` file batch by batch and
opens a new one when it rotates (docs/delivery-log.md, "Files"); Spark's file source, on
the other hand, reads a file once, when it first lists it, and never looks at it again, so
pointed at the log directories it would read the current file as it happened to be and miss
every line written after. A *tailer* in the driver therefore copies, every trigger, the
complete lines each log file gained since it last looked (up to its last ``\\n``: a line the
writer has not finished is left for the next poll, and a line cut short by a crash is never
read) into a new segment file under the checkpoint (``incoming/``, written under a hidden
name and renamed, so Spark never sees half a segment), and the stream reads those segments.
A segment's name holds its source file's id and the byte range it copied, so after a
restart the tailer starts each file where the last segment ended: no line is read twice
or skipped. Lines therefore reach the stream about one trigger after the gateway writes them
(plus the writer's ``flush_interval``).

What is given. Each micro-batch (``foreachBatch``) runs the batch transforms
(``spark.link``, ``spark.routes``, ``spark.verdicts``) on the records still pending from
earlier batches (a Parquet table under the checkpoint) together with the new ones. The
watermark is the latest ``ts`` ever read minus the grace period, as in the batch job; it
only moves forward (the latest record is remembered even after its message is done). A
message is *final* when every record of its trace is at or before the watermark: no record
of it for a whole grace period. Its verdicts are then appended to ``OUT/verdicts/`` and its
records leave the state; the others stay for the next batch. So a message that leaves late,
but before its trace is final, is ``delivered`` with ``late`` set, never ``lost``; a
message's ``lost`` is given once it had the whole grace period, and is final: a record of
that message read afterwards (a copy the gateway delivered later still, or a log file that
reached the tailer more than a grace period late) starts a trace of its own, and an exit
with no entry is no route, so it gives no verdict: follow mode does not report it. The
batch job over the same logs does (``delivered`` with ``late``). ``pending`` is never
emitted: a message with a pending verdict is simply not final yet.

Exactly once. Each batch writes its verdicts under file names carrying the batch id, and the
new state under a directory carrying it, and then records the batch as done
(``follow.json``, replaced atomically). A batch run again after a failure or a restart
(Spark's own checkpoint replays the batch it had not committed) first removes what an
earlier attempt of it left and writes the same rows again; a batch already done is skipped.

Across messages. A verdict that needs other messages sees only those still in the state:
``lost_in_transit`` learns where a transport leads from messages that crossed it, so the
state keeps one crossing of each (transport, far gateway) pair for good (three records under
a reserved trace id whose verdicts are never written); ``reordered`` compares a message
only with its sender's messages still in the state, and the fallback key links an export
and an import only while both are there (the link window is normally within the grace
period, so both are).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from spark.link import link_by_content
from spark.read import FILE_GLOB, between, only_supported
from spark.routes import messages, routes
from spark.schema import DLOG_SCHEMA, EXPORT, IMPORT, PUBLISH
from spark.verdicts import VERDICT_COLUMNS, verdicts

DEFAULT_TRIGGER_MS = 5_000.0  # the gateway's log trails it by 0.2 s; a verdict waits a grace period anyway

SEGMENT_GLOB = "seg-*.jsonl"
_SEGMENT = re.compile(r"seg-([0-9a-f]{16})-([0-9]{16})-([0-9]{16})\.jsonl\Z")
# A segment holds whole lines of one file; a file's lines are never longer than this, and a
# file that grew by more is copied in several segments, one a poll.
MAX_SEGMENT_BYTES = 64 * 1024 * 1024

# The record that carries the watermark into the batch transforms (they take it from the
# records' latest ts): an event no transform knows (readers ignore events they do not
# know: docs/delivery-log.md, "Versioning"), no trace id.
WATERMARK_EVENT = "_follow_watermark"
# The trace ids of the records kept as evidence of where a transport leads.
EVIDENCE_PREFIX = "_follow_link:"

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock_for(directory: Path) -> threading.Lock:
    """One lock per segment directory in this process: two tailers of one checkpoint (the
    follow thread's and a caller's) never copy the same lines twice."""
    key = os.path.realpath(directory)
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


class Tailer:
    """Copies the complete lines the delivery-log files under ``paths`` gained since the
    last poll into segment files in ``incoming`` (see the module docstring)."""

    def __init__(self, paths: Sequence[str], incoming: Path,
                 skip: Sequence[Path] = ()) -> None:
        self.paths = list(paths)
        self.incoming = incoming
        self.skip = [os.path.realpath(p) for p in skip]

    def poll(self) -> int:
        """Copy what is new; returns the number of segments written."""
        self.incoming.mkdir(parents=True, exist_ok=True)
        with _lock_for(self.incoming):
            offsets = self._offsets()
            written = 0
            for path in self._logs():
                source = hashlib.sha1(path.encode()).hexdigest()[:16]
                start = offsets.get(source, 0)
                try:
                    with open(path, "rb") as f:
                        f.seek(start)
                        data = f.read(MAX_SEGMENT_BYTES)
                except FileNotFoundError:  # removed since it was listed
                    continue
                end = data.rfind(b"\n") + 1
                if end == 0:
                    continue
                name = f"seg-{source}-{start:016d}-{start + end:016d}.jsonl"
                hidden = self.incoming / f".{name}.tmp"  # Spark lists no hidden file
                with open(hidden, "wb") as f:
                    f.write(data[:end])
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(hidden, self.incoming / name)
                written += 1
            return written

    def _offsets(self) -> dict[str, int]:
        """Where each source file's copied lines end, from the segments' names."""
        offsets: dict[str, int] = {}
        for name in os.listdir(self.incoming):
            m = _SEGMENT.match(name)
            if m:
                offsets[m[1]] = max(offsets.get(m[1], 0), int(m[3]))
        return offsets

    def _logs(self) -> Iterator[str]:
        """Every ``dlog-*.jsonl`` under the paths (directories searched recursively, as
        ``read_dlog`` does), by real path, each once, never under a skipped directory."""
        seen: set[str] = set()
        for p in self.paths:
            top = os.path.realpath(p)
            if os.path.isfile(top):
                found = [top] if fnmatch(os.path.basename(top), FILE_GLOB) else []
            else:
                found = []
                for d, dirs, files in os.walk(top):
                    dirs[:] = sorted(x for x in dirs
                                     if os.path.realpath(os.path.join(d, x)) not in self.skip)
                    found += [os.path.join(d, f) for f in sorted(files)
                              if fnmatch(f, FILE_GLOB)]
            for f in found:
                if f not in seen:
                    seen.add(f)
                    yield f


class BatchStopped(Exception):
    """A micro-batch cut short by stopping the query (``run``)."""


class _Reconcile:
    """The ``foreachBatch`` function: state + new records -> final verdicts, new state.
    ``stopping`` is set by ``run`` before it stops the query."""

    def __init__(self, out: Path, state: Path, grace_ms: float, skew_ms: float,
                 sender_spans_gateways: bool, link_window_ms: float) -> None:
        self.verdicts_dir = out / "verdicts"
        self.state = state
        self.grace_ms = grace_ms
        self.skew_ms = skew_ms
        self.sender_spans_gateways = sender_spans_gateways
        self.link_window_ms = link_window_ms
        self.stopping = threading.Event()

    def done(self) -> dict[str, Any] | None:
        marker = self.state / "follow.json"
        if not marker.exists():
            return None
        loaded: dict[str, Any] = json.loads(marker.read_text())
        return loaded

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        try:
            self._batch(batch, batch_id)
        except Exception as e:
            if not self.stopping.is_set():
                raise
            # Stopping the query cancelled this batch's Spark jobs (it is not committed, and
            # runs again from the checkpoint next time). Spark tells that from a failure only
            # by the error's text (the batch function's error reaches it as text): an
            # interruption under a Py4JJavaError. It matches the text with a regular
            # expression that recurses once a character, which overflows the stream
            # thread's stack on a Java stack trace as long as a cancelled job's, and prints
            # a StackOverflowError instead of stopping quietly. So the error is said short.
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise BatchStopped(
                f"py4j.protocol.Py4JJavaError: An error occurred while calling batch "
                f"{batch_id}: java.lang.InterruptedException: stopped ({first[:200]})"
            ) from None

    def _batch(self, batch: DataFrame, batch_id: int) -> None:
        done = self.done()
        if done is not None and batch_id <= done["batch"]:
            return  # given already (a replay after a restart)
        spark = batch.sparkSession
        new = batch.select(*DLOG_SCHEMA.fieldNames())
        latest = new.agg(F.max("ts")).first()
        max_ts = latest[0] if latest is not None else None
        if done is not None and done["max_ts"] is not None:
            max_ts = done["max_ts"] if max_ts is None else max(max_ts, done["max_ts"])
        records = new
        if done is not None:
            kept = spark.read.schema(DLOG_SCHEMA).parquet(str(self.state / done["records"]))
            records = kept.unionByName(new)
        if self.link_window_ms > 0:
            records = link_by_content(records, self.link_window_ms, self.skew_ms)
        records = records.localCheckpoint()  # read once; the lineage ends here
        this = f"records-{batch_id}"
        if max_ts is None:  # nothing read at all yet
            records.write.mode("overwrite").parquet(str(self.state / this))
            self._commit(batch_id, None, this, done)
            return
        wm = max_ts - self.grace_ms
        traced = F.col("trace_id").isNotNull()
        evidence = F.col("trace_id").startswith(EVIDENCE_PREFIX)
        final = (records.where(traced & ~evidence).groupBy("trace_id")
                 .agg(F.max("ts").alias("last_ts"))
                 .where(F.col("last_ts") <= F.lit(wm)).select("trace_id")).localCheckpoint()
        untraced_final = ~traced & (F.col("ts") <= F.lit(wm))
        pending = (records.join(final, "trace_id", "left_anti")
                   .where(traced | (F.col("ts") > F.lit(wm))))
        if final.isEmpty() and records.where(untraced_final).isEmpty():
            # Nothing is final: the verdicts (the costly part) wait for a later batch.
            pending.write.mode("overwrite").parquet(str(self.state / this))
            self._publish(None, batch_id)
            self._commit(batch_id, max_ts, this, done)
            return
        carrier = spark.createDataFrame(
            [tuple({"v": 2, "ts": max_ts, "gw": "", "event": WATERMARK_EVENT}.get(n)
                   for n in DLOG_SCHEMA.fieldNames())], DLOG_SCHEMA)
        all_records = records.unionByName(carrier)
        # Every verdict reads them (as in the job).
        message_rows = messages(all_records).cache()
        route_rows = routes(all_records, message_rows).cache()
        given = verdicts(all_records, self.grace_ms, self.skew_ms,
                         self.sender_spans_gateways, route_rows, message_rows)
        emit = (given.join(final, "trace_id", "left_semi")
                .unionByName(given.where(~traced & (F.col("exit_ts") <= F.lit(wm))))
                .select(*VERDICT_COLUMNS))
        # Evidence of a crossing already kept is not added again.
        known = pending.where(evidence).select("trace_id")
        crossed = (_evidence(records.join(final, "trace_id", "left_semi"))
                   .join(known, "trace_id", "left_anti"))
        keep = pending.unionByName(crossed)
        keep.write.mode("overwrite").parquet(str(self.state / this))
        self._publish(emit, batch_id)
        route_rows.unpersist()
        message_rows.unpersist()
        self._commit(batch_id, max_ts, this, done)

    def _publish(self, emit: DataFrame | None, batch_id: int) -> None:
        """Write the batch's verdicts into ``verdicts/`` under names carrying the batch id,
        replacing what an earlier attempt of the same batch left."""
        self.verdicts_dir.mkdir(parents=True, exist_ok=True)
        prefix = f"part-b{batch_id:010d}-"
        for old in self.verdicts_dir.glob(prefix + "*"):
            old.unlink()
        if emit is None:
            return
        tmp = self.verdicts_dir / f"_tmp-{batch_id}"  # readers skip names starting with _
        emit.coalesce(1).write.mode("overwrite").parquet(str(tmp))
        for i, part in enumerate(sorted(tmp.glob("part-*.parquet"))):
            os.replace(part, self.verdicts_dir / f"{prefix}{i:05d}.parquet")
        shutil.rmtree(tmp)

    def _commit(self, batch_id: int, max_ts: float | None, records: str,
                done: dict[str, Any] | None) -> None:
        marker = self.state / "follow.json"
        tmp = self.state / ".follow.json.tmp"
        tmp.write_text(json.dumps({"batch": batch_id, "max_ts": max_ts, "records": records}))
        os.replace(tmp, marker)
        if done is not None and done["records"] != records:
            shutil.rmtree(self.state / done["records"], ignore_errors=True)


def _evidence(records: DataFrame) -> DataFrame:
    """For each (gateway, transport, far gateway) a message crossed in ``records``, three
    records under a reserved trace id (a publish and an export at the gateway, an import at
    the far one), so ``lost_in_transit`` still knows where the transport leads after the
    messages that showed it have left the state. Earlier evidence in ``records`` is kept as
    it is (it is the same crossing)."""
    ex = (records.where(F.col("event") == F.lit(EXPORT))
          .select("trace_id", "gw", F.col("client").alias("via"), "dest"))
    im = (records.where(F.col("event") == F.lit(IMPORT))
          .select("trace_id", F.col("gw").alias("far_gw"), F.col("dest").alias("far_dest_")))
    crossings = (ex.join(im, "trace_id").where(F.col("gw") != F.col("far_gw"))
                 .groupBy("gw", "via", "far_gw")
                 .agg(F.min(F.struct("dest", "far_dest_")).alias("d")))
    key = F.concat(F.lit(EVIDENCE_PREFIX), F.to_json(F.struct("gw", "via", "far_gw")))

    def one(event: str, gw: str, client: Any, dest: str) -> DataFrame:
        cols = {"v": F.lit(1), "ts": F.lit(0.0), "gw": F.col(gw), "event": F.lit(event),
                "trace_id": key, "dest": F.col(dest), "client": client,
                "count": F.lit(0).cast("long")}
        return crossings.select(*[cols.get(f.name, F.lit(None)).cast(f.dataType)
                                  .alias(f.name) for f in DLOG_SCHEMA.fields])

    return (one(PUBLISH, "gw", F.lit(EVIDENCE_PREFIX), "d.dest")
            .unionByName(one(EXPORT, "gw", F.col("via"), "d.dest"))
            .unionByName(one(IMPORT, "far_gw", F.col("via"), "d.far_dest_")))


def read_stream(spark: SparkSession, incoming: Path) -> DataFrame:
    """The records of the segments in ``incoming`` as a stream, read as ``read_dlog`` reads
    files: the explicit schema, malformed lines dropped, unknown versions left out."""
    df = (spark.readStream.schema(DLOG_SCHEMA)
          .option("mode", "DROPMALFORMED")
          .option("pathGlobFilter", SEGMENT_GLOB)
          .json(str(incoming)))
    return only_supported(df)


def follow(spark: SparkSession, paths: Sequence[str], out: str, grace_ms: float,
           skew_ms: float = 0.0, sender_spans_gateways: bool = False,
           link_window_ms: float | None = None, since_ms: float | None = None,
           until_ms: float | None = None, *, trigger_ms: float = DEFAULT_TRIGGER_MS,
           checkpoint: str | None = None, tail_in_thread: bool = True) -> StreamingQuery:
    """Start following the delivery logs under ``paths``: final verdicts are appended to
    ``out``/verdicts as the watermark passes them (module docstring). ``checkpoint``
    (default ``out``/_checkpoint) holds the stream's progress, the state and the copied
    segments; starting again with the same checkpoint goes on where it stopped. The tailer
    polls every ``trigger_ms`` in a thread that ends with the query (with
    ``tail_in_thread`` false, only when the caller calls ``tail``: a test that decides
    which lines each batch sees)."""
    if not paths:
        raise ValueError("no delivery log path given")
    if grace_ms < 0:
        raise ValueError("the grace period cannot be negative")
    if trigger_ms <= 0:
        raise ValueError("the trigger interval must be positive")
    out_dir = Path(out)
    base = Path(checkpoint) if checkpoint is not None else out_dir / "_checkpoint"
    incoming = base / "incoming"
    tailer = Tailer(paths, incoming, skip=[base, out_dir])
    tailer.poll()  # the files there already, before the first trigger
    window = grace_ms if link_window_ms is None else link_window_ms
    reconcile = _Reconcile(out_dir, base / "state", grace_ms, skew_ms,
                           sender_spans_gateways, window)
    query = (between(read_stream(spark, incoming), since_ms, until_ms)
             .writeStream
             .queryName(f"follow-{os.path.realpath(base)}")
             .foreachBatch(reconcile)
             .option("checkpointLocation", str(base / "stream"))
             .trigger(processingTime=f"{int(trigger_ms)} milliseconds")
             .start())
    tailing = threading.Event()  # set: stop feeding the query
    _FOLLOWING[query.id] = _Following(reconcile, tailing)
    if tail_in_thread:
        threading.Thread(target=_tail_while_active,
                         args=(tailer, query, trigger_ms / 1000.0, tailing),
                         name="dlog-tailer", daemon=True).start()
    return query


@dataclass(frozen=True)
class _Following:
    """What ``run`` needs of a query ``follow`` started: its batch function, and the event
    that stops its tailer."""

    reconcile: _Reconcile
    tailing_stopped: threading.Event


_FOLLOWING: dict[str, _Following] = {}  # by the query's id


def tail(paths: Sequence[str], out: str, checkpoint: str | None = None) -> int:
    """Copy what the log files gained into the checkpoint's segments now (what the follow
    thread does every trigger); returns the number of segments written."""
    base = Path(checkpoint) if checkpoint is not None else Path(out) / "_checkpoint"
    return Tailer(paths, base / "incoming", skip=[base, Path(out)]).poll()


def _tail_while_active(tailer: Tailer, query: StreamingQuery, every_s: float,
                       stopped: threading.Event) -> None:
    while not stopped.wait(every_s):
        try:
            if not query.isActive:
                return
        except Exception:  # the session is gone with the query: nothing to feed
            return
        try:
            tailer.poll()
        except OSError as e:  # a full disk, a file unreadable: try again next trigger
            print(f"follow: tailing the delivery logs failed: {e}", file=sys.stderr)


def run(query: StreamingQuery, poll_s: float = 0.5) -> int:
    """Wait on the query until it ends or the process is told to stop (Ctrl-C: SIGINT, or
    SIGTERM from a service manager), then stop it. 0 when stopped so, 1 (the error said on
    stderr) when the query failed.

    Told to stop, it stops tailing and waits until the query is idle: the batch in progress
    and the lines already copied are reconciled, and the query is stopped between triggers.
    Stopping a query interrupts its thread, and a thread interrupted in the middle of a
    batch (writing its checkpoint, say) has Hadoop print a Java stack trace; a query that is
    idle has nothing to interrupt. Told a second time, it stops now: the batch in progress
    is cut short and runs again from the checkpoint next time.

    The wait is a Python wait, not the query's ``awaitTermination``: a signal that arrives
    while the main thread is inside a call to the JVM would otherwise run PySpark's own
    SIGINT handler, which calls the JVM again on the same connection (a reentrant call that
    fails and prints tracebacks). Here the handler only counts. From a thread other than
    the main thread (where no handler can be installed) it waits on the query."""
    if threading.current_thread() is not threading.main_thread():
        try:
            query.awaitTermination()
        except StreamingQueryException:
            pass  # said by _ended
        return _ended(query)
    told: list[int] = []
    stop = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        told.append(signum)
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(poll_s) and query.isActive:
            pass
        if not stop.is_set():
            return _ended(query)
        following = _FOLLOWING.pop(query.id, None)
        if following is not None:
            following.tailing_stopped.set()
        print("follow: stopping once the batch in progress is done "
              "(Ctrl-C again to stop now)", file=sys.stderr)
        pause = threading.Event()  # never set: a wait that is not a busy loop
        while len(told) < 2 and query.isActive and _busy(query):
            pause.wait(poll_s)
        if not query.isActive:
            return _ended(query)
        if following is not None:
            following.reconcile.stopping.set()
        query.stop()
        print("follow: stopped; run it again with the same checkpoint to go on",
              file=sys.stderr)
        return 0
    finally:
        for sig, was in previous.items():
            signal.signal(sig, was)


def _busy(query: StreamingQuery) -> bool:
    """Whether the query is in a trigger or has data it has not run a batch on yet (after
    a batch, until the next trigger looks and finds nothing new)."""
    status = query.status
    return bool(status["isTriggerActive"] or status["isDataAvailable"])


def _ended(query: StreamingQuery) -> int:
    _FOLLOWING.pop(query.id, None)
    failure = query.exception()
    if failure is None:
        return 0
    print(f"follow: the stream failed: {str(failure).splitlines()[0]}", file=sys.stderr)
    return 1
