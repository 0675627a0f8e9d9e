"""The broker: destinations, subscriptions and the publish path.

How this works. ``publish`` is the one path every message takes, whoever sent it (an
in-process client, an adapter connection, a transport): stamp → route → store → confirm.

* *Stamp*: message id, timestamp and trace id when absent; the destination's
  ``expiration`` override (TIBCO EMS User's Guide, "Destination Properties", expiration) and
  ``sender_name`` (EMS User's Guide, "Destination Properties", sender_name).
* *Route*: a topic message goes to every subscription whose pattern matches the topic name
  (the :class:`~gateway.subindex.SubIndex`; matching never delivers), then each
  subscription's no-local and selector test; a queue message goes to its one queue. Limits
  and ``overflowPolicy`` are applied per subscription or per queue (EMS User's Guide,
  "Destination Properties", overflowPolicy).
* *Store*: a PERSISTENT message is written when it lands on a queue or on a durable
  subscription (EMS User's Guide, "How EMS Manages Persistent Messages"); the producer's
  confirmation waits for the group commit that makes it durable -- or, when every stored copy
  was acknowledged before that commit (a fast consumer, a transport whose far side confirmed),
  for that last acknowledgement: the message has then reached the end of its way, and its
  write, if the writer had not taken it yet, is coalesced away (ActiveMQ's concurrent store and
  dispatch). NON_PERSISTENT and RELIABLE messages are never written.
* *Confirm*: ``publish`` returns ``None`` when the message is accepted and nothing needs to
  be waited for, or a future that resolves when it is durable and, with flow control on,
  when the destination has drained below its ``flowControl`` limit (EMS User's Guide,
  "Flow Control", "Enforcing Flow Control").

Memory (``max_msg_memory``, EMS User's Guide, "tibemsd.conf", Connection and Memory
Parameters): ``Broker`` derives from :class:`~gateway.memory.BrokerMemory`, which keeps what the
messages held by endpoints cost, swaps queues' messages out, sheds what slow consumers and
laggards hold, and holds or refuses producers at the limit (see :mod:`gateway.memory`).
Routing a message to its endpoints is :mod:`gateway.routing`'s.

Destinations are created on first use only when a ``topics.conf``/``queues.conf`` entry
matches (EMS User's Guide, "Wildcards and Dynamically Created Destinations"). Temporary
destinations belong to their connection and vanish with it. Undeliverable messages (expired,
past ``maxRedelivery``) go to ``$sys.undelivered`` when they carry
``JMS_GW_PRESERVE_UNDELIVERED``, otherwise they are dropped and logged (EMS User's Guide,
"Undelivered Message Queue").

Monitor topics (``$sys.monitor...``, EMS User's Guide, "Monitoring Server Activity") are
:mod:`gateway.monitor`'s: the broker calls it where their events happen (connections,
dynamic destinations, messages received and leaving early) after a counter says that someone
listens, and asks it who may subscribe to them.

Runs on the loop; never awaits. See ``gateway/README.md`` for what owns which state.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn, cast

from gateway import subject
from gateway.backlog import MESSAGE_OVERHEAD
from gateway.config.security import MONITOR_PREFIX, VerifiedUser
from gateway.consumer import TrafficTable
from gateway.endpoint import Endpoint, QueueEndpoint, Subscription
from gateway.errors import (
    GatewayError,
    IllegalStateError,
    InvalidDestinationError,
    LimitExceededError,
    SecurityError,
    UnavailableError,
)
from gateway.memory import LAGGARD_MIN, BrokerMemory
from gateway.message import (
    QUEUE,
    TEMP_PREFIX,
    TOPIC,
    DeliveryMode,
    Destination,
    Message,
    estimate_size,
    preserved,
)
from gateway.monitor import Monitor, covers_monitor
from gateway.routing import apply_props, both, is_simple, route_queue, route_topic
from gateway.subindex import SubIndex

log = logging.getLogger("gateway.broker")

UNDELIVERED = "$sys.undelivered"
PERSISTENT = DeliveryMode.PERSISTENT
NON_PERSISTENT = DeliveryMode.NON_PERSISTENT
RELIABLE = DeliveryMode.RELIABLE
SWEEP_INTERVAL = 1.0  # seconds between expiry sweeps


CLUSTER = "CLUSTER"  # the kind of a cluster link's connection (cluster.link)


class Topic:
    """A topic that exists on this gateway (static, dynamic or temporary)."""

    __slots__ = ("name", "props", "owner", "static", "stats_in", "stats_bytes_in", "dest",
                 "dest_text", "simple")

    def __init__(self, name: str, props: Any, *, static: bool, owner: Any = None) -> None:
        self.name = name
        self.props = props
        self.owner = owner
        self.static = static
        self.stats_in = 0
        self.stats_bytes_in = 0
        self.dest = Destination.topic(name)
        self.dest_text = str(self.dest)
        self.simple = is_simple(props)


class Broker(BrokerMemory):
    """The JMS-style core. Create inside a running event loop, then :meth:`start`."""

    def __init__(self, config: Any, store: Any, dlog: Any, *, gateway_id: str | None = None) -> None:
        self.config = config
        gw = config.gateway
        self.name: str = gw.server
        self.id = gateway_id or f"{self.name}-{uuid.uuid4().hex[:8]}"
        self.store = store
        self.dlog = dlog
        self.log_enabled = bool(getattr(dlog, "enabled", False))
        self.loop = asyncio.get_running_loop()
        self.flow_control = bool(gw.flow_control)
        self.authorization = bool(gw.authorization)
        super().__init__(gw, store)
        self.max_msg_size = int(gw.max_client_msg_size)
        self.topics: dict[str, Topic] = {}
        self.queues = {}
        self.subs = SubIndex()
        self.durables: dict[str, Subscription] = {}
        # Producer confirmations waiting for a commit, by store id (see routing.commit_future).
        self.confirming: dict[int, asyncio.Future[None]] = {}
        self.spools = 0  # subscriptions with a bound of their own (transport export spools)
        # Called with (subscription, True) when one is made and (subscription, False) when it
        # ends: transports start and stop topic imports by them (EMS User's Guide, chapter
        # "Working With TIBCO Rendezvous", "Topics" and "Queues").
        self.subscription_listeners: list[Callable[[Subscription, bool], None]] = []
        self.transports: Any = None  # the TransportManager, when transports run (admin API)
        # The declarative mappings (mappings.engine.MappingSet) of the config directory, if
        # any: adapters and transports apply them at their boundary.
        self.mappings: Any = None
        self.shared: dict[str, Subscription] = {}
        self.connections = {}
        self._conn_ids = itertools.count(1)
        # Connection ids: ``<server>:<n>``, and ``<server>:<node>:<n>`` on a cluster node,
        # whose connections the delivery log names beside other nodes' (cluster/)
        self._conn_prefix = (f"{self.name}:{gw.node_id}:" if gw.cluster and gw.node_id
                             else f"{self.name}:")
        self._msg_seq = itertools.count(1)
        self._temp_seq = itertools.count(1)
        self._msg_prefix = f"ID:{self.name}.{os.getpid():x}{uuid.uuid4().hex[:6]}:"
        self._trace_prefix = f"{self.id}:"
        self._sweeper: asyncio.TimerHandle | None = None
        self.stats = {"rejected": 0, "dropped": 0, "discarded": 0, "expired": 0,
                      "undelivered": 0, "swapped_out": 0, "swapped_in": 0,
                      "memory_held": 0}
        self.published = 0
        self.bytes_in = 0  # size of what was published (metrics: msgBytesIn)
        self.traffic = TrafficTable()  # by protocol, for /metrics (gateway.consumer)
        # this node's link to the other nodes of a cluster (cluster.link), or None
        self.cluster: Any = None
        # What gives each queue of a cluster its feed (cluster.link; see feed_queues)
        self.queue_feed: Callable[[str], Any] | None = None
        self.durable_feed: Callable[[str, str, bool], Any] | None = None
        # what each namespace of shared records tells of other nodes' changes (see
        # watch_shared)
        self.shared_watchers: dict[str, list[Callable[[str, bytes | None], Any]]] = {}
        # views of this node another node of a cluster may ask for (cluster.link), by name
        self.local_views: dict[str, Callable[[], Any]] = {}
        self.local_actions: dict[str, Callable[[str], Any]] = {}
        self.closed = False
        # The monitor topics (gateway.monitor); ``message_monitors`` counts the subscriptions
        # to message-monitoring topics, which the publish path reads first.
        self.monitor = Monitor(self)
        self.message_monitors = 0
        # The store's key-value records at start-up, for adapters (MQTT sessions, retained).
        self.kv: dict[str, dict[str, bytes]] = {}
        # (method, path, aiohttp handler) that adapters offer on the HTTP listener (WebSocket).
        self.http_routes: list[tuple[str, str, Any]] = []
        # Each protocol adapter's state shared by its listeners (TCP, TLS, WebSocket), by
        # protocol name ("mqtt", "amqp", "stomp"): the core never looks inside.
        self.adapter_servers: dict[str, Any] = {}
        # Figures adapters add to info() (/api/v1/server): what they hold outside the core,
        # such as the MQTT adapter's retained messages.
        self.info_sources: list[Callable[[], dict[str, Any]]] = []

    # -- life cycle -----------------------------------------------------------------------

    def start(self, recovered: Any = None) -> None:
        """Recover what the store returned at open and start the timers."""
        from gateway.recovery import recover

        self._ensure_queue(UNDELIVERED, system=True)
        if recovered is not None:
            self.kv = recovered.kv
            recover(self, recovered)
        self._sweeper = self.loop.call_later(SWEEP_INTERVAL, self._sweep)
        self.monitor.start()
        if self.swapping and self.memory:
            self.swap_soon()  # what recovery brought back: backlogs and the limit apply

    def close(self) -> None:
        """Stop timers; the caller flushes the store and the delivery log afterwards."""
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        self.monitor.close()
        for conn in list(self.connections.values()):
            conn.close()
        for ep in self._all_endpoints():
            ep.closed = True
            if ep.held_timer is not None:
                ep.held_timer.cancel()

    def now(self) -> int:
        return int(time.time() * 1000)

    def call_at_ms(self, due_ms: int, fn: Callable[[], None]) -> asyncio.TimerHandle:
        delay = max(0.0, (due_ms - time.time() * 1000) / 1000.0)
        return self.loop.call_later(delay, fn)

    def dest_text(self, dest: Destination) -> str:
        """The ``topic:name`` / ``queue:name`` text the delivery log writes (cached on
        ``dest``): that of the topic or queue of this name when there is one, so that the
        Destination of each message read back from the store does not make a string of its
        own."""
        t = dest._text
        if t is None:
            if dest.kind is TOPIC:
                topic = self.topics.get(dest.name)
                t = topic.dest_text if topic is not None else str(dest)
            else:
                queue = self.queues.get(dest.name)
                t = queue.log_dest if queue is not None else str(dest)
            dest._text = t
        return t

    def _sweep(self) -> None:
        now = self.now()
        for ep in self._all_endpoints():
            if ep.expiring:
                ep.sweep_expired(now)
        if not self.closed:
            self._sweeper = self.loop.call_later(SWEEP_INTERVAL, self._sweep)

    def stored_messages(self) -> Iterator[Message]:
        """Every stored message waiting in an endpoint (pending, or held for its delivery
        time), once per endpoint that holds it: at start, what the store recovered."""
        for ep in self._all_endpoints():
            if ep.durable:
                for msg in ep.iter_pending():
                    if msg.store_id:
                        yield msg
                for _, _, msg in ep.held:
                    if msg.store_id:
                        yield msg

    def _all_endpoints(self) -> list[Endpoint]:
        eps: list[Endpoint] = list(self.queues.values())
        eps.extend(self.durables.values())
        eps.extend(self.shared.values())
        for conn in self.connections.values():
            eps.extend(conn.subscriptions)
        return eps

    # -- connections ----------------------------------------------------------------------

    def anonymous_allowed(self) -> bool:
        """Whether a client without a user name may connect: always with ``authorization``
        disabled (every connection is accepted, EMS User's Guide, "Security Considerations";
        "Enabling Access Control"), otherwise as ``allow_anonymous`` says (EMS's ``anonymous``
        user, EMS User's Guide, "Users and Groups", "Users")."""
        return not self.authorization or bool(self.config.gateway.allow_anonymous)

    def authenticate(self, user: str | None, password: str | None) -> str | None:
        """The user a client presenting ``user`` / ``password`` connects as (``None``:
        anonymous), or SecurityError. The one set of credential rules every adapter uses.

        An empty user name is no user name. With ``authorization`` disabled every
        connection is accepted, whatever it presents, and keeps the name it gave -- a label
        for ``sender_name`` and the admin API's connection views; no permission is checked
        then (EMS User's Guide, "Enabling Access Control"), but a name that ``users.conf``
        lists is checked all the same, for the monitor topics only: they ask for a valid
        login whatever ``authorization`` says (EMS User's Guide, "Viewing Monitor Topics";
        a name whose password matched comes back as a
        :class:`~gateway.config.security.VerifiedUser`). With it enabled the name and
        password are checked against ``users.conf`` (EMS User's Guide, "Enabling Access
        Control"), and a client without a name connects only with ``allow_anonymous``
        enabled. A refusal is a ``$sys.monitor.connection.connect`` event.

        Raises:
            SecurityError: with ``authorization`` enabled, an unknown user or a wrong
                password ("authentication failed"), or no user name while ``allow_anonymous``
                is disabled ("anonymous connections are not allowed").
        """
        if not user:
            if not self.anonymous_allowed():
                self._refused(None, "not_authorized", "anonymous connections are not allowed")
            return None
        if self.config.security.authenticate(user, password or ""):
            return VerifiedUser(user)
        if self.authorization:
            self._refused(user, "invalid_password", f"authentication failed for user {user!r}")
        return user

    def _refused(self, user: str | None, reason: str, text: str) -> NoReturn:
        if self.monitor.watchers:
            self.monitor.connection_refused(user, reason, text)
        raise SecurityError(text)

    def connect(
        self,
        *,
        client_id: str | None = None,
        user: str | None = None,
        password: str | None = None,
        kind: str = "CLIENT",
        authenticated: bool = False,
        protocol: str = "inproc",
        address: str = "",
    ) -> Any:
        """Open a connection (the one client seam for adapters, transports and tests).

        ``authenticated=True`` means the caller (an adapter that did its own SASL or TLS
        client-certificate check) already verified ``user``; a ``user`` given as a
        :class:`~gateway.config.security.VerifiedUser` (an adapter's checked login, or
        in-process code vouching for one) may also subscribe to monitor topics.

        Raises:
            SecurityError: bad credentials, or anonymous access not allowed.
            IllegalStateError: the client id is already connected.
            LimitExceededError: ``max_connections`` reached.
        """
        from gateway.client import Connection

        if not authenticated:
            user = self.authenticate(user, password)
        verified = isinstance(user, VerifiedUser)
        if verified:
            user = str(user)  # the plain name: a label that message properties may carry
        max_conn = int(self.config.gateway.max_connections)
        if max_conn and len(self.connections) >= max_conn:
            raise LimitExceededError(f"max_connections ({max_conn}) reached")
        # One connection per JMS client id (JMS 1.1 §4.3.2): on a cluster node, in the whole
        # cluster (cluster.link; an MQTT client id takes its connection over instead)
        claim = (client_id is not None and self.cluster is not None and kind == "CLIENT"
                 and protocol != "mqtt")
        if client_id is not None:
            for c in self.connections.values():
                if c.client_id == client_id:
                    raise IllegalStateError(f"client id {client_id!r} is already connected")
            if claim:
                node = self.cluster.client_node(client_id)
                if node is not None:
                    raise IllegalStateError(f"client id {client_id!r} is already connected "
                                            f"(to cluster node {node})")
        cid = f"{self._conn_prefix}{next(self._conn_ids)}"
        conn = Connection(self, cid, client_id=client_id, user=user, kind=kind, protocol=protocol,
                          address=address)
        self.connections[cid] = conn
        if claim:
            self.cluster.claim_client(client_id, True)
        monitor = self.monitor
        if verified and not self.authorization:
            monitor.verified.add(cid)
        if monitor.watchers:
            monitor.connection_event(conn, True)
        return conn

    def client_arrived(self, protocol: str, client_id: str) -> None:
        """An adapter's client ``client_id`` connected (after any takeover here): a
        cluster's other nodes take over their connection of that id (cluster.link)."""
        if self.cluster is not None:
            self.cluster.client_arrived(protocol, client_id)

    def disconnected(self, conn: Any) -> None:
        if (self.connections.pop(conn.id, None) is not None and self.cluster is not None
                and conn.client_id is not None and conn.kind == "CLIENT"
                and conn.protocol != "mqtt"):
            self.cluster.claim_client(conn.client_id, False)
        self.slow_connections.pop(conn.id, None)
        monitor = self.monitor
        monitor.verified.discard(conn.id)
        if monitor.watchers:
            monitor.connection_event(conn, False)
        for name in list(conn.temp_queues):
            self.delete_temporary(Destination.queue(name))
        for name in list(conn.temp_topics):
            self.delete_temporary(Destination.topic(name))

    # -- destinations ---------------------------------------------------------------------

    def topic(self, name: str, *, create: bool = True) -> Topic:
        """The topic ``name``, created if its name matches a topics.conf entry (a
        ``$sys.monitor.topic.create`` event).

        Raises:
            InvalidDestinationError: bad name, wildcard, or creation not allowed
            (EMS User's Guide, "Wildcards in Topics").
            SecurityError: a monitor topic, which only the gateway makes (EMS User's Guide,
            "System Monitor Topics").
        """
        t = self.topics.get(name)
        if t is not None:
            return t
        system = name.startswith("$")
        subject.validate(name, system=system)
        if name.startswith(MONITOR_PREFIX):
            raise SecurityError(f"{name!r} is a monitor topic: only the gateway publishes there")
        if name.startswith(TEMP_PREFIX):
            raise InvalidDestinationError(f"temporary topic {name!r} does not exist")
        props = self.config.topics.resolve(name)
        if props is None or not create:
            raise InvalidDestinationError(
                f"topic {name!r} does not exist and no topics.conf entry allows creating it"
            )
        t = Topic(name, props, static=self.config.topics.is_static(name))
        self.topics[name] = t
        if not t.static and self.monitor.watchers:
            self.monitor.destination_created(t.dest, "producer")
        return t

    def queue(self, name: str, *, create: bool = True, reason: str = "consumer") -> QueueEndpoint:
        """The queue ``name``, created if its name matches a queues.conf entry
        (EMS User's Guide, "Wildcards in Queues"): a ``$sys.monitor.queue.create`` event
        with ``reason`` (``consumer``, or ``producer`` from the publish path)."""
        q = self.queues.get(name)
        if q is not None:
            return q
        if name.startswith(TEMP_PREFIX):
            raise InvalidDestinationError(f"temporary queue {name!r} does not exist")
        if name.startswith("$"):
            raise InvalidDestinationError(f"queue {name!r} is reserved")
        subject.validate(name)
        props = self.config.queues.resolve(name)
        if props is None or not create:
            raise InvalidDestinationError(
                f"queue {name!r} does not exist and no queues.conf entry allows creating it"
            )
        q = self._ensure_queue(name, props=props)
        if self.monitor.watchers and not self.config.queues.is_static(name):
            self.monitor.destination_created(q.dest, reason)
        return q

    def _ensure_queue(self, name: str, *, props: Any = None, system: bool = False,
                      owner: Any = None) -> QueueEndpoint:
        q = self.queues.get(name)
        if q is not None:
            return q
        if props is None:
            props = self.config.queues.resolve(name) if not system else None
            if props is None:
                props = self.config.queues.default_props()
        q = QueueEndpoint(self, name, props, owner=owner)
        self.queues[name] = q
        if self.queue_feed is not None and not name.startswith("$"):
            q.feed = self.queue_feed(name)
        return q

    def create_temporary(self, conn: Any, kind: int) -> Destination:
        """A new temporary topic or queue owned by ``conn`` (EMS User's Guide,
        "Destination Overview")."""
        name = f"{TEMP_PREFIX}{self.name}.{next(self._temp_seq)}"
        if kind == QUEUE:
            self._ensure_queue(name, props=self.config.queues.default_props(), owner=conn)
            conn.temp_queues.add(name)
            return Destination.queue(name)
        self.topics[name] = Topic(name, self.config.topics.default_props(), static=False, owner=conn)
        conn.temp_topics.add(name)
        return Destination.topic(name)

    def delete_temporary(self, dest: Destination) -> None:
        if dest.kind == QUEUE:
            q = self.queues.pop(dest.name, None)
            if q is not None:
                self._drop_queue(q)
                if q.owner is not None:
                    q.owner.temp_queues.discard(dest.name)
        else:
            t = self.topics.pop(dest.name, None)
            if t is not None and t.owner is not None:
                t.owner.temp_topics.discard(dest.name)

    @staticmethod
    def _drop_queue(q: QueueEndpoint) -> None:
        """``q`` is out of the broker's queues: it takes nothing more and holds nothing."""
        q.closed = True
        q.purge()

    def resolve_for_send(self, dest: Destination) -> Topic | QueueEndpoint:
        if dest.kind == TOPIC:
            return self.topic(dest.name)
        return self.queue(dest.name, reason="producer")

    def exists(self, dest: Destination) -> bool:
        """Whether the topic or queue ``dest`` exists now (a temporary one until it is
        deleted); nothing is created."""
        return dest.name in (self.queues if dest.kind == QUEUE else self.topics)

    def publish_monitor(self, name: str, body: dict[str, Any],
                        properties: dict[str, Any] | None = None, ttl: int = 0) -> None:
        """Publish ``body`` as a non-persistent map message on the server's monitor topic
        ``name`` (``$sys.monitor...``, see :mod:`gateway.monitor`), with ``properties`` and,
        when ``ttl`` (ms) is given, that lifetime; the topic is made on first use as EMS's
        monitor topics are the server's own, and only while someone subscribes to it
        (nothing is made otherwise). Its messages take the publish path's slow branch, where
        a client's publish on it is refused."""
        if self.closed or not self.subs.has_interest(name):
            return
        if name not in self.topics:
            t = self.topics[name] = Topic(name, self.config.topics.default_props(), static=False)
            t.simple = False
        msg = Message.map(body)
        msg.destination = Destination.topic(name)
        msg.delivery_mode = NON_PERSISTENT
        if properties:
            msg.properties = properties
        if ttl:
            msg.expiration = self.now() + ttl
        try:
            self.publish(msg)
        except GatewayError as exc:
            log.debug("monitor message on %s not published: %s", name, exc)

    def count_dropped(self, msg: Message, client: str | None, reason: str) -> None:
        """An adapter dropped ``msg`` on its way out (a client cannot take it): counted in
        the server's ``dropped`` and logged as ``drop`` with ``reason``."""
        self.stats["dropped"] += 1
        if self.log_enabled and msg.destination is not None:
            self.dlog.record("drop", msg, self.dest_text(msg.destination), client, 0, reason)

    # -- security -------------------------------------------------------------------------

    def check(self, conn: Any, kind: str, name: str, perm: str, props: Any) -> None:
        """Raise SecurityError unless ``conn`` may do ``perm`` on the destination.

        Permissions are checked only with ``authorization`` on and on ``secure``
        destinations (EMS User's Guide, "Destination Properties", secure).
        """
        if not self.authorization or props is None or not props.secure or conn.kind != "CLIENT":
            return
        if not self.config.security.check(conn.user, kind, name, perm):
            raise SecurityError(f"user {conn.user!r} may not {perm} on {kind} {name!r}")

    # -- publish --------------------------------------------------------------------------

    def stamp(self, msg: Message, conn: Any, now: int) -> None:
        """Give a message entering the gateway its id, timestamp and trace id."""
        seq = next(self._msg_seq)
        if msg.message_id is None:
            msg.message_id = self._msg_prefix + str(seq)
        if not msg.timestamp:
            msg.timestamp = now
        if msg.trace_id is None:
            msg.trace_id = self._trace_prefix + str(seq)
            msg.origin = self.id
        if conn is not None:
            msg.producer_conn = conn.id
        if not msg.size:
            body = msg.body
            if type(body) is bytes and not msg.properties:
                msg.size = len(body) + 64  # estimate_size's answer, without the call
            else:
                msg.size = estimate_size(msg)

    def publish(self, msg: Message, conn: Any = None, now: int = 0,
                far: tuple[str | None, str | None] | None = None) -> asyncio.Future[None] | None:
        """Route one message; see the module docstring. ``msg.destination`` must be set.

        Returns ``None`` or a future to wait on before confirming to the producer.

        ``far`` is given by a transport for a message it imports: the far side's id of it
        and name of its destination (either None when unknown). Its record in the delivery
        log is then the ``import`` (``client`` the transport's name, ``far_id``,
        ``far_dest``), not a ``publish``: one record for the message entering the gateway
        (docs/delivery-log.md, "Events").

        Raises:
            InvalidDestinationError, SecurityError, LimitExceededError: the message was not
            accepted (never raised for RELIABLE messages, which are dropped and logged,
            EMS User's Guide, "Message Delivery Modes", RELIABLE_DELIVERY).
        """
        if not now:
            now = self.now()
        if msg.message_id is None or msg.trace_id is None or not msg.size:
            self.stamp(msg, conn, now)
        # One function, not publish() calling a _publish(): this is the hot path.
        try:
            dest = msg.destination
            if dest is None:
                raise InvalidDestinationError("message has no destination")
            if self.max_msg_size and msg.size > self.max_msg_size:
                raise LimitExceededError(
                    f"message of {msg.size} bytes exceeds max_client_msg_size {self.max_msg_size}"
                )
            held = False
            if self.max_memory and self.memory + msg.size > self.memory_cap:
                held = self._memory_full(msg)
            is_topic = dest.kind is TOPIC
            if is_topic:
                target: Topic | QueueEndpoint = self.topics.get(dest.name) or self.topic(dest.name)
            else:
                target = self.queues.get(dest.name) or self.queue(dest.name, reason="producer")
            if target.simple:
                if msg.expiration:
                    msg.expires_at = msg.expiration
            else:
                if conn is not None and dest.name.startswith(MONITOR_PREFIX):
                    raise SecurityError(f"{dest.name!r} is a monitor topic: only the gateway "
                                        "publishes there")
                apply_props(self, msg, conn, dest, target.props, now)
            cluster = self.cluster
            if (cluster is not None and cluster.down and msg.delivery_mode == PERSISTENT
                    and not dest.name.startswith("$")
                    and (conn is None or conn.kind != CLUSTER)):
                raise UnavailableError("this cluster node cannot reach its NATS servers: "
                                       "persistent messages are refused until it can")
            self.published += 1
            self.bytes_in += msg.size
            if conn is not None:
                traffic = conn.traffic
                traffic.messages_in += 1
                traffic.bytes_in += msg.size
            if self.log_enabled:
                msg.log_head = None  # logged as published (a producer may send it again)
                text = dest._text
                if text is None:
                    # The topic's or queue's text, made once when it was created (its own
                    # Destination keeps it), not a string per message; kept on the message's
                    # Destination (often one of its own, made by the adapter) for the records
                    # of its deliveries to wildcard subscriptions (Endpoint.log_dest_of).
                    text = dest._text = target.dest._text or str(dest)
                if far is None:
                    if conn is None or conn.kind != CLUSTER:  # logged on its node
                        self.dlog.record("publish", msg, text, conn.id if conn else None)
                else:
                    self.dlog.record("import", msg, text, conn.log_id, 0,
                                     None, (None, far[0], far[1], None))
            if is_topic:
                fut = route_topic(self, target, msg, now)  # type: ignore[arg-type]
                if self.cluster is not None and (conn is None or conn.kind != CLUSTER):
                    kept = self.cluster.forward(msg)  # to the other nodes (cluster.link)
                    if kept is not None:  # and kept for the durable subscriptions
                        fut = kept if fut is None else both(self.loop, fut, kept)
            else:
                q = cast(QueueEndpoint, target)
                feed = q.feed
                if feed is not None:  # a queue of the cluster (cluster.queues)
                    fut = feed.enqueue(msg)
                else:
                    fut = route_queue(self, q, msg, now)
            if self.message_monitors:
                self.monitor.message_event("r", dest, msg, conn,
                                           "producer" if far is None else "import")
            if held:
                return self._hold_for_memory(fut)
            return fut
        except (InvalidDestinationError, SecurityError, LimitExceededError,
                UnavailableError) as exc:
            self.stats["rejected"] += 1
            if self.log_enabled:
                self.dlog.record("reject", msg, str(msg.destination),
                                 conn.log_id if conn else None, 0, exc.reason)
            if msg.delivery_mode == RELIABLE:
                return None
            raise


    def release_flow(self, ep: Endpoint) -> None:
        waiters, ep.flow_waiters = ep.flow_waiters, []
        for f in waiters:
            if not f.done():
                f.set_result(None)


    def unstore(self, ep: Endpoint, msg: Message) -> None:
        """Remove ``msg`` from ``ep`` in the store; the message row goes with its last entry.

        ``msg.refs`` counts the endpoints holding this object. A durable subscription's
        row may have more entries than that, with swapping: other subscriptions' tails, or
        their own object read back from a tail. So the store deletes such a row only when
        no entry references it any more (``delete_unreferenced``), in the writer."""
        store = self.store
        store.remove_entry(ep.key, msg.store_id)
        msg.refs -= 1
        if msg.refs <= 0:
            sid = msg.store_id
            if self.swapping and type(ep) is Subscription:
                store.delete_unreferenced(sid)
            else:
                store.delete_message(sid)
            msg.store_id = 0
            fut = self.confirming.pop(sid, None)
            if fut is not None and not fut.done():
                fut.set_result(None)  # every stored copy was consumed before its commit
        store.commit(None)

    def undeliverable(self, msg: Message, ep: Endpoint, reason: str, count: int) -> None:
        """An expired or over-delivered message: to ``$sys.undelivered`` or dropped
        (EMS User's Guide, "Undelivered Message Queue"); a premature exit (``p``) for message
        monitoring."""
        if reason == "expired":
            self.stats["expired"] += 1
        if self.message_monitors and msg.destination is not None:
            self.monitor.message_event("p", msg.destination, msg, None, reason)
        if preserved(msg) and ep.key != "queue:" + UNDELIVERED:
            q = self.queues[UNDELIVERED]
            copy = msg.copy()
            copy.expires_at = 0
            copy.expiration = 0
            copy.size = msg.size
            self.stats["undelivered"] += 1
            if self.log_enabled:
                self.dlog.record("undeliverable", msg, ep.log_dest_of(msg), None, count, reason)
            if msg.delivery_mode == PERSISTENT:
                if not q.stored:
                    self.store.put_endpoint(q.key, {"type": "queue", "name": q.name})
                    q.stored = True
                self.store.put_message(copy)
                copy.refs = 1
                self.store.add_entry(q.key, copy.store_id, 0)
                self.store.commit(None)
            self.memory += copy.size + MESSAGE_OVERHEAD
            q.put(copy, self.now())
            return
        self.stats["dropped"] += 1
        if self.log_enabled:
            self.dlog.record("expire" if reason == "expired" else "drop", msg,
                             ep.log_dest_of(msg), None, count, reason)
        log.debug("dropped %s from %s: %s", msg.message_id, ep.key, reason)

    # -- subscriptions --------------------------------------------------------------------

    def subscribe(
        self,
        conn: Any,
        pattern: str,
        *,
        durable_name: str | None = None,
        shared_name: str | None = None,
        selector: Any = None,
        no_local: bool = False,
        parent_match: bool = False,
        share_scope: str | None = None,
    ) -> Subscription:
        """Find or create the subscription a new topic consumer attaches to (EMS User's Guide,
        "Durable Subscribers for Topics" and "Shared Subscriptions for Topics").

        Raises:
            InvalidDestinationError: a bad pattern, or a temporary topic of another connection.
            IllegalStateError: an unshared durable already has an active consumer, or a
                shared and an unshared subscription clash on one name.
        """
        subject.validate(pattern, wildcards=True, system=pattern.startswith("$"))
        if pattern.startswith(TEMP_PREFIX):
            t = self.topics.get(pattern)
            if t is None:
                raise InvalidDestinationError(f"temporary topic {pattern!r} does not exist")
            if t.owner is not conn:
                raise InvalidDestinationError("only the connection that created a temporary "
                                              "topic may consume from it")
        if not subject.is_wildcard(pattern) and not pattern.startswith(TEMP_PREFIX):
            props = self.config.topics.resolve(pattern)
        else:
            props = self._subscribe_props(pattern)
        if conn.kind == "CLIENT":
            if covers_monitor(pattern):
                # Always checked, on rules of their own (EMS User's Guide, "Viewing Monitor
                # Topics"): not the destination permissions below.
                self.monitor.check_subscribe(conn, pattern)
            elif self.authorization:
                self.check(conn, "topic", pattern, "subscribe", props)
                if durable_name is not None:
                    self.check(conn, "topic", pattern, "durable", props)
        sel_text = selector.text if selector is not None else None
        scope = conn.client_id or ""
        if shared_name is not None and share_scope is not None:
            scope = share_scope
        if durable_name is not None:
            key = f"sub:{scope}:{durable_name}"
            sub = self.durables.get(key)
            shared = shared_name is not None
            if sub is not None:
                old_sel = sub.selector.text if sub.selector is not None else None
                if sub.shared != shared:
                    raise IllegalStateError(
                        f"durable subscription {durable_name!r} exists and is "
                        f"{'shared' if sub.shared else 'not shared'}"
                    )
                if not shared and sub.consumers:
                    raise IllegalStateError(
                        f"durable subscription {durable_name!r} already has an active consumer"
                    )
                if sub.pattern != pattern or old_sel != sel_text or sub.no_local != no_local:
                    if sub.consumers:
                        raise IllegalStateError(
                            f"durable subscription {durable_name!r} is in use with another "
                            "topic or selector"
                        )
                    # JMS: changing topic or selector replaces the durable subscription.
                    self._drop_subscription(sub)
                    sub = None
            if sub is None:
                if conn.client_id is None and not shared:
                    raise IllegalStateError("an unshared durable subscription needs a client id")
                sub = Subscription(self, key, pattern, durable=True, shared=shared,
                                   name=durable_name, client_id=scope or None, selector=selector,
                                   no_local=no_local, owner=conn if no_local else None,
                                   parent_match=parent_match)
                self.durables[key] = sub
                self.subs.insert(pattern, sub, parent_match=parent_match)
                self.store.put_endpoint(key, sub.definition())
                self.store.commit(None)
                if self.durable_feed is not None and not pattern.startswith("$"):
                    sub.feed = self.durable_feed(key, pattern, parent_match)
                self._subscription_event(sub, True)
            elif no_local:
                sub.owner = conn
            return sub
        if shared_name is not None:
            key = f"shared:{scope}:{shared_name}"
            sub = self.shared.get(key)
            if sub is not None:
                return sub
            sub = Subscription(self, key, pattern, durable=False, shared=True, name=shared_name,
                               client_id=conn.client_id, selector=selector, no_local=no_local,
                               owner=conn if no_local else None, parent_match=parent_match)
            sub.laggard_at = LAGGARD_MIN + 1
            self.shared[key] = sub
            self.subs.insert(pattern, sub, parent_match=parent_match)
            self._subscription_event(sub, True)
            return sub
        key = f"nd:{conn.id}:{next(self._temp_seq)}"
        sub = Subscription(self, key, pattern, durable=False, shared=False, name=None,
                           client_id=conn.client_id, selector=selector, no_local=no_local,
                           owner=conn, parent_match=parent_match)
        sub.laggard_at = LAGGARD_MIN + 1
        self.subs.insert(pattern, sub, parent_match=parent_match)
        conn.subscriptions.append(sub)
        self._subscription_event(sub, True)
        return sub

    def _subscription_event(self, sub: Subscription, added: bool) -> None:
        for listener in self.subscription_listeners:
            try:
                listener(sub, added)
            except Exception:
                log.exception("subscription listener failed")

    def durable(self, key: str) -> Subscription | None:
        """The durable subscription stored as ``key`` (``sub:<scope>:<name>``), if any."""
        return self.durables.get(key)

    def durable_subscriptions(self) -> list[Subscription]:
        """Every durable subscription (not shared ones)."""
        return list(self.durables.values())

    def set_spool(self, sub: Subscription, bounds: tuple[int, int, bool]) -> None:
        """Give ``sub`` a bound of its own, a transport's export spool: (most messages, most
        bytes, whether a full spool holds producers rather than refusing them); 0 = none."""
        if sub.spool is None:
            self.spools += 1
        sub.spool = bounds

    def watch_subscriptions(self, listener: Callable[[Subscription, bool], None],
                            on: bool = True) -> None:
        """Call ``listener(subscription, True)`` when a subscription is made and
        ``(subscription, False)`` when it ends (``on=False``: stop calling it)."""
        listeners = self.subscription_listeners
        if on:
            listeners.append(listener)
        elif listener in listeners:
            listeners.remove(listener)

    # -- endpoints fed by a cluster (cluster.feeds) ---------------------------------------

    def feed_queues(self, factory: Callable[[str], Any] | None) -> None:
        """Give every queue but the ``$`` ones (temporary, system) the feed ``factory(name)``
        returns, now and as queues are made; ``None`` takes them away. A queue with a feed
        sends what producers put on it to the feed (``enqueue``) and tells it of every
        message that leaves (``removed``) and of its consumers (``consumers_changed``)."""
        self.queue_feed = factory
        for name, q in self.queues.items():
            if not name.startswith("$"):
                q.feed = factory(name) if factory is not None else None

    def feed_durables(self, factory: Callable[[str, str, bool], Any] | None) -> None:
        """Give every durable subscription but those to ``$`` topics the feed
        ``factory(key, pattern, parent_match)`` returns, now and as they are made; ``None``
        takes them away. Routing puts no persistent message on a durable subscription with
        a feed (the feed brings those); it is told of every message that leaves, of its
        consumers, and (``dropped``) of the subscription's end."""
        self.durable_feed = factory
        for sub in self.durables.values():
            if not sub.pattern.startswith("$"):
                sub.feed = (factory(sub.key, sub.pattern, sub.parent_match)
                            if factory is not None else None)

    def _fed(self, key: str) -> Endpoint | None:
        if key.startswith("queue:"):
            return self.queues.get(key[6:])
        return self.durables.get(key)

    def feed_demand(self, key: str, cap: int) -> int:
        """How many more messages endpoint ``key`` can use now: its consumers' windows (an
        unlimited one counts as ``cap``), at most ``cap``, less what it holds."""
        ep = self._fed(key)
        if ep is None or not ep.consumers:
            return 0
        room = 0
        for c in ep.consumers:
            if not c.paused:
                w = c.window
                room += cap if w is None else max(w, 1)
        return min(room, cap) - ep.count if room else 0

    def feed_take(self, key: str, msg: Message, delivery_count: int) -> str:
        """Put ``msg``, from a feed, on endpoint ``key`` for its consumers, without storing
        it (the feed keeps it until it leaves); ``delivery_count`` is how many times it was
        delivered before. ``"taken"``; ``"filtered"`` when the subscription's selector or
        no-local refuses it; ``"returned"`` when the endpoint has no consumers any more."""
        ep = self._fed(key)
        if ep is None or not ep.consumers or ep.closed:
            return "returned"
        if type(ep) is Subscription and (ep.no_local or ep.selector is not None) \
                and not ep.accepts(msg):
            return "filtered"
        if not msg.size:
            msg.size = estimate_size(msg)
        if msg.expiration and not msg.expires_at:
            msg.expires_at = msg.expiration
        self.memory += msg.size + MESSAGE_OVERHEAD
        ep.restore(msg, delivery_count, self.now())
        return "taken"

    def feed_return(self, key: str) -> list[Message]:
        """Take back what endpoint ``key`` holds and has not delivered (pending and held),
        for its feed to give to others; its feed is not told of these."""
        ep = self._fed(key)
        if ep is None:
            return []
        out = ep.iter_pending() + [m for _, _, m in ep.held]
        feed, ep.feed = ep.feed, None
        try:
            ep.purge()
        finally:
            ep.feed = feed
        return out

    def all_subscriptions(self) -> list[Subscription]:
        """Every live subscription: durable, shared and each connection's own."""
        out = list(self.durables.values()) + list(self.shared.values())
        for conn in self.connections.values():
            out.extend(conn.subscriptions)
        return out

    def _subscribe_props(self, pattern: str) -> Any:
        """Properties that govern a wildcard subscription: those of the entries it falls under."""
        t = self.topics.get(pattern)
        if t is not None:
            return t.props
        props = self.config.topics.resolve(pattern)
        return props if props is not None else self.config.topics.default_props()

    def consumer_gone(self, sub: Subscription) -> None:
        """The last consumer left ``sub``: a non-durable subscription ends with it."""
        if sub.durable or sub.consumers:
            return
        if sub.shared:
            self.shared.pop(sub.key, None)
        elif sub.owner is not None and sub in sub.owner.subscriptions:
            sub.owner.subscriptions.remove(sub)
        self._drop_subscription(sub)

    def _drop_subscription(self, sub: Subscription) -> None:
        self.subs.remove(sub.pattern, sub, parent_match=sub.parent_match)
        self.laggards.pop(sub, None)
        sub.closed = True
        if sub.spool is not None:
            self.spools -= 1
        if self.subscription_listeners:
            self._subscription_event(sub, False)
        if sub.held_timer is not None:
            sub.held_timer.cancel()
        sub.purge()
        if sub.durable:
            self.durables.pop(sub.key, None)
            self.store.delete_endpoint(sub.key)
            self.store.commit(None)
        feed = sub.feed
        if feed is not None:  # the cluster's copy of the subscription ends with it
            sub.feed = None
            feed.dropped()

    def release_durable(self, key: str) -> None:
        """This node lets go of durable subscription ``key`` without ending it: what it
        holds goes back to the cluster's store, which keeps the subscription for the node
        its subscriber is on now (an MQTT session resumed on another node)."""
        sub = self.durables.get(key)
        if sub is None or sub.consumers:
            return
        feed = sub.feed
        if feed is not None:
            feed.give_back()
            sub.feed = None
        self._drop_subscription(sub)

    # -- records shared by the nodes of a cluster (cluster.records) --------------------------

    def share_record(self, ns: str, key: str, value: bytes | None) -> None:
        """On a cluster node, share a record of namespace ``ns`` (``None``: delete it) with
        the other nodes; alone, nothing (the store keeps the record)."""
        if self.cluster is not None:
            self.cluster.share_record(ns, key, value)

    def shared_record(self, ns: str, key: str) -> bytes | None:
        """The cluster's copy of record ``key`` of ``ns`` (None alone, or when none)."""
        return self.cluster.shared_record(ns, key) if self.cluster is not None else None

    def shared_records(self, ns: str) -> dict[str, bytes]:
        """Every record of ``ns`` the cluster shares (empty alone)."""
        return self.cluster.shared_records(ns) if self.cluster is not None else {}

    def cluster_ready(self) -> asyncio.Future[None] | None:
        """On a cluster node, a future done once the subscriptions made so far reach the
        other nodes (an adapter answers a subscription then); None when there is nothing to
        wait for (alone, or nothing pending)."""
        if self.cluster is None:
            return None
        return self.cluster.ready()  # type: ignore[no-any-return]

    def node_id(self) -> str | None:
        """This gateway's node id in its cluster (None alone)."""
        return self.cluster.node_id if self.cluster is not None else None  # type: ignore[no-any-return]

    async def hand_over(self, protocol: str, client_id: str, node: str) -> bytes | None:
        """Have cluster node ``node`` let go of its session of ``client_id`` (``protocol``'s
        adapter) for this node, and give its state (None: not a cluster node, ``node`` is
        down or did not answer, or holds no such session)."""
        if self.cluster is None:
            return None
        return await self.cluster.hand_over(protocol, client_id, node)  # type: ignore[no-any-return]

    def watch_shared(self, ns: str, listener: Callable[[str, bytes | None], Any]) -> None:
        """Call ``listener(key, value)`` when another node of the cluster changes a record
        of ``ns`` (``value`` None: deleted)."""
        self.shared_watchers.setdefault(ns, []).append(listener)

    def shared_changed(self, ns: str, key: str, value: bytes | None) -> None:
        """Another node changed a shared record (cluster.records)."""
        for listener in self.shared_watchers.get(ns, ()):
            listener(key, value)

    def forget_durable(self, key: str) -> None:
        """Durable subscription ``key`` ends for good, with what it holds, wherever it is:
        here, or, on a cluster node, in the cluster's store (cluster.feeds)."""
        sub = self.durables.get(key)
        if sub is not None:
            if sub.consumers:
                raise IllegalStateError(f"durable subscription {sub.name!r} has an active "
                                        "consumer")
            self._drop_subscription(sub)
        elif self.cluster is not None:
            self.cluster.forget_durable(key)

    def unsubscribe(self, conn: Any, name: str, share_scope: str | None = None) -> None:
        """Delete a durable subscription (JMS ``Session.unsubscribe``); ``share_scope`` as
        given to :meth:`subscribe` for a shared one named in another scope.

        Raises:
            InvalidDestinationError: no such durable subscription.
            IllegalStateError: it still has an active consumer.
        """
        scope = share_scope if share_scope is not None else (conn.client_id or "")
        key = f"sub:{scope}:{name}"
        sub = self.durables.get(key)
        if sub is None:
            raise InvalidDestinationError(f"no durable subscription named {name!r}")
        if sub.consumers:
            raise IllegalStateError(f"durable subscription {name!r} has an active consumer")
        self._drop_subscription(sub)

    def purge_queue(self, name: str) -> int:
        q = self.queues.get(name)
        if q is None:
            raise InvalidDestinationError(f"no queue named {name!r}")
        n = q.purge()
        self.store.commit(None)
        return n

    def purge_topic(self, name: str) -> int:
        """Admin ``purge topic``: drop what every subscription to ``name`` holds."""
        n = 0
        for s in self.subs.match(name):
            sub: Subscription = s  # type: ignore[assignment]
            n += sub.purge()
        self.store.commit(None)
        return n

    def delete_queue(self, name: str) -> None:
        """Admin ``delete queue``: the queue goes with its messages, stored ones too (a
        use of the name that a queues.conf entry allows makes it again, empty)."""
        q = self.queues.pop(name, None)
        if q is None:
            raise InvalidDestinationError(f"no queue named {name!r}")
        self._drop_queue(q)
        self.store.delete_endpoint(q.key)
        self.store.commit(None)

    # -- admin views ----------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "id": self.id,
            "connections": len(self.connections),
            "topics": len(self.topics),
            "queues": len(self.queues),
            "durables": len(self.durables),
            "subscriptions": len(self.subs),
            "memory": self.memory,
            "max_msg_memory": self.max_memory,
            "msg_swapping": self.swapping,
            "swapped": self.swapped,
            "memory_held_producers": len(self.memory_waiters),
            "published": self.published,
            **self.stats,
        } | {k: v for source in self.info_sources for k, v in source().items()}


if TYPE_CHECKING:
    from gateway.facade import Core

    def _is_core(broker: Broker) -> Core:
        return broker  # mypy: the broker offers every operation of the adapters' face
