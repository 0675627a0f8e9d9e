"""Message selectors: syntax, three-valued logic and typing (TIBCO EMS User's Guide,
"Message Selectors").

Each table row is (selector, properties or headers, expected), where expected is the
three-valued result: True, False or None (UNKNOWN). A row is checked twice: the selector
must match exactly when expected is True, and ``NOT (selector)`` exactly when it is False,
so an UNKNOWN result is told apart from FALSE.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.errors import InvalidSelectorError
from gateway.message import DeliveryMode, Destination, Message
from gateway.selector import MAX_NESTING, Selector, compile_selector
from gateway.types import (
    Char,
    Float32,
    Int8,
    Int16,
    Int32,
    Int32Array,
    Int64,
    UInt8,
    UInt16,
    UInt32,
    UInt64,
)

T, F, U = True, False, None


def _sel(text: str) -> Selector:
    s = compile_selector(text)
    assert s is not None
    return s


def _result(text: str, m: Any) -> bool | None:
    """The three-valued value of ``text`` for ``m``, observed through matching alone."""
    positive = _sel(text).matches(m)
    negative = _sel("NOT (" + text + ")").matches(m)
    assert not (positive and negative), text
    return True if positive else False if negative else None


def _msg(props: dict[str, Any] | None = None, **headers: Any) -> Message:
    return Message.text("body", properties=dict(props or {}), **headers)


PROPERTY_ROWS: list[tuple[str, dict[str, Any], bool | None]] = [
    # -- numeric comparison, every operator, NULL operand
    ("a = 1", {"a": 1}, T),
    ("a = 1", {"a": 2}, F),
    ("a = 1", {}, U),
    ("a <> 1", {"a": 2}, T),
    ("a <> 1", {"a": 1}, F),
    ("a <> 1", {}, U),
    ("a < 2", {"a": 1}, T),
    ("a < 2", {"a": 2}, F),
    ("a <= 2", {"a": 2}, T),
    ("a <= 2", {"a": 3}, F),
    ("a > 2", {"a": 3}, T),
    ("a > 2", {"a": 2}, F),
    ("a >= 2", {"a": 2}, T),
    ("a >= 2", {"a": 1}, F),
    ("a >= 2", {}, U),
    ("2 < a", {"a": 3}, T),
    ("2 >= a", {"a": 3}, F),
    ("a = b", {"a": 1, "b": 1}, T),
    ("a < b", {"a": 1, "b": 2}, T),
    ("a > b", {"a": 1, "b": 2}, F),
    ("a = b", {"a": 1}, U),
    ("1 = 1", {}, T),
    ("1 < 0", {}, F),
    ("a > 1.5", {"a": 2}, T),
    ("a > 1.5", {"a": 1}, F),
    ("a = 10000000000", {"a": 10000000000}, T),
    ("a < 10000000000", {"a": 1.5}, T),
    # -- strings (only = and <>), case-sensitive, '' escape
    ("s = 'red'", {"s": "red"}, T),
    ("s = 'red'", {"s": "Red"}, F),
    ("s <> 'red'", {"s": "blue"}, T),
    ("s <> 'red'", {"s": "red"}, F),
    ("s <> 'red'", {}, U),
    ("'red' = s", {"s": "red"}, T),
    ("s = 'It''s'", {"s": "It's"}, T),
    ("s = ''", {"s": ""}, T),
    ("s = 'héllo ✓'", {"s": "héllo ✓"}, T),
    ("s = t", {"s": "x", "t": "x"}, T),
    ("s <> t", {"s": "x", "t": "y"}, T),
    ("c = 'a'", {"c": Char("a")}, T),
    # -- booleans (only = and <>) and identifiers used as conditions
    ("f = TRUE", {"f": True}, T),
    ("f = TRUE", {"f": False}, F),
    ("f = FALSE", {"f": False}, T),
    ("f <> TRUE", {"f": False}, T),
    ("f <> FALSE", {"f": False}, F),
    ("f = g", {"f": True, "g": True}, T),
    ("f", {"f": True}, T),
    ("f", {"f": False}, F),
    ("f", {}, U),
    ("f", {"f": 1}, F),
    ("f", {"f": "true"}, F),
    ("TRUE", {}, T),
    ("FALSE", {}, F),
    ("(a = 1) = TRUE", {"a": 1}, T),
    ("(a = 1) = FALSE", {"a": 1}, F),
    ("(a = 1) = TRUE", {}, U),
    # -- S6: incomparable types are FALSE (for <> as well); NULL stays UNKNOWN
    ("x = 'abc'", {"x": 5}, F),
    ("x <> 'abc'", {"x": 5}, F),
    ("x = 5", {"x": "5"}, F),
    ("x <> 5", {"x": "5"}, F),
    ("x > 5", {"x": "9"}, F),
    ("x = 1", {"x": True}, F),
    ("x = TRUE", {"x": 1}, F),
    ("x <> TRUE", {"x": 1}, F),
    ("x = y", {"x": 1, "y": True}, F),
    ("x <> y", {"x": "1", "y": 1}, F),
    ("x = y", {"x": 1, "y": "1"}, F),
    ("x = 1", {"x": b"\x01"}, F),
    ("x = y", {"x": b"a", "y": b"a"}, F),
    ("x = 1", {"x": Int32Array([1])}, F),
    ("x = 'abc'", {}, U),
    # -- S7 at run time: strings and booleans held by identifiers cannot be ordered
    ("s > t", {"s": "b", "t": "a"}, F),
    ("s <= t", {"s": "a", "t": "b"}, F),
    ("f > g", {"f": True, "g": False}, F),
    ("s < 1", {"s": "0"}, F),
    # -- numeric promotion across widths (Java rules)
    ("a = 5.0", {"a": Int8(5)}, T),
    ("a = 5", {"a": 5.0}, T),
    ("a < 5.5", {"a": Int16(5)}, T),
    ("a = 0.1", {"a": Float32(0.1)}, F),  # 0.1f widened to double is not 0.1d
    ("a = 0.5", {"a": Float32(0.5)}, T),
    ("a = 0.1F", {"a": Float32(0.1)}, T),
    ("a = 0.1F", {"a": 0.1}, F),
    ("a = 16777217", {"a": Float32(16777216.0)}, T),  # long -> float rounds 2^24+1
    ("a > 16777216", {"a": Float32(16777216.0)}, F),
    ("a = 9007199254740992.0", {"a": Int64(2**53 + 1)}, T),  # long -> double rounds
    ("a = b", {"a": Int8(-3), "b": Int64(-3)}, T),
    ("a = b", {"a": UInt8(200), "b": Int16(200)}, T),
    ("a < b", {"a": Int32(-1), "b": UInt64(2**64 - 1)}, T),
    ("a = b", {"a": UInt32(7), "b": Float32(7.0)}, T),
    ("a > b", {"a": Float32(1.5), "b": Int8(1)}, T),
    ("a = b", {"a": Float32(0.1), "b": 0.1}, F),
    ("a = b", {"a": Float32(0.25), "b": 0.25}, T),
    ("a = a", {"a": float("nan")}, F),
    ("a <> a", {"a": float("nan")}, T),
    ("a > 1000", {"a": float("inf")}, T),
    # -- arithmetic: precedence, associativity, Java long and float semantics
    ("a + b * c = 7", {"a": 1, "b": 2, "c": 3}, T),
    ("(a + b) * c = 9", {"a": 1, "b": 2, "c": 3}, T),
    ("a - b - c = -4", {"a": 1, "b": 2, "c": 3}, T),
    ("a - (b - c) = 2", {"a": 1, "b": 2, "c": 3}, T),
    ("a * b / c = 2", {"a": 4, "b": 3, "c": 6}, T),
    ("-a = -1", {"a": 1}, T),
    ("- -a = 1", {"a": 1}, T),
    ("+a = 1", {"a": 1}, T),
    ("-a * -b = 2", {"a": 1, "b": 2}, T),
    ("a / b = 2", {"a": 7, "b": 3}, T),
    ("a / b = -2", {"a": -7, "b": 3}, T),  # truncates toward zero, not floor
    ("a / 2 = 3.5", {"a": 7.0}, T),
    ("a / 2 = 3.5", {"a": Int32(7)}, F),  # integer division
    ("a / 2 = 3", {"a": Int32(7)}, T),
    ("a / 0 > 1", {"a": 1}, U),
    ("a / 0.0 > 1", {"a": 1.0}, U),
    ("a / b = 1", {"a": 1, "b": 0.0}, U),
    ("a + 1 = 2", {}, U),
    ("a + 1 = 2", {"a": "1"}, U),
    ("a + 1 = 2", {"a": True}, U),
    ("-a = -1", {"a": "1"}, U),
    ("+a = 1", {"a": True}, U),
    ("a + 1 < 0", {"a": Int64(2**63 - 1)}, T),  # long wraps around
    ("a + 1 = 2147483648", {"a": Int32(2**31 - 1)}, T),  # narrower ints compute as long
    ("-a < 0", {"a": Int64(-(2**63))}, T),  # -Long.MIN_VALUE is Long.MIN_VALUE
    ("a * 3 = 0.3F", {"a": Float32(0.1)}, T),  # float arithmetic rounds to float32
    ("a * 3 = 0.3F", {"a": 0.1}, F),
    ("a + b = 0.3", {"a": 0.1, "b": 0.2}, F),
    ("a * 2 = 3", {"a": Float32(1.5)}, T),
    ("a * b > 1E38", {"a": Float32(3e38), "b": Float32(10.0)}, T),  # overflows to +inf
    ("a + 0.5 = 2", {"a": Int8(1)}, F),
    ("a + 0.5 = 1.5", {"a": Int8(1)}, T),
    ("a + b + c + d = 10", {"a": 1, "b": 2, "c": 3, "d": 4}, T),
    ("a + b + c + d = 10", {"a": 1, "b": 2, "d": 4}, U),
    # -- S1, S2: BETWEEN is inclusive; NOT BETWEEN is < OR >
    ("age BETWEEN 5 AND 9", {"age": 5}, T),
    ("age BETWEEN 5 AND 9", {"age": 9}, T),
    ("age BETWEEN 5 AND 9", {"age": 10}, F),
    ("age BETWEEN 5 AND 9", {"age": 4}, F),
    ("age BETWEEN 5 AND 9", {"age": Int8(7)}, T),
    ("age BETWEEN 5 AND 9", {"age": 4.999}, F),
    ("age BETWEEN 5 AND 9", {"age": 9.0}, T),
    ("age BETWEEN 5 AND 9", {"age": 9.0001}, F),
    ("age BETWEEN 5 AND 9", {}, U),
    ("age NOT BETWEEN 5 AND 9", {"age": 5}, F),
    ("age NOT BETWEEN 5 AND 9", {"age": 9}, F),
    ("age NOT BETWEEN 5 AND 9", {"age": 10}, T),
    ("age NOT BETWEEN 5 AND 9", {"age": 4}, T),
    ("age NOT BETWEEN 5 AND 9", {}, U),
    ("age BETWEEN 9 AND 5", {"age": 7}, F),
    ("age BETWEEN 5 AND 9", {"age": "7"}, F),
    ("age NOT BETWEEN 5 AND 9", {"age": "7"}, F),
    ("age BETWEEN 5.5 AND 9.5", {"age": Int32(9)}, T),
    ("age BETWEEN 5.5 AND 9.5", {"age": Int32(5)}, F),
    ("age BETWEEN 0 AND 10000000000", {"age": 9999999999}, T),
    ("age BETWEEN lo AND hi", {"age": 5, "lo": 5, "hi": 9}, T),
    ("age BETWEEN lo AND hi", {"age": 7, "lo": 5}, U),
    ("age BETWEEN lo AND hi", {"age": 3, "lo": 5}, F),
    ("age NOT BETWEEN lo AND hi", {"age": 3, "lo": 5}, T),
    ("age NOT BETWEEN lo AND hi", {"age": 7, "lo": 5}, U),
    ("a + 1 BETWEEN b AND b * 2", {"a": 4, "b": 3}, T),
    ("a BETWEEN 1 AND 2 AND b = 1", {"a": 1, "b": 1}, T),
    # -- S3: IN and NOT IN; a NULL identifier is UNKNOWN either way
    ("color IN ('red','blue')", {"color": "red"}, T),
    ("color IN ('red','blue')", {"color": "blue"}, T),
    ("color IN ('red','blue')", {"color": "green"}, F),
    ("color IN ('red','blue')", {}, U),
    ("color NOT IN ('red','blue')", {"color": "green"}, T),
    ("color NOT IN ('red','blue')", {"color": "red"}, F),
    ("color NOT IN ('red','blue')", {}, U),
    ("color IN ('red')", {"color": 1}, F),
    ("color NOT IN ('red')", {"color": 1}, F),
    ("color IN ('Red')", {"color": "red"}, F),
    ("c IN ('a','b')", {"c": Char("b")}, T),
    ("q IN ('it''s', 'x')", {"q": "it's"}, T),
    ("q IN ('')", {"q": ""}, T),
    # -- S4, S5: LIKE with _ and %, ESCAPE; non-strings are FALSE either way
    ("name LIKE 'a_c%'", {"name": "abc"}, T),
    ("name LIKE 'a_c%'", {"name": "abcdef"}, T),
    ("name LIKE 'a_c%'", {"name": "ac"}, F),
    ("name LIKE 'a_c%'", {"name": "abbc"}, F),
    ("name LIKE 'a_c%'", {"name": "a\nc"}, T),
    ("name LIKE 'a_c%'", {}, U),
    ("name LIKE 'a_c%'", {"name": 5}, F),
    ("name NOT LIKE 'a_c%'", {"name": "abc"}, F),
    ("name NOT LIKE 'a_c%'", {"name": "xyz"}, T),
    ("name NOT LIKE 'a_c%'", {}, U),
    ("name NOT LIKE 'a_c%'", {"name": 5}, F),
    ("code LIKE '10\\%' ESCAPE '\\'", {"code": "10%"}, T),
    ("code LIKE '10\\%' ESCAPE '\\'", {"code": "100"}, F),
    ("code LIKE '10\\%' ESCAPE '\\'", {"code": "10"}, F),
    ("code LIKE '10\\%' ESCAPE '\\'", {"code": "10%x"}, F),
    ("code NOT LIKE '10\\%' ESCAPE '\\'", {"code": "100"}, T),
    ("code LIKE 'a!_b' ESCAPE '!'", {"code": "a_b"}, T),
    ("code LIKE 'a!_b' ESCAPE '!'", {"code": "axb"}, F),
    ("code LIKE 'a!!b' ESCAPE '!'", {"code": "a!b"}, T),
    ("code LIKE '%!%' ESCAPE '!'", {"code": "50%"}, T),
    ("code LIKE '%!%' ESCAPE '!'", {"code": "50"}, F),
    ("code LIKE '10\\%'", {"code": "10\\xyz"}, T),  # no ESCAPE: the backslash is ordinary
    ("s LIKE '%%'", {"s": ""}, T),
    ("s LIKE ''", {"s": ""}, T),
    ("s LIKE ''", {"s": "a"}, F),
    ("s LIKE '%'", {"s": ""}, T),
    ("s LIKE '%'", {"s": "x"}, T),
    ("s LIKE 'ab%'", {"s": "abc"}, T),
    ("s LIKE 'ab%'", {"s": "xab"}, F),
    ("s LIKE '%ab'", {"s": "xab"}, T),
    ("s LIKE '%ab'", {"s": "abx"}, F),
    ("s LIKE '%ab%'", {"s": "xaby"}, T),
    ("s LIKE '%ab%'", {"s": "ba"}, F),
    ("s LIKE 'abc'", {"s": "abc"}, T),
    ("s LIKE 'abc'", {"s": "abcd"}, F),
    ("s LIKE 'a.c'", {"s": "abc"}, F),
    ("s LIKE 'a.c'", {"s": "a.c"}, T),
    ("s LIKE '[x]%'", {"s": "[x]y"}, T),
    ("s LIKE '_'", {"s": "é"}, T),
    ("s LIKE '_'", {"s": ""}, F),
    ("s LIKE '_'", {"s": "ab"}, F),
    ("s LIKE 'a%b%c'", {"s": "aXbYc"}, T),
    ("s LIKE 'a%b%c'", {"s": "acb"}, F),
    ("s LIKE 'A%'", {"s": "abc"}, F),
    ("s LIKE 'x%'", {"s": Char("x")}, T),
    # -- S9: IS [NOT] NULL
    ("p IS NULL", {}, T),
    ("p IS NULL", {"p": 1}, F),
    ("p IS NULL", {"p": ""}, F),
    ("p IS NULL", {"p": False}, F),
    ("p IS NOT NULL", {}, F),
    ("p IS NOT NULL", {"p": 0}, T),
    # -- S8: identifiers are case-sensitive, reserved words and operators are not
    ("Color = 'red'", {"color": "red"}, U),
    ("color = 'red'", {"color": "red"}, T),
    ("Color = 'red'", {"Color": "red"}, T),
    ("f = true", {"f": True}, T),
    ("f = True", {"f": True}, T),
    ("f = false", {"f": True}, F),
    ("a = 1 and b = 2 Or c = 3", {"c": 3}, T),
    ("c in ('x')", {"c": "x"}, T),
    ("c iS nOt NuLl", {"c": "x"}, T),
    ("a bEtWeEn 1 AnD 2", {"a": 2}, T),
    ("n LiKe 'x!%' EsCaPe '!'", {"n": "x%"}, T),
    ("not f", {"f": False}, T),
    ("$x = 1", {"$x": 1}, T),
    ("_y2 = 1", {"_y2": 1}, T),
    ("a$b_c9 = 1", {"a$b_c9": 1}, T),
    ("orange = 1", {"orange": 1}, T),
    ("NOTE = 1", {"NOTE": 1}, T),
    ("isx = 1 AND inx = 2", {"isx": 1, "inx": 2}, T),
    ("andy", {"andy": True}, T),
    ("éclair = 'x'", {"éclair": "x"}, T),
    ("nulls IS NULL", {}, T),
    # -- literal forms (EMS User's Guide, "Message Selectors"; Java literal syntax)
    ("a = 57", {"a": 57}, T),
    ("a = -957", {"a": -957}, T),
    ("a = +62", {"a": 62}, T),
    ("a = 7.", {"a": 7.0}, T),
    ("a = .5", {"a": 0.5}, T),
    ("a = -95.7", {"a": -95.7}, T),
    ("a = +6.2", {"a": 6.2}, T),
    ("a = 7E3", {"a": 7000}, T),
    ("a = -57.9E2", {"a": -5790.0}, T),
    ("a = 1e-3", {"a": 0.001}, T),
    ("a = 1.e2", {"a": 100}, T),
    ("a = 2.5D", {"a": 2.5}, T),
    ("a = 1.5F", {"a": Float32(1.5)}, T),
    ("a = 3f", {"a": 3.0}, T),
    ("a = 0x1F", {"a": 31}, T),
    ("a = 0X1f", {"a": 31}, T),
    ("a = 017", {"a": 15}, T),
    ("a = 0", {"a": 0}, T),
    ("a = 00", {"a": 0}, T),
    ("a = 10L", {"a": 10}, T),
    ("a = 0xFFFFFFFFFFFFFFFF", {"a": -1}, T),  # a 64-bit hex literal is two's complement
    ("a = 0x7FFFFFFFFFFFFFFFL", {"a": Int64(2**63 - 1)}, T),
    ("a = -9223372036854775808", {"a": Int64(-(2**63))}, T),
    ("a = 9223372036854775807", {"a": Int64(2**63 - 1)}, T),
    ("a = - -9223372036854775808", {"a": Int64(-(2**63))}, T),  # -Long.MIN_VALUE wraps
    ("a = -(-(-(9223372036854775807)))", {"a": -(2**63) + 1}, T),
    # -- white space (EMS User's Guide, "Message Selectors") and precedence NOT > AND > OR
    ("a\t=\n1\fAND\r\nb = 2", {"a": 1, "b": 2}, T),
    ("a = 1 OR b = 1 AND c = 1", {"a": 1, "b": 0, "c": 0}, T),
    ("(a = 1 OR b = 1) AND c = 1", {"a": 1, "b": 0, "c": 0}, F),
    ("NOT a = 1 AND b = 1", {"a": 2, "b": 1}, T),
    ("NOT (a = 1 AND b = 1)", {"a": 1, "b": 2}, T),
    ("NOT NOT f", {"f": True}, T),
    ("NOT NOT NOT f", {"f": True}, F),
    ("NOT NOT x", {"x": 5}, F),
    ("NOT NOT x", {}, U),
    ("((((a = 1))))", {"a": 1}, T),
]


@pytest.mark.parametrize(("text", "props", "expected"), PROPERTY_ROWS)
def test_property_rows(text: str, props: dict[str, Any], expected: bool | None) -> None:
    assert _result(text, _msg(props)) is expected


HEADER_ROWS: list[tuple[str, dict[str, Any], bool | None]] = [
    ("JMSPriority = 4", {}, T),  # JMS default priority
    ("JMSPriority > 5", {"priority": 7}, T),
    ("JMSPriority BETWEEN 0 AND 4", {"priority": 9}, F),
    ("JMSDeliveryMode = 'PERSISTENT'", {}, T),
    ("JMSDeliveryMode = 'PERSISTENT'", {"delivery_mode": DeliveryMode.NON_PERSISTENT}, F),
    ("JMSDeliveryMode = 'NON_PERSISTENT'", {"delivery_mode": DeliveryMode.NON_PERSISTENT}, T),
    ("JMSDeliveryMode IN ('PERSISTENT')", {}, T),
    ("JMSType = 'order'", {"type": "order"}, T),
    ("JMSType = 'order'", {"type": "invoice"}, F),
    ("JMSType = 'order'", {}, U),
    ("JMSType IS NULL", {}, T),
    ("JMSCorrelationID = 'abc'", {"correlation_id": "abc"}, T),
    ("JMSCorrelationID = 'abc'", {"correlation_id": b"abc"}, T),
    ("JMSCorrelationID LIKE 'ab%'", {"correlation_id": "abz"}, T),
    ("JMSCorrelationID IS NULL", {}, T),
    ("JMSMessageID = 'ID:1'", {"message_id": "ID:1"}, T),
    ("JMSMessageID IS NOT NULL", {}, F),
    ("JMSTimestamp > 1000", {"timestamp": 2000}, T),
    ("JMSTimestamp > 1000", {"timestamp": 0}, F),
    ("JMSExpiration = 0", {}, T),
    ("JMSRedelivered", {}, F),
    ("NOT JMSRedelivered", {}, T),
    ("JMSDestination = 'orders.eu'", {"destination": Destination.topic("orders.eu")}, T),
    ("jmspriority = 4", {}, U),  # header names are identifiers: case-sensitive
]


@pytest.mark.parametrize(("text", "headers", "expected"), HEADER_ROWS)
def test_header_rows(text: str, headers: dict[str, Any], expected: bool | None) -> None:
    assert _result(text, _msg(**headers)) is expected


def test_headers_and_properties_together() -> None:
    s = _sel("JMSPriority > 3 AND color = 'red' AND JMSDeliveryMode = 'PERSISTENT'")
    assert s.matches(_msg({"color": "red"}, priority=9))
    assert not s.matches(_msg({"color": "red"}, priority=1))
    assert not s.matches(_msg({"color": "blue"}, priority=9))


# -- three-valued logic truth tables (EMS User's Guide, "Message Selectors"; SQL / Kleene) ---

AND_TABLE = {
    (T, T): T, (T, F): F, (T, U): U,
    (F, T): F, (F, F): F, (F, U): F,
    (U, T): U, (U, F): F, (U, U): U,
}  # fmt: skip
OR_TABLE = {
    (T, T): T, (T, F): T, (T, U): T,
    (F, T): T, (F, F): F, (F, U): U,
    (U, T): T, (U, F): U, (U, U): U,
}  # fmt: skip
NOT_TABLE = {T: F, F: T, U: U}


def _bool_props(**values: bool | None) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _cmp_props(**values: bool | None) -> dict[str, Any]:
    """``k = 1`` is TRUE for 1, FALSE for 2 and UNKNOWN when k is absent."""
    return {k: (1 if v else 2) for k, v in values.items() if v is not None}


@pytest.mark.parametrize(("x", "y"), list(AND_TABLE))
def test_and_truth_table(x: bool | None, y: bool | None) -> None:
    assert _result("x AND y", _msg(_bool_props(x=x, y=y))) is AND_TABLE[x, y]
    assert _result("x = 1 AND y = 1", _msg(_cmp_props(x=x, y=y))) is AND_TABLE[x, y]


@pytest.mark.parametrize(("x", "y"), list(OR_TABLE))
def test_or_truth_table(x: bool | None, y: bool | None) -> None:
    assert _result("x OR y", _msg(_bool_props(x=x, y=y))) is OR_TABLE[x, y]
    assert _result("x = 1 OR y = 1", _msg(_cmp_props(x=x, y=y))) is OR_TABLE[x, y]


@pytest.mark.parametrize("x", [T, F, U])
def test_not_truth_table(x: bool | None) -> None:
    assert _result("x", _msg(_bool_props(x=x))) is x
    assert _sel("NOT x").matches(_msg(_bool_props(x=x))) is (NOT_TABLE[x] is T)
    assert _sel("NOT x = 1").matches(_msg(_cmp_props(x=x))) is (NOT_TABLE[x] is T)


@pytest.mark.parametrize("z", [T, F, U])
@pytest.mark.parametrize("y", [T, F, U])
@pytest.mark.parametrize("x", [T, F, U])
def test_three_way_chains(x: bool | None, y: bool | None, z: bool | None) -> None:
    m = _msg(_bool_props(x=x, y=y, z=z))
    assert _result("x AND y AND z", m) is AND_TABLE[AND_TABLE[x, y], z]
    assert _result("x OR y OR z", m) is OR_TABLE[OR_TABLE[x, y], z]
    assert _result("x OR y AND z", m) is OR_TABLE[x, AND_TABLE[y, z]]


# -- invalid selectors: the error says where ------------------------------------------------

INVALID: list[tuple[str, int]] = [
    ("a = ", 4),
    ("a == 1", 3),
    ("a != 1", 2),
    ("a = 1 OR", 8),
    ("(a = 1", 6),
    ("a = 1)", 5),
    ("a @ 1", 2),
    ('a = "x"', 4),
    ("a = 'unterminated", 4),
    ("1a = 1", 1),
    ("a = 1 b = 2", 6),
    ("a = b = c", 6),
    ("and = 1", 0),
    ("a = NULL", 4),
    ("NULL IS NULL", 0),
    ("a IS 5", 5),
    ("a IS NOT 5", 9),
    ("a IN ()", 6),
    ("a IN ('x', 5)", 11),
    ("a IN 'x'", 5),
    ("a LIKE 5", 7),
    ("a LIKE b", 7),
    ("a BETWEEN 1", 11),
    ("a BETWEEN 1 OR 2", 12),
    ("\u00a0a = 1", 0),
    # type errors found at compile time
    ("5", 0),
    ("'x'", 0),
    ("a + 1", 0),
    ("'a' + 1 > 2", 0),
    ("1 + 'a' > 2", 4),
    ("TRUE + 1 > 0", 0),
    ("-'a' = 'b'", 1),
    ("(a = 1) * 2 > 0", 1),
    ("a > 'x'", 2),
    ("'x' <= a", 4),
    ("TRUE > FALSE", 5),
    ("f >= TRUE", 2),
    ("'a' = 1", 4),
    ("1 <> TRUE", 2),
    ("(a = 1) = 1", 8),
    ("NOT 5", 4),
    ("a AND 'x'", 6),
    ("3 OR a", 0),
    ("5 LIKE 'a'", 0),
    ("a + 1 LIKE 'a'", 0),
    ("'a' IN ('a')", 0),
    ("(a) = 1 AND a + 1 IS NULL", 12),
    ("a BETWEEN 'x' AND 5", 10),
    ("a BETWEEN 1 AND TRUE", 16),
    ("a LIKE 'x' ESCAPE 'ab'", 18),
    ("a LIKE 'x' ESCAPE ''", 18),
    ("a LIKE 'x!' ESCAPE '!'", 7),
    # literals out of range or malformed
    ("a = 9223372036854775808", 4),
    ("a = 99999999999999999999", 4),
    ("a = 0x10000000000000000", 4),
    ("a = 08", 4),
    ("a = 1e400", 4),
    ("a = 1e39F", 4),
    ("a = 1e5L", 4),
]


@pytest.mark.parametrize(("text", "position"), INVALID)
def test_invalid_selector_position(text: str, position: int) -> None:
    with pytest.raises(InvalidSelectorError) as info:
        compile_selector(text)
    err = info.value
    assert err.position == position
    assert err.selector == text
    assert err.reason == "invalid-selector"
    assert str(err).endswith("\n  " + " " * position + "^")


def test_error_messages_are_specific() -> None:
    cases = {
        "s > 'abc'": "can only be compared with = and <>",  # S7
        "'a' + 1 > 2": r"arithmetic \+ needs a number",
        "5 LIKE 'a'": "LIKE needs an identifier",
        "a = 9223372036854775808": "out of the range of long",
        "a = ": "unexpected end of selector",
        "a != 1": "unexpected character '!'",
        "a LIKE 'x!' ESCAPE '!'": "ends with its escape character",
    }
    for text, fragment in cases.items():
        with pytest.raises(InvalidSelectorError, match=fragment):
            compile_selector(text)


# -- API, cache, nesting ---------------------------------------------------------------------


@pytest.mark.parametrize("text", [None, "", "   ", " \t\r\n\f "])
def test_no_selector_selects_everything(text: str | None) -> None:
    assert compile_selector(text) is None


def test_compiled_once_and_shared() -> None:
    a = compile_selector("shared = 'yes' AND n > 1")
    b = compile_selector("shared = 'yes' AND n > 1")
    assert a is b
    assert a is not compile_selector("shared = 'yes' AND n > 2")


def test_selector_object() -> None:
    s = _sel("a = 1 AND JMSPriority > b OR c IS NULL OR d IN ('x') OR e LIKE 'y%' OR f")
    assert s.text == "a = 1 AND JMSPriority > b OR c IS NULL OR d IN ('x') OR e LIKE 'y%' OR f"
    assert s.identifiers == frozenset({"a", "JMSPriority", "b", "c", "d", "e", "f"})
    assert s == _sel(s.text)
    assert hash(s) == hash(s.text)
    assert s != _sel("a = 1")
    assert "a = 1" in repr(s)
    clone = pickle.loads(pickle.dumps(s))
    assert clone.text == s.text and clone.matches(_msg({"f": True}))
    assert _sel("TRUE").identifiers == frozenset()


def test_matches_reads_only_header() -> None:
    class Stub:
        def __init__(self, values: dict[str, Any]) -> None:
            self.values = values
            self.read: list[str] = []

        def header(self, name: str) -> Any:
            self.read.append(name)
            return self.values.get(name)

    s = _sel("color = 'red' AND weight > 10")
    stub = Stub({"color": "red", "weight": 11})
    assert s.matches(stub) is True
    assert stub.read == ["color", "weight"]
    stub = Stub({"color": "blue", "weight": 11})
    assert s.matches(stub) is False
    assert stub.read == ["color"]  # AND stops at the first FALSE


def _nested(depth: int) -> str:
    """Alternating AND / OR levels, so nothing flattens: (x = 1) under ``depth`` levels."""
    text = "x = 1"
    for i in range(depth):
        text = ("a = 1 AND (" if i % 2 else "b = 1 OR (") + text + ")"
    return text


def test_deep_nesting_compiles_and_evaluates() -> None:
    s = _sel(_nested(MAX_NESTING - 10))
    assert s.matches(_msg({"a": 1, "b": 2, "x": 1}))
    assert not s.matches(_msg({"a": 1, "b": 2, "x": 2}))
    assert s.matches(_msg({"a": 1, "b": 1}))
    assert _result(_nested(MAX_NESTING - 10), _msg({"a": 1, "b": 2})) is None


def test_too_deep_is_rejected() -> None:
    with pytest.raises(InvalidSelectorError, match="nests deeper"):
        compile_selector(_nested(MAX_NESTING + 10))
    with pytest.raises(InvalidSelectorError, match="nests deeper"):
        compile_selector("(" * 300 + "a" + " + 1) * 2" * 300 + " > 0")
    # a same-level run flattens instead of nesting, however it is parenthesized
    assert _sel("(" * 300 + "a" + " + 1)" * 300 + " = 301").matches(_msg({"a": 1}))


def test_long_flat_selectors() -> None:
    """S10's shape, much longer: long OR runs, sums and IN lists stay flat."""
    names = ["p" + str(i) for i in range(3000)]
    s = _sel(" OR ".join(n + " = " + str(i) for i, n in enumerate(names)))
    assert s.matches(_msg({"p2999": 2999}))
    assert not s.matches(_msg({"p2999": 1}))
    total = _sel(" + ".join(["a"] * 1000) + " = 1000")
    assert total.matches(_msg({"a": 1}))
    many = _sel("c IN (" + ", ".join("'v" + str(i) + "'" for i in range(2000)) + ")")
    assert many.matches(_msg({"c": "v1999"}))
    assert not many.matches(_msg({"c": "v2000"}))


