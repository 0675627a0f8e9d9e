"""External records: a device fleet's CSV export and a far application's JSON Lines export
read by a YAML mapping as a pseudo-gateway's records, joined with the gateways' logs."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from chispa import assert_df_equality
from dlogrecords import frame, rec, write_log
from pyspark.sql import SparkSession

from adapters.mqtt.topics import mqtt_topic_to_subject
from gateway.dlog_format import content_body, hash_json
from gateway.message import Message
from spark.external import MappingError, link_senders, load_mapping, read_external
from spark.job import main
from spark.link import link_by_content
from spark.schema import DLOG_SCHEMA
from spark.verdicts import verdicts

pytestmark = pytest.mark.spark


def gw_hash(msg: Message) -> str:
    """The body hash the gateway's delivery log writes for ``msg``."""
    return json.loads(hash_json(content_body(msg)))


def text_hash(body: str) -> str:
    return gw_hash(Message.text(body))


def write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return str(path)


FLEET_MAPPING = """\
format: csv
csv: {header: true, delimiter: ";"}
gw: fleet
event: publish
fields:
  ts: {column: sent_ms, format: epoch_ms}
  dest: {column: topic, mqtt_topic: true, template: "topic:{}"}
  far_dest: topic
  client: {column: device, template: "mqtt:{}"}
  body_hash: {body: payload}
"""


