"""The wire side of the mapping engine: each protocol's own form, addressed as ``wire.…``.

How this works. A mapping between a protocol and the core runs on a :class:`Work` message: a
core :class:`~gateway.message.Message` with one more slot, ``w``, holding the protocol's form
of the same message — what was received (``in``) or what is being built to send (``out``).
The default mappings (``mappings/defaults/<protocol>.yaml``) are rules whose steps read one
side and write the other; user rules may address both. This module defines the wire forms
(:class:`StompIn`, :class:`StompOut`, :class:`MqttIn`, :class:`MqttOut`, :class:`AmqpIn`,
:class:`AmqpOut`: AMQP values keep their AMQP types; :class:`RvIn`, :class:`RvOut`, in
:mod:`mappings.rv_wire`: an RV message of typed fields, read and written as core values),
the ``wire.…`` field paths of each (:func:`wire_parser`) and the sections ``copy_all``
walks (:func:`wire_section`).

The form of an incoming message is the caller's (the adapter's parsed frame): it is read-only
to the mapping. The form of an outgoing one is the mapping's to build; :meth:`StompOut.finish`
turns it into what the adapter sends. The field paths are in ``mappings/README.md``
("Wire fields").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

import cproton
import proton

from gateway import types as gt
from gateway.errors import MessageFormatError
from gateway.message import DestKind, Message
from mappings import amqp as _amqp
from mappings import amqp_values as _values
from mappings.fields import _MISSING, Kept, Section, _Field
from mappings.rv_wire import RV_SECTIONS, RvIn, RvOut, rv_in_field, rv_out_field

__all__ = ["TYPES_MARK", "WIRE_PROTOCOLS", "AmqpIn", "AmqpOut", "MqttIn", "MqttOut", "RvIn",
           "RvOut", "StompIn", "StompOut", "Work", "amqp_core", "amqp_value", "wire_parser",
           "wire_section"]  # fmt: skip

# protocols with a wire form (and default mapping rules)
WIRE_PROTOCOLS = ("stomp", "mqtt", "amqp", "rv")
_IN_READ_ONLY = "is read-only: the wire form of an incoming message is what was received"


class Work(Message):
    """The message a protocol mapping works on: a core message plus its wire form ``w``."""

    __slots__ = ("w",)

    w: Any


# -- STOMP -----------------------------------------------------------------------------------


class StompIn:
    """A SEND (or, for a transport, MESSAGE) frame as the mapping reads it."""

    __slots__ = ("body", "has_length", "headers", "now")

    def __init__(self, headers: dict[str, str], body: bytes, has_length: bool, now: int) -> None:
        self.headers, self.body, self.has_length, self.now = headers, body, has_length, now


class _TypesMark:
    """Where the ``gw-types`` header goes; its text is every entry collected by the end."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<gw-types>"


TYPES_MARK = _TypesMark()


class StompOut:
    """The MESSAGE (or, for a transport, SEND) being built: headers in order, body, the
    adapter's renderings of the destination and reply-to, and the ``gw-types`` entries."""

    __slots__ = ("body", "destination", "headers", "reply_to", "types")

    def __init__(self, destination: str, reply_to: str | None) -> None:
        self.headers: list[tuple[str, Any]] = []
        self.body = b""
        self.destination, self.reply_to = destination, reply_to
        self.types: list[str] = []

    def finish(self) -> tuple[list[tuple[str, str]], bytes]:
        """The headers (``gw-types`` filled in, or left out without entries) and the body."""
        out: list[tuple[str, str]] = []
        for name, value in self.headers:
            if value is TYPES_MARK:
                if self.types:
                    out.append((name, ",".join(self.types)))
            else:
                out.append((name, value))
        return out, self.body


def _w(m: Any) -> Any:
    """The wire form of a :class:`Work` message."""
    return m.w


def _stomp_out_value(w: StompOut, value: Any) -> Any:
    if value is TYPES_MARK:
        return ",".join(w.types) if w.types else _MISSING
    return value


def _read_only(text: str, read: Callable[[Any], Any], why: str, path: tuple[str, ...],
               *core: Callable[[Any], Any]) -> _Field:
    """A wire field a rule may read but not write (``why`` says so in the error)."""

    def ro(m: Message, v: Any = None) -> None:
        raise MessageFormatError(f"{text} {why}")

    return _Field(text, "wire", path, read, ro, ro, lambda m: read(m) is _MISSING,
                  f"{text} {why}", *core)  # fmt: skip