def test_26_way_or_from_the_guide() -> None:
    """The 26-way OR of the selector_logical_operator_limit example (EMS User's Guide,
    "tibemsd.conf"), read as a=1 ... z=26."""
    text = " or ".join(chr(ord("a") + i) + "=" + str(i + 1) for i in range(26))
    s = _sel(text)
    assert s.matches(_msg({"z": 26}))
    assert not s.matches(_msg({"z": 25}))
    assert len(s.identifiers) == 26


# -- hypothesis ------------------------------------------------------------------------------

TOKENS = [
    "a", "b", "JMSPriority", "'x'", "'it''s'", "1", "-2", "3.5", "0x1F", "7E3", ".5", "1F",
    "(", ")", ",", "=", "<>", "<", "<=", ">", ">=", "+", "-", "*", "/", "AND", "OR", "NOT",
    "BETWEEN", "IN", "LIKE", "ESCAPE", "IS", "NULL", "TRUE", "FALSE", "'%'", "'_'", "'!'",
]  # fmt: skip


def _compile_or_reject(text: str) -> None:
    try:
        s = compile_selector(text)
    except InvalidSelectorError as exc:
        assert exc.position is None or 0 <= exc.position <= len(text)
        return
    if s is not None:
        assert isinstance(s.matches(_msg({"a": 1, "b": "x"})), bool)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_random_text_raises_only_invalid_selector(text: str) -> None:
    _compile_or_reject(text)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(TOKENS), max_size=20).map(" ".join))
