"""The delivery log: fields, files, rotation, shutdown, and the hot-path cost (printed).

Most tests run twice: with the writer process (the default) and in-process. The writer
process has its own tests at the end: the flush barrier, close, the process killed (the log
takes over without losing or repeating a record), the gateway killed (the process writes
what it received), and the bound on pending records.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from corehelp import not_compiled

from gateway import dlog, dlog_format
from gateway.dlog import DeliveryLog
from gateway.dlog_format import EVENTS, FIELDS, SCHEMA_VERSION
from gateway.dlog_writer import unreported_lines
from gateway.message import DeliveryMode, Destination, Message

MakeLog = Callable[..., DeliveryLog]

ROOT = Path(__file__).resolve().parents[2]
NAME_RE = re.compile(r"^dlog-(?P<gw>.+)-(?P<stamp>\d{8}T\d{6})-(?P<seq>\d{4})\.jsonl$")
V1_KEYS = [
    "v", "ts", "gw", "event", "trace_id", "msg_id", "dest", "client", "count", "mode",
    "size", "reason",
]  # fmt: skip
EXPECTED_KEYS = [*V1_KEYS, "body_hash", "props_hash", "rules", "far_id", "far_dest", "lost"]
HELLO = hashlib.blake2b(b"hello", digest_size=8).hexdigest()
NO_EXTRA = {"rules": None, "far_id": None, "far_dest": None, "lost": None}


def make_msg(n: int = 1, mode: DeliveryMode = DeliveryMode.PERSISTENT) -> Message:
    m = Message.text("hello", delivery_mode=mode, message_id=f"ID:gw1-{n}")
    m.trace_id = f"trace-{n}"
    m.size = 100 + n
    return m


@pytest.fixture(params=["process", "in-process"])
def make_log(request: pytest.FixtureRequest) -> Iterator[MakeLog]:
    """DeliveryLog(...) with a writer process, or ``in_process=True``."""
    made: list[DeliveryLog] = []

    def make(*args: Any, **kwargs: Any) -> DeliveryLog:
        kwargs.setdefault("in_process", request.param == "in-process")
        made.append(DeliveryLog(*args, **kwargs))
        return made[-1]

    yield make
    for log in made:  # a failed test must not leave a writer process behind
        if log._child is not None:
            log._child.stop()


def read_lines(directory: Path) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for f in sorted(directory.iterdir()):
        for line in f.read_text("utf-8").splitlines():
            out.append(json.loads(line))
    return out


def test_every_field_is_written(tmp_path: Path, make_log: MakeLog) -> None:
    log = make_log(str(tmp_path), "gw1")
    before = time.time() * 1000
    log.record("publish", make_msg(1), "topic:a.b", "conn-7")
    log.record("deliver", make_msg(2, DeliveryMode.NON_PERSISTENT), "queue:q1", "conn-8", 1)
    log.record("drop", make_msg(3, DeliveryMode.RELIABLE), "topic:x", None, 0, "exceeded")
    after = time.time() * 1000
    log.flush()
    assert log.records_written == 3
    files = list(tmp_path.iterdir())
    assert len(files) == 1
    text = files[0].read_text("ascii")
    lines = text.splitlines()
    assert text.endswith("\n") and len(lines) == 3
    recs = [json.loads(line) for line in lines]
    for r in recs:
        assert list(r) == EXPECTED_KEYS
        assert r["v"] == 2
        assert r["gw"] == "gw1"
        assert isinstance(r["ts"], float) and before - 1 <= r["ts"] <= after + 1
    assert {k: v for k, v in recs[0].items() if k != "ts"} == {
        "v": 2, "gw": "gw1", "event": "publish", "trace_id": "trace-1", "msg_id": "ID:gw1-1",
        "dest": "topic:a.b", "client": "conn-7", "count": 0, "mode": "PERSISTENT",
        "size": 101, "reason": None, "body_hash": HELLO, "props_hash": None, **NO_EXTRA,
    }  # fmt: skip
    assert {k: v for k, v in recs[1].items() if k != "ts"} == {
        "v": 2, "gw": "gw1", "event": "deliver", "trace_id": "trace-2", "msg_id": "ID:gw1-2",
        "dest": "queue:q1", "client": "conn-8", "count": 1, "mode": "NON_PERSISTENT",
        "size": 102, "reason": None, "body_hash": HELLO, "props_hash": None, **NO_EXTRA,
    }  # fmt: skip
    assert {k: v for k, v in recs[2].items() if k != "ts"} == {
        "v": 2, "gw": "gw1", "event": "drop", "trace_id": "trace-3", "msg_id": "ID:gw1-3",
        "dest": "topic:x", "client": None, "count": 0, "mode": "RELIABLE",
        "size": 103, "reason": "exceeded", "body_hash": HELLO, "props_hash": None, **NO_EXTRA,
    }  # fmt: skip
    assert recs[0]["ts"] <= recs[1]["ts"] <= recs[2]["ts"]
    log.close()


def test_a_message_head_is_made_once_and_shared(tmp_path: Path, make_log: MakeLog) -> None:
    """The head (trace id, message id, mode, size, body, properties) is made at a message's
    first record and kept on it; a copy starts without one."""
    log = make_log(str(tmp_path), "gw1")
    m = make_msg(1)
    log.record("publish", m, "topic:a", "p")
    head = m.log_head
    assert head == ("trace-1", "ID:gw1-1", 2, 101, "hello", None) and type(head[2]) is int
    log.record("deliver", m, "topic:a", "c1", 1)
    log.record("deliver", m, "topic:a", "c2", 1)
    assert m.log_head is head
    assert m.copy().log_head is None
    other = make_msg(2)
    log.record("ack", other, "topic:a", "c1", 1)
    log.flush()
    recs = read_lines(tmp_path)
    assert [(r["event"], r["client"], r["msg_id"], r["trace_id"], r["size"]) for r in recs] == [
        ("publish", "p", "ID:gw1-1", "trace-1", 101), ("deliver", "c1", "ID:gw1-1", "trace-1", 101),
        ("deliver", "c2", "ID:gw1-1", "trace-1", 101), ("ack", "c1", "ID:gw1-2", "trace-2", 102),
    ]  # fmt: skip
    log.close()


@pytest.mark.parametrize("t, ts", [
    (1795753077.436842, "1795753077436.842"), (1795753077.0, "1795753077000.000"),
    (1795753077.4369996, "1795753077437.000"), (0.0, "0.000"), (12.000001, "12000.001"),
])  # fmt: skip
def test_ts_is_milliseconds_with_three_decimals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, t: float, ts: str
) -> None:
    monkeypatch.setattr(dlog, "_time", lambda: t)
    log = DeliveryLog(str(tmp_path), "gw1", in_process=True)
    log.record("publish", make_msg(1), "topic:a", "p")
    log.close()
    (line,) = all_lines(tmp_path)
    assert line.startswith('{"v":2,"ts":' + ts + ',"gw":"gw1",')
    assert json.loads(line)["ts"] == float(ts)


def test_format_records_matches_json_for_every_line() -> None:
    """Pieces the formatter reuses within a batch (heads, destination and client, the
    millisecond) never leak into a line they do not belong to."""
    bodies = [None, "text", b"bytes", 12345, b"\x01props"]
    heads = [(f"t{i}", f"ID:{i}", [1, 2, 22][i % 3], i * 7, bodies[i % 5], bodies[(i + 2) % 5])
             for i in range(50)]
    flat: list[object] = []
    expected = []
    for i in range(600):
        t = 1795753077.0 + i * 0.0003
        head = heads[(i * 7) % 50]
        event = dlog_format.EVENTS[i % len(dlog_format.EVENTS)]
        dest, client = f"topic:d{i % 4}", (None if i % 5 == 0 else f"c{i % 3}")
        count, reason = i % 4, (None if i % 6 else "why")
        extra = None if i % 7 else ("rules-a", f"far-{i}", None, i if i % 2 else None)
        flat += (t, event, head, dest, client, count,
                 reason if extra is None else (reason, *extra))
        expected.append({
            "v": 2, "ts": round(t * 1000, 3), "gw": "gw9", "event": event, "trace_id": head[0],
            "msg_id": head[1], "dest": dest, "client": client, "count": count,
            "mode": DeliveryMode(head[2]).name, "size": head[3], "reason": reason,
            "body_hash": hash_of(head[4]), "props_hash": hash_of(head[5]),
            **(NO_EXTRA if extra is None else dict(zip(EXPECTED_KEYS[-4:], extra, strict=True))),
        })  # fmt: skip
    lines = dlog_format.format_records(flat, "gw9").decode("ascii").splitlines()
    assert [json.loads(line) for line in lines] == expected


def hash_of(v: object) -> str | None:
    """A head's hash slot as the log writes it, computed independently."""
    if v is None:
        return None
    if isinstance(v, int):
        return v.to_bytes(8, "big").hex()
    data = v.encode() if isinstance(v, str) else v
    assert isinstance(data, bytes)
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def test_constants_match_the_schema() -> None:
    assert SCHEMA_VERSION == 2
    assert EXPECTED_KEYS[: len(V1_KEYS)] == V1_KEYS  # version 2 keeps version 1's keys
    assert list(FIELDS) == EXPECTED_KEYS
    assert set(EVENTS) == {
        "publish", "deliver", "ack", "redeliver", "expire", "drop", "discard",
        "undeliverable", "import", "export", "reject",
    }  # fmt: skip


