"""The MESSAGE header block the server encodes once per message (adapters/stomp/server.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.stomp.codec import Parser
from adapters.stomp.server import header_block

_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
_headers = st.lists(st.tuples(_text.filter(bool), _text), max_size=8)


def parse(block: bytes, version: str) -> list[tuple[str, str]]:
    p = Parser()
    p.version = version
    (frame,) = p.feed(b"MESSAGE\n" + block + b"\x00")
    return frame.headers


def test_colons_backslashes_and_line_breaks_are_escaped_in_1_2():
    block = header_block([("destination", "/queue/a"), ("k:x", "v\\1\n2\r3")], "1.2")
    assert block == b"destination:/queue/a\nk\\cx:v\\\\1\\n2\\r3\n\n"


def test_the_stand_in_characters_in_a_value_are_escaped_one_by_one():
    block = header_block([("t", "a\x01b\x02c:d")], "1.2")
    assert block == b"t:a\x01b\x02c\\cd\n\n"


def test_1_1_leaves_out_a_header_holding_a_carriage_return():
    block = header_block([("a", "x:y"), ("b", "1\r2"), ("c", "3\n4")], "1.1")
    assert block == b"a:x\\cy\nc:3\\n4\n\n"


def test_1_0_leaves_out_what_it_cannot_carry_and_escapes_nothing():
    block = header_block([("a", "x:y\\z"), ("b", "1\n2"), ("c:d", "e")], "1.0")
    assert block == b"a:x:y\\z\n\n"


@settings(max_examples=300, deadline=None)
@given(_headers)
def test_1_2_blocks_parse_back_to_the_same_headers(headers):
    assert parse(header_block(headers, "1.2"), "1.2") == headers


@settings(max_examples=300, deadline=None)
@given(_headers)
def test_1_1_blocks_parse_back_to_the_headers_without_carriage_returns(headers):
    kept = [(n, v) for n, v in headers if "\r" not in n and "\r" not in v]
    assert parse(header_block(headers, "1.1"), "1.1") == kept
