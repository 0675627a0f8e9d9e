"""MQTT sessions on the core: what one MQTT client id holds between its connections.

How this works. Each MQTT client id has an :class:`MqttSession`, which outlives network
connections when the session is persistent (3.1.1 Clean Session 0, or MQTT 5 Session Expiry
Interval > 0) and owns:

* a core connection (client id = the MQTT client id) and one EXPLICIT-acknowledge session;
* one core subscription per MQTT subscription — durable when the session is persistent,
  so its messages are kept in the store while the client is away and across restarts,
  and deleted with the session whatever ends it (never inherited by a later session);
  ``$share/group/filter`` is a core shared subscription (shared durable when persistent);
* the outgoing in-flight window (the MQTT 5 client's Receive Maximum, else
  ``mqtt_max_inflight_messages``): packet id → the core delivery, acknowledged in the core on
  PUBACK (QoS 1) or PUBREC (QoS 2) — so a message is never lost between the core and the
  client; unacknowledged PUBLISH and PUBREL packets are sent again, with the same packet ids
  and DUP set, when the client comes back ([MQTT-4.4.0-1]);
* a bound on what waits beyond that window (``mqtt_max_queued_messages`` /
  ``_bytes``, :meth:`MqttSession.bound`), applied by the core to each of its subscriptions,
  online or offline; deliveries also pause while the connection's write buffer is full;
* the incoming QoS 2 ids awaiting PUBREL, so a re-sent PUBLISH is not published twice
  ([MQTT-4.3.3-10]: exactly once).

On a cluster node, what is in flight moves with the session when another node takes it
(:meth:`MqttSession.handover_record`, :meth:`MqttSession.take_inflight`).

Overlapping subscriptions (several of a session matching one message) get one PUBLISH
between them: :mod:`adapters.mqtt.overlap`.

The protocol logic of one network connection is :mod:`adapters.mqtt.connection`.

Runs on the loop; never awaits.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from adapters.mqtt.codec import MqttCodec, Side, encode_publish
from adapters.mqtt.overlap import (
    Merge,
    SubRecord,
    forget_merge,
    join_merge,
    matching_others,
    remember_merge,
)
from adapters.mqtt.packets import (
    Publish,
    PubRel,
    Will,
)
from gateway.client import AckMode
from gateway.consumer import Delivery
from gateway.errors import (
    GatewayError,
)
from gateway.message import Destination, Message
from mappings.mqtt import RETAIN_PROPERTY

if TYPE_CHECKING:
    from adapters.mqtt.connection import MqttConnection
    from adapters.mqtt.retained import RetainedStream
    from adapters.mqtt.server import MqttServer

log = logging.getLogger("adapters.mqtt")

MQTT_5 = 5
SESSION_NS = "mqtt.session"
# Outgoing QoS 1/2 packets in flight for persistent sessions, one record each
# (key "<client id>\x00<packet id>", value JSON [store id, released, filter]), so the same
# packet ids are used again after a gateway restart ([MQTT-4.4.0-1]).
INFLIGHT_NS = "mqtt.inflight"
NEVER = 0xFFFFFFFF  # Session Expiry Interval meaning "never expires" (MQTT 5 3.1.2.11.2)
TOO_LARGE = "packet_too_large"  # delivery log reason: over the client's Maximum Packet Size


def sent_publish(packet: bytes, level: int, aliases: dict[int, str]) -> Publish:
    """A PUBLISH we encoded at protocol ``level``, read back with its topic whole and
    no Topic Alias (``aliases``: alias → topic of the connection that sent it)."""
    codec = MqttCodec(Side.CLIENT, max_packet_size=len(packet) + 1)
    codec.protocol_level = level
    codec.receive_data(packet)
    p = codec.events_received()[0]
    assert isinstance(p, Publish)
    if "topic_alias" in p.properties:
        props = dict(p.properties)
        alias = int(props.pop("topic_alias"))
        p = Publish(p.topic or aliases.get(alias, ""), p.payload, p.qos, p.retain, p.dup,
                    p.packet_id, props)
    return p
# Retained messages sent to new subscriptions per loop turn: enough to fill a socket's write
# buffer in a few turns, few enough that a large retained set does not hold up the loop.
RETAINED_BATCH = 256


class OutFlight:
    """An outgoing QoS 1/2 PUBLISH awaiting its acknowledgement (or a PUBREL awaiting PUBCOMP)."""

    __slots__ = ("pid", "delivery", "packet", "released", "saved", "joined")

    def __init__(self, pid: int, delivery: Delivery | None, packet: bytes) -> None:
        self.pid = pid
        self.delivery = delivery
        self.packet = packet  # the encoded PUBLISH, re-sent with DUP on reconnect
        self.released = False  # PUBREC received, PUBREL sent
        self.saved = False  # recorded in the store (INFLIGHT_NS)
        # Deliveries of the same message to the session's other matching subscriptions,
        # settled with ``delivery`` (:mod:`adapters.mqtt.overlap`).
        self.joined: list[Delivery] | None = None


class MqttSession:
    """State of one client id; see the module docstring."""

    def __init__(self, server: MqttServer, client_id: str, *, persistent: bool,
                 expiry: int, level: int) -> None:
        self.server = server
        self.client_id = client_id
        self.persistent = persistent
        self.expiry = expiry  # seconds after disconnect; NEVER = never
        self.level = level
        self.core: Any = None  # gateway.client.Connection
        self.core_session: Any = None
        self.subs: dict[str, SubRecord] = {}
        self.outgoing: dict[int, OutFlight] = {}
        self.incoming_qos2: set[int] = set()
        self.next_pid = 1
        self.conn: MqttConnection | None = None
        self.will: Will | None = None
        self.will_timer: Any = None
        self.expiry_timer: Any = None
        self.receive_maximum = 65535
        self.paused = False
        self.stored = False  # a session record is in the store (SESSION_NS)
        # When the client left (wall clock, seconds; 0 while connected): in the record, so a
        # restart counts the Session Expiry Interval from there, not from the restart.
        self.left = 0.0
        # Protocol level and outgoing topic aliases (alias → topic) of the connection that
        # last sent the PUBLISH packets in ``outgoing``, to encode them anew on the next.
        self.sent_level = level
        self.sent_aliases: dict[int, str] = {}
        # Packet ids in ``outgoing`` still to be sent again on this connection: those past
        # the client's Receive Maximum wait for acknowledgements of the ones before them.
        self.resend_queue: deque[int] = deque()
        # In-flight records read from the store at start-up: pid → (store id, released, filter).
        self.restored: dict[int, tuple[int, bool, str]] = {}
        # A session another node of a cluster handed over: the packet ids its unacknowledged
        # PUBLISHes had there, by message id. They come back from JetStream and are sent
        # with those ids and DUP, as a resumed session must ([MQTT-4.4.0-1]).
        self.resend_as: dict[str, int] = {}
        # Overlapping subscriptions: merges by id() of the message, and by its store id when it
        # has one; subs_version changes whenever self.subs does, so SubRecord.overlaps is
        # computed again.
        self.merges: dict[int, Merge] = {}
        self.merges_stored: dict[int, Merge] = {}
        self.subs_version = 0
        # Retained messages new subscriptions are owed, sent a batch at a time (pump_retained).
        self.retained: list[tuple[RetainedStream, SubRecord]] = []
        self.pump_scheduled = False

    # -- core attachment --------------------------------------------------------------------

    def open_core(self, user: str | None, address: str = "") -> None:
        """The session's core connection, for ``user`` as the listener authenticated it (a
        :class:`~gateway.config.security.VerifiedUser` when its password was checked)."""
        if self.core is None:
            self.core = self.server.broker.connect(
                client_id=self.client_id, user=user, authenticated=True, protocol="mqtt",
                address=address,
            )
            self.core_session = self.core.session(AckMode.EXPLICIT)

    def subscribe(self, rec: SubRecord) -> None:
        """Create the core consumer for ``rec`` (durable when the session is persistent)."""
        durable = None
        shared = None
        if rec.share is not None:
            shared = f"mqtt/{rec.share}/{rec.pattern}"
            if self.persistent:
                durable = shared
        elif self.persistent or rec.durable:
            durable = f"mqtt:{rec.filter}"
            if rec.filter not in self.subs:
                # A new subscription never inherits what an earlier session of this client id
                # left queued under the same name ([MQTT-3.1.2-4]).
                self.drop_durable(rec.filter)
            rec.durable = True
        rec.consumer = self.core_session.consumer(
            Destination.topic(rec.pattern), listener=lambda d, r=rec: self.deliver(d, r),
            durable_name=durable, shared_name=shared, no_local=rec.options.no_local,
            parent_match=rec.parent, window=0 if self.paused else self.receive_maximum,
            share_scope="mqtt" if shared is not None else None,
        )
        self.subs_version += 1
        if rec.options.qos == 0:
            # Everything goes out at QoS 0: nothing to acknowledge, nothing to track.
            rec.consumer.core.track = False
        self.bound(rec.consumer.core.endpoint, rec.options.qos)
        if self.paused:
            rec.consumer.core.pause()

    def bound(self, sub: Any, qos: int) -> None:
        """Bound the messages queued for this session on core subscription ``sub``
        (mqtt_max_queued_messages / mqtt_max_queued_bytes, as mosquitto's max_queued_*):
        past it the core drops a QoS 0 message for this client and applies the topic's
        overflow policy to a QoS 1/2 one. Kept while the session is offline."""
        server = self.server
        if server.max_queued or server.max_queued_bytes:
            sub.bound = (server.max_queued, server.max_queued_bytes, qos == 0)

    def unsubscribe(self, rec: SubRecord, *, drop: bool) -> None:
        if rec.consumer is not None:
            rec.consumer.close()
            rec.consumer = None
        self.subs_version += 1
        if self.merges:  # its deliveries will not come now
            for m in list(self.merges.values()):
                if rec in m.waiting:
                    m.waiting.remove(rec)
                    if not m.waiting:
                        forget_merge(self, m)
        if drop and rec.share is None:
            # By name, not by ``rec.durable``: a subscription replaced while the session
            # was not persistent leaves the durable it replaced.
            self.drop_durable(rec.filter)

    def drop_durable(self, flt: str) -> None:
        """Delete this client id's durable subscription ``mqtt:<flt>`` and what it holds,
        if there is one. Needs no core connection: a session restored from the store may
        end (expiry, Clean Start) before its client ever came back."""
        broker = self.server.broker
        name = "mqtt:" + flt
        # The core names durables by scope (the client id) and name; share_scope names
        # the scope without a connection.
        try:
            broker.forget_durable(f"sub:{self.client_id}:{name}")  # here or in a cluster
        except GatewayError as exc:
            log.warning("mqtt %s: cannot delete durable subscription %s: %s",
                        self.client_id, name, exc)

    def pause(self) -> None:
        self.paused = True
        for rec in self.subs.values():
            if rec.consumer is not None:
                rec.consumer.core.pause()

    def resume(self) -> None:
        conn = self.conn
        if conn is not None and conn.write_paused:
            return  # the connection's write buffer resumes it when it drains
        self.paused = False
        for rec in self.subs.values():
            if rec.consumer is not None:
                core = rec.consumer.core
                core.paused = False
                core.set_window(self.receive_maximum)
        if self.retained:
            self.pump_retained()

    # -- delivery (core → client) -----------------------------------------------------------

    def deliver(self, d: Delivery, rec: SubRecord) -> None:
        """Core listener: send one message to the client at min(granted, message) QoS."""
        conn = self.conn
        msg = d.msg
        server = self.server
        if conn is None:  # detached: paused consumers should not get here; keep it queued
            self.core_session.release(d, count_delivery=False)
            return
        if rec.share is None and len(self.subs) > 1:
            # Overlapping subscriptions (adapters.mqtt.overlap): this message may have gone out
            # already for another subscription, or another may match it too.
            merges = self.merges
            if merges:
                m = merges.get(id(msg))
                if m is not None and m.msg is not msg:
                    m = None
                if m is None and msg.store_id:
                    m = self.merges_stored.get(msg.store_id)
                if m is not None and rec in m.waiting:
                    join_merge(self, m, d, rec)
                    return
            others = matching_others(self, rec, msg)
            if others:
                self._deliver_merged(d, rec, others, conn)
                return
        now = server.broker.now()
        exp = msg.expires_at or msg.expiration
        if exp and exp <= now:
            self.core_session.ack(d)
            return
        try:
            out, qos, topic, props = self._prepare(msg, rec, conn, now)
        except GatewayError as exc:  # a declarative mapping refused it: undeliverable
            log.warning("mqtt %s: message %s not sent: %s", self.client_id, msg.message_id, exc)
            self.core_session.reject(d, "mapping")
            return
        retain = bool(rec.options.retain_as_published and msg.properties.get(RETAIN_PROPERTY))
        if qos == 0:
            self.core_session.ack(d)
            if conn.send_publish(topic, out.payload, 0, retain, None, props) is None:
                self.drop_too_large(msg, None)
            return
        pid, dup = self.pid_for(msg)
        data = conn.send_publish(topic, out.payload, qos, retain, pid, props, dup=dup)
        if data is None:  # too large for the client: dropped as the spec requires
            self.drop_too_large(msg, d)
            return
        f = self.outgoing[pid] = OutFlight(pid, d, data)
        if self.persistent and msg.store_id and rec.share is None:
            self.save_inflight(f, msg.store_id, rec.filter)
        if len(self.outgoing) >= self.receive_maximum:
            self.pause()

    # -- overlapping subscriptions (adapters.mqtt.overlap) -----------------------------------

    def _deliver_merged(self, d: Delivery, rec: SubRecord, others: list[SubRecord],
                        conn: MqttConnection) -> None:
        """Send ``d`` once for ``rec`` and ``others`` and remember that their deliveries of
        the same message are to join it (MQTT 5.0 §3.3.4: every matching Subscription
        Identifier; QoS and Retain As Published of the subscription with the highest QoS)."""
        msg = d.msg
        now = self.server.broker.now()
        exp = msg.expires_at or msg.expiration
        recs = [r for r in self.subs.values() if r is rec or r in others]  # subscription order
        lead = recs[0]
        for r in recs:
            if r.options.qos > lead.options.qos:
                lead = r
        f: OutFlight | None = None
        if exp and exp <= now:
            self.core_session.ack(d)
        else:
            try:
                out, qos, topic, props = self._prepare(msg, lead, conn, now, recs)
            except GatewayError as exc:  # a declarative mapping refused it: undeliverable
                log.warning("mqtt %s: message %s not sent: %s", self.client_id, msg.message_id,
                            exc)
                self.core_session.reject(d, "mapping")
                return  # each other delivery tries (and is refused) on its own
            retain = bool(lead.options.retain_as_published and
                          msg.properties.get(RETAIN_PROPERTY))
            if qos == 0:
                self.core_session.ack(d)
                conn.send_publish(topic, out.payload, 0, retain, None, props)
            else:
                pid, dup = self.pid_for(msg)
                data = conn.send_publish(topic, out.payload, qos, retain, pid, props, dup=dup)
                if data is None:  # too large for the client: dropped as the spec requires
                    self.core_session.ack(d)
                else:
                    f = self.outgoing[pid] = OutFlight(pid, d, data)
                    if self.persistent and msg.store_id:
                        # Restored after a restart from the durable of the highest QoS,
                        # which does not acknowledge on delivery as a QoS 0 one does.
                        self.save_inflight(f, msg.store_id, lead.filter)
        remember_merge(self, Merge(msg, [r for r in recs if r is not rec], f))
        if f is not None and len(self.outgoing) >= self.receive_maximum:
            self.pause()

    def settle(self, f: OutFlight) -> None:
        """Acknowledge in the core every delivery ``f`` carries (PUBACK, PUBREC, PUBCOMP)."""
        d = f.delivery
        if d is not None and not d.settled:
            self.core_session.ack(d)
        joined = f.joined
        if joined is not None:
            f.joined = None
            for j in joined:
                if not j.settled:
                    self.core_session.ack(j)

    def _inflight_key(self, pid: int) -> str:
        return f"{self.client_id}\x00{pid}"

    def save_inflight(self, f: OutFlight, store_id: int, flt: str) -> None:
        store = self.server.broker.store
        store.put_kv(INFLIGHT_NS, self._inflight_key(f.pid),
                     json.dumps([store_id, f.released, flt]).encode())
        store.commit(None)
        f.saved = True

    def forget_inflight(self, pid: int) -> None:
        store = self.server.broker.store
        store.delete_kv(INFLIGHT_NS, self._inflight_key(pid))
        store.commit(None)

    def resume_restored(self) -> None:
        """After a gateway restart: send again what was in flight, with its packet ids.

        A released QoS 2 exchange gets its PUBREL; an unacknowledged PUBLISH is taken back
        from its durable subscription and sent with the same packet id and DUP set.
        """
        conn = self.conn
        assert conn is not None
        restored, self.restored = self.restored, {}
        for pid in sorted(restored):
            store_id, released, flt = restored[pid]
            if released:
                f = self.outgoing[pid] = OutFlight(pid, None, b"")
                f.released = f.saved = True
                conn.send(PubRel(pid))
                continue
            rec = self.subs.get(flt)
            d = None
            if rec is not None and rec.consumer is not None:
                d = rec.consumer.core.endpoint.claim(store_id, rec.consumer.core)
            if d is None:
                self.forget_inflight(pid)
                continue
            assert rec is not None  # claim() found it through rec
            # The other subscriptions matching it deliver it again: they join this one.
            others = matching_others(self, rec, d.msg) if rec.share is None else []
            merged = [r for r in self.subs.values() if r is rec or r in others] or None
            try:
                out, qos, topic, props = self._prepare(d.msg, rec, conn,
                                                       self.server.broker.now(), merged)
            except GatewayError:
                self.core_session.reject(d, "mapping")
                self.forget_inflight(pid)
                continue
            data = conn.send_publish(topic, out.payload, max(1, qos), False, pid, props,
                                     dup=True)
            if data is None:
                self.drop_too_large(d.msg, d)
                self.forget_inflight(pid)
                continue
            f = self.outgoing[pid] = OutFlight(pid, d, data)
            f.saved = True
            self.next_pid = max(self.next_pid, pid % 65535 + 1)
            if others:
                remember_merge(self, Merge(d.msg, others, f))

    def _prepare(self, msg: Message, rec: SubRecord, conn: MqttConnection, now: int,
                 merged: list[SubRecord] | None = None) -> tuple[Any, int, str, dict[str, Any]]:
        """The MQTT form of ``msg`` for one subscription: (mapped, QoS, topic, properties).

        ``merged``: every subscription it goes out for (``rec`` the one of the highest QoS),
        whose Subscription Identifiers it carries ([MQTT-3.3.4-3], [MQTT-3.3.4-5])."""
        server = self.server
        out = server.mapped(msg, conn.level, now)
        qos = min(rec.options.qos, out.qos)
        topic = server.mqtt_topic(msg.destination.name) if msg.destination else ""
        props = out.properties
        if conn.level >= MQTT_5:
            if merged is not None:
                ids = [r.sub_id for r in merged if r.sub_id is not None]
                if ids:
                    props = dict(props)
                    props["subscription_identifier"] = ids
            elif rec.sub_id is not None:
                props = dict(props)
                props["subscription_identifier"] = [rec.sub_id]
        return out, qos, topic, props

    def start_retained(self, rec: SubRecord) -> None:
        """A new subscription gets the retained messages its filter matches ([MQTT-3.3.1-9]),
        streamed by :meth:`pump_retained`."""
        self.retained.append((self.server.retained.stream(rec.pattern, rec.parent), rec))
        self.pump_retained()

    def pump_retained(self) -> None:
        """Send retained messages owed to new subscriptions while the session is not paused:
        at most the client's Receive Maximum unacknowledged at QoS 1 and 2 ([MQTT-3.3.4-9]),
        and no more once the socket's write buffer is full (its pause pauses the session;
        :meth:`resume` comes back here). One call sends at most ``RETAINED_BATCH`` messages,
        then lets the loop flush and serve others before the next batch."""
        self.pump_scheduled = False
        store = self.server.retained
        streams = self.retained
        budget = RETAINED_BATCH
        now = self.server.broker.now()
        while streams and budget > 0 and not self.paused and self.conn is not None:
            stream, rec = streams[0]
            if self.subs.get(rec.filter) is not rec:  # unsubscribed or replaced meanwhile
                store.close(stream)
                del streams[0]
                continue
            room = budget
            if rec.options.qos:
                room = min(room, self.receive_maximum - len(self.outgoing))
                if room <= 0:
                    self.pause()
                    break
            msgs = store.take(stream, room, now)
            for msg in msgs:
                self.deliver_retained(msg, rec)
            if stream.done:
                del streams[0]
            elif not msgs:  # scanned its share of names without a match: go on next turn
                break
            budget -= len(msgs)
        if streams and not self.paused and self.conn is not None and not self.pump_scheduled:
            self.pump_scheduled = True
            self.server.loop.call_soon(self.pump_retained)

    def deliver_retained(self, msg: Message, rec: SubRecord) -> None:
        """Send a retained message to a new subscription (retain flag set, [MQTT-3.3.1-9])."""
        conn = self.conn
        if conn is None:
            return
        try:
            out, qos, topic, props = self._prepare(msg, rec, conn, self.server.broker.now())
        except GatewayError as exc:  # a declarative mapping refused it
            log.warning("mqtt %s: retained %s not sent: %s", self.client_id, msg.message_id,
                        exc)
            return
        if qos == 0:
            if conn.send_publish(topic, out.payload, 0, True, None, props) is None:
                self.drop_too_large(msg, None)
            return
        pid = self.allocate_pid()
        data = conn.send_publish(topic, out.payload, qos, True, pid, props)
        if data is None:
            self.drop_too_large(msg, None)
        else:
            self.outgoing[pid] = OutFlight(pid, None, data)
            if len(self.outgoing) >= self.receive_maximum:
                self.pause()

    def drop_too_large(self, msg: Message, d: Delivery | None) -> None:
        """A PUBLISH larger than the client's Maximum Packet Size was not sent: the message
        is dropped for this client as if it had been sent ([MQTT-3.1.2-25]), written to the
        delivery log as a ``drop`` with reason ``packet_too_large`` and counted in the
        core's ``dropped`` (or, for a message that asks to be kept, moved to
        ``$sys.undelivered`` as any undeliverable message is)."""
        self.server.too_large += 1
        if d is not None and d.tag in self.core_session.unacked:
            self.core_session.reject(d, TOO_LARGE)
            return
        self.server.broker.count_dropped(msg, self.core.id if self.core is not None else None,
                                         TOO_LARGE)

    def allocate_pid(self) -> int:
        pid = self.next_pid
        reserved = self.resend_as.values() if self.resend_as else ()
        while pid in self.outgoing or pid in reserved:
            pid = pid % 65535 + 1
        self.next_pid = pid % 65535 + 1
        return pid

    def pid_for(self, msg: Message) -> tuple[int, bool]:
        """The packet id of a PUBLISH of ``msg``, and whether it is sent again (DUP): the
        id it had on the node this session was handed over from, else a new one."""
        if self.resend_as:
            pid = self.resend_as.pop(msg.message_id or "", None)
            if pid is not None and pid not in self.outgoing:
                return pid, True
        return self.allocate_pid(), False

    def acked(self, pid: int) -> bool:
        """PUBACK or PUBCOMP: the exchange for ``pid`` is over."""
        f = self.outgoing.pop(pid, None)
        if f is None:
            return False
        self.settle(f)
        if f.saved:
            self.forget_inflight(pid)
        if self.resend_queue and self.conn is not None:
            self._resend_next()
        elif self.paused and self.conn is not None and (
                len(self.outgoing) < self.receive_maximum):
            self.resume()
        return True

    # -- life cycle -------------------------------------------------------------------------

    def attach(self, conn: MqttConnection) -> None:
        self.conn = conn
        self.level = conn.level
        self.cancel_will()
        if self.expiry_timer is not None:
            self.expiry_timer.cancel()
            self.expiry_timer = None
        self.left = 0.0
        for rec in self.subs.values():
            if rec.consumer is not None:
                rec.consumer.core.set_window(self.receive_maximum)

    def resend_inflight(self) -> None:
        """Re-send unacknowledged PUBLISH (DUP) and PUBREL packets, in order ([MQTT-4.4.0-1]).

        No more PUBLISHes than the client's Receive Maximum are out at once, counting the
        exchanges waiting for PUBCOMP ([MQTT-3.3.4-9]; the quota starts afresh with each
        connection, 4.9): the rest are sent as acknowledgements free their places. Each
        PUBLISH is encoded anew for this connection (see
        :meth:`MqttConnection.resend_publish`); one now larger than the client's Maximum
        Packet Size is dropped as a new one would be ([MQTT-3.1.2-25])."""
        conn = self.conn
        assert conn is not None
        self.resend_queue.clear()
        budget = self.receive_maximum
        for f in list(self.outgoing.values()):
            if f.released:
                conn.send(PubRel(f.pid))
                budget -= 1
            elif budget > 0:
                if self._resend(f):
                    budget -= 1
            else:
                # Waits; kept meanwhile as this connection's level would send it, topic whole
                # and no alias, so the next connection can read it back if this one ends.
                p = sent_publish(f.packet, self.sent_level, self.sent_aliases)
                f.packet = encode_publish(p.topic, p.payload, p.qos, p.retain, False,
                                          p.packet_id, p.properties, conn.level)
                self.resend_queue.append(f.pid)

    def _resend_next(self) -> None:
        """An acknowledgement freed a place: send the next PUBLISH waiting to be re-sent."""
        while self.resend_queue:
            f = self.outgoing.get(self.resend_queue.popleft())
            if f is not None and self._resend(f):
                return
        if self.paused and len(self.outgoing) < self.receive_maximum:
            self.resume()

    def _resend(self, f: OutFlight) -> bool:
        """Send ``f`` again on this connection; False if it was dropped as too large."""
        conn = self.conn
        assert conn is not None
        data = conn.resend_publish(f.packet, self.sent_level, self.sent_aliases)
        if data is not None:
            f.packet = data
            return True
        del self.outgoing[f.pid]
        if f.delivery is not None:
            self.drop_too_large(f.delivery.msg, f.delivery)
        else:  # a retained message: nothing in the core holds it
            self.server.too_large += 1
        if f.saved:
            self.forget_inflight(f.pid)
        return False

    def detach(self, *, publish_will: bool) -> None:
        """The network connection ended; keep or end the session."""
        conn = self.conn
        if conn is not None:
            self.sent_level = conn.level
            self.sent_aliases = {a: t for t, a in conn.aliases_out.items()}
        self.conn = None
        self.resend_queue.clear()
        self.pause()
        if publish_will and self.will is not None:
            delay = int(self.will.properties.get("will_delay_interval", 0))
            if delay and self.persistent and self.expiry:
                self.will_timer = self.server.loop.call_later(
                    min(delay, self.expiry), self.publish_will)
            else:
                self.publish_will()
        else:
            self.will = None
        if not self.persistent or self.expiry == 0:
            self.end()
            return
        if self.expiry != NEVER:
            self.expiry_timer = self.server.loop.call_later(self.expiry, self.end)
        if self.level >= MQTT_5:
            # The interval (perhaps changed by the DISCONNECT) runs from now, also across a
            # restart ([MQTT-4.1.0-2]: the session state goes when it has passed).
            self.left = time.time()
            self.save()

    def cancel_will(self) -> None:
        """A new connection for the client id came before the Will Delay Interval ran out:
        the waiting will is not published, whether the connection resumes the session or
        starts a new one ([MQTT-3.1.2-8], [MQTT-3.1.3-9]; mosquitto does the same)."""
        if self.will_timer is not None:
            self.will_timer.cancel()
            self.will_timer = None
            self.will = None

    def publish_will(self) -> None:
        self.will_timer = None
        will, self.will = self.will, None
        if will is None:
            return
        self.server.publish_will(self, will)

    def end(self) -> None:
        """The session is over: its subscriptions, queued messages and core connection go."""
        if self.will_timer is not None:
            self.will_timer.cancel()
            self.publish_will()
        if self.expiry_timer is not None:
            self.expiry_timer.cancel()
            self.expiry_timer = None
        for rec in list(self.subs.values()):
            self.unsubscribe(rec, drop=True)
        self.subs.clear()
        self.forget_all_inflight()
        if self.core is not None:
            self.core.close()
            self.core = None
        self.server.forget(self)

    def forget_all_inflight(self) -> None:
        """Delete the in-flight records this session wrote to the store, and forget them."""
        for pid in [*self.outgoing, *self.restored]:
            if pid in self.restored or self.outgoing[pid].saved:
                self.forget_inflight(pid)
        self.outgoing.clear()
        self.restored.clear()

    def durable_key(self, rec: SubRecord) -> str:
        """The core's key of the durable subscription behind ``rec``."""
        if rec.share is not None:
            return f"sub:mqtt:mqtt/{rec.share}/{rec.pattern}"
        return f"sub:{self.client_id}:mqtt:{rec.filter}"

    def record(self, node: str | None = None) -> dict[str, Any]:
        """What is written to the store for a persistent session; on a cluster node, with
        the node that holds it (``node``, else this one)."""
        return {
            "node": node or self.server.broker.node_id(),
            "level": self.level,
            "expiry": self.expiry,
            "left": self.left,
            "subs": [
                [r.filter, r.options.qos, r.options.no_local, r.options.retain_as_published,
                 r.options.retain_handling, r.sub_id]
                for r in self.subs.values()
            ],
        }

    def handover_record(self, node: str) -> bytes:
        """The session's record for cluster node ``node``, which its client resumes it on,
        with what is in flight: the QoS 2 packet ids received and not yet released
        (``in``), and each unacknowledged PUBLISH or PUBREL sent (``out``: packet id,
        PUBREL sent, message id)."""
        record = self.record(node)
        record["inflight"] = {
            "in": sorted(self.incoming_qos2),
            "out": [[f.pid, f.released,
                     f.delivery.msg.message_id or "" if f.delivery is not None else ""]
                    for f in self.outgoing.values()],
        }
        return json.dumps(record).encode()

    def take_inflight(self, inflight: dict[str, Any]) -> None:
        """What a session handed over by another node had in flight (handover_record):
        PUBREL is sent again for what the client had received, the PUBLISHes come back
        from JetStream with their packet ids (:meth:`pid_for`)."""
        self.incoming_qos2.update(int(pid) for pid in inflight.get("in", ()))
        for pid, released, message_id in inflight.get("out", ()):
            if released:
                f = self.outgoing[int(pid)] = OutFlight(int(pid), None, b"")
                f.released = True
            elif message_id:
                self.resend_as[str(message_id)] = int(pid)

    def save(self) -> None:
        """Write the session record while the session is persistent; delete it once a
        resumed connection made it end with the connection (Session Expiry Interval 0)."""
        broker = self.server.broker
        if self.persistent:
            record = json.dumps(self.record()).encode()
            broker.store.put_kv(SESSION_NS, self.client_id, record)
            broker.store.commit(None)
            broker.share_record(SESSION_NS, self.client_id, record)  # a cluster's nodes
            self.stored = True
        elif self.stored:
            broker.store.delete_kv(SESSION_NS, self.client_id)
            broker.store.commit(None)
            broker.share_record(SESSION_NS, self.client_id, None)
            self.stored = False
