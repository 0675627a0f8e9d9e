"""The MQTT client session: the gateway's side of a connection to another broker, sans-I/O.

How this works. :class:`ClientSession` is an MQTT 3.1.1 / 5.0 client session on the MQTT
adapter's codec (``MqttCodec(CLIENT)``, the one codec class that serves both sides). It owns
no socket, no task and no clock: its owner feeds it the bytes that arrive
(:meth:`~ClientSession.receive_data`), calls :meth:`~ClientSession.tick` with the time now
and then, asks for the packets it has to write (:meth:`~ClientSession.data_to_send`) and
takes the events it raised (:meth:`~ClientSession.events_received`): :class:`Connected`,
:class:`Subscribed`, :class:`Unsubscribed`, :class:`MessageReceived`, :class:`Published`,
:class:`Abandoned` and :class:`Closed`.

One session object lives as long as the MQTT session it keeps, across network connections:
each :meth:`~ClientSession.connect` starts a new connection (a fresh codec) and sends CONNECT;
:class:`Closed` ends it (a refusal, the server's DISCONNECT, a protocol error, a keepalive
timeout, our own :meth:`~ClientSession.disconnect`, or the owner's
:meth:`~ClientSession.connection_lost`). What survives a connection is the session state of
MQTT 5.0 §4.1: the outgoing QoS 1/2 PUBLISHes not yet fully acknowledged (resent on a
present session, the PUBLISH with DUP set or its PUBREL, in their first order,
[MQTT-4.4.0-1], [MQTT-4.6.0-1]) and the incoming ones not yet completed (so an imported QoS 2
message is handed on once however often the server sends it again, §4.3.3). A CONNACK with
Session Present 0 discards that state ([MQTT-3.2.2-5]): the unfinished outgoing messages are
handed back to the owner in one :class:`Abandoned` event.

Connection states, and what moves the session between them (:data:`TRANSITIONS`)::

    DISCONNECTED --connect--> CONNECTING --connack_ok--> CONNECTED
    CONNECTING --connack_refused | close--> DISCONNECTED
    CONNECTED --close--> DISCONNECTED

Outgoing PUBLISH (§4.3, §4.9). A QoS 1/2 message gets a packet id that no unfinished
exchange uses ([MQTT-2.2.1-3]: PUBLISH, SUBSCRIBE and UNSUBSCRIBE share the client's ids),
counting up and wrapping from 65,535 to 1. At most ``min(max_inflight, the server's Receive
Maximum)`` are unacknowledged at once ([MQTT-3.3.4-7]); more wait in order, unencoded, and go
out as acknowledgements free the window. A message is :class:`Published` on PUBACK, or on
PUBCOMP (or a PUBREC with a failure reason code, which ends the exchange, §4.3.3), with the
reason code the server gave; the owner's ``token`` names it.

Incoming PUBLISH. A QoS 1/2 message is delivered in a :class:`MessageReceived` event and the
owner decides when it is taken: :meth:`~ClientSession.ack` sends its PUBACK (QoS 1) or PUBREC
(QoS 2; PUBREL is answered with PUBCOMP at once). Until then, and for QoS 2 until the PUBREL,
a PUBLISH sent again with the same packet id is the same message ([MQTT-4.3.3-10]) and is not
delivered again; one the owner acked while the connection was down is answered when the
server sends it again. Topic aliases are never allowed to the server (Topic Alias Maximum 0,
so a PUBLISH with one is TOPIC_ALIAS_INVALID, [MQTT-3.1.2-27]) nor used.

Keepalive (§3.1.2.10, §4.12 of 3.1.1). The session has no clock of its own: :meth:`tick`
notes whether anything was handed out for writing or came in since the previous tick, so
its precision is the owner's tick interval (the keepalive is seconds; a tick a second is
plenty). PINGREQ goes out when nothing was written for the keepalive interval (the server's
Server Keep Alive replaces ours, [MQTT-3.2.2-21]); when nothing at all arrives within
``ping_timeout`` of it the connection is closed with KEEP_ALIVE_TIMEOUT (3.12.4: "the Client
SHOULD close the Network Connection").

Errors. What the server breaks -- a malformed packet (the codec's
:class:`MqttRemoteProtocolError`), a packet out of place -- closes the connection with the
error's reason code (MQTT 5: in a DISCONNECT first, §4.13); :class:`Closed` carries it. Our
own mistakes (a wildcard topic, QoS above the server's Maximum QoS, a packet above its
Maximum Packet Size) raise :class:`MqttLocalProtocolError` from the call and change nothing.

Why hand-written. paho-mqtt keeps this state inside its client, which does its own socket
I/O and timing and exposes no stable API for driving its session from another event loop;
the gateway's codec already parses and encodes both sides, so the session is the only part
missing, and it is small. Enhanced authentication (AUTH) is not supported: the session never
sends an Authentication Method, so an AUTH from the server is a protocol error (§4.12).

Runs on the owner's loop; never blocks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from enum import Enum

from adapters.mqtt.codec import (
    CLIENT,
    DEFAULT_MAX_PACKET_SIZE,
    MqttCodec,
    encode_publish,
    validate_topic_filter,
)
from adapters.mqtt.packets import (
    DISCONNECT,
    MQTT_3_1_1,
    MQTT_5,
    PROTOCOL_NAMES,
    REASON_CODES_ALLOWED,
    ConnAck,
    Connect,
    Disconnect,
    MqttLocalProtocolError,
    MqttRemoteProtocolError,
    Packet,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    ReasonCode,
    SubAck,
    Subscribe,
    SubscriptionOptions,
    UnsubAck,
    Unsubscribe,
    Will,
)

MAX_PACKET_ID = 0xFFFF  # a Two Byte Integer, 0 not allowed (MQTT 5.0 §2.2.1)
DEFAULT_RECEIVE_MAXIMUM = 65_535  # absent Receive Maximum (MQTT 5.0 §3.1.2.11.3, §3.2.2.3.3)
CONNECT_TIMEOUT = 10.0  # seconds to wait for CONNACK before giving the connection up
NEVER_EXPIRES = 0xFFFF_FFFF  # Session Expiry Interval "never" (MQTT 5.0 §3.1.2.11.2)


class State(Enum):
    """Where the current network connection is."""

    DISCONNECTED = "disconnected"
    CONNECTING = "connecting"  # CONNECT sent, no CONNACK yet
    CONNECTED = "connected"


DISCONNECTED = State.DISCONNECTED
CONNECTING = State.CONNECTING
CONNECTED = State.CONNECTED

TRANSITIONS: dict[tuple[State, str], State] = {
    (DISCONNECTED, "connect"): CONNECTING,
    (CONNECTING, "connack_ok"): CONNECTED,
    (CONNECTING, "connack_refused"): DISCONNECTED,
    (CONNECTING, "close"): DISCONNECTED,
    (CONNECTED, "close"): DISCONNECTED,
}
"""(state, event) -> next state; every other pair is not allowed."""

# Incoming QoS 1/2 exchanges by packet id (MQTT 5.0 §4.3.2, §4.3.3, Method B of §4.3.3's
# receiver: the packet id is the key of the exchange until PUBACK / PUBCOMP).
_IN_QOS1 = 1  # delivered, the owner has not acked: no PUBACK yet
_IN_QOS2 = 2  # delivered, the owner has not acked: no PUBREC yet
_IN_RECEIVED = 3  # QoS 2 taken: PUBREC sent (or owed), waiting for PUBREL
_IN_ACKED = 4  # QoS 1 acked while no connection could carry the PUBACK

# ---------------------------------------------------------------------------------- events


class Connected:
    """CONNACK accepted the connection (MQTT 5.0 §3.2)."""

    __slots__ = ("session_present", "properties")

    def __init__(self, session_present: bool, properties: Properties) -> None:
        self.session_present = session_present
        self.properties = properties


class Subscribed:
    """SUBACK: one reason code per filter of the SUBSCRIBE ``packet_id`` (MQTT 5.0 §3.9)."""

    __slots__ = ("packet_id", "reason_codes", "properties")

    def __init__(self, packet_id: int, reason_codes: list[int], properties: Properties) -> None:
        self.packet_id = packet_id
        self.reason_codes = reason_codes
        self.properties = properties


class Unsubscribed:
    """UNSUBACK of the UNSUBSCRIBE ``packet_id``; ``reason_codes`` empty below MQTT 5."""

    __slots__ = ("packet_id", "reason_codes", "properties")

    def __init__(self, packet_id: int, reason_codes: list[int], properties: Properties) -> None:
        self.packet_id = packet_id
        self.reason_codes = reason_codes
        self.properties = properties


class MessageReceived:
    """An application message from the server. For QoS 1/2 pass ``packet_id`` to
    :meth:`ClientSession.ack` once the message is taken; QoS 0 needs nothing."""

    __slots__ = ("topic", "payload", "qos", "retain", "dup", "properties", "packet_id")

    def __init__(self, publish: Publish) -> None:
        self.topic = publish.topic
        self.payload = publish.payload
        self.qos = publish.qos
        self.retain = publish.retain
        self.dup = publish.dup
        self.properties = publish.properties
        self.packet_id = publish.packet_id or 0


class Published:
    """An outgoing QoS 1/2 message is fully acknowledged: PUBACK, PUBCOMP, or a PUBREC with a
    failure reason code (``reason_code`` >= 0x80 means the server did not take it)."""

    __slots__ = ("token", "reason_code", "properties")

    def __init__(self, token: object, reason_code: int, properties: Properties) -> None:
        self.token = token
        self.reason_code = reason_code
        self.properties = properties


class Abandoned:
    """The server has no session ([MQTT-3.2.2-5]): these outgoing messages, sent but not
    fully acknowledged, are dropped from the session (the owner may publish them again)."""

    __slots__ = ("tokens",)

    def __init__(self, tokens: list[object]) -> None:
        self.tokens = tokens


class Closed:
    """The network connection is over; the owner closes the socket. ``reason_code`` is MQTT
    5's (a CONNACK refusal, the server's DISCONNECT, the error we found, or ours);
    ``by_server`` tells whether the server ended it; ``error`` is the protocol error."""

    __slots__ = ("reason_code", "reason", "properties", "by_server", "error")

    def __init__(self, reason_code: int, reason: str, properties: Properties | None = None,
                 by_server: bool = False,
                 error: MqttRemoteProtocolError | None = None) -> None:
        self.reason_code = reason_code
        self.reason = reason
        self.properties = properties if properties is not None else {}
        self.by_server = by_server
        self.error = error

    def __repr__(self) -> str:
        return f"Closed({self.reason_code:#04x}, {self.reason!r})"


Event = Connected | Subscribed | Unsubscribed | MessageReceived | Published | Abandoned | Closed


class _Out:
    """One outgoing QoS 1/2 exchange: the PUBLISH as encoded (DUP clear), or once PUBREC
    came, the PUBREL to send again."""

    __slots__ = ("token", "qos", "data", "released")

    def __init__(self, token: object, qos: int, data: bytes) -> None:
        self.token = token
        self.qos = qos
        self.data = data
        self.released = False


class ClientSession:
    """An MQTT client session (module docstring).

    Args:
        client_id: the Client Identifier; "" lets the server assign one (MQTT 5 tells it in
            CONNACK: :attr:`client_id` is updated, §3.2.2.3.7).
        protocol_level: 4 (3.1.1) or 5.
        clean_start: 3.1.1's Clean Session / MQTT 5's Clean Start, on every CONNECT.
        keepalive: seconds, 0 for none (MQTT 5.0 §3.1.2.10).
        session_expiry: MQTT 5 Session Expiry Interval, seconds (:data:`NEVER_EXPIRES`).
        receive_maximum: QoS 1/2 messages the server may have unacknowledged to us.
        maximum_packet_size: the largest packet we take (the codec refuses larger ones).
        max_inflight: our own bound on unacknowledged outgoing QoS 1/2 messages.
        ping_timeout: seconds to wait for any packet after PINGREQ (default: keepalive).
        properties: further CONNECT properties (MQTT 5), e.g. ``user_property``.
    """

    def __init__(self, client_id: str = "", *, protocol_level: int = MQTT_3_1_1,
                 clean_start: bool = True, keepalive: int = 60, will: Will | None = None,
                 username: str | None = None, password: bytes | None = None,
                 session_expiry: int = 0, receive_maximum: int = DEFAULT_RECEIVE_MAXIMUM,
                 maximum_packet_size: int = DEFAULT_MAX_PACKET_SIZE,
                 max_inflight: int = DEFAULT_RECEIVE_MAXIMUM, ping_timeout: float | None = None,
                 connect_timeout: float = CONNECT_TIMEOUT,
                 properties: Properties | None = None) -> None:
        if protocol_level not in (MQTT_3_1_1, MQTT_5):
            raise ValueError(f"protocol level {protocol_level} is not 4 (3.1.1) or 5")
        if not 1 <= receive_maximum <= DEFAULT_RECEIVE_MAXIMUM or max_inflight < 1:
            raise ValueError("receive_maximum and max_inflight are 1-65535")
        self.client_id = client_id
        self.level = protocol_level
        self.clean_start = clean_start
        self.keepalive = keepalive
        self.will = will
        self.username = username
        self.password = password
        self.session_expiry = session_expiry
        self.receive_maximum = receive_maximum
        self.maximum_packet_size = maximum_packet_size
        self.max_inflight = max_inflight
        self.ping_timeout = ping_timeout
        self.connect_timeout = connect_timeout
        self.properties: Properties = dict(properties or {})
        self.state = DISCONNECTED
        self.codec = MqttCodec(CLIENT, max_packet_size=maximum_packet_size)
        # What the server told in CONNACK (MQTT 5 §3.2.2.3); defaults for 3.1.1.
        self.server_receive_maximum = DEFAULT_RECEIVE_MAXIMUM
        self.server_maximum_qos = 2
        self.server_retain_available = True
        self.server_keepalive = keepalive
        self._events: list[Event] = []
        self._out: dict[int, _Out] = {}  # packet id -> exchange, in first-send order
        self._waiting: deque[tuple[str, bytes, int, bool, Properties | None, object]] = deque()
        self._in: dict[int, int] = {}  # packet id -> _IN_* state
        self._acks: dict[int, int] = {}  # SUBSCRIBE/UNSUBSCRIBE packet id -> filter count
        self._unsubs: set[int] = set()  # which of _acks are UNSUBSCRIBEs
        self._next_id = 1
        self._window = max_inflight
        # Keepalive bookkeeping (see module docstring): flags set by the hot path, read by tick.
        self._wrote = False
        self._heard = False
        self._last_out = 0.0
        self._last_in = 0.0
        self._ping_at: float | None = None
        self._connect_at = 0.0

    # -- the connection ---------------------------------------------------------------------

    def _move(self, event: str) -> None:
        nxt = TRANSITIONS.get((self.state, event))
        if nxt is None:
            raise MqttLocalProtocolError(f"{event} not allowed while {self.state.value}")
        self.state = nxt

    @property
    def v5(self) -> bool:
        """Whether the session speaks MQTT 5."""
        return self.level == MQTT_5

    def connect(self, now: float) -> None:
        """Start a new network connection: send CONNECT (MQTT 5.0 §3.1; 3.1.1 §3.1).

        With Clean Start the session state is discarded first ([MQTT-3.1.2-4]); the
        unfinished outgoing messages are reported as :class:`Abandoned`.
        """
        self._move("connect")
        if self.clean_start:
            self._discard_session()
        props: Properties = {}
        if self.v5:
            props.update(self.properties)
            if self.session_expiry:
                props["session_expiry_interval"] = self.session_expiry
            if self.receive_maximum != DEFAULT_RECEIVE_MAXIMUM:
                props["receive_maximum"] = self.receive_maximum
            props["maximum_packet_size"] = self.maximum_packet_size
            # Topic Alias Maximum absent = 0: the server sends no aliases [MQTT-3.1.2-27].
        codec = self.codec = MqttCodec(CLIENT, max_packet_size=self.maximum_packet_size)
        codec.send(Connect(PROTOCOL_NAMES[self.level], self.level, self.clean_start,
                           self.keepalive, self.client_id, self.will, self.username,
                           self.password, props))
        self._wrote = self._heard = False
        self._last_out = self._last_in = self._connect_at = now
        self._ping_at = None
        self.server_receive_maximum = DEFAULT_RECEIVE_MAXIMUM
        self.server_maximum_qos = 2
        self.server_retain_available = True
        self.server_keepalive = self.keepalive
        self._window = self.max_inflight

    def disconnect(self, reason_code: int = ReasonCode.NORMAL_DISCONNECTION,
                   properties: Properties | None = None) -> None:
        """Send DISCONNECT and end the connection (MQTT 5.0 §3.14); the session state stays.

        Raises:
            MqttLocalProtocolError: a Session Expiry Interval after CONNECT said 0
                (MQTT 5.0 §3.14.2.2.2), or no connection.
        """
        if (properties and properties.get("session_expiry_interval")
                and not self.session_expiry):
            raise MqttLocalProtocolError("session expiry set in DISCONNECT after 0 in CONNECT "
                                         "(3.14.2.2.2)")
        if self.state is DISCONNECTED:
            raise MqttLocalProtocolError("disconnect without a connection")
        self.codec.send(Disconnect(reason_code if self.v5 else ReasonCode.NORMAL_DISCONNECTION,
                                   (properties or {}) if self.v5 else {}))
        self._close(Closed(reason_code, "disconnected by us", properties))

    def connection_lost(self, reason: str = "connection lost") -> None:
        """The owner's socket is gone (EOF, an error): the connection ends, the session stays."""
        if self.state is not DISCONNECTED:
            self._close(Closed(ReasonCode.UNSPECIFIED_ERROR, reason))

    def _close(self, event: Closed) -> None:
        self._move("close")
        self._events.append(event)
        self._acks.clear()  # an unanswered SUBSCRIBE / UNSUBSCRIBE is not resent (§4.4)
        self._unsubs.clear()

    def _fail(self, error: MqttRemoteProtocolError) -> None:
        """The server broke the protocol: tell it (MQTT 5, §4.13) and end the connection."""
        if self.state is DISCONNECTED:
            return
        if self.v5 and self.state is CONNECTED:
            code = error.reason_code
            if code not in REASON_CODES_ALLOWED[DISCONNECT]:  # (none the codec raises today)
                code = ReasonCode.PROTOCOL_ERROR
            self.codec.send(Disconnect(code))
        self._close(Closed(error.reason_code, str(error), error=error))

    def _discard_session(self) -> None:
        if self._out:
            self._events.append(Abandoned([o.token for o in self._out.values()]))
            self._out.clear()
        self._in.clear()

    # -- I/O ---------------------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Bytes from the server; the packets are handled by :meth:`events_received`."""
        if self.state is not DISCONNECTED:
            self.codec.receive_data(data)

    def events_received(self, packets: bool = True) -> list[Event]:
        """Handle every complete packet received so far; return (and forget) the events
        raised since the previous call, from the packets and from the calls in between.
        With ``packets`` false the packets wait (the owner stopped reading): only the events
        of the calls are returned."""
        if packets and self.state is not DISCONNECTED:
            try:
                received = self.codec.events_received()
            except MqttRemoteProtocolError as exc:
                self._handle_all(exc.events)
                self._fail(exc)
            else:
                if received:
                    self._handle_all(received)
        events = self._events
        if events:
            self._events = []
        return events

    def data_to_send(self) -> bytes:
        """Everything the session has to write, as one write (b"" when nothing)."""
        data = self.codec.data_to_send()
        if data:
            self._wrote = True
        return data

    def tick(self, now: float) -> None:
        """Keepalive and the CONNACK timeout (module docstring); call it every second or so.

        PINGREQ when nothing was written for the keepalive interval ([MQTT-3.1.2-20]); the
        connection closed with KEEP_ALIVE_TIMEOUT when nothing arrived within
        ``ping_timeout`` of it (3.12.4, 4.12 of 3.1.1 "close the Network Connection").
        """
        if self._wrote or self.codec.has_data:
            self._wrote = False
            self._last_out = now
        if self._heard:
            self._heard = False
            self._last_in = now
            self._ping_at = None
        state = self.state
        if state is CONNECTING:
            if now - self._connect_at >= self.connect_timeout:
                self._close(Closed(ReasonCode.UNSPECIFIED_ERROR, "no CONNACK in time"))
            return
        if state is not CONNECTED or not self.server_keepalive:
            return
        ping_at = self._ping_at
        if ping_at is not None:
            timeout = self.ping_timeout if self.ping_timeout is not None else self.server_keepalive
            if now - ping_at >= timeout:
                if self.v5:
                    self.codec.send(Disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT))
                self._close(Closed(ReasonCode.KEEP_ALIVE_TIMEOUT,
                                   "no answer to PINGREQ in time"))
        elif now - self._last_out >= self.server_keepalive:
            self.codec.send_pingreq()
            self._ping_at = now

    # -- outgoing -----------------------------------------------------------------------------

    def _new_packet_id(self) -> int:
        """The next packet id no unfinished exchange uses ([MQTT-2.2.1-3], MQTT 5.0 §2.2.1)."""
        out, acks = self._out, self._acks
        if len(out) + len(acks) >= MAX_PACKET_ID:
            raise MqttLocalProtocolError("every packet identifier is in use")
        pid = self._next_id
        while pid in out or pid in acks:
            pid = pid + 1 if pid < MAX_PACKET_ID else 1
        self._next_id = pid + 1 if pid < MAX_PACKET_ID else 1
        return pid

    def _require_connected(self, what: str) -> None:
        if self.state is not CONNECTED:
            raise MqttLocalProtocolError(f"{what} while {self.state.value}")

    @property
    def inflight(self) -> int:
        """Outgoing QoS 1/2 messages sent and not fully acknowledged."""
        return len(self._out)

    @property
    def queued(self) -> int:
        """Outgoing QoS 1/2 messages waiting for room in the in-flight window."""
        return len(self._waiting)

    @property
    def window(self) -> int:
        """How many may be in flight: ours and the server's Receive Maximum, the smaller."""
        return self._window

    def publish(self, topic: str, payload: bytes, qos: int = 0, *, retain: bool = False,
                properties: Properties | None = None, token: object = None) -> None:
        """Send an application message (MQTT 5.0 §3.3, §4.3).

        QoS 0 goes out at once. QoS 1/2 goes out when the in-flight window has room
        ([MQTT-3.3.4-7]), else waits; :class:`Published` with ``token`` reports its end.

        Raises:
            MqttLocalProtocolError: not connected; QoS above the server's Maximum QoS
                ([MQTT-3.2.2-11]); retain where the server has none ([MQTT-3.2.2-14]); an
                invalid topic; larger than the server's Maximum Packet Size
                ([MQTT-3.2.2-15]). Nothing is sent then.
        """
        self._require_connected("PUBLISH")
        if qos > self.server_maximum_qos:
            raise MqttLocalProtocolError(f"QoS {qos} above the server's Maximum QoS "
                                         "[MQTT-3.2.2-11]", ReasonCode.QOS_NOT_SUPPORTED)
        if retain and not self.server_retain_available:
            raise MqttLocalProtocolError("retain where the server has none [MQTT-3.2.2-14]",
                                         ReasonCode.RETAIN_NOT_SUPPORTED)
        if not qos:
            self.codec.send_publish(topic, payload, 0, retain=retain, properties=properties)
            return
        if self._waiting or len(self._out) >= self._window:
            # Check now what would fail later, so the caller hears of it.
            size = len(encode_publish(topic, payload, qos, retain, False, 1, properties,
                                      self.level))
            limit = self.codec.peer_max_packet_size
            if limit is not None and size > limit:
                raise MqttLocalProtocolError(
                    f"{size}-byte PUBLISH exceeds the server's Maximum Packet Size {limit} "
                    "[MQTT-3.2.2-15]", ReasonCode.PACKET_TOO_LARGE)
            self._waiting.append((topic, payload, qos, retain, properties, token))
            return
        self._send_publish(topic, payload, qos, retain, properties, token)

    def _send_publish(self, topic: str, payload: bytes, qos: int, retain: bool,
                      properties: Properties | None, token: object) -> None:
        pid = self._new_packet_id()
        data = encode_publish(topic, payload, qos, retain, False, pid, properties, self.level)
        self.codec.send_encoded(data)  # (raises PACKET_TOO_LARGE before anything is kept)
        self._out[pid] = _Out(token, qos, data)

    def _send_waiting(self) -> None:
        waiting = self._waiting
        out = self._out
        while waiting and len(out) < self._window:
            topic, payload, qos, retain, properties, token = waiting.popleft()
            try:
                self._send_publish(topic, payload, qos, retain, properties, token)
            except MqttLocalProtocolError as exc:  # too large for a server met since
                self._events.append(Published(token, exc.reason_code, {}))

    def subscribe(self, subscriptions: Sequence[tuple[str, SubscriptionOptions]],
                  properties: Properties | None = None) -> int:
        """Send SUBSCRIBE (MQTT 5.0 §3.8); returns its packet id, which :class:`Subscribed`
        names.

        Raises:
            MqttLocalProtocolError: not connected, no filter ([MQTT-3.8.3-2]), or an invalid
                Topic Filter (§4.7).
        """
        self._require_connected("SUBSCRIBE")
        if not subscriptions:
            raise MqttLocalProtocolError("SUBSCRIBE without a topic filter [MQTT-3.8.3-2]")
        for topic_filter, _ in subscriptions:
            if not validate_topic_filter(topic_filter, shared=self.v5):
                raise MqttLocalProtocolError(f"invalid topic filter {topic_filter!r} (4.7)",
                                             ReasonCode.TOPIC_FILTER_INVALID)
        pid = self._new_packet_id()
        self.codec.send(Subscribe(pid, list(subscriptions), properties or {}))
        self._acks[pid] = len(subscriptions)
        return pid

    def unsubscribe(self, filters: Iterable[str], properties: Properties | None = None) -> int:
        """Send UNSUBSCRIBE (MQTT 5.0 §3.10); returns its packet id (:class:`Unsubscribed`).

        Raises:
            MqttLocalProtocolError: not connected, or no filter ([MQTT-3.10.3-2]).
        """
        self._require_connected("UNSUBSCRIBE")
        filters = list(filters)
        if not filters:
            raise MqttLocalProtocolError("UNSUBSCRIBE without a topic filter [MQTT-3.10.3-2]")
        pid = self._new_packet_id()
        self.codec.send(Unsubscribe(pid, filters, properties or {}))
        self._acks[pid] = len(filters)
        self._unsubs.add(pid)
        return pid

    # -- incoming -----------------------------------------------------------------------------

    def ack(self, packet_id: int) -> None:
        """The owner took the incoming QoS 1/2 message ``packet_id``: PUBACK (MQTT 5.0 §4.3.2)
        or PUBREC (§4.3.3). Without a connection the answer waits for the server to send the
        message again. An id the session does not know (its session was discarded) is
        ignored."""
        state = self._in.get(packet_id)
        connected = self.state is CONNECTED
        if state == _IN_QOS1:
            if connected:
                del self._in[packet_id]
                self.codec.send_puback(packet_id)
            else:
                self._in[packet_id] = _IN_ACKED
        elif state == _IN_QOS2:
            self._in[packet_id] = _IN_RECEIVED
            if connected:
                self.codec.send_pubrec(packet_id)

    def _handle_all(self, packets: list[Packet]) -> None:
        self._heard = True
        for packet in packets:
            if self.state is DISCONNECTED:  # a packet before closed the connection
                return
            try:
                if isinstance(packet, Publish):
                    self._handle_publish(packet)
                else:
                    self._handle(packet)
            except MqttRemoteProtocolError as exc:
                self._fail(exc)
                return

    def _handle_publish(self, p: Publish) -> None:
        """An incoming PUBLISH (MQTT 5.0 §3.3.4, §4.3)."""
        if self.state is not CONNECTED:
            raise _protocol_error("PUBLISH before CONNACK [MQTT-3.2.0-1]")
        if p.properties and "topic_alias" in p.properties:
            raise MqttRemoteProtocolError("a Topic Alias we did not allow [MQTT-3.1.2-27]",
                                          ReasonCode.TOPIC_ALIAS_INVALID)
        qos = p.qos
        if not qos:
            self._events.append(MessageReceived(p))
            return
        pid = p.packet_id
        assert pid is not None  # (the codec's: QoS > 0 has one)
        incoming = self._in
        state = incoming.get(pid)
        if state is None:
            if len(incoming) >= self.receive_maximum and self.v5:
                raise MqttRemoteProtocolError("more unacknowledged QoS 1/2 PUBLISHes than our "
                                              "Receive Maximum [MQTT-3.3.4-9]",
                                              ReasonCode.RECEIVE_MAXIMUM_EXCEEDED)
            incoming[pid] = _IN_QOS1 if qos == 1 else _IN_QOS2
            self._events.append(MessageReceived(p))
        elif state == _IN_RECEIVED:
            self.codec.send_pubrec(pid)  # the same message again [MQTT-4.3.3-10]
        elif state == _IN_ACKED:
            del incoming[pid]
            self.codec.send_puback(pid)
        # else: still with the owner; its ack answers this copy too.

    def _handle(self, p: Packet) -> None:
        if self.state is CONNECTING:
            if not isinstance(p, ConnAck):
                raise _protocol_error(f"{p.packet_type.name} before CONNACK [MQTT-3.2.0-1]")
            self._handle_connack(p)
        elif isinstance(p, PubAck):
            self._handle_puback(p)
        elif isinstance(p, PubRec):
            self._handle_pubrec(p)
        elif isinstance(p, PubComp):
            self._handle_pubcomp(p)
        elif isinstance(p, PubRel):
            self._handle_pubrel(p)
        elif isinstance(p, SubAck | UnsubAck):
            self._handle_suback(p)
        elif isinstance(p, PingResp):
            pass  # (any packet counts as an answer: _heard)
        elif isinstance(p, Disconnect):
            self._close(Closed(p.reason_code, "disconnected by the server", p.properties,
                               by_server=True))
        else:  # a second CONNACK, or AUTH we never asked for
            raise _protocol_error(f"unexpected {p.packet_type.name}")

    def _handle_connack(self, p: ConnAck) -> None:
        """CONNACK (MQTT 5.0 §3.2.2): refusal, Session Present, the server's limits."""
        if p.reason_code >= 0x80:
            self._move("connack_refused")
            self._events.append(Closed(p.reason_code, "refused by the server", p.properties,
                                       by_server=True))
            return
        if p.session_present and self.clean_start:
            raise _protocol_error("Session Present after Clean Start [MQTT-3.2.2-2]")
        # Session Present 1 to a client "without Session State" must close ([MQTT-3.2.2-4]);
        # an empty session is taken as one here, as other clients take it: a gateway that
        # restarts with a persistent client id gets its subscriptions back this way.
        self._move("connack_ok")
        props = p.properties
        if props:
            self.client_id = props.get("assigned_client_identifier", self.client_id)
            self.server_keepalive = props.get("server_keep_alive", self.keepalive)
            self.server_receive_maximum = props.get("receive_maximum",
                                                    DEFAULT_RECEIVE_MAXIMUM)
            self.server_maximum_qos = props.get("maximum_qos", 2)
            self.server_retain_available = bool(props.get("retain_available", 1))
        self._window = min(self.max_inflight, self.server_receive_maximum)
        if not p.session_present:
            self._discard_session()  # [MQTT-3.2.2-5]
        self._events.append(Connected(p.session_present, props))
        # Resend, in their first order, what the server's session still holds [MQTT-4.4.0-1].
        send = self.codec.send_encoded
        for pid, o in list(self._out.items()):
            try:
                send(o.data if o.released else bytes((o.data[0] | 0x08,)) + o.data[1:])
            except MqttLocalProtocolError as exc:  # above this server's Maximum Packet Size
                del self._out[pid]
                self._events.append(Published(o.token, exc.reason_code, {}))
        self._send_waiting()

    def _finish(self, pid: int, reason_code: int, properties: Properties) -> None:
        o = self._out.pop(pid)
        self._events.append(Published(o.token, reason_code, properties))
        if self._waiting:
            self._send_waiting()

    def _handle_puback(self, p: PubAck) -> None:
        o = self._out.get(p.packet_id)
        if o is None or o.qos != 1:  # not ours (3.1.1 says nothing; paho ignores it too)
            return
        self._finish(p.packet_id, p.reason_code, p.properties)

    def _handle_pubrec(self, p: PubRec) -> None:
        pid = p.packet_id
        o = self._out.get(pid)
        if o is None or o.qos != 2:
            if self.v5:  # PUBREL "Packet Identifier not found" (MQTT 5.0 §3.6.2.1)
                self.codec.send_pubrel(pid, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND)
            return
        if p.reason_code >= 0x80:  # the exchange ends here (MQTT 5.0 §4.3.3)
            self._finish(pid, p.reason_code, p.properties)
            return
        if not o.released:
            o.released = True
            o.data = b"\x62\x02" + pid.to_bytes(2, "big")  # PUBREL, success [MQTT-3.6.1-1]
        self.codec.send_encoded(o.data)

    def _handle_pubcomp(self, p: PubComp) -> None:
        o = self._out.get(p.packet_id)
        if o is None or not o.released:
            return
        self._finish(p.packet_id, p.reason_code, p.properties)

    def _handle_pubrel(self, p: PubRel) -> None:
        """PUBREL: the QoS 2 exchange ends with PUBCOMP (MQTT 5.0 §4.3.3)."""
        pid = p.packet_id
        state = self._in.get(pid)
        if state == _IN_RECEIVED:
            del self._in[pid]
            self.codec.send_pubcomp(pid)
        elif state is None:
            self.codec.send_pubcomp(pid, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND if self.v5
                                    else ReasonCode.SUCCESS)
        else:
            raise _protocol_error(f"PUBREL {pid} before our PUBREC (4.3.3)")

    def _handle_suback(self, p: SubAck | UnsubAck) -> None:
        pid = p.packet_id
        count = self._acks.get(pid)
        unsub = isinstance(p, UnsubAck)
        if count is None or (pid in self._unsubs) != unsub:
            return  # not ours: an answer to a connection that is gone
        if (not unsub or self.v5) and len(p.reason_codes) != count:
            raise _protocol_error(f"{p.packet_type.name} with {len(p.reason_codes)} reason "
                                  f"codes for {count} filters [MQTT-3.9.3-1] [MQTT-3.11.3-1]")
        del self._acks[pid]
        if unsub:
            self._unsubs.discard(pid)
            self._events.append(Unsubscribed(pid, p.reason_codes, p.properties))
        else:
            self._events.append(Subscribed(pid, p.reason_codes, p.properties))


def _protocol_error(message: str) -> MqttRemoteProtocolError:
    return MqttRemoteProtocolError(message, ReasonCode.PROTOCOL_ERROR)


__all__ = [
    "CONNECTED", "CONNECTING", "DISCONNECTED", "NEVER_EXPIRES", "TRANSITIONS", "Abandoned",
    "ClientSession", "Closed", "Connected", "Event", "MessageReceived", "Published", "State",
    "Subscribed", "Unsubscribed",
]
