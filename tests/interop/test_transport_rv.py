"""The rv transport over loopback multicast: RV publishers and listeners (the bus's own API, on
its own engine) and MQTT clients of the gateway (paho), field by field (TIBCO EMS User's Guide,
"Working With TIBCO Rendezvous", "Topics", "Message Translation").

Each test has its own service port and 239.192.x.y group on 127.0.0.1.
"""

from __future__ import annotations

import concurrent.futures
import json
import random
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import proton
import pytest
import stomp
from amqpclient import connect as amqp_connect
from gw import GatewayThread, wait_for
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from transportlog import (
    check_duplicate_drop,
    check_transport_records,
    core_id,
    events_of,
    log_records,
)

import transports.reply
from gateway.message import Destination as GwDestination
from gateway.message import Message as GwMessage
from transports.rv import Listener, Message, RequestTimeout, RvType, Transport
from transports.rv.advisory import advisory_message
from transports.rv.codec import encode
from transports.rv.events import Delivered
from transports.rv.message import Origin
from transports.rv.queue import Dispatcher, Queue

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Bus:
    """A unique service and network, a transport of the bus's own API on it, and a
    dispatcher thread for its listeners."""

    def __init__(self) -> None:
        self.service = str(free_udp_port())
        self.network = f"127.0.0.1;239.192.{random.randrange(1, 255)}.{random.randrange(1, 255)}"
        self.t = Transport(self.service, self.network, ttl=0)
        self.queue = Queue("test")
        self.dispatcher = Dispatcher(self.queue)

    def collect(self, subject: str) -> list[Message]:
        got: list[Message] = []
        Listener(self.t, subject, lambda m, _l: got.append(m), self.queue)
        return got

    def close(self) -> None:
        self.t.close()
        self.dispatcher.stop()


@pytest.fixture
def bus() -> Iterator[Bus]:
    b = Bus()
    yield b
    b.close()


def gateway(tmp: Any, bus: Bus, topics: str, *, listen: tuple[str, ...] = ("mqtt",),
            transport: str = "", queues: str = ">\n") -> GatewayThread:
    """A gateway listening on ``listen`` (and http) with the transport ``[bus]`` on ``bus``;
    ``transport``: more lines of its section."""
    listeners = "".join(f"listen = {scheme}://127.0.0.1:0\n" for scheme in (*listen, "http"))
    return GatewayThread(
        tmp, gateway=listeners + "rv_transports = enabled\n",
        transports=f"[bus]\ntype = rv\nservice = {bus.service}\nnetwork = {bus.network}\n"
                   + transport,
        topics=topics, queues=queues).start()


@pytest.fixture
def start_gateway(tmp_path: Path, bus: Bus) -> Iterator[Any]:
    """Start a gateway on the test's bus (arguments as :func:`gateway`, and ``name``, its
    directory), wait until its transport is up; every one is stopped after the test."""
    started: list[GatewayThread] = []

    def start(topics: str, *, name: str = "gw", **kw: Any) -> GatewayThread:
        g = gateway(tmp_path / name, bus, topics, **kw)
        started.append(g)
        wait_for(lambda: info(g)["state"] == "up", what="transport up")
        return g

    yield start
    for g in reversed(started):
        g.stop()


def info(g: GatewayThread) -> dict[str, Any]:
    t = g.gateway.transports.transports["bus"]  # type: ignore[union-attr]
    return g.call(t.info)  # type: ignore[no-any-return]


class MqttClient:
    def __init__(self, port: int) -> None:
        self.got: list[paho.MQTTMessage] = []
        self.c = paho.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
        self.c.on_message = lambda c, u, m: self.got.append(m)
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()

    def subscribe(self, topic: str) -> None:
        done: list[int] = []
        self.c.on_subscribe = lambda *a: done.append(1)
        self.c.subscribe(topic, 1)
        wait_for(lambda: done, what="SUBACK")

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


