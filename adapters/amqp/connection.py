"""One AMQP 1.0 connection: SASL, then python-qpid-proton's engine, driven by bytes.

How this works. The asyncio shell (:mod:`adapters.amqp.server`) hands every read to
:meth:`AmqpConnection.data_received` and writes what :meth:`flush` gives it. Until the AMQP
header, bytes go to :class:`~adapters.amqp.sasl.SaslServer`; after it, to a proton
:class:`~proton.Transport` bound to a :class:`~proton.Connection` with a
:class:`~proton.Collector`, driven by :class:`~adapters.amqp.driver.EngineDriver` (the
driver the amqp transport's client connections use too; never proton's ``Container`` or
reactor, which would run an event loop of their own): it pushes the bytes, dispatches the
collected events to the handlers here, ticks, and writes whatever the transport has to send.
Proton does the framing, the performatives, sessions, windows, link credit accounting and
delivery state; this module decides what opening, attaching, a transfer or a disposition
means for the core.

Events and what they do (AMQP 1.0 §2.4-§2.7):

- connection open: the core connection is made (client id = the container id; the user is
  who SASL authenticated), answered with our open: the container id of the gateway, the
  ``queue://`` / ``topic://`` prefixes Qpid JMS reads from the ``queue-prefix`` /
  ``topic-prefix`` properties, and the capabilities ANONYMOUS-RELAY, DELAYED_DELIVERY and
  SHARED-SUBS. A refusal (bad user, ``max_connections``, a second connection for a
  container that asked for ``sole-connection-for-container``) is an open followed by a close
  carrying the error.
- session begin: a core session (explicit acknowledgement) for its links.
- attach: an :class:`~adapters.amqp.links.IncomingLink`, :class:`OutgoingLink`,
  :class:`BrowseLink` or :class:`Coordinator`. A refused attach is answered, as §2.6.3
  says, by an attach with a null terminus followed by a detach carrying the error.
- flow, transfer, disposition: to the link object.
- detach / end / close: the link, session or connection goes; unsettled deliveries return
  to their queues and open transactions roll back.

Malformed frames are proton's to answer: it closes the connection with
``amqp:decode-error`` or ``amqp:connection:framing-error`` and we close the socket once
that close has been written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from proton import (
    Condition,
    Connection,
    Endpoint,
    Event,
    Link,
    PropertyDict,
    SymbolList,
    Terminus,
    Transport,
    symbol,
)

from adapters.amqp.driver import EngineDriver
from adapters.amqp.links import (
    CREDIT,
    BrowseLink,
    Coordinator,
    IncomingLink,
    OutgoingLink,
    capabilities,
    capability_hint,
    condition,
    dynamic_kind,
    put_filters,
    selector_and_no_local,
)
from adapters.amqp.sasl import SaslError, SaslServer
from gateway.client import AckMode
from gateway.errors import GatewayError, InvalidDestinationError, SecurityError
from gateway.message import QUEUE, TOPIC, Destination
from mappings.amqp_address import format_address, parse_address

if TYPE_CHECKING:
    from adapters.amqp.server import AmqpServer
    from gateway.client import Transaction

log = logging.getLogger("adapters.amqp")

IDLE_TIMEOUT = 60.0  # seconds of silence from the peer before the connection is dropped
MAX_FRAME_SIZE = 32 * 1024  # see the note where it is set
SOLE_CONNECTION = symbol("sole-connection-for-container")
OFFERED = SymbolList([symbol("ANONYMOUS-RELAY"), symbol("DELAYED_DELIVERY"),
                      symbol("SHARED-SUBS")])


class AmqpConnection:
    """The state of one AMQP connection; the shell calls the four I/O methods."""

    def __init__(self, server: AmqpServer, write: Callable[[bytes], None],
                 close: Callable[[], None], address: str) -> None:
        self.server = server
        self.broker = server.broker
        self.write = write
        self.close_socket = close
        self.address = address
        self.default_kind = server.default_kind
        self.max_message_size = server.max_message_size
        self.sasl: SaslServer | None = SaslServer(
            self._authenticate, plain=True, anonymous=server.allow_anonymous
        )
        self.user: str | None = None
        self.engine: Connection | None = None
        self.driver: EngineDriver | None = None  # from the AMQP header on (after SASL)
        self.core: Any = None
        self.transactions: dict[Any, Transaction] = {}
        self._txn_seq = 0
        self.links: set[Any] = set()
        self.by_link: dict[Any, Any] = {}  # proton's pn_link_t pointer → our link object
        self.write_paused = False
        self.flow: Any = None  # the shell's adapters.listener.WriteFlow (admin views)
        self.closed = False
        self._handlers: dict[int, Callable[[Any], None]] = {
            Event.CONNECTION_REMOTE_OPEN.number: self._on_open,
            Event.SESSION_REMOTE_OPEN.number: self._on_begin,
            Event.LINK_REMOTE_OPEN.number: self._on_attach,
            Event.LINK_FLOW.number: self._on_flow,
            Event.LINK_REMOTE_DETACH.number: self._on_detach,
            Event.LINK_REMOTE_CLOSE.number: self._on_link_close,
            Event.SESSION_REMOTE_CLOSE.number: self._on_end,
            Event.CONNECTION_REMOTE_CLOSE.number: self._on_close,
            Event.TRANSPORT_ERROR.number: self._on_transport_error,
            Event.TRANSPORT_TAIL_CLOSED.number: self._on_tail_closed,
        }

    # -- I/O from the shell ----------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        sasl = self.sasl
        if sasl is not None:
            out = sasl.feed(data)
            if out:
                self.write(out)
            if sasl.failed:
                log.info("amqp %s: %s", self.address, sasl.error)
                self._abort()
                return
            if not sasl.done:
                return
            self.sasl = None
            self.user = sasl.user
            self._start_engine()
            data = sasl.rest
        assert self.driver is not None
        self.driver.receive_data(data)

    def connection_lost(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.driver is not None:
            self.driver.close()
        self._release_core()

    def core_id(self) -> str | None:
        return str(self.core.id) if self.core is not None else None

    def client_id(self) -> str | None:
        return self.core.client_id if self.core is not None else None

    def pause_writing(self) -> None:
        self.write_paused = True
        for h in self.links:
            if isinstance(h, OutgoingLink):
                h.pause()

    def resume_writing(self) -> None:
        self.write_paused = False
        for h in list(self.links):
            if isinstance(h, (OutgoingLink, BrowseLink)):
                h.on_flow()
        self.flush()

    # -- the engine -------------------------------------------------------------------------

    def _start_engine(self) -> None:
        t = Transport(Transport.SERVER)
        t.max_frame_size = MAX_FRAME_SIZE
        t.idle_timeout = IDLE_TIMEOUT
        c = self.engine = Connection()
        self.driver = EngineDriver(
            self.server.loop, t, c, write=self.write, handlers=self._handlers,
            links=self.by_link, on_delivery=self._on_delivery, on_over=self.write_closed,
            on_push_error=self._on_push_error, label=f"amqp {self.address}", logger=log)

    def _on_delivery(self, h: Any, dlv: Any) -> None:
        """A transfer or disposition (``dlv``: a ``pn_delivery_t``) on one of our links; one
        on a link we no longer hold is left to proton."""
        if h is not None:
            h.on_raw_delivery(dlv)

    def _on_push_error(self, text: str) -> None:
        log.info("amqp %s: %s", self.address, text)

    def changed(self) -> None:
        """Output is waiting (a delivery from another connection, a confirmation)."""
        if self.driver is not None and not self.closed:
            self.driver.changed()

    def flush(self) -> None:
        """Dispatch what is pending and write what the transport has to send."""
        if self.driver is not None and not self.closed:
            self.driver.flush()

    def write_closed(self) -> None:
        """The engine's output is over (our close has been written): the socket goes."""
        self.closed = True
        self._release_core()
        self.close_socket()

    def _abort(self) -> None:
        self.closed = True
        self._release_core()
        self.close_socket()

    def _release_core(self) -> None:
        for tx in self.transactions.values():
            tx.rollback()
        self.transactions.clear()
        for h in list(self.links):
            h.close(closed=False) if not isinstance(h, IncomingLink) else h.close()
        self.links.clear()
        self.by_link.clear()
        if self.core is not None:
            self.core.close()
            self.core = None
        self.server.connections.discard(self)

    # -- SASL ---------------------------------------------------------------------------------

    def _authenticate(self, user: str | None, password: str | None) -> str | None:
        """The core's credential rules (:meth:`gateway.broker.Broker.authenticate`) for a
        sasl-init: PLAIN's authcid and passwd, or ANONYMOUS (no user)."""
        try:
            who: str | None = self.broker.authenticate(user, password)
        except SecurityError as exc:
            raise SaslError(str(exc)) from None
        return who

    # -- connection and sessions ---------------------------------------------------------------

    def _on_open(self, ev: Any) -> None:
        c = ev.connection
        c.container = self.broker.id
        props = {symbol("product"): "gateway", symbol("queue-prefix"): "queue://",
                 symbol("topic-prefix"): "topic://"}
        c.properties = PropertyDict(props)
        offered = list(OFFERED)
        desired = c.remote_desired_capabilities
        if desired is not None and SOLE_CONNECTION in list(desired):
            offered.append(SOLE_CONNECTION)
        c.offered_capabilities = SymbolList(offered)
        try:
            self.core = self.broker.connect(
                client_id=c.remote_container or None, user=self.user, authenticated=True,
                protocol="amqp", address=self.address,
            )
        except GatewayError as exc:
            c.open()
            cond = condition(exc)
            if "already connected" in str(exc):
                cond = Condition("amqp:invalid-field", str(exc),
                                 {symbol("invalid-field"): symbol("container-id")})
            c.condition = cond
            c.close()
            return
        c.open()

    def _on_begin(self, ev: Any) -> None:
        ssn = ev.session
        if self.core is None:
            return
        ssn.gw = self.core.session(AckMode.EXPLICIT)
        ssn.open()

    def _on_end(self, ev: Any) -> None:
        ssn = ev.session
        for h in list(self.links):
            if h.link.session == ssn:
                self._drop_link(h, closed=False)
        core_session = getattr(ssn, "gw", None) if _has(ssn, "gw") else None
        if core_session is not None:
            core_session.close()
        ssn.close()

    def _on_close(self, ev: Any) -> None:
        c = ev.connection
        for h in list(self.links):
            self._drop_link(h, closed=False)
        c.close()

    def _on_tail_closed(self, ev: Any) -> None:
        """Proton stopped reading. Unless the peer closed (or the socket did), that was a
        frame it could not take, and for some of those it writes no ``close``: we do, so
        the client learns why instead of hanging (§2.7.9, §2.8.15)."""
        c = self.engine
        if self.closed or c is None or c.state & Endpoint.REMOTE_CLOSED:
            return
        if not c.state & Endpoint.LOCAL_CLOSED:
            cond = ev.transport.condition
            c.condition = cond or Condition("amqp:decode-error", "malformed frame")
            c.close()

    def _on_transport_error(self, ev: Any) -> None:
        cond = ev.transport.condition
        log.info("amqp %s: %s", self.address, cond.description if cond else "transport error")

    # -- links ------------------------------------------------------------------------------------

    def _on_attach(self, ev: Any) -> None:
        link = ev.link
        if self.core is None or not _has(link.session, "gw"):
            link.close()
            return
        if link.is_receiver:
            self._attach_incoming(link)
        else:
            self._attach_outgoing(link)

    def _refuse(self, link: Any, exc: BaseException) -> None:
        """Attach with a null terminus, then detach with the error (§2.6.3)."""
        if link.is_receiver:
            link.source.copy(link.remote_source)
        else:
            link.target.copy(link.remote_target)
        link.open()
        link.condition = condition(exc)
        link.close()

    def _attach_incoming(self, link: Any) -> None:
        rt = link.remote_target
        link.source.copy(link.remote_source)
        if rt.type == Terminus.COORDINATOR:
            link.target.copy(rt)
            coord = Coordinator(self, link)
            self._register(link, coord)
            link.open()
            link.flow(CREDIT)
            return
        try:
            dest: Destination | None = None
            if rt.dynamic:
                dest = self._temporary(dynamic_kind(rt))
            elif rt.address:
                dest = parse_address(rt.address, hint=capability_hint(rt),
                                     default=self.default_kind)
                self._check_send(dest)
        except (GatewayError, ValueError) as exc:
            self._refuse(link, exc)
            return
        link.target.copy(rt)
        if rt.dynamic and dest is not None:
            link.target.address = format_address(dest)
        link.rcv_settle_mode = Link.RCV_FIRST
        link.max_message_size = self.max_message_size
        h = IncomingLink(self, link, link.session.gw, dest)
        self._register(link, h)
        link.open()
        link.flow(CREDIT)

    def _check_send(self, dest: Destination) -> None:
        broker = self.broker
        target = broker.resolve_for_send(dest)
        if broker.authorization:
            kind, perm = ("topic", "publish") if dest.kind == TOPIC else ("queue", "send")
            broker.check(self.core, kind, dest.name, perm, target.props)

    def _temporary(self, kind: Any) -> Destination:
        if kind == TOPIC:
            return self.core.temporary_topic()  # type: ignore[no-any-return]
        return self.core.temporary_queue()  # type: ignore[no-any-return]

    def _attach_outgoing(self, link: Any) -> None:
        rs = link.remote_source
        session = link.session.gw
        link.target.copy(link.remote_target)
        if link.remote_snd_settle_mode == Link.SND_SETTLED:
            link.snd_settle_mode = Link.SND_SETTLED
        caps = capabilities(rs)
        try:
            selector, no_local, applied = selector_and_no_local(rs)
            durable = rs.durability != Terminus.NONDURABLE
            if rs.dynamic:
                dest = self._temporary(dynamic_kind(rs))
                durable = False
            elif rs.address:
                dest = parse_address(rs.address, hint=capability_hint(rs),
                                     default=self.default_kind)
            else:
                # A durable subscription looked up by link name (Qpid JMS reattaches or
                # unsubscribes this way): answer with its source, or a null source.
                found = self._find_durable(link.name, caps)
                if found is None:
                    raise InvalidDestinationError(
                        f"no durable subscription named {link.name!r}")
                dest, selector, no_local = found
                durable = True
            source = link.source
            source.copy(rs)
            source.filter.clear()
            if rs.dynamic or not rs.address:
                source.address = format_address(dest)
            if not rs.address and not rs.dynamic:
                source.durability = Terminus.DELIVERIES
                source.expiry_policy = Terminus.EXPIRE_NEVER
            if dest.kind == QUEUE and rs.distribution_mode == Terminus.DIST_MODE_COPY:
                put_filters(source, applied)
                browser = BrowseLink(self, link, session.browser(dest, selector))
                self._register(link, browser)
                link.open()
                browser.on_flow()
                return
            h = OutgoingLink(self, link, session)
            shared = "shared" in caps
            name = link.name.split("|", 1)[0] if shared else link.name
            durable_name = name if durable and dest.kind == TOPIC else None
            scope = "" if "global" in caps else None
            mc = session.consumer(
                dest, selector=selector, no_local=no_local, listener=h.deliver, window=0,
                durable_name=durable_name, shared_name=name if shared else None,
                share_scope=scope, name=link.name,
            )
        except (GatewayError, ValueError) as exc:
            self._refuse(link, exc)
            return
        put_filters(link.source, applied)
        h.durable_name = durable_name
        h.share_scope = scope if shared else None
        h.dest = dest
        self._register(link, h)
        ready = self.broker.cluster_ready()
        if ready is None:
            link.open()
            h.start(mc)
        else:  # on a cluster node: the attach answered once the other nodes have it
            ready.add_done_callback(lambda _: self._attached(link, h, mc))

    def _attached(self, link: Any, h: Any, mc: Any) -> None:
        if self.closed:  # the connection went, its consumers with it
            return
        if h not in self.links:  # detached meanwhile: its consumer goes
            mc.close()
            return
        link.open()
        h.start(mc)
        self.changed()

    def _register(self, link: Any, h: Any) -> None:
        link.gw = h
        self.links.add(h)
        self.by_link[link._impl] = h

    def _find_durable(self, name: str, caps: set[str]) -> tuple[Destination, str | None, bool] | None:
        shared = "shared" in caps
        sub_name = name.split("|", 1)[0] if shared else name
        scope = "" if "global" in caps else (self.core.client_id or "")
        sub = self.broker.durable(f"sub:{scope}:{sub_name}")
        if sub is None:
            return None
        sel = sub.selector.text if sub.selector is not None else None
        return Destination.topic(sub.pattern), sel, sub.no_local

    def _on_flow(self, ev: Any) -> None:
        link = ev.link
        if link.is_sender and _has(link, "gw"):
            link.gw.on_flow()

    def _on_detach(self, ev: Any) -> None:
        self._end_link(ev.link, closed=False)

    def _on_link_close(self, ev: Any) -> None:
        self._end_link(ev.link, closed=True)

    def _end_link(self, link: Any, *, closed: bool) -> None:
        if _has(link, "gw"):
            self._drop_link(link.gw, closed=closed)
        if closed:
            link.close()
        else:
            link.detach()

    def _drop_link(self, h: Any, *, closed: bool) -> None:
        if h in self.links:
            self.links.discard(h)
            self.by_link.pop(h.link._impl, None)
            if isinstance(h, IncomingLink):
                h.close()
            else:
                h.close(closed=closed)

    # -- transactions -------------------------------------------------------------------------------

    def declare(self) -> bytes:
        self._txn_seq += 1
        txn_id = f"txn:{self._txn_seq}".encode()
        self.transactions[txn_id] = self.core.transaction()
        return txn_id

    def transaction(self, txn_id: Any) -> Transaction:
        tx = self.transactions.get(txn_id)
        if tx is None:
            raise _UnknownTransaction(f"no transaction {txn_id!r}")
        return tx


class _UnknownTransaction(GatewayError):
    reason = "transaction-unknown"


def _has(wrapper: Any, name: str) -> bool:
    try:
        getattr(wrapper, name)
    except AttributeError:
        return False
    return True


__all__ = ["AmqpConnection", "SecurityError"]
