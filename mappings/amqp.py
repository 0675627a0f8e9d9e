"""The default mapping between AMQP 1.0 messages and core messages (OASIS AMQP JMS Mapping).

How this works. The AMQP adapter decodes a transfer into a :class:`proton.Message` and calls
:func:`amqp_to_message` with the destination it resolved (link target or ``to``); for every
delivery to an AMQP receiver it calls :func:`message_to_amqp` and encodes what it gets back.
The rules are the rows of the tables in ``mappings/README.md`` ("AMQP 1.0"), and the code
follows them section by section: application properties, body, properties, annotations,
header. The same rows are the default rules ``defaults/amqp.yaml``, which the engine runs
when a user rule overrides one (:meth:`mappings.engine.MappingSet.wire_for`); each row that is
more than a copy is one helper here (``body_in``, ``annotation_in``, ``id_out``, …), which
both these functions and the rules' converters (:mod:`mappings.converters`) call, in the
rules' order, so that the two give the same answer (tested). The property names and
annotation keys come from the rows (:mod:`mappings.amqp_rows`, which checks on import that the
rows are the ones this module and :mod:`mappings.amqp_fast` are written for).
The ``queue://`` / ``topic://`` address rules and the ``x-opt-jms-dest`` type codes it uses
are :mod:`mappings.amqp_address`'s.

AMQP has types the core lacks (timestamp, uuid, symbol, decimals, described values, arrays
of anything, maps with any keys) and the core makes distinctions AMQP cannot (``Int64``
versus a plain ``int``, strings with lone surrogates). Neither side drops a value: each
converts it to its nearest own value and writes what it was into one compact JSON list, the
property ``JMS_GW_AMQP_TYPES`` (entries ``[where, path..., type]``, README "Types record"),
which the other direction reads to restore the exact value (:mod:`mappings.amqp_values`).

proton's ``Message`` gives the times as float seconds (and truncates when setting them) and
an unset content type as ``symbol('None')``, so those fields are read and written through
``cproton`` on ``pm._msg`` in integer milliseconds. proton's ``Message`` holds one body
section and no footer: several data or sequence sections and footers cannot be seen here.
"""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import cproton
import proton
from proton import symbol, ulong

from gateway import types as gt
from gateway.message import (
    BodyKind,
    DeliveryMode,
    Destination,
    DestKind,
    Message,
    new_message,
)
from mappings import amqp_rows as _rows
from mappings.amqp_address import dest_type_code, format_address, parse_address
from mappings.amqp_rows import (  # the names the default rows give (mappings/amqp_rows.py)
    CONTENT_ENCODING_PROPERTY,
    CONTENT_TYPE_PROPERTY,
    GROUP_ID,
    GROUP_SEQ,
    PRIORITY_PROPERTY,
    REPLY_TO_GROUP_ID_PROPERTY,
    REPLY_TO_PROPERTY,
    SPECIAL_ORDER,
    TYPES_PROPERTY,
    USER_ID,
)
from mappings.amqp_values import (
    _BODY,
    _ESCAPED,
    _FIELD,
    _NO,
    _PLAIN,
    _PLAIN_OUT,
    Marks,
    Node,
    _encodable,
    _escape,
    _field_mark,
    _field_safe,
    _in_restore,
    _in_value,
    _out_value,
    _parse_record,
    _unescape,
)
from mappings.typedtext import is_text_content_type, wire_escape, wire_unescape

__all__ = [
    "CONTENT_ENCODING_PROPERTY", "CONTENT_TYPE_PROPERTY", "DA_PREFIX", "MA_PREFIX",
    "PRIORITY_PROPERTY", "REPLY_TO_GROUP_ID_PROPERTY", "REPLY_TO_PROPERTY", "TYPES_PROPERTY",
    "GROUP_ID", "GROUP_SEQ", "SPECIAL_ORDER", "USER_ID", "amqp_to_message", "message_to_amqp",
]  # fmt: skip

# -- names -------------------------------------------------------------------------------------

MA_PREFIX = "JMS_GW_AMQP_MA_"  # + key: a message annotation the mapping does not consume
DA_PREFIX = "JMS_GW_AMQP_DA_"  # + key: a delivery annotation

