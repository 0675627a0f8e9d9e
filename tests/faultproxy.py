"""A small TCP fault proxy that speaks the part of toxiproxy's HTTP API our fault tests use.

Why it exists: the transports' fault tests cut, delay and reset the link between the gateway
and an external broker mid-stream, driven with toxiproxy-python. The real toxiproxy server
(Shopify/toxiproxy, written in Go) is not packaged for Debian and cannot be downloaded in every
build environment, so this module stands in for it. When a ``toxiproxy-server`` binary is on
PATH the ``toxiproxy`` fixture starts that instead (set ``FAULTPROXY_IMPL=python`` to force this
one); the tests talk to either through the same client.

How it works: one asyncio loop (a background thread for ``FaultProxyServer``, the main thread
for ``python tests/faultproxy.py --port N``) runs an aiohttp app for the API and every proxy.
A proxy is a listener on a loopback port; each accepted client gets its own connection to the
upstream. A connection has two directions, named as toxiproxy names them: *upstream* (client to
server) and *downstream* (server to client). In each direction a reader task timestamps the
chunks it reads into a bounded queue (full queue = we stop reading = TCP backpressure) and a
pump task passes each chunk through that direction's toxic chain, in the order the toxics were
added, then writes and drains it. A toxic's per-connection state is created when the toxic is
added (or when the connection starts), so toxics act on live connections as well as new ones;
removing it stops its timers and ends any sleep it is in, and the chunk moves on.

API subset (toxiproxy 2.x shapes; errors are ``{"error": ..., "status": ...}`` with 400 for a
bad body or toxic, 404 for an unknown proxy or toxic, 409 for a duplicate name, 500 when a
listener cannot bind):

    GET    /version                          plain-text version
    POST   /reset                            enable every proxy, remove every toxic (204)
    GET    /proxies                          {name: proxy}
    POST   /proxies                          create {name, upstream, listen?, enabled?} (201)
    POST   /populate                         create or replace a list of proxies (201)
    GET    /proxies/{proxy}                  proxy
    POST   /proxies/{proxy}                  update {listen?, upstream?, enabled?} (PATCH too)
    DELETE /proxies/{proxy}                  close it (204)
    GET    /proxies/{proxy}/toxics           [toxic]
    POST   /proxies/{proxy}/toxics           add {name?, type, stream?, toxicity?, attributes}
    GET    /proxies/{proxy}/toxics/{toxic}   toxic
    POST   /proxies/{proxy}/toxics/{toxic}   update toxicity / attributes (PATCH too)
    DELETE /proxies/{proxy}/toxics/{toxic}   remove it (204)

A proxy is ``{name, listen, upstream, enabled, toxics}``; ``listen`` ``"127.0.0.1:0"`` binds a
free port and reports it, and re-enabling listens on that same port again. Disabling closes the
listener and every live connection. A toxic is ``{name, type, stream, toxicity, attributes}``;
the name defaults to ``<type>_<stream>``, the stream to downstream, toxicity to 1.0 (drawn once
per connection, as toxiproxy does). Toxics (attributes in ms unless said):

    latency     latency, jitter   delay every chunk by latency +- jitter
    bandwidth   rate (KB/s)       pace the data; big chunks go out in 100 ms slices
    slow_close  delay             hold the FIN back for delay
    timeout     timeout           drop all data (and hold the FIN); close both sides after
                                  timeout, or never when 0 (blackhole until removed)
    reset_peer  timeout           drop all data; after timeout reset the side this stream writes
                                  to (SO_LINGER 0 then close: an RST) and close the other
    limit_data  bytes             pass that many bytes, then close both sides
    slicer      average_size, size_variation (bytes), delay (microseconds)
                                  cut chunks into small pieces with a pause between them

Known differences from toxiproxy: several latency toxics add up; reset_peer counts its timeout
from when it is added (toxiproxy restarts it on the first chunk it swallows); updating a toxic
rebuilds its per-connection state (a limit_data count starts again); a half-close is passed
on as a half-close; no metrics or events endpoints, no TLS. An empty listen host means
127.0.0.1, not every interface.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from aiohttp import web

VERSION = "2.5.0-faultproxy"  # the toxiproxy API generation this follows
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8474  # toxiproxy's default API port
READ_SIZE = 32 * 1024  # toxiproxy's link buffer size
QUEUE_CHUNKS = 32  # chunks buffered per direction before we stop reading the source
STREAMS = ("upstream", "downstream")
BANDWIDTH_SLICE_S = 0.1  # toxiproxy's bandwidth toxic sends big chunks in 100 ms slices

# toxic type -> its attributes with toxiproxy's defaults
TOXIC_ATTRIBUTES: dict[str, dict[str, int]] = {
    "latency": {"latency": 0, "jitter": 0},
    "bandwidth": {"rate": 0},
    "slow_close": {"delay": 0},
    "timeout": {"timeout": 0},
    "reset_peer": {"timeout": 0},
    "limit_data": {"bytes": 0},
    "slicer": {"average_size": 0, "size_variation": 0, "delay": 0},
}


class ApiError(Exception):
    """An API failure, answered as toxiproxy answers it: ``{"error", "status"}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[::1]:port"`` -> (host, port); an empty host means 127.0.0.1."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ApiError(400, f"invalid address {address!r}: expected host:port")
    host = host.strip("[]") or DEFAULT_HOST
    return host, int(port)


