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

A node that makes a durable subscription also tells every other node that is up of it,
and answers its subscriber once they all have (``ClusterLink.ready``), rather than when
their watches bring it: a persistent message published anywhere after the subscriber was
answered is kept for it. The patterns are in a subscription index (:mod:`gateway.subindex`,
a trie), so asking about a topic costs a walk down its names, not a look at every durable
of the cluster (a fleet of MQTT devices has one or more each).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from cluster.buckets import WatchedBucket
from gateway.errors import GatewayError
from gateway.subindex import SubIndex

if TYPE_CHECKING:
    from nats.js.client import JetStreamContext

log = logging.getLogger("cluster")

MATCH_CACHE = 10_000  # topics whose answer the index remembers (until a durable changes)


class DurableIndex(WatchedBucket):
    """Every durable subscription's pattern in the cluster: see the module docstring."""

    description = "the gateway cluster's durable subscriptions"

    def __init__(self, js: JetStreamContext, cluster_name: str, replicas: int) -> None:
        super().__init__(js, f"GW_{cluster_name}_DURABLES", replicas)
        self.patterns: dict[str, tuple[str, bool]] = {}  # consumer name -> (pattern, parent)
        self.index = SubIndex(MATCH_CACHE)  # the consumer names, by their patterns
        self.names: dict[str, str] = {}  # each name, the very object in the index
        # told of each change, by any node: (consumer name, (pattern, parent) or None)
        self.listener: Callable[[str, tuple[str, bool] | None], None] | None = None

    def changed(self, key: str, value: bytes | None) -> None:
        """A durable subscription made (``value``: its record) or ended (None), on any
        node: as the bucket's watch tells, or as the node that made it does."""
        entry: tuple[str, bool] | None = None
        if value is None:
            self._set(key, None)
        else:
            try:
                note = json.loads(value)
                entry = (str(note["pattern"]), bool(note["parent"]))
                self._set(key, entry)
            except (ValueError, KeyError, TypeError, GatewayError):
                log.warning("unreadable durable subscription %s in %s", key, self.bucket)
                return
        if self.listener is not None:
            self.listener(key, entry)

    def _set(self, consumer: str, entry: tuple[str, bool] | None) -> None:
        old = self.patterns.get(consumer)
        if old == entry:
            return
        if old is not None:
            del self.patterns[consumer]
            # the index knows an entry by its object: the name as it was inserted
            self.index.remove(old[0], self.names.pop(consumer), parent_match=old[1])
        if entry is not None:
            self.index.insert(entry[0], consumer, parent_match=entry[1])
            self.patterns[consumer] = entry
            self.names[consumer] = consumer

    # -- this node's durables ---------------------------------------------------------------

    def add(self, consumer: str, pattern: str, parent: bool) -> None:
        self._set(consumer, (pattern, parent))

    def record(self, consumer: str) -> bytes | None:
        """What the bucket holds for durable subscription ``consumer`` (None: unknown)."""
        entry = self.patterns.get(consumer)
        if entry is None:
            return None
        return json.dumps({"pattern": entry[0], "parent": entry[1]}).encode()

    async def put(self, consumer: str) -> None:
        body = self.record(consumer)
        if self.kv is None or body is None:
            return
        try:
            await self.kv.put(consumer, body)
        except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
            log.warning("cannot record durable subscription %s: %s", consumer, exc)

    async def delete(self, consumer: str) -> None:
        self._set(consumer, None)
        if self.kv is None:
            return
        try:
            await self.kv.delete(consumer)
        except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
            log.warning("cannot delete durable subscription %s: %s", consumer, exc)

    # -- the question -----------------------------------------------------------------------

    def wants(self, topic: str) -> bool:
        """Whether some durable subscription of the cluster matches ``topic``."""
        return bool(self.index.match(topic))
