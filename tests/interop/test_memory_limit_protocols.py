"""``max_msg_memory`` seen by real producers: held back with ``flow_control = enabled``,
refused in each protocol's own way without it, and nothing accepted is lost.

How this works. A gateway runs with an 8 MB ``max_msg_memory``; producers (stomp.py, paho,
python-qpid-proton) send non-persistent messages, which cannot be swapped, to a queue or
topic that nobody consumes yet (on a topic, a durable subscriber that takes nothing: a
non-durable one's backlog would be trimmed at the limit, as a laggard's). The tests wait on the gateway's own state (asked on its loop
with ``g.call``): the core's memory figure past the limit, the STOMP connection's reading
paused, the AMQP transfer left without its disposition. Then a consumer drains the queue and
every message the producer was told was accepted arrives.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

import paho.mqtt.client as mqtt
import stomp
from amqpclient import connect
from gw import GatewayThread, wait_for
from paho.mqtt.enums import CallbackAPIVersion
from proton import Delivery, Message
from proton.reactor import AtMostOnce

from gateway.backlog import MESSAGE_OVERHEAD
from gateway.client import AckMode
from gateway.message import Destination

LIMIT = 8 * 1024 * 1024
BODY = 10_000
FLOW = f"max_msg_memory = {LIMIT}\nflow_control = enabled\n"
NO_FLOW = f"max_msg_memory = {LIMIT}\n"
LISTEN = ("listen = mqtt://127.0.0.1:0\nlisten = stomp://127.0.0.1:0\n"
          "listen = amqp://127.0.0.1:0\nlisten = http://127.0.0.1:0\n")


def start(tmp_path: Any, conf: str) -> GatewayThread:
    return GatewayThread(tmp_path, gateway=conf + LISTEN).start()


def body(i: int) -> bytes:
    return i.to_bytes(4, "big") * (BODY // 4)


class Collector(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.numbers: list[int] = []
        self.errors: list[Any] = []

    def on_message(self, frame: Any) -> None:
        with self.lock:
            self.numbers.append(int.from_bytes(frame.body[:4], "big"))

    def on_error(self, frame: Any) -> None:
        with self.lock:
            self.errors.append(frame)


def holder(g: GatewayThread, topic: str, got: list[int]) -> Any:
    """A durable subscriber on ``topic`` that takes nothing until its window is opened
    (``set_window(None)``), then records each message's number in ``got``. Durable, since a
    non-durable one's backlog would be trimmed at the limit, as a laggard's. Call on the
    gateway's loop."""
    s = g.broker.connect(client_id="holder").session(AckMode.AUTO)
    return s.consumer(Destination.topic(topic), durable_name="holder", window=0,
                      listener=lambda d: got.append(int.from_bytes(d.msg.body[:4], "big")))


def stomp_peer(g: GatewayThread) -> tuple[Any, Collector]:
    c = stomp.Connection12([("127.0.0.1", g.port("stomp"))], auto_decode=False,
                           reconnect_attempts_max=1)
    listener = Collector()
    c.set_listener("collector", listener)
    c.connect(wait=True)
    return c, listener


def stomp_paused(g: GatewayThread) -> bool:
    server = g.broker.adapter_servers["stomp"]
    return any(conn.reading_paused for conn in server.connections)


def test_stomp_producer_is_paused_at_the_limit_and_nothing_is_lost(tmp_path):
    g = start(tmp_path, FLOW)
    try:
        producer, _ = stomp_peer(g)
        n = 3000  # past the limit by more than the connection's 1000 unconfirmed sends
        sent: list[int] = []

        def produce() -> None:
            for i in range(n):
                producer.send("/queue/mem", body(i), headers={"persistent": "false"})
                sent.append(i)

        t = threading.Thread(target=produce, daemon=True)
        t.start()
        wait_for(lambda: g.call(lambda: stomp_paused(g)), 60, "the producer's reading paused")
        info = g.call(g.broker.info)
        assert info["memory"] > LIMIT and info["memory_held_producers"] > 0
        assert info["rejected"] == 0
        assert t.is_alive() or len(sent) == n
        consumer, got = stomp_peer(g)
        consumer.subscribe("/queue/mem", id="1", ack="auto")
        t.join(timeout=60)
        assert not t.is_alive(), "the producer was not resumed"
        wait_for(lambda: len(got.numbers) == n, 60, f"{n} messages")
        assert got.numbers == list(range(n))
        assert not g.call(lambda: stomp_paused(g))
        assert g.call(lambda: g.broker.memory) == 0
        producer.disconnect()
        consumer.disconnect()
    finally:
        g.stop()


