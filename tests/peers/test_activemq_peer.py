"""The private ActiveMQ peer (tests/peers/activemq.py) does what the interop tests and the STOMP
benchmark rely on: one broker, started once for this module, stays on loopback and carries
raw STOMP 1.2 round trips through a queue (stored until a subscriber comes, prefetch and
client-individual acks honoured) and a topic (a copy to every subscriber, nothing kept), with
the ActiveMQ behaviour activemq.py's docstring describes. A second, persistent broker shows
that a ``persistent:true`` message outlives a restart (the durable path of the benchmark)."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import peers.activemq as activemq_peer
import pytest
from peers.activemq import START_TIMEOUT, ActiveMQ, listening_sockets, start_activemq
from peers.mosquitto import PeerMissing

HOST = "127.0.0.1"

# The module-scoped fixture (pytest registers it under this attribute's name).
activemq = activemq_peer.activemq


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# STOMP 1.2 "Value Encoding": how header values are escaped in every frame but CONNECT(ED).
UNESCAPE = {b"\\\\": b"\\", b"\\c": b":", b"\\n": b"\n", b"\\r": b"\r"}


def unescape(value: bytes) -> str:
    out, i = b"", 0
    while i < len(value):
        pair = value[i : i + 2]
        if pair in UNESCAPE:
            out += UNESCAPE[pair]
            i += 2
        else:
            out += value[i : i + 1]
            i += 1
    return out.decode()


class Frame:
    def __init__(self, command: str, headers: dict[str, str], raw_headers: dict[str, bytes],
                 body: bytes) -> None:
        self.command = command
        self.headers = headers
        self.raw_headers = raw_headers  # as sent (escaped), e.g. to echo an ack id back
        self.body = body

    def __repr__(self) -> str:
        return f"<{self.command} {self.headers} {self.body[:100]!r}>"


class Stomp:
    """A blocking raw-socket STOMP 1.2 client: frames written by hand, frames read by the
    spec's rules (EOLs between frames skipped, the body up to content-length or the NUL)."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.buf = b""
        self.send(b"CONNECT\naccept-version:1.2\nhost:localhost\nheart-beat:0,0\n\n\x00")
        connected = self.read()
        assert connected.command == "CONNECTED", connected
        assert connected.headers["version"] == "1.2"
        self.server = connected.headers.get("server", "")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed; unread {self.buf[:200]!r}")
        self.buf += chunk

    def read(self, timeout: float = 10.0) -> Frame:
        self.sock.settimeout(timeout)
        while True:
            self.buf = self.buf.lstrip(b"\r\n")
            end = self.buf.find(b"\n\n")
            if end >= 0:
                break
            self._fill()
        lines = self.buf[:end].split(b"\n")
        command = lines[0].rstrip(b"\r").decode()
        raw: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, _, value = line.rstrip(b"\r").partition(b":")
            raw.setdefault(name, value)  # the first of repeated headers counts (STOMP 1.2)
        start = end + 2
        if b"content-length" in raw:
            stop = start + int(raw[b"content-length"])
            while len(self.buf) < stop + 1:
                self._fill()
            assert self.buf[stop : stop + 1] == b"\x00", self.buf[:stop + 1]
        else:
            while (stop := self.buf.find(b"\x00", start)) < 0:
                self._fill()
        body = self.buf[start:stop]
        self.buf = self.buf[stop + 1 :]
        decode = unescape if command not in ("CONNECTED",) else bytes.decode
        headers = {unescape(k): decode(v) for k, v in raw.items()}
        return Frame(command, headers, {k.decode(): v for k, v in raw.items()}, body)

    def nothing_within(self, seconds: float) -> bool:
        """True when no frame arrives within ``seconds``."""
        try:
            frame = self.read(timeout=seconds)
        except TimeoutError:
            return True
        raise AssertionError(f"unexpected {frame}")

    def subscribe(self, destination: str, sub_id: str, ack: str = "auto", **extra: str) -> None:
        headers = "".join(f"{k.replace('_', '.')}:{v}\n" for k, v in extra.items())
        self.send(
            f"SUBSCRIBE\nid:{sub_id}\ndestination:{destination}\nack:{ack}\n{headers}"
            f"receipt:sub-{sub_id}\n\n\x00".encode()
        )
        receipt = self.read()
        assert (receipt.command, receipt.headers.get("receipt-id")) == (
            "RECEIPT",
            f"sub-{sub_id}",
        ), receipt

    def close(self) -> None:
        try:
            self.send(b"DISCONNECT\nreceipt:bye\n\n\x00")
            bye = self.read()
            assert bye.headers.get("receipt-id") == "bye", bye
        finally:
            self.sock.close()


