"""Credentials on every protocol, with independent clients: the mosquitto command-line clients,
paho-mqtt (3.1.1 and 5, over TCP, TLS and WebSocket), stomp.py (and raw STOMP over
WebSocket), python-qpid-proton (SASL PLAIN and ANONYMOUS, and raw SASL frames).

The rules under test (README, "Credentials"): with ``authorization = disabled`` (the embedded
default) every connection is accepted whatever it presents, and keeps the user name it gave
(seen here as the ``JMS_GW_SENDER`` property that a ``sender_name`` topic stamps); with
``authorization = enabled`` users are checked against ``users.conf`` and a refusal is each
protocol's own (CONNACK 4 / 0x86 and 5 / 0x87, a STOMP ERROR frame and the close, the SASL
outcome ``auth``); anonymous clients then connect only with ``allow_anonymous = enabled``.

Three gateways serve the module: ``open_gw`` (the default security parameters), ``closed_gw``
(authorization on, anonymous off) and ``anon_gw`` (authorization on, anonymous on). Accepted
clients publish on ``creds.<test>.…``; an in-process consumer on the gateway reads what
arrived and who sent it.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import shutil
import socket
import ssl
import struct
import subprocess
from collections.abc import Iterator
from typing import Any

import aiohttp
import paho.mqtt.client as mqtt
import pytest
from amqpclient import SASL_HEADER, connect, performatives
from gw import GatewayThread
from paho.mqtt.enums import CallbackAPIVersion
from proton import ConnectionException, Message
from stomp.exception import ConnectFailedException
from test_mqtt_tls_and_cli import make_cert
from test_stomp_py import Peer

from gateway.message import PROP_SENDER, Destination

V311, V5 = mqtt.MQTTv311, mqtt.MQTTv5
MQTT_VERSIONS = pytest.mark.parametrize("proto", [V311, V5], ids=["3.1.1", "5.0"])
WAIT = 10.0  # seconds for anything the gateway should do
USERS = 'device1:pw1:"a device"\nguest:guest:"STOMP default"\nblank::"no password"\n'
LISTEN = ("listen = mqtt://127.0.0.1:0\nlisten = mqtts://127.0.0.1:0\n"
          "listen = amqp://127.0.0.1:0\nlisten = stomp://127.0.0.1:0\n"
          "listen = http://127.0.0.1:0\n")
TOPICS = ">\ncreds.> sender_name\n"
_ids = itertools.count(1)


# ---------------------------------------------------------------------------- gateways


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make a test certificate")
    return make_cert(tmp_path_factory.mktemp("creds-cert"))


def _gateway(tmp_path_factory: pytest.TempPathFactory, cert: tuple[str, str], name: str,
             security: str, users: str | None) -> GatewayThread:
    files = {"users": users} if users is not None else {}
    return GatewayThread(tmp_path_factory.mktemp(name) / "gw",
                         gateway=f"{LISTEN}tls_cert = {cert[0]}\ntls_key = {cert[1]}\n{security}",
                         topics=TOPICS, **files)


@pytest.fixture(scope="module")
def open_gw(tmp_path_factory: pytest.TempPathFactory,
            cert: tuple[str, str]) -> Iterator[GatewayThread]:
    """The embedded default's security: authorization disabled, anonymous enabled, no users."""
    g = _gateway(tmp_path_factory, cert, "creds-open", "", None).start()
    yield g
    g.stop()


@pytest.fixture(scope="module")
def closed_gw(tmp_path_factory: pytest.TempPathFactory,
              cert: tuple[str, str]) -> Iterator[GatewayThread]:
    g = _gateway(tmp_path_factory, cert, "creds-closed",
                 "authorization = enabled\nallow_anonymous = disabled\n", USERS).start()
    yield g
    g.stop()


@pytest.fixture(scope="module")
def anon_gw(tmp_path_factory: pytest.TempPathFactory,
            cert: tuple[str, str]) -> Iterator[GatewayThread]:
    g = _gateway(tmp_path_factory, cert, "creds-anon",
                 "authorization = enabled\nallow_anonymous = enabled\n", USERS).start()
    yield g
    g.stop()


