"""Loss repair for the RV-style reliable multicast engine, and the stream state it works on.

:class:`~transports.rv.engine.Engine` derives from :class:`Repair`, which holds the half of
the protocol that finds, asks for, resends and gives up lost packets (the whole protocol is
described in :mod:`transports.rv.engine`'s docstring); the engine's own methods send, receive,
reassemble and deliver, and call these when a sequence number jumps, a control packet comes
in, or a timer is due. Nothing here does I/O or reads a clock: datagrams go to the engine's
``_out`` list and events to its ``_events``, exactly as the engine's own methods put them.

* **Receivers** record each jump of a stream's highest sequence number as a :class:`Gap`
  (:meth:`Repair._gap`) and NAK the missing packets of the gaps that are due, within the
  window behind the head, backing off per gap (:meth:`Repair._send_nak`); point-to-point
  receivers acknowledge instead (:meth:`Repair._ack_soon`, :meth:`Repair._send_ack`: a
  cumulative ACK and SACK ranges).
* **The multicast sender** answers a NAK from what it retains, multicast, at most once per
  packet per 20 ms, and denies what it no longer keeps (:meth:`Repair._nak`); retention
  expires after the reliability interval (:meth:`Repair._expire`).
* **A point-to-point sender** drops what a receiver acknowledges, resends at once the holes
  below a SACKed packet (:meth:`Repair._ack`), and on its RTO resends what is still not
  acknowledged and gives up what is older than the reliability interval (:meth:`Repair._rto`).

:class:`RecvStream` (one remote stream, as a receiver knows it) and :class:`PtpSend` (one
point-to-point stream this engine sends) are plain slotted records shared by both halves.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Final

from transports.rv.events import (
    DATALOSS_OUTBOUND_BCAST,
    DATALOSS_OUTBOUND_PTP,
    MULTICAST,
    RETRANSMISSION_INBOUND_EXPECTED,
    RETRANSMISSION_OUTBOUND_SENT,
    Advisory,
    Dest,
    Event,
    Sender,
    Stats,
)
from transports.rv.packet import (
    MAX_RANGES,
    RETRANS,
    encode_ack,
    encode_heartbeat,
    encode_nak,
    int_to_ip,
)

# Repair timers (this protocol's own choices; Rendezvous does not publish its own).
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


INF: Final = float("inf")


class Gap:
    """Packets from ``first`` on (up to the next gap's ``first``) seen missing at ``since``;
    a multicast receiver asks for them at ``nak_at``, then again after ``backoff``."""

    __slots__ = ("first", "since", "nak_at", "backoff")

    def __init__(self, first: int, since: float, nak_at: float) -> None:
        self.first = first
        self.since = since
        self.nak_at = nak_at
        self.backoff = NAK_BACKOFF_FIRST


class RecvStream:
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
        self.gaps: deque[Gap] = deque()
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


class PtpSend:
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



class Repair:
    """The engine's loss repair: NAKs and their answers, ACKs, retransmission timeouts.

    A base class of :class:`~transports.rv.engine.Engine` only: the attributes below are the
    engine's, set by its ``__init__``."""

    stats: Stats
    service: int
    incarnation: int
    reliability: float
    max_retention_bytes: int
    max_out_of_order: int
    _rng: random.Random
    _out: list[tuple[bytes, Dest]]
    _events: list[Event]
    _seq: int
    _ret: deque[bytes]
    _ret_t: deque[float]
    _ret_base: int
    _ret_bytes: int
    _retx_at: dict[int, float]
    _denied_upto: dict[int, int]
    _ptp_out: dict[tuple[str, int], PtpSend]
    _hb_head_ptp: bytes
    _nak_head: bytes
    _deny_head: bytes
    _deny_head_ptp: bytes
    _ack_head: bytes

    def _gap(self, st: RecvStream, first: int, last: int, now: float) -> None:
        """Packets ``first..last`` are known to exist and have not arrived (yet: a packet
        only overtaken by a later one arrives before the NAK is due)."""
        if st.ptp:
            self.stats.packets_missed += last - first + 1
            st.gaps.append(Gap(first, now, INF))
        else:
            # a random delay, so that of the listeners that lost the same packets the first
            # to ask usually gets the retransmission to the others before they ask
            nak_at = now + self._rng.random() * NAK_DELAY_MAX
            st.gaps.append(Gap(first, now, nak_at))
            if last - st.next >= self.max_out_of_order and last > st.beyond:
                st.beyond = last
            if nak_at < st.nak_at:
                st.nak_at = nak_at

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

    def _ack_soon(self, st: RecvStream, now: float) -> None:
        st.unacked += 1
        if st.unacked >= ACK_EVERY:
            self._send_ack(st)
        elif st.ack_at == INF:
            st.ack_at = now + ACK_DELAY

    def _send_ack(self, st: RecvStream) -> None:
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

    def _rto(self, ps: PtpSend, now: float) -> None:
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

    def _send_nak(self, st: RecvStream, now: float) -> None:
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
