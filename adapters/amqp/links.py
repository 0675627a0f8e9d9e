"""AMQP 1.0 links on the core: producers, consumers, browsers and the transaction coordinator.

How this works. Each attached link gets one object that lives as long as the link:

- :class:`IncomingLink` -- the client sends (a proton receiver on our side). Each complete
  transfer is decoded, mapped (:func:`mappings.amqp.amqp_to_message`) and published through
  the link's core session; the disposition (accepted, or rejected with the error) is sent
  once the core has taken the message -- for a persistent message, after its group commit.
  Credit is the producer's throttle: the link keeps at most :data:`CREDIT` transfers
  granted-or-unconfirmed, so while the core holds a send back (flow control, the store)
  no new credit is issued and the client stops (AMQP 1.0 §2.6.7).
- :class:`OutgoingLink` -- the client receives (a proton sender). A core consumer delivers
  into it while the link has credit; the core consumer is paused at zero credit and when
  the socket's write buffer is full. The client's dispositions settle the core delivery:
  accepted → ack, rejected → undeliverable, released → back without counting a delivery,
  modified → back, counted as a failed delivery (§3.4).
- :class:`BrowseLink` -- ``distribution-mode copy`` on a queue (a JMS QueueBrowser): a
  snapshot of the queue, sent as credit allows, consuming nothing.
- :class:`Coordinator` -- the transaction coordinator target (§4.5): ``declare`` opens a
  core :class:`~gateway.client.Transaction`, ``discharge`` commits or rolls it back.

Transactional work (§4.4): a transfer whose state is ``transactional-state`` is sent in that
transaction; a disposition whose state is ``transactional-state(accepted)`` acknowledges in it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from cproton import PN_ACCEPTED as _PN_ACCEPTED
from cproton import ffi, lib
from proton import Array, Condition, Delivery, Described, Message, Terminus, symbol, ulong

from adapters.amqp.driver import decode_message, encode_message, proton_to_message
from adapters.listener import LogLimiter, skipped_text
from gateway.errors import GatewayError, TransactionRolledBackError
from gateway.message import QUEUE, TOPIC, Destination
from mappings.amqp_address import parse_address

if TYPE_CHECKING:
    from adapters.amqp.connection import AmqpConnection
    from gateway.client import MessageConsumer, Session
    from gateway.consumer import Delivery as CoreDelivery
    from gateway.message import Message as CoreMessage

log = logging.getLogger("adapters.amqp")
# Pre-settled messages dropped (nothing to answer them with): at most a line every 10 s.
_DROP_LOG = LogLimiter()

_wrap: Any = Delivery.wrap  # proton's Python object for a pn_delivery_t (the rare paths)

CREDIT = 1000  # transfers a producer link may have granted or unconfirmed at once
ACCEPTED = Delivery.ACCEPTED
REJECTED = Delivery.REJECTED
RELEASED = Delivery.RELEASED
MODIFIED = Delivery.MODIFIED
DECLARED = 0x33  # amqp:declared:list (§4.5.4)
TRANSACTIONAL_STATE = 0x34  # amqp:transactional-state:list (§4.5.8)
_ACCEPTED_OUTCOME = Described(ulong(0x24), [])

SELECTOR_FILTERS = (symbol("apache.org:selector-filter:string"), ulong(0x0000468C00000004))
NO_LOCAL_FILTERS = (symbol("apache.org:no-local-filter:list"), ulong(0x0000468C00000003))
DECLARE = (symbol("amqp:declare:list"), ulong(0x31))
DISCHARGE = (symbol("amqp:discharge:list"), ulong(0x32))

# AMQP error conditions for core errors (§2.8.15; amqp:transaction:* §4.5.9)
CONDITIONS = {
    "invalid-destination": "amqp:not-found",
    "not-authorized": "amqp:unauthorized-access",
    "limit-exceeded": "amqp:resource-limit-exceeded",
    "unavailable": "amqp:internal-error",
    "invalid-selector": "amqp:invalid-field",
    "message-format": "amqp:decode-error",
    "illegal-state": "amqp:resource-locked",
    "transaction-rolled-back": "amqp:transaction:rollback",
    "transaction-unknown": "amqp:transaction:unknown-id",
    "mapping-failed": "amqp:precondition-failed",
}


def condition(exc: BaseException) -> Condition:
    """The AMQP error condition for a core error (``amqp:internal-error`` for the rest)."""
    reason = exc.reason if isinstance(exc, GatewayError) else ""
    return Condition(CONDITIONS.get(reason, "amqp:internal-error"), str(exc))


def data_object(data: Any) -> Any:
    """The value a proton :class:`~proton.Data` holds (``None`` if empty)."""
    if data is None:
        return None
    data.rewind()
    if data.next() is None:
        return None
    return data.get_object()


def capability_hint(terminus: Terminus) -> int | None:
    """The destination type a terminus' capabilities ask for (JMS mapping §3.2.5)."""
    names = capabilities(terminus)
    for name, hint in (("temporary-queue", 2), ("temporary-topic", 3), ("queue", 0),
                       ("topic", 1)):
        if name in names:
            return hint
    return None


