"""Routing between buses, after the Rendezvous routing daemon (rvrd): :class:`RouterCore`
(sans-I/O) and :class:`Router` (it, driven over real transports on an asyncio loop).

How this works. A router attaches to two or more buses, each named by a *network name*
unique across the routed network (TIBCO Rendezvous Administration, "Routing Daemon
(rvrd)": a router's local network names). It relays a subject from one bus to another only
while a program on the far side listens to it, as rvrd forwards on demand (TIBCO
Rendezvous Concepts, "Rendezvous Routing Daemon", and Administration, "Subject
Interest"), and never loops nor duplicates, whatever the shape of the links.

* **Interest.** On each of its buses a router learns which subjects programs listen to from
  the bus's own ``_RV.INFO.SYSTEM.LISTEN.START.<subject>`` / ``LISTEN.STOP.<subject>``
  (``id``: the transport, ``sub``: the subject) and ``UNREACHABLE.TRANSPORT.<id>``
  advisories, and when it starts it multicasts ``_RV.INFO.SYSTEM.LISTEN.QUERY``, which every
  engine answers with LISTEN.START for each subject its transports listen to. A router's
  own transports announce nothing (``routing=True``), so routers never take each other's
  listeners for interest and interest cannot sustain itself around a cycle.
* **Link state.** Every ``interval`` (1 s), and at once after a change, each router
  multicasts its *state* on every bus it attaches to, on ``_RVRD.STATE``: its name, an
  incarnation and a sequence number, the network names of its buses, and the subjects
  listened to on each (its ``forward`` subjects count as listened to on all of its buses).
  A router re-sends each newer state of another router on its other buses (newer: a higher
  ``(incarnation, sequence)``; so each state crosses each link once) and forgets a router
  whose state was not refreshed for ``4 × interval``. Every router so knows the whole graph
  -- the buses are its nodes, each router an edge between every two of its buses -- and all
  interest (the routing daemons' global routing table, in Administration's words).
* **Trees.** The first router to pick a message up from a program stamps its envelope with
  the network name of that bus and a hop count (:class:`~transports.rv.message.Route`).
  Every router computes, from the same graph, the same shortest-path tree rooted at the
  message's origin network: breadth first, each bus's parent edge the smallest
  ``(router name, parent bus name)`` among those one level closer. A router forwards a
  message that arrived on bus P to bus Q only if (P, itself, Q) is an edge of that tree and
  some bus in the subtree under Q listens to a matching subject. A tree reaches each bus
  once, so each bus gets a message once: two redundant routers between the same buses, or
  a triangle of links, give no duplicate and no loop; when a router dies the others drop
  its edges and the tree runs through the survivors. A message past ``hop_limit`` routers
  (16) is dropped as a last safety, for the moments when routers' views of the graph differ
  (after a change, until states have spread: a message may then be lost or doubled).
* **Local echo.** What a router sends on bus Q also reaches its own listener on Q (the
  engine's local fan-out). That is harmless: if the router forwarded P to Q, Q is one level
  below P in the tree, and every bus this router attaches to is at most that deep, so no
  edge of the tree leaves Q through this router.
* **What never crosses**: ``_LOCAL.`` (it never leaves a process), ``_RV.`` (advisories:
  DATALOSS is not reported across routers, TIBCO Rendezvous Concepts, Appendix A,
  DATALOSS), the routers' own ``_RVRD.``; other ``_`` subjects (``_RVCM.>``, ``_RVFT.>``:
  certified delivery and fault tolerance control, which have no LISTEN advisories) cross
  only when they match the ``forward`` list, as rvrd forwards them only when configured.
* **Inboxes.** A message whose reply subject is an inbox (``_INBOX.``: point to point to the
  engine that made it) leaves with the reply subject rewritten to a *surrogate* inbox the
  router makes on the destination bus; what reaches the surrogate goes point to point to the
  original inbox on the bus it came from (its own reply subject rewritten the same way), so
  request/reply works across any number of routers. One surrogate serves one original inbox
  (several requests share it); the table holds at most ``max_inboxes`` (LRU) and forgets a
  surrogate unused for ``inbox_ttl`` seconds. Inbox messages need no interest.

:class:`RouterCore` takes messages and the time and returns what to send; it opens nothing
and reads no clock. :class:`Router` opens one transport per bus on an engine of its own
(``private_engine=True``: two networks on one service, which the engine registry refuses to
programs; TIBCO Rendezvous Concepts, Transports, "Service Parameter"), listens to ``>`` on
each (every message of the bus is decoded and offered to the core), and runs the core's
timer. :func:`start_routers` runs the routers of the gateway's ``routers.conf``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from transports.rv.advisory import (
    LISTEN_QUERY,
    LISTEN_START,
    LISTEN_STOP,
    UNREACHABLE_TRANSPORT,
)
from transports.rv.events import MessageTooLarge
from transports.rv.message import FieldError, Message, Route, RvType
from transports.rv.subject import SubjectError, SubjectMatcher, validate_listen_subject

log = logging.getLogger("transports.rv.router")

STATE_SUBJECT = "_RVRD.STATE"
"""Where routers multicast their state (module docstring)."""
CONTROL_PREFIX = "_RVRD."
#: Seconds between two states of a router (rvrd's neighbours exchange theirs every few seconds).
DEFAULT_INTERVAL = 1.0
#: A router whose state was not refreshed for this many intervals is gone.
DEAD_INTERVALS = 4.0
#: Routers a message may cross; past it, it is dropped (the last guard against loops).
DEFAULT_HOP_LIMIT = 16
#: Seconds a surrogate inbox lives unused, and how many the table holds.
DEFAULT_INBOX_TTL = 600.0
DEFAULT_MAX_INBOXES = 10_000
# Seconds between two LISTEN.QUERY on each bus: what a listener killed without
# UNREACHABLE.TRANSPORT left behind is forgotten when the next answers do not repeat it.
DEFAULT_REQUERY = 60.0
_DECISIONS_MAX = 4096  # cached forwarding decisions (origin, bus, subject)
_NEVER = ("_RV.", "_LOCAL.", CONTROL_PREFIX)
MAX_NETWORK_NAME = 127  # bytes: it travels in the envelope and as a field value

Output = tuple[str, Message]
"""A message to send on a bus (by network name)."""


def check_network_name(name: str) -> str:
    """A bus's network name: 1..127 UTF-8 bytes, no NUL, no blank at either end."""
    if not isinstance(name, str) or not name or name != name.strip() or "\0" in name \
            or len(name.encode()) > MAX_NETWORK_NAME:
        raise ValueError(f"network name {name!r}: 1..{MAX_NETWORK_NAME} bytes, no NUL, "
                         "no blank at either end")
    return name


