"""External records: what a system the gateway does not see says it sent or received, read
as delivery-log records of a pseudo-gateway, so the verdicts reach past the gateways' logs.

A device fleet's export (what each device published), or a far application's (what it
received), is a CSV or JSON Lines file of that system's own making. A small YAML *mapping*
(``load_mapping``) says how its rows become records (docs/delivery-log.md, "Fields"): the
file's format, the name of the system (``gw``: a pseudo-gateway no gateway log names), the
event a row is, and for each record field the source column it comes from, a constant, or a
simple conversion (epoch milliseconds, epoch seconds or ISO 8601 to ``ts``; a template, a
prefix to strip, an MQTT topic to the gateway's subject for names; a body to its BLAKE2b
hash). ``read_external`` reads the file with Spark's own CSV or JSON reader and an explicit
schema of string columns (never an inferred one), and gives records with ``DLOG_SCHEMA``.

How the rows join the verdicts (``spark.verdicts``):

- A *receiver's* row (event ``deliver``: the far application got the message) becomes two
  records of the pseudo-gateway at the row's time: an ``import`` (the message entered that
  system) and a ``deliver`` to the row's client. The gateway's ``export`` then has an
  import on another gateway read, as a hop between two gateways has: joined by the trace
  id when the system carried it, else by the fallback key (``spark.link``: ``far_dest`` or
  ``dest``, ``body_hash`` and a time window). So an export through a transport that leads
  to that system and that it never received is ``lost_in_transit``, with no code of its own.
- A *sender's* row (event ``publish``: a device sent the message) is a ``publish`` on the
  pseudo-gateway. ``link_senders`` finds the gateway entry (``publish`` or ``import``) it
  became, by trace id or by the same fallback key, gives the gateway's trace id to the
  sender's record, and adds a ``deliver`` of the pseudo-gateway to that gateway (the exit
  client is the gateway's id: the gateway is the sender's consumer). A row no gateway got
  has no exit: the verdict is ``lost`` on the pseudo-gateway (``pending`` within the grace
  period), its ``entry_client`` the device. Not ``lost_in_transit``, nor an ``export`` as
  the exit: that verdict looks for an ``import`` at the far end of every export, and a
  device connected to the gateway's own MQTT listener is a ``publish`` there.

A row whose system did not carry the gateway's trace id gets a trace id of its own,
``ext:<gw>:<8 hex digits of the path>:<n>`` (unique within a read), so the fallback key can
link it; one it does not link keeps it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from spark.link import relink
from spark.schema import DELIVER, DLOG_SCHEMA, ENTRY_EVENTS, EXPORT, IMPORT, PUBLISH

FORMATS = ("csv", "jsonl")
EVENTS = (PUBLISH, DELIVER)  # what a row can be: a sender's send, a receiver's receipt
TS_FORMATS = ("epoch_ms", "epoch_s", "iso8601")
BODY_ENCODINGS = ("text", "base64", "hex")
STRING_FIELDS = ("trace_id", "msg_id", "dest", "client", "far_id", "far_dest")
PER_MESSAGE = ("trace_id", "msg_id", "far_id")  # a constant would make every row one message
REQUIRED_FIELDS = ("ts", "dest")
JSONL_SAMPLE_LINES = 1000  # the lines whose keys a JSON Lines file's columns are taken from
HASH_BYTES = 8  # docs/delivery-log.md, "Hashes": BLAKE2b with an 8-byte digest
SCHEMA_VERSION = 2  # the records carry version 2's fields (body_hash, far_dest, far_id)

_TOP_KEYS = {"format": True, "csv": False, "gw": True, "event": True, "fields": True}
_CSV_KEYS = ("header", "delimiter", "names")
_EVENT_KEYS = {"column": True, "values": True}
_TS_KEYS = {"column": True, "format": True}
_STRING_KEYS = ("column", "value", "strip_prefix", "mqtt_topic", "template")
_HASH_KEYS = ("column", "body", "encoding")
_FIELD_NAMES = ("ts", *STRING_FIELDS, "body_hash")


class MappingError(ValueError):
    """A mapping file that cannot be used: the message names the file, the key and (when
    known) the line."""


@dataclass(frozen=True)
class Field:
    """How one record field is made: from ``column`` (a source column) or ``value`` (a
    constant); ``ts_format`` for ts; for names ``strip_prefix``, ``mqtt_topic`` and
    ``template`` (applied in that order); for body_hash either ``column`` (a hex hash as
    given) or ``body`` (a body column hashed, read with ``encoding``)."""

    column: str | None = None
    value: str | None = None
    ts_format: str | None = None
    strip_prefix: str | None = None
    mqtt_topic: bool = False
    template: str | None = None
    body: str | None = None
    encoding: str = "text"


@dataclass(frozen=True)
class ExternalMapping:
    """A loaded mapping file (see ``load_mapping``)."""

    source: str  # the YAML file, for messages
    format: str
    gw: str
    fields: dict[str, Field]
    event: str | None = None  # every row is this event ...
    event_column: str | None = None  # ... or the event is this column's value, mapped
    event_values: dict[str, str] = field(default_factory=dict)
    header: bool = True
    delimiter: str = ","
    names: tuple[str, ...] | None = None  # a CSV file's columns when it has no header
    lines: dict[str, int] = field(default_factory=dict)  # key path -> YAML line (1-based)

    def columns(self) -> dict[str, str]:
        """Every source column the mapping reads, with the key that names it."""
        out: dict[str, str] = {}
        if self.event_column is not None:
            out.setdefault(self.event_column, "event.column")
        for name, f in self.fields.items():
            if f.column is not None:
                out.setdefault(f.column, f"fields.{name}.column")
            if f.body is not None:
                out.setdefault(f.body, f"fields.{name}.body")
        return out

    def error(self, key: str, message: str) -> MappingError:
        return _error(self.source, self.lines, key, message)


def load_mapping(yaml_path: str) -> ExternalMapping:
    """The mapping in ``yaml_path``, checked: an unknown key, a missing required key, a
    value of the wrong kind or a key given twice raises ``MappingError`` naming the file, the
    key and its line."""
    try:
        with open(yaml_path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise MappingError(f"{yaml_path}: cannot read the mapping: {e.strerror}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{yaml_path}:{mark.line + 1}" if mark is not None else yaml_path
        raise MappingError(f"{where}: not YAML: {getattr(e, 'problem', e)}") from None
    lines: dict[str, int] = {}
    if node is not None:
        _mark_lines(yaml_path, node, "", lines)
    return _parse(yaml_path, doc, lines)


def _mark_lines(source: str, node: yaml.Node, prefix: str, lines: dict[str, int]) -> None:
    """Each mapping key's dotted path -> the line it is on; a key given twice is an error
    (YAML 1.2 §3.2.1.1, keys are unique; pyyaml keeps the last one silently)."""
    if not isinstance(node, yaml.MappingNode):
        return
    for key_node, value_node in node.value:
        key = f"{prefix}{key_node.value}"
        if key in lines:
            raise MappingError(f"{source}:{key_node.start_mark.line + 1}: {key}: given twice "
                               f"(first on line {lines[key]})")
        lines[key] = key_node.start_mark.line + 1
        _mark_lines(source, value_node, key + ".", lines)


def _error(source: str, lines: Mapping[str, int], key: str, message: str) -> MappingError:
    line = lines.get(key)
    parent = key
    while line is None and "." in parent:  # a missing key: point at the section it belongs in
        parent = parent.rsplit(".", 1)[0]
        line = lines.get(parent)
    where = f"{source}:{line}" if line is not None else source
    return MappingError(f"{where}: {key}: {message}")


def _parse(source: str, doc: Any, lines: dict[str, int]) -> ExternalMapping:
    def fail(key: str, message: str) -> MappingError:
        return _error(source, lines, key, message)

    def keys(value: Any, key: str, known: Mapping[str, bool] | Iterable[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise fail(key, "must be a mapping of keys to values")
        required = known if isinstance(known, Mapping) else dict.fromkeys(known, False)
        for k in value:
            if k not in required:
                raise fail(f"{key}.{k}" if key else str(k),
                           f"unknown key (known: {', '.join(required)})")
        for k, needed in required.items():
            if needed and k not in value:
                raise fail(f"{key}.{k}" if key else k, "missing")
        return value

    def text(value: Any, key: str) -> str:
        if not isinstance(value, str) or not value:
            raise fail(key, "must be a non-empty string")
        return value

    def choice(value: Any, key: str, allowed: tuple[str, ...]) -> str:
        if value not in allowed:
            raise fail(key, f"must be one of {', '.join(allowed)}, not {value!r}")
        return str(value)

    if doc is None:
        doc = {}
    top = keys(doc, "", _TOP_KEYS)
    fmt = choice(top["format"], "format", FORMATS)
    gw = text(top["gw"], "gw")

    header, delimiter, names = True, ",", None
    if "csv" in top:
        if fmt != "csv":
            raise fail("csv", "only for format csv")
        csv = keys(top["csv"], "csv", _CSV_KEYS)
        header = csv.get("header", True)
        if not isinstance(header, bool):
            raise fail("csv.header", "must be true or false")
        delimiter = text(csv.get("delimiter", ","), "csv.delimiter")
        if len(delimiter) != 1:
            raise fail("csv.delimiter", "must be one character")
        if "names" in csv:
            raw = csv["names"]
            if header:
                raise fail("csv.names", "only when header is false (the header names them)")
            if not isinstance(raw, list) or not raw:
                raise fail("csv.names", "must be a list of the file's column names")
            names = tuple(text(n, "csv.names") for n in raw)
        elif not header:
            raise fail("csv.names", "missing: a file with no header needs its columns named")

    event, event_column, event_values = None, None, {}
    ev = top["event"]
    if isinstance(ev, dict):
        ev = keys(ev, "event", _EVENT_KEYS)
        event_column = text(ev["column"], "event.column")
        vals = ev["values"]
        if not isinstance(vals, dict) or not vals:
            raise fail("event.values", "must map the column's values to events")
        event_values = {str(k): choice(v, f"event.values.{k}", EVENTS) for k, v in vals.items()}
    else:
        event = choice(ev, "event", EVENTS)

    raw_fields = keys(top["fields"], "fields", dict.fromkeys(_FIELD_NAMES, False))
    fields: dict[str, Field] = {}
    for name in REQUIRED_FIELDS:
        if name not in raw_fields:
            raise fail(f"fields.{name}", "missing")
    for name, spec in raw_fields.items():
        key = f"fields.{name}"
        if isinstance(spec, str):
            spec = {"column": spec}
        if name == "ts":
            if not isinstance(spec, dict):
                raise fail(key, "must be a mapping with column and format")
            s = keys(spec, key, _TS_KEYS)
            fields[name] = Field(column=text(s["column"], f"{key}.column"),
                                 ts_format=choice(s["format"], f"{key}.format", TS_FORMATS))
        elif name == "body_hash":
            s = keys(spec, key, _HASH_KEYS)
            if ("column" in s) == ("body" in s):
                raise fail(key, "give either column (a hex hash) or body (a body column)")
            if "encoding" in s and "body" not in s:
                raise fail(f"{key}.encoding", "only with body")
            fields[name] = Field(
                column=text(s["column"], f"{key}.column") if "column" in s else None,
                body=text(s["body"], f"{key}.body") if "body" in s else None,
                encoding=choice(s.get("encoding", "text"), f"{key}.encoding",
                                BODY_ENCODINGS))
        else:
            s = keys(spec, key, _STRING_KEYS)
            if ("column" in s) == ("value" in s):
                raise fail(key, "give either column or value")
            if "value" in s:
                if name in PER_MESSAGE:
                    raise fail(f"{key}.value", "a constant would make every row one message")
                extra = sorted(set(s) - {"value"})
                if extra:
                    raise fail(f"{key}.{extra[0]}", "only with column")
                fields[name] = Field(value=text(s["value"], f"{key}.value"))
                continue
            template = s.get("template")
            if template is not None and text(template, f"{key}.template").count("{}") != 1:
                raise fail(f"{key}.template", "must hold {} once, where the value goes")
            mqtt_topic = s.get("mqtt_topic", False)
            if not isinstance(mqtt_topic, bool):
                raise fail(f"{key}.mqtt_topic", "must be true or false")
            strip = s.get("strip_prefix")
            fields[name] = Field(
                column=text(s["column"], f"{key}.column"),
                strip_prefix=text(strip, f"{key}.strip_prefix") if strip is not None else None,
                mqtt_topic=mqtt_topic, template=template)
    return ExternalMapping(source=source, format=fmt, gw=gw, fields=fields, event=event,
                           event_column=event_column, event_values=event_values,
                           header=header, delimiter=delimiter, names=names, lines=lines)


def file_columns(spark: SparkSession, path: str, mapping: ExternalMapping) -> list[str]:
    """The columns of the file(s) at ``path``: a CSV file's header (or the mapping's
    ``csv.names``), or the keys found in the first ``JSONL_SAMPLE_LINES`` lines of a JSON
    Lines file (a key that is null everywhere may be left out of a line)."""
    if mapping.format == "csv":
        if mapping.names is not None:
            return list(mapping.names)
        # No schema and no inference: Spark reads the header line only, every column a string.
        return spark.read.option("header", "true").option("sep", mapping.delimiter).csv(path).columns
    seen: dict[str, None] = {}
    for row in spark.read.text(path).limit(JSONL_SAMPLE_LINES).collect():
        try:
            obj = json.loads(row[0])
        except ValueError:
            continue  # a line cut short; the reader drops it too
        if isinstance(obj, dict):
            seen.update(dict.fromkeys(obj))
    return list(seen)


def read_external(spark: SparkSession, path: str, mapping: ExternalMapping) -> DataFrame:
    """The rows of the external file(s) at ``path`` as delivery-log records (``DLOG_SCHEMA``)
    of the pseudo-gateway ``mapping.gw``: a ``publish`` per sender's row, an ``import`` and a
    ``deliver`` per receiver's row. A mapped column the file lacks raises ``MappingError``.
    Rows whose event, ``ts`` or ``dest`` cannot be read are left out, as is a JSON line cut
    short."""
    present = file_columns(spark, path, mapping)
    for column, key in mapping.columns().items():
        if column not in present:
            shown = ", ".join(present) if present else "none"
            raise mapping.error(key, f"{column!r} is not a column of {path} (its columns: "
                                     f"{shown})")
    if mapping.format == "csv":
        # A CSV schema is positional: every column of the file, each a string.
        schema = StructType([StructField(c, StringType()) for c in present])
        reader = (spark.read.schema(schema).option("sep", mapping.delimiter)
                  .option("header", str(mapping.header).lower()))
        if mapping.header:
            reader = reader.option("enforceSchema", "false")  # every file's header checked
        raw = reader.csv(path)
    else:
        # A JSON schema is by name: the columns the mapping reads, each a string (a number's
        # own text: Spark's JSON reader gives a non-string value to a string column as is).
        wanted = list(mapping.columns())
        schema = StructType([StructField(c, StringType()) for c in wanted])
        raw = spark.read.schema(schema).option("mode", "DROPMALFORMED").json(path)
    # Positional names from here on: a source column may hold a '.' or a space.
    index = {c: f"c{i}" for i, c in enumerate(raw.columns)}
    df = raw.toDF(*index.values())
    return _records(df, index, mapping, _path_tag(path))


def _path_tag(path: str) -> str:
    return hashlib.blake2b(path.encode("utf-8"), digest_size=4).hexdigest()


def _records(df: DataFrame, index: dict[str, str], m: ExternalMapping, tag: str) -> DataFrame:
    def col(name: str) -> Column:
        return F.col(index[name])

    f = m.fields
    if m.event is not None:
        event: Column = F.lit(m.event)
    else:
        assert m.event_column is not None
        table = F.create_map(*[F.lit(x) for kv in m.event_values.items() for x in kv])
        event = table[col(m.event_column)]
    own_id = F.concat(F.lit(f"ext:{m.gw}:{tag}:"), F.monotonically_increasing_id().cast("string"))
    trace = _string(f.get("trace_id"), col)
    null = F.lit(None).cast("string")
    row = df.select(
        _ts(f["ts"], col).alias("ts"),
        event.alias("event"),
        F.coalesce(F.when(trace != F.lit(""), trace), own_id).alias("trace_id"),
        _string(f.get("msg_id"), col).alias("msg_id"),
        _string(f["dest"], col).alias("dest"),
        _string(f.get("client"), col).alias("client"),
        _body_hash(f.get("body_hash"), col).alias("body_hash"),
        _string(f.get("far_id"), col).alias("far_id"),
        _string(f.get("far_dest"), col).alias("far_dest"),
    ).where(F.col("ts").isNotNull() & F.col("event").isNotNull() & F.col("dest").isNotNull())
    # A receiver's row: the message entered the system (import) and reached the receiver
    # (deliver), at one time on one clock.
    kinds = F.when(F.col("event") == F.lit(DELIVER),
                   F.array(F.lit(IMPORT), F.lit(DELIVER))).otherwise(F.array(F.col("event")))
    rows = row.withColumn("kind", F.explode(kinds))
    values: dict[str, Column] = {
        "v": F.lit(SCHEMA_VERSION),
        "gw": F.lit(m.gw),
        "event": F.col("kind"),
        "client": F.when(F.col("kind") == F.lit(IMPORT), null).otherwise(F.col("client")),
        "count": F.when(F.col("kind") == F.lit(DELIVER), F.lit(1)).otherwise(F.lit(0)),
    }
    out = []
    for fld in DLOG_SCHEMA.fields:
        value = values.get(fld.name)
        if value is None:
            value = F.col(fld.name) if fld.name in row.columns else F.lit(None)
        out.append(value.cast(fld.dataType).alias(fld.name))
    return rows.select(*out)


def _ts(f: Field, col: Callable[[str], Column]) -> Column:
    """Epoch milliseconds (docs/delivery-log.md, "Fields", ts) from the row's time."""
    assert f.column is not None
    c = F.trim(col(f.column))
    if f.ts_format == "epoch_ms":
        return c.try_cast("double")
    if f.ts_format == "epoch_s":
        return c.try_cast("double") * F.lit(1000.0)
    # ISO 8601 with no offset is UTC, as the job's --since/--until read it.
    zoned = c.rlike(r"[T ]\d\d:\d\d.*([Zz]|[+-]\d\d(:?\d\d)?)$")
    when = F.try_to_timestamp(F.when(zoned, c).otherwise(F.concat(c, F.lit("Z"))))
    return F.unix_micros(when) / F.lit(1000.0)


