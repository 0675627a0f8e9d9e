"""The core message: JMS headers, typed properties and a body, plus the gateway's own tags.

How this works. A :class:`Message` is created once when it enters the gateway (from a
producer, an adapter or a transport) and is then shared, unchanged, by every queue and
subscription it is delivered to; what differs per delivery (redelivered flag, delivery count)
lives on the :class:`~gateway.consumer.Delivery`, never on the message. Nested map and stream
bodies are plain ``dict`` and ``list`` values holding typed values from :mod:`gateway.types`.

The 11 JMS header fields (TIBCO EMS User's Guide, "JMS Message Header Fields") are attributes:
``destination``, ``delivery_mode``, ``expiration`` (absolute epoch ms; 0 = never),
``delivery_time`` (absolute epoch ms), ``priority``, ``message_id``, ``timestamp``,
``correlation_id``, ``reply_to``, ``type`` and ``redelivered``. Properties are a ``dict`` of
name to typed value.

The gateway's equivalents of the EMS vendor properties (EMS User's Guide,
"EMS Message Properties") use the JMS vendor prefix ``JMS_GW_`` (the mapping is in
``gateway/README.md``):

=====================================  ===================================
EMS                                    gateway
=====================================  ===================================
``JMS_TIBCO_IMPORTED``                 ``JMS_GW_IMPORTED``
``JMS_TIBCO_MSG_EXT``                  ``JMS_GW_MSG_EXT``
``JMS_TIBCO_PRESERVE_UNDELIVERED``     ``JMS_GW_PRESERVE_UNDELIVERED``
``JMS_TIBCO_SENDER``                   ``JMS_GW_SENDER``
``JMS_TIBCO_DISABLE_SENDER``           ``JMS_GW_DISABLE_SENDER``
``JMS_TIBCO_MSG_TRACE``                ``JMS_GW_MSG_TRACE``
=====================================  ===================================

Every message gets a gateway-wide trace id on entry (``trace_id``); later hops carry it in
their own protocol's place so the delivery logs of every system can be joined.
"""

from __future__ import annotations

import enum
from typing import Any

from mypy_extensions import mypyc_attr

from gateway.errors import MessageFormatError
from gateway.types import check_value

# Vendor property names (EMS equivalents in the module docstring).
PROP_IMPORTED = "JMS_GW_IMPORTED"
PROP_MSG_EXT = "JMS_GW_MSG_EXT"
PROP_PRESERVE_UNDELIVERED = "JMS_GW_PRESERVE_UNDELIVERED"
PROP_SENDER = "JMS_GW_SENDER"
PROP_DISABLE_SENDER = "JMS_GW_DISABLE_SENDER"
PROP_MSG_TRACE = "JMS_GW_MSG_TRACE"
PROP_TRACE_ID = "JMS_GW_TRACE_ID"
PROP_DELIVERY_COUNT = "JMSXDeliveryCount"

# JMS default; EMS User's Guide, "Publish and Subscribe Messaging Example" shows JMSPriority={4}
DEFAULT_PRIORITY = 4
PRIORITIES = 10  # JMS priorities 0..9 (EMS User's Guide, "JMS Message Header Fields", JMSPriority)


class DeliveryMode(enum.IntEnum):
    """JMS delivery modes with EMS's RELIABLE extension; values are EMS's (EMS User's Guide,
    "Message Delivery Modes")."""

    NON_PERSISTENT = 1
    PERSISTENT = 2
    RELIABLE = 22


class BodyKind(enum.IntEnum):
    """The JMS body types (EMS User's Guide, "JMS Message Bodies", Table 6 "JMS Message Types")."""

    NONE = 0
    TEXT = 1
    BYTES = 2
    MAP = 3
    STREAM = 4
    OBJECT = 5


class DestKind(enum.IntEnum):
    TOPIC = 1
    QUEUE = 2


TOPIC = DestKind.TOPIC
QUEUE = DestKind.QUEUE

TEMP_PREFIX = "$TMP$."


