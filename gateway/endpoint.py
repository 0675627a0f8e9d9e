"""Endpoints: where messages wait for consumers — a queue, or one topic subscription.

How this works. A queue and a topic subscription behave the same once a message has been
routed to them: the message waits in ``pending`` (one deque per JMS priority, so a backlog is
delivered highest priority first, TIBCO EMS User's Guide, "Message Priority"), is handed to a
ready consumer, waits unacknowledged ("in flight") and is finally acknowledged, or comes back
for redelivery. So both are an :class:`Endpoint`; :class:`QueueEndpoint` adds the queue's name
and properties, :class:`Subscription` adds a topic pattern, a selector, no-local and durability.

A consumer is *ready* while it is active, not paused by its adapter, and holds fewer
unacknowledged deliveries than its window (EMS ``prefetch``, AMQP credit, MQTT Receive
Maximum). Non-exclusive queues hand messages round robin to ready consumers; an exclusive
queue gives everything to its first consumer while it lives (EMS User's Guide,
"Destination Properties", exclusive). A queue consumer with a selector only receives matching
messages; the others stay on the queue.

Messages are shared by every endpoint they were routed to. What is per endpoint — how many
times this endpoint has delivered the message — is kept in ``counts`` (only for messages
that were delivered at least once and came back), so the common path allocates nothing.

Messages that may not be delivered yet (delivery delay, EMS User's Guide, "Delivery Delay";
redelivery delay, EMS User's Guide, "Destination Properties", redeliveryDelay) are *held* in a
heap with their due time; one timer per endpoint releases them. Expired messages are removed
when met at dispatch and by the broker's periodic sweep.

What a message held here costs in memory, a queue's messages swapped out to the store and a
durable subscription's tail in the store are :mod:`gateway.backlog`'s; consumers and their
deliveries, :mod:`gateway.consumer`'s.

Everything here runs on the loop thread and never awaits.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import TYPE_CHECKING, Any

from gateway import subject
from gateway.backlog import (
    MESSAGE_OVERHEAD,
    Swapped,
    charge,
    is_swapped,
    load,
    load_now,
    read_tail,
)
from gateway.consumer import Consumer, Delivery
from gateway.message import PRIORITIES, DeliveryMode, Destination, Message
from gateway.routing import is_simple

if TYPE_CHECKING:
    from gateway.broker import Broker
    from gateway.selector import Selector

_seq = itertools.count()


class Endpoint:
    """Pending messages and the consumers that take them. See the module docstring."""

    def __init__(self, broker: Broker, key: str, dest: Destination, *, durable: bool) -> None:
        self.broker = broker
        self.key = key  # store key
        self.dest = dest
        self.log_dest = str(dest)  # ``topic:name`` / ``queue:name``, as the delivery log writes it
        # The log's ``dest`` is each message's own destination, not ``log_dest`` (a wildcard
        # subscription's messages come from many topics): see log_dest_of.
        self.log_msg_dest = False
        self.durable = durable
        self.pending: list[deque[Message]] = [deque() for _ in range(PRIORITIES)]
        self.npending = 0
        self.count = 0  # pending + in flight + held (what maxmsgs counts)
        self.bytes = 0  # same, in bytes (what maxbytes counts)
        self.consumers: list[Consumer] = []
        self.rr = 0
        self.exclusive = False
        self.selective = False  # some consumer has a selector (queues only)
        self.counts: dict[Message, int] = {}
        self.held: list[tuple[int, int, Message]] = []
        self.held_timer: Any = None
        self.dispatching = False
        self.expiring = 0  # messages with an expiry currently counted here
        self.flow_limit = 0
        self.flow_msgs = 1 << 62  # a message-count flow limit (export spools), else none
        self.flow_waiters: list[Any] = []
        self.stats_in = 0
        self.stats_out = 0
        self.stats_bytes_in = 0  # sizes of the messages counted in stats_in
        self.stats_bytes_out = 0  # and in stats_out
        self.stats_acked = 0
        self.stats_discarded = 0  # dropped by overflowPolicy=discardOld
        self.closed = False
        self.swapped = 0  # pending messages whose body is in the store only
        self.loading = False  # a read of swapped messages is on its way
        self.fresh = 0  # persistent messages put since the last swap pass looked (queues)
        # Pending messages in the store only (a durable subscription's tail, see
        # gateway.backlog): counted in ``count`` (and their size in ``bytes``), not in memory.
        self.tail = 0
        self.tail_bytes = 0  # what ``bytes`` counts for them
        self.tail_after = 0  # the tail: this endpoint's entries with a message id above this
        self.tail_reading = False  # a read of the tail is on its way
        # Pending messages at which the broker's laggard scan is to look here
        # (Broker.laggard_seen): LAGGARD_MIN + 1 for a non-durable topic subscription, which
        # the broker sets; never for the rest. Checked where ``npending`` grows.
        self.laggard_at = 1 << 62
        # A queue of a cluster: what brings its messages from the cluster's shared store
        # and settles them there (cluster.queues.QueueFeed), told of each message that
        # leaves and of every change of consumers; None for the rest.
        self.feed: Any = None

    # -- adding messages ------------------------------------------------------------------

    def put(self, msg: Message, now: int) -> None:
        """Take a routed message: hold it if it has a delivery time, else queue and dispatch."""
        self.count += 1
        self.bytes += msg.size
        self.stats_in += 1
        self.stats_bytes_in += msg.size
        if msg.expires_at:
            self.expiring += 1
        if msg.delivery_time > now:
            self._hold(msg, msg.delivery_time)
            return
        if not self.npending and self.consumers and not self.dispatching and not self.selective:
            # Fast path: nothing waiting, so a ready consumer takes the message at once --
            # unless it expired already (as dispatch would find).
            if msg.expires_at and msg.expires_at <= now:
                self._expire(msg)
                return
            consumers = self.consumers
            if len(consumers) == 1 or self.exclusive:
                consumer: Consumer | None = consumers[0] if consumers[0].ready else None
            else:
                consumer = self._next_ready()
            if consumer is not None:
                self.dispatching = True
                try:
                    self._deliver(consumer, msg, now)
                finally:
                    self.dispatching = False
                if self.npending:
                    self.dispatch()
                return
        self.pending[msg.priority].append(msg)
        self.npending += 1
        if self.npending == self.laggard_at:
            self.broker.laggard_seen(self)
        if self.consumers and not self.dispatching:
            self.dispatch()

    def put_tail(self, msg: Message) -> None:
        """Count a routed persistent message whose entry the broker stored, leaving it in
        the store only: the tail of a durable subscription (see :mod:`gateway.backlog`)."""
        if not self.tail:
            self.tail_after = msg.store_id - 1
        self.tail += 1
        self.tail_bytes += msg.size
        self.count += 1
        self.bytes += msg.size
        self.stats_in += 1
        self.stats_bytes_in += msg.size

    def restore(self, msg: Message, delivery_count: int, now: int) -> None:
        """Put back a recovered message (store recovery), keeping its delivery count."""
        if delivery_count:
            self.counts[msg] = delivery_count
        self.put(msg, now)

    # -- dispatch -------------------------------------------------------------------------

    def dispatch(self) -> None:
        """Hand pending messages to ready consumers. Never re-entered."""
        if self.dispatching or not self.consumers:
            return
        if self.npending:
            self.dispatching = True
            try:
                if self.selective:
                    self._dispatch_selective()
                else:
                    self._dispatch_simple()
            finally:
                self.dispatching = False
        if self.tail and self.npending < self.broker.tail_low:
            read_tail(self)

    def _dispatch_simple(self) -> None:
        pending = self.pending
        broker = self.broker
        now = 0
        while self.npending:
            consumer = self._next_ready()
            if consumer is None:
                return
            for p in range(PRIORITIES - 1, -1, -1):
                if pending[p]:
                    msg = pending[p].popleft()
                    break
            if self.swapped and type(msg.body) is Swapped:
                pending[p].appendleft(msg)
                load(self)
                return
            self.npending -= 1
            if not now:
                now = broker.now()  # once a pass: expiry and delivery times
            if msg.expires_at and msg.expires_at <= now:
                self._expire(msg)
                continue
            self._deliver(consumer, msg, now)

    def _dispatch_selective(self) -> None:
        """Queue dispatch when consumers have selectors: skip what no ready consumer takes."""
        now = self.broker.now()
        for p in range(PRIORITIES - 1, -1, -1):
            dq = self.pending[p]
            if not dq:
                continue
            kept: deque[Message] = deque()
            while dq:
                msg = dq.popleft()
                if msg.expires_at and msg.expires_at <= now:
                    self.npending -= 1
                    self._expire(msg)
                    continue
                consumer = self._next_ready(msg)
                if consumer is None:
                    kept.append(msg)
                    if self._next_ready() is None:
                        break
                    continue
                if type(msg.body) is Swapped:  # selected on its headers; its body is needed
                    kept.append(msg)
                    kept.extend(dq)
                    self.pending[p] = kept
                    load(self, msg)
                    return
                self.npending -= 1
                self._deliver(consumer, msg, now)
            kept.extend(dq)
            self.pending[p] = kept

    def _next_ready(self, msg: Message | None = None) -> Consumer | None:
        consumers = self.consumers
        n = len(consumers)
        if self.exclusive:
            c = consumers[0]
            if c.ready and (msg is None or c.selector is None or c.selector.matches(msg)):
                return c
            return None
        if n == 1:
            c = consumers[0]
            if c.ready and (msg is None or c.selector is None or c.selector.matches(msg)):
                return c
            return None
        start = self.rr
        for i in range(n):
            c = consumers[(start + i) % n]
            if c.ready and (msg is None or c.selector is None or c.selector.matches(msg)):
                self.rr = (start + i + 1) % n
                return c
        return None

    def _deliver(self, consumer: Consumer, msg: Message, now: int) -> None:
        """Hand ``msg`` to ``consumer`` (``now``: the time, ms, for the delivery latency)."""
        count = self.counts.get(msg, 0) + 1 if self.counts else 1
        session = consumer.session
        tag = session.next_tag
        session.next_tag = tag + 1
        d = Delivery(msg, tag, count, consumer)
        consumer.delivered_total += 1
        self.stats_out += 1
        self.stats_bytes_out += msg.size
        traffic = consumer.traffic  # the /metrics endpoint's figures (gateway.consumer)
        traffic.messages += 1
        traffic.bytes += msg.size
        if count == 1:
            traffic.observe(now - msg.timestamp)
        broker = self.broker
        if consumer.track:
            consumer.unacked += 1
            session.unacked[tag] = d
            if count > 1:
                self.counts[msg] = count
        else:
            # No acknowledgement: the server forgets the message once sent (EMS User's Guide,
            # "Message Acknowledgement", NO_ACKNOWLEDGE).
            self._remove(msg)
            d.settled = True
        if broker.log_enabled:
            client = consumer.log_client
            if client is not None:
                broker.dlog.record("deliver" if count == 1 else "redeliver", msg,
                                   self.log_dest_of(msg) if self.log_msg_dest
                                   else self.log_dest, client, count)
        if broker.message_monitors and msg.destination is not None:  # $sys.monitor.*.s.*
            broker.monitor.message_event("s", msg.destination, msg, session.connection,
                                         "consumer")
        consumer.listener(d)

    def log_dest_of(self, msg: Message) -> str:
        """The ``dest`` of a delivery-log record of ``msg`` here: the destination the message
        was sent to (docs/delivery-log.md, "Fields"), which the reconciliation matches with
        that of its ``publish`` or ``import``. That is this endpoint's own name (``log_dest``)
        but for a wildcard subscription (``log_msg_dest``), whose messages were each published
        to a topic of their own. The text is the one cached on the message's Destination
        (the broker's publish puts its topic's there), so no string is made per message."""
        if self.log_msg_dest:
            dest = msg.destination
            if dest is not None:
                text = dest._text
                return text if text is not None else self.broker.dest_text(dest)
        return self.log_dest

    def claim(self, store_id: int, consumer: Consumer) -> Delivery | None:
        """Hand the pending message with ``store_id`` to ``consumer`` now, out of turn.

        For an adapter resuming an exchange that was in flight when the gateway stopped
        (MQTT re-sends it with its original packet id). The listener is not called; the
        delivery is tracked for acknowledgement like any other. ``None`` if it is not here.
        """
        for p in range(PRIORITIES - 1, -1, -1):
            for msg in self.pending[p]:
                if msg.store_id == store_id:
                    if is_swapped(msg):
                        load_now(self, [msg])
                        # A call, not the test written out: the compiled build would take
                        # the attribute's type as narrowed by the test above.
                        if is_swapped(msg):
                            return None  # the store could not give it back: dropped
                    self.pending[p].remove(msg)
                    self.npending -= 1
                    count = self.counts.get(msg, 0) + 1
                    session = consumer.session
                    tag = session.next_tag
                    session.next_tag = tag + 1
                    d = Delivery(msg, tag, count, consumer)
                    consumer.unacked += 1
                    session.unacked[tag] = d
                    self.counts[msg] = count
                    broker = self.broker
                    client = consumer.log_client
                    if broker.log_enabled and client is not None:
                        broker.dlog.record("deliver" if count == 1 else "redeliver", msg,
                                           self.log_dest_of(msg), client, count)
                    return d
        return None

    # -- settlement -----------------------------------------------------------------------

    def ack(self, d: Delivery) -> None:
        """The consumer acknowledged ``d``: the message leaves this endpoint for good."""
        if d.settled:
            return
        d.settled = True
        d.consumer.unacked -= 1
        self.stats_acked += 1
        broker = self.broker
        if broker.log_enabled:
            client = d.consumer.log_client
            if client is not None:
                msg = d.msg
                broker.dlog.record("ack", msg, self.log_dest_of(msg) if self.log_msg_dest
                                   else self.log_dest, client, d.count)
        if broker.message_monitors and d.msg.destination is not None:  # $sys.monitor.*.a.*
            broker.monitor.message_event("a", d.msg.destination, d.msg,
                                         d.consumer.session.connection, "consumer")
        self._remove(d.msg)
        if self.npending and not self.dispatching:
            self.dispatch()

    def requeue(self, d: Delivery, *, count_delivery: bool = True, front: bool = True,
                dispatch: bool = True) -> None:
        """Return an unacknowledged delivery for redelivery (rollback, recover, close, NACK).

        Past ``maxRedelivery`` delivery attempts the message is undeliverable
        (EMS User's Guide, "Destination Properties", maxRedelivery); with ``redeliveryDelay``
        it waits before it returns (EMS User's Guide, "Destination Properties", redeliveryDelay).
        """
        if d.settled:
            return
        d.settled = True
        d.consumer.unacked -= 1
        msg = d.msg
        count = d.count if count_delivery else d.count - 1
        broker = self.broker
        if count:
            self.counts[msg] = count
        else:
            self.counts.pop(msg, None)
        max_redelivery = self.max_redelivery()
        if max_redelivery and count >= max_redelivery:
            self._remove(msg)
            broker.undeliverable(msg, self, "maxredelivery_exceeded", count)
            return
        if self.durable and msg.store_id and count_delivery:
            broker.store.update_entry(self.key, msg.store_id, count)
            broker.store.commit(None)
        delay = self.redelivery_delay()
        if delay and count_delivery:
            self._hold(msg, broker.now() + delay)
            return
        if front:
            self.pending[msg.priority].appendleft(msg)
        else:
            self.pending[msg.priority].append(msg)
        self.npending += 1
        if self.npending == self.laggard_at:
            self.broker.laggard_seen(self)
        if dispatch and not self.dispatching:
            self.dispatch()

    def reject(self, d: Delivery, reason: str = "rejected") -> None:
        """The consumer refused the message outright: it becomes undeliverable now."""
        if d.settled:
            return
        d.settled = True
        d.consumer.unacked -= 1
        self._remove(d.msg)
        self.broker.undeliverable(d.msg, self, reason, d.count)
        if self.npending and not self.dispatching:
            self.dispatch()

    def _remove(self, msg: Message) -> None:
        """Forget a message that was pending, held or in flight here (ack, drop, expiry)."""
        self.count -= 1
        self.bytes -= msg.size
        if msg.expires_at:
            self.expiring -= 1
        if self.counts:
            self.counts.pop(msg, None)
        broker = self.broker
        if self.swapped and type(msg.body) is Swapped:
            broker.memory -= charge(msg)
            self.swapped -= 1
            broker.swapped -= 1
        else:
            broker.memory -= msg.size + MESSAGE_OVERHEAD
        if msg.store_id and self.durable:
            broker.unstore(self, msg)
        feed = self.feed
        if feed is not None:
            feed.removed(msg)
        if self.flow_waiters and self.bytes < self.flow_limit and self.count < self.flow_msgs:
            broker.release_flow(self)
        if broker.memory_waiters and broker.memory <= broker.resume_at:
            broker.release_memory()

    def _expire(self, msg: Message) -> None:
        self._remove(msg)
        self.broker.undeliverable(msg, self, "expired", self.counts.get(msg, 0))

    def discard_oldest(self) -> bool:
        """Drop the oldest pending message (overflowPolicy=discardOld, EMS User's Guide,
        "Destination Properties", overflowPolicy)."""
        oldest: Message | None = None
        oldest_p = -1
        for p in range(PRIORITIES):
            dq = self.pending[p]
            if dq and (oldest is None or dq[0].timestamp < oldest.timestamp):
                oldest, oldest_p = dq[0], p
        if self.tail and self.npending <= self.broker.tail_low:
            read_tail(self)  # what is discarded after these comes from the tail
        if oldest is None:
            return False
        self.pending[oldest_p].popleft()
        self.npending -= 1
        self._remove(oldest)
        self.stats_discarded += 1
        broker = self.broker
        broker.stats["discarded"] += 1
        if broker.log_enabled:
            broker.dlog.record("discard", oldest, self.log_dest_of(oldest), None, 0, "discarded")
        if broker.message_monitors and oldest.destination is not None:  # $sys.monitor.*.p.*
            broker.monitor.message_event("p", oldest.destination, oldest, None, "discarded")
        return True

    def purge(self) -> int:
        """Drop every pending and held message; returns how many."""
        n = 0
        for dq in self.pending:
            while dq:
                self._remove(dq.popleft())
                n += 1
        while self.held:
            _, _, msg = heapq.heappop(self.held)
            self._remove(msg)
            n += 1
        self.npending = 0
        if self.tail:
            # Their entries and messages go with the endpoint (Store.delete_endpoint).
            n += self.tail
            self.count -= self.tail
            self.bytes -= self.tail_bytes
            self.tail = self.tail_bytes = 0
        return n

    def sweep_expired(self, now: int) -> None:
        """Remove expired pending messages (periodic; dispatch also checks)."""
        if not self.expiring or not self.npending:
            return
        for p in range(PRIORITIES):
            dq = self.pending[p]
            if not dq:
                continue
            live = deque(m for m in dq if not (m.expires_at and m.expires_at <= now))
            if len(live) != len(dq):
                dead = [m for m in dq if m.expires_at and m.expires_at <= now]
                self.pending[p] = live
                self.npending -= len(dead)
                for m in dead:
                    self._expire(m)

    # -- held messages (delivery delay, redelivery delay) ----------------------------------

    def _hold(self, msg: Message, due: int) -> None:
        heapq.heappush(self.held, (due, next(_seq), msg))
        if self.held[0][2] is msg:
            self._arm_held_timer()

    def _arm_held_timer(self) -> None:
        if self.held_timer is not None:
            self.held_timer.cancel()
        due = self.held[0][0]
        self.held_timer = self.broker.call_at_ms(due, self._release_held)

    def _release_held(self) -> None:
        self.held_timer = None
        if self.closed:
            return
        now = self.broker.now()
        released = False
        while self.held and self.held[0][0] <= now:
            _, _, msg = heapq.heappop(self.held)
            self.pending[msg.priority].append(msg)
            self.npending += 1
            if self.npending == self.laggard_at:
                self.broker.laggard_seen(self)
            released = True
        if self.held:
            self._arm_held_timer()
        if released:
            self.dispatch()

    # -- consumers ------------------------------------------------------------------------

    def add_consumer(self, c: Consumer) -> None:
        self.consumers.append(c)
        if c.selector is not None and isinstance(self, QueueEndpoint):
            self.selective = True
        self.dispatch()
        if self.feed is not None:
            self.tell_feed()

    def remove_consumer(self, c: Consumer) -> None:
        c.active = False
        if c in self.consumers:
            self.consumers.remove(c)
        self.selective = isinstance(self, QueueEndpoint) and any(
            x.selector is not None for x in self.consumers
        )
        if self.rr >= max(1, len(self.consumers)):
            self.rr = 0
        if self.feed is not None:
            self.tell_feed()

    def tell_feed(self) -> None:
        """Tell the feed how many consumers take messages here now (not paused), of how
        many there are."""
        feed = self.feed
        if feed is not None:
            feed.consumers_changed(sum(1 for c in self.consumers if not c.paused),
                                   len(self.consumers))

    # -- properties the broker asks for ----------------------------------------------------

    def max_redelivery(self) -> int:
        return 0

    def redelivery_delay(self) -> int:
        return 0

    def info(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "destination": str(self.dest),
            "durable": self.durable,
            "pending": self.npending,
            "held": len(self.held),
            "in_flight": self.count - self.npending - len(self.held),
            "count": self.count,
            "bytes": self.bytes,
            "swapped": self.swapped,
            "stored": self.tail,
            "consumers": len(self.consumers),
            "total_in": self.stats_in,
            "total_out": self.stats_out,
            "total_acked": self.stats_acked,
            "total_discarded": self.stats_discarded,
        }

    def iter_pending(self) -> list[Message]:
        """Pending messages in delivery order (highest priority first) — for browsers."""
        out: list[Message] = []
        for p in range(PRIORITIES - 1, -1, -1):
            out.extend(self.pending[p])
        return out


class QueueEndpoint(Endpoint):
    """A queue: competing consumers, round robin or exclusive; redelivery limits."""

    def __init__(self, broker: Broker, name: str, props: Any, *, owner: Any = None) -> None:
        super().__init__(broker, "queue:" + name, Destination.queue(name), durable=True)
        self.name = name
        self.props = props
        self.owner = owner  # the connection of a temporary queue
        self.exclusive = bool(props.exclusive)
        self.flow_limit = props.flow_control_bytes if broker.flow_control else 0
        self.simple = is_simple(props)
        self.stored = False  # the definition is in the store

    def max_redelivery(self) -> int:
        return int(self.props.max_redelivery)

    def redelivery_delay(self) -> int:
        return int(self.props.redelivery_delay_ms)


class Subscription(Endpoint):
    """A topic subscription: non-durable, durable, shared or shared-durable (EMS User's Guide,
    "Durable Subscribers for Topics" and "Shared Subscriptions for Topics").

    ``pattern`` may hold wildcards. ``selector`` and ``no_local`` are applied when a
    message is routed here (the subscription's consumers all share them).
    """

    def __init__(
        self,
        broker: Broker,
        key: str,
        pattern: str,
        *,
        durable: bool,
        shared: bool,
        name: str | None,
        client_id: str | None,
        selector: Selector | None,
        no_local: bool,
        owner: Any,
        parent_match: bool = False,
    ) -> None:
        super().__init__(broker, key, Destination.topic(pattern), durable=durable)
        self.pattern = pattern
        # Each message's own topic is the destination its records concern, not the pattern.
        self.log_msg_dest = subject.is_wildcard(pattern)
        self.shared = shared
        self.name = name
        self.client_id = client_id
        self.selector = selector
        self.no_local = no_local
        self.owner = owner  # connection owning a non-durable, unshared subscription
        self.parent_match = parent_match
        # A bound of its own (a transport's export spool): (maxmsgs, maxbytes, block); when
        # full, block the producer (as flow control does) or reject the message.
        self.spool: tuple[int, int, bool] | None = None
        # An adapter's bound on what waits here beyond the in-flight window (an MQTT session's
        # max_queued_messages / max_queued_bytes): (messages, bytes, drop_all); 0 = no limit.
        # When full the broker drops a non-persistent message (every message when
        # drop_all) for this subscriber and applies the topic's overflow policy otherwise.
        self.bound: tuple[int, int, bool] | None = None
        self.dropped = 0  # messages this subscriber missed (bound or maxmsgs/maxbytes full)

    def shed(self, want: int, conn_id: str | None, *, keep: int = 0,
             persistent: bool = False) -> int:
        """Drop pending messages, oldest first, until ``want`` bytes of memory are freed,
        ``keep`` are left, or (without ``persistent``, which lets any delivery mode go) the
        front of every priority holds a persistent message: the broker's answer to a slow
        consumer or a laggard when memory is short (:meth:`Broker.shed_slow`,
        :meth:`Broker.shed_laggards`). Each drop is counted and logged (reason
        ``slow_consumer``). Returns the bytes freed."""
        broker = self.broker
        pending = self.pending
        freed = 0
        while freed < want and self.npending > keep:
            oldest: Message | None = None
            oldest_p = -1
            for p in range(PRIORITIES):
                dq = pending[p]
                if dq:
                    m = dq[0]
                    if (persistent or m.delivery_mode is DeliveryMode.NON_PERSISTENT) and (
                            oldest is None or m.timestamp < oldest.timestamp):
                        oldest, oldest_p = m, p
            if oldest is None:
                break
            pending[oldest_p].popleft()
            self.npending -= 1
            self._remove(oldest)
            freed += oldest.size + MESSAGE_OVERHEAD
            self.dropped += 1
            broker.stats["dropped"] += 1
            if broker.log_enabled:
                broker.dlog.record("drop", oldest, self.log_dest_of(oldest), conn_id, 0,
                                   "slow_consumer")
        return freed

    def accepts(self, msg: Message) -> bool:
        """Selector and no-local test for one routed message."""
        if self.no_local and msg.producer_conn is not None and self.owner is not None:
            if msg.producer_conn == self.owner.id:
                return False
        sel = self.selector
        return sel is None or sel.matches(msg)

    def definition(self) -> dict[str, Any]:
        return {
            "type": "durable",
            "pattern": self.pattern,
            "name": self.name,
            "client_id": self.client_id,
            "shared": self.shared,
            "selector": self.selector.text if self.selector is not None else None,
            "no_local": self.no_local,
            "parent_match": self.parent_match,
        }

    def info(self) -> dict[str, Any]:
        d = super().info()
        d.update(
            dropped=self.dropped,
            bound=list(self.bound) if self.bound is not None else None,
            pattern=self.pattern,
            name=self.name,
            client_id=self.client_id,
            shared=self.shared,
            selector=self.selector.text if self.selector is not None else None,
            no_local=self.no_local,
        )
        return d


def requeue_all(deliveries: list[Delivery], *, count_delivery: bool = True) -> None:
    """Return several deliveries in their original order, then dispatch each endpoint once."""
    endpoints: dict[int, Endpoint] = {}
    for d in reversed(deliveries):
        ep = d.consumer.endpoint
        ep.requeue(d, count_delivery=count_delivery, dispatch=False)
        endpoints[id(ep)] = ep
    for ep in endpoints.values():
        ep.dispatch()