def _string(f: Field | None, col: Callable[[str], Column]) -> Column:
    if f is None:
        return F.lit(None).cast("string")
    if f.value is not None:
        return F.lit(f.value)
    assert f.column is not None
    c = col(f.column)
    if f.strip_prefix is not None:
        n = len(f.strip_prefix)
        c = F.when(c.startswith(f.strip_prefix), F.substring(c, n + 1, 1 << 30)).otherwise(c)
    if f.mqtt_topic:
        c = _mqtt_topic_to_subject(c)
    if f.template is not None:
        before, after = f.template.split("{}")
        c = F.concat(F.lit(before), c, F.lit(after))
    return c


def _mqtt_topic_to_subject(topic: Column) -> Column:
    """An MQTT topic name as the gateway's subject (adapters/mqtt/README.md, "Topics ↔
    subjects"): each level one element; ``%``, ``.``, ``*`` and ``>`` in a level escaped as
    ``%25``, ``%2E``, ``%2A``, ``%3E``; an empty level ``%``."""
    def element(level: Column) -> Column:
        escaped = level
        for ch, esc in (("%", "%25"), (".", "%2E"), ("*", "%2A"), (">", "%3E")):
            escaped = F.replace(escaped, F.lit(ch), F.lit(esc))
        return F.when(level == F.lit(""), F.lit("%")).otherwise(escaped)
    return F.array_join(F.transform(F.split(topic, "/", -1), element), ".")


