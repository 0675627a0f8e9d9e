"""The reliable multicast engine over an in-memory network, on a virtual clock.

Each test drives engines through :class:`MemLan` (seeded loss, duplication, reordering,
bursts, partitions) and waits on conditions in virtual time; nothing sleeps.
"""

from __future__ import annotations

import random

import pytest

from transports.rv.engine import (
    DATALOSS_INBOUND_BCAST,
    DATALOSS_INBOUND_PTP,
    DATALOSS_OUTBOUND_BCAST,
    DATALOSS_OUTBOUND_PTP,
    MAX_MESSAGE,
    RETRANSMISSION_INBOUND_EXPECTED,
    RETRANSMISSION_OUTBOUND_SENT,
    Advisory,
    Delivered,
    Engine,
    EngineClosed,
    MessageTooLarge,
)
from transports.rv.events import MULTICAST
from transports.rv.packet import (
    BATCH,
    DATA,
    FIRST_FRAG,
    HEARTBEAT,
    LAST_FRAG,
    NAK,
    decode,
    header,
    ip_to_int,
)
from transports.rv.repair import NAK_MAX_PACKETS

from .memlan import MemLan, Node


def listeners(lan: MemLan, n: int, **kw: object) -> list[Node]:
    return [lan.add(ip=f"10.0.1.{i + 1}", port=41000 + i, **kw) for i in range(n)]


def introduce(lan: MemLan, sender: Node, nodes: list[Node]) -> None:
    """One message with no loss, so that every listener knows the sender's stream (a
    listener's first contact is the first packet it hears: no history before it)."""
    saved = lan.loss
    lan.loss = 0.0
    sender.engine.send(b"hello", lan.now)
    lan.run_until(lambda: all(n.payloads_from(sender) for n in nodes))
    lan.loss = saved
    for n in nodes:
        n.events.clear()


def messages(n: int, tag: bytes = b"m") -> list[bytes]:
    return [tag + b"%d" % i for i in range(n)]


@pytest.mark.parametrize("loss, seed", [(0.05, 1), (0.10, 2), (0.20, 3)])
def test_multicast_exactly_once_in_order_under_loss(loss: float, seed: int) -> None:
    lan = MemLan(seed, dup=0.02, jitter=0.003, burst=0.3)
    a = lan.add(ip="10.0.0.1")
    b = lan.add(ip="10.0.0.2")
    nodes = listeners(lan, 8)
    introduce(lan, a, [b, *nodes])
    introduce(lan, b, [a, *nodes])
    lan.loss = loss
    sent = messages(600, b"a")
    sent_b = messages(600, b"b")
    for i in range(600):
        a.engine.send(sent[i], lan.now)
        b.engine.send(sent_b[i], lan.now)
        lan.run(0.002)
    everyone = [b, *nodes]
    lan.run_until(lambda: all(len(n.payloads_from(a)) >= 600 for n in everyone))
    lan.run_until(lambda: all(len(n.payloads_from(b)) >= 600 for n in [a, *nodes]))
    lan.run(3.0)  # late duplicates and retransmissions change nothing
    for n in everyone:
        assert n.payloads_from(a) == sent
        assert not n.advisories(DATALOSS_INBOUND_BCAST)
    for n in [a, *nodes]:
        assert n.payloads_from(b) == sent_b
    assert sum(n.engine.stats.naks_sent for n in nodes) > 0
    assert a.engine.stats.retransmitted > 0
    assert nodes[0].advisories(RETRANSMISSION_INBOUND_EXPECTED)
    assert a.advisories(RETRANSMISSION_OUTBOUND_SENT)
    assert not a.advisories(DATALOSS_OUTBOUND_BCAST)
    # the sender never delivers its own multicast (the loopback copies were ignored)
    assert a.engine.stats.looped > 0
    assert not a.payloads_from(a)


