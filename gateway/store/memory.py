"""A store that keeps nothing durable (``store_type = memory``) -- and a model for tests.

How this works. Every call succeeds at once; ids are assigned as by the SQLite store; a
commit's callback runs on the next loop turn (through the loop's ``call_soon_threadsafe``),
so callers see the same asynchrony as with a real store. Nothing survives the process.

With ``retain=True`` (tests) it also keeps what it was told, applied unit by unit at commit
with messages encoded at put time, and a later :meth:`MemoryStore.open` of the same instance
returns it -- a restart without a disk, with the same recovery rules as the SQLite store
(entries whose message is gone and messages no entry references are dropped).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from gateway.message import Message
from gateway.serial import decode_message, encode_message
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
    Callback,
    EntriesCallback,
    ErrorCallback,
    ReadCallback,
    Recovered,
    StoreError,
)


class MemoryStore:
    """Non-durable store; ``retain=True`` keeps state across close/open of this instance."""

    def __init__(self, *, retain: bool = False) -> None:
        self.retain = retain
        self.stats: dict[str, int] = dict.fromkeys(
            ("commits", "ops", "batches", "max_batch", "last_batch_ms", "last_batch_us",
             "netted", "errors", "failed_batches"),
            0,
        )  # fmt: skip
        # Nothing to read back from: the broker keeps every message in memory (no swapping).
        self.swappable = False
        self._call_soon: Callable[..., object] | None = None
        self._next_id = 1
        self._unit: list[tuple[Any, ...]] = []
        # retained state (retain=True only)
        self._messages: dict[int, bytes] = {}
        self._entries: dict[str, dict[int, int]] = {}  # endpoint -> id -> count, in order
        self._endpoints: dict[str, str] = {}
        self._kv: dict[str, dict[str, bytes]] = {}

    def open(self, call_soon_threadsafe: Callable[..., object], backlog: int = 0) -> Recovered:
        """``backlog`` is ignored: without swapping there are no tails, so everything comes
        back."""
        if self._call_soon is not None:
            raise StoreError("memory store is already open")
        self._call_soon = call_soon_threadsafe
        rec = Recovered()
        if not self.retain:
            return rec
        for ids in self._entries.values():
            for mid in [m for m in ids if m not in self._messages]:
                del ids[mid]
        referenced = {m for ids in self._entries.values() for m in ids}
        for mid in [m for m in self._messages if m not in referenced]:
            del self._messages[mid]
        for mid, data in self._messages.items():
            msg = decode_message(data)
            msg.store_id = mid
            rec.messages[mid] = msg
        rec.endpoints = {k: json.loads(v) for k, v in self._endpoints.items()}
        rec.entries = {ep: list(ids.items()) for ep, ids in self._entries.items() if ids}
        rec.kv = {ns: dict(d) for ns, d in self._kv.items() if d}
        return rec

    def put_endpoint(self, key: str, definition: dict[str, Any]) -> None:
        text = json.dumps(definition, sort_keys=True, separators=(",", ":"))
        if self.retain:
            self._unit.append((OP_PUT_ENDPOINT, key, text))

    def delete_endpoint(self, key: str) -> None:
        if self.retain:
            self._unit.append((OP_DELETE_ENDPOINT, key))

    def put_message(self, msg: Message) -> int:
        data = encode_message(msg) if self.retain else b""
        sid = msg.store_id
        if not sid:
            sid = msg.store_id = self._next_id
            self._next_id = sid + 1
        if self.retain:
            self._unit.append((OP_PUT_MESSAGE, sid, data, True))
        return sid

    def delete_message(self, store_id: int) -> None:
        if self.retain:
            self._unit.append((OP_DELETE_MESSAGE, store_id))

    def delete_unreferenced(self, store_id: int) -> None:
        if self.retain:
            self._unit.append((OP_DELETE_UNREFERENCED, store_id))

    def add_entry(self, endpoint_key: str, store_id: int, delivery_count: int = 0) -> None:
        if self.retain:
            self._unit.append((OP_ADD_ENTRY, endpoint_key, store_id, delivery_count))

    def remove_entry(self, endpoint_key: str, store_id: int) -> None:
        if self.retain:
            self._unit.append((OP_REMOVE_ENTRY, endpoint_key, store_id))

    def update_entry(self, endpoint_key: str, store_id: int, delivery_count: int) -> None:
        if self.retain:
            self._unit.append((OP_UPDATE_ENTRY, endpoint_key, store_id, delivery_count))

    def put_kv(self, namespace: str, key: str, value: bytes) -> None:
        if self.retain:
            self._unit.append((OP_PUT_KV, namespace, key, bytes(value)))

    def delete_kv(self, namespace: str, key: str) -> None:
        if self.retain:
            self._unit.append((OP_DELETE_KV, namespace, key))

    def commit(
        self, callback: Callback | None = None, on_error: ErrorCallback | None = None
    ) -> None:
        """Apply the unit (``retain``) and run ``callback`` on the next loop turn."""
        unit, self._unit = self._unit, []
        if unit:
            self._apply(unit)
        stats = self.stats
        stats["commits"] += 1
        stats["batches"] += 1
        stats["ops"] += len(unit)
        stats["max_batch"] = 1
        if callback is not None:
            if self._call_soon is None:
                raise StoreError("memory store is not open")
            self._call_soon(callback)

    def read_messages(self, store_ids: list[int], callback: ReadCallback) -> None:
        """What ``retain`` kept of those messages, on the next loop turn."""
        if self._call_soon is None:
            raise StoreError("memory store is not open")
        self._call_soon(callback, self.read_now(store_ids))

    def read_entries(self, endpoint_key: str, after: int, limit: int,
                     callback: EntriesCallback) -> None:
        """What ``retain`` kept of that endpoint's entries, on the next loop turn."""
        if self._call_soon is None:
            raise StoreError("memory store is not open")
        rows: list[tuple[int, int, Message | None]] = []
        for sid, count in sorted(self._entries.get(endpoint_key, {}).items()):
            data = self._messages.get(sid)
            if sid > after and data is not None and len(rows) < limit:
                msg = decode_message(data)
                msg.store_id = sid
                rows.append((sid, count, msg))
        self._call_soon(callback, rows)

    def read_now(self, store_ids: list[int]) -> dict[int, Message]:
        out: dict[int, Message] = {}
        for sid in store_ids:
            data = self._messages.get(sid)
            if data is not None:
                msg = out[sid] = decode_message(data)
                msg.store_id = sid
        return out

    def flush(self) -> None:
        if self._unit:
            self.commit()

    def close(self) -> None:
        self.flush()
        self._call_soon = None

    def _apply(self, unit: list[tuple[Any, ...]]) -> None:
        msgs, entries = self._messages, self._entries
        for op in unit:
            code = op[0]
            if code == OP_PUT_MESSAGE:
                msgs[op[1]] = op[2]
            elif code == OP_DELETE_MESSAGE:
                msgs.pop(op[1], None)
            elif code == OP_DELETE_UNREFERENCED:
                if not any(op[1] in ids for ids in entries.values()):
                    msgs.pop(op[1], None)
            elif code == OP_ADD_ENTRY:
                entries.setdefault(op[1], {})[op[2]] = op[3]
            elif code == OP_REMOVE_ENTRY:
                entries.get(op[1], {}).pop(op[2], None)
            elif code == OP_UPDATE_ENTRY:
                ids = entries.get(op[1])
                if ids is not None and op[2] in ids:
                    ids[op[2]] = op[3]
            elif code == OP_PUT_ENDPOINT:
                self._endpoints[op[1]] = op[2]
            elif code == OP_DELETE_ENDPOINT:
                self._endpoints.pop(op[1], None)
                entries.pop(op[1], None)
            elif code == OP_PUT_KV:
                self._kv.setdefault(op[1], {})[op[2]] = op[3]
            elif code == OP_DELETE_KV:
                self._kv.get(op[1], {}).pop(op[2], None)
