"""transports.conf: sections, types, typed parameters, the inbound queue policy
(TIBCO EMS User's Guide, "transports.conf"; "Configuring Transports for Rendezvous",
rv_queue_policy) and the warnings about unused or disabled transports."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from corehelp import make_cert

from gateway.config import (
    DiscardPolicy,
    Endpoint,
    QueuePolicy,
    TransportDef,
    load_config,
    parse_queue_policy,
)
from gateway.errors import ConfigErrors
from gateway.message import DeliveryMode

ALL_ENABLED = (
    "mqtt_transports = on\namqp_transports = on\nstomp_transports = on\nrv_transports = on\n"
)


def write(d: Path, **files: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / f"{name}.conf").write_text(text)
    return d


def load(
    d: Path, transports: str, topics: str = ">\n"
) -> tuple[dict[str, TransportDef], list[str]]:
    cfg = load_config(
        write(d, gateway=ALL_ENABLED, topics=topics, queues=">", transports=transports)
    )
    return cfg.transports, cfg.warnings


def errors_of(d: Path, transports: str) -> list[tuple[int | None, str]]:
    write(d, gateway=ALL_ENABLED, topics=">", queues=">", transports=transports)
    with pytest.raises(ConfigErrors) as ei:
        load_config(d)
    assert {os.path.basename(e.file) for e in ei.value.errors} == {"transports.conf"}
    return [(e.line, e.detail) for e in ei.value.errors]


def uses(*names: str) -> str:
    """A topics.conf that names each transport, so no 'unused' warning is raised."""
    return ">\n" + "".join(f't{i} import="{n}"\n' for i, n in enumerate(names))


def test_mqtt_transport_is_typed_and_defaulted(tmp_path: Path) -> None:
    ts, warnings = load(
        tmp_path,
        "# upstream broker\n[up]\ntype = mqtt\nurl = mqtts://broker.example.com\n"
        "topic_import_dm = TIBEMS_RELIABLE\nqueue_import_dm = persistent\n"
        "export_headers = false\nqos = 2\nkeepalive = 2min\nreconnect_max = 5min\n"
        "client_id = gw-1\nusername = u\npassword = p w\nrequired = yes\n",
        topics=uses("up"),
    )
    assert warnings == []
    t = ts["up"]
    assert (t.name, t.type, t.line) == ("up", "mqtt", 2)
    p = t.params
    assert p["url"] == Endpoint("mqtts", "broker.example.com", 8883) and p["url"].tls
    assert p["topic_import_dm"] is DeliveryMode.RELIABLE
    assert p["queue_import_dm"] is DeliveryMode.PERSISTENT
    assert p["export_headers"] is False and p["export_properties"] is True
    assert (p["qos"], p["keepalive"], p["reconnect_min"], p["reconnect_max"]) == (
        2,
        120.0,
        1.0,
        300.0,
    )
    assert (p["client_id"], p["username"], p["password"]) == ("gw-1", "u", "p w")
    assert p["required"] is True
    assert p["protocol_version"] == "5" and p["clean_start"] is False
    assert p["inbound_queue_policy"] == QueuePolicy()
    assert p["spool_policy"] == "block" and p["spool_max_bytes"] == 64 * 1024 * 1024
    assert p["tls_ca"] is None and p["max_hops"] == 8 and p["remote_prefix"] == ""


def test_import_dm_defaults_to_non_persistent(tmp_path: Path) -> None:
    """EMS User's Guide, "transports.conf"."""
    ts, _ = load(tmp_path, "[r]\ntype = rv\n", topics=uses("r"))
    assert ts["r"].params["topic_import_dm"] is DeliveryMode.NON_PERSISTENT
    assert ts["r"].params["queue_import_dm"] is DeliveryMode.NON_PERSISTENT


def test_amqp_and_rv_defaults(tmp_path: Path) -> None:
    ts, _ = load(
        tmp_path,
        "[peer]\ntype = amqp\nurl = amqp://[::1]\nsettle = AT-MOST-ONCE\n\n"
        "[bus]\ntype = tibrv\nservice = 7780\nnetwork = ;239.1.1.1\ndaemon = tcp:host5:7885\n",
        topics=uses("peer", "bus"),
    )
    a = ts["peer"].params
    assert a["url"] == Endpoint("amqp", "::1", 5672)
    assert a["settle"] == "at-most-once"
    assert (a["address_prefix_topic"], a["address_prefix_queue"]) == ("topic://", "queue://")
    r = ts["bus"]
    assert r.type == "rv"
    assert (r.params["service"], r.params["network"], r.params["daemon"]) == (
        7780, ";239.1.1.1", "tcp:host5:7885",
    )  # fmt: skip
    assert r.params["temp_destination_timeout"] == 60.0
    assert "url" not in r.params and "spool_policy" not in r.params


