"""Typed values as text, as the MQTT 5 user properties and the STOMP headers carry them.

How this works. Neither an MQTT 5 user property nor a STOMP header has a type: both are
strings. :func:`render_properties` writes each JMS property as (name, text) and lists, in a
``gw-types`` value, the type of every one that is not a plain string (``count:int32``), so
:func:`apply_types` can give each its type back on the way in. The tables that drive them are
``_RENDER`` (value type → type name and text) and ``_PARSERS`` (type name → parser, from
:data:`gateway.types.SCALAR_TYPES`). A name or value an MQTT string may not hold (U+0000, a
lone surrogate [MQTT-1.5.4-1, MQTT-1.5.4-2]) is sent escaped (:func:`wire_escape`) and marked
``:esc``. Map and stream bodies, and compound property values, travel as the documented
JSON form (:func:`json_payload`). Every form is described in ``mappings/README.md``, "User
properties" and "Body rules". :mod:`mappings.mqtt`, :mod:`mappings.stomp` and the AMQP
mappings share these functions, so a value crosses every text protocol the same way.
"""

from __future__ import annotations

import base64
import json
import math
import re
import struct
from collections.abc import Callable
from typing import Any

from gateway.types import SCALAR_TYPES, Char, Float32, Int64, TypedArray

JSON_CONTENT_TYPE = "application/json"

_F32 = struct.Struct("<f")
_SHORTEST_SPECS = tuple(f".{d}g" for d in range(1, 10))  # 9 digits always read back a float32


def _float32_text(value: float) -> str:
    """The shortest text that reads back as the same float32 (as ``gateway.types`` writes it)."""
    f = float(value)
    if not math.isfinite(f):
        return repr(f)  # 'nan', 'inf', '-inf'
    packed = _F32.pack(f)
    for spec in _SHORTEST_SPECS:
        text = format(f, spec)
        try:
            if _F32.pack(float(text)) == packed:
                break
        except OverflowError:  # rounded up past the float32 maximum
            continue
    return text if ("." in text or "e" in text) else text + ".0"


float32_text = _float32_text  # public: mappings.xstream writes Java's Float.toString with it


def _bool_text(value: Any) -> str:
    return "true" if value else "false"


def _null_text(value: Any) -> str:
    return ""


# Property value type → (gw-types name, text). Plain ``int`` is ``long`` so it comes back a
# plain ``int`` (``int64`` comes back an ``Int64``); plain ``str`` is never listed.
_RENDER: dict[type, tuple[str, Callable[[Any], str]]] = {
    bool: ("boolean", _bool_text),
    int: ("long", int.__repr__),
    float: ("float64", float.__repr__),
    Float32: ("float32", _float32_text),
    Char: ("char", str.__str__),
    type(None): ("null", _null_text),
}
for _name, _t in SCALAR_TYPES.items():
    if issubclass(_t, int) and _t not in (int, bool):
        _RENDER[_t] = (_name, int.__repr__)