def test_schema_document_covers_every_field_and_event() -> None:
    doc = (ROOT / "docs" / "delivery-log.md").read_text("utf-8")
    for name in [*EXPECTED_KEYS, *EVENTS]:
        assert f"| `{name}` |" in doc, name


def test_destination_object_and_odd_values(tmp_path: Path, make_log: MakeLog) -> None:
    log = make_log(str(tmp_path), 'gw/"ü"')
    m = make_msg(1)
    m.message_id = 'quote" back\\ nl\n ü \udcff'
    m.trace_id = None
    log.record("import", m, Destination.topic("a.b"), "rv-1")
    m2 = make_msg(2)
    m2.size = 0
    log.record("export", m2, Destination.queue("q"), "mqtt-up", 3)
    log.flush()
    (f,) = tmp_path.iterdir()
    assert NAME_RE.match(f.name)
    assert f.name.startswith("dlog-gw____-")  # '/', '"' and 'ü' are not file-name safe
    raw = f.read_bytes()
    assert raw.isascii()
    r1, r2 = (json.loads(x) for x in raw.splitlines())
    assert r1["gw"] == 'gw/"ü"'
    assert r1["msg_id"] == 'quote" back\\ nl\n ü \udcff'
    assert r1["trace_id"] is None
    assert r1["dest"] == "topic:a.b" and r1["event"] == "import" and r1["client"] == "rv-1"
    assert r2["dest"] == "queue:q" and r2["count"] == 3 and r2["size"] == 0
    log.close()


@not_compiled
def test_bad_values_do_not_lose_the_batch(tmp_path: Path, make_log: MakeLog) -> None:
    log = make_log(str(tmp_path), "gw1")
    log.record("deliver", make_msg(1), "topic:a", "c", 1)
    bad = make_msg(2)
    bad.size = "big"  # type: ignore[assignment]
    log.record("deliver", bad, "topic:a", "c", None)  # type: ignore[arg-type]
    odd = make_msg(3)
    odd.delivery_mode = 99  # type: ignore[assignment]  # no such mode
    odd.message_id = b"bytes-id"  # type: ignore[assignment]
    log.record("not-an-event", odd, "topic:a", "c", 2)
    log.flush()
    recs = read_lines(tmp_path)
    assert [r["msg_id"] for r in recs] == ["ID:gw1-1", "ID:gw1-2", "bytes-id"]
    assert recs[1]["size"] == 0 and recs[1]["count"] == 0
    assert recs[2]["mode"] == "99" and recs[2]["event"] == "not-an-event"
    assert recs[0]["mode"] == "PERSISTENT" and recs[0]["size"] == 101
    assert log.records_written == 3
    log.close()


def test_rotation(tmp_path: Path, make_log: MakeLog) -> None:
    log = make_log(str(tmp_path), "gw1", max_file_bytes=1000)
    n = 0
    for _ in range(12):
        for _ in range(3):
            n += 1
            log.record("ack", make_msg(n), "queue:q", "c", 1)
        log.flush()
    log.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(os.path.basename(p) for p in log.files)
    assert len(names) >= 3
    seqs = [int(NAME_RE.match(name).group("seq")) for name in names]  # type: ignore[union-attr]
    assert seqs == list(range(1, len(names) + 1))
    for name in names[:-1]:  # every closed file passed the limit; a batch is never split
        size = (tmp_path / name).stat().st_size
        assert 1000 <= size < 1000 + 3 * 400
    ids = [r["msg_id"] for r in read_lines(tmp_path)]
    assert ids == [f"ID:gw1-{i}" for i in range(1, n + 1)]


