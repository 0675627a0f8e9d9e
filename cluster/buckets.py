"""JetStream key-value buckets of a cluster: opening one, and a copy of one kept by watching.

Every bucket a node uses (``GW_<cluster>_DURABLES``, ``_RECORDS``, ``_LEASES``) is opened
the same way: found, or made with the cluster's replicas (NATS documentation, "JetStream",
"Key/Value Store"). :class:`WatchedBucket` is one whose every change a node follows: it
reads the bucket in full at start (the watch's first updates, up to its end marker) and then
each change as it comes, handing each entry to :meth:`WatchedBucket.changed`.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from gateway.errors import GatewayError

if TYPE_CHECKING:
    from nats.js.client import JetStreamContext
    from nats.js.kv import KeyValue

WATCH_READY = 10.0  # seconds to read a bucket in full at start


async def open_bucket(js: JetStreamContext, bucket: str, replicas: int, description: str,
                      ttl: float | None = None) -> KeyValue:
    """The bucket, made if it is not there (``ttl``: entries expire that long after their
    last write).

    Raises:
        GatewayError: JetStream cannot keep it (e.g. fewer servers than ``replicas``).
    """
    try:
        try:
            return await js.key_value(bucket)
        except Exception:  # noqa: BLE001 - nats-py's "not found" varies by version
            return await js.create_key_value(bucket=bucket, history=1, replicas=replicas,
                                             ttl=ttl, description=description)
    except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
        raise GatewayError(f"JetStream cannot keep the bucket {bucket} with {replicas} "
                           f"replicas: {exc}") from None


class WatchedBucket:
    """A bucket this node follows every change of (see the module docstring)."""

    description = ""

    def __init__(self, js: JetStreamContext, bucket: str, replicas: int) -> None:
        self.js = js
        self.bucket = bucket
        self.replicas = replicas
        self.kv: KeyValue | None = None
        self.watcher: Any = None
        self.task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()

    async def start(self) -> None:
        self.kv = await open_bucket(self.js, self.bucket, self.replicas, self.description)
        try:
            self.watcher = await self.kv.watchall()
        except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
            raise GatewayError(f"JetStream does not give the bucket {self.bucket}: "
                               f"{exc}") from None
        self.task = asyncio.ensure_future(self._watch())
        try:
            await asyncio.wait_for(self.ready.wait(), WATCH_READY)
        except TimeoutError:
            raise GatewayError(f"JetStream did not give the bucket {self.bucket} in "
                               f"{WATCH_READY:g} s") from None

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        if self.watcher is not None:
            try:
                await self.watcher.stop()
            except Exception:  # noqa: BLE001 - the connection may be gone
                pass

    async def _watch(self) -> None:
        async for entry in self.watcher:
            if entry is None:  # what the bucket held at start has all come
                self.ready.set()
                continue
            deleted = entry.operation in ("DEL", "PURGE") or not entry.value
            self.changed(entry.key, None if deleted else bytes(entry.value))

    def changed(self, key: str, value: bytes | None) -> None:
        """An entry written (``value``) or deleted (None), by any node."""
        raise NotImplementedError
