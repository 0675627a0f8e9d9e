"""The gateway itself as a member of a fault-tolerance group (``ft_group`` in gateway.conf).

Gateways that share one store directory -- a primary and its backups, as TIBCO EMS's
fault-tolerant server pairs share their store files (TIBCO EMS User's Guide, "Fault
Tolerance") -- join one group of the RV-style bus (:mod:`transports.rv.fttransport`) with an
active goal of 1. Only the active member runs: :func:`gateway.server.serve` waits for
:meth:`Standby.wait_active` before it opens the store and the listeners, and stops the
gateway, releasing them, when the group deactivates it (a heavier member took over). A
backup takes over about one activation interval after the active gateway's statuses stop
(it died, hung or lost the network); if the store's lock is still held then (the old one
is alive but cut off), it keeps trying until the lock is free. What the new active gateway
finds in the store is what a restart would: certified imports already in it are not
imported twice (``transports/README.md``, "Certified delivery (rv)").
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from transports.rv.ft import FtAction
from transports.rv.fttransport import FtMember
from transports.rv.transport import AsyncTransport

log = logging.getLogger("gateway")


class Standby:
    """This gateway's membership of its group; :func:`standby` opens it."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.group: str = settings.ft_group
        self.transport: AsyncTransport | None = None
        self.member: FtMember | None = None
        self.active = asyncio.Event()
        self.inactive = asyncio.Event()
        self.inactive.set()

    async def open(self) -> None:
        s = self.settings
        t = await AsyncTransport.open(s.ft_service, s.ft_network or None,
                                      description=f"gateway fault tolerance {self.group}")
        self.transport = t
        self.member = FtMember(t, self.group, self._on_action, weight=s.ft_weight,
                               active_goal=1, heartbeat=s.ft_heartbeat,
                               activation=s.ft_activation, queue=t.queue)
        log.info("fault tolerance: joined group %s (weight %d, activation %g s); standing by",
                 self.group, s.ft_weight, s.ft_activation)

    def _on_action(self, _member: FtMember, _group: str, action: FtAction) -> None:
        if action is FtAction.ACTIVATE:
            log.info("fault tolerance: group %s activates this gateway", self.group)
            self.inactive.clear()
            self.active.set()
        elif action is FtAction.DEACTIVATE:
            log.warning("fault tolerance: group %s deactivates this gateway", self.group)
            self.active.clear()
            self.inactive.set()

    async def wait_active(self, stop: asyncio.Event) -> bool:
        """Wait until the group activates this gateway (True) or ``stop`` is set (False)."""
        return await _first(self.active, stop)

    async def wait_inactive(self, stop: asyncio.Event) -> bool:
        """Wait until the group deactivates this gateway (True) or ``stop`` is set (False)."""
        return await _first(self.inactive, stop)

    async def close(self) -> None:
        if self.member is not None:
            self.member.destroy()  # the others know at once
            self.member = None
            await asyncio.sleep(0)  # (the LEAVE leaves with the loop's next turn)
        if self.transport is not None:
            await self.transport.close()
            self.transport = None


async def _first(event: asyncio.Event, stop: asyncio.Event) -> bool:
    if stop.is_set():
        return False
    if event.is_set():
        return True
    waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(stop.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    return event.is_set() and not stop.is_set()


async def standby(settings: Any) -> Standby:
    """Join the group named by ``settings.ft_group`` (gateway.conf's ``ft_*``)."""
    s = Standby(settings)
    await s.open()
    return s
