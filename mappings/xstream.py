"""ActiveMQ's XML and JSON forms of map and stream bodies (its STOMP ``transformation``).

How this works. ActiveMQ's STOMP connector turns a MapMessage into text with XStream: the
message's ``java.util.Map`` is written as XStream writes any map (``jms-map-xml``)::

    <map>
      <entry>
        <string>name</string>
        <string>Dejan</string>
      </entry>
      <entry>
        <string>city</string>
        <int>5</int>
      </entry>
    </map>

and ``jms-map-json`` is the same element tree through Jettison's "mapped" convention: an
element with children is an object, children of one name are grouped under that name (an
array when there are several, in the order of their first appearance), an element with only
text is a JSON primitive (Jettison's DefaultConverter makes text that reads back unchanged as
a Java ``long``, ``double`` or ``boolean`` a JSON number or boolean, so the string ``"123"``
is written ``123``), and an element with neither is ``""``::

    {"map":{"entry":[{"string":["name","Dejan"]},{"string":"city","int":5}]}}

Each value's element is its Java type (XStream's aliases): ``string``, ``int``, ``long``,
``short``, ``byte``, ``float``, ``double``, ``boolean``, ``char``, ``byte-array`` (base64),
``null``, ``map``, ``list``, ``int-array`` … for Java arrays, ``big-int``. So the types of a
map's values travel, and nested maps and lists stay nested. Both directions go through one
small element tree, ``(name, text, children)``: :func:`to_xml` / :func:`to_json` write a
core map or stream body, :func:`from_xml` / :func:`from_json` read one. A stream body (the
core's, which ActiveMQ has no transformation for) is written as XStream writes a
``java.util.List``: ``<list>…</list>``.

Two limits come from the formats themselves, not from this module: Jettison's objects have
no order between children of different names, so a list whose values have different types
comes out of ``jms-map-json`` grouped by type (``<list>`` in ``jms-map-xml`` keeps the
order); and the gateway's unsigned values have no Java type, so they are written as the next
wider signed one (``uint8`` as ``short``, ``uint16`` as ``int``, ``uint32`` as ``long``,
``uint64`` as ``long`` or, past a long's range, ``big-int``).

The numbers are written as Java writes them (``Double.toString``: ``1.5``, ``1.0E10``), with
the shortest digits that read back the same value.
"""

from __future__ import annotations

import base64
import binascii
import decimal
import json
import math
import re
import xml.parsers.expat
from typing import Any

from gateway.errors import MessageFormatError
from gateway.types import (
    MAX_NESTING,
    BoolArray,
    Char,
    Float32,
    Float32Array,
    Float64Array,
    Int8,
    Int8Array,
    Int16,
    Int16Array,
    Int32,
    Int32Array,
    Int64,
    Int64Array,
    TypedArray,
    UInt8,
    UInt8Array,
    UInt16,
    UInt16Array,
    UInt32,
    UInt32Array,
    UInt64,
    UInt64Array,
)
from mappings.typedtext import float32_text

__all__ = ["from_json", "from_xml", "to_json", "to_xml"]

# One element of XStream's tree: its name, its text (None: no text) and its children.
Element = tuple[str, "str | None", "list[Element]"]

_MAP_NAMES = frozenset(("map", "hash-map", "linked-hash-map", "tree-map", "hashtable"))
_LIST_NAMES = frozenset(("list", "linked-list", "vector", "array-list"))

# Java array element names (XStream's ArrayConverter: "<int-array><int>1</int></int-array>")
# and the typed arrays they read into; byte[] is "byte-array" with base64 text instead.
_ARRAY_READ: dict[str, type[TypedArray]] = {
    "int-array": Int32Array, "long-array": Int64Array, "short-array": Int16Array,
    "float-array": Float32Array, "double-array": Float64Array, "boolean-array": BoolArray,
}  # fmt: skip
_ARRAY_WRITE: dict[type, tuple[str, str]] = {
    Int8Array: ("byte-array", "byte"), Int16Array: ("short-array", "short"),
    Int32Array: ("int-array", "int"), Int64Array: ("long-array", "long"),
    UInt8Array: ("short-array", "short"), UInt16Array: ("int-array", "int"),
    UInt32Array: ("long-array", "long"), UInt64Array: ("long-array", "long"),
    Float32Array: ("float-array", "float"), Float64Array: ("double-array", "double"),
    BoolArray: ("boolean-array", "boolean"),
}  # fmt: skip


# -- core value -> element tree ----------------------------------------------------------------