class Destination:
    """A topic or queue name; equal and hashable by (kind, name)."""

    __slots__ = ("kind", "name", "_hash", "_text")

    def __init__(self, kind: DestKind, name: str) -> None:
        self.kind = kind
        self.name = name
        self._hash = hash((kind, name))
        self._text: str | None = None

    @classmethod
    def topic(cls, name: str) -> Destination:
        return cls(TOPIC, name)

    @classmethod
    def queue(cls, name: str) -> Destination:
        return cls(QUEUE, name)

    @property
    def is_topic(self) -> bool:
        return self.kind is TOPIC

    @property
    def is_temporary(self) -> bool:
        return self.name.startswith(TEMP_PREFIX)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Destination) and self.kind == other.kind and self.name == other.name
        )

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"{'Topic' if self.kind is TOPIC else 'Queue'}[{self.name}]"

    def __str__(self) -> str:
        t = self._text
        if t is None:
            t = self._text = f"{'topic' if self.kind is TOPIC else 'queue'}:{self.name}"
        return t

    @classmethod
    def parse(cls, text: str) -> Destination:
        """Parse ``topic:name`` or ``queue:name`` (the form ``str()`` writes)."""
        kind, sep, name = text.partition(":")
        if not sep or kind not in ("topic", "queue"):
            raise ValueError(f"not a destination: {text!r}")
        return cls(TOPIC if kind == "topic" else QUEUE, name)


# The slots of Message, by name (its copy() and the tests walk them; mypyc, which can
# compile this module, cannot read ``Message.__slots__`` from inside it).
MESSAGE_SLOTS = (
    "destination",
    "delivery_mode",
    "expiration",
    "delivery_time",
    "priority",
    "message_id",
    "timestamp",
    "correlation_id",
    "reply_to",
    "type",
    "redelivered",
    "properties",
    "body_kind",
    "body",
    "trace_id",
    "origin",
    "hops",
    "producer_conn",
    "expires_at",
    "wire",
    "size",
    "store_id",
    "refs",
    "log_head",
)