# ---------------------------------------------------------------------------- helpers


class Arrivals:
    """An in-process consumer on ``creds.<name>.>``: what arrived, and who sent it."""

    def __init__(self, g: GatewayThread, name: str) -> None:
        self.g = g
        self.prefix = f"creds.{name}"
        self.consumer = g.call(lambda: g.broker.connect(authenticated=True).session().consumer(
            Destination.topic(self.prefix + ".>")))

    def next(self) -> tuple[str, str, str | None]:
        """(topic, body as text, JMS_GW_SENDER) of the next message; fails after WAIT s."""
        d = self.g.call(lambda: self.consumer.receive(WAIT))
        assert d is not None, f"nothing arrived on {self.prefix}.>"
        body = d.msg.body
        text = bytes(body).decode() if isinstance(body, (bytes, bytearray, memoryview)) else body
        return d.msg.destination.name, text, d.msg.properties.get(PROP_SENDER)

    def close(self) -> None:
        self.g.call(self.consumer.close)


@pytest.fixture
def arrivals() -> Iterator[Any]:
    made: list[Arrivals] = []

    def make(g: GatewayThread, name: str) -> Arrivals:
        made.append(Arrivals(g, name))
        return made[-1]

    yield make
    for a in made:
        a.close()


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} is missing: run `bash tests/peers/install.sh`")
    return path


def mosquitto_pub(port: int, version: str, topic: str, message: str,
                  *creds: str) -> subprocess.CompletedProcess[str]:
    """One ``mosquitto_pub`` run (QoS 1, so a success means the gateway took the message)."""
    return subprocess.run(
        [_need("mosquitto_pub"), "-h", "127.0.0.1", "-p", str(port), "-V", version,
         "-i", f"creds-{next(_ids)}", "-t", topic, "-m", message, "-q", "1", *creds],
        capture_output=True, text=True, timeout=30)


class Paho:
    """A paho-mqtt client and the CONNACK reason code it got."""

    def __init__(self, port: int, proto: int, *, username: str | None = None,
                 password: str | None = None, transport: str = "tcp",
                 ca: str | None = None) -> None:
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"creds-{next(_ids)}",
                             protocol=proto, transport=transport)
        if transport == "websockets":
            self.c.ws_set_options(path="/mqtt")
        if ca is not None:
            self.c.tls_set(ca_certs=ca, cert_reqs=ssl.CERT_REQUIRED)
        if username is not None:
            self.c.username_pw_set(username, password)
        self.connacks: queue.Queue[Any] = queue.Queue()
        self.c.on_connect = lambda c, u, flags, rc, props=None: self.connacks.put(rc)
        self.c.reconnect_delay_set(60, 120)  # a refused client must not come back in the test
        self.c.connect("127.0.0.1", port, 30)
        self.c.loop_start()
        self.rc = self.connacks.get(timeout=WAIT)

    def publish(self, topic: str, payload: str) -> None:
        self.c.publish(topic, payload, qos=1).wait_for_publish(WAIT)

    def close(self) -> None:
        if self.c.is_connected():
            self.c.disconnect()
        self.c.loop_stop()


def mqtt_port(g: GatewayThread, transport: str) -> tuple[int, str, str | None]:
    """(port, paho transport, CA file) for ``tcp``, ``tls`` or ``websockets``."""
    if transport == "tls":
        assert g.gateway is not None
        return g.port("mqtts"), "tcp", str(g.gateway.config.gateway.tls_cert)
    if transport == "websockets":
        return g.port("http"), "websockets", None
    return g.port("mqtt"), "tcp", None


TRANSPORTS = pytest.mark.parametrize("transport", ["tcp", "tls", "websockets"])


