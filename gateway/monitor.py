"""Monitor topics: the gateway's events and metrics as map messages on ``$sys.monitor...``.

How this works. The gateway publishes a map message on a monitor topic when something happens
(TIBCO EMS User's Guide, "Monitoring Server Activity", "Monitoring Server Events"; Appendix A
"Monitor Messages", Table 81 "Monitor topics"), and only while someone subscribes to that
topic (EMS, "Performance Implications of Monitor Topics"): each hook first reads a counter
(:attr:`Monitor.watchers`, the subscriptions that can reach a monitor topic;
``Broker.message_monitors`` on the publish path), so with no subscriber nothing is built and
no topic is made. The fields are EMS's (Table 82 "Message properties"): ``server``,
``event_class`` (the topic name after ``$sys.monitor.``; ``message`` for message monitoring),
``event_action`` (Table 83), ``event_reason`` (Table 84), ``conn_connid``, ``conn_username``,
``conn_hostname`` (the connection's address), ``conn_type`` (the protocol: ``mqtt``,
``stomp``, ``amqp``, ``transport:<type>``; ``Admin`` for the admin API, as EMS) and, a
gateway addition, ``conn_clientid``. EMS carries them as message properties, where selectors
see them; the gateway sets them both there and in the map body, which is what an MQTT 3.1.1
subscriber (no properties) and a STOMP or MQTT reader of the JSON body get.

==========================================  ===================================================
topic                                       published when
==========================================  ===================================================
``$sys.monitor.connection.connect``         a client connected (``event_action`` ``accept``,
                                            reason ``new_connection``) or was refused
                                            (``connect``; ``invalid_password``,
                                            ``not_authorized``)
``$sys.monitor.connection.disconnect``      a connection ended (``closed``)
``$sys.monitor.queue.create`` / ``topic``   a dynamic destination was made for a
                                            ``producer`` or a ``consumer``
``$sys.monitor.queue.delete`` / ``topic``   an administrator deleted a destination
                                            (``admin``; the gateway's own: EMS reports it
                                            only as an admin change)
``$sys.monitor.admin.change``               an administrator changed something
                                            (:func:`admin_change`)
``$sys.monitor.transport.<state>.<name>``   transport ``name`` went ``connecting``, ``up``,
                                            ``down`` or ``stopped`` (:func:`transport_state`;
                                            EMS's ``route.connect`` / ``route.disconnect``
                                            for our client transports, the name last as in
                                            message-monitor topics, so one transport can be
                                            watched)
``$sys.monitor.{T|t|Q|q}.{r|p}.<dest>``     a message was received into (``r``) or left early
                                            from (``p``: expired, past ``maxRedelivery``)
                                            topic (``T``/``t``) or queue (``Q``/``q``)
                                            ``dest`` (EMS, "Monitoring Messages", Table 73)
==========================================  ===================================================

EMS has no monitor topic for a deleted destination: an administrator's deletion is an
``admin.change`` with ``event_action`` ``delete``. Message monitoring follows EMS exactly: any
destination, whatever its ``trace`` property (which is the log's, see
:mod:`gateway.routing`); only subscriptions that name the qualifiers (``$sys.monitor.Q.r.x``,
``$sys.monitor.q.*.orders.>``) make the gateway generate them, not ``$sys.monitor.>``, which
still receives what others' interest produced (EMS, "Monitoring Messages"). An upper-case
``T`` / ``Q`` adds the message itself: EMS gives it serialized as ``message_bytes`` for its
client libraries' ``createFromBytes``; the gateway, whose clients speak other protocols,
gives ``message_body`` (the body as it is) and ``message_properties`` (a nested map). The
events ``s`` (sent to a consumer) and ``a`` (acknowledged), and ``p`` for a message
``discardOld`` drops, belong to the endpoint's delivery, acknowledgement and discard, which
do not call :meth:`Monitor.message_event` yet. The message's headers are ``msg_id``,
``msg_timestamp``, ``msg_expiration``, ``msg_size``, ``msg_correlation_id``, ``mode``,
``replyTo`` (EMS) and ``msg_priority``, ``msg_type``, ``msg_trace_id`` (gateway additions).

Metrics follow Sun Java System Message Queue's metrics messages (Sun MQ Administration Guide,
"Monitoring Service", "Metrics Message Producer", Table 2-8 "Metrics Topic Destinations";
the map names are those of the Sun MQ Developer's Guide for Java Clients, "Format of Metrics
Messages"), every ``monitor_metrics_interval`` seconds (gateway.conf; 0 = none), each only
while it has a subscriber: ``$sys.monitor.metrics.broker``,
``$sys.monitor.metrics.destination.queue.<name>`` / ``.topic.<name>`` and
``$sys.monitor.metrics.destination_list``. Sun's ``mq.metrics.`` names moved under
``$sys.monitor.metrics.`` so that EMS's rule for who may subscribe covers them (``mq.`` is
an ordinary name here) and ``$sys.monitor.>`` watches everything; the rest of each name is
Sun's. As Sun's, they carry the properties ``type`` (the topic name) and ``timestamp``, plus
``server`` for Sun's broker address, and live 300 s. (A STOMP subscriber sees ``server``:
its ``type`` and ``timestamp`` headers are JMSType and JMSTimestamp, the second the same
moment.)

Who may subscribe (EMS, "Monitoring Server Events", "Viewing Monitor Topics"): a client
logged in with a valid user name and password -- even with ``authorization`` disabled, when
users.conf is then asked only for this -- that is ``admin``, a member of ``$admin``, or
holds ``subscribe`` from a grant on a ``$sys.monitor.`` topic that covers what it subscribes
to; a grant on ``>`` or ``*.*`` does not count (:meth:`Security.may_monitor
<gateway.config.security.Security.may_monitor>`). Clients cannot publish on monitor topics.

Runs on the loop; never awaits.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from gateway.config.security import ANONYMOUS, MONITOR_PREFIX
from gateway.errors import SecurityError
from gateway.message import QUEUE, DeliveryMode, Destination, Message
from gateway.subindex import SubIndex

if TYPE_CHECKING:
    from gateway.broker import Broker
    from gateway.endpoint import Subscription

PREFIX = MONITOR_PREFIX
CONNECT = "$sys.monitor.connection.connect"
DISCONNECT = "$sys.monitor.connection.disconnect"
ADMIN_CHANGE = "$sys.monitor.admin.change"
TRANSPORT = "$sys.monitor.transport."
METRICS_BROKER = "$sys.monitor.metrics.broker"
METRICS_DESTINATION = "$sys.monitor.metrics.destination."
METRICS_LIST = "$sys.monitor.metrics.destination_list"
# Sun MQ Administration Guide, Table 2-9, imq.metrics.topic.timetolive: 300 s by default
METRICS_TTL_MS = 300_000
# EMS User's Guide, Table 73: the destination qualifier (upper case: with the message)
MESSAGE_QUALIFIERS = frozenset("TtQq")
# EMS User's Guide, Table 73 event qualifiers -> Table 83 event actions
MESSAGE_ACTIONS = {"r": "receive", "s": "send", "a": "acknowledge", "p": "premature_exit"}
# transport state -> (event_action, event_reason) (EMS User's Guide, Tables 83 and 84)
TRANSPORT_EVENTS: dict[str, tuple[str, str | None]] = {
    "connecting": ("connect", None),
    "up": ("accept", "new_connection"),
    "down": ("disconnect", "error"),
    "stopped": ("disconnect", "shutdown"),
}
_PROPERTY_TYPES = (str, int, float, bool)
_MODES = {DeliveryMode.PERSISTENT: "persistent", DeliveryMode.NON_PERSISTENT: "non_persistent",
          DeliveryMode.RELIABLE: "reliable"}


def covers_monitor(pattern: str) -> bool:
    """Whether a subscription to ``pattern`` can receive monitor messages: its first element
    is ``$sys`` and its second ``monitor`` or a wildcard (a pattern that starts with a
    wildcard never matches a ``$`` name, :mod:`gateway.subindex`)."""
    if not pattern.startswith("$sys."):
        return False
    return pattern.split(".", 2)[1] in ("monitor", "*", ">")


def names_message_events(pattern: str) -> bool:
    """Whether ``pattern`` subscribes explicitly to message monitoring (EMS User's Guide,
    "Monitoring Messages"): ``$sys.monitor.<D>.<E>...`` with ``D`` one of ``T t Q q``."""
    parts = pattern.split(".", 4)
    return len(parts) >= 4 and pattern.startswith(PREFIX) and parts[2] in MESSAGE_QUALIFIERS


class Monitor:
    """What the monitor topics need to know cheaply: who watches, and the metrics timer."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.watchers = 0  # subscriptions whose pattern covers a monitor topic
        # Subscriptions that name message-monitoring topics: only they make the gateway
        # generate message events. Their count is Broker.message_monitors.
        self.message_index = SubIndex()
        # Connections whose user gave users.conf's password while authorization is disabled
        # (with it enabled every named user did).
        self.verified: set[str] = set()
        self.interval = float(broker.config.gateway.monitor_metrics_interval)
        self.timer: asyncio.TimerHandle | None = None

    # -- life cycle -------------------------------------------------------------------

    def start(self) -> None:
        """Count the subscriptions made so far (recovered durables), then follow the rest;
        start the metrics timer."""
        for sub in self.broker.all_subscriptions():
            self.subscription_changed(sub, True)
        self.broker.watch_subscriptions(self.subscription_changed)
        if self.interval > 0:
            self.timer = self.broker.loop.call_later(self.interval, self._tick)

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def subscription_changed(self, sub: Subscription, added: bool) -> None:
        pattern = sub.pattern
        if not covers_monitor(pattern):
            return
        self.watchers += 1 if added else -1
        if names_message_events(pattern):
            index = self.message_index
            if added:
                index.insert(pattern, sub, parent_match=sub.parent_match)
            else:
                index.remove(pattern, sub, parent_match=sub.parent_match)
            self.broker.message_monitors = len(index)

    # -- permission -------------------------------------------------------------------

    def check_subscribe(self, conn: Any, pattern: str) -> None:
        """Raise SecurityError unless ``conn`` may subscribe to the monitor pattern
        ``pattern`` (see the module docstring; EMS User's Guide, "Viewing Monitor Topics")."""
        user = conn.user
        if user is None or not (self.broker.authorization or conn.id in self.verified):
            raise SecurityError(f"subscribing to {pattern!r} needs a user logged in with a "
                                "valid user name and password")
        if not self.broker.config.security.may_monitor(user, pattern):
            raise SecurityError(f"user {user!r} may not subscribe to {pattern!r}: monitor "
                                "topics need admin, $admin or a grant on $sys.monitor")

    # -- events -----------------------------------------------------------------------

    def connection_event(self, conn: Any, connected: bool) -> None:
        """A connection was accepted or ended (EMS: ``connection.connect`` /
        ``connection.disconnect``)."""
        name = CONNECT if connected else DISCONNECT
        if not self.broker.subs.has_interest(name):
            return
        fields = self.event(name[len(PREFIX):], "accept" if connected else "disconnect",
                             "new_connection" if connected else "closed")
        fields.update(connection_fields(conn))
        self.publish(name, fields)

    def connection_refused(self, user: str | None, reason: str, description: str) -> None:
        """A connection attempt was refused (``invalid_password``, ``not_authorized``)."""
        if not self.broker.subs.has_interest(CONNECT):
            return
        fields = self.event("connection.connect", "connect", reason)
        fields["conn_username"] = user or ANONYMOUS
        fields["event_description"] = description
        self.publish(CONNECT, fields)

    def destination_created(self, dest: Destination, reason: str) -> None:
        """A dynamic queue or topic was made for a ``producer`` or ``consumer``."""
        self.destination_event(dest, "create", reason)

    def destination_event(self, dest: Destination, action: str, reason: str) -> None:
        """``$sys.monitor.queue.<action>`` or ``topic.<action>``: ``create`` (EMS's), or
        ``delete``, the gateway's own (EMS reports a deletion only as an admin change), when
        an administrator deletes a destination (reason ``admin``)."""
        is_queue = dest.kind is QUEUE
        name = f"{PREFIX}{'queue' if is_queue else 'topic'}.{action}"
        if not self.broker.subs.has_interest(name):
            return
        fields = self.event(name[len(PREFIX):], action, reason)
        kind = "queue" if is_queue else "topic"
        fields.update(target_object=kind, target_name=dest.name, target_dest_name=dest.name,
                      target_dest_type=kind)
        self.publish(name, fields)

    def message_event(self, event: str, dest: Destination, msg: Message, conn: Any,
                      reason: str) -> None:
        """Message-monitoring event ``event`` (``r s a p``, EMS User's Guide, Table 73) of
        ``msg`` at ``dest``, by ``conn`` (None: the gateway itself), for ``reason`` (Table
        84: ``producer``, ``import``, ``consumer``, ``expired``...). The caller has checked
        ``Broker.message_monitors``."""
        name = dest.name
        if name.startswith(PREFIX):
            return  # monitor messages are not monitored: that would never end
        letter = "Q" if dest.kind is QUEUE else "T"
        full = f"{PREFIX}{letter}.{event}.{name}"
        brief = f"{PREFIX}{letter.lower()}.{event}.{name}"
        index = self.message_index
        want_full = index.has_interest(full)
        want_brief = index.has_interest(brief)
        if not (want_full or want_brief):
            return
        fields = self.event("message", MESSAGE_ACTIONS[event], reason)
        if conn is not None:
            fields.update(connection_fields(conn))
        fields.update(target_dest_name=name, target_dest_type="queue" if letter == "Q" else "topic")
        fields.update(message_fields(msg))
        if want_brief:
            self.publish(brief, dict(fields))
        if want_full:
            fields["message_body"] = msg.body
            fields["message_properties"] = dict(msg.properties)
            self.publish(full, fields)

    # -- metrics ----------------------------------------------------------------------

    def _tick(self) -> None:
        broker = self.broker
        if broker.closed:
            return
        if self.watchers:
            self.publish_metrics()
        self.timer = broker.loop.call_later(self.interval, self._tick)

    def publish_metrics(self) -> None:
        """Publish each metrics message that has a subscriber now."""
        subs = self.broker.subs
        if subs.has_interest(METRICS_BROKER):
            self._metric(METRICS_BROKER, broker_metrics(self.broker))
        if subs.has_interest(METRICS_LIST):
            self._metric(METRICS_LIST, destination_list(self.broker))
        if not subs.has_interest(METRICS_DESTINATION + ">"):
            return
        for q in list(self.broker.queues.values()):
            name = f"{METRICS_DESTINATION}queue.{q.name}"
            if subs.has_interest(name):
                self._metric(name, queue_metrics(q))
        for t in list(self.broker.topics.values()):
            name = f"{METRICS_DESTINATION}topic.{t.name}"
            if not t.name.startswith(PREFIX) and subs.has_interest(name):
                self._metric(name, topic_metrics(self.broker, t))

    def _metric(self, name: str, body: dict[str, Any]) -> None:
        props = {"type": name, "timestamp": self.broker.now(), "server": self.broker.name}
        self.broker.publish_monitor(name, body, props, ttl=METRICS_TTL_MS)

    # -- helpers ----------------------------------------------------------------------

    def event(self, event_class: str, action: str, reason: str | None) -> dict[str, Any]:
        """The fields every event has (EMS User's Guide, Table 82)."""
        fields: dict[str, Any] = {"server": self.broker.name, "event_class": event_class,
                                  "event_action": action}
        if reason is not None:
            fields["event_reason"] = reason
        return fields

    def publish(self, name: str, fields: dict[str, Any]) -> None:
        """Publish an event on ``name``: its fields in the map and, those a property can
        hold, as properties too (for selectors, EMS User's Guide, "Viewing Monitor Topics")."""
        props = {k: v for k, v in fields.items() if type(v) in _PROPERTY_TYPES}
        self.broker.publish_monitor(name, fields, props)


