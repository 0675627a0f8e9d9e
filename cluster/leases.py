"""Leases: what one node of a cluster does at a time (a transport, an exclusive queue's
consumer), kept in JetStream.

A transport connects the gateway to one outside system as one client (one MQTT client id,
one AMQP container, one STOMP subscription): two nodes running it would import everything
twice. So on a cluster node each transport runs only while the node holds its lease: a key
of the JetStream key-value bucket ``GW_<cluster>_LEASES``, whose entries expire
:data:`LEASE_TTL` after their last write (the bucket's ``max_age``; NATS documentation,
"JetStream", "Key/Value Store"). A node takes a free lease by creating its key (JetStream
creates a key only if it is not there: one node wins), renews it every :data:`RENEW` by
updating it at the revision it last wrote (so a renewal after another node took it fails),
and gives it up by deleting it when it stops. Every node tries every :data:`RENEW` to take
the leases nobody holds, so a transport whose node died runs again elsewhere within
:data:`LEASE_TTL` plus that. A holder that could not renew for :data:`LEASE_TTL` (its NATS
servers out of reach) stops the transport before another node may have started it.

What a transport spools for export is a durable subscription, kept by JetStream
(:mod:`cluster.feeds`), so the node that takes it over sends what was waiting; imports to
queues and for durable subscriptions carry their trace id and destination as JetStream's
message id, so a far side's resend of what the node that died had imported is dropped there
(:meth:`cluster.feeds.Feeds.publish`).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nats.js.errors import KeyWrongLastSequenceError

from cluster.buckets import open_bucket

if TYPE_CHECKING:
    from nats.js.client import JetStreamContext
    from nats.js.kv import KeyValue

log = logging.getLogger("cluster")

LEASE_TTL = 6.0  # seconds a lease lasts after its last renewal
RENEW = 2.0  # seconds between renewals (and attempts to take a free lease)


class Lease:
    """One named lease: ``acquired()`` is called when this node takes it, ``lost()`` when
    it no longer holds it."""

    def __init__(self, name: str, acquired: Callable[[], Any], lost: Callable[[], Any]) -> None:
        self.name = name
        self.acquired = acquired
        self.lost = lost
        self.revision = 0  # of this node's last write, while it holds the lease
        self.renewed = 0.0  # loop time of the last successful write


class Leases:
    """This node's leases: see the module docstring."""

    def __init__(self, js: JetStreamContext, cluster_name: str, replicas: int,
                 node_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.js = js
        self.bucket = f"GW_{cluster_name}_LEASES"
        self.replicas = replicas
        self.node = node_id.encode()
        self.loop = loop
        self.kv: KeyValue | None = None
        self.leases: dict[str, Lease] = {}
        self.task: asyncio.Task[None] | None = None
        self.lock = asyncio.Lock()  # one round at a time

    async def start(self) -> None:
        self.kv = await open_bucket(self.js, self.bucket, self.replicas,
                                    "what one node of the gateway cluster runs at a time",
                                    ttl=LEASE_TTL)
        self.task = asyncio.ensure_future(self._run())

    def hold(self, name: str, acquired: Callable[[], Any], lost: Callable[[], Any]) -> None:
        """Run ``acquired`` whenever this node takes lease ``name`` (at once if it can)."""
        self.leases[name] = Lease(_key(name), acquired, lost)
        self.loop.call_soon(self._kick)

    def _kick(self) -> None:
        if self.task is not None and not self.task.done():
            asyncio.ensure_future(self._round())

    def release(self, name: str) -> None:
        """Stop holding lease ``name`` (or trying to): its key goes, and another node takes
        it at its next round."""
        lease = self.leases.pop(name, None)
        if lease is not None and lease.revision:
            revision, lease.revision = lease.revision, 0
            asyncio.ensure_future(self._delete(lease.name, revision))

    async def _delete(self, key: str, revision: int) -> None:
        if self.kv is None:
            return
        try:
            await self.kv.delete(key, last=revision)
        except Exception as exc:  # noqa: BLE001 - renewed meanwhile, or NATS away
            log.debug("cannot give up lease %s: %s", key, exc)

    async def holder(self, name: str) -> str | None:
        """The node that holds lease ``name`` now, as JetStream has it (None: nobody, or
        JetStream does not answer)."""
        if self.kv is None:
            return None
        try:
            entry = await self.kv.get(_key(name))
        except Exception:  # noqa: BLE001 - no such key (nobody holds it), or NATS away
            return None
        return entry.value.decode() if entry.value else None

    def holds(self, name: str) -> bool:
        """Whether this node holds lease ``name`` now."""
        lease = self.leases.get(name)
        return lease is not None and lease.revision > 0

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        for lease in self.leases.values():
            if lease.revision:
                self._lose(lease)
                if self.kv is not None:
                    try:  # another node takes it at once
                        await self.kv.delete(lease.name, last=None)
                    except Exception as exc:  # noqa: BLE001 - the servers may be gone
                        log.debug("cannot give up lease %s: %s", lease.name, exc)

    async def _run(self) -> None:
        while True:
            await self._round()
            await asyncio.sleep(RENEW)

    async def _round(self) -> None:
        """Renew what this node holds, and take what nobody does."""
        async with self.lock:
            await self._renew_all()

    async def _renew_all(self) -> None:
        kv = self.kv
        if kv is None:
            return
        for name, lease in list(self.leases.items()):
            now = self.loop.time()
            try:
                if lease.revision:
                    lease.revision = await kv.update(lease.name, self.node, last=lease.revision)
                    lease.renewed = now
                else:
                    revision = await kv.create(lease.name, self.node)
                    if self.leases.get(name) is not lease:  # released meanwhile
                        await self._delete(lease.name, revision)
                        continue
                    lease.revision = revision
                    lease.renewed = now
                    log.info("this node runs %s now", lease.name)
                    lease.acquired()
            except Exception as exc:  # noqa: BLE001 - held by another node, or NATS away
                if lease.revision and (now - lease.renewed >= LEASE_TTL - RENEW
                                       or isinstance(exc, KeyWrongLastSequenceError)):
                    log.warning("this node no longer holds %s: %s", lease.name, exc)
                    self._lose(lease)

    def _lose(self, lease: Lease) -> None:
        lease.revision = 0
        try:
            lease.lost()
        except Exception:
            log.exception("stopping %s failed", lease.name)


_KEY = re.compile(r"[-/_=.A-Za-z0-9]+")


def _key(name: str) -> str:
    """A bucket key for lease ``name`` (the bucket takes only letters, digits and ``-/_=.``)."""
    if _KEY.fullmatch(name):
        return name
    return "b64." + base64.urlsafe_b64encode(name.encode()).decode()
