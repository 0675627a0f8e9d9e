"""The certified-delivery ledger: what a CM transport must remember (TIBCO Rendezvous Concepts,
Certified Message Delivery, "Ledger").

A ledger records, for the sending side, the last sequence number given out on each subject,
the listeners registered for each subject (with the last sequence number each confirmed),
every certified message not yet confirmed by all of its listeners (its bytes, its time limit
and the listeners that still owe a confirmation), and the listeners this sender disallows;
for the listening side, each (sender, subject) it receives certified messages from and the
last sequence number it confirmed there.

:class:`CmCore <transports.rv.cm.CmCore>` keeps all of that in memory and tells its ledger
every change as it happens (``set_seq``, ``put_message``, ``confirm``, ...). The ledger
writes the changes when :meth:`commit` is called, which the core does once per turn of its
driver, before anything of that turn goes on the wire: one transaction, and with
``sync=True`` one fsync, for every change of the turn (a group commit). So a sequence number
is on disk before a message carrying it is sent, and a confirmation is sent only once the
position it confirms is on disk.

Two kinds:

* :class:`Ledger` itself -- a process-based ledger: nothing is written; certification lasts as
  long as the process (a transient correspondent, or a named one without a ledger file).
* :class:`SqliteLedger` -- a file-based ledger in SQLite (the standard library's), which
  makes a named CM transport a *persistent correspondent*: its state survives a restart.
  ``sync=True`` (``sync_ledger`` in a transport's parameters) runs SQLite with
  ``synchronous=FULL``, so a committed change survives a power loss; ``sync=False`` uses
  ``NORMAL``, which survives a crash of the process but may lose the last changes on power
  loss. The file is locked (``<path>.lock``, an exclusive ``flock``) while open, since two CM
  transports must never use one ledger file at the same time; it remembers the correspondent
  name it was made for and refuses another. Keep it on a local disk.

Schema (version 1)::

    meta(key PRIMARY KEY, value)                 -- "version", "name"
    seqs(subject PRIMARY KEY, last)              -- sender: last sequence number given out
    regs(subject, listener, last, PRIMARY KEY (subject, listener))
                                                 -- sender: registered listeners, last confirmed
    msgs(subject, seq, deadline, data, PRIMARY KEY (subject, seq))
                                                 -- sender: messages not yet confirmed by all;
                                                 -- deadline: wall-clock seconds, 0 = none
    pending(subject, seq, listener, PRIMARY KEY (subject, seq, listener))
                                                 -- sender: who still owes a confirmation
    disallowed(listener PRIMARY KEY)             -- sender: listeners refused certification
    sources(sender, subject, confirmed, PRIMARY KEY (sender, subject))
                                                 -- listener: last sequence number confirmed

The ledger is never cleared by the bus itself (as Rendezvous never deletes ledger files); a
message leaves it when every listener confirmed it, or when its time limit passed.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from dataclasses import dataclass, field
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Linux
    fcntl = None  # type: ignore[assignment]

SCHEMA_VERSION = 1

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS seqs (subject TEXT PRIMARY KEY, last INTEGER NOT NULL)"
    " WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS regs (subject TEXT NOT NULL, listener TEXT NOT NULL,"
    " last INTEGER NOT NULL, PRIMARY KEY (subject, listener)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS msgs (subject TEXT NOT NULL, seq INTEGER NOT NULL,"
    " deadline REAL NOT NULL, data BLOB NOT NULL, PRIMARY KEY (subject, seq))",
    "CREATE TABLE IF NOT EXISTS pending (subject TEXT NOT NULL, seq INTEGER NOT NULL,"
    " listener TEXT NOT NULL, PRIMARY KEY (subject, seq, listener)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS disallowed (listener TEXT PRIMARY KEY) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS sources (sender TEXT NOT NULL, subject TEXT NOT NULL,"
    " confirmed INTEGER NOT NULL, PRIMARY KEY (sender, subject)) WITHOUT ROWID",
)


class LedgerError(RuntimeError):
    """The ledger file cannot be used: locked by another transport, made for another
    correspondent name, of an unknown schema version, or unreadable."""


@dataclass
class StoredMessage:
    """A certified message some registered listener has not confirmed yet."""

    data: bytes  # the labeled message, encoded (what a retransmission sends again)
    deadline: float  # wall-clock seconds after which it is no longer certified; 0 = never
    pending: set[str]  # listeners that still owe a confirmation
    sent_at: float = 0.0  # when it was last sent (kept in memory only)


@dataclass
class LedgerState:
    """What a ledger holds, as :meth:`Ledger.load` returns it."""

    seqs: dict[str, int] = field(default_factory=dict)
    regs: dict[str, dict[str, int]] = field(default_factory=dict)  # subject -> listener -> last
    msgs: dict[str, dict[int, StoredMessage]] = field(default_factory=dict)  # in seq order
    disallowed: set[str] = field(default_factory=set)
    sources: dict[tuple[str, str], int] = field(default_factory=dict)  # (sender, subject)


class Ledger:
    """The process-based ledger, and the interface of every ledger: every change method does
    nothing here, so certification lasts as long as the process."""

    persistent = False

    def load(self, name: str) -> LedgerState:
        """The state left by the previous run of correspondent ``name`` (empty here)."""
        return LedgerState()

    def set_seq(self, subject: str, last: int) -> None: ...

    def put_reg(self, subject: str, listener: str, last: int) -> None: ...

    def delete_reg(self, subject: str, listener: str) -> None: ...

    def put_message(self, subject: str, seq: int, msg: StoredMessage) -> None: ...

    def confirm(self, subject: str, seq: int, listener: str) -> None: ...

    def delete_message(self, subject: str, seq: int) -> None: ...

    def set_disallowed(self, listener: str, disallowed: bool) -> None: ...

    def put_source(self, sender: str, subject: str, confirmed: int) -> None: ...

    def delete_source(self, sender: str, subject: str) -> None: ...

    def commit(self) -> None:
        """Make every change so far durable (as durable as the ledger is)."""

    def close(self) -> None: ...



class SqliteLedger(Ledger):
    """A file-based ledger (module docstring). Opened by :meth:`load`."""

    persistent = True

    def __init__(self, path: str | os.PathLike[str], *, sync: bool = True) -> None:
        self.path = os.fspath(path)
        self.sync = sync
        self._conn: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        # What the next commit writes. A message put since the last commit is kept as the
        # core's own object, so what happens to it before the commit (confirmations, its
        # deletion) is netted: only what is left of it is written, or nothing.
        self._ops: list[tuple[str, tuple[Any, ...]]] = []
        self._seqs: dict[str, int] = {}
        self._fresh: dict[tuple[str, int], StoredMessage] = {}
        self.commits = 0  # transactions written (a turn with no change writes none)

    def load(self, name: str) -> LedgerState:
        self._lock()
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            self._unlock()
            raise LedgerError(f"ledger {self.path}: cannot open: {exc}") from exc
        try:
            state = self._open(conn, name)
        except BaseException:
            conn.close()
            self._unlock()
            raise
        self._conn = conn
        return state

    def _open(self, conn: sqlite3.Connection, name: str) -> LedgerState:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=" + ("FULL" if self.sync else "NORMAL"))
            conn.execute("BEGIN")
            for stmt in _SCHEMA:
                conn.execute(stmt)
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            if not meta:
                conn.execute("INSERT INTO meta VALUES ('version', ?), ('name', ?)",
                             (SCHEMA_VERSION, name))
            elif meta.get("version") != SCHEMA_VERSION:
                raise LedgerError(f"ledger {self.path}: schema version {meta.get('version')!r},"
                                  f" this bus reads {SCHEMA_VERSION}")
            elif meta.get("name") != name:
                raise LedgerError(f"ledger {self.path} belongs to correspondent "
                                  f"{meta.get('name')!r}, not {name!r}")
            conn.execute("COMMIT")
            return self._read(conn)
        except sqlite3.Error as exc:
            raise LedgerError(f"ledger {self.path}: {exc}") from exc
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")

    @staticmethod
    def _read(conn: sqlite3.Connection) -> LedgerState:
        state = LedgerState()
        state.seqs = dict(conn.execute("SELECT subject, last FROM seqs"))
        for subject, listener, last in conn.execute("SELECT subject, listener, last FROM regs"):
            state.regs.setdefault(subject, {})[listener] = last
        for subject, seq, deadline, data in conn.execute(
                "SELECT subject, seq, deadline, data FROM msgs ORDER BY subject, seq"):
            state.msgs.setdefault(subject, {})[seq] = StoredMessage(bytes(data), deadline, set())
        for subject, seq, listener in conn.execute(
                "SELECT subject, seq, listener FROM pending"):
            stored = state.msgs.get(subject, {}).get(seq)
            if stored is not None:
                stored.pending.add(listener)
        state.disallowed = {row[0] for row in conn.execute("SELECT listener FROM disallowed")}
        for sender, subject, confirmed in conn.execute(
                "SELECT sender, subject, confirmed FROM sources"):
            state.sources[(sender, subject)] = confirmed
        return state

    def _lock(self) -> None:
        if fcntl is None:  # pragma: no cover - not on Linux
            return
        fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise LedgerError(f"ledger {self.path} is in use by another CM transport") from exc
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    # -- changes (written at commit) ----------------------------------------------------------

    def set_seq(self, subject: str, last: int) -> None:
        self._seqs[subject] = last

    def put_reg(self, subject: str, listener: str, last: int) -> None:
        self._ops.append(("INSERT OR REPLACE INTO regs VALUES (?, ?, ?)",
                          (subject, listener, last)))

    def delete_reg(self, subject: str, listener: str) -> None:
        self._ops.append(("DELETE FROM regs WHERE subject = ? AND listener = ?",
                          (subject, listener)))
        self._ops.append(("DELETE FROM pending WHERE subject = ? AND listener = ?",
                          (subject, listener)))

    def put_message(self, subject: str, seq: int, msg: StoredMessage) -> None:
        self._fresh[(subject, seq)] = msg  # its pending set is read at the commit

    def confirm(self, subject: str, seq: int, listener: str) -> None:
        if (subject, seq) not in self._fresh:
            self._ops.append(("DELETE FROM pending WHERE subject = ? AND seq = ? AND "
                              "listener = ?", (subject, seq, listener)))

    def delete_message(self, subject: str, seq: int) -> None:
        if self._fresh.pop((subject, seq), None) is not None:
            return  # put and deleted between two commits: never written
        self._ops.append(("DELETE FROM msgs WHERE subject = ? AND seq = ?", (subject, seq)))
        self._ops.append(("DELETE FROM pending WHERE subject = ? AND seq = ?", (subject, seq)))

    def set_disallowed(self, listener: str, disallowed: bool) -> None:
        if disallowed:
            self._ops.append(("INSERT OR REPLACE INTO disallowed VALUES (?)", (listener,)))
        else:
            self._ops.append(("DELETE FROM disallowed WHERE listener = ?", (listener,)))

    def put_source(self, sender: str, subject: str, confirmed: int) -> None:
        self._ops.append(("INSERT OR REPLACE INTO sources VALUES (?, ?, ?)",
                          (sender, subject, confirmed)))

    def delete_source(self, sender: str, subject: str) -> None:
        self._ops.append(("DELETE FROM sources WHERE sender = ? AND subject = ?",
                          (sender, subject)))

    def commit(self) -> None:
        """Write every change since the last commit in one transaction.

        Raises:
            LedgerError: the write failed (disk full, I/O error); the changes are kept and
                written with the next commit.
        """
        ops, seqs, fresh = self._ops, self._seqs, self._fresh
        if not ops and not seqs and not fresh:
            return
        conn = self._conn
        if conn is None:
            raise LedgerError(f"ledger {self.path} is not open")
        try:
            conn.execute("BEGIN")
            for sql, args in ops:
                conn.execute(sql, args)
            conn.executemany("INSERT OR REPLACE INTO seqs VALUES (?, ?)", seqs.items())
            conn.executemany("INSERT OR REPLACE INTO msgs VALUES (?, ?, ?, ?)",
                             [(k[0], k[1], m.deadline, m.data) for k, m in fresh.items()])
            conn.executemany("INSERT OR REPLACE INTO pending VALUES (?, ?, ?)",
                             [(k[0], k[1], listener) for k, m in fresh.items()
                              for listener in m.pending])
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise LedgerError(f"ledger {self.path}: write failed: {exc}") from exc
        self._ops, self._seqs, self._fresh = [], {}, {}
        self.commits += 1

    def close(self) -> None:
        if self._conn is not None:
            try:
                self.commit()
            finally:
                self._conn.close()
                self._conn = None
                self._unlock()
