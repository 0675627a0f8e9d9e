"""The broker's message memory: what ``max_msg_memory`` bounds, and what is done at the limit.

How this works. :class:`BrokerMemory` is the part of :class:`~gateway.broker.Broker` that keeps
the memory figures and acts on them: ``Broker`` derives from it, so these are the broker's own
methods and attributes (``broker.memory``, ``broker.swap_out()`` ...), which the publish path,
the routing and the endpoints read and call directly. The attributes it reads that are the
rest of the broker's (the queues, the subscription index, the connections ...) are declared
on the class below and set by ``Broker.__init__``.

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

Runs on the loop; never awaits.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from gateway.backlog import MESSAGE_OVERHEAD
from gateway.backlog import swap_out as swap_queue
from gateway.endpoint import Endpoint, QueueEndpoint, Subscription
from gateway.errors import LimitExceededError
from gateway.message import TOPIC, DeliveryMode, Message
from gateway.routing import both, resolved

if TYPE_CHECKING:
    from gateway.subindex import SubIndex

PERSISTENT = DeliveryMode.PERSISTENT
RELIABLE = DeliveryMode.RELIABLE
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


class BrokerMemory:
    """The broker's memory figures and what acts on them (see the module docstring); the base
    class of :class:`~gateway.broker.Broker`."""

    # The rest of the broker's state that these methods read, set by Broker.__init__.
    loop: asyncio.AbstractEventLoop
    dlog: Any
    log_enabled: bool
    flow_control: bool
    closed: bool
    stats: dict[str, int]
    queues: dict[str, QueueEndpoint]
    subs: SubIndex
    connections: dict[str, Any]

    def __init__(self, gw: Any, store: Any) -> None:
        self.max_memory = int(gw.max_msg_memory)
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
            return fut if fut is not None else resolved(self.loop)
        flow: asyncio.Future[None] = self.loop.create_future()
        self.memory_waiters.append(flow)
        return flow if fut is None else both(self.loop, fut, flow)

    def release_memory(self) -> None:
        """Memory is under RESUME_AT of the limit: confirm the held producers."""
        self.next_deep = 0
        waiters, self.memory_waiters = self.memory_waiters, []
        for f in waiters:
            if not f.done():
                f.set_result(None)

    def swap_soon(self) -> None:
        if not self.swap_pending:
            self.swap_pending = True
            self.loop.call_soon(self._swap_pass)

    def _swap_pass(self) -> None:
        self.swap_pending = False
        if self.closed:
            return
        self.swap_out()
        if self.swap_more:
            self.swap_soon()  # more to do: after other work on the loop

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
            got, seen = swap_queue(q, want - freed, over, budget, deep)
            freed += got
            budget -= seen
        self.swap_more = budget <= 0
        if self.memory_waiters and self.memory <= self.resume_at:
            self.release_memory()
        return freed


def _depth(q: QueueEndpoint) -> int:
    return q.bytes
