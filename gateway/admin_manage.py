"""The admin API's resources beyond the ``show`` views: what EMS's administration tool
creates, changes and deletes (TIBCO EMS User's Guide, "Command Listing"), as REST routes.

==============================================  ================================================
``GET /api/v1/topics/{name}``, ``queues/{name}``  ``show topic`` / ``show queue`` [view-destination,
                                                or ``view`` on it]
``POST /api/v1/topics``, ``/api/v1/queues``     ``create topic|queue`` ``{"name": ...,
                                                "properties": "..."}``: 201, 409 if defined
                                                [create-destination]
``POST /api/v1/topics/{name}``, ``queues/...``   ``setprop``: ``{"properties": "import=\"t1\""}``,
                                                exactly these (new ``import`` / ``export``
                                                names start at once) [modify-destination, or
                                                ``modify`` on it; create-destination /
                                                ``create`` for a name not defined yet]
``POST .../{name}/addprop``                     ``addprop``: ``{"properties": "trace=body"}``
                                                [modify-destination, or ``modify`` on it]
``POST .../{name}/removeprop``                  ``removeprop``: ``{"properties": "maxbytes,trace"}``
``DELETE /api/v1/topics/{name}``, ``queues/...``  ``delete topic|queue``: the definition, and a
                                                queue's messages (409 while it has consumers)
                                                [delete-destination, or ``delete`` on it]
``POST /api/v1/topics/{name}/purge``            ``purge topic``: every subscription's messages
                                                [purge-destination, or ``purge`` on it]
``GET /api/v1/queues/{name}/messages``          browse (``?limit=``, default 100, at most 1000):
                                                the pending messages in delivery order, not
                                                consumed [view-message]
``POST /api/v1/durables/{name}/purge``          ``purge durable`` (``?client_id=``) [purge-durable]
``DELETE /api/v1/durables/{name}``              ``delete durable`` (409 while a consumer has it)
                                                [change-durable]
``DELETE /api/v1/connections/{id}``             ``delete connection``: closes it [change-connection]
``GET|POST /api/v1/users``                      ``show users``; ``create user`` ``{"name",
                                                "password", "description"}`` [view-user /
                                                change-user]
``PUT|DELETE /api/v1/users/{name}``             ``set password`` (and description); ``delete user``
``GET|POST /api/v1/groups``                     ``show groups``; ``create group`` [view-group /
                                                change-group]
``DELETE /api/v1/groups/{name}``                ``delete group``
``PUT|DELETE /api/v1/groups/{name}/members/{user}``  ``addmember`` / ``removemember``
``GET /api/v1/acl``                             ``showacl`` (``?kind=&name=&principal=``)
                                                [view-acl]
``POST /api/v1/acl/grant``, ``/acl/revoke``     ``grant`` / ``revoke`` ``{"kind": "queue",
                                                "name": "q", "user": "alice", "permissions":
                                                ["send"]}`` [change-acl; change-admin-acl for
                                                ``"kind": "admin"``]
``GET /api/v1/transports/{name}``               one transport [view-server]
``POST /api/v1/transports/{name}/stop|start``   stop or start one transport [change-server]
``GET /api/v1/config``                          the server's parameters [view-server]
``GET /api/v1/cluster``                         a cluster node's view of every node: up or
                                                not, its figures (404 alone) [view-server]
``GET /api/v1/cluster/connections``             every node's connections, each row with its
                                                ``node_id`` (a node that does not answer in
                                                2 s is left out) [view-connection]
``GET /api/v1/cluster/queues``, ``/topics``,     every node's rows of ``/api/v1/queues``,
``/durables``, ``/sessions``                     ``/topics``, ``/durables``, ``/sessions``,
                                                each with its ``node_id``, as above
                                                [view-destination, view-durable,
                                                view-connection]
``GET /api/v1/cluster/store``                   what JetStream keeps for the whole cluster:
                                                each queue's messages, each durable's pending
                                                and unacknowledged (404 alone, 503 without
                                                JetStream) [view-server]
==============================================  ================================================

Every change that EMS saves to its files (destinations, users, groups, ACL) is written back to
the configuration directory (:mod:`gateway.config.writeback`); each change is logged with the
user who made it and announced on ``$sys.monitor.admin.change`` (:func:`admin_changed`). On a
cluster's node those changes are the cluster's: every node makes them, and writes them to
its own files (:mod:`gateway.admin_shared`); deleting a queue also purges it in JetStream.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web

from gateway import monitor, subject
from gateway.admin_auth import USER_KEY, Need, json_error, needs
from gateway.admin_shared import bound, drop_destination, save, share
from gateway.backlog import with_bodies
from gateway.config.security import ADMIN_GROUP, ADMIN_USER
from gateway.errors import GatewayError
from gateway.message import BodyKind, DeliveryMode, Message

log = logging.getLogger("gateway.admin")

BROWSE_DEFAULT = 100
BROWSE_MAX = 1000
_SECRET_WORDS = ("password", "passphrase", "secret")


class BadRequest(Exception):
    """A request the route cannot take: answered with ``status`` and the message."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


