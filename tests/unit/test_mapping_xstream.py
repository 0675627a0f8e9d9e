"""ActiveMQ's XML and JSON forms of map bodies (``mappings/xstream.py``), checked against
what ActiveMQ 5.17 itself wrote: ``data/activemq/map.xml`` and ``map.json`` are the bodies of
the MESSAGE frames an ActiveMQ 5.17.2 broker (XStream 1.4.20, Jettison 1.5.3) sent to
subscriptions with ``transformation:jms-map-xml`` and ``jms-map-json`` for one map it had been
sent as XML. Each is read into a core map and written again byte for byte (the map keeps the
order of the file, so ActiveMQ's hash order comes back), both ways.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.errors import MessageFormatError
from gateway.types import Char, Float32, Int8, Int16, Int32, Int32Array, UInt8, UInt64
from mappings import xstream

DATA = Path(__file__).parent / "data" / "activemq"

# The map both files hold, as the gateway types it.
EXPECTED = {
    "name": "Dejan", "i": Int32(5), "l": 7, "d": 1.5, "f": Float32(2.5), "b": True,
    "s": Int16(3), "y": Int8(4), "c": Char("x"), "num": "123", "m": {"k": "v"},
    "lst": [Int32(1), Int32(2)], "e": {}, "n": None, "emp": "", "dd": 3.0, "big": 1e10,
    "u": 'caf\u00e9 </x> "q"', "t": "true", "sm": 1e-5, "neg": -42,
}  # fmt: skip


def typed(v):
    """A value with its exact types (Int32(5) == 5 in Python)."""
    if isinstance(v, dict):
        return {k: typed(x) for k, x in v.items()}
    if isinstance(v, list):
        return [typed(x) for x in v]
    return (type(v).__name__, v)


@pytest.mark.parametrize("name", ["map.xml", "map.json"])
def test_activemq_output_reads_as_the_typed_map_and_writes_back_byte_for_byte(name):
    data = (DATA / name).read_bytes()
    if name.endswith(".xml"):
        value = xstream.from_xml(data)
        again = xstream.to_xml(value)
    else:
        parsed = xstream.parse_json(data)
        assert xstream.is_xstream_json(parsed)
        value = xstream.from_json(parsed)
        again = xstream.to_json(value)
    assert typed(value) == typed(EXPECTED)
    assert again == data


def test_one_entry_and_empty_maps_are_written_as_jettison_does():
    # Jettison writes one child as an object, not an array; no value as "".
    assert xstream.to_json({"one": 5}) == b'{"map":{"entry":{"string":"one","long":5}}}'
    assert xstream.to_json({}) == b'{"map":""}'
    assert xstream.to_xml({}) == b"<map/>"
    assert xstream.to_xml({"one": 5}) == (
        b"<map>\n  <entry>\n    <string>one</string>\n    <long>5</long>\n  </entry>\n</map>")


def test_nested_values_arrays_and_unsigned_widths():
    body = {"deep": {"l": [{"x": [True, None]}, b"\x00\xff"]}, "arr": Int32Array([1, 2]),
            "u8": UInt8(200), "u64": UInt64(2**64 - 1)}
    assert xstream.to_xml(body).count(b"<int-array>") == 1
    back = xstream.from_xml(xstream.to_xml(body))
    assert typed(back) == typed({"deep": {"l": [{"x": [True, None]}, b"\x00\xff"]},
                                 "arr": Int32Array([1, 2]), "u8": Int16(200),
                                 "u64": UInt64(2**64 - 1)})
    assert typed(xstream.from_json(xstream.parse_json(xstream.to_json(body)))) == typed(back)


def test_a_stream_body_is_a_list_and_json_groups_its_types_as_jettison_does():
    assert xstream.to_json(["a", Int32(1), "b"]) == b'{"list":{"string":["a","b"],"int":1}}'
    assert xstream.from_xml(xstream.to_xml(["a", Int32(1), "b"])) == ["a", 1, "b"]


@pytest.mark.parametrize(("text", "token"), [
    ("123", "123"), ("-42", "-42"), ("1.5", "1.5"), ("3.0", "3"), ("1.0E10", "1.0E10"),
    ("1.0E-5", '"1.0E-5"'), ("01", '"01"'), ("1.50", '"1.50"'), ("true", "true"),
    ("True", '"True"'), ("NaN", '"NaN"'), ("-Infinity", '"-Infinity"'), ("", '""'),
    ("99999999999999999999", '"99999999999999999999"'), ("a</b", '"a<\\/b"'),
])
def test_text_becomes_a_json_primitive_as_jettisons_default_converter_says(text, token):
    assert xstream._primitive(text) == token


@pytest.mark.parametrize(("data", "error"), [
    (b"<map><entry><int>1</int><int>2</int></entry></map>", "map key must be a <string>"),
    (b"<map><entry><string>a</string><date>x</date></entry></map>", "<date> is not a type"),
    (b"<map><entry><string>a</string><int>x</int></entry></map>", "not a Java int"),
    (b"<map><entry><string>a</string><int>2147483648</int></entry></map>", "not a Java int"),
    (b"<map><entry><string>a</string><string reference='../x'/></entry></map>", "references"),
    (b"<map>", "not XML"),
])
def test_bad_xml_is_a_format_error(data, error):
    with pytest.raises(MessageFormatError, match=error):
        xstream.from_xml(data)
