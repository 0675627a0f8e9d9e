"""A tiny raw-socket MQTT client for black-box conformance tests.

How this works. :class:`RawClient` owns one blocking TCP socket to the gateway on loopback
and the CLIENT side of the gateway's own sans-I/O codec (:class:`MqttCodec`). Packets are
sent through the codec (which refuses to encode what MQTT forbids), or as raw bytes when a
test must break the protocol on purpose (:meth:`RawClient.send_raw`). Everything the server
writes is kept verbatim in :attr:`RawClient.raw_in`, so a test can check bytes as well as
parsed packets, and is fed to the codec, whose strict parser doubles as a check that the
server's own packets are well formed (a bad packet from the server raises
``MqttRemoteProtocolError`` in the test).

Reads take a timeout: :meth:`recv` returns the next packet, ``None`` if nothing came in
time; :meth:`wait_closed` says whether the server closed the connection (EOF or reset)
within a deadline. Nothing here is asynchronous; tests use a few clients side by side.
"""

from __future__ import annotations

import socket
import time
from collections import deque
from typing import Any, TypeVar

from adapters.mqtt.codec import MqttCodec, Side
from adapters.mqtt.packets import (
    PROTOCOL_NAMES,
    ConnAck,
    Connect,
    Disconnect,
    MqttRemoteProtocolError,
    Packet,
    Publish,
    SubAck,
    Subscribe,
    SubscriptionOptions,
    UnsubAck,
    Unsubscribe,
    Will,
)

P = TypeVar("P")

# Large enough for any packet a test provokes; the codec's default (1 MiB) would refuse
# nothing a test sends, but oversize checks use the server's limit, not ours.
CLIENT_MAX_PACKET = 64 * 1024 * 1024


class ServerClosed(Exception):
    """The server closed the connection while a packet was expected."""


