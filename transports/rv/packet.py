"""The RV-style bus's packets: one UDP datagram each, engine to engine.

Every packet opens with the same 32-byte header (network byte order)::

    off len field
     0   2  magic        0x52 0x58 ("RX")
     2   1  version      1
     3   1  ptype        1 DATA, 2 HEARTBEAT, 3 NAK, 4 NAK_DENY, 5 ACK, 6 BYE
     4   2  flags        bit0 RETRANS, bit1 PTP, bit2 FIRST_FRAG, bit3 LAST_FRAG, bit4 BATCH
     6   2  hdr_len      32 in version 1; the body starts here (a longer header is skipped)
     8   4  src_ip       the sending engine's interface IPv4
    12   2  src_port     the sending engine's unicast ("inbox") port: NAKs, ACKs, replies go there
    14   2  service      the sender's service (UDP port): cross-talk on a shared group is dropped
    16   4  incarnation  random, chosen when the engine starts (restart detection)
    20   8  seq          DATA: the packet's sequence number in its stream; BYE: the stream's
                         highest sequence number; other kinds: 0
    28   4  aux          DATA with FIRST_FRAG: the message's total length (with BATCH: the
                         number of messages); other DATA: the fragment's index in its
                         message; other kinds: 0

and the body that follows depends on the kind:

* DATA: a slice of one message (the codec's bytes; opaque here); with BATCH (and both
  FIRST_FRAG and LAST_FRAG), two or more whole messages, each ``length:u32`` then its bytes,
  filling the body exactly. A sender packs the small messages that wait for the same write
  into one packet (no message waits for another: only what is already queued is packed),
  so a burst of small messages costs one datagram per packet, not per message.
* HEARTBEAT: ``highest_seq:u64 lowest_retained_seq:u64 reliability_ms:u32``.
* NAK, NAK_DENY: ``stream_incarnation:u32 n:u16`` then ``n`` ranges ``first:u64 last:u64``.
* ACK (point-to-point streams): ``stream_incarnation:u32 cum_ack:u64 n:u16`` then ``n`` SACK
  ranges ``first:u64 last:u64``.
* BYE: empty.

The layout is this project's own: TIBCO Rendezvous does not publish its packet format, and
TIBCO Rendezvous Concepts, The Rendezvous Daemon, Reliable Message Delivery, describes only the
behaviour the packets implement.
:func:`decode` checks every length and field against these rules and raises
:class:`PacketError` for anything else, and only that: the engine counts such a datagram and
drops it. The engine's hot path (DATA) unpacks :data:`HEADER` itself; the other kinds go
through :func:`decode`.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Final, NamedTuple

MAGIC: Final = 0x5258  # "RX"
VERSION: Final = 1

#: magic, version, ptype, flags, hdr_len, src_ip, src_port, service, incarnation, seq, aux
HEADER: Final = struct.Struct("!HBBHHIHHIQI")
HEADER_LEN: Final = HEADER.size  # 32

HEARTBEAT_BODY: Final = struct.Struct("!QQI")
RANGES_HEAD: Final = struct.Struct("!IH")
ACK_HEAD: Final = struct.Struct("!IQH")
RANGE: Final = struct.Struct("!QQ")

#: Flags (the header's ``flags`` field).
RETRANS: Final = 0x1
PTP: Final = 0x2
FIRST_FRAG: Final = 0x4
LAST_FRAG: Final = 0x8
BATCH: Final = 0x10
KNOWN_FLAGS: Final = RETRANS | PTP | FIRST_FRAG | LAST_FRAG | BATCH
#: The length before each message of a BATCH packet.
BATCH_LENGTH: Final = struct.Struct("!I")

#: The largest datagram UDP over IPv4 carries (65,535 minus the IP and UDP headers).
MAX_DATAGRAM: Final = 65507
#: Ranges one NAK, NAK_DENY or ACK may carry: 64 x 16 bytes keeps it inside 1,400 bytes.
MAX_RANGES: Final = 64
MAX_SEQ: Final = 2**64 - 1


class PacketType(IntEnum):
    DATA = 1
    HEARTBEAT = 2
    NAK = 3
    NAK_DENY = 4
    ACK = 5
    BYE = 6


DATA: Final = 1
HEARTBEAT: Final = 2
NAK: Final = 3
NAK_DENY: Final = 4
ACK: Final = 5
BYE: Final = 6


class PacketError(Exception):
    """A datagram that is not a well-formed packet of this protocol (``reason`` says why)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Packet(NamedTuple):
    """A decoded packet. Fields a kind does not use are zero or empty."""

    ptype: int
    flags: int
    src_ip: int
    src_port: int
    service: int
    incarnation: int
    seq: int
    aux: int
    payload: bytes = b""  # DATA
    highest_seq: int = 0  # HEARTBEAT
    lowest_retained: int = 0  # HEARTBEAT
    reliability_ms: int = 0  # HEARTBEAT
    stream_incarnation: int = 0  # NAK, NAK_DENY, ACK
    cum_ack: int = 0  # ACK
    ranges: tuple[tuple[int, int], ...] = ()  # NAK, NAK_DENY: requested; ACK: SACK


def ip_to_int(ip: str) -> int:
    """``"10.0.0.1"`` -> ``0x0A000001``; ValueError for anything but a dotted IPv4 address."""
    parts = ip.split(".")
    if len(parts) != 4:
        raise ValueError(f"not an IPv4 address: {ip!r}")
    value = 0
    for part in parts:
        if not part.isdigit() or int(part) > 255:
            raise ValueError(f"not an IPv4 address: {ip!r}")
        value = (value << 8) | int(part)
    return value