MSG_TYPE = symbol(_rows.MSG_TYPE)
JMS_DEST = symbol(_rows.JMS_DEST)
JMS_REPLY_TO = symbol(_rows.JMS_REPLY_TO)
DELIVERY_TIME = symbol(_rows.DELIVERY_TIME)
DELIVERY_DELAY = symbol(_rows.DELIVERY_DELAY)
TRACE_ID = symbol(_rows.TRACE_ID)
GW_DELIVERY_MODE = symbol(_rows.GW_DELIVERY_MODE)
RELIABLE = symbol("RELIABLE")

SERIALIZED_OBJECT = "application/x-java-serialized-object"
UINT_MAX = 0xFFFFFFFF  # header.ttl is a uint of milliseconds

# x-opt-jms-msg-type values (Qpid JMS AmqpMessageSupport), sent as AMQP bytes.
JMS_MESSAGE, JMS_OBJECT, JMS_MAP, JMS_BYTES, JMS_STREAM, JMS_TEXT = 0, 1, 2, 3, 4, 5
_BYTE = tuple(proton.byte(i) for i in range(6))

_NONE, _TEXT, _BYTES = BodyKind.NONE, BodyKind.TEXT, BodyKind.BYTES
_MAP, _STREAM, _OBJECT = BodyKind.MAP, BodyKind.STREAM, BodyKind.OBJECT
_PERSISTENT, _NON_PERSISTENT = DeliveryMode.PERSISTENT, DeliveryMode.NON_PERSISTENT
_RELIABLE = DeliveryMode.RELIABLE
_NO_BODY, _DATA, _VALUE, _SEQUENCE = 0, 1, 2, 3  # body sections, as proton tells them apart

# -- message-id and correlation-id (Qpid JMS AmqpMessageIdHelper encodings) ---------------------

_ID_PREFIX = "ID:AMQP_"


def _id_out(text: str, binary: bool) -> Any:
    """A JMS id string → the AMQP id it encodes (``ID:AMQP_ULONG:5`` → ulong 5), else itself.

    Only canonical encodings (as :func:`_id_in` writes them) are decoded, and ``AMQP_STRING:``
    only when what follows would itself be decoded, so ``_id_in(_id_out(s)) == s`` for every
    string and ``_id_out(_id_in(a)) == a`` for every AMQP id. ``binary`` is False for the
    correlation-id, whose binary form is ``bytes`` in the core.
    """
    if not text.startswith(_ID_PREFIX):
        return text
    rest = text[8:]
    try:
        if rest.startswith("ULONG:"):
            digits = rest[6:]
            if digits.isdigit() and digits.isascii() and str(int(digits)) == digits:
                if int(digits) <= 0xFFFFFFFFFFFFFFFF:
                    return ulong(int(digits))
        elif rest.startswith("UUID:"):
            if str(UUID(rest[5:])) == rest[5:]:
                return UUID(rest[5:])
        elif rest.startswith("BINARY:"):
            if binary and bytes.fromhex(rest[7:]).hex().upper() == rest[7:]:
                return bytes.fromhex(rest[7:])
        elif rest.startswith("STRING:") and _id_out(rest[7:], binary) is not rest[7:]:
            return rest[7:]
    except ValueError:
        pass
    return text


def _id_in(value: Any, binary: bool) -> str | bytes:
    """An AMQP message-id / correlation-id → the JMS id (a binary correlation-id → bytes)."""
    t = type(value)
    if t is str:
        text: str = value
        if text.startswith(_ID_PREFIX) and _id_out(text, binary) is not text:
            return "ID:AMQP_STRING:" + text
        return text
    if t is memoryview or t is bytes:
        return "ID:AMQP_BINARY:" + bytes(value).hex().upper() if binary else bytes(value)
    if t is UUID:
        return "ID:AMQP_UUID:" + str(value)
    return "ID:AMQP_ULONG:" + str(int(value))


# -- values and the types record: mappings/amqp_values.py ------------------------------------

# -- AMQP → core -------------------------------------------------------------------------------


