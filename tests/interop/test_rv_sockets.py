"""The RV-style bus's sockets and asyncio shell over real UDP on loopback, across processes.

Each test runs shells with a stand-in engine (tests/rvstandin.py: it sends what it is told
and reports every datagram it receives) in the test process and in child processes, on a
free service port and a 239.192.75.x group joined on 127.0.0.1. What is checked is what the
sockets promise (TIBCO Rendezvous Concepts, Transports, Network Transport Parameters):
processes on one host share a service (SO_REUSEPORT) and each gets every multicast
datagram; an inbox port is one process's own; broadcast mode with no group; the multicast
TTL; ports free again after close; send errors never stop the shell; one timer ticks the
engine. One test runs two real engines (transports/rv/engine.py) to check that a long burst
loss under continuing traffic is repaired over real sockets. The last test runs the true defaults (service 7500, network "" = broadcast on the
host's interface) inside a network namespace it creates, so nothing leaves it.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import json
import os
import queue
import random
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import rvstandin
from rvstandin import StandInEngine

from transports.rv.engine import DATALOSS_INBOUND_BCAST, Advisory, Delivered, Engine
from transports.rv.net import ParameterError
from transports.rv.packet import DATA, HEADER_LEN, RETRANS
from transports.rv.shell import Shell

ROOT = Path(__file__).resolve().parents[2]
STANDIN = Path(rvstandin.__file__).resolve()
LOOPS = ["asyncio", "uvloop"]


def run(coro: Coroutine[Any, Any, None], loop: str) -> None:
    if loop == "uvloop":
        import uvloop

        uvloop.run(coro)
    else:
        asyncio.run(coro)


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("", 0))
        port: int = s.getsockname()[1]
        return port


def loopback_network() -> str:
    return f"127.0.0.1;239.192.75.{random.randrange(1, 255)}"


async def wait_until(cond: Callable[[], Any], timeout: float = 20.0, what: str = "it") -> Any:
    """Poll ``cond`` while the loop keeps running; fail after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = cond()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