def _java_double_text(value: float, digits_of: Any = float.__repr__) -> str:
    """``Double.toString`` (``Float.toString`` with ``float32_text``): plain notation from
    10^-3 up to 10^7, else ``d.dddE±n``, always a digit after the point."""
    if value != value:
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    sign, digits, exp = decimal.Decimal(digits_of(value)).normalize().as_tuple()
    text = "".join(map(str, digits))
    point = len(text) + int(exp)  # the decimal point sits after this many digits
    if 1e-3 <= abs(value) < 1e7:
        if point <= 0:
            out = "0." + "0" * -point + text
        elif point >= len(text):
            out = text + "0" * (point - len(text)) + ".0"
        else:
            out = text[:point] + "." + text[point:]
    else:
        out = text[0] + "." + (text[1:] or "0") + "E" + str(point - 1)
    return ("-" if sign else "") + out


def _element(name: str, value: Any, depth: int) -> Element:
    """The XStream element of one map or list value (``name`` is unused for the value's own
    element name: it is the value's Java type)."""
    if depth > MAX_NESTING:
        raise MessageFormatError(f"values nest deeper than {MAX_NESTING} levels")
    t = type(value)
    if t is str:
        return ("string", value, [])
    if t is bool:
        return ("boolean", "true" if value else "false", [])
    if t is int or t is Int64 or t is UInt32:
        return ("long", int.__repr__(value), [])
    if t is Int32 or t is UInt16:
        return ("int", int.__repr__(value), [])
    if t is Int16 or t is UInt8:
        return ("short", int.__repr__(value), [])
    if t is Int8:
        return ("byte", int.__repr__(value), [])
    if t is UInt64:
        return ("long" if value <= Int64.MAX else "big-int", int.__repr__(value), [])
    if t is float:
        return ("double", _java_double_text(value), [])
    if t is Float32:
        return ("float", _java_double_text(value, float32_text), [])
    if t is Char:
        return ("char", str(value), [])
    if value is None:
        return ("null", None, [])
    if t is bytes:
        return ("byte-array", base64.b64encode(value).decode("ascii"), [])
    if t is dict:
        return _map_element(value, depth)
    if t is list:
        return ("list", None, [_element(name, v, depth + 1) for v in value])
    if isinstance(value, TypedArray):
        if type(value) is Int8Array:  # byte[]: base64, as XStream writes it
            return ("byte-array", base64.b64encode(bytes(v & 0xFF for v in value)).decode(), [])
        array, item = _ARRAY_WRITE[type(value)]
        return (array, None, [(item, _scalar_text(item, v), []) for v in value])
    raise MessageFormatError(f"a {t.__name__} value has no ActiveMQ form")


def _scalar_text(item: str, v: Any) -> str:
    if item == "boolean":
        return "true" if v else "false"
    if item == "double":
        return _java_double_text(v)
    if item == "float":
        return _java_double_text(v, float32_text)
    return int.__repr__(v)


def _map_element(value: dict[str, Any], depth: int) -> Element:
    return ("map", None, [("entry", None, [("string", k, []), _element(k, v, depth + 1)])
                          for k, v in value.items()])


def _root(body: Any) -> Element:
    if type(body) is dict:
        return _map_element(body, 0)
    if type(body) is list:
        return ("list", None, [_element("", v, 1) for v in body])
    raise MessageFormatError("only map and stream bodies have an ActiveMQ form")


# -- element tree -> XML (XStream's PrettyPrintWriter) ------------------------------------------

_XML_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&apos;",
                "\r": "&#xd;"}
_XML_SPECIAL = re.compile("[&<>\"'\r\x00-\x08\x0b\x0c\x0e-\x1f]")


def _xml_escape_char(m: re.Match[str]) -> str:
    c = m.group()
    return _XML_ESCAPES.get(c) or f"&#x{ord(c):x};"


def _write_xml(el: Element, indent: str, out: list[str]) -> None:
    name, text, children = el
    if children:
        out.append(f"{indent}<{name}>")
        for child in children:
            out.append("\n")
            _write_xml(child, indent + "  ", out)
        out.append(f"\n{indent}</{name}>")
    elif text is None:
        out.append(f"{indent}<{name}/>")
    else:
        out.append(f"{indent}<{name}>{_XML_SPECIAL.sub(_xml_escape_char, text)}</{name}>")


