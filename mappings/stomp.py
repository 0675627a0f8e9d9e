"""The default mapping between STOMP frames (SEND, MESSAGE) and core messages.

How this works. The STOMP adapter parses a SEND frame, resolves its ``destination`` and
``reply-to`` headers (they depend on the connection: ``/temp-queue/x`` names a temporary
queue of that connection) and calls :func:`stomp_to_message` with the headers and body; it
gets back a core :class:`~gateway.message.Message`. For every delivery it calls
:func:`message_to_stomp` with the rendered destination and reply-to, and gets the MESSAGE
headers and body; the adapter adds ``subscription``, ``message-id``, ``ack`` and
``redelivered``, which depend on the delivery, not the message.

The rules are the rows of the tables in ``adapters/stomp/README.md`` (SEND → core,
core → MESSAGE), in the same order. The same rows are the default mapping rules
``mappings/defaults/stomp.yaml`` (listed in ``mappings/README.md``), which the engine runs
when a user rule overrides one of them; these two functions are their fast path, and
``tests/unit/test_mapping_stomp_defaults.py`` proves the two agree. The rows that are more
than a rename are functions here (``body_in``, ``apply_header_types``, ``body_out``, …) that
the rules call as converters (:mod:`mappings.converters`). Every header and property name
and the except lists come from the rows (``SHAPE_IN`` / ``SHAPE_OUT`` below, checked when this
module is imported; :mod:`mappings.rows`).

STOMP headers are text, so JMS properties travel as
text with the MQTT mapping's text forms and its ``gw-types`` header (one definition of those
forms, imported from :mod:`mappings.mqtt`, described in ``mappings/README.md``): a typed
property sent by MQTT 5, AMQP or an in-process JMS client comes back from a STOMP hop with
its type and width.

Bodies: a frame is text or bytes by ``content-type`` and, when there is none, by whether it
has a ``content-length`` (ActiveMQ's rule: with one it is a BytesMessage, without one a
TextMessage). Map and stream bodies travel as the documented JSON of ``mappings/README.md``,
marked with the ``transformation`` header as ActiveMQ does (``jms-map-json``; the gateway
adds ``jms-stream-json`` for streams, which ActiveMQ has no JSON form for). A SEND in
ActiveMQ's own XML or JSON form (``jms-map-xml``, ``jms-map-json`` as XStream writes it) is
read by :mod:`mappings.xstream`, and :func:`transformed_body` writes that form for a
subscription that asked for it.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from gateway.errors import MessageFormatError
from gateway.message import (
    DEFAULT_PRIORITY,
    BodyKind,
    DeliveryMode,
    Destination,
    Message,
    new_message,
)
from gateway.types import Int64, UInt64
from mappings import xstream
from mappings.rows import check_shape, except_names
from mappings.rows import name as row_name
from mappings.typedtext import (
    apply_types,
    is_text_content_type,
    json_payload,
    render_properties,
    types_escape,
    wire_escape,
    wire_safe,
)

__all__ = [
    "IN_HEADERS",
    "OUT_HEADERS",
    "TEXT_CONTENT_TYPE",
    "TRACE_HEADER",
    "TYPES_HEADER",
    "message_to_stomp",
    "stomp_to_message",
]

# -- the rows this fast path is written for (mappings/defaults/stomp.yaml) ----------------------
# Each pair is a rule and its step as the rows say it (mappings.rows.check_shape, checked on
# import); a field "section.{}" is a name taken from that row below, so a header or property
# name changed in the rows changes both the engine and these functions. When the rows are
# not these, these functions are not the default mapping (mappings.engine.default_wire).
SHAPE_IN = (
    ("stomp.in.body", "convert stomp-body-in: wire.body, wire.header.{}, wire.header.{}, "
                      "wire.has_length -> body"),
    ("stomp.in.properties", "copy_all: wire.header -> property"),
    ("stomp.in.correlation-id", "copy: wire.header.{} -> header.JMSCorrelationID"),
    ("stomp.in.type", "copy: wire.header.{} -> header.JMSType"),
    ("stomp.in.trace-id", "copy: wire.header.{} -> trace_id"),
    ("stomp.in.gw-types", "convert stomp-gw-types-in: wire.header.{}, property.*, "
                          "header.JMSCorrelationID, header.JMSType, trace_id -> property.*, "
                          "header.JMSCorrelationID, header.JMSType, trace_id"),
    ("stomp.in.content-type", "convert stomp-content-type-in: wire.header.{}, body_kind -> "
                              "property.{}"),
    ("stomp.in.persistent", "convert stomp-persistent-in: wire.header.{} -> "
                            "header.JMSDeliveryMode"),
    ("stomp.in.priority", "convert stomp-priority-in: wire.header.{} -> header.JMSPriority"),
    ("stomp.in.expires", "convert stomp-expires-in: wire.header.{} -> header.JMSExpiration"),
    ("stomp.in.delay", "convert stomp-delay-in: wire.header.{}, wire.now -> "
                       "header.JMSDeliveryTime"),
    ("stomp.in.timestamp", "copy: wire.now -> header.JMSTimestamp"),
)
SHAPE_OUT = (
    ("stomp.out.destination", "copy: wire.destination -> wire.header.{}"),
    ("stomp.out.body", "convert stomp-body-out: body_kind, body, property.{} -> wire.body, "
                       "wire.header.{}, wire.header.{}"),
    ("stomp.out.persistent", "convert stomp-persistent-out: header.JMSDeliveryMode -> "
                             "wire.header.{}"),
    ("stomp.out.priority", "copy: header.JMSPriority -> wire.header.{} as string"),
    ("stomp.out.timestamp", "convert ms-text: header.JMSTimestamp -> wire.header.{}"),
    ("stomp.out.expires", "convert ms-text: expiry -> wire.header.{}"),
    ("stomp.out.correlation-id", "convert stomp-correlation-out: header.JMSCorrelationID -> "
                                 "wire.header.{}"),
    ("stomp.out.reply-to", "copy: wire.reply_to -> wire.header.{}"),
    ("stomp.out.type", "convert stomp-text-out: header.JMSType -> wire.header.{}"),
    ("stomp.out.properties", "copy_all typed-text: property -> wire.header"),
    ("stomp.out.gw-types", "convert gw-types-out: wire.types -> wire.header.{}"),
    ("stomp.out.trace-id", "convert stomp-text-out: trace_id -> wire.header.{}"),
)
check_shape("stomp", "in", SHAPE_IN)
check_shape("stomp", "out", SHAPE_OUT)

_H = "wire.header"
TYPES_HEADER = row_name(_H, "stomp.in.gw-types from[0]", "stomp.out.gw-types to[0]")
TRACE_HEADER = row_name(_H, "stomp.in.trace-id from[0]", "stomp.out.trace-id to[0]")
CONTENT_TYPE = row_name(_H, "stomp.in.body from[2]", "stomp.in.content-type from[0]",
                        "stomp.out.body to[1]")
TRANSFORMATION = row_name(_H, "stomp.in.body from[1]", "stomp.out.body to[2]")
CORRELATION_ID = row_name(_H, "stomp.in.correlation-id from[0]",
                          "stomp.out.correlation-id to[0]")
TYPE = row_name(_H, "stomp.in.type from[0]", "stomp.out.type to[0]")
PERSISTENT = row_name(_H, "stomp.in.persistent from[0]", "stomp.out.persistent to[0]")
PRIORITY = row_name(_H, "stomp.in.priority from[0]", "stomp.out.priority to[0]")
EXPIRES = row_name(_H, "stomp.in.expires from[0]", "stomp.out.expires to[0]")
SCHEDULED_DELAY = row_name(_H, "stomp.in.delay from[0]")  # ActiveMQ's delivery delay (ms)
DESTINATION = row_name(_H, "stomp.out.destination to[0]")
TIMESTAMP = row_name(_H, "stomp.out.timestamp to[0]")
REPLY_TO = row_name(_H, "stomp.out.reply-to to[0]")
CONTENT_TYPE_PROPERTY = row_name("property", "stomp.in.content-type to[0]",
                                 "stomp.out.body from[2]")

TEXT_CONTENT_TYPE = "text/plain;charset=utf-8"  # a TEXT body with no content type of its own
JSON_CONTENT_TYPE = "application/json"
OBJECT_CONTENT_TYPE = "application/x-java-serialized-object"  # AMQP JMS mapping §3.2.4.3

MAP_JSON = "jms-map-json"
STREAM_JSON = "jms-stream-json"
ANY_JSON = "jms-json"  # ActiveMQ: an object is a map (an array, here, is a stream)
BYTES_TRANSFORMATION = "jms-byte"  # ActiveMQ: the body is bytes whatever its content type
MAP_XML = "jms-map-xml"  # ActiveMQ: XStream's XML of the map (mappings/xstream.py)
ANY_XML = "jms-xml"
OBJECT_JSON = "jms-object-json"
OBJECT_XML = "jms-object-xml"
# The transformations a SEND may name, and those a SUBSCRIBE may ask for (ActiveMQ's STOMP
# page, "Message transformation"; jms-stream-json is the gateway's own). A SEND with
# jms-object-json / jms-object-xml would need a Java object made from XStream's text: refused.
SEND_TRANSFORMATIONS = frozenset((MAP_JSON, STREAM_JSON, ANY_JSON, BYTES_TRANSFORMATION,
                                  MAP_XML))
SUBSCRIBE_TRANSFORMATIONS = frozenset((MAP_JSON, STREAM_JSON, ANY_JSON, BYTES_TRANSFORMATION,
                                       MAP_XML, ANY_XML, OBJECT_JSON, OBJECT_XML))
# What a MESSAGE of a map or stream body says it is, per subscription transformation (ActiveMQ
# names the generic jms-json / jms-xml after the body: jms-map-json / jms-map-xml).
_XSTREAM_OUT = {MAP_JSON: MAP_JSON, ANY_JSON: MAP_JSON, OBJECT_JSON: OBJECT_JSON,
                MAP_XML: MAP_XML, ANY_XML: MAP_XML, OBJECT_XML: OBJECT_XML}

# Headers of a SEND frame that are not copied into JMS properties: STOMP's own, the JMS
# header fields STOMP names, and those a forwarded MESSAGE carries (a client that forwards a
# message it received should not turn its old message id into a property): the except list
# of stomp.in.properties.
IN_HEADERS = frozenset(except_names("stomp.in.properties"))

# Headers a MESSAGE frame gets from the message or the delivery. A JMS property of one of
# these names cannot travel over STOMP (it would be read as the header): it is not sent (the
# except list of stomp.out.properties).
OUT_HEADERS = frozenset(except_names("stomp.out.properties"))

_TEXT = BodyKind.TEXT
_BYTES = BodyKind.BYTES
_MAP = BodyKind.MAP
_STREAM = BodyKind.STREAM
_OBJECT = BodyKind.OBJECT
_NONE = BodyKind.NONE
_PERSISTENT = DeliveryMode.PERSISTENT
_NON_PERSISTENT = DeliveryMode.NON_PERSISTENT

# gw-types names for the correlation-id header: its bytes as UTF-8 text, or as base64.
CORRELATION_UTF8 = "utf8bytes"
CORRELATION_BASE64 = "bytes"
_CORRELATION_ENTRY = CORRELATION_ID + ":"


# -- SEND → core -------------------------------------------------------------------------------


def stomp_to_message(
    headers: dict[str, str],
    body: bytes,
    *,
    has_length: bool,
    destination: Destination,
    reply_to: Destination | None,
    now_ms: int,
) -> Message:
    """Build the core message for one SEND frame (table "SEND → core" in the README).

    ``headers`` holds the first value of each header name, in frame order; ``has_length``
    says whether the frame had a ``content-length``. ``destination`` and ``reply_to`` are
    the adapter's reading of the ``destination`` and ``reply-to`` headers.

    Raises:
        MessageFormatError: a header STOMP defines has a value that does not parse, or the
        body does not fit its ``transformation``.
    """
    get = headers.get
    # Body kind: transformation first, then content-type, then content-length.
    content_type = get(CONTENT_TYPE)
    transformation = get(TRANSFORMATION)
    kind: BodyKind
    value: Any
    if transformation is not None and transformation != BYTES_TRANSFORMATION:
        kind, value = _json_body(transformation, body)
    elif content_type is not None:
        if content_type == OBJECT_CONTENT_TYPE:
            kind, value = _OBJECT, body
        elif transformation is None and is_text_content_type(content_type):
            try:
                kind, value = _TEXT, body.decode()
            except UnicodeDecodeError:
                kind, value = _BYTES, body
        else:
            kind, value = _BYTES, body
    elif has_length or transformation is not None:
        kind, value = _BYTES, body
    else:
        try:
            kind, value = _TEXT, body.decode()
        except UnicodeDecodeError:
            kind, value = _BYTES, body
    # Properties: every other header, as text, then the types of gw-types.
    props: dict[str, Any] = {}
    text: str | None
    for name, text in headers.items():
        if name not in IN_HEADERS and name:
            props[name] = text
    correlation: str | bytes | None = get(CORRELATION_ID)
    msg_type = get(TYPE)
    trace = get(TRACE_HEADER)
    types = get(TYPES_HEADER)
    if types:
        props, correlation, msg_type, trace = apply_header_types(
            types, props, correlation, msg_type, trace)
    if content_type is not None and kind is not _OBJECT and not (
        kind is _TEXT and content_type == TEXT_CONTENT_TYPE
    ) and not (  # the type message_to_stomp gives every JSON body: implied, not kept
        content_type == JSON_CONTENT_TYPE and (kind is _MAP or kind is _STREAM)
    ):
        props[CONTENT_TYPE_PROPERTY] = content_type
    # JMS header fields.
    text = get(PERSISTENT)
    mode = _PERSISTENT if text is not None and text.lower() == "true" else _NON_PERSISTENT
    text = get(PRIORITY)
    priority = DEFAULT_PRIORITY if text is None else _priority(text)
    text = get(EXPIRES)
    expiration = 0 if text is None else _millis(EXPIRES, text)
    text = get(SCHEDULED_DELAY)
    delivery_time = 0 if text is None else delivery_time_in(text, now_ms)
    msg = new_message(value, kind)
    msg.properties = props
    msg.destination = destination
    msg.delivery_mode = mode
    msg.priority = priority
    msg.correlation_id = correlation
    msg.reply_to = reply_to
    msg.type = msg_type
    msg.expiration = expiration
    msg.delivery_time = delivery_time
    msg.timestamp = now_ms
    msg.size = len(body) + 64 + 48 * len(props)
    if trace is not None:
        msg.trace_id = trace
    return msg


# -- the rules of stomp_to_message that are more than one line, for the default mapping rules
# (mappings/defaults/stomp.yaml); tests/unit/test_mapping_stomp_defaults.py proves that the
# rules and stomp_to_message agree.


def body_in(body: bytes, transformation: str | None, content_type: str | None,
            has_length: bool) -> tuple[BodyKind, Any]:
    """The body kind and value of a frame: transformation, then content-type, then
    content-length (table "SEND → core"). Raises MessageFormatError as stomp_to_message."""
    if transformation is not None and transformation != BYTES_TRANSFORMATION:
        return _json_body(transformation, body)
    if content_type is not None:
        if content_type == OBJECT_CONTENT_TYPE:
            return _OBJECT, body
        if transformation is None and is_text_content_type(content_type):
            try:
                return _TEXT, body.decode()
            except UnicodeDecodeError:
                return _BYTES, body
        return _BYTES, body
    if has_length or transformation is not None:
        return _BYTES, body
    try:
        return _TEXT, body.decode()
    except UnicodeDecodeError:
        return _BYTES, body


def content_type_kept(content_type: str, kind: BodyKind) -> bool:
    """Whether ``content-type`` becomes JMS_GW_CONTENT_TYPE: not for an OBJECT body (implied),
    the gateway's default text type on a text body, nor JSON on a map or stream body."""
    return kind is not _OBJECT and not (
        kind is _TEXT and content_type == TEXT_CONTENT_TYPE
    ) and not (content_type == JSON_CONTENT_TYPE and (kind is _MAP or kind is _STREAM))


