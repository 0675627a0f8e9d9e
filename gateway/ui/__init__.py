"""The web dashboard: one page and its scripts, served at ``/ui/`` on the HTTP listener.

How this works. The files in ``static/`` (the page, its stylesheet, its ES modules and the
vendored uPlot chart library with its licence) are served as they are: no template, no build
step, nothing fetched from elsewhere, so the dashboard works on a host without Internet access.
They hold no data and are public, like ``/health``; the page itself asks for a user name and
password, trades them for a bearer token (``POST /api/v1/tokens``) and reads everything it
shows from the admin API with that token (RFC 6750, "The OAuth 2.0 Authorization Framework:
Bearer Token Usage", section 2.1), so every figure is behind the API's own authentication and
administrator permissions (:mod:`gateway.admin_auth`). The token lives in the tab's
``sessionStorage`` (HTML Living Standard, "Web storage"): it ends with the tab.

Only the files of ``static/`` are served, looked up by name in a table made when the routes
are: no path from a request reaches the file system. Every answer forbids framing and
content sniffing, and the page's Content Security Policy (W3C "Content Security Policy Level
3") lets it load scripts, styles and data from its own origin only, so a message body shown
by the queue browser cannot run as script even if the page's escaping failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web

STATIC = Path(__file__).parent / "static"
INDEX = "index.html"
PREFIX = "/ui/"

# By suffix; anything else (the licence) is plain text.
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
    ".svg": "image/svg+xml",
}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    # revalidated on each load (Last-Modified / ETag): an upgraded gateway serves new files
    "Cache-Control": "no-cache",
}


def assets(directory: Path = STATIC) -> dict[str, Path]:
    """The files served under ``/ui/``, by name (the folder is flat)."""
    return {p.name: p for p in directory.iterdir() if p.is_file()}


def routes(broker: Any) -> list[web.RouteDef]:
    """``/ui`` (redirected to ``/ui/``), the page at ``/ui/`` and its files at ``/ui/{name}``.

    ``broker`` is not read: the page holds no data of its own (see the module docstring)."""
    files = assets()

    async def to_page(_: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(PREFIX)  # relative URLs of the page resolve under /ui/

    async def serve(request: web.Request) -> web.StreamResponse:
        name = request.match_info.get("name", INDEX)
        path = files.get(name)
        if path is None:
            raise web.HTTPNotFound(reason=f"no dashboard file {name!r}")
        headers = {**HEADERS,
                   "Content-Type": CONTENT_TYPES.get(path.suffix, "text/plain; charset=utf-8")}
        return web.FileResponse(path, headers=headers)

    return [web.get("/ui", to_page), web.get(PREFIX, serve), web.get(PREFIX + "{name}", serve)]