@pytest.mark.parametrize("loss, seed", [(0.10, 5), (0.20, 6)])
def test_batched_small_messages_exactly_once_in_order_under_loss(loss: float,
                                                                 seed: int) -> None:
    """Bursts of 1 to 60 small messages between two writes share packets (BATCH); a lost,
    duplicated or reordered batch is recovered whole, each message delivered once."""
    lan = MemLan(seed, dup=0.02, jitter=0.003, burst=0.3)
    lan.record = True
    a = lan.add(ip="10.0.0.1")
    nodes = listeners(lan, 4)
    introduce(lan, a, nodes)
    stats = a.engine.stats
    messages_before, packets_before = stats.messages_sent, stats.packets_sent
    lan.loss = loss
    rng = random.Random(seed)
    sent = messages(3000, b"batched")
    i = 0
    while i < len(sent):
        for m in sent[i:i + rng.randint(1, 60)]:
            a.engine.send(m, lan.now)
            i += 1
        lan.run(0.002)
    lan.run_until(lambda: all(len(n.payloads_from(a)) >= len(sent) for n in nodes))
    lan.run(3.0)
    for n in nodes:
        assert n.payloads_from(a) == sent
        assert not n.advisories(DATALOSS_INBOUND_BCAST)
    batches = [decode(d) for n, d, _ in lan.sent if n is a and d[3] == DATA]
    assert sum(1 for p in batches if p.flags & BATCH) > 100
    assert stats.messages_sent - messages_before == 3000
    assert 3000 > 3 * (stats.packets_sent - packets_before)


def test_a_malformed_batch_is_counted_and_the_stream_goes_on() -> None:
    lan = MemLan(7)
    a = lan.add(ip="10.0.0.1")
    (b,) = listeners(lan, 1)
    introduce(lan, a, [b])
    a.engine.send(b"before", lan.now)
    lan.flush()
    seq = a.engine._seq
    bad = header(DATA, FIRST_FRAG | LAST_FRAG | BATCH, ip_to_int("10.0.0.1"), a.engine.port,
                 a.engine.service, a.engine.incarnation, seq, 2) + b"\x00\x00\x00\x09ab"
    a.engine._seq += 1  # the sender numbered it: the stream carries on after it
    b.engine.receive_datagram(bad, ("10.0.0.1", a.engine.port), lan.now)
    a.engine.send(b"after", lan.now)
    lan.run_until(lambda: b.payloads_from(a) == [b"before", b"after"])
    assert b.engine.stats.malformed == 1


def test_nak_suppression_one_loss_many_listeners() -> None:
    """Ten listeners lose the same packets; far fewer than ten NAKs each, one retransmission
    each."""
    lan = MemLan(7, delay=0.001)
    a = lan.add(ip="10.0.0.1")
    nodes = listeners(lan, 10)
    introduce(lan, a, nodes)
    lost_packets = 20
    for i in range(lost_packets):
        for n in nodes:
            n.loss = 1.0  # this packet reaches none of them
        a.engine.send(b"lost%d" % i, lan.now)
        lan.flush()
        for n in nodes:
            n.loss = None
        a.engine.send(b"next%d" % i, lan.now)
        lan.run(0.5)
    lan.run_until(lambda: all(len(n.payloads_from(a)) == 2 * lost_packets for n in nodes))
    naks = sum(n.engine.stats.naks_sent for n in nodes)
    assert naks <= 3 * lost_packets, naks  # without suppression: 10 per lost packet
    assert a.engine.stats.retransmitted == lost_packets
    for n in nodes:
        assert n.payloads_from(a) == [p for i in range(lost_packets)
                                      for p in (b"lost%d" % i, b"next%d" % i)]


def test_tail_loss_recovered_through_heartbeats() -> None:
    lan = MemLan(11)
    a = lan.add(ip="10.0.0.1")
    (b,) = listeners(lan, 1)
    introduce(lan, a, [b])
    b.loss = 1.0
    a.engine.send(b"last", lan.now)  # the last message of a burst, lost
    lan.flush()
    b.loss = None
    assert not b.delivered
    lan.run_until(lambda: b.payloads_from(a) == [b"last"], timeout=1.0)
    assert b.engine.stats.naks_sent >= 1


