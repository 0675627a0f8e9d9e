"""The core broker through the in-process client API: routing, consumers, delivery rules."""

from __future__ import annotations

import asyncio

import pytest
from corehelp import Q, T, collect, running_broker, settle

from gateway.client import AckMode
from gateway.errors import (
    IllegalStateError,
    InvalidDestinationError,
    InvalidSelectorError,
    LimitExceededError,
    SecurityError,
)
from gateway.message import PROP_PRESERVE_UNDELIVERED, PROP_SENDER, DeliveryMode, Message

NP = DeliveryMode.NON_PERSISTENT


def texts(deliveries: list) -> list:
    return [d.msg.body for d in deliveries]


async def test_topic_fanout_to_every_subscriber(tmp_path):
    async with running_broker(tmp_path) as b:
        c = b.connect()
        s = c.session()
        got1, l1 = collect()
        got2, l2 = collect()
        s.consumer(T("news.sport"), listener=l1)
        s.consumer(T("news.sport"), listener=l2)
        p = s.producer(T("news.sport"), delivery_mode=NP)
        p.send(Message.text("a"))
        p.send(Message.text("b"))
        assert texts(got1) == ["a", "b"]
        assert texts(got2) == ["a", "b"]
        assert got1[0].msg.message_id.startswith("ID:")
        assert got1[0].msg.trace_id
        assert got1[0].count == 1 and not got1[0].redelivered


async def test_wildcards_W1_W2_W3(tmp_path):
    async with running_broker(tmp_path) as b:
        s = b.connect().session()
        star, l1 = collect()
        gt, l2 = collect()
        mid, l3 = collect()
        s.consumer(T("foo.*"), listener=l1)
        s.consumer(T("foo.>"), listener=l2)
        s.consumer(T("foo.*.bar"), listener=l3)
        p = s.producer(delivery_mode=NP)
        for name in ("foo.bar", "foo.boo", "foo.bar.boo", "foo.boo.bar", "foo"):
            p.send(Message.text(name), T(name))
        assert texts(star) == ["foo.bar", "foo.boo"]
        assert texts(gt) == ["foo.bar", "foo.boo", "foo.bar.boo", "foo.boo.bar"]
        assert texts(mid) == ["foo.boo.bar"]


async def test_publish_to_wildcard_is_rejected_W5(tmp_path):
    async with running_broker(tmp_path) as b:
        s = b.connect().session()
        with pytest.raises(InvalidDestinationError):
            s.producer(T("foo.*")).send(Message.text("x"))


async def test_dynamic_creation_gated_by_config_W6_W7_W9(tmp_path):
    async with running_broker(tmp_path, topics="foo.*\n", queues="foo.*\n") as b:
        s = b.connect().session()
        got, listener = collect()
        s.consumer(T("bar.*"), listener=listener)  # W9: subscribing is allowed
        s.producer(T("foo.bar"), delivery_mode=NP).send(Message.text("ok"))  # W6
        with pytest.raises(InvalidDestinationError):
            s.producer(T("bar.x"), delivery_mode=NP).send(Message.text("no"))
        s.producer(Q("foo.bar"), delivery_mode=NP).send(Message.text("ok"))
        with pytest.raises(InvalidDestinationError):  # W7
            s.producer(Q("foo.bar.bob"), delivery_mode=NP).send(Message.text("no"))
        assert got == []


async def test_queue_receivers_compete_round_robin(tmp_path):
    async with running_broker(tmp_path) as b:
        s = b.connect().session()
        got1, l1 = collect()
        got2, l2 = collect()
        s.consumer(Q("work"), listener=l1)
        s.consumer(Q("work"), listener=l2)
        p = s.producer(Q("work"), delivery_mode=NP)
        for i in range(6):
            p.send(Message.text(str(i)))
        assert texts(got1) == ["0", "2", "4"]
        assert texts(got2) == ["1", "3", "5"]


