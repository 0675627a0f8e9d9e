"""The RV-style message model: type inference and checks, field names and ids, the accessors,
copies and equality, and the text, JSON and FIELD=VALUE forms."""

from __future__ import annotations

import json
import math
import struct
from array import array
from datetime import UTC, datetime, timedelta, timezone
from ipaddress import IPv4Address

import pytest
from hypothesis import HealthCheck, given, settings

from transports.rv import FieldError, Message, RvDateTime, RvType
from transports.rv.codec import decode, encode
from transports.rv.message import CmLabel, Field, Origin, Route, infer_type
from transports.rv.msgtext import from_json, parse_datetime, parse_field_args, to_jsonable

from .rvgen import top_messages

# -- types ----------------------------------------------------------------------------------

INFERRED = [
    (True, RvType.BOOL),
    (5, RvType.I64),
    (2**63 - 1, RvType.I64),
    (1.5, RvType.F64),
    ("s", RvType.STRING),
    (b"b", RvType.OPAQUE),
    (bytearray(b"b"), RvType.OPAQUE),
    (Message(), RvType.MSG),
    (datetime(2020, 1, 1, tzinfo=UTC), RvType.DATETIME),
    (RvDateTime(0, 0), RvType.DATETIME),
    (IPv4Address("10.0.0.1"), RvType.IPADDR32),
    (array("b"), RvType.I8ARRAY), (array("B"), RvType.U8ARRAY),
    (array("h"), RvType.I16ARRAY), (array("H"), RvType.U16ARRAY),
    (array("i"), RvType.I32ARRAY), (array("I"), RvType.U32ARRAY),
    (array("q"), RvType.I64ARRAY), (array("Q"), RvType.U64ARRAY),
    (array("l"), {4: RvType.I32ARRAY, 8: RvType.I64ARRAY}[array("l").itemsize]),
    (array("f"), RvType.F32ARRAY), (array("d"), RvType.F64ARRAY),
    (["a", "b"], RvType.STRINGARRAY),
    ([Message()], RvType.MSGARRAY),
]


@pytest.mark.parametrize(("value", "t"), INFERRED, ids=[str(t) for _, t in INFERRED])
def test_type_inference(value, t):
    assert infer_type(value) == t
    m = Message().add("x", value)
    assert m.fields[0].type == t


@pytest.mark.parametrize("value", [2**63, [], [1, 2], None, {"a": 1}, array("u", "x"), object()])
def test_values_without_an_inferable_type(value):
    with pytest.raises(FieldError):
        Message().add("x", value)


RANGES = [(RvType.I8, -128, 127), (RvType.U8, 0, 255), (RvType.I16, -32768, 32767),
          (RvType.U16, 0, 65535), (RvType.I32, -(2**31), 2**31 - 1), (RvType.U32, 0, 2**32 - 1),
          (RvType.I64, -(2**63), 2**63 - 1), (RvType.U64, 0, 2**64 - 1),
          (RvType.IPPORT16, 0, 65535)]


@pytest.mark.parametrize(("t", "lo", "hi"), RANGES, ids=[t.name for t, _, _ in RANGES])
def test_integer_ranges(t, lo, hi):
    m = Message().add("lo", lo, t).add("hi", hi, t)
    assert m.get("lo") == lo and m.get("hi") == hi
    for bad in (lo - 1, hi + 1):
        with pytest.raises(FieldError, match="range"):
            Message().add("x", bad, t)
    with pytest.raises(FieldError, match="bool"):
        Message().add("x", True, t)
    with pytest.raises(FieldError, match="int"):
        Message().add("x", 1.0, t)


def test_value_checks_per_type():
    bad = [
        (RvType.F64, "1.0"), (RvType.F32, True), (RvType.F32, 1e39), (RvType.BOOL, 1),
        (RvType.STRING, "a\0b"), (RvType.STRING, 5), (RvType.MSG, {}),
        (RvType.DATETIME, 5), (RvType.DATETIME, RvDateTime(2**39, 0)),
        (RvType.DATETIME, RvDateTime(0, 1_000_000)), (RvType.IPADDR32, "1.2.3"),
        (RvType.IPADDR32, 1.5), (RvType.I8ARRAY, [128]), (RvType.U8ARRAY, "ab"),
        (RvType.F32ARRAY, ["x"]), (RvType.STRINGARRAY, "abc"), (RvType.STRINGARRAY, [1]),
        (RvType.MSGARRAY, [Message(), 1]), (RvType.OPAQUE, "text"), (300, b""),
        (RvType.I32ARRAY, 5),
    ]
    for t, v in bad:
        with pytest.raises(FieldError):
            Message().add("x", v, t)


