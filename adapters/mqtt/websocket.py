"""MQTT over WebSocket (subprotocol ``mqtt``) on the gateway's HTTP listener, with aiohttp.

Each binary WebSocket message carries MQTT bytes (packets may span messages or share one,
MQTT 5 §6); they go to the same :class:`MqttConnection` as TCP connections use; a text
message is a protocol error. The socket shell is :mod:`adapters.websocket`, shared with STOMP.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from adapters.mqtt.connection import MqttConnection
from adapters.websocket import serve
from gateway.facade import Core

log = logging.getLogger("adapters.mqtt")
PATH = "/mqtt"


def make_handler(server: Any) -> Any:
    async def handle(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(protocols=("mqtt",), max_msg_size=server.max_packet_size + 5)
        await ws.prepare(request)
        if ws.ws_protocol != "mqtt":
            await ws.close(code=1002, message=b"subprotocol mqtt required")
            return ws

        def on_text(conn: MqttConnection, text: str) -> bool:
            conn.protocol_error(0x81, "MQTT over WebSocket needs binary frames")
            return False

        await serve(request, ws, server,
                    lambda write, close, address: MqttConnection(server, write, close, address),
                    on_text, protocol="mqtt-ws")
        return ws

    return handle


def register(broker: Core, server: Any) -> None:
    """Offer ``GET /mqtt`` on the HTTP listener (once per broker)."""
    routes = broker.http_routes
    if not any(path == PATH for _, path, _ in routes):
        routes.append(("GET", PATH, make_handler(server)))
