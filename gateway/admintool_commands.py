"""``gateway admin``'s command language: one command line in, the admin API calls out.

The commands are those of EMS's administration tool, with its syntax (TIBCO EMS User's
Guide, "Using the EMS Administration Tool", "Command Listing"): keywords are
case-insensitive, names keep their case, a description is a double-quoted string,
destination properties are a comma-separated list (``maxbytes=10MB,secure``) passed to the
server as written, and permissions are comma-separated (``send,receive``). A principal is
``user=name`` or ``group=name``; a bare name is a user (the Guide's ``grant queue myQueue joe
send``). What the gateway has and EMS does not keeps EMS's word order: ``transport start
NAME``, ``show acl ...`` beside EMS's ``showacl ...``.

:func:`parse` is pure: it turns a line into a :class:`Request` (the HTTP calls and how their
answer is shown), a :class:`Local` action of the shell (connect, help, exit), or ``None``
for a blank line or a ``#`` comment; a malformed line raises :class:`CommandError` with the
command's syntax. :func:`complete` gives the words TAB may complete a partial line with.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

API = "/api/v1"
# a double-quoted string (a description; \" inside) or a run of non-blank characters
TOKEN = re.compile(r'"((?:[^"\\]|\\.)*)"|(\S+)')
EXIT_WORDS = ("exit", "quit", "q", "bye", "end")  # EMS: "exit (aliases: quit, q, bye, end)"


class CommandError(ValueError):
    """A line the shell cannot run: an unknown command or a wrong use of one (the message
    gives its syntax)."""


class Usage(Exception):
    """Raised by a command's handler on bad arguments; :func:`parse` adds the syntax."""


@dataclass(frozen=True)
class Call:
    """One admin API call: ``method path`` with ``body`` sent as JSON."""

    method: str
    path: str
    body: dict[str, Any] | None = None


@dataclass(frozen=True)
class Request:
    """The calls of a command, made in order, and how their answers are shown: ``view`` is
    a table or a detail view of :mod:`gateway.admintool_tables`, or ``"done"`` to print
    ``message``. ``ask_password``: the shell asks for the ``password`` of the body first."""

    calls: tuple[Call, ...]
    view: str = "done"
    message: str = ""
    ask_password: bool = False


@dataclass(frozen=True)
class Local:
    """What the shell does itself: ``connect``, ``disconnect``, ``help`` or ``exit``."""

    action: str
    args: tuple[str, ...] = ()


@dataclass
class _Line:
    """A command line's tokens: ``words`` as written (quotes removed), whether each was
    quoted, and where each starts (``rest`` is the raw text from a token on)."""

    text: str
    words: list[str] = field(default_factory=list)
    quoted: list[bool] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)

    @classmethod
    def split(cls, text: str) -> _Line:
        line = cls(text)
        for m in TOKEN.finditer(text):
            is_quoted = m.group(2) is None
            line.words.append(m.group(1).replace('\\"', '"') if is_quoted else m.group(2))
            line.quoted.append(is_quoted)
            line.starts.append(m.start())
        return line

    def rest(self, i: int) -> str:
        return self.text[self.starts[i]:].strip() if i < len(self.words) else ""

    def exactly(self, i: int, n: int) -> list[str]:
        """The ``n`` arguments from token ``i``, no more and no fewer."""
        if len(self.words) - i != n:
            raise Usage
        return self.words[i:]

    def between(self, i: int, least: int, most: int) -> list[str]:
        if not least <= len(self.words) - i <= most:
            raise Usage
        return self.words[i:]


Handler = Callable[[_Line, int], Request | Local]


@dataclass(frozen=True)
class Spec:
    """A command: its leading keywords, syntax and summary (``help``), and its handler,
    called with the line and the index of its first argument."""

    words: tuple[str, ...]
    syntax: str
    summary: str
    handler: Handler


def path(*parts: str, **query: str | None) -> str:
    """An API path of quoted names (``orders.>`` -> ``orders.%3E``), with the query's
    non-empty parameters."""
    text = API + "".join("/" + quote(p, safe="") for p in parts)
    given = {k: v for k, v in query.items() if v}
    return text + ("?" + urlencode(given) if given else "")


def _kind(word: str) -> str:
    kind = word.lower()
    if kind not in ("queue", "topic"):
        raise Usage
    return kind