def test_heartbeat_schedule_after_the_last_data() -> None:
    e = Engine(ip="10.0.0.1", port=4000, service=7500)
    e.send(b"x", 10.0)
    e.datagrams_to_send()
    beats = []
    t = 10.0
    while t < 14.0:
        d = e.next_deadline()
        assert d is not None
        t = d
        e.tick(t)
        for data, dest in e.datagrams_to_send():
            assert dest is MULTICAST
            p = decode(data)
            assert p.ptype == HEARTBEAT and p.highest_seq == 1 and p.lowest_retained == 1
            beats.append(round(t - 10.0, 3))
    assert beats[:7] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.8, 2.8]


def test_large_messages_fragmented_and_reassembled_under_loss() -> None:
    lan = MemLan(5, loss=0.1, jitter=0.002, dup=0.01)
    a = lan.add(ip="10.0.0.1")
    nodes = listeners(lan, 3)
    introduce(lan, a, nodes)
    big = [bytes([i]) * 1_000_000 + b"end%d" % i for i in range(3)]
    for m in big:
        a.engine.send(m, lan.now)
        a.engine.send(b"small", lan.now)
        lan.run(0.05)
    lan.run_until(lambda: all(len(n.payloads_from(a)) == 6 for n in nodes))
    for n in nodes:
        assert n.payloads_from(a) == [p for m in big for p in (m, b"small")]
    assert a.engine.stats.packets_sent >= 3 * (1_000_000 // 1400)


def test_partition_longer_than_reliability_is_dataloss_both_sides_then_resumes() -> None:
    lan = MemLan(13)
    a = lan.add(ip="10.0.0.1", reliability=1.0)
    b, c = listeners(lan, 2)
    introduce(lan, a, [b, c])
    for i in range(10):
        a.engine.send(b"before%d" % i, lan.now)
        lan.run(0.01)
    b.partitioned = True
    during = []
    for i in range(250):  # 2.5 s, while a keeps 1 s
        during.append(b"during%d" % i)
        a.engine.send(during[-1], lan.now)
        lan.run(0.01)
    b.partitioned = False
    for i in range(10):
        a.engine.send(b"after%d" % i, lan.now)
        lan.run(0.01)
    lan.run_until(lambda: b"after9" in b.payloads_from(a))
    lan.run(1.0)
    got = b.payloads_from(a)
    assert got[:10] == [b"before%d" % i for i in range(10)]
    assert got[-10:] == [b"after%d" % i for i in range(10)]
    middle = got[10:-10]
    # what a still kept (the last second) came back; the rest is reported lost
    assert middle and middle == during[-len(middle):]
    lost = 250 - len(middle)
    assert lost > 100
    [inbound] = b.advisories(DATALOSS_INBOUND_BCAST)
    assert inbound.fields == {"host": "10.0.0.1", "lost": lost, "scid": 7500}
    [outbound] = a.advisories(DATALOSS_OUTBOUND_BCAST)
    assert outbound.fields == {"host": b.engine.ip, "lost": lost, "scid": 7500}
    assert c.payloads_from(a) == [b"before%d" % i for i in range(10)] + during + [
        b"after%d" % i for i in range(10)]
    assert not c.advisories(DATALOSS_INBOUND_BCAST)
    assert b.engine.stats.inbound_data_loss == lost
    assert a.engine.stats.outbound_data_loss == lost


def test_reliability_zero_any_loss_is_dataloss() -> None:
    lan = MemLan(17)
    a = lan.add(ip="10.0.0.1", reliability=0.0)
    (b,) = listeners(lan, 1)
    introduce(lan, a, [b])
    b.loss = 1.0
    a.engine.send(b"gone", lan.now)
    lan.flush()
    b.loss = None
    a.engine.send(b"here", lan.now)
    lan.run_until(lambda: b"here" in b.payloads_from(a) and bool(a.events))
    lan.run(0.5)
    assert b.payloads_from(a) == [b"here"]
    assert [x.fields["lost"] for x in b.advisories(DATALOSS_INBOUND_BCAST)] == [1]
    assert [x.fields["lost"] for x in a.advisories(DATALOSS_OUTBOUND_BCAST)] == [1]
    assert a.engine.stats.retransmitted == 0


def test_receiver_gives_up_when_nobody_answers_its_naks() -> None:
    """The sender hears no NAK (a one-way failure): after its R + 2 s the receiver reports
    the loss on its own and delivers what came after it."""
    lan = MemLan(73)
    a = lan.add(ip="10.0.0.1", reliability=1.0)
    (b,) = listeners(lan, 1)
    introduce(lan, a, [b])
    a.loss = 1.0  # nothing reaches a from now on
    b.loss = 1.0
    a.engine.send(b"gone", lan.now)
    lan.flush()
    b.loss = None
    a.engine.send(b"kept", lan.now)
    lan.run(2.9)
    assert b.payloads_from(a) == []  # still hoping for a retransmission
    lan.run_until(lambda: b.payloads_from(a) == [b"kept"], timeout=1.0)
    assert b.engine.stats.naks_sent >= 3
    assert [x.fields["lost"] for x in b.advisories(DATALOSS_INBOUND_BCAST)] == [1]
    assert not a.advisories(DATALOSS_OUTBOUND_BCAST)


def test_silent_sender_forgotten_then_heard_again_reports_the_loss() -> None:
    lan = MemLan(79)
    a = lan.add(ip="10.0.0.1", reliability=1.0)
    (b,) = listeners(lan, 1, peer_timeout=5.0)
    introduce(lan, a, [b])
    b.partitioned = True
    for i in range(3):
        a.engine.send(b"missed%d" % i, lan.now)
        lan.flush()  # a packet each
    lan.run(10.0)
    assert not b.engine._mcast_in  # forgotten after 5 s of silence
    b.partitioned = False
    a.engine.send(b"back", lan.now)
    lan.run_until(lambda: b.payloads_from(a) == [b"back"])
    assert [x.fields["lost"] for x in b.advisories(DATALOSS_INBOUND_BCAST)] == [3]
    assert [x.fields["lost"] for x in a.advisories(DATALOSS_OUTBOUND_BCAST)] == [3]


def test_out_of_order_buffer_is_bounded() -> None:
    lan = MemLan(89)
    a = lan.add(ip="10.0.0.1")
    (b,) = listeners(lan, 1, max_out_of_order=10)
    introduce(lan, a, [b])
    b.loss = 1.0
    a.engine.send(b"first", lan.now)
    lan.flush()
    b.loss = None
    sent = [b"first"] + messages(50)
    for m in sent[1:]:
        a.engine.send(m, lan.now)
        lan.flush()  # a packet each
    lan.run(0.0015)  # all arrived, none asked for yet
    st = next(iter(b.engine._mcast_in.values()))
    assert len(st.buf) == 9 and b.engine.stats.overflow == 41
    lan.run_until(lambda: len(b.payloads_from(a)) == 51)
    assert b.payloads_from(a) == sent
    assert not b.advisories(DATALOSS_INBOUND_BCAST)


def test_late_joiner_gets_no_history() -> None:
    lan = MemLan(19)
    a = lan.add(ip="10.0.0.1")
    (b,) = listeners(lan, 1)
    introduce(lan, a, [b])
    for i in range(20):
        a.engine.send(b"old%d" % i, lan.now)
        lan.run(0.01)
    late = lan.add(ip="10.0.0.9", port=49000)
    lan.run(2.0)  # it hears heartbeats only
    a.engine.send(b"new", lan.now)
    lan.run_until(lambda: late.payloads_from(a) == [b"new"])
    lan.run(2.0)
    assert late.payloads_from(a) == [b"new"]
    assert late.engine.stats.naks_sent == 0
    assert not late.advisories(DATALOSS_INBOUND_BCAST)
    assert not late.advisories(RETRANSMISSION_INBOUND_EXPECTED)


def test_late_joiner_mid_message_starts_at_the_next_whole_message() -> None:
    lan = MemLan(23)
    a = lan.add(ip="10.0.0.1", payload_size=100)
    big = b"x" * 1000
    a.engine.send(big, lan.now)
    datagrams = a.engine.datagrams_to_send()
    late = lan.add(ip="10.0.0.9", port=49000)
    for data, _ in datagrams[5:]:  # it hears the second half only
        late.engine.receive_datagram(data, ("10.0.0.1", a.engine.port), lan.now)
    a.engine.send(b"next", lan.now)
    lan.run_until(lambda: bool(late.delivered))
    assert late.payloads_from(a) == [b"next"]


def test_restarted_sender_is_a_new_stream_without_dataloss() -> None:
    lan = MemLan(29, loss=0.05, jitter=0.002)
    a = lan.add(ip="10.0.0.1", port=5000, incarnation=111)
    (b,) = listeners(lan, 1)
    introduce(lan, a, [b])
    for i in range(50):
        a.engine.send(b"one%d" % i, lan.now)
        lan.run(0.002)
    lan.remove(a)  # crashed: no BYE, and the tail may still be missing at b
    a2 = lan.add(ip="10.0.0.1", port=5000, incarnation=222)
    lan.loss = 0.0
    introduce(lan, a2, [b])
    lan.loss = 0.05
    for i in range(50):
        a2.engine.send(b"two%d" % i, lan.now)
        lan.run(0.002)
    lan.run_until(lambda: len(b.payloads_from(a2)) == 50)
    lan.run(5.0)
    assert b.payloads_from(a2) == [b"two%d" % i for i in range(50)]
    assert not b.advisories(DATALOSS_INBOUND_BCAST)
    assert b.delivered[-1].sender == ("10.0.0.1", 5000, 222)


def test_bye_ends_the_stream() -> None:
    lan = MemLan(31)
    a = lan.add(ip="10.0.0.1")
    (b,) = listeners(lan, 1)
    introduce(lan, a, [b])
    a.engine.send(b"x", lan.now)
    lan.run(0.1)
    a.engine.close(lan.now)
    lan.run(0.1)
    assert b.payloads_from(a) == [b"x"]
    assert not b.engine._mcast_in
    assert a.engine.next_deadline() is None
    with pytest.raises(EngineClosed):
        a.engine.send(b"y", lan.now)


def test_bye_with_a_gap_reports_the_loss() -> None:
    lan = MemLan(37)
    a = lan.add(ip="10.0.0.1")
    (b,) = listeners(lan, 1)
    introduce(lan, a, [b])
    b.loss = 1.0
    a.engine.send(b"never", lan.now)
    lan.flush()
    b.loss = None
    a.engine.close(lan.now)
    lan.run(0.5)
    assert [x.fields["lost"] for x in b.advisories(DATALOSS_INBOUND_BCAST)] == [1]


def test_own_looped_multicast_is_ignored() -> None:
    e = Engine(ip="10.0.0.1", port=4000, service=7500)
    e.send(b"x", 0.0)
    [(data, dest)] = e.datagrams_to_send()
    assert dest is MULTICAST
    e.receive_datagram(data, ("10.0.0.1", 7500), 0.0)
    assert e.events() == [] and e.stats.looped == 1


def test_malformed_and_foreign_datagrams_are_counted_and_ignored() -> None:
    e = Engine(ip="10.0.0.1", port=4000, service=7500)
    other = Engine(ip="10.0.0.2", port=4000, service=7501)
    other.send(b"another service", 0.0)
    [(foreign, _)] = other.datagrams_to_send()
    good = header(DATA, FIRST_FRAG | LAST_FRAG, 0x0A000003, 4000, 7500, 9, 1, 2) + b"ok"
    bad = [b"", b"\x00" * 10, b"RX" + b"\x00" * 40, foreign[:20],
           header(DATA, FIRST_FRAG | LAST_FRAG, 0x0A000003, 4000, 7500, 9, 0, 2) + b"ok",
           header(NAK, 0, 0x0A000003, 4000, 7500, 9) + b"\x00\x00\x00",
           header(HEARTBEAT, 0, 0x0A000003, 4000, 7500, 9) + b"\x01",
           bytes([0x52, 0x58, 2]) + good[3:]]
    for d in bad:
        e.receive_datagram(d, ("10.0.0.3", 4000), 0.0)
    e.receive_datagram(foreign, ("10.0.0.2", 4000), 0.0)
    assert e.stats.malformed == len(bad)
    assert e.stats.foreign == 1
    assert e.events() == []
    e.receive_datagram(good, ("10.0.0.3", 4000), 0.0)
    [ev] = e.events()
    assert isinstance(ev, Delivered) and ev.payload == b"ok" and ev.sender == ("10.0.0.3",
                                                                               4000, 9)
    # a DATA packet that claims another length than it carries is not delivered
    e.receive_datagram(header(DATA, FIRST_FRAG | LAST_FRAG, 0x0A000003, 4000, 7500, 9, 2, 5)
                       + b"ok", ("10.0.0.3", 4000), 0.0)
    assert e.events() == [] and e.stats.malformed == len(bad) + 1


def test_message_too_large() -> None:
    e = Engine(ip="10.0.0.1", port=4000, service=7500)
    with pytest.raises(MessageTooLarge) as err:
        e.send(bytes(MAX_MESSAGE + 1), 0.0)
    assert err.value.lost == (MAX_MESSAGE + 1 + 1399) // 1400
    assert e.datagrams_to_send() == [] and e.stats.messages_sent == 0


def test_retention_bytes_cap_denies_older_packets() -> None:
    lan = MemLan(41)
    a = lan.add(ip="10.0.0.1", max_retention_bytes=10 * (32 + 100))
    (b,) = listeners(lan, 1)
    introduce(lan, a, [b])
    b.partitioned = True
    for _ in range(30):
        a.engine.send(bytes(100), lan.now)
        lan.flush()  # a packet each
    b.partitioned = False
    a.engine.send(b"after", lan.now)
    lan.run_until(lambda: b"after" in b.payloads_from(a))
    # ten were kept, then "after" pushed the oldest of them out
    assert b.payloads_from(a) == [bytes(100)] * 9 + [b"after"]
    assert b.lost(DATALOSS_INBOUND_BCAST) == 21 == a.lost(DATALOSS_OUTBOUND_BCAST)


# ---------------------------------------------------------------------- point-to-point


@pytest.mark.parametrize("loss, seed", [(0.05, 43), (0.20, 47)])
def test_ptp_exactly_once_in_order_under_loss(loss: float, seed: int) -> None:
    lan = MemLan(seed, loss=loss, dup=0.02, jitter=0.003)
    a = lan.add(ip="10.0.0.1")
    b = lan.add(ip="10.0.0.2")
    to_b = messages(400, b"p")
    for m in to_b:
        a.engine.send_to((b.engine.ip, b.engine.port), m, lan.now)
        lan.run(0.002)
    a.engine.send_to((b.engine.ip, b.engine.port), b"z" * 5000, lan.now)
    lan.run_until(lambda: len(b.payloads_from(a, ptp=True)) == 401)
    lan.run(3.0)
    assert b.payloads_from(a, ptp=True) == [*to_b, b"z" * 5000]
    assert b.payloads_from(a) == []
    assert b.engine.stats.acks_sent > 0
    assert a.engine.stats.retransmitted > 0
    ps = a.engine._ptp_out[(b.engine.ip, b.engine.port)]
    assert not ps.pending  # everything acknowledged
    assert a.engine.next_deadline() is None  # nothing left to do
    assert not b.advisories(DATALOSS_INBOUND_PTP) and not a.advisories(DATALOSS_OUTBOUND_PTP)


def test_ptp_hole_below_a_sack_is_resent_before_the_rto() -> None:
    lan = MemLan(83)
    a = lan.add(ip="10.0.0.1")
    b = lan.add(ip="10.0.0.2")
    dest = (b.engine.ip, b.engine.port)
    for i in range(10):
        if i == 3:
            b.loss = 1.0
        a.engine.send_to(dest, b"%d" % i, lan.now)
        lan.flush()
        b.loss = None
    lan.run_until(lambda: len(b.payloads_from(a, ptp=True)) == 10, timeout=0.05)
    assert b.payloads_from(a, ptp=True) == [b"%d" % i for i in range(10)]
    assert a.engine.stats.retransmitted == 1


def test_ptp_acks_every_16_packets_or_after_20ms() -> None:
    lan = MemLan(53)
    a = lan.add(ip="10.0.0.1")
    b = lan.add(ip="10.0.0.2")
    for i in range(32):
        a.engine.send_to((b.engine.ip, b.engine.port), b"%d" % i, lan.now)
    lan.run(0.0015)  # delivered, not yet 20 ms
    assert b.engine.stats.acks_sent == 2
    a.engine.send_to((b.engine.ip, b.engine.port), b"one more", lan.now)
    lan.run(0.01)
    assert b.engine.stats.acks_sent == 2
    lan.run(0.02)
    assert b.engine.stats.acks_sent == 3
    assert not a.engine._ptp_out[(b.engine.ip, b.engine.port)].pending


def test_ptp_dataloss_past_the_reliability_interval() -> None:
    lan = MemLan(59)
    a = lan.add(ip="10.0.0.1", reliability=1.0)
    b = lan.add(ip="10.0.0.2", reliability=1.0)
    dest = (b.engine.ip, b.engine.port)
    a.engine.send_to(dest, b"first", lan.now)
    lan.run(0.1)
    b.partitioned = True
    for i in range(5):
        a.engine.send_to(dest, b"lost%d" % i, lan.now)
    lan.run(1.5)
    b.partitioned = False
    a.engine.send_to(dest, b"after", lan.now)
    lan.run_until(lambda: b"after" in b.payloads_from(a, ptp=True))
    lan.run(0.5)
    assert b.payloads_from(a, ptp=True) == [b"first", b"after"]
    [outbound] = a.advisories(DATALOSS_OUTBOUND_PTP)
    assert outbound.fields == {"host": "10.0.0.2", "lost": 5, "scid": 7500}
    [inbound] = b.advisories(DATALOSS_INBOUND_PTP)
    assert inbound.fields == {"host": "10.0.0.1", "lost": 5, "scid": 7500}


def test_ptp_receiver_restart_resynchronises_without_dataloss() -> None:
    lan = MemLan(61)
    a = lan.add(ip="10.0.0.1")
    b = lan.add(ip="10.0.0.2", port=6000, incarnation=1)
    dest = ("10.0.0.2", 6000)
    for i in range(5):
        a.engine.send_to(dest, b"old%d" % i, lan.now)
    lan.run(0.5)
    assert len(b.payloads_from(a, ptp=True)) == 5
    lan.remove(b)
    b2 = lan.add(ip="10.0.0.2", port=6000, incarnation=2)
    a.engine.send_to(dest, b"new", lan.now)
    lan.run_until(lambda: b2.payloads_from(a, ptp=True) == [b"new"])
    lan.run(1.0)
    assert not b2.advisories(DATALOSS_INBOUND_PTP)
    assert not a.advisories(DATALOSS_OUTBOUND_PTP)


def test_ptp_to_self_is_delivered_locally() -> None:
    e = Engine(ip="10.0.0.1", port=4000, service=7500)
    e.send_to(("10.0.0.1", 4000), b"me", 0.0)
    assert e.datagrams_to_send() == []
    [ev] = e.events()
    assert isinstance(ev, Delivered) and ev.ptp and ev.sender == e.sender


def test_bye_ends_ptp_and_reports_what_was_not_acknowledged() -> None:
    lan = MemLan(67)
    a = lan.add(ip="10.0.0.1")
    b = lan.add(ip="10.0.0.2")
    b.partitioned = True
    a.engine.send_to((b.engine.ip, b.engine.port), b"x", lan.now)
    lan.flush()
    b.partitioned = False
    b.engine.close(lan.now)
    lan.run(0.1)
    assert a.advisories(DATALOSS_OUTBOUND_PTP) == [
        Advisory(DATALOSS_OUTBOUND_PTP, {"host": "10.0.0.2", "lost": 1, "scid": 7500})]
    assert not a.engine._ptp_out


def test_stats_and_host_status() -> None:
    lan = MemLan(71)
    a = lan.add(ip="10.0.0.1")
    (b,) = listeners(lan, 1)
    a.engine.send(b"12345", lan.now)
    lan.run(0.1)
    hs = a.engine.stats.host_status()
    assert hs["ms"] == 1 and hs["bs"] == 5 and hs["ps"] >= 1
    hb = b.engine.stats.host_status()
    assert hb["mr"] == 1 and hb["br"] == 5 and hb["pr"] >= 1


def test_data_packet_layout() -> None:
    e = Engine(ip="10.1.2.3", port=0x1234, service=7500, incarnation=0xDEADBEEF,
               payload_size=4)
    e.send(b"abcdefghij", 0.0)
    packets = [decode(d) for d, _ in e.datagrams_to_send()]
    assert [(p.seq, p.flags, p.aux, p.payload) for p in packets] == [
        (1, FIRST_FRAG, 10, b"abcd"), (2, 0, 1, b"efgh"), (3, LAST_FRAG, 2, b"ij")]
    assert {(p.src_ip, p.src_port, p.service, p.incarnation) for p in packets} == {
        (0x0A010203, 0x1234, 7500, 0xDEADBEEF)}


def test_long_burst_loss_under_continuing_traffic_is_recovered() -> None:
    """A receiver that loses thousands of consecutive packets while the sender keeps
    sending, with an out-of-order buffer smaller than the burst: the packets past the buffer
    are dropped and must be asked for as the head moves, in NAKs of bounded size, not only
    on the gap's backoff (which, with traffic continuing, never catches up)."""
    lan = MemLan(97)
    lan.record = True
    a = lan.add(ip="10.0.0.1")
    (b,) = listeners(lan, 1, max_out_of_order=1000)
    introduce(lan, a, [b])
    b.loss = 1.0
    burst = messages(5000, b"lost")
    for m in burst:
        a.engine.send(m, lan.now)
        lan.flush()  # a packet each
    b.loss = None
    sent = list(burst)
    # the traffic goes on: 20 messages per millisecond for 3 s, far past the buffer
    for i in range(3000):
        for j in range(20):
            m = b"more%d.%d" % (i, j)
            sent.append(m)
            a.engine.send(m, lan.now)
            lan.flush()
        lan.run(0.001)
    # well before the give-up (R + 2 s), which would report DATALOSS
    lan.run_until(lambda: len(b.payloads_from(a)) >= len(sent), timeout=20.0)
    assert b.payloads_from(a) == sent
    assert not b.advisories(DATALOSS_INBOUND_BCAST)
    assert b.engine.stats.overflow > 0
    naks = [decode(d) for n, d, _ in lan.sent if n is b and d[3] == NAK]
    assert naks and all(sum(last - first + 1 for first, last in p.ranges) <= NAK_MAX_PACKETS
                        for p in naks)
    # each lost packet asked for (and resent) about once, not once per backoff round
    missed = b.engine.stats.packets_missed
    assert missed >= 5000 + b.engine.stats.overflow
    assert a.engine.stats.retransmitted < 1.5 * missed
