"""The RV-style bus's reliable multicast engine, sans-I/O.

One :class:`Engine` is what a Rendezvous daemon is for one service: it turns messages (opaque
bytes, the codec's output) into numbered UDP packets and back, retransmits what receivers
miss, and reports what cannot be recovered, as described in TIBCO Rendezvous Concepts, The
Rendezvous Daemon (Reliable Message Delivery) and Fundamentals. It does no I/O and reads no
clock: the shell hands it datagrams and the time, and takes datagrams, events and a deadline
back::

    engine = Engine(ip="10.0.0.5", port=51234, service=7500)
    engine.send(payload, now)                    # multicast stream
    engine.send_to(("10.0.0.7", 40001), payload, now)   # point-to-point stream
    engine.receive_datagram(data, addr, now)     # every datagram read, either socket
    for data, dest in engine.datagrams_to_send():    # dest is MULTICAST or (ip, port)
        ...
    for event in engine.events():                # Delivered(...) and Advisory(...)
        ...
    engine.tick(now)                             # at engine.next_deadline() or later
    engine.close(now)                            # BYE

How it works (the packet layout is in :mod:`transports.rv.packet`):

* **Streams.** The engine has one multicast stream (every message sent with :meth:`send`) and
  one point-to-point stream per destination engine (:meth:`send_to`), each with its own
  sequence numbers from 1. A receiver keeps one state per remote stream, keyed by the sender's
  (IP, inbox port, incarnation). A message longer than ``payload_size`` travels as
  consecutive packets (FIRST_FRAG ... LAST_FRAG) and is delivered whole, or not at all.
* **Batches.** Small multicast messages sent between two calls of
  :meth:`Engine.datagrams_to_send` share packets (a BATCH packet, up to ``payload_size``
  bytes of messages): a burst of 100-byte messages goes out 13 to a datagram, and the
  sequence numbers, retention, NAKs and DATALOSS counts below are all per packet. Nothing
  is held back for a batch: :meth:`datagrams_to_send` closes the open one.
* **Multicast: NAK-based.** The sender keeps every packet for the reliability interval
  (``reliability``, 60 s by default; 0 keeps nothing), optionally also capped in bytes. After
  the last data it multicasts a HEARTBEAT at +50, 100, 200, 400 and 800 ms, then every
  second, carrying its highest sequence number, so a receiver notices a lost tail. A receiver
  that sees a gap (a higher sequence number than expected, in data or a heartbeat) buffers
  what comes after it, waits a random 0-20 ms, and sends a NAK to the sender's inbox port;
  it asks again after 50, 100, 200 ... 1,000 ms while the gap stays open. Retransmissions are
  multicast, so the other receivers that lost the same packet get it too and cancel their own
  pending NAK; the sender retransmits a packet at most once per 20 ms however many NAKs ask
  for it. These two rules keep one packet lost at many listeners from causing a NAK storm.
* **Multicast: loss.** A NAK for a packet the sender no longer keeps is answered with
  NAK_DENY; the sender reports ``DATALOSS.OUTBOUND.BCAST`` and the receiver, on the denial,
  ``DATALOSS.INBOUND.BCAST``, both with the number of packets, then the receiver skips them,
  drops the message they were part of and carries on with the next whole message (TIBCO
  Rendezvous Concepts, Appendix A, System Advisory Messages, DATALOSS). A receiver that gets
  no answer at all gives up on a gap after the sender's reliability interval plus 2 s.
* **Multicast: first contact.** A receiver starts a stream at the first packet it hears from
  it (a heartbeat: after its highest sequence number), without asking for anything earlier:
  late joiners get no history. Fragments before the first FIRST_FRAG are dropped. A new
  incarnation from the same address is a new sender (the old state is dropped, silently).
* **Point-to-point: ACK-based.** The receiver acknowledges (cumulative ACK plus SACK ranges)
  within 20 ms or every 16 packets; the sender resends a hole below a SACKed packet at once,
  and what is not acknowledged after an RTO of 100 ms, doubling to 1 s, and gives up on a packet after the reliability interval
  (``DATALOSS.OUTBOUND.PTP``, and a NAK_DENY that makes the receiver report
  ``DATALOSS.INBOUND.PTP``). A receiver restarted under the same address resynchronises
  through a point-to-point HEARTBEAT, without a loss report.
* **Own packets** that come back through the multicast loopback are recognised by the
  header's (IP, port, incarnation) and ignored; a datagram that is not a packet of this
  protocol, or of another service, is counted in :attr:`Engine.stats` and ignored: nothing
  a peer sends makes this engine raise.

Guarantees (TIBCO Rendezvous Concepts, The Rendezvous Daemon, Reliable Message Delivery):
each message is delivered at most once, whole, and in send order per sending engine and stream
(multicast and point-to-point are separate streams, with no order between them nor across
senders); it is delivered unless a failure lasts longer than the reliability interval, in
which case the loss is reported as DATALOSS with the number of packets lost.

Why hand-written: no maintained Python library implements NAK-based reliable multicast.
The two standard protocols have C implementations, OpenPGM (PGM, RFC 3208, which needs raw
sockets) and NRL's NORM (RFC 5740), but PyPI's package index has no binding for either (NORM's
source tree carries a ctypes wrapper, pynorm, that is not published), and neither would fit a
sans-I/O engine driven by the gateway's event loop. The protocol here is small: the sender
keeps a deque, the receiver a dict of out-of-order packets per stream.
"""

from __future__ import annotations

import random
from collections import OrderedDict, deque
from typing import Final

