"""One source for each default mapping: the rows of mappings/defaults/<protocol>.yaml.

The hand-written fast paths (mappings/stomp.py, mqtt.py, amqp.py, amqp_fast.py,
amqp_fast_out.py) take their names and except lists from the rows and check on import that the
rows are the ones they are written for (mappings/rows.py, mappings/README.md "One source: the
rows and the fast paths"). Each test below changes one default YAML file in a copy of the
``mappings`` package and runs a fresh interpreter on the copy: a name changed in the rows
changes the engine's output and the fast path's alike; a row added or changed otherwise is
one change too: the fast path of that direction is off and the engine runs the rows, with a
warning that names the file and the rule; a name the fast path keeps that the rows no longer
agree on stops the package from importing, naming the rules.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from mappings import amqp_rows, mqtt, rows, stomp

ROOT = Path(__file__).resolve().parent.parent.parent


def run_on_copy(tmp_path: Path, protocol: str, edit: list[tuple[str, str]], script: str
                ) -> subprocess.CompletedProcess[str]:
    """Run ``script`` on a copy of the package whose ``defaults/<protocol>.yaml`` has each
    ``(old, new)`` of ``edit`` replaced (every ``old`` must be there)."""
    shutil.copytree(ROOT / "mappings", tmp_path / "mappings",
                    ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / "mappings" / "defaults" / f"{protocol}.yaml"
    text = path.read_text(encoding="utf-8")
    for old, new in edit:
        assert old in text, old
        text = text.replace(old, new)
    path.write_text(text, encoding="utf-8")
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], cwd=tmp_path, capture_output=True,
        text=True, timeout=100, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_the_fast_paths_are_written_for_the_shipped_rows() -> None:
    for protocol, shape_in, shape_out in (("stomp", stomp.SHAPE_IN, stomp.SHAPE_OUT),
                                          ("mqtt", mqtt.SHAPE_IN, mqtt.SHAPE_OUT),
                                          ("amqp", amqp_rows.SHAPE_IN, amqp_rows.SHAPE_OUT)):
        assert rows.check_shape(protocol, "in", shape_in)
        assert rows.check_shape(protocol, "out", shape_out)
        assert rows.is_fast(protocol, "in") and rows.is_fast(protocol, "out")
        assert rows.why_not_fast(protocol, "in") is None
    assert stomp.IN_HEADERS == frozenset(rows.except_names("stomp.in.properties"))
    assert "x-internal" not in stomp.IN_HEADERS  # the copy below adds it


STOMP_SCRIPT = """
    from gateway.message import QUEUE, Destination
    from mappings.engine import MappingSet
    from mappings.stomp import message_to_stomp, stomp_to_message
    d = Destination(QUEUE, "a")
    headers = {"destination": "/queue/a", "x-internal": "1", "color": "red"}
    interpreted = MappingSet().wire_for(d, protocol="stomp", direction="in", fast=False)
    for to_message in (stomp_to_message, interpreted):
        m = to_message(headers, b"x", has_length=False, destination=d, reply_to=None, now_ms=1)
        print(sorted(m.properties))
    m.properties["x-internal"] = "2"
    out = MappingSet().wire_for(d, protocol="stomp", direction="out", fast=False)
    for to_stomp in (message_to_stomp, out):
        print([h for h, _ in to_stomp(m, destination="/queue/a", reply_to=None)[0]])
"""


def test_a_header_added_to_a_stomp_except_list_changes_both_paths(tmp_path: Path) -> None:
    done = run_on_copy(tmp_path, "stomp", [
        ("gw-types, gw-trace-id, AMQ_SCHEDULED_DELAY, JMS_GW_CONTENT_TYPE]",
         "gw-types, gw-trace-id, AMQ_SCHEDULED_DELAY, JMS_GW_CONTENT_TYPE, x-internal]"),
        ("JMS_GW_CONTENT_TYPE, AMQ_SCHEDULED_DELAY]",
         "JMS_GW_CONTENT_TYPE, AMQ_SCHEDULED_DELAY, x-internal]"),
    ], STOMP_SCRIPT)
    assert done.returncode == 0, done.stderr
    fast_in, rules_in, fast_out, rules_out = done.stdout.splitlines()
    assert fast_in == rules_in == "['color']"  # x-internal is not a property, either way
    assert fast_out == rules_out
    assert "'x-internal'" not in fast_out and "'color'" in fast_out


MQTT_SCRIPT = """
    from gateway.message import QUEUE, Destination
    from mappings.engine import MappingSet
    from mappings.mqtt import message_to_mqtt, mqtt_to_message
    d = Destination(QUEUE, "a")
    props = {"user_property": [("JMS_GW_MQTT_QOS", "9")]}
    interpreted = MappingSet().wire_for(d, protocol="mqtt", direction="in", fast=False)
    for to_message in (mqtt_to_message, interpreted):
        m = to_message(payload=b"x", qos=1, retain=False, properties=props, level=5,
                       destination=d, reply_to=None, now_ms=1)
        print(sorted(m.properties.items()))
    out = MappingSet().wire_for(d, protocol="mqtt", direction="out", fast=False)
    for to_mqtt in (message_to_mqtt, out):
        print(to_mqtt(m, level=5, now_ms=1, reply_topic=None))
