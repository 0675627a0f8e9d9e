"""Records every node of a cluster shares: MQTT sessions and retained messages.

An adapter keeps some state as records of its own in the store (``Core.store``'s
``put_kv``: MQTT's persistent sessions and retained messages). A node of a cluster also
shares the records of the namespaces an adapter names (``Core.share_record``) through the
JetStream key-value bucket ``GW_<cluster>_RECORDS`` (NATS documentation, "JetStream",
"Key/Value Store"): replicated like the streams, so a record outlives any one node. Every
node watches the bucket and keeps a copy of what it holds (``Core.shared_record`` reads it),
and tells the adapter of what other nodes change (``Core.watch_shared``): a retained message
set on one node is retained on all; an MQTT session saved by the node its client is on is
the one another node resumes when the client comes to it.

Keys are ``<namespace>/<the record's key in base64url>`` (the bucket takes only letters,
digits and ``-/_=.``); each value starts with the writing node's id and a newline, so that
a node knows its own changes when they come back.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway.errors import GatewayError

if TYPE_CHECKING:
    from nats.js.client import JetStreamContext
    from nats.js.kv import KeyValue

log = logging.getLogger("cluster")

WATCH_READY = 10.0  # seconds to read the bucket in full at start

# a change another node made: (namespace, key, value or None when deleted)
Listener = Callable[[str, str, bytes | None], None]


class SharedRecords:
    """The bucket, this node's copy of it, and what goes to it in order."""

    def __init__(self, js: JetStreamContext, cluster_name: str, replicas: int,
                 node_id: str, listener: Listener) -> None:
        self.js = js
        self.bucket = f"GW_{cluster_name}_RECORDS"
        self.replicas = replicas
        self.node = node_id.encode()
        self.listener = listener
        self.kv: KeyValue | None = None
        self.copy: dict[str, dict[str, bytes]] = {}  # namespace -> key -> value
        self.watcher: Any = None
        self.task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()
        self.outbox: list[tuple[str, bytes | None]] = []
        self.sending: asyncio.Task[None] | None = None

    async def start(self) -> None:
        try:
            try:
                self.kv = await self.js.key_value(self.bucket)
            except Exception:  # noqa: BLE001 - nats-py's "not found" varies by version
                self.kv = await self.js.create_key_value(
                    bucket=self.bucket, history=1, replicas=self.replicas,
                    description="the gateway cluster's shared records")
            self.watcher = await self.kv.watchall()
        except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
            raise GatewayError(f"JetStream cannot keep the bucket {self.bucket} with "
                               f"{self.replicas} replicas: {exc}") from None
        self.task = asyncio.ensure_future(self._watch())
        try:
            await asyncio.wait_for(self.ready.wait(), WATCH_READY)
        except TimeoutError:
            raise GatewayError(f"JetStream did not give the bucket {self.bucket} in "
                               f"{WATCH_READY:g} s") from None

    async def close(self) -> None:
        if self.sending is not None:
            await asyncio.wait([self.sending], timeout=5)
        if self.task is not None:
            self.task.cancel()
        if self.watcher is not None:
            try:
                await self.watcher.stop()
            except Exception:  # noqa: BLE001 - the connection may be gone
                pass

    # -- in -----------------------------------------------------------------------------

    async def _watch(self) -> None:
        async for entry in self.watcher:
            if entry is None:  # what the bucket held at start has all come
                self.ready.set()
                continue
            ns, _, encoded = entry.key.rpartition("/")
            try:
                key = base64.urlsafe_b64decode(encoded.encode()).decode()
            except ValueError:
                continue
            records = self.copy.setdefault(ns, {})
            if entry.operation in ("DEL", "PURGE") or not entry.value:
                if records.pop(key, None) is not None:
                    self._tell(ns, key, None)
                continue
            node, _, value = bytes(entry.value).partition(b"\n")
            records[key] = value
            if node != self.node:
                self._tell(ns, key, value)

    def _tell(self, ns: str, key: str, value: bytes | None) -> None:
        try:
            self.listener(ns, key, value)
        except Exception:
            log.exception("a shared record of %s could not be applied", ns)

    def get(self, ns: str, key: str) -> bytes | None:
        return self.copy.get(ns, {}).get(key)

    # -- out ----------------------------------------------------------------------------

    def put(self, ns: str, key: str, value: bytes | None) -> None:
        """Share a record (``None``: delete it); in the order of the calls."""
        records = self.copy.setdefault(ns, {})
        if value is None:
            records.pop(key, None)
        else:
            records[key] = value
        name = f"{ns}/{base64.urlsafe_b64encode(key.encode()).decode()}"
        self.outbox.append((name, None if value is None else self.node + b"\n" + value))
        if self.sending is None:
            self.sending = asyncio.ensure_future(self._send())

    async def _send(self) -> None:
        try:
            while self.outbox:
                batch, self.outbox = self.outbox, []
                for name, value in batch:
                    if self.kv is None:
                        break
                    try:
                        if value is None:
                            await self.kv.delete(name)
                        else:
                            await self.kv.put(name, value)
                    except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
                        log.warning("cannot share record %s: %s", name, exc)
        finally:
            self.sending = None
