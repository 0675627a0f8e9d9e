"""Verdicts on small hand-made logs: delivered (latency, across two gateways), late but not
lost, lost and pending around the watermark, a drop that is no loss, duplicates flagged and
not, the gateway's own decisions with their reasons, changed by nothing or by mapping rules,
reordered, and clock skew within the tolerance."""

from __future__ import annotations

import pytest
from chispa import assert_df_equality
from dlogrecords import frame, rec
from pyspark.sql import DataFrame, SparkSession

from spark.routes import routes
from spark.verdicts import (
    changed,
    decided,
    delivered,
    duplicated,
    lost,
    reordered,
    verdicts,
    watermark,
)

pytestmark = pytest.mark.spark

GRACE = 1000.0


def pick(df: DataFrame, *cols: str) -> list[tuple[object, ...]]:
    """The rows' values of ``cols``, sorted (a null before any value)."""
    return sorted((tuple(r) for r in df.select(*cols).collect()),
                  key=lambda row: tuple((v is not None, v) for v in row))


def test_delivered_with_latency_across_two_gateways(spark: SparkSession):
    # Published at gw-a, delivered there to a local consumer and exported to gw-b; imported
    # at gw-b (other clock) and delivered to a consumer there. Same trace id on both.
    records = frame(spark, [
        rec(1000.0, "gw-a", "publish", "t1", client="mqtt:p"),
        rec(1002.0, "gw-a", "deliver", "t1", client="amqp:c1", count=1),
        rec(1003.5, "gw-a", "export", "t1", client="to-b"),
        rec(1010.0, "gw-b", "import", "t1", client="from-a"),
        rec(1014.0, "gw-b", "deliver", "t1", client="stomp:c2", count=1),
        rec(1020.0, "gw-b", "ack", "t1", client="stomp:c2", count=1),
    ])

    got = delivered(routes(records), GRACE)

    assert pick(got, "verdict", "gw", "entry_event", "entry_client", "exit", "exit_client",
                "latency_ms", "e2e_latency_ms", "late", "copies") == [
        ("delivered", "gw-a", "publish", "mqtt:p", "deliver", "amqp:c1", 2.0, 2.0, False, 1),
        ("delivered", "gw-a", "publish", "mqtt:p", "export", "to-b", 3.5, 3.5, False, 1),
        ("delivered", "gw-b", "import", "from-a", "deliver", "stomp:c2", 4.0, 14.0, False, 1),
    ]
    assert pick(got, "origin_gw", "origin_ts") == [("gw-a", 1000.0)] * 3


def test_each_destination_published_to_is_its_own_entry(spark: SparkSession):
    # One message sent to two destinations: one publish for each; a delivery matches the
    # publish on its own destination, not the earlier one on the other.
    records = frame(spark, [
        rec(1000.0, "gw-a", "publish", "t1", dest="topic:x", client="p"),
        rec(1005.0, "gw-a", "publish", "t1", dest="queue:y", client="p"),
        rec(1006.0, "gw-a", "deliver", "t1", dest="queue:y", client="c", count=1),
        rec(1007.0, "gw-a", "deliver", "t1", dest="topic:x", client="c", count=1),
    ])

    got = delivered(routes(records), GRACE)

    assert pick(got, "dest", "latency_ms", "e2e_latency_ms") == [
        ("queue:y", 1.0, 6.0), ("topic:x", 7.0, 7.0)]


