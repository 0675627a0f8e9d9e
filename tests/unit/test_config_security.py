"""users.conf, groups.conf, acl.conf and Security: authentication and positive inheritance
of permissions (TIBCO EMS User's Guide, "acl.conf", "users.conf" and "groups.conf"; chapter
"Authentication and Permissions")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.config import Security, hash_password, load_config, verify_password
from gateway.config import security as smod
from gateway.config.security import AclEntry, Group, User, make_acl_entry
from gateway.errors import ConfigError, ConfigErrors


def write(d: Path, **files: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / f"{name}.conf").write_text(text)
    return d


def load_security(d: Path, **files: str) -> tuple[Security, list[str]]:
    cfg = load_config(write(d, topics=">", queues=">", **files))
    return cfg.security, cfg.warnings


def load_errors(d: Path, **files: str) -> list[tuple[str, int | None, str]]:
    write(d, topics=">", queues=">", **files)
    with pytest.raises(ConfigErrors) as ei:
        load_config(d)
    return [(os.path.basename(e.file), e.line, e.detail) for e in ei.value.errors]


# -- passwords -------------------------------------------------------------------------


def test_hash_and_verify() -> None:
    h = hash_password("s3cret", iterations=1000)
    assert h.startswith("$pbkdf2-sha256$1000$")
    assert ":" not in h  # must fit in users.conf
    assert verify_password(h, "s3cret")
    assert not verify_password(h, "s3cret ")
    assert hash_password("s3cret", iterations=1000) != h  # fresh salt each time


def test_known_vector() -> None:
    """PBKDF2-HMAC-SHA256 test vector (RFC 7914 §11: P="passwd", S="salt", c=1)."""
    h = hash_password("passwd", iterations=1, salt=b"salt")
    digest = smod._unb64(h.rsplit("$", 1)[1])
    assert digest.hex().startswith("55ac046e56e3089fec1691c22544b605")


def test_plain_and_empty_passwords() -> None:
    assert verify_password("pw", "pw") and not verify_password("pw", "PW")
    assert verify_password("", "") and not verify_password("", "x")


def test_authenticate(tmp_path: Path) -> None:
    h = hash_password("hashed-pw", iterations=1000)
    sec, _ = load_security(
        tmp_path,
        users=f'alice:plain:"Alice"\nbob:{h}:"Bob"\ncarol::"no password"\n'
        'admin: : "Administrator"\n',
    )
    assert sec.authenticate("alice", "plain")
    assert not sec.authenticate("alice", "wrong")
    assert sec.authenticate("bob", "hashed-pw")
    assert sec.authenticate("bob", "hashed-pw")  # second time from the cache
    assert not sec.authenticate("bob", "plain")
    assert sec.authenticate("carol", "") and sec.authenticate("carol", None)
    assert not sec.authenticate("carol", "x")
    # EMS User's Guide, "users.conf": blank password with blanks around
    assert sec.authenticate("admin", "")
    assert not sec.authenticate("dave", "")
    assert not sec.authenticate(None, "")
    assert sec.users["alice"].description == "Alice"


def test_authentication_cache_follows_password_change() -> None:
    old = hash_password("one", iterations=10)
    sec = Security([User("u", old)])
    assert sec.authenticate("u", "one")
    sec.users["u"] = User("u", hash_password("two", iterations=10))
    assert not sec.authenticate("u", "one")
    assert sec.authenticate("u", "two")


# -- users.conf / groups.conf ------------------------------------------------------------


def test_users_file_forms(tmp_path: Path) -> None:
    sec, _ = load_security(tmp_path, users='a:p\nb:p:w:"desc: with colon"\nc:#notacomment\n')
    assert sec.users["a"].password == "p"
    assert sec.users["b"].password == "p:w" and sec.users["b"].description == "desc: with colon"
    assert sec.users["c"].password == "#notacomment"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("noseparator", 'expected username:password:"description"'),
        (":pw", "empty user name"),
        ("x" * 128 + ":pw", "the limit is 127"),
        ("has space:pw", "may not contain"),
        ("u:$pbkdf2-sha256$many$salt$hash", "$pbkdf2-sha256$iterations$salt$digest"),
    ],
)
def test_bad_user_line(tmp_path: Path, line: str, message: str) -> None:
    errors = load_errors(tmp_path, users=f"ok:pw\n{line}\n")
    assert [(f, n) for f, n, _ in errors] == [("users.conf", 2)]
    assert message in errors[0][2]


def test_duplicate_user(tmp_path: Path) -> None:
    errors = load_errors(tmp_path, users="a:1\nb:2\na:3\n")
    assert errors == [("users.conf", 3, "duplicate user 'a' (first at line 1)")]


def test_groups_and_the_all_group(tmp_path: Path) -> None:
    """EMS User's Guide, "groups.conf" example: administrators with admin and Bob."""
    sec, warnings = load_security(
        tmp_path,
        users="admin:\nBob:\nEve:\n",
        groups='administrators: "TIBCO EMS administrators"\nadmin\nBob\nops:\nBob\n',
    )
    assert sec.groups["administrators"].members == ("admin", "Bob")
    assert sec.groups["administrators"].description == "TIBCO EMS administrators"
    assert sec.groups_of("Bob") == {"administrators", "ops", "all"}
    assert sec.groups_of("Eve") == {"all"}
    assert sec.groups_of(None) == {"all"}
    assert warnings == []