def check_forward_subject(subject: str) -> str:
    """A ``forward`` subject: a listen subject that is not ``_RV.``, ``_LOCAL.``, ``_RVRD.``
    or an inbox (those never cross, or cross by surrogates)."""
    validate_listen_subject(subject)
    if subject.startswith((*_NEVER, "_INBOX.")):
        raise SubjectError(f"{subject!r} is never forwarded by a router")
    return subject


@dataclass(slots=True)
class RouterState:
    """What a router announced: its buses and the interest seen on each."""

    name: str
    incarnation: int
    seq: int
    buses: tuple[str, ...]
    interest: dict[str, frozenset[str]]
    heard: float = 0.0


@dataclass(slots=True)
class RouterStats:
    forwarded: int = 0
    inbox_forwarded: int = 0
    hop_limit_dropped: int = 0
    unknown_inbox: int = 0
    states_received: int = 0
    states_relayed: int = 0


@dataclass(slots=True)
class _Surrogate:
    bus: str  # where the surrogate inbox is
    target_bus: str  # where the original inbox is
    target: str  # the original inbox
    used: float


@dataclass(slots=True)
class _Tree:
    parent: dict[str, tuple[str, str]]  # bus -> (parent bus, router)
    children: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # -> (router, bus)


def state_message(state: RouterState) -> Message:
    """``_RVRD.STATE``: ``router``, ``incarnation`` U64, ``seq`` U64, ``buses`` STRINGARRAY,
    ``interest`` MSGARRAY of ``{bus, subjects STRINGARRAY}``."""
    m = Message(STATE_SUBJECT)
    m.add("router", state.name, RvType.STRING)
    m.add("incarnation", state.incarnation, RvType.U64)
    m.add("seq", state.seq, RvType.U64)
    m.add("buses", list(state.buses), RvType.STRINGARRAY)
    subs = [Message().add("bus", bus, RvType.STRING)
            .add("subjects", sorted(state.interest.get(bus, ())), RvType.STRINGARRAY)
            for bus in state.buses]
    m.add("interest", subs, RvType.MSGARRAY)
    return m