def test_rv_map_message_reaches_an_mqtt_subscriber_field_by_field(start_gateway, bus):
    g = start_gateway('plant.> import="bus"\n>\n')
    mq = MqttClient(g.port("mqtt"))
    try:
        mq.subscribe("plant/#")
        wait_for(lambda: info(g)["imports"] == {"plant.>": ["plant.>"]}, what="import")
        nested = Message().add("site", "a").add("ids", [1, -2], RvType.I16ARRAY)
        rv = Message("plant.a").add("temp", 21.5, RvType.F32).add("n", 300, RvType.U16)
        rv.add("meta", nested)
        rv.add("JMSProperties", Message().add("unit", "C").add("k", 7, RvType.I16))

        wait_for(lambda: (bus.t.send(rv), mq.got)[1], what="the import")
        m = mq.got[0]
        assert m.topic == "plant/a"
        assert json.loads(m.payload) == {"temp": 21.5, "n": 300,
                                         "meta": {"site": "a", "ids": [1, -2]}}
        user = dict(m.properties.UserProperty)
        assert user["unit"] == "C" and user["k"] == "7" and "k:int16" in user["gw-types"]
        assert user["JMS_GW_IMPORTED"] == "bus" and user["JMS_GW_MSG_EXT"] == "true"
    finally:
        mq.close()


def test_an_mqtt_publish_reaches_rv_listeners_with_headers_and_loop_marker(start_gateway, bus):
    g = start_gateway('out.> export="bus"\n>\n')
    got = bus.collect("out.>")
    mq = MqttClient(g.port("mqtt"))
    try:
        mq.c.publish("out/x", b"hello", 1).wait_for_publish(5)
        wait_for(lambda: got, what="the export")
        rv = got[0]
        assert rv.send_subject == "out.x"
        assert rv["JMSBytes"] == b"hello"
        assert rv["JMSHeaders"]["JMSDeliveryMode"] == 2
        assert rv["JMSProperties"].get_field("JMS_GW_MQTT_QOS").type == RvType.I8
        assert rv.origin is not None
        gateway_id, _, trace_id = rv.origin.origin_id.partition(" ")
        assert gateway_id == g.broker.id and trace_id.startswith(g.broker.id + ":")
        assert rv.origin.hops == 0
        wait_for(lambda: info(g)["exported"] == 1, what="export counted")
    finally:
        mq.close()


def test_never_bridges_the_bus_own_subjects_nor_its_own_exports(start_gateway, bus):
    g = start_gateway('both.> import="bus",export="bus"\n>\n')
    mq = MqttClient(g.port("mqtt"))
    got = bus.collect("both.>")
    try:
        mq.subscribe("both/#")
        wait_for(lambda: info(g)["imports"] == {"both.>": ["both.>"]}, what="import")
        # an RV message with this gateway's origin marker is a loop: dropped, counted
        looped = Message("both.l").add("x", 1)
        looped.origin = Origin(g.broker.id, 1)
        wait_for(lambda: (bus.t.send(looped), info(g)["dropped_loop"])[1], what="loop drop")
        assert not mq.got
        # a local publish goes out once and does not come back in
        mq.c.publish("both/y", b"1", 1).wait_for_publish(5)
        wait_for(lambda: got, what="the export")
        wait_for(lambda: len(mq.got) == 1, what="the local delivery")
        assert info(g)["imported"] == 0
    finally:
        mq.close()


def bridge_of(g: GatewayThread) -> Any:
    return g.gateway.transports.transports["bus"]  # type: ignore[union-attr]


def temporaries(g: GatewayThread) -> list[str]:
    """The temporary topics of the bridge that stand for inboxes."""
    return g.call(lambda: sorted(str(d.name) for d, _ in  # type: ignore[no-any-return]
                                 bridge_of(g).reply_temporaries.by_name.values()))


def request(bus: Bus, subject: str, *, attempts: float = 30.0) -> Message:
    """``send_request`` on ``subject`` until a reply comes (the first requests may cross the
    bus before the gateway's listener for them is up)."""

    def attempt() -> Message | None:
        try:
            return bus.t.send_request(Message(subject).add("q", "now"), 1.0)
        except RequestTimeout:
            return None

    reply: Message = wait_for(attempt, timeout=attempts, what="the reply")
    return reply


def gone(g: GatewayThread, names: list[str]) -> bool:
    return not g.call(lambda: [n for n in names if n in g.broker.topics])


