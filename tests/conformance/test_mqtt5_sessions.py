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

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gw import GatewayThread, wait_for
from libclients import LIBS, GmqttClient, PahoClient, connect
from mqttclient import RawClient, frame, utf8

from adapters.mqtt.packets import (
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Will,
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
    ([MQTT-3.1.2-23] no longer binds): the next Clean Start 0 finds no session (Session
    Present 0, [MQTT-3.2.2-3]; [MQTT-3.1.2-6] a new session), and what is published
    meanwhile is kept for nobody: the ended session's durable is gone."""
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


# ------------------------------------------------------------------ 3. CONNACK properties


def test_03a_assigned_client_identifier(gw: GatewayThread, raw: Callable[..., RawClient]) -> None:
    """[MQTT-3.1.3-6], [MQTT-3.1.3-7], [MQTT-3.2.2-16]: a zero-length Client Identifier gets
    a unique one, returned as Assigned Client Identifier in the CONNACK, and the CONNECT is
    processed as if the client had sent it: its session resumes under that id. (paho; gmqtt
    always sends an id of its own, so the other client here is a raw one.)"""
    port = gw.port("mqtt")
    p = PahoClient(port, "", props={"session_expiry_interval": LONG})
    try:
        first = p.connack_props.get("assigned_client_identifier")
        assert first, p.connack_props
        p.sub("s03a/t", 1)
        p.disconnect()
    finally:
        p.close()
    r = raw(port, "", properties={"session_expiry_interval": LONG})
    assert r.connack is not None
    second = r.connack.properties.get("assigned_client_identifier")
    assert second and second != first
    again = raw(port, first, clean=False, properties={"session_expiry_interval": LONG})
    assert again.connack is not None and again.connack.session_present
    assert "assigned_client_identifier" not in again.connack.properties


@EACH_LIB
@pytest.mark.parametrize("asked,told", [(60, 2), (0, 2), (1, None), (2, None)])
def test_03b_server_keep_alive(own_gw: Callable[..., GatewayThread],
                               clients: Callable[..., Client], lib: str, asked: int,
                               told: int | None) -> None:
    """``mqtt_max_keepalive`` (as mosquitto's ``max_keepalive``): a client that asks a Keep
    Alive above the maximum, or none (0), gets Server Keep Alive = the maximum in its
    CONNACK (MQTT 5 3.2.2.3.14, [MQTT-3.2.2-21]); one that asks no more than the maximum
    gets no Server Keep Alive, and its own value stands ([MQTT-3.2.2-22])."""
    g = own_gw(gateway="mqtt_max_keepalive = 2\n")
    c = clients(lib, g.port("mqtt"), f"s03b-{lib}-{asked}", keepalive=asked)
    assert c.connack_props.get("server_keep_alive") == told, c.connack_props


@pytest.mark.parametrize("level", [5, 4], ids=["5.0", "3.1.1"])
def test_03c_the_server_keep_alive_is_the_one_enforced(
        own_gw: Callable[..., GatewayThread], raw: Callable[..., RawClient],
        level: int) -> None:
    """[MQTT-3.1.2-22] with the server's value: a connection silent for 1.5 × the Server
    Keep Alive (not 1.5 × the 60 s it asked) is closed, with DISCONNECT 0x8D (Keep Alive
    timeout) on MQTT 5. A 3.1.1 client cannot be told the maximum (its CONNACK has no
    properties) and is held to it all the same; a client that keeps talking within the
    maximum stays connected."""
    g = own_gw(gateway="mqtt_max_keepalive = 2\n")
    port = g.port("mqtt")
    talker = RawClient(port)
    talker.connect("s03c-talker", level, keepalive=60)
    silent = RawClient(port)
    try:
        ack = silent.connect("s03c-silent", level, keepalive=60)
        if level >= 5:
            assert ack.properties.get("server_keep_alive") == 2
        started = time.monotonic()
        while not silent.closed and time.monotonic() - started < 20:
            talker.send(PingReq())
            talker.expect(PingResp)
            silent.wait_closed(0.4)
        assert silent.closed, "a client silent past 1.5 x the maximum was left connected"
        if level >= 5:
            d = [p for p in silent.packets if isinstance(p, Disconnect)]
            assert d and d[0].reason_code == 0x8D, silent.packets
        assert not talker.closed, "a client within the maximum was closed"
    finally:
        silent.close()
        talker.close()


def test_03d_advertised_limits_are_the_enforced_ones(
        own_gw: Callable[..., GatewayThread], raw: Callable[..., RawClient]) -> None:
    """The CONNACK's Maximum Packet Size (3.2.2.3.6), Topic Alias Maximum (3.2.2.3.8) and
    Receive Maximum (3.2.2.3.3) are exactly what the server enforces: a packet of exactly
    Maximum Packet Size is accepted and one byte more is refused with DISCONNECT 0x95
    ([MQTT-3.2.2-15] binds the client; 4.13 the server's answer); Topic Alias Maximum is
    accepted and one more is 0x94 ([MQTT-3.3.2-9]); Receive Maximum unacknowledged
    QoS 2 PUBLISHes are accepted, a QoS 2 one counting until its PUBCOMP, and one more is
    0x93 (3.3.4 Flow Control; [MQTT-3.3.4-7] binds the client to that count)."""
    g = own_gw(gateway="max_client_msg_size = 1KB\n")
    port = g.port("mqtt")
    c = raw(port, "s03d")
    assert c.connack is not None
    props = c.connack.properties
    size, aliases, window = (props["maximum_packet_size"], props["topic_alias_maximum"],
                             props["receive_maximum"])
    assert size == 1024

    def publish_of(total: int, topic: str = "s03d/t") -> bytes:
        head = utf8(topic) + b"\x00"  # QoS 0: topic, empty properties
        body_len = total - 3  # fixed header: type byte + 2-byte length (128..16383)
        return frame(0x30, head + b"x" * (body_len - len(head)))

    exact = publish_of(size)
    assert len(exact) == size
    c.send_raw(exact)
    c.send(PingReq())
    c.expect(PingResp)
    c.send_raw(publish_of(size + 1))
    c.expect_disconnect({0x95})

    c = raw(port, "s03d-alias")
    c.publish("s03d/a", b"1", 0, properties={"topic_alias": aliases})
    c.send(PingReq())
    c.expect(PingResp)
    c.send_raw(frame(0x30, utf8("s03d/a") + b"\x03\x23" + (aliases + 1).to_bytes(2, "big")))
    c.expect_disconnect({0x94})

    c = raw(port, "s03d-window")
    for i in range(window):
        c.publish("s03d/w", b"%d" % i, 2)
    recs = [c.expect(PubRec) for _ in range(window)]
    assert len({r.packet_id for r in recs}) == window
    c.send(PubRel(recs[0].packet_id))  # PUBCOMP frees one slot; PUBREC did not
    assert c.expect(PubComp).packet_id == recs[0].packet_id
    c.publish("s03d/w", b"in the freed slot", 2)
    c.expect(PubRec)
    c.publish("s03d/w", b"one too many", 2)
    c.expect_disconnect({0x93})


# --------------------------------------------------------- 4. Maximum Packet Size, aliases


def _log_records(g: GatewayThread) -> list[dict[str, Any]]:
    """The delivery log so far (flushed first)."""
    g.call(lambda: g.broker.dlog.flush())
    out = []
    for f in sorted((g.directory / "data" / "delivery-log").glob("*.jsonl")):
        out += [json.loads(line) for line in f.read_text().splitlines()]
    return out


@EACH_LIB
def test_04a_nothing_over_the_client_maximum_packet_size(
        gw: GatewayThread, clients: Callable[..., Client], raw: Callable[..., RawClient],
        lib: str) -> None:
    """[MQTT-3.1.2-24]: the server sends no packet larger than the client's Maximum Packet
    Size: not a live QoS 0 or QoS 1 message, not a retained one sent on SUBSCRIBE;
    [MQTT-3.1.2-25]: each is discarded as if sent (the QoS 1 one holds no Receive Maximum
    slot: the small message after it arrives). Each such drop is a delivery log ``drop``
    record with reason ``packet_too_large``."""
    port = gw.port("mqtt")
    top = f"s04a/{lib}"
    pub = raw(port, f"s04a-{lib}-pub")
    publish_all(pub, [(f"{top}/retained/big", b"R" * 400, 1)])
    pub.publish(f"{top}/retained/small", b"r", 1, retain=True)
    pub.expect(PubAck)
    pub.publish(f"{top}/retained/big", b"R" * 400, 1, retain=True)
    pub.expect(PubAck)
    before = gw.call(lambda: _server(gw).too_large)
    sub = clients(lib, port, f"s04a-{lib}",
                  props={"maximum_packet_size": 256, "receive_maximum": 1})
    assert sub.sub(f"{top}/#", 1) == [1]
    m = sub.get()
    assert (m.topic, m.payload, m.retain) == (f"{top}/retained/small", b"r", True)
    publish_all(pub, [(f"{top}/live", b"Q" * 400, 1), (f"{top}/live", b"Z" * 400, 0),
                      (f"{top}/live", b"small", 1)])
    m = sub.get()
    assert (m.topic, m.payload) == (f"{top}/live", b"small")
    assert sub.none(NOTHING), "a packet over the Maximum Packet Size was delivered"
    assert gw.call(lambda: _server(gw).too_large) - before == 3
    drops = [r for r in _log_records(gw)
             if r["event"] == "drop" and r["reason"] == "packet_too_large"
             and r["dest"].startswith(f"topic:s04a.{lib}.")]
    # (a subscription's drop names the subscription's topic, s04a.<lib>.> here)
    assert len(drops) == 3, drops


def test_04b_the_size_counts_every_property_added_for_the_client(
        gw: GatewayThread, raw: Callable[..., RawClient]) -> None:
    """[MQTT-3.1.2-24] on the packet as sent: a message that fits a client's Maximum Packet
    Size exactly reaches a subscription without a Subscription Identifier, and is dropped
    for one whose identifier (3.8.2.1.2, added to the PUBLISH, [MQTT-3.3.4-3]) makes the
    packet 2 bytes too large; a small one reaches both."""
    port = gw.port("mqtt")
    limit = 100
    plain = raw(port, "s04b-plain", properties={"maximum_packet_size": limit})
    plain.subscribe(("s04b/t", 0))
    tagged = raw(port, "s04b-tagged", properties={"maximum_packet_size": limit})
    tagged.subscribe(("s04b/t", 0), properties={"subscription_identifier": [7]})
    pub = raw(port, "s04b-pub")
    start = len(plain.raw_in)
    pub.publish("s04b/t", b"", 0)
    plain.expect(Publish)
    tagged.expect(Publish)
    empty = len(plain.raw_in) - start  # the packet with no payload, as this client gets it
    start = len(plain.raw_in)
    pub.publish("s04b/t", b"x" * (limit - empty), 0)
    assert len(plain.expect(Publish).payload) == limit - empty
    assert len(plain.raw_in) - start == limit
    assert tagged.nothing(NOTHING), "a packet 2 bytes over the limit was sent"
    pub.publish("s04b/t", b"small", 0)
    assert plain.expect(Publish).payload == b"small"
    m = tagged.expect(Publish)
    assert (m.payload, m.properties.get("subscription_identifier")) == (b"small", [7])


def test_04c_resent_publishes_are_encoded_for_the_new_connection(
        gw: GatewayThread, raw: Callable[..., RawClient]) -> None:
    """[MQTT-4.4.0-1]: unacknowledged PUBLISHes are sent again on reconnect with their packet
    ids and DUP set ([MQTT-3.3.1-1]), but as the new connection needs them: the topic aliases
    of the earlier connection are not carried over ([MQTT-3.3.2-7]), so a PUBLISH first
    sent with an alias alone carries its topic again; and one now over the new
    connection's Maximum Packet Size is not sent ([MQTT-3.1.2-24]) and is dropped
    ([MQTT-3.1.2-25]), for good (no later delivery)."""
    port = gw.port("mqtt")
    cid = "s04c"
    sub = raw(port, cid, properties={"session_expiry_interval": LONG,
                                      "topic_alias_maximum": 4})
    sub.subscribe(("s04c/#", 1))
    pub = raw(port, "s04c-pub")
    publish_all(pub, [("s04c/t", b"one", 1), ("s04c/t", b"two", 1),
                      ("s04c/big", b"B" * 300, 1), ("s04c/t", b"three", 1)])
    first = [sub.expect(Publish) for _ in range(4)]
    assert [m.topic for m in first] == ["s04c/t", "", "s04c/big", ""]  # aliases at work
    sub.close()
    again = raw(port, cid, clean=False, properties={"session_expiry_interval": LONG,
                                                    "maximum_packet_size": 200})
    assert again.connack is not None and again.connack.session_present
    resent = again.drain(NOTHING)
    assert [(m.topic, m.payload, m.packet_id, m.dup) for m in resent  # type: ignore[union-attr]
            ] == [("s04c/t", b"one", first[0].packet_id, True),
                  ("s04c/t", b"two", first[1].packet_id, True),
                  ("s04c/t", b"three", first[3].packet_id, True)], resent
    for m in resent:
        again.send(PubAck(m.packet_id))  # type: ignore[union-attr]
    again.close()
    last = raw(port, cid, clean=False, properties={"session_expiry_interval": LONG})
    assert last.nothing(NOTHING), "the dropped message came back"


@EACH_LIB
def test_04d_client_topic_aliases_last_the_connection_and_no_longer(
        gw: GatewayThread, clients: Callable[..., Client], raw: Callable[..., RawClient],
        lib: str) -> None:
    """MQTT 5 3.3.2.3.4: an alias the client sets with a topic stands for it in every later
    PUBLISH of the connection that carries the alias alone, until the client maps it to
    another topic ([MQTT-3.3.2-12]: any alias up to the maximum); [MQTT-3.3.2-7]: the
    mapping does not survive into the next connection: an alias-only PUBLISH there is a
    Protocol Error (DISCONNECT 0x82) and is not published."""
    port = gw.port("mqtt")
    top = f"s04d/{lib}"
    watcher = raw(port, f"s04d-{lib}-w")
    watcher.subscribe((f"{top}/#", 0))
    c = clients(lib, port, f"s04d-{lib}")
    c.pub(f"{top}/a", b"a0", 1, props={"topic_alias": 3})
    for i in range(1, 4):
        c.pub("", b"a%d" % i, i % 3, props={"topic_alias": 3})
    c.pub(f"{top}/b", b"b0", 0, props={"topic_alias": 3})
    c.pub("", b"b1", 1, props={"topic_alias": 3})
    got = [watcher.expect(Publish) for _ in range(6)]
    assert [(m.topic, m.payload) for m in got] == [
        (f"{top}/a", b"a0"), (f"{top}/a", b"a1"), (f"{top}/a", b"a2"), (f"{top}/a", b"a3"),
        (f"{top}/b", b"b0"), (f"{top}/b", b"b1")]
    c.disconnect()
    d = raw(port, f"s04d-{lib}")
    d.send_raw(frame(0x30, utf8("") + b"\x03\x23\x00\x03" + b"orphan"))
    d.expect_disconnect({0x82})
    assert watcher.nothing(NOTHING)


def test_04e_server_topic_aliases_up_to_the_client_maximum(
        gw: GatewayThread, clients: Callable[..., Client], raw: Callable[..., RawClient]) -> None:
    """[MQTT-3.1.2-26]: the server sends no Topic Alias above the client's Topic Alias
    Maximum; an alias goes out with its topic before any PUBLISH carries it alone, and then
    stands for that topic (3.3.2.3.4): gmqtt, which resolves the server's aliases, gets
    every topic right; the raw client sees the packets themselves. (paho-mqtt 2.2 does not
    resolve aliases from the server: it hands on the empty topic.)"""
    port = gw.port("mqtt")
    names = ["a", "b", "c", "a", "b", "c", "a"]
    lib = clients("gmqtt", port, "s04e-gmqtt", props={"topic_alias_maximum": 2})
    lib.sub("s04e/#", 0)
    packets = raw(port, "s04e-raw", properties={"topic_alias_maximum": 2})
    packets.subscribe(("s04e/#", 0))
    pub = raw(port, "s04e-pub")
    for i, n in enumerate(names):
        pub.publish(f"s04e/{n}", b"%d" % i, 0)
    got = [lib.get() for _ in names]
    assert [(m.topic, m.payload) for m in got] == [
        (f"s04e/{n}", b"%d" % i) for i, n in enumerate(names)]
    known: dict[int, str] = {}
    for n in names:
        m = packets.expect(Publish)
        alias = m.properties.get("topic_alias")
        if alias is None:
            assert m.topic == f"s04e/{n}"
            continue
        assert 1 <= alias <= 2, m
        if m.topic:
            known[alias] = m.topic
        assert known.get(alias) == f"s04e/{n}", (m, known)


def test_04f_a_dropped_publish_sets_no_alias(gw: GatewayThread,
                                             raw: Callable[..., RawClient]) -> None:
    """[MQTT-3.1.2-25] with topic aliases: a PUBLISH discarded for the client's Maximum
    Packet Size did not reach it, so the alias it would have set is not set: the next
    PUBLISH of that topic carries the topic (with the alias), never the alias alone
    (3.3.2.3.4: an alias-only PUBLISH needs a mapping the receiver knows)."""
    port = gw.port("mqtt")
    sub = raw(port, "s04f", properties={"topic_alias_maximum": 2,
                                        "maximum_packet_size": 200})
    sub.subscribe(("s04f/t", 0))
    pub = raw(port, "s04f-pub")
    pub.publish("s04f/t", b"B" * 300, 0)
    pub.publish("s04f/t", b"small", 0)
    m = sub.expect(Publish)
    assert (m.topic, m.payload) == ("s04f/t", b"small"), m
    pub.publish("s04f/t", b"again", 0)
    m = sub.expect(Publish)
    assert m.payload == b"again" and m.properties.get("topic_alias") is not None


# ------------------------------------------------------------------------------ 5. wills


def _will(topic: str, payload: bytes = b"gone", delay: int = 0, retain: bool = False,
          **props: Any) -> tuple[str, bytes, int, bool, dict[str, Any]]:
    if delay:
        props["will_delay_interval"] = delay
    return (topic, payload, 1, retain, props)


@EACH_LIB
@pytest.mark.parametrize("case", ["delay-passes", "session-ends-first", "expiry-0",
                                  "resumed-in-time", "clean-start-in-time", "taken-over"])
def test_05a_will_delay_and_session_end(gw: GatewayThread, clients: Callable[..., Client],
                                        raw: Callable[..., RawClient], lib: str,
                                        case: str) -> None:
    """[MQTT-3.1.2-8]: after an abnormal close the will is published when the Will Delay
    Interval has passed or the session ends, whichever is first (3.1.3.2.2): with a delay
    of 1 s and a long session, after about 1 s and not at once; with a delay of 60 s and a
    Session Expiry Interval of 1 s, when the session ends; with Session Expiry Interval 0,
    at once. [MQTT-3.1.3-9], [MQTT-3.1.2-8]: a new connection for the client id before the
    delay passed means no will, whether it resumes the session (Clean Start 0) or starts a
    new one (Clean Start 1; mosquitto 2.0 behaves the same). A connection taken over
    ([MQTT-3.1.4-3]) publishes its will (no delay) as any abnormal close would."""
    port = gw.port("mqtt")
    cid, topic = f"s05a-{lib}-{case}", f"s05a/{lib}/{case}"
    watcher = raw(port, f"{cid}-w")
    watcher.subscribe((topic, 1))
    delay, expiry = {"delay-passes": (1, LONG), "session-ends-first": (60, 1),
                     "expiry-0": (60, 0), "resumed-in-time": (60, LONG),
                     "clean-start-in-time": (60, LONG), "taken-over": (0, LONG)}[case]
    a = clients(lib, port, cid, will=_will(topic, delay=delay),
                props={"session_expiry_interval": expiry})
    if case == "taken-over":
        clients(lib, port, cid, clean=False, props={"session_expiry_interval": expiry})
    else:
        a.kill()
    if case in ("delay-passes", "session-ends-first"):
        assert watcher.nothing(0.3), "the will came before its delay or the session's end"
        assert watcher.expect(Publish, timeout=10).payload == b"gone"
    elif case in ("expiry-0", "taken-over"):
        assert watcher.expect(Publish).payload == b"gone"
    else:
        wait_for(lambda: gw.call(lambda: _server(gw).sessions[cid].conn is None),
                 what="the connection to go")
        b = clients(lib, port, cid, clean=case != "resumed-in-time",
                    props={"session_expiry_interval": LONG})
        if case == "resumed-in-time":
            assert b.session_present
            assert watcher.nothing(NOTHING), "a will although the session was resumed in time"
            b.disconnect()  # normal: the will was deleted with the resumption
            assert watcher.nothing(NOTHING)
        else:
            assert not b.session_present
            assert watcher.nothing(NOTHING), "a will although a new connection came in time"
    assert watcher.nothing(NOTHING), "a second will"


@EACH_LIB
def test_05b_will_retain_and_will_properties(gw: GatewayThread,
                                             clients: Callable[..., Client],
                                             raw: Callable[..., RawClient], lib: str) -> None:
    """[MQTT-3.1.2-15]: Will Retain 1: the will is published as a retained message (a later
    subscriber gets it, retain flag set); 3.1.3.2.4: the will's Message Expiry Interval is
    sent as the message's; 3.1.3.2.5-6: its Content Type and Response Topic too."""
    port = gw.port("mqtt")
    topic = f"s05b/{lib}"
    a = clients(lib, port, f"s05b-{lib}", will=_will(
        topic, b"last words", retain=True, message_expiry_interval=600,
        content_type="text/plain", response_topic=f"{topic}/reply"))
    a.kill()
    later = clients(lib, port, f"s05b-{lib}-later")
    wait_for(lambda: gw.call(lambda: f"s05b.{lib}" in _server(gw).retained.messages),
             what="the will to be retained")
    later.sub(topic, 1)
    m = later.get()
    assert (m.topic, m.payload, m.retain) == (topic, b"last words", True)
    assert 590 <= m.props.get("message_expiry_interval", 0) <= 600, m.props
    assert m.props.get("content_type") == "text/plain", m.props
    assert m.props.get("response_topic") == f"{topic}/reply", m.props
    clear = raw(port, f"s05b-{lib}-clear")
    clear.publish(topic, b"", 1, retain=True)
    clear.expect(PubAck)


# ---------------------------------------------------------- 6. retained messages, expiry


@EACH_LIB
def test_06_retained_messages_expire_and_carry_the_remaining_interval(
        gw: GatewayThread, clients: Callable[..., Client], raw: Callable[..., RawClient],
        lib: str) -> None:
    """[MQTT-3.3.1-5]: a retained message is kept for later subscribers, with the retain
    flag ([MQTT-3.3.1-9]); [MQTT-3.3.2-5]: once its Message Expiry Interval has passed it is
    no longer sent; [MQTT-3.3.2-6]: one still alive carries the interval that remains;
    [MQTT-3.3.1-10]: a retained PUBLISH with an empty payload removes the topic's retained
    message and is not itself retained ([MQTT-3.3.1-11])."""
    port = gw.port("mqtt")
    top = f"s06/{lib}"
    pub = raw(port, f"s06-{lib}-pub")
    for name, expiry in (("short", 1), ("long", 60), ("cleared", 60)):
        pub.publish(f"{top}/{name}", name.encode(), 1, retain=True,
                    properties={"message_expiry_interval": expiry})
        pub.expect(PubAck)
    pub.publish(f"{top}/cleared", b"", 1, retain=True)
    pub.expect(PubAck)
    time.sleep(1.6)  # the short one's interval passes
    sub = clients(lib, port, f"s06-{lib}")
    sub.sub(f"{top}/#", 1)
    m = sub.get()
    assert (m.topic, m.payload, m.retain) == (f"{top}/long", b"long", True)
    assert 57 <= m.props.get("message_expiry_interval", 0) <= 59, m.props
    assert sub.none(NOTHING), "an expired or cleared retained message was sent"


# ------------------------------------------------------------------ 7. session expiry


@EACH_LIB
def test_07a_disconnect_changes_the_session_expiry_interval(
        gw: GatewayThread, clients: Callable[..., Client], lib: str) -> None:
    """MQTT 5 3.14.2.2.2: a Session Expiry Interval in the client's DISCONNECT replaces the
    CONNECT's: set to 1 s, the session ends 1 s after the close ([MQTT-4.1.0-2]: its state
    is discarded), so the next Clean Start 0 finds none (Session Present 0,
    [MQTT-3.2.2-3])."""
    port = gw.port("mqtt")
    cid = f"s07a-{lib}"
    a = clients(lib, port, cid, props={"session_expiry_interval": LONG})
    a.sub(f"s07a/{lib}", 1)
    a.disconnect(props={"session_expiry_interval": 1})
    assert gw.call(lambda: cid in _server(gw).sessions), "ended at once, not after 1 s"
    _session_gone(gw, cid)
    b = clients(lib, port, cid, clean=False, props={"session_expiry_interval": LONG})
    assert not b.session_present


@pytest.mark.slow
def test_07b_session_expiry_counts_from_the_disconnect_across_a_restart(
        own_gw: Callable[..., GatewayThread], raw: Callable[..., RawClient]) -> None:
    """[MQTT-4.1.0-2]: the session state is discarded when the Session Expiry Interval has
    passed since the Network Connection closed -- counted from the close, also when the
    gateway was stopped meanwhile: a session whose interval ran out while the gateway was
    down is gone when it starts (Session Present 0, its durable deleted), while one whose
    interval has not run out is resumed (Session Present 1, [MQTT-3.1.2-23])."""
    g = own_gw()
    for cid, expiry in (("s07b-short", 2), ("s07b-long", LONG)):
        c = raw(g.port("mqtt"), cid, properties={"session_expiry_interval": expiry})
        c.subscribe((f"{cid}/t", 1))
        c.send(Disconnect(0))
        assert c.wait_closed()
    closed = time.monotonic()
    g.stop()
    time.sleep(max(0.0, 2.5 - (time.monotonic() - closed)))  # the short interval runs out
    g.start()
    port = g.port("mqtt")
    short = raw(port, "s07b-short", clean=False, properties={"session_expiry_interval": 60})
    assert short.connack is not None and not short.connack.session_present
    assert g.call(lambda: "sub:s07b-short:mqtt:s07b-short/t" not in g.broker.durables)
    long = raw(port, "s07b-long", clean=False, properties={"session_expiry_interval": LONG})
    assert long.connack is not None and long.connack.session_present


# ------------------------------------------------------------------------- 8. takeover


@EACH_LIB
def test_08_takeover_with_clean_start_0_moves_the_session(
        gw: GatewayThread, clients: Callable[..., Client], raw: Callable[..., RawClient],
        lib: str) -> None:
    """[MQTT-3.1.4-3]: a second CONNECT with the client id closes the first connection
    (DISCONNECT 0x8E, Session taken over); with Clean Start 0 the new connection gets the
    session ([MQTT-3.1.2-5], Session Present 1): the QoS 1 PUBLISH the first connection
    left unacknowledged comes again with its packet id and DUP set ([MQTT-4.4.0-1]), and
    with its topic, although the first connection had got it as an alias alone
    ([MQTT-3.3.2-7]); later messages follow on the new connection."""
    port = gw.port("mqtt")
    cid, topic = f"s08-{lib}", f"s08/{lib}"
    first = raw(port, cid, properties={"session_expiry_interval": LONG,
                                      "topic_alias_maximum": 4})
    first.subscribe((topic, 1))
    pub = raw(port, f"{cid}-pub")
    publish_all(pub, [(topic, b"one", 1), (topic, b"two", 1)])
    one, two = first.expect(Publish), first.expect(Publish)
    assert two.topic == ""  # the alias alone
    first.send(PubAck(one.packet_id))
    second = clients(lib, port, cid, clean=False, props={"session_expiry_interval": LONG})
    assert second.session_present
    d = first.expect_disconnect({0x8E})
    assert d.reason_code == 0x8E
    m = second.get()
    assert (m.topic, m.payload, m.dup) == (topic, b"two", True), m
    publish_all(pub, [(topic, b"three", 1)])
    m = second.get()
    assert (m.topic, m.payload) == (topic, b"three")
    assert second.none(NOTHING)


# ------------------------------------------------- 9. small Maximum Packet Size, other packets


def test_09_no_packet_of_any_kind_over_the_client_maximum_packet_size(
        gw: GatewayThread, raw: Callable[..., RawClient]) -> None:
    """[MQTT-3.1.2-24] for packets other than PUBLISH: a DISCONNECT whose Reason String would
    make it too large goes without it ([MQTT-3.14.2-3]) and the connection closes; a
    CONNACK that cannot fit even so is not sent, and since nothing may precede a CONNACK
    ([MQTT-3.2.0-1]) the server just closes."""
    port = gw.port("mqtt")
    c = raw(port, "s09-disconnect", properties={"maximum_packet_size": 30})
    c.send_raw(frame(0x30, utf8("s09/t") + b"\x03\x23\x00\x00" + b"x"))  # Topic Alias 0
    d = c.expect_disconnect({0x94})
    assert "reason_string" not in d.properties
    assert len(c.after_connack()) <= 30
    tiny = raw(port)
    tiny.send(Connect("MQTT", 5, True, 0, "s09-tiny", None, None, None,
                      {"maximum_packet_size": 12}))
    assert tiny.wait_closed()
    assert bytes(tiny.raw_in) == b"", bytes(tiny.raw_in).hex()


# ------------------------------------- 10. Receive Maximum when in-flight messages are re-sent


def test_10_resending_keeps_to_the_new_receive_maximum(gw: GatewayThread,
                                                       raw: Callable[..., RawClient]) -> None:
    """[MQTT-3.3.4-9] on reconnect: the quota starts afresh with the new connection's
    Receive Maximum (4.9), so of four unacknowledged PUBLISHes from the earlier connection
    only two are re-sent at once ([MQTT-4.4.0-1], DUP set, original ids, in order); each
    PUBACK lets the next one go, and new messages follow only once there is room. A
    connection lost before all were re-sent leaves them for the next, topics whole."""
    port = gw.port("mqtt")
    cid = "s10"
    sub = raw(port, cid, properties={"session_expiry_interval": LONG,
                                     "topic_alias_maximum": 2})
    sub.subscribe(("s10/+", 1))
    pub = raw(port, "s10-pub")
    publish_all(pub, [(f"s10/{t}", b"%d" % i, 1) for i, t in enumerate("abab")])
    first = [sub.expect(Publish) for _ in range(4)]
    assert [m.topic for m in first] == ["s10/a", "s10/b", "", ""]
    sub.close()
    lost = raw(port, cid, clean=False, properties={"session_expiry_interval": LONG,
                                                   "receive_maximum": 2})
    got = [lost.expect(Publish) for _ in range(2)]
    assert lost.nothing(NOTHING), "more re-sent PUBLISHes than the Receive Maximum"
    assert [(m.payload, m.dup) for m in got] == [(b"0", True), (b"1", True)]
    lost.close()  # two never re-sent on this connection
    again = raw(port, cid, clean=False, properties={"session_expiry_interval": LONG,
                                                    "receive_maximum": 2})
    got = [again.expect(Publish) for _ in range(2)]
    assert again.nothing(NOTHING)
    assert [(m.topic, m.payload, m.packet_id, m.dup) for m in got] == [
        ("s10/a", b"0", first[0].packet_id, True), ("s10/b", b"1", first[1].packet_id, True)]
    publish_all(pub, [("s10/a", b"new", 1)])
    again.send(PubAck(got[0].packet_id))
    m = again.expect(Publish)
    assert (m.topic, m.payload, m.packet_id, m.dup) == (
        "s10/a", b"2", first[2].packet_id, True), m
    assert again.nothing(NOTHING)
    again.send(PubAck(got[1].packet_id))
    m = again.expect(Publish)
    assert (m.topic, m.payload, m.dup) == ("s10/b", b"3", True), m
    again.send(PubAck(m.packet_id))
    m = again.expect(Publish)
    assert (m.topic, m.payload, m.dup) == ("s10/a", b"new", False), m