def apply_header_types(types: str, props: dict[str, Any], correlation: str | bytes | None,
                       msg_type: str | None, trace: str | None
                       ) -> tuple[dict[str, Any], str | bytes | None, str | None, str | None]:
    """gw-types applied to the properties and to the header fields that may be escaped or
    typed (correlation-id, type, gw-trace-id), which join the properties meanwhile."""
    for header, field in ((CORRELATION_ID, correlation), (TYPE, msg_type),
                          (TRACE_HEADER, trace)):
        if field is not None:
            props[header] = field
    props = apply_types(props, types)
    if correlation is not None:
        correlation = _correlation_in(props.pop(CORRELATION_ID), types)
    if msg_type is not None:
        msg_type = str(props.pop(TYPE))
    if trace is not None:
        trace = str(props.pop(TRACE_HEADER))
    return props, correlation, msg_type, trace


def priority_in(text: str) -> int:
    """``priority``: one digit 0-9 (anything else is an error)."""
    return _priority(text)


def expires_in(text: str) -> int:
    """``expires``: absolute epoch ms."""
    return _millis(EXPIRES, text)


def delivery_time_in(text: str, now_ms: int) -> int:
    """``AMQ_SCHEDULED_DELAY`` (ms) → JMSDeliveryTime: ``now + delay``; 0 (none) for 0."""
    delay = _millis(SCHEDULED_DELAY, text)
    if not delay:
        return 0
    if now_ms + delay > Int64.MAX:
        raise MessageFormatError(f"{SCHEDULED_DELAY} {text} reaches beyond the year 292 million")
    return now_ms + delay