def to_xml(body: Any) -> bytes:
    """A map or stream body in ActiveMQ's ``jms-map-xml`` form (XStream's pretty-printed
    XML, two spaces a level, no XML declaration), UTF-8."""
    out: list[str] = []
    _write_xml(_root(body), "", out)
    return "".join(out).encode("utf-8", "surrogatepass")


# -- element tree -> JSON (Jettison's mapped convention) ----------------------------------------

_LONG_TEXT = re.compile(r"-?[0-9]+")
_DOUBLE_TEXT = re.compile(r"-?[0-9.Ee]+")


def _primitive(text: str) -> str:
    """Jettison's DefaultConverter: the JSON token of an element's text -- a number or a
    boolean when the text reads back unchanged as one, else a JSON string."""
    if text:
        c = text[0]
        if "0" <= c <= "9" or c == "-":
            if _LONG_TEXT.fullmatch(text):
                v = int(text)
                if Int64.MIN <= v <= Int64.MAX and str(v) == text:
                    return text
            elif _DOUBLE_TEXT.fullmatch(text) and text.count(".") < 2 and \
                    text.count("E") + text.count("e") < 2:  # its getDouble: no exponent sign
                d = float(text)
                if math.isfinite(d) and _java_double_text(d) == text:
                    if "." in text and "E" not in text:  # JSONObject.numberToString
                        text = text.rstrip("0").rstrip(".")
                    return text
        elif text == "true" or text == "false":
            return text
    return json.dumps(text, ensure_ascii=False).replace("</", "<\\/")


def _write_json(el: Element, out: list[str]) -> None:
    _name, text, children = el
    if not children:
        out.append(_primitive(text or ""))
        return
    groups: dict[str, list[Element]] = {}
    for child in children:
        groups.setdefault(child[0], []).append(child)
    out.append("{")
    first = True
    for name, members in groups.items():
        if not first:
            out.append(",")
        first = False
        out.append(json.dumps(name))
        out.append(":")
        if len(members) == 1:
            _write_json(members[0], out)
        else:
            out.append("[")
            for i, member in enumerate(members):
                if i:
                    out.append(",")
                _write_json(member, out)
            out.append("]")
    out.append("}")


def to_json(body: Any) -> bytes:
    """A map or stream body in ActiveMQ's ``jms-map-json`` form (XStream through Jettison's
    mapped convention, as ActiveMQ's JmsFrameTranslator writes it), UTF-8."""
    root = _root(body)
    out = ["{", json.dumps(root[0]), ":"]
    _write_json(root, out)
    out.append("}")
    return "".join(out).encode("utf-8", "surrogatepass")


# -- XML / JSON -> element tree ----------------------------------------------------------------


def _xml_tree(data: bytes) -> Element:
    parser = xml.parsers.expat.ParserCreate()
    stack: list[tuple[str, list[str], list[Element]]] = []
    done: list[Element] = []

    def start(name: str, attrs: dict[str, str]) -> None:
        if "reference" in attrs:
            raise MessageFormatError("XStream references are not supported")
        if len(stack) > 2 * MAX_NESTING + 2:
            raise MessageFormatError(f"values nest deeper than {MAX_NESTING} levels")
        stack.append((name, [], []))

    def end(name: str) -> None:
        tag, texts, children = stack.pop()
        el: Element = (tag, "".join(texts) if texts else None, children)
        if stack:
            stack[-1][2].append(el)
        else:
            done.append(el)

    def chars(data: str) -> None:
        if stack:
            stack[-1][1].append(data)

    def refuse(*_args: Any) -> None:
        raise MessageFormatError("a DOCTYPE or entity declaration is not accepted")

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = chars
    parser.StartDoctypeDeclHandler = refuse
    parser.EntityDeclHandler = refuse
    try:
        parser.Parse(data, True)
    except xml.parsers.expat.ExpatError as exc:
        raise MessageFormatError(f"jms-map-xml body is not XML: {exc}") from None
    return done[0]


def _json_tree(name: str, value: Any, depth: int) -> Element:
    if depth > 2 * MAX_NESTING + 2:
        raise MessageFormatError(f"values nest deeper than {MAX_NESTING} levels")
    if type(value) is dict:
        children: list[Element] = []
        for key, v in value.items():
            if type(v) is list:
                children.extend(_json_tree(key, item, depth + 1) for item in v)
            else:
                children.append(_json_tree(key, v, depth + 1))
        return (name, None, children)
    if type(value) is list:
        raise MessageFormatError(f"an array inside an array at {name!r}")
    if value is None or value == "":
        return (name, None, [])
    if value is True or value is False:
        return (name, "true" if value else "false", [])
    return (name, str(value), [])


