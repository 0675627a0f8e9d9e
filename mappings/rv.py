"""The default mapping between the RV-style bus and the core: TIBCO EMS's translation.

How this works. An RV message (:class:`transports.rv.message.Message`) is an ordered list of
typed fields; a core message (:class:`gateway.message.Message`) has JMS headers, typed
properties and one body. The mapping is the one TIBCO EMS applies between Rendezvous and JMS
(TIBCO EMS User's Guide, "Working With TIBCO Rendezvous", "Message Translation"):

* ``JMSDestination`` ⇄ the send subject and ``JMSReplyTo`` ⇄ the reply subject (the caller
  renders both: the bridge owns subjects, inboxes and temporary destinations);
* out, the other headers go in a submessage field ``JMSHeaders`` and the properties in one
  named ``JMSProperties`` (each left out when the transport's ``export_headers`` /
  ``export_properties`` is false), then the body: ``JMSText`` (STRING), ``JMSBytes`` and
  ``JMSObject`` (OPAQUE), ``JMSStream`` (a submessage, see below), or, for a map, its
  entries as top-level fields of the same names;
* in, the body kind is chosen by which of ``JMSBytes``, ``JMSObject``, ``JMSStream``,
  ``JMSText`` is present (in that order), and otherwise every named field is a map entry;
* values by the datatype table ("Message Translation", "Datatype Conversion"): the rows that
  go both ways are exact, the rows EMS has only in the import direction widen (``U8`` →
  short, ``U16`` → int, ``U32`` and ``U64`` → long, ``IPPORT16`` → short, ``IPADDR32`` → int,
  ``DATETIME`` → long ms, ``XML`` and ``I8ARRAY`` → byte[]).

What EMS leaves open, and the gateway's choices (mappings/README.md, "RV (default
mapping)"): EMS encodes ``JMSStream`` in a private byte form; here it is a submessage whose
fields are the stream's elements, unnamed, in order, and a nested stream is a submessage of
the same kind (a submessage whose every field is unnamed reads back as a stream). The
core's unsigned widths and typed arrays EMS has no Java type for leave in their own RV type.

:func:`rv_to_message` and :func:`message_to_rv` are the hand-written mapping, the fast path of
the default rules in ``mappings/defaults/rv.yaml`` (tests prove the two agree). Each row that
is more than a copy is a function here that the converters call too.

This module imports the RV message model, ``transports/rv/message.py``, a standalone stdlib
data model; it is the one import of ``transports`` the import contract allows ``mappings``
(pyproject.toml, mappings/README.md).
"""

from __future__ import annotations

from array import array
from datetime import datetime
from typing import Any

from gateway import types as gt
from gateway.errors import MessageFormatError
from gateway.message import BodyKind, DeliveryMode, Destination, Message
from transports.rv.message import CmLabel, Field, FieldError, RvDateTime
from transports.rv.message import Message as RvMessage

__all__ = ["BODY_FIELDS", "HEADERS_FIELD", "PROPERTIES_FIELD", "FieldError", "RvMessage",
           "add", "body_in", "body_out", "cm_expiration", "cm_sequence", "core_value",
           "datetime_out", "headers_in", "headers_out", "map_in", "message_to_rv",
           "properties_in", "properties_out", "rv_to_message", "rv_value"]  # fmt: skip

# Field names of EMS's translation ("Message Translation", Tables 65 and 66).
HEADERS_FIELD = "JMSHeaders"
PROPERTIES_FIELD = "JMSProperties"
TEXT_FIELD, BYTES_FIELD = "JMSText", "JMSBytes"
STREAM_FIELD, OBJECT_FIELD = "JMSStream", "JMSObject"
# Import: the first of these present decides the body kind (Table 65, in its order).
BODY_FIELDS = ((BYTES_FIELD, BodyKind.BYTES), (OBJECT_FIELD, BodyKind.OBJECT),
               (STREAM_FIELD, BodyKind.STREAM), (TEXT_FIELD, BodyKind.TEXT))  # fmt: skip
