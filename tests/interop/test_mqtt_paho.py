"""MQTT interop: paho-mqtt 3.1.1 and 5.0 clients against the running gateway on loopback."""

from __future__ import annotations

import queue
import socket
import time

import paho.mqtt.client as mqtt
import pytest
from gw import GatewayThread
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

V311, V5 = mqtt.MQTTv311, mqtt.MQTTv5
BOTH = pytest.mark.parametrize("proto", [V311, V5], ids=["3.1.1", "5.0"])


class Client:
    """A paho client with a queue of received messages and of disconnect reasons."""

    def __init__(self, port: int, cid: str, proto: int = V311, *, clean: bool = True,
                 username: str | None = None, password: str | None = None,
                 will: tuple | None = None, props: Properties | None = None,
                 keepalive: int = 60, transport: str = "tcp", start: bool = True) -> None:
        kw = {"clean_session": clean} if proto != V5 else {}
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=cid, protocol=proto,
                             transport=transport, **kw)
        if transport == "websockets":
            self.c.ws_set_options(path="/mqtt")
        self.proto = proto
        self.messages: queue.Queue = queue.Queue()
        self.disconnects: queue.Queue = queue.Queue()
        self.connack: queue.Queue = queue.Queue()
        self.c.on_message = lambda c, u, m: self.messages.put(m)
        self.c.on_connect = lambda c, u, f, rc, p=None: self.connack.put((f, rc, p))
        self.c.on_disconnect = lambda c, u, f, rc, p=None: self.disconnects.put(rc)
        if username is not None:
            self.c.username_pw_set(username, password)
        if will is not None:
            self.c.will_set(*will)
        self.c.reconnect_delay_set(60, 120)
        if start:
            if proto == V5:
                self.c.connect("127.0.0.1", port, keepalive, clean_start=clean, properties=props)
            else:
                self.c.connect("127.0.0.1", port, keepalive)
            self.c.loop_start()
            flags, rc, p = self.connack.get(timeout=10)
            self.session_present = flags.session_present
            self.rc = rc
            self.connack_props = p

    def sub(self, topic: str, qos: int = 1, **kw) -> None:
        got: queue.Queue = queue.Queue()
        self.c.on_subscribe = lambda c, u, mid, rcs, p=None: got.put(rcs)
        if "options" in kw:
            self.c.subscribe(topic, **kw)
        else:
            self.c.subscribe(topic, qos=qos, **kw)
        self.suback = got.get(timeout=10)

    def pub(self, topic: str, payload: bytes | str, qos: int = 1, retain: bool = False,
            props: Properties | None = None) -> None:
        info = self.c.publish(topic, payload, qos=qos, retain=retain, properties=props)
        info.wait_for_publish(10)

    def get(self, timeout: float = 5) -> mqtt.MQTTMessage:
        return self.messages.get(timeout=timeout)

    def none(self, timeout: float = 0.3) -> bool:
        try:
            self.messages.get(timeout=timeout)
        except queue.Empty:
            return True
        return False

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()
        # paho closes its wake-up socket pair only here (or when the client is collected)
        self.c.reinitialise()

    def kill(self) -> None:
        """Drop the TCP connection without DISCONNECT (an abnormal disconnect)."""
        self.c.loop_stop()
        sock = self.c.socket()
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
            sock.close()


@pytest.fixture
def gw(tmp_path):
    g = GatewayThread(tmp_path / "gw").start()
    yield g
    g.stop()


@BOTH
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_publish_subscribe_each_qos(gw, proto, qos):
    port = gw.port("mqtt")
    sub = Client(port, "sub", proto)
    sub.sub("sensors/+/temp", qos=2)
    pub = Client(port, "pub", proto)
    for i in range(20):
        pub.pub("sensors/room1/temp", f"{i}", qos=qos)
    got = [sub.get() for _ in range(20)]
    assert [m.payload for m in got] == [str(i).encode() for i in range(20)]
    assert {m.qos for m in got} == {qos}
    assert got[0].topic == "sensors/room1/temp"
    assert sub.none()
    sub.close()
    pub.close()


@BOTH
def test_hash_matches_parent_and_dollar_topics_are_not_matched(gw, proto):
    port = gw.port("mqtt")
    sub = Client(port, "s", proto)
    sub.sub("home/#")
    sub.sub("#")
    pub = Client(port, "p", proto)
    pub.pub("home", "parent")
    assert sub.get().topic == "home"  # both filters match: one copy (MQTT 5.0 §3.3.4)
    assert sub.none()
    pub.pub("$SYS/x", "no")  # clients cannot publish to $ topics; nobody gets it
    assert sub.none()