def _json_body(transformation: str, body: bytes) -> tuple[BodyKind, Any]:
    if transformation not in SEND_TRANSFORMATIONS:
        raise MessageFormatError(
            f"unsupported transformation {transformation!r} (the gateway reads "
            f"{MAP_JSON}, {MAP_XML}, {STREAM_JSON}, {ANY_JSON} and {BYTES_TRANSFORMATION})"
        )
    if transformation == MAP_XML:  # ActiveMQ's XStream XML: <map> or (the gateway's) <list>
        value = xstream.from_xml(body)
        return (_MAP if type(value) is dict else _STREAM), value
    try:
        value = json.loads(body, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MessageFormatError(f"{transformation} body is not JSON: {exc}") from None
    if transformation == MAP_JSON and xstream.is_xstream_json(value):
        # ActiveMQ's form, {"map":{"entry":[...]}}: read again keeping each number's text.
        return _MAP, xstream.from_json(xstream.parse_json(body))
    if type(value) is dict and transformation != STREAM_JSON:
        _check_json(value)
        return _MAP, value
    if type(value) is list and transformation != MAP_JSON:
        _check_json(value)
        return _STREAM, value
    want = {MAP_JSON: "an object", STREAM_JSON: "an array"}.get(transformation, "an object or array")
    raise MessageFormatError(f"{transformation} body must be {want}")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _check_json(value: Any) -> None:
    """Integers in a JSON body must fit a JMS long, or a uint64 (the EMS extension) above it:
    those become :class:`~gateway.types.UInt64`, so a uint64 written as JSON reads back."""
    stack = [value]
    while stack:
        v = stack.pop()
        if type(v) is dict:
            for k, x in v.items():
                if type(x) is int and not Int64.MIN <= x <= Int64.MAX:
                    v[k] = _wide(x)
                elif type(x) is dict or type(x) is list:
                    stack.append(x)
        elif type(v) is list:
            for i, x in enumerate(v):
                if type(x) is int and not Int64.MIN <= x <= Int64.MAX:
                    v[i] = _wide(x)
                elif type(x) is dict or type(x) is list:
                    stack.append(x)


def _wide(v: int) -> UInt64:
    if 0 <= v <= UInt64.MAX:
        return UInt64(v)
    raise MessageFormatError(f"number {v} in a JSON body fits neither a long nor a uint64")


def _priority(text: str) -> int:
    if len(text) == 1 and "0" <= text <= "9":
        return ord(text) - 48
    raise MessageFormatError(f"priority must be a digit 0-9, not {text!r}")


def _millis(name: str, text: str) -> int:
    if text.isdigit() and text.isascii():
        v = int(text)
        if v <= Int64.MAX:
            return v
    raise MessageFormatError(f"{name} must be a number of milliseconds, not {text!r}")


def _correlation_in(value: Any, types: str) -> str | bytes:
    """The correlation id: text, or bytes when gw-types marks it (MQTT correlation data)."""
    if type(value) is bytes:  # gw-types "bytes": it came as base64
        return value
    text = str(value)
    for entry in types.split(","):
        if entry.startswith(_CORRELATION_ENTRY):
            if entry.split(":")[1] == CORRELATION_UTF8:
                return text.encode("utf-8", "surrogatepass")
            break
    return text


# -- core → MESSAGE ----------------------------------------------------------------------------


def message_to_stomp(
    msg: Message, *, destination: str, reply_to: str | None
) -> tuple[list[tuple[str, str]], bytes]:
    """The MESSAGE headers and body for a core message (table "core → MESSAGE" in the README).

    ``destination`` and ``reply_to`` are the adapter's STOMP names of the message's
    destination and reply-to. Header values are raw text: the codec escapes them.
    """
    kind = msg.body_kind
    body = msg.body
    props = msg.properties
    headers: list[tuple[str, str]] = [(DESTINATION, destination)]
    append = headers.append
    ct = props.get(CONTENT_TYPE_PROPERTY) if props else None
    if type(ct) is not str:
        ct = None
    if kind is _TEXT:
        try:
            payload = body.encode()
        except UnicodeEncodeError:
            payload = body.encode("utf-8", "surrogatepass")
        append((CONTENT_TYPE, ct or TEXT_CONTENT_TYPE))
    elif kind is _BYTES:
        payload = body
        if ct is not None:
            append((CONTENT_TYPE, ct))
    elif kind is _MAP or kind is _STREAM:
        payload = json_payload(body)
        append((CONTENT_TYPE, JSON_CONTENT_TYPE))
        append((TRANSFORMATION, MAP_JSON if kind is _MAP else STREAM_JSON))
    elif kind is _OBJECT:
        payload = body
        append((CONTENT_TYPE, OBJECT_CONTENT_TYPE))
    else:
        payload = b""
        if ct is not None:
            append((CONTENT_TYPE, ct))
    if msg.delivery_mode is _PERSISTENT:
        append((PERSISTENT, "true"))
    append((PRIORITY, str(msg.priority)))
    if msg.timestamp:
        append((TIMESTAMP, str(msg.timestamp)))
    expires = msg.expires_at or msg.expiration
    if expires:
        append((EXPIRES, str(expires)))
    types: list[str] | None = None
    corr = msg.correlation_id
    if corr is not None:
        if isinstance(corr, str):
            types = _text_header(headers, types, CORRELATION_ID, corr, None)
        else:
            try:
                text = corr.decode()
                tname = CORRELATION_UTF8
            except UnicodeDecodeError:
                text = base64.b64encode(corr).decode("ascii")
                tname = CORRELATION_BASE64
            types = _text_header(headers, types, CORRELATION_ID, text, tname)
    if reply_to is not None:
        append((REPLY_TO, reply_to))
    if msg.type is not None:
        types = _text_header(headers, types, TYPE, msg.type, None)
    if props:
        types = render_properties(headers, types, props, OUT_HEADERS)
    held: list[tuple[str, str]] = []  # the trace id goes last, after gw-types
    trace = msg.trace_id
    if trace is not None:
        types = _text_header(held, types, TRACE_HEADER, trace, None)
    if types is not None:
        append((TYPES_HEADER, ",".join(types)))
    if held:
        headers.extend(held)
    return headers, payload


# -- the rules of message_to_stomp that are more than one line, for the default mapping rules


def body_out(kind: BodyKind, body: Any, content_type: str | None
             ) -> tuple[bytes, str | None, str | None]:
    """The payload, ``content-type`` and ``transformation`` of a body (table "core → MESSAGE");
    ``content_type`` is JMS_GW_CONTENT_TYPE when it is a string."""
    if kind is _TEXT:
        try:
            payload = body.encode()
        except UnicodeEncodeError:
            payload = body.encode("utf-8", "surrogatepass")
        return payload, content_type or TEXT_CONTENT_TYPE, None
    if kind is _BYTES:
        return body, content_type, None
    if kind is _MAP or kind is _STREAM:
        return json_payload(body), JSON_CONTENT_TYPE, MAP_JSON if kind is _MAP else STREAM_JSON
    if kind is _OBJECT:
        return body, OBJECT_CONTENT_TYPE, None
    return b"", content_type, None


def transformed_body(kind: BodyKind, body: Any, transformation: str
                     ) -> tuple[bytes, str] | None:
    """The payload and ``transformation`` header of a map or stream body for a subscription
    that asked for ``transformation`` (ActiveMQ's XStream forms, :mod:`mappings.xstream`);
    ``None`` when the subscription's body is the default one (other kinds, jms-byte,
    jms-stream-json)."""
    if kind is not _MAP and kind is not _STREAM:
        return None
    name = _XSTREAM_OUT.get(transformation)
    if name is None:
        return None
    if name == MAP_XML or name == OBJECT_XML:
        return xstream.to_xml(body), name
    return xstream.to_json(body), name


def correlation_out(corr: str | bytes, types: list[str]) -> str:
    """``correlation-id``: a text as is; bytes as UTF-8 text or base64, marked in gw-types
    (``types``, appended to)."""
    pairs: list[tuple[str, str]] = []
    if isinstance(corr, str):
        _text_header(pairs, types, CORRELATION_ID, corr, None)
    else:
        try:
            text, tname = corr.decode(), CORRELATION_UTF8
        except UnicodeDecodeError:
            text, tname = base64.b64encode(corr).decode("ascii"), CORRELATION_BASE64
        _text_header(pairs, types, CORRELATION_ID, text, tname)
    return pairs[0][1]


def text_out(name: str, text: str, types: list[str]) -> str:
    """A text header as STOMP can carry it (escaped and marked in ``types`` if it must be)."""
    pairs: list[tuple[str, str]] = []
    _text_header(pairs, types, name, text, None)
    return pairs[0][1]


def _text_header(headers: list[tuple[str, str]], types: list[str] | None, name: str,
                 text: str, tname: str | None) -> list[str] | None:
    """Append one text header; escape it (and list it in gw-types) if STOMP cannot carry it."""
    if wire_safe(text):
        headers.append((name, text))
        entry = None if tname is None else types_escape(name) + ":" + tname
    else:
        headers.append((name, wire_escape(text)))
        entry = types_escape(name) + ":" + (tname or "string") + ":esc"
    if entry is None:
        return types
    if types is None:
        return [entry]
    types.append(entry)
    return types
