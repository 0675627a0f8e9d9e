"""Clients for the interoperability scenarios (test_mqtt5_interop_scenarios.py).

How this works. :class:`Peer` is a paho-mqtt 2 client (MQTT 5 or 3.1.1) run by its network
thread, with queues of what it received, so a test reads messages, CONNACK, SUBACK and
DISCONNECT results in order with timeouts. :class:`RawPeer` is a blocking socket that builds
and reads packets byte by byte, for a client that must *not* answer (a paused receiver, a
publisher that never sends PUBREL) or must send what paho refuses to encode (a Topic Alias of
0, an invalid filter). Neither uses the gateway's own codec, so both are independent of it.
"""

from __future__ import annotations

import queue
import socket
import struct
import time
from typing import Any

import paho.mqtt.client as mqtt
from gw import wait_for
from mqttclient import frame, utf8, varint
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

V311, V5 = mqtt.MQTTv311, mqtt.MQTTv5
NOTHING = 0.5  # seconds to wait for "nothing arrives"
WAIT = 10.0  # seconds to wait for something that must arrive


def props(packet_type: int, **values: Any) -> Properties:
    """paho Properties for one packet type, e.g. ``props(PacketTypes.CONNECT,
    SessionExpiryInterval=5)``; ``UserProperty`` takes a list of pairs."""
    p = Properties(packet_type)
    for name, value in values.items():
        setattr(p, name, value)
    return p


def prop(msg: mqtt.MQTTMessage, name: str) -> Any:
    """A property of a received message, ``None`` when absent."""
    return getattr(msg.properties, name, None) if msg.properties is not None else None


