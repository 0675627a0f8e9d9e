"""The amqp transport's export side: its sender links and the outcomes of what it sent.

How this works. :class:`Exports` belongs to one :class:`~transports.amqp.AmqpTransport`
and lives as long as it; its links live as long as one connection. An export goes out on
the sender link of its far address (``address_prefix_topic`` + name), attached on the first
export to it -- at most :data:`MAX_SENDERS` kept, the oldest idle one closed -- or, with
``anonymous_relay = true`` and a peer that offers ``ANONYMOUS-RELAY``, on one link with no
target address, each message's ``to`` naming its far address. Without link credit nothing
is sent: the export returns to the spool (``RetryLater``) and its binding waits for the
link's next flow. The peer's outcome settles it (AMQP 1.0 §3.4): ``accepted`` confirms it to
the core (``settle = at-least-once``; at-most-once sends presettled and confirms at once),
``rejected`` fails it, ``released`` / ``modified`` put it back in the spool with its binding
paused :data:`RELEASED_RETRY` s. A detached link gives its unconfirmed exports back, in
order, to be sent again; a refused address fails its exports for ``reconnect_min``; a
refused or ended relay means a link per address from then on.

Runs on the loop, called by the transport's event dispatch; never awaits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from cproton import PN_ACCEPTED, PN_REJECTED, ffi, lib
from proton import Delivery, Link

from adapters.amqp.driver import encode_message
from gateway.errors import GatewayError
from gateway.message import TEMP_PREFIX, TOPIC, Destination, Message
from mappings.amqp_address import TOPIC_PREFIX
from transports.amqp_links import PROP_HOPS, PROP_ORIGIN, SenderLink, far_address
from transports.base import ExportBinding, RetryLater

if TYPE_CHECKING:
    from gateway.consumer import Delivery as CoreDelivery
    from transports.amqp import AmqpTransport

log = logging.getLogger("transports.amqp")

RELEASED_RETRY = 1.0  # seconds a binding pauses after the far side released an export
MAX_SENDERS = 1000  # sender links kept; past this the oldest idle one is closed
RELAY = ""  # the key of the anonymous-relay sender link in ``senders`` (no core name is "")

_RELEASED, _MODIFIED = Delivery.RELEASED, Delivery.MODIFIED
_wrap: Any = Delivery.wrap


class Exports:
    """The sender links of one amqp transport, and the exports waiting on them."""

    def __init__(self, t: AmqpTransport) -> None:
        self.t = t
        self.senders: dict[str, SenderLink] = {}  # core name (or RELAY) → its link
        self.use_relay = bool(t.params.get("anonymous_relay"))
        self.relay = False  # this connection exports through the peer's anonymous relay
        self.retry_timers: dict[str, asyncio.TimerHandle] = {}  # binding pattern → its pause

    def drop(self) -> None:
        """The connection is gone, and its links with it (the transport marks them closed;
        base gives their exports back)."""
        self.senders.clear()
        for timer in self.retry_timers.values():
            timer.cancel()
        self.retry_timers.clear()

    def _sender(self, name: str) -> SenderLink:
        if self.relay:
            return self.senders.get(RELAY) or self._open(RELAY, None)
        h = self.senders.get(name)
        if h is not None:
            if h.refused is None:
                return h
            if time.monotonic() < h.refused_until:
                raise GatewayError(f"the far side refused {name}: {h.refused}")
            del self.senders[name]
        if len(self.senders) >= MAX_SENDERS:
            for old in list(self.senders.values()):
                if not old.pending and not old.blocked:
                    old.closed = True
                    del self.senders[old.name]
                    self.t.by_link.pop(old.raw, None)
                    old.link.close()
                    break
        return self._open(name, far_address(self.t.topic_prefix, name))

    def _open(self, name: str, address: str | None) -> SenderLink:
        """Attach the sender link of ``name``'s far address, or with no address (``None``)
        the relay's, whose transfers the peer routes by their ``to``."""
        t = self.t
        link = t.pn_session.sender(t._next_link_name("out", address or "relay"))
        link.target.address = address
        if address is not None:
            link.source.address = str(Destination(TOPIC, name))
        link.snd_settle_mode = Link.SND_SETTLED if t.presettle else Link.SND_UNSETTLED
        h = SenderLink(link, name)
        self.senders[name] = h
        t.by_link[h.raw] = h
        link.open()
        t._changed()
        return h

    def export(self, d: CoreDelivery, binding: ExportBinding) -> bool:
        t = self.t
        if t.closed or t.pn_session is None or t.write_paused:
            raise RetryLater("not connected")
        msg = d.msg
        dest = msg.destination
        assert dest is not None
        h = self._sender(dest.name)
        raw = h.raw
        if lib.pn_link_credit(raw) <= 0:
            h.blocked.add(binding)
            raise RetryLater("no link credit")
        data = self._encode(msg, d.count, far_address(t.topic_prefix, dest.name)
                            if h.name == RELAY else None)
        tag = str(d.tag).encode()
        dlv = lib.pn_delivery(raw, (len(tag), ffi.from_buffer(tag)))
        lib.pn_link_send(raw, ffi.from_buffer(data), len(data))
        lib.pn_link_advance(raw)
        t._changed()
        if t.presettle:
            lib.pn_delivery_settle(dlv)
            return True
        h.pending[dlv] = (d, binding)
        return False

    def _encode(self, msg: Message, count: int, to: str | None) -> bytes:
        """The transfer's bytes: the adapter's mapping plus the loop markers, carried as
        ``JMS_GW_AMQP_MA_`` properties so that the fast path can write them too. ``to``:
        the far address an anonymous relay routes by, when it is not the mapping's
        ``topic://name``."""
        t = self.t
        if to is not None and msg.destination is not None and \
                to == TOPIC_PREFIX + msg.destination.name:
            to = None
        out = t.outgoing(msg)
        if out is msg:
            out = msg.copy()  # the loop markers go into the copy's properties
        props = out.properties
        props[PROP_ORIGIN] = msg.origin or t.broker.id
        props[PROP_HOPS] = msg.hops
        reply = out.reply_to
        finish = None
        if reply is not None or to is not None:

            def finish(pm: Any) -> None:  # the far addresses, which the mapping does not know
                if to is not None:
                    pm.address = to
                if reply is not None:
                    # a route back (TIBCO EMS User's Guide, chapter "Working With TIBCO
                    # Rendezvous", "Export Issues")
                    if reply.name.startswith(TEMP_PREFIX):
                        pm.reply_to = t.replies.route(reply, t._reply_address)
                    else:
                        prefix = t.topic_prefix if reply.kind is TOPIC else t.queue_prefix
                        pm.reply_to = prefix + reply.name

        return encode_message(out, t.broker.mappings, transport=t.name, delivery_count=count,
                              now_ms=t.broker.now(), finish=finish)

    def on_disposition(self, h: SenderLink, dlv: Any) -> None:
        """The peer's outcome for an export (AMQP 1.0 §3.4)."""
        if not lib.pn_delivery_updated(dlv):
            return
        entry = h.pending.pop(dlv, None)
        if entry is None:
            lib.pn_delivery_settle(dlv)
            return
        d, binding = entry
        t = self.t
        state = lib.pn_delivery_remote_state(dlv)
        if state == PN_ACCEPTED or (state == 0 and lib.pn_delivery_settled(dlv)):
            lib.pn_delivery_settle(dlv)
            t.confirmed(d, binding)
        elif state == PN_REJECTED:
            cond = _wrap(dlv).remote.condition
            lib.pn_delivery_settle(dlv)
            t.failed(d, binding, f"rejected: {cond.name}: {cond.description}" if cond
                     else "rejected")
        elif state == _RELEASED or state == _MODIFIED:
            lib.pn_delivery_settle(dlv)
            self._retry(d, binding)
        else:  # received (not an outcome): keep waiting for the outcome's own event
            h.pending[dlv] = entry
        t._changed()

    def _retry(self, d: CoreDelivery, binding: ExportBinding) -> None:
        """Released / modified: back to the spool, and its binding waits a moment so that a
        peer that keeps releasing does not make a busy loop."""
        binding.inflight -= 1
        self.t.session.release(d, count_delivery=False)
        if binding.consumer is None:
            return
        binding.consumer.core.pause()
        old = self.retry_timers.pop(binding.pattern, None)
        if old is not None:
            old.cancel()
        self.retry_timers[binding.pattern] = self.t.loop.call_later(
            RELEASED_RETRY, self._retry_done, binding)

    def _retry_done(self, binding: ExportBinding) -> None:
        self.retry_timers.pop(binding.pattern, None)
        t = self.t
        if t.state == "up" and not t.write_paused and binding.consumer is not None:
            binding.consumer.core.resume()

    def on_flow(self, h: SenderLink) -> None:
        link = h.link
        if link.credit > 0:
            self._unblock(h)
        if link.drain_mode and link.credit > 0:
            link.drained()  # nothing waits in proton: we only send with credit (§2.6.7)

    def detached(self, h: SenderLink, reason: str) -> None:
        """The peer detached one of our sender links: its unconfirmed exports go back to be
        sent again (at least once), in order."""
        t = self.t
        if self.senders.get(h.name) is h:
            if h.name == RELAY:  # refused or ended: a link per far address from now on
                del self.senders[RELAY]
                self.relay = False
                log.warning("transport %s: the peer ended the anonymous relay link (%s); "
                            "exporting with a link per address", t.name, reason)
            elif h.refused is not None:  # the attach was refused: exports to it fail a while
                h.refused = reason
                h.refused_until = time.monotonic() + float(t.params.get("reconnect_min", 1.0))
            else:
                del self.senders[h.name]
        pending = list(h.pending.values())
        h.pending.clear()
        for _, binding in pending:
            binding.inflight -= 1
        t.session.release_all([d for d, _ in pending], count_delivery=False)
        self._unblock(h)

    def _unblock(self, h: SenderLink) -> None:
        blocked = h.blocked
        if not blocked:
            return
        h.blocked = set()
        t = self.t
        if t.state != "up" or t.write_paused:
            return
        for b in blocked:
            if b.consumer is not None and b.pattern not in self.retry_timers:
                b.consumer.core.resume()
