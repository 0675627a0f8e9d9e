"""The TCP (or TLS) listener every protocol adapter returns to the gateway.

One class, so that MQTT, AMQP and (next) STOMP listen, report their address and close the
same way: the gateway reads ``address`` to log where it listens and awaits ``close()`` on
shutdown, which stops accepting and then closes the adapter's shared server state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from gateway.tls import server_context


class AdapterServer(Protocol):
    def close(self) -> None: ...


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
    listener's scheme is ``tls_scheme`` (``mqtts``, ``amqps``, ...)."""
    ctx = server_context(broker, tls_scheme) if spec.scheme == tls_scheme else None
    tcp = await broker.loop.create_server(protocol, spec.host or None, spec.port, ssl=ctx)
    return Listener(server, tcp)
