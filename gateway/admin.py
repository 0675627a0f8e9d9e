"""The admin HTTP API (aiohttp), on the HTTP listener (default 127.0.0.1:8080).

Read-only JSON views of the running core, in the spirit of EMS's ``show`` commands
(TIBCO EMS User's Guide, "Command Listing"), plus ``purge``. Every view is a plain function of
the broker's state, built on request; nothing here runs on the message path.

==========================================  ===========================================
``GET /health``                             ``{"status": "ok"}`` once the broker runs
``GET /api/v1/server``                      ``show server``: counts, memory (``memory``
                                            charged, ``max_msg_memory``, ``msg_swapping``,
                                            ``swapped`` messages, ``memory_held_producers``),
                                            what adapters hold outside it (``mqtt_retained``,
                                            ``mqtt_retained_bytes``),
                                            statistics (``swapped_out``, ``swapped_in``,
                                            ``memory_held`` among them), the garbage
                                            collector's settings and counts
``GET /api/v1/queues``                      ``show queues``: one row per queue (``swapped``:
                                            pending messages whose body is in the store)
``GET /api/v1/topics``                      ``show topics``
``GET /api/v1/durables``                    ``show durables`` (``stored``: pending messages
                                            in the store only, the subscription's tail)
``GET /api/v1/connections``                 ``show connections``
``GET /api/v1/store``                       the store's group-commit statistics
``GET /api/v1/clients``                     every adapter connection's output: bytes
                                            buffered, slow or not (deliveries paused past
                                            the write high-water mark), since when;
                                            ``?slow=1`` lists the slow consumers only
``GET /api/v1/sessions``                    MQTT sessions: in-flight window, messages
                                            queued for them and dropped, per subscription
``POST /api/v1/queues/{name}/purge``        ``purge queue name``
``POST /api/v1/topics/{name}``              ``setprop topic name props`` (JSON body
                                            ``{"properties": "import=\"t1\",export=\"t2\""}``)
``POST /api/v1/queues/{name}``              ``setprop queue name props``; new ``import`` /
                                            ``export`` names start at once
``GET /api/v1/transports``                  ``show transports``: state, counters, bindings
==========================================  ===========================================
"""

from __future__ import annotations

import gc
from typing import Any

from aiohttp import web

from gateway.config.gateway_conf import listen_backlog
from gateway.errors import GatewayError


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


def _gc_info() -> dict[str, Any]:
    """The garbage collector's settings (see ``gateway.server.tune_gc``) and counts."""
    return {
        "threshold": list(gc.get_threshold()),
        "frozen": gc.get_freeze_count(),
        "collections": [g["collections"] for g in gc.get_stats()],
    }


def make_app(broker: Any) -> web.Application:
    routes = web.RouteTableDef()

    @routes.get("/health")
    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "gateway": broker.id})

    @routes.get("/api/v1/server")
    async def server(_: web.Request) -> web.Response:
        return web.json_response({**broker.info(), "gc": _gc_info()})

    async def define(request: web.Request, kind: str) -> web.Response:
        """Define or redefine a topic or queue at run time (EMS ``setprop``)."""
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": "the body must be JSON"}, status=400)
        props = body.get("properties", "") if isinstance(body, dict) else None
        if not isinstance(props, str):
            return web.json_response({"error": "'properties' must be a string"}, status=400)
        name = request.match_info["name"]
        try:
            entry = broker.config.table(kind).add(name, props, replace=True)
        except GatewayError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        manager = broker.transports
        if manager is not None:
            manager.bind_entry(kind, entry)
        return web.json_response({"name": entry.name, "kind": kind,
                                  "properties": entry.props_text()})

    @routes.post("/api/v1/topics/{name}")
    async def define_topic(request: web.Request) -> web.Response:
        return await define(request, "topic")

    @routes.post("/api/v1/queues/{name}")
    async def define_queue(request: web.Request) -> web.Response:
        return await define(request, "queue")

    @routes.get("/api/v1/transports")
    async def transports(_: web.Request) -> web.Response:
        manager = broker.transports
        return web.json_response(manager.info() if manager is not None else [])

    @routes.get("/api/v1/queues")
    async def queues(_: web.Request) -> web.Response:
        rows = []
        for q in broker.queues.values():
            row = q.info()
            row["name"] = q.name
            row["temporary"] = q.owner is not None
            row["properties"] = _props(q.props)
            rows.append(row)
        return web.json_response(rows)

    @routes.get("/api/v1/topics")
    async def topics(_: web.Request) -> web.Response:
        rows = []
        for t in broker.topics.values():
            subs = broker.subs.match(t.name) if not t.name.startswith("$") else ()
            rows.append({
                "name": t.name, "static": t.static, "temporary": t.owner is not None,
                "subscriptions": len(subs), "total_in": t.stats_in,
                "properties": _props(t.props),
            })
        return web.json_response(rows)

    @routes.get("/api/v1/durables")
    async def durables(_: web.Request) -> web.Response:
        return web.json_response([s.info() for s in broker.durables.values()])

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

    @routes.get("/api/v1/connections")
    async def connections(_: web.Request) -> web.Response:
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
        return web.json_response(rows)

    @routes.get("/api/v1/clients")
    async def clients(request: web.Request) -> web.Response:
        rows = client_rows()
        if request.query.get("slow") in ("1", "true"):
            rows = [r for r in rows if r["slow"]]
        return web.json_response(rows)

    @routes.get("/api/v1/sessions")
    async def sessions(_: web.Request) -> web.Response:
        mqtt = broker.adapter_servers.get("mqtt")
        return web.json_response(mqtt.session_rows() if mqtt is not None else [])

    @routes.get("/api/v1/store")
    async def store(_: web.Request) -> web.Response:
        return web.json_response(dict(getattr(broker.store, "stats", {})))

    @routes.post("/api/v1/queues/{name}/purge")
    async def purge(request: web.Request) -> web.Response:
        try:
            n = broker.purge_queue(request.match_info["name"])
        except GatewayError as exc:
            return web.json_response({"error": str(exc)}, status=404)
        return web.json_response({"purged": n})

    app = web.Application()
    app.add_routes(routes)
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
    """Registry entry for ``listen = http://host:port``."""
    runner = web.AppRunner(make_app(broker), access_log=None)
    await runner.setup()
    # the accept queue of every listener (aiohttp's default is 128)
    site = web.TCPSite(runner, spec.host, spec.port,
                       backlog=listen_backlog(broker.config.gateway))
    await site.start()
    addresses = runner.addresses  # the bound sockets' names (port 0: the one chosen)
    address = addresses[0][:2] if addresses else (spec.host, spec.port)
    return AdminServer(runner, site, (address[0], address[1]))
