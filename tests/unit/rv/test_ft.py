"""Fault tolerance (transports/rv/ft.py) on a virtual clock: ranking, activation after a
loss within one activation interval, hints, pre-emption, the status quo, goals above one,
partitions, advisories, the passive monitor."""

from __future__ import annotations

import random

import pytest

from transports.rv import ft
from transports.rv.codec import decode, encode
from transports.rv.ft import FtAction, FtCore, FtMonitorCore
from transports.rv.message import Message

G = "GW.PAIR"


class Member:
    def __init__(self, net: FtNet, name: str, **kw: object) -> None:
        kw.setdefault("rng", random.Random(net.rng.random()))
        self.name = name
        self.core = FtCore(G, now=net.now, **kw)  # type: ignore[arg-type]
        self.actions: list[tuple[float, FtAction]] = []
        self.advisories: list[Message] = []
        self.up = True
        self.cut: set[str] = set()  # members it cannot hear nor be heard by

    @property
    def active(self) -> bool:
        return self.core.active

    def adv(self, head: str) -> list[Message]:
        return [a for a in self.advisories if (a.send_subject or "").startswith(head)]


class FtNet:
    """Members and monitors on a virtual clock; a status reaches the others after
    ``delay``, plus up to ``jitter`` more (a loaded bus or process delays it; statuses stay
    in order per sender, as the bus keeps them)."""

    def __init__(self, seed: int = 1, delay: float = 0.001, now: float = 100.0,
                 jitter: float = 0.0) -> None:
        self.rng = random.Random(seed)
        self.now = now
        self.delay = delay
        self.jitter = jitter
        self._last_arrival: dict[str, float] = {}
        self.members: list[Member] = []
        self.monitors: list[tuple[FtMonitorCore, list[int]]] = []
        self.in_flight: list[tuple[float, str, bytes]] = []

    def add(self, name: str, **kw: object) -> Member:
        m = Member(self, name, **kw)
        self.members.append(m)
        return m

    def monitor(self, lost_interval: float) -> list[int]:
        counts: list[int] = []
        self.monitors.append((FtMonitorCore(G, lost_interval=lost_interval), counts))
        return counts

    def kill(self, m: Member) -> None:
        m.up = False

    def _collect(self) -> None:
        for m in self.members:
            if not m.up:
                continue
            out, events = m.core.flush()
            for e in events:
                if isinstance(e, FtAction):
                    m.actions.append((self.now, e))
                else:
                    m.advisories.append(e)
            for msg in out:
                at = self.now + self.delay + (self.rng.uniform(0, self.jitter)
                                              if self.jitter else 0.0)
                at = max(at, self._last_arrival.get(m.name, 0.0))  # in order per sender
                self._last_arrival[m.name] = at
                self.in_flight.append((at, m.name, encode(msg)))
        for mon, counts in self.monitors:
            counts.extend(mon.flush())

    def _deliver(self, upto: float) -> None:
        due = [x for x in self.in_flight if x[0] <= upto]
        self.in_flight = [x for x in self.in_flight if x[0] > upto]
        for _, sender, data in sorted(due, key=lambda x: x[0]):
            for m in self.members:
                if m.up and m.name != sender and sender not in m.cut:
                    m.core.receive(decode(data), self.now)
            for mon, _ in self.monitors:
                mon.receive(decode(data), self.now)

    def run(self, seconds: float) -> None:
        end = self.now + seconds
        while True:
            self._collect()
            times = [t for t, _, _ in self.in_flight]
            times += [d for m in self.members if m.up
                      and (d := m.core.next_deadline()) is not None]
            times += [d for mon, _ in self.monitors if (d := mon.next_deadline()) is not None]
            nxt = max(min(times), self.now) if times else end
            if nxt > end:
                self.now = end
                return
            self.now = nxt
            self._deliver(self.now)
            for m in self.members:
                if m.up:
                    m.core.tick(self.now)
            for mon, _ in self.monitors:
                mon.tick(self.now)

    def actives(self) -> list[str]:
        return sorted(m.name for m in self.members if m.up and m.active)


