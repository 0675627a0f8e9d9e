"""The private RabbitMQ peer (tests/peers/rabbitmq.py) and the rhea scripts (tests/peers/rhea/)
do what the interop tests and the AMQP benchmark rely on: one node, started once for this
module, stays on loopback and carries real round trips through each of its protocols: paho
over MQTT, python-qpid-proton and rhea over AMQP 1.0 (each decoding what the other encoded),
a raw STOMP frame, and MQTT into an AMQP 1.0 topic receiver. The addressing they use is the
one rabbitmq.py's docstring describes."""

from __future__ import annotations

import base64
import os
import queue
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import peers.rabbitmq as rabbitmq_peer
import proton
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from peers.rabbitmq import START_TIMEOUT, RabbitMQ
from peers.rhea import finish_rhea, read_event, run_rhea, start_rhea, typed, untyped
from proton.utils import BlockingConnection

HOST = "127.0.0.1"

# The module-scoped fixture (pytest registers it under this attribute's name). A conftest.py
# would import it; this directory has none.
rabbitmq = rabbitmq_peer.rabbitmq


# --- helpers ---------------------------------------------------------------------------------


def listening_sockets(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state that process ``pid`` holds, from
    /proc/PID/fd and /proc/net/tcp{,6}."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: TCP_LISTEN
                continue
            addr_hex, port_hex = local.split(":")
            raw = bytes.fromhex(addr_hex)
            # /proc prints each 32-bit word of the address in host (little-endian) order.
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, width, 4))
            family = socket.AF_INET if width == 4 else socket.AF_INET6
            found.add((socket.inet_ntop(family, words), int(port_hex, 16)))
    return found


class Paho:
    """A paho MQTT 3.1.1 client whose received messages land in a queue."""

    def __init__(self, port: int, client_id: str) -> None:
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        connected: queue.Queue[object] = queue.Queue()
        self.c = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311
        )
        self.c.on_message = lambda c, u, m: self.messages.put(m)
        self.c.on_connect = lambda c, u, f, rc, p=None: connected.put(rc)
        self.c.connect(HOST, port, 30)
        self.c.loop_start()
        assert not connected.get(timeout=10).is_failure

    def subscribe(self, topic: str, qos: int = 1) -> None:
        acked: queue.Queue[object] = queue.Queue()
        self.c.on_subscribe = lambda c, u, mid, rcs, p=None: acked.put(rcs)
        self.c.subscribe(topic, qos=qos)
        assert not acked.get(timeout=10)[0].is_failure

    def publish(self, topic: str, payload: bytes, qos: int = 1) -> None:
        self.c.publish(topic, payload, qos=qos).wait_for_publish(10)

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


@pytest.fixture
def amqp(rabbitmq: RabbitMQ) -> Iterator[BlockingConnection]:
    """A python-qpid-proton blocking connection to the node (no SASL: RabbitMQ's default
    user, guest, applies)."""
    conn = BlockingConnection(f"amqp://{HOST}:{rabbitmq.amqp_port}", timeout=10)
    yield conn
    conn.close()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# --- the node --------------------------------------------------------------------------------


def test_node_listens_on_its_loopback_ports_only(rabbitmq: RabbitMQ) -> None:
    assert 0 < rabbitmq.startup_seconds < START_TIMEOUT
    beam = listening_sockets(rabbitmq.pid)
    expected = {rabbitmq.amqp_port, rabbitmq.mqtt_port, rabbitmq.stomp_port, rabbitmq.dist_port}
    assert {port for _, port in beam} == expected, beam
    assert {addr for addr, _ in beam} == {"127.0.0.1"}, beam
    epmd = listening_sockets(rabbitmq.epmd.pid)
    assert {port for _, port in epmd} == {rabbitmq.epmd_port}, epmd
    assert {addr for addr, _ in epmd} <= {"127.0.0.1", "::1"}, epmd


def test_rabbitmqctl_reaches_the_private_node(rabbitmq: RabbitMQ, amqp: BlockingConnection) -> None:
    name = unique("ctl")
    amqp.create_sender(f"/queue/{name}").send(proton.Message(body="counted"))
    listed = rabbitmq.ctl("list_queues", "name", "messages", "--quiet").stdout.split()
    assert listed[listed.index(name) + 1] == "1"
    rabbitmq.ctl("delete_queue", name)
    assert name not in rabbitmq.ctl("list_queues", "name", "--quiet").stdout.split()


