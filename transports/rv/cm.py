"""Certified message delivery on the RV-style bus: the protocol, sans I/O.

The model is TIBCO Rendezvous Concepts, Certified Message Delivery: a *CM transport* is an
ordinary transport plus a *correspondent name* and a *ledger*
(:mod:`transports.rv.ledger`). What it sends is *labeled* (the envelope's CM label: the
sender's name, a sequence number per subject, a time limit). A listener that receives a
labeled message from a sender it does not know *discovers* it, asks it to *register* it for
the subject, and from the sender's acceptance on the two have a *certified delivery
agreement*: the sender keeps each message on that subject in its ledger until the listener
confirms it (or its time limit passes), and the listener gets the messages in sequence
order, asks for what it missed, and confirms each one.

:class:`CmCore` is that protocol for one CM transport, both roles at once. It reads no clock
and touches no socket: its driver feeds it what the bus delivers (:meth:`CmCore.receive`),
what the program sends and confirms (:meth:`~CmCore.send`, :meth:`~CmCore.confirm`), the time
(:meth:`~CmCore.tick` at :meth:`~CmCore.next_deadline`), and after each turn calls
:meth:`~CmCore.flush`, which commits the ledger and then hands out the messages to send and
the events for the program (:class:`CmDelivery`, and :class:`CmAdvisory`). Committing
before anything of the turn goes out is what makes the ledger safe: a sequence number is on
disk before a message carries it, a stored message before it leaves, a confirmed position
before its confirmation.

The control protocol is this bus's own (Rendezvous does not publish its wire protocol):
control messages go between correspondents on ``_RVCM.<name>``, with ``op``, ``from``,
``inst`` and the fields of their kind. ``transports/rv/README.md``, "Certified delivery",
gives the table of kinds and the rules (discovery, registration, delivery in order with
retransmission requests, held-back confirmation, confirmation requests, time limits,
cancelling, disallowing, collisions), which the methods below follow section by section.
Advisories are :class:`CmAdvisory` objects on ``_RV.<class>.RVCM.<name>.<subject or
correspondent>`` with the fields of TIBCO Rendezvous Concepts, Appendix B; their messages are
built only for a listener.

Not here: relay agents. The ledger advisories (``LEDGER.WRITE_FAILED`` / ``WRITE_RESUMED``)
are presented by the driver, which commits the ledger (:mod:`transports.rv.cmtransport`).
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from typing import Final

from transports.rv.advisory import advisory_message
from transports.rv.codec import FormatError, decode, encode
from transports.rv.ledger import Ledger, StoredMessage
from transports.rv.message import CmLabel, Message, RvType
from transports.rv.subject import matches, validate_listen_subject, validate_send_subject

CONTROL_PREFIX: Final = "_RVCM."

# Advisory subject heads: the subject or the correspondent name is appended.
DELIVERY_CONFIRM: Final = "_RV.INFO.RVCM.DELIVERY.CONFIRM."
DELIVERY_COMPLETE: Final = "_RV.INFO.RVCM.DELIVERY.COMPLETE."
DELIVERY_NO_RESPONSE: Final = "_RV.WARN.RVCM.DELIVERY.NO_RESPONSE."
DELIVERY_FAILED: Final = "_RV.ERROR.RVCM.DELIVERY.FAILED."
DELIVERY_UNAVAILABLE: Final = "_RV.ERROR.RVCM.DELIVERY.UNAVAILABLE."
REGISTRATION_REQUEST: Final = "_RV.INFO.RVCM.REGISTRATION.REQUEST."
REGISTRATION_CERTIFIED: Final = "_RV.INFO.RVCM.REGISTRATION.CERTIFIED."
REGISTRATION_NOT_CERTIFIED: Final = "_RV.WARN.RVCM.REGISTRATION.NOT_CERTIFIED."
REGISTRATION_NO_RESPONSE: Final = "_RV.WARN.RVCM.REGISTRATION.NO_RESPONSE."
REGISTRATION_CLOSED: Final = "_RV.INFO.RVCM.REGISTRATION.CLOSED."
REGISTRATION_DISCOVERY: Final = "_RV.INFO.RVCM.REGISTRATION.DISCOVERY."
REGISTRATION_MOVED: Final = "_RV.INFO.RVCM.REGISTRATION.MOVED."
REGISTRATION_COLLISION: Final = "_RV.ERROR.RVCM.REGISTRATION.COLLISION."
# The ledger's own (this bus's; Rendezvous publishes none): a file ledger that cannot be
# written -- nothing of the turn leaves until it can -- and written again.
LEDGER_WRITE_FAILED: Final = "_RV.ERROR.RVCM.LEDGER.WRITE_FAILED."
LEDGER_WRITE_RESUMED: Final = "_RV.INFO.RVCM.LEDGER.WRITE_RESUMED."

_U64 = RvType.U64
_CONTROL_TYPES: Final = {"begin": _U64, "last": _U64, "upto": _U64, "first": _U64,
                         "old": RvType.BOOL, "req": RvType.BOOL, "reply": RvType.BOOL,
                         "msg": RvType.OPAQUE}

# Listener-side states of a (sender, subject) source.
KNOWN: Final = 0  # in the ledger from an earlier run; not asked to register yet
REQUESTING: Final = 1  # REG_REQ sent; messages wait
CERTIFIED: Final = 2
UNCERTIFIED: Final = 3  # refused, not answered or ended: messages pass uncertified


class CmDelivery:
    """A message for the program's CM listeners. ``seq`` > 0: certified (confirm it with
    :meth:`CmCore.confirm`); 0: labeled but not certified; ``sender`` None: not labeled."""

    __slots__ = ("msg", "sender", "subject", "seq")

    def __init__(self, msg: Message, sender: str | None, subject: str, seq: int) -> None:
        self.msg = msg
        self.sender = sender
        self.subject = subject
        self.seq = seq

    @property
    def certified(self) -> bool:
        return self.seq > 0

    def __repr__(self) -> str:
        return f"CmDelivery({self.subject!r}, sender={self.sender!r}, seq={self.seq})"


class CmAdvisory:
    """An advisory of the protocol: its subject and fields. The message is built only when
    somebody takes it (:meth:`message`): most are INFO advisories nobody listens to, two
    for every message confirmed."""

    __slots__ = ("subject", "fields", "_msg")

    def __init__(self, subject: str, fields: dict[str, object],
                 msg: Message | None = None) -> None:
        self.subject = subject
        self.fields = fields
        self._msg = msg

    def message(self) -> Message:
        if self._msg is None:
            self._msg = advisory_message(self.subject, self.fields)
        return self._msg

    def __repr__(self) -> str:
        return f"CmAdvisory({self.subject!r}, {self.fields!r})"


class _Reg:
    """Sender side: one registered listener on one subject."""

    __slots__ = ("last", "inst", "next_request")

    def __init__(self, last: int) -> None:
        self.last = last  # the last sequence number it confirmed
        self.inst: str | None = None  # the run of it last heard from
        self.next_request = 0.0  # when to check for a confirmation owed; 0 = none owed


class _Source:
    """Listener side: one sender on one subject."""

    __slots__ = ("state", "expected", "confirmed", "held", "waiting", "acked", "skipped",
                 "attempts", "next_at", "confirm_due", "reconfirm")

    def __init__(self, state: int, confirmed: int = 0) -> None:
        self.state = state
        self.confirmed = confirmed  # every message up to this one is confirmed
        self.expected = confirmed + 1  # the next one to deliver (CERTIFIED)
        self.held: dict[int, Message] = {}  # past a gap (CERTIFIED)
        self.waiting: list[Message] = []  # while REQUESTING
        self.acked: set[int] = set()  # confirmed by the program past ``confirmed``
        self.skipped: deque[tuple[int, int]] = deque()  # unavailable ranges past ``confirmed``
        self.attempts = 0
        self.next_at = 0.0  # the next REG_REQ (REQUESTING) or RETRANS_REQ (gap); 0 = none
        self.confirm_due = False  # the position moved: to the ledger, then CONFIRM
        self.reconfirm = False  # CONFIRM the position again (a duplicate came)


class CmCore:
    """The certified-delivery protocol of one CM transport (module docstring).

    Args:
        name: the correspondent name (subject syntax, no wildcard). ``None`` makes a transient
            correspondent with a generated name that is never reused.
        ledger: :class:`~transports.rv.ledger.SqliteLedger` for a persistent correspondent;
            default a process-based one.
        now: the current time, wall-clock seconds (time limits are kept in the ledger).
        require_old: as a listener, ask returning senders for the messages missed meanwhile.
        default_ttl: the time limit of a message sent without one; 0 = none.
        request_interval: seconds between registration, retransmission and confirmation
            requests.
        registration_attempts: REG_REQs sent before ``REGISTRATION.NO_RESPONSE``.
        explicit_config_only: as a sender, accept only the listeners announced with
            :meth:`add_listener` (TIBCO EMS's ``explicit_config_only``); others get REG_DENY.
    """

    def __init__(self, name: str | None = None, ledger: Ledger | None = None, *, now: float,
                 require_old: bool = False, default_ttl: float = 0.0,
                 request_interval: float = 1.0, registration_attempts: int = 5,
                 explicit_config_only: bool = False,
                 rng: random.Random | None = None) -> None:
        rng = rng or random.Random()
        self.transient = name is None
        if name is None:
            name = f"CM.{rng.getrandbits(64):016x}"
        validate_send_subject(name, allow_wildcard=False)
        if name.startswith("_"):
            raise ValueError(f"correspondent name {name!r}: a name may not start with '_'")
        self.name = name
        self.inst = f"{rng.getrandbits(64):016x}"
        self.control_subject = CONTROL_PREFIX + name
        self.require_old = require_old
        self.default_ttl = default_ttl
        self.request_interval = request_interval
        self.registration_attempts = registration_attempts
        self.explicit_config_only = explicit_config_only
        self.ledger = ledger if ledger is not None else Ledger()
        state = self.ledger.load(name)
        self._seqs = state.seqs
        self._regs: dict[str, dict[str, _Reg]] = {
            subject: {listener: _Reg(last) for listener, last in regs.items()}
            for subject, regs in state.regs.items()}
        self._stored = state.msgs
        self._deadlines: list[tuple[float, str, int]] = [
            (st.deadline, subject, seq) for subject, msgs in self._stored.items()
            for seq, st in msgs.items() if st.deadline]
        heapq.heapify(self._deadlines)
        self._disallowed = state.disallowed
        self._sources: dict[tuple[str, str], _Source] = {
            key: _Source(KNOWN, confirmed) for key, confirmed in state.sources.items()}
        self._listening: list[str] = []
        self._out: list[Message] = []
        self._events: list[CmDelivery | CmAdvisory] = []
        self._control("HELLO", name, reply=False)

    # -- the program's side ------------------------------------------------------------------

    def send(self, msg: Message, now: float, time_limit: float | None = None) -> int:
        """Label ``msg`` (its send subject set and checked by the caller) and queue it; store
        it for the listeners registered on its subject. Returns its sequence number."""
        subject = msg.send_subject
        assert subject is not None
        seq = self._seqs.get(subject, 0) + 1
        self._seqs[subject] = seq
        self.ledger.set_seq(subject, seq)
        limit = self.default_ttl if time_limit is None else time_limit
        if limit < 0:
            raise ValueError(f"time limit {limit} is negative")
        msg.cm = CmLabel(self.name, seq, limit)
        regs = self._regs.get(subject)
        if regs:
            deadline = now + limit if limit else 0.0
            stored = StoredMessage(encode(msg), deadline, set(regs), now)
            self._stored.setdefault(subject, {})[seq] = stored
            for reg in regs.values():
                if not reg.next_request:
                    reg.next_request = now + self.request_interval
            self.ledger.put_message(subject, seq, stored)
            if deadline:
                heapq.heappush(self._deadlines, (deadline, subject, seq))
        self._out.append(msg)
        return seq

    def listen(self, pattern: str, now: float) -> None:
        """The program has a CM listener on ``pattern``: senders this correspondent knew
        from an earlier run on matching subjects are asked to register it again."""
        validate_listen_subject(pattern)
        self._listening.append(pattern)
        for (sender, subject), src in self._sources.items():
            if src.state == KNOWN and matches(pattern, subject):
                self._request(sender, subject, src, now)

    def cancel(self, pattern: str) -> None:
        """End the agreements on subjects matching ``pattern`` (a CM listener destroyed with
        its agreements cancelled): the senders stop keeping messages for this listener."""
        if pattern in self._listening:
            self._listening.remove(pattern)
        for key in [k for k in self._sources if matches(pattern, k[1])]:
            sender, subject = key
            src = self._sources.pop(key)
            if src.state in (REQUESTING, CERTIFIED):
                self._control("CLOSE", sender, subject=subject)
            self.ledger.delete_source(sender, subject)

    def confirm(self, sender: str, subject: str, seq: int) -> None:
        """The program is done with certified message ``seq`` of ``sender`` on ``subject``."""
        src = self._sources.get((sender, subject))
        if src is None or src.state != CERTIFIED or seq <= src.confirmed:
            return
        src.acked.add(seq)
        self._advance(sender, subject, src)

    def add_listener(self, listener: str, subject: str) -> None:
        """Anticipate ``listener`` on ``subject``: store what is sent from now on for it,
        before it registers (it must ask for old messages to get them)."""
        validate_send_subject(subject, allow_wildcard=False)
        regs = self._regs.setdefault(subject, {})
        if listener not in regs:
            last = self._seqs.get(subject, 0)
            regs[listener] = _Reg(last)
            self.ledger.put_reg(subject, listener, last)

    def remove_listener(self, subject: str, listener: str, *, notify: bool = True) -> None:
        """End the agreement with ``listener`` on ``subject`` from the sending side (``notify``:
        tell the listener, which then gets ``REGISTRATION.NOT_CERTIFIED``)."""
        reg = self._regs.get(subject, {}).pop(listener, None)
        if reg is None:
            return
        self.ledger.delete_reg(subject, listener)
        for seq, stored in list(self._stored.get(subject, {}).items()):
            if listener in stored.pending:
                stored.pending.discard(listener)
                self._maybe_complete(subject, seq, stored)
        self._advise(REGISTRATION_CLOSED + subject, subject=subject, listener=listener,
                     seqno_last_sent=self._seqs.get(subject, 0), seqno_last_confirmed=reg.last)
        if notify:
            self._control("NOT_CERT", listener, subject=subject)

    def disallow(self, listener: str) -> None:
        """Refuse certified delivery to ``listener`` on every subject, now and later."""
        if listener not in self._disallowed:
            self._disallowed.add(listener)
            self.ledger.set_disallowed(listener, True)
        for subject in [s for s, regs in self._regs.items() if listener in regs]:
            self.remove_listener(subject, listener)

    def allow(self, listener: str) -> None:
        """Accept ``listener``'s registrations again."""
        if listener in self._disallowed:
            self._disallowed.discard(listener)
            self.ledger.set_disallowed(listener, False)

    # -- the driver's side -------------------------------------------------------------------

    def receive(self, msg: Message, now: float) -> None:
        """A message from the bus: a control message on this transport's control subject, or a
        message on a subject the program's CM listeners listen to."""
        if msg.send_subject == self.control_subject:
            self._on_control(msg, now)
            return
        label = msg.cm
        subject = msg.send_subject or ""
        if label is None:
            self._events.append(CmDelivery(msg, None, subject, 0))
            return
        self._on_labeled(msg, label, subject, now)

    def tick(self, now: float) -> None:
        """Run the timers that are due: expired messages, requests to repeat."""
        while self._deadlines and self._deadlines[0][0] <= now:
            _, subject, seq = heapq.heappop(self._deadlines)
            stored = self._stored.get(subject, {}).pop(seq, None)
            if stored is not None:
                self.ledger.delete_message(subject, seq)
                self._failed(subject, seq, stored)
        for (sender, subject), src in self._sources.items():
            if src.next_at and src.next_at <= now:
                if src.state == REQUESTING:
                    self._retry_registration(sender, subject, src, now)
                elif src.state == CERTIFIED and src.held:
                    self._ask_gap(sender, subject, src, now)
                else:
                    src.next_at = 0.0
        for subject, regs in self._regs.items():
            for listener, reg in regs.items():
                if reg.next_request and reg.next_request <= now:
                    self._check_owed(subject, listener, reg, now)

    def next_deadline(self) -> float | None:
        """When :meth:`tick` has something to do next, or None."""
        times = [src.next_at for src in self._sources.values() if src.next_at]
        if self._deadlines:
            times.append(self._deadlines[0][0])
        for regs in self._regs.values():
            times.extend(reg.next_request for reg in regs.values() if reg.next_request)
        return min(times) if times else None

    def flush(self) -> tuple[list[Message], list[CmDelivery | CmAdvisory]]:
        """Commit the ledger, then take the messages to send (in order) and the events for the
        program. Raises the ledger's error when it cannot write; nothing is taken then."""
        for (sender, subject), src in self._sources.items():
            if src.confirm_due:
                self.ledger.put_source(sender, subject, src.confirmed)
        self.ledger.commit()
        for (sender, subject), src in self._sources.items():
            if src.confirm_due or src.reconfirm:
                src.confirm_due = src.reconfirm = False
                if src.state == CERTIFIED and src.confirmed:
                    self._control("CONFIRM", sender, subject=subject, upto=src.confirmed)
        out, self._out = self._out, []
        events, self._events = self._events, []
        return out, events

    def stored_count(self, subject: str | None = None) -> int:
        """Messages kept for listeners that have not confirmed them (on ``subject``)."""
        if subject is not None:
            return len(self._stored.get(subject, ()))
        return sum(len(m) for m in self._stored.values())

    def is_stored(self, subject: str, seq: int) -> bool:
        """Is message ``seq`` of ``subject`` kept for a listener that has not confirmed it?"""
        return seq in self._stored.get(subject, ())

    def stored_items(self) -> list[tuple[str, int, bytes]]:
        """Every kept message: (subject, sequence number, the labeled message encoded)."""
        return [(subject, seq, st.data) for subject, msgs in self._stored.items()
                for seq, st in msgs.items()]

    def source_confirmed(self, sender: str, subject: str) -> int | None:
        """The position confirmed to ``sender`` on ``subject`` (every message up to it), or
        None when there is no certified agreement with it."""
        src = self._sources.get((sender, subject))
        return src.confirmed if src is not None and src.state == CERTIFIED else None

    def registered(self, subject: str) -> list[str]:
        """The listeners registered (or anticipated) on ``subject``."""
        return sorted(self._regs.get(subject, ()))

    # -- listener side -----------------------------------------------------------------------

    def _on_labeled(self, msg: Message, label: CmLabel, subject: str, now: float) -> None:
        sender = label.sender
        if sender == self.name:  # our own, heard back: never certified to ourselves
            self._uncertified(msg, label, subject)
            return
        key = (sender, subject)
        src = self._sources.get(key)
        if src is None:
            src = self._sources[key] = _Source(REQUESTING)
            self._advise(REGISTRATION_DISCOVERY + subject, subject=subject, sender=sender)
            self._request(sender, subject, src, now)
            if self.require_old:
                src.waiting.append(msg)  # certified if the sender kept it for us
            else:
                self._uncertified(msg, label, subject)  # the message that made the discovery
            return
        if src.state == KNOWN:
            self._request(sender, subject, src, now)
        if src.state == REQUESTING:
            src.waiting.append(msg)
        elif src.state == UNCERTIFIED:
            self._uncertified(msg, label, subject)
        else:
            self._certified_in(sender, subject, src, msg, label.sequence, now)

    def _certified_in(self, sender: str, subject: str, src: _Source, msg: Message, seq: int,
                      now: float) -> None:
        if seq < src.expected or seq in src.held:
            if seq <= src.confirmed:
                src.reconfirm = True  # our confirmation may have been lost
            return
        if seq > src.expected:
            src.held[seq] = msg
            if not src.next_at:
                self._ask_gap(sender, subject, src, now)
            return
        self._deliver(sender, subject, src, msg, seq)
        self._drain(sender, subject, src)

    def _deliver(self, sender: str, subject: str, src: _Source, msg: Message, seq: int) -> None:
        src.expected = seq + 1
        self._events.append(CmDelivery(msg, sender, subject, seq))

    def _drain(self, sender: str, subject: str, src: _Source) -> None:
        """Deliver what waited behind a gap, skipping unavailable ranges."""
        while True:
            nxt = src.expected
            msg = src.held.pop(nxt, None)
            if msg is not None:
                self._deliver(sender, subject, src, msg, nxt)
                continue
            for first, last in src.skipped:
                if first <= nxt <= last:
                    src.expected = last + 1
                    break
            else:
                break
        if not src.held:
            src.next_at = 0.0
        self._advance(sender, subject, src)

    def _advance(self, sender: str, subject: str, src: _Source) -> None:
        """Move the confirmed position over what the program confirmed and what was skipped;
        a CONFIRM goes out at the next flush (after the ledger has the position)."""
        moved = False
        while True:
            nxt = src.confirmed + 1
            if nxt in src.acked:
                src.acked.discard(nxt)
                src.confirmed = nxt
                moved = True
            elif src.skipped and src.skipped[0][0] <= nxt:
                src.confirmed = max(src.confirmed, src.skipped.popleft()[1])
                moved = True
            else:
                break
        if moved:
            src.confirm_due = True

    def _uncertified(self, msg: Message, label: CmLabel, subject: str) -> None:
        msg.cm = CmLabel(label.sender, 0, label.time_limit)
        self._events.append(CmDelivery(msg, label.sender, subject, 0))

    def _request(self, sender: str, subject: str, src: _Source, now: float = 0.0) -> None:
        src.state = REQUESTING
        src.attempts = 1
        src.next_at = now + self.request_interval
        self._control("REG_REQ", sender, subject=subject, last=src.confirmed,
                      old=self.require_old)

    def _retry_registration(self, sender: str, subject: str, src: _Source, now: float) -> None:
        if src.attempts >= self.registration_attempts:
            self._advise(REGISTRATION_NO_RESPONSE + subject, subject=subject, sender=sender)
            if src.confirmed:
                # An agreement from an earlier run: the sender keeps our messages, and sends
                # them when we register; we ask again when it is heard from next.
                src.state = KNOWN
                src.next_at = 0.0
                src.waiting = []
            else:
                self._give_up(sender, subject, src)
            return
        src.attempts += 1
        src.next_at = now + self.request_interval
        self._control("REG_REQ", sender, subject=subject, last=src.confirmed,
                      old=self.require_old)

    def _give_up(self, sender: str, subject: str, src: _Source) -> None:
        """No certification from ``sender`` on ``subject``: what waits passes uncertified."""
        src.state = UNCERTIFIED
        src.next_at = 0.0
        waiting = sorted(src.waiting + list(src.held.values()),
                         key=lambda m: m.cm.sequence if m.cm else 0)
        src.waiting, src.held = [], {}
        for msg in waiting:
            if msg.cm is not None:
                self._uncertified(msg, msg.cm, subject)
        self.ledger.delete_source(sender, subject)

    def _ask_gap(self, sender: str, subject: str, src: _Source, now: float) -> None:
        last = min(src.held) - 1
        if last >= src.expected:
            self._control("RETRANS_REQ", sender, subject=subject, first=src.expected, last=last)
        src.next_at = now + self.request_interval

    def _on_registered(self, sender: str, subject: str, begin: int, now: float) -> None:
        src = self._sources.get((sender, subject))
        if src is None or src.state != REQUESTING:
            return
        src.state = CERTIFIED
        src.next_at = 0.0
        if src.confirmed < begin - 1:
            src.confirmed = begin - 1  # what came before is not certified: nothing to confirm
            self.ledger.put_source(sender, subject, src.confirmed)
        src.acked = {s for s in src.acked if s > src.confirmed}
        src.expected = src.confirmed + 1
        self._advise(REGISTRATION_CERTIFIED + subject, subject=subject, sender=sender,
                     seqno_begin=begin)
        waiting, src.waiting = src.waiting, []
        for msg in sorted(waiting, key=lambda m: m.cm.sequence if m.cm else 0):
            label = msg.cm
            assert label is not None
            if label.sequence < begin:
                self._uncertified(msg, label, subject)
            else:
                self._certified_in(sender, subject, src, msg, label.sequence, now)

    def _on_unavailable(self, sender: str, subject: str, first: int, last: int,
                        now: float) -> None:
        src = self._sources.get((sender, subject))
        if src is None or src.state != CERTIFIED or last < src.expected:
            return
        first = max(first, src.expected)
        self._advise(DELIVERY_UNAVAILABLE + subject, subject=subject, seqno_begin=first,
                     seqno_end=last, sender=sender)
        src.skipped.append((first, last))
        for seq in [s for s in src.held if first <= s <= last]:
            del src.held[seq]
        self._drain(sender, subject, src)

    # -- sender side -------------------------------------------------------------------------

    def _on_register_request(self, listener: str, inst: str, subject: str, last: int,
                             old: bool, now: float) -> None:
        reg = self._regs.get(subject, {}).get(listener)
        if listener in self._disallowed or (reg is None and self.explicit_config_only):
            self._control("REG_DENY", listener, subject=subject)
            return
        current = self._seqs.get(subject, 0)
        regs = self._regs.setdefault(subject, {})
        if reg is None:
            reg = regs[listener] = _Reg(current)
            begin = current + 1
            gone_from = last + 1 if old and 0 < last < current else 0
        elif old:
            begin = max(reg.last, last) + 1
            gone_from = 0
        else:
            begin = current + 1
            gone_from = 0
            for seq, stored in list(self._stored.get(subject, {}).items()):
                if listener in stored.pending:
                    stored.pending.discard(listener)
                    self.ledger.confirm(subject, seq, listener)
                    self._maybe_complete(subject, seq, stored)
        if reg.inst is not None and reg.inst != inst:
            self._advise(REGISTRATION_MOVED + listener, name=listener)
        reg.inst = inst
        reg.last = begin - 1
        reg.next_request = now + self.request_interval
        self.ledger.put_reg(subject, listener, reg.last)
        self._advise(REGISTRATION_REQUEST + subject, subject=subject, listener=listener)
        if gone_from:
            # A listener that confirmed up to ``last`` elsewhere (this sender lost or never
            # had the agreement): what it missed up to now is not kept here.
            begin = gone_from
            self._control("REG_ACK", listener, subject=subject, begin=begin)
            self._control("UNAVAILABLE", listener, subject=subject, first=begin, last=current)
            return
        self._control("REG_ACK", listener, subject=subject, begin=begin)
        self._resend(listener, subject, begin, current, now)

    def _resend(self, listener: str, subject: str, first: int, last: int, now: float) -> None:
        """Send ``first``..``last`` of ``subject`` to ``listener`` again: the stored ones as
        DATA, the ranges no longer kept as UNAVAILABLE."""
        if last < first:
            return
        stored = self._stored.get(subject, {})
        gap_from = first
        for seq in range(first, last + 1) if last - first < len(stored) else sorted(
                s for s in stored if first <= s <= last):
            st = stored.get(seq)
            if st is None:
                continue
            if seq > gap_from:
                self._control("UNAVAILABLE", listener, subject=subject, first=gap_from,
                              last=seq - 1)
            st.sent_at = now
            self._control("DATA", listener, msg=st.data)
            gap_from = seq + 1
            reg = self._regs.get(subject, {}).get(listener)
            if reg is not None and not reg.next_request:
                reg.next_request = now + self.request_interval
        if gap_from <= last:
            self._control("UNAVAILABLE", listener, subject=subject, first=gap_from, last=last)

    def _on_confirm(self, listener: str, subject: str, upto: int, req: bool, now: float) -> None:
        reg = self._regs.get(subject, {}).get(listener)
        if reg is None:
            return
        if upto > reg.last:
            reg.last = upto
            self.ledger.put_reg(subject, listener, upto)
        stored = self._stored.get(subject)
        if not stored:
            return
        done = []
        for seq in stored:  # in sequence order: as sent, or as read back from the ledger
            if seq > upto:
                break
            done.append(seq)
        for seq in done:
            st = stored[seq]
            if listener in st.pending:
                st.pending.discard(listener)
                self.ledger.confirm(subject, seq, listener)
                self._advise(DELIVERY_CONFIRM + subject, subject=subject, listener=listener,
                             seqno=seq)
                self._maybe_complete(subject, seq, st)
        if req:  # it answers a CONFIRM_REQ: send again what it still lacks
            late = [s for s, st in stored.items()
                    if s > upto and listener in st.pending
                    and st.sent_at <= now - self.request_interval]
            for seq in late:
                stored[seq].sent_at = now
                self._control("DATA", listener, msg=stored[seq].data)

    def _maybe_complete(self, subject: str, seq: int, stored: StoredMessage) -> None:
        """Delete a message no listener owes a confirmation for any more (each confirmed it,
        or the agreement ended): ``DELIVERY.COMPLETE``."""
        if stored.pending:
            return
        self._stored[subject].pop(seq, None)
        self.ledger.delete_message(subject, seq)
        self._advise(DELIVERY_COMPLETE + subject, subject=subject, seqno=seq)

    def _check_owed(self, subject: str, listener: str, reg: _Reg, now: float) -> None:
        """Ask ``listener`` for its confirmation if it owes one for longer than the interval;
        set when to check again."""
        oldest = None
        for stored in self._stored.get(subject, {}).values():
            if listener in stored.pending:
                oldest = stored.sent_at if oldest is None else min(oldest, stored.sent_at)
                if oldest <= now - self.request_interval:
                    break
        if oldest is None:
            reg.next_request = 0.0
        elif oldest <= now - self.request_interval:
            reg.next_request = now + self.request_interval
            self._control("CONFIRM_REQ", listener, subject=subject)
            self._advise(DELIVERY_NO_RESPONSE + listener, listener=listener)
        else:
            reg.next_request = oldest + self.request_interval

    def _failed(self, subject: str, seq: int, stored: StoredMessage) -> None:
        adv = advisory_message(DELIVERY_FAILED + subject, {"subject": subject, "seqno": seq})
        try:
            data = decode(stored.data)
            data.send_subject = None
            data.cm = None
            adv.add("data", data, RvType.MSG)
        except (FormatError, ValueError):
            pass
        for listener in sorted(stored.pending):
            adv.add("listener", listener, RvType.STRING)
        self._events.append(CmAdvisory(adv.send_subject or "", {"subject": subject,
                                                                "seqno": seq}, adv))

    # -- control messages --------------------------------------------------------------------

    def _control(self, op: str, peer: str, /, **fields: object) -> None:
        msg = Message(CONTROL_PREFIX + peer)
        msg.add("op", op, RvType.STRING)
        msg.add("from", self.name, RvType.STRING)
        msg.add("inst", self.inst, RvType.STRING)
        for name, value in fields.items():
            msg.add(name, value, _CONTROL_TYPES.get(name, RvType.STRING))
        self._out.append(msg)

    def _on_control(self, msg: Message, now: float) -> None:
        try:
            op = msg.get("op")
            peer = msg.get("from")
            inst = msg.get("inst")
            subject = msg.get("subject") if "subject" in msg else ""
        except (KeyError, ValueError):
            return  # not a control message of this protocol: ignored
        if not isinstance(op, str) or not isinstance(peer, str) or not isinstance(inst, str):
            return
        if op == "HELLO":
            if peer == self.name and inst != self.inst:
                self._advise(REGISTRATION_COLLISION + self.name, name=self.name)
                if not _get(msg, "reply", False):
                    self._control("HELLO", self.name, reply=True)
            return
        if peer == self.name or not isinstance(subject, str):
            return
        if op == "DATA":
            data = msg.get("msg") if "msg" in msg else None
            if isinstance(data, bytes):
                try:
                    inner = decode(data)
                except (FormatError, ValueError):
                    return
                if inner.cm is not None and inner.cm.sender == peer and inner.send_subject:
                    self._on_labeled(inner, inner.cm, inner.send_subject, now)
            return
        if op == "REG_REQ":
            self._on_register_request(peer, inst, subject, _get(msg, "last", 0),
                                      bool(_get(msg, "old", False)), now)
        elif op == "REG_ACK":
            self._on_registered(peer, subject, _get(msg, "begin", 1), now)
        elif op in ("REG_DENY", "NOT_CERT"):
            src = self._sources.get((peer, subject))
            if src is not None and src.state in (REQUESTING, CERTIFIED, KNOWN):
                self._advise(REGISTRATION_NOT_CERTIFIED + subject, subject=subject,
                             sender=peer)
                self._give_up(peer, subject, src)
        elif op == "CONFIRM":
            self._on_confirm(peer, subject, _get(msg, "upto", 0), bool(_get(msg, "req", False)),
                             now)
        elif op == "CONFIRM_REQ":
            src = self._sources.get((peer, subject))
            if src is not None and src.state == CERTIFIED:
                self._control("CONFIRM", peer, subject=subject, upto=src.confirmed, req=True)
            elif ((src is None or src.state == KNOWN)
                  and any(matches(p, subject) for p in self._listening)):
                # A sender keeps messages for us (we were anticipated, or it remembers us
                # from an earlier run) and we have heard none of them: discovered this way.
                if src is None:
                    src = self._sources[(peer, subject)] = _Source(REQUESTING)
                    self._advise(REGISTRATION_DISCOVERY + subject, subject=subject,
                                 sender=peer)
                self._request(peer, subject, src, now)
        elif op == "RETRANS_REQ":
            if self._regs.get(subject, {}).get(peer) is not None:
                first, last = _get(msg, "first", 0), _get(msg, "last", 0)
                self._resend(peer, subject, max(first, 1),
                             min(last, self._seqs.get(subject, 0)), now)
        elif op == "UNAVAILABLE":
            self._on_unavailable(peer, subject, _get(msg, "first", 0), _get(msg, "last", 0), now)
        elif op == "CLOSE":
            reg = self._regs.get(subject, {}).get(peer)
            if reg is not None:
                self.remove_listener(subject, peer, notify=False)

    def _advise(self, adv_subject: str, /, **fields: object) -> None:
        self._events.append(CmAdvisory(adv_subject, fields))


def _get(msg: Message, name: str, default: int) -> int:
    value = msg.get(name) if name in msg else default
    return int(value) if isinstance(value, (int, bool)) else default

