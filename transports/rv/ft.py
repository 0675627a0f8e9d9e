"""Fault tolerance on the RV-style bus: group membership and activation, sans I/O.

The model is TIBCO Rendezvous Concepts, Fault Tolerance Concepts: processes that offer the
same service join a *group*; the group keeps *active goal* of them active and the rest wait
as inactive backups; when an active member fails, the best-ranked inactive one takes over
within about one *activation interval*. A member's program is told what to do by *actions*:
``PREPARE_TO_ACTIVATE`` (a hint: activation may follow), ``ACTIVATE`` and ``DEACTIVATE``,
which it must obey.

:class:`FtCore` is one member; :class:`FtMonitorCore` a passive monitor (it counts the
active members and is not one). Like :mod:`transports.rv.cm` they read no clock and open no
socket: a driver (:mod:`transports.rv.fttransport`) feeds them the group's messages and the
time and sends what they produce.

The protocol is this bus's own (Rendezvous does not publish its wire protocol). Every member
multicasts a *status* on ``_RVFT.<group>`` at its heartbeat interval -- actives and
inactives alike, so that each member knows every other's weight and can rank them all -- and
at once when its state or weight changes; a member that withdraws sends ``LEAVE``. A status
has ``op`` = ``STATUS``, ``id`` (random, per member object), ``weight`` U32, ``active``
BOOL, ``goal`` U32, and in F64 seconds ``joining`` (what is left of its join wait, 0 when
over) and the intervals ``heartbeat``, ``preparation``, ``activation``.

The rules, with the sections of Fault Tolerance Concepts they follow:

* **Rank** ("Rank and Weight"): the members heard within the last activation interval and
  this one, ordered by weight, highest first; between equal weights an active member ranks
  before an inactive one (the status quo: an inactive member never pre-empts an active one
  of equal weight), then by id (an order of no meaning, the same at every member). Ranks 1
  to the active goal should be active. Weight 0 is for a member with resource errors: it
  activates only as a last resort.
* **Joining** ("New member"): a member starts inactive and waits one activation interval,
  hearing the others, before it may activate; its statuses say how long it still waits
  (``joining``), and a member deciding whether to activate does not wait for one still
  joining.
* **Activation**: a member that ranks within the goal and is inactive activates; an active
  member deactivates once as many better-ranked members as the goal are active (a heavier
  one came: it steps down when that one is active, not while it is still joining). A member whose statuses stop
  for an activation interval is lost; the ranking inactive member then activates, so the
  longest interruption is about one activation interval. A member that withdraws (``LEAVE``)
  is lost at once.
* **Hints** ("Prepare-to-Activate Hints"): with a preparation interval, a member that would
  activate if an active member now silent for that long were lost gets
  ``PREPARE_TO_ACTIVATE`` then; a hint always comes before an activation (given at once when
  the activation had no warning), and is no promise.
* **Advisories** (TIBCO Rendezvous Concepts, Appendix C): ``PARAM_MISMATCH`` ERROR when
  another member's active goal or activation interval differs, WARN when its heartbeat
  interval differs or one member's preparation interval is shorter than the other's
  heartbeat; ``TOO_MANY_ACTIVE`` (WARN) to an active member staying active while more than
  the goal are; ``TOO_FEW_ACTIVE`` (WARN) to an inactive member staying inactive while fewer
  are; ``DISABLING_MEMBER`` (ERROR) to a member told of a resource error
  (:meth:`FtCore.disable`: it deactivates, and its weight becomes 0). Each carries
  ``RVADV_DESC`` (STRING). A mismatch is reported once per other member and kind; the others
  at most once per activation interval.
"""

from __future__ import annotations

import enum
import random
from typing import Final

from transports.rv.advisory import advisory_message
from transports.rv.message import Message, RvType
from transports.rv.subject import validate_send_subject

FT_PREFIX: Final = "_RVFT."

PARAM_MISMATCH_ERROR: Final = "_RV.ERROR.RVFT.PARAM_MISMATCH."
PARAM_MISMATCH_WARN: Final = "_RV.WARN.RVFT.PARAM_MISMATCH."
DISABLING_MEMBER: Final = "_RV.ERROR.RVFT.DISABLING_MEMBER."
TOO_MANY_ACTIVE: Final = "_RV.WARN.RVFT.TOO_MANY_ACTIVE."
TOO_FEW_ACTIVE: Final = "_RV.WARN.RVFT.TOO_FEW_ACTIVE."


class FtAction(enum.Enum):
    """What the group tells a member's program (Fault Tolerance Concepts, "Actions")."""

    PREPARE_TO_ACTIVATE = "PREPARE_TO_ACTIVATE"
    ACTIVATE = "ACTIVATE"
    DEACTIVATE = "DEACTIVATE"


class _Peer:
    __slots__ = ("weight", "active", "joining_until", "goal", "heartbeat", "preparation",
                 "activation", "last")

    def __init__(self) -> None:
        self.weight = 0
        self.active = False
        self.joining_until = 0.0  # (this member's clock) when its join wait ends
        self.goal = 0
        self.heartbeat = self.preparation = self.activation = 0.0
        self.last = 0.0


def check_intervals(heartbeat: float, preparation: float, activation: float) -> None:
    """Fault Tolerance Concepts, "Step 4: Choose the Intervals": heartbeat < activation, and
    with hints heartbeat < preparation < activation."""
    if heartbeat <= 0 or activation <= heartbeat:
        raise ValueError(f"the heartbeat interval ({heartbeat} s) must be positive and less "
                         f"than the activation interval ({activation} s)")
    if preparation and not heartbeat < preparation < activation:
        raise ValueError(f"the preparation interval ({preparation} s) must be 0 or between the "
                         f"heartbeat ({heartbeat} s) and activation ({activation} s) intervals")


def _status_fields(msg: Message) -> dict[str, object] | None:
    try:
        fields = {name: msg.get(name) for name in ("op", "id")}
        if fields["op"] == "STATUS":
            for name in ("weight", "active", "joining", "goal", "heartbeat", "preparation",
                         "activation"):
                fields[name] = msg.get(name)
    except (KeyError, ValueError):
        return None
    return fields