from transports.rv.events import (
    DATALOSS_INBOUND_BCAST,
    DATALOSS_INBOUND_PTP,
    DATALOSS_OUTBOUND_BCAST,
    DATALOSS_OUTBOUND_PTP,
    MAX_MESSAGE,
    RETRANSMISSION_INBOUND_EXPECTED,
    RETRANSMISSION_OUTBOUND_SENT,
    Advisory,
    Delivered,
    EngineClosed,
    Event,
    MessageTooLarge,
    Sender,
    Stats,
)
from transports.rv.packet import (
    ACK,
    BATCH,
    BYE,
    DATA,
    FIRST_FRAG,
    HEADER,
    HEADER_LEN,
    HEARTBEAT,
    LAST_FRAG,
    MAGIC,
    MAX_DATAGRAM,
    MAX_RANGES,
    NAK,
    NAK_DENY,
    PTP,
    RETRANS,
    VERSION,
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

__all__ = [
    "DATALOSS_INBOUND_BCAST", "DATALOSS_INBOUND_PTP", "DATALOSS_OUTBOUND_BCAST",
    "DATALOSS_OUTBOUND_PTP", "MAX_MESSAGE", "MULTICAST", "NAK_MAX_PACKETS",
    "RETRANSMISSION_INBOUND_EXPECTED",
    "RETRANSMISSION_OUTBOUND_SENT", "Advisory", "Delivered", "Dest", "Engine", "EngineClosed",
    "Event", "MessageTooLarge", "Sender", "Stats",
]

#: Where a datagram goes: MULTICAST (the service's group or broadcast address) or (ip, port).
MULTICAST: Final = None
Dest = tuple[str, int] | None

# Timers (this protocol's own choices; Rendezvous does not publish its own).
HEARTBEAT_OFFSETS: Final = (0.05, 0.1, 0.2, 0.4, 0.8)  # after the last data
HEARTBEAT_IDLE: Final = 1.0  # then every second
NAK_DELAY_MAX: Final = 0.02  # first NAK after a random 0-20 ms (suppression)
NAK_BACKOFF_FIRST: Final = 0.05
NAK_BACKOFF_MAX: Final = 1.0
RETRANS_HOLDOFF: Final = 0.02  # a packet is retransmitted at most once per 20 ms
GIVE_UP_GRACE: Final = 2.0  # no answer for R + 2 s: the gap is lost
ACK_DELAY: Final = 0.02
ACK_EVERY: Final = 16
RTO_FIRST: Final = 0.1
RTO_MAX: Final = 1.0
RTO_BURST: Final = 64  # packets retransmitted per RTO expiry
MAX_RETRANS_PER_NAK: Final = 16384  # a receiver's default window; it asks again for more
# A receiver asks for at most this many packets per NAK, and for the next ones as those
# arrive: the repairs come in bursts a socket's receive buffer can hold, clocked by delivery,
# rather than as one burst of a whole window that overflows it again.
NAK_MAX_PACKETS: Final = 1024
MAX_REMEMBERED: Final = 1024  # ended incarnations and silent streams remembered

INF: Final = float("inf")


# A DATA packet that is one whole message (not a fragment, not a batch), whatever else it is.
WHOLE_MASK: Final = FIRST_FRAG | LAST_FRAG | BATCH
WHOLE: Final = FIRST_FRAG | LAST_FRAG


class _Gap:
    """Packets from ``first`` on (up to the next gap's ``first``) seen missing at ``since``;
    a multicast receiver asks for them at ``nak_at``, then again after ``backoff``."""

    __slots__ = ("first", "since", "nak_at", "backoff")

    def __init__(self, first: int, since: float, nak_at: float) -> None:
        self.first = first
        self.since = since
        self.nak_at = nak_at
        self.backoff = NAK_BACKOFF_FIRST


class _RecvStream:
    """What a receiver knows of one remote stream."""

    __slots__ = ("key", "peer", "sender", "host", "port", "incarnation", "ptp", "next",
                 "highest", "buf", "parts", "expect", "gaps", "nak_at",
                 "reliability", "heard", "ack_at", "unacked", "started", "asked",
                 "beyond")

    def __init__(self, key: int, peer: int, sender: Sender, ptp: bool, next_seq: int,
                 reliability: float, now: float) -> None:
        self.key = key
        self.peer = peer
        self.sender = sender
        self.host = sender[0]
        self.port = sender[1]
        self.incarnation = sender[2]
        self.ptp = ptp
        self.next = next_seq  # the next sequence number to deliver
        self.highest = next_seq - 1  # the highest sequence number known to exist
        self.buf: dict[int, tuple[int, int, bytes]] = {}  # seq -> (flags, aux, payload)
        self.parts: list[bytes] | None = None  # the message being reassembled
        self.expect = 0  # its total length
        # one record per jump of `highest` past missing packets, oldest first
        self.gaps: deque[_Gap] = deque()
        self.nak_at = INF  # the earliest of the gaps' nak_at
        self.reliability = reliability  # the sender's, once a heartbeat says it
        self.heard = now
        self.ack_at = INF
        self.unacked = 0
        self.started = False  # delivered or skipped anything yet
        self.asked = 0  # the highest sequence number a NAK has asked for
        # the highest missing packet that was past the out-of-order window (dropped, or in
        # a gap opened beyond it): asked for as the window moves up to it
        self.beyond = 0


class _PtpSend:
    """A sender's point-to-point stream to one destination engine."""

    __slots__ = ("dest", "host", "port", "next_seq", "base", "pending", "first_sent",
                 "sacked", "fast", "rto", "rto_at")

    def __init__(self, dest: tuple[str, int]) -> None:
        self.dest = dest
        self.host = dest[0]
        self.port = dest[1]
        self.next_seq = 1
        self.base = 1  # sequence number of pending[0]
        self.pending: deque[bytes] = deque()  # sent, not acknowledged
        self.first_sent: deque[float] = deque()
        self.sacked: set[int] = set()
        self.fast: set[int] = set()  # holes already retransmitted on a SACK since the RTO
        self.rto = RTO_FIRST
        self.rto_at = INF


class Engine:
    """The reliable multicast and point-to-point protocol of one service, sans-I/O.

    Parameters: ``ip`` (this engine's interface address, in every header), ``port`` (its
    unicast inbox port), ``service`` (the UDP service port), ``incarnation`` (random when
    None), ``reliability`` (seconds a sender keeps packets; TIBCO Rendezvous Concepts,
    The Rendezvous Daemon, Reliable Message Delivery: 60 s by default, 0 for none),
    ``payload_size`` (message bytes per packet), ``rng`` (for the NAK delays; seed it in tests),
    ``max_retention_bytes`` (0: only the interval bounds retention), ``max_out_of_order``
    (packets buffered per remote stream behind a gap), ``peer_timeout`` (seconds of silence
    after which a remote stream's state is dropped; its position is remembered).
    """

    def __init__(self, *, ip: str, port: int, service: int, incarnation: int | None = None,
                 reliability: float = 60.0, payload_size: int = 1400,
                 rng: random.Random | None = None, max_retention_bytes: int = 0,
                 max_out_of_order: int = 16384, peer_timeout: float = 600.0) -> None:
        if not 0 < port < 65536 or not 0 < service < 65536:
            raise ValueError("port and service must be UDP ports")
        if not 0 < payload_size <= MAX_DATAGRAM - HEADER_LEN:
            raise ValueError(f"payload_size must be 1..{MAX_DATAGRAM - HEADER_LEN}")
        if reliability < 0:
            raise ValueError("reliability must not be negative")
        self.ip = ip
        self.port = port
        self.service = service
        self._ip = ip_to_int(ip)
        self._rng = rng if rng is not None else random.Random()
        if incarnation is None:
            incarnation = self._rng.getrandbits(32) or 1
        if not 0 <= incarnation < 2**32:
            raise ValueError("incarnation is a 32-bit unsigned number")
        self.incarnation = incarnation
        self.sender: Sender = (ip, port, incarnation)
        self.reliability = float(reliability)
        self.payload_size = payload_size
        self.max_retention_bytes = max_retention_bytes
        self.max_out_of_order = max_out_of_order
        self.peer_timeout = peer_timeout
        self.stats = Stats()
        self.closed = False
        self._out: list[tuple[bytes, Dest]] = []
        self._events: list[Event] = []
        # the open batch: small multicast messages not yet in a packet
        self._batch: list[bytes] = []
        self._batch_used = 0  # its body's bytes
        self._batch_t = 0.0  # when its first message was sent
        # multicast sender
        self._seq = 1  # next sequence number
        self._ret: deque[bytes] = deque()  # retained datagrams, oldest first
        self._ret_t: deque[float] = deque()
        self._ret_base = 1  # sequence number of _ret[0]
        self._ret_bytes = 0
        self._retx_at: dict[int, float] = {}  # seq -> when last retransmitted
        self._denied_upto: dict[int, int] = {}  # requester -> highest seq counted as denied
        self._last_data = -INF
        self._hb_step = 0
        self._hb_at = INF
        # point-to-point senders
        self._ptp_out: dict[tuple[str, int], _PtpSend] = {}
        # receivers
        self._mcast_in: dict[int, _RecvStream] = {}
        self._ptp_in: dict[int, _RecvStream] = {}
        self._peer_inc: dict[int, int] = {}  # (ip << 16 | port) -> current incarnation
        self._ended: OrderedDict[int, None] = OrderedDict()  # stream keys of ended engines
        self._silent: OrderedDict[int, int] = OrderedDict()  # dropped key -> next seq
        # pre-packed control headers
        self._hb_head = header(HEARTBEAT, 0, self._ip, port, service, incarnation)
        self._hb_head_ptp = header(HEARTBEAT, PTP, self._ip, port, service, incarnation)
        self._nak_head = header(NAK, 0, self._ip, port, service, incarnation)
        self._deny_head = header(NAK_DENY, 0, self._ip, port, service, incarnation)
        self._deny_head_ptp = header(NAK_DENY, PTP, self._ip, port, service, incarnation)
        self._ack_head = header(ACK, PTP, self._ip, port, service, incarnation)

    # ------------------------------------------------------------------ the shell's side

    def datagrams_to_send(self) -> list[tuple[bytes, Dest]]:
        """Everything to write since the last call: (datagram, MULTICAST or (ip, port))."""
        if self._batch:
            self._close_batch()
        out = self._out
        self._out = []
        return out

    def events(self) -> list[Event]:
        """Delivered messages and advisories since the last call, in order."""
        ev = self._events
        self._events = []
        return ev

    def next_deadline(self) -> float | None:
        """The earliest time :meth:`tick` has work (None: nothing scheduled)."""
        if self.closed:
            return None
        t = self._hb_at
        if self._ret_t and self.reliability:
            t = min(t, self._ret_t[0] + self.reliability)
        for st in self._mcast_in.values():
            t = min(t, st.nak_at, st.heard + self.peer_timeout)
            if st.gaps:
                t = min(t, st.gaps[0].since + st.reliability + GIVE_UP_GRACE)
        for st in self._ptp_in.values():
            t = min(t, st.ack_at, st.heard + self.peer_timeout)
            if st.gaps:
                t = min(t, st.gaps[0].since + st.reliability + GIVE_UP_GRACE)
        for ps in self._ptp_out.values():
            t = min(t, ps.rto_at)
        return None if t == INF else t

    # ------------------------------------------------------------------ sending

    def send(self, payload: bytes, now: float) -> None:
        """Send one message on the multicast stream (TIBCO Rendezvous Concepts,
        Fundamentals, Multicast and Point-to-Point Messages)."""
        if self.closed:
            raise EngineClosed("engine closed")
        n = len(payload)
        size = self.payload_size
        if n > MAX_MESSAGE:
            raise MessageTooLarge(n, (n + size - 1) // size)
        reliability = self.reliability
        stats = self.stats
        if n + 4 <= size:  # a batch's: its length and bytes fit in one packet's body
            if self._batch_used + 4 + n > size:
                self._close_batch()
            if not self._batch:
                self._batch_t = now
            self._batch.append(payload)
            self._batch_used += 4 + n
        else:
            if self._batch:
                self._close_batch()  # what was sent before goes first
            seq = self._seq
            base = seq
            for off in range(0, n, size):
                flags = FIRST_FRAG if off == 0 else 0
                if off + size >= n:
                    flags |= LAST_FRAG
                d = HEADER.pack(MAGIC, VERSION, DATA, flags, HEADER_LEN, self._ip, self.port,
                                self.service, self.incarnation, seq,
                                n if off == 0 else seq - base) + payload[off:off + size]
                self._out.append((d, MULTICAST))
                if reliability:
                    if not self._ret:
                        self._ret_base = seq
                    self._ret.append(d)
                    self._ret_t.append(now)
                    self._ret_bytes += len(d)
                seq += 1
            stats.packets_sent += seq - base
            self._seq = seq
        stats.messages_sent += 1
        stats.bytes_sent += n
        self._last_data = now
        self._hb_step = 0
        self._hb_at = now + HEARTBEAT_OFFSETS[0]
        if self._ret_t and (self._ret_t[0] + reliability <= now
                            or (self.max_retention_bytes
                                and self._ret_bytes > self.max_retention_bytes)):
            self._expire(now)

    def _close_batch(self) -> None:
        """Put the open batch in one packet: a plain one for a single message."""
        batch = self._batch
        seq = self._seq
        if len(batch) == 1:
            m = batch[0]
            d = HEADER.pack(MAGIC, VERSION, DATA, FIRST_FRAG | LAST_FRAG, HEADER_LEN, self._ip,
                            self.port, self.service, self.incarnation, seq, len(m)) + m
        else:
            d = HEADER.pack(MAGIC, VERSION, DATA, FIRST_FRAG | LAST_FRAG | BATCH, HEADER_LEN,
                            self._ip, self.port, self.service, self.incarnation, seq,
                            len(batch)) + batch_body(batch)
        self._batch = []
        self._batch_used = 0
        self._out.append((d, MULTICAST))
        if self.reliability:
            if not self._ret:
                self._ret_base = seq
            self._ret.append(d)
            self._ret_t.append(self._batch_t)
            self._ret_bytes += len(d)
            if self.max_retention_bytes and self._ret_bytes > self.max_retention_bytes:
                self._expire(self._batch_t)
        self._seq = seq + 1
        self.stats.packets_sent += 1

    def send_to(self, dest: tuple[str, int], payload: bytes, now: float) -> None:
        """Send one message on the point-to-point stream to the engine whose inbox port is
        ``dest`` (TIBCO Rendezvous Concepts, Fundamentals, Inbox Names). A message to this
        engine's own address is delivered here, without the network."""
        if self.closed:
            raise EngineClosed("engine closed")
        n = len(payload)
        size = self.payload_size
        if n > MAX_MESSAGE:
            raise MessageTooLarge(n, (n + size - 1) // size)
        stats = self.stats
        stats.messages_sent += 1
        stats.bytes_sent += n
        if dest[0] == self.ip and dest[1] == self.port:
            stats.messages_received += 1
            stats.bytes_received += n
            self._events.append(Delivered(bytes(payload), self.sender, True))
            return
        ps = self._ptp_out.get(dest)
        if ps is None:
            ip_to_int(dest[0])  # a bad address is the caller's error, raised here
            ps = self._ptp_out[dest] = _PtpSend(dest)
        seq = ps.next_seq
        base = seq
        off = 0
        while True:
            flags = PTP | (FIRST_FRAG if off == 0 else 0)
            if off + size >= n:
                flags |= LAST_FRAG
            d = HEADER.pack(MAGIC, VERSION, DATA, flags, HEADER_LEN, self._ip, self.port,
                            self.service, self.incarnation, seq,
                            n if off == 0 else seq - base) + payload[off:off + size]
            self._out.append((d, dest))
            ps.pending.append(d)
            ps.first_sent.append(now)
            seq += 1
            off += size
            if off >= n:
                break
        stats.packets_sent += seq - base
        ps.next_seq = seq
        if ps.rto_at == INF:
            ps.rto_at = now + ps.rto

    def close(self, now: float) -> None:
        """Say BYE on the multicast stream and to every point-to-point destination; the
        engine then sends and delivers nothing more. Nothing waits for retransmissions."""
        if self.closed:
            return
        if self._batch:
            self._close_batch()
        self._emit(header(BYE, 0, self._ip, self.port, self.service, self.incarnation,
                          self._seq - 1), MULTICAST)
        for dest, ps in self._ptp_out.items():
            self._emit(header(BYE, PTP, self._ip, self.port, self.service, self.incarnation,
                              ps.next_seq - 1), dest)
        self.closed = True
        self._hb_at = INF

    # ------------------------------------------------------------------ receiving

    def receive_datagram(self, data: bytes, addr: tuple[str, int], now: float) -> None:
        """Take one datagram read from either socket. Never raises for what a peer sends."""
        if self.closed:
            return
        if len(data) < HEADER_LEN:
            self.stats.malformed += 1
            return
        (magic, version, ptype, flags, hdr_len, src_ip, src_port, service, inc, seq,
         aux) = HEADER.unpack_from(data)
        if magic != MAGIC or version != VERSION or hdr_len < HEADER_LEN \
                or hdr_len > len(data):
            self.stats.malformed += 1
            return
        if service != self.service:
            self.stats.foreign += 1
            return
        if src_ip == self._ip and src_port == self.port and inc == self.incarnation:
            self.stats.looped += 1
            return
        if ptype != DATA or seq == 0:
            try:
                pkt = decode(data)
            except PacketError:
                self.stats.malformed += 1
                return
            self.stats.packets_received += 1
            self._control(pkt.ptype, pkt.flags, src_ip, src_port, inc, pkt.seq, pkt.ranges,
                          pkt.highest_seq, pkt.reliability_ms, pkt.stream_incarnation,
                          pkt.cum_ack, now)
            return
        self.stats.packets_received += 1
        key = (src_ip << 48) | (src_port << 32) | inc
        ptp = flags & PTP
        st = (self._ptp_in if ptp else self._mcast_in).get(key)
        if st is None:
            if flags & RETRANS and not ptp:
                return  # a repair for others: not a place to start a stream
            st = self._new_stream(key, src_ip, src_port, inc, bool(ptp), seq, now)
            if st is None:
                return
        st.heard = now
        payload = data[hdr_len:]
        if seq == st.next:
            if not st.buf:
                # the common case: in order, nothing waiting
                st.next = seq + 1
                if seq > st.highest:
                    st.highest = seq
                if flags & WHOLE_MASK == WHOLE and st.parts is None and aux == len(payload):
                    st.started = True
                    self.stats.messages_received += 1
                    self.stats.bytes_received += aux
                    self._events.append(Delivered(payload, st.sender, st.ptp))
                else:
                    self._accept(st, flags, aux, payload)
                if st.gaps:
                    self._progress(st)
            else:
                self._accept(st, flags, aux, payload)
                st.next = seq + 1
                self._drain(st)
            if ptp:
                self._ack_soon(st, now)
            return
        if seq < st.next or seq in st.buf:
            self.stats.duplicates += 1
            if ptp:
                self._ack_soon(st, now)
            return
        # a gap before this packet
        if seq > st.highest + 1:
            self._gap(st, st.highest + 1, seq - 1, now)
        if seq > st.highest:
            st.highest = seq
        if seq - st.next < self.max_out_of_order:
            st.buf[seq] = (flags, aux, payload)
        else:
            self.stats.overflow += 1
            if seq > st.beyond:
                st.beyond = seq
        if ptp:
            self._ack_soon(st, now)

    def _new_stream(self, key: int, src_ip: int, src_port: int, inc: int, ptp: bool,
                    seq: int, now: float) -> _RecvStream | None:
        """First contact with a remote stream (``seq``: its first sequence number heard)."""
        if key in self._ended:
            self.stats.foreign += 1
            return None
        peer = (src_ip << 16) | src_port
        known = self._peer_inc.get(peer)
        if known is not None and known != inc:
            self._forget_peer(peer, known)
        self._peer_inc[peer] = inc
        ip = int_to_ip(src_ip)
        start = self._silent.pop(key, 0) if not ptp else 0
        if ptp:
            # a point-to-point stream is wanted from its start; a restarted receiver is
            # told where it is by the sender's HEARTBEAT (see _ack)
            start = 1
        elif not start:
            start = seq  # late joiner: nothing earlier (TIBCO Rendezvous Concepts, Fundamentals)
        st = _RecvStream(key, peer, (ip, src_port, inc), ptp, start, self.reliability, now)
        (self._ptp_in if ptp else self._mcast_in)[key] = st
        return st

    def _forget_peer(self, peer: int, old_inc: int) -> None:
        """A new incarnation at the same address: the old one's streams end, silently."""
        old = ((peer << 32) | old_inc)
        for table in (self._mcast_in, self._ptp_in):
            if old in table:
                del table[old]
        self._remember_ended(old)

    def _remember_ended(self, key: int) -> None:
        self._ended[key] = None
        if len(self._ended) > MAX_REMEMBERED:
            self._ended.popitem(last=False)

    def _accept(self, st: _RecvStream, flags: int, aux: int, payload: bytes) -> None:
        """The packet that is next in sequence: reassemble and deliver."""
        if flags & FIRST_FRAG:
            st.started = True
            if flags & LAST_FRAG:
                st.parts = None
                if flags & BATCH:
                    self._unbatch(st, aux, payload)
                elif aux == len(payload):
                    self.stats.messages_received += 1
                    self.stats.bytes_received += aux
                    self._events.append(Delivered(payload, st.sender, st.ptp))
                else:
                    self.stats.malformed += 1
                return
            if aux > MAX_MESSAGE or len(payload) >= aux:
                st.parts = None
                self.stats.malformed += 1
                return
            st.parts = [payload]
            st.expect = aux
            return
        parts = st.parts
        if parts is None:
            return  # the rest of a message whose start was lost or before our time
        if aux != len(parts):
            st.parts = None
            self.stats.malformed += 1
            return
        parts.append(payload)
        if flags & LAST_FRAG:
            st.parts = None
            message = b"".join(parts)
            if len(message) == st.expect:
                self.stats.messages_received += 1
                self.stats.bytes_received += len(message)
                self._events.append(Delivered(message, st.sender, st.ptp))
            else:
                self.stats.malformed += 1

    def _unbatch(self, st: _RecvStream, count: int, body: bytes) -> None:
        try:
            messages = split_batch(body, count)
        except PacketError:
            self.stats.malformed += 1
            return
        stats = self.stats
        stats.messages_received += count
        events = self._events
        for m in messages:
            stats.bytes_received += len(m)
            events.append(Delivered(m, st.sender, st.ptp))

    def _drain(self, st: _RecvStream) -> None:
        buf = st.buf
        while st.next in buf:
            flags, aux, payload = buf.pop(st.next)
            st.next += 1
            self._accept(st, flags, aux, payload)
        self._progress(st)

    def _progress(self, st: _RecvStream) -> None:
        """The head moved: drop gap records behind it; no gap left -> no NAK."""
        if st.next > st.highest:
            st.gaps.clear()
            st.nak_at = INF
            return
        gaps = st.gaps
        while len(gaps) > 1 and gaps[1].first <= st.next:
            gaps.popleft()
        if st.beyond > st.asked and not st.ptp \
                and st.asked - st.next < NAK_MAX_PACKETS // 2 \
                and st.asked < min(st.highest, st.next + self.max_out_of_order - 1):
            # the window moved over packets known missing and never asked for (dropped
            # past the buffer, or behind a gap that was beyond it): ask now, not on the
            # backoff, or a sender that keeps sending outruns the repair for good; only
            # when half of what was last asked has arrived, so NAKs stay few and large
            if st.heard < st.nak_at:
                st.nak_at = st.heard

    def _gap(self, st: _RecvStream, first: int, last: int, now: float) -> None:
        """Packets ``first..last`` are known to exist and have not arrived (yet: a packet
        only overtaken by a later one arrives before the NAK is due)."""
        if st.ptp:
            self.stats.packets_missed += last - first + 1
            st.gaps.append(_Gap(first, now, INF))
        else:
            # a random delay, so that of the listeners that lost the same packets the first
            # to ask usually gets the retransmission to the others before they ask
            nak_at = now + self._rng.random() * NAK_DELAY_MAX
            st.gaps.append(_Gap(first, now, nak_at))
            if last - st.next >= self.max_out_of_order and last > st.beyond:
                st.beyond = last
            if nak_at < st.nak_at:
                st.nak_at = nak_at

    def _skip_to(self, st: _RecvStream, end: int) -> int:
        """Give up every packet before ``end`` that is still missing; deliver what was
        buffered among them (whole messages only). Returns the packets given up."""
        lost = 0
        buf = st.buf
        for k in sorted(k for k in buf if k < end):
            if k > st.next:
                lost += k - st.next
                st.next = k
                st.parts = None
            flags, aux, payload = buf.pop(k)
            st.next = k + 1
            self._accept(st, flags, aux, payload)
        if end > st.next:
            lost += end - st.next
            st.next = end
            st.parts = None
        if end - 1 > st.highest:
            st.highest = end - 1
        st.started = True
        self._drain(st)
        return lost

    def _data_loss(self, st: _RecvStream, end: int) -> None:
        lost = self._skip_to(st, end)
        if lost:
            self.stats.inbound_data_loss += lost
            self._events.append(Advisory(
                DATALOSS_INBOUND_PTP if st.ptp else DATALOSS_INBOUND_BCAST,
                {"host": st.host, "lost": lost, "scid": self.service}))
        if st.ptp:
            st.ack_at = min(st.ack_at, st.heard)  # tell the sender promptly

    def _control(self, ptype: int, flags: int, src_ip: int, src_port: int, inc: int,
                 seq: int, ranges: tuple[tuple[int, int], ...], highest: int,
                 reliability_ms: int, stream_inc: int, cum_ack: int, now: float) -> None:
        key = (src_ip << 48) | (src_port << 32) | inc
        if ptype == NAK:
            if stream_inc == self.incarnation and not flags & PTP:
                self._nak(src_ip, src_port, ranges, now)
            return
        if ptype == ACK:
            if stream_inc == self.incarnation:
                self._ack(src_ip, src_port, cum_ack, ranges, now)
            return
        if ptype == BYE:
            self._bye(key, src_ip, src_port, bool(flags & PTP), seq)
            return
        ptp = bool(flags & PTP)
        st = (self._ptp_in if ptp else self._mcast_in).get(key)
        if ptype == HEARTBEAT:
            if st is None:
                if ptp:
                    return
                st = self._new_stream(key, src_ip, src_port, inc, False, highest + 1, now)
                if st is None:
                    return
            st.heard = now
            st.reliability = reliability_ms / 1000.0
            if ptp:
                # the sender keeps nothing before `highest + 1` for us: a restarted receiver
                # starts there; otherwise what we miss before it is lost
                if highest + 1 > st.next:
                    if st.started:
                        self._data_loss(st, highest + 1)
                    else:
                        self._skip_to(st, highest + 1)
                return
            if highest > st.highest:
                self._gap(st, st.highest + 1, highest, now)
                st.highest = highest
            return
        if ptype == NAK_DENY and st is not None and stream_inc == inc:
            st.heard = now
            end = max(last for _, last in ranges) + 1
            if end > st.next:
                self._data_loss(st, end)

    def _bye(self, key: int, src_ip: int, src_port: int, ptp: bool, highest: int) -> None:
        """The sender closed: what we still miss of its stream is lost; its state goes."""
        table = self._ptp_in if ptp else self._mcast_in
        st = table.get(key)
        if st is not None:
            if highest + 1 > st.next:
                self._data_loss(st, highest + 1)
            del table[key]
        self._remember_ended(key)
        peer = (src_ip << 16) | src_port
        self._denied_upto.pop(peer, None)
        if self._peer_inc.get(peer) == key & 0xFFFFFFFF:
            del self._peer_inc[peer]
        # its inbox port is gone: what it has not acknowledged to us is lost
        ps = self._ptp_out.pop((int_to_ip(src_ip), src_port), None)
        if ps is not None:
            lost = sum(1 for i in range(len(ps.pending)) if ps.base + i not in ps.sacked)
            if lost:
                self._outbound_ptp_loss(ps.host, lost)

    # ------------------------------------------------------------------ multicast sender

    def _nak(self, src_ip: int, src_port: int, ranges: tuple[tuple[int, int], ...],
             now: float) -> None:
        """Retransmit what is retained, deny the rest (TIBCO Rendezvous Concepts,
        The Rendezvous Daemon, Reliable Message Delivery; Appendix A, DATALOSS and
        RETRANSMISSION.OUTBOUND.SENT)."""
        self.stats.naks_received += 1
        lowest = self._ret_base if self._ret else self._seq
        top = self._seq - 1
        denied: list[tuple[int, int]] = []
        resent = 0
        ret = self._ret
        retx_at = self._retx_at
        for first, last in ranges:
            if last > top:
                last = top
            if first > last:
                continue
            if first < lowest:
                denied.append((first, min(last, lowest - 1)))
                first = lowest
            last = min(last, first + MAX_RETRANS_PER_NAK - resent - 1)
            for s in range(first, last + 1):
                t = retx_at.get(s)
                if t is not None and now - t < RETRANS_HOLDOFF:
                    continue  # another listener's NAK for it was just answered
                retx_at[s] = now
                d = bytearray(ret[s - self._ret_base])
                d[5] |= RETRANS
                self._out.append((bytes(d), MULTICAST))
                resent += 1
        host = int_to_ip(src_ip)
        if resent:
            self.stats.retransmitted += resent
            self.stats.packets_sent += resent
            self._events.append(Advisory(RETRANSMISSION_OUTBOUND_SENT,
                                         {"host": host, "lost": resent}))
        if denied:
            self._emit(encode_nak(self._deny_head, self.incarnation, denied),
                       (host, src_port))
            requester = (src_ip << 16) | src_port
            upto = self._denied_upto.get(requester, 0)
            lost = 0
            for first, last in denied:
                if last > upto:
                    lost += last - max(first, upto + 1) + 1
                    upto = last
            self._denied_upto[requester] = upto
            if lost:
                self.stats.outbound_data_loss += lost
                self._events.append(Advisory(DATALOSS_OUTBOUND_BCAST,
                                             {"host": host, "lost": lost,
                                              "scid": self.service}))

    def _expire(self, now: float) -> None:
        """Drop retained packets older than the reliability interval (or past the cap)."""
        reliability = self.reliability
        ret, ret_t = self._ret, self._ret_t
        cap = self.max_retention_bytes
        # the same comparison as next_deadline's, so that the deadline is always cleared
        while ret_t and (ret_t[0] + reliability <= now or (cap and self._ret_bytes > cap)):
            self._ret_bytes -= len(ret.popleft())
            ret_t.popleft()
            self._ret_base += 1

    # ------------------------------------------------------------------ point-to-point

    def _ack_soon(self, st: _RecvStream, now: float) -> None:
        st.unacked += 1
        if st.unacked >= ACK_EVERY:
            self._send_ack(st)
        elif st.ack_at == INF:
            st.ack_at = now + ACK_DELAY

    def _send_ack(self, st: _RecvStream) -> None:
        sack: list[tuple[int, int]] = []
        for k in sorted(st.buf):
            if sack and sack[-1][1] == k - 1:
                sack[-1] = (sack[-1][0], k)
            elif len(sack) < MAX_RANGES:
                sack.append((k, k))
            else:
                break
        self._emit(encode_ack(self._ack_head, st.incarnation, st.next - 1, sack),
                   (st.host, st.port))
        self.stats.acks_sent += 1
        st.unacked = 0
        st.ack_at = INF

    def _ack(self, src_ip: int, src_port: int, cum: int, sack: tuple[tuple[int, int], ...],
             now: float) -> None:
        ps = self._ptp_out.get((int_to_ip(src_ip), src_port))
        if ps is None:
            return
        if cum + 1 < ps.base:
            # the receiver asks for what an earlier incarnation of it acknowledged: it has
            # restarted; tell it where the stream is
            self._emit(encode_heartbeat(self._hb_head_ptp, ps.base - 1, ps.base,
                                        int(self.reliability * 1000)), ps.dest)
        progressed = False
        while ps.pending and ps.base <= cum:
            ps.pending.popleft()
            ps.first_sent.popleft()
            ps.sacked.discard(ps.base)
            ps.fast.discard(ps.base)
            ps.base += 1
            progressed = True
        top = ps.base + len(ps.pending)
        highest_sacked = 0
        for first, last in sack:
            for s in range(max(first, ps.base), min(last + 1, top)):
                if s not in ps.sacked:
                    ps.sacked.add(s)
                    progressed = True
                highest_sacked = s
        if highest_sacked:
            # fast retransmit: what the receiver lacks below what it has is most likely
            # lost; resend each such hole once, rather than wait for the RTO
            sent = 0
            for s in range(ps.base, highest_sacked):
                if s not in ps.sacked and s not in ps.fast:
                    ps.fast.add(s)
                    b = bytearray(ps.pending[s - ps.base])
                    b[5] |= RETRANS
                    self._out.append((bytes(b), ps.dest))
                    sent += 1
                    if sent >= RTO_BURST:
                        break
            self.stats.retransmitted += sent
            self.stats.packets_sent += sent
        if progressed:
            ps.rto = RTO_FIRST
            ps.rto_at = now + ps.rto if ps.pending else INF

    def _rto(self, ps: _PtpSend, now: float) -> None:
        """Retransmit what is not acknowledged; give up on what is older than the
        reliability interval (DATALOSS.OUTBOUND.PTP)."""
        lost_first = 0
        lost = 0
        while ps.pending and ps.first_sent[0] + self.reliability <= now:
            if ps.base not in ps.sacked:
                if not lost_first:
                    lost_first = ps.base
                lost += 1
            else:
                ps.sacked.discard(ps.base)
            ps.fast.discard(ps.base)
            ps.pending.popleft()
            ps.first_sent.popleft()
            ps.base += 1
        if lost:
            self._emit(encode_nak(self._deny_head_ptp, self.incarnation,
                                  [(lost_first, ps.base - 1)]), ps.dest)
            self._outbound_ptp_loss(ps.host, lost)
        ps.fast.clear()
        sent = 0
        for i, d in enumerate(ps.pending):
            if ps.base + i in ps.sacked:
                continue
            b = bytearray(d)
            b[5] |= RETRANS
            self._out.append((bytes(b), ps.dest))
            sent += 1
            if sent >= RTO_BURST:
                break
        self.stats.retransmitted += sent
        self.stats.packets_sent += sent
        if ps.pending:
            ps.rto = min(ps.rto * 2, RTO_MAX)
            ps.rto_at = now + ps.rto
        else:
            ps.rto = RTO_FIRST
            ps.rto_at = INF

    def _outbound_ptp_loss(self, host: str, lost: int) -> None:
        self.stats.outbound_data_loss += lost
        self._events.append(Advisory(DATALOSS_OUTBOUND_PTP,
                                     {"host": host, "lost": lost, "scid": self.service}))

    # ------------------------------------------------------------------ timers

    def tick(self, now: float) -> None:
        """Run every timer that is due: heartbeats, retention expiry, NAKs and their
        give-up, ACKs, retransmission timeouts, silent peers."""
        if self.closed:
            return
        if self._batch:
            self._close_batch()  # a heartbeat announces every message sent
        if now >= self._hb_at:
            self._emit(encode_heartbeat(self._hb_head, self._seq - 1,
                                        self._ret_base if self._ret else self._seq,
                                        int(self.reliability * 1000)), MULTICAST)
            step = self._hb_step + 1
            while step < len(HEARTBEAT_OFFSETS) \
                    and self._last_data + HEARTBEAT_OFFSETS[step] <= now:
                step += 1  # the shell ticked late: no burst of overdue heartbeats
            self._hb_step = step
            if step < len(HEARTBEAT_OFFSETS):
                self._hb_at = self._last_data + HEARTBEAT_OFFSETS[step]
            else:
                self._hb_at = now + HEARTBEAT_IDLE
        if self._ret_t:
            self._expire(now)
        if self._retx_at:
            for s in [s for s, t in self._retx_at.items() if now - t >= RETRANS_HOLDOFF]:
                del self._retx_at[s]
        for st in list(self._mcast_in.values()):
            self._tick_stream(st, now, self._mcast_in)
        for st in list(self._ptp_in.values()):
            self._tick_stream(st, now, self._ptp_in)
        for ps in list(self._ptp_out.values()):
            if now >= ps.rto_at:
                self._rto(ps, now)

    def _tick_stream(self, st: _RecvStream, now: float, table: dict[int, _RecvStream]) -> None:
        if st.gaps and now >= st.gaps[0].since + st.reliability + GIVE_UP_GRACE:
            # nobody answered for longer than the sender keeps data: the head gap is lost
            end = st.highest + 1
            for k in st.buf:
                if k < end:
                    end = k
            if len(st.gaps) > 1:
                end = min(end, st.gaps[1].first)
            self._data_loss(st, end)
        if now >= st.nak_at:
            self._send_nak(st, now)
        if now >= st.ack_at:
            self._send_ack(st)
        if now >= st.heard + self.peer_timeout:
            # silent for long: forget it, but remember where it was, so that if it speaks
            # again what we missed is asked for (and reported) rather than ignored
            del table[st.key]
            if not st.ptp:
                self._silent[st.key] = st.next
                if len(self._silent) > MAX_REMEMBERED:
                    self._silent.popitem(last=False)

    def _send_nak(self, st: _RecvStream, now: float) -> None:
        """Ask the sender for the missing packets of every gap whose time has come, within
        the window behind the head (TIBCO Rendezvous Concepts, The Rendezvous Daemon,
        Reliable Message Delivery). Each gap backs off on its own: 50, 100, 200 ... 1,000
        ms. Missing packets never asked for yet are asked for whatever their gap's timer
        (the window moved over them); at most ``NAK_MAX_PACKETS`` per NAK. A packet's
        first request counts it as missed and reports it (TIBCO Rendezvous Concepts,
        Appendix A, RETRANSMISSION.INBOUND.EXPECTED)."""
        limit = min(st.highest, st.next + self.max_out_of_order - 1)
        asked = st.asked
        keys = sorted(k for k in st.buf if k <= limit)
        ranges: list[tuple[int, int]] = []
        budget = NAK_MAX_PACKETS
        gaps = st.gaps
        ki = 0
        nak_at = INF
        for gi, g in enumerate(gaps):
            due = g.nak_at <= now
            lo = max(g.first, st.next)
            hi = min(gaps[gi + 1].first - 1 if gi + 1 < len(gaps) else st.highest, limit)
            if not due:
                lo = max(lo, asked + 1)  # only what was never asked for
            if lo <= hi and budget > 0 and len(ranges) < MAX_RANGES:
                while ki < len(keys) and keys[ki] < lo:
                    ki += 1
                s = lo
                before = len(ranges)
                while s <= hi and budget > 0 and len(ranges) < MAX_RANGES:
                    if ki < len(keys) and keys[ki] <= hi:
                        k = keys[ki]
                        ki += 1
                        if k > s:
                            e = min(k - 1, s + budget - 1)
                            ranges.append((s, e))
                            budget -= e - s + 1
                        s = k + 1
                    else:
                        e = min(hi, s + budget - 1)
                        ranges.append((s, e))
                        budget -= e - s + 1
                        break
                if due or len(ranges) > before:
                    # jittered, so that listeners missing the same packets drift apart
                    g.nak_at = now + g.backoff * (0.75 + 0.5 * self._rng.random())
                    g.backoff = min(g.backoff * 2, NAK_BACKOFF_MAX)
            elif due:
                if lo <= hi:
                    g.nak_at = now + NAK_BACKOFF_FIRST  # this NAK was full: the next one
                else:
                    # nothing of it inside the window: asked for when the window reaches
                    # it (st.beyond), see _drain
                    g.nak_at = INF
            if g.nak_at < nak_at:
                nak_at = g.nak_at
        st.nak_at = nak_at
        if ranges:
            count = 0
            for first, last in ranges:
                if last > asked:
                    count += last - max(first, asked + 1) + 1
            if count:
                st.asked = ranges[-1][1]
                self.stats.packets_missed += count
                self._events.append(Advisory(RETRANSMISSION_INBOUND_EXPECTED,
                                             {"host": st.host, "lost": count}))
            self._emit(encode_nak(self._nak_head, st.incarnation, ranges),
                       (st.host, st.port))
            self.stats.naks_sent += 1

    def _emit(self, datagram: bytes, dest: Dest) -> None:
        self._out.append((datagram, dest))
        self.stats.packets_sent += 1
