"""One MQTT network connection on the core: the protocol logic between the codec and the
broker.

How this works. Each network connection has an :class:`MqttConnection` (the state machine
below, fed with packets by the shell, :mod:`adapters.mqtt.server`); it attaches to the
:class:`~adapters.mqtt.session.MqttSession` of its client id, which outlives it when the
session is persistent.

Connection states (a table, as the codec's peers are)::

    AWAIT_CONNECT --CONNECT ok--> CONNECTED --DISCONNECT / error / EOF--> CLOSED
    AWAIT_CONNECT --anything else--> CLOSED      ([MQTT-3.1.0-1])
    CONNECTED     --second CONNECT--> CLOSED     ([MQTT-3.1.0-2])

Protocol errors close only that connection, with the reason code on MQTT 5 (a DISCONNECT)
or a plain close on 3.1/3.1.1, and are logged once.

Runs on the loop; never awaits.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import struct
import uuid
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from adapters.mqtt.codec import MqttCodec, Side, encode_publish, validate_topic_filter
from adapters.mqtt.overlap import SubRecord
from adapters.mqtt.packets import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    MqttLocalProtocolError,
    MqttRemoteProtocolError,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    ReasonCode,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    UnsupportedProtocolVersion,
    v3_connack_return_code,
)
from adapters.mqtt.session import MQTT_5, NEVER, MqttSession, sent_publish
from gateway.errors import (
    GatewayError,
    IllegalStateError,
    InvalidDestinationError,
    LimitExceededError,
    SecurityError,
    UnavailableError,
)
from mappings.mqtt import PayloadFormatInvalid

if TYPE_CHECKING:
    from adapters.mqtt.server import MqttServer

log = logging.getLogger("adapters.mqtt")

# Receive Maximum we offer clients: in-flight QoS 1/2 PUBLISH packets we accept unacknowledged
# (MQTT 5 3.2.2.3.3; the spec's default and maximum is 65,535).
SERVER_RECEIVE_MAXIMUM = 1024
# Topic aliases a client may use towards us (MQTT 5 3.2.2.3.8).
SERVER_TOPIC_ALIAS_MAXIMUM = 64

# Success PUBACK / PUBREC: fixed header, remaining length 2, packet id — the short form MQTT 5
# also allows when the reason code is 0 and there are no properties (3.4.2.1, 3.5.2.1).
_PID = struct.Struct(">H")
# Properties a packet goes without rather than exceed the client's Maximum Packet Size.
_OPTIONAL_PROPS = frozenset({"reason_string", "user_property"})
_PUBACK_HEAD = b"\x40\x02"
_PUBREC_HEAD = b"\x50\x02"


class State(enum.IntEnum):  # int's hash: ALLOWED[state] is looked up a packet
    AWAIT_CONNECT = 1
    CONNECTED = 2
    CLOSED = 3


# Which packets a client may send in each state; anything else is a protocol error.
ALLOWED: dict[State, frozenset[type]] = {
    State.AWAIT_CONNECT: frozenset({Connect}),
    State.CONNECTED: frozenset(
        {Publish, PubAck, PubRec, PubRel, PubComp, Subscribe, Unsubscribe, PingReq, Disconnect,
         Auth}
    ),
    State.CLOSED: frozenset(),
}

class MqttConnection:
    """One network connection: packets in, packets out, dispatched to the session and core.

    ``write`` sends bytes to the peer; ``close`` ends the network connection.
    """

    def __init__(self, server: MqttServer, write: Callable[[bytes], None],
                 close: Callable[[], None], address: str) -> None:
        self.server = server
        self.codec = MqttCodec(Side.SERVER, max_packet_size=server.max_packet_size)
        self._write = write
        self._close = close
        self.address = address
        self.state = State.AWAIT_CONNECT
        self.level = 4
        self.session: MqttSession | None = None
        self.keepalive = 0
        self.last_rx = server.loop.time()
        self.ka_timer: Any = None
        self.aliases_in: dict[int, str] = {}
        self.alias_max = 0  # aliases the client accepts from us
        self.aliases_out: dict[str, int] = {}
        self.pending_acks: deque[tuple[int, Any, int]] = deque()
        # Incoming QoS 1/2 PUBLISHes of this connection not yet acknowledged, counted against
        # our Receive Maximum: QoS 1 until its PUBACK is sent, QoS 2 (by packet id) until its
        # PUBCOMP or a refusing PUBREC is sent (MQTT 5 3.3.4). Per connection: the quota
        # starts afresh with each one (4.9).
        self.in_qos1 = 0
        self.in_qos2: set[int] = set()
        self.ack_watch: Any = None  # the future at the head of pending_acks we wait for
        self.user: str | None = None
        self.closing = False
        self.write_paused = False  # the shell's write buffer is past its high-water mark
        self.flow: Any = None  # the shell's adapters.listener.WriteFlow (admin views)
        # Set by a shell that can stop reading its socket (TCP, TLS): while a QoS 0 publish
        # is held at max_msg_memory (flow control), which has no acknowledgement to withhold.
        self.pause_reading: Callable[[], None] | None = None
        self.resume_reading: Callable[[], None] | None = None
        self.held_qos0 = 0  # QoS 0 publishes whose core future is pending
        # Packets after a CONNECT that waits for a cluster node's handover (_connect_later).
        self.stash: list[Any] | None = None
        self.handover: Any = None  # that wait's task

    # -- input ------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self.last_rx = self.server.loop.time()
        self._dispatch(data, ())

    def _dispatch(self, data: bytes, packets: Any) -> None:
        """Handle the packets in ``data`` (or ``packets``, already parsed) in order; while a
        CONNECT waits for another cluster node to hand its session over, what comes after
        it waits in :attr:`stash`."""
        codec = self.codec
        try:
            if data:
                codec.receive_data(data)
                packets = codec.events_received()
            for packet in packets:
                if self.state is State.CLOSED:
                    return
                if self.stash is not None:
                    self.stash.append(packet)
                    continue
                if type(packet) not in ALLOWED[self.state]:
                    if isinstance(packet, Connect):
                        raise MqttRemoteProtocolError("second CONNECT [MQTT-3.1.0-2]",
                                                      ReasonCode.PROTOCOL_ERROR)
                    raise MqttRemoteProtocolError(
                        f"{type(packet).__name__} before CONNECT [MQTT-3.1.0-1]",
                        ReasonCode.PROTOCOL_ERROR)
                HANDLERS[type(packet)](self, packet)
        except UnsupportedProtocolVersion as exc:
            log.info("mqtt %s: %s; refused", self.address, exc)
            self._write(exc.reply)  # CONNACK 0x01 (3.1.1 format) or 0x84 ([MQTT-3.1.2-2])
            self.state = State.CLOSED
            self._close()
        except MqttRemoteProtocolError as exc:
            self.protocol_error(exc.reason_code, str(exc))
        except GatewayError as exc:
            self.protocol_error(ReasonCode.PROTOCOL_ERROR, str(exc))

    def connection_lost(self) -> None:
        """The peer went away (or we closed): will and session handling."""
        if self.state is State.CLOSED and self.session is None:
            return
        abnormal = self.state is State.CONNECTED
        self._end(publish_will=abnormal)

    def _end(self, *, publish_will: bool) -> None:
        self.state = State.CLOSED
        if self.ka_timer is not None:
            self.ka_timer.cancel()
            self.ka_timer = None
        session, self.session = self.session, None
        if session is not None and session.conn is self:
            session.detach(publish_will=publish_will)

    # -- output -----------------------------------------------------------------------------

    def send(self, packet: Any) -> bool:
        """Encode and write a packet other than a delivery's PUBLISH; False if not sent.

        Nothing larger than the client's Maximum Packet Size goes out [MQTT-3.1.2-24]: a
        packet that would be is sent without its Reason String and User Properties, as the
        spec has it for each packet that may carry them ([MQTT-3.2.2-19],
        [MQTT-3.2.2-20] CONNACK; [MQTT-3.14.2-3], [MQTT-3.14.2-4] DISCONNECT; the same for
        the acknowledgements), and not at all if it is still too large.
        """
        try:
            self.codec.send(packet)
        except MqttLocalProtocolError as exc:
            if exc.reason_code != ReasonCode.PACKET_TOO_LARGE:
                raise
            props = getattr(packet, "properties", None)
            slim = None
            if props and ("reason_string" in props or "user_property" in props):
                slim = dataclasses.replace(packet, properties={
                    k: v for k, v in props.items() if k not in _OPTIONAL_PROPS})
                try:
                    self.codec.send(slim)
                except MqttLocalProtocolError:
                    slim = None
            if slim is None:
                log.info("mqtt %s: %s not sent: %s", self.address, type(packet).__name__, exc)
                return False
        self._write(self.codec.data_to_send())
        return True

    def write(self, data: bytes) -> None:
        self._write(data)

    def pause_writing(self) -> None:
        """The shell's write buffer is full: no more deliveries until it drains."""
        self.write_paused = True
        session = self.session
        if session is not None and session.conn is self:
            session.pause()

    def resume_writing(self) -> None:
        """The write buffer drained: deliveries resume, within the in-flight window."""
        self.write_paused = False
        session = self.session
        if session is not None and session.conn is self:
            if len(session.outgoing) < session.receive_maximum:
                session.resume()

    def core_id(self) -> str | None:
        session = self.session
        core = session.core if session is not None else None
        return str(core.id) if core is not None else None

    def client_id(self) -> str | None:
        session = self.session
        return session.client_id if session is not None else None

    def send_publish(self, topic: str, payload: bytes, qos: int, retain: bool, pid: int | None,
                     props: dict[str, Any], *, dup: bool = False) -> bytes | None:
        """Encode and write one PUBLISH, or nothing and ``None`` when the packet would be
        larger than the client's Maximum Packet Size [MQTT-3.1.2-24] (the caller drops the
        message for this client, [MQTT-3.1.2-25]); the size is that of the packet as sent,
        with every property and alias in it.

        On MQTT 5, topics get aliases up to the client's Topic Alias Maximum
        ([MQTT-3.1.2-26]): the first PUBLISH of a topic carries topic and alias, later ones
        the alias alone. An alias is recorded only with the PUBLISH that sets it sent, so the
        client never gets an alias it was not told.
        """
        limit = self.codec.peer_max_packet_size
        level = self.level
        if level >= MQTT_5 and self.alias_max:
            alias = self.aliases_out.get(topic)
            if alias is not None:
                props = dict(props)
                props["topic_alias"] = alias
                data = encode_publish("", payload, qos, retain, dup, pid, props, level)
            else:
                data = b""
                if len(self.aliases_out) < self.alias_max:
                    alias = len(self.aliases_out) + 1
                    with_alias = dict(props)
                    with_alias["topic_alias"] = alias
                    data = encode_publish(topic, payload, qos, retain, dup, pid, with_alias,
                                          level)
                    if limit and len(data) > limit:
                        data = b""  # perhaps it fits without the alias's 3 bytes
                    else:
                        self.aliases_out[topic] = alias
                if not data:
                    data = encode_publish(topic, payload, qos, retain, dup, pid, props, level)
        else:
            data = self.server.encoded(topic, payload, qos, retain, pid, props, level)
            if dup:
                data = bytes([data[0] | 0x08]) + data[1:]
        if limit and len(data) > limit:
            return None
        self._write(data)
        return data

    def resend_publish(self, packet: bytes, level: int, aliases: dict[int, str]) -> bytes | None:
        """Send again, with DUP set, a PUBLISH first sent on an earlier connection of the
        session ([MQTT-4.4.0-1]): encoded anew for this connection, since the earlier one's
        topic aliases do not carry over ([MQTT-3.3.2-7]), its protocol level may differ and
        this client's Maximum Packet Size may be smaller (``None``: too large, not sent).

        ``level`` and ``aliases`` (alias → topic) are those of the connection that sent it.
        """
        p = sent_publish(packet, level, aliases)
        return self.send_publish(p.topic, p.payload, p.qos, p.retain, p.packet_id,
                                 p.properties, dup=True)

    def protocol_error(self, reason: int, text: str) -> None:
        """Close this connection for a protocol error, logged once ([MQTT-4.13.1-1])."""
        if self.state is State.CLOSED:
            return
        log.warning("mqtt %s (%s): %s; closing", self.address,
                    self.session.client_id if self.session else "-", text)
        if self.state is State.AWAIT_CONNECT:
            level = self.codec.protocol_level
            if level is not None and level >= MQTT_5:
                self._refuse(level, reason, text)  # a CONNACK with the reason (MQTT 5 3.2.2.2)
            else:
                # No CONNECT yet, or a bad 3.1/3.1.1 CONNECT: close without CONNACK
                # ([MQTT-3.1.0-1], [MQTT-3.1.4-1]).
                self.state = State.CLOSED
                self._close()
            return
        if self.level >= MQTT_5:
            self.send(Disconnect(reason, {"reason_string": text[:200]}))
        self._end(publish_will=True)
        self._close()

    def _refuse(self, level: int, reason: int, text: str) -> None:
        if level >= MQTT_5:
            self.codec.protocol_level = MQTT_5
            self.send(ConnAck(False, reason, {"reason_string": text[:200]}))
        elif level in (3, 4):
            self.codec.protocol_level = level
            self.send(ConnAck(False, v3_connack_return_code(reason)))
        self.state = State.CLOSED
        self._close()

    def disconnect(self, reason: int, text: str = "") -> None:
        """Server-side close, with a reason on MQTT 5 (e.g. shutdown, takeover)."""
        if self.state is State.CLOSED:
            return
        if self.level >= MQTT_5 and self.state is State.CONNECTED:
            props = {"reason_string": text} if text else {}
            self.send(Disconnect(reason, props))
        self._end(publish_will=reason != ReasonCode.SERVER_SHUTTING_DOWN)
        self._close()

    # -- keepalive --------------------------------------------------------------------------

    def _check_keepalive(self) -> None:
        """Close after 1.5 × keepalive without a packet ([MQTT-3.1.2-22])."""
        self.ka_timer = None
        if self.state is not State.CONNECTED:
            return
        limit = self.keepalive * 1.5
        if self.held_qos0:
            # The gateway stopped reading this client (a QoS 0 publish held at
            # max_msg_memory): its packets wait unread, so silence proves nothing. The
            # count starts again when reading resumes (_qos0_released).
            self.ka_timer = self.server.loop.call_later(limit, self._check_keepalive)
            return
        idle = self.server.loop.time() - self.last_rx
        if idle >= limit:
            self.protocol_error(ReasonCode.KEEP_ALIVE_TIMEOUT, "keep alive timeout")
            return
        self.ka_timer = self.server.loop.call_later(limit - idle, self._check_keepalive)

    # -- handlers ---------------------------------------------------------------------------

    def handle_connect(self, p: Connect) -> None:
        server = self.server
        self.level = p.protocol_level
        props = p.properties
        cid = p.client_id
        assigned = None
        if not cid:
            if not p.clean_start and self.level < MQTT_5:
                self._refuse(self.level, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                             "empty client id needs clean session [MQTT-3.1.3-8]")
                return
            cid = assigned = "gw-" + uuid.uuid4().hex[:16]
        if self.level >= MQTT_5 and "authentication_method" in props:
            # Enhanced authentication is not supported: a CONNECT naming a method is refused
            # with 0x8C and the connection closed (MQTT 5.0 §3.1.2.11.9, §4.12 [MQTT-4.12.0-1]).
            self._refuse(self.level, ReasonCode.BAD_AUTHENTICATION_METHOD,
                         f"authentication method {props['authentication_method']!r} "
                         "is not supported")
            return
        try:
            self.user = server.authenticate(p.username, p.password)
        except SecurityError as exc:
            # 0x86 / 4 for a name or password users.conf refuses, 0x87 / 5 for no name
            # (MQTT 5.0 §3.2.2.2; 3.1.1 §3.2.2.3)
            reason = (ReasonCode.BAD_USER_NAME_OR_PASSWORD if p.username
                      else ReasonCode.NOT_AUTHORIZED)
            log.info("mqtt %s: connection refused: %s", self.address, exc)
            self._refuse(self.level, reason, str(exc))
            return
        if self.level >= MQTT_5:
            expiry = int(props.get("session_expiry_interval", 0))
            persistent = expiry > 0
            self.alias_max = int(props.get("topic_alias_maximum", 0))
            self.codec.peer_max_packet_size = int(props.get("maximum_packet_size", 0)) or None
        else:
            persistent = not p.clean_start
            expiry = NEVER if persistent else 0
        # Outgoing QoS 1/2 in flight: the client's Receive Maximum on MQTT 5 (3.1.2.11.3), else
        # mqtt_max_inflight_messages (0 = as many as there are packet ids).
        receive_max = (int(props.get("receive_maximum", 65535)) if self.level >= MQTT_5
                       else server.max_inflight)
        args = (p, cid, assigned, persistent, expiry, receive_max)
        holder = server.holder(cid)
        if holder is not None:  # another node of the cluster holds the session: first it
            self.stash = []     # hands it over, with what it has in flight
            if self.pause_reading is not None:
                self.pause_reading()
            self.handover = server.loop.create_task(self._connect_later(holder, args))
            return
        server.adopt(cid)  # on a cluster node, the cluster's session of this client id
        self._open_session(*args)

    async def _connect_later(self, holder: str, args: tuple[Any, ...]) -> None:
        server = self.server
        handed = await server.broker.hand_over("mqtt", args[1], holder)
        self.handover = None
        stash, self.stash = self.stash, None
        if self.state is not State.AWAIT_CONNECT:  # the client went meanwhile
            return
        server.adopt(args[1], handed)
        self._open_session(*args)
        if self.resume_reading is not None and not self.held_qos0:
            self.resume_reading()
        if stash:
            self._dispatch(b"", stash)

    def _open_session(self, p: Connect, cid: str, assigned: str | None, persistent: bool,
                      expiry: int, receive_max: int) -> None:
        server = self.server
        props = p.properties
        # Take over an existing connection with this client id ([MQTT-3.1.4-3]).
        session = server.sessions.get(cid)
        if session is not None and session.conn is not None:
            session.conn.disconnect(ReasonCode.SESSION_TAKEN_OVER, "session taken over")
            session = server.sessions.get(cid)  # a non-persistent one ended with it
        present = False
        if session is not None:
            session.cancel_will()  # a will waiting for its delay is not sent [MQTT-3.1.2-8]
        if session is not None and p.clean_start:
            session.end()  # Clean Start 1: the old session goes, with all it held [MQTT-3.1.2-4]
            session = None
        if session is not None:
            # Clean Start 0 resumes the session whatever Session Expiry Interval this CONNECT
            # has [MQTT-3.1.2-5]; the new interval applies from now on (MQTT 5 3.1.2.11.2),
            # so a session resumed with 0 ends when this connection closes.
            present = True
            session.persistent = persistent
            session.expiry = expiry
        else:
            session = MqttSession(server, cid, persistent=persistent, expiry=expiry,
                                  level=self.level)
            server.sessions[cid] = session
        session.receive_maximum = receive_max
        try:
            session.open_core(self.user, self.address)
        except GatewayError as exc:
            server.forget(session)
            self._refuse(self.level, ReasonCode.SERVER_UNAVAILABLE, str(exc))
            return
        self.session = session
        session.attach(self)
        session.will = p.will
        self.state = State.CONNECTED
        server.broker.client_arrived("mqtt", cid)  # a cluster's other nodes take it over
        keepalive = self._keepalive(p.keepalive)
        self.keepalive = keepalive
        if keepalive:
            self.ka_timer = server.loop.call_later(keepalive * 1.5, self._check_keepalive)
        ack_props: dict[str, Any] = {}
        if self.level >= MQTT_5:
            ack_props = {
                "receive_maximum": SERVER_RECEIVE_MAXIMUM,
                "maximum_packet_size": server.max_packet_size,
                "topic_alias_maximum": SERVER_TOPIC_ALIAS_MAXIMUM,
                "retain_available": 1,
                "wildcard_subscription_available": 1,
                "subscription_identifier_available": 1,
                "shared_subscription_available": 1,
            }
            if keepalive != p.keepalive:
                ack_props["server_keep_alive"] = keepalive  # [MQTT-3.2.2-21]
            if assigned is not None:
                ack_props["assigned_client_identifier"] = assigned
            if props.get("request_response_information"):
                ack_props["response_information"] = f"reply/{cid}"
        if not self.send(ConnAck(present, ReasonCode.SUCCESS, ack_props)):
            # Even without optional properties the CONNACK is over the client's Maximum
            # Packet Size: no other packet may precede it ([MQTT-3.2.0-1]), so close.
            self._end(publish_will=False)
            self._close()
            return
        session.save()
        if present:
            # CONNACK first, then what was in flight, then new deliveries ([MQTT-4.4.0-1]).
            session.resend_inflight()
            server.restore_subscriptions(session)
            if session.restored:
                session.resume_restored()
        if len(session.outgoing) < session.receive_maximum:
            session.resume()  # else acknowledgements of what was re-sent resume it

    def _keepalive(self, asked: int) -> int:
        """The Keep Alive this connection is held to: the client's, or ``mqtt_max_keepalive``
        when the client asked more or none (0), as mosquitto's ``max_keepalive``.

        MQTT 5 clients are told with a Server Keep Alive in the CONNACK, which they must use
        ([MQTT-3.2.2-21]); without one the server keeps the client's value
        ([MQTT-3.2.2-22]). A 3.1/3.1.1 client cannot be told: it is held to the maximum all
        the same (the server may close an inactive client at any time, 3.1.1 3.1.2.10), and
        the log says so, since such a client that pings only at its own, longer interval is
        closed as silent (and its will published).
        """
        top = self.server.max_keepalive
        if not top or 0 < asked <= top:
            return asked
        if self.level < MQTT_5:
            log.info("mqtt %s: keep alive %d asked, the server's maximum of %d s applies "
                     "(MQTT %s cannot be told)", self.address, asked, top,
                     "3.1.1" if self.level == 4 else "3.1")
        return top

    def handle_publish(self, p: Publish) -> None:
        session = self.session
        assert session is not None
        topic = p.topic
        props = p.properties
        if self.level >= MQTT_5 and "topic_alias" in props:
            alias = int(props["topic_alias"])
            if not 0 < alias <= SERVER_TOPIC_ALIAS_MAXIMUM:
                raise MqttRemoteProtocolError(f"topic alias {alias} out of range",
                                              ReasonCode.TOPIC_ALIAS_INVALID)
            if topic:
                self.aliases_in[alias] = topic
            else:
                topic = self.aliases_in.get(alias, "")
                if not topic:
                    raise MqttRemoteProtocolError(f"unknown topic alias {alias}",
                                                  ReasonCode.PROTOCOL_ERROR)
        qos = p.qos
        pid = p.packet_id or 0
        if qos == 2 and pid in session.incoming_qos2:
            # A re-sent PUBLISH: already published once. Re-sent after a reconnect, it is
            # in this connection's quota from now on.
            self.in_qos2.add(pid)
            self.send(PubRec(pid))
            return
        if qos and self.in_qos1 + len(self.in_qos2) >= SERVER_RECEIVE_MAXIMUM and (
                self.level >= MQTT_5):
            # MQTT 5 3.3.4 (Flow Control): more unacknowledged QoS 1/2 PUBLISHes than our
            # Receive Maximum; a QoS 2 one counts until its PUBCOMP ([MQTT-3.3.4-7] binds
            # the client to the same count).
            raise MqttRemoteProtocolError("receive maximum exceeded",
                                          ReasonCode.RECEIVE_MAXIMUM_EXCEEDED)
        reason: int = ReasonCode.SUCCESS
        fut = None
        try:
            reason, fut = self.server.publish(self.level, session, topic, p)
        except PayloadFormatInvalid as exc:
            reason = ReasonCode.PAYLOAD_FORMAT_INVALID
            log.info("mqtt %s: %s", session.client_id, exc)
        if qos == 0:
            if fut is not None and not fut.done() and self.pause_reading is not None:
                # Held by the memory limit (flow control): stop reading this client until
                # the core takes more, as the STOMP adapter does for its held sends.
                self.held_qos0 += 1
                if self.held_qos0 == 1:
                    self.pause_reading()
                fut.add_done_callback(self._qos0_released)
            return
        if reason == ReasonCode.SERVER_UNAVAILABLE:  # not now, maybe later (a cluster node
            if self.level < MQTT_5:                 # cut off from its NATS servers)
                # No negative acknowledgement in 3.1.1, and acknowledging would lose it:
                # close with the message unacknowledged, which the client sends again
                # when it reconnects (MQTT 3.1.1 4.4, "Message delivery retry").
                log.info("mqtt %s: cannot take QoS %d messages now; closing", session.client_id,
                         qos)
                self.disconnect(ReasonCode.SERVER_UNAVAILABLE)
                return
            reason = ReasonCode.UNSPECIFIED_ERROR  # 0x88 is for CONNACK and DISCONNECT only
        if qos == 2:
            self.in_qos2.add(pid)  # until PUBCOMP, or a PUBREC >= 0x80, is sent
            if reason < 0x80:
                session.incoming_qos2.add(pid)
        if self.level < MQTT_5 and reason >= 0x80:
            # 3.1.1 has no negative acknowledgement: acknowledge and drop ([MQTT-3.3.5-2]).
            reason = ReasonCode.SUCCESS
        if fut is None and not self.pending_acks and reason == ReasonCode.SUCCESS:
            # Nothing earlier is waiting and nothing to wait for: acknowledge now.
            self._write((_PUBACK_HEAD if qos == 1 else _PUBREC_HEAD) + _PID.pack(pid))
            return
        q = self.pending_acks
        q.append((pid, fut, reason | (qos << 16)))
        if qos == 1:
            self.in_qos1 += 1
        if len(q) == 1:  # else one before it waits, and sending that one goes on to this
            self._flush_acks()

    def _qos0_released(self, fut: Any) -> None:
        if not fut.cancelled():
            fut.exception()  # retrieved: a QoS 0 publisher is told nothing either way
        self.held_qos0 -= 1
        if self.held_qos0 == 0 and self.resume_reading is not None and not self.closing:
            self.last_rx = self.server.loop.time()  # Keep Alive counts from here again
            self.resume_reading()

    def _flush_acks(self) -> None:
        """Send PUBACK/PUBREC in the order the PUBLISH packets came ([MQTT-4.6.0-2]).

        Stops at the first publish whose store commit is not done and waits for that one
        alone: a group commit confirms many at once, and one callback then sends them all.
        """
        q = self.pending_acks
        while q:
            pid, fut, packed = q[0]
            if fut is not None and not fut.done():
                if self.ack_watch is not fut:
                    self.ack_watch = fut
                    fut.add_done_callback(self._acks_ready)
                return
            q.popleft()
            reason = packed & 0xFFFF
            if fut is not None and fut.exception() is not None:
                log.warning("mqtt: a stored publish failed: %s", fut.exception())
                reason = ReasonCode.UNSPECIFIED_ERROR
            qos = packed >> 16
            if qos == 1:
                self.in_qos1 -= 1
            elif reason >= 0x80:  # a refused QoS 2 exchange ends with its PUBREC
                self.in_qos2.discard(pid)
                if self.session is not None:
                    self.session.incoming_qos2.discard(pid)
            if self.state is not State.CONNECTED:
                continue
            if qos == 1:
                self.send(PubAck(pid, reason if self.level >= MQTT_5 else 0))
            else:
                self.send(PubRec(pid, reason if self.level >= MQTT_5 else 0))

    def _acks_ready(self, fut: Any) -> None:
        if self.ack_watch is fut:
            self.ack_watch = None
        self._flush_acks()

    def handle_puback(self, p: PubAck) -> None:
        assert self.session is not None
        self.session.acked(p.packet_id)

    def handle_pubrec(self, p: PubRec) -> None:
        session = self.session
        assert session is not None
        f = session.outgoing.get(p.packet_id)
        if f is None:
            if self.level >= MQTT_5:
                self.send(PubRel(p.packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND))
            else:
                self.send(PubRel(p.packet_id))
            return
        if p.reason_code >= 0x80:  # the client refused it: the exchange ends here
            session.acked(p.packet_id)
            return
        # From PUBREC on the client owns the message: settle it in the core.
        store_id = f.delivery.msg.store_id if f.delivery is not None else 0
        session.settle(f)  # its delivery and those of overlapping subscriptions
        f.released = True
        if f.saved:
            session.save_inflight(f, store_id, "")
        self.send(PubRel(p.packet_id))

    def handle_pubcomp(self, p: PubComp) -> None:
        assert self.session is not None
        self.session.acked(p.packet_id)

    def handle_pubrel(self, p: PubRel) -> None:
        session = self.session
        assert session is not None
        self.in_qos2.discard(p.packet_id)  # PUBCOMP follows: the exchange is over
        if p.packet_id in session.incoming_qos2:
            session.incoming_qos2.discard(p.packet_id)
            self.send(PubComp(p.packet_id))
        elif self.level >= MQTT_5:
            self.send(PubComp(p.packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND))
        else:
            self.send(PubComp(p.packet_id))

    def handle_subscribe(self, p: Subscribe) -> None:
        session = self.session
        assert session is not None
        sub_id = p.properties.get("subscription_identifier")
        if isinstance(sub_id, list):
            sub_id = sub_id[0] if sub_id else None
        codes: list[int] = []
        retained: list[SubRecord] = []
        for flt, opts in p.subscriptions:
            if not validate_topic_filter(flt):
                codes.append(ReasonCode.TOPIC_FILTER_INVALID)
                continue
            try:
                rec = SubRecord(flt, opts, sub_id)
            except InvalidDestinationError:
                codes.append(ReasonCode.TOPIC_FILTER_INVALID)
                continue
            if rec.share is not None and opts.no_local:
                raise MqttRemoteProtocolError("no local on a shared subscription [MQTT-3.8.3-4]",
                                              ReasonCode.PROTOCOL_ERROR)
            existed = session.subs.get(flt)
            try:
                if existed is not None:
                    session.unsubscribe(existed, drop=False)
                session.subscribe(rec)
            except SecurityError as exc:
                log.info("mqtt %s: subscribe %s refused: %s", session.client_id, flt, exc)
                if existed is not None:
                    session.subs.pop(flt, None)
                codes.append(ReasonCode.NOT_AUTHORIZED)
                continue
            except (InvalidDestinationError, IllegalStateError, LimitExceededError) as exc:
                log.info("mqtt %s: subscribe %s failed: %s", session.client_id, flt, exc)
                if existed is not None:
                    session.subs.pop(flt, None)
                codes.append(ReasonCode.UNSPECIFIED_ERROR)
                continue
            session.subs[flt] = rec
            codes.append(min(opts.qos, 2))
            if rec.share is None and (opts.retain_handling == 0 or (
                    opts.retain_handling == 1 and existed is None)):
                retained.append(rec)
        if self.level < MQTT_5:
            codes = [c if c < 0x80 else 0x80 for c in codes]
        suback = SubAck(p.packet_id, codes)
        ready = self.server.broker.cluster_ready()
        if ready is None:
            self._subscribed(suback, retained)
        else:  # on a cluster node: once the other nodes have the subscriptions
            ready.add_done_callback(lambda _: self._subscribed(suback, retained))

    def _subscribed(self, suback: SubAck, retained: list[SubRecord]) -> None:
        """Answer a SUBSCRIBE, then stream the retained messages it is owed."""
        session = self.session
        if session is None or self.state is not State.CONNECTED:
            return
        self.send(suback)
        session.save()
        for rec in retained:  # streamed as the client's window allows
            session.start_retained(rec)

    def handle_unsubscribe(self, p: Unsubscribe) -> None:
        session = self.session
        assert session is not None
        codes: list[int] = []
        for flt in p.filters:
            rec = session.subs.pop(flt, None)
            if rec is None:
                codes.append(ReasonCode.NO_SUBSCRIPTION_EXISTED)
                continue
            session.unsubscribe(rec, drop=True)
            codes.append(ReasonCode.SUCCESS)
        self.send(UnsubAck(p.packet_id, codes if self.level >= MQTT_5 else []))
        session.save()

    def handle_pingreq(self, p: PingReq) -> None:
        self.send(PingResp())

    def handle_disconnect(self, p: Disconnect) -> None:
        session = self.session
        if session is not None and self.level >= MQTT_5:
            new_expiry = p.properties.get("session_expiry_interval")
            if new_expiry is not None:
                if session.expiry == 0 and new_expiry:
                    raise MqttRemoteProtocolError(
                        "session expiry set on DISCONNECT after 0 at CONNECT (MQTT 5 3.14.2.2.2)",
                        ReasonCode.PROTOCOL_ERROR)
                session.expiry = int(new_expiry)
                session.persistent = session.expiry > 0
        # A normal DISCONNECT discards the will ([MQTT-3.14.4-3]); 0x04 asks for it.
        self._end(publish_will=p.reason_code == ReasonCode.DISCONNECT_WITH_WILL_MESSAGE)
        self._close()

    def handle_auth(self, p: Auth) -> None:
        raise MqttRemoteProtocolError("enhanced authentication is not supported",
                                      ReasonCode.BAD_AUTHENTICATION_METHOD)


