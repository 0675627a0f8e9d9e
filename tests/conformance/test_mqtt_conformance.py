"""Black-box MQTT 3.1.1 and 5.0 conformance scenarios against a live gateway on loopback.

How this works. A real gateway runs in a background thread (:class:`gw.GatewayThread`, one
per module where scenarios cannot disturb each other, one per test where they can: a
different ``users.conf``, a restart). Each scenario talks to it through
:class:`mqttclient.RawClient`, a blocking socket driven by the CLIENT side of the gateway's
own codec, and sends raw bytes wherever it has to break the protocol. Scenarios are numbered
after the conformance brief (``test_05b_...`` is the second check of scenario 5) and each
docstring names the normative statements it checks: MQTT 5.0 ids as in the OASIS standard's
Appendix B, 3.1.1 ids as in the 3.1.1 standard's Appendix B, the level marked where the
numbering differs. Client ids and topics carry the scenario number and protocol level, so
scenarios sharing a gateway never see each other's traffic.

"Nothing arrives" is checked with short waits (0.3-0.6 s); expected packets are waited for
up to 2 s. A scenario that finds a server bug is marked ``xfail(strict=True)`` with the
evidence in its reason, so it turns red the day the bug is fixed and the mark must go.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gw import GatewayThread
from mqttclient import RawClient, frame, raw_connect, raw_publish, utf8, varint

from adapters.mqtt.codec import encode_packet, encode_publish
from adapters.mqtt.packets import (
    ConnAck,
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
from gateway.message import Destination, Message

LEVELS = pytest.mark.parametrize("level", [4, 5], ids=["3.1.1", "5.0"])
CONNACK_OK_V3 = b"\x20\x02\x00\x00"  # 3.1.1 3.2: accepted, no session present
NOTHING = 0.5  # seconds to wait for "nothing arrives"

MakeClient = Callable[..., RawClient]


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    g = GatewayThread(tmp_path_factory.mktemp("conformance") / "gw").start()
    yield g
    g.stop()


@pytest.fixture(scope="module")
def auth_gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    g = GatewayThread(tmp_path_factory.mktemp("conformance-auth") / "gw",
                      gateway="authorization = enabled\nallow_anonymous = disabled\n",
                      users='dev:pw1:"a device"\n').start()
    yield g
    g.stop()


@pytest.fixture
def client(gw: GatewayThread) -> Iterator[MakeClient]:
    """``client(cid, level, **connect_kw)``: a connected RawClient (``cid=None``: not yet
    connected; ``port=`` another gateway's). Every client is closed after the test."""
    made: list[RawClient] = []

    def make(cid: str | None = None, level: int = 4, *, port: int | None = None,
             **kw: Any) -> RawClient:
        c = RawClient(port if port is not None else gw.port("mqtt"))
        made.append(c)
        if cid is not None:
            c.connect(cid, level, **kw)
        return c

    yield make
    for c in made:
        c.close()


def session_props(level: int, expiry: int = 300) -> dict[str, Any]:
    """CONNECT properties that make the session outlive the connection on MQTT 5."""
    return {"session_expiry_interval": expiry} if level >= 5 else {}


def connect_persistent(make: MakeClient, cid: str, level: int) -> RawClient:
    """Clean Session 0 (3.1.1) / Clean Start 0 with a Session Expiry Interval (5.0)."""
    return make(cid, level, clean=False, properties=session_props(level))


# ------------------------------------------------------------------ 1. CONNECT first and once


@pytest.mark.parametrize("first", [
    b"\xc0\x00",  # PINGREQ
    frame(0x30, utf8("t01/x") + b"payload"),  # PUBLISH QoS 0
    frame(0x82, b"\x00\x01" + utf8("t01/#") + b"\x00"),  # SUBSCRIBE
], ids=["pingreq", "publish", "subscribe"])
def test_01a_first_packet_not_connect_closes_without_connack(client: MakeClient,
                                                             first: bytes) -> None:
    """[MQTT-3.1.0-1]: the first packet must be CONNECT; anything else is a protocol error,
    so the server closes the connection (3.1.1 [MQTT-4.8.0-1]; 5.0 [MQTT-4.13.1-1]) and,
    having received no CONNECT, sends no CONNACK (a CONNACK is "sent by the Server in
    response to a CONNECT packet", 3.2 in both; 3.1.1 [MQTT-3.1.4-1] closes a CONNECT that
    does not conform "without sending a CONNACK")."""
    c = client()
    c.send_raw(first)
    assert c.wait_closed(), "connection left open after a non-CONNECT first packet"
    assert bytes(c.raw_in) == b"", f"server answered with {bytes(c.raw_in).hex()}"


@LEVELS
def test_01b_second_connect_closes(client: MakeClient, level: int) -> None:
    """[MQTT-3.1.0-2]: a second CONNECT is a protocol error and the server closes the
    connection; on 5.0 it first sends DISCONNECT 0x82 (Protocol Error, 4.13.1), on 3.1.1
    it just closes (3.1.1 has no server DISCONNECT)."""
    c = client(f"t01b-{level}", level)
    c.send_raw(raw_connect(f"t01b-{level}", level=level))
    if level >= 5:
        c.expect_disconnect({0x82})
        assert c.after_connack()[:1] == b"\xe0"
    else:
        assert c.wait_closed()
        assert bytes(c.raw_in) == CONNACK_OK_V3, bytes(c.raw_in).hex()


# ------------------------------------------------------------ 2. unsupported protocol version


@pytest.mark.parametrize("name,level,reply", [
    ("MQIsdp", 4, b"\x20\x02\x00\x01"),  # 3.1.1 format, return code 1
    ("MQTT", 3, b"\x20\x02\x00\x01"),
    ("MQTT", 2, b"\x20\x02\x00\x01"),  # below 3: still answered in the 3.1.1 format
    ("MQTT", 6, None),  # a level above 5: MQTT 5 format, reason 0x84
    ("MQIsdp", 5, None),
], ids=["4-MQIsdp", "3-MQTT", "2-MQTT", "6-MQTT", "5-MQIsdp"])
def test_02_unsupported_protocol_version(client: MakeClient, name: str, level: int,
                                         reply: bytes | None) -> None:
    """3.1.1 [MQTT-3.1.2-2]: an unsupported Protocol Level is answered with CONNACK return
    code 0x01 and the connection is closed. 5.0 [MQTT-3.1.2-2] (and [MQTT-3.1.2-1] for a
    wrong name): the server MAY send CONNACK 0x84 (Unsupported Protocol Version) and then
    MUST close. Byte-level: the 3.1.1 CONNACK is exactly ``20 02 00 01``; the 5.0 one has
    flags 0, reason 0x84 and a property length ([MQTT-3.2.2-6], [MQTT-2.2.2-1])."""
    c = client()
    if reply is None:
        c.set_level(5)  # so the codec parses the answer as an MQTT 5 CONNACK
    c.send_raw(raw_connect(f"t02-{level}", level=level, name=name))
    assert c.wait_closed(), "connection left open [MQTT-3.1.2-2]"
    raw = bytes(c.raw_in)
    if reply is not None:
        assert raw == reply, raw.hex()
    else:
        assert raw[:1] == b"\x20" and raw[2:4] == b"\x00\x84", raw.hex()
        ack = c.expect(ConnAck)  # the codec checks the MQTT 5 layout
        assert ack.reason_code == 0x84 and not ack.session_present


# ----------------------------------------------- 3. CONNECT reserved flag, empty client id


@LEVELS
def test_03a_connect_reserved_flag_closes(client: MakeClient, level: int) -> None:
    """[MQTT-3.1.2-3]: the server validates that the CONNECT reserved flag is 0 and closes
    the connection if not (5.0: a Malformed Packet, [MQTT-3.1.4-1], 4.13.1: a CONNACK 0x81
    MAY precede the close; 3.1.1 [MQTT-3.1.4-1]: close without a CONNACK)."""
    c = client()
    c.send_raw(raw_connect(f"t03a-{level}", level=level, flags=0x03))
    assert c.wait_closed()
    raw = bytes(c.raw_in)
    if level >= 5:
        assert raw == b"" or (raw[0] == 0x20 and raw[1] >= 3 and raw[3] == 0x81), raw.hex()
    else:
        assert raw == b"", raw.hex()


def test_03b_empty_client_id_without_clean_session_is_rejected_311(client: MakeClient) -> None:
    """3.1.1 [MQTT-3.1.3-8]: a zero-byte ClientId with CleanSession 0 gets CONNACK return
    code 0x02 (Identifier rejected), exactly ``20 02 00 02``, then the close
    ([MQTT-3.2.2-5])."""
    c = client()
    c.send_raw(raw_connect("", level=4, flags=0x00))
    assert c.wait_closed()
    assert bytes(c.raw_in) == b"\x20\x02\x00\x02", bytes(c.raw_in).hex()


@pytest.mark.parametrize("clean", [True, False], ids=["clean-start-1", "clean-start-0"])
def test_03c_empty_client_id_gets_assigned_identifier_v5(client: MakeClient,
                                                         clean: bool) -> None:
    """5.0 [MQTT-3.2.2-16] / [MQTT-3.1.3-6] / [MQTT-3.1.3-7]: a zero-length Client
    Identifier is answered with a CONNACK carrying an Assigned Client Identifier, new and not
    used by any other session; the connection then works as that client."""
    a = client("", 5, clean=clean)
    b = client("", 5, clean=clean)
    ida = a.connack.properties.get("assigned_client_identifier") if a.connack else None
    idb = b.connack.properties.get("assigned_client_identifier") if b.connack else None
    assert ida and idb and ida != idb
    a.subscribe((f"t03c/{int(clean)}", 1))
    a.publish(f"t03c/{int(clean)}", b"self", 1)
    got = [a.recv(), a.recv()]
    assert {type(p) for p in got} == {PubAck, Publish}, got


# ------------------------------------------------------------------------ 4. keepalive


@LEVELS
def test_04a_keepalive_timeout_closes_within_one_and_a_half_periods(client: MakeClient,
                                                                    level: int) -> None:
    """3.1.1 [MQTT-3.1.2-24] / 5.0 [MQTT-3.1.2-22]: with Keep Alive 1 s and no packet from
    the client, the server closes the connection after 1.5 s (measured here, allowing
    scheduling slack; never before the Keep Alive itself). On 5.0 the close is preceded by
    DISCONNECT 0x8D (Keep Alive timeout, 4.13); a 5.0 server without Server Keep Alive in
    its CONNACK uses the client's value ([MQTT-3.2.2-22])."""
    c = client(f"t04a-{level}", level, keepalive=1)
    t0 = time.monotonic()
    if level >= 5:
        assert c.connack is not None and "server_keep_alive" not in c.connack.properties
    assert c.wait_closed(timeout=4.0), "not closed 4 s after a 1 s keep alive"
    elapsed = time.monotonic() - t0
    assert 1.0 <= elapsed <= 2.25, f"closed after {elapsed:.3f} s, want about 1.5 s"
    if level >= 5:
        d = c.expect(Disconnect)
        assert d.reason_code == 0x8D
    else:
        assert bytes(c.raw_in) == CONNACK_OK_V3


@LEVELS
def test_04b_pingreq_is_answered_and_keeps_the_connection(client: MakeClient,
                                                         level: int) -> None:
    """[MQTT-3.12.4-1]: every PINGREQ is answered with PINGRESP (exactly ``d0 00``), and
    pings every 0.5 s keep a Keep Alive 1 s connection open past 1.5 s
    (3.1.1 [MQTT-3.1.2-24] / 5.0 [MQTT-3.1.2-22] count any control packet)."""
    c = client(f"t04b-{level}", level, keepalive=1)
    before = len(c.raw_in)
    for _ in range(5):  # 2.5 s in all
        time.sleep(0.5)
        c.send(PingReq())
        c.expect(PingResp)
    assert bytes(c.raw_in[before:]) == b"\xd0\x00" * 5
    assert not c.wait_closed(0.2), "closed although the client pinged every 0.5 s"


# ------------------------------------------------------ 5. malformed packets after CONNECT


# case -> (the offending packet for a protocol level, the reasons a 5.0 server may give).
# 0x81 where the spec calls the packet malformed (MQTT 5.0 4.13, 2.4); a wildcard Topic Name
# has no reason code in the spec, so Malformed Packet, Protocol Error and Topic Name invalid
# are all reasonable.
PID = b"\x00\x01"
MALFORMED: dict[str, tuple[Callable[[int], bytes], set[int]]] = {
    # MQTT 5.0 1.5.5 / 3.1.1 2.2.3: a Remaining Length has at most 4 bytes
    "remaining-length-5-bytes": (lambda lv: b"\x30\xff\xff\xff\xff\x7f", {0x81}),
    # [MQTT-3.3.1-4]; 5.0 3.3.1.2: "it is a Malformed Packet"
    "publish-qos-3": (lambda lv: raw_publish(b"t05/x", b"x", 0x36, lv, PID), {0x81}),
    # [MQTT-3.3.1-2], [MQTT-2.1.3-1]
    "qos0-with-dup": (lambda lv: raw_publish(b"t05/x", b"x", 0x38, lv), {0x81}),
    # [MQTT-3.8.1-1]: "MUST treat any other value as malformed"
    "subscribe-flags-0": (lambda lv: frame(0x80, PID + (b"\x00" if lv >= 5 else b"")
                                           + utf8("t05/#") + b"\x00"), {0x81}),
    # [MQTT-3.3.2-2], 5.0 [MQTT-4.7.0-1]
    "wildcard-plus-in-topic": (lambda lv: raw_publish(b"t05/+", b"x", 0x30, lv),
                               {0x81, 0x82, 0x90}),
    "wildcard-hash-in-topic": (lambda lv: raw_publish(b"t05/#", b"x", 0x30, lv),
                               {0x81, 0x82, 0x90}),
    # 5.0 [MQTT-1.5.4-1] "it is a Malformed Packet"; 3.1.1 [MQTT-1.5.3-1]
    "invalid-utf8-topic": (lambda lv: raw_publish(b"t05/\xff\xfe", b"x", 0x30, lv), {0x81}),
    # the same statements: no encoded U+D800..U+DFFF
    "surrogate-in-topic": (lambda lv: raw_publish(b"t05/\xed\xa0\x80", b"x", 0x30, lv),
                           {0x81}),
    # 5.0 [MQTT-1.5.4-2], [MQTT-4.7.3-2]; 3.1.1 [MQTT-1.5.3-2]
    "nul-in-topic": (lambda lv: raw_publish(b"t05/\x00x", b"x", 0x30, lv), {0x81}),
}


class Bystander:
    """Clients and messages that must come through another client's protocol error intact:
    a connected client, a retained message, and a QoS 1 message stored for an offline
    persistent session."""

    def __init__(self, make: MakeClient, level: int, tag: str) -> None:
        self.make, self.level, self.tag = make, level, tag
        self.base = f"t05/{tag}"
        keeper = connect_persistent(make, f"t05-keep-{tag}", level)
        keeper.subscribe((self.base + "/stored", 1))
        keeper.close()
        self.live = make(f"t05-by-{tag}", level)
        self.live.subscribe((self.base + "/live", 1))
        self.live.publish(self.base + "/kept", b"retained", 1, retain=True)
        self.live.expect(PubAck)
        self.live.publish(self.base + "/stored", b"stored", 1)
        self.live.expect(PubAck)

    def check(self) -> None:
        """Still working ([MQTT-4.13.1-1] closes only the offending connection)."""
        pid = self.live.publish(self.base + "/live", b"still here", 1)
        got = {type(p): p for p in (self.live.recv(), self.live.recv())}
        assert set(got) == {PubAck, Publish}, got
        assert got[PubAck].packet_id == pid and got[Publish].payload == b"still here"
        self.live.send(PubAck(got[Publish].packet_id))
        fresh = self.make(f"t05-fresh-{self.tag}", self.level)
        fresh.subscribe((self.base + "/kept", 1))
        m = fresh.expect(Publish)
        assert (m.payload, m.retain) == (b"retained", True)
        keeper = connect_persistent(self.make, f"t05-keep-{self.tag}", self.level)
        assert keeper.connack is not None and keeper.connack.session_present
        m = keeper.expect(Publish)
        assert m.payload == b"stored" and m.qos == 1


@LEVELS
@pytest.mark.parametrize("case", list(MALFORMED))
def test_05_malformed_packet_closes_only_that_connection(client: MakeClient, level: int,
                                                         case: str) -> None:
    """A malformed packet after CONNECT closes the connection: 3.1.1 [MQTT-4.8.0-1] (and per
    case [MQTT-2.2.2-2], [MQTT-3.3.1-4], [MQTT-3.8.1-1], [MQTT-1.5.3-1], [MQTT-1.5.3-2])
    with a plain close -- nothing after the CONNACK; 5.0 [MQTT-4.13.1-1] with DISCONNECT
    carrying the reason (4.13.1 SHOULD; 0x81 where the spec says Malformed Packet) and then
    the close. Other clients, a retained message and a message stored for an offline session
    are untouched."""
    tag = f"{case}-{level}"
    by = Bystander(client, level, tag)
    c = client(f"t05-bad-{tag}", level)
    packet, reasons = MALFORMED[case]
    c.send_raw(packet(level))
    if level >= 5:
        c.expect_disconnect(reasons)
    else:
        assert c.wait_closed(), "connection left open after a malformed packet"
        assert bytes(c.raw_in) == CONNACK_OK_V3, bytes(c.raw_in).hex()
    by.check()


# ---------------------------------------------------------------------- 6. oversized packet


@LEVELS
def test_06_oversized_packet_is_refused_on_its_header(client: MakeClient, level: int) -> None:
    """5.0 3.2.2.3.6: the CONNACK carries the server's Maximum Packet Size; a client must
    not exceed it ([MQTT-3.2.2-15]) and a larger packet is answered with DISCONNECT 0x95
    (Packet too large) and the close. The refusal must come on the fixed header alone: only
    the header and a few body bytes are sent, and the reply arrives before the rest would
    have been. 3.1.1 has no such property; the same limit closes the connection early."""
    probe = client(f"t06-probe-{level}", 5)
    assert probe.connack is not None
    limit = int(probe.connack.properties["maximum_packet_size"])
    c = client(f"t06-{level}", level)
    rl = limit  # 1 type byte + the length bytes + rl > limit
    head = bytes([0x30]) + varint(rl) + utf8("t06/big") + (b"\x00" if level >= 5 else b"")
    c.send_raw(head + b"x" * 64)
    t0 = time.monotonic()
    if level >= 5:
        d = c.expect(Disconnect, timeout=2.0)
        assert d.reason_code == 0x95
    assert c.wait_closed(2.0), "server still waiting for the body of an oversized packet"
    assert time.monotonic() - t0 < 2.0
    if level < 5:
        assert bytes(c.raw_in) == CONNACK_OK_V3


# ------------------------------------------------------------- 7. QoS 1 and 2 from a client


@LEVELS
def test_07a_qos1_puback_carries_the_packet_id(client: MakeClient, level: int) -> None:
    """3.1.1 [MQTT-4.3.2-2] / 5.0 [MQTT-4.3.2-4], [MQTT-2.2.1-5]: a QoS 1 PUBLISH is answered
    with PUBACK carrying the same Packet Identifier (3.1.1 bytes ``40 02 <id>``), and the
    message reaches the subscriber."""
    sub = client(f"t07a-sub-{level}", level)
    sub.subscribe((f"t07a/{level}", 1))
    pub = client(f"t07a-pub-{level}", level)
    for pid in (0x1234, 1, 0xFFFF):
        mark = len(pub.raw_in)
        pub.publish(f"t07a/{level}", b"%d" % pid, 1, packet_id=pid)
        ack = pub.expect(PubAck)
        assert ack.packet_id == pid and ack.reason_code == 0
        if level < 5:
            assert bytes(pub.raw_in[mark:]) == b"\x40\x02" + pid.to_bytes(2, "big")
        m = sub.expect(Publish)
        assert m.payload == b"%d" % pid
        sub.send(PubAck(m.packet_id))


@LEVELS
def test_07b_qos2_exactly_once_with_a_resent_publish(client: MakeClient, level: int) -> None:
    """QoS 2 receiver: PUBREC with the PUBLISH's id (5.0 [MQTT-4.3.3-8]; 3.1.1
    [MQTT-4.3.3-2]); a PUBLISH re-sent with DUP=1 before PUBREL is answered with PUBREC again
    but NOT delivered again (5.0 [MQTT-4.3.3-10]; 3.1.1 [MQTT-4.3.3-2]); PUBREL gets PUBCOMP
    with the same id (5.0 [MQTT-4.3.3-11]); after PUBCOMP the id starts a new message (5.0
    [MQTT-4.3.3-12]). 3.1.1 bytes: PUBREC ``50 02 00 07``, PUBCOMP ``70 02 00 07``."""
    topic = f"t07b/{level}"
    sub = client(f"t07b-sub-{level}", level)
    sub.subscribe((topic, 2))
    pub = client(f"t07b-pub-{level}", level)
    mark = len(pub.raw_in)
    pub.publish(topic, b"once", 2, packet_id=7)
    assert pub.expect(PubRec).packet_id == 7
    pub.publish(topic, b"once", 2, packet_id=7, dup=True)
    assert pub.expect(PubRec).packet_id == 7
    pub.send(PubRel(7))
    assert pub.expect(PubComp).packet_id == 7
    if level < 5:
        assert bytes(pub.raw_in[mark:]) == b"\x50\x02\x00\x07" * 2 + b"\x70\x02\x00\x07"
    got = sub.drain(NOTHING)
    assert [m.payload for m in got if isinstance(m, Publish)] == [b"once"], got
    pub.publish(topic, b"next", 2, packet_id=7)
    assert pub.expect(PubRec).packet_id == 7
    pub.send(PubRel(7))
    assert pub.expect(PubComp).packet_id == 7
    assert sub.expect(Publish).payload == b"next"


@LEVELS
def test_07c_acknowledgements_in_publish_order(client: MakeClient, level: int) -> None:
    """[MQTT-4.6.0-2] / [MQTT-4.6.0-3] (both levels state them for the Client as receiver;
    the gateway keeps them as receiver too): PUBACK and PUBREC come in the order the PUBLISH
    packets came -- here a mixed batch of QoS 0, 1 and 2 in one TCP write -- and QoS 0 gets
    no acknowledgement."""
    pub = client(f"t07c-{level}", level)
    sub = client(f"t07c-sub-{level}", level)
    sub.subscribe((f"t07c/{level}/#", 1))
    batch = [(1, 40), (2, 9), (0, None), (1, 3), (2, 65000), (1, 1), (0, None), (2, 2)]
    data = b"".join(encode_publish(f"t07c/{level}/{i}", b"p", q, False, False, pid, {}, level)
                    for i, (q, pid) in enumerate(batch))
    pub.send_raw(data)
    acks = [pub.expect(PubRec if q == 2 else PubAck) for q, _ in batch if q]
    assert [a.packet_id for a in acks] == [pid for q, pid in batch if q]
    assert pub.nothing(0.3)


@LEVELS
def test_07c2_acknowledgements_in_order_when_the_publishes_are_stored(client: MakeClient,
                                                                     level: int) -> None:
    """[MQTT-4.6.0-2] / [MQTT-4.6.0-3] with a persistent session subscribed: each QoS 1 / 2
    publish is stored, its acknowledgement waits for the group commit, and one commit
    confirms many at once; they still come in the order the PUBLISH packets came."""
    sub = connect_persistent(client, f"t07c2-sub-{level}", level)
    sub.subscribe((f"t07c2/{level}/#", 1))
    pub = client(f"t07c2-{level}", level)
    batch = [(1 + i % 2, 1000 + i * 7) for i in range(120)]
    data = b"".join(encode_publish(f"t07c2/{level}/{i}", b"p", q, False, False, pid, {}, level)
                    for i, (q, pid) in enumerate(batch))
    pub.send_raw(data)
    acks = [pub.expect(PubRec if q == 2 else PubAck) for q, _ in batch]
    assert [a.packet_id for a in acks] == [pid for _, pid in batch]
    assert pub.nothing(0.3)


@LEVELS
def test_07d_qos2_resent_after_reconnect_is_not_delivered_twice(client: MakeClient,
                                                               level: int) -> None:
    """5.0 [MQTT-4.3.3-10] / 3.1.1 [MQTT-4.3.3-2] across a reconnect: a client that lost the
    connection after its QoS 2 PUBLISH re-sends it with DUP=1 on the resumed session
    ([MQTT-4.4.0-1]); the server answers PUBREC and does not deliver it a second time."""
    topic = f"t07d/{level}"
    sub = client(f"t07d-sub-{level}", level)
    sub.subscribe((topic, 2))
    pub = connect_persistent(client, f"t07d-pub-{level}", level)
    pub.publish(topic, b"once", 2, packet_id=5)
    assert pub.expect(PubRec).packet_id == 5
    pub.close()
    pub = connect_persistent(client, f"t07d-pub-{level}", level)
    assert pub.connack is not None and pub.connack.session_present
    pub.publish(topic, b"once", 2, packet_id=5, dup=True)
    assert pub.expect(PubRec).packet_id == 5
    pub.send(PubRel(5))
    assert pub.expect(PubComp).packet_id == 5
    got = sub.drain(NOTHING)
    assert [m.payload for m in got if isinstance(m, Publish)] == [b"once"], got


# ------------------------------------------------------- 8. QoS 1 and 2 to a client, resumed


def deliver_unacked(make: MakeClient, level: int, tag: str, qos: int) -> tuple[str, int]:
    """A persistent subscriber that acknowledges one message and leaves the next one
    unacknowledged (so its packet id is not 1); returns (client id, that packet id)."""
    cid, topic = f"t08-{tag}-{level}", f"t08/{tag}/{level}"
    sub = connect_persistent(make, cid, level)
    sub.subscribe((topic, qos))
    pub = make(f"t08-{tag}-pub-{level}", level)
    pub.publish(topic, b"first", 1)
    pub.expect(PubAck)
    first = sub.expect(Publish)
    sub.send(PubAck(first.packet_id))
    ppid = pub.publish(topic, b"second", qos)
    pub.expect(PubRec if qos == 2 else PubAck)
    if qos == 2:
        pub.send(PubRel(ppid or 0))
        pub.expect(PubComp)
    second = sub.expect(Publish)
    assert second.payload == b"second" and not second.dup
    assert second.packet_id != first.packet_id
    if qos == 2:
        sub.send(PubRec(second.packet_id))
        rel = sub.expect(PubRel)
        assert rel.packet_id == second.packet_id  # 5.0 [MQTT-4.3.3-4]
    sub.close()
    return cid, second.packet_id


@LEVELS
def test_08a_unacknowledged_qos1_is_resent_with_same_id_and_dup(client: MakeClient,
                                                               level: int) -> None:
    """[MQTT-4.4.0-1]: on reconnect with Clean Session 0 (5.0: Clean Start 0, Session Expiry
    > 0) and Session Present 1 (3.1.1 [MQTT-3.2.2-2]; 5.0 [MQTT-3.2.2-3]) the server
    re-sends the unacknowledged QoS 1 PUBLISH with its original Packet Identifier and DUP=1
    ([MQTT-3.3.1-1]) -- once, not also as a new delivery; once acknowledged it is never
    re-sent again."""
    cid, pid = deliver_unacked(client, level, "q1", 1)
    sub = connect_persistent(client, cid, level)
    assert sub.connack is not None and sub.connack.session_present
    m = sub.expect(Publish)
    assert (m.payload, m.packet_id, m.dup, m.qos) == (b"second", pid, True, 1)
    assert sub.nothing(NOTHING), f"more after the re-send: {list(sub.packets)}"
    sub.send(PubAck(pid))
    sub.close()
    again = connect_persistent(client, cid, level)
    assert again.nothing(NOTHING), f"re-sent after PUBACK: {list(again.packets)}"


@LEVELS
def test_08b_pubrel_is_resent_after_pubrec(client: MakeClient, level: int) -> None:
    """[MQTT-4.4.0-1] for QoS 2 past PUBREC: the subscriber sent PUBREC and left before
    PUBCOMP; on reconnect the server re-sends the PUBREL with the same id and NOT the
    PUBLISH (5.0 [MQTT-4.3.3-6]); PUBCOMP ends the exchange."""
    cid, pid = deliver_unacked(client, level, "q2", 2)
    sub = connect_persistent(client, cid, level)
    rel = sub.expect(PubRel)
    assert rel.packet_id == pid
    assert sub.nothing(NOTHING), f"more after the PUBREL: {list(sub.packets)}"
    sub.send(PubComp(pid))
    sub.close()
    again = connect_persistent(client, cid, level)
    assert again.nothing(NOTHING), f"re-sent after PUBCOMP: {list(again.packets)}"


@pytest.fixture
def restart_gw(tmp_path: Path) -> Iterator[GatewayThread]:
    g = GatewayThread(tmp_path / "gw").start()
    yield g
    g.stop()


@LEVELS
@pytest.mark.parametrize("qos", [1, 2], ids=["qos1", "qos2"])
def test_08c_inflight_survives_a_gateway_restart(restart_gw: GatewayThread, client: MakeClient,
                                                 level: int, qos: int) -> None:
    """[MQTT-4.4.0-1] with the gateway restarted in between (it keeps persistent sessions
    and their messages across restarts, [MQTT-3.1.2-4] 3.1.1 / [MQTT-3.1.2-23] 5.0): the
    unacknowledged QoS 1 PUBLISH is re-sent with its original id and DUP=1
    ([MQTT-3.3.1-1]); the PUBREL of the QoS 2 message past PUBREC is re-sent."""

    def make(*args: Any, **kw: Any) -> RawClient:
        return client(*args, port=restart_gw.port("mqtt"), **kw)  # the port after a restart

    cid, pid = deliver_unacked(make, level, f"r{qos}", qos)
    restart_gw.restart()
    sub = connect_persistent(make, cid, level)
    assert sub.connack is not None and sub.connack.session_present
    if qos == 1:
        m = sub.expect(Publish)
        assert (m.payload, m.packet_id, m.dup) == (b"second", pid, True), m
    else:
        assert sub.expect(PubRel).packet_id == pid


# ---------------------------------------------------------------------- 9. subscriptions


@LEVELS
def test_09a_suback_reason_code_per_filter_in_order(client: MakeClient, level: int) -> None:
    """A SUBACK has one code per filter in the SUBSCRIBE's order (5.0 [MQTT-3.8.4-6],
    [MQTT-3.9.3-1]; 3.1.1 [MQTT-3.8.4-5], [MQTT-3.9.3-1]) granting the requested QoS
    ([MQTT-3.8.4-7]), and an invalid filter fails alone: ``a/#/b``, ``a+``, ``b#`` and the
    empty filter break [MQTT-4.7.1-1], [MQTT-4.7.1-2], [MQTT-4.7.3-1] -- 0x8F (Topic Filter
    invalid) on 5.0, 0x80 on 3.1.1 ([MQTT-3.8.4-4]/[MQTT-3.8.4-5]: handled as separate
    SUBSCRIBEs). The valid ones really subscribe."""
    b = f"t09a/{level}"
    filters = [(f"{b}/+", 1), (f"{b}/#/x", 0), (f"{b}+", 2), (f"{b}/#", 2), ("", 0),
               (f"{b}/x", 0), (f"{b}/b#", 1)]
    c = client(f"t09a-{level}", level)
    mark = len(c.raw_in)
    ack = c.subscribe(*filters)
    fail = 0x8F if level >= 5 else 0x80
    want = [1, fail, fail, 2, fail, 0, fail]
    assert list(ack.reason_codes) == want
    if level < 5:
        assert bytes(c.raw_in[mark:]) == b"\x90\x09" + ack.packet_id.to_bytes(2, "big") + bytes(
            want)
    p = client(f"t09a-pub-{level}", level)
    p.publish(f"{b}/x", b"hit", 2)
    p.expect(PubRec)
    got = sorted(m.qos for m in c.drain(NOTHING) if isinstance(m, Publish))
    assert got == [2], got  # one copy for the matching valid subscriptions, at the highest QoS


@LEVELS
def test_09b_overlapping_subscriptions_respect_the_maximum_qos(client: MakeClient,
                                                              level: int) -> None:
    """Overlapping subscriptions: the message is delivered respecting the maximum QoS of
    all matching subscriptions (3.1.1 [MQTT-3.3.5-1]; 5.0 [MQTT-3.3.4-2]); the gateway sends
    one copy (further copies are allowed, each at most its subscription's QoS, 5.0
    [MQTT-3.8.4-8]); a message published at QoS 1 to a QoS 0-only subscriber arrives at
    QoS 0."""
    b = f"t09b/{level}"
    c = client(f"t09b-{level}", level)
    assert list(c.subscribe((f"{b}/+", 0), (f"{b}/#", 2)).reason_codes) == [0, 2]
    p = client(f"t09b-pub-{level}", level)
    p.publish(f"{b}/x", b"ov", 2)
    p.expect(PubRec)
    got = [m for m in c.drain(NOTHING) if isinstance(m, Publish)]
    assert [m.qos for m in got] == [2], got
    for m in got:
        if m.qos == 2:
            c.send(PubRec(m.packet_id))
    low = client(f"t09b-low-{level}", level)
    low.subscribe((f"{b}/low", 0))
    p.publish(f"{b}/low", b"down", 1)
    p.expect(PubAck)
    m = low.expect(Publish)
    assert (m.qos, m.packet_id) == (0, None)


@LEVELS
def test_09c_unsubscribe_known_and_unknown_filters(client: MakeClient, level: int) -> None:
    """UNSUBSCRIBE is always answered with UNSUBACK carrying its packet id (5.0
    [MQTT-3.10.4-4], [MQTT-3.10.4-5]; 3.1.1 [MQTT-3.10.4-4], [MQTT-3.10.4-5]: exactly
    ``b0 02 <id>``); 5.0 gives one reason per filter in order ([MQTT-3.11.3-1]): 0x11 (No
    subscription existed) for an unknown filter, 0x00 for a deleted one. After it no new
    message is delivered for the filter ([MQTT-3.10.4-2])."""
    t = f"t09c/{level}"
    c = client(f"t09c-{level}", level)
    c.subscribe((t, 1))
    mark = len(c.raw_in)
    ack = c.unsubscribe(f"{t}/unknown", t)
    if level >= 5:
        assert list(ack.reason_codes) == [0x11, 0x00]
    else:
        assert bytes(c.raw_in[mark:]) == b"\xb0\x02" + ack.packet_id.to_bytes(2, "big")
    p = client(f"t09c-pub-{level}", level)
    p.publish(t, b"gone", 1)
    p.expect(PubAck)
    assert c.nothing(NOTHING)


# --------------------------------------------------------------------------- 10. retained


@LEVELS
def test_10_retained_messages(client: MakeClient, level: int) -> None:
    """Retained messages: an existing subscriber gets the publish live with RETAIN 0 (3.1.1
    [MQTT-3.3.1-9]; 5.0 [MQTT-3.3.1-12], Retain As Published 0); a new subscription gets the
    retained message with RETAIN 1 (3.1.1 [MQTT-3.3.1-6], [MQTT-3.3.1-8]; 5.0
    [MQTT-3.3.1-9], 3.3.1.3); a zero-length retained publish is delivered as normal and
    removes it, so the next new subscriber gets nothing (3.1.1 [MQTT-3.3.1-10],
    [MQTT-3.3.1-11]; 5.0 [MQTT-3.3.1-6], [MQTT-3.3.1-7])."""
    t = f"t10/{level}/dev"
    live = client(f"t10-live-{level}", level)
    live.subscribe((t, 1))
    pub = client(f"t10-pub-{level}", level)
    pub.publish(t, b"online", 1, retain=True)
    pub.expect(PubAck)
    m = live.expect(Publish)
    assert (m.payload, m.retain) == (b"online", False)
    live.send(PubAck(m.packet_id))
    new = client(f"t10-new-{level}", level)
    new.subscribe((f"t10/{level}/+", 1))
    m = new.expect(Publish)
    assert (m.topic, m.payload, m.retain) == (t, b"online", True)
    new.send(PubAck(m.packet_id))
    pub.publish(t, b"", 1, retain=True)
    pub.expect(PubAck)
    m = live.expect(Publish)
    assert (m.payload, m.retain) == (b"", False)
    later = client(f"t10-later-{level}", level)
    later.subscribe((f"t10/{level}/#", 1))
    assert later.nothing(NOTHING), f"retained message not cleared: {list(later.packets)}"


# ------------------------------------------------------------------------- 11. $ topics


@LEVELS
def test_11_wildcards_do_not_match_dollar_topics(gw: GatewayThread, client: MakeClient,
                                                level: int) -> None:
    """[MQTT-4.7.2-1]: filters starting with a wildcard (``#``, ``+/x``) do not match topic
    names starting with ``$``; ``$SYS/#`` does. Clients cannot publish to ``$`` topics, so
    the message is published on the subject ``$SYS.t11.x`` through the in-process API by an
    INTERNAL core connection (server-created names may start with ``$``)."""
    wild = client(f"t11-wild-{level}", level)
    wild.subscribe(("#", 0), ("+/t11/x", 0), ("+/+/+", 0))
    sys_sub = client(f"t11-sys-{level}", level)
    sys_sub.subscribe(("$SYS/#", 0))

    def publish_sys() -> None:
        conn = gw.broker.connect(kind="INTERNAL")
        try:
            conn.session().send(Message.text(f"up {level}"), Destination.topic("$SYS.t11.x"))
        finally:
            conn.close()

    gw.call(publish_sys)
    m = sys_sub.expect(Publish)
    assert (m.topic, m.payload) == ("$SYS/t11/x", f"up {level}".encode())
    got = [p for p in wild.drain(NOTHING) if isinstance(p, Publish) and p.topic.startswith("$")]
    assert got == [], got


# ----------------------------------------------------------------- 12-14. MQTT 5 limits


def test_12_receive_maximum_limits_unacknowledged_publishes(client: MakeClient) -> None:
    """5.0 [MQTT-3.3.4-9] (and 4.9 [MQTT-4.9.0-2]): with Receive Maximum 2 the server has at
    most 2 unacknowledged QoS 1/2 PUBLISHes out; each PUBACK (or PUBACK/PUBREC >= 0x80)
    frees one slot; a QoS 2 slot is freed by PUBCOMP, not by PUBREC. Ids in flight are
    distinct ([MQTT-2.2.1-4]) and other packets still flow ([MQTT-3.3.4-10])."""
    sub = client("t12", 5, properties={"receive_maximum": 2})
    sub.subscribe(("t12/q1", 1), ("t12/q2", 2))
    pub = client("t12-pub", 5)
    for i in range(5):
        pub.publish("t12/q1", b"%d" % i, 1)
    assert len([pub.expect(PubAck) for _ in range(5)]) == 5
    first = [sub.expect(Publish), sub.expect(Publish)]
    assert sub.nothing(NOTHING), "a third PUBLISH beyond Receive Maximum 2"
    assert first[0].packet_id != first[1].packet_id
    sub.send(PingReq())
    sub.expect(PingResp)
    sub.send(PubAck(first[0].packet_id))
    third = sub.expect(Publish)
    assert sub.nothing(0.3)
    sub.send(PubAck(first[1].packet_id, 0x80))  # a refusal also ends the exchange
    fourth = sub.expect(Publish)
    assert sub.nothing(0.3)
    sub.send(PubAck(third.packet_id))
    sub.send(PubAck(fourth.packet_id))
    fifth = sub.expect(Publish)
    sub.send(PubAck(fifth.packet_id))
    assert [m.payload for m in (*first, third, fourth, fifth)] == [b"%d" % i for i in range(5)]
    for i in range(3):
        pub.publish("t12/q2", b"q2-%d" % i, 2)
        pub.expect(PubRec)
    a, b = sub.expect(Publish), sub.expect(Publish)
    assert sub.nothing(0.3)
    sub.send(PubRec(a.packet_id))
    assert sub.expect(PubRel).packet_id == a.packet_id
    assert sub.nothing(0.3), "PUBREC freed a Receive Maximum slot; only PUBCOMP does"
    sub.send(PubComp(a.packet_id))
    c = sub.expect(Publish)
    assert [a.payload, b.payload, c.payload] == [b"q2-0", b"q2-1", b"q2-2"]


def test_13_messages_over_the_client_maximum_packet_size_are_dropped(
        client: MakeClient) -> None:
    """5.0 [MQTT-3.1.2-24]: no packet larger than the client's Maximum Packet Size is sent;
    [MQTT-3.1.2-25]: it is discarded and the server behaves as if it had completed sending
    it -- so with Receive Maximum 1 the dropped QoS 1 message holds no slot and the small
    one after it arrives without any acknowledgement."""
    sub = client("t13", 5, properties={"maximum_packet_size": 128, "receive_maximum": 1})
    sub.subscribe(("t13/t", 1))
    pub = client("t13-pub", 5)
    for payload, qos in ((b"x" * 400, 1), (b"y" * 400, 0), (b"small", 1)):
        pub.publish("t13/t", payload, qos)
        if qos:
            pub.expect(PubAck)
    m = sub.expect(Publish)
    assert m.payload == b"small"
    assert sub.nothing(NOTHING)
    assert len(sub.raw_in) < 400, "a 400-byte message reached the client"


def test_14_topic_alias_out_of_range_is_a_protocol_error(client: MakeClient) -> None:
    """5.0: a Topic Alias of 0 ([MQTT-3.3.2-8]) or above the server's Topic Alias Maximum
    from the CONNACK ([MQTT-3.2.2-17], [MQTT-3.3.2-9]) is answered with DISCONNECT 0x94
    (Topic Alias invalid, 3.3.2.3.4) and the close; every alias from 1 to the maximum is
    accepted ([MQTT-3.3.2-12]) and then stands for its topic."""
    ok = client("t14-ok", 5)
    assert ok.connack is not None
    top = int(ok.connack.properties.get("topic_alias_maximum", 0))
    assert top > 0
    sub = client("t14-sub", 5)
    sub.subscribe(("t14/#", 0))
    ok.publish("t14/long/name", b"1", 0, properties={"topic_alias": top})
    ok.send_raw(frame(0x30, utf8("") + b"\x03\x23" + top.to_bytes(2, "big") + b"2"))
    got = [sub.expect(Publish), sub.expect(Publish)]
    assert [(m.topic, m.payload) for m in got] == [("t14/long/name", b"1"),
                                                  ("t14/long/name", b"2")]
    for alias in (0, top + 1):
        c = client(f"t14-bad-{alias}", 5)
        c.send_raw(frame(0x30, utf8("t14/x") + b"\x03\x23" + alias.to_bytes(2, "big") + b"x"))
        c.expect_disconnect({0x94})
    assert sub.nothing(0.3)


# --------------------------------------------------------------------- 15. authentication


@LEVELS
@pytest.mark.parametrize("user,password,v3,v5", [
    ("dev", b"wrong", 0x04, 0x86),
    ("nobody", b"pw1", 0x04, 0x86),
    (None, None, 0x05, 0x87),
], ids=["wrong-password", "unknown-user", "anonymous"])
def test_15_authentication_refusals(auth_gw: GatewayThread, client: MakeClient, level: int,
                                    user: str | None, password: bytes | None, v3: int,
                                    v5: int) -> None:
    """users.conf authentication: bad credentials get CONNACK 0x04 (3.1.1) / 0x86 (5.0, Bad
    User Name or Password); anonymous when not allowed 0x05 / 0x87 (Not authorized); Session
    Present 0 (3.1.1 [MQTT-3.2.2-4]; 5.0 [MQTT-3.2.2-6]) and the close (3.1.1 [MQTT-3.2.2-5];
    5.0 [MQTT-3.2.2-7], [MQTT-3.1.4-2]). A PUBLISH pipelined after the refused CONNECT is
    not processed (3.1.1 [MQTT-3.1.4-5]; 5.0 [MQTT-3.1.4-6]). Good credentials connect."""
    port = auth_gw.port("mqtt")
    watcher = client(f"t15-w-{level}", level, port=port, username="dev", password=b"pw1")
    watcher.subscribe((f"t15/{level}/#", 0))
    c = client(port=port)
    c.set_level(level)
    connect = encode_packet(Connect("MQTT", level, True, 0, f"t15-{level}", None, user,
                                    password, {}), level)
    leak = encode_publish(f"t15/{level}/leak", b"leak", 0, False, False, None, {}, level)
    c.send_raw(connect + leak)
    ack = c.expect(ConnAck)
    assert c.wait_closed()
    raw = bytes(c.raw_in)
    if level >= 5:
        assert ack.reason_code == v5 and not ack.session_present
        assert raw[2:4] == bytes([0, v5]), raw.hex()
    else:
        assert raw == bytes([0x20, 0x02, 0x00, v3]), raw.hex()
    assert watcher.nothing(NOTHING), "data after a refused CONNECT was processed"


# --------------------------------------------------------------- 16. DISCONNECT and will


@pytest.mark.parametrize("level,reason,published", [
    (5, 0x04, True),
    (5, 0x00, False),
    (4, 0x00, False),
], ids=["5.0-0x04-with-will", "5.0-0x00-normal", "3.1.1-normal"])
def test_16a_disconnect_reason_decides_the_will(client: MakeClient, level: int, reason: int,
                                               published: bool) -> None:
    """5.0 3.14.2.1: DISCONNECT 0x04 (Disconnect with Will Message) publishes the will;
    DISCONNECT 0x00 discards it (5.0 [MQTT-3.14.4-3], [MQTT-3.1.2-10]); on 3.1.1 DISCONNECT
    always discards it ([MQTT-3.14.4-3], [MQTT-3.1.2-10]). Either way the server closes."""
    t = f"t16a/{level}/{reason}"
    watcher = client(f"t16a-w-{level}-{reason}", 5)
    watcher.subscribe((t, 1))
    c = client(f"t16a-{level}-{reason}", level, will=Will(t, b"gone", 1))
    c.send(Disconnect(reason))
    assert c.wait_closed()
    if published:
        m = watcher.expect(Publish)
        assert (m.topic, m.payload) == (t, b"gone")
    else:
        assert watcher.nothing(NOTHING)


def test_16b_session_expiry_set_on_disconnect_after_zero_is_a_protocol_error(
        client: MakeClient) -> None:
    """5.0 3.14.2.2.2: if CONNECT had Session Expiry Interval 0, a non-zero one in the
    client's DISCONNECT is a Protocol Error: not a valid DISCONNECT, answered with
    DISCONNECT 0x82 and the close (4.13). (The statement id [MQTT-3.14.2-2] belongs to the
    neighbouring server-side rule: no Session Expiry Interval in a server's DISCONNECT,
    checked here too.) Being no valid DISCONNECT, it does not discard the will
    ([MQTT-3.1.2-8]): the will is published."""
    watcher = client("t16b-w", 5)
    watcher.subscribe(("t16b/will", 0))
    c = client("t16b", 5, will=Will("t16b/will", b"abnormal", 0))
    c.send(Disconnect(0x00, {"session_expiry_interval": 30}))
    d = c.expect_disconnect({0x82})
    assert "session_expiry_interval" not in d.properties
    m = watcher.expect(Publish)
    assert m.payload == b"abnormal"
    again = client("t16b", 5, clean=False)
    assert again.connack is not None and not again.connack.session_present