def connection_fields(conn: Any) -> dict[str, Any]:
    """EMS's ``conn_*`` fields of a core connection."""
    return {"conn_connid": conn.id, "conn_username": conn.user or ANONYMOUS,
            "conn_hostname": conn.address, "conn_type": conn.protocol,
            "conn_clientid": conn.client_id or ""}


def message_fields(msg: Message) -> dict[str, Any]:
    """A message's headers as monitor fields (EMS User's Guide, Table 82, and ours)."""
    fields: dict[str, Any] = {
        "msg_id": msg.message_id or "", "msg_timestamp": msg.timestamp,
        "msg_expiration": msg.expiration, "msg_size": msg.size,
        "mode": _MODES.get(msg.delivery_mode, str(msg.delivery_mode)),
        "msg_priority": msg.priority, "msg_trace_id": msg.trace_id or "",
    }
    if msg.correlation_id is not None:
        fields["msg_correlation_id"] = msg.correlation_id
    if msg.reply_to is not None:
        fields["replyTo"] = str(msg.reply_to)
    if msg.type is not None:
        fields["msg_type"] = msg.type
    return fields


# -- events from outside the core -------------------------------------------------------


def admin_change(broker: Broker, user: str | None, action: str, target_object: str,
                 target_name: str | None = None, *, value: str | None = None,
                 hostname: str = "") -> None:
    """Publish ``$sys.monitor.admin.change`` (EMS User's Guide, Table 81): administrator
    ``user`` (from ``hostname``) did ``action`` (EMS Table 83: ``create``, ``delete``,
    ``modify``, ``purge``, ``grant``, ``revoke``, ``add``, ``remove``...) on
    ``target_object`` (EMS Table 82: ``queue``, ``topic``, ``durable``, ``user``, ``group``,
    ``permissions``, ``server``, ``transport``, ``connection``...) named ``target_name``;
    ``value`` says what it became (new properties, granted permissions)."""
    monitor = broker.monitor
    if not monitor.watchers or not broker.subs.has_interest(ADMIN_CHANGE):
        return
    fields = monitor.event("admin.change", action, None)
    fields.update(conn_username=user or ANONYMOUS, conn_type="Admin", conn_hostname=hostname,
                  target_object=target_object)
    if target_name is not None:
        fields["target_name"] = target_name
    if value is not None:
        fields["target_value"] = value
    monitor.publish(ADMIN_CHANGE, fields)


