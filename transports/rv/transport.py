"""The RV-style bus's programming interface: transports, listeners, inboxes, request/reply.

A program opens a :class:`Transport` on a service and network, creates :class:`Listener`s on
subjects, and dispatches their :class:`~transports.rv.queue.Queue`; it sends
:class:`~transports.rv.message.Message`s by subject::

    from transports.rv import Listener, Message, Transport, default_queue
    t = Transport(service="7500", network="127.0.0.1;239.192.75.1")
    Listener(t, "FOO.>", lambda msg, listener: print(msg))
    t.send(Message("FOO.BAR").add("x", 1))
    default_queue().dispatch()

How it works.

* **One engine per (process, service)** (TIBCO Rendezvous Concepts, Transports, "Service
  Parameter": the service/network binding rule). The first transport on a service starts a
  :class:`~transports.rv.shell.Shell` running a reliable multicast
  :class:`~transports.rv.engine.Engine`; later transports on that service share it. A
  transport on the same service with another network raises :class:`InitFailure`. The
  engine, and so each socket and timer, lives on one asyncio loop:

  - :class:`Transport` (synchronous programs) uses a private loop (uvloop's when installed)
    in one daemon thread per process, started on first use (:mod:`transports.rv.host`). ``send`` encodes in the caller's thread and hands the
    bytes to that loop (a deque and at most one wake-up per burst, so a tight send loop
    costs one ``call_soon_threadsafe`` per batch, not per message).
  - :class:`AsyncTransport` (``await AsyncTransport.open(...)``) runs on the caller's
    running loop and never blocks it: sends go straight to the engine, callbacks of its
    default queue run on that loop, and ``await send_request(...)`` waits without blocking.
    Engines are shared per (loop, service); the network rule is checked process-wide.

* **Local fan-out** (Fundamentals, "Multicast and Point-to-Point Messages"). A message sent
  by a transport reaches the matching listeners of every transport of its engine, in this
  process, at once, and goes to the network; the engine never delivers its own multicast
  back. ``_LOCAL.`` subjects never leave the process (Subject Names, Table 15). The
  **intra-process transport** (:func:`process_transport`) has no network at all and carries
  process-wide advisories.

* **Listeners and queues.** A listener (transport, subject with wildcards, callback, queue)
  is active when created; each matching message queues one event for it, and two listeners
  on one subject get two (Events and Queues, "Listener Event Semantics"). The callback is
  ``callback(msg, listener)``, run by whichever thread dispatches the queue.
  ``listener.destroy()`` removes its waiting events. Messages from the network are decoded
  once, and only when some listener matches (:func:`~transports.rv.codec.peek_subject`).

* **Inboxes** (Fundamentals, "Inbox Names"). :meth:`create_inbox` returns
  ``_INBOX.<ip:8 hex>.<inbox port:4 hex><incarnation:8 hex>.<n>``: the engine's unicast
  address, its incarnation and a counter. A send to such a subject parses it and goes on
  the point-to-point stream to that engine (``engine.send_to``), or straight to the owner
  when it is this engine; the receiving engine delivers it only to listeners of the transport
  that created the inbox (several listeners: several copies), and drops an inbox it does not
  know (another incarnation, a closed transport). ``send_request`` makes a one-shot inbox,
  sends and waits for the first reply (:class:`RequestTimeout` otherwise); ``send_reply``
  sends to the request's reply subject; multicast request/reply is a listener on an inbox
  that collects every reply until destroyed.

* **Overload** (Events and Queues; Appendix A). Queue limit policies are in
  :mod:`transports.rv.queue`. The slow-consumer rule: each transport accounts the messages
  waiting in queues for its listeners; when one arriving would make them exceed
  ``max_consumer_buffer`` bytes (0: no bound), or the oldest has waited more than
  ``max_consumer_age`` seconds (60), the oldest are dropped until it fits and
  ``_RV.ERROR.SYSTEM.CLIENT.SLOWCONSUMER`` is put at the head of its listeners' queues.
  The fast-producer rule: a synchronous transport's sends wait, never discarded, until the
  I/O thread takes them; when the oldest waited more than 5 s,
  ``_RV.WARN.SYSTEM.CLIENT.FASTPRODUCER`` (``waiting``) goes to the sending transport.

* **Advisories** are messages (:mod:`transports.rv.advisory`): the engine's DATALOSS and
  RETRANSMISSION events go to every transport of the engine; DATALOSS.MSG_TOO_LARGE and
  CLIENT.ILLEGAL_PUBLISH to the sending transport (the send also raises);
  QUEUE.LIMIT_EXCEEDED to the intra-process transport; LISTEN.START / LISTEN.STOP (a
  transport's first listener on a subject, and its last one gone) and
  UNREACHABLE.TRANSPORT.<id> (a transport closed) and, every 90 s per engine,
  HOST.STATUS.<ip hex> are multicast to the network, as a Rendezvous daemon does, and
  fanned out locally. Subjects starting with ``_`` give no
  LISTEN advisories. LISTEN.QUERY from the network makes every engine announce LISTEN.START
  again for what its transports listen to.

* **Routers** (:mod:`transports.rv.router`) open their transports with the internal keywords
  ``routing=True`` (no LISTEN advisories, so routers never take each other's listeners for
  interest; the envelope's route marker is sent as it is, where any other transport sends a
  message without it) and ``private_engine=True`` (an engine of its own, outside the
  service/network rule).

Sending refuses, with :class:`~transports.rv.subject.SubjectError`, a subject that breaks
the send rules, a reserved subject other than ``_INBOX.``/``_LOCAL.`` (``_RV.`` is the bus's
own), and a wildcard subject (Rendezvous allows it but advises against it; here a receiver's
matcher would take ``*`` literally).

Not implemented: CLIENT.FASTPRODUCER for the shell's own backlog of datagrams the kernel
had no room for (and for :class:`AsyncTransport`, whose sends reach the engine at once),
queue groups and priorities (recorded, not used), inboxes on the intra-process transport,
and the engine's parameters beyond ``reliability``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable

from transports.rv import queue as _queue
from transports.rv.advisory import (
    CLIENT_ILLEGAL_PUBLISH,
    CLIENT_SLOWCONSUMER,
    DATALOSS_MSG_TOO_LARGE,
    LISTEN_START,
    LISTEN_STOP,
    QUEUE_LIMIT_EXCEEDED,
    UNREACHABLE_TRANSPORT,
    advisory_message,
    is_logged,
)
from transports.rv.codec import decode, encode
from transports.rv.events import MessageTooLarge
from transports.rv.host import (
    EngineHost,
    InitFailure,
    RequestTimeout,
    TransportError,
    host_for,
    log,
    runtime,
)
from transports.rv.message import Message
from transports.rv.net import DEFAULT_MULTICAST_TTL
from transports.rv.queue import Event, Queue, default_queue
from transports.rv.subject import SubjectError, SubjectMatcher, validate_send_subject

__all__ = [
    "AsyncTransport", "InitFailure", "Listener", "ProcessTransport", "RequestTimeout",
    "Transport", "TransportError", "process_transport",
]

# Subjects already checked for sending (a program sends to few subjects, many times).
_valid_subjects: dict[str, None] = {}
_VALID_CACHE = 4096

Callback = Callable[[Message, "Listener"], object]


# -- transports ---------------------------------------------------------------------------


class _Consumer:
    """A transport's inbound accounting: the slow-consumer rule (module docstring)."""

    __slots__ = ("transport", "max_bytes", "max_age", "pending", "bytes", "waiting", "lock")

    def __init__(self, transport: _BaseTransport, max_bytes: int, max_age: float) -> None:
        self.transport = transport
        self.max_bytes = max_bytes
        self.max_age = max_age
        self.pending: deque[Event] = deque()
        self.bytes = 0
        self.waiting = 0  # events not yet dispatched nor dropped
        self.lock = threading.Lock()

    def settled(self, event: Event) -> bool:
        with self.lock:
            if event.state:
                return False
            event.state = 1
            self.bytes -= event.size
            self.waiting -= 1
            return True

    def admit(self, size: int, now: float) -> None:
        """Make room for ``size`` more bytes; drop the oldest waiting events if need be."""
        pending = self.pending
        dropped: list[Event] = []
        reason = ""
        with self.lock:
            while pending and pending[0].state:
                pending.popleft()
            max_bytes = self.max_bytes
            while pending:
                head = pending[0]
                if max_bytes and self.bytes + size > max_bytes:
                    reason = "size limit"
                elif now - head.since > self.max_age:
                    reason = reason or "time limit"
                else:
                    break
                pending.popleft()
                if not head.state:
                    head.state = 1
                    self.bytes -= head.size
                    dropped.append(head)
                while pending and pending[0].state:
                    pending.popleft()
            self.waiting -= len(dropped)
            waiting = self.waiting
        if dropped:
            for ev in dropped:
                ev.listener.queue.remove(ev)
            msg = advisory_message(CLIENT_SLOWCONSUMER, {
                "waiting": waiting, "dropped": len(dropped),
                "bytes_dropped": sum(e.size for e in dropped), "reason": reason})
            if not self.transport.present(msg, head=True):
                log.warning("rv advisory %s", msg.to_text())

    def add_all(self, events: list[Event], size: int, now: float) -> None:
        """Account for ``events`` (one message of ``size`` bytes for several listeners),
        after making room as :meth:`admit` does; one lock when nothing has to go."""
        pending = self.pending
        admitted = False
        while True:
            with self.lock:
                while pending and pending[0].state:
                    pending.popleft()
                if admitted or not pending or (
                        (not self.max_bytes or self.bytes + size <= self.max_bytes)
                        and now - pending[0].since <= self.max_age):
                    pending.extend(events)
                    self.bytes += size * len(events)
                    self.waiting += len(events)
                    return
            self.admit(size, now)  # drops and advises outside the lock
            admitted = True


