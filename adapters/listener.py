"""The TCP (or TLS) listener every protocol adapter returns to the gateway, and the
write-batching socket shell the MQTT and STOMP adapters share.

:class:`Listener`: MQTT, AMQP and STOMP listen, report their address and close the same
way: the gateway reads ``address`` to log where it listens and awaits ``close()`` on
shutdown, which stops accepting and then closes the adapter's shared server state.

:class:`BatchedProtocol`: output is collected while a read is processed and written once
per connection when it ends -- the acknowledgements and the deliveries one incoming packet
causes, on every connection it reaches, leave in one ``write`` each with no extra loop
wake-up. The reading connection is written first (its acknowledgements free its sender's
window). Output made outside a read (a group commit confirmed, a timer) is written on the
next loop turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from gateway.config.gateway_conf import listen_backlog
from gateway.tls import server_context


class AdapterServer(Protocol):
    def close(self) -> None: ...


class BatchingServer(Protocol):
    """What :class:`BatchedProtocol` needs of its adapter's shared server state."""

    loop: asyncio.AbstractEventLoop
    reading: bool  # a read is being processed
    dirty: list[Any]  # protocols written to during it
    connections: set[Any]


class BatchedProtocol(asyncio.Protocol):
    """One connection's socket; subclasses make ``self.conn`` in ``connection_made``."""

    def __init__(self, server: BatchingServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.conn: Any = None
        self.out: list[bytes] = []
        self.flush_scheduled = False

    def data_received(self, data: bytes) -> None:
        """Process the read, then write every connection it produced output for, once each."""
        server = self.server
        if server.reading:  # re-entered (cannot happen with asyncio, kept safe)
            self.conn.data_received(data)
            return
        server.reading = True
        try:
            self.conn.data_received(data)
        finally:
            server.reading = False
            dirty = server.dirty
            if dirty:
                server.dirty = []
                if self.flush_scheduled:
                    self.flush()
                for proto in dirty:
                    if proto.flush_scheduled:
                        proto.flush()

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn is not None:
            self.server.connections.discard(self.conn)
            self.conn.connection_lost()
        self.out.clear()

    def write(self, data: bytes) -> None:
        self.out.append(data)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            server = self.server
            if server.reading:
                server.dirty.append(self)
            else:
                server.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write everything collected this loop turn in one call."""
        self.flush_scheduled = False
        t = self.transport
        if self.out and t is not None and not t.is_closing():
            t.write(self.out[0] if len(self.out) == 1 else b"".join(self.out))
        self.out.clear()

    def close(self) -> None:
        t = self.transport
        if t is not None and not t.is_closing():
            self.flush()
            t.close()


class Listener:
    """A listening socket of one adapter: its address and an async close."""

    def __init__(self, server: AdapterServer, tcp: asyncio.Server) -> None:
        self.server = server
        self.tcp = tcp
        sock = tcp.sockets[0].getsockname()
        self.address: tuple[str, int] = (sock[0], sock[1])

    async def close(self) -> None:
        self.tcp.close()
        self.server.close()
        await self.tcp.wait_closed()


async def listen(broker: Any, spec: Any, server: AdapterServer,
                 protocol: Callable[[], asyncio.BaseProtocol], tls_scheme: str) -> Listener:
    """Listen on ``spec``'s host and port; TLS with the gateway's certificate when the
    listener's scheme is ``tls_scheme`` (``mqtts``, ``amqps``, ...). The accept queue is
    ``listen_backlog`` long (the system's maximum by default), not asyncio's 100: a burst of
    devices connecting at once waits there rather than in TCP's SYN retries (a second each,
    then more)."""
    ctx = server_context(broker, tls_scheme) if spec.scheme == tls_scheme else None
    tcp = await broker.loop.create_server(protocol, spec.host or None, spec.port, ssl=ctx,
                                          backlog=listen_backlog(broker.config.gateway))
    return Listener(server, tcp)
