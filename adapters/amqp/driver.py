"""proton's AMQP 1.0 engine driven by the gateway's event loop: one driver for both roles.

How this works. python-qpid-proton's *engine* (a :class:`~proton.Transport` bound to a
:class:`~proton.Connection` that reports to a :class:`~proton.Collector`) is already a
sans-I/O protocol machine: bytes in (``push``), events out (the collector), bytes to send
(``pending`` / ``peek`` / ``pop``) and ``tick(now)`` for heartbeats and the idle timeout. It
does the framing, the performatives, sessions and their windows, link credit and delivery
state. Its own driver, the ``Container`` (reactor), would be a second event loop beside the
gateway's, with its own sockets and timers; so the gateway drives the engine by hand, and this
module is that driver, used by both sides that speak AMQP: the adapter's server connections
(:mod:`adapters.amqp.connection`) and the amqp transport's client connection
(:mod:`transports.amqp`). Each side keeps only what its role means: its event handlers, its
link objects, and what an ended connection means to it.

:class:`EngineDriver` owns one engine and does, for its owner:

- :meth:`~EngineDriver.receive_data`: push a read into the transport no more than its
  ``capacity`` at a time (what it cannot take once its input side is closed is ignored),
  dispatching the collected events after each part, then :meth:`~EngineDriver.flush`.
- dispatch: every collected event, in order. Transfers and dispositions (``PN_DELIVERY``,
  all but a handful of the events) stay on proton's C objects (``cproton``): the delivery's
  link is looked up in the owner's ``links`` (``pn_link_t`` → its link object) and both go to
  ``on_delivery`` -- wrapping each event in proton's Python objects cost more than all else
  done with a message. Other events are wrapped and go to ``handlers`` by type. A handler
  that raises is a bug: it is logged and the connection is closed with
  ``amqp:internal-error`` (AMQP 1.0 §2.8.15) rather than left half-handled.
- :meth:`~EngineDriver.flush`: dispatch, ``tick(now)``, dispatch what the tick raised, then
  write everything the transport has to send, once; then keep one ``call_later`` armed for
  the tick's next deadline. The tick comes before the write so that an empty frame it makes
  (AMQP 1.0 §2.4.5: a peer that announced an idle timeout hears from us within it) and the
  ``close`` of our own idle timeout leave at once, not at the next read or timer.
  ``pending() < 0`` means the output side is over (our ``close`` written, or the transport
  failed): the owner's ``on_over`` ends the connection.
- :meth:`~EngineDriver.changed`: work that makes output between reads (a delivery from the
  core, a settlement) schedules one flush with ``call_soon``, so a burst is written once.

Writing never stops: the asyncio transport buffers, and the owner's ``pause_writing`` stops
what produces output (its core consumers) instead.

The wire mapping. :func:`decode_message` and :func:`encode_message` turn a transfer's bytes
into a core message and back: with :mod:`mappings.amqp_fast` / :mod:`mappings.amqp_fast_out`
(about 5 µs each way, against about 20 µs through :class:`proton.Message`) when the default
mapping applies unchanged -- which the mapping set says explicitly,
:meth:`~mappings.engine.MappingSet.wire_is_default` -- and the fast codec takes the shape,
else through :class:`proton.Message` and the function :meth:`~mappings.engine.MappingSet.wire_for`
gives.

Runs on the loop; never awaits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from cproton import ffi, lib
from proton import Collector, Condition, Connection, Event, Transport, TransportException
from proton import Message as ProtonMessage

from gateway.message import Destination, DestKind, Message
from mappings.amqp_fast import decode as fast_decode
from mappings.amqp_fast_out import encode as fast_encode
from mappings.engine import default_wire
from mappings.rows import is_fast

__all__ = ["EngineDriver", "decode_message", "encode_message", "proton_to_message"]

# Whether the byte codecs are the default mapping: known once mappings.amqp_rows, which
# amqp_fast imports, has compared the rows with the shape they are written for.
_FAST_IN = is_fast("amqp", "in")
_FAST_OUT = is_fast("amqp", "out")

_PN_DELIVERY = Event.DELIVERY.number


class EngineDriver:
    """One proton engine (transport, connection, collector) on the event loop.

    ``write``: the socket's write. ``handlers``: event type number (``Event.X.number``) →
    handler of the wrapped event.
    ``links``: the owner's ``pn_link_t`` → link object (it adds and removes them).
    ``on_delivery(link_object_or_None, pn_delivery_t)``: a transfer or disposition.
    ``on_over()``: the output side is over (see :meth:`flush`). ``on_push_error(text)``: the
    transport refused input (it then closes itself, with its condition). ``on_internal_error``:
    a handler raised (default :meth:`fail`). ``label`` prefixes the log lines.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, transport: Transport,
                 connection: Connection, *, write: Callable[[bytes], None],
                 handlers: Mapping[int, Callable[[Any], None]], links: dict[Any, Any],
                 on_delivery: Callable[[Any, Any], None], on_over: Callable[[], None],
                 on_push_error: Callable[[str], None],
                 on_internal_error: Callable[[Condition], None] | None = None,
                 label: str, logger: logging.Logger) -> None:
        self.loop = loop
        self.transport = transport
        self.connection = connection
        self.collector = Collector()
        connection.collect(self.collector)
        self._col: Any = self.collector._impl  # the pn_collector_t the dispatch loop reads
        transport.bind(connection)
        self.write = write
        self.handlers: dict[int, Callable[[Any], None]] = dict(handlers)
        self.links = links
        self.on_delivery = on_delivery
        self.on_over = on_over
        self.on_push_error = on_push_error
        self.on_internal_error = on_internal_error or self.fail
        self.label = label
        self.log = logger
        self.closed = False  # over: nothing is dispatched or written any more
        self.flush_scheduled = False
        self.timer: asyncio.TimerHandle | None = None
        self.deadline = 0.0  # when the armed timer fires (monotonic seconds)
        self._io_closed = False

    # -- input ----------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """A read from the socket: into the engine, its events handled, its output written."""
        if self.closed:
            return
        t = self.transport
        view = memoryview(data)
        while view:
            cap = t.capacity()
            if cap <= 0:
                break  # its input side is closed: what is left can only be ignored
            n = min(cap, len(view))
            try:
                t.push(bytes(view[:n]))
            except TransportException as exc:
                self.on_push_error(str(exc))
            view = view[n:]
            self.dispatch()
        self.flush()

    def dispatch(self) -> None:
        """Handle every event the collector holds, in order (see the module docstring)."""
        col = self._col
        peek, pop, etype = lib.pn_collector_peek, lib.pn_collector_pop, lib.pn_event_type
        null = ffi.NULL
        links = self.links
        handlers = self.handlers
        on_delivery = self.on_delivery
        while not self.closed:
            ev = peek(col)
            if ev == null:
                return
            t = etype(ev)
            try:
                if t == _PN_DELIVERY:
                    dlv = lib.pn_event_delivery(ev)
                    on_delivery(links.get(lib.pn_delivery_link(dlv)), dlv)
                else:
                    handler = handlers.get(t)
                    if handler is not None:
                        handler(Event.wrap(ev))  # type: ignore[no-untyped-call]
            except Exception:  # a bug here must not leave the connection half-handled
                self.log.exception("%s: error handling event %s", self.label, t)
                self.on_internal_error(Condition("amqp:internal-error", "internal error"))
            finally:
                pop(col)  # the collector lives as long as this driver

    # -- output ---------------------------------------------------------------------------

    def changed(self) -> None:
        """Output is waiting (a delivery from the core, a settlement): one flush, after this
        loop turn's other work, writes it."""
        if not self.flush_scheduled and not self.closed:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Dispatch, tick, and write what the engine has to send; re-arm the tick timer."""
        self.flush_scheduled = False
        if self.closed:
            return
        t = self.transport
        self.dispatch()
        now = time.monotonic()
        deadline = t.tick(now)  # heartbeats out, the peer's silence checked (§2.4.5)
        self.dispatch()
        write = self.write
        while not self.closed:
            n = t.pending()
            if n < 0:  # our close has been written (or the transport failed): over
                self.closed = True
                self._cancel_timer()
                self.on_over()
                return
            if n == 0:
                break
            out = t.peek(n)
            t.pop(n)
            if out:
                write(out)
        if deadline and not self.closed:
            self._arm(deadline, now)

    def _arm(self, deadline: float, now: float) -> None:
        """One timer, at the earliest deadline the engine gave: one that fires first is kept
        (it ticks, and re-arms from that tick)."""
        if self.timer is not None:
            if self.deadline <= deadline:
                return
            self.timer.cancel()
        self.deadline = deadline
        self.timer = self.loop.call_later(max(0.0, deadline - now), self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        self.flush()

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    # -- ending ---------------------------------------------------------------------------

    def fail(self, cond: Condition) -> None:
        """Close the connection with ``cond`` (AMQP 1.0 §2.7.9); the flush writes the close."""
        if self.closed:
            return
        c = self.connection
        c.condition = cond
        c.close()
        self.changed()

    def close(self) -> None:
        """The socket is gone (or the owner dropped the connection): stop, and tell the
        transport both its directions are over."""
        self.closed = True
        self._cancel_timer()
        if not self._io_closed:
            self._io_closed = True
            t = self.transport
            with contextlib.suppress(TransportException):
                t.close_tail()
                t.close_head()


# -- the wire mapping ---------------------------------------------------------------------


def decode_message(data: bytearray, dest: Destination, mappings: Any, *,
                   transport: str | None, default_kind: DestKind, now_ms: int) -> Message:
    """The core message of a transfer's bytes sent to ``dest`` (the wire side of the mapping,
    OASIS AMQP JMS Mapping; ``mappings/README.md``): :mod:`mappings.amqp_fast` when the
    default mapping applies unchanged to ``dest`` for ``transport`` (``None``: the adapter's
    clients) and takes the message, else :func:`proton_to_message`. Raises what the mapping
    raises on what cannot be taken."""
    if _FAST_IN if mappings is None else mappings.wire_is_default(
            dest, protocol="amqp", direction="in", transport=transport):
        msg = fast_decode(data, destination=dest, default_kind=default_kind, now_ms=now_ms)
        if msg is not None:
            return msg
    pm = ProtonMessage()
    pm.decode(data)  # type: ignore[arg-type]
    return proton_to_message(pm, dest, mappings, transport=transport,
                             default_kind=default_kind, now_ms=now_ms)


def proton_to_message(pm: ProtonMessage, dest: Destination, mappings: Any, *,
                      transport: str | None, default_kind: DestKind, now_ms: int) -> Message:
    """A decoded :class:`proton.Message` sent to ``dest`` as a core message, through the wire
    mapping :meth:`~mappings.engine.MappingSet.wire_for` gives (the default one without
    mappings)."""
    if mappings is None:
        to_message: Callable[..., Message] = default_wire("amqp", "in")
    else:
        to_message = mappings.wire_for(dest, protocol="amqp", direction="in",
                                       transport=transport)
    return to_message(pm, destination=dest, default_kind=default_kind, now_ms=now_ms)


def encode_message(msg: Message, mappings: Any, *, transport: str | None, delivery_count: int,
                   now_ms: int, finish: Callable[[ProtonMessage], None] | None = None) -> bytes:
    """A transfer's bytes for ``msg`` (the core-side rules already applied by the caller):
    :mod:`mappings.amqp_fast_out` when the default mapping applies unchanged to its
    destination for ``transport`` and takes the message, else the wire mapping
    :meth:`~mappings.engine.MappingSet.wire_for` gives, through :class:`proton.Message`.
    ``finish`` changes that proton message before it is encoded (what the mapping does not
    write, such as a transport's far addresses); with one, the fast codec is not used.

    Raises:
        GatewayError: a mapping rule refused the message (MappingFailed).
    """
    dest = msg.destination
    if mappings is not None and dest is not None and not mappings.wire_is_default(
            dest, protocol="amqp", direction="out", transport=transport):
        to_amqp = mappings.wire_for(dest, protocol="amqp", direction="out", transport=transport)
    else:
        if finish is None and _FAST_OUT:
            data = fast_encode(msg, delivery_count=delivery_count, now_ms=now_ms)
            if data is not None:
                return data
        to_amqp = default_wire("amqp", "out")
    pm = to_amqp(msg, delivery_count=delivery_count, now_ms=now_ms)
    if finish is not None:
        finish(pm)
    encoded: bytes = pm.encode()
    return encoded