def test_random_token_soup_raises_only_invalid_selector(text: str) -> None:
    _compile_or_reject(text)


IDENTS = ["a", "b", "c", "s", "JMSPriority", "JMSType"]

VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-128, 127).map(Int8),
    st.integers(-(2**15), 2**15 - 1).map(Int16),
    st.integers(-(2**31), 2**31 - 1).map(Int32),
    st.integers(0, 2**64 - 1).map(UInt64),
    st.integers(0, 2**16 - 1).map(UInt16),
    st.floats(),
    st.floats(width=32).map(Float32),
    st.text(max_size=4),
    st.characters(max_codepoint=0xFFFF).map(Char),
    st.binary(max_size=2),
    st.lists(st.integers(0, 3), max_size=2),
)

_IDENT = st.sampled_from(IDENTS)
_INT_LIT = st.integers(-(2**63), 2**63 - 1).map(str)
_FLOAT_LIT = st.floats(allow_nan=False, allow_infinity=False).map(repr)
_STR_LIT = st.text(alphabet="ab'%_!", max_size=4).map(lambda s: "'" + s.replace("'", "''") + "'")
_PATTERN = st.lists(st.sampled_from(["a", "b", "%", "_", "!%", "!_", "!!", "''"]), max_size=5).map(
    lambda parts: "'" + "".join(parts) + "'"
)
_NUM = st.recursive(
    st.one_of(_IDENT, _INT_LIT, _FLOAT_LIT, st.sampled_from(["0x7F", "017", "2.5F", "7."])),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["+", "-", "*", "/"]), inner).map(
            lambda t: "(" + t[0] + " " + t[1] + " " + t[2] + ")"
        ),
        inner.map(lambda x: "-(" + x + ")"),
    ),
    max_leaves=6,
)
_STR = st.one_of(_IDENT, _STR_LIT)
_ATOM = st.one_of(
    st.tuples(_NUM, st.sampled_from(["=", "<>", "<", "<=", ">", ">="]), _NUM).map(" ".join),
    st.tuples(_STR, st.sampled_from(["=", "<>"]), _STR).map(" ".join),
    st.tuples(_IDENT, st.sampled_from(["=", "<>"]), st.sampled_from(["TRUE", "FALSE"])).map(
        " ".join
    ),
    st.tuples(_NUM, st.sampled_from(["BETWEEN", "NOT BETWEEN"]), _NUM, _NUM).map(
        lambda t: t[0] + " " + t[1] + " " + t[2] + " AND " + t[3]
    ),
    st.tuples(
        _IDENT, st.sampled_from(["IN", "NOT IN"]), st.lists(_STR_LIT, min_size=1, max_size=3)
    ).map(lambda t: t[0] + " " + t[1] + " (" + ", ".join(t[2]) + ")"),
    st.tuples(_IDENT, st.sampled_from(["LIKE", "NOT LIKE"]), _PATTERN, st.booleans()).map(
        lambda t: t[0] + " " + t[1] + " " + t[2] + (" ESCAPE '!'" if t[3] else "")
    ),
    st.tuples(_IDENT, st.sampled_from(["IS NULL", "IS NOT NULL"])).map(" ".join),
    _IDENT,
    st.sampled_from(["TRUE", "FALSE"]),
)
_CONDITION = st.recursive(
    _ATOM,
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["AND", "OR"]), inner).map(
            lambda t: "(" + t[0] + ") " + t[1] + " (" + t[2] + ")"
        ),
        inner.map(lambda x: "NOT (" + x + ")"),
        inner.map(lambda x: "(" + x + ") = TRUE"),
    ),
    max_leaves=8,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_CONDITION, st.dictionaries(st.sampled_from(IDENTS), VALUES, max_size=6))