def test_stomp_send_past_the_limit_without_flow_control_is_an_error_frame(tmp_path):
    g = start(tmp_path, NO_FLOW)
    try:
        producer, listener = stomp_peer(g)
        sent = 0
        for i in range(2000):
            if listener.errors:
                break
            try:
                producer.send("/queue/mem", body(i), headers={"persistent": "false"})
            except Exception:  # the gateway closed the connection after its ERROR frame
                break
            sent += 1
        wait_for(lambda: listener.errors, 30, "an ERROR frame")
        err = listener.errors[0]
        assert err.headers["message"] == "limit exceeded"
        assert b"max_msg_memory" in err.body
        accepted = g.call(lambda: g.broker.queues["mem"].count)
        assert 0 < accepted < sent + 1
        # The core charged each accepted message its body and object overhead, up to the limit.
        assert accepted * (BODY + MESSAGE_OVERHEAD) <= g.call(lambda: g.broker.memory) <= LIMIT
        consumer, got = stomp_peer(g)
        consumer.subscribe("/queue/mem", id="1", ack="auto")
        wait_for(lambda: len(got.numbers) == accepted, 30, "the accepted messages")
        assert got.numbers == list(range(accepted))
        consumer.disconnect()
    finally:
        g.stop()


def test_mqtt5_publish_past_the_limit_without_flow_control_gets_quota_exceeded(tmp_path):
    # Without swapping the durable's persistent backlog stays in memory.
    g = start(tmp_path, NO_FLOW + "msg_swapping = disabled\n")
    try:
        # A durable subscriber that takes nothing: the topic's messages wait in memory (a
        # non-durable one's backlog would be trimmed at the limit: it is a laggard).
        g.call(lambda: g.broker.connect(client_id="holder").session().consumer(
            Destination.topic("mem.t"), durable_name="holder", window=0))
        acks: queue.Queue = queue.Queue()
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="mem-pub",
                        protocol=mqtt.MQTTv5)
        c.on_publish = lambda cl, u, mid, rc, p: acks.put((mid, rc.value))
        c.connect("127.0.0.1", g.port("mqtt"))
        c.loop_start()
        try:
            codes = []
            for i in range(2000):
                info = c.publish("mem/t", body(i), qos=1)
                info.wait_for_publish(timeout=30)
                codes.append(acks.get(timeout=30)[1])
                if codes[-1] != 0:
                    break
            assert codes[-1] == 0x97  # Quota exceeded (MQTT 5.0 §3.4.2.1)
            assert all(code == 0 for code in codes[:-1]) and len(codes) > 1
            held = g.call(lambda: g.broker.all_subscriptions()[0].count)
            assert held == len(codes) - 1  # every acknowledged message is there
            assert held * (BODY + MESSAGE_OVERHEAD) <= g.call(lambda: g.broker.memory) <= LIMIT
        finally:
            c.loop_stop()
            c.disconnect()
    finally:
        g.stop()


def test_amqp_transfer_past_the_limit_without_flow_control_is_rejected(tmp_path):
    g = start(tmp_path, NO_FLOW)
    try:
        c = connect(g.port("amqp"))
        s = c.create_sender("queue://mem")
        accepted = 0
        for i in range(2000):
            d = s.send(Message(body=body(i), durable=False), error_states=[])
            if d.remote_state == Delivery.REJECTED:
                assert d.remote.condition.name == "amqp:resource-limit-exceeded"
                assert "max_msg_memory" in d.remote.condition.description
                break
            assert d.remote_state == Delivery.ACCEPTED
            accepted += 1
        else:
            raise AssertionError("no transfer was rejected")
        assert accepted * (BODY + MESSAGE_OVERHEAD) <= g.call(lambda: g.broker.memory) <= LIMIT
        r = c.create_receiver("queue://mem", credit=100)
        numbers = []
        for _ in range(accepted):
            m = r.receive(timeout=10)
            numbers.append(int.from_bytes(m.body[:4], "big"))
            r.accept()
        assert numbers == list(range(accepted))
        c.close()
    finally:
        g.stop()


def test_amqp_producer_is_held_at_the_limit_and_nothing_is_lost(tmp_path):
    g = start(tmp_path, FLOW)
    try:
        n = 1000  # about 10 MB: past the limit
        c = connect(g.port("amqp"), timeout=60)
        s = c.create_sender("queue://mem")
        sent: list[int] = []

        def produce() -> None:
            # proton's blocking sender waits for each disposition: held, it stops there.
            for i in range(n):
                s.send(Message(body=body(i), durable=False))
                sent.append(i)

        t = threading.Thread(target=produce, daemon=True)
        t.start()

        def unconfirmed() -> int:
            server = g.broker.adapter_servers["amqp"]
            return sum(getattr(link, "unconfirmed", 0)
                       for conn in server.connections for link in conn.links)

        wait_for(lambda: g.call(lambda: g.broker.memory_waiters and unconfirmed() > 0), 60,
                 "the producer's transfer held unconfirmed")
        assert t.is_alive() and len(sent) < n
        assert g.call(lambda: g.broker.stats["rejected"]) == 0
        c2 = connect(g.port("amqp"), timeout=60)
        r = c2.create_receiver("queue://mem", credit=200)
        numbers = []
        for _ in range(n):
            m = r.receive(timeout=30)
            numbers.append(int.from_bytes(m.body[:4], "big"))
            r.accept()
        t.join(timeout=60)
        assert not t.is_alive() and len(sent) == n
        assert numbers == list(range(n))
        c2.close()
        c.close()
    finally:
        g.stop()


