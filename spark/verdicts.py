"""Verdicts, route by route (routes: ``spark.routes``): delivered (with its latency),
duplicated, lost (or still pending) after a grace period, lost in transit between two
gateways, let go on purpose (expired, dead-lettered, dropped, discarded, with the gateway's
reason), changed on its way through a gateway by nothing that says so, and reordered.

Time is event time: the records' own ``ts`` (epoch milliseconds). The *watermark* is the
latest ``ts`` in the records minus the grace period; an entry at or before the watermark has
had the whole grace period to leave, so one that never left and that the gateway never let go
on purpose (expire, drop, discard, undeliverable) is ``lost``; one after it is ``pending`` (no
verdict yet). A message that did leave, but later than the grace period after it entered, is
``delivered`` with ``late`` set: it is what a reader of the logs at an earlier watermark
would have called lost.

Clocks: a time on one gateway is compared only with a time on the same gateway, except the
end-to-end latency (exit on one gateway, first entry on another) and, when one sender is
known across gateways, the order in which it sent. There the gateways' clocks may differ by
up to ``skew_ms``: an end-to-end latency negative by no more than that is 0, and two sends
closer than that on different clocks have no known order.

Every function takes and returns DataFrames (and plain parameters) and nothing else; one output row per verdict, so
a route that was delivered twice has a ``delivered`` row and a ``duplicated`` row.
``verdicts`` puts them in one DataFrame with the columns of ``VERDICT_COLUMNS``.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark.routes import message_entries, message_origin, messages, routes
from spark.schema import (
    DECISION_EVENTS,
    DELIVER,
    DISCARD,
    DROP,
    EXPIRE,
    EXPORT,
    UNDELIVERABLE,
)

DELIVERED = "delivered"
DUPLICATED = "duplicated"
LOST = "lost"
LOST_IN_TRANSIT = "lost_in_transit"
PENDING = "pending"
EXPIRED = "expired"
DEAD_LETTERED = "dead_lettered"
DROPPED = "dropped"
DISCARDED = "discarded"
CHANGED = "changed"
REORDERED = "reordered"

# The verdict of each event by which the gateway let a message go on purpose.
DECISION_VERDICTS: dict[str, str] = {
    EXPIRE: EXPIRED, UNDELIVERABLE: DEAD_LETTERED, DROP: DROPPED, DISCARD: DISCARDED,
}
assert set(DECISION_VERDICTS) == set(DECISION_EVENTS)

VERDICT_COLUMNS = [
    "verdict", "trace_id", "msg_id", "gw", "dest",
    "entry_event", "entry_client", "entry_ts",
    "exit", "exit_client", "exit_ts",
    "latency_ms", "e2e_latency_ms", "late",
    "copies", "flagged", "copies_dropped",
    "origin_gw", "origin_ts", "origin_client", "watermark",
    "changed", "changed_parts", "rules",
    "reason", "delivery_count", "lost_count",
]


def watermark(records: DataFrame, grace_ms: float) -> DataFrame:
    """A one-row DataFrame: ``watermark`` = the latest ``ts`` of the records minus
    ``grace_ms``."""
    if grace_ms < 0:
        raise ValueError("the grace period cannot be negative")
    return records.agg((F.max("ts") - F.lit(float(grace_ms))).alias("watermark"))


def delivered(route_rows: DataFrame, grace_ms: float, skew_ms: float = 0.0) -> DataFrame:
    """A ``delivered`` row per route that a message left by (to a consumer or a transport):
    ``latency_ms`` from its entry on that gateway to the first copy leaving (one clock),
    ``e2e_latency_ms`` from its first entry on any gateway (``origin_ts``; across clocks when
    the gateways differ, where a negative value within ``skew_ms`` is clock skew and reads
    0), and ``late`` when the latency is over ``grace_ms``.

    ``changed`` says whether the message left with other hashes than it entered with (for
    any reason, a mapping rule's included: ``rules`` names those that ran on an export);
    null when a record of the route is of version 1, which has no hashes (unknown, not
    unchanged: docs/delivery-log.md, "Version 1")."""
    return _each(route_rows, [_delivered(grace_ms, skew_ms)])


def _delivered(grace_ms: float, skew_ms: float) -> Column:
    _check_skew(skew_ms)
    latency = F.col("exit_ts") - F.col("entry_ts")
    e2e = F.col("exit_ts") - F.col("origin_ts")
    within_skew = ((F.col("gw") != F.col("origin_gw")) & (e2e < 0)
                   & (e2e >= F.lit(-float(skew_ms))))
    contents = F.col("exit_contents")
    rules = F.transform(F.filter(contents, lambda c: c["rules"].isNotNull()),
                        lambda c: c["rules"])
    return _verdict(F.col("exit").isNotNull(), F.lit(DELIVERED),
                    latency_ms=latency,
                    e2e_latency_ms=F.when(within_skew, F.lit(0.0)).otherwise(e2e),
                    late=latency > F.lit(float(grace_ms)),
                    copies=F.col("exit_count"),
                    changed=F.when(_hashes_known(), F.exists(contents, _differs)),
                    rules=F.when(F.size(rules) > 0, F.array_join(F.array_sort(rules), ";")))


def changed(route_rows: DataFrame) -> DataFrame:
    """A ``changed`` row per route a message left with another body or other properties
    than it entered the gateway with (``body_hash``, ``props_hash``: docs/delivery-log.md,
    "Hashes"), when no mapping rule ran on the copy that differs (``rules`` null on its
    exit record). The core never changes a message it holds, so such a change was made by
    nothing that says so; a change by declared rules on an export is no verdict (the
    ``delivered`` row says ``changed`` and names the ``rules``). ``changed_parts`` is
    ``body``, ``properties`` or both. A route with a version 1 record gets no verdict: with
    no hashes, whether it changed is unknown."""
    return _each(route_rows, [_changed()])


def _changed() -> Column:
    unexplained = F.filter(F.col("exit_contents"),
                           lambda c: c["rules"].isNull() & _differs(c))
    body = F.exists(unexplained,
                    lambda c: ~c["body_hash"].eqNullSafe(F.col("entry_body_hash")))
    props = F.exists(unexplained,
                     lambda c: ~c["props_hash"].eqNullSafe(F.col("entry_props_hash")))
    parts = F.concat_ws(",", F.when(body, F.lit("body")), F.when(props, F.lit("properties")))
    return _verdict(F.col("exit").isNotNull() & _hashes_known() & (F.size(unexplained) > 0),
                    F.lit(CHANGED), changed=F.lit(True), changed_parts=parts)


def decided(records: DataFrame, message_rows: DataFrame | None = None) -> DataFrame:
    """A row per record by which a gateway let a message go on purpose, with the verdict of
    its event: ``expired`` (expire), ``dead_lettered`` (undeliverable: moved to
    ``$sys.undelivered``), ``dropped`` (drop), ``discarded`` (discard: the oldest message
    made room, overflowPolicy=discardOld). ``reason`` is the word the gateway logged
    (docs/delivery-log.md, "Events"), ``exit`` the event, ``exit_client`` the client it
    concerned (the subscriber a topic message was dropped for, or null), ``delivery_count``
    how often it had been delivered, ``latency_ms`` the time from its entry on that gateway
    to the decision (null when the entry is not in the logs read). A record with no trace id
    is kept too (a bus's DATALOSS advisory: ``lost_count`` messages the bus reported lost,
    whose ids nobody knows). ``message_rows`` is ``spark.routes.messages(records)``, given
    when the caller has it already."""
    verdict = F.create_map(*[F.lit(x) for kv in DECISION_VERDICTS.items() for x in kv])
    m = messages(records) if message_rows is None else message_rows
    parts = F.col("parts")
    fields = ["ts", "event", "gw", "dest", "client", "msg_id", "reason", "count", "lost"]
    # Each decision record with its message's entry on the same gateway and destination (a
    # null dest matches none) and its origin, from the message's row: no join.
    decision_records = F.flatten(F.transform(parts, lambda p: F.transform(
        p["decisions"], lambda d: F.struct(*[(p if c in ("gw", "dest") else d)[c].alias(c)
                                             for c in fields]))))
    ens = F.transform(message_entries(parts), lambda p: F.struct(
        p["gw"].alias("gw"), p["dest"].alias("dest"), p["e"].alias("e")))
    entry = F.array_min(F.filter("ens", lambda e: F.coalesce(
        (e["gw"] == F.col("d.gw")) & (e["dest"] == F.col("d.dest")), F.lit(False))))
    traced = (m.select("trace_id", message_origin(parts).alias("o"), ens.alias("ens"),
                       F.explode(decision_records).alias("d"))
              .select("trace_id", "o", entry.alias("en"), *[f"d.{c}" for c in fields]))
    untraced = (records.where(F.col("event").isin(list(DECISION_EVENTS))
                              & F.col("trace_id").isNull())
                .select("trace_id", F.lit(None).alias("o"), F.lit(None).alias("en"), *fields))
    return (traced.unionByName(untraced)
            .select(verdict[F.col("event")].alias("verdict"), "trace_id",
                    F.coalesce("msg_id", "en.e.msg_id").alias("msg_id"), "gw", "dest",
                    F.col("en.e.event").alias("entry_event"),
                    F.col("en.e.client").alias("entry_client"),
                    F.col("en.e.ts").alias("entry_ts"),
                    F.col("event").alias("exit"), F.col("client").alias("exit_client"),
                    F.col("ts").alias("exit_ts"),
                    F.col("o.gw").alias("origin_gw"), F.col("o.ts").alias("origin_ts"),
                    F.col("o.client").alias("origin_client"),
                    (F.col("ts") - F.col("en.e.ts")).alias("latency_ms"),
                    "reason", F.col("count").alias("delivery_count"),
                    F.col("lost").alias("lost_count")))


def reordered(route_rows: DataFrame, skew_ms: float = 0.0,
              sender_spans_gateways: bool = False) -> DataFrame:
    """A ``reordered`` row per message that left a route before a message its sender sent
    earlier to the same destination and that left by the same route: JMS 1.1 §4.4.10,
    messages a session sends to a destination are received in the order sent.

    The sender is the message's origin (``origin_client``: the producer's connection, or
    the transport it first came in through) on its origin gateway; send order is
    ``origin_ts`` there and leaving order is ``exit_ts`` on the route's gateway, each on
    one clock, so a steady skew between the two gateways cannot look like reordering. With
    ``sender_spans_gateways`` a client id names one sender whichever gateway it published
    through (an MQTT client id, one session across a cluster): two of its sends entered on
    different clocks, then, and sends less than ``skew_ms`` apart have no known order and
    are never called reordered. Sends at the same instant have no order either.

    A message that reached a consumer only as a redelivery (flagged JMSRedelivered, never
    delivered to that consumer first hand: it went to another consumer of a queue first,
    one that closed or rolled back, or whose gateway node died) witnesses no order: it
    comes back after the messages that went on meanwhile by its nature (JMS 1.1 §4.4.10.2,
    "Order of Message Sends": messages a consumer held may be redelivered out of order
    when there are several consumers). So the later ones that left before it are not called
    reordered."""
    _check_skew(skew_ms)
    sender = ["origin_client"] if sender_spans_gateways else ["origin_gw", "origin_client"]
    margin_us = round(skew_ms * 1000) if sender_spans_gateways else 0
    sent_us = F.round(F.col("origin_ts") * 1000).cast("long")  # ts has µs at most
    earlier = (Window.partitionBy(*sender, "gw", "dest", "exit", "exit_client")
               .orderBy(sent_us).rangeBetween(Window.unboundedPreceding, -(margin_us + 1)))
    first_hand = (F.col("exit") != F.lit(DELIVER)) | (F.col("deliver_count") > 0)
    return (route_rows
            .where(F.col("exit").isNotNull() & F.col("origin_ts").isNotNull())
            # only what the verdict row has, and whether the exit was first hand, goes
            # through the window
            .select(*_route_columns(), first_hand.alias("first_hand"))
            .withColumn("earlier_exit_ts",
                        F.max(F.when(F.col("first_hand"), F.col("exit_ts"))).over(earlier))
            .where(F.col("exit_ts") < F.col("earlier_exit_ts"))
            .select(F.lit(REORDERED).alias("verdict"), *_route_columns()))


def duplicated(route_rows: DataFrame) -> DataFrame:
    """A ``duplicated`` row per route that more than one copy of a message left by: the same
    trace id delivered more than once to the same consumer, or exported more than once through
    the same transport, from the same gateway and destination. ``copies`` counts them;
    ``flagged`` says whether the gateway marked every copy after the first as a redelivery
    (JMSRedelivered, JMS 1.1 §3.4.7: a client may see a message again only so marked,
    §4.4.12). An export carries no such mark, so a duplicate export is never flagged.

    ``copies_dropped``: of a duplicate export, how many copies a gateway the transport leads
    to (``transport_leads``) dropped as duplicates (its ``drop`` records with reason
    ``duplicate``: the import side's duplicate window, keyed on the trace id), so the copies
    that went on are ``copies - 1 - copies_dropped``; 0 for a delivery (the consumer got
    every copy) and for an export through a transport that leads to no gateway read."""
    return _each(_with_leads(route_rows), [_duplicated()])


def _duplicated() -> Column:
    flagged = (F.col("exit") == F.lit(DELIVER)) & (F.col("deliver_count") <= 1)
    dropped = F.size(F.filter("dup_drop_gws", lambda g: F.array_contains("leads_to", g)))
    exported = (F.col("exit") == F.lit(EXPORT)) & F.col("leads_to").isNotNull()
    return _verdict(F.col("exit_count") > 1, F.lit(DUPLICATED),
                    copies=F.col("exit_count"), flagged=flagged,
                    copies_dropped=F.when(exported, dropped).otherwise(F.lit(0)))


def lost(records: DataFrame, route_rows: DataFrame, grace_ms: float) -> DataFrame:
    """A ``lost`` row per entry (trace_id, gw, dest) nothing left from and that the gateway
    did not let go on purpose, when the entry is at or before the watermark; a ``pending``
    row when it is after it (the grace period has not passed yet)."""
    return _each(_with_watermark(route_rows, records, grace_ms), [_lost()])


def _lost() -> Column:
    verdict = (F.when(F.col("entry_ts") <= F.col("watermark"), F.lit(LOST))
               .otherwise(F.lit(PENDING)))
    return _verdict(F.col("exit").isNull() & ~F.col("entry_decided"), verdict,
                    watermark=F.col("watermark"))


def lost_in_transit(records: DataFrame, route_rows: DataFrame, grace_ms: float) -> DataFrame:
    """A ``lost_in_transit`` row per export through a transport that leads to another
    gateway whose log was read, when no gateway at the far end imported the message and the
    export is at or before the watermark; ``pending`` when it is after it.

    Which gateways a transport leads to is learnt from the logs themselves: transport T of
    gateway G leads to gateway H when some message exported through T was imported at H (the
    trace id is the same on both sides; the transport names on the two sides need not be).
    An export through a transport that leads to no gateway read (a cloud broker, a bus with
    no gateway listening) gets no verdict here: nothing could have written the import."""
    return _each(_with_watermark(_with_leads(route_rows), records, grace_ms), [_in_transit()])


def _in_transit() -> Column:
    # One is missing when none of the gateways its transport leads to imported its trace id.
    missing = ~F.exists("leads_to", lambda g: F.array_contains("import_gws", g))
    verdict = (F.when(F.col("exit_ts") <= F.col("watermark"), F.lit(LOST_IN_TRANSIT))
               .otherwise(F.lit(PENDING)))
    return _verdict((F.col("exit") == F.lit(EXPORT)) & F.col("leads_to").isNotNull() & missing,
                    verdict, watermark=F.col("watermark"))


def transport_leads(exported: DataFrame) -> DataFrame:
    """(``gw``, ``exit_client``, ``leads_to``): the gateways transport ``exit_client`` of
    gateway ``gw`` leads to, learnt from the messages exported there and imported there
    (``exported``: export route rows, with ``import_gws``). A handful of rows."""
    return (exported
            .select("gw", "exit_client",
                    F.explode(F.filter("import_gws", lambda g: g != F.col("gw")))
                    .alias("import_gw"))
            .groupBy("gw", "exit_client").agg(F.collect_set("import_gw").alias("leads_to")))


def verdicts(records: DataFrame, grace_ms: float, skew_ms: float = 0.0,
             sender_spans_gateways: bool = False,
             route_rows: DataFrame | None = None,
             message_rows: DataFrame | None = None) -> DataFrame:
    """Every verdict above for the records of one or many gateways, in one DataFrame with
    ``VERDICT_COLUMNS`` (a column a verdict does not set is null). ``route_rows`` is
    ``routes(records)`` and ``message_rows`` ``messages(records)``, given when the caller
    has them already (cached: the verdicts read them more than once).

    The verdicts of a route row (delivered, duplicated, changed, lost, lost in transit) are
    made in one pass over the route rows, each row giving an array of them; the decisions
    come from the message rows, and ``reordered`` compares routes of different messages (a
    window over the route rows)."""
    if message_rows is None and route_rows is None:
        message_rows = messages(records)
    if route_rows is None:
        route_rows = routes(records, message_rows)
    rows = _with_watermark(_with_leads(route_rows), records, grace_ms)
    out = _each(rows, [_delivered(grace_ms, skew_ms), _duplicated(), _changed(), _lost(),
                       _in_transit()])
    for part in (decided(records, message_rows),
                 reordered(route_rows, skew_ms, sender_spans_gateways)):
        out = out.unionByName(part, allowMissingColumns=True)
    return out.select(*VERDICT_COLUMNS)


def _with_leads(route_rows: DataFrame) -> DataFrame:
    """The route rows with ``leads_to``: the gateways an export's transport leads to (null
    for a delivery and for a transport that leads to no gateway read)."""
    leads = transport_leads(route_rows.where(F.col("exit") == F.lit(EXPORT)))
    return route_rows.join(F.broadcast(leads), on=["gw", "exit_client"], how="left")


def _with_watermark(rows: DataFrame, records: DataFrame, grace_ms: float) -> DataFrame:
    """``rows`` with the ``watermark`` of ``records``."""
    return rows.crossJoin(F.broadcast(watermark(records, grace_ms)))


def _each(rows: DataFrame, candidates: list[Column]) -> DataFrame:
    """The verdict rows (``VERDICT_COLUMNS``) that ``candidates`` (``_verdict`` structs, null
    where a row gets no such verdict) make of each of ``rows``."""
    made = F.filter(F.array(*candidates), lambda v: v.isNotNull())
    return rows.select(F.explode(made).alias("v")).select("v.*")


def _verdict(when: Column, verdict: Column, **given: Column) -> Column:
    """A verdict row of a route row, when ``when``: a struct of ``VERDICT_COLUMNS``, the
    route's own columns (``_route_columns``), those ``given``, null for the rest."""
    assert set(given) <= set(VERDICT_COLUMNS)
    route = set(_route_columns())
    fields = []
    for c in VERDICT_COLUMNS:
        value = (verdict if c == "verdict" else given[c] if c in given
                 else F.col(c) if c in route else F.lit(None))
        fields.append(value.cast(_VERDICT_TYPES.get(c, "string")).alias(c))
    return F.when(when, F.struct(*fields))


