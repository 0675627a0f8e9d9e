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

Slow consumers. Every adapter connection (TCP, TLS and WebSocket, every protocol) stops
taking deliveries when more than :data:`WRITE_HIGH_WATER` bytes wait to be sent to its peer
and takes them again below :data:`WRITE_LOW_WATER`: the shell calls the connection's
``pause_writing`` / ``resume_writing``, which pause its core consumers. Undelivered messages
then wait in the core's queues and subscriptions, where ``maxmsgs`` / ``maxbytes`` /
``max_msg_memory`` and the overflow policies act on them -- nothing grows without bound
outside the core; the core also learns which connections are slow
(``Broker.connection_slow``), and at ``max_msg_memory`` drops their non-durable topic
subscriptions' pending non-persistent messages before it holds or refuses a producer. A
connection's buffer holds at most the high-water mark plus what one
read batch wrote to it. :class:`WriteFlow` is that state for one connection: the admin
views read it, and each change is a log line and, when someone subscribes to it, a map
message on ``$sys.monitor.client.slowconsumer`` (the counterpart of RV's
``CLIENT.SLOWCONSUMER`` advisory).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from gateway.config.gateway_conf import listen_backlog
from gateway.facade import Core
from gateway.tls import server_context

log = logging.getLogger("adapters")

# Bytes waiting to be sent to one peer before its deliveries pause, and below which they
# resume. 1 MiB holds about a thousand 1 KB messages: enough to keep a fast reader busy
# between two loop turns, small beside max_msg_memory. asyncio's own default low-water
# mark is a quarter of the high one; we keep that ratio.
WRITE_HIGH_WATER = 1 << 20
WRITE_LOW_WATER = WRITE_HIGH_WATER // 4
SLOW_CONSUMER_TOPIC = "$sys.monitor.client.slowconsumer"


class WriteFlow:
    """One connection's write-buffer state: buffered bytes, slow or not, since when.

    ``buffered`` returns the bytes not yet handed to the socket; ``conn`` is the adapter's
    connection object (its ``core_id()`` and ``client_id()`` name it in notices).
    """

    __slots__ = ("broker", "protocol", "address", "buffered", "conn", "slow", "since",
                 "episodes", "close")

    def __init__(self, broker: Core, protocol: str, address: str,
                 buffered: Callable[[], int]) -> None:
        self.broker = broker
        self.protocol = protocol
        self.address = address
        self.buffered = buffered
        self.conn: Any = None
        self.slow = False
        self.since = 0.0
        self.episodes = 0  # times it became slow
        # Closes the connection (the admin API's ``delete connection``); set by its socket.
        self.close: Callable[[], None] | None = None

    def became_slow(self) -> None:
        """The buffer passed the high-water mark: deliveries to this peer pause."""
        if self.slow:
            return
        self.slow = True
        self.since = time.monotonic()
        self.episodes += 1
        conn = self.conn
        if conn is not None:
            self.broker.connection_slow(conn.core_id(), True)
        self._notice("slow", 0.0)

    def recovered(self) -> None:
        """The buffer drained below the low-water mark: deliveries resume."""
        if not self.slow:
            return
        self.slow = False
        conn = self.conn
        if conn is not None:
            self.broker.connection_slow(conn.core_id(), False)
        self._notice("recovered", time.monotonic() - self.since)

    def closed(self) -> None:
        """The connection ended; if it was slow, that episode ends with it."""
        if self.slow:
            self.slow = False
            conn = self.conn
            if conn is not None:
                self.broker.connection_slow(conn.core_id(), False)
            self._notice("closed", time.monotonic() - self.since)

    def _notice(self, event: str, seconds: float) -> None:
        conn = self.conn
        client_id = conn.client_id() if conn is not None else None
        core_id = conn.core_id() if conn is not None else None
        buffered = self.buffered()
        if event == "slow":
            log.info("%s %s (client id %s): slow consumer, %d bytes unsent; deliveries to it "
                     "paused", self.protocol, self.address, client_id, buffered)
        elif event == "recovered":
            log.info("%s %s (client id %s): slow consumer recovered after %.1f s; deliveries "
                     "resume", self.protocol, self.address, client_id, seconds)
        else:
            log.info("%s %s (client id %s): slow consumer closed after %.1f s, %d bytes unsent",
                     self.protocol, self.address, client_id, seconds, buffered)
        body = {"event": event, "protocol": self.protocol, "address": self.address,
                "client_id": client_id or "", "connection": core_id or "",
                "buffered": buffered, "seconds": round(seconds, 3)}
        # Not from inside the write that noticed it: on the next loop turn.
        self.broker.loop.call_soon(self.broker.publish_monitor, SLOW_CONSUMER_TOPIC, body)

    def row(self) -> dict[str, Any]:
        """The admin view of this connection's output."""
        conn = self.conn
        return {
            "connection": conn.core_id() if conn is not None else None,
            "client_id": conn.client_id() if conn is not None else None,
            "protocol": self.protocol,
            "address": self.address,
            "buffered": self.buffered(),
            "slow": self.slow,
            "slow_seconds": round(time.monotonic() - self.since, 3) if self.slow else 0,
            "slow_episodes": self.episodes,
        }


