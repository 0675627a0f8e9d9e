"""The core as adapters and transports see it: :class:`Core`, the operations they may use.

How this works. The broker (:class:`gateway.broker.Broker`) holds every destination, endpoint
and counter; an adapter or a transport gets it to open connections and to ask the few things
a protocol needs to know that the client seam (:mod:`gateway.client`) does not answer:
whether a destination exists, a durable subscription by its stored name, the records it keeps
in the store (MQTT sessions and retained messages), the delivery log. :class:`Core` lists
exactly those; adapters and transports type the broker they are given as ``Core``, so mypy
refuses anything else (a reach into ``broker.queues`` or ``broker.stats``), and the
import-linter contracts in ``pyproject.toml`` keep them from importing the broker's modules
(:mod:`gateway.broker`, :mod:`gateway.routing`, :mod:`gateway.memory`, the store). Nothing of
this exists at run time: ``Core`` is a structural type the broker satisfies, so calls cost
what they did.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gateway.endpoint import Subscription
    from gateway.message import Destination, Message


class Records(Protocol):
    """The store's key-value records an adapter keeps its own state in (MQTT persistent
    sessions, their in-flight messages, retained messages), under a namespace of its own."""

    def put_kv(self, namespace: str, key: str, value: bytes) -> None: ...

    def delete_kv(self, namespace: str, key: str) -> None: ...

    def commit(self, callback: Any = None) -> None: ...


class Core(Protocol):
    """What an adapter or a transport may use of the broker."""

    loop: asyncio.AbstractEventLoop
    id: str  # this gateway's id: loop markers, trace ids
    name: str  # the server name (gateway.conf ``server``)
    config: Any  # the configuration directory, read only
    mappings: Any  # the declarative mappings (mappings.engine.MappingSet), or None
    authorization: bool
    log_enabled: bool  # the delivery log is on
    dlog: Any  # the delivery log (gateway.dlog.DeliveryLog): record, head
    closed: bool
    store: Records
    kv: dict[str, dict[str, bytes]]  # the store's records as read at start-up, by namespace
    http_routes: list[tuple[str, str, Any]]  # (method, path, handler) on the HTTP listener
    adapter_servers: dict[str, Any]  # each adapter's shared state, by protocol name
    info_sources: list[Callable[[], dict[str, Any]]]  # figures added to the server's info
    cluster: Any  # this node's cluster link (cluster.link.ClusterLink), or None
    local_views: dict[str, Callable[[], Any]]  # what other nodes may ask of this one
    local_actions: dict[str, Callable[[str], Any]]  # what other nodes may have this one do
    queues: dict[str, Any]  # the live queues by name (gateway.endpoint.QueueEndpoint)

    def now(self) -> int: ...

    def info(self) -> dict[str, Any]: ...  # GET /api/v1/server's figures

    def connect(self, *, client_id: str | None = None, user: str | None = None,
                password: str | None = None, kind: str = "CLIENT",
                authenticated: bool = False, protocol: str = "inproc",
                address: str = "") -> Any: ...

    def client_arrived(self, protocol: str, client_id: str) -> None: ...

    def anonymous_allowed(self) -> bool: ...

    def authenticate(self, user: str | None, password: str | None) -> str | None: ...

    def check(self, conn: Any, kind: str, name: str, perm: str, props: Any) -> None: ...

    def stamp(self, msg: Message, conn: Any, now: int) -> None: ...

    def publish(self, msg: Message, conn: Any = None, now: int = 0,
                far: tuple[str | None, str | None] | None = None
                ) -> asyncio.Future[None] | None: ...

    def dest_text(self, dest: Destination) -> str: ...

    def feed_queues(self, factory: Callable[[str], Any] | None) -> None: ...

    def feed_durables(self, factory: Callable[[str, str, bool], Any] | None) -> None: ...

    def feed_demand(self, key: str, cap: int) -> int: ...

    def feed_take(self, key: str, msg: Message, delivery_count: int) -> str: ...

    def feed_return(self, key: str) -> list[Message]: ...

    def forget_durable(self, key: str) -> None: ...

    def release_durable(self, key: str) -> None: ...

    def purge_queue(self, name: str) -> int: ...

    def node_id(self) -> str | None: ...

    def cluster_ready(self) -> asyncio.Future[None] | None: ...

    async def hand_over(self, protocol: str, client_id: str, node: str) -> bytes | None: ...

    def share_record(self, ns: str, key: str, value: bytes | None) -> None: ...

    def shared_record(self, ns: str, key: str) -> bytes | None: ...

    def shared_records(self, ns: str) -> dict[str, bytes]: ...

    def watch_shared(self, ns: str, listener: Callable[[str, bytes | None], Any]) -> None: ...

    def shared_changed(self, ns: str, key: str, value: bytes | None) -> None: ...

    def exists(self, dest: Destination) -> bool: ...

    def resolve_for_send(self, dest: Destination) -> Any: ...

    def create_temporary(self, conn: Any, kind: int) -> Destination: ...

    def delete_temporary(self, dest: Destination) -> None: ...

    def publish_monitor(self, name: str, body: dict[str, Any]) -> None: ...

    def count_dropped(self, msg: Message, client: str | None, reason: str) -> None: ...

    def connection_slow(self, conn_id: str | None, slow: bool) -> None: ...

    def durable(self, key: str) -> Subscription | None: ...

    def durable_subscriptions(self) -> list[Subscription]: ...

    def all_subscriptions(self) -> list[Subscription]: ...

    def unsubscribe(self, conn: Any, name: str, share_scope: str | None = None) -> None: ...

    def set_spool(self, sub: Subscription, bounds: tuple[int, int, bool]) -> None: ...

    def watch_subscriptions(self, listener: Callable[[Subscription, bool], None],
                            on: bool = True) -> None: ...

    def stored_messages(self) -> Iterator[Message]: ...
