"""A node's link to the cluster: topic messages across gateway nodes through NATS.

Why NATS, and nats-py: a cluster needs messages routed between processes by interest and a
replicated store for what must outlive a node. NATS servers do the first among themselves
(subscription interest propagates over their routes, so a message reaches only the servers
with a subscriber), and JetStream does the second; nats-py is the project's own asyncio
client. Writing either here would be a second broker inside the first.

How topics cross nodes. For a cluster named ``C``:

* Every message published on this node to a topic is also published on the NATS subject
  ``gw.C.t.<topic>``, once, after the local subscriptions have it; its payload is the store's
  binary encoding (:mod:`gateway.serial`: every header, typed property and body kind, so
  nothing is lost on the way); the link's NATS connection asks for none of its own messages
  back (``no_echo``). Topics whose
  names start with ``$`` (``$sys.monitor...``, temporary topics) stay on their node.
* The node subscribes in NATS to the topics its own subscriptions name (EMS's wildcards
  ``*`` and ``>`` are NATS's), as the transports follow local subscriptions: only the
  patterns no other one contains (``a.>`` covers ``a.b``), so that a subject reaches the
  node once. NATS forwards a message to a server only when one of its clients subscribes,
  so a node receives only what it has local interest in.
* What arrives is published into the local broker on the link's own connection (kind
  ``CLUSTER``), which the broker never sends back to the cluster; a message that arrives
  twice (two covering patterns overlap, ``a.*`` and ``*.b``, or a broader pattern replaced
  narrower ones) is dropped by its message id, remembered for the last :data:`SEEN_WINDOW`
  messages.
* Order: NATS keeps one connection's messages in order to each subscriber, and each
  subscription's callback runs them in that order, so a subscriber sees one producer's
  messages to one topic in the order they were published (what JMS and MQTT promise);
  messages of one producer to two topics may arrive interleaved differently.

A client id is one client in the cluster. A CONNECT that resumes an MQTT session another
node holds (the shared session record names it) waits for that node to hand it over
(:meth:`ClusterLink.hand_over`, a request on ``gw.C.handover.<node>``): that node takes over
its connection as a second CONNECT would on one node (DISCONNECT 0x8E, "Session taken over",
MQTT 5.0 3.1.4, [MQTT-3.1.4-3]), publishes its will there, once, and answers with the
session's state, what it had in flight included. A node where an MQTT client connects also
tells the others on ``gw.C.clients.mqtt``, and one with a connection of that client id takes
it over. A JMS client id is claimed in the shared records (``clients.jms``): one connection
in the cluster.

What a node receives from another is delivered as the local broker delivers; persistent
messages for durable subscriptions and queues come from JetStream (:mod:`cluster.feeds`).
A non-persistent message in flight through NATS when a node dies is lost to the nodes that
had not received it (NATS core delivers at most once).

Views and actions: a node answers requests on ``gw.C.views.<name>`` with its
:attr:`Core.local_views` (the admin API's per-node rows) and on ``gw.C.actions.<name>`` by
running :attr:`Core.local_actions` (a queue's purge on every node).

The link runs on the gateway's loop; nats-py's calls are coroutines, so what the broker's
synchronous publish path hands over (:meth:`ClusterLink.forward`) is queued and published
by one task per loop turn.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from typing import Any

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as NatsSubscription

from cluster.feeds import Feeds
from cluster.leases import Leases
from cluster.members import Members
from cluster.records import SharedRecords
from gateway import subject
from gateway.errors import GatewayError, MessageFormatError
from gateway.facade import Core
from gateway.message import TOPIC, DeliveryMode, Message
from gateway.serial import decode_message, encode_message

log = logging.getLogger("cluster")

# what a node's heartbeat tells of it (the names of GET /api/v1/server)
FIGURES = ("connections", "topics", "queues", "durables", "subscriptions", "memory",
           "published")
SEEN_WINDOW = 10_000  # message ids remembered to drop a second copy
CONNECT_TIMEOUT = 5.0  # seconds for each attempt to reach a NATS server
RECONNECT_WAIT = 0.5  # seconds between reconnection attempts (nats-py's reconnect_time_wait)
CLOSE_WAIT = 5.0  # seconds a closing link waits for the sends under way
VIEW_WAIT = 2.0  # seconds a view of every node waits for the nodes' answers
STORE_POLL = 5.0  # seconds between reads of what JetStream keeps (for /metrics)
CLIENTS_NS = "clients.jms"  # shared records: JMS client id -> the node it is connected to
COVER_MAX = 1000  # most NATS patterns a heartbeat lists (see _figures)
READY_WAIT = 2.0  # most seconds a subscription's answer waits for the cluster (ready)
HANDOVER_WAIT = 3.0  # seconds a CONNECT waits for the node that held the session to let go
JOIN_TIMEOUT = 10.0  # seconds for the first connection, at start, before giving up
PING_INTERVAL = 2.0  # seconds between pings to the NATS server (a silent one is lost after
MAX_PINGS_OUT = 2    # this many unanswered)


class ClusterLink:
    """This node's side of the cluster: see the module docstring."""

    def __init__(self, broker: Core, servers: tuple[str, ...], cluster_name: str,
                 node_id: str, *, replicas: int = 3, ack_wait: float = 30.0) -> None:
        self.broker = broker
        self.replicas = replicas
        self.ack_wait = ack_wait
        self.feeds: Feeds | None = None
        self.records: SharedRecords | None = None
        self.leases: Leases | None = None
        self.servers = servers
        self.node_id = node_id
        self.cluster_name = cluster_name
        self.prefix = f"gw.{cluster_name}.t."
        self.members: Members | None = None
        self.nc: NATS | None = None
        self.conn: Any = None
        self.session: Any = None
        self.patterns: dict[str, int] = {}  # local subscription patterns and their counts
        self.cover: dict[str, NatsSubscription | None] = {}  # patterns subscribed in NATS
        self.wild: dict[str, None] = {}  # those of them with wildcards
        # the cover's changes for NATS, in order, and markers (futures) done when what was
        # queued before them is in NATS (see ready)
        self.ops: asyncio.Queue[tuple[bool, str] | asyncio.Future[None]] = asyncio.Queue()
        self.cover_changed = False  # since the last marker
        self.cover_mark: asyncio.Future[None] | None = None
        self.told_mark: asyncio.Future[Any] | None = None  # the other nodes told of durables
        self.outbox: list[tuple[str, bytes]] = []
        self.sending = False
        self.seen: OrderedDict[str, None] = OrderedDict()
        self.tasks: list[asyncio.Task[None]] = []  # sends and notices under way
        self.op_task: asyncio.Task[None] | None = None
        self.closing = False
        self.arriving = False  # a message from another node is being published here
        self.claimed: set[str] = set()  # JMS client ids connected here (claim_client)
        # what JetStream keeps for the cluster, as of the last poll (store_view), for /metrics
        self.store_figures: dict[str, Any] | None = None
        self.poller: asyncio.Task[None] | None = None
        self.wanted: dict[str, bool] = {}  # topic -> wanted_elsewhere's answer
        self.wanted_version = -1
        self.remote: set[str] = set()
        self.stats = {"forwarded": 0, "received": 0, "duplicates": 0, "undecodable": 0,
                      "publish_errors": 0}

    # -- life cycle ---------------------------------------------------------------------

    async def start(self) -> None:
        # Once joined, a node reconnects for ever (max_reconnect_attempts=-1), which nats-py
        # applies to the first connection too: that one is bounded here instead.
        self.nc = await asyncio.wait_for(nats.connect(
            servers=list(self.servers), name=f"gateway {self.node_id}",
            connect_timeout=CONNECT_TIMEOUT, reconnect_time_wait=RECONNECT_WAIT,
            max_reconnect_attempts=-1, allow_reconnect=True, no_echo=True,
            ping_interval=PING_INTERVAL, max_outstanding_pings=MAX_PINGS_OUT,
            error_cb=self._error, disconnected_cb=self._disconnected,
            reconnected_cb=self._reconnected), JOIN_TIMEOUT)
        self.feeds = Feeds(self.broker, self.nc, self.cluster_name, self.replicas,
                           self.ack_wait)
        await self.feeds.start()
        self.records = SharedRecords(self.feeds.js, self.cluster_name, self.replicas,
                                     self.node_id, self.broker.shared_changed)
        await self.records.start()
        self.leases = Leases(self.feeds.js, self.cluster_name, self.replicas, self.node_id,
                             self.broker.loop)
        await self.leases.start()
        self.feeds.leases = self.leases
        self.conn = self.broker.connect(client_id=None, kind="CLUSTER", protocol="cluster",
                                        address=f"cluster:{self.node_id}", authenticated=True)
        self.session = self.conn.session()
        self.op_task = asyncio.ensure_future(self._apply_ops())
        for sub in self.broker.all_subscriptions():
            self._subscription_changed(sub, True)
        self.broker.watch_subscriptions(self._subscription_changed)
        self.members = Members(self.nc, self.cluster_name, self.node_id, self._figures)
        await self.members.start()
        await self.nc.subscribe(f"gw.{self.cluster_name}.clients.*", cb=self._client_elsewhere)
        await self.nc.subscribe(f"gw.{self.cluster_name}.views.*", cb=self._asked)
        await self.nc.subscribe(f"gw.{self.cluster_name}.actions.*", cb=self._asked)
        await self.nc.subscribe(f"gw.{self.cluster_name}.handover.{self.node_id}",
                                cb=self._handover_asked)
        self.broker.local_actions["purge-queue"] = self._purge_here
        self.broker.local_actions["durables"] = self._durables_made_elsewhere
        self.broker.cluster = self
        self.broker.info_sources.append(self._info_source)
        self.broker.watch_shared(CLIENTS_NS, self._claim_changed)
        self.poller = asyncio.ensure_future(self._poll_store())
        log.info("node %s joined through %s", self.node_id, ", ".join(self.servers))

    async def close(self) -> None:
        self.closing = True
        broker = self.broker
        if broker.cluster is self:
            broker.cluster = None
        if self._info_source in broker.info_sources:
            broker.info_sources.remove(self._info_source)
        broker.watch_subscriptions(self._subscription_changed, on=False)
        if self.members is not None:
            await self.members.close()
        if self.leases is not None:
            await self.leases.close()
        if self.records is not None:
            await self.records.close()
        if self.feeds is not None:
            await self.feeds.close()
        if self.tasks:  # the sends under way finish first, so that order is kept
            await asyncio.wait(self.tasks, timeout=CLOSE_WAIT)
        if self.outbox and self.nc is not None and self.nc.is_connected:
            await self._send()
        for t in [*self.tasks, self.op_task, self.poller]:
            if t is not None and not t.done():
                t.cancel()
                try:
                    await t
                except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                    pass
        if self.nc is not None:
            try:
                await self.nc.drain()
            except Exception:  # noqa: BLE001 - the servers may be gone
                await self.nc.close()
        if self.conn is not None:
            self.conn.close()

    @property
    def down(self) -> bool:
        """No NATS server is reachable now: persistent messages are refused
        (``Broker.publish``)."""
        nc = self.nc
        return nc is None or not nc.is_connected

    async def _error(self, exc: Exception) -> None:
        log.warning("NATS: %s", exc)

    async def _disconnected(self) -> None:
        if not self.closing:
            log.warning("node %s lost its NATS server; reconnecting", self.node_id)

    async def _reconnected(self) -> None:
        url = self.nc.connected_url if self.nc is not None else None
        log.info("node %s reconnected to %s", self.node_id,
                 url.netloc if url is not None else "?")

    # -- out: local publishes to the cluster ----------------------------------------------

    def forward(self, msg: Message) -> asyncio.Future[None] | None:
        """A message published on this node to a topic (called by the broker's publish,
        after local routing; never for what this link itself published). For a persistent
        one that durable subscriptions want, what its producer's confirmation waits for:
        JetStream keeping it for them (:mod:`cluster.feeds`)."""
        dest = msg.destination
        if dest is None or dest.kind is not TOPIC or dest.name.startswith("$"):
            return None
        try:
            payload = encode_message(msg)
        except MessageFormatError as exc:
            log.warning("%s not forwarded: %s", msg.message_id, exc)
            return None
        self.outbox.append((self.prefix + dest.name, payload))
        if not self.sending:
            self.sending = True
            self.broker.loop.call_soon(self._send_soon)
        feeds = self.feeds
        if (msg.delivery_mode == DeliveryMode.PERSISTENT and feeds is not None
                and feeds.durables.wants(dest.name)):
            return feeds.store_for_durables(dest.name, msg)
        return None

    def ready(self) -> asyncio.Future[None] | None:
        """A future done once the subscriptions made on this node so far are the cluster's:
        the NATS subscriptions that follow them sent to this node's NATS server and answered
        (a PING's PONG: the server has passed the interest on to the others), and the
        durable ones made in JetStream, written to the durables bucket, and known to every
        other node that is up (told, and each one's answer waited for).
        None when nothing is pending. An adapter answers a subscription (SUBACK, RECEIPT, an
        AMQP attach) when it is done, so that a message published on another node right
        after reaches it; done after :data:`READY_WAIT` whatever (NATS out of reach)."""
        if self.cover_changed:
            self.cover_changed = False
            self.cover_mark = self.broker.loop.create_future()
            self.ops.put_nowait(self.cover_mark)
        marks = [m for m in (self.cover_mark,
                             self.feeds.mark() if self.feeds is not None else None,
                             self.told_mark)
                 if m is not None and not m.done()]
        feeds = self.feeds
        if feeds is not None and feeds.fresh:
            fresh, feeds.fresh = feeds.fresh, []
            records = {c: (feeds.durables.record(c) or b"").decode() for c in fresh}
            self.told_mark = asyncio.ensure_future(self._ask_all(
                "actions.durables", json.dumps(records).encode(), None))
            marks.append(self.told_mark)
        if not marks:
            return None
        loop = self.broker.loop
        out: asyncio.Future[None] = loop.create_future()

        def done(_: Any = None) -> None:
            if not out.done() and all(m.done() for m in marks):
                out.set_result(None)

        for m in marks:
            m.add_done_callback(done)
        loop.call_later(READY_WAIT, lambda: None if out.done() else out.set_result(None))
        return out

    def forget_durable(self, key: str) -> None:
        """See :meth:`cluster.feeds.Feeds.forget_durable`."""
        if self.feeds is not None:
            self.feeds.forget_durable(key)

    # -- leases (cluster.leases) ------------------------------------------------------------

    def hold_lease(self, name: str, acquired: Any, lost: Any) -> None:
        """Run ``acquired()`` while this node holds lease ``name``, ``lost()`` when it
        stops holding it (a transport runs on one node at a time)."""
        if self.leases is not None:
            self.leases.hold(name, acquired, lost)

    def holds_lease(self, name: str) -> bool:
        return self.leases is not None and self.leases.holds(name)

    async def lease_holder(self, name: str) -> str | None:
        """The node that holds lease ``name`` (None: nobody)."""
        return await self.leases.holder(name) if self.leases is not None else None

    # -- JMS client ids (one connection per client id in the cluster) ---------------------

    def claim_client(self, client_id: str, connected: bool) -> None:
        """A JMS client id connected here (or left): recorded for the other nodes, unless
        another node's record of it is there (and then not deleted either)."""
        records = self.records
        if records is None:
            return
        if connected:  # a claim: a node that connected it first keeps it, while it is up
            self.claimed.add(client_id)
            held = self.shared_record(CLIENTS_NS, client_id)
            records.claim(CLIENTS_NS, client_id, self.node_id.encode(),
                          overwrite=held is not None and self.client_node(client_id) is None)
        else:
            self.claimed.discard(client_id)
            records.unclaim(CLIENTS_NS, client_id)

    def _claim_changed(self, client_id: str, value: bytes | None) -> None:
        """Another node's claim went: if this node has that client id connected (it came
        to both at once, and the other claimed first), it claims it now."""
        if value is None and client_id in self.claimed and self.records is not None:
            self.records.claim(CLIENTS_NS, client_id, self.node_id.encode())

    def client_node(self, client_id: str) -> str | None:
        """The live node, another than this one, where ``client_id`` is connected, if any
        (a claim of a node that stopped answering does not count)."""
        raw = self.shared_record(CLIENTS_NS, client_id)
        if raw is None:
            return None
        node = raw.decode(errors="replace")
        if node == self.node_id:
            return None  # a claim this node left behind (it has no such connection now)
        return node if node in self.up_nodes() else None

    # -- shared records (cluster.records) -------------------------------------------------

    def share_record(self, ns: str, key: str, value: bytes | None) -> None:
        if self.records is not None:
            self.records.put(ns, key, value)

    def shared_record(self, ns: str, key: str) -> bytes | None:
        return self.records.get(ns, key) if self.records is not None else None

    def shared_records(self, ns: str) -> dict[str, bytes]:
        return dict(self.records.copy.get(ns, {})) if self.records is not None else {}

    def _send_soon(self) -> None:
        self._later(self._send())

    async def _send(self) -> None:
        """Publish everything queued, in order."""
        nc = self.nc
        try:
            while self.outbox:
                batch, self.outbox = self.outbox, []
                for subject_name, payload in batch:
                    if nc is None:
                        break
                    try:
                        await nc.publish(subject_name, payload)
                        self.stats["forwarded"] += 1
                    except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
                        self.stats["publish_errors"] += 1
                        log.warning("cannot publish on %s: %s", subject_name, exc)
        finally:
            self.sending = False

    # -- clients: one connection per client id in the cluster ------------------------------

    async def hand_over(self, protocol: str, client_id: str, node: str) -> bytes | None:
        """Ask node ``node`` for its session of ``client_id``, which a client resumes here:
        it closes the client's connection there (a takeover), writes the session's state,
        in-flight exchanges included, to the shared records and lets go of it; its answer
        is that state. None when ``node`` is not up, or did not answer within
        :data:`HANDOVER_WAIT`, or holds no such session."""
        nc = self.nc
        if node not in self.up_nodes() or node == self.node_id or nc is None or not nc.is_connected:
            return None
        body = json.dumps({"protocol": protocol, "client_id": client_id,
                           "to": self.node_id}).encode()
        try:
            reply = await nc.request(f"gw.{self.cluster_name}.handover.{node}", body,
                                     timeout=HANDOVER_WAIT)
        except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
            log.warning("node %s did not hand over the session of %s: %s", node, client_id,
                        exc)
            return None
        return reply.data or None

    async def _handover_asked(self, nmsg: Msg) -> None:
        try:
            note = json.loads(nmsg.data)
            protocol, client_id, to = str(note["protocol"]), str(note["client_id"]), \
                str(note["to"])
        except (ValueError, KeyError, TypeError):
            return
        server = self.broker.adapter_servers.get(protocol)
        record = server.hand_over(client_id, to) if server is not None else None
        if nmsg.reply:
            await self._publish_plain(nmsg.reply, record or b"")

    def client_arrived(self, protocol: str, client_id: str) -> None:
        """A client connected here: tell the other nodes, which take over theirs."""
        body = json.dumps({"client_id": client_id, "node_id": self.node_id}).encode()
        self._later(self._publish_plain(f"gw.{self.cluster_name}.clients.{protocol}", body))

    async def _publish_plain(self, subject_name: str, body: bytes) -> None:
        if self.nc is not None:
            try:
                await self.nc.publish(subject_name, body)
            except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
                log.warning("cannot publish on %s: %s", subject_name, exc)

    async def _client_elsewhere(self, nmsg: Msg) -> None:
        try:
            note = json.loads(nmsg.data)
            client_id, node = str(note["client_id"]), str(note["node_id"])
        except (ValueError, KeyError, TypeError):
            log.warning("unreadable client notice on %s", nmsg.subject)
            return
        if node == self.node_id:
            return
        protocol = nmsg.subject.rsplit(".", 1)[-1]
        server = self.broker.adapter_servers.get(protocol)
        take_over = getattr(server, "take_over", None)
        if take_over is not None:
            take_over(client_id)

    def _later(self, coro: Any) -> None:
        self.tasks = [t for t in self.tasks if not t.done()]
        self.tasks.append(asyncio.ensure_future(coro))

    # -- in: interest and what arrives ----------------------------------------------------

    def _subscription_changed(self, sub: Any, added: bool) -> None:
        pattern = sub.pattern
        if pattern.startswith("$"):
            return
        n = self.patterns.get(pattern, 0) + (1 if added else -1)
        if n > 0:
            self.patterns[pattern] = n
            if n == 1 and added:
                self._cover_add(pattern)
        else:
            self.patterns.pop(pattern, None)
            if pattern in self.cover:
                self._cover_remove(pattern)

    # The cover is kept without comparing every pattern with every other: a literal name is
    # contained only by itself or by a pattern with wildcards (of which there are few; a
    # device fleet's subscriptions are mostly literal, one or two each), and contains no
    # pattern but itself.

    def _covered(self, pattern: str) -> bool:
        if pattern in self.cover:
            return True
        if subject.is_wildcard(pattern):
            return any(subject.contains(c, pattern) for c in self.wild)
        return any(subject.matches(c, pattern) for c in self.wild)

    def _cover_add(self, pattern: str) -> None:
        if self._covered(pattern):
            return
        self.cover[pattern] = None
        self.ops.put_nowait((True, pattern))
        self.cover_changed = True
        if subject.is_wildcard(pattern):
            self.wild[pattern] = None
            for narrower in [c for c in self.cover
                             if c != pattern and subject.contains(pattern, c)]:
                self._uncover(narrower)

    def _cover_remove(self, pattern: str) -> None:
        self._uncover(pattern)
        if not subject.is_wildcard(pattern):
            return  # it covered nothing but itself
        orphans = [p for p in self.patterns if subject.contains(pattern, p)
                   and not self._covered(p)]
        for p in sorted(orphans, key=len):  # broader ones first (a pattern's parents are
            self._cover_add(p)               # no longer than it)

    def _uncover(self, pattern: str) -> None:
        self.cover.pop(pattern, None)
        self.wild.pop(pattern, None)
        self.ops.put_nowait((False, pattern))
        self.cover_changed = True

    async def _apply_ops(self) -> None:
        """Subscribe and unsubscribe in NATS in the order the cover changed (a broader
        subscription is made before the narrower ones it replaces go)."""
        subs: dict[str, NatsSubscription] = {}
        while True:
            op = await self.ops.get()
            nc = self.nc
            if isinstance(op, asyncio.Future):  # a marker: once NATS has what came before
                if nc is not None:
                    try:
                        await nc.flush(int(READY_WAIT))
                    except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
                        log.debug("subscriptions not confirmed by NATS: %s", exc)
                if not op.done():
                    op.set_result(None)
                continue
            add, pattern = op
            if nc is None:
                continue
            try:
                if add and pattern not in subs:
                    subs[pattern] = await nc.subscribe(self.prefix + pattern, cb=self._arrived)
                elif not add and pattern in subs:
                    await subs.pop(pattern).unsubscribe()
            except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
                log.warning("cannot %s %s: %s", "subscribe to" if add else
                            "unsubscribe from", pattern, exc)

    async def _arrived(self, nmsg: Msg) -> None:
        try:
            msg = decode_message(nmsg.data)
        except MessageFormatError as exc:
            self.stats["undecodable"] += 1
            log.warning("undecodable message on %s: %s", nmsg.subject, exc)
            return
        mid = msg.message_id or ""
        seen = self.seen
        if mid in seen:
            self.stats["duplicates"] += 1
            return
        seen[mid] = None
        if len(seen) > SEEN_WINDOW:
            seen.popitem(last=False)
        self.stats["received"] += 1
        self.arriving = True
        try:
            self.session.send(msg)
        except GatewayError as exc:
            log.info("%s from the cluster not delivered here: %s", mid, exc)
        finally:
            self.arriving = False

    def _figures(self) -> dict[str, Any]:
        """What this node's heartbeats carry (cluster.members): its figures, and the
        patterns it subscribes to in NATS (see :meth:`wanted_elsewhere`)."""
        info = self.broker.info()
        out = {k: info.get(k, 0) for k in FIGURES}
        out["link"] = dict(self.stats)
        # A node with more patterns than COVER_MAX says only how many (the heartbeat stays
        # small, far below the NATS servers' max_payload): the others take it to want
        # every topic.
        out["cover"] = sorted(self.cover) if len(self.cover) <= COVER_MAX else None
        out["cover_size"] = len(self.cover)
        return out

    def wanted_elsewhere(self, topic: str) -> bool:
        """Whether a message to ``topic`` that no subscriber of this node took may have
        one on another node, so that this node must not log it dropped for want of
        subscribers: it came from another node (that one decides), or another node's
        heartbeat names a pattern that matches it (as of its last heartbeat)."""
        if self.arriving:
            return True
        members = self.members
        if members is None:
            return False
        if members.version != self.wanted_version:  # the answers are remembered until
            self.wanted_version = members.version  # a node's cover changes
            self.wanted.clear()
            self.remote = members.remote_patterns()
        answer = self.wanted.get(topic)
        if answer is None:
            answer = any(subject.matches(p, topic) for p in self.remote)
            if len(self.wanted) >= SEEN_WINDOW:
                self.wanted.clear()
            self.wanted[topic] = answer
        return answer

    def nodes(self) -> list[dict[str, Any]]:
        """Every node of the cluster as heard (``GET /api/v1/cluster``, ``/metrics``)."""
        return self.members.rows() if self.members is not None else []

    def up_nodes(self) -> set[str]:
        """The ids of the nodes heard to be up (this one among them)."""
        return {row["node_id"] for row in self.nodes() if row.get("up")}

    # -- views of every node, and actions on every node ---------------------------------

    async def _asked(self, nmsg: Msg) -> None:
        """Answer another node's request for a view (``gw.<cluster>.views.<name>``) or an
        action (``gw.<cluster>.actions.<name>``, its argument the payload)."""
        kind, name = nmsg.subject.split(".")[-2:]
        if not nmsg.reply:
            return
        if kind == "views":
            view = self.broker.local_views.get(name)
            result = view() if view is not None else None
        else:
            action = self.broker.local_actions.get(name)
            result = action(nmsg.data.decode()) if action is not None else None
        body = json.dumps({"node_id": self.node_id, "result": result}, default=str).encode()
        await self._publish_plain(nmsg.reply, body)

    async def gather(self, name: str) -> dict[str, list[Any]]:
        """View ``name`` of every node that is up, by node id: this node's own, and each
        other's answer to a request on ``gw.<cluster>.views.<name>`` (those that did not
        answer within :data:`VIEW_WAIT` are left out)."""
        view = self.broker.local_views.get(name)
        out = await self._ask_all(f"views.{name}", b"", view() if view is not None else [])
        return {node: list(rows or ()) for node, rows in out.items()}

    async def everywhere(self, name: str, arg: str) -> dict[str, Any]:
        """Run action ``name`` of :attr:`Core.local_actions` with ``arg`` on every node that
        is up (this one first), and give each one's result by node id (a node that did not
        answer within :data:`VIEW_WAIT` is left out; one without the action gives None)."""
        local = self.broker.local_actions[name](arg)
        return await self._ask_all(f"actions.{name}", arg.encode(), local)

    async def _ask_all(self, what: str, payload: bytes, local: Any) -> dict[str, Any]:
        out: dict[str, Any] = {self.node_id: local}
        others = self.up_nodes() - {self.node_id}
        nc = self.nc
        if not others or nc is None:
            return out
        inbox = nc.new_inbox()
        done = asyncio.Event()

        async def answered(nmsg: Msg) -> None:
            try:
                note = json.loads(nmsg.data)
                out[str(note["node_id"])] = note["result"]
            except (ValueError, KeyError, TypeError):
                return
            if others <= set(out):
                done.set()

        sub = await nc.subscribe(inbox, cb=answered)
        try:
            await nc.publish(f"gw.{self.cluster_name}.{what}", payload, reply=inbox)
            try:
                await asyncio.wait_for(done.wait(), VIEW_WAIT)
            except TimeoutError:
                pass
        finally:
            await sub.unsubscribe()
        return out

    async def purge_queue(self, name: str) -> int | None:
        """Admin ``purge queue`` on a cluster node: the queue's messages go from JetStream
        and from every node that holds some; how many (None: no node knows the queue and
        JetStream kept nothing of it). As on a gateway alone, what consumers hold
        (delivered, not yet acknowledged) stays theirs."""
        stored = await self.feeds.purge_queue(name) if self.feeds is not None else 0
        nodes = [n for n in (await self.everywhere("purge-queue", name)).values()
                 if n is not None]
        if not stored and not nodes:
            return None
        # JetStream's count has every message of a queue it keeps, those the nodes hold
        # too (held until acknowledged); a queue it does not keep (a temporary one) was
        # only on its node.
        in_flight = sum(int(n["in_flight"]) for n in nodes)
        return max(stored - in_flight, sum(int(n["purged"]) for n in nodes))

    def queue_changed(self, pattern: str) -> None:
        """A queue's definition changed: see :meth:`cluster.feeds.Feeds.queue_changed`."""
        if self.feeds is not None:
            self.feeds.queue_changed(pattern)

    async def browse_queue(self, name: str, limit: int) -> list[Message]:
        """Admin browse on a cluster node: see :meth:`cluster.feeds.Feeds.browse_queue`."""
        return await self.feeds.browse_queue(name, limit) if self.feeds is not None else []

    def _durables_made_elsewhere(self, arg: str) -> bool:
        """Another node made durable subscriptions (``arg``: consumer name -> record, as
        its durables bucket has them) and waits for every node to know before answering
        their subscribers (ready): this node knows from now on, its watch or not."""
        if self.feeds is None:
            return False
        try:
            records = dict(json.loads(arg))
        except (ValueError, TypeError):
            return False
        for consumer, record in records.items():
            if record:
                self.feeds.durables.changed(str(consumer), str(record).encode())
        return True

    def _purge_here(self, name: str) -> dict[str, int] | None:
        q = self.broker.queues.get(name)
        if q is None:
            return None
        in_flight = int(q.info()["in_flight"])  # delivered, not acknowledged: they stay
        return {"purged": self.broker.purge_queue(name), "in_flight": in_flight}

    async def _poll_store(self) -> None:
        """Keep :attr:`store_figures` (what ``/metrics`` shows of JetStream) fresh."""
        while True:
            try:
                self.store_figures = await self.store_view()
            except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
                log.debug("cannot read what JetStream keeps: %s", exc)
            await asyncio.sleep(STORE_POLL)

    async def store_view(self) -> dict[str, Any]:
        """What JetStream keeps for the whole cluster (``GET /api/v1/cluster/store``):
        each queue's messages (waiting or delivered and not yet acknowledged, on any node)
        and each durable subscription's (to deliver, and delivered unacknowledged)."""
        feeds = self.feeds
        if feeds is None:
            return {"queues": [], "durables": []}
        prefix = feeds.queue_prefix
        queues = sorted(({"name": (info.config.subjects or [prefix])[0][len(prefix):],
                          "messages": info.state.messages}
                         for info in await feeds.queue_streams()),
                        key=lambda q: str(q["name"]))
        durables = []
        offset = 0
        while True:  # 256 a page
            page = await feeds.js.consumers_info(feeds.topic_stream, offset=offset)
            for ci in page:
                durables.append({"key": ci.config.description, "pending": ci.num_pending or 0,
                                 "unacknowledged": ci.num_ack_pending or 0})
            if len(page) < 256:
                break
            offset += len(page)
        durables.sort(key=lambda d: str(d["key"]))
        return {"queues": queues, "durables": durables}

    def _info_source(self) -> dict[str, Any]:
        return {"cluster": self.info()}

    def info(self) -> dict[str, Any]:
        """The admin API's view of the link (``GET /api/v1/server``, ``cluster``)."""
        nc = self.nc
        return {"node_id": self.node_id, "connected": bool(nc is not None and nc.is_connected),
                "subscriptions": sorted(self.cover), **self.stats,
                "feeds": dict(self.feeds.stats) if self.feeds is not None else {}}


async def start_cluster(broker: Core) -> ClusterLink:
    """Registry entry: join the cluster gateway.conf's ``cluster`` names."""
    gw = broker.config.gateway
    link = ClusterLink(broker, tuple(gw.cluster), gw.cluster_name, gw.node_id or broker.id,
                       replicas=gw.cluster_replicas, ack_wait=gw.cluster_ack_wait)
    try:
        await link.start()
    except Exception as exc:
        await link.close()
        if isinstance(exc, GatewayError):
            raise GatewayError(f"cluster: {exc}") from None
        reason = f"none answered in {JOIN_TIMEOUT:g} s" if isinstance(exc, TimeoutError) \
            else str(exc)
        raise GatewayError(f"cluster: cannot reach the NATS servers "
                           f"{', '.join(gw.cluster)}: {reason}") from None
    return link