def test_an_rv_request_gets_an_mqtt5_reply_through_a_temporary_topic(start_gateway, bus):
    """EMS User's Guide, "JMSReplyTo": an inbox reply subject is imported as a temporary
    destination; the responder's reply to it goes back point to point to the inbox, and
    the temporary topic goes ``temp_destination_timeout`` s after its last use."""
    g = start_gateway('svc.> import="bus"\n>\n', transport="temp_destination_timeout = 2\n")
    mq = MqttClient(g.port("mqtt"))
    topics: list[str] = []

    def respond(c: Any, _u: Any, m: paho.MQTTMessage) -> None:
        topics.append(m.properties.ResponseTopic)
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = [("answer", "42")]
        c.publish(m.properties.ResponseTopic, b"noon", 1, properties=props)

    try:
        mq.subscribe("svc/#")
        wait_for(lambda: info(g)["imports"] == {"svc.>": ["svc.>"]}, what="import")
        mq.c.on_message = respond
        reply = request(bus, "svc.time")
        assert reply["JMSBytes"] == b"noon"
        assert reply["JMSProperties"]["answer"] == "42"
        assert topics and all(t.startswith("$TMP$/") for t in topics)
        names = [t.replace("/", ".") for t in topics]
        wait_for(lambda: gone(g, names) and not temporaries(g), what="the temporary topics gone")
        assert info(g)["exported"] >= 1  # the reply
    finally:
        mq.close()


def test_requests_from_one_inbox_share_one_temporary_topic(start_gateway, bus):
    g = start_gateway('svc.> import="bus"\n>\n')
    mq = MqttClient(g.port("mqtt"))
    try:
        mq.subscribe("svc/#")
        wait_for(lambda: info(g)["imports"] == {"svc.>": ["svc.>"]}, what="import")
        inbox = bus.t.create_inbox()
        replies = bus.collect(inbox)
        for n in (1, 2):
            wait_for(lambda n=n: (bus.t.send(Message("svc.time", inbox).add("n", n)),
                                  [m for m in mq.got
                                   if json.loads(m.payload) == {"n": n}])[1],
                     what=f"request {n}")
        response_topics = {m.properties.ResponseTopic for m in mq.got}
        assert len(response_topics) == 1
        (response_topic,) = response_topics
        assert response_topic.startswith("$TMP$/")
        assert temporaries(g) == [response_topic.replace("/", ".")]
        mq.c.publish(response_topic, b"both", 1).wait_for_publish(5)
        wait_for(lambda: replies, what="the reply on the inbox")
        assert replies[0]["JMSBytes"] == b"both"
    finally:
        mq.close()


def test_an_rv_request_gets_a_stomp_reply_through_a_temporary_topic(start_gateway, bus):
    g = start_gateway('svc.> import="bus"\n>\n', listen=("stomp",),
                      transport="temp_destination_timeout = 2\n")
    st = StompClient(g.port("stomp"))
    reply_to: list[str] = []

    def respond(frame: Any) -> None:
        reply_to.append(frame.headers["reply-to"])
        st.c.send(frame.headers["reply-to"], b"pong", headers={"answer": "stomp"})

    try:
        st.on_message = respond  # type: ignore[method-assign]
        st.c.subscribe("/topic/svc.>", "1", ack="auto")
        wait_for(lambda: info(g)["imports"] == {"svc.>": ["svc.>"]}, what="import")
        reply = request(bus, "svc.stomp")
        assert reply["JMSProperties"]["answer"] == "stomp"
        body = reply.get("JMSBytes", reply.get("JMSText"))
        assert body in (b"pong", "pong")
        assert reply_to and all(r.startswith("/temp-topic/$TMP$.") for r in reply_to)
        names = [r[len("/temp-topic/"):] for r in reply_to]
        wait_for(lambda: gone(g, names) and not temporaries(g), what="the temporary topics gone")
    finally:
        st.close()


def test_an_rv_request_gets_an_amqp_reply_through_a_temporary_topic(start_gateway, bus):
    g = start_gateway('svc.> import="bus"\n>\n', listen=("amqp",))
    conn = amqp_connect(g.port("amqp"))
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        receiver = conn.create_receiver("topic://svc.amqp")
        wait_for(lambda: info(g)["imports"] == {"svc.>": ["svc.amqp"]}, what="import")
        pending = pool.submit(request, bus, "svc.amqp")
        senders: dict[str, Any] = {}
        while not pending.done():
            try:
                req = receiver.receive(timeout=0.5)
            except proton.Timeout:
                continue
            receiver.accept()
            assert req.reply_to.startswith("topic://$TMP$.")
            sender = senders.get(req.reply_to)
            if sender is None:
                sender = senders[req.reply_to] = conn.create_sender(req.reply_to)
            sender.send(proton.Message(body="pong", properties={"answer": "amqp"}))
        reply = pending.result()
        assert reply["JMSText"] == "pong"
        assert reply["JMSProperties"]["answer"] == "amqp"
    finally:
        pool.shutdown(wait=True)
        conn.close()


