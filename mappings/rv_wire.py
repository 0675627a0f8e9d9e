"""The RV-style bus's wire form for the mapping engine (``wire.…`` of ``protocol: rv``).

How this works. On the way in, the wire form (:class:`RvIn`) is the RV message received
(read-only), the arrival time and the transport's import delivery mode; on the way out
(:class:`RvOut`) it is the RV message being built, with the transport's ``export_headers`` /
``export_properties``. A field is read and written as a core value, by EMS's datatype table
(:func:`mappings.rv.core_value`, :func:`mappings.rv.rv_value`); a converter may write a
submessage it built (typed already). :mod:`mappings.wire` puts these parsers and sections
beside the other protocols'; the field paths are in ``mappings/README.md`` ("Wire fields").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.errors import MessageFormatError
from gateway.message import Message, infer_body_kind
from mappings import rv as _rv
from mappings.fields import _MISSING, Body, Section, _Field

__all__ = ["RV_SECTIONS", "RvIn", "RvOut", "rv_in_field", "rv_out_field"]

_IN_READ_ONLY = "is read-only: the wire form of an incoming message is what was received"


def _w(m: Any) -> Any:
    return m.w


def _none_missing(v: Any) -> Any:
    return _MISSING if v is None else v


def _read_only(text: str, read: Callable[[Any], Any], why: str, path: tuple[str, ...]) -> _Field:
    def ro(m: Message, v: Any = None) -> None:
        raise MessageFormatError(f"{text} {why}")

    return _Field(text, "wire", path, read, ro, ro, lambda m: read(m) is _MISSING,
                  f"{text} {why}")  # fmt: skip


def _in_put(m: Message, name: str, v: Any) -> None:
    raise MessageFormatError(f"wire.field {_IN_READ_ONLY}")


class RvIn:
    """An RV message as the mapping reads it, with the arrival time and the transport's import
    delivery mode (``topic_import_dm`` / ``queue_import_dm``)."""

    __slots__ = ("import_dm", "now", "rv")

    def __init__(self, rv: Any, import_dm: Any, now: int) -> None:
        self.rv, self.import_dm, self.now = rv, import_dm, now


class RvOut:
    """The RV message being built (its subjects set by the bridge), and the transport's
    ``export_headers`` / ``export_properties``."""

    __slots__ = ("export_headers", "export_properties", "rv")

    def __init__(self, rv: Any, export_headers: bool, export_properties: bool) -> None:
        self.rv, self.export_headers, self.export_properties = (
            rv, export_headers, export_properties)  # fmt: skip


def _rv_read(m: Any, name: str) -> Any:
    """The core value of the first field ``name`` of the wire form's message (absent when
    there is none, or EMS does not import its type)."""
    f = m.w.rv.get_field(name)
    if f is None:
        return _MISSING
    v = _rv.core_value(f.type, f.value)
    return _MISSING if v is None else v


def _rv_date(m: Any, name: str) -> Any:
    """The first field ``name`` as an ISO 8601 UTC text, when it is a ``DATETIME`` (the
    date form of what ``wire.field.<name>`` gives as ms)."""
    f = m.w.rv.get_field(name)
    if f is None or f.type != _rv.DATETIME:
        return _MISSING
    return f.value.isoformat()


def _rv_fields(m: Any) -> list[tuple[str, Any]]:
    """Every named field of the wire form's message as (name, core value), in order."""
    out = []
    for f in m.w.rv.fields:
        if f.name is not None:
            v = _rv.core_value(f.type, f.value)
            if v is not None:
                out.append((f.name, v))
    return out


def _rv_typed(v: Any) -> tuple[int, Any] | None:
    if type(v) is _rv.RvMessage:
        return _rv.MSG, v  # a converter's submessage, typed already
    return _rv.rv_value(v)


def _rv_put(m: Any, name: str, v: Any) -> None:
    """Add a field to the message being built (a core value in its RV type)."""
    tv = _rv_typed(v)
    if tv is not None:
        _rv.add(m.w.rv, name, tv[1], tv[0])


def _field_name(rest: str, prefix: str) -> str:
    """The field name after ``prefix`` in ``wire.<rest>``; ValueError when there is none."""
    name = rest[len(prefix):]
    if not name:
        raise ValueError("empty field name")
    return name


