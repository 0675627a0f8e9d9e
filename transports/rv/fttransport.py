"""Fault tolerance for programs: :class:`FtMember` and :class:`FtMonitor`.

A member joins a fault-tolerance group over a bus transport (:mod:`transports.rv.ft` for the
protocol; TIBCO Rendezvous Concepts, Fault Tolerance Concepts)::

    from transports.rv import Transport, default_queue
    from transports.rv.fttransport import FtMember

    def on_action(member, group, action):
        if action is FtAction.ACTIVATE: start_serving()
        elif action is FtAction.DEACTIVATE: stop_serving()

    t = Transport(service="7504", network="127.0.0.1;239.192.75.4")
    member = FtMember(t, "ORDERS.SERVER", on_action, weight=50, activation=3.0, heartbeat=1.0)
    while True:
        default_queue().dispatch()

How it works. As for certified delivery, the protocol core lives on the loop of the bus
engine under the transport; a bus listener on ``_RVFT.<group>`` (dispatched on that loop)
feeds it, one loop timer runs it at its next deadline, and after each step its statuses are
multicast and its actions queued for the program: ``callback(member, group, action)`` runs
when the member's queue is dispatched (the transport's default queue unless given; Fault
Tolerance Concepts advises a queue of its own, dispatched promptly). Advisories are
presented on the transport (an ordinary listener on ``_RV.*.RVFT.>`` receives them).
:meth:`FtMember.destroy` withdraws from the group. Give the group a service of its own
where the bus is busy, so that statuses are not delayed behind data.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from transports.rv.driver import CoreDriver
from transports.rv.ft import FtAction, FtCore, FtMonitorCore
from transports.rv.queue import Event, Queue
from transports.rv.transport import _BaseTransport

ActionCallback = Callable[["FtMember", str, FtAction], object]
MonitorCallback = Callable[["FtMonitor", str, int], object]


class FtMember(CoreDriver):
    """A member of fault-tolerance group ``group`` on ``transport`` (module docstring).

    ``callback(member, group, action)`` gets each :class:`~transports.rv.ft.FtAction`; the
    other arguments are :class:`~transports.rv.ft.FtCore`'s. New members start inactive.
    """

    def __init__(self, transport: _BaseTransport, group: str, callback: ActionCallback, *,
                 weight: int = 50, active_goal: int = 1, heartbeat: float = 1.0,
                 preparation: float = 0.0, activation: float = 3.0,
                 queue: Queue | None = None) -> None:
        self.core = FtCore(group, weight=weight, active_goal=active_goal, heartbeat=heartbeat,
                           preparation=preparation, activation=activation,
                           now=time.monotonic())
        super().__init__(transport, f"ft:{group}", "fault tolerance")
        self.group = group
        self.user_callback = callback
        self.queue = queue if queue is not None else transport.default_listener_queue
        self.bus_listen(self.core.subject)
        self.call(lambda: None)  # the first status, and the timer

    @property
    def is_active(self) -> bool:
        """Whether the group last told this member to be active."""
        return bool(self.core.active)

    def callback(self, action: Any, _: object) -> None:
        """Run by the queue: the program's callback."""
        self.user_callback(self, self.group, action)

    def set_weight(self, weight: int) -> None:
        self.call(lambda: self.core.set_weight(weight, time.monotonic()))

    def disable(self, reason: str = "") -> None:
        """Report a resource error: deactivate, weight 0 (``DISABLING_MEMBER``)."""
        self.call(lambda: self.core.disable(time.monotonic(), reason))

    def destroy(self) -> None:
        """Withdraw from the group (the others know at once)."""
        if not self.active:
            return

        def leave() -> None:
            if self.active:
                self.core.withdraw()
                self.flush()
                self.stop()

        self.host.soon(leave)
        self.queue.purge(self)

    def flush(self) -> None:
        out, events = self.core.flush()
        if self.transport.closed:  # the program closed the transport under the member
            self.stop()
            return
        self.send(out, f"FT group {self.group}")
        for event in events:
            if isinstance(event, FtAction):
                self.queue.push(Event(self, event))  # type: ignore[arg-type]
            else:
                self.present(event)


class FtMonitor(CoreDriver):
    """A passive monitor of group ``group``: ``callback(monitor, group, active_count)`` each
    time the number of active members changes; a member unheard for ``lost_interval`` (the
    group's activation interval) no longer counts."""

    def __init__(self, transport: _BaseTransport, group: str, callback: MonitorCallback, *,
                 lost_interval: float, queue: Queue | None = None) -> None:
        self.core = FtMonitorCore(group, lost_interval=lost_interval)
        super().__init__(transport, f"ft:{group}", "fault tolerance")
        self.group = group
        self.user_callback = callback
        self.queue = queue if queue is not None else transport.default_listener_queue
        self.bus_listen(self.core.subject)

    def callback(self, count: Any, _: object) -> None:
        self.user_callback(self, self.group, count)

    @property
    def active_count(self) -> int:
        count: int = self.core.active_count
        return count

    def destroy(self) -> None:
        if not self.active:
            return
        self.host.soon(self.stop)
        self.queue.purge(self)

    def flush(self) -> None:
        for count in self.core.flush():
            self.queue.push(Event(self, count))  # type: ignore[arg-type]