# properties-section strings kept as properties: (property, get, set); proton passes them as
# C strings (no NUL); content-encoding is a symbol (ASCII).
_STRING_FIELDS = (
    (GROUP_ID, cproton.pn_message_get_group_id, cproton.pn_message_set_group_id),
    (REPLY_TO_GROUP_ID_PROPERTY, cproton.pn_message_get_reply_to_group_id,
     cproton.pn_message_set_reply_to_group_id),
    (CONTENT_ENCODING_PROPERTY, cproton.pn_message_get_content_encoding,
     cproton.pn_message_set_content_encoding),
)  # fmt: skip
_STRING_SETTERS = {name: put for name, _, put in _STRING_FIELDS}
_SYMBOLS = (CONTENT_TYPE_PROPERTY, CONTENT_ENCODING_PROPERTY)  # AMQP symbols: ASCII only
SECTION_NAMES = (None, "data", "amqp-value", "amqp-sequence")  # by _NO_BODY … _SEQUENCE
SECTION_CODES = {name: code for code, name in enumerate(SECTION_NAMES) if name is not None}


def body_section(body: Any, inferred: bool) -> int:
    """Which body section proton decoded: none, data, amqp-value or amqp-sequence."""
    if body is None:
        return _NO_BODY
    if inferred:
        return _SEQUENCE if type(body) is list else _DATA
    return _VALUE


def types_json(marks: Marks) -> str:
    """The types record's text (compact JSON, ASCII)."""
    return json.dumps(marks, ensure_ascii=True, separators=(",", ":"))


# The helpers below are the rows of the README's tables, one definition each: the hand-written
# functions call them, and so do the default rules (``defaults/amqp.yaml``, through
# :mod:`mappings.converters`).


def _section_msg_type(section: int, kind: BodyKind, value: Any) -> int:
    """The x-opt-jms-msg-type sent with a body in this section (``value``: the AMQP body)."""
    if section == _NO_BODY or section == _SEQUENCE:
        return JMS_MESSAGE if section == _NO_BODY else JMS_STREAM
    if section == _DATA:
        return JMS_OBJECT if kind is _OBJECT else JMS_TEXT if kind is _TEXT else JMS_BYTES
    t = type(value)
    if t is str or t is memoryview or t is bytes:
        return JMS_TEXT if t is str else JMS_BYTES
    return JMS_MAP if t is dict else JMS_STREAM if t is list else JMS_OBJECT


def property_in(
    props: dict[str, Any], name: Any, value: Any, tree: Node | None, marks: Marks
) -> tuple[str, Any] | None:
    """An application property → (property name, core value) (README "Value types"); None for
    the types record itself and for a name already taken (the first one counts)."""
    name = str(name)
    core_name = name
    if tree is not None:
        if name == TYPES_PROPERTY:
            return None
        escaped = tree.get(_ESCAPED)
        if escaped and name in escaped:  # a name the core → AMQP side had to %-escape
            core_name = wire_unescape(name)
    if core_name in props:
        return None
    node = None if tree is None else tree.get(name)
    if node is None and type(value) in _PLAIN:
        return core_name, value
    return core_name, _in_value(value, node, (name,), marks)


def annotation_in(
    props: dict[str, Any], prefix: str, key: Any, value: Any, tree: Node | None, marks: Marks
) -> tuple[str, Any] | None:
    """A message (``MA_PREFIX``) or delivery (``DA_PREFIX``) annotation → the vendor property
    ``prefix + key`` and its core value (a ulong key is recorded); None for a key that is
    neither a symbol nor a ulong (AMQP 1.0 3.2.10), or a name already taken."""
    if isinstance(key, str):
        name = prefix + key
    elif isinstance(key, int):
        name = prefix + str(int(key))
    else:
        return None
    if name in props:
        return None
    if not isinstance(key, str):
        marks.append([_FIELD, name, "ulong"])
    node = None if tree is None else tree.get(name)
    if node is None and type(value) in _PLAIN:
        return name, value
    return name, _in_value(value, node, (name,), marks)


