"""What an endpoint keeps in the store rather than in memory: a queue's swapped messages and a
durable subscription's tail; and what a message held in memory costs.

How this works. Every message an endpoint holds is charged to ``broker.memory``
(``max_msg_memory``) at :func:`charge`: its size estimate plus :data:`MESSAGE_OVERHEAD`. A queue
may *swap* its pending persistent messages (EMS ``msg_swapping``, EMS User's Guide,
"tibemsd.conf", Connection and Memory Parameters): the body leaves memory (the store has it)
and a :class:`Swapped` marker takes its place, so the message object stays where it was in
``pending`` with its headers and properties -- order, priority, expiry and selectors work on
it unchanged. Dispatch that meets a swapped message asks the store for it and the next swapped
ones in delivery order (:func:`load`) and goes on when they are back. Swapping starts from the
back of the queue (lowest priority, newest), so what is delivered next stays in memory
(:func:`swap_out`, which the broker's swap pass calls).

A durable subscription cannot swap that way (a persistent topic message is one object shared
by every subscription it reached), so it keeps a *tail* in the store instead: once it holds
``destination_backlog_swapout`` pending messages in memory (or memory is past the broker's swap
mark), a newly routed persistent message only gets its store entry and is counted
(:meth:`Endpoint.put_tail`: ``count`` and ``bytes`` include it, ``broker.memory`` does not),
and so is every persistent message after it while the tail lasts, so that the store's order is
kept. When the messages in memory run below half of that and the subscription has consumers,
:func:`read_tail` asks the store for the next batch of its entries past the last one it has,
with their messages and delivery counts, through the store's writer thread; they join
``pending`` and dispatch goes on. Each message read back is an object of its own, held by this
subscription alone. Non-persistent messages stay in memory meanwhile and may so pass
persistent ones routed before them: MQTT 5.0 §4.6 asks for order only per topic and QoS (QoS 0
is non-persistent, QoS 1 and 2 persistent), and JMS 1.1 §4.4.10 leaves the order between
delivery modes undefined. Priorities order what is in memory; the tail comes back in the order
it was routed.

The functions work on an :class:`~gateway.endpoint.Endpoint`'s own state, as its methods
would (they take it first, and use its ``_remove`` and ``_hold``). Everything here runs on the
loop thread and never awaits; the store's reads come back on the loop.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from gateway.message import PRIORITIES, DeliveryMode, Message, body_size, preserved

if TYPE_CHECKING:
    from gateway.endpoint import Endpoint

log = logging.getLogger("gateway.endpoint")  # what it logs is the endpoints'

PERSISTENT = DeliveryMode.PERSISTENT

# What a message held in memory costs beyond ``Message.size`` (its body and property text plus
# 64 bytes): measured with tracemalloc for a 1 KB persistent STOMP message on a queue (CPython
# 3.11, 64-bit): the Message object with its 24 slots 224 B, its message id and trace id
# strings 136 B, the property dict 64 B, the timestamp, store id and other int objects 96 B,
# the bytes object's header 33 B, the deque slot 8 B: about 560 B in all, 64 of them already in
# ``size``. Without it a queue of small messages used several times the memory it was charged.
MESSAGE_OVERHEAD: Final = 480
# Swapped messages read back from the store per read (one round trip through the writer).
LOAD_BATCH = 512
# Most and fewest entries of a durable subscription's tail read back at once (one round trip
# through the store's writer thread each).
TAIL_BATCH = 2048
TAIL_MIN = 64


class Swapped:
    """The body of a swapped message: it is in the store; ``nbytes`` is what left memory."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


# Markers by size, shared: most messages of a deep queue have bodies of a few sizes, and a
# marker of its own would cost each swapped message another 48 bytes.
_MARKERS: dict[int, Swapped] = {}
MAX_MARKERS = 4096


def swapped_marker(nbytes: int) -> Swapped:
    marker = _MARKERS.get(nbytes)
    if marker is None:
        marker = Swapped(nbytes)
        if len(_MARKERS) < MAX_MARKERS:
            _MARKERS[nbytes] = marker
    return marker


def is_swapped(msg: Message) -> bool:
    return type(msg.body) is Swapped


