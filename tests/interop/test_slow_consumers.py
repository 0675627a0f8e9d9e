"""Slow and stuck consumers: a client that stops reading its socket must not make the gateway
hold unbounded memory outside the core, nor freeze a topic for its other subscribers.

Each test connects a *stuck* subscriber (a raw socket with a small receive buffer that never
reads after subscribing) and a healthy one (paho-mqtt, stomp.py) to one topic, then floods
the topic with 1 KB messages. The flood goes in chunks, each sent when the healthy subscriber
has everything before it, so the healthy one never lags by more than a chunk: the test then
asserts what must hold whatever the machine's speed --

* the healthy subscriber receives every message;
* the stuck connection's unsent output stays below the write high-water mark plus one
  batch, and what waits for it in the core stays within its bound (the MQTT session's
  ``mqtt_max_queued_messages``, the topic's ``maxmsgs``);
* what was dropped for the stuck subscriber is exactly what the delivery log, the
  subscription's and the server's counters say: once the stuck client reads again, it
  receives every message that was not dropped.

``max_msg_memory`` is set below the flood's size: were the stuck subscriber's backlog
unbounded, the core would reach it and refuse the rest of the flood for everyone.
"""

from __future__ import annotations

import json
import os
import socket
import struct
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from gw import GatewayThread, wait_for
from paho.mqtt.enums import CallbackAPIVersion

from adapters.listener import WRITE_HIGH_WATER
from gateway.client import AckMode
from gateway.config.security import VerifiedUser
from gateway.message import Destination

N = 20_000  # messages in a flood
CHUNK = 500  # sent at a time, each once the healthy subscriber has the ones before
SIZE = 1024
# One batch the shell may add past the high-water mark before it pauses: what one read of
# the publisher's socket produced for this connection -- asyncio and uvloop read at most
# 256 KiB at a time; the same messages framed for another protocol take a little more.
BATCH_ALLOWANCE = 512 * 1024
MAX_QUEUED = 1000  # mqtt_max_queued_messages' default
GATEWAY_CONF = """
listen = mqtt://127.0.0.1:0
listen = stomp://127.0.0.1:0
listen = amqp://127.0.0.1:0
listen = http://127.0.0.1:0
max_msg_memory = 12MB
store_sync = disabled
"""


OPEN: list[socket.socket] = []  # the raw sockets of the running test, closed after it


@pytest.fixture
def gw(tmp_path: Path):
    g = GatewayThread(tmp_path, gateway=GATEWAY_CONF,
                      topics=">\nflood.stomp maxmsgs=1000\nflood.amqp maxmsgs=1000\n"
                             "flood.discard overflowPolicy=discardOld\n"
                             "flood.reject overflowPolicy=rejectIncoming\n")
    g.start()
    yield g
    while OPEN:
        OPEN.pop().close()
    g.stop()


def payload(seq: int) -> bytes:
    head = b"%08d" % seq
    return head + b"x" * (SIZE - len(head))


# -- a raw MQTT client that stops reading ----------------------------------------------------

def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n % 128
        n //= 128
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + _varint(len(body)) + body


def _str(s: str) -> bytes:
    return struct.pack(">H", len(s)) + s.encode()


