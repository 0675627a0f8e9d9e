"""Calls to a gateway's admin API from tests and benchmarks, with credentials (stdlib only).

Every ``/api/`` route needs them. A configuration without a ``users.conf`` line for ``admin``
has EMS's predefined administrator with an empty password, which the gateway allows on
loopback: that is what these helpers send unless told otherwise.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from typing import Any

ADMIN_USER = "admin"
ADMIN_PASSWORD = ""  # the predefined administrator's until users.conf gives it one


def basic_auth(user: str = ADMIN_USER, password: str = ADMIN_PASSWORD) -> dict[str, str]:
    """The ``Authorization`` header of HTTP Basic credentials (RFC 7617)."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return {"Authorization": f"Basic {token}"}


def admin_request(url: str, body: Any = None, *, method: str | None = None,
                  user: str = ADMIN_USER, password: str = ADMIN_PASSWORD
                  ) -> urllib.request.Request:
    """A request for ``url`` with Basic credentials; ``body`` (if any) sent as JSON."""
    headers = basic_auth(user, password)
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    return urllib.request.Request(url, data=data, headers=headers, method=method)


def admin_get(port: int, path: str, *, host: str = "127.0.0.1", timeout: float = 10,
              user: str = ADMIN_USER, password: str = ADMIN_PASSWORD) -> Any:
    """``GET path`` (``/api/v1/...``) as JSON; raises ``urllib.error.HTTPError`` on an error."""
    req = admin_request(f"http://{host}:{port}{path}", user=user, password=password)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def admin_text(port: int, path: str, *, host: str = "127.0.0.1", timeout: float = 10,
               user: str = ADMIN_USER, password: str = ADMIN_PASSWORD) -> str:
    """``GET path`` as text (``/metrics``); raises ``urllib.error.HTTPError`` on an error."""
    req = admin_request(f"http://{host}:{port}{path}", user=user, password=password)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return str(r.read().decode())


def admin_post(port: int, path: str, body: Any = None, *, host: str = "127.0.0.1",
               timeout: float = 10, user: str = ADMIN_USER,
               password: str = ADMIN_PASSWORD) -> tuple[int, Any]:
    """``POST path`` with ``body`` as JSON: ``(status, decoded answer)``, errors included."""
    return admin_call(port, "POST", path, {} if body is None else body, host=host,
                      timeout=timeout, user=user, password=password)


def admin_call(port: int, method: str, path: str, body: Any = None, *,
               host: str = "127.0.0.1", timeout: float = 10, user: str = ADMIN_USER,
               password: str = ADMIN_PASSWORD) -> tuple[int, Any]:
    """``method path`` with ``body`` (if any) as JSON: ``(status, decoded answer)``."""
    req = admin_request(f"http://{host}:{port}{path}", body, method=method, user=user,
                        password=password)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")
