"""The ``rv`` transport: the gateway on the RV-style bus (``type = rv`` in transports.conf).

How this works. The bridge is a :class:`~transports.base.Transport` (bindings, spool, inbound
queue, loop markers and counters are base.py's) whose far side is an
:class:`~transports.rv.transport.AsyncTransport` on the gateway's own loop, opened with the
section's ``service`` (a port, or a udp service name that transports.conf's reader looked up
as :mod:`transports.rv.net` does), ``network`` and ``daemon`` (TIBCO EMS User's Guide,
"Working With TIBCO Rendezvous", "Rendezvous Parameters"). Subjects are destination names
(the same ``*`` / ``>`` grammar): an import entry is a
:class:`~transports.rv.transport.Listener` on its pattern, an export sends on the
destination's name. Messages cross by the RV mapping
(:mod:`mappings.rv`, EMS's "Message Translation"), with the section's ``export_headers`` /
``export_properties`` deciding the ``JMSHeaders`` / ``JMSProperties`` submessages.

* ``_RV.>`` and ``_LOCAL.>`` are never bridged (TIBCO Rendezvous Concepts, "Subject Names":
  the bus's own and this process's): an export to one is refused, an arrival on one dropped.
* Loop prevention: every export carries the envelope's origin marker (the gateway id that
  first accepted the message and its hop count, :class:`~transports.rv.message.Origin`);
  base.py drops an import whose origin is this gateway or that crossed ``max_hops``.
* Trace ids: the origin marker's id is ``<gateway id> <trace id>`` (:func:`origin_marker`;
  a gateway id has no blank), so a gateway importing the message keeps its trace id, and
  the delivery logs of both gateways carry one trace (base.py's duplicate check uses it
  too). The envelope is the bus's, not the message's: plain RV listeners see no extra field,
  and ``export_headers`` / ``export_properties`` do not remove it. A marker without a blank
  (another bus program's, or an older gateway's) is a gateway id alone.
* Replies: an export whose ``JMSReplyTo`` is a temporary destination gets an inbox of this
  bridge as its reply subject (:class:`~transports.reply.ReplyRoutes`: what comes to the inbox
  goes to the temporary destination while it exists); a named ``JMSReplyTo`` is sent as its
  name. An import whose reply subject is an inbox gets ``JMSReplyTo`` = a temporary topic of
  the gateway standing for that inbox (EMS User's Guide, "JMSReplyTo"; one per inbox, so
  several requests from one inbox share it; :class:`~transports.reply.ReplyTemporaries`):
  whatever is published to it (by an MQTT, AMQP or STOMP responder, or a client of the
  core) goes point to point to the inbox. It is deleted ``temp_destination_timeout``
  seconds after its last use (a request or a reply), and when the bridge disconnects. Any
  other reply subject becomes the topic of that name.
* ``rv_queue_policy`` (``inbound_queue_policy``) is also the limit policy of the bus queue
  the bridge's listeners wait in (EMS User's Guide, "How Rendezvous Messages are Imported":
  one Rendezvous queue per transport): a burst the loop has not dispatched yet is cut to
  ``max_msgs`` as the policy says, counted in ``discarded`` (``bus_queue`` in :meth:`info`:
  the events waiting there). With ``DISCARD_NONE`` the listeners use the bus's own queue.
* Delivery log: an import's and an export's ``far_dest`` is the subject (a reply's: the
  inbox); ``far_id`` is null, as the bus gives a message no id; an export the mapping rules
  changed names them (``rules``) and hashes the copy sent.
* Advisories: ``DATALOSS`` and ``CLIENT.SLOWCONSUMER`` of the bus are written to the
  delivery log (event ``drop``, reason the advisory's name, with the lost packet count) and
  counted (``dataloss``, ``slowconsumer`` in :meth:`info`); nothing is replayed (the bus
  said the data is gone).
* Certified delivery (``cm_name`` given; EMS's ``tibrvcm`` parameters, EMS User's Guide,
  "Configuring Transports for Rendezvous Certified Messaging"): the bridge is a persistent
  correspondent of that name (:class:`~transports.rv.cmtransport.CmTransport`, its ledger in
  ``ledger_file``). Imports are CM listeners with explicit confirmation: a certified
  message is confirmed to its sender only once the core has it (stored, when its delivery
  mode is PERSISTENT), and the bridge's position in each sender's stream (sender, subject,
  sequence number) is written to the gateway's store *in the same commit* as the message
  (:meth:`import_record`), so after a crash what the sender sends again is dropped as a
  duplicate rather than imported twice. ``JMS_GW_CM_PUBLISHER`` and ``JMS_GW_CM_SEQUENCE``
  carry the label (the RV mapping), and the delivery log's ``far_id`` is
  ``<sender>#<sequence>``. Exports are labeled; one kept for a registered listener (the
  ``cm_listener`` ones, registered when the bridge connects, or any that registered)
  leaves the gateway's spool only at ``DELIVERY.COMPLETE`` -- every listener confirmed it --
  and is refused (undeliverable, as a far side's refusal) at ``DELIVERY.FAILED``, when
  ``default_ttl`` passed first. An export sent before a restart and still in the ledger is
  not sent again: the bridge finds it there by its trace id and waits for its outcome.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from gateway.config.transports import DiscardPolicy
from gateway.errors import GatewayError
from gateway.message import DeliveryMode, Destination, Message
from mappings.rv import CM_PUBLISHER, CM_SEQUENCE
from transports.base import ExportBinding, RetryLater, Transport
from transports.rv.cmtransport import CmListener, CmTransport
from transports.rv.codec import FormatError, decode
from transports.rv.message import Message as RvMessage
from transports.rv.message import Origin
from transports.rv.queue import DISCARD_FIRST, DISCARD_LAST, Queue
from transports.rv.transport import AsyncTransport, Listener

if TYPE_CHECKING:
    from gateway.consumer import Delivery

log = logging.getLogger("transports")

NOT_BRIDGED = ("_RV.", "_LOCAL.")  # the bus's own subjects and this process's
INBOX_PREFIX = "_INBOX."
DATALOSS_ADVISORIES = "_RV.*.SYSTEM.DATALOSS.>"
SLOWCONSUMER_ADVISORY = "_RV.ERROR.SYSTEM.CLIENT.SLOWCONSUMER"
MAX_ORIGIN_ID = 255  # bytes of the envelope's origin id (transports/rv/README.md, "Bytes")


def origin_marker(origin: str, trace_id: str | None, hops: int) -> Origin:
    """The envelope's origin marker of an export: ``<gateway id> <trace id>`` (a gateway id
    has no blank, :mod:`gateway.config.gateway_conf`, ``server``), or the gateway id alone
    when there is no trace id or the two do not fit the envelope's 255 bytes."""
    if trace_id is not None:
        marker = origin + " " + trace_id
        if len(marker.encode()) <= MAX_ORIGIN_ID:
            return Origin(marker, hops)
    return Origin(origin, hops)