def _stomp_in_field(rest: str) -> _Field:
    def ro(m: Message, v: Any = None) -> None:
        raise MessageFormatError(f"wire.{rest} {_IN_READ_ONLY}")

    def field(read: Callable[[Any], Any]) -> _Field:
        return _Field("wire." + rest, "wire", (rest,), read, ro, ro,
                      lambda m: read(m) is _MISSING, f"wire.{rest} {_IN_READ_ONLY}")  # fmt: skip

    if rest.startswith("header."):
        name = rest[7:]
        if not name:
            raise ValueError("empty header name")
        return field(lambda m: m.w.headers.get(name, _MISSING))._replace(path=("header", name))
    simple: dict[str, Callable[[Any], Any]] = {
        "body": lambda m: m.w.body,
        "has_length": lambda m: m.w.has_length,
        "now": lambda m: m.w.now,
    }
    if rest in simple:
        return field(simple[rest])
    raise ValueError("a STOMP frame received has wire.header.<name>, wire.body, "
                     "wire.has_length and wire.now")


def _stomp_out_field(rest: str) -> _Field:
    text = "wire." + rest
    if rest.startswith("header."):
        name = rest[7:]
        if not name:
            raise ValueError("empty header name")

        def read(m: Any) -> Any:
            w = m.w
            for n, v in w.headers:
                if n == name:
                    return _stomp_out_value(w, v)
            return _MISSING

        def write(m: Any, v: Any) -> None:
            if type(v) is not str and v is not TYPES_MARK:
                raise MessageFormatError(f"a STOMP header is text, not {type(v).__name__}")
            headers = m.w.headers
            for i, (n, _) in enumerate(headers):
                if n == name:
                    headers[i] = (name, v)
                    return
            headers.append((name, v))

        def delete(m: Any) -> None:
            m.w.headers = [(n, v) for n, v in m.w.headers if n != name]

        return _Field(text, "wire", ("header", name), read, write, delete,
                      lambda m: read(m) is _MISSING)
    if rest == "body":
        def write_body(m: Any, v: Any) -> None:
            if type(v) is str:
                v = v.encode("utf-8", "surrogatepass")
            if type(v) is not bytes:
                raise MessageFormatError(f"a STOMP body is bytes, not {type(v).__name__}")
            m.w.body = v

        def clear(m: Any) -> None:
            m.w.body = b""

        return _Field(text, "wire", (rest,), lambda m: _w(m).body, write_body, clear,
                      lambda m: not _w(m).body)  # fmt: skip
    fixed = {
        "destination": (lambda m: _w(m).destination, "the adapter's rendering of the destination"),
        "reply_to": (lambda m: _MISSING if _w(m).reply_to is None else _w(m).reply_to,
                     "the adapter's rendering of JMSReplyTo"),
        "types": (lambda m: _w(m).types, "the gw-types entries collected by converters"),
    }  # fmt: skip
    if rest in fixed:
        read, why = fixed[rest]
        return _read_only(text, read, f"is read-only ({why})", (rest,))
    raise ValueError("a STOMP frame sent has wire.header.<name>, wire.body, wire.destination, "
                     "wire.reply_to and wire.types")


# -- MQTT ------------------------------------------------------------------------------------

# MQTT 5 PUBLISH properties a mapping may address as wire.<name> (the codec's names). The
# topic alias and subscription identifiers are hop-by-hop (the adapter's); user properties
# are wire.user.<name>.
MQTT_PROPERTIES = ("payload_format_indicator", "message_expiry_interval", "content_type",
                   "response_topic", "correlation_data")  # fmt: skip
_FOUR_BYTES = 0xFFFFFFFF  # a Four Byte Integer (MQTT 5.0 1.5.3)


class MqttIn:
    """A PUBLISH as the mapping reads it; below MQTT 5 it has no properties."""

    __slots__ = ("level", "now", "payload", "properties", "qos", "retain", "user")

    def __init__(self, payload: bytes, qos: int, retain: bool, properties: dict[str, Any],
                 level: int, now: int) -> None:
        self.payload, self.qos, self.retain, self.level, self.now = (
            payload, qos, retain, level, now)  # fmt: skip
        self.properties = properties if level >= 5 else {}
        self.user: list[tuple[str, str]] = self.properties.get("user_property") or []


