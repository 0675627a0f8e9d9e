"""Hand-made delivery-log records for the Spark tests: as dicts, as files, as DataFrames."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from spark.schema import DLOG_SCHEMA


def rec(ts: float, gw: str, event: str, trace_id: str | None, dest: str = "topic:t",
        client: str | None = None, count: int = 0, reason: str | None = None,
        msg_id: str | None = None) -> dict[str, Any]:
    """One version 1 delivery-log record, every key present (docs/delivery-log.md)."""
    return {"v": 1, "ts": ts, "gw": gw, "event": event, "trace_id": trace_id,
            "msg_id": msg_id if msg_id is not None else (trace_id and f"ID:{gw}.{trace_id}"),
            "dest": dest, "client": client, "count": count, "mode": "PERSISTENT",
            "size": 100, "reason": reason}


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
