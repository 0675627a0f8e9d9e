"""The ``amqp`` transport: the gateway as an AMQP 1.0 client of another broker or gateway.

How this works. python-qpid-proton's *engine* does the protocol; the gateway's event loop does
the I/O through the driver the AMQP adapter's server connections use too
(:class:`adapters.amqp.driver.EngineDriver`), never through proton's ``Container`` or reactor. :meth:`AmqpTransport.connect` opens the
TCP (or TLS, ``amqps://``: asyncio's ssl, so proton sees plain bytes) connection with
``loop.create_connection``; a thin :class:`Shell` protocol hands every read to
:meth:`AmqpTransport.data_received`, and the driver pushes it into a client-mode proton
:class:`~proton.Transport` (SASL PLAIN with ``username``, else ANONYMOUS), dispatches what its
:class:`~proton.Collector` gathered to the handlers here and writes the output once. Work that
makes output between reads (an export, an import's acknowledgement) schedules one flush with
``call_soon``; heartbeats and the idle timeout (``idle_timeout``) are ``Transport.tick`` on a
``call_later``.

* Export (:class:`~transports.amqp_export.Exports`): one sender link per far address
  (``address_prefix_topic`` + name), attached on the first export to it -- or, with
  ``anonymous_relay = true`` and a peer that offers ``ANONYMOUS-RELAY`` (another gateway,
  ActiveMQ Artemis), one link with no target address, each message's ``to`` naming its far
  address; the AMQP adapter's mapping plus the message annotations ``x-opt-gw-origin`` /
  ``x-opt-gw-hops``. The core acknowledges on the peer's ``accepted`` (``settle =
  at-least-once``) or at once (presettled, ``at-most-once``); ``rejected`` →
  :meth:`Transport.failed`; ``released`` / ``modified`` → back to the spool, the binding
  paused a moment. Without link credit nothing is sent: the export returns to the spool
  (``RetryLater``) and its binding waits for the link's next flow.
* Import: one receiver link per far-side subscription, :data:`CREDIT` credit replenished as
  the core takes the messages; each transfer is accepted only once the core has it. A
  wildcard link names each message from ``to``, else ``subject`` (RabbitMQ's routing key).
  With ``durable_subscriptions`` a topic's link has a durable source under a stable link name
  (:meth:`AmqpTransport.remote_subscribe`). A resend after a lost settlement is dropped: by
  base's (trace id, destination) check for what a gateway sent, here by (message-id,
  destination) for a copy the peer marks as possibly delivered before (``_on_transfer``).
* Temporary reply-to (TIBCO EMS User's Guide, chapter "Working With TIBCO Rendezvous",
  "Export Issues"): an export whose JMSReplyTo is temporary names the far address
  ``<address_prefix_topic>gw-reply.<gateway id>.<key>`` (:class:`ReplyRoutes`); a receiver link
  from it, made with the route and after each reconnect, imports the replies into the temporary
  destination; routes whose destination is gone are dropped (checked every
  :data:`~transports.reply.REPLY_SWEEP` s, and on each reply).

The names, the RabbitMQ wildcard rule (``>`` → ``#``) and the message rules are in
``transports/README.md`` ("amqp").
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cproton import PN_ACCEPTED, PN_REJECTED, ffi, lib
from proton import (
    Condition,
    Connection,
    Delivery,
    Event,
    Link,
    SymbolList,
    Terminus,
    symbol,
)
from proton import Message as ProtonMessage
from proton import Transport as ProtonTransport

from adapters.amqp.driver import EngineDriver, decode_message, proton_to_message
from gateway import subject
from gateway.errors import GatewayError
from gateway.message import QUEUE, TOPIC, Destination, Message
from gateway.tls import make_client_context
from transports.amqp_export import RELAY, Exports
from transports.amqp_links import (
    GW_PREFIXES,
    PROP_HOPS,
    PROP_ORIGIN,
    ReceiverLink,
    SenderLink,
    Shell,
    far_address,
    maybe_redelivered,
    name_candidates,
    peer_error,
    valid_name,
)
from transports.base import DEDUP_WINDOW, ExportBinding, Transport

if TYPE_CHECKING:
    from gateway.consumer import Delivery as CoreDelivery

log = logging.getLogger("transports.amqp")

CONNECT_TIMEOUT = 10.0  # seconds for TCP, TLS, SASL and the open/begin exchange together
CREDIT = 1000  # transfers a receiver link may have granted or unconfirmed (adapter's CREDIT)
_RELAY_CAPS = SymbolList([symbol("ANONYMOUS-RELAY")])

_wrap: Any = Delivery.wrap


class AmqpTransport(Transport):
    type = "amqp"

    def __init__(self, manager: Any, tdef: Any) -> None:
        super().__init__(manager, tdef)
        p = self.params
        self.loop: asyncio.AbstractEventLoop = self.broker.loop
        self.presettle = p["settle"] == "at-most-once"
        self.topic_prefix = str(p.get("address_prefix_topic") or "")
        self.queue_prefix = str(p.get("address_prefix_queue") or "")
        self.shell: Shell | None = None
        self.pn: ProtonTransport | None = None
        self.engine: Connection | None = None
        self.pn_session: Any = None
        self.driver: EngineDriver | None = None  # the engine of the current connection
        self.opened: asyncio.Future[None] | None = None
        self.closed = True
        self.failure: str | None = None
        self.write_paused = False
        self.receivers: dict[tuple[Any, str], ReceiverLink] = {}
        self.by_link: dict[Any, SenderLink | ReceiverLink] = {}  # pn_link_t → its handler
        self.out = Exports(self)  # the sender links and what waits on them
        self.link_seq = 0
        self.durable = bool(p.get("durable_subscriptions"))
        # Temporary JMSReplyTo destinations of exports, standing as far addresses; a receiver
        # link per route (far address → its link) imports the replies.
        self.reply_links: dict[str, ReceiverLink] = {}
        # (message-id, destination) of recent imports that no gateway sent (no trace id): a
        # redelivered copy of one is the resend after a lost settlement (see _on_transfer).
        self.recent_ids: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._handlers: dict[int, Callable[[Any], None]] = {
            Event.SESSION_REMOTE_OPEN.number: self._on_begin,
            Event.LINK_FLOW.number: self._on_flow,
            Event.LINK_REMOTE_OPEN.number: self._on_attach,
            Event.LINK_REMOTE_DETACH.number: self._on_detach,
            Event.LINK_REMOTE_CLOSE.number: self._on_detach,
            Event.SESSION_REMOTE_CLOSE.number: self._on_end,
            Event.CONNECTION_REMOTE_CLOSE.number: self._on_close,
        }

    # -- connecting ---------------------------------------------------------------------------

    async def connect(self) -> None:
        self._teardown()
        p = self.params
        url = p["url"]
        self.opened = self.loop.create_future()
        self.failure = None
        ctx = None
        if url.tls:
            ctx = make_client_context(p.get("tls_cert"), p.get("tls_key"), p.get("tls_ca"))
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                shell = Shell(self)
                self.shell = shell
                await self.loop.create_connection(
                    lambda: shell, url.host, url.port, ssl=ctx,
                    server_hostname=url.host if ctx is not None else None)
                if shell.transport is None or shell.transport.is_closing():
                    raise ConnectionError("connection closed by peer")
                self._start_engine()
                await self.opened
            if self.closed:  # refused in the same read as the open
                raise ConnectionError(self.failure or "connection closed")
        except BaseException:
            self._teardown()
            raise

    def _start_engine(self) -> None:
        """Client-mode engine: SASL, open, begin (AMQP 1.0 §2.4.1, §5.3)."""
        p = self.params
        c = self.engine = Connection()
        c.container = p.get("container_id") or f"gw-{self.broker.id}-{self.name}"
        c.hostname = p["url"].host
        t = self.pn = ProtonTransport()
        t.idle_timeout = float(p.get("idle_timeout") or 0.0)
        sasl = t.sasl()
        if p.get("username") is not None:
            c.user = p["username"]
            c.password = p.get("password") or ""
            sasl.allowed_mechs("PLAIN")
            sasl.allow_insecure_mechs = True  # TLS is asyncio's: proton cannot see it
        else:
            sasl.allowed_mechs("ANONYMOUS")
        if self.out.use_relay:
            c.desired_capabilities = _RELAY_CAPS
        self.out.relay = False
        self.driver = EngineDriver(
            self.loop, t, c, write=self._write, handlers=self._handlers, links=self.by_link,
            on_delivery=self._on_delivery, on_over=self._on_over,
            on_push_error=self._on_push_error, on_internal_error=self._fail_connection,
            label=f"transport {self.name}", logger=log)
        c.open()
        self.pn_session = c.session()
        self.pn_session.open()
        self.closed = False
        self.flush()

    def _on_begin(self, ev: Any) -> None:
        fut = self.opened
        if fut is not None and not fut.done():
            fut.set_result(None)
            caps = self.engine.remote_offered_capabilities if self.engine is not None else None
            self.out.relay = self.out.use_relay and caps is not None and \
                "ANONYMOUS-RELAY" in caps
            props = self.engine.remote_properties if self.engine is not None else None
            if self.durable and props and props.get("product") == "RabbitMQ" and \
                    str(props.get("version") or "")[:1] in ("1", "2", "3"):
                log.warning("transport %s: RabbitMQ %s does not keep durable subscriptions "
                            "over AMQP 1.0: each attach makes a new durable amq.gen- queue, and "
                            "the old one keeps collecting (transports/README.md)", self.name,
                            props.get("version"))

    def gone(self, reason: str) -> None:
        """The connection is over (socket, peer's close, protocol error): forget it, give the
        in-flight exports back (base) and reconnect."""
        if self.closed:
            return
        self.closed = True
        cond = self.pn.condition if self.pn is not None else None
        if cond is not None and self.failure is None:  # SASL outcome, framing, idle timeout
            self.failure = f"{cond.name}: {cond.description}"
        self.failure = self.failure or reason
        fut = self.opened
        if fut is not None and not fut.done():
            fut.set_exception(ConnectionError(self.failure))
        if self.driver is not None:
            self.driver.close()
        self._drop_links()
        shell, self.shell = self.shell, None
        if shell is not None:
            shell.close()
        if not self.stopping:
            self.lost(self.failure)

    def _drop_links(self) -> None:
        for h in self.by_link.values():
            h.closed = True
            if isinstance(h, SenderLink):
                h.pending.clear()  # base.release_inflight gives them back
        self.by_link.clear()
        self.out.drop()
        self.receivers.clear()
        self.reply_links.clear()

    def _teardown(self) -> None:
        self.closed = True
        fut = self.opened
        if fut is not None and fut.done() and not fut.cancelled():
            fut.exception()  # retrieved: connect() raised its own error, or none was waiting
        self._drop_links()
        if self.driver is not None:
            self.driver.close()
            self.driver = None
        shell, self.shell = self.shell, None
        if shell is not None:
            shell.close()
        self.pn = self.engine = self.pn_session = None
        self.write_paused = False

    def disconnect(self) -> None:
        c = self.engine
        if c is not None and not self.closed:
            c.close()
            self.flush()
        self._teardown()

    # -- I/O ----------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.driver is not None and not self.closed:
            self.driver.receive_data(data)

    def _write(self, data: bytes) -> None:
        shell = self.shell
        if shell is not None:
            shell.write(data)

    def _changed(self) -> None:
        """Output is waiting (an export, a settlement): write it once, after this batch."""
        if self.driver is not None and not self.closed:
            self.driver.changed()

    def flush(self) -> None:
        """Dispatch, tick, and write what the engine has to send (once per batch)."""
        if self.driver is not None and not self.closed:
            self.driver.flush()

    def _on_over(self) -> None:
        """The engine's output is over: our close has been written, or the transport failed."""
        self.gone(self.failure or "connection closed")

    def _on_push_error(self, text: str) -> None:
        self.failure = self.failure or text

    def _on_delivery(self, h: SenderLink | ReceiverLink | None, dlv: Any) -> None:
        """A transfer (receiver link) or the peer's disposition (sender link); one on a link
        we closed is taken and dropped (:meth:`_settle_orphan`)."""
        if isinstance(h, ReceiverLink):
            self._on_transfer(h, dlv)
        elif h is not None:
            self.out.on_disposition(h, dlv)
        else:
            self._settle_orphan(dlv)

    def pause_writing(self) -> None:
        self.write_paused = True
        for b in self.exports.values():
            if b.consumer is not None:
                b.consumer.core.pause()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.state == "up":
            for b in self.exports.values():
                if b.consumer is not None and b.pattern not in self.out.retry_timers:
                    b.consumer.core.resume()

    # -- the peer ending things ---------------------------------------------------------------

    def _fail_connection(self, cond: Condition) -> None:
        if self.driver is not None and not self.closed:
            self.failure = self.failure or f"{cond.name}: {cond.description}"
            self.driver.fail(cond)

    def _on_close(self, ev: Any) -> None:
        self.failure = self.failure or f"closed by the peer: {peer_error(ev.connection)}"
        ev.connection.close()

    def _on_end(self, ev: Any) -> None:
        """The peer ended our session (RabbitMQ 3.10 does on a missing exchange): every link
        is gone with it, so start again on a new connection."""
        self._fail_connection(Condition(
            "amqp:internal-error", f"session ended by the peer: {peer_error(ev.session)}"))

    def _settle_orphan(self, dlv: Any) -> None:
        """A transfer on a receiver we detached (RabbitMQ answers no detach of a ``/topic``
        link): a topic subscription nobody wants any more; take it and drop it."""
        link = lib.pn_delivery_link(dlv)
        if lib.pn_link_is_receiver(link):
            if lib.pn_delivery_partial(dlv):
                return
            if lib.pn_link_current(link) == dlv:
                lib.pn_link_advance(link)
            if not lib.pn_delivery_settled(dlv):
                lib.pn_delivery_update(dlv, PN_ACCEPTED)
        lib.pn_delivery_settle(dlv)

    # -- subscriptions (import) ---------------------------------------------------------------

    def _next_link_name(self, role: str, address: str) -> str:
        self.link_seq += 1
        return f"{self.name}:{role}:{address}:{self.link_seq}"

    def remote_subscribe(self, pattern: str, kind: Any) -> None:
        """A receiver link for a far-side subscription. With ``durable_subscriptions`` a topic's
        source is a durable terminus (AMQP 1.0 §3.5.3: durability unsettled-state, expiry
        policy never) under a link name that stays the same for the subscription, so with the
        container id it names one durable subscription on the far side (as Qpid JMS's
        durable subscriber does): the peer keeps what is published while we are away and
        sends it when the link is attached again. Closing the link (the last local
        subscriber went) ends it; a lost connection does not."""
        key = (kind, pattern)
        h = self.receivers.get(key)
        if h is not None:
            h.users += 1
            return
        prefix = self.queue_prefix if kind == QUEUE else self.topic_prefix
        address = far_address(prefix, pattern)
        durable = self.durable and kind == TOPIC
        name = f"{self.name}:durable:{address}" if durable else None
        h = self._receiver(address, Destination(kind, pattern), prefix, name)
        if h is None:
            return
        if durable:
            h.link.source.durability = Terminus.DELIVERIES
            h.link.source.expiry_policy = Terminus.EXPIRE_NEVER
        self.receivers[key] = h
        self._open(h)

    def _receiver(self, address: str, target: Destination, prefix: str,
                  name: str | None = None) -> ReceiverLink | None:
        """A new receiver link from ``address`` (not yet open), or None when not connected."""
        ssn = self.pn_session
        if ssn is None or self.closed:
            return None
        link = ssn.receiver(name or self._next_link_name("in", address))
        link.source.address = address
        link.source.durability = Terminus.NONDURABLE
        link.target.address = str(target)
        link.snd_settle_mode = Link.SND_SETTLED if self.presettle else Link.SND_UNSETTLED
        link.rcv_settle_mode = Link.RCV_FIRST
        return ReceiverLink(link, target.name, target.kind, prefix)

    def _open(self, h: ReceiverLink) -> None:
        self.by_link[h.raw] = h
        h.link.open()
        h.link.flow(CREDIT)
        self._changed()

    def remote_unsubscribe(self, pattern: str, kind: Any) -> None:
        key = (kind, pattern)
        h = self.receivers.get(key)
        if h is None:
            return
        h.users -= 1
        if h.users > 0:
            return
        del self.receivers[key]
        h.closed = True
        self.by_link.pop(h.raw, None)  # later transfers are orphans (see _settle_orphan)
        if not self.closed:
            h.link.close()
            self._changed()

    # -- reply routes -------------------------------------------------------------------------

    def _reply_address(self, *parts: str) -> str:
        """A route's far address: ``<address_prefix_topic>gw-reply.<gateway id>.<key>``."""
        return self.topic_prefix + ".".join(parts)

    def reply_subscribe(self, address: str) -> None:
        """The receiver link of a reply route (when it is made, and after each reconnect):
        what a far-side responder sends to ``address`` comes back through it."""
        if address in self.reply_links:
            return
        rt = self.replies.by_name.get(address)
        if rt is None:
            return
        h = self._receiver(address, rt, self.topic_prefix)
        if h is not None:
            h.route = address
            self.reply_links[address] = h
            self._open(h)

    def reply_unsubscribe(self, address: str) -> None:
        h = self.reply_links.pop(address, None)
        if h is None:
            return
        h.closed = True
        self.by_link.pop(h.raw, None)
        if not self.closed:
            h.link.close()
            self._changed()

    def _on_up(self) -> None:
        super()._on_up()
        for address in self.replies.names:
            self.reply_subscribe(address)

    def _replenish(self, h: ReceiverLink) -> None:
        """Keep credit + unconfirmed near :data:`CREDIT` (issued in halves, AMQP 1.0 §2.6.7);
        none while the inbound queue holds the transport's reading back."""
        if h.closed or self.reading_paused:
            return
        want = CREDIT - lib.pn_link_credit(h.raw) - h.outstanding
        if want >= CREDIT // 2:
            lib.pn_link_flow(h.raw, want)

    def pause_reading(self) -> None:
        """Nothing to do now: no credit is issued while ``reading_paused`` (base) is set."""

    def resume_reading(self) -> None:
        for h in self.receivers.values():
            self._replenish(h)
        self._changed()

    def _on_attach(self, ev: Any) -> None:
        link = ev.link
        h = self.by_link.get(link._impl)
        # §2.6.3: a detach with the reason follows. (The relay's target has no address; the
        # detach of a refused relay link ends the relay: see _on_detach.)
        if isinstance(h, SenderLink) and h.name != RELAY and link.remote_target.address is None:
            h.refused = "the peer refused the link"

    def _on_detach(self, ev: Any) -> None:
        """The peer detached or closed one of our links (refused it, or ended it)."""
        link = ev.link
        h = self.by_link.pop(link._impl, None)
        if not link.state & link.LOCAL_CLOSED:
            link.close()
        if h is None:
            return
        reason = peer_error(link)
        h.closed = True
        if isinstance(h, ReceiverLink):
            if h.route is not None:  # a reply route's link: attached again while it exists
                if self.reply_links.get(h.route) is h:
                    del self.reply_links[h.route]
                    self.loop.call_later(float(self.params.get("reconnect_min", 1.0)),
                                         self.reply_subscribe, h.route)
                return
            if self.receivers.get((h.kind, h.pattern)) is h:
                del self.receivers[(h.kind, h.pattern)]
                self.last_error = f"import of {h.pattern}: {reason}"
                log.warning("transport %s: far side ended the import of %s: %s", self.name,
                            h.pattern, reason)
                # Still wanted: ask again later (the peer may have been restarting).
                self.loop.call_later(float(self.params.get("reconnect_max", 60.0)),
                                     self._resubscribe, h.pattern, h.kind)
            return
        self.out.detached(h, reason)

    def _resubscribe(self, pattern: str, kind: Any) -> None:
        if self.state != "up" or self.closed or (kind, pattern) in self.receivers:
            return
        users = sum(1 for b in self.imports.values() if b.kind == kind and pattern in b.remote)
        if users:
            self.remote_subscribe(pattern, kind)
            h = self.receivers.get((kind, pattern))
            if h is not None:
                h.users = users

    # -- import -------------------------------------------------------------------------------

    def _on_transfer(self, h: ReceiverLink, dlv: Any) -> None:
        """A transfer (or a part of one) on a receiver link (``dlv``: a ``pn_delivery_t``)."""
        raw = h.raw
        if lib.pn_delivery_partial(dlv):
            return
        if lib.pn_delivery_aborted(dlv):
            lib.pn_link_advance(raw)
            lib.pn_delivery_settle(dlv)
            return
        n = lib.pn_delivery_pending(dlv)
        data = bytearray(n)
        lib.pn_link_recv(raw, ffi.from_buffer(data), n)
        lib.pn_link_advance(raw)
        dest = h.dest
        if h.route is not None:
            dest = self.replies.target(h.route)  # None: the temporary destination is gone
            if dest is None:  # (and the route with it): taken and dropped
                if not lib.pn_delivery_settled(dlv):
                    lib.pn_delivery_update(dlv, PN_ACCEPTED)
                lib.pn_delivery_settle(dlv)
                self._changed()
                return
        try:
            found = self._decode(h, data, dest)
        except Exception as exc:  # noqa: BLE001 - a message the core cannot take
            self.stats["failed"] += 1
            log.warning("transport %s: cannot import from %s: %s", self.name, h.pattern, exc)
            self._reject(dlv, Condition("amqp:decode-error", f"cannot import: {exc}"))
            self._replenish(h)
            return
        h.outstanding += 1

        def ack() -> None:
            if h.closed:
                return  # the link (or connection) went: the peer sends it again
            h.outstanding -= 1
            if not lib.pn_delivery_settled(dlv):
                lib.pn_delivery_update(dlv, PN_ACCEPTED)
            lib.pn_delivery_settle(dlv)
            self._replenish(h)
            self._changed()

        if found is None:  # a name outside the subscription (RabbitMQ's `#` matches none)
            ack()
            return
        msg, origin, hops = found
        mid = msg.message_id
        if msg.trace_id is None and mid is not None and msg.destination is not None:
            # No gateway sent it, so base's (trace id, destination) check cannot see a resend.
            # A copy of a recent import's (message-id, destination) that does not say it is
            # the first acquisition (AMQP 1.0 §3.2.1 first-acquirer, delivery-count; RabbitMQ
            # marks what it requeued so) is the resend of a transfer whose settlement was
            # lost: taken and dropped. Forgotten again when the core refused the first copy.
            key = (mid, msg.destination.name)
            duplicate = key in self.recent_ids and maybe_redelivered(data)
            if not duplicate:
                self._remember_id(key)
        else:
            duplicate = False
        dest = msg.destination
        self.imported(msg, origin, hops, ack,
                      far_address(h.prefix, dest.name) if dest is not None else None,
                      duplicate=duplicate)

    def _remember_id(self, key: tuple[Any, str]) -> None:
        recent = self.recent_ids
        recent[key] = None
        if len(recent) > DEDUP_WINDOW:
            recent.popitem(last=False)

    def seed_duplicate(self, msg: Message) -> None:
        # Stored with a trace id this gateway gave it; its resend comes without one.
        if msg.message_id is not None and msg.destination is not None:
            self._remember_id((msg.message_id, msg.destination.name))

    def _forget(self, msg: Message) -> None:
        super()._forget(msg)
        if msg.message_id is not None and msg.destination is not None:
            self.recent_ids.pop((msg.message_id, msg.destination.name), None)

    def _reject(self, dlv: Any, cond: Condition) -> None:
        w = _wrap(dlv)
        if not lib.pn_delivery_settled(dlv):
            w.local.condition = cond
            w.update(PN_REJECTED)
        w.settle()
        self._changed()

    def _decode(self, h: ReceiverLink, data: bytearray,
                dest: Destination | None) -> tuple[Message, str | None, int] | None:
        """The core message of a transfer to ``dest`` (None: named by the message, on a
        wildcard link), its origin and hops; None when its name is outside the link's
        pattern. Raises on what cannot be decoded or named."""
        now = self.broker.now()
        mappings = self.broker.mappings
        if dest is not None:
            msg = decode_message(data, dest, mappings, transport=self.name, default_kind=QUEUE,
                                 now_ms=now)
        else:
            pm = ProtonMessage()
            pm.decode(data)  # type: ignore[arg-type]
            candidates = name_candidates(pm.address, pm.subject, h.prefix)
            if not candidates:
                raise GatewayError("a message on a wildcard link has neither to nor subject")
            for name, is_subject in candidates:
                if subject.matches(h.pattern, name) and valid_name(name):
                    dest, from_subject = Destination(h.kind, name), is_subject
                    break
            else:
                return None
            msg = proton_to_message(pm, dest, mappings, transport=self.name,
                                    default_kind=QUEUE, now_ms=now)
            if from_subject:
                msg.type = None  # it was the routing key, not a JMSType
        msg.size = len(data)
        reply = msg.reply_to
        if reply is not None and not reply.name.startswith(GW_PREFIXES):
            for prefix, kind in ((self.topic_prefix, TOPIC), (self.queue_prefix, QUEUE)):
                if prefix and reply.name.startswith(prefix) and len(reply.name) > len(prefix):
                    msg.reply_to = Destination(kind, reply.name[len(prefix):])
                    break
        props = msg.properties
        origin = props.pop(PROP_ORIGIN, None)
        hops = props.pop(PROP_HOPS, 0)
        if type(origin) is not str:
            origin = None
        if not isinstance(hops, int) or isinstance(hops, bool):
            hops = 0
        return msg, origin, int(hops)


    # -- export (transports/amqp_export.py) ---------------------------------------------------

    def export(self, d: CoreDelivery, binding: ExportBinding) -> bool:
        return self.out.export(d, binding)

    def far_name(self, msg: Message) -> tuple[str | None, str | None]:
        """The ``message-id`` it was sent with (the JMSMessageID, OASIS AMQP JMS Mapping
        §3.2.4) and the far address of its topic."""
        dest = msg.destination
        return msg.message_id, (far_address(self.topic_prefix, dest.name) if dest is not None
                                else None)

    def _on_flow(self, ev: Any) -> None:
        h = self.by_link.get(ev.link._impl)
        if isinstance(h, SenderLink):
            self.out.on_flow(h)

    def info(self) -> dict[str, Any]:
        out = super().info()
        out["anonymous_relay"] = self.out.relay  # exports go through the peer's relay link
        out["sender_links"] = len(self.out.senders)
        return out


def start(manager: Any, tdef: Any) -> AmqpTransport:
    """Registry entry for ``type = amqp`` in transports.conf."""
    return AmqpTransport(manager, tdef)
