"""The sans-I/O MQTT client session (transports/mqtt_session.py), in memory.

The session is driven against the MQTT adapter's own server codec (``MqttCodec(SERVER)``,
bytes from one fed to the other) and against server byte sequences written by hand from the
packet layouts of OASIS MQTT 3.1.1 and 5.0 chapter 3. Time is a number passed to ``tick``.
The last test is the codec differential: every packet type both codec sides send, encoded by
one side, parses on the other into a packet that side encodes to the same bytes.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mqtt.test_codec_fuzz import packet_ids, properties, publishes, reasons
from mqtt.test_vectors import h

from adapters.mqtt.codec import CLIENT, SERVER, MqttCodec
from adapters.mqtt.packets import (
    AUTH,
    DISCONNECT,
    Auth,
    Connect,
    Disconnect,
    MqttLocalProtocolError,
    Packet,
    PingReq,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Subscribe,
    SubscriptionOptions,
    Unsubscribe,
    Will,
)
from adapters.mqtt.packets import ReasonCode as R
from transports.mqtt_session import (
    CONNECTED,
    DISCONNECTED,
    Abandoned,
    ClientSession,
    Closed,
    Connected,
    Event,
    MessageReceived,
    Published,
    Subscribed,
    Unsubscribed,
)


class Link:
    """A client session and the adapter's server codec, wired back to back in memory."""

    def __init__(self, level: int = 4, **kwargs: object) -> None:
        self.session = ClientSession("c1", protocol_level=level, **kwargs)  # type: ignore[arg-type]
        self.server = MqttCodec(SERVER)

    def to_server(self) -> list[Packet]:
        self.server.receive_data(self.session.data_to_send())
        return self.server.events_received()

    def to_client(self) -> list[Event]:
        self.session.receive_data(self.server.data_to_send())
        return self.session.events_received()

    def open(self, now: float = 0.0, session_present: bool = False,
             props: dict[str, object] | None = None) -> list[Event]:
        """(Re)connect: a fresh server codec reads the CONNECT and accepts it."""
        self.server = MqttCodec(SERVER)
        self.session.connect(now)
        [connect] = self.to_server()
        assert isinstance(connect, Connect)
        self.server.send_connack(session_present, R.SUCCESS, props)
        return self.to_client()


def kinds(events: list[Event]) -> list[str]:
    return [type(e).__name__ for e in events]


# ------------------------------------------------------------------------- CONNECT/CONNACK


def test_connect_311_bytes_and_connack():
    will = Will("w", b"x", 1, True)
    s = ClientSession("c1", keepalive=60, will=will, username="u", password=b"p")
    s.connect(0.0)
    assert s.data_to_send() == h("""
        10 1a | 00 04 4d 51 54 54 | 04 | ee | 00 3c   # MQTT level 4, flags: user pw willretain
        00 02 63 31 | 00 01 77 | 00 01 78 | 00 01 75 | 00 01 70""")  # qos1 will clean
    assert s.events_received() == []
    s.receive_data(h("20 02 00 00"))
    [ev] = s.events_received()
    assert isinstance(ev, Connected) and ev.session_present is False
    assert s.state is CONNECTED


def test_connect_v5_properties_and_connack_limits():
    s = ClientSession("c1", protocol_level=5, clean_start=False, session_expiry=3600,
                      receive_maximum=20, maximum_packet_size=65536)
    s.connect(0.0)
    assert s.data_to_send() == h("""
        10 1c | 00 04 4d 51 54 54 | 05 | 00 | 00 3c
        0d | 11 00 00 0e 10 | 21 00 14 | 27 00 01 00 00   # expiry 3600, recv max 20, 64 KiB
        00 02 63 31""")
    # CONNACK: assigned client id "abc", Server Keep Alive 10, Receive Maximum 2,
    # Maximum Packet Size 64 (MQTT 5.0 3.2.2.3).
    s.receive_data(h("20 14 00 00 11 | 12 00 03 61 62 63 | 13 00 0a | 21 00 02 | 27 00 00 00 40"))
    [ev] = s.events_received()
    assert isinstance(ev, Connected)
    assert ev.properties["assigned_client_identifier"] == "abc"
    assert (s.client_id, s.server_keepalive, s.window) == ("abc", 10, 2)
    with pytest.raises(MqttLocalProtocolError) as info:
        s.publish("t", b"x" * 64, 1, token="big")
    assert info.value.reason_code == R.PACKET_TOO_LARGE
    assert s.inflight == 0 and s.data_to_send() == b""  # nothing kept, nothing sent


