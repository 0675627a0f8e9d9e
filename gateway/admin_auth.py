"""Who may use the admin API, and what every answer that is not a view looks like.

How this works. Two aiohttp middlewares wrap every request of the HTTP listener.
:func:`error_middleware` (outermost) turns each HTTP error into a JSON ``{"error": ...}`` body
with the same status and headers, and an unexpected exception into a logged 500 -- a last
resort: every known bad input (an unknown name, a malformed or oversized body, a wrong
method) is answered before it. :func:`auth_middleware` guards every ``/api/`` path:

* **authentication** -- ``Authorization: Basic`` with a user of ``users.conf`` (and the
  predefined ``admin``, empty password until ``users.conf`` gives it one: TIBCO EMS User's
  Guide, "Predefined Administrative User and Group"), or ``Authorization: Bearer`` with a
  token from ``POST /api/v1/tokens`` (:class:`TokenStore`). None, or a wrong one: 401 with
  ``WWW-Authenticate: Basic realm="gateway"``.
* **authorisation** -- each route declares the global administrator permission it needs
  (EMS User's Guide, Table 45 "Global administrator permissions") with :func:`needs`; a route
  on one destination also accepts the destination-level permission (Table 46, "Destination-Level
  Permissions") that ``acl.conf`` grants on that name. ``admin`` and members of ``$admin``
  hold them all (:meth:`Security.admin_check`). Authenticated but not permitted: 403. A route
  under ``/api/`` that declares nothing is refused to everyone (fail closed).

The WebSocket endpoints (``/mqtt``, ``/stomp``) and ``/health`` are outside ``/api/``: the
protocols there authenticate their own way.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

log = logging.getLogger("gateway.admin")

REALM = "gateway"
AUTHENTICATE = f'Basic realm="{REALM}"'
PROTECTED = ("/api/", "/metrics")  # paths behind credentials (the rest: /health, /ui's assets)
MAX_BODY = 64 * 1024  # bytes of a request body: a setprop line is far shorter (else 413)
TOKEN_BYTES = 32  # 256 random bits per bearer token (secrets.token_urlsafe)
MAX_TOKENS = 10_000  # live tokens kept; past it the one closest to expiry goes

USER_KEY = web.RequestKey("admin_user", str)
TOKEN_KEY = web.RequestKey("admin_token", str)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    """The admin API's error answer: ``{"error": message}`` with ``status``."""
    return web.json_response({"error": message}, status=status, headers=headers)


# -- tokens -----------------------------------------------------------------------------


