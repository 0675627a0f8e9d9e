"""The admin HTTP API (aiohttp), on the HTTP listener (default 127.0.0.1:8080; ``https``: TLS).

JSON views of the running core, in the spirit of EMS's ``show`` commands (TIBCO EMS User's
Guide, "Command Listing"), plus ``purge queue``; the routes that create, change and
delete are :mod:`gateway.admin_manage`'s, ``/metrics`` is :mod:`gateway.metrics`'s, the
dashboard :mod:`gateway.ui`'s, and :mod:`gateway.admin_openapi` describes them all
(``GET /api/v1/openapi.json``). Every view is a plain function of the broker's state, built on
request; nothing here runs on the message path. The list views take ``?q=`` (an EMS wildcard
pattern), ``?offset=`` and ``?limit=`` and give the count before the cut in ``X-Total-Count``.

Every ``/api/`` route needs credentials (HTTP Basic with a user of ``users.conf``, or a
bearer token) and an administrator permission (EMS User's Guide, Table 45), as
:mod:`gateway.admin_auth` describes; each route's is in the right column, in brackets. Errors
are JSON ``{"error": ...}``: 401 no or bad credentials, 403 not permitted, 404 unknown name or
route, 400 malformed body, 413 body past 64 KB, 405 wrong method.

==========================================  ===========================================
``GET /health``                             ``{"status": "ok"}`` once the broker runs
                                            (no credentials)
``POST /api/v1/tokens``                     with Basic credentials: ``{"token": ...,
                                            "expires_in": seconds}`` (any user);
                                            ``admin_token_lifetime`` in gateway.conf
``DELETE /api/v1/tokens/current``           revoke the bearer token the request carries
``GET /api/v1/server``                      ``show server``: counts, memory (``memory``
                                            charged, ``max_msg_memory``, ``msg_swapping``,
                                            ``swapped`` messages, ``memory_held_producers``),
                                            what adapters hold outside it (``mqtt_retained``,
                                            ``mqtt_retained_bytes``),
                                            statistics (``swapped_out``, ``swapped_in``,
                                            ``memory_held`` among them), the garbage
                                            collector's settings and counts
                                            [view-server]
``GET /api/v1/queues``                      ``show queues``: one row per queue (``swapped``:
                                            pending messages whose body is in the store)
                                            [view-destination]
``GET /api/v1/topics``                      ``show topics`` [view-destination]
``GET /api/v1/durables``                    ``show durables`` (``stored``: pending messages
                                            in the store only, the subscription's tail)
                                            [view-durable]
``GET /api/v1/connections``                 ``show connections`` [view-connection]
``GET /api/v1/store``                       the store's group-commit statistics
                                            [view-server]
``GET /api/v1/clients``                     every adapter connection's output: bytes
                                            buffered, slow or not (deliveries paused past
                                            the write high-water mark), since when;
                                            ``?slow=1`` lists the slow consumers only
                                            [view-connection]
``GET /api/v1/sessions``                    MQTT sessions: in-flight window, messages
                                            queued for them and dropped, per subscription
                                            [view-connection]
``POST /api/v1/queues/{name}/purge``        ``purge queue name`` [purge-destination, or
                                            ``purge`` on the queue in acl.conf]; on a
                                            cluster's node, the queue's messages in
                                            JetStream and on every node (503: JetStream
                                            did not answer)
``GET /api/v1/transports``                  ``show transports``: state, counters, bindings
                                            [view-server]
``GET /api/v1/log``                         the log's levels: ``{"level": "info",
                                            "loggers": {name: level}}`` (the root logger's,
                                            and every logger whose own level is set)
                                            [view-server]
``PUT /api/v1/log``                         ``{"level": "debug"}`` sets the root logger's
                                            level; ``{"logger": "transports.rv", "level":
                                            "warning"}`` one logger's (``notset``: back to
                                            its parent's); answers as ``GET``; until the
                                            process ends [change-server]
==========================================  ===========================================
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from gateway import __version__, admin_openapi, metrics, ui
from gateway.admin_auth import (
    MAX_BODY,
    TOKEN_KEY,
    USER_KEY,
    Need,
    ServerLog,
    TokenStore,
    auth_middleware,
    error_middleware,
    json_error,
    needs,
)
from gateway.admin_manage import (
    manage_routes,
    page,
)
from gateway.config.gateway_conf import listen_backlog
from gateway.errors import GatewayError
from gateway.logconf import levels, set_level
from gateway.tls import server_context

log = logging.getLogger("gateway.admin")
server_log = logging.getLogger("gateway.admin.http")  # aiohttp's server log (ServerLog)
TOKENS = web.AppKey("admin_tokens", TokenStore)

VIEW_SERVER = Need("view-server")
VIEW_DESTINATION = Need("view-destination")
VIEW_DURABLE = Need("view-durable")
VIEW_CONNECTION = Need("view-connection")
CHANGE_SERVER = Need("change-server")
PURGE_QUEUE = Need("purge-destination", "queue", "purge")
ANY_USER = Need(None)


def _props(props: Any) -> dict[str, Any]:
    if props is None:
        return {}
    out = {}
    for field in ("maxmsgs", "maxbytes", "prefetch", "exclusive", "expiration_ms",
                  "max_redelivery", "redelivery_delay_ms", "flow_control_bytes", "secure",
                  "sender_name", "trace", "imports", "exports"):
        v = getattr(props, field, None)
        if v not in (None, 0, False, (), ""):
            out[field] = list(v) if isinstance(v, tuple) else v
    policy = getattr(props, "overflow_policy", None)
    if policy is not None and policy.name != "DEFAULT":
        out["overflow_policy"] = policy.name
    return out


# ``show queues`` of a queue defined in queues.conf and not used yet (Endpoint.info's counts)
IDLE_QUEUE = dict.fromkeys(("pending", "held", "in_flight", "count", "bytes", "swapped",
                            "stored", "consumers", "total_in", "total_out", "total_acked",
                            "total_discarded"), 0)


def _gc_info() -> dict[str, Any]:
    """The garbage collector's settings (see ``gateway.server.tune_gc``) and counts."""
    return {
        "threshold": list(gc.get_threshold()),
        "frozen": gc.get_freeze_count(),
        "collections": [g["collections"] for g in gc.get_stats()],
    }


