"""The default mapping between MQTT PUBLISH packets and core messages.

How this works. The MQTT adapter parses a PUBLISH and calls :func:`mqtt_to_message` with the
payload, the fixed-header flags and the MQTT 5 properties; it gets back a core
:class:`~gateway.message.Message` to publish. For every delivery to an MQTT subscriber it calls
:func:`message_to_mqtt` and gets the payload, the message's own QoS and the MQTT 5 properties
to send (the adapter adds the topic, the packet id, subscription identifiers and a topic
alias). Both functions are pure and run once per message, so they only read precomputed
tables and build the one dict and list they return.

The rules are the rows of the two tables in ``mappings/README.md`` (MQTT → core, core → MQTT)
plus its body rules, and the code below follows them in the same order, one block per row.
The same rows are the default mapping rules ``mappings/defaults/mqtt.yaml``, which the engine
runs when a user rule overrides one of them; these two functions are their fast path, and
``tests/unit/test_mapping_mqtt_defaults.py`` proves the two agree. The rows that are more than
a rename are functions here (``body_in``, ``user_headers_in``, ``body_out``, ``qos_out``, …)
that the rules call as converters (:mod:`mappings.converters`). The tables that drive the
code are the module constants ``_MODE_BY_QOS`` and ``_QOS_BY_MODE``, and every property,
user property and MQTT 5 property name and the except lists come from the rows
(``SHAPE_IN`` / ``SHAPE_OUT`` below, checked when this module is imported;
:mod:`mappings.rows`); how typed property
values are written as text and read back is :mod:`mappings.typedtext`.

What MQTT 5 cannot carry natively rides in user properties: the JMS header fields with no
MQTT slot (``JMSType``, ``JMSPriority``, and ``JMSMessageID`` of a message that did not come
from an MQTT publisher) and the types of non-string JMS properties (``gw-types``), so a
message that goes core → MQTT 5 → core keeps every property with its width. Nothing else is
added: a message an MQTT 5 client published reaches MQTT 5 subscribers with its own user
properties and Payload Format Indicator ([MQTT-3.3.2-4], [MQTT-3.3.2-17], [MQTT-3.3.2-18]);
the JMSMessageID and trace id the gateway stamps on it stay in the delivery log. The trace id
travels as the ``gw-trace-id`` user property only where it is asked for: the mqtt transport
adds it (:func:`trace_user_property`) and a mapping rule may (``mappings/README.md``).
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from gateway.message import (
    DEFAULT_PRIORITY,
    BodyKind,
    DeliveryMode,
    Destination,
    Message,
    new_message,
)
from gateway.types import Int8
from mappings.rows import check_shape, except_names
from mappings.rows import name as row_name
from mappings.typedtext import (
    JSON_CONTENT_TYPE,
    apply_types,
    is_text_content_type,
    json_payload,
    render_properties,
    wire_escape,
    wire_safe,
)

__all__ = [
    "CONTENT_TYPE_PROPERTY",
    "PFI_PROPERTY",
    "QOS_PROPERTY",
    "RETAIN_PROPERTY",
    "TRACE_USER_PROPERTY",
    "TYPES_USER_PROPERTY",
    "USER_RECORD_PROPERTY",
    "MqttOut",
    "PayloadFormatInvalid",
    "message_to_mqtt",
    "mqtt_to_message",
    "trace_user_property",
]

# -- the rows this fast path is written for (mappings/defaults/mqtt.yaml) -----------------------
# Each pair is a rule and its step as the rows say it (mappings.rows.check_shape, checked on
# import); a field "section.{}" is a name taken from that row below, so a property, user
# property or MQTT 5 property name changed in the rows changes both the engine and these
# functions. When the rows are not these, these functions are not the default mapping
# (mappings.engine.default_wire).
SHAPE_IN = (
    ("mqtt.in.body", "convert mqtt-body-in: wire.payload, wire.{}, wire.{} -> body"),
    ("mqtt.in.expiry", "convert mqtt-expiry-in: wire.{}, wire.now -> header.JMSExpiration"),
    ("mqtt.in.correlation-data", "copy: wire.{} -> header.JMSCorrelationID"),
    ("mqtt.in.user-properties", "copy_all: wire.user -> property"),
    ("mqtt.in.user-headers", "convert mqtt-user-headers-in: wire.user.{}, wire.user.{}, "
                             "wire.user.{}, wire.user.{}, property.* -> property.*, "
                             "header.JMSType, header.JMSPriority, trace_id"),
    ("mqtt.in.user-record", "convert mqtt-user-record-in: wire.user -> property.{}"),
    ("mqtt.in.content-type", "copy: wire.{} -> property.{}"),
    ("mqtt.in.payload-format", "copy: wire.{} -> property.{} as int8"),
    ("mqtt.in.qos", "copy: wire.qos -> property.{} as int8"),
    ("mqtt.in.retain", "convert mqtt-retain-in: wire.retain -> property.{}"),
    ("mqtt.in.delivery-mode", "convert mqtt-mode-in: wire.qos -> header.JMSDeliveryMode"),
    ("mqtt.in.timestamp", "copy: wire.now -> header.JMSTimestamp"),
)
SHAPE_OUT = (
    ("mqtt.out.body", "convert mqtt-body-out: body_kind, body, property.{}, property.{} -> "
                      "wire.payload, wire.{}, wire.{}"),
    ("mqtt.out.qos", "convert mqtt-qos-out: property.{}, header.JMSDeliveryMode -> wire.qos"),
    ("mqtt.out.content-type", "convert mqtt-content-type-out: property.{}, body_kind -> "
                              "wire.{}"),
    ("mqtt.out.expiry", "convert mqtt-expiry-out: expiry, wire.now -> wire.{}"),
    ("mqtt.out.response-topic", "copy: wire.reply_topic -> wire.{}"),
    ("mqtt.out.correlation-data", "convert mqtt-correlation-out: header.JMSCorrelationID -> "
                                  "wire.{}"),
    ("mqtt.out.user-properties", "copy_all typed-text: property -> wire.user"),
    ("mqtt.out.user-record", "convert mqtt-user-record-out: property.{}, wire.user -> "
                             "wire.user"),
    ("mqtt.out.type", "convert mqtt-text-out: header.JMSType -> wire.user.{}"),
    ("mqtt.out.priority", "convert mqtt-priority-out: header.JMSPriority -> wire.user.{}"),
    ("mqtt.out.message-id", "convert mqtt-message-id-out: header.JMSMessageID, property.{} -> "
                            "wire.user.{}"),
    ("mqtt.out.gw-types", "convert gw-types-out: wire.types -> wire.user.{}"),
)
check_shape("mqtt", "in", SHAPE_IN)
check_shape("mqtt", "out", SHAPE_OUT)

# int8: the publisher's MQTT QoS, so a later MQTT hop knows it
QOS_PROPERTY = row_name("property", "mqtt.in.qos to[0]", "mqtt.out.body from[3]",
                        "mqtt.out.qos from[0]", "mqtt.out.message-id from[1]")
# boolean, present (true) only when the retain flag was set
RETAIN_PROPERTY = row_name("property", "mqtt.in.retain to[0]")
# string; shared with AMQP and STOMP content-type
CONTENT_TYPE_PROPERTY = row_name("property", "mqtt.in.content-type to[0]",
                                 "mqtt.out.content-type from[0]")
# int8: the MQTT 5 publisher's Payload Format Indicator (0 or 1), present only when it sent
# one, so MQTT 5 subscribers get it unaltered [MQTT-3.3.2-4] (and none when it sent none).
PFI_PROPERTY = row_name("property", "mqtt.in.payload-format to[0]", "mqtt.out.body from[2]")
# string: the MQTT 5 publisher's user properties as sent (a JSON array of [name, value]),
# present only when JMS properties cannot hold them (a name repeated, or empty), so MQTT 5
# subscribers get them all, in order [MQTT-3.3.2-17], [MQTT-3.3.2-18].
USER_RECORD_PROPERTY = row_name("property", "mqtt.in.user-record to[0]",
                                "mqtt.out.user-record from[0]")
# MQTT 5 user property carrying the gateway trace id
TRACE_USER_PROPERTY = row_name("wire.user", "mqtt.in.user-headers from[3]")
# MQTT 5 user property listing non-string property types
TYPES_USER_PROPERTY = row_name("wire.user", "mqtt.in.user-headers from[0]",
                               "mqtt.out.gw-types to[0]")

# MQTT 5 property names as the codec spells them (snake_case).
PFI = row_name("wire", "mqtt.in.body from[1]", "mqtt.in.payload-format from[0]",
               "mqtt.out.body to[1]")
EXPIRY = row_name("wire", "mqtt.in.expiry from[0]", "mqtt.out.expiry to[0]")
CONTENT_TYPE = row_name("wire", "mqtt.in.body from[2]", "mqtt.in.content-type from[0]",
                        "mqtt.out.body to[2]", "mqtt.out.content-type to[0]")
RESPONSE_TOPIC = row_name("wire", "mqtt.out.response-topic to[0]")
CORRELATION_DATA = row_name("wire", "mqtt.in.correlation-data from[0]",
                            "mqtt.out.correlation-data to[0]")
USER_PROPERTY = "user_property"  # wire.user (mappings/wire.py)

# JMS header fields with no MQTT 5 slot travel as user properties of these names.
JMS_TYPE = row_name("wire.user", "mqtt.in.user-headers from[1]", "mqtt.out.type to[0]")
JMS_PRIORITY = row_name("wire.user", "mqtt.in.user-headers from[2]", "mqtt.out.priority to[0]")
JMS_MESSAGE_ID = row_name("wire.user", "mqtt.out.message-id to[0]")


# The Message Expiry Interval is a Four Byte Integer (MQTT 5.0 3.3.2.3.3).
MAX_EXPIRY_INTERVAL = 0xFFFFFFFF

_TEXT = BodyKind.TEXT
_BYTES = BodyKind.BYTES
_OBJECT = BodyKind.OBJECT
_NONE = BodyKind.NONE
_NON_PERSISTENT = DeliveryMode.NON_PERSISTENT
_PERSISTENT = DeliveryMode.PERSISTENT

# -- tables ------------------------------------------------------------------------------------

# In: QoS 0 → NON_PERSISTENT, QoS 1 and 2 → PERSISTENT; the QoS itself kept as an int8.
_MODE_BY_QOS = (_NON_PERSISTENT, _PERSISTENT, _PERSISTENT)
_QOS_INT8 = (Int8(0), Int8(1), Int8(2))
_PFI_INT8 = (Int8(0), Int8(1))

# Out: a message without the publisher's QoS gets one from its delivery mode.
_QOS_BY_MODE: dict[int, int] = {
    DeliveryMode.PERSISTENT: 2,
    DeliveryMode.NON_PERSISTENT: 1,
    DeliveryMode.RELIABLE: 0,
}
_QOS_VALUES = {0: 0, 1: 1, 2: 2}  # legal QOS_PROPERTY values (Int8(1) hashes as 1)

# In: user property names that are not copied into JMS properties as they are. The gateway's
# own MQTT properties are set from the packet, never from a user property of the same name
# (the except list of mqtt.in.user-properties).
_SPECIAL_IN = frozenset(except_names("mqtt.in.user-properties"))

# Out: JMS properties that are not sent as user properties (they are MQTT fields already, or
# the trace id, or names the gateway's own ones would shadow): the except list of
# mqtt.out.user-properties.
_SKIP_OUT = frozenset(except_names("mqtt.out.user-properties"))
_PFI_VALUES = {0: 0, 1: 1}  # legal PFI_PROPERTY values (Int8(1) hashes as 1)

# -- MQTT → core -------------------------------------------------------------------------------


class PayloadFormatInvalid(Exception):
    """The Payload Format Indicator says UTF-8 but the payload is not (MQTT 5.0 3.3.2.3.2).

    The adapter answers with reason code 0x99 (Payload format invalid) in the PUBACK / PUBREC
    (or a DISCONNECT for QoS 0).
    """

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.reason_code = 0x99  # set here, not on the class: the compiled build (setup.py)


def mqtt_to_message(
    *,
    payload: bytes | bytearray | memoryview,
    qos: int,
    retain: bool,
    properties: dict[str, Any],
    level: int,
    destination: Destination,
    reply_to: Destination | None,
    now_ms: int,
) -> Message:
    """Build the core message for one MQTT PUBLISH (table "MQTT → core" in the README).

    ``properties`` is the codec's MQTT 5 PUBLISH property dict (ignored below level 5);
    ``response_topic`` in it is ignored: the adapter maps it to ``reply_to`` (a destination
    it has checked). ``topic_alias`` and ``subscription_identifier`` are hop-by-hop and not
    kept. ``timestamp`` is set to ``now_ms``; the broker stamps the message id.

    Raises:
        PayloadFormatInvalid: ``payload_format_indicator`` is 1 but the payload is not UTF-8.
    """
    if type(payload) is not bytes:
        payload = bytes(payload)
    body: Any = payload
    kind = _BYTES
    props: dict[str, Any] = {}
    expiration = 0
    correlation_id = None
    trace_id = None
    msg_type = None
    priority = DEFAULT_PRIORITY
    content_type = None
    if level >= 5 and properties:
        # Body: text when the publisher says the payload is UTF-8 (MQTT 5.0 3.3.2.3.2) or its
        # content type is a text type.
        content_type = properties.get(CONTENT_TYPE)
        if properties.get(PFI) == 1:
            try:
                body = payload.decode()
            except UnicodeDecodeError:
                raise PayloadFormatInvalid("payload is not UTF-8 but says it is") from None
            kind = _TEXT
        elif content_type is not None and is_text_content_type(content_type):
            try:
                body = payload.decode()
                kind = _TEXT
            except UnicodeDecodeError:
                pass
        # Message Expiry Interval (seconds from now) → JMSExpiration (absolute ms).
        interval = properties.get(EXPIRY)
        if interval is not None:
            expiration = now_ms + interval * 1000
        # Correlation Data (binary) → JMSCorrelationID, kept as bytes.
        correlation_id = properties.get(CORRELATION_DATA)
        # User Properties → JMS properties (first value of a repeated name wins).
        pairs = properties.get(USER_PROPERTY)
        repeated = False
        if pairs:
            setdefault = props.setdefault
            special: dict[str, str] | None = None
            for name, value in pairs:
                if name in _SPECIAL_IN:
                    if special is None:
                        special = {}
                    special.setdefault(name, value)
                elif name and name not in props:
                    props[name] = value
                else:
                    repeated = True
            if special is not None:
                # The headers carried as user properties join the properties until gw-types
                # has been applied (it may mark them escaped), then leave them.
                for name in (JMS_TYPE, JMS_PRIORITY, TRACE_USER_PROPERTY):
                    if name in special:
                        setdefault(name, special[name])
                types = special.get(TYPES_USER_PROPERTY)
                if types:
                    props = apply_types(props, types)
                trace_id = props.pop(TRACE_USER_PROPERTY, None)
                if type(trace_id) is not str:  # gw-types cannot make a trace id a number
                    trace_id = None
                value = props.get(JMS_TYPE)
                if type(value) is str:
                    msg_type = props.pop(JMS_TYPE)
                value = props.get(JMS_PRIORITY)
                if type(value) is str and len(value) == 1 and "0" <= value <= "9":
                    del props[JMS_PRIORITY]
                    priority = ord(value) - 48
        if repeated and pairs:
            props[USER_RECORD_PROPERTY] = _user_record(pairs)
        if content_type is not None:
            props[CONTENT_TYPE_PROPERTY] = content_type
        pfi = properties.get(PFI)
        if pfi is not None:
            props[PFI_PROPERTY] = _PFI_INT8[pfi] if pfi in _PFI_VALUES else Int8(pfi)
    props[QOS_PROPERTY] = _QOS_INT8[qos]
    if retain:
        props[RETAIN_PROPERTY] = True
    msg = new_message(body, kind)
    msg.properties = props
    msg.destination = destination
    msg.delivery_mode = _MODE_BY_QOS[qos]
    msg.priority = priority
    msg.correlation_id = correlation_id
    msg.reply_to = reply_to
    msg.type = msg_type
    msg.expiration = expiration
    msg.timestamp = now_ms
    # Size for limits: the payload plus a flat allowance per property (no walk needed).
    msg.size = len(payload) + 64 + 48 * len(props)
    if trace_id is not None:
        msg.trace_id = trace_id
    return msg


# -- the rules of mqtt_to_message that are more than one line, for the default mapping rules
# (mappings/defaults/mqtt.yaml); tests/unit/test_mapping_mqtt_defaults.py proves that the
# rules and mqtt_to_message agree.


def body_in(payload: bytes, pfi: int | None, content_type: str | None) -> tuple[BodyKind, Any]:
    """The body of a PUBLISH: TEXT when the Payload Format Indicator says UTF-8 (or the
    content type is a text type and it decodes), else BYTES (README "Body rules").

    Raises:
        PayloadFormatInvalid: ``pfi`` is 1 but the payload is not UTF-8.
    """
    if pfi == 1:
        try:
            return _TEXT, payload.decode()
        except UnicodeDecodeError:
            raise PayloadFormatInvalid("payload is not UTF-8 but says it is") from None
    if content_type is not None and is_text_content_type(content_type):
        try:
            return _TEXT, payload.decode()
        except UnicodeDecodeError:
            pass
    return _BYTES, payload


def user_headers_in(props: dict[str, Any], types: str | None, jms_type: str | None,
                    jms_priority: str | None, trace: str | None
                    ) -> tuple[dict[str, Any], str | None, int | None, str | None]:
    """gw-types applied to the properties and to the JMS header fields carried as user
    properties (first values given), which join the properties meanwhile; then the trace id,
    JMSType and a one-digit JMSPriority leave them (others stay properties)."""
    setdefault = props.setdefault
    # (Not "value": compiled, that name would be typed str | None, and gw-types may make the
    # property read below any type.)
    for name, given in ((JMS_TYPE, jms_type), (JMS_PRIORITY, jms_priority),
                        (TRACE_USER_PROPERTY, trace)):
        if given is not None:
            setdefault(name, given)
    value: Any
    if types:
        props = apply_types(props, types)
    trace_id = props.pop(TRACE_USER_PROPERTY, None)
    if type(trace_id) is not str:
        trace_id = None
    msg_type = None
    value = props.get(JMS_TYPE)
    if type(value) is str:
        msg_type = props.pop(JMS_TYPE)
    priority = None
    value = props.get(JMS_PRIORITY)
    if type(value) is str and len(value) == 1 and "0" <= value <= "9":
        del props[JMS_PRIORITY]
        priority = ord(value) - 48
    return props, msg_type, priority, trace_id


def _user_record(pairs: list[tuple[str, str]]) -> str:
    """The JSON of the user properties with the gateway's own names left out."""
    return json.dumps([[n, v] for n, v in pairs if n not in _SPECIAL_IN], ensure_ascii=False,
                      separators=(",", ":"))


