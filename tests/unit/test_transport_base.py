"""transports/base.py without a network: a stub far side on a real broker."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from corehelp import CommitHook, running_broker, settle

from gateway import registry
from gateway.errors import ConfigError, LimitExceededError
from gateway.message import PROP_IMPORTED, DeliveryMode, Destination, Message
from transports.base import READ_PAUSE, Backoff, Transport
from transports.manager import TransportManager


class Stub(Transport):
    """A far side that records what the transport asks of it."""

    type = "mqtt"

    def __init__(self, manager: Any, tdef: Any) -> None:
        super().__init__(manager, tdef)
        self.subscribed: list[str] = []
        self.sent: list[Any] = []
        self.paused = False

    async def connect(self) -> None:
        raise ConnectionRefusedError("stub: stays down unless told")

    def disconnect(self) -> None:
        pass

    def remote_subscribe(self, pattern: str, kind: Any) -> None:
        self.subscribed.append(pattern)

    def remote_unsubscribe(self, pattern: str, kind: Any) -> None:
        self.subscribed.remove(pattern)

    def export(self, d: Any, binding: Any) -> bool:
        self.sent.append(d)
        return False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


def transports_conf(**extra: str) -> str:
    lines = ["[far]", "type = mqtt", "url = mqtt://127.0.0.1:1"]
    return "\n".join(lines + [f"{k} = {v}" for k, v in extra.items()]) + "\n"


def manager_with_stub(broker: Any, **extra: str) -> tuple[TransportManager, Stub]:
    m = TransportManager(broker, broker.config)
    tdef = broker.config.transports["far"]
    t = Stub(m, tdef)
    m.transports["far"] = t
    return m, t


def up(t: Stub) -> None:
    t._set_state("up", None)
    t._on_up()


def test_backoff_grows_with_jitter_and_is_capped():
    b = Backoff(1.0, 8.0)
    waits = [b.next() for _ in range(8)]
    assert all(1.0 <= w <= 8.0 for w in waits)
    assert waits[0] == 1.0  # the first wait is the minimum (uniform in [1, 1])
    b.reset()
    assert b.next() == 1.0


async def test_topic_import_follows_local_subscriptions_narrowing_the_pattern(tmp_path):
    async with running_broker(tmp_path, gateway="mqtt_transports = enabled\n",
                              topics='in.> import="far"\n>\n',
                              transports=transports_conf()) as b:
        m, t = manager_with_stub(b)
        t.bind_import("in.>", Destination.topic("x").kind)
        b.subscription_listeners.append(m._subscription_changed)
        up(t)
        assert t.subscribed == []
        s = b.connect().session()
        c1 = s.consumer(Destination.topic("in.a.*"), listener=lambda d: None)
        c2 = s.consumer(Destination.topic(">"), listener=lambda d: None)
        s.consumer(Destination.topic("other"), listener=lambda d: None)
        assert t.subscribed == ["in.a.*", "in.>"]
        c1.close()
        assert t.subscribed == ["in.>"]
        c2.close()
        assert t.subscribed == []


async def test_imports_drop_own_origin_and_over_max_hops_and_mark_the_rest(tmp_path):
    async with running_broker(tmp_path, gateway="mqtt_transports = enabled\n",
                              transports=transports_conf(max_hops="3",
                                                         topic_import_dm="PERSISTENT")) as b:
        m, t = manager_with_stub(b)
        got: list[Any] = []
        b.connect().session().consumer(Destination.topic("t"), listener=got.append)
        acks: list[str] = []
        for origin, hops, tag in ((b.id, 0, "own"), ("other", 3, "far"), ("other", 2, "ok"),
                                  (None, 0, "plain")):
            msg = Message.text(tag, destination=Destination.topic("t"),
                               delivery_mode=DeliveryMode.NON_PERSISTENT)
            msg.trace_id = f"trace-{tag}"  # a message from another gateway has its trace id
            t.imported(msg, origin, hops, lambda tag=tag: acks.append(tag))
        await settle(5)
        assert sorted(acks) == ["far", "ok", "own", "plain"]
        assert [d.msg.body for d in got] == ["ok", "plain"]
        first = got[0].msg
        assert first.properties[PROP_IMPORTED] == "far" and first.hops == 3
        assert first.origin == "other" and first.delivery_mode == DeliveryMode.PERSISTENT
        assert t.stats["dropped_loop"] == 2 and t.stats["imported"] == 2


@pytest.mark.parametrize(("policy", "kept"), [
    ("DISCARD_FIRST:4:2", ["m2", "m3", "m4", "m5"]),
    ("DISCARD_LAST:4:2", ["m0", "m1", "m2", "m5"]),
])
async def test_inbound_queue_policy_drops_oldest_or_newest(tmp_path, policy, kept):
    async with running_broker(tmp_path, gateway="mqtt_transports = enabled\n",
                              transports=transports_conf(inbound_queue_policy=policy)) as b:
        m, t = manager_with_stub(b)
        t.unconfirmed = 10**6  # the core is "busy": everything queues
        acks: list[str] = []
        for i in range(6):
            msg = Message.text(f"m{i}", destination=Destination.queue("q"))
            t.imported(msg, None, 0, lambda i=i: acks.append(f"m{i}"))
        assert [msg.body for msg, _, _ in t.inbound] == kept[: len(t.inbound)]
        assert t.stats["discarded"] == 6 - len(t.inbound)
        assert sorted(acks) == sorted(f"m{i}" for i in range(6) if f"m{i}" not in kept[:len(t.inbound)])


async def test_discard_none_stops_reading_instead_of_growing(tmp_path):
    async with running_broker(tmp_path, gateway="mqtt_transports = enabled\n",
                              transports=transports_conf()) as b:
        m, t = manager_with_stub(b)
        t.unconfirmed = 10**6
        for _ in range(READ_PAUSE):
            t.imported(Message.text("x", destination=Destination.queue("q")), None, 0, None)
        assert t.paused and t.stats["discarded"] == 0 and len(t.inbound) == READ_PAUSE


async def test_export_spool_rejects_when_full_with_the_reject_policy(tmp_path):
    async with running_broker(tmp_path, gateway="mqtt_transports = enabled\n",
                              topics='out.> export="far"\n>\n',
                              transports=transports_conf(spool_max_msgs="3",
                                                         spool_policy="reject")) as b:
        m, t = manager_with_stub(b)
        t.bind_export("out.>")
        p = b.connect().session().producer(Destination.topic("out.x"),
                                           delivery_mode=DeliveryMode.NON_PERSISTENT)
        for i in range(3):
            p.send(Message.text(f"m{i}"))
        with pytest.raises(LimitExceededError, match="export spool"):
            p.send(Message.text("m3"))
        assert t.info()["spooled"] == 3 and t.sent == []
        up(t)
        await settle()
        assert [d.msg.body for d in t.sent] == ["m0", "m1", "m2"]
        for d in list(t.sent):
            t.confirmed(d, t.exports["out.>"])
        assert t.info()["spooled"] == 0 and t.stats["exported"] == 3


async def test_export_spool_blocks_the_producer_with_the_block_policy(tmp_path):
    async with running_broker(tmp_path, gateway="mqtt_transports = enabled\n",
                              topics='out.> export="far"\n>\n',
                              transports=transports_conf(spool_max_msgs="2")) as b:
        m, t = manager_with_stub(b)
        t.bind_export("out.>")
        s = b.connect().session()
        futs = [b.publish(Message.text(f"m{i}", destination=Destination.topic("out.x"),
                                       delivery_mode=DeliveryMode.NON_PERSISTENT),
                          s.connection) for i in range(3)]
        blocked = [f for f in futs if f is not None and not f.done()]
        assert blocked, "the send that filled the spool waits"
        up(t)
        await settle()
        for d in list(t.sent):
            t.confirmed(d, t.exports["out.>"])
        await asyncio.wait_for(asyncio.gather(*blocked), 2)


async def test_imported_messages_are_not_exported_again(tmp_path):
    async with running_broker(tmp_path, gateway="mqtt_transports = enabled\n",
                              topics='io.> export="far",import="far"\n>\n',
                              transports=transports_conf()) as b:
        m, t = manager_with_stub(b)
        t.bind_export("io.>")
        up(t)
        t.imported(Message.text("in", destination=Destination.topic("io.a")), None, 0, None)
        b.connect().session().producer(Destination.topic("io.a")).send(Message.text("local"))
        await settle()
        assert [d.msg.body for d in t.sent] == ["local"]


async def test_a_transport_type_not_built_is_a_config_error(tmp_path, monkeypatch):
    # A build whose transports.rv package lacks its entry point (the bus without its bridge).
    monkeypatch.setitem(registry.TRANSPORTS, "rv", "transports.rv:no_such_start")
    async with running_broker(tmp_path, gateway="rv_transports = enabled\n",
                              topics='a export="s"\n>\n',
                              transports="[s]\ntype = rv\n") as b:
        m = TransportManager(b, b.config)
        with pytest.raises(ConfigError, match=r"transports.conf:1: transport 's': .*not available"):
            await m.start()


async def test_a_resent_import_is_dropped_once_taken_but_not_when_it_was_refused(tmp_path):
    async with running_broker(tmp_path, gateway="mqtt_transports = enabled\n",
                              queues="q\n", transports=transports_conf()) as b:
        m, t = manager_with_stub(b)
        acks: list[str] = []

        def send(tag: str, dest: str, trace: str) -> None:
            msg = Message.text(tag, destination=Destination.queue(dest))
            msg.trace_id = trace
            t.imported(msg, "other-gw", 0, lambda: acks.append(tag))

        send("first", "q", "gw-a:1")
        send("resend", "q", "gw-a:1")  # the far side lost our acknowledgement
        send("next", "q", "gw-a:2")
        send("refused", "nowhere", "gw-a:3")  # no such queue: refused, not remembered
        await settle()
        assert [m.body for m in b.queues["q"].iter_pending()] == ["first", "next"]
        assert t.stats["duplicates"] == 1 and sorted(acks) == ["first", "next", "refused",
                                                               "resend"]
        assert ("gw-a:3", "nowhere") not in m.recent_imports


async def test_a_resend_arriving_during_the_first_copys_commit_waits_for_its_outcome(tmp_path):
    """The resend of an import whose first copy is not yet stored is acknowledged only once
    that copy is in; if its commit fails, the resend is imported in its place."""
    async with running_broker(tmp_path, gateway="mqtt_transports = enabled\n",
                              queues="q\n", transports=transports_conf(
                                  queue_import_dm="PERSISTENT")) as b:
        m, t = manager_with_stub(b)
        held: list[Any] = []
        commit = b.store.commit

        def slow_commit(callback: Any = None, on_error: Any = None) -> None:
            if on_error is not None:
                held.append((callback, on_error))
            commit(None, None)

        b.store = CommitHook(b.store, slow_commit)
        acks: list[str] = []

        def send(tag: str, trace: str) -> None:
            msg = Message.text(tag, destination=Destination.queue("q"))
            msg.trace_id = trace
            t.imported(msg, "other-gw", 0, lambda: acks.append(tag))

        send("first", "gw-a:1")
        send("resend", "gw-a:1")
        await settle()
        assert acks == [] and t.stats["duplicates"] == 1
        held.pop(0)[0]()  # the first copy's commit succeeds
        await settle()
        assert acks == ["first", "resend"]

        send("lost", "gw-a:2")
        send("again", "gw-a:2")
        await settle()
        held.pop(0)[1](OSError("disk full"))  # the first copy's commit fails
        await settle()
        assert acks == ["first", "resend"] and t.stats["duplicates"] == 1
        held.pop(0)[0]()  # the resend, imported in its place, is stored
        await settle()
        assert acks == ["first", "resend", "again"]
        assert [x.body for x in b.queues["q"].iter_pending()].count("again") == 1


async def test_imports_stored_before_a_restart_make_their_resends_duplicates(tmp_path):
    """A crash between storing an import and acknowledging it to the far side: after the
    restart the far side sends it again, and the stored copy is the only one delivered."""
    files = dict(gateway="mqtt_transports = enabled\n", queues="q\n",
                 transports=transports_conf(queue_import_dm="PERSISTENT"))
    async with running_broker(tmp_path, **files) as b:
        m, t = manager_with_stub(b)
        msg = Message.text("stored", destination=Destination.queue("q"))
        msg.trace_id = "gw-a:1"
        t.imported(msg, "other-gw", 0, None)  # its acknowledgement never reaches the far side
        await settle()
    async with running_broker(tmp_path) as b:  # the restart: what the store kept
        assert [x.body for x in b.queues["q"].iter_pending()] == ["stored"]
        m, t = manager_with_stub(b)
        m.seed_duplicates()
        acks: list[str] = []
        for tag, trace in (("stored", "gw-a:1"), ("new", "gw-a:2")):
            msg = Message.text(tag, destination=Destination.queue("q"))
            msg.trace_id = trace
            t.imported(msg, "other-gw", 0, lambda tag=tag: acks.append(tag))
        for _ in range(500):  # "new" is acknowledged after its group commit
            if len(acks) == 2:
                break
            await asyncio.sleep(0.01)
        assert [x.body for x in b.queues["q"].iter_pending()] == ["stored", "new"]
        assert t.stats["duplicates"] == 1 and sorted(acks) == ["new", "stored"]


async def test_seeding_skips_what_no_transport_imported(tmp_path):
    async with running_broker(tmp_path, gateway="mqtt_transports = enabled\n", queues="q\n",
                              transports=transports_conf()) as b:
        p = b.connect().session().producer(Destination.queue("q"))
        msg = Message.text("local")
        msg.trace_id = "gw-a:9"
        await p.send_async(msg)
    async with running_broker(tmp_path) as b:
        m, _ = manager_with_stub(b)
        m.seed_duplicates()
        assert not m.recent_imports


async def test_the_amqp_transport_seeds_its_message_id_check(tmp_path):
    """A message no gateway sent is recognised by (message-id, destination) over AMQP; the
    stored copy's far message-id is remembered at start (its trace id is this gateway's)."""
    import transports.amqp as amqp_transport

    conf = "[far]\ntype = amqp\nurl = amqp://127.0.0.1:1\nqueue_import_dm = PERSISTENT\n"
    files = dict(gateway="amqp_transports = enabled\n", queues="q\n", transports=conf)
    async with running_broker(tmp_path, **files) as b:
        m = TransportManager(b, b.config)
        t = amqp_transport.start(m, b.config.transports["far"])
        msg = Message.text("foreign", destination=Destination.queue("q"))
        msg.message_id = "ID:far-1"
        t.imported(msg, None, 0, None)
        await settle()
    async with running_broker(tmp_path) as b:
        m = TransportManager(b, b.config)
        t = amqp_transport.start(m, b.config.transports["far"])
        m.transports["far"] = t
        m.seed_duplicates()
        assert ("ID:far-1", "q") in t.recent_ids
