"""The delivery log: one record per thing that happened to a message, written off the hot path.

How this works. Every publish, delivery, acknowledgement, redelivery, expiry, drop, discard,
dead-lettering, rejection, import and export calls :meth:`DeliveryLog.record`, which appends
one tuple to a list and returns -- no formatting, no lock, no I/O. A background thread wakes
every ``flush_interval`` (or as soon as 10,000 records are pending), takes the pending records
out of the list, formats them as JSON lines and writes them with one ``write()`` per batch.
Files rotate past ``max_file_bytes``; :meth:`close` writes what is left and fsyncs. A Spark
job (``spark/``) reads these files from every gateway and reconciles them message by message
on ``trace_id``. The schema is documented in ``docs/delivery-log.md``.

Why JSON Lines. A line is a complete record, so the file is appendable by a writer that may
crash at any moment: at worst the last line is cut short, and a reader in ``PERMISSIVE`` or
``DROPMALFORMED`` mode skips it while every earlier line stays readable. Spark's JSON reader
takes a directory of such files with an explicit schema (no inference pass), and an operator
can ``grep`` a trace id across a day of logs. Parquet would need a batch writer that holds
row groups in memory until a file is closed (a crash loses the open file) and would make
pyarrow a runtime dependency of the gateway.

Taking the batch. The hot path appends to one list that is never replaced. The writer copies
the first ``n`` items and deletes them (``batch = p[:n]; del p[:n]``), each a single C-level
list operation under the GIL, so an append racing with the writer lands after the ``n`` taken
items and is kept for the next batch. (Swapping in a new list would let a thread that had
already loaded the old list append to it after the writer had finished with it.)

Threads: :meth:`record` may be called from any thread; the writer thread owns the files;
:meth:`flush` and :meth:`close` may be called from any thread and serialise with the writer.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from json.encoder import encode_basestring_ascii
from typing import TYPE_CHECKING, Any

from gateway.message import DeliveryMode

if TYPE_CHECKING:
    from gateway.message import Destination, Message

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1

EVENTS = (
    "publish",  # a local producer's message was accepted into a destination
    "deliver",  # the message was sent to a consumer for the first time (count = 1)
    "ack",  # the consumer acknowledged it; the gateway forgets it for that consumer
    "redeliver",  # sent to a consumer again after recover/rollback/close (count >= 2)
    "expire",  # its expiration passed before it was consumed (seed L2355-2358)
    "drop",  # the gateway let it go without telling the producer (reason says why)
    "discard",  # the oldest message was discarded to make room, overflowPolicy=discardOld
    "undeliverable",  # moved to $sys.undelivered (expired or maxRedelivery; seed L1004-1032)
    "import",  # it entered from an external system through a transport (client = transport)
    "export",  # it was sent out to an external system through a transport (client = transport)
    "reject",  # the producer was refused with an error (limit, permission, name; reason)
)
"""Every event name, in the order of ``docs/delivery-log.md``."""

FIELDS = (
    "v", "ts", "gw", "event", "trace_id", "msg_id", "dest", "client", "count", "mode",
    "size", "reason",
)  # fmt: skip
"""The keys of every record, in the order they are written."""

BATCH_RECORDS = 10_000  # wake the writer early past this many pending records
DEFAULT_FLUSH_INTERVAL = 0.2  # seconds; bounds how stale the file is behind the gateway
DEFAULT_MAX_FILE_BYTES = 64 << 20  # rotate past 64 MiB: one Spark input split per file or so

_MODE_JSON: dict[Any, str] = {m: '"' + m.name + '"' for m in DeliveryMode}
_EVENT_JSON: dict[str, str] = {e: '"' + e + '"' for e in EVENTS}
_FILE_SAFE = re.compile(r"[^A-Za-z0-9_.-]")
_time = time.time

# One record: (time.time(), event, trace_id, message_id, delivery_mode, size, dest, client,
#              count, reason)
_Record = tuple[float, str, Any, Any, Any, Any, Any, Any, int, Any]


def _s(value: Any) -> str:
    """A JSON string or null; non-strings (bytes ids, Destination) by their ``str()``."""
    if value is None:
        return "null"
    if not isinstance(value, str):
        value = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return encode_basestring_ascii(value)


def format_records(batch: list[_Record], gateway_id: str) -> bytes:
    """Format records as JSON lines, one object per line, keys in :data:`FIELDS` order.

    Strings go through the C JSON string encoder with ``ensure_ascii``, so any value (lone
    surrogates included) yields valid UTF-8 that Spark and ``grep`` both read. A record with
    a value of the wrong type (a caller's bug) never costs the batch: the batch is then
    formatted one record at a time and the bad values are written as strings or null.
    """
    try:
        return _format_fast(batch, gateway_id)
    except Exception:
        return b"".join(_format_fast([_coerce(r)], gateway_id) for r in batch)


def _coerce(r: _Record) -> _Record:
    """The record with every value of a type the fast formatter cannot take made safe."""
    t, event, trace_id, msg_id, mode, size, dest, client, count, reason = r
    return (
        _float(t), _str(event) or "", _str(trace_id), _str(msg_id),
        mode if isinstance(mode, int) else _str(mode),
        _int(size), _str(dest), _str(client), _int(count), _str(reason),
    )  # fmt: skip


def _str(v: Any) -> str | None:
    if v is None or type(v) is str:
        return v
    try:
        return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
    except Exception:
        return "<unprintable " + type(v).__name__ + ">"


def _int(v: Any) -> int:
    try:
        return int(v)
    except Exception:
        return 0


def _float(v: Any) -> float:
    try:
        f = float(v)
    except Exception:
        return 0.0
    return f if f == f and abs(f) != float("inf") else 0.0


def _format_fast(batch: list[_Record], gateway_id: str) -> bytes:
    gw = encode_basestring_ascii(gateway_id)
    head = '{"v":' + str(SCHEMA_VERSION) + ',"ts":'
    enc = encode_basestring_ascii
    event_json, mode_json = _EVENT_JSON, _MODE_JSON
    lines = []
    for t, event, trace_id, msg_id, mode, size, dest, client, count, reason in batch:
        lines.append(
            f"{head}{t * 1000.0:.3f},"
            f'"gw":{gw},'
            f'"event":{event_json.get(event) or enc(str(event))},'
            f'"trace_id":{enc(trace_id) if type(trace_id) is str else _s(trace_id)},'
            f'"msg_id":{enc(msg_id) if type(msg_id) is str else _s(msg_id)},'
            f'"dest":{enc(dest) if type(dest) is str else _s(dest)},'
            f'"client":{enc(client) if type(client) is str else _s(client)},'
            f'"count":{count:d},'
            f'"mode":{mode_json.get(mode) or _s(mode)},'
            f'"size":{size or 0:d},'
            f'"reason":{_s(reason)}}}\n'
        )
    return "".join(lines).encode("ascii")


class DeliveryLog:
    """Writes delivery records to JSON Lines files in ``directory``, batched by a thread.

    Args:
        directory: where ``dlog-<gateway_id>-<UTC yyyymmddTHHMMSS>-<seq>.jsonl`` files go
            (created if missing).
        gateway_id: this gateway's id; the ``gw`` field of every record.
        flush_interval: seconds between batches.
        max_file_bytes: start a new file once the current one has passed this size (a file
            may exceed it by one batch: batches are never split).
        enabled: when False, :meth:`record` does nothing and no file is created.
    """

    def __init__(
        self,
        directory: str,
        gateway_id: str,
        *,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        enabled: bool = True,
    ) -> None:
        self.directory = directory
        self.gateway_id = gateway_id
        self.flush_interval = flush_interval
        self.max_file_bytes = max_file_bytes
        self.enabled = enabled
        self.records_written = 0
        self.write_errors = 0
        self.files: list[str] = []  # every file this log has opened, oldest first
        self._pending: list[_Record] = []
        self._wake = threading.Event()
        self._io_lock = threading.Lock()  # the writer thread vs flush()/close()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._fd = -1
        self._file_bytes = 0
        self._seq = 0
        self._unwritten = b""  # bytes a failed write left over, retried on the next batch
        self._unwritten_records = 0
        self._file_tag = _FILE_SAFE.sub("_", gateway_id) or "_"

    # -- the hot path -------------------------------------------------------------------

    def record(
        self,
        event: str,
        msg: Message,
        dest: str | Destination,
        client: str | None,
        count: int = 0,
        reason: str | None = None,
    ) -> None:
        """Log one event for ``msg`` on ``dest`` (``topic:a.b`` or a Destination).

        Runs on the hot path: one tuple appended to a list. ``client`` is the connection or
        transport id involved (producer, consumer or transport), ``count`` the delivery
        count (JMSXDeliveryCount) where there is one, ``reason`` a short word for drops,
        discards, rejections and dead-lettering. See ``docs/delivery-log.md``.

        Pass ``dest`` as a string the caller keeps (e.g. computed once per destination):
        a tuple holding only strings and numbers is untracked by the cyclic GC, one holding
        a Destination object is not, and costs about twice as much under load. For the same
        reason the delivery mode is stored as a plain ``int``.
        """
        if self.enabled:
            p = self._pending
            p.append(
                (
                    _time(), event, msg.trace_id, msg.message_id, int(msg.delivery_mode),
                    msg.size, dest, client, count, reason,
                )
            )  # fmt: skip
            if len(p) == BATCH_RECORDS:
                self._wake.set()

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Start the writer thread (a daemon; :meth:`close` stops it)."""
        if not self.enabled or self._thread is not None:
            return
        self._stop = False
        self._thread = threading.Thread(
            target=self._run, name=f"dlog-{self.gateway_id}", daemon=True
        )
        self._thread.start()

    def flush(self) -> None:
        """Write every record appended so far, now, from the calling thread; blocks."""
        with self._io_lock:
            self._drain()

    def close(self) -> None:
        """Stop the writer, write everything pending, fsync and close the file.

        Every record logged before ``close`` is called is written; calls to :meth:`record`
        after it are ignored.
        """
        thread = self._thread
        if thread is not None:
            self._stop = True
            self._wake.set()
            thread.join()
            self._thread = None
        with self._io_lock:
            self.enabled = False
            self._drain()
            if self._fd >= 0:
                try:
                    os.fsync(self._fd)
                finally:
                    os.close(self._fd)
                    self._fd = -1

    # -- the writer ---------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            try:
                with self._io_lock:
                    self._drain()
            except Exception:  # keep the thread alive; records stay pending for a retry
                log.exception("delivery log: writing a batch failed")

    def _drain(self) -> None:
        """Take every pending record and write them; caller holds ``_io_lock``."""
        p = self._pending
        while p or self._unwritten:
            n = len(p)
            batch = p[:n]
            del p[:n]
            data = self._unwritten + format_records(batch, self.gateway_id)
            n += self._unwritten_records
            self._unwritten, self._unwritten_records = b"", 0
            self._write(data)
            self.records_written += n
            if len(p) < BATCH_RECORDS:
                break

    def _write(self, data: bytes) -> None:
        """One batch, one ``write()`` (looping only on a short write); rotates afterwards.

        On an OSError the unwritten rest is kept from the last complete line on and
        retried on the next batch in a new file; the old file may end in a partial line,
        which readers skip (see docs/delivery-log.md).
        """
        if self._fd < 0:
            self._open()
        view = memoryview(data)
        done = 0
        try:
            while done < len(data):
                done += os.write(self._fd, view[done:])
        except OSError:
            self.write_errors += 1
            cut = data.rfind(b"\n", 0, done) + 1
            self._unwritten = data[cut:]
            self._unwritten_records = self._unwritten.count(b"\n")
            self.records_written += data.count(b"\n", 0, cut)
            os.close(self._fd)
            self._fd = -1
            raise
        self._file_bytes += done
        if self._file_bytes >= self.max_file_bytes:
            self._rotate()

    def _open(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        while True:
            self._seq += 1
            path = os.path.join(
                self.directory, f"dlog-{self._file_tag}-{stamp}-{self._seq:04d}.jsonl"
            )
            try:
                self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
            except FileExistsError:
                continue  # a previous run in the same second: take the next number
            break
        self._file_bytes = 0
        self.files.append(path)

    def _rotate(self) -> None:
        fd, self._fd = self._fd, -1
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class NullLog(DeliveryLog):
    """A delivery log that records nothing and creates no file (benchmarks, unit tests)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__("", "null", enabled=False)

    def record(
        self,
        event: str,
        msg: Message,
        dest: str | Destination,
        client: str | None,
        count: int = 0,
        reason: str | None = None,
    ) -> None:
        pass

    def start(self) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass
