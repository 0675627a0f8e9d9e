"""Virtual circuits (transports/rv/vc.py): set-up through an invitation, order, exclusivity,
a graceful close, and a terminal killed with SIGKILL in another process (TIBCO Rendezvous
Concepts, Transports, "Virtual Circuits")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_rv_bus import ROOT, Bus, wait_for

from transports.rv import Listener, Message, TransportError
from transports.rv.vc import VC_CONNECTED, VC_DISCONNECTED_ERROR, VC_DISCONNECTED_INFO, VcTransport

CHILD = str(Path(__file__).with_name("rvvc_child.py"))
HB = 0.5


def advisories(bus: Bus, vc: VcTransport) -> list[Message]:
    got: list[Message] = []
    Listener(vc, "_RV.*.SYSTEM.VC.>", lambda m, _: got.append(m), queue=bus.queue)
    return got


def test_a_circuit_connects_carries_messages_in_order_and_closes(bus: Bus) -> None:
    t = bus.transport()
    accept = VcTransport.create_accept(t, heartbeat=HB)
    seen_a = advisories(bus, accept)
    got: list[Message] = []
    Listener(accept, "ORDERS.>", lambda m, _: got.append(m), queue=bus.queue)
    # The invitation: an ordinary message whose reply subject is the connect subject.
    invitations: list[Message] = []
    other = bus.transport()
    Listener(other, "SVC.INVITE", lambda m, _: invitations.append(m), queue=bus.queue)
    t.send(Message("SVC.INVITE", reply_subject=accept.connect_subject))
    wait_for(lambda: invitations, what="the invitation")
    connect = VcTransport.create_connect(other, invitations[0].reply_subject or "",
                                         heartbeat=HB)
    seen_c = advisories(bus, connect)
    with pytest.raises(TransportError, match="not connected"):
        VcTransport.create_accept(t, heartbeat=HB).send(Message("X.Y"))
    assert connect.wait_for_vc_connection(10) and accept.wait_for_vc_connection(10)
    wait_for(lambda: [m.send_subject for m in seen_a + seen_c] == [VC_CONNECTED] * 2,
             what="VC.CONNECTED at both terminals")
    for n in range(50):
        connect.send(Message("ORDERS.NEW").add("n", n))
    wait_for(lambda: len(got) == 50, what="the messages")
    assert [m.get("n") for m in got] == list(range(50))
    time.sleep(4 * HB)  # heartbeats keep it up
    assert accept.wait_for_vc_connection(0)
    connect.close()
    wait_for(lambda: any(m.send_subject == VC_DISCONNECTED_INFO for m in seen_a),
             what="VC.DISCONNECTED (INFO) at the other terminal")
    assert not accept.wait_for_vc_connection(0)
    with pytest.raises(TransportError, match="disconnected"):
        accept.send(Message("ORDERS.NEW"))
    accept.close()


def test_a_circuit_is_exclusive(bus: Bus) -> None:
    t = bus.transport()
    accept = VcTransport.create_accept(t, heartbeat=HB)
    got: list[Message] = []
    Listener(accept, "A.>", lambda m, _: got.append(m), queue=bus.queue)
    first = VcTransport.create_connect(bus.transport(), accept.connect_subject or "",
                                       heartbeat=HB)
    assert first.wait_for_vc_connection(10)
    intruder = VcTransport.create_connect(bus.transport(), accept.connect_subject or "",
                                          heartbeat=HB)
    assert not intruder.wait_for_vc_connection(5 * HB)
    # Nor can anyone send into the circuit by its inbox.
    bus.transport().send(Message(accept.connect_subject or "").add("op", "DATA"))
    first.send(Message("A.B").add("n", 1))
    wait_for(lambda: got, what="the circuit's message")
    time.sleep(2 * HB)
    assert [m.get("n") for m in got] == [1]
    for vc in (intruder, first, accept):
        vc.close()


def test_a_killed_terminal_disconnects_the_circuit(bus: Bus) -> None:
    t = bus.transport()
    accept = VcTransport.create_accept(t, heartbeat=HB)
    seen = advisories(bus, accept)
    echoes: list[Message] = []
    Listener(accept, "ECHO.>", lambda m, _: echoes.append(m), queue=bus.queue)
    child = subprocess.Popen(
        [sys.executable, CHILD, bus.service, bus.network, accept.connect_subject or "",
         str(HB)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == '{"connected": true}'
        assert accept.wait_for_vc_connection(10)
        for n in range(100):
            accept.send(Message("ORDERS.NEW").add("n", n))
        wait_for(lambda: len(echoes) == 100, what="the echoes")
        assert [m.get("n") for m in echoes] == list(range(100))
        assert {m.send_subject for m in echoes} == {"ECHO.ORDERS.NEW"}
        killed_at = time.monotonic()
        child.send_signal(signal.SIGKILL)
        child.wait()
        wait_for(lambda: any(m.send_subject == VC_DISCONNECTED_ERROR for m in seen),
                 what="VC.DISCONNECTED (ERROR)")
        assert time.monotonic() - killed_at >= 2 * HB  # lost after missed heartbeats
        with pytest.raises(TransportError):
            accept.send(Message("ORDERS.NEW"))
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for f in (child.stdin, child.stdout):
            if f is not None:
                f.close()
        accept.close()