def test_connect_through_the_server_codec_carries_every_field():
    link = Link(5, clean_start=False, session_expiry=60, receive_maximum=5,
                will=Will("dev/gone", b"bye", 2, False, {"will_delay_interval": 5}),
                username="user", password=b"secret",
                properties={"user_property": [("k", "v")]})
    link.session.connect(0.0)
    [connect] = link.to_server()
    assert connect == Connect("MQTT", 5, False, 60, "c1", link.session.will, "user", b"secret",
                              {"user_property": [("k", "v")], "session_expiry_interval": 60,
                               "receive_maximum": 5, "maximum_packet_size": 1024 * 1024})
    assert "topic_alias_maximum" not in connect.properties  # absent: 0 [MQTT-3.1.2-27]


@pytest.mark.parametrize(("level", "connack", "code"), [
    (4, "20 02 00 05", R.NOT_AUTHORIZED),
    (4, "20 02 00 02", R.CLIENT_IDENTIFIER_NOT_VALID),
    (5, "20 03 00 87 00", R.NOT_AUTHORIZED),
    (5, "20 03 00 8a 00", R.BANNED),
])
def test_connack_refusal_closes(level, connack, code):
    s = ClientSession("c1", protocol_level=level)
    s.connect(0.0)
    s.data_to_send()
    s.receive_data(h(connack))
    [ev] = s.events_received()
    assert isinstance(ev, Closed) and ev.by_server and ev.reason_code == code
    assert s.state is DISCONNECTED
    with pytest.raises(MqttLocalProtocolError):
        s.publish("t", b"", 0)


def test_session_present_after_clean_start_is_a_protocol_error():
    s = ClientSession("c1", protocol_level=5)
    s.connect(0.0)
    s.data_to_send()
    s.receive_data(h("20 03 01 00 00"))
    [ev] = s.events_received()
    assert isinstance(ev, Closed) and ev.reason_code == R.PROTOCOL_ERROR
    assert s.state is DISCONNECTED


def test_no_connack_in_time_closes():
    s = ClientSession("c1", connect_timeout=10.0)
    s.connect(100.0)
    s.tick(109.0)
    assert s.events_received() == []
    s.tick(110.0)
    [ev] = s.events_received()
    assert isinstance(ev, Closed) and "CONNACK" in ev.reason


# ------------------------------------------------------------------------ SUBSCRIBE


@pytest.mark.parametrize("level", [4, 5])
def test_subscribe_and_unsubscribe(level):
    link = Link(level)
    link.open()
    subs = [("a/+", SubscriptionOptions(1)), ("b/#", SubscriptionOptions(2))]
    pid = link.session.subscribe(subs)
    assert link.to_server() == [Subscribe(pid, subs)]
    link.server.send_suback(pid, [R.GRANTED_QOS_1, R.NOT_AUTHORIZED if level == 5 else 0x80])
    [ev] = link.to_client()
    assert isinstance(ev, Subscribed) and ev.packet_id == pid
    assert ev.reason_codes == [1, 0x87 if level == 5 else 0x80]
    upid = link.session.unsubscribe(["a/+"])
    assert upid != pid
    assert link.to_server() == [Unsubscribe(upid, ["a/+"])]
    link.server.send_unsuback(upid, [R.SUCCESS])
    [ev] = link.to_client()
    assert isinstance(ev, Unsubscribed) and ev.packet_id == upid
    assert ev.reason_codes == ([R.SUCCESS] if level == 5 else [])