def test_rv_service_by_name_is_its_udp_port(tmp_path: Path) -> None:
    """TIBCO Rendezvous Concepts, "Service Parameter": a name is looked up with
    getservbyname (udp); an empty service looks up ``rendezvous``, else 7500."""
    try:
        ntp = socket.getservbyname("ntp", "udp")
    except OSError:
        pytest.skip("no ntp/udp in this machine's services database")
    try:
        empty = socket.getservbyname("rendezvous", "udp")
    except OSError:
        empty = 7500
    ts, _ = load(tmp_path, "[a]\ntype = rv\nservice = ntp\n\n[b]\ntype = rv\nservice =\n\n"
                 "[c]\ntype = rv\n", topics=uses("a", "b", "c"))
    assert ts["a"].params["service"] == ntp == 123
    assert ts["b"].params["service"] == empty
    assert ts["c"].params["service"] == 7500


def test_stomp_host_port_or_url(tmp_path: Path) -> None:
    ts, _ = load(
        tmp_path,
        "[a]\ntype = stomp\nhost = mq.example\n\n[b]\ntype = stomp\nhost = h\nport = 61000\n"
        "heartbeat = 0,5000\nreceipts = no\n\n[c]\ntype = stomp\nurl = stomps://h2\n",
        topics=uses("a", "b", "c"),
    )
    assert ts["a"].params["url"] == Endpoint("stomp", "mq.example", 61613)
    assert ts["b"].params["port"] == 61000 and ts["b"].params["heartbeat"] == (0, 5000)
    assert ts["b"].params["receipts"] is False
    assert ts["c"].params["url"] == Endpoint("stomps", "h2", 61614)
    assert (ts["c"].params["host"], ts["c"].params["port"]) == ("h2", 61614)
    assert ts["a"].params["topic_prefix"] == "/topic/"


@pytest.mark.parametrize(
    ("body", "line", "message"),
    [
        ("type = carrier-pigeon", 2, "invalid transport type 'carrier-pigeon'"),
        ("type = tibrvcm", 2, "invalid transport type 'tibrvcm'"),
        ("url = mqtt://h", 1, "transport 'x' has no type"),
        ("type = rv\ncolour = blue", 3, "invalid transport parameter 'colour' for type 'rv'"),
        ("type = rv\nurl = mqtt://h", 3, "invalid transport parameter 'url' for type 'rv'"),
        ("type = rv\ntopic_import_dm = DURABLE", 3, "not a delivery mode"),
        ("type = rv\nqueue_import_dm = TIBEMS_SOMETIMES", 3, "not a delivery mode"),
        ("type = rv\nexport_headers = maybe", 3, "not a boolean"),
        ("type = rv\ntype = mqtt", 3, "duplicate specification of transport type"),
        ("type = rv\nservice = 1\nservice = 2", 4, "duplicate specification of parameter 'service'"),
        ("type = rv\nrv_queue_policy = DISCARD_NONE\ninbound_queue_policy = DISCARD_NONE", 4,
         "duplicate specification of parameter 'inbound_queue_policy'"),
        ("type = rv\nservice = no-such-service-x", 3,
         "'no-such-service-x' is neither a port number nor a udp service name"),
        ("type = rv\nservice = 70000", 3, "too large"),
        ("type = rv\nmax_hops = 0", 3, "too small"),
        ("type = mqtt", 1, "needs 'url'"),
        ("type = mqtt\nurl = amqp://h", 3, "the scheme must be mqtt or mqtts"),
        ("type = mqtt\nurl = mqtt://:1883", 3, "names no host"),
        ("type = mqtt\nurl = mqtt://h\nqos = 3", 4, "too large"),
        ("type = mqtt\nurl = mqtt://h\nprotocol_version = 4.0", 4, "not an MQTT protocol version"),
        ("type = mqtt\nurl = mqtt://h\nspool_policy = drop", 4, "not one of block, reject"),
        ("type = mqtt\nurl = mqtt://h\nreconnect_min = 2min\nreconnect_max = 1min", 4,
         "reconnect_min is larger than reconnect_max"),
        ("type = mqtt\nurl = mqtt://h\ntls_ca = nope.pem", 4, "does not exist"),
        ("type = amqp\nurl = amqp://h\nsettle = exactly-once", 4, "not one of"),
        ("type = stomp", 1, "needs 'url' or 'host'"),
        ("type = stomp\nport = 1", 3, "'port' needs 'host'"),
        ("type = stomp\nurl = stomp://h\nhost = h", 4, "give either 'url' or 'host'"),
        ("type = stomp\nhost = h\nheartbeat = 5", 4, "not 'cx,cy'"),
        ("type = rv\njust words", 3, "expected 'key = value'"),
        ('type = rv\nnetwork = "unterminated', 3, "unterminated double quote"),
    ],
)  # fmt: skip
def test_bad_transport(tmp_path: Path, body: str, line: int, message: str) -> None:
    errors = errors_of(tmp_path, f"[x]\n{body}\n")
    assert [n for n, _ in errors] == [line]
    assert message in errors[0][1]


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("type = rv\n", 1, "parameter outside a [transport] section"),
        (
            "[a]\ntype = rv\n[a]\ntype = rv\n",
            3,
            "duplicate transport 'a' (first defined at line 1)",
        ),
        ("[bad name]\ntype = rv\n", 1, "invalid transport name 'bad name'"),
        ("[open\ntype = rv\n", 1, "missing ']'"),
    ],
)
def test_bad_sections(tmp_path: Path, text: str, line: int, message: str) -> None:
    errors = errors_of(tmp_path, text)
    assert [n for n, _ in errors] == [line]
    assert message in errors[0][1]


