"""The Spark schema of the delivery log (docs/delivery-log.md, "Fields").

Each schema version lists only the keys it adds, in ``FIELDS_BY_VERSION``; ``DLOG_SCHEMA`` is
the union of every version's keys in order, and the reader reads every file with it. A key
unknown to an older record's version is simply absent from its line, so Spark's JSON reader
gives it null: a version 1 record read with a later schema has nulls in the later columns,
and the transforms treat those as "not known" (never as a value): a version 1 record has no
hashes, so whether its message changed is unknown, not "unchanged".

Events and their groups are named here too, so the transforms never spell event names.
"""

from __future__ import annotations

from pyspark.sql.types import (
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

# Version 1: every key of docs/delivery-log.md, "Fields", with the Spark type given there.
_V1: tuple[tuple[str, DataType], ...] = (
    ("v", IntegerType()),
    ("ts", DoubleType()),  # epoch milliseconds, up to 3 decimals
    ("gw", StringType()),
    ("event", StringType()),
    ("trace_id", StringType()),
    ("msg_id", StringType()),
    ("dest", StringType()),
    ("client", StringType()),
    ("count", LongType()),
    ("mode", StringType()),
    ("size", LongType()),
    ("reason", StringType()),
)

# Version 2 adds, after version 1's keys: the hashes of the message's body and properties
# (BLAKE2b, 8-byte digest, 16 hex digits; docs/delivery-log.md, "Hashes"), the mapping rules
# that ran on an export, the far side's id and name of the message and destination on an
# import or export, and the count of messages a bus DATALOSS advisory reported lost.
_V2: tuple[tuple[str, DataType], ...] = (
    ("body_hash", StringType()),
    ("props_hash", StringType()),
    ("rules", StringType()),
    ("far_id", StringType()),
    ("far_dest", StringType()),
    ("lost", LongType()),
)

# The keys each version adds after the previous version's (a version keeps every older key:
# docs/delivery-log.md, "Versioning").
FIELDS_BY_VERSION: dict[int, tuple[tuple[str, DataType], ...]] = {
    1: _V1,
    2: _V2,
}

SUPPORTED_VERSIONS: tuple[int, ...] = tuple(sorted(FIELDS_BY_VERSION))


def schema_for(version: int) -> StructType:
    """The schema of a record of ``version``: its keys and every older version's, in order."""
    if version not in FIELDS_BY_VERSION:
        raise ValueError(f"delivery log version {version} is not known to this reader")
    fields = [StructField(name, kind, nullable=True)
              for v in SUPPORTED_VERSIONS if v <= version
              for name, kind in FIELDS_BY_VERSION[v]]
    return StructType(fields)


# What the reader reads every file with: the newest version's schema (older records get nulls
# for the keys added after their version).
DLOG_SCHEMA: StructType = schema_for(SUPPORTED_VERSIONS[-1])

# Event names (docs/delivery-log.md, "Events").
PUBLISH = "publish"
IMPORT = "import"
DELIVER = "deliver"
REDELIVER = "redeliver"
EXPORT = "export"
ACK = "ack"
EXPIRE = "expire"
DROP = "drop"
DISCARD = "discard"
UNDELIVERABLE = "undeliverable"
REJECT = "reject"

# The reason a transport logs when its duplicate window drops an import (docs/delivery-log.md).
DUPLICATE_REASON = "duplicate"

# A message enters a gateway (a local producer's publish, or an import through a transport) ...
ENTRY_EVENTS: tuple[str, ...] = (PUBLISH, IMPORT)
# ... and leaves it to a consumer (deliver, or redeliver when JMSRedelivered is set) or to
# another system through a transport (export).
EXIT_EVENTS: tuple[str, ...] = (DELIVER, REDELIVER, EXPORT)
# The gateway decided the message's end on purpose and wrote why (the reason column): such a
# message is never counted as lost.
DECISION_EVENTS: tuple[str, ...] = (EXPIRE, DROP, DISCARD, UNDELIVERABLE)
