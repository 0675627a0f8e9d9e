"""MQTT over WebSocket (subprotocol ``mqtt``) on the gateway's HTTP listener, with aiohttp.

Each binary WebSocket message carries MQTT bytes (packets may span messages or share one,
MQTT 5 §6); they go to the same :class:`MqttConnection` as TCP connections use. Writes are
collected per loop turn and sent by one writer task per connection, in order.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import WSMsgType, web

from adapters.mqtt.session import MqttConnection

log = logging.getLogger("adapters.mqtt")
PATH = "/mqtt"


def make_handler(server: Any) -> Any:
    async def handle(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(protocols=("mqtt",), max_msg_size=server.max_packet_size + 5)
        await ws.prepare(request)
        if ws.ws_protocol != "mqtt":
            await ws.close(code=1002, message=b"subprotocol mqtt required")
            return ws
        out: list[bytes] = []
        wake = asyncio.Event()
        closing = False

        def write(data: bytes) -> None:
            out.append(data)
            wake.set()

        def close() -> None:
            nonlocal closing
            closing = True
            wake.set()

        async def writer() -> None:
            while True:
                await wake.wait()
                wake.clear()
                if out:
                    data = b"".join(out)
                    out.clear()
                    try:
                        await ws.send_bytes(data)
                    except ConnectionError:
                        return
                if closing:
                    await ws.close()
                    return

        peer = request.transport.get_extra_info("peername") if request.transport else None
        conn = MqttConnection(server, write, close, f"ws:{peer[0]}:{peer[1]}" if peer else "ws")
        server.connections.add(conn)
        task = asyncio.ensure_future(writer())
        try:
            async for msg in ws:
                if msg.type == WSMsgType.BINARY:
                    conn.data_received(msg.data)
                elif msg.type == WSMsgType.TEXT:
                    conn.protocol_error(0x81, "MQTT over WebSocket needs binary frames")
                    break
                if closing:
                    break
        finally:
            server.connections.discard(conn)
            conn.connection_lost()
            close()
            try:
                await asyncio.wait_for(task, 5)
            except (TimeoutError, ConnectionError):
                task.cancel()
        return ws

    return handle


def register(broker: Any, server: Any) -> None:
    """Offer ``GET /mqtt`` on the HTTP listener (once per broker)."""
    routes = broker.http_routes
    if not any(path == PATH for _, path, _ in routes):
        routes.append(("GET", PATH, make_handler(server)))