def test_every_bad_section_is_reported(tmp_path: Path) -> None:
    errors = errors_of(
        tmp_path,
        "[a]\ntype = nope\n[b]\ntype = rv\nbogus = 1\n[c]\n[d]\ntype = mqtt\nurl = x://y\n",
    )
    assert [n for n, _ in errors] == [2, 5, 6, 9]


def test_relative_tls_paths_resolve_against_the_config_dir(tmp_path: Path) -> None:
    (tmp_path).mkdir(exist_ok=True)
    make_cert(tmp_path, "ca")  # loaded: the url is TLS
    ts, warnings = load(
        tmp_path, "[m]\ntype = mqtt\nurl = mqtts://h\ntls_ca = ca.pem\n", topics=uses("m")
    )
    assert ts["m"].params["tls_ca"] == str(tmp_path / "ca.pem")
    assert warnings == []


def test_tls_files_on_a_plain_url_are_a_warning(tmp_path: Path) -> None:
    (tmp_path).mkdir(exist_ok=True)
    (tmp_path / "ca.pem").write_text("x")
    _, warnings = load(
        tmp_path, "[m]\ntype = mqtt\nurl = mqtt://h\ntls_ca = ca.pem\n", topics=uses("m")
    )
    assert len(warnings) == 1 and "transports.conf:4: tls_ca is ignored" in warnings[0]


# -- inbound queue policy (rv_queue_policy) --------------------------------------------
# EMS User's Guide, "Configuring Transports for Rendezvous", rv_queue_policy; appendix
# "Error and Status Messages".


def policy(value: str) -> tuple[QueuePolicy, list[str]]:
    warnings: list[str] = []
    return parse_queue_policy(value, warnings.append), warnings


def test_queue_policy_valid_forms() -> None:
    assert policy("TIBRVQUEUE_DISCARD_FIRST:10000:1000") == (
        QueuePolicy(DiscardPolicy.FIRST, 10000, 1000), [],
    )  # fmt: skip
    assert policy("discard_last:100:50") == (QueuePolicy(DiscardPolicy.LAST, 100, 50), [])
    assert policy("DISCARD_NONE") == (QueuePolicy(), [])
    assert policy("TIBRVQUEUE_DISCARD_NONE:0:0") == (QueuePolicy(), [])


def test_t16_discard_amount_too_big_falls_back_to_none() -> None:
    """EMS User's Guide, appendix "Error and Status Messages"."""
    p, w = policy("TIBRVQUEUE_DISCARD_LAST:100:200")
    assert p == QueuePolicy(DiscardPolicy.NONE, 0, 0)
    assert len(w) == 1 and "too big" in w[0] and "DISCARD_NONE" in w[0]


def test_discard_amount_too_small_warns_but_keeps_the_policy() -> None:
    """EMS User's Guide, appendix "Error and Status Messages": at least 10% of max is
    recommended."""
    p, w = policy("TIBRVQUEUE_DISCARD_FIRST:10000:100")
    assert p == QueuePolicy(DiscardPolicy.FIRST, 10000, 100)
    assert len(w) == 1 and "too small" in w[0]
    assert policy("DISCARD_FIRST:1000:100")[1] == []  # exactly 10%: fine


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("DISCARD_FIRST:0:10", "strictly positive"),
        ("DISCARD_LAST:100:0", "strictly positive"),
        ("DISCARD_LAST:-5:1", "strictly positive"),
        ("DISCARD_MIDDLE:100:10", "unknown or not supported"),
        ("DISCARD_FIRST:lots:10", "error parsing"),
        ("DISCARD_FIRST:100", "error parsing"),
        ("DISCARD_FIRST", "needs :max_msgs:qty_discard"),
    ],
)
def test_bad_queue_policies_warn_and_give_none(value: str, message: str) -> None:
    p, w = policy(value)
    assert p == QueuePolicy()
    assert len(w) == 1 and message in w[0]