class FtCore:
    """One member of fault-tolerance group ``group`` (module docstring).

    Args:
        weight: its weight; higher ranks first (0: a last resort).
        active_goal: how many members should be active; the same at every member.
        heartbeat, preparation, activation: the intervals in seconds (preparation 0: no
            hints); activation the same at every member.
        now: the current time in seconds (any clock, the same for every call).
        subject: where the statuses go, ``_RVFT.<group>`` unless given (a distributed queue
            elects its scheduler on its own subject).
    """

    def __init__(self, group: str, *, weight: int = 50, active_goal: int = 1,
                 heartbeat: float = 1.0, preparation: float = 0.0, activation: float = 3.0,
                 now: float, rng: random.Random | None = None,
                 subject: str | None = None) -> None:
        validate_send_subject(group, allow_wildcard=False)
        check_intervals(heartbeat, preparation, activation)
        if weight < 0 or active_goal < 1:
            raise ValueError("the weight must be >= 0 and the active goal >= 1")
        self.group = group
        self.subject = subject or FT_PREFIX + group
        self.id = f"{(rng or random.Random()).getrandbits(64):016x}"
        self.weight = weight
        self.goal = active_goal
        self.heartbeat = heartbeat
        self.preparation = preparation
        self.activation = activation
        self.active = False
        self.joined_at = now
        self.prepared = False  # a hint given since the last (de)activation
        self.peers: dict[str, _Peer] = {}
        self._next_status = now  # the first status goes at once: the announcement
        self._evaluated_at = now - 1.0
        self._reported: set[tuple[str, str]] = set()  # (member id, mismatch) told already
        self._warned: dict[str, float] = {}  # advisory -> when last presented
        self._out: list[Message] = []
        self._events: list[FtAction | Message] = []
        self.closed = False

    # -- driver side -------------------------------------------------------------------------

    def receive(self, msg: Message, now: float) -> None:
        """A message on the group's subject."""
        fields = _status_fields(msg)
        if fields is None or fields["id"] == self.id or self.closed:
            return
        ident = str(fields["id"])
        if fields["op"] == "LEAVE":
            self.peers.pop(ident, None)
            self._evaluate(now)
            return
        if fields["op"] != "STATUS":
            return
        peer = self.peers.get(ident)
        if peer is None:
            peer = self.peers[ident] = _Peer()
        try:
            peer.weight = int(fields["weight"])  # type: ignore[call-overload]
            peer.active = bool(fields["active"])
            peer.joining_until = now + float(fields["joining"])  # type: ignore[arg-type]
            peer.goal = int(fields["goal"])  # type: ignore[call-overload]
            peer.heartbeat = float(fields["heartbeat"])  # type: ignore[arg-type]
            peer.preparation = float(fields["preparation"])  # type: ignore[arg-type]
            peer.activation = float(fields["activation"])  # type: ignore[arg-type]
        except (TypeError, ValueError):
            del self.peers[ident]
            return
        peer.last = now
        self._check_params(ident, peer)
        self._evaluate(now)

    def tick(self, now: float) -> None:
        """Run what is due: statuses, losses, hints, activations."""
        if self.closed:
            return
        for ident in [i for i, p in self.peers.items() if now - p.last >= self.activation]:
            del self.peers[ident]  # silent for an activation interval: lost
        if now >= self._next_status:
            self._send_status(now)
        self._evaluate(now)

    def next_deadline(self) -> float | None:
        if self.closed:
            return None
        times = [self.joined_at + self.activation]  # the end of the join wait
        for p in self.peers.values():
            times.append(p.last + self.activation)  # its loss
            if self.preparation and p.active and not self.prepared:
                times.append(p.last + self.preparation)  # a hint, maybe
        # What was evaluated already is not due again (the next status always is).
        return min([self._next_status, *(t for t in times if t > self._evaluated_at)])

    def flush(self) -> tuple[list[Message], list[FtAction | Message]]:
        """The messages to send and the events (actions, advisories) for the program."""
        out, self._out = self._out, []
        events, self._events = self._events, []
        return out, events

    # -- program side ------------------------------------------------------------------------

    def set_weight(self, weight: int, now: float) -> None:
        """Change this member's weight; every member ranks again (Fault Tolerance Concepts,
        "Adjusting Member Weights")."""
        if weight < 0:
            raise ValueError("the weight must be >= 0")
        self.weight = weight
        self._send_status(now)
        self._evaluate(now)

    def disable(self, now: float, reason: str = "") -> None:
        """A resource error: deactivate, weight 0, ``DISABLING_MEMBER`` ("Resource Errors")."""
        self._advise(DISABLING_MEMBER, reason or None)
        self.weight = 0
        if self.active:
            self._set_active(False, now)
        self._send_status(now)
        self._evaluate(now)

    def withdraw(self) -> None:
        """Leave the group: the others know at once (LEAVE)."""
        if self.closed:
            return
        self.closed = True
        self.active = False  # the program left: no action tells it so
        msg = Message(self.subject)
        msg.add("op", "LEAVE", RvType.STRING).add("id", self.id, RvType.STRING)
        self._out.append(msg)

    # -- internals ---------------------------------------------------------------------------

    def ranking(self, now: float, joined_only: bool = False) -> list[tuple[str, int, bool]]:
        """(id, weight, active) of the members heard within an activation interval and this
        one, best first; ``joined_only``: leave out those still in their join wait."""
        rows = [(ident, p.weight, p.active) for ident, p in self.peers.items()
                if now - p.last < self.activation
                and not (joined_only and now < p.joining_until)]
        rows.append((self.id, self.weight, self.active))
        rows.sort(key=lambda r: (-r[1], not r[2], r[0]))
        return rows

    def _evaluate(self, now: float) -> None:
        if self.closed:
            return
        self._evaluated_at = now
        ranking = self.ranking(now)
        mine = [r[0] for r in ranking].index(self.id)
        actives = sum(1 for r in ranking if r[2])
        joining = now < self.joined_at + self.activation
        if self.active:
            # Step down only once enough better-ranked members are active: a heavier one
            # that is still joining does not leave the group without an active member.
            if sum(1 for r in ranking[:mine] if r[2]) >= self.goal:
                self._set_active(False, now)
            elif actives > self.goal:
                self._warn(TOO_MANY_ACTIVE, now, f"{actives} members active, the goal is "
                                                 f"{self.goal}")
        elif not joining and [r[0] for r in self.ranking(now, True)].index(self.id) < self.goal:
            # (members still joining cannot activate yet: they do not hold this one back)
            if self.preparation and not self.prepared:
                self._events.append(FtAction.PREPARE_TO_ACTIVATE)  # a hint comes first
            self._set_active(True, now)
        else:
            if self.preparation and not self.prepared:
                self._hint_if_next(now)
            if not joining and actives < self.goal and mine >= self.goal:
                self._warn(TOO_FEW_ACTIVE, now, f"{actives} members active, the goal is "
                                                f"{self.goal}")

    def _hint_if_next(self, now: float) -> None:
        """PREPARE_TO_ACTIVATE when this member would activate should the active members
        silent for a preparation interval be lost."""
        silent = {ident for ident, p in self.peers.items()
                  if p.active and now - p.last >= self.preparation}
        if not silent:
            return
        rest = [r for r in self.ranking(now) if r[0] not in silent]
        if [r[0] for r in rest].index(self.id) < self.goal:
            self.prepared = True
            self._events.append(FtAction.PREPARE_TO_ACTIVATE)

    def _set_active(self, active: bool, now: float) -> None:
        self.active = active
        self.prepared = False
        self._events.append(FtAction.ACTIVATE if active else FtAction.DEACTIVATE)
        self._send_status(now)

    def _send_status(self, now: float) -> None:
        msg = Message(self.subject)
        msg.add("op", "STATUS", RvType.STRING).add("id", self.id, RvType.STRING)
        msg.add("weight", self.weight, RvType.U32).add("active", self.active, RvType.BOOL)
        msg.add("joining", max(0.0, self.joined_at + self.activation - now), RvType.F64)
        msg.add("goal", self.goal, RvType.U32)
        msg.add("heartbeat", self.heartbeat, RvType.F64)
        msg.add("preparation", self.preparation, RvType.F64)
        msg.add("activation", self.activation, RvType.F64)
        self._out.append(msg)
        self._next_status = now + self.heartbeat

    def _check_params(self, ident: str, peer: _Peer) -> None:
        checks = (
            (peer.goal != self.goal, PARAM_MISMATCH_ERROR, "Active goal differs"),
            (peer.activation != self.activation, PARAM_MISMATCH_ERROR,
             "Activation interval differs"),
            (peer.heartbeat != self.heartbeat, PARAM_MISMATCH_WARN,
             "Heartbeat interval differs"),
            (bool(peer.preparation) and peer.preparation < self.heartbeat, PARAM_MISMATCH_WARN,
             "Other prepares before this member's heartbeat"),
            (bool(self.preparation) and self.preparation < peer.heartbeat, PARAM_MISMATCH_WARN,
             "This member prepares before other's heartbeat"),
        )
        for failed, subject, desc in checks:
            if failed and (ident, desc) not in self._reported:
                self._reported.add((ident, desc))
                self._advise(subject, desc)

    def _warn(self, subject: str, now: float, desc: str) -> None:
        last = self._warned.get(subject)
        if last is None or now - last >= self.activation:
            self._warned[subject] = now
            self._advise(subject, desc)

    def _advise(self, subject: str, desc: str | None) -> None:
        fields = {"RVADV_DESC": desc} if desc is not None else {}
        self._events.append(advisory_message(subject + self.group, fields))