class TokenStore:
    """Bearer tokens of the admin API, in memory: each names a user and expires.

    ``clock`` is a monotonic clock in seconds (injectable for tests). Only each token's
    SHA-256 is kept, and a token is looked up by it: how long the lookup takes depends on
    the digest of a guess, which says nothing of how much of the guess is right; the
    digest found is then compared in constant time (:func:`hmac.compare_digest`).
    Runs on the loop; never awaits.
    """

    def __init__(self, lifetime: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.lifetime = lifetime
        self.clock = clock
        # sha256(token) -> (user, expiry, sha256(token))
        self._tokens: dict[bytes, tuple[str, float, bytes]] = {}

    @staticmethod
    def _key(token: str) -> bytes:
        return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()

    def issue(self, user: str) -> str:
        """A new random token for ``user``, valid for ``lifetime`` seconds."""
        now = self.clock()
        self._drop_expired(now)
        if len(self._tokens) >= MAX_TOKENS:
            oldest = min(self._tokens, key=lambda k: self._tokens[k][1])
            del self._tokens[oldest]
        token = secrets.token_urlsafe(TOKEN_BYTES)
        key = self._key(token)
        self._tokens[key] = (user, now + self.lifetime, key)
        return token

    def user_of(self, token: str) -> str | None:
        """The user ``token`` was issued to; None if unknown, revoked or expired."""
        key = self._key(token)
        entry = self._tokens.get(key)
        if entry is None:
            return None
        user, expiry, stored = entry
        if not hmac.compare_digest(stored, key):  # pragma: no cover - the lookup agrees
            return None
        if self.clock() >= expiry:
            del self._tokens[key]
            return None
        return user

    def revoke(self, token: str) -> bool:
        """Forget ``token``; whether it was known."""
        return self._tokens.pop(self._key(token), None) is not None

    def __len__(self) -> int:
        return len(self._tokens)

    def _drop_expired(self, now: float) -> None:
        for key in [k for k, (_, expiry, _) in self._tokens.items() if now >= expiry]:
            del self._tokens[key]


# -- what each route needs --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Need:
    """A route's permission: ``perm``, a global administrator permission (Table 45); for a
    route on one destination, ``kind`` and ``level`` name the destination-level permission
    (Table 46) on ``match_info["name"]`` that allows it too. ``perm=None``: any
    authenticated user (the token routes)."""

    perm: str | None
    kind: str | None = None
    level: str | None = None


def needs(need: Need | Callable[[web.Request], Need]) -> Callable[[Handler], Handler]:
    """Declare what a handler needs (a :class:`Need`, or a function of the request giving
    one, for a route whose permission depends on the state, as create or modify)."""

    def mark(handler: Handler) -> Handler:
        handler.need = need  # type: ignore[attr-defined]
        return handler

    return mark


def _allowed(security: Any, user: str, need: Need, request: web.Request) -> bool:
    if need.perm is None:
        return True
    if security.admin_check(user, need.perm):
        return True
    name = request.match_info.get("name")
    if need.kind is None or need.level is None or not name:
        return False
    try:
        return bool(security.check(user, need.kind, name, need.level))
    except Exception:  # a name no grant can match (not a subject): no destination-level grant
        return False


# -- the middlewares --------------------------------------------------------------------


def _unauthorized(message: str) -> web.Response:
    return json_error(401, message, {"WWW-Authenticate": AUTHENTICATE})


def _basic(value: str) -> tuple[str, str] | None:
    """``user:password`` of a Basic credential (RFC 7617 §2), None if malformed."""
    try:
        text = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    user, colon, password = text.partition(":")
    return (user, password) if colon else None


def auth_middleware(broker: Any, tokens: TokenStore) -> Any:
    """Authenticate and authorise every ``/api/`` request (see the module docstring).

    The user (and the bearer token, if one was used) is left in ``request[USER_KEY]``
    (``request[TOKEN_KEY]``)."""

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith(PROTECTED):
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        user: str | None = None
        security = broker.config.security
        if not header:
            return _unauthorized("authentication required (Basic or Bearer)")
        if scheme.lower() == "basic":
            creds = _basic(value)
            if creds is None:
                return _unauthorized("malformed Basic credentials")
            if security.authenticate_administrator(*creds):
                user = creds[0]
            else:
                log.info("admin API: authentication failed for user %r from %s",
                         creds[0], request.remote)
                return _unauthorized("bad user name or password")
        elif scheme.lower() == "bearer":
            user = tokens.user_of(value.strip())
            if user is None:  # RFC 6750 §3.1 (a browser then shows no login dialog)
                return json_error(401, "unknown or expired token", {
                    "WWW-Authenticate": f'Bearer realm="{REALM}", error="invalid_token"'})
            request[TOKEN_KEY] = value.strip()
        else:
            return _unauthorized(f"unsupported authentication scheme {scheme!r}")
        request[USER_KEY] = user
        route_handler = request.match_info.route.handler
        if request.match_info.http_exception is not None:  # 404 / 405: say so, to users only
            return await handler(request)
        declared = getattr(route_handler, "need", None)
        if declared is None:
            return json_error(403, "this route declares no permission")
        need = declared if isinstance(declared, Need) else declared(request)
        if not _allowed(security, user, need, request):
            log.info("admin API: %s %s refused to %r (needs %s)",
                     request.method, request.path, user, need.perm)
            return json_error(403, f"user {user!r} lacks the administrator permission "
                                   f"{need.perm!r}")
        return await handler(request)

    return authenticate


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """HTTP errors as JSON; anything unexpected as a logged 500 (a bug: no known bad input
    gets here)."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise  # a redirect is no error
        headers = {k: v for k, v in exc.headers.items() if k.lower() != "content-type"}
        headers.pop("Content-Length", None)
        message = exc.reason
        if exc.status == 413:
            message = f"the request body is larger than {MAX_BODY} bytes"
        return json_error(exc.status, message, headers)
    except Exception:
        log.exception("admin API: error handling %s %s", request.method, request.path)
        return json_error(500, "internal error")


# -- aiohttp's server log ----------------------------------------------------------------


class ServerLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's server logger (``AppRunner(logger=...)``): a request that does not parse
    (a malformed request line or header, TLS spoken to a plain port) is the client's mistake:
    one line without a traceback, INFO (aiohttp logs it as an error with its traceback), or
    DEBUG where aiohttp already chose DEBUG (a bad method on a connection's first request).
    Anything else is logged as aiohttp asks."""

    def exception(self, msg: object, *args: object, exc_info: Any = True,
                  **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            self.info("bad HTTP request from %s: %s", _remote(args), _one_line(exc_info))
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)

    def debug(self, msg: object, *args: object, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if isinstance(exc, HttpProcessingError):
            super().debug("bad HTTP request from %s: %s", _remote(args), _one_line(exc))
            return
        super().debug(msg, *args, **kwargs)


def _remote(args: tuple[object, ...]) -> object:
    return args[0] if args else "?"


def _one_line(exc: HttpProcessingError) -> str:
    """aiohttp's parse error, its several lines (a caret under the bad byte) made one."""
    return " ".join(str(exc.message or exc).split())[:200]