def transport_state(broker: Any, transport: Any, previous: str, error: str | None) -> None:
    """Publish ``$sys.monitor.transport.<state>.<name>`` for a transport whose state just
    changed from ``previous`` (``down`` after ``connecting``: it could not connect, reason
    ``not_connected``; after ``up``: it lost its connection, reason ``error``). ``broker``
    is the :class:`~gateway.broker.Broker` a transport knows by its adapters' face."""
    monitor = broker.monitor
    if not monitor.watchers:
        return
    state = transport.state
    name = f"{TRANSPORT}{state}.{transport.name}"
    if not broker.subs.has_interest(name):
        return
    action, reason = TRANSPORT_EVENTS.get(state, ("modify", None))
    if state == "down" and previous == "connecting":
        reason = "not_connected"
    fields = monitor.event(f"transport.{state}", action, reason)
    fields.update(target_object="transport", target_name=transport.name,
                  transport_type=transport.type, transport_state=state)
    url = transport.params.get("url")  # a config Endpoint (client transports only)
    if url is not None:
        fields["target_url"] = url.url()
    if error:
        fields["event_description"] = error
    monitor.publish(name, fields)


# -- metrics (Sun MQ Developer's Guide for Java Clients, "Format of Metrics Messages") ---------


def broker_metrics(broker: Broker) -> dict[str, Any]:
    """Sun MQ's broker metrics (Table 4-2) the gateway has: connections, messages in and
    out since start, messages and bytes held now, destinations."""
    endpoints: list[Any] = list(broker.queues.values())
    endpoints.extend(broker.all_subscriptions())
    delivered, delivered_bytes = broker.traffic.totals()
    return {
        "numConnections": len(broker.connections),
        "numMsgsIn": broker.published,
        "msgBytesIn": broker.bytes_in,
        "numMsgsOut": delivered,
        "msgBytesOut": delivered_bytes,
        "numMsgs": sum(ep.count for ep in endpoints),
        "totalMsgBytes": sum(ep.bytes for ep in endpoints),
        "numDestinations": len(broker.queues) + sum(
            1 for name in broker.topics if not name.startswith(PREFIX)),
    }


