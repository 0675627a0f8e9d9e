"""The STOMP listener: a thin asyncio shell around :mod:`adapters.stomp.connection`.

How this works. :func:`start` is the registry entry for ``listen = stomp://host:port``
(61613) and ``stomps://`` (61614, TLS with the gateway's certificate). Each TCP connection
gets a :class:`StompProtocol` that feeds bytes to its :class:`StompConnection` and writes
what it produces. Output is collected while a read is processed and written once per
connection when it ends -- the MESSAGE frames a SEND fans out and the RECEIPT for it leave
in one ``write`` each, with no extra loop wake-up (the same scheme as the MQTT adapter).
When a socket's write buffer fills, that connection's subscriptions pause; when it drains
they resume. STOMP over WebSocket is :mod:`adapters.stomp.websocket`, on the HTTP listener.

:class:`StompServer` holds what the connections share: the broker, the limits read from
``gateway.conf`` (``max_client_msg_size`` bounds a frame), the live connections, and a
one-entry cache of the last message rendered, so a message fanned out to many subscribers
is mapped once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from adapters.listener import BatchedProtocol, Listener, listen
from adapters.stomp.codec import escape
from adapters.stomp.connection import StompConnection
from gateway.facade import Core
from gateway.message import TEMP_PREFIX, BodyKind, Message
from mappings.engine import default_wire, log_deliveries
from mappings.stomp import (
    BYTES_TRANSFORMATION,
    TEXT_CONTENT_TYPE,
    transformed_body,
)

log = logging.getLogger("adapters.stomp")

DEFAULT_MAX_FRAME = 16 * 1024 * 1024
MAX_HEADER_BYTES = 64 * 1024
MAX_HEADERS = 1000


class StompServer:
    """State shared by every STOMP connection of one gateway."""

    def __init__(self, broker: Core) -> None:
        self.broker = broker
        self.loop: asyncio.AbstractEventLoop = broker.loop
        limit = int(broker.config.gateway.max_client_msg_size)
        # A frame is its body plus headers: allow the header block on top of the message limit.
        self.max_frame_size = (min(limit, DEFAULT_MAX_FRAME) if limit else DEFAULT_MAX_FRAME)
        self.max_header_bytes = MAX_HEADER_BYTES
        self.max_headers = MAX_HEADERS
        self.connections: set[StompConnection] = set()
        # Connections written to while a read is processed: flushed once when it ends.
        self.reading = False
        self.dirty: list[Any] = []
        self._last: tuple[Message | None, str, bytes, bytes] = (None, "", b"", b"")
        self._last_transformation: str | None = None
        # The default mapping (stomp_to_message / message_to_stomp while the rows are the
        # ones they are written for), taken once: it is the same for the gateway's life.
        self.to_message: Callable[..., Message] = default_wire("stomp", "in")
        self.to_stomp: Callable[..., tuple[list[tuple[str, str]], bytes]] = default_wire(
            "stomp", "out")

    def render(self, msg: Message, conn: StompConnection, transformation: str | None = None
               ) -> tuple[bytes, bytes]:
        """The encoded header lines of ``msg`` for ``conn``'s version -- everything after the
        delivery's own headers, through ``content-length`` and the blank line -- and its
        body, in the form the subscription's ``transformation`` asked for. Kept for the last
        message, so a fan-out maps and encodes it once."""
        version = conn.version
        last, last_version, block, body = self._last
        if last is msg and last_version == version and self._last_transformation == \
                transformation:
            return block, body
        original = msg
        mappings = self.broker.mappings
        to_stomp = self.to_stomp
        dest = msg.destination
        if mappings is not None and dest is not None:  # raises MappingFailed: refused
            msg = mappings.apply(msg, protocol="stomp", direction="out")
            # The default mapping, or the declarative mappings' wire side for this destination.
            to_stomp = mappings.wire_for(dest, protocol="stomp", direction="out")
        rt = msg.reply_to
        temporary = (dest is not None and dest.name.startswith(TEMP_PREFIX)) or (
            rt is not None and rt.name.startswith(TEMP_PREFIX))
        headers, body = to_stomp(
            msg, destination=conn.render_destination(dest) if dest is not None else "",
            reply_to=conn.render_destination(rt) if rt is not None else None,
        )
        if transformation is not None:
            headers, body = _transform(msg, headers, body, transformation)
        headers.append(("content-length", str(len(body))))
        block = header_block(headers, version)
        if not temporary:  # a temporary destination's name depends on the connection
            self._last = (original, version, block, body)
            self._last_transformation = transformation
        return block, body

    def close(self) -> None:
        for conn in list(self.connections):
            conn.error("server shutting down")


class StompProtocol(BatchedProtocol):
    """One TCP (or TLS) connection."""

    protocol_name = "stomp"

    server: StompServer
    conn: StompConnection | None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        address = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.conn = StompConnection(
            self.server, self.write, self.close, address,
            pause_reading=transport.pause_reading,  # type: ignore[attr-defined]
            resume_reading=self._resume_reading,
        )
        self.watch(self.server.broker, transport, address)
        self.server.connections.add(self.conn)

    def _resume_reading(self) -> None:
        t = self.transport
        if t is not None and not t.is_closing():
            t.resume_reading()


def _transform(msg: Message, headers: list[tuple[str, str]], body: bytes, transformation: str
               ) -> tuple[list[tuple[str, str]], bytes]:
    """A subscription's ``transformation`` (ActiveMQ's STOMP page, "Message transformation"):
    a map or stream body in ActiveMQ's XML or JSON form, marked with the transformation and
    with no content type, as ActiveMQ sends it; with ``jms-byte`` a text body goes as bytes
    (no ``content-type``: a client reads it by its ``content-length``)."""
    kind = msg.body_kind
    if transformation == BYTES_TRANSFORMATION:
        if kind is BodyKind.TEXT:
            headers = [h for h in headers
                       if h[0] != "content-type" or h[1] != TEXT_CONTENT_TYPE]
        return headers, body
    done = transformed_body(kind, msg.body, transformation)
    if done is None:
        return headers, body
    kept = [h for h in headers if h[0] != "content-type" and h[0] != "transformation"]
    kept.insert(1, ("transformation", done[1]))
    return kept, done[0]


def header_block(headers: list[tuple[str, str]], version: str) -> bytes:
    """Header lines escaped for ``version`` and the blank line that ends them.

    1.1 and 1.2 escape the whole block at once: names and values are joined with two
    control characters as stand-ins for ``:`` and the line feed, the block is escaped with a
    few ``str.replace`` passes, and the stand-ins are put back (a header holding one of them
    is escaped one by one instead). STOMP 1.0 has no escaping: a header whose value holds a
    line break (or whose name holds a colon) cannot be written, and is left out; 1.1 has no
    escape for a carriage return, and a header holding one is left out too.
    """
    if version == "1.0":
        lines = [n + ":" + v for n, v in headers if _plain_10(n, v)]
        return ("\n".join(lines) + "\n\n").encode("utf-8", "surrogatepass")
    text = "\x01".join([n + "\x02" + v for n, v in headers])
    if "\r" in text and version == "1.1":
        headers = [(n, v) for n, v in headers if "\r" not in n and "\r" not in v]
        text = "\x01".join([n + "\x02" + v for n, v in headers])
    if text.count("\x01") != len(headers) - 1 or text.count("\x02") != len(headers):
        text = "\n".join([escape(n, version) + ":" + escape(v, version) for n, v in headers])
    else:
        if "\\" in text:
            text = text.replace("\\", "\\\\")
        if ":" in text:
            text = text.replace(":", "\\c")
        if "\n" in text:
            text = text.replace("\n", "\\n")
        if "\r" in text:
            text = text.replace("\r", "\\r")
        text = text.replace("\x02", ":").replace("\x01", "\n")
    return (text + "\n\n").encode("utf-8", "surrogatepass")


def _plain_10(name: str, value: str) -> bool:
    return not ("\n" in value or "\r" in value or "\n" in name or "\r" in name or ":" in name)


def shared_server(broker: Core) -> StompServer:
    """One StompServer per broker, shared by the TCP, TLS and WebSocket listeners."""
    server: StompServer | None = broker.adapter_servers.get("stomp")
    if server is None:
        from adapters.stomp import websocket

        server = StompServer(broker)
        broker.adapter_servers["stomp"] = server
        websocket.register(broker, server)
    return server


async def start(broker: Core, spec: Any) -> Listener:
    """Registry entry: listen for STOMP (``stomp://``) or STOMP over TLS (``stomps://``)."""
    server = shared_server(broker)
    log_deliveries(broker)  # the delivery log names the out rules this adapter runs
    return await listen(broker, spec, server, lambda: StompProtocol(server), "stomps")
