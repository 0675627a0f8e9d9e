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

How it works (the packet layout is in :mod:`transports.rv.packet`; the repair of lost packets
— NAKs, ACKs, retransmissions — is in :mod:`transports.rv.repair`):

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
    MULTICAST,
    RETRANSMISSION_INBOUND_EXPECTED,
    RETRANSMISSION_OUTBOUND_SENT,
    Advisory,
    Delivered,
    Dest,
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
    NAK,
    NAK_DENY,
    PTP,
    RETRANS,
    VERSION,
    PacketError,
    batch_body,
    decode,
    encode_heartbeat,
    header,
    int_to_ip,
    ip_to_int,
    split_batch,
)
from transports.rv.repair import (
    GIVE_UP_GRACE,
    INF,
    NAK_MAX_PACKETS,
    RETRANS_HOLDOFF,
    PtpSend,
    RecvStream,
    Repair,
)

__all__ = [
    "DATALOSS_INBOUND_BCAST", "DATALOSS_INBOUND_PTP", "DATALOSS_OUTBOUND_BCAST",
    "DATALOSS_OUTBOUND_PTP", "MAX_MESSAGE",
    "RETRANSMISSION_INBOUND_EXPECTED",
    "RETRANSMISSION_OUTBOUND_SENT", "Advisory", "Delivered", "Engine", "EngineClosed",
    "Event", "MessageTooLarge", "Sender", "Stats",
]

# Timers (this protocol's own choices; Rendezvous does not publish its own; the repair
# timers are in transports.rv.repair).
HEARTBEAT_OFFSETS: Final = (0.05, 0.1, 0.2, 0.4, 0.8)  # after the last data
HEARTBEAT_IDLE: Final = 1.0  # then every second
MAX_REMEMBERED: Final = 1024  # ended incarnations and silent streams remembered


# A DATA packet that is one whole message (not a fragment, not a batch), whatever else it is.
WHOLE_MASK: Final = FIRST_FRAG | LAST_FRAG | BATCH
WHOLE: Final = FIRST_FRAG | LAST_FRAG


class Engine(Repair):
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
        self._ptp_out: dict[tuple[str, int], PtpSend] = {}
        # receivers
        self._mcast_in: dict[int, RecvStream] = {}
        self._ptp_in: dict[int, RecvStream] = {}
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
            ps = self._ptp_out[dest] = PtpSend(dest)
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
                    seq: int, now: float) -> RecvStream | None:
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
        st = RecvStream(key, peer, (ip, src_port, inc), ptp, start, self.reliability, now)
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

    def _accept(self, st: RecvStream, flags: int, aux: int, payload: bytes) -> None:
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

    def _unbatch(self, st: RecvStream, count: int, body: bytes) -> None:
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

    def _drain(self, st: RecvStream) -> None:
        buf = st.buf
        while st.next in buf:
            flags, aux, payload = buf.pop(st.next)
            st.next += 1
            self._accept(st, flags, aux, payload)
        self._progress(st)

    def _progress(self, st: RecvStream) -> None:
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

    def _skip_to(self, st: RecvStream, end: int) -> int:
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

    def _data_loss(self, st: RecvStream, end: int) -> None:
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

    def _tick_stream(self, st: RecvStream, now: float, table: dict[int, RecvStream]) -> None:
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

