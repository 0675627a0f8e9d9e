"""``gateway reconcile`` end to end: the console script's module run as a subprocess on
hand-made logs (each run starts its own Spark, on the loopback address, UI off), its errors,
and what it says when pyspark is not there."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from dlogrecords import rec, write_log
from pyspark.sql import SparkSession

from spark.cli import Snapshot, poll
from spark.follow import _FOLLOWING, _Following, _Reconcile, run

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
# A run starts a JVM and runs some thirty Spark jobs: a minute on a quiet machine, several
# on a loaded one. A bound against a hang, never a result.
RUN_TIMEOUT_S = 500
spark_run = pytest.mark.timeout(RUN_TIMEOUT_S + 60)
LOOPBACK = ["--conf", "spark.ui.enabled=false", "--conf", "spark.driver.host=127.0.0.1",
            "--conf", "spark.driver.bindAddress=127.0.0.1"]
LOCAL = ["--master", "local[2]", *LOOPBACK, "--conf", "spark.sql.shuffle.partitions=2"]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def cli_env() -> dict[str, str]:
    # SPARK_LOCAL_IP: every JVM of the run (a cluster's workers too) binds to the loopback
    return {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "TERM": "xterm", "COLUMNS": "120"}


def run_cli(args: list[str], stderr_tty: bool = False, python_args: list[str] | None = None,
            timeout_s: float = RUN_TIMEOUT_S) -> tuple[int, str, str]:
    """Runs ``python -m gateway reconcile ARGS`` from the repository root (so the checkout's
    packages are imported); stdout is a pipe, stderr a pipe or a pseudo-terminal. Returns
    (exit status, stdout, stderr without terminal escapes). The run is a process group of
    its own, killed whole (its JVMs too) if it outlives ``timeout_s`` or the test."""
    cmd = [sys.executable, *(python_args or ["-m", "gateway", "reconcile"]), *args]
    master = slave = -1
    if stderr_tty:
        master, slave = pty.openpty()
    chunks: list[bytes] = []

    def drain() -> None:  # read the terminal while the run writes to it (its buffer is small)
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer has closed it
                return
            if not data:
                return
            chunks.append(data)

    proc = subprocess.Popen(cmd, cwd=ROOT, env=cli_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE,
                            stderr=slave if stderr_tty else subprocess.PIPE,
                            start_new_session=True)
    reader = threading.Thread(target=drain, daemon=True)
    try:
        if stderr_tty:
            os.close(slave)
            reader.start()
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        if stderr_tty:
            reader.join(timeout=30)
            os.close(master)
    if stderr_tty:
        err = b"".join(chunks)
    text = err.decode(errors="replace").replace("\r", "\n")
    return proc.returncode, out.decode(), ANSI.sub("", text) if stderr_tty else text


@pytest.fixture
def logs(tmp_path: Path) -> list[str]:
    """Two gateways' logs: t1 crosses from gw-a to gw-b and is delivered twice there, t2 is
    lost at gw-a, t3 pending at gw-b; one record before --since 1000, one at --until 9000."""
    a = tmp_path / "logs" / "a"
    b = tmp_path / "logs" / "b"
    write_log(a / "dlog-gw-a-20260514T093012-0001.jsonl", [
        rec(500.0, "gw-a", "publish", "before", client="p"),
        rec(1000.0, "gw-a", "publish", "t1", client="p"),
        rec(1001.0, "gw-a", "export", "t1", client="to-b"),
        rec(1100.0, "gw-a", "publish", "t2", client="p"),
    ])
    write_log(b / "dlog-gw-b-20260514T093012-0001.jsonl", [
        rec(1005.0, "gw-b", "import", "t1", client="from-a"),
        rec(1006.0, "gw-b", "deliver", "t1", client="c", count=1),
        rec(1007.0, "gw-b", "redeliver", "t1", client="c", count=2),
        rec(5000.0, "gw-b", "publish", "t3", client="p"),
        rec(9000.0, "gw-b", "publish", "after", client="p"),
    ])
    return [str(a), str(b)]


def route(gw: str, exit_: str | None, via: str | None, messages: int, loss: float,
          dup: float, latency: float | None = None, **counts: int) -> dict[str, object]:
    """One route of ``--json``: ``summary.route_totals``'s row (one latency for all of its
    percentiles and maximum: the test's routes deliver at most one copy each)."""
    names = ["delivered", "late", "lost", "pending", "lost_in_transit", "duplicated",
             "changed", "reordered", "expired", "dead_lettered", "dropped", "discarded"]
    unknown = set(counts) - set(names)
    assert not unknown, unknown
    return {"gw": gw, "dest": "topic:t", "exit": exit_, "via": via, "messages": messages,
            **{n: counts.get(n, 0) for n in names}, "loss_rate": loss, "duplicate_rate": dup,
            **{k: latency for k in ("latency_p50_ms", "latency_p95_ms", "latency_p99_ms",
                                    "latency_max_ms")}}


