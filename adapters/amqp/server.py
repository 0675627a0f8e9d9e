"""The AMQP 1.0 listener: a thin asyncio shell around :mod:`adapters.amqp.connection`.

How this works. :func:`start` is the registry entry for ``listen = amqp://host:port`` (5672)
and ``amqps://`` (5671, TLS with the gateway's certificate, terminated by asyncio's ssl
module so that proton needs no TLS of its own). Each TCP connection gets an
:class:`AmqpProtocol` that feeds bytes to its :class:`AmqpConnection`, writes what it
returns, and tells it when the socket's write buffer fills and drains (deliveries pause).

:class:`AmqpServer` holds what the connections share: the broker, the settings read from
``gateway.conf`` (``amqp_default_destination``: the kind of a bare address; whether
anonymous clients may connect; the largest message accepted), and the live connections.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from adapters.amqp.connection import AmqpConnection
from adapters.listener import (
    WRITE_HIGH_WATER,
    WRITE_LOW_WATER,
    FlowProtocol,
    Listener,
    WriteFlow,
    listen,
)
from gateway.facade import Core
from gateway.message import QUEUE, TOPIC
from mappings.engine import log_deliveries

log = logging.getLogger("adapters.amqp")

DEFAULT_MAX_MESSAGE_SIZE = 16 * 1024 * 1024


class AmqpServer:
    """State shared by every AMQP connection of one gateway."""

    def __init__(self, broker: Core) -> None:
        self.broker = broker
        self.loop: asyncio.AbstractEventLoop = broker.loop
        gw = broker.config.gateway
        kind = getattr(gw, "amqp_default_destination", "queue")
        self.default_kind = TOPIC if kind == "topic" else QUEUE
        # ANONYMOUS offered, and AMQP without SASL taken, when the core takes clients without
        # a user name: always with authorization disabled
        self.allow_anonymous = broker.anonymous_allowed()
        limit = int(gw.max_client_msg_size)
        self.max_message_size = min(limit, DEFAULT_MAX_MESSAGE_SIZE) if limit else DEFAULT_MAX_MESSAGE_SIZE
        self.connections: set[AmqpConnection] = set()

    def close(self) -> None:
        for conn in list(self.connections):
            conn.close_socket()


class AmqpProtocol(FlowProtocol):
    """One TCP (or TLS) connection."""

    def __init__(self, server: AmqpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.conn: AmqpConnection | None = None
        self.flow: WriteFlow | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        address = f"{peer[0]}:{peer[1]}" if peer else "?"
        transport.set_write_buffer_limits(  # type: ignore[attr-defined]
            high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        self.conn = AmqpConnection(self.server, self.write, self.close, address)
        self.flow = self.conn.flow = WriteFlow(self.server.broker, "amqp", address,
                                               self.buffered)
        self.flow.conn = self.conn
        self.flow.close = self.close
        self.server.connections.add(self.conn)

    def buffered(self) -> int:
        t = self.transport
        return t.get_write_buffer_size() if t is not None and not t.is_closing() else 0

    def data_received(self, data: bytes) -> None:
        assert self.conn is not None
        self.conn.data_received(data)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.flow is not None:
            self.flow.closed()
        if self.conn is not None:
            self.server.connections.discard(self.conn)
            self.conn.connection_lost()

    def write(self, data: bytes) -> None:
        t = self.transport
        if t is not None and not t.is_closing():
            t.write(data)

    def close(self) -> None:
        t = self.transport
        if t is not None and not t.is_closing():
            t.close()


def shared_server(broker: Core) -> AmqpServer:
    """One AmqpServer per broker, shared by the plain and TLS listeners."""
    server: AmqpServer | None = broker.adapter_servers.get("amqp")
    if server is None:
        server = AmqpServer(broker)
        broker.adapter_servers["amqp"] = server
    return server


async def start(broker: Core, spec: Any) -> Listener:
    """Registry entry: listen for AMQP 1.0 (``amqp://``) or AMQP over TLS (``amqps://``)."""
    server = shared_server(broker)
    log_deliveries(broker)  # the delivery log names the out rules this adapter runs
    return await listen(broker, spec, server, lambda: AmqpProtocol(server), "amqps")