@mypyc_attr(allow_interpreted_subclasses=True)  # mappings.wire.Work adds the wire form
class Message:
    """A JMS-style message. Attributes are the JMS headers plus the gateway's own tags.

    ``body`` by ``body_kind``: NONE → ``None``; TEXT → ``str``; BYTES and OBJECT → ``bytes``;
    MAP → ``dict[str, value]``; STREAM → ``list[value]``.

    Gateway tags (not JMS headers): ``trace_id``; ``origin`` (gateway id that first accepted
    it) and ``hops`` (bridges crossed) for loop prevention; ``producer_conn`` (the connection
    id that sent it, for no-local); ``expires_at`` (the effective expiry after the destination
    override; ``expiration`` is what consumers see); ``wire`` (original encodings by protocol
    variant, so a same-protocol hop never re-encodes); ``size`` (an estimate in bytes used
    for ``maxbytes`` and memory limits); ``log_head`` (what every delivery-log record of the
    message repeats -- see :meth:`gateway.dlog.DeliveryLog.record`).
    """

    __slots__ = MESSAGE_SLOTS

    def __init__(
        self,
        body: Any = None,
        *,
        body_kind: BodyKind | None = None,
        properties: dict[str, Any] | None = None,
        destination: Destination | None = None,
        delivery_mode: DeliveryMode = DeliveryMode.PERSISTENT,
        priority: int = DEFAULT_PRIORITY,
        correlation_id: str | bytes | None = None,
        reply_to: Destination | None = None,
        type: str | None = None,
        expiration: int = 0,
        delivery_time: int = 0,
        timestamp: int = 0,
        message_id: str | None = None,
    ) -> None:
        if body_kind is None:
            body_kind = infer_body_kind(body)
        self.destination = destination
        self.delivery_mode = delivery_mode
        self.expiration = expiration
        self.delivery_time = delivery_time
        self.priority = priority
        self.message_id = message_id
        self.timestamp = timestamp
        self.correlation_id = correlation_id
        self.reply_to = reply_to
        self.type = type
        self.redelivered = False
        self.properties = properties if properties is not None else {}
        self.body_kind = body_kind
        self.body = body
        self.trace_id: str | None = None
        self.origin: str | None = None
        self.hops = 0
        self.producer_conn: str | None = None
        self.expires_at = 0
        self.wire: dict[str, bytes] | None = None
        self.size = 0
        self.store_id = 0
        self.refs = 0
        self.log_head: tuple[Any, Any, int, int, Any, Any] | None = None

    # -- construction helpers -------------------------------------------------------------

    @classmethod
    def text(cls, text: str, **kw: Any) -> Message:
        if kw or cls is not Message:
            return cls(text, body_kind=_TEXT, **kw)
        return new_message(text, _TEXT)

    @classmethod
    def binary(cls, data: bytes, **kw: Any) -> Message:
        if kw or cls is not Message:
            return cls(data, body_kind=_BYTES, **kw)
        return new_message(data, _BYTES)

    @classmethod
    def map(cls, data: dict[str, Any], **kw: Any) -> Message:
        if kw or cls is not Message:
            return cls(data, body_kind=_MAP, **kw)
        return new_message(data, _MAP)

    @classmethod
    def stream(cls, data: list[Any], **kw: Any) -> Message:
        if kw or cls is not Message:
            return cls(data, body_kind=_STREAM, **kw)
        return new_message(data, _STREAM)

    def validate(self) -> None:
        """Check body and property values against the model (raises MessageFormatError)."""
        for name, value in self.properties.items():
            if not isinstance(name, str) or not name:
                raise MessageFormatError(f"property name {name!r} is not a non-empty string")
            check_value(value, nested=False)
        kind, body = self.body_kind, self.body
        if not isinstance(self.priority, int) or not 0 <= self.priority <= 9:
            raise MessageFormatError(f"priority {self.priority!r} is not in 0..9")
        if kind is _BYTES or kind is _OBJECT:
            ok = isinstance(body, bytes)
        elif kind is _TEXT:
            ok = isinstance(body, str)
        elif kind is _NONE:
            ok = body is None
        elif kind is _MAP:
            ok = isinstance(body, dict)
        else:
            ok = isinstance(body, list)
        if not ok:
            raise MessageFormatError(
                f"a {kind.name} body cannot be {builtin_type(body).__name__}"
            )
        if kind is _MAP or kind is _STREAM:
            check_value(body)

    def copy(self) -> Message:
        """A shallow copy with its own property dict (body values are shared, not copied)."""
        m = Message.__new__(Message)
        for slot in MESSAGE_SLOTS:
            setattr(m, slot, getattr(self, slot))
        m.properties = dict(self.properties)
        m.refs = 0
        m.store_id = 0
        m.log_head = None
        return m

    def header(self, name: str) -> Any:
        """Value of a JMS header or property by its JMS name, or ``None`` if absent.

        This is what selectors read: ``JMSDeliveryMode`` reads as ``'PERSISTENT'`` or
        ``'NON_PERSISTENT'`` (JMS 1.1 §3.8.1.1); other header identifiers as their values.
        """
        getter = HEADER_GETTERS.get(name)
        if getter is not None:
            return getter(self)
        return self.properties.get(name)

    def __repr__(self) -> str:
        return (
            f"<Message {self.message_id} {self.destination!r} {self.body_kind.name} "
            f"props={self.properties!r} body={self.body!r}>"
        )

    def __eq__(self, other: object) -> bool:
        """Messages compare equal when every JMS-visible field is equal (for tests)."""
        if not isinstance(other, Message):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in _COMPARED)

    def __hash__(self) -> int:
        """By identity, as without ``__eq__``: messages are keys of per-endpoint dicts."""
        return id(self)


_COMPARED = (
    "destination", "delivery_mode", "expiration", "delivery_time", "priority", "message_id",
    "timestamp", "correlation_id", "reply_to", "type", "properties", "body_kind", "body",
    "trace_id",
)  # fmt: skip

builtin_type = type


# Enum members read from the class cost a descriptor call each (Python 3.11); the hot paths
# use these module constants instead.
_NONE = BodyKind.NONE
_TEXT = BodyKind.TEXT
_BYTES = BodyKind.BYTES
_MAP = BodyKind.MAP
_STREAM = BodyKind.STREAM
_OBJECT = BodyKind.OBJECT
_PERSISTENT = DeliveryMode.PERSISTENT