def test_mqtt_qos0_publisher_is_paused_at_the_limit_and_nothing_is_lost(tmp_path):
    """A QoS 0 PUBLISH has no acknowledgement to withhold: while one is held at the limit
    the gateway stops reading the publisher's connection, and reads it again once memory
    is back under RESUME_AT."""
    g = start(tmp_path, FLOW)
    try:
        got: list[int] = []
        consumers = [g.call(lambda: holder(g, "mem.q0", got))]
        n = 3000  # about 30 MB: past the limit
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="mem-q0")
        c.max_queued_messages_set(0)
        c.connect("127.0.0.1", g.port("mqtt"))
        c.loop_start()
        try:
            for i in range(n):
                c.publish("mem/q0", body(i), qos=0)

            def held() -> int:
                return sum(getattr(conn, "held_qos0", 0)
                           for conn in g.broker.adapter_servers["mqtt"].connections)

            def count() -> int:
                return consumers[0].core.endpoint.count

            # Paused, or (were it not) every message taken in whatever the memory.
            wait_for(lambda: g.call(lambda: held() > 0 or count() == n), 60,
                     "the QoS 0 publisher's reading paused")
            info = g.call(g.broker.info)
            assert info["memory_held_producers"] > 0 and info["rejected"] == 0
            # What one read of the socket brought in past the limit, no more.
            assert info["memory"] <= LIMIT + 512 * 1024
            g.call(lambda: consumers[0].core.set_window(None))
            wait_for(lambda: len(got) == n, 60, f"{n} messages")
            assert got == list(range(n))
            assert g.call(held) == 0
            assert g.call(lambda: g.broker.stats["rejected"]) == 0
        finally:
            c.loop_stop()
            c.disconnect()
    finally:
        g.stop()


def test_mqtt_qos0_flood_past_the_limit_is_refused_with_a_few_log_lines(tmp_path, caplog):
    """Without flow control an MQTT 3.1.1 QoS 0 publish past the limit is dropped (the protocol
    has no way to answer it); a publisher flooding a full gateway gets its refusals counted
    but a log line only every 10 s, not one per message."""
    caplog.set_level(logging.INFO, logger="adapters")
    g = start(tmp_path, NO_FLOW)
    try:
        g.call(lambda: g.broker.connect(client_id="holder").session().consumer(
            Destination.topic("mem.f"), durable_name="holder", window=0))
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="mem-flood",
                        protocol=mqtt.MQTTv311)
        c.connect("127.0.0.1", g.port("mqtt"))
        c.loop_start()
        try:
            total = LIMIT // BODY + 500
            for i in range(total):
                c.publish("mem/f", body(i), qos=0)
            # A QoS 1 publish after the flood: its PUBACK says every earlier packet was read.
            c.publish("mem/other", b"x", qos=1).wait_for_publish(timeout=60)
            rejected = g.call(lambda: g.broker.stats["rejected"])
            assert rejected >= 400
            refused = [r for r in caplog.records if "refused" in r.getMessage()]
            assert 1 <= len(refused) <= 2, [r.getMessage() for r in refused]
        finally:
            c.loop_stop()
            c.disconnect()
    finally:
        g.stop()


def test_amqp_presettled_flood_past_the_limit_is_dropped_with_a_few_log_lines(tmp_path, caplog):
    """A pre-settled transfer refused at the limit has no outcome to carry the refusal: it is
    dropped, counted, and logged at most every 10 s however many follow."""
    caplog.set_level(logging.INFO, logger="adapters")
    g = start(tmp_path, NO_FLOW)
    try:
        c = connect(g.port("amqp"))
        s = c.create_sender("queue://mem", options=AtMostOnce())
        total = LIMIT // BODY + 500
        for i in range(total):
            s.send(Message(body=body(i), durable=False))
        # An unsettled transfer on the same connection is read after them all; the queue is
        # full, so its outcome is a rejection -- and it means the flood has been read.
        d = c.create_sender("queue://mem", name="probe").send(Message(body=body(0), durable=False),
                                                error_states=[])
        assert d.remote_state == Delivery.REJECTED
        assert total - g.call(lambda: g.broker.queues["mem"].count) >= 500  # refused
        dropped = [r for r in caplog.records if "pre-settled" in r.getMessage()]
        assert 1 <= len(dropped) <= 2, [r.getMessage() for r in dropped]
        c.close()
    finally:
        g.stop()