class _BaseTransport:
    """What every transport has: its listeners, its delivery, its sending rules."""

    host: EngineHost | None = None
    routing = False
    """A router's transport: no LISTEN advisories, and the route marker is sent."""

    def __init__(self, description: str, max_consumer_buffer: int,
                 max_consumer_age: float) -> None:
        self.description = description
        self.matcher = SubjectMatcher()
        self.lock = threading.Lock()  # the matcher when there is no host
        self.listen_counts: dict[str, int] = {}
        self.consumer = _Consumer(self, max_consumer_buffer, max_consumer_age)
        self.closed = False
        self.id = ""

    def _lock(self) -> threading.Lock:
        host = self.host
        return host.lock if host is not None else self.lock

    @property
    def default_listener_queue(self) -> Queue:
        return default_queue()

    # -- listeners -------------------------------------------------------------------------

    def _add_listener(self, listener: Listener) -> None:
        if self.closed:
            raise TransportError("transport closed")
        subject = listener.subject
        with self._lock():
            self.matcher.add(subject, listener)
            count = self.listen_counts.get(subject, 0) + 1
            self.listen_counts[subject] = count
        if count == 1:
            self._listen_advisory(LISTEN_START, subject)

    def _remove_listener(self, listener: Listener) -> None:
        subject = listener.subject
        with self._lock():
            if not self.matcher.remove(subject, listener):
                return
            count = self.listen_counts.get(subject, 1) - 1
            if count:
                self.listen_counts[subject] = count
            else:
                self.listen_counts.pop(subject, None)
        if count == 0 and not self.closed:
            self._listen_advisory(LISTEN_STOP, subject)

    def _listen_advisory(self, prefix: str, subject: str) -> None:
        host = self.host
        if host is None or subject[0] == "_" or self.routing:
            return
        name = prefix + subject
        if len(name.encode()) > 255:
            return
        host.publish_internal(advisory_message(name, {"id": self.id, "sub": subject}))

    # -- delivery --------------------------------------------------------------------------

    def enqueue(self, listeners: tuple[object, ...], msg: Message, size: int,
                batch: dict[Queue, list[Event]] | None = None) -> None:
        """Queue ``msg`` for each of ``listeners`` (a message, accounted for slow consumers);
        with ``batch``, collect the events per queue there for one ``push_many`` each."""
        consumer = self.consumer
        now = time.monotonic()
        events = [Event(listener, msg, size, now, consumer) for listener in listeners]
        consumer.add_all(events, size, now)
        for ev in events:
            listener = ev.listener
            assert isinstance(listener, Listener)
            if batch is None:
                listener.queue.push(ev)
            else:
                queued = batch.get(listener.queue)
                if queued is None:
                    batch[listener.queue] = [ev]
                else:
                    queued.append(ev)

    def listens(self, subject: str) -> bool:
        """Does a listener of this transport match ``subject``?"""
        with self._lock():
            return bool(self.matcher.match(subject))

    def present(self, msg: Message, head: bool = False) -> int:
        """Queue an advisory for this transport's matching listeners; how many took it."""
        subject = msg.send_subject
        assert subject is not None
        with self._lock():
            listeners = self.matcher.match(subject)
        for listener in listeners:
            assert isinstance(listener, Listener)
            listener.queue.push(Event(listener, msg), head)
        return len(listeners)

    def _advise(self, subject: str, fields: dict[str, str | int]) -> None:
        msg = advisory_message(subject, fields)
        if not self.present(msg) and is_logged(subject):
            log.warning("rv advisory %s", msg.to_text())

    # -- sending ---------------------------------------------------------------------------

    def _check_subject(self, msg: Message, internal: bool = False) -> str:
        subject = msg.send_subject
        if subject is None:
            raise SubjectError("the message has no send subject")
        if subject in _valid_subjects:
            return subject
        try:
            validate_send_subject(subject, allow_internal=internal, allow_wildcard=False)
        except SubjectError as exc:
            self._advise(CLIENT_ILLEGAL_PUBLISH, {"sub": subject, "tport": self.id,
                                                  "descr": str(exc)})
            raise
        if internal:
            return subject
        if len(_valid_subjects) >= _VALID_CACHE:
            _valid_subjects.clear()
        _valid_subjects[subject] = None
        return subject

    def _encode(self, msg: Message) -> bytes:
        try:
            return encode(msg)
        except MessageTooLarge as exc:
            host = self.host
            size = host.engine.payload_size if host is not None else 1400
            self._advise(DATALOSS_MSG_TOO_LARGE, {
                "host": host.engine.ip if host is not None else "0.0.0.0",
                "lost": -(-exc.size // size),
                "scid": host.port if host is not None else 0})
            raise

    def _send(self, msg: Message, internal: bool = False) -> None:
        """Send ``msg`` to its subject (Fundamentals, Multicast and Point-to-Point Messages);
        ``internal``: a layer of the bus itself sends it (a reserved subject is allowed)."""
        if self.closed:
            raise TransportError("transport closed")
        subject = self._check_subject(msg, internal)
        route = msg.route
        if route is not None and not self.routing:
            # a program resending what a router delivered: a new message here, not the
            # router's (its origin network would be wrong)
            msg.route = None
            try:
                payload = self._encode(msg)
            finally:
                msg.route = route
        else:
            payload = self._encode(msg)
        host = self.host
        if host is None:  # the intra-process transport
            with self.lock:
                listeners = self.matcher.match(subject)
            if listeners:
                self.enqueue(listeners, decode(payload), len(payload))
            return
        if subject[0] == "_":
            if subject.startswith("_INBOX."):
                dest = _inbox_address(subject)
                if dest == host.address:  # ours: no network
                    owner = host.inboxes.get(subject)
                    if owner is not None:
                        host.fan_out(subject, None, payload, owner)
                else:
                    host.submit(payload, dest, self)
                return
            if subject.startswith("_LOCAL."):
                host.fan_out(subject, None, payload)
                return
        host.fan_out(subject, None, payload)
        host.submit(payload, None, self)

    def create_inbox(self) -> str:
        """A new inbox name of this transport (Fundamentals, "Inbox Names")."""
        host = self.host
        if host is None:
            raise TransportError("the intra-process transport has no inboxes")
        if self.closed:
            raise TransportError("transport closed")
        name = host.inbox_prefix + str(next(host._counter))
        with host.lock:
            host.inboxes[name] = self
        return name

    def _drop_inbox(self, name: str) -> None:
        host = self.host
        if host is not None:
            with host.lock:
                host.inboxes.pop(name, None)

    @staticmethod
    def _reply_copy(reply: Message, request: Message) -> Message:
        if not request.reply_subject:
            raise TransportError("the request has no reply subject (send_reply needs one)")
        reply.send_subject = request.reply_subject
        return reply

    def _close_listeners(self) -> None:
        self.closed = True
        with self._lock():
            listeners = {id(x): x for s in list(self.listen_counts)
                         for x in self.matcher.match(s)}
        for listener in listeners.values():
            assert isinstance(listener, Listener)
            listener.destroy()

    def _begin_close(self) -> EngineHost:
        """The first half of closing: destroy the listeners and tell the network
        (UNREACHABLE.TRANSPORT); the caller then removes itself from the returned host."""
        self._close_listeners()
        host = self.host
        assert host is not None
        host.publish_internal(advisory_message(UNREACHABLE_TRANSPORT + self.id,
                                               {"id": self.id}))
        return host


def _inbox_address(subject: str) -> tuple[str, int]:
    """The engine address in an inbox name ``_INBOX.<ip>.<port><incarnation>.<n>``."""
    parts = subject.split(".")
    try:
        if len(parts) != 4 or len(parts[1]) != 8 or len(parts[2]) != 12:
            raise ValueError
        ip = int(parts[1], 16)
        port = int(parts[2][:4], 16)
    except ValueError:
        raise SubjectError(f"{subject!r} is not an inbox this bus created "
                           "(create_inbox)") from None
    return (f"{ip >> 24}.{ip >> 16 & 255}.{ip >> 8 & 255}.{ip & 255}", port)


class Transport(_BaseTransport):
    """A network transport for synchronous programs (module docstring).

    ``service``, ``network``, ``daemon``: TIBCO Rendezvous Concepts, Transports, Network
    Transport Parameters (:mod:`transports.rv.net`); ``ttl`` the multicast TTL;
    ``reliability`` the engine's retention in seconds (only the first transport of a service
    sets it); ``max_consumer_buffer`` / ``max_consumer_age`` the slow-consumer bounds;
    ``routing``, ``private_engine``: for routers (module docstring).
    """

    def __init__(self, service: str | int | None = None, network: str | None = "",
                 daemon: str | int | None = None, *, description: str = "",
                 ttl: int = DEFAULT_MULTICAST_TTL, reliability: float = 60.0,
                 max_consumer_buffer: int = 0, max_consumer_age: float = 60.0,
                 routing: bool = False, private_engine: bool = False) -> None:
        super().__init__(description, max_consumer_buffer, max_consumer_age)
        self.routing = routing
        rt = runtime()
        self._rt = rt
        host = rt.call(host_for(service, network, daemon, ttl, reliability, self,
                                private_engine))
        self.host = host
        self.id = host.next_id()

    def send(self, msg: Message) -> None:
        """Send ``msg`` to its send subject (multicast, or point to point to an inbox)."""
        self._send(msg)

    def send_reply(self, reply: Message, request: Message) -> None:
        """Send ``reply`` to ``request``'s reply subject (Fundamentals, Interaction Patterns)."""
        self._send(self._reply_copy(reply, request))

    def send_request(self, msg: Message, timeout: float) -> Message:
        """Send ``msg`` with a fresh inbox as its reply subject and return the first reply.

        Raises :class:`RequestTimeout` when none comes within ``timeout`` seconds.
        """
        inbox = self.create_inbox()
        q = Queue("request")
        got: list[Message] = []
        listener = Listener(self, inbox, lambda m, _: got.append(m), queue=q)
        try:
            msg.reply_subject = inbox
            self._send(msg)
            deadline = time.monotonic() + timeout
            while not got:
                left = deadline - time.monotonic()
                if left <= 0 or not q.timed_dispatch(left):
                    raise RequestTimeout(f"no reply to {msg.send_subject!r} in {timeout} s")
            return got[0]
        finally:
            listener.destroy()
            self._drop_inbox(inbox)
            q.destroy()

    @property
    def inbox_address(self) -> tuple[str, int]:
        assert self.host is not None
        return self.host.address

    def close(self) -> None:
        """Destroy the listeners, tell the network (UNREACHABLE.TRANSPORT), release the
        engine when this was its last transport."""
        if self.closed:
            return
        self._rt.call(self._begin_close().remove(self))

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncTransport(_BaseTransport):
    """A network transport on the caller's asyncio loop; open it with :meth:`open`.

    Listeners without a queue go to :attr:`queue`, dispatched on the loop. ``send`` and
    ``send_reply`` never block; ``send_request`` is awaited.
    """

    def __init__(self, description: str, max_consumer_buffer: int,
                 max_consumer_age: float) -> None:
        super().__init__(description, max_consumer_buffer, max_consumer_age)
        self.queue = Queue("asyncTransport")

    @classmethod
    async def open(cls, service: str | int | None = None, network: str | None = "",
                   daemon: str | int | None = None, *, description: str = "",
                   ttl: int = DEFAULT_MULTICAST_TTL, reliability: float = 60.0,
                   max_consumer_buffer: int = 0, max_consumer_age: float = 60.0,
                   routing: bool = False, private_engine: bool = False) -> AsyncTransport:
        t = cls(description, max_consumer_buffer, max_consumer_age)
        t.routing = routing
        host = await host_for(service, network, daemon, ttl, reliability, t, private_engine)
        t.host = host
        t.id = host.next_id()
        t.queue.bind_loop(host.loop)
        return t

    @property
    def default_listener_queue(self) -> Queue:
        return self.queue

    def send(self, msg: Message) -> None:
        self._send(msg)

    def send_reply(self, reply: Message, request: Message) -> None:
        self._send(self._reply_copy(reply, request))

    async def send_request(self, msg: Message, timeout: float) -> Message:
        """As :meth:`Transport.send_request`, awaited on the transport's loop."""
        inbox = self.create_inbox()
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()

        def on_reply(m: Message, _: Listener) -> None:
            if not fut.done():
                fut.set_result(m)

        listener = Listener(self, inbox, on_reply)
        try:
            msg.reply_subject = inbox
            self._send(msg)
            try:
                return await asyncio.wait_for(fut, timeout)
            except TimeoutError:
                raise RequestTimeout(
                    f"no reply to {msg.send_subject!r} in {timeout} s") from None
        finally:
            listener.destroy()
            self._drop_inbox(inbox)

    async def close(self) -> None:
        if self.closed:
            return
        await self._begin_close().remove(self)
        self.queue.destroy()


class ProcessTransport(_BaseTransport):
    """The intra-process transport: no network; process-wide advisories appear on it."""

    def __init__(self) -> None:
        super().__init__("intra-process", 0, float("inf"))
        self.id = "intra-process"

    def send(self, msg: Message) -> None:
        self._send(msg)


_process_transport: ProcessTransport | None = None
_process_lock = threading.Lock()


def process_transport() -> ProcessTransport:
    """The intra-process transport (Transports, "Intra-Process Transport")."""
    global _process_transport
    with _process_lock:
        if _process_transport is None:
            _process_transport = ProcessTransport()
        return _process_transport


def _limit_exceeded(queue_name: str) -> None:
    process_transport()._advise(QUEUE_LIMIT_EXCEEDED, {"ADV_DESC": queue_name})


_queue.limit_exceeded_hook = _limit_exceeded


class Listener:
    """Listens to ``subject`` (wildcards allowed) on ``transport``; each matching message
    runs ``callback(msg, listener)`` when ``queue`` is dispatched (default: the transport's
    default queue). Active when created; :meth:`destroy` stops it and drops what waits."""

    __slots__ = ("transport", "subject", "callback", "queue", "active", "closure")

    def __init__(self, transport: _BaseTransport, subject: str, callback: Callback,
                 queue: Queue | None = None, closure: object = None) -> None:
        self.transport = transport
        self.subject = subject
        self.callback = callback
        self.queue = queue if queue is not None else transport.default_listener_queue
        self.closure = closure
        self.active = True
        transport._add_listener(self)  # validates the subject

    def destroy(self) -> None:
        if not self.active:
            return
        self.active = False
        self.transport._remove_listener(self)
        self.queue.purge(self)

    def __repr__(self) -> str:
        return f"Listener({self.subject!r})"
