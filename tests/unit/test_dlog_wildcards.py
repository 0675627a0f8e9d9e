"""The delivery log's ``dest`` for a wildcard subscription's messages, in the core: the topic
each message was published to, never the pattern (docs/delivery-log.md, "Wildcard
subscriptions"), for the records the broker writes on its own (a subscriber over the
topic's ``maxmsgs``, a laggard trimmed at the memory limit); and the text is the topic's
own string, not one made per message.

Through the in-process client API on a broker with an SQLite store (tests/corehelp.py); the
records are read back from the delivery-log files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from corehelp import T, running_broker

from gateway.broker import Broker
from gateway.message import DeliveryMode, Message

NP = DeliveryMode.NON_PERSISTENT


def records(b: Broker, tmp_path: Path) -> list[dict[str, Any]]:
    b.dlog.flush()
    out: list[dict[str, Any]] = []
    for f in sorted((tmp_path / "data" / "delivery-log").glob("*.jsonl")):
        out += [json.loads(line) for line in f.read_text().splitlines()]
    return out


async def test_a_wildcard_subscriber_over_maxmsgs_misses_a_message_on_its_topic(tmp_path):
    """``ex.>`` has ``maxmsgs=1``: a subscriber on ``ex.>`` that takes nothing misses the
    second message (overflowPolicy default, EMS User's Guide, "Destination Properties",
    overflowPolicy), and the ``drop`` (``exceeded``) names ``topic:ex.a``."""
    async with running_broker(tmp_path, topics=">\nex.> maxmsgs=1\n") as b:
        consumer = b.connect().session().consumer(T("ex.>"), window=0)
        p = b.connect().session().producer(T("ex.a"), delivery_mode=NP)
        p.send(Message.text("kept"))
        p.send(Message.text("missed"))
        assert consumer.endpoint.dropped == 1
        found = [(r["event"], r["dest"], r["reason"]) for r in records(b, tmp_path)]
    assert found == [("publish", "topic:ex.a", None), ("publish", "topic:ex.a", None),
                     ("drop", "topic:ex.a", "exceeded")]


async def test_a_wildcard_laggard_trimmed_at_the_limit_drops_on_the_message_topic(tmp_path):
    """A subscriber on ``lag.>`` that takes nothing holds a backlog past ``max_msg_memory``:
    its oldest messages go (reason ``slow_consumer``), and each ``drop`` names the topic the
    message was published to."""
    async with running_broker(tmp_path, gateway="max_msg_memory = 4MB\n") as b:
        hung = b.connect().session().consumer(T("lag.>"), window=0)
        p = b.connect().session().producer(T("lag.a"), delivery_mode=NP)
        for i in range(1000):  # 10 MB
            p.send(Message.binary(b"%09d" % i + b"x" * 10_000))
        assert hung.endpoint.dropped > 0
        drops = [r for r in records(b, tmp_path) if r["event"] == "drop"]
    assert len(drops) == hung.endpoint.dropped
    assert {(r["dest"], r["reason"]) for r in drops} == {("topic:lag.a", "slow_consumer")}


async def test_the_log_text_of_a_message_destination_is_its_topic_string(tmp_path):
    """Two producers, each with a Destination of its own for ``same.a`` (as adapters make
    one per message): the publish keeps the topic's own text on each message's Destination,
    which a wildcard subscription's records take, so no string is made per message."""
    async with running_broker(tmp_path) as b:
        got: list[Any] = []
        b.connect().session().consumer(T("same.>"), listener=got.append)
        for body in ("one", "two"):
            b.connect().session().producer(T("same.a"), delivery_mode=NP).send(
                Message.text(body))
        texts = [d.msg.destination._text for d in got]
        assert texts == ["topic:same.a", "topic:same.a"]
        assert texts[0] is texts[1] is b.topics["same.a"].dest_text
        found = [(r["event"], r["dest"]) for r in records(b, tmp_path)]
    assert found == [("publish", "topic:same.a"), ("deliver", "topic:same.a"),
                     ("ack", "topic:same.a")] * 2
