"""Reply destinations across a transport, both ways: what a far-side responder answers.

EMS carries ``JMSReplyTo`` across a transport (TIBCO EMS User's Guide, chapter "Working With
TIBCO Rendezvous", "Export Issues" and "JMSReplyTo"), and so does every transport here, with
the two classes of this module, one per direction; each :class:`~transports.base.Transport`
holds one of each (``replies`` and ``reply_temporaries``).

* **Exports** (:class:`ReplyRoutes`): a temporary reply destination of an exported message
  stands on the far side as a name the transport chooses and subscribes to; what comes back
  to that name is imported to the temporary destination while it exists.
* **Imports** (:class:`ReplyTemporaries`): a far-side reply name of an imported message
  stands in the gateway as a temporary topic, owned by the transport's core connection and
  deleted after ``temp_destination_timeout`` seconds unused; what is published to it is sent
  to the far-side name.

Both keep a bounded number of names and check them on a loop timer (never per message).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway.facade import Core
from gateway.message import QUEUE, TOPIC, Destination

if TYPE_CHECKING:
    from gateway.consumer import Delivery
    from transports.base import Transport

log = logging.getLogger("transports")

MAX_REPLY_ROUTES = 10_000  # temporary reply destinations with a far-side name, per transport
MAX_REPLY_TEMPORARIES = 10_000  # far-side reply names standing as temporary topics, per transport
REPLY_SWEEP = 5.0  # seconds between checks that the routes' temporary destinations exist


class ReplyRoutes:
    """Temporary reply destinations of exported messages, standing as far-side names.

    EMS arranges a temporary ``JMSReplyTo`` across a transport (EMS User's Guide, chapter
    "Working With TIBCO Rendezvous", "Export Issues"): the exported message names a far-side
    destination, and what a far-side responder sends there comes back to the temporary
    destination while it exists. The transport chooses the far-side name (:meth:`route` calls
    ``far_name`` with ``gw-reply``, the gateway id and a key per temporary destination) and
    subscribes to it (``subscribe``) when the route is made and again after every reconnect
    (:attr:`names`). An import from a route's name goes to :meth:`target`; a route whose
    destination is gone is dropped (``unsubscribe``) when a reply comes or at the next
    :meth:`sweep`, and at most :data:`MAX_REPLY_ROUTES` are kept, oldest dropped first.
    """

    __slots__ = ("broker", "subscribe", "unsubscribe", "by_name", "by_dest", "timer")

    def __init__(self, broker: Core, subscribe: Callable[[str], None],
                 unsubscribe: Callable[[str], None]) -> None:
        self.broker = broker
        self.subscribe = subscribe
        self.unsubscribe = unsubscribe
        self.by_name: dict[str, Destination] = {}
        self.by_dest: dict[Destination, str] = {}
        self.timer: asyncio.TimerHandle | None = None

    @property
    def names(self) -> list[str]:
        return list(self.by_name)

    def route(self, rt: Destination, far_name: Callable[[str, str, str], str]) -> str:
        """The far-side name for temporary destination ``rt`` (made on first use)."""
        name = self.by_dest.get(rt)
        if name is None:
            key = ("q" if rt.kind == QUEUE else "t") + rt.name.rsplit(".", 1)[-1]
            name = far_name("gw-reply", self.broker.id, key)
            self.by_dest[rt] = name
            self.by_name[name] = rt
            if len(self.by_name) > MAX_REPLY_ROUTES:
                self.drop(next(iter(self.by_name)))
            self.subscribe(name)
            if self.timer is None:
                self.timer = self.broker.loop.call_later(REPLY_SWEEP, self.sweep)
        return name

    def __contains__(self, name: str) -> bool:
        return name in self.by_name

    def target(self, name: str) -> Destination | None:
        """The temporary destination of route ``name``, or None (route dropped) when it is
        gone from the gateway."""
        dest = self.by_name[name]
        if self.broker.exists(dest):
            return dest
        self.drop(name)
        return None

    def sweep(self) -> None:
        """Drop the routes whose temporary destination is gone (every :data:`REPLY_SWEEP`
        seconds while there are routes), so their far-side subscriptions end even when no
        reply comes."""
        self.timer = None
        for name in list(self.by_name):
            self.target(name)
        if self.by_name:
            self.timer = self.broker.loop.call_later(REPLY_SWEEP, self.sweep)

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def drop(self, name: str) -> None:
        dest = self.by_name.pop(name, None)
        if dest is not None:
            self.by_dest.pop(dest, None)
            self.unsubscribe(name)


class ReplyTemporaries:
    """Far-side reply names of imported messages, standing as temporary topics of the gateway.

    The other direction of :class:`ReplyRoutes`. EMS imports a Rendezvous reply subject that
    is an inbox as a temporary destination, and keeps it ``temp_destination_timeout`` seconds
    after its last use (TIBCO EMS User's Guide, chapter "Working With TIBCO Rendezvous",
    "JMSReplyTo" and "Configuring Transports for Rendezvous", temp_destination_timeout).
    :meth:`temporary` gives the temporary topic of a far-side name (made on first use, owned
    by the transport's core connection, then the same one for every import with that name);
    a consumer of the transport takes what is published to it (by any client or route the
    gateway allows to reply to a temporary destination) and hands each message to the
    transport's :meth:`~Transport.send_reply` for that far-side name. Both a request and a
    reply count as a use. The names are kept in the order of their last use, so one timer,
    set for the least recently used, deletes the temporary topics unused for the timeout;
    at most :data:`MAX_REPLY_TEMPORARIES` are kept (the least recently used deleted first),
    and :meth:`close` (at disconnect) deletes them all.
    """

    __slots__ = ("transport", "timeout", "by_name", "last_use", "timer")

    def __init__(self, transport: Transport, timeout: float) -> None:
        self.transport = transport
        self.timeout = timeout
        # far-side name → (temporary topic, its consumer)
        self.by_name: dict[str, tuple[Destination, Any]] = {}
        # far-side name → loop time of its last use, least recently used first
        self.last_use: dict[str, float] = {}
        self.timer: asyncio.TimerHandle | None = None

    def temporary(self, name: str) -> Destination:
        """The temporary topic standing for far-side reply name ``name`` (a use of it)."""
        t = self.transport
        loop = t.broker.loop
        entry = self.by_name.get(name)
        if entry is None:
            dest = t.broker.create_temporary(t.core, TOPIC)
            consumer = t.session.consumer(dest, listener=lambda d: self._reply(d, name))
            entry = self.by_name[name] = (dest, consumer)
            if len(self.by_name) > MAX_REPLY_TEMPORARIES:
                self.delete(next(iter(self.last_use)))
            if self.timer is None:
                self.timer = loop.call_later(self.timeout, self.sweep)
        else:
            del self.last_use[name]  # to the end: the most recently used
        self.last_use[name] = loop.time()
        return entry[0]

    def __len__(self) -> int:
        return len(self.by_name)

    def _reply(self, d: Delivery, name: str) -> None:
        t = self.transport
        if self.last_use.pop(name, None) is not None:
            self.last_use[name] = t.broker.loop.time()
        try:
            t.send_reply(d.msg, name)
        except Exception as exc:  # noqa: BLE001 - a reply the far side cannot take
            t.stats["failed"] += 1
            log.warning("transport %s: cannot send the reply %s to %s: %s", t.name,
                        d.msg.message_id, name, exc)
            t.session.reject(d, "reply failed")
            return
        t.stats["exported"] += 1
        t._record("export", d.msg, far=(None, name))
        t.session.ack(d)

    def sweep(self) -> None:
        """Delete the temporary topics unused for :attr:`timeout` seconds; set the timer for
        the next one due."""
        self.timer = None
        loop = self.transport.broker.loop
        now = loop.time()
        for name, used in list(self.last_use.items()):
            if now - used < self.timeout:
                self.timer = loop.call_later(used + self.timeout - now, self.sweep)
                return
            self.delete(name)

    def delete(self, name: str) -> None:
        entry = self.by_name.pop(name, None)
        self.last_use.pop(name, None)
        if entry is not None:
            dest, consumer = entry
            consumer.close()
            self.transport.broker.delete_temporary(dest)

    def close(self) -> None:
        """Delete every temporary topic (the far side's names mean nothing any more)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        for name in list(self.by_name):
            self.delete(name)