async def test_exclusive_queue_delivers_to_first_consumer_then_standby_takes_over(tmp_path):
    async with running_broker(tmp_path, queues="ex exclusive\n>\n") as b:
        s = b.connect().session()
        got1, l1 = collect()
        got2, l2 = collect()
        c1 = s.consumer(Q("ex"), listener=l1)
        s.consumer(Q("ex"), listener=l2)
        p = s.producer(Q("ex"), delivery_mode=NP)
        for i in range(3):
            p.send(Message.text(str(i)))
        c1.close()
        p.send(Message.text("3"))
        assert texts(got1) == ["0", "1", "2"]
        assert texts(got2) == ["3"]


async def test_queue_keeps_messages_until_a_receiver_comes(tmp_path):
    async with running_broker(tmp_path) as b:
        s = b.connect().session()
        p = s.producer(Q("later"), delivery_mode=NP)
        for i in range(3):
            p.send(Message.text(str(i)))
        c = s.consumer(Q("later"))
        got = [await c.receive(1) for _ in range(3)]
        assert texts(got) == ["0", "1", "2"]
        assert await c.receive(0.05) is None


async def test_queue_browser_sees_pending_without_consuming(tmp_path):
    async with running_broker(tmp_path) as b:
        s = b.connect().session()
        p = s.producer(Q("q"), delivery_mode=NP)
        for i, colour in enumerate(["red", "blue", "red"]):
            p.send(Message.text(str(i), properties={"colour": colour}))
        assert [m.body for m in s.browser(Q("q"))] == ["0", "1", "2"]
        assert [m.body for m in s.browser(Q("q"), "colour = 'red'")] == ["0", "2"]
        assert b.queues["q"].npending == 3


async def test_topic_selector_and_queue_selector_leave_others_on_queue(tmp_path):
    async with running_broker(tmp_path) as b:
        s = b.connect().session()
        got, listener = collect()
        s.consumer(T("t"), selector="weight > 10", listener=listener)
        p = s.producer(delivery_mode=NP)
        for w in (5, 20, 11):
            p.send(Message.text(str(w), properties={"weight": w}), T("t"))
        assert texts(got) == ["20", "11"]
        qgot, ql = collect()
        s.consumer(Q("sq"), selector="kind = 'b'", listener=ql)
        for k in "abab":
            p.send(Message.text(k, properties={"kind": k}), Q("sq"))
        assert texts(qgot) == ["b", "b"]
        assert [m.body for m in s.browser(Q("sq"))] == ["a", "a"]


async def test_bad_selector_is_rejected_at_subscribe_time(tmp_path):
    async with running_broker(tmp_path) as b:
        s = b.connect().session()
        with pytest.raises(InvalidSelectorError):
            s.consumer(T("t"), selector="weight >> 10")
        assert len(b.subs) == 0


async def test_no_local(tmp_path):
    async with running_broker(tmp_path) as b:
        c1, c2 = b.connect(), b.connect()
        s1, s2 = c1.session(), c2.session()
        got, listener = collect()
        s1.consumer(T("nl"), no_local=True, listener=listener)
        s1.producer(T("nl"), delivery_mode=NP).send(Message.text("mine"))
        s2.producer(T("nl"), delivery_mode=NP).send(Message.text("theirs"))
        assert texts(got) == ["theirs"]


async def test_durable_subscription_keeps_messages_while_offline(tmp_path):
    async with running_broker(tmp_path) as b:
        c = b.connect(client_id="app")
        s = c.session()
        sub = s.consumer(T("orders.new"), durable_name="d1")
        sub.close()
        p = b.connect().session().producer(T("orders.new"))
        for i in range(3):
            await p.send_async(Message.text(str(i)))
        assert b.durables["sub:app:d1"].npending == 3
        again = s.consumer(T("orders.new"), durable_name="d1")
        got = [await again.receive(1) for _ in range(3)]
        assert texts(got) == ["0", "1", "2"]
        with pytest.raises(IllegalStateError):  # unshared durable already has a consumer
            s.consumer(T("orders.new"), durable_name="d1")
        with pytest.raises(IllegalStateError):  # cannot unsubscribe while in use
            s.unsubscribe("d1")
        again.close()
        s.unsubscribe("d1")
        assert "sub:app:d1" not in b.durables