@spark_run
def test_reconcile_json_on_stdout_verdicts_in_out_and_a_progress_bar_on_a_terminal(
        logs: list[str], tmp_path: Path):
    out = tmp_path / "out"
    rc, stdout, stderr = run_cli(
        [*logs, "--out", str(out), "--grace-ms", "1000", "--skew-ms", "500",
         "--since", "1000", "--until", "1970-01-01T00:00:09Z", "--format", "json", "--json",
         *LOCAL], stderr_tty=True)

    assert rc == 0, stderr
    result = json.loads(stdout)  # the one object, nothing else on stdout
    assert result == {
        "out": str(out),
        "records": 7,  # 9 written, one before --since, one at --until
        "verdicts": {"delivered": 2, "duplicated": 1, "lost": 1, "pending": 1},
        "routes": [
            # an entry's messages are all that entered: t1 and t2 at gw-a, t1 and t3 at gw-b
            route("gw-a", None, None, 2, 0.5, 0.0, lost=1),
            route("gw-a", "export", "to-b", 1, 0.0, 0.0, 1.0, delivered=1),
            route("gw-b", None, None, 2, 0.0, 0.0, pending=1),
            route("gw-b", "deliver", None, 1, 0.0, 1.0, 1.0, delivered=1, duplicated=1),
        ],
    }
    rows = [json.loads(line) for part in sorted((out / "verdicts").glob("part-*.json"))
            for line in part.read_text().splitlines()]
    assert sorted((r["verdict"], r["trace_id"], r["gw"]) for r in rows) == [
        ("delivered", "t1", "gw-a"), ("delivered", "t1", "gw-b"), ("duplicated", "t1", "gw-b"),
        ("lost", "t2", "gw-a"), ("pending", "t3", "gw-b")]
    # the bar's last state, drawn after the work: every job of the run finished
    bars = re.findall(r"Spark: (\d+)/(\d+) jobs.*?(\d+)/(\d+) tasks", stderr)
    assert bars, stderr
    jobs_done, jobs, tasks_done, tasks = map(int, bars[-1])
    assert jobs_done == jobs > 0 and tasks_done == tasks > 0


@spark_run
def test_reconcile_prints_verdict_counts_and_no_bar_with_no_progress(
        logs: list[str], tmp_path: Path):
    out = tmp_path / "out"
    rc, stdout, stderr = run_cli(
        [*logs, "--out", str(out), "--grace-ms", "1000", "--since", "1000", "--until",
         "9000", "--no-progress", *LOCAL], stderr_tty=True)

    assert rc == 0, stderr
    assert stdout == "delivered\t2\nduplicated\t1\nlost\t1\npending\t1\n"
    assert (out / "verdicts" / "_SUCCESS").exists()
    assert list((out / "verdicts").glob("part-*.parquet"))
    assert "Spark: " not in stderr and " tasks" not in stderr