def _names(text: str) -> list[str]:
    """A list written ``a,b``, ``a, b`` or ``a b``."""
    return [n for n in re.split(r"[,\s]+", text) if n]


def _get(view: str, *parts: str, **query: str | None) -> Request:
    return Request((Call("GET", path(*parts, **query)),), view)


def _done(method: str, message: str, api_path: str, body: dict[str, Any] | None = None
          ) -> Request:
    return Request((Call(method, api_path, body),), "done", message)


# -- show ---------------------------------------------------------------------------------


def _show_list(plural: str) -> Handler:
    def handler(line: _Line, i: int) -> Request:
        pattern = line.between(i, 0, 1)
        return _get(plural, plural, q=pattern[0] if pattern else None)

    return handler


def _show_one(kind: str, plural: str) -> Handler:
    def handler(line: _Line, i: int) -> Request:
        (name,) = line.exactly(i, 1)
        return _get(kind, plural, name)

    return handler


def _show_fixed(view: str, *parts: str) -> Handler:
    def handler(line: _Line, i: int) -> Request:
        line.exactly(i, 0)
        return _get(view, *parts)

    return handler


def _show_acl(line: _Line, i: int) -> Request:
    """``show acl queue|topic NAME``, ``show acl user|group NAME``, ``show acl admin``."""
    args = line.between(i, 1, 2)
    kind = args[0].lower()
    if kind == "admin" and len(args) == 1:
        return _get("acl", "acl", kind="admin")
    if kind in ("queue", "topic") and len(args) == 2:
        return _get("acl", "acl", kind=kind, name=args[1])
    if kind in ("user", "group") and len(args) == 2:
        return _get("acl", "acl", principal=args[1])
    raise Usage


# -- destinations --------------------------------------------------------------------------


def _create_destination(line: _Line, i: int) -> Request:
    """``create queue|topic NAME [PROPS]`` (the kind is the word before ``i``)."""
    if len(line.words) - i < 1:
        raise Usage
    kind, name = line.words[i - 1].lower(), line.words[i]
    return _done("POST", f"{kind.capitalize()} '{name}' has been created.",
                 path(kind + "s"), {"name": name, "properties": line.rest(i + 1)})


def _delete_destination(line: _Line, i: int) -> Request:
    (name,) = line.exactly(i, 1)
    kind = line.words[i - 1].lower()
    return _done("DELETE", f"{kind.capitalize()} '{name}' has been deleted.",
                 path(kind + "s", name))


def _props(verb: str) -> Handler:
    """``setprop`` (replace), ``addprop``, ``removeprop`` (property names)."""

    def handler(line: _Line, i: int) -> Request:
        if len(line.words) - i < 3:
            raise Usage
        kind, name = _kind(line.words[i]), line.words[i + 1]
        parts = (kind + "s", name) if verb == "setprop" else (kind + "s", name, verb)
        done = {"setprop": "set", "addprop": "added", "removeprop": "removed"}[verb]
        return _done("POST", f"{kind.capitalize()} '{name}': properties {done}.",
                     path(*parts), {"properties": line.rest(i + 2)})

    return handler


def _purge(line: _Line, i: int) -> Request:
    """``purge queue NAME``, ``purge topic NAME``, ``purge durable NAME [CLIENT_ID]``."""
    args = line.between(i, 2, 3)
    kind = args[0].lower()
    if kind == "durable":
        client_id = args[2] if len(args) == 3 else None
        return _done("POST", f"Durable '{args[1]}' has been purged.",
                     path("durables", args[1], "purge", client_id=client_id))
    if len(args) != 2:
        raise Usage
    kind = _kind(kind)
    return _done("POST", f"{kind.capitalize()} '{args[1]}' has been purged.",
                 path(kind + "s", args[1], "purge"))


def _delete_durable(line: _Line, i: int) -> Request:
    args = line.between(i, 1, 2)
    client_id = args[1] if len(args) == 2 else None
    return _done("DELETE", f"Durable '{args[0]}' has been deleted.",
                 path("durables", args[0], client_id=client_id))


def _delete_connection(line: _Line, i: int) -> Request:
    (cid,) = line.exactly(i, 1)
    return _done("DELETE", f"Connection {cid} has been closed.", path("connections", cid))


# -- users, groups, permissions ------------------------------------------------------------


