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

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from cluster.buckets import WatchedBucket
from gateway import subject

if TYPE_CHECKING:
    from nats.js.client import JetStreamContext

log = logging.getLogger("cluster")

MATCH_CACHE = 10_000  # topics whose answer is remembered (cleared when a durable changes)


class DurableIndex(WatchedBucket):
    """Every durable subscription's pattern in the cluster: see the module docstring."""

    description = "the gateway cluster's durable subscriptions"

    def __init__(self, js: JetStreamContext, cluster_name: str, replicas: int) -> None:
        super().__init__(js, f"GW_{cluster_name}_DURABLES", replicas)
        self.patterns: dict[str, tuple[str, bool]] = {}  # consumer name -> (pattern, parent)
        self.cache: dict[str, bool] = {}
        # told of each change, by any node: (consumer name, (pattern, parent) or None)
        self.listener: Callable[[str, tuple[str, bool] | None], None] | None = None

    def changed(self, key: str, value: bytes | None) -> None:
        entry: tuple[str, bool] | None = None
        if value is None:
            self.patterns.pop(key, None)
        else:
            try:
                note = json.loads(value)
                entry = self.patterns[key] = (str(note["pattern"]), bool(note["parent"]))
            except (ValueError, KeyError, TypeError):
                log.warning("unreadable durable subscription %s in %s", key, self.bucket)
                return
        self.cache.clear()
        if self.listener is not None:
            self.listener(key, entry)

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