class MqttOut:
    """The PUBLISH being built: payload, the message's QoS, the MQTT 5 properties, the user
    properties and gw-types entries, the adapter's Response Topic rendering, level and time."""

    __slots__ = ("level", "now", "payload", "properties", "qos", "reply_topic", "types", "user")

    def __init__(self, level: int, now: int, reply_topic: str | None) -> None:
        self.level, self.now, self.reply_topic = level, now, reply_topic
        self.payload = b""
        self.qos = 0
        self.properties: dict[str, Any] = {}
        self.user: list[tuple[str, Any]] = []
        self.types: list[str] = []

    def finish(self) -> tuple[bytes, int, dict[str, Any]]:
        """(payload, qos, properties): the user properties last (``gw-types`` filled in or left
        out); no properties at all below MQTT 5."""
        if self.level < 5:
            return self.payload, self.qos, {}
        out = dict(self.properties)
        pairs = [(n, ",".join(self.types) if v is TYPES_MARK else v) for n, v in self.user
                 if v is not TYPES_MARK or self.types]  # fmt: skip
        if pairs:
            out["user_property"] = pairs
        return self.payload, self.qos, out


def _first_user(pairs: list[tuple[str, Any]], name: str, w: Any) -> Any:
    for n, v in pairs:
        if n == name:
            return _stomp_out_value(w, v)
    return _MISSING


def _mqtt_in_field(rest: str) -> _Field:
    def ro(m: Message, v: Any = None) -> None:
        raise MessageFormatError(f"wire.{rest} {_IN_READ_ONLY}")

    def field(read: Callable[[Any], Any], path: tuple[str, ...] = (rest,)) -> _Field:
        return _Field("wire." + rest, "wire", path, read, ro, ro,
                      lambda m: read(m) is _MISSING, f"wire.{rest} {_IN_READ_ONLY}")  # fmt: skip

    if rest.startswith("user."):
        name = rest[5:]
        if not name:
            raise ValueError("empty user property name")
        return field(lambda m: _first_user(_w(m).user, name, None), ("user", name))
    if rest in MQTT_PROPERTIES:
        return field(lambda m: _w(m).properties.get(rest, _MISSING))
    simple: dict[str, Callable[[Any], Any]] = {
        "payload": lambda m: _w(m).payload, "qos": lambda m: _w(m).qos,
        "retain": lambda m: _w(m).retain, "level": lambda m: _w(m).level,
        "now": lambda m: _w(m).now, "user": lambda m: list(_w(m).user),
    }  # fmt: skip
    if rest in simple:
        return field(simple[rest])
    raise ValueError("a PUBLISH received has wire.payload, wire.qos, wire.retain, wire.level, "
                     "wire.now, wire.user (every user property), wire.user.<name> and "
                     f"wire.{', wire.'.join(MQTT_PROPERTIES)}")


def _mqtt_string(v: Any) -> str:
    if type(v) is not str or "\x00" in v or not _utf8(v):
        raise MessageFormatError(f"{v!r} is not an MQTT string (UTF-8, no U+0000)")
    return v


def _utf8(v: str) -> bool:
    try:
        v.encode()
    except UnicodeEncodeError:
        return False
    return True


def _mqtt_check(name: str) -> Callable[[Any], Any]:
    def number(lo: int, hi: int) -> Callable[[Any], Any]:
        def check(v: Any) -> Any:
            if type(v) is bool or not isinstance(v, int) or not lo <= v <= hi:
                raise MessageFormatError(f"{name} is an integer in {lo}..{hi}, not {v!r}")
            return int(v)

        return check

    def binary(v: Any) -> Any:
        if type(v) is str:
            return v.encode("utf-8", "surrogatepass")
        if type(v) is not bytes:
            raise MessageFormatError(f"{name} is bytes, not {type(v).__name__}")
        return v

    checks: dict[str, Callable[[Any], Any]] = {
        "payload_format_indicator": number(0, 1), "message_expiry_interval": number(0, _FOUR_BYTES),
        "content_type": _mqtt_string, "response_topic": _mqtt_string, "correlation_data": binary,
        "payload": binary, "qos": number(0, 2),
    }  # fmt: skip
    return checks[name]


