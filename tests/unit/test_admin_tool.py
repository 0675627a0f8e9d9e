"""``gateway admin``, the administration shell: its parser and tables on their own, then
scripts against a real gateway (the state checked through the API), then the interactive
prompt in a pseudo-terminal (history, completion, the password prompt)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import socket
import subprocess
import sys
import time
import urllib.error
from pathlib import Path
from typing import Any

import pytest
from corehelp import Q, make_cert
from gw import GatewayThread

from gateway.admintool import Connection, main
from gateway.admintool_commands import (
    Call,
    CommandError,
    Local,
    Request,
    complete,
    help_text,
    parse,
)
from gateway.admintool_tables import human_size, render
from gateway.message import DeliveryMode, Message

ROOT = Path(__file__).resolve().parent.parent.parent
USERS = 'admin:adminpw:"the administrator"\nbob:bobpw:"a user"\n'
QUEUES = ">\n"


def get(path: str, view: str) -> Request:
    return Request((Call("GET", path),), view)


def change(method: str, path: str, body: Any, message: str) -> Request:
    return Request((Call(method, path, body),), "done", message)


# -- the parser ----------------------------------------------------------------------------


@pytest.mark.parametrize("line,expected", [
    ("show queues", get("/api/v1/queues", "queues")),
    ("  SHOW Queues orders.>", get("/api/v1/queues?q=orders.%3E", "queues")),
    ("show queue $sys.undelivered", get("/api/v1/queues/%24sys.undelivered", "queue")),
    ("show topics a.*.b", get("/api/v1/topics?q=a.%2A.b", "topics")),
    ("show topic Live.X", get("/api/v1/topics/Live.X", "topic")),
    ("show durables", get("/api/v1/durables", "durables")),
    ("show connections", get("/api/v1/connections", "connections")),
    ("show server", get("/api/v1/server", "server")),
    ("info", get("/api/v1/server", "server")),
    ("show users", get("/api/v1/users", "users")),
    ("show groups", get("/api/v1/groups", "groups")),
    ("show acl queue orders.>", get("/api/v1/acl?kind=queue&name=orders.%3E", "acl")),
    ("showacl topic t", get("/api/v1/acl?kind=topic&name=t", "acl")),
    ("show acl user bob", get("/api/v1/acl?principal=bob", "acl")),
    ("show acl admin", get("/api/v1/acl?kind=admin", "acl")),
    ("show transports", get("/api/v1/transports", "transports")),
    ("show transport rv1", get("/api/v1/transports/rv1", "transport")),
    ("show config", get("/api/v1/config", "config")),
    ("create queue orders.eu maxbytes=10MB, secure",
     change("POST", "/api/v1/queues", {"name": "orders.eu", "properties": "maxbytes=10MB, secure"},
            "Queue 'orders.eu' has been created.")),
    ("create topic news", change("POST", "/api/v1/topics", {"name": "news", "properties": ""},
                                 "Topic 'news' has been created.")),
    ("delete topic news", change("DELETE", "/api/v1/topics/news", None,
                                 "Topic 'news' has been deleted.")),
    # the properties go to the server as written, quotes and all
    ('setprop topic live.> import="t1,t2",export="t2"',
     change("POST", "/api/v1/topics/live.%3E", {"properties": 'import="t1,t2",export="t2"'},
            "Topic 'live.>': properties set.")),
    ("addprop queue q trace=body", change("POST", "/api/v1/queues/q/addprop",
                                          {"properties": "trace=body"},
                                          "Queue 'q': properties added.")),
    ("removeprop queue q maxbytes,trace", change("POST", "/api/v1/queues/q/removeprop",
                                                 {"properties": "maxbytes,trace"},
                                                 "Queue 'q': properties removed.")),
    ("purge queue q", change("POST", "/api/v1/queues/q/purge", None,
                             "Queue 'q' has been purged.")),
    ("purge topic t", change("POST", "/api/v1/topics/t/purge", None,
                             "Topic 't' has been purged.")),
    ("purge durable d1 client 1", None),  # one argument too many: below
    ("purge durable d1 app1", change("POST", "/api/v1/durables/d1/purge?client_id=app1", None,
                                     "Durable 'd1' has been purged.")),
    ("delete durable d1", change("DELETE", "/api/v1/durables/d1", None,
                                 "Durable 'd1' has been deleted.")),
    ("delete connection gateway:7", change("DELETE", "/api/v1/connections/gateway%3A7", None,
                                           "Connection gateway:7 has been closed.")),
    ('create user bob "Bob, the \\"builder\\"" password=s3 cret', None),
    ('create user bob "Bob, the \\"builder\\"" password=s3cret',
     change("POST", "/api/v1/users",
            {"name": "bob", "description": 'Bob, the "builder"', "password": "s3cret"},
            "User 'bob' has been created.")),
    ("create user carol", change("POST", "/api/v1/users", {"name": "carol"},
                                 "User 'carol' has been created.")),
    ("set password bob n3w", change("PUT", "/api/v1/users/bob", {"password": "n3w"},
                                    "Password of user 'bob' has been set.")),
    ("delete user bob", change("DELETE", "/api/v1/users/bob", None,
                               "User 'bob' has been deleted.")),
    ('create group ops "operators"', change("POST", "/api/v1/groups",
                                            {"name": "ops", "description": "operators"},
                                            "Group 'ops' has been created.")),
    ("delete group ops", change("DELETE", "/api/v1/groups/ops", None,
                                "Group 'ops' has been deleted.")),
    ("remove member ops bob", Request((Call("DELETE", "/api/v1/groups/ops/members/bob"),),
                                      "done", "bob removed from group 'ops'.")),
    ("grant queue orders.> user=bob send, receive",
     change("POST", "/api/v1/acl/grant", {"kind": "queue", "name": "orders.>", "user": "bob",
                                          "permissions": ["send", "receive"]},
            "Permissions on queue 'orders.>' granted to user 'bob'.")),
    # the Guide's own form: a bare name is a user
    ("grant topic $sys.monitor.connection.* BOB subscribe",
     change("POST", "/api/v1/acl/grant",
            {"kind": "topic", "name": "$sys.monitor.connection.*", "user": "BOB",
             "permissions": ["subscribe"]},
            "Permissions on topic '$sys.monitor.connection.*' granted to user 'BOB'.")),
    ("Revoke Admin group=ops view-all,purge-destination",
     change("POST", "/api/v1/acl/revoke", {"kind": "admin", "group": "ops",
                                           "permissions": ["view-all", "purge-destination"]},
            "Permissions on admin revoked from group 'ops'.")),
    ("transport stop rv1", change("POST", "/api/v1/transports/rv1/stop", None,
                                  "Transport 'rv1': stop requested.")),
    ("set server log_level=DEBUG", change("PUT", "/api/v1/log", {"level": "DEBUG"},
                                          "Server log level set to debug.")),
    ("connect https://gw:8443 admin pw", Local("connect", ("https://gw:8443", "admin", "pw"))),
    ("connect", Local("connect")),
    ("disconnect", Local("disconnect")),
    ("help grant", Local("help", ("grant",))),
    ("Exit", Local("exit")),
    ("bye", Local("exit")),
    ("", None),
    ("   # show queues", None),
])
def test_a_line_parses_into_its_api_calls(line, expected):
    if expected is None and line.strip() and not line.lstrip().startswith("#"):
        with pytest.raises(CommandError, match="usage: "):
            parse(line)
    else:
        assert parse(line) == expected


def test_add_member_adds_each_user_with_its_own_call():
    req = parse("add member ops bob, alice carol")
    assert isinstance(req, Request)
    assert [(c.method, c.path) for c in req.calls] == [
        ("PUT", "/api/v1/groups/ops/members/bob"), ("PUT", "/api/v1/groups/ops/members/alice"),
        ("PUT", "/api/v1/groups/ops/members/carol")]
    assert req.message == "bob, alice, carol added to group 'ops'."


def test_set_password_without_one_asks_for_it():
    req = parse("set password bob")
    assert isinstance(req, Request) and req.ask_password
    assert req.calls == (Call("PUT", "/api/v1/users/bob", {}),)


@pytest.mark.parametrize("line,message", [
    ("frobnicate all", "unknown command 'frobnicate all'; 'help' lists the commands"),
    ("show", "unknown command 'show'"),
    ("show queue", "usage: show queue NAME"),
    ("show queue a b", "usage: show queue NAME"),
    ("show queues a b", r"usage: show queues \[PATTERN\]"),
    ("show acl queue", "usage: show acl queue|topic NAME"),
    ("show acl admin bob", "usage: show acl"),
    ("create queue", r"usage: create queue NAME \[PROPS\]"),
    ("delete queue a b", "usage: delete queue NAME"),
    ("setprop queue q", "usage: setprop queue|topic NAME PROPS"),
    ("setprop durable d x=1", "usage: setprop"),
    ("purge queue", "usage: purge queue|topic NAME"),
    ("purge queue a b", "usage: purge queue|topic NAME"),
    ("grant queue q user=bob", "usage: grant"),
    ("grant queue q user= send", "usage: grant"),
    ("grant queue q role=x send", "usage: grant"),
    ("grant admin user=bob", "usage: grant"),
    ("grant durable d user=bob send", "usage: grant"),
    ('create group ops "a" "b"', "usage: create group"),
    ("add member ops", "usage: add member GROUP"),
    ("transport restart rv1", "usage: transport start|stop NAME"),
    ("set server max_msg_memory=1GB", "set server: only log_level=LEVEL can be set"),
    ("set server log_level=", "only log_level=LEVEL"),
    ("connect a b c d", "usage: connect"),
    ("exit now", "usage: exit"),
])
def test_a_wrong_line_says_what_is_wrong(line, message):
    with pytest.raises(CommandError, match=message):
        parse(line)


def test_help_lists_the_commands_or_those_of_a_word():
    every = help_text()
    for syntax in ("show queues [PATTERN]", "purge queue|topic NAME", "grant queue|topic NAME",
                   "set server log_level=LEVEL", "exit", "connect [URL] [USER] [PASSWORD]"):
        assert syntax in every
    assert "bye" not in every.split()  # an alias, named in exit's line only
    grant = help_text(("Grant",)).splitlines()
    assert grant[0].strip().startswith("grant queue|topic NAME") and "revoke" not in help_text(
        ("grant",))
    assert help_text(("show", "queue")).split() == ["show", "queue", "NAME", "one", "queue's",
                                                    "details"]
    assert help_text(("nothing",)) == "no command starts with 'nothing'"


# -- completion ----------------------------------------------------------------------------


class Names:
    """The lists completion asks the API for, and which it asked for."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.lists = {"queue": ["orders.eu", "orders.us", "audit"], "topic": ["live.x"],
                      "group": ["ops"], "transport": ["rv1"], "user": ["bob"]}

    def __call__(self, kind: str) -> list[str]:
        self.asked.append(kind)
        return self.lists.get(kind, [])