# What handles each packet type (outside the class body: mypyc compiles a class body's
# names as the class's attributes, where the methods are not yet).
HANDLERS: dict[type, Callable[[MqttConnection, Any], None]] = {
    Connect: MqttConnection.handle_connect,
    Publish: MqttConnection.handle_publish,
    PubAck: MqttConnection.handle_puback,
    PubRec: MqttConnection.handle_pubrec,
    PubRel: MqttConnection.handle_pubrel,
    PubComp: MqttConnection.handle_pubcomp,
    Subscribe: MqttConnection.handle_subscribe,
    Unsubscribe: MqttConnection.handle_unsubscribe,
    PingReq: MqttConnection.handle_pingreq,
    Disconnect: MqttConnection.handle_disconnect,
    Auth: MqttConnection.handle_auth,
}


def publish_reason(exc: GatewayError) -> int:
    """The MQTT 5 reason code for a publish the core refused."""
    if isinstance(exc, SecurityError):
        return ReasonCode.NOT_AUTHORIZED
    if isinstance(exc, InvalidDestinationError):
        return ReasonCode.TOPIC_NAME_INVALID
    if isinstance(exc, LimitExceededError):
        return ReasonCode.QUOTA_EXCEEDED
    if isinstance(exc, UnavailableError):
        return ReasonCode.SERVER_UNAVAILABLE  # for handle_publish, which turns it into 0x80
    return ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR

