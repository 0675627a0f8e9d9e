"""Admin changes a running gateway's clients and peers see: a connection closed by the
administrator (an MQTT and a STOMP client find their socket closed), and a transport stopped
(its exports spool) and started again (the spool goes out), against a real mosquitto."""

from __future__ import annotations

import threading
from typing import Any

import gw
import paho.mqtt.client as paho
import pytest
import stomp
from adminapi import admin_call
from gw import GatewayThread
from paho.mqtt.enums import CallbackAPIVersion
from peers.mosquitto import start_mosquitto
from test_transport_mqtt import Remote, transports_conf

from gateway.message import Destination, Message


def connection_of(g: GatewayThread, client_id: str) -> dict[str, Any] | None:
    rows = g.admin_get("/api/v1/connections")
    return next((r for r in rows if r["client_id"] == client_id), None)


def test_closing_an_mqtt_and_a_stomp_connection(tmp_path):
    gwconf = ("listen = mqtt://127.0.0.1:0\nlisten = stomp://127.0.0.1:0\n"
              "listen = http://127.0.0.1:0\n")
    with GatewayThread(tmp_path, gateway=gwconf) as g:
        closed = threading.Event()
        c = paho.Client(CallbackAPIVersion.VERSION2, client_id="dev-1")
        c.on_disconnect = lambda *a: closed.set()
        c.connect("127.0.0.1", g.port("mqtt"))
        c.loop_start()
        try:
            row = gw.wait_for(lambda: connection_of(g, "dev-1"), what="the MQTT connection")
            status, answer = admin_call(g.port("http"), "DELETE",
                                        f"/api/v1/connections/{row['id']}")
            assert (status, answer) == (200, {"closed": row["id"]})
            assert closed.wait(10)
            gw.wait_for(lambda: connection_of(g, "dev-1") is None, what="the connection gone")
        finally:
            c.loop_stop()
        s = stomp.Connection([("127.0.0.1", g.port("stomp"))])
        s.connect(wait=True, headers={"client-id": "app-1"})
        row = gw.wait_for(lambda: connection_of(g, "app-1"), what="the STOMP connection")
        assert admin_call(g.port("http"), "DELETE", f"/api/v1/connections/{row['id']}")[0] == 200
        gw.wait_for(lambda: not s.is_connected(), what="the STOMP socket closed")
        assert admin_call(g.port("http"), "DELETE", "/api/v1/connections/nope")[0] == 404


@pytest.fixture
def mosq(tmp_path):
    with start_mosquitto(tmp_path / "mosq") as m:
        yield m


def test_a_stopped_transport_spools_and_sends_when_started(tmp_path, mosq):
    g = GatewayThread(tmp_path / "gw", gateway="listen = http://127.0.0.1:0\n"
                      "mqtt_transports = enabled\n", transports=transports_conf(mosq.port),
                      topics='out.> export="far"\n>\n').start()
    remote = Remote(mosq.port)
    port = g.port("http")
    try:
        remote.subscribe("out/#")
        state = lambda: g.admin_get("/api/v1/transports/far")["state"]  # noqa: E731
        gw.wait_for(lambda: state() == "up", what="transport up")
        status, row = admin_call(port, "POST", "/api/v1/transports/far/stop", {})
        assert status == 200 and row["state"] == "stopped"

        def send() -> None:
            p = g.broker.connect().session().producer(Destination.topic("out.a"))
            for i in range(3):
                p.send(Message.text(f"m{i}"))

        g.call(send)
        assert remote.got == []
        status, row = admin_call(port, "POST", "/api/v1/transports/far/start", {})
        assert status == 200
        gw.wait_for(lambda: len(remote.got) == 3, what="the spooled exports")
        assert [m.payload for m in remote.got] == [b"m0", b"m1", b"m2"]
        assert state() == "up"
        assert admin_call(port, "POST", "/api/v1/transports/nope/stop", {})[0] == 404
    finally:
        remote.close()
        g.stop()