def test_suback_with_the_wrong_number_of_codes_fails_the_session():
    link = Link(5)
    link.open()
    pid = link.session.subscribe([("a", SubscriptionOptions(1)), ("b", SubscriptionOptions(1))])
    link.to_server()
    link.server.send_suback(pid, [1])
    [ev] = link.to_client()
    assert isinstance(ev, Closed) and ev.reason_code == R.PROTOCOL_ERROR
    assert link.to_server() == [Disconnect(R.PROTOCOL_ERROR)]


def test_invalid_filter_is_refused_locally():
    link = Link(4)
    link.open()
    with pytest.raises(MqttLocalProtocolError):
        link.session.subscribe([("a/#/b", SubscriptionOptions(0))])
    with pytest.raises(MqttLocalProtocolError):
        link.session.subscribe([])
    assert link.session.data_to_send() == b""


# ------------------------------------------------------------------------ outgoing QoS


@pytest.mark.parametrize("level", [4, 5])
def test_publish_qos_0_1_2(level):
    link = Link(level)
    link.open()
    s = link.session
    s.publish("t/0", b"zero")
    s.publish("t/1", b"one", 1, token="one")
    s.publish("t/2", b"two", 2, retain=True, token="two")
    assert link.to_server() == [Publish("t/0", b"zero"), Publish("t/1", b"one", 1, packet_id=1),
                                Publish("t/2", b"two", 2, True, packet_id=2)]
    assert s.inflight == 2
    link.server.send_puback(1)
    link.server.send_pubrec(2)
    [ev] = link.to_client()
    assert isinstance(ev, Published) and ev.token == "one" and ev.reason_code == R.SUCCESS
    assert link.to_server() == [PubRel(2)]
    assert s.inflight == 1
    link.server.send_pubcomp(2)
    [ev] = link.to_client()
    assert isinstance(ev, Published) and ev.token == "two"
    assert s.inflight == 0


def test_pubrec_failure_ends_the_qos2_exchange():
    link = Link(5)
    link.open()
    link.session.publish("t", b"x", 2, token="t")
    link.to_server()
    link.server.send_pubrec(1, R.QUOTA_EXCEEDED)
    [ev] = link.to_client()
    assert isinstance(ev, Published) and ev.reason_code == R.QUOTA_EXCEEDED
    assert link.to_server() == []  # no PUBREL
    assert link.session.inflight == 0


def test_puback_failure_reason_is_reported():
    link = Link(5)
    link.open()
    link.session.publish("t", b"x", 1, token="t")
    link.to_server()
    link.server.send_puback(1, R.NOT_AUTHORIZED, {"reason_string": "no"})
    [ev] = link.to_client()
    assert isinstance(ev, Published)
    assert (ev.reason_code, ev.properties) == (R.NOT_AUTHORIZED, {"reason_string": "no"})


def test_server_limits_maximum_qos_and_retain():
    link = Link(5)
    link.open(props={"maximum_qos": 1, "retain_available": 0})
    with pytest.raises(MqttLocalProtocolError):
        link.session.publish("t", b"", 2)
    with pytest.raises(MqttLocalProtocolError):
        link.session.publish("t", b"", 1, retain=True)
    link.session.publish("t", b"", 1)
    assert link.to_server() == [Publish("t", b"", 1, packet_id=1)]


def test_wildcard_topic_is_refused_locally():
    link = Link(4)
    link.open()
    with pytest.raises(MqttLocalProtocolError):
        link.session.publish("a/+", b"", 1)
    assert link.session.inflight == 0 and link.session.data_to_send() == b""


