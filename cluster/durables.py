"""Which topics the cluster's durable subscriptions want: every node's durables in one
JetStream key-value bucket.

A persistent message to a topic goes to JetStream's topic stream (:mod:`cluster.feeds`) only
when some durable subscription in the cluster matches it: there it waits for subscribers
that may be away, on any node; a message no durable wants costs no JetStream write. So each
node needs the patterns of every durable subscription, whichever node made it. They are kept
in the bucket ``GW_<cluster>_DURABLES`` (key: the subscription's JetStream consumer name;
value: its pattern and whether it matches the parent, as MQTT's ``a/#`` does ``a``), which
each node writes for the durables it makes and deletes for those it ends, and watches
(NATS documentation, "JetStream", "Key/Value Store", watch): a bucket of replicated
JetStream storage, read again in full by a node that starts.

A durable made on another node reaches this one's view in the time its watch takes (a few
milliseconds on a LAN): a persistent message published here meanwhile is not kept for it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

from gateway import subject
from gateway.errors import GatewayError

if TYPE_CHECKING:
    from nats.js.client import JetStreamContext
    from nats.js.kv import KeyValue

log = logging.getLogger("cluster")

WATCH_READY = 10.0  # seconds to read the bucket in full at start
MATCH_CACHE = 10_000  # topics whose answer is remembered (cleared when a durable changes)


class DurableIndex:
    """Every durable subscription's pattern in the cluster: see the module docstring."""

    def __init__(self, js: JetStreamContext, cluster_name: str, replicas: int) -> None:
        self.js = js
        self.bucket = f"GW_{cluster_name}_DURABLES"
        self.replicas = replicas
        self.kv: KeyValue | None = None
        self.patterns: dict[str, tuple[str, bool]] = {}  # consumer name -> (pattern, parent)
        self.cache: dict[str, bool] = {}
        self.watcher: Any = None
        self.task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()

    async def start(self) -> None:
        try:
            try:
                self.kv = await self.js.key_value(self.bucket)
            except Exception:  # noqa: BLE001 - nats-py's "not found" varies by version
                self.kv = await self.js.create_key_value(
                    bucket=self.bucket, history=1, replicas=self.replicas,
                    description="the gateway cluster's durable subscriptions")
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
            if entry.operation in ("DEL", "PURGE") or not entry.value:
                self.patterns.pop(entry.key, None)
            else:
                try:
                    note = json.loads(entry.value)
                    self.patterns[entry.key] = (str(note["pattern"]), bool(note["parent"]))
                except (ValueError, KeyError, TypeError):
                    log.warning("unreadable durable subscription %s in %s", entry.key,
                                self.bucket)
                    continue
            self.cache.clear()

    # -- this node's durables ---------------------------------------------------------------

    def add(self, consumer: str, pattern: str, parent: bool) -> None:
        self.patterns[consumer] = (pattern, parent)
        self.cache.clear()

    async def put(self, consumer: str) -> None:
        entry = self.patterns.get(consumer)
        if self.kv is None or entry is None:
            return
        body = json.dumps({"pattern": entry[0], "parent": entry[1]}).encode()
        try:
            await self.kv.put(consumer, body)
        except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
            log.warning("cannot record durable subscription %s: %s", consumer, exc)

    async def delete(self, consumer: str) -> None:
        self.patterns.pop(consumer, None)
        self.cache.clear()
        if self.kv is None:
            return
        try:
            await self.kv.delete(consumer)
        except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
            log.warning("cannot delete durable subscription %s: %s", consumer, exc)

    # -- the question -----------------------------------------------------------------------

    def wants(self, topic: str) -> bool:
        """Whether some durable subscription of the cluster matches ``topic``."""
        answer = self.cache.get(topic)
        if answer is None:
            answer = any(subject.matches(p, topic) or (parent and p.endswith(".>")
                                                       and topic == p[:-2])
                         for p, parent in self.patterns.values())
            if len(self.cache) >= MATCH_CACHE:
                self.cache.clear()
            self.cache[topic] = answer
        return answer
