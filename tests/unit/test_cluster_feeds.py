"""A cluster node's feed of a queue (cluster.feeds): what it does with what JetStream gives,
driven with stand-ins for JetStream's messages and for the core."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from cluster.feeds import Feed
from gateway.message import DeliveryMode, Destination, Message
from gateway.serial import encode_message


class Core:
    """The core's side of a feed: what it was given, and what it says of it."""

    def __init__(self) -> None:
        self.taken: list[tuple[Message, int]] = []

    def feed_take(self, key: str, msg: Message, count: int) -> str:
        self.taken.append((msg, count))
        return "taken"

    def feed_demand(self, key: str, cap: int) -> int:
        return 0


def feed() -> tuple[Feed, Core, list[tuple[Any, ...]]]:
    core = Core()
    sent: list[tuple[Any, ...]] = []
    feeds = SimpleNamespace(broker=core, stats={"pulled": 0, "acked": 0}, acked_ids={},
                            send=sent.append, pulls="pulls")
    return Feed(feeds, "queue:q", "GW_t_Q_x", ["gw.t.q.q"], False), core, sent  # type: ignore[arg-type]


def delivery(msg: Message, delivered: int, seq: int) -> Any:
    """JetStream's delivery of ``msg``, the ``delivered``-th."""
    meta = SimpleNamespace(num_delivered=delivered, sequence=SimpleNamespace(stream=seq))
    return SimpleNamespace(data=encode_message(msg), metadata=meta, headers=None)


def test_what_jetstream_gives_again_while_the_node_holds_it_is_not_delivered_twice():
    f, core, sent = feed()
    msg = Message.text("order 1", destination=Destination.queue("q"), message_id="ID:1")
    first = delivery(msg, 1, 7)
    f._take(first)
    assert len(core.taken) == 1
    held = core.taken[0][0]
    # its ack wait passed while NATS was away: JetStream gives it again, to this node
    again = delivery(msg, 2, 7)
    f._take(again)
    assert len(core.taken) == 1  # not delivered twice
    f.removed(held)  # the consumer acknowledges it: through the newer delivery
    assert sent == [("ack", again)]
    # and once acknowledged, a late copy is acknowledged again, not delivered
    f.feeds.acked_ids["ID:1"] = None
    f._take(delivery(msg, 3, 7))
    assert len(core.taken) == 1


def test_a_message_given_again_after_it_went_back_is_delivered_again():
    f, core, sent = feed()
    msg = Message.text("order 2", destination=Destination.queue("q"), message_id="ID:2")
    f._take(delivery(msg, 1, 8))
    f.held.clear()  # given back (a NAK): the node holds it no more
    f._take(delivery(msg, 2, 8))
    assert [count for _, count in core.taken] == [0, 1]  # again, flagged redelivered


def test_the_durables_index_answers_by_pattern_and_forgets_what_ends():
    from cluster.durables import DurableIndex

    index = DurableIndex(None, "t", 1)  # type: ignore[arg-type]
    index.add("s-1", "plant.line1.>", True)  # MQTT's plant/line1/#: the parent too
    assert index.wants("plant.line1.temp") and index.wants("plant.line1")
    assert not index.wants("plant.line2.temp")
    index.changed("s-2", b'{"pattern": "plant.*.alarm", "parent": false}')  # another node's
    assert index.wants("plant.line2.alarm")
    index.changed("".join(["s-", "2"]), None)  # ended (the name, another string object)
    assert not index.wants("plant.line2.alarm")
    index.changed("s-1", b'{"pattern": "plant.line9", "parent": false}')  # made again
    assert not index.wants("plant.line1.temp") and index.wants("plant.line9")
    index.changed("s-3", b"not json")  # unreadable: left out
    assert set(index.patterns) == {"s-1"}


def test_a_queue_s_messages_are_confirmed_until_jetstream_has_its_stream():
    """Sent before JetStream said the queue's stream is there (another node making it, or
    JetStream slow to answer), a message is confirmed, and so sent again until it is kept;
    after, a non-persistent one to a queue without limits goes unconfirmed."""
    from cluster.feeds import QueueFeed

    published: list[bool] = []
    sent: list[tuple[Any, ...]] = []
    feeds = SimpleNamespace(
        queue_prefix="gw.t.q.", queue_stream=lambda name: "GW_t_Q_" + name, pulls="pulls",
        stats={"queued": 0}, send=sent.append,
        publish=lambda subject, msg, confirm: published.append(confirm))
    f = QueueFeed(feeds, "orders")  # type: ignore[arg-type]
    msg = Message.text("order 0", destination=Destination.queue("orders"),
                       delivery_mode=DeliveryMode.NON_PERSISTENT)
    f.enqueue(msg)
    f.enqueue(msg)
    assert sent == [("stream", f)]  # asked once
    assert published == [True, True]
    f.stream_made = True  # JetStream answered
    f.enqueue(msg)
    assert published == [True, True, False]