def test_a_fleet_row_no_gateway_got_is_lost_on_the_fleet(
        spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    # Four devices' sends; the gateway imported two through its MQTT transport (no trace id
    # on MQTT), got one from a device connected to it directly, and never got d2's.
    fleet = write(tmp_path / "fleet" / "sent.csv", "\n".join([
        "sent_ms;device;topic;payload",
        "1000;d1;plant/temp;21.5",
        "1100;d2;plant/temp;21.7",
        "1200;d3;plant/temp;température 22",
        "1300;d4;plant/hum;40",
    ]) + "\n")
    mapping = write(tmp_path / "fleet.yaml", FLEET_MAPPING)
    write_log(tmp_path / "logs" / "dlog-gw-a-20260514T093012-0001.jsonl", [
        rec(1010.0, "gw-a", "import", "a1", dest="topic:plant.temp", client="from-broker",
            body_hash=text_hash("21.5"), far_dest="plant/temp"),
        rec(1011.0, "gw-a", "deliver", "a1", dest="topic:plant.temp", client="c", count=1,
            body_hash=text_hash("21.5")),
        rec(1205.0, "gw-a", "import", "a3", dest="topic:plant.temp", client="from-broker",
            body_hash=text_hash("température 22"), far_dest="plant/temp"),
        rec(1206.0, "gw-a", "deliver", "a3", dest="topic:plant.temp", client="c", count=1,
            body_hash=text_hash("température 22")),
        rec(1305.0, "gw-a", "publish", "a4", dest="topic:plant.hum", client="mqtt:d4",
            body_hash=text_hash("40")),
        rec(1306.0, "gw-a", "deliver", "a4", dest="topic:plant.hum", client="c", count=1,
            body_hash=text_hash("40")),
        rec(9000.0, "gw-a", "publish", "late", dest="topic:x", client="p"),
    ])
    out = tmp_path / "out"

    rc = main([str(tmp_path / "logs"), "--out", str(out), "--format", "json",
               "--grace-ms", "2000", "--skew-ms", "50",
               "--external", f"{fleet}={mapping}"])

    assert rc == 0
    rows = [json.loads(line) for part in sorted((out / "verdicts").glob("part-*.json"))
            for line in part.read_text().splitlines()]
    got = sorted((r["verdict"], r["gw"], r["dest"], r.get("entry_client"),
                  r.get("exit_client"), r["trace_id"].startswith("ext:fleet:"))
                 for r in rows if r["dest"] != "topic:x")
    assert got == [
        ("delivered", "fleet", "topic:plant.hum", "mqtt:d4", "gw-a", False),
        ("delivered", "fleet", "topic:plant.temp", "mqtt:d1", "gw-a", False),
        ("delivered", "fleet", "topic:plant.temp", "mqtt:d3", "gw-a", False),
        ("delivered", "gw-a", "topic:plant.hum", "mqtt:d4", "c", False),
        ("delivered", "gw-a", "topic:plant.temp", "from-broker", "c", False),
        ("delivered", "gw-a", "topic:plant.temp", "from-broker", "c", False),
        # d2's send: it entered the fleet and left it for no gateway read.
        ("lost", "fleet", "topic:plant.temp", "mqtt:d2", None, True),
    ]
    # The gateway's traces keep their ids; the devices are their origin.
    e2e = {(r["gw"], r["trace_id"]): (r["origin_gw"], r["e2e_latency_ms"])
           for r in rows if r["verdict"] == "delivered" and r["gw"] == "gw-a"}
    assert e2e == {("gw-a", "a1"): ("fleet", 11.0), ("gw-a", "a3"): ("fleet", 6.0),
                   ("gw-a", "a4"): ("fleet", 6.0)}
    assert "lost\t1\n" in capsys.readouterr().out


RECEIVER_MAPPING = """\
format: jsonl
gw: app
event: deliver
fields:
  ts: {column: received_at, format: iso8601}
  trace_id: trace
  dest: {column: address, strip_prefix: "cloud/", template: "topic:{}"}
  far_dest: address
  client: {value: billing}
  body_hash: {column: sha}
"""


def test_an_export_the_far_application_never_received_is_lost_in_transit(
        spark: SparkSession, tmp_path: Path):
    bodies = {t: text_hash(f"order {t}") for t in ("t1", "t2", "t3", "t4")}
    received = write(tmp_path / "app" / "received.jsonl", "".join(json.dumps(r) + "\n" for r in [
        # t1 carried the trace id; t3 and t4 did not (linked by address, body and time).
        {"received_at": "1970-01-01T00:00:01.020Z", "trace": "t1", "address": "cloud/orders",
         "sha": bodies["t1"].upper()},
        {"received_at": "1970-01-01T02:00:03.030+02:00", "address": "cloud/orders",
         "sha": bodies["t3"]},
        {"received_at": "1970-01-01T00:00:04.040", "trace": "", "address": "cloud/orders",
         "sha": bodies["t4"]},
    ]) + '{"received_at": "1970-01-01T00:00:0')  # a line cut short
    mapping = load_mapping(write(tmp_path / "app.yaml", RECEIVER_MAPPING))
    gw = [r for t, ts in (("t1", 1000.0), ("t2", 2000.0), ("t3", 3000.0), ("t4", 4000.0))
          for r in (rec(ts - 1, "gw-a", "publish", t, dest="topic:orders", client="p",
                        body_hash=bodies[t]),
                    rec(ts, "gw-a", "export", t, dest="topic:orders", client="to-cloud",
                        body_hash=bodies[t], far_dest="cloud/orders"))]
    gw.append(rec(9000.0, "gw-a", "publish", "late", dest="topic:x", client="p"))

    ext = read_external(spark, received, mapping)
    records = link_by_content(frame(spark, gw).unionByName(ext), 1000.0, 50.0)
    records = link_senders(records, ["app"], 1000.0, 50.0)
    got = sorted(tuple(r) for r in verdicts(records, 2000.0, 50.0)
                 .where("dest != 'topic:x'")
                 .select("verdict", "trace_id", "gw", "entry_event", "exit", "exit_client",
                         "latency_ms", "e2e_latency_ms").collect())

    assert got == [
        ("delivered", "t1", "app", "import", "deliver", "billing", 0.0, 21.0),
        ("delivered", "t1", "gw-a", "publish", "export", "to-cloud", 1.0, 1.0),
        ("delivered", "t2", "gw-a", "publish", "export", "to-cloud", 1.0, 1.0),
        ("delivered", "t3", "app", "import", "deliver", "billing", 0.0, 31.0),
        ("delivered", "t3", "gw-a", "publish", "export", "to-cloud", 1.0, 1.0),
        ("delivered", "t4", "app", "import", "deliver", "billing", 0.0, 41.0),
        ("delivered", "t4", "gw-a", "publish", "export", "to-cloud", 1.0, 1.0),
        ("lost_in_transit", "t2", "gw-a", "publish", "export", "to-cloud", None, None),
    ]


def test_the_records_have_the_log_schema_and_the_gateways_hashes_and_names(
        spark: SparkSession, tmp_path: Path):
    topics = ["plant/temp", "a.b/c*/", "/x%>", "sensors", "long"]
    # Over 256 characters the gateway hashes a body on its loop rather than in the writer.
    payloads = ["21.5", "température 22 °C", "✓ 𝄞", "", "é" * 300]
    lines = ["1.5|" + "|".join(x) for x in zip(topics, payloads, strict=True)]
    data = write(tmp_path / "d.csv", "\n".join(lines) + "\n")
    mapping = load_mapping(write(tmp_path / "m.yaml", """\
format: csv
csv: {header: false, delimiter: "|", names: [sent_s, topic, payload]}
gw: fleet
event: publish
fields:
  ts: {column: sent_s, format: epoch_s}
  dest: {column: topic, mqtt_topic: true, template: "topic:{}"}
  body_hash: {body: payload}
"""))
    df = read_external(spark, data, mapping)

    assert [(f.name, f.dataType) for f in df.schema] == [
        (f.name, f.dataType) for f in DLOG_SCHEMA]
    got = sorted((r["ts"], r["dest"], r["body_hash"], r["v"], r["count"], r["event"])
                 for r in df.collect())
    # A CSV reader reads an empty field as null: no body, no hash.
    want = sorted((1500.0, "topic:" + mqtt_topic_to_subject(t), text_hash(p) if p else None,
                   2, 0, "publish") for t, p in zip(topics, payloads, strict=True))
    assert got == want


def test_a_body_column_in_base64_or_hex_hashes_the_bytes_as_the_gateway_does(
        spark: SparkSession, tmp_path: Path):
    raw = [b"\x00\xff binary", "ünïcode".encode(), b""]
    rows = [{"at": 1000 + i, "kind": "got", "to": "q", "b64": base64.b64encode(b).decode(),
             "hex": b.hex()} for i, b in enumerate(raw)]
    rows.append({"at": 2000, "kind": "got", "to": "q", "b64": "not base64!", "hex": "zz"})
    rows.append({"at": 3000, "kind": "sent", "to": "q", "b64": "", "hex": ""})
    data = write(tmp_path / "d.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    base = """\
format: jsonl
gw: sink
event: {column: kind, values: {got: deliver}}
fields:
  ts: {column: at, format: epoch_ms}
  dest: {column: to, template: "queue:{}"}
"""
    want = sorted([(1000.0, gw_hash(Message.binary(raw[0]))),
                   (1001.0, gw_hash(Message.binary(raw[1]))),
                   (1002.0, gw_hash(Message.binary(raw[2]))),
                   (2000.0, None)])  # does not decode: no hash; the "sent" row is no record
    for column, encoding in (("b64", "base64"), ("hex", "hex")):
        m = load_mapping(write(tmp_path / f"{encoding}.yaml", base
                               + f"  body_hash: {{body: {column}, encoding: {encoding}}}\n"))
        df = read_external(spark, data, m).where("event = 'deliver'")
        assert sorted((r["ts"], r["body_hash"]) for r in df.collect()) == want, encoding


def test_a_receivers_row_is_an_import_and_a_deliver(spark: SparkSession, tmp_path: Path):
    data = write(tmp_path / "r.csv", "when,who,where\n2026-05-14 09:30:12.5,c1,a/b\n")
    m = load_mapping(write(tmp_path / "m.yaml", """\
format: csv
gw: app
event: deliver
fields:
  ts: {column: when, format: iso8601}
  dest: {column: where, mqtt_topic: true, template: "topic:{}"}
  client: who
  msg_id: {column: who, template: "ID:{}"}
"""))
    df = read_external(spark, data, m)
    trace = df.first()["trace_id"]  # its own: the system carried none
    expected = frame(spark, [
        {"v": 2, "ts": 1778751012500.0, "gw": "app", "event": e, "trace_id": trace,
         "msg_id": "ID:c1", "dest": "topic:a.b", "client": c, "count": n}
        for e, c, n in (("import", None, 0), ("deliver", "c1", 1))])
    assert trace.startswith("ext:app:")
    assert_df_equality(df, expected, ignore_row_order=True, ignore_nullable=True)


@pytest.mark.parametrize(("yaml_text", "message"), [
    (FLEET_MAPPING + "extra: 1\n", ":11: extra: unknown key"),
    (FLEET_MAPPING.replace("  client:", "  cliënt:"), ":9: fields.cliënt: unknown key"),
    (FLEET_MAPPING.replace("format: epoch_ms", "format: epoch_us"),
     ":6: fields.ts.format: must be one of epoch_ms, epoch_s, iso8601, not 'epoch_us'"),
    (FLEET_MAPPING.replace("  ts: {column: sent_ms, format: epoch_ms}\n", ""),
     ":5: fields.ts: missing"),
    (FLEET_MAPPING.replace("gw: fleet\n", ""), "fleet.yaml: gw: missing"),
    (FLEET_MAPPING.replace("event: publish", "event: ack"),
     ":4: event: must be one of publish, deliver, not 'ack'"),
    (FLEET_MAPPING.replace('"topic:{}"', '"topic"'), ":7: fields.dest.template: must hold {}"),
    (FLEET_MAPPING + "  far_dest: other\n", ":11: fields.far_dest: given twice (first on line 8)"),
    (FLEET_MAPPING.replace("far_dest: topic", "trace_id: {value: x}"),
     ":8: fields.trace_id.value: a constant would make every row one message"),
    (FLEET_MAPPING.replace("csv: {header: true", "csv: {header: false"),
     ":2: csv.names: missing"),
    ("format: csv\n  gw: [\n", "fleet.yaml:2: not YAML"),
])
def test_a_mapping_error_names_the_file_the_key_and_the_line(
        tmp_path: Path, yaml_text: str, message: str):
    path = write(tmp_path / "fleet.yaml", yaml_text)
    with pytest.raises(MappingError) as e:
        load_mapping(path)
    assert str(e.value).startswith(path)
    assert message in str(e.value)


def test_a_mapped_column_the_file_lacks_is_an_error_naming_both_files(
        spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    mapping = write(tmp_path / "fleet.yaml", FLEET_MAPPING)
    data = write(tmp_path / "sent.csv", "sent_ms;device;topik;payload\n1000;d1;a;x\n")
    jsonl = write(tmp_path / "sent.jsonl", '{"sent_ms": 1}\n')
    jsonl_mapping = write(tmp_path / "j.yaml",
                          FLEET_MAPPING.replace("format: csv", "format: jsonl")
                          .replace('csv: {header: true, delimiter: ";"}\n', ""))

    with pytest.raises(MappingError) as e:
        read_external(spark, data, load_mapping(mapping))
    assert str(e.value) == (f"{mapping}:7: fields.dest.column: 'topic' is not a column of "
                            f"{data} (its columns: sent_ms, device, topik, payload)")
    with pytest.raises(MappingError) as e:
        read_external(spark, jsonl, load_mapping(jsonl_mapping))
    assert str(e.value).startswith(f"{jsonl_mapping}:6: fields.dest.column: 'topic' is not")
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--out", str(tmp_path / "out"), "--external", f"{data}={mapping}"])
    assert "fields.dest.column: 'topic' is not a column of" in capsys.readouterr().err
