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
Parameters). ``memory`` is what the messages held by endpoints cost
(:func:`gateway.backlog.charge`). With ``msg_swapping`` the persistent messages pending on a
queue behind its first ``destination_backlog_swapout`` leave memory for the store as they come,
and past :data:`SWAP_AT` of the limit more do, deepest queues first, until memory is down to
:data:`SWAP_TO` (:meth:`Broker.swap_out`). A durable subscription holding that many pending
messages in memory (or any, with memory past :data:`SWAP_AT`) does not take a newly routed
persistent message into memory at all: the message's store entry is written, the
subscription counts it in its tail and reads it back later (see :mod:`gateway.backlog`).
A message that would take memory past the limit even so is first made room for by dropping what slow consumers (connections whose adapter paused
their deliveries for a full write buffer) have pending on non-durable topic subscriptions,
when non-persistent (:meth:`Broker.shed_slow`), then by dropping the oldest of what the
*laggards* have pending -- non-durable topic subscriptions holding at least
:data:`LAGGARD_MIN` messages no consumer of theirs can take now (a stuck MQTT QoS 1 client
with a full in-flight window, whose write buffer never fills) -- deepest first, whatever the
delivery mode (nothing pending on a non-durable subscription is in the store)
(:meth:`Broker.shed_laggards`, which looks only at the subscriptions that passed
:data:`LAGGARD_MIN` since it last looked, :meth:`Broker.laggard_seen`). One consumer that
stops reading therefore loses its own backlog, not everyone their producers; what still
does not fit is, with
``flow_control`` enabled, accepted but its producer's confirmation waits until
memory is back under :data:`RESUME_AT` of the limit -- the adapters stop reading or withhold
credit while confirmations wait, so producers are paused, as EMS blocks a send under flow
control -- and, with ``flow_control`` disabled, refused with
:class:`~gateway.errors.LimitExceededError`, which each adapter answers in its protocol.