async def test_durable_needs_client_id_and_no_ack_session_cannot_create_one_A1(tmp_path):
    async with running_broker(tmp_path) as b:
        with pytest.raises(IllegalStateError):
            b.connect().session().consumer(T("x"), durable_name="d")
        with pytest.raises(IllegalStateError):
            b.connect(client_id="c").session(AckMode.NONE).consumer(T("x"), durable_name="d")


async def test_shared_subscription_gives_each_message_to_one_consumer(tmp_path):
    async with running_broker(tmp_path) as b:
        s = b.connect().session()
        got1, l1 = collect()
        got2, l2 = collect()
        other, l3 = collect()
        s.consumer(T("sh"), shared_name="grp", listener=l1)
        b.connect().session().consumer(T("sh"), shared_name="grp", listener=l2)
        s.consumer(T("sh"), listener=l3)
        p = s.producer(T("sh"), delivery_mode=NP)
        for i in range(4):
            p.send(Message.text(str(i)))
        assert sorted(texts(got1) + texts(got2)) == ["0", "1", "2", "3"]
        assert len(got1) == 2 and len(got2) == 2
        assert texts(other) == ["0", "1", "2", "3"]


async def test_shared_durable_subscription_accumulates_without_consumers(tmp_path):
    async with running_broker(tmp_path) as b:
        s = b.connect().session()
        c = s.consumer(T("sd"), durable_name="shd", shared_name="shd")
        c.close()
        s.producer(T("sd")).send(Message.text("kept"))
        again = b.connect().session().consumer(T("sd"), durable_name="shd", shared_name="shd")
        assert texts([await again.receive(1)]) == ["kept"]


async def test_priority_order_with_a_backlog(tmp_path):
    async with running_broker(tmp_path) as b:
        s = b.connect().session()
        p = s.producer(Q("prio"), delivery_mode=NP)
        for prio in (1, 9, 4, 9, 0):
            p.send(Message.text(str(prio)), priority=prio)
        c = s.consumer(Q("prio"))
        got = [await c.receive(1) for _ in range(5)]
        assert texts(got) == ["9", "9", "4", "1", "0"]


async def test_expired_messages_are_not_delivered_and_preserved_ones_go_to_undelivered_E2(
    tmp_path,
):
    async with running_broker(tmp_path) as b:
        s = b.connect().session()
        p = s.producer(Q("exp"), delivery_mode=NP)
        p.send(Message.text("gone"), ttl=20)
        p.send(Message.text("kept", properties={PROP_PRESERVE_UNDELIVERED: True}), ttl=20)
        p.send(Message.text("live"))
        await asyncio.sleep(0.05)
        c = s.consumer(Q("exp"))
        assert texts([await c.receive(1)]) == ["live"]
        assert await c.receive(0.05) is None
        undelivered = b.queues["$sys.undelivered"]
        assert [m.body for m in undelivered.iter_pending()] == ["kept"]


async def test_preserve_undelivered_is_read_as_a_jms_boolean(tmp_path):
    async with running_broker(tmp_path) as b:
        s = b.connect().session()
        p = s.producer(Q("exp2"), delivery_mode=NP)
        for value in (True, "TRUE", "true", "false", "yes", 1, False):
            p.send(Message.text(repr(value), properties={PROP_PRESERVE_UNDELIVERED: value}),
                   ttl=20)
        await asyncio.sleep(0.05)
        assert await s.consumer(Q("exp2")).receive(0.05) is None
        undelivered = b.queues["$sys.undelivered"]
        assert [m.body for m in undelivered.iter_pending()] == ["True", "'TRUE'", "'true'"]