def queue_metrics(q: Any) -> dict[str, Any]:
    """Sun MQ's destination metrics (Table 4-5) of a queue: an exclusive queue's first
    consumer is its active one, the others its backups."""
    n = len(q.consumers)
    active = min(n, 1) if q.exclusive else n
    return {"numConsumers": n, "numActiveConsumers": active, "numBackupConsumers": n - active,
            "numMsgsIn": q.stats_in, "numMsgsOut": q.stats_out, "msgBytesIn": q.stats_bytes_in,
            "msgBytesOut": q.stats_bytes_out, "numMsgs": q.count, "totalMsgBytes": q.bytes}


def topic_metrics(broker: Broker, topic: Any) -> dict[str, Any]:
    """Sun MQ's destination metrics of a topic: its subscriptions (wildcard ones included)
    and those with a consumer now. What waits for them is counted per subscription, which a
    wildcard makes span topics, so a topic reports no ``numMsgs``."""
    subs: tuple[Any, ...] = broker.subs.match(topic.name)
    return {"numConsumers": len(subs), "numActiveConsumers": sum(1 for s in subs if s.consumers),
            "numMsgsIn": topic.stats_in}


def destination_list(broker: Broker) -> dict[str, Any]:
    """Sun MQ's destination list (Table 4-4): one entry per destination, named by its
    metrics topic, holding ``name``, ``type`` and ``isTemporary``."""
    out: dict[str, Any] = {}
    for q in broker.queues.values():
        out[f"{METRICS_DESTINATION}queue.{q.name}"] = {
            "name": q.name, "type": "queue", "isTemporary": q.owner is not None}
    for t in broker.topics.values():
        if not t.name.startswith(PREFIX):
            out[f"{METRICS_DESTINATION}topic.{t.name}"] = {
                "name": t.name, "type": "topic", "isTemporary": t.owner is not None}
    return out
