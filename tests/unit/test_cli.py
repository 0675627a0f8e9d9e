"""The `gateway` command: serve starts, logs where it listens, and stops cleanly on signals."""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pytest
from adminapi import admin_get
from corehelp import make_cert, write_config

ROOT = Path(__file__).resolve().parent.parent.parent


def start(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", *args], cwd=cwd, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def wait_for(proc: subprocess.Popen[str], pattern: str, lines: list[str]) -> re.Match[str]:
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(pattern, line)
        if m:
            return m
    raise AssertionError(f"{pattern!r} not seen; output:\n{''.join(lines)}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_logs_its_listener_answers_and_stops_on_signal(tmp_path, sig):
    write_config(tmp_path, gateway="listen = http://127.0.0.1:0\n")
    proc = start(["serve", "--config-dir", str(tmp_path)], tmp_path)
    lines: list[str] = []
    try:
        m = wait_for(proc, r"listening for http on 127\.0\.0\.1:(\d+)", lines)
        port = int(m.group(1))
        wait_for(proc, r"gateway ready", lines)
        info = admin_get(port, "/api/v1/server", timeout=5)
        assert info["queues"] >= 1 and "published" in info
        # serve tuned the collector once started (gateway.server.tune_gc)
        assert info["gc"]["threshold"][0] == 20_000 and info["gc"]["frozen"] > 0
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, "".join(lines) + out
    assert "gateway stopped" in out


def test_serve_refuses_a_bad_config_naming_file_and_line(tmp_path):
    write_config(tmp_path, queues="ok.queue\nbad..name\n", gateway="max_msg_memory = lots\n")
    proc = start(["serve", "--config-dir", str(tmp_path)], tmp_path)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert "queues.conf:2" in out
    assert "gateway.conf:1" in out


def test_check_config(tmp_path):
    write_config(tmp_path)
    ok = start(["check-config", str(tmp_path)], tmp_path)
    assert ok.communicate(timeout=30)[0].strip().endswith("configuration is valid")
    assert ok.returncode == 0
    write_config(tmp_path, topics="a.b maxmsgs=x\n")
    bad = start(["check-config", str(tmp_path)], tmp_path)
    out = bad.communicate(timeout=30)[0]
    assert bad.returncode == 1 and "topics.conf:1" in out


def test_version_and_help():
    from gateway import __version__

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    v = subprocess.run([sys.executable, "-m", "gateway", "--version"], capture_output=True,
                       text=True, env=env, timeout=60)
    import gateway.message

    build = "pure Python" if gateway.message.__file__.endswith(".py") else "compiled"
    assert (v.returncode, v.stdout.strip()) == (0, f"gateway {__version__} ({build})")
    h = subprocess.run([sys.executable, "-m", "gateway", "--help"], capture_output=True,
                       text=True, env=env, timeout=60)
    assert h.returncode == 0 and "protocol gateway" in h.stdout and "check-config" in h.stdout


def test_passwd_hash_is_accepted_by_users_conf(tmp_path):
    p = subprocess.run([sys.executable, "-m", "gateway", "passwd"], input="s3cret\n",
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                       timeout=60)
    hashed = p.stdout.strip()
    assert hashed.startswith("$") and "s3cret" not in hashed
    from gateway.config import load_config

    write_config(tmp_path, users=f'carol:{hashed}:"Carol"\n')
    sec = load_config(str(tmp_path)).security
    assert sec.authenticate("carol", "s3cret")
    assert not sec.authenticate("carol", "wrong")


def test_a_listener_of_an_unknown_protocol_refuses_to_start(tmp_path):
    write_config(tmp_path, gateway="listen = http://127.0.0.1:0\nlisten = xmpp://127.0.0.1:0\n")
    proc = start(["serve", "--config-dir", str(tmp_path)], tmp_path)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2, out
    assert "gateway.conf:2" in out and "unknown listener protocol 'xmpp'" in out


def test_a_store_another_gateway_holds_is_a_clear_error(tmp_path):
    write_config(tmp_path, gateway="listen = http://127.0.0.1:0\n")
    first = start(["serve", "--config-dir", str(tmp_path)], tmp_path)
    lines: list[str] = []
    try:
        wait_for(first, r"gateway ready", lines)
        second = start(["serve", "--config-dir", str(tmp_path)], tmp_path)
        out, _ = second.communicate(timeout=30)
        assert second.returncode == 1, out
        assert "gateway: cannot start: store" in out and "in use by another gateway" in out
        assert "Traceback" not in out
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0


def test_a_store_directory_that_cannot_be_made_is_a_clear_error(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    write_config(tmp_path, gateway=f"store = {tmp_path / 'file' / 'data'}\n")
    proc = start(["serve", "--config-dir", str(tmp_path)], tmp_path)
    out, _ = proc.communicate(timeout=30)
    # found when the configuration loads (gateway.config.checks), as check-config finds it
    assert proc.returncode == 2, out
    assert (f"gateway.conf:1: store: '{tmp_path / 'file' / 'data'}' is under "
            f"'{tmp_path / 'file'}', a file") in out
    assert "Traceback" not in out


def test_a_required_transport_that_cannot_connect_stops_the_start_with_a_clear_error(tmp_path):
    import socket

    with socket.socket() as s:  # a loopback port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    write_config(tmp_path, gateway="mqtt_transports = enabled\n",
                 transports=f"[far]\ntype = mqtt\nurl = mqtt://127.0.0.1:{port}\n"
                            "required = true\nreconnect_max = 1sec\n")
    proc = start(["serve", "--config-dir", str(tmp_path)], tmp_path)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    assert "gateway: cannot start:" in out and "transport 'far' is required" in out
    assert "transports.conf:1" in out and "Traceback" not in out
    assert "gateway stopped" in out  # what had started was stopped in order


def test_tune_gc_freezes_start_up_and_raises_the_young_threshold():
    from gateway.server import GC_THRESHOLD, tune_gc

    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold() == (GC_THRESHOLD, before[1], before[2])
        assert gc.get_freeze_count() > 0

        class Node:
            pass

        node = Node()
        node.self = node  # type: ignore[attr-defined]  # a cycle, made after tuning
        ref = weakref.ref(node)
        del node
        gc.collect()
        assert ref() is None  # still collected
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


# -- check-config refuses what serve refuses (gateway.config.checks) --------------------------


def refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, message: str,
            **files: str) -> None:
    """check-config exits 1 and serve 2, both printing ``where: ...message...``."""
    from gateway.cli import main

    write_config(tmp_path, **files)
    assert main(["check-config", str(tmp_path)]) == 1
    checked = capsys.readouterr().err
    assert main(["serve", "--config-dir", str(tmp_path)]) == 2
    served = capsys.readouterr().err
    assert "configuration errors, not starting" in served
    for out in (checked, served):
        line = next((x for x in out.splitlines() if where in x), None)
        assert line is not None, out
        assert message in line, out
        assert "Traceback" not in out
    assert not (tmp_path / "data").exists()  # serve stopped before opening the store


def test_refused_an_unknown_listener_protocol(tmp_path, capsys):
    refused(tmp_path, capsys, "gateway.conf:2:", "unknown listener protocol 'bogus'",
            gateway="listen = mqtt://127.0.0.1:0\nlisten = bogus://1.2.3.4:99\n")


def test_refused_a_listener_protocol_not_installed(tmp_path, capsys, monkeypatch):
    from gateway import registry

    monkeypatch.setitem(registry.ADAPTERS, "stomp", "no_such_package.server:start")
    refused(tmp_path, capsys, "gateway.conf:1:",
            "listen stomp://127.0.0.1:0: no_such_package.server is not available in this build",
            gateway="listen = stomp://127.0.0.1:0\n")


def test_refused_a_listener_host_that_does_not_resolve(tmp_path, capsys):
    refused(tmp_path, capsys, "gateway.conf:1:",
            "'no-such-host.invalid' is neither an IP address nor a host name that resolves",
            gateway="listen = mqtt://no-such-host.invalid:1883\n")


@pytest.mark.parametrize("first,second", [
    ("amqp://0.0.0.0:5672", "stomp://127.0.0.1:5672"),      # the wildcard of its family
    ("mqtt://:1883", "stomp://[::1]:1883"),                 # every interface, both families
    ("mqtt://127.0.0.1:1883", "http://localhost:1883"),      # a name and its address
])
def test_refused_two_listeners_on_one_address(tmp_path, capsys, first, second):
    refused(tmp_path, capsys, "gateway.conf:2:", "line 1",
            gateway=f"listen = {first}\nlisten = {second}\n")


def test_listeners_on_different_families_or_addresses_are_not_refused(tmp_path):
    from gateway.config import load_config

    write_config(tmp_path, gateway="listen = mqtt://0.0.0.0:1883\nlisten = mqtt://[::]:1883\n"
                                   "listen = stomp://127.0.0.1:61613\n"
                                   "listen = stomp://[::1]:61613\n")
    assert len(load_config(tmp_path).gateway.listen) == 4


def test_refused_a_tls_certificate_that_is_not_pem(tmp_path, capsys):
    (tmp_path / "cert.pem").write_text("not a certificate\n")
    refused(tmp_path, capsys, "gateway.conf:2:", "tls_cert: cannot load the certificate",
            gateway="listen = mqtts://127.0.0.1:0\ntls_cert = cert.pem\n")


def test_refused_a_tls_key_that_is_not_the_certificates(tmp_path, capsys):
    cert, _ = make_cert(tmp_path, "one")
    _, other_key = make_cert(tmp_path, "two")
    refused(tmp_path, capsys, "gateway.conf:2:", "tls_cert: cannot load the certificate",
            gateway=f"listen = amqps://127.0.0.1:0\ntls_cert = {cert}\ntls_key = {other_key}\n")


def test_refused_a_tls_ca_that_is_not_pem(tmp_path, capsys):
    cert, key = make_cert(tmp_path, "one")
    (tmp_path / "ca.pem").write_text("not a CA bundle\n")
    refused(tmp_path, capsys, "gateway.conf:4:", "tls_ca: cannot load the CA certificates",
            gateway=f"listen = https://127.0.0.1:0\ntls_cert = {cert}\ntls_key = {key}\n"
                    "tls_ca = ca.pem\n")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_refused_an_unreadable_tls_key(tmp_path, capsys):
    cert, key = make_cert(tmp_path, "one")
    key.chmod(0)
    refused(tmp_path, capsys, "gateway.conf:2:", "Permission denied",
            gateway=f"listen = stomps://127.0.0.1:0\ntls_cert = {cert}\ntls_key = {key}\n")


def test_a_good_tls_certificate_passes(tmp_path):
    from gateway.config import load_config

    cert, key = make_cert(tmp_path, "one")
    write_config(tmp_path, gateway=f"listen = mqtts://127.0.0.1:0\ntls_cert = {cert}\n"
                                   f"tls_key = {key}\ntls_ca = {cert}\n")
    assert load_config(tmp_path).gateway.tls_cert == str(cert)


def test_refused_a_transport_tls_certificate_that_does_not_load(tmp_path, capsys):
    (tmp_path / "client.pem").write_text("not a certificate\n")
    refused(tmp_path, capsys, "transports.conf:4:", "tls_cert: cannot load the certificate",
            gateway="mqtt_transports = enabled\n", topics=">\na.> export=\"far\"\n",
            transports="[far]\ntype = mqtt\nurl = mqtts://127.0.0.1:8883\n"
                       "tls_cert = client.pem\n")


def test_refused_a_store_under_a_file(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    refused(tmp_path, capsys, "gateway.conf:1:", "is under",
            gateway=f"store = {tmp_path / 'file' / 'data'}\n")


def test_refused_a_mapping_that_does_not_compile(tmp_path, capsys):
    (tmp_path / "mappings").mkdir()
    (tmp_path / "mappings" / "bad.yaml").write_text(
        "mappings:\n  - match: {destination: '>', direction: in}\n"
        "    steps:\n      - no_such_step: {}\n")
    refused(tmp_path, capsys, "bad.yaml:", "no_such_step")


def test_refused_a_router_bus_on_an_interface_of_another_host(tmp_path, capsys):
    refused(tmp_path, capsys, "routers.conf:1:", "192.0.2.1 is neither an address of this host",
            routers="[r]\nbus = A 7500 192.0.2.1;239.192.80.1\n"
                    "bus = B 7500 127.0.0.1;239.192.80.2\n")


def test_refused_an_rv_transport_with_a_bad_network(tmp_path, capsys):
    refused(tmp_path, capsys, "transports.conf:1:", "is not a multicast address",
            gateway="rv_transports = enabled\n", topics=">\na.> export=\"bus\"\n",
            transports="[bus]\ntype = rv\nnetwork = 127.0.0.1;10.0.0.1\n")


# -- log_format and log_level (gateway.logconf) ----------------------------------------------


def test_json_log_lines_carry_time_level_logger_message_and_exception():
    import json
    import logging

    from gateway.logconf import JsonFormatter

    fmt = JsonFormatter()
    record = logging.LogRecord("gateway.test", logging.WARNING, __file__, 1, "a %s b", ("x",),
                               None)
    record.created = 0.25
    assert json.loads(fmt.format(record)) == {
        "time": "1970-01-01T00:00:00.250Z", "level": "warning", "logger": "gateway.test",
        "message": "a x b"}
    try:
        raise ValueError("broken\nover two lines")
    except ValueError:
        failed = logging.LogRecord("gateway", logging.ERROR, __file__, 2, "failed", None,
                                   sys.exc_info())
    line = fmt.format(failed)
    assert "\n" not in line
    obj = json.loads(line)
    assert obj["level"] == "error" and obj["message"] == "failed"
    assert obj["exception"].startswith("Traceback") and "over two lines" in obj["exception"]


def test_serve_logs_json_at_the_configured_level(tmp_path):
    import json

    write_config(tmp_path, gateway="listen = http://127.0.0.1:0\nlog_format = json\n"
                                   "log_level = warning\nallow_anonymous = disabled\n")
    proc = start(["serve", "--config-dir", str(tmp_path)], tmp_path)
    lines: list[str] = []
    try:
        wait_for(proc, r"gateway ready", lines)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, "".join(lines) + out
    logged = [json.loads(x) for x in [*lines, *out.splitlines()] if x.startswith("{")]
    assert logged, "".join(lines) + out  # the warning on allow_anonymous
    assert all(set(r) >= {"time", "level", "logger", "message"} for r in logged)
    assert all(r["level"] in ("warning", "error", "critical") for r in logged)
    assert not any("listening for" in x for x in lines + out.splitlines())  # info: not shown
    # --log-level overrides gateway.conf
    proc = start(["--log-level", "INFO", "serve", "--config-dir", str(tmp_path)], tmp_path)
    lines = []
    try:
        m = wait_for(proc, r'"message": "listening for http on 127\.0\.0\.1:\d+"', lines)
        assert json.loads(m.string)["level"] == "info"
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