def make_app(broker: Any, clock: Callable[[], float] = time.monotonic) -> web.Application:
    """The HTTP listener's application: the admin API behind its middlewares, and the
    adapters' WebSocket endpoints. ``clock`` times the bearer tokens (tests inject one)."""
    routes = web.RouteTableDef()
    tokens = TokenStore(float(broker.config.gateway.admin_token_lifetime), clock)

    @routes.get("/health")
    async def health(_: web.Request) -> web.Response:
        """Public, and so minimal: a load balancer's or a container runtime's health check
        has no credentials, and what it needs is whether the gateway answers, nothing about
        the gateway itself (its id, counts and names are behind authentication)."""
        return web.json_response({"status": "ok"})

    @routes.post("/api/v1/tokens")
    @needs(ANY_USER)
    async def issue_token(request: web.Request) -> web.Response:
        """A bearer token for the authenticated user; only Basic credentials make one, so a
        token cannot be stretched past its lifetime by trading it for the next."""
        if TOKEN_KEY in request:
            return json_error(403, "a token is obtained with Basic credentials, not a token")
        token = tokens.issue(request[USER_KEY])
        return web.json_response({"token": token, "expires_in": int(tokens.lifetime)})

    @routes.delete("/api/v1/tokens/current")
    @needs(ANY_USER)
    async def revoke_token(request: web.Request) -> web.Response:
        token = request.get(TOKEN_KEY)
        if token is None:
            return json_error(400, "the request carries no bearer token to revoke")
        tokens.revoke(token)
        return web.json_response({"revoked": True})

    @routes.get("/api/v1/openapi.json")
    @needs(ANY_USER)
    async def openapi(_: web.Request) -> web.Response:
        return web.json_response(admin_openapi.document(__version__))

    @routes.get("/api/v1/server")
    @needs(VIEW_SERVER)
    async def server(_: web.Request) -> web.Response:
        delivered, _ = broker.traffic.totals()
        by_protocol: dict[str, int] = {}
        for c in broker.connections.values():
            by_protocol[c.protocol] = by_protocol.get(c.protocol, 0) + 1
        return web.json_response({**broker.info(), "delivered": delivered,
                                  "connections_by_protocol": by_protocol, "gc": _gc_info()})

    @routes.get("/api/v1/transports")
    @needs(VIEW_SERVER)
    async def transports(_: web.Request) -> web.Response:
        manager = broker.transports
        return web.json_response(manager.info() if manager is not None else [])

    @routes.get("/api/v1/log")
    @needs(VIEW_SERVER)
    async def get_log(_: web.Request) -> web.Response:
        return web.json_response(levels())

    @routes.put("/api/v1/log")
    @needs(CHANGE_SERVER)
    async def put_log(request: web.Request) -> web.Response:
        """Change a log level at run time (as EMS's ``set server`` changes its tracing)."""
        try:
            body = await request.json()
        except ValueError:  # not JSON, or not UTF-8
            return json_error(400, "the body must be JSON")
        if (not isinstance(body, dict) or set(body) - {"level", "logger"}
                or not isinstance(body.get("level"), str)
                or not isinstance(body.get("logger", ""), str)):
            return json_error(400, 'the body must be an object {"level": "..."}, with '
                                   'optionally "logger": "name", both strings')
        logger = body.get("logger") or None
        try:
            set_level(body["level"], logger)
        except ValueError as exc:
            return json_error(400, str(exc))
        log.warning("admin: %s set the log level of %s to %s", request[USER_KEY],
                    logger or "the gateway", body["level"].lower())
        return web.json_response(levels())

    def queue_rows() -> list[dict[str, Any]]:
        rows = []
        for q in broker.queues.values():
            row = q.info()
            row["name"] = q.name
            row["temporary"] = q.owner is not None
            row["properties"] = _props(q.props)
            row["static"] = broker.config.queues.is_static(q.name)
            rows.append(row)
        table = broker.config.queues
        for name in table.static_names():  # defined, not used yet: EMS shows them too
            if name not in broker.queues:
                rows.append({"name": name, "static": True, "temporary": False,
                             "properties": _props(table.resolve(name)), **IDLE_QUEUE})
        return rows

    def topic_rows() -> list[dict[str, Any]]:
        rows = []
        for t in broker.topics.values():
            subs = broker.subs.match(t.name) if not t.name.startswith("$") else ()
            rows.append({
                "name": t.name, "static": t.static, "temporary": t.owner is not None,
                "subscriptions": len(subs), "total_in": t.stats_in,
                "properties": _props(t.props),
                "pending": sum(s.npending for s in subs),
            })
        table = broker.config.topics
        for name in table.static_names():
            if name not in broker.topics:
                subs = broker.subs.match(name)
                rows.append({"name": name, "static": True, "temporary": False,
                             "subscriptions": len(subs), "total_in": 0,
                             "properties": _props(table.resolve(name)),
                             "pending": sum(s.npending for s in subs)})
        return rows

    def durable_rows() -> list[dict[str, Any]]:
        return [s.info() for s in broker.durables.values()]

    @routes.get("/api/v1/queues")
    @needs(VIEW_DESTINATION)
    async def queues(request: web.Request) -> web.Response:
        return page(request, queue_rows())

    @routes.get("/api/v1/topics")
    @needs(VIEW_DESTINATION)
    async def topics(request: web.Request) -> web.Response:
        return page(request, topic_rows())

    @routes.get("/api/v1/durables")
    @needs(VIEW_DURABLE)
    async def durables(request: web.Request) -> web.Response:
        return page(request, durable_rows())

    def client_rows() -> list[dict[str, Any]]:
        # Each adapter connection's WriteFlow (adapters.listener), by duck typing: the core
        # does not import the adapters.
        rows = []
        for server in list(broker.adapter_servers.values()):
            for c in list(getattr(server, "connections", ())):
                flow = getattr(c, "flow", None)
                if flow is not None:
                    rows.append(flow.row())
        return rows

    def connection_rows() -> list[dict[str, Any]]:
        output = {r["connection"]: r for r in client_rows() if r["connection"]}
        rows = []
        for c in broker.connections.values():
            row = {"id": c.id, "client_id": c.client_id, "user": c.user, "kind": c.kind,
                   "protocol": c.protocol, "address": c.address, "sessions": len(c.sessions)}
            out = output.get(c.id)
            if out is not None:
                row["buffered"] = out["buffered"]
                row["slow"] = out["slow"]
            rows.append(row)
        return rows

    # what a cluster's other nodes may ask of this one (GET /api/v1/cluster/<view>)
    broker.local_views.update(connections=connection_rows, queues=queue_rows,
                              topics=topic_rows, durables=durable_rows)

    @routes.get("/api/v1/connections")
    @needs(VIEW_CONNECTION)
    async def connections(request: web.Request) -> web.Response:
        return page(request, connection_rows(), key="id")

    @routes.get("/api/v1/clients")
    @needs(VIEW_CONNECTION)
    async def clients(request: web.Request) -> web.Response:
        rows = client_rows()
        if request.query.get("slow") in ("1", "true"):
            rows = [r for r in rows if r["slow"]]
        return web.json_response(rows)

    def session_rows() -> list[dict[str, Any]]:
        mqtt = broker.adapter_servers.get("mqtt")
        return mqtt.session_rows() if mqtt is not None else []  # type: ignore[no-any-return]

    broker.local_views["sessions"] = session_rows

    @routes.get("/api/v1/sessions")
    @needs(VIEW_CONNECTION)
    async def sessions(_: web.Request) -> web.Response:
        return web.json_response(session_rows())

    @routes.get("/api/v1/store")
    @needs(VIEW_SERVER)
    async def store(_: web.Request) -> web.Response:
        return web.json_response(dict(getattr(broker.store, "stats", {})))

    @routes.post("/api/v1/queues/{name}/purge")
    @needs(PURGE_QUEUE)
    async def purge(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        link = broker.cluster
        if link is not None:  # the queue is the cluster's: purged in JetStream and on
            try:              # every node
                n = await link.purge_queue(name)
            except GatewayError as exc:
                return json_error(503, str(exc))
            if n is None:
                return json_error(404, f"no queue named {name!r} on any node")
            return web.json_response({"purged": n})
        try:
            n = broker.purge_queue(name)
        except GatewayError as exc:
            return json_error(404, str(exc))
        return web.json_response({"purged": n})

    app = web.Application(middlewares=[error_middleware, auth_middleware(broker, tokens)],
                          client_max_size=MAX_BODY)
    app[TOKENS] = tokens
    app.add_routes(routes)
    app.add_routes(manage_routes(broker))
    app.add_routes(metrics.routes(broker))
    app.add_routes(ui.routes(broker))
    for method, path, handler in broker.http_routes:  # adapters' WebSocket endpoints
        app.router.add_route(method, path, handler)
    return app


class AdminServer:
    def __init__(self, runner: web.AppRunner, site: web.TCPSite, address: tuple[str, int]) -> None:
        self.runner = runner
        self.site = site
        self.address = address

    async def close(self) -> None:
        await self.runner.cleanup()


async def start(broker: Any, spec: Any) -> AdminServer:
    """Registry entry for ``listen = http://host:port`` and ``listen = https://host:port``
    (TLS with ``tls_cert`` / ``tls_key`` / ``tls_ca``, as every TLS listener: gateway.tls).

    Refuses (GatewayError) an address beyond loopback while ``admin`` has no password; the
    configuration's loader says so first, with the ``listen`` line (gateway.config.loader)."""
    if not spec.loopback and not broker.config.security.admin_has_password():
        raise GatewayError(f"listen {spec.url()}: the admin API would be reachable beyond this "
                           "host while the 'admin' user has no password (users.conf)")
    ctx = server_context(broker, "https") if spec.scheme == "https" else None
    runner = web.AppRunner(make_app(broker), access_log=None, logger=ServerLog(server_log, {}))
    await runner.setup()
    # the accept queue of every listener (aiohttp's default is 128)
    site = web.TCPSite(runner, spec.host or None, spec.port, ssl_context=ctx,
                       backlog=listen_backlog(broker.config.gateway))
    await site.start()
    addresses = runner.addresses  # the bound sockets' names (port 0: the one chosen)
    address = addresses[0][:2] if addresses else (spec.host, spec.port)
    return AdminServer(runner, site, (address[0], address[1]))