def charge(msg: Message) -> int:
    """What ``msg`` costs in ``broker.memory`` while an endpoint holds it."""
    body = msg.body
    if type(body) is Swapped:
        return msg.size + MESSAGE_OVERHEAD - body.nbytes
    return msg.size + MESSAGE_OVERHEAD



# -- message swapping (queues) ---------------------------------------------------------------


def swap_out(ep: Endpoint, want: int, count: int, budget: int, deep: bool) -> tuple[int, int]:
    """Drop the bodies of pending persistent messages until ``want`` bytes are freed and
    ``count`` messages swapped, or ``budget`` messages were looked at; from the back:
    lowest priority, newest first. Returns (bytes freed, messages looked at).

    Without ``deep``, each priority's scan stops at its first swapped message: what lies
    before it was looked at by an earlier pass (or read back to be delivered next), so a
    pass costs what arrived since the last one. Only a stored message that no other
    endpoint holds may go (a queue's own), and not one to be kept when undeliverable
    (``undeliverable`` copies its body)."""
    freed = seen = n = 0
    for p in range(PRIORITIES):
        for msg in reversed(ep.pending[p]):
            body = msg.body
            if type(body) is Swapped:
                if not deep:
                    break
                continue
            seen += 1
            if (msg.store_id and msg.refs == 1 and msg.delivery_mode == PERSISTENT
                    and not preserved(msg)):
                nbytes = body_size(body)
                msg.body = swapped_marker(nbytes)
                msg.wire = None
                freed += nbytes
                n += 1
                if freed >= want and n >= count:
                    break
            if seen >= budget:
                break
        if (freed >= want and n >= count) or seen >= budget:
            break
    else:
        ep.fresh = 0  # looked at everything new
    ep.swapped += n
    broker = ep.broker
    broker.swapped += n
    broker.stats["swapped_out"] += n
    broker.memory -= freed
    return freed, seen


def _swapped_in_order(ep: Endpoint, first: Message | None) -> list[Message]:
    """Up to :data:`LOAD_BATCH` swapped pending messages in delivery order (from
    ``first`` on, if given, in its priority)."""
    out: list[Message] = []
    for p in range(PRIORITIES - 1, -1, -1):
        if first is not None and p > first.priority:
            continue
        started = first is None or first.priority > p
        for msg in ep.pending[p]:
            if not started:
                if msg is not first:
                    continue
                started = True
            if type(msg.body) is Swapped:
                out.append(msg)
                if len(out) >= LOAD_BATCH:
                    return out
    return out


def load(ep: Endpoint, first: Message | None = None) -> None:
    """Ask the store for the next swapped messages; dispatch goes on when they are back."""
    if ep.loading or ep.closed:
        return
    msgs = _swapped_in_order(ep, first)
    if not msgs:
        return
    ep.loading = True
    ep.broker.store.read_messages([m.store_id for m in msgs],
                                  lambda found: _loaded(ep, msgs, found))


def _loaded(ep: Endpoint, msgs: list[Message], found: dict[int, Message]) -> None:
    """Runs on the loop: swapped messages are back from the store."""
    ep.loading = False
    if ep.closed:
        return
    lost = _restore_bodies(ep, msgs, found)
    for msg in lost:
        _drop_unreadable(ep, msg)
    ep.dispatch()


def load_now(ep: Endpoint, msgs: list[Message]) -> None:
    """Read swapped ``msgs`` back at once (blocks on the store: rare paths only)."""
    want = [m for m in msgs if type(m.body) is Swapped]
    if want:
        found = ep.broker.store.read_now([m.store_id for m in want])
        for msg in _restore_bodies(ep, want, found):
            _drop_unreadable(ep, msg)


def with_bodies(ep: Endpoint, msgs: list[Message]) -> list[Message]:
    """``msgs`` with each swapped one replaced by a copy that has its body (read from the
    store at once; the swapped message itself stays out of memory): for a queue
    browser's snapshot. A message the store no longer has is left out."""
    want = [m.store_id for m in msgs if type(m.body) is Swapped]
    if not want:
        return msgs
    found = ep.broker.store.read_now(want)
    out: list[Message] = []
    for msg in msgs:
        if type(msg.body) is Swapped:
            stored = found.get(msg.store_id)
            if stored is None:
                continue
            copy = msg.copy()
            copy.body = stored.body
            msg = copy
        out.append(msg)
    return out