class RawMqtt:
    """Connects and subscribes, then reads nothing until :meth:`drain` (which acknowledges
    every QoS 1/2 PUBLISH as a client must)."""

    def __init__(self, sock: socket.socket, cid: str, level: int, topic: str | None, qos: int, *,
                 clean: bool = True, ws: bool = False) -> None:
        self.s = sock
        self.level = level
        self.ws = ws
        self.buf = b""
        self.got: list[int] = []
        v5 = b"\x00" if level == 5 else b""
        self.send(_packet(0x10, _str("MQTT") + bytes([level, 0x02 if clean else 0]) + b"\x00\x00"
                          + v5 + _str(cid)))
        assert self.read_packet()[0] >> 4 == 2  # CONNACK
        if topic is not None:
            self.send(_packet(0x82, b"\x00\x01" + v5 + _str(topic) + bytes([qos])))
            assert self.read_packet()[0] >> 4 == 9  # SUBACK

    def send(self, data: bytes) -> None:
        if self.ws:  # one masked binary frame (RFC 6455 §5.2)
            mask = os.urandom(4)
            n = len(data)
            head = bytes([0x82]) + (bytes([0x80 | n]) if n < 126 else
                                   bytes([0x80 | 126]) + struct.pack(">H", n))
            data = head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        self.s.sendall(data)

    def _fill(self) -> None:
        chunk = self.s.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        if not self.ws:
            self.buf += chunk
            return
        self.raw = getattr(self, "raw", b"") + chunk
        while len(self.raw) >= 2:  # unmasked frames from the server
            n = self.raw[1] & 0x7F
            off = {126: 4, 127: 10}.get(n, 2)
            if len(self.raw) < off:  # the extended length has not all come yet
                return
            if n == 126:
                n = struct.unpack(">H", self.raw[2:4])[0]
            elif n == 127:
                n = struct.unpack(">Q", self.raw[2:10])[0]
            if len(self.raw) < off + n:
                return
            self.buf += self.raw[off:off + n]
            self.raw = self.raw[off + n:]

    def read_packet(self) -> tuple[int, bytes]:
        while True:
            if len(self.buf) >= 2:
                n, mult, i = 0, 1, 1
                while i < len(self.buf):
                    b = self.buf[i]
                    n += (b & 0x7F) * mult
                    mult *= 128
                    i += 1
                    if not b & 0x80:
                        if len(self.buf) >= i + n:
                            first, body = self.buf[0], self.buf[i:i + n]
                            self.buf = self.buf[i + n:]
                            return first, body
                        break
            self._fill()

    def drain(self, until: Any) -> None:
        """Read again: take every PUBLISH, acknowledge it, until ``until()`` is true."""
        self.s.settimeout(30)
        while not until():
            first, body = self.read_packet()
            kind = first >> 4
            if kind == 3:
                qos = (first >> 1) & 3
                tlen = struct.unpack(">H", body[:2])[0]
                off = 2 + tlen
                pid = 0
                if qos:
                    pid = struct.unpack(">H", body[off:off + 2])[0]
                    off += 2
                if self.level == 5:  # properties length (a varint)
                    plen, mult = 0, 1
                    while True:
                        b = body[off]
                        off += 1
                        plen += (b & 0x7F) * mult
                        mult *= 128
                        if not b & 0x80:
                            break
                    off += plen
                self.got.append(int(body[off:off + 8]))
                if qos == 1:
                    self.send(_packet(0x40, struct.pack(">H", pid)))
                elif qos == 2:
                    self.send(_packet(0x50, struct.pack(">H", pid)))
            elif kind == 6:  # PUBREL
                self.send(_packet(0x70, body[:2]))