def stomp_ws(port: int, headers: dict[str, str],
             send: str | None = None) -> list[tuple[str, dict[str, str], bytes]]:
    """STOMP 1.2 over WebSocket (aiohttp, subprotocol ``v12.stomp``): CONNECT with
    ``headers``; if CONNECTED, SEND ``send`` to ``/topic/<send>`` with a receipt. Returns the
    frames received until the RECEIPT or the close."""

    async def run() -> list[tuple[str, dict[str, str], bytes]]:
        frames: list[tuple[str, dict[str, str], bytes]] = []
        url = f"http://127.0.0.1:{port}/stomp"
        async with aiohttp.ClientSession() as s, s.ws_connect(url, protocols=("v12.stomp",)
                                                               ) as ws:
            head = "".join(f"{k}:{v}\n" for k, v in headers.items())
            await ws.send_str(f"CONNECT\naccept-version:1.2\nhost:localhost\n{head}\n\x00")
            while True:
                msg = await ws.receive(timeout=WAIT)
                if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED,
                                aiohttp.WSMsgType.CLOSING):
                    return frames
                data = msg.data.encode() if msg.type == aiohttp.WSMsgType.TEXT else msg.data
                for f in _stomp_frames(data):
                    frames.append(f)
                    if f[0] == "CONNECTED" and send is not None:
                        await ws.send_str(f"SEND\ndestination:/topic/{send}\nreceipt:r1\n\n"
                                          f"over websocket\x00")
                    elif f[0] == "CONNECTED" or f[0] == "RECEIPT":
                        return frames

    return asyncio.run(run())


def _stomp_frames(data: bytes) -> list[tuple[str, dict[str, str], bytes]]:
    out = []
    for raw in data.split(b"\x00"):
        raw = raw.lstrip(b"\r\n")
        if not raw:
            continue
        head, _, body = raw.partition(b"\n\n")
        lines = head.decode().split("\n")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers.setdefault(k, v)
        out.append((lines[0], headers, body))
    return out


def sasl_exchange(port: int, mechanism: str, response: bytes | None) -> tuple[list[str], int]:
    """A raw SASL exchange (AMQP 1.0 §5.3): the mechanisms the gateway offers and the code of
    its ``sasl-outcome`` for a ``sasl-init`` with ``mechanism`` and ``response``."""
    from proton import Data, Described, symbol, ulong

    d = Data()
    d.put_object(Described(ulong(0x41), [symbol(mechanism), response]))
    body = d.encode()
    init = struct.pack(">IBBH", 8 + len(body), 2, 1, 0) + body
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as s:
        s.sendall(SASL_HEADER + init)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            frames = performatives(data)
            if any(code == 0x44 for code, _ in frames):
                break
    frames = dict(performatives(data))
    return [str(m) for m in frames[0x40][0].elements], int(frames[0x44][0])


def plain(user: str, password: str) -> bytes:
    return b"\x00" + user.encode() + b"\x00" + password.encode()


# ------------------------------------------------- authorization disabled: everyone comes in


@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_default_mosquitto_pub_any_credentials_are_accepted(open_gw, arrivals, version):
    """``mosquitto_pub -u device1 -P x``, a user name without a password, and no user name:
    all accepted with authorization disabled, each message stamped with the name given."""
    seen = arrivals(open_gw, f"mosq{version[-1]}")
    port = open_gw.port("mqtt")
    for n, creds, sender in [(1, ("-u", "device1", "-P", "x"), "device1"),
                             (2, ("-u", "device1"), "device1"),
                             (3, (), "anonymous")]:
        r = mosquitto_pub(port, version, f"creds/mosq{version[-1]}/{n}", f"m{n}", *creds)
        assert r.returncode == 0, r.stderr
        assert seen.next() == (f"{seen.prefix}.{n}", f"m{n}", sender)


