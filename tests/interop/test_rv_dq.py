"""Distributed queues (transports/rv/dqtransport.py) over real sockets: a certified sender
and three queue members in their own processes over loopback multicast; the scheduler is
killed with SIGKILL mid-stream, another member takes over, and every task is done exactly
once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from jsonchild import JsonChild
from test_rv_bus import Bus, wait_for
from test_rv_certified import CmChild

CHILD = str(Path(__file__).with_name("rvdq_child.py"))
QUEUE = "ORDERS.WORKERS"
SUBJECT = "ORDERS.NEW"


class DqChild(JsonChild):
    """tests/interop/rvdq_child.py in another process."""

    def __init__(self, bus: Bus, scheduler_weight: int, tasks: int, work_ms: int) -> None:
        self.done: list[tuple[int, int]] = []  # (n, seq)
        self.scheduler: list[bool] = []
        super().__init__(CHILD, bus.service, bus.network, QUEUE, SUBJECT,
                         str(scheduler_weight), str(tasks), str(work_ms))

    def take(self, obj: dict[str, Any]) -> bool:
        if "n" in obj:
            self.done.append((obj["n"], obj["seq"]))
        elif "scheduler" in obj:
            self.scheduler.append(obj["scheduler"])
        else:
            return False
        return True


def test_scheduler_killed_mid_stream_loses_and_doubles_no_task(
        bus: Bus, tmp_path: Path) -> None:
    n = 400
    children: list[JsonChild] = []
    try:
        # a: a dedicated scheduler (it does no task itself); b takes over; c works.
        a = DqChild(bus, scheduler_weight=9, tasks=0, work_ms=0)
        b = DqChild(bus, scheduler_weight=5, tasks=1, work_ms=2)
        c = DqChild(bus, scheduler_weight=1, tasks=1, work_ms=2)
        children += [a, b, c]
        # (on a loaded machine a late status can make another member scheduler for a
        # moment: what is checked is who is scheduler now, and that no task is lost or doubled)
        wait_for(lambda: a.scheduler[-1:] == [True], timeout=30, what="a scheduler")
        sender = CmChild(bus, "send", "SENDER", tmp_path / "sender.ledger")
        children.append(sender)
        sender.say("0 0 1")  # the task the scheduler discovers the sender by
        assert sender.lines.get(timeout=60) == {"sent": 0}
        wait_for(lambda: b.done + c.done, timeout=30, what="the first task")
        sender.say(f"1 {n} 200")
        wait_for(lambda: len(b.done) + len(c.done) > 100, timeout=60,
                 what="a hundred tasks done")
        a.kill()
        assert sender.lines.get(timeout=60) == {"sent": n}
        wait_for(lambda: b.scheduler[-1:] == [True], timeout=30, what="b to take over")

        def counts() -> Counter[int]:
            return Counter(num for num, _ in b.done + c.done)

        wait_for(lambda: len(counts()) == n + 1, timeout=60, what="every task")
        assert sorted(counts()) == list(range(n + 1))
        assert set(counts().values()) == {1}, {k: v for k, v in counts().items() if v > 1}
        assert all(seq for num, seq in b.done + c.done if num)  # all certified

        def stored() -> int:
            sender.say("stored")
            return int(sender.lines.get(timeout=30)["stored"])

        wait_for(lambda: stored() == 0, timeout=30, what="the sender's ledger to empty")
        assert c.done and b.done
    finally:
        for child in children:
            child.stop()
