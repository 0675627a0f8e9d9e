"""The fallback key: an export and an import joined by destination, body hash and time when
the hop between two gateways could not carry the trace id."""

from __future__ import annotations

import pytest
from dlogrecords import frame, rec
from pyspark.sql import DataFrame, SparkSession

from spark.link import content_links, link_by_content
from spark.routes import routes
from spark.verdicts import delivered, lost_in_transit

pytestmark = pytest.mark.spark

B0, B1, B2, B4, B5, B6, B7 = (f"{i:016x}" for i in (0xb0, 0xb1, 0xb2, 0xb4, 0xb5, 0xb6, 0xb7))


def hop(trace: str, import_trace: str | None, ts: float, import_ts: float, body: str,
        far_dest: str | None = "plant/temp",
        import_far_dest: str | None = "plant/temp") -> list[dict[str, object]]:
    """Published and exported at gw-a; imported at gw-b (under ``import_trace``: a new trace
    id when the hop lost ours) and delivered there."""
    out = [rec(ts - 1, "gw-a", "publish", trace, client="p", body_hash=body),
           rec(ts, "gw-a", "export", trace, client="to-broker", body_hash=body,
               far_dest=far_dest)]
    if import_trace is not None:
        out += [rec(import_ts, "gw-b", "import", import_trace, client="from-broker",
                    body_hash=body, far_dest=import_far_dest),
                rec(import_ts + 1, "gw-b", "deliver", import_trace, client="c", count=1,
                    body_hash=body)]
    return out


def links(df: DataFrame) -> list[tuple[object, ...]]:
    return sorted(tuple(r) for r in df.select("trace_id", "linked_trace_id").collect())


def test_an_import_without_our_trace_id_is_linked_to_its_export_when_unambiguous(
        spark: SparkSession):
    records = frame(spark, [
        # Crossed with its trace id: not a candidate (and teaches that to-broker leads to gw-b).
        *hop("t0", "t0", 500.0, 505.0, B0),
        # The hop lost the trace id: gw-b's import started trace u1.
        *hop("t1", "u1", 1000.0, 1010.0, B1),
        # Two exports of the same body to the same place, one import: which one is unknown.
        *hop("t2", "u2", 2000.0, 2010.0, B2),
        *hop("t3", None, 2005.0, 0.0, B2),
        # Imported after the window.
        *hop("t4", "u4", 3000.0, 3000.0 + 1001.0, B4),
        # gw-b's clock behind: the import reads 100 ms before the export.
        *hop("t5", "u5", 4000.0, 3900.0, B5),
        # Another far destination with the same body.
        *hop("t6", "u6", 5000.0, 5010.0, B6, import_far_dest="plant/other"),
        # No far name on either side (the bus): the gateways' destinations are compared.
        *hop("t7", "u7", 6000.0, 6010.0, B7, far_dest=None, import_far_dest=None),
    ])

    assert links(content_links(records, 1000.0, skew_ms=200.0)) == [
        ("u1", "t1"), ("u5", "t5"), ("u7", "t7")]
    assert links(content_links(records, 1000.0)) == [("u1", "t1"), ("u7", "t7")]
    assert links(content_links(records, 2000.0)) == [("u1", "t1"), ("u4", "t4"), ("u7", "t7")]
    with pytest.raises(ValueError, match="negative"):
        content_links(records, -1.0)


def test_linked_the_message_is_delivered_at_the_far_gateway_not_lost_in_transit(
        spark: SparkSession):
    records = frame(spark, [
        *hop("t0", "t0", 500.0, 505.0, B0),
        *hop("t1", "u1", 1000.0, 1010.0, B1),
        rec(9000.0, "gw-a", "publish", "late", client="p"),  # moves the watermark
    ])

    linked = link_by_content(records, 1000.0)

    before = lost_in_transit(records, routes(records), 1000.0)
    assert sorted((r["verdict"], r["trace_id"]) for r in before.collect()) == [
        ("lost_in_transit", "t1")]
    after = routes(linked).where("trace_id = 't1'")
    assert lost_in_transit(linked, after, 1000.0).count() == 0
    got = sorted((r["gw"], r["exit"], r["origin_gw"], r["e2e_latency_ms"])
                 for r in delivered(after, 1000.0).collect())
    assert got == [("gw-a", "export", "gw-a", 1.0), ("gw-b", "deliver", "gw-a", 12.0)]
    # Every record of the far side's trace now carries ours.
    assert linked.where("trace_id = 'u1'").count() == 0
    assert linked.where("trace_id = 't1' and gw = 'gw-b'").count() == 2