def _parse_int(t: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        return t(int(text, 10))

    return parse


def _parse_long(text: str) -> int:
    v = int(text, 10)
    if not Int64.MIN <= v <= Int64.MAX:
        raise OverflowError(text)
    return v


def _parse_bool(text: str) -> bool:
    if text == "true":
        return True
    if text == "false":
        return False
    raise ValueError(text)


def _parse_null(text: str) -> None:
    if text:
        raise ValueError(text)
    return None


def _parse_float32(text: str) -> Float32:
    return Float32(float(text))


# gw-types name → parser (raises ValueError or OverflowError when the text does not parse).
_PARSERS: dict[str, Callable[[str], Any]] = {"long": _parse_long, "null": _parse_null}
for _name, _t in SCALAR_TYPES.items():
    if _t is bool:
        _PARSERS[_name] = _parse_bool
    elif issubclass(_t, int):
        _PARSERS[_name] = _parse_int(_t)
    elif _t is Float32:
        _PARSERS[_name] = _parse_float32
    elif _t is float:
        _PARSERS[_name] = float
    elif _t is Char:
        _PARSERS[_name] = Char
    elif _t is str:
        _PARSERS[_name] = str
del _name, _t
# Values JMS does not allow as properties but other protocols bring (AMQP binary and
# decimal application properties; compound values some AMQP clients send against §3.2.5):
# bytes as base64, maps, lists and typed arrays as the JSON of map and stream bodies.
_PARSERS["bytes"] = lambda text: base64.b64decode(text.encode("ascii"), validate=True)
_PARSERS["json"] = json.loads

# -- text and escaping -------------------------------------------------------------------------

_TEXT_TYPE_CACHE: dict[str, bool] = {}
_TEXT_TYPE_CACHE_MAX = 256  # distinct content types seen in practice are few


def is_text_content_type(content_type: str) -> bool:
    """True for ``text/*``, ``application/json`` or a ``charset=utf-8`` parameter (any case)."""
    known = _TEXT_TYPE_CACHE.get(content_type)
    if known is not None:
        return known
    ct = content_type.lower().replace(" ", "").replace("\t", "")
    mime, _, params = ct.partition(";")
    result = (
        mime.startswith("text/")
        or mime == JSON_CONTENT_TYPE
        or any(p.replace('"', "") == "charset=utf-8" for p in params.split(";"))
    )
    if len(_TEXT_TYPE_CACHE) < _TEXT_TYPE_CACHE_MAX:
        _TEXT_TYPE_CACHE[content_type] = result
    return result


# A UTF-8 Encoded String may hold neither U+0000 nor a surrogate [MQTT-1.5.4-1, MQTT-1.5.4-2];
# a JMS string (a Java string) may hold both. Such a name or value is sent escaped: '%' as
# '%25', U+0000 as '%00', a lone surrogate as '%uD8xx', and gw-types marks it ':esc'.
_SURROGATE = re.compile(r"[\ud800-\udfff]")  # the escapes read by re: mypyc takes no surrogate literal
_WIRE_ESCAPE = re.compile(r"%(?:25|00|u([0-9A-F]{4}))")


def wire_safe(text: str) -> bool:
    if "\x00" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _surrogate_sub(m: re.Match[str]) -> str:
    return "%u" + format(ord(m.group()), "04X")


def wire_escape(text: str) -> str:
    """Escape a string so it is a legal MQTT UTF-8 Encoded String (undo with wire_unescape)."""
    text = text.replace("%", "%25").replace("\x00", "%00")
    return _SURROGATE.sub(_surrogate_sub, text)


def _unescape_sub(m: re.Match[str]) -> str:
    code = m.group(1)
    if code is not None:
        return chr(int(code, 16))
    return "%" if m.group() == "%25" else "\x00"


def wire_unescape(text: str) -> str:
    return _WIRE_ESCAPE.sub(_unescape_sub, text) if "%" in text else text


def types_escape(name: str) -> str:
    """Escape a property name for a gw-types entry: '%' → '%25', ',' → '%2C', ':' → '%3A'."""
    if "%" in name or "," in name or ":" in name:
        return name.replace("%", "%25").replace(",", "%2C").replace(":", "%3A")
    return name


def types_unescape(name: str) -> str:
    # Every '%' in an escaped name starts one of the three escapes, so replacing them one
    # kind at a time, '%25' last, cannot misread one.
    if "%" in name:
        return name.replace("%2C", ",").replace("%3A", ":").replace("%25", "%")
    return name


# A parsed gw-types list: (name as sent, parser or None, unescaped name or None) per entry.
_TypesEntry = tuple[str, Callable[[str], Any] | None, str | None]
_TYPES_CACHE: dict[str, tuple[_TypesEntry, ...]] = {}
_TYPES_CACHE_MAX = 1024  # a publisher sends the same list again and again
_TYPES_CACHE_MAX_LEN = 1024  # longer lists are parsed each time, not kept


def _parse_types(types: str) -> tuple[_TypesEntry, ...]:
    """Parse a gw-types list: ``name:type`` or ``name:type:esc`` entries, comma-separated.

    ``name`` is escaped with :func:`types_escape`. Malformed entries are ignored; of two
    entries for one name, the first counts.
    """
    entries: list[_TypesEntry] = []
    seen: set[str] = set()
    for entry in types.split(","):
        parts = entry.split(":")
        if len(parts) < 2:
            continue
        wire_name = types_unescape(parts[0])
        if wire_name in seen:
            continue
        seen.add(wire_name)
        escaped = len(parts) > 2 and parts[2] == "esc"
        entries.append(
            (wire_name, _PARSERS.get(parts[1]), wire_unescape(wire_name) if escaped else None)
        )
    return tuple(entries)


def apply_types(props: dict[str, Any], types: str) -> dict[str, Any]:
    """Convert the string values gw-types lists to their types and undo wire escapes.

    A value that does not parse as its type stays a string; an entry for a name that is not
    present, or with an unknown type, is ignored. Property order is kept.
    """
    entries = _TYPES_CACHE.get(types)
    if entries is None:
        entries = _parse_types(types)
        if len(_TYPES_CACHE) < _TYPES_CACHE_MAX and len(types) <= _TYPES_CACHE_MAX_LEN:
            _TYPES_CACHE[types] = entries
    renamed = False
    for wire_name, parse, name in entries:
        value = props.get(wire_name)
        if value is None:  # every value is a string here, so None means absent
            continue
        if name is not None:
            value = wire_unescape(value)
            if name != wire_name:
                renamed = True
        if parse is not None:
            try:
                value = parse(value)
            except (ValueError, OverflowError):
                pass
        props[wire_name] = value
    if renamed:
        renames = {w: n for w, _, n in entries if n is not None}
        props = {renames.get(k, k): v for k, v in props.items()}
    return props


def render_properties(pairs: list[tuple[str, str]], types: list[str] | None,
                      props: dict[str, Any], skip: frozenset[str]) -> list[str] | None:
    """Append JMS properties to ``pairs`` as (name, text), in order, skipping the names in
    ``skip``; return ``types`` with the gw-types entries of the typed or escaped ones.

    The text forms and escapes of "User properties" in mappings/README.md: MQTT 5 user
    properties and STOMP headers are both written with it.
    """
    append = pairs.append
    for name, value in props.items():
        if name in skip:
            continue
        t = type(value)
        if t is str:
            if name.isascii() and value.isascii() and "\x00" not in name and "\x00" not in value:
                append((name, value))  # the common case: an ASCII string property
                continue
            text = value
            tname = "string"
        else:
            render = _RENDER.get(t)
            if render is None:
                render = _render_other(value)
            tname, to_text = render
            text = to_text(value)
        if wire_safe(name) and wire_safe(text):
            append((name, text))
            if t is str:
                continue
            if "%" in name or "," in name or ":" in name:
                entry = types_escape(name) + ":" + tname
            else:
                entry = name + ":" + tname
        else:
            wire_name = wire_escape(name)
            append((wire_name, wire_escape(text)))
            entry = types_escape(wire_name) + ":" + tname + ":esc"
        if types is None:
            types = [entry]
        else:
            types.append(entry)
    return types


def _bytes_text(value: Any) -> str:
    return base64.b64encode(bytes(value)).decode("ascii")


def _json_text(value: Any) -> str:
    return json_payload(value).decode("utf-8")


def _render_other(value: Any) -> tuple[str, Callable[[Any], str]]:
    """How a property value of no JMS property type travels (bytes, map, list, array)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes", _bytes_text
    if isinstance(value, (dict, list, tuple)):
        return "json", _json_text
    return "string", str


# -- the documented JSON form of map and stream bodies ----------------------------------------

_json_str = json.JSONEncoder(ensure_ascii=False).encode
_json_str_ascii = json.JSONEncoder(ensure_ascii=True).encode


def json_payload(body: Any) -> bytes:
    """A map or stream body as UTF-8 JSON in the documented form (README, "Body rules")."""
    out: list[str] = []
    _json_value(body, out, _json_str)
    text = "".join(out)
    try:
        return text.encode()
    except UnicodeEncodeError:
        # A string holds a lone surrogate: write every string with \\u escapes instead.
        out.clear()
        _json_value(body, out, _json_str_ascii)
        return "".join(out).encode()


def _json_float(value: float, text: Callable[[Any], str]) -> str:
    if value != value:
        return '"NaN"'
    if value == math.inf:
        return '"Infinity"'
    if value == -math.inf:
        return '"-Infinity"'
    return text(value)


def _json_value(v: Any, out: list[str], enc: Callable[[str], str]) -> None:
    t = type(v)
    if t is str or t is Char:
        out.append(enc(v))
    elif v is None:
        out.append("null")
    elif t is bool:
        out.append("true" if v else "false")
    elif t is dict:
        out.append("{")
        first = True
        for k, x in v.items():
            if first:
                first = False
            else:
                out.append(",")
            out.append(enc(k))
            out.append(":")
            _json_value(x, out, enc)
        out.append("}")
    elif t is list or isinstance(v, TypedArray):
        out.append("[")
        first = True
        for x in v:
            if first:
                first = False
            else:
                out.append(",")
            _json_value(x, out, enc)
        out.append("]")
    elif t is float:
        out.append(_json_float(v, float.__repr__))
    elif t is Float32:
        out.append(_json_float(v, _float32_text))
    elif t is bytes:
        out.append('"' + base64.b64encode(v).decode("ascii") + '"')
    elif isinstance(v, int):
        out.append(int.__repr__(v))
    else:
        raise TypeError(f"cannot write {t.__name__} in a JSON body")