def test_conversions_when_adding():
    m = Message()
    m.add("f32", 0.1, RvType.F32)
    assert m.get("f32") == 0.10000000149011612  # rounded to binary32 once, when added
    m.add("f64", 3, RvType.F64)
    assert m.get("f64") == 3.0 and isinstance(m.get("f64"), float)
    m.add("ip", "192.168.0.1", RvType.IPADDR32).add("ip2", 0x7F000001, RvType.IPADDR32)
    assert m.get("ip") == IPv4Address("192.168.0.1") and str(m.get("ip2")) == "127.0.0.1"
    m.add("xml", "<a/>", RvType.XML)
    assert m.get("xml") == b"<a/>"
    m.add("arr", (1, 2, 3), RvType.U16ARRAY)
    assert m.get("arr") == array("H", [1, 2, 3])
    for a in (array("q", [-1, 2]), array("l", [-1, 2]), array("b", [-1, 2]), [-1, 2]):
        m.update("i64s", a, RvType.I64ARRAY)
        assert m.get("i64s").tolist() == [-1, 2] and m.get("i64s").itemsize == 8
    with pytest.raises(FieldError, match="u8array"):
        m.add("u8s", array("b", [-1]), RvType.U8ARRAY)
    with pytest.raises(FieldError, match="f32"):
        m.add("f32s", [1e39], RvType.F32ARRAY)
    m.add("raw", b"\xff", RvType.STRING)
    assert m.get("raw") == b"\xff"
    m.add("tuple", ("a", "b"))
    assert m.get("tuple") == ["a", "b"]


def test_datetime_conversion():
    aware = datetime(2026, 11, 28, 12, 0, 0, 5, tzinfo=timezone(timedelta(hours=2)))
    m = Message().add("t", aware).add("naive", datetime(1970, 1, 1, 0, 0, 1))
    assert m.get("t") == RvDateTime(1795860000, 5)
    assert m.get("t").to_datetime() == aware
    assert m.get("naive") == RvDateTime(1, 0)  # naive is UTC, whatever the machine's zone
    before = Message().add("b", datetime(1969, 12, 31, 23, 59, 59, 500000))
    assert before.get("b") == RvDateTime(-1, 500000)
    assert RvDateTime(-1, 500000).isoformat() == "1969-12-31T23:59:59.500000Z"
    assert RvDateTime(-(2**39), 999_999).isoformat() == "@-549755813887.000001"
    assert parse_datetime("@-549755813887.000001") == RvDateTime(-(2**39), 999_999)
    assert parse_datetime("1969-12-31T23:59:59.5") == RvDateTime(-1, 500000)
    assert parse_datetime("@1.5") == RvDateTime(1, 500000)
    with pytest.raises(FieldError):
        parse_datetime("@1.0000001")
    with pytest.raises(FieldError):
        parse_datetime("yesterday")


# -- names and ids ------------------------------------------------------------------------


def test_field_ids_are_unique_per_level():
    m = Message().add("a", 1, fid=1)
    with pytest.raises(FieldError, match="already used"):
        m.add("b", 2, fid=1)
    sub = Message().add("a", 1, fid=1)  # a submessage has its own id space
    m.add("sub", sub, fid=2)
    assert m.get_field(1).name == "a" and m.get(2).get(1) == 1
    m.add("c", 3)  # id 0 is "no id", any number of times
    m.add("d", 4)
    for fid in (65536, -1, True, 1.0):
        with pytest.raises(FieldError, match="1..65535"):
            Message().add("x", 1, fid=fid)
    assert Message().add("x", 1, fid=65535).get(65535) == 1


def test_an_id_needs_a_name():
    with pytest.raises(FieldError, match="needs a name"):
        Message().add(None, 1, fid=3)
    with pytest.raises(FieldError, match="needs a name"):
        Message().add("", 1, fid=3)
    m = Message().add(None, 1).add("", 2)  # nameless without an id is legal
    assert m.names() == [None, None]


