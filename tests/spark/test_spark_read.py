"""Reading delivery logs: many directories, the explicit schema, what the reader leaves out."""

from __future__ import annotations

import json
import re
from itertools import pairwise
from pathlib import Path

import pytest
from chispa import assert_df_equality
from dlogrecords import frame, rec, write_log
from pyspark.sql import SparkSession

from spark.read import between, read_dlog
from spark.schema import DLOG_SCHEMA, SUPPORTED_VERSIONS, schema_for

pytestmark = pytest.mark.spark


def documented_fields(doc: str) -> tuple[int, list[tuple[str, str]]]:
    """The version a delivery-log document describes (its title, "The delivery log (schema
    version N)") and its "Fields" table as (key, Spark type) pairs."""
    title = re.search(r"^# The delivery log \(schema version (\d+)\)$", doc, re.MULTILINE)
    assert title, "docs/delivery-log.md names no schema version in its title"
    rows = [line.split("|") for line in doc.splitlines() if line.startswith("| `")]
    # The "Fields" table: | `key` | JSON type | Spark type | meaning |
    fields = [(r[1].strip().strip("`"), r[3].strip().strip("`")) for r in rows
              if len(r) == 6 and r[3].strip().startswith("`")]
    assert fields, "no field table found in docs/delivery-log.md"
    return int(title.group(1)), fields


def test_the_schema_has_every_field_of_the_document_with_its_spark_type():
    # The document describes one version (its title says which): the schema of that version
    # has exactly the keys of its table, in order, with their Spark types. The reader may
    # know a newer version than the document in this tree, never an older one.
    doc = (Path(__file__).resolve().parents[2] / "docs" / "delivery-log.md").read_text()
    version, documented = documented_fields(doc)
    assert version in SUPPORTED_VERSIONS
    spark_names = {"INT": "int", "DOUBLE": "double", "STRING": "string", "LONG": "bigint"}
    ours = [(f.name, f.dataType.simpleString()) for f in schema_for(version).fields]
    assert ours == [(k, spark_names.get(t, t)) for k, t in documented]


def test_each_version_schema_is_the_start_of_the_next():
    assert DLOG_SCHEMA == schema_for(SUPPORTED_VERSIONS[-1])
    # An older version's schema is the start of a newer one's: its records read with the
    # newer schema lose nothing.
    for older, newer in pairwise(SUPPORTED_VERSIONS):
        assert schema_for(newer).fields[:len(schema_for(older).fields)] == \
            schema_for(older).fields
    assert len(schema_for(2).fields) == len(schema_for(1).fields) + 6
    with pytest.raises(ValueError, match="not known"):
        schema_for(SUPPORTED_VERSIONS[-1] + 1)


def test_many_directories_nested_days_cut_lines_unknown_versions_and_keys(
        spark: SparkSession, tmp_path: Path):
    a = rec(1000.0, "gw-a", "publish", "t1", client="mqtt:p")
    b = rec(1001.5, "gw-b", "import", "t1", client="from-a")
    c = rec(1002.0, "gw-b", "deliver", "t1", client="stomp:s", count=1)
    unknown_key = dict(rec(1003.0, "gw-a", "ack", "t1", client="amqp:c", count=1), extra="x")
    future = dict(rec(1004.0, "gw-a", "publish", "t2"), v=99)
    write_log(tmp_path / "a" / "dlog-gw-a-20260514T093012-0001.jsonl", [a, unknown_key],
              tail='{"v":1,"ts":1005.0,"gw":"gw-a","event":"pub')  # cut short by a crash
    write_log(tmp_path / "a" / "dlog-gw-a-20260514T093013-0002.jsonl", [future])
    write_log(tmp_path / "b" / "2026-05-14" / "dlog-gw-b-20260514T000000-0001.jsonl", [b])
    write_log(tmp_path / "b" / "2026-05-15" / "dlog-gw-b-20260515T000000-0001.jsonl", [c])
    # Not a delivery-log file by its name: never read.
    (tmp_path / "a" / "notes.json").write_text(json.dumps(rec(9.0, "x", "publish", "z")) + "\n")

    df = read_dlog(spark, [str(tmp_path / "a"), str(tmp_path / "b")])

    assert df.schema == DLOG_SCHEMA
    unknown_key.pop("extra")
    assert_df_equality(df, frame(spark, [a, b, c, unknown_key]), ignore_row_order=True)


def test_a_v1_record_read_with_the_v2_schema_has_nulls_in_the_v2_columns(
        spark: SparkSession, tmp_path: Path):
    r1 = rec(1000.0, "gw-a", "publish", "t1", client="mqtt:p")
    r2 = rec(1001.0, "gw-a", "export", "t1", client="to-b", body_hash="56dc6a7c472f5a8f",
             props_hash="1f7a181c96fc7cc3", rules="r1,r2", far_id="ID:1", far_dest="a/b")
    write_log(tmp_path / "dlog-gw-a-20260514T093012-0001.jsonl", [r1])
    write_log(tmp_path / "dlog-gw-a-20260514T093013-0002.jsonl", [r2])

    df = read_dlog(spark, [str(tmp_path)]).orderBy("ts")

    assert df.schema == DLOG_SCHEMA
    got = [row.asDict() for row in df.collect()]
    assert "body_hash" not in r1 and r2["v"] == 2
    added = [f.name for f in DLOG_SCHEMA.fields[len(schema_for(1).fields):]]
    assert got[0] == {**r1, **dict.fromkeys(added)}
    assert got[1] == {**r2, "lost": None}


def test_between_keeps_since_inclusive_until_exclusive(spark: SparkSession):
    records = [rec(float(ts), "gw-a", "publish", f"t{ts}") for ts in (10, 20, 30, 40)]
    df = frame(spark, records)

    assert_df_equality(between(df, since_ms=20, until_ms=40),
                       frame(spark, records[1:3]), ignore_row_order=True)
    assert_df_equality(between(df, since_ms=30), frame(spark, records[2:]),
                       ignore_row_order=True)
    assert_df_equality(between(df, until_ms=20), frame(spark, records[:1]),
                       ignore_row_order=True)
    assert between(df).count() == 4


def test_no_path_is_an_error(spark: SparkSession):
    with pytest.raises(ValueError, match="no delivery log path"):
        read_dlog(spark, [])