def parse_state(msg: Message) -> RouterState | None:
    """The state in a ``_RVRD.STATE`` message; ``None`` if it is not one."""
    try:
        name = msg.get("router")
        inc = msg.get("incarnation")
        seq = msg.get("seq")
        buses = msg.get("buses")
        interest_list = msg.get("interest", [])
        if not (isinstance(name, str) and name and isinstance(inc, int)
                and isinstance(seq, int) and isinstance(buses, list) and buses
                and all(isinstance(b, str) and b for b in buses)
                and isinstance(interest_list, list)):
            return None
        interest: dict[str, frozenset[str]] = {}
        for sub in interest_list:
            if not isinstance(sub, Message):
                return None
            bus = sub.get("bus")
            subjects = sub.get("subjects", [])
            if bus not in buses or not isinstance(subjects, list):
                return None
            good = []
            for s in subjects:
                if isinstance(s, str):
                    try:
                        validate_listen_subject(s)
                    except SubjectError:
                        continue
                    good.append(s)
            interest[bus] = frozenset(good)
    except (KeyError, FieldError, TypeError):
        return None
    return RouterState(name, inc, seq, tuple(dict.fromkeys(buses)), interest)


class RouterCore:
    """The routing decisions of one router, sans-I/O (module docstring).

    ``buses``: the network names of the buses it links (two or more); ``forward``: subjects
    treated as listened to on all of them (``_`` subjects cross only through it);
    ``create_inbox(bus)`` returns a new inbox of the router's transport on ``bus`` and
    ``drop_inbox(bus, name)`` forgets one. Feed it :meth:`start`, :meth:`receive` for every
    message a bus delivers to the router, and :meth:`tick` at :meth:`next_deadline`; each
    returns ``(bus, message)`` pairs to send.
    """

    def __init__(self, name: str, buses: Iterable[str], *,
                 create_inbox: Callable[[str], str],
                 drop_inbox: Callable[[str, str], None] | None = None,
                 forward: Iterable[str] = (), incarnation: int = 0,
                 interval: float = DEFAULT_INTERVAL, hop_limit: int = DEFAULT_HOP_LIMIT,
                 inbox_ttl: float = DEFAULT_INBOX_TTL,
                 max_inboxes: int = DEFAULT_MAX_INBOXES,
                 requery: float = DEFAULT_REQUERY) -> None:
        if not name or not isinstance(name, str):
            raise ValueError("a router needs a name")
        self.name = name
        self.buses = tuple(dict.fromkeys(check_network_name(b) for b in buses))
        if len(self.buses) < 2:
            raise ValueError("a router links two or more buses")
        if not 0 < interval:
            raise ValueError("interval must be > 0")
        if not 1 <= hop_limit <= 255:
            raise ValueError("hop_limit must be 1..255")
        self.forward = tuple(check_forward_subject(s) for s in forward)
        self._forward_matcher = SubjectMatcher()
        for s in self.forward:
            self._forward_matcher.add(s, s)
        self.create_inbox = create_inbox
        self.drop_inbox = drop_inbox
        self.incarnation = incarnation
        self.seq = 0
        self.interval = interval
        self.dead_after = interval * DEAD_INTERVALS
        self.hop_limit = hop_limit
        self.inbox_ttl = inbox_ttl
        self.max_inboxes = max_inboxes
        self.stats = RouterStats()
        # interest seen on our buses: bus -> transport id -> subjects
        self.listens: dict[str, dict[str, set[str]]] = {b: {} for b in self.buses}
        if requery < 0:
            raise ValueError("requery must be >= 0")
        self.requery = requery
        self._announced: dict[tuple[str, str, str], float] = {}  # (bus, id, subject) -> when
        self._next_query = float("inf")
        self._query_at = 0.0  # the last LISTEN.QUERY; 0: none to sweep after
        self.others: dict[str, RouterState] = {}
        self._next_state = 0.0
        self._dirty = True
        self._started = False
        self._surrogates: OrderedDict[str, _Surrogate] = OrderedDict()
        self._by_target: dict[tuple[str, str, str], str] = {}
        self._trees: dict[str, _Tree] = {}
        self._matchers: dict[str, SubjectMatcher] | None = None
        self._decisions: dict[tuple[str, str, str], tuple[str, ...]] = {}
        self._warned_names: set[tuple[str, int]] = set()

    # -- the graph ---------------------------------------------------------------------

    def own_state(self) -> RouterState:
        interest = {}
        for bus in self.buses:
            subjects = set(self.forward)
            for subs in self.listens[bus].values():
                subjects |= subs
            interest[bus] = frozenset(subjects)
        return RouterState(self.name, self.incarnation, self.seq, self.buses, interest)

    def routers(self) -> list[RouterState]:
        """Every live router's state, this one's first."""
        return [self.own_state(), *self.others.values()]

    def _changed(self) -> None:
        self._trees.clear()
        self._matchers = None
        self._decisions.clear()

    def _interest_changed(self) -> None:
        self._changed()
        self._dirty = True

    def _adjacency(self) -> dict[str, list[tuple[str, str]]]:
        adj: dict[str, list[tuple[str, str]]] = {}
        for state in self.routers():
            for bus in state.buses:
                edges = adj.setdefault(bus, [])
                edges.extend((state.name, other) for other in state.buses if other != bus)
        return adj

    def tree(self, origin: str) -> _Tree:
        """The shortest-path tree rooted at ``origin``, the same in every router that has
        the same graph: breadth first, a bus's parent edge the smallest (router, parent)."""
        tree = self._trees.get(origin)
        if tree is not None:
            return tree
        adj = self._adjacency()
        tree = _Tree({})
        seen = {origin}
        level = [origin]
        while level:
            best: dict[str, tuple[str, str]] = {}
            for bus in level:
                for router, other in adj.get(bus, ()):
                    if other in seen:
                        continue
                    cand = (router, bus)
                    if other not in best or cand < best[other]:
                        best[other] = cand
            for other, (router, bus) in best.items():
                tree.parent[other] = (bus, router)
                tree.children.setdefault(bus, []).append((router, other))
                seen.add(other)
            level = sorted(best)
        self._trees[origin] = tree
        return tree

    def _interest_matchers(self) -> dict[str, SubjectMatcher]:
        matchers = self._matchers
        if matchers is None:
            matchers = {}
            for state in self.routers():
                for bus, subjects in state.interest.items():
                    m = matchers.get(bus)
                    if m is None:
                        m = matchers[bus] = SubjectMatcher()
                    for s in subjects:
                        m.add(s, s)
            self._matchers = matchers
        return matchers

    def destinations(self, origin: str, bus: str, subject: str) -> tuple[str, ...]:
        """The buses this router forwards ``subject`` to, from ``bus``, for ``origin``."""
        key = (origin, bus, subject)
        found = self._decisions.get(key)
        if found is not None:
            return found
        tree = self.tree(origin)
        out: list[str] = []
        if bus == origin or bus in tree.parent:
            matchers = self._interest_matchers()
            for router, child in tree.children.get(bus, ()):
                if router == self.name and self._subtree_listens(tree, child, subject,
                                                                 matchers):
                    out.append(child)
        result = tuple(out)
        if len(self._decisions) >= _DECISIONS_MAX:
            self._decisions.clear()
        self._decisions[key] = result
        return result

    @staticmethod
    def _subtree_listens(tree: _Tree, top: str, subject: str,
                         matchers: dict[str, SubjectMatcher]) -> bool:
        stack = [top]
        while stack:
            bus = stack.pop()
            m = matchers.get(bus)
            if m is not None and m.match(subject):
                return True
            stack.extend(child for _, child in tree.children.get(bus, ()))
        return False

    # -- input -------------------------------------------------------------------------

    def start(self, now: float) -> list[Output]:
        """Ask every bus for its listeners (LISTEN.QUERY) and announce this router."""
        self._started = True
        out: list[Output] = [(bus, Message(LISTEN_QUERY)) for bus in self.buses]
        if self.requery:
            self._next_query = now + self.requery
        out += self._announce(now)
        return out

    def receive(self, bus: str, msg: Message, now: float) -> list[Output]:
        """A message the router's transport on ``bus`` received; what to send."""
        subject = msg.send_subject
        if not subject or bus not in self.listens:
            return []
        if subject[0] == "_":
            if subject.startswith("_INBOX."):
                return self._from_surrogate(bus, subject, msg, now)
            if subject.startswith("_RV."):
                self._advisory(bus, subject, msg, now)
                return []
            if subject.startswith(CONTROL_PREFIX):
                return self._control(bus, subject, msg, now)
            if subject.startswith("_LOCAL.") or not self._forward_matcher.match(subject):
                return []
        route = msg.route
        if route is None:
            origin, hops = bus, 0
        else:
            origin, hops = route
        targets = self.destinations(origin, bus, subject)
        if not targets:
            return []
        if hops >= self.hop_limit:
            self.stats.hop_limit_dropped += 1
            return []
        out: list[Output] = []
        for target in targets:
            out.append((target, self._relayed(msg, subject, bus, target,
                                               Route(origin, hops + 1), now)))
        self.stats.forwarded += len(out)
        return out

    def _relayed(self, msg: Message, subject: str, from_bus: str, to_bus: str, route: Route,
                 now: float) -> Message:
        reply = msg.reply_subject
        if reply is not None and reply.startswith("_INBOX."):
            reply = self._surrogate_for(from_bus, reply, to_bus, now)
        m = Message(subject, reply)
        m.fields = msg.fields  # shared, never changed: each copy is encoded as it is sent
        m.encoding = msg.encoding
        m.cm = msg.cm
        m.origin = msg.origin
        m.route = route
        return m

    def _surrogate_for(self, target_bus: str, target: str, bus: str, now: float) -> str:
        key = (target_bus, target, bus)
        name = self._by_target.get(key)
        if name is not None:
            entry = self._surrogates[name]
            entry.used = now
            self._surrogates.move_to_end(name)
            return name
        name = self.create_inbox(bus)
        self._surrogates[name] = _Surrogate(bus, target_bus, target, now)
        self._by_target[key] = name
        while len(self._surrogates) > self.max_inboxes:
            self._forget_oldest()
        return name

    def _forget_oldest(self) -> None:
        name, entry = self._surrogates.popitem(last=False)
        self._by_target.pop((entry.target_bus, entry.target, entry.bus), None)
        if self.drop_inbox is not None:
            self.drop_inbox(entry.bus, name)

    def surrogates(self) -> int:
        """How many surrogate inboxes the router holds."""
        return len(self._surrogates)

    def _from_surrogate(self, bus: str, subject: str, msg: Message,
                        now: float) -> list[Output]:
        entry = self._surrogates.get(subject)
        if entry is None or entry.bus != bus:
            self.stats.unknown_inbox += 1
            return []
        entry.used = now
        self._surrogates.move_to_end(subject)
        route = msg.route
        hops = 0 if route is None else route.hops
        if hops >= self.hop_limit:
            self.stats.hop_limit_dropped += 1
            return []
        origin = bus if route is None else route.network
        self.stats.inbox_forwarded += 1
        return [(entry.target_bus, self._relayed(msg, entry.target, bus, entry.target_bus,
                                                 Route(origin, hops + 1), now))]

    def _advisory(self, bus: str, subject: str, msg: Message, now: float) -> None:
        listens = self.listens[bus]
        tid = msg.get("id")
        if not isinstance(tid, str):
            return
        if subject.startswith(LISTEN_START):
            sub = msg.get("sub")
            if not isinstance(sub, str):
                return
            try:
                validate_listen_subject(sub)
            except SubjectError:
                return
            subs = listens.setdefault(tid, set())
            self._announced[(bus, tid, sub)] = now
            if sub not in subs:
                subs.add(sub)
                self._interest_changed()
        elif subject.startswith(LISTEN_STOP):
            sub = msg.get("sub")
            known = listens.get(tid)
            if known is not None and sub in known:
                known.discard(sub)
                self._announced.pop((bus, tid, sub), None)
                if not known:
                    del listens[tid]
                self._interest_changed()
        elif subject.startswith(UNREACHABLE_TRANSPORT):
            gone = listens.pop(tid, None)
            if gone is not None:
                for sub in gone:
                    self._announced.pop((bus, tid, sub), None)
                self._interest_changed()

    def _query(self, now: float) -> list[Output]:
        """LISTEN.QUERY on every bus again; one interval later, what no answer repeated is
        forgotten (its transport died without UNREACHABLE.TRANSPORT)."""
        self._next_query = now + self.requery
        self._query_at = now
        return [(bus, Message(LISTEN_QUERY)) for bus in self.buses]

    def _sweep(self) -> None:
        since, self._query_at = self._query_at, 0.0
        stale = [key for key, when in self._announced.items() if when < since]
        for bus, tid, sub in stale:
            del self._announced[(bus, tid, sub)]
            subs = self.listens[bus].get(tid)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self.listens[bus][tid]
        if stale:
            log.info("router %s: %d subjects no longer listened to (no answer to the query)",
                     self.name, len(stale))
            self._interest_changed()

    def _control(self, bus: str, subject: str, msg: Message, now: float) -> list[Output]:
        if subject != STATE_SUBJECT:
            return []
        state = parse_state(msg)
        if state is None:
            return []
        if state.name == self.name:
            if state.incarnation != self.incarnation and \
                    (state.name, state.incarnation) not in self._warned_names:
                self._warned_names.add((state.name, state.incarnation))
                log.warning("router %s: another router uses this name (on %s)",
                            self.name, bus)
            return []
        known = self.others.get(state.name)
        if known is not None and (state.incarnation, state.seq) <= (known.incarnation,
                                                                     known.seq):
            return []
        self.stats.states_received += 1
        state.heard = now
        self.others[state.name] = state
        if known is None or known.incarnation != state.incarnation:
            log.info("router %s: heard router %s linking %s", self.name, state.name,
                     ", ".join(state.buses))
        if known is None or known.buses != state.buses or known.interest != state.interest:
            self._changed()
        out: list[Output] = [(b, msg) for b in self.buses if b != bus]
        self.stats.states_relayed += len(out)
        return out

    # -- time --------------------------------------------------------------------------

    def _announce(self, now: float) -> list[Output]:
        self.seq += 1
        self._dirty = False
        self._next_state = now + self.interval
        state = state_message(self.own_state())
        return [(bus, state) for bus in self.buses]

    def tick(self, now: float) -> list[Output]:
        """Forget silent routers and unused surrogates; announce the state when due."""
        gone = [n for n, s in self.others.items() if now - s.heard > self.dead_after]
        for n in gone:
            log.info("router %s: router %s is gone", self.name, n)
            del self.others[n]
        if gone:
            self._changed()
        while self._surrogates:
            name, entry = next(iter(self._surrogates.items()))
            if now - entry.used <= self.inbox_ttl:
                break
            self._forget_oldest()
        out: list[Output] = []
        if self._query_at and now >= self._query_at + self.interval:
            self._sweep()
        if self._started and now >= self._next_query:
            out += self._query(now)
        if self._started and (self._dirty or now >= self._next_state):
            out += self._announce(now)
        return out

    def next_deadline(self) -> float:
        """When :meth:`tick` has something to do (0 when it has at once)."""
        if self._dirty and self._started:
            return 0.0
        deadline = min(self._next_state, self._next_query)
        if self._query_at:
            deadline = min(deadline, self._query_at + self.interval)
        for s in self.others.values():
            deadline = min(deadline, s.heard + self.dead_after)
        if self._surrogates:
            entry = next(iter(self._surrogates.values()))
            deadline = min(deadline, entry.used + self.inbox_ttl)
        return deadline