def body_in(body: Any, section: int, content_type: Any, msg_type: Any, tree: Node | None,
            marks: Marks) -> tuple[BodyKind, Any]:  # fmt: skip
    """The body kind and core body of an AMQP body (README "Bodies"); ``msg_type`` is the
    ``x-opt-jms-msg-type`` annotation (or None), ``section`` :func:`body_section`'s answer."""
    if section == _NO_BODY:
        return _NONE, None
    form = None
    body_node = None if tree is None else tree.get(_BODY)
    if section == _DATA:
        kind, body = _BYTES, bytes(body)
        if body_node is not None and body_node.get(None) == "string":  # a core text, escaped
            text = _in_restore(body, "string", body_node, (_BODY,), marks)
            if text is not _NO:
                kind, body = _TEXT, text
        elif msg_type == JMS_TEXT or (
            msg_type is None and content_type is not None and is_text_content_type(content_type)
        ):
            try:
                kind, body, form = _TEXT, body.decode(), "data"
            except UnicodeDecodeError:
                kind = _BYTES
        elif msg_type == JMS_OBJECT or (msg_type is None and content_type == SERIALIZED_OBJECT):
            kind = _OBJECT
    else:
        t = type(body)
        body = _in_value(body, body_node, (_BODY,), marks)
        if t is str or t is memoryview or t is bytes:
            kind, form = (_TEXT, None) if t is str else (_BYTES, "value")
        elif t is dict:
            kind = _MAP if type(body) is dict else _STREAM
        elif t is list:
            kind, form = _STREAM, ("value" if section == _VALUE else None)
        else:  # a single value of another type: a stream of one
            kind, form, body = _STREAM, "value1", [body]
            for m in marks:  # its recorded types move under the one-element list
                if m[0] == _BODY:
                    m.insert(1, 0)
    if form is not None:
        marks.append([_FIELD, "body", form])
    return kind, body


def user_id_in(user_id: bytes | None) -> str | bytes | None:
    """properties ``user-id`` → ``JMSXUserID``: a string if it is UTF-8; empty → None."""
    if not user_id:
        return None
    try:
        return bytes(user_id).decode()
    except UnicodeDecodeError:
        return bytes(user_id)


def group_seq_in(seq: int | None) -> Any:
    """``group-sequence`` (a uint) → ``JMSXGroupSeq``, a Java int: the top half wraps, as
    Qpid JMS does; 0 → None."""
    if not seq:
        return None
    return int.__new__(gt.Int32, seq - 0x100000000 if seq > 0x7FFFFFFF else seq)


def content_type_in(content_type: Any, kind: BodyKind) -> str | None:
    """``content-type`` → ``JMS_GW_CONTENT_TYPE``, unless the body kind implies it."""
    if content_type is None or (kind is _OBJECT and content_type == SERIALIZED_OBJECT):
        return None
    return str(content_type)


def annotation_consumed(key: Any, value: Any, section: int, kind: BodyKind, body: Any,
                        durable: bool) -> bool:  # fmt: skip
    """True for a message annotation a row reads (so it is not carried as a property): the
    JMS destination hints, ``x-opt-jms-msg-type`` when the body would go out with the same
    byte, ``x-opt-delivery-time`` as a long, ``x-opt-gw-trace-id`` as a string and
    ``x-opt-gw-delivery-mode`` RELIABLE on a message that is not durable."""
    if key == MSG_TYPE:
        return type(value) is proton.byte and value == _section_msg_type(section, kind, body)
    if key == JMS_DEST or key == JMS_REPLY_TO:
        return True
    if key == DELIVERY_TIME:
        return type(value) is int
    if key == TRACE_ID:
        return type(value) is str
    if key == GW_DELIVERY_MODE:
        return type(value) is symbol and value == RELIABLE and not durable
    return False


def mode_in(durable: Any, gw_mode: Any) -> DeliveryMode:
    """header ``durable`` (and ``x-opt-gw-delivery-mode``) → ``JMSDeliveryMode``."""
    if durable:
        return _PERSISTENT
    return _RELIABLE if type(gw_mode) is symbol and gw_mode == RELIABLE else _NON_PERSISTENT


def delivery_time_in(time: Any, delay: Any, now_ms: int) -> int:
    """``x-opt-delivery-time`` (any integer type), else ``now + x-opt-delivery-delay``."""
    t = int(time) if isinstance(time, int) and type(time) is not bool else 0
    if not t and isinstance(delay, int) and type(delay) is not bool:
        t = now_ms + int(delay)
    return t


def trace_id_in(value: Any, tree: Node | None) -> str | None:
    """``x-opt-gw-trace-id`` → the trace id (a string only)."""
    return _unescape(tree, "trace-id", value) if type(value) is str else None  # type: ignore[no-any-return]


def priority_in(priority: int) -> tuple[int, Any]:
    """header ``priority`` → (``JMSPriority``, ``JMS_GW_AMQP_PRIORITY`` or None): above 9 is 9
    (JMS Mapping: "MUST be set to 9") and the original is kept as a uint8."""
    if priority > 9:
        return 9, int.__new__(gt.UInt8, priority)
    return int(priority), None


