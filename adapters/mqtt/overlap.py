"""A session's MQTT subscriptions, and one PUBLISH for those that overlap.

:class:`SubRecord` is one MQTT subscription of an
:class:`~adapters.mqtt.session.MqttSession` and the core consumer behind it; the functions
below keep the session's merges, called by the session as it delivers (they run on the loop
and never await).

Overlapping subscriptions. When several (non-shared) subscriptions of a session match one
message (``a`` and ``a/#``, ``a/+`` and ``a/#``), each core consumer delivers it, but the
client gets one PUBLISH: at the highest QoS granted among them (capped by the message's),
carrying every matching Subscription Identifier, with the RETAIN flag by the Retain As
Published option of the subscription with the highest QoS (the first subscribed of those, on a
tie). MQTT 5.0 §3.3.4 allows one copy or one per subscription; one is what clients expect.
The first delivery to arrive sends the PUBLISH and leaves a :class:`Merge` behind that names
the other matching subscriptions; their deliveries of that message, whenever they come (a
paused consumer's later, a detached session's after the reconnect), join the in-flight entry
and are acknowledged in the core with it (PUBACK, or PUBREC for QoS 2), or at once when the
exchange is over. At most :data:`MERGES_KEPT` merges are remembered: past that a very late
delivery would go out as a copy of its own. Shared subscriptions are never merged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from adapters.mqtt.packets import SubscriptionOptions
from adapters.mqtt.topics import mqtt_filter_to_subject
from gateway import subject
from gateway.message import Message

if TYPE_CHECKING:
    from adapters.mqtt.session import MqttSession, OutFlight
    from gateway.consumer import Delivery

# Merges of overlapping subscriptions' deliveries remembered per session: each is dropped as
# soon as every matching subscription has delivered, so only deliveries held back (a paused
# or filtered consumer) keep one; the oldest goes first past this.
MERGES_KEPT = 4096


class SubRecord:
    """One MQTT subscription of a session and the core consumer behind it."""

    __slots__ = ("filter", "options", "sub_id", "consumer", "pattern", "parent", "share",
                 "durable", "overlaps", "overlaps_version")

    def __init__(self, flt: str, options: SubscriptionOptions, sub_id: int | None) -> None:
        self.filter = flt
        self.options = options
        self.sub_id = sub_id
        self.consumer: Any = None
        # Its core subscription is the durable ``mqtt:<filter>``: it stays durable for the
        # session's life even when a resumed connection sets Session Expiry Interval 0.
        self.durable = False
        f = mqtt_filter_to_subject(flt)
        self.pattern, self.parent, self.share = f.pattern, f.parent_match, f.share
        # The session's other non-shared subscriptions whose filters intersect this one's,
        # as of the session's subs_version (matching_others).
        self.overlaps: tuple[SubRecord, ...] = ()
        self.overlaps_version = -1

    def matches(self, name: str) -> bool:
        """Whether this subscription's filter matches the subject ``name``."""
        pattern = self.pattern
        if subject.matches(pattern, name):
            return True
        # MQTT's "a/#" also matches "a" itself [MQTT-4.7.1-2].
        return self.parent and pattern.endswith(".>") and subject.matches(pattern[:-2], name)


class Merge:
    """One message that several subscriptions of a session match, sent once (module
    docstring)."""

    __slots__ = ("msg", "store_id", "waiting", "flight")

    def __init__(self, msg: Message, waiting: list[SubRecord], flight: OutFlight | None) -> None:
        self.msg = msg  # kept, so its id() is not reused while the merge lives
        # Its id in the store when it was sent: after a restart each durable subscription
        # may hold a message object of its own, and the id is what they share. (Read now:
        # the store forgets it, and the message gets a new one, when its first stored copy
        # is acknowledged before the next subscription has it -- dispatch is synchronous.)
        self.store_id = msg.store_id
        self.waiting = waiting  # the subscriptions whose delivery of it has not come yet
        self.flight = flight  # the PUBLISH it went out in (None: QoS 0, or not sent)


def matching_others(session: MqttSession, rec: SubRecord, msg: Message) -> list[SubRecord]:
    """The session's other non-shared subscriptions that get ``msg`` too."""
    if rec.overlaps_version != session.subs_version:
        rec.overlaps = tuple(r for r in session.subs.values()
                             if r is not rec and r.share is None and _intersect(r, rec))
        rec.overlaps_version = session.subs_version
    if not rec.overlaps or msg.destination is None:
        return []
    name = msg.destination.name
    own = msg.producer_conn is not None and session.core is not None and \
        msg.producer_conn == session.core.id
    return [r for r in rec.overlaps
            if r.consumer is not None and not (own and r.options.no_local)
            and r.matches(name)]


def remember_merge(session: MqttSession, m: Merge) -> None:
    merges = session.merges
    if len(merges) >= MERGES_KEPT:
        forget_merge(session, next(iter(merges.values())))
    merges[id(m.msg)] = m
    if m.store_id:
        session.merges_stored[m.store_id] = m


def forget_merge(session: MqttSession, m: Merge) -> None:
    if session.merges.get(id(m.msg)) is m:
        del session.merges[id(m.msg)]
    if m.store_id and session.merges_stored.get(m.store_id) is m:
        del session.merges_stored[m.store_id]


def join_merge(session: MqttSession, m: Merge, d: Delivery, rec: SubRecord) -> None:
    """A delivery of a message sent already for another subscription: it is settled
    with that PUBLISH, or now if that exchange is over (or went at QoS 0)."""
    m.waiting.remove(rec)
    if not m.waiting:
        forget_merge(session, m)
    f = m.flight
    if f is not None and not f.released and session.outgoing.get(f.pid) is f:
        if f.joined is None:
            f.joined = [d]
        else:
            f.joined.append(d)
    else:
        session.core_session.ack(d)


def _intersect(a: SubRecord, b: SubRecord) -> bool:
    """Whether some topic matches both subscriptions' filters (with "a/#" matching "a")."""
    pa = [a.pattern, a.pattern[:-2]] if a.parent and a.pattern.endswith(".>") else [a.pattern]
    pb = [b.pattern, b.pattern[:-2]] if b.parent and b.pattern.endswith(".>") else [b.pattern]
    return any(subject.intersects(x, y) for x in pa for y in pb)
