"""Monitor topics against a running gateway: an MQTT subscriber (paho-mqtt) and a STOMP one
(stomp.py) receive EMS's system events (TIBCO EMS User's Guide, "Monitoring Server Events",
Appendix A), message-monitoring events (Table 73), transport states, admin changes and Sun
MQ-style metrics (Sun MQ Administration Guide, "Metrics Message Producer"); EMS's rule for
who may subscribe ("Viewing Monitor Topics"); and nothing is made while no one listens.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
import stomp
from corehelp import Q, T, collect, running_broker
from gw import GatewayThread, wait_for
from paho.mqtt.enums import CallbackAPIVersion

from gateway import monitor
from gateway.client import AckMode
from gateway.message import Message

WAIT = 10.0
USERS = ('admin:adminpw:""\nbob:bobpw:"granted $sys.monitor.>"\n'
         'carol:carolpw:"granted > only"\ndave:davepw:"nothing granted"\n'
         'erin:erinpw:"a member of $admin"\n')
GROUPS = '$admin:""\nerin\n'
ACL = ("TOPIC=$sys.monitor.> USER=bob PERM=subscribe\n"
       "TOPIC=> USER=carol PERM=subscribe,publish\n")
QUEUES = ">\ntraced trace=body\n"


def dead_port() -> int:
    """A loopback port nothing listens on (a transport to it never connects)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(tmp: Path, *, authorization: bool = True) -> GatewayThread:
    gw = ("listen = mqtt://127.0.0.1:0\nlisten = stomp://127.0.0.1:0\n"
          "listen = http://127.0.0.1:0\nmonitor_metrics_interval = 1\nmqtt_transports = enabled\n"
          f"authorization = {'enabled' if authorization else 'disabled'}\n")
    transports = (f"[dead]\ntype = mqtt\nurl = mqtt://127.0.0.1:{dead_port()}\n"
                  "reconnect_min = 200msec\nreconnect_max = 200msec\n")
    return GatewayThread(tmp, gateway=gw, users=USERS, groups=GROUPS, acl=ACL, queues=QUEUES,
                         transports=transports).start()


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[GatewayThread]:
    g = start(tmp_path)
    yield g
    g.stop()


def monitor_topics(gw: GatewayThread) -> list[str]:
    return sorted(gw.call(lambda: [n for n in gw.broker.topics if n.startswith("$sys.monitor")]))


# -- the two subscribers -----------------------------------------------------------------------


class MqttWatcher:
    """A paho-mqtt (3.1.1) client; each monitor message arrives as the JSON of its map."""

    def __init__(self, port: int, user: str | None, password: str | None = None) -> None:
        self.cond = threading.Condition()
        self.got: list[tuple[str, dict[str, Any]]] = []
        self.subacks: list[list[Any]] = []
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"watch-{user}",
                             protocol=mqtt.MQTTv311)
        if user is not None:
            self.c.username_pw_set(user, password)
        self.c.on_message = self._message
        self.c.on_subscribe = self._suback
        connected = threading.Event()
        self.c.on_connect = lambda *a: connected.set()
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        assert connected.wait(WAIT)

    def _message(self, c: Any, u: Any, m: Any) -> None:
        with self.cond:
            self.got.append((m.topic, json.loads(m.payload)))
            self.cond.notify_all()

    def _suback(self, c: Any, u: Any, mid: int, codes: list[Any], p: Any = None) -> None:
        with self.cond:
            self.subacks.append(codes)
            self.cond.notify_all()

    def sub(self, *filters: str) -> bool:
        """Subscribe; whether the gateway granted every filter."""
        n = len(self.subacks)
        self.c.subscribe([(f, 0) for f in filters])
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.subacks) > n, WAIT)
            return not any(code.is_failure for code in self.subacks[n])

    def event(self, pred: Any) -> tuple[str, dict[str, Any]]:
        with self.cond:
            assert self.cond.wait_for(lambda: any(pred(t, f) for t, f in self.got), WAIT)
            return next((t, f) for t, f in self.got if pred(t, f))

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


