"""adapters/amqp/driver.py on its own: a server-mode proton engine under EngineDriver, a
client-mode proton engine as its peer, bytes handed between them by the test, the event loop
and the clock stood in for so that timers and ticks are exact (AMQP 1.0 §2.4.5 idle timeout)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from proton import Condition, Connection, Event, Transport

import adapters.amqp.driver as driver_mod
from adapters.amqp.driver import EngineDriver, decode_message, encode_message
from gateway.message import QUEUE, Destination, Message
from mappings.amqp import amqp_to_message
from mappings.engine import MappingSet

EMPTY_FRAME = b"\x00\x00\x00\x08\x02\x00\x00\x00"  # AMQP 1.0 §2.3.2: an empty frame


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class Handle:
    def __init__(self, delay: float, fn: Callable[[], None]) -> None:
        self.delay, self.fn, self.cancelled = delay, fn, False

    def cancel(self) -> None:
        self.cancelled = True

    def fire(self) -> None:
        self.cancelled = True  # done: no longer armed
        self.fn()


class Loop:
    """What the driver asks of the event loop, recorded."""

    def __init__(self) -> None:
        self.soon: list[Callable[[], None]] = []
        self.later: list[Handle] = []

    def call_soon(self, fn: Callable[[], None]) -> None:
        self.soon.append(fn)

    def call_later(self, delay: float, fn: Callable[[], None]) -> Handle:
        h = Handle(delay, fn)
        self.later.append(h)
        return h

    def armed(self) -> list[Handle]:
        return [h for h in self.later if not h.cancelled]


class Pair:
    """A driven server engine and a client engine that advertises ``client_idle`` seconds."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, server_idle: float = 0.0,
                 client_idle: float = 0.0,
                 handlers: dict[int, Callable[[Any], None]] | None = None) -> None:
        self.clock = Clock()
        monkeypatch.setattr(driver_mod, "time", self.clock)
        self.loop = Loop()
        self.written: list[bytes] = []
        self.over = 0
        st = Transport(Transport.SERVER)
        st.idle_timeout = server_idle
        self.driver = EngineDriver(
            self.loop, st, Connection(), write=self.written.append,  # type: ignore[arg-type]
            handlers=handlers if handlers is not None else {
                Event.CONNECTION_REMOTE_OPEN.number: lambda ev: ev.connection.open(),
                Event.CONNECTION_REMOTE_CLOSE.number: lambda ev: ev.connection.close(),
            },
            links={}, on_delivery=lambda h, dlv: None, on_over=self._over,
            on_push_error=lambda text: None, label="test", logger=logging.getLogger("test"))
        self.client = Transport()
        self.client.idle_timeout = client_idle
        self.cconn = Connection()
        self.client.bind(self.cconn)
        self.cconn.open()

    def _over(self) -> None:
        self.over += 1

    def to_server(self) -> None:
        n = self.client.pending()
        if n > 0:
            data = self.client.peek(n)
            self.client.pop(n)
            self.driver.receive_data(data)

    def to_client(self) -> bytes:
        data = b"".join(self.written)
        self.written.clear()
        if data:
            self.client.push(data)
        return data


def test_the_open_exchange_is_written_once_per_read(monkeypatch: pytest.MonkeyPatch) -> None:
    p = Pair(monkeypatch)
    p.to_server()
    assert len(p.written) == 1  # header and open together
    p.to_client()
    assert p.cconn.state & Connection.REMOTE_ACTIVE
    assert p.driver.transport.pending() == 0


def test_a_heartbeat_the_tick_makes_leaves_in_the_same_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    """The peer announced an idle timeout: an empty frame goes out within half of it, written
    by the flush whose tick made it, not left for a later read or timer (§2.4.5)."""
    p = Pair(monkeypatch, client_idle=2.0)
    p.to_server()
    p.to_client()
    sent = b""
    for _ in range(3):  # the first deadline only notes what was written since the open
        timer = p.loop.armed()
        assert len(timer) == 1 and 0 < timer[0].delay <= 1.0  # the keepalive deadline
        p.clock.now += timer[0].delay
        timer[0].fire()
        assert p.driver.transport.pending() == 0  # whatever the tick made has been written
        sent = p.to_client()
        if sent:
            break
    assert sent == EMPTY_FRAME
    assert len(p.loop.armed()) == 1  # re-armed by that tick