def send_frame(destination: str, body: bytes, **extra: str) -> bytes:
    headers = "".join(f"{k.replace('_', '-')}:{v}\n" for k, v in extra.items())
    return (
        f"SEND\ndestination:{destination}\ncontent-length:{len(body)}\n{headers}\n".encode()
        + body
        + b"\x00"
    )


# --- the broker ------------------------------------------------------------------------------


def test_broker_started_privately_and_listens_only_on_loopback(activemq: ActiveMQ) -> None:
    assert 0 < activemq.startup_seconds < START_TIMEOUT
    # The STOMP connector, nothing else: no OpenWire, no JMX/RMI, no web console.
    assert listening_sockets(activemq.pid) == {(HOST, activemq.stomp_port)}
    cmdline = Path(f"/proc/{activemq.pid}/cmdline").read_bytes().split(b"\x00")
    assert f"-Dactivemq.base={activemq.workdir}".encode() in cmdline
    assert b"-Xmx512m" in cmdline
    log = activemq.log_path.read_text()
    assert f"Listening for connections at: stomp+nio://localhost:{activemq.stomp_port}" in log
    assert "Using Persistence Adapter: MemoryPersistenceAdapter" in log
    client = Stomp(activemq.stomp_port)
    assert client.server.startswith("ActiveMQ/5.")
    client.close()