def test_group_errors_and_warnings(tmp_path: Path) -> None:
    write(
        tmp_path,
        topics=">",
        queues=">",
        users="u1:\n",
        groups='orphan\ng1:"d"\nu1\nu1\nghost\nall:"x"\nmember-of-rejected\ng1:"again"\nbad:desc\n',
    )
    with pytest.raises(ConfigErrors) as ei:
        load_config(tmp_path)
    got = [(e.line, e.detail) for e in ei.value.errors]
    assert got == [
        (1, "user 'orphan' is not under a group-name:\"description\" line"),
        (6, "group 'all' is predefined and holds every user"),
        (8, "duplicate group 'g1' (first at line 2)"),
        (9, 'expected group-name:"description"'),
    ]


def test_group_warnings(tmp_path: Path) -> None:
    _, warnings = load_security(tmp_path, users="u1:\n", groups='g:"d"\nu1\nu1\nghost\n')
    assert len(warnings) == 2
    assert warnings[0].endswith("groups.conf:3: user 'u1' is listed twice in group 'g'")
    assert warnings[1].endswith("groups.conf:4: user 'ghost' of group 'g' is not in users.conf")


# -- acl.conf --------------------------------------------------------------------------


def test_acl_forms(tmp_path: Path) -> None:
    """EMS User's Guide, "acl.conf" example, including the blank after a comma."""
    sec, warnings = load_security(
        tmp_path,
        users="user2:\nsys-admins:\n",
        groups='group1:"g"\n',
        acl="ADMIN USER=sys-admins PERM=all\nTOPIC=foo USER=user2 PERM=publish, subscribe\n"
        "TOPIC=foo GROUP=group1 PERM=subscribe\nqueue=q.* group=all perm=SEND,browse\n",
    )
    entries = sec.acl_entries()
    assert entries[0] == AclEntry("admin", None, "sys-admins", False, frozenset({"all"}), 1)
    assert entries[1].perms == {"publish", "subscribe"} and entries[1].name == "foo"
    assert entries[2].is_group and entries[2].principal == "group1"
    assert entries[3] == AclEntry("queue", "q.*", "all", True, frozenset({"send", "browse"}), 4)
    assert warnings == []


def test_acl_all_expands_per_kind() -> None:
    t = make_acl_entry("topic", "x", ["all"], user="u")
    q = make_acl_entry("queue", "x", ["all"], user="u")
    assert {"publish", "subscribe", "durable", "use_durable", "view", "purge"} <= t.perms
    assert "send" not in t.perms
    assert {"send", "receive", "browse", "modify"} <= q.perms and "publish" not in q.perms


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("TOPIC=foo USER=u PERM=send", "unknown permission 'send' for a topic"),
        ("QUEUE=foo USER=u PERM=publish", "unknown permission 'publish' for a queue"),
        ("ADMIN USER=u PERM=publish", "unknown permission 'publish' for ADMIN"),
        ("TOPIC=foo USER=u", "missing PERM="),
        ("TOPIC=foo QUEUE=bar USER=u PERM=send", "exactly one of TOPIC=, QUEUE= or ADMIN"),
        ("USER=u PERM=send", "exactly one of TOPIC=, QUEUE= or ADMIN"),
        ("ADMIN TOPIC=x USER=u PERM=view-all", "exactly one of TOPIC=, QUEUE= or ADMIN"),
        ("TOPIC=foo USER=u GROUP=g PERM=publish", "exactly one of USER and GROUP"),
        ("TOPIC=foo PERM=publish", "exactly one of USER and GROUP"),
        ("TOPIC=foo USER=u PERM=publish PERM=subscribe", "PERM= is given twice"),
        ("TOPIC=a..b USER=u PERM=publish", "empty element"),
        ("TOPIC=foo USER=u PERM=publish,,subscribe", "empty permission"),
        ("GRANT everything", "expected TOPIC=name"),
        ("TOPIC=foo bar USER=u PERM=publish", "TOPIC= needs one name without blanks"),
    ],
)
def test_bad_acl_line(tmp_path: Path, line: str, message: str) -> None:
    errors = load_errors(tmp_path, users="u:\n", groups='g:"x"\n', acl=f"# acl\n{line}\n")
    assert [(f, n) for f, n, _ in errors] == [("acl.conf", 2)]
    assert message in errors[0][2]