def test_late_is_delivered_not_lost_lost_is_past_the_watermark_pending_is_not(
        spark: SparkSession):
    records = frame(spark, [
        # Delivered 1500 ms after it entered: past the 1000 ms grace, so late, not lost.
        rec(1000.0, "gw-a", "publish", "late", client="p"),
        rec(2500.0, "gw-a", "deliver", "late", client="c", count=1),
        # Never left, at or before the watermark (max ts 5001 - grace 1000 = 4001): lost.
        rec(1100.0, "gw-a", "publish", "lost", client="p"),
        rec(4001.0, "gw-a", "publish", "edge", client="p"),
        # Never left, but entered after the watermark: no verdict yet.
        rec(4500.0, "gw-a", "publish", "young", client="p"),
        # The gateway let it go on purpose and said why: not lost.
        rec(1200.0, "gw-a", "publish", "dropped", client="p"),
        rec(1201.0, "gw-a", "drop", "dropped", reason="no_subscribers"),
        rec(1300.0, "gw-a", "publish", "expired", dest="queue:q", client="p"),
        rec(1800.0, "gw-a", "expire", "expired", dest="queue:q", reason="expired"),
        # Another gateway's records move the watermark (event time of every log read).
        rec(5000.0, "gw-b", "publish", "other", client="p"),
        rec(5001.0, "gw-b", "deliver", "other", client="c", count=1),
    ])
    route_rows = routes(records)

    assert pick(delivered(route_rows, GRACE).where("trace_id = 'late'"),
                "latency_ms", "late") == [(1500.0, True)]
    assert pick(lost(records, route_rows, GRACE), "trace_id", "verdict", "watermark") == [
        ("edge", "lost", 4001.0), ("lost", "lost", 4001.0), ("young", "pending", 4001.0)]
    assert pick(watermark(records, GRACE), "watermark") == [(4001.0,)]


def test_with_a_longer_grace_the_lost_message_is_pending(spark: SparkSession):
    records = frame(spark, [
        rec(1000.0, "gw-a", "publish", "m", client="p"),
        rec(3000.0, "gw-a", "publish", "n", client="p"),
        rec(3001.0, "gw-a", "deliver", "n", client="c", count=1),
    ])
    route_rows = routes(records)

    assert pick(lost(records, route_rows, 1000.0), "verdict") == [("lost",)]
    assert pick(lost(records, route_rows, 2500.0), "verdict") == [("pending",)]
    with pytest.raises(ValueError, match="negative"):
        watermark(records, -1.0)


def test_duplicates_flagged_unflagged_and_redelivery_to_another_consumer(
        spark: SparkSession):
    records = frame(spark, [
        # Delivered, then redelivered to the same consumer after a recover: flagged.
        rec(1000.0, "gw-a", "publish", "f", dest="queue:q", client="p"),
        rec(1001.0, "gw-a", "deliver", "f", dest="queue:q", client="c1", count=1),
        rec(1002.0, "gw-a", "redeliver", "f", dest="queue:q", client="c1", count=2,
            reason="recover"),
        # Delivered twice to the same consumer without the mark: a real duplicate.
        rec(1100.0, "gw-a", "publish", "u", client="p"),
        rec(1101.0, "gw-a", "deliver", "u", client="c1", count=1),
        rec(1102.0, "gw-a", "deliver", "u", client="c1", count=1),
        # A queue message redelivered to another consumer after the first closed: one copy
        # each, no duplicate on either route.
        rec(1200.0, "gw-a", "publish", "o", dest="queue:q", client="p"),
        rec(1201.0, "gw-a", "deliver", "o", dest="queue:q", client="c1", count=1),
        rec(1202.0, "gw-a", "redeliver", "o", dest="queue:q", client="c2", count=2,
            reason="closed"),
        # Exported twice through the same transport: an export has no redelivered mark.
        rec(1300.0, "gw-a", "publish", "e", client="p"),
        rec(1301.0, "gw-a", "export", "e", client="to-b"),
        rec(1302.0, "gw-a", "export", "e", client="to-b"),
    ])

    got = duplicated(routes(records))

    assert pick(got, "trace_id", "exit", "exit_client", "copies", "flagged") == [
        ("e", "export", "to-b", 2, False),
        ("f", "deliver", "c1", 2, True),
        ("u", "deliver", "c1", 2, False),
    ]


def test_verdicts_puts_every_verdict_in_one_frame(spark: SparkSession):
    records = frame(spark, [
        rec(1000.0, "gw-a", "publish", "d", client="p"),
        rec(1001.0, "gw-a", "deliver", "d", client="c", count=1),
        rec(1002.0, "gw-a", "redeliver", "d", client="c", count=2),
        rec(1003.0, "gw-a", "publish", "l", client="p"),
        rec(9000.0, "gw-a", "publish", "y", client="p"),
        # No trace id: not matched, no verdict.
        rec(1004.0, "gw-a", "publish", None, client="p"),
    ])

    got = verdicts(records, GRACE).select("verdict", "trace_id", "latency_ms", "copies",
                                          "flagged")

    want = spark.createDataFrame(
        [("delivered", "d", 1.0, 2, None), ("duplicated", "d", None, 2, True),
         ("lost", "l", None, None, None), ("pending", "y", None, None, None)],
        got.schema)
    assert_df_equality(got, want, ignore_row_order=True, ignore_nullable=True)


