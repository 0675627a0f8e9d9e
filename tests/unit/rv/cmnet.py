"""An in-memory bus for certified-delivery cores, on a virtual clock.

:class:`CmNet` connects :class:`~transports.rv.cm.CmCore` objects the way the bus would:
what a core sends goes, encoded and decoded again (so the label and every control field
cross the wire format), to every *other* core that listens to its subject -- a control
message to the core(s) whose control subject it is, a data message to the cores with a
matching CM listener. Each delivery can be dropped by a rule (``drop``), or at random
(``loss``, from one seeded ``random.Random``). Certified deliveries are confirmed at once
unless the core's ``explicit`` flag is set. The clock moves only in :meth:`CmNet.run`, to
the next timer, so tests never sleep.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from transports.rv.cm import CONTROL_PREFIX, CmCore, CmDelivery
from transports.rv.codec import decode, encode
from transports.rv.ledger import Ledger
from transports.rv.message import Message
from transports.rv.subject import matches


@dataclass
class Peer:
    core: CmCore
    patterns: list[str] = field(default_factory=list)
    deliveries: list[CmDelivery] = field(default_factory=list)
    advisories: list[Message] = field(default_factory=list)
    explicit: bool = False
    down: bool = False  # crashed: hears nothing, sends nothing

    @property
    def name(self) -> str:
        return self.core.name

    def certified(self, subject: str | None = None) -> list[int]:
        return [d.seq for d in self.deliveries
                if d.certified and (subject is None or d.subject == subject)]

    def texts(self) -> list[str]:
        return [str(d.msg.get("n")) for d in self.deliveries]

    def adv(self, head: str) -> list[Message]:
        return [a for a in self.advisories if (a.send_subject or "").startswith(head)]


Drop = Callable[[Peer, Peer, Message], bool]


class CmNet:
    def __init__(self, seed: int = 1, *, loss: float = 0.0, now: float = 1000.0) -> None:
        self.rng = random.Random(seed)
        self.loss = loss
        self.now = now
        self.peers: list[Peer] = []
        self.drop: Drop | None = None
        self.wire: list[tuple[str, str, Message]] = []  # (from, to, message) as sent

    def add(self, name: str | None = None, ledger: Ledger | None = None, *,
            listen: tuple[str, ...] = (), explicit: bool = False, **kw: object) -> Peer:
        kw.setdefault("rng", random.Random(self.rng.random()))
        core = CmCore(name, ledger, now=self.now, **kw)  # type: ignore[arg-type]
        peer = Peer(core, explicit=explicit)
        self.peers.append(peer)
        for pattern in listen:
            peer.patterns.append(pattern)
            core.listen(pattern, self.now)
        return peer

    def crash(self, peer: Peer) -> None:
        """The process dies: what it has not flushed is lost; its ledger is closed as the OS
        would release it (nothing more is written)."""
        peer.down = True
        self.peers.remove(peer)
        ledger = peer.core.ledger
        # Unwritten changes die with it.
        ledger._ops, ledger._seqs, ledger._fresh = [], {}, {}  # type: ignore[attr-defined]
        ledger.close()

    def send(self, peer: Peer, subject: str, n: int, time_limit: float | None = None) -> int:
        msg = Message(subject).add("n", n)
        return peer.core.send(msg, self.now, time_limit)

    def _receivers(self, sender: Peer, msg: Message) -> list[Peer]:
        subject = msg.send_subject or ""
        if subject.startswith(CONTROL_PREFIX):
            return [p for p in self.peers if p.core.control_subject == subject and p is not sender]
        return [p for p in self.peers if p is not sender
                and any(matches(pat, subject) for pat in p.patterns)]

    def step(self) -> bool:
        """One turn of every core: flush, deliver what it sent. True if anything moved."""
        moved = False
        for peer in list(self.peers):
            if peer.down:
                continue
            out, events = peer.core.flush()
            for event in events:
                if isinstance(event, CmDelivery):
                    peer.deliveries.append(event)
                    if event.certified and not peer.explicit:
                        peer.core.confirm(event.sender or "", event.subject, event.seq)
                else:
                    peer.advisories.append(event.message())
                moved = True
            for msg in out:
                data = encode(msg)
                for to in self._receivers(peer, msg):
                    self.wire.append((peer.name, to.name, msg))
                    if self.drop is not None and self.drop(peer, to, msg):
                        continue
                    if self.loss and self.rng.random() < self.loss:
                        continue
                    to.core.receive(decode(data), self.now)
                moved = True
        return moved

    def run(self, until: float | None = None, *, max_steps: int = 100_000) -> None:
        """Run turns until nothing moves, then jump the clock to the next timer, up to
        ``until`` (default: until no timer is left)."""
        for _ in range(max_steps):
            if self.step():
                continue
            deadlines = [d for p in self.peers if (d := p.core.next_deadline()) is not None]
            if not deadlines:
                return
            nxt = max(min(deadlines), self.now)
            if until is not None and nxt > until:
                self.now = until
                return
            self.now = nxt
            for peer in self.peers:
                peer.core.tick(self.now)
        raise AssertionError("the network did not settle")

    def settle(self) -> None:
        """Run turns (no clock movement) until nothing moves."""
        while self.step():
            pass
