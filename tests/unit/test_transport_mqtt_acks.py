"""transports/mqtt_client.py's fast paths (``Client._handle_pubackcomp``,
``Client._handle_publish``, ``Client.take_packets``, ``Client.publish_fields``) against
paho's own handlers: the same callback arguments, the same bookkeeping, and anything unusual
handed to paho. Packets are fed as paho's reader leaves them in ``_in_packet``, or as the
input buffer holds them; no socket is needed (paho keeps a message published while
disconnected)."""

from __future__ import annotations

from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion

from adapters.mqtt.encoding import encode_publish
from adapters.mqtt.properties import encode_properties
from transports.mqtt_client import ACK_SUCCESS, PAHO_NAMES, Client, Packed

PUBACK = 0x40
PUBCOMP = 0x70


def client(v5: bool = True, window: int = 0) -> tuple[Client, list[tuple[int, Any]]]:
    c = Client(CallbackAPIVersion.VERSION2, client_id="t",
                protocol=MQTTProtocolVersion.MQTTv5 if v5 else MQTTProtocolVersion.MQTTv311)
    c.max_inflight_messages_set(window)
    seen: list[tuple[int, Any]] = []
    c.on_publish = lambda _c, _u, mid, reason, _p: seen.append((mid, reason))
    return c, seen


def in_flight(c: Client, qos: int = 1) -> int:
    """A message paho thinks is waiting for its PUBACK / PUBREC."""
    info = c.publish("a/b", b"x", qos=qos)  # not connected: kept in _out_messages
    msg = c._out_messages[info.mid]
    msg.state = paho.mqtt_ms_wait_for_puback if qos == 1 else paho.mqtt_ms_wait_for_pubcomp
    c._inflight_messages += 1
    return info.mid


def ack(c: Client, command: int, body: bytes) -> MQTTErrorCode:
    c._in_packet["command"] = command
    c._in_packet["packet"] = body
    c._in_packet["remaining_length"] = len(body)
    name = "PUBACK" if command == PUBACK else "PUBCOMP"
    return c._handle_pubackcomp(name)  # type: ignore[no-any-return]


@pytest.mark.parametrize("body_tail", [b"", b"\x00", b"\x00\x00"])
def test_a_plain_success_confirms_and_frees_the_slot(body_tail: bytes) -> None:
    c, seen = client()
    mid = in_flight(c)
    assert ack(c, PUBACK, mid.to_bytes(2, "big") + body_tail) == MQTTErrorCode.MQTT_ERR_SUCCESS
    assert len(seen) == 1 and seen[0][0] == mid and not seen[0][1].is_failure
    assert seen[0][1] is ACK_SUCCESS  # the fast path, not paho's decoder
    assert mid not in c._out_messages
    assert c._inflight_messages == 0


def test_pubcomp_of_a_qos2_message() -> None:
    c, seen = client()
    mid = in_flight(c, qos=2)
    ack(c, PUBCOMP, mid.to_bytes(2, "big"))
    assert [m for m, _ in seen] == [mid] and c._inflight_messages == 0


def test_mqtt311_ack() -> None:
    c, seen = client(v5=False)
    mid = in_flight(c)
    ack(c, PUBACK, mid.to_bytes(2, "big"))
    assert [m for m, _ in seen] == [mid]


def test_a_refusal_keeps_its_reason_code() -> None:
    c, seen = client()
    mid = in_flight(c)
    ack(c, PUBACK, mid.to_bytes(2, "big") + b"\x87\x00")  # Not authorized, no properties
    assert len(seen) == 1 and seen[0][0] == mid
    assert seen[0][1].is_failure and seen[0][1].value == 0x87 and seen[0][1] is not ACK_SUCCESS
    assert mid not in c._out_messages and c._inflight_messages == 0


@pytest.mark.parametrize("command", [PUBACK, PUBCOMP])
@pytest.mark.parametrize("code", [0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x92, 0x97, 0x99])
@pytest.mark.parametrize("length", [3, 4])
def test_every_reason_code_as_paho_reads_it(command: int, code: int, length: int) -> None:
    body_tail = bytes([code]) + (b"\x00" if length == 4 else b"")
    results = []
    for fast in (True, False):
        c, seen = client()
        mid = in_flight(c, qos=1 if command == PUBACK else 2)
        if not fast:  # paho's own handler
            c._handle_pubackcomp = super(Client, c)._handle_pubackcomp  # type: ignore[method-assign]
        try:
            ack(c, command, mid.to_bytes(2, "big") + body_tail)
        except Exception as exc:  # noqa: BLE001 - paho refuses a code the type does not have
            results.append(type(exc))
            continue
        (got_mid, reason), = seen
        results.append((got_mid, reason.value, reason.packetType, reason.is_failure,
                        mid in c._out_messages, c._inflight_messages))
    assert results[0] == results[1]