def test_reserved_names():
    with pytest.raises(FieldError, match="reserved"):
        Message().add("_data_", 1)
    with pytest.raises(FieldError, match="reserved"):
        Message().update("_x", 1)
    m = Message().add("_data_", 1, internal=True)
    assert m.get("_data_") == 1
    assert Message().add("a_b", 1).get("a_b") == 1


def test_name_limits():
    assert Message().add("n" * 127, 1)
    with pytest.raises(FieldError, match="127"):
        Message().add("n" * 128, 1)
    with pytest.raises(FieldError, match="127"):
        Message().add("é" * 64, 1)
    with pytest.raises(FieldError, match="NUL"):
        Message().add("a\0", 1)
    with pytest.raises(FieldError, match="str"):
        Message().add(5, 1)  # type: ignore[arg-type]


# -- accessors ------------------------------------------------------------------------------


def test_accessors():
    m = Message("A.B", "_INBOX.x")
    m.add("a", 1).add("b", "x", fid=7).add("a", 2).add(None, True)
    assert len(m) == 4
    assert [f.name for f in m] == ["a", "b", "a", None]
    assert m.get("a") == 1 and m.get_all("a") == [1, 2]
    assert m.get("zz") is None and m.get("zz", 0) == 0
    assert m.get(7) == "x" and m.get_field("b").fid == 7 and m.get_field(8) is None
    assert m.get_field(0) is None
    assert m["a"] == 1 and "b" in m and 7 in m and "zz" not in m and 1.5 not in m
    with pytest.raises(KeyError):
        m["zz"]
    assert m.send_subject == "A.B" and m.reply_subject == "_INBOX.x"
    assert m.remove("a") and m.get("a") == 2
    assert m.remove(7) and "b" not in m
    assert not m.remove("zz") and not m.remove(9) and not m.remove(0)
    assert m.remove_all("a") == 1 and len(m) == 1
    m.clear()
    assert len(m) == 0 and m.send_subject == "A.B"


def test_update():
    m = Message().add("n", 1, RvType.U8).add("s", "x", fid=4)
    m.update("n", 200)
    assert m.get("n") == 200 and m.get_field("n").type == RvType.U8
    with pytest.raises(FieldError, match="range"):
        m.update("n", 300)
    with pytest.raises(FieldError, match="update cannot make it i16"):
        m.update("n", 1, RvType.I16)
    m.update("n", 5, RvType.U8)
    m.update("s", "y", fid=4)
    assert m.get(4) == "y"
    with pytest.raises(FieldError, match="belongs to"):
        m.update("t", "z", fid=4)
    m.update("new", 1.5)
    assert m.get("new") == 1.5 and len(m) == 3
    with pytest.raises(FieldError, match="itself"):
        m.update("sub", Message()).update("sub", m)


def test_equality_and_copy():
    sub = Message().add("x", [1, 2], RvType.I32ARRAY)
    m = Message("A").add("s", sub).add("f", math.nan).add("arr", [sub])
    c = m.copy()
    assert c == m and c is not m
    c.get("s").get("x")[0] = 9
    c.get("arr")[0].add("y", 1)
    assert m.get("s").get("x")[0] == 1 and len(m.get("arr")[0]) == 1
    assert c != m
    assert Message().add("f", 0.0) != Message().add("f", -0.0)
    assert Message().add("n", 1, RvType.U8) != Message().add("n", 1, RvType.I8)
    assert Message().add("n", 1, fid=1) != Message().add("n", 1)
    assert Message("A") != Message("B") and Message() != Message(None, "R")
    assert Message().__eq__(5) is NotImplemented
    with pytest.raises(TypeError):
        hash(Message())
    with pytest.raises(TypeError):
        hash(Field("a", 0, 1, 1))
    assert Field("a", 0, RvType.I64, 1) == Field("a", 0, RvType.I64, 1)
    assert Field("a", 0, RvType.I64, 1).__eq__(1) is NotImplemented
    assert repr(Field("a", 3, RvType.I64, 1)) == "Field('a', fid=3, i64, 1)"


# -- text form ------------------------------------------------------------------------------