_NOT_MAP_ENTRIES = frozenset((HEADERS_FIELD, PROPERTIES_FIELD))
CM_PUBLISHER = "JMS_GW_CM_PUBLISHER"  # EMS's JMS_TIBCO_CM_PUBLISHER (Table 64)
CM_SEQUENCE = "JMS_GW_CM_SEQUENCE"  # EMS's JMS_TIBCO_CM_SEQUENCE
MSG_EXT = "JMS_GW_MSG_EXT"  # EMS's JMS_TIBCO_MSG_EXT: set on every imported message

# RV type codes (TIBCO Rendezvous Concepts, Data, "Rendezvous Datatypes"), as plain ints.
MSG, DATETIME, OPAQUE, STRING, BOOL = 1, 3, 7, 8, 9
I8, U8, I16, U16, I32, U32, I64, U64 = 14, 15, 16, 17, 18, 19, 20, 21
F32, F64, IPPORT16, IPADDR32 = 24, 25, 26, 27
I8ARRAY, U8ARRAY, I16ARRAY, U16ARRAY, I32ARRAY, U32ARRAY, I64ARRAY, U64ARRAY = range(34, 42)
F32ARRAY, F64ARRAY, XML, STRINGARRAY, MSGARRAY = 44, 45, 47, 48, 49

_LONG_MAX = (1 << 63) - 1

# -- values: RV → core (import; the datatype table, "←" and "↔" rows) -----------------------

# Scalars that widen or keep their width (a plain int is a long).
_SCALAR_IN: dict[int, Any] = {
    BOOL: bool, I8: gt.Int8, U8: gt.Int16, I16: gt.Int16, U16: gt.Int32, I32: gt.Int32,
    U32: int, I64: int, F32: gt.Float32, F64: float,
}  # fmt: skip
_ARRAY_IN: dict[int, Any] = {
    U8ARRAY: gt.Int16Array, I16ARRAY: gt.Int16Array, U16ARRAY: gt.Int32Array,
    I32ARRAY: gt.Int32Array, U32ARRAY: gt.Int64Array, I64ARRAY: gt.Int64Array,
    F32ARRAY: gt.Float32Array, F64ARRAY: gt.Float64Array,
}  # fmt: skip


def core_value(t: int, v: Any) -> Any:
    """The core value of an RV field of type ``t`` (EMS's datatype table, import direction),
    or ``None`` for a type EMS does not import (``ENCRYPTED`` and unknown codes).

    The one-way rows: ``U8`` → short, ``U16`` → int, ``U32`` → long; ``U64`` → long, kept
    as ``uint64`` when above a long (EMS overflows; here nothing is lost); ``IPPORT16`` →
    short and ``IPADDR32`` → int, their bits as Java reads them (``65535`` → ``-1``,
    ``192.168.0.1`` → ``-1062731775``); ``DATETIME`` → long ms since the epoch (microseconds
    truncated); ``XML`` and ``I8ARRAY`` → byte[]. Beyond the table: ``STRINGARRAY`` and
    ``MSGARRAY`` → a stream of strings or maps.
    """
    conv = _SCALAR_IN.get(t)
    if conv is not None:
        return conv(v)
    if t == STRING:
        if type(v) is str:
            return v
        return str(v) if isinstance(v, str) else v.decode("utf-8", "replace")
    if t == MSG:
        return msg_in(v)
    if t == OPAQUE or t == XML:
        return bytes(v)
    if t == U64:
        return int(v) if v <= _LONG_MAX else gt.UInt64(v)
    if t == DATETIME:
        dt: RvDateTime = v
        return dt.seconds * 1000 + dt.microseconds // 1000
    if t == IPPORT16:
        return gt.Int16(v - 0x10000 if v > 0x7FFF else v)
    if t == IPADDR32:
        n = int(v)
        return gt.Int32(n - 0x100000000 if n > 0x7FFFFFFF else n)
    arr = _ARRAY_IN.get(t)
    if arr is not None:
        return arr(v)
    if t == U64ARRAY:
        return gt.Int64Array(v) if all(x <= _LONG_MAX for x in v) else gt.UInt64Array(v)
    if t == I8ARRAY:
        return v.tobytes()
    if t == STRINGARRAY:
        return [x if type(x) is str else x.decode("utf-8", "replace") for x in v]
    if t == MSGARRAY:
        return [msg_in(x) for x in v]
    return None