def test_dataloss_and_slow_consumer_advisories_are_logged_and_counted(start_gateway, bus):
    """The engine presents its advisories to every transport of the engine (``present``):
    the bridge counts them and writes them to the delivery log; nothing is replayed."""
    g = start_gateway(">\n")
    bridge = bridge_of(g)
    loss = "_RV.ERROR.SYSTEM.DATALOSS.INBOUND.BCAST"
    slow = "_RV.ERROR.SYSTEM.CLIENT.SLOWCONSUMER"
    g.call(lambda: bridge.bus.present(advisory_message(loss, {"host": "127.0.0.1",
                                                              "lost": 3})))
    g.call(lambda: bridge.bus.present(advisory_message(slow, {"waiting": 1, "dropped": 2})))
    wait_for(lambda: info(g)["dataloss"] == 1 and info(g)["slowconsumer"] == 1,
             what="the advisories counted")

    def logged() -> list[dict[str, Any]]:
        return [r for r in log_records(g) if r["event"] == "drop" and r["reason"] in (loss, slow)]

    records = wait_for(lambda: len(logged()) == 2 and logged(), what="the log records")
    assert [r["reason"] for r in records] == [loss, slow]
    assert [r["lost"] for r in records] == [3, None]  # the DATALOSS count, its own column
    assert [r["client"] for r in records] == ["bus", "bus"]  # the transport's name


def test_two_gateways_bridged_by_the_bus_deliver_once_and_do_not_loop(start_gateway, bus):
    topics = 'x.> import="bus",export="bus"\n>\n'
    a = start_gateway(topics, name="a")
    b = start_gateway(topics, name="b")
    ma, mb = MqttClient(a.port("mqtt")), MqttClient(b.port("mqtt"))
    try:
        ma.subscribe("x/#")
        mb.subscribe("x/#")
        for g in (a, b):
            wait_for(lambda g=g: info(g)["imports"] == {"x.>": ["x.>"]}, what="imports")
        # the far listener is asynchronous: publish until B has one, then count
        n = 0
        while not mb.got:
            n += 1
            ma.c.publish("x/1", str(n).encode(), 1).wait_for_publish(5)
            wait_for(lambda n=n: len(ma.got) == n, what="A's own delivery")
        last = str(n + 1).encode()
        ma.c.publish("x/1", last, 1).wait_for_publish(5)
        wait_for(lambda: mb.got and mb.got[-1].payload == last, what="B's delivery")
        wait_for(lambda: info(a)["exported"] == n + 1, what="A's exports")
        time.sleep(0.3)  # nothing more may arrive: a loop would bring A's messages back
        assert [m.payload for m in ma.got] == [str(i).encode() for i in range(1, n + 2)]
        assert info(b)["exported"] == 0  # imported messages are not exported again
        assert info(a)["imported"] == 0
        ids = [m.payload for m in mb.got]
        assert ids[-1] == last and len(ids) == len(set(ids))  # each at most once
    finally:
        ma.close()
        mb.close()


def test_a_temporary_reply_to_is_an_inbox_an_rv_responder_answers(start_gateway, bus):
    """EMS User's Guide, "Export Issues": a temporary JMSReplyTo is arranged across the
    transport; here it goes out as an inbox of the bridge, and the reply comes back to it."""
    g = start_gateway('svc.> export="bus"\n>\n')
    requests = bus.collect("svc.>")
    replies: list[Any] = []

    def request() -> str:
        conn = g.broker.connect()
        s = conn.session()
        temp = conn.temporary_queue()
        s.consumer(temp, listener=replies.append)
        s.producer(GwDestination.topic("svc.echo")).send(
            GwMessage.text("ping", reply_to=temp, correlation_id="c-1"))
        return str(temp.name)

    temp_name = g.call(request)
    wait_for(lambda: requests, what="the request")
    req = requests[0]
    assert req["JMSText"] == "ping" and req.reply_subject.startswith("_INBOX.")
    assert req["JMSHeaders"]["JMSCorrelationID"] == "c-1"
    reply = Message().add("JMSText", "pong")
    reply.add("JMSHeaders", Message().add("JMSCorrelationID", "c-1"))
    bus.t.send_reply(reply, req)
    wait_for(lambda: replies, what="the reply")
    got = replies[0].msg
    assert got.body == "pong" and got.correlation_id == "c-1"
    assert got.destination.name == temp_name