async def test_an_expired_message_is_not_handed_to_a_waiting_consumer(tmp_path):
    async with running_broker(tmp_path) as b:
        s = b.connect().session()
        c = s.consumer(Q("exp3"))
        b.publish(Message.text("late", destination=Q("exp3"), expiration=b.now() - 1,
                               properties={PROP_PRESERVE_UNDELIVERED: True},
                               delivery_mode=NP))
        assert await c.receive(0.05) is None
        assert [m.body for m in b.queues["$sys.undelivered"].iter_pending()] == ["late"]


async def test_destination_expiration_overrides_producer_and_consumer_sees_zero_E1(tmp_path):
    async with running_broker(tmp_path, queues="short expiration=50msec\n>\n") as b:
        s = b.connect().session()
        p = s.producer(Q("short"), delivery_mode=NP)
        p.send(Message.text("a"), ttl=60_000)
        c = s.consumer(Q("short"))
        d = await c.receive(1)
        assert d.msg.expiration == 0
        p.send(Message.text("b"), ttl=60_000)
        c.close()
        await asyncio.sleep(0.1)
        c2 = s.consumer(Q("short"))
        assert await c2.receive(0.05) is None


async def test_delivery_delay(tmp_path):
    async with running_broker(tmp_path) as b:
        s = b.connect().session()
        c = s.consumer(Q("delayed"))
        p = s.producer(Q("delayed"), delivery_mode=NP)
        p.send(Message.text("later"), delivery_delay=150)
        p.send(Message.text("now"))
        first = await c.receive(1)
        assert first.msg.body == "now"
        assert await c.receive(0.05) is None
        second = await c.receive(1)
        assert second.msg.body == "later"


async def test_client_ack_recover_redelivers_with_count_R3(tmp_path):
    async with running_broker(tmp_path) as b:
        s = b.connect().session(AckMode.CLIENT)
        p = s.producer(Q("r"), delivery_mode=NP)
        p.send(Message.text("a"))
        p.send(Message.text("b"))
        c = s.consumer(Q("r"))
        d1 = await c.receive(1)
        d2 = await c.receive(1)
        assert (d1.count, d2.count) == (1, 1)
        s.recover()
        r1 = await c.receive(1)
        r2 = await c.receive(1)
        assert texts([r1, r2]) == ["a", "b"]
        assert r1.redelivered and r1.count == 2
        s.acknowledge()
        assert b.queues["r"].count == 0


async def test_explicit_ack_acknowledges_only_that_message_A2(tmp_path):
    async with running_broker(tmp_path) as b:
        s = b.connect().session(AckMode.EXPLICIT)
        p = s.producer(Q("x"), delivery_mode=NP)
        for i in range(3):
            p.send(Message.text(str(i)))
        c = s.consumer(Q("x"))
        ds = [await c.receive(1) for _ in range(3)]
        s.acknowledge(ds[1])
        s.recover()
        again = [await c.receive(1) for _ in range(2)]
        assert texts(again) == ["0", "2"]


async def test_no_acknowledge_forgets_messages_once_sent(tmp_path):
    async with running_broker(tmp_path) as b:
        s = b.connect().session(AckMode.NONE)
        got, listener = collect()
        s.consumer(Q("n"), listener=listener)
        s.producer(Q("n"), delivery_mode=NP).send(Message.text("x"))
        assert texts(got) == ["x"]
        assert b.queues["n"].count == 0 and not s.unacked


async def test_max_redelivery_moves_preserved_message_to_undelivered_R1_R2(tmp_path):
    async with running_broker(tmp_path, queues="mr maxRedelivery=3\n>\n") as b:
        s = b.connect().session(transacted=True)
        p = b.connect().session().producer(Q("mr"), delivery_mode=NP)
        p.send(Message.text("keep", properties={PROP_PRESERVE_UNDELIVERED: True}))
        p.send(Message.text("drop"))
        c = s.consumer(Q("mr"), window=1)
        seen = []
        for _ in range(6):
            d = await c.receive(0.2)
            if d is None:
                break
            seen.append((d.msg.body, d.count))
            s.rollback()
        assert seen == [("keep", 1), ("keep", 2), ("keep", 3), ("drop", 1), ("drop", 2),
                        ("drop", 3)]
        assert [m.body for m in b.queues["$sys.undelivered"].iter_pending()] == ["keep"]
        assert b.queues["mr"].count == 0