def test_a_success_with_properties_goes_through_paho() -> None:
    c, seen = client()
    mid = in_flight(c)
    reason_string = b"\x1f\x00\x02ok"  # property 0x1F Reason String "ok"
    ack(c, PUBACK, mid.to_bytes(2, "big") + b"\x00" + bytes([len(reason_string)])
        + reason_string)
    assert len(seen) == 1 and not seen[0][1].is_failure
    assert mid not in c._out_messages


def test_an_unknown_packet_id_is_ignored() -> None:
    c, seen = client()
    mid = in_flight(c)
    ack(c, PUBACK, ((mid + 1) % 65536).to_bytes(2, "big"))
    assert seen == [] and mid in c._out_messages and c._inflight_messages == 1


def test_a_freed_slot_sends_a_queued_message() -> None:
    # Window 1: the second publish waits in paho's queue until the first is acknowledged.
    c, seen = client(window=1)
    first = in_flight(c)
    info = c.publish("a/b", b"y", qos=1)
    queued = c._out_messages[info.mid]
    queued.state = paho.mqtt_ms_queued
    sent: list[int] = []
    c._send_publish = lambda mid, *a, **k: sent.append(mid) or MQTTErrorCode.MQTT_ERR_SUCCESS  # type: ignore[method-assign]
    ack(c, PUBACK, first.to_bytes(2, "big"))
    assert sent == [info.mid]
    assert queued.state == paho.mqtt_ms_wait_for_puback and c._inflight_messages == 1


# -- the PUBLISH fast path ----------------------------------------------------------------------

def publish_body(qos: int, props: dict[str, Any] | None, level: int = 5, topic: str = "a/b",
                 payload: bytes = b"\x00payload\xff", retain: bool = False) -> tuple[int, bytes]:
    """(first byte, what paho keeps as the packet) of a PUBLISH, encoded by the adapter."""
    wire = encode_publish(topic, payload, qos, retain, False, 7 if qos else None, props, level)
    i = 1
    while wire[i] & 0x80:
        i += 1
    return wire[0], wire[i + 1:]


def receive(c: Client, first: int, body: bytes) -> MQTTErrorCode:
    c._in_packet["command"] = first
    c._in_packet["packet"] = bytearray(body)  # as paho's reader leaves it
    c._in_packet["remaining_length"] = len(body)
    return c._handle_publish()  # type: ignore[no-any-return]


