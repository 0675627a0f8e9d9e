"""Process start-up and shutdown: config → store → delivery log → broker → listeners.

How this works. :class:`Gateway` assembles the parts in dependency order and takes them
down in reverse. On SIGTERM or SIGINT, :func:`serve` stops accepting (listeners close
first), closes every connection (unacknowledged messages return to their endpoints), then
flushes the store's last group commit and the delivery log, and returns 0.

The gateway's identity (``Broker.id``) is kept in the store, so the origin id that loop
prevention stamps on exported messages stays the same across restarts.

Once started, :func:`serve` tunes CPython's cyclic garbage collector (:func:`tune_gc`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import uuid
from typing import Any

from gateway import admin_shared, registry
from gateway.broker import Broker
from gateway.config import Config, load_config
from gateway.dlog import DeliveryLog
from gateway.errors import ConfigError
from gateway.store import open_store
from gateway.store.base import StoreError, StoreLocked

log = logging.getLogger("gateway")


class Gateway:
    """One running gateway: owns the broker, its store, its delivery log and listeners."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.broker: Broker | None = None
        self.store: Any = None
        self.dlog: Any = None
        self.listeners: list[tuple[Any, Any]] = []
        self.addresses: dict[str, tuple[str, int]] = {}
        self.transports: Any = None
        self.routers: Any = None
        self.cluster: Any = None

    async def start(self) -> None:
        gw = self.config.gateway
        loop = asyncio.get_running_loop()
        store_dir = str(gw.store)
        try:
            os.makedirs(store_dir, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot make the store directory {store_dir}: "
                             f"{exc.strerror or exc}") from exc
        self.store = open_store(gw.store_type, os.path.join(store_dir, "gateway.db"), gw.store_sync)
        # With swapping, a durable subscription's backlog past this stays in the store
        # (its tail) instead of being read whole into memory.
        backlog = max(int(gw.destination_backlog_swapout), 1) if gw.msg_swapping else 0
        recovered = self.store.open(loop.call_soon_threadsafe, backlog)
        # A cluster node's id is its node_id, so that its message ids and trace ids say
        # which node made them; its delivery log's ``gw`` is ``<cluster_name>/<node_id>``:
        # the cluster is one gateway to the reconciliation, and each record names its node.
        gid = gw.node_id or _gateway_id(self.store, recovered, gw.server)
        log_gw = f"{gw.cluster_name}/{gid}" if gw.cluster else gid
        self.dlog = DeliveryLog(
            str(gw.delivery_log_dir), log_gw, enabled=bool(gw.delivery_log),
            max_file_bytes=int(gw.delivery_log_max_file_size),
        )
        self.dlog.start()
        self.broker = Broker(self.config, self.store, self.dlog, gateway_id=gid)
        self.broker.mappings = self._mappings()
        self.broker.start(recovered)
        for warning in self.config.warnings:
            log.warning("%s", warning)
        try:
            if gw.cluster:
                # A node of a cluster (cluster/, loaded by name as the transports are): joined
                # before the listeners open, so the first client's messages reach every node.
                start_cluster = registry.import_string(registry.CLUSTER)
                self.cluster = await start_cluster(self.broker)
                admin_shared.install(self.broker)  # the cluster's configuration changes
            # HTTP last, so the adapters' WebSocket endpoints are registered before it starts.
            for spec in sorted(gw.listen, key=lambda s: s.scheme in ("http", "https")):
                try:
                    factory = registry.adapter(spec.scheme)
                except registry.NotAvailableError as exc:
                    conf = str(self.config.dir / "gateway.conf")
                    raise ConfigError(conf, spec.line, f"listen {spec.scheme}: {exc}") from None
                handle = await factory(self.broker, spec)
                self.listeners.append((spec, handle))
                host, port = getattr(handle, "address", (spec.host, spec.port))
                self.addresses[spec.scheme] = (host, port)
                log.info("listening for %s on %s:%d", spec.scheme, host, port)
            if any(gw.transports_enabled(t.type) for t in self.config.transports.values()):
                # Loaded by name: the core never imports a transport (the layering import-linter checks).
                manager = registry.import_string("transports.manager:TransportManager")
                self.transports = manager(self.broker, self.config)
                self.broker.transports = self.transports
                await self.transports.start()
            if self.config.routers:
                # routers.conf: routers between RV-style buses (loaded by name, as transports)
                start_routers = registry.import_string(registry.RV_ROUTERS)
                self.routers = await start_routers(self.config.routers.values())
        except Exception:
            await self.stop()
            raise
        log.info("gateway %s started (store %s, %s)", gid, gw.store_type, store_dir)

    def _mappings(self) -> Any:
        """The declarative mappings of ``<config dir>/mappings/*.yaml`` (None without any),
        compiled when the configuration loaded (gateway.config.checks.load_mappings), so that
        ``gateway check-config`` refuses a rule that does not compile as start does."""
        loaded = self.config.mappings
        if loaded is not None:
            log.info("mappings: %d rules from %s", len(loaded.rules()), self.config.dir / "mappings")
        return loaded

    async def stop(self) -> None:
        if self.routers is not None:
            try:
                await self.routers.close()
            except Exception:  # pragma: no cover - shutdown must go on
                log.exception("error stopping the routers")
            self.routers = None
        if self.transports is not None:
            try:
                await self.transports.stop()
            except Exception:  # pragma: no cover - shutdown must go on
                log.exception("error stopping the transports")
            self.transports = None
        # In the order they opened, HTTP last: the adapters say goodbye to every client first
        # (an MQTT 5 client gets DISCONNECT 0x8B), those on the HTTP listener's WebSocket
        # endpoints too, whose handlers the HTTP server's cleanup then has no need to wait for.
        for _, handle in self.listeners:
            try:
                await handle.close()
            except Exception:  # pragma: no cover - shutdown must go on
                log.exception("error closing a listener")
        self.listeners.clear()
        if self.cluster is not None:
            try:
                await self.cluster.close()
            except Exception:  # pragma: no cover - shutdown must go on
                log.exception("error leaving the cluster")
            self.cluster = None
        if self.broker is not None:
            self.broker.close()
        loop = asyncio.get_running_loop()
        if self.store is not None:
            await loop.run_in_executor(None, self.store.close)
            self.store = None
        if self.dlog is not None:
            await loop.run_in_executor(None, self.dlog.close)
            self.dlog = None
        log.info("gateway stopped")