def test_one_of_two_equal_members_activates_after_the_join_wait() -> None:
    net = FtNet()
    a = net.add("a", activation=3.0, heartbeat=1.0)
    net.run(1.0)
    b = net.add("b", activation=3.0, heartbeat=1.0)
    net.run(1.9)
    assert net.actives() == []  # nobody before one activation interval
    net.run(0.2)
    assert net.actives() == ["a"]
    assert a.actions == [(pytest.approx(103.0), FtAction.ACTIVATE)]
    net.run(10)
    assert net.actives() == ["a"] and b.actions == []  # the status quo: b never pre-empts


def test_the_backup_takes_over_within_one_activation_interval() -> None:
    net = FtNet()
    a = net.add("a", activation=3.0, heartbeat=1.0)
    b = net.add("b", activation=3.0, heartbeat=1.0)
    net.run(5)
    active, backup = (a, b) if a.active else (b, a)
    last_status = net.now  # statuses go every second; it was heard within the last one
    net.kill(active)
    net.run(5)
    assert net.actives() == [backup.name]
    took_over = backup.actions[-1]
    assert took_over[1] is FtAction.ACTIVATE
    # Lost at its last status + the activation interval: at most 3 s after the kill, and
    # more than 3 s - 1 heartbeat.
    assert 2.0 - 0.01 <= took_over[0] - last_status <= 3.0 + 0.01


@pytest.mark.parametrize("seed", range(5))
def test_failover_under_load_keeps_one_active_and_the_timing(seed: int) -> None:
    """Statuses delayed by up to 0.8 s (a loaded bus, a busy process): never two actives
    while the active member lives, and after it dies the backup takes over no earlier than
    the activation interval minus a heartbeat and the delay after its last status was
    heard, and no later than the activation interval after it."""
    jitter = 0.8
    net = FtNet(seed, jitter=jitter)
    members = [net.add(n, activation=3.0, heartbeat=1.0) for n in "abc"]
    net.run(5)
    for _ in range(40):  # 20 s of loaded running, checked every half second
        net.run(0.5)
        assert len(net.actives()) == 1
    active = next(m for m in members if m.up and m.active)
    sent_at = net.now
    heard = [t for t, sender, _ in net.in_flight if sender == active.name]
    last_heard = max(heard) if heard else sent_at
    net.kill(active)
    net.in_flight = [x for x in net.in_flight if x[1] != active.name or x[0] <= last_heard]
    net.run(10)
    assert len(net.actives()) == 1
    backup = next(m for m in members if m.up and m.active)
    took_over = backup.actions[-1]
    assert took_over[1] is FtAction.ACTIVATE
    # heard last at most 1 heartbeat + the jitter before the kill (and its queued ones after)
    assert sent_at - 1.0 - jitter - 0.01 <= took_over[0] - 3.0 <= last_heard + 0.01


def test_a_prepare_hint_comes_before_the_activation_by_at_most_activation_minus_preparation(
        ) -> None:
    net = FtNet()
    a = net.add("a", activation=6.0, heartbeat=1.0, preparation=4.5)
    b = net.add("b", activation=6.0, heartbeat=1.0, preparation=4.5)
    net.run(8)
    active, backup = (a, b) if a.active else (b, a)
    assert active.actions[0][1] is FtAction.PREPARE_TO_ACTIVATE  # no warning: given at once
    net.kill(active)
    net.run(8)
    hint, act = backup.actions[-2:]
    assert hint[1] is FtAction.PREPARE_TO_ACTIVATE and act[1] is FtAction.ACTIVATE
    assert 0 < act[0] - hint[0] <= 6.0 - 4.5 + 0.01


def test_a_heavier_member_pre_empts_once_it_is_active() -> None:
    net = FtNet()
    light = net.add("light", weight=10)
    net.run(5)
    assert net.actives() == ["light"]
    heavy = net.add("heavy", weight=100)
    net.run(2.9)
    assert net.actives() == ["light"]  # heavy is still joining: light stays
    net.run(1)
    assert net.actives() == ["heavy"]
    assert light.actions[-1][1] is FtAction.DEACTIVATE
    assert light.actions[-1][0] >= heavy.actions[-1][0]


def test_a_goal_of_two_keeps_two_active() -> None:
    net = FtNet()
    ms = [net.add(n, active_goal=2, weight=w) for n, w in (("a", 30), ("b", 20), ("c", 10))]
    net.run(5)
    assert net.actives() == ["a", "b"]
    net.kill(ms[0])
    net.run(4)
    assert net.actives() == ["b", "c"]


