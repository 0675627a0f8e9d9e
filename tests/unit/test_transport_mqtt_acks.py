"""transports/mqtt.py's acknowledgement fast path (``_Client._handle_pubackcomp``) against
paho's own handler: the same callback arguments, the same bookkeeping, and anything but a
plain success handed to paho. Packets are fed as paho's reader leaves them in
``_in_packet``; no socket is needed (paho keeps a message published while disconnected)."""

from __future__ import annotations

from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion

from transports.mqtt import _ACK_SUCCESS, _Client

PUBACK = 0x40
PUBCOMP = 0x70


def client(v5: bool = True, window: int = 0) -> tuple[_Client, list[tuple[int, Any]]]:
    c = _Client(CallbackAPIVersion.VERSION2, client_id="t",
                protocol=MQTTProtocolVersion.MQTTv5 if v5 else MQTTProtocolVersion.MQTTv311)
    c.max_inflight_messages_set(window)
    seen: list[tuple[int, Any]] = []
    c.on_publish = lambda _c, _u, mid, reason, _p: seen.append((mid, reason))
    return c, seen


def in_flight(c: _Client, qos: int = 1) -> int:
    """A message paho thinks is waiting for its PUBACK / PUBREC."""
    info = c.publish("a/b", b"x", qos=qos)  # not connected: kept in _out_messages
    msg = c._out_messages[info.mid]
    msg.state = paho.mqtt_ms_wait_for_puback if qos == 1 else paho.mqtt_ms_wait_for_pubcomp
    c._inflight_messages += 1
    return info.mid


def ack(c: _Client, command: int, body: bytes) -> MQTTErrorCode:
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
    assert seen[0][1] is _ACK_SUCCESS  # the fast path, not paho's decoder
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


def test_a_refusal_goes_through_paho_with_its_reason_code() -> None:
    c, seen = client()
    mid = in_flight(c)
    ack(c, PUBACK, mid.to_bytes(2, "big") + b"\x87\x00")  # Not authorized, no properties
    assert len(seen) == 1 and seen[0][0] == mid
    assert seen[0][1].is_failure and seen[0][1].value == 0x87 and seen[0][1] is not _ACK_SUCCESS
    assert mid not in c._out_messages and c._inflight_messages == 0


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