@BOTH
def test_retained_messages_survive_restart_and_are_cleared_by_empty_payload(gw, proto):
    port = gw.port("mqtt")
    pub = Client(port, "p", proto)
    pub.pub("status/dev1", "online", qos=1, retain=True)
    pub.pub("status/dev2", "offline", qos=1, retain=True)
    pub.close()
    gw.restart()
    port = gw.port("mqtt")
    sub = Client(port, "s", proto)
    sub.sub("status/+", qos=1)
    got = {sub.get().payload for _ in range(2)}
    assert got == {b"online", b"offline"}
    pub = Client(port, "p", proto)
    pub.pub("status/dev1", "", qos=1, retain=True)
    assert sub.get().payload == b""  # the clearing publish is delivered as normal
    sub2 = Client(port, "s2", proto)
    sub2.sub("status/#", qos=1)
    m = sub2.get()
    assert (m.topic, m.payload, m.retain) == ("status/dev2", b"offline", True)
    assert sub2.none()


@BOTH
def test_will_on_abnormal_disconnect_but_not_on_normal(gw, proto):
    port = gw.port("mqtt")
    watcher = Client(port, "w", proto)
    watcher.sub("wills/#")
    a = Client(port, "a", proto, will=("wills/a", "a died", 1, False))
    b = Client(port, "b", proto, will=("wills/b", "b died", 1, False))
    b.close()
    a.kill()
    m = watcher.get()
    assert (m.topic, m.payload) == ("wills/a", b"a died")
    assert watcher.none(0.5)


def test_will_delay_is_cancelled_by_reconnect_v5(gw):
    port = gw.port("mqtt")
    watcher = Client(port, "w", V5)
    watcher.sub("wills/#")
    wp = Properties(PacketTypes.WILLMESSAGE)
    wp.WillDelayInterval = 1
    cp = Properties(PacketTypes.CONNECT)
    cp.SessionExpiryInterval = 60
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="delayed", protocol=V5)
    c.will_set("wills/delayed", "gone", 1, properties=wp)
    c.connect("127.0.0.1", port, properties=cp, clean_start=False)
    c.loop_start()
    time.sleep(0.3)
    c.loop_stop()
    c.socket().close()
    time.sleep(0.3)
    again = Client(port, "delayed", V5, clean=False, props=cp,
                   will=("wills/delayed", "gone", 1, False, wp))
    assert again.session_present
    assert watcher.none(1.5)  # reconnected within the delay: no will
    again.kill()
    m = watcher.get(timeout=3)  # this time nobody comes back
    assert m.payload == b"gone"


def test_persistent_session_311_keeps_subscriptions_and_messages_across_restart(gw):
    port = gw.port("mqtt")
    sub = Client(port, "keeper", V311, clean=False)
    sub.sub("orders/#", qos=1)
    sub.close()
    pub = Client(port, "p", V311)
    for i in range(5):
        pub.pub("orders/eu", f"o{i}", qos=1)
    pub.close()
    gw.restart()
    port = gw.port("mqtt")
    back = Client(port, "keeper", V311, clean=False)
    assert back.session_present
    assert [back.get().payload for _ in range(5)] == [f"o{i}".encode() for i in range(5)]
    time.sleep(0.3)
    extra = []
    while not back.messages.empty():
        m = back.messages.get()
        extra.append((m.topic, m.payload, m.dup))
    assert extra == []
    back.close()
    clean = Client(port, "keeper", V311, clean=True)
    assert not clean.session_present


def test_session_expiry_v5(gw):
    port = gw.port("mqtt")
    cp = Properties(PacketTypes.CONNECT)
    cp.SessionExpiryInterval = 1
    c = Client(port, "exp", V5, clean=False, props=cp)
    c.sub("x/#")
    c.close()
    time.sleep(1.6)
    again = Client(port, "exp", V5, clean=False, props=cp)
    assert not again.session_present


def test_client_takeover(gw):
    port = gw.port("mqtt")
    first = Client(port, "same", V5)
    second = Client(port, "same", V5)
    rc = first.disconnects.get(timeout=5)
    assert rc == 0x8E  # session taken over
    second.sub("t")
    Client(port, "p", V5).pub("t", "x")
    assert second.get().payload == b"x"


def test_v5_properties_pass_through(gw):
    port = gw.port("mqtt")
    sub = Client(port, "s", V5)
    sub.sub("req/#")
    pub = Client(port, "p", V5)
    p = Properties(PacketTypes.PUBLISH)
    p.UserProperty = [("region", "eu"), ("unit", "C")]
    p.ContentType = "text/plain"
    p.CorrelationData = b"\x00\x01binary"
    p.ResponseTopic = "resp/abc"
    p.MessageExpiryInterval = 60
    p.PayloadFormatIndicator = 1
    pub.pub("req/1", "héllo", props=p)
    m = sub.get()
    mp = m.properties
    assert m.payload == "héllo".encode()
    assert ("region", "eu") in mp.UserProperty and ("unit", "C") in mp.UserProperty
    assert mp.ContentType == "text/plain"
    assert mp.CorrelationData == b"\x00\x01binary"
    assert mp.ResponseTopic == "resp/abc"
    assert 58 <= mp.MessageExpiryInterval <= 60
    assert mp.PayloadFormatIndicator == 1


