"""``gateway admin``: the administration shell, the gateway's counterpart of EMS's
``tibemsadmin`` (TIBCO EMS User's Guide, "Using the EMS Administration Tool").

It talks to a running gateway's admin API (:mod:`gateway.admin`) over HTTP or HTTPS with the
standard library: ``connect`` trades the user's Basic credentials for a bearer token
(``POST /api/v1/tokens``), which every later call carries; one that expires is renewed
once. The command language is :mod:`gateway.admintool_commands` (a line -> the API calls)
and the output :mod:`gateway.admintool_tables` (answers -> tables), both pure; this module is
the I/O around them: the options, the connection, the interactive prompt with history and
completion (readline), and scripts.

Options follow ``tibemsadmin``'s (Table 15, "tibemsadmin Options"): ``-server URL``
(``http://host:port``, ``https://``; EMS's ``tcp://`` and ``ssl://`` read as those, a bare
``host:port`` as http), ``-user``, ``-password``, ``-script FILE`` (one command a line, ``#``
comments; stops at the first failure with exit status 1, unless ``-ignore``, which, as EMS's,
ignores failed commands but not malformed ones). Without ``-password`` the password is
``GATEWAY_ADMIN_PASSWORD``'s, else the empty one (the predefined ``admin``'s until set) and,
should that be refused at the prompt, asked for as EMS asks once a password is set.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import enum
import getpass
import http.client
import json
import os
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

from gateway.admintool_commands import (
    Call,
    CommandError,
    Local,
    Request,
    complete,
    help_text,
    parse,
    path,
)
from gateway.admintool_tables import render

DEFAULT_URL = "http://localhost:8080"  # the HTTP listener's default (gateway.admin)
TIMEOUT = 30.0  # s a call may take; tibemsadmin's default command timeout ("timeout")
PASSWORD_ENV = "GATEWAY_ADMIN_PASSWORD"
HISTORY_FILE = "~/.gateway_admin_history"
HISTORY_LENGTH = 1000
SCHEMES = {"http": "http", "https": "https", "tcp": "http", "ssl": "https"}
# what a name after a keyword is (admintool_commands.TREE) -> the list that has those names
NAME_LISTS = {"queue": "queues", "topic": "topics", "durable": "durables",
              "transport": "transports", "user": "users", "group": "groups"}


class ApiError(Exception):
    """A call that failed: the API's ``{"error": ...}`` text, or why the gateway could not
    be reached."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class Outcome(enum.Enum):
    """How a command went; ``EXIT`` ends the shell."""

    OK = "ok"
    FAILED = "failed"
    EXIT = "exit"


def server_url(text: str) -> str:
    """``-server``'s value as an http(s) URL without a trailing slash."""
    if "://" not in text:
        text = "http://" + text
    scheme, rest = text.split("://", 1)
    if scheme.lower() not in SCHEMES:
        raise ApiError(f"'{scheme}://' is not a server URL: http://, https://, tcp:// or ssl://")
    url = f"{SCHEMES[scheme.lower()]}://{rest}".rstrip("/")
    if urlsplit(url).port is None:  # raises ValueError on a port that is not a number
        url += ":8080" if url.startswith("http:") else ":443"
    return url


def tls_context(cacert: str | None, insecure: bool) -> ssl.SSLContext:
    """The context of an https server: the system's CAs, or ``cacert``; ``insecure`` checks
    neither the certificate nor the host name."""
    ctx = ssl.create_default_context(cafile=cacert)
    if insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _error_text(err: urllib.error.HTTPError) -> str:
    """The API's JSON error text, else the HTTP status line."""
    with err:
        try:
            answer = json.loads(err.read() or b"null")
        except ValueError:
            answer = None
    if isinstance(answer, dict) and isinstance(answer.get("error"), str):
        return str(answer["error"])
    return f"HTTP {err.code} {err.reason}"