def test_acl_unknown_principals_are_warnings(tmp_path: Path) -> None:
    _, warnings = load_security(
        tmp_path,
        acl="TOPIC=t USER=nobody PERM=publish\nTOPIC=t GROUP=nogroup PERM=publish\n"
        "TOPIC=t USER=anonymous PERM=publish\nADMIN GROUP=$admin PERM=view-all\n",
    )
    assert len(warnings) == 2
    assert "acl.conf:1: " in warnings[0] and "acl.conf:2: " in warnings[1]
    assert "user 'nobody' is not in users.conf" in warnings[0]
    assert "group 'nogroup' is not in groups.conf" in warnings[1]


# -- permission checks -----------------------------------------------------------------


def security(acl: str, groups: str = "") -> Security:
    from gateway.config.files import SourceLine
    from gateway.config.security import parse_acl, parse_groups

    def lines(text: str) -> list[SourceLine]:
        return [SourceLine("f", i, t) for i, t in enumerate(text.splitlines(), 1) if t]

    errors: list[ConfigError] = []
    users = ["alice", "bob", "carol"]
    gs = parse_groups(lines(groups), users, errors, [])
    entries = parse_acl(lines(acl), users, [g.name for g in gs], errors, [])
    assert errors == []
    return Security([User(u) for u in users], gs, entries)


def test_direct_grant() -> None:
    sec = security("TOPIC=foo USER=alice PERM=publish")
    assert sec.check("alice", "topic", "foo", "publish")
    assert not sec.check("alice", "topic", "foo", "subscribe")
    assert not sec.check("bob", "topic", "foo", "publish")
    assert not sec.check("alice", "queue", "foo", "send")
    assert not sec.check("alice", "topic", "foo.bar", "publish")


def test_wildcard_grant_covers_matching_names() -> None:
    """EMS User's Guide, "Inheritance of Permissions": publish on foo.* covers foo.bar and
    foo.new."""
    sec = security("TOPIC=foo.* USER=alice PERM=publish\nQUEUE=> USER=bob PERM=receive")
    assert sec.check("alice", "topic", "foo.bar", "publish")
    assert sec.check("alice", "topic", "foo.new", "publish")
    assert not sec.check("alice", "topic", "foo.bar.baz", "publish")
    assert sec.check("bob", "queue", "any.queue.name", "receive")


def test_wildcard_subscription_needs_a_containing_grant() -> None:
    """EMS User's Guide, "Implications of Wildcards on Permissions": foo.> contains foo.bar.*;
    foo.bar.* only intersects foo.*.baz."""
    sec = security("TOPIC=foo.> USER=alice PERM=durable\nTOPIC=foo.bar.* USER=bob PERM=durable")
    assert sec.check("alice", "topic", "foo.bar.*", "durable")
    assert sec.check("alice", "topic", "foo.*.baz", "durable")
    assert not sec.check("bob", "topic", "foo.*.baz", "durable")
    assert sec.check("bob", "topic", "foo.bar.*", "durable")  # the same wildcard


def test_group_and_all_grants() -> None:
    sec = security(
        "TOPIC=foo GROUP=g PERM=subscribe\nQUEUE=q GROUP=all PERM=browse",
        groups='g:"x"\nbob\n',
    )
    assert sec.check("bob", "topic", "foo", "subscribe")
    assert not sec.check("alice", "topic", "foo", "subscribe")
    for who in ("alice", "bob", "carol", None, "stranger"):
        assert sec.check(who, "queue", "q", "browse")
    assert not sec.check(None, "queue", "q", "send")


def test_anonymous_is_the_anonymous_user() -> None:
    sec = Security([], [], [make_acl_entry("topic", "pub.>", ["subscribe"], user="anonymous")])
    assert sec.check(None, "topic", "pub.news", "subscribe")
    assert sec.check("", "topic", "pub.news", "subscribe")
    assert not sec.check("alice", "topic", "pub.news", "subscribe")


