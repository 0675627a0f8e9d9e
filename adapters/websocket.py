"""The WebSocket shell the MQTT and STOMP adapters share (aiohttp, on the HTTP listener).

How this works. :func:`serve` runs one upgraded WebSocket: it makes the adapter's connection
object with a ``write`` and a ``close`` of its own, feeds it the bytes of every message that
arrives, and tears it down when the socket ends. Writes are collected per loop turn and sent
by one writer task per connection, in order; ``close`` is honoured after what was written
before it. An adapter says what a text message means (``on_text``: feed it, or refuse it)
and whether a client that last sent text gets text back (``text_replies``, for STOMP clients
that speak text; a reply that is not UTF-8 still goes as a binary message).

Slow consumers: what waits to be sent is the bytes collected and not yet handed to aiohttp
plus the socket transport's write buffer (a frame aiohttp sends without compression is in
that buffer as soon as the send starts, so it is counted once); past
:data:`adapters.listener.WRITE_HIGH_WATER` the connection's ``pause_writing`` stops its
deliveries, and once that count is at or below the low-water mark ``resume_writing``
restarts them -- as the TCP shells do with the transport's own water marks
(:mod:`adapters.listener`). The count is looked at after each send and, while paused, every
:data:`DRAIN_CHECK` seconds: a send may complete without waiting for the socket (aiohttp
waits only past its own limit), and a paused connection sends nothing that would look again.

Held producers: when the core holds a producer at ``max_msg_memory`` (flow control) the
adapter calls ``pause_reading``; the next message is not taken from aiohttp until
``resume_reading``, so what a flooding client sends waits in aiohttp's bounded read buffer and
then in the kernel and the client, as with the TCP shells.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import WSMsgType, web

from adapters.listener import WRITE_HIGH_WATER, WRITE_LOW_WATER, WriteFlow

# Seconds between looks at a paused connection's write buffer (see the module docstring).
DRAIN_CHECK = 0.05

# What an adapter does with a text message: feed bytes to the connection (return True to
# go on) or refuse it (return False, the socket ends).
OnText = Callable[[Any, str], bool]


class _Writer:
    """Output of one connection, sent in order by one task."""

    def __init__(self, ws: web.WebSocketResponse, transport: Any) -> None:
        self.ws = ws
        self.transport = transport
        self.text = False  # reply in text messages
        self.out: list[bytes] = []
        self.queued = 0  # bytes in ``out``, not yet handed to aiohttp
        self.conn: Any = None
        self.flow: WriteFlow | None = None
        self.paused = False
        self.check: asyncio.TimerHandle | None = None  # the next look while paused
        self.wake = asyncio.Event()
        # Set while the connection may be read; cleared by the adapter's ``pause_reading``
        # (a producer held by the core's flow control), set again by ``resume_reading``.
        self.readable = asyncio.Event()
        self.readable.set()
        self.closing = False
        self.task = asyncio.ensure_future(self._run())

    def write(self, data: bytes) -> None:
        self.out.append(data)
        self.queued += len(data)
        self.wake.set()
        if not self.paused and self.conn is not None and self.buffered() > WRITE_HIGH_WATER:
            self.paused = True
            self.conn.pause_writing()
            if self.flow is not None:
                self.flow.became_slow()

    def buffered(self) -> int:
        t = self.transport
        n = t.get_write_buffer_size() if t is not None and not t.is_closing() else 0
        return self.queued + n

    def _drained(self) -> None:
        self.check = None
        if not self.paused or self.closing:
            return
        if self.buffered() <= WRITE_LOW_WATER:
            self.paused = False
            if self.conn is not None:
                self.conn.resume_writing()
            if self.flow is not None:
                self.flow.recovered()
        else:
            self.check = asyncio.get_running_loop().call_later(DRAIN_CHECK, self._drained)

    def close(self) -> None:
        self.closing = True
        self.readable.set()  # a read waiting for resume_reading ends with the connection
        if self.check is not None:
            self.check.cancel()
            self.check = None
        self.wake.set()

    async def _run(self) -> None:
        ws = self.ws
        while True:
            await self.wake.wait()
            self.wake.clear()
            if self.out:
                data = b"".join(self.out)
                self.out.clear()
                self.queued -= len(data)  # from here it is the transport's to count
                try:
                    if self.text:
                        try:
                            await ws.send_str(data.decode())
                        except UnicodeDecodeError:
                            await ws.send_bytes(data)
                    else:
                        await ws.send_bytes(data)
                except ConnectionError:
                    return
                if self.check is None:
                    self._drained()
            if self.closing:
                await ws.close()
                return

    async def finish(self) -> None:
        self.close()
        try:
            await asyncio.wait_for(self.task, 5)
        except (TimeoutError, ConnectionError):
            self.task.cancel()


async def serve(request: web.Request, ws: web.WebSocketResponse, server: Any,
                make_connection: Callable[[Callable[[bytes], None], Callable[[], None], str],
                                          Any],
                on_text: OnText, *, text_replies: bool = False, protocol: str = "ws") -> None:
    """Run one prepared WebSocket with the adapter's connection until it ends."""
    writer = _Writer(ws, request.transport)
    peer = request.transport.get_extra_info("peername") if request.transport else None
    address = f"ws:{peer[0]}:{peer[1]}" if peer else "ws"
    conn = make_connection(writer.write, writer.close, address)
    writer.conn = conn
    # Producers held by the core's flow control (an MQTT QoS 0 publish, STOMP sends past
    # their limit) stop the reading of this socket as the TCP shells' pause_reading does:
    # aiohttp then stops reading the socket once its own small buffer is full, and TCP
    # pushes back on the client.
    conn.pause_reading = writer.readable.clear
    conn.resume_reading = writer.readable.set
    writer.flow = conn.flow = WriteFlow(server.broker, protocol, address, writer.buffered)
    writer.flow.conn = conn

    def close() -> None:
        asyncio.ensure_future(ws.close())

    writer.flow.close = close
    server.connections.add(conn)
    try:
        async for msg in ws:
            if msg.type == WSMsgType.BINARY:
                writer.text = False
                conn.data_received(msg.data)
            elif msg.type == WSMsgType.TEXT:
                writer.text = text_replies
                if not on_text(conn, msg.data):
                    break
            if writer.closing:
                break
            if not writer.readable.is_set():
                await writer.readable.wait()
                if writer.closing:
                    break
    finally:
        writer.flow.closed()
        server.connections.discard(conn)
        conn.connection_lost()
        await writer.finish()