def test_an_export_the_next_gateway_never_imported_is_lost_in_transit(spark: SparkSession):
    records = frame(spark, [
        # to-b leads to gw-b (t1 crossed); t2 never arrived; t4 arrived late (still arrived).
        rec(1000.0, "gw-a", "publish", "t1", client="p"),
        rec(1001.0, "gw-a", "export", "t1", client="to-b"),
        rec(1010.0, "gw-b", "import", "t1", client="from-a"),
        rec(1100.0, "gw-a", "publish", "t2", client="p"),
        rec(1101.0, "gw-a", "export", "t2", client="to-b"),
        rec(1200.0, "gw-a", "publish", "t4", client="p"),
        rec(1201.0, "gw-a", "export", "t4", client="to-b"),
        rec(4500.0, "gw-b", "import", "t4", client="from-a"),
        # Exported after the watermark and not imported yet: pending.
        rec(4800.0, "gw-a", "publish", "t5", client="p"),
        rec(4801.0, "gw-a", "export", "t5", client="to-b"),
        # to-cloud leads to no gateway read: no verdict for t3.
        rec(1300.0, "gw-a", "publish", "t3", client="p"),
        rec(1301.0, "gw-a", "export", "t3", client="to-cloud"),
        # Imported back at the gateway that exported it (a loop) does not count as arrived.
        rec(1400.0, "gw-a", "publish", "t6", client="p"),
        rec(1401.0, "gw-a", "export", "t6", client="to-b"),
        rec(1402.0, "gw-a", "import", "t6", client="from-b"),
        rec(5000.0, "gw-b", "publish", "z", client="p"),
        rec(5001.0, "gw-b", "deliver", "z", client="c", count=1),
    ])

    got = verdicts(records, GRACE).where("exit = 'export' and verdict != 'delivered'")

    assert pick(got, "verdict", "trace_id", "gw", "exit_client", "exit_ts", "watermark") == [
        ("lost_in_transit", "t2", "gw-a", "to-b", 1101.0, 4001.0),
        ("lost_in_transit", "t6", "gw-a", "to-b", 1401.0, 4001.0),
        ("pending", "t5", "gw-a", "to-b", 4801.0, 4001.0),
    ]


def test_a_message_handed_to_a_transport_but_never_exported_is_lost(spark: SparkSession):
    # Logs of earlier gateways (version 1, early version 2) have a transport's export
    # consumer (its connection gw-a:1, then the client of its import and export records)
    # like any consumer: a deliver when the message is handed to it, an export when the far
    # side took it. t2 was handed over and the gateway died
    # before the far side confirmed it; t1 left; t3 went to a local consumer.
    records = frame(spark, [
        rec(1000.0, "gw-a", "publish", "t1", client="gw-a:5"),
        rec(1000.1, "gw-a", "deliver", "t1", client="gw-a:1", count=1),
        rec(1002.0, "gw-a", "export", "t1", client="gw-a:1", reason="transport:to-b"),
        rec(1003.0, "gw-a", "ack", "t1", client="gw-a:1", count=1),
        rec(1100.0, "gw-a", "publish", "t2", client="gw-a:5"),
        rec(1100.1, "gw-a", "deliver", "t2", client="gw-a:1", count=1),
        rec(1200.0, "gw-a", "publish", "t3", client="gw-a:5"),
        rec(1200.1, "gw-a", "deliver", "t3", client="gw-a:7", count=1),
        rec(5000.0, "gw-a", "publish", "z", client="gw-a:5"),
        rec(5000.1, "gw-a", "deliver", "z", client="gw-a:7", count=1),
    ])

    got = verdicts(records, GRACE).where("trace_id != 'z'")

    assert pick(got, "verdict", "trace_id", "exit", "exit_client") == [
        ("delivered", "t1", "export", "gw-a:1"),
        ("delivered", "t3", "deliver", "gw-a:7"),
        ("lost", "t2", None, None),
    ]


