"""The asyncio shell: runs a sans-I/O reliable multicast engine over two UDP sockets.

How this works. :meth:`Shell.start` opens the service and inbox sockets
(:func:`transports.rv.net.open_sockets`, non-blocking), builds the engine with the inbox
socket's address (``engine_factory(ip=..., port=..., service=...)``) and registers both
sockets with ``loop.add_reader`` (the standard loop and uvloop both have it). From then on the
shell does four things, and nothing else:

* **Input.** When a socket is readable, up to :data:`READ_BATCH` datagrams are read from it
  (``recvfrom`` until it would block) and each goes to
  ``engine.receive_datagram(data, addr, now)``, with one reading of the loop's clock for the
  lot; then one ``call_soon`` of the *pass*. A burst is thus handled by the engine packet by
  packet and answered once (a ``DatagramProtocol`` would cost a callback and a clock
  reading per datagram). An ``OSError`` on a read (Linux reports an ICMP port-unreachable for an
  earlier unicast there) is counted in ``stats.receive_errors``.
* **The pass** (after input, after :meth:`send`, after a timer): write
  ``engine.datagrams_to_send()`` — ``(ip, port)`` destinations unicast, the engine's
  ``MULTICAST`` destination to the send address and service port (the group, or the
  broadcast address) — then hand ``engine.events()`` to the ``on_events`` callback, write
  what the callback made the engine send, and re-arm the timer.
* **One timer**, a ``loop.call_at`` on ``engine.next_deadline()``, moved only when the
  deadline changes; when it fires, ``engine.tick(loop.time())`` and a pass.
* **Output** goes straight to the inbox socket's ``sendto`` (every datagram leaves from the
  inbox socket, so its source address is the engine's inbox). When the kernel has no room
  (``EAGAIN``, ``ENOBUFS``) the datagram and everything after it wait in order in a
  backlog, retried on a short timer that backs off from 1 ms to 50 ms while the kernel
  keeps refusing (``ENOBUFS`` does not make a socket unwritable, so there is nothing to
  wait on). The backlog is bounded; past the bound datagrams are dropped and counted, and
  the engine's retransmission recovers them as it recovers any loss. Other send errors (an
  unreachable host, ``EMSGSIZE``) drop that datagram and are counted too. The loop never
  sees an exception from a send.

:meth:`Shell.close` closes the engine (``engine.close(now)``, which may queue goodbye
packets), writes what it queued, delivers its last events, removes both sockets from the loop
and closes them.

The engine's ``MULTICAST`` destination is recognised as "not a tuple": unicast destinations
are ``(ip, port)`` tuples, so the shell needs nothing from the engine module.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from transports.rv.net import (
    DEFAULT_MULTICAST_TTL,
    RECEIVE_BUFFER_SIZE,
    Sockets,
    open_sockets,
)

# Retry delays for a send the kernel refused for lack of room: short at first (a loopback
# or NIC queue drains in well under a millisecond), backing off while it stays full.
SEND_RETRY_MIN = 0.001
SEND_RETRY_MAX = 0.05
# Datagrams kept waiting for room; past this the engine's retransmission is the better
# buffer (at 1,400 bytes a packet, about 90 MB).
SEND_BACKLOG_LIMIT = 65536
# Datagrams read from one socket per readiness before the loop runs anything else (the pass
# answers the lot at once); and the largest a UDP datagram can be.
READ_BATCH = 64
MAX_DATAGRAM = 65535


class Engine(Protocol):
    """What the shell needs of a reliable multicast engine (``transports.rv.engine``)."""

    def receive_datagram(self, data: bytes, addr: tuple[str, int], now: float) -> None: ...

    def datagrams_to_send(self) -> list[tuple[bytes, Any]]: ...

    def events(self) -> list[Any]: ...

    def send(self, payload: bytes, now: float) -> None: ...

    def send_to(self, dest: tuple[str, int], payload: bytes, now: float) -> None: ...

    def tick(self, now: float) -> None: ...

    def next_deadline(self) -> float | None: ...

    def close(self, now: float) -> None: ...


EventCallback = Callable[[list[Any]], object]


class ShellStats:
    """Counters of one shell (read them any time; the shell only adds to them)."""

    __slots__ = (
        "datagrams_received", "datagrams_sent", "receive_errors", "send_deferred",
        "send_retries", "send_dropped", "send_errors",
    )

    def __init__(self) -> None:
        self.datagrams_received = 0
        self.datagrams_sent = 0
        self.receive_errors = 0  # error_received: an ICMP error reported on a socket
        self.send_deferred = 0  # datagrams put in the backlog (no room in the kernel)
        self.send_retries = 0  # backlog retries that found the kernel still full
        self.send_dropped = 0  # past SEND_BACKLOG_LIMIT, or left at close
        self.send_errors = 0  # dropped on another send error (unreachable, too big)


class _Reader:
    """Reads one socket when the loop says it is readable: up to :data:`READ_BATCH`
    datagrams, each to the engine, then one pass for the lot."""

    __slots__ = ("_shell", "sock", "_recvfrom", "_engine", "_time")

    def __init__(self, shell: Shell, sock: socket.socket) -> None:
        self._shell = shell
        self.sock = sock
        self._recvfrom = sock.recvfrom
        self._engine = shell.engine
        self._time = shell.loop.time

    def on_readable(self) -> None:
        shell = self._shell
        if shell.closed:
            return
        recvfrom = self._recvfrom
        receive = self._engine.receive_datagram
        now = self._time()  # one reading for the batch: it took microseconds
        n = 0
        try:
            while n < READ_BATCH:
                data, addr = recvfrom(MAX_DATAGRAM)
                n += 1
                receive(data, addr, now)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            # Linux reports an ICMP port-unreachable for an earlier unicast here; the
            # engine's own timers find out that the peer is gone.
            shell.stats.receive_errors += 1
        shell.stats.datagrams_received += n
        if n and not shell._pass_scheduled:
            shell._pass_scheduled = True
            shell.loop.call_soon(shell._run_pass)


class Shell:
    """One engine on its service and inbox sockets, on the running loop.

    Runs on the loop; no method awaits except :meth:`start` and :meth:`close`.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sockets: Sockets,
        engine: Engine,
        on_events: EventCallback,
    ) -> None:
        self.loop = loop
        self.sockets = sockets
        self.engine = engine
        self.stats = ShellStats()
        self._on_events = on_events
        self._sendto: Callable[[bytes, tuple[str, int]], int] = sockets.inbox_socket.sendto
        self._multicast_destination = sockets.send_destination
        self._pass_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._deadline: float | None = None
        self._backlog: deque[tuple[bytes, tuple[str, int]]] = deque()
        self._retry: asyncio.TimerHandle | None = None
        self._retry_delay = SEND_RETRY_MIN
        self._readers: list[_Reader] = []
        self.closed = False

    @classmethod
    async def start(
        cls,
        engine_factory: Callable[..., Engine],
        service: str | int | None = None,
        network: str | None = "",
        daemon: str | int | None = None,
        *,
        on_events: EventCallback,
        ttl: int = DEFAULT_MULTICAST_TTL,
        receive_buffer: int = RECEIVE_BUFFER_SIZE,
    ) -> Shell:
        """Open the sockets for ``service``/``network``/``daemon`` and run an engine on them.

        ``engine_factory`` is called as ``engine_factory(ip=..., port=..., service=...)``
        with the inbox socket's address and the service port (``functools.partial`` adds
        the engine's other settings). ``on_events`` gets every non-empty list the engine's
        ``events()`` returns. Parameters as :func:`transports.rv.net.open_sockets`.
        """
        loop = asyncio.get_running_loop()
        sockets = open_sockets(
            service, network, daemon, ttl=ttl, receive_buffer=receive_buffer
        )
        shell: Shell | None = None
        try:
            engine = engine_factory(
                ip=sockets.endpoint.interface.address,
                port=sockets.inbox_port,
                service=sockets.service.port,
            )
            shell = cls(loop, sockets, engine, on_events)
            shell._attach(sockets.service_socket)
            shell._attach(sockets.inbox_socket)
        except BaseException:
            if shell is not None:
                shell._detach()
            sockets.close()
            raise
        shell._run_pass()
        return shell

    def _attach(self, sock: socket.socket) -> None:
        reader = _Reader(self, sock)
        self.loop.add_reader(sock, reader.on_readable)
        self._readers.append(reader)

    def _detach(self) -> None:
        for reader in self._readers:
            self.loop.remove_reader(reader.sock)
        self._readers.clear()

    @property
    def inbox_address(self) -> tuple[str, int]:
        """This engine's unicast address: the interface address and the inbox port."""
        return (self.sockets.endpoint.interface.address, self.sockets.inbox_port)

    # -- sending (the API layer's side) ------------------------------------------------------

    def send(self, payload: bytes) -> None:
        """Multicast (or broadcast) ``payload`` through the engine; written on the next pass."""
        self.engine.send(payload, self.loop.time())
        self._schedule_pass()

    def send_to(self, dest: tuple[str, int], payload: bytes) -> None:
        """Send ``payload`` to one engine's inbox ``dest``; written on the next pass."""
        self.engine.send_to(dest, payload, self.loop.time())
        self._schedule_pass()

    def flush(self) -> None:
        """Run a pass now: write what the engine has, hand over its events, re-arm the timer.

        For a caller that drove the engine directly and wants its datagrams out at once.
        """
        self._run_pass()

    # -- the pass, the timer, the writes -----------------------------------------------------

    def _schedule_pass(self) -> None:
        if not self._pass_scheduled and not self.closed:
            self._pass_scheduled = True
            self.loop.call_soon(self._run_pass)

    def _run_pass(self) -> None:
        self._pass_scheduled = False
        if self.closed:
            return
        engine = self.engine
        self._write(engine.datagrams_to_send())
        events = engine.events()
        if events:
            try:
                self._on_events(events)
            finally:
                # Even when the callback raised (the loop's exception handler gets it):
                # what it made the engine send goes out and the timer stays armed.
                if not self.closed:  # the callback may have closed the shell
                    self._write(engine.datagrams_to_send())
                    self._arm_timer()
            return
        self._arm_timer()

    def _arm_timer(self) -> None:
        engine = self.engine
        deadline = engine.next_deadline()
        if deadline != self._deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._deadline = deadline
            self._timer = None if deadline is None else self.loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._deadline = None
        if self.closed:
            return
        self.engine.tick(self.loop.time())
        self._run_pass()

    def _write(self, datagrams: list[tuple[bytes, Any]]) -> None:
        if not datagrams:
            return
        if self._backlog:  # keep the order: behind what already waits
            self._defer(datagrams, 0)
            return
        sendto = self._sendto
        multicast = self._multicast_destination
        stats = self.stats
        i = 0
        n = len(datagrams)
        while i < n:
            data, dest = datagrams[i]
            try:
                sendto(data, dest if type(dest) is tuple else multicast)
            except (BlockingIOError, InterruptedError):
                self._defer(datagrams, i)
                break
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    self._defer(datagrams, i)
                    break
                stats.send_errors += 1
            else:
                stats.datagrams_sent += 1
            i += 1

    def _defer(self, datagrams: list[tuple[bytes, Any]], start: int) -> None:
        backlog = self._backlog
        multicast = self._multicast_destination
        stats = self.stats
        for i in range(start, len(datagrams)):
            if len(backlog) >= SEND_BACKLOG_LIMIT:
                stats.send_dropped += len(datagrams) - i
                break
            data, dest = datagrams[i]
            backlog.append((data, dest if type(dest) is tuple else multicast))
            stats.send_deferred += 1
        if self._retry is None and backlog:
            self._retry = self.loop.call_later(self._retry_delay, self._retry_backlog)

    def _drain_backlog(self) -> bool:
        """Send from the backlog until it is empty (True) or the kernel is full (False)."""
        backlog = self._backlog
        sendto = self._sendto
        stats = self.stats
        while backlog:
            data, dest = backlog[0]
            try:
                sendto(data, dest)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    return False
                stats.send_errors += 1
            else:
                stats.datagrams_sent += 1
            backlog.popleft()
        return True

    def _retry_backlog(self) -> None:
        self._retry = None
        if self._drain_backlog():
            self._retry_delay = SEND_RETRY_MIN
            return
        self.stats.send_retries += 1
        self._retry_delay = min(self._retry_delay * 2, SEND_RETRY_MAX)
        self._retry = self.loop.call_later(self._retry_delay, self._retry_backlog)

    # -- closing -----------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the engine, write its last datagrams, deliver its last events, close sockets.

        Datagrams the kernel still has no room for at this point are dropped (counted in
        ``stats.send_dropped``). Returns when both sockets are closed, so their ports are
        free again.
        """
        if self.closed:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        engine = self.engine
        engine.close(self.loop.time())
        self._write(engine.datagrams_to_send())
        events = engine.events()
        self.closed = True
        if events:
            self._on_events(events)
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self._drain_backlog()
        self.stats.send_dropped += len(self._backlog)
        self._backlog.clear()
        self._detach()
        self.sockets.close()

