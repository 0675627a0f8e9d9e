"""The admin API's changing routes (EMS ``create`` / ``delete`` / ``addprop`` /
``removeprop`` / ``purge`` / users / groups / ``grant`` / ``revoke`` / transports, browse) and
the write-back of changes to the configuration directory, comments kept."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from adminapi import basic_auth
from aiohttp.test_utils import TestClient, TestServer
from corehelp import Q, T, collect, running_broker

from gateway import admin_openapi
from gateway.admin import make_app
from gateway.client import AckMode
from gateway.config import load_config
from gateway.errors import LimitExceededError
from gateway.message import DeliveryMode, Message

ADMIN = basic_auth("admin", "adminpw")
USERS = ('# the administrators\nadmin:adminpw:"the predefined administrator"\n'
         'viewer:viewpw:"sees everything"\n'
         'alice:alicepw:"an operator"  \n')
GROUPS = '# operators\n$admin:"administrators"\n\nops:"operators"\nalice\n'
ACL = "# who may look\nADMIN USER=viewer PERM=view-all\n"
QUEUES = "# the orders\norders.eu maxmsgs=100   # Europe\n\n>\n"
TOPICS = "# everything\n>\n"


@contextlib.asynccontextmanager
async def api(tmp_path: Path, **files: str) -> AsyncIterator[tuple[TestClient[Any, Any], Any]]:
    files = {"users": USERS, "groups": GROUPS, "acl": ACL, "queues": QUEUES,
             "topics": TOPICS} | files
    async with running_broker(tmp_path, **files) as b:
        async with TestClient(TestServer(make_app(b), host="127.0.0.1")) as client:
            yield client, b


async def call(client: TestClient[Any, Any], method: str, path: str, body: Any = None,
               headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with client.request(method, path, json=body, headers=headers or ADMIN) as r:
        return r.status, (await r.json() if r.content_type == "application/json"
                          else await r.text())


def send(b: Any, dest: Any, *texts: str, persistent: bool = True) -> None:
    mode = DeliveryMode.PERSISTENT if persistent else DeliveryMode.NON_PERSISTENT
    p = b.connect().session().producer(dest, delivery_mode=mode)
    for t in texts:
        p.send(Message.text(t))


# -- destinations ------------------------------------------------------------------------


async def test_create_show_change_and_delete_a_queue_written_back_with_comments(tmp_path):
    async with api(tmp_path) as (client, b):
        status, row = await call(client, "POST", "/api/v1/queues",
                                 {"name": "billing", "properties": "maxbytes=10MB,secure"})
        assert status == 201 and row["own_properties"] == "maxbytes=10MB,secure"
        assert (await call(client, "POST", "/api/v1/queues", {"name": "billing"}))[0] == 409
        status, row = await call(client, "POST", "/api/v1/queues/billing/addprop",
                                 {"properties": "maxmsgs=5,maxbytes=1MB"})
        assert status == 200 and row["own_properties"] == "maxbytes=1MB,secure,maxmsgs=5"
        status, row = await call(client, "POST", "/api/v1/queues/billing/removeprop",
                                 {"properties": "secure"})
        assert row["own_properties"] == "maxbytes=1MB,maxmsgs=5"
        assert (await call(client, "POST", "/api/v1/queues/billing/removeprop",
                           {"properties": "colour"}))[0] == 400
        assert (await call(client, "POST", "/api/v1/queues/nothing/addprop",
                           {"properties": "maxmsgs=1"}))[0] == 404
        text = (tmp_path / "queues.conf").read_text()
        assert text == ("# the orders\norders.eu maxmsgs=100   # Europe\n\n>\n"
                        "billing maxbytes=1MB,maxmsgs=5\n")
        # the live queue follows its definition at once
        send(b, Q("billing"), *["m"] * 5)
        assert b.queues["billing"].count == 5
        with pytest.raises(LimitExceededError):
            send(b, Q("billing"), "one too many")
        status, row = await call(client, "GET", "/api/v1/queues/billing")
        assert status == 200 and row["pending"] == 5 and row["defined"]
        assert (await call(client, "DELETE", "/api/v1/queues/billing"))[0] == 200
        assert "billing" not in b.queues and b.config.queues.get("billing") is None
        assert (await call(client, "GET", "/api/v1/queues/billing"))[0] == 404
        assert "billing" not in (tmp_path / "queues.conf").read_text()
    # a restart reads what was written
    config = load_config(tmp_path)
    assert config.queues.get("orders.eu") is not None and config.queues.get("billing") is None


async def test_setprop_on_a_defined_queue_rewrites_its_line_only(tmp_path):
    async with api(tmp_path) as (client, _):
        assert (await call(client, "POST", "/api/v1/queues/orders.eu",
                           {"properties": "maxmsgs=7"}))[0] == 200
        assert (tmp_path / "queues.conf").read_text() == (
            "# the orders\norders.eu maxmsgs=7\n\n>\n")


async def test_delete_a_queue_with_a_consumer_is_refused(tmp_path):
    async with api(tmp_path) as (client, b):
        session = b.connect().session(AckMode.CLIENT)
        _, listener = collect()
        session.consumer(Q("orders.eu"), listener=listener)
        status, answer = await call(client, "DELETE", "/api/v1/queues/orders.eu")
        assert status == 409 and "consumer" in answer["error"]


async def test_a_dynamic_topic_is_deleted_and_its_definition_goes(tmp_path):
    async with api(tmp_path) as (client, b):
        assert (await call(client, "POST", "/api/v1/topics",
                           {"name": "prices.eu", "properties": "trace"}))[0] == 201
        assert "prices.eu trace" in (tmp_path / "topics.conf").read_text()
        assert (await call(client, "DELETE", "/api/v1/topics/prices.eu"))[0] == 200
        assert (tmp_path / "topics.conf").read_text() == TOPICS
        assert (await call(client, "DELETE", "/api/v1/topics/prices.eu"))[0] == 404


async def test_purge_topic_empties_every_subscription(tmp_path):
    async with api(tmp_path) as (client, b):
        s = b.connect(client_id="c1").session(AckMode.CLIENT)
        s.consumer(T("news"), listener=collect()[1], window=0)
        s.consumer(T("news"), listener=collect()[1], window=0, durable_name="d1")
        send(b, T("news"), "a", "b", "c")
        status, answer = await call(client, "POST", "/api/v1/topics/news/purge")
        assert status == 200 and answer == {"purged": 6}
        assert (await call(client, "POST", "/api/v1/topics/none/purge"))[0] == 404


async def test_browse_shows_messages_without_consuming_them(tmp_path):
    async with api(tmp_path) as (client, b):
        p = b.connect().session().producer(Q("orders.eu"))
        m = Message.text("hello")
        m.properties["colour"] = "red"
        p.send(m, priority=7)
        p.send(Message.binary(b"\x00\x01"))
        p.send(Message.map({"n": 1, "nested": {"x": [1, "y"]}}))
        status, rows = await call(client, "GET", "/api/v1/queues/orders.eu/messages?limit=10")
        assert status == 200 and len(rows) == 3
        assert rows[0]["body"] == "hello" and rows[0]["priority"] == 7
        assert rows[0]["properties"]["colour"] == "red"
        assert rows[0]["delivery_mode"] == "persistent" and rows[0]["body_type"] == "text"
        assert base64.b64decode(rows[1]["body"]) == b"\x00\x01"
        assert rows[2]["body"] == {"n": 1, "nested": {"x": [1, "y"]}}
        assert b.queues["orders.eu"].count == 3
        for bad in ("limit=0", "limit=5000", "limit=x"):
            assert (await call(client, "GET", f"/api/v1/queues/orders.eu/messages?{bad}"))[0] \
                == 400
        assert (await call(client, "GET", "/api/v1/queues/nope/messages"))[0] == 404


async def test_lists_page_and_filter_by_pattern(tmp_path):
    async with api(tmp_path) as (client, b):
        for i in range(25):
            send(b, Q(f"load.q{i:02d}"), "x", persistent=False)
        async with client.get("/api/v1/queues?q=load.>&offset=10&limit=5",
                              headers=ADMIN) as r:
            rows = await r.json()
            assert r.headers["X-Total-Count"] == "25"
        assert [row["name"] for row in rows] == [f"load.q{i}" for i in range(10, 15)]
        assert (await call(client, "GET", "/api/v1/queues?limit=-1"))[0] == 400
        assert (await call(client, "GET", "/api/v1/queues?q=a..b"))[0] == 400


async def test_durables_purge_and_delete(tmp_path):
    async with api(tmp_path) as (client, b):
        conn = b.connect(client_id="app")
        s = conn.session(AckMode.CLIENT)
        c = s.consumer(T("news"), listener=collect()[1], window=0, durable_name="feed")
        send(b, T("news"), "a", "b")
        path = "/api/v1/durables/feed"
        assert (await call(client, "POST", path + "/purge"))[0] == 404  # no client_id
        assert await call(client, "POST", path + "/purge?client_id=app") == (200, {"purged": 2})
        assert (await call(client, "DELETE", path + "?client_id=app"))[0] == 409
        c.close()
        assert (await call(client, "DELETE", path + "?client_id=app"))[0] == 200
        assert b.durable("sub:app:feed") is None


# -- users, groups, ACL ------------------------------------------------------------------


async def test_users_and_groups_are_changed_and_written_back(tmp_path):
    async with api(tmp_path) as (client, b):
        status, row = await call(client, "POST", "/api/v1/users",
                                 {"name": "bob", "password": "bobpw", "description": "new"})
        assert status == 201 and row["has_password"]
        assert (await call(client, "POST", "/api/v1/users", {"name": "bob"}))[0] == 409
        assert (await call(client, "POST", "/api/v1/users", {"name": "a b"}))[0] == 400
        assert (await call(client, "POST", "/api/v1/users", {"name": 5}))[0] == 400
        assert (await call(client, "GET", "/api/v1/server",
                           headers=basic_auth("bob", "bobpw")))[0] == 403  # no permission
        assert (await call(client, "PUT", "/api/v1/users/bob", {"password": "new"}))[0] == 200
        assert (await call(client, "GET", "/api/v1/server",
                           headers=basic_auth("bob", "bobpw")))[0] == 401
        assert (await call(client, "PUT", "/api/v1/groups/$admin/members/bob"))[0] == 200
        assert (await call(client, "GET", "/api/v1/server",
                           headers=basic_auth("bob", "new")))[0] == 200
        assert (await call(client, "PUT", "/api/v1/groups/ops/members/ghost"))[0] == 404
        assert (await call(client, "POST", "/api/v1/groups", {"name": "night"}))[0] == 201
        assert (await call(client, "PUT", "/api/v1/groups/night/members/alice"))[0] == 200
        assert (await call(client, "DELETE", "/api/v1/groups/ops/members/alice"))[0] == 200
        _, users = await call(client, "GET", "/api/v1/users")
        assert {u["name"]: u["groups"] for u in users}["alice"] == ["night"]
        users_conf = (tmp_path / "users.conf").read_text()
        assert users_conf.startswith(USERS)
        assert users_conf.splitlines()[-1].startswith("bob:$pbkdf2-sha256$")
        assert (tmp_path / "groups.conf").read_text() == (
            '# operators\n$admin:"administrators"\nbob\n\nops:"operators"\n'
            'night:""\nalice\n')
        assert (await call(client, "DELETE", "/api/v1/users/bob"))[0] == 200
        assert "bob" not in (tmp_path / "groups.conf").read_text()
        assert (await call(client, "DELETE", "/api/v1/groups/night"))[0] == 200
        assert (await call(client, "DELETE", "/api/v1/groups/$admin"))[0] == 409
        assert (await call(client, "DELETE", "/api/v1/users/admin"))[0] == 409
    config = load_config(tmp_path)
    assert "bob" not in config.security.users and "night" not in config.security.groups
    assert config.security.groups["ops"].members == ()


async def test_grant_and_revoke_written_back(tmp_path):
    async with api(tmp_path) as (client, b):
        grant = {"kind": "queue", "name": "orders.>", "user": "alice",
                 "permissions": ["send", "receive"]}
        assert (await call(client, "POST", "/api/v1/acl/grant", grant))[0] == 200
        assert b.config.security.check("alice", "queue", "orders.eu", "send")
        _, rows = await call(client, "GET", "/api/v1/acl?principal=alice")
        assert rows == [{"kind": "queue", "name": "orders.>", "user": "alice",
                         "permissions": ["receive", "send"]}]
        assert (tmp_path / "acl.conf").read_text() == (
            ACL + "QUEUE=orders.> USER=alice PERM=receive,send\n")
        revoke = grant | {"permissions": ["send"]}
        assert (await call(client, "POST", "/api/v1/acl/revoke", revoke))[0] == 200
        assert (await call(client, "POST", "/api/v1/acl/revoke", revoke))[0] == 404
        assert (tmp_path / "acl.conf").read_text() == (
            ACL + "QUEUE=orders.> USER=alice PERM=receive\n")
        for bad in ({"kind": "queue", "permissions": ["send"], "user": "alice"},
                    grant | {"permissions": ["fly"]}, grant | {"kind": "bus"},
                    grant | {"group": "ops"}, {"kind": "queue"}):
            assert (await call(client, "POST", "/api/v1/acl/grant", bad))[0] == 400, bad


async def test_admin_grants_need_change_admin_acl(tmp_path):
    acl = ACL + "ADMIN USER=alice PERM=change-acl\n"
    async with api(tmp_path, acl=acl) as (client, _):
        alice = basic_auth("alice", "alicepw")
        body = {"kind": "admin", "user": "alice", "permissions": ["all"]}
        status, answer = await call(client, "POST", "/api/v1/acl/grant", body, alice)
        assert status == 403 and "change-admin-acl" in answer["error"]
        queue = {"kind": "queue", "name": "q", "user": "alice", "permissions": ["send"]}
        assert (await call(client, "POST", "/api/v1/acl/grant", queue, alice))[0] == 200


@pytest.mark.parametrize("method,path,body", [
    ("POST", "/api/v1/queues", {"name": "x"}),
    ("DELETE", "/api/v1/queues/orders.eu", None),
    ("POST", "/api/v1/queues/orders.eu/addprop", {"properties": "maxmsgs=1"}),
    ("POST", "/api/v1/users", {"name": "eve"}),
    ("POST", "/api/v1/acl/grant", {"kind": "queue", "name": "q", "user": "viewer",
                                   "permissions": ["send"]}),
    ("DELETE", "/api/v1/connections/x", None),
    ("POST", "/api/v1/topics/t/purge", None),
])
async def test_a_viewer_may_not_change(tmp_path, method, path, body):
    async with api(tmp_path) as (client, _):
        status, _ = await call(client, method, path, body, basic_auth("viewer", "viewpw"))
        assert status == 403


# -- configuration -----------------------------------------------------------------------


async def test_config_view_hides_nothing_but_secrets(tmp_path):
    async with api(tmp_path) as (client, _):
        status, conf = await call(client, "GET", "/api/v1/config")
        assert status == 200 and conf["directory"] == str(tmp_path)
        assert conf["parameters"]["server"] == "gateway"
        assert conf["parameters"]["listen"] == []


async def test_the_embedded_default_is_never_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config(None)
    assert config.embedded
    from gateway.admin_manage import save
    before = {p: p.read_text() for p in Path(config.dir).glob("*.conf")}

    class Owner:
        pass

    owner = Owner()
    owner.config = config  # type: ignore[attr-defined]
    config.queues.add("x")
    save(owner, "queue")
    assert {p: p.read_text() for p in Path(config.dir).glob("*.conf")} == before


async def test_set_password_admin_writes_the_predefined_administrator(tmp_path):
    async with api(tmp_path, users='alice:alicepw:""\n') as (client, _):
        empty = basic_auth("admin", "")
        _, users = await call(client, "GET", "/api/v1/users", headers=empty)
        assert {"name": "admin", "description": "Administrator", "groups": [],
                "has_password": False} in users
        assert (await call(client, "PUT", "/api/v1/users/admin", {"password": "s3cret"},
                           empty))[0] == 200
        assert (await call(client, "GET", "/api/v1/server", headers=empty))[0] == 401
        assert (await call(client, "GET", "/api/v1/server",
                           headers=basic_auth("admin", "s3cret")))[0] == 200
        assert (tmp_path / "users.conf").read_text().splitlines()[1].startswith(
            'admin:$pbkdf2-sha256$')


async def test_every_change_is_announced_on_the_admin_change_monitor_topic(tmp_path):
    async with api(tmp_path) as (client, b):
        got, listener = collect()
        s = b.connect(user="admin", password="adminpw").session()
        s.consumer(T("$sys.monitor.admin.change"), listener=listener)
        deleted, on_delete = collect()
        s.consumer(T("$sys.monitor.queue.delete"), listener=on_delete)
        await call(client, "POST", "/api/v1/queues", {"name": "q1", "properties": "maxmsgs=3"})
        await call(client, "POST", "/api/v1/acl/grant", {"kind": "queue", "name": "q1",
                                                          "user": "alice",
                                                          "permissions": ["send"]})
        await call(client, "DELETE", "/api/v1/queues/q1")
        events = [(d.msg.body["event_action"], d.msg.body["target_object"],
                   d.msg.body["target_name"], d.msg.body.get("target_value")) for d in got]
        assert events == [("create", "queue", "q1", "maxmsgs=3"),
                          ("grant", "permissions", "queue q1", "user=alice send"),
                          ("delete", "queue", "q1", None)]
        assert got[0].msg.body["conn_username"] == "admin"
        assert [(d.msg.body["target_name"], d.msg.body["event_reason"]) for d in deleted] == [
            ("q1", "admin")]


async def test_defined_destinations_are_listed_before_their_first_use(tmp_path):
    async with api(tmp_path, topics="prices.eu\n>\n") as (client, b):
        assert "orders.eu" not in b.queues
        _, rows = await call(client, "GET", "/api/v1/queues?q=orders.eu")
        assert rows[0]["name"] == "orders.eu" and rows[0]["static"]
        assert rows[0]["pending"] == 0 and rows[0]["properties"]["maxmsgs"] == 100
        _, rows = await call(client, "GET", "/api/v1/topics?q=prices.*")
        assert [r["name"] for r in rows] == ["prices.eu"]
        _, server = await call(client, "GET", "/api/v1/server")
        b.connect(protocol="stomp")
        _, after = await call(client, "GET", "/api/v1/server")
        assert after["connections_by_protocol"].get("stomp", 0) == \
            server["connections_by_protocol"].get("stomp", 0) + 1


# -- every route, every kind of caller ------------------------------------------------------


def concrete(path: str) -> str:
    return (path.replace("{name}", "orders.eu").replace("{user}", "alice")
            .replace("{id}", "nobody"))


async def test_every_route_for_anonymous_viewer_and_admin(tmp_path):
    """Anonymous: 401 everywhere; a viewer (view-all): views answered, changes 403; admin:
    never 401 or 403. Every route of the OpenAPI document, so none is left out."""
    viewer = basic_auth("viewer", "viewpw")
    async with api(tmp_path) as (client, b):
        for r in admin_openapi.ROUTES:
            path = concrete(r.path)
            async with client.request(r.method, path, json={} if r.body else None) as resp:
                assert resp.status == 401, (r.method, path)
            status, _ = await call(client, r.method, path, {} if r.body else None, viewer)
            views = not r.perm or r.perm.startswith("view-")
            if views:
                assert status not in (401, 403), (r.method, path, status)
            else:
                assert status == 403, (r.method, path, status)
        for r in admin_openapi.ROUTES:
            status, _ = await call(client, r.method, concrete(r.path), {} if r.body else None)
            assert status not in (401, 403, 500), (r.method, r.path, status)
