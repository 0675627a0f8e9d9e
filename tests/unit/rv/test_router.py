"""The router's core (transports/rv/router.py) over simulated buses and a virtual clock.

A :class:`Net` holds buses; on each, programs (listeners with a transport id, inboxes) and
the routers attached to it. A message sent on a bus is encoded and decoded (so the route
marker travels as bytes), then reaches every program listening to a matching subject but
the sender, and every router attached to the bus -- the sending router too, as the engine's
local fan-out does. Inbox messages reach only the inbox's owner. Everything is delivered in
order from one queue, so the runs are deterministic.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

import pytest

from transports.rv import Message, Route, SubjectError, SubjectMatcher, decode, encode
from transports.rv.advisory import (
    LISTEN_QUERY,
    LISTEN_START,
    LISTEN_STOP,
    UNREACHABLE_TRANSPORT,
    advisory_message,
)
from transports.rv.router import STATE_SUBJECT, RouterCore


@dataclass
class Program:
    net: Net
    bus: str
    tid: str
    matcher: SubjectMatcher = field(default_factory=SubjectMatcher)
    subjects: list[str] = field(default_factory=list)
    got: list[Message] = field(default_factory=list)
    on_message: object = None

    def listen(self, subject: str) -> None:
        self.matcher.add(subject, subject)
        self.subjects.append(subject)
        self.net.advise(self.bus, LISTEN_START + subject, {"id": self.tid, "sub": subject})

    def unlisten(self, subject: str) -> None:
        self.matcher.remove(subject, subject)
        self.subjects.remove(subject)
        self.net.advise(self.bus, LISTEN_STOP + subject, {"id": self.tid, "sub": subject})

    def close(self) -> None:
        self.net.programs[self.bus].remove(self)
        self.net.advise(self.bus, UNREACHABLE_TRANSPORT + self.tid, {"id": self.tid})

    def inbox(self) -> str:
        name = f"_INBOX.{self.tid}.{next(self.net.counter)}"
        self.net.inboxes[name] = (self.bus, self)
        return name

    def send(self, msg: Message) -> None:
        self.net.send(self.bus, msg, self)

    def got_n(self) -> list[int]:
        return [m.get("n") for m in self.got]


class Net:
    def __init__(self, *buses: str) -> None:
        self.now = 1000.0
        self.counter = itertools.count(1)
        self.programs: dict[str, list[Program]] = {b: [] for b in buses}
        self.routers: dict[str, list[RouterCore]] = {b: [] for b in buses}
        self.inboxes: dict[str, tuple[str, object]] = {}
        self.queue: deque[tuple[str, bytes, object]] = deque()
        self.all_routers: list[RouterCore] = []
        self.sent: list[tuple[str, str, Message]] = []  # (router, bus, message) of routers

    def program(self, bus: str) -> Program:
        p = Program(self, bus, f"T{next(self.counter)}")
        self.programs[bus].append(p)
        return p

    def router(self, name: str, *buses: str, start: bool = True, **kw: object) -> RouterCore:
        def create_inbox(bus: str) -> str:
            inbox = f"_INBOX.{name}.{bus}.{next(self.counter)}"
            self.inboxes[inbox] = (bus, core)
            return inbox

        def drop_inbox(bus: str, inbox: str) -> None:
            del self.inboxes[inbox]

        core = RouterCore(name, buses, create_inbox=create_inbox, drop_inbox=drop_inbox,
                          incarnation=int(self.now * 1000), interval=1.0, **kw)  # type: ignore[arg-type]
        for b in buses:
            self.routers[b].append(core)
        self.all_routers.append(core)
        if start:
            self.emit(core, core.start(self.now))
            self.deliver()
        return core

    def kill(self, core: RouterCore) -> None:
        for rs in self.routers.values():
            if core in rs:
                rs.remove(core)
        self.all_routers.remove(core)

    def advise(self, bus: str, subject: str, fields: dict[str, object]) -> None:
        self.send(bus, advisory_message(subject, fields), None)

    def send(self, bus: str, msg: Message, sender: object) -> None:
        self.queue.append((bus, encode(msg), sender))
        self.deliver()

    def emit(self, core: RouterCore, outputs: list[tuple[str, Message]]) -> None:
        for bus, msg in outputs:
            assert core in self.routers[bus], (core.name, bus)
            self.sent.append((core.name, bus, msg))
            self.queue.append((bus, encode(msg), core))

    def deliver(self) -> None:
        while self.queue:
            bus, data, sender = self.queue.popleft()
            msg = decode(data)
            subject = msg.send_subject
            assert subject is not None
            if subject.startswith("_INBOX."):
                owner = self.inboxes.get(subject)
                if owner is None or owner[0] != bus:
                    continue
                target = owner[1]
                if isinstance(target, Program):
                    target.got.append(msg)
                    if callable(target.on_message):
                        target.on_message(msg)
                else:
                    assert isinstance(target, RouterCore)
                    self.emit(target, target.receive(bus, msg, self.now))
                continue
            if subject == LISTEN_QUERY:  # every engine answers
                for p in list(self.programs[bus]):
                    for s in p.subjects:
                        self.queue.append((bus, encode(advisory_message(
                            LISTEN_START + s, {"id": p.tid, "sub": s})), p))
            for p in list(self.programs[bus]):
                if p is not sender and p.matcher.match(subject):
                    p.got.append(msg)
                    if callable(p.on_message):
                        p.on_message(msg)
            for core in list(self.routers[bus]):
                self.emit(core, core.receive(bus, msg, self.now))

    def advance(self, seconds: float, step: float = 0.25) -> None:
        """Let time pass, ticking every router (as their drivers' timers would)."""
        end = self.now + seconds
        while self.now < end:
            self.now = min(end, self.now + step)
            for core in list(self.all_routers):
                if core.next_deadline() <= self.now:
                    self.emit(core, core.tick(self.now))
            self.deliver()

    def settle(self) -> None:
        self.advance(3.0)


def msg(subject: str, n: int, reply: str | None = None) -> Message:
    return Message(subject, reply).add("n", n)


# -- interest ---------------------------------------------------------------------------


def test_forwards_only_while_someone_listens_on_the_far_side():
    net = Net("A", "B")
    net.router("R", "A", "B")
    sender, far = net.program("A"), net.program("B")
    net.settle()
    sender.send(msg("TOKYO.REQUEST", 1))
    assert far.got == []
    far.listen("TOKYO.REQUEST")
    net.settle()
    sender.send(msg("TOKYO.REQUEST", 2))
    sender.send(msg("TOKYO.OTHER", 3))
    assert far.got_n() == [2]
    m = far.got[0]
    assert m.route == Route("A", 1) and m.send_subject == "TOKYO.REQUEST"
    far.unlisten("TOKYO.REQUEST")
    far.listen("TOKYO.*")
    sender.send(msg("TOKYO.REQUEST", 4))
    far.unlisten("TOKYO.*")
    sender.send(msg("TOKYO.REQUEST", 5))
    assert far.got_n() == [2, 4]


def test_interest_of_a_closed_transport_goes_and_the_other_direction_works():
    net = Net("A", "B")
    core = net.router("R", "A", "B")
    a, b = net.program("A"), net.program("B")
    b.listen("X.>")
    a.listen("Y")
    a.send(msg("X.1", 1))
    b.send(msg("Y", 2))
    assert b.got_n() == [1] and a.got_n() == [2]
    assert a.got[0].route == Route("B", 1)
    b.close()
    assert core.own_state().interest["B"] == frozenset()
    a.send(msg("X.1", 3))
    assert not [s for s in net.sent if s[2].send_subject == "X.1" and s[2].get("n") == 3]


def test_a_router_started_after_the_listeners_learns_them_by_query():
    net = Net("A", "B")
    a, b = net.program("A"), net.program("B")
    b.listen("LATE.>")
    core = net.router("R", "A", "B")
    assert [(bus, m.send_subject) for _, bus, m in net.sent[:2]] == [
        ("A", LISTEN_QUERY), ("B", LISTEN_QUERY)]
    assert core.own_state().interest["B"] == frozenset({"LATE.>"})
    a.send(msg("LATE.X", 1))
    assert b.got_n() == [1]


def test_interest_of_a_killed_listener_is_forgotten_at_the_next_query():
    net = Net("A", "B")
    core = net.router("R", "A", "B", requery=30.0)
    b, killed = net.program("B"), net.program("B")
    b.listen("KEEP")
    killed.listen("GONE")
    net.programs["B"].remove(killed)  # SIGKILL: no LISTEN.STOP, no UNREACHABLE.TRANSPORT
    assert core.own_state().interest["B"] == frozenset({"KEEP", "GONE"})
    net.advance(29.0)
    assert core.own_state().interest["B"] == frozenset({"KEEP", "GONE"})
    net.advance(3.0)  # the query at +30 s, the sweep an interval later
    assert core.own_state().interest["B"] == frozenset({"KEEP"})
    queries = [t for t in net.sent if t[2].send_subject == LISTEN_QUERY]
    assert len(queries) == 4  # at start and at +30 s, on each bus


def test_routers_do_not_take_each_others_interest_around_a_cycle():
    net = Net("A", "B", "C")
    for name, x, y in (("AB", "A", "B"), ("BC", "B", "C"), ("CA", "C", "A")):
        net.router(name, x, y)
    p = net.program("B")
    p.listen("S")
    net.settle()
    p.unlisten("S")
    net.settle()
    for core in net.all_routers:
        for state in core.routers():
            assert all(not subs for subs in state.interest.values()), state


# -- what never crosses -----------------------------------------------------------------


def test_advisories_local_and_control_subjects_never_cross():
    net = Net("A", "B")
    net.router("R", "A", "B", forward=["_RVCM.>"])
    a, b = net.program("A"), net.program("B")
    b.listen(">")
    b.listen("_RV.>")  # (no LISTEN advisory is made for "_" subjects; listen anyway)
    net.settle()
    before = len(b.got)
    net.advise("A", "_RV.ERROR.SYSTEM.DATALOSS.INBOUND.BCAST", {"host": "1.2.3.4", "lost": 3})
    net.advise("A", "_RV.INFO.SYSTEM.HOST.STATUS.7F000001", {"cc": 1})
    a.send(msg("_LOCAL.X", 1))
    a.send(msg("_RVRD.OTHER", 2))
    routed = [m for m in b.got[before:] if m.route is not None]
    assert routed == []
    with pytest.raises(SubjectError):
        RouterCore("R", ["A", "B"], create_inbox=str, forward=["_RV.>"])
    with pytest.raises(SubjectError):
        RouterCore("R", ["A", "B"], create_inbox=str, forward=["_INBOX.>"])


def test_underscore_subjects_cross_only_when_configured():
    net = Net("A", "B")
    net.router("R1", "A", "B")
    a, b = net.program("A"), net.program("B")
    b.matcher.add("_RVCM.>", "x")  # no LISTEN advisory for "_" subjects
    net.settle()
    a.send(msg("_RVCM.CONFIRM.X", 1))
    assert b.got == []
    net2 = Net("A", "B")
    net2.router("R1", "A", "B", forward=["_RVCM.>", "ALWAYS.>"])
    a, b = net2.program("A"), net2.program("B")
    b.matcher.add(">", "x")
    net2.settle()
    a.send(msg("_RVCM.CONFIRM.X", 1))
    a.send(msg("_RVFT.GROUP", 2))
    a.send(msg("ALWAYS.THERE", 3))
    assert [(m.send_subject, m.get("n")) for m in b.got if m.route] == [
        ("_RVCM.CONFIRM.X", 1), ("ALWAYS.THERE", 3)]


# -- inboxes ----------------------------------------------------------------------------


def test_request_reply_across_two_routers_through_surrogate_inboxes():
    net = Net("A", "B", "C")
    r1 = net.router("R1", "A", "B")
    r2 = net.router("R2", "B", "C")
    requester, server = net.program("A"), net.program("C")
    server.listen("SVC.TIME")

    def answer(m: Message) -> None:
        if m.send_subject == "SVC.TIME":
            assert m.reply_subject is not None
            reply = Message(m.reply_subject).add("n", m.get("n") * 10)
            server.send(reply)

    server.on_message = answer
    net.settle()
    inbox = requester.inbox()
    requester.send(msg("SVC.TIME", 1, inbox))
    requester.send(msg("SVC.TIME", 2, inbox))
    assert requester.got_n() == [10, 20]
    got = server.got
    assert got[0].reply_subject != inbox and got[0].reply_subject.startswith("_INBOX.R2.C.")
    assert got[0].reply_subject == got[1].reply_subject  # one surrogate per original inbox
    assert r1.surrogates() == 1 and r2.surrogates() == 1
    # a reply that itself asks for an answer: its inbox is rewritten the other way
    back = requester.inbox()
    server.on_message = None
    server.send(Message(got[0].reply_subject, server.inbox()).add("n", 7))
    assert requester.got_n()[-1] == 7
    conversation = requester.got[-1].reply_subject
    assert conversation.startswith("_INBOX.R1.A.")
    requester.send(Message(conversation).add("n", 8))
    assert server.got_n()[-1] == 8
    assert back not in (m.reply_subject for m in server.got)


def test_surrogates_are_bounded_and_expire():
    net = Net("A", "B")
    core = net.router("R", "A", "B", max_inboxes=3, inbox_ttl=10.0)
    a, b = net.program("A"), net.program("B")
    b.listen("Q")
    net.settle()
    inboxes = [a.inbox() for _ in range(5)]
    for i, inbox in enumerate(inboxes):
        a.send(msg("Q", i, inbox))
    assert core.surrogates() == 3
    oldest = b.got[0].reply_subject
    assert oldest not in net.inboxes  # forgotten (dropped from the transport too)
    assert core.receive("B", Message(oldest).add("n", 99), net.now) == []
    assert core.stats.unknown_inbox == 1
    b.send(Message(b.got[4].reply_subject).add("n", 4))
    assert a.got_n() == [4]
    net.advance(12.0)
    assert core.surrogates() == 0
    assert not [name for name in net.inboxes if name.startswith("_INBOX.R.")]


# -- loops and duplicates ---------------------------------------------------------------


def test_triangle_each_message_once_on_each_bus():
    net = Net("A", "B", "C")
    for name, x, y in (("AB", "A", "B"), ("BC", "B", "C"), ("CA", "C", "A")):
        net.router(name, x, y)
    listeners = {bus: net.program(bus) for bus in "ABC"}
    senders = {bus: net.program(bus) for bus in "ABC"}
    for p in listeners.values():
        p.listen("T.>")
    net.settle()
    n = 0
    for bus, s in senders.items():
        for _ in range(3):
            s.send(msg("T." + bus, n))
            n += 1
    for p in listeners.values():
        assert sorted(p.got_n()) == list(range(n)), p.bus
    assert all(m.route.hops <= 1 for p in listeners.values() for m in p.got if m.route)
    # with time passing (states re-sent, re-flooded), nothing circulates
    count = len(net.sent)
    net.advance(5.0)
    assert not [m for _, _, m in net.sent[count:] if m.send_subject.startswith("T.")]


def test_a_chain_of_four_with_a_shortcut_and_a_three_bus_router():
    net = Net("A", "B", "C", "D")
    net.router("R1", "A", "B", "C")
    net.router("R2", "C", "D")
    net.router("R3", "B", "D")
    net.router("R4", "A", "D")
    ps = {bus: net.program(bus) for bus in "ABCD"}
    for p in ps.values():
        p.listen("X")
    net.settle()
    for i, bus in enumerate("ABCD"):
        net.program(bus).send(msg("X", i))
    for p in ps.values():
        assert sorted(p.got_n()) == [0, 1, 2, 3], p.bus


def test_redundant_routers_deliver_once_and_the_backup_takes_over():
    net = Net("A", "B")
    r1 = net.router("R1", "A", "B")
    net.router("R2", "A", "B")
    a, b = net.program("A"), net.program("B")
    b.listen("D")
    net.settle()
    a.send(msg("D", 1))
    assert b.got_n() == [1]
    assert [c for c, bus, m in net.sent if m.send_subject == "D"] == ["R1"]
    net.kill(r1)  # it dies: no more states
    net.advance(1.0)
    a.send(msg("D", 2))  # R2 still believes R1 carries it: lost while it converges
    net.advance(5.0)
    a.send(msg("D", 3))
    assert b.got_n() == [1, 3]
    assert [c for c, bus, m in net.sent if m.send_subject == "D"] == ["R1", "R2"]


def test_a_routers_own_echo_is_harmless():
    net = Net("A", "B", "C")
    core = net.router("R", "A", "B", "C")
    for bus in "BC":
        net.program(bus).listen("E")
    net.settle()
    out = core.receive("A", msg("E", 1), net.now)
    assert sorted(bus for bus, _ in out) == ["B", "C"]
    for bus, m in out:
        echoed = decode(encode(m))
        assert core.receive(bus, echoed, net.now) == []


def test_hop_limit():
    net = Net("A", "B")
    core = net.router("R", "A", "B", hop_limit=4)
    b = net.program("B")
    b.listen("H")
    net.settle()
    over = msg("H", 1)
    over.route = Route("A", 4)
    assert core.receive("A", over, net.now) == []
    assert core.stats.hop_limit_dropped == 1
    under = msg("H", 2)
    under.route = Route("A", 3)
    [(bus, out)] = core.receive("A", under, net.now)
    assert bus == "B" and out.route == Route("A", 4)


def test_a_message_from_an_unknown_origin_or_off_the_tree_is_dropped():
    net = Net("A", "B", "C")
    core = net.router("R", "A", "B")
    net.router("S", "B", "C")
    net.program("A").listen("Z")
    net.settle()
    stray = msg("Z", 1)
    stray.route = Route("NOWHERE", 1)
    assert core.receive("B", stray, net.now) == []
    wrong_way = msg("Z", 2)
    wrong_way.route = Route("A", 1)  # came from A: it never goes back to A through B
    assert core.receive("B", wrong_way, net.now) == []
    right = msg("Z", 3)
    right.route = Route("C", 1)
    assert [bus for bus, _ in core.receive("B", right, net.now)] == ["A"]


def test_states_are_flooded_and_forgotten():
    net = Net("A", "B", "C")
    net.router("AB", "A", "B")
    bc = net.router("BC", "B", "C")
    net.settle()
    ab = net.all_routers[0]
    assert set(ab.others) == {"BC"} and set(bc.others) == {"AB"}
    relayed = [m for c, bus, m in net.sent if c == "AB" and bus == "A"
               and m.send_subject == STATE_SUBJECT and m.get("router") == "BC"]
    assert relayed  # BC's state crossed to A through AB
    net.kill(bc)
    net.advance(5.0)
    assert ab.others == {}


def test_the_core_refuses_bad_configuration():
    with pytest.raises(ValueError, match="two or more"):
        RouterCore("R", ["A"], create_inbox=str)
    with pytest.raises(ValueError, match="network name"):
        RouterCore("R", ["A", " B"], create_inbox=str)
    with pytest.raises(ValueError, match="hop_limit"):
        RouterCore("R", ["A", "B"], create_inbox=str, hop_limit=0)
