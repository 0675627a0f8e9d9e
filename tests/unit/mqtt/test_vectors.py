"""Byte-exact MQTT vectors, checked both ways and under every chunking.

Each vector's bytes are written by hand from the packet layouts of the specifications
(MQTT 3.1, OASIS MQTT 3.1.1 chapter 3, OASIS MQTT 5.0 chapter 3 and 2.2.2.2) -- field by
field, with the remaining and property lengths counted by hand -- never produced by the
encoder under test. For every vector:

* parsing its bytes gives exactly the expected packet (fed whole, byte by byte, in two
  random two-way splits, and followed by a second packet in the same chunk), and
* encoding the expected packet gives exactly its bytes.

``PARSE_ONLY`` vectors are valid but not in the encoder's canonical form (e.g. an empty
property set written out), so they are checked in the parse direction only.
"""

from __future__ import annotations

import random

import pytest

from adapters.mqtt.codec import CLIENT, SERVER, MqttCodec
from adapters.mqtt.packets import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    ReasonCode,
    SubAck,
    Subscribe,
    SubscriptionOptions,
    UnsubAck,
    Unsubscribe,
    Will,
)

C2S, S2C = "c2s", "s2c"  # client to server (a server codec parses it) and the reverse
BOTH = (C2S, S2C)


def h(text: str) -> bytes:
    """Hex with spaces, ``|`` separators and ``#`` comments to the end of each line."""
    return bytes.fromhex("".join(line.split("#")[0].replace("|", " ")
                                 for line in text.splitlines()))


def ascii_hex(s: str) -> str:
    return s.encode("ascii").hex(" ")


SO = SubscriptionOptions
R = ReasonCode

# (id, protocol level, directions, bytes, packet)
VECTORS: list[tuple[str, int, tuple[str, ...], bytes, Packet]] = [
    # ------------------------------------------------------------------ MQTT 3.1 (level 3)
    ("connect-31", 3, (C2S,), h("""
        10 11                      # CONNECT, remaining length 17
        00 06 4d 51 49 73 64 70    # protocol name "MQIsdp"
        03                         # protocol level 3
        02                         # flags: clean session
        00 3c                      # keepalive 60
        00 03 61 62 63             # client id "abc"
     """), Connect("MQIsdp", 3, True, 60, "abc")),
    ("connect-31-user-password", 3, (C2S,), h("""
        10 18 00 06 4d 51 49 73 64 70 03
        c2                         # user name, password, clean session
        00 3c 00 03 61 62 63
        00 01 75                   # user name "u"
        00 02 70 77                # password "pw"
     """), Connect("MQIsdp", 3, True, 60, "abc", None, "u", b"pw")),
    ("connack-31", 3, (S2C,), h("20 02 00 00"), ConnAck(False, R.SUCCESS)),
    ("publish-31-qos1", 3, BOTH, h("32 06 00 01 74 00 05 78"),
     Publish("t", b"x", 1, False, False, 5)),
    ("subscribe-31", 3, (C2S,), h("82 06 00 01 00 01 74 01"), Subscribe(1, [("t", SO(1))])),
    ("suback-31", 3, (S2C,), h("90 03 00 01 01"), SubAck(1, [R.GRANTED_QOS_1])),
    ("disconnect-31", 3, (C2S,), h("e0 00"), Disconnect()),
    # --------------------------------------------------------------- MQTT 3.1.1 (level 4)
    ("connect-311", 4, (C2S,), h("""
        10 0f                      # CONNECT, remaining length 15
        00 04 4d 51 54 54          # "MQTT"
        04                         # level 4
        02                         # clean session
        00 3c                      # keepalive 60
        00 03 61 62 63             # client id "abc"
     """), Connect("MQTT", 4, True, 60, "abc")),
    ("connect-311-will-user-password", 4, (C2S,), h("""
        10 1e 00 04 4d 51 54 54 04
        ee                         # user, password, will retain, will QoS 1, will, clean
        00 0a                      # keepalive 10
        00 02 63 31                # client id "c1"
        00 03 77 2f 74             # will topic "w/t"
        00 03 62 79 65             # will payload "bye"
        00 01 75                   # user name "u"
        00 01 70                   # password "p"
     """), Connect("MQTT", 4, True, 10, "c1", Will("w/t", b"bye", 1, True), "u", b"p")),
    ("connect-311-persistent-will-qos2", 4, (C2S,), h("""
        10 17 00 04 4d 51 54 54 04
        94                         # user name, will QoS 2, will; clean session 0
        00 00                      # keepalive 0
        00 00                      # client id ""
        00 01 74                   # will topic "t"
        00 00                      # empty will payload
        00 04 75 73 65 72          # user name "user"
     """), Connect("MQTT", 4, False, 0, "", Will("t", b"", 2, False), "user", None)),
    ("connack-311-session-present", 4, (S2C,), h("20 02 01 00"), ConnAck(True, R.SUCCESS)),
    ("connack-311-unacceptable-version", 4, (S2C,), h("20 02 00 01"),
     ConnAck(False, R.UNSUPPORTED_PROTOCOL_VERSION)),
    ("connack-311-identifier-rejected", 4, (S2C,), h("20 02 00 02"),
     ConnAck(False, R.CLIENT_IDENTIFIER_NOT_VALID)),
    ("connack-311-server-unavailable", 4, (S2C,), h("20 02 00 03"),
     ConnAck(False, R.SERVER_UNAVAILABLE)),
    ("connack-311-bad-user-password", 4, (S2C,), h("20 02 00 04"),
     ConnAck(False, R.BAD_USER_NAME_OR_PASSWORD)),
    ("connack-311-not-authorized", 4, (S2C,), h("20 02 00 05"), ConnAck(False, R.NOT_AUTHORIZED)),
    ("publish-311-qos0", 4, BOTH, h("""
        30 07                      # PUBLISH QoS 0, remaining length 7
        00 03 61 2f 62             # topic "a/b"
        68 69                      # payload "hi"
     """), Publish("a/b", b"hi")),
    ("publish-311-qos1-dup-retain", 4, BOTH, h("""
        3b 06                      # PUBLISH DUP, QoS 1, RETAIN
        00 01 74                   # topic "t"
        00 0a                      # packet id 10
        78                         # payload "x"
     """), Publish("t", b"x", 1, True, True, 10)),
    ("publish-311-qos2-empty-payload", 4, BOTH, h("34 05 00 01 74 12 34"),
     Publish("t", b"", 2, False, False, 0x1234)),
    ("publish-311-two-byte-length", 4, BOTH,
     h("30 cb 01 00 01 74" + " 78" * 200),  # remaining length 203 = 0x4b + 1 * 128
     Publish("t", b"x" * 200)),
    ("publish-311-three-byte-length", 4, (C2S,),
     h("30 80 80 01 00 01 74" + " 00" * 16381),  # remaining length 16,384 = 1 * 128^2
     Publish("t", bytes(16381))),
    ("publish-311-utf8-topic", 4, (C2S,), h("""
        30 0d 00 0a
        ef bb bf                   # U+FEFF, kept [MQTT-1.5.4-3]
        c3 a9                      # U+00E9
        e2 82 ac                   # U+20AC
        2f 61                      # "/a"
        00                         # payload one zero byte
     """), Publish("\ufeff\u00e9\u20ac/a", b"\x00")),
    ("puback-311", 4, BOTH, h("40 02 00 0a"), PubAck(10)),
    ("pubrec-311", 4, BOTH, h("50 02 00 0a"), PubRec(10)),
    ("pubrel-311", 4, BOTH, h("62 02 00 0a"), PubRel(10)),
    ("pubcomp-311", 4, BOTH, h("70 02 00 0a"), PubComp(10)),
    ("subscribe-311", 4, (C2S,), h("""
        82 0e 00 01                # SUBSCRIBE (flags 0b0010), packet id 1
        00 03 61 2f 62 01          # "a/b" QoS 1
        00 03 63 2f 23 02          # "c/#" QoS 2
     """), Subscribe(1, [("a/b", SO(1)), ("c/#", SO(2))])),
    ("suback-311", 4, (S2C,), h("90 05 00 01 01 02 80"),
     SubAck(1, [R.GRANTED_QOS_1, R.GRANTED_QOS_2, R.UNSPECIFIED_ERROR])),
    ("unsubscribe-311", 4, (C2S,), h("a2 07 00 02 00 03 61 2f 62"), Unsubscribe(2, ["a/b"])),
    ("unsuback-311", 4, (S2C,), h("b0 02 00 02"), UnsubAck(2)),
    ("pingreq-311", 4, (C2S,), h("c0 00"), PingReq()),
    ("pingresp-311", 4, (S2C,), h("d0 00"), PingResp()),
    ("disconnect-311", 4, (C2S,), h("e0 00"), Disconnect()),
    # ------------------------------------------------------------------ MQTT 5.0 (level 5)
    ("connect-5", 5, (C2S,), h("""
        10 10 00 04 4d 51 54 54
        05                         # level 5
        02 00 3c
        00                         # property length 0
        00 03 61 62 63
     """), Connect("MQTT", 5, True, 60, "abc")),
    ("connect-5-full", 5, (C2S,), h("""
        10 76                      # remaining length 118
        00 04 4d 51 54 54 05
        ee                         # user, password, will retain, will QoS 1, will, clean
        00 1e                      # keepalive 30
        30                         # property length 48
        11 00 00 00 78             # session expiry interval 120
        21 00 14                   # receive maximum 20
        27 00 00 04 00             # maximum packet size 1024
        22 00 05                   # topic alias maximum 5
        19 01                      # request response information 1
        17 00                      # request problem information 0
        26 00 01 6b 00 01 76       # user property k=v
        26 00 01 6b 00 02 76 32    # user property k=v2 (repeated key, order kept)
        15 00 05 53 43 52 41 4d    # authentication method "SCRAM"
        16 00 02 01 02             # authentication data 01 02
        00 04 64 65 76 31          # client id "dev1"
        23                         # will property length 35
        18 00 00 00 05             # will delay interval 5
        01 01                      # payload format indicator 1
        02 00 00 00 3c             # message expiry interval 60
        03 00 04 74 65 78 74       # content type "text"
        08 00 01 72                # response topic "r"
        09 00 02 01 02             # correlation data 01 02
        26 00 01 61 00 01 62       # user property a=b
        00 03 77 2f 74             # will topic "w/t"
        00 03 62 79 65             # will payload "bye"
        00 01 75                   # user name "u"
        00 02 00 ff                # password 00 ff
     """), Connect("MQTT", 5, True, 30, "dev1",
                   Will("w/t", b"bye", 1, True, {
                       "will_delay_interval": 5, "payload_format_indicator": 1,
                       "message_expiry_interval": 60, "content_type": "text",
                       "response_topic": "r", "correlation_data": b"\x01\x02",
                       "user_property": [("a", "b")]}),
                   "u", b"\x00\xff", {
                       "session_expiry_interval": 120, "receive_maximum": 20,
                       "maximum_packet_size": 1024, "topic_alias_maximum": 5,
                       "request_response_information": 1, "request_problem_information": 0,
                       "user_property": [("k", "v"), ("k", "v2")],
                       "authentication_method": "SCRAM", "authentication_data": b"\x01\x02"})),
    ("connect-5-password-without-user", 5, (C2S,), h("""
        10 13 00 04 4d 51 54 54 05
        42                         # password, clean: allowed in MQTT 5 (3.1.2.9)
        00 3c 00 00 03 61 62 63
        00 01 70                   # password "p"
     """), Connect("MQTT", 5, True, 60, "abc", None, None, b"p")),
    ("connack-5", 5, (S2C,), h("20 03 00 00 00"), ConnAck(False, R.SUCCESS)),
    ("connack-5-refused", 5, (S2C,), h("20 03 00 84 00"),
     ConnAck(False, R.UNSUPPORTED_PROTOCOL_VERSION)),
    ("connack-5-full", 5, (S2C,), h("""
        20 45                      # remaining length 69
        01 00                      # session present, success
        42                         # property length 66
        11 00 00 0e 10             # session expiry interval 3600
        21 00 64                   # receive maximum 100
        24 01                      # maximum QoS 1
        25 00                      # retain available 0
        27 00 01 00 00             # maximum packet size 65536
        12 00 04 67 77 2d 31       # assigned client identifier "gw-1"
        22 00 0a                   # topic alias maximum 10
        1f 00 02 6f 6b             # reason string "ok"
        26 00 01 78 00 01 79       # user property x=y
        28 01                      # wildcard subscription available 1
        29 00                      # subscription identifier available 0
        2a 01                      # shared subscription available 1
        13 00 1e                   # server keep alive 30
        1a 00 02 72 69             # response information "ri"
        1c 00 02 73 32             # server reference "s2"
        15 00 01 58                # authentication method "X"
        16 00 01 00                # authentication data 00
     """), ConnAck(True, R.SUCCESS, {
        "session_expiry_interval": 3600, "receive_maximum": 100, "maximum_qos": 1,
        "retain_available": 0, "maximum_packet_size": 65536,
        "assigned_client_identifier": "gw-1", "topic_alias_maximum": 10,
        "reason_string": "ok", "user_property": [("x", "y")],
        "wildcard_subscription_available": 1, "subscription_identifier_available": 0,
        "shared_subscription_available": 1, "server_keep_alive": 30,
        "response_information": "ri", "server_reference": "s2",
        "authentication_method": "X", "authentication_data": b"\x00"})),
    ("publish-5-qos0", 5, BOTH, h("30 08 00 03 61 2f 62 00 68 69"), Publish("a/b", b"hi")),
    ("publish-5-qos1-properties", 5, (S2C,), h("""
        32 37                      # PUBLISH QoS 1, remaining length 55
        00 01 74                   # topic "t"
        00 01                      # packet id 1
        2f                         # property length 47
        01 01                      # payload format indicator 1
        02 00 00 00 0a             # message expiry interval 10
        23 00 03                   # topic alias 3
        08 00 03 72 2f 78          # response topic "r/x"
        09 00 02 69 64             # correlation data "id"
        26 00 01 6b 00 01 31       # user property k=1
        26 00 01 6b 00 01 32       # user property k=2
        0b 01                      # subscription identifier 1
        0b c8 01                   # subscription identifier 200 (two-byte varint)
        03 00 04 6a 73 6f 6e       # content type "json"
        7b 7d                      # payload "{}"
     """), Publish("t", b"{}", 1, False, False, 1, {
        "payload_format_indicator": 1, "message_expiry_interval": 10, "topic_alias": 3,
        "response_topic": "r/x", "correlation_data": b"id",
        "user_property": [("k", "1"), ("k", "2")], "subscription_identifier": [1, 200],
        "content_type": "json"})),
    ("publish-5-topic-alias-only", 5, (C2S,), h("""
        30 07 00 00                # empty topic name ...
        03 23 00 05                # ... with topic alias 5 (3.3.2.3.4)
        78
     """), Publish("", b"x", 0, False, False, None, {"topic_alias": 5})),
    ("puback-5", 5, BOTH, h("40 02 00 01"), PubAck(1)),
    ("puback-5-reason", 5, BOTH, h("40 03 00 01 10"), PubAck(1, R.NO_MATCHING_SUBSCRIBERS)),
    ("puback-5-properties", 5, BOTH, h("""
        40 10 00 01
        80                         # unspecified error
        0c                         # property length 12
        1f 00 02 6e 6f             # reason string "no"
        26 00 01 61 00 01 62       # user property a=b
     """), PubAck(1, R.UNSPECIFIED_ERROR, {"reason_string": "no",
                                         "user_property": [("a", "b")]})),
    ("pubrec-5-reason", 5, BOTH, h("50 03 00 02 97"), PubRec(2, R.QUOTA_EXCEEDED)),
    ("pubrel-5-reason", 5, BOTH, h("62 03 00 02 92"), PubRel(2, R.PACKET_IDENTIFIER_NOT_FOUND)),
    ("pubcomp-5-properties", 5, BOTH, h("70 09 00 02 00 05 1f 00 02 6f 6b"),
     PubComp(2, R.SUCCESS, {"reason_string": "ok"})),
    ("subscribe-5", 5, (C2S,), h("""
        82 23 00 0a                # SUBSCRIBE, remaining length 35, packet id 10
        09                         # property length 9
        0b 05                      # subscription identifier 5
        26 00 01 61 00 01 62       # user property a=b
        00 03 61 2f 2b 2d          # "a/+": QoS 1, no local, retain as published, RH 2
        00 0a 24 73 68 61 72 65 2f 67 2f 78 00   # "$share/g/x": all options 0
        00 01 62 12                # "b": QoS 2, retain handling 1
     """), Subscribe(10, [("a/+", SO(1, True, True, 2)), ("$share/g/x", SO(0)),
                         ("b", SO(2, False, False, 1))],
                    {"subscription_identifier": [5], "user_property": [("a", "b")]})),
    ("suback-5", 5, (S2C,), h("90 0a 00 0a 04 1f 00 01 21 01 8f 9e"),
     SubAck(10, [R.GRANTED_QOS_1, R.TOPIC_FILTER_INVALID,
                 R.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED], {"reason_string": "!"})),
    ("unsubscribe-5", 5, (C2S,), h("a2 0b 00 0b 00 00 03 61 2f 62 00 01 63"),
     Unsubscribe(11, ["a/b", "c"])),
    ("unsuback-5", 5, (S2C,), h("b0 05 00 0b 00 00 11"),
     UnsubAck(11, [R.SUCCESS, R.NO_SUBSCRIPTION_EXISTED])),
    ("pingreq-5", 5, (C2S,), h("c0 00"), PingReq()),
    ("pingresp-5", 5, (S2C,), h("d0 00"), PingResp()),
    ("disconnect-5", 5, BOTH, h("e0 00"), Disconnect()),
    ("disconnect-5-with-will", 5, (C2S,), h("e0 01 04"),
     Disconnect(R.DISCONNECT_WITH_WILL_MESSAGE)),
    ("disconnect-5-session-expiry", 5, (C2S,), h("e0 07 00 05 11 00 00 00 00"),
     Disconnect(R.NORMAL_DISCONNECTION, {"session_expiry_interval": 0})),
    ("disconnect-5-server", 5, (S2C,), h("""
        e0 0d 8e                   # session taken over
        0b                         # property length 11
        1f 00 03 62 79 65          # reason string "bye"
        1c 00 02 73 32             # server reference "s2"
     """), Disconnect(R.SESSION_TAKEN_OVER, {"reason_string": "bye",
                                            "server_reference": "s2"})),
    ("auth-5-empty", 5, BOTH, h("f0 00"), Auth()),
    ("auth-5-continue", 5, BOTH, h("""
        f0 10 18                   # continue authentication
        0e                         # property length 14
        15 00 05 53 43 52 41 4d    # authentication method "SCRAM"
        16 00 03 01 02 03          # authentication data 01 02 03
     """), Auth(R.CONTINUE_AUTHENTICATION, {"authentication_method": "SCRAM",
                                           "authentication_data": b"\x01\x02\x03"})),
]