def _gateway_id(store: Any, recovered: Any, name: str) -> str:
    ids = recovered.kv.get("gateway", {})
    raw = ids.get("id")
    if raw is not None:
        return bytes(raw).decode()
    gid = f"{name}-{uuid.uuid4().hex[:12]}"
    store.put_kv("gateway", "id", gid.encode())
    store.commit(None)
    return gid


GC_THRESHOLD = 20_000  # container allocations between young collections (CPython: 700)


def tune_gc() -> None:
    """Freeze what start-up made and collect the young generation less often.

    A gateway holds many long-lived objects: messages waiting in queues, durable
    subscriptions and export spools, with their property dicts and confirmation futures.
    CPython's collector looks for reference cycles after every 700 net allocations of
    container objects and walks the older generations as they fill, so its work grows with
    what the gateway holds: measured, 9% of the instructions of a persistent send into a
    queue 15,000 messages deep, and 15-60% of the throughput on this project's 2-CPU test
    machine (``tests/bench/bench_core.py``, persistent sends, in alternating runs). The
    message paths make no cycles; the few that others make (an exception's traceback, a
    closure) are still collected, after 20,000 allocations instead of 700. Everything that
    exists once the gateway has started (modules, configuration, recovered state) is
    frozen: never walked again, still freed when its last reference goes.
    """
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD, gen1, gen2)


async def serve(config_dir: str | None, config: Config | None = None) -> int:
    """Run until SIGTERM or SIGINT; return the exit status. ``config``: ``config_dir``
    already loaded (``gateway serve`` loads it first, for its logging settings)."""
    if config is None:
        config = load_config(config_dir)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if config.gateway.ft_group:
        return await _serve_fault_tolerant(config, stop)
    gateway = Gateway(config)
    await gateway.start()
    tune_gc()
    print("gateway ready", flush=True)
    try:
        await stop.wait()
        log.info("signal received; shutting down")
    finally:
        await gateway.stop()
    return 0


STORE_RETRY_S = 0.5  # a backup activated while the store's lock is still held: the next try


async def _serve_fault_tolerant(config: Config, stop: asyncio.Event) -> int:
    """``ft_group``: run only while the fault-tolerance group has this gateway active
    (transports/rv/ftgateway.py); stand by otherwise."""
    member = await registry.import_string(registry.FT_STANDBY)(config.gateway)
    print("gateway standby", flush=True)
    try:
        while await member.wait_active(stop):
            gateway: Gateway | None = Gateway(config)
            while gateway is not None:
                try:
                    await gateway.start()
                    break
                except StoreLocked as exc:  # the old active gateway still holds it
                    log.warning("fault tolerance: %s; trying again", exc)
                    if stop.is_set() or not member.active.is_set():
                        gateway = None
                        break
                    await asyncio.sleep(STORE_RETRY_S)
                    gateway = Gateway(config)
            if gateway is None:
                continue
            tune_gc()
            print("gateway ready", flush=True)
            try:
                await member.wait_inactive(stop)
            finally:
                await gateway.stop()
            if not stop.is_set():
                print("gateway standby", flush=True)
        log.info("signal received; shutting down")
    finally:
        await member.close()
    return 0
