"""A STOMP connection's subscriptions, their acknowledgements and its transactions.

The frame handlers of ``SUBSCRIBE`` / ``UNSUBSCRIBE``, ``ACK`` / ``NACK`` and ``BEGIN`` /
``COMMIT`` / ``ABORT``: :data:`adapters.stomp.connection._HANDLERS` calls them with the
:class:`~adapters.stomp.connection.StompConnection` and the frame, as it calls the
connection's own methods for the other frames, and a refusal is a
:class:`~adapters.stomp.codec.FrameRefused` the connection turns into an ERROR frame.

* ``SUBSCRIBE`` makes a :class:`StompSubscription`: a core consumer whose listener
  (:meth:`StompSubscription.deliver`) writes ``MESSAGE`` frames. ``ack:auto`` consumes on a
  session that tracks nothing (a durable subscription's on an auto-acknowledge session);
  ``client`` and ``client-individual`` on the connection's explicit-acknowledge session, with
  a window of :data:`DEFAULT_PREFETCH` unacknowledged messages unless the frame asks for
  another (ActiveMQ's and RabbitMQ's prefetch headers). Durable subscriptions are ActiveMQ's
  (named by ``activemq.subscriptionName``, scoped by ``client-id``) or RabbitMQ's
  (``durable:true``: shared, gateway-wide, named by ``x-queue-name`` or the id). A SEND whose
  ``reply-to`` is ``/temp-queue/x`` subscribes the connection to it
  (:func:`reply_subscription`, RabbitMQ's temp-queue replies).
* ``ACK`` / ``NACK`` name a delivery by its ``ack`` id (STOMP 1.2) or by ``message-id``
  (1.0, 1.1) and settle it (``client`` mode: every delivery of the subscription up to it;
  ``client-individual``: it alone). A NACK gives the messages back for redelivery in their
  order; RabbitMQ's ``requeue:false`` makes them undeliverable.
* ``BEGIN`` opens a core transaction (:func:`transaction` finds it for a SEND, ACK or NACK
  that names it); ACKs in it take effect at ``COMMIT``, and so do its NACKs, which
  ``ABORT`` gives back with the acknowledged messages.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from adapters.stomp.codec import Frame, FrameRefused, escape
from gateway.message import TOPIC, Destination
from mappings.stomp import SUBSCRIBE_TRANSFORMATIONS

if TYPE_CHECKING:
    from adapters.stomp.connection import StompConnection
    from gateway.client import MessageConsumer, Session, Transaction
    from gateway.consumer import Delivery

log = logging.getLogger("adapters.stomp")

DEFAULT_PREFETCH = 1000  # unacknowledged messages per client-ack subscription

DURABLE_HEADERS = ("activemq.subscriptionName", "durable-subscription-name")
RABBIT_DURABLE_HEADERS = ("durable", "persistent")  # SUBSCRIBE: RabbitMQ's, then its older one
PREFETCH_HEADERS = ("activemq.prefetchSize", "prefetch-count")
NO_LOCAL_HEADERS = ("activemq.noLocal", "no-local")
ACK_MODES = ("auto", "client", "client-individual")


class StompSubscription:
    """One SUBSCRIBE: a core consumer whose deliveries become MESSAGE frames."""

    __slots__ = ("conn", "id", "dest", "ack", "consumer", "session", "durable_name",
                 "by_message_id", "head", "transformation")

    def __init__(self, conn: StompConnection, sid: str, dest: Destination, ack: str) -> None:
        self.conn = conn
        self.id = sid
        self.dest = dest
        self.ack = ack  # "auto", "client" or "client-individual"
        self.consumer: MessageConsumer | None = None
        self.session: Session | None = None
        self.durable_name: str | None = None
        self.transformation: str | None = None  # the body form asked for (ActiveMQ's header)
        # STOMP 1.0 and 1.1 acknowledge by message-id: message id → delivery tag.
        self.by_message_id: dict[str, int] = {}
        self.head = "MESSAGE\nsubscription:" + escape(sid, conn.version) + "\nmessage-id:"

    def deliver(self, d: Delivery) -> None:
        """The core consumer's listener: one MESSAGE frame.

        The delivery's own headers come first (``subscription``, ``message-id``, ``ack``,
        ``redelivered``), then the message's, which the server renders and encodes once per
        message and version however many subscribers get it.
        """
        conn = self.conn
        msg = d.msg
        version = conn.version
        try:
            block, body = conn.server.render(msg, conn, self.transformation)
        except Exception as exc:  # a value no STOMP frame can carry: never retried forever
            log.warning("stomp %s: cannot send message %s: %s", conn.address,
                        msg.message_id, exc)
            d.consumer.session.reject(d, "unsendable")
            return
        mid = msg.message_id or str(d.tag)
        if version != "1.2" and ("\r" in mid or "\n" in mid):
            mid = mid.replace("\r", "%0D").replace("\n", "%0A")  # 1.0 / 1.1 cannot carry them
        parts = [self.head, mid if version == "1.0" else escape(mid, version)]
        if self.ack != "auto":
            if version == "1.2":
                parts.append("\nack:")
                parts.append(str(d.tag))
            else:
                self.by_message_id[mid] = d.tag
        if d.count > 1:
            parts.append("\nredelivered:true")
        parts.append("\n")
        conn.write(b"".join(("".join(parts).encode(), block, body, b"\0")))


# -- SUBSCRIBE / UNSUBSCRIBE ------------------------------------------------------------------

def handle_subscribe(conn: StompConnection, frame: Frame) -> None:
    core = conn.require_connected(frame)
    headers = frame.first_headers()
    text = headers.get("destination")
    sid = headers.get("id")
    if sid is None:
        if conn.version != "1.0":
            raise FrameRefused("missing id header", "SUBSCRIBE needs an id (STOMP 1.1+)")
        sid = text or ""
    if sid in conn.subscriptions:
        raise FrameRefused("duplicate subscription id", f"subscription {sid!r} exists")
    dest = conn.destination(text, frame)
    ack = headers.get("ack", "auto")
    if ack not in ACK_MODES:
        raise FrameRefused("bad ack mode", f"ack {ack!r}: use auto, client or "
                            "client-individual")
    transformation = headers.get("transformation")
    if transformation is not None and transformation not in SUBSCRIBE_TRANSFORMATIONS:
        raise FrameRefused("unsupported transformation",
                            f"{transformation!r}: a subscription may ask for "
                            + ", ".join(sorted(SUBSCRIBE_TRANSFORMATIONS)))
    durable = _header(headers, DURABLE_HEADERS)
    if durable is not None:
        if dest.kind != TOPIC:
            raise FrameRefused("durable subscriptions are for topics", text or "")
        if not core.client_id:
            raise FrameRefused("durable subscription needs a client-id",
                                "send client-id in CONNECT to name durable subscriptions")
    rabbit_durable = durable is None and dest.kind == TOPIC and _rabbit_durable(headers)
    if rabbit_durable:
        # RabbitMQ's durable subscription: a queue named x-queue-name (else by the id)
        # that any connection may come back to: a shared durable subscription of that
        # name in the gateway-wide scope, no client-id needed.
        durable = headers.get("x-queue-name") or sid
    implicit = conn.subscriptions.get(text or "")
    if implicit is not None and implicit.id != sid and implicit.dest == dest:
        conn.subscriptions.pop(implicit.id)  # the SEND's reply-to subscription, replaced
        if implicit.consumer is not None:
            implicit.consumer.close()
    prefetch_text = _header(headers, PREFETCH_HEADERS)
    window: int | None
    if ack == "auto":
        window = None
    elif prefetch_text is None:
        window = DEFAULT_PREFETCH
    else:
        if not prefetch_text.isdigit() or int(prefetch_text) < 1:
            raise FrameRefused("bad prefetch", f"{prefetch_text!r} is not a positive number")
        window = int(prefetch_text)
    no_local = (_header(headers, NO_LOCAL_HEADERS) or "").lower() == "true"
    sub = StompSubscription(conn, sid, dest, ack)
    sub.transformation = transformation
    if ack != "auto":
        session = conn.client_session
    elif durable is not None:
        session = conn.durable_session
    else:
        session = conn.auto_session
    assert session is not None
    sub.session = session
    sub.durable_name = durable
    sub.consumer = session.consumer(
        dest, selector=headers.get("selector"), no_local=no_local, listener=sub.deliver,
        window=window, durable_name=durable, name=sid,
        shared_name=durable if rabbit_durable else None,
        share_scope="" if rabbit_durable else None,
        # RabbitMQ's trailing '#' matches zero words too: a.# gets a as well as a.>
        parent_match=dest.kind == TOPIC and dest.name.endswith(".>") and
        (text or "").endswith(".#"),
    )
    conn.subscriptions[sid] = sub
    if conn.write_paused:
        sub.consumer.core.pause()
    ready = conn.broker.cluster_ready()
    if ready is not None:  # a cluster node: the RECEIPT once the other nodes have it
        conn.wait_for_confirmation(ready)
    conn.receipt(frame)


def reply_subscription(conn: StompConnection, text: str, dest: Destination) -> None:
    """RabbitMQ's temp-queue replies (its STOMP plugin, "Temp Queue Destinations"): a SEND
    whose ``reply-to`` is ``/temp-queue/x`` subscribes the connection to that queue, with
    the subscription id ``/temp-queue/x`` and ``ack:auto``, unless it already has a
    subscription on it (an ActiveMQ client subscribes itself)."""
    for sub in conn.subscriptions.values():
        if sub.dest == dest:
            return
    if text in conn.subscriptions:
        return
    session = conn.auto_session
    assert session is not None
    sub = StompSubscription(conn, text, dest, "auto")
    sub.session = session
    sub.consumer = session.consumer(dest, listener=sub.deliver, window=None, name=text)
    conn.subscriptions[text] = sub
    if conn.write_paused:
        sub.consumer.core.pause()


def handle_unsubscribe(conn: StompConnection, frame: Frame) -> None:
    core = conn.require_connected(frame)
    headers = frame.first_headers()
    durable = _header(headers, DURABLE_HEADERS)
    sid = headers.get("id")
    if sid is None and conn.version == "1.0":
        sid = headers.get("destination")
    known = conn.subscriptions.get(sid) if sid is not None else None
    if durable is None and sid is not None and _rabbit_durable(headers) and (
            known is None or known.dest.kind == TOPIC):
        # RabbitMQ: UNSUBSCRIBE with durable:true deletes a topic subscription's queue
        # (on a queue subscription the header only repeats how the queue was declared).
        assert conn.durable_session is not None
        sub = conn.subscriptions.pop(sid, None)
        if sub is not None and sub.consumer is not None:
            sub.consumer.close()
        conn.durable_session.unsubscribe(headers.get("x-queue-name") or sid, "")
        conn.receipt(frame)
        return
    if sid is None and durable is None:
        raise FrameRefused("missing id header", "UNSUBSCRIBE needs the subscription id")
    sub = conn.subscriptions.pop(sid, None) if sid is not None else None
    if sub is None and durable is None:
        raise FrameRefused("unknown subscription", f"no subscription {sid!r}")
    if sub is not None and sub.consumer is not None:
        sub.consumer.close()
    if durable is not None:
        if not core.client_id:
            raise FrameRefused("durable subscription needs a client-id",
                                "send client-id in CONNECT to name durable subscriptions")
        assert conn.durable_session is not None
        conn.durable_session.unsubscribe(durable)
    conn.receipt(frame)


# -- ACK / NACK -------------------------------------------------------------------------------

def handle_ack(conn: StompConnection, frame: Frame) -> None:
    _settle(conn, frame, nack=False)


def handle_nack(conn: StompConnection, frame: Frame) -> None:
    if conn.version == "1.0":
        raise FrameRefused("unknown command", "NACK is STOMP 1.1 and later")
    _settle(conn, frame, nack=True)


def _settle(conn: StompConnection, frame: Frame, *, nack: bool) -> None:
    conn.require_connected(frame)
    headers = frame.first_headers()
    sub, tag = _find_delivery(conn, headers, frame)
    session = conn.client_session
    assert session is not None
    txn = headers.get("transaction")
    tx = transaction(conn, txn, frame) if txn is not None else None
    if sub is not None and tag is not None:
        tags = _tags(conn, sub, tag)
        drop = nack and headers.get("requeue", "true").lower() == "false"
        if drop and tx is not None:
            conn.tx_rejects.setdefault(txn, []).extend(tags)  # type: ignore[arg-type]
        elif drop:  # RabbitMQ's requeue:false: dead-lettered or dropped, not redelivered
            for t in tags:
                session.reject(t, "nacked")
        elif nack and tx is not None:
            conn.tx_nacks.setdefault(txn, []).extend((sub, t) for t in tags)  # type: ignore[arg-type]
        elif nack:  # (a cumulative NACK gives them back in their order)
            _release(conn, ((sub, t) for t in tags))
        else:
            for t in tags:
                if tx is not None:
                    d = session.unacked.get(t)
                    if d is not None:
                        tx.ack(d)
                else:
                    session.ack(t)
    conn.receipt(frame)


def _find_delivery(conn: StompConnection, headers: dict[str, str], frame: Frame
                   ) -> tuple[StompSubscription | None, int | None]:
    """The subscription and delivery tag an ACK or NACK names (``None``: already done)."""
    session = conn.client_session
    assert session is not None
    if conn.version == "1.2":
        ack_id = headers.get("id")
        if ack_id is None:
            raise FrameRefused("missing id header", f"{frame.command} needs the ack id")
        if not ack_id.isdigit() or int(ack_id) >= session.next_tag:
            raise FrameRefused("unknown ack id", f"no message was sent with ack {ack_id!r}")
        tag = int(ack_id)
        d = session.unacked.get(tag)
        if d is None:
            return None, None  # settled already (an earlier cumulative ACK, a redelivery)
        for sub in conn.subscriptions.values():
            if sub.consumer is not None and sub.consumer.core is d.consumer:
                return sub, tag
        return None, None
    mid = headers.get("message-id")
    if mid is None:
        raise FrameRefused("missing message-id header", f"{frame.command} needs message-id")
    sid = headers.get("subscription")
    if sid is not None:
        named = conn.subscriptions.get(sid)
        if named is None:
            raise FrameRefused("unknown subscription", f"no subscription {sid!r}")
        candidates = [named]
    else:
        candidates = list(conn.subscriptions.values())
    for candidate in candidates:
        found = candidate.by_message_id.get(mid)
        if found is not None:
            return candidate, found
    return None, None


def _tags(conn: StompConnection, sub: StompSubscription, tag: int) -> list[int]:
    """The deliveries an ACK of ``tag`` settles: all of the subscription's up to it in
    ``client`` mode, just it in ``client-individual`` mode."""
    session = conn.client_session
    assert session is not None and sub.consumer is not None
    if sub.ack == "client":
        core = sub.consumer.core
        tags = [t for t, d in session.unacked.items() if t <= tag and d.consumer is core]
    else:
        tags = [tag] if tag in session.unacked else []
    if sub.by_message_id:
        settled = set(tags)
        for mid, t in list(sub.by_message_id.items()):
            if t in settled:
                del sub.by_message_id[mid]
    return tags


# -- transactions ------------------------------------------------------------------------------

def transaction(conn: StompConnection, txn: str | None, frame: Frame) -> Transaction:
    tx = conn.transactions.get(txn) if txn is not None else None
    if tx is None:
        raise FrameRefused("unknown transaction", f"no transaction {txn!r} was begun")
    return tx


def _txn_header(frame: Frame) -> str:
    txn = frame.get("transaction")
    if txn is None:
        raise FrameRefused("missing transaction header", f"{frame.command} needs one")
    return txn


def handle_begin(conn: StompConnection, frame: Frame) -> None:
    core = conn.require_connected(frame)
    txn = _txn_header(frame)
    if txn in conn.transactions:
        raise FrameRefused("transaction already begun", f"transaction {txn!r} is open")
    conn.transactions[txn] = core.transaction()
    conn.receipt(frame)


def handle_commit(conn: StompConnection, frame: Frame) -> None:
    conn.require_connected(frame)
    txn = _txn_header(frame)
    tx = transaction(conn, txn, frame)
    del conn.transactions[txn]
    nacks = conn.tx_nacks.pop(txn, ())
    rejects = conn.tx_rejects.pop(txn, ())
    fut = tx.commit()
    session = conn.client_session
    assert session is not None
    _release(conn, nacks)
    for t in rejects:
        session.reject(t, "nacked")
    if fut is not None and not fut.done():
        conn.wait_for_confirmation(fut)
    conn.receipt(frame)


def handle_abort(conn: StompConnection, frame: Frame) -> None:
    conn.require_connected(frame)
    txn = _txn_header(frame)
    tx = transaction(conn, txn, frame)
    del conn.transactions[txn]
    tx.rollback()
    session = conn.client_session
    assert session is not None
    _release(conn, conn.tx_nacks.pop(txn, ()))
    rejected = conn.tx_rejects.pop(txn, ())
    session.release_all([session.unacked[t] for t in rejected if t in session.unacked])
    conn.receipt(frame)


def _release(conn: StompConnection, nacks: Iterable[tuple[StompSubscription, int]]) -> None:
    """NACKed deliveries back for redelivery, in their order."""
    session = conn.client_session
    assert session is not None
    unacked = session.unacked
    session.release_all([unacked[t] for _sub, t in nacks if t in unacked])


def _header(headers: dict[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        value = headers.get(name)
        if value is not None:
            return value
    return None


def _rabbit_durable(headers: dict[str, str]) -> bool:
    """RabbitMQ's durable topic subscription (its STOMP plugin, "Durable Topic
    Subscriptions"): ``durable:true`` (or the older ``persistent:true``) and not
    ``auto-delete:true``."""
    flag = _header(headers, RABBIT_DURABLE_HEADERS)
    return flag is not None and flag.lower() == "true" and \
        headers.get("auto-delete", "false").lower() != "true"
