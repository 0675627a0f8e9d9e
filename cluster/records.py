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

import base64
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from cluster.buckets import WatchedBucket
from cluster.ordered import Ordered

if TYPE_CHECKING:
    from nats.js.client import JetStreamContext

log = logging.getLogger("cluster")

# a change another node made: (namespace, key, value or None when deleted)
Listener = Callable[[str, str, bytes | None], None]


class SharedRecords(WatchedBucket):
    """The bucket, this node's copy of it, and what goes to it in order."""

    description = "the gateway cluster's shared records"

    def __init__(self, js: JetStreamContext, cluster_name: str, replicas: int,
                 node_id: str, listener: Listener) -> None:
        super().__init__(js, f"GW_{cluster_name}_RECORDS", replicas)
        self.node = node_id.encode()
        self.listener = listener
        self.copy: dict[str, dict[str, bytes]] = {}  # namespace -> key -> value
        # what goes to the bucket, in order: (put | delete | create | take | release, key,
        # value)
        self.outbox = Ordered(self._write)
        self.claims: dict[str, int] = {}  # bucket key -> revision of this node's claim

    async def close(self) -> None:
        await self.outbox.flush(5.0)
        await super().close()

    # -- in -----------------------------------------------------------------------------

    def changed(self, key: str, value: bytes | None) -> None:
        ns, _, encoded = key.rpartition("/")
        try:
            name = base64.urlsafe_b64decode(encoded.encode()).decode()
        except ValueError:
            return
        records = self.copy.setdefault(ns, {})
        if value is None:
            if records.pop(name, None) is not None:
                self._tell(ns, name, None)
            return
        node, _, data = value.partition(b"\n")
        records[name] = data
        if node != self.node:
            self._tell(ns, name, data)

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
        if value is None:
            self._queue(("delete", self._name(ns, key), None))
        else:
            self._queue(("put", self._name(ns, key), self.node + b"\n" + value))

    def claim(self, ns: str, key: str, value: bytes, *, overwrite: bool = False) -> None:
        """Write a record only if there is none (a claim: the first node wins, a later one
        changes nothing), or over one (``overwrite``: the claim of a node that is gone);
        :meth:`unclaim` deletes it only while it is still this node's."""
        how = "take" if overwrite else "create"
        self._queue((how, self._name(ns, key), self.node + b"\n" + value))

    def unclaim(self, ns: str, key: str) -> None:
        self._queue(("release", self._name(ns, key), None))

    def _name(self, ns: str, key: str) -> str:
        return f"{ns}/{base64.urlsafe_b64encode(key.encode()).decode()}"

    def _queue(self, op: tuple[str, str, bytes | None]) -> None:
        self.outbox.put(op)

    async def _write(self, op: tuple[str, str, bytes | None]) -> None:
        """One write queued (see ``outbox``); a failed one is only logged."""
        how, name, value = op
        try:
            await self._apply(how, name, value)
        except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
            log.debug("record %s not %s: %s", name, how, exc)

    async def _apply(self, how: str, name: str, value: bytes | None) -> None:
        kv = self.kv
        if kv is None:
            return
        if how == "put" and value is not None:
            await kv.put(name, value)
        elif how == "delete":
            await kv.delete(name)
        elif how == "create" and value is not None:
            self.claims[name] = await kv.create(name, value)
        elif how == "take" and value is not None:
            self.claims[name] = await kv.put(name, value)
        elif how == "release":
            revision = self.claims.pop(name, None)
            if revision is not None:  # only what this node wrote, if unchanged since
                await kv.delete(name, last=revision)
