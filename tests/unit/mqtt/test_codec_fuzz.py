"""Hypothesis against the MQTT codec.

Two properties:

* whatever bytes arrive -- random, random bodies behind valid fixed headers, or the byte
  vectors with a byte changed, cut or inserted -- the codec returns packets or raises a
  ``ProtocolError``; any other exception is a bug;
* every valid packet, at every level and in its direction, encodes and parses back equal,
  and a stream of them parses to the same packets however it is cut into reads.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.mqtt.codec import CLIENT, SERVER, MqttCodec
from adapters.mqtt.packets import (
    AUTH,
    CONNACK,
    CONNECT,
    DISCONNECT,
    PUBLISH,
    REASON_CODES_ALLOWED,
    SUBACK,
    SUBSCRIBE,
    UNSUBACK,
    UNSUBSCRIBE,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    MqttRemoteProtocolError,
    Packet,
    PacketType,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    SubscriptionOptions,
    UnsubAck,
    Unsubscribe,
    Will,
)
from adapters.mqtt.properties import PROPERTIES, WILL, PropertyType, encode_varint
from gateway.errors import ProtocolError, RemoteProtocolError

from .test_vectors import C2S, PARSE_ONLY, VECTORS, client_after_connect, server_after_connect

FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def survive(codec: MqttCodec, chunks: list[bytes], eof: bool = False) -> list[Packet]:
    """Feed chunks; only a ProtocolError may escape, and after a remote one the codec is failed."""
    events: list[Packet] = []
    try:
        for chunk in chunks:
            codec.receive_data(chunk)
            events.extend(codec.events_received())
        if eof:
            codec.receive_eof()
            events.extend(codec.events_received())
    except RemoteProtocolError as exc:
        assert codec.failed
        assert exc.reason_code >= 0x80  # type: ignore[attr-defined]
    except ProtocolError:
        pass
    return events


def codec_at(level: int | None, side: object) -> MqttCodec:
    if level is None:
        return MqttCodec(side)  # type: ignore[arg-type]
    return server_after_connect(level) if side is SERVER else client_after_connect(level)


levels = st.sampled_from([None, 3, 4, 5])
sides = st.sampled_from([SERVER, CLIENT])


@FUZZ
@given(level=levels, side=sides, data=st.binary(max_size=200), eof=st.booleans())
def test_random_bytes_only_raise_protocol_errors(level, side, data, eof):
    survive(codec_at(level, side), [data], eof)


@FUZZ
@given(level=levels, side=sides, chunks=st.lists(st.binary(max_size=40), max_size=8))
def test_random_chunks_only_raise_protocol_errors(level, side, chunks):
    survive(codec_at(level, side), chunks)


# A valid first byte for every packet type (PUBLISH with any flags) and a random body of the
# length the header announces: this reaches every per-type parser.
first_bytes = st.one_of(
    st.sampled_from([(t << 4) | (2 if t in (6, 8, 10) else 0) for t in range(1, 16)]),
    st.integers(0x30, 0x3F), st.integers(0, 255))


@st.composite
def framed(draw: st.DrawFn) -> bytes:
    body = draw(st.binary(max_size=80))
    return bytes((draw(first_bytes),)) + encode_varint(len(body)) + body


@FUZZ
@given(level=levels, side=sides, packets=st.lists(framed(), min_size=1, max_size=4))
def test_random_bodies_only_raise_protocol_errors(level, side, packets):
    survive(codec_at(level, side), [b"".join(packets)])


def outcome(codec: MqttCodec, chunks: list[bytes]) -> tuple[list[Packet], object]:
    """The packets, and the reason code of the error (or None), from feeding ``chunks``."""
    events: list[Packet] = []
    try:
        for chunk in chunks:
            codec.receive_data(chunk)
            events.extend(codec.events_received())
    except MqttRemoteProtocolError as exc:
        return events + exc.events, exc.reason_code
    return events, None


@FUZZ
@given(level=levels, side=sides, packets=st.lists(framed(), min_size=1, max_size=3),
       cut=st.integers(0, 300))
def test_same_packets_and_same_error_however_bytes_are_split(level, side, packets, cut):
    data = b"".join(packets)
    whole = outcome(codec_at(level, side), [data])
    assert outcome(codec_at(level, side), [data[:cut], data[cut:]]) == whole
    assert outcome(codec_at(level, side), [data[i:i + 1] for i in range(len(data))]) == whole


ALL_VECTORS = [(lv, d, data) for _, lv, ds, data, _ in VECTORS + PARSE_ONLY for d in ds]


@st.composite
def mutated_vector(draw: st.DrawFn) -> tuple[int, str, bytes]:
    level, direction, data = draw(st.sampled_from(ALL_VECTORS))
    b = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["set", "cut", "insert", "delete"]))
        i = draw(st.integers(0, len(b)))
        if op == "set" and i < len(b):
            b[i] = draw(st.integers(0, 255))
        elif op == "cut":
            del b[i:]
        elif op == "insert":
            b[i:i] = bytes((draw(st.integers(0, 255)),))
        elif i < len(b):
            del b[i]
    return level, direction, bytes(b)


@settings(max_examples=1000, deadline=None)
@given(case=mutated_vector(), split=st.integers(0, 200), eof=st.booleans())
def test_mutated_vectors_only_raise_protocol_errors(case, split, eof):
    level, direction, data = case
    for fresh in (True, False):
        if fresh and not data[:1] == b"\x10":
            continue
        if fresh:
            codec = MqttCodec(SERVER)
        else:
            codec = server_after_connect(level) if direction == C2S else client_after_connect(level)
        survive(codec, [data[:split], data[split:]], eof)


# ---------------------------------------------------------------------- valid packets

text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"),
               max_size=12)
topic_names = text.filter(lambda s: s and "+" not in s and "#" not in s)
blobs = st.binary(max_size=20)
packet_ids = st.integers(1, 0xFFFF)


def property_value(spec: Any) -> st.SearchStrategy[Any]:
    t = spec.type
    if t is PropertyType.UTF8_STRING:
        return topic_names if spec.check is not None else text
    if t is PropertyType.BINARY_DATA:
        return blobs
    if t is PropertyType.UTF8_STRING_PAIR:
        return st.tuples(text, text)
    top = {PropertyType.BYTE: 0xFF, PropertyType.TWO_BYTE_INTEGER: 0xFFFF,
           PropertyType.FOUR_BYTE_INTEGER: 0xFFFF_FFFF,
           PropertyType.VARIABLE_BYTE_INTEGER: 268_435_455}[t]
    return st.integers(spec.low, top if spec.high is None else spec.high)


@st.composite
def properties(draw: st.DrawFn, context: int, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    props: dict[str, Any] = {}
    for spec in PROPERTIES:
        if context not in spec.contexts or spec.name in exclude or not draw(st.booleans()):
            continue
        if spec.repeatable_in:
            most = 3 if context in spec.repeatable_in else 1
            props[spec.name] = draw(st.lists(property_value(spec), min_size=1, max_size=most))
        else:
            props[spec.name] = draw(property_value(spec))
    return props


def reasons(t: PacketType) -> st.SearchStrategy[int]:
    return st.sampled_from(sorted(REASON_CODES_ALLOWED[t]))


@st.composite
def connects(draw: st.DrawFn, level: int) -> Connect:
    v5 = level == 5
    will = None
    if draw(st.booleans()):
        will = Will(draw(topic_names), draw(blobs), draw(st.integers(0, 2)), draw(st.booleans()),
                    draw(properties(WILL)) if v5 else {})
    username = draw(st.none() | text)
    password = draw(st.none() | blobs) if (v5 or username is not None) else None
    props = draw(properties(CONNECT)) if v5 else {}
    if "authentication_data" in props:
        props.setdefault("authentication_method", "m")
    return Connect("MQIsdp" if level == 3 else "MQTT", level, draw(st.booleans()),
                   draw(st.integers(0, 0xFFFF)), draw(text), will, username, password, props)


@st.composite
def publishes(draw: st.DrawFn, level: int, direction: str) -> Publish:
    qos = draw(st.integers(0, 2))
    v5 = level == 5
    exclude = ("subscription_identifier",) if direction == C2S else ()
    props = draw(properties(PUBLISH, exclude)) if v5 else {}
    topic = draw(topic_names | st.just("")) if "topic_alias" in props else draw(topic_names)
    return Publish(topic, draw(st.binary(max_size=300)), qos, draw(st.booleans()),
                   draw(st.booleans()) if qos else False, draw(packet_ids) if qos else None,
                   props)


@st.composite
def subscribes(draw: st.DrawFn, level: int) -> Subscribe:
    subs = []
    for topic_filter in draw(st.lists(text, min_size=1, max_size=4)):
        if level == 5:
            shared = topic_filter.startswith("$share/")
            options = SubscriptionOptions(draw(st.integers(0, 2)),
                                          False if shared else draw(st.booleans()),
                                          draw(st.booleans()), draw(st.integers(0, 2)))
        else:
            options = SubscriptionOptions(draw(st.integers(0, 2)))
        subs.append((topic_filter, options))
    return Subscribe(draw(packet_ids), subs, draw(properties(SUBSCRIBE)) if level == 5 else {})


@st.composite
def packets(draw: st.DrawFn, level: int, direction: str) -> Packet:
    """Any valid packet of ``level`` that goes in ``direction`` (CONNECT excluded)."""
    v5 = level == 5
    pid = draw(packet_ids)
    kinds = ["publish", "ack", "disconnect" if direction == C2S or v5 else "publish"]
    kinds += ["subscribe", "unsubscribe", "pingreq"] if direction == C2S else [
        "connack", "suback", "unsuback", "pingresp"]
    if v5:
        kinds.append("auth")
    kind = draw(st.sampled_from(kinds))
    if kind == "publish":
        return draw(publishes(level, direction))
    if kind == "ack":
        cls = draw(st.sampled_from([PubAck, PubRec, PubRel, PubComp]))
        t = cls.packet_type
        if not v5:
            return cls(pid)
        return cls(pid, draw(reasons(t)), draw(properties(t)))
    if kind == "subscribe":
        return draw(subscribes(level))
    if kind == "unsubscribe":
        return Unsubscribe(pid, draw(st.lists(text, min_size=1, max_size=4)),
                           draw(properties(UNSUBSCRIBE)) if v5 else {})
    if kind == "pingreq":
        return PingReq()
    if kind == "pingresp":
        return PingResp()
    if kind == "connack":
        if v5:
            rc = draw(reasons(CONNACK))
            return ConnAck(draw(st.booleans()) if rc == 0 else False, rc,
                           draw(properties(CONNACK)))
        rc = draw(st.sampled_from([0, 0x84, 0x85, 0x88, 0x86, 0x87]))
        return ConnAck(draw(st.booleans()) if rc == 0 and level > 3 else False, rc)
    if kind == "suback":
        codes = reasons(SUBACK) if v5 else st.sampled_from([0, 1, 2, 0x80])
        return SubAck(pid, draw(st.lists(codes, min_size=1, max_size=4)),
                      draw(properties(SUBACK)) if v5 else {})
    if kind == "unsuback":
        if not v5:
            return UnsubAck(pid)
        return UnsubAck(pid, draw(st.lists(reasons(UNSUBACK), min_size=1, max_size=4)),
                        draw(properties(UNSUBACK)))
    if kind == "disconnect":
        if not v5:
            return Disconnect()
        exclude = () if direction == C2S else ("session_expiry_interval",)
        return Disconnect(draw(reasons(DISCONNECT)), draw(properties(DISCONNECT, exclude)))
    return Auth(draw(reasons(AUTH)), draw(properties(AUTH)))


directions = st.sampled_from(["c2s", "s2c"])
all_levels = st.sampled_from([3, 4, 5])


def endpoints(level: int, direction: str) -> tuple[MqttCodec, MqttCodec]:
    if direction == C2S:
        return client_after_connect(level), server_after_connect(level)
    return server_after_connect(level), client_after_connect(level)


@settings(max_examples=500, deadline=None)
@given(data=st.data(), level=all_levels, direction=directions)
def test_valid_packets_round_trip(data, level, direction):
    packet = data.draw(packets(level, direction))
    sender, receiver = endpoints(level, direction)
    sender.send(packet)
    receiver.receive_data(sender.data_to_send())
    assert receiver.events_received() == [packet]


@settings(max_examples=200, deadline=None)
@given(data=st.data(), level=all_levels)
def test_connect_round_trips(data, level):
    connect = data.draw(connects(level))
    client, server = MqttCodec(CLIENT), MqttCodec(SERVER)
    client.send(connect)
    server.receive_data(client.data_to_send())
    assert server.events_received() == [connect]
    assert server.protocol_level == client.protocol_level == level


@settings(max_examples=200, deadline=None)
@given(data=st.data(), level=all_levels, direction=directions)
def test_a_stream_parses_the_same_however_it_is_cut(data, level, direction):
    stream = data.draw(st.lists(packets(level, direction), min_size=1, max_size=6))
    sender, _ = endpoints(level, direction)
    for packet in stream:
        sender.send(packet)
    wire = sender.data_to_send()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=6)))
    chunks = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True)]
    _, receiver = endpoints(level, direction)
    events: list[Packet] = []
    for chunk in chunks:
        receiver.receive_data(chunk)
        events.extend(receiver.events_received())
    assert events == stream


def test_strategies_reach_every_packet_type():
    # The round trip covers all 15 types (CONNECT through its own test).
    seen: set[type] = {Connect}
    for level in (4, 5):
        for direction in ("c2s", "s2c"):
            @settings(max_examples=300, deadline=None, database=None)
            @given(p=packets(level, direction))
            def collect(p: Packet) -> None:
                seen.add(type(p))
            collect()
    assert len(seen) == 15, seen