"""


def test_an_mqtt_property_renamed_in_the_rows_is_renamed_in_both_paths(tmp_path: Path) -> None:
    done = run_on_copy(tmp_path, "mqtt", [("JMS_GW_MQTT_QOS", "JMS_GW_QOS")], MQTT_SCRIPT)
    assert done.returncode == 0, done.stderr
    fast_in, rules_in, fast_out, rules_out = done.stdout.splitlines()
    # The QoS is JMS_GW_QOS now; a user property of the old name is an ordinary property.
    assert fast_in == rules_in == "[('JMS_GW_MQTT_QOS', '9'), ('JMS_GW_QOS', Int8(1))]"
    assert fast_out == rules_out
    assert "qos=1" in fast_out and "('JMS_GW_MQTT_QOS', '9')" in fast_out
    assert "JMS_GW_QOS" not in fast_out  # the QoS property is not sent as a user property


AMQP_SCRIPT = """
    import proton
    from gateway.message import QUEUE, Destination
    from mappings import amqp_fast, amqp_fast_out
    from mappings.amqp import amqp_to_message, message_to_amqp
    from mappings.engine import MappingSet
    d = Destination(QUEUE, "a")
    pm = proton.Message(body="x", group_id="g1")
    pm.annotations = {proton.symbol("x-opt-jms-msg-type"): proton.byte(5)}
    raw = pm.encode()
    fast = amqp_fast.decode(raw, destination=d, default_kind=QUEUE, now_ms=1)
    interpreted = MappingSet().wire_for(d, protocol="amqp", direction="in", fast=False)
    for m in (fast, amqp_to_message(pm, destination=d, default_kind=QUEUE, now_ms=1),
              interpreted(pm, destination=d, default_kind=QUEUE, now_ms=1)):
        print(sorted(m.properties.items()))
    out = MappingSet().wire_for(d, protocol="amqp", direction="out", fast=False)
    encoded = [amqp_fast_out.encode(fast, delivery_count=0, now_ms=1),
               message_to_amqp(fast, delivery_count=0, now_ms=1).encode(),
               out(fast, delivery_count=0, now_ms=1).encode()]
    print(len(set(map(bytes, encoded))))
    back = proton.Message()
    back.decode(encoded[0])
    print(back.group_id, sorted(back.properties or {}))
"""


def test_an_amqp_property_renamed_in_the_rows_is_renamed_in_all_three_paths(
        tmp_path: Path) -> None:
    done = run_on_copy(tmp_path, "amqp", [("JMSXGroupID", "JMSXGroupName")], AMQP_SCRIPT)
    assert done.returncode == 0, done.stderr
    fast, hand, rules, same, back = done.stdout.splitlines()
    assert fast == hand == rules == "[('JMSXGroupName', 'g1')]"
    assert same == "1"  # amqp_fast_out, message_to_amqp and the rules: one encoding
    assert back == "g1 []"  # group-id again, not an application property


ADDED_ROW_SCRIPT = """
    import logging
    import proton
    from adapters.amqp.driver import encode_message
    from gateway.message import QUEUE, Destination, Message
    from mappings.engine import MappingSet, default_wire
    from mappings.rows import is_fast
    from mappings.stomp import stomp_to_message
    logging.basicConfig(format="%(levelname)s %(message)s")
    print(is_fast("stomp", "in"), is_fast("stomp", "out"), is_fast("amqp", "out"))
    d = Destination(QUEUE, "a")
    headers = {"destination": "/queue/a", "x-group": "g7", "color": "red"}
    for to_message in (default_wire("stomp", "in"), stomp_to_message,
                       MappingSet().wire_for(d, protocol="stomp", direction="in")):
        m = to_message(headers, b"x", has_length=False, destination=d, reply_to=None, now_ms=1)
        print(sorted(m.properties.items()))
    m = Message(destination=d, body="x", properties={"region": "north"})
    for mappings in (None, MappingSet()):
        pm = proton.Message()
        pm.decode(encode_message(m, mappings, transport=None, delivery_count=0, now_ms=1))
        print(pm.annotations)