def _mqtt_out_field(rest: str) -> _Field:
    text = "wire." + rest
    if rest.startswith("user."):
        name = rest[5:]
        if not name:
            raise ValueError("empty user property name")

        def read_user(m: Any) -> Any:
            return _first_user(m.w.user, name, m.w)

        def add_user(m: Any, v: Any) -> None:
            if v is not TYPES_MARK:
                _mqtt_string(v)
            m.w.user.append((name, v))

        def drop_user(m: Any) -> None:
            m.w.user = [(n, v) for n, v in m.w.user if n != name]

        return _Field(text, "wire", ("user", name), read_user, add_user, drop_user,
                      lambda m: read_user(m) is _MISSING)  # fmt: skip
    if rest in MQTT_PROPERTIES:
        check = _mqtt_check(rest)

        def read(m: Any) -> Any:
            return m.w.properties.get(rest, _MISSING)

        def write(m: Any, v: Any) -> None:
            m.w.properties[rest] = check(v)

        def delete(m: Any) -> None:
            m.w.properties.pop(rest, None)

        return _Field(text, "wire", (rest,), read, write, delete, lambda m: read(m) is _MISSING)
    if rest == "user":  # every user property written so far, as (name, text) pairs

        def read_all(m: Any) -> Any:
            return [(n, _stomp_out_value(m.w, v)) for n, v in m.w.user]

        def write_all(m: Any, v: Any) -> None:
            if type(v) is not list:
                raise MessageFormatError(f"wire.user is a list of pairs, not {type(v).__name__}")
            for pair in v:
                if type(pair) is not tuple or len(pair) != 2:
                    raise MessageFormatError(f"wire.user holds (name, text) pairs, not {pair!r}")
                _mqtt_string(pair[0])
                _mqtt_string(pair[1])
            m.w.user = list(v)

        def clear_all(m: Any) -> None:
            m.w.user = []

        return _Field(text, "wire", ("user",), read_all, write_all, clear_all,
                      lambda m: not _w(m).user)
    if rest in ("payload", "qos"):
        check = _mqtt_check(rest)

        def write_slot(m: Any, v: Any) -> None:
            setattr(m.w, rest, check(v))

        def reset(m: Any) -> None:
            setattr(m.w, rest, b"" if rest == "payload" else 0)

        return _Field(text, "wire", (rest,), lambda m: getattr(_w(m), rest), write_slot, reset,
                      lambda m: False)  # fmt: skip
    fixed: dict[str, tuple[Callable[[Any], Any], str]] = {
        "level": (lambda m: _w(m).level, "the subscriber's protocol level"),
        "now": (lambda m: _w(m).now, "the time of the delivery"),
        "reply_topic": (lambda m: _MISSING if _w(m).reply_topic is None else _w(m).reply_topic,
                        "the adapter's MQTT rendering of JMSReplyTo"),
        "types": (lambda m: _w(m).types, "the gw-types entries collected by converters"),
    }  # fmt: skip
    if rest in fixed:
        read_fixed, why = fixed[rest]
        return _read_only(text, read_fixed, f"is read-only ({why})", (rest,))
    raise ValueError("a PUBLISH sent has wire.payload, wire.qos, wire.user (every user "
                     "property), wire.user.<name>, wire.level, "
                     "wire.now, wire.reply_topic, wire.types and "
                     f"wire.{', wire.'.join(MQTT_PROPERTIES)}")


# -- AMQP 1.0 --------------------------------------------------------------------------------

# The header and properties fields (AMQP 1.0 Part 3, 3.2.1 and 3.2.4), as wire.header.<f> and
# wire.properties.<f>.
AMQP_HEADER = ("durable", "priority", "ttl", "first-acquirer", "delivery-count")
AMQP_PROPERTIES = ("message-id", "user-id", "to", "subject", "reply-to", "correlation-id",
                   "content-type", "content-encoding", "absolute-expiry-time", "creation-time",
                   "group-id", "group-sequence", "reply-to-group-id")  # fmt: skip
_SECTION_NAMES = _amqp.SECTION_NAMES
_NO_BODY = 0


def _none_missing(v: Any) -> Any:
    return _MISSING if v is None else v