async def test_redelivery_delay_R4(tmp_path):
    async with running_broker(tmp_path, queues="rd redeliveryDelay=15sec\n>\n") as b:
        q = b.queue("rd")
        assert q.redelivery_delay() == 15_000
        s = b.connect().session(AckMode.CLIENT)
        s.producer(Q("rd"), delivery_mode=NP).send(Message.text("x"))
        c = s.consumer(Q("rd"))
        await c.receive(1)
        s.recover()
        assert len(q.held) == 1 and q.npending == 0
        assert q.held[0][0] >= b.now() + 14_000
        assert await c.receive(0.05) is None


async def test_transaction_commit_and_rollback(tmp_path):
    async with running_broker(tmp_path) as b:
        tx = b.connect().session(transacted=True)
        plain = b.connect().session()
        c = plain.consumer(Q("tx"))
        p = tx.producer(Q("tx"), delivery_mode=NP)
        p.send(Message.text("a"))
        assert await c.receive(0.05) is None
        tx.rollback()
        p.send(Message.text("b"))
        fut = tx.commit()
        if fut is not None:
            await fut
        assert texts([await c.receive(1)]) == ["b"]
        assert await c.receive(0.05) is None


async def test_transacted_consumption_commits_acks_and_rollback_redelivers(tmp_path):
    async with running_broker(tmp_path) as b:
        b.connect().session().producer(Q("tq"), delivery_mode=NP).send(Message.text("m"))
        s = b.connect().session(transacted=True)
        c = s.consumer(Q("tq"))
        d = await c.receive(1)
        s.rollback()
        d2 = await c.receive(1)
        assert d2.msg is d.msg and d2.redelivered
        s.commit()
        assert b.queues["tq"].count == 0


async def test_queue_overflow_default_rejects_O1(tmp_path):
    async with running_broker(tmp_path, queues="small maxmsgs=2\n>\n") as b:
        p = b.connect().session().producer(Q("small"), delivery_mode=NP)
        p.send(Message.text("1"))
        p.send(Message.text("2"))
        with pytest.raises(LimitExceededError):
            p.send(Message.text("3"))


async def test_queue_overflow_discard_old_O2(tmp_path):
    async with running_broker(tmp_path, queues="small maxmsgs=2,overflowPolicy=discardOld\n>\n") as b:
        s = b.connect().session()
        p = s.producer(Q("small"), delivery_mode=NP)
        for i in range(4):
            p.send(Message.text(str(i)))
        assert [m.body for m in s.browser(Q("small"))] == ["2", "3"]


async def test_topic_overflow_default_slow_subscriber_misses_O3(tmp_path):
    async with running_broker(tmp_path, topics="t maxmsgs=1\n>\n") as b:
        s = b.connect().session()
        slow = s.consumer(T("t"), window=0)  # prefetch none: never fetches unless receiving
        fast, listener = collect()
        s.consumer(T("t"), listener=listener)
        p = s.producer(T("t"), delivery_mode=NP)
        p.send(Message.text("1"))
        p.send(Message.text("2"))
        assert texts(fast) == ["1", "2"]
        assert texts([await slow.receive(1)]) == ["1"]


async def test_topic_overflow_reject_incoming_O4_and_discard_old_O5(tmp_path):
    async with running_broker(
        tmp_path, topics="r maxmsgs=1,overflowPolicy=rejectIncoming\nd maxmsgs=1,overflowPolicy=discardOld\n>\n"
    ) as b:
        s = b.connect().session()
        s.consumer(T("r"), window=0)
        slow_d = s.consumer(T("d"), window=0)
        p = s.producer(delivery_mode=NP)
        p.send(Message.text("1"), T("r"))
        with pytest.raises(LimitExceededError):
            p.send(Message.text("2"), T("r"))
        p.send(Message.text("1"), T("d"))
        p.send(Message.text("2"), T("d"))
        assert texts([await slow_d.receive(1)]) == ["2"]


