"""Distributed queues (transports/rv/dq.py) on a virtual clock: one-of-n assignment by worker
weight and capacity, the scheduler working only when every other worker is busy, lost
workers, complete time, the backlog limit, the scheduler's advisories, and scheduler
failure under load without a task lost or done twice."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from transports.rv.cm import CONTROL_PREFIX, CmCore, CmDelivery
from transports.rv.codec import decode, encode
from transports.rv.dq import (
    SCHEDULER_ACTIVE,
    SCHEDULER_INACTIVE,
    SCHEDULER_OVERFLOW,
    DqCore,
    DqTask,
)
from transports.rv.message import Message

Q = "WORK.QUEUE"
SUBJECT = "JOBS.NEW"


@dataclass
class Member:
    name: str
    core: DqCore
    hold: bool = False  # keep tasks until finish() (else finished at once)
    work_time: float = 0.0  # with hold False: finished this long after arrival
    tasks: list[tuple[float, DqTask]] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    advisories: list[Message] = field(default_factory=list)
    up: bool = True

    def adv(self, head: str) -> list[Message]:
        return [a for a in self.advisories if (a.send_subject or "").startswith(head)]

    def held(self) -> list[str]:
        return [t.key for _, t in self.tasks if t.key not in self.finished]


class DqNet:
    """A CM sender and queue members on one in-memory bus: a message reaches every member
    listening to its subject, the owner of an inbox, and (a member's own multicast too, as
    the bus's local fan-out does); it is encoded and decoded on the way."""

    def __init__(self, seed: int = 1, now: float = 1000.0) -> None:
        self.rng = random.Random(seed)
        self.now = now
        self.members: list[Member] = []
        self.sender = CmCore("SENDER", now=now, request_interval=0.5,
                             rng=random.Random(seed))
        self.sender_events: list[Message] = []
        self.n = 0
        self.drop: Callable[[Message], bool] | None = None  # lost on the way when True

    def add(self, name: str, **kw: object) -> Member:
        kw.setdefault("rng", random.Random(self.rng.random()))
        kw.setdefault("request_interval", 0.5)
        core = DqCore(Q, f"_INBOX.{name}", now=self.now, **kw)  # type: ignore[arg-type]
        core.listen(SUBJECT, self.now)
        m = Member(name, core)
        self.members.append(m)
        return m

    def crash(self, m: Member) -> None:
        m.up = False

    def send(self, count: int = 1) -> None:
        for _ in range(count):
            self.n += 1
            self.sender.send(Message(SUBJECT).add("n", self.n), self.now)

    def scheduler(self) -> Member | None:
        ups = [m for m in self.members if m.up and m.core.is_scheduler]
        assert len(ups) <= 1
        return ups[0] if ups else None

    def _deliver(self, msg: Message) -> None:
        if self.drop is not None and self.drop(msg):
            return
        data = encode(msg)
        subject = msg.send_subject or ""
        if subject == self.sender.control_subject:
            self.sender.receive(decode(data), self.now)
            return
        for m in self.members:
            if m.up and subject in (m.core.inbox, m.core.subject, CONTROL_PREFIX + Q, SUBJECT):
                m.core.receive(decode(data), self.now)

    def step(self) -> bool:
        moved = False
        out, events = self.sender.flush()
        self.sender_events.extend(e.message() for e in events if not isinstance(e, CmDelivery))
        for msg in out:
            self._deliver(msg)
            moved = True
        for m in list(self.members):
            if not m.up:
                continue
            out2, evs = m.core.flush(self.now)
            for ev in evs:
                moved = True
                if isinstance(ev, DqTask):
                    m.tasks.append((self.now, ev))
                    if not m.hold and not m.work_time:
                        self.finish(m, ev.key)
                else:
                    m.advisories.append(ev)
            for msg in out2:
                self._deliver(msg)
                moved = True
        return moved

    def finish(self, m: Member, key: str) -> None:
        m.finished.append(key)
        m.core.complete(key, self.now)

    def _work_due(self) -> list[float]:
        return [t + m.work_time for m in self.members if m.up and m.work_time and not m.hold
                for t, task in m.tasks if task.key not in m.finished]

    def run(self, until: float) -> None:
        for _ in range(200_000):
            if self.step():
                continue
            for m in self.members:
                if m.up and m.work_time and not m.hold:
                    for t, task in m.tasks:
                        if task.key not in m.finished and t + m.work_time <= self.now:
                            self.finish(m, task.key)
            if self.step():
                continue
            deadlines = [d for m in self.members if m.up
                         and (d := m.core.next_deadline()) is not None]
            deadlines += self._work_due()
            sd = self.sender.next_deadline()
            if sd is not None:
                deadlines.append(sd)
            nxt = max(min(deadlines), self.now) if deadlines else until
            if nxt > until:
                self.now = until
                return
            self.now = nxt
            self.sender.tick(self.now)
            for m in self.members:
                if m.up:
                    m.core.tick(self.now)
        raise AssertionError("the network did not settle")

    def done_counts(self) -> Counter[int]:
        """Task n -> how many times a member finished it."""
        counts: Counter[int] = Counter()
        for m in self.members:
            by_key = {t.key: t for _, t in m.tasks}
            for key in m.finished:
                counts[by_key[key].msg.get("n")] += 1  # type: ignore[index]
        return counts


def started(*specs: tuple[str, dict[str, object]], seed: int = 1) -> tuple[DqNet, list[Member]]:
    net = DqNet(seed)
    members = [net.add(name, **kw) for name, kw in specs]
    net.run(net.now + 5.0)  # the join wait: a scheduler is elected
    return net, members


def test_the_heaviest_member_becomes_scheduler_and_says_so() -> None:
    net, (a, b, c) = started(("a", {"scheduler_weight": 3}), ("b", {"scheduler_weight": 2}),
                             ("c", {}))
    assert net.scheduler() is a
    assert [m.get("name") for m in a.adv(SCHEDULER_ACTIVE)] == [Q]
    assert not b.adv(SCHEDULER_ACTIVE) and not c.adv(SCHEDULER_ACTIVE)


def test_each_task_goes_to_one_worker_and_is_confirmed_to_the_sender() -> None:
    net, (a, b, c) = started(("a", {"scheduler_weight": 3}), ("b", {}), ("c", {}))
    net.send(1)
    net.run(net.now + 1)
    net.send(59)
    net.run(net.now + 10)
    counts = net.done_counts()
    assert sorted(counts) == list(range(1, 61))
    assert set(counts.values()) == {1}
    assert net.sender.stored_count() == 0
    # Every certified one reached its sender as complete (the first one, which made the
    # scheduler discover the sender, is not certified).
    complete = [e.get("seqno") for e in net.sender_events
                if (e.send_subject or "").startswith("_RV.INFO.RVCM.DELIVERY.COMPLETE")]
    assert sorted(complete) == list(range(2, 61))
    assert len(b.finished) > 0 and len(c.finished) > 0


def test_assignment_by_weight_round_robin_and_the_scheduler_last() -> None:
    net, (a, b, c, d) = started(
        ("a", {"scheduler_weight": 9}), ("b", {"worker_weight": 5}),
        ("c", {"worker_weight": 5}), ("d", {"worker_weight": 1}))
    for m in (a, b, c, d):
        m.hold = True
    net.send(1)  # discovery: the scheduler registers
    net.run(net.now + 2)
    first = [m.name for m in (a, b, c, d) if m.held()]
    assert len(first) == 1 and first[0] in ("b", "c")  # a heavy worker, not the scheduler
    net.send(1)
    net.run(net.now + 1)
    assert sorted(m.name for m in (b, c) if m.held()) == ["b", "c"]  # round robin
    net.send(1)
    net.run(net.now + 1)
    assert d.held() and not a.held()  # the light worker before the scheduler
    net.send(1)
    net.run(net.now + 1)
    assert a.held()  # every other worker busy: the scheduler works
    net.send(1)
    net.run(net.now + 1)
    assert sum(len(m.held()) for m in (a, b, c, d)) == 4  # capacity 1 each: it waits
    net.finish(b, b.held()[0])
    net.run(net.now + 1)
    assert len(b.held()) == 1  # the waiting task went to the worker that finished
    for m in (a, b, c, d):
        m.hold = False
        for key in m.held():
            net.finish(m, key)
    net.run(net.now + 5)
    assert set(net.done_counts().values()) == {1} and len(net.done_counts()) == 5


def test_a_dedicated_scheduler_and_a_capacity_of_two() -> None:
    net, (a, b) = started(("a", {"scheduler_weight": 9, "worker_tasks": 0}),
                          ("b", {"worker_tasks": 2}))
    a.hold = b.hold = True
    net.send(4)
    net.run(net.now + 2)
    assert not a.tasks
    assert len(b.held()) == 2


def test_a_lost_worker_s_tasks_go_to_another() -> None:
    net, (a, b, c) = started(("a", {"scheduler_weight": 9, "worker_tasks": 0}),
                             ("b", {"worker_weight": 5}), ("c", {}))
    b.hold = True
    net.send(1)
    net.run(net.now + 2)
    net.send(1)
    net.run(net.now + 1)
    assert len(b.held()) == 1
    lost_key = b.held()[0]
    net.crash(b)
    crashed_at = net.now
    net.run(net.now + 10)
    redone = [t for t, task in c.tasks if task.key == lost_key]
    assert redone and redone[0] - crashed_at <= 3.5 + 1.0  # within the activation interval
    assert net.sender.stored_count() == 0


def test_a_task_not_finished_within_the_complete_time_is_given_again() -> None:
    net, (a, b, c) = started(("a", {"scheduler_weight": 9, "worker_tasks": 0,
                                    "complete_time": 2.0}),
                             ("b", {"worker_weight": 5, "complete_time": 2.0}),
                             ("c", {"complete_time": 2.0}))
    b.hold = True
    net.send(1)
    net.run(net.now + 1)
    given, task = b.tasks[0]
    key = task.key
    net.run(net.now + 5)
    again = [t for t, task in c.tasks if task.key == key]
    assert again and 2.0 <= again[0] - given <= 2.5


def test_the_backlog_limit_discards_with_an_advisory_and_confirms() -> None:
    net, (a, b) = started(("a", {"scheduler_weight": 9, "worker_tasks": 0, "backlog_limit": 2}),
                          ("b", {"backlog_limit": 2}))
    b.hold = True
    net.send(1)
    net.run(net.now + 1)  # b works on it
    net.send(4)  # two wait, two are discarded
    net.run(net.now + 1)
    over = a.adv(SCHEDULER_OVERFLOW)
    assert [m.get("seqno") for m in over] == [4, 5]
    assert over[0].get("reason") == "Task backlog limit reached."
    assert over[0].get("sender") == "SENDER" and over[0].get("subject") == SUBJECT
    assert not b.adv(SCHEDULER_OVERFLOW)
    b.hold = False
    for key in b.held():
        net.finish(b, key)
    net.run(net.now + 5)
    assert sorted(net.done_counts()) == [1, 2, 3]
    assert net.sender.stored_count() == 0  # the discarded ones were confirmed too


def test_a_heavier_member_takes_over_with_the_advisories() -> None:
    net, (a, b) = started(("a", {"scheduler_weight": 2}), ("b", {}))
    a.work_time = b.work_time = 0.3
    net.send(10)
    net.run(net.now + 0.5)
    d = net.add("d", scheduler_weight=5)
    d.work_time = 0.3
    for _ in range(10):
        net.send(2)
        net.run(net.now + 0.5)
    net.run(net.now + 20)
    assert net.scheduler() is d
    assert a.adv(SCHEDULER_INACTIVE) and d.adv(SCHEDULER_ACTIVE)
    counts = net.done_counts()
    assert sorted(counts) == list(range(1, 31)) and set(counts.values()) == {1}
    assert net.sender.stored_count() == 0


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_scheduler_failure_under_load_loses_and_doubles_nothing(seed: int) -> None:
    """The scheduler dies while workers hold tasks, have finished tasks it had not
    confirmed (held back behind a slow one) and tasks are on their way: the next scheduler
    takes over within the activation interval and every task is done exactly once."""
    net, (a, b, c, d) = started(
        ("a", {"scheduler_weight": 9, "worker_tasks": 0}), ("b", {"scheduler_weight": 5}),
        ("c", {"worker_weight": 3}), ("d", {"worker_weight": 3}), seed=seed)
    b.work_time = 0.05
    c.work_time = 0.4
    d.work_time = 0.1
    net.send(1)
    net.run(net.now + 1)
    c.hold = True  # c is slow with the next task: what others finish is held back behind it
    net.send(6)
    net.run(net.now + 0.3)
    assert c.held()
    rng = random.Random(seed)
    for _ in range(8):
        net.send(3)
        net.run(net.now + rng.uniform(0.02, 0.2))
    net.crash(a)
    crashed_at = net.now
    for _ in range(20):
        net.send(2)
        net.run(net.now + rng.uniform(0.02, 0.2))
    net.run(crashed_at + 3.5 + 1.0)
    assert net.scheduler() is b  # within the activation interval (and the join of queries)
    assert c.held()  # still working on the slow one: it must stay with c
    for _ in range(5):
        net.send(2)
        net.run(net.now + rng.uniform(0.02, 0.2))
    c.hold = False
    net.run(net.now + 30)
    assert net.scheduler() is b
    took_over = b.adv(SCHEDULER_ACTIVE)
    assert took_over
    counts = net.done_counts()
    assert sorted(counts) == list(range(1, net.n + 1)), "a task was lost"
    assert set(counts.values()) == {1}, {n: k for n, k in counts.items() if k > 1}
    assert net.sender.stored_count() == 0


def test_uncertified_tasks_are_given_once_too() -> None:
    net, (a, b) = started(("a", {"scheduler_weight": 9}), ("b", {}))
    plain = Message(SUBJECT).add("n", 1)
    for m in net.members:
        m.core.receive(decode(encode(plain)), net.now)
    net.run(net.now + 2)
    assert sum(len(m.tasks) for m in net.members) == 1
    key = next(t.key for m in net.members for _, t in m.tasks)
    assert json.loads(key)[0] == ""


def test_bad_parameters_and_wildcards_are_refused() -> None:
    with pytest.raises(ValueError):
        DqCore("_Q", "_INBOX.x", now=0.0)
    with pytest.raises(ValueError):
        DqCore(Q, "_INBOX.x", worker_tasks=-1, now=0.0)
    with pytest.raises(ValueError):
        DqCore(Q, "_INBOX.x", scheduler_heartbeat=2.0, scheduler_activation=1.0, now=0.0)
    core = DqCore(Q, "_INBOX.x", now=0.0)
    with pytest.raises(ValueError):
        core.listen("JOBS.>", 0.0)


def test_garbage_on_the_queue_subjects_is_ignored() -> None:
    net, (a, b) = started(("a", {"scheduler_weight": 9}), ("b", {}))
    for m in (a, b):
        for msg in (Message(m.core.subject), Message(m.core.subject).add("op", 5),
                    Message(m.core.inbox).add("op", "TASK").add("key", "k"),
                    Message(m.core.inbox).add("op", "DONE").add("key", "[1"),
                    Message(m.core.inbox).add("op", "DONE").add("key", "x").add("inbox", "y"),
                    Message(m.core.subject).add("op", "WORKER").add("member", "zz")):
            m.core.receive(msg, net.now)
    net.send(3)
    net.run(net.now + 5)
    assert sorted(net.done_counts()) == [1, 2, 3]


def test_a_new_scheduler_waits_for_a_slow_member_s_answer() -> None:
    """A member that is alive but answers the new scheduler's QUERY only after more than an
    activation interval (its first answers lost): the scheduler asks again and gives out
    nothing meanwhile, so the task that member holds is not done twice."""
    net, (a, b, c) = started(("a", {"scheduler_weight": 9, "worker_tasks": 0}),
                             ("b", {"scheduler_weight": 5}), ("c", {"worker_weight": 5}))
    net.send(1)
    net.run(net.now + 1)
    c.hold = True
    net.send(1)
    net.run(net.now + 1)
    assert len(c.held()) == 1
    lost = {"n": 0}

    def drop(msg: Message) -> bool:
        if "query" in msg and msg.get("member") == c.core.id and lost["n"] < 6:
            lost["n"] += 1
            return True
        return False

    net.drop = drop
    net.crash(a)
    net.run(net.now + 12)
    assert net.scheduler() is b and lost["n"] == 6  # asked again while c stayed silent
    assert len(c.held()) == 1 and not b.held()  # still c's, not given to b meanwhile
    net.finish(c, c.held()[0])
    net.run(net.now + 10)
    counts = net.done_counts()
    assert sorted(counts) == [1, 2] and set(counts.values()) == {1}
    assert net.sender.stored_count() == 0