PARSE_ONLY: list[tuple[str, int, tuple[str, ...], bytes, Packet]] = [
    ("puback-5-empty-properties", 5, BOTH, h("40 04 00 01 00 00"), PubAck(1)),
    ("disconnect-5-empty-properties", 5, (C2S,), h("e0 02 00 00"), Disconnect()),
    ("auth-5-reason-only", 5, (C2S,), h("f0 01 19"), Auth(R.RE_AUTHENTICATE)),
    # An older server answering an MQTT 5 CONNECT in the 3.1.1 format (MQTT 5.0 3.1.2.2).
    ("connack-5-from-311-server", 5, (S2C,), h("20 02 00 01"),
     ConnAck(False, R.UNSUPPORTED_PROTOCOL_VERSION)),
    # MQTT 3.1 clients may set DUP on a re-sent SUBSCRIBE, PUBREL or UNSUBSCRIBE.
    ("subscribe-31-dup", 3, (C2S,), h("8a 06 00 01 00 01 74 00"), Subscribe(1, [("t", SO(0))])),
    ("pubrel-31-dup", 3, (C2S,), h("6a 02 00 01"), PubRel(1)),
]

# The CONNECT that opens each level's connection (the vectors above, repeated).
OPENING = {
    3: (h("10 11 00 06 4d 51 49 73 64 70 03 02 00 3c 00 03 61 62 63"),
        Connect("MQIsdp", 3, True, 60, "abc")),
    4: (h("10 0f 00 04 4d 51 54 54 04 02 00 3c 00 03 61 62 63"),
        Connect("MQTT", 4, True, 60, "abc")),
    5: (h("10 10 00 04 4d 51 54 54 05 02 00 3c 00 00 03 61 62 63"),
        Connect("MQTT", 5, True, 60, "abc")),
}