class RvTransport(Transport):
    """A gateway transport on the RV-style bus."""

    type = "rv"

    def __init__(self, manager: Any, tdef: Any) -> None:
        super().__init__(manager, tdef)
        self.bus: AsyncTransport | None = None
        self.listeners: dict[str, Listener] = {}  # by import pattern
        self.reply_listeners: dict[str, Listener] = {}  # by inbox
        self.advisory_listeners: list[Listener] = []
        self.stats["dataloss"] = 0
        self.stats["slowconsumer"] = 0
        # Certified delivery (cm_name): the CM transport, its listeners by import pattern,
        # the exports waiting for their outcome by (subject, sequence number), what the
        # ledger keeps from an earlier connection by trace id, and the position imported
        # from each sender's stream (as written to the store, by the key of import_record).
        self.cm: CmTransport | None = None
        self.cm_listeners: dict[str, CmListener] = {}
        self.cm_exports: dict[tuple[str, int], tuple[Delivery, ExportBinding]] = {}
        self.cm_kept: dict[str, tuple[str, int]] = {}
        self.cm_far_ids: dict[str, str] = {}  # trace id -> "<cm name>#<seq>" of an export
        self.cm_namespace = f"rvcm:{self.name}"
        self.cm_imported: dict[str, int] = {
            key: int(value) for key, value in self.broker.kv.get(self.cm_namespace, {}).items()}
        self.export_headers = bool(self.params.get("export_headers", True))
        self.export_properties = bool(self.params.get("export_properties", True))
        # rv_queue_policy is the limit policy of the bus queue the imports wait in (EMS
        # User's Guide, "How Rendezvous Messages are Imported": each transport has its own
        # Rendezvous queue); DISCARD_NONE: the bus's own queue of this transport, unlimited.
        policy = self.params.get("inbound_queue_policy")
        self.queue: Queue | None = None
        if policy is not None and policy.policy is not DiscardPolicy.NONE:
            self.queue = Queue(
                f"transport {self.name}", max_events=policy.max_msgs,
                policy=DISCARD_FIRST if policy.policy is DiscardPolicy.FIRST else DISCARD_LAST,
                discard_amount=policy.qty_discard)

    # -- far side -----------------------------------------------------------------------------

    async def connect(self) -> None:
        p = self.params
        bus = await AsyncTransport.open(p.get("service", 7500), p.get("network") or None,
                                        p.get("daemon") or None,
                                        description=f"gateway transport {self.name}")
        self.bus = bus
        if self.queue is not None:
            self.queue.bind_loop(self.broker.loop)
        self.advisory_listeners = [
            Listener(bus, DATALOSS_ADVISORIES, self._on_advisory),
            Listener(bus, SLOWCONSUMER_ADVISORY, self._on_advisory),
        ]
        if p.get("cm_name"):
            self._open_cm(bus)

    def _open_cm(self, bus: AsyncTransport) -> None:
        p = self.params
        cm = CmTransport(bus, p["cm_name"], ledger_file=p.get("ledger_file"),
                         sync_ledger=bool(p.get("sync_ledger")),
                         require_old=bool(p.get("request_old")),
                         default_ttl=float(p.get("default_ttl") or 0.0),
                         explicit_config_only=bool(p.get("explicit_config_only")))
        cm.on_outcome = self._cm_outcome
        for listener, subject in p.get("cm_listener") or ():
            cm.add_listener(listener, subject)
        kept: dict[str, tuple[str, int]] = {}
        for subject, seq, data in cm.core.stored_items():
            try:
                origin = decode(data).origin
            except (FormatError, ValueError):
                continue
            trace_id = origin.origin_id.partition(" ")[2] if origin is not None else ""
            if trace_id:
                kept[trace_id] = (subject, seq)
        self.cm_kept = kept
        self.cm = cm

    def disconnect(self) -> None:
        bus = self.bus
        self.bus = None
        self.reply_temporaries.close()  # the inboxes they stand for are gone with the bus
        for listener in [*self.listeners.values(), *self.reply_listeners.values(),
                         *self.advisory_listeners]:
            listener.destroy()
        self.listeners.clear()
        self.reply_listeners.clear()
        self.advisory_listeners = []
        for cm_listener in self.cm_listeners.values():
            cm_listener.destroy()
        self.cm_listeners.clear()
        self.cm_exports.clear()  # given back to the spool (base.py); the ledger keeps them
        if self.cm is not None:
            self.cm.close()
            self.cm = None
        if bus is not None:
            self.broker.loop.create_task(bus.close())

    def remote_subscribe(self, pattern: str, kind: Any) -> None:
        if self.bus is None or pattern.startswith(NOT_BRIDGED) or pattern in self.listeners:
            return
        if self.cm is not None:
            if pattern not in self.cm_listeners:
                self.cm_listeners[pattern] = self.cm.listen(
                    pattern, lambda m, li: self._on_certified(m, li, pattern, kind), self.queue,
                    explicit_confirm=True)
            return
        self.listeners[pattern] = Listener(
            self.bus, pattern, lambda m, _l: self._on_message(m, pattern, kind), self.queue)

    def remote_unsubscribe(self, pattern: str, kind: Any) -> None:
        listener = self.listeners.pop(pattern, None)
        if listener is not None:
            listener.destroy()
        cm_listener = self.cm_listeners.pop(pattern, None)
        if cm_listener is not None:
            cm_listener.destroy()  # the agreements stay: the senders keep what comes meanwhile

    def _on_up(self) -> None:
        for inbox in self.replies.names:  # an inbox of the previous connection is gone
            self.replies.drop(inbox)
        super()._on_up()

    # -- export -------------------------------------------------------------------------------

    def export(self, d: Delivery, binding: ExportBinding) -> bool:
        """Send one message on the bus (reliable multicast, or point to point to an inbox):
        done once handed to the engine, as the bus acknowledges nothing -- unless it is
        certified and kept for a registered listener: then done at its outcome
        (:meth:`_cm_outcome`)."""
        cm = self.cm
        if cm is None:
            self._send(d.msg, None)
            return True
        trace_id = d.msg.trace_id
        kept = self.cm_kept.pop(trace_id, None) if trace_id else None
        if kept is not None and cm.core.is_stored(*kept):
            # Sent before a restart, still in the ledger: its listeners get it from there.
            self.cm_exports[kept] = (d, binding)
            self.cm_far_ids[trace_id or ""] = f"{cm.name}#{kept[1]}"
            return False
        subject, seq = self._send(d.msg, None, cm)
        if not cm.core.is_stored(subject, seq):
            return True  # no registered listener: labeled, not certified to anyone
        self.cm_exports[(subject, seq)] = (d, binding)
        if trace_id:
            self.cm_far_ids[trace_id] = f"{cm.name}#{seq}"
        return False

    def _cm_outcome(self, subject: str, seq: int, complete: bool) -> None:
        """A certified export left the ledger: confirmed by every listener, or failed."""
        entry = self.cm_exports.pop((subject, seq), None)
        if entry is None:
            return
        d, binding = entry
        if complete:
            self.confirmed(d, binding)
        else:
            self.cm_far_ids.pop(d.msg.trace_id or "", None)
            self.failed(d, binding, "its certified delivery time limit passed before every "
                                    "registered listener confirmed it (DELIVERY.FAILED)")

    def send_reply(self, msg: Message, name: str) -> None:
        """A message published to the temporary topic of inbox ``name``: point to point to
        that inbox (EMS User's Guide, "Working With TIBCO Rendezvous", "JMSReplyTo")."""
        self._send(msg, name)

    def _send(self, msg: Message, inbox: str | None,
              cm: CmTransport | None = None) -> tuple[str, int]:
        """``msg`` through the mappings to the bus: to ``inbox``, or else to the subject of
        its (mapped) destination; labeled through ``cm`` when given. Returns the subject and
        the sequence number (0 when not labeled)."""
        bus = self.bus
        if bus is None:
            raise RetryLater("not connected")
        delivered = msg
        try:
            rv = self._to_rv(self.mapped_out(msg), inbox)
            if cm is None:
                bus.send(rv)
                return rv.send_subject or "", 0
            return rv.send_subject or "", cm.send_on_loop(rv)
        except BaseException:
            self.sent_as.pop(id(delivered), None)  # not sent: no export record to name it
            raise

    def _to_rv(self, msg: Message, inbox: str | None) -> RvMessage:
        dest = msg.destination
        assert dest is not None
        send_subject = inbox if inbox is not None else dest.name
        if send_subject.startswith(NOT_BRIDGED):
            raise GatewayError(f"{send_subject!r} is never bridged")
        rt = msg.reply_to
        reply = None
        if rt is not None:
            reply = self.replies.route(rt, self._inbox) if rt.is_temporary else rt.name
        to_rv = self.wire_mapping(dest, "out")
        rv: RvMessage = to_rv(msg, send_subject=send_subject, reply_subject=reply,
                              export_headers=self.export_headers,
                              export_properties=self.export_properties)
        rv.origin = origin_marker(msg.origin or self.broker.id, msg.trace_id, msg.hops)
        return rv

    def mapped_out(self, msg: Message) -> Message:
        """The message through the declarative mappings of this transport (direction out);
        the headers and properties left out by ``export_headers`` / ``export_properties`` are
        the RV mapping's (no ``JMSHeaders`` / ``JMSProperties`` submessage), not a copy's.
        A copy the rules made is what the ``export`` record hashes, with their names."""
        mappings = self.broker.mappings
        if mappings is not None:
            out = mappings.apply(msg, protocol=self.type, direction="out", transport=self.name)
            if out is not msg:
                rules = mappings.rule_names(msg.destination, protocol=self.type,
                                            direction="out", transport=self.name)
                if rules is not None:
                    self._sent_as(msg, out, rules)
            msg = out
        return msg

    def far_name(self, msg: Message) -> tuple[str | None, str | None]:
        """The bus gives a message no id (the ``JMSMessageID`` of a ``JMSHeaders``
        submessage is the receiving broker's to replace, EMS User's Guide, "Message
        Translation"): none, but ``<cm name>#<sequence>`` for a certified export. The subject
        it was sent on (a reply's inbox is named by base.py)."""
        dest = msg.destination
        far_id = self.cm_far_ids.pop(msg.trace_id, None) if msg.trace_id else None
        return far_id, dest.name if dest is not None else None

    def _inbox(self, *parts: str) -> str:
        assert self.bus is not None
        return self.bus.create_inbox()

    def reply_subscribe(self, name: str) -> None:
        if self.bus is not None and name not in self.reply_listeners:
            self.reply_listeners[name] = Listener(
                self.bus, name, lambda m, _l: self._on_message(m, name, None), self.queue)

    def reply_unsubscribe(self, name: str) -> None:
        listener = self.reply_listeners.pop(name, None)
        if listener is not None:
            listener.destroy()

    # -- import -------------------------------------------------------------------------------

    def _on_certified(self, rv: RvMessage, listener: CmListener, pattern: str,
                      kind: Any) -> None:
        """A message to a CM listener of an import: certified ones are confirmed once the
        core has them, and dropped as duplicates when the store's position says they were
        imported before (a resend after a crash)."""
        label = rv.cm
        subject = rv.send_subject or ""
        if label is None or not label.sequence:
            self._on_message(rv, pattern, kind)
            return
        key = json.dumps([label.sender, subject])
        seq = label.sequence
        duplicate = seq <= self.cm_imported.get(key, 0)
        if not duplicate:
            self.cm_imported[key] = seq
        self._on_message(rv, pattern, kind, lambda: listener.confirm(rv),
                         f"{label.sender}#{seq}", duplicate)

    def import_record(self, msg: Message, far: Any) -> tuple[str, str, bytes] | None:
        """A certified import's position in its sender's stream, written with the message."""
        if self.cm is None or far is None:
            return None
        sender = msg.properties.get(CM_PUBLISHER)
        seq = msg.properties.get(CM_SEQUENCE)
        if not isinstance(sender, str) or not isinstance(seq, int) or not seq:
            return None
        return (self.cm_namespace, json.dumps([sender, far[1]]), str(int(seq)).encode())

    def _on_message(self, rv: RvMessage, pattern: str, kind: Any,
                    ack: Any = None, far_id: str | None = None,
                    duplicate: bool = False) -> None:
        subject = rv.send_subject or ""
        if subject.startswith(NOT_BRIDGED):
            return
        try:
            if kind is None:  # an inbox of a reply route
                dest = self.replies.target(pattern) if pattern in self.replies else None
                if dest is None:
                    if ack is not None:
                        ack()
                    return
            else:
                dest = Destination(kind, subject or pattern)
            rs = rv.reply_subject
            reply = None
            if rs:
                if rs.startswith(INBOX_PREFIX):
                    reply = self.reply_temporaries.temporary(rs)
                elif not rs.startswith(NOT_BRIDGED):
                    reply = Destination.topic(rs)
            to_message = self.wire_mapping(dest, "in")
            mode = self.params.get("topic_import_dm" if dest.is_topic else "queue_import_dm",
                                   DeliveryMode.NON_PERSISTENT)
            msg = to_message(rv, destination=dest, reply_to=reply, delivery_mode=mode,
                             now_ms=self.broker.now())
        except (GatewayError, ValueError) as exc:
            self.stats["failed"] += 1
            log.warning("transport %s: cannot import from %r: %s", self.name, subject, exc)
            if ack is not None:
                ack()  # refused for good: a certified sender must not keep it for us
            return
        # The delivery log's far_dest: the subject it came on (an inbox for a reply); no
        # far_id, as the bus gives a message none (msg.message_id is None until the core
        # stamps it: rv_to_message takes no JMSMessageID).
        far_dest = subject or pattern
        origin = rv.origin
        if origin is None:
            self.imported(msg, None, 0, ack, far_dest, far_id, duplicate)
            return
        origin_id, _, trace_id = origin.origin_id.partition(" ")
        if trace_id:
            msg.trace_id = trace_id  # the far gateway's: one trace across the bus
        self.imported(msg, origin_id, origin.hops, ack, far_dest, far_id, duplicate)

    def _on_advisory(self, adv: RvMessage, _listener: Listener) -> None:
        """DATALOSS / SLOWCONSUMER of the bus: counted and written to the delivery log."""
        name = adv.send_subject or ""
        key = "slowconsumer" if name == SLOWCONSUMER_ADVISORY else "dataloss"
        self.stats[key] += 1
        lost = adv.get("lost", adv.get("dropped", 0))
        log.warning("transport %s: %s (%s lost)", self.name, name, lost)
        record = Message(None, properties={"lost": int(lost or 0),
                                           "host": str(adv.get("host", ""))})
        record.destination = Destination.topic(name)
        self._record("drop", record, name,
                     lost=int(adv.get("lost", 0) or 0) if key == "dataloss" else None)

    def info(self) -> dict[str, Any]:
        out = super().info()
        if self.queue is not None:  # imports the bus queue's limit policy dropped
            out["discarded"] += self.queue.discarded
            out["bus_queue"] = self.queue.count
        return out


def start(manager: Any, tdef: Any) -> RvTransport:
    """Registry entry for ``type = rv`` in transports.conf."""
    return RvTransport(manager, tdef)