def expiration_in(expiry: int | None, ttl: int | None, now_ms: int) -> int:
    """``absolute-expiry-time``, else ``now + ttl``, else 0 (never)."""
    if expiry:
        return int(expiry)
    return now_ms + int(ttl) if ttl else 0


def id_in(value: Any, tree: Node | None, field: str) -> Any:
    """``message-id`` / ``correlation-id`` (``field``) → the JMS id (table "Message and
    correlation ids"); None when absent."""
    if value is None:
        return None
    return _id_in(_unescape(tree, field, value), field == "message-id")


def reply_to_in(address: Any, hint: Any, default_kind: DestKind,
                tree: Node | None) -> tuple[Destination | None, str | None]:  # fmt: skip
    """``reply-to`` with the ``x-opt-jms-reply-to`` byte → (``JMSReplyTo``, None), or
    (None, the address) when it names no destination (``JMS_GW_AMQP_REPLY_TO``)."""
    if address is None:
        return None, None
    address = _unescape(tree, "reply-to", str(address))
    try:
        return parse_address(
            address, hint=hint if isinstance(hint, int) else None, default=default_kind), None
    except ValueError:
        return None, address


def amqp_to_message(
    pm: proton.Message, *, destination: Destination, default_kind: DestKind, now_ms: int
) -> Message:
    """Build the core message for one AMQP message (table "AMQP → core" in the README).

    ``destination`` is what the adapter resolved (link target, or ``to`` with the
    ``x-opt-jms-dest`` hint); reply-to is parsed here with the ``x-opt-jms-reply-to`` hint
    and ``default_kind``. The header's delivery-count and first-acquirer are per hop and not
    kept (the core counts deliveries itself). The broker stamps the message id, timestamp
    and trace id when message-id, creation-time and ``x-opt-gw-trace-id`` did not give them.
    The steps are the rows of ``defaults/amqp.yaml`` (``amqp.in.*``), in their order.
    """
    raw = pm._msg
    marks: Marks = []
    props: dict[str, Any] = {}
    tree: Node | None = None
    # application-properties → properties, with their AMQP types.
    app: dict[Any, Any] | None = pm.properties
    if app:
        record = app.get(TYPES_PROPERTY)
        if type(record) is str:
            tree = _parse_record(record)
        for name, value in app.items():
            if tree is None and type(name) is str and type(value) in _PLAIN:
                if name not in props:  # property_in's answer for a plain value, inline
                    props[name] = value
                continue
            item = property_in(props, name, value, tree, marks)
            if item is not None:
                props[item[0]] = item[1]
    # body → body kind and body (README "Body").
    amqp_body: Any = pm.body
    section = body_section(amqp_body, cproton.pn_message_is_inferred(raw))
    content_type = cproton.pn_message_get_content_type(raw)
    ann = pm.annotations
    kind, body = body_in(amqp_body, section, content_type, ann.get(MSG_TYPE) if ann else None,
                         tree, marks)  # fmt: skip
    # properties section → JMSX and vendor properties.
    user_id = cproton.pn_message_get_user_id(raw)
    if user_id:
        props[USER_ID] = user_id_in(user_id)
    for name, get, _ in _STRING_FIELDS:
        text = get(raw)
        if text is not None:
            props[name] = text
    seq = cproton.pn_message_get_group_sequence(raw)
    if seq:
        props[GROUP_SEQ] = group_seq_in(seq)
    if content_type is not None:
        content_type = content_type_in(content_type, kind)
        if content_type is not None:
            props[CONTENT_TYPE_PROPERTY] = content_type
    # message annotations: the JMS and gateway ones are read; any other is kept.
    durable = cproton.pn_message_is_durable(raw)
    trace_id = reply_hint = None
    delivery_time = 0
    if ann:
        gw_mode = ann.get(GW_DELIVERY_MODE)
        mode = _PERSISTENT if durable else (
            _NON_PERSISTENT if gw_mode is None else mode_in(durable, gw_mode))
        time, delay = ann.get(DELIVERY_TIME), ann.get(DELIVERY_DELAY)
        if time is not None or delay is not None:
            delivery_time = delivery_time_in(time, delay, now_ms)
        trace = ann.get(TRACE_ID)
        if trace is not None:
            trace_id = trace_id_in(trace, tree)
        reply_hint = ann.get(JMS_REPLY_TO)
        for key, value in ann.items():
            if not annotation_consumed(key, value, section, kind, amqp_body, durable):
                item = annotation_in(props, MA_PREFIX, key, value, tree, marks)
                if item is not None:
                    props[item[0]] = item[1]
    else:
        mode = _PERSISTENT if durable else _NON_PERSISTENT
    inst = pm.instructions
    for key, value in inst.items() if inst else ():
        item = annotation_in(props, DA_PREFIX, key, value, tree, marks)
        if item is not None:
            props[item[0]] = item[1]
    # header.
    priority = cproton.pn_message_get_priority(raw)
    if priority > 9:
        priority, props[PRIORITY_PROPERTY] = priority_in(priority)
    expiration = expiration_in(cproton.pn_message_get_expiry_time(raw),
                               cproton.pn_message_get_ttl(raw), now_ms)  # fmt: skip
    # ids, reply-to.
    message_id = cproton.pn_message_get_id(raw)
    if message_id is not None:
        message_id = id_in(message_id, tree, "message-id")
    correlation_id = cproton.pn_message_get_correlation_id(raw)
    if correlation_id is not None:
        correlation_id = id_in(correlation_id, tree, "correlation-id")
    reply_to = None
    address = cproton.pn_message_get_reply_to(raw)
    if address is not None:
        reply_to, unnamed = reply_to_in(address, reply_hint, default_kind, tree)
        if unnamed is not None:
            props[REPLY_TO_PROPERTY] = unnamed
    if marks:
        props[TYPES_PROPERTY] = types_json(marks)
    msg = new_message(body, kind)
    msg.properties = props
    msg.destination = destination
    msg.delivery_mode = mode
    msg.priority = priority
    msg.correlation_id = correlation_id
    msg.reply_to = reply_to
    msg.type = _unescape(tree, "subject", cproton.pn_message_get_subject(raw))
    msg.expiration = expiration
    msg.delivery_time = delivery_time
    msg.timestamp = cproton.pn_message_get_creation_time(raw)
    msg.message_id = message_id
    if trace_id is not None:
        msg.trace_id = trace_id
    return msg


