"""The listeners' accept queue (``listen_backlog``): read back from the kernel with ``ss``.

For a listening TCP socket ``ss -ltn`` shows in Send-Q the socket's backlog (the longest accept
queue the kernel keeps for it) and in Recv-Q how many completed connections wait there now.
The burst test holds the gateway's loop, so nothing is accepted, connects 600 clients, and
checks that all 600 wait in the queue (with asyncio's default backlog of 100, 101 would and
the rest would be in TCP's SYN retries), then lets the gateway go and has every one of them
answered.
"""

from __future__ import annotations

import select
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator

import pytest
from gw import GatewayThread, wait_for

from adapters.mqtt.codec import encode_packet
from adapters.mqtt.packets import Connect
from gateway.config.gateway_conf import system_backlog

LISTEN = ("listen = mqtt://127.0.0.1:0\nlisten = amqp://127.0.0.1:0\n"
          "listen = stomp://127.0.0.1:0\nlisten = http://127.0.0.1:0\n")
BURST = 600  # more than asyncio's default backlog (100) and aiohttp's (128)


def listening(port: int) -> tuple[int, int]:
    """(Recv-Q, Send-Q) of the socket listening on 127.0.0.1:``port``: connections waiting
    to be accepted, and the backlog."""
    ss = shutil.which("ss")
    if ss is None:
        pytest.fail("ss (iproute2) is needed to read a listening socket's backlog")
    out = subprocess.run([ss, "-ltnH", f"sport = :{port}"], capture_output=True, text=True,
                         check=True, timeout=30).stdout.split("\n")
    rows = [line.split() for line in out if f"127.0.0.1:{port}" in line]
    assert len(rows) == 1, out
    return int(rows[0][1]), int(rows[0][2])


@pytest.mark.parametrize("uvloop", [False, True], ids=["asyncio", "uvloop"])
def test_every_listener_has_the_systems_backlog_by_default(tmp_path, uvloop):
    """No ``listen_backlog``: MQTT, AMQP, STOMP and HTTP listen with the system's maximum."""
    with GatewayThread(tmp_path / "gw", gateway=LISTEN, uvloop=uvloop) as g:
        for scheme in ("mqtt", "amqp", "stomp", "http"):
            assert listening(g.port(scheme))[1] == system_backlog(), scheme


def test_listen_backlog_sets_every_listener(tmp_path):
    with GatewayThread(tmp_path / "gw", gateway=LISTEN + "listen_backlog = 700\n") as g:
        for scheme in ("mqtt", "amqp", "stomp", "http"):
            # the kernel caps a backlog at somaxconn
            assert listening(g.port(scheme))[1] == min(700, system_backlog()), scheme


@pytest.fixture
def held() -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    yield socks
    for s in socks:
        s.close()


def test_a_burst_of_connections_waits_in_the_accept_queue(tmp_path, held):
    """600 MQTT clients connect while the gateway accepts nothing: all 600 are queued by the
    kernel; once the gateway runs again each gets its CONNACK."""
    if system_backlog() < BURST:
        pytest.fail(f"net.core.somaxconn is below {BURST}: the kernel caps every backlog there")
    with GatewayThread(tmp_path / "gw", gateway=LISTEN) as g:
        port = g.port("mqtt")
        assert g.loop is not None
        blocked, release = threading.Event(), threading.Event()

        def hold() -> None:  # runs on the gateway's loop: nothing is accepted meanwhile
            blocked.set()
            release.wait(60)

        g.loop.call_soon_threadsafe(hold)
        try:
            assert blocked.wait(30)
            for _ in range(BURST):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setblocking(False)
                held.append(s)
                s.connect_ex(("127.0.0.1", port))
            wait_for(lambda: listening(port)[0] == BURST, timeout=30,
                     what=f"{BURST} connections in the accept queue")
            for i, s in enumerate(held):
                s.setblocking(True)
                s.sendall(encode_packet(Connect("MQTT", 4, True, 30, f"burst-{i}", None, None,
                                                None, {}), 4))
        finally:
            release.set()
        for s in held:
            s.settimeout(30)
            ready, _, _ = select.select([s], [], [], 30)
            assert ready and s.recv(4) == b"\x20\x02\x00\x00"  # CONNACK, accepted
