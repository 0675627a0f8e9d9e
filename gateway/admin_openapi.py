"""The admin API's OpenAPI 3.1 document, served at ``GET /api/v1/openapi.json``.

Written here as a table, one row per route: what it does (and which EMS administrator
permission it needs), its query parameters, its JSON body and its answer. :func:`document`
turns the table into the document; the test suite checks that the table and the
application's routes are the same set, and runs schemathesis against the document.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.admin_manage import CLUSTER_VIEWS

OBJ: dict[str, Any] = {"type": "object"}
ROWS: dict[str, Any] = {"type": "array", "items": OBJ}
ERROR: dict[str, Any] = {"type": "object", "required": ["error"],
                         "properties": {"error": {"type": "string"}}}
PROPERTIES_BODY: dict[str, Any] = {
    "type": "object", "required": ["properties"], "additionalProperties": False,
    "properties": {"properties": {"type": "string", "description":
                                  "EMS destination properties: maxbytes=10MB,secure"}}}
NAMED_BODY: dict[str, Any] = {
    "type": "object", "required": ["name"], "additionalProperties": False,
    "properties": {"name": {"type": "string"}, "properties": {"type": "string"}}}
USER_BODY: dict[str, Any] = {
    "type": "object", "required": ["name"], "additionalProperties": False,
    "properties": {"name": {"type": "string"}, "password": {"type": "string"},
                   "description": {"type": "string"}}}
USER_CHANGE: dict[str, Any] = {
    "type": "object", "additionalProperties": False,
    "properties": {"password": {"type": "string"}, "description": {"type": "string"}}}
GROUP_BODY: dict[str, Any] = {
    "type": "object", "required": ["name"], "additionalProperties": False,
    "properties": {"name": {"type": "string"}, "description": {"type": "string"}}}
ACL_BODY: dict[str, Any] = {
    "type": "object", "required": ["kind", "permissions"], "additionalProperties": False,
    "properties": {"kind": {"enum": ["topic", "queue", "admin"]}, "name": {"type": "string"},
                   "user": {"type": "string"}, "group": {"type": "string"},
                   "permissions": {"type": "array", "items": {"type": "string"}}}}
LOG_BODY: dict[str, Any] = {
    "type": "object", "required": ["level"], "additionalProperties": False,
    "properties": {"level": {"type": "string"}, "logger": {"type": "string"}}}
PAGE = ("q", "offset", "limit")
DESCRIPTIONS = {
    "q": "an EMS wildcard pattern the names must match (orders.>)",
    "offset": "rows to skip", "limit": "most rows to give (0: all)",
    "client_id": "the client id the durable subscription belongs to",
    "slow": "1: only the connections whose output is backed up",
    "kind": "topic, queue or admin", "name": "a destination name",
    "principal": "a user or group name",
}


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    summary: str
    perm: str  # the EMS administrator permission ("" for any authenticated user)
    result: dict[str, Any] = field(default_factory=lambda: OBJ)
    body: dict[str, Any] | None = None
    query: tuple[str, ...] = ()
    ok: int = 200
    errors: tuple[int, ...] = ()
    text: bool = False  # the answer is text/plain (Prometheus' exposition format)


def _routes() -> list[Route]:
    dest: list[Route] = []
    for kind in ("topic", "queue"):
        base = f"/api/v1/{kind}s"
        dest += [
            Route("GET", base, f"show {kind}s", "view-destination", ROWS, query=PAGE,
                  errors=(400,)),
            Route("POST", base, f"create {kind}", "create-destination", OBJ, NAMED_BODY, ok=201,
                  errors=(400, 409)),
            Route("GET", base + "/{name}", f"show {kind}", "view-destination", errors=(404,)),
            Route("POST", base + "/{name}", f"setprop {kind} (creates an undefined one)",
                  "modify-destination", OBJ, PROPERTIES_BODY, errors=(400,)),
            Route("POST", base + "/{name}/addprop", f"addprop {kind}", "modify-destination", OBJ,
                  PROPERTIES_BODY, errors=(400, 404)),
            Route("POST", base + "/{name}/removeprop", f"removeprop {kind}",
                  "modify-destination", OBJ, PROPERTIES_BODY, errors=(400, 404)),
            Route("DELETE", base + "/{name}", f"delete {kind}", "delete-destination",
                  errors=(404, 409, 503) if kind == "queue" else (404, 409)),
            Route("POST", base + "/{name}/purge", f"purge {kind}", "purge-destination",
                  errors=(404, 503) if kind == "queue" else (404,)),
        ]
    return dest + [
        Route("POST", "/api/v1/tokens", "a bearer token for the Basic credentials given", "",
              errors=(403,)),
        Route("DELETE", "/api/v1/tokens/current", "revoke the bearer token used", "",
              errors=(400,)),
        Route("GET", "/api/v1/openapi.json", "this document", ""),
        Route("GET", "/api/v1/server", "show server", "view-server"),
        Route("GET", "/api/v1/config", "show config: gateway.conf's parameters", "view-server"),
        Route("GET", "/api/v1/cluster", "every node of the cluster, as this node hears them",
              "view-server", errors=(404,)),
        *(Route("GET", f"/api/v1/cluster/{view}", f"every node's {view}", need, ROWS,
                query=PAGE, errors=(400, 404)) for view, need, _ in CLUSTER_VIEWS),
        Route("GET", "/api/v1/cluster/store", "what JetStream keeps for the whole cluster: "
              "queues and durable subscriptions", "view-server", errors=(404, 503)),
        Route("GET", "/api/v1/store", "the store's group-commit statistics", "view-server"),
        Route("GET", "/api/v1/log", "the log levels", "view-server"),
        Route("PUT", "/api/v1/log", "set a log level", "change-server", OBJ, LOG_BODY,
              errors=(400,)),
        Route("GET", "/api/v1/queues/{name}/messages", "browse a queue (not consumed)",
              "view-message", ROWS, query=("limit",), errors=(400, 404, 503)),
        Route("GET", "/api/v1/durables", "show durables", "view-durable", ROWS, query=PAGE,
              errors=(400,)),
        Route("POST", "/api/v1/durables/{name}/purge", "purge durable", "purge-durable",
              query=("client_id",), errors=(404,)),
        Route("DELETE", "/api/v1/durables/{name}", "delete durable", "change-durable",
              query=("client_id",), errors=(404, 409)),
        Route("GET", "/api/v1/connections", "show connections", "view-connection", ROWS,
              query=PAGE, errors=(400,)),
        Route("DELETE", "/api/v1/connections/{id}", "delete connection (close it)",
              "change-connection", errors=(404, 409)),
        Route("GET", "/api/v1/clients", "every connection's output", "view-connection", ROWS,
              query=("slow",)),
        Route("GET", "/api/v1/sessions", "MQTT sessions", "view-connection", ROWS),
        Route("GET", "/api/v1/users", "show users", "view-user", ROWS, query=PAGE,
              errors=(400,)),
        Route("POST", "/api/v1/users", "create user", "change-user", OBJ, USER_BODY, ok=201,
              errors=(400, 409)),
        Route("PUT", "/api/v1/users/{name}", "set password (and description)", "change-user",
              OBJ, USER_CHANGE, errors=(400, 404)),
        Route("DELETE", "/api/v1/users/{name}", "delete user", "change-user",
              errors=(404, 409)),
        Route("GET", "/api/v1/groups", "show groups", "view-group", ROWS, query=PAGE,
              errors=(400,)),
        Route("POST", "/api/v1/groups", "create group", "change-group", OBJ, GROUP_BODY, ok=201,
              errors=(400, 409)),
        Route("DELETE", "/api/v1/groups/{name}", "delete group", "change-group",
              errors=(404, 409)),
        Route("PUT", "/api/v1/groups/{name}/members/{user}", "addmember", "change-group",
              errors=(400, 404)),
        Route("DELETE", "/api/v1/groups/{name}/members/{user}", "removemember",
              "change-group", errors=(404,)),
        Route("GET", "/api/v1/acl", "showacl", "view-acl", ROWS,
              query=("kind", "name", "principal")),
        Route("POST", "/api/v1/acl/grant", "grant", "change-acl (change-admin-acl for admin)",
              OBJ, ACL_BODY, errors=(400,)),
        Route("POST", "/api/v1/acl/revoke", "revoke", "change-acl (change-admin-acl for admin)",
              OBJ, ACL_BODY, errors=(400, 404)),
        Route("GET", "/api/v1/transports", "show transports", "view-server", ROWS),
        Route("GET", "/api/v1/transports/{name}", "show transport", "view-server",
              errors=(404,)),
        Route("POST", "/api/v1/transports/{name}/stop", "stop a transport", "change-server",
              errors=(404,)),
        Route("POST", "/api/v1/transports/{name}/start", "start a stopped transport",
              "change-server", errors=(400, 404)),
        Route("GET", "/metrics", "Prometheus metrics (text exposition format)", "view-server",
              text=True),
    ]


ROUTES: tuple[Route, ...] = tuple(_routes())


def _operation(r: Route) -> dict[str, Any]:
    need = f" Needs the administrator permission {r.perm}." if r.perm else ""
    content = ({"text/plain": {"schema": {"type": "string"}}} if r.text
               else {"application/json": {"schema": r.result}})
    responses: dict[str, Any] = {str(r.ok): {"description": "done", "content": content}}
    # 417: an Expect header other than 100-continue, on any route (RFC 9110 §10.1.1)
    for status in sorted({*r.errors, 401, 403, 417, *((400, 413) if r.body else ())}):
        responses[str(status)] = {
            "description": {400: "bad request", 401: "no or bad credentials",
                            403: "not permitted", 404: "no such name", 409: "conflict",
                            413: "body too large",
                            417: "an expectation (Expect) other than 100-continue",
                            503: "a service it needs did not answer"}[status],
            # the HTTP server's own answer to an Expect header is plain text
            "content": ({"text/plain": {"schema": {"type": "string"}}} if status == 417
                        else {"application/json": {"schema": ERROR}})}
    op: dict[str, Any] = {"summary": r.summary, "description": r.summary + "." + need,
                          "responses": responses}
    params = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
              for p in _path_names(r.path)]
    params += [{"name": q, "in": "query", "required": False, "description": DESCRIPTIONS[q],
                "schema": {"type": "string"}} for q in r.query]
    if params:
        op["parameters"] = params
    if r.body is not None:
        op["requestBody"] = {"required": True,
                             "content": {"application/json": {"schema": r.body}}}
    return op


def _path_names(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{")]


def document(version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of :data:`ROUTES`."""
    paths: dict[str, dict[str, Any]] = {}
    for r in ROUTES:
        paths.setdefault(r.path, {})[r.method.lower()] = _operation(r)
    return {
        "openapi": "3.1.0",
        "info": {"title": "gateway admin API", "version": version,
                 "description": "The administration of a running gateway, in the manner of "
                                "TIBCO EMS's administration tool. Every route needs HTTP Basic "
                                "credentials of a users.conf user or a bearer token."},
        "components": {"securitySchemes": {"basic": {"type": "http", "scheme": "basic"},
                                           "bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"basic": []}, {"bearer": []}],
        "paths": paths,
    }