def _if_set(cls: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """proton gives 0 for an absent number: absent, else the value in its AMQP type."""
    return lambda v: cls(v) if v else _MISSING


# wire.header.<f> and wire.properties.<f> of an AMQP message received: read through cproton
# (proton's Message turns times into float seconds), each in its AMQP type.
_AMQP_READ: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "header.durable": (cproton.pn_message_is_durable, bool),
    "header.priority": (cproton.pn_message_get_priority, proton.ubyte),
    "header.ttl": (cproton.pn_message_get_ttl, _if_set(proton.uint)),
    "header.first-acquirer": (cproton.pn_message_is_first_acquirer, bool),
    "header.delivery-count": (cproton.pn_message_get_delivery_count, proton.uint),
    "properties.message-id": (cproton.pn_message_get_id, _none_missing),
    "properties.user-id": (cproton.pn_message_get_user_id, lambda v: bytes(v) if v else _MISSING),
    "properties.to": (cproton.pn_message_get_address, _none_missing),
    "properties.subject": (cproton.pn_message_get_subject, _none_missing),
    "properties.reply-to": (cproton.pn_message_get_reply_to, _none_missing),
    "properties.correlation-id": (cproton.pn_message_get_correlation_id, _none_missing),
    "properties.content-type": (cproton.pn_message_get_content_type,
                                lambda v: _MISSING if v is None else proton.symbol(v)),
    "properties.content-encoding": (cproton.pn_message_get_content_encoding,
                                    lambda v: _MISSING if v is None else proton.symbol(v)),
    "properties.absolute-expiry-time": (cproton.pn_message_get_expiry_time,
                                        _if_set(proton.timestamp)),
    "properties.creation-time": (cproton.pn_message_get_creation_time, _if_set(proton.timestamp)),
    "properties.group-id": (cproton.pn_message_get_group_id, _none_missing),
    "properties.group-sequence": (cproton.pn_message_get_group_sequence, _if_set(proton.uint)),
    "properties.reply-to-group-id": (cproton.pn_message_get_reply_to_group_id, _none_missing),
}  # fmt: skip


class AmqpIn:
    """An AMQP message received (proton's decoded ``Message``) as the mapping reads it, with
    the types record its application properties hold (parsed once) and the one being written
    for the core message (``marks``)."""

    __slots__ = ("ann", "app", "default_kind", "inst", "marks", "now", "pm", "raw", "section",
                 "tree")  # fmt: skip

    def __init__(self, pm: proton.Message, default_kind: DestKind, now: int) -> None:
        self.pm, self.raw, self.default_kind, self.now = pm, pm._msg, default_kind, now
        self.app: dict[Any, Any] = pm.properties or {}
        self.ann: dict[Any, Any] = pm.annotations or {}
        self.inst: dict[Any, Any] = pm.instructions or {}
        self.section = _amqp.body_section(pm.body, cproton.pn_message_is_inferred(self.raw))
        record = self.app.get(_amqp.TYPES_PROPERTY)
        self.tree = _values._parse_record(record) if type(record) is str else None
        self.marks: list[list[Any]] = []


_AMQP_KEEP = frozenset((
    type(None), bool, int, float, str, bytes, proton.byte, proton.short, proton.int32,
    proton.ubyte, proton.ushort, proton.uint, proton.ulong, proton.float32, proton.char,
    proton.timestamp, proton.symbol, UUID, proton.decimal32, proton.decimal64, proton.decimal128,
    proton.Described, proton.Array,
))  # fmt: skip  # values that are AMQP values already
_AMQP_ONLY = _AMQP_KEEP - {type(None), bool, int, float, str, bytes}  # not core values too


def amqp_value(v: Any) -> Any:
    """A value written to an AMQP field: AMQP values as they are, core values (``Int8``,
    ``Char``, typed arrays, maps and lists of them, …) in their AMQP type (README "Value
    types"), or raise."""
    if type(v) in _AMQP_KEEP:
        return v
    try:
        return _values._out_value(v, None, ("wire",), [])
    except TypeError as exc:
        if type(v) is dict or type(v) is list:
            return v  # it holds AMQP values already (a converter's answer)
        raise MessageFormatError(str(exc)) from None


def _checked(name: str, v: Any) -> Any:
    """A value for wire.header.<f> / wire.properties.<f> of an AMQP message sent, or raise."""
    def bad(what: str) -> MessageFormatError:
        return MessageFormatError(f"{name} is {what}, not {v!r}")

    t = type(v)
    number = isinstance(v, int) and t is not bool
    if name in ("header.durable", "header.first-acquirer"):
        if t is not bool:
            raise bad("a boolean")
    elif name in ("header.priority", "header.ttl", "header.delivery-count",
                  "properties.group-sequence", "properties.absolute-expiry-time",
                  "properties.creation-time"):  # fmt: skip
        lo, hi = {"header.priority": (0, 0xFF),  # timestamps: signed ms (AMQP 1.0 1.6.20)
                  "properties.absolute-expiry-time": (-(2**63), 2**63 - 1),
                  "properties.creation-time": (-(2**63), 2**63 - 1)}.get(name, (0, 0xFFFFFFFF))
        if not number or not lo <= v <= hi:
            raise bad(f"an integer in {lo}..{hi}")
        return int(v)
    elif name in ("properties.message-id", "properties.correlation-id"):
        if t is gt.UInt64:
            return proton.ulong(v)
        if t not in (str, bytes, proton.ulong, UUID):
            raise bad("a string, binary, ulong or uuid")
    elif name == "properties.user-id":
        if t is str:
            return v.encode("utf-8", "surrogatepass")
        if t is not bytes:
            raise bad("binary")
    elif t is not str and t is not proton.symbol or not _values._field_safe(v) or (
            name in ("properties.content-type", "properties.content-encoding")
            and not v.isascii()):  # fmt: skip
        raise bad("a string with no U+0000 or lone surrogate (ASCII for a symbol)")
    return v