def importer(v5: bool = True) -> tuple[Client, list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """A client as the transport makes it: manual acks, both import callbacks recording."""
    c = Client(CallbackAPIVersion.VERSION2, client_id="t", manual_ack=True,
                protocol=MQTTProtocolVersion.MQTTv5 if v5 else MQTTProtocolVersion.MQTTv311)
    fast: list[tuple[Any, ...]] = []
    slow: list[tuple[Any, ...]] = []
    c.on_publish_packet = lambda _c, *args: fast.append(args)

    def on_message(_c: Any, _u: Any, m: Any) -> None:  # the transport's conversion
        props = {k: getattr(m.properties, v) for k, v in PAHO_NAMES.items()
                 if m.properties is not None and hasattr(m.properties, v)}
        slow.append((m.topic, bytes(m.payload), m.qos, bool(m.retain), m.mid, props))

    c.on_message = on_message
    return c, fast, slow


FULL = {
    "payload_format_indicator": 1, "message_expiry_interval": 60, "content_type": "text/x",
    "response_topic": "re/ply", "correlation_data": b"\x01\x02",
    "user_property": [("k", "v"), ("k", "w"), ("gw-origin", "g1")],
}


@pytest.mark.parametrize("qos", [0, 1])
@pytest.mark.parametrize("props", [None, {"content_type": "a"}, FULL])
def test_publish_fast_path_gives_what_paho_gives(qos: int, props: dict[str, Any] | None) -> None:
    first, body = publish_body(qos, props, retain=True)
    c, fast, slow = importer()
    assert receive(c, first, body) == MQTTErrorCode.MQTT_ERR_SUCCESS
    paho_side, _, via_paho = importer()
    paho_side.on_publish_packet = None  # paho's own handler and the transport's conversion
    receive(paho_side, first, body)
    assert slow == [] and len(fast) == 1
    assert fast == via_paho
    assert type(fast[0][1]) is bytes


def test_publish_fast_path_mqtt311() -> None:
    first, body = publish_body(1, None, level=4)
    c, fast, slow = importer(v5=False)
    receive(c, first, body)
    assert fast == [("a/b", b"\x00payload\xff", 1, False, 7, {})] and slow == []


def test_qos2_goes_to_paho_which_keeps_the_exchange() -> None:
    first, body = publish_body(2, {"content_type": "a"})
    c, fast, slow = importer()
    sent: list[int] = []
    c._send_pubrec = lambda mid: sent.append(mid) or MQTTErrorCode.MQTT_ERR_SUCCESS  # type: ignore[method-assign]
    receive(c, first, body)
    assert fast == [] and sent == [7] and 7 in c._in_messages


def test_a_topic_alias_goes_to_paho() -> None:
    first, body = publish_body(1, {"topic_alias": 3})
    c, fast, slow = importer()
    receive(c, first, body)
    assert fast == [] and len(slow) == 1


def test_a_packet_that_does_not_parse_goes_to_paho() -> None:
    first, body = publish_body(1, {"content_type": "a"})
    c, fast, _ = importer()
    with pytest.raises(Exception):  # noqa: B017 - paho's own error, whatever it is
        receive(c, first, body[:6])  # cut inside the properties
    assert fast == []


# -- the PUBLISH sending fast path ---------------------------------------------------------------

class _Sock:
    """Stands in for the connected socket: paho only checks it is there (writes go to the
    client's buffer while ``buffered``)."""

    def fileno(self) -> int:
        return -1

    def close(self) -> None:
        pass


def connected(v5: bool = True, window: int = 20) -> Client:
    c, _ = client(v5, window)
    c._sock = _Sock()  # type: ignore[assignment]
    c.buffered = True
    return c


@pytest.mark.parametrize("v5", [True, False])
@pytest.mark.parametrize("qos", [1, 2])
def test_publish_fields_writes_what_paho_publish_writes(v5: bool, qos: int) -> None:
    fields = {"content_type": "text/x", "user_property": [("k", "v"), ("gw-hops", "1")]}
    fast, slow = connected(v5), connected(v5)
    mid = fast.publish_fields("a/b", b"payload", qos, fields if v5 else None)
    info = slow.publish("a/b", b"payload", qos=qos,
                        properties=Packed(fields) if v5 else None)  # type: ignore[arg-type]
    assert mid == info.mid == 1
    assert bytes(fast.out) == bytes(slow.out) and fast.out
    for c in (fast, slow):
        m = c._out_messages[1]
        assert (m.topic, m.payload, m.qos, c._inflight_messages) == ("a/b", b"payload", qos, 1)
        assert m.state == (paho.mqtt_ms_wait_for_puback if qos == 1 else paho.mqtt_ms_wait_for_pubrec)
    if v5:  # what paho would send again after a reconnect
        assert fast._out_messages[1].properties.pack() == encode_properties(fields, 0x3)


def test_publish_fields_leaves_to_paho_what_paho_must_decide() -> None:
    assert connected().publish_fields("a/b", b"x", 0, None) is None  # QoS 0
    c, _ = client()
    assert c.publish_fields("a/b", b"x", 1, None) is None  # not connected
    full = connected(window=1)
    assert full.publish_fields("a/b", b"x", 1, None) == 1
    assert full.publish_fields("a/b", b"y", 1, None) is None  # paho's window is full


def test_publish_fields_goes_behind_what_paho_has_waiting() -> None:
    c = connected()
    c._out_packet.append({"command": 0xC0, "mid": 0, "qos": 0, "pos": 0, "to_process": 2,
                          "packet": b"\xc0\x00", "info": None})  # a PINGREQ not yet written
    first = c.publish_fields("a/b", b"x", 1, {})  # through paho's queue, behind it
    second = c.publish_fields("a/b", b"y", 1, {})  # nothing of paho's waits: straight in
    assert first is not None and second is not None and not c._out_packet
    assert bytes(c.out) == (b"\xc0\x00" + encode_publish("a/b", b"x", 1, False, False, first,
                                                        {}, 5)
                            + encode_publish("a/b", b"y", 1, False, False, second, {}, 5))
    assert c._out_messages[second].state == paho.mqtt_ms_wait_for_puback


def test_flush_moves_the_keepalive_clock() -> None:
    c = connected()
    c._last_msg_out = 0.0
    c.publish_fields("a/b", b"x", 1, {})  # straight into the buffer: no paho writer saw it
    wire = _Wire()
    c.wire = wire  # type: ignore[assignment]
    assert c.flush() and not c.out and c._last_msg_out > 0.0
    assert wire.written == [encode_publish("a/b", b"x", 1, False, False, 1, {}, 5)]
    c.wire = None


class _Wire:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)