def _restore_bodies(ep: Endpoint, msgs: list[Message], found: dict[int, Message]) -> list[Message]:
    """Put the bodies read back on ``msgs``; returns those still swapped here whose row
    was not found."""
    broker = ep.broker
    lost: list[Message] = []
    n = 0
    for msg in msgs:
        body = msg.body
        if type(body) is not Swapped or not msg.store_id:
            continue  # loaded already, or gone from here meanwhile (acked, purged, expired)
        stored = found.get(msg.store_id)
        if stored is None:
            lost.append(msg)
            continue
        msg.body = stored.body
        broker.memory += body.nbytes
        n += 1
    ep.swapped -= n
    broker.swapped -= n
    broker.stats["swapped_in"] += n
    return lost


def _drop_unreadable(ep: Endpoint, msg: Message) -> None:
    """A swapped message the store no longer gives back: it cannot be delivered."""
    dq = ep.pending[msg.priority]
    if msg not in dq:
        return
    dq.remove(msg)
    ep.npending -= 1
    count = ep.counts.get(msg, 0)
    ep._remove(msg)
    ep.broker.undeliverable(msg, ep, "store_read_failed", count)


# -- a durable subscription's tail in the store ---------------------------------------------


def read_tail(ep: Endpoint) -> None:
    """Ask the store for the next entries of the tail; they join ``pending`` when back."""
    if ep.tail_reading or ep.closed or not ep.tail:
        return
    broker = ep.broker
    want = min(ep.tail, max(broker.tail_at - ep.npending, TAIL_MIN), TAIL_BATCH)
    ep.tail_reading = True
    store = broker.store
    store.commit(None)  # an entry added in the unit still open is read too
    store.read_entries(ep.key, ep.tail_after, want,
                       lambda rows: _tail_read(ep, rows, want))


def _tail_read(ep: Endpoint, rows: list[tuple[int, int, Message | None]], want: int) -> None:
    """Runs on the loop: entries of the tail are back from the store, in order."""
    ep.tail_reading = False
    if ep.closed or not ep.tail:
        return
    broker = ep.broker
    now = broker.now()
    pending = ep.pending
    lost = 0
    for sid, dcount, msg in rows:
        # ``bytes`` counted each message of the tail with its size at routing; one read
        # back has its size estimated again (an adapter's estimate may differ), so each
        # takes its share of what the tail counted, and ``bytes`` its new size.
        share = ep.tail_bytes // ep.tail if ep.tail > 1 else ep.tail_bytes
        ep.tail_after = sid
        ep.tail -= 1
        ep.tail_bytes -= share
        if msg is None:  # does not decode (logged by the store): cannot be delivered
            lost += 1
            ep.bytes -= share
            broker.store.remove_entry(ep.key, sid)
            broker.store.delete_unreferenced(sid)
            continue
        ep.bytes += msg.size - share
        msg.refs = 1
        broker.memory += msg.size + MESSAGE_OVERHEAD
        if dcount:
            ep.counts[msg] = dcount
        if msg.expires_at:
            ep.expiring += 1
        if msg.delivery_time > now:
            ep._hold(msg, msg.delivery_time)
        else:
            pending[msg.priority].append(msg)
            ep.npending += 1
            if ep.npending == ep.laggard_at:
                broker.laggard_seen(ep)
        if not ep.tail:
            break
    if len(rows) < want and ep.tail:
        lost += ep.tail  # the store has no more of them (a failed write)
        ep.bytes -= ep.tail_bytes
        ep.tail = ep.tail_bytes = 0
    if lost:
        ep.count -= lost
        dropped_from_store(ep, lost)
    if ep.npending and not ep.dispatching:
        ep.dispatch()
    elif ep.tail and ep.npending < broker.tail_low and ep.consumers:
        read_tail(ep)


def dropped_from_store(ep: Endpoint, n: int) -> None:
    """``n`` messages of the tail the store did not give back: counted and logged."""
    broker = ep.broker
    broker.stats["dropped"] += n
    broker.store.commit(None)
    log.error("%s: %d stored messages could not be read back and are dropped", ep.key, n)