def msg_in(rv: RvMessage) -> dict[str, Any] | list[Any]:
    """A submessage: a map of its named fields (the first of a repeated name; fields with no
    name are not imported, as EMS imports fields by name only), or a stream when it has
    fields and none is named (how a stream leaves, see :func:`rv_value`)."""
    fields = rv.fields
    if fields and all(f.name is None for f in fields):
        out: list[Any] = []
        for f in fields:
            v = core_value(f.type, f.value)
            if v is not None:
                out.append(v)
        return out
    return map_in(rv, ())


def map_in(rv: RvMessage, skip: frozenset[str] | tuple[str, ...]) -> dict[str, Any]:
    """Every named field of ``rv`` but ``skip`` as map entries, in order; the first of a
    repeated name counts ("Message Translation": fields are imported by name)."""
    out: dict[str, Any] = {}
    for f in rv.fields:
        name = f.name
        if name is None or name in out or name in skip:
            continue
        v = core_value(f.type, f.value)
        if v is not None:
            out[name] = v
    return out


# -- values: core → RV (export; the "↔" rows, and the core's own types) ---------------------

_SCALAR_OUT: dict[type, int] = {
    bool: BOOL, gt.Int8: I8, gt.Int16: I16, gt.Int32: I32, gt.Int64: I64, int: I64,
    gt.UInt8: U8, gt.UInt16: U16, gt.UInt32: U32, gt.UInt64: U64, gt.Float32: F32, float: F64,
    str: STRING, gt.Char: STRING, bytes: OPAQUE,
}  # fmt: skip
_ARRAY_OUT: dict[type, tuple[int, str]] = {
    gt.Int8Array: (I8ARRAY, "b"), gt.Int16Array: (I16ARRAY, "h"), gt.Int32Array: (I32ARRAY, "i"),
    gt.Int64Array: (I64ARRAY, "q"), gt.UInt8Array: (U8ARRAY, "B"),
    gt.UInt16Array: (U16ARRAY, "H"), gt.UInt32Array: (U32ARRAY, "I"),
    gt.UInt64Array: (U64ARRAY, "Q"), gt.Float32Array: (F32ARRAY, "f"),
    gt.Float64Array: (F64ARRAY, "d"),
}  # fmt: skip


def rv_value(v: Any) -> tuple[int, Any] | None:
    """The RV type and value of a core value (EMS's datatype table, export direction), or
    ``None`` for null (RV has no null: the field is left out, as EMS leaves out null
    properties and headers).

    ``bytes`` → ``OPAQUE`` (never ``I8ARRAY``, as EMS); a map → ``MSG``; a stream (and a
    ``boolean[]``, which RV has no array for) → ``MSG`` of unnamed fields; ``char`` →
    ``STRING``; the core's unsigned widths and arrays → ``U8`` … ``U64``, ``U8ARRAY`` …
    ``U64ARRAY``; ``int8[]`` → ``I8ARRAY``. Raises :class:`MessageFormatError` for a value
    of no type here (and :func:`add` for one RV cannot carry).
    """
    t = type(v)
    code = _SCALAR_OUT.get(t)
    if code is not None:
        return code, str(v) if t is gt.Char else v
    if v is None:
        return None
    if t is dict:
        return MSG, map_out(v)
    if t is list or t is gt.BoolArray:
        return MSG, stream_out(v)
    arr = _ARRAY_OUT.get(t)
    if arr is not None:
        return arr[0], array(arr[1], v)
    raise MessageFormatError(f"no RV type for a {t.__name__}")


