"""``users.conf``, ``groups.conf`` and ``acl.conf``: who may connect and what they may do.

How this works. The three files are parsed into :class:`User`, :class:`Group` and
:class:`AclEntry` records and held by :class:`Security`, which answers two questions:
*may this user log in* (:meth:`Security.authenticate`) and *does this user hold this
permission on this destination* (:meth:`Security.check`, :meth:`Security.admin_check`).
The core decides *when* to ask: only with ``authorization`` enabled, and for destination
permissions only on ``secure`` destinations (TIBCO EMS User's Guide,
"When Permissions Are Checked") -- except for the monitor topics, always asked
(:meth:`Security.may_monitor`, EMS User's Guide, "Viewing Monitor Topics").

Permissions have positive boolean inheritance (EMS User's Guide, "Inheritance of Permissions";
"User Permissions"): a user holds the union of the grants made to the user, to each group the
user belongs to and to the predefined group ``all`` (every user, including ``anonymous``); a
grant on a wildcard (``foo.*``) covers every name it matches, and, for a wildcard subscription,
every wildcard it contains (:func:`gateway.subject.contains`). Nothing revokes what another
grant gives.

File formats::

    users.conf    username:password:"description"      (EMS User's Guide, "users.conf")
    groups.conf   group-name:"description"              (EMS User's Guide, "groups.conf")
                  member-user-name                       one per line, after its group
    acl.conf      TOPIC=name USER=u PERM=p1,p2           (EMS User's Guide, "acl.conf")
                  QUEUE=name GROUP=g PERM=...
                  ADMIN USER=u PERM=...

A password is plain text, empty (anyone giving the user name and no password may log in,
as EMS's blank passwords), or a hash made by :func:`hash_password`:
``$pbkdf2-sha256$<iterations>$<salt>$<digest>`` (salt and digest base64url, unpadded).
Names are at most 127 characters and may not contain ``:`` (EMS User's Guide,
"Naming Conventions"; "users.conf").
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal

from gateway import subject
from gateway.config.files import SourceLine
from gateway.errors import ConfigError, InvalidDestinationError

MAX_NAME = 127  # EMS User's Guide, "Naming Conventions"; "groups.conf"
HASH_PREFIX = "$pbkdf2-sha256$"
PBKDF2_ITERATIONS = 200_000
MAX_CACHED_CHECKS = 65_536
ALL_GROUP = "all"  # EMS User's Guide, "acl.conf": predefined group of every user
# EMS User's Guide, "Predefined Administrative User and Group": predefined administrator,
# cannot be restricted
ADMIN_USER = "admin"
ADMIN_GROUP = "$admin"  # members hold every administrator permission
# EMS User's Guide, "Command Listing", show connections: connections without a user name
ANONYMOUS = "anonymous"
# EMS User's Guide, "Monitoring Server Events": the server's monitor topics, whose grants stand
# apart (Security.may_monitor)
MONITOR_PREFIX = "$sys.monitor."

TOPIC_PERMS = frozenset({"publish", "subscribe", "durable", "use_durable"})  # Table 49
QUEUE_PERMS = frozenset({"send", "receive", "browse"})  # Table 48
DEST_ADMIN_PERMS = frozenset({"view", "create", "delete", "modify", "purge"})  # Table 46
ADMIN_PERMS = frozenset(  # EMS User's Guide, Table 45 "Global administrator permissions"
    {
        "all", "view-all", "change-acl", "change-admin-acl", "change-bridge",
        "change-connection", "create-destination", "modify-destination",
        "delete-destination", "change-durable", "change-factory", "change-group",
        "change-message", "change-route", "change-server", "change-user",
        "purge-destination", "purge-durable", "shutdown", "view-acl", "view-admin-acl",
        "view-connection", "view-bridge", "view-destination", "view-durable",
        "view-factory", "view-group", "view-message", "view-route", "view-server",
        "view-user", "protect1", "protect2", "protect3", "protect4",
    }
)  # fmt: skip
PERMS: dict[str, frozenset[str]] = {
    "topic": TOPIC_PERMS | DEST_ADMIN_PERMS,
    "queue": QUEUE_PERMS | DEST_ADMIN_PERMS,
    "admin": ADMIN_PERMS,
}
# EMS User's Guide, "Global Administrator Permissions"; "Destination-Level Permissions": any
# change/modify permission implies the view one
_ADMIN_IMPLIES: dict[str, tuple[str, ...]] = {
    "view-acl": ("change-acl",),
    "view-admin-acl": ("change-admin-acl",),
    "view-bridge": ("change-bridge",),
    "view-connection": ("change-connection",),
    "view-destination": (
        "create-destination", "modify-destination", "delete-destination", "purge-destination",
    ),
    "view-durable": ("change-durable", "purge-durable"),
    "view-factory": ("change-factory",),
    "view-group": ("change-group",),
    "view-message": ("change-message",),
    "view-route": ("change-route",),
    "view-server": ("change-server",),
    "view-user": ("change-user", "view-group", "change-group"),
}  # fmt: skip
# destination-level admin permission -> the global ones that override it (EMS User's Guide,
# "Destination-Level Permissions")
_DEST_GLOBAL: dict[str, tuple[str, ...]] = {
    "view": ("view-destination",) + _ADMIN_IMPLIES["view-destination"],
    "create": ("create-destination",),
    "delete": ("delete-destination",),
    "modify": ("modify-destination",),
    "purge": ("purge-destination", "purge-durable"),
}

Kind = Literal["topic", "queue"]


# -- passwords -------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def hash_password(
    plain: str, *, iterations: int = PBKDF2_ITERATIONS, salt: bytes | None = None
) -> str:
    """The ``users.conf`` form of ``plain``: ``$pbkdf2-sha256$iterations$salt$digest``."""
    salt = os.urandom(16) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha256", plain.encode("utf-8"), salt, iterations)
    return f"{HASH_PREFIX}{iterations}${_b64(salt)}${_b64(digest)}"


def _split_hash(stored: str) -> tuple[int, bytes, bytes]:
    parts = stored[len(HASH_PREFIX) :].split("$")
    if len(parts) != 3 or not parts[0].isdigit() or int(parts[0]) < 1:
        raise ValueError("a hashed password must be $pbkdf2-sha256$iterations$salt$digest")
    try:
        return int(parts[0]), _unb64(parts[1]), _unb64(parts[2])
    except ValueError:
        raise ValueError("the salt or digest of a hashed password is not base64") from None


def verify_password(stored: str, plain: str) -> bool:
    """True if ``plain`` matches ``stored`` (plain text, empty, or a hash)."""
    if stored.startswith(HASH_PREFIX):
        try:
            iterations, salt, digest = _split_hash(stored)
        except ValueError:
            return False
        got = hashlib.pbkdf2_hmac("sha256", plain.encode("utf-8"), salt, iterations)
        return hmac.compare_digest(got, digest)
    return hmac.compare_digest(stored.encode("utf-8"), plain.encode("utf-8"))


# -- records ---------------------------------------------------------------------------


class VerifiedUser(str):
    """A user name whose password ``users.conf`` confirmed at connect time, as
    :meth:`gateway.broker.Broker.authenticate` returns it; the broker keeps the fact and
    gives the connection the plain name. With ``authorization`` disabled only this says
    that a client logged in with a valid user name and password, which the monitor topics
    ask of every subscriber (EMS User's Guide, "Viewing Monitor Topics")."""

    __slots__ = ()



@dataclass(frozen=True, slots=True)
class User:
    name: str
    password: str = ""  # stored form: "", plain text or a hash_password() string
    description: str = ""
    line: int | None = None


@dataclass(frozen=True, slots=True)
class Group:
    name: str
    description: str = ""
    members: tuple[str, ...] = ()
    line: int | None = None


@dataclass(frozen=True, slots=True)
class AclEntry:
    """One ``acl.conf`` line: ``kind`` is ``topic``, ``queue`` or ``admin`` (``name`` None)."""

    kind: Literal["topic", "queue", "admin"]
    name: str | None
    principal: str
    is_group: bool
    perms: frozenset[str]
    line: int | None = None

    def to_line(self) -> str:
        head = "ADMIN" if self.kind == "admin" else f"{self.kind.upper()}={self.name}"
        who = f"GROUP={self.principal}" if self.is_group else f"USER={self.principal}"
        return f"{head} {who} PERM={','.join(sorted(self.perms))}"


# -- the answerer ----------------------------------------------------------------------


class Security:
    """Users, groups and ACL; answers authentication and permission questions."""

    def __init__(
        self,
        users: Iterable[User] = (),
        groups: Iterable[Group] = (),
        acl: Iterable[AclEntry] = (),
    ) -> None:
        self.users: dict[str, User] = {u.name: u for u in users}
        self.groups: dict[str, Group] = {g.name: g for g in groups}
        self._acl: list[AclEntry] = list(acl)
        self._member_of: dict[str, frozenset[str]] = {}
        self._cache: dict[tuple[str, str, str, str], bool] = {}
        self._auth_ok: dict[tuple[str, bytes], str] = {}
        self._rebuild()

    def _rebuild(self) -> None:
        member_of: dict[str, set[str]] = {}
        for g in self.groups.values():
            for m in g.members:
                member_of.setdefault(m, set()).add(g.name)
        self._member_of = {u: frozenset(gs) for u, gs in member_of.items()}
        self._cache.clear()

    # -- authentication ------------------------------------------------------------

    def authenticate(self, username: str | None, password: str | None) -> bool:
        """True if ``username`` is in ``users.conf`` and ``password`` matches.

        An empty stored password accepts an empty (or missing) password. Successful hash
        checks are remembered (keyed by a SHA-256 of the password) so that reconnecting
        clients do not pay for PBKDF2 each time.
        """
        if not username:
            return False
        user = self.users.get(username)
        if user is None:
            return False
        plain = password or ""
        if not user.password.startswith(HASH_PREFIX):
            return verify_password(user.password, plain)
        key = (username, hashlib.sha256(plain.encode("utf-8")).digest())
        if self._auth_ok.get(key) == user.password:
            return True
        ok = verify_password(user.password, plain)
        if ok:
            if len(self._auth_ok) >= MAX_CACHED_CHECKS:
                self._auth_ok.clear()
            self._auth_ok[key] = user.password
        return ok

    def admin_has_password(self) -> bool:
        """Whether the predefined ``admin`` user has a password in ``users.conf``. EMS's
        ``admin`` has none until one is set (EMS User's Guide, "Predefined Administrative
        User and Group"; ``set password admin``)."""
        user = self.users.get(ADMIN_USER)
        return user is not None and user.password != ""

    def authenticate_administrator(self, username: str | None, password: str | None) -> bool:
        """:meth:`authenticate` for the admin API, which also knows the predefined ``admin``
        user when ``users.conf`` does not list it: then it has an empty password (EMS
        User's Guide, "Predefined Administrative User and Group"). Client connections do
        not use this: they carry no administrator rights."""
        if username == ADMIN_USER and ADMIN_USER not in self.users:
            return hmac.compare_digest((password or "").encode("utf-8"), b"")
        return self.authenticate(username, password)

    # -- permissions ---------------------------------------------------------------

    def groups_of(self, user: str | None) -> frozenset[str]:
        """The groups ``user`` belongs to, always including ``all``."""
        return self._member_of.get(user or ANONYMOUS, frozenset()) | {ALL_GROUP}

    def permissions(self, user: str | None, kind: Kind, name: str) -> frozenset[str]:
        """Every permission ``user`` holds on ``name`` (the union of all grants)."""
        who = user or ANONYMOUS
        groups = self.groups_of(who)
        wild = subject.is_wildcard(name)
        out: set[str] = set()
        for e in self._acl:
            if e.kind != kind or not (e.principal in groups if e.is_group else e.principal == who):
                continue
            assert e.name is not None
            if e.name == name or (
                subject.contains(e.name, name) if wild else subject.matches(e.name, name)
            ):
                out |= e.perms
        return frozenset(out)

    def check(self, user: str | None, kind: Kind, name: str, perm: str) -> bool:
        """Whether ``user`` (``None`` = anonymous) holds ``perm`` on ``kind`` ``name``.

        Raises:
            ValueError: ``perm`` is not a permission of ``kind``.
        """
        key = (user or ANONYMOUS, kind, name, perm)
        try:
            return self._cache[key]
        except KeyError:
            pass
        if kind not in ("topic", "queue") or perm not in PERMS[kind]:
            raise ValueError(f"{perm!r} is not a {kind} permission")
        held = self.permissions(user, kind, name)
        ok = perm in held
        if not ok and perm == "view":
            # EMS User's Guide, "Destination-Level Permissions"
            ok = bool(held & {"create", "delete", "modify", "purge"})
        if not ok and perm in _DEST_GLOBAL:
            ok = any(self.admin_check(user, g) for g in _DEST_GLOBAL[perm])
        if len(self._cache) >= MAX_CACHED_CHECKS:
            self._cache.clear()
        self._cache[key] = ok
        return ok

    def may_monitor(self, user: str, pattern: str) -> bool:
        """Whether ``user`` may subscribe to the monitor topic (or wildcard) ``pattern``:
        ``admin`` and members of ``$admin`` may; anyone else needs ``subscribe`` from a grant
        on a ``$sys.monitor.`` name that covers ``pattern``. Such topics inherit nothing from
        other parents: a grant on ``>`` or ``*.*`` does not count (EMS User's Guide,
        "Monitoring Server Events", "Viewing Monitor Topics")."""
        groups = self.groups_of(user)
        if user == ADMIN_USER or ADMIN_GROUP in groups:
            return True
        wild = subject.is_wildcard(pattern)
        for e in self._acl:
            if (e.kind != "topic" or "subscribe" not in e.perms or e.name is None
                    or not e.name.startswith(MONITOR_PREFIX)
                    or not (e.principal in groups if e.is_group else e.principal == user)):
                continue
            if e.name == pattern or (
                subject.contains(e.name, pattern) if wild else subject.matches(e.name, pattern)
            ):
                return True
        return False

    def admin_check(self, user: str | None, perm: str) -> bool:
        """Whether ``user`` holds the global administrator permission ``perm`` (Table 45).

        ``admin`` and members of ``$admin`` hold them all (EMS User's Guide,
        "Predefined Administrative User and Group"); ``all`` grants every one, ``view-all``
        every ``view-*`` one, and a change permission implies its view permission.
        """
        if perm not in ADMIN_PERMS:
            raise ValueError(f"{perm!r} is not an administrator permission")
        who = user or ANONYMOUS
        groups = self.groups_of(who)
        if who == ADMIN_USER or ADMIN_GROUP in groups:
            return True
        held: set[str] = set()
        for e in self._acl:
            if e.kind == "admin" and (e.principal in groups if e.is_group else e.principal == who):
                held |= e.perms
        if "all" in held or perm in held:
            return True
        if perm.startswith("view-") and "view-all" in held:
            return True
        return any(p in held for p in _ADMIN_IMPLIES.get(perm, ()))

    # -- run-time changes (admin) --------------------------------------------------

    def grant(
        self,
        kind: Literal["topic", "queue", "admin"],
        name: str | None,
        perms: Iterable[str],
        *,
        user: str | None = None,
        group: str | None = None,
    ) -> AclEntry:
        """Add permissions (admin ``grant``); returns the new ACL entry."""
        entry = make_acl_entry(kind, name, perms, user=user, group=group)
        self._acl.append(entry)
        self._cache.clear()
        return entry

    def revoke(
        self,
        kind: Literal["topic", "queue", "admin"],
        name: str | None,
        perms: Iterable[str],
        *,
        user: str | None = None,
        group: str | None = None,
    ) -> bool:
        """Remove permissions granted *directly* by entries for exactly this principal and
        name (admin ``revoke``). Grants through groups or wildcards stay (EMS User's Guide,
        "Inheritance of Permissions"). Returns whether anything was removed."""
        target = make_acl_entry(kind, name, perms, user=user, group=group)
        changed = False
        kept: list[AclEntry] = []
        for e in self._acl:
            if (e.kind, e.name, e.principal, e.is_group) == (
                target.kind,
                target.name,
                target.principal,
                target.is_group,
            ) and e.perms & target.perms:
                changed = True
                rest = e.perms - target.perms
                if rest:
                    kept.append(AclEntry(e.kind, e.name, e.principal, e.is_group, rest, e.line))
            else:
                kept.append(e)
        self._acl = kept
        self._cache.clear()
        return changed

    def acl_entries(self) -> list[AclEntry]:
        return list(self._acl)

    def add_user(self, name: str, password: str = "", description: str = "") -> User:
        """``create user`` (EMS User's Guide, "Command Listing"): ``password`` in plain text
        is stored hashed. Raises ValueError for a bad or existing name."""
        _check_name(name, "user")
        if name in self.users:
            raise ValueError(f"user {name!r} exists")
        user = User(name, hash_password(password) if password else "", description)
        self.users[name] = user
        return user

    def change_user(self, name: str, *, password: str | None = None,
                    description: str | None = None) -> User:
        """``set password`` (and the description); KeyError for an unknown user."""
        old = self.users[name]
        stored = old.password if password is None else (hash_password(password) if password
                                                         else "")
        user = User(name, stored, old.description if description is None else description,
                    old.line)
        self.users[name] = user
        self._auth_ok = {k: v for k, v in self._auth_ok.items() if k[0] != name}
        return user

    def put_user(self, name: str, stored: str, description: str = "") -> User:
        """Define or redefine user ``name`` with a password already in its stored form
        (another cluster node's change, see gateway.admin_shared). ValueError for a bad
        name."""
        _check_name(name, "user")
        old = self.users.get(name)
        user = User(name, stored, description, old.line if old is not None else None)
        self.users[name] = user
        self._auth_ok = {k: v for k, v in self._auth_ok.items() if k[0] != name}
        return user

    def remove_user(self, name: str) -> None:
        """``delete user``: also out of every group; KeyError for an unknown user."""
        del self.users[name]
        self._auth_ok = {k: v for k, v in self._auth_ok.items() if k[0] != name}
        for g in list(self.groups.values()):
            if name in g.members:
                self.groups[g.name] = replace(g, members=tuple(m for m in g.members
                                                               if m != name))
        self._rebuild()

    def add_group(self, name: str, description: str = "") -> Group:
        """``create group``; ValueError for a bad, predefined or existing name."""
        _check_name(name, "group")
        if name == ALL_GROUP or name in self.groups:
            raise ValueError(f"group {name!r} exists")
        group = self.groups[name] = Group(name, description)
        return group

    def remove_group(self, name: str) -> None:
        """``delete group``; KeyError for an unknown group."""
        del self.groups[name]
        self._rebuild()

    def set_members(self, name: str, members: Iterable[str]) -> Group:
        """``addmember`` / ``removemember``: the group's members become ``members``; KeyError
        for an unknown group, ValueError for a bad user name."""
        wanted = tuple(dict.fromkeys(members))
        for m in wanted:
            _check_name(m, "user")
        group = self.groups[name] = replace(self.groups[name], members=wanted)
        self._rebuild()
        return group


def make_acl_entry(
    kind: Literal["topic", "queue", "admin"],
    name: str | None,
    perms: Iterable[str],
    *,
    user: str | None = None,
    group: str | None = None,
    line: int | None = None,
) -> AclEntry:
    """Validate and build one ACL entry; ``all`` expands to every permission of ``kind``.

    Raises:
        ValueError: an unknown permission, a bad name, or not exactly one of user/group.
    """
    if kind not in PERMS:
        raise ValueError(f"{kind!r} is not topic, queue or admin")
    if (user is None) == (group is None):
        raise ValueError("give exactly one of USER and GROUP")
    principal = user if user is not None else group
    assert principal is not None
    _check_name(principal, "group" if group is not None else "user")
    if kind == "admin":
        if name is not None:
            raise ValueError("an ADMIN entry names no destination")
    else:
        if not name:
            raise ValueError(f"missing {kind} name")
        try:
            subject.validate(name, wildcards=True, system=name.startswith(("$sys.", "$TMP$.")))
        except InvalidDestinationError as e:
            raise ValueError(str(e)) from None
    allowed = PERMS[kind]
    out: set[str] = set()
    for p in perms:
        p = p.strip().lower()
        if not p:
            raise ValueError("empty permission in the list")
        if p == "all" and kind != "admin":
            out |= allowed
        elif p in allowed:
            out.add(p)
        else:
            raise ValueError(
                f"unknown permission {p!r} for {'ADMIN' if kind == 'admin' else 'a ' + kind}"
            )
    if not out:
        raise ValueError("no permission given")
    return AclEntry(kind, name, principal, group is not None, frozenset(out), line)


def _check_name(name: str, what: str) -> None:
    if not name:
        raise ValueError(f"empty {what} name")
    if len(name) > MAX_NAME:
        raise ValueError(f"{what} name is {len(name)} characters; the limit is {MAX_NAME}")
    if ":" in name or any(c.isspace() for c in name):
        raise ValueError(f"{what} name {name!r} may not contain ':' or blanks")


# -- file parsers ----------------------------------------------------------------------

_USER_LINE = re.compile(r'([^:]*):(.*?)(?::\s*"(.*)")?\s*')
_ACL_KEY = re.compile(r"(?:^|\s)(TOPIC|QUEUE|USER|GROUP|PERM)\s*=\s*", re.IGNORECASE)


def parse_users(lines: list[SourceLine] | None, errors: list[ConfigError]) -> list[User]:
    """``username:password:"description"`` lines (EMS User's Guide, "users.conf")."""
    users: dict[str, User] = {}
    for sl in lines or ():
        m = _USER_LINE.fullmatch(sl.text)
        if m is None or ":" not in sl.text:
            errors.append(sl.error('expected username:password:"description"'))
            continue
        name, password, desc = m.group(1).strip(), m.group(2).strip(), m.group(3) or ""
        try:
            _check_name(name, "user")
        except ValueError as e:
            errors.append(sl.error(str(e)))
            continue
        if password.startswith(HASH_PREFIX):
            try:
                _split_hash(password)
            except ValueError as e:
                errors.append(sl.error(f"user {name!r}: {e}"))
                continue
        if name in users:
            errors.append(sl.error(f"duplicate user {name!r} (first at line {users[name].line})"))
            continue
        users[name] = User(name, password, desc, sl.line)
    return list(users.values())


def parse_groups(
    lines: list[SourceLine] | None,
    users: Iterable[str],
    errors: list[ConfigError],
    warnings: list[str],
) -> list[Group]:
    """``group:"description"`` lines, each followed by member names (EMS User's Guide,
    "groups.conf")."""
    known = set(users)
    groups: dict[str, tuple[Group, list[str]]] = {}
    current: list[str] | None = None
    current_name = ""
    rejected = False  # members under a rejected group line are skipped silently
    for sl in lines or ():
        if ":" in sl.text:
            name, _, rest = sl.text.partition(":")
            name, rest = name.strip(), rest.strip()
            current, rejected = None, True
            if rest and not (len(rest) >= 2 and rest[0] == rest[-1] == '"'):
                errors.append(sl.error('expected group-name:"description"'))
                continue
            try:
                _check_name(name, "group")
            except ValueError as e:
                errors.append(sl.error(str(e)))
                continue
            if name == ALL_GROUP:
                errors.append(sl.error("group 'all' is predefined and holds every user"))
                continue
            if name in groups:
                first = groups[name][0].line
                errors.append(sl.error(f"duplicate group {name!r} (first at line {first})"))
                continue
            current, current_name, rejected = [], name, False
            groups[name] = (Group(name, rest[1:-1] if rest else "", (), sl.line), current)
            continue
        if current is None:
            if not rejected:
                errors.append(
                    sl.error(f'user {sl.text!r} is not under a group-name:"description" line')
                )
            continue
        member = sl.text
        try:
            _check_name(member, "user")
        except ValueError as e:
            errors.append(sl.error(str(e)))
            continue
        if member in current:
            warnings.append(
                f"{sl.where()}: user {member!r} is listed twice in group {current_name!r}"
            )
            continue
        if member not in known:
            warnings.append(
                f"{sl.where()}: user {member!r} of group {current_name!r} is not in users.conf"
            )
        current.append(member)
    return [Group(g.name, g.description, tuple(members), g.line) for g, members in groups.values()]


def parse_acl(
    lines: list[SourceLine] | None,
    users: Iterable[str],
    groups: Iterable[str],
    errors: list[ConfigError],
    warnings: list[str],
) -> list[AclEntry]:
    """``TOPIC=… USER=… PERM=…`` lines (EMS User's Guide, "acl.conf")."""
    known_users, known_groups = set(users), set(groups) | {ALL_GROUP, ADMIN_GROUP}
    out: list[AclEntry] = []
    for sl in lines or ():
        text = sl.text
        admin = False
        if re.match(r"ADMIN\b", text, re.IGNORECASE):
            admin, text = True, text[5:]
        fields: dict[str, str] = {}
        problems: list[str] = []
        matches = list(_ACL_KEY.finditer(text))
        if not matches or text[: matches[0].start()].strip():
            problems.append("expected TOPIC=name, QUEUE=name or ADMIN, then USER= or GROUP=, PERM=")
        for i, m in enumerate(matches):
            key = m.group(1).upper()
            end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
            if key in fields:
                problems.append(f"{key}= is given twice")
            fields[key] = text[m.end() : end].strip()
        if problems:
            errors.extend(sl.error(p) for p in problems)
            continue
        kinds = [k for k in ("TOPIC", "QUEUE") if k in fields]
        if admin == bool(kinds) or len(kinds) > 1:
            errors.append(sl.error("give exactly one of TOPIC=, QUEUE= or ADMIN"))
            continue
        if "PERM" not in fields:
            errors.append(sl.error("missing PERM="))
            continue
        blank = [
            k
            for k in ("TOPIC", "QUEUE", "USER", "GROUP")
            if k in fields and (not fields[k] or any(c.isspace() for c in fields[k]))
        ]
        if blank:
            errors.extend(sl.error(f"{k}= needs one name without blanks") for k in blank)
            continue
        kind: Literal["topic", "queue", "admin"] = (
            "admin" if admin else ("topic" if kinds[0] == "TOPIC" else "queue")
        )
        try:
            entry = make_acl_entry(
                kind,
                None if admin else fields[kinds[0]],
                fields["PERM"].split(","),
                user=fields.get("USER"),
                group=fields.get("GROUP"),
                line=sl.line,
            )
        except ValueError as e:
            errors.append(sl.error(str(e)))
            continue
        if entry.is_group and entry.principal not in known_groups:
            warnings.append(f"{sl.where()}: group {entry.principal!r} is not in groups.conf")
        elif not entry.is_group and entry.principal not in known_users | {ADMIN_USER, ANONYMOUS}:
            warnings.append(f"{sl.where()}: user {entry.principal!r} is not in users.conf")
        out.append(entry)
    return out
