"""Large retained sets against a live gateway: streamed to new subscriptions, not built whole.

How this works. A publisher on a raw socket pipelines thousands of retained PUBLISH packets
(pre-encoded, QoS 1, waiting only for the last PUBACK); a subscriber on another raw socket
subscribes to a wildcard and reads the retained messages with a small hand-written packet
reader (the gateway's codec would do, but is slow for tens of thousands of packets). Checks
are counts the client can make for itself: every retained topic arrives exactly once with
the retain flag ([MQTT-3.3.1-9]), and at QoS 1 the gateway never has more PUBLISH packets
unacknowledged than the client's Receive Maximum ([MQTT-3.3.4-9]): a client that has sent
``acked`` PUBACKs can have received at most ``acked + receive maximum`` PUBLISH packets.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gw import GatewayThread, wait_for
from mqttclient import frame, raw_connect, utf8, varint

NOTHING = 0.5  # seconds to wait for "nothing arrives"


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[GatewayThread]:
    g = GatewayThread(tmp_path / "gw").start()
    yield g
    g.stop()


class Reader:
    """A blocking socket and the MQTT packets read from it: (first byte, body)."""

    def __init__(self, port: int, *, rcvbuf: int = 0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:  # before connect, so the window is small from the start
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect(("127.0.0.1", port))
        self.sock.settimeout(10)
        self.buf = bytearray()

    def packets(self, timeout: float = 10.0) -> list[tuple[int, bytes]]:
        """The complete packets of the next read (empty when nothing came in ``timeout``)."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 20)
        except TimeoutError:
            return []
        assert data, "the gateway closed the connection"
        self.buf += data
        out = []
        buf = self.buf
        pos = 0
        while True:
            if len(buf) - pos < 2:
                break
            n = mult = 0
            i = pos + 1
            while i < len(buf):
                b = buf[i]
                n |= (b & 0x7F) << mult
                mult += 7
                i += 1
                if not b & 0x80:
                    break
            else:
                break
            if len(buf) < i + n:
                break
            out.append((buf[pos], bytes(buf[i:i + n])))
            pos = i + n
        del buf[:pos]
        return out

    def expect(self, first: int) -> bytes:
        """The body of the next packet, which must have first byte ``first``."""
        got = self.packets()
        assert got and got[0][0] == first, f"expected 0x{first:02x}, got {got[:3]}"
        return got[0][1]


def publish_retained(port: int, count: int, payload_size: int = 32, *, prefix: str = "ret",
                     extra: list[bytes] | None = None) -> None:
    """Retain ``count`` messages on ``prefix/0`` … at QoS 1 (payload: the topic, padded)."""
    pub = Reader(port)
    pub.sock.sendall(raw_connect("retained-publisher"))
    assert pub.expect(0x20) == b"\x00\x00"
    packets = [frame(0x33, utf8(f"{prefix}/{i}") + (i % 65535 + 1).to_bytes(2, "big")
                     + f"{prefix}/{i}".encode().ljust(payload_size, b"."))
               for i in range(count)]
    pub.sock.sendall(b"".join(packets + (extra or [])))
    acks = 0
    want = count + len(extra or [])
    while acks < want:
        got = pub.packets()
        assert got, f"only {acks} of {want} PUBACKs"
        acks += sum(1 for first, _ in got if first == 0x40)
    pub.sock.close()


def subscribe_v5(port: int, client_id: str, flt: str, qos: int, receive_maximum: int,
                 rcvbuf: int = 0) -> Reader:
    sub = Reader(port, rcvbuf=rcvbuf)
    props = b"\x21" + receive_maximum.to_bytes(2, "big")  # Receive Maximum (MQTT 5 3.1.2.11.3)
    sub.sock.sendall(raw_connect(client_id, level=5, props=varint(len(props)) + props))
    assert sub.expect(0x20)[:2] == b"\x00\x00"
    sub.sock.sendall(frame(0x82, b"\x00\x01\x00" + utf8(flt) + bytes([qos])))
    return sub