def test_valid_expressions_never_raise(text: str, props: dict[str, Any]) -> None:
    s = compile_selector(text)  # a valid expression must compile
    assert s is not None
    m = _msg(props)
    positive = s.matches(m)
    negative = _sel("NOT (" + text + ")").matches(m)
    assert isinstance(positive, bool) and isinstance(negative, bool)
    assert not (positive and negative)


# Logic trees over atoms whose truth is set per example, checked against Kleene's tables.
_LOGIC_ATOM = st.sampled_from(["p0", "p1", "p2", "q0 = 1", "q1 = 1", "q2 = 1"])
_LOGIC = st.recursive(
    _LOGIC_ATOM,
    lambda inner: st.one_of(
        st.tuples(st.sampled_from(["AND", "OR"]), st.lists(inner, min_size=2, max_size=4)),
        st.tuples(st.just("NOT"), st.lists(inner, min_size=1, max_size=1)),
    ),
    max_leaves=40,
)


def _render(tree: Any) -> str:
    if isinstance(tree, str):
        return tree
    op: str = tree[0]
    items: list[Any] = tree[1]
    if op == "NOT":
        return "NOT (" + _render(items[0]) + ")"
    return "(" + (" " + op + " ").join(_render(i) for i in items) + ")"


def _kleene(tree: Any, truth: dict[str, bool | None]) -> bool | None:
    rank = {F: 0, U: 1, T: 2}
    back = {0: F, 1: U, 2: T}
    if isinstance(tree, str):
        return truth[tree.split()[0]]
    op, items = tree
    ranks = [rank[_kleene(i, truth)] for i in items]
    if op == "NOT":
        return back[2 - ranks[0]]
    return back[min(ranks) if op == "AND" else max(ranks)]