def test_expired_dead_lettered_dropped_discarded_with_the_gateways_reason(
        spark: SparkSession):
    records = frame(spark, [
        rec(1000.0, "gw-a", "publish", "x", dest="queue:q", client="p"),
        rec(1500.0, "gw-a", "expire", "x", dest="queue:q", reason="expired"),
        # Delivered, redelivered, then moved to $sys.undelivered.
        rec(1100.0, "gw-a", "publish", "u", dest="queue:q", client="p"),
        rec(1101.0, "gw-a", "deliver", "u", dest="queue:q", client="c1", count=1),
        rec(1102.0, "gw-a", "redeliver", "u", dest="queue:q", client="c1", count=2),
        rec(1103.0, "gw-a", "undeliverable", "u", dest="queue:q", count=2,
            reason="maxredelivery_exceeded"),
        # A topic message delivered to one subscriber and dropped for another.
        rec(1200.0, "gw-a", "publish", "d", client="p"),
        rec(1201.0, "gw-a", "deliver", "d", client="c1", count=1),
        rec(1202.0, "gw-a", "drop", "d", client="mqtt:c2", reason="packet_too_large"),
        rec(1300.0, "gw-a", "publish", "o", dest="queue:q", client="p"),
        rec(1310.0, "gw-a", "discard", "o", dest="queue:q", reason="discarded"),
        # A bus DATALOSS advisory: no trace id, a count of messages lost.
        rec(1400.0, "gw-a", "drop", None, dest="topic:_RV.ERROR.SYSTEM.DATALOSS.INBOUND.BCAST",
            reason="_RV.ERROR.SYSTEM.DATALOSS.INBOUND.BCAST", lost=7),
    ])

    got = decided(records)

    assert pick(got, "verdict", "trace_id", "exit", "exit_client", "reason", "delivery_count",
                "latency_ms", "lost_count") == [
        ("dead_lettered", "u", "undeliverable", None, "maxredelivery_exceeded", 2, 3.0, None),
        ("discarded", "o", "discard", None, "discarded", 0, 10.0, None),
        ("dropped", None, "drop", None, "_RV.ERROR.SYSTEM.DATALOSS.INBOUND.BCAST", 0, None, 7),
        ("dropped", "d", "drop", "mqtt:c2", "packet_too_large", 0, 2.0, None),
        ("expired", "x", "expire", None, "expired", 0, 500.0, None),
    ]
    assert pick(got.where("trace_id = 'u'"), "msg_id", "entry_event", "origin_gw") == [
        ("ID:gw-a.u", "publish", "gw-a")]
    # None of them is lost: the gateway let each go on purpose.
    assert lost(records, routes(records), GRACE).count() == 0


H1, H2, P1, P2 = "56dc6a7c472f5a8f", "072f4cc475f62963", "1f7a181c96fc7cc3", "9e1d0b2c3a4f5e6d"