def capabilities(terminus: Terminus) -> set[str]:
    """The capability symbols of a terminus: sent as one symbol, a list, or (rhea, Qpid JMS)
    an array of symbols."""
    caps = data_object(terminus.capabilities)
    if not caps:
        return set()
    if isinstance(caps, Array):
        caps = caps.elements
    return {str(c) for c in (caps if isinstance(caps, (list, tuple)) else [caps])}


class IncomingLink:
    """A producer: transfers from the client into the core."""

    __slots__ = ("conn", "link", "raw", "session", "dest", "unconfirmed", "closed")

    def __init__(self, conn: AmqpConnection, link: Any, session: Session,
                 dest: Destination | None) -> None:
        self.conn = conn
        self.link = link
        self.raw = link._impl  # proton's pn_link_t: the hot path calls proton's C API on it
        self.session = session
        self.dest = dest  # None: an anonymous relay link, each message's `to` decides
        self.unconfirmed = 0
        self.closed = False

    def replenish(self) -> None:
        raw = self.raw
        want = CREDIT - lib.pn_link_credit(raw) - self.unconfirmed
        if want >= CREDIT // 2 and not self.closed:
            lib.pn_link_flow(raw, want)

    def on_raw_delivery(self, dlv: Any) -> None:
        """A transfer (or a part of one) arrived: ``dlv`` is proton's ``pn_delivery_t``."""
        raw = self.raw
        if lib.pn_delivery_partial(dlv):
            limit = self.conn.max_message_size
            if limit and lib.pn_delivery_pending(dlv) > limit:
                self.fail(Condition("amqp:link:message-size-exceeded",
                                    f"message larger than {limit} bytes"))
            return
        if lib.pn_delivery_aborted(dlv):
            lib.pn_link_advance(raw)
            lib.pn_delivery_settle(dlv)
            return
        n = lib.pn_delivery_pending(dlv)
        data = bytearray(n)
        lib.pn_link_recv(raw, ffi.from_buffer(data), n)
        lib.pn_link_advance(raw)
        presettled = lib.pn_delivery_settled(dlv)
        conn = self.conn
        txn_id = None
        if lib.pn_delivery_remote_state(dlv) == TRANSACTIONAL_STATE:
            state = _wrap(dlv).remote.data
            txn_id = _txn_key(state[0]) if state else None
        try:
            msg = self._message(data)
            if txn_id is not None:
                conn.transaction(txn_id).send(msg)
                if not presettled:
                    w = _wrap(dlv)
                    w.local.data = [txn_id, _ACCEPTED_OUTCOME]
                    w.update(TRANSACTIONAL_STATE)
                lib.pn_delivery_settle(dlv)
                self.replenish()
                return
            fut = self.session.send(msg)
        except Exception as exc:  # decode, mapping and core errors alike: reject this one
            if not isinstance(exc, (GatewayError, _NoAddress)):
                exc = _Malformed(f"malformed message: {exc}")
            if presettled:
                skipped = _DROP_LOG.allow()
                if skipped is not None:
                    log.warning("amqp %s: dropped a pre-settled message: %s%s", conn.address,
                                exc, skipped_text(skipped))
                lib.pn_delivery_settle(dlv)
            else:
                _reject(dlv, condition(exc))
            self.replenish()
            return
        if fut is None or fut.done() and fut.exception() is None:
            if not presettled:
                lib.pn_delivery_update(dlv, _PN_ACCEPTED)
            lib.pn_delivery_settle(dlv)
            self.replenish()
            return
        self.unconfirmed += 1
        fut.add_done_callback(lambda f: self._confirmed(dlv, presettled, f))

    def _message(self, data: bytearray) -> Any:
        """The core message for a transfer's bytes (raises on what cannot be taken),
        through the declarative mappings (direction ``in``) when there are any."""
        msg = self._decoded(data)
        mappings = self.conn.broker.mappings
        if mappings is not None:
            msg = mappings.apply(msg, protocol="amqp", direction="in")
        return msg

    def _decoded(self, data: bytearray) -> Any:
        """The wire side of the mapping (:func:`adapters.amqp.driver.decode_message`:
        ``amqp_fast`` when the default rules apply unchanged to the destination, else the
        function ``wire_for`` gives; mappings/README.md, "Overriding the default mappings").
        On an anonymous link the destination is the message's ``to``."""
        conn = self.conn
        dest = self.dest
        mappings = conn.broker.mappings
        # One clock reading for the ttl and the timestamp (JMSExpiration = timestamp + ttl).
        now = conn.broker.now()
        if dest is not None:
            msg = decode_message(data, dest, mappings, transport=None,
                                 default_kind=conn.default_kind, now_ms=now)
        else:
            pm = Message()
            pm.decode(data)  # type: ignore[arg-type]
            if not pm.address:
                raise _NoAddress("a message on an anonymous link has no `to` address")
            ann = pm.annotations
            hint = ann.get(symbol("x-opt-jms-dest")) if ann else None
            dest = parse_address(pm.address, hint=hint, default=conn.default_kind)
            msg = proton_to_message(pm, dest, mappings, transport=None,
                                    default_kind=conn.default_kind, now_ms=now)
        msg.size = len(data)
        if not msg.timestamp:
            msg.timestamp = now
        return msg

    def _confirmed(self, dlv: Any, presettled: bool, fut: Any) -> None:
        self.unconfirmed -= 1
        if self.closed:
            return
        exc = fut.exception() if not fut.cancelled() else GatewayError("cancelled")
        if presettled:
            lib.pn_delivery_settle(dlv)
        elif exc is None:
            lib.pn_delivery_update(dlv, _PN_ACCEPTED)
            lib.pn_delivery_settle(dlv)
        else:
            _reject(dlv, condition(exc))
        self.replenish()
        self.conn.changed()

    def fail(self, cond: Condition) -> None:
        self.link.condition = cond
        self.link.close()
        self.close()

    def close(self) -> None:
        self.closed = True