@settings(max_examples=300, deadline=None)
@given(_LOGIC, st.lists(st.sampled_from([T, F, U]), min_size=6, max_size=6))
def test_logic_matches_kleene(tree: Any, truths: list[bool | None]) -> None:
    names = ["p0", "p1", "p2", "q0", "q1", "q2"]
    truth = dict(zip(names, truths, strict=True))
    props: dict[str, Any] = {}
    for name, value in truth.items():
        if value is not None:
            props[name] = value if name[0] == "p" else (1 if value else 2)
    assert _result(_render(tree), _msg(props)) is _kleene(tree, truth)


# The generated code inlines comparisons with a literal; the general helpers compare two
# identifiers. Both must give the same three-valued answer for every kind of value.
_OPERANDS = st.one_of(
    st.none(),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**25), 2**25),
    st.integers(-128, 127).map(Int8),
    st.integers(0, 2**64 - 1).map(UInt64),
    st.floats(),
    st.floats(width=32).map(Float32),
    st.sampled_from([16777217, 2**53 + 1, -(2**24) - 1, "1", True, Char("1")]),
)
_LITERALS = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(lambda i: (str(i), i)),
    st.integers(-(2**25), 2**25).map(lambda i: (str(i), i)),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: (repr(f), f)),
    st.floats(width=32, allow_nan=False, allow_infinity=False).map(
        lambda f: (repr(f) + "F", Float32(f))
    ),
    st.sampled_from([("'1'", "1"), ("TRUE", True), ("FALSE", False)]),
)


@settings(max_examples=400, deadline=None)
@given(_OPERANDS, _LITERALS, _LITERALS, st.sampled_from(["=", "<>", "<", "<=", ">", ">="]))
def test_inlined_literal_comparisons_agree_with_helpers(
    x: Any, lit: tuple[str, Any], lit2: tuple[str, Any], op: str
) -> None:
    text, value = lit
    m = _msg({k: v for k, v in {"x": x, "y": value, "z": lit2[1]}.items() if v is not None})
    if op in ("=", "<>") or not isinstance(value, (str, bool)):
        assert _result("x " + op + " " + text, m) is _result("x " + op + " y", m)
        assert _result(text + " " + op + " x", m) is _result("y " + op + " x", m)
    if not isinstance(value, (str, bool)) and not isinstance(lit2[1], (str, bool)):
        for form in ("x BETWEEN {} AND {}", "x NOT BETWEEN {} AND {}"):
            inlined = _result(form.format(text, lit2[0]), m)
            assert inlined is _result(form.format("y", "z"), m)