def rv_in_field(rest: str) -> _Field:
    """Parse ``wire.<rest>`` of an RV message received."""
    text = "wire." + rest
    if rest.startswith("field."):
        name = _field_name(rest, "field.")
        return _read_only(text, lambda m: _rv_read(m, name), _IN_READ_ONLY, ("field", name))
    if rest.startswith("datetime."):
        name = _field_name(rest, "datetime.")
        return _read_only(text, lambda m: _rv_date(m, name), _IN_READ_ONLY, ("datetime", name))
    simple: dict[str, Callable[[Any], Any]] = {
        "message": lambda m: m.w.rv,
        "send_subject": lambda m: _none_missing(m.w.rv.send_subject),
        "reply_subject": lambda m: _none_missing(m.w.rv.reply_subject),
        "now": lambda m: m.w.now,
        "import_dm": lambda m: m.w.import_dm,
        "cm_sender": lambda m: _MISSING if m.w.rv.cm is None else m.w.rv.cm.sender,
        "cm_sequence": lambda m: _MISSING if m.w.rv.cm is None else _rv.cm_sequence(m.w.rv.cm),
        "cm_time_limit": lambda m: _MISSING if m.w.rv.cm is None else m.w.rv.cm.time_limit,
    }
    if rest in simple:
        return _read_only(text, simple[rest], _IN_READ_ONLY, (rest,))
    raise ValueError("an RV message received has wire.field.<name>, wire.datetime.<name>, "
                     "wire.message, "
                     "wire.send_subject, wire.reply_subject, wire.now, wire.import_dm, "
                     "wire.cm_sender, wire.cm_sequence and wire.cm_time_limit")


def rv_out_field(rest: str) -> _Field:
    """Parse ``wire.<rest>`` of an RV message being sent."""
    text = "wire." + rest
    if rest.startswith("field."):
        name = _field_name(rest, "field.")

        def write(m: Any, v: Any) -> None:
            rv = m.w.rv
            if rv.get_field(name) is None:
                _rv_put(m, name, v)
                return
            tv = _rv_typed(v)
            fields = rv.fields
            i = next(i for i, f in enumerate(fields) if f.name == name)
            if tv is None:
                del fields[i]
                return
            # the first field of the name takes the new type and value, in its place
            new = _rv.RvMessage()
            _rv.add(new, name, tv[1], tv[0])
            new.fields[0].fid = fields[i].fid
            fields[i] = new.fields[0]

        def delete(m: Any) -> None:
            m.w.rv.remove_all(name)

        return _Field(text, "wire", ("field", name), lambda m: _rv_read(m, name), write,
                      delete, lambda m: _w(m).rv.get_field(name) is None)  # fmt: skip
    if rest.startswith("datetime."):
        dname = _field_name(rest, "datetime.")

        def write_date(m: Any, v: Any) -> None:
            rv = m.w.rv
            rv.remove_all(dname)
            _rv.add(rv, dname, _rv.datetime_out(v), _rv.DATETIME)

        return _Field(text, "wire", ("datetime", dname), lambda m: _rv_date(m, dname),
                      write_date, lambda m: _w(m).rv.remove_all(dname),
                      lambda m: _w(m).rv.get_field(dname) is None)  # fmt: skip
    if rest == "body":
        def write_body(m: Any, v: Any) -> None:
            kind, value = (v.kind, v.value) if type(v) is Body else (infer_body_kind(v), v)
            _rv.body_out(kind, value, m.w.rv)

        def clear(m: Any) -> None:
            rv = m.w.rv
            rv.fields[:] = [f for f in rv.fields
                            if f.name in (_rv.HEADERS_FIELD, _rv.PROPERTIES_FIELD)]

        return _Field(text, "wire", (rest,), lambda m: _rv.body_in(_w(m).rv)[1], write_body,
                      clear, lambda m: False)  # fmt: skip
    fixed: dict[str, tuple[Callable[[Any], Any], str]] = {
        "message": (lambda m: m.w.rv, "the RV message being built (converters add to it)"),
        "send_subject": (lambda m: m.w.rv.send_subject, "the bridge's subject"),
        "reply_subject": (lambda m: _none_missing(m.w.rv.reply_subject),
                          "the bridge's rendering of JMSReplyTo"),
        "export_headers": (lambda m: m.w.export_headers, "the transport's export_headers"),
        "export_properties": (lambda m: m.w.export_properties,
                              "the transport's export_properties"),
    }  # fmt: skip
    if rest in fixed:
        read_fixed, why = fixed[rest]
        return _read_only(text, read_fixed, f"is read-only ({why})", (rest,))
    raise ValueError("an RV message sent has wire.field.<name>, wire.datetime.<name>, "
                     "wire.body, wire.message, "
                     "wire.send_subject, wire.reply_subject, wire.export_headers and "
                     "wire.export_properties")


RV_SECTIONS = {
    "in": Section("wire.field", _rv_fields, _in_put, f"wire.field {_IN_READ_ONLY}"),
    "out": Section("wire.field", _rv_fields, _rv_put),
}