# The type of each verdict column that is not a string.
_VERDICT_TYPES = {
    **dict.fromkeys(["entry_ts", "exit_ts", "latency_ms", "e2e_latency_ms", "origin_ts",
                     "watermark"], "double"),
    **dict.fromkeys(["late", "flagged", "changed"], "boolean"),
    **dict.fromkeys(["copies", "copies_dropped", "delivery_count", "lost_count"], "long"),
}

def _route_columns() -> list[str]:
    return ["trace_id", "msg_id", "gw", "dest", "entry_event", "entry_client", "entry_ts",
            "exit", "exit_client", "exit_ts", "origin_gw", "origin_ts", "origin_client"]


def _hashes_known() -> Column:
    """Whether the route's entry and every copy that left are of a version with hashes."""
    return ((F.col("entry_v") >= 2)
            & F.forall(F.col("exit_contents"), lambda c: c["v"] >= 2))


def _differs(c: Column) -> Column:
    """Whether an exit's content (an ``exit_contents`` element) differs from the entry's
    (two null hashes are equal: no body, or no properties, on both sides)."""
    return (~c["body_hash"].eqNullSafe(F.col("entry_body_hash"))
            | ~c["props_hash"].eqNullSafe(F.col("entry_props_hash")))


def _check_skew(skew_ms: float) -> None:
    if skew_ms < 0:
        raise ValueError("the clock-skew tolerance cannot be negative")