def parse_publish_v5(first: int, body: bytes) -> tuple[str, int | None, bytes]:
    """(topic, packet id or None, payload) of an MQTT 5 PUBLISH body."""
    n = int.from_bytes(body[:2], "big")
    topic = body[2:2 + n].decode()
    pos = 2 + n
    pid = None
    if first & 0x06:
        pid = int.from_bytes(body[pos:pos + 2], "big")
        pos += 2
    plen = mult = 0
    while True:  # the properties' length
        b = body[pos]
        pos += 1
        plen |= (b & 0x7F) << mult
        mult += 7
        if not b & 0x80:
            break
    return topic, pid, body[pos + plen:]


def test_20000_retained_reach_a_wildcard_subscriber_within_its_receive_maximum(
        gw: GatewayThread) -> None:
    """A ``ret/#`` subscriber with Receive Maximum 10 at QoS 1 gets each of 20,000 retained
    messages once, retain flag set ([MQTT-3.3.1-9]), and never more than 10 unacknowledged
    ([MQTT-3.3.4-9]). It acknowledges only when it holds 10, so any PUBLISH beyond the window
    would arrive while it waits."""
    count, window = 20_000, 10
    port = gw.port("mqtt")
    publish_retained(port, count)
    sub = subscribe_v5(port, "fleet-sub", "ret/#", 1, window)
    seen: set[str] = set()
    received = acked = 0
    unacked: list[int] = []
    suback = False
    while received < count:
        got = sub.packets()
        assert got, f"stalled after {received} of {count} retained messages"
        for first, body in got:
            if first == 0x90:
                assert body[:2] == b"\x00\x01" and body[-1] == 1  # granted QoS 1
                suback = True
                continue
            assert first & 0xF0 == 0x30, f"unexpected packet 0x{first:02x}"
            assert first & 0x01, "retained message without the retain flag"
            topic, pid, payload = parse_publish_v5(first, body)
            assert pid is not None and first & 0x06 == 0x02
            assert payload.rstrip(b".") == topic.encode()
            assert topic not in seen, f"{topic} sent twice"
            seen.add(topic)
            received += 1
            unacked.append(pid)
            assert received <= acked + window, (
                f"{received} PUBLISH received with only {acked} PUBACKs sent "
                f"(Receive Maximum {window})")
        if len(unacked) >= window or received == count:
            sub.sock.sendall(b"".join(b"\x40\x02" + p.to_bytes(2, "big") for p in unacked))
            acked += len(unacked)
            unacked = []
    assert suback
    assert seen == {f"ret/{i}" for i in range(count)}
    assert sub.packets(NOTHING) == []  # and nothing again
    sub.sock.close()


def test_retained_stream_to_a_client_that_does_not_read_stops_at_the_write_buffer(
        gw: GatewayThread) -> None:
    """QoS 0: 20,000 retained messages of 1 KB (20 MB) to a subscriber that reads nothing.
    The gateway sends them as the socket takes them: while the client does not read, what
    it has taken from the retained set stays within the socket buffers and the write buffer
    (a few MB), not the whole set; once the client reads, all arrive, once each."""
    count, size = 20_000, 1024
    port = gw.port("mqtt")
    publish_retained(port, count, size)
    sub = subscribe_v5(port, "stuck-sub", "ret/#", 0, 65535, rcvbuf=64 * 1024)
    server = gw.broker.adapter_servers["mqtt"]

    def taken() -> int:
        """How many retained names the subscriber's stream has passed (-1: finished)."""
        def count_taken() -> int:
            session = server.sessions["stuck-sub"]
            if not session.retained:
                return -1
            stream = session.retained[0][0]
            return sum(1 for name in server.retained._sorted if name <= stream.cursor)
        return int(gw.call(count_taken))

    wait_for(lambda: gw.call(lambda: server.sessions["stuck-sub"].paused), 20,
             "the subscriber's session paused by its full write buffer")
    time.sleep(NOTHING)  # nothing more is taken while the client reads nothing
    first = taken()
    assert 0 <= first < count // 2, f"{first} of {count} retained messages taken at once"
    time.sleep(NOTHING)
    assert taken() == first
    seen: set[str] = set()
    while len(seen) < count:
        got = sub.packets()
        assert got, f"stalled after {len(seen)} of {count}"
        for first_byte, body in got:
            if first_byte == 0x90:
                continue
            topic, pid, payload = parse_publish_v5(first_byte, body)
            assert pid is None and first_byte & 0x01
            assert topic not in seen, f"{topic} sent twice"
            seen.add(topic)
    assert sub.packets(NOTHING) == []
    sub.sock.close()