def join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# --- toxics ----------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class Toxic:
    """A toxic as the API sees it; per-connection behaviour lives in ``ToxicState``."""

    name: str
    type: str
    stream: str
    toxicity: float
    attributes: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, body: Any, old: Toxic | None = None) -> Toxic:
        """Validate a create (``old`` None) or update body; updates keep name, type, stream."""
        if not isinstance(body, dict):
            raise ApiError(400, "bad request body: expected a JSON object")
        type_ = old.type if old else body.get("type")
        if type_ not in TOXIC_ATTRIBUTES:
            raise ApiError(400, f"invalid toxic type: {type_!r}")
        stream = old.stream if old else body.get("stream") or "downstream"
        if stream not in STREAMS:
            raise ApiError(400, "stream was invalid, can be either upstream or downstream")
        name = old.name if old else body.get("name") or f"{type_}_{stream}"
        if not isinstance(name, str):
            raise ApiError(400, "toxic name must be a string")
        toxicity = body.get("toxicity", old.toxicity if old else 1.0)
        if (
            isinstance(toxicity, bool)
            or not isinstance(toxicity, int | float)
            or not 0 <= toxicity <= 1
        ):
            raise ApiError(400, "toxicity must be a number between 0 and 1")
        attributes = dict(old.attributes if old else TOXIC_ATTRIBUTES[type_])
        given = body.get("attributes") or {}
        if not isinstance(given, dict):
            raise ApiError(400, "attributes must be a JSON object")
        for key, value in given.items():
            if key not in attributes:
                continue  # toxiproxy's JSON decoding ignores unknown fields too
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ApiError(400, f"attribute {key} must be a non-negative integer")
            attributes[key] = int(value)
        return cls(name, type_, stream, float(toxicity), attributes)


class Chunk:
    __slots__ = ("data", "ts")

    def __init__(self, data: bytes, ts: float) -> None:
        self.data = data
        self.ts = ts  # loop time the data was read (latency counts from here)


Emit = Callable[[Chunk], Awaitable[None]]


class ToxicState:
    """One toxic on one direction of one connection. The base class passes data through:
    it is what a connection gets when the toxicity draw says the toxic does not apply."""

    __slots__ = ("toxic", "conn", "gone", "timer")

    def __init__(self, toxic: Toxic, conn: Connection) -> None:
        self.toxic = toxic
        self.conn = conn
        self.gone = asyncio.Event()  # set when the toxic is removed from this connection
        self.timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Called on the loop when the toxic is attached (toxic added or connection opened)."""

    def stop(self) -> None:
        self.gone.set()
        if self.timer is not None:
            self.timer.cancel()

    async def feed(self, chunk: Chunk, emit: Emit) -> None:
        if self.gone.is_set():  # removed while the chunk was further up the chain
            await emit(chunk)
        else:
            await self.pipe(chunk, emit)

    async def pipe(self, chunk: Chunk, emit: Emit) -> None:
        await emit(chunk)

    async def at_eof(self) -> None:
        """Called before the end of this direction's stream is passed on (a FIN)."""

    async def sleep(self, seconds: float) -> None:
        """Sleep, but wake up at once if the toxic is removed."""
        if seconds > 0 and not self.gone.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.gone.wait(), seconds)


