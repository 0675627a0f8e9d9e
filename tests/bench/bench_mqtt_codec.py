"""Benchmark of adapters.mqtt.codec: PUBLISH parse and encode rates.

Run as a script: ``python tests/bench/bench_mqtt_codec.py [--count N] [--read-size B]``. Not
a test: it asserts nothing about time; it prints packets per second. Target: > 500,000
parsed PUBLISH/s for 64-byte payloads.

What is measured, for MQTT 3.1.1 and 5.0, QoS 0 and QoS 1, 64-byte payloads on a
31-character topic:

* parse -- a server codec fed a stream of PUBLISH packets in reads of ``--read-size`` bytes
  (64 KiB, what an asyncio socket read typically returns under load), every packet of each
  read taken by one ``events_received()`` call;
* parse, one read per packet -- the worst case: a new call for every packet;
* encode -- ``encode_publish`` once per packet (the server's per-variant encoding), then
  ``publish_with_packet_id`` (the per-subscriber step for QoS 1), then the codec path
  ``send_publish`` + ``data_to_send``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from adapters.mqtt.codec import (  # noqa: E402
    CLIENT,
    SERVER,
    MqttCodec,
    encode_publish,
    publish_with_packet_id,
)

TOPIC = "sensors/device-0042/temperature"
PAYLOAD = bytes(range(64))
PROPS = {"content_type": "application/json", "user_property": [("site", "north")]}


def rate(label: str, ops: int, fn: Callable[[], None], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    per_s = ops / best
    print(f"  {label:<52} {per_s:>12,.0f} packets/s  ({best * 1e9 / ops:6.0f} ns/packet)")
    return per_s


def connected_server(level: int) -> MqttCodec:
    client = MqttCodec(CLIENT)
    client.send_connect("bench", protocol_level=level)
    server = MqttCodec(SERVER)
    server.receive_data(client.data_to_send())
    server.events_received()
    return server


def connected_client(level: int) -> MqttCodec:
    client = MqttCodec(CLIENT)
    client.send_connect("bench", protocol_level=level)
    client.data_to_send()
    return client


def bench_parse(level: int, qos: int, count: int, read_size: int, props: dict | None) -> float:
    packets = [encode_publish(TOPIC, PAYLOAD, qos, False, False, (i % 65535) + 1 if qos else None,
                              props, level) for i in range(count)]
    stream = b"".join(packets)
    reads = [stream[i:i + read_size] for i in range(0, len(stream), read_size)]
    size = len(packets[0])

    def run() -> None:
        codec = connected_server(level)
        n = 0
        for chunk in reads:
            codec.receive_data(chunk)
            n += len(codec.events_received())
        assert n == count

    extra = " +props" if props else ""
    return rate(f"parse  v{level} QoS {qos}{extra} ({size} B, {read_size // 1024} KiB reads)",
                count, run)


def bench_parse_single(level: int, qos: int, count: int) -> float:
    packets = [encode_publish(TOPIC, PAYLOAD, qos, False, False, (i % 65535) + 1 if qos else None,
                              None, level) for i in range(count)]

    def run() -> None:
        codec = connected_server(level)
        for packet in packets:
            codec.receive_data(packet)
            codec.events_received()

    return rate(f"parse  v{level} QoS {qos} (one read per packet)", count, run)


def bench_encode(level: int, qos: int, count: int) -> float:
    pid = 1 if qos else None

    def run() -> None:
        for _ in range(count):
            encode_publish(TOPIC, PAYLOAD, qos, False, False, pid, None, level)

    return rate(f"encode v{level} QoS {qos} encode_publish", count, run)


def bench_restamp(level: int, count: int) -> float:
    encoded = encode_publish(TOPIC, PAYLOAD, 1, False, False, 1, None, level)

    def run() -> None:
        for i in range(count):
            publish_with_packet_id(encoded, (i & 0x7FFF) + 1)

    return rate(f"encode v{level} QoS 1 publish_with_packet_id (per subscriber)", count, run)


def bench_codec_send(level: int, qos: int, count: int) -> float:
    def run() -> None:
        codec = connected_client(level)
        for i in range(count):
            codec.send_publish(TOPIC, PAYLOAD, qos, packet_id=(i & 0x7FFF) + 1 if qos else None)
            if not i & 255:
                codec.data_to_send()
        codec.data_to_send()

    return rate(f"encode v{level} QoS {qos} codec.send_publish + data_to_send", count, run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--read-size", type=int, default=64 * 1024)
    args = parser.parse_args()
    print(f"MQTT codec, {args.count:,} PUBLISH per run, best of 3 (Python {sys.version.split()[0]})")
    parsed = []
    for level in (4, 5):
        for qos in (0, 1):
            parsed.append(bench_parse(level, qos, args.count, args.read_size, None))
    bench_parse(5, 1, args.count, args.read_size, PROPS)
    for level in (4, 5):
        for qos in (0, 1):
            bench_parse_single(level, qos, args.count // 4)
    for level in (4, 5):
        for qos in (0, 1):
            bench_encode(level, qos, args.count)
    bench_restamp(4, args.count)
    for level in (4, 5):
        bench_codec_send(level, 1, args.count)
    print(f"slowest batched parse: {min(parsed):,.0f} PUBLISH/s (target > 500,000)")


if __name__ == "__main__":
    main()
