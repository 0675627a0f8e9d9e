"""MQTT control packets as slotted dataclasses, with packet types, reason codes and errors.

How this works. Each of the 15 control packets is one ``@dataclass(slots=True)`` whose fields
are the packet's wire fields in Python types: strings are ``str``, binary data and payloads
``bytes``, flags ``bool``, reason codes ``int`` (a :class:`ReasonCode` after parsing), MQTT 5
properties a ``dict`` keyed by snake_case names (see :mod:`adapters.mqtt.properties`). The
same dataclass serves every protocol level; fields a level cannot carry (properties and
acknowledgement reason codes below MQTT 5) are empty on parse and left out on encode.

Reason codes are MQTT 5's everywhere, also on a 3.1/3.1.1 connection: the codec translates a
CONNACK reason code to the old return code (:data:`V3_CONNACK_RETURN_CODES`) when it writes one
and back when it reads one, so the session has one vocabulary. PUBLISH is not frozen and is
built positionally by the parser: it is the hot path.

Errors (``gateway.errors`` draws the whole tree)::

    RemoteProtocolError
    └── MqttRemoteProtocolError       the peer broke MQTT; .reason_code says what to answer
        └── UnsupportedProtocolVersion   CONNECT with an unknown protocol name or level
    LocalProtocolError
    └── MqttLocalProtocolError        we were asked to send something MQTT does not allow
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, ClassVar

from gateway.errors import LocalProtocolError, RemoteProtocolError

# Protocol levels (the CONNECT "Protocol Level" byte) and their protocol names.
MQTT_3_1 = 3  # "MQIsdp", IBM's MQTT V3.1 protocol specification
MQTT_3_1_1 = 4  # "MQTT", OASIS MQTT Version 3.1.1, 3.1.2.2
MQTT_5 = 5  # "MQTT", OASIS MQTT Version 5.0, 3.1.2.2
PROTOCOL_NAMES: dict[int, str] = {MQTT_3_1: "MQIsdp", MQTT_3_1_1: "MQTT", MQTT_5: "MQTT"}


class PacketType(IntEnum):
    """The control packet type in the high nibble of the first byte (MQTT 5.0 2.1.2)."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15  # MQTT 5 only; reserved (and so malformed) in 3.1.1


CONNECT = PacketType.CONNECT
CONNACK = PacketType.CONNACK
PUBLISH = PacketType.PUBLISH
PUBACK = PacketType.PUBACK
PUBREC = PacketType.PUBREC
PUBREL = PacketType.PUBREL
PUBCOMP = PacketType.PUBCOMP
SUBSCRIBE = PacketType.SUBSCRIBE
SUBACK = PacketType.SUBACK
UNSUBSCRIBE = PacketType.UNSUBSCRIBE
UNSUBACK = PacketType.UNSUBACK
PINGREQ = PacketType.PINGREQ
PINGRESP = PacketType.PINGRESP
DISCONNECT = PacketType.DISCONNECT
AUTH = PacketType.AUTH


class ReasonCode(IntEnum):
    """Every MQTT 5 reason code (MQTT 5.0 2.4, Table 2-6). Values below 0x80 mean success."""

    SUCCESS = 0x00
    NORMAL_DISCONNECTION = 0x00
    GRANTED_QOS_0 = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL_MESSAGE = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


REASON_CODE_BY_VALUE: dict[int, ReasonCode] = {int(rc): rc for rc in reversed(ReasonCode)}
"""Value -> canonical member; a dict lookup is cheaper than calling ``ReasonCode(value)``."""