def test_inflight_window_is_the_servers_receive_maximum():
    link = Link(5)
    link.open(props={"receive_maximum": 2})
    s = link.session
    for i in range(4):
        s.publish("t", bytes([i]), 1, token=i)
    assert [p.payload for p in link.to_server()] == [b"\x00", b"\x01"]
    assert (s.inflight, s.queued, s.window) == (2, 2, 2)
    link.server.send_puback(1)
    [ev] = link.to_client()
    assert ev.token == 0  # type: ignore[union-attr]
    [p] = link.to_server()
    assert isinstance(p, Publish) and p.payload == b"\x02" and p.packet_id == 3
    assert (s.inflight, s.queued) == (2, 1)


def test_a_waiting_publish_is_checked_when_it_is_queued():
    link = Link(5)
    link.open(props={"receive_maximum": 1, "maximum_packet_size": 100})
    s = link.session
    s.publish("t", b"", 1)
    with pytest.raises(MqttLocalProtocolError) as info:
        s.publish("t", b"x" * 100, 1)  # would wait: refused now, not when its turn comes
    assert info.value.reason_code == R.PACKET_TOO_LARGE
    with pytest.raises(MqttLocalProtocolError):
        s.publish("a/#", b"", 1)
    assert s.queued == 0


def test_inflight_window_is_our_own_bound_on_311():
    link = Link(4, max_inflight=1)
    link.open()
    link.session.publish("t", b"a", 2, token="a")
    link.session.publish("t", b"b", 2, token="b")
    assert len(link.to_server()) == 1
    link.server.send_pubrec(1)
    link.to_client()
    assert link.to_server() == [PubRel(1)]  # still in flight until PUBCOMP
    link.server.send_pubcomp(1)
    link.to_client()
    assert link.to_server() == [Publish("t", b"b", 2, packet_id=2)]


def test_packet_ids_wrap_and_skip_ids_in_use():
    s = ClientSession("c1")
    s.connect(0.0)
    s.receive_data(h("20 02 00 00"))
    s.events_received()
    s.data_to_send()
    s.publish("t", b"", 1, token="kept")  # id 1 stays in flight throughout
    held = s.subscribe([("f", SubscriptionOptions(0))])  # id 2 too, until its SUBACK
    assert held == 2
    s.data_to_send()
    seen = []
    for _ in range(65_533):  # ids 3 .. 65535
        s.publish("t", b"", 1)
        data = s.data_to_send()
        pid = int.from_bytes(data[5:7], "big")  # 32 05 00 01 74 <id>
        seen.append(pid)
        s.receive_data(b"\x40\x02" + data[5:7])
        s.events_received()
    assert seen == list(range(3, 65_536))
    s.publish("t", b"", 1)
    assert s.data_to_send()[5:7] == b"\x00\x03"  # wrapped, past 1 and 2 [MQTT-2.2.1-3]


def test_packet_ids_are_not_reused_while_in_flight():
    link = Link(4)
    link.open()
    s = link.session
    for _ in range(3):
        s.publish("t", b"", 1)
    link.to_server()
    link.server.send_puback(2)
    link.to_client()
    s._next_id = 1  # as after a wrap-around: 1 and 3 are still in flight
    s.publish("t", b"", 1)
    assert [p.packet_id for p in link.to_server()] == [2]  # type: ignore[union-attr]


# ------------------------------------------------------------------------ incoming QoS


@pytest.mark.parametrize("level", [4, 5])
def test_incoming_qos_0_1_2_acked_when_the_owner_says(level):
    link = Link(level)
    link.open()
    s = link.session
    link.server.send_publish("a", b"0", 0)
    link.server.send_publish("a", b"1", 1, packet_id=5)
    link.server.send_publish("a", b"2", 2, retain=True, packet_id=6)
    e0, e1, e2 = link.to_client()
    assert isinstance(e0, MessageReceived) and (e0.qos, e0.payload, e0.packet_id) == (0, b"0", 0)
    assert isinstance(e1, MessageReceived) and (e1.qos, e1.packet_id) == (1, 5)
    assert isinstance(e2, MessageReceived) and (e2.qos, e2.retain, e2.packet_id) == (2, True, 6)
    assert link.to_server() == []  # the owner has not taken them yet
    s.ack(6)
    s.ack(5)
    assert link.to_server() == [PubRec(6), PubAck(5)]
    link.server.send_pubrel(6)
    assert link.to_client() == []
    assert link.to_server() == [PubComp(6)]