def test_changed_by_nothing_is_a_verdict_by_mapping_rules_is_not_v1_is_unknown(
        spark: SparkSession):
    records = frame(spark, [
        # Left as it entered.
        rec(1000.0, "gw-a", "publish", "same", client="p", body_hash=H1, props_hash=P1),
        rec(1001.0, "gw-a", "deliver", "same", client="c", count=1, body_hash=H1,
            props_hash=P1),
        # The body changed on the way to a consumer, and no rule says why.
        rec(1100.0, "gw-a", "publish", "body", client="p", body_hash=H1, props_hash=P1),
        rec(1101.0, "gw-a", "deliver", "body", client="c", count=1, body_hash=H2,
            props_hash=P1),
        # Exported through mapping rules that changed body and properties: no verdict.
        rec(1200.0, "gw-a", "publish", "ruled", client="p", body_hash=H1, props_hash=P1),
        rec(1201.0, "gw-a", "export", "ruled", client="to-b", body_hash=H2, props_hash=P2,
            rules="json-out,export_properties=false"),
        # Exported with no rule and both changed; properties where there were none counts.
        rec(1300.0, "gw-a", "publish", "both", client="p", body_hash=H1),
        rec(1301.0, "gw-a", "export", "both", client="to-b", body_hash=H2, props_hash=P2),
        # The second copy to the same consumer differs from the first.
        rec(1400.0, "gw-a", "publish", "second", client="p", body_hash=H1, props_hash=P1),
        rec(1401.0, "gw-a", "deliver", "second", client="c", count=1, body_hash=H1,
            props_hash=P1),
        rec(1402.0, "gw-a", "redeliver", "second", client="c", count=2, body_hash=H1,
            props_hash=P2),
        # Version 1: no hashes, so unknown (never "unchanged").
        rec(1500.0, "gw-a", "publish", "old", client="p"),
        rec(1501.0, "gw-a", "deliver", "old", client="c", count=1),
        # No body and no properties on both sides: the same.
        rec(1600.0, "gw-a", "publish", "empty", client="p", rules=None),
        rec(1601.0, "gw-a", "deliver", "empty", client="c", count=1, rules=None),
    ])
    route_rows = routes(records)

    assert pick(changed(route_rows), "verdict", "trace_id", "exit", "changed_parts") == [
        ("changed", "body", "deliver", "body"),
        ("changed", "both", "export", "body,properties"),
        ("changed", "second", "deliver", "properties"),
    ]
    assert pick(delivered(route_rows, GRACE), "trace_id", "changed", "rules") == [
        ("body", True, None), ("both", True, None), ("empty", False, None),
        ("old", None, None), ("ruled", True, "json-out,export_properties=false"),
        ("same", False, None), ("second", True, None),
    ]


def test_reordered_per_sender_and_route_not_across_senders_or_consumers(spark: SparkSession):
    records = frame(spark, [
        # p sends m1, m2, m3; c gets m1, m3, m2: m3 left before m2, sent before it.
        rec(1000.0, "gw-a", "publish", "m1", client="p"),
        rec(1010.0, "gw-a", "publish", "m2", client="p"),
        rec(1020.0, "gw-a", "publish", "m3", client="p"),
        rec(1030.0, "gw-a", "deliver", "m1", client="c", count=1),
        rec(1031.0, "gw-a", "deliver", "m3", client="c", count=1),
        rec(1032.0, "gw-a", "deliver", "m2", client="c", count=1),
        # c2 gets them in order: nothing for that route.
        rec(1040.0, "gw-a", "deliver", "m1", client="c2", count=1),
        rec(1041.0, "gw-a", "deliver", "m2", client="c2", count=1),
        rec(1042.0, "gw-a", "deliver", "m3", client="c2", count=1),
        # Another sender's message, sent earlier and left later: no order between senders.
        rec(1005.0, "gw-a", "publish", "n1", client="q"),
        rec(1050.0, "gw-a", "deliver", "n1", client="c", count=1),
        # Two sends at the same instant have no order.
        rec(1100.0, "gw-a", "publish", "s1", client="r"),
        rec(1100.0, "gw-a", "publish", "s2", client="r"),
        rec(1102.0, "gw-a", "deliver", "s2", client="c", count=1),
        rec(1103.0, "gw-a", "deliver", "s1", client="c", count=1),
    ])

    got = reordered(routes(records))

    assert pick(got, "verdict", "trace_id", "exit_client", "origin_client") == [
        ("reordered", "m3", "c", "p")]


