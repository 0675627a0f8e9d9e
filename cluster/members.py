"""Who is in the cluster, and how each node is doing: heartbeats over NATS.

Every node publishes a heartbeat every :data:`HEARTBEAT` seconds on ``gw.<cluster>.nodes.<id>``:
a small JSON object with its figures (connections, destinations, messages published,
memory) and its link's counters. Every node subscribes to ``gw.<cluster>.nodes.*`` and keeps
the last heartbeat of each; a node not heard from for :data:`MISSED` heartbeats is shown as
down (a node that stops says so at once with a last heartbeat). The admin API of any node
(``GET /api/v1/cluster``) and its ``/metrics`` show the whole cluster from this table, so
that a look at one node is a look at all, without a call to each.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

log = logging.getLogger("cluster")

HEARTBEAT = 1.0  # seconds between a node's heartbeats
MISSED = 3  # heartbeats missed before a node is shown as down


class Members:
    """The cluster's nodes as this node hears them (see the module docstring)."""

    def __init__(self, nc: NATS, cluster_name: str, node_id: str,
                 figures: Callable[[], dict[str, Any]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.nc = nc
        self.subject = f"gw.{cluster_name}.nodes."
        self.node_id = node_id
        self.figures = figures
        self.clock = clock
        self.nodes: dict[str, tuple[float, dict[str, Any]]] = {}  # id -> (heard at, beat)
        self.version = 0  # counts the changes of the nodes' covers and up-ness
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.nc.subscribe(self.subject + "*", cb=self._heard)
        self.task = asyncio.ensure_future(self._beat())

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass
        try:
            await self._publish(up=False)  # the others show this node down at once
        except Exception:  # noqa: BLE001 - the servers may be gone
            pass

    async def _beat(self) -> None:
        while True:
            try:
                await self._publish(up=True)
            except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
                log.debug("heartbeat not sent: %s", exc)
            await asyncio.sleep(HEARTBEAT)

    async def _publish(self, up: bool) -> None:
        beat = {"node_id": self.node_id, "up": up, **self.figures()}
        await self.nc.publish(self.subject + self.node_id, json.dumps(beat).encode())

    async def _heard(self, msg: Msg) -> None:
        try:
            beat = json.loads(msg.data)
            node = str(beat["node_id"])
        except (ValueError, KeyError, TypeError):
            log.warning("unreadable heartbeat on %s", msg.subject)
            return
        old = self.nodes.get(node)
        if old is None or (old[1].get("up"), old[1].get("cover")) != (beat.get("up"),
                                                                      beat.get("cover")):
            self.version += 1  # what remote_patterns says has changed
        self.nodes[node] = (self.clock(), beat)

    def remote_patterns(self) -> set[str]:
        """The patterns the other nodes that are up subscribe to in NATS, as their last
        heartbeats said (``>``, every topic, for a node whose heartbeat does not list them:
        it has too many)."""
        now = self.clock()
        out: set[str] = set()
        for heard, beat in self.nodes.values():
            if beat.get("up") and now - heard <= HEARTBEAT * MISSED:
                cover = beat.get("cover", ())
                if cover is None:
                    out.add(">")
                else:
                    out.update(str(p) for p in cover)
        return out

    def rows(self) -> list[dict[str, Any]]:
        """Every node heard of (this one included), by id: ``up`` and ``last_seen``
        (seconds ago) beside its figures."""
        now = self.clock()
        # this node's own heartbeats do not come back (the link's connection is no_echo)
        heard_of = {**self.nodes, self.node_id: (now, {"up": True, **self.figures()})}
        out = []
        for node, (heard, beat) in sorted(heard_of.items()):
            age = now - heard
            up = bool(beat.get("up")) and age <= HEARTBEAT * MISSED
            out.append({**beat, "node_id": node, "up": up, "last_seen": round(age, 3)})
        return out
