"""Verdicts on small hand-made logs: delivered (latency, across two gateways), late but not
lost, lost and pending around the watermark, a drop that is no loss, duplicates flagged and
not."""

from __future__ import annotations

import pytest
from chispa import assert_df_equality
from dlogrecords import frame, rec
from pyspark.sql import DataFrame, SparkSession

from spark.routes import routes
from spark.verdicts import delivered, duplicated, lost, verdicts, watermark

pytestmark = pytest.mark.spark

GRACE = 1000.0


def pick(df: DataFrame, *cols: str) -> list[tuple[object, ...]]:
    return sorted(tuple(r) for r in df.select(*cols).collect())


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
