"""The transports of one gateway: started from ``transports.conf``, bound to destinations.

How this works. The :class:`TransportManager` reads ``transports.conf`` and the ``import`` /
``export`` properties of ``topics.conf`` / ``queues.conf`` entries, and starts one
:class:`~transports.base.Transport` per section whose type is enabled in ``gateway.conf``
(``mqtt_transports = enabled``; off by default, as in EMS, TIBCO EMS User's Guide, chapter
"Working With TIBCO Rendezvous", "Overview"), found by type through :mod:`gateway.registry`. It
binds each entry's names (at start, and when the admin API defines an entry), tells the
importing transports when local subscriptions come and go (a topic imports only while it has
subscribers), and holds the duplicate window all its transports share, seeded at start from the
store (:meth:`TransportManager.seed_duplicates`). A transport marked ``required = true`` (or
any, with ``startup_abort_list`` naming ``TRANSPORTS``) that cannot connect in time stops the
start with :class:`TransportRequiredError` (on a cluster node: that no node runs in time);
the others keep trying in the background. What each
transport does is described in :mod:`transports.base`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Any

from gateway import registry
from gateway.errors import ConfigError, GatewayError
from gateway.facade import Core
from gateway.message import PROP_IMPORTED, QUEUE, TOPIC
from transports.base import CLIENT_PREFIX, DEDUP_WINDOW, Held, Transport

log = logging.getLogger("transports")

REQUIRED_POLL = 0.2  # seconds between looks at who runs a required transport (a cluster's)


class TransportRequiredError(GatewayError):
    reason = "transport-required"


class TransportManager:
    """Every transport of one gateway, bound to the destinations that name them."""

    def __init__(self, broker: Core, config: Any) -> None:
        self.broker = broker
        self.config = config
        self.transports: dict[str, Transport] = {}
        self.recent_imports: OrderedDict[tuple[str, str], Held] = OrderedDict()
        self.watching = False  # subscriptions are watched (for the imports)

    async def start(self) -> None:
        config = self.config
        gw = config.gateway
        cluster = self.broker.cluster
        if cluster is not None:
            # On a cluster node each transport runs while this node holds its lease
            # (cluster/leases.py): on one node at a time, on another when that one dies.
            for tdef in config.transports.values():
                if gw.transports_enabled(tdef.type):
                    cluster.hold_lease(
                        "transport." + tdef.name,
                        lambda name=tdef.name: self._lease_taken(name),
                        lambda name=tdef.name: asyncio.ensure_future(self.stop_one(name)))
            for tdef in config.transports.values():
                if gw.transports_enabled(tdef.type) and (
                        tdef.params.get("required") or gw.aborts_on("TRANSPORTS")):
                    await self._required_in_cluster(tdef)
            return
        for tdef in config.transports.values():
            if not gw.transports_enabled(tdef.type):
                continue
            try:
                factory = registry.transport(tdef.type)
            except registry.NotAvailableError as exc:
                raise ConfigError(tdef.file, tdef.line,
                                  f"transport {tdef.name!r}: {exc}") from None
            t: Transport = factory(self, tdef)
            self.transports[tdef.name] = t
        if not self.transports:
            return
        for table, kind_name in ((config.topics, "topic"), (config.queues, "queue")):
            for entry in table.entries():
                self.bind_entry(kind_name, entry)
        self.broker.watch_subscriptions(self._subscription_changed)
        self.watching = True
        self.seed_duplicates()
        for t in self.transports.values():
            t.start()
        required = [t for t in self.transports.values()
                    if t.params.get("required") or gw.aborts_on("TRANSPORTS")]
        for t in required:
            limit = float(t.params.get("reconnect_max", 60.0))
            try:
                await asyncio.wait_for(t.up_event.wait(), timeout=limit)
            except TimeoutError:
                raise TransportRequiredError(
                    f"{t.tdef.where()}: transport {t.name!r} is required and could not "
                    f"connect in {limit:g} s: {t.last_error}") from None

    async def _required_in_cluster(self, tdef: Any) -> None:
        """A required transport on a cluster node: the start waits until the cluster runs it
        (this node, up; or another node, which holds its lease), at most its
        ``reconnect_max``.

        Raises:
            TransportRequiredError: no node runs it by then.
        """
        cluster = self.broker.cluster
        name = tdef.name
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(tdef.params.get("reconnect_max", 60.0))
        while loop.time() < deadline:
            t = self.transports.get(name)
            if cluster.holds_lease("transport." + name) and t is not None:
                try:
                    await asyncio.wait_for(t.up_event.wait(), deadline - loop.time())
                    return
                except TimeoutError:
                    break
            holder = await cluster.lease_holder("transport." + name)
            if holder is not None and holder != cluster.node_id:
                return  # another node runs it
            await asyncio.sleep(REQUIRED_POLL)
        t = self.transports.get(name)
        raise TransportRequiredError(
            f"{tdef.where()}: transport {name!r} is required and no node of the cluster "
            f"runs it: {t.last_error if t is not None else 'this node does not hold it'}")

    def seed_duplicates(self) -> None:
        """Remember the imports the store kept from before a restart (still waiting in a
        queue or durable subscription), so that their resends are dropped as duplicates.

        A crash between storing an import and the far side getting its acknowledgement
        leaves the far side to send the message again after the restart; without this the
        copy in the store and the resend would both be delivered. What a consumer had
        already taken and acknowledged before the crash is no longer stored and is not seen
        here.
        """
        recent = self.recent_imports
        for msg in self.broker.stored_messages():
            via = msg.properties.get(PROP_IMPORTED)
            dest = msg.destination
            if via is None or dest is None:
                continue
            if msg.trace_id is not None:
                recent[(msg.trace_id, dest.name)] = None
            t = self.transports.get(str(via))
            if t is not None:
                t.seed_duplicate(msg)
        while len(recent) > DEDUP_WINDOW:
            recent.popitem(last=False)

    def bind_entry(self, kind_name: str, entry: Any) -> None:
        """Bind the transports a topics.conf / queues.conf entry names (at start, or when
        the admin API defines it; names already bound stay bound)."""
        kind = TOPIC if kind_name == "topic" else QUEUE
        for name in entry.own.get("imports", ()):
            t = self.transports.get(name)
            if t is not None and t.bind_import(entry.name, kind):
                if kind == TOPIC:
                    for sub in self.broker.all_subscriptions():
                        if not (getattr(sub, "client_id", None) or "").startswith(CLIENT_PREFIX):
                            t.local_subscription(sub.pattern, True, only=entry.name)
        if kind == TOPIC:
            for name in entry.own.get("exports", ()):
                t = self.transports.get(name)
                if t is not None:
                    t.bind_export(entry.name)

    def _lease_taken(self, name: str) -> None:
        try:
            self.start_one(name)
        except GatewayError as exc:
            log.warning("transport %s: %s", name, exc)

    def _subscription_changed(self, sub: Any, added: bool) -> None:
        client_id = getattr(sub, "client_id", None) or ""
        if client_id.startswith(CLIENT_PREFIX):
            return
        for t in self.transports.values():
            if t.imports:
                t.local_subscription(sub.pattern, added)

    async def stop(self) -> None:
        self.broker.watch_subscriptions(self._subscription_changed, on=False)
        for t in list(self.transports.values()):
            await t.stop()

    def info(self) -> list[dict[str, Any]]:
        return [self.row(name) for name in self.config.transports]

    def row(self, name: str) -> dict[str, Any]:
        """One transport's admin view; a defined one that is not running says why."""
        t = self.transports.get(name)
        if t is not None:
            return t.info()
        tdef = self.config.transports[name]
        enabled = self.config.gateway.transports_enabled(tdef.type)
        # on a cluster node, one another node runs (or will, when this one may)
        idle = "standby" if self.broker.cluster is not None else "stopped"
        return {"name": name, "type": tdef.type, "state": idle if enabled else "disabled"}

    async def stop_one(self, name: str) -> None:
        """Stop one transport (admin): what it spools stays in its durable subscriptions
        and goes out when it starts again."""
        t = self.transports.pop(name, None)
        if t is not None:
            await t.stop()

    def start_one(self, name: str) -> None:
        """Start one stopped transport (admin), bound as at start-up.

        Raises:
            GatewayError: its type is not enabled in gateway.conf or not in this build.
        """
        if name in self.transports:
            return
        cluster = self.broker.cluster
        if cluster is not None and not cluster.holds_lease("transport." + name):
            raise GatewayError(f"transport {name!r} runs on the cluster node that holds its "
                               "lease, not on this one")
        tdef = self.config.transports[name]
        if not self.config.gateway.transports_enabled(tdef.type):
            raise GatewayError(f"transport {name!r}: {tdef.type} transports are not enabled "
                               f"in gateway.conf ({tdef.type}_transports)")
        try:
            factory = registry.transport(tdef.type)
        except registry.NotAvailableError as exc:
            raise GatewayError(f"transport {name!r}: {exc}") from None
        t: Transport = factory(self, tdef)
        self.transports[name] = t
        for table, kind_name in ((self.config.topics, "topic"), (self.config.queues, "queue")):
            for entry in table.entries():
                self.bind_entry(kind_name, entry)
        if not self.watching:
            self.broker.watch_subscriptions(self._subscription_changed)
            self.watching = True
        t.start()