@MQTT_VERSIONS
@TRANSPORTS
def test_default_paho_any_credentials_are_accepted(open_gw, arrivals, proto, transport):
    """paho-mqtt 3.1.1 and 5 over TCP, TLS and WebSocket: a user name with any password,
    without one, and no user name at all connect (CONNACK 0) and publish."""
    name = f"paho{proto}{transport[:3]}"
    seen = arrivals(open_gw, name)
    port, paho_transport, ca = mqtt_port(open_gw, transport)
    for n, username, password, sender in [(1, "device1", "x", "device1"),
                                          (2, "device1", None, "device1"),
                                          (3, None, None, "anonymous")]:
        c = Paho(port, proto, username=username, password=password, transport=paho_transport,
                 ca=ca)
        try:
            assert not c.rc.is_failure, c.rc
            c.publish(f"creds/{name}/{n}", f"m{n}")
            assert seen.next() == (f"{seen.prefix}.{n}", f"m{n}", sender)
        finally:
            c.close()


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_default_stomp_py_guest_and_no_credentials_are_accepted(open_gw, arrivals, version):
    """stomp.py with ``guest/guest`` (its usual default against ActiveMQ and RabbitMQ), with
    a login and no passcode, and without credentials: CONNECTED, and SEND goes through."""
    name = f"stomp{version[-1]}"
    seen = arrivals(open_gw, name)
    for n, login, passcode, sender in [(1, "guest", "guest", "guest"),
                                       (2, "device1", None, "device1"),
                                       (3, None, None, "anonymous")]:
        p = Peer(open_gw.port("stomp"), version, login=login, passcode=passcode)
        try:
            p.send(f"/topic/{seen.prefix}.{n}", f"m{n}")
            assert seen.next() == (f"{seen.prefix}.{n}", f"m{n}", sender)
        finally:
            p.close()


def test_default_stomp_over_websocket_any_credentials_are_accepted(open_gw, arrivals):
    seen = arrivals(open_gw, "stompws")
    for n, headers, sender in [(1, {"login": "guest", "passcode": "guest"}, "guest"),
                               (2, {}, "anonymous")]:
        frames = stomp_ws(open_gw.port("http"), headers, send=f"{seen.prefix}.{n}")
        assert [f[0] for f in frames] == ["CONNECTED", "RECEIPT"], frames
        assert seen.next() == (f"{seen.prefix}.{n}", "over websocket", sender)


def test_default_proton_plain_and_anonymous_are_accepted(open_gw, arrivals):
    """python-qpid-proton with SASL PLAIN (any user and password), with SASL ANONYMOUS, and
    without SASL at all: each connection opens and its message arrives."""
    seen = arrivals(open_gw, "amqp")
    port = open_gw.port("amqp")
    for n, kw, sender in [(1, {"user": "device1", "password": "x",
                               "allowed_mechs": "PLAIN"}, "device1"),
                          (2, {"allowed_mechs": "ANONYMOUS"}, "anonymous"),
                          (3, {"sasl_enabled": False}, "anonymous")]:
        c = connect(port, **kw)
        try:
            c.create_sender(f"topic://{seen.prefix}.{n}").send(Message(body=f"m{n}"))
            assert seen.next() == (f"{seen.prefix}.{n}", f"m{n}", sender)
        finally:
            c.close()
    mechanisms, code = sasl_exchange(port, "PLAIN", plain("nobody", "x"))
    assert (sorted(mechanisms), code) == (["ANONYMOUS", "PLAIN"], 0)


def test_allow_anonymous_disabled_has_no_effect_without_authorization(tmp_path):
    """``allow_anonymous = disabled`` only matters with authorization enabled (EMS: with
    authorization disabled any connection is accepted); the config says so in a warning."""
    with GatewayThread(tmp_path / "gw", gateway=(
            "listen = mqtt://127.0.0.1:0\nlisten = amqp://127.0.0.1:0\n"
            "listen = stomp://127.0.0.1:0\nallow_anonymous = disabled\n"), topics=TOPICS) as g:
        assert g.gateway is not None
        assert any("allow_anonymous = disabled has no effect while authorization is disabled"
                   in w for w in g.gateway.config.warnings), g.gateway.config.warnings
        seen = Arrivals(g, "noanon")
        c = Paho(g.port("mqtt"), V5)
        assert not c.rc.is_failure, c.rc
        c.publish("creds/noanon/mqtt", "m")
        c.close()
        p = Peer(g.port("stomp"), "1.2")
        p.send(f"/topic/{seen.prefix}.stomp", "m")
        p.close()
        a = connect(g.port("amqp"), allowed_mechs="ANONYMOUS")
        a.create_sender(f"topic://{seen.prefix}.amqp").send(Message(body="m"))
        a.close()
        got = [seen.next() for _ in range(3)]
        seen.close()
        assert sorted(got) == [(f"{seen.prefix}.{k}", "m", "anonymous")
                               for k in ("amqp", "mqtt", "stomp")]