def stuck_socket(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    OPEN.append(s)
    s.connect(("127.0.0.1", port))
    s.settimeout(10)
    return s


def ws_socket(port: int, subprotocol: str) -> socket.socket:
    """A WebSocket upgrade by hand, so that the test decides when the socket is read."""
    s = stuck_socket(port)
    s.sendall((f"GET /{subprotocol.split('.')[-1]} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               "Upgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
               f"Sec-WebSocket-Protocol: {subprotocol}\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return s


# -- the healthy side and the flood ------------------------------------------------------------

class Healthy:
    """A paho subscriber that records the sequence numbers it receives."""

    def __init__(self, port: int, topic: str, qos: int, level: int) -> None:
        proto = mqtt.MQTTv5 if level == 5 else mqtt.MQTTv311
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"healthy{level}{qos}",
                             protocol=proto)
        self.got: set[int] = set()
        self.c.on_message = lambda c, u, m: self.got.add(int(m.payload[:8]))
        subscribed: list[Any] = []
        self.c.on_subscribe = lambda *a: subscribed.append(a)
        self.c.connect("127.0.0.1", port, 60)
        self.c.loop_start()
        self.c.subscribe(topic, qos)
        wait_for(lambda: subscribed, what="SUBACK")

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def flood(port: int, topic: str, qos: int, received: Any, probe: Any,
          chunk: int = CHUNK) -> None:
    """Publish N messages in chunks; before each chunk, wait for ``received()`` to count
    every message sent so far and call ``probe()`` (the per-chunk checks)."""
    pub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"flood{qos}")
    pub.max_inflight_messages_set(CHUNK)
    pub.max_queued_messages_set(0)
    pub.connect("127.0.0.1", port, 60)
    pub.loop_start()
    try:
        for start in range(0, N, chunk):
            infos = [pub.publish(topic, payload(i), qos) for i in range(start, start + chunk)]
            for info in infos:
                info.wait_for_publish(30)
            end = start + chunk
            wait_for(lambda end=end: received() >= end, timeout=60,
                     what=f"the healthy subscriber to have {end} messages")
            probe()
    finally:
        pub.disconnect()
        pub.loop_stop()


def drops(gw: GatewayThread, conn_id: str, event: str, reason: str) -> int:
    """``event`` records with ``reason`` for ``conn_id`` in the delivery log (flushed first)."""
    gw.call(lambda: gw.broker.dlog.flush())
    directory = Path(gw.broker.config.gateway.delivery_log_dir)
    n = 0
    for f in sorted(directory.iterdir()):
        for line in f.read_text("utf-8").splitlines():
            r = json.loads(line)
            if r["event"] == event and r["reason"] == reason and r["client"] == conn_id:
                n += 1
    return n


def admin(gw: GatewayThread, path: str) -> Any:
    return gw.admin_get(path)


def flow_of(gw: GatewayThread, client_id: str) -> Any:
    """The stuck connection's WriteFlow, its core subscription and core connection id."""
    def find() -> Any:
        for server in gw.broker.adapter_servers.values():
            for c in server.connections:
                flow = getattr(c, "flow", None)
                if flow is not None and flow.conn is c and c.client_id() == client_id:
                    core = gw.broker.connections[c.core_id()]
                    subs = [s for s in gw.broker.all_subscriptions()
                            if any(x.session.connection is core for x in s.consumers)]
                    return flow, subs[0], core.id
        return None
    return wait_for(lambda: gw.call(find), what=f"the connection of {client_id}")


class Probe:
    """Per-chunk samples, taken on the gateway's loop: the stuck connection's unsent bytes
    and the messages queued for it in its core subscription."""

    def __init__(self, gw: GatewayThread, flow: Any, sub: Any) -> None:
        self.gw, self.flow, self.sub = gw, flow, sub
        self.buffered: list[int] = []
        self.queued: list[int] = []

    def __call__(self) -> None:
        b, q = self.gw.call(lambda: (self.flow.buffered(),
                                     self.sub.npending + len(self.sub.held)))
        self.buffered.append(b)
        self.queued.append(q)


def flood_past(gw: GatewayThread, client_id: str, topic: str, qos: int,
               level: int = 4) -> tuple[Any, Any, Any, Probe]:
    """Flood ``topic`` while the connection of ``client_id`` reads nothing: a healthy MQTT
    subscriber must get every message, and the stuck connection's unsent bytes must stay
    within the high-water mark plus one read batch. Returns the stuck connection's
    WriteFlow, core subscription, core connection id and the probe's samples."""
    port = gw.port("mqtt")
    healthy = Healthy(port, topic, qos, level)
    flow, sub, conn_id = flow_of(gw, client_id)
    probe = Probe(gw, flow, sub)
    try:
        flood(port, topic, qos, lambda: len(healthy.got), probe)
        assert healthy.got == set(range(N))  # every message, for the whole flood
    finally:
        healthy.close()
    assert max(probe.buffered) <= WRITE_HIGH_WATER + BATCH_ALLOWANCE
    return flow, sub, conn_id, probe


# -- MQTT -------------------------------------------------------------------------------------

@pytest.mark.parametrize("level", [4, 5], ids=["3.1.1", "5.0"])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_mqtt_stuck_subscriber_is_bounded_and_others_get_everything(gw, qos, level):
    port = gw.port("mqtt")
    topic = f"flood/m{qos}{level}"
    stuck = RawMqtt(stuck_socket(port), f"stuck{qos}{level}", level, topic, qos)
    dropped_before = gw.call(lambda: gw.broker.stats["dropped"])
    # Nothing unbounded outside the core, and the core's share within the session's bound.
    flow, sub, conn_id, probe = flood_past(gw, f"stuck{qos}{level}", topic, qos, level)
    assert max(probe.queued) <= MAX_QUEUED
    if level == 4 and qos:
        # mqtt_max_inflight_messages (20) unacknowledged deliveries, no more.
        assert gw.call(lambda: sum(c.unacked for c in sub.consumers)) == 20
    # What was dropped is what the log and the counters say ...
    dropped = drops(gw, conn_id, "drop", "max_queued")
    assert dropped > 0
    assert gw.call(lambda: sub.dropped) == dropped
    assert gw.call(lambda: gw.broker.stats["dropped"]) - dropped_before == dropped
    sessions = {r["client_id"]: r for r in admin(gw, "/api/v1/sessions")}
    assert sessions[f"stuck{qos}{level}"]["dropped"] == dropped
    # ... and everything else reaches the stuck client once it reads again, once each.
    stuck.drain(lambda: len(stuck.got) >= N - dropped)
    assert len(stuck.got) == len(set(stuck.got)) == N - dropped
    stuck.s.close()


def test_mqtt_stuck_subscriber_with_discard_old_keeps_the_newest(gw):
    """Past the session's bound a QoS 1 message follows the topic's overflowPolicy:
    discardOld discards the oldest queued message, logged and counted, so the stuck client
    gets its 20 in flight and then the newest 1000 when it reads again."""
    port = gw.port("mqtt")
    topic = "flood/discard"
    stuck = RawMqtt(stuck_socket(port), "stuckdiscard", 4, topic, 1)
    healthy = Healthy(port, topic, 1, 4)
    flow, sub, conn_id = flow_of(gw, "stuckdiscard")
    try:
        flood(port, topic, 1, lambda: len(healthy.got), lambda: None)
        assert healthy.got == set(range(N))
    finally:
        healthy.close()
    discarded = gw.call(lambda: sub.stats_discarded)
    assert discarded == N - 20 - MAX_QUEUED
    assert gw.call(lambda: sub.dropped) == 0
    gw.call(lambda: gw.broker.dlog.flush())
    logged = 0
    for f in sorted(Path(gw.broker.config.gateway.delivery_log_dir).iterdir()):
        for line in f.read_text("utf-8").splitlines():
            r = json.loads(line)
            if (r["event"], r["reason"], r["dest"]) == ("discard", "discarded",
                                                        "topic:flood.discard"):
                logged += 1
    assert logged == discarded
    stuck.drain(lambda: len(stuck.got) >= 20 + MAX_QUEUED)
    assert sorted(stuck.got) == list(range(20)) + list(range(N - MAX_QUEUED, N))


def test_mqtt_stuck_subscriber_with_reject_incoming_refuses_the_publish(gw):
    """rejectIncoming: once a QoS 1 subscriber's session queue is full the publisher's
    persistent message is refused (as the topic's own limits do), and a non-persistent
    one is still only dropped for that subscriber."""
    from gateway.errors import LimitExceededError
    from gateway.message import DeliveryMode, Message

    port = gw.port("mqtt")
    RawMqtt(stuck_socket(port), "stuckreject", 4, "flood/reject", 1)
    flow, sub, conn_id = flow_of(gw, "stuckreject")

    def send(mode: DeliveryMode) -> str:
        msg = Message.binary(payload(0), delivery_mode=mode,
                             destination=Destination.topic("flood.reject"))
        try:
            gw.broker.publish(msg)
        except LimitExceededError as exc:
            return str(exc)
        return "accepted"

    accepted = [gw.call(lambda: send(DeliveryMode.PERSISTENT)) for _ in range(20 + MAX_QUEUED)]
    assert accepted == ["accepted"] * (20 + MAX_QUEUED)  # 20 in flight, 1000 queued
    assert "queue is full (rejectIncoming)" in gw.call(lambda: send(DeliveryMode.PERSISTENT))
    assert gw.call(lambda: send(DeliveryMode.NON_PERSISTENT)) == "accepted"
    assert gw.call(lambda: (sub.npending, sub.dropped)) == (MAX_QUEUED, 1)


def test_slow_consumer_is_shown_and_announced(gw):
    """The admin views list the stuck connection as slow with its buffered bytes and
    its session's queue; a notice on $sys.monitor.client.slowconsumer says when it became
    slow and when it recovered."""
    notices: list[dict[str, Any]] = []

    def watch() -> None:
        # monitor topics need a verified administrator: in-process code vouches for one
        conn = gw.broker.connect(client_id="monitor", user=VerifiedUser("admin"),
                                 authenticated=True)
        conn.start()
        conn.session(AckMode.AUTO).consumer(
            Destination.topic("$sys.monitor.client.slowconsumer"),
            listener=lambda d: notices.append(dict(d.msg.body)))

    gw.call(watch)
    port = gw.port("mqtt")
    stuck = RawMqtt(stuck_socket(port), "stuckmon", 4, "flood/mon", 0)
    healthy = Healthy(port, "flood/mon", 0, 4)
    flow, sub, conn_id = flow_of(gw, "stuckmon")
    shown: list[Any] = []

    def probe() -> None:
        if not shown:
            slow = admin(gw, "/api/v1/clients?slow=1")
            row = [r for r in slow if r["client_id"] == "stuckmon"]
            if row:
                shown.append(row[0])
                shown.append({r["id"]: r for r in admin(gw, "/api/v1/connections")}[conn_id])
    try:
        flood(port, "flood/mon", 0, lambda: len(healthy.got), probe)
    finally:
        healthy.close()
    client, connection = shown
    assert client["slow"] and client["buffered"] > 0 and client["connection"] == conn_id
    assert connection["slow"] and connection["buffered"] > 0
    session = {r["client_id"]: r for r in admin(gw, "/api/v1/sessions")}["stuckmon"]
    assert session["queued"] == MAX_QUEUED and session["write_paused"]
    assert session["dropped"] == gw.call(lambda: sub.dropped) > 0
    wait_for(lambda: any(n["event"] == "slow" and n["client_id"] == "stuckmon"
                         for n in notices), what="the slow notice")
    dropped = gw.call(lambda: sub.dropped)
    stuck.drain(lambda: len(stuck.got) >= N - dropped)
    wait_for(lambda: not [r for r in admin(gw, "/api/v1/clients?slow=1")
                          if r["client_id"] == "stuckmon"], what="the slow flag to clear")
    wait_for(lambda: any(n["event"] == "recovered" and n["client_id"] == "stuckmon"
                         for n in notices), what="the recovered notice")
    stuck.s.close()


def test_offline_persistent_session_queue_is_bounded_then_delivered(gw):
    """A persistent session's queue while its client is away is bounded the same way; what
    was kept is delivered, once each, when the client comes back and reads."""
    port = gw.port("mqtt")
    topic = "flood/offline"
    first = RawMqtt(stuck_socket(port), "away", 4, topic, 1, clean=False)
    first.s.close()
    wait_for(lambda: gw.call(lambda: gw.broker.adapter_servers["mqtt"].sessions["away"].conn
                             is None), what="the session to be offline")
    sub = gw.call(lambda: gw.broker.durables["sub:away:mqtt:" + topic])
    healthy = Healthy(port, topic, 1, 4)
    queued: list[int] = []
    try:
        flood(port, topic, 1, lambda: len(healthy.got),
              lambda: queued.append(gw.call(lambda: sub.npending + len(sub.held))))
    finally:
        healthy.close()
    assert max(queued) == MAX_QUEUED
    dropped = gw.call(lambda: sub.dropped)
    assert dropped == N - MAX_QUEUED
    back = RawMqtt(stuck_socket(port), "away", 4, None, 1, clean=False)  # session present
    back.drain(lambda: len(back.got) >= MAX_QUEUED)
    assert sorted(back.got) == list(range(MAX_QUEUED))  # the first ones, kept in order
    back.s.close()


def test_offline_session_bound_survives_a_gateway_restart(gw):
    """After a restart the sessions are read from the store with their durable
    subscriptions: the bound is set on them again before their client returns."""
    port = gw.port("mqtt")
    topic = "flood/restart"
    first = RawMqtt(stuck_socket(port), "away2", 4, topic, 1, clean=False)
    first.s.close()
    wait_for(lambda: gw.call(lambda: gw.broker.adapter_servers["mqtt"].sessions["away2"].conn
                             is None), what="the session to be offline")
    gw.restart()
    port = gw.port("mqtt")
    sub = gw.call(lambda: gw.broker.durables["sub:away2:mqtt:" + topic])
    assert gw.call(lambda: sub.bound) == (MAX_QUEUED, 0, False)
    healthy = Healthy(port, topic, 1, 4)
    try:
        flood(port, topic, 1, lambda: len(healthy.got), lambda: None)
    finally:
        healthy.close()
    assert gw.call(lambda: (sub.npending, sub.dropped)) == (MAX_QUEUED, N - MAX_QUEUED)


def test_mqtt_over_websocket_stuck_subscriber_is_bounded(gw):
    """The WebSocket shell counts what waits to be sent and pauses the connection's
    deliveries past the high-water mark, as the TCP shells do."""
    topic = "flood/ws"
    stuck = RawMqtt(ws_socket(gw.port("http"), "mqtt"), "stuckws", 4, topic, 0, ws=True)
    flow, sub, conn_id, probe = flood_past(gw, "stuckws", topic, 0)
    assert max(probe.queued) <= MAX_QUEUED
    dropped = drops(gw, conn_id, "drop", "max_queued")
    assert dropped == gw.call(lambda: sub.dropped) > 0
    stuck.drain(lambda: len(stuck.got) >= N - dropped)
    assert len(set(stuck.got)) == len(stuck.got) == N - dropped
    stuck.s.close()


# -- STOMP ------------------------------------------------------------------------------------

def stomp_frame(command: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    head = "".join(f"{k}:{v}\n" for k, v in headers.items())
    return f"{command}\n{head}\n".encode() + body + b"\x00"


def read_stomp_frames(s: socket.socket, buf: bytes) -> tuple[list[bytes], bytes]:
    """Complete frames (by content-length) from ``buf`` plus one more read."""
    buf += s.recv(65536)
    frames = []
    while True:
        buf = buf.lstrip(b"\n")
        end = buf.find(b"\n\n")
        if end < 0:
            return frames, buf
        head = buf[:end].decode()
        length = None
        for line in head.split("\n")[1:]:
            if line.startswith("content-length:"):
                length = int(line.split(":", 1)[1])
        if length is None:
            stop = buf.find(b"\x00", end)
            if stop < 0:
                return frames, buf
        else:
            stop = end + 2 + length
            if len(buf) <= stop:
                return frames, buf
        frames.append(buf[:stop])
        buf = buf[stop + 1:]


@pytest.mark.parametrize("via", ["tcp", "websocket"])
def test_stomp_stuck_subscriber_is_bounded_by_the_topic(gw, via):
    """A STOMP subscriber that stops reading: its deliveries pause at the high-water mark,
    its backlog counts against the topic's maxmsgs (the default overflow policy drops for
    that subscriber only), and the others on the topic get every message."""
    if via == "tcp":
        s = stuck_socket(gw.port("stomp"))
    else:
        s = ws_socket(gw.port("http"), "v12.stomp")

    def send(data: bytes) -> None:
        if via == "tcp":
            s.sendall(data)
            return
        mask = os.urandom(4)
        n = len(data)
        head = bytes([0x82, 0x80 | n]) if n < 126 else bytes([0x82, 0xFE]) + struct.pack(">H", n)
        s.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    send(stomp_frame("CONNECT", {"accept-version": "1.2", "host": "gw",
                                 "client-id": "stuckstomp"}))
    s.recv(4096)  # CONNECTED
    send(stomp_frame("SUBSCRIBE", {"id": "1", "destination": "/topic/flood.stomp",
                                   "ack": "auto", "receipt": "r"}))
    s.recv(4096)  # RECEIPT
    flow, sub, conn_id, probe = flood_past(gw, "stuckstomp", "flood/stomp", 1)
    assert max(probe.queued) <= 1000  # topics.conf: flood.stomp maxmsgs=1000
    # The topic's limit dropped for this subscriber ("exceeded"), counted and logged.
    dropped = gw.call(lambda: sub.dropped)
    assert dropped > 0
    gw.call(lambda: gw.broker.dlog.flush())
    logged = 0
    for f in sorted(Path(gw.broker.config.gateway.delivery_log_dir).iterdir()):
        for line in f.read_text("utf-8").splitlines():
            r = json.loads(line)
            if (r["event"], r["reason"], r["dest"]) == ("drop", "exceeded", "topic:flood.stomp"):
                logged += 1
    assert logged == dropped
    if via == "tcp":  # read again: every message not dropped arrives, once
        got: list[int] = []
        buf = b""
        s.settimeout(30)
        while len(got) < N - dropped:
            frames, buf = read_stomp_frames(s, buf)
            for fr in frames:
                if fr.startswith(b"MESSAGE"):
                    got.append(int(fr[fr.index(b"\n\n") + 2:][:8]))
        assert len(got) == len(set(got)) == N - dropped
    s.close()


# -- AMQP -------------------------------------------------------------------------------------

def test_amqp_stuck_receiver_is_bounded(gw):
    """An AMQP receiver that granted much credit and stopped reading: deliveries pause at
    the write high-water mark and its backlog counts against the topic's maxmsgs."""
    from amqpclient import AMQP_HEADER, ATTACH, BEGIN, OPEN, frame
    from proton import Described, ubyte, uint, ulong

    s = stuck_socket(gw.port("amqp"))
    flow_frame = frame(0x13, [uint(0), uint(1 << 20), uint(0), uint(1 << 20), uint(0), uint(0),
                              uint(1 << 20)])
    s.sendall(AMQP_HEADER + frame(OPEN, ["stuckamqp"])
              + frame(BEGIN, [None, uint(0), uint(1 << 20), uint(1 << 20)])
              + frame(ATTACH, ["r", uint(0), True, ubyte(1), None,
                               Described(ulong(0x28), ["topic://flood.amqp"]),
                               Described(ulong(0x29), [None])])
              + flow_frame)
    flow, sub, conn_id, probe = flood_past(gw, "stuckamqp", "flood/amqp", 1)
    assert max(probe.queued) <= 1000
    assert gw.call(lambda: sub.dropped) > 0
    s.close()


def test_queued_bytes_bound_and_the_parameters(tmp_path: Path):
    """mqtt_max_queued_bytes bounds a subscription by bytes (queued and in flight);
    mqtt_max_queued_messages = 0 lifts the count bound; mqtt_max_inflight_messages sets a
    3.1.1 client's window. Bad values are config errors naming the parameter."""
    from gateway.config import load_config
    from gateway.errors import ConfigErrors

    g = GatewayThread(tmp_path / "gw", gateway=GATEWAY_CONF + "mqtt_max_queued_messages = 0\n"
                      "mqtt_max_queued_bytes = 200KB\nmqtt_max_inflight_messages = 5\n")
    g.start()
    try:
        port = g.port("mqtt")
        stuck = RawMqtt(stuck_socket(port), "stuckbytes", 4, "flood/bytes", 1)
        healthy = Healthy(port, "flood/bytes", 1, 4)
        flow, sub, conn_id = flow_of(g, "stuckbytes")
        held: list[int] = []
        try:
            flood(port, "flood/bytes", 1, lambda: len(healthy.got),
                  lambda: held.append(g.call(lambda: sub.bytes)),
                  chunk=100)  # the healthy one's backlog stays below the byte bound too
            assert healthy.got == set(range(N))
        finally:
            healthy.close()
        assert gw_bound(g, sub) == (0, 200 * 1024, False)
        assert max(held) <= 200 * 1024
        assert g.call(lambda: sum(c.unacked for c in sub.consumers)) == 5
        dropped = g.call(lambda: sub.dropped)
        assert dropped == drops(g, conn_id, "drop", "max_queued") > 0
        stuck.drain(lambda: len(stuck.got) >= N - dropped)
        assert len(set(stuck.got)) == N - dropped
    finally:
        while OPEN:
            OPEN.pop().close()
        g.stop()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "gateway.conf").write_text("mqtt_max_inflight_messages = 70000\n")
    with pytest.raises(ConfigErrors, match="mqtt_max_inflight_messages: 70000 is too large"):
        load_config(str(bad))


def gw_bound(g: GatewayThread, sub: Any) -> Any:
    return g.call(lambda: sub.bound)


# -- memory short: slow consumers pay first ---------------------------------------------------

def test_stuck_stomp_and_amqp_subscribers_pay_first_when_memory_is_short(gw):
    """On a topic with no limits of its own, a STOMP subscriber and an AMQP receiver that
    stop reading leave their backlogs in the core until ``max_msg_memory`` is reached; then
    the core drops their pending non-persistent messages (``slow_consumer``) rather than
    refuse the publishers, so the healthy stomp.py subscriber and proton receiver on the same
    topic get every message of a non-persistent flood larger than the limit."""
    import threading

    import stomp
    from amqpclient import AMQP_HEADER, ATTACH, BEGIN, OPEN, connect, frame
    from proton import Described, ubyte, uint, ulong

    s = stuck_socket(gw.port("stomp"))
    s.sendall(stomp_frame("CONNECT", {"accept-version": "1.2", "host": "gw",
                                      "client-id": "stuckmemstomp"}))
    s.recv(4096)  # CONNECTED
    s.sendall(stomp_frame("SUBSCRIBE", {"id": "1", "destination": "/topic/flood.mem",
                                        "ack": "auto", "receipt": "r"}))
    s.recv(4096)  # RECEIPT
    a = stuck_socket(gw.port("amqp"))
    a.sendall(AMQP_HEADER + frame(OPEN, ["stuckmemamqp"])
              + frame(BEGIN, [None, uint(0), uint(1 << 20), uint(1 << 20)])
              + frame(ATTACH, ["r", uint(0), True, ubyte(1), None,
                               Described(ulong(0x28), ["topic://flood.mem"]),
                               Described(ulong(0x29), [None])])
              + frame(0x13, [uint(0), uint(1 << 20), uint(0), uint(1 << 20), uint(0), uint(0),
                             uint(1 << 20)]))
    stuck = [flow_of(gw, "stuckmemstomp"), flow_of(gw, "stuckmemamqp")]

    stomp_got: set[int] = set()

    class Listener(stomp.ConnectionListener):
        def on_message(self, f: Any) -> None:
            stomp_got.add(int(f.body[:8]))

    sc = stomp.Connection12([("127.0.0.1", gw.port("stomp"))], auto_decode=False)
    sc.set_listener("l", Listener())
    sc.connect(wait=True)
    sc.subscribe("/topic/flood.mem", id="1", ack="auto")
    amqp_got: set[int] = set()
    ac = connect(gw.port("amqp"), timeout=60)
    receiver = ac.create_receiver("topic://flood.mem", credit=CHUNK)
    done = threading.Event()

    def receive() -> None:
        while not done.is_set() and len(amqp_got) < N:
            m = receiver.receive(timeout=60)
            amqp_got.add(int(bytes(m.body)[:8]))
            receiver.accept()

    t = threading.Thread(target=receive, daemon=True)
    t.start()
    wait_for(lambda: gw.call(lambda: sum(1 for sub in gw.broker.all_subscriptions()
                                         if sub.pattern == "flood.mem")) == 4,
             what="the four subscriptions")
    before = gw.call(lambda: (gw.broker.stats["rejected"], gw.broker.stats["dropped"]))
    try:
        flood(gw.port("mqtt"), "flood/mem", 0, lambda: min(len(stomp_got), len(amqp_got)),
              lambda: None)  # QoS 0: NON_PERSISTENT
        assert stomp_got == set(range(N)) and amqp_got == set(range(N))
    finally:
        done.set()
        t.join(timeout=70)
        sc.disconnect()
        ac.close()
    after = gw.call(lambda: (gw.broker.stats["rejected"], gw.broker.stats["dropped"]))
    assert after[0] == before[0]  # the publisher was never refused
    total = 0
    for _flow, sub, conn_id in stuck:
        dropped = drops(gw, conn_id, "drop", "slow_consumer")
        assert dropped > 0
        assert gw.call(lambda sub=sub: sub.dropped) == dropped
        total += dropped
    assert after[1] - before[1] == total
    # The stuck STOMP client, reading again, gets every message that was not dropped, once.
    dropped = gw.call(lambda: stuck[0][1].dropped)
    got: list[int] = []
    buf = b""
    s.settimeout(30)
    while len(got) < N - dropped:
        frames, buf = read_stomp_frames(s, buf)
        for fr in frames:
            if fr.startswith(b"MESSAGE"):
                got.append(int(fr[fr.index(b"\n\n") + 2:][:8]))
    assert len(got) == len(set(got)) == N - dropped


def test_mqtt_subscribers_that_never_acknowledge_pay_first_when_memory_is_short(gw):
    """MQTT QoS 1 subscribers that read their socket but never acknowledge (an application
    hung with its network thread alive) are not slow at the socket: their in-flight windows
    fill and their session queues grow in the core, up to ``mqtt_max_queued_messages`` each
    -- together past ``max_msg_memory``. At the limit the core trims these laggards' backlogs
    (``slow_consumer``) instead of refusing the publisher, so the healthy subscriber on the
    same topic gets every message of the QoS 1 flood."""
    import threading

    hung: list[RawMqtt] = []
    for i in range(12):
        s = socket.socket()
        OPEN.append(s)
        s.connect(("127.0.0.1", gw.port("mqtt")))
        s.settimeout(10)
        hung.append(RawMqtt(s, f"hung{i}", 4, "flood/hung", 1))

    def discard(sock: socket.socket) -> None:  # read everything, acknowledge nothing
        try:
            while sock.recv(65536):
                pass
        except OSError:
            pass

    for h in hung:
        h.s.settimeout(None)
        threading.Thread(target=discard, args=(h.s,), daemon=True).start()
    healthy = Healthy(gw.port("mqtt"), "flood/hung", 1, 4)
    before = gw.call(lambda: (gw.broker.stats["rejected"], gw.broker.stats["dropped"]))
    try:
        flood(gw.port("mqtt"), "flood/hung", 1, lambda: len(healthy.got), lambda: None)
        assert healthy.got == set(range(N))
    finally:
        healthy.close()
    after = gw.call(lambda: (gw.broker.stats["rejected"], gw.broker.stats["dropped"]))
    assert after[0] == before[0]  # the publisher was never refused
    subs = gw.call(lambda: [sub for sub in gw.broker.all_subscriptions()
                            if sub.pattern == "flood.hung" and sub.client_id.startswith("hung")])
    assert len(subs) == 12
    total = sum(gw.call(lambda sub=sub: sub.dropped) for sub in subs)
    assert total > 0 and after[1] - before[1] == total
    assert gw.call(lambda: gw.broker.memory) <= 12 * 1024 * 1024