# wire.properties.<f> → how AmqpOut.finish() sets it on the proton Message
_AMQP_SET: dict[str, Callable[[Any, Any, Any], None]] = {
    "message-id": lambda pm, raw, v: cproton.pn_message_set_id(raw, v),
    "user-id": lambda pm, raw, v: setattr(pm, "user_id", v),
    "to": lambda pm, raw, v: cproton.pn_message_set_address(raw, v),
    "subject": lambda pm, raw, v: setattr(pm, "subject", v),
    "reply-to": lambda pm, raw, v: setattr(pm, "reply_to", v),
    "correlation-id": lambda pm, raw, v: setattr(pm, "correlation_id", v),
    "content-type": lambda pm, raw, v: cproton.pn_message_set_content_type(raw, v),
    "content-encoding": lambda pm, raw, v: cproton.pn_message_set_content_encoding(raw, v),
    "absolute-expiry-time": lambda pm, raw, v: cproton.pn_message_set_expiry_time(raw, v),
    "creation-time": lambda pm, raw, v: cproton.pn_message_set_creation_time(raw, v),
    "group-id": lambda pm, raw, v: cproton.pn_message_set_group_id(raw, v),
    "group-sequence": lambda pm, raw, v: cproton.pn_message_set_group_sequence(raw, v),
    "reply-to-group-id": lambda pm, raw, v: cproton.pn_message_set_reply_to_group_id(raw, v),
}


class AmqpOut:
    """The AMQP message being built: header and properties fields, message and delivery
    annotations (``carried``: the ``JMS_GW_AMQP_MA_`` properties, put in last), application
    properties, the body and its section, and the types record being written (``marks``;
    ``tree`` is the one the core message holds)."""

    __slots__ = ("ann", "app", "body", "carried", "delivery_count", "header", "inst", "marks",
                 "now", "props", "section", "tree")  # fmt: skip

    def __init__(self, tree: Any, delivery_count: int, now: int) -> None:
        self.tree, self.delivery_count, self.now = tree, delivery_count, now
        self.header: dict[str, Any] = {}
        self.props: dict[str, Any] = {}
        self.ann: dict[Any, Any] = {}
        self.carried: dict[Any, Any] = {}
        self.inst: dict[Any, Any] = {}
        self.app: dict[str, Any] = {}
        self.body: Any = None
        self.section = _NO_BODY
        self.marks: list[list[Any]] = []

    def finish(self) -> proton.Message:
        """The ``proton.Message`` to send, as ``message_to_amqp`` builds it."""
        pm = proton.Message()
        raw = pm._msg
        h = self.header
        cproton.pn_message_set_durable(raw, h.get("durable", False))
        if "ttl" in h:
            cproton.pn_message_set_ttl(raw, h["ttl"])
        if "delivery-count" in h:
            cproton.pn_message_set_delivery_count(raw, h["delivery-count"])
        if "first-acquirer" in h:
            cproton.pn_message_set_first_acquirer(raw, h["first-acquirer"])
        cproton.pn_message_set_priority(raw, h.get("priority", 4))
        for name, value in self.props.items():
            _AMQP_SET[name](pm, raw, value)
        if self.section != _NO_BODY:
            pm.body = self.body
            if _SECTION_NAMES[self.section] != "amqp-value":
                pm.inferred = True
        ann = self.ann
        if self.carried:  # last: a carried x-opt-jms-msg-type overrides the computed one
            ann.update(self.carried)
        app = self.app
        if self.marks:
            app[_amqp.TYPES_PROPERTY] = _amqp.types_json(self.marks)
        if app:
            pm.properties = app  # type: ignore[assignment]  # proton declares it None
        pm.annotation_dict = ann  # type: ignore[assignment]
        if self.inst:
            pm.instructions = self.inst
        return pm


