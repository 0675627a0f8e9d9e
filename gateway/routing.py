"""The publish path's routing: a stamped message to its destination's endpoints, and what its
producer's confirmation waits for.

How this works. :meth:`Broker.publish <gateway.broker.Broker.publish>` stamps a message,
resolves its destination and calls :func:`apply_props` when the destination's properties ask
for per-message work (security, ``sender_name``, an ``expiration`` override, tracing: EMS
User's Guide, "Destination Properties"), then one of two functions:

* :func:`route_topic` matches the topic name in the subscription index (matching never
  delivers) and puts the message on each subscription that passes its no-local and selector
  test, after the limits: the topic's ``maxmsgs`` / ``maxbytes`` with its ``overflowPolicy``
  (per subscriber: ``default`` drops for that subscriber, ``discardOld`` discards its
  oldest, ``rejectIncoming`` refuses the publish), an adapter's bound on what waits for one
  subscriber (``Subscription.bound``), and a transport's export spool
  (``Subscription.spool``). A PERSISTENT message gets its store entry on every durable
  subscription, and stays in the store only (the subscription's tail,
  :mod:`gateway.backlog`) when that subscription's backlog is deep or memory is short.
* :func:`route_queue` puts the message on its queue after the queue's limits; a PERSISTENT
  message is stored, and a deep queue has its swap pass scheduled.

Each returns ``None`` when nothing needs to be waited for, or a future: the group commit
that makes the stored message durable (:func:`commit_future`: or its last stored copy's
acknowledgement, if that comes first), the destination's flow control (EMS User's Guide,
"Flow Control", "Enforcing Flow Control"), or both (:func:`both`). The functions take the
broker first and work on its state, as its methods would.

Runs on the loop; never awaits.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from gateway.backlog import MESSAGE_OVERHEAD
from gateway.errors import LimitExceededError
from gateway.message import (
    PROP_DISABLE_SENDER,
    PROP_SENDER,
    TOPIC,
    DeliveryMode,
    Destination,
    Message,
)

if TYPE_CHECKING:
    from gateway.broker import Broker, Topic
    from gateway.endpoint import Endpoint, QueueEndpoint, Subscription

trace_log = logging.getLogger("gateway.trace")

PERSISTENT = DeliveryMode.PERSISTENT


def apply_props(broker: Broker, msg: Message, conn: Any, dest: Destination, props: Any,
                now: int) -> None:
    """Security, sender name, expiration override and tracing (EMS User's Guide,
    "Destination Properties")."""
    if conn is not None:
        if conn.kind == "CLIENT" and broker.authorization and props is not None and props.secure:
            broker.check(conn, "topic" if dest.kind == TOPIC else "queue", dest.name,
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


def route_topic(broker: Broker, topic: Topic, msg: Message,
                now: int) -> asyncio.Future[None] | None:
    """Route a topic message to every subscription whose pattern matches, each after its
    no-local and selector test, under the topic's limits and ``overflowPolicy`` (EMS User's
    Guide, "Destination Properties", overflowPolicy), an adapter's per-subscriber bound and
    a transport's export spool; store it for each durable subscription when it is
    PERSISTENT. Returns what the producer's confirmation waits for (``Broker.publish``)."""
    topic.stats_in += 1
    topic.stats_bytes_in += msg.size
    subs = broker.subs.match(topic.name)
    if not subs:
        # On a cluster node, only when no node has a subscriber either (cluster.link): the
        # cluster is one gateway to the delivery log
        if broker.log_enabled and (broker.cluster is None
                                   or not broker.cluster.wanted_elsewhere(topic.name)):
            broker.dlog.record("drop", msg, topic.dest_text, None, 0, "no_subscribers")
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
    if broker.spools:
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
    store = broker.store
    flow_limit = props.flow_control_bytes if broker.flow_control else 0
    blocked: Subscription | None = None
    for s in subs:
        sub: Subscription = s  # type: ignore[assignment]
        if persistent and sub.feed is not None:
            continue  # a durable subscription of a cluster: its feed brings these
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
                broker.stats["dropped"] += 1
                if broker.log_enabled:  # the subscriber's connection, when it has one
                    consumers = sub.consumers
                    broker.dlog.record("drop", msg, topic.dest_text,
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
                broker.stats["dropped"] += 1
                if broker.log_enabled:
                    broker.dlog.record("drop", msg, topic.dest_text, None, 0, "exceeded")
                continue
        if persistent and sub.durable:
            if not msg.store_id:
                store.put_message(msg)
            store.add_entry(sub.key, msg.store_id, 0)
            stored = True
            if sub.tail or sub.npending >= broker.tail_at or broker.memory > broker.swap_at:
                # Its backlog is deep, or memory short: the store keeps it (the tail,
                # see gateway.backlog); the backlog and the limits both are off
                # without swapping.
                sub.put_tail(msg)
                tailed = True
            else:
                msg.refs += 1
                broker.memory += msg.size + MESSAGE_OVERHEAD
                sub.put(msg, now)
        else:
            broker.memory += msg.size + MESSAGE_OVERHEAD
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
    # then there is nothing left to wait for (see commit_future) -- unless a tail holds
    # a copy, which only the commit makes durable.
    if tailed:
        fut: asyncio.Future[None] | None = commit_future(broker, msg.store_id, early=False)
    else:
        fut = commit_future(broker, msg.store_id) if stored and msg.refs > 0 else None
    if blocked is not None:
        flow: asyncio.Future[None] = broker.loop.create_future()
        blocked.flow_waiters.append(flow)
        return flow if fut is None else both(broker.loop, fut, flow)
    return fut


def route_queue(broker: Broker, q: QueueEndpoint, msg: Message,
                now: int) -> asyncio.Future[None] | None:
    """Put a queue message on its queue under the queue's limits and ``overflowPolicy`` (EMS
    User's Guide, "Destination Properties", overflowPolicy), storing it when it is
    PERSISTENT. Returns what the producer's confirmation waits for (``Broker.publish``)."""
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
        store = broker.store
        if not q.stored:
            store.put_endpoint(q.key, {"type": "queue", "name": q.name})
            q.stored = True
        if not msg.store_id:
            store.put_message(msg)
        msg.refs += 1
        store.add_entry(q.key, msg.store_id, 0)
        fut = commit_future(broker, msg.store_id)
        q.fresh += 1
        broker.memory += msg.size + MESSAGE_OVERHEAD
        q.put(msg, now)
        # Only a queue's persistent messages can be swapped: the trigger is here alone (at
        # the limit Broker._memory_full swaps whatever the message).
        if ((q.npending - q.swapped > broker.backlog_swapout or broker.memory > broker.swap_at)
                and not broker.swap_pending):
            broker.swap_soon()
    else:
        broker.memory += msg.size + MESSAGE_OVERHEAD
        q.put(msg, now)
    if q.flow_limit and q.bytes >= q.flow_limit and q.consumers:
        flow = broker.loop.create_future()
        q.flow_waiters.append(flow)
        if fut is None:
            return flow
        return both(broker.loop, fut, flow)
    return fut


def commit_future(broker: Broker, store_id: int, early: bool = True) -> asyncio.Future[None]:
    """The producer's confirmation of stored message ``store_id``: resolved by the group
    commit, or (``early``) earlier by :meth:`Broker.unstore` when its last stored copy is
    acknowledged."""
    fut: asyncio.Future[None] = broker.loop.create_future()
    confirming = broker.confirming
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

    broker.store.commit(done, failed)
    return fut


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


def resolved(loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
    """A future already resolved: a confirmation with nothing left to wait for."""
    f: asyncio.Future[None] = loop.create_future()
    f.set_result(None)
    return f


def both(loop: asyncio.AbstractEventLoop, a: asyncio.Future[None],
         b: asyncio.Future[None]) -> asyncio.Future[None]:
    """A future that resolves when ``a`` and ``b`` both have, or fails when one of them fails
    (a producer's confirmation held by its commit and by flow control or memory)."""
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
