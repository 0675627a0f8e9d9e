"""Routers between RV-style buses (transports/rv/router.py) as real processes on loopback.

Every bus of a test is one multicast group on 127.0.0.1 (239.192.8x.y), all on one service
port, so the routers' private engines share the port (TIBCO Rendezvous Administration,
"Routing Daemon (rvrd)": a routing daemon links networks; here they may share a service).
Programs are tests/interop/rvroute_child.py processes; routers are ``gateway rv route``
processes, or a gateway running ``routers.conf``. Nothing waits a fixed time: each step
waits for the condition it needs (a probe crossing, a router having heard the others, an
end marker arriving after the data).
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from jsonchild import JsonChild
from test_rv_bus import free_udp_port, wait_for
from test_rv_certified import CmChild

ROOT = Path(__file__).resolve().parents[2]
CHILD = str(Path(__file__).with_name("rvroute_child.py"))


class Prog(JsonChild):
    """A program on one bus; the messages it receives are kept in :attr:`msgs`."""

    def __init__(self, service: str, network: str) -> None:
        self.msgs: list[dict[str, Any]] = []
        super().__init__(CHILD, service, network)

    def take(self, obj: dict[str, Any]) -> bool:
        if "msg" in obj:
            self.msgs.append(obj["msg"])
            return True
        return False

    def do(self, command: str, key: str) -> dict[str, Any]:
        """Send a command and return its answer (the first line with ``key``)."""
        self.say(command)
        while True:
            obj = self.lines.get(timeout=60)
            if key in obj:
                return obj

    def ns(self, subject: str) -> list[int]:
        return [m["n"] for m in list(self.msgs) if m["subject"] == subject]

    def has(self, subject: str) -> bool:
        return any(m["subject"] == subject for m in list(self.msgs))


class Proc:
    """A process whose standard error (or output) lines are kept."""

    def __init__(self, args: list[str], stream: str = "stderr") -> None:
        self.proc = subprocess.Popen(
            args, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        self.text: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.text.append(line)

    def said(self, text: str) -> bool:
        if self.proc.poll() is not None and not any(text in x for x in self.text):
            raise AssertionError(f"the process ended: {''.join(self.text)}")
        return any(text in x for x in list(self.text))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(timeout=10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


class Routed:
    """One test's service, buses, programs and routers (all stopped at the end)."""

    def __init__(self) -> None:
        self.service = str(free_udp_port())
        self.third = random.randrange(80, 90)
        self.fourth = random.randrange(1, 250)
        self.count = 0
        self.progs: list[Prog] = []
        self.procs: list[Proc] = []

    def network(self) -> str:
        self.count += 1
        return f"127.0.0.1;239.192.{self.third}.{self.fourth + self.count}"

    def prog(self, network: str) -> Prog:
        p = Prog(self.service, network)
        self.progs.append(p)
        return p

    def router(self, name: str, *buses: tuple[str, str], forward: tuple[str, ...] = ()) -> Proc:
        args = [sys.executable, "-m", "gateway.cli", "rv", "route", "--name", name,
                "--ttl", "0", "--interval", "0.5"]
        for subject in forward:
            args += ["--forward", subject]
        for bus, network in buses:
            args += ["--bus", bus, self.service, network]
        p = Proc(args)
        self.procs.append(p)
        wait_for(lambda: p.said("gateway rv: routing"), what=f"router {name} running")
        return p

    def close(self) -> None:
        for p in self.progs:
            p.stop()
        for r in self.procs:
            r.stop()


@pytest.fixture
def routed() -> Iterator[Routed]:
    r = Routed()
    try:
        yield r
    finally:
        r.close()


def warm(sender: Prog, subject: str, listeners: list[Prog]) -> None:
    """Send ``subject`` until every listener has one (interest has crossed the routers)."""
    n = 0

    def arrived() -> bool:
        nonlocal n
        if all(p.has(subject) for p in listeners):
            return True
        sender.do(f"send {subject} {n} {n}", "sent")
        n += 1
        return False

    wait_for(arrived, what=f"{subject} crossing")


def test_a_listener_gets_what_another_bus_sends_only_once_it_listens(routed):
    a, b = routed.network(), routed.network()
    sender, far = routed.prog(a), routed.prog(b)
    routed.router("R", ("PLANT", a), ("OFFICE", b))
    sender.do("send T.DATA 0 9", "sent")  # nobody listens on OFFICE: nothing crosses
    far.do("listen T.>", "listening")
    warm(sender, "T.WARM", [far])
    sender.do("send T.DATA 10 59", "sent")
    sender.do("send T.END 0 0", "sent")
    wait_for(lambda: far.has("T.END"), what="the end marker")
    assert far.ns("T.DATA") == list(range(10, 60))
    assert {tuple(m["route"]) for m in far.msgs} == {("PLANT", 1)}