def amqp_core(v: Any) -> Any:
    """An AMQP value copied off the wire into a core field: its core value (README "Value
    types": a ubyte is a ``UInt8``, a timestamp ms, a symbol a string, …); its recorded type is
    not kept."""
    try:
        return _values._in_value(v, None, ("wire",), [])
    except TypeError as exc:
        raise MessageFormatError(str(exc)) from None


def _amqp_ro(text: str, read: Callable[[Any], Any], why: str, path: tuple[str, ...]) -> _Field:
    return _read_only(text, read, why, path, amqp_core)


_AMQP_MAPS = {"annotation": "ann", "delivery_annotation": "inst", "application": "app"}


def _amqp_in_field(rest: str) -> _Field:
    text = "wire." + rest
    if rest in _AMQP_READ:
        get, wrap = _AMQP_READ[rest]
        return _amqp_ro(text, lambda m: wrap(get(m.w.raw)), _IN_READ_ONLY,
                        tuple(rest.split(".", 1)))  # fmt: skip
    section, _, name = rest.partition(".")
    if section in _AMQP_MAPS and name:
        attr = _AMQP_MAPS[section]
        return _amqp_ro(text, lambda m: getattr(m.w, attr).get(name, _MISSING), _IN_READ_ONLY,
                        (section, name))  # fmt: skip
    simple: dict[str, Callable[[Any], Any]] = {
        "body": lambda m: _none_missing(m.w.pm.body),
        "body_section": lambda m: _none_missing(_SECTION_NAMES[m.w.section]),
        "now": lambda m: m.w.now,
        "types": lambda m: m.w.marks,
    }
    if rest in simple:
        return _amqp_ro(text, simple[rest], _IN_READ_ONLY, (rest,))
    raise ValueError("an AMQP message received has wire.header.<field>, "
                     "wire.properties.<field>, wire.annotation.<key>, "
                     "wire.delivery_annotation.<key>, wire.application.<name>, wire.body, "
                     "wire.body_section, wire.now and wire.types")


def _amqp_app_put(m: Any, name: str, v: Any) -> None:
    w = m.w
    if type(v) in _AMQP_ONLY:
        w.app[name] = v
    else:  # a core value: in its AMQP type, recorded as message_to_amqp records it
        _amqp.app_put(w.app, name, v, w.tree, w.marks)


def _amqp_ann_put(m: Any, name: Any, v: Any) -> None:
    m.w.ann[name if type(name) is proton.ulong else proton.symbol(name)] = amqp_value(v)


def _amqp_inst_put(m: Any, name: Any, v: Any) -> None:
    m.w.inst[name if type(name) is proton.ulong else proton.symbol(name)] = amqp_value(v)


_AMQP_PUT = {"annotation": _amqp_ann_put, "delivery_annotation": _amqp_inst_put,
             "application": _amqp_app_put}  # fmt: skip


def _amqp_out_field(rest: str) -> _Field:
    text = "wire." + rest
    if rest in _AMQP_READ:
        section, name = rest.split(".", 1)
        attr = "header" if section == "header" else "props"

        def read(m: Any) -> Any:
            return getattr(m.w, attr).get(name, _MISSING)

        def write(m: Any, v: Any) -> None:
            getattr(m.w, attr)[name] = _checked(rest, v)

        def delete(m: Any) -> None:
            getattr(m.w, attr).pop(name, None)

        return _Field(text, "wire", (section, name), read, write, delete,
                      lambda m: read(m) is _MISSING, "", amqp_core)  # fmt: skip
    section, _, key = rest.partition(".")
    if section in _AMQP_MAPS and key:
        attr, put = _AMQP_MAPS[section], _AMQP_PUT[section]
        wire_key: Any = key if section == "application" else proton.symbol(key)

        def read_map(m: Any) -> Any:
            return getattr(m.w, attr).get(wire_key, _MISSING)

        def write_map(m: Any, v: Any) -> None:
            put(m, key, v)

        def drop_map(m: Any) -> None:
            getattr(m.w, attr).pop(wire_key, None)
            if section == "annotation":
                m.w.carried.pop(wire_key, None)

        return _Field(text, "wire", (section, key), read_map, write_map, drop_map,
                      lambda m: read_map(m) is _MISSING, "", amqp_core)  # fmt: skip
    if rest == "body":
        def write_body(m: Any, v: Any) -> None:
            w = m.w
            w.body = v.value if type(v) is Kept else amqp_value(v)  # Kept: AMQP already
            if w.section == _NO_BODY:
                w.section = _SECTION_NAMES.index("amqp-value")

        def clear(m: Any) -> None:
            m.w.body, m.w.section = None, _NO_BODY

        return _Field(text, "wire", (rest,), lambda m: _none_missing(_w(m).body), write_body,
                      clear, lambda m: _w(m).body is None, "", amqp_core)  # fmt: skip
    if rest == "body_section":
        def write_section(m: Any, v: Any) -> None:
            if v not in _amqp.SECTION_CODES:
                raise MessageFormatError(f"a body section is data, amqp-value or amqp-sequence, "
                                         f"not {v!r}")
            m.w.section = _amqp.SECTION_CODES[v]

        return _Field(text, "wire", (rest,),
                      lambda m: _none_missing(_SECTION_NAMES[_w(m).section]), write_section,
                      lambda m: setattr(_w(m), "section", _NO_BODY),
                      lambda m: _w(m).section == _NO_BODY)  # fmt: skip
    fixed: dict[str, tuple[Callable[[Any], Any], str]] = {
        "now": (lambda m: m.w.now, "is read-only (the time of the delivery)"),
        "delivery_count": (lambda m: m.w.delivery_count,
                           "is read-only (the core's JMSXDeliveryCount)"),
        "types": (lambda m: m.w.marks, "is read-only (the types record entries so far)"),
    }  # fmt: skip
    if rest in fixed:
        return _amqp_ro(text, fixed[rest][0], fixed[rest][1], (rest,))
    raise ValueError("an AMQP message sent has wire.header.<field>, wire.properties.<field>, "
                     "wire.annotation.<key>, wire.delivery_annotation.<key>, "
                     "wire.application.<name>, wire.body, wire.body_section, wire.now, "
                     "wire.delivery_count and wire.types")