def add(rv: RvMessage, name: str | None, value: Any, t: int) -> None:
    """Add a field to a message being sent; what RV cannot carry (a string holding NUL, a
    name starting with ``_`` or longer than 127 bytes, a value out of the type's range) is
    a :class:`MessageFormatError`: the message cannot be sent."""
    try:
        rv.add(name, value, t)
    except FieldError as exc:
        raise MessageFormatError(f"cannot be sent on the RV bus: field {name!r}: {exc}") from None


def map_out(m: dict[str, Any], into: RvMessage | None = None) -> RvMessage:
    """A map as a message of named fields, in order (null entries left out)."""
    rv = RvMessage() if into is None else into
    for name, v in m.items():
        tv = rv_value(v)
        if tv is not None:
            add(rv, name, tv[1], tv[0])
    return rv


def stream_out(s: Any) -> RvMessage:
    """A stream as a message of unnamed fields, in order (null elements left out)."""
    rv = RvMessage()
    for v in s:
        tv = rv_value(v)
        if tv is not None:
            add(rv, None, tv[1], tv[0])
    return rv


def datetime_out(v: Any) -> RvDateTime:
    """A ``DATETIME`` from a core value: a long of ms since 1970, or an ISO 8601 text (a
    naive one is UTC). Raises :class:`MessageFormatError` for anything else."""
    if isinstance(v, int) and type(v) is not bool:
        s, ms = divmod(int(v), 1000)
        return RvDateTime(s, ms * 1000)
    if isinstance(v, str):
        try:
            return RvDateTime.from_datetime(datetime.fromisoformat(v))
        except ValueError:
            pass
    raise MessageFormatError(f"a DATETIME is ms since 1970 or an ISO 8601 text, not {v!r}")


# -- the rows --------------------------------------------------------------------------------

def headers_out(msg: Message) -> RvMessage:
    """The ``JMSHeaders`` submessage of ``msg``: every header but the destination and
    reply-to, in the types of EMS's header table ("Message Translation": ``JMSDeliveryMode``
    and ``JMSPriority`` ``U8``, the times ``U64``, ``JMSType``, ``JMSMessageID`` and
    ``JMSCorrelationID`` ``STRING``, ``JMSRedelivered`` ``BOOL``); null ones left out (a
    ``JMSTimestamp`` or ``JMSDeliveryTime`` of 0 is not set, and a time before 1970 does not
    fit ``U64``); a binary correlation id as ``OPAQUE``."""
    rv = RvMessage()
    # The numbers are in their types' ranges already (a core message checks its headers), so
    # these fields are made directly: Message.add's checks would double the cost.
    fields = rv.fields
    fields.append(Field("JMSDeliveryMode", 0, U8, int(msg.delivery_mode), _NAME_MODE))
    if msg.delivery_time > 0:
        fields.append(Field("JMSDeliveryTime", 0, U64, msg.delivery_time, _NAME_DELIVERY))
    fields.append(Field("JMSPriority", 0, U8, int(msg.priority), _NAME_PRIORITY))
    if msg.timestamp > 0:
        fields.append(Field("JMSTimestamp", 0, U64, msg.timestamp, _NAME_TIMESTAMP))
    if msg.expiration >= 0:
        fields.append(Field("JMSExpiration", 0, U64, msg.expiration, _NAME_EXPIRATION))
    if msg.type is not None:
        add(rv, "JMSType", msg.type, STRING)
    if msg.message_id is not None:
        add(rv, "JMSMessageID", msg.message_id, STRING)
    corr = msg.correlation_id
    if corr is not None:
        add(rv, "JMSCorrelationID", corr, OPAQUE if type(corr) is bytes else STRING)
    fields.append(Field("JMSRedelivered", 0, BOOL, bool(msg.redelivered), _NAME_REDELIVERED))
    return rv


_NAME_MODE, _NAME_DELIVERY, _NAME_PRIORITY = b"JMSDeliveryMode", b"JMSDeliveryTime", b"JMSPriority"
_NAME_TIMESTAMP, _NAME_EXPIRATION = b"JMSTimestamp", b"JMSExpiration"
_NAME_REDELIVERED = b"JMSRedelivered"