@pytest.mark.parametrize("before,expected,asked", [
    ("", None, []),
    ("sh", ["show ", "showacl "], []),
    ("SHOW qu", ["queues "], []),                    # not "queue": the list is the word
    ("show queue", ["queues "], []),
    ("show t", ["topics ", "transports "], []),
    ("show queue ", ["audit ", "orders.eu ", "orders.us "], ["queue"]),
    ("show queue orders.", ["orders.eu ", "orders.us "], ["queue"]),
    ("show queue orders.u", ["orders.us "], ["queue"]),
    ("show topic ", ["live.x "], ["topic"]),
    ("grant queue ", ["audit ", "orders.eu ", "orders.us "], ["queue"]),
    ("grant ", ["admin ", "queue ", "topic "], []),
    ("show acl ", ["admin ", "group ", "queue ", "topic ", "user "], []),
    ("add member ", ["ops "], ["group"]),
    ("transport st", ["start ", "stop "], []),
    ("transport stop ", ["rv1 "], ["transport"]),
    ("set password ", ["bob "], ["user"]),
    ("show queues ", [], []),
    ("frob ", [], []),
    ("show queue orders.eu ", [], []),
])
def test_completion_offers_keywords_then_names(before, expected, asked):
    names = Names()
    got = complete(before, names)
    if expected is None:  # every command word
        assert {"show ", "create ", "grant ", "purge ", "exit ", "setprop "} <= set(got)
    else:
        assert got == expected
    assert names.asked == asked