def test_publish_fields_then_the_fast_ack() -> None:
    c = connected()
    seen: list[int] = []
    c.on_publish = lambda _c, _u, mid, _r, _p: seen.append(mid)
    mid = c.publish_fields("a/b", b"x", 1, {})
    assert mid is not None
    ack(c, PUBACK, mid.to_bytes(2, "big"))
    assert seen == [mid] and c._out_messages == {} and c._inflight_messages == 0


@pytest.mark.parametrize("v5", [True, False])
def test_send_puback_writes_what_paho_ack_writes(v5: bool) -> None:
    fast, slow = connected(v5), connected(v5)
    for c in (fast, slow):
        c._manual_ack = True
    fast.send_puback(0x1234)
    assert slow.ack(0x1234, 1) == MQTTErrorCode.MQTT_ERR_SUCCESS
    assert bytes(fast.out) == bytes(slow.out) == b"\x40\x02\x12\x34"


def test_send_puback_leaves_to_paho_what_waits_before_it() -> None:
    c, _ = client()
    c._manual_ack = True
    c.send_puback(7)  # not connected: paho queues it
    assert [p["packet"] for p in c._out_packet] == [b"\x40\x02\x00\x07"] and not c.out
    c._sock = _Sock()  # type: ignore[assignment]
    c.buffered = True
    c.send_puback(8)  # paho's packet still waits: this one goes behind it, through paho
    assert bytes(c.out) == b"\x40\x02\x00\x07\x40\x02\x00\x08" and not c._out_packet


# -- whole packets in the buffered input (take_packets) ------------------------------------------

def buffered(c: Client, data: bytes) -> None:
    c.inbuf, c.inpos = data, 0


def test_take_packets_settles_a_run_of_acks_and_stops_at_anything_else() -> None:
    c = connected()
    seen: list[tuple[int, Any]] = []
    c.on_publish = lambda _c, _u, mid, reason, _p: seen.append((mid, reason))
    mids = [c.publish_fields("a/b", b"x", 1, {}) for _ in range(3)]
    q2 = c.publish_fields("a/b", b"y", 2, {})
    assert None not in mids and q2 is not None
    c._out_messages[q2].state = paho.mqtt_ms_wait_for_pubcomp
    rest = b"\x40\x03\x00\x09\x10" + b"\x30\x03\x00\x01a"  # a PUBACK with a reason code, ...
    buffered(c, b"".join(b"\x40\x02" + m.to_bytes(2, "big") for m in mids)  # type: ignore[union-attr]
             + b"\x70\x02" + q2.to_bytes(2, "big") + rest)
    before = c._last_bytes_received
    assert c.take_packets(100) == (4, MQTTErrorCode.MQTT_ERR_SUCCESS)
    assert [m for m, _ in seen] == [*mids, q2] and c._out_messages == {}
    assert [r for _, r in seen[:3]] == [ACK_SUCCESS] * 3 and not seen[3][1].is_failure
    assert str(seen[3][1]) == "Success" and c._inflight_messages == 0
    assert c.inbuf[c.inpos:] == rest  # paho's reader takes the rest
    assert c._last_bytes_received >= before
    assert c.take_packets(100) == (0, MQTTErrorCode.MQTT_ERR_SUCCESS)


