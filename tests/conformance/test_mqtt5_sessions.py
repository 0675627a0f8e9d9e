"""MQTT 5 sessions, CONNACK properties and delivery limits: black-box scenarios against a
live gateway on loopback.

How this works. As in ``test_mqtt_conformance.py``: a real gateway in a background thread
(:class:`gw.GatewayThread`; one per module, one per test where a scenario needs its own
``gateway.conf`` or a restart), scenarios numbered, each docstring naming the MQTT 5.0
normative statements it checks (ids as in the OASIS standard's Appendix B). Each scenario
that a client library can express runs twice, with paho-mqtt 2 and with gmqtt (two
independent MQTT 5 clients, :mod:`libclients`); what the libraries cannot send (a Receive
Maximum overrun, a Topic Alias out of the blue, a CONNECT with chosen bytes) goes through
:class:`mqttclient.RawClient`. Client ids and topics carry the scenario number and the
library, so scenarios sharing a gateway never see each other's traffic.

"Nothing arrives" is checked with short waits (0.5 s); what must arrive is waited for.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gw import GatewayThread, wait_for
from libclients import LIBS, GmqttClient, PahoClient, connect
from mqttclient import RawClient

from adapters.mqtt.packets import (
    Disconnect,
    PubAck,
    PubComp,
    PubRec,
    PubRel,
)

NOTHING = 0.5  # seconds to wait for "nothing arrives"
LONG = 99999  # a Session Expiry Interval that outlives every test

Client = PahoClient | GmqttClient
EACH_LIB = pytest.mark.parametrize("lib", LIBS)


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    g = GatewayThread(tmp_path_factory.mktemp("mqtt5-sessions") / "gw").start()
    yield g
    g.stop()


@pytest.fixture
def own_gw(tmp_path: Path) -> Iterator[Callable[..., GatewayThread]]:
    """``own_gw(gateway="...")``: a gateway of the test's own (stopped after the test)."""
    made: list[GatewayThread] = []

    def make(**files: str) -> GatewayThread:
        g = GatewayThread(tmp_path / f"gw{len(made)}", **files).start()
        made.append(g)
        return g

    yield make
    for g in made:
        g.stop()