# -- the tables ----------------------------------------------------------------------------


@pytest.mark.parametrize("n,text", [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KB"), (1234, "1.2 KB"), (10 * 1024 ** 2, "10.0 MB"),
    (3 * 1024 ** 3 // 2, "1.5 GB"), (5 * 1024 ** 4, "5.0 TB"), (2048 * 1024 ** 4, "2048.0 TB"),
    (None, ""),
])
def test_sizes_are_human_readable(n, text):
    assert human_size(n) == text


QUEUE_ROWS = [
    {"name": "orders.eu", "temporary": False, "pending": 1200, "in_flight": 3, "consumers": 2,
     "bytes": 1234567, "total_in": 1500, "total_out": 300,
     "properties": {"prefetch": 5, "secure": True, "trace": "body", "maxbytes": 10485760}},
    {"name": "$TMP$.gw.1", "temporary": True, "pending": 0, "in_flight": 0, "consumers": 1,
     "bytes": 0, "total_in": 7, "total_out": 7, "properties": {"exclusive": True}},
]


def test_show_queues_is_an_aligned_table():
    assert render("queues", [QUEUE_ROWS]) == (
        "Queue Name   SNFGXIBCT  Pre  Rcvrs  Pend Msgs  Pend Size  In Flight  Total In  Total Out\n"
        "orders.eu    +-------+    5      2       1200     1.2 MB          3      1500        300\n"
        "*$TMP$.gw.1  ----+----           1          0        0 B          0         7          7")


def test_an_empty_list_is_its_header():
    assert render("queues", [[]]).split() == ["Queue", "Name", "SNFGXIBCT", "Pre", "Rcvrs",
                                              "Pend", "Msgs", "Pend", "Size", "In", "Flight",
                                              "Total", "In", "Total", "Out"]


def test_show_topics_marks_dynamic_topics_and_their_flags():
    rows = [{"name": "live.>", "static": True, "temporary": False, "subscriptions": 12,
             "total_in": 100000, "properties": {"exports": ["rv1"], "secure": True}},
            {"name": "live.x", "static": False, "temporary": False, "subscriptions": 0,
             "total_in": 3, "properties": {}}]
    assert render("topics", [rows]) == (
        "Topic Name  SNFGEIBCTM  Subs  Total In\n"
        "live.>      +---+-----    12    100000\n"
        "*live.x     ----------     0         3")


def test_the_other_tables():
    users = [{"name": "admin", "description": "the administrator", "groups": ["$admin"],
              "has_password": True},
             {"name": "bob", "description": "", "groups": [], "has_password": False}]
    assert render("users", [users]) == (
        "User Name  Password  Groups  Description\n"
        "admin      set       $admin  the administrator\n"
        "bob        none")
    groups = [{"name": "ops", "description": "operators", "members": ["bob", "carol"]}]
    assert render("groups", [groups]).splitlines()[1] == "ops         bob, carol  operators"
    acl = [{"kind": "queue", "name": "orders.>", "user": "bob", "permissions": ["receive", "send"]},
           {"kind": "admin", "name": None, "group": "ops", "permissions": ["view-all"]}]
    assert render("acl", [acl]) == (
        "Type   Name      Principal  Permissions\n"
        "queue  orders.>  user=bob   receive,send\n"
        "admin            group=ops  view-all")
    conns = [{"id": "mqtt:3", "client_id": "sensor-1", "user": None, "kind": "CLIENT",
              "protocol": "mqtt", "address": "127.0.0.1:5000", "sessions": 1, "buffered": 4096,
              "slow": True}]
    assert render("connections", [conns]).splitlines()[1].split() == [
        "mqtt:3", "CLIENT", "mqtt", "sensor-1", "anonymous", "127.0.0.1:5000", "1", "4.0", "KB",
        "slow"]
    durables = [{"name": "d1", "client_id": "app", "destination": "topic:live.x", "consumers": 0,
                 "pending": 5, "bytes": 2048, "in_flight": 0, "total_out": 9}]
    assert render("durables", [durables]).splitlines()[1].split() == [
        "d1", "app", "live.x", "0", "5", "2.0", "KB", "0", "9"]
    transports = [{"name": "rv1", "type": "rv", "state": "running", "last_error": None,
                   "imports": {"a.>": ["A.>"]}, "exports": ["b.>", "c"], "spooled": 0}]
    assert render("transports", [transports]).splitlines()[1].split() == [
        "rv1", "rv", "running", "1", "2", "0"]


def test_detail_views_list_known_fields_first_then_the_rest():
    server = {"name": "gw1", "id": "gw1-abc", "connections": 2, "queues": 3, "topics": 4,
              "durables": 0, "subscriptions": 1, "memory": 3132, "max_msg_memory": 536870912,
              "published": 10, "delivered": 8, "expired": 1, "gc": {"threshold": [700, 10, 10]}}
    assert render("server", [server]) == (
        "Server:          gw1\n"
        "Id:              gw1-abc\n"
        "Connections:     2\n"
        "Queues:          3\n"
        "Topics:          4\n"
        "Durables:        0\n"
        "Subscriptions:   1\n"
        "Messages in:     10\n"
        "Messages out:    8\n"
        "Message memory:  3.1 KB\n"
        "Max msg memory:  512.0 MB\n"
        "Expired:         1\n"
        "Gc threshold:    700, 10, 10")
    queue = {"name": "q", "kind": "queue", "defined": True, "properties": "maxbytes=10MB",
             "own_properties": "maxbytes=10MB", "pending": 2, "bytes": 2048, "consumers": 0,
             "temporary": False, "key": "queue:q"}
    lines = render("queue", [queue]).splitlines()
    assert lines[:5] == ["Queue:              q", "Type:               static",
                         "Properties:         maxbytes=10MB", "Receivers:          0",
                         "Pending msgs:       2"]
    assert "Pending msgs size:  2.0 KB" in lines and "Own properties:     maxbytes=10MB" in lines
    assert not any(line.startswith("Key") for line in lines)
    config = {"directory": None, "transports": ["rv1"],
              "parameters": {"store": "/var/lib/gw", "admin_token_lifetime": 3600}}
    assert render("config", [config]) == (
        "Directory:             (the embedded default)\n"
        "Transports:            rv1\n"
        "admin_token_lifetime:  3600\n"
        "store:                 /var/lib/gw")


def test_a_change_says_what_it_did_and_a_purge_how_many_messages():
    assert render("done", [{"name": "q"}], "Queue 'q' has been created.") == (
        "Queue 'q' has been created.")
    assert render("done", [{"purged": 3}], "Queue 'q' has been purged.") == (
        "Queue 'q' has been purged (3 messages).")
    assert render("done", [{"purged": 1}], "Durable 'd' has been purged.") == (
        "Durable 'd' has been purged (1 message).")


# -- scripts against a gateway ---------------------------------------------------------------


@pytest.fixture
def gateway(tmp_path):
    with GatewayThread(tmp_path / "gw", users=USERS, queues=QUEUES) as g:
        yield g


def url(g: GatewayThread) -> str:
    return f"http://127.0.0.1:{g.port('http')}"


def api(g: GatewayThread, path: str) -> Any:
    return g.admin_get(path, password="adminpw")


def fill(g: GatewayThread, queue: str, n: int) -> None:
    def send() -> None:
        p = g.broker.connect().session().producer(Q(queue),
                                                   delivery_mode=DeliveryMode.NON_PERSISTENT)
        for i in range(n):
            p.send(Message.text("x" * 100 + str(i)))

    g.call(send)


def script(tmp_path: Path, text: str) -> str:
    file = tmp_path / "commands.txt"
    file.write_text(text)
    return str(file)


def run(g: GatewayThread, file: str, *extra: str, password: str = "adminpw") -> int:
    return main(["-server", url(g), "-user", "admin", "-password", password, "-script", file,
                 *extra])


def test_a_script_creates_shows_grants_purges_and_deletes_a_queue(gateway, tmp_path, capsys):
    fill(gateway, "orders.eu", 3)  # a dynamic queue (queues.conf has '>') with 3 messages
    file = script(tmp_path, (
        "# a queue of its own for the European orders\n"
        "create queue orders.eu maxbytes=10MB,trace\n"
        "\n"
        "show queues orders.>\n"
        "show queue orders.eu\n"
        "grant queue orders.eu user=bob send,receive\n"
        "purge queue orders.eu\n"
        "delete queue orders.eu\n"))
    assert run(gateway, file) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[:2] == [f"Connected to: {url(gateway)}", "Queue 'orders.eu' has been created."]
    table = lines[2:4]
    assert table[0].split() == ["Queue", "Name", "SNFGXIBCT", "Pre", "Rcvrs", "Pend", "Msgs",
                                "Pend", "Size", "In", "Flight", "Total", "In", "Total", "Out"]
    # trace is set (T), 3 messages of ~100 bytes pending, none in flight
    name, flags, pre, rcvrs, pending, size, unit, in_flight, total_in, total_out = table[1].split()
    assert (name, flags, rcvrs, pending, unit, in_flight, total_in, total_out) == (
        "orders.eu", "--------+", "0", "3", "B", "0", "3", "0")
    assert 300 < int(size) < 1024
    assert "Properties:         maxbytes=10MB,trace" in lines
    assert "Permissions on queue 'orders.eu' granted to user 'bob'." in lines
    assert "Queue 'orders.eu' has been purged (3 messages)." in lines
    assert lines[-1] == "Queue 'orders.eu' has been deleted."
    # the gateway's state, through the API
    assert {"kind": "queue", "name": "orders.eu", "user": "bob",
            "permissions": ["receive", "send"]} in api(gateway, "/api/v1/acl?principal=bob")
    with pytest.raises(urllib.error.HTTPError) as err404:
        api(gateway, "/api/v1/queues/orders.eu")
    assert err404.value.code == 404
    err404.value.close()
    assert gateway.broker.config.table("queue").get("orders.eu") is None


def test_users_groups_and_admin_permissions_from_a_script(gateway, tmp_path, capsys):
    file = script(tmp_path, (
        'create user carol "Carol from ops" password=carolpw\n'
        'create group ops "operators"\n'
        "add member ops carol,bob\n"
        "grant admin group=ops view-all\n"
        "show users\n"
        "show groups\n"
        "show acl admin\n"
        "remove member ops bob\n"
        "set password bob newpw\n"))
    assert run(gateway, file) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "carol      set       ops     Carol from ops" in lines
    assert "ops         carol, bob  operators" in lines
    assert ["admin", "group=ops", "view-all"] in [line.split() for line in lines]
    groups = {g["name"]: g for g in api(gateway, "/api/v1/groups")}
    assert groups["ops"]["members"] == ["carol"]
    # the new password is bob's, and carol can log in with hers
    assert api(gateway, "/api/v1/users") and gateway.admin_get(
        "/api/v1/queues", user="carol", password="carolpw") is not None
    assert main(["-server", url(gateway), "-user", "bob", "-password", "newpw", "-script",
                 script(tmp_path, "")]) == 0


def test_a_script_stops_at_the_first_failure_and_says_where(gateway, tmp_path, capsys):
    file = script(tmp_path, "show server\ndelete queue nosuch\ncreate queue never.made\n")
    assert run(gateway, file) == 1
    out, err = capsys.readouterr()
    assert "Server:" in out and "never.made" not in out
    assert err.splitlines() == ["Error: no queue named 'nosuch'",
                                f"{file}:2: stopped at 'delete queue nosuch'"]
    assert gateway.broker.config.table("queue").get("never.made") is None
    # -ignore goes on after a failed command, not after a malformed one
    assert run(gateway, file, "-ignore") == 0
    assert gateway.broker.config.table("queue").get("never.made") is not None
    capsys.readouterr()
    bad = script(tmp_path, "show server\nshow queue\ndelete queue never.made\n")
    assert run(gateway, bad, "-ignore") == 1
    assert capsys.readouterr().err.splitlines() == ["Error: usage: show queue NAME",
                                                    f"{bad}:2: stopped at 'show queue'"]
    assert gateway.broker.config.table("queue").get("never.made") is not None


def test_json_prints_the_api_answers(gateway, tmp_path, capsys):
    fill(gateway, "audit", 2)
    assert run(gateway, script(tmp_path, "show queue audit\npurge queue audit\n"), "--json") == 0
    out = capsys.readouterr().out
    decoder = json.JSONDecoder()
    row, end = decoder.raw_decode(out)
    assert row["name"] == "audit" and row["pending"] == 2
    assert json.loads(out[end:]) == {"purged": 2}


def test_set_server_log_level_changes_it(gateway, tmp_path, capsys):
    before = api(gateway, "/api/v1/log")["level"]
    try:
        assert run(gateway, script(tmp_path, "set server log_level=error\n")) == 0
        assert capsys.readouterr().out.splitlines()[-1] == "Server log level set to error."
        assert api(gateway, "/api/v1/log")["level"] == "error"
    finally:
        main(["-server", url(gateway), "-password", "adminpw", "-script",
              script(tmp_path, f"set server log_level={before}\n")])


def test_bad_credentials_and_no_gateway_are_errors_not_tracebacks(gateway, tmp_path, capsys):
    file = script(tmp_path, "show queues\n")
    assert run(gateway, file, password="wrong") == 1
    assert capsys.readouterr().err.startswith("Error: ")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["-server", f"127.0.0.1:{port}", "-script", file]) == 1
    assert capsys.readouterr().err == (
        f"Error: connection refused: no gateway listening on 127.0.0.1:{port}\n")
    # not connected at all: the command says so
    assert main(["-script", file]) == 1
    assert capsys.readouterr().err.startswith(
        "Error: not connected; 'connect [URL] [USER] [PASSWORD]' first\n")


