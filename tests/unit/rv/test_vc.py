"""Virtual circuits (transports/rv/vc.py, VcCore) on a virtual clock: connecting with the
CONNECT retried until accepted, exclusivity, order, the heartbeat loss found after three
heartbeats, a message lost on the way, a graceful close, and no reconnection after any of
them."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from transports.rv.codec import decode, encode
from transports.rv.message import Message
from transports.rv.transport import TransportError
from transports.rv.vc import (
    LOST_HEARTBEATS,
    VC_CONNECTED,
    VC_DISCONNECTED_ERROR,
    VC_DISCONNECTED_INFO,
    VcCore,
    VcData,
)

HB = 1.0


class Terminal:
    def __init__(self, net: VcNet, name: str, peer: str | None) -> None:
        self.core = VcCore(f"_INBOX.{name}", peer=peer, heartbeat=HB, now=net.now)
        self.advisories: list[tuple[float, Message]] = []
        self.got: list[Message] = []
        self.up = True

    def subjects(self) -> list[str]:
        return [a.send_subject or "" for _, a in self.advisories]


class VcNet:
    """Terminals whose messages reach the terminal owning the destination inbox, encoded and
    decoded on the way, unless ``drop`` says otherwise."""

    def __init__(self) -> None:
        self.now = 100.0
        self.terminals: list[Terminal] = []
        self.drop: Callable[[Terminal, Message], bool] | None = None

    def accept(self, name: str = "acc") -> Terminal:
        t = Terminal(self, name, None)
        self.terminals.append(t)
        return t

    def connect(self, to: Terminal, name: str = "con") -> Terminal:
        t = Terminal(self, name, to.core.inbox)
        self.terminals.append(t)
        return t

    def step(self) -> bool:
        moved = False
        for t in self.terminals:
            if not t.up:
                continue
            out, events = t.core.flush()
            for ev in events:
                moved = True
                if isinstance(ev, VcData):
                    t.got.append(ev.msg)
                else:
                    t.advisories.append((self.now, ev))
            for msg in out:
                moved = True
                if self.drop is not None and self.drop(t, msg):
                    continue
                for other in self.terminals:
                    if other.up and other.core.inbox == msg.send_subject:
                        other.core.receive(decode(encode(msg)), self.now)
        return moved

    def run(self, until: float) -> None:
        while True:
            while self.step():
                pass
            deadlines = [d for t in self.terminals
                         if t.up and (d := t.core.next_deadline()) is not None]
            nxt = min(deadlines) if deadlines else None
            if nxt is None or nxt > until:
                self.now = until
                return
            self.now = max(nxt, self.now)
            for t in self.terminals:
                if t.up:
                    t.core.tick(self.now)


def connected_pair() -> tuple[VcNet, Terminal, Terminal]:
    net = VcNet()
    acc = net.accept()
    con = net.connect(acc)
    net.run(net.now + 0.5)
    assert acc.core.connected and con.core.connected
    assert acc.subjects() == [VC_CONNECTED] and con.subjects() == [VC_CONNECTED]
    return net, acc, con


def test_connect_carries_messages_in_order_both_ways() -> None:
    net, acc, con = connected_pair()
    for n in range(20):
        con.core.send(encode(Message("ORDERS.NEW").add("n", n)))
        acc.core.send(encode(Message("RESULTS.X").add("n", n)))
    net.run(net.now + 10)  # heartbeats keep it up meanwhile
    assert [m.get("n") for m in acc.got] == list(range(20))
    assert [m.send_subject for m in con.got] == ["RESULTS.X"] * 20
    assert acc.core.connected and not acc.core.disconnected


def test_the_connect_terminal_asks_again_until_accepted() -> None:
    net = VcNet()
    acc = net.accept()
    lost = {"n": 2}

    def drop(t: Terminal, msg: Message) -> bool:
        if msg.get("op") == "CONNECT" and lost["n"]:
            lost["n"] -= 1
            return True
        return False

    net.drop = drop
    con = net.connect(acc)
    net.run(net.now + 1.5)
    assert not con.core.connected
    net.run(net.now + 1.0)
    assert con.core.connected and acc.core.connected  # the third CONNECT, at +2 heartbeats
    assert con.advisories[0][0] == pytest.approx(102.0)


def test_a_circuit_is_exclusive() -> None:
    net, acc, con = connected_pair()
    intruder = net.connect(acc, "intruder")
    net.run(net.now + 5)
    assert not intruder.core.connected and not intruder.subjects()
    # Nor does a message from outside the circuit get in, whatever it claims.
    forged = Message(acc.core.inbox, reply_subject="_INBOX.intruder").add("op", "DATA")
    acc.core.receive(forged, net.now)
    net.run(net.now + 1)
    assert not acc.got and acc.core.connected


@pytest.mark.parametrize("silent", ["acc", "con"])
def test_a_lost_terminal_disconnects_after_three_heartbeats(silent: str) -> None:
    net, acc, con = connected_pair()
    gone, stays = (acc, con) if silent == "acc" else (con, acc)
    last_heard = net.now
    gone.up = False  # killed: sends nothing any more
    net.run(net.now + 10)
    assert stays.core.disconnected
    when, adv = stays.advisories[-1]
    assert adv.send_subject == VC_DISCONNECTED_ERROR
    assert adv.get("description") == "lost the other terminal's heartbeat"
    # After more than three heartbeats of silence, found at the next heartbeat.
    assert LOST_HEARTBEATS * HB < when - last_heard <= (LOST_HEARTBEATS + 1) * HB
    with pytest.raises(TransportError, match="disconnected"):
        stays.core.send(b"")


def test_a_message_lost_on_the_way_disconnects_both() -> None:
    net, acc, con = connected_pair()
    sent = {"n": 0}

    def drop_second(t: Terminal, msg: Message) -> bool:
        if msg.get("op") == "DATA":
            sent["n"] += 1
            return sent["n"] == 2
        return False

    net.drop = drop_second
    for n in range(3):
        con.core.send(encode(Message("A.B").add("n", n)))
    net.run(net.now + 10)
    assert [m.get("n") for m in acc.got] == [0]  # nothing past the loss
    assert acc.subjects()[-1] == VC_DISCONNECTED_ERROR
    assert acc.advisories[-1][1].get("description") == "data lost on the circuit"
    # The other side finds the circuit gone when the heartbeats stop.
    assert con.subjects()[-1] == VC_DISCONNECTED_ERROR


def test_close_tells_the_other_terminal_and_nothing_reconnects() -> None:
    net, acc, con = connected_pair()
    con.core.close()
    net.run(net.now + 10)
    assert acc.subjects() == [VC_CONNECTED, VC_DISCONNECTED_INFO]
    assert con.subjects() == [VC_CONNECTED]  # the closing terminal presents nothing more
    assert acc.core.next_deadline() is None and con.core.next_deadline() is None
    late = net.connect(acc, "late")
    net.run(net.now + 5)
    assert not late.core.connected  # a disconnected terminal never connects again


def test_sending_before_the_connection_is_refused() -> None:
    net = VcNet()
    acc = net.accept()
    with pytest.raises(TransportError, match="not connected"):
        acc.core.send(b"")
    with pytest.raises(ValueError):
        VcCore("_INBOX.x", peer=None, heartbeat=0, now=0.0)
