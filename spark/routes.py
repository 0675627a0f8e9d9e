"""Matching: the records of one message, joined by ``trace_id``, into routes.

A *route* is one way a message left a gateway: it entered gateway G on destination D (a local
producer's ``publish``, or an ``import`` through a transport) and left G to one consumer
(``deliver``, or ``redeliver`` when JMSRedelivered is set) or to one transport (``export``).
So a route is keyed by (trace_id, gw, dest, exit, exit_client), where ``exit`` is
``deliver`` or ``export``. A message that crosses gateways has a route at each: published at
gw-a and exported through transport ``to-b`` (route 1), imported at gw-b and delivered to a
consumer there (route 2); both share the trace id, which survives every hop. Its *origin* is where it entered first
hand (its publish), not the earliest entry by the clocks, which differ between gateways.

The entry is matched on the same gateway and destination as the exit: one message published to
several destinations has one ``publish`` per destination (docs/delivery-log.md, "Events"),
and the time of the entry on another gateway is another clock. ``origin_ts`` (the earliest
entry of the trace on any gateway) gives the end-to-end view, across clocks.

Records without a trace id (none is written for a send the gateway refused) cannot be matched
and are left out here.

How: ``messages`` shuffles the records once, by trace id, and aggregates them where they are,
first per (gw, dest, exit, exit_client) with plain aggregate functions, then into one row per
message. Entries, exits, origins and decisions are then read from that row with array
functions (``message_*``), so the routes and every verdict derive from one table without a
join or another pass over the records.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark.schema import (
    DECISION_EVENTS,
    DELIVER,
    DROP,
    DUPLICATE_REASON,
    ENTRY_EVENTS,
    EXIT_EVENTS,
    EXPORT,
    IMPORT,
    PUBLISH,
    REDELIVER,
)

ENTRY_KEY = ["trace_id", "gw", "dest"]
ROUTE_KEY = [*ENTRY_KEY, "exit", "exit_client"]


def messages(records: DataFrame) -> DataFrame:
    """One row per trace id with ``parts``: its records aggregated per (gw, dest, exit,
    exit_client), ``exit`` and ``exit_client`` null for an entry or a decision. The one
    shuffle of the records that routes and verdicts need (by trace id; both aggregations
    then run where the records are): all they derive from a message (its entries, exits,
    decisions, origin, the gateways that imported it) comes from its row alone.

    A part has: ``e``, the first entry record (ts, event, client, msg_id, v, body_hash,
    props_hash), ``entry_count``, ``first_publish`` and ``first_import`` (ts, client);
    ``exit_ts``, ``exit_count``, ``deliver_count``, ``redeliver_count``,
    ``exit_contents`` (the distinct v, body_hash, props_hash, rules); ``decided`` (a
    decision on that gateway and a destination) and ``decisions`` (those records). Records
    without a trace id, and those of no entry, exit or decision event, are left out."""
    ev = F.col("event")
    # A transport's export is a consumer of the gateway too. The gateway writes no record of
    # the hand-off to it, only the ``export``; logs written before it did so (version 1 and
    # early version 2) have a ``deliver`` of the hand-off, before the far side confirmed
    # anything, which is no way out. Its client was the transport's connection, then also
    # the client of that gateway's import and export records: a handful of (gw, client)
    # pairs, so broadcast (in later logs they are transport names, which no deliver has).
    transports = (records.where(ev.isin(IMPORT, EXPORT)).select("gw", "client").distinct()
                  .withColumn("to_transport", F.lit(True)))
    is_entry = ev.isin(list(ENTRY_EVENTS))
    is_exit = ev.isin(list(EXIT_EVENTS)) & ((ev == F.lit(EXPORT))
                                           | F.col("to_transport").isNull())
    is_decision = ev.isin(list(DECISION_EVENTS))
    exit_ = F.when(ev == F.lit(EXPORT), F.lit(EXPORT)).when(is_exit, F.lit(DELIVER))
    parts = (records
             .join(F.broadcast(transports), on=["gw", "client"], how="left")
             .where(F.col("trace_id").isNotNull() & (is_entry | is_exit | is_decision))
             .repartition("trace_id")
             .groupBy("trace_id", "gw", "dest", exit_.alias("exit"),
                      F.when(is_exit, F.col("client")).alias("exit_client"))
             .agg(F.min(F.when(is_entry, F.struct("ts", "event", "client", "msg_id", "v",
                                                  "body_hash", "props_hash"))).alias("e"),
                  F.count(F.when(is_entry, 1)).alias("entry_count"),
                  F.min(F.when(ev == F.lit(PUBLISH), F.struct("ts", "client")))
                  .alias("first_publish"),
                  F.min(F.when(ev == F.lit(IMPORT), F.struct("ts", "client")))
                  .alias("first_import"),
                  F.min(F.when(is_exit, F.col("ts"))).alias("exit_ts"),
                  F.count(F.when(is_exit, 1)).alias("exit_count"),
                  F.count(F.when(ev == F.lit(DELIVER), 1)).alias("deliver_count"),
                  F.count(F.when(ev == F.lit(REDELIVER), 1)).alias("redeliver_count"),
                  F.collect_set(F.when(is_exit, F.struct("v", "body_hash", "props_hash",
                                                         "rules"))).alias("exit_contents"),
                  # A join on (gw, dest) in the original sense: a null dest matches none.
                  F.max(is_decision & F.col("dest").isNotNull()).alias("decided"),
                  F.collect_list(F.when(is_decision, F.struct(
                      "ts", "event", "client", "msg_id", "reason", "count", "lost")))
                  .alias("decisions")))
    return (parts.groupBy("trace_id")
            .agg(F.collect_list(F.struct(*[c for c in parts.columns if c != "trace_id"]))
                 .alias("parts")))


def message_entries(parts: Column) -> Column:
    """The parts of a message's row that are entries (``entries``)."""
    return F.filter(parts, lambda p: p["e"].isNotNull())