class RawClient:
    """One MQTT connection driven by hand; see the module docstring."""

    def __init__(self, port: int, *, timeout: float = 2.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.codec = MqttCodec(Side.CLIENT, max_packet_size=CLIENT_MAX_PACKET)
        self.raw_in = bytearray()
        self.packets: deque[Packet] = deque()
        self.closed = False
        self.connack: ConnAck | None = None
        self.error: MqttRemoteProtocolError | None = None  # what the codec refused, if anything
        self._next_pid = 1

    # -- sending ----------------------------------------------------------------------------

    def send(self, packet: Packet) -> None:
        self.codec.send(packet)
        self.sock.sendall(self.codec.data_to_send())

    def send_raw(self, data: bytes) -> None:
        """Write bytes unchecked (the codec never sees them)."""
        self.sock.sendall(data)

    def set_level(self, level: int) -> None:
        """Tell the codec the protocol level of a CONNECT that was sent raw."""
        self.codec.protocol_level = level

    def pid(self) -> int:
        pid = self._next_pid
        self._next_pid = pid % 65535 + 1
        return pid

    def connect(self, client_id: str, level: int = 4, *, clean: bool = True,
                keepalive: int = 0, will: Will | None = None, username: str | None = None,
                password: bytes | None = None, properties: dict[str, Any] | None = None,
                expect_success: bool = True) -> ConnAck:
        """Send CONNECT and return the CONNACK (asserting success unless told otherwise)."""
        self.send(Connect(PROTOCOL_NAMES[level], level, clean, keepalive, client_id, will,
                          username, password, properties or {}))
        ack = self.expect(ConnAck)
        self.connack = ack
        if expect_success:
            assert ack.reason_code == 0, f"CONNACK refused: {ack!r}"
        return ack

    def publish(self, topic: str, payload: bytes = b"", qos: int = 0, *, retain: bool = False,
                dup: bool = False, packet_id: int | None = None,
                properties: dict[str, Any] | None = None) -> int | None:
        if qos and packet_id is None:
            packet_id = self.pid()
        self.send(Publish(topic, payload, qos, retain, dup, packet_id if qos else None,
                          properties or {}))
        return packet_id

    def subscribe(self, *filters: tuple[str, int], properties: dict[str, Any] | None = None,
                  options: SubscriptionOptions | None = None) -> SubAck:
        """SUBSCRIBE and wait for its SUBACK (same packet id, [MQTT-3.8.4-2])."""
        pid = self.pid()
        subs = [(f, options if options is not None else SubscriptionOptions(q))
                for f, q in filters]
        self.send(Subscribe(pid, subs, properties or {}))
        ack = self.expect(SubAck)
        assert ack.packet_id == pid
        return ack

    def unsubscribe(self, *filters: str) -> UnsubAck:
        pid = self.pid()
        self.send(Unsubscribe(pid, list(filters)))
        ack = self.expect(UnsubAck)
        assert ack.packet_id == pid
        return ack

    # -- receiving --------------------------------------------------------------------------

    def _read(self, deadline: float) -> bool:
        """Read once before ``deadline``; False on timeout. Marks EOF/reset as closed."""
        if self.closed:
            return False
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(1 << 16)
        except TimeoutError:
            return False
        except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError):
            data = b""
        if not data:
            self.closed = True
            return False
        self.raw_in += data
        if self.error is None:
            self.codec.receive_data(data)
            try:
                self.packets.extend(self.codec.events_received())
            except MqttRemoteProtocolError as exc:  # the server broke MQTT: keep the evidence
                self.packets.extend(exc.events)
                self.error = exc
        return True

    def recv(self, timeout: float | None = None) -> Packet | None:
        """The next packet, or None if none came within ``timeout`` (or the server closed)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self.packets and self.error is None:
            if not self._read(deadline):
                break
        if self.packets:
            return self.packets.popleft()
        if self.error is not None:
            raise AssertionError(f"the server sent bytes MQTT does not allow ({self.error}): "
                                 f"{bytes(self.raw_in).hex()}")
        return None

    def expect(self, cls: type[P], timeout: float | None = None) -> P:
        """The next packet, which must be a ``cls``."""
        p = self.recv(timeout)
        if p is None:
            if self.closed:
                raise ServerClosed(f"server closed the connection; expected {cls.__name__}; "
                                   f"bytes received: {bytes(self.raw_in).hex()}")
            raise AssertionError(f"no {cls.__name__} within the timeout")
        assert isinstance(p, cls), f"expected {cls.__name__}, got {p!r}"
        return p

    def nothing(self, timeout: float = 0.5) -> bool:
        """True if no packet arrives within ``timeout`` (a closed connection counts too)."""
        p = self.recv(timeout)
        if p is not None:
            self.packets.appendleft(p)
            return False
        return True

    def drain(self, timeout: float = 0.3) -> list[Packet]:
        """Every packet that arrives until ``timeout`` passes without one."""
        out = []
        while (p := self.recv(timeout)) is not None:
            out.append(p)
        return out

    def wait_closed(self, timeout: float = 2.0) -> bool:
        """Whether the server closes the connection within ``timeout``; packets that arrive
        meanwhile are kept (see :attr:`packets` and :attr:`raw_in`)."""
        deadline = time.monotonic() + timeout
        while not self.closed and time.monotonic() < deadline:
            self._read(deadline)
        return self.closed

    def expect_disconnect(self, reasons: set[int]) -> Disconnect:
        """An MQTT 5 DISCONNECT with one of ``reasons``, then the close and nothing after it
        ([MQTT-4.13.2-1], [MQTT-3.14.4-1])."""
        d = self.expect(Disconnect)
        assert d.reason_code in reasons, f"DISCONNECT {d.reason_code:#04x}, want {reasons}"
        assert self.wait_closed(), "the server did not close after its DISCONNECT"
        assert not self.packets, f"packets after the DISCONNECT: {list(self.packets)}"
        return d

    def after_connack(self) -> bytes:
        """The bytes the server sent after its CONNACK (the first packet received)."""
        raw = bytes(self.raw_in)
        n, length, shift = 1, 0, 0
        while True:
            b = raw[n]
            length |= (b & 0x7F) << shift
            n, shift = n + 1, shift + 7
            if b < 0x80:
                return raw[n + length:]

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def varint(n: int) -> bytes:
    """MQTT Variable Byte Integer (MQTT 5.0 1.5.5; 3.1.1 2.2.3)."""
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def utf8(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return len(b).to_bytes(2, "big") + b


def frame(first: int, body: bytes) -> bytes:
    return bytes([first]) + varint(len(body)) + body


def raw_connect(client_id: str = "raw", *, level: int = 4, name: str = "MQTT", flags: int = 0x02,
                keepalive: int = 0, props: bytes = b"\x00") -> bytes:
    """A CONNECT built byte by byte, so tests can set what the codec would refuse."""
    body = utf8(name) + bytes([level, flags]) + keepalive.to_bytes(2, "big")
    if level >= 5:
        body += props
    body += utf8(client_id)
    return frame(0x10, body)


def raw_publish(topic: bytes, payload: bytes, first: int, level: int,
                packet_id: bytes = b"") -> bytes:
    """A PUBLISH built by hand (any first byte, any topic bytes) in ``level``'s format."""
    props = b"\x00" if level >= 5 else b""
    return frame(first, utf8(topic) + packet_id + props + payload)
