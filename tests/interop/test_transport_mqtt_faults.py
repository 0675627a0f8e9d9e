"""The mqtt transport when the link fails: reset, delayed, cut, and the far broker restarted.

The gateway reaches mosquitto through the fault proxy of tests/faultproxy.py (toxiproxy's
API, driven with toxiproxy-python); the far-side test clients connect to mosquitto directly.
Every persistent message must arrive exactly once after recovery (QoS 2, persistent
sessions), in order where MQTT promises order.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import paho.mqtt.client as paho
import pytest
from faultproxy import toxiproxy_fixture  # noqa: F401
from gw import GatewayThread
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from peers.mosquitto import free_port, start_mosquitto
from test_transport_mqtt import Remote, gateway, info, subscribed, wait_for

from gateway.message import DeliveryMode, Destination, Message

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

N = 300


class Collector:
    """A far-side QoS 2 subscriber with a persistent session (it may reconnect)."""

    def __init__(self, port: int, topic: str) -> None:
        self.got: list[bytes] = []
        self.lock = threading.Lock()
        self.client_id = f"collector-{port}"
        self.c = paho.Client(CallbackAPIVersion.VERSION2, client_id=self.client_id,
                             protocol=MQTTProtocolVersion.MQTTv5)
        self.c.on_message = self._message
        self.topic = topic
        self.c.on_connect = lambda c, u, f, r, p: c.subscribe(topic, 2)
        self.c.connect("127.0.0.1", port, clean_start=False,
                       properties=_session_props())
        self.c.loop_start()

    def _message(self, c: Any, u: Any, m: Any) -> None:
        with self.lock:
            self.got.append(bytes(m.payload))

    def close(self) -> None:
        # DISCONNECT goes out behind the PUBCOMPs already queued, while the loop still runs.
        self.c.disconnect()
        self.c.loop_stop()

    def close_on(self, mosq: Any) -> None:
        """Close once ``mosq`` (logging ``all``) has read a PUBCOMP for every message taken
        and then the DISCONNECT. Stopped sooner, a persistent mosquitto saves the deliveries
        still waiting for their PUBCOMP and sends them again to this client ID when it comes
        back (DUP set): mosquitto's resends, not the gateway's."""
        def log() -> str:
            return str(mosq.log_path.read_text(errors="replace"))

        wait_for(lambda: log().count(f"Received PUBCOMP from {self.client_id}") >= len(self.got),
                 what="mosquitto to have every PUBCOMP")
        self.close()
        wait_for(lambda: f"Client {self.client_id} disconnected" in log(),
                 what="mosquitto to see the collector leave")


def _session_props() -> Any:
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    p = Properties(PacketTypes.CONNECT)
    p.SessionExpiryInterval = 3600
    return p


def proxied_gateway(tmp, toxiproxy: Any, upstream_port: int, topics: str,
                    **extra: str) -> tuple[GatewayThread, Any]:
    proxy = toxiproxy.create(upstream=f"127.0.0.1:{upstream_port}", name="far",
                             listen="127.0.0.1:0")
    port = int(proxy.listen.rsplit(":", 1)[1])
    return gateway(tmp, port, topics, qos="2", keepalive="2sec", **extra), proxy


def send_persistent(g: GatewayThread, topic: str, n: int, start: int = 0) -> None:
    def send() -> None:
        p = g.broker.connect().session().producer(Destination.topic(topic),
                                                  delivery_mode=DeliveryMode.PERSISTENT)
        for i in range(start, start + n):
            p.send(Message(f"m{i:04d}".encode()))
    g.call(send)


def expected(n: int) -> list[bytes]:
    return [f"m{i:04d}".encode() for i in range(n)]


def test_exports_wait_in_the_spool_while_the_far_side_is_down(tmp_path, toxiproxy):
    """While the far side cannot be reached (every connection to it reset) exports wait in
    the spool; once it can, they arrive, in order. (The far broker stays where it is: a
    broker restarted on a port given up meanwhile could meet another process there.)"""
    with start_mosquitto(tmp_path / "mosq") as mosq:
        proxy = toxiproxy.create(upstream=f"127.0.0.1:{mosq.port}", name="far",
                                 listen="127.0.0.1:0")
        g = gateway(tmp_path / "gw", int(proxy.listen.rsplit(":", 1)[1]),
                    'sp.> export="far"\n>\n')
        remote = Remote(mosq.port)

        def send(n: int) -> None:
            p = g.broker.connect().session().producer(Destination.topic("sp.t"))
            for i in range(n):
                p.send(Message.text(f"m{i}"))

        try:
            remote.subscribe("sp/#")
            wait_for(lambda: info(g)["far"]["state"] == "up", what="transport up")
            proxy.add_toxic(name="down", type="reset_peer", attributes={"timeout": 0})
            wait_for(lambda: info(g)["far"]["state"] != "up", what="transport down")
            g.call(lambda: send(20))
            assert info(g)["far"]["spooled"] == 20
            proxy.destroy_toxic("down")
            wait_for(lambda: len(remote.got) == 20, timeout=15, what="the spooled exports")
            assert [m.payload for m in remote.got] == [f"m{i}".encode() for i in range(20)]
            wait_for(lambda: info(g)["far"]["spooled"] == 0, what="spool drained")
        finally:
            remote.close()
            g.stop()


def test_exports_survive_resets_mid_stream_exactly_once(tmp_path, toxiproxy):
    with start_mosquitto(tmp_path / "mosq") as mosq:
        g, proxy = proxied_gateway(tmp_path / "gw", toxiproxy, mosq.port, 'f.> export="far"\n>\n')
        far = Collector(mosq.port, "f/#")
        try:
            wait_for(lambda: info(g)["far"]["state"] == "up", what="transport up")
            time.sleep(0.2)
            send_persistent(g, "f.a", N // 2)
            wait_for(lambda: len(far.got) > 10, what="the stream to start")
            proxy.add_toxic(name="cut", type="reset_peer", attributes={"timeout": 0})
            send_persistent(g, "f.a", N // 2, start=N // 2)
            wait_for(lambda: info(g)["far"]["state"] != "up", what="the transport to notice")
            proxy.destroy_toxic("cut")
            wait_for(lambda: len(far.got) >= N and info(g)["far"]["spooled"] == 0, timeout=30,
                     what="every message after the reset")
            time.sleep(0.5)  # a duplicate would arrive now
            assert sorted(far.got) == expected(N)  # each exactly once
            assert info(g)["far"]["connects"] >= 2
        finally:
            far.close()
            g.stop()


def test_a_silent_far_side_times_out_and_a_clean_start_sends_the_unconfirmed_again(
        tmp_path, toxiproxy):
    """Nothing comes back from the far side (its answers are held): the keepalive ends the
    connection (no answer to PINGREQ, MQTT 5.0 3.12.4). With ``clean_start = true`` the far
    side keeps no session, so the exports it never confirmed go back to the spool and are
    exported again as new messages: none is lost (QoS 2 cannot remove the copies then)."""
    with start_mosquitto(tmp_path / "mosq") as mosq:
        g, proxy = proxied_gateway(tmp_path / "gw", toxiproxy, mosq.port,
                                   'f.> export="far"\n>\n', clean_start="true")
        far = Collector(mosq.port, "f/#")
        try:
            wait_for(lambda: info(g)["far"]["state"] == "up", what="transport up")
            time.sleep(0.2)
            proxy.add_toxic(name="mute", type="timeout", stream="downstream",
                            attributes={"timeout": 0})
            send_persistent(g, "f.c", N // 2)
            wait_for(lambda: info(g)["far"]["state"] != "up", timeout=30,
                     what="the keepalive to end the connection")
            assert "KEEP_ALIVE_TIMEOUT" in info(g)["far"]["last_error"]
            assert info(g)["far"]["exported"] < N // 2  # some were never confirmed
            proxy.destroy_toxic("mute")
            wait_for(lambda: info(g)["far"]["exported"] == N // 2
                     and info(g)["far"]["spooled"] == 0, timeout=30,
                     what="every export confirmed after the reconnect")
            wait_for(lambda: set(far.got) == set(expected(N // 2)), what="every message")
        finally:
            far.close()
            g.stop()


def test_exports_keep_order_through_latency(tmp_path, toxiproxy):
    with start_mosquitto(tmp_path / "mosq") as mosq:
        g, proxy = proxied_gateway(tmp_path / "gw", toxiproxy, mosq.port, 'f.> export="far"\n>\n')
        far = Collector(mosq.port, "f/#")
        try:
            wait_for(lambda: info(g)["far"]["state"] == "up", what="transport up")
            proxy.add_toxic(name="slow", type="latency", stream="upstream",
                            attributes={"latency": 50, "jitter": 20})
            time.sleep(0.2)
            send_persistent(g, "f.b", 100)
            wait_for(lambda: len(far.got) >= 100, timeout=30, what="the delayed stream")
            assert far.got == expected(100)
        finally:
            far.close()
            g.stop()


def test_imports_survive_a_cut_link_exactly_once_at_qos_2(tmp_path, toxiproxy):
    with start_mosquitto(tmp_path / "mosq") as mosq:
        g, proxy = proxied_gateway(tmp_path / "gw", toxiproxy, mosq.port, ">\n",
                                   queues='in.q import="far"\n>\n',
                                   queue_import_dm="PERSISTENT", clean_start="false")
        far = Remote(mosq.port)
        try:
            wait_for(lambda: subscribed(g), what="the far side's SUBACK")
            for i in range(N // 2):
                far.publish("in/q", f"m{i:04d}".encode(), qos=2)
            proxy.disable()  # the link is cut; mosquitto keeps the session's messages
            for i in range(N // 2, N):
                far.publish("in/q", f"m{i:04d}".encode(), qos=2)
            wait_for(lambda: info(g)["far"]["state"] != "up", timeout=15, what="link down")
            proxy.enable()

            def pending() -> list[bytes]:
                q = g.broker.queues.get("in.q")
                return [m.body for m in q.iter_pending()] if q is not None else []

            wait_for(lambda: len(g.call(pending)) >= N, timeout=30, what="every import")
            time.sleep(0.5)
            assert sorted(g.call(pending)) == expected(N)
        finally:
            far.close()
            g.stop()


def _resends(log_path: Any) -> str:
    """What a mosquitto log (``log_type all``) says was sent again: PUBLISH packets with DUP
    set, received from the gateway or sent to the collector -- which side repeated itself."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(no log: {exc})"
    dup = [ln for ln in lines if "PUBLISH" in ln and "(d1," in ln]
    return f"{len(dup)} DUP PUBLISH lines in {log_path.name}:\n" + "\n".join(dup[:20])