def _body_hash(f: Field | None, col: Callable[[str], Column]) -> Column:
    if f is None:
        return F.lit(None).cast("string")
    if f.column is not None:
        h = F.lower(F.trim(col(f.column)))
        return F.when(h.rlike(f"^[0-9a-f]{{{2 * HASH_BYTES}}}$"), h)
    assert f.body is not None
    # Row at a time: the Arrow-batched kind needs pyarrow, which the job does not require.
    return F.udf(body_hasher(f.encoding), StringType(), useArrow=False)(col(f.body))


def body_hasher(encoding: str) -> Callable[[str | None], str | None]:
    """The body hash of docs/delivery-log.md, "Hashes", of a body column's value: BLAKE2b,
    8-byte digest, 16 lowercase hex digits, of a text body's UTF-8 bytes (``text``), or of
    the bytes a ``base64`` or ``hex`` column holds; None for no body, or one that does not
    decode. (A nested function: Spark ships it to its Python workers by value.)"""
    if encoding not in BODY_ENCODINGS:
        raise ValueError(f"unknown body encoding {encoding!r}")

    def body_hash(value: str | None) -> str | None:
        import base64
        import binascii
        import hashlib

        if value is None:
            return None
        try:
            if encoding == "text":
                data = value.encode("utf-8", "surrogatepass")
            elif encoding == "base64":
                data = base64.b64decode(value, validate=True)
            else:
                data = bytes.fromhex(value)
        except (ValueError, binascii.Error):
            return None
        return hashlib.blake2b(data, digest_size=HASH_BYTES).hexdigest()

    return body_hash