class Peer:
    """A paho-mqtt client run by its network thread, with queues of what it received."""

    def __init__(self, port: int, cid: str, proto: int = V5, *, clean: bool = True,
                 connect: Properties | None = None, will: tuple[Any, ...] | None = None,
                 will_props: Properties | None = None, keepalive: int = 60,
                 expect_refusal: bool = False) -> None:
        kw: dict[str, Any] = {"clean_session": clean} if proto != V5 else {}
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=cid, protocol=proto,
                             reconnect_on_failure=False, **kw)
        self.proto = proto
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.disconnects: queue.Queue[Any] = queue.Queue()
        self.connacks: queue.Queue[tuple[Any, Any, Any]] = queue.Queue()
        self.acks: queue.Queue[tuple[int, Any]] = queue.Queue()
        self.c.on_message = lambda c, u, m: self.messages.put(m)
        self.c.on_connect = lambda c, u, f, rc, p=None: self.connacks.put((f, rc, p))
        self.c.on_disconnect = lambda c, u, f, rc, p=None: self.disconnects.put(rc)
        self.c.on_subscribe = lambda c, u, mid, rcs, p=None: self.acks.put((mid, rcs))
        self.c.on_unsubscribe = lambda c, u, mid, rcs, p=None: self.acks.put((mid, rcs))
        if will is not None:
            self.c.will_set(*will, properties=will_props)
        if proto == V5:
            self.c.connect("127.0.0.1", port, keepalive, clean_start=clean, properties=connect)
        else:
            self.c.connect("127.0.0.1", port, keepalive)
        self.c.loop_start()
        try:
            flags, rc, p = self.connacks.get(timeout=WAIT)
            if not expect_refusal:
                assert not rc.is_failure, f"CONNACK refused: {rc}"
        except BaseException:  # no test gets this Peer to stop: stop it here
            self.c.loop_stop()
            self.release()
            raise
        self.session_present = bool(flags.session_present)
        self.rc = rc
        self.connack = p

    def connack_prop(self, name: str) -> Any:
        return getattr(self.connack, name, None) if self.connack is not None else None

    def sub(self, *filters: tuple[str, int | SubscribeOptions],
            sub_props: Properties | None = None) -> list[int]:
        """SUBSCRIBE and wait for the SUBACK: its reason codes (3.1.1: return codes)."""
        topics = [(t, o if isinstance(o, SubscribeOptions) else
                   (SubscribeOptions(qos=o) if self.proto == V5 else o)) for t, o in filters]
        rc, mid = self.c.subscribe(topics, properties=sub_props)
        assert rc == mqtt.MQTT_ERR_SUCCESS, rc
        got_mid, rcs = self.acks.get(timeout=WAIT)
        assert got_mid == mid
        return [r.value for r in rcs]

    def unsub(self, *filters: str) -> list[int]:
        rc, mid = self.c.unsubscribe(list(filters))
        assert rc == mqtt.MQTT_ERR_SUCCESS, rc
        got_mid, rcs = self.acks.get(timeout=WAIT)
        assert got_mid == mid
        return [r.value for r in rcs] if isinstance(rcs, list) else []

    def pub(self, topic: str, payload: bytes | str, qos: int = 1, retain: bool = False,
            pub_props: Properties | None = None) -> None:
        info = self.c.publish(topic, payload, qos=qos, retain=retain, properties=pub_props)
        info.wait_for_publish(WAIT)
        assert info.is_published(), f"publish to {topic!r} not completed"

    def get(self, timeout: float = WAIT) -> mqtt.MQTTMessage:
        return self.messages.get(timeout=timeout)

    def take(self, n: int, timeout: float = WAIT) -> list[mqtt.MQTTMessage]:
        return [self.get(timeout) for _ in range(n)]

    def none(self, timeout: float = NOTHING) -> bool:
        try:
            m = self.messages.get(timeout=timeout)
        except queue.Empty:
            return True
        raise AssertionError(f"unexpected message on {m.topic!r}: {m.payload!r}")

    def close(self, disconnect_props: Properties | None = None) -> None:
        if self.c.is_connected():
            self.c.disconnect(properties=disconnect_props)
            wait_for(lambda: not self.disconnects.empty(), WAIT, "disconnect")
        self.c.loop_stop()
        self.release()

    def release(self) -> None:
        """Close the client's sockets, the pair its network thread is woken with among them,
        once that thread has stopped. paho closes that pair only in ``reinitialise()`` or
        when the client is deleted; the callbacks above make the client and this Peer a
        reference cycle, so without this the pair stays open until a garbage collection
        finds the cycle, and in such a collection the sockets may be finalized before the
        client: a ResourceWarning (an error under pytest) at an unpredictable moment, often
        the end of the session."""
        self.c.reinitialise()

    def kill(self) -> None:
        """Drop the TCP connection without DISCONNECT (an abnormal disconnect)."""
        self.c.loop_stop()
        sock = self.c.socket()
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class RawPeer:
    """An MQTT connection written and read byte by byte: a client that sends exactly what
    a test says, and answers nothing on its own."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        self.buf = b""
        self.eof = False  # the server closed: what it sent before stays readable

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, n: int, deadline: float) -> bool:
        while len(self.buf) < n:
            if self.eof:
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                return False
            if not chunk:
                raise EOFError("server closed the connection")
            self.buf += chunk
        return True

    def packet(self, timeout: float = WAIT) -> tuple[int, bytes] | None:
        """The next packet as (first byte, body), or None if nothing came in time."""
        deadline = time.monotonic() + timeout
        if not self._fill(2, deadline):
            return None
        length, mult, i = 0, 1, 1
        while True:
            if not self._fill(i + 1, deadline):
                return None
            b = self.buf[i]
            length += (b & 0x7F) * mult
            mult *= 128
            i += 1
            if not b & 0x80:
                break
        if not self._fill(i + length, deadline):
            return None
        first, body = self.buf[0], self.buf[i:i + length]
        self.buf = self.buf[i + length:]
        return first, body

    def expect(self, packet_type: int, timeout: float = WAIT) -> tuple[int, bytes]:
        got = self.packet(timeout)
        assert got is not None, f"no packet of type {packet_type} within {timeout} s"
        assert got[0] >> 4 == packet_type, f"expected type {packet_type}, got {got[0]:#04x}"
        return got

    def expect_any(self, timeout: float = WAIT) -> tuple[int, bytes]:
        got = self.packet(timeout)
        assert got is not None, f"no packet within {timeout} s"
        return got

    def connect(self, cid: str, level: int = 5, *, clean: bool = True, keepalive: int = 0,
                props: bytes = b"", will: tuple[str, bytes, int] | None = None
                ) -> tuple[bool, int]:
        """CONNECT and read the CONNACK: (session present, reason / return code).
        ``will``: (topic, payload, QoS), with no will properties."""
        flags = 0x02 if clean else 0x00
        payload = utf8(cid)
        if will is not None:
            flags |= 0x04 | will[2] << 3
            payload += (b"\x00" if level >= 5 else b"") + utf8(will[0]) + utf8(will[1])
        body = utf8("MQTT") + bytes([level, flags]) + struct.pack(">H", keepalive)
        if level >= 5:
            body += varint(len(props)) + props
        self.send(frame(0x10, body + payload))
        _, ack = self.expect(2)
        return bool(ack[0] & 1), ack[1]

    def subscribe(self, pid: int, flt: str, options: int, level: int = 5) -> bytes:
        body = struct.pack(">H", pid) + (b"\x00" if level >= 5 else b"")
        self.send(frame(0x82, body + utf8(flt) + bytes([options])))
        _, ack = self.expect(9)
        return ack

    def publish(self, topic: str, payload: bytes, qos: int, pid: int = 0, level: int = 5,
                props: bytes = b"", dup: bool = False) -> None:
        body = utf8(topic) + (struct.pack(">H", pid) if qos else b"")
        if level >= 5:
            body += varint(len(props)) + props
        self.send(frame(0x30 | (0x08 if dup else 0) | qos << 1, body + payload))

    def ack(self, packet_type: int, pid: int) -> None:
        """PUBACK (4), PUBREC (5), PUBREL (6, flags 0010) or PUBCOMP (7) for ``pid``."""
        first = packet_type << 4 | (0x02 if packet_type == 6 else 0)
        self.send(bytes([first, 2]) + struct.pack(">H", pid))

    def closed(self, timeout: float = WAIT) -> bool:
        """Whether the server closes the connection within ``timeout`` (what it sent
        before closing stays readable with :meth:`packet`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                return False
            except ConnectionResetError:
                self.eof = True
                return True
            if not chunk:
                self.eof = True
                return True
            self.buf += chunk
        return False

    def close(self) -> None:
        self.sock.close()


def parse_publish(first: int, body: bytes, level: int = 5) -> dict[str, Any]:
    """The fields of a PUBLISH read by :class:`RawPeer` (properties left as bytes)."""
    qos = (first >> 1) & 3
    n = struct.unpack_from(">H", body)[0]
    topic = body[2:2 + n].decode()
    i = 2 + n
    pid = None
    if qos:
        pid = struct.unpack_from(">H", body, i)[0]
        i += 2
    raw_props = b""
    if level >= 5:
        plen, mult = 0, 1
        while True:
            b = body[i]
            i += 1
            plen += (b & 0x7F) * mult
            mult *= 128
            if not b & 0x80:
                break
        raw_props = body[i:i + plen]
        i += plen
    return {"topic": topic, "qos": qos, "dup": bool(first & 0x08), "retain": bool(first & 1),
            "pid": pid, "props": raw_props, "payload": body[i:]}


def session_expiry(seconds: int) -> bytes:
    return b"\x11" + struct.pack(">I", seconds)


def receive_maximum(n: int) -> bytes:
    return b"\x21" + struct.pack(">H", n)


def topic_alias(n: int) -> bytes:
    return b"\x23" + struct.pack(">H", n)


def alias_props(raw: bytes) -> int | None:
    """The Topic Alias among a PUBLISH's raw properties (None: none)."""
    i = 0
    sizes = {0x01: 1, 0x02: 4, 0x23: 2}
    while i < len(raw):
        pid = raw[i]
        i += 1
        if pid == 0x23:
            return int(struct.unpack_from(">H", raw, i)[0])
        if pid in sizes:
            i += sizes[pid]
        elif pid == 0x0B:  # Subscription Identifier: a Variable Byte Integer
            while raw[i] & 0x80:
                i += 1
            i += 1
        elif pid in (0x03, 0x08, 0x09):  # strings and binary data: two-byte length
            i += 2 + int(struct.unpack_from(">H", raw, i)[0])
        elif pid == 0x26:  # User Property: two strings
            for _ in range(2):
                i += 2 + int(struct.unpack_from(">H", raw, i)[0])
        else:
            raise AssertionError(f"unexpected property {pid:#04x} in {raw.hex()}")
    return None