async def test_flow_control_blocks_producer_until_drained_F1_F2(tmp_path):
    async with running_broker(
        tmp_path, gateway="flow_control = enabled\n", queues="fc flowControl=1KB\n>\n"
    ) as b:
        s = b.connect().session()
        p = s.producer(Q("fc"), delivery_mode=NP)
        big = "x" * 600
        assert p.send(Message.text(big)) is None  # F2: no receivers, not enforced
        c = s.consumer(Q("fc"), window=0)
        fut = p.send(Message.text(big))
        assert fut is not None and not fut.done()
        await c.receive(1)
        await c.receive(1)
        await settle()
        assert fut.done()


async def test_temporary_queue_belongs_to_its_connection(tmp_path):
    async with running_broker(tmp_path) as b:
        owner = b.connect()
        tq = owner.temporary_queue()
        other = b.connect().session()
        other.producer(tq, delivery_mode=NP).send(Message.text("reply"))
        with pytest.raises(InvalidDestinationError):
            other.consumer(tq)
        c = owner.session().consumer(tq)
        assert texts([await c.receive(1)]) == ["reply"]
        owner.close()
        assert tq.name not in b.queues
        with pytest.raises(InvalidDestinationError):
            other.producer(tq, delivery_mode=NP).send(Message.text("late"))


async def test_sender_name_property(tmp_path):
    async with running_broker(tmp_path, topics="named sender_name\n>\n") as b:
        s = b.connect().session()
        got, listener = collect()
        s.consumer(T("named"), listener=listener)
        s.producer(T("named"), delivery_mode=NP).send(Message.text("x"))
        assert got[0].msg.properties[PROP_SENDER] == "anonymous"


async def test_reliable_send_to_forbidden_destination_is_dropped_silently_D3(tmp_path):
    async with running_broker(tmp_path, queues="only.this\n") as b:
        p = b.connect().session().producer(Q("not.allowed"), delivery_mode=DeliveryMode.RELIABLE)
        assert p.send(Message.text("x")) is None
        assert b.stats["rejected"] == 1


async def test_authorization_and_acl_on_secure_destinations(tmp_path):
    async with running_broker(
        tmp_path,
        gateway="authorization = enabled\nallow_anonymous = disabled\n",
        users='alice:secret:"Alice"\nbob:pw:"Bob"\n',
        topics="secret.* secure\n>\n",
        acl="TOPIC=secret.* USER=alice PERM=publish,subscribe\n",
    ) as b:
        with pytest.raises(SecurityError):
            b.connect()
        with pytest.raises(SecurityError):
            b.connect(user="alice", password="wrong")
        alice = b.connect(user="alice", password="secret").session()
        bob = b.connect(user="bob", password="pw").session()
        got, listener = collect()
        alice.consumer(T("secret.x"), listener=listener)
        with pytest.raises(SecurityError):
            bob.consumer(T("secret.x"))
        with pytest.raises(SecurityError):
            bob.producer(T("secret.x"), delivery_mode=NP).send(Message.text("no"))
        bob.producer(T("open.x"), delivery_mode=NP).send(Message.text("fine"))  # SEC1
        alice.producer(T("secret.x"), delivery_mode=NP).send(Message.text("yes"))
        assert texts(got) == ["yes"]