def test_the_bus_own_and_process_local_subjects_are_never_exported(start_gateway, bus):
    g = start_gateway('_LOCAL.> export="bus"\n>\n')
    g.call(lambda: g.broker.connect().session().producer(
        GwDestination.topic("_LOCAL.x")).send(GwMessage.text("no")))
    wait_for(lambda: info(g)["failed"] == 1, what="the export refused")
    assert info(g)["exported"] == 0


class StompClient:
    """A stomp.py client of the gateway, collecting MESSAGE frames."""

    def __init__(self, port: int) -> None:
        self.got: list[Any] = []
        self.c = stomp.Connection12([("127.0.0.1", port)], auto_decode=False)
        self.c.set_listener("t", self)
        self.c.connect(wait=True)

    def on_message(self, frame: Any) -> None:
        self.got.append(frame)

    def close(self) -> None:
        self.c.disconnect()


def test_rv_to_a_stomp_subscriber_and_a_stomp_send_to_rv(start_gateway, bus):
    g = start_gateway('in.> import="bus"\nout.> export="bus"\n>\n', listen=("stomp",))
    got = bus.collect("out.>")
    st = StompClient(g.port("stomp"))
    try:
        st.c.subscribe("/topic/in.>", "1", ack="auto")
        wait_for(lambda: info(g)["imports"] == {"in.>": ["in.>"]}, what="import")
        rv = Message("in.m").add("a", 5, RvType.I8).add("s", [Message().add("k", True)],
                                                         RvType.MSGARRAY)
        wait_for(lambda: (bus.t.send(rv), st.got)[1], what="the import")
        f = st.got[0]
        assert f.headers["destination"] == "/topic/in.m"
        assert json.loads(f.body) == {"a": 5, "s": [{"k": True}]}
        st.c.send("/topic/out.s", b"\x00bin", headers={"color": "red"},
                  content_type="application/octet-stream")
        wait_for(lambda: got, what="the export")
        out = got[0]
        assert out.send_subject == "out.s" and out["JMSBytes"] == b"\x00bin"
        assert out["JMSProperties"]["color"] == "red"
    finally:
        st.close()


def test_rv_to_an_amqp_receiver_and_an_amqp_map_to_rv_keep_their_types(start_gateway, bus):
    g = start_gateway('in.> import="bus"\nout.> export="bus"\n>\n', listen=("amqp",))
    got = bus.collect("out.>")
    conn = amqp_connect(g.port("amqp"))
    try:
        receiver = conn.create_receiver("topic://in.a")
        wait_for(lambda: info(g)["imports"] == {"in.>": ["in.a"]}, what="import")
        rv = Message("in.a").add("t", 1.5, RvType.F32).add("u", 7, RvType.U8)
        rv.add("m", Message().add("v", [1, 2], RvType.I64ARRAY))

        def received() -> Any:
            bus.t.send(rv)
            try:
                return receiver.receive(timeout=0.5)
            except proton.Timeout:
                return None

        pm = wait_for(received, what="the import")
        body = pm.body
        assert body["t"] == 1.5 and type(body["t"]) is proton.float32
        assert body["u"] == 7 and type(body["u"]) is proton.short  # U8 widens to short
        assert list(body["m"]["v"]) == [1, 2]
        conn.create_sender("topic://out.a").send(
            proton.Message(body={"x": proton.int32(5), "y": "z"}))
        wait_for(lambda: got, what="the export")
        f = got[0].get_field("x")
        assert f is not None and (f.type, f.value) == (RvType.I32, 5)
        assert got[0]["y"] == "z"
    finally:
        conn.close()


def test_export_headers_and_properties_off_leave_out_the_submessages(start_gateway, bus):
    g = start_gateway('out.> export="bus"\n>\n', listen=(),
                      transport="export_headers = false\nexport_properties = false\n")
    got = bus.collect("out.>")
    g.call(lambda: g.broker.connect().session().producer(
        GwDestination.topic("out.h")).send(
            GwMessage.map({"a": 1}, properties={"p": "v"}, type="t")))
    wait_for(lambda: got, what="the export")
    assert got[0].names() == ["a"]