_R = ReasonCode
REASON_CODES_ALLOWED: dict[PacketType, frozenset[int]] = {
    # MQTT 5.0 2.4 Table 2-6, column "MQTT Control Packets"; [MQTT-3.2.2-8], [MQTT-3.4.2-1],
    # [MQTT-3.5.2-1], [MQTT-3.6.2-1], [MQTT-3.7.2-1], [MQTT-3.9.3-2], [MQTT-3.11.3-2].
    CONNACK: frozenset({
        _R.SUCCESS, _R.UNSPECIFIED_ERROR, _R.MALFORMED_PACKET, _R.PROTOCOL_ERROR,
        _R.IMPLEMENTATION_SPECIFIC_ERROR, _R.UNSUPPORTED_PROTOCOL_VERSION,
        _R.CLIENT_IDENTIFIER_NOT_VALID, _R.BAD_USER_NAME_OR_PASSWORD, _R.NOT_AUTHORIZED,
        _R.SERVER_UNAVAILABLE, _R.SERVER_BUSY, _R.BANNED, _R.BAD_AUTHENTICATION_METHOD,
        _R.TOPIC_NAME_INVALID, _R.PACKET_TOO_LARGE, _R.QUOTA_EXCEEDED, _R.PAYLOAD_FORMAT_INVALID,
        _R.RETAIN_NOT_SUPPORTED, _R.QOS_NOT_SUPPORTED, _R.USE_ANOTHER_SERVER, _R.SERVER_MOVED,
        _R.CONNECTION_RATE_EXCEEDED}),
    PUBACK: frozenset({
        _R.SUCCESS, _R.NO_MATCHING_SUBSCRIBERS, _R.UNSPECIFIED_ERROR,
        _R.IMPLEMENTATION_SPECIFIC_ERROR, _R.NOT_AUTHORIZED, _R.TOPIC_NAME_INVALID,
        _R.PACKET_IDENTIFIER_IN_USE, _R.QUOTA_EXCEEDED, _R.PAYLOAD_FORMAT_INVALID}),
    PUBREL: frozenset({_R.SUCCESS, _R.PACKET_IDENTIFIER_NOT_FOUND}),
    SUBACK: frozenset({
        _R.GRANTED_QOS_0, _R.GRANTED_QOS_1, _R.GRANTED_QOS_2, _R.UNSPECIFIED_ERROR,
        _R.IMPLEMENTATION_SPECIFIC_ERROR, _R.NOT_AUTHORIZED, _R.TOPIC_FILTER_INVALID,
        _R.PACKET_IDENTIFIER_IN_USE, _R.QUOTA_EXCEEDED, _R.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED,
        _R.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED, _R.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED}),
    UNSUBACK: frozenset({
        _R.SUCCESS, _R.NO_SUBSCRIPTION_EXISTED, _R.UNSPECIFIED_ERROR,
        _R.IMPLEMENTATION_SPECIFIC_ERROR, _R.NOT_AUTHORIZED, _R.TOPIC_FILTER_INVALID,
        _R.PACKET_IDENTIFIER_IN_USE}),
    DISCONNECT: frozenset({
        _R.NORMAL_DISCONNECTION, _R.DISCONNECT_WITH_WILL_MESSAGE, _R.UNSPECIFIED_ERROR,
        _R.MALFORMED_PACKET, _R.PROTOCOL_ERROR, _R.IMPLEMENTATION_SPECIFIC_ERROR,
        _R.NOT_AUTHORIZED, _R.SERVER_BUSY, _R.SERVER_SHUTTING_DOWN,
        _R.BAD_AUTHENTICATION_METHOD, _R.KEEP_ALIVE_TIMEOUT, _R.SESSION_TAKEN_OVER,
        _R.TOPIC_FILTER_INVALID, _R.TOPIC_NAME_INVALID, _R.RECEIVE_MAXIMUM_EXCEEDED,
        _R.TOPIC_ALIAS_INVALID, _R.PACKET_TOO_LARGE, _R.MESSAGE_RATE_TOO_HIGH,
        _R.QUOTA_EXCEEDED, _R.ADMINISTRATIVE_ACTION, _R.PAYLOAD_FORMAT_INVALID,
        _R.RETAIN_NOT_SUPPORTED, _R.QOS_NOT_SUPPORTED, _R.USE_ANOTHER_SERVER, _R.SERVER_MOVED,
        _R.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED, _R.CONNECTION_RATE_EXCEEDED,
        _R.MAXIMUM_CONNECT_TIME, _R.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED,
        _R.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED}),
    AUTH: frozenset({_R.SUCCESS, _R.CONTINUE_AUTHENTICATION, _R.RE_AUTHENTICATE}),
}
REASON_CODES_ALLOWED[PUBREC] = REASON_CODES_ALLOWED[PUBACK]
REASON_CODES_ALLOWED[PUBCOMP] = REASON_CODES_ALLOWED[PUBREL]

V3_SUBACK_FAILURE = 0x80
"""The only SUBACK failure code of 3.1.1 (3.9.3); every MQTT 5 failure code maps to it."""


class ConnackReturnCode(IntEnum):
    """The CONNACK return codes of MQTT 3.1 and 3.1.1 (3.1.1 3.2.2.3, Table 3.1)."""

    ACCEPTED = 0
    UNACCEPTABLE_PROTOCOL_VERSION = 1
    IDENTIFIER_REJECTED = 2
    SERVER_UNAVAILABLE = 3
    BAD_USER_NAME_OR_PASSWORD = 4
    NOT_AUTHORIZED = 5


