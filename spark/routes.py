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
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark.schema import (
    DECISION_EVENTS,
    DELIVER,
    ENTRY_EVENTS,
    EXIT_EVENTS,
    EXPORT,
    IMPORT,
    REDELIVER,
)

ENTRY_KEY = ["trace_id", "gw", "dest"]
ROUTE_KEY = [*ENTRY_KEY, "exit", "exit_client"]


def entries(records: DataFrame) -> DataFrame:
    """One row per (trace_id, gw, dest) where the message entered a gateway: the first
    entry's ``entry_event``, ``entry_client``, ``entry_ts``, ``msg_id``, its version and
    hashes (``entry_v``, ``entry_body_hash``, ``entry_props_hash``: the message as the core
    holds it), and how many entry records there were (``entry_count``; more than one is the
    same message entering twice)."""
    first = F.min(F.struct("ts", "event", "client", "msg_id", "v", "body_hash", "props_hash"))
    return (records
            .where(F.col("event").isin(list(ENTRY_EVENTS)) & F.col("trace_id").isNotNull())
            .groupBy(*ENTRY_KEY)
            .agg(first.alias("e"), F.count(F.lit(1)).alias("entry_count"))
            .select(*ENTRY_KEY,
                    F.col("e.event").alias("entry_event"),
                    F.col("e.client").alias("entry_client"),
                    F.col("e.ts").alias("entry_ts"),
                    F.col("e.msg_id").alias("msg_id"),
                    F.col("e.v").alias("entry_v"),
                    F.col("e.body_hash").alias("entry_body_hash"),
                    F.col("e.props_hash").alias("entry_props_hash"),
                    "entry_count"))


def origins(records: DataFrame) -> DataFrame:
    """One row per trace_id: where, when and from whom it entered the gateways first hand
    (``origin_gw``, ``origin_ts``, ``origin_client``: the producer's connection, or the
    transport it came in through from a system with no gateway read). An ``import`` of a
    message another gateway read had exported is a relay, never its origin, whatever the
    clocks say: the far gateway's clock may be behind and its import look earlier than the
    publish. Only when every entry is a relay (a loop) is the earliest one taken."""
    exported_at = (records
                   .where((F.col("event") == F.lit(EXPORT)) & F.col("trace_id").isNotNull())
                   .groupBy("trace_id").agg(F.collect_set("gw").alias("export_gws")))
    relayed = ((F.col("event") == F.lit(IMPORT))
               & F.coalesce(F.exists("export_gws", lambda g: g != F.col("gw")), F.lit(False)))
    first = F.min(F.struct(relayed.alias("relayed"), "ts", "gw", "client"))
    return (records
            .where(F.col("event").isin(list(ENTRY_EVENTS)) & F.col("trace_id").isNotNull())
            .join(exported_at, on="trace_id", how="left")
            .groupBy("trace_id")
            .agg(first.alias("o"))
            .select("trace_id", F.col("o.gw").alias("origin_gw"),
                    F.col("o.ts").alias("origin_ts"),
                    F.col("o.client").alias("origin_client")))


def exits(records: DataFrame) -> DataFrame:
    """One row per route's exit, (trace_id, gw, dest, exit, exit_client): the first time it
    left (``exit_ts``), how many copies left (``exit_count``), and of those how many were
    first deliveries (``deliver_count``) and flagged redeliveries (``redeliver_count``);
    ``exit_contents``, the distinct (v, body_hash, props_hash, rules) the copies left with
    (the core never changes a message it holds, so normally one)."""
    ev = F.col("event")
    # A transport's export is a consumer of the gateway too: its ``deliver`` (the hand-off to
    # the transport, written before the far side confirmed anything) is no way out, its
    # ``export`` is. Its connection is the client of that gateway's import and export records.
    transports = (records.where(ev.isin(IMPORT, EXPORT)).select("gw", "client").distinct()
                  .withColumn("to_transport", F.lit(True)))
    return (records
            .where(ev.isin(list(EXIT_EVENTS)) & F.col("trace_id").isNotNull())
            .join(F.broadcast(transports), on=["gw", "client"], how="left")
            .where((ev == EXPORT) | F.col("to_transport").isNull())
            .drop("to_transport")
            .withColumn("exit", F.when(ev == EXPORT, F.lit(EXPORT)).otherwise(F.lit(DELIVER)))
            .withColumnRenamed("client", "exit_client")
            .groupBy(*ROUTE_KEY)
            .agg(F.min("ts").alias("exit_ts"),
                 F.count(F.lit(1)).alias("exit_count"),
                 F.sum((ev == DELIVER).cast("long")).alias("deliver_count"),
                 F.sum((ev == REDELIVER).cast("long")).alias("redeliver_count"),
                 F.collect_set(F.struct("v", "body_hash", "props_hash", "rules"))
                 .alias("exit_contents")))


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


def routes(records: DataFrame) -> DataFrame:
    """Every entry with each of its exits: one row per route, and one row with null exit
    columns for an entry nothing left from. Exits with no entry on their gateway and
    destination (the entry's record is outside the logs read) are not routes."""
    return (entries(records)
            .join(exits(records), on=ENTRY_KEY, how="left")
            .join(origins(records), on="trace_id", how="left"))