# --------------------------------------------------- authorization enabled: users.conf decides


@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_enabled_mosquitto_pub(closed_gw, arrivals, version):
    """Right password (and a users.conf user with an empty password, no ``-P``) accepted;
    wrong password and unknown user refused as bad user name or password (CONNACK 4 / 0x86);
    no user name refused as not authorised (5 / 0x87): mosquitto_pub's own words for each."""
    name = f"emosq{version[-1]}"
    seen = arrivals(closed_gw, name)
    port = closed_gw.port("mqtt")
    r = mosquitto_pub(port, version, f"creds/{name}/ok", "ok", "-u", "device1", "-P", "pw1")
    assert r.returncode == 0, r.stderr
    r = mosquitto_pub(port, version, f"creds/{name}/blank", "blank", "-u", "blank")
    assert r.returncode == 0, r.stderr
    bad_user, not_authorized = "bad user name or password", "not authori"
    for creds, why in [(("-u", "device1", "-P", "x"), bad_user),
                       (("-u", "device1"), bad_user),
                       (("-u", "nobody", "-P", "pw1"), bad_user),
                       ((), not_authorized)]:
        r = mosquitto_pub(port, version, f"creds/{name}/refused", "no", *creds)
        assert r.returncode != 0 and why in r.stderr.lower(), (creds, r.stderr)
    assert seen.next() == (f"{seen.prefix}.ok", "ok", "device1")
    assert seen.next() == (f"{seen.prefix}.blank", "blank", "blank")
    assert closed_gw.call(lambda: seen.consumer.receive_nowait()) is None


@MQTT_VERSIONS
@TRANSPORTS
def test_enabled_paho(closed_gw, arrivals, proto, transport):
    """paho-mqtt over TCP, TLS and WebSocket: the right password connects and publishes; a
    wrong password and an unknown user get Bad User Name or Password (0x86 on MQTT 5, which
    paho also reports for 3.1.1's code 4); no user name gets Not authorized (0x87 / 5)."""
    name = f"epaho{proto}{transport[:3]}"
    seen = arrivals(closed_gw, name)
    port, paho_transport, ca = mqtt_port(closed_gw, transport)
    good = Paho(port, proto, username="device1", password="pw1", transport=paho_transport,
                ca=ca)
    try:
        assert not good.rc.is_failure, good.rc
        good.publish(f"creds/{name}/ok", "ok")
        assert seen.next() == (f"{seen.prefix}.ok", "ok", "device1")
    finally:
        good.close()
    for username, password, code, text in [("device1", "x", 0x86, "Bad user name or password"),
                                           ("nobody", "pw1", 0x86, "Bad user name or password"),
                                           (None, None, 0x87, "Not authorized")]:
        c = Paho(port, proto, username=username, password=password, transport=paho_transport,
                 ca=ca)
        try:
            assert c.rc.is_failure and c.rc.getName() == text, (username, c.rc)
            if proto == V5:
                assert c.rc.value == code
        finally:
            c.close()


def test_enabled_stomp_py(closed_gw, arrivals):
    """stomp.py: ``guest/guest`` when users.conf has it; a wrong passcode, an unknown login
    and no login get an ERROR frame naming the reason, then the close."""
    seen = arrivals(closed_gw, "estomp")
    port = closed_gw.port("stomp")
    ok = Peer(port, "1.2", login="guest", passcode="guest")
    ok.send(f"/topic/{seen.prefix}.ok", "ok")
    assert seen.next() == (f"{seen.prefix}.ok", "ok", "guest")
    ok.close()
    for login, passcode, why in [("guest", "wrong", "authentication failed for user 'guest'"),
                                 ("nobody", "guest", "authentication failed for user 'nobody'"),
                                 (None, None, "anonymous connections are not allowed")]:
        bad = Peer(port, "1.2", login=login, passcode=passcode, connect=False)
        with pytest.raises(ConnectFailedException):
            bad.conn.connect(login, passcode, wait=True)
        err = bad.error()
        assert err.headers["message"] == "authentication failed"
        assert why in err.body, err.body


