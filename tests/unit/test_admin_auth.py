"""The admin API's authentication (Basic, bearer tokens), authorisation (EMS administrator
permissions), TLS, the start-up rule for its listener, and its answers to bad input."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import socket
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from adminapi import basic_auth
from aiohttp.test_utils import TestClient, TestServer
from corehelp import Q, make_cert, running_broker, write_config

from gateway import admin, registry
from gateway.admin import make_app
from gateway.admin_auth import MAX_BODY, TokenStore
from gateway.config import Listener, load_config
from gateway.errors import ConfigErrors, GatewayError
from gateway.message import DeliveryMode, Message

ROOT = Path(__file__).resolve().parent.parent.parent

USERS = (
    'admin:adminpw:"the predefined administrator"\n'
    'viewer:viewpw:"every view-* permission"\n'
    'boss:bosspw:"a member of $admin"\n'
    'purger:purgepw:"purge on orders.> only"\n'
    'nobody:nobodypw:"no administrator permission"\n'
)
GROUPS = '$admin:"administrators"\nboss\n'
ACL = "ADMIN USER=viewer PERM=view-all\nQUEUE=orders.> USER=purger PERM=purge\n"
PROPS = {"properties": "maxmsgs=10"}

# every /api/ route: method, path, body, whether it changes something
VIEWS = ["/api/v1/server", "/api/v1/queues", "/api/v1/topics", "/api/v1/durables",
         "/api/v1/connections", "/api/v1/store", "/api/v1/clients", "/api/v1/sessions",
         "/api/v1/transports", "/api/v1/log"]
CHANGES: list[tuple[str, Any]] = [
    ("/api/v1/queues/orders.eu/purge", None),
    ("/api/v1/topics/live.>", PROPS),        # not defined yet: create-destination
    ("/api/v1/queues/orders.eu", PROPS),     # defined: modify-destination
]
ROUTES = [("GET", p, None) for p in VIEWS] + [("POST", p, b) for p, b in CHANGES]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def auth(user: str, password: str) -> dict[str, str]:
    return basic_auth(user, password)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@contextlib.asynccontextmanager
async def api(tmp_path: Path, clock: Clock | None = None, **files: str
              ) -> AsyncIterator[tuple[TestClient[Any, Any], Any]]:
    """A broker with users, groups and ACL, its admin app on 127.0.0.1, and 3 messages in
    queue orders.eu."""
    files.setdefault("users", USERS)
    files.setdefault("groups", GROUPS)
    files.setdefault("acl", ACL)
    async with running_broker(tmp_path, queues="orders.eu\norders.>\n>\n", **files) as b:
        p = b.connect().session().producer(Q("orders.eu"),
                                           delivery_mode=DeliveryMode.NON_PERSISTENT)
        for i in range(3):
            p.send(Message.text(str(i)))
        app = make_app(b, clock or Clock())
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            yield client, b


async def call(client: TestClient[Any, Any], method: str, path: str, body: Any = None,
               headers: dict[str, str] | None = None) -> tuple[int, Any, Any]:
    async with client.request(method, path, json=body, headers=headers) as r:
        return r.status, await r.json(), r.headers


# -- authentication ---------------------------------------------------------------------


async def test_every_route_refuses_a_request_without_credentials(tmp_path):
    async with api(tmp_path) as (client, b):
        for method, path, body in ROUTES + [("POST", "/api/v1/tokens", None),
                                            ("DELETE", "/api/v1/tokens/current", None)]:
            status, answer, headers = await call(client, method, path, body)
            assert status == 401, path
            assert headers["WWW-Authenticate"] == 'Basic realm="gateway"'
            assert "error" in answer
        assert b.queues["orders.eu"].count == 3


@pytest.mark.parametrize("header", [
    auth("admin", "wrong"), auth("ghost", "x"), auth("viewer", ""),
    {"Authorization": "Basic !!!not-base64"},
    {"Authorization": "Basic " + base64.b64encode(b"no-colon").decode()},
    {"Authorization": "Digest username=admin"}, {"Authorization": "Bearer made-up"},
])
async def test_bad_credentials_are_401_with_a_json_error(tmp_path, header):
    async with api(tmp_path) as (client, _):
        status, answer, headers = await call(client, "GET", "/api/v1/server", headers=header)
        assert status == 401 and isinstance(answer["error"], str)
        bearer = header["Authorization"].startswith("Bearer")
        assert headers["WWW-Authenticate"] == (
            'Bearer realm="gateway", error="invalid_token"' if bearer
            else 'Basic realm="gateway"')


async def test_the_predefined_admin_has_an_empty_password_until_users_conf_sets_one(tmp_path):
    async with api(tmp_path, users='viewer:viewpw:""\n') as (client, _):
        assert (await call(client, "GET", "/api/v1/server", headers=auth("admin", "")))[0] == 200
        assert (await call(client, "GET", "/api/v1/server",
                           headers=auth("admin", "guess")))[0] == 401
    async with api(tmp_path / "set") as (client, _):  # USERS gives admin a password
        assert (await call(client, "GET", "/api/v1/server", headers=auth("admin", "")))[0] == 401


async def test_health_is_public_and_says_only_the_status(tmp_path):
    async with api(tmp_path) as (client, _):
        async with client.get("/health") as r:
            assert r.status == 200 and await r.json() == {"status": "ok"}


# -- authorisation ----------------------------------------------------------------------


@pytest.mark.parametrize("user,password", [("admin", "adminpw"), ("boss", "bosspw")])
async def test_admin_and_admin_group_members_may_use_every_route(tmp_path, user, password):
    async with api(tmp_path) as (client, b):
        for method, path, body in ROUTES:
            status, answer, _ = await call(client, method, path, body, auth(user, password))
            assert status == 200, (path, answer)
        assert b.queues["orders.eu"].count == 0
        assert b.config.topics.get("live.>") is not None


async def test_a_viewer_sees_every_view_and_changes_nothing(tmp_path):
    async with api(tmp_path) as (client, b):
        for path in VIEWS:
            status, _, _ = await call(client, "GET", path, headers=auth("viewer", "viewpw"))
            assert status == 200, path
        for path, body in CHANGES:
            status, answer, _ = await call(client, "POST", path, body,
                                           auth("viewer", "viewpw"))
            assert status == 403 and "permission" in answer["error"], path
        assert b.queues["orders.eu"].count == 3
        assert b.config.topics.get("live.>") is None
        assert b.config.queues.get("orders.eu").props_text() == ""


async def test_a_user_without_administrator_permissions_is_refused_everything(tmp_path):
    async with api(tmp_path) as (client, _):
        for method, path, body in ROUTES:
            status, answer, _ = await call(client, method, path, body,
                                           auth("nobody", "nobodypw"))
            assert status == 403 and "error" in answer, path


async def test_each_route_needs_its_own_permission(tmp_path):
    acl = ("ADMIN USER=nobody PERM=view-durable\n"
           "ADMIN USER=viewer PERM=view-connection,purge-destination\n")
    async with api(tmp_path, acl=acl) as (client, b):
        nobody, viewer = auth("nobody", "nobodypw"), auth("viewer", "viewpw")
        assert (await call(client, "GET", "/api/v1/durables", headers=nobody))[0] == 200
        assert (await call(client, "GET", "/api/v1/queues", headers=nobody))[0] == 403
        assert (await call(client, "GET", "/api/v1/sessions", headers=viewer))[0] == 200
        assert (await call(client, "GET", "/api/v1/server", headers=viewer))[0] == 403
        # purge-destination implies view-destination (EMS: a change permission implies its view)
        assert (await call(client, "GET", "/api/v1/queues", headers=viewer))[0] == 200
        assert (await call(client, "POST", "/api/v1/queues/orders.eu/purge",
                           headers=viewer))[0] == 200
        assert b.queues["orders.eu"].count == 0
        assert (await call(client, "POST", "/api/v1/queues/orders.eu", PROPS, viewer))[0] == 403


async def test_setprop_needs_create_for_a_new_name_and_modify_for_a_defined_one(tmp_path):
    acl = "ADMIN USER=nobody PERM=modify-destination\n"
    async with api(tmp_path, acl=acl) as (client, b):
        nobody = auth("nobody", "nobodypw")
        assert (await call(client, "POST", "/api/v1/queues/orders.eu", PROPS, nobody))[0] == 200
        assert b.config.queues.get("orders.eu").props_text() == "maxmsgs=10"
        status, answer, _ = await call(client, "POST", "/api/v1/topics/brand.new", PROPS, nobody)
        assert status == 403 and "create-destination" in answer["error"]


async def test_a_purge_grant_on_queues_allows_those_queues_only(tmp_path):
    async with api(tmp_path) as (client, b):
        purger = auth("purger", "purgepw")
        b.connect().session().producer(Q("other")).send(Message.text("x"))
        assert (await call(client, "POST", "/api/v1/queues/other/purge", headers=purger))[0] == 403
        status, answer, _ = await call(client, "POST", "/api/v1/queues/orders.eu/purge",
                                       headers=purger)
        assert (status, answer) == (200, {"purged": 3})
        assert b.queues["other"].count == 1


async def test_a_purge_is_refused_without_credentials_and_to_a_viewer(tmp_path):
    async with api(tmp_path) as (client, b):
        assert (await call(client, "POST", "/api/v1/queues/orders.eu/purge"))[0] == 401
        assert (await call(client, "POST", "/api/v1/queues/orders.eu/purge",
                           headers=auth("viewer", "viewpw")))[0] == 403
        assert b.queues["orders.eu"].count == 3


# -- tokens -----------------------------------------------------------------------------


async def test_a_token_is_issued_used_and_expires(tmp_path):
    clock = Clock()
    async with api(tmp_path, clock) as (client, b):
        status, answer, _ = await call(client, "POST", "/api/v1/tokens",
                                       headers=auth("viewer", "viewpw"))
        assert status == 200 and answer["expires_in"] == 3600
        token = answer["token"]
        assert len(token) >= 40
        other = (await call(client, "POST", "/api/v1/tokens",
                            headers=auth("viewer", "viewpw")))[1]["token"]
        assert other != token
        assert (await call(client, "GET", "/api/v1/queues", headers=bearer(token)))[0] == 200
        # the token carries the user's permissions, no more
        assert (await call(client, "POST", "/api/v1/queues/orders.eu/purge",
                           headers=bearer(token)))[0] == 403
        clock.now += 3599
        assert (await call(client, "GET", "/api/v1/queues", headers=bearer(token)))[0] == 200
        clock.now += 1
        status, answer, headers = await call(client, "GET", "/api/v1/queues",
                                             headers=bearer(token))
        assert status == 401 and "expired" in answer["error"]
        assert headers["WWW-Authenticate"] == 'Bearer realm="gateway", error="invalid_token"'
        assert b.queues["orders.eu"].count == 3


async def test_a_token_is_revoked_and_only_basic_credentials_make_one(tmp_path):
    async with api(tmp_path) as (client, _):
        token = (await call(client, "POST", "/api/v1/tokens",
                            headers=auth("admin", "adminpw")))[1]["token"]
        status, answer, _ = await call(client, "POST", "/api/v1/tokens", headers=bearer(token))
        assert status == 403 and "Basic" in answer["error"]
        status, answer, _ = await call(client, "DELETE", "/api/v1/tokens/current",
                                       headers=auth("admin", "adminpw"))
        assert status == 400 and "error" in answer
        assert (await call(client, "DELETE", "/api/v1/tokens/current",
                           headers=bearer(token)))[:2] == (200, {"revoked": True})
        assert (await call(client, "GET", "/api/v1/server", headers=bearer(token)))[0] == 401
        assert (await call(client, "DELETE", "/api/v1/tokens/current",
                           headers=bearer(token)))[0] == 401


async def test_the_token_lifetime_is_configurable(tmp_path):
    clock = Clock()
    async with api(tmp_path, clock, gateway="admin_token_lifetime = 10min\n") as (client, _):
        answer = (await call(client, "POST", "/api/v1/tokens",
                             headers=auth("admin", "adminpw")))[1]
        assert answer["expires_in"] == 600
        clock.now += 600
        assert (await call(client, "GET", "/api/v1/server",
                           headers=bearer(answer["token"])))[0] == 401


def test_token_store_forgets_expired_tokens_and_stays_bounded(monkeypatch):
    import gateway.admin_auth as admin_auth

    clock = Clock()
    store = TokenStore(10.0, clock)
    old = store.issue("a")
    clock.now += 10
    store.issue("b")
    assert len(store) == 1 and store.user_of(old) is None
    monkeypatch.setattr(admin_auth, "MAX_TOKENS", 3)
    tokens = [store.issue(f"u{i}") for i in range(4)]
    assert len(store) == 3
    assert [store.user_of(t) for t in tokens[1:]] == ["u1", "u2", "u3"]
    assert store.revoke(tokens[1]) and not store.revoke(tokens[1])


# -- bad input --------------------------------------------------------------------------


async def test_bad_input_is_answered_with_json_never_500(tmp_path):
    admin = auth("admin", "adminpw")
    async with api(tmp_path) as (client, _):
        status, answer, _ = await call(client, "GET", "/api/v1/nothing", headers=admin)
        assert status == 404 and "error" in answer
        status, answer, _ = await call(client, "POST", "/api/v1/queues/nope/purge",
                                       headers=admin)
        assert status == 404 and "nope" in answer["error"]
        status, answer, headers = await call(client, "DELETE", "/api/v1/queues", headers=admin)
        assert status == 405 and "error" in answer and "GET" in headers["Allow"]
        for raw in (b"{not json", b"\xff\xfe", b"[1, 2]", b'{"properties": 5}'):
            async with client.post("/api/v1/topics/t", data=raw,
                                   headers={**admin, "Content-Type": "application/json"}) as r:
                assert r.status == 400, raw
                assert "error" in await r.json()
        status, answer, _ = await call(client, "POST", "/api/v1/topics/bad..name", PROPS, admin)
        assert status == 400 and "error" in answer
        async with client.post("/api/v1/topics/t", data=b"{" + b" " * MAX_BODY + b"}",
                               headers={**admin, "Content-Type": "application/json"}) as r:
            assert r.status == 413
            assert str(MAX_BODY) in (await r.json())["error"]
        # an unknown route says 404 only to someone authenticated
        assert (await call(client, "GET", "/api/v1/nothing"))[0] == 401


async def test_an_unexpected_error_is_a_logged_500_with_json(tmp_path, caplog, monkeypatch):
    async with api(tmp_path) as (client, b):
        def broken() -> Any:
            raise RuntimeError("a bug")

        # (the admin module's own helper: the broker's methods are read-only when compiled)
        monkeypatch.setattr(admin, "_gc_info", broken)
        with caplog.at_level(logging.ERROR, logger="gateway.admin"):
            status, answer, _ = await call(client, "GET", "/api/v1/server",
                                           headers=auth("admin", "adminpw"))
        assert (status, answer) == (500, {"error": "internal error"})
        assert any(r.exc_info and "a bug" in str(r.exc_info[1]) for r in caplog.records)


async def test_a_malformed_request_line_is_one_log_line_without_a_traceback(tmp_path, caplog):
    async with running_broker(tmp_path) as b:
        server = await registry.adapter("http")(b, Listener("http", "127.0.0.1", 0, 0))
        try:
            with caplog.at_level(logging.DEBUG):
                for data in (b"GET / HTTP/9.x\r\n\r\n", b"GARBAGE\r\n\r\n",
                             b"GET / HTTP/1.1\r\nBad Header\r\n\r\n"):
                    reader, writer = await asyncio.open_connection(*server.address)
                    writer.write(data)
                    assert (await reader.read(12)).startswith(b"HTTP/1.")
                    writer.close()
                    await writer.wait_closed()
        finally:
            await server.close()
    bad = [r for r in caplog.records if "bad HTTP request" in r.getMessage()]
    assert len(bad) == 3
    assert all(r.levelno <= logging.INFO and r.exc_info is None for r in bad)
    assert all("\n" not in r.getMessage() for r in bad)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# -- TLS --------------------------------------------------------------------------------


async def test_https_serves_the_admin_api_over_tls(tmp_path):
    cert, key = make_cert(tmp_path)
    gw = f"tls_cert = {cert}\ntls_key = {key}\n"
    async with running_broker(tmp_path / "gw", gateway=gw, users=USERS) as b:
        server = await registry.adapter("https")(b, Listener("https", "127.0.0.1", 0, 0))
        host, port = server.address
        ctx = ssl.create_default_context(cafile=cert)
        try:
            async with aiohttp.ClientSession() as http:
                async with http.get(f"https://{host}:{port}/api/v1/server", ssl=ctx,
                                    headers=auth("admin", "adminpw")) as r:
                    assert r.status == 200 and "published" in await r.json()
                async with http.get(f"https://{host}:{port}/api/v1/server", ssl=ctx) as r:
                    assert r.status == 401
                with pytest.raises(aiohttp.ClientError):  # not plain HTTP
                    async with http.get(f"http://{host}:{port}/health") as r:
                        await r.read()
        finally:
            await server.close()


def test_an_https_listener_needs_a_certificate(tmp_path):
    write_config(tmp_path, gateway="listen = https://127.0.0.1:0\n")
    with pytest.raises(ConfigErrors, match=r"gateway.conf:1: listen https://127.0.0.1:0 uses TLS"):
        load_config(tmp_path)


# -- the start-up rule ------------------------------------------------------------------


@pytest.mark.parametrize("listen", ["http://0.0.0.0:0", "http://:0", "http://192.0.2.1:0",
                                    # a host name, which must resolve (gateway.config.checks): this host's own
                                    f"http://{socket.gethostname()}:0", "https://0.0.0.0:0"])
def test_a_non_loopback_admin_listener_needs_an_admin_password(tmp_path, listen):
    cert, key = make_cert(tmp_path) if listen.startswith("https") else ("", "")
    tls = f"tls_cert = {cert}\ntls_key = {key}\n" if cert else ""
    gw = f"listen = mqtt://127.0.0.1:0\nlisten = {listen}\n{tls}"
    write_config(tmp_path / "c", gateway=gw, users='viewer:viewpw:""\n')
    with pytest.raises(ConfigErrors) as err:
        load_config(tmp_path / "c")
    assert len(err.value.errors) == 1
    assert "gateway.conf:2: listen" in str(err.value)
    assert "'admin' user has no password" in str(err.value)
    # the same with an empty password for admin in users.conf; a password lifts it
    write_config(tmp_path / "c", gateway=gw, users='admin::"no password"\n')
    with pytest.raises(ConfigErrors):
        load_config(tmp_path / "c")
    write_config(tmp_path / "c", gateway=gw, users='admin:s3cret:""\n')
    assert load_config(tmp_path / "c").security.admin_has_password()


@pytest.mark.parametrize("listen", ["http://127.0.0.1:0", "http://[::1]:0",
                                    "http://localhost:0", "mqtt://0.0.0.0:0"])
def test_loopback_admin_listeners_and_other_protocols_need_no_admin_password(tmp_path, listen):
    write_config(tmp_path, gateway=f"listen = {listen}\n")
    load_config(tmp_path)


async def test_the_listener_itself_refuses_a_non_loopback_address_without_a_password(tmp_path):
    async with running_broker(tmp_path) as b:
        with pytest.raises(GatewayError, match="'admin' user has no password"):
            await registry.adapter("http")(b, Listener("http", "0.0.0.0", 0, 0))


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_serve_and_check_config_refuse_a_public_admin_listener_without_password(tmp_path):
    write_config(tmp_path, gateway="listen = http://0.0.0.0:0\n")
    check = cli("check-config", str(tmp_path), cwd=tmp_path)
    assert check.returncode == 1
    assert "gateway.conf:1: listen http://0.0.0.0:0" in check.stderr
    assert "'admin' user has no password" in check.stderr
    serve = cli("serve", "--config-dir", str(tmp_path), cwd=tmp_path)
    assert serve.returncode == 2
    assert "gateway.conf:1: listen http://0.0.0.0:0" in serve.stderr


@pytest.mark.parametrize("value", ["0", "-5", "soon"])
def test_a_bad_token_lifetime_is_a_config_error(tmp_path, value):
    write_config(tmp_path, gateway=f"admin_token_lifetime = {value}\n")
    with pytest.raises(ConfigErrors, match="gateway.conf:1: admin_token_lifetime"):
        load_config(tmp_path)


# -- the log level at run time (GET / PUT /api/v1/log) ----------------------------------


@pytest.fixture
def log_levels():
    """Put back the root logger's level and the test logger's after the test."""
    root, named = logging.root.level, logging.getLogger("transports.rv").level
    yield
    logging.root.setLevel(root)
    logging.getLogger("transports.rv").setLevel(named)


async def test_the_log_level_needs_credentials(tmp_path, log_levels):
    async with api(tmp_path) as (client, _):
        for method, body in (("GET", None), ("PUT", {"level": "debug"})):
            status, answer, headers = await call(client, method, "/api/v1/log", body)
            assert status == 401 and "error" in answer
            assert headers["WWW-Authenticate"] == 'Basic realm="gateway"'


async def test_a_viewer_reads_the_log_level_and_cannot_change_it(tmp_path, log_levels):
    logging.root.setLevel(logging.WARNING)
    async with api(tmp_path) as (client, _):
        viewer = auth("viewer", "viewpw")
        status, answer, _ = await call(client, "GET", "/api/v1/log", headers=viewer)
        assert status == 200 and answer["level"] == "warning"
        assert isinstance(answer["loggers"], dict)
        status, answer, _ = await call(client, "PUT", "/api/v1/log", {"level": "debug"}, viewer)
        assert status == 403 and "change-server" in answer["error"]
        assert logging.root.level == logging.WARNING
        nobody = auth("nobody", "nobodypw")
        assert (await call(client, "GET", "/api/v1/log", headers=nobody))[0] == 403


async def test_an_administrator_changes_the_log_level(tmp_path, log_levels):
    logging.root.setLevel(logging.INFO)
    acl = ACL + "ADMIN USER=nobody PERM=change-server\n"
    async with api(tmp_path, acl=acl) as (client, _):
        admin = auth("admin", "adminpw")
        status, answer, _ = await call(client, "PUT", "/api/v1/log", {"level": "DEBUG"}, admin)
        assert status == 200 and answer["level"] == "debug"
        assert logging.root.level == logging.DEBUG
        # one logger; change-server alone is enough (and implies view-server)
        changer = auth("nobody", "nobodypw")
        status, answer, _ = await call(client, "PUT", "/api/v1/log",
                                       {"logger": "transports.rv", "level": "warning"}, changer)
        assert status == 200 and answer["loggers"]["transports.rv"] == "warning"
        assert logging.getLogger("transports.rv").level == logging.WARNING
        assert logging.root.level == logging.DEBUG
        status, answer, _ = await call(client, "GET", "/api/v1/log", headers=changer)
        assert status == 200 and answer["loggers"]["transports.rv"] == "warning"
        status, answer, _ = await call(client, "PUT", "/api/v1/log",
                                       {"logger": "transports.rv", "level": "notset"}, admin)
        assert status == 200 and "transports.rv" not in answer["loggers"]
        assert logging.getLogger("transports.rv").level == logging.NOTSET


@pytest.mark.parametrize("body", [
    b"not json", b"", b'["debug"]', b'{"level": 10}', b'{"level": "chatty"}', b"{}",
    b'{"level": "notset"}', b'{"level": "info", "logger": 3}',
    b'{"level": "info", "extra": 1}', b'"debug"',
])
async def test_a_bad_log_level_body_is_400(tmp_path, log_levels, body):
    logging.root.setLevel(logging.INFO)
    async with api(tmp_path) as (client, _):
        headers = {**auth("admin", "adminpw"), "Content-Type": "application/json"}
        async with client.put("/api/v1/log", data=body, headers=headers) as r:
            assert r.status == 400
            assert isinstance((await r.json())["error"], str)
        assert logging.root.level == logging.INFO