"""


def test_a_row_added_is_one_change_the_engine_runs_it(tmp_path: Path) -> None:
    done = run_on_copy(tmp_path, "stomp", [("  - name: stomp.in.timestamp\n", """\
  - name: stomp.in.group
    match: *in
    steps:
      - copy: {from: wire.header.x-group, to: property.JMSXGroupID}
  - name: stomp.in.timestamp
""")], ADDED_ROW_SCRIPT)
    assert done.returncode == 0, done.stderr
    fast, engine, hand, rules, amqp_none, amqp_set = done.stdout.splitlines()
    assert fast == "False True True"  # only that direction's fast path is off
    # The default mapping (with or without a mapping set) is the rows, the new one with them;
    # the hand-written function, no longer the default, does not know it.
    assert engine == rules == "[('JMSXGroupID', 'g7'), ('color', 'red'), ('x-group', 'g7')]"
    assert hand == "[('color', 'red'), ('x-group', 'g7')]"
    assert amqp_none == amqp_set  # the other protocols are untouched
    assert "x-opt-region" not in amqp_none
    assert re.search(r"WARNING the default stomp mapping \(in\) runs on the engine, not its "
                     r"fast path: mappings/defaults/stomp\.yaml: rule 'stomp\.in\.group' "
                     r"\(copy: wire\.header\.x-group -> property\.JMSXGroupID\), row 12 of "
                     r"'in', is not one the fast path is written for \(it expects "
                     r"'stomp\.in\.timestamp' there\)", done.stderr), done.stderr
    assert done.stderr.count("WARNING") == 1  # once, however often it is asked for


def test_an_amqp_row_added_runs_on_the_engine_through_the_adapters_codec(
        tmp_path: Path) -> None:
    done = run_on_copy(tmp_path, "amqp", [("  - name: amqp.out.body\n", """\
  - name: amqp.out.region
    match: *out
    steps:
      - copy: {from: property.region, to: wire.annotation.x-opt-region}
  - name: amqp.out.body
""")], ADDED_ROW_SCRIPT)
    assert done.returncode == 0, done.stderr
    fast, *_, amqp_none, amqp_set = done.stdout.splitlines()
    assert fast == "True True False"
    assert amqp_none == amqp_set
    assert "symbol('x-opt-region'): 'north'" in amqp_none, amqp_none


def test_a_row_given_another_converter_runs_as_the_rows_say(tmp_path: Path) -> None:
    script = """
        from gateway.message import QUEUE, Destination
        from mappings.engine import default_wire
        from mappings.rows import why_not_fast
        d = Destination(QUEUE, "a")
        headers = {"destination": "/queue/a", "priority": "5000"}
        try:
            default_wire("stomp", "in")(headers, b"x", has_length=False, destination=d,
                                        reply_to=None, now_ms=1)
        except Exception as exc:
            print(type(exc).__name__, exc)
        print(why_not_fast("stomp", "in"))
    """
    done = run_on_copy(tmp_path, "stomp", [("via: stomp-priority-in", "via: stomp-expires-in")],
                       script)
    assert done.returncode == 0, done.stderr
    values, why = done.stdout.splitlines()
    # The priority header is read as an expiry time, which no priority is.
    assert values == "MessageFormatError 5000 is not an integer in 0..9"
    assert why == ("mappings/defaults/stomp.yaml: rule 'stomp.in.priority' is 'convert "
                   "stomp-expires-in: wire.header.priority -> header.JMSPriority'; the fast "
                   "path is written for 'convert stomp-priority-in: wire.header.{} -> "
                   "header.JMSPriority'")


def test_a_name_the_fast_path_keeps_once_that_two_rows_disagree_on_stops_the_import(
        tmp_path: Path) -> None:
    done = run_on_copy(tmp_path, "stomp", [("- copy: {from: wire.header.type, to: header.JMSType}",
                                            "- copy: {from: wire.header.kind, to: header.JMSType}")],
                       "import mappings.stomp")
    assert done.returncode != 0
    assert re.search(r"DefaultRowsMismatch: mappings/defaults/stomp\.yaml: the fast path keeps "
                     r"one name for stomp\.in\.type from\[0\] \(kind\), stomp\.out\.type "
                     r"to\[0\] \(type\)", done.stderr), done.stderr