def _sample() -> Message:
    m = Message("A.B")
    m.add("name", "Jane \"J\" Smith").add("age", 46, RvType.U8, fid=4)
    m.add("scores", [91, 99], RvType.U8ARRAY).add("ok", True).add("pi", 3.5, RvType.F32)
    m.add("sub", Message().add("a", 1).add("b", "x"))
    m.add("when", RvDateTime(0, 1)).add("ip", IPv4Address("10.1.2.3"))
    m.add("blob", b"\x00\xab").add("tags", ["x", "y"]).add("subs", [Message(), Message()])
    m.add(None, 7, RvType.I16)
    return m


def test_text_form():
    assert _sample().to_text() == (
        '{name="Jane \\"J\\" Smith" age#4=46 scores=[91 99] ok=true pi=3.5 sub={a=1 b="x"} '
        'when=1970-01-01T00:00:00.000001Z ip=10.1.2.3 blob=<2 bytes: 00ab> tags=["x" "y"] '
        'subs=[{} {}] =7}')
    assert str(Message().add("a", 1)) == "{a=1}"
    typed = _sample().to_text(types=True)
    assert typed.startswith('{name:string="Jane \\"J\\" Smith" age#4:u8=46 scores:u8array=[91 99]')
    assert "sub:msg={a:i64=1 b:string=\"x\"}" in typed and typed.endswith(":i16=7}")
    assert repr(Message("S").add("a", 1)) == "Message('S', {a:i64=1})"
    raw = Message().add("r", b"\xff", RvType.STRING).add("u", b"ab", 200)
    assert raw.to_text(True) == "{r:string=b'\\xff' u:200=<2 bytes: 6162>}"
    long = Message().add("o", bytes(300)).to_text()
    assert long.startswith("{o=<300 bytes: 0000") and long.endswith("...>}")


# -- JSON form ------------------------------------------------------------------------------


def test_json_form():
    m = _sample()
    m.add("nan", math.nan).add("inf", -math.inf, RvType.F32)
    m.add("fl", [math.nan, 1.0], RvType.F64ARRAY).add("raw", b"\xff", RvType.STRING)
    d = to_jsonable(m)
    assert d["subject"] == "A.B" and "reply" not in d
    f = d["fields"]
    assert f[0] == {"name": "name", "type": "string", "value": 'Jane "J" Smith'}
    assert f[1] == {"name": "age", "id": 4, "type": "u8", "value": 46}
    assert f[5] == {"name": "sub", "type": "msg", "value": [
        {"name": "a", "type": "i64", "value": 1}, {"name": "b", "type": "string", "value": "x"}]}
    assert f[6]["value"] == "1970-01-01T00:00:00.000001Z"
    assert f[8] == {"name": "blob", "type": "opaque", "value": "AKs="}
    assert f[11] == {"type": "i16", "value": 7}
    assert f[12]["value"] == "NaN" and f[13]["value"] == "-Infinity"
    assert f[14]["value"] == ["NaN", 1.0] and f[15]["value"] == {"base64": "/w=="}
    text = m.to_json()
    json.loads(text)  # strict JSON: no bare NaN
    assert Message.from_json(text) == m
    assert Message.from_json(text.encode()) == m
    assert from_json(d) == m


def test_json_keeps_the_envelope_and_odd_values():
    m = Message("S", "R")
    m.encoding = "latin-1"
    m.cm = CmLabel("c", 2**64 - 1, 2.5)
    m.origin = Origin("gw", 3)
    m.route = Route("PLANT", 2)
    m.add("_data_", 1, internal=True).add("x", b"\x01", 201)
    odd_nan = struct.unpack(">d", bytes.fromhex("fff8000000000001"))[0]
    m.add("n", odd_nan).add("d", RvDateTime(2**39 - 1, 0))
    j = m.to_json()
    assert '"NaN:fff8000000000001"' in j and '"type": 201' in j and '"@549755813887.000000"' in j
    assert Message.from_json(j) == m