def _create_principal(kind: str) -> Handler:
    """``create user NAME ["description"] [password=PW]``, ``create group NAME
    ["description"]``."""

    def handler(line: _Line, i: int) -> Request:
        if len(line.words) - i < 1:
            raise Usage
        body: dict[str, Any] = {"name": line.words[i]}
        for word, quoted in zip(line.words[i + 1:], line.quoted[i + 1:], strict=True):
            if kind == "user" and not quoted and word.lower().startswith("password="):
                body["password"] = word.split("=", 1)[1]
            elif "description" not in body:
                body["description"] = word
            else:
                raise Usage
        return _done("POST", f"{kind.capitalize()} '{body['name']}' has been created.",
                     path(kind + "s"), body)

    return handler


def _delete_principal(kind: str) -> Handler:
    def handler(line: _Line, i: int) -> Request:
        (name,) = line.exactly(i, 1)
        return _done("DELETE", f"{kind.capitalize()} '{name}' has been deleted.",
                     path(kind + "s", name))

    return handler


def _set_password(line: _Line, i: int) -> Request:
    """``set password NAME [PW]``: without the password, the shell asks for it."""
    args = line.between(i, 1, 2)
    body = {"password": args[1]} if len(args) == 2 else {}
    return Request((Call("PUT", path("users", args[0]), body),), "done",
                   f"Password of user '{args[0]}' has been set.", ask_password=len(args) == 1)


def _members(method: str) -> Handler:
    """``add member GROUP USER[,USER...]`` (one call a user), ``remove member ...``."""

    def handler(line: _Line, i: int) -> Request:
        if len(line.words) - i < 2:
            raise Usage
        group, users = line.words[i], _names(line.rest(i + 1))
        calls = tuple(Call(method, path("groups", group, "members", u)) for u in users)
        done = "added to" if method == "PUT" else "removed from"
        return Request(calls, "done", f"{', '.join(users)} {done} group '{group}'.")

    return handler


def _principal(word: str) -> dict[str, str]:
    key, eq, name = word.partition("=")
    if not eq:
        return {"user": word}
    if key.lower() not in ("user", "group") or not name:
        raise Usage
    return {key.lower(): name}


def _acl(verb: str) -> Handler:
    """``grant|revoke queue|topic NAME PRINCIPAL PERMS``, ``grant|revoke admin PRINCIPAL
    PERMS``."""

    def handler(line: _Line, i: int) -> Request:
        if len(line.words) - i < 3:
            raise Usage
        kind = line.words[i].lower()
        body: dict[str, Any] = {"kind": kind}
        at = i + 1
        if kind != "admin":
            _kind(kind)
            body["name"] = line.words[at]
            at += 1
        if len(line.words) - at < 2:
            raise Usage
        body.update(_principal(line.words[at]))
        body["permissions"] = _names(line.rest(at + 1))
        target = "admin" if kind == "admin" else f"{kind} '{body['name']}'"
        who = f"user '{body['user']}'" if "user" in body else f"group '{body['group']}'"
        done = "granted to" if verb == "grant" else "revoked from"
        return _done("POST", f"Permissions on {target} {done} {who}.", path("acl", verb), body)

    return handler


# -- server, transports, shell ---------------------------------------------------------------


def _transport(line: _Line, i: int) -> Request:
    verb, name = line.exactly(i, 2)
    if verb.lower() not in ("start", "stop"):
        raise Usage
    return _done("POST", f"Transport '{name}': {verb.lower()} requested.",
                 path("transports", name, verb.lower()))


def _set_server(line: _Line, i: int) -> Request:
    """``set server log_level=LEVEL``: the only server parameter the gateway changes at run
    time (EMS's ``set server`` changes its tracing the same way)."""
    (setting,) = line.exactly(i, 1)
    key, eq, level = setting.partition("=")
    if key.lower() != "log_level" or not eq or not level:
        raise CommandError("set server: only log_level=LEVEL can be set "
                           "(debug, info, warning or error)")
    return _done("PUT", f"Server log level set to {level.lower()}.", path("log"),
                 {"level": level})


def _local(action: str, least: int = 0, most: int = 0) -> Handler:
    def handler(line: _Line, i: int) -> Local:
        return Local(action, tuple(line.between(i, least, most)))

    return handler