def test_close_flushes_and_stops_the_thread(tmp_path: Path, make_log: MakeLog) -> None:
    log = make_log(str(tmp_path), "gw1", flush_interval=3600)
    log.start()
    thread = log._writer_thread
    assert thread is not None and thread.is_alive()
    child = log._child
    assert (child is None) == log.in_process
    for i in range(50):
        log.record("publish", make_msg(i), "topic:t", "p")
    log.close()
    assert not thread.is_alive()
    if child is not None:  # the writer process finished on its own, cleanly
        assert child.proc.returncode == 0 and log._child is None
        assert log.write_errors == 0 and not log.in_process
    assert [r["msg_id"] for r in read_lines(tmp_path)] == [f"ID:gw1-{i}" for i in range(50)]
    assert log.records_written == 50
    log.record("publish", make_msg(99), "topic:t", "p")  # after close: ignored
    log.flush()
    assert len(read_lines(tmp_path)) == 50


def test_close_without_start_writes_everything(tmp_path: Path, make_log: MakeLog) -> None:
    log = make_log(str(tmp_path), "gw1")
    log.record("publish", make_msg(1), "topic:t", "p")
    log.close()
    assert [r["msg_id"] for r in read_lines(tmp_path)] == ["ID:gw1-1"]


def wait_for(cond: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail("condition not reached")
        time.sleep(0.01)


def test_background_writer_flushes_on_its_own(tmp_path: Path, make_log: MakeLog) -> None:
    log = make_log(str(tmp_path), "gw1", flush_interval=0.02)
    log.start()
    log.record("expire", make_msg(1), "queue:q", None, 0, "expired")
    wait_for(lambda: log.records_written == 1)
    assert read_lines(tmp_path)[0]["event"] == "expire"
    log.close()


def test_writer_wakes_early_on_a_full_batch(tmp_path: Path, make_log: MakeLog) -> None:
    log = make_log(str(tmp_path), "gw1", flush_interval=3600)
    log.start()
    m = make_msg(1)
    for _ in range(dlog.BATCH_RECORDS):
        log.record("deliver", m, "topic:t", "c", 1)
    wait_for(lambda: log.records_written >= dlog.BATCH_RECORDS)
    log.close()
    assert log.records_written == dlog.BATCH_RECORDS


def test_concurrent_recording_loses_nothing(tmp_path: Path, make_log: MakeLog) -> None:
    """Three threads record while the writer drains every millisecond.

    Probabilistic: with the pending list *swapped* instead of sliced, this lost records in
    about one run in six.
    """
    log = make_log(str(tmp_path), "gw1", flush_interval=0.001, max_file_bytes=1 << 20)
    log.start()
    msgs = [make_msg(i) for i in range(1000)]
    per_thread = 30_000

    def produce(k: int) -> None:
        for i in range(per_thread):
            log.record("deliver", msgs[i % 1000], "topic:t", f"c{k}", i)

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    recs = read_lines(tmp_path)
    assert len(recs) == 3 * per_thread == log.records_written
    for k in range(3):  # each producer's records all there, in its own order
        counts = [r["count"] for r in recs if r["client"] == f"c{k}"]
        assert counts == list(range(per_thread))


def test_failed_write_is_retried_in_a_new_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In-process mode: ``os.write`` fails in this process (see the test below for the
    writer process)."""
    log = DeliveryLog(str(tmp_path), "gw1", in_process=True)
    for i in range(3):
        log.record("publish", make_msg(i), "topic:t", "p")
    log.flush()
    real_write = os.write
    calls = []

    def failing_write(fd: int, data: object) -> int:
        calls.append(1)
        if len(calls) == 1:
            return real_write(fd, bytes(data)[:450])  # type: ignore[call-overload]
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", failing_write)
    for i in range(3, 6):
        log.record("publish", make_msg(i), "topic:t", "p")
    with pytest.raises(OSError):
        log.flush()
    assert log.write_errors == 1
    monkeypatch.setattr(os, "write", real_write)
    log.record("publish", make_msg(6), "topic:t", "p")
    log.flush()
    log.close()
    assert len(log.files) == 2
    ids = []
    for f in log.files:
        for line in Path(f).read_text("ascii").splitlines():
            try:
                ids.append(json.loads(line)["msg_id"])
            except json.JSONDecodeError:
                ids.append("<cut>")  # the line the failed write cut short
    assert ids == [
        *(f"ID:gw1-{i}" for i in range(4)),
        "<cut>",
        *(f"ID:gw1-{i}" for i in range(4, 7)),
    ]
    assert log.records_written == 7


def test_same_second_files_do_not_collide(tmp_path: Path, make_log: MakeLog) -> None:
    a = make_log(str(tmp_path), "gw1")
    b = make_log(str(tmp_path), "gw1")
    a.record("ack", make_msg(1), "queue:q", "c")
    b.record("ack", make_msg(2), "queue:q", "c")
    a.flush()
    b.flush()
    a.close()
    b.close()
    assert len(set(a.files) | set(b.files)) == 2
    assert sorted(str(r["msg_id"]) for r in read_lines(tmp_path)) == ["ID:gw1-1", "ID:gw1-2"]


def test_disabled_writes_nothing(tmp_path: Path) -> None:
    d = tmp_path / "logs"
    log = DeliveryLog(str(d), "gw1", enabled=False)
    log.start()
    assert log._writer_thread is None and log._child is None
    log.record("publish", make_msg(1), "topic:t", "p")
    log.flush()
    log.close()
    assert not d.exists()
    assert log.records_written == 0
    assert log._child is None  # no writer process was started


def test_record_hot_path_cost(tmp_path: Path, make_log: MakeLog) -> None:
    """Micro-benchmark: printed, never asserted (no timed tests)."""
    n = 200_000
    m = make_msg(1)
    log = make_log(str(tmp_path), "gw1")
    rec = log.record
    t0 = time.perf_counter()
    for _ in range(n):
        rec("deliver", m, "topic:a.b", "conn-1", 1)
    t_on = time.perf_counter() - t0
    t0 = time.perf_counter()
    log.flush()
    t_fmt = time.perf_counter() - t0
    log.close()
    off = DeliveryLog(str(tmp_path / "off"), "gw1", enabled=False)
    t0 = time.perf_counter()
    for _ in range(n):
        off.record("deliver", m, "topic:a.b", "conn-1", 1)
    t_off = time.perf_counter() - t0
    print(
        f"\n{'in-process' if log.in_process else 'writer process'}: "
        f"record(): {t_on / n * 1e9:.0f} ns/call enabled, {t_off / n * 1e9:.0f} ns/call "
        f"disabled; writer: {t_fmt / n * 1e9:.0f} ns/record to format and write"
    )
    assert log.records_written == n


# -- the writer process ------------------------------------------------------------------


def all_lines(directory: Path) -> list[str]:
    """Every line of every file, in file (seq) order; a cut line is kept as it is."""
    out: list[str] = []
    for f in sorted(directory.iterdir()):
        out += f.read_text("ascii").splitlines()
    return out


def ids_in(directory: Path) -> list[str]:
    """The msg_id of every line; each line must be a whole record."""
    return [str(json.loads(line)["msg_id"]) for line in all_lines(directory)]


def test_failed_write_in_the_writer_process_is_retried_in_a_new_file(tmp_path: Path) -> None:
    """A real write error in the writer process: its files may not pass 1500 bytes
    (RLIMIT_FSIZE, inherited when it starts), so the second batch is cut short."""
    log = DeliveryLog(str(tmp_path), "gw1")
    for i in range(3):
        log.record("publish", make_msg(i), "topic:t", "p")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1500, hard))
    try:
        log.flush()  # starts the writer process, which keeps the limit
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert log._child is not None and log.records_written == 3
    for i in range(3, 6):
        log.record("publish", make_msg(i), "topic:t", "p")
    with pytest.raises(OSError) as err:
        log.flush()
    assert err.value.errno == 27  # EFBIG
    assert log.write_errors == 1
    written = log.records_written
    assert 3 <= written < 6
    log.record("publish", make_msg(6), "topic:t", "p")
    log.flush()
    log.close()
    assert len(log.files) == 2
    first = Path(log.files[0]).read_bytes()
    assert len(first) == 1500 and not first.endswith(b"\n")  # cut at the limit
    ids = []
    for f in log.files:
        for line in Path(f).read_text("ascii").splitlines():
            try:
                ids.append(json.loads(line)["msg_id"])
            except json.JSONDecodeError:
                ids.append("<cut>")
    assert ids == [
        *(f"ID:gw1-{i}" for i in range(written)),
        "<cut>",
        *(f"ID:gw1-{i}" for i in range(written, 7)),
    ]
    assert log.records_written == 7 and log.write_errors == 1 and not log.in_process


def test_flush_is_a_barrier(tmp_path: Path) -> None:
    """Once flush() returns, every record recorded before it is in the files."""
    log = DeliveryLog(str(tmp_path), "gw1", flush_interval=3600, max_file_bytes=1 << 20)
    log.start()
    n = 0
    for size in (25_000, 1, 3, dlog.BATCH_RECORDS, 7):
        for _ in range(size):
            log.record("deliver", make_msg(n), "topic:t", "c", 1)
            n += 1
        log.flush()
        ids = ids_in(tmp_path)  # read at once: no waiting
        assert len(ids) == n == log.records_written
        assert ids[-1] == f"ID:gw1-{n - 1}"
    assert ids == [f"ID:gw1-{i}" for i in range(n)]
    assert log._child is not None and not log.in_process
    log.close()


@pytest.mark.parametrize("n", [dlog.CHUNK_RECORDS + 1, 25_000, 3 * dlog.BATCH_RECORDS - 1])
def test_flush_and_close_without_a_writer_thread(tmp_path: Path, make_log: MakeLog, n: int) -> None:
    """Many sealed chunks and a partial one: flush() and close() still write them all."""
    log = make_log(str(tmp_path / "a"), "gw1")
    m = make_msg(1)
    for i in range(n):
        log.record("deliver", m, "topic:t", "c", i)
    log.flush()
    assert log.records_written == n
    log.close()
    log = make_log(str(tmp_path / "b"), "gw1")
    for i in range(n):
        log.record("deliver", m, "topic:t", "c", i)
    log.close()
    assert log.records_written == n
    for d in ("a", "b"):
        counts = [json.loads(line)["count"] for line in all_lines(tmp_path / d)]
        assert counts == list(range(n))


def test_close_loses_nothing_and_ends_the_process(tmp_path: Path) -> None:
    log = DeliveryLog(str(tmp_path), "gw1", flush_interval=0.005, max_file_bytes=200_000)
    log.start()
    child = log._child
    assert child is not None

    def produce(k: int) -> None:
        for i in range(20_000):
            log.record("ack", make_msg(i), "queue:q", f"c{k}", i)

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()  # with records still pending and batches in the pipe
    assert child.proc.returncode == 0 and child.dead
    recs = read_lines(tmp_path)
    assert len(recs) == 60_000 == log.records_written
    for k in range(3):
        assert [r["count"] for r in recs if r["client"] == f"c{k}"] == list(range(20_000))
    assert len(log.files) > 3  # rotated while writing
    assert log.write_errors == 0 and not log.in_process


def wait_until_gone(pid: int, timeout: float = 30.0) -> None:
    """Until process ``pid`` has exited (gone, or a zombie nobody reaps)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return
        if state in ("Z", "X"):
            return
        if time.monotonic() > deadline:
            pytest.fail(f"process {pid} is still running")
        time.sleep(0.02)


def test_killed_writer_process_falls_back_without_loss(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = DeliveryLog(str(tmp_path), "gw1", flush_interval=0.01, max_file_bytes=50_000)
    log.start()
    child = log._child
    assert child is not None
    for i in range(1000):
        log.record("publish", make_msg(i), "topic:t", "p")
    log.flush()
    os.kill(child.pid, signal.SIGKILL)
    for i in range(1000, 2000):
        log.record("publish", make_msg(i), "topic:t", "p")
    wait_for(lambda: log.in_process)  # the writer thread noticed and took over
    for i in range(2000, 3000):
        log.record("publish", make_msg(i), "topic:t", "p")
    log.flush()
    assert ids_in(tmp_path) == [f"ID:gw1-{i}" for i in range(3000)]
    log.close()
    assert len(log.files) > 2  # it rotated before and after the takeover
    assert log.records_written == 3000 and log.write_errors == 1
    assert log._child is None and child.proc.returncode == -signal.SIGKILL
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "ended unexpectedly" in errors[0].getMessage()
    seqs = [NAME_RE.match(Path(f).name) for f in log.files]
    assert [int(s.group("seq")) for s in seqs if s] == list(range(1, len(seqs) + 1))


@pytest.mark.parametrize("delay", [0.0, 0.03, 0.1])
def test_writer_process_killed_under_load(tmp_path: Path, delay: float) -> None:
    """Killed while writing: what it wrote but had not reported is found in the files, a
    line cut by the kill is cut off, and the rest is written in-process -- every record
    exactly once, in order, every line whole."""
    log = DeliveryLog(str(tmp_path), "gw1", flush_interval=0.001, max_file_bytes=300_000)
    log.start()
    child = log._child
    assert child is not None
    n = 150_000
    msgs = [make_msg(i) for i in range(1000)]

    def produce() -> None:
        for i in range(n):
            log.record("deliver", msgs[i % 1000], "topic:t", "c", i)

    t = threading.Thread(target=produce)
    t.start()
    wait_for(lambda: log.records_written > 0)
    time.sleep(delay)
    os.kill(child.pid, signal.SIGKILL)
    t.join()
    log.close()
    counts = [json.loads(line)["count"] for line in all_lines(tmp_path)]
    assert counts == list(range(n))
    assert log.records_written == n and log.write_errors == 1 and log.in_process


def test_recovery_finds_unreported_lines_and_cuts_a_cut_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer process writes two batches but its reports of them are lost, then it is
    killed in the middle of a line (simulated by cutting the file's last line in half)."""
    log = DeliveryLog(str(tmp_path), "gw1")
    for i in range(10):
        log.record("publish", make_msg(i), "topic:t", "p")
    log.flush()
    child = log._child
    assert child is not None and log.records_written == 10
    real_apply = child._apply

    def lose_batch_reports(kind: bytes, value: Any) -> None:
        if kind != b"D":
            real_apply(kind, value)

    monkeypatch.setattr(child, "_apply", lose_batch_reports)
    for i in range(10, 20):
        log.record("publish", make_msg(i), "topic:t", "p")
    log.flush()
    for i in range(20, 30):
        log.record("publish", make_msg(i), "topic:t", "p")
    log.flush()
    assert log.records_written == 10  # the reports of 20 records were lost
    (f,) = log.files
    data = Path(f).read_bytes()
    assert data.count(b"\n") == 30
    os.kill(child.pid, signal.SIGKILL)
    wait_for(lambda: child.dead)
    os.truncate(f, len(data) - 40)  # the last line (record 29) cut short by the kill
    for i in range(30, 35):
        log.record("publish", make_msg(i), "topic:t", "p")
    log.flush()
    assert log.in_process and log.write_errors == 1
    assert log.files == [f]  # it goes on in the same file
    assert ids_in(tmp_path) == [f"ID:gw1-{i}" for i in range(35)]
    assert log.records_written == 35
    log.close()


def test_unreported_lines(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    a.write_bytes(b"1\n2\n3\n4\n")  # reported at 4 bytes: two lines more
    b.write_bytes(b"5\n6\n7")  # a failed write cut "7"; it went on in c
    c.write_bytes(b"7\n8\n9")  # killed in the middle of "9"
    lines, last = unreported_lines([(str(a), 4), (str(b), 0), (str(c), 0)])
    assert lines == 2 + 2 + 2
    assert last == (str(c), 4)
    assert c.read_bytes() == b"7\n8\n" and b.read_bytes() == b"5\n6\n7"
    assert unreported_lines([(str(tmp_path / "gone"), 0)]) == (0, None)
    assert unreported_lines([]) == (0, None)


KILL_SELF = """
import os, signal, sys
from gateway.dlog import DeliveryLog
from gateway.message import Message

log = DeliveryLog(sys.argv[1], "gw-k", flush_interval=3600)
log.start()
print(log._child.pid, flush=True)

def record(i):
    m = Message.text("x", message_id=f"ID:{i}")
    m.trace_id = f"t{i}"
    log.record("publish", m, "topic:t", "p")

for i in range(100):
    record(i)
log.flush()
for i in range(100, 30_000):
    record(i)
with log._io_lock:
    log._drain()  # sent, not acknowledged: some still in the pipe
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_killed_gateway_leaves_no_writer_and_loses_nothing_it_sent(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-c", KILL_SELF, str(tmp_path)], capture_output=True, text=True,
        timeout=60, cwd=str(ROOT),
    )  # fmt: skip
    assert r.returncode == -signal.SIGKILL, r.stderr
    wait_until_gone(int(r.stdout.split()[0]))
    assert ids_in(tmp_path) == [f"ID:{i}" for i in range(30_000)]


def test_record_waits_past_max_pending(tmp_path: Path) -> None:
    """The writer process is stopped (a stuck disk): its pipe fills, the writer thread
    blocks, and record() waits once max_pending records are pending -- memory stays
    bounded, no record is dropped."""
    bound = dlog.BATCH_RECORDS + 5_000
    log = DeliveryLog(str(tmp_path), "gw1", flush_interval=0.001, max_pending=bound)
    log.start()
    child = log._child
    assert child is not None
    n = 200_000
    done = threading.Event()
    m = make_msg(1)

    def produce() -> None:
        for i in range(n):
            log.record("deliver", m, "topic:t", "c", i)
        done.set()

    os.kill(child.pid, signal.SIGSTOP)
    try:
        t = threading.Thread(target=produce)
        t.start()
        wait_for(lambda: log.stalls >= 1)
        time.sleep(0.2)
        assert not done.is_set()  # record() is waiting
        assert log.pending <= bound + dlog.CHUNK_RECORDS  # checked as each chunk is sealed
    finally:
        os.kill(child.pid, signal.SIGCONT)
    t.join()
    log.close()
    assert [json.loads(line)["count"] for line in all_lines(tmp_path)] == list(range(n))
    assert log.records_written == n and log.write_errors == 0


def test_flush_past_max_pending_does_not_wait_for_itself(tmp_path: Path) -> None:
    """flush() holds the I/O lock while it sends: sealing the rest there must not wait for
    the writer thread (which would need that lock to send), however much is sealed."""
    bound = dlog.BATCH_RECORDS + dlog.CHUNK_RECORDS
    log = DeliveryLog(str(tmp_path), "gw1", max_pending=bound)
    n = bound + 2 * dlog.CHUNK_RECORDS + 7
    m = make_msg(1)
    for i in range(n):  # no writer thread yet: nothing waits
        log.record("deliver", m, "topic:t", "c", i)
    assert log.pending == n and log._sealed >= bound
    idle = threading.Event()
    writer = threading.Thread(target=idle.wait, daemon=True)  # alive, not the caller
    writer.start()
    log._writer_thread = writer
    flushed = threading.Event()
    threading.Thread(target=lambda: (log.flush(), flushed.set()), daemon=True).start()
    try:
        assert flushed.wait(30), "flush() waited for itself"
    finally:
        idle.set()
        log._writer_thread = None
    log.close()
    assert [json.loads(line)["count"] for line in all_lines(tmp_path)] == list(range(n))


def test_record_never_waits_without_a_writer_thread(tmp_path: Path) -> None:
    log = DeliveryLog(str(tmp_path), "gw1", max_pending=dlog.BATCH_RECORDS + 1)
    m = make_msg(1)
    for i in range(30_000):
        log.record("deliver", m, "topic:t", "c", i)
    assert log.stalls == 0 and log.pending == 30_000
    log.close()
    assert log.records_written == 30_000


def test_writer_process_that_cannot_start_means_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    log = DeliveryLog(str(tmp_path / "logs"), "gw1")
    log.start()
    assert log.in_process and log._child is None
    log.record("publish", make_msg(1), "topic:t", "p")
    log.close()
    assert ids_in(tmp_path / "logs") == ["ID:gw1-1"]
    assert "cannot start the writer process" in caplog.text


@not_compiled
def test_values_marshal_cannot_take_are_written_as_in_process(tmp_path: Path) -> None:
    """A Destination object, a str subclass, an enum member, bytes-likes: the writer
    process writes exactly the bytes the in-process formatter writes."""

    class Id(str):
        def __str__(self) -> str:
            return "not this"

    def fill(log: DeliveryLog) -> None:
        for i, (mid, dest, size) in enumerate(
            [
                (Id("ID:sub"), Destination.topic("a.b"), DeliveryMode.RELIABLE),
                (bytearray(b"ID:ba"), "topic:x", 5),
                (memoryview(b"ID:mv"), Destination.queue("q"), object()),
                ("ID:plain", "topic:y", 7),
            ]
        ):
            m = make_msg(i)
            m.message_id = mid  # type: ignore[assignment]
            m.size = size  # type: ignore[assignment]
            log.record("ack", m, dest, None, DeliveryMode.PERSISTENT)  # type: ignore[arg-type]

    out = {}
    for mode in (False, True):
        d = tmp_path / str(mode)
        log = DeliveryLog(str(d), "gw1", in_process=mode)
        fill(log)
        log.close()
        out[mode] = [line.split(',"gw"', 1)[1] for line in all_lines(d)]  # without ts
    assert out[False] == out[True]
    recs = [json.loads('{"gw"' + line) for line in out[False]]
    assert [r["msg_id"] for r in recs] == ["ID:sub", "ID:ba", "ID:mv", "ID:plain"]
    assert [r["dest"] for r in recs] == ["topic:a.b", "topic:x", "queue:q", "topic:y"]
    assert [r["size"] for r in recs] == [22, 5, 0, 7] and {r["count"] for r in recs} == {2}


def test_writer_process_module_is_not_imported_when_disabled() -> None:
    r = subprocess.run(
        [sys.executable, "-c",
         "import sys; from gateway.dlog import DeliveryLog\n"
         "from gateway.message import Message\n"
         "log = DeliveryLog('/nonexistent', 'g', enabled=False)\n"
         "log.start(); log.record('publish', Message.text('x'), 'topic:t', None)\n"
         "log.flush(); log.close()\n"
         "assert 'gateway.dlog_writer' not in sys.modules\n"],
        capture_output=True, text=True, timeout=60, cwd=str(ROOT),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr


def test_body_and_properties_hashes(tmp_path: Path, make_log: MakeLog) -> None:
    """``body_hash`` and ``props_hash`` hash the bytes docs/delivery-log.md ("Hashes")
    defines: text as UTF-8, bytes as they are, maps and streams and properties in the
    store's tagged encoding with names in order; long bodies are hashed before the writer."""
    from gateway.serial import write_value
    from gateway.types import Int16, Int32

    def tagged(*values: object) -> bytes:
        out = bytearray()
        for v in values:
            write_value(out, v)
        return bytes(out)

    log = make_log(str(tmp_path), "gw1")
    long_text = "é" * 5000  # past SHIP_LIMIT: hashed when its head is made
    cases = [
        Message.text("hello"), Message.binary(b"hello"), Message.text(long_text),
        Message.map({"b": Int16(1), "a": [1, {"y": "z", "x": b"\x00"}]}),
        Message.map({"a": [1, {"x": b"\x00", "y": "z"}], "b": Int16(1)}),  # same, other order
        Message.map({"a": [1, {"x": b"\x00", "y": "z"}], "b": Int32(1)}),  # another type
        Message(None, properties={"z": 1, "a": Int16(2)}),
        Message(None, properties={"a": Int16(2), "z": 1}),  # same, other order
        Message(None, properties={"a": Int32(2), "z": 1}),  # another type
    ]
    for i, m in enumerate(cases):
        log.record("publish", m, "topic:a", "p", i)
    log.flush()
    got = [(r["body_hash"], r["props_hash"]) for r in read_lines(tmp_path)]
    log.close()
    map_bytes = tagged({"a": [1, {"x": b"\x00", "y": "z"}], "b": Int16(1)})
    props_bytes = tagged("a", Int16(2), "z", 1)
    assert got[:4] == [
        (HELLO, None), (HELLO, None), (hash_of(long_text.encode()), None),
        (hash_of(map_bytes), None),
    ]  # fmt: skip
    assert got[4] == got[3] and got[5][0] not in (None, got[3][0])
    assert got[6] == got[7] == (None, hash_of(props_bytes))
    assert got[8][1] not in (None, got[6][1])
    assert isinstance(cases[2].log_head, tuple) and type(cases[2].log_head[4]) is int


def tagged_props(props: dict[str, object]) -> bytes:
    """The bytes ``props_hash`` hashes (docs/delivery-log.md, "Hashes"), made here."""
    from gateway.serial import write_value

    out = bytearray()
    for name in sorted(props):
        write_value(out, name)
        write_value(out, props[name])
    return bytes(out)


def count_encodings(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The property dicts ``canonical_properties`` encodes from now on (in this process)."""
    encoded: list[dict[str, Any]] = []
    canonical = dlog_format.canonical_properties

    def counted(props: dict[str, Any]) -> bytes:
        encoded.append(props)
        return canonical(props)

    monkeypatch.setattr(dlog_format, "canonical_properties", counted)
    return encoded


def typed_properties() -> dict[str, object]:
    """One property of each type a property may have."""
    from gateway import types as t

    return {
        "JMS_GW_MQTT_QOS": t.Int8(1), "i16": t.Int16(-2), "i32": t.Int32(3), "i64": t.Int64(4),
        "u8": t.UInt8(5), "u16": t.UInt16(6), "u32": t.UInt32(7), "u64": t.UInt64(2**64 - 1),
        "f32": t.Float32(0.5), "f64": 0.25, "char": t.Char("x"), "s": "text \udc80",
        "b": b"\x00\xff", "t": True, "n": 9, "arr": t.Int16Array([1, -1]),
    }  # fmt: skip


@not_compiled
def test_properties_are_encoded_and_hashed_in_the_writer_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The event loop hands the writer process the properties, typed values and all; it
    encodes a set of them itself at most once, however many messages carry it (encoding
    every message's cost a quarter of the throughput of messages with two properties)."""
    encoded = count_encodings(monkeypatch)
    props = typed_properties()
    log = DeliveryLog(str(tmp_path), "gw1")
    n = 4 * dlog.CHUNK_RECORDS // 2  # publish and deliver: four chunks
    for i in range(n):
        m = make_msg(i)
        m.properties = dict(props) if i != 1 else {}
        log.record("publish", m, "topic:a", "p")
        log.record("deliver", m, "topic:a", "c", 1)
    log.close()
    got = [r["props_hash"] for r in read_lines(tmp_path)]
    want = hash_of(tagged_props(props))
    assert got == [want, want, None, None] + [want] * (2 * n - 4)
    assert len(encoded) <= 1


def test_a_property_set_after_head_is_not_in_its_hash(
    tmp_path: Path, make_log: MakeLog
) -> None:
    """``head()`` takes the properties as they are then, however late the writer gets to
    them (a transport makes the head of an export changed by mapping rules, then adds its
    own markers to it before sending it and logging its export)."""
    from gateway.types import Int8

    log = make_log(str(tmp_path), "gw1")
    m = make_msg(1)
    m.properties = {"a": Int8(1)}
    log.head(m)
    m.properties["JMS_GW_MARKER"] = "t1"
    log.record("export", m, "topic:a", "t1")
    log.flush()
    got = [r["props_hash"] for r in read_lines(tmp_path)]
    log.close()
    assert got == [hash_of(tagged_props({"a": Int8(1)}))]


def test_records_share_the_message_properties_without_copying_them(
    tmp_path: Path, make_log: MakeLog
) -> None:
    """``record()`` keeps a reference to the message's property dict, not a copy (the core
    never changes the properties of a message it has logged), and every record of the
    message, in this chunk or a later one, has the same hash."""
    from gateway.types import Int8

    log = make_log(str(tmp_path), "gw1")
    m = make_msg(1)
    m.properties = {"q": Int8(1), "r": True}
    log.record("publish", m, "topic:a", "c1")
    assert m.log_head is not None and m.log_head[5] is m.properties
    log.flush()  # the deliver goes in a later chunk, with a copy of the head
    log.record("deliver", m, "topic:a", "c2", 1)
    other = make_msg(2)
    other.properties = {"q": True, "r": True}  # equal values, another type: another hash
    log.record("publish", other, "topic:a", "c1")
    log.flush()
    got = [r["props_hash"] for r in read_lines(tmp_path)]
    log.close()
    want = hash_of(tagged_props({"q": Int8(1), "r": True}))
    assert got == [want, want, hash_of(tagged_props({"q": True, "r": True}))]
    assert want != got[2]


def test_batches_with_properties_carry_only_typed_values() -> None:
    """A batch with properties crosses in pickle's format, which the writer process may
    unpickle: it names no class but the typed values'. Any other object in it sends the
    batch the way of a value marshal cannot take (written as the formatter would)."""
    import io
    import pickle

    modules: set[str] = set()

    class Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            modules.add(module)
            return super().find_class(module, name)

    props = typed_properties()
    head = ("trace-1", "ID:1", 2, 10, "hello", dict(props))
    flat = [1795753077.0, "publish", head, "topic:a", "p", 0, None,
            1795753077.1, "deliver", head, "topic:a", "c", 1, None]  # fmt: skip
    payload = dlog_format.encode_batch(flat)
    Unpickler(io.BytesIO(payload)).load()
    assert modules == {"gateway.types"}
    back = dlog_format.decode_batch(payload)
    assert back == flat and back[2] is back[9]
    assert [type(v) for v in back[2][5].values()] == [type(v) for v in props.values()]
    assert dlog_format.format_records(back, "gw1") == dlog_format.format_records(flat, "gw1")

    odd = ("trace-2", "ID:2", 2, 10, None, {"a": 1, "x": Destination.topic("a")})
    payload = dlog_format.encode_batch([*flat, 1795753077.2, "ack", odd, "topic:a", "c", 1, None])
    back = dlog_format.decode_batch(payload)
    assert back[:14] == [*flat[:2], back[2], *flat[3:9], back[2], *flat[10:]]
    assert back[2][5] == tagged_props(props) and back[16][5] is None


def test_a_batch_is_marshalled_unless_a_property_is_typed() -> None:
    """Properties of plain values cross in marshal's format (which the writer reads twice as
    fast as pickle's); a typed value sends the batch in pickle's, and the log's next batch
    tries pickle's first; either way the writer gets the same values and types back."""
    from gateway.types import Int8

    def batch(n: int, props: dict[str, object] | None) -> list[Any]:
        head = (f"trace-{n}", f"ID:{n}", 2, 10, b"body", props)
        return [1795753077.0, "publish", head, "topic:a", "p", 0, None,
                1795753077.1, "deliver", head, "topic:a", "c", 1, None]  # fmt: skip

    for props, pickled in (({"q": 1, "r": True, "s": "x"}, False), (None, False),
                           ({"q": Int8(1), "r": True}, True)):  # fmt: skip
        flat = batch(1, props)
        payload = dlog_format.encode_batch(flat)
        assert (payload[:1] == b"\x80") is pickled, props
        back = dlog_format.decode_batch(payload)
        assert back == flat and back[2] is back[9]
        assert [type(v) for v in (back[2][5] or {}).values()] == [
            type(v) for v in (props or {}).values()
        ]
    log = DeliveryLog("", "gw1", enabled=False)
    log.enabled = True  # records sealed into chunks, never written: no writer, no file
    formats, held = [], []
    for i, props in enumerate(({"q": 1}, {"q": Int8(1)}, {"q": 1}, {"q": 1})):
        for _ in range(dlog.CHUNK_RECORDS):
            m = make_msg(i)
            m.properties = dict(props)
            log.record("publish", m, "topic:a", "p")
        payload = log._chunks[-1][1]
        formats.append(payload[:1] == b"\x80")
        held.append(dlog_format.decode_batch(payload)[2][5])
    log._chunks.clear()
    assert formats == [False, True, True, False]
    # the first head's dict, until a set met again is held as its bytes (the test below)
    assert held[:3] == [{"q": 1}, {"q": Int8(1)}, {"q": 1}]
    assert [type(v) for d in held[:3] for v in d.values()] == [int, Int8, int]
    assert held[3] == tagged_props({"q": 1})


def props_chunks(sets: list[dict[str, Any]], chunks: int) -> tuple[list[bool], list[Any]]:
    """``chunks`` chunks of a log with no writer, of messages with the property sets
    ``sets`` in turn, each message's dict a copy (as an adapter makes one) and logged
    twice (publish, deliver): whether each chunk is pickled, and their records."""
    log = DeliveryLog("", "gw1", enabled=False)
    log.enabled = True  # records sealed into chunks, never written: no writer, no file
    for i in range(chunks * dlog.CHUNK_RECORDS // 2):
        m = make_msg(i)
        m.properties = dict(sets[i % len(sets)])
        log.record("publish", m, "topic:a", "p")
        log.record("deliver", m, "topic:a", "c", 1)
    payloads = [payload for _, payload in log._chunks]
    assert len(payloads) == chunks
    return [p[:1] == b"\x80" for p in payloads], [v for p in payloads for v in dlog_format.decode_batch(p)]


def test_a_property_set_met_again_crosses_as_its_canonical_bytes(tmp_path: Path) -> None:
    """After a chunk with a typed property has crossed in pickle's format, a set of
    properties met again (the same names, each with the very same value object: an MQTT
    adapter's QoS from its table and ``True``) is held as the bytes ``props_hash`` hashes,
    so the log's chunks are marshalled again; a set equal to it with values of other types
    (``True`` and ``1`` equal ``Int8(1)``, ``-0.0`` equals ``0.0``), or with a name more or
    less, or with the same values in other objects, is not taken for it: every record has
    the hash of its own message's properties."""
    from gateway.types import Int8

    qos = Int8(1)
    mqtt = {"JMS_GW_MQTT_QOS": qos, "JMS_GW_MQTT_RETAIN": True}
    others: list[dict[str, Any]] = [
        {"JMS_GW_MQTT_QOS": True, "JMS_GW_MQTT_RETAIN": qos},
        {"JMS_GW_MQTT_QOS": 1, "JMS_GW_MQTT_RETAIN": True},
        {"JMS_GW_MQTT_RETAIN": True, "JMS_GW_MQTT_QOS": Int8(1)},
        {"JMS_GW_MQTT_QOS": qos},
        {"JMS_GW_MQTT_QOS": qos, "JMS_GW_MQTT_RETAIN": True, "f": 0.0},
        {"f": 0.0, "g": qos, "h": "x"},
        {"f": -0.0, "g": qos, "h": "x"},
        typed_properties(),
    ]
    formats, flat = props_chunks([mqtt], 4)
    assert formats == [True, True, True, False]  # the dicts; the set met, then known
    heads = flat[2 :: dlog_format.WIDTH]
    assert heads[-1][5] == tagged_props(mqtt) and heads[0][5] == mqtt

    sets = [mqtt] * 3 + [s for o in others for s in (o, o, o, mqtt, mqtt)]
    _, flat = props_chunks(sets, 3)
    log = DeliveryLog(str(tmp_path), "gw1", in_process=True)
    log._pending[:] = flat
    log.close()
    got = [r["props_hash"] for r in read_lines(tmp_path)]
    want = [tagged_props(sets[i // 2 % len(sets)]) for i in range(len(flat) // dlog_format.WIDTH)]
    assert got == [hash_of(p) for p in want]
    assert len(set(got)) == len(others)  # Int8(1) in another object: the same hash


def test_a_property_set_with_a_value_that_may_change_is_not_held_as_bytes() -> None:
    """Only a set whose values no one can change is recognised by their identity: a list
    (no property value may be one, but the log takes what it is given) can change between
    two messages that share it, so it stays a dict, hashed as the writer finds it."""
    from gateway.types import Int8

    formats, flat = props_chunks([{"JMS_GW_MQTT_QOS": Int8(1), "l": [1, 2]}], 4)
    assert formats == [True] * 4
    assert {type(h[5]) for h in flat[2 :: dlog_format.WIDTH]} == {dict}


def test_property_sets_that_change_all_the_time_are_not_recognised() -> None:
    """Messages whose typed properties alternate between sets (or differ every time) make
    the log stop recognising sets for :data:`~gateway.dlog.SET_PAUSE` chunks (their dicts
    cross in pickle's format, as they did before sets were recognised), then try again."""
    from gateway.types import Int8

    a = {"JMS_GW_MQTT_QOS": Int8(1)}
    b = {"JMS_GW_MQTT_QOS": Int8(2)}
    log = DeliveryLog("", "gw1", enabled=False)
    log.enabled = True  # records sealed into chunks, never written: no writer, no file
    recognising = []
    for sets in ([a, b], [a, b], [a], [a]):
        for i in range(dlog.CHUNK_RECORDS):
            m = make_msg(i)
            m.properties = dict(sets[i % len(sets)])
            log.record("publish", m, "topic:a", "p")
        recognising.append(log._sets)
    assert recognising == [True, False, False, False]
    for _ in range(dlog.SET_PAUSE):
        for i in range(dlog.CHUNK_RECORDS):
            m = make_msg(i)
            m.properties = dict(a)
            log.record("publish", m, "topic:a", "p")
    assert log._sets
    for i in range(dlog.CHUNK_RECORDS):
        m = make_msg(i)
        m.properties = dict(a)
        log.record("publish", m, "topic:a", "p")
    heads = dlog_format.decode_batch(log._chunks[-1][1])[2 :: dlog_format.WIDTH]
    assert {h[5] for h in heads} == {tagged_props(a)}


@not_compiled
def test_the_properties_hash_is_kept_apart_from_the_body(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages with the same properties and other bodies (an MQTT publisher's) have their
    properties encoded and hashed once, each body hashed on its own."""
    from gateway.types import Int8

    encoded = count_encodings(monkeypatch)
    props = {"JMS_GW_MQTT_QOS": Int8(1), "apart": "from the body"}  # in no other test
    log = DeliveryLog(str(tmp_path), "gw1", in_process=True)
    bodies = [f"body {i}" for i in range(5)]
    for i, body in enumerate(bodies):
        m = Message.text(body, message_id=f"ID:{i}")
        m.properties = dict(props)
        log.record("publish", m, "topic:a", "p")
    log.close()
    got = [(r["body_hash"], r["props_hash"]) for r in read_lines(tmp_path)]
    want = hash_of(tagged_props(props))
    assert got == [(hash_of(b.encode()), want) for b in bodies]
    assert len(encoded) == 1


def test_extra_columns_rules_far_identity_and_lost(tmp_path: Path, make_log: MakeLog) -> None:
    log = make_log(str(tmp_path), "gw1")
    log.record("import", make_msg(1), "topic:a", "t1", 0, None, (None, "far-7", "a/b", None))
    log.record("export", make_msg(2), "topic:a", "t1", 0, None, ("r1,r2", None, "x", None))
    log.record("drop", Message(None), "topic:_RV.X", "t2", 0, "_RV.X", (None, None, None, 3))
    log.record("deliver", make_msg(3), "topic:a", "c", 1)
    log.flush()
    got = [[r[k] for k in EXPECTED_KEYS[-4:]] for r in read_lines(tmp_path)]
    log.close()
    assert got == [
        [None, "far-7", "a/b", None], ["r1,r2", None, "x", None], [None, None, None, 3],
        [None, None, None, None],
    ]  # fmt: skip
