"""Event queues, listeners and the intra-process transport (no sockets).

TIBCO Rendezvous Concepts, Events and Queues ("Queue Limit Policies", "Listener Event
Semantics", "Dispatch"), and Appendix A, QUEUE.LIMIT_EXCEEDED.
"""

from __future__ import annotations

import threading
import time

import pytest

from transports.rv import (
    DISCARD_FIRST,
    DISCARD_LAST,
    DISCARD_NEW,
    DISCARD_NONE,
    Dispatcher,
    Listener,
    Message,
    Queue,
    SubjectError,
    default_queue,
    process_transport,
)
from transports.rv.advisory import advisory_message
from transports.rv.message import RvType
from transports.rv.transport import _inbox_address


def fill(policy: int, amount: int = 1) -> tuple[list[int], list[Message]]:
    """Five messages into a 3-event queue; returns what dispatch runs and the advisories."""
    pt = process_transport()
    name = f"limited-{policy}-{amount}"
    q = Queue(name, max_events=3, policy=policy, discard_amount=amount)
    got: list[int] = []
    advisories: list[Message] = []
    adv_q = Queue("advisories")
    subject = f"LIM.P{policy}.A{amount}"
    listener = Listener(pt, subject, lambda m, _: got.append(m["n"]), queue=q)
    adv = Listener(pt, "_RV.WARN.SYSTEM.QUEUE.LIMIT_EXCEEDED",
                   lambda m, _: advisories.append(m), queue=adv_q)
    try:
        for i in range(5):
            pt.send(Message(subject).add("n", i))
        while q.poll():
            pass
        while adv_q.poll():
            pass
    finally:
        listener.destroy()
        adv.destroy()
    return got, [a for a in advisories if a["ADV_DESC"] == name]


def test_discard_first_drops_the_oldest() -> None:
    got, adv = fill(DISCARD_FIRST)
    assert got == [2, 3, 4]
    assert len(adv) == 2


def test_discard_last_drops_the_newest_queued() -> None:
    got, adv = fill(DISCARD_LAST)
    assert got == [0, 1, 4]
    assert len(adv) == 2


def test_discard_new_drops_the_arriving_one() -> None:
    got, adv = fill(DISCARD_NEW)
    assert got == [0, 1, 2]
    assert len(adv) == 2


def test_discard_amount_drops_a_batch() -> None:
    got, adv = fill(DISCARD_FIRST, amount=2)
    assert got == [2, 3, 4]  # the 4th arrival drops 0 and 1; the 5th then fits
    assert len(adv) == 1 and adv[0].get_field("ADV_DESC").type == RvType.STRING


def test_discard_none_keeps_everything() -> None:
    with pytest.raises(ValueError):
        Queue("x", max_events=0, policy=DISCARD_FIRST)
    q = Queue("unlimited", policy=DISCARD_NONE)
    pt = process_transport()
    seen: list[int] = []
    listener = Listener(pt, "LIM.NONE", lambda m, _: seen.append(m["n"]), queue=q)
    for i in range(100):
        pt.send(Message("LIM.NONE").add("n", i))
    while q.poll():
        pass
    listener.destroy()
    assert seen == list(range(100)) and q.discarded == 0


def test_two_listeners_two_events_and_destroy_cancels_waiting_events() -> None:
    pt = process_transport()
    q = Queue("two")
    a: list[int] = []
    b: list[int] = []
    la = Listener(pt, "TWO.>", lambda m, _: a.append(m["n"]), queue=q)
    lb = Listener(pt, "TWO.X", lambda m, _: b.append(m["n"]), queue=q)
    pt.send(Message("TWO.X").add("n", 1))
    assert q.count == 2
    lb.destroy()
    assert q.count == 1
    assert q.poll() and not q.poll()
    la.destroy()
    assert a == [1] and b == []


def test_timed_dispatch_and_dispatcher_thread() -> None:
    q = Queue("timed")
    start = time.monotonic()
    assert q.timed_dispatch(0.05) is False
    assert time.monotonic() - start >= 0.05
    pt = process_transport()
    ran = threading.Event()
    where: list[str] = []

    def cb(m: Message, _: Listener) -> None:
        where.append(threading.current_thread().name)
        ran.set()

    listener = Listener(pt, "DISP.X", cb, queue=q)
    d = Dispatcher(q, name="disp-test")
    try:
        pt.send(Message("DISP.X"))
        assert ran.wait(30)
        assert where == ["disp-test"]
    finally:
        d.stop()
        listener.destroy()
    assert default_queue() is default_queue()


def test_listen_subject_rules_and_send_rules() -> None:
    pt = process_transport()
    with pytest.raises(SubjectError):
        Listener(pt, "A.>.B", lambda m, _: None)
    with pytest.raises(SubjectError):
        pt.send(Message("_RV.WARN.SYSTEM.X"))
    with pytest.raises(SubjectError):
        pt.send(Message("A.*"))
    with pytest.raises(SubjectError):
        pt.send(Message())


def test_advisory_message_fields_and_inbox_names() -> None:
    m = advisory_message("_RV.ERROR.SYSTEM.DATALOSS.INBOUND.BCAST",
                         {"host": "10.0.0.1", "lost": 3, "scid": 7500})
    assert m["ADV_CLASS"] == "ERROR" and m["ADV_SOURCE"] == "SYSTEM"
    assert m["ADV_NAME"] == "DATALOSS.INBOUND.BCAST"
    assert [(f.name, f.type) for f in m][3:] == [
        ("host", RvType.STRING), ("lost", RvType.U32), ("scid", RvType.U16)]
    assert _inbox_address("_INBOX.7F000001.1F4A0000002A.3") == ("127.0.0.1", 0x1F4A)
    with pytest.raises(SubjectError):
        _inbox_address("_INBOX.somewhere.else")


def test_push_many_is_one_hand_over_in_order_and_keeps_the_limit_policy() -> None:
    from transports.rv.queue import Event

    got: list[int] = []
    listener = Listener(process_transport(), "PM.X", lambda m, _: got.append(m.get("i")),
                        queue=Queue("unused"))
    q = Queue("burst")
    woken = 0

    class Counting(threading.Condition):
        def notify(self, n: int = 1) -> None:
            nonlocal woken
            woken += 1
            super().notify(n)

    q._cond = Counting(threading.Lock())
    q.push_many([Event(listener, Message("PM.X").add("i", i)) for i in range(5)])
    assert q.count == 5 and woken == 1
    while q.poll():
        pass
    assert got == [0, 1, 2, 3, 4]
    got.clear()
    limited = Queue("burst-limited", max_events=3, policy=DISCARD_FIRST)
    limited.push_many([Event(listener, Message("PM.X").add("i", i)) for i in range(5)])
    while limited.poll():
        pass
    assert got == [2, 3, 4] and limited.discarded == 2
    listener.destroy()