@pytest.fixture
def clients() -> Iterator[Callable[..., Client]]:
    """``clients(lib, port, cid, **kw)``: a connected library client, closed after the test."""
    made: list[Client] = []

    def make(lib: str, port: int, cid: str, **kw: Any) -> Client:
        c = connect(lib, port, cid, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


@pytest.fixture
def raw() -> Iterator[Callable[..., RawClient]]:
    """``raw(port, cid=None, **connect_kw)``: a RawClient at MQTT 5, closed after the test."""
    made: list[RawClient] = []

    def make(port: int, cid: str | None = None, **kw: Any) -> RawClient:
        c = RawClient(port)
        made.append(c)
        if cid is not None:
            c.connect(cid, 5, **kw)
        return c

    yield make
    for c in made:
        c.close()


def publish_all(raw_pub: RawClient, items: list[tuple[str, bytes, int]],
                props: dict[str, Any] | None = None) -> None:
    """Publish each (topic, payload, QoS) and wait for its acknowledgement."""
    for topic, payload, qos in items:
        raw_pub.publish(topic, payload, qos, properties=props)
        if qos == 1:
            raw_pub.expect(PubAck)
        elif qos == 2:
            pid = raw_pub.expect(PubRec).packet_id
            raw_pub.send(PubRel(pid))
            raw_pub.expect(PubComp)


# ------------------------------------------------------------- 1. resuming a session


@EACH_LIB
@pytest.mark.parametrize("again", [None, LONG, 30], ids=["no-expiry", "same-expiry", "new-expiry"])
def test_01a_clean_start_0_resumes_whatever_the_new_expiry(
        gw: GatewayThread, clients: Callable[..., Client], raw: Callable[..., RawClient],
        lib: str, again: int | None) -> None:
    """[MQTT-3.1.2-5]: CONNECT with Clean Start 0 and a session for the client id resumes
    it, whatever Session Expiry Interval the new CONNECT carries (none at all here: 0);
    [MQTT-3.2.2-3]: Session Present 1; the subscription's QoS 1 and 2 messages queued while
    the client was away are delivered ([MQTT-3.1.2-23] kept them; a QoS 0 one may be)."""
    port = gw.port("mqtt")
    cid = f"s01a-{lib}-{again}"
    top = f"s01a/{lib}/{again}"
    a = clients(lib, port, cid, props={"session_expiry_interval": LONG})
    assert a.sub(f"{top}/+/x", 2) == [2]
    a.disconnect()
    publish_all(raw(port, f"{cid}-pub"), [(f"{top}/{q}/x", b"q%d" % q, q) for q in (0, 1, 2)])
    props = {"session_expiry_interval": again} if again is not None else {}
    b = clients(lib, port, cid, clean=False, props=props)
    assert b.session_present
    got = {m.payload: m.qos for m in b.drain(NOTHING * 2)}
    assert {k: v for k, v in got.items() if k != b"q0"} == {b"q1": 1, b"q2": 2}, got


def test_01b_a_session_resumed_with_expiry_0_ends_with_that_connection(
        gw: GatewayThread, raw: Callable[..., RawClient]) -> None:
    """MQTT 5 3.1.2.11.2: the Session Expiry Interval of the resuming CONNECT applies from
    then on: absent means 0, so the resumed session ends when that connection closes
    ([MQTT-3.1.2-23] no longer binds): the next Clean Start 0 finds no session
    ([MQTT-3.2.2-2]... Session Present 0, [MQTT-3.1.2-6] a new session), and what is
    published meanwhile is kept for nobody."""
    port = gw.port("mqtt")
    a = raw(port, "s01b", properties={"session_expiry_interval": LONG})
    a.subscribe(("s01b/t", 1))
    a.send(Disconnect(0))
    assert a.wait_closed()
    b = raw(port, "s01b", clean=False)
    assert b.connack is not None and b.connack.session_present
    b.send(Disconnect(0))
    assert b.wait_closed()
    publish_all(raw(port, "s01b-pub"), [("s01b/t", b"after", 1)])
    c = raw(port, "s01b", clean=False, properties={"session_expiry_interval": LONG})
    assert c.connack is not None and not c.connack.session_present
    assert c.nothing(NOTHING)
    wait_for(lambda: gw.call(lambda: "sub:s01b:mqtt:s01b/t" not in gw.broker.durables),
             what="the ended session's durable subscription to go")


@EACH_LIB
def test_01c_queued_messages_expire_or_carry_the_remaining_interval(
        gw: GatewayThread, clients: Callable[..., Client], raw: Callable[..., RawClient],
        lib: str) -> None:
    """[MQTT-3.3.2-5]: a message queued for an offline session whose Message Expiry
    Interval passed before delivery started is deleted, not delivered; [MQTT-3.3.2-6]: one
    still alive carries its interval minus the time it waited in the server."""
    port = gw.port("mqtt")
    cid, top = f"s01c-{lib}", f"s01c/{lib}"
    a = clients(lib, port, cid, props={"session_expiry_interval": LONG})
    a.sub(top, 1)
    a.disconnect()
    pub = raw(port, f"{cid}-pub")
    publish_all(pub, [(top, b"short", 1)], {"message_expiry_interval": 1})
    publish_all(pub, [(top, b"long", 1)], {"message_expiry_interval": 60})
    sent = time.monotonic()
    time.sleep(1.6)  # the short one's interval passes while the session is offline
    b = clients(lib, port, cid, clean=False, props={"session_expiry_interval": LONG})
    assert b.session_present
    m = b.get()
    waited = time.monotonic() - sent
    assert m.payload == b"long", m
    remaining = m.props.get("message_expiry_interval")
    assert remaining is not None and 60 - waited - 1 <= remaining <= 59, (remaining, waited)
    assert b.none(NOTHING), "the expired message was delivered"


# ------------------------------------------- 2. Clean Start 1 inherits nothing, after any history


def _server(g: GatewayThread) -> Any:
    return g.broker.adapter_servers["mqtt"]


def _session_gone(g: GatewayThread, cid: str) -> None:
    wait_for(lambda: g.call(lambda: cid not in _server(g).sessions),
             what=f"session {cid} to end")


def _history(g: GatewayThread, raw: Callable[..., RawClient], name: str, cid: str,
             flt: str) -> RawClient | None:
    """Leave the client id ``cid`` in the state history ``name`` describes; returns a
    client that must stay connected (the takeover case)."""
    def persistent(expiry: int = LONG, **kw: Any) -> RawClient:
        c = raw(g.port("mqtt"), cid, properties={"session_expiry_interval": expiry}, **kw)
        c.subscribe((flt, 1))
        return c

    def leave(c: RawClient, props: dict[str, Any] | None = None) -> None:
        c.send(Disconnect(0, props or {}))
        assert c.wait_closed()

    if name == "long-session":
        leave(persistent())
    elif name == "disconnect-expiry-0":
        leave(persistent(), {"session_expiry_interval": 0})
    elif name == "resumed-expiry-0":
        leave(persistent())
        leave(raw(g.port("mqtt"), cid, clean=False))
    elif name == "will-delay":
        from adapters.mqtt.packets import Will

        c = persistent(will=Will(f"{cid}/will", b"w", 1, False, {"will_delay_interval": 60}))
        c.close()  # no DISCONNECT: the will waits for its delay or the session's end
        wait_for(lambda: g.call(lambda: _server(g).sessions[cid].conn is None),
                 what="the connection to go")
    elif name == "takeover":
        return persistent()
    elif name == "expired":
        leave(persistent(1))
        _session_gone(g, cid)
    elif name == "restart":
        leave(persistent())
        g.restart()
    elif name == "restart-expired":
        leave(persistent(1))
        g.restart()
        _session_gone(g, cid)
    elif name == "restart-resumed-expiry-0":
        leave(persistent())
        g.restart()
        leave(raw(g.port("mqtt"), cid, clean=False))
    elif name == "restart-then-unsubscribed":
        c = persistent()
        c.subscribe((f"{flt}/other", 1))
        leave(c)
        g.restart()
        c = raw(g.port("mqtt"), cid, clean=False)
        c.unsubscribe(flt)
        leave(c, {"session_expiry_interval": 0})
    else:
        raise AssertionError(name)
    return None


HISTORIES = ["long-session", "disconnect-expiry-0", "resumed-expiry-0", "will-delay",
             "takeover", "expired", "restart", "restart-expired", "restart-resumed-expiry-0",
             "restart-then-unsubscribed"]


@EACH_LIB
@pytest.mark.parametrize("history", HISTORIES)
def test_02a_clean_start_1_starts_from_nothing(
        own_gw: Callable[..., GatewayThread], clients: Callable[..., Client],
        raw: Callable[..., RawClient], lib: str, history: str) -> None:
    """[MQTT-3.1.2-4]: with Clean Start 1 the server discards any existing session and
    starts a new one, whatever the client id's history: a long session, one ended by
    DISCONNECT with Session Expiry Interval 0 (MQTT 5 3.14.2.2.2), one resumed with 0
    (3.1.2.11.2), one with a delayed will pending ([MQTT-3.1.3-9]), one still connected
    (taken over, [MQTT-3.1.4-3]), one that expired ([MQTT-4.1.0-2]), and the same across a
    gateway restart. Session Present is 0 ([MQTT-3.2.2-2]); a message published before the
    clean start, to the old subscription's filter, never reaches the new session, even
    when it subscribes the same filter with a persistent session of its own; a message
    published after it subscribed does."""
    g = own_gw()
    cid = f"s02a-{lib}"
    flt = f"s02a/{history}/+"
    keep = _history(g, raw, history, cid, flt)
    port = g.port("mqtt")
    pub = raw(port, f"{cid}-pub")
    publish_all(pub, [(f"s02a/{history}/old", b"old", 1)])
    c = clients(lib, port, cid, props={"session_expiry_interval": LONG})
    assert not c.session_present
    if keep is not None:
        assert keep.wait_closed(), "the taken-over connection was left open"
    assert c.sub(flt, 1) == [1]
    assert c.none(NOTHING), f"the new session got the old one's message: {c.drain()}"
    publish_all(pub, [(f"s02a/{history}/new", b"new", 1)])
    m = c.get()
    assert (m.topic, m.payload) == (f"s02a/{history}/new", b"new")
    assert c.none(NOTHING)
