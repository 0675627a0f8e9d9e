"""MQTT over TLS (mqtts) with paho, and the mosquitto command-line clients against the gateway."""

from __future__ import annotations

import shutil
import ssl
import subprocess

import corehelp
import paho.mqtt.client as mqtt
import pytest
from gw import GatewayThread
from paho.mqtt.enums import CallbackAPIVersion
from test_mqtt_paho import V5, Client


def make_cert(directory) -> tuple[str, str]:
    """corehelp's test certificate, as the strings these tests put in config lines."""
    cert, key = corehelp.make_cert(directory)
    return str(cert), str(key)


def test_mqtts_listener(tmp_path):
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make a test certificate")
    cert, key = make_cert(tmp_path)
    with GatewayThread(
        tmp_path / "gw",
        gateway=(f"listen = mqtts://127.0.0.1:0\nlisten = mqtt://127.0.0.1:0\n"
                 f"tls_cert = {cert}\ntls_key = {key}\n"),
    ) as g:
        plain = Client(g.port("mqtt"), "plain", V5)
        plain.sub("secure/#")
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="tls", protocol=V5)
        c.tls_set(ca_certs=cert, cert_reqs=ssl.CERT_REQUIRED)
        c.connect("127.0.0.1", g.port("mqtts"))
        c.loop_start()
        c.publish("secure/x", "over tls", qos=1).wait_for_publish(10)
        assert plain.get().payload == b"over tls"
        c.disconnect()
        c.loop_stop()


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} is missing: run `bash tests/peers/install.sh`")
    return path


@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_mosquitto_clients_round_trip(tmp_path, version):
    pub, sub = _need("mosquitto_pub"), _need("mosquitto_sub")
    with GatewayThread(tmp_path / "gw") as g:
        port = str(g.port("mqtt"))
        proc = subprocess.Popen(
            [sub, "-h", "127.0.0.1", "-p", port, "-V", version, "-t", "cli/#", "-q", "1",
             "-C", "3", "-v", "-W", "20"], stdout=subprocess.PIPE, text=True)
        # Retained first, so the subscriber is known to be attached when it arrives.
        subprocess.run([pub, "-h", "127.0.0.1", "-p", port, "-V", version, "-t", "cli/ready",
                        "-m", "ready", "-r", "-q", "1"], check=True, timeout=20)
        lines = [
            ("cli/a", "first", "0"), ("cli/b/c", "second", "2"),
        ]
        proc_first = proc.stdout.readline() if proc.stdout else ""
        for topic, msg, qos in lines:
            subprocess.run([pub, "-h", "127.0.0.1", "-p", port, "-V", version, "-t", topic,
                            "-m", msg, "-q", qos], check=True, timeout=20)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0
        assert [proc_first.strip(), *out.strip().splitlines()] == [
            "cli/ready ready", "cli/a first", "cli/b/c second"]
