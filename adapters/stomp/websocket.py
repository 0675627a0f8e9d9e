"""STOMP over WebSocket (subprotocols ``v12.stomp``, ``v11.stomp``, ``v10.stomp``) on the
gateway's HTTP listener, with aiohttp.

Each WebSocket message carries STOMP bytes -- stomp.js sends text messages, others binary;
frames may span messages or share one -- and they go to the same :class:`StompConnection`
as TCP connections use. Replies are sent as text messages to a client that sends text (when
they are valid UTF-8; a binary body goes as a binary message) and as binary otherwise.
Writes are collected per loop turn and sent by one writer task per connection, in order.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import WSMsgType, web

from adapters.stomp.connection import StompConnection

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
        out: list[bytes] = []
        wake = asyncio.Event()
        closing = False
        text_mode = False

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
                        if text_mode:
                            try:
                                await ws.send_str(data.decode())
                            except UnicodeDecodeError:
                                await ws.send_bytes(data)
                        else:
                            await ws.send_bytes(data)
                    except ConnectionError:
                        return
                if closing:
                    await ws.close()
                    return

        peer = request.transport.get_extra_info("peername") if request.transport else None
        conn = StompConnection(server, write, close,
                               f"ws:{peer[0]}:{peer[1]}" if peer else "ws")
        server.connections.add(conn)
        task = asyncio.ensure_future(writer())
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    text_mode = True
                    conn.data_received(msg.data.encode())
                elif msg.type == WSMsgType.BINARY:
                    text_mode = False
                    conn.data_received(msg.data)
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
    """Offer ``GET /stomp`` on the HTTP listener (once per broker)."""
    routes = broker.http_routes
    if not any(path == PATH for _, path, _ in routes):
        routes.append(("GET", PATH, make_handler(server)))