def test_a_revoked_or_expired_token_is_renewed_with_the_credentials(gateway):
    conn = Connection(url(gateway), "admin", "adminpw", None)
    conn.login()
    old = conn.token
    other = Connection(url(gateway), "admin", "", None)
    other.token = old
    other.close()  # revokes the token both hold
    assert conn.call(Call("GET", "/api/v1/server"))["queues"] >= 1
    assert conn.token not in (None, old)
    conn.close()


def test_the_password_may_come_from_the_environment(gateway, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GATEWAY_ADMIN_PASSWORD", "adminpw")
    assert main(["-server", url(gateway), "-script", script(tmp_path, "show users\n")]) == 0
    assert "bob" in capsys.readouterr().out


def test_connect_in_a_script_and_the_admin_subcommand(gateway, tmp_path):
    file = script(tmp_path, f"connect {url(gateway)} admin adminpw\nshow topics\ndisconnect\n"
                            "show topics\n")
    r = subprocess.run([sys.executable, "-m", "gateway", "admin", "-script", file],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 1
    assert r.stdout.splitlines()[0] == f"Connected to: {url(gateway)}"
    assert "Topic Name  SNFGEIBCTM" in r.stdout
    assert r.stderr.splitlines() == ["Error: not connected; 'connect [URL] [USER] [PASSWORD]' "
                                     "first", f"{file}:4: stopped at 'show topics'"]
    assert "Traceback" not in r.stderr


def test_https_with_the_servers_certificate_or_insecure(tmp_path, capsys):
    cert, key = make_cert(tmp_path)
    gw = f"listen = https://127.0.0.1:0\ntls_cert = {cert}\ntls_key = {key}\n"
    with GatewayThread(tmp_path / "gw", gateway=gw, users=USERS) as g:
        server = f"https://127.0.0.1:{g.port('https')}"
        file = script(tmp_path, "show server\n")
        base = ["-server", server, "-password", "adminpw", "-script", file]
        assert main(base + ["--cacert", str(cert)]) == 0
        assert "Server:" in capsys.readouterr().out
        assert main(base) == 1  # a self-signed certificate the system does not trust
        err = capsys.readouterr().err
        assert err.startswith(f"Error: TLS with 127.0.0.1:{g.port('https')} failed: ")
        assert "CERTIFICATE_VERIFY_FAILED" in err and "Traceback" not in err
        assert main(base + ["--insecure"]) == 0


# -- the interactive prompt in a pseudo-terminal ----------------------------------------------

ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[=>]|[\r\x07]")


class Terminal:
    """``gateway admin`` on a pseudo-terminal: what it writes, read until a pattern shows."""

    def __init__(self, args: list[str], home: Path) -> None:
        self.fd, slave = pty.openpty()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(home), "TERM": "dumb",
               "INPUTRC": os.devnull}
        env.pop("GATEWAY_ADMIN_PASSWORD", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "gateway", "admin", *args],
                                     stdin=slave, stdout=slave, stderr=slave, env=env,
                                     start_new_session=True)
        os.close(slave)
        self.seen = ""

    def expect(self, pattern: str, timeout: float = 30) -> str:
        """Read until ``pattern`` shows (escapes removed); the text up to it, consumed."""
        end = time.monotonic() + timeout
        while True:
            m = re.search(pattern, self.seen)
            if m:
                before, self.seen = self.seen[:m.end()], self.seen[m.end():]
                return before
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{pattern!r} not seen; got {self.seen!r}")
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    data = os.read(self.fd, 4096)
                except OSError:  # the other side closed
                    data = b""
                if not data:
                    raise AssertionError(f"{pattern!r} not seen before the end: {self.seen!r}")
                self.seen += ESCAPES.sub("", data.decode(errors="replace"))

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def close(self) -> int:
        try:
            return self.proc.wait(timeout=30)
        finally:
            os.close(self.fd)
            if self.proc.poll() is None:
                self.proc.kill()