# --- each protocol ---------------------------------------------------------------------------


def test_mqtt_round_trip_with_paho(rabbitmq: RabbitMQ) -> None:
    sub = Paho(rabbitmq.mqtt_port, unique("sub"))
    pub = Paho(rabbitmq.mqtt_port, unique("pub"))
    try:
        sub.subscribe("peer/+/t")
        pub.publish("peer/x/t", b"\x00over mqtt\xff")
        got = sub.messages.get(timeout=10)
        assert (got.topic, got.payload, got.qos) == ("peer/x/t", b"\x00over mqtt\xff", 1)
    finally:
        pub.close()
        sub.close()


def test_amqp10_round_trip_with_proton(amqp: BlockingConnection) -> None:
    address = f"/queue/{unique('proton')}"
    receiver = amqp.create_receiver(address)
    sent = proton.Message(
        body="over amqp 1.0",
        subject="subj",
        correlation_id="c-1",
        properties={"n": proton.ubyte(5), "s": "text"},
        durable=True,
    )
    amqp.create_sender(address).send(sent)
    got = receiver.receive(timeout=10)
    receiver.accept()
    assert got.body == "over amqp 1.0"
    assert (got.subject, got.correlation_id, got.durable) == ("subj", "c-1", True)
    assert got.properties == {"n": 5, "s": "text"}
    assert type(got.properties["n"]) is proton.ubyte


def stomp_frame(sock: socket.socket) -> bytes:
    """The next STOMP frame (up to its NUL) from ``sock``; heart-beat newlines are skipped."""
    frame = b""
    while not frame.endswith(b"\x00"):
        byte = sock.recv(1)
        assert byte, f"connection closed after {frame!r}"
        if frame or byte != b"\n":
            frame += byte
    return frame


def test_stomp_send_reaches_the_amqp10_queue_of_the_same_name(
    rabbitmq: RabbitMQ, amqp: BlockingConnection
) -> None:
    name = unique("stomp")
    receiver = amqp.create_receiver(f"/queue/{name}")  # declares the (non-durable) queue
    with socket.create_connection((HOST, rabbitmq.stomp_port), timeout=10) as s:
        s.sendall(b"CONNECT\naccept-version:1.2\nhost:/\n\n\x00")
        connected = stomp_frame(s)
        assert connected.startswith(b"CONNECTED\n"), connected
        # /amq/queue/Q: the existing queue (STOMP's /queue/Q would declare it durable: clash).
        s.sendall(
            f"SEND\ndestination:/amq/queue/{name}\ncontent-length:10\n\nover stomp\x00".encode()
            + b"DISCONNECT\nreceipt:bye\n\n\x00"
        )
        receipt = stomp_frame(s)  # after the SEND was processed
        assert receipt.startswith(b"RECEIPT\n") and b"receipt-id:bye" in receipt, receipt
    got = receiver.receive(timeout=10)
    receiver.accept()
    assert bytes(got.body) == b"over stomp"


@pytest.mark.parametrize("address", ["/topic/bench.t", "/exchange/amq.topic/bench.t"])
def test_mqtt_publish_reaches_an_amqp10_topic_receiver(
    rabbitmq: RabbitMQ, amqp: BlockingConnection, address: str
) -> None:
    # Binds a new queue to amq.topic with bench.t. (Not closed: RabbitMQ 3.10 does not answer
    # the detach of such a link; closing the connection ends it.)
    receiver = amqp.create_receiver(address)
    pub = Paho(rabbitmq.mqtt_port, unique("pub"))
    try:
        pub.publish("bench/t", b"from mqtt")
        pub.publish("bench/other", b"not for this receiver")
        got = receiver.receive(timeout=10)
        receiver.accept()
        assert bytes(got.body) == b"from mqtt"
        with pytest.raises(proton.Timeout):
            receiver.receive(timeout=0.5)
    finally:
        pub.close()


# --- the rhea scripts ------------------------------------------------------------------------