def user_record_in(pairs: list[tuple[str, str]] | None) -> str | None:
    """``JMS_GW_MQTT_USER_PROPERTIES`` for a PUBLISH's user properties: their JSON when a
    name (other than the gateway's own) repeats or is empty, else ``None``."""
    if not pairs:
        return None
    seen: set[str] = set()
    for name, _ in pairs:
        if name in _SPECIAL_IN:
            continue
        if not name or name in seen:
            return _user_record(pairs)
        seen.add(name)
    return None


def user_record_out(record: Any, rendered: list[tuple[str, str]]
                    ) -> list[tuple[str, str]] | None:
    """The recorded user properties (``JMS_GW_MQTT_USER_PROPERTIES``) to send instead of
    ``rendered`` (the properties as user properties): when the record is well formed and
    still agrees with them -- the first value of each name, in order, is what they hold --
    so a mapping rule that changed a property is not undone; else ``None``."""
    if type(record) is not str:
        return None
    try:
        kept = json.loads(record)
    except ValueError:
        return None
    if type(kept) is not list:
        return None
    out: list[tuple[str, str]] = []
    firsts: list[tuple[str, str]] = []
    seen: set[str] = set()
    for item in kept:
        if type(item) is not list or len(item) != 2:
            return None
        name, value = item
        if type(name) is not str or type(value) is not str or not wire_safe(name) or \
                not wire_safe(value):
            return None
        out.append((name, value))
        if name and name not in seen:
            seen.add(name)
            firsts.append((name, value))
    return out if firsts == rendered else None


