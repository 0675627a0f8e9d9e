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
from corehelp import write_config

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
    assert proc.returncode == 1, out
    assert f"gateway: cannot start: cannot make the store directory {tmp_path / 'file'}" in out
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