def test_request_reply_through_the_router_with_an_inbox(routed):
    a, b = routed.network(), routed.network()
    client, server = routed.prog(a), routed.prog(b)
    server.do("respond SVC.TIME OFFICE", "responding")
    routed.router("R", ("PLANT", a), ("OFFICE", b))
    n = 0

    # the first requests may go before the router knows of the responder: retry until one is
    # answered, then every request is
    def one() -> dict[str, Any]:
        nonlocal n
        n += 1
        client.say(f"request SVC.TIME {n} 2")
        while True:
            obj = client.lines.get(timeout=60)
            if "reply" in obj or "timeout" in obj:
                return obj

    wait_for(lambda: "reply" in one(), what="a first reply")
    for _ in range(3):
        got = one()
        assert got == {"reply": {"tag": "OFFICE", "echo": n}}


def test_a_triangle_of_routers_delivers_each_message_once_per_bus(routed):
    nets = {bus: routed.network() for bus in "ABC"}
    listeners = {bus: routed.prog(nets[bus]) for bus in "ABC"}
    senders = {bus: routed.prog(nets[bus]) for bus in "ABC"}
    for p in listeners.values():
        p.do("listen T.>", "listening")
    routers = {name: routed.router(name, (name[0], nets[name[0]]), (name[1], nets[name[1]]))
               for name in ("AB", "BC", "CA")}
    for name, r in routers.items():
        for other in routers:
            if other != name:
                wait_for(lambda r=r, other=other: r.said(f"heard router {other} "),
                         what=f"{name} hearing {other}")
    for bus, s in senders.items():
        warm(s, f"T.{bus}.WARM", list(listeners.values()))
    for bus, s in senders.items():
        s.do(f"send T.{bus}.DATA 0 29", "sent")
        s.do(f"send T.{bus}.END 0 0", "sent")
    for p in listeners.values():
        wait_for(lambda p=p: all(p.has(f"T.{bus}.END") for bus in "ABC"), what="the ends")
    for here, p in listeners.items():
        for origin in "ABC":
            assert p.ns(f"T.{origin}.DATA") == list(range(30)), (here, origin)
            routes = {None if m["route"] is None else tuple(m["route"])
                      for m in p.msgs if m["subject"].startswith(f"T.{origin}.")}
            assert routes == ({None} if origin == here else {(origin, 1)}), (here, origin)


def test_the_gateway_runs_a_router_from_routers_conf(routed, tmp_path):
    a, b = routed.network(), routed.network()
    conf = tmp_path / "conf"
    conf.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        http = s.getsockname()[1]
    (conf / "gateway.conf").write_text(
        f"listen = http://127.0.0.1:{http}\nstore = {tmp_path / 'data'}\n")
    (conf / "routers.conf").write_text(
        "[GW-ROUTER]\n"
        f'bus = PLANT {routed.service} "{a}"\n'
        f"bus = OFFICE {routed.service} {b}\n"
        "interval = 500 msec\nttl = 0\n")
    gw = Proc([sys.executable, "-m", "gateway", "serve", "--config-dir", str(conf)])
    routed.procs.append(gw)
    wait_for(lambda: gw.said("gateway ready"), what="the gateway ready")
    sender, far = routed.prog(a), routed.prog(b)
    far.do("listen ORDERS.>", "listening")
    warm(sender, "ORDERS.WARM", [far])
    sender.do("send ORDERS.NEW 0 19", "sent")
    sender.do("send ORDERS.END 0 0", "sent")
    wait_for(lambda: far.has("ORDERS.END"), what="the end marker")
    assert far.ns("ORDERS.NEW") == list(range(20))


def test_certified_delivery_across_a_router(routed, tmp_path):
    """A certified sender on one bus, a persistent certified listener on another, a router
    forwarding ``_RVCM.>`` (the control traffic of certified delivery) between them: the
    registration, every message in order and every confirmation cross it."""
    a, b = routed.network(), routed.network()
    listener = CmChild(SimpleNamespace(service=routed.service, network=b), "listen", "L",
                       tmp_path / "l.ledger")
    sender = CmChild(SimpleNamespace(service=routed.service, network=a), "send", "S",
                     tmp_path / "s.ledger")
    try:
        routed.router("R", ("PLANT", a), ("OFFICE", b), forward=("_RVCM.>",))

        def certified() -> bool:  # (the first ones may go before the router knows L listens)
            sender.say("0 0 1")
            assert sender.lines.get(timeout=60) == {"sent": 0}
            return listener.certified == ["S"]

        wait_for(certified, what="the registration across the router")
        sender.say("1 100 500")
        assert sender.lines.get(timeout=60) == {"sent": 100}
        wait_for(lambda: [n for n, seq in listener.got if seq and n] == list(range(1, 101)),
                 what="every certified message, in order")

        def stored() -> int:
            sender.say("stored")
            return int(sender.lines.get(timeout=30)["stored"])

        wait_for(lambda: stored() == 0, what="every confirmation back across the router")
    finally:
        listener.stop()
        sender.stop()
