"""Config loading: shared syntax (files.py), gateway.conf, the loader and the embedded default.

Destinations, security and transports have their own test_config_*.py files.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from corehelp import make_cert

from gateway.config import (
    DEFAULT_CONFIG_DIR,
    GatewaySettings,
    Listener,
    OverflowPolicy,
    load_config,
    parse_bool,
    parse_duration_ms,
    parse_listener,
    parse_size,
)
from gateway.config.files import (
    MAX_LINE_LENGTH,
    parse_list,
    read_lines,
    split_outside_quotes,
    strip_comment,
)
from gateway.errors import ConfigError, ConfigErrors


def write(d: Path, **files: str) -> Path:
    """Write ``name.conf`` for each keyword (``gateway="..."`` -> gateway.conf)."""
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / f"{name}.conf").write_text(text)
    return d


def load_errors(d: Path, **files: str) -> list[ConfigError]:
    write(d, **files)
    with pytest.raises(ConfigErrors) as ei:
        load_config(d)
    return ei.value.errors


def where(errors: list[ConfigError]) -> list[tuple[str, int | None]]:
    return [(os.path.basename(e.file), e.line) for e in errors]


# -- shared value syntax (TIBCO EMS User's Guide, "Mechanics of Configuration") -------


@pytest.mark.parametrize("word", ["enable", "enabled", "true", "yes", "on", "ON", "Yes"])
def test_true_words(word: str) -> None:
    assert parse_bool(word) is True


@pytest.mark.parametrize("word", ["disable", "disabled", "false", "no", "off", "OFF"])
def test_false_words(word: str) -> None:
    assert parse_bool(word) is False


@pytest.mark.parametrize("word", ["1", "0", "y", "", "truth"])
def test_bad_boolean(word: str) -> None:
    with pytest.raises(ValueError, match="not a boolean"):
        parse_bool(word)


@pytest.mark.parametrize(
    ("text", "n"),
    [("0", 0), ("1000", 1000), ("1KB", 1024), ("2mb", 2 * 1048576), ("1GB", 1073741824),
     ("1000KB", 1_024_000)],
)  # fmt: skip
def test_sizes(text: str, n: int) -> None:
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["-1", "1TB", "KB", "1.5MB", "1 K B", ""])
def test_bad_sizes(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "ms"),
    [("10", 10_000), ("500msec", 500), ("30sec", 30_000), ("10min", 600_000),
     ("2hour", 7_200_000), ("1day", 86_400_000), ("0", 0), ("3HOURS", 10_800_000)],
)  # fmt: skip
def test_durations(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


def test_duration_bare_unit_can_be_milliseconds() -> None:
    assert parse_duration_ms("250", bare_unit_ms=1) == 250


@pytest.mark.parametrize("text", ["10 fortnights", "min", "-5sec", "1.5sec"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration_ms(text)


def test_comment_stripping_respects_quotes() -> None:
    assert strip_comment('a = "x # y" # note') == 'a = "x # y"'
    assert strip_comment("a = b#c") == "a = b#c"  # no blank before '#': part of the value
    assert strip_comment("a = b\t# c") == "a = b"


def test_split_outside_quotes() -> None:
    assert split_outside_quotes('a, import="x,y", b') == ["a", 'import="x,y"', "b"]
    with pytest.raises(ValueError, match="unterminated"):
        split_outside_quotes('import="x,y')


def test_parse_list() -> None:
    assert parse_list('"TLS, TRANSPORTS"') == ["TLS", "TRANSPORTS"]
    with pytest.raises(ValueError, match="empty element"):
        parse_list("a,,b")


def test_read_lines_numbers_skip_comments_and_blanks(tmp_path: Path) -> None:
    p = tmp_path / "x.conf"
    p.write_text("# head\n\n  a = 1  \n   # indented comment\nb = 2 # trailing\n")
    errors: list[ConfigError] = []
    lines = read_lines(p, errors)
    assert lines is not None and errors == []
    assert [(sl.line, sl.text) for sl in lines] == [(3, "a = 1"), (5, "b = 2")]


def test_read_lines_missing_file_is_none(tmp_path: Path) -> None:
    assert read_lines(tmp_path / "nope.conf", []) is None


def test_overlong_and_non_utf8_lines_are_errors_with_line_numbers(tmp_path: Path) -> None:
    p = tmp_path / "x.conf"
    p.write_bytes(b"a = 1\n" + b"b = " + b"x" * MAX_LINE_LENGTH + b"\nc = \xff\xfe\nd = 4\n")
    errors: list[ConfigError] = []
    lines = read_lines(p, errors)
    assert lines is not None
    assert [sl.line for sl in lines] == [1, 4]
    assert [e.line for e in errors] == [2, 3]
    assert "256000" in errors[0].detail
    assert "UTF-8" in errors[1].detail


def test_line_at_the_limit_is_accepted(tmp_path: Path) -> None:
    p = tmp_path / "x.conf"
    p.write_bytes(b"a" * MAX_LINE_LENGTH + b"\n")
    errors: list[ConfigError] = []
    assert read_lines(p, errors) is not None and errors == []


# -- gateway.conf ---------------------------------------------------------------------


def test_empty_gateway_conf_gives_defaults(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, gateway="", topics=">", queues=">"))
    gw = cfg.gateway
    assert gw.server == "gateway"
    assert gw.store == str(tmp_path / "data")  # relative to the config directory
    assert gw.delivery_log_dir == str(tmp_path / "data" / "delivery-log")
    assert (gw.store_type, gw.store_sync, gw.delivery_log) == ("sqlite", True, True)
    assert (gw.authorization, gw.allow_anonymous, gw.flow_control) == (False, True, False)
    assert gw.max_msg_memory == 512 * 1024 * 1024
    assert gw.selector_logical_operator_limit == 5000
    assert not any(gw.transports_enabled(t) for t in ("mqtt", "amqp", "stomp", "rv"))
    assert gw.listen_backlog == 0  # the system's maximum (tests/interop/test_listen_backlog.py)
    assert [(lst.scheme, lst.host, lst.port) for lst in gw.listen] == [
        ("mqtt", "127.0.0.1", 1883),
        ("amqp", "127.0.0.1", 5672),
        ("stomp", "127.0.0.1", 61613),
        ("http", "127.0.0.1", 8080),
    ]
    assert cfg.warnings == []


def test_every_parameter_is_read_and_typed(tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path / "certs", "cert")  # loaded: a TLS listener is configured
    key.rename(tmp_path / "certs" / "key.pem")
    (tmp_path / "certs" / "ca.pem").write_bytes(cert.read_bytes())
    text = """
        server = edge-1
        listen = mqtts://0.0.0.0:8883
        listen = stomp://[::1]:61613
        store = /var/lib/gw
        store_type = memory
        store_sync = off
        delivery_log = no
        delivery_log_dir = logs
        delivery_log_max_file_size = 10MB
        authorization = enabled
        allow_anonymous = disabled
        flow_control = yes
        max_msg_memory = 1GB
        max_client_msg_size = 2MB
        max_connections = 100
        listen_backlog = 2048
        selector_logical_operator_limit = 0
        mqtt_transports = enabled
        amqp_transports = true
        stomp_transports = on
        rv_transports = enable
        startup_abort_list = "SSL, transports, CONFIG_ERRORS"
        tls_cert = certs/cert.pem
        tls_key = certs/key.pem
        tls_ca = certs/ca.pem
        tls_require_client_cert = true
        mqtt_max_keepalive = 120
        log_level = DEBUG
    """
    gw = load_config(write(tmp_path, gateway=text, topics=">", queues=">")).gateway
    assert gw == GatewaySettings(
        server="edge-1",
        listen=(Listener("mqtts", "0.0.0.0", 8883), Listener("stomp", "::1", 61613)),
        store="/var/lib/gw",
        store_type="memory",
        store_sync=False,
        delivery_log=False,
        delivery_log_dir=str(tmp_path / "logs"),
        delivery_log_max_file_size=10 * 1024 * 1024,
        authorization=True,
        allow_anonymous=False,
        flow_control=True,
        max_msg_memory=1024**3,
        max_client_msg_size=2 * 1024 * 1024,
        max_connections=100,
        listen_backlog=2048,
        selector_logical_operator_limit=0,
        mqtt_transports=True,
        amqp_transports=True,
        stomp_transports=True,
        rv_transports=True,
        startup_abort_list=frozenset({"TLS", "TRANSPORTS", "CONFIG_ERRORS"}),
        tls_cert=str(tmp_path / "certs" / "cert.pem"),
        tls_key=str(tmp_path / "certs" / "key.pem"),
        tls_ca=str(tmp_path / "certs" / "ca.pem"),
        tls_require_client_cert=True,
        mqtt_max_keepalive=120,
        log_level="debug",
    )
    assert gw.listen[0].tls and not gw.listen[1].tls
    assert gw.listen[0].line == 3  # the line is kept (not compared)
    assert gw.aborts_on("tls") and not gw.aborts_on("DB_FILES")


def test_allow_anonymous_without_authorization_is_a_warning(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, gateway="allow_anonymous = disabled\n", topics=">",
                            queues=">"))
    assert cfg.warnings == [f"{tmp_path / 'gateway.conf'}:1: allow_anonymous = disabled has no "
                            "effect while authorization is disabled: every connection is accepted"]
    cfg = load_config(write(tmp_path, gateway="allow_anonymous = disabled\n"
                                              "authorization = enabled\n", topics=">", queues=">"))
    assert cfg.warnings == []


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("colour = blue", "unknown parameter 'colour'"),
        ("tibrv_transports = enabled", "unknown parameter"),
        ("authorization = maybe", "authorization: 'maybe' is not a boolean"),
        ("just words", "expected 'name = value'"),
        ("server = a.b", "may not contain '.'"),
        ("server = " + "x" * 65, "1 to 64 characters"),
        ("store_type = oracle", "not one of sqlite, memory"),
        ("max_msg_memory = lots", "not a size"),
        ("max_client_msg_size = 3GB", "maximum of 2GB"),
        ("max_connections = -1", "too small"),
        ("listen_backlog = -1", "too small"),
        ("listen_backlog = 65536", "too large; the maximum is 65535"),
        ("mqtt_max_keepalive = 65536", "too large; the maximum is 65535"),
        ("startup_abort_list = TRANSPORTS,MULTICAST", "'MULTICAST' is not one of"),
        ("log_level = chatty", "not one of debug"),
        ('server = "unterminated', "unterminated double quote"),
        ("tls_cert = missing.pem", "does not exist"),
        ("listen = mqtt//x:1", "not scheme://host:port"),
        ("listen = foo://host", "a port is required for scheme 'foo'"),
        ("listen = mqtt://host:99999", "not a port"),
        ("listen = mqtt://host:1883/path", "may not have a path"),
        ("listen = mqtt://[::1:1883", "unclosed '['"),
        ("listen = mqtt://[nothex]:1883", "not an IPv6 address"),
        ("listen = mqtt://bad host:1", "not a host name"),
    ],
)
def test_bad_gateway_conf_line(tmp_path: Path, line: str, message: str) -> None:
    errors = load_errors(tmp_path, gateway=f"# first\n\n{line}\n", topics=">", queues=">")
    assert where(errors) == [("gateway.conf", 3)]
    assert message in errors[0].detail
    assert str(errors[0]).startswith(f"{tmp_path / 'gateway.conf'}:3: ")


def test_duplicate_parameter_names_the_first_line(tmp_path: Path) -> None:
    errors = load_errors(tmp_path, gateway="server = a\nstore = x\nserver = b\n")
    assert where(errors) == [("gateway.conf", 3)]
    assert "first set at line 1" in errors[0].detail


def test_listen_variants() -> None:
    assert parse_listener("mqtt://127.0.0.1") == Listener("mqtt", "127.0.0.1", 1883)
    assert parse_listener("amqps://h") == Listener("amqps", "h", 5671)
    assert parse_listener("stomp://7222") == Listener("stomp", "", 7222)  # EMS tcp://7222
    assert parse_listener("stomp://:61613") == Listener("stomp", "", 61613)
    assert parse_listener("http://*:0") == Listener("http", "", 0)
    assert parse_listener("ws://[fe80::1]:9000").url() == "ws://[fe80::1]:9000"
    assert parse_listener("MQTT://Host.example:1") == Listener("mqtt", "Host.example", 1)


def test_duplicate_listen_address(tmp_path: Path) -> None:
    errors = load_errors(
        tmp_path,
        gateway="listen = mqtt://127.0.0.1:1883\nlisten = stomp://:1883\n"
        "listen = http://localhost:0\nlisten = http://localhost:0\n",
        users='admin:secret:""\n',  # the admin API beyond loopback needs it (test_admin_auth)
    )
    assert where(errors) == [("gateway.conf", 2)]  # port 0 (ephemeral) may repeat
    assert "same address as line 1" in errors[0].detail


def test_listen_none(tmp_path: Path) -> None:
    gw = load_config(write(tmp_path, gateway="listen = none\n", topics=">")).gateway
    assert gw.listen == ()
    errors = load_errors(tmp_path, gateway="listen = none\nlisten = mqtt://h:1\n")
    assert where(errors) == [("gateway.conf", 1)]


def test_tls_listener_needs_certificate(tmp_path: Path) -> None:
    errors = load_errors(tmp_path,
                         gateway="listen = mqtt://127.0.0.1:1\nlisten = mqtts://127.0.0.1:2\n")
    assert where(errors) == [("gateway.conf", 2)]
    assert "tls_cert is not set" in errors[0].detail


def test_tls_key_without_cert_and_client_cert_without_ca(tmp_path: Path) -> None:
    (tmp_path / "k.pem").parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "k.pem").write_text("k")
    errors = load_errors(tmp_path, gateway="tls_key = k.pem\ntls_require_client_cert = yes\n")
    assert where(errors) == [("gateway.conf", 1), ("gateway.conf", 2)]


def test_absolute_paths_stay(tmp_path: Path) -> None:
    gw = load_config(write(tmp_path / "c", gateway=f"store = {tmp_path / 's'}\n")).gateway
    assert gw.store == str(tmp_path / "s")
    assert gw.delivery_log_dir == str(tmp_path / "s" / "delivery-log")


# -- loader ---------------------------------------------------------------------------


def test_every_bad_line_of_every_file_is_reported_in_order(tmp_path: Path) -> None:
    errors = load_errors(
        tmp_path,
        gateway="server = ok\nbogus = 1\nflow_control = sometimes\n",
        topics="foo.* secure\nfoo.bar maxbytes=lots\n>\nbar..baz\n",
        queues='q exclusive,export="x"\n',
        users="alice:pw\njustaname\n",
        acl="TOPIC=foo USER=alice PERM=fly\n",
        transports="[t]\ntype = carrier-pigeon\n",
    )
    assert where(errors) == [
        ("gateway.conf", 2),
        ("gateway.conf", 3),
        ("topics.conf", 2),
        ("topics.conf", 4),
        ("queues.conf", 1),
        ("users.conf", 2),
        ("acl.conf", 1),
        ("transports.conf", 2),
    ]
    text = str(ConfigErrors(errors))
    assert text.count("\n") == len(errors) - 1


def test_missing_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigErrors) as ei:
        load_config(tmp_path / "nope")
    assert "does not exist" in str(ei.value)
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigErrors, match="not a directory"):
        load_config(tmp_path / "file")


def test_missing_files_are_empty_but_warned_about(tmp_path: Path) -> None:
    tmp_path.mkdir(exist_ok=True)
    cfg = load_config(tmp_path)
    assert cfg.gateway.server == "gateway"
    assert cfg.topics.resolve("a") is None and cfg.queues.resolve("a") is None
    assert len(cfg.warnings) == 2
    assert "topics.conf" in cfg.warnings[0] and "no topic can be created" in cfg.warnings[0]
    assert cfg.transports == {} and cfg.security.users == {}


def test_embedded_default_works_out_of_the_box(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None)
    assert cfg.embedded and cfg.dir == DEFAULT_CONFIG_DIR
    assert cfg.warnings == []
    gw = cfg.gateway
    assert {lst.host for lst in gw.listen} == {"127.0.0.1"}
    assert {lst.scheme for lst in gw.listen} == {"mqtt", "amqp", "stomp", "http"}
    assert gw.store == str(tmp_path / "data")  # the working directory, not the package
    assert gw.authorization is False and gw.allow_anonymous is True
    for name in ("a", "sensors.kitchen.temp", "x.y.z.w"):
        tp = cfg.topics.resolve(name)
        qp = cfg.queues.resolve(name)
        assert tp is not None and tp.prefetch == 64 and not tp.secure
        assert qp is not None and qp.prefetch == 5
        assert qp.overflow_policy is OverflowPolicy.DEFAULT
    assert cfg.transports == {}
    assert cfg.security.check(None, "topic", "a", "publish") is False  # no grants at all


def test_embedded_default_files_exist() -> None:
    names = sorted(p.name for p in DEFAULT_CONFIG_DIR.glob("*.conf"))
    assert names == sorted(
        ["gateway.conf", "topics.conf", "queues.conf", "users.conf", "groups.conf", "acl.conf",
         "transports.conf"]
    )  # fmt: skip


def test_config_table_by_kind(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, topics="t.>", queues="q.>"))
    assert cfg.table("topic").resolve("t.x") is not None
    assert cfg.table("queue").resolve("t.x") is None


def test_fault_tolerance_parameters(tmp_path):
    from gateway.config import load_config

    (tmp_path / "gateway.conf").write_text(
        "ft_group = GW.PAIR\nft_service = 7504\nft_network = 127.0.0.1;239.192.75.4\n"
        "ft_weight = 20\nft_heartbeat = 500 msec\nft_activation = 2\n")
    gw = load_config(tmp_path).gateway
    assert (gw.ft_group, gw.ft_service, gw.ft_network, gw.ft_weight) == (
        "GW.PAIR", 7504, "127.0.0.1;239.192.75.4", 20)
    assert (gw.ft_heartbeat, gw.ft_activation) == (0.5, 2.0)
    (tmp_path / "gateway.conf").write_text("ft_group = G\nft_heartbeat = 3\n")
    with pytest.raises(ConfigErrors, match="ft_heartbeat must be less than ft_activation"):
        load_config(tmp_path)