class LatencyState(ToxicState):
    __slots__ = ()

    async def pipe(self, chunk: Chunk, emit: Emit) -> None:
        delay = self.toxic.attributes["latency"]
        jitter = self.toxic.attributes["jitter"]
        if jitter:
            delay += random.randint(-jitter, jitter)
        target = chunk.ts + delay / 1000
        await self.sleep(target - asyncio.get_running_loop().time())
        chunk.ts = target  # a second latency toxic adds on
        await emit(chunk)


class BandwidthState(ToxicState):
    __slots__ = ("next_free",)

    def __init__(self, toxic: Toxic, conn: Connection) -> None:
        super().__init__(toxic, conn)
        self.next_free = 0.0

    async def pipe(self, chunk: Chunk, emit: Emit) -> None:
        rate = self.toxic.attributes["rate"]  # KB/s, KB = 1000 bytes as in toxiproxy
        if rate <= 0:
            await emit(chunk)
            return
        loop = asyncio.get_running_loop()
        step = max(1, int(rate * 1000 * BANDWIDTH_SLICE_S))
        data = chunk.data
        for offset in range(0, len(data), step):
            piece = data[offset : offset + step]
            now = loop.time()
            self.next_free = max(self.next_free, now) + len(piece) / (rate * 1000)
            await self.sleep(self.next_free - now)
            await emit(Chunk(piece, chunk.ts))


class SlowCloseState(ToxicState):
    __slots__ = ()

    async def at_eof(self) -> None:
        await self.sleep(self.toxic.attributes["delay"] / 1000)


class TimeoutState(ToxicState):
    __slots__ = ()

    def start(self) -> None:
        timeout = self.toxic.attributes["timeout"]
        if timeout > 0:
            loop = asyncio.get_running_loop()
            self.timer = loop.call_later(timeout / 1000, self.conn.close)

    async def pipe(self, chunk: Chunk, emit: Emit) -> None:
        """Drop the data (toxiproxy's README: dropped until the toxic is removed)."""

    async def at_eof(self) -> None:
        await self.gone.wait()  # a blackhole swallows the FIN as well


class ResetPeerState(ToxicState):
    __slots__ = ()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        delay = self.toxic.attributes["timeout"] / 1000
        self.timer = loop.call_later(delay, self.conn.close, self.toxic.stream)

    async def pipe(self, chunk: Chunk, emit: Emit) -> None:
        """Swallow data until the reset, as toxiproxy's reset_peer does."""

    async def at_eof(self) -> None:
        await self.gone.wait()


class LimitDataState(ToxicState):
    __slots__ = ("sent",)

    def __init__(self, toxic: Toxic, conn: Connection) -> None:
        super().__init__(toxic, conn)
        self.sent = 0

    async def pipe(self, chunk: Chunk, emit: Emit) -> None:
        limit = self.toxic.attributes["bytes"]
        remaining = limit - self.sent
        if remaining > 0:
            if len(chunk.data) > remaining:
                chunk.data = chunk.data[:remaining]
            self.sent += len(chunk.data)
            await emit(chunk)
        if self.sent >= limit:
            self.conn.close()


class SlicerState(ToxicState):
    __slots__ = ()

    async def pipe(self, chunk: Chunk, emit: Emit) -> None:
        average = self.toxic.attributes["average_size"]
        variation = min(self.toxic.attributes["size_variation"], max(average - 1, 0))
        pause = self.toxic.attributes["delay"] / 1_000_000  # microseconds, as in toxiproxy
        if average <= 0:
            await emit(chunk)
            return
        data = chunk.data
        offset = 0
        while offset < len(data):
            size = average + (random.randint(-variation, variation) if variation else 0)
            await emit(Chunk(data[offset : offset + size], chunk.ts))
            offset += size
            if offset < len(data):
                await self.sleep(pause)