def test_qos2_is_delivered_once_however_often_it_comes():
    link = Link(5)
    link.open()
    s = link.session
    link.server.send_publish("a", b"m", 2, packet_id=7)
    link.server.send_publish("a", b"m", 2, dup=True, packet_id=7)  # before the owner's ack
    [ev] = link.to_client()
    assert isinstance(ev, MessageReceived)
    assert link.to_server() == []
    s.ack(7)
    assert link.to_server() == [PubRec(7)]
    link.server.send_publish("a", b"m", 2, dup=True, packet_id=7)  # PUBREC lost, say
    assert link.to_client() == []
    assert link.to_server() == [PubRec(7)]  # answered again, not delivered [MQTT-4.3.3-10]
    link.server.send_pubrel(7)
    link.to_client()
    assert link.to_server() == [PubComp(7)]
    link.server.send_publish("a", b"new", 2, packet_id=7)  # id free again: a new message
    [ev] = link.to_client()
    assert isinstance(ev, MessageReceived) and ev.payload == b"new"


def test_qos2_exchange_survives_a_reconnect_with_a_present_session():
    link = Link(5, clean_start=False, session_expiry=60)
    link.open()
    s = link.session
    link.server.send_publish("a", b"m", 2, packet_id=9)
    link.server.send_publish("a", b"n", 1, packet_id=10)
    assert len(link.to_client()) == 2
    s.connection_lost()
    assert kinds(s.events_received()) == ["Closed"]
    s.ack(9)  # taken while no connection: PUBREC owed
    s.ack(10)  # PUBACK owed
    assert s.data_to_send() == b""
    link.open(10.0, session_present=True)
    link.server.send_publish("a", b"m", 2, dup=True, packet_id=9)
    link.server.send_publish("a", b"n", 1, dup=True, packet_id=10)
    assert link.to_client() == []  # not delivered twice
    assert link.to_server() == [PubRec(9), PubAck(10)]


def test_pubrel_for_an_unknown_id_is_answered_not_found():
    link = Link(5)
    link.open()
    link.server.send_pubrel(44)
    link.to_client()
    assert link.to_server() == [PubComp(44, R.PACKET_IDENTIFIER_NOT_FOUND)]


def test_receive_maximum_exceeded_fails_the_session():
    link = Link(5, receive_maximum=1)
    link.open()
    link.server.send_publish("a", b"", 1, packet_id=1)
    link.server.send_publish("a", b"", 1, packet_id=2)
    events = link.to_client()
    assert kinds(events) == ["MessageReceived", "Closed"]
    assert events[1].reason_code == R.RECEIVE_MAXIMUM_EXCEEDED  # type: ignore[union-attr]


def test_topic_alias_from_the_server_is_invalid():
    link = Link(5)
    link.open()
    link.server.send_publish("a", b"", 0, properties={"topic_alias": 1})
    [ev] = link.to_client()
    assert isinstance(ev, Closed) and ev.reason_code == R.TOPIC_ALIAS_INVALID
    assert link.to_server() == [Disconnect(R.TOPIC_ALIAS_INVALID)]


# ------------------------------------------------------------------------ reconnect