class LogLimiter:
    """At most one log line per ``every`` seconds for an event that can repeat per message
    (a publish refused at ``max_msg_memory``, a pre-settled message dropped): a producer
    flooding a full gateway must not flood its log too. :meth:`allow` says whether to write
    now and how many were left unwritten since the last line, for that line to say so."""

    __slots__ = ("every", "next_at", "skipped")

    def __init__(self, every: float = 10.0) -> None:
        self.every = every
        self.next_at = 0.0
        self.skipped = 0

    def allow(self) -> int | None:
        """None: do not log this one (it is counted); else log it, adding the count returned
        (those left out since the last line) when it is not 0."""
        now = time.monotonic()
        if now < self.next_at:
            self.skipped += 1
            return None
        self.next_at = now + self.every
        skipped, self.skipped = self.skipped, 0
        return skipped


def skipped_text(skipped: int) -> str:
    """The tail of a rate-limited log line: how many like it were not written."""
    return f" ({skipped} more since the last such line)" if skipped else ""


class AdapterServer(Protocol):
    def close(self) -> None: ...


class BatchingServer(Protocol):
    """What :class:`BatchedProtocol` needs of its adapter's shared server state."""

    loop: asyncio.AbstractEventLoop
    reading: bool  # a read is being processed
    dirty: list[Any]  # protocols written to during it
    connections: set[Any]


class FlowProtocol(asyncio.Protocol):
    """What every adapter's socket protocol does with the transport's water marks: pause or
    resume ``self.conn``'s deliveries and tell its :class:`WriteFlow`."""

    conn: Any
    flow: WriteFlow | None

    def pause_writing(self) -> None:
        if self.conn is not None:
            self.conn.pause_writing()
        if self.flow is not None:
            self.flow.became_slow()

    def resume_writing(self) -> None:
        if self.conn is not None:
            self.conn.resume_writing()
        if self.flow is not None:
            self.flow.recovered()


class BatchedProtocol(FlowProtocol):
    """One connection's socket; subclasses make ``self.conn`` in ``connection_made`` and
    call :meth:`watch` with it. The connection object has ``pause_writing`` /
    ``resume_writing`` (stop and resume its deliveries), ``core_id()`` and ``client_id()``."""

    protocol_name = "?"

    def __init__(self, server: BatchingServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.conn: Any = None
        self.out: list[bytes] = []
        self.flush_scheduled = False
        self.flow: WriteFlow | None = None

    def watch(self, broker: Core, transport: asyncio.BaseTransport, address: str) -> None:
        """Set the water marks on ``transport`` and give ``self.conn`` its :class:`WriteFlow`."""
        transport.set_write_buffer_limits(  # type: ignore[attr-defined]
            high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        self.flow = WriteFlow(broker, self.protocol_name, address, self.buffered)
        self.flow.close = self.close
        self.flow.conn = self.conn
        self.conn.flow = self.flow

    def buffered(self) -> int:
        """Bytes not yet sent to the peer: the socket's buffer and this turn's output."""
        t = self.transport
        n = t.get_write_buffer_size() if t is not None and not t.is_closing() else 0
        for b in self.out:
            n += len(b)
        return n

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
        if self.flow is not None:
            self.flow.closed()
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


async def listen(broker: Core, spec: Any, server: AdapterServer,
                 protocol: Callable[[], asyncio.BaseProtocol], tls_scheme: str) -> Listener:
    """Listen on ``spec``'s host and port; TLS with the gateway's certificate when the
    listener's scheme is ``tls_scheme`` (``mqtts``, ``amqps``, ...). The accept queue is
    ``listen_backlog`` long (the system's maximum by default), not asyncio's 100: a burst of
    devices connecting at once waits there rather than in TCP's SYN retries (a second each,
    then more). A node of a cluster listens with ``SO_REUSEPORT``: several nodes on one
    machine share the port, and the kernel spreads the connections among them."""
    ctx = server_context(broker, tls_scheme) if spec.scheme == tls_scheme else None
    gw = broker.config.gateway
    tcp = await broker.loop.create_server(protocol, spec.host or None, spec.port, ssl=ctx,
                                          backlog=listen_backlog(gw),
                                          reuse_port=bool(gw.cluster) or None)
    return Listener(server, tcp)