@pytest.mark.parametrize(("args", "says"), [
    (["{missing}", "--out", "{out}"], "no such delivery-log path: {missing}"),
    (["{logs}", "--out", "{out}", "--since", "yesterday"],
     "argument --since: not epoch milliseconds or an ISO 8601 time: 'yesterday'"),
    (["{logs}", "--out", "{out}", "--until", "2026-13-01"],
     "argument --until: not epoch milliseconds or an ISO 8601 time: '2026-13-01'"),
    (["{logs}"], "the following arguments are required: --out"),
])
def test_reconcile_errors_are_one_line_and_exit_2(
        logs: list[str], tmp_path: Path, args: list[str], says: str):
    names = {"missing": str(tmp_path / "no-such-dir"), "out": str(tmp_path / "out"),
             "logs": logs[0]}
    rc, stdout, stderr = run_cli([a.format(**names) for a in args])

    assert rc == 2
    assert stdout == ""
    assert stderr == f"gateway reconcile: {says.format(**names)}\n"
    assert not (tmp_path / "out").exists()


# Hides pyspark from the interpreter as if it were not installed, then runs the console
# script's main as installed (gateway.cli:main).
HIDE_PYSPARK = """
import sys
class HidePyspark:
    def find_spec(self, name, path=None, target=None):
        if name == "pyspark" or name.startswith("pyspark."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, HidePyspark())
from gateway.cli import main
sys.exit(main())
"""


def test_reconcile_without_pyspark_says_what_to_install(logs: list[str], tmp_path: Path):
    rc, stdout, stderr = run_cli(["reconcile", logs[0], "--out", str(tmp_path / "out")],
                                 python_args=["-c", HIDE_PYSPARK])

    assert rc == 2
    assert stdout == ""
    assert stderr.count("\n") == 1 and "Traceback" not in stderr
    assert "pip install 'gateway[spark]'" in stderr


def test_poll_counts_the_jobs_and_tasks_of_a_group(spark: SparkSession):
    sc = spark.sparkContext
    sc.setJobGroup("test-poll", "a progress test")
    try:
        assert sc.parallelize(range(100), 4).map(lambda x: x * 2).sum() == 9900
        assert sc.parallelize(range(10), 3).count() == 10
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]

    snap = poll(sc, "test-poll", Snapshot())

    assert (snap.jobs_done, snap.jobs) == (2, 2)
    assert (snap.tasks_done, snap.tasks) == (7, 7)
    assert snap.stage is None
    assert poll(sc, "no-such-group", Snapshot()).jobs == 0