def message_exits(parts: Column) -> Column:
    """The parts of a message's row that are exits (``exits``)."""
    return F.filter(parts, lambda p: p["exit"].isNotNull())


def message_origin(parts: Column) -> Column:
    """``origins`` of one message's row: the first entry by (relayed, ts, gw, client)."""
    exported_at = F.transform(F.filter(parts, lambda p: p["exit"] == F.lit(EXPORT)),
                              lambda p: p["gw"])
    published = F.transform(F.filter(parts, lambda p: p["first_publish"].isNotNull()),
                            lambda p: F.struct(F.lit(False).alias("relayed"),
                                               p["first_publish"]["ts"].alias("ts"),
                                               p["gw"].alias("gw"),
                                               p["first_publish"]["client"].alias("client")))
    imported = F.transform(F.filter(parts, lambda p: p["first_import"].isNotNull()),
                           lambda p: F.struct(
                               F.exists(exported_at, lambda g: g != p["gw"]).alias("relayed"),
                               p["first_import"]["ts"].alias("ts"), p["gw"].alias("gw"),
                               p["first_import"]["client"].alias("client")))
    return F.array_min(F.concat(published, imported))


def message_import_gws(parts: Column) -> Column:
    """The gateways that imported the message."""
    return F.array_distinct(F.transform(F.filter(parts, lambda p: p["first_import"].isNotNull()),
                                        lambda p: p["gw"]))


def message_dup_drop_gws(parts: Column) -> Column:
    """The gateway of each ``drop`` of the message with reason ``duplicate`` (a transport's
    duplicate window dropped a copy it imported), once per such record."""
    return F.flatten(F.transform(parts, lambda p: F.transform(
        F.filter(p["decisions"], lambda d: (d["event"] == F.lit(DROP))
                 & (d["reason"] == F.lit(DUPLICATE_REASON))),
        lambda d: p["gw"])))


def entries(records: DataFrame) -> DataFrame:
    """One row per (trace_id, gw, dest) where the message entered a gateway: the first
    entry's ``entry_event``, ``entry_client``, ``entry_ts``, ``msg_id``, its version and
    hashes (``entry_v``, ``entry_body_hash``, ``entry_props_hash``: the message as the core
    holds it), and how many entry records there were (``entry_count``; more than one is the
    same message entering twice)."""
    return (messages(records)
            .select("trace_id", F.explode(message_entries(F.col("parts"))).alias("en"))
            .select("trace_id", *_entry_columns()))


def origins(records: DataFrame) -> DataFrame:
    """One row per trace_id: where, when and from whom it entered the gateways first hand
    (``origin_gw``, ``origin_ts``, ``origin_client``: the producer's connection, or the
    transport it came in through from a system with no gateway read). An ``import`` of a
    message another gateway read had exported is a relay, never its origin, whatever the
    clocks say: the far gateway's clock may be behind and its import look earlier than the
    publish. Only when every entry is a relay (a loop) is the earliest one taken."""
    return (messages(records).select("trace_id", message_origin(F.col("parts")).alias("o"))
            .where(F.col("o").isNotNull())
            .select("trace_id", *_origin_columns()))


def exits(records: DataFrame) -> DataFrame:
    """One row per route's exit, (trace_id, gw, dest, exit, exit_client): the first time it
    left (``exit_ts``), how many copies left (``exit_count``), and of those how many were
    first deliveries (``deliver_count``) and flagged redeliveries (``redeliver_count``);
    ``exit_contents``, the distinct (v, body_hash, props_hash, rules) the copies left with
    (the core never changes a message it holds, so normally one)."""
    return (messages(records)
            .select("trace_id", F.explode(message_exits(F.col("parts"))).alias("x"))
            .select("trace_id", *[F.col(f"x.{c}").alias(c) for c in _EXIT_FIELDS]))