@pytest.mark.parametrize(("security", "results"), [
    # (alice right, alice wrong, unknown, no name, empty name)
    ("", ("alice", "alice", "mallory", None, None)),
    ("allow_anonymous = disabled\n", ("alice", "alice", "mallory", None, None)),
    ("authorization = enabled\n", ("alice", SecurityError, SecurityError, None, None)),
    ("authorization = enabled\nallow_anonymous = disabled\n",
     ("alice", SecurityError, SecurityError, SecurityError, SecurityError)),
], ids=["default", "no-anonymous-alone", "authorization", "authorization-no-anonymous"])
async def test_credential_rules(tmp_path, security, results):
    """Broker.authenticate, the rules every adapter uses: with authorization disabled anyone
    connects and keeps the name given (TIBCO EMS User's Guide, "Enabling Access Control"),
    allow_anonymous notwithstanding; with it enabled users.conf decides, and a missing or empty
    name is anonymous."""
    async with running_broker(tmp_path, gateway=security, users='alice:secret:"Alice"\n') as b:
        cases = [("alice", "secret"), ("alice", "wrong"), ("mallory", "x"), (None, None),
                 ("", "x")]
        for (user, password), want in zip(cases, results, strict=True):
            if want is SecurityError:
                with pytest.raises(SecurityError):
                    b.connect(user=user, password=password)
            else:
                assert b.connect(user=user, password=password).user == want, (user, password)
        assert b.anonymous_allowed() is (results[3] is None)


async def test_duplicate_client_id_is_refused(tmp_path):
    async with running_broker(tmp_path) as b:
        b.connect(client_id="same")
        with pytest.raises(IllegalStateError):
            b.connect(client_id="same")


async def test_map_and_stream_bodies_pass_through_unchanged(tmp_path):
    from gateway.types import Float32, Int16Array, UInt16

    async with running_broker(tmp_path) as b:
        s = b.connect().session()
        got, listener = collect()
        s.consumer(T("m"), listener=listener)
        body = {"a": UInt16(7), "nested": {"list": [1, "two", Int16Array([1, 2])], "f": Float32(1.5)}}
        s.producer(T("m"), delivery_mode=NP).send(Message.map(body))
        out = got[0].msg.body
        assert out == body
        assert type(out["a"]) is UInt16
        assert type(out["nested"]["list"][2]) is Int16Array


async def test_flow_control_on_a_topic_holds_the_producer_while_a_subscriber_lags(tmp_path):
    async with running_broker(
        tmp_path, gateway="flow_control = enabled\n", topics="ft flowControl=1KB\n>\n"
    ) as b:
        s = b.connect().session()
        p = s.producer(T("ft"), delivery_mode=NP)
        assert p.send(Message.text("x" * 600)) is None  # no subscribers: not enforced
        slow = s.consumer(T("ft"), window=0)
        assert p.send(Message.text("x" * 600)) is None
        fut = p.send(Message.text("x" * 600))
        assert fut is not None and not fut.done()
        await slow.receive(1)
        await slow.receive(1)
        await settle()
        assert fut.done()


async def test_delivery_log_records_every_step_of_a_message(tmp_path):
    import json

    async with running_broker(tmp_path, queues="dl maxRedelivery=2\n>\n") as b:
        s = b.connect().session(AckMode.CLIENT)
        p = s.producer(Q("dl"), delivery_mode=NP)
        p.send(Message.text("one"))
        c = s.consumer(Q("dl"))
        d = await c.receive(1)
        s.recover()
        await c.receive(1)
        s.recover()  # second attempt fails too: past maxRedelivery, dropped
        c.close()
        p.send(Message.text("two"), ttl=1)
        await asyncio.sleep(0.02)
        assert await s.consumer(Q("dl")).receive(0.1) is None
        s.producer(T("nobody"), delivery_mode=NP).send(Message.text("lost?"))
        trace = d.msg.trace_id
        b.dlog.flush()
        records = []
        for f in sorted((tmp_path / "data" / "delivery-log").glob("*.jsonl")):
            records += [json.loads(line) for line in f.read_text().splitlines()]
    mine = [(r["event"], r["count"], r["reason"]) for r in records if r["trace_id"] == trace]
    assert mine == [
        ("publish", 0, None),
        ("deliver", 1, None),
        ("redeliver", 2, None),
        ("drop", 2, "maxredelivery_exceeded"),
    ]
    events = {r["event"] for r in records}
    assert "expire" in events
    assert ("drop", "no_subscribers") in {(r["event"], r["reason"]) for r in records}
    assert all(r["dest"] in ("queue:dl", "topic:nobody") for r in records)