def test_v5_no_local_subscription_identifier_and_retain_handling(gw):
    from paho.mqtt.subscribeoptions import SubscribeOptions

    port = gw.port("mqtt")
    c = Client(port, "nl", V5)
    sp = Properties(PacketTypes.SUBSCRIBE)
    sp.SubscriptionIdentifier = 42
    c.sub("loop/t", options=SubscribeOptions(qos=1, noLocal=True), properties=sp)
    c.pub("loop/t", "mine")
    assert c.none()
    other = Client(port, "o", V5)
    other.pub("loop/t", "theirs", retain=True)
    m = c.get()
    assert m.payload == b"theirs" and m.properties.SubscriptionIdentifier == [42]
    assert m.retain is False  # retain-as-published off: flag cleared on live delivery
    rap = Client(port, "rap", V5)
    rap.sub("loop/t", options=SubscribeOptions(qos=1, retainHandling=2))
    assert rap.none()  # retain handling 2: no retained message on subscribe


def test_topic_alias_from_client_v5(gw):
    port = gw.port("mqtt")
    sub = Client(port, "s", V5)
    sub.sub("alias/#")
    pub = Client(port, "p", V5)
    p1 = Properties(PacketTypes.PUBLISH)
    p1.TopicAlias = 3
    pub.pub("alias/long/topic/name", "first", props=p1)
    p2 = Properties(PacketTypes.PUBLISH)
    p2.TopicAlias = 3
    pub.pub("", "second", props=p2)
    assert [(m.topic, m.payload) for m in (sub.get(), sub.get())] == [
        ("alias/long/topic/name", b"first"), ("alias/long/topic/name", b"second")]


def test_shared_subscription_spreads_messages(gw):
    port = gw.port("mqtt")
    a = Client(port, "a", V5)
    b = Client(port, "b", V5)
    a.sub("$share/workers/jobs/#")
    b.sub("$share/workers/jobs/#")
    p = Client(port, "p", V5)
    for i in range(10):
        p.pub("jobs/x", str(i))
    time.sleep(0.5)
    got_a = [a.get(1).payload for _ in range(a.messages.qsize())]
    got_b = [b.get(1).payload for _ in range(b.messages.qsize())]
    assert sorted(got_a + got_b, key=int) == [str(i).encode() for i in range(10)]
    assert got_a and got_b


def test_authentication_and_acl(tmp_path):
    with GatewayThread(
        tmp_path,
        gateway="authorization = enabled\nallow_anonymous = disabled\n",
        users='dev:pw1:"device"\nops:pw2:"operator"\n',
        topics="secure.> secure\n>\n",
        acl="TOPIC=secure.> USER=ops PERM=publish,subscribe\n",
    ) as g:
        port = g.port("mqtt")
        assert Client(port, "anon", V5).rc == 0x87  # not authorized
        bad = Client(port, "bad", V5, username="dev", password="nope", start=False)
        bad.c.connect("127.0.0.1", port)
        bad.c.loop_start()
        _, rc, _ = bad.connack.get(timeout=5)
        assert rc == 0x86
        bad.c.loop_stop()
        ops = Client(port, "ops", V5, username="ops", password="pw2")
        ops.sub("secure/#")
        dev = Client(port, "dev", V5, username="dev", password="pw1")
        dev.sub("secure/#")
        assert dev.suback[0].value == 0x87
        info = dev.c.publish("secure/x", "denied", qos=1)
        info.wait_for_publish(5)
        ops.pub("secure/x", "allowed")
        assert ops.get().payload == b"allowed"
        assert ops.none()


def test_websocket_transport(gw):
    ws = Client(gw.port("http"), "ws", V5, transport="websockets")
    tcp = Client(gw.port("mqtt"), "tcp", V311)
    ws.sub("bridge/#")
    tcp.pub("bridge/x", "over ws")
    assert ws.get().payload == b"over ws"
    ws.pub("bridge/y", "from ws", qos=2)
    assert ws.get().payload == b"from ws"


def test_shutdown_sends_server_shutting_down_to_v5_clients(tmp_path):
    g = GatewayThread(tmp_path).start()
    c = Client(g.port("mqtt"), "bye", V5)
    g.stop()
    assert c.disconnects.get(timeout=5) == 0x8B


def test_shutdown_says_goodbye_to_websocket_clients_too(tmp_path):
    g = GatewayThread(tmp_path).start()
    c = Client(g.port("http"), "bye-ws", V5, transport="websockets")
    g.stop()  # the adapters close before the HTTP listener, which so waits for no handler
    assert c.disconnects.get(timeout=5) == 0x8B