def test_missing_activemq_names_the_install_script(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    monkeypatch.setattr(activemq_peer, "RUN_JAR", tmp_path / "no-such.jar")
    with pytest.raises(PeerMissing, match=r"tests/peers/install\.sh"):
        activemq_peer.activemq_argv(tmp_path)


# --- queues ----------------------------------------------------------------------------------


def test_queue_round_trip_with_prefetch_and_client_individual_acks(activemq: ActiveMQ) -> None:
    queue = f"/queue/{unique('q')}"
    consumer, producer = Stomp(activemq.stomp_port), Stomp(activemq.stomp_port)
    try:
        consumer.subscribe(queue, "s1", ack="client-individual", activemq_prefetchSize="1")
        body = b"bin\x00ary\xff"  # a NUL inside: only content-length can frame it
        producer.send(
            send_frame(queue, body, x_note="a\\cb", persistent="false")  # a:b, escaped
            + send_frame(queue, b"second", persistent="true", receipt="sent")
        )
        assert producer.read().headers["receipt-id"] == "sent"

        # ActiveMQ's queue keeps persistent and non-persistent messages in two cursors, so
        # their order between the two kinds is not kept: take them as they come.
        first = consumer.read()
        assert first.command == "MESSAGE", first
        assert first.headers["ack"]  # STOMP 1.2: present in client-individual mode
        # Prefetch 1: the other waits until this one is acked.
        assert consumer.nothing_within(0.5)
        consumer.send(b"ACK\nid:" + first.raw_headers["ack"] + b"\n\n\x00")
        second = consumer.read()
        consumer.send(b"ACK\nid:" + second.raw_headers["ack"] + b"\n\n\x00")
        got = {m.body: m for m in (first, second)}
        assert set(got) == {body, b"second"}
        binary, text = got[body], got[b"second"]
        assert binary.headers["destination"] == text.headers["destination"] == queue
        assert binary.headers["subscription"] == text.headers["subscription"] == "s1"
        assert binary.headers["x-note"] == "a:b"
        assert binary.raw_headers["x-note"] == b"a\\cb"  # escaped on the way out too
        assert binary.headers["content-length"] == str(len(body))
        assert "persistent" not in binary.headers  # non-persistent: no header at all
        assert text.headers["persistent"] == "true"
        assert binary.headers["message-id"] != text.headers["message-id"]
        assert consumer.nothing_within(0.3)
    finally:
        consumer.close()
        producer.close()


def test_queue_keeps_messages_until_a_subscriber_comes_in_order(
    activemq: ActiveMQ,
) -> None:
    queue = f"/queue/{unique('kept')}"
    producer = Stomp(activemq.stomp_port)
    producer.send(
        b"".join(send_frame(queue, b"m%d" % i) for i in range(4))
        + b"SEND\ndestination:%s\nreceipt:done\n\ntext body\x00" % queue.encode()
    )
    assert producer.read().headers["receipt-id"] == "done"
    producer.close()
    consumer = Stomp(activemq.stomp_port)
    try:
        consumer.subscribe(queue, "a")
        bodies = [consumer.read().body for _ in range(5)]
        assert bodies == [b"m0", b"m1", b"m2", b"m3", b"text body"]  # in order, once each
        assert consumer.nothing_within(0.3)
    finally:
        consumer.close()


# --- topics ----------------------------------------------------------------------------------


def test_topic_round_trip_copies_to_every_subscriber_and_keeps_nothing(
    activemq: ActiveMQ,
) -> None:
    topic = f"/topic/{unique('t')}"
    producer = Stomp(activemq.stomp_port)
    # Before anyone subscribes: dropped (a topic keeps nothing for later subscribers).
    producer.send(send_frame(topic, b"too early", receipt="early"))
    assert producer.read().headers["receipt-id"] == "early"
    subscribers = [Stomp(activemq.stomp_port) for _ in range(2)]
    try:
        for i, sub in enumerate(subscribers):
            sub.subscribe(topic, f"t{i}", activemq_prefetchSize="5000")
        producer.send(send_frame(topic, b"for all", receipt="sent"))
        assert producer.read().headers["receipt-id"] == "sent"
        for i, sub in enumerate(subscribers):
            got = sub.read()
            assert (got.command, got.body) == ("MESSAGE", b"for all")
            assert (got.headers["destination"], got.headers["subscription"]) == (topic, f"t{i}")
            assert "ack" not in got.headers  # ack:auto: nothing to acknowledge
        for sub in subscribers:
            assert sub.nothing_within(0.3)
    finally:
        for sub in subscribers:
            sub.close()
        producer.close()


def test_protocol_error_is_an_error_frame(activemq: ActiveMQ) -> None:
    client = Stomp(activemq.stomp_port)
    try:
        client.send(b"SEND\ncontent-length:1\n\nx\x00")
        error = client.read()
        assert error.command == "ERROR"
        assert "without a Destination" in error.headers["message"]
    finally:
        client.sock.close()


# --- the durable path ------------------------------------------------------------------------


def test_persistent_broker_keeps_persistent_messages_across_a_restart(tmp_path: Path) -> None:
    queue = f"/queue/{unique('durable')}"
    workdir = tmp_path / "activemq"
    with start_activemq(workdir, persistent=True) as broker:
        producer = Stomp(broker.stomp_port)
        producer.send(
            send_frame(queue, b"durable", persistent="true")
            + send_frame(queue, b"transient", persistent="false", receipt="sent")
        )
        assert producer.read().headers["receipt-id"] == "sent"
        producer.close()
        assert "KahaDBPersistenceAdapter" in broker.log_path.read_text()
    with start_activemq(workdir, persistent=True) as broker:
        consumer = Stomp(broker.stomp_port)
        try:
            consumer.subscribe(queue, "d", ack="client")
            got = consumer.read()
            assert (got.body, got.headers["persistent"]) == (b"durable", "true")
            consumer.send(b"ACK\nid:" + got.raw_headers["ack"] + b"\n\n\x00")
            assert consumer.nothing_within(0.5)  # the non-persistent one died with the broker
        finally:
            consumer.close()
