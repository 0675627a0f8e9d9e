"""Certified delivery (transports/rv/cm.py) through the in-memory bus of cmnet.py: every
protocol phase and advisory, loss, restarts with file ledgers, crashes between a ledger
write and what follows it."""

from __future__ import annotations

from pathlib import Path

import pytest

from transports.rv import cm
from transports.rv.cm import CmCore
from transports.rv.ledger import LedgerError, SqliteLedger
from transports.rv.message import Message

from .cmnet import CmNet, Peer

S = "ORDERS.NEW"


def pair(net: CmNet, **listener_kw: object) -> tuple[Peer, Peer]:
    sender = net.add("JOE")
    listener = net.add("SUE", listen=("ORDERS.>",), **listener_kw)  # type: ignore[arg-type]
    net.settle()
    return sender, listener


def field(adv: Message, name: str) -> object:
    return adv.get(name)


def test_discovery_registration_and_certified_delivery() -> None:
    net = CmNet()
    joe, sue = pair(net)
    net.send(joe, S, 0)
    net.settle()
    # The message that made the discovery is delivered, uncertified (name, no sequence).
    assert [(d.sender, d.seq) for d in sue.deliveries] == [("JOE", 0)]
    assert sue.deliveries[0].msg.cm is not None and sue.deliveries[0].msg.cm.sequence == 0
    assert field(sue.adv(cm.REGISTRATION_DISCOVERY)[0], "sender") == "JOE"
    assert field(joe.adv(cm.REGISTRATION_REQUEST)[0], "listener") == "SUE"
    certified = sue.adv(cm.REGISTRATION_CERTIFIED)[0]
    assert certified.send_subject == cm.REGISTRATION_CERTIFIED + S
    assert field(certified, "seqno_begin") == 2
    for n in range(1, 6):
        net.send(joe, S, n)
    net.run()
    assert sue.certified() == [2, 3, 4, 5, 6]
    assert sue.texts() == ["0", "1", "2", "3", "4", "5"]
    assert [field(a, "seqno") for a in joe.adv(cm.DELIVERY_CONFIRM)] == [2, 3, 4, 5, 6]
    assert [field(a, "seqno") for a in joe.adv(cm.DELIVERY_COMPLETE)] == [2, 3, 4, 5, 6]
    assert joe.core.stored_count() == 0
    assert joe.core.registered(S) == ["SUE"]


def test_a_lost_message_is_asked_for_and_delivered_in_order() -> None:
    net = CmNet()
    joe, sue = pair(net)
    net.send(joe, S, 0)
    net.settle()
    lost = {3}
    net.drop = lambda src, dst, msg: (msg.cm is not None and msg.cm.sequence in lost
                                      and msg.send_subject == S)
    for n in range(1, 6):
        net.send(joe, S, n)
    net.run()
    assert sue.certified() == [2, 3, 4, 5, 6]
    asked = [m for _, to, m in net.wire if to == "JOE" and m.get("op") == "RETRANS_REQ"]
    assert [(m.get("first"), m.get("last")) for m in asked] == [(3, 3)]
    assert joe.core.stored_count() == 0


def test_a_lost_last_message_is_recovered_by_the_confirmation_request() -> None:
    net = CmNet()
    joe, sue = pair(net)
    net.send(joe, S, 0)
    net.settle()
    net.drop = lambda src, dst, msg: msg.cm is not None and msg.cm.sequence == 3
    net.send(joe, S, 1)
    net.send(joe, S, 2)  # seq 3, lost, and nothing follows it
    net.run()
    assert sue.certified() == [2, 3]
    no_response = joe.adv(cm.DELIVERY_NO_RESPONSE)
    assert no_response and no_response[0].send_subject == cm.DELIVERY_NO_RESPONSE + "SUE"
    assert joe.core.stored_count() == 0


def test_time_limit_fails_the_message_and_the_listener_hears_it_is_unavailable() -> None:
    net = CmNet()
    joe, sue = pair(net)
    net.send(joe, S, 0)
    net.settle()
    cut = True
    net.drop = lambda src, dst, msg: cut
    net.send(joe, S, 1, time_limit=2.0)  # seq 2: never reaches SUE before it expires
    net.run(until=net.now + 3.0)
    failed = joe.adv(cm.DELIVERY_FAILED)
    assert len(failed) == 1
    assert field(failed[0], "seqno") == 2
    assert field(failed[0], "listener") == "SUE"
    data = field(failed[0], "data")
    assert isinstance(data, Message) and data.get("n") == 1
    assert joe.core.stored_count() == 0
    cut = False
    net.send(joe, S, 2)  # seq 3: SUE sees the gap, asks, and hears 2 is gone
    net.run()
    unavailable = sue.adv(cm.DELIVERY_UNAVAILABLE)
    assert [(field(a, "seqno_begin"), field(a, "seqno_end"), field(a, "sender"))
            for a in unavailable] == [(2, 2, "JOE")]
    assert sue.certified() == [3]
    assert joe.core.stored_count() == 0


