"""The amqp transport's exports through a peer's anonymous relay (the ANONYMOUS-RELAY
capability): one sender link for every far address, each message routed by its ``to``. The
peer is another gateway, whose AMQP adapter offers the capability (RabbitMQ 3.10 does not:
``test_transport_amqp.py`` covers a link per address against it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gw import GatewayThread, wait_for

from gateway.message import DeliveryMode, Destination, Message

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def far_gateway(tmp: Path) -> GatewayThread:
    return GatewayThread(tmp / "far", gateway="listen = amqp://127.0.0.1:0\n").start()


def near_gateway(tmp: Path, port: int, **extra: str) -> GatewayThread:
    params = {"type": "amqp", "url": f"amqp://127.0.0.1:{port}", "reconnect_min": "100msec",
              "reconnect_max": "500msec", **extra}
    return GatewayThread(
        tmp / "gw", gateway="listen = http://127.0.0.1:0\namqp_transports = enabled\n",
        transports="[far]\n" + "".join(f"{k} = {v}\n" for k, v in params.items()),
        topics='ex.> export="far"\n>\n').start()


def info(g: GatewayThread) -> dict[str, Any]:
    return {t["name"]: t for t in g.admin_get("/api/v1/transports")}["far"]


def collect(far: GatewayThread, pattern: str) -> list[Any]:
    got: list[Any] = []
    far.call(lambda: far.broker.connect().session().consumer(Destination.topic(pattern),
                                                             listener=got.append))
    return got


def send(g: GatewayThread, names: list[str]) -> None:
    def run() -> None:
        p = g.broker.connect().session().producer(None, delivery_mode=DeliveryMode.PERSISTENT)
        for i, name in enumerate(names):
            p.send(Message.text(f"m{i}"), Destination.topic(name))
    g.call(run)


@pytest.mark.parametrize("relay", [True, False])
def test_exports_to_many_names_go_over_one_relay_link(tmp_path, relay):
    far = far_gateway(tmp_path)
    g = near_gateway(tmp_path, far.port("amqp"), anonymous_relay=str(relay).lower())
    try:
        got = collect(far, "ex.>")
        wait_for(lambda: info(g)["state"] == "up", what="transport up")
        names = [f"ex.s{i % 20}" for i in range(60)]
        send(g, names)
        wait_for(lambda: len(got) >= 60 and info(g)["spooled"] == 0, what="every export")
        t = info(g)
        assert (t["exported"], t["failed"], t["anonymous_relay"]) == (60, 0, relay)
        assert t["sender_links"] == (1 if relay else 20)
        received = [(d.msg.destination, d.msg.body) for d in got]
        # every message once, each on its own topic, in the order sent
        assert received == [(Destination.topic(n), f"m{i}") for i, n in enumerate(names)]
        assert all(d.msg.properties["JMS_GW_AMQP_MA_x-opt-gw-origin"] == g.broker.id
                   for d in got)  # the loop markers travel on the relay as on any link
    finally:
        g.stop()
        far.stop()


def test_the_relay_routes_by_the_far_address_of_another_prefix(tmp_path):
    """With ``address_prefix_topic = topic://fleet.`` the far address of ``ex.p0`` is
    ``topic://fleet.ex.p0``: the relay's ``to`` is that, not the mapping's ``topic://ex.p0``."""
    far = far_gateway(tmp_path)
    g = near_gateway(tmp_path, far.port("amqp"), address_prefix_topic="topic://fleet.",
                     anonymous_relay="true")
    try:
        got = collect(far, "fleet.ex.>")
        unprefixed = collect(far, "ex.>")
        wait_for(lambda: info(g)["state"] == "up", what="transport up")
        names = [f"ex.p{i % 5}" for i in range(10)]
        send(g, names)
        wait_for(lambda: len(got) >= 10 and info(g)["spooled"] == 0, what="every export")
        t = info(g)
        assert (t["exported"], t["anonymous_relay"], t["sender_links"]) == (10, True, 1)
        assert [(d.msg.destination, d.msg.body) for d in got] == [
            (Destination.topic("fleet." + n), f"m{i}") for i, n in enumerate(names)]
        assert unprefixed == []
    finally:
        g.stop()
        far.stop()