@pytest.mark.parametrize("level", [4, 5])
def test_unacknowledged_publishes_are_resent_with_dup_and_pubrel_again(level):
    link = Link(level, clean_start=False, session_expiry=300)
    link.open()
    s = link.session
    s.publish("t", b"a", 1, token="a")
    s.publish("t", b"b", 2, token="b")
    s.publish("t", b"c", 2, token="c")
    first = link.session.data_to_send()
    link.server.receive_data(first)
    link.server.events_received()
    link.server.send_pubrec(3)
    link.to_client()
    assert link.to_server() == [PubRel(3)]
    s.connection_lost()
    assert kinds(s.events_received()) == ["Closed"]
    assert s.state is DISCONNECTED and s.inflight == 3
    link.server = MqttCodec(SERVER)
    s.connect(5.0)
    connect_len = len(s.data_to_send())
    assert connect_len > 0
    s.receive_data(h("20 03 01 00 00") if level == 5 else h("20 02 01 00"))
    [ev] = s.events_received()
    assert isinstance(ev, Connected) and ev.session_present
    resent = s.data_to_send()
    # The same PUBLISH bytes with DUP (0x08) set [MQTT-3.3.1-1], then PUBREL, in order.
    a_len = len(first) // 3  # three PUBLISHes of the same size
    pa, pb = first[:a_len], first[a_len:2 * a_len]
    assert resent == bytes([pa[0] | 8]) + pa[1:] + bytes([pb[0] | 8]) + pb[1:] + h("62 02 00 03")
    server = MqttCodec(SERVER)
    server.protocol_level = level
    server.receive_data(resent)
    assert server.events_received() == [Publish("t", b"a", 1, False, True, 1),
                                        Publish("t", b"b", 2, False, True, 2), PubRel(3)]


def test_no_session_on_the_server_abandons_what_was_in_flight():
    link = Link(5, clean_start=False, session_expiry=300)
    link.open()
    s = link.session
    s.publish("t", b"a", 1, token="a")
    s.publish("t", b"b", 2, token="b")
    link.to_server()
    link.server.send_publish("in", b"x", 2, packet_id=4)
    link.to_client()
    s.connection_lost()
    s.events_received()
    events = link.open(1.0, session_present=False)
    assert kinds(events) == ["Abandoned", "Connected"]
    assert events[0].tokens == ["a", "b"]  # type: ignore[union-attr]
    assert link.to_server() == []  # nothing resent
    s.ack(4)  # the import's exchange went with the session
    assert link.to_server() == []
    s.publish("t", b"c", 1)
    assert link.to_server() == [Publish("t", b"c", 1, packet_id=3)]  # ids 1, 2 are free


def test_clean_start_discards_the_session_on_connect():
    link = Link(4)  # clean session
    link.open()
    link.session.publish("t", b"a", 1, token="a")
    link.to_server()
    link.session.connection_lost()
    link.session.events_received()
    link.session.connect(1.0)
    [ev] = link.session.events_received()
    assert isinstance(ev, Abandoned) and ev.tokens == ["a"]


# ------------------------------------------------------------------------ keepalive


def test_pingreq_after_the_keepalive_and_timeout_without_answer():
    link = Link(5, keepalive=10)
    link.open(0.0)
    s = link.session
    s.tick(1.0)  # the CONNECT was written at 0
    s.tick(9.0)
    assert s.data_to_send() == b""
    s.tick(11.0)
    assert link.to_server() == [PingReq()]
    link.server.send_pingresp()
    link.to_client()
    s.tick(12.0)  # answered: no timeout, and the ping counts as written at 12
    s.tick(21.0)
    assert s.data_to_send() == b""
    s.tick(22.0)
    assert link.to_server() == [PingReq()]
    s.tick(31.0)
    assert s.events_received() == []
    s.tick(32.0)  # no answer for ping_timeout (= keepalive) seconds
    [ev] = s.events_received()
    assert isinstance(ev, Closed) and ev.reason_code == R.KEEP_ALIVE_TIMEOUT
    assert link.to_server() == [Disconnect(R.KEEP_ALIVE_TIMEOUT)]