def headers_in(rv: RvMessage | None) -> tuple[Any, Any, Any, Any, Any, Any]:
    """From a ``JMSHeaders`` submessage: (priority, timestamp, expiration, delivery time,
    type, correlation id), ``None`` for each one absent or of the wrong kind.

    Beyond EMS, which sets no header from it: so a message crossing the bus between two
    gateways (or from an EMS server) keeps them. ``JMSDeliveryMode`` comes from the
    transport's ``topic_import_dm`` / ``queue_import_dm`` as in EMS; ``JMSMessageID`` and
    ``JMSRedelivered`` are the receiving broker's."""
    out: list[Any] = [None] * 6
    if rv is None:
        return out[0], out[1], out[2], out[3], out[4], out[5]
    for f in rv.fields:
        name, t, v = f.name, f.type, f.value
        if name == "JMSPriority":
            if t in _SCALAR_IN and t not in (BOOL, F32, F64) and 0 <= v <= 9 and out[0] is None:
                out[0] = int(v)
        elif name in ("JMSTimestamp", "JMSExpiration", "JMSDeliveryTime"):
            i = 1 if name == "JMSTimestamp" else 2 if name == "JMSExpiration" else 3
            if out[i] is None and (t in _SCALAR_IN and t not in (BOOL, F32, F64) or t == U64) \
                    and 0 <= v <= _LONG_MAX:
                out[i] = int(v)
        elif name == "JMSType":
            if t == STRING and out[4] is None:
                out[4] = core_value(t, v)
        elif name == "JMSCorrelationID" and out[5] is None:
            if t == STRING:
                out[5] = core_value(t, v)
            elif t == OPAQUE:
                out[5] = bytes(v)
    return out[0], out[1], out[2], out[3], out[4], out[5]


def properties_out(props: dict[str, Any]) -> RvMessage:
    """The ``JMSProperties`` submessage: every property, in order, by the datatype table
    (null ones left out)."""
    return map_out(props)


def properties_in(rv: RvMessage | None) -> dict[str, Any]:
    """The properties of a ``JMSProperties`` submessage: its named fields that are JMS
    property values (scalars; a nested message, array or byte[] is not a property and is
    left out)."""
    if rv is None:
        return {}
    out = map_in(rv, ())
    for name in [n for n, v in out.items() if type(v) in _NOT_PROPERTY]:
        del out[name]
    return out


_NOT_PROPERTY = frozenset((dict, list, bytes, *gt.ARRAY_TYPES))


def body_in(rv: RvMessage) -> tuple[BodyKind, Any]:
    """The body of an imported message (Table "Rendezvous to EMS message body"): the first
    of ``JMSBytes``, ``JMSObject``, ``JMSStream``, ``JMSText`` present decides the kind;
    otherwise a ``MAP`` of every named field but ``JMSHeaders`` and ``JMSProperties`` (an
    empty map when there is none). A ``JMSStream`` that is ``OPAQUE`` (EMS's own encoding,
    which is not public) becomes a ``BYTES`` body; a field of the wrong type for its kind
    (a ``JMSText`` that is a number) is a map entry like any other."""
    for name, kind in BODY_FIELDS:
        f = rv.get_field(name)
        if f is None:
            continue
        t = f.type
        if kind is BodyKind.TEXT and t == STRING:
            return kind, core_value(t, f.value)
        if (kind is BodyKind.BYTES or kind is BodyKind.OBJECT) and t in (OPAQUE, XML):
            return kind, bytes(f.value)
        if kind is BodyKind.STREAM:
            if t == MSG:
                v = msg_in(f.value)
                return kind, v if isinstance(v, list) else list(v.values())
            if t == OPAQUE:
                return BodyKind.BYTES, bytes(f.value)
    return BodyKind.MAP, map_in(rv, _NOT_MAP_ENTRIES)