TOXIC_STATES: dict[str, type[ToxicState]] = {
    "latency": LatencyState,
    "bandwidth": BandwidthState,
    "slow_close": SlowCloseState,
    "timeout": TimeoutState,
    "reset_peer": ResetPeerState,
    "limit_data": LimitDataState,
    "slicer": SlicerState,
}


# --- connections and proxies -----------------------------------------------------------------


def _abort_with_reset(writer: asyncio.StreamWriter) -> None:
    """Close with SO_LINGER 0, so the kernel sends an RST instead of a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class Connection:
    """A client connection and its upstream connection. Runs on the proxy loop."""

    def __init__(
        self,
        proxy: Proxy,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        server: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self.proxy = proxy
        self.readers = {"upstream": client[0], "downstream": server[0]}
        self.writers = {"upstream": server[1], "downstream": client[1]}
        self.chains: dict[str, list[ToxicState]] = {stream: [] for stream in STREAMS}
        self.tasks: list[asyncio.Task[None]] = []
        self.finished = 0  # directions that have passed on their EOF
        self.closed = False

    def start(self) -> None:
        for toxic in self.proxy.toxics.values():
            self.add_toxic(toxic)
        for stream in STREAMS:
            queue: asyncio.Queue[Chunk | None] = asyncio.Queue(QUEUE_CHUNKS)
            self.tasks.append(asyncio.ensure_future(self._read(stream, queue)))
            self.tasks.append(asyncio.ensure_future(self._pump(stream, queue)))

    def add_toxic(self, toxic: Toxic, index: int | None = None) -> None:
        applies = random.random() < toxic.toxicity
        state = (TOXIC_STATES[toxic.type] if applies else ToxicState)(toxic, self)
        chain = self.chains[toxic.stream]
        chain.insert(len(chain) if index is None else index, state)
        state.start()

    def remove_toxic(self, name: str) -> int | None:
        for chain in self.chains.values():
            for index, state in enumerate(chain):
                if state.toxic.name == name:
                    del chain[index]
                    state.stop()
                    return index
        return None

    def replace_toxic(self, toxic: Toxic) -> None:
        self.add_toxic(toxic, self.remove_toxic(toxic.name))

    async def _read(self, stream: str, queue: asyncio.Queue[Chunk | None]) -> None:
        reader = self.readers[stream]
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await reader.read(READ_SIZE)
                if not data:
                    break
                await queue.put(Chunk(data, loop.time()))
        except OSError:
            self.close()
            return
        await queue.put(None)

    async def _pump(self, stream: str, queue: asyncio.Queue[Chunk | None]) -> None:
        writer = self.writers[stream]
        try:
            while (chunk := await queue.get()) is not None:
                await self._through(tuple(self.chains[stream]), 0, chunk, writer)
            for state in tuple(self.chains[stream]):
                if not state.gone.is_set():
                    await state.at_eof()
            if writer.can_write_eof():
                writer.write_eof()  # pass the half-close on
        except OSError:
            self.close()
            return
        self.finished += 1
        if self.finished == len(STREAMS):
            self.close()

    async def _through(
        self, chain: tuple[ToxicState, ...], index: int, chunk: Chunk, writer: asyncio.StreamWriter
    ) -> None:
        if index == len(chain):
            writer.write(chunk.data)
            await writer.drain()
            return

        async def emit(out: Chunk) -> None:
            await self._through(chain, index + 1, out, writer)

        await chain[index].feed(chunk, emit)

    def close(self, reset_stream: str | None = None) -> None:
        """Close both sides; ``reset_stream`` names the direction whose output gets an RST."""
        if self.closed:
            return
        self.closed = True
        self.proxy.conns.discard(self)
        for chain in self.chains.values():
            for state in chain:
                state.stop()
            chain.clear()
        for stream, writer in self.writers.items():
            if stream == reset_stream:
                _abort_with_reset(writer)
            else:
                writer.close()
        for task in self.tasks:
            task.cancel()  # the current task too: it stops at its next await


class Proxy:
    """One named proxy: a listener, its upstream address, its toxics and live connections."""

    def __init__(self, name: str, listen: str, upstream: str) -> None:
        self.name = name
        self.host, self.port = split_address(listen)
        split_address(upstream)  # validate
        self.upstream = upstream
        self.toxics: dict[str, Toxic] = {}
        self.conns: set[Connection] = set()
        self.server: asyncio.Server | None = None
        self.generation = 0  # bumped on disable: accepts still connecting then are dropped

    @property
    def enabled(self) -> bool:
        return self.server is not None

    @property
    def listen(self) -> str:
        return join_address(self.host, self.port)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            "toxics": [toxic.to_json() for toxic in self.toxics.values()],
        }

    async def enable(self) -> None:
        if self.server is not None:
            return
        try:
            self.server = await asyncio.start_server(self._accept, self.host, self.port)
        except OSError as exc:
            raise ApiError(500, f"listen tcp {self.listen}: {exc.strerror or exc}") from exc
        self.port = self.server.sockets[0].getsockname()[1]  # ":0" -> the port we got

    async def disable(self) -> None:
        self.generation += 1
        server, self.server = self.server, None
        if server is not None:
            server.close()
        for conn in list(self.conns):
            conn.close()
        if server is not None:
            await server.wait_closed()

    def add_toxic(self, toxic: Toxic) -> None:
        if toxic.name in self.toxics:
            raise ApiError(409, "toxic already exists")
        self.toxics[toxic.name] = toxic
        for conn in self.conns:
            conn.add_toxic(toxic)

    def update_toxic(self, toxic: Toxic) -> None:
        self.toxics[toxic.name] = toxic  # same key: keeps its place in the chain
        for conn in self.conns:
            conn.replace_toxic(toxic)

    def get_toxic(self, name: str) -> Toxic:
        toxic = self.toxics.get(name)
        if toxic is None:
            raise ApiError(404, "toxic not found")
        return toxic

    def remove_toxic(self, name: str) -> None:
        if self.toxics.pop(name, None) is None:
            raise ApiError(404, "toxic not found")
        for conn in self.conns:
            conn.remove_toxic(name)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        generation = self.generation
        try:
            host, port = split_address(self.upstream)
            server = await asyncio.open_connection(host, port)
        except (OSError, ApiError):
            writer.close()  # as toxiproxy: an unreachable upstream closes the client
            return
        except BaseException:
            writer.close()
            raise
        if generation != self.generation or self.server is None:
            writer.close()
            server[1].close()
            return
        conn = Connection(self, (reader, writer), server)
        self.conns.add(conn)
        conn.start()


# --- the HTTP API ----------------------------------------------------------------------------


class Collection:
    """All proxies of one API server. Every method runs on its loop."""

    def __init__(self) -> None:
        self.proxies: dict[str, Proxy] = {}

    def get(self, name: str) -> Proxy:
        proxy = self.proxies.get(name)
        if proxy is None:
            raise ApiError(404, "proxy not found")
        return proxy

    async def create(self, body: Any, replace: bool = False) -> Proxy:
        if not isinstance(body, dict):
            raise ApiError(400, "bad request body: expected a JSON object")
        name, upstream = body.get("name"), body.get("upstream")
        if not isinstance(name, str) or not name or not isinstance(upstream, str):
            raise ApiError(400, "missing required field: name and upstream")
        listen = body.get("listen") or "127.0.0.1:0"
        if not isinstance(listen, str):
            raise ApiError(400, "listen must be a string")
        old = self.proxies.get(name)
        if old is not None:
            if not replace:
                raise ApiError(409, "proxy already exists")
            if old.upstream == upstream and old.listen == listen:
                return old
            await self.delete(name)
        proxy = Proxy(name, listen, upstream)
        if body.get("enabled", True):
            await proxy.enable()
        self.proxies[name] = proxy
        return proxy

    async def update(self, name: str, body: Any) -> Proxy:
        proxy = self.get(name)
        if not isinstance(body, dict):
            raise ApiError(400, "bad request body: expected a JSON object")
        restart = False
        upstream = body.get("upstream")
        if isinstance(upstream, str) and upstream != proxy.upstream:
            split_address(upstream)
            proxy.upstream, restart = upstream, True
        listen = body.get("listen")
        if isinstance(listen, str) and split_address(listen) != (proxy.host, proxy.port):
            proxy.host, proxy.port = split_address(listen)
            restart = True
        enabled = body.get("enabled", proxy.enabled)
        if restart or not enabled:
            await proxy.disable()
        if enabled:
            await proxy.enable()
        return proxy

    async def delete(self, name: str) -> None:
        await self.get(name).disable()
        del self.proxies[name]

    async def reset(self) -> None:
        for proxy in self.proxies.values():
            for name in list(proxy.toxics):
                proxy.remove_toxic(name)
            await proxy.enable()

    async def close(self) -> None:
        for proxy in self.proxies.values():
            await proxy.disable()


async def _json_body(request: web.Request) -> Any:
    text = await request.text()
    if not text.strip():
        return {}
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ApiError(400, f"bad request body: {exc}") from exc


def make_app(proxies: Collection) -> web.Application:
    """The toxiproxy HTTP API over ``proxies``: one handler, one ``case`` per endpoint."""

    def ok(data: Any, status: int = 200) -> web.Response:
        return web.json_response(data, status=status)

    async def route(request: web.Request) -> web.Response:
        method = "POST" if request.method == "PATCH" else request.method  # toxiproxy 2.6+: PATCH
        body = await _json_body(request) if method == "POST" else None
        match method, request.path.strip("/").split("/"):
            case "GET", ["version"]:
                return web.Response(text=VERSION)
            case "POST", ["reset"]:
                await proxies.reset()
                return web.Response(status=204)
            case "GET", ["proxies"]:
                return ok({name: p.to_json() for name, p in proxies.proxies.items()})
            case "POST", ["proxies"]:
                return ok((await proxies.create(body)).to_json(), 201)
            case "POST", ["populate"]:
                if not isinstance(body, list):
                    raise ApiError(400, "bad request body: expected a JSON list of proxies")
                made = [await proxies.create(item, replace=True) for item in body]
                return ok({"proxies": [p.to_json() for p in made]}, 201)
            case "GET", ["proxies", name]:
                return ok(proxies.get(name).to_json())
            case "POST", ["proxies", name]:
                return ok((await proxies.update(name, body)).to_json())
            case "DELETE", ["proxies", name]:
                await proxies.delete(name)
                return web.Response(status=204)
            case "GET", ["proxies", name, "toxics"]:
                return ok([t.to_json() for t in proxies.get(name).toxics.values()])
            case "POST", ["proxies", name, "toxics"]:
                proxy, toxic = proxies.get(name), Toxic.from_json(body)
                proxy.add_toxic(toxic)
                return ok(toxic.to_json())
            case "GET", ["proxies", name, "toxics", toxic_name]:
                return ok(proxies.get(name).get_toxic(toxic_name).to_json())
            case "POST", ["proxies", name, "toxics", toxic_name]:
                proxy = proxies.get(name)
                toxic = Toxic.from_json(body, proxy.get_toxic(toxic_name))
                proxy.update_toxic(toxic)
                return ok(toxic.to_json())
            case "DELETE", ["proxies", name, "toxics", toxic_name]:
                proxies.get(name).remove_toxic(toxic_name)
                return web.Response(status=204)
        raise ApiError(404, f"no such endpoint: {request.method} {request.path}")

    async def handle(request: web.Request) -> web.Response:
        try:
            return await route(request)
        except ApiError as exc:
            return ok({"error": exc.message, "status": exc.status}, exc.status)

    app = web.Application()
    app.router.add_route("*", "/{path:.*}", handle)
    return app


async def serve(
    host: str,
    port: int,
    stop: asyncio.Event,
    started: Callable[[int], None] = lambda port: None,
) -> None:
    """Run the API on host:port until ``stop`` is set, then close every proxy."""
    proxies = Collection()
    runner = web.AppRunner(make_app(proxies), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        started(runner.addresses[0][1])
        await stop.wait()
    finally:
        await proxies.close()
        await runner.cleanup()
        current = asyncio.current_task()
        rest = [task for task in asyncio.all_tasks() if task is not current]
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)


class FaultProxyServer:
    """The API and its proxies on a background thread with its own event loop."""

    def __init__(self, host: str = DEFAULT_HOST, port: int = 0) -> None:
        self.host = host
        self.port = port  # the real port once started
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> FaultProxyServer:
        self._thread = threading.Thread(target=self._run, name="faultproxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fault proxy did not start within 10 s")
        if self._error is not None:
            raise RuntimeError(f"fault proxy failed to start: {self._error}") from self._error
        return self

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            await serve(self.host, self.port, self._stop, self._started)

        try:
            asyncio.run(main())
        except BaseException as exc:  # reported by start(); the thread ends quietly
            self._error = exc
        finally:
            self._ready.set()

    def _started(self, port: int) -> None:
        self.port = port
        self._ready.set()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # loop already gone
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> FaultProxyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- client side: a running server and a toxiproxy-python client connected to it -------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((DEFAULT_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_for_port(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex((DEFAULT_HOST, port)) == 0:
                return
        time.sleep(0.02)
    raise RuntimeError(f"toxiproxy-server did not listen on {DEFAULT_HOST}:{port}")


@contextlib.contextmanager
def toxiproxy_server() -> Iterator[Any]:
    """A running toxiproxy API on loopback and a ``toxiproxy.Toxiproxy`` client pointed at it.

    The real ``toxiproxy-server`` when it is on PATH (unless ``FAULTPROXY_IMPL=python``),
    otherwise ``FaultProxyServer``. toxiproxy-python keeps the API address in class attributes
    of ``APIConsumer``; they are set here and restored on exit, so one server at a time."""
    from toxiproxy.api import APIConsumer  # type: ignore[import-untyped]
    from toxiproxy.server import Toxiproxy  # type: ignore[import-untyped]

    saved = (APIConsumer.host, APIConsumer.port)
    client = Toxiproxy()
    binary = shutil.which("toxiproxy-server")
    try:
        if binary and os.environ.get("FAULTPROXY_IMPL") != "python":
            port = _free_port()
            proc = subprocess.Popen(
                [binary, "-host", DEFAULT_HOST, "-port", str(port)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                _wait_for_port(port, time.monotonic() + 10)
                client.update_api_consumer(DEFAULT_HOST, port)
                yield client
            finally:
                proc.terminate()
                proc.wait(10)
        else:
            with FaultProxyServer() as server:
                client.update_api_consumer(DEFAULT_HOST, server.port)
                yield client
    finally:
        APIConsumer.host, APIConsumer.port = saved


@pytest.fixture(name="toxiproxy")
def toxiproxy_fixture() -> Iterator[Any]:
    """Fixture ``toxiproxy``: a ``toxiproxy.Toxiproxy`` client on a fresh server.

    Use it with ``from faultproxy import toxiproxy_fixture  # noqa: F401`` in a test module and
    a ``toxiproxy`` argument (the import name differs from the argument, so ruff's F811 stays
    quiet)."""
    with toxiproxy_server() as client:
        yield client


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--host", default=DEFAULT_HOST, help="API address (default %(default)s)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="API port (%(default)s)")
    args = parser.parse_args(argv)

    def started(port: int) -> None:
        print(f"faultproxy: API on {join_address(args.host, port)}", file=sys.stderr, flush=True)

    async def run() -> None:
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):  # stop cleanly, closing every proxy
            asyncio.get_running_loop().add_signal_handler(signum, stop.set)
        await serve(args.host, args.port, stop, started)

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