def _reject(dlv: Any, cond: Condition) -> None:
    """Settle ``dlv`` (a ``pn_delivery_t``) as rejected with ``cond``."""
    w = _wrap(dlv)
    w.local.condition = cond
    w.update(REJECTED)
    w.settle()


class _NoAddress(GatewayError):
    reason = "invalid-destination"


class _Malformed(GatewayError):
    reason = "message-format"


class OutgoingLink:
    """A consumer: core deliveries to the client, settled by its dispositions."""

    __slots__ = ("conn", "link", "raw", "session", "consumer", "unsettled", "presettled",
                 "closed", "durable_name", "share_scope", "dest")

    def __init__(self, conn: AmqpConnection, link: Any, session: Session) -> None:
        self.conn = conn
        self.link = link
        self.raw = link._impl  # proton's pn_link_t
        self.session = session
        self.consumer: MessageConsumer | None = None
        self.unsettled: dict[Any, CoreDelivery] = {}  # pn_delivery_t → core delivery
        self.presettled = link.snd_settle_mode == link.SND_SETTLED
        self.closed = False
        self.durable_name: str | None = None
        self.share_scope: str | None = None
        self.dest: Destination | None = None

    def start(self, mc: MessageConsumer) -> None:
        """Take over the core consumer (created with window 0, so nothing came yet): from
        now on link credit, not a window, decides when it may deliver."""
        self.consumer = mc
        core = mc.core
        core.paused = True
        core.window = None
        self.on_flow()

    def deliver(self, d: CoreDelivery) -> None:
        """The core consumer's listener: send one message (the link has credit)."""
        raw = self.raw
        conn = self.conn
        try:
            data = encode_outgoing(conn, d.msg, d.count, conn.broker.now())
        except GatewayError as exc:
            if conn.broker.mappings is None:
                raise
            # a declarative mapping refused it: undeliverable
            log.warning("amqp %s: message %s not sent: %s", conn.address, d.msg.message_id,
                        exc)
            self.session.reject(d, "mapping")
            return
        tag = str(d.tag).encode()
        dlv = lib.pn_delivery(raw, (len(tag), ffi.from_buffer(tag)))
        lib.pn_link_send(raw, ffi.from_buffer(data), len(data))
        lib.pn_link_advance(raw)
        if self.presettled:
            lib.pn_delivery_settle(dlv)
            self.session.ack(d)
        else:
            self.unsettled[dlv] = d
        if lib.pn_link_credit(raw) <= 0 or conn.write_paused:
            self.consumer.core.pause()  # type: ignore[union-attr]
        conn.changed()

    def on_flow(self) -> None:
        mc = self.consumer
        if mc is None or self.closed:
            return
        link = self.link
        if lib.pn_link_credit(self.raw) > 0 and not self.conn.write_paused:
            mc.core.resume()
        else:
            mc.core.pause()
        if link.drain_mode and link.credit > 0:
            # Nothing more to send now (what was ready has gone): spend the rest (§2.6.7).
            link.drained()

    def on_raw_delivery(self, dlv: Any) -> None:
        """The client updated a delivery (``dlv``, proton's ``pn_delivery_t``)."""
        if not lib.pn_delivery_updated(dlv):
            return
        d = self.unsettled.pop(dlv, None)
        if d is None:
            lib.pn_delivery_settle(dlv)
        elif not self._settle(d, dlv):
            # A non-terminal state (``received``, §3.4.1): wait for the outcome. (proton's
            # pn_delivery_clear, which would reset the updated flag, is not in every build;
            # the flag is only read when proton reports the delivery again.)
            self.unsettled[dlv] = d

    def _settle(self, d: CoreDelivery, dlv: Any) -> bool:
        """Apply the client's outcome to the core delivery; False if it has none yet."""
        state = lib.pn_delivery_remote_state(dlv)
        session = self.session
        if state == _PN_ACCEPTED or (state == 0 and lib.pn_delivery_settled(dlv)):
            session.ack(d)
        elif state == TRANSACTIONAL_STATE:
            data = _wrap(dlv).remote.data or []
            tx = self.conn.transactions.get(_txn_key(data[0])) if data else None
            if tx is None:
                session.release(d)  # an unknown transaction: as if never acknowledged
            else:
                tx.ack(d)
        elif state == REJECTED:
            session.reject(d, "rejected")
        elif state == RELEASED:
            session.release(d, count_delivery=False)
        elif state == MODIFIED:
            failed = lib.pn_disposition_is_failed(lib.pn_delivery_remote(dlv))
            session.release(d, count_delivery=bool(failed))
        else:  # received (or unknown): not final; keep waiting
            return False
        lib.pn_delivery_settle(dlv)
        return True

    def close(self, *, closed: bool) -> None:
        """The link ended: unsettled deliveries return; ``closed`` ends a durable subscription."""
        if self.closed:
            return
        self.closed = True
        session = self.session
        unsettled = list(self.unsettled.items())
        self.unsettled.clear()
        mc = self.consumer
        if mc is not None:
            mc.close()  # first, so that what returns is not delivered here again
        # A disposition may have come in the same read as the detach: proton reports the
        # detach first. What the client settled counts; the rest returns, in its order.
        session.release_all([d for dlv, d in unsettled if not self._settle(d, dlv)])
        if closed and self.durable_name is not None and not session.closed:
            try:
                session.unsubscribe(self.durable_name, self.share_scope)
            except GatewayError as exc:
                log.info("amqp %s: durable subscription %s not removed: %s",
                         self.conn.address, self.durable_name, exc)

    def pause(self) -> None:
        if self.consumer is not None:
            self.consumer.core.pause()