@spark_run
def test_follow_stops_cleanly_on_ctrl_c(tmp_path: Path):
    """``--follow`` runs until stopped: Ctrl-C (SIGINT to the terminal's whole process group,
    the JVM included) ends it with status 0, one line on stderr and no traceback."""
    logs = tmp_path / "logs"
    write_log(logs / "dlog-gw-a-20260514T093012-0001.jsonl", [
        rec(1000.0, "gw-a", "publish", "t1", client="p"),
        rec(1001.0, "gw-a", "deliver", "t1", client="c", count=1),
        rec(5000.0, "gw-a", "publish", "t2", client="p"),  # moves the watermark past t1
    ])
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "gateway", "reconcile", str(logs), "--out", str(out),
           "--follow", "--grace-ms", "1000", "--trigger-ms", "200", *LOCAL]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=cli_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not list((out / "verdicts").glob("part-*.parquet")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no verdict was written"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    err = stderr.decode(errors="replace")
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Exception" not in err, err
    assert "follow: stopped; run it again with the same checkpoint to go on" in err
    assert stdout == b""


class StandInQuery:
    """What ``follow.run`` uses of a streaming query, without Spark. ``busy`` is whether it
    is in a trigger or has data not run yet."""

    def __init__(self, batch_function: Any = None, busy: bool = False) -> None:
        self.id = "stand-in"
        self.isActive = True
        self.busy = busy
        self.stopped = threading.Event()
        self.batch_function = batch_function
        self.told_first = False  # the batch function knew of the stop before it came
        self.busy_when_stopped: bool | None = None

    @property
    def status(self) -> dict[str, Any]:
        return {"message": "", "isDataAvailable": False, "isTriggerActive": self.busy}

    def stop(self) -> None:
        if self.batch_function is not None:
            self.told_first = self.batch_function.stopping.is_set()
        self.busy_when_stopped = self.busy
        self.isActive = False
        self.stopped.set()

    def exception(self) -> None:
        return None


def follow_stand_in(tmp_path: Path, busy: bool) -> tuple[StandInQuery, threading.Event]:
    """A stand-in query registered as ``follow`` registers its own; the event stops its
    (absent) tailer."""
    batch_function = _Reconcile(tmp_path / "out", tmp_path / "state", 1000.0, 0.0, False, 0.0)
    query = StandInQuery(batch_function, busy)
    tailing_stopped = threading.Event()
    _FOLLOWING[query.id] = _Following(batch_function, tailing_stopped)
    return query, tailing_stopped


STOPPING = "follow: stopping once the batch in progress is done (Ctrl-C again to stop now)\n"
STOPPED = "follow: stopped; run it again with the same checkpoint to go on\n"


def run_told(query: StandInQuery, sig: signal.Signals = signal.SIGINT, times: int = 1) -> int:
    """``run(query)``, sent ``sig`` ``times`` times (0.3 s apart) once ``run`` has put its
    handler in place (so the signal never reaches the test runner's own handler)."""
    before = signal.getsignal(sig)

    def send() -> None:
        deadline = time.monotonic() + 60
        while signal.getsignal(sig) is before and time.monotonic() < deadline:
            time.sleep(0.01)
        for i in range(times):
            time.sleep(0.3 if i else 0.0)
            os.kill(os.getpid(), sig)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        return run(query, poll_s=0.02)  # type: ignore[arg-type]
    finally:
        sender.join()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_follow_run_stops_the_query_on_sigint_or_sigterm(
        sig: signal.Signals, capsys: pytest.CaptureFixture[str], tmp_path: Path):
    """A service manager's SIGTERM stops a follow run as Ctrl-C does, and the handlers
    that were there before are put back. The tailer is stopped, and the query's batch
    function is told before the query is stopped (so a batch cut short says so briefly)."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    query, tailing_stopped = follow_stand_in(tmp_path, busy=False)
    assert run_told(query, sig) == 0
    assert query.stopped.is_set() and query.told_first and tailing_stopped.is_set()
    assert query.id not in _FOLLOWING
    assert capsys.readouterr().err == STOPPING + STOPPED
    assert {s: signal.getsignal(s) for s in before} == before


def test_follow_run_waits_for_the_batch_in_progress(capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path):
    """Told to stop while a batch runs, ``run`` stops the query only once it is idle, the
    tailer already stopped (so no new batch begins)."""
    query, tailing_stopped = follow_stand_in(tmp_path, busy=True)

    def idle_later() -> None:  # the batch in progress ends a while after the signal
        tailing_stopped.wait(60)
        time.sleep(0.3)
        query.busy = False

    waiter = threading.Thread(target=idle_later)
    waiter.start()
    try:
        assert run_told(query) == 0
    finally:
        waiter.join()
    assert tailing_stopped.is_set()
    assert query.busy_when_stopped is False
    assert capsys.readouterr().err == STOPPING + STOPPED


def test_follow_run_stops_now_when_told_twice(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path):
    """A second Ctrl-C stops the query in the middle of its batch (run again from the
    checkpoint next time)."""
    query, _ = follow_stand_in(tmp_path, busy=True)  # busy until stopped
    assert run_told(query, times=2) == 0
    assert query.busy_when_stopped is True and query.told_first
    assert capsys.readouterr().err == STOPPING + STOPPED
