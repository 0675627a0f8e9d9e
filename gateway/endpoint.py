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

Memory. Every message an endpoint holds is charged to ``broker.memory`` (``max_msg_memory``)
at :func:`charge`: its size estimate plus :data:`MESSAGE_OVERHEAD`. A queue may *swap* its
pending persistent messages (EMS ``msg_swapping``, EMS User's Guide, "tibemsd.conf", Connection
and Memory Parameters): the body leaves memory (the store has it) and a :class:`Swapped` marker
takes its place, so the message object stays where it was in ``pending`` with its headers and
properties -- order, priority, expiry and selectors work on it unchanged. Dispatch that meets a
swapped message asks the store for it and the next swapped ones in delivery order
(:meth:`Endpoint._load`) and goes on when they are back. Swapping starts from the back of the
queue (lowest priority, newest), so what is delivered next stays in memory.

A durable subscription cannot swap that way (a persistent topic message is one object shared
by every subscription it reached), so it keeps a *tail* in the store instead: once it holds
``destination_backlog_swapout`` pending messages in memory (or memory is past the broker's swap
mark), a newly routed persistent message only gets its store entry and is counted
(:meth:`Endpoint.put_tail`: ``count`` and ``bytes`` include it, ``broker.memory`` does not),
and so is every persistent message after it while the tail lasts, so that the store's order is
kept. When the messages in memory run below half of that and the subscription has consumers,
:meth:`Endpoint._read_tail` asks the store for the next batch of its entries past the last one
it has, with their messages and delivery counts, through the store's writer thread; they join
``pending`` and dispatch goes on (:meth:`Endpoint._tail_read`). Each message read back is an
object of its own, held by this subscription alone. Non-persistent messages stay in memory
meanwhile and may so pass persistent ones routed before them: MQTT 5.0 §4.6 asks for order
only per topic and QoS (QoS 0 is non-persistent, QoS 1 and 2 persistent), and JMS 1.1
§4.4.10 leaves the order between delivery modes undefined. Priorities order what is in
memory; the tail comes back in the order it was routed.

Everything here runs on the loop thread and never awaits.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from gateway import subject
from gateway.message import (
    PROP_PRESERVE_UNDELIVERED,
    DeliveryMode,
    Destination,
    Message,
    body_size,
)

if TYPE_CHECKING:
    from gateway.broker import Broker
    from gateway.client import Session
    from gateway.selector import Selector

log = logging.getLogger("gateway.endpoint")

PRIORITIES = 10  # JMS priorities 0..9 (EMS User's Guide, "JMS Message Header Fields", JMSPriority)
PERSISTENT = DeliveryMode.PERSISTENT
_seq = itertools.count()

# What a message held in memory costs beyond ``Message.size`` (its body and property text plus
# 64 bytes): measured with tracemalloc for a 1 KB persistent STOMP message on a queue (CPython
# 3.11, 64-bit): the Message object with its 24 slots 224 B, its message id and trace id
# strings 136 B, the property dict 64 B, the timestamp, store id and other int objects 96 B,
# the bytes object's header 33 B, the deque slot 8 B: about 560 B in all, 64 of them already in
# ``size``. Without it a queue of small messages used several times the memory it was charged.
MESSAGE_OVERHEAD: Final = 480
# Swapped messages read back from the store per read (one round trip through the writer).
LOAD_BATCH = 512
# Most and fewest entries of a durable subscription's tail read back at once (one round trip
# through the store's writer thread each).
TAIL_BATCH = 2048
TAIL_MIN = 64