# -- core → AMQP -------------------------------------------------------------------------------

# The properties with fields of their own (or the types record), in the order their rows send
# them (a value that does not fit its field goes as an application property, in this order):
# SPECIAL_ORDER (mappings/amqp_rows.py).
_SPECIAL_OUT = frozenset(SPECIAL_ORDER)
_SPECIAL_RANK = {name: i for i, name in enumerate(SPECIAL_ORDER)}


def _rank(item: tuple[str, Any]) -> int:
    return _SPECIAL_RANK[item[0]]


def annotation_out(name: str, value: Any, tree: Node | None, marks: Marks) -> tuple[Any, Any] | None:
    """A property ``JMS_GW_AMQP_MA_<key>`` / ``_DA_<key>`` → (the annotation key, its AMQP
    value): a symbol, or a ulong when the types record says so; None when the key part is not
    ASCII (it stays an application property)."""
    key: Any = name[15:]
    if not key.isascii():
        return None
    if _field_mark(tree, name) == "ulong" and key.isdigit():
        key = ulong(int(key))
    else:
        key = symbol(key)
    node = None if tree is None else tree.get(name)
    return key, _out_value(value, node, (name,), marks)


def body_out(kind: BodyKind, body: Any, tree: Node | None,
             marks: Marks) -> tuple[Any, int, int, str | None]:  # fmt: skip
    """The body (README "Bodies", Out): (AMQP body, section, ``x-opt-jms-msg-type`` byte, the
    content type the body kind implies or None)."""
    form = _field_mark(tree, "body")
    if kind is _TEXT:
        if not _encodable(body):  # a Java string with a lone surrogate: a data section
            marks.append([_BODY, "string"])
            return body.encode("utf-8", "surrogatepass"), _DATA, JMS_TEXT, None
        if form == "data":
            return body.encode(), _DATA, JMS_TEXT, None
        return body, _VALUE, JMS_TEXT, None
    if kind is _BYTES:
        return body, _VALUE if form == "value" else _DATA, JMS_BYTES, None
    if kind is _OBJECT:
        return body, _DATA, JMS_OBJECT, SERIALIZED_OBJECT
    if kind is _NONE:
        return None, _NO_BODY, JMS_MESSAGE, None
    value = _out_value(body, None if tree is None else tree.get(_BODY), (_BODY,), marks)
    if type(value) is dict:
        return value, _VALUE, JMS_MAP, None
    if form == "value1" and len(value) == 1:
        return value[0], _VALUE, _section_msg_type(_VALUE, kind, value[0]), None
    # STREAM: an amqp-sequence, as Qpid JMS sends a StreamMessage
    return value, _VALUE if form == "value" else _SEQUENCE, JMS_STREAM, None