def sender_links(records: DataFrame, external_gws: Iterable[str], window_ms: float,
                 skew_ms: float = 0.0) -> DataFrame:
    """(``trace_id``, ``linked_trace_id``): a sender's record's own trace id, and the trace of
    the gateway entry it became, when the system did not carry the gateway's trace id. The
    candidates are the gateways' first-hand entries (a ``publish``, or an ``import`` of a
    message no other gateway exported) that no sender's record joins by trace id already;
    a pair has the same body hash, the same destination (``far_dest`` when both give it,
    else ``dest``) and the entry within ``window_ms`` after the send or up to ``skew_ms``
    before it (two clocks). Only unambiguous pairs: one gateway trace for the send, one send
    for the gateway trace (``spark.link`` applies the same rule)."""
    if window_ms < 0 or skew_ms < 0:
        raise ValueError("the link window and the clock-skew tolerance cannot be negative")
    gws = list(external_gws)
    sent, firsthand = _sends_and_entries(records, gws)
    joined = F.col("s_trace") == F.col("g_trace")
    s_open = sent.join(firsthand, joined, "left_anti")
    g_open = firsthand.join(sent, joined, "left_anti")
    same_dest = (F.when(F.col("s_far_dest").isNotNull() & F.col("g_far_dest").isNotNull(),
                        F.col("s_far_dest") == F.col("g_far_dest"))
                 .otherwise(F.col("s_dest") == F.col("g_dest")))
    gap = F.col("g_ts") - F.col("s_ts")
    pairs = (s_open.join(g_open,
                         (F.col("s_body") == F.col("g_body")) & same_dest
                         & (gap >= F.lit(-float(skew_ms))) & (gap <= F.lit(float(window_ms))),
                         "inner")
             .select("s_trace", "g_trace").distinct())
    one_g = pairs.groupBy("s_trace").count().where("count = 1").select("s_trace")
    one_s = pairs.groupBy("g_trace").count().where("count = 1").select("g_trace")
    return (pairs.join(one_g, "s_trace", "left_semi").join(one_s, "g_trace", "left_semi")
            .select(F.col("s_trace").alias("trace_id"),
                    F.col("g_trace").alias("linked_trace_id")))


