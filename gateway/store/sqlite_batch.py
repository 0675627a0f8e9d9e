"""How the SQLite store's writer thread turns one batch of ops into SQL.

:class:`~gateway.store.sqlite.SqliteStore`'s writer thread takes every queued unit of work at
once and hands their op lists to :func:`apply_ops` inside one transaction. Before executing a
batch it coalesces it: a message put and deleted in the same batch, or an entry added and
removed, never reaches the database; the rest goes out with one ``executemany`` (or a few
multi-row statements, :func:`execute_rows`) per statement kind. Entries keep their insertion
order through an integer primary key (``seq``). ``delete_endpoint`` is a barrier: the entries
collected before it are written first, so it deletes exactly the entries submitted before it.

``delete_unreferenced`` deletes are conditional (the store's module docstring says why) and
run after the batch's entries are written; a row put in the same batch whose every entry was
netted away is netted with it.

Everything here runs on the writer thread, the connection's only user.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import Any

from gateway.store.base import (
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
)

# Multi-row statements as (head, one row, tail): see execute_rows.
_PUT_MESSAGES = ("INSERT OR REPLACE INTO messages (id, data) VALUES ", "(?,?)", "")
_DELETE_MESSAGES = ("DELETE FROM messages WHERE id IN (", "?", ")")
_INSERT_ENTRIES = (
    "INSERT INTO entries (endpoint, msg, count) VALUES ",
    "(?,?,?)",
    " ON CONFLICT (endpoint, msg) DO UPDATE SET count = excluded.count",
)
_DELETE_ENTRIES = ("DELETE FROM entries WHERE endpoint = ? AND msg IN (", "?", ")")
# The terms must be those of the index's WHERE for SQLite to use the partial index.
_SUB_ENTRY = "endpoint >= 'sub:' AND endpoint < 'sub;'"
_DELETE_UNREFERENCED = (
    "DELETE FROM messages WHERE id IN (",
    "?",
    ") AND NOT EXISTS (SELECT 1 FROM entries WHERE entries.msg = messages.id AND "
    + _SUB_ENTRY + ")",
)
# A durable subscription's messages no other durable subscription references (before its
# entries go).
_DELETE_SUB_MESSAGES = (
    "DELETE FROM messages WHERE id IN (SELECT msg FROM entries WHERE endpoint = ?) AND NOT "
    "EXISTS (SELECT 1 FROM entries AS e2 WHERE e2.msg = messages.id AND e2.endpoint != ? AND "
    "e2." + _SUB_ENTRY.replace("AND endpoint", "AND e2.endpoint") + ")"
)
_UPDATE_ENTRY = "UPDATE entries SET count = ? WHERE endpoint = ? AND msg = ?"
_DELETE_ENDPOINT_ENTRIES = "DELETE FROM entries WHERE endpoint = ?"
_PUT_ENDPOINT = "INSERT OR REPLACE INTO endpoints (key, def) VALUES (?, ?)"
DELETE_ENDPOINT = "DELETE FROM endpoints WHERE key = ?"
_PUT_KV = "INSERT OR REPLACE INTO kv (ns, key, value) VALUES (?, ?, ?)"
_DELETE_KV = "DELETE FROM kv WHERE ns = ? AND key = ?"

# Net state of one (endpoint, id) entry within a batch.
_NEW = 1  # added in this batch: insert (a remove cancels it)
_UPDATE = 2  # existed before: update the count
_DELETE = 3  # existed before: delete
_REINSERT = 4  # existed, removed, added again: delete, then insert at the end
_UPSERT = 5  # updated, then added: insert where added, or update the count if it exists


def apply_ops(conn: sqlite3.Connection,
              op_lists: Iterable[list[tuple[Any, ...]]]) -> tuple[int, int]:
    """Coalesce and execute the ops of one batch; returns the highest fresh message id
    seen, and how many ops coalescing cancelled."""
    msgs: dict[int, bytes | None] = {}
    fresh: set[int] = set()
    ents: dict[tuple[str, int], tuple[int, int]] = {}
    kvs: dict[tuple[str, str], bytes | None] = {}
    eps: dict[str, str | None] = {}
    unref: list[int] = []  # conditional deletes (delete_unreferenced), after the entries
    unref_fresh: list[int] = []  # ... of messages put in this batch: perhaps netted
    max_id = netted = 0
    for ops in op_lists:
        for op in ops:
            code = op[0]
            if code == OP_PUT_MESSAGE:
                sid = op[1]
                msgs[sid] = op[2]
                if op[3]:
                    fresh.add(sid)
                    if sid > max_id:
                        max_id = sid
            elif code == OP_ADD_ENTRY:
                key = (op[1], op[2])
                prev = ents.get(key)
                if prev is None or prev[0] == _NEW:
                    ents[key] = (_NEW, op[3])
                elif prev[0] == _DELETE:
                    del ents[key]  # re-added: goes to the end
                    ents[key] = (_REINSERT, op[3])
                elif prev[0] == _REINSERT:
                    ents[key] = (_REINSERT, op[3])
                else:
                    if prev[0] == _UPDATE:
                        del ents[key]  # its place is where it is added
                    ents[key] = (_UPSERT, op[3])
            elif code == OP_REMOVE_ENTRY:
                key = (op[1], op[2])
                prev = ents.get(key)
                if prev is not None and prev[0] == _NEW:
                    del ents[key]
                    netted += 2
                else:
                    ents[key] = (_DELETE, 0)
            elif code == OP_UPDATE_ENTRY:
                key = (op[1], op[2])
                prev = ents.get(key)
                if prev is None:
                    ents[key] = (_UPDATE, op[3])
                elif prev[0] != _DELETE:
                    ents[key] = (prev[0], op[3])
            elif code == OP_DELETE_MESSAGE:
                sid = op[1]
                if sid in fresh:
                    fresh.discard(sid)
                    del msgs[sid]
                    netted += 2
                else:
                    msgs[sid] = None
            elif code == OP_DELETE_UNREFERENCED:
                if op[1] in fresh:
                    unref_fresh.append(op[1])
                else:
                    unref.append(op[1])
            elif code == OP_PUT_KV:
                kvs[op[1], op[2]] = op[3]
            elif code == OP_DELETE_KV:
                kvs[op[1], op[2]] = None
            elif code == OP_PUT_ENDPOINT:
                eps[op[1]] = op[2]
            elif code == OP_DELETE_ENDPOINT:
                if ents:  # a barrier: entries submitted before it go first
                    _write_entries(conn, ents)
                    ents = {}
                if op[1].startswith("sub:"):
                    # A durable subscription: the rows only it references (its tail's
                    # among them) go with its entries, so the messages put before it
                    # are written first, and none of them is netted any more.
                    if msgs:
                        _write_messages(conn, msgs)
                        msgs = {}
                    fresh.clear()
                    unref.extend(unref_fresh)
                    unref_fresh = []
                    conn.execute(_DELETE_SUB_MESSAGES, (op[1], op[1]))
                conn.execute(_DELETE_ENDPOINT_ENTRIES, (op[1],))
                eps[op[1]] = None
            else:  # pragma: no cover - a bug in this module
                raise AssertionError(f"unknown store op {op!r}")
    if unref_fresh:
        # Put in this batch: if none of its entries is left either, it never was.
        live = {k[1] for k, v in ents.items() if v[0] != _DELETE and v[0] != _UPDATE}
        for sid in unref_fresh:
            if sid in live or sid not in msgs:
                unref.append(sid)
            else:
                del msgs[sid]
                netted += 2
    if msgs:
        _write_messages(conn, msgs)
    if ents:
        _write_entries(conn, ents)
    if unref:
        execute_rows(conn, _DELETE_UNREFERENCED, [(k,) for k in unref])
    if kvs:
        conn.executemany(_PUT_KV, [(k[0], k[1], v) for k, v in kvs.items() if v is not None])
        conn.executemany(_DELETE_KV, [k for k, v in kvs.items() if v is None])
    if eps:
        conn.executemany(_PUT_ENDPOINT, [(k, v) for k, v in eps.items() if v is not None])
        conn.executemany(DELETE_ENDPOINT, [(k,) for k, v in eps.items() if v is None])
    return max_id, netted


def _write_messages(conn: sqlite3.Connection, msgs: dict[int, bytes | None]) -> None:
    puts = [(k, v) for k, v in msgs.items() if v is not None]
    if puts:
        execute_rows(conn, _PUT_MESSAGES, puts)
    if len(puts) != len(msgs):
        execute_rows(conn, _DELETE_MESSAGES, [(k,) for k, v in msgs.items() if v is None])


def _write_entries(conn: sqlite3.Connection, ents: dict[tuple[str, int], tuple[int, int]]) -> None:
    deletes: dict[str, list[tuple[int]]] = {}
    inserts: list[tuple[str, int, int]] = []
    updates: list[tuple[int, str, int]] = []
    for key, (state, count) in ents.items():
        if state == _NEW or state == _UPSERT:
            inserts.append((key[0], key[1], count))
        elif state == _UPDATE:
            updates.append((count, key[0], key[1]))
        else:
            deletes.setdefault(key[0], []).append((key[1],))
            if state == _REINSERT:
                inserts.append((key[0], key[1], count))
    for endpoint, ids in deletes.items():
        execute_rows(conn, _DELETE_ENTRIES, ids, (endpoint,))
    if inserts:
        execute_rows(conn, _INSERT_ENTRIES, inserts)
    if updates:
        conn.executemany(_UPDATE_ENTRY, updates)


# Rows per statement in execute_rows. The sqlite3 module releases the GIL around every step,
# and each release can hand the GIL to the loop thread and wait up to the switch interval to
# get it back; one statement for many rows keeps the writer from slowing the loop down.
# 3 x 256 parameters stay below SQLite's historic 999-variable limit.
MAX_ROWS = 256
_SQL_CACHE: dict[tuple[tuple[str, str, str], int], str] = {}


def execute_rows(
    conn: sqlite3.Connection,
    template: tuple[str, str, str],
    rows: list[tuple[Any, ...]],
    prefix: tuple[Any, ...] = (),
) -> None:
    """Execute ``template`` for all ``rows`` with few statements of 2**k rows each."""
    head, row, tail = template
    i, total = 0, len(rows)
    while i < total:
        n = min(total - i, MAX_ROWS)
        n = 1 << (n.bit_length() - 1)  # a power of two, so few distinct statements
        sql = _SQL_CACHE.get((template, n))
        if sql is None:
            sql = _SQL_CACHE[template, n] = head + ",".join([row] * n) + tail
        params = list(prefix)
        for r in rows[i : i + n]:
            params.extend(r)
        conn.execute(sql, params)
        i += n