def test_exports_wait_out_a_far_broker_restart_and_arrive_exactly_once(tmp_path, toxiproxy):
    port = free_port()
    persist = ["persistence true", f"persistence_location {tmp_path}/", "autosave_interval 1",
               "log_type all"]
    with start_mosquitto(tmp_path / "m1", port=port, extra_config=persist) as m1:
        g, _proxy = proxied_gateway(tmp_path / "gw", toxiproxy, m1.port, 'f.> export="far"\n>\n')
        far = Collector(m1.port, "f/#")
        wait_for(lambda: info(g)["far"]["state"] == "up", what="transport up")
        time.sleep(0.2)
        send_persistent(g, "f.c", N // 2)
        wait_for(lambda: len(far.got) >= N // 2, what="the first half")
        far.close_on(m1)
    try:
        wait_for(lambda: info(g)["far"]["state"] != "up", what="the broker to be gone")
        send_persistent(g, "f.c", N // 2, start=N // 2)  # spooled while it is down
        assert info(g)["far"]["spooled"] == N // 2
        with start_mosquitto(tmp_path / "m2", port=port, extra_config=persist) as m2:
            far2 = Collector(m2.port, "f/#")
            try:
                wait_for(lambda: len(far2.got) >= N // 2 and info(g)["far"]["spooled"] == 0,
                         timeout=30, what="the spooled half")
                time.sleep(0.5)
                assert far.got + far2.got == expected(N), (
                    f"{_resends(m1.log_path)}\n{_resends(m2.log_path)}")
            finally:
                far2.close()
    finally:
        g.stop()
