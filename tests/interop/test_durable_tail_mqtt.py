"""An offline MQTT persistent session's queue is in the store, not in memory.

How this works. A gateway with a small ``destination_backlog_swapout`` (100) and the SQLite
store; a paho client opens a persistent session (MQTT 3.1.1 ``clean_session=False``, or MQTT 5
with a Session Expiry Interval), subscribes at QoS 1 and disconnects. Another paho client
publishes 5,000 QoS 1 messages of 1 KB. The gateway's ``memory`` (admin ``/api/v1/server``)
stays at about the first 100 while its durable subscription (``/api/v1/durables``) shows the
rest as ``stored``; the session's client comes back and receives all 5,000 in order, each
once -- also when the gateway restarts while the client is offline.
"""

from __future__ import annotations

import queue
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from gw import GatewayThread, wait_for
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from gateway.backlog import MESSAGE_OVERHEAD

V311, V5 = mqtt.MQTTv311, mqtt.MQTTv5
N = 5000
BODY = 1024
BACKLOG = 100
CONF = (f"destination_backlog_swapout = {BACKLOG}\nmqtt_max_queued_messages = 0\n"
        "listen = mqtt://127.0.0.1:0\nlisten = http://127.0.0.1:0\n")
# The first BACKLOG messages held in memory, with room to spare; the 5,000 would cost
# about 8 MB.
MEMORY_BOUND = 3 * BACKLOG * (BODY + 64 + MESSAGE_OVERHEAD)


def admin(g: GatewayThread, path: str) -> Any:
    return g.admin_get(path)


def durable(g: GatewayThread, cid: str) -> dict[str, Any]:
    rows = [d for d in admin(g, "/api/v1/durables") if d["client_id"] == cid]
    assert len(rows) == 1, rows
    return rows[0]


class Session:
    """A paho client of a persistent session, collecting the numbers it receives."""

    def __init__(self, port: int, cid: str, proto: int) -> None:
        kw = {"clean_session": False} if proto != V5 else {}
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=cid, protocol=proto, **kw)
        self.got: queue.Queue[int] = queue.Queue()
        self.connack: queue.Queue[Any] = queue.Queue()
        self.c.on_message = lambda c, u, m: self.got.put(int.from_bytes(m.payload[:4], "big"))
        self.c.on_connect = lambda c, u, f, rc, p=None: self.connack.put(f)
        if proto == V5:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = 3600
            self.c.connect("127.0.0.1", port, 60, clean_start=False, properties=props)
        else:
            self.c.connect("127.0.0.1", port, 60)
        self.c.loop_start()
        self.session_present = self.connack.get(timeout=10).session_present

    def subscribe(self, topic: str) -> None:
        done: queue.Queue[Any] = queue.Queue()
        self.c.on_subscribe = lambda c, u, mid, rcs, p=None: done.put(rcs)
        self.c.subscribe(topic, qos=1)
        done.get(timeout=10)

    def take(self, n: int) -> list[int]:
        return [self.got.get(timeout=60) for _ in range(n)]

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def publish(port: int, n: int) -> None:
    pub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="tail-publisher")
    pub.max_inflight_messages_set(100)
    pub.connect("127.0.0.1", port, 60)
    pub.loop_start()
    try:
        infos = [pub.publish("tail/t", i.to_bytes(4, "big") * (BODY // 4), qos=1)
                 for i in range(n)]
        for info in infos:
            info.wait_for_publish(60)
    finally:
        pub.disconnect()
        pub.loop_stop()


@pytest.mark.parametrize(("proto", "restart"), [(V311, False), (V5, True), (V311, True)],
                         ids=["3.1.1", "5.0-restart", "3.1.1-restart"])
def test_offline_session_queue_is_in_the_store_and_comes_back_in_order_once(
        tmp_path, proto, restart):
    g = GatewayThread(tmp_path / "gw", gateway=CONF).start()
    try:
        cid = f"tail-{proto}-{restart}"
        s = Session(g.port("mqtt"), cid, proto)
        s.subscribe("tail/t")
        s.close()
        publish(g.port("mqtt"), N)
        d = wait_for(lambda: (lambda x: x if x["count"] == N else None)(durable(g, cid)),
                     what="every message queued for the offline session")
        assert admin(g, "/api/v1/server")["memory"] <= MEMORY_BOUND
        assert d["stored"] >= N - BACKLOG
        if restart:
            g.restart()
            d = durable(g, cid)
            assert d["count"] == N and d["stored"] >= N - BACKLOG
            assert admin(g, "/api/v1/server")["memory"] <= MEMORY_BOUND
        back = Session(g.port("mqtt"), cid, proto)
        assert back.session_present
        assert back.take(N) == list(range(N))
        wait_for(lambda: durable(g, cid)["count"] == 0, what="every message acknowledged")
        assert back.got.empty()  # nothing twice
        back.close()
        assert admin(g, "/api/v1/server")["memory"] == 0
    finally:
        g.stop()