class Connection:
    """A logged-in session with one gateway's admin API."""

    def __init__(self, url: str, user: str, password: str, ctx: ssl.SSLContext | None) -> None:
        self.url = url
        self.user = user
        self.password = password
        self.ctx = ctx if url.startswith("https:") else None
        self.token: str | None = None
        parts = urlsplit(url)
        self.address = f"{parts.hostname}:{parts.port}"

    def login(self) -> None:
        """Trade the Basic credentials for a bearer token."""
        basic = base64.b64encode(f"{self.user}:{self.password}".encode()).decode("ascii")
        answer = self._send(Call("POST", path("tokens")), f"Basic {basic}")
        self.token = str(answer["token"])

    def call(self, call: Call) -> Any:
        """One call with the token; an expired token is renewed once."""
        if self.token is None:
            self.login()
        try:
            return self._send(call, f"Bearer {self.token}")
        except ApiError as exc:
            if exc.status != 401:
                raise
        self.login()
        return self._send(call, f"Bearer {self.token}")

    def close(self) -> None:
        """Revoke the token (best effort: the gateway may be gone)."""
        if self.token is not None:
            with contextlib.suppress(ApiError):
                self._send(Call("DELETE", path("tokens", "current")), f"Bearer {self.token}")
        self.token = None

    def _send(self, call: Call, authorization: str) -> Any:
        headers = {"Authorization": authorization, "Accept": "application/json"}
        data = None
        if call.body is not None:
            data = json.dumps(call.body).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self.url + call.path, data=data, headers=headers,
                                     method=call.method)
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT, context=self.ctx) as r:
                raw = r.read()
        except urllib.error.HTTPError as exc:
            raise ApiError(_error_text(exc), exc.code) from None
        except urllib.error.URLError as exc:
            raise ApiError(self._unreachable(exc.reason)) from None
        except TimeoutError:
            raise ApiError(f"no answer from {self.url} within {TIMEOUT:.0f} s") from None
        except OSError as exc:
            raise ApiError(self._unreachable(exc)) from None
        except http.client.HTTPException:
            raise ApiError(f"{self.url} did not answer HTTP: is it the HTTP listener?") from None
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            raise ApiError(f"{self.url} did not answer JSON: is it a gateway?") from None

    def _unreachable(self, reason: Any) -> str:
        if isinstance(reason, ConnectionRefusedError):
            return f"connection refused: no gateway listening on {self.address}"
        if isinstance(reason, ssl.SSLError):
            return f"TLS with {self.address} failed: {reason} (see --cacert, --insecure)"
        if isinstance(reason, TimeoutError):
            return f"no answer from {self.url} within {TIMEOUT:.0f} s"
        return f"cannot reach {self.url}: {reason}"