# One application property of each AMQP type (with its extreme values), as typed values.
TYPED_PROPERTIES = {
    "ub": typed("ubyte", 255),
    "us": typed("ushort", 65535),
    "ui": typed("uint", 4294967295),
    "ul": typed("ulong", 2**64 - 1),
    "b": typed("byte", -128),
    "sh": typed("short", -32768),
    "i": typed("int", -(2**31)),
    "l": typed("long", -(2**63)),
    "f": typed("float", 1.5),
    "d": typed("double", "-Infinity"),
    "c": typed("char", "\u00e9"),
    "ts": typed("timestamp", 1_700_000_000_123),
    "u": typed("uuid", "12345678-1234-5678-1234-567812345678"),
    "bin": typed("binary", base64.b64encode(b"\x00\x01\xff").decode()),
    "sym": typed("symbol", "a-symbol"),
    "str": "plain string",
    "t": True,
    "n": None,
}
PROTON_TYPES = {
    "ub": proton.ubyte,
    "us": proton.ushort,
    "ui": proton.uint,
    "ul": proton.ulong,
    "b": proton.byte,
    "sh": proton.short,
    "i": proton.int32,
    "l": int,
    "f": proton.float32,
    "d": float,
    "c": proton.char,
    "ts": proton.timestamp,
    "u": uuid.UUID,
    "bin": memoryview,
    "sym": proton.symbol,
    "str": str,
    "t": bool,
    "n": type(None),
}


def test_rhea_send_then_receive_keeps_every_section_and_type(rabbitmq: RabbitMQ) -> None:
    address = f"/queue/{unique('rhea')}"
    body = typed(
        "map",
        [
            [typed("int", 1), typed("array", [1, 2], element_type="int")],
            ["k", typed("described", "v", descriptor=typed("ulong", 7))],
        ],
    )
    message = {
        "body": body,
        "application_properties": TYPED_PROPERTIES,
        "message_annotations": {"x-opt-k": typed("long", 5)},
        "durable": True,
        "priority": 7,
        "ttl": 60000,
        "message_id": typed("ulong", 42),
        "correlation_id": "corr",
        "reply_to": "/queue/r",
        "content_type": "application/x",
        "subject": "subj",
        "creation_time": 1_700_000_000_000,
    }
    sent = run_rhea(
        "send",
        {
            "port": rabbitmq.amqp_port,
            "address": address,
            "messages": [message, {"body": "second", "body_section": "data"}],
        },
    )
    assert sent.returncode == 0, sent
    assert sent.outcomes() == ["accepted", "accepted"]
    assert sent.done()["sent"] == 2

    got = run_rhea("receive", {"port": rabbitmq.amqp_port, "address": address, "count": 2})
    assert got.returncode == 0, got
    assert got.done()["reason"] == "count"
    first, second = got.messages()
    props = first["application_properties"]["value"]
    assert {k["value"]: v["type"] for k, v in props} == {
        k: v["type"]
        if isinstance(v, dict)
        else {str: "string", bool: "boolean", type(None): "null"}[type(v)]
        for k, v in TYPED_PROPERTIES.items()
    }
    plain = untyped(first["application_properties"])
    assert plain["ul"] == 2**64 - 1 and plain["l"] == -(2**63)
    assert plain["d"] == float("-inf") and plain["bin"] == b"\x00\x01\xff"
    assert plain["u"] == uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert untyped(first["body"]["value"]) == {1: [1, 2], "k": (7, "v")}
    assert first["body"]["value"]["value"][0][1]["element_type"] == "int"
    assert first["message_annotations"]["value"][0][1] == {"type": "long", "value": 5}
    header, properties = first["header"], first["properties"]
    assert untyped(header["durable"]) is True and header["priority"] == typed("ubyte", 7)
    assert header["ttl"] == typed("uint", 60000)
    assert properties["message_id"] == typed("ulong", 42)
    assert properties["content_type"] == typed("symbol", "application/x")
    assert properties["creation_time"] == typed("timestamp", 1_700_000_000_000)
    assert untyped(properties["reply_to"]) == "/queue/r"
    assert second["body"] == {
        "section": "data",
        "value": [typed("binary", base64.b64encode(b"second").decode())],
    }


def test_rhea_encodes_what_proton_decodes_with_the_same_types(
    rabbitmq: RabbitMQ, amqp: BlockingConnection
) -> None:
    address = f"/queue/{unique('rhea2proton')}"
    sent = run_rhea(
        "send",
        {
            "port": rabbitmq.amqp_port,
            "address": address,
            "messages": [
                {"application_properties": TYPED_PROPERTIES, "body": typed("binary", "AAE=")}
            ],
        },
    )
    assert sent.outcomes() == ["accepted"], sent
    receiver = amqp.create_receiver(address)
    got = receiver.receive(timeout=10)
    receiver.accept()
    assert {k: type(v) for k, v in got.properties.items()} == PROTON_TYPES
    assert got.properties["ul"] == 2**64 - 1 and got.properties["ts"] == 1_700_000_000_123
    assert got.properties["c"] == "\u00e9" and got.properties["d"] == float("-inf")
    assert got.body == b"\x00\x01"