def _mqtt_publish(topic: str, payload: bytes) -> bytes:
    """An MQTT 3.1.1 QoS 0 PUBLISH packet (MQTT 3.1.1 §3.3)."""
    var = len(topic).to_bytes(2, "big") + topic.encode() + payload
    n, length = len(var), b""
    while True:
        n, digit = n >> 7, n & 0x7F
        length += bytes([digit | (0x80 if n else 0)])
        if not n:
            return b"\x30" + length + var


def test_mqtt_websocket_qos0_publisher_is_paused_at_the_limit_and_nothing_is_lost(tmp_path):
    """The same over MQTT-over-WebSocket: while a QoS 0 publish is held the gateway takes no
    more WebSocket messages from that client, so the flood waits in the client and the
    kernel, not in the gateway. (The client is aiohttp's: paho's WebSocket transport loses a
    packet when the socket takes only part of a frame, which is what a paused reader causes.)"""
    import asyncio

    import aiohttp

    g = start(tmp_path, FLOW)
    try:
        got: list[int] = []
        consumers = [g.call(lambda: holder(g, "mem.ws", got))]
        n = 3000  # about 30 MB: past the limit
        sent: list[int] = []

        async def flood() -> None:
            async with aiohttp.ClientSession() as http, http.ws_connect(
                    f"http://127.0.0.1:{g.port('http')}/mqtt", protocols=("mqtt",)) as ws:
                # CONNECT: MQTT 3.1.1, clean session, keep alive 600 s, client id "ws-q0".
                await ws.send_bytes(bytes.fromhex("101100044d5154540402025800057773") + b"-q0")
                for i in range(n):
                    await ws.send_bytes(_mqtt_publish("mem/ws", body(i)))
                    sent.append(i)
                await ws.close()

        sender = threading.Thread(target=asyncio.run, args=(flood(),), daemon=True)
        sender.start()

        def held() -> int:
            return sum(getattr(conn, "held_qos0", 0)
                       for conn in g.broker.adapter_servers["mqtt"].connections)

        def count() -> int:
            return consumers[0].core.endpoint.count

        wait_for(lambda: g.call(lambda: held() > 0 or count() == n), 60,
                 "the QoS 0 publisher's reading paused")
        time.sleep(1)  # time to read much more, were reading not paused
        info = g.call(g.broker.info)
        assert info["memory_held_producers"] > 0 and info["rejected"] == 0
        assert info["memory"] <= LIMIT + 512 * 1024
        assert len(sent) < n  # the client is held too
        g.call(lambda: consumers[0].core.set_window(None))
        wait_for(lambda: len(got) == n, 60, f"{n} messages")
        assert got == list(range(n))
        sender.join(30)
        assert g.call(lambda: g.broker.stats["rejected"]) == 0
    finally:
        g.stop()


def test_a_publisher_held_longer_than_its_keep_alive_is_not_taken_for_silent(tmp_path):
    """While a held QoS 0 publish stops the gateway reading a client, the client's packets
    (PINGREQ among them) wait unread: Keep Alive ([MQTT-3.1.2-22]) must not close it then,
    and counts again from when reading resumes."""
    import socket

    g = start(tmp_path, FLOW)
    try:
        got: list[int] = []
        consumer = g.call(lambda: holder(g, "mem.ka", got))
        n = 3000  # about 30 MB: past the limit
        s = socket.create_connection(("127.0.0.1", g.port("mqtt")))
        # CONNECT: MQTT 3.1.1, clean session, Keep Alive 1 s (closed after 1.5 s of silence).
        s.sendall(bytes.fromhex("101000044d51545404020001000461622d6b"))
        assert s.recv(4)[:1] == b"\x20"  # CONNACK
        flood = b"".join(_mqtt_publish("mem/ka", body(i)) for i in range(n))
        sender = threading.Thread(target=s.sendall, args=(flood,), daemon=True)
        sender.start()

        def connection() -> Any:
            conns = [c for c in g.broker.adapter_servers["mqtt"].connections
                     if c.session is not None and c.session.client_id == "ab-k"]
            return conns[0] if conns else None

        wait_for(lambda: g.call(lambda: connection() is not None
                                and connection().held_qos0 > 0), 60, "the publisher held")
        time.sleep(3)  # twice the Keep Alive limit, unread
        assert g.call(lambda: connection() is not None and connection().held_qos0 > 0)
        g.call(lambda: consumer.core.set_window(None))
        wait_for(lambda: len(got) == n, 60, f"{n} messages")
        assert got == list(range(n))
        sender.join(30)
        s.sendall(b"\xe0\x00")  # DISCONNECT
        s.close()
    finally:
        g.stop()