class Shell:
    """Runs parsed commands against a :class:`Connection`, printing their answers;
    ``interactive``: whether a person types them (passwords may then be asked for)."""

    def __init__(self, options: argparse.Namespace, *, interactive: bool) -> None:
        self.options = options
        self.interactive = interactive
        self.connection: Connection | None = None
        self.last_url = server_url(options.server or DEFAULT_URL)
        self.last_user = options.user or "admin"
        self.matches: list[str] = []
        self.ctx = (tls_context(options.cacert, options.insecure)
                    if self.last_url.startswith("https:") or options.cacert else None)

    # -- output ---------------------------------------------------------------------------

    def say(self, text: str) -> None:
        print(text, flush=True)

    def fail(self, message: str) -> Outcome:
        print(f"Error: {message}", file=sys.stderr, flush=True)
        return Outcome.FAILED

    def prompt(self) -> str:
        """``user@host:port> `` connected (tibemsadmin shows its server), else ``gateway> ``."""
        c = self.connection
        return f"{c.user}@{c.address}> " if c is not None else "gateway> "

    # -- commands -------------------------------------------------------------------------

    def run_line(self, text: str) -> Outcome:
        try:
            parsed = parse(text)
        except CommandError as exc:
            return self.fail(str(exc))
        return self.execute(parsed)

    def execute(self, parsed: Request | Local | None) -> Outcome:
        if parsed is None:
            return Outcome.OK
        if isinstance(parsed, Local):
            return self.local(parsed)
        return self.request(parsed)

    def request(self, req: Request) -> Outcome:
        if self.connection is None:
            return self.fail("not connected; 'connect [URL] [USER] [PASSWORD]' first")
        try:
            if req.ask_password:
                req = self.with_password(req)
            answers = [self.connection.call(call) for call in req.calls]
        except ApiError as exc:
            return self.fail(str(exc))
        if self.options.json:
            for answer in answers:
                self.say(json.dumps(answer, indent=2))
            return Outcome.OK
        try:
            self.say(render(req.view, answers, req.message))
        except (LookupError, TypeError, AttributeError, ValueError) as exc:
            # an answer of another shape than this tool knows (another gateway version)
            return self.fail(f"cannot show the answer ({exc!r}); --json prints it as it is")
        return Outcome.OK

    def with_password(self, req: Request) -> Request:
        """``set password NAME``: the password, asked for twice."""
        if not self.interactive:
            raise ApiError("set password: no terminal to ask on; give it: set password NAME PW")
        password = getpass.getpass("Password: ")
        if getpass.getpass("Confirm password: ") != password:
            raise ApiError("the passwords differ; the password is unchanged")
        (call,) = req.calls
        return Request((Call(call.method, call.path, {"password": password}),), req.view,
                       req.message)

    def local(self, action: Local) -> Outcome:
        if action.action == "exit":
            return Outcome.EXIT
        if action.action == "help":
            self.say(help_text(action.args))
            return Outcome.OK
        self.disconnect()
        if action.action == "disconnect":
            return Outcome.OK
        args = action.args
        return self.connect(args[0] if args else None, args[1] if len(args) > 1 else None,
                            args[2] if len(args) > 2 else None)

    # -- the connection -------------------------------------------------------------------

    def connect(self, url: str | None, user: str | None, password: str | None) -> Outcome:
        """Log in to ``url`` (else the last one) as ``user`` (else the last one); without a
        password: the environment's, the empty one, then (at the prompt) the one asked for."""
        try:
            target = server_url(url) if url else self.last_url
        except (ApiError, ValueError) as exc:
            return self.fail(str(exc))
        self.last_url, self.last_user = target, user or self.last_user
        if self.ctx is None and target.startswith("https:"):
            self.ctx = tls_context(self.options.cacert, self.options.insecure)
        given = password if password is not None else os.environ.get(PASSWORD_ENV)
        conn = Connection(target, self.last_user, given or "", self.ctx)
        try:
            try:
                conn.login()
            except ApiError as exc:
                if exc.status != 401 or given is not None or not self.interactive:
                    raise
                conn.password = getpass.getpass("Password: ")
                conn.login()
        except ApiError as exc:
            return self.fail(str(exc))
        self.connection = conn
        if not self.options.json:
            self.say(f"Connected to: {target}")
        return Outcome.OK

    def disconnect(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None

    def names(self, kind: str) -> list[str]:
        """The names TAB completes after a keyword (``show queue ``): the API's list."""
        lst = NAME_LISTS.get(kind)
        if self.connection is None or lst is None:
            return []
        try:
            rows = self.connection.call(Call("GET", path(lst)))
        except ApiError:
            return []
        return [str(r["name"]) for r in rows if isinstance(r, dict) and "name" in r]

    # -- the two ways of running --------------------------------------------------------------

    def run_script(self, file: str) -> int:
        """Every command of ``file``; stops at the first failure with status 1 (a malformed
        line stops it even with ``-ignore``)."""
        try:
            with open(file, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except OSError as exc:
            self.fail(f"cannot read the script: {exc.strerror}: {file}")
            return 1
        for number, text in enumerate(lines, 1):
            try:
                parsed = parse(text)
            except CommandError as exc:
                self.fail(str(exc))
                return self.stopped(file, number, text)
            outcome = self.execute(parsed)
            if outcome is Outcome.EXIT:
                return 0
            if outcome is Outcome.FAILED and not self.options.ignore:
                return self.stopped(file, number, text)
        return 0

    def stopped(self, file: str, number: int, text: str) -> int:
        print(f"{file}:{number}: stopped at '{text.strip()}'", file=sys.stderr, flush=True)
        return 1

    def run_interactive(self) -> int:
        """Commands typed at the prompt until ``exit`` or end of input; the prompt has
        history and completion on a terminal."""
        session = (readline_session(self.complete) if self.interactive
                   else contextlib.nullcontext())
        with session:
            while True:
                try:
                    # no prompt when the commands come through a pipe
                    prompt = self.prompt() if self.interactive else ""
                    if self.run_line(input(prompt)) is Outcome.EXIT:
                        break
                except EOFError:
                    self.say("")
                    break
                except KeyboardInterrupt:  # ^C drops the line or the command, as a shell's
                    self.say("")
        return 0

    def complete(self, before: str, state: int) -> str | None:
        """readline's completer: the ``state``-th word for the line up to the cursor."""
        if state == 0:
            self.matches = complete(before, self.names)
        return self.matches[state] if state < len(self.matches) else None


@contextlib.contextmanager
def readline_session(completer: Callable[[str, int], str | None]) -> Iterator[None]:
    """History (kept in :data:`HISTORY_FILE`) and TAB completion while the prompt runs;
    nothing where Python has no readline."""
    try:
        import readline
    except ImportError:  # pragma: no cover - a Python built without readline
        yield
        return
    history = os.path.expanduser(HISTORY_FILE)
    with contextlib.suppress(OSError):
        readline.read_history_file(history)
    readline.set_history_length(HISTORY_LENGTH)
    readline.set_completer_delims(" \t\n")  # names hold dots and wildcards
    readline.set_completer(
        lambda _text, state: completer(
            readline.get_line_buffer()[:readline.get_endidx()], state))
    if "libedit" in (readline.__doc__ or ""):  # pragma: no cover - macOS's readline
        readline.parse_and_bind("bind ^I rl_complete")
    else:
        readline.parse_and_bind("tab: complete")
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            readline.write_history_file(history)
            os.chmod(history, 0o600)  # lines may hold passwords (connect, create user)


def options_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gateway admin", add_help=False, allow_abbrev=False,
        description="The gateway's administration shell (EMS tibemsadmin's commands): "
                    "'help' at its prompt lists them.")
    p.add_argument("-h", "-help", "--help", action="help", help="print this help and quit")
    p.add_argument("-server", "--server", metavar="URL",
                   help=f"the gateway's admin API (default {DEFAULT_URL})")
    p.add_argument("-user", "--user", metavar="NAME", help="user name (default admin)")
    p.add_argument("-password", "--password", metavar="PW",
                   help=f"password (default: ${PASSWORD_ENV}, or asked for)")
    p.add_argument("-script", "--script", metavar="FILE",
                   help="run FILE's commands (one a line, # comments) and quit")
    p.add_argument("-ignore", "--ignore", action="store_true",
                   help="in a script, go on after a failed command")
    p.add_argument("--json", action="store_true", help="print the API's JSON answers")
    p.add_argument("--cacert", "-ssl_trusted", metavar="FILE",
                   help="https: trust the certificates of FILE (PEM)")
    p.add_argument("--insecure", action="store_true",
                   help="https: check neither the certificate nor the host name")
    return p


def main(argv: list[str] | None = None) -> int:
    """``gateway admin [options]``: the exit status."""
    options = options_parser().parse_args(argv)
    interactive = options.script is None
    try:
        shell = Shell(options, interactive=interactive and sys.stdin.isatty())
    except (ApiError, ValueError, OSError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    try:
        if interactive or options.server or options.user or options.password is not None:
            outcome = shell.connect(None, options.user, options.password)
            if outcome is Outcome.FAILED and not interactive:
                return 1
        if interactive:
            return shell.run_interactive()
        return shell.run_script(options.script)
    except KeyboardInterrupt:
        return 130  # as a shell reports SIGINT
    finally:
        shell.disconnect()