class Swapped:
    """The body of a swapped message: it is in the store; ``nbytes`` is what left memory."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


# Markers by size, shared: most messages of a deep queue have bodies of a few sizes, and a
# marker of its own would cost each swapped message another 48 bytes.
_MARKERS: dict[int, Swapped] = {}
MAX_MARKERS = 4096


def swapped_marker(nbytes: int) -> Swapped:
    marker = _MARKERS.get(nbytes)
    if marker is None:
        marker = Swapped(nbytes)
        if len(_MARKERS) < MAX_MARKERS:
            _MARKERS[nbytes] = marker
    return marker


def is_swapped(msg: Message) -> bool:
    return type(msg.body) is Swapped


def charge(msg: Message) -> int:
    """What ``msg`` costs in ``broker.memory`` while an endpoint holds it."""
    body = msg.body
    if type(body) is Swapped:
        return msg.size + MESSAGE_OVERHEAD - body.nbytes
    return msg.size + MESSAGE_OVERHEAD


class Delivery:
    """One delivery of a message to one consumer; what a listener receives.

    ``count`` is ``JMSXDeliveryCount`` (1 on the first delivery); ``redelivered`` is
    ``JMSRedelivered``. ``tag`` identifies the delivery within its session for acks.
    """

    __slots__ = ("msg", "tag", "count", "consumer", "settled")

    def __init__(self, msg: Message, tag: int, count: int, consumer: Consumer) -> None:
        self.msg = msg
        self.tag = tag
        self.count = count
        self.consumer = consumer
        self.settled = False

    @property
    def redelivered(self) -> bool:
        return self.count > 1

    def __repr__(self) -> str:
        return f"<Delivery tag={self.tag} count={self.count} {self.msg!r}>"


Listener = Callable[[Delivery], None]


class Consumer:
    """A consumer attached to one endpoint, owned by a session.

    ``window`` is the most unacknowledged deliveries it may hold (``None`` = unlimited);
    ``listener`` is called on the loop for each delivery. Adapters pause a consumer when
    their socket's write buffer is full and resume it when it drains.
    """

    __slots__ = (
        "id",
        "session",
        "endpoint",
        "selector",
        "no_local",
        "window",
        "unacked",
        "listener",
        "active",
        "paused",
        "track",
        "delivered_total",
        "name",
        "log_client",
    )

    def __init__(
        self,
        cid: int,
        session: Session,
        endpoint: Endpoint,
        listener: Listener,
        *,
        selector: Selector | None = None,
        no_local: bool = False,
        window: int | None = None,
        name: str = "",
    ) -> None:
        self.id = cid
        self.session = session
        self.endpoint = endpoint
        self.selector = selector
        self.no_local = no_local
        self.window = window
        self.unacked = 0
        self.listener = listener
        self.active = True
        self.paused = False
        # Deliveries are tracked for acknowledgement unless the session acknowledges nothing.
        self.track = not session.no_ack
        self.delivered_total = 0
        self.name = name
        # The ``client`` of its deliver, redeliver and ack records; None: none are written
        # (a transport's consumer, see ``Connection.logs_deliveries``).
        conn = session.connection
        self.log_client: str | None = conn.id if conn.logs_deliveries else None

    @property
    def ready(self) -> bool:
        w = self.window
        return (
            self.active
            and not self.paused
            and self.session.connection.started
            and (w is None or self.unacked < w)
        )

    def set_window(self, window: int | None) -> None:
        """Change the window (credit); more room dispatches waiting messages at once."""
        self.window = window
        self.endpoint.dispatch()

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self.endpoint.dispatch()

    def __repr__(self) -> str:
        return f"<Consumer {self.id} on {self.endpoint.key}>"


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
        self.stats_acked = 0
        self.stats_discarded = 0  # dropped by overflowPolicy=discardOld
        self.closed = False
        self.swapped = 0  # pending messages whose body is in the store only
        self.loading = False  # a read of swapped messages is on its way
        self.fresh = 0  # persistent messages put since the last swap pass looked (queues)
        # Pending messages in the store only (a durable subscription's tail, see the module
        # docstring): counted in ``count`` (and their size in ``bytes``), not in memory.
        self.tail = 0
        self.tail_bytes = 0  # what ``bytes`` counts for them
        self.tail_after = 0  # the tail: this endpoint's entries with a message id above this
        self.tail_reading = False  # a read of the tail is on its way
        # Pending messages at which the broker's laggard scan is to look here
        # (Broker.laggard_seen): LAGGARD_MIN + 1 for a non-durable topic subscription, which
        # the broker sets; never for the rest. Checked where ``npending`` grows.
        self.laggard_at = 1 << 62

    # -- adding messages ------------------------------------------------------------------

    def put(self, msg: Message, now: int) -> None:
        """Take a routed message: hold it if it has a delivery time, else queue and dispatch."""
        self.count += 1
        self.bytes += msg.size
        self.stats_in += 1
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
                    self._deliver(consumer, msg)
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
        the store only: the tail of a durable subscription (see the module docstring)."""
        if not self.tail:
            self.tail_after = msg.store_id - 1
        self.tail += 1
        self.tail_bytes += msg.size
        self.count += 1
        self.bytes += msg.size
        self.stats_in += 1

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
            self._read_tail()

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
                self._load()
                return
            self.npending -= 1
            if msg.expires_at:
                if not now:
                    now = broker.now()
                if msg.expires_at <= now:
                    self._expire(msg)
                    continue
            self._deliver(consumer, msg)

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
                    self._load(msg)
                    return
                self.npending -= 1
                self._deliver(consumer, msg)
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

    def _deliver(self, consumer: Consumer, msg: Message) -> None:
        count = self.counts.get(msg, 0) + 1 if self.counts else 1
        session = consumer.session
        tag = session.next_tag
        session.next_tag = tag + 1
        d = Delivery(msg, tag, count, consumer)
        consumer.delivered_total += 1
        self.stats_out += 1
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
                        self.load_now([msg])
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
            self._read_tail()  # what is discarded after these comes from the tail
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

    # -- message swapping (queues) ---------------------------------------------------------

    def swap_out(self, want: int, count: int, budget: int, deep: bool) -> tuple[int, int]:
        """Drop the bodies of pending persistent messages until ``want`` bytes are freed and
        ``count`` messages swapped, or ``budget`` messages were looked at; from the back:
        lowest priority, newest first. Returns (bytes freed, messages looked at).

        Without ``deep``, each priority's scan stops at its first swapped message: what lies
        before it was looked at by an earlier pass (or read back to be delivered next), so a
        pass costs what arrived since the last one. Only a stored message that no other
        endpoint holds may go (a queue's own), and not one to be kept when undeliverable
        (``undeliverable`` copies its body)."""
        freed = seen = n = 0
        for p in range(PRIORITIES):
            for msg in reversed(self.pending[p]):
                body = msg.body
                if type(body) is Swapped:
                    if not deep:
                        break
                    continue
                seen += 1
                if (msg.store_id and msg.refs == 1 and msg.delivery_mode == PERSISTENT
                        and not preserved(msg)):
                    nbytes = body_size(body)
                    msg.body = swapped_marker(nbytes)
                    msg.wire = None
                    freed += nbytes
                    n += 1
                    if freed >= want and n >= count:
                        break
                if seen >= budget:
                    break
            if (freed >= want and n >= count) or seen >= budget:
                break
        else:
            self.fresh = 0  # looked at everything new
        self.swapped += n
        broker = self.broker
        broker.swapped += n
        broker.stats["swapped_out"] += n
        broker.memory -= freed
        return freed, seen

    def _swapped_in_order(self, first: Message | None) -> list[Message]:
        """Up to :data:`LOAD_BATCH` swapped pending messages in delivery order (from
        ``first`` on, if given, in its priority)."""
        out: list[Message] = []
        for p in range(PRIORITIES - 1, -1, -1):
            if first is not None and p > first.priority:
                continue
            started = first is None or first.priority > p
            for msg in self.pending[p]:
                if not started:
                    if msg is not first:
                        continue
                    started = True
                if type(msg.body) is Swapped:
                    out.append(msg)
                    if len(out) >= LOAD_BATCH:
                        return out
        return out

    def _load(self, first: Message | None = None) -> None:
        """Ask the store for the next swapped messages; dispatch goes on when they are back."""
        if self.loading or self.closed:
            return
        msgs = self._swapped_in_order(first)
        if not msgs:
            return
        self.loading = True
        self.broker.store.read_messages([m.store_id for m in msgs],
                                        lambda found: self._loaded(msgs, found))

    def _loaded(self, msgs: list[Message], found: dict[int, Message]) -> None:
        """Runs on the loop: swapped messages are back from the store."""
        self.loading = False
        if self.closed:
            return
        lost = self._restore_bodies(msgs, found)
        for msg in lost:
            self._drop_unreadable(msg)
        self.dispatch()

    def load_now(self, msgs: list[Message]) -> None:
        """Read swapped ``msgs`` back at once (blocks on the store: rare paths only)."""
        want = [m for m in msgs if type(m.body) is Swapped]
        if want:
            found = self.broker.store.read_now([m.store_id for m in want])
            for msg in self._restore_bodies(want, found):
                self._drop_unreadable(msg)

    def with_bodies(self, msgs: list[Message]) -> list[Message]:
        """``msgs`` with each swapped one replaced by a copy that has its body (read from the
        store at once; the swapped message itself stays out of memory): for a queue
        browser's snapshot. A message the store no longer has is left out."""
        want = [m.store_id for m in msgs if type(m.body) is Swapped]
        if not want:
            return msgs
        found = self.broker.store.read_now(want)
        out: list[Message] = []
        for msg in msgs:
            if type(msg.body) is Swapped:
                stored = found.get(msg.store_id)
                if stored is None:
                    continue
                copy = msg.copy()
                copy.body = stored.body
                msg = copy
            out.append(msg)
        return out

    def _restore_bodies(self, msgs: list[Message], found: dict[int, Message]) -> list[Message]:
        """Put the bodies read back on ``msgs``; returns those still swapped here whose row
        was not found."""
        broker = self.broker
        lost: list[Message] = []
        n = 0
        for msg in msgs:
            body = msg.body
            if type(body) is not Swapped or not msg.store_id:
                continue  # loaded already, or gone from here meanwhile (acked, purged, expired)
            stored = found.get(msg.store_id)
            if stored is None:
                lost.append(msg)
                continue
            msg.body = stored.body
            broker.memory += body.nbytes
            n += 1
        self.swapped -= n
        broker.swapped -= n
        broker.stats["swapped_in"] += n
        return lost

    def _drop_unreadable(self, msg: Message) -> None:
        """A swapped message the store no longer gives back: it cannot be delivered."""
        dq = self.pending[msg.priority]
        if msg not in dq:
            return
        dq.remove(msg)
        self.npending -= 1
        count = self.counts.get(msg, 0)
        self._remove(msg)
        self.broker.undeliverable(msg, self, "store_read_failed", count)

    # -- a durable subscription's tail in the store --------------------------------------

    def _read_tail(self) -> None:
        """Ask the store for the next entries of the tail; they join ``pending`` when back."""
        if self.tail_reading or self.closed or not self.tail:
            return
        broker = self.broker
        want = min(self.tail, max(broker.tail_at - self.npending, TAIL_MIN), TAIL_BATCH)
        self.tail_reading = True
        store = broker.store
        store.commit(None)  # an entry added in the unit still open is read too
        store.read_entries(self.key, self.tail_after, want,
                           lambda rows: self._tail_read(rows, want))

    def _tail_read(self, rows: list[tuple[int, int, Message | None]], want: int) -> None:
        """Runs on the loop: entries of the tail are back from the store, in order."""
        self.tail_reading = False
        if self.closed or not self.tail:
            return
        broker = self.broker
        now = broker.now()
        pending = self.pending
        lost = 0
        for sid, dcount, msg in rows:
            # ``bytes`` counted each message of the tail with its size at routing; one read
            # back has its size estimated again (an adapter's estimate may differ), so each
            # takes its share of what the tail counted, and ``bytes`` its new size.
            share = self.tail_bytes // self.tail if self.tail > 1 else self.tail_bytes
            self.tail_after = sid
            self.tail -= 1
            self.tail_bytes -= share
            if msg is None:  # does not decode (logged by the store): cannot be delivered
                lost += 1
                self.bytes -= share
                broker.store.remove_entry(self.key, sid)
                broker.store.delete_unreferenced(sid)
                continue
            self.bytes += msg.size - share
            msg.refs = 1
            broker.memory += msg.size + MESSAGE_OVERHEAD
            if dcount:
                self.counts[msg] = dcount
            if msg.expires_at:
                self.expiring += 1
            if msg.delivery_time > now:
                self._hold(msg, msg.delivery_time)
            else:
                pending[msg.priority].append(msg)
                self.npending += 1
                if self.npending == self.laggard_at:
                    broker.laggard_seen(self)
            if not self.tail:
                break
        if len(rows) < want and self.tail:
            lost += self.tail  # the store has no more of them (a failed write)
            self.bytes -= self.tail_bytes
            self.tail = self.tail_bytes = 0
        if lost:
            self.count -= lost
            self.dropped_from_store(lost)
        if self.npending and not self.dispatching:
            self.dispatch()
        elif self.tail and self.npending < broker.tail_low and self.consumers:
            self._read_tail()

    def dropped_from_store(self, n: int) -> None:
        """``n`` messages of the tail the store did not give back: counted and logged."""
        broker = self.broker
        broker.stats["dropped"] += n
        broker.store.commit(None)
        log.error("%s: %d stored messages could not be read back and are dropped", self.key, n)

    # -- consumers ------------------------------------------------------------------------

    def add_consumer(self, c: Consumer) -> None:
        self.consumers.append(c)
        if c.selector is not None and isinstance(self, QueueEndpoint):
            self.selective = True
        self.dispatch()

    def remove_consumer(self, c: Consumer) -> None:
        c.active = False
        if c in self.consumers:
            self.consumers.remove(c)
        self.selective = isinstance(self, QueueEndpoint) and any(
            x.selector is not None for x in self.consumers
        )
        if self.rr >= max(1, len(self.consumers)):
            self.rr = 0

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
        from gateway.broker import is_simple

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


def preserved(msg: Message) -> bool:
    """``JMS_GW_PRESERVE_UNDELIVERED`` read as a JMS boolean: ``true``, or the string "true" in
    any case (a protocol without typed properties sends a string); anything else is false."""
    value = msg.properties.get(PROP_PRESERVE_UNDELIVERED)
    if value is True:
        return True
    return type(value) is str and value.lower() == "true"


def requeue_all(deliveries: list[Delivery], *, count_delivery: bool = True) -> None:
    """Return several deliveries in their original order, then dispatch each endpoint once."""
    endpoints: dict[int, Endpoint] = {}
    for d in reversed(deliveries):
        ep = d.consumer.endpoint
        ep.requeue(d, count_delivery=count_delivery, dispatch=False)
        endpoints[id(ep)] = ep
    for ep in endpoints.values():
        ep.dispatch()