def test_proton_encodes_what_rhea_decodes_with_the_same_types(
    rabbitmq: RabbitMQ, amqp: BlockingConnection
) -> None:
    address = f"/queue/{unique('proton2rhea')}"
    amqp.create_sender(address).send(
        proton.Message(
            # (A map: RabbitMQ 3.10 drops the connection on an amqp-value list of 2+ items.)
            body={"l": [proton.ushort(3), "text", proton.symbol("s")], proton.int32(-1): 2.5},
            properties={
                "ul": proton.ulong(2**63),
                "c": proton.char("x"),
                "f": proton.float32(0.25),
                "sym": proton.symbol("s"),
            },
            id=uuid.UUID(int=1),
        )
    )
    got = run_rhea("receive", {"port": rabbitmq.amqp_port, "address": address, "count": 1})
    message = got.messages()[0]
    assert message["body"]["section"] == "value"
    assert message["body"]["value"] == typed(
        "map",
        [
            [
                typed("string", "l"),
                typed("list", [typed("ushort", 3), typed("string", "text"), typed("symbol", "s")]),
            ],
            [typed("int", -1), typed("double", 2.5)],
        ],
    )
    assert dict((k["value"], v) for k, v in message["application_properties"]["value"]) == {
        "ul": {"type": "ulong", "value": 2**63},  # printed as an exact JSON number
        "c": typed("char", "x"),
        "f": typed("float", 0.25),
        "sym": typed("symbol", "s"),
    }
    assert message["properties"]["message_id"] == typed("uuid", str(uuid.UUID(int=1)))


def test_rhea_presettled_sends_and_unsettled_redelivery(rabbitmq: RabbitMQ) -> None:
    address = f"/queue/{unique('settle')}"
    sent = run_rhea(
        "send",
        {
            "port": rabbitmq.amqp_port,
            "address": address,
            "count": 50,
            "settle": "presettled",
            "linger": 1,  # RabbitMQ 3.10 drops what it has not routed when the connection closes
            "messages": [{"body": "p" * 64}],
        },
    )
    assert sent.returncode == 0, sent
    assert sent.outcomes() == [] and sent.done()["sent"] == 50
    assert sent.of("sent")[0]["started_at"] == sent.done()["started_at"]
    # Leave the first unsettled: the node takes it back when the link closes ...
    kept = run_rhea(
        "receive",
        {"port": rabbitmq.amqp_port, "address": address, "count": 1, "disposition": "none"},
    )
    assert untyped(kept.messages()[0]["header"]["first_acquirer"]) is True
    # ... and delivers it again, now marked as not the first acquirer; then the other 49.
    again = run_rhea("receive", {"port": rabbitmq.amqp_port, "address": address, "count": 1})
    assert untyped(again.messages()[0]["header"]["first_acquirer"]) is False
    rest = run_rhea(
        "receive",
        {
            "port": rabbitmq.amqp_port,
            "address": address,
            "count": 0,
            "idle": 1,
            "quiet": True,
            "credit": 10,
        },
    )
    assert rest.returncode == 0, rest
    assert rest.messages() == []  # quiet
    assert (rest.done()["received"], rest.done()["bytes"]) == (49, 49 * 64)
    assert rest.done()["reason"] == "idle"
    empty = run_rhea(
        "receive", {"port": rabbitmq.amqp_port, "address": address, "count": 0, "idle": 0.5}
    )
    assert empty.done()["received"] == 0


def test_rhea_receive_takes_no_more_credit_than_its_count(rabbitmq: RabbitMQ) -> None:
    address = f"/queue/{unique('credit')}"
    run_rhea(
        "send",
        {"port": rabbitmq.amqp_port, "address": address, "count": 5, "messages": [{"body": "x"}]},
    )
    got = run_rhea("receive", {"port": rabbitmq.amqp_port, "address": address, "count": 2})
    assert got.done()["received"] == 2
    # Nothing beyond the 2 was delivered and released: the other 3 were never taken.
    rest = run_rhea("receive", {"port": rabbitmq.amqp_port, "address": address, "count": 3})
    assert [untyped(m["header"]["first_acquirer"]) for m in rest.messages()] == [True] * 3