def test_explicit_confirmation_is_held_back_until_the_gaps_are_confirmed() -> None:
    net = CmNet()
    joe, sue = pair(net, explicit=True)
    net.send(joe, S, 0)
    net.settle()
    for n in range(1, 4):
        net.send(joe, S, n)  # seqs 2, 3, 4
    net.settle()
    assert sue.certified() == [2, 3, 4]
    sue.core.confirm("JOE", S, 4)
    sue.core.confirm("JOE", S, 3)
    net.settle()
    assert joe.adv(cm.DELIVERY_CONFIRM) == []  # 2 is not confirmed: nothing goes out
    sue.core.confirm("JOE", S, 2)
    net.settle()
    confirms = [m for _, to, m in net.wire if to == "JOE" and m.get("op") == "CONFIRM"]
    assert [m.get("upto") for m in confirms] == [4]
    assert [field(a, "seqno") for a in joe.adv(cm.DELIVERY_COMPLETE)] == [2, 3, 4]


def test_a_persistent_listener_restarted_gets_what_it_missed_once(tmp_path: Path) -> None:
    net = CmNet()
    joe = net.add("JOE", SqliteLedger(tmp_path / "joe.db"))
    sue = net.add("SUE", SqliteLedger(tmp_path / "sue.db"), listen=("ORDERS.>",),
                  require_old=True)
    net.settle()
    net.send(joe, S, 0)
    net.settle()
    for n in range(1, 6):
        net.send(joe, S, n)
    net.run()
    assert sue.certified() == [2, 3, 4, 5, 6]
    net.crash(sue)
    for n in range(6, 11):
        net.send(joe, S, n)  # seqs 7..11, kept for SUE
    net.run(until=net.now + 0.5)
    assert joe.core.stored_count(S) == 5
    sue2 = net.add("SUE", SqliteLedger(tmp_path / "sue.db"), listen=("ORDERS.>",),
                   require_old=True)
    net.run()
    assert sue2.certified() == [7, 8, 9, 10, 11]
    assert sue2.texts() == ["6", "7", "8", "9", "10"]
    assert sue2.adv(cm.REGISTRATION_DISCOVERY) == []  # it knew JOE from its ledger
    assert joe.adv(cm.REGISTRATION_MOVED)  # another run of SUE
    assert joe.core.stored_count() == 0


def test_a_returning_listener_without_require_old_starts_at_the_next_message(tmp_path: Path) -> None:
    net = CmNet()
    joe = net.add("JOE", SqliteLedger(tmp_path / "joe.db"))
    sue = net.add("SUE", SqliteLedger(tmp_path / "sue.db"), listen=("ORDERS.>",))
    net.settle()
    net.send(joe, S, 0)
    net.run()
    net.crash(sue)
    for n in range(1, 4):
        net.send(joe, S, n)
    net.settle()
    assert joe.core.stored_count(S) == 3
    sue2 = net.add("SUE", SqliteLedger(tmp_path / "sue.db"), listen=("ORDERS.>",))
    net.run()
    assert joe.core.stored_count() == 0  # dropped, not sent
    net.send(joe, S, 4)
    net.run()
    assert sue2.certified() == [5]


def test_a_persistent_sender_restarted_keeps_its_sequence_and_its_stored_messages(
        tmp_path: Path) -> None:
    net = CmNet()
    joe = net.add("JOE", SqliteLedger(tmp_path / "joe.db"))
    sue = net.add("SUE", listen=("ORDERS.>",), explicit=True)
    net.settle()
    net.send(joe, S, 0)
    net.settle()
    for n in range(1, 6):
        net.send(joe, S, n)
    net.settle()
    for seq in (2, 3):
        sue.core.confirm("JOE", S, seq)
    net.settle()
    net.crash(joe)
    joe2 = net.add("JOE", SqliteLedger(tmp_path / "joe.db"))
    assert joe2.core.stored_count(S) == 3  # 4, 5 and 6 are not confirmed
    assert net.send(joe2, S, 6) == 7  # no sequence number is given twice
    net.settle()
    for seq in (4, 5, 6, 7):
        sue.core.confirm("JOE", S, seq)
    net.run()
    assert sue.certified() == [2, 3, 4, 5, 6, 7]
    assert joe2.core.stored_count() == 0