def test_retained_set_after_a_restart_streams_with_clears_and_parent_match(
        tmp_path: Path) -> None:
    """5,000 retained messages survive a restart; one cleared by an empty retained PUBLISH
    stays cleared ([MQTT-3.3.1-10]); ``ret/#`` also matches ``ret`` itself (MQTT 5 4.7.1.2);
    a topic filter without wildcards gets its one retained message; the subscriber's Receive
    Maximum of 100 holds after the restart as before it ([MQTT-3.3.4-9])."""
    count = 5_000
    g = GatewayThread(tmp_path / "gw").start()
    try:
        clear = frame(0x33, utf8("ret/7") + b"\xff\xf0")  # empty payload: clears ret/7
        parent = frame(0x33, utf8("ret") + b"\xff\xf1" + b"parent")
        publish_retained(g.port("mqtt"), count, extra=[clear, parent])
        g.restart()
        port = g.port("mqtt")
        sub = subscribe_v5(port, "after-restart", "ret/#", 1, 100)
        seen: list[str] = []
        acked = 0
        while len(seen) < count:
            got = sub.packets()
            assert got, f"stalled after {len(seen)} of {count}"
            acks = []
            for first, body in got:
                if first == 0x90:
                    continue
                topic, pid, payload = parse_publish_v5(first, body)
                assert first & 0x01 and pid is not None
                seen.append(topic)
                assert len(seen) <= acked + 100  # [MQTT-3.3.4-9]
                acks.append(b"\x40\x02" + pid.to_bytes(2, "big"))
            sub.sock.sendall(b"".join(acks))
            acked += len(acks)
        assert sorted(seen) == sorted(["ret"] + [f"ret/{i}" for i in range(count) if i != 7])
        assert sub.packets(NOTHING) == []
        one = subscribe_v5(port, "one-topic", "ret/42", 0, 10)
        got = one.packets()
        if len(got) < 2:
            got += one.packets()
        assert [p[0] for p in got] == [0x90, 0x31]
        assert parse_publish_v5(*got[1])[0] == "ret/42"
        for s in (sub, one):
            s.sock.close()
    finally:
        g.stop()


def test_the_server_view_counts_retained_messages_and_their_bytes(gw: GatewayThread) -> None:
    """Retained messages live outside max_msg_memory; the server view says how many there
    are and what they hold."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="retinfo")
    c.connect("127.0.0.1", gw.port("mqtt"))
    c.loop_start()
    try:
        for i in range(3):
            c.publish(f"retinfo/{i}", b"v" * 1000, qos=1, retain=True).wait_for_publish(10)
        info = gw.call(gw.broker.info)
        assert info["mqtt_retained"] == 3 and 3000 < info["mqtt_retained_bytes"] < 6000
        c.publish("retinfo/0", b"", qos=1, retain=True).wait_for_publish(10)  # clears it
        after = gw.call(gw.broker.info)
        assert after["mqtt_retained"] == 2
        assert after["mqtt_retained_bytes"] == info["mqtt_retained_bytes"] * 2 // 3
    finally:
        c.loop_stop()
        c.disconnect()
