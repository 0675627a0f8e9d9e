"""Messages as text: a tibrvlisten-like display, an exact JSON form, and ``FIELD=VALUE`` args.

How this works. Three forms, for people and for command-line tools; none is on the hot path.

**Display** (:func:`to_text`), in the manner of Rendezvous' ``tibrvlisten``: ``{name=value
...}`` with submessages nested in braces, e.g. ``{n=5 s="x" sub={a=1 b="y"}}``. A field with an
id shows it as ``name#3``; a nameless field shows ``=value``. With ``types=True`` every field
shows its type (``n:i64=5``), which makes the display unambiguous. Values: strings quoted with
JSON escapes (a string kept as undecoded bytes shows as ``b'...'``), bools ``true``/``false``,
floats as Python writes them, DATETIME as ``2026-01-02T03:04:05.000006Z`` (``@S.ffffff``
seconds outside years 1..9999), IPADDR32 dotted, byte types as ``<N bytes: hex>`` (at most 256
bytes shown), arrays in brackets with spaces.

**JSON** (:func:`to_json`, :func:`from_json`): exact, every type explicit, so a round trip gives
an equal message::

    {"subject": "A.B", "reply": "_INBOX.x", "encoding": "latin-1",
     "cm": {"sender": "s", "sequence": 7, "time_limit": 0.0},
     "origin": {"id": "gw1", "hops": 1}, "route": {"network": "PLANT", "hops": 1},
     "fields": [{"name": "n", "id": 3, "type": "i16", "value": 5}, ...]}

Envelope keys appear only when set; ``name`` and ``id`` only when the field has them. ``type``
is the lower-case Rendezvous name (:data:`~transports.rv.message.TYPE_NAMES`), or the number
for a code this module does not know. Values: integers and ``ipport16`` as numbers; floats as
numbers, with ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (and ``"NaN:<16 hex digits>"`` for a
NaN with other bits); ``bool`` as true/false; ``string`` as a string, or ``{"base64": ...}``
for undecoded bytes; ``datetime`` as the display form above; ``ipaddr32`` dotted; ``opaque``,
``xml``, ``encrypted`` and unknown codes as base64 strings; numeric arrays as lists of
numbers; ``stringarray`` as a list of strings (or base64 objects); ``msg`` as the nested field
list; ``msgarray`` as a list of field lists.

**Arguments** (:func:`parse_field_args`): one field per argument, ``PATH[:TYPE]=VALUE``.

- ``PATH`` is field names joined by dots; every name but the last is a submessage, found (the
  last field of that name of type ``msg``) or created, so ``sub.a=1 sub.b=2`` fills one
  submessage. ``name#ID`` gives the field an id; ``name[I]`` (not on the last name) is element
  ``I`` of a ``msgarray`` field, appended when ``I`` is its length: ``m[0].x=1 m[1].x=2``.
- ``TYPE`` is a lower-case type name (``i16``, ``f32``, ``datetime``, ``u8array`` …) or a number.
  Without it the value is a **string**: types are never guessed from the text. Byte types
  (``opaque``, ``xml``, ``encrypted``, numbers) take the value as UTF-8 text, or as hex or
  base64 with ``:opaque/hex=0a0b`` / ``:opaque/base64=CgsK``.
- ``VALUE`` by type: integers in Python syntax (``-5``, ``0x1f``); floats as Python reads them
  (``nan``, ``inf``); bools ``true``/``false``/``1``/``0``; ``datetime`` as ISO 8601 (naive is
  UTC), ``@SECONDS[.FRACTION]`` or ``now``; ``ipaddr32`` dotted; numeric arrays as a JSON list
  or comma-separated (empty = empty array); ``stringarray`` as a JSON list of strings;
  ``msg`` empty (an empty submessage) or a JSON field list; ``msgarray`` empty or a JSON list
  of field lists.

Field names containing ``.``, ``:``, ``=``, ``#`` or ``[`` cannot be written as arguments (use
the JSON form).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import struct
from collections.abc import Iterable
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from ipaddress import IPv4Address
from typing import Any

from transports.rv.message import (
    ARRAY_ELEMENTS,
    ARRAY_TYPECODES,
    BOOL,
    DATETIME,
    F32,
    F64,
    INT_RANGES,
    IPADDR32,
    MSG,
    MSGARRAY,
    STRING,
    STRINGARRAY,
    TYPE_NAMES,
    TYPES_BY_NAME,
    CmLabel,
    Field,
    FieldError,
    Message,
    Origin,
    Route,
    RvDateTime,
)

_SHOWN_BYTES = 256
_F64 = struct.Struct(">d")
_CANONICAL_NAN = _F64.pack(math.nan)

# -- display ----------------------------------------------------------------------------


def _text_float(v: float) -> str:
    return repr(v)


def _text_value(t: int, v: Any, types: bool) -> str:
    if t == MSG:
        return to_text(v, types)
    if t == STRING:
        return json.dumps(v, ensure_ascii=False) if isinstance(v, str) else repr(v)
    if t == BOOL:
        return "true" if v else "false"
    if t == F32 or t == F64:
        return _text_float(v)
    if t in INT_RANGES:
        return str(v)
    if t == DATETIME:
        return str(v.isoformat())
    if t == IPADDR32:
        return str(v)
    if t in ARRAY_TYPECODES:
        return "[" + " ".join(str(x) for x in v) + "]"
    if t == STRINGARRAY:
        return "[" + " ".join(_text_value(STRING, x, types) for x in v) + "]"
    if t == MSGARRAY:
        return "[" + " ".join(to_text(m, types) for m in v) + "]"
    more = "..." if len(v) > _SHOWN_BYTES else ""
    return f"<{len(v)} bytes: {v[:_SHOWN_BYTES].hex()}{more}>"


def _text_field(f: Field, types: bool) -> str:
    head = f.name or ""
    if f.fid:
        head += f"#{f.fid}"
    if types:
        head += ":" + TYPE_NAMES.get(f.type, str(f.type))
    return f"{head}={_text_value(f.type, f.value, types)}"


def to_text(msg: Message, types: bool = False) -> str:
    """``{name=value ...}`` as ``tibrvlisten`` shows messages (module docstring)."""
    return "{" + " ".join(_text_field(f, types) for f in msg.fields) + "}"


# -- JSON -------------------------------------------------------------------------------


def _json_float(v: float) -> float | str:
    if math.isfinite(v):
        return v
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    b = _F64.pack(v)
    return "NaN" if b == _CANONICAL_NAN else "NaN:" + b.hex()


def _json_value(t: int, v: Any) -> Any:
    if t == MSG:
        return _json_fields(v)
    if t == MSGARRAY:
        return [_json_fields(m) for m in v]
    if t == STRING:
        return v if isinstance(v, str) else {"base64": base64.b64encode(v).decode()}
    if t == STRINGARRAY:
        return [_json_value(STRING, x) for x in v]
    if t == F32 or t == F64:
        return _json_float(v)
    if t in INT_RANGES or t == BOOL:
        return v
    if t == DATETIME:
        return v.isoformat()
    if t == IPADDR32:
        return str(v)
    if t in ARRAY_TYPECODES:
        if ARRAY_ELEMENTS[t] in (F32, F64):
            return [_json_float(x) for x in v]
        return v.tolist()
    return base64.b64encode(v).decode()


def _json_fields(msg: Message) -> list[dict[str, Any]]:
    out = []
    for f in msg.fields:
        d: dict[str, Any] = {}
        if f.name is not None:
            d["name"] = f.name
        if f.fid:
            d["id"] = f.fid
        d["type"] = TYPE_NAMES.get(f.type, f.type)
        d["value"] = _json_value(f.type, f.value)
        out.append(d)
    return out


def to_jsonable(msg: Message) -> dict[str, Any]:
    """The JSON form as Python dicts and lists (module docstring)."""
    d: dict[str, Any] = {}
    if msg.send_subject is not None:
        d["subject"] = msg.send_subject
    if msg.reply_subject is not None:
        d["reply"] = msg.reply_subject
    if msg.encoding is not None:
        d["encoding"] = msg.encoding
    if msg.cm is not None:
        d["cm"] = {"sender": msg.cm.sender, "sequence": msg.cm.sequence,
                   "time_limit": msg.cm.time_limit}
    if msg.origin is not None:
        d["origin"] = {"id": msg.origin.origin_id, "hops": msg.origin.hops}
    if msg.route is not None:
        d["route"] = {"network": msg.route.network, "hops": msg.route.hops}
    d["fields"] = _json_fields(msg)
    return d


def to_json(msg: Message, **dumps_args: Any) -> str:
    """The JSON form as text; ``dumps_args`` go to ``json.dumps`` (``indent=2``)."""
    return json.dumps(to_jsonable(msg), ensure_ascii=False, allow_nan=False, **dumps_args)


def _float_from(x: Any) -> float:
    if isinstance(x, str):
        if x.startswith("NaN:"):
            try:
                return float(_F64.unpack(bytes.fromhex(x[4:]))[0])
            except (ValueError, struct.error):
                raise FieldError(f"bad NaN bits {x!r}") from None
        if x in ("NaN", "Infinity", "-Infinity"):
            return float(x)
        raise FieldError(f"not a float: {x!r}")
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise FieldError(f"not a float: {x!r}")
    return float(x)


def _b64(x: Any) -> bytes:
    if not isinstance(x, str):
        raise FieldError(f"expected base64 text, not {x!r:.40}")
    try:
        return base64.b64decode(x, validate=True)
    except binascii.Error:
        raise FieldError(f"bad base64 {x!r:.40}") from None


def _string_from(x: Any) -> str | bytes:
    if isinstance(x, str):
        return x
    if isinstance(x, dict) and set(x) == {"base64"}:
        return _b64(x["base64"])
    raise FieldError(f"expected a string, not {x!r:.40}")


def _type_from(x: Any) -> int:
    if isinstance(x, str):
        t = TYPES_BY_NAME.get(x)
        if t is None:
            raise FieldError(f"unknown type name {x!r}")
        return t
    if isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= 255:
        return x
    raise FieldError(f"a type is a name or a number 0..255, not {x!r:.40}")


def _value_from_json(t: int, x: Any) -> Any:
    if t == MSG:
        return _fields_from_json(x)
    if t == MSGARRAY:
        if not isinstance(x, list):
            raise FieldError("msgarray takes a list of field lists")
        return [_fields_from_json(m) for m in x]
    if t == STRING:
        return _string_from(x)
    if t == STRINGARRAY:
        if not isinstance(x, list):
            raise FieldError("stringarray takes a list")
        return [_string_from(s) for s in x]
    if t == F32 or t == F64:
        return _float_from(x)
    if t == DATETIME:
        if not isinstance(x, str):
            raise FieldError(f"datetime takes ISO 8601 text, not {x!r:.40}")
        return parse_datetime(x)
    if t in ARRAY_TYPECODES:
        if not isinstance(x, list):
            raise FieldError(f"{TYPE_NAMES[t]} takes a list")
        if ARRAY_ELEMENTS[t] in (F32, F64):
            return [_float_from(e) for e in x]
        return x
    if t in INT_RANGES or t == BOOL or t == IPADDR32:
        return x
    return _b64(x)


def _fields_from_json(items: Any, msg: Message | None = None) -> Message:
    if not isinstance(items, list):
        raise FieldError("a message's fields are a JSON list")
    m = Message() if msg is None else msg
    for d in items:
        if not isinstance(d, dict) or "type" not in d or "value" not in d:
            raise FieldError(f"a field is an object with type and value, not {d!r:.60}")
        extra = set(d) - {"name", "id", "type", "value"}
        if extra:
            raise FieldError(f"unknown field keys {sorted(extra)}")
        t = _type_from(d["type"])
        name = d.get("name")
        if name is not None and not isinstance(name, str):
            raise FieldError(f"a field name is a string, not {name!r:.40}")
        fid = d.get("id", 0)
        m.add(name, _value_from_json(t, d["value"]), t, fid, internal=True)
    return m


def from_json(text: str | bytes | dict[str, Any]) -> Message:
    """The message of a JSON form (module docstring).

    Raises:
        FieldError: the text is not JSON, or not a message form, or a value does not fit.
    """
    if isinstance(text, dict):
        d = text
    else:
        try:
            d = json.loads(text)
        except ValueError as e:
            raise FieldError(f"not JSON: {e}") from None
    if not isinstance(d, dict):
        raise FieldError("a message's JSON form is an object")
    extra = set(d) - {"subject", "reply", "encoding", "cm", "origin", "route", "fields"}
    if extra:
        raise FieldError(f"unknown message keys {sorted(extra)}")
    m = Message()
    for key, attr in (("subject", "send_subject"), ("reply", "reply_subject"),
                      ("encoding", "encoding")):
        v = d.get(key)
        if v is not None:
            if not isinstance(v, str):
                raise FieldError(f"{key} is a string, not {v!r:.40}")
            setattr(m, attr, v)
    cm = d.get("cm")
    if cm is not None:
        try:
            m.cm = CmLabel(str(cm["sender"]), int(cm["sequence"]),
                           float(cm.get("time_limit", 0.0)))
        except (KeyError, TypeError, ValueError):
            raise FieldError(f"cm is {{sender, sequence, time_limit}}, not {cm!r:.60}") from None
    origin = d.get("origin")
    if origin is not None:
        try:
            m.origin = Origin(str(origin["id"]), int(origin.get("hops", 0)))
        except (KeyError, TypeError, ValueError):
            raise FieldError(f"origin is {{id, hops}}, not {origin!r:.60}") from None
    route = d.get("route")
    if route is not None:
        try:
            m.route = Route(str(route["network"]), int(route.get("hops", 0)))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise FieldError(f"route is {{network, hops}}, not {route!r:.60}") from None
    return _fields_from_json(d.get("fields", []), m)


# -- FIELD=VALUE arguments -----------------------------------------------------------------

_NOT_BYTES = frozenset(INT_RANGES.keys() | ARRAY_TYPECODES.keys() | {
    STRING, BOOL, MSG, MSGARRAY, STRINGARRAY, DATETIME, IPADDR32, F32, F64})
_ELEMENT = re.compile(r"([^.:=#\[\]]+)(?:#(\d+))?(?:\[(\d+)\])?\Z")


def parse_datetime(text: str) -> RvDateTime:
    """A DATETIME from ISO 8601 (naive is UTC), ``@SECONDS[.FRACTION]`` or ``now``.

    Raises:
        FieldError: not one of those forms.
    """
    if text == "now":
        return RvDateTime.from_datetime(datetime.now(UTC))
    if text.startswith("@"):
        try:
            us = Decimal(text[1:]) * 1_000_000
        except InvalidOperation:
            raise FieldError(f"bad datetime seconds {text!r}") from None
        if us != us.to_integral_value() or not us.is_finite():
            raise FieldError(f"datetime {text!r}: at most 6 decimals")
        s, u = divmod(int(us), 1_000_000)
        return RvDateTime(s, u)
    try:
        return RvDateTime.from_datetime(datetime.fromisoformat(text))
    except ValueError:
        raise FieldError(f"bad datetime {text!r} (ISO 8601, @SECONDS or now)") from None


def _arg_bytes(text: str, form: str) -> bytes:
    if form == "hex":
        try:
            return bytes.fromhex(text)
        except ValueError:
            raise FieldError(f"bad hex {text!r:.40}") from None
    if form == "base64":
        return _b64(text)
    return text.encode()


def _arg_number(elem: int, text: str) -> int | float:
    try:
        if elem in INT_RANGES:
            return int(text, 0)
        return float(text)
    except ValueError:
        raise FieldError(f"not a {TYPE_NAMES[elem]}: {text!r:.40}") from None


def _arg_value(t: int, text: str, form: str) -> Any:
    if form and t in _NOT_BYTES:
        raise FieldError(f"/{form} applies to byte types only")
    if t == STRING:
        return text
    if t in INT_RANGES or t == F32 or t == F64:
        return _arg_number(t, text)
    if t == BOOL:
        low = text.lower()
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
        raise FieldError(f"not a bool: {text!r:.40}")
    if t == DATETIME:
        return parse_datetime(text)
    if t == IPADDR32:
        try:
            return IPv4Address(text)
        except ValueError as e:
            raise FieldError(f"ipaddr32: {e}") from None
    if t in ARRAY_TYPECODES or t == STRINGARRAY:
        elem = ARRAY_ELEMENTS.get(t, STRING)
        if text.startswith("["):
            try:
                items = json.loads(text)
            except ValueError as e:
                raise FieldError(f"bad JSON list {text!r:.40}: {e}") from None
            if not isinstance(items, list):
                raise FieldError(f"not a list: {text!r:.40}")
            if elem in (F32, F64):
                return [_float_from(x) for x in items]
            return items
        if t == STRINGARRAY:
            raise FieldError("stringarray takes a JSON list of strings")
        return [_arg_number(elem, x.strip()) for x in text.split(",")] if text else []
    if t == MSG or t == MSGARRAY:
        if text in ("", "{}", "[]"):
            return Message() if t == MSG else []
        try:
            items = json.loads(text)
        except ValueError as e:
            raise FieldError(f"bad JSON {text!r:.40}: {e}") from None
        return _value_from_json(t, items)
    return _arg_bytes(text, form)


def _step(msg: Message, name: str, fid: int, idx: int | None, arg: str) -> Message:
    """The submessage ``name`` (or element ``idx`` of msgarray ``name``) of ``msg``."""
    want = MSG if idx is None else MSGARRAY
    found: Field | None = None
    for f in msg.fields:
        if f.name == name and f.type == want and (not fid or f.fid == fid):
            found = f
    if found is None:
        msg.add(name, Message() if idx is None else [], want, fid, internal=True)
        found = msg.fields[-1]
    if idx is None:
        sub: Message = found.value
        return sub
    items: list[Message] = found.value
    if idx == len(items):
        items.append(Message())
    elif idx > len(items):
        raise FieldError(f"{arg!r}: {name}[{idx}] skips elements (it has {len(items)})")
    return items[idx]


def parse_field_args(args: Iterable[str], msg: Message | None = None) -> Message:
    """A message from ``PATH[:TYPE]=VALUE`` arguments (module docstring); adds to ``msg``
    when given. Names starting with ``_`` are refused as in :meth:`Message.add`.

    Raises:
        FieldError: an argument does not follow the syntax or its value does not fit.
    """
    m = Message() if msg is None else msg
    for arg in args:
        left, eq, text = arg.partition("=")
        if not eq:
            raise FieldError(f"{arg!r}: expected PATH[:TYPE]=VALUE")
        path, _, tspec = left.partition(":")
        tname, _, form = tspec.partition("/")
        if form not in ("", "hex", "base64"):
            raise FieldError(f"{arg!r}: byte form is hex or base64, not {form!r}")
        if not tname:
            t = STRING
        elif tname.isdigit():
            t = _type_from(int(tname))
        else:
            t = _type_from(tname)
        elements = path.split(".")
        cur = m
        for i, e in enumerate(elements):
            match = _ELEMENT.match(e)
            if match is None:
                raise FieldError(f"{arg!r}: bad field name {e!r}")
            name, fid_s, idx_s = match.groups()
            if name[0] == "_":
                raise FieldError(f"{arg!r}: names starting with '_' are reserved")
            fid = int(fid_s) if fid_s else 0
            if i == len(elements) - 1:
                if idx_s is not None:
                    raise FieldError(f"{arg!r}: [index] goes on a submessage name only")
                try:
                    cur.add(name, _arg_value(t, text, form), t, fid)
                except FieldError as err:
                    raise FieldError(f"{arg!r}: {err}") from None
            else:
                cur = _step(cur, name, fid, None if idx_s is None else int(idx_s), arg)
    return m