# the per-node list views a cluster's node gathers from every node: view, permission, key
CLUSTER_VIEWS = (("connections", "view-connection", "id"),
                 ("queues", "view-destination", "name"),
                 ("topics", "view-destination", "name"),
                 ("durables", "view-durable", "name"),
                 ("sessions", "view-connection", "client_id"))


def cluster_link(broker: Any) -> Any:
    """The node's cluster link (cluster.link.ClusterLink); 404 for a gateway alone."""
    link = broker.cluster
    if link is None:
        raise BadRequest("this gateway is not a node of a cluster (gateway.conf: cluster)", 404)
    return link


# -- listing -------------------------------------------------------------------------------


def page(request: web.Request, rows: list[dict[str, Any]], key: str = "name") -> web.Response:
    """A list view's rows, sorted by ``key``, filtered by ``?q=`` (an EMS wildcard pattern
    the row's name must match) and cut by ``?offset=`` / ``?limit=``; the header
    ``X-Total-Count`` has the count before the cut."""
    q = request.query.get("q", "")
    try:
        offset = int(request.query.get("offset", "0"))
        limit = int(request.query.get("limit", "0")) or None
    except ValueError:
        return json_error(400, "offset and limit must be integers")
    if offset < 0 or (limit is not None and limit < 0):
        return json_error(400, "offset and limit must not be negative")
    if q:
        try:
            subject.validate(q, wildcards=True, system=q.startswith("$"))
        except GatewayError as exc:
            return json_error(400, f"bad pattern {q!r}: {exc}")
        rows = [r for r in rows if subject.matches(q, str(r.get(key) or ""))]
    rows.sort(key=lambda r: str(r.get(key) or ""))
    total = len(rows)
    end = None if limit is None else offset + limit
    return web.json_response(rows[offset:end], headers={"X-Total-Count": str(total)})


# -- bodies --------------------------------------------------------------------------------