def ttl_out(expires: int, now_ms: int) -> int:
    """The ttl: ms left of the effective expiry (1 when past, at most a uint); 0: none."""
    if not expires:
        return 0
    left = expires - now_ms
    return min(left, UINT_MAX) if left > 0 else 1


def address_out(dest: Destination, field: str, marks: Marks) -> tuple[str, Any]:
    """``to`` / ``reply-to`` (``field``) and its ``x-opt-jms-dest`` / ``-reply-to`` byte."""
    return _escape(format_address(dest), field, marks), _BYTE[dest_type_code(dest)]


def id_out(value: str | bytes, field: str, marks: Marks) -> Any:
    """``JMSMessageID`` / ``JMSCorrelationID`` (``field``) → the AMQP id: ``bytes`` as a
    binary, a Qpid JMS encoding as the id it encodes, any other string as it is (escaped)."""
    if isinstance(value, bytes):
        return value
    return _escape(_id_out(value, field == "message-id"), field, marks)


def user_id_out(value: Any) -> bytes | None:
    """``JMSXUserID`` → ``user-id``: a non-empty string as UTF-8, bytes that are not UTF-8 as
    they are; None: it does not fit (an application property)."""
    t = type(value)
    if value and (t is str and _encodable(value) or t is bytes and not _utf8(value)):
        return value.encode() if t is str else value  # type: ignore[no-any-return]
    return None


def group_seq_out(value: Any) -> int | None:
    """``JMSXGroupSeq`` → ``group-sequence``: a non-zero int32, negatives wrapping."""
    return value & 0xFFFFFFFF if type(value) is gt.Int32 and value else None


def priority_out(priority: int, kept: Any) -> int | None:
    """``JMS_GW_AMQP_PRIORITY`` → the header priority when ``JMSPriority`` is 9 and it is a
    uint8 above 9; None: it does not fit."""
    return int(kept) if type(kept) is gt.UInt8 and kept > 9 and priority == 9 else None


def string_field_out(value: Any, symbolic: bool) -> str | None:
    """A property → a properties-section string (a symbol if ``symbolic``: ASCII); None: it
    does not fit (proton passes it as a C string: no NUL, no lone surrogate)."""
    if type(value) is str and _field_safe(value) and (not symbolic or value.isascii()):
        return value  # type: ignore[no-any-return]
    return None