class Child:
    """A shell with a stand-in engine in another process (tests/rvstandin.py)."""

    def __init__(self, service: str | None, network: str, ttl: int = 1,
                 loop: str = "asyncio") -> None:
        args = [sys.executable, str(STANDIN), "--network", network, "--ttl", str(ttl),
                "--loop", loop]
        if service is not None:
            args += ["--service", service]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, cwd=ROOT)
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.got: list[tuple[bytes, tuple[str, int]]] = []
        self.closed = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        first = self.lines.get(timeout=30)
        if "error" in first:
            raise AssertionError(f"child could not start: {first['error']}")
        self.inbox: tuple[str, int] = (first["ready"][0], first["ready"][1])
        self.service: int = first["service"]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = json.loads(line)
            if "got" in msg:
                self.got.append((bytes.fromhex(msg["got"]), (msg["addr"][0], msg["addr"][1])))
            elif msg.get("closed"):
                self.closed = True
            else:
                self.lines.put(msg)

    def command(self, obj: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def payloads(self) -> list[bytes]:
        return [data for data, _ in list(self.got)]

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.command({"close": True})
                self.proc.wait(timeout=20)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


class Local:
    """A shell with a stand-in engine in this process; what it receives is kept."""

    def __init__(self) -> None:
        self.got: list[tuple[bytes, tuple[str, int]]] = []
        self.shell: Shell

    async def start(self, service: str | None, network: str, ttl: int = 1) -> Local:
        def on_events(events: list[Any]) -> None:
            for data, addr, _now in events:
                self.got.append((data, addr))

        self.shell = await Shell.start(StandInEngine, service, network, on_events=on_events,
                                       ttl=ttl)
        return self

    @property
    def engine(self) -> StandInEngine:
        engine = self.shell.engine
        assert isinstance(engine, StandInEngine)
        return engine

    def payloads(self) -> list[bytes]:
        return [data for data, _ in self.got]


@pytest.mark.parametrize("loop", LOOPS)
def test_two_processes_share_a_service_and_each_gets_every_multicast(loop: str) -> None:
    """Three processes on one service port (SO_REUSEADDR, and SO_REUSEPORT for the systems
    that need it); each multicast reaches all three, the sender included
    (IP_MULTICAST_LOOP), from the sender's inbox address."""
    service, network = str(free_udp_port()), loopback_network()

    async def scenario() -> None:
        a, b = Child(service, network, loop=loop), Child(service, network, loop=loop)
        try:
            assert a.service == b.service == int(service)
            p = await Local().start(service, network)
            p.shell.send(b"one")
            await wait_until(lambda: b"one" in a.payloads() and b"one" in b.payloads(),
                             what="both children to get the multicast")
            await wait_until(lambda: b"one" in p.payloads(), what="the sender to hear itself")
            assert (b"one", p.shell.inbox_address) in a.got
            assert (b"one", p.shell.inbox_address) in b.got
            a.command({"send": b"two".hex()})
            await wait_until(lambda: b"two" in b.payloads() and b"two" in p.payloads(),
                             what="a child's multicast to reach the others")
            assert (b"two", a.inbox) in p.got
            assert p.shell.stats.datagrams_sent == 1
            await p.shell.close()
        finally:
            a.stop()
            b.stop()

    run(scenario(), loop)


def test_a_group_reaches_only_the_processes_that_joined_it() -> None:
    """Two groups on one service: a process receives only the groups it joined (on Linux
    that needs IP_MULTICAST_ALL = 0; by default a socket gets every group any socket on
    the host joined on its port)."""
    service = str(free_udp_port())
    g = random.randrange(1, 254)
    first, second = f"127.0.0.1;239.192.75.{g}", f"127.0.0.1;239.192.75.{g + 1}"

    async def scenario() -> None:
        a, b = Child(service, first), Child(service, second)
        try:
            p = await Local().start(service, first)
            p.shell.send(b"first-group")
            await wait_until(lambda: b"first-group" in a.payloads(), what="the first group")
            b.command({"send": b"second-group".hex()})
            await wait_until(lambda: b"second-group" in b.payloads(), what="the second group")
            await asyncio.sleep(0.2)
            assert b.payloads() == [b"second-group"]
            assert b"second-group" not in a.payloads() + p.payloads()
            await p.shell.close()
        finally:
            a.stop()
            b.stop()

    asyncio.run(scenario())


def test_unicast_to_an_inbox_reaches_only_its_owner() -> None:
    """A datagram to one process's inbox port is that process's alone, though every
    process shares the service port."""
    service, network = str(free_udp_port()), loopback_network()

    async def scenario() -> None:
        a, b = Child(service, network), Child(service, network)
        try:
            p = await Local().start(service, network)
            p.shell.send_to(a.inbox, b"for-a")
            await wait_until(lambda: b"for-a" in a.payloads(), what="a to get its datagram")
            assert (b"for-a", p.shell.inbox_address) in a.got
            # A multicast sent after it reaches b and the sender; the unicast must not.
            p.shell.send(b"marker")
            await wait_until(lambda: b"marker" in b.payloads() and b"marker" in p.payloads(),
                             what="the marker")
            await asyncio.sleep(0.2)
            assert b"for-a" not in b.payloads()
            assert b"for-a" not in p.payloads()
            await p.shell.close()
        finally:
            a.stop()
            b.stop()

    asyncio.run(scenario())


def _loopback_broadcast_works() -> str | None:
    """None if a datagram to 127.255.255.255 reaches a socket here, else why not."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        rx.bind(("", 0))
        rx.settimeout(2)
        tx.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        try:
            tx.sendto(b"probe", ("127.255.255.255", rx.getsockname()[1]))
            rx.recv(16)
        except OSError as exc:
            return f"this machine does not deliver broadcasts to 127.255.255.255 ({exc})"
    return None


def test_broadcast_mode_on_loopback() -> None:
    """Network with only an interface part: broadcast to the interface's broadcast address
    (127.255.255.255 for 127.0.0.1), received by every process on the service."""
    reason = _loopback_broadcast_works()
    if reason:
        pytest.skip(reason)
    service = str(free_udp_port())

    async def scenario() -> None:
        a = Child(service, "127.0.0.1")
        try:
            p = await Local().start(service, "127.0.0.1")
            assert p.shell.sockets.endpoint.broadcast
            assert p.shell.sockets.send_destination == ("127.255.255.255", int(service))
            p.shell.send(b"to-all")
            await wait_until(lambda: b"to-all" in a.payloads() and b"to-all" in p.payloads(),
                             what="the broadcast")
            a.command({"send": b"back".hex()})
            await wait_until(lambda: (b"back", a.inbox) in p.got, what="the child's broadcast")
            await p.shell.close()
        finally:
            a.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize("ttl", [0, 1])
def test_multicast_ttl(ttl: int) -> None:
    """IP_MULTICAST_TTL is what was asked; 0 keeps multicast on this host, where the
    loopback copy still reaches every process."""
    service, network = str(free_udp_port()), loopback_network()

    async def scenario() -> None:
        a = Child(service, network, ttl=ttl)
        try:
            p = await Local().start(service, network, ttl=ttl)
            sock = p.shell.sockets.inbox_socket
            assert sock.getsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL) == ttl
            assert sock.getsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP) == 1
            p.shell.send(b"ttl")
            await wait_until(lambda: b"ttl" in a.payloads(), what="the multicast")
            await p.shell.close()
        finally:
            a.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize("loop", LOOPS)
def test_close_sends_the_engines_last_datagrams_and_frees_the_ports(loop: str) -> None:
    """close(): engine.close's datagrams go out (the stand-in's "bye") and both ports can be
    bound again by a socket without any reuse option."""
    service, network = str(free_udp_port()), loopback_network()

    async def scenario() -> None:
        a = Child(service, network)
        try:
            inbox_port = free_udp_port()
            p = await Local().start(f"{service}:{inbox_port}", network)
            assert p.shell.inbox_address == ("127.0.0.1", inbox_port)
            await p.shell.close()
            assert p.engine.closed_at is not None
            await wait_until(lambda: (b"bye:%d" % inbox_port, ("127.0.0.1", inbox_port))
                             in a.got, what="the closing shell's last datagram")
            assert p.shell.sockets.service_socket.fileno() == -1
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.bind(("127.0.0.1", inbox_port))  # no reuse option: the port is free
            a.stop()
            assert a.closed
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.bind(("", int(service)))  # nobody holds the service port any more
        finally:
            a.stop()

    run(scenario(), loop)


@pytest.mark.parametrize("error", [errno.ENOBUFS, errno.EAGAIN])
def test_a_full_kernel_queue_delays_sends_in_order(error: int) -> None:
    """EAGAIN / ENOBUFS from sendto: the datagrams wait, are retried, and arrive in order;
    the loop never sees the error."""
    service, network = str(free_udp_port()), loopback_network()

    async def scenario() -> None:
        a = Child(service, network)
        try:
            p = await Local().start(service, network)
            real_sendto = p.shell._sendto
            refusals = [3]

            def refusing_sendto(data: bytes, dest: tuple[str, int]) -> int:
                if refusals[0]:
                    refusals[0] -= 1
                    raise OSError(error, "no room")
                return real_sendto(data, dest)

            p.shell._sendto = refusing_sendto
            sent = [b"m%d" % i for i in range(5)]
            for m in sent:
                p.shell.send(m)
            await wait_until(lambda: len(a.got) == 5, what="all five datagrams")
            assert a.payloads() == sent
            stats = p.shell.stats
            assert stats.send_deferred == 5
            assert stats.send_retries == 2
            assert stats.datagrams_sent == 5
            assert stats.send_dropped == 0
            await p.shell.close()
        finally:
            a.stop()

    asyncio.run(scenario())


def test_a_send_error_drops_that_datagram_only() -> None:
    """A datagram the kernel will never take (EMSGSIZE) is dropped and counted; the next
    one goes out."""
    service, network = str(free_udp_port()), loopback_network()

    async def scenario() -> None:
        a = Child(service, network)
        try:
            p = await Local().start(service, network)
            p.shell.send(b"x" * 70000)
            p.shell.send(b"after")
            await wait_until(lambda: b"after" in a.payloads(), what="the next datagram")
            assert p.shell.stats.send_errors == 1
            assert a.payloads() == [b"after"]
            await p.shell.close()
        finally:
            a.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize("loop", LOOPS)
def test_one_timer_ticks_the_engine_at_its_deadline(loop: str) -> None:
    """The shell keeps one call_at on engine.next_deadline(): moved when the deadline moves,
    and engine.tick(now) runs once it has passed."""

    async def scenario() -> None:
        p = await Local().start(str(free_udp_port()), loopback_network())
        try:
            engine = p.engine
            now = p.shell.loop.time()
            engine.deadline = now + 30
            p.shell.flush()
            engine.deadline = now + 0.05  # earlier: the timer moves forward
            p.shell.flush()
            # The stand-in clears its deadline on the first tick at or after it. uvloop's
            # timers have millisecond resolution and may fire a little early; the shell then
            # re-arms on the same deadline, so an early tick is followed by the due one.
            await wait_until(lambda: engine.deadline is None, what="the tick at the deadline")
            assert engine.ticks[-1] >= now + 0.05
            seen = len(engine.ticks)
            now = p.shell.loop.time()
            engine.deadline = now + 0.05
            p.shell.flush()
            engine.deadline = now + 0.3  # later: the 0.05 s timer must not tick
            p.shell.flush()
            await wait_until(lambda: engine.deadline is None, what="the second deadline's tick")
            later = engine.ticks[seen:]
            assert later[-1] >= now + 0.3
            assert all(t >= now + 0.25 for t in later), later  # nothing near the 0.05 s mark
        finally:
            await p.shell.close()

    run(scenario(), loop)


def test_real_engines_recover_a_long_burst_loss_under_continuing_traffic() -> None:
    """Two real engines on loopback multicast: the receiver (an out-of-order buffer of
    1,000 packets) loses 5,000 consecutive data packets while the sender goes on sending
    20,000 more; the packets past its buffer are dropped too. Everything is delivered, in
    order, without DATALOSS, soon after the traffic stops (without asking for dropped
    packets as its window reaches them, the receiver recovers one window per NAK backoff,
    about 1,000 packets a second)."""

    async def scenario() -> None:
        service = str(free_udp_port())
        network = loopback_network()
        got: list[bytes] = []
        losses: list[Advisory] = []

        def on_rx(events: list[Any]) -> None:
            for ev in events:
                if isinstance(ev, Delivered):
                    got.append(ev.payload)
                elif ev.subject == DATALOSS_INBOUND_BCAST:
                    losses.append(ev)

        rx = await Shell.start(functools.partial(Engine, max_out_of_order=1000), service,
                               network, on_events=on_rx)
        tx = await Shell.start(Engine, service, network, on_events=lambda events: None)
        engine = rx.engine
        assert isinstance(engine, Engine)
        receive = engine.receive_datagram
        lose = range(2, 5002)  # the sender's sequence numbers the receiver loses

        def lossy(data: bytes, addr: tuple[str, int], now: float) -> None:
            if (len(data) >= HEADER_LEN and data[3] == DATA and not data[5] & RETRANS
                    and int.from_bytes(data[20:28], "big") in lose):
                return
            receive(data, addr, now)

        engine.receive_datagram = lossy  # type: ignore[method-assign]
        try:
            tx.send(b"hello")
            await wait_until(lambda: got, what="first contact")
            sent = [b"burst%d" % i for i in range(len(lose))]
            for m in sent:
                tx.send(m)
                tx.flush()  # a packet each: small messages sent together share packets
            for i in range(1000):  # 20 messages a millisecond, for about a second
                for j in range(20):
                    m = b"more%d.%d" % (i, j)
                    sent.append(m)
                    tx.send(m)
                    tx.flush()
                await asyncio.sleep(0.001)
            await wait_until(lambda: len(got) > len(sent), timeout=15.0, what="every message")
            assert got[1:] == sent
            assert not losses
            assert engine.stats.overflow > 0
        finally:
            await tx.close()
            await rx.close()

    run(scenario(), "uvloop")


def test_an_event_callback_that_raises_stops_nothing() -> None:
    """on_events raising goes to the loop's exception handler; what the callback made the
    engine send still goes out, the timer stays armed and later datagrams are handled."""
    service, network = str(free_udp_port()), loopback_network()

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        errors: list[BaseException | None] = []
        loop.set_exception_handler(lambda _loop, context: errors.append(context.get("exception")))
        a = Child(service, network)
        try:
            got: list[bytes] = []
            engines: list[StandInEngine] = []

            def factory(*, ip: str, port: int, service: int) -> StandInEngine:
                engines.append(StandInEngine(ip=ip, port=port, service=service))
                return engines[0]

            def on_events(events: list[Any]) -> None:
                for data, _addr, _now in events:
                    got.append(data)
                    if data == b"boom":
                        engine = engines[0]
                        engine.deadline = loop.time() + 0.05
                        engine.send_to(a.inbox, b"reply", loop.time())  # not through the shell
                        raise RuntimeError("callback failed")

            shell = await Shell.start(factory, service, network, on_events=on_events)
            engine = engines[0]
            a.command({"send": b"boom".hex()})
            await wait_until(lambda: errors, what="the callback's exception")
            assert isinstance(errors[0], RuntimeError)
            await wait_until(lambda: b"reply" in a.payloads(), timeout=5, what="the reply")
            await wait_until(lambda: engine.ticks, what="the timer set by the callback")
            a.command({"send": b"later".hex()})
            await wait_until(lambda: b"later" in got, what="a later datagram")
            await shell.close()
        finally:
            a.stop()

    asyncio.run(scenario())


def test_bad_parameters_open_no_socket() -> None:
    """A bad network fails Shell.start with ParameterError, and the service port stays free."""
    port = free_udp_port()

    async def scenario() -> None:
        with pytest.raises(ParameterError, match="network"):
            await Shell.start(StandInEngine, str(port), "127.0.0.1;10.0.0.1",
                              on_events=lambda events: None)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("", port))

    asyncio.run(scenario())


def _namespace_reason() -> str | None:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip is not installed"
    probe = subprocess.run(["unshare", "-rn", "ip", "link", "set", "lo", "up"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create a network namespace here: {probe.stderr.strip()}"
    return None


def test_defaults_in_a_network_namespace() -> None:
    """The defaults (service None: no "rendezvous" entry → 7500; network "": broadcast on
    the interface of this host's name) between two processes, inside a network namespace
    with only its own loopback interface, so nothing reaches any real network."""
    reason = _namespace_reason()
    if reason:
        pytest.skip(reason)
    try:
        socket.getservbyname("rendezvous", "udp")
        pytest.skip("this host's services database names rendezvous; the 7500 default is "
                    "not the one in use")
    except OSError:
        pass
    script = (
        "ip link set lo up && exec " + sys.executable + " " + str(STANDIN) + " --pair"
    )
    out = subprocess.run(["unshare", "-rn", "sh", "-c", script], capture_output=True,
                         text=True, cwd=ROOT, timeout=90)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if "error" in result:
        pytest.skip(f"the default network does not resolve inside a namespace: "
                    f"{result['error']}")
    assert result["service"] == 7500
    assert result["broadcast"] is True
    assert result["child_got"] == [result["inbox"]]
    assert result["own_got"] is True


NETEM_LOSS = "5%"


def _netem_reason() -> str | None:
    reason = _namespace_reason()
    if reason:
        return reason
    if shutil.which("tc") is None:
        return "tc is not installed"
    probe = subprocess.run(
        ["unshare", "-rn", "sh", "-c",
         f"ip link set lo up && tc qdisc add dev lo root netem loss {NETEM_LOSS}"],
        capture_output=True, text=True)
    if probe.returncode != 0:
        return (f"tc netem is not available here (a kernel without sch_netem?): "
                f"{probe.stderr.strip()}")
    return None


def test_two_processes_lose_nothing_under_netem_loss_in_a_network_namespace() -> None:
    """Two processes on the bus inside a network namespace of their own, whose loopback
    interface drops 5% of every packet (``tc netem``: data, NAKs and retransmissions alike):
    every message arrives, once and in order, and the sender did resend."""
    reason = _netem_reason()
    if reason:
        pytest.skip(reason)
    n = 3000
    child = Path(__file__).resolve().parent / "rvbus_child.py"
    script = (f"ip link set lo up && tc qdisc add dev lo root netem loss {NETEM_LOSS} && "
              f"exec {sys.executable} {child} 7533 '127.0.0.1;239.192.75.9' pair {n}")
    out = subprocess.run(["unshare", "-rn", "sh", "-c", script], capture_output=True,
                         text=True, cwd=ROOT, timeout=110,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["got"] == list(range(n))
    assert result["retransmitted"] > 0
