"""The default STOMP mapping rules (mappings/defaults/stomp.yaml) against the fast path.

The rules run by the engine (``MappingSet().wire_for(..., fast=False)``) and the hand-written
``stomp_to_message`` / ``message_to_stomp`` must give the same answer for every input: the
same core message field by field (every value with its exact type, nested map and stream
bodies, typed properties, the size estimate), the same MESSAGE headers in the same order and
the same body byte for byte, and the same error (type and text) when the frame is refused.
Inputs are drawn by hypothesis: frames made of the headers the mapping reads, with valid and
invalid values, plus any other header; and messages of every body kind and property type,
including what a core → STOMP hop writes, fed back in.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import any_text, map_bodies, message_differences, messages, names, stream_bodies

from gateway.message import BodyKind, Destination, Message
from gateway.types import Float32, Int8, Int32, UInt64
from mappings.engine import MappingSet
from mappings.rows import is_fast, why_not_fast
from mappings.rules import default_rules
from mappings.stomp import message_to_stomp, stomp_to_message

# The fast path is the default mapping only while the rows are the ones it is written for
# (mappings/rows.py); when a row changes, the engine runs the rows and these comparisons wait
# for the fast path to follow, saying so.
pytestmark = pytest.mark.skipif(
    not (is_fast("stomp", "in") and is_fast("stomp", "out")),
    reason=f"the stomp fast path is off: {why_not_fast('stomp', 'in') or why_not_fast('stomp', 'out')}")

Q = Destination.queue("orders")
NOW = 1_700_000_000_000
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

EMPTY = MappingSet()
RULES_IN = EMPTY.wire_for(Q, protocol="stomp", direction="in", fast=False)
RULES_OUT = EMPTY.wire_for(Q, protocol="stomp", direction="out", fast=False)


def both_in(headers: dict[str, str], body: bytes, has_length: bool,
            reply_to: Destination | None = None) -> tuple[Any, Any]:
    """(fast, rules): each a Message or the (type, text) of what it raised."""
    results = []
    for fn in (stomp_to_message, RULES_IN):
        try:
            results.append(fn(headers, body, has_length=has_length, destination=Q,
                              reply_to=reply_to, now_ms=NOW))
        except Exception as exc:  # noqa: BLE001 - the error is part of the answer
            results.append((type(exc), str(exc)))
    return results[0], results[1]


def assert_same_in(headers: dict[str, str], body: bytes, has_length: bool,
                   reply_to: Destination | None = None) -> Any:
    fast, rules = both_in(headers, body, has_length, reply_to)
    if isinstance(fast, Message) and isinstance(rules, Message):
        assert message_differences(fast, rules) == []
        assert type(rules) is Message
        assert fast.size == rules.size
        assert fast.expires_at == rules.expires_at == 0
    else:
        assert fast == rules
    return fast


def assert_same_out(msg: Message, reply_to: str | None = None) -> tuple[list[Any], bytes]:
    fast = message_to_stomp(msg, destination="/queue/orders", reply_to=reply_to)
    rules = RULES_OUT(msg, destination="/queue/orders", reply_to=reply_to)
    assert rules == fast
    assert [type(v) for _, v in rules[0]] == [str] * len(rules[0])
    return fast


# -- frames --------------------------------------------------------------------------------------

_digits = st.integers(0, 2**64).map(str)
_header_values: dict[str, st.SearchStrategy[str]] = {
    "content-type": st.sampled_from([
        "text/plain", "text/plain;charset=utf-8", "application/json", "application/octet-stream",
        "application/x-java-serialized-object", "application/xml; charset=\"UTF-8\"", "TEXT/X",
    ]) | any_text,
    "transformation": st.sampled_from(["jms-map-json", "jms-stream-json", "jms-json", "jms-byte",
                                       "jms-object-xml"]) | any_text,
    "persistent": st.sampled_from(["true", "TRUE", "false", "yes", ""]),
    "priority": st.sampled_from([str(p) for p in range(10)] + ["10", "-1", "x", "07", ""]),
    "expires": _digits | st.sampled_from(["-5", "1e3", "", "٣"]),
    "AMQ_SCHEDULED_DELAY": _digits | st.sampled_from(["0", "-1", "x"]),
    "correlation-id": any_text,
    "type": any_text,
    "gw-trace-id": any_text,
    "reply-to": st.just("/queue/r"),
    "content-length": st.integers(0, 100).map(str),
    "message-id": any_text, "timestamp": _digits, "receipt": any_text, "subscription": any_text,
    "JMS_GW_CONTENT_TYPE": any_text,
}  # fmt: skip
_TYPE_NAMES = ["int8", "int32", "uint64", "long", "boolean", "float32", "float64", "char", "null",
               "bytes", "json", "string", "nonsense", "utf8bytes"]


@st.composite
def frames(draw: st.DrawFn) -> tuple[dict[str, str], bytes, bool]:
    headers: dict[str, str] = {}
    for name in draw(st.lists(st.sampled_from(list(_header_values)), unique=True, max_size=8)):
        headers[name] = draw(_header_values[name])
    others = draw(st.dictionaries(names, any_text | st.integers().map(str), max_size=5))
    for name, value in others.items():
        headers.setdefault(name, value)
    if draw(st.booleans()):  # gw-types over some of the headers present, right or wrong
        listed = draw(st.lists(st.sampled_from(sorted(headers) or ["x"]), max_size=5))
        entries = [f"{n}:{draw(st.sampled_from(_TYPE_NAMES))}" + draw(st.sampled_from(["", ":esc"]))
                   for n in listed]
        headers["gw-types"] = ",".join(entries + draw(st.lists(any_text, max_size=2)))
    body = draw(st.one_of(
        st.binary(max_size=40),
        any_text.map(lambda t: t.encode("utf-8", "surrogatepass")),
        map_bodies().map(_json), stream_bodies().map(_json),
        st.sampled_from([b"{}", b"[]", b"1", b'{"a": 1e400}', b'{"n": 18446744073709551615}',
                         b'{"n": 18446744073709551616}', b"[NaN]", b"{"]),
    ))  # fmt: skip
    return headers, body, draw(st.booleans())


def _json(value: Any) -> bytes:
    from mappings.typedtext import json_payload

    return json_payload(value)


@SETTINGS
@given(frames())
def test_any_frame_maps_alike_both_ways_in(frame: tuple[dict[str, str], bytes, bool]) -> None:
    headers, body, has_length = frame
    assert_same_in(headers, body, has_length)


@SETTINGS
@given(messages(), st.none() | st.just("/topic/replies"))
def test_any_message_maps_alike_out_and_back(msg: Message, reply_to: str | None) -> None:
    headers, body = assert_same_out(msg, reply_to)
    first: dict[str, str] = {}
    for n, v in headers:
        first.setdefault(n, v)
    assert_same_in(first, body, True, Destination.topic("replies") if reply_to else None)
    assert_same_in(first, body, False)


_foreign = st.one_of(st.binary(max_size=8), map_bodies(), stream_bodies())


@SETTINGS
@given(st.dictionaries(names, _foreign, min_size=1, max_size=3))
def test_properties_of_no_jms_type_render_alike(props: dict[str, Any]) -> None:
    # AMQP may bring binary and compound application properties: base64 and JSON texts.
    headers, body = assert_same_out(Message("x", properties=props, destination=Q))
    first = dict(reversed(headers))
    assert_same_in(first, body, False)


# -- fixed vectors: what the properties above must also cover, spelled out -----------------------


@pytest.mark.parametrize(("headers", "body", "has_length"), [
    ({"destination": "/queue/orders", "priority": "12"}, b"x", False),
    ({"expires": "soon"}, b"", False),
    ({"transformation": "jms-map-json"}, b"[1]", True),
    ({"transformation": "jms-object-xml"}, b"<a/>", True),
    ({"AMQ_SCHEDULED_DELAY": str(2**63 - 1)}, b"", False),
])  # fmt: skip
def test_refusals_are_the_same_error(headers: dict[str, str], body: bytes,
                                     has_length: bool) -> None:
    fast, rules = both_in(headers, body, has_length)
    assert isinstance(fast, tuple) and fast[0].__name__ == "MessageFormatError"
    assert rules == fast


def test_a_typed_frame_maps_alike() -> None:
    msg = assert_same_in({
        "destination": "/queue/orders", "content-type": "application/json",
        "transformation": "jms-map-json", "n": "5", "on": "true", "f": "0.1",
        "type": "a%00b", "correlation-id": "aGk=", "gw-trace-id": "t1", "persistent": "true",
        "gw-types": "n:int8,on:boolean,f:float32,type:string:esc,correlation-id:bytes",
        "priority": "7", "expires": "1700000009000", "AMQ_SCHEDULED_DELAY": "250",
    }, json.dumps({"a": [1, {"b": 18446744073709551615}]}).encode(), True)  # fmt: skip
    assert msg.body == {"a": [1, {"b": UInt64.MAX}]} and msg.body_kind is BodyKind.MAP
    assert msg.properties == {"n": Int8(5), "on": True, "f": Float32(0.1)}
    assert type(msg.properties["n"]) is Int8 and type(msg.properties["f"]) is Float32
    assert (msg.type, msg.correlation_id, msg.trace_id) == ("a\x00b", b"hi", "t1")
    assert (msg.priority, msg.expiration, msg.delivery_time) == (7, 1700000009000, NOW + 250)


def test_a_typed_message_renders_alike() -> None:
    msg = Message({"m": {"s": [Int32(1), None, b"\x00"]}}, destination=Q, type="t\udc00",
                  properties={"n": Int32(-3), "c": Float32(21.1), "JMS_GW_CONTENT_TYPE": "x/y"},
                  correlation_id=b"\xff\x00", timestamp=NOW, expiration=NOW + 5)
    msg.trace_id = "tr"
    headers, body = assert_same_out(msg, "/queue/r")
    assert dict(headers)["gw-types"] == (
        "correlation-id:bytes,type:string:esc,n:int32,c:float32")
    assert headers[-1] == ("gw-trace-id", "tr") and body == b'{"m":{"s":[1,null,"AA=="]}}'


def test_the_rules_are_one_per_row_in_order() -> None:
    names_in = [r["name"] for r in default_rules("stomp", "in")]
    names_out = [r["name"] for r in default_rules("stomp", "out")]
    assert names_in[:3] == ["stomp.in.body", "stomp.in.properties", "stomp.in.correlation-id"]
    assert names_out[-3:] == ["stomp.out.properties", "stomp.out.gw-types", "stomp.out.trace-id"]
    assert len(names_in) == 12 and len(names_out) == 12
    assert all(r["file"] == "defaults/stomp.yaml" for r in default_rules("stomp", "in"))


def test_without_a_user_rule_the_fast_path_is_used() -> None:
    assert EMPTY.wire_for(Q, protocol="stomp", direction="in") is stomp_to_message
    assert EMPTY.wire_for(Q, protocol="stomp", direction="out") is message_to_stomp
    assert RULES_IN is not stomp_to_message and RULES_OUT is not message_to_stomp


def test_properties_named_like_the_frames_own_headers_render_alike() -> None:
    own = ["destination", "message-id", "subscription", "ack", "content-length", "content-type",
           "persistent", "priority", "expires", "timestamp", "correlation-id", "reply-to", "type",
           "redelivered", "transformation", "receipt", "transaction", "gw-types", "gw-trace-id",
           "JMS_GW_CONTENT_TYPE", "AMQ_SCHEDULED_DELAY", "n"]
    headers, body = assert_same_out(Message("x", destination=Q, properties={n: "v" for n in own}))
    assert [n for n, _ in headers] == ["destination", "content-type", "persistent", "priority", "n"]
    assert_same_in(dict(headers), body, False)