SPECS: tuple[Spec, ...] = (
    Spec(("show", "server"), "show server", "server summary: counts, memory, statistics",
         _show_fixed("server", "server")),
    Spec(("info",), "info", "the same as show server", _show_fixed("server", "server")),
    Spec(("show", "queues"), "show queues [PATTERN]", "queues (PATTERN: foo.*, foo.>)",
         _show_list("queues")),
    Spec(("show", "queue"), "show queue NAME", "one queue's details",
         _show_one("queue", "queues")),
    Spec(("show", "topics"), "show topics [PATTERN]", "topics", _show_list("topics")),
    Spec(("show", "topic"), "show topic NAME", "one topic's details",
         _show_one("topic", "topics")),
    Spec(("show", "durables"), "show durables [PATTERN]", "durable subscriptions",
         _show_list("durables")),
    Spec(("show", "connections"), "show connections", "client connections",
         _show_fixed("connections", "connections")),
    Spec(("show", "users"), "show users", "users", _show_fixed("users", "users")),
    Spec(("show", "groups"), "show groups", "groups and their members",
         _show_fixed("groups", "groups")),
    Spec(("show", "acl"), "show acl queue|topic NAME | user|group NAME | admin",
         "permissions: on a destination, of a principal, or admin",
         _show_acl),
    Spec(("showacl",), "showacl queue|topic NAME | user|group NAME | admin",
         "the same as show acl", _show_acl),
    Spec(("show", "transports"), "show transports", "transports: state, counters",
         _show_fixed("transports", "transports")),
    Spec(("show", "transport"), "show transport NAME", "one transport's details",
         _show_one("transport", "transports")),
    Spec(("show", "config"), "show config", "the server's configuration parameters",
         _show_fixed("config", "config")),
    Spec(("create", "queue"), "create queue NAME [PROPS]", "define a queue",
         _create_destination),
    Spec(("create", "topic"), "create topic NAME [PROPS]", "define a topic",
         _create_destination),
    Spec(("delete", "queue"), "delete queue NAME", "delete a queue", _delete_destination),
    Spec(("delete", "topic"), "delete topic NAME", "delete a topic", _delete_destination),
    Spec(("setprop",), "setprop queue|topic NAME PROPS",
         "replace the properties (those not given are removed)", _props("setprop")),
    Spec(("addprop",), "addprop queue|topic NAME PROPS", "add or change properties",
         _props("addprop")),
    Spec(("removeprop",), "removeprop queue|topic NAME PROPNAMES", "remove properties",
         _props("removeprop")),
    Spec(("purge",), "purge queue|topic NAME | purge durable NAME [CLIENT_ID]",
         "discard the pending messages", _purge),
    Spec(("delete", "durable"), "delete durable NAME [CLIENT_ID]",
         "delete a durable subscription", _delete_durable),
    Spec(("delete", "connection"), "delete connection ID", "close a client connection",
         _delete_connection),
    Spec(("create", "user"), 'create user NAME ["DESCRIPTION"] [password=PW]', "add a user",
         _create_principal("user")),
    Spec(("set", "password"), "set password NAME [PW]",
         "set a user's password (asked for when not given)", _set_password),
    Spec(("delete", "user"), "delete user NAME", "delete a user", _delete_principal("user")),
    Spec(("create", "group"), 'create group NAME ["DESCRIPTION"]', "add a group",
         _create_principal("group")),
    Spec(("delete", "group"), "delete group NAME", "delete a group",
         _delete_principal("group")),
    Spec(("add", "member"), "add member GROUP USER[,USER...]", "add users to a group",
         _members("PUT")),
    Spec(("remove", "member"), "remove member GROUP USER[,USER...]",
         "remove users from a group", _members("DELETE")),
    Spec(("grant",), "grant queue|topic NAME user=U|group=G PERMS | grant admin user=U|group=G"
         " PERMS", "grant permissions (comma-separated)", _acl("grant")),
    Spec(("revoke",), "revoke queue|topic NAME user=U|group=G PERMS | revoke admin "
         "user=U|group=G PERMS", "revoke permissions", _acl("revoke")),
    Spec(("transport",), "transport start|stop NAME", "start or stop a transport",
         _transport),
    Spec(("set", "server"), "set server log_level=LEVEL", "change the server's log level",
         _set_server),
    Spec(("connect",), "connect [URL] [USER] [PASSWORD]",
         "connect to a gateway (default http://localhost:8080)", _local("connect", 0, 3)),
    Spec(("disconnect",), "disconnect", "disconnect from the gateway", _local("disconnect")),
    Spec(("help",), "help [COMMAND]", "list the commands, or those starting with COMMAND",
         _local("help", 0, 3)),
    Spec(("exit",), "exit", "leave the tool (also quit, q, bye, end)", _local("exit")),
    *(Spec((w,), w, "", _local("exit")) for w in EXIT_WORDS[1:]),
)


