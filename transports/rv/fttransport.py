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

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from transports.rv.advisory import is_logged
from transports.rv.ft import FtAction, FtCore, FtMonitorCore
from transports.rv.message import Message
from transports.rv.queue import Event, Queue
from transports.rv.transport import Listener, TransportError, _BaseTransport

log = logging.getLogger("transports.rv")

ActionCallback = Callable[["FtMember", str, FtAction], object]
MonitorCallback = Callable[["FtMonitor", str, int], object]


class _Driver:
    """Runs a core (member or monitor) on the transport's loop: its bus listener, its timer,
    its output. Subclasses say what to do with the core's events."""

    def __init__(self, transport: _BaseTransport, subject: str, queue: Queue | None) -> None:
        host = transport.host
        if host is None:
            raise TransportError("fault tolerance needs a network transport")
        self.transport = transport
        self.host = host
        self.loop: asyncio.AbstractEventLoop = host.loop
        self.queue = queue if queue is not None else transport.default_listener_queue
        self.active = True  # (a queue runs only the events of an active listener)
        self._bus_queue = Queue(f"ft:{subject}")
        self._bus_queue.bind_loop(self.loop)
        self._timer: asyncio.TimerHandle | None = None
        self._bus = Listener(transport, subject, self._on_bus, queue=self._bus_queue)

    core: Any

    def _call(self, fn: Callable[[], object]) -> None:
        """``fn()`` on the loop, then a step of the core (its output, its timer)."""
        def run() -> None:
            fn()
            self._step()

        self.host.soon(run)

    def _on_bus(self, msg: Message, _: Listener) -> None:
        self.core.receive(msg, time.monotonic())
        self._step()

    def _tick(self) -> None:
        self._timer = None
        self.core.tick(time.monotonic())
        self._step()

    def _step(self) -> None:
        self._flush()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = self.core.next_deadline()
        if deadline is not None and self.active:
            self._timer = self.loop.call_later(max(0.0, deadline - time.monotonic()),
                                               self._tick)

    def _flush(self) -> None:
        raise NotImplementedError

    def _present(self, adv: Message) -> None:
        if not self.transport.present(adv) and is_logged(adv.send_subject or ""):
            log.warning("rv advisory %s", adv.to_text())

    def _stop(self) -> None:
        self.active = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._bus.destroy()
        self._bus_queue.destroy()


class FtMember(_Driver):
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
        self.group = group
        self.user_callback = callback
        super().__init__(transport, self.core.subject, queue)
        self._call(lambda: None)  # the first status, and the timer

    @property
    def is_active(self) -> bool:
        """Whether the group last told this member to be active."""
        return bool(self.core.active)

    def callback(self, action: Any, _: object) -> None:
        """Run by the queue: the program's callback."""
        self.user_callback(self, self.group, action)

    def set_weight(self, weight: int) -> None:
        self._call(lambda: self.core.set_weight(weight, time.monotonic()))

    def disable(self, reason: str = "") -> None:
        """Report a resource error: deactivate, weight 0 (``DISABLING_MEMBER``)."""
        self._call(lambda: self.core.disable(time.monotonic(), reason))

    def destroy(self) -> None:
        """Withdraw from the group (the others know at once)."""
        if not self.active:
            return

        def leave() -> None:
            self.core.withdraw()
            self._flush()
            self._stop()

        self.host.soon(leave)
        self.queue.purge(self)

    def _flush(self) -> None:
        out, events = self.core.flush()
        if self.transport.closed:  # the program closed the transport under the member
            self._stop()
            return
        for msg in out:
            try:
                self.transport._send(msg, internal=True)
            except Exception as exc:  # noqa: BLE001 - a status lost is sent again next beat
                log.error("FT group %s: cannot send a status: %s", self.group, exc)
        for event in events:
            if isinstance(event, FtAction):
                self.queue.push(Event(self, event))  # type: ignore[arg-type]
            else:
                self._present(event)


class FtMonitor(_Driver):
    """A passive monitor of group ``group``: ``callback(monitor, group, active_count)`` each
    time the number of active members changes; a member unheard for ``lost_interval`` (the
    group's activation interval) no longer counts."""

    def __init__(self, transport: _BaseTransport, group: str, callback: MonitorCallback, *,
                 lost_interval: float, queue: Queue | None = None) -> None:
        self.core = FtMonitorCore(group, lost_interval=lost_interval)
        self.group = group
        self.user_callback = callback
        super().__init__(transport, self.core.subject, queue)

    def callback(self, count: Any, _: object) -> None:
        self.user_callback(self, self.group, count)

    @property
    def active_count(self) -> int:
        count: int = self.core.active_count
        return count

    def destroy(self) -> None:
        if not self.active:
            return
        self.host.soon(self._stop)
        self.queue.purge(self)

    def _flush(self) -> None:
        for count in self.core.flush():
            self.queue.push(Event(self, count))  # type: ignore[arg-type]