def test_a_withdrawn_member_is_replaced_at_once() -> None:
    net = FtNet()
    a = net.add("a", weight=20, activation=10.0, heartbeat=2.0)
    b = net.add("b", weight=10, activation=10.0, heartbeat=2.0)
    net.run(12)
    assert net.actives() == ["a"]
    a.core.withdraw()
    t = net.now
    net.run(1)
    assert net.actives() == ["b"]
    assert b.actions[-1][0] - t < 0.1


def test_a_healed_partition_leaves_one_active_and_warns_too_many() -> None:
    net = FtNet()
    a = net.add("a")
    b = net.add("b")
    net.run(5)
    a.cut, b.cut = {"b"}, {"a"}
    net.run(5)
    assert net.actives() == ["a", "b"]
    a.cut, b.cut = set(), set()
    net.run(3)
    assert len(net.actives()) == 1
    assert any(m.adv(ft.TOO_MANY_ACTIVE) for m in (a, b))
    adv = next(m for m in (a, b) if m.adv(ft.TOO_MANY_ACTIVE)).adv(ft.TOO_MANY_ACTIVE)[0]
    assert adv.send_subject == ft.TOO_MANY_ACTIVE + G and adv.get("RVADV_DESC")


def test_parameter_mismatches_are_advised() -> None:
    net = FtNet()
    a = net.add("a", active_goal=1, activation=3.0, heartbeat=1.0, preparation=2.5)
    b = net.add("b", active_goal=2, activation=4.0, heartbeat=2.0, preparation=3.0)
    net.run(2)
    descs = {(x.send_subject, x.get("RVADV_DESC")) for x in a.advisories}
    assert (ft.PARAM_MISMATCH_ERROR + G, "Active goal differs") in descs
    assert (ft.PARAM_MISMATCH_ERROR + G, "Activation interval differs") in descs
    assert (ft.PARAM_MISMATCH_WARN + G, "Heartbeat interval differs") in descs
    assert len(a.advisories) == len(descs)  # each once
    assert b.adv(ft.PARAM_MISMATCH_ERROR)


def test_a_disabled_member_deactivates_and_is_a_last_resort() -> None:
    net = FtNet()
    a = net.add("a", weight=20)
    b = net.add("b", weight=10)
    net.run(5)
    assert net.actives() == ["a"]
    a.core.disable(net.now, "cannot allocate memory")
    net.run(1)
    assert net.actives() == ["b"]
    assert a.adv(ft.DISABLING_MEMBER)[0].get("RVADV_DESC") == "cannot allocate memory"
    net.kill(b)
    net.run(5)
    assert net.actives() == ["a"]  # weight 0 activates when nobody else is left


def test_the_passive_monitor_counts_the_active_members() -> None:
    net = FtNet()
    counts = net.monitor(lost_interval=3.0)
    a = net.add("a", active_goal=2)
    net.add("b", active_goal=2)
    net.run(5)
    assert counts[-1] == 2
    net.kill(a)
    net.run(4)
    assert counts[-1] == 1


def test_intervals_are_checked() -> None:
    with pytest.raises(ValueError, match="heartbeat"):
        FtCore(G, heartbeat=3.0, activation=3.0, now=0)
    with pytest.raises(ValueError, match="preparation"):
        FtCore(G, heartbeat=1.0, preparation=0.5, activation=3.0, now=0)
    with pytest.raises(ValueError):
        FtCore("A.*", now=0)


@pytest.mark.parametrize("seed", range(10))
def test_random_failures_settle_on_the_goal(seed: int) -> None:
    rng = random.Random(seed)
    net = FtNet(seed)
    goal = rng.choice((1, 2))
    names = iter(f"m{i}" for i in range(100))
    for _ in range(4):
        net.add(next(names), weight=rng.choice((10, 20, 20)), active_goal=goal)
    for _ in range(6):
        net.run(rng.uniform(0.5, 8))
        alive = [m for m in net.members if m.up]
        if len(alive) > 1 and rng.random() < 0.6:
            net.kill(rng.choice(alive))
        else:
            net.add(next(names), weight=rng.choice((10, 20, 20)), active_goal=goal)
    net.run(10)  # longer than an activation interval and a join wait
    alive = [m for m in net.members if m.up]
    actives = [m for m in alive if m.active]
    assert len(actives) == min(goal, len(alive))
    best = sorted((m.core.weight for m in alive), reverse=True)[:goal]
    assert sorted((m.core.weight for m in actives), reverse=True) == best