def test_enabled_stomp_over_websocket(closed_gw, arrivals):
    seen = arrivals(closed_gw, "estompws")
    port = closed_gw.port("http")
    frames = stomp_ws(port, {"login": "guest", "passcode": "guest"}, send=f"{seen.prefix}.ok")
    assert [f[0] for f in frames] == ["CONNECTED", "RECEIPT"], frames
    assert seen.next() == (f"{seen.prefix}.ok", "over websocket", "guest")
    for headers in ({"login": "guest", "passcode": "wrong"}, {}):
        frames = stomp_ws(port, headers, send=f"{seen.prefix}.no")
        assert [(f[0], f[1].get("message")) for f in frames] == [
            ("ERROR", "authentication failed")], frames


def test_enabled_proton(closed_gw, arrivals):
    """proton: PLAIN with the right password connects; a wrong password, an unknown user and
    ANONYMOUS (not offered) are refused. The raw exchange shows the outcome code ``auth``
    (AMQP 1.0 §5.3.3.6) and that only PLAIN is offered."""
    seen = arrivals(closed_gw, "eamqp")
    port = closed_gw.port("amqp")
    c = connect(port, user="device1", password="pw1", allowed_mechs="PLAIN")
    c.create_sender(f"topic://{seen.prefix}.ok").send(Message(body="ok"))
    assert seen.next() == (f"{seen.prefix}.ok", "ok", "device1")
    c.close()
    for kw in ({"user": "device1", "password": "x"}, {"user": "nobody", "password": "pw1"},
               {"allowed_mechs": "ANONYMOUS"}, {"sasl_enabled": False}):
        with pytest.raises(ConnectionException):
            connect(port, timeout=5, **kw)
    assert sasl_exchange(port, "PLAIN", plain("device1", "x")) == (["PLAIN"], 1)
    assert sasl_exchange(port, "PLAIN", plain("nobody", "pw1")) == (["PLAIN"], 1)
    assert sasl_exchange(port, "ANONYMOUS", b"") == (["PLAIN"], 1)
    assert sasl_exchange(port, "PLAIN", plain("device1", "pw1")) == (["PLAIN"], 0)


def test_enabled_anonymous_allowed(anon_gw, arrivals):
    """``allow_anonymous = enabled``: a client without credentials connects on every protocol
    (and is ``anonymous``), while a wrong password is still refused."""
    seen = arrivals(anon_gw, "eanon")
    r = mosquitto_pub(anon_gw.port("mqtt"), "mqttv311", "creds/eanon/mosq", "m")
    assert r.returncode == 0, r.stderr
    r = mosquitto_pub(anon_gw.port("mqtt"), "mqttv5", "creds/eanon/wrong", "m",
                      "-u", "device1", "-P", "x")
    assert r.returncode != 0 and "bad user name or password" in r.stderr.lower(), r.stderr
    c = Paho(anon_gw.port("mqtt"), V5)
    assert not c.rc.is_failure, c.rc
    c.publish("creds/eanon/paho", "m")
    c.close()
    p = Peer(anon_gw.port("stomp"), "1.2")
    p.send(f"/topic/{seen.prefix}.stomp", "m")
    p.close()
    a = connect(anon_gw.port("amqp"), allowed_mechs="ANONYMOUS")
    a.create_sender(f"topic://{seen.prefix}.amqp").send(Message(body="m"))
    a.close()
    with pytest.raises(ConnectionException):
        connect(anon_gw.port("amqp"), user="guest", password="wrong", timeout=5)
    got = [seen.next() for _ in range(4)]
    assert got == [(f"{seen.prefix}.{k}", "m", "anonymous")
                   for k in ("mosq", "paho", "stomp", "amqp")]
    assert sorted(sasl_exchange(anon_gw.port("amqp"), "ANONYMOUS", b"")[0]) == [
        "ANONYMOUS", "PLAIN"]