def test_rv_messages_imported_to_a_queue_reach_a_stomp_consumer_persistent(start_gateway, bus):
    """EMS User's Guide, "Working With TIBCO Rendezvous", "Queues": a queue entry imports at
    once, with queue_import_dm; a wildcard entry puts each message in its subject's queue."""
    g = start_gateway(">\n", listen=("stomp",), queues='work.> import="bus"\n>\n',
                      transport="queue_import_dm = PERSISTENT\n")
    wait_for(lambda: info(g)["imports"] == {"work.>": ["work.>"]}, what="the queue import")
    wait_for(lambda: (bus.t.send(Message("work.a").add("job", 1)),
                      g.call(lambda: "work.a" in g.broker.queues
                             and g.broker.queues["work.a"].count))[1],
             what="the message in queue work.a")
    stored = g.call(lambda: g.broker.queues["work.a"].count)
    st = StompClient(g.port("stomp"))
    try:
        st.c.subscribe("/queue/work.a", "1", ack="auto")
        wait_for(lambda: len(st.got) >= stored, what="the queue's messages")
        f = st.got[0]
        assert f.headers["destination"] == "/queue/work.a"
        assert f.headers["persistent"] == "true"
        assert json.loads(f.body) == {"job": 1}
    finally:
        st.close()


def test_rv_messages_imported_to_a_queue_reach_an_amqp_consumer(start_gateway, bus):
    g = start_gateway(">\n", listen=("amqp",), queues='jobs import="bus"\n>\n')
    wait_for(lambda: info(g)["imports"] == {"jobs": ["jobs"]}, what="the queue import")
    conn = amqp_connect(g.port("amqp"))
    try:
        receiver = conn.create_receiver("queue://jobs")

        def received() -> Any:
            bus.t.send(Message("jobs").add("job", 2, RvType.I32))
            try:
                return receiver.receive(timeout=0.5)
            except proton.Timeout:
                return None

        pm = wait_for(received, what="the queue's message")
        assert pm.body == {"job": 2} and not pm.durable  # queue_import_dm NON_PERSISTENT
    finally:
        conn.close()


def arrive_at_once(g: GatewayThread, msgs: list[Message]) -> None:
    """``msgs`` reach the gateway's engine host as one read of its sockets does: encoded,
    handed over together on the gateway's loop (``EngineHost.on_events``)."""
    host = bridge_of(g).bus.host
    burst = [Delivered(encode(m), None, False) for m in msgs]  # type: ignore[arg-type]
    g.call(lambda: host.on_events(burst))


def test_rv_queue_policy_is_the_limit_policy_of_the_bridge_bus_queue(start_gateway, bus):
    """EMS User's Guide, "Configuring Transports for Rendezvous", rv_queue_policy: the
    transport's Rendezvous queue keeps max_msgs; DISCARD_FIRST drops the oldest. One burst of
    30 datagrams, handed over as the bus does for one read, leaves the newest 10."""
    g = start_gateway(">\n", listen=("stomp",), queues='burst import="bus"\n>\n',
                      transport="rv_queue_policy = TIBRVQUEUE_DISCARD_FIRST:10:1\n")
    wait_for(lambda: info(g)["imports"] == {"burst": ["burst"]}, what="the queue import")
    arrive_at_once(g, [Message("burst").add("n", n) for n in range(30)])
    wait_for(lambda: info(g)["imported"] == 10, what="the imports")
    assert info(g)["discarded"] == 20
    st = StompClient(g.port("stomp"))
    try:
        st.c.subscribe("/queue/burst", "1", ack="auto")
        wait_for(lambda: len(st.got) == 10, what="the queue's messages")
        assert [json.loads(f.body)["n"] for f in st.got] == list(range(20, 30))
    finally:
        st.close()