def new_message(body: Any, body_kind: BodyKind) -> Message:
    """``Message(body, body_kind=body_kind)``, made without calling the class.

    Calling a class with ``__init__`` costs a keyword dict and a second frame; this costs
    under half, and setting the other headers afterwards costs less than passing them as
    keywords (9.3k instructions for ``Message(...)`` with eleven keywords, 4k this way). A
    new message per publish is on every producer's and every inbound mapping's hot path.
    Every slot is set as ``__init__`` sets it (a unit test compares the two)."""
    m: Message = Message.__new__(Message)
    m.destination = None
    m.delivery_mode = _PERSISTENT
    m.expiration = m.delivery_time = m.timestamp = m.hops = m.expires_at = 0
    m.size = m.store_id = m.refs = 0
    m.priority = DEFAULT_PRIORITY
    m.message_id = m.correlation_id = m.reply_to = m.type = None
    m.trace_id = m.origin = m.producer_conn = m.wire = m.log_head = None
    m.redelivered = False
    m.properties = {}
    m.body_kind = body_kind
    m.body = body
    return m


def infer_body_kind(body: Any) -> BodyKind:
    if body is None:
        return _NONE
    if isinstance(body, str):
        return _TEXT
    if isinstance(body, (bytes, bytearray)):
        return _BYTES
    if isinstance(body, dict):
        return _MAP
    if isinstance(body, list):
        return _STREAM
    raise MessageFormatError(f"cannot infer a body kind for {builtin_type(body).__name__}")


def _mode_name(m: Message) -> str:
    return "PERSISTENT" if m.delivery_mode == DeliveryMode.PERSISTENT else "NON_PERSISTENT"


def _dest_name(d: Destination | None) -> str | None:
    return None if d is None else d.name


HEADER_GETTERS: dict[str, Any] = {
    "JMSDestination": lambda m: _dest_name(m.destination),
    "JMSDeliveryMode": _mode_name,
    "JMSExpiration": lambda m: m.expiration,
    "JMSDeliveryTime": lambda m: m.delivery_time,
    "JMSPriority": lambda m: m.priority,
    "JMSMessageID": lambda m: m.message_id,
    "JMSTimestamp": lambda m: m.timestamp,
    "JMSCorrelationID": lambda m: (
        m.correlation_id.decode("utf-8", "replace")
        if isinstance(m.correlation_id, bytes)
        else m.correlation_id
    ),
    "JMSReplyTo": lambda m: _dest_name(m.reply_to),
    "JMSType": lambda m: m.type,
    "JMSRedelivered": lambda m: m.redelivered,
}


def estimate_size(m: Message) -> int:
    """A cheap size estimate in bytes, used for ``maxbytes`` and memory limits."""
    body = m.body
    if body is None:
        n = 0
    elif isinstance(body, (str, bytes)):
        n = len(body)
    else:
        n = _nested_size(body)
    for k, v in m.properties.items():
        n += len(k) + (len(v) if isinstance(v, (str, bytes)) else 8)
    return n + 64


def body_size(body: Any) -> int:
    """The part of :func:`estimate_size` that is the body's (what swapping a body frees)."""
    if body is None:
        return 0
    if isinstance(body, (str, bytes)):
        return len(body)
    return _nested_size(body)


def _nested_size(v: Any) -> int:
    if isinstance(v, dict):
        return sum(len(k) + _nested_size(x) for k, x in v.items()) + 8
    if isinstance(v, (list, tuple)):
        return sum(_nested_size(x) for x in v) + 8
    if isinstance(v, (str, bytes)):
        return len(v)
    return 8


def preserved(msg: Message) -> bool:
    """``JMS_GW_PRESERVE_UNDELIVERED`` read as a JMS boolean: ``true``, or the string "true" in
    any case (a protocol without typed properties sends a string); anything else is false."""
    value = msg.properties.get(PROP_PRESERVE_UNDELIVERED)
    if value is True:
        return True
    return type(value) is str and value.lower() == "true"