def test_traffic_defers_the_ping_and_any_packet_answers_it():
    link = Link(4, keepalive=10, ping_timeout=3.0)
    link.open(0.0)
    s = link.session
    s.tick(0.0)
    s.publish("t", b"", 0)
    link.to_server()
    s.tick(8.0)  # written at 8
    s.tick(17.0)
    assert s.data_to_send() == b""
    s.tick(18.0)
    assert link.to_server() == [PingReq()]
    link.server.send_publish("a", b"", 0)  # not a PINGRESP, but the server is there
    link.to_client()
    s.tick(20.0)
    s.tick(25.0)
    assert s.events_received() == [] and s.state is CONNECTED


def test_server_keep_alive_replaces_ours():
    link = Link(5, keepalive=60)
    link.open(0.0, props={"server_keep_alive": 5})
    link.session.tick(0.0)
    link.session.tick(5.0)
    assert link.to_server() == [PingReq()]


def test_keepalive_zero_never_pings():
    link = Link(4, keepalive=0)
    link.open(0.0)
    link.session.tick(1e6)
    assert link.session.data_to_send() == b"" and link.session.events_received() == []


# ------------------------------------------------------------------------ errors, DISCONNECT


@pytest.mark.parametrize(("level", "data", "code"), [
    (4, "40 03 00 01 00", R.MALFORMED_PACKET),  # 3.1.1 PUBACK with remaining length 3
    (4, "32 03 00 01 61", R.MALFORMED_PACKET),  # QoS 1 PUBLISH cut before its packet id
    (5, "e0 01 ff", R.PROTOCOL_ERROR),  # DISCONNECT reason 0xff
    (5, "a2 00", R.PROTOCOL_ERROR),  # UNSUBSCRIBE: a server does not send it
    (4, "00 00", R.MALFORMED_PACKET),  # reserved packet type 0
])
def test_malformed_server_bytes_fail_the_session(level, data, code):
    link = Link(level)
    link.open()
    link.server.send_publish("ok", b"", 0)
    link.session.receive_data(link.server.data_to_send() + h(data))
    events = link.session.events_received()
    assert kinds(events) == ["MessageReceived", "Closed"]  # the good packet first
    closed = events[1]
    assert isinstance(closed, Closed) and closed.reason_code == code
    assert closed.error is not None and closed.error.reason_code == code
    assert link.session.state is DISCONNECTED
    assert link.to_server() == ([Disconnect(code)] if level == 5 else [])
    link.session.receive_data(h("20 02 00 00"))  # nothing more is read
    assert link.session.events_received() == []


def test_anything_before_connack_is_a_protocol_error():
    s = ClientSession("c1")
    s.connect(0.0)
    s.data_to_send()
    s.receive_data(h("30 03 00 01 61"))
    [ev] = s.events_received()
    assert isinstance(ev, Closed) and ev.reason_code == R.PROTOCOL_ERROR


def test_server_disconnect_closes_with_its_reason():
    link = Link(5)
    link.open()
    link.server.send_disconnect(R.SERVER_SHUTTING_DOWN, {"reason_string": "bye"})
    [ev] = link.to_client()
    assert isinstance(ev, Closed) and ev.by_server
    assert (ev.reason_code, ev.properties) == (R.SERVER_SHUTTING_DOWN, {"reason_string": "bye"})
    assert link.session.state is DISCONNECTED


@pytest.mark.parametrize("level", [4, 5])
def test_our_disconnect(level):
    link = Link(level)
    link.open()
    link.session.disconnect()
    assert link.session.data_to_send() == h("e0 00")
    [ev] = link.session.events_received()
    assert isinstance(ev, Closed) and not ev.by_server
    with pytest.raises(MqttLocalProtocolError):
        link.session.disconnect()


def test_disconnect_with_reason_and_the_session_expiry_rule():
    link = Link(5)  # Session Expiry 0 in CONNECT
    link.open()
    with pytest.raises(MqttLocalProtocolError):
        link.session.disconnect(properties={"session_expiry_interval": 5})  # 3.14.2.2.2
    link.session.disconnect(R.DISCONNECT_WITH_WILL_MESSAGE)
    assert link.to_server() == [Disconnect(R.DISCONNECT_WITH_WILL_MESSAGE)]


