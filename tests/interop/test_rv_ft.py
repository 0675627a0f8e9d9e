"""Fault tolerance (transports/rv/fttransport.py) over real sockets: members in one process
and in separate processes over loopback multicast, the active one killed with SIGKILL."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from jsonchild import JsonChild
from test_rv_bus import Bus, wait_for

from transports.rv import Listener, Message
from transports.rv.ft import FtAction
from transports.rv.fttransport import FtMember, FtMonitor

CHILD = str(Path(__file__).with_name("rvft_child.py"))
GROUP = "ORDERS.SERVER"


def test_members_in_one_process_fail_over_on_withdrawal(bus: Bus) -> None:
    actions: dict[str, list[FtAction]] = {"a": [], "b": []}
    counts: list[int] = []
    monitor = FtMonitor(bus.transport(), GROUP, lambda m, g, n: counts.append(n),
                        lost_interval=2.0, queue=bus.queue)
    a = FtMember(bus.transport(), GROUP, lambda m, g, act: actions["a"].append(act),
                 weight=20, heartbeat=0.3, activation=2.0, queue=bus.queue)
    b = FtMember(bus.transport(), GROUP, lambda m, g, act: actions["b"].append(act),
                 weight=10, heartbeat=0.3, activation=2.0, queue=bus.queue)
    wait_for(lambda: actions["a"] == [FtAction.ACTIVATE], what="a active")
    wait_for(lambda: counts and counts[-1] == 1, what="the monitor's count")
    assert a.is_active and not b.is_active
    a.destroy()
    wait_for(lambda: actions["b"] == [FtAction.ACTIVATE], what="b active")
    b.destroy()
    wait_for(lambda: counts[-1] == 0, what="the monitor's count back to 0")
    monitor.destroy()


def test_ft_advisories_are_presented_on_the_transport(bus: Bus) -> None:
    t = bus.transport()
    seen: list[Message] = []
    Listener(t, "_RV.*.RVFT.>", lambda m, _: seen.append(m), queue=bus.queue)
    a = FtMember(t, GROUP, lambda *_: None, active_goal=1, heartbeat=0.3, activation=1.0,
                 queue=bus.queue)
    b = FtMember(bus.transport(), GROUP, lambda *_: None, active_goal=2, heartbeat=0.3,
                 activation=1.0, queue=bus.queue)
    wait_for(lambda: any(m.get("RVADV_DESC") == "Active goal differs" for m in seen),
             what="PARAM_MISMATCH")
    a.destroy()
    b.destroy()


class FtChild(JsonChild):
    """tests/interop/rvft_child.py in another process: its actions, with their times."""

    def __init__(self, bus: Bus, weight: int, heartbeat: float, activation: float) -> None:
        self.actions: list[tuple[str, float]] = []
        super().__init__(CHILD, bus.service, bus.network, GROUP, str(weight), str(heartbeat),
                         str(activation))

    def take(self, obj: dict[str, Any]) -> bool:
        if "action" not in obj:
            return False
        self.actions.append((obj["action"], obj["t"]))
        return True

    def active(self) -> bool:
        acts = [a for a, _ in self.actions if a != "PREPARE_TO_ACTIVATE"]
        return bool(acts) and acts[-1] == "ACTIVATE"


def test_the_backup_process_takes_over_when_the_active_one_is_killed(bus: Bus) -> None:
    heartbeat, activation = 0.3, 1.5
    primary = FtChild(bus, 20, heartbeat, activation)
    backup = FtChild(bus, 10, heartbeat, activation)
    try:
        wait_for(lambda: primary.active(), timeout=30, what="the primary active")
        time.sleep(2 * heartbeat)
        assert not backup.active()
        killed_at = time.time()
        primary.kill()
        wait_for(lambda: backup.active(), timeout=30, what="the backup active")
        took = backup.actions[-1][1] - killed_at
        # Not before the primary's last status is an activation interval old (it was at
        # most one heartbeat old at the kill), however fast the machine.
        assert took >= activation - heartbeat - 0.05, took
    finally:
        primary.stop()
        backup.stop()