_C = ConnackReturnCode
V3_CONNACK_RETURN_CODES: dict[int, ConnackReturnCode] = {
    # MQTT 5 CONNACK reason code -> the 3.1/3.1.1 return code written in its place. The five
    # refusals of 3.1.1 map one to one; every other MQTT 5 refusal has no 3.1.1 counterpart
    # and is written as "server unavailable" or, for the authorization family, "not authorized".
    _R.SUCCESS: _C.ACCEPTED,
    _R.UNSUPPORTED_PROTOCOL_VERSION: _C.UNACCEPTABLE_PROTOCOL_VERSION,
    _R.CLIENT_IDENTIFIER_NOT_VALID: _C.IDENTIFIER_REJECTED,
    _R.SERVER_UNAVAILABLE: _C.SERVER_UNAVAILABLE,
    _R.BAD_USER_NAME_OR_PASSWORD: _C.BAD_USER_NAME_OR_PASSWORD,
    _R.NOT_AUTHORIZED: _C.NOT_AUTHORIZED,
    _R.BANNED: _C.NOT_AUTHORIZED,
    _R.BAD_AUTHENTICATION_METHOD: _C.NOT_AUTHORIZED,
}
V5_REASON_FOR_V3_CONNACK: dict[int, ReasonCode] = {
    _C.ACCEPTED: _R.SUCCESS,
    _C.UNACCEPTABLE_PROTOCOL_VERSION: _R.UNSUPPORTED_PROTOCOL_VERSION,
    _C.IDENTIFIER_REJECTED: _R.CLIENT_IDENTIFIER_NOT_VALID,
    _C.SERVER_UNAVAILABLE: _R.SERVER_UNAVAILABLE,
    _C.BAD_USER_NAME_OR_PASSWORD: _R.BAD_USER_NAME_OR_PASSWORD,
    _C.NOT_AUTHORIZED: _R.NOT_AUTHORIZED,
}
"""3.1/3.1.1 return code -> the MQTT 5 reason code a parsed CONNACK carries (a bijection)."""


def v3_connack_return_code(reason_code: int) -> ConnackReturnCode:
    """The 3.1/3.1.1 CONNACK return code that stands for an MQTT 5 CONNACK reason code."""
    return V3_CONNACK_RETURN_CODES.get(reason_code, _C.SERVER_UNAVAILABLE)


# --------------------------------------------------------------------------------- errors


def _slug(rc: ReasonCode) -> str:
    return rc.name.lower().replace("_", "-")


class MqttRemoteProtocolError(RemoteProtocolError):
    """The peer sent bytes MQTT does not allow.

    ``reason_code`` is the MQTT 5 reason code to put in the CONNACK (before CONNACK was sent)
    or DISCONNECT (after) that answers it, as MQTT 5.0 4.13 asks; on a 3.1/3.1.1 connection
    the shell just closes. ``events`` holds the packets that arrived complete and valid before
    the bad one, in order: the shell may still act on them before it closes.
    """

    def __init__(self, message: str, reason_code: int = ReasonCode.MALFORMED_PACKET) -> None:
        rc = REASON_CODE_BY_VALUE[reason_code]
        super().__init__(message, reason=_slug(rc))
        self.reason_code: ReasonCode = rc
        self.events: list[Packet] = []


class UnsupportedProtocolVersion(MqttRemoteProtocolError):
    """A CONNECT whose protocol name and level are not MQIsdp/3, MQTT/4 or MQTT/5.

    ``reply`` is the CONNACK to write before closing: return code 0x01 in the 3.1.1 format
    for a level below 5 (3.1.1 [MQTT-3.1.2-2]), reason code 0x84 in the MQTT 5 format
    otherwise (MQTT 5.0 [MQTT-3.1.2-2]); answering a wrong protocol *name* is optional
    ([MQTT-3.1.2-1] in both), so the shell may also close without it.
    """

    def __init__(self, protocol_name: str, protocol_level: int) -> None:
        super().__init__(
            f"unsupported protocol {protocol_name!r} level {protocol_level}",
            ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
        )
        self.protocol_name = protocol_name
        self.protocol_level = protocol_level
        self.reply = b"\x20\x03\x00\x84\x00" if protocol_level >= MQTT_5 else b"\x20\x02\x00\x01"


class MqttLocalProtocolError(LocalProtocolError):
    """We were asked to send something MQTT does not allow (or that the peer cannot take).

    For PUBLISH over the peer's Maximum Packet Size the reason code is PACKET_TOO_LARGE and
    the session drops the message as if it were sent (MQTT 5.0 [MQTT-3.1.2-25]).
    """

    def __init__(self, message: str, reason_code: int = ReasonCode.PROTOCOL_ERROR) -> None:
        rc = REASON_CODE_BY_VALUE[reason_code]
        super().__init__(message, reason=_slug(rc))
        self.reason_code: ReasonCode = rc


# -------------------------------------------------------------------------------- packets

Properties = dict[str, Any]
"""MQTT 5 properties by snake_case name; see :mod:`adapters.mqtt.properties`."""


