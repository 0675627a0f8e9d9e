"""The wire side of the mapping engine: each protocol's own form, addressed as ``wire.…``.

How this works. A mapping between a protocol and the core runs on a :class:`Work` message: a
core :class:`~gateway.message.Message` with one more slot, ``w``, holding the protocol's form
of the same message — what was received (``in``) or what is being built to send (``out``).
The default mappings (``mappings/defaults/<protocol>.yaml``) are rules whose steps read one
side and write the other; user rules may address both. This module defines the wire forms
(:class:`StompIn`, :class:`StompOut`, :class:`MqttIn`, :class:`MqttOut`), the ``wire.…``
field paths of each
(:func:`wire_parser`) and the sections ``copy_all`` walks (:func:`wire_section`).

The form of an incoming message is the caller's (the adapter's parsed frame): it is read-only
to the mapping. The form of an outgoing one is the mapping's to build; :meth:`StompOut.finish`
turns it into what the adapter sends. The field paths are in ``mappings/README.md``
("Wire fields").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.errors import MessageFormatError
from gateway.message import Message
from mappings.fields import _MISSING, Section, _Field

__all__ = ["TYPES_MARK", "WIRE_PROTOCOLS", "MqttIn", "MqttOut", "StompIn", "StompOut", "Work",
           "wire_parser", "wire_section"]  # fmt: skip

WIRE_PROTOCOLS = ("stomp", "mqtt")  # protocols with a wire form (and default mapping rules)
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

        def ro(m: Message, v: Any = None) -> None:
            raise MessageFormatError(f"{text} is read-only ({why})")

        return _Field(text, "wire", (rest,), read, ro, ro, lambda m: read(m) is _MISSING,
                      f"{text} is read-only ({why})")  # fmt: skip
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
        "now": lambda m: _w(m).now,
    }  # fmt: skip
    if rest in simple:
        return field(simple[rest])
    raise ValueError("a PUBLISH received has wire.payload, wire.qos, wire.retain, wire.level, "
                     f"wire.now, wire.user.<name> and wire.{', wire.'.join(MQTT_PROPERTIES)}")


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

        def ro(m: Message, v: Any = None) -> None:
            raise MessageFormatError(f"{text} is read-only ({why})")

        return _Field(text, "wire", (rest,), read_fixed, ro, ro,
                      lambda m: read_fixed(m) is _MISSING, f"{text} is read-only ({why})")
    raise ValueError("a PUBLISH sent has wire.payload, wire.qos, wire.user.<name>, wire.level, "
                     "wire.now, wire.reply_topic, wire.types and "
                     f"wire.{', wire.'.join(MQTT_PROPERTIES)}")


def _mqtt_out_put(m: Any, name: str, v: Any) -> None:
    m.w.user.append((name, v))  # MQTT 5 allows a name more than once [MQTT-3.3.2-17]


def _stomp_out_put(m: Any, name: str, v: Any) -> None:
    m.w.headers.append((name, v))  # copy_all sends every one (a receiver reads the first)


def _in_put(m: Message, name: str, v: Any) -> None:
    raise MessageFormatError(f"wire.header {_IN_READ_ONLY}")


_SECTIONS: dict[tuple[str, str, str], Section] = {
    ("stomp", "in", "header"): Section("wire.header", lambda m: _w(m).headers.items(), _in_put,
                                       f"wire.header {_IN_READ_ONLY}"),
    ("stomp", "out", "header"): Section("wire.header", lambda m: _w(m).headers, _stomp_out_put),
    ("mqtt", "in", "user"): Section("wire.user", lambda m: _w(m).user, _in_put,
                                    f"wire.user {_IN_READ_ONLY}"),
    ("mqtt", "out", "user"): Section("wire.user", lambda m: _w(m).user, _mqtt_out_put),
}  # fmt: skip

_PARSERS: dict[tuple[str, str], Callable[[str], _Field]] = {
    ("stomp", "in"): _stomp_in_field,
    ("stomp", "out"): _stomp_out_field,
    ("mqtt", "in"): _mqtt_in_field,
    ("mqtt", "out"): _mqtt_out_field,
}


def wire_parser(protocol: str, direction: str) -> Callable[[str], _Field] | None:
    """What parses ``wire.<rest>`` for one protocol and direction (None: no wire form)."""
    return _PARSERS.get((protocol, direction))


def wire_section(protocol: str, direction: str, name: str) -> Section | None:
    """The ``copy_all`` section ``wire.<name>`` of a protocol and direction, if it has one."""
    return _SECTIONS.get((protocol, direction, name))
