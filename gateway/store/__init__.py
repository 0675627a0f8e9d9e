"""Message stores: SQLite with group commit (the default) and a memory store.

``open_store(kind, path, sync)`` makes the store ``gateway.conf`` names (``store_type``,
``store``, ``store_sync``); see :mod:`gateway.store.base` for the interface and its contracts.
"""

from __future__ import annotations

from gateway.store.base import Recovered, Store, StoreError
from gateway.store.memory import MemoryStore
from gateway.store.sqlite import SqliteStore

__all__ = ["MemoryStore", "Recovered", "SqliteStore", "Store", "StoreError", "open_store"]

STORE_KINDS = ("sqlite", "memory")


def open_store(kind: str, path: str, sync: bool) -> Store:
    """A new, not yet opened store of ``kind``.

    ``path`` is the SQLite database file (its directory is created if missing); the memory
    store ignores it. ``sync`` asks for an fsync per group commit (TIBCO EMS User's Guide,
    "stores.conf", ``mode = sync``).

    Raises:
        ValueError: ``kind`` is not one of :data:`STORE_KINDS`.
    """
    if kind == "sqlite":
        return SqliteStore(path, sync)
    if kind == "memory":
        return MemoryStore()
    raise ValueError(f"unknown store type {kind!r} (expected one of {', '.join(STORE_KINDS)})")
