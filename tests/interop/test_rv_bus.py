"""The RV-style bus's programming interface and tools over real UDP on loopback.

Transports in this process and in child processes (tests/interop/rvbus_child.py, and the
``gateway rv`` tools) on a service port and a 239.192.x.y group unique to each test, joined on
127.0.0.1 with TTL 0. What is checked is the behaviour TIBCO Rendezvous Concepts describes:
publish/subscribe, local fan-out, ``_LOCAL.`` subjects, inboxes and request/reply
(Fundamentals, "Interaction Patterns", "Inbox Names"), the slow-consumer rule and system
advisories (Appendix A), the service/network binding rule (Transports, "Service Parameter").
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from transports.rv import (
    MAX_MESSAGE,
    AsyncTransport,
    Dispatcher,
    InitFailure,
    Listener,
    Message,
    MessageTooLarge,
    Queue,
    RequestTimeout,
    RvType,
    SubjectError,
    Transport,
    TransportError,
)
from transports.rv.msgtext import parse_field_args

ROOT = Path(__file__).resolve().parents[2]
CHILD = str(Path(__file__).with_name("rvbus_child.py"))


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(cond: Callable[[], Any], timeout: float = 30.0, what: str = "it") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


class Bus:
    """A unique service and network for one test, and what it opened (closed at the end)."""

    def __init__(self) -> None:
        self.service = str(free_udp_port())
        self.network = f"127.0.0.1;239.192.{random.randrange(1, 255)}.{random.randrange(1, 255)}"
        self.transports: list[Transport] = []
        self.children: list[Child] = []
        self.queue = Queue("test")
        self.dispatcher = Dispatcher(self.queue)

    def transport(self, **kw: Any) -> Transport:
        t = Transport(self.service, self.network, ttl=0, **kw)
        self.transports.append(t)
        return t

    def child(self, mode: str, *args: str) -> Child:
        c = Child(self, mode, *args)
        self.children.append(c)
        return c

    def collect(self, t: Any, subject: str) -> list[Message]:
        got: list[Message] = []
        Listener(t, subject, lambda m, _: got.append(m), queue=self.queue)
        return got

    def cli(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "gateway.cli", "rv", args[0], "--service", self.service,
                "--network", self.network, "--ttl", "0", *args[1:]]

    def close(self) -> None:
        for c in self.children:
            c.stop()
        for t in self.transports:
            t.close()
        self.dispatcher.stop()
        self.queue.destroy()


class Child:
    """tests/interop/rvbus_child.py in another process; its messages are kept in ``msgs``."""

    def __init__(self, bus: Bus, mode: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, CHILD, bus.service, bus.network, mode, *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.msgs: list[Message] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        first = self.lines.get(timeout=60)
        if "ready" not in first and "sent" not in first:
            raise AssertionError(f"the child did not start: {first}")
        self.id: str = first.get("ready", "")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            obj = json.loads(line)
            if "msg" in obj:
                self.msgs.append(Message.from_json(obj["msg"]))
            else:
                self.lines.put(obj)
        self.lines.put({"eof": True})

    def stop(self) -> None:
        assert self.proc.stdin is not None
        if not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()  # the child closes its transport and exits
            except BrokenPipeError:
                pass
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def test_script_example_between_processes(bus: Bus) -> None:
    # The package docstring's example, as a script in another process.
    script = (
        "from transports.rv import Transport, Message, Listener, default_queue\n"
        f"t = Transport(service={bus.service!r}, network={bus.network!r}, ttl=0)\n"
        "Listener(t, 'FOO.>', lambda msg, listener: print(msg.send_subject, msg, flush=True))\n"
        "print('ready', flush=True)\n"
        "default_queue().dispatch()\n"
        "t.close()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        t = bus.transport()
        t.send(Message("FOO.BAR").add("x", 1))
        assert proc.stdout.readline().strip() == "FOO.BAR {x=1}"
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_local_fanout_reaches_every_transport_of_the_engine_and_the_network(bus: Bus) -> None:
    remote = bus.child("listen", "FAN.>")
    t1, t2 = bus.transport(), bus.transport()
    got1, got2 = bus.collect(t1, "FAN.>"), bus.collect(t2, "FAN.*")
    t1.send(Message("FAN.A").add("n", 1))
    wait_for(lambda: got1 and got2 and remote.msgs, what="the message everywhere")
    assert got1[0]["n"] == got2[0]["n"] == remote.msgs[0]["n"] == 1
    t2.send(Message("FAN.B").add("n", 2))  # a second message: the first came once only
    wait_for(lambda: len(got1) == 2 and len(got2) == 2 and len(remote.msgs) == 2)
    assert [m["n"] for m in got1] == [m["n"] for m in got2] == [1, 2]


def test_local_subjects_stay_in_the_process(bus: Bus) -> None:
    remote = bus.child("listen", "_LOCAL.>", "MARK.>")
    t1, t2 = bus.transport(), bus.transport()
    local = bus.collect(t2, "_LOCAL.>")
    sent = t1.host.engine.stats.messages_sent if t1.host is not None else -1
    t1.send(Message("_LOCAL.X").add("n", 1))
    t1.send(Message("MARK.X").add("n", 2))
    wait_for(lambda: local and remote.msgs, what="the local message and the marker")
    # the multicast stream is ordered: had _LOCAL.X gone out, it would have come first
    assert [m.send_subject for m in remote.msgs] == ["MARK.X"]
    assert local[0]["n"] == 1
    assert t1.host is not None and t1.host.engine.stats.messages_sent == sent + 1  # MARK only


def test_inbox_reaches_only_its_owner(bus: Bus) -> None:
    owner, other = bus.transport(), bus.transport()
    inbox = owner.create_inbox()
    assert inbox.startswith("_INBOX.7F000001.") and len(inbox.split(".")) == 4
    first, second = bus.collect(owner, inbox), bus.collect(owner, inbox)
    stranger = bus.collect(other, inbox)  # another transport's listener on that name
    bus.child("send", inbox, "3")  # point to point, from another process
    owner.send(Message(inbox).add("n", 3))  # and from this engine
    wait_for(lambda: len(first) == 4 and len(second) == 4, what="two copies of each")
    assert sorted(m["n"] for m in first) == sorted(m["n"] for m in second) == [0, 1, 2, 3]
    marks = bus.collect(other, "MARK.X")
    other.send(Message("MARK.X"))  # queued behind anything the stranger could have had
    wait_for(lambda: marks)
    assert stranger == []


def test_request_reply_across_processes_and_timeout(bus: Bus) -> None:
    bus.child("respond", "REQ.>", "r1")
    t = bus.transport()
    reply = t.send_request(Message("REQ.X").add("n", 21), 30)
    assert reply["id"] == "r1" and reply["echo"] == 21
    assert reply.send_subject is not None and reply.send_subject.startswith("_INBOX.")
    start = time.monotonic()
    with pytest.raises(RequestTimeout):
        t.send_request(Message("NOBODY.X").add("n", 1), 0.3)
    assert time.monotonic() - start >= 0.3
    with pytest.raises(TransportError):
        t.send_reply(Message(), Message("REQ.X"))  # no reply subject


def test_multicast_request_reply_gets_every_reply(bus: Bus) -> None:
    for i in range(3):
        bus.child("respond", "MREQ.>", f"r{i}")
    t = bus.transport()
    inbox = t.create_inbox()
    replies = bus.collect(t, inbox)
    t.send(Message("MREQ.X", reply_subject=inbox).add("n", 7))
    wait_for(lambda: len(replies) == 3, what="three replies")
    assert sorted(m["id"] for m in replies) == ["r0", "r1", "r2"]
    assert {m["echo"] for m in replies} == {7}


def test_slow_consumer_drops_the_oldest_and_says_so_first(bus: Bus) -> None:
    sender = bus.transport()
    slow = bus.transport(max_consumer_buffer=1000)
    q = Queue("slow")  # not dispatched until everything was sent
    events: list[Message] = []
    Listener(slow, "SC.>", lambda m, _: events.append(m), queue=q)
    Listener(slow, "_RV.ERROR.SYSTEM.CLIENT.SLOWCONSUMER", lambda m, _: events.append(m),
             queue=q)
    for i in range(30):
        sender.send(Message("SC.X").add("n", i).add("pad", bytes(60)))
    while q.poll():
        pass
    advisory = events[0]
    assert advisory.send_subject == "_RV.ERROR.SYSTEM.CLIENT.SLOWCONSUMER"
    assert advisory["reason"] == "size limit"
    assert advisory.get_field("dropped").type == RvType.U32
    numbers = [m["n"] for m in events if m.send_subject == "SC.X"]
    dropped = sum(m["dropped"] for m in events if m.send_subject != "SC.X")
    assert numbers == list(range(30 - len(numbers), 30))  # the newest, in order
    assert dropped == 30 - len(numbers) > 0
    # every advisory (one per drop, the last one at the 30th arrival) is ahead of every message
    kinds = [m.send_subject == "SC.X" for m in events]
    assert kinds == sorted(kinds)


def test_advisories_from_another_process_and_for_a_too_large_message(bus: Bus) -> None:
    t = bus.transport()
    adv = bus.collect(t, "_RV.>")
    child = bus.child("listen", "LS.SUBJ")

    def find(subject: str) -> Message | None:
        return next((m for m in list(adv) if m.send_subject == subject), None)

    start = wait_for(lambda: find("_RV.INFO.SYSTEM.LISTEN.START.LS.SUBJ"), what="LISTEN.START")
    assert start["sub"] == "LS.SUBJ" and start["id"] == child.id
    assert start["ADV_CLASS"] == "INFO" and start["ADV_NAME"] == "LISTEN.START.LS.SUBJ"
    child.stop()
    gone = wait_for(lambda: find(f"_RV.INFO.SYSTEM.UNREACHABLE.TRANSPORT.{child.id}"),
                    what="UNREACHABLE.TRANSPORT")
    assert gone["id"] == child.id

    big = Message("BIG.X").add("b", bytes(MAX_MESSAGE + 1))
    with pytest.raises(MessageTooLarge):
        t.send(big)
    del big
    too_large = wait_for(lambda: find("_RV.ERROR.SYSTEM.DATALOSS.MSG_TOO_LARGE"))
    assert too_large["lost"] >= (MAX_MESSAGE + 1) // 1400
    assert too_large.get_field("scid").type == RvType.U16
    assert too_large["scid"] == int(bus.service)
    assert too_large["host"] == "127.0.0.1"

    with pytest.raises(SubjectError):
        t.send(Message("_RV.INFO.SYSTEM.FAKE"))
    with pytest.raises(SubjectError):
        t.send(Message("WILD.*"))
    illegal = wait_for(lambda: [m for m in list(adv)
                                if m.send_subject == "_RV.ERROR.SYSTEM.CLIENT.ILLEGAL_PUBLISH"])
    assert [m["sub"] for m in illegal] == ["_RV.INFO.SYSTEM.FAKE", "WILD.*"]


def test_a_service_is_bound_to_one_network(bus: Bus) -> None:
    t = bus.transport()
    other = bus.network.replace("239.192.", "239.193.")
    with pytest.raises(InitFailure):
        Transport(bus.service, other, ttl=0)
    same = Transport(bus.service, bus.network, ttl=0)  # the same network shares the engine
    assert same.host is t.host
    same.close()
    bus.transports.remove(t)
    t.close()
    moved = Transport(bus.service, other, ttl=0)  # the engine was released
    moved.close()


def test_async_transport_runs_on_the_callers_loop(bus: Bus) -> None:
    bus.child("respond", "AREQ.>", "r9")

    async def main() -> None:
        t = await AsyncTransport.open(bus.service, bus.network, ttl=0)
        try:
            loop_thread = threading.get_ident()
            seen: list[int] = []
            Listener(t, "ALOC.>", lambda m, _: seen.append(threading.get_ident()))
            t.send(Message("ALOC.X"))
            reply = await t.send_request(Message("AREQ.X").add("n", 5), 30)
            assert reply["id"] == "r9" and reply["echo"] == 5
            while not seen:
                await asyncio.sleep(0.01)
            assert seen == [loop_thread]
            with pytest.raises(RequestTimeout):
                await t.send_request(Message("NOBODY.X"), 0.2)
        finally:
            await t.close()

    asyncio.run(main())


def test_cli_listen_json_prints_what_send_sent(bus: Bus) -> None:
    listen = subprocess.Popen(bus.cli("listen", "--json", "--count", "1", "CLI.>"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=ROOT)
    try:
        assert listen.stderr is not None and listen.stdout is not None
        assert "listening to CLI.>" in listen.stderr.readline()
        fields = ["n:i32=-5", "sub.x:f32=1.5", "sub.deep.flag:bool=true", "s=hi",
                  "a:u8array=1,2,3"]
        sent = subprocess.run(bus.cli("send", "CLI.A", *fields), cwd=ROOT, timeout=60)
        assert sent.returncode == 0
        line = listen.stdout.readline()
        assert listen.wait(timeout=30) == 0
    finally:
        if listen.poll() is None:
            listen.kill()
            listen.wait()
        for f in (listen.stdout, listen.stderr):
            if f is not None:
                f.close()
    assert Message.from_json(line) == parse_field_args(fields, Message("CLI.A"))
    assert json.loads(line)["fields"][1]["value"][1]["type"] == "msg"


def test_cli_request_prints_the_reply_and_fails_on_timeout(bus: Bus) -> None:
    t = bus.transport()
    Listener(t, "CREQ.>", lambda m, _: t.send_reply(Message().add("answer", m["q"] + "!"), m),
             queue=bus.queue)
    done = subprocess.run(bus.cli("request", "--json", "CREQ.X", "q=hello"), cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert Message.from_json(done.stdout)["answer"] == "hello!"
    done = subprocess.run(bus.cli("request", "--timeout", "0.3", "NOBODY.X", "q=1"), cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "no reply" in done.stderr


def test_engine_advisories_reach_every_transport_and_unheard_errors_are_logged(
        bus: Bus, caplog: pytest.LogCaptureFixture) -> None:
    from transports.rv.events import DATALOSS_INBOUND_BCAST, RETRANSMISSION_OUTBOUND_SENT, Advisory

    bus.transport()
    t1, t2 = bus.transport(), bus.transport()
    got1, got2 = bus.collect(t1, "_RV.ERROR.SYSTEM.DATALOSS.>"), bus.collect(t2, "_RV.*.SYSTEM.>")
    host = t1.host
    assert host is not None
    adv = Advisory(DATALOSS_INBOUND_BCAST, {"host": "127.0.0.9", "lost": 4, "scid": 7})
    host.loop.call_soon_threadsafe(host.on_events, [adv])  # as the engine hands it over
    wait_for(lambda: got1 and got2)
    for m in (got1[0], got2[0]):
        assert m.send_subject == DATALOSS_INBOUND_BCAST and m["lost"] == 4
        assert [f.type for f in m][3:] == [RvType.STRING, RvType.U32, RvType.U16]
    for t in (t1, t2):  # the engine stays, with a transport that listens to nothing
        bus.transports.remove(t)
        t.close()
    caplog.set_level("WARNING", logger="transports.rv")
    done = threading.Event()
    host.loop.call_soon_threadsafe(lambda: (host.on_events([
        Advisory(RETRANSMISSION_OUTBOUND_SENT, {"host": "127.0.0.9", "lost": 1}), adv]),
        done.set()))
    assert done.wait(30)
    logged = [r.getMessage() for r in caplog.records if r.name == "transports.rv"]
    assert any("DATALOSS.INBOUND.BCAST" in x for x in logged)  # an ERROR nobody heard
    assert not any("RETRANSMISSION" in x for x in logged)  # an INFO: dropped


def test_fast_producer_is_told_when_its_sends_wait_and_nothing_is_discarded(
        bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    from transports.rv import host as host_module

    monkeypatch.setattr(host_module, "FAST_PRODUCER_WAIT", 0.3)  # Rendezvous: 5 s
    remote = bus.child("listen", "FP.>")
    t = bus.transport()
    got = bus.collect(t, "_RV.WARN.SYSTEM.CLIENT.FASTPRODUCER")
    host = t.host
    assert host is not None
    blocked = threading.Event()

    def stall() -> None:  # the I/O thread busy for longer than the limit
        blocked.set()
        time.sleep(0.6)

    host.loop.call_soon_threadsafe(stall)
    assert blocked.wait(30)
    for i in range(3):
        t.send(Message("FP.X").add("n", i))
    wait_for(lambda: got and len(remote.msgs) == 3, what="the advisory and every message")
    assert got[0]["waiting"] == 3 and got[0].get_field("waiting").type == RvType.U32
    assert [m["n"] for m in remote.msgs] == [0, 1, 2]


def test_host_status_is_multicast_periodically(bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    from ipaddress import IPv4Address

    from transports.rv import host as host_module

    monkeypatch.setattr(host_module, "HOST_STATUS_INTERVAL", 0.2)  # Rendezvous: 90 s
    remote = bus.child("listen", "_RV.INFO.SYSTEM.HOST.STATUS.>")
    t = bus.transport()
    local = bus.collect(t, "_RV.INFO.SYSTEM.HOST.STATUS.7F000001")
    wait_for(lambda: remote.msgs and len(local) >= 2, what="HOST.STATUS, twice here")
    status = remote.msgs[0]
    assert status.send_subject == "_RV.INFO.SYSTEM.HOST.STATUS.7F000001"
    assert status["hostaddr"] == IPv4Address("127.0.0.1")
    assert status["service"] == bus.service and status["network"] == bus.network
    assert status["cc"] == 1
    types = {f.name: f.type for f in status}
    assert types["hostaddr"] == RvType.IPADDR32 and types["time"] == RvType.DATETIME
    assert types["ms"] == types["pr"] == types["odl"] == RvType.U64
    assert types["ipport"] == RvType.IPPORT16 and types["up"] == RvType.U32