def _sends_and_entries(records: DataFrame, gws: list[str]) -> tuple[DataFrame, DataFrame]:
    """The senders' publish records, and the gateways' first-hand entries."""
    on_external = F.col("gw").isin(gws)
    sent = (records.where(on_external & (F.col("event") == F.lit(PUBLISH))
                          & F.col("trace_id").isNotNull())
            .select(F.col("trace_id").alias("s_trace"), F.col("ts").alias("s_ts"),
                    F.col("dest").alias("s_dest"), F.col("far_dest").alias("s_far_dest"),
                    F.col("body_hash").alias("s_body")))
    exported = (records.where(~on_external & (F.col("event") == F.lit(EXPORT))
                              & F.col("trace_id").isNotNull())
                .select(F.col("trace_id").alias("x_trace"), F.col("gw").alias("x_gw")))
    entries = records.where(~on_external & F.col("event").isin(list(ENTRY_EVENTS))
                            & F.col("trace_id").isNotNull())
    relay = ((entries["event"] == F.lit(IMPORT)) & (entries["trace_id"] == F.col("x_trace"))
             & (entries["gw"] != F.col("x_gw")))
    firsthand = (entries.join(exported, relay, "left_anti")
                 .select(F.col("trace_id").alias("g_trace"), F.col("gw").alias("g_gw"),
                         F.col("ts").alias("g_ts"), F.col("dest").alias("g_dest"),
                         F.col("far_dest").alias("g_far_dest"),
                         F.col("body_hash").alias("g_body")))
    return sent, firsthand