def _mqtt_out_put(m: Any, name: str, v: Any) -> None:
    m.w.user.append((name, v))  # MQTT 5 allows a name more than once [MQTT-3.3.2-17]


def _stomp_out_put(m: Any, name: str, v: Any) -> None:
    m.w.headers.append((name, v))  # copy_all sends every one (a receiver reads the first)


def _in_put(m: Message, name: str, v: Any) -> None:
    raise MessageFormatError(f"wire.header {_IN_READ_ONLY}")


def _amqp_items(attr: str) -> Callable[[Any], Any]:
    """The (key, value) pairs of an AMQP wire form's map ``attr`` (``copy_all``)."""
    return lambda m: getattr(_w(m), attr).items()


_SECTIONS: dict[tuple[str, str, str], Section] = {
    ("stomp", "in", "header"): Section("wire.header", lambda m: _w(m).headers.items(), _in_put,
                                       f"wire.header {_IN_READ_ONLY}"),
    ("stomp", "out", "header"): Section("wire.header", lambda m: _w(m).headers, _stomp_out_put),
    ("mqtt", "in", "user"): Section("wire.user", lambda m: _w(m).user, _in_put,
                                    f"wire.user {_IN_READ_ONLY}"),
    ("mqtt", "out", "user"): Section("wire.user", lambda m: _w(m).user, _mqtt_out_put),
    **{("amqp", "in", s): Section(f"wire.{s}", _amqp_items(a), _in_put,
                                  f"wire.{s} {_IN_READ_ONLY}", True, amqp_core)
       for s, a in _AMQP_MAPS.items()},
    **{("amqp", "out", s): Section(f"wire.{s}", _amqp_items(a), _AMQP_PUT[s], "", True,
                                   amqp_core)
       for s, a in _AMQP_MAPS.items()},
    ("rv", "in", "field"): RV_SECTIONS["in"],
    ("rv", "out", "field"): RV_SECTIONS["out"],
}  # fmt: skip

_PARSERS: dict[tuple[str, str], Callable[[str], _Field]] = {
    ("stomp", "in"): _stomp_in_field,
    ("stomp", "out"): _stomp_out_field,
    ("mqtt", "in"): _mqtt_in_field,
    ("mqtt", "out"): _mqtt_out_field,
    ("amqp", "in"): _amqp_in_field,
    ("amqp", "out"): _amqp_out_field,
    ("rv", "in"): rv_in_field,
    ("rv", "out"): rv_out_field,
}


def wire_parser(protocol: str, direction: str) -> Callable[[str], _Field] | None:
    """What parses ``wire.<rest>`` for one protocol and direction (None: no wire form)."""
    return _PARSERS.get((protocol, direction))


def wire_section(protocol: str, direction: str, name: str) -> Section | None:
    """The ``copy_all`` section ``wire.<name>`` of a protocol and direction, if it has one."""
    return _SECTIONS.get((protocol, direction, name))
