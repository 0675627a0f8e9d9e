"""The hand-written SASL layer in front of proton's transport (AMQP 1.0 §5.3)."""

from __future__ import annotations

import struct

import pytest
from proton import Data, Described, symbol, ulong

from adapters.amqp.sasl import AMQP_HEADER, SASL_HEADER, SaslError, SaslServer

USERS = {"alice": "secret"}


def authenticate(user: str | None, password: str | None) -> str | None:
    if user is None:
        return None
    if USERS.get(user) != password:
        raise SaslError(f"bad password for {user}")
    return user


def frame(descriptor: int | str, fields: list[object]) -> bytes:
    d = Data()
    desc = ulong(descriptor) if isinstance(descriptor, int) else symbol(descriptor)
    d.put_object(Described(desc, fields))
    body = d.encode()
    return struct.pack(">IBBH", 8 + len(body), 2, 1, 0) + body


def parse_frames(data: bytes) -> list[tuple[int, list[object]]]:
    """(descriptor, fields) of each SASL frame in ``data`` (after any protocol header)."""
    out = []
    while data:
        if data.startswith(b"AMQP"):
            data = data[8:]
            continue
        size = struct.unpack_from(">I", data)[0]
        d = Data()
        d.decode(data[8:size])
        obj = d.get_object()
        out.append((int(obj.descriptor), list(obj.value)))
        data = data[size:]
    return out


def plain(user: str, password: str) -> bytes:
    return f"\x00{user}\x00{password}".encode()


def test_offers_plain_and_anonymous_then_passes_the_rest_through() -> None:
    s = SaslServer(authenticate, plain=True, anonymous=True)
    out = s.feed(SASL_HEADER)
    assert out.startswith(SASL_HEADER)
    (desc, fields), = parse_frames(out)
    assert desc == 0x40 and [str(m) for m in fields[0]] == ["PLAIN", "ANONYMOUS"]
    out = s.feed(frame(0x41, [symbol("PLAIN"), plain("alice", "secret")]))
    (desc, fields), = parse_frames(out)
    assert desc == 0x44 and fields[0] == 0
    assert not s.done
    out = s.feed(AMQP_HEADER + b"\x00\x00\x00\x08rest")
    assert out == b"" and s.done and s.user == "alice"
    assert s.rest == AMQP_HEADER + b"\x00\x00\x00\x08rest"


def test_bytes_may_arrive_one_at_a_time() -> None:
    s = SaslServer(authenticate, plain=True, anonymous=False)
    data = SASL_HEADER + frame(0x41, [symbol("PLAIN"), plain("alice", "secret")]) + AMQP_HEADER
    out = b"".join(s.feed(data[i : i + 1]) for i in range(len(data)))
    assert [d for d, _ in parse_frames(out)] == [0x40, 0x44]
    assert s.done and s.user == "alice" and s.rest == AMQP_HEADER


def test_wrong_password_gets_auth_outcome_and_fails() -> None:
    s = SaslServer(authenticate, plain=True, anonymous=True)
    s.feed(SASL_HEADER)
    out = s.feed(frame(0x41, [symbol("PLAIN"), plain("alice", "wrong")]))
    (desc, fields), = parse_frames(out)
    assert desc == 0x44 and fields[0] == 1  # auth
    assert s.failed and "bad password" in s.error and not s.done


def test_anonymous_refused_when_not_offered() -> None:
    s = SaslServer(authenticate, plain=True, anonymous=False)
    out = s.feed(SASL_HEADER)
    (_, fields), = parse_frames(out)
    assert [str(m) for m in fields[0]] == ["PLAIN"]
    out = s.feed(frame(0x41, [symbol("ANONYMOUS"), b"anon"]))
    assert parse_frames(out)[0][1][0] == 1 and s.failed


def test_anonymous_accepted_with_symbolic_descriptor() -> None:
    s = SaslServer(authenticate, plain=True, anonymous=True)
    s.feed(SASL_HEADER)
    out = s.feed(frame("amqp:sasl-init:list", [symbol("ANONYMOUS")]))
    assert parse_frames(out)[0][1][0] == 0
    s.feed(AMQP_HEADER)
    assert s.done and s.user is None


def test_no_sasl_only_when_anonymous_allowed() -> None:
    s = SaslServer(authenticate, plain=True, anonymous=True)
    assert s.feed(AMQP_HEADER) == b"" and s.done and s.rest == AMQP_HEADER
    s = SaslServer(authenticate, plain=True, anonymous=False)
    assert s.feed(AMQP_HEADER) == SASL_HEADER  # the header we require (§2.2)
    assert s.failed and not s.done


@pytest.mark.parametrize("data", [
    b"HTTP/1.1 200",  # not AMQP at all
    b"AMQP\x02\x01\x00\x00",  # TLS header: TLS is a separate listener
    b"AMQP\x00\x01\x00\x01",  # an unknown version
])
def test_bad_protocol_headers_fail(data: bytes) -> None:
    s = SaslServer(authenticate, plain=True, anonymous=True)
    out = s.feed(data)
    assert s.failed and out.startswith(b"AMQP") and not s.done


@pytest.mark.parametrize("body", [
    struct.pack(">IBBH", 4, 2, 1, 0),  # size below a frame header
    struct.pack(">IBBH", 1 << 30, 2, 1, 0),  # absurdly large
    struct.pack(">IBBH", 12, 2, 0, 0) + b"\x00" * 4,  # an AMQP frame, not SASL
    struct.pack(">IBBH", 12, 2, 1, 0) + b"\xff" * 4,  # garbage performative
    frame(0x43, [b"response"]),  # a sasl-response before any challenge
])
def test_malformed_sasl_frames_fail_with_an_outcome(body: bytes) -> None:
    s = SaslServer(authenticate, plain=True, anonymous=True)
    s.feed(SASL_HEADER)
    out = s.feed(body)
    assert s.failed and s.error
    (desc, fields), = parse_frames(out)
    assert desc == 0x44 and fields[0] in (1, 3)


def test_malformed_plain_response() -> None:
    s = SaslServer(authenticate, plain=True, anonymous=True)
    s.feed(SASL_HEADER)
    out = s.feed(frame(0x41, [symbol("PLAIN"), b"no-separators"]))
    assert parse_frames(out)[0][1][0] == 1 and "malformed PLAIN" in s.error