def server_after_connect(level: int) -> MqttCodec:
    """A server codec that has parsed the level's opening CONNECT."""
    codec = MqttCodec(SERVER)
    data, connect = OPENING[level]
    codec.receive_data(data)
    assert codec.events_received() == [connect]
    assert codec.protocol_level == level
    return codec


def client_after_connect(level: int) -> MqttCodec:
    """A client codec that has sent the level's opening CONNECT (bytes checked, then dropped)."""
    codec = MqttCodec(CLIENT)
    data, connect = OPENING[level]
    codec.send(connect)
    assert codec.data_to_send() == data
    return codec


def receiver(level: int, direction: str, packet: Packet) -> MqttCodec:
    if isinstance(packet, Connect):
        return MqttCodec(SERVER)
    return server_after_connect(level) if direction == C2S else client_after_connect(level)


def sender(level: int, direction: str, packet: Packet) -> MqttCodec:
    if isinstance(packet, Connect):
        return MqttCodec(CLIENT)
    return client_after_connect(level) if direction == C2S else server_after_connect(level)


def feed(codec: MqttCodec, chunks: list[bytes]) -> list[Packet]:
    events: list[Packet] = []
    for chunk in chunks:
        codec.receive_data(chunk)
        events.extend(codec.events_received())
    return events