def link_senders(records: DataFrame, external_gws: Iterable[str], window_ms: float,
                 skew_ms: float = 0.0) -> DataFrame:
    """The records, with each sender's record (a ``publish`` of an external pseudo-gateway
    in ``external_gws``) that a gateway got joined to the gateway's trace (``sender_links``;
    by content only when ``window_ms`` > 0), and a ``deliver`` of the pseudo-gateway to each
    gateway that got it first hand (``client``: that gateway's id; ``count`` 1; the send's
    own time and contents). Run it after ``spark.link.link_by_content``, which makes the far side of a
    gateway-to-gateway hop a relay (not a first-hand entry) when the hop lost the trace id.
    """
    gws = list(external_gws)
    # The records are read several times below, and their plan (the logs and the external
    # files, linked by content) is large already: without a checkpoint every verdict's plan
    # holds it a dozen times over, and analysing that takes Spark minutes. A checkpoint also
    # fixes the external rows' own trace ids (``monotonically_increasing_id``) once.
    records = records.localCheckpoint()
    if window_ms > 0:
        records = relink(records, sender_links(records, gws, window_ms, skew_ms))
    _, firsthand = _sends_and_entries(records, gws)
    reached = (firsthand.select(F.col("g_trace").alias("trace_id"), F.col("g_gw").alias("to_gw"))
               .distinct())
    sends = records.where(F.col("gw").isin(gws) & (F.col("event") == F.lit(PUBLISH)))
    handed = (sends.join(reached, on="trace_id", how="inner")
              .withColumn("event", F.lit(DELIVER))
              .withColumn("client", F.col("to_gw"))
              .withColumn("count", F.lit(1).cast("long"))
              .select(*records.columns))
    return records.unionByName(handed)