def find(words: list[str]) -> tuple[Spec, int] | None:
    """The command a line's leading words name (the longest match), and how many they are."""
    lowered = [w.lower() for w in words]
    best: tuple[Spec, int] | None = None
    for spec in SPECS:
        n = len(spec.words)
        if tuple(lowered[:n]) == spec.words and (best is None or n > best[1]):
            best = (spec, n)
    return best


def parse(text: str) -> Request | Local | None:
    """A command line -> what to do; ``None`` for a blank line or a ``#`` comment."""
    if not text.strip() or text.lstrip().startswith("#"):
        return None
    line = _Line.split(text)
    found = find(line.words)
    if found is None:
        raise CommandError(f"unknown command '{' '.join(line.words[:2])}'; "
                           "'help' lists the commands")
    spec, n = found
    try:
        return spec.handler(line, n)
    except Usage:
        raise CommandError(f"usage: {spec.syntax}") from None


def help_text(words: tuple[str, ...] = ()) -> str:
    """``help``: every command's syntax and summary, or those starting with ``words``."""
    prefix = tuple(w.lower() for w in words)
    specs = [s for s in SPECS if s.words[:len(prefix)] == prefix and s.summary]
    if not specs:
        return f"no command starts with '{' '.join(words)}'"
    width = max((len(s.syntax) for s in specs if len(s.syntax) <= 48), default=0)
    lines = []
    for s in specs:
        if len(s.syntax) > width:
            lines.append(f"  {s.syntax}\n  {'':{width}}  {s.summary}")
        else:
            lines.append(f"  {s.syntax:{width}}  {s.summary}")
    return "\n".join(lines)


# -- completion ------------------------------------------------------------------------------

_ACL_WORDS: dict[str, Any] = {"queue": "queue", "topic": "topic", "user": "user",
                              "group": "group", "admin": {}}
_KIND: dict[str, Any] = {"queue": "queue", "topic": "topic"}
# what may follow each keyword: more keywords, or the kind of name that comes next
TREE: dict[str, Any] = {
    "show": {"server": {}, "queues": {}, "queue": "queue", "topics": {}, "topic": "topic",
             "durables": {}, "connections": {}, "users": {}, "groups": {}, "acl": _ACL_WORDS,
             "transports": {}, "transport": "transport", "config": {}},
    "showacl": _ACL_WORDS,
    "create": {"queue": {}, "topic": {}, "user": {}, "group": {}},
    "delete": {**_KIND, "durable": "durable", "connection": {}, "user": "user",
               "group": "group"},
    "setprop": _KIND, "addprop": _KIND, "removeprop": _KIND,
    "purge": {**_KIND, "durable": "durable"},
    "grant": {**_KIND, "admin": {}}, "revoke": {**_KIND, "admin": {}},
    "set": {"server": {}, "password": "user"},
    "add": {"member": "group"}, "remove": {"member": "group"},
    "transport": {"start": "transport", "stop": "transport"},
    "connect": {}, "disconnect": {}, "help": {}, "info": {}, "exit": {}, "quit": {},
}


def complete(before: str, names: Callable[[str], list[str]]) -> list[str]:
    """The words (each followed by a blank) that may replace the last word of ``before``,
    the line up to the cursor: keywords from :data:`TREE`, or the names of the kind it
    gives, from ``names(kind)`` (the API's queues, topics, ...).

    A keyword whose plural also fits (``queue``, ``queues``) is not offered: TAB on ``show
    qu`` completes the list command ``show queues``; the singular is typed out, after which
    TAB completes the name."""
    words = before.split()
    typed = "" if not words or before[-1:].isspace() else words.pop()
    node: Any = TREE
    for w in words:
        node = node.get(w.lower()) if isinstance(node, dict) else None
        if node is None:
            return []
    if isinstance(node, str):
        return sorted(n + " " for n in names(node) if n.startswith(typed))
    fits = [k for k in node if k.startswith(typed.lower())]
    return sorted(k + " " for k in fits if k + "s" not in fits)