def chunkings(data: bytes, seed: str) -> dict[str, list[bytes]]:
    rng = random.Random(seed)
    out = {"whole": [data], "bytewise": [data[i:i + 1] for i in range(len(data))]}
    for k in (1, 2):
        cut = rng.randrange(1, len(data)) if len(data) > 1 else 1
        out[f"split-{k}-at-{cut}"] = [data[:cut], data[cut:]]
    return out


def _cases(table: list[tuple[str, int, tuple[str, ...], bytes, Packet]]) -> list[object]:
    return [pytest.param(level, d, data, packet, id=f"{vid}-{d}")
            for vid, level, directions, data, packet in table for d in directions]


@pytest.mark.parametrize(("level", "direction", "data", "packet"), _cases(VECTORS + PARSE_ONLY))
def test_vector_parses_the_same_under_every_chunking(level, direction, data, packet):
    trailer, second = (h("c0 00"), PingReq()) if direction == C2S else (h("d0 00"), PingResp())
    for name, chunks in chunkings(data, repr(data)).items():
        codec = receiver(level, direction, packet)
        assert feed(codec, chunks) == [packet], name
        assert not codec.failed
    codec = receiver(level, direction, packet)
    assert feed(codec, [data + trailer]) == [packet, second], "followed by a second packet"
    codec = receiver(level, direction, packet)
    assert feed(codec, [data + trailer[:1], trailer[1:]]) == [packet, second], "second split"


@pytest.mark.parametrize(("level", "direction", "data", "packet"), _cases(VECTORS))
def test_vector_encodes_to_its_bytes(level, direction, data, packet):
    codec = sender(level, direction, packet)
    codec.send(packet)
    assert codec.data_to_send() == data


def test_vectors_cover_every_packet_type_at_311_and_5():
    for level in (4, 5):
        kinds = {type(p) for _, lv, _, _, p in VECTORS if lv == level}
        expected = {Connect, ConnAck, Publish, PubAck, PubRec, PubRel, PubComp, Subscribe,
                    SubAck, Unsubscribe, UnsubAck, PingReq, PingResp, Disconnect}
        if level == 5:
            expected.add(Auth)
        assert kinds == expected, level


def test_vector_lengths_are_consistent():
    # A check on the hand counting: each vector's remaining length matches its byte count.
    for vid, _, _, data, _ in VECTORS + PARSE_ONLY:
        value, shift, i = 0, 0, 1
        while True:
            value |= (data[i] & 0x7F) << shift
            shift += 7
            i += 1
            if data[i - 1] < 0x80:
                break
        assert value == len(data) - i, vid