def message_to_amqp(msg: Message, *, delivery_count: int, now_ms: int) -> proton.Message:
    """The AMQP rendering of a core message (table "core → AMQP" in the README).

    ``delivery_count`` is the core's JMSXDeliveryCount (1 on the first delivery): the header
    gets delivery-count = count - 1 and first-acquirer = (count == 1). The ttl sent is what is
    left of the message's life (``expires_at`` if set, else JMSExpiration); the adapter drops
    expired messages before calling this. The steps are the rows of ``defaults/amqp.yaml``
    (``amqp.out.*``), in their order.
    """
    pm = proton.Message()
    raw = pm._msg
    marks: Marks = []
    app: dict[str, Any] = {}
    ann: dict[Any, Any] = {}
    carried: dict[Any, Any] = {}
    inst: dict[Any, Any] = {}
    tree: Node | None = None
    special: list[tuple[str, Any]] = []
    props = msg.properties
    if props:
        record = props.get(TYPES_PROPERTY)
        if type(record) is str:
            tree = _parse_record(record)
        for name, value in props.items():
            if name in _SPECIAL_OUT:
                special.append((name, value))
                continue
            if name.startswith("JMS_GW_AMQP_") and name.startswith((MA_PREFIX, DA_PREFIX)):
                item = annotation_out(name, value, tree, marks)
                if item is not None:
                    (carried if name[12] == "M" else inst)[item[0]] = item[1]
                    continue
            app_put(app, name, value, tree, marks)
    # body → body section and x-opt-jms-msg-type.
    body, section, code, content_type = body_out(msg.body_kind, msg.body, tree, marks)
    if section != _NO_BODY:
        pm.body = body
        if section != _VALUE:
            pm.inferred = True
    ann[MSG_TYPE] = _BYTE[code]
    # header.
    mode = msg.delivery_mode
    cproton.pn_message_set_durable(raw, mode is _PERSISTENT)
    if mode is _RELIABLE:
        ann[GW_DELIVERY_MODE] = RELIABLE
    ttl = ttl_out(msg.expires_at or msg.expiration, now_ms)
    if ttl:
        cproton.pn_message_set_ttl(raw, ttl)
    if delivery_count > 1:
        cproton.pn_message_set_delivery_count(raw, delivery_count - 1)
    else:
        cproton.pn_message_set_first_acquirer(raw, True)
    # properties section and the annotations that go with it.
    if msg.message_id is not None:
        cproton.pn_message_set_id(raw, id_out(msg.message_id, "message-id", marks))
    dest = msg.destination
    if dest is not None:
        address, ann[JMS_DEST] = address_out(dest, "to", marks)
        cproton.pn_message_set_address(raw, address)
    if msg.type is not None:
        pm.subject = _escape(msg.type, "subject", marks)
    reply_to = msg.reply_to
    if reply_to is not None:
        pm.reply_to, ann[JMS_REPLY_TO] = address_out(reply_to, "reply-to", marks)
    if msg.correlation_id is not None:
        pm.correlation_id = id_out(msg.correlation_id, "correlation-id", marks)
    if msg.expiration:
        cproton.pn_message_set_expiry_time(raw, msg.expiration)
    if msg.timestamp:
        cproton.pn_message_set_creation_time(raw, msg.timestamp)
    if msg.delivery_time:
        ann[DELIVERY_TIME] = int(msg.delivery_time)  # an AMQP long, as Qpid JMS reads it
    if msg.trace_id is not None:
        ann[TRACE_ID] = _escape(msg.trace_id, "trace-id", marks)
    # the properties with fields of their own, in their rows' order
    priority = msg.priority
    if len(special) > 1:
        special.sort(key=_rank)
    for name, value in special:
        if name == USER_ID:
            user_id = user_id_out(value)
            if user_id is not None:
                pm.user_id = user_id
                continue
        elif name == GROUP_SEQ:
            seq = group_seq_out(value)
            if seq is not None:
                cproton.pn_message_set_group_sequence(raw, seq)
                continue
        elif name == PRIORITY_PROPERTY:
            above = priority_out(priority, value)
            if above is not None:
                priority = above
                continue
        elif name == TYPES_PROPERTY:
            if type(value) is str:
                continue
        elif string_field_out(value, name in _SYMBOLS) is not None:
            if name == CONTENT_TYPE_PROPERTY:
                content_type = value
                continue
            if name in _STRING_SETTERS:
                _STRING_SETTERS[name](raw, value)
                continue
            if reply_to is None:  # REPLY_TO_PROPERTY: a reply-to naming nothing
                pm.reply_to = value
                continue
        app_put(app, name, value, tree, marks)
    cproton.pn_message_set_priority(raw, priority)
    if content_type is not None:
        cproton.pn_message_set_content_type(raw, content_type)
    if carried:  # last: a carried x-opt-jms-msg-type overrides the computed one
        ann.update(carried)
    if marks:
        app[TYPES_PROPERTY] = types_json(marks)
    if app:
        pm.properties = app  # type: ignore[assignment]  # proton declares it None
    # Keys are symbols and ulongs already: skip the setter's AnnotationDict copy (2 µs).
    pm.annotation_dict = ann  # type: ignore[assignment]
    if inst:
        pm.instructions = inst
    return pm


def _utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def app_put(app: dict[str, Any], name: str, value: Any, tree: Node | None, marks: Marks) -> None:
    """One property → one application property, in its AMQP type (README "Value types"); a
    name with a lone surrogate is %-escaped and recorded."""
    if not _encodable(name):
        wire_name = wire_escape(name)
        marks.append([_ESCAPED, wire_name, "esc"])
    else:
        wire_name = name
    node = None if tree is None else tree.get(name)
    t = type(value)
    if node is None and (t in _PLAIN_OUT or (t is str and value.isascii())):
        app[wire_name] = value
    else:
        app[wire_name] = _out_value(value, node, (wire_name,), marks)
