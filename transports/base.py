"""What every transport shares: bindings to destinations, reconnecting, the export spool,
the inbound queue, loop prevention and the counters.

How this works. The :class:`~transports.manager.TransportManager` (one per gateway) reads
``transports.conf`` and the ``import`` / ``export`` properties of ``topics.conf`` /
``queues.conf`` entries, and starts one :class:`Transport` per section whose type is enabled
in ``gateway.conf`` (``mqtt_transports = enabled``; off by default, as in EMS,
TIBCO EMS User's Guide, chapter "Working With TIBCO Rendezvous", "Overview"). A transport is a
core client of kind ``BRIDGE`` (client id ``$transport:<name>``) plus a connection to the far
side made by its subclass (an MQTT client session, proton, stomp.py). EMS's rules (EMS User's
Guide, chapter "Working With TIBCO Rendezvous", "Topics" and "Queues"):

* **Export** (topics only): for each topic entry that names the transport in ``export``, a
  durable core subscription ``export:<pattern>`` holds what is to go out; its consumer sends
  while the far side is up, and acknowledges each message only when the far side confirmed
  it (or, for QoS 0 / at-most-once, once written). While the far side is down the consumer
  is paused and the subscription *is* the spool: persistent messages are in the store,
  bounded by ``spool_max_msgs`` / ``spool_max_bytes`` with ``spool_policy`` ``block`` (the
  producer waits, as with flow control) or ``reject`` (the producer gets an error). An
  imported message is never exported again (the subscription's selector skips
  ``JMS_GW_IMPORTED``), so a topic that imports and exports does not echo.
* **Import**: a queue entry imports at once, and keeps importing with no receivers; a
  wildcard queue entry (``foo.*``) puts each message into the child queue of its subject,
  created on arrival. A topic entry imports only while some (non-transport) subscription on
  the gateway overlaps it: the far-side subscription is made with the first such local
  subscription and removed with the last (narrowed to the local pattern when that lies
  inside the entry's). Each imported message gets the delivery mode of
  ``topic_import_dm`` / ``queue_import_dm``, the property ``JMS_GW_IMPORTED`` (the
  transport's name), and is published; the far side gets its acknowledgement only once the
  core has taken the message (for a persistent one, after the group commit).
* **Loop prevention** (beyond EMS): every exported message carries the gateway id as its
  origin, a hop count and its trace id in the target protocol's place; an import whose origin
  is this gateway, or whose hop count reached ``max_hops``, is dropped and counted.
* **Duplicates**: the (trace id, destination) of the last :data:`DEDUP_WINDOW` imports of
  gateway-originated messages, shared by all transports: a second copy is dropped and counted
  (a resend after a lost acknowledgement, or a second path); a refused import is forgotten.
  At start the window is seeded with the imports the store kept from before a restart, so
  a crash between storing an import and acknowledging it does not deliver it twice
  (:meth:`~transports.manager.TransportManager.seed_duplicates`; the amqp transport also
  seeds its (message-id, destination) check for messages no gateway sent).
* **Inbound queue** (``inbound_queue_policy``, EMS's ``rv_queue_policy``): imports wait here
  while more than :data:`IMPORT_WINDOW` publishes are unconfirmed; ``DISCARD_FIRST`` /
  ``DISCARD_LAST`` drop from it when it reaches ``max_msgs`` (counted); with
  ``DISCARD_NONE`` the transport stops reading from the far side instead of growing.
* **Delivery log** (docs/delivery-log.md, "A transport's records"): every record of a
  transport's traffic names it (``client``: its name). An import's record is the core's
  ``import``, in the place of a ``publish`` (:meth:`Transport._publish` gives the far side's
  names to ``Broker.publish``); what the export consumers take is a hand-off, not a
  delivery (its connection's consumers write no deliver or ack), and the ``export`` is the
  way out. An import let go is a ``drop`` with what its ``import`` would have carried
  (:meth:`Transport._drop_import`).
* **Reconnect**: a transport that cannot connect, or loses its connection, retries with
  jittered exponential back-off between ``reconnect_min`` and ``reconnect_max``; the
  gateway keeps running (unless the section says ``required = true`` and it cannot connect
  at start-up). State ``connecting`` / ``up`` / ``down`` with the last error, and the
  counters, are in :meth:`Transport.info` (admin API ``/api/v1/transports``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway import subject
from gateway.client import AckMode
from gateway.config.transports import DiscardPolicy
from gateway.errors import GatewayError
from gateway.message import PROP_IMPORTED, QUEUE, TOPIC, Destination, Message
from gateway.monitor import transport_state
from mappings.engine import default_wire
from transports.reply import ReplyRoutes, ReplyTemporaries

if TYPE_CHECKING:
    from gateway.client import Connection, Session
    from gateway.config.transports import TransportDef
    from gateway.consumer import Delivery
    from gateway.endpoint import Subscription
    from transports.manager import TransportManager

log = logging.getLogger("transports")

Far = tuple[str | None, str | None] | None  # (far_id, far_dest) of an import, for the log

# Resends held while the first copy of an import waits for its commit (None once it is in).
Held = list[tuple[Message, Callable[[], None] | None, Far]] | None

IMPORT_WINDOW = 1000  # publishes of one transport waiting for the core before imports queue
EXPORT_WINDOW = 1000  # exports of one binding waiting for the far side's confirmation
READ_PAUSE = 10_000  # inbound-queue length at which a DISCARD_NONE transport stops reading
DEDUP_WINDOW = 100_000  # recent imports remembered for duplicate detection
CLIENT_PREFIX = "$transport:"
EXPORT_SELECTOR = "JMS_GW_IMPORTED IS NULL"
SENT_AS_MAX = 100_000  # exports changed by mappings awaiting their export record, per transport
NO_FAR: tuple[None, None] = (None, None)  # an import whose far-side names are unknown
STOP_WAIT = 5.0  # seconds stop() waits for imports still being stored


class RetryLater(GatewayError):
    """The far side cannot take a message right now: it goes back to the spool."""

    reason = "retry"


class Backoff:
    """Jittered exponential back-off: the n-th wait is uniform in [min, min * 2**n], capped."""

    def __init__(self, low: float, high: float) -> None:
        self.low = low
        self.high = high
        self.failures = 0

    def next(self) -> float:
        ceiling = min(self.high, self.low * (2 ** min(self.failures, 30)))
        self.failures += 1
        return random.uniform(self.low, max(self.low, ceiling))

    def reset(self) -> None:
        self.failures = 0


class ImportBinding:
    """One destination entry a transport imports for."""

    __slots__ = ("pattern", "kind", "remote", "refs")

    def __init__(self, pattern: str, kind: Any) -> None:
        self.pattern = pattern
        self.kind = kind  # QUEUE or TOPIC
        self.remote: dict[str, int] = {}  # far-side subscriptions (core patterns) → users


class ExportBinding:
    """One topic entry a transport exports: its durable spool subscription and consumer."""

    __slots__ = ("transport", "pattern", "consumer", "inflight")

    def __init__(self, transport: Transport, pattern: str) -> None:
        self.transport = transport
        self.pattern = pattern
        self.consumer: Any = None
        self.inflight = 0


class Transport:
    """The shared part of a client transport; subclasses talk to the far side.

    Subclasses implement :meth:`connect` (until the far side accepted the session),
    :meth:`disconnect`, :meth:`remote_subscribe` / :meth:`remote_unsubscribe` (core
    patterns) and :meth:`export` (send one delivery; call :meth:`confirmed` or
    :meth:`failed` for it later, or return True when it needs no confirmation). When the
    connection drops they call :meth:`lost`.
    """

    type = ""
    # True when the far-side session resends unconfirmed messages itself after reconnecting
    # (the MQTT client session keeps its in-flight QoS 1/2 messages and resends them with
    # their packet ids): then a lost connection leaves them in flight instead of giving
    # them back.
    keeps_inflight = False

    def __init__(self, manager: TransportManager, tdef: TransportDef) -> None:
        self.manager = manager
        self.broker = manager.broker
        self.tdef = tdef
        self.name = tdef.name
        self.params = tdef.params
        self.state = "down"
        self.last_error: str | None = None
        self.since = time.time()
        self.backoff = Backoff(float(self.params.get("reconnect_min", 1.0)),
                               float(self.params.get("reconnect_max", 60.0)))
        self.stats = {"imported": 0, "exported": 0, "dropped_loop": 0, "discarded": 0,
                      "duplicates": 0, "failed": 0, "connects": 0}
        # (trace id, destination) of recent imports, shared by every transport of the
        # gateway: a resend of one, or the same message by another path, is dropped.
        self.recent_imports: OrderedDict[tuple[str, str], Held] = manager.recent_imports
        # Its address is its name: the delivery log's ``client`` of its records
        # (``Connection.log_id``).
        self.core: Connection = self.broker.connect(
            client_id=CLIENT_PREFIX + self.name, kind="BRIDGE", authenticated=True,
            protocol=f"transport:{self.type}", address=self.name)
        self.session: Session = self.core.session(AckMode.EXPLICIT)
        self.imports: dict[str, ImportBinding] = {}
        self.exports: dict[str, ExportBinding] = {}
        self.inbound: deque[tuple[Message, Callable[[], None] | None, Far]] = deque()
        # id(delivered message) -> (the message as exported, the rules that changed it)
        self.sent_as: dict[int, tuple[Message, str]] = {}
        self.unconfirmed = 0
        self.reading_paused = False
        self.task: asyncio.Task[None] | None = None
        self.stopping = False
        self.up_event = asyncio.Event()
        # Temporary reply destinations of exports, as far-side names (subclasses that
        # export reply-to override reply_subscribe / reply_unsubscribe).
        self.replies = ReplyRoutes(self.broker, self.reply_subscribe, self.reply_unsubscribe)
        # Far-side reply names of imports, as temporary topics (transports whose far side
        # has reply names that live no longer than their requester, as RV inboxes).
        self.reply_temporaries = ReplyTemporaries(
            self, float(self.params.get("temp_destination_timeout", 60.0)))

    # -- far side (subclasses) ----------------------------------------------------------------

    async def connect(self) -> None:
        raise NotImplementedError

    def disconnect(self) -> None:
        raise NotImplementedError

    def remote_subscribe(self, pattern: str, kind: Any) -> None:
        raise NotImplementedError

    def remote_unsubscribe(self, pattern: str, kind: Any) -> None:
        raise NotImplementedError

    def export(self, d: Delivery, binding: ExportBinding) -> bool:
        """Send one message; True when it is done already (nothing to confirm)."""
        raise NotImplementedError

    def reply_subscribe(self, name: str) -> None:
        """Subscribe to the far-side name of a reply route (see :class:`ReplyRoutes`)."""

    def reply_unsubscribe(self, name: str) -> None:
        """End the far-side subscription of a dropped reply route."""

    def send_reply(self, msg: Message, name: str) -> None:
        """Send ``msg``, published to the temporary topic of far-side reply name ``name``
        (see :class:`ReplyTemporaries`), to that name; raises when it cannot."""
        raise NotImplementedError

    def seed_duplicate(self, msg: Message) -> None:
        """A stored message this transport imported before a restart (see
        :meth:`~transports.manager.TransportManager.seed_duplicates`): a transport that recognises resends by
        something other than the trace id remembers it here."""

    def pause_reading(self) -> None:
        """Stop taking messages from the far side (the inbound queue is full)."""

    def resume_reading(self) -> None:
        pass

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while not self.stopping:
            self._set_state("connecting", None)
            try:
                await self.connect()
            except Exception as exc:  # noqa: BLE001 - every failure is a reason to retry
                self._set_state("down", f"{type(exc).__name__}: {exc}")
                wait = self.backoff.next()
                log.warning("transport %s: cannot connect (%s); retrying in %.1f s",
                            self.name, exc, wait)
                await asyncio.sleep(wait)
                continue
            self.backoff.reset()
            self.stats["connects"] += 1
            self._set_state("up", None)
            log.info("transport %s (%s) is up", self.name, self.type)
            self._on_up()
            await self._down.wait()
            self._down.clear()
            if self.stopping:
                break
            wait = self.backoff.next()
            log.warning("transport %s is down (%s); reconnecting in %.1f s", self.name,
                        self.last_error, wait)
            await asyncio.sleep(wait)

    @property
    def _down(self) -> asyncio.Event:
        ev = getattr(self, "_down_event", None)
        if ev is None:
            ev = self._down_event = asyncio.Event()
        return ev

    def _set_state(self, state: str, error: str | None) -> None:
        previous, self.state = self.state, state
        if error is not None:
            self.last_error = error
        self.since = time.time()
        if state == "up":
            self.up_event.set()
        else:
            self.up_event.clear()
        transport_state(self.broker, self, previous, error)  # $sys.monitor.transport.*

    def lost(self, reason: str) -> None:
        """The far side went away: pause exports (what was in flight goes back to the
        spool, to be sent again) and reconnect."""
        if self.state != "up":
            return
        self._set_state("down", reason)
        for b in self.exports.values():
            if b.consumer is not None:
                b.consumer.core.pause()
        if not self.keeps_inflight:
            self.release_inflight()
        self._down.set()

    def release_inflight(self) -> None:
        """Give back every unconfirmed export (sent again after reconnecting, in their
        order: one release at a time would put each in front of the one before it)."""
        session = self.session
        deliveries = list(session.unacked.values())
        for d in deliveries:
            binding = self.exports.get(getattr(d.consumer, "name", ""))
            if binding is not None:
                binding.inflight -= 1
        session.release_all(deliveries, count_delivery=False)

    def may_export(self) -> bool:
        """Whether the far side takes more exports now (subclasses: their window)."""
        return True

    def _on_up(self) -> None:
        for b in self.imports.values():
            for pattern in b.remote:
                self.remote_subscribe(pattern, b.kind)
        if self.may_export():
            for e in self.exports.values():
                if e.consumer is not None:
                    e.consumer.core.resume()

    async def stop(self) -> None:
        # Imports waiting for their commit get their acknowledgement to the far side first
        # (bounded): otherwise the far side sends them again after a restart, when the
        # duplicate check no longer remembers them.
        deadline = self.broker.loop.time() + STOP_WAIT
        while self.unconfirmed and self.state == "up" and self.broker.loop.time() < deadline:
            await asyncio.sleep(0.01)
        self.stopping = True
        self.replies.close()
        self.reply_temporaries.close()
        self._down.set()
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
        if self.state == "up":
            try:
                self.disconnect()
            except Exception:  # noqa: BLE001
                log.exception("transport %s: disconnect failed", self.name)
        self.release_inflight()
        self._set_state("stopped", None)
        self.core.close()

    # -- bindings -----------------------------------------------------------------------------

    def bind_export(self, pattern: str) -> None:
        if pattern in self.exports:
            return
        b = ExportBinding(self, pattern)
        p = self.params
        consumer = self.session.consumer(
            Destination.topic(pattern), selector=EXPORT_SELECTOR, durable_name=f"export:{pattern}",
            listener=lambda d: self._export(d, b), window=EXPORT_WINDOW, name=pattern)
        sub: Subscription = consumer.endpoint  # type: ignore[assignment]
        self.broker.set_spool(sub, (int(p.get("spool_max_msgs", 0)),
                                    int(p.get("spool_max_bytes", 0)),
                                    p.get("spool_policy", "block") == "block"))
        b.consumer = consumer
        if self.state != "up":
            consumer.core.pause()
        self.exports[pattern] = b

    def _export(self, d: Delivery, binding: ExportBinding) -> None:
        if self.state != "up":  # raced with a disconnect, or a spool met when bound while
            # down (the consumer is still being made): back to the spool
            self.session.release(d, count_delivery=False)
            d.consumer.pause()
            return
        try:
            done = self.export(d, binding)
        except RetryLater:
            self.session.release(d, count_delivery=False)
            binding.consumer.core.pause()
            return
        except Exception as exc:  # noqa: BLE001 - a message the far side cannot take
            self.stats["failed"] += 1
            log.warning("transport %s: cannot export %s: %s", self.name, d.msg.message_id, exc)
            self.sent_as.pop(id(d.msg), None)
            self.session.reject(d, "export failed")
            return
        if done:
            self.stats["exported"] += 1
            self._record("export", d.msg)
            self.session.ack(d)
        else:
            binding.inflight += 1

    def confirmed(self, d: Delivery, binding: ExportBinding) -> None:
        """The far side confirmed an export: it leaves the spool."""
        binding.inflight -= 1
        self.stats["exported"] += 1
        self._record("export", d.msg)
        self.session.ack(d)

    def failed(self, d: Delivery, binding: ExportBinding, reason: str) -> None:
        """The far side refused an export: it is undeliverable (EMS: never silently)."""
        binding.inflight -= 1
        self.stats["failed"] += 1
        log.warning("transport %s: %s refused by the far side: %s", self.name,
                    d.msg.message_id, reason)
        self.sent_as.pop(id(d.msg), None)
        self.session.reject(d, reason)

    def bind_import(self, pattern: str, kind: Any) -> bool:
        """Import for a destination entry; False when it already does."""
        if pattern in self.imports:
            return False
        b = ImportBinding(pattern, kind)
        self.imports[pattern] = b
        if kind == QUEUE:
            self._add_remote(b, pattern)
        return True

    def _add_remote(self, b: ImportBinding, pattern: str) -> None:
        n = b.remote.get(pattern, 0)
        b.remote[pattern] = n + 1
        if n == 0 and self.state == "up":
            self.remote_subscribe(pattern, b.kind)

    def _remove_remote(self, b: ImportBinding, pattern: str) -> None:
        n = b.remote.get(pattern, 0)
        if n <= 1:
            b.remote.pop(pattern, None)
            if n == 1 and self.state == "up":
                self.remote_unsubscribe(pattern, b.kind)
        else:
            b.remote[pattern] = n - 1

    def local_subscription(self, pattern: str, added: bool, only: str | None = None) -> None:
        """A subscription on the gateway appeared or went: start or stop topic imports
        (``only``: for that import entry alone, as when it is bound later)."""
        for b in self.imports.values():
            if b.kind != TOPIC or not subject.intersects(b.pattern, pattern):
                continue
            if only is not None and b.pattern != only:
                continue
            remote = pattern if subject.contains(b.pattern, pattern) else b.pattern
            if added:
                self._add_remote(b, remote)
            else:
                self._remove_remote(b, remote)

    def wire_mapping(self, dest: Destination, direction: str) -> Callable[..., Any]:
        """The wire side of the mapping of ``dest`` for this transport: the protocol's
        default mapping (:func:`mappings.engine.default_wire`, with the signature of its
        hand-written one, e.g. ``stomp_to_message``) unless a declarative rule replaces or
        extends a default rule, or addresses a wire field, here (mappings/README.md,
        "Overriding the default mappings"). Raises MappingFailed for a rule."""
        mappings = self.broker.mappings
        if mappings is None:
            return default_wire(self.type, direction)
        fn: Callable[..., Any] = mappings.wire_for(dest, protocol=self.type, direction=direction,
                                                   transport=self.name)
        return fn

    def outgoing(self, msg: Message) -> Message:
        """The message as exported: through the declarative mappings for this transport
        (direction ``out``), then without headers or properties when the section says so
        (``export_headers`` / ``export_properties``, EMS User's Guide, "transports.conf"). The
        delivered message itself is never changed (other subscribers share it).

        Raises:
            MappingFailed: a mapping rule failed (the export is refused).
        """
        delivered = msg
        rules = None
        mappings = self.broker.mappings
        if mappings is not None:
            msg = mappings.apply(msg, protocol=self.type, direction="out", transport=self.name)
            if msg is not delivered:
                rules = mappings.rule_names(delivered.destination, protocol=self.type,
                                            direction="out",
                                            transport=self.name)
        p = self.params
        if p.get("export_headers", True) and p.get("export_properties", True):
            if rules is not None:
                self._sent_as(delivered, msg, rules)
            return msg
        copy = msg.copy()
        if not p.get("export_properties", True):
            copy.properties = {}
        if not p.get("export_headers", True):
            copy.type = None
            copy.correlation_id = None
            copy.reply_to = None
            copy.priority = 4
            copy.expiration = copy.expires_at = 0
        if not p.get("export_properties", True) and delivered.properties:
            rules = (rules + "," if rules else "") + "export_properties=false"
        if rules is not None:
            self._sent_as(delivered, copy, rules)
        return copy

    def _sent_as(self, delivered: Message, out: Message, rules: str) -> None:
        """Remember that ``delivered`` leaves as ``out``, changed by ``rules``, for its
        ``export`` record (which may be written later, when the far side confirms it). The
        log's head of ``out`` (its hashes) is made now: the transport may add its own markers
        to ``out`` before sending it."""
        broker = self.broker
        if not broker.log_enabled:
            return
        broker.dlog.head(out)
        sent = self.sent_as
        if len(sent) >= SENT_AS_MAX:  # exports that never ended (a spool dropped): forget
            sent.clear()
        sent[id(delivered)] = (out, rules)

    def far_name(self, msg: Message) -> tuple[str | None, str | None]:
        """The far side's ``(message id, destination name)`` of an export of ``msg`` (the
        message as sent), for the delivery log; each None when the far side has none or it
        is not known here. Transports name theirs."""
        return None, None

    # -- importing ----------------------------------------------------------------------------

    def imported(self, msg: Message, origin: str | None, hops: int,
                 ack: Callable[[], None] | None, far_dest: str | None = None,
                 far_id: str | None = None, duplicate: bool = False) -> None:
        """Take one message from the far side; ``ack`` tells the far side it is safe.

        ``far_dest`` is the far side's name of the destination it came from (topic, address,
        subject), ``far_id`` its id there (by default the message's id as it came, before the
        core stamps one). Both go to the delivery log's ``import`` record (``far_dest``,
        ``far_id``, docs/delivery-log.md), and to the ``drop`` record of an import let go.
        ``duplicate``: the transport knows ``msg`` for a resend of a message imported before
        by a check of its own (the amqp and stomp transports: a message-id seen before); it
        is dropped as this method's duplicate check drops one, with the same record.
        """
        far: Far = (far_id if far_id is not None else msg.message_id, far_dest)
        mappings = self.broker.mappings
        if mappings is not None:
            try:
                msg = mappings.apply(msg, protocol=self.type, direction="in",
                                     transport=self.name)
            except GatewayError as exc:  # MappingFailed: refused, counted, logged
                self.stats["failed"] += 1
                log.warning("transport %s: import refused by a mapping: %s", self.name, exc)
                self._drop_import(msg, "mapping", far, ack)
                return
        # Marked before the checks below, so that the record of a copy they drop hashes the
        # message as its import record would have.
        dest = msg.destination
        kind = dest.kind if dest is not None else TOPIC
        msg.delivery_mode = self.params[
            "queue_import_dm" if kind == QUEUE else "topic_import_dm"]
        msg.properties[PROP_IMPORTED] = self.name
        if origin is not None and origin == self.broker.id:
            self.stats["dropped_loop"] += 1
            self._drop_import(msg, "loop", far, ack)
            return
        if hops >= int(self.params.get("max_hops", 8)):
            self.stats["dropped_loop"] += 1
            self._drop_import(msg, "max_hops", far, ack)
            return
        if origin is not None:
            msg.origin = origin
        msg.hops = hops + 1
        if duplicate:
            self.stats["duplicates"] += 1
            self._drop_import(msg, "duplicate", far, ack)
            return
        if msg.trace_id is not None and dest is not None:
            # A message another gateway sent carries its trace id: one seen already on this
            # destination is a resend after a lost acknowledgement (at-least-once links,
            # AMQP and STOMP) or a second path to the same message. Drop it, counted.
            # While the first copy waits for its commit, the resend's acknowledgement waits
            # with it: should that commit fail, the resend is imported instead.
            key = (msg.trace_id, dest.name)
            recent = self.recent_imports
            if key in recent:
                self.stats["duplicates"] += 1
                held = recent[key]
                if held is not None:
                    self._drop_import(msg, "duplicate", far, None)
                    held.append((msg, ack, far))
                else:
                    self._drop_import(msg, "duplicate", far, ack)
                return
            recent[key] = []
            if len(recent) > DEDUP_WINDOW:
                for _, held_ack, _ in recent.popitem(last=False)[1] or ():
                    if held_ack is not None:
                        held_ack()  # long enough ago for the first copy to be in
        if self.unconfirmed >= IMPORT_WINDOW or self.inbound:
            self._enqueue(msg, ack, far)
            return
        self._publish(msg, ack, far)

    def _enqueue(self, msg: Message, ack: Callable[[], None] | None, far: Far) -> None:
        """Hold an import while the core is busy; apply the inbound queue policy when full
        (EMS User's Guide, "Configuring Transports for Rendezvous", rv_queue_policy: FIRST
        drops the oldest, LAST the most recently received)."""
        policy = self.params.get("inbound_queue_policy")
        inbound = self.inbound
        if (policy is not None and policy.policy is not DiscardPolicy.NONE
                and len(inbound) >= policy.max_msgs):
            if policy.policy is DiscardPolicy.FIRST:
                for _ in range(min(policy.qty_discard, len(inbound))):
                    self._discard(*inbound.popleft())
            else:
                self._discard(msg, ack, far)  # the newest is the one arriving now
                for _ in range(min(policy.qty_discard - 1, len(inbound))):
                    self._discard(*inbound.pop())
                return
        inbound.append((msg, ack, far))
        if len(inbound) >= READ_PAUSE and not self.reading_paused:
            self.reading_paused = True
            self.pause_reading()

    def _discard(self, msg: Message, ack: Callable[[], None] | None, far: Far) -> None:
        self.stats["discarded"] += 1
        self._drop_import(msg, "inbound_queue_policy", far, ack)

    def _drop_import(self, msg: Message, reason: str, far: Far,
                     ack: Callable[[], None] | None) -> None:
        """Let an import go (``reason``, docs/delivery-log.md, "Events"), then acknowledge it
        to the far side. Its ``drop`` record carries what its ``import`` record would have:
        the id the core would have given it (a far side's id is kept), its size, and the
        far side's names, so the record identifies the copy dropped."""
        broker = self.broker
        if broker.log_enabled:
            if msg.message_id is None or msg.trace_id is None or not msg.size:
                broker.stamp(msg, self.core, broker.now())
            self._record("drop", msg, reason, far=far)
        if ack is not None:
            ack()

    def import_record(self, msg: Message, far: Far) -> tuple[str, str, bytes] | None:
        """A record (namespace, key, value) of the gateway's store to write with the import of
        ``msg``, in the same commit: a transport's own position in the far side's stream, so
        that after a crash it knows what it imported already (the rv transport's certified
        imports). None: nothing (every transport but that one)."""
        return None

    def _publish(self, msg: Message, ack: Callable[[], None] | None, far: Far = None) -> None:
        # The core writes the delivery log's import record (client: this transport's name):
        # the one record of the message entering the gateway.
        record = self.import_record(msg, far)
        if record is not None:
            # In the store's current unit: the message's own commit, when the core stores it.
            self.broker.store.put_kv(*record)
        try:
            fut = self.broker.publish(msg, self.core, far=far if far is not None else NO_FAR)
        except GatewayError as exc:
            if record is not None:
                self.broker.store.commit()
            self.stats["failed"] += 1
            self._forget(msg)
            log.warning("transport %s: import to %s refused: %s", self.name, msg.destination, exc)
            if ack is not None:
                ack()  # refused for good (no such destination, limits): EMS drops it too
            return
        self.stats["imported"] += 1
        if record is not None:
            # Written with the message when the core stored it (its commit took the unit);
            # otherwise on its own, now.
            self.broker.store.commit()
        if fut is None or (fut.done() and fut.exception() is None):
            if ack is not None:
                ack()
            self._taken(msg)
            return
        self.unconfirmed += 1
        fut.add_done_callback(lambda f: self._published(f, msg, ack))

    def _forget(self, msg: Message) -> None:
        """A message not taken after all: its resend must not count as a duplicate, and one
        that arrived meanwhile (held by :meth:`imported`) is imported in its place."""
        if msg.trace_id is not None and msg.destination is not None:
            key = (msg.trace_id, msg.destination.name)
            held = self.recent_imports.pop(key, None)
            if held:
                self.stats["duplicates"] -= 1
                first, ack, far = held[0]
                self.recent_imports[key] = held[1:]
                self._publish(first, ack, far)

    def _taken(self, msg: Message) -> None:
        """The core has ``msg``: resends of it that arrived meanwhile are acknowledged."""
        if msg.trace_id is not None and msg.destination is not None:
            key = (msg.trace_id, msg.destination.name)
            recent = self.recent_imports
            held = recent.get(key)
            if held is not None:
                recent[key] = None
                for _, ack, _ in held:
                    if ack is not None:
                        ack()

    def _published(self, fut: asyncio.Future[None], msg: Message,
                   ack: Callable[[], None] | None) -> None:
        self.unconfirmed -= 1
        if fut.cancelled() or fut.exception() is not None:
            self._forget(msg)
            # Not stored: the far side keeps it (no acknowledgement) and sends it again.
            self.stats["failed"] += 1
            log.warning("transport %s: import of %s not stored: %s", self.name,
                        msg.message_id, fut.exception() if not fut.cancelled() else "cancelled")
        else:
            if ack is not None:
                ack()
            self._taken(msg)
        inbound = self.inbound
        while inbound and self.unconfirmed < IMPORT_WINDOW:
            m, a, f = inbound.popleft()
            self._publish(m, a, f)
        if self.reading_paused and len(inbound) < READ_PAUSE // 2:
            self.reading_paused = False
            self.resume_reading()

    # -- observability ------------------------------------------------------------------------

    def _record(self, event: str, msg: Message, reason: str | None = None, *,
                far: Far = None, rules: str | None = None, lost: int | None = None) -> None:
        """One delivery-log record of this transport (an ``export`` or a ``drop``; its
        imports' records are the core's, see :meth:`_publish`): ``client`` its name;
        ``far`` is ``(far_id, far_dest)``, ``rules`` the mapping rules that changed an
        export, ``lost`` a bus's DATALOSS count (the version 2 keys of
        docs/delivery-log.md)."""
        broker = self.broker
        if broker.log_enabled:
            if event == "export":
                sent = self.sent_as.pop(id(msg), None) if self.sent_as else None
                if sent is not None:
                    msg, rules = sent
                if far is None:
                    far = self.far_name(msg)
            dest = msg.destination
            extra = None
            if far is not None or rules is not None or lost is not None:
                far_id, far_dest = far if far is not None else (None, None)
                extra = (rules, far_id, far_dest, lost)
            broker.dlog.record(event, msg, str(dest) if dest is not None else "", self.name,
                               0, reason, extra)

    def info(self) -> dict[str, Any]:
        spooled = 0
        for b in self.exports.values():
            if b.consumer is not None:
                spooled += b.consumer.endpoint.count
        return {
            "name": self.name, "type": self.type, "state": self.state,
            "last_error": self.last_error, "since": self.since,
            "imports": {p: sorted(b.remote) for p, b in self.imports.items()},
            "exports": sorted(self.exports), "spooled": spooled,
            "inbound_queue": len(self.inbound), **self.stats,
        }