def test_auth_from_the_server_is_a_protocol_error():
    link = Link(5)
    link.open()
    link.server.send_auth(R.CONTINUE_AUTHENTICATION, {"authentication_method": "x"})
    [ev] = link.to_client()
    assert isinstance(ev, Closed) and ev.reason_code == R.PROTOCOL_ERROR


# ------------------------------------------------------------------------ codec differential

# The packets both sides may send (MQTT 5.0 chapter 3; 3.1.1 has no AUTH and only the
# client sends DISCONNECT).
BOTH_SIDES = (Publish, PubAck, PubRec, PubRel, PubComp, Disconnect, Auth)


def _opened(side: object, level: int) -> MqttCodec:
    codec = MqttCodec(side)  # type: ignore[arg-type]
    codec.protocol_level = level
    return codec


def shared_packets(kind: type, level: int, direction: str) -> st.SearchStrategy[Packet]:
    """Any valid packet of ``kind`` (one of :data:`BOTH_SIDES`), made of the codec fuzzer's
    parts: the differential draws each kind on purpose, so none is left out by chance."""
    if kind is Publish:
        return publishes(level, direction)
    if kind is Disconnect:
        exclude = () if direction == "c2s" else ("session_expiry_interval",)
        return st.builds(Disconnect, reasons(DISCONNECT), properties(DISCONNECT, exclude))
    if kind is Auth:
        return st.builds(Auth, reasons(AUTH), properties(AUTH))
    if level < 5:
        return packet_ids.map(kind)
    t = kind.packet_type  # type: ignore[attr-defined]
    return st.builds(kind, packet_ids, reasons(t), properties(t))


@pytest.mark.parametrize("kind", BOTH_SIDES, ids=lambda kind: kind.__name__)
@settings(max_examples=60, deadline=None)
@given(data=st.data(), level=st.sampled_from([3, 4, 5]),
       direction=st.sampled_from(["c2s", "s2c"]))
def test_client_and_server_codecs_agree_byte_for_byte(kind, data, level, direction):
    if kind is Auth and level < 5:
        return  # AUTH is MQTT 5's
    if kind is Disconnect and level < 5:
        return  # a 3.1.1 server closes instead: only the client side sends it
    packet = data.draw(shared_packets(kind, level, direction))
    sender_side, receiver_side = (CLIENT, SERVER) if direction == "c2s" else (SERVER, CLIENT)
    sender = _opened(sender_side, level)
    sender.send(packet)
    wire = sender.data_to_send()
    receiver = _opened(receiver_side, level)
    receiver.receive_data(wire)
    [parsed] = receiver.events_received()
    assert type(parsed) is kind
    receiver.send(parsed)  # the other side writes what it read
    assert receiver.data_to_send() == wire


def test_client_session_writes_what_the_client_codec_writes():
    # The session's own encodings (PUBLISH, the hand-built PUBREL, DUP resends) are parsed
    # by the server codec and re-encoded by a client codec to the same bytes.
    link = Link(5, clean_start=False, session_expiry=10)
    link.open()
    s = link.session
    s.publish("a/b", b"x" * 200, 2, properties={"user_property": [("k", "v")]})
    s.publish("a/c", b"", 1, retain=True, properties={"message_expiry_interval": 9})
    s.subscribe([("a/#", SubscriptionOptions(1, True, True, 2))], {"subscription_identifier": [4]})
    wire = s.data_to_send()
    link.server.receive_data(wire)
    parsed = link.server.events_received()
    link.server.send_pubrec(1)
    link.to_client()
    pubrel = s.data_to_send()
    link.server.receive_data(pubrel)
    parsed += link.server.events_received()
    client = _opened(CLIENT, 5)
    for p in parsed:
        client.send(p)
    assert client.data_to_send() == wire + pubrel
    assert [type(p) for p in parsed] == [Publish, Publish, Subscribe, PubRel]
