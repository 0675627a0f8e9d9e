"""The default message store: SQLite in WAL mode, one writer thread, group commit.

How this works. Every mutating call runs on the event loop thread and only appends an op
tuple to the current unit of work (encoding a message with :mod:`gateway.serial` is the one
real piece of work, so a message is captured as it was when it was put). :meth:`commit`
hands the unit to the writer thread's queue, and wakes a waiting writer once the loop's
current turn has run its callbacks, so what one turn commits (every PUBLISH of a socket read)
is one batch. The writer thread owns the sqlite3 connection:
it takes *every* queued unit at once, applies them in one transaction and commits -- one
fsync for the lot with ``synchronous=FULL`` (``sync=True``; EMS's ``mode = sync``,
TIBCO EMS User's Guide, "stores.conf") -- then posts all the batch's callbacks to the loop with
a single ``call_soon_threadsafe``. While it commits, new units queue up for the next batch, so
the batch grows with the load and the fsync cost is shared (group commit). With ``sync=False``,
``synchronous=NORMAL`` survives a process crash but may lose the last batches on power loss.

Before executing a batch the writer coalesces it (:mod:`gateway.store.sqlite_batch`, which
turns a batch of ops into SQL): what is undone within the batch never reaches the database.

Reads (message swapping: the broker drops the bodies of persistent messages from memory and
asks for them back before delivery) go through the same queue as the units, so the writer
thread stays the connection's only user, as at recovery: :meth:`SqliteStore.read_messages`
queues a read, the writer writes the units queued before it, then selects and decodes the
rows (off the loop) and posts the messages to the loop with the read's callback. A read
therefore sees every unit committed before it was asked for. :meth:`SqliteStore.read_entries`
reads the next batch of a durable subscription's tail the same way: its entries past a message
id cursor, in id order (the ``UNIQUE (endpoint, msg)`` index serves it), with their messages.

Durable subscriptions share message rows, and a tail's entries have no holder in memory, so the
broker deletes such a row with ``delete_unreferenced``: the writer deletes it after the batch's
entries are written, and only where no durable subscription's entry references it any more
(``NOT EXISTS`` on the partial index ``entries_sub_msg``, kept for subscription entries only, so
queue entries cost what they did). A row put in the same batch whose every entry was netted
away is netted with it, as a plain delete is; after a ``delete_endpoint`` barrier in the batch
it is written and deleted instead. Deleting a durable subscription deletes the rows only its
entries referenced (its tail's among them).

Errors. If a batch fails (disk full, I/O error, ...) it is rolled back and retried unit by unit,
so one bad unit does not fail the others. A unit that still fails is logged, counted in
``stats["errors"]``, kept in :attr:`SqliteStore.last_error`, and reported to the loop through
its ``on_error`` callback; its success callback is never called. :meth:`flush` raises
:class:`StoreError` if the unit it waited for failed.

Opening takes an exclusive lock on ``<path>.lock`` (as EMS locks its store files,
EMS User's Guide, "How EMS Manages Access to Shared Store Files"), creates or checks the
schema, drops entries whose message is gone and messages no entry references, and decodes
everything left -- except, when ``open`` is given a ``backlog``, the entries of each durable
subscription past its first ``backlog``: those are only counted (entries and
``length(data)``), as the subscription's tail, and their messages are read when the broker
asks for them (a record there that does not decode is found, and logged, only then).
Version 1 stores made before the ``entries_sub_msg`` index get it at open; the schema stays
version 1, as a gateway without it reads and writes such a store unchanged. A record that does not decode stops the start (as EMS does, EMS User's Guide,
"Error Recovery Policy") unless the store was made with ``force_start=True``, which drops such
records and logs them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

from gateway.errors import MessageFormatError
from gateway.message import Message
from gateway.serial import decode_message, encode_message
from gateway.store.base import (
    BATCH_SIZE_BOUNDS,
    BATCH_US_BOUNDS,
    OP_ADD_ENTRY,
    OP_DELETE_ENDPOINT,
    OP_DELETE_KV,
    OP_DELETE_MESSAGE,
    OP_DELETE_UNREFERENCED,
    OP_PUT_ENDPOINT,
    OP_PUT_KV,
    OP_PUT_MESSAGE,
    OP_REMOVE_ENTRY,
    OP_UPDATE_ENTRY,
    Buckets,
    Callback,
    EntriesCallback,
    ErrorCallback,
    ReadCallback,
    Recovered,
    StoreError,
    StoreLocked,
)
from gateway.store.sqlite_batch import DELETE_ENDPOINT, MAX_ROWS, apply_ops

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no lock file
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("gateway.store")

SCHEMA_VERSION = 1

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, data BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS entries (seq INTEGER PRIMARY KEY, endpoint TEXT NOT NULL,"
    " msg INTEGER NOT NULL, count INTEGER NOT NULL DEFAULT 0, UNIQUE (endpoint, msg))",
    "CREATE TABLE IF NOT EXISTS endpoints (key TEXT PRIMARY KEY, def TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS kv (ns TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL,"
    " PRIMARY KEY (ns, key)) WITHOUT ROWID",
    # Which durable subscriptions' entries reference a message (see delete_unreferenced);
    # durable subscription keys are ``sub:<scope>:<name>``.
    "CREATE INDEX IF NOT EXISTS entries_sub_msg ON entries (msg)"
    " WHERE endpoint >= 'sub:' AND endpoint < 'sub;'",
)

_DELETE_MESSAGE = "DELETE FROM messages WHERE id = ?"
_SELECT_TAIL = (
    "SELECT e.msg, e.count, m.data FROM entries AS e JOIN messages AS m ON m.id = e.msg "
    "WHERE e.endpoint = ? AND e.msg > ? ORDER BY e.msg LIMIT ?"
)
_SELECT_MESSAGES = ("SELECT id, data FROM messages WHERE id IN (", "?", ")")
_PUT_META = "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)"

# How long flush() waits between checks that the writer thread is still alive.
_FLUSH_POLL_S = 1.0
# A unit nobody waits for (commit(None): the delete of an acknowledged message, a delivery
# count) waits at most this long for a unit somebody waits for (a persistent message's put,
# before its PUBACK or receipt), and goes in that one's transaction: under load the deletes
# of what was consumed share the puts' fsyncs instead of adding their own. A crash in that
# window delivers the message again, as a crash before any commit of the ack would.
LAZY_S = 0.002

# A unit of work: (ops, callback, on_error, flush waiter).
_Unit = tuple[list[tuple[Any, ...]], "Callback | None", "ErrorCallback | None", "_Waiter | None"]


class _Waiter:
    __slots__ = ("event", "error")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.error: Exception | None = None


class _Read:
    """A read queued among the units: ids to read, and the callback or waiter to answer;
    or, with ``endpoint``, a tail read (see SqliteStore.read_entries)."""

    __slots__ = ("ids", "callback", "waiter", "found", "endpoint", "after", "limit",
                 "entries_callback")

    def __init__(self, ids: list[int], callback: ReadCallback | None,
                 waiter: _Waiter | None) -> None:
        self.ids = ids
        self.callback = callback
        self.waiter = waiter
        self.found: dict[int, Message] = {}
        self.endpoint = ""
        self.after = 0
        self.limit = 0
        self.entries_callback: EntriesCallback | None = None


def _run_callbacks(callbacks: list[Callback]) -> None:
    """Runs on the loop: the success callbacks of one batch."""
    for cb in callbacks:
        try:
            cb()
        except Exception:
            log.exception("store commit callback failed")


def _run_error_callbacks(calls: list[tuple[ErrorCallback, Exception]]) -> None:
    """Runs on the loop: the on_error callbacks of the failed units of one batch."""
    for cb, exc in calls:
        try:
            cb(exc)
        except Exception:
            log.exception("store on_error callback failed")


class SqliteStore:
    """SQLite store; see the module docstring. ``stats`` keys:

    ``commits`` units made durable, ``ops`` ops in them, ``batches`` transactions committed,
    ``max_batch`` most units in one batch, ``last_batch_ms`` / ``last_batch_us`` duration of
    the last batch including its fsync, ``netted`` ops cancelled by coalescing, ``errors``
    units that failed, ``failed_batches`` transactions that failed.
    """

    def __init__(self, path: str, sync: bool = True, *, force_start: bool = False) -> None:
        self.path = path
        self.sync = sync
        self.force_start = force_start
        self.stats: dict[str, int] = dict.fromkeys(
            ("commits", "ops", "batches", "max_batch", "last_batch_ms", "last_batch_us",
             "netted", "errors", "failed_batches"),
            0,
        )  # fmt: skip
        # every batch's duration (µs) and size (units), by the writer thread (/metrics)
        self.batch_us = Buckets(BATCH_US_BOUNDS)
        self.batch_units = Buckets(BATCH_SIZE_BOUNDS)
        self.last_error: Exception | None = None
        self._unit: list[tuple[Any, ...]] = []  # loop thread only
        self._next_id = 1  # loop thread only (set by open)
        self._queue: list[_Unit | _Read] = []  # guarded by _lock
        self._reads = 0  # guarded by _lock: reads in _queue
        self.swappable = True
        # commit() takes the lock itself (a C call) and notifies only when the writer waits
        # (``_idle``): the Condition's own ``with`` and ``notify`` are Python code, twice a
        # persistent message (1.1 µs against 0.25 µs here). Reentrant, as the Condition's
        # default lock is.
        self._lock = threading.RLock()
        self._cv = threading.Condition(self._lock)
        self._idle = False  # guarded by _lock: the writer waits for units
        # commit() wakes an idle writer once the callbacks of the loop's current turn have
        # run (the loop's call_soon), not at once, so the units of one turn go as one batch:
        # one wake (a futex and two context switches) and one fsync, not one per message of a
        # burst read from a socket. None (no running loop at open, as with a test's stub): at
        # once.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake_due = False  # loop thread only: a _wake is scheduled
        self._lazy_timer: Any = None  # loop thread only: the wake for units nobody waits for
        self._stopping = False
        self._writer_thread: threading.Thread | None = None
        self._call_soon: Callable[..., object] | None = None
        self._lock_fd: int | None = None
        self._max_id_written = 0  # writer thread only
        self._backlog = 0  # durable subscription entries open() recovers (0: all)

    # -- loop thread ---------------------------------------------------------------------------

    def open(self, call_soon_threadsafe: Callable[..., object], backlog: int = 0) -> Recovered:
        """Open or create the database, recover, and start the writer thread. With
        ``backlog``, a durable subscription's entries past its first ``backlog`` stay in the
        store as its tail (see the module docstring).

        Raises:
            StoreError: the store is locked by another process, is not a store of a schema
                version this gateway reads, or holds a corrupt record (without force_start).
        """
        if self._writer_thread is not None:
            raise StoreError(f"store {self.path} is already open")
        self._call_soon = call_soon_threadsafe
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        self._take_lock()
        ready: Future[Recovered] = Future()
        self._stopping = False
        self._backlog = backlog
        thread = threading.Thread(
            target=self._run, args=(ready,), name="gateway-store-writer", daemon=True
        )
        thread.start()
        try:
            recovered = ready.result()
        except BaseException:
            thread.join()
            self._release_lock()
            raise
        self._writer_thread = thread
        return recovered

    def put_endpoint(self, key: str, definition: dict[str, Any]) -> None:
        text = json.dumps(definition, sort_keys=True, separators=(",", ":"))
        self._unit.append((OP_PUT_ENDPOINT, key, text))

    def delete_endpoint(self, key: str) -> None:
        self._unit.append((OP_DELETE_ENDPOINT, key))

    def put_message(self, msg: Message) -> int:
        data = encode_message(msg)  # raises before anything changes
        sid = msg.store_id
        fresh = not sid
        if fresh:
            sid = msg.store_id = self._next_id
            self._next_id = sid + 1
        self._unit.append((OP_PUT_MESSAGE, sid, data, fresh))
        return sid

    def delete_message(self, store_id: int) -> None:
        self._unit.append((OP_DELETE_MESSAGE, store_id))

    def delete_unreferenced(self, store_id: int) -> None:
        self._unit.append((OP_DELETE_UNREFERENCED, store_id))

    def add_entry(self, endpoint_key: str, store_id: int, delivery_count: int = 0) -> None:
        self._unit.append((OP_ADD_ENTRY, endpoint_key, store_id, delivery_count))

    def remove_entry(self, endpoint_key: str, store_id: int) -> None:
        self._unit.append((OP_REMOVE_ENTRY, endpoint_key, store_id))

    def update_entry(self, endpoint_key: str, store_id: int, delivery_count: int) -> None:
        self._unit.append((OP_UPDATE_ENTRY, endpoint_key, store_id, delivery_count))

    def put_kv(self, namespace: str, key: str, value: bytes) -> None:
        self._unit.append((OP_PUT_KV, namespace, key, bytes(value)))

    def delete_kv(self, namespace: str, key: str) -> None:
        self._unit.append((OP_DELETE_KV, namespace, key))

    def commit(
        self, callback: Callback | None = None, on_error: ErrorCallback | None = None
    ) -> None:
        """End the unit of work; ``callback`` runs on the loop once it is durable.

        Raises:
            StoreError: the store is not open (a caller bug: nothing would ever be written).
        """
        unit = self._unit
        if not unit and callback is None:
            return
        if self._writer_thread is None:
            raise StoreError(f"store {self.path} is not open")
        self._unit = []
        with self._lock:
            self._queue.append((unit, callback, on_error, None))
            if self._idle and not self._wake_due:
                loop = self._loop
                if loop is None:
                    self._idle = False
                    self._cv.notify()
                elif callback is None and on_error is None:
                    # Nobody waits for it: it goes with the next unit somebody waits for,
                    # or on its own after LAZY_S.
                    if self._lazy_timer is None:
                        self._lazy_timer = loop.call_later(LAZY_S, self._wake)
                else:
                    self._wake_due = True
                    loop.call_soon(self._wake)

    def _wake(self) -> None:
        """Loop thread, after the turn that committed: wake the writer if it waits."""
        timer = self._lazy_timer
        if timer is not None:
            timer.cancel()
            self._lazy_timer = None
        with self._lock:
            self._wake_due = False
            if self._idle and self._queue:
                self._idle = False
                self._cv.notify()

    def read_messages(self, store_ids: list[int], callback: ReadCallback) -> None:
        """Queue a read of ``store_ids``; ``callback(found)`` runs on the loop afterwards
        (see the module docstring).

        Raises:
            StoreError: the store is not open.
        """
        if self._writer_thread is None:
            raise StoreError(f"store {self.path} is not open")
        self._queue_read(_Read(store_ids, callback, None))

    def read_entries(self, endpoint_key: str, after: int, limit: int,
                     callback: EntriesCallback) -> None:
        """Queue a read of the next ``limit`` entries of a durable subscription's tail (see
        the module docstring); ``callback(rows)`` runs on the loop afterwards.

        Raises:
            StoreError: the store is not open.
        """
        if self._writer_thread is None:
            raise StoreError(f"store {self.path} is not open")
        read = _Read([], None, None)
        read.endpoint = endpoint_key
        read.after = after
        read.limit = limit
        read.entries_callback = callback
        self._queue_read(read)

    def read_now(self, store_ids: list[int]) -> dict[int, Message]:
        """Read ``store_ids`` and wait for the answer (blocks the caller; rare paths only).

        Raises:
            StoreError: the store is not open, or the writer thread is gone.
        """
        thread = self._writer_thread
        if thread is None:
            raise StoreError(f"store {self.path} is not open")
        read = _Read(store_ids, None, _Waiter())
        self._queue_read(read)
        assert read.waiter is not None
        while not read.waiter.event.wait(_FLUSH_POLL_S):
            if not thread.is_alive():
                raise StoreError(f"store {self.path}: the writer thread has stopped")
        return read.found

    def _queue_read(self, read: _Read) -> None:
        with self._lock:
            self._queue.append(read)
            self._reads += 1
            if self._idle:
                self._idle = False
                self._cv.notify()

    def flush(self) -> None:
        """Block until everything submitted so far (committed or not) is durable.

        Called on the loop thread, or on another thread once the loop no longer submits.

        Raises:
            StoreError: a unit that was still being written when flush was called failed
                (units already reported through ``on_error`` before the call do not count),
                or the writer thread is gone.
        """
        thread = self._writer_thread
        if thread is None:
            return
        waiter = _Waiter()
        unit, self._unit = self._unit, []
        with self._cv:
            errors_before = self.stats["errors"]
            self._queue.append((unit, None, None, waiter))
            self._cv.notify()
        while not waiter.event.wait(_FLUSH_POLL_S):
            if not thread.is_alive():
                raise StoreError(f"store {self.path}: the writer thread has stopped")
        error = waiter.error
        if error is None and self.stats["errors"] != errors_before:
            error = self.last_error
        if error is not None:
            raise StoreError(f"store {self.path}: write failed: {error}") from error

    def close(self) -> None:
        """Flush, stop the writer thread and close the database (idempotent).

        Raises:
            StoreError: the final flush failed (the store is closed all the same).
        """
        thread = self._writer_thread
        if thread is None:
            return
        timer, self._lazy_timer = self._lazy_timer, None
        if timer is not None:
            timer.cancel()
        try:
            self.flush()
        finally:
            with self._cv:
                self._stopping = True
                self._cv.notify()
            thread.join()
            self._writer_thread = None
            self._release_lock()

    # -- the lock file -------------------------------------------------------------------------

    def _take_lock(self) -> None:
        if fcntl is None:  # pragma: no cover
            return
        fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise StoreLocked(
                f"store {self.path} is in use by another gateway process (lock file "
                f"{self.path}.lock)"
            ) from None
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = None

    # -- writer thread -------------------------------------------------------------------------

    def _run(self, ready: Future[Recovered]) -> None:
        conn: sqlite3.Connection | None = None
        try:
            conn = self._connect()
            recovered = self._recover(conn)
        except BaseException as exc:
            if conn is not None:
                conn.close()
            if not isinstance(exc, StoreError):
                err = StoreError(f"cannot open store {self.path}: {exc}")
                err.__cause__ = exc
                exc = err
            ready.set_exception(exc)
            return
        ready.set_result(recovered)
        try:
            self._write_loop(conn)
        finally:
            try:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as exc:
                log.warning("store %s: checkpoint at close failed: %s", self.path, exc)
            conn.close()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, cached_statements=256)
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            conn.close()
            raise StoreError(f"store {self.path}: cannot use WAL mode (got {mode})")
        conn.execute("PRAGMA synchronous=" + ("FULL" if self.sync else "NORMAL"))
        conn.execute("PRAGMA journal_size_limit=67108864")  # keep at most 64 MiB of WAL
        conn.execute("PRAGMA cache_size=-16384")  # 16 MiB page cache
        return conn

    def _recover(self, conn: sqlite3.Connection) -> Recovered:
        conn.execute("BEGIN IMMEDIATE")
        try:
            recovered = self._recover_in_tx(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return recovered

    def _recover_in_tx(self, conn: sqlite3.Connection) -> Recovered:
        for stmt in _SCHEMA:
            conn.execute(stmt)
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        version = meta.get("schema_version")
        if version is None:
            conn.execute(_PUT_META, ("schema_version", SCHEMA_VERSION))
        elif version != SCHEMA_VERSION:
            raise StoreError(
                f"store {self.path} has schema version {version!r}; this gateway reads "
                f"version {SCHEMA_VERSION}"
            )
        top = conn.execute("SELECT max(id) FROM messages").fetchone()[0] or 0
        self._max_id_written = max(int(meta.get("max_id") or 0), top)
        dangling = conn.execute(
            "DELETE FROM entries WHERE msg NOT IN (SELECT id FROM messages)"
        ).rowcount
        unreferenced = conn.execute(
            "DELETE FROM messages WHERE id NOT IN (SELECT msg FROM entries)"
        ).rowcount
        if dangling or unreferenced:
            log.warning(
                "store %s: dropped %d entries without a message and %d messages without an entry",
                self.path, dangling, unreferenced,
            )  # fmt: skip
        rec = Recovered()
        for key, text in conn.execute("SELECT key, def FROM endpoints"):
            try:
                definition = json.loads(text)
                if not isinstance(definition, dict):
                    raise ValueError("not a JSON object")
            except ValueError as exc:
                self._corrupt(f"endpoint {key!r}", exc)
                conn.execute(DELETE_ENDPOINT, (key,))
                continue
            rec.endpoints[key] = definition
        backlog = self._backlog
        durables = {k for k, d in rec.endpoints.items() if d.get("type") == "durable"}
        if not backlog or not durables:
            rows: Iterable[tuple[Any, Any]] = conn.execute("SELECT id, data FROM messages")
            for endpoint, mid, count in conn.execute(
                "SELECT endpoint, msg, count FROM entries ORDER BY seq"
            ):
                rec.entries.setdefault(endpoint, []).append((mid, count))
        else:
            rows = self._recover_entries(conn, rec, durables, backlog)
        corrupt: set[int] = set()
        for mid, data in rows:
            try:
                msg = decode_message(data)
            except MessageFormatError as exc:
                self._corrupt(f"message {mid}", exc)
                conn.execute(_DELETE_MESSAGE, (mid,))
                conn.execute("DELETE FROM entries WHERE msg = ?", (mid,))
                corrupt.add(mid)
                continue
            msg.store_id = mid
            rec.messages[mid] = msg
        if corrupt:
            for key, kept in list(rec.entries.items()):
                kept = [e for e in kept if e[0] not in corrupt]
                if kept:
                    rec.entries[key] = kept
                else:
                    del rec.entries[key]
        for ns, key, value in conn.execute("SELECT ns, key, value FROM kv"):
            rec.kv.setdefault(ns, {})[key] = bytes(value)
        self._next_id = self._max_id_written + 1
        return rec

    def _recover_entries(self, conn: sqlite3.Connection, rec: Recovered, durables: set[str],
                         backlog: int) -> list[tuple[Any, Any]]:
        """The entries to recover, each durable subscription's past its first ``backlog``
        left as its tail (counted in ``rec.tails``); returns the message rows those entries
        reference. An entry past the first ``backlog`` with an id below the cursor (entry
        order and id order disagree: not written by this gateway) is recovered as well."""
        tails: dict[str, list[int]] = {}
        top: dict[str, int] = {}  # the highest id recovered, per durable subscription
        entries = rec.entries
        for endpoint, mid, count, size in conn.execute(
            "SELECT e.endpoint, e.msg, e.count, length(m.data) FROM entries AS e "
            "JOIN messages AS m ON m.id = e.msg ORDER BY e.seq"
        ):
            kept = entries.get(endpoint)
            if kept is None:
                kept = entries[endpoint] = []
            if endpoint in durables:
                high = top.get(endpoint, 0)
                if len(kept) >= backlog and mid > high:
                    tail = tails.get(endpoint)
                    if tail is None:
                        tail = tails[endpoint] = [0, 0, high]
                    tail[0] += 1
                    tail[1] += size
                    continue
                if mid > high and endpoint not in tails:
                    top[endpoint] = mid
            kept.append((mid, count))
        for key, (n, nbytes, cursor) in tails.items():
            rec.tails[key] = (n, nbytes, cursor)
        ids = sorted({mid for kept in entries.values() for mid, _ in kept})
        rows: list[tuple[Any, Any]] = []
        head, row, tail_sql = _SELECT_MESSAGES
        for i in range(0, len(ids), MAX_ROWS):
            chunk = ids[i : i + MAX_ROWS]
            rows.extend(conn.execute(head + ",".join([row] * len(chunk)) + tail_sql, chunk))
        return rows

    def _corrupt(self, what: str, exc: Exception) -> None:
        if not self.force_start:
            raise StoreError(
                f"store {self.path}: {what} is corrupt ({exc}); the gateway will not start. "
                "Open the store with force_start to drop corrupt records (their data is lost)"
            )
        log.error("store %s: dropping corrupt %s (%s)", self.path, what, exc)

    def _write_loop(self, conn: sqlite3.Connection) -> None:
        cv = self._cv
        while True:
            with cv:
                while not self._queue and not self._stopping:
                    self._idle = True
                    cv.wait()
                self._idle = False
                queued = self._queue
                if not queued:
                    return  # stopping, and everything is written
                self._queue = []
                reads, self._reads = self._reads, 0
            try:
                if not reads:
                    self._write(conn, queued)  # type: ignore[arg-type]  # units only
                    continue
                # Each read comes after the units queued before it.
                units: list[_Unit] = []
                for item in queued:
                    if isinstance(item, _Read):
                        if units:
                            self._write(conn, units)
                            units = []
                        self._read(conn, item)
                    else:
                        units.append(item)
                if units:
                    self._write(conn, units)
            except Exception:  # pragma: no cover - a bug; keep the writer alive
                log.exception("store %s: unexpected error in the writer thread", self.path)

    def _read(self, conn: sqlite3.Connection, read: _Read) -> None:
        """Writer thread: select and decode the rows of ``read``, then answer it."""
        if read.endpoint:
            self._read_tail(conn, read)
            return
        found = read.found
        ids = read.ids
        head, row, tail = _SELECT_MESSAGES
        try:
            for i in range(0, len(ids), MAX_ROWS):
                chunk = ids[i : i + MAX_ROWS]
                sql = head + ",".join([row] * len(chunk)) + tail
                for mid, data in conn.execute(sql, chunk):
                    try:
                        msg = decode_message(data)
                    except MessageFormatError as exc:
                        log.error("store %s: message %d does not decode: %s", self.path, mid, exc)
                        continue
                    msg.store_id = mid
                    found[mid] = msg
        except sqlite3.Error as exc:
            self.stats["errors"] += 1
            self.last_error = exc
            log.error("store %s: reading %d messages back failed: %s", self.path, len(ids), exc)
        if read.waiter is not None:
            read.waiter.event.set()
        elif read.callback is not None:
            self._post(read.callback, found)

    def _read_tail(self, conn: sqlite3.Connection, read: _Read) -> None:
        """Writer thread: the next entries of a durable subscription's tail, decoded."""
        rows: list[tuple[int, int, Message | None]] = []
        try:
            for mid, count, data in conn.execute(_SELECT_TAIL,
                                                 (read.endpoint, read.after, read.limit)):
                try:
                    msg = decode_message(data)
                except MessageFormatError as exc:
                    log.error("store %s: message %d does not decode: %s", self.path, mid, exc)
                    rows.append((mid, count, None))
                    continue
                msg.store_id = mid
                rows.append((mid, count, msg))
        except sqlite3.Error as exc:
            self.stats["errors"] += 1
            self.last_error = exc
            log.error("store %s: reading the stored messages of %s failed: %s",
                      self.path, read.endpoint, exc)
            rows = []
        if read.entries_callback is not None:
            self._post(read.entries_callback, rows)

    def _write(self, conn: sqlite3.Connection, units: list[_Unit]) -> None:
        """Write ``units`` as one batch; on failure retry them one by one."""
        start = time.perf_counter_ns()
        try:
            self._transaction(conn, [u[0] for u in units])
        except Exception as exc:
            self.stats["failed_batches"] += 1
            if len(units) == 1:
                self._failed(units, exc)
                return
            log.error(
                "store %s: a batch of %d units failed (%s); retrying them one by one",
                self.path, len(units), exc,
            )  # fmt: skip
            for unit in units:
                try:
                    self._transaction(conn, [unit[0]])
                except Exception as unit_exc:
                    self.stats["failed_batches"] += 1
                    self._failed([unit], unit_exc)
                else:
                    self._succeeded([unit], start)
            return
        self._succeeded(units, start)

    def _transaction(self, conn: sqlite3.Connection, op_lists: list[list[tuple[Any, ...]]]) -> None:
        conn.execute("BEGIN")
        try:
            max_id, netted = apply_ops(conn, op_lists)
            self.stats["netted"] += netted
            if max_id > self._max_id_written:
                conn.execute(_PUT_META, ("max_id", max_id))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error as exc:  # pragma: no cover - nothing more to do
                    log.error("store %s: rollback failed: %s", self.path, exc)
            raise
        if max_id > self._max_id_written:
            self._max_id_written = max_id

    def _succeeded(self, units: list[_Unit], start: int) -> None:
        took = (time.perf_counter_ns() - start) // 1000
        stats = self.stats
        stats["batches"] += 1
        stats["commits"] += len(units)
        stats["ops"] += sum(len(u[0]) for u in units)
        stats["max_batch"] = max(stats["max_batch"], len(units))
        stats["last_batch_us"] = took
        stats["last_batch_ms"] = took // 1000
        self.batch_us.observe(took)
        self.batch_units.observe(len(units))
        callbacks = [u[1] for u in units if u[1] is not None]
        if callbacks:
            self._post(_run_callbacks, callbacks)
        for u in units:
            if u[3] is not None:
                u[3].event.set()

    def _failed(self, units: list[_Unit], exc: Exception) -> None:
        self.stats["errors"] += len(units)
        self.last_error = exc
        expected = isinstance(exc, (sqlite3.Error, OSError))
        log.error(
            "store %s: write failed, %d unit(s) not stored: %s",
            self.path, len(units), exc, exc_info=not expected,
        )  # fmt: skip
        calls = [(u[2], exc) for u in units if u[2] is not None]
        if calls:
            self._post(_run_error_callbacks, calls)
        for u in units:
            if u[3] is not None:
                u[3].error = exc
                u[3].event.set()

    def _post(self, fn: Callable[..., None], arg: Any) -> None:
        call_soon = self._call_soon
        assert call_soon is not None
        try:
            call_soon(fn, arg)
        except RuntimeError as exc:  # the loop is closed; nobody is left to tell
            log.warning("store %s: cannot run callbacks, loop is gone: %s", self.path, exc)
