"""The MQTT codec's rules: malformed input, protocol errors, limits, sending, and a pair."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.mqtt.codec import (
    CLIENT,
    DEFAULT_MAX_PACKET_SIZE,
    SERVER,
    MqttCodec,
    encode_publish,
    publish_with_packet_id,
    validate_topic_filter,
    validate_topic_name,
)
from adapters.mqtt.packets import PUBLISH as PUBLISH_TYPE
from adapters.mqtt.packets import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    MqttLocalProtocolError,
    MqttRemoteProtocolError,
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
    UnsupportedProtocolVersion,
    Will,
    v3_connack_return_code,
)
from adapters.mqtt.properties import _ascii_pairs, encode_properties, encode_utf8, encode_varint
from gateway.errors import LocalProtocolError, ProtocolError, RemoteProtocolError

from .test_vectors import OPENING, client_after_connect, h, server_after_connect

R = ReasonCode
MALFORMED, PROTOCOL, TOPIC = R.MALFORMED_PACKET, R.PROTOCOL_ERROR, R.TOPIC_NAME_INVALID
MQTT = "00 04 4d 51 54 54"  # "MQTT"

# (id, level the connection is at (None: fresh, no CONNECT yet), side, bytes, reason code)
BAD: list[tuple[str, int | None, object, str, ReasonCode]] = [
    # fixed header
    ("reserved-type-0", 4, SERVER, "00 00", MALFORMED),
    ("auth-is-reserved-in-311", 4, SERVER, "f0 00", MALFORMED),
    ("subscribe-flags-0 [MQTT-3.8.1-1]", 4, SERVER, "80 06 00 01 00 01 74 00", MALFORMED),
    ("unsubscribe-flags-0 [MQTT-3.10.1-1]", 4, SERVER, "a0 05 00 01 00 01 74", MALFORMED),
    ("pubrel-flags-0 [MQTT-3.6.1-1]", 4, SERVER, "60 02 00 01", MALFORMED),
    ("pubrel-dup-only-allowed-in-31", 4, SERVER, "6a 02 00 01", MALFORMED),
    ("puback-flags-2 [MQTT-2.1.3-1]", 5, SERVER, "42 02 00 01", MALFORMED),
    ("pingreq-flags-1", 4, SERVER, "c1 00", MALFORMED),
    ("connect-flags-1", None, SERVER, "11 0f " + MQTT + " 04 02 00 3c 00 03 61 62 63", MALFORMED),
    ("remaining-length-5-bytes", 4, SERVER, "30 ff ff ff ff 01", MALFORMED),
    ("remaining-length-not-shortest [MQTT-1.5.5-1]", 4, SERVER, "30 80 00", MALFORMED),
    # PUBLISH
    ("publish-qos-3 [MQTT-3.3.1-4]", 4, SERVER, "36 05 00 01 74 00 01", MALFORMED),
    ("publish-qos0-dup [MQTT-3.3.1-2]", 4, SERVER, "38 04 00 01 74 78", MALFORMED),
    ("publish-qos0-dup-v5", 5, SERVER, "38 05 00 01 74 00 78", MALFORMED),
    ("topic-bad-utf8 [MQTT-1.5.4-1]", 4, SERVER, "30 05 00 02 c3 28 78", MALFORMED),
    ("topic-surrogate [MQTT-1.5.4-1]", 4, SERVER, "30 05 00 03 ed a0 80", MALFORMED),
    ("topic-overlong-utf8", 4, SERVER, "30 04 00 02 c0 af", MALFORMED),
    ("topic-nul [MQTT-1.5.4-2]", 4, SERVER, "30 05 00 02 61 00 78", MALFORMED),
    ("topic-hash [MQTT-3.3.2-2]", 4, SERVER, "30 05 00 03 61 2f 23", TOPIC),
    ("topic-plus [MQTT-3.3.2-2]", 5, CLIENT, "30 06 00 03 2b 2f 61 00", TOPIC),
    ("topic-empty-311 [MQTT-4.7.3-1]", 4, SERVER, "30 03 00 00 78", PROTOCOL),
    ("topic-empty-v5-without-alias", 5, SERVER, "30 04 00 00 00 78", PROTOCOL),
    ("topic-runs-past-end", 4, SERVER, "30 03 00 05 74", MALFORMED),
    ("publish-too-short-for-topic-length", 4, SERVER, "30 01 00", MALFORMED),
    ("publish-packet-id-0 [MQTT-2.2.1-3]", 4, SERVER, "32 05 00 01 74 00 00", PROTOCOL),
    ("publish-qos1-no-packet-id", 4, SERVER, "32 04 00 01 74 00", MALFORMED),
    ("publish-v5-no-property-length", 5, SERVER, "30 03 00 01 74", MALFORMED),
    ("topic-alias-0 [MQTT-3.3.2-8]", 5, SERVER, "30 07 00 00 03 23 00 00 78",
     R.TOPIC_ALIAS_INVALID),
    ("client-publish-with-subscription-id [MQTT-3.3.4-6]", 5, SERVER,
     "30 06 00 01 74 02 0b 01", PROTOCOL),
    # properties
    ("property-repeated [MQTT-2.2.2-2]", 5, SERVER,
     "30 0e 00 01 74 0a 02 00 00 00 01 02 00 00 00 02", PROTOCOL),
    ("property-not-allowed-in-packet", 5, SERVER, "30 09 00 01 74 05 11 00 00 00 01", MALFORMED),
    ("property-unknown-identifier", 5, SERVER, "30 06 00 01 74 02 7f 00", MALFORMED),
    ("property-two-byte-identifier", 5, SERVER, "30 07 00 01 74 03 81 01 00", MALFORMED),
    ("property-value-out-of-range", 5, SERVER, "30 06 00 01 74 02 01 02", PROTOCOL),
    ("property-length-past-end", 5, SERVER, "30 05 00 01 74 05 01", MALFORMED),
    ("property-value-past-property-length", 5, SERVER, "30 07 00 01 74 02 02 00 00", MALFORMED),
    ("property-string-bad-utf8", 5, CLIENT, "32 0b 00 01 74 00 01 05 03 00 02 c3 28", MALFORMED),
    ("property-response-topic-wildcard [MQTT-3.3.2-14]", 5, SERVER,
     "30 09 00 01 74 05 08 00 02 61 23", PROTOCOL),
    ("subscription-id-5-byte-varint", 5, SERVER,
     "82 0d 00 01 06 0b 80 80 80 80 01 00 01 74 00", MALFORMED),
    ("subscription-id-not-shortest [MQTT-1.5.5-1]", 5, SERVER,
     "82 0a 00 01 03 0b 81 00 00 01 74 00", MALFORMED),
    ("subscription-id-0", 5, SERVER, "82 09 00 01 02 0b 00 00 01 74 00", PROTOCOL),
    ("subscription-id-twice-in-subscribe", 5, SERVER,
     "82 0b 00 01 04 0b 01 0b 02 00 01 74 00", PROTOCOL),
    ("receive-maximum-0", None, SERVER,
     "10 13 " + MQTT + " 05 02 00 3c 03 21 00 00 00 03 61 62 63", PROTOCOL),
    ("maximum-qos-2", 5, CLIENT, "20 05 00 00 02 24 02", PROTOCOL),
    # CONNECT
    ("connect-reserved-flag [MQTT-3.1.2-3]", None, SERVER,
     "10 0f " + MQTT + " 04 03 00 3c 00 03 61 62 63", MALFORMED),
    ("will-qos-without-will-flag [MQTT-3.1.2-11]", None, SERVER,
     "10 0f " + MQTT + " 04 0a 00 3c 00 03 61 62 63", MALFORMED),
    ("will-retain-without-will-flag [MQTT-3.1.2-13]", None, SERVER,
     "10 0f " + MQTT + " 04 22 00 3c 00 03 61 62 63", MALFORMED),
    ("will-qos-3 [MQTT-3.1.2-12]", None, SERVER,
     "10 14 " + MQTT + " 04 1e 00 3c 00 03 61 62 63 00 01 74 00 00", MALFORMED),
    ("will-topic-wildcard", None, SERVER,
     "10 14 " + MQTT + " 04 06 00 3c 00 03 61 62 63 00 01 23 00 00", TOPIC),
    ("will-missing", None, SERVER, "10 0f " + MQTT + " 04 06 00 3c 00 03 61 62 63", MALFORMED),
    ("password-without-user-311 [MQTT-3.1.2-22]", None, SERVER,
     "10 12 " + MQTT + " 04 42 00 3c 00 03 61 62 63 00 01 70", MALFORMED),
    ("password-without-user-31", None, SERVER,
     "10 14 00 06 4d 51 49 73 64 70 03 42 00 3c 00 03 61 62 63 00 01 70", MALFORMED),
    ("user-flag-without-user", None, SERVER, "10 0f " + MQTT + " 04 82 00 3c 00 03 61 62 63",
     MALFORMED),
    ("client-id-nul", None, SERVER, "10 0f " + MQTT + " 04 02 00 3c 00 03 61 00 63", MALFORMED),
    ("connect-trailing-byte", None, SERVER,
     "10 10 " + MQTT + " 04 02 00 3c 00 03 61 62 63 00", MALFORMED),
    ("connect-truncated-header", None, SERVER, "10 08 " + MQTT + " 04 02", MALFORMED),
    ("connect-no-level", None, SERVER, "10 06 " + MQTT, MALFORMED),
    ("auth-data-without-method", None, SERVER,
     "10 15 " + MQTT + " 05 02 00 3c 05 16 00 02 01 02 00 03 61 62 63", PROTOCOL),
    ("first-packet-not-connect [MQTT-3.1.0-1]", None, SERVER, "c0 00", PROTOCOL),
    ("publish-before-connect [MQTT-3.1.0-1]", None, SERVER, "30 04 00 01 74 78", PROTOCOL),
    ("second-connect [MQTT-3.1.0-2]", 4, SERVER,
     "10 0f " + MQTT + " 04 02 00 3c 00 03 61 62 63", PROTOCOL),
    # direction
    ("server-receives-connack", 4, SERVER, "20 02 00 00", PROTOCOL),
    ("server-receives-suback", 5, SERVER, "90 04 00 01 00 00", PROTOCOL),
    ("client-receives-subscribe", 4, CLIENT, "82 06 00 01 00 01 74 00", PROTOCOL),
    ("client-receives-pingreq", 5, CLIENT, "c0 00", PROTOCOL),
    ("client-311-receives-disconnect", 4, CLIENT, "e0 00", PROTOCOL),
    ("client-receives-connect", 4, CLIENT, "10 0f " + MQTT + " 04 02 00 3c 00 03 61 62 63",
     PROTOCOL),
    # acknowledgements
    ("puback-packet-id-0", 4, SERVER, "40 02 00 00", PROTOCOL),
    ("pubcomp-too-short", 4, CLIENT, "70 01 00", MALFORMED),
    ("puback-311-trailing", 4, SERVER, "40 03 00 01 00", MALFORMED),
    ("puback-v5-trailing-after-properties", 5, SERVER, "40 05 00 01 00 00 ff", MALFORMED),
    ("puback-v5-bad-reason (2.4)", 5, SERVER, "40 03 00 01 05", PROTOCOL),
    ("pubrel-v5-puback-reason", 5, SERVER, "62 03 00 01 10", PROTOCOL),
    ("disconnect-v5-bad-reason", 5, SERVER, "e0 01 10", PROTOCOL),
    ("auth-v5-bad-reason", 5, SERVER, "f0 02 01 00", PROTOCOL),
    ("server-disconnect-session-expiry [MQTT-3.14.2-2]", 5, CLIENT,
     "e0 07 00 05 11 00 00 00 0a", PROTOCOL),
    ("disconnect-311-with-body", 4, SERVER, "e0 01 00", MALFORMED),
    ("pingreq-with-body", 4, SERVER, "c0 01 00", MALFORMED),
    ("pingresp-with-body", 5, CLIENT, "d0 01 00", MALFORMED),
    # CONNACK
    ("connack-reserved-flags [MQTT-3.2.2-1]", 4, CLIENT, "20 02 02 00", MALFORMED),
    ("connack-311-reserved-return-code", 4, CLIENT, "20 02 00 06", PROTOCOL),
    ("connack-session-present-with-refusal", 4, CLIENT, "20 02 01 05", PROTOCOL),
    ("connack-v5-session-present-with-refusal [MQTT-3.2.2-6]", 5, CLIENT, "20 03 01 87 00",
     PROTOCOL),
    ("connack-v5-bad-reason", 5, CLIENT, "20 03 00 10 00", PROTOCOL),
    ("connack-311-trailing", 4, CLIENT, "20 03 00 00 00", MALFORMED),
    ("connack-too-short", 4, CLIENT, "20 01 00", MALFORMED),
    # SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK
    ("subscribe-no-filter-311 [MQTT-3.8.3-3]", 4, SERVER, "82 02 00 01", PROTOCOL),
    ("subscribe-no-filter-v5 [MQTT-3.8.3-2]", 5, SERVER, "82 03 00 01 00", PROTOCOL),
    ("subscribe-packet-id-0", 4, SERVER, "82 06 00 00 00 01 74 00", PROTOCOL),
    ("subscribe-filter-without-options", 4, SERVER, "82 05 00 01 00 01 74", MALFORMED),
    ("subscribe-311-qos-reserved-bits [MQTT-3-8.3-4]", 4, SERVER, "82 06 00 01 00 01 74 04",
     MALFORMED),
    ("subscribe-311-qos-3", 4, SERVER, "82 06 00 01 00 01 74 03", MALFORMED),
    ("subscribe-v5-reserved-bits [MQTT-3.8.3-5]", 5, SERVER, "82 07 00 01 00 00 01 74 40",
     MALFORMED),
    ("subscribe-v5-qos-3", 5, SERVER, "82 07 00 01 00 00 01 74 03", PROTOCOL),
    ("subscribe-v5-retain-handling-3", 5, SERVER, "82 07 00 01 00 00 01 74 30", PROTOCOL),
    ("subscribe-v5-no-local-shared [MQTT-3.8.3-4]", 5, SERVER,
     "82 10 00 01 00 00 0a 24 73 68 61 72 65 2f 67 2f 78 04", PROTOCOL),
    ("subscribe-filter-bad-utf8", 4, SERVER, "82 07 00 01 00 02 c3 28 00", MALFORMED),
    ("unsubscribe-no-filter [MQTT-3.10.3-2]", 4, SERVER, "a2 02 00 01", PROTOCOL),
    ("unsubscribe-packet-id-0", 5, SERVER, "a2 06 00 00 00 00 01 74", PROTOCOL),
    ("unsubscribe-filter-nul", 4, SERVER, "a2 05 00 01 00 01 00", MALFORMED),
    ("suback-311-bad-code [MQTT-3.9.3-2]", 4, CLIENT, "90 03 00 01 03", PROTOCOL),
    ("suback-no-codes", 4, CLIENT, "90 02 00 01", PROTOCOL),
    ("suback-v5-bad-code", 5, CLIENT, "90 04 00 01 00 11", PROTOCOL),
    ("unsuback-311-trailing", 4, CLIENT, "b0 03 00 01 00", MALFORMED),
    ("unsuback-v5-no-codes", 5, CLIENT, "b0 03 00 01 00", PROTOCOL),
]


def fresh_or_connected(level: int | None, side: object) -> MqttCodec:
    if level is None:
        return MqttCodec(SERVER if side is SERVER else CLIENT)
    return server_after_connect(level) if side is SERVER else client_after_connect(level)


@pytest.mark.parametrize(("level", "side", "data", "reason"),
                         [pytest.param(lv, side, hx, rc, id=i) for i, lv, side, hx, rc in BAD])
def test_bad_input_raises_remote_error_with_reason(level, side, data, reason):
    # Both whole and byte by byte: detection must not depend on how bytes arrive.
    for chunks in ([h(data)], [bytes((b,)) for b in h(data)]):
        codec = fresh_or_connected(level, side)
        with pytest.raises(MqttRemoteProtocolError) as info:
            for chunk in chunks:
                codec.receive_data(chunk)
                codec.events_received()
        assert info.value.reason_code == reason, str(info.value)
        assert isinstance(info.value, RemoteProtocolError)
        assert info.value.reason == reason.name.lower().replace("_", "-")
        assert codec.failed


def test_bad_table_cases_are_valid_once_fixed():
    # The table's inputs are each one defect away from valid; a few spot checks that the
    # defect, not something else, is what is caught.
    codec = server_after_connect(4)
    codec.receive_data(h("30 05 00 03 61 2f 62"))
    assert codec.events_received() == [Publish("a/b")]
    codec = server_after_connect(5)
    codec.receive_data(h("30 07 00 00 03 23 00 01 78"))
    assert codec.events_received() == [Publish("", b"x", properties={"topic_alias": 1})]
    codec = server_after_connect(4)
    codec.receive_data(h("82 06 00 01 00 01 74 02"))
    assert codec.events_received() == [Subscribe(1, [("t", SubscriptionOptions(2))])]


@pytest.mark.parametrize(("name", "level", "reply"), [
    ("MQTT", 6, "20 03 00 84 00"),
    ("MQTT", 3, "20 02 00 01"),
    ("MQIsdp", 4, "20 02 00 01"),
    ("MQTX", 4, "20 02 00 01"),
])
def test_unsupported_protocol_carries_level_and_reply(name, level, reply):
    raw = name.encode()
    body = len(raw).to_bytes(2, "big") + raw + bytes((level, 2, 0, 60)) + h("00 01 61")
    codec = MqttCodec(SERVER)
    codec.receive_data(bytes((0x10, len(body))) + body)
    with pytest.raises(UnsupportedProtocolVersion) as info:
        codec.events_received()
    exc = info.value
    assert (exc.protocol_name, exc.protocol_level) == (name, level)
    assert exc.reason_code == R.UNSUPPORTED_PROTOCOL_VERSION
    assert exc.reply == h(reply)
    assert codec.protocol_level is None


def test_level_is_known_early_so_a_bad_connect_can_be_answered():
    codec = MqttCodec(SERVER)
    codec.receive_data(h("10 10 " + MQTT + " 05 03 00 3c 00 00 03 61 62 63"))  # reserved flag
    with pytest.raises(MqttRemoteProtocolError):
        codec.events_received()
    assert codec.protocol_level == 5
    codec.send_connack(False, R.MALFORMED_PACKET)
    assert codec.data_to_send() == h("20 03 00 81 00")


@pytest.mark.parametrize(("level", "data", "reason"), [
    (None, b"GET / HTTP/1.1\r\n", PROTOCOL),  # 'G' reads as PUBACK, length 'E' = 69
    (4, h("42 10"), MALFORMED),  # PUBACK with flags 0b0010, body not yet here
    (4, h("f0 7f 00"), MALFORMED),  # AUTH at 3.1.1
    (5, h("36 7f 00"), MALFORMED),  # PUBLISH QoS 3
    (4, h("20 7f"), PROTOCOL),  # CONNACK to a server
])
def test_bad_header_is_refused_before_the_body_arrives(level, data, reason):
    codec = fresh_or_connected(level, SERVER)
    codec.receive_data(data)
    with pytest.raises(MqttRemoteProtocolError) as info:
        codec.events_received()
    assert info.value.reason_code == reason


def test_earlier_good_packets_travel_on_the_error():
    codec = server_after_connect(4)
    codec.receive_data(h("c0 00 30 05 00 01 74 00 00 36 00"))
    with pytest.raises(MqttRemoteProtocolError) as info:
        codec.events_received()
    assert info.value.events == [PingReq(), Publish("t", b"\x00\x00")]


def test_a_failed_codec_ignores_input_but_still_sends():
    codec = server_after_connect(5)
    codec.receive_data(h("00 00"))
    with pytest.raises(MqttRemoteProtocolError):
        codec.events_received()
    codec.receive_data(h("c0 00"))
    assert codec.events_received() == []
    codec.send_disconnect(R.MALFORMED_PACKET)
    assert codec.data_to_send() == h("e0 01 81")


def test_eof_inside_a_packet_is_reported():
    codec = server_after_connect(4)
    codec.receive_data(h("c0 00 30 05 00"))
    assert codec.events_received() == [PingReq()]
    codec.receive_eof()
    with pytest.raises(MqttRemoteProtocolError) as info:
        codec.events_received()
    assert info.value.reason_code == MALFORMED
    with pytest.raises(MqttLocalProtocolError):
        codec.receive_data(b"x")


def test_eof_between_packets_is_clean():
    codec = server_after_connect(4)
    codec.receive_data(h("c0 00"))
    codec.receive_eof()
    assert codec.events_received() == [PingReq()]
    assert codec.events_received() == []


# ---------------------------------------------------------------------------- size limits


def test_default_limit_is_the_named_constant():
    assert MqttCodec(SERVER).max_packet_size == DEFAULT_MAX_PACKET_SIZE


def test_oversized_packet_is_refused_from_its_fixed_header_alone():
    codec = MqttCodec(SERVER, max_packet_size=1000)
    codec.receive_data(OPENING[4][0])
    codec.events_received()
    # A PUBLISH announcing 1,000,000 bytes; only its first 10 body bytes have arrived.
    codec.receive_data(h("30 c0 84 3d 00 01 74") + b"x" * 7)
    with pytest.raises(MqttRemoteProtocolError) as info:
        codec.events_received()
    assert info.value.reason_code == R.PACKET_TOO_LARGE
    assert len(codec._buf) == 0  # nothing kept
    codec.receive_data(b"x" * 5000)
    assert len(codec._buf) == 0


def test_limit_counts_the_whole_packet():
    packet = encode_publish("t", b"x" * 95, 0, False, False, None, None, 4)
    assert len(packet) == 100
    for limit, ok in ((100, True), (99, False)):
        codec = MqttCodec(SERVER, max_packet_size=limit)
        codec.receive_data(OPENING[4][0])
        codec.events_received()
        codec.receive_data(packet[:3])
        if ok:
            assert codec.events_received() == []
            codec.receive_data(packet[3:])
            assert len(codec.events_received()) == 1
        else:
            with pytest.raises(MqttRemoteProtocolError):
                codec.events_received()


def test_large_packet_in_many_pieces_is_not_rescanned():
    codec = server_after_connect(4)
    packet = encode_publish("t", bytes(200_000), 0, False, False, None, None, 4)
    for i in range(0, len(packet), 1000):
        codec.receive_data(packet[i:i + 1000])
        events = codec.events_received()
    assert events == [Publish("t", bytes(200_000))]


def test_peer_maximum_packet_size_limits_sending():
    codec = MqttCodec(SERVER)
    codec.receive_data(h("10 15 " + MQTT + " 05 02 00 3c 05 27 00 00 00 14 00 03 61 62 63"))
    assert codec.events_received()[0].properties == {"maximum_packet_size": 20}
    assert codec.peer_max_packet_size == 20
    with pytest.raises(MqttLocalProtocolError):
        codec.send_publish("t", b"x" * 15)  # 2 + 3 + 1 + 15 = 21 bytes
    assert codec.data_to_send() == b""
    codec.send_publish("t", b"x" * 14)
    assert len(codec.data_to_send()) == 20


def test_peer_maximum_packet_size_error_reason():
    codec = server_after_connect(5)
    codec.peer_max_packet_size = 10
    with pytest.raises(MqttLocalProtocolError) as info:
        codec.send_publish("t", b"x" * 10)
    assert info.value.reason_code == R.PACKET_TOO_LARGE
    assert isinstance(info.value, LocalProtocolError)
    with pytest.raises(MqttLocalProtocolError):
        codec.send_encoded(encode_publish("t", b"x" * 10, 0, False, False, None, None, 5))
    assert not codec.has_data


def test_client_learns_peer_limit_from_connack():
    codec = client_after_connect(5)
    codec.receive_data(h("20 08 00 00 05 27 00 00 01 00"))
    assert codec.events_received() == [ConnAck(False, 0, {"maximum_packet_size": 256})]
    assert codec.peer_max_packet_size == 256


# -------------------------------------------------------------------------------- sending

LOCAL_BAD = [
    ("before-connect", None, SERVER, PingResp()),
    ("client-publish-before-connect", None, CLIENT, Publish("t")),
    ("server-sends-connect", 4, SERVER, Connect()),
    ("client-sends-connack", 4, CLIENT, ConnAck()),
    ("client-sends-suback", 4, CLIENT, SubAck(1, [0])),
    ("server-sends-subscribe", 4, SERVER, Subscribe(1, [("t", SubscriptionOptions())])),
    ("server-311-disconnect", 4, SERVER, Disconnect()),
    ("auth-311", 4, SERVER, Auth()),
    ("second-connect", 4, CLIENT, Connect()),
    ("wildcard-topic", 4, SERVER, Publish("a/#")),
    ("nul-topic", 5, SERVER, Publish("a\x00")),
    ("empty-topic-311", 4, SERVER, Publish("")),
    ("empty-topic-v5-no-alias", 5, SERVER, Publish("")),
    ("surrogate-topic", 4, SERVER, Publish("\ud800")),
    ("qos0-with-packet-id", 4, SERVER, Publish("t", packet_id=1)),
    ("qos0-dup", 4, SERVER, Publish("t", dup=True)),
    ("qos1-without-packet-id", 4, SERVER, Publish("t", qos=1)),
    ("qos3", 4, SERVER, Publish("t", qos=3, packet_id=1)),
    ("packet-id-0", 4, SERVER, PubAck(0)),
    ("packet-id-too-big", 4, SERVER, PubAck(65536)),
    ("property-not-allowed", 5, SERVER, Publish("t", properties={"session_expiry_interval": 1})),
    ("property-unknown", 5, SERVER, Publish("t", properties={"colour": 1})),
    ("property-out-of-range", 5, SERVER, Publish("t", properties={"topic_alias": 0})),
    ("property-wrong-type", 5, SERVER, Publish("t", properties={"content_type": 5})),
    ("property-list-expected", 5, SERVER, Publish("t", properties={"user_property": ("a", "b")})),
    ("property-not-a-pair", 5, SERVER, Publish("t", properties={"user_property": [("a",)]})),
    ("property-bytes-expected", 5, SERVER, Publish("t", properties={"correlation_data": "x"})),
    ("subscription-id-twice-in-subscribe", 5, CLIENT,
     Subscribe(1, [("t", SubscriptionOptions())], {"subscription_identifier": [1, 2]})),
    ("bad-reason-code", 5, SERVER, PubAck(1, R.GRANTED_QOS_1)),
    ("bad-connack-code", 5, SERVER, ConnAck(False, R.NO_MATCHING_SUBSCRIBERS)),
    ("session-present-refused", 5, SERVER, ConnAck(True, R.NOT_AUTHORIZED)),
    ("subscribe-empty", 4, CLIENT, Subscribe(1, [])),
    ("subscribe-bad-qos", 4, CLIENT, Subscribe(1, [("t", SubscriptionOptions(3))])),
    ("unsubscribe-empty", 4, CLIENT, Unsubscribe(1, [])),
    ("suback-empty", 4, SERVER, SubAck(1, [])),
    ("unsuback-v5-empty", 5, SERVER, UnsubAck(1, [])),
    ("string-too-long", 4, CLIENT, Unsubscribe(1, ["a" * 65536])),
]


@pytest.mark.parametrize(("level", "side", "packet"),
                         [pytest.param(lv, s, p, id=i) for i, lv, s, p in LOCAL_BAD])
def test_sending_what_mqtt_forbids_raises_local_error(level, side, packet):
    codec = fresh_or_connected(level, side)
    with pytest.raises(MqttLocalProtocolError):
        codec.send(packet)
    assert codec.data_to_send() == b""


@pytest.mark.parametrize("connect", [
    Connect("MQTT", 3), Connect("MQIsdp", 4), Connect("MQTT", 6),
    Connect(password=b"p"),
    Connect(will=Will("a/+")),
    Connect(will=Will("t", qos=3)),
    Connect(keepalive=70000),
    Connect("MQTT", 5, properties={"authentication_data": b"x"}),
])
def test_bad_connect_is_refused_locally(connect):
    with pytest.raises(MqttLocalProtocolError):
        MqttCodec(CLIENT).send(connect)


def test_client_connect_sets_level():
    codec = MqttCodec(CLIENT)
    codec.send_connect("c", protocol_level=5, keepalive=5)
    assert codec.protocol_level == 5
    assert codec.data_to_send() == h("10 0e " + MQTT + " 05 02 00 05 00 00 01 63")


def test_v3_connack_translation():
    assert v3_connack_return_code(R.SUCCESS) == 0
    assert v3_connack_return_code(R.BANNED) == 5
    assert v3_connack_return_code(R.QUOTA_EXCEEDED) == 3
    codec = server_after_connect(4)
    codec.send_connack(False, R.BAD_USER_NAME_OR_PASSWORD)
    codec.send_connack(False, R.SERVER_BUSY)
    codec.send_connack(False, 5)  # a 3.1.1 return code is taken as it is
    assert codec.data_to_send() == h("20 02 00 04  20 02 00 03  20 02 00 05")


def test_31_connack_has_no_session_present():
    codec = server_after_connect(3)
    codec.send_connack(True)
    assert codec.data_to_send() == h("20 02 00 00")


def test_v3_drops_what_it_cannot_carry():
    codec = server_after_connect(4)
    codec.send(PubAck(1, R.NO_MATCHING_SUBSCRIBERS, {"reason_string": "x"}))
    codec.send(SubAck(2, [R.GRANTED_QOS_0, R.TOPIC_FILTER_INVALID, R.QUOTA_EXCEEDED]))
    codec.send(UnsubAck(3, [R.SUCCESS]))
    codec.send(Publish("t", properties={"content_type": "x"}))
    assert codec.data_to_send() == h("40 02 00 01  90 05 00 02 00 80 80  b0 02 00 03 "
                                     " 30 03 00 01 74")


def test_data_to_send_joins_and_clears():
    codec = server_after_connect(4)
    assert not codec.has_data
    codec.send_pingresp()
    codec.send_puback(7)
    assert codec.has_data
    assert codec.data_to_send() == h("d0 00 40 02 00 07")
    assert codec.data_to_send() == b""
    assert not codec.has_data


def test_encode_publish_bytes_topic_and_repacking():
    a = encode_publish("s/t", b"p", 1, True, False, 1, None, 4)
    assert a == encode_publish(b"s/t", b"p", 1, True, False, 1, None, 4)
    assert a == h("33 08 00 03 73 2f 74 00 01 70")
    assert publish_with_packet_id(a, 0x0203, dup=True) == h("3b 08 00 03 73 2f 74 02 03 70")
    b = encode_publish("t", b"x" * 200, 2, False, True, 9, {"content_type": "c"}, 5)
    assert publish_with_packet_id(b, 10) == encode_publish(
        "t", b"x" * 200, 2, False, False, 10, {"content_type": "c"}, 5)
    with pytest.raises(MqttLocalProtocolError):
        publish_with_packet_id(encode_publish("t", b"", 0, False, False, None, None, 4), 1)
    with pytest.raises(MqttLocalProtocolError):
        encode_publish(b"a/+", b"", 0, False, False, None, None, 4)


# ------------------------------------------------------------------ topic name and filter


@pytest.mark.parametrize(("topic", "ok"), [
    ("a", True), ("a/b/c", True), ("/", True), ("$SYS/x", True), ("a b", True),
    ("", False), ("a/+", False), ("#", False), ("a\x00", False), ("a" * 65536, False),
    ("\ud800", False), ("\u00e9" * 32767, True), ("\u00e9" * 32768, False),
])
def test_validate_topic_name(topic, ok):
    assert validate_topic_name(topic) is ok


@pytest.mark.parametrize(("topic_filter", "ok"), [
    ("a", True), ("#", True), ("+", True), ("a/#", True), ("a/+/b", True), ("+/+", True),
    ("/#", True), ("a//b", True), ("$share/g/a/#", True), ("$share/g/+", True),
    ("", False), ("a#", False), ("a/#/b", False), ("a/b#", False), ("a+", False),
    ("a/+b/c", False), ("#/", False), ("a\x00", False),
    ("$share/g", False), ("$share//a", False), ("$share/g/", False), ("$share/g+/a", False),
    ("$share/#/a", False),
])
def test_validate_topic_filter(topic_filter, ok):
    assert validate_topic_filter(topic_filter) is ok


def test_validate_topic_filter_without_shared_subscriptions():
    assert validate_topic_filter("$share/+/a", shared=False)
    assert not validate_topic_filter("$share/+/a")


def test_subscribe_filters_are_returned_unvalidated():
    codec = server_after_connect(5)
    codec.receive_data(h("82 08 00 01 00 00 02 61 23 01"))  # "a#": invalid, but syntax only
    assert codec.events_received() == [Subscribe(1, [("a#", SubscriptionOptions(1))])]


# ------------------------------------------------------------------ client and server pair


class Pair:
    """A client and a server codec joined by a fake link (h11 ``ConnectionPair``)."""

    def __init__(self) -> None:
        self.client = MqttCodec(CLIENT)
        self.server = MqttCodec(SERVER)

    def to_server(self) -> list:
        self.server.receive_data(self.client.data_to_send())
        return self.server.events_received()

    def to_client(self) -> list:
        self.client.receive_data(self.server.data_to_send())
        return self.client.events_received()


@pytest.mark.parametrize("level", [3, 4, 5])
def test_pair_runs_a_whole_session(level):
    pair = Pair()
    c, s = pair.client, pair.server
    v5 = level == 5
    will = Will("dev/status", b"offline", 1, True, {"will_delay_interval": 3} if v5 else {})
    c.send_connect("dev-1", protocol_level=level, keepalive=30, will=will, username="u",
                   password=b"secret", clean_start=False)
    [connect] = pair.to_server()
    assert (connect.client_id, connect.will, connect.username, connect.password) == (
        "dev-1", will, "u", b"secret")
    assert s.protocol_level == level
    s.send_connack(True, R.SUCCESS, {"topic_alias_maximum": 4} if v5 else None)
    assert pair.to_client() == [ConnAck(level > 3, R.SUCCESS,  # no Session Present in 3.1
                                        {"topic_alias_maximum": 4} if v5 else {})]

    c.send_subscribe(1, [("dev/+/cmd", SubscriptionOptions(2)), ("a/#", SubscriptionOptions(1))])
    assert pair.to_server() == [Subscribe(1, [("dev/+/cmd", SubscriptionOptions(2)),
                                              ("a/#", SubscriptionOptions(1))])]
    s.send_suback(1, [R.GRANTED_QOS_2, R.GRANTED_QOS_1])
    assert pair.to_client() == [SubAck(1, [R.GRANTED_QOS_2, R.GRANTED_QOS_1])]

    # QoS 0, 1 and 2 from client to server, in one batch.
    c.send_publish("a/b", b"zero")
    c.send_publish("a/b", b"one", 1, packet_id=10)
    c.send_publish("a/b", b"two", 2, packet_id=11, retain=True)
    assert pair.to_server() == [Publish("a/b", b"zero"), Publish("a/b", b"one", 1, packet_id=10),
                                Publish("a/b", b"two", 2, True, packet_id=11)]
    s.send_puback(10)
    s.send_pubrec(11)
    assert pair.to_client() == [PubAck(10), PubRec(11)]
    c.send_pubrel(11)
    assert pair.to_server() == [PubRel(11)]
    s.send_pubcomp(11)
    assert pair.to_client() == [PubComp(11)]

    # Server to client, a redelivery with DUP.
    s.send_publish("dev/1/cmd", b"go", 2, dup=True, packet_id=1)
    assert pair.to_client() == [Publish("dev/1/cmd", b"go", 2, False, True, 1)]

    c.send_unsubscribe(2, ["a/#"])
    assert pair.to_server() == [Unsubscribe(2, ["a/#"])]
    s.send_unsuback(2, [R.SUCCESS])
    assert pair.to_client() == [UnsubAck(2, [R.SUCCESS] if v5 else [])]

    c.send_pingreq()
    assert pair.to_server() == [PingReq()]
    s.send_pingresp()
    assert pair.to_client() == [PingResp()]

    if v5:
        c.send_auth(R.RE_AUTHENTICATE, {"authentication_method": "M"})
        assert pair.to_server() == [Auth(R.RE_AUTHENTICATE, {"authentication_method": "M"})]
        s.send_disconnect(R.SERVER_SHUTTING_DOWN)
        assert pair.to_client() == [Disconnect(R.SERVER_SHUTTING_DOWN)]
    c.send_disconnect()
    assert pair.to_server() == [Disconnect()]


def test_pair_refusal_on_311():
    pair = Pair()
    pair.client.send_connect("x")
    pair.to_server()
    pair.server.send_connack(False, R.NOT_AUTHORIZED)
    assert pair.server.data_to_send() == h("20 02 00 05")


def test_errors_are_protocol_errors():
    assert issubclass(MqttRemoteProtocolError, ProtocolError)
    assert issubclass(MqttLocalProtocolError, ProtocolError)
    assert issubclass(UnsupportedProtocolVersion, MqttRemoteProtocolError)


_PAIR_TEXT = st.text(st.characters(max_codepoint=0x2FF, blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_PAIR_TEXT, _PAIR_TEXT), max_size=6))
def test_user_properties_block_matches_the_pair_by_pair_encoding(pairs):
    """The Latin-1 block of ASCII pairs is byte for byte what the general path writes; a
    pair it cannot write (non-ASCII, NUL) leaves the whole list to the general path."""
    block = _ascii_pairs(pairs)
    if any("\x00" in k + v for k, v in pairs):
        assert block is None
        with pytest.raises(LocalProtocolError):
            encode_properties({"user_property": pairs}, PUBLISH_TYPE)
        return
    general = b"".join(b"\x26" + encode_utf8(k) + encode_utf8(v) for k, v in pairs)
    if all(k.isascii() and v.isascii() for k, v in pairs):
        assert block == general
    else:
        assert block is None
    assert encode_properties({"user_property": pairs}, PUBLISH_TYPE) == (
        encode_varint(len(general)) + general if pairs else b"\x00")


def test_user_properties_block_leaves_long_and_odd_items_to_the_general_path():
    assert _ascii_pairs([("a", "b" * 65_536)]) is None
    assert _ascii_pairs([["a", "b"]]) is None  # a list, not a tuple: the general path checks
    assert _ascii_pairs([("a", 1)]) is None
    assert _ascii_pairs([("k" * 300, "v")]) == b"\x26\x01\x2c" + b"k" * 300 + b"\x00\x01v"
