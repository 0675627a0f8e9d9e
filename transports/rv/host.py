"""The engines under the RV-style bus's transports: one per (process, service) and loop.

:func:`host_for` (on the loop that will run the engine) returns the :class:`EngineHost` of a
service, starting its :class:`~transports.rv.shell.Shell` and
:class:`~transports.rv.engine.Engine` on first use, and enforces the service/network binding
rule process-wide (TIBCO Rendezvous Concepts, Transports, "Service Parameter":
another network on a bound service is an init failure). The host keeps the transports that
share the engine and the inboxes they created, routes what the engine delivers (by subject,
decoding a message only when a listener matches; an inbox only to its owner; ``_LOCAL.``
never from the wire), turns the engine's advisories into messages for every transport, and
takes sends from any thread: from the loop's own thread straight to the engine, from others
through a deque drained by one ``call_soon_threadsafe`` per burst (a burst that waited over
5 s presents CLIENT.FASTPRODUCER to its senders). Every 90 s it multicasts HOST.STATUS, and
on LISTEN.QUERY from the network it announces LISTEN.START again for every subject its
transports listen to (so a router that starts late learns the interest already there).

``host_for(..., private=True)`` starts an engine of its own for one transport, outside the
registry and its network rule: a router (:mod:`transports.rv.router`) links two networks that
may share a service, as a Rendezvous routing daemon does. Its service socket shares the port
with the other engines (``SO_REUSEPORT``) and, with ``IP_MULTICAST_ALL = 0``, receives only
the groups it joined itself.

:class:`Runtime` is the private loop, in one daemon thread per process, that runs the engines
of synchronous transports. :mod:`transports.rv.transport` documents the whole interface.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import ipaddress
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from transports.rv.advisory import (
    CLIENT_FASTPRODUCER,
    HOST_STATUS,
    LISTEN_QUERY,
    LISTEN_START,
    advisory_message,
    is_logged,
)
from transports.rv.codec import FormatError, decode, encode, peek_subject
from transports.rv.engine import Engine, EngineClosed
from transports.rv.events import Advisory, Delivered
from transports.rv.message import Message
from transports.rv.net import Network, parse_network, parse_service
from transports.rv.queue import Event as QueueEvent
from transports.rv.queue import Queue
from transports.rv.shell import Shell

if TYPE_CHECKING:
    from transports.rv.transport import _BaseTransport

log = logging.getLogger("transports.rv")
T = TypeVar("T")
#: Seconds between two HOST.STATUS advisories of an engine (Appendix A: periodic; 90 s is
#: what Rendezvous daemons use).
HOST_STATUS_INTERVAL = 90.0
#: Seconds a send may wait for the I/O thread before CLIENT.FASTPRODUCER (Appendix A).
FAST_PRODUCER_WAIT = 5.0


def _hand_over(batch: dict[Queue, list[QueueEvent]]) -> None:
    for queue, queued in batch.items():
        queue.push_many(queued)
    batch.clear()


class TransportError(RuntimeError):
    """A transport cannot do what was asked (closed, no reply subject...)."""


class InitFailure(TransportError):
    """A transport could not be created: the service is bound to another network in this
    process (Transports, "Service Parameter": TIBRV_INIT_FAILURE)."""


class RequestTimeout(TimeoutError):
    """``send_request`` got no reply within its timeout."""


# -- the private loop of synchronous transports -------------------------------------------


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when it is installed (it reads datagrams several times faster)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is optional
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


class Runtime:
    """One asyncio loop in a daemon thread: the engines of synchronous transports."""

    def __init__(self) -> None:
        self.loop = _new_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.call_soon(ready.set)
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, name="rv-io", daemon=True)
        self.thread.start()
        ready.wait()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if threading.current_thread() is self.thread:
            coro.close()
            raise TransportError("a synchronous transport call from the bus's own thread "
                                 "(use AsyncTransport inside callbacks run on a loop)")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


_runtime_lock = threading.Lock()
_runtime_obj: Runtime | None = None


def runtime() -> Runtime:
    global _runtime_obj
    with _runtime_lock:
        if _runtime_obj is None:
            _runtime_obj = Runtime()
        return _runtime_obj


# -- engines ------------------------------------------------------------------------------

_hosts_lock = threading.Lock()
_hosts: dict[tuple[int, int], EngineHost] = {}  # (service port, id(loop)) -> host
_starting: dict[tuple[int, int], asyncio.Future[EngineHost]] = {}


def _same_network(a: Network, b: Network) -> bool:
    return (a.interface, a.groups, a.send_address) == (b.interface, b.groups, b.send_address)


async def host_for(service: str | int | None, network: str | None, daemon: str | int | None,
                   ttl: int, reliability: float, transport: _BaseTransport,
                   private: bool = False) -> EngineHost:
    """The engine host of this loop for ``service``, started if need be, with ``transport``
    attached (runs on the loop, so a host found here is not closing). ``private``: a new
    engine for ``transport`` alone, not shared and not bound by the network rule."""
    loop = asyncio.get_running_loop()
    port = parse_service(service).port
    net = parse_network(network)
    if private:
        return await _private_host(loop, port, net, service, network, daemon, ttl,
                                   reliability, transport)
    key = (port, id(loop))
    while True:
        with _hosts_lock:
            for (p, _), other in _hosts.items():
                if p == port and not _same_network(other.network, net):
                    raise InitFailure(
                        f"service {port} is bound to network {other.network.text!r} in this "
                        f"process; {net.text!r} needs another service (Transports, Service "
                        "Parameter)")
            host = _hosts.get(key)
            pending = _starting.get(key)
            if host is None and pending is None:
                pending = loop.create_future()
                _starting[key] = pending
                break
        if host is not None:
            host.attach(transport)
            return host
        assert pending is not None
        await asyncio.shield(pending)
    try:
        host = EngineHost(loop, port, net)
        host.shell = await Shell.start(
            functools.partial(Engine, reliability=reliability), service, network, daemon,
            on_events=host.on_events, ttl=ttl)
        host.started()
    except BaseException as exc:
        with _hosts_lock:
            del _starting[key]
        pending.set_exception(exc)
        pending.exception()  # consumed here; waiters get it too
        raise
    with _hosts_lock:
        del _starting[key]
        _hosts[key] = host
    host.attach(transport)
    pending.set_result(host)
    return host


async def _private_host(loop: asyncio.AbstractEventLoop, port: int, net: Network,
                        service: str | int | None, network: str | None,
                        daemon: str | int | None, ttl: int, reliability: float,
                        transport: _BaseTransport) -> EngineHost:
    host = EngineHost(loop, port, net)
    host.shell = await Shell.start(
        functools.partial(Engine, reliability=reliability), service, network, daemon,
        on_events=host.on_events, ttl=ttl)
    host.started()
    host.attach(transport)
    return host


class EngineHost:
    """One engine and the transports that share it, on one loop."""

    shell: Shell

    def __init__(self, loop: asyncio.AbstractEventLoop, port: int, network: Network) -> None:
        self.loop = loop
        self.port = port
        self.network = network
        self.key = (port, id(loop))
        self.lock = threading.Lock()  # the matchers and the tables below
        self.transports: list[_BaseTransport] = []
        self.inboxes: dict[str, _BaseTransport] = {}
        self._counter = itertools.count(1)
        self._outbox: deque[tuple[bytes, tuple[str, int] | None, Any]] = deque()
        self._outbox_since = 0.0  # when the oldest waiting send was handed over
        self._out_lock = threading.Lock()
        self._wake_pending = False
        self.loop_thread = 0

    def started(self) -> None:
        engine = self.shell.engine
        assert isinstance(engine, Engine)
        self.engine = engine
        self.address = (engine.ip, engine.port)
        ip = int.from_bytes(bytes(int(b) for b in engine.ip.split(".")), "big")
        self.id_prefix = f"{ip:08X}.{engine.port:04X}{engine.incarnation:08X}."
        self.inbox_prefix = "_INBOX." + self.id_prefix
        self.loop_thread = threading.get_ident()
        self.host_status_subject = f"{HOST_STATUS}{ip:08X}"
        self.started_at = time.monotonic()
        self._status_timer: asyncio.TimerHandle | None = self.loop.call_later(
            HOST_STATUS_INTERVAL, self._host_status)

    def _host_status(self) -> None:
        """Multicast HOST.STATUS.<ip hex> (TIBCO Rendezvous Concepts, Appendix A,
        HOST.STATUS; every 90 s), a subset of its fields: the rest describe a daemon
        process and licence this in-process engine does not have."""
        self._status_timer = None
        if self.shell.closed:
            return
        sockets = self.shell.sockets
        fields: dict[str, object] = {
            "hostaddr": ipaddress.IPv4Address(self.engine.ip),
            "time": datetime.now(UTC),
            "up": int(time.monotonic() - self.started_at),
            "cc": len(self.transports),
        }
        fields.update(self.engine.stats.host_status())
        fields["ipport"] = sockets.daemon.port
        fields["service"] = sockets.service.text or str(sockets.service.port)
        fields["network"] = sockets.network.text
        self.publish_internal(advisory_message(self.host_status_subject, fields))
        self._status_timer = self.loop.call_later(HOST_STATUS_INTERVAL, self._host_status)

    def in_loop(self) -> bool:
        """Is the caller the loop's thread (the engine's, and the layers' above it)?"""
        return threading.get_ident() == self.loop_thread

    def soon(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the loop: at once when called there, else as soon as it can."""
        if self.in_loop():
            fn()
        else:
            self.loop.call_soon_threadsafe(fn)

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the loop, waited for when called from another thread."""
        if self.in_loop():
            return fn()
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                fut.set_exception(exc)

        self.loop.call_soon_threadsafe(run)
        return fut.result()

    def attach(self, transport: _BaseTransport) -> None:
        with self.lock:
            self.transports.append(transport)

    def next_id(self) -> str:
        return self.id_prefix + str(next(self._counter))

    # -- sending ---------------------------------------------------------------------------

    def submit(self, payload: bytes, dest: tuple[str, int] | None,
               sender: Any = None) -> None:
        """Hand ``payload`` to the engine (multicast, or to ``dest``), from any thread;
        ``sender`` is the transport, told of a wait over :data:`FAST_PRODUCER_WAIT`."""
        if self.in_loop():
            self._send_now(payload, dest)
            return
        with self._out_lock:
            self._outbox.append((payload, dest, sender))
            wake = not self._wake_pending
            if wake:
                self._wake_pending = True
                self._outbox_since = time.monotonic()
        if wake:
            self.loop.call_soon_threadsafe(self._drain_outbox)

    def _drain_outbox(self) -> None:
        with self._out_lock:
            items = list(self._outbox)
            self._outbox.clear()
            self._wake_pending = False
            since = self._outbox_since
        if items and time.monotonic() - since > FAST_PRODUCER_WAIT:
            self._fast_producer(items)
        for payload, dest, _ in items:
            self._send_now(payload, dest)

    def _fast_producer(self, items: list[tuple[bytes, tuple[str, int] | None, Any]]) -> None:
        """Sends waited over 5 s for the I/O thread: CLIENT.FASTPRODUCER (``waiting``: the
        messages that waited) to each sending transport, nothing discarded (TIBCO Rendezvous
        Concepts, Appendix A, CLIENT.FASTPRODUCER)."""
        waiting: dict[int, list[Any]] = {}
        for _, _, sender in items:
            if sender is not None:
                waiting.setdefault(id(sender), [sender, 0])[1] += 1
        for sender, n in waiting.values():
            sender._advise(CLIENT_FASTPRODUCER, {"waiting": n})

    def _send_now(self, payload: bytes, dest: tuple[str, int] | None) -> None:
        shell = self.shell
        if shell.closed:
            return
        try:
            if dest is None:
                shell.send(payload)
            else:
                shell.send_to(dest, payload)
        except EngineClosed:
            pass

    def fan_out(self, subject: str, msg: Message | None, payload: bytes,
                only: _BaseTransport | None = None,
                batch: dict[Queue, list[QueueEvent]] | None = None) -> int:
        """Deliver to the matching listeners of every transport (or of ``only``); with
        ``batch``, the events wait there for one hand-over per queue (see on_events)."""
        with self.lock:
            if only is not None:
                targets = [(only, only.matcher.match(subject))]
            else:
                targets = [(t, t.matcher.match(subject)) for t in self.transports]
        n = 0
        for t, listeners in targets:
            if listeners:
                if msg is None:
                    try:
                        msg = decode(payload)
                    except (FormatError, ValueError):
                        return 0
                t.enqueue(listeners, msg, len(payload), batch)
                n += len(listeners)
        return n

    def publish_internal(self, msg: Message) -> None:
        """The bus's own multicast (LISTEN, UNREACHABLE): local transports and the network."""
        payload = encode(msg)
        assert msg.send_subject is not None
        self.fan_out(msg.send_subject, msg, payload)
        self.submit(payload, None)

    # -- receiving (on the loop) -----------------------------------------------------------

    def on_events(self, events: list[Any]) -> None:
        # One hand-over per queue for the whole burst (one lock, one wake-up of the
        # dispatching thread), not one per message: per message, the dispatcher would wake,
        # contend for the GIL and sleep again for each.
        batch: dict[Queue, list[QueueEvent]] = {}
        for ev in events:
            if type(ev) is Delivered:
                payload = ev.payload
                try:
                    subject = peek_subject(payload)
                except FormatError:
                    continue
                if subject is None:
                    continue
                if subject[0] == "_":
                    if subject.startswith("_INBOX."):
                        owner = self.inboxes.get(subject)
                        if owner is not None:
                            self.fan_out(subject, None, payload, owner, batch)
                        continue
                    if subject.startswith("_LOCAL."):
                        continue
                    if subject == LISTEN_QUERY:
                        self.loop.call_soon(self.announce_listens)
                self.fan_out(subject, None, payload, None, batch)
            elif type(ev) is Advisory:
                if batch:  # what came before the advisory is queued before it
                    _hand_over(batch)
                msg = advisory_message(ev.subject, ev.fields)
                n = 0
                for t in list(self.transports):
                    n += t.present(msg)
                if not n and is_logged(ev.subject):
                    log.warning("rv advisory %s %s", ev.subject, ev.fields)
        if batch:
            _hand_over(batch)

    def announce_listens(self) -> None:
        """LISTEN.START again for every subject every transport of this engine listens to
        (the answer to LISTEN.QUERY); a router's own transports stay silent."""
        with self.lock:
            listening = [(t, list(t.listen_counts)) for t in self.transports
                         if not t.routing and not t.closed]
        for t, subjects in listening:
            for subject in subjects:
                t._listen_advisory(LISTEN_START, subject)

    async def remove(self, transport: _BaseTransport) -> None:
        with self.lock:
            if transport in self.transports:
                self.transports.remove(transport)
            for name in [k for k, v in self.inboxes.items() if v is transport]:
                del self.inboxes[name]
            last = not self.transports
        if last:
            with _hosts_lock:
                if _hosts.get(self.key) is self:  # (a private engine is not registered)
                    del _hosts[self.key]
            if self._status_timer is not None:
                self._status_timer.cancel()
            self._drain_outbox()
            await self.shell.close()