def test_union_of_user_and_group_permissions() -> None:
    sec = security(
        "TOPIC=t USER=bob PERM=publish\nTOPIC=t.* GROUP=g PERM=subscribe\nTOPIC=> GROUP=all PERM=durable",
        groups='g:"x"\nbob\n',
    )
    assert sec.permissions("bob", "topic", "t") == {"publish", "durable"}
    assert sec.permissions("bob", "topic", "t.x") == {"subscribe", "durable"}
    assert sec.permissions("carol", "topic", "t.x") == {"durable"}


def test_sec2_revoking_a_direct_grant_keeps_inherited_ones() -> None:
    """EMS User's Guide, "Inheritance of Permissions"; "User Permissions"."""
    sec = security(
        "TOPIC=foo.* GROUP=g PERM=publish\nTOPIC=foo.bar USER=bob PERM=publish,subscribe",
        groups='g:"x"\nbob\n',
    )
    assert sec.check("bob", "topic", "foo.bar", "subscribe")
    assert sec.revoke("topic", "foo.bar", ["publish", "subscribe"], user="bob") is True
    assert sec.check("bob", "topic", "foo.bar", "publish")  # still, through the group
    assert not sec.check("bob", "topic", "foo.bar", "subscribe")  # only granted directly
    assert sec.revoke("topic", "foo.bar", ["publish"], user="bob") is False


def test_grant_invalidates_cached_answers() -> None:
    sec = security("")
    assert not sec.check("alice", "queue", "q", "send")
    sec.grant("queue", "q", ["send"], user="alice")
    assert sec.check("alice", "queue", "q", "send")
    with pytest.raises(ValueError, match="unknown permission"):
        sec.grant("queue", "q", ["fly"], user="alice")


def test_partial_revoke_keeps_the_rest_of_the_entry() -> None:
    sec = security("QUEUE=q USER=alice PERM=send,receive")
    sec.revoke("queue", "q", ["send"], user="alice")
    assert sec.permissions("alice", "queue", "q") == {"receive"}


def test_check_rejects_unknown_permission() -> None:
    sec = security("")
    with pytest.raises(ValueError):
        sec.check("alice", "topic", "t", "send")
    with pytest.raises(ValueError):
        sec.admin_check("alice", "publish")
    with pytest.raises(ValueError):
        sec.check("alice", "admin", "t", "view-all")  # type: ignore[arg-type]


def test_destination_admin_permissions() -> None:
    """EMS User's Guide, "Destination-Level Permissions": create/modify/delete/purge imply view."""
    sec = security("QUEUE=acct.* USER=alice PERM=modify")
    assert sec.check("alice", "queue", "acct.x", "modify")
    assert sec.check("alice", "queue", "acct.x", "view")
    assert not sec.check("alice", "queue", "acct.x", "purge")
    assert not sec.check("alice", "queue", "payroll.x", "view")


def test_global_admin_permission_overrides_destination_level() -> None:
    """EMS User's Guide, "Destination-Level Permissions"."""
    sec = security("ADMIN USER=bob PERM=modify-destination")
    assert sec.check("bob", "queue", "any", "modify")
    assert sec.check("bob", "topic", "any", "view")
    assert not sec.check("bob", "topic", "any", "delete")


def test_admin_check() -> None:
    sec = security(
        "ADMIN USER=alice PERM=change-user\nADMIN GROUP=ops PERM=view-all\n"
        "ADMIN USER=carol PERM=all",
        groups='ops:"x"\nbob\n$admin:"admins"\ncarol\n',
    )
    assert sec.admin_check("admin", "shutdown")  # predefined administrator
    assert sec.admin_check("alice", "change-user")
    assert sec.admin_check("alice", "view-user")  # change implies view
    assert not sec.admin_check("alice", "view-group")
    assert sec.admin_check("bob", "view-server") and sec.admin_check("bob", "view-acl")
    assert not sec.admin_check("bob", "change-server")
    assert sec.admin_check("carol", "shutdown")
    assert not sec.admin_check(None, "view-server")


def test_admin_group_members_hold_everything() -> None:
    sec = Security([User("x")], [Group("$admin", "", ("x",))], [])
    assert sec.admin_check("x", "change-acl")


def test_acl_entry_to_line_round_trips(tmp_path: Path) -> None:
    e = make_acl_entry("queue", "q.*", ["send", "browse"], group="g")
    assert e.to_line() == "QUEUE=q.* GROUP=g PERM=browse,send"
    sec, _ = load_security(tmp_path, groups='g:"x"\n', acl=e.to_line() + "\n")
    assert sec.acl_entries()[0].perms == e.perms