def encode_outgoing(conn: AmqpConnection, msg: CoreMessage, delivery_count: int,
                    now: int) -> bytes:
    """The transfer payload of ``msg`` for a receiving link (consumer or browser): through
    the declarative mappings (direction ``out``) when there are any, then the wire side
    (:func:`adapters.amqp.driver.encode_message`: ``amqp_fast_out`` when the default rules
    apply unchanged to the destination, else the wire function the rules give;
    mappings/README.md, "Overriding the default mappings"). The delivered message itself is
    never changed.

    Raises:
        GatewayError: a mapping rule refused the message (MappingFailed).
    """
    mappings = conn.broker.mappings
    if mappings is not None:
        msg = mappings.apply(msg, protocol="amqp", direction="out")
    return encode_message(msg, mappings, transport=None, delivery_count=delivery_count,
                          now_ms=now)


class BrowseLink:
    """A queue browser: a snapshot of the queue, sent as credit allows, nothing consumed."""

    __slots__ = ("conn", "link", "pending", "next_tag", "closed")

    def __init__(self, conn: AmqpConnection, link: Any, messages: list[Any]) -> None:
        self.conn = conn
        self.link = link
        self.pending = messages
        self.next_tag = 0
        self.closed = False

    def on_flow(self) -> None:
        link = self.link
        now = self.conn.broker.now()
        pending = self.pending
        while link.credit > 0 and pending and not self.conn.write_paused:
            msg = pending.pop(0)
            try:
                data = encode_outgoing(self.conn, msg, 1, now)
            except GatewayError as exc:
                if self.conn.broker.mappings is None:
                    raise
                # a declarative mapping refused it: a browser skips it (nothing to settle)
                log.warning("amqp %s: browsed message %s not sent: %s", self.conn.address,
                            msg.message_id, exc)
                continue
            self.next_tag += 1
            dlv = link.delivery(str(self.next_tag))
            link.send(data)
            link.advance()
            dlv.settle()
        if link.drain_mode and link.credit > 0:
            link.drained()
        self.conn.changed()

    def on_raw_delivery(self, dlv: Any) -> None:
        if lib.pn_delivery_updated(dlv):
            lib.pn_delivery_settle(dlv)

    def close(self, *, closed: bool) -> None:
        self.closed = True
        self.pending.clear()


