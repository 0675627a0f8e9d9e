"""Load clients for the STOMP benchmark (tests/bench/bench_stomp.py): a windowed producer and a
counting consumer, raw-socket STOMP 1.2 on asyncio (uvloop when installed), each meant to run
in a process of its own so that neither is what the benchmark measures.

How this works. Each client is an ``asyncio.Protocol`` driven by a child process's entry point
(``producer_main``, ``consumer_main``) that talks to the parent over a
``multiprocessing.Connection``: it connects (STOMP 1.2 CONNECT, heart-beats off), gets
ready, says ``("ready", info)``, and at the end ``("done", result)`` (before its DISCONNECT,
so that closing is not timed) or ``("error", why)``.

* The producer pre-encodes one SEND frame (``destination``, ``content-length``,
  ``persistent`` unless told to leave it out, a body of ``PAYLOAD_SIZE`` bytes) and, per batch of ``batch`` messages,
  writes ``batch - 1`` copies and one copy with a ``receipt`` header in a single write. At
  most ``window`` receipts are outstanding: the next batch waits for a RECEIPT, like a
  windowed publisher, so the broker's buffers (and ours) stay bounded. It starts on the
  parent's ``"go"``; the clock starts just before its first write.
* The consumer SUBSCRIBEs (with a receipt: the subscription is in place before the parent
  lets the producer go) and counts MESSAGE frames. The benchmark's bodies hold no NUL, so in
  ``auto`` mode a chunk's frame count is its NUL count, and its count of
  ``PAYLOAD + NUL`` (checked across chunk boundaries with a carry of the previous chunk's
  last ``PAYLOAD_SIZE`` bytes) must equal it: every message arrived whole. In
  ``client-individual`` mode it also splits the frames at their NULs and acknowledges each
  message with its ``ack`` header (STOMP 1.2); in ``client`` mode it acknowledges every
  ``ack_every``-th message and the last one (cumulative). All of a chunk's ACK frames go out
  in one write. The clock stops at the chunk that completes the count.
* An ERROR frame, a closed connection or no progress for ``stall`` seconds ends a client
  with ``("error", why)``.

Times are ``time.monotonic()`` (CLOCK_MONOTONIC, one clock for every process of the
machine), CPU times ``os.times()`` user + system of the client process, taken at the edges of
its timed window.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from multiprocessing.connection import Connection
from typing import Any, TypeVar, cast

PAYLOAD_SIZE = 64
# No NUL in it (frames are counted by their NULs) and not all one byte, so that a shifted or
# truncated body does not match.
PAYLOAD = (b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ+/" * 2)[:PAYLOAD_SIZE]
BODY_MARK = PAYLOAD + b"\x00"
CONNECT_TIMEOUT = 30.0

C = TypeVar("C", bound="_Client")


def connect_frame(vhost: str, login: str | None = None, passcode: str | None = None) -> bytes:
    """CONNECT (STOMP 1.2 "Connecting"): version 1.2, heart-beats off, ``host`` = ``vhost``
    (RabbitMQ takes it as the virtual host)."""
    frame = b"CONNECT\naccept-version:1.2\nhost:%s\nheart-beat:0,0\n" % vhost.encode()
    if login is not None:
        frame += b"login:%s\npasscode:%s\n" % (login.encode(), (passcode or "").encode())
    return frame + b"\n\x00"


def send_frame(destination: str, persistent: bool | None, receipt: str | None = None) -> bytes:
    """SEND (STOMP 1.2 "SEND") of the benchmark's payload; ``persistent`` None sends no
    ``persistent`` header (the broker's default)."""
    frame = b"SEND\ndestination:%s\ncontent-length:%d\n" % (destination.encode(), PAYLOAD_SIZE)
    if persistent is not None:
        frame += b"persistent:true\n" if persistent else b"persistent:false\n"
    if receipt is not None:
        frame += b"receipt:%s\n" % receipt.encode()
    return frame + b"\n" + PAYLOAD + b"\x00"


def subscribe_frame(destination: str, ack: str, prefetch: int) -> bytes:
    """SUBSCRIBE (STOMP 1.2 "SUBSCRIBE") with a receipt; the prefetch is asked for in both
    dialects: ActiveMQ's ``activemq.prefetchSize`` and RabbitMQ's ``prefetch-count``."""
    return (
        b"SUBSCRIBE\nid:0\ndestination:%s\nack:%s\nactivemq.prefetchSize:%d\n"
        b"prefetch-count:%d\nreceipt:sub-0\n\n\x00"
        % (destination.encode(), ack.encode(), prefetch, prefetch)
    )


class ClientError(Exception):
    """The broker sent an ERROR frame, closed the connection, or stalled."""


class _Client(asyncio.Protocol):
    """What both clients share: the handshake (CONNECTED, then the optional RECEIPT of a
    setup frame) before ``ready``, and the error and stall checks."""

    def __init__(self, loop: asyncio.AbstractEventLoop, stall: float) -> None:
        self.loop = loop
        self.stall = stall
        self.transport: asyncio.Transport | None = None
        self.setup = b""  # frames of the handshake, up to the setup's RECEIPT
        self.setup_frames = 0  # how many setup frames (CONNECTED, RECEIPT) to wait for
        self.ready: asyncio.Future[None] = loop.create_future()
        self.finished: asyncio.Future[None] = loop.create_future()
        self.waiter: asyncio.Future[None] | None = None  # woken by the next chunk
        self.closing: asyncio.Future[None] | None = None  # set once DISCONNECT is sent
        self.closing_seen = b""
        self.progress_at = time.monotonic()
        self.tail = b""  # the last bytes received, for error messages

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closing is None:
            self.fail(f"connection closed ({exc!r}); last bytes {self.tail[-300:]!r}")

    def fail(self, why: str) -> None:
        for fut in (self.ready, self.finished, self.waiter):
            if fut is not None and not fut.done():
                fut.set_exception(ClientError(why))

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def handshake(self, data: bytes) -> bytes:
        """Consume the setup frames; return what follows them."""
        self.setup += data
        if self.setup.count(b"\x00") < self.setup_frames:
            return b""
        frames = self.setup.split(b"\x00")
        for frame in frames[: self.setup_frames]:
            frame = frame.lstrip(b"\r\n")
            if not frame.startswith((b"CONNECTED\n", b"RECEIPT\n")):
                self.fail(f"handshake: {frame[:500]!r}")
                return b""
        self.ready.set_result(None)
        return b"\x00".join(frames[self.setup_frames :])

    def closing_data(self, data: bytes) -> None:
        """What arrives after DISCONNECT: only its RECEIPT matters."""
        assert self.closing is not None
        self.closing_seen = (self.closing_seen + data)[-1000:]
        if b"receipt-id:bye" in self.closing_seen and not self.closing.done():
            self.closing.set_result(None)

    def check_error(self, data: bytes) -> bool:
        if b"ERROR\n" in data:
            self.fail(f"ERROR frame: {data[data.find(b'ERROR'):][:500]!r}")
            return True
        return False

    async def watch(self) -> None:
        """Fail when nothing happened for ``stall`` seconds."""
        while not self.finished.done():
            await asyncio.sleep(min(1.0, self.stall / 4))
            idle = time.monotonic() - self.progress_at
            if idle > self.stall:
                self.fail(f"stalled: nothing for {idle:.0f} s ({self.stalled_state()})")

    def stalled_state(self) -> str:
        return ""


class Producer(_Client):
    def __init__(self, loop: asyncio.AbstractEventLoop, stall: float) -> None:
        super().__init__(loop, stall)
        self.setup_frames = 1
        self.receipts = 0

    def data_received(self, data: bytes) -> None:
        if self.closing is not None:
            self.closing_data(data)
            return
        self.tail = (self.tail + data)[-1000:]
        if not self.ready.done():
            data = self.handshake(data)
            if not data:
                return
        if self.check_error(data):
            return
        # Nothing but RECEIPTs comes now, each ending with a NUL.
        self.receipts += data.count(b"\x00")
        self.progress_at = time.monotonic()
        self.wake()

    async def wait_receipts(self, upto: int) -> None:
        """Until ``upto`` RECEIPTs have come; ClientError when the client fails first."""
        while self.receipts < upto:
            if self.finished.done():
                self.finished.result()  # raises the failure
            self.waiter = self.loop.create_future()
            await self.waiter

    def stalled_state(self) -> str:
        return f"{self.receipts} receipts"


class Consumer(_Client):
    def __init__(
        self, loop: asyncio.AbstractEventLoop, stall: float, count: int, ack: str, ack_every: int
    ) -> None:
        super().__init__(loop, stall)
        self.setup_frames = 2  # CONNECTED and the SUBSCRIBE's RECEIPT
        self.count = count
        self.ack = ack
        self.ack_every = max(1, ack_every) if ack == "client" else 1
        self.received = 0
        self.whole = 0  # messages whose body arrived intact (PAYLOAD + NUL)
        self.carry = b""
        self.pending = b""  # an incomplete frame, in the acknowledging modes
        self.first_at = 0.0
        self.last_at = 0.0
        self.acks_sent = 0

    def data_received(self, data: bytes) -> None:
        if self.closing is not None:
            self.closing_data(data)
            return
        now = time.monotonic()
        self.tail = (self.tail + data)[-1000:]
        if not self.ready.done():
            data = self.handshake(data)
            if not data:
                return
        if self.finished.done() or self.check_error(data):
            return
        if not self.received:
            self.first_at = now
        self.progress_at = now
        frames = data.count(b"\x00")
        joined = self.carry + data
        self.whole += joined.count(BODY_MARK)
        self.carry = joined[-PAYLOAD_SIZE:]
        if self.ack != "auto":
            self.acknowledge(data)
        self.received += frames
        if self.received >= self.count:
            self.last_at = now
            self.finished.set_result(None)

    def acknowledge(self, data: bytes) -> None:
        """ACK the messages of this chunk (every one, or every ``ack_every``-th and the last
        of the run), in one write, with the ``ack`` header each MESSAGE carries."""
        buf = self.pending + data if self.pending else data
        acks = []
        pos = 0
        n = self.received
        every = self.ack_every
        last = self.count
        find = buf.find
        while (nul := find(b"\x00", pos)) >= 0:
            n += 1
            if n % every == 0 or n == last:
                start = find(b"\nack:", pos, nul)
                if start < 0:
                    self.fail(f"a MESSAGE without an ack header: {buf[pos:nul][:500]!r}")
                    return
                end = find(b"\n", start + 5, nul)
                acks.append(b"ACK\nid:" + buf[start + 5 : end] + b"\n\n\x00")
            pos = nul + 1
        self.pending = buf[pos:]
        if acks and self.transport is not None:
            self.transport.write(b"".join(acks))
            self.acks_sent += len(acks)

    def stalled_state(self) -> str:
        return f"{self.received} of {self.count} messages"


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


async def _connect(client: C, spec: dict[str, Any], setup: bytes) -> C:
    """Connect ``client``, send CONNECT and ``setup``; return once the handshake is done."""
    loop = asyncio.get_running_loop()
    await asyncio.wait_for(
        loop.create_connection(lambda: client, spec["host"], spec["port"]), CONNECT_TIMEOUT
    )
    assert client.transport is not None
    connect = connect_frame(spec["vhost"], spec.get("login"), spec.get("passcode"))
    client.transport.write(connect + setup)
    await asyncio.wait_for(client.ready, CONNECT_TIMEOUT)
    return client


async def disconnect(client: _Client) -> None:
    """DISCONNECT with a receipt (so the broker has processed everything before it, the last
    ACKs included), then close; at most 10 s. What else arrives meanwhile is ignored."""
    assert client.transport is not None
    client.closing = client.loop.create_future()
    client.transport.write(b"DISCONNECT\nreceipt:bye\n\n\x00")
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(client.closing, 10)
    client.transport.close()


async def produce(spec: dict[str, Any], conn: Connection) -> None:
    client = await _connect(Producer(asyncio.get_running_loop(), spec["stall"]), spec, b"")
    transport = client.transport
    assert transport is not None
    count, batch, window = spec["count"], spec["batch"], spec["window"]
    frame = send_frame(spec["destination"], spec["persistent"])
    full = frame * (batch - 1)
    watcher = asyncio.ensure_future(client.watch())
    conn.send(("ready", None))
    if conn.recv() != "go":
        raise ClientError("not told to go")
    cpu0 = cpu_seconds()
    t0 = time.monotonic()
    sent = batches = 0
    while sent < count:
        n = min(batch, count - sent)
        body = full if n == batch else frame * (n - 1)
        transport.write(body + send_frame(spec["destination"], spec["persistent"], f"r{batches}"))
        sent += n
        batches += 1
        client.progress_at = time.monotonic()
        if batches - client.receipts >= window:
            await client.wait_receipts(batches - window + 1)
    await client.wait_receipts(batches)
    t1 = time.monotonic()
    cpu = cpu_seconds() - cpu0
    client.finished.set_result(None)
    watcher.cancel()
    # Reported before the DISCONNECT, so that it is not in the parent's measuring window.
    conn.send(("done", {"started_at": t0, "confirmed_at": t1, "sent": sent,
                        "receipts": batches, "cpu": cpu}))
    await disconnect(client)


async def consume(spec: dict[str, Any], conn: Connection) -> None:
    setup = subscribe_frame(spec["destination"], spec["ack"], spec["prefetch"])
    consumer = Consumer(
        asyncio.get_running_loop(), spec["stall"], spec["count"], spec["ack"], spec["ack_every"]
    )
    client = await _connect(consumer, spec, setup)
    watcher = asyncio.ensure_future(client.watch())
    cpu0 = cpu_seconds()
    client.progress_at = time.monotonic()
    conn.send(("ready", None))
    try:
        await client.finished
    finally:
        watcher.cancel()
    cpu = cpu_seconds() - cpu0
    result = {
        "first_at": client.first_at,
        "last_at": client.last_at,
        "received": client.received,
        "whole": client.whole,
        "acks": client.acks_sent,
        "cpu": cpu,
    }
    conn.send(("done", result))  # before the DISCONNECT, as the producer does
    await disconnect(client)


def _run(main: Any, conn: Connection, spec: dict[str, Any]) -> None:
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        runner(main(spec, conn))  # which sends ("done", result)
    except (ClientError, OSError, EOFError) as exc:  # TimeoutError is an OSError
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    except BaseException as exc:  # a bug: say so rather than leave the parent waiting
        conn.send(("error", f"{type(exc).__name__}: {exc!r}"))
        raise
    finally:
        conn.close()


def producer_main(conn: Connection, spec: dict[str, Any]) -> None:
    """A child process's entry point: the windowed producer of ``spec`` (host, port, vhost,
    destination, persistent, count, batch, window, stall)."""
    _run(produce, conn, spec)


def consumer_main(conn: Connection, spec: dict[str, Any]) -> None:
    """A child process's entry point: the counting consumer of ``spec`` (host, port, vhost,
    destination, ack, ack_every, prefetch, count, stall)."""
    _run(consume, conn, spec)