class FtMonitorCore:
    """A passive monitor of group ``group`` ("Passive Monitor"): counts the active members
    from their statuses; a member unheard for ``lost_interval`` (the group's activation
    interval) no longer counts. :meth:`flush` gives the count each time it changed."""

    def __init__(self, group: str, *, lost_interval: float) -> None:
        validate_send_subject(group, allow_wildcard=False)
        if lost_interval <= 0:
            raise ValueError("the lost interval must be positive")
        self.group = group
        self.subject = FT_PREFIX + group
        self.lost_interval = lost_interval
        self._active: dict[str, float] = {}  # member id -> last status saying active
        self._count = 0
        self._changes: list[int] = []

    def receive(self, msg: Message, now: float) -> None:
        fields = _status_fields(msg)
        if fields is None:
            return
        ident = str(fields["id"])
        if fields["op"] == "STATUS" and fields.get("active"):
            self._active[ident] = now
        else:
            self._active.pop(ident, None)
        self._note()

    def tick(self, now: float) -> None:
        for ident in [i for i, t in self._active.items() if now - t >= self.lost_interval]:
            del self._active[ident]
        self._note()

    def next_deadline(self) -> float | None:
        return min(self._active.values()) + self.lost_interval if self._active else None

    def _note(self) -> None:
        count = len(self._active)
        if count != self._count:
            self._count = count
            self._changes.append(count)

    @property
    def active_count(self) -> int:
        return self._count

    def flush(self) -> list[int]:
        changes, self._changes = self._changes, []
        return changes