@dataclass(slots=True)
class Will:
    """The Will Message of a CONNECT (MQTT 5.0 3.1.2.5, 3.1.3.2-3.1.3.4)."""

    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Connect:
    """CONNECT (MQTT 5.0 3.1; 3.1.1 3.1). ``clean_start`` is 3.1.1's Clean Session."""

    packet_type: ClassVar[PacketType] = PacketType.CONNECT
    protocol_name: str = "MQTT"
    protocol_level: int = MQTT_3_1_1
    clean_start: bool = True
    keepalive: int = 0
    client_id: str = ""
    will: Will | None = None
    username: str | None = None
    password: bytes | None = None
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class ConnAck:
    """CONNACK (MQTT 5.0 3.2). ``reason_code`` is MQTT 5's on every level (see module doc)."""

    packet_type: ClassVar[PacketType] = PacketType.CONNACK
    session_present: bool = False
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Publish:
    """PUBLISH (MQTT 5.0 3.3). ``packet_id`` is None exactly when ``qos`` is 0."""

    packet_type: ClassVar[PacketType] = PacketType.PUBLISH
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PubAck:
    """PUBACK (MQTT 5.0 3.4): the answer to a QoS 1 PUBLISH."""

    packet_type: ClassVar[PacketType] = PacketType.PUBACK
    packet_id: int
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PubRec:
    """PUBREC (MQTT 5.0 3.5): first answer to a QoS 2 PUBLISH."""

    packet_type: ClassVar[PacketType] = PacketType.PUBREC
    packet_id: int
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PubRel:
    """PUBREL (MQTT 5.0 3.6): the answer to PUBREC; fixed-header flags 0b0010."""

    packet_type: ClassVar[PacketType] = PacketType.PUBREL
    packet_id: int
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PubComp:
    """PUBCOMP (MQTT 5.0 3.7): the answer to PUBREL, last of the QoS 2 exchange."""

    packet_type: ClassVar[PacketType] = PacketType.PUBCOMP
    packet_id: int
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True, frozen=True)
class SubscriptionOptions:
    """The options byte after each SUBSCRIBE topic filter (MQTT 5.0 3.8.3.1).

    Below MQTT 5 only ``qos`` exists (3.1.1 3.8.3, "Requested QoS") and the rest must be at
    their defaults.
    """

    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(slots=True)
class Subscribe:
    """SUBSCRIBE (MQTT 5.0 3.8): filters are returned as sent, unvalidated (see codec)."""

    packet_type: ClassVar[PacketType] = PacketType.SUBSCRIBE
    packet_id: int
    subscriptions: list[tuple[str, SubscriptionOptions]]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class SubAck:
    """SUBACK (MQTT 5.0 3.9): one reason code per filter, in the SUBSCRIBE's order."""

    packet_type: ClassVar[PacketType] = PacketType.SUBACK
    packet_id: int
    reason_codes: list[int]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Unsubscribe:
    """UNSUBSCRIBE (MQTT 5.0 3.10)."""

    packet_type: ClassVar[PacketType] = PacketType.UNSUBSCRIBE
    packet_id: int
    filters: list[str]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class UnsubAck:
    """UNSUBACK (MQTT 5.0 3.11). Below MQTT 5 it has no payload: ``reason_codes`` is empty."""

    packet_type: ClassVar[PacketType] = PacketType.UNSUBACK
    packet_id: int
    reason_codes: list[int] = field(default_factory=list)
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PingReq:
    """PINGREQ (MQTT 5.0 3.12)."""

    packet_type: ClassVar[PacketType] = PacketType.PINGREQ


@dataclass(slots=True)
class PingResp:
    """PINGRESP (MQTT 5.0 3.13)."""

    packet_type: ClassVar[PacketType] = PacketType.PINGRESP


@dataclass(slots=True)
class Disconnect:
    """DISCONNECT (MQTT 5.0 3.14). Below MQTT 5 only the client sends it, with no fields."""

    packet_type: ClassVar[PacketType] = PacketType.DISCONNECT
    reason_code: int = ReasonCode.NORMAL_DISCONNECTION
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Auth:
    """AUTH (MQTT 5.0 3.15), enhanced authentication; MQTT 5 only."""

    packet_type: ClassVar[PacketType] = PacketType.AUTH
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=dict)


Packet = (
    Connect | ConnAck | Publish | PubAck | PubRec | PubRel | PubComp | Subscribe | SubAck
    | Unsubscribe | UnsubAck | PingReq | PingResp | Disconnect | Auth
)
"""Any control packet."""

PACKET_CLASSES: dict[PacketType, type[Packet]] = {
    cls.packet_type: cls
    for cls in (Connect, ConnAck, Publish, PubAck, PubRec, PubRel, PubComp, Subscribe,
                SubAck, Unsubscribe, UnsubAck, PingReq, PingResp, Disconnect, Auth)
}