def int_to_ip(value: int) -> str:
    return f"{value >> 24}.{(value >> 16) & 255}.{(value >> 8) & 255}.{value & 255}"


def header(ptype: int, flags: int, src_ip: int, src_port: int, service: int,
           incarnation: int, seq: int = 0, aux: int = 0) -> bytes:
    return HEADER.pack(MAGIC, VERSION, ptype, flags, HEADER_LEN, src_ip, src_port, service,
                       incarnation, seq, aux)


def encode_ranges(ranges: list[tuple[int, int]] | tuple[tuple[int, int], ...]) -> bytes:
    return b"".join([RANGE.pack(first, last) for first, last in ranges])


def encode_heartbeat(head: bytes, highest_seq: int, lowest_retained: int,
                     reliability_ms: int) -> bytes:
    """``head`` is :func:`header` for a HEARTBEAT."""
    return head + HEARTBEAT_BODY.pack(highest_seq, lowest_retained, reliability_ms)


def encode_nak(head: bytes, stream_incarnation: int,
               ranges: list[tuple[int, int]] | tuple[tuple[int, int], ...]) -> bytes:
    """A NAK or NAK_DENY body after ``head`` (at most :data:`MAX_RANGES` ranges)."""
    return head + RANGES_HEAD.pack(stream_incarnation, len(ranges)) + encode_ranges(ranges)


def encode_ack(head: bytes, stream_incarnation: int, cum_ack: int,
               sack: list[tuple[int, int]] | tuple[tuple[int, int], ...]) -> bytes:
    return head + ACK_HEAD.pack(stream_incarnation, cum_ack, len(sack)) + encode_ranges(sack)


def _ranges(data: bytes, off: int, n: int) -> tuple[tuple[int, int], ...]:
    if n > MAX_RANGES:
        raise PacketError("too many ranges")
    if len(data) - off != n * RANGE.size:
        raise PacketError("range list length does not match its count")
    out: list[tuple[int, int]] = []
    for i in range(n):
        first, last = RANGE.unpack_from(data, off + i * RANGE.size)
        if first == 0 or first > last:
            raise PacketError("empty or reversed range")
        out.append((first, last))
    return tuple(out)


def batch_body(messages: list[bytes]) -> bytes:
    """The body of a BATCH packet carrying ``messages`` (each ``length:u32`` then its bytes)."""
    pack = BATCH_LENGTH.pack
    parts: list[bytes] = []
    for m in messages:
        parts.append(pack(len(m)))
        parts.append(m)
    return b"".join(parts)


def split_batch(body: bytes, count: int) -> list[bytes]:
    """The ``count`` messages of a BATCH packet's body; :class:`PacketError` unless they are
    at least two and fill it exactly."""
    if count < 2:
        raise PacketError("BATCH of fewer than two messages")
    unpack = BATCH_LENGTH.unpack_from
    n = len(body)
    off = 0
    out: list[bytes] = []
    for _ in range(count):
        if off + 4 > n:
            raise PacketError("BATCH ends inside a length")
        end = off + 4 + unpack(body, off)[0]
        if end > n:
            raise PacketError("BATCH message runs past the packet")
        out.append(body[off + 4:end])
        off = end
    if off != n:
        raise PacketError("BATCH has bytes after its messages")
    return out


def decode(data: bytes) -> Packet:
    """Parse one datagram; raise :class:`PacketError` (and nothing else) if it is not one."""
    if len(data) < HEADER_LEN:
        raise PacketError("shorter than the header")
    (magic, version, ptype, flags, hdr_len, src_ip, src_port, service, incarnation, seq,
     aux) = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise PacketError("bad magic")
    if version != VERSION:
        raise PacketError("unknown version")
    if hdr_len < HEADER_LEN or hdr_len > len(data):
        raise PacketError("bad header length")
    if flags & ~KNOWN_FLAGS:
        raise PacketError("unknown flags")
    head = (ptype, flags, src_ip, src_port, service, incarnation, seq, aux)
    body = bytes(data[hdr_len:])
    if ptype == DATA:
        if seq == 0:
            raise PacketError("DATA with sequence number 0")
        return Packet(*head, payload=body)
    if ptype == HEARTBEAT:
        if len(body) != HEARTBEAT_BODY.size:
            raise PacketError("bad HEARTBEAT length")
        highest, lowest, rel = HEARTBEAT_BODY.unpack(body)
        if lowest > highest + 1:
            raise PacketError("HEARTBEAT retains beyond its highest sequence number")
        return Packet(*head, highest_seq=highest, lowest_retained=lowest, reliability_ms=rel)
    if ptype == NAK or ptype == NAK_DENY:
        if len(body) < RANGES_HEAD.size:
            raise PacketError("short NAK")
        stream_inc, n = RANGES_HEAD.unpack_from(body)
        ranges = _ranges(body, RANGES_HEAD.size, n)
        if not ranges:
            raise PacketError("NAK without ranges")
        return Packet(*head, stream_incarnation=stream_inc, ranges=ranges)
    if ptype == ACK:
        if len(body) < ACK_HEAD.size:
            raise PacketError("short ACK")
        stream_inc, cum, n = ACK_HEAD.unpack_from(body)
        return Packet(*head, stream_incarnation=stream_inc, cum_ack=cum,
                      ranges=_ranges(body, ACK_HEAD.size, n))
    if ptype == BYE:
        if body:
            raise PacketError("BYE with a body")
        return Packet(*head)
    raise PacketError("unknown packet type")