BAD_JSON = [
    "not json", "[]", '{"fields": {}}', '{"fields": [{"type": "i8"}]}',
    '{"fields": [{"type": "nope", "value": 1}]}', '{"fields": [{"type": 256, "value": ""}]}',
    '{"fields": [{"type": "i8", "value": 1, "extra": 0}]}', '{"other": 1}',
    '{"subject": 5}', '{"cm": {"sender": "x"}}', '{"origin": 5}', '{"route": 5}', '{"route": {"hops": 1}}',
    '{"fields": [{"type": "f64", "value": "one"}]}',
    '{"fields": [{"type": "f64", "value": "NaN:zz"}]}',
    '{"fields": [{"type": "opaque", "value": "!!"}]}',
    '{"fields": [{"type": "string", "value": {"hex": "00"}}]}',
    '{"fields": [{"type": "datetime", "value": 5}]}',
    '{"fields": [{"type": "i8array", "value": 5}]}',
    '{"fields": [{"type": "stringarray", "value": "a"}]}',
    '{"fields": [{"type": "msgarray", "value": {}}]}',
    '{"fields": [{"name": 5, "type": "i8", "value": 1}]}',
    '{"fields": [{"type": "i8", "value": 300}]}',
]


@pytest.mark.parametrize("text", BAD_JSON)
def test_bad_json_is_a_field_error(text):
    with pytest.raises(FieldError):
        Message.from_json(text)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(top_messages())
def test_json_round_trips_generated_messages(msg):
    assert Message.from_json(msg.to_json()) == msg
    msg.to_text(types=True)


# -- FIELD=VALUE arguments ---------------------------------------------------------------


def test_field_args():
    m = parse_field_args([
        "a:i16=5", "s=hello=world", "n=5", "sub.b=x", "sub.c:u8=0x10", "sub.deep.d:bool=true",
        "id#3:u32=7", "f:f32=0.5", "t:datetime=1970-01-01T00:00:01Z", "ip:ipaddr32=1.2.3.4",
        "arr:i32array=1, 2,3", "js:u8array=[1,2]", "empty:f64array=", "fa:f64array=[\"NaN\", 1]",
        "sa:stringarray=[\"a,b\", \"c\"]", "o:opaque=hi", "h:opaque/hex=00ff",
        "b64:xml/base64=PGEvPg==", "m[0].x:i8=1", "m[1].x:i8=2", "m[0].y=z",
        "es:msg=", "js2:msg=[{\"name\": \"q\", \"type\": \"u8\", \"value\": 1}]", "em:msgarray=",
        "u:200/hex=0102",
    ])
    assert m.get("a") == 5 and m.get_field("a").type == RvType.I16
    assert m.get("s") == "hello=world" and m.get("n") == "5"  # untyped is a string
    sub = m.get("sub")
    assert sub.get("b") == "x" and sub.get("c") == 16 and sub.get("deep").get("d") is True
    assert len(m.get_all("sub")) == 1
    assert m.get(3) == 7 and m.get_field(3).type == RvType.U32
    assert m.get("f") == 0.5 and m.get("t") == RvDateTime(1, 0)
    assert m.get("ip") == IPv4Address("1.2.3.4")
    assert m.get("arr") == array("i", [1, 2, 3]) and m.get("js") == array("B", [1, 2])
    assert len(m.get("empty")) == 0 and math.isnan(m.get("fa")[0])
    assert m.get("sa") == ["a,b", "c"]
    assert m.get("o") == b"hi" and m.get("h") == b"\x00\xff" and m.get("b64") == b"<a/>"
    assert [e.get_all("x") for e in m.get("m")] == [[1], [2]] and m.get("m")[0].get("y") == "z"
    assert m.get("es") == Message() and m.get("js2").get("q") == 1 and m.get("em") == []
    assert m.get("u") == b"\x01\x02" and m.get_field("u").type == 200
    assert decode(encode(m)) == m


BAD_ARGS = [
    "noequals", "a:nosuchtype=1", "a:i8=300", "a:i8=x", "a:bool=maybe", "_x=1", "a._b=1",
    "a[0]=1", "m[1].x=1", "a..b=1", "a:string/hex=00", "a:opaque/rot13=x", "a:opaque/hex=zz",
    "a:stringarray=a,b", "a:i8array=[1", "a:i8array={}", "a:msg=nope", "a:ipaddr32=1.2",
    "a:datetime=soon", "#3=1", "a#3=1 ",
]


@pytest.mark.parametrize("arg", BAD_ARGS)
def test_bad_field_args(arg):
    with pytest.raises(FieldError):
        parse_field_args([arg] if arg != "a#3=1 " else ["a#3=1", "b#3=2"])


def test_field_args_add_to_a_message():
    m = Message("S").add("sub", Message().add("x", 1))
    parse_field_args(["sub.y=2"], m)
    assert m.get("sub").get("y") == "2" and len(m) == 1
