"""The RV-style bus's packets: byte-exact layouts both ways, and the decoder under fuzzing
(only :class:`PacketError` may leave it; the engine counts and drops such datagrams)."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transports.rv.engine import Engine
from transports.rv.packet import (
    ACK,
    BATCH,
    BYE,
    DATA,
    FIRST_FRAG,
    HEARTBEAT,
    LAST_FRAG,
    MAX_RANGES,
    NAK,
    NAK_DENY,
    PTP,
    RETRANS,
    PacketError,
    batch_body,
    decode,
    encode_ack,
    encode_heartbeat,
    encode_nak,
    header,
    int_to_ip,
    ip_to_int,
    split_batch,
)

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

HEAD = bytes.fromhex(
    "5258"  # magic "RX"
    "01"  # version
    "01"  # DATA
    "000c"  # FIRST_FRAG | LAST_FRAG
    "0020"  # header length 32
    "0a000001"  # 10.0.0.1
    "9c40"  # port 40000
    "1d4c"  # service 7500
    "deadbeef"  # incarnation
    "0000000000000007"  # seq 7
    "00000005"  # total length 5
)


def test_data_header_byte_exact() -> None:
    assert header(DATA, FIRST_FRAG | LAST_FRAG, ip_to_int("10.0.0.1"), 40000, 7500,
                  0xDEADBEEF, 7, 5) == HEAD
    p = decode(HEAD + b"hello")
    assert (p.ptype, p.flags, p.src_ip, p.src_port, p.service, p.incarnation, p.seq, p.aux,
            p.payload) == (DATA, FIRST_FRAG | LAST_FRAG, 0x0A000001, 40000, 7500, 0xDEADBEEF,
                           7, 5, b"hello")


def test_engine_writes_the_same_bytes() -> None:
    e = Engine(ip="10.0.0.1", port=40000, service=7500, incarnation=0xDEADBEEF)
    for _ in range(6):
        e.send(b"", 0.0)
        e.datagrams_to_send()  # one packet each
    e.send(b"hello", 0.0)
    [(data, _)] = e.datagrams_to_send()
    assert data == HEAD + b"hello"


BATCH_HEAD = bytes.fromhex(
    "5258" "01" "01"
    "001c"  # FIRST_FRAG | LAST_FRAG | BATCH
    "0020" "0a000001" "9c40" "1d4c" "deadbeef"
    "0000000000000001"  # seq 1
    "00000003"  # three messages
)


def test_small_messages_written_together_share_one_packet_byte_exact() -> None:
    e = Engine(ip="10.0.0.1", port=40000, service=7500, incarnation=0xDEADBEEF)
    for m in (b"one", b"", b"three"):
        e.send(m, 0.0)
    [(data, _)] = e.datagrams_to_send()
    assert data == BATCH_HEAD + bytes.fromhex(
        "00000003") + b"one" + bytes.fromhex("00000000") + bytes.fromhex(
        "00000005") + b"three"
    p = decode(data)
    assert (p.flags, p.seq, p.aux) == (FIRST_FRAG | LAST_FRAG | BATCH, 1, 3)
    assert split_batch(p.payload, p.aux) == [b"one", b"", b"three"]
    assert batch_body([b"one", b"", b"three"]) == p.payload


def test_a_batch_is_filled_to_the_payload_size_and_a_large_message_closes_it() -> None:
    e = Engine(ip="10.0.0.1", port=40000, service=7500, payload_size=100)
    sent = [bytes([i]) * 40 for i in range(5)] + [bytes(200), b"last"]
    for m in sent:
        e.send(m, 0.0)
    packets = [decode(d) for d, _ in e.datagrams_to_send()]
    # two of 44 bytes fit in 100, a third does not; the 200-byte message is fragmented, in
    # order after the batch before it
    kinds = [(p.flags & (BATCH | FIRST_FRAG | LAST_FRAG), p.aux) for p in packets]
    assert kinds == [(BATCH | FIRST_FRAG | LAST_FRAG, 2), (BATCH | FIRST_FRAG | LAST_FRAG, 2),
                     (FIRST_FRAG | LAST_FRAG, 40), (FIRST_FRAG, 200), (LAST_FRAG, 1),
                     (FIRST_FRAG | LAST_FRAG, 4)]
    assert [p.seq for p in packets] == list(range(1, 7))


@pytest.mark.parametrize("body, count, reason", [
    (bytes.fromhex("00000001") + b"a", 1, "BATCH of fewer than two messages"),
    (bytes.fromhex("00000001") + b"a" + b"\x00\x00", 2, "BATCH ends inside a length"),
    (bytes.fromhex("00000001") + b"a" + bytes.fromhex("00000009") + b"b", 2,
     "BATCH message runs past the packet"),
    (bytes.fromhex("00000001") + b"a" + bytes.fromhex("00000001") + b"bc", 2,
     "BATCH has bytes after its messages"),
])
def test_malformed_batches(body: bytes, count: int, reason: str) -> None:
    with pytest.raises(PacketError) as err:
        split_batch(body, count)
    assert err.value.reason == reason


def test_longer_header_is_skipped() -> None:
    extended = HEAD[:6] + b"\x00\x24" + HEAD[8:] + b"\xff" * 4 + b"hello"
    assert decode(extended).payload == b"hello"


def test_control_packets_byte_exact() -> None:
    h = header(HEARTBEAT, 0, 1, 2, 3, 4)
    hb = encode_heartbeat(h, 10, 3, 60000)
    assert hb[32:] == bytes.fromhex("000000000000000a" "0000000000000003" "0000ea60")
    p = decode(hb)
    assert (p.highest_seq, p.lowest_retained, p.reliability_ms) == (10, 3, 60000)
    nak = encode_nak(header(NAK, 0, 1, 2, 3, 4), 0xCAFE, [(5, 6), (9, 9)])
    assert nak[32:] == bytes.fromhex("0000cafe" "0002" "0000000000000005" "0000000000000006"
                                     "0000000000000009" "0000000000000009")
    assert decode(nak).ranges == ((5, 6), (9, 9))
    assert decode(nak).stream_incarnation == 0xCAFE
    deny = encode_nak(header(NAK_DENY, PTP, 1, 2, 3, 4), 7, [(1, 4)])
    assert decode(deny).ptype == NAK_DENY and decode(deny).flags == PTP
    ack = encode_ack(header(ACK, PTP, 1, 2, 3, 4), 7, 12, [(14, 15)])
    assert ack[32:] == bytes.fromhex("00000007" "000000000000000c" "0001"
                                     "000000000000000e" "000000000000000f")
    p = decode(ack)
    assert (p.stream_incarnation, p.cum_ack, p.ranges) == (7, 12, ((14, 15),))
    assert decode(header(BYE, 0, 1, 2, 3, 4, 99)).seq == 99


@pytest.mark.parametrize("data, reason", [
    (b"", "shorter than the header"),
    (HEAD[:31], "shorter than the header"),
    (b"XX" + HEAD[2:], "bad magic"),
    (HEAD[:2] + b"\x02" + HEAD[3:], "unknown version"),
    (HEAD[:6] + b"\x00\x1f" + HEAD[8:], "bad header length"),
    (HEAD[:6] + b"\x01\x00" + HEAD[8:], "bad header length"),
    (HEAD[:4] + b"\x00\x20" + HEAD[6:], "unknown flags"),
    (HEAD[:3] + b"\x07" + HEAD[4:], "unknown packet type"),
    (HEAD[:20] + bytes(8) + HEAD[28:], "DATA with sequence number 0"),
    (header(HEARTBEAT, 0, 1, 2, 3, 4) + bytes(19), "bad HEARTBEAT length"),
    (encode_heartbeat(header(HEARTBEAT, 0, 1, 2, 3, 4), 5, 7, 0),
     "HEARTBEAT retains beyond its highest sequence number"),
    (header(NAK, 0, 1, 2, 3, 4) + b"\x00", "short NAK"),
    (encode_nak(header(NAK, 0, 1, 2, 3, 4), 1, []), "NAK without ranges"),
    (encode_nak(header(NAK, 0, 1, 2, 3, 4), 1, [(5, 4)]), "empty or reversed range"),
    (encode_nak(header(NAK, 0, 1, 2, 3, 4), 1, [(0, 4)]), "empty or reversed range"),
    (encode_nak(header(NAK, 0, 1, 2, 3, 4), 1, [(1, 1)])[:-1],
     "range list length does not match its count"),
    (encode_nak(header(NAK, 0, 1, 2, 3, 4), 1, [(1, 1)] * (MAX_RANGES + 1)),
     "too many ranges"),
    (header(ACK, PTP, 1, 2, 3, 4) + b"\x00", "short ACK"),
    (header(BYE, 0, 1, 2, 3, 4) + b"\x00", "BYE with a body"),
])
def test_malformed(data: bytes, reason: str) -> None:
    with pytest.raises(PacketError) as err:
        decode(data)
    assert err.value.reason == reason


def test_ip_conversion() -> None:
    assert ip_to_int("192.168.1.20") == 0xC0A80114
    assert int_to_ip(0xC0A80114) == "192.168.1.20"
    for bad in ("1.2.3", "1.2.3.256", "a.b.c.d", "1.2.3.-4"):
        with pytest.raises(ValueError):
            ip_to_int(bad)


def valid_packets() -> st.SearchStrategy[bytes]:
    u32 = st.integers(0, 2**32 - 1)
    ranges = st.lists(st.tuples(st.integers(1, 2**64 - 1), st.integers(0, 1000)).map(
        lambda t: (t[0], min(t[0] + t[1], 2**64 - 1))), max_size=MAX_RANGES)
    head = st.builds(lambda t, f, ip, inc: header(t, f, ip, 7, 7500, inc, 0, 0),
                     st.sampled_from([HEARTBEAT, NAK, NAK_DENY, ACK, BYE]),
                     st.sampled_from([0, PTP]), st.one_of(st.just(1), u32), u32)
    data = st.builds(lambda f, seq, aux, body: header(DATA, f, 1, 2, 7500, 3, seq, aux) + body,
                     st.integers(0, 15), st.integers(1, 2**64 - 1), u32, st.binary(max_size=50))
    nak = st.builds(lambda h, inc, r: encode_nak(h, inc, r or [(1, 1)]), head, u32, ranges)
    ack = st.builds(lambda h, inc, c, r: encode_ack(h, inc, c, r), head, u32,
                    st.integers(0, 2**64 - 1), ranges)
    return st.one_of(data, nak, ack)


@FUZZ
@given(st.binary(max_size=200))
def test_fuzz_random_bytes_only_packet_error(data: bytes) -> None:
    try:
        decode(data)
    except PacketError:
        pass


@FUZZ
@given(valid_packets(), st.data())
def test_fuzz_mutated_packets_only_packet_error(packet: bytes, data: st.DataObject) -> None:
    mutated = bytearray(packet)
    for _ in range(data.draw(st.integers(1, 4))):
        action = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if action == "flip" and mutated:
            i = data.draw(st.integers(0, len(mutated) - 1))
            mutated[i] = data.draw(st.integers(0, 255))
        elif action == "cut":
            del mutated[data.draw(st.integers(0, len(mutated))):]
        else:
            i = data.draw(st.integers(0, len(mutated)))
            mutated[i:i] = data.draw(st.binary(min_size=1, max_size=8))
    try:
        decode(bytes(mutated))
    except PacketError:
        pass


@FUZZ
@given(st.lists(st.one_of(valid_packets(), st.binary(max_size=80)), max_size=20),
       st.integers(0, 2**32 - 1))
def test_fuzz_engine_never_raises_on_datagrams(datagrams: list[bytes], seed: int) -> None:
    """Whatever arrives, from whoever, the engine takes it (or counts it) and keeps going."""
    e = Engine(ip="10.0.0.9", port=7, service=7500, reliability=1.0,
               rng=random.Random(seed))
    e.send(b"x" * 3000, 0.0)
    e.send_to(("0.0.0.1", 7), b"y" * 3000, 0.0)  # the address the fuzzed ACKs come from
    now = 0.0
    for d in datagrams:
        now += 0.01
        e.receive_datagram(d, ("10.0.0.1", 7), now)
        e.tick(now)
    deadline = e.next_deadline()
    if deadline is not None:
        e.tick(deadline)
    e.datagrams_to_send()
    e.events()


def test_flags_are_distinct_bits() -> None:
    assert sorted([RETRANS, PTP, FIRST_FRAG, LAST_FRAG]) == [1, 2, 4, 8]
