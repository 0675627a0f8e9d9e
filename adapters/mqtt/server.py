"""The MQTT listener: a thin asyncio shell around :mod:`adapters.mqtt.connection`.

How this works. :func:`start` is the registry entry for ``listen = mqtt://host:port`` (and
``mqtts://`` with the gateway's TLS certificate). Each TCP connection gets an
:class:`MqttProtocol` that does four things: feed bytes to its :class:`MqttConnection`
(codec → session → core), collect what it writes, write it once per loop turn, and pause
the core's deliveries when the socket's write buffer is full. The same connection logic
serves MQTT over WebSocket (subprotocol ``mqtt``) on the HTTP listener.

:class:`MqttServer` holds what all connections share: the sessions by client id, the
retained messages, and the per-message encoding caches that let one message reach many
subscribers with one mapping and (for QoS 0) one encoding per protocol level.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from adapters.listener import BatchedProtocol, Listener, LogLimiter, listen, skipped_text
from adapters.mqtt.codec import encode_publish
from adapters.mqtt.connection import MqttConnection, publish_reason
from adapters.mqtt.overlap import SubRecord
from adapters.mqtt.packets import Publish, ReasonCode, SubscriptionOptions, Will
from adapters.mqtt.retained import NAMESPACE as RETAINED_NS
from adapters.mqtt.retained import RetainedStore
from adapters.mqtt.session import INFLIGHT_NS, NEVER, SESSION_NS, MqttSession
from adapters.mqtt.topics import mqtt_topic_to_subject, subject_to_mqtt_topic
from gateway.errors import GatewayError, InvalidDestinationError
from gateway.facade import Core
from gateway.message import TEMP_PREFIX, TOPIC, Destination, Message
from mappings.engine import default_wire, log_deliveries
from mappings.mqtt import MqttOut

log = logging.getLogger("adapters.mqtt")

# Largest packet we accept. MQTT allows 268,435,455 bytes; like mosquitto's
# message_size_limit we default lower, and the gateway's max_client_msg_size lowers it more.
DEFAULT_MAX_PACKET_SIZE = 16 * 1024 * 1024
TOPIC_CACHE_SIZE = 10_000  # mapped topic names kept; cleared whole when full


class MqttServer:
    """State shared by every MQTT connection of one gateway."""

    def __init__(self, broker: Core) -> None:
        self.broker = broker
        self.loop: asyncio.AbstractEventLoop = broker.loop
        limit = int(broker.config.gateway.max_client_msg_size)
        self.max_packet_size = min(limit, DEFAULT_MAX_PACKET_SIZE) if limit else DEFAULT_MAX_PACKET_SIZE
        gw = broker.config.gateway
        # Session bounds, as mosquitto's max_inflight_messages / max_queued_messages /
        # max_queued_bytes (gateway.conf; see the MQTT README, "Slow consumers").
        self.max_inflight = int(gw.mqtt_max_inflight_messages) or 65535
        self.max_queued = int(gw.mqtt_max_queued_messages)
        self.max_queued_bytes = int(gw.mqtt_max_queued_bytes)
        self.max_keepalive = int(gw.mqtt_max_keepalive)
        self.too_large = 0  # messages dropped: over a client's Maximum Packet Size
        kv = getattr(broker, "kv", {})
        self.retained = RetainedStore(
            broker.store, kv.get(RETAINED_NS),
            share=lambda name, blob: broker.share_record(RETAINED_NS, name, blob))
        # On a cluster node, retained messages and persistent sessions are the cluster's
        # (cluster/records.py): what other nodes retained is retained here too, and a
        # session saved by another node is the one a client resumes here.
        for name, blob in broker.shared_records(RETAINED_NS).items():
            self.retained.apply(name, blob)
        broker.watch_shared(RETAINED_NS, self.retained.apply)
        broker.watch_shared(SESSION_NS, self._session_elsewhere)
        sources = getattr(broker, "info_sources", None)
        if sources is not None:
            sources.append(self.info)
        self.sessions: dict[str, MqttSession] = {}
        self.connections: set[MqttConnection] = set()
        # The default mapping (mqtt_to_message / message_to_mqtt while the rows are the ones
        # they are written for), taken once: it is the same for the gateway's life.
        self.to_message: Callable[..., Message] = default_wire("mqtt", "in")
        self.to_mqtt: Callable[..., MqttOut] = default_wire("mqtt", "out")
        self._map_key: tuple[int, int, int] | None = None
        self._map_msg: Message | None = None
        self._map_out: MqttOut | None = None
        self._enc_key: tuple[Any, ...] | None = None
        self._enc_out = b""
        self._subjects: dict[str, str] = {}  # MQTT topic → subject, for the publish path
        self._refused_log = LogLimiter()  # refusals answered by no reason code (3.1.1, QoS 0)
        self._topics: dict[str, str] = {}  # subject → MQTT topic, for the delivery path
        # Connections written to while a read is processed: flushed once when it ends.
        self.reading = False
        self.dirty: list[MqttProtocol] = []
        self._restore_sessions(kv.get(SESSION_NS, {}), kv.get(INFLIGHT_NS, {}))

    # -- sessions ---------------------------------------------------------------------------

    def _restore_sessions(self, records: dict[str, bytes], inflight: dict[str, bytes]) -> None:
        """Persistent sessions from the store: detached until their client comes back."""
        flights: dict[str, dict[int, tuple[int, bool, str]]] = {}
        for key, raw in inflight.items():
            cid, _, pid = key.rpartition("\x00")
            try:
                store_id, released, flt = json.loads(bytes(raw))
                flights.setdefault(cid, {})[int(pid)] = (int(store_id), bool(released), flt)
            except (ValueError, TypeError):
                self.broker.store.delete_kv(INFLIGHT_NS, key)
        now = time.time()
        ended: list[MqttSession] = []
        for cid, raw in records.items():
            try:
                session, rec = self._session_from_record(cid, bytes(raw))
            except (ValueError, KeyError, TypeError, InvalidDestinationError) as exc:
                log.warning("dropping unreadable MQTT session record %r: %s", cid, exc)
                self.broker.store.delete_kv(SESSION_NS, cid)
                continue
            session.restored = flights.pop(cid, {})
            for sub in session.subs.values():  # the store kept the queue: bound it again
                durable = self.broker.durable(session.durable_key(sub))
                if durable is not None:
                    session.bound(durable, sub.options.qos)
            self.sessions[cid] = session
            if session.expiry != NEVER:
                # Counted from when the client left, if the record says ([MQTT-4.1.0-2]).
                left = float(rec.get("left") or 0) or now
                due = session.expiry - max(0.0, now - left)
                if due <= 0:
                    ended.append(session)
                else:
                    session.expiry_timer = self.loop.call_later(due, session.end)
        for session in ended:  # expired while the gateway was down
            session.end()
        for cid, orphans in flights.items():  # records of sessions that are gone
            for orphan in orphans:
                self.broker.store.delete_kv(INFLIGHT_NS, f"{cid}\x00{orphan}")
        self._drop_orphan_durables()

    def _session_from_record(self, cid: str, raw: bytes) -> tuple[MqttSession, Any]:
        """A detached persistent session from its record (the store's, or the cluster's).

        Raises:
            ValueError, KeyError, TypeError, InvalidDestinationError: a bad record.
        """
        rec = json.loads(raw)
        session = MqttSession(self, cid, persistent=True, expiry=int(rec["expiry"]),
                              level=int(rec.get("level", 4)))
        for flt, qos, nl, rap, rh, sid in rec["subs"]:
            opts = SubscriptionOptions(int(qos), bool(nl), bool(rap), int(rh))
            sub = session.subs[flt] = SubRecord(flt, opts, sid)
            sub.durable = sub.share is None
        session.paused = True
        session.stored = True
        return session, rec

    def holder(self, cid: str) -> str | None:
        """On a cluster node: the node that holds the session of ``cid``, when another one
        does (as the shared records say), which hands it over (:meth:`hand_over`) before a
        CONNECT here is answered."""
        me = self.broker.node_id()
        shared = self.broker.shared_record(SESSION_NS, cid) if me is not None else None
        if shared is None:
            return None
        try:
            node = json.loads(shared).get("node")
        except (ValueError, AttributeError):
            return None
        return str(node) if node and node != me else None

    def adopt(self, cid: str, handed: bytes | None = None) -> None:
        """Before a CONNECT of ``cid`` is answered on a cluster node: make this node's
        session of that client id the cluster's. The record the node that held it handed
        over (``handed``), else one another node saved since this one last had it (or one
        this node never had), replaces what is here; its durable subscriptions are the
        cluster's, and resume here."""
        shared = handed or self.broker.shared_record(SESSION_NS, cid)
        if shared is None:
            return
        local = self.sessions.get(cid)
        if local is not None:
            if local.conn is not None or json.dumps(local.record()).encode() == shared:
                return
            self.release(local)
        try:
            session, rec = self._session_from_record(cid, shared)
            session.take_inflight(rec.get("inflight") or {})
        except (ValueError, KeyError, TypeError, InvalidDestinationError) as exc:
            log.warning("mqtt %s: unreadable shared session record: %s", cid, exc)
            return
        self.sessions[cid] = session

    def hand_over(self, cid: str, node: str) -> bytes | None:
        """Cluster node ``node`` asks for the session of ``cid``, whose client connected
        there: its connection here, if any, is taken over ([MQTT-3.1.4-3]), its state
        written to the shared records for ``node`` and given as the answer, and the session
        let go of (None: this node holds no persistent session of ``cid``)."""
        session = self._taken_over(cid)
        if session is None:
            return None
        record = session.handover_record(node)
        self.broker.share_record(SESSION_NS, cid, record)
        self.release(session)
        return record

    def _session_elsewhere(self, cid: str, record: bytes | None) -> None:
        """Another node saved (or ended) the session of ``cid``: its client is there, so
        this node's copy, if its client is not connected here, is let go (not when the
        record names this node: a session handed over to this one)."""
        session = self.sessions.get(cid)
        if session is None or session.conn is not None:
            return
        if record is not None:
            try:
                if json.loads(record).get("node") == self.broker.node_id():
                    return
            except (ValueError, AttributeError):
                pass
        self.release(session)

    def release(self, session: MqttSession) -> None:
        """Let go of ``session`` on this node without ending it: its client resumed it on
        another node of the cluster, which holds it now. Its durable subscriptions stay the
        cluster's (what this node held of them goes back); its will and expiry are the
        other node's business."""
        if session.will_timer is not None:
            session.will_timer.cancel()
            session.will_timer = None
        session.will = None
        if session.expiry_timer is not None:
            session.expiry_timer.cancel()
            session.expiry_timer = None
        if session.core is not None:
            session.core.close()  # its consumers go: what they held comes back
            session.core = None
        for rec in session.subs.values():
            rec.consumer = None
            self.broker.release_durable(session.durable_key(rec))
        session.forget_all_inflight()
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        store = self.broker.store
        store.delete_kv(SESSION_NS, session.client_id)
        store.commit(None)

    def _drop_orphan_durables(self) -> None:
        """Delete the core's ``mqtt:<filter>`` durables that no restored session holds (a
        session that ended while its durables stayed, or a stop between creating a durable
        and writing the session record): their messages belong to no session, and a later
        session of that client id must not inherit them ([MQTT-3.1.2-4])."""
        broker = self.broker
        for sub in broker.durable_subscriptions():
            name = sub.name or ""
            if sub.shared or not name.startswith("mqtt:") or sub.client_id is None:
                continue
            session = self.sessions.get(sub.client_id)
            if session is not None and name[5:] in session.subs:
                continue
            log.info("mqtt %s: deleting durable subscription %s of no session",
                     sub.client_id, name)
            try:
                broker.unsubscribe(None, name, share_scope=sub.client_id)
            except GatewayError as exc:
                log.warning("mqtt %s: cannot delete durable subscription %s: %s",
                            sub.client_id, name, exc)

    def restore_subscriptions(self, session: MqttSession) -> None:
        for rec in session.subs.values():
            if rec.consumer is None:
                try:
                    session.subscribe(rec)
                except GatewayError as exc:
                    log.warning("mqtt %s: cannot restore subscription %s: %s",
                                session.client_id, rec.filter, exc)

    def forget(self, session: MqttSession) -> None:
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        store = self.broker.store
        store.delete_kv(SESSION_NS, session.client_id)
        store.commit(None)
        if session.stored:
            self.broker.share_record(SESSION_NS, session.client_id, None)

    def authenticate(self, username: str | None, password: bytes | None) -> str | None:
        """The user a CONNECT's User Name and Password connect as (``None``: anonymous), by
        the core's rules (:meth:`gateway.broker.Broker.authenticate`): anyone with
        ``authorization`` disabled, ``users.conf`` with it enabled. A User Name without a
        Password is a User Name with an empty password (MQTT 3.1.1 and 5.0 §3.1.2.9 allow
        it); a Password is Binary Data (MQTT 5.0 §3.1.3.6), read as UTF-8 to compare it.

        Raises:
            SecurityError: refused; the caller answers CONNACK 0x86 / 4 when a User Name
                was given, 0x87 / 5 when not.
        """
        pw = None if password is None else password.decode("utf-8", "replace")
        user: str | None = self.broker.authenticate(username, pw)
        return user

    # -- publishing (client → core) ---------------------------------------------------------

    def info(self) -> dict[str, Any]:
        """What /api/v1/server adds for MQTT: the retained messages, held outside
        ``max_msg_memory`` (they are each topic's last value, not messages waiting to be
        delivered), as their count and encoded bytes."""
        return {"mqtt_retained": len(self.retained),
                "mqtt_retained_bytes": self.retained.nbytes}

    def publish(self, level: int, session: MqttSession, topic: str,
                p: Publish) -> tuple[int, Any]:
        """Publish a client's PUBLISH into the core; returns (reason code, future or None)."""
        name = self._subjects.get(topic)
        if name is None:
            try:
                name = mqtt_topic_to_subject(topic)
            except InvalidDestinationError:
                return ReasonCode.TOPIC_NAME_INVALID, None
            if len(self._subjects) >= TOPIC_CACHE_SIZE:
                self._subjects.clear()
            self._subjects[topic] = name
        if name.startswith("$"):
            # $-topics are the server's ([MQTT-4.7.2]), but for replies: the Response Topic a
            # JMS or AMQP requester's temporary queue or topic is rendered as (``$TMP$/...``).
            temporary = self._temporary(name)
            if temporary is None:
                return ReasonCode.TOPIC_NAME_INVALID, None
            dest = temporary
        else:
            dest = Destination.topic(name)
        reply_to = None
        rt = p.properties.get("response_topic") if level >= 5 else None
        if rt:
            try:
                reply_to = Destination.topic(mqtt_topic_to_subject(rt))
            except InvalidDestinationError:
                return ReasonCode.TOPIC_NAME_INVALID, None
        now = self.broker.now()
        mappings = self.broker.mappings
        if mappings is None:  # raises PayloadFormatInvalid (the session answers 0x99)
            msg = self.to_message(payload=p.payload, qos=p.qos, retain=p.retain,
                                  properties=p.properties, level=level,
                                  destination=dest, reply_to=reply_to, now_ms=now)
        else:
            # The declarative mappings' wire side for this destination (mqtt_to_message itself
            # unless a rule replaces or extends a default rule here), then the core-side rules.
            to_message = mappings.wire_for(dest, protocol="mqtt", direction="in")
            try:
                msg = to_message(payload=p.payload, qos=p.qos, retain=p.retain,
                                 properties=p.properties, level=level,
                                 destination=dest, reply_to=reply_to, now_ms=now)
                msg = mappings.apply(msg, protocol="mqtt", direction="in")
            except GatewayError as exc:  # a declarative mapping refused it
                log.info("mqtt %s: publish to %s refused by a mapping: %s",
                         session.client_id, topic, exc)
                return ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, None
        try:
            fut = session.core_session.send(msg, None, now)
        except GatewayError as exc:
            if level < 5 or p.qos == 0:
                skipped = self._refused_log.allow()
                if skipped is not None:
                    log.info("mqtt %s: publish to %s refused: %s%s", session.client_id, topic,
                             exc, skipped_text(skipped))
            return publish_reason(exc), None
        if p.retain and dest.kind is TOPIC:
            self.retained.set(name, msg if p.payload else None)
        return ReasonCode.SUCCESS, fut

    def _temporary(self, name: str) -> Destination | None:
        """The temporary queue or topic named ``name`` (``$TMP$.…``), if it exists."""
        if not name.startswith(TEMP_PREFIX):
            return None
        broker = self.broker
        for dest in (Destination.queue(name), Destination.topic(name)):
            if broker.exists(dest):
                return dest
        return None

    def publish_will(self, session: MqttSession, will: Will) -> None:
        if session.core_session is None:
            return
        p = Publish(will.topic, will.payload, will.qos, will.retain, False, None,
                    dict(will.properties))
        conn = session.conn
        level = conn.level if conn is not None else session.level
        reason, _ = self.publish(level, session, will.topic, p)
        if reason >= 0x80:
            log.info("mqtt %s: will message to %s refused (reason 0x%02x)",
                     session.client_id, will.topic, reason)

    # -- per-message caches (core → client) --------------------------------------------------

    def mqtt_topic(self, name: str) -> str:
        """The MQTT topic for a subject, cached (the delivery path asks once per message)."""
        topic = self._topics.get(name)
        if topic is None:
            if len(self._topics) >= TOPIC_CACHE_SIZE:
                self._topics.clear()
            topic = self._topics[name] = subject_to_mqtt_topic(name)
        return topic

    def mapped(self, msg: Message, level: int, now: int) -> MqttOut:
        """The MQTT form of ``msg`` for a protocol level, computed once per message."""
        # Identity, level class and (for expiring messages) the second: the remaining
        # expiry interval is per second.
        exp = msg.expires_at or msg.expiration
        key = (id(msg), 5 if level >= 5 else 4, now // 1000 if exp else 0)
        if key == self._map_key and self._map_msg is msg and self._map_out is not None:
            return self._map_out
        mapped = msg
        to_mqtt = self.to_mqtt
        mappings = self.broker.mappings
        if mappings is not None and msg.destination is not None:
            # Raises MappingFailed: the caller refuses the delivery. The core-side rules, then
            # the wire side (message_to_mqtt unless a rule changes the defaults here).
            mapped = mappings.apply(msg, protocol="mqtt", direction="out")
            to_mqtt = mappings.wire_for(msg.destination, protocol="mqtt", direction="out")
        out = to_mqtt(mapped, level=level, now_ms=now, reply_topic=_reply_topic(mapped))
        self._map_key, self._map_out, self._map_msg = key, out, msg
        return out

    def encoded(self, topic: str, payload: bytes, qos: int, retain: bool, pid: int | None,
                props: dict[str, Any], level: int) -> bytes:
        """Encode a PUBLISH; QoS 0 encodings are reused for the next subscriber of the same message."""
        if qos:
            return encode_publish(topic, payload, qos, retain, False, pid, props, level)
        key = (topic, id(payload), id(props), retain, level)
        if key == self._enc_key:
            return self._enc_out
        data = encode_publish(topic, payload, 0, retain, False, None, props, level)
        self._enc_key, self._enc_out = key, data
        return data

    # -- admin ------------------------------------------------------------------------------

    def session_rows(self) -> list[dict[str, Any]]:
        """The admin view of every session, connected or not: its in-flight window and what
        waits for it in the core (``queued``: beyond the window; ``dropped``: missed past
        ``mqtt_max_queued_*`` or the topic's limits)."""
        rows = []
        for session in list(self.sessions.values()):
            subs: list[dict[str, Any]] = []
            for rec in session.subs.values():
                ep = rec.consumer.core.endpoint if rec.consumer is not None else None
                if ep is None:
                    ep = self.broker.durable(f"sub:{session.client_id}:mqtt:{rec.filter}")
                subs.append({
                    "filter": rec.filter, "qos": rec.options.qos,
                    "queued": ep.npending + ep.tail + len(ep.held) if ep is not None else 0,
                    "bytes": ep.bytes if ep is not None else 0,
                    "dropped": ep.dropped if ep is not None else 0,
                    "discarded": ep.stats_discarded if ep is not None else 0,
                })
            conn = session.conn
            rows.append({
                "client_id": session.client_id,
                "connected": conn is not None,
                "persistent": session.persistent,
                "in_flight": len(session.outgoing),
                "max_in_flight": session.receive_maximum,
                "paused": session.paused,
                "write_paused": conn.write_paused if conn is not None else False,
                "queued": sum(s["queued"] for s in subs),
                "dropped": sum(s["dropped"] for s in subs),
                "subscriptions": subs,
            })
        return rows

    # -- shutdown ---------------------------------------------------------------------------

    def take_over(self, client_id: str) -> None:
        """The client ``client_id`` connected to another node of the cluster: its
        connection here, if any, is taken over as by a CONNECT here ([MQTT-3.1.4-3])."""
        session = self._taken_over(client_id)
        if session is not None:
            self.release(session)

    def _taken_over(self, cid: str) -> MqttSession | None:
        """Disconnect the client ``cid`` connected here, if it is, as a CONNECT on another
        node takes it over; its persistent session, which outlives the connection (None if
        there is none)."""
        session = self.sessions.get(cid)
        if session is not None and session.conn is not None:
            session.conn.disconnect(ReasonCode.SESSION_TAKEN_OVER,
                                    "session taken over on another node")
            session = self.sessions.get(cid)
        return session if session is not None and session.conn is None else None

    def close(self) -> None:
        for conn in list(self.connections):
            conn.disconnect(ReasonCode.SERVER_SHUTTING_DOWN, "server shutting down")


def _reply_topic(msg: Message) -> str | None:
    rt = msg.reply_to
    if rt is None:
        return None
    return subject_to_mqtt_topic(rt.name)


class MqttProtocol(BatchedProtocol):
    """The asyncio shell of one MQTT TCP connection (writes batched per read, see
    :class:`adapters.listener.BatchedProtocol`)."""

    server: MqttServer
    conn: MqttConnection | None

    protocol_name = "mqtt"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        address = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.conn = MqttConnection(self.server, self.write, self.close, address)
        self.conn.pause_reading = self.pause_reading
        self.conn.resume_reading = self.resume_reading
        self.watch(self.server.broker, transport, address)
        self.server.connections.add(self.conn)

    def pause_reading(self) -> None:
        t = self.transport
        if t is not None and not t.is_closing():
            t.pause_reading()

    def resume_reading(self) -> None:
        t = self.transport
        if t is not None and not t.is_closing():
            t.resume_reading()


def shared_server(broker: Core) -> MqttServer:
    """One MqttServer per broker, shared by the TCP, TLS and WebSocket listeners."""
    server: MqttServer | None = broker.adapter_servers.get("mqtt")
    if server is None:
        from adapters.mqtt import websocket

        server = MqttServer(broker)
        broker.adapter_servers["mqtt"] = server
        websocket.register(broker, server)
    return server


async def start(broker: Core, spec: Any) -> Listener:
    """Registry entry: listen for MQTT (``mqtt://``) or MQTT over TLS (``mqtts://``)."""
    server = shared_server(broker)
    log_deliveries(broker)  # the delivery log names the out rules this adapter runs
    return await listen(broker, spec, server, lambda: MqttProtocol(server), "mqtts")