# -- the driver ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BusSpec:
    """Where a router's bus is: the transport parameters (TIBCO Rendezvous Concepts,
    Transports, Network Transport Parameters)."""

    service: str | int | None
    network: str
    daemon: str | int | None = None


class Router:
    """A router over real transports, on the running asyncio loop.

    ``buses`` maps each network name to ``(service, network)`` (or a :class:`BusSpec`);
    the other arguments are :class:`RouterCore`'s, and ``ttl`` the multicast TTL.
    ``await router.start()``, ``await router.close()``.
    """

    def __init__(self, name: str, buses: Mapping[str, BusSpec | Sequence[Any]], *,
                 forward: Iterable[str] = (), interval: float = DEFAULT_INTERVAL,
                 hop_limit: int = DEFAULT_HOP_LIMIT, inbox_ttl: float = DEFAULT_INBOX_TTL,
                 max_inboxes: int = DEFAULT_MAX_INBOXES, ttl: int = 1,
                 requery: float = DEFAULT_REQUERY) -> None:
        self.specs = {bus: spec if isinstance(spec, BusSpec) else BusSpec(*spec)
                      for bus, spec in buses.items()}
        self.ttl = ttl
        self.transports: dict[str, Any] = {}
        self.core = RouterCore(name, self.specs, create_inbox=self._create_inbox,
                               drop_inbox=self._drop_inbox, forward=forward,
                               incarnation=time.time_ns() // 1_000_000, interval=interval,
                               hop_limit=hop_limit, inbox_ttl=inbox_ttl,
                               max_inboxes=max_inboxes, requery=requery)
        self.name = name
        self.send_errors = 0
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def _create_inbox(self, bus: str) -> str:
        name: str = self.transports[bus].create_inbox()
        return name

    def _drop_inbox(self, bus: str, name: str) -> None:
        t = self.transports.get(bus)
        if t is not None:
            t._drop_inbox(name)

    async def start(self) -> None:
        """Open a transport on each bus (an engine of its own), listen, announce."""
        from transports.rv.transport import AsyncTransport, Listener

        self._loop = asyncio.get_running_loop()
        try:
            for bus, spec in self.specs.items():
                t = await AsyncTransport.open(
                    spec.service, spec.network, spec.daemon, ttl=self.ttl,
                    description=f"router {self.name} on {bus}", routing=True,
                    private_engine=True)
                self.transports[bus] = t
                Listener(t, ">", self._on_message, closure=bus)
        except BaseException:
            await self.close()
            raise
        self._send_all(self.core.start(self._loop.time()))
        self._schedule()
        log.info("router %s: linking %s", self.name, ", ".join(self.specs))

    def _on_message(self, msg: Message, listener: Any) -> None:
        if self._closed:
            return
        assert self._loop is not None
        subject = msg.send_subject
        if subject is not None and subject.startswith(("_RV.ERROR.", "_RV.WARN.")):
            log.warning("router %s: %s on %s: %s", self.name, subject, listener.closure,
                        msg.to_text())
        self._send_all(self.core.receive(listener.closure, msg, self._loop.time()))
        if self.core._dirty:
            self._schedule()

    def _send_all(self, outputs: list[Output]) -> None:
        for bus, msg in outputs:
            t = self.transports.get(bus)
            if t is None or t.closed:
                continue
            subject = msg.send_subject
            internal = subject is not None and subject[0] == "_" and \
                not subject.startswith("_INBOX.")
            try:
                t._send(msg, internal)
            except (SubjectError, FieldError, MessageTooLarge, RuntimeError) as exc:
                self.send_errors += 1
                log.warning("router %s: cannot send %s on %s: %s", self.name, subject, bus,
                            exc)

    def _schedule(self) -> None:
        if self._closed or self._loop is None:
            return
        if self._timer is not None:
            self._timer.cancel()
        when = max(self.core.next_deadline(), self._loop.time())
        self._timer = self._loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._closed:
            return
        assert self._loop is not None
        self._send_all(self.core.tick(self._loop.time()))
        self._schedule()

    async def close(self) -> None:
        """Stop routing and close the transports (their engines with them)."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        transports = list(self.transports.values())
        self.transports.clear()
        for t in transports:
            await t.close()


class RouterGroup:
    """The running routers of a gateway; ``await group.close()``."""

    def __init__(self, routers: list[Router]) -> None:
        self.routers = routers

    async def close(self) -> None:
        for r in self.routers:
            await r.close()
        self.routers = []


async def start_routers(defs: Iterable[Any]) -> RouterGroup:
    """Start a :class:`Router` per definition (``name``, ``buses``: network name ->
    ``(service, network)``, ``forward``, ``interval``, ``hop_limit``, ``ttl``); the gateway
    calls it by name for ``routers.conf``."""
    group = RouterGroup([])
    try:
        for d in defs:
            r = Router(d.name, d.buses, forward=d.forward, interval=d.interval,
                       hop_limit=d.hop_limit, ttl=d.ttl, requery=d.requery)
            await r.start()
            group.routers.append(r)
    except BaseException:
        await group.close()
        raise
    return group
