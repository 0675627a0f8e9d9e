"""The STOMP frame codec: byte-exact vectors both ways, errors, limits, chunking, hypothesis.

Every vector is literal wire bytes next to the literal frame they mean (STOMP 1.2 "Frames and
Headers", "Value Encoding"; 1.1 and 1.0 escaping rules), so a test can fail in either
direction. Fuzzing holds the codec to its contract: frames or StompError, nothing else.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.stomp.codec import (
    HEARTBEAT,
    Frame,
    FrameTooLarge,
    Parser,
    StompError,
    encode,
    encode_frame,
    escape,
    negotiate_version,
)
from gateway.errors import LocalProtocolError, RemoteProtocolError

FUZZ = settings(max_examples=250, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def parse(data: bytes, version: str = "1.2", **limits: int) -> list[Frame]:
    parser = Parser(**limits)
    parser.version = version
    return parser.feed(data)


# (id, version, wire bytes, frame): parse(wire) == [frame] and encode(frame) == wire.
BOTH_WAYS: list[tuple[str, str, bytes, Frame]] = [
    ("CONNECT-never-unescaped", "1.2",
     b"CONNECT\naccept-version:1.0,1.1,1.2\nhost:gw\nlogin:guest\npasscode:a\\cb:c\n"
     b"heart-beat:10000,10000\n\n\x00",
     Frame("CONNECT", [("accept-version", "1.0,1.1,1.2"), ("host", "gw"), ("login", "guest"),
                       ("passcode", "a\\cb:c"), ("heart-beat", "10000,10000")])),
    ("STOMP-never-unescaped", "1.1",
     b"STOMP\naccept-version:1.1\nhost:gw\npasscode:x\\y\n\n\x00",
     Frame("STOMP", [("accept-version", "1.1"), ("host", "gw"), ("passcode", "x\\y")])),
    ("CONNECTED-never-unescaped", "1.2",
     b"CONNECTED\nversion:1.2\nsession:s\\n1\nserver:gw/0.1\nheart-beat:0,5000\n\n\x00",
     Frame("CONNECTED", [("version", "1.2"), ("session", "s\\n1"), ("server", "gw/0.1"),
                         ("heart-beat", "0,5000")])),
    ("SEND-1.2", "1.2",
     b"SEND\ndestination:/queue/a\\cb\ncontent-type:text/plain\ncontent-length:5\n\nhello\x00",
     Frame("SEND", [("destination", "/queue/a:b"), ("content-type", "text/plain"),
                    ("content-length", "5")], b"hello")),
    ("SEND-1.0-no-escaping", "1.0",
     b"SEND\ndestination:/queue/a\\cb\nJMSType:a:b\n\nhello\x00",
     Frame("SEND", [("destination", "/queue/a\\cb"), ("JMSType", "a:b")], b"hello")),
    ("SEND-1.0-spaces-kept", "1.0",
     b"SEND\ndestination: /queue/a \n\n\x00",
     Frame("SEND", [("destination", " /queue/a ")])),
    ("SUBSCRIBE-1.2", "1.2",
     b"SUBSCRIBE\nid:0\ndestination:/topic/t.>\nack:client-individual\n"
     b"selector:a = 'x\\\\y'\n\n\x00",
     Frame("SUBSCRIBE", [("id", "0"), ("destination", "/topic/t.>"),
                         ("ack", "client-individual"), ("selector", "a = 'x\\y'")])),
    ("UNSUBSCRIBE-1.1", "1.1", b"UNSUBSCRIBE\nid:sub\\c0\n\n\x00",
     Frame("UNSUBSCRIBE", [("id", "sub:0")])),
    ("ACK-1.2", "1.2", b"ACK\nid:m\\\\1\ntransaction:tx1\n\n\x00",
     Frame("ACK", [("id", "m\\1"), ("transaction", "tx1")])),
    ("NACK-1.1", "1.1", b"NACK\nsubscription:0\nmessage-id:007\n\n\x00",
     Frame("NACK", [("subscription", "0"), ("message-id", "007")])),
    ("BEGIN-1.2", "1.2", b"BEGIN\ntransaction:tx\\n1\n\n\x00",
     Frame("BEGIN", [("transaction", "tx\n1")])),
    ("COMMIT-1.0", "1.0", b"COMMIT\ntransaction:tx\\1\nreceipt:r1\n\n\x00",
     Frame("COMMIT", [("transaction", "tx\\1"), ("receipt", "r1")])),
    ("ABORT-1.2", "1.2", b"ABORT\ntransaction:tx1\n\n\x00",
     Frame("ABORT", [("transaction", "tx1")])),
    ("DISCONNECT-1.2", "1.2", b"DISCONNECT\nreceipt:77\n\n\x00",
     Frame("DISCONNECT", [("receipt", "77")])),
    ("DISCONNECT-no-headers", "1.2", b"DISCONNECT\n\n\x00", Frame("DISCONNECT")),
    ("MESSAGE-1.2-every-escape", "1.2",
     b"MESSAGE\nsubscription:0\nmessage-id:ID\\cgw-1\ndestination:/queue/a\n"
     b"x\\cy:l1\\nl2\\r\\\\end\ncontent-length:3\n\na\x00b\x00",
     Frame("MESSAGE", [("subscription", "0"), ("message-id", "ID:gw-1"),
                       ("destination", "/queue/a"), ("x:y", "l1\nl2\r\\end"),
                       ("content-length", "3")], b"a\x00b")),
    ("MESSAGE-1.1-escapes", "1.1",
     b"MESSAGE\nsubscription:0\nmessage-id:1\ndestination:/queue/a\nnote:a\\nb\\cc\\\\d\n\n"
     b"body\x00",
     Frame("MESSAGE", [("subscription", "0"), ("message-id", "1"), ("destination", "/queue/a"),
                       ("note", "a\nb:c\\d")], b"body")),
    ("RECEIPT-1.2", "1.2", b"RECEIPT\nreceipt-id:77\n\n\x00",
     Frame("RECEIPT", [("receipt-id", "77")])),
    ("ERROR-1.2", "1.2",
     b"ERROR\nmessage:malformed frame received\ncontent-type:text/plain\ncontent-length:9\n\n"
     b"bad frame\x00",
     Frame("ERROR", [("message", "malformed frame received"), ("content-type", "text/plain"),
                     ("content-length", "9")], b"bad frame")),
    ("repeated-headers-kept", "1.2", b"MESSAGE\nfoo:World\nfoo:Hello\n\n\x00",
     Frame("MESSAGE", [("foo", "World"), ("foo", "Hello")])),
    ("content-length-leading-zeros", "1.2", b"SEND\ncontent-length:002\n\nhi\x00",
     Frame("SEND", [("content-length", "002")], b"hi")),
    ("empty-value", "1.2", b"SEND\nx-empty:\n\n\x00", Frame("SEND", [("x-empty", "")])),
    ("utf-8", "1.2", "SEND\ndestination:/queue/café\nx-中:😀\n\n\x00".encode(),
     Frame("SEND", [("destination", "/queue/café"), ("x-中", "😀")])),
]

# (id, version, wire bytes, frames): input the encoder never writes.
PARSE_ONLY: list[tuple[str, str, bytes, list[Frame]]] = [
    ("crlf", "1.2", b"SEND\r\ndestination:/queue/a\r\ncontent-length:2\r\n\r\nhi\x00",
     [Frame("SEND", [("destination", "/queue/a"), ("content-length", "2")], b"hi")]),
    ("crlf-1.0", "1.0", b"SEND\r\ndestination:/queue/a\r\n\r\nhi\x00",
     [Frame("SEND", [("destination", "/queue/a")], b"hi")]),
    ("mixed-eol", "1.2", b"SEND\ndestination:/queue/a\r\n\nhi\x00",
     [Frame("SEND", [("destination", "/queue/a")], b"hi")]),
    ("crlf-then-lf-frame", "1.2", b"SEND\r\nd:1\r\n\r\n\xff\x00SEND\nd:2\n\n\n\n\x00",
     [Frame("SEND", [("d", "1")], b"\xff"), Frame("SEND", [("d", "2")], b"\n\n")]),
    ("first-content-length-wins", "1.2", b"SEND\ncontent-length:1\ncontent-length:5\n\nx\x00",
     [Frame("SEND", [("content-length", "1"), ("content-length", "5")], b"x")]),
    ("raw-colon-in-value", "1.2", b"SEND\nselector:a:b\n\n\x00",
     [Frame("SEND", [("selector", "a:b")])]),
    ("body-without-content-length-ends-at-nul", "1.2", b"SEND\n\nab\x00SEND\n\ncd\x00",
     [Frame("SEND", [], b"ab"), Frame("SEND", [], b"cd")]),
    ("content-length-body-is-a-nul", "1.2", b"SEND\ncontent-length:1\n\n\x00\x00",
     [Frame("SEND", [("content-length", "1")], b"\x00")]),
    ("heart-beats-between-frames", "1.2", b"\n\r\n\nACK\nid:1\n\n\x00\n\r\nNACK\nid:2\n\n\x00\n",
     [Frame("ACK", [("id", "1")]), Frame("NACK", [("id", "2")])]),
]

# (id, version, wire bytes, error class, exact message)
ERRORS: list[tuple[str, str, bytes, type[StompError], str]] = [
    ("no-colon", "1.2", b"SEND\ndestination\n\n\x00", StompError,
     "header line has no colon: 'destination'"),
    ("no-colon-1.0", "1.0", b"SEND\nx:1\nbad line\n\n\x00", StompError,
     "header line has no colon: 'bad line'"),
    ("empty-name", "1.2", b"SEND\n:x\n\n\x00", StompError, "header name is empty"),
    ("bad-escape-1.2", "1.2", b"SEND\nd:a\\tb\n\n\x00", StompError,
     "undefined escape sequence in header: \\t (STOMP 1.2)"),
    ("bad-escape-in-name", "1.2", b"SEND\na\\x:b\n\n\x00", StompError,
     "undefined escape sequence in header: \\x (STOMP 1.2)"),
    ("cr-escape-undefined-in-1.1", "1.1", b"SEND\nd:a\\rb\n\n\x00", StompError,
     "undefined escape sequence in header: \\r (STOMP 1.1)"),
    ("lone-trailing-backslash", "1.2", b"SEND\nd:ab\\\n\n\x00", StompError,
     "undefined escape sequence in header: \\ at the end (STOMP 1.2)"),
    ("bad-utf-8-value", "1.2", b"SEND\nd:\xff\n\n\x00", StompError, "header is not valid UTF-8"),
    ("bad-utf-8-crlf", "1.2", b"SEND\r\nd:\xc3\r\n\r\n\x00", StompError,
     "header is not valid UTF-8"),
    ("bad-utf-8-command", "1.0", b"SE\xffND\n\n\x00", StompError, "header is not valid UTF-8"),
    ("command-not-printable", "1.2", b"SE\x01ND\n\n\x00", StompError,
     "malformed command line: 'SE\\x01ND'"),
    ("command-after-stray-cr", "1.2", b"\rSEND\n\n\x00", StompError,
     "CR not followed by LF in a header line"),
    ("bare-cr-in-value", "1.0", b"SEND\nx:a\rb\n\n\x00", StompError,
     "CR not followed by LF in a header line"),
    ("double-cr-before-lf", "1.1", b"SEND\nx:a\r\r\n\n\x00", StompError,
     "CR not followed by LF in a header line"),
    ("command-with-tab", "1.2", b"SE\tND\n\n\x00", StompError,
     "malformed command line: 'SE\\tND'"),
    ("command-not-ascii", "1.2", "SÉND\n\n\x00".encode(), StompError,
     "malformed command line: 'SÉND'"),
    ("command-too-long", "1.2", b"A" * 65 + b"\n\n\x00", StompError,
     "malformed command line: '" + "A" * 64 + "'"),
    ("content-length-letters", "1.2", b"SEND\ncontent-length:abc\n\n\x00", StompError,
     "content-length is not a decimal number: 'abc'"),
    ("content-length-negative", "1.2", b"SEND\ncontent-length:-1\n\n\x00", StompError,
     "content-length is not a decimal number: '-1'"),
    ("content-length-plus", "1.2", b"SEND\ncontent-length:+1\n\nx\x00", StompError,
     "content-length is not a decimal number: '+1'"),
    ("content-length-space", "1.2", b"SEND\ncontent-length: 1\n\nx\x00", StompError,
     "content-length is not a decimal number: ' 1'"),
    ("content-length-empty", "1.2", b"SEND\ncontent-length:\n\n\x00", StompError,
     "content-length is not a decimal number: ''"),
    ("content-length-arabic-digit", "1.2", "SEND\ncontent-length:٣\n\nabc\x00".encode(),
     StompError, "content-length is not a decimal number: '٣'"),
    ("content-length-huge", "1.2", b"SEND\ncontent-length:" + b"9" * 5000 + b"\n\n", FrameTooLarge,
     "content-length " + "9" * 40 + " over the limit of 16777216 octets"),
    ("missing-nul-after-body", "1.2", b"SEND\ncontent-length:2\n\nabc\x00", StompError,
     "frame body longer than content-length (no NUL after it)"),
]


@pytest.mark.parametrize(("version", "wire", "frame"), [v[1:] for v in BOTH_WAYS],
                         ids=[v[0] for v in BOTH_WAYS])
def test_vector_parses(version: str, wire: bytes, frame: Frame) -> None:
    assert parse(wire, version) == [frame]


@pytest.mark.parametrize(("version", "wire", "frame"), [v[1:] for v in BOTH_WAYS],
                         ids=[v[0] for v in BOTH_WAYS])
def test_vector_encodes(version: str, wire: bytes, frame: Frame) -> None:
    assert encode_frame(frame, version=version) == wire
    assert encode(frame.command, iter(frame.headers), frame.body, version=version) == wire


@pytest.mark.parametrize(("version", "wire", "frames"), [v[1:] for v in PARSE_ONLY],
                         ids=[v[0] for v in PARSE_ONLY])
def test_parse_only_vector(version: str, wire: bytes, frames: list[Frame]) -> None:
    assert parse(wire, version) == frames


@pytest.mark.parametrize(("version", "wire", "frame"),
                         [v[1:] for v in BOTH_WAYS] + [(v[1], v[2], v[3]) for v in PARSE_ONLY],
                         ids=[v[0] for v in BOTH_WAYS] + [v[0] for v in PARSE_ONLY])
def test_vector_byte_by_byte(version: str, wire: bytes, frame: Frame | list[Frame]) -> None:
    parser = Parser()
    parser.version = version
    frames = []
    for i in range(len(wire)):
        frames += parser.feed(wire[i:i + 1])
    assert frames == (frame if isinstance(frame, list) else [frame])


@pytest.mark.parametrize(("version", "wire", "cls", "message"), [e[1:] for e in ERRORS],
                         ids=[e[0] for e in ERRORS])
def test_malformed(version: str, wire: bytes, cls: type[StompError], message: str) -> None:
    parser = Parser()
    parser.version = version
    with pytest.raises(StompError) as info:
        parser.feed(wire)
    assert type(info.value) is cls
    assert str(info.value) == message
    assert isinstance(info.value, RemoteProtocolError)
    with pytest.raises(cls) as again:  # the parser is dead
        parser.feed(b"SEND\n\n\x00")
    assert str(again.value) == message


def test_escapes_are_fine_in_1_0() -> None:
    assert parse(b"SEND\nd:a\\tb\\\n\n\x00", "1.0") == [Frame("SEND", [("d", "a\\tb\\")])]


def test_connect_ignores_version_for_escaping() -> None:
    parser = Parser()
    parser.version = "1.2"
    assert parser.feed(b"CONNECT\naccept-version:1.2\npasscode:a\\tb\n\n\x00") == [
        Frame("CONNECT", [("accept-version", "1.2"), ("passcode", "a\\tb")])]


def test_error_carries_frames_before_it() -> None:
    with pytest.raises(StompError) as info:
        parse(b"ACK\nid:1\n\n\x00NACK\nid:2\n\n\x00SEND\nbad\n\n\x00")
    assert info.value.frames == [Frame("ACK", [("id", "1")]), Frame("NACK", [("id", "2")])]


def test_heartbeats_are_counted() -> None:
    parser = Parser()
    assert parser.feed(b"\n\r\n") == []
    assert parser.heartbeats == 2
    assert parser.feed(b"\r") == []  # half an EOL: not counted yet
    assert parser.heartbeats == 2
    assert parser.feed(b"\nSEND\n\n\x00" + HEARTBEAT) == [Frame("SEND")]
    assert parser.heartbeats == 4


# ---------------------------------------------------------------------------- limits


def test_header_block_limit_exact() -> None:
    block = b"SEND\nx:" + b"a" * 23 + b"\n\n"  # 32 octets through the blank line
    assert len(block) == 32
    assert parse(block + b"\x00", max_header_bytes=32) == [Frame("SEND", [("x", "a" * 23)])]
    with pytest.raises(FrameTooLarge, match="^header block longer than 31 octets$"):
        parse(block + b"\x00", max_header_bytes=31)


def test_header_block_limit_raised_before_the_block_ends() -> None:
    parser = Parser(max_header_bytes=32)
    assert parser.feed(b"SEND\nx:" + b"a" * 24) == []  # 31 octets, no end yet: may still fit
    with pytest.raises(FrameTooLarge, match="^header block longer than 32 octets$"):
        parser.feed(b"a")  # 32 octets and no blank line: it cannot fit any more


def test_header_block_limit_crlf() -> None:
    block = b"SEND\r\nx:" + b"a" * 22 + b"\r\n\r\n"
    assert len(block) == 34
    assert parse(block + b"\x00", max_header_bytes=34) == [Frame("SEND", [("x", "a" * 22)])]
    with pytest.raises(FrameTooLarge, match="^header block longer than 33 octets$"):
        parse(block + b"\x00", max_header_bytes=33)


@pytest.mark.parametrize("crlf", [False, True])
def test_too_many_headers(crlf: bool) -> None:
    eol = b"\r\n" if crlf else b"\n"
    two = eol.join([b"SEND", b"a:1", b"b:2", b"", b"\x00"])
    three = eol.join([b"SEND", b"a:1", b"b:2", b"c:3", b"", b"\x00"])
    assert parse(two, max_headers=2) == [Frame("SEND", [("a", "1"), ("b", "2")])]
    with pytest.raises(FrameTooLarge, match="^more than 2 headers$"):
        parse(three, max_headers=2)


def test_declared_body_limit_before_the_body() -> None:
    assert parse(b"SEND\ncontent-length:10\n\n0123456789\x00", max_frame_size=10) == [
        Frame("SEND", [("content-length", "10")], b"0123456789")]
    parser = Parser(max_frame_size=10)
    with pytest.raises(FrameTooLarge,
                       match="^content-length 11 over the limit of 10 octets$"):
        parser.feed(b"SEND\ncontent-length:11\n\n")


def test_cached_content_length_still_checked_per_parser() -> None:
    assert len(parse(b"SEND\ncontent-length:12\n\n0123456789ab\x00")) == 1
    with pytest.raises(FrameTooLarge):
        parse(b"SEND\ncontent-length:12\n\n", max_frame_size=11)


def test_undeclared_body_limit() -> None:
    parser = Parser(max_frame_size=10)
    assert parser.feed(b"SEND\n\n0123456789") == []  # 10 octets: may still end here
    assert parser.feed(b"\x00") == [Frame("SEND", [], b"0123456789")]
    parser = Parser(max_frame_size=10)
    assert parser.feed(b"SEND\n\n01234") == []
    with pytest.raises(FrameTooLarge, match="^frame body over the limit of 10 octets$"):
        parser.feed(b"567890")


def test_incomplete_frames_are_not_parsed_again_and_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    parser = Parser()
    calls = []
    real = parser._parse

    def counting(data: bytes, frames: list[Frame]) -> int:
        calls.append(len(data))
        return real(data, frames)

    monkeypatch.setattr(parser, "_parse", counting)
    body = bytes(range(256)) * 40
    wire = b"SEND\ncontent-length:10240\n\n" + body + b"\x00" + b"SEND\nx:" + b"y" * 1000
    frames = []
    for i in range(0, len(wire), 100):
        frames += parser.feed(wire[i:i + 100])
    assert frames == [Frame("SEND", [("content-length", "10240")], body)]
    # once with the header, once when the body is in, then only on pieces holding a LF
    assert len(calls) == 2
    assert parser.feed(b"\n\nz\x00") == [Frame("SEND", [("x", "y" * 1000)], b"z")]


# ---------------------------------------------------------------------------- versions


def test_version_starts_at_1_0_and_is_checked() -> None:
    parser = Parser()
    assert parser.version == "1.0"
    with pytest.raises(ValueError):
        parser.version = "1.3"
    assert parse(b"SEND\nd:a\\cb\n\n\x00", "1.0") == [Frame("SEND", [("d", "a\\cb")])]


def test_version_change_applies_to_later_frames() -> None:
    parser = Parser()
    assert parser.feed(b"SEND\nd:a\\cb\n\n\x00SEND\nd:a\\c") == [Frame("SEND", [("d", "a\\cb")])]
    parser.version = "1.2"
    assert parser.feed(b"b\n\n\x00") == [Frame("SEND", [("d", "a:b")])]


@pytest.mark.parametrize(("accept", "version"), [
    (None, "1.0"), ("1.0", "1.0"), ("1.1", "1.1"), ("1.0,1.1,1.2", "1.2"), ("1.2, 1.1", "1.2"),
    ("1.1,2.0", "1.1"), ("2.0", None), ("", None)])
def test_negotiate_version(accept: str | None, version: str | None) -> None:
    assert negotiate_version(accept) == version


def test_connect_moves_the_parser_to_the_negotiated_version() -> None:
    parser = Parser()
    frames = parser.feed(b"CONNECT\naccept-version:1.0,1.1\nhost:gw\n\n\x00"
                         b"SUBSCRIBE\nid:0\ndestination:/queue/a\\cb\n\n\x00")
    assert parser.version == "1.1"
    assert frames[1] == Frame("SUBSCRIBE", [("id", "0"), ("destination", "/queue/a:b")])


def test_connect_without_accept_version_is_1_0() -> None:
    parser = Parser()
    parser.version = "1.2"
    parser.feed(b"CONNECT\nlogin:x\n\n\x00")
    assert parser.version == "1.0"


def test_connect_with_no_known_version_leaves_the_parser() -> None:
    parser = Parser()
    parser.feed(b"STOMP\naccept-version:3.0\n\n\x00")
    assert parser.version == "1.0"


def test_connected_moves_a_client_parser() -> None:
    parser = Parser()
    frames = parser.feed(b"CONNECTED\nversion:1.2\n\n\x00MESSAGE\nx:a\\rb\n\n\x00")
    assert parser.version == "1.2"
    assert frames[1] == Frame("MESSAGE", [("x", "a\rb")])


# ---------------------------------------------------------------------------- encoding


@pytest.mark.parametrize(("version", "value", "escaped"), [
    ("1.2", "a:b\nc\rd\\e", "a\\cb\\nc\\rd\\\\e"),
    ("1.2", "\\n", "\\\\n"),
    ("1.1", "a:b\nc\\e", "a\\cb\\nc\\\\e"),
    ("1.0", "a:b\\c", "a:b\\c"),
    ("1.2", "plain", "plain"),
])
def test_escape(version: str, value: str, escaped: str) -> None:
    assert escape(value, version) == escaped


def test_escape_cr_in_1_1_is_refused() -> None:
    with pytest.raises(LocalProtocolError, match="^STOMP 1.1 cannot carry a CR in a header$"):
        escape("a\rb", "1.1")


@pytest.mark.parametrize(("command", "version", "name", "value"), [
    ("SEND", "1.0", "x", "a\nb"),
    ("SEND", "1.0", "x:y", "a"),
    ("SEND", "1.0", "x", "a\r"),
    ("CONNECT", "1.2", "passcode", "a\nb"),
    ("CONNECTED", "1.2", "server", "a\rb"),
    ("STOMP", "1.1", "a:b", "c"),
])
def test_encode_refuses_what_cannot_be_sent_unescaped(command: str, version: str, name: str,
                                                      value: str) -> None:
    with pytest.raises(LocalProtocolError, match="cannot be sent unescaped"):
        encode(command, [(name, value)], version=version)


def test_encode_refuses_lone_surrogates_and_unknown_versions() -> None:
    with pytest.raises(LocalProtocolError, match="not valid Unicode"):
        encode("SEND", [("x", "\ud800")])
    with pytest.raises(ValueError):
        encode("SEND", [], version="2.0")


def test_encode_adds_no_content_length() -> None:
    assert encode("SEND", [("destination", "/q")], b"a\x00b") == (
        b"SEND\ndestination:/q\n\na\x00b\x00")


def test_frame_get_repr_eq() -> None:
    frame = Frame("MESSAGE", [("foo", "World"), ("foo", "Hello"), ("a", "1"), ("b", "2"),
                              ("c", "3")], b"xyz")
    assert frame.get("foo") == "World"
    assert frame.get("bar") is None
    assert frame.get("bar", "d") == "d"
    assert repr(frame) == ("Frame('MESSAGE', [('foo', 'World'), ('foo', 'Hello'), ('a', '1'), "
                           "('b', '2')], ..., <3 octets>)")
    assert Frame("SEND") == Frame("SEND", [], b"")
    assert Frame("SEND") != Frame("SEND", [], b"x")
    assert Frame("SEND") != Frame("SEND", [("a", "b")])
    assert Frame("SEND") != Frame("ACK")
    assert Frame("SEND") != "SEND"
    assert Frame("SEND").headers == []


# ---------------------------------------------------------------------------- chunking

STREAM = (b"\nCONNECT\r\naccept-version:1.2\r\nhost:gw\r\n\r\n\x00\r\n"
          b"SEND\ndestination:/queue/a\\cb\ncontent-length:4\n\n\x00\r\n\x00\x00\n"
          b"SEND\r\nx:1\r\n\r\nno length\x00\n\n"
          b"MESSAGE\nx:\\\\\\n\n\n\x00")
STREAM_FRAMES = [
    Frame("CONNECT", [("accept-version", "1.2"), ("host", "gw")]),
    Frame("SEND", [("destination", "/queue/a:b"), ("content-length", "4")], b"\x00\r\n\x00"),
    Frame("SEND", [("x", "1")], b"no length"),
    Frame("MESSAGE", [("x", "\\\n")]),
]


def feed_pieces(pieces: list[bytes]) -> tuple[list[Frame], int]:
    parser = Parser()
    frames = []
    for piece in pieces:
        frames += parser.feed(piece)
    return frames, parser.heartbeats


def test_stream_whole() -> None:
    assert feed_pieces([STREAM]) == (STREAM_FRAMES, 5)


def test_stream_byte_by_byte() -> None:
    assert feed_pieces([STREAM[i:i + 1] for i in range(len(STREAM))]) == (STREAM_FRAMES, 5)


def test_stream_split_at_every_position() -> None:
    for i in range(len(STREAM) + 1):
        assert feed_pieces([STREAM[:i], STREAM[i:]]) == (STREAM_FRAMES, 5), i


def test_stream_random_splits() -> None:
    rng = random.Random(1234)
    for _ in range(300):
        cuts = sorted(rng.sample(range(1, len(STREAM)), rng.randint(1, 12)))
        pieces = [STREAM[a:b] for a, b in zip([0, *cuts], [*cuts, len(STREAM)], strict=True)]
        assert feed_pieces(pieces) == (STREAM_FRAMES, 5), cuts


def test_feed_takes_bytearray_and_memoryview() -> None:
    wire = b"ACK\nid:1\n\n\x00"
    parser = Parser()
    assert parser.feed(bytearray(wire[:5])) == []
    assert parser.feed(memoryview(wire)[5:]) == [Frame("ACK", [("id", "1")])]


# ---------------------------------------------------------------------------- hypothesis

SPECIAL = st.sampled_from([":", "\n", "\r", "\\", "\\n", "\\c", "é", "中", "😀", "\x00", " "])
TEXT = st.lists(st.one_of(SPECIAL, st.characters(codec="utf-8")), max_size=12).map("".join)
NAME = TEXT.filter(lambda s: s != "" and s != "content-length")
COMMANDS = ["SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK", "BEGIN", "COMMIT", "ABORT",
            "DISCONNECT", "MESSAGE", "RECEIPT", "ERROR"]


@st.composite
def frames(draw: st.DrawFn) -> Frame:
    body = draw(st.binary(max_size=64))
    headers = [("content-length", str(len(body)))]
    headers += draw(st.lists(st.tuples(NAME, TEXT), max_size=6))
    return Frame(draw(st.sampled_from(COMMANDS)), headers, body)


@FUZZ
@given(frame=frames(), version=st.sampled_from(["1.1", "1.2"]))
def test_round_trip(frame: Frame, version: str) -> None:
    has_cr = any("\r" in name + value for name, value in frame.headers)
    if version == "1.1" and has_cr:
        with pytest.raises(LocalProtocolError):
            encode_frame(frame, version=version)
        return
    wire = encode_frame(frame, version=version)
    assert parse(wire, version) == [frame]


@FUZZ
@given(frame=frames())
def test_round_trip_1_0(frame: Frame) -> None:
    unsafe = any("\r" in n + v or "\n" in n + v or ":" in n for n, v in frame.headers)
    if unsafe:
        with pytest.raises(LocalProtocolError):
            encode_frame(frame, version="1.0")
        return
    assert parse(encode_frame(frame, version="1.0"), "1.0") == [frame]


@FUZZ
@given(stream=st.lists(frames(), min_size=1, max_size=5), data=st.data())
def test_stream_of_frames_any_cut(stream: list[Frame], data: st.DataObject) -> None:
    wire = b"\n".join(encode_frame(f, version="1.2") for f in stream)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(wire)), max_size=10)))
    parser = Parser()
    parser.version = "1.2"
    got = []
    for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        got += parser.feed(wire[a:b])
    assert got == stream
    assert parser.heartbeats == len(stream) - 1


@FUZZ
@given(garbage=st.lists(st.binary(max_size=40), max_size=8),
       version=st.sampled_from(["1.0", "1.1", "1.2"]))
def test_garbage_only_raises_stomp_error(garbage: list[bytes], version: str) -> None:
    parser = Parser(max_frame_size=64, max_header_bytes=64, max_headers=4)
    parser.version = version
    try:
        for piece in garbage:
            for frame in parser.feed(piece):
                assert isinstance(frame, Frame)
    except StompError:
        pass


@FUZZ
@given(frame=frames(), data=st.data())
def test_mutated_frames_only_raise_stomp_error(frame: Frame, data: st.DataObject) -> None:
    wire = bytearray(encode_frame(frame, version="1.2"))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(wire) - 1))
        how = data.draw(st.sampled_from(["flip", "drop", "insert"]))
        if how == "flip":
            wire[i] = data.draw(st.sampled_from([0, 10, 13, 58, 92, 0xFF, 0x80, 48]))
        elif how == "drop":
            del wire[i]
        else:
            wire.insert(i, data.draw(st.sampled_from([0, 10, 13, 58, 92, 0xC3])))
    parser = Parser(max_frame_size=100, max_header_bytes=200)
    parser.version = data.draw(st.sampled_from(["1.0", "1.1", "1.2"]))
    try:
        parser.feed(bytes(wire))
        parser.feed(b"\x00\n")
    except StompError:
        pass