async def json_body(request: web.Request, fields: dict[str, type | tuple[type, ...]],
                    required: tuple[str, ...] = ()) -> dict[str, Any]:
    """The request's JSON object, each of ``fields`` of its type; raises BadRequest."""
    try:
        body = await request.json()
    except ValueError:
        raise BadRequest("the body must be JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    unknown = set(body) - set(fields)
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(sorted(unknown))}")
    for name, kind in fields.items():
        if name in body and not isinstance(body[name], kind) or (
                name in body and isinstance(body[name], bool) and kind is not bool):
            raise BadRequest(f"{name!r} has the wrong type")
    text = json.dumps(body, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest("the body holds text that is not valid Unicode (a lone "
                         "surrogate)") from None
    if any(_CONTROL.search(t) for t in _strings(body)):
        # a line break would end a config-file line early when the change is written back
        raise BadRequest("text in the body may not hold control characters") from None
    missing = [f for f in required if f not in body]
    if missing:
        raise BadRequest(f"missing field(s): {', '.join(missing)}")
    return body


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def jsonable(value: Any) -> Any:
    """A message value as JSON: bytes as base64, maps and streams recursively."""
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if value == value and abs(value) != float("inf") else str(value)
    return str(value)


def message_row(msg: Message) -> dict[str, Any]:
    """A browsed message: its headers, properties and body."""
    kind = BodyKind(msg.body_kind)
    return {
        "message_id": msg.message_id,
        "timestamp": msg.timestamp,
        "priority": msg.priority,
        "delivery_mode": DeliveryMode(msg.delivery_mode).name.lower(),
        "redelivered": bool(msg.redelivered),
        "delivery_count": int(msg.properties.get("JMSXDeliveryCount", 1) or 1),
        "expiration": msg.expiration,
        "correlation_id": jsonable(msg.correlation_id),
        "type": msg.type,
        "reply_to": str(msg.reply_to) if msg.reply_to is not None else None,
        "properties": jsonable(msg.properties),
        "body_type": kind.name.lower(),
        "body": jsonable(msg.body),
        "size": msg.size,
    }


# -- changes -------------------------------------------------------------------------------


def admin_changed(broker: Any, request: web.Request, action: str, target_object: str,
                  target_name: str, value: str | None = None) -> None:
    """Log an administrator's change and announce it on ``$sys.monitor.admin.change``
    (:func:`gateway.monitor.admin_change`: EMS's ``action``, ``target_object``, ...)."""
    user = request[USER_KEY]
    log.warning("admin: %s: %s %s %s%s", user, action, target_object, target_name,
                f" ({value})" if value else "")
    monitor.admin_change(broker, user, action, target_object, target_name, value=value,
                         hostname=request.remote or "")


def manage_routes(broker: Any) -> list[web.RouteDef]:
    """The routes of the module docstring, on ``broker``."""
    routes = web.RouteTableDef()

    def handle(fn: Callable[[web.Request], Any]) -> Callable[[web.Request], Any]:
        """BadRequest, KeyError (an unknown name) and ValueError become 4xx answers."""

        async def wrapped(request: web.Request) -> web.StreamResponse:
            try:
                return await fn(request)  # type: ignore[no-any-return]
            except BadRequest as exc:
                return json_error(exc.status, str(exc))
            except GatewayError as exc:
                return json_error(400, str(exc))

        wrapped.__name__ = fn.__name__
        wrapped.__doc__ = fn.__doc__
        return wrapped

    # -- destinations ------------------------------------------------------------------

    for kind in ("topic", "queue"):
        _destination_routes(routes, broker, kind, handle)

    @routes.get("/api/v1/queues/{name}/messages")
    @needs(Need("view-message"))
    @handle
    async def browse(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        q = broker.queues.get(name)
        try:
            limit = int(request.query.get("limit", BROWSE_DEFAULT))
        except ValueError:
            raise BadRequest("limit must be an integer") from None
        if not 0 < limit <= BROWSE_MAX:
            raise BadRequest(f"limit must be 1 to {BROWSE_MAX}")
        link = broker.cluster
        if link is not None and (q is None or q.feed is not None):
            try:  # the cluster's queue, as JetStream keeps it
                msgs = await link.browse_queue(name, limit)
            except GatewayError as exc:
                raise BadRequest(str(exc), 503) from None
            if q is None and not msgs:
                raise BadRequest(f"no queue named {name!r} on this node, and none in "
                                 "JetStream", 404)
            return web.json_response([message_row(m) for m in msgs])
        if q is None:
            raise BadRequest(f"no queue named {name!r}", 404)
        msgs = with_bodies(q, q.iter_pending()[:limit])
        return web.json_response([message_row(m) for m in msgs])

    # -- durables and connections ---------------------------------------------------------

    def durable(request: web.Request) -> Any:
        client_id = request.query.get("client_id", "")
        key = f"sub:{client_id}:{request.match_info['name']}"
        sub = broker.durable(key)
        if sub is None:
            raise BadRequest(f"no durable subscription {request.match_info['name']!r}"
                             + (f" of client {client_id!r}" if client_id else ""), 404)
        return sub

    @routes.post("/api/v1/durables/{name}/purge")
    @needs(Need("purge-durable"))
    @handle
    async def purge_durable(request: web.Request) -> web.Response:
        sub = durable(request)
        n = sub.purge()
        broker.store.commit(None)
        admin_changed(broker, request, "purge", "durable", sub.name, f"{n} messages")
        return web.json_response({"purged": n})

    @routes.delete("/api/v1/durables/{name}")
    @needs(Need("change-durable"))
    @handle
    async def delete_durable(request: web.Request) -> web.Response:
        sub = durable(request)
        if sub.consumers:
            raise BadRequest(f"durable subscription {sub.name!r} has an active consumer", 409)
        broker.unsubscribe(None, sub.name, sub.client_id or "")
        admin_changed(broker, request, "delete", "durable", sub.name)
        return web.json_response({"deleted": sub.name})

    @routes.delete("/api/v1/connections/{id}")
    @needs(Need("change-connection"))
    @handle
    async def close_connection(request: web.Request) -> web.Response:
        cid = request.match_info["id"]
        if cid not in broker.connections:
            raise BadRequest(f"no connection {cid!r}", 404)
        for server in list(broker.adapter_servers.values()):
            for c in list(getattr(server, "connections", ())):
                flow = getattr(c, "flow", None)
                if flow is not None and flow.row()["connection"] == cid and flow.close:
                    flow.close()
                    admin_changed(broker, request, "delete", "connection", cid)
                    return web.json_response({"closed": cid})
        raise BadRequest(f"connection {cid!r} is the gateway's own (a transport's); "
                         "stop the transport instead", 409)

    # -- users, groups, ACL ---------------------------------------------------------------

    _security_routes(routes, broker, handle)

    # -- transports and configuration -------------------------------------------------------

    def transport(request: web.Request) -> Any:
        m = broker.transports  # made after the app
        name = request.match_info["name"]
        if m is None or name not in m.config.transports:
            raise BadRequest(f"no transport named {name!r}", 404)
        return m

    @routes.get("/api/v1/transports/{name}")
    @needs(Need("view-server"))
    @handle
    async def show_transport(request: web.Request) -> web.Response:
        return web.json_response(transport(request).row(request.match_info["name"]))

    @routes.post("/api/v1/transports/{name}/stop")
    @needs(Need("change-server"))
    @handle
    async def stop_transport(request: web.Request) -> web.Response:
        m, name = transport(request), request.match_info["name"]
        await m.stop_one(name)
        admin_changed(broker, request, "modify", "transport", name, "stopped")
        return web.json_response(m.row(name))

    @routes.post("/api/v1/transports/{name}/start")
    @needs(Need("change-server"))
    @handle
    async def start_transport(request: web.Request) -> web.Response:
        m, name = transport(request), request.match_info["name"]
        m.start_one(name)
        admin_changed(broker, request, "modify", "transport", name, "started")
        return web.json_response(m.row(name))

    @routes.get("/api/v1/cluster")
    @needs(Need("view-server"))
    @handle
    async def show_cluster(_: web.Request) -> web.Response:
        link = cluster_link(broker)
        return web.json_response({"cluster": link.cluster_name, "node_id": link.node_id,
                                  "nodes": link.nodes()})

    for view, need, key in CLUSTER_VIEWS:
        _cluster_view_route(routes, broker, view, need, key, handle)

    @routes.get("/api/v1/cluster/store")
    @needs(Need("view-server"))
    @handle
    async def show_cluster_store(_: web.Request) -> web.Response:
        link = cluster_link(broker)
        try:
            view = await link.store_view()
        except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
            raise BadRequest(f"JetStream did not answer: {exc}", 503) from None
        return web.json_response(view)

    @routes.get("/api/v1/config")
    @needs(Need("view-server"))
    async def show_config(_: web.Request) -> web.Response:
        return web.json_response(config_view(broker.config))

    return list(routes)  # type: ignore[arg-type]


def _cluster_view_route(routes: web.RouteTableDef, broker: Any, view: str, need: str,
                        key: str, handle: Callable[[Any], Any]) -> None:
    """``GET /api/v1/cluster/<view>``: the rows of ``GET /api/v1/<view>`` of every node that
    is up, each with its ``node_id``, asked for over NATS (ClusterLink.gather)."""

    async def show_cluster_view(request: web.Request) -> web.Response:
        link = cluster_link(broker)
        rows = [{**row, "node_id": node} for node, node_rows in
                sorted((await link.gather(view)).items()) for row in node_rows]
        return page(request, rows, key=key)

    show_cluster_view.__name__ = f"show_cluster_{view}"
    routes.get(f"/api/v1/cluster/{view}")(needs(Need(need))(handle(show_cluster_view)))


def config_view(config: Any) -> dict[str, Any]:
    """``show config``: the directory and every gateway.conf parameter (secrets hidden)."""
    params: dict[str, Any] = {}
    for f in dataclasses.fields(config.gateway):
        value = getattr(config.gateway, f.name)
        if any(w in f.name for w in _SECRET_WORDS) and value:
            value = "****"
        params[f.name] = _plain(value)
    return {"directory": None if config.embedded else str(config.dir),
            "embedded": bool(config.embedded), "parameters": params,
            "transports": sorted(config.transports), "warnings": list(config.warnings)}


def _plain(value: Any) -> Any:
    if isinstance(value, (frozenset, set)):
        return sorted(str(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    url = getattr(value, "url", None)
    return url() if callable(url) else str(value)


# -- destinations ------------------------------------------------------------------------


def _destination_routes(routes: web.RouteTableDef, broker: Any, kind: str,
                        handle: Callable[[Any], Any]) -> None:
    plural = f"/api/v1/{kind}s"
    table = broker.config.table(kind)
    live = broker.topics if kind == "topic" else broker.queues

    def row(name: str) -> dict[str, Any]:
        entry = table.get(name)
        dest = live.get(name)
        if entry is None and dest is None:
            raise BadRequest(f"no {kind} named {name!r}", 404)
        out: dict[str, Any] = {"name": name, "kind": kind, "defined": entry is not None,
                               "properties": table.describe(name) or "",
                               "own_properties": entry.props_text() if entry else ""}
        if dest is not None and kind == "queue":
            out.update(dest.info(), name=name)
        elif dest is not None:
            subs = broker.subs.match(name) if not name.startswith("$") else ()
            out.update(subscriptions=len(subs), total_in=dest.stats_in,
                       pending=sum(s.npending for s in subs))
        return out

    def changed(request: web.Request, action: str, name: str, detail: str = "") -> None:
        bound(broker, kind, name)
        save(broker, kind)
        share(broker, kind, name)
        admin_changed(broker, request, action, kind, name, detail)

    async def show(request: web.Request) -> web.Response:
        return web.json_response(row(request.match_info["name"]))

    async def create(request: web.Request) -> web.Response:
        body = await json_body(request, {"name": str, "properties": str}, ("name",))
        name = body["name"]
        if table.get(name) is not None:
            raise BadRequest(f"{kind} {name!r} is already defined", 409)
        entry = table.add(name, body.get("properties", ""))
        changed(request, "create", name, entry.props_text())
        return web.json_response(row(name), status=201)

    async def setprop(request: web.Request) -> web.Response:
        """Define or redefine ``name`` with exactly these properties (EMS ``setprop``)."""
        body = await json_body(request, {"properties": str})
        name = request.match_info["name"]
        entry = table.add(name, body.get("properties", ""), replace=True)
        changed(request, "modify", name, entry.props_text())
        return web.json_response({"name": entry.name, "kind": kind,
                                  "properties": entry.props_text()})

    def setprop_need(request: web.Request) -> Need:
        """``setprop`` on a defined name modifies it; on a new one it creates it."""
        if table.get(request.match_info["name"]) is not None:
            return modify
        return Need("create-destination", kind, "create")

    async def addprop(request: web.Request) -> web.Response:
        body = await json_body(request, {"properties": str}, ("properties",))
        name = request.match_info["name"]
        try:
            entry = table.change(name, add_text=body["properties"])
        except KeyError:
            raise BadRequest(f"{kind} {name!r} is not defined (create it first)", 404) from None
        changed(request, "modify", name, entry.props_text())
        return web.json_response(row(name))

    async def removeprop(request: web.Request) -> web.Response:
        body = await json_body(request, {"properties": str}, ("properties",))
        name = request.match_info["name"]
        words = [w for w in body["properties"].split(",") if w.strip()]
        if not words:
            raise BadRequest("name at least one property to remove")
        try:
            entry = table.change(name, remove=words)
        except KeyError:
            raise BadRequest(f"{kind} {name!r} is not defined", 404) from None
        changed(request, "modify", name, entry.props_text())
        return web.json_response(row(name))

    async def delete(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        entry, dest = table.get(name), live.get(name)
        if entry is None and dest is None:
            raise BadRequest(f"no {kind} named {name!r}", 404)
        if kind == "queue" and dest is not None and dest.consumers:
            raise BadRequest(f"queue {name!r} has {len(dest.consumers)} consumer(s)", 409)
        link = broker.cluster
        if kind == "queue" and link is not None:  # the cluster's queue: its messages go
            try:                                    # from JetStream and every node
                await link.purge_queue(name)
            except GatewayError as exc:
                raise BadRequest(str(exc), 503) from None
        drop_destination(broker, kind, name)
        share(broker, kind, name)
        admin_changed(broker, request, "delete", kind, name)
        return web.json_response({"deleted": name})

    one = f"{plural}/{{name}}"
    view = Need("view-destination", kind, "view")
    modify = Need("modify-destination", kind, "modify")
    routes.get(one)(needs(view)(handle(show)))
    routes.post(plural)(needs(Need("create-destination"))(handle(create)))
    routes.post(one)(needs(setprop_need)(handle(setprop)))
    routes.post(f"{one}/addprop")(needs(modify)(handle(addprop)))
    routes.post(f"{one}/removeprop")(needs(modify)(handle(removeprop)))
    routes.delete(one)(needs(Need("delete-destination", kind, "delete"))(handle(delete)))
    if kind == "topic":

        async def purge_topic(request: web.Request) -> web.Response:
            name = request.match_info["name"]
            if name not in live:
                raise BadRequest(f"no topic named {name!r}", 404)
            n = broker.purge_topic(name)
            admin_changed(broker, request, "purge", "topic", name, f"{n} messages")
            return web.json_response({"purged": n})

        purge = Need("purge-destination", "topic", "purge")
        routes.post(f"{one}/purge")(needs(purge)(handle(purge_topic)))


# -- users, groups, ACL ----------------------------------------------------------------------


def _security_routes(routes: web.RouteTableDef, broker: Any,
                     handle: Callable[[Any], Any]) -> None:
    def security() -> Any:
        return broker.config.security

    def user_row(u: Any) -> dict[str, Any]:
        return {"name": u.name, "description": u.description,
                "groups": sorted(security().groups_of(u.name) - {"all"}),
                "has_password": bool(u.password)}

    def group_row(g: Any) -> dict[str, Any]:
        return {"name": g.name, "description": g.description, "members": list(g.members)}

    @routes.get("/api/v1/users")
    @needs(Need("view-user"))
    async def users(request: web.Request) -> web.Response:
        rows = [user_row(u) for u in security().users.values()]
        if ADMIN_USER not in security().users:  # EMS's predefined administrator
            rows.append({"name": ADMIN_USER, "description": "Administrator",
                         "groups": sorted(security().groups_of(ADMIN_USER) - {"all"}),
                         "has_password": False})
        return page(request, rows)

    @routes.post("/api/v1/users")
    @needs(Need("change-user"))
    @handle
    async def create_user(request: web.Request) -> web.Response:
        body = await json_body(request, {"name": str, "password": str, "description": str},
                               ("name",))
        try:
            u = security().add_user(body["name"], body.get("password", ""),
                                    body.get("description", ""))
        except ValueError as exc:
            raise BadRequest(str(exc), 409 if "exists" in str(exc) else 400) from None
        save(broker, "users")
        share(broker, "user", u.name)
        admin_changed(broker, request, "create", "user", u.name)
        return web.json_response(user_row(u), status=201)

    def known_user(request: web.Request) -> str:
        name = request.match_info["name"]
        if name not in security().users:
            raise BadRequest(f"no user named {name!r}", 404)
        return name

    @routes.put("/api/v1/users/{name}")
    @needs(Need("change-user"))
    @handle
    async def set_user(request: web.Request) -> web.Response:
        body = await json_body(request, {"password": str, "description": str})
        if request.match_info["name"] == ADMIN_USER and ADMIN_USER not in security().users:
            security().add_user(ADMIN_USER, description="Administrator")  # set password admin
        name = known_user(request)
        u = security().change_user(name, password=body.get("password"),
                                   description=body.get("description"))
        save(broker, "users")
        share(broker, "user", name)
        admin_changed(broker, request, "modify", "user", name,
                      "password" if "password" in body else "description")
        return web.json_response(user_row(u))

    @routes.delete("/api/v1/users/{name}")
    @needs(Need("change-user"))
    @handle
    async def delete_user(request: web.Request) -> web.Response:
        name = known_user(request)
        if name == ADMIN_USER:
            raise BadRequest("the predefined administrator cannot be deleted", 409)
        security().remove_user(name)
        save(broker, "users")
        save(broker, "groups")
        share(broker, "user", name)
        admin_changed(broker, request, "delete", "user", name)
        return web.json_response({"deleted": name})

    @routes.get("/api/v1/groups")
    @needs(Need("view-group"))
    async def groups(request: web.Request) -> web.Response:
        return page(request, [group_row(g) for g in security().groups.values()])

    @routes.post("/api/v1/groups")
    @needs(Need("change-group"))
    @handle
    async def create_group(request: web.Request) -> web.Response:
        body = await json_body(request, {"name": str, "description": str}, ("name",))
        try:
            g = security().add_group(body["name"], body.get("description", ""))
        except ValueError as exc:
            raise BadRequest(str(exc), 409 if "exists" in str(exc) else 400) from None
        save(broker, "groups")
        share(broker, "group", g.name)
        admin_changed(broker, request, "create", "group", g.name)
        return web.json_response(group_row(g), status=201)

    def known_group(request: web.Request) -> Any:
        g = security().groups.get(request.match_info["name"])
        if g is None:
            raise BadRequest(f"no group named {request.match_info['name']!r}", 404)
        return g

    @routes.delete("/api/v1/groups/{name}")
    @needs(Need("change-group"))
    @handle
    async def delete_group(request: web.Request) -> web.Response:
        g = known_group(request)
        if g.name == ADMIN_GROUP:
            raise BadRequest("the predefined group $admin cannot be deleted", 409)
        security().remove_group(g.name)
        save(broker, "groups")
        share(broker, "group", g.name)
        admin_changed(broker, request, "delete", "group", g.name)
        return web.json_response({"deleted": g.name})

    async def membership(request: web.Request, add: bool) -> web.Response:
        g = known_group(request)
        member = request.match_info["user"]
        if add and member not in security().users:
            raise BadRequest(f"no user named {member!r}", 404)
        if not add and member not in g.members:
            raise BadRequest(f"{member!r} is not a member of {g.name!r}", 404)
        members = [*g.members, member] if add else [m for m in g.members if m != member]
        g = security().set_members(g.name, members)
        save(broker, "groups")
        share(broker, "group", g.name)
        admin_changed(broker, request, "add" if add else "remove", "group", g.name, member)
        return web.json_response(group_row(g))

    members = "/api/v1/groups/{name}/members/{user}"
    routes.put(members)(needs(Need("change-group"))(handle(both(membership, True))))
    routes.delete(members)(needs(Need("change-group"))(handle(both(membership, False))))

    @routes.get("/api/v1/acl")
    @needs(Need("view-acl"))
    async def acl(request: web.Request) -> web.Response:
        want = {k: request.query[k] for k in ("kind", "name", "principal") if k in request.query}
        rows = []
        for e in security().acl_entries():
            row = {"kind": e.kind, "name": e.name, "group" if e.is_group else "user":
                   e.principal, "permissions": sorted(e.perms)}
            if all(str(row.get(k) if k != "principal" else e.principal) == v
                   for k, v in want.items()):
                rows.append(row)
        return web.json_response(rows)

    async def change_acl(request: web.Request, grant: bool) -> web.Response:
        body = await json_body(request, {"kind": str, "name": str, "user": str, "group": str,
                                         "permissions": list}, ("kind", "permissions"))
        kind = body["kind"]
        if kind not in ("topic", "queue", "admin"):
            raise BadRequest("kind must be topic, queue or admin")
        perms = body["permissions"]
        if not all(isinstance(p, str) for p in perms):
            raise BadRequest("permissions must be a list of strings")
        if kind == "admin" and not security().admin_check(request[USER_KEY], "change-admin-acl"):
            raise BadRequest(f"user {request[USER_KEY]!r} lacks the administrator permission "
                             "'change-admin-acl'", 403)
        args = dict(user=body.get("user"), group=body.get("group"))
        try:
            if grant:
                security().grant(kind, body.get("name"), perms, **args)
                found = True
            else:
                found = security().revoke(kind, body.get("name"), perms, **args)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        if not found:
            raise BadRequest("no such permission is granted directly", 404)
        save(broker, "acl")
        group = not body.get("user")
        share(broker, "acl", f"{kind}:{body.get('name') or ''}",
              str(body.get("group") if group else body.get("user")), group)
        who = f"user={body['user']}" if body.get("user") else f"group={body.get('group')}"
        target = "admin" if kind == "admin" else f"{kind} {body.get('name')}"
        admin_changed(broker, request, "grant" if grant else "revoke", "permissions", target,
                      f"{who} {','.join(perms)}")
        return web.json_response({"granted" if grant else "revoked": sorted(perms)})

    routes.post("/api/v1/acl/grant")(needs(Need("change-acl"))(handle(both(change_acl, True))))
    routes.post("/api/v1/acl/revoke")(needs(Need("change-acl"))(handle(both(change_acl, False))))


def both(fn: Callable[[web.Request, bool], Any], flag: bool) -> Callable[[web.Request], Any]:
    """The handler of one of a pair of routes (grant and revoke, add and remove): ``fn``
    with ``flag``."""

    async def handler(request: web.Request) -> web.Response:
        return await fn(request, flag)  # type: ignore[no-any-return]

    handler.__name__ = f"{fn.__name__}_{flag}"
    return handler