@pytest.mark.parametrize("v5", [True, False])
def test_take_packets_hands_on_publishes_as_paho_s_reader_does(v5: bool) -> None:
    level = 5 if v5 else 4
    packets = [
        encode_publish("a/b", b"\x00one", 1, True, False, 7, FULL if v5 else None, level),
        encode_publish("c", b"", 0, False, False, None, None, level),
        encode_publish("a/" + "x" * 200, b"p" * 300, 1, False, True, 9, None, level),  # DUP
    ]
    fast_side, fast, _ = importer(v5)
    buffered(fast_side, b"".join(packets))
    assert fast_side.take_packets(100) == (3, MQTTErrorCode.MQTT_ERR_SUCCESS)
    assert fast_side.inpos == len(fast_side.inbuf)
    paho_side, _, via_paho = importer(v5)
    paho_side.on_publish_packet = None
    for wire in packets:
        i = 1
        while wire[i] & 0x80:
            i += 1
        receive(paho_side, wire[0], wire[i + 1:])
    assert fast == via_paho and len(fast) == 3
    assert all(type(args[1]) is bytes for args in fast)


def test_take_packets_leaves_to_paho_what_is_partial_odd_or_held() -> None:
    c, fast, _ = importer()
    one = encode_publish("a/b", b"x", 1, False, False, 1, None, 5)
    buffered(c, one + one[:-1])  # the second is not wholly buffered
    assert c.take_packets(100) == (1, MQTTErrorCode.MQTT_ERR_SUCCESS) and c.inpos == len(one)
    qos2 = encode_publish("a/b", b"x", 2, False, False, 2, None, 5)
    buffered(c, qos2)
    assert c.take_packets(100)[0] == 0 and c.inpos == 0  # paho keeps QoS 2 exchanges
    alias = encode_publish("a/b", b"x", 1, False, False, 3, {"topic_alias": 1}, 5)
    buffered(c, alias)
    assert c.take_packets(100)[0] == 0  # a property a message does not keep
    buffered(c, b"\x32\xff\xff\xff\xff\x01")  # a Remaining Length of five bytes
    assert c.take_packets(100)[0] == 0
    buffered(c, one * 5)
    assert c.take_packets(2)[0] == 2 and c.inpos == 2 * len(one)  # the limit
    c.hold = True  # the transport paused reading
    assert c.take_packets(100)[0] == 0
    c.hold = False
    c._in_packet["command"] = 0x32  # paho is half-way through a packet
    assert c.take_packets(100)[0] == 0
    c._in_packet["command"] = 0
    assert c.take_packets(100)[0] == 3 and len(fast) == 6
    no_manual = Client(CallbackAPIVersion.VERSION2, client_id="t")
    no_manual.on_publish_packet = lambda *a: fast.append(a)
    buffered(no_manual, one)
    assert no_manual.take_packets(100)[0] == 0  # without manual acks paho acknowledges


def test_take_packets_waits_for_whole_acks() -> None:
    c = connected()
    mid = c.publish_fields("a/b", b"x", 1, {})
    assert mid is not None
    buffered(c, b"\x40\x02\x00")  # three of four bytes
    assert c.take_packets(100)[0] == 0 and c.inpos == 0
    buffered(c, b"\x40\x02" + mid.to_bytes(2, "big"))
    assert c.take_packets(100) == (1, MQTTErrorCode.MQTT_ERR_SUCCESS) and c.inpos == 4


def test_take_packets_stops_when_the_socket_goes_in_a_callback() -> None:
    c = connected()
    mids = [c.publish_fields("a/b", b"x", 1, {}) for _ in range(2)]
    seen: list[int] = []

    def on_publish(_c: Any, _u: Any, mid: int, _r: Any, _p: Any) -> None:
        seen.append(mid)
        c._sock_close()  # the transport tore the connection down

    c.on_publish = on_publish
    buffered(c, b"".join(b"\x40\x02" + m.to_bytes(2, "big") for m in mids))  # type: ignore[union-attr]
    c.take_packets(100)
    assert seen == mids[:1] and c.inbuf == b""


def test_an_export_info_needs_no_condition() -> None:
    c = connected()
    mid = c.publish_fields("a/b", b"x", 1, {})
    assert mid is not None
    info = c._out_messages[mid].info
    assert not info.is_published() and tuple(info) == (MQTTErrorCode.MQTT_ERR_SUCCESS, mid)
    ack(c, PUBACK, mid.to_bytes(2, "big"))
    assert info.is_published()
    with pytest.raises(RuntimeError):
        info.wait_for_publish()