class Coordinator:
    """The transaction coordinator (§4.5): declare and discharge over a control link."""

    __slots__ = ("conn", "link", "closed")

    def __init__(self, conn: AmqpConnection, link: Any) -> None:
        self.conn = conn
        self.link = link
        self.closed = False

    def on_raw_delivery(self, dlv: Any) -> None:
        self.on_delivery(_wrap(dlv))

    def on_delivery(self, dlv: Any) -> None:
        link = self.link
        if dlv.partial:
            return
        data = link.recv(dlv.pending)
        link.advance()
        conn = self.conn
        try:
            pm = Message()
            pm.decode(data)
            body = pm.body
            descriptor = getattr(body, "descriptor", None)
            fields = list(getattr(body, "value", None) or [])
        except Exception as exc:
            self._reject(dlv, Condition("amqp:decode-error", f"bad control message: {exc}"))
            return
        if descriptor in DECLARE:
            dlv.local.data = [conn.declare()]
            dlv.update(DECLARED)
            dlv.settle()
        elif descriptor in DISCHARGE:
            txn_id = _txn_key(fields[0]) if fields else None
            fail = bool(fields[1]) if len(fields) > 1 else False
            tx = conn.transactions.pop(txn_id, None) if txn_id is not None else None
            if tx is None:
                self._reject(dlv, Condition("amqp:transaction:unknown-id",
                                            f"no transaction {txn_id!r}"))
                return
            if fail:
                tx.rollback()
                self._accept(dlv)
                return
            try:
                fut = tx.commit()
            except TransactionRolledBackError as exc:
                self._reject(dlv, condition(exc))
                return
            if fut is None:
                self._accept(dlv)
            else:
                fut.add_done_callback(lambda f: self._committed(dlv, f))
        else:
            self._reject(dlv, Condition("amqp:not-implemented",
                                        f"unknown control message {descriptor!r}"))
        link.flow(1)

    def _committed(self, dlv: Any, fut: Any) -> None:
        exc = fut.exception() if not fut.cancelled() else GatewayError("cancelled")
        if exc is None:
            self._accept(dlv)
        else:
            self._reject(dlv, Condition("amqp:transaction:rollback", str(exc)))
        self.conn.changed()

    def _accept(self, dlv: Any) -> None:
        dlv.update(ACCEPTED)
        dlv.settle()

    def _reject(self, dlv: Any, cond: Condition) -> None:
        dlv.local.condition = cond
        dlv.update(REJECTED)
        dlv.settle()

    def close(self, *, closed: bool = True) -> None:
        self.closed = True


def _txn_key(txn_id: Any) -> Any:
    """Transaction ids arrive as binary (a memoryview from proton): keys are bytes."""
    return bytes(txn_id) if isinstance(txn_id, (memoryview, bytearray)) else txn_id


def selector_and_no_local(source: Terminus) -> tuple[str | None, bool, dict[Any, Any]]:
    """The JMS selector and no-local filters of a source, and the filters we apply (to echo)."""
    filters = data_object(source.filter)
    selector: str | None = None
    no_local = False
    applied: dict[Any, Any] = {}
    if isinstance(filters, dict):
        for key, value in filters.items():
            descriptor = getattr(value, "descriptor", None)
            if descriptor in SELECTOR_FILTERS:
                selector = str(value.value)
                applied[key] = value
            elif descriptor in NO_LOCAL_FILTERS:
                no_local = True
                applied[key] = value
    return selector, no_local, applied


def put_filters(terminus: Terminus, filters: dict[Any, Any]) -> None:
    if filters:
        terminus.filter.put_object(filters)


def dynamic_kind(terminus: Terminus) -> Any:
    return TOPIC if capability_hint(terminus) in (1, 3) else QUEUE