# -- element tree -> core value ----------------------------------------------------------------


def _int(text: str | None, t: Any, name: str) -> Any:
    try:
        return t(int((text or "").strip(), 10))
    except (ValueError, OverflowError):
        raise MessageFormatError(f"<{name}> {text!r} is not a Java {name}") from None


def _float(text: str | None, name: str) -> float:
    try:
        return float((text or "").strip())
    except ValueError:
        raise MessageFormatError(f"<{name}> {text!r} is not a Java {name}") from None


def _value(el: Element, depth: int) -> Any:
    if depth > MAX_NESTING + 1:
        raise MessageFormatError(f"values nest deeper than {MAX_NESTING} levels")
    name, text, children = el
    if name == "string":
        return text or ""
    if name == "int":
        return _int(text, Int32, name)
    if name == "long":
        v = _int(text, int, name)
        if not Int64.MIN <= v <= Int64.MAX:
            raise MessageFormatError(f"<long> {text!r} is out of a long's range")
        return v
    if name == "short":
        return _int(text, Int16, name)
    if name == "byte":
        return _int(text, Int8, name)
    if name == "big-int":
        v = _int(text, int, name)
        if Int64.MIN <= v <= Int64.MAX:
            return v
        if 0 <= v <= UInt64.MAX:
            return UInt64(v)
        raise MessageFormatError(f"<big-int> {text!r} fits neither a long nor a uint64")
    if name == "double":
        return _float(text, name)
    if name == "float":
        return Float32(_float(text, name))
    if name == "boolean":
        return (text or "").strip().lower() == "true"  # Boolean.valueOf
    if name == "char":
        if not text:
            return Char("\0")  # XStream's CharConverter: an empty char is NUL
        if len(text) != 1:
            raise MessageFormatError(f"<char> {text!r} is not one character")
        return Char(text)
    if name == "null":
        return None
    if name == "byte-array":
        try:
            return base64.b64decode(text or "", validate=False)
        except (binascii.Error, ValueError):
            raise MessageFormatError(f"<byte-array> {text!r} is not base64") from None
    if name in _MAP_NAMES:
        out: dict[str, Any] = {}
        for entry in children:
            if entry[0] != "entry" or len(entry[2]) != 2:
                raise MessageFormatError(f"<{name}> holds <{entry[0]}> with "
                                         f"{len(entry[2])} elements, not an <entry> of two")
            key, v = entry[2]
            if key[0] != "string":
                raise MessageFormatError(f"a map key must be a <string>, not <{key[0]}>")
            out[key[1] or ""] = _value(v, depth + 1)
        return out
    if name in _LIST_NAMES:
        return [_value(v, depth + 1) for v in children]
    array = _ARRAY_READ.get(name)
    if array is not None:
        return array(_value(v, depth + 1) for v in children)
    raise MessageFormatError(f"<{name}> is not a type the gateway reads (string, int, long, "
                             "short, byte, float, double, boolean, char, byte-array, null, "
                             "big-int, map, list, Java arrays)")


def _body(root: Element, transformation: str) -> Any:
    if root[0] not in _MAP_NAMES and root[0] not in _LIST_NAMES:
        raise MessageFormatError(f"{transformation} body must be a <map> or a <list>, not "
                                 f"<{root[0]}>")
    return _value(root, 0)


def from_xml(data: bytes) -> Any:
    """A ``jms-map-xml`` body: a dict (``<map>``) or a list (``<list>``)."""
    return _body(_xml_tree(data), "jms-map-xml")


def is_xstream_json(value: Any) -> bool:
    """Whether a parsed JSON body is in XStream's form: one key ``map`` whose value is ``""``
    (an empty map) or an object with only ``entry``."""
    if type(value) is not dict or len(value) != 1 or "map" not in value:
        return False
    inner = value["map"]
    return inner == "" or (type(inner) is dict and list(inner) == ["entry"])


def from_json(value: Any) -> Any:
    """A parsed ``jms-map-json`` body in XStream's form (:func:`is_xstream_json`) as a dict."""
    ((name, inner),) = value.items()
    return _body(_json_tree(name, inner, 0), "jms-map-json")


def parse_json(data: bytes) -> Any:
    """Parse JSON keeping every number's text (XStream gives the element its type)."""
    try:
        return json.loads(data, parse_int=str, parse_float=str, parse_constant=str)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MessageFormatError(f"jms-map-json body is not JSON: {exc}") from None