def mode_in(qos: int) -> DeliveryMode:
    """QoS 0 → NON_PERSISTENT, 1 and 2 → PERSISTENT."""
    return _MODE_BY_QOS[qos]


# -- core → MQTT -------------------------------------------------------------------------------


class MqttOut(NamedTuple):
    """What to send to one MQTT subscriber (the adapter adds the topic and packet id)."""

    payload: bytes
    qos: int  # the message's own QoS; the adapter sends min(granted, qos)
    properties: dict[str, Any]  # MQTT 5 PUBLISH properties; a fresh dict, {} below level 5


def message_to_mqtt(msg: Message, *, level: int, now_ms: int, reply_topic: str | None) -> MqttOut:
    """The MQTT rendering of a core message (table "core → MQTT" in the README).

    ``reply_topic`` is the adapter's MQTT rendering of ``msg.reply_to`` (or ``None``). The
    Message Expiry Interval sent is what is left of the message's lifetime, rounded up to
    whole seconds [MQTT-3.3.2-6]; the adapter drops expired messages before calling this.
    """
    kind = msg.body_kind
    body = msg.body
    utf8 = False
    json_body = False
    if kind is _TEXT:
        try:
            payload = body.encode()
            utf8 = True
        except UnicodeEncodeError:
            # A Java string with a lone surrogate: sent as it is, but not claimed as UTF-8.
            payload = body.encode("utf-8", "surrogatepass")
    elif kind is _BYTES or kind is _OBJECT:
        payload = body
    elif kind is _NONE:
        payload = b""
    else:
        payload = json_payload(body)
        utf8 = json_body = True
    props = msg.properties
    qos = None
    q = None
    if props:
        q = props.get(QOS_PROPERTY)
        if q is not None:
            qos = _QOS_VALUES.get(q)
    if qos is None:
        qos = _QOS_BY_MODE.get(msg.delivery_mode, 0)
    out: dict[str, Any] = {}
    if level < 5:
        return MqttOut(payload, qos, out)
    if props:
        # The publisher's own indicator, or none if an MQTT publisher sent none [MQTT-3.3.2-4].
        pfi = pfi_out(utf8, json_body, props.get(PFI_PROPERTY), q)
        if pfi is not None:
            out[PFI] = pfi
    elif utf8:
        out[PFI] = 1
    if json_body:
        out[CONTENT_TYPE] = JSON_CONTENT_TYPE
    elif props:
        ct = props.get(CONTENT_TYPE_PROPERTY)
        if type(ct) is str:
            out[CONTENT_TYPE] = ct
    expires = msg.expires_at or msg.expiration
    if expires:
        left = expires - now_ms
        if left <= 0:
            out[EXPIRY] = 1
        else:
            seconds = -(-left // 1000)
            out[EXPIRY] = seconds if seconds < MAX_EXPIRY_INTERVAL else MAX_EXPIRY_INTERVAL
    if reply_topic is not None:
        out[RESPONSE_TOPIC] = reply_topic
    corr = msg.correlation_id
    if corr is not None:
        out[CORRELATION_DATA] = (
            corr if isinstance(corr, bytes) else corr.encode("utf-8", "surrogatepass")
        )
    pairs = _user_properties(msg, props)
    if pairs:
        out[USER_PROPERTY] = pairs
    return MqttOut(payload, qos, out)


# -- the rules of message_to_mqtt that are more than one line, for the default mapping rules


def pfi_out(utf8: bool, json_body: bool, recorded: Any, qos_property: Any) -> int | None:
    """The Payload Format Indicator sent (README "Body rules", Out): 1 for our JSON; the
    publisher's recorded one (``JMS_GW_MQTT_PFI``) when there is one; none for a message an
    MQTT publisher sent without one (``JMS_GW_MQTT_QOS`` is set); 1 for any other UTF-8 text."""
    if json_body:
        return 1
    if recorded is not None:
        pfi = _PFI_VALUES.get(recorded)
        if pfi is not None:
            return pfi
    if not utf8 or qos_property is not None:
        return None
    return 1


def body_out(kind: BodyKind, body: Any) -> tuple[bytes, bool, bool]:
    """The payload of a body, whether it is UTF-8 (the Payload Format Indicator) and whether
    it is the JSON of a map or stream (README "Body rules", Out)."""
    if kind is _TEXT:
        try:
            return body.encode(), True, False
        except UnicodeEncodeError:
            return body.encode("utf-8", "surrogatepass"), False, False
    if kind is _BYTES or kind is _OBJECT:
        return body, False, False
    if kind is _NONE:
        return b"", False, False
    return json_payload(body), True, True


def qos_out(qos_property: Any, mode: DeliveryMode) -> int:
    """The publisher's QoS (JMS_GW_MQTT_QOS) when it is 0-2, else the delivery mode's."""
    qos = None if qos_property is None else _QOS_VALUES.get(qos_property)
    return _QOS_BY_MODE.get(mode, 0) if qos is None else qos


def expiry_out(expires: int, now_ms: int) -> int:
    """The Message Expiry Interval: seconds left, rounded up, 1 when already expired, at most
    a Four Byte Integer [MQTT-3.3.2-6]."""
    left = expires - now_ms
    if left <= 0:
        return 1
    seconds = -(-left // 1000)
    return seconds if seconds < MAX_EXPIRY_INTERVAL else MAX_EXPIRY_INTERVAL


def header_text_out(name: str, value: str, types: list[str]) -> str:
    """A JMS header field as a user property's text (escaped, marked in ``types``, when an
    MQTT string cannot carry it)."""
    pairs: list[tuple[str, str]] = []
    _header_pair(pairs, types, name, value)
    return pairs[0][1]


def _user_properties(msg: Message, props: dict[str, Any]) -> list[tuple[str, str]]:
    """JMS properties, then JMSType / JMSPriority / JMSMessageID and gw-types.

    ``JMSMessageID`` is left out for a message an MQTT publisher sent (it has
    ``JMS_GW_MQTT_QOS``): the id is the gateway's, not the publisher's, and nothing may be
    added to the user properties an MQTT subscriber gets [MQTT-3.3.2-17]. The trace id is
    never added here (see the module docstring)."""
    pairs: list[tuple[str, str]] = []
    types = render_properties(pairs, None, props, _SKIP_OUT)
    if types is None and props and USER_RECORD_PROPERTY in props:
        # The publisher's user properties, repeated names and all [MQTT-3.3.2-17].
        recorded = user_record_out(props[USER_RECORD_PROPERTY], pairs)
        if recorded is not None:
            pairs = recorded
    append = pairs.append
    # JMS header fields with no MQTT slot, so nothing of a JMS message is lost.
    header = msg.type
    if header is not None:
        if header.isascii() and "\x00" not in header:
            append((JMS_TYPE, header))
        else:
            types = _header_pair(pairs, types, JMS_TYPE, header)
    if msg.priority != DEFAULT_PRIORITY:
        append((JMS_PRIORITY, str(msg.priority)))
    header = msg.message_id
    if header is not None and QOS_PROPERTY not in props:
        if header.isascii() and "\x00" not in header:
            append((JMS_MESSAGE_ID, header))
        else:
            types = _header_pair(pairs, types, JMS_MESSAGE_ID, header)
    if types is not None:
        append((TYPES_USER_PROPERTY, ",".join(types)))
    return pairs


def message_id_out(message_id: str | None, qos_property: Any, types: list[str]) -> str | None:
    """``JMSMessageID`` as a user property's text, for a message that did not come from an
    MQTT publisher (no ``JMS_GW_MQTT_QOS``); ``None`` for one that did."""
    if message_id is None or qos_property is not None:
        return None
    return header_text_out(JMS_MESSAGE_ID, message_id, types)


def trace_user_property(pairs: list[tuple[str, str]] | None,
                        trace_id: str | None) -> list[tuple[str, str]]:
    """``pairs`` (a PUBLISH's user properties, not changed) with the trace id added last as
    ``gw-trace-id``, for a hop between gateways: escaped, with its ``gw-types`` entry, when an
    MQTT string cannot carry it (README "Escaping what MQTT cannot carry"). A ``gw-trace-id``
    already there (a mapping rule's) is kept and nothing is added."""
    out = list(pairs) if pairs else []
    if trace_id is None:
        return out
    for name, _ in out:
        if name == TRACE_USER_PROPERTY:
            return out
    if trace_id.isascii() and "\x00" not in trace_id or wire_safe(trace_id):
        out.append((TRACE_USER_PROPERTY, trace_id))
        return out
    entry = TRACE_USER_PROPERTY + ":string:esc"
    for i, (name, value) in enumerate(out):
        if name == TYPES_USER_PROPERTY:
            out[i] = (name, value + "," + entry)
            break
    else:
        out.append((TYPES_USER_PROPERTY, entry))
    out.append((TRACE_USER_PROPERTY, wire_escape(trace_id)))
    return out


def _header_pair(
    pairs: list[tuple[str, str]], types: list[str] | None, name: str, value: str
) -> list[str] | None:
    if value.isascii() and "\x00" not in value or wire_safe(value):
        pairs.append((name, value))
        return types
    pairs.append((name, wire_escape(value)))
    if types is None:
        return [name + ":string:esc"]
    types.append(name + ":string:esc")
    return types