def body_out(kind: BodyKind, body: Any, into: RvMessage) -> None:
    """The data fields of a body (Table "EMS to Rendezvous message body"), added to
    ``into``: ``JMSText`` (STRING), ``JMSBytes`` / ``JMSObject`` (OPAQUE), ``JMSStream`` (a
    submessage of unnamed fields), a map's entries as top-level fields; nothing for no body."""
    if kind is BodyKind.MAP:
        map_out(body, into)
    elif kind is BodyKind.TEXT:
        add(into, TEXT_FIELD, body, STRING)
    elif kind is BodyKind.BYTES:
        add(into, BYTES_FIELD, body, OPAQUE)
    elif kind is BodyKind.OBJECT:
        add(into, OBJECT_FIELD, body, OPAQUE)
    elif kind is BodyKind.STREAM:
        add(into, STREAM_FIELD, stream_out(body), MSG)


# -- the whole mapping -------------------------------------------------------------------------


def rv_to_message(rv: RvMessage, *, destination: Destination, reply_to: Destination | None,
                  delivery_mode: DeliveryMode = DeliveryMode.NON_PERSISTENT,
                  now_ms: int) -> Message:  # fmt: skip
    """The core message of an imported RV message (README "RV → core").

    ``destination`` is the send subject's destination and ``reply_to`` the bridge's
    rendering of the reply subject; ``delivery_mode`` the transport's ``topic_import_dm`` or
    ``queue_import_dm`` ("Working With TIBCO Rendezvous", "Import Issues").
    """
    kind, body = body_in(rv)
    msg = Message(body, body_kind=kind, destination=destination, reply_to=reply_to,
                  delivery_mode=delivery_mode, timestamp=now_ms)  # fmt: skip
    f = rv.get_field(PROPERTIES_FIELD)
    props = properties_in(f.value) if f is not None and f.type == MSG else {}
    props[MSG_EXT] = True
    cm = rv.cm
    if cm is not None:
        props[CM_PUBLISHER] = cm.sender
        props[CM_SEQUENCE] = cm_sequence(cm)
    msg.properties = props
    f = rv.get_field(HEADERS_FIELD)
    priority, timestamp, expiration, delivery_time, type_, corr = headers_in(
        f.value if f is not None and f.type == MSG else None)
    if priority is not None:
        msg.priority = priority
    if timestamp is not None:
        msg.timestamp = timestamp
    if expiration is not None:
        msg.expiration = expiration
    if cm is not None and not msg.expiration:
        msg.expiration = cm_expiration(cm.time_limit, msg.timestamp)
    if delivery_time is not None:
        msg.delivery_time = delivery_time
    msg.type = type_
    msg.correlation_id = corr
    return msg


def cm_sequence(cm: CmLabel) -> int:
    """``JMS_GW_CM_SEQUENCE``: the certified-delivery sequence number, a long (``uint64``
    above a long's range)."""
    return cm.sequence if cm.sequence <= _LONG_MAX else gt.UInt64(cm.sequence)


def cm_expiration(time_limit: float, timestamp: int) -> int:
    """``JMSExpiration`` from a certified-delivery time limit (seconds): the timestamp plus
    the limit, 0 (never) for no limit ("Import Issues": the expiration needs the message's
    creation time)."""
    return timestamp + int(time_limit * 1000) if time_limit > 0 and timestamp > 0 else 0


def message_to_rv(msg: Message, *, send_subject: str, reply_subject: str | None,
                  export_headers: bool = True, export_properties: bool = True) -> RvMessage:
    """The RV message of an exported core message (README "core → RV"): ``JMSHeaders``,
    ``JMSProperties``, then the body's fields ("Message Translation", Table "EMS to
    Rendezvous message body"). ``send_subject`` / ``reply_subject`` are the bridge's
    renderings of ``JMSDestination`` / ``JMSReplyTo``."""
    rv = RvMessage(send_subject, reply_subject)
    if export_headers:
        add(rv, HEADERS_FIELD, headers_out(msg), MSG)
    if export_properties and msg.properties:
        add(rv, PROPERTIES_FIELD, properties_out(msg.properties), MSG)
    body_out(msg.body_kind, msg.body, rv)
    return rv