Destinations are created on first use only when a ``topics.conf``/``queues.conf`` entry
matches (EMS User's Guide, "Wildcards and Dynamically Created Destinations"). Temporary
destinations belong to their connection and vanish with it. Undeliverable messages (expired,
past ``maxRedelivery``) go to ``$sys.undelivered`` when they carry
``JMS_GW_PRESERVE_UNDELIVERED``, otherwise they are dropped and logged (EMS User's Guide,
"Undelivered Message Queue").

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
from typing import Any

from gateway import subject
from gateway.backlog import MESSAGE_OVERHEAD, swap_out
from gateway.endpoint import Endpoint, QueueEndpoint, Subscription
from gateway.errors import (
    IllegalStateError,
    InvalidDestinationError,
    LimitExceededError,
    SecurityError,
)
from gateway.message import (
    PROP_DISABLE_SENDER,
    PROP_SENDER,
    QUEUE,
    TEMP_PREFIX,
    TOPIC,
    DeliveryMode,
    Destination,
    Message,
    estimate_size,
    preserved,
)
from gateway.subindex import SubIndex

log = logging.getLogger("gateway.broker")
trace_log = logging.getLogger("gateway.trace")

UNDELIVERED = "$sys.undelivered"
PERSISTENT = DeliveryMode.PERSISTENT
RELIABLE = DeliveryMode.RELIABLE
SWEEP_INTERVAL = 1.0  # seconds between expiry sweeps
# Memory marks, as fractions of max_msg_memory. Swapping starts past SWAP_AT and goes down to
# SWAP_TO, so it runs now and then in batches rather than for every message; 75% leaves the
# last quarter for what cannot be swapped (non-persistent messages, topics, messages in
# flight) before producers are held. Held producers go on below RESUME_AT, not at once below
# the limit, so that they are not woken for one message at a time.
SWAP_AT = 0.75
SWAP_TO = 0.5
RESUME_AT = 0.9
# Pending messages past which a non-durable subscription is a laggard that pays, at
# max_msg_memory, before producers are held or refused (see the module docstring), and what
# it keeps. A consumer that keeps up has nothing pending (dispatch hands a message to a
# ready consumer at once) or, between two acknowledgements of a busy MQTT window, a few
# dozen; an MQTT session's queue may hold 1000 (mqtt_max_queued_messages), so a smaller
# figure than that is needed for stuck MQTT clients to qualify.
LAGGARD_MIN = 100
# Pending messages one swap pass looks at before it yields the loop (a pass over a deep queue
# costs about 0.3 µs a message).
SWAP_BUDGET = 50_000


class Topic:
    """A topic that exists on this gateway (static, dynamic or temporary)."""

    __slots__ = ("name", "props", "owner", "static", "stats_in", "dest", "dest_text", "simple")

    def __init__(self, name: str, props: Any, *, static: bool, owner: Any = None) -> None:
        self.name = name
        self.props = props
        self.owner = owner
        self.static = static
        self.stats_in = 0
        self.dest = Destination.topic(name)
        self.dest_text = str(self.dest)
        self.simple = is_simple(props)


class Broker:
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
        self.max_memory = int(gw.max_msg_memory)
        self.max_msg_size = int(gw.max_client_msg_size)
        self.memory = 0
        # memory + a message's size past this: the message would take memory past the limit.
        self.memory_cap = self.max_memory - MESSAGE_OVERHEAD
        # Message swapping needs a store that can give bodies back (not the memory store).
        self.swapping = bool(gw.msg_swapping) and bool(getattr(store, "swappable", False))
        limit = self.max_memory
        self.swap_at = int(limit * SWAP_AT) if limit and self.swapping else 1 << 62
        # Pending messages a queue keeps in memory before the ones behind them are swapped.
        self.backlog_swapout = int(gw.destination_backlog_swapout) if self.swapping else 1 << 62
        # Pending messages a durable subscription keeps in memory before the persistent ones
        # after them stay in the store (its tail, see gateway.backlog): at least one, so
        # that a subscription whose consumer keeps up never goes through the store; the tail
        # is read back when fewer than tail_low are pending.
        self.tail_at = max(self.backlog_swapout, 1)
        self.tail_low = max(self.tail_at // 2, 1)
        self.resume_at = int(limit * RESUME_AT)
        self.swap_pending = False  # a swap pass is scheduled
        self.swap_more = False  # the last pass stopped at its budget
        self.next_deep = 0  # memory past which the next deep swap pass may run
        self.swapped = 0  # pending messages whose body is in the store only
        # Confirmations of producers held by the memory limit (flow control).
        self.memory_waiters: list[asyncio.Future[None]] = []
        # Connections whose adapter paused their deliveries because their peer stopped
        # reading (a full write buffer), by id: at the memory limit their non-durable topic
        # subscriptions' non-persistent messages go first (shed_slow).
        self.slow_connections: dict[str, Any] = {}
        # Non-durable subscriptions that passed LAGGARD_MIN pending messages since the last
        # laggard scan looked at them (laggard_seen), in the order they did: what that scan
        # looks at, so that a gateway at its limit with no laggard (everything held durable
        # or on queues) does not walk every connection's subscriptions for each publish it
        # holds or refuses. A dict for its order.
        self.laggards: dict[Subscription, None] = {}
        self.topics: dict[str, Topic] = {}
        self.queues: dict[str, QueueEndpoint] = {}
        self.subs = SubIndex()
        self.durables: dict[str, Subscription] = {}
        # Producer confirmations waiting for a commit, by store id (see _commit_future).
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
        self.connections: dict[str, Any] = {}
        self._conn_ids = itertools.count(1)
        self._msg_seq = itertools.count(1)
        self._temp_seq = itertools.count(1)
        self._msg_prefix = f"ID:{self.name}.{os.getpid():x}{uuid.uuid4().hex[:6]}:"
        self._trace_prefix = f"{self.id}:"
        self._sweeper: asyncio.TimerHandle | None = None
        self.stats = {"rejected": 0, "dropped": 0, "discarded": 0, "expired": 0,
                      "undelivered": 0, "swapped_out": 0, "swapped_in": 0,
                      "memory_held": 0}
        self.published = 0
        self.closed = False
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
        if self.swapping and self.memory:
            self._swap_soon()  # what recovery brought back: backlogs and the limit apply

    def close(self) -> None:
        """Stop timers; the caller flushes the store and the delivery log afterwards."""
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
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
        connection is accepted, whatever it presents, and keeps the name it gave -- unverified,
        a label for ``sender_name`` and the admin API's connection views; no permission is
        checked then (EMS User's Guide, "Enabling Access Control"). With it enabled the name
        and password are checked against ``users.conf`` (EMS User's Guide,
        "Enabling Access Control"), and a client without a name connects only with
        ``allow_anonymous`` enabled.

        Raises:
            SecurityError: with ``authorization`` enabled, an unknown user or a wrong
                password ("authentication failed"), or no user name while ``allow_anonymous``
                is disabled ("anonymous connections are not allowed").
        """
        if not user:
            if not self.anonymous_allowed():
                raise SecurityError("anonymous connections are not allowed")
            return None
        if self.authorization and not self.config.security.authenticate(user, password or ""):
            raise SecurityError(f"authentication failed for user {user!r}")
        return user

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
        client-certificate check) already verified ``user``.

        Raises:
            SecurityError: bad credentials, or anonymous access not allowed.
            IllegalStateError: the client id is already connected.
            LimitExceededError: ``max_connections`` reached.
        """
        from gateway.client import Connection

        if not authenticated:
            user = self.authenticate(user, password)
        max_conn = int(self.config.gateway.max_connections)
        if max_conn and len(self.connections) >= max_conn:
            raise LimitExceededError(f"max_connections ({max_conn}) reached")
        if client_id is not None:
            for c in self.connections.values():
                if c.client_id == client_id:
                    raise IllegalStateError(f"client id {client_id!r} is already connected")
        cid = f"{self.name}:{next(self._conn_ids)}"
        conn = Connection(self, cid, client_id=client_id, user=user, kind=kind, protocol=protocol,
                          address=address)
        self.connections[cid] = conn
        return conn

    def disconnected(self, conn: Any) -> None:
        self.connections.pop(conn.id, None)
        self.slow_connections.pop(conn.id, None)
        for name in list(conn.temp_queues):
            self.delete_temporary(Destination.queue(name))
        for name in list(conn.temp_topics):
            self.delete_temporary(Destination.topic(name))

    # -- destinations ---------------------------------------------------------------------

    def topic(self, name: str, *, create: bool = True) -> Topic:
        """The topic ``name``, created if its name matches a topics.conf entry.

        Raises:
            InvalidDestinationError: bad name, wildcard, or creation not allowed
            (EMS User's Guide, "Wildcards in Topics").
        """
        t = self.topics.get(name)
        if t is not None:
            return t
        system = name.startswith("$")
        subject.validate(name, system=system)
        if name.startswith(TEMP_PREFIX):
            raise InvalidDestinationError(f"temporary topic {name!r} does not exist")
        props = self.config.topics.resolve(name)
        if props is None or not create:
            raise InvalidDestinationError(
                f"topic {name!r} does not exist and no topics.conf entry allows creating it"
            )
        t = Topic(name, props, static=self.config.topics.is_static(name))
        self.topics[name] = t
        return t

    def queue(self, name: str, *, create: bool = True) -> QueueEndpoint:
        """The queue ``name``, created if its name matches a queues.conf entry
        (EMS User's Guide, "Wildcards in Queues")."""
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
        return self._ensure_queue(name, props=props)

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
                q.closed = True
                q.purge()
                if q.owner is not None:
                    q.owner.temp_queues.discard(dest.name)
        else:
            t = self.topics.pop(dest.name, None)
            if t is not None and t.owner is not None:
                t.owner.temp_topics.discard(dest.name)

    def resolve_for_send(self, dest: Destination) -> Topic | QueueEndpoint:
        if dest.kind == TOPIC:
            return self.topic(dest.name)
        return self.queue(dest.name)

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
                target = self.queues.get(dest.name) or self.queue(dest.name)
            if target.simple:
                if msg.expiration:
                    msg.expires_at = msg.expiration
            else:
                self._apply_props(msg, conn, dest, target.props, now)
            self.published += 1
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
                    self.dlog.record("publish", msg, text, conn.id if conn else None)
                else:
                    self.dlog.record("import", msg, text, conn.log_id, 0,
                                     None, (None, far[0], far[1], None))
            if is_topic:
                fut = self._route_topic(target, msg, now)  # type: ignore[arg-type]
            else:
                fut = self._route_queue(target, msg, now)  # type: ignore[arg-type]
            if held:
                return self._hold_for_memory(fut)
            return fut
        except (InvalidDestinationError, SecurityError, LimitExceededError) as exc:
            self.stats["rejected"] += 1
            if self.log_enabled:
                self.dlog.record("reject", msg, str(msg.destination),
                                 conn.log_id if conn else None, 0, exc.reason)
            if msg.delivery_mode == RELIABLE:
                return None
            raise

    def _apply_props(self, msg: Message, conn: Any, dest: Destination, props: Any,
                     now: int) -> None:
        """Security, sender name, expiration override and tracing (EMS User's Guide,
        "Destination Properties")."""
        if conn is not None:
            if conn.kind == "CLIENT" and self.authorization and props is not None and props.secure:
                self.check(conn, "topic" if dest.kind == TOPIC else "queue", dest.name,
                           "publish" if dest.kind == TOPIC else "send", props)
            if props is not None and (props.sender_name or props.sender_name_enforced):
                if props.sender_name_enforced or not msg.properties.get(PROP_DISABLE_SENDER):
                    msg.properties[PROP_SENDER] = conn.user or "anonymous"
        override = props.expiration_ms if props is not None else None
        if override is not None:
            # The destination's expiration wins; consumers see JMSExpiration 0
            # (EMS User's Guide, "Destination Properties", expiration).
            msg.expires_at = now + override if override else 0
            msg.expiration = 0
        elif msg.expiration:
            msg.expires_at = msg.expiration
        if props is not None and props.trace:
            trace_log.info("received %s on %s from %s", msg.message_id, dest,
                           conn.id if conn else "-")

    def _route_topic(self, topic: Topic, msg: Message, now: int) -> asyncio.Future[None] | None:
        topic.stats_in += 1
        subs = self.subs.match(topic.name)
        if not subs:
            if self.log_enabled:
                self.dlog.record("drop", msg, topic.dest_text, None, 0, "no_subscribers")
            return None
        props = topic.props
        maxmsgs = props.maxmsgs
        maxbytes = props.maxbytes
        limited = maxmsgs or maxbytes
        policy = props.overflow_policy.name if limited else "DEFAULT"
        if policy == "DEFAULT" and limited and msg.delivery_time > now:
            # With delivery delay a topic's default policy behaves like a queue
            # (EMS User's Guide, "Destination Properties", overflowPolicy).
            policy = "REJECT_INCOMING"
        if policy == "REJECT_INCOMING":
            for s in subs:
                if _over(s, msg, maxmsgs, maxbytes):  # type: ignore[arg-type]
                    raise LimitExceededError(
                        f"topic {topic.name!r}: a subscriber is at its limit (rejectIncoming)"
                    )
        if self.spools:
            for s in subs:
                bounded: Subscription = s  # type: ignore[assignment]
                spool = bounded.spool
                if spool is not None and not spool[2] and _over(bounded, msg, spool[0], spool[1]):
                    raise LimitExceededError(
                        f"topic {topic.name!r}: the export spool {bounded.key!r} is full")
        persistent = msg.delivery_mode == PERSISTENT
        if persistent and props.overflow_policy.name == "REJECT_INCOMING":
            for s in subs:
                b: Subscription = s  # type: ignore[assignment]
                if (b.bound is not None and not b.bound[2] and _over_bound(b, msg, b.bound)
                        and (not (b.no_local or b.selector is not None) or b.accepts(msg))):
                    raise LimitExceededError(
                        f"topic {topic.name!r}: a subscriber's queue is full (rejectIncoming)")
        stored = False
        tailed = False  # a durable subscription left it in the store only
        store = self.store
        flow_limit = props.flow_control_bytes if self.flow_control else 0
        blocked: Subscription | None = None
        for s in subs:
            sub: Subscription = s  # type: ignore[assignment]
            if (sub.no_local or sub.selector is not None) and not sub.accepts(msg):
                continue
            bound = sub.bound
            if bound is not None and (sub.npending or sub.held or sub.tail or bound[1]) and (
                    _over_bound(sub, msg, bound)):
                # An adapter's per-subscriber bound (a slow MQTT session): never holds up the
                # topic's other subscribers unless the topic says rejectIncoming.
                if (persistent and not bound[2]
                        and props.overflow_policy.name == "DISCARD_OLD"):
                    while _over_bound(sub, msg, bound) and sub.discard_oldest():
                        pass
                if _over_bound(sub, msg, bound):
                    sub.dropped += 1
                    self.stats["dropped"] += 1
                    if self.log_enabled:  # the subscriber's connection, when it has one
                        consumers = sub.consumers
                        self.dlog.record("drop", msg, topic.dest_text,
                                         consumers[0].session.connection.id if consumers
                                         else None, 0, "max_queued")
                    continue
            if limited and _over(sub, msg, maxmsgs, maxbytes):
                if policy == "DISCARD_OLD":
                    while _over(sub, msg, maxmsgs, maxbytes) and sub.discard_oldest():
                        pass
                else:
                    # default: this subscriber misses the message; others get it
                    # (EMS User's Guide, "Destination Properties", overflowPolicy).
                    sub.dropped += 1
                    self.stats["dropped"] += 1
                    if self.log_enabled:
                        self.dlog.record("drop", msg, topic.dest_text, None, 0, "exceeded")
                    continue
            if persistent and sub.durable:
                if not msg.store_id:
                    store.put_message(msg)
                store.add_entry(sub.key, msg.store_id, 0)
                stored = True
                if sub.tail or sub.npending >= self.tail_at or self.memory > self.swap_at:
                    # Its backlog is deep, or memory short: the store keeps it (the tail,
                    # see gateway.backlog); the backlog and the limits both are off
                    # without swapping.
                    sub.put_tail(msg)
                    tailed = True
                else:
                    msg.refs += 1
                    self.memory += msg.size + MESSAGE_OVERHEAD
                    sub.put(msg, now)
            else:
                self.memory += msg.size + MESSAGE_OVERHEAD
                sub.put(msg, now)
            if flow_limit and sub.bytes >= flow_limit and sub.consumers:
                # Flow control on a topic holds the producer while a subscriber lags
                # (EMS User's Guide, "Flow Control", "Enforcing Flow Control").
                sub.flow_limit = flow_limit
                blocked = sub
            spool = sub.spool
            if spool is not None and spool[2] and (
                    (spool[0] and sub.count >= spool[0]) or (spool[1] and sub.bytes >= spool[1])):
                # A full export spool with the block policy holds the producer the same way.
                sub.flow_limit = spool[1] or 1 << 62
                sub.flow_msgs = spool[0] or 1 << 62
                blocked = sub
        # A listener may have consumed every stored copy already (dispatch is synchronous):
        # then there is nothing left to wait for (see _commit_future) -- unless a tail holds
        # a copy, which only the commit makes durable.
        if tailed:
            fut: asyncio.Future[None] | None = self._commit_future(msg.store_id, early=False)
        else:
            fut = self._commit_future(msg.store_id) if stored and msg.refs > 0 else None
        if blocked is not None:
            flow: asyncio.Future[None] = self.loop.create_future()
            blocked.flow_waiters.append(flow)
            return flow if fut is None else _both(self.loop, fut, flow)
        return fut

    def _route_queue(self, q: QueueEndpoint, msg: Message, now: int) -> asyncio.Future[None] | None:
        props = q.props
        if props.maxmsgs or props.maxbytes:
            if _over(q, msg, props.maxmsgs, props.maxbytes):
                if props.overflow_policy.name == "DISCARD_OLD":
                    while _over(q, msg, props.maxmsgs, props.maxbytes) and q.discard_oldest():
                        pass
                else:
                    raise LimitExceededError(
                        f"queue {q.name!r} is full (maxmsgs={props.maxmsgs}, "
                        f"maxbytes={props.maxbytes})"
                    )
        fut: asyncio.Future[None] | None = None
        if msg.delivery_mode == PERSISTENT:
            store = self.store
            if not q.stored:
                store.put_endpoint(q.key, {"type": "queue", "name": q.name})
                q.stored = True
            if not msg.store_id:
                store.put_message(msg)
            msg.refs += 1
            store.add_entry(q.key, msg.store_id, 0)
            fut = self._commit_future(msg.store_id)
            q.fresh += 1
            self.memory += msg.size + MESSAGE_OVERHEAD
            q.put(msg, now)
            # Only a queue's persistent messages can be swapped: the trigger is here alone (at
            # the limit _memory_full swaps whatever the message).
            if ((q.npending - q.swapped > self.backlog_swapout or self.memory > self.swap_at)
                    and not self.swap_pending):
                self._swap_soon()
        else:
            self.memory += msg.size + MESSAGE_OVERHEAD
            q.put(msg, now)
        if q.flow_limit and q.bytes >= q.flow_limit and q.consumers:
            flow = self.loop.create_future()
            q.flow_waiters.append(flow)
            if fut is None:
                return flow
            return _both(self.loop, fut, flow)
        return fut

    def _commit_future(self, store_id: int, early: bool = True) -> asyncio.Future[None]:
        """The producer's confirmation of stored message ``store_id``: resolved by the group
        commit, or (``early``) earlier by :meth:`unstore` when its last stored copy is
        acknowledged."""
        fut: asyncio.Future[None] = self.loop.create_future()
        confirming = self.confirming
        if early:
            confirming[store_id] = fut

        def done() -> None:
            if confirming.get(store_id) is fut:
                del confirming[store_id]
            if not fut.done():
                fut.set_result(None)

        def failed(exc: BaseException) -> None:
            if confirming.get(store_id) is fut:
                del confirming[store_id]
            if not fut.done():
                fut.set_exception(exc)

        self.store.commit(done, failed)
        return fut

    def release_flow(self, ep: Endpoint) -> None:
        waiters, ep.flow_waiters = ep.flow_waiters, []
        for f in waiters:
            if not f.done():
                f.set_result(None)

    # -- memory (max_msg_memory) ------------------------------------------------------------

    def _memory_full(self, msg: Message) -> bool:
        """``msg`` would take memory past ``max_msg_memory``: swap now if that can help;
        returns True to accept it and hold its producer (flow control, RELIABLE aside), and
        False to accept it as it is: there is room now, or it is a persistent topic message
        that only durable subscriptions take, each into its tail (no memory).

        Raises:
            LimitExceededError: flow control is off (EMS User's Guide, "tibemsd.conf",
            max_msg_memory: sends fail).
        """
        need = msg.size + MESSAGE_OVERHEAD
        if self.swapping:
            self.swap_out()
            if self.memory + need > self.max_memory and self.memory >= self.next_deep:
                # What earlier passes left (the fronts of queues): at most once for every
                # sixteenth of the limit that memory grows by, so a full gateway does not
                # walk every queue for every message it refuses.
                self.swap_out(deep=True)
                self.next_deep = self.memory + self.max_memory // 16
            if self.memory + need <= self.max_memory:
                return False
            if msg.delivery_mode == PERSISTENT and self.memory > self.swap_at:
                dest = msg.destination
                if dest is not None and dest.kind is TOPIC:
                    subs = self.subs.match(dest.name)
                    if subs and all(s.durable for s in subs):  # type: ignore[attr-defined]
                        # Every copy stays in the store (each durable subscription's tail,
                        # memory being past SWAP_AT): it costs no memory.
                        return False
        if self.slow_connections:
            # Slow consumers pay first: down to RESUME_AT, so that this runs once for every
            # tenth of the limit memory grows by, not for every message.
            self.shed_slow(self.memory + need - self.resume_at)
            if self.memory + need <= self.max_memory:
                return False
        # Then the laggards, deepest first, down to RESUME_AT as above.
        self.shed_laggards(self.memory + need - self.resume_at)
        if self.memory + need <= self.max_memory:
            return False
        if not self.flow_control or msg.delivery_mode == RELIABLE:
            raise LimitExceededError(
                f"server message memory limit reached (max_msg_memory={self.max_memory})")
        return True

    def connection_slow(self, conn_id: str | None, slow: bool) -> None:
        """An adapter paused (``slow``) or resumed a connection's deliveries for its write
        buffer: its peer stopped reading, or reads again."""
        if conn_id is None:
            return
        if slow:
            conn = self.connections.get(conn_id)
            if conn is not None:
                self.slow_connections[conn_id] = conn
        else:
            self.slow_connections.pop(conn_id, None)

    def shed_slow(self, want: int) -> int:
        """Free ``want`` bytes of memory, if they are there, by dropping the NON_PERSISTENT
        messages pending on the non-durable topic subscriptions of slow connections, oldest
        first, so that one client that stopped reading does not stop every producer.
        Persistent messages and durable subscriptions are left alone. Returns bytes freed."""
        freed = 0
        slow = self.slow_connections
        for conn in list(slow.values()):
            if freed >= want:
                break
            for sub in conn.subscriptions:
                if sub.npending and not sub.durable and freed < want:
                    freed += sub.shed(want - freed, conn.id)
            # The next batch starts with another slow connection.
            slow[conn.id] = slow.pop(conn.id)
        return freed

    def charge_transactional(self, msg: Message) -> int:
        """Charge a send waiting in an open transaction to memory; returns the charge, to
        give back with :meth:`release_transactional` at commit or rollback. Past the limit
        room is made as for a publish (swapping, slow consumers, laggards); a send that still
        does not fit is refused, flow control or not: a transacted send is answered at once,
        so there is no producer confirmation to hold.

        Raises:
            LimitExceededError: no room under ``max_msg_memory``.
        """
        need = msg.size + MESSAGE_OVERHEAD
        if self.max_memory and self.memory + msg.size > self.memory_cap:
            try:
                fits = not self._memory_full(msg)
            except LimitExceededError:
                fits = False
            if not fits:
                exc = LimitExceededError(
                    "server message memory limit reached by sends in open transactions "
                    f"(max_msg_memory={self.max_memory})")
                self.stats["rejected"] += 1
                if self.log_enabled:
                    self.dlog.record("reject", msg, str(msg.destination), msg.producer_conn,
                                     0, exc.reason)
                raise exc
        self.memory += need
        return need

    def release_transactional(self, charged: int) -> None:
        """A transaction ended: what its sends were charged comes back."""
        self.memory -= charged
        if self.memory_waiters and self.memory <= self.resume_at:
            self.release_memory()

    def shed_laggards(self, want: int) -> int:
        """Free ``want`` bytes of memory, if they are there, by dropping the oldest messages
        pending on non-durable topic subscriptions that hold at least :data:`LAGGARD_MIN`
        (their consumers take nothing now: a full window, or paused), deepest first, each
        down to :data:`LAGGARD_MIN` at most; any delivery mode, since nothing pending on a
        non-durable subscription is in the store. A transport's export subscription is left
        alone. Each drop is logged and counted (reason ``slow_consumer``). Returns bytes
        freed."""
        if not self.laggards:
            return 0
        # Only the subscriptions that passed LAGGARD_MIN since the last scan, or were past it
        # then (see laggard_seen); those now at or under it leave, until they pass it again.
        # Not a transport's export subscription (``spool``): what waits there is on its way
        # across a bridge and has the spool's own bound and policy.
        laggards = [sub for sub in self.laggards
                    if sub.npending > LAGGARD_MIN and sub.spool is None and not sub.closed]
        self.laggards = {sub: None for sub in laggards}
        laggards.sort(key=lambda sub: sub.bytes, reverse=True)
        freed = 0
        for sub in laggards:
            if freed >= want:
                break
            owner = sub.owner
            freed += sub.shed(want - freed, owner.id if owner is not None else None,
                              keep=LAGGARD_MIN, persistent=True)
        return freed

    def laggard_seen(self, ep: Endpoint) -> None:
        """``ep`` (a non-durable topic subscription, whose ``laggard_at`` is LAGGARD_MIN + 1)
        just passed LAGGARD_MIN pending messages: the next laggard scan looks at it. Pending
        counts only ever grow by one, so none passes the mark unseen."""
        if isinstance(ep, Subscription):
            self.laggards[ep] = None

    def _hold_for_memory(self, fut: asyncio.Future[None] | None) -> asyncio.Future[None]:
        """The producer's confirmation, held until memory is under RESUME_AT of the limit."""
        self.stats["memory_held"] += 1
        if self.memory <= self.resume_at:  # drained already (a fast consumer)
            return fut if fut is not None else _done(self.loop)
        flow: asyncio.Future[None] = self.loop.create_future()
        self.memory_waiters.append(flow)
        return flow if fut is None else _both(self.loop, fut, flow)

    def release_memory(self) -> None:
        """Memory is under RESUME_AT of the limit: confirm the held producers."""
        self.next_deep = 0
        waiters, self.memory_waiters = self.memory_waiters, []
        for f in waiters:
            if not f.done():
                f.set_result(None)

    def _swap_soon(self) -> None:
        if not self.swap_pending:
            self.swap_pending = True
            self.loop.call_soon(self._swap_pass)

    def _swap_pass(self) -> None:
        self.swap_pending = False
        if self.closed:
            return
        self.swap_out()
        if self.swap_more:
            self._swap_soon()  # more to do: after other work on the loop

    def swap_out(self, deep: bool = False) -> int:
        """Swap pending persistent queue messages out (EMS ``msg_swapping``, EMS User's Guide,
        "tibemsd.conf", Connection and Memory Parameters): each queue's messages behind its
        first ``destination_backlog_swapout``, and, while memory is past SWAP_AT of the limit,
        more from the deepest queues until it is down to SWAP_TO; looks at no more than
        SWAP_BUDGET messages. Returns the bytes freed.

        A pass looks only at queues that got persistent messages since the last one, from
        their back; a ``deep`` pass (at the limit, see :meth:`_memory_full`) looks at every
        pending message of every queue."""
        if not self.swapping:
            return 0
        want = 0
        if self.memory > self.swap_at or deep:
            want = self.memory - int(self.max_memory * SWAP_TO)
        backlog = self.backlog_swapout
        budget = SWAP_BUDGET
        freed = 0
        if deep:
            queues = [q for q in self.queues.values() if q.npending > q.swapped]
        else:
            queues = [q for q in self.queues.values() if q.fresh]
        queues.sort(key=_depth, reverse=True)
        for q in queues:
            if budget <= 0:
                break
            over = q.npending - q.swapped - backlog
            if freed >= want and over <= 0:
                q.fresh = 0  # nothing to do here until more arrives
                continue
            got, seen = swap_out(q, want - freed, over, budget, deep)
            freed += got
            budget -= seen
        self.swap_more = budget <= 0
        if self.memory_waiters and self.memory <= self.resume_at:
            self.release_memory()
        return freed

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
        (EMS User's Guide, "Undelivered Message Queue")."""
        if reason == "expired":
            self.stats["expired"] += 1
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
        if conn.kind == "CLIENT" and self.authorization:
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


def is_simple(props: Any) -> bool:
    """True when a destination's properties ask for no per-message work on publish
    (no security check, sender name, expiration override or tracing)."""
    return props is None or not (
        props.secure or props.sender_name or props.sender_name_enforced
        or props.expiration_ms is not None or props.trace
    )


def _over(ep: Endpoint, msg: Message, maxmsgs: int, maxbytes: int) -> bool:
    return bool((maxmsgs and ep.count >= maxmsgs) or (maxbytes and ep.bytes + msg.size > maxbytes))


def _over_bound(sub: Subscription, msg: Message, bound: tuple[int, int, bool]) -> bool:
    """Past an adapter's bound: messages queued beyond the in-flight ones (pending, in the
    store's tail and held), or bytes held (queued and in flight)."""
    return bool((bound[0] and sub.npending + sub.tail + len(sub.held) >= bound[0])
                or (bound[1] and sub.bytes + msg.size > bound[1]))


def _depth(q: QueueEndpoint) -> int:
    return q.bytes


def _done(loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
    f: asyncio.Future[None] = loop.create_future()
    f.set_result(None)
    return f


def _both(loop: asyncio.AbstractEventLoop, a: asyncio.Future[None],
          b: asyncio.Future[None]) -> asyncio.Future[None]:
    out: asyncio.Future[None] = loop.create_future()

    def check(_: Any) -> None:
        if out.done():
            return
        for f in (a, b):
            if f.done() and f.exception() is not None:
                out.set_exception(f.exception())  # type: ignore[arg-type]
                return
        if a.done() and b.done():
            out.set_result(None)

    a.add_done_callback(check)
    b.add_done_callback(check)
    return out