def test_a_message_a_consumer_got_only_redelivered_witnesses_no_order(spark: SparkSession):
    records = frame(spark, [
        # p sends m1..m3 to a queue; c1 takes m1 and dies holding it; c2 gets m2, m3 and
        # then m1, redelivered (JMS 1.1 §4.4.10.2): no reordering on either route.
        rec(1000.0, "gw-a", "publish", "m1", dest="queue:q", client="p"),
        rec(1010.0, "gw-a", "publish", "m2", dest="queue:q", client="p"),
        rec(1020.0, "gw-a", "publish", "m3", dest="queue:q", client="p"),
        rec(1001.0, "gw-a", "deliver", "m1", dest="queue:q", client="c1", count=1),
        rec(1011.0, "gw-a", "deliver", "m2", dest="queue:q", client="c2", count=1),
        rec(1021.0, "gw-a", "deliver", "m3", dest="queue:q", client="c2", count=1),
        rec(1030.0, "gw-a", "redeliver", "m1", dest="queue:q", client="c2", count=2),
        # a first-hand delivery out of order on the same route still is reordering
        rec(1040.0, "gw-a", "publish", "m4", dest="queue:q", client="p"),
        rec(1050.0, "gw-a", "publish", "m5", dest="queue:q", client="p"),
        rec(1051.0, "gw-a", "deliver", "m5", dest="queue:q", client="c2", count=1),
        rec(1052.0, "gw-a", "deliver", "m4", dest="queue:q", client="c2", count=1),
    ])

    assert pick(reordered(routes(records)), "trace_id", "exit_client") == [("m5", "c2")]


def test_clock_skew_within_the_tolerance_is_neither_reordering_nor_negative_latency(
        spark: SparkSession):
    # gw-b's clock is 300 ms behind gw-a's. The device mqtt:dev publishes s1 through gw-a,
    # which exports it to gw-b, then fails over and publishes s2 through gw-b; consumer c at
    # gw-b gets s1 then s2, in the order they were sent.
    records = frame(spark, [
        rec(2000.0, "gw-a", "publish", "s1", client="mqtt:dev"),
        rec(2001.0, "gw-a", "export", "s1", client="to-b"),
        rec(1710.0, "gw-b", "import", "s1", client="from-a"),
        rec(1711.0, "gw-b", "deliver", "s1", client="c", count=1),
        rec(1800.0, "gw-b", "publish", "s2", client="mqtt:dev"),
        rec(1801.0, "gw-b", "deliver", "s2", client="c", count=1),
    ])
    route_rows = routes(records)

    def e2e(skew_ms: float) -> list[tuple[object, ...]]:
        return pick(delivered(route_rows, GRACE, skew_ms).where("gw = 'gw-b'"),
                    "trace_id", "latency_ms", "e2e_latency_ms")

    # Beyond the tolerance the clocks' difference shows as a negative latency.
    assert e2e(500.0) == [("s1", 1.0, 0.0), ("s2", 1.0, 1.0)]
    assert e2e(100.0) == [("s1", 1.0, -289.0), ("s2", 1.0, 1.0)]
    # One sender on two gateways: its sends 200 ms apart on the two clocks have no known
    # order within a 500 ms tolerance; with none, gw-b's clock makes s2 look sent first.
    assert reordered(route_rows, 500.0, sender_spans_gateways=True).count() == 0
    assert pick(reordered(route_rows, 0.0, sender_spans_gateways=True), "trace_id") == [
        ("s1",)]
    # Known per gateway, they are two senders: never compared.
    assert reordered(route_rows, 0.0).count() == 0
    with pytest.raises(ValueError, match="negative"):
        reordered(route_rows, -1.0)