async def test_delivery_log_takes_a_message_as_each_send_has_it(tmp_path):
    """The log keeps a message's head (ids, mode, size) on it; a producer that sends the
    same object again, changed, is logged with the new values, its deliveries too."""
    import json

    async with running_broker(tmp_path) as b:
        s = b.connect().session(AckMode.NONE)
        got, listener = collect()
        s.consumer(T("again"), listener=listener)
        msg = Message.text("one")
        s.producer(T("again"), delivery_mode=NP).send(msg)
        msg.body = "a longer body than before, so a bigger size"
        msg.size = 0
        s.producer(T("again")).send(msg)
        assert len(got) == 2
        b.dlog.flush()
        records = []
        for f in sorted((tmp_path / "data" / "delivery-log").glob("*.jsonl")):
            records += [json.loads(line) for line in f.read_text().splitlines()]
    mine = [(r["event"], r["mode"], r["size"]) for r in records if r["dest"] == "topic:again"]
    small, big = mine[0][2], mine[2][2]
    assert small < big
    assert mine == [
        ("publish", "NON_PERSISTENT", small), ("deliver", "NON_PERSISTENT", small),
        ("publish", "PERSISTENT", big), ("deliver", "PERSISTENT", big),
    ]  # fmt: skip


async def test_max_connections(tmp_path):
    async with running_broker(tmp_path, gateway="max_connections = 2\n") as b:
        b.connect()
        second = b.connect()
        with pytest.raises(LimitExceededError):
            b.connect()
        second.close()
        b.connect()


async def test_server_memory_limit_rejects_instead_of_growing(tmp_path):
    async with running_broker(tmp_path, gateway="max_msg_memory = 8MB\n") as b:
        p = b.connect().session().producer(Q("big"), delivery_mode=NP)
        sent = 0
        with pytest.raises(LimitExceededError):
            for _ in range(200):
                p.send(Message.binary(b"x" * 100_000))
                sent += 1
        assert 70 <= sent <= 84
        b.purge_queue("big")
        p.send(Message.binary(b"x" * 100_000))  # room again once drained


async def test_producer_refuses_a_malformed_message(tmp_path):
    from gateway.errors import MessageFormatError
    from gateway.message import BodyKind

    async with running_broker(tmp_path) as b:
        p = b.connect().session().producer(Q("v"), delivery_mode=NP)
        with pytest.raises(MessageFormatError):
            p.send(Message(b"bytes", body_kind=BodyKind.TEXT))
        with pytest.raises(MessageFormatError):
            p.send(Message.text("x", properties={"bad": {"nested": 1}}))
        assert b.queues["v"].count == 0 if "v" in b.queues else True


async def test_deliveries_given_back_together_return_in_their_order(tmp_path):
    """A link or connection gone, or a cumulative NACK, returns several deliveries at once:
    each goes back to the front of its queue, so they must be put back last to first."""
    async with running_broker(tmp_path) as b:
        s = b.connect().session(AckMode.EXPLICIT)
        p = s.producer(Q("order.q"), delivery_mode=NP)
        for i in range(5):
            p.send(Message.text(str(i)))
        got, listener = collect()
        c = s.consumer(Q("order.q"), listener=listener)
        assert texts(got) == ["0", "1", "2", "3", "4"]
        c.close()
        s.release_all(got[1:4])  # 1, 2, 3 back; 0 and 4 stay unacknowledged
        again, listener2 = collect()
        s.consumer(Q("order.q"), listener=listener2)
        assert texts(again) == ["1", "2", "3"]
        assert all(d.redelivered for d in again)