def test_the_prompt_runs_commands_with_history_and_completion(gateway, tmp_path):
    fill(gateway, "orders.eu", 2)
    prompt = re.escape(f"admin@127.0.0.1:{gateway.port('http')}> ")
    term = Terminal(["-server", url(gateway), "-password", "adminpw"], tmp_path)
    try:
        term.expect("Connected to: ")
        term.expect(prompt)
        term.send("show qu\t")  # TAB completes the command word
        term.expect("show queues ")
        term.send("\n")
        out = term.expect(prompt)
        assert re.search(r"orders\.eu +-+ +5 +0 +2 ", out), out
        term.send("show queue orders.\t")  # and the queue's name, from the API
        term.expect("show queue orders.eu ")
        term.send("\n")
        assert "Pending msgs:       2" in term.expect(prompt)
        term.send("purge queue nosuch\n")
        assert "Error: no queue named 'nosuch'" in term.expect(prompt)
        term.send("\x1b[A\x1b[A\n")  # up twice: the command before last, run again
        assert "Queue:              orders.eu" in term.expect(prompt)
        term.send("exit\n")
        assert term.close() == 0
    finally:
        if term.proc.poll() is None:
            term.proc.kill()
    history = (tmp_path / ".gateway_admin_history").read_text().splitlines()
    assert [h.rstrip() for h in history[-4:]] == ["show queue orders.eu", "purge queue nosuch",
                            "show queue orders.eu", "exit"]
    # the next session starts with that history
    term = Terminal(["-server", url(gateway), "-password", "adminpw"], tmp_path)
    try:
        term.expect(prompt)
        term.send("\x1b[A\x1b[A\n")
        assert "Queue:              orders.eu" in term.expect(prompt)
        term.send("quit\n")
        assert term.close() == 0
    finally:
        if term.proc.poll() is None:
            term.proc.kill()


def test_the_prompt_asks_for_a_refused_password_and_connects(gateway, tmp_path):
    term = Terminal(["-server", url(gateway)], tmp_path)
    try:
        term.expect("Password: ")
        term.send("adminpw\n")
        term.expect(re.escape(f"admin@127.0.0.1:{gateway.port('http')}> "))
        term.send("disconnect\n")
        term.expect("gateway> ")
        term.send("show queues\n")
        assert "Error: not connected" in term.expect("gateway> ")
        term.send(f"connect {url(gateway)} bob bobpw\n")
        term.expect(re.escape(f"bob@127.0.0.1:{gateway.port('http')}> "))
        term.send("show server\n")  # bob has no administrator permission
        assert "Error: " in term.expect("> ")
        term.send("\x04")  # end of input
        assert term.close() == 0
    finally:
        if term.proc.poll() is None:
            term.proc.kill()
