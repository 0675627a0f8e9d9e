"""What runs a sans-I/O protocol core of the bus's upper layers on the engine's loop.

Fault tolerance (:mod:`transports.rv.ft`) and distributed queues (:mod:`transports.rv.dq`)
are cores that read no clock and open no socket; :class:`CoreDriver` gives one of them its
bus listeners (on a queue dispatched on the loop of the engine under the transport), one
loop timer at the core's next deadline, and a *turn* after each input: the subclass's
:meth:`~CoreDriver.flush` sends and hands out what the core produced, then the timer is set
again. Inputs of one loop iteration share a turn. :class:`ProgramListener` is the program's
listener of such a layer: its callback runs when its queue is dispatched, then, unless it
confirms explicitly, the message counts as done.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from transports.rv.advisory import is_logged
from transports.rv.message import Message
from transports.rv.queue import Queue
from transports.rv.transport import Listener, TransportError, _BaseTransport

log = logging.getLogger("transports.rv")


class CoreDriver:
    """Runs ``self.core`` (set by the subclass before :meth:`start`) on ``transport``'s
    loop; the core has ``receive(msg, now)``, ``tick(now)`` and ``next_deadline()``, on the
    monotonic clock. ``what`` names the layer in errors ("fault tolerance")."""

    core: Any

    def __init__(self, transport: _BaseTransport, name: str, what: str) -> None:
        host = transport.host
        if host is None:
            raise TransportError(f"{what} needs a network transport")
        self.transport = transport
        self.host = host
        self.loop: asyncio.AbstractEventLoop = host.loop
        self.active = True  # (a queue runs only the events of an active listener)
        self._bus_queue = Queue(name)
        self._bus_queue.bind_loop(self.loop)
        self._bus: list[Listener] = []
        self._timer: asyncio.TimerHandle | None = None
        self._turn_due = False

    def bus_listen(self, subject: str) -> None:
        """Feed the core what the bus delivers on ``subject``."""
        self._bus.append(Listener(self.transport, subject, self._on_bus,
                                  queue=self._bus_queue))

    def call(self, fn: Callable[[], object]) -> None:
        """``fn()`` on the loop (now, if this is the loop), then a turn."""
        def run() -> None:
            if self.active:
                fn()
                self.kick()

        self.host.soon(run)

    def kick(self) -> None:
        """A turn, once, at the end of this loop iteration."""
        if not self._turn_due:
            self._turn_due = True
            self.loop.call_soon(self._turn)

    def flush(self) -> None:
        """Send and hand out what the core produced (the subclass's)."""
        raise NotImplementedError

    def present(self, adv: Message) -> None:
        """An advisory, on the transport (logged when nobody takes an ERROR or WARN one)."""
        if not self.transport.present(adv) and is_logged(adv.send_subject or ""):
            log.warning("rv advisory %s", adv.to_text())

    def send(self, out: list[Message], what: str) -> None:
        """Send the core's messages (none once the program closed the transport)."""
        if self.transport.closed:
            return
        for msg in out:
            try:
                self.transport._send(msg, internal=True)
            except Exception as exc:  # noqa: BLE001 - one unsendable message stops no other
                log.error("%s: cannot send to %s: %s", what, msg.send_subject, exc)

    def stop(self) -> None:
        """No more input, no more turns; the bus listeners go."""
        self.active = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for listener in self._bus:
            listener.destroy()
        self._bus_queue.destroy()

    def _on_bus(self, msg: Message, _: Listener) -> None:
        if self.active:
            self.core.receive(msg, time.monotonic())
            self.kick()

    def _tick(self) -> None:
        self._timer = None
        if self.active:
            self.core.tick(time.monotonic())
            self._turn()

    def _turn(self) -> None:
        self._turn_due = False
        if not self.active:
            return
        self.flush()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = self.core.next_deadline()
        if deadline is not None and self.active:
            self._timer = self.loop.call_later(max(0.0, deadline - time.monotonic()),
                                               self._tick)


class ProgramListener:
    """A program's listener on a layer of the bus: ``callback(msg, listener)`` runs when
    ``queue`` is dispatched; then :meth:`confirm` is called unless ``explicit_confirm``
    (the program calls it when it is done)."""

    __slots__ = ("subject", "user_callback", "queue", "active", "explicit")

    def __init__(self, subject: str, callback: Callable[[Message, Any], object],
                 queue: Queue, explicit_confirm: bool) -> None:
        self.subject = subject
        self.user_callback = callback
        self.queue = queue
        self.explicit = explicit_confirm
        self.active = True

    def callback(self, msg: Message, _: object) -> None:
        """Run by the queue: the program's callback, then the automatic confirmation."""
        self.user_callback(msg, self)
        if not self.explicit:
            self.confirm(msg)

    def confirm(self, msg: Message) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.subject!r})"
