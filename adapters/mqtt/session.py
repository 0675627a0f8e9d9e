"""MQTT sessions on the core: what one MQTT client id holds between its connections.

How this works. Each MQTT client id has an :class:`MqttSession`, which outlives network
connections when the session is persistent (3.1.1 Clean Session 0, or MQTT 5 Session Expiry
Interval > 0) and owns:

* a core connection (client id = the MQTT client id) and one EXPLICIT-acknowledge session;
* one core subscription per MQTT subscription — durable when the session is persistent,
  so its messages are kept in the store while the client is away and across restarts;
  ``$share/group/filter`` is a core shared subscription (shared durable when persistent);
* the outgoing in-flight window: packet id → the core delivery, acknowledged in the core on
  PUBACK (QoS 1) or PUBREC (QoS 2) — so a message is never lost between the core and the
  client; unacknowledged PUBLISH and PUBREL packets are sent again, with the same packet ids
  and DUP set, when the client comes back ([MQTT-4.4.0-1]);
* the incoming QoS 2 ids awaiting PUBREL, so a re-sent PUBLISH is not published twice
  ([MQTT-4.3.3-10]: exactly once).

The protocol logic of one network connection is :mod:`adapters.mqtt.connection`.

Runs on the loop; never awaits.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from adapters.mqtt.packets import (
    PubRel,
    SubscriptionOptions,
    Will,
)
from adapters.mqtt.topics import (
    mqtt_filter_to_subject,
)
from gateway.client import AckMode
from gateway.endpoint import Delivery
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
# Retained messages sent to new subscriptions per loop turn: enough to fill a socket's write
# buffer in a few turns, few enough that a large retained set does not hold up the loop.
RETAINED_BATCH = 256


class SubRecord:
    """One MQTT subscription of a session and the core consumer behind it."""

    __slots__ = ("filter", "options", "sub_id", "consumer", "pattern", "parent", "share")

    def __init__(self, flt: str, options: SubscriptionOptions, sub_id: int | None) -> None:
        self.filter = flt
        self.options = options
        self.sub_id = sub_id
        self.consumer: Any = None
        f = mqtt_filter_to_subject(flt)
        self.pattern, self.parent, self.share = f.pattern, f.parent_match, f.share


class OutFlight:
    """An outgoing QoS 1/2 PUBLISH awaiting its acknowledgement (or a PUBREL awaiting PUBCOMP)."""

    __slots__ = ("pid", "delivery", "packet", "released", "saved")

    def __init__(self, pid: int, delivery: Delivery | None, packet: bytes) -> None:
        self.pid = pid
        self.delivery = delivery
        self.packet = packet  # the encoded PUBLISH, re-sent with DUP on reconnect
        self.released = False  # PUBREC received, PUBREL sent
        self.saved = False  # recorded in the store (INFLIGHT_NS)


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
        # In-flight records read from the store at start-up: pid → (store id, released, filter).
        self.restored: dict[int, tuple[int, bool, str]] = {}
        # Retained messages new subscriptions are owed, sent a batch at a time (pump_retained).
        self.retained: list[tuple[RetainedStream, SubRecord]] = []
        self.pump_scheduled = False

    # -- core attachment --------------------------------------------------------------------

    def open_core(self, user: str | None) -> None:
        if self.core is None:
            self.core = self.server.broker.connect(
                client_id=self.client_id, user=user, authenticated=True, protocol="mqtt",
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
        elif self.persistent:
            durable = f"mqtt:{rec.filter}"
        rec.consumer = self.core_session.consumer(
            Destination.topic(rec.pattern), listener=lambda d, r=rec: self.deliver(d, r),
            durable_name=durable, shared_name=shared, no_local=rec.options.no_local,
            parent_match=rec.parent, window=0 if self.paused else self.receive_maximum,
            share_scope="mqtt" if shared is not None else None,
        )
        if rec.options.qos == 0:
            # Everything goes out at QoS 0: nothing to acknowledge, nothing to track.
            rec.consumer.core.track = False
        if self.paused:
            rec.consumer.core.pause()

    def unsubscribe(self, rec: SubRecord, *, drop: bool) -> None:
        if rec.consumer is not None:
            rec.consumer.close()
            rec.consumer = None
        if drop and self.persistent and rec.share is None:
            try:
                self.core_session.unsubscribe(f"mqtt:{rec.filter}")
            except GatewayError:
                pass

    def pause(self) -> None:
        self.paused = True
        for rec in self.subs.values():
            if rec.consumer is not None:
                rec.consumer.core.pause()

    def resume(self) -> None:
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
            conn.send_publish(topic, out.payload, 0, retain, None, props)
            return
        pid = self.allocate_pid()
        data = conn.send_publish(topic, out.payload, qos, retain, pid, props)
        if data is None:  # too large for the client: dropped as the spec requires
            self.core_session.ack(d)
            return
        f = self.outgoing[pid] = OutFlight(pid, d, data)
        if self.persistent and msg.store_id and rec.share is None:
            self.save_inflight(f, msg.store_id, rec.filter)
        if len(self.outgoing) >= self.receive_maximum:
            self.pause()

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
            try:
                out, qos, topic, props = self._prepare(d.msg, rec, conn,
                                                       self.server.broker.now())
            except GatewayError:
                self.core_session.reject(d, "mapping")
                self.forget_inflight(pid)
                continue
            data = conn.send_publish(topic, out.payload, max(1, qos), False, pid, props,
                                     dup=True)
            if data is None:
                self.core_session.ack(d)
                self.forget_inflight(pid)
                continue
            f = self.outgoing[pid] = OutFlight(pid, d, data)
            f.saved = True
            self.next_pid = max(self.next_pid, pid % 65535 + 1)

    def _prepare(self, msg: Message, rec: SubRecord, conn: MqttConnection,
                 now: int) -> tuple[Any, int, str, dict[str, Any]]:
        """The MQTT form of ``msg`` for one subscription: (mapped, QoS, topic, properties)."""
        server = self.server
        out = server.mapped(msg, conn.level, now)
        qos = min(rec.options.qos, out.qos)
        topic = server.mqtt_topic(msg.destination.name) if msg.destination else ""
        props = out.properties
        if conn.level >= MQTT_5 and rec.sub_id is not None:
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
            conn.send_publish(topic, out.payload, 0, True, None, props)
            return
        pid = self.allocate_pid()
        data = conn.send_publish(topic, out.payload, qos, True, pid, props)
        if data is not None:
            self.outgoing[pid] = OutFlight(pid, None, data)
            if len(self.outgoing) >= self.receive_maximum:
                self.pause()

    def allocate_pid(self) -> int:
        pid = self.next_pid
        while pid in self.outgoing:
            pid = pid % 65535 + 1
        self.next_pid = pid % 65535 + 1
        return pid

    def acked(self, pid: int) -> bool:
        """PUBACK or PUBCOMP: the exchange for ``pid`` is over."""
        f = self.outgoing.pop(pid, None)
        if f is None:
            return False
        if f.delivery is not None and not f.delivery.settled:
            self.core_session.ack(f.delivery)
        if f.saved:
            self.forget_inflight(pid)
        if self.paused and self.conn is not None and len(self.outgoing) < self.receive_maximum:
            self.resume()
        return True

    # -- life cycle -------------------------------------------------------------------------

    def attach(self, conn: MqttConnection) -> None:
        self.conn = conn
        self.level = conn.level
        if self.will_timer is not None:  # [MQTT-3.1.3-9]: back before the will delay ran out
            self.will_timer.cancel()
            self.will_timer = None
            self.will = None
        if self.expiry_timer is not None:
            self.expiry_timer.cancel()
            self.expiry_timer = None
        for rec in self.subs.values():
            if rec.consumer is not None:
                rec.consumer.core.set_window(self.receive_maximum)

    def resend_inflight(self) -> None:
        """Re-send unacknowledged PUBLISH (DUP) and PUBREL packets, in order ([MQTT-4.4.0-1])."""
        conn = self.conn
        assert conn is not None
        for f in list(self.outgoing.values()):
            if f.released:
                conn.send(PubRel(f.pid))
            else:
                conn.write(bytes([f.packet[0] | 0x08]) + f.packet[1:])

    def detach(self, *, publish_will: bool) -> None:
        """The network connection ended; keep or end the session."""
        self.conn = None
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
        elif self.expiry != NEVER:
            self.expiry_timer = self.server.loop.call_later(self.expiry, self.end)

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
            if self.core_session is not None:
                self.unsubscribe(rec, drop=True)
        self.subs.clear()
        for pid in [*self.outgoing, *self.restored]:
            if pid in self.restored or self.outgoing[pid].saved:
                self.forget_inflight(pid)
        self.outgoing.clear()
        self.restored.clear()
        if self.core is not None:
            self.core.close()
            self.core = None
        self.server.forget(self)

    def record(self) -> dict[str, Any]:
        """What is written to the store for a persistent session."""
        return {
            "level": self.level,
            "expiry": self.expiry,
            "subs": [
                [r.filter, r.options.qos, r.options.no_local, r.options.retain_as_published,
                 r.options.retain_handling, r.sub_id]
                for r in self.subs.values()
            ],
        }

    def save(self) -> None:
        if self.persistent:
            store = self.server.broker.store
            store.put_kv(SESSION_NS, self.client_id, json.dumps(self.record()).encode())
            store.commit(None)