def test_queue_policy_warning_names_file_and_line(tmp_path: Path) -> None:
    ts, warnings = load(
        tmp_path,
        "[rv1]\ntype = rv\nrv_queue_policy = TIBRVQUEUE_DISCARD_LAST:100:200\n",
        topics=uses("rv1"),
    )
    assert ts["rv1"].params["inbound_queue_policy"] == QueuePolicy()
    assert len(warnings) == 1
    assert warnings[0].startswith(f"{tmp_path / 'transports.conf'}:3: ")


def test_queue_policy_on_other_types(tmp_path: Path) -> None:
    ts, _ = load(
        tmp_path,
        "[m]\ntype = mqtt\nurl = mqtt://h\ninbound_queue_policy = DISCARD_FIRST:1000:100\n",
        topics=uses("m"),
    )
    assert ts["m"].params["inbound_queue_policy"] == QueuePolicy(DiscardPolicy.FIRST, 1000, 100)


# -- cross-file warnings ---------------------------------------------------------------


def test_unused_and_disabled_transports_are_warnings(tmp_path: Path) -> None:
    cfg = load_config(
        write(
            tmp_path,
            gateway="rv_transports = enabled\n",
            topics='>\na import="m"\nb export="r"\n',
            queues=">",
            transports="[m]\ntype = mqtt\nurl = mqtt://h\n[r]\ntype = rv\n[idle]\ntype = rv\n",
        )
    )
    assert set(cfg.transports) == {"m", "r", "idle"}
    assert len(cfg.warnings) == 2
    assert (
        "transports.conf:1: transport 'm' will not run: mqtt_transports is disabled"
        in (cfg.warnings[0])
    )
    assert (
        "transports.conf:6: transport 'idle' is not named in any import or export"
        in (cfg.warnings[1])
    )


def test_destination_naming_a_broken_transport_is_not_reported_twice(tmp_path: Path) -> None:
    write(
        tmp_path,
        topics='t import="m"\n',
        queues=">",
        transports="[m]\ntype = mqtt\n",
    )
    with pytest.raises(ConfigErrors) as ei:
        load_config(tmp_path)
    assert [(os.path.basename(e.file), e.line) for e in ei.value.errors] == [("transports.conf", 1)]


def test_rv_certified_parameters(tmp_path: Path) -> None:
    t, _ = load(tmp_path, "[bus]\ntype = rv\ncm_name = GW.ONE\nledger_file = gw.ledger\n"
                          "sync_ledger = true\nrequest_old = true\ndefault_ttl = 600\n"
                          "cm_listener = DB orders.new, AUDIT orders.new\n"
                          "explicit_config_only = true\n")
    p = t["bus"].params
    assert p["cm_name"] == "GW.ONE"
    assert p["ledger_file"] == str(tmp_path / "gw.ledger")
    assert (p["sync_ledger"], p["request_old"], p["explicit_config_only"]) == (True, True, True)
    assert p["default_ttl"] == 600.0
    assert p["cm_listener"] == (("DB", "orders.new"), ("AUDIT", "orders.new"))
    t, _ = load(tmp_path / "plain", "[bus]\ntype = rv\n")
    p = t["bus"].params
    assert (p["cm_name"], p["ledger_file"], p["cm_listener"], p["default_ttl"]) == (
        None, None, (), 0.0)


@pytest.mark.parametrize(("text", "detail"), [
    ("ledger_file = x.ledger", "ledger_file needs cm_name"),
    ("cm_listener = DB a.b", "cm_listener needs cm_name"),
    ("cm_name = A.*", "takes no wildcard"),
    ("cm_name = _A", "starts with '_'"),
    ("cm_name = GW\ncm_listener = DB orders.>", "takes no wildcard"),
    ("cm_name = GW\ncm_listener = DB", "is not 'NAME SUBJECT'"),
])
def test_rv_certified_parameters_refused(tmp_path: Path, text: str, detail: str) -> None:
    errors = errors_of(tmp_path, f"[bus]\ntype = rv\n{text}\n")
    assert any(detail in message for _, message in errors), errors