def test_one_trace_id_in_the_delivery_logs_of_two_gateways_on_the_bus(start_gateway, bus):
    """The origin marker carries the trace id, so the reconciliation joins the export of one
    gateway to the import and delivery of the other by it."""
    topics = 'x.> import="bus",export="bus"\n>\n'
    a = start_gateway(topics, name="a")
    b = start_gateway(topics, name="b")
    mb = MqttClient(b.port("mqtt"))
    try:
        mb.subscribe("x/#")
        wait_for(lambda: info(b)["imports"] == {"x.>": ["x.>"]}, what="B's import")
        producer = a.call(lambda: a.broker.connect().session().producer(
            GwDestination.topic("x.t")))
        n = 0
        while not mb.got:  # the far listener is asynchronous: publish until B has one
            n += 1
            a.call(lambda n=n: producer.send(GwMessage.text(str(n))))
            wait_for(lambda n=n: info(a)["exported"] == n, what="A's export")
        exported = {r["trace_id"] for r in log_records(a) if r["event"] == "export"}
        imported = wait_for(lambda: [r for r in log_records(b) if r["event"] == "import"],
                            what="B's import record")
        assert exported and all(t.startswith(a.broker.id + ":") for t in exported)
        assert {r["trace_id"] for r in imported} <= exported
        delivered = wait_for(lambda: [r for r in log_records(b) if r["event"] == "deliver"],
                             what="B's delivery record")
        assert {r["trace_id"] for r in delivered} <= exported
    finally:
        mb.close()


def test_a_service_name_opens_the_bus_on_its_udp_port(tmp_path, bus, monkeypatch):
    """TIBCO Rendezvous Concepts, "Service Parameter": a service name is looked up in the
    services database (udp). This machine's database has no entry for the test's own port,
    so the lookup answers it for one made-up name and asks the real database otherwise."""
    real = socket.getservbyname

    def getservbyname(name: str, proto: str | None = None) -> int:
        if (name, proto) == ("gw-test-bus", "udp"):
            return int(bus.service)
        return real(name, proto) if proto is not None else real(name)

    monkeypatch.setattr(socket, "getservbyname", getservbyname)
    g = GatewayThread(
        tmp_path / "gw", gateway="listen = http://127.0.0.1:0\nrv_transports = enabled\n",
        transports=f"[bus]\ntype = rv\nservice = gw-test-bus\nnetwork = {bus.network}\n",
        topics='out.> export="bus"\n>\n', queues=">\n").start()
    got = bus.collect("out.>")
    try:
        wait_for(lambda: info(g)["state"] == "up", what="transport up")
        g.call(lambda: g.broker.connect().session().producer(
            GwDestination.topic("out.n")).send(GwMessage.text("by name")))
        wait_for(lambda: got, what="the export on the named service")
        assert got[0]["JMSText"] == "by name"
    finally:
        g.stop()


def test_the_least_recently_used_inbox_temporary_goes_first_past_the_limit(
        start_gateway, bus, monkeypatch):
    """At most MAX_REPLY_TEMPORARIES inboxes stand as temporary topics (here 2): a request
    from a third inbox deletes the temporary topic of the one used longest ago."""
    monkeypatch.setattr(transports.reply, "MAX_REPLY_TEMPORARIES", 2)
    g = start_gateway(">\n", listen=(), queues='req import="bus"\n>\n')
    wait_for(lambda: info(g)["imports"] == {"req": ["req"]}, what="the queue import")
    bridge = bridge_of(g)
    first, second, third = (bus.t.create_inbox() for _ in range(3))

    def requests(*inboxes: str) -> None:
        arrive_at_once(g, [Message("req", inbox).add("q", 1) for inbox in inboxes])

    requests(first, second)
    wait_for(lambda: info(g)["imported"] == 2, what="two requests")
    dest_of_second = g.call(lambda: bridge.reply_temporaries.by_name[second][0].name)
    requests(first)  # first is now the most recently used
    requests(third)
    wait_for(lambda: info(g)["imported"] == 4, what="four requests")
    assert g.call(lambda: list(bridge.reply_temporaries.by_name)) == [first, third]
    assert gone(g, [dest_of_second])