def test_sender_crash_after_the_ledger_write_before_the_send(tmp_path: Path) -> None:
    """Killed between writing its ledger and sending: nothing is lost, nothing is twice."""
    net = CmNet()
    joe = net.add("JOE", SqliteLedger(tmp_path / "joe.db"))
    sue = net.add("SUE", listen=("ORDERS.>",))
    net.settle()
    net.send(joe, S, 0)
    net.run()
    for n in range(1, 4):
        net.send(joe, S, n)  # seqs 2..4
    joe.core.flush()  # the ledger has them; the process dies before they reach the wire
    net.crash(joe)
    joe2 = net.add("JOE", SqliteLedger(tmp_path / "joe.db"))
    net.send(joe2, S, 4)  # seq 5: SUE sees the gap and asks
    net.run()
    assert sue.certified() == [2, 3, 4, 5]
    assert sue.texts() == ["0", "1", "2", "3", "4"]
    assert joe2.core.stored_count() == 0


def test_listener_crash_before_its_ledger_write_gets_the_message_again(tmp_path: Path) -> None:
    """Killed after the callback, before the confirmed position reached its ledger: the
    message comes again (at least once), and everything before it does not."""
    net = CmNet()
    joe = net.add("JOE")
    sue = net.add("SUE", SqliteLedger(tmp_path / "sue.db"), listen=("ORDERS.>",),
                  require_old=True)
    net.settle()
    net.send(joe, S, 0)
    net.settle()
    for n in range(1, 3):
        net.send(joe, S, n)
    net.run()
    assert sue.certified() == [2, 3]
    net.send(joe, S, 3)  # seq 4
    out, events = joe.core.flush()
    for msg in out:
        sue.core.receive(msg, net.now)
    _, events = sue.core.flush()
    assert [e.seq for e in events if isinstance(e, cm.CmDelivery)] == [4]
    sue.core.confirm("JOE", S, 4)  # the callback returned; the next flush never comes
    net.crash(sue)
    sue2 = net.add("SUE", SqliteLedger(tmp_path / "sue.db"), listen=("ORDERS.>",),
                   require_old=True)
    net.run()
    assert sue2.certified() == [4]
    assert joe.core.stored_count() == 0


def test_anticipated_listener_gets_what_was_sent_before_it_came() -> None:
    net = CmNet()
    joe = net.add("JOE")
    joe.core.add_listener("DB", S)
    for n in range(3):
        net.send(joe, S, n)
    net.settle()
    assert joe.core.stored_count(S) == 3
    db = net.add("DB", listen=("ORDERS.>",), require_old=True)
    net.send(joe, S, 3)
    net.run()
    assert db.certified() == [1, 2, 3, 4]
    assert db.texts() == ["0", "1", "2", "3"]  # the message that made the discovery once
    assert joe.core.stored_count() == 0


def test_disallowed_listener_is_refused_and_gets_messages_uncertified() -> None:
    net = CmNet()
    joe, sue = pair(net)
    net.send(joe, S, 0)
    net.settle()
    net.send(joe, S, 1)
    net.run()
    assert sue.certified() == [2]
    joe.core.disallow("SUE")
    net.settle()
    assert [field(a, "listener") for a in joe.adv(cm.REGISTRATION_CLOSED)] == ["SUE"]
    assert [field(a, "sender") for a in sue.adv(cm.REGISTRATION_NOT_CERTIFIED)] == ["JOE"]
    net.send(joe, S, 2)
    net.run()
    assert sue.deliveries[-1].seq == 0 and sue.texts()[-1] == "2"
    assert joe.core.stored_count() == 0
    # A later listener of that name is refused too.
    net.crash(sue)
    other = net.add("SUE", listen=("ORDERS.>",))
    net.send(joe, S, 3)
    net.run()
    denied = [m for _, to, m in net.wire if to == "SUE" and m.get("op") == "REG_DENY"]
    assert denied and other.certified() == []
    joe.core.allow("SUE")
    net.crash(other)
    third = net.add("SUE", listen=("ORDERS.>",))
    net.send(joe, S, 4)
    net.settle()
    net.send(joe, S, 5)
    net.run()
    assert third.certified() == [6]


def test_cancel_ends_the_agreement_at_the_sender() -> None:
    net = CmNet()
    joe, sue = pair(net)
    net.send(joe, S, 0)
    net.run()
    sue.core.cancel("ORDERS.>")
    sue.patterns.clear()
    net.settle()
    closed = joe.adv(cm.REGISTRATION_CLOSED)
    assert [(field(a, "listener"), field(a, "seqno_last_sent")) for a in closed] == [("SUE", 1)]
    assert joe.core.registered(S) == []
    net.send(joe, S, 1)
    net.run()
    assert joe.core.stored_count() == 0
    assert sue.adv(cm.REGISTRATION_NOT_CERTIFIED) == []


