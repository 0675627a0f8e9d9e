"""The MQTT adapter's acknowledgements of stored publishes (``MqttConnection._flush_acks``):
in the order the PUBLISH packets came ([MQTT-4.6.0-2]) whatever order their commits end in,
with one done-callback at a time (on the first that waits), not one a publish."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from corehelp import not_compiled

from adapters.mqtt.connection import MqttConnection, State
from adapters.mqtt.packets import PubAck, PubRec
from adapters.mqtt.session import MQTT_5


class Conn:
    """What ``_flush_acks`` uses of a connection."""

    def __init__(self) -> None:
        self.pending_acks: deque[tuple[int, Any, int]] = deque()
        self.ack_watch: Any = None
        self.state = State.CONNECTED
        self.level = MQTT_5
        self.sent: list[Any] = []
        self.session: Any = None
        self.in_qos1 = 0  # the Receive Maximum count: QoS 1 until PUBACK is sent
        self.in_qos2: set[int] = set()  # QoS 2 until PUBCOMP or a refusing PUBREC

    def send(self, packet: Any) -> None:
        self.sent.append(packet)

    def _flush_acks(self) -> None:
        MqttConnection._flush_acks(self)  # type: ignore[arg-type]

    def _acks_ready(self, fut: Any) -> None:
        MqttConnection._acks_ready(self, fut)  # type: ignore[arg-type]


@not_compiled  # calls the method on a stand-in connection
async def test_acks_keep_publish_order_whatever_order_commits_end_in() -> None:
    loop = asyncio.get_running_loop()
    c = Conn()
    futs = [loop.create_future() for _ in range(6)]
    for pid, fut in enumerate(futs, start=1):
        c.pending_acks.append((pid, fut, (2 if pid == 3 else 1) << 16))
    c.pending_acks.append((7, None, 1 << 16))  # nothing to wait for, but behind the others
    c.in_qos1, c.in_qos2 = 6, {3}
    c._flush_acks()
    assert c.sent == [] and c.ack_watch is futs[0]
    assert len(futs[0]._callbacks) == 1 and not any(f._callbacks for f in futs[1:])  # type: ignore[attr-defined]
    for i in (4, 2, 1):  # later ones confirmed first (consumed before their commit)
        futs[i].set_result(None)
    await asyncio.sleep(0)
    assert c.sent == []
    futs[0].set_result(None)
    await asyncio.sleep(0)
    assert [(type(p), p.packet_id) for p in c.sent] == [(PubAck, 1), (PubAck, 2), (PubRec, 3)]
    assert c.ack_watch is futs[3] and len(futs[3]._callbacks) == 1  # type: ignore[attr-defined]
    futs[3].set_result(None)
    futs[5].set_exception(OSError("disk full"))
    await asyncio.sleep(0)
    assert [p.packet_id for p in c.sent] == [1, 2, 3, 4, 5, 6, 7]
    assert (c.in_qos1, c.in_qos2) == (0, {3})  # the QoS 2 one counts until its PUBCOMP
    assert c.sent[5].reason_code == 0x80  # the failed commit: Unspecified error
    assert not c.pending_acks