def test_rhea_receiver_attached_before_the_sender_gets_the_message(rabbitmq: RabbitMQ) -> None:
    """Also: SASL PLAIN (the receiver) and SASL ANONYMOUS (the sender) connect."""
    address = "/topic/rhea.live"
    plain = {"username": rabbitmq.user, "password": rabbitmq.password}
    receiver = start_rhea(
        "receive",
        {"port": rabbitmq.amqp_port, **plain, "address": address, "count": 1, "timeout": 20},
    )
    try:
        assert read_event(receiver, "attached")["address"] == address
        sent = run_rhea(
            "send",
            {
                "port": rabbitmq.amqp_port,
                "sasl": "anonymous",
                "address": address,
                "messages": [{"body": "live"}],
            },
        )
        assert sent.outcomes() == ["accepted"]
        got = finish_rhea(receiver)
    finally:
        receiver.kill()
    assert got.returncode == 0, got
    assert [untyped(m["body"]["value"]) for m in got.messages()] == ["live"]


def test_rhea_durable_subscription_attach_asks_for_durable_never_expiring_source(
    rabbitmq: RabbitMQ,
) -> None:
    got = run_rhea(
        "receive",
        {
            "port": rabbitmq.amqp_port,
            "address": "/topic/rhea.durable",
            "durable": True,
            "container_id": unique("client"),
            "link_name": "sub-1",
            "selector": "n > 1",
            "distribution_mode": "copy",
            "count": 0,
            "idle": 0.3,
            "end": "detach",
        },
    )
    assert got.returncode == 0, got
    source = got.of("attached")[0]["source"]
    assert (source["durable"], source["expiry_policy"]) == (2, "never")
    assert got.done()["reason"] == "idle"


def test_rhea_request_gets_the_reply_sent_to_its_reply_to(rabbitmq: RabbitMQ) -> None:
    service = f"/queue/{unique('service')}"
    replies = f"/queue/{unique('replies')}"
    requester = start_rhea(
        "request",
        {
            "port": rabbitmq.amqp_port,
            "address": service,
            "reply_address": replies,
            "timeout": 20,
            "message": {"body": "ping"},
        },
    )
    try:
        assert read_event(requester, "reply_to")["address"] == replies
        request = run_rhea(
            "receive", {"port": rabbitmq.amqp_port, "address": service, "count": 1}
        ).messages()[0]
        reply_to = untyped(request["properties"]["reply_to"])
        request_id = untyped(request["properties"]["message_id"])
        assert reply_to == replies and request_id.startswith("request-")
        answered = run_rhea(
            "send",
            {
                "port": rabbitmq.amqp_port,
                "address": reply_to,
                "messages": [{"body": "pong", "correlation_id": request_id}],
            },
        )
        assert answered.outcomes() == ["accepted"]
        got = finish_rhea(requester)
    finally:
        requester.kill()
    assert got.returncode == 0, got
    assert got.outcomes() == ["accepted"]
    (reply,) = got.messages()
    assert untyped(reply["body"]["value"]) == "pong"
    assert untyped(reply["properties"]["correlation_id"]) == request_id


def test_rhea_request_reports_that_rabbitmq_has_no_dynamic_sources(rabbitmq: RabbitMQ) -> None:
    got = run_rhea(
        "request", {"port": rabbitmq.amqp_port, "address": "/queue/unused", "timeout": 10}
    )
    assert got.returncode == 1
    (error,) = got.of("error")
    assert error["condition"] == "amqp:not-implemented", got


def test_rhea_scripts_report_errors_and_bad_specs(rabbitmq: RabbitMQ) -> None:
    missing = run_rhea(
        "send", {"port": rabbitmq.amqp_port, "address": "/exchange/nosuch/k", "timeout": 10}
    )
    assert missing.returncode == 1
    assert missing.of("error")[0]["condition"] == "amqp:not-found"
    bad = run_rhea(
        "receive", {"port": rabbitmq.amqp_port, "address": "/queue/x", "disposition": "maybe"}
    )
    assert bad.returncode == 2 and bad.of("error")[0]["where"] == "spec"
    refused = run_rhea(
        "send",
        {"port": rabbitmq.amqp_port, "username": "guest", "password": "wrong", "address": "x"},
    )
    assert refused.returncode == 1
    assert refused.of("error")[0]["condition"] == "amqp:unauthorized-access"
