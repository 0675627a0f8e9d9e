"""STOMP over WebSocket (subprotocols ``v12.stomp``, ``v11.stomp``, ``v10.stomp``) on the
gateway's HTTP listener, with aiohttp.

Each WebSocket message carries STOMP bytes -- stomp.js sends text messages, others binary;
frames may span messages or share one -- and they go to the same :class:`StompConnection`
as TCP connections use. Replies are sent as text messages to a client that sends text (when
they are valid UTF-8; a binary body goes as a binary message) and as binary otherwise.
The socket shell is :mod:`adapters.websocket`, shared with MQTT over WebSocket.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from adapters.stomp.connection import StompConnection
from adapters.websocket import serve
from gateway.facade import Core

log = logging.getLogger("adapters.stomp")
PATH = "/stomp"
SUBPROTOCOLS = ("v12.stomp", "v11.stomp", "v10.stomp")


def make_handler(server: Any) -> Any:
    async def handle(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(protocols=SUBPROTOCOLS,
                                   max_msg_size=server.max_frame_size + server.max_header_bytes)
        await ws.prepare(request)
        if ws.ws_protocol not in SUBPROTOCOLS:
            await ws.close(code=1002, message=b"subprotocol v12.stomp, v11.stomp or v10.stomp")
            return ws

        def on_text(conn: StompConnection, text: str) -> bool:
            conn.data_received(text.encode())
            return True

        await serve(request, ws, server,
                    lambda write, close, address: StompConnection(server, write, close, address),
                    on_text, text_replies=True, protocol="stomp-ws")
        return ws

    return handle


def register(broker: Core, server: Any) -> None:
    """Offer ``GET /stomp`` on the HTTP listener (once per broker)."""
    routes = broker.http_routes
    if not any(path == PATH for _, path, _ in routes):
        routes.append(("GET", PATH, make_handler(server)))