class StompWatcher(stomp.ConnectionListener):
    """A stomp.py (1.2) client; a message's fields are its JSON body, the scalar ones also
    its headers (EMS's properties)."""

    def __init__(self, port: int, user: str | None, password: str | None = None, *,
                 client_id: str | None = None) -> None:
        self.cond = threading.Condition()
        self.got: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        self.receipts: list[str] = []
        self.errors: list[str] = []
        self.closed = False
        self.n = 0
        self.conn = stomp.Connection12([("127.0.0.1", port)], reconnect_attempts_max=1)
        self.conn.set_listener("w", self)
        headers = {"client-id": client_id} if client_id else {}
        self.conn.connect(user, password, wait=True, headers=headers)

    def on_message(self, frame: Any) -> None:
        with self.cond:
            dest = frame.headers["destination"].removeprefix("/topic/")
            self.got.append((dest, json.loads(frame.body), dict(frame.headers)))
            self.cond.notify_all()

    def on_receipt(self, frame: Any) -> None:
        with self.cond:
            self.receipts.append(frame.headers["receipt-id"])
            self.cond.notify_all()

    def on_error(self, frame: Any) -> None:
        with self.cond:
            self.errors.append(f"{frame.headers.get('message', '')}: {frame.body}")
            self.cond.notify_all()

    def on_disconnected(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def _wait(self, pred: Any) -> None:
        with self.cond:
            assert self.cond.wait_for(pred, WAIT)

    def _answered(self, rid: str) -> None:
        """The frame with receipt ``rid`` took effect, or the gateway refused it."""
        self._wait(lambda: rid in self.receipts or bool(self.errors))

    def sub(self, *patterns: str) -> None:
        for p in patterns:
            self.n += 1
            rid = f"s{self.n}"
            self.conn.subscribe("/topic/" + p, id=rid, headers={"receipt": rid})
            self._answered(rid)

    def send(self, dest: str, body: str, headers: dict[str, str] | None = None) -> None:
        self.n += 1
        rid = f"m{self.n}"
        self.conn.send(dest, body, headers={**(headers or {}), "receipt": rid})
        self._answered(rid)

    def event(self, pred: Any) -> tuple[str, dict[str, Any], dict[str, str]]:
        self._wait(lambda: any(pred(t, f) for t, f, _ in self.got))
        return next((t, f, h) for t, f, h in self.got if pred(t, f))

    def error(self) -> str:
        self._wait(lambda: bool(self.errors))
        return self.errors[0]

    def close(self) -> None:
        if self.errors:
            # STOMP 1.2, ERROR: the server closes the connection after sending one
            self._wait(lambda: self.closed)
        elif self.conn.is_connected():
            self.conn.disconnect()


@pytest.fixture
def watchers(gw: GatewayThread) -> Iterator[tuple[MqttWatcher, StompWatcher]]:
    """``admin`` on MQTT and ``erin`` ($admin) on STOMP; each test subscribes them."""
    m = MqttWatcher(gw.port("mqtt"), "admin", "adminpw")
    s = StompWatcher(gw.port("stomp"), "erin", "erinpw")
    yield m, s
    m.close()
    s.close()


def mqtt_filter(pattern: str) -> str:
    return pattern.replace(".", "/").replace("*", "+").replace(">", "#")


def both_sub(watchers: tuple[MqttWatcher, StompWatcher], *patterns: str) -> None:
    m, s = watchers
    assert m.sub(*(mqtt_filter(p) for p in patterns))
    s.sub(*patterns)


# -- events -------------------------------------------------------------------------------------


def test_nothing_is_made_while_no_one_subscribes(gw: GatewayThread) -> None:
    visitor = StompWatcher(gw.port("stomp"), None, client_id="visitor")
    visitor.send("/queue/traced", "hello")
    visitor.send("/queue/fresh.q0", "hello")
    visitor.close()
    # the transport's own connection stays; its state changes all along
    wait_for(lambda: gw.call(lambda: len(gw.broker.connections)) == 1, what="visitor gone")
    assert monitor_topics(gw) == []


def test_connect_and_disconnect_reach_mqtt_and_stomp(gw: GatewayThread, watchers: Any) -> None:
    both_sub(watchers, "$sys.monitor.connection.*")
    visitor = StompWatcher(gw.port("stomp"), None, client_id="visitor")
    visitor.close()
    m, s = watchers

    def visit(action: str) -> Any:
        return lambda t, f: f.get("conn_clientid") == "visitor" and f["event_action"] == action

    for topic, fields in (m.event(visit("accept")), s.event(visit("accept"))[:2]):
        assert topic.replace("/", ".") == "$sys.monitor.connection.connect"
        assert fields["event_class"] == "connection.connect"
        assert fields["event_reason"] == "new_connection"
        assert fields["conn_type"] == "stomp"
        assert fields["conn_username"] == "anonymous"
        assert fields["server"] == "gateway"
        assert fields["conn_hostname"].startswith("127.0.0.1")
    for topic, fields in (m.event(visit("disconnect")), s.event(visit("disconnect"))[:2]):
        assert topic.replace("/", ".") == "$sys.monitor.connection.disconnect"
        assert fields["event_reason"] == "closed"
    _, _, headers = s.event(visit("accept"))
    assert headers["event_action"] == "accept"  # the fields are properties too (selectors)


def test_a_refused_login_is_a_connect_event(gw: GatewayThread, watchers: Any) -> None:
    both_sub(watchers, "$sys.monitor.connection.connect")
    with pytest.raises(stomp.exception.ConnectFailedException):
        StompWatcher(gw.port("stomp"), "dave", "wrong")
    m, _ = watchers
    _, fields = m.event(lambda t, f: f["event_action"] == "connect")
    assert fields["event_reason"] == "invalid_password"
    assert fields["conn_username"] == "dave"


def test_dynamic_destination_creation(gw: GatewayThread, watchers: Any) -> None:
    both_sub(watchers, "$sys.monitor.queue.create", "$sys.monitor.topic.create")
    _, s = watchers
    s.send("/queue/fresh.q1", "x")
    s.send("/topic/fresh.t1", "x")
    for w in watchers:
        _, q = w.event(lambda t, f: f.get("target_name") == "fresh.q1")[:2]
        assert (q["event_class"], q["event_action"], q["event_reason"],
                q["target_object"]) == ("queue.create", "create", "producer", "queue")
        t, f = w.event(lambda t, f: f.get("target_name") == "fresh.t1")[:2]
        assert t.replace("/", ".") == "$sys.monitor.topic.create"
        assert f["target_dest_type"] == "topic"


def test_message_monitoring_with_and_without_the_body(gw: GatewayThread, watchers: Any) -> None:
    both_sub(watchers, "$sys.monitor.Q.r.traced", "$sys.monitor.q.*.traced")
    _, s = watchers
    s.send("/queue/traced", "hello", {"colour": "blue", "correlation-id": "c-1",
                                      "content-type": "text/plain", "persistent": "true"})
    for w in watchers:
        _, full = w.event(lambda t, f: t.replace("/", ".") == "$sys.monitor.Q.r.traced")[:2]
        assert full["event_class"] == "message"
        assert full["event_action"] == "receive"
        assert full["event_reason"] == "producer"
        assert full["target_dest_name"] == "traced"
        assert full["message_body"] == "hello"
        assert full["message_properties"]["colour"] == "blue"
        assert full["msg_correlation_id"] == "c-1"
        assert full["mode"] == "persistent"
        assert full["msg_id"].startswith("ID:")
        _, brief = w.event(lambda t, f: t.replace("/", ".") == "$sys.monitor.q.r.traced")[:2]
        assert "message_body" not in brief
        assert brief["msg_id"] == full["msg_id"]


def test_sys_monitor_wildcard_alone_makes_no_message_events(gw: GatewayThread,
                                                            watchers: Any) -> None:
    both_sub(watchers, "$sys.monitor.>")
    _, s = watchers
    s.send("/queue/traced", "hello")
    s.send("/queue/fresh.q2", "x")  # a system event after it: it has arrived, nothing before
    for w in watchers:
        w.event(lambda t, f: f.get("target_name") == "fresh.q2")
    assert not [n for n in monitor_topics(gw) if ".Q." in n or ".q." in n]


def test_transport_state_changes(gw: GatewayThread, watchers: Any) -> None:
    both_sub(watchers, "$sys.monitor.transport.*.dead")
    for w in watchers:
        t, f = w.event(lambda t, f: f.get("transport_state") == "down")[:2]
        assert t.replace("/", ".") == "$sys.monitor.transport.down.dead"
        assert (f["event_class"], f["event_action"], f["event_reason"]) == (
            "transport.down", "disconnect", "not_connected")
        assert f["target_object"] == "transport" and f["transport_type"] == "mqtt"
        assert f["target_url"].startswith("mqtt://127.0.0.1:")
        assert f["event_description"]  # why it could not connect
        _, f = w.event(lambda t, f: f.get("transport_state") == "connecting")[:2]
        assert f["event_action"] == "connect"


def test_admin_change(gw: GatewayThread, watchers: Any) -> None:
    both_sub(watchers, "$sys.monitor.admin.*")
    gw.call(lambda: monitor.admin_change(gw.broker, "admin", "create", "queue", "orders",
                                         value="maxmsgs=10", hostname="127.0.0.1"))
    for w in watchers:
        t, f = w.event(lambda t, f: True)[:2]
        assert t.replace("/", ".") == "$sys.monitor.admin.change"
        assert f == {"server": "gateway", "event_class": "admin.change",
                     "event_action": "create", "conn_username": "admin", "conn_type": "Admin",
                     "conn_hostname": "127.0.0.1", "target_object": "queue",
                     "target_name": "orders", "target_value": "maxmsgs=10"}


def test_metrics_every_interval(gw: GatewayThread, watchers: Any) -> None:
    _, s = watchers
    s.send("/queue/traced", "hello")
    both_sub(watchers, "$sys.monitor.metrics.broker", "$sys.monitor.metrics.destination_list",
             "$sys.monitor.metrics.destination.queue.traced")
    for w in watchers:
        _, b = w.event(lambda t, f: t.replace("/", ".") == monitor.METRICS_BROKER)[:2]
        assert b["numMsgsIn"] >= 1 and b["msgBytesIn"] > 0
        assert b["numConnections"] >= 3  # the two watchers and the transport
        assert {"numMsgsOut", "msgBytesOut", "numMsgs", "totalMsgBytes",
                "numDestinations"} <= set(b)
        _, q = w.event(lambda t, f: t.replace("/", ".").endswith("queue.traced"))[:2]
        assert (q["numMsgsIn"], q["numMsgsOut"], q["numMsgs"], q["numConsumers"]) == (1, 0, 1, 0)
        assert q["msgBytesIn"] == q["totalMsgBytes"] > 0
        _, d = w.event(lambda t, f: t.replace("/", ".") == monitor.METRICS_LIST)[:2]
        assert d["$sys.monitor.metrics.destination.queue.traced"] == {
            "name": "traced", "type": "queue", "isTemporary": False}
        assert not [k for k in d if k.startswith("$sys.monitor.metrics.destination.topic.$sys")]
    # Sun MQ's properties: STOMP shows ``server``; ``type`` and ``timestamp`` have STOMP
    # headers of their own (JMSType, JMSTimestamp: when it was sampled)
    _, _, headers = s.event(lambda t, f: t == monitor.METRICS_BROKER)
    assert headers["server"] == "gateway"
    lifetime = int(headers["expires"]) - int(headers["timestamp"])
    assert 0 < lifetime <= monitor.METRICS_TTL_MS  # Sun MQ's 300 s


# -- who may subscribe ------------------------------------------------------------------------


@pytest.mark.parametrize(("user", "allowed"), [
    ("admin", True), ("erin", True), ("bob", True), ("carol", False), ("dave", False),
    (None, False)])
def test_who_may_subscribe_over_mqtt(gw: GatewayThread, user: str | None, allowed: bool) -> None:
    w = MqttWatcher(gw.port("mqtt"), user, f"{user}pw" if user else None)
    try:
        assert w.sub("$sys/monitor/connection/+") is allowed
        assert w.sub("$sys/#") is (user in ("admin", "erin"))  # bob's grant does not cover it
        assert w.sub("#")  # never matches $sys: carol's grant on > serves here
    finally:
        w.close()


def test_stomp_refusal_is_an_error_frame(gw: GatewayThread) -> None:
    carol = StompWatcher(gw.port("stomp"), "carol", "carolpw")
    carol.sub("$sys.monitor.connection.*")
    assert carol.error().startswith("not authorized: user 'carol' may not subscribe")
    carol.close()
    bob = StompWatcher(gw.port("stomp"), "bob", "bobpw")
    bob.sub("$sys.monitor.connection.*")
    assert bob.errors == []
    bob.close()


def test_clients_cannot_publish_on_monitor_topics(gw: GatewayThread, watchers: Any) -> None:
    both_sub(watchers, "$sys.monitor.connection.*")  # the topics exist now
    carol = StompWatcher(gw.port("stomp"), "carol", "carolpw")
    carol.send("/topic/$sys.monitor.connection.connect", "{}")
    assert "is a monitor topic" in carol.error()
    carol.close()


def test_authorization_disabled_still_needs_a_valid_login(tmp_path: Path) -> None:
    gw = start(tmp_path, authorization=False)
    try:
        port = gw.port("stomp")
        for user, password, allowed in (("admin", "adminpw", True), ("admin", "wrong", False),
                                        (None, None, False), ("bob", "bobpw", True),
                                        ("carol", "carolpw", False)):
            w = StompWatcher(port, user, password)  # every login is accepted
            w.sub("$sys.monitor.connection.*")
            assert (w.errors == []) is allowed, (user, password, w.errors)
            w.close()
    finally:
        gw.stop()


async def test_send_acknowledge_and_discard_events_of_a_queue(tmp_path):
    users = 'admin:adminpw:""\n'
    async with running_broker(tmp_path, users=users, queues="orders overflowPolicy=discardOld,"
                              "maxmsgs=1\n>\n") as b:
        events, listener = collect()
        s = b.connect(user="admin", password="adminpw").session()
        for e in ("s", "a", "p"):
            s.consumer(T(f"$sys.monitor.q.{e}.orders"), listener=listener)
        p = b.connect().session().producer(Q("orders"))
        p.send(Message.text("first"))
        p.send(Message.text("second"))  # discards the first
        got, take = collect()
        c = b.connect().session(AckMode.CLIENT)
        c.consumer(Q("orders"), listener=take)
        c.acknowledge(got[0])
        seen = [(d.msg.destination.name, d.msg.body["event_reason"]) for d in events]
        assert seen == [("$sys.monitor.q.p.orders", "discarded"),
                        ("$sys.monitor.q.s.orders", "consumer"),
                        ("$sys.monitor.q.a.orders", "consumer")]
        assert events[1].msg.body["msg_id"] == got[0].msg.message_id
