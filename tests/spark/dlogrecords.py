"""Hand-made delivery-log records for the Spark tests: as dicts, as files, as DataFrames."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from spark.schema import DLOG_SCHEMA, FIELDS_BY_VERSION

V2_KEYS = [name for name, _ in FIELDS_BY_VERSION[2]]


def rec(ts: float, gw: str, event: str, trace_id: str | None, dest: str = "topic:t",
        client: str | None = None, count: int = 0, reason: str | None = None,
        msg_id: str | None = None, **v2: Any) -> dict[str, Any]:
    """One delivery-log record, every key present (docs/delivery-log.md): version 1, or
    version 2 when any of version 2's keys is given (``body_hash``, ``props_hash``,
    ``rules``, ``far_id``, ``far_dest``, ``lost``; the others are then null)."""
    r = {"v": 1, "ts": ts, "gw": gw, "event": event, "trace_id": trace_id,
         "msg_id": msg_id if msg_id is not None else (trace_id and f"ID:{gw}.{trace_id}"),
         "dest": dest, "client": client, "count": count, "mode": "PERSISTENT",
         "size": 100, "reason": reason}
    if v2:
        unknown = set(v2) - set(V2_KEYS)
        if unknown:
            raise TypeError(f"not a version 2 key: {sorted(unknown)}")
        r["v"] = 2
        r.update({k: v2.get(k) for k in V2_KEYS})
    return r


def write_log(path: Path, records: list[dict[str, Any]], tail: str = "") -> Path:
    """A delivery-log file as the gateway writes it: one JSON object a line; ``tail`` is
    appended as is (a line cut short by a crash)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
                    + tail)
    return path


def frame(spark: SparkSession, records: list[dict[str, Any]]) -> DataFrame:
    """The records as a DataFrame with the reader's schema (no file in between)."""
    names = DLOG_SCHEMA.fieldNames()
    return spark.createDataFrame([tuple(r.get(n) for n in names) for r in records],
                                 DLOG_SCHEMA)