def test_the_delivery_log_names_the_subject_of_imports_and_exports(tmp_path, start_gateway,
                                                                   bus):
    """The bus's imports and exports name the subject in ``far_dest``; ``far_id`` is null (the
    bus gives a message no id); an export the mapping rules changed names them in ``rules``
    and hashes the copy sent (docs/delivery-log.md)."""
    folder = tmp_path / "gw" / "mappings"
    folder.mkdir(parents=True)
    (folder / "bus.yaml").write_text("""\
mappings:
  - name: stamp bus
    match: {destination: "topic:out.changed", direction: out, transport: bus}
    steps:
      - set: {field: property.via, value: bus}
""")
    g = start_gateway('in.> import="bus"\nout.> export="bus"\n>\n')
    got = bus.collect("out.>")
    received: list[Any] = []
    g.call(lambda: g.broker.connect().session().consumer(GwDestination.topic("in.>"),
                                                         listener=received.append))
    wait_for(lambda: info(g)["imports"] == {"in.>": ["in.>"]}, what="the import")
    wait_for(lambda: (bus.t.send(Message("in.a").add("n", 1, RvType.I32)),
                      info(g)["imported"])[1], what="an import")
    producer = g.call(lambda: g.broker.connect().session().producer(None))
    for name in ("out.plain", "out.changed"):
        g.call(lambda name=name: producer.send(GwMessage.text(name),
                                               GwDestination.topic(name)))
    wait_for(lambda: len(got) == 2, what="the exports on the bus")
    changed = next(m for m in got if m.send_subject == "out.changed")
    assert changed["JMSProperties"]["via"] == "bus"

    def records(event: str) -> dict[str, dict[str, Any]]:
        return {r["dest"]: r for r in log_records(g) if r["event"] == event}

    imports = wait_for(lambda: records("import"), what="the import record")
    imp = imports["topic:in.a"]
    assert imp["far_dest"] == "in.a" and imp["far_id"] is None
    exports = wait_for(lambda: len(records("export")) == 2 and records("export"),
                       what="the export records")
    published = records("publish")
    for name in ("out.plain", "out.changed"):
        exp, pub = exports["topic:" + name], published["topic:" + name]
        assert exp["far_dest"] == name and exp["far_id"] is None
        assert exp["body_hash"] == pub["body_hash"]
        if name == "out.plain":
            assert exp["rules"] is None and exp["props_hash"] == pub["props_hash"]
        else:
            assert exp["rules"] == "stamp bus" and exp["props_hash"] != pub["props_hash"]
    assert info(g)["dataloss"] == 0


def test_the_delivery_log_writes_a_transport_s_traffic_as_its_own(start_gateway, bus):
    """docs/delivery-log.md, "Events", over the bus: the imports and the export name the
    transport with no reason, each import is its message's one entry record (before its
    delivery to a local consumer), the export has no deliver or ack of its hand-off to the
    transport; a second copy of an import (another gateway's origin marker with the same
    trace id) is dropped with a record that carries what its import would have."""
    g = start_gateway('in.> import="bus"\nout.> export="bus"\n>\n', listen=())
    got_far = bus.collect("out.>")
    got: list[Any] = []
    g.call(lambda: g.broker.connect().session().consumer(GwDestination.topic("in.>"),
                                                         listener=got.append))
    wait_for(lambda: info(g)["imports"] == {"in.>": ["in.>"]}, what="the import")
    wait_for(lambda: (bus.t.send(Message("in.a").add("n", 1)), got)[1], what="an import")
    twice = Message("in.b").add("n", 2)
    twice.origin = Origin("gw-elsewhere trace-twice", 0)
    for _ in range(2):
        bus.t.send(twice)
    wait_for(lambda: info(g)["duplicates"] == 1, what="the second copy dropped")
    g.call(lambda: g.broker.connect().session().producer(GwDestination.topic("out.a"))
           .send(GwMessage.text("out")))
    wait_for(lambda: got_far, what="the export on the bus")
    records = wait_for(lambda: (r := log_records(g)) and any(
        x["event"] == "export" for x in r) and r, what="the export record")
    check_transport_records(records, "bus", core_id(g, "bus"))
    (exp,) = [r for r in records if r["event"] == "export"]
    assert events_of(records, exp) == ["publish", "export"]
    for imp in (r for r in records if r["event"] == "import"):
        assert [e for e in events_of(records, imp) if e != "drop"] == [
            "import", "deliver", "ack"]
    drop = check_duplicate_drop(records, "bus", "trace-twice")
    (imported,) = [r for r in records if r["event"] == "import"
                   and r["trace_id"] == "trace-twice"]
    assert drop["msg_id"] != imported["msg_id"]  # the copy's own: the bus gives none
    assert drop["far_id"] is None and drop["far_dest"] == "in.b"