def decisions(records: DataFrame) -> DataFrame:
    """One row per (trace_id, gw, dest) for which the gateway wrote that it let the message
    go on purpose (expire, drop, discard, undeliverable): the first such ``decision`` and its
    ``decision_reason``."""
    first = F.min(F.struct("ts", "event", "reason"))
    return (records
            .where(F.col("event").isin(list(DECISION_EVENTS)) & F.col("trace_id").isNotNull())
            .groupBy(*ENTRY_KEY)
            .agg(first.alias("d"))
            .select(*ENTRY_KEY, F.col("d.event").alias("decision"),
                    F.col("d.reason").alias("decision_reason"),
                    F.col("d.ts").alias("decision_ts")))


def routes(records: DataFrame, message_rows: DataFrame | None = None) -> DataFrame:
    """Every entry with each of its exits: one row per route, and one row with null exit
    columns for an entry nothing left from. Exits with no entry on their gateway and
    destination (the entry's record is outside the logs read) are not routes. Each row has
    its message's origin, and what the verdicts on the route need of the rest of the
    message: ``entry_decided`` (the gateway wrote that it let the message go on purpose on
    the entry's gateway and destination), ``import_gws`` (the gateways that imported it)
    and ``dup_drop_gws`` (``message_dup_drop_gws``). For counting messages rather than
    routes, ``entry_first`` marks the first row of each entry and ``way_first`` the first
    row of each way out of it (its first delivery to any consumer, and every export: one
    per transport). ``message_rows`` is ``messages(records)``, given when the caller has it
    already."""
    m = messages(records) if message_rows is None else message_rows
    parts = F.col("parts")
    # The message's columns first, then one row per entry (computed once per message, not
    # once per entry).
    per_message = m.select("trace_id", message_origin(parts).alias("o"),
                           message_import_gws(parts).alias("import_gws"),
                           message_dup_drop_gws(parts).alias("dup_drop_gws"),
                           message_exits(parts).alias("xs"),
                           message_entries(parts).alias("ens"))
    # Every struct is taken apart into columns as soon as it is made: the optimizer's
    # pruning of nested fields through two generators loses fields otherwise.
    origin = per_message.select("trace_id", *_origin_columns(), *_MESSAGE_COLUMNS, "xs", "ens")
    entry = origin.select("*", F.explode("ens").alias("en")).select(
        "trace_id", *_entry_columns(), F.col("en.decided").alias("entry_decided"),
        *ORIGIN_COLUMNS, *_MESSAGE_COLUMNS, "xs")
    # A join on (gw, dest): a null dest matches nothing.
    same_entry: Callable[[Column], Column] = lambda x: F.coalesce(  # noqa: E731
        (x["gw"] == F.col("gw")) & (x["dest"] == F.col("dest")), F.lit(False))
    mine = entry.select("*", F.filter("xs", same_entry).alias("mine")).drop("xs")
    # For the summary, which counts messages, not routes: the entry's first route row, and
    # the first of its deliveries (to any consumer: one way out) and each export.
    first_deliver = F.array_position(F.transform("mine", lambda x: x["exit"]), F.lit(DELIVER))
    rows = mine.select("*", first_deliver.alias("first_deliver"),
                       F.posexplode_outer("mine").alias("pos", "x"))
    return rows.select("trace_id", *_ENTRY_COLUMNS,
                       *[F.col(f"x.{c}").alias(c) for c in _EXIT_FIELDS[2:]],
                       *ORIGIN_COLUMNS, "entry_decided", *_MESSAGE_COLUMNS,
                       F.coalesce(F.col("pos") == 0, F.lit(True)).alias("entry_first"),
                       ((F.col("x.exit") == F.lit(EXPORT))
                        | (F.col("pos") + 1 == F.col("first_deliver"))).alias("way_first"))


_MESSAGE_COLUMNS = ["import_gws", "dup_drop_gws"]


_EXIT_FIELDS = ["gw", "dest", "exit", "exit_client", "exit_ts", "exit_count", "deliver_count",
                "redeliver_count", "exit_contents"]


ORIGIN_COLUMNS = ["origin_gw", "origin_ts", "origin_client"]
_ENTRY_COLUMNS = ["gw", "dest", "entry_event", "entry_client", "entry_ts", "msg_id", "entry_v",
                  "entry_body_hash", "entry_props_hash", "entry_count"]


def _entry_columns() -> list[Column]:
    """The route row's entry columns from an ``_entries`` element ``en``."""
    return [F.col("en.gw").alias("gw"), F.col("en.dest").alias("dest"),
            F.col("en.e.event").alias("entry_event"), F.col("en.e.client").alias("entry_client"),
            F.col("en.e.ts").alias("entry_ts"), F.col("en.e.msg_id").alias("msg_id"),
            F.col("en.e.v").alias("entry_v"), F.col("en.e.body_hash").alias("entry_body_hash"),
            F.col("en.e.props_hash").alias("entry_props_hash"),
            F.col("en.entry_count").alias("entry_count")]


def _origin_columns() -> list[Column]:
    """The origin columns from an ``_origin`` value ``o``."""
    return [F.col("o.gw").alias("origin_gw"), F.col("o.ts").alias("origin_ts"),
            F.col("o.client").alias("origin_client")]
