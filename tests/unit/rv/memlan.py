"""An in-memory network for the RV-style engine, on a virtual clock.

:class:`MemLan` connects several :class:`Engine` objects. What an engine sends to
``MULTICAST`` reaches every other engine attached to the LAN (and, with ``loop=True``, the
sender too, as ``IP_MULTICAST_LOOP`` does); what it sends to ``(ip, port)`` reaches that
engine. Every datagram can be lost (``loss``, with bursts: after a loss the next packet is
lost too with probability ``burst``), duplicated (``dup``), delayed (``delay`` plus a random
``jitter``, which also reorders). ``partition(node)`` cuts a node off both ways. All
randomness comes from one seeded ``random.Random``; the clock only moves in :meth:`run`,
straight to the next packet arrival or engine deadline, so the tests never sleep.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable

from transports.rv.engine import Advisory, Delivered, Engine, Event
from transports.rv.events import MULTICAST


class Node:
    def __init__(self, lan: MemLan, engine: Engine) -> None:
        self.lan = lan
        self.engine = engine
        self.events: list[Event] = []
        self.partitioned = False
        self.loss: float | None = None  # overrides the LAN's loss for packets to this node

    @property
    def delivered(self) -> list[Delivered]:
        return [e for e in self.events if isinstance(e, Delivered)]

    def payloads_from(self, sender: Node, ptp: bool = False) -> list[bytes]:
        return [e.payload for e in self.delivered
                if e.sender == sender.engine.sender and e.ptp == ptp]

    def advisories(self, subject: str) -> list[Advisory]:
        return [e for e in self.events if isinstance(e, Advisory) and e.subject == subject]

    def lost(self, subject: str) -> int:
        return sum(int(a.fields["lost"]) for a in self.advisories(subject))


class MemLan:
    def __init__(self, seed: int = 1, *, loss: float = 0.0, burst: float = 0.0,
                 dup: float = 0.0, delay: float = 0.001, jitter: float = 0.0,
                 loop: bool = True) -> None:
        self.rng = random.Random(seed)
        self.loss = loss
        self.burst = burst
        self.dup = dup
        self.delay = delay
        self.jitter = jitter
        self.loop = loop
        self.now = 0.0
        self.nodes: list[Node] = []
        self.by_addr: dict[tuple[str, int], Node] = {}
        self._queue: list[tuple[float, int, Node, bytes, tuple[str, int]]] = []
        self._n = 0
        self._last_lost = False
        self.sent: list[tuple[Node, bytes, tuple[str, int] | None]] = []  # every datagram
        self.record = False

    def add(self, ip: str = "10.0.0.1", port: int | None = None, **kw: object) -> Node:
        port = port if port is not None else 40000 + len(self.nodes)
        kw.setdefault("rng", random.Random(self.rng.random()))
        kw.setdefault("service", 7500)
        engine = Engine(ip=ip, port=port, **kw)  # type: ignore[arg-type]
        node = Node(self, engine)
        self.nodes.append(node)
        self.by_addr[(ip, port)] = node
        return node

    def remove(self, node: Node) -> None:
        self.nodes.remove(node)
        if self.by_addr.get((node.engine.ip, node.engine.port)) is node:
            del self.by_addr[(node.engine.ip, node.engine.port)]

    def _dropped(self, dest: Node) -> bool:
        loss = dest.loss if dest.loss is not None else self.loss
        if self._last_lost and self.rng.random() < self.burst:
            return True
        self._last_lost = self.rng.random() < loss
        return self._last_lost

    def _put(self, src: Node, dest: Node, data: bytes) -> None:
        if src.partitioned or dest.partitioned or self._dropped(dest):
            return
        copies = 2 if self.rng.random() < self.dup else 1
        for _ in range(copies):
            at = self.now + self.delay + self.rng.random() * self.jitter
            self._n += 1
            heapq.heappush(self._queue, (at, self._n, dest, data,
                                         (src.engine.ip, src.engine.port)))

    def flush(self) -> None:
        """Carry what every engine has to send, and collect their events."""
        for node in list(self.nodes):
            for data, dest in node.engine.datagrams_to_send():
                if self.record:
                    self.sent.append((node, data, dest))
                if dest is MULTICAST:
                    for other in self.nodes:
                        if other is not node or self.loop:
                            self._put(node, other, data)
                else:
                    target = self.by_addr.get(dest)
                    if target is not None:
                        self._put(node, target, data)
            node.events.extend(node.engine.events())

    def step(self, until: float) -> bool:
        """Move the clock to the next arrival or deadline (not past ``until``) and run it."""
        self.flush()
        t = until
        if self._queue:
            t = min(t, self._queue[0][0])
        for node in self.nodes:
            d = node.engine.next_deadline()
            if d is not None:
                t = min(t, d)
        self.now = max(self.now, t)
        while self._queue and self._queue[0][0] <= self.now:
            _, _, dest, data, addr = heapq.heappop(self._queue)
            if dest in self.nodes:
                dest.engine.receive_datagram(data, addr, self.now)
        for node in self.nodes:
            d = node.engine.next_deadline()
            if d is not None and d <= self.now:
                node.engine.tick(self.now)
        self.flush()
        return self.now < until

    def run(self, seconds: float) -> None:
        """Run the network for ``seconds`` of virtual time."""
        until = self.now + seconds
        while self.step(until):
            pass

    def run_until(self, cond: Callable[[], bool], timeout: float = 120.0) -> None:
        """Run until ``cond()`` holds; fail after ``timeout`` seconds of virtual time."""
        until = self.now + timeout
        while not cond():
            if not self.step(until):
                assert cond(), f"condition not met after {timeout} s of virtual time"
                return