def test_registration_with_no_answer_gives_up_and_passes_messages_uncertified() -> None:
    net = CmNet()
    joe, sue = pair(net)
    net.drop = lambda src, dst, msg: dst is joe  # JOE never hears SUE
    for n in range(3):
        net.send(joe, S, n)
    net.run()
    assert sue.adv(cm.REGISTRATION_NO_RESPONSE)
    requests = [m for _, to, m in net.wire if to == "JOE" and m.get("op") == "REG_REQ"]
    assert len(requests) == sue.core.registration_attempts
    assert sue.texts() == ["0", "1", "2"] and sue.certified() == []


def test_two_transports_with_one_name_collide() -> None:
    net = CmNet()
    a = net.add("SAME")
    b = net.add("SAME")
    net.settle()
    assert a.adv(cm.REGISTRATION_COLLISION) and b.adv(cm.REGISTRATION_COLLISION)
    assert a.adv(cm.REGISTRATION_COLLISION)[0].send_subject == cm.REGISTRATION_COLLISION + "SAME"
    transient = net.add()
    net.settle()
    assert transient.name.startswith("CM.") and transient.adv(cm.REGISTRATION_COLLISION) == []


@pytest.mark.parametrize("seed", range(12))
def test_random_loss_everything_certified_arrives_once_in_order(seed: int) -> None:
    net = CmNet(seed, loss=0.2)
    joe = net.add("JOE", request_interval=0.5)
    sues = [net.add(f"SUE{i}", listen=("ORDERS.>",), request_interval=0.5,
                    registration_attempts=50) for i in range(3)]
    net.run(until=net.now + 0.1)
    for n in range(60):
        net.send(joe, S if n % 2 else "ORDERS.OLD", n)
        net.run(until=net.now + 0.01)
    net.run()
    for sue in sues:
        for subject in (S, "ORDERS.OLD"):
            seqs = sue.certified(subject)
            assert seqs == sorted(set(seqs)), "in order, once"
            if seqs:
                assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "no gap"
                assert seqs[-1] == 30, "up to the last one sent"
    assert joe.core.stored_count() == 0


def test_ledger_file_is_locked_and_belongs_to_one_name(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    first = SqliteLedger(path)
    CmCore("JOE", first, now=0.0)
    with pytest.raises(LedgerError, match="in use"):
        CmCore("JOE", SqliteLedger(path), now=0.0)
    first.close()
    with pytest.raises(LedgerError, match="belongs to correspondent 'JOE'"):
        CmCore("ANN", SqliteLedger(path), now=0.0)
    CmCore("JOE", SqliteLedger(path), now=0.0).ledger.close()


def test_names_and_time_limits_are_checked() -> None:
    with pytest.raises(ValueError):
        CmCore("A.*", now=0.0)
    with pytest.raises(ValueError):
        CmCore("_X", now=0.0)
    core = CmCore("A", now=0.0)
    with pytest.raises(ValueError, match="negative"):
        core.send(Message(S), 0.0, time_limit=-1)


def test_malformed_control_messages_are_ignored() -> None:
    core = CmCore("JOE", now=0.0)
    core.flush()
    for msg in (Message("_RVCM.JOE"), Message("_RVCM.JOE").add("op", 5),
                Message("_RVCM.JOE").add("op", "DATA").add("from", "X").add("inst", "1")
                .add("msg", b"\x00garbage"),
                Message("_RVCM.JOE").add("op", "CONFIRM").add("from", "X").add("inst", "1")
                .add("subject", S).add("upto", 5)):
        core.receive(msg, 0.0)
    assert core.flush() == ([], [])


def test_an_anticipated_listener_that_comes_after_the_messages_discovers_the_sender() -> None:
    net = CmNet()
    joe = net.add("JOE")
    joe.core.add_listener("DB", S)
    for n in range(3):
        net.send(joe, S, n)
    net.settle()
    db = net.add("DB", listen=("ORDERS.>",), require_old=True)
    net.run()  # JOE's confirmation request reaches DB, which registers
    assert db.certified() == [1, 2, 3]
    assert db.adv(cm.REGISTRATION_DISCOVERY)
    assert joe.core.stored_count() == 0


def test_explicit_config_only_accepts_only_announced_listeners() -> None:
    net = CmNet()
    joe = net.add("JOE", explicit_config_only=True)
    joe.core.add_listener("DB", S)
    sue = net.add("SUE", listen=("ORDERS.>",))
    db = net.add("DB", listen=("ORDERS.>",), require_old=True)
    net.settle()
    net.send(joe, S, 0)
    net.settle()
    net.send(joe, S, 1)
    net.run()
    assert sue.adv(cm.REGISTRATION_NOT_CERTIFIED) and sue.certified() == []
    assert sue.texts() == ["0", "1"]
    assert db.certified() == [1, 2]
    assert joe.core.registered(S) == ["DB"]
