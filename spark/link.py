"""The fallback key: linking the two sides of a hop that could not carry the trace id.

A transport carries the trace id in the message (``JMS_GW_TRACE_ID`` or the protocol's own
place); a hop that has nowhere to put it (an MQTT 3.1.1 broker between two gateways: no
properties) delivers the message to the far gateway without it, and the far gateway's
``import`` starts a new trace. Its records then join nothing on the near side: the export
looks lost in transit and the import looks like a new message.

``content_links`` pairs such an export with such an import by what they still share: the
destination (the far side's name, ``far_dest``, when both records give it; else the
gateway's ``dest``), the body (``body_hash``, version 2) and time — the import within
``window_ms`` after the export, or up to ``skew_ms`` before it, as the two gateways' clocks
may differ by that much. Only unambiguous pairs are linked: an import that matches exactly
one export, from an export that matches exactly one import on that gateway. A repeated body
(a sensor sending the same value twice within the window) links nothing rather than a wrong
message. Exports and imports that already join another gateway by trace id are left out.

``relink`` gives the import's trace the export's trace id on every record (every gateway),
so routes, origins and verdicts see one message. A path with two such hops in a row needs
``link_by_content`` applied twice (the second link starts from the first's result).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from spark.schema import EXPORT, IMPORT


def content_links(records: DataFrame, window_ms: float, skew_ms: float = 0.0) -> DataFrame:
    """(``trace_id``, ``linked_trace_id``): the import trace on the far gateway, and the
    trace of the export it is the unambiguous continuation of."""
    if window_ms < 0 or skew_ms < 0:
        raise ValueError("the link window and the clock-skew tolerance cannot be negative")
    hashed = F.col("trace_id").isNotNull() & F.col("body_hash").isNotNull()
    ev = F.col("event")
    # Traces that crossed with their id are not candidates on either side: an export whose
    # trace another gateway imported, an import whose trace another gateway exported. The
    # gateways that exported and imported each trace come from one window over the exports
    # and imports together (one shuffle, one pass over the records).
    by_trace = Window.partitionBy("trace_id")
    ex_gws = F.collect_set(F.when(ev == F.lit(EXPORT), F.col("gw"))).over(by_trace)
    im_gws = F.collect_set(F.when(ev == F.lit(IMPORT), F.col("gw"))).over(by_trace)
    crossed = F.when(ev == F.lit(EXPORT), F.exists(im_gws, lambda g: g != F.col("gw"))) \
        .otherwise(F.exists(ex_gws, lambda g: g != F.col("gw")))
    hops = (records.where(ev.isin(EXPORT, IMPORT) & hashed)
            .select("event", "trace_id", "gw", "ts", "dest", "far_dest", "body_hash",
                    crossed.alias("crossed"))
            .where(~F.col("crossed")))
    ex_open = (hops.where(ev == F.lit(EXPORT))
               .select(F.col("trace_id").alias("ex_trace"), F.col("gw").alias("ex_gw"),
                       F.col("ts").alias("ex_ts"), F.col("dest").alias("ex_dest"),
                       F.col("far_dest").alias("ex_far_dest"),
                       F.col("body_hash").alias("ex_body")))
    im_open = (hops.where(ev == F.lit(IMPORT))
               .select(F.col("trace_id").alias("im_trace"), F.col("gw").alias("im_gw"),
                       F.col("ts").alias("im_ts"), F.col("dest").alias("im_dest"),
                       F.col("far_dest").alias("im_far_dest"),
                       F.col("body_hash").alias("im_body")))
    same_dest = (F.when(F.col("ex_far_dest").isNotNull() & F.col("im_far_dest").isNotNull(),
                        F.col("ex_far_dest") == F.col("im_far_dest"))
                 .otherwise(F.col("ex_dest") == F.col("im_dest")))
    gap = F.col("im_ts") - F.col("ex_ts")
    pairs = (ex_open.join(im_open,
                          (F.col("ex_gw") != F.col("im_gw"))
                          & (F.col("ex_body") == F.col("im_body")) & same_dest
                          & (gap >= F.lit(-float(skew_ms))) & (gap <= F.lit(float(window_ms))),
                          "inner")
             .select("ex_trace", "im_trace", "im_gw").distinct())
    # How many exports each import matches, and how many imports on one gateway each export
    # matches, as windows over the pairs (computed once) rather than two aggregations joined
    # back to them.
    exports_matched = F.count(F.lit(1)).over(Window.partitionBy("im_trace"))
    imports_matched = F.count(F.lit(1)).over(Window.partitionBy("ex_trace", "im_gw"))
    return (pairs.select("ex_trace", "im_trace", exports_matched.alias("n_ex"),
                         imports_matched.alias("n_im"))
            .where((F.col("n_ex") == 1) & (F.col("n_im") == 1))
            .select(F.col("im_trace").alias("trace_id"),
                    F.col("ex_trace").alias("linked_trace_id")))


def relink(records: DataFrame, links: DataFrame) -> DataFrame:
    """The records, with every linked trace id replaced by the trace it continues."""
    return (records.join(links, on="trace_id", how="left")
            .withColumn("trace_id", F.coalesce("linked_trace_id", "trace_id"))
            .select(*records.columns))


def link_by_content(records: DataFrame, window_ms: float, skew_ms: float = 0.0) -> DataFrame:
    """``relink`` with the links ``content_links`` finds in the records themselves."""
    return relink(records, content_links(records, window_ms, skew_ms))