def test_a_duplicate_after_the_grace_period_and_one_the_duplicate_window_dropped(
        spark: SparkSession):
    records = frame(spark, [
        # Delivered, then delivered again to the same consumer 2.5 s later (past the grace
        # period): one delivered row (on time: the first copy) and a duplicate of 2 copies.
        rec(1000.0, "gw-a", "publish", "again", client="p"),
        rec(1001.0, "gw-a", "deliver", "again", client="c", count=1),
        rec(3500.0, "gw-a", "deliver", "again", client="c", count=1),
        # Exported twice to gw-b, whose duplicate window dropped the second import: the
        # duplicate never reached a consumer there.
        rec(1100.0, "gw-a", "publish", "resent", client="p"),
        rec(1101.0, "gw-a", "export", "resent", client="to-b"),
        rec(1104.0, "gw-b", "import", "resent", client="from-a"),
        rec(1105.0, "gw-b", "deliver", "resent", client="c", count=1),
        rec(1400.0, "gw-a", "export", "resent", client="to-b"),
        rec(1404.0, "gw-b", "drop", "resent", client="from-a", reason="duplicate"),
        # Exported twice through a transport that leads nowhere read: nothing says what
        # became of the second copy, none counted as dropped.
        rec(1200.0, "gw-a", "publish", "cloud", client="p"),
        rec(1201.0, "gw-a", "export", "cloud", client="to-cloud"),
        rec(1202.0, "gw-a", "export", "cloud", client="to-cloud"),
        rec(9000.0, "gw-a", "publish", "later", client="p"),
    ])

    got = verdicts(records, GRACE)

    assert pick(got.where("verdict in ('delivered', 'duplicated')"), "verdict", "trace_id",
                "gw", "exit_client", "copies", "copies_dropped", "late", "latency_ms") == [
        ("delivered", "again", "gw-a", "c", 2, None, False, 1.0),
        ("delivered", "cloud", "gw-a", "to-cloud", 2, None, False, 1.0),
        ("delivered", "resent", "gw-a", "to-b", 2, None, False, 1.0),
        ("delivered", "resent", "gw-b", "c", 1, None, False, 1.0),
        ("duplicated", "again", "gw-a", "c", 2, 0, None, None),
        ("duplicated", "cloud", "gw-a", "to-cloud", 2, 0, None, None),
        ("duplicated", "resent", "gw-a", "to-b", 2, 1, None, None),
    ]
    # the window's drop is the gateway's own decision, with its word
    assert pick(got.where("verdict = 'dropped'"), "trace_id", "gw", "exit_client",
                "reason") == [("resent", "gw-b", "from-a", "duplicate")]
    assert pick(got.where("verdict in ('lost', 'lost_in_transit')"), "trace_id") == []


def test_a_message_across_two_gateways_and_a_bus_hop(spark: SparkSession):
    # gw-a takes an MQTT publish and exports it over AMQP to gw-b; gw-b publishes it on the
    # RV-style bus (its `rv` transport), where gw-c imports it and delivers it to a STOMP
    # consumer. The trace id rides every hop (on the bus in the origin marker). A second
    # message crosses to gw-b but never reaches gw-c: lost in transit on the bus hop.
    records = frame(spark, [
        rec(1000.0, "gw-a", "publish", "m1", client="mqtt:dev-1", body_hash="b1"),
        rec(1002.0, "gw-a", "export", "m1", client="to-b", far_dest="m1-far", body_hash="b1"),
        rec(1010.0, "gw-b", "import", "m1", client="from-a", body_hash="b1"),
        rec(1011.0, "gw-b", "export", "m1", dest="topic:t", client="bus",
            far_dest="T", body_hash="b1"),
        rec(1030.0, "gw-c", "import", "m1", dest="topic:t", client="bus", body_hash="b1"),
        rec(1032.0, "gw-c", "deliver", "m1", client="stomp:s-1", count=1, body_hash="b1"),
        rec(1100.0, "gw-a", "publish", "m2", client="mqtt:dev-1", body_hash="b2"),
        rec(1102.0, "gw-a", "export", "m2", client="to-b", body_hash="b2"),
        rec(1110.0, "gw-b", "import", "m2", client="from-a", body_hash="b2"),
        rec(1111.0, "gw-b", "export", "m2", client="bus", body_hash="b2"),
        rec(9000.0, "gw-c", "publish", "later", client="p"),
    ])

    got = verdicts(records, GRACE)

    assert pick(got.where("verdict != 'pending'"), "verdict", "trace_id", "gw", "exit",
                "exit_client", "latency_ms", "e2e_latency_ms", "origin_gw") == [
        ("delivered", "m1", "gw-a", "export", "to-b", 2.0, 2.0, "gw-a"),
        ("delivered", "m1", "gw-b", "export", "bus", 1.0, 11.0, "gw-a"),
        ("delivered", "m1", "gw-c", "deliver", "stomp:s-1", 2.0, 32.0, "gw-a"),
        ("delivered", "m2", "gw-a", "export", "to-b", 2.0, 2.0, "gw-a"),
        ("delivered", "m2", "gw-b", "export", "bus", 1.0, 11.0, "gw-a"),
        ("lost_in_transit", "m2", "gw-b", "export", "bus", None, None, "gw-a"),
    ]