def test_a_silent_peer_gets_the_close_when_the_idle_timeout_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    """Our idle timeout: the tick that finds the peer silent closes the connection, and that
    close is written at once (§2.4.5, §2.7.9); once the peer's close is in, the output side
    is over and the owner is told once."""
    p = Pair(monkeypatch, server_idle=4.0)
    p.to_server()
    p.to_client()
    p.clock.now += 10.0
    p.driver.flush()
    p.to_client()
    cond = p.cconn.remote_condition
    assert cond is not None and "idle-timeout" in (cond.description or "")
    p.cconn.close()
    p.to_server()
    assert p.over == 1 and p.driver.closed
    assert not p.loop.armed()


def test_one_timer_at_the_earliest_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    p = Pair(monkeypatch)
    d = p.driver
    d._arm(1010.0, 1000.0)
    d._arm(1020.0, 1000.0)  # later: the armed timer fires first and ticks again then
    assert [h.delay for h in p.loop.armed()] == [10.0]
    d._arm(1005.0, 1000.0)  # earlier: the timer moves
    assert [h.delay for h in p.loop.armed()] == [5.0] and d.deadline == 1005.0
    p.loop.armed()[0].fire()
    assert d.timer is None or d.timer.delay != 5.0  # type: ignore[attr-defined]


def test_changed_schedules_one_flush_per_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    p = Pair(monkeypatch)
    p.driver.changed()
    p.driver.changed()
    assert len(p.loop.soon) == 1
    p.loop.soon.pop()()
    p.driver.changed()
    assert len(p.loop.soon) == 1


def test_a_handler_that_raises_closes_the_connection_with_internal_error(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def broken(ev: Any) -> None:
        ev.connection.open()
        raise RuntimeError("a bug")

    p = Pair(monkeypatch, handlers={Event.CONNECTION_REMOTE_OPEN.number: broken})
    with caplog.at_level(logging.ERROR, logger="test"):
        p.to_server()
        p.loop.soon.pop()()  # fail() asked for a flush
    assert "error handling event" in caplog.text
    p.to_client()
    cond = p.cconn.remote_condition
    assert isinstance(cond, Condition) and cond.name == "amqp:internal-error"


def test_input_after_the_close_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    p = Pair(monkeypatch)
    p.driver.close()
    p.to_server()
    assert p.written == [] and not p.loop.armed()


# -- the wire mapping: the fast codec exactly when the mapping set says the default applies ----

PLANT = Destination.queue("plant.a")
OTHER = Destination.queue("other")
WIRE_RULE = """\
mappings:
  - name: device type
    match: {destination: "plant.>", protocol: amqp, direction: in}
    steps:
      - copy: {from: wire.properties.subject, to: header.JMSType}
"""


def test_wire_is_default_says_where_a_user_rule_addresses_the_wire() -> None:
    ms = MappingSet.from_text(WIRE_RULE, "m.yaml")
    assert not ms.wire_is_default(PLANT, protocol="amqp", direction="in")
    assert ms.wire_is_default(OTHER, protocol="amqp", direction="in")
    assert ms.wire_is_default(PLANT, protocol="amqp", direction="out")
    assert MappingSet().wire_is_default(PLANT, protocol="amqp", direction="in")


def test_decode_and_encode_take_the_rules_where_they_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    msg = Message.text("hello", destination=PLANT)
    msg.type = None
    data = encode_message(msg, None, transport=None, delivery_count=1, now_ms=5)
    ms = MappingSet.from_text(WIRE_RULE, "m.yaml")
    fast_calls: list[int] = []
    real = driver_mod.fast_decode

    def counting(*a: Any, **kw: Any) -> Any:
        fast_calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(driver_mod, "fast_decode", counting)
    got = decode_message(bytearray(data), OTHER, ms, transport=None, default_kind=QUEUE, now_ms=5)
    assert fast_calls and got.body == "hello"
    fast_calls.clear()
    got = decode_message(bytearray(data), PLANT, ms, transport=None, default_kind=QUEUE, now_ms=5)
    assert not fast_calls and got.body == "hello"
    assert ms.wire_for(PLANT, protocol="amqp", direction="in") is not amqp_to_message
