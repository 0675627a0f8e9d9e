"""tests/faultproxy.py, driven only through toxiproxy-python, with a local upstream.

The upstream answers every byte it gets upper-cased, so a reply proves the data went up through
the proxy and came back down. Timings use generous upper bounds; lower bounds are the point.
"""

from __future__ import annotations

import os
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from faultproxy import split_address, toxiproxy_fixture  # noqa: F401  (fixture "toxiproxy")
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists


class _Upper(socketserver.BaseRequestHandler):
    server: _UpperServer

    def handle(self) -> None:
        self.server.accepted += 1
        try:
            while data := self.request.recv(65536):
                self.server.received += data
                self.request.sendall(data.upper())
        finally:
            self.server.ended.set()


class _UpperServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Upper)
        self.accepted = 0
        self.received = b""  # everything that reached the upstream
        self.ended = threading.Event()  # a connection to the upstream has ended

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # resets are what these tests cause


@pytest.fixture
def upstream() -> Iterator[_UpperServer]:
    server = _UpperServer()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


def _addr(server: _UpperServer) -> str:
    return f"127.0.0.1:{server.server_address[1]}"


def connect(proxy: Any) -> socket.socket:
    return socket.create_connection(split_address(proxy.listen), timeout=5)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        data = sock.recv(n - len(buf))
        if not data:
            raise AssertionError(f"EOF after {len(buf)} of {n} bytes")
        buf += data
    return buf


def recv_to_eof(sock: socket.socket) -> bytes:
    buf = b""
    while data := sock.recv(65536):
        buf += data
    return buf


def roundtrip(sock: socket.socket, data: bytes) -> float:
    """Send ``data``, check the upper-cased echo, return the seconds it took."""
    t0 = time.monotonic()
    sock.sendall(data)
    assert recv_exact(sock, len(data)) == data.upper()
    return time.monotonic() - t0


def test_passes_data_both_ways_and_reports_the_proxy(toxiproxy: Any, upstream: Any) -> None:
    proxy = toxiproxy.create(upstream=_addr(upstream), name="pass")
    host, port = split_address(proxy.listen)
    assert host == "127.0.0.1" and port != 0
    assert proxy.enabled is True and proxy.upstream == _addr(upstream)
    listed = toxiproxy.proxies()
    assert list(listed) == ["pass"] and listed["pass"].listen == proxy.listen
    assert toxiproxy.version()
    payload = bytes(range(97, 123)) * 20000  # 520 kB: more than any socket buffer
    with connect(proxy) as sock:
        assert roundtrip(sock, b"ping") < 1
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        assert recv_exact(sock, len(payload)) == payload.upper()
        sender.join()
        sock.sendall(b"last words")
        sock.shutdown(socket.SHUT_WR)  # the half-close goes up, the upstream's close comes down
        assert recv_to_eof(sock) == b"LAST WORDS"
    assert upstream.accepted == 1


def test_api_errors_and_destroy(toxiproxy: Any, upstream: Any) -> None:
    proxy = toxiproxy.create(upstream=_addr(upstream), name="api")
    with pytest.raises(ProxyExists):
        toxiproxy.create(upstream=_addr(upstream), name="api")
    assert toxiproxy.get_proxy("missing") is None
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="no_such_toxic")
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="latency", stream="sideways")
    proxy.add_toxic(type="latency", attributes={"latency": 1})
    with pytest.raises(ProxyExists):  # 409: same default name latency_downstream
        proxy.add_toxic(type="latency", attributes={"latency": 2})
    with pytest.raises(NotFound):
        proxy.destroy_toxic("never_added")
    assert proxy.get_toxic("never_added") is None
    address = split_address(proxy.listen)
    assert toxiproxy.destroy(proxy) is True
    assert toxiproxy.proxies() == {}
    with pytest.raises(NotFound):
        proxy.toxics()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address, timeout=2).close()


def test_populate_and_destroy_all(toxiproxy: Any, upstream: Any) -> None:
    made = toxiproxy.populate(
        [
            {"name": "one", "upstream": _addr(upstream), "listen": "127.0.0.1:0"},
            {"name": "two", "upstream": _addr(upstream), "listen": "127.0.0.1:0"},
        ]
    )
    assert sorted(p.name for p in made) == ["one", "two"]
    assert made[0].listen != made[1].listen
    with connect(toxiproxy.get_proxy("two")) as sock:
        roundtrip(sock, b"two")
    toxiproxy.destroy_all()
    assert toxiproxy.proxies() == {}


def test_unreachable_upstream_closes_the_client(toxiproxy: Any) -> None:
    with socket.socket() as probe:  # a port with nobody listening
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"
    proxy = toxiproxy.create(upstream=dead, name="dead")
    with connect(proxy) as sock:
        assert recv_to_eof(sock) == b""


def test_latency_applies_to_live_connections_per_direction(toxiproxy: Any, upstream: Any) -> None:
    proxy = toxiproxy.create(upstream=_addr(upstream), name="slow")
    with connect(proxy) as sock:  # opened before any toxic
        assert roundtrip(sock, b"warm") < 0.5
        proxy.add_toxic(type="latency", attributes={"latency": 300, "jitter": 0})
        took = roundtrip(sock, b"down")
        assert 0.3 <= took < 1.5
        proxy.add_toxic(type="latency", stream="upstream", attributes={"latency": 100})
        took = roundtrip(sock, b"both")
        assert 0.4 <= took < 1.5
        toxics = proxy.toxics()
        assert sorted(toxics) == ["latency_downstream", "latency_upstream"]
        down = toxics["latency_downstream"]
        assert (down.type, down.stream, down.toxicity) == ("latency", "downstream", 1.0)
        assert down.attributes == {"latency": 300, "jitter": 0}
        proxy.destroy_toxic("latency_downstream")
        took = roundtrip(sock, b"up only")
        assert 0.1 <= took < 0.35  # the 300 ms downstream delay is gone


def test_toxicity_zero_never_applies(toxiproxy: Any, upstream: Any) -> None:
    proxy = toxiproxy.create(upstream=_addr(upstream), name="lucky")
    proxy.add_toxic(type="latency", toxicity=0.0, attributes={"latency": 1000})
    assert proxy.get_toxic("latency_downstream").toxicity == 0.0
    with connect(proxy) as sock:
        assert roundtrip(sock, b"fast") < 0.5


def test_timeout_zero_blackholes_until_removed(toxiproxy: Any, upstream: Any) -> None:
    proxy = toxiproxy.create(upstream=_addr(upstream), name="hole")
    with connect(proxy) as sock:
        roundtrip(sock, b"before")
        proxy.add_toxic(type="timeout", attributes={"timeout": 0})
        sock.sendall(b"lost")
        sock.settimeout(0.4)
        with pytest.raises(TimeoutError):
            sock.recv(100)
        proxy.destroy_toxic("timeout_downstream")
        sock.settimeout(5)
        sock.sendall(b"after")
        assert recv_exact(sock, 5) == b"AFTER"  # the reply to "lost" was dropped, not held


def test_timeout_closes_after_its_delay(toxiproxy: Any, upstream: Any) -> None:
    proxy = toxiproxy.create(upstream=_addr(upstream), name="timeout")
    with connect(proxy) as sock:
        roundtrip(sock, b"alive")
        t0 = time.monotonic()
        proxy.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 300})
        sock.sendall(b"swallowed")
        assert recv_to_eof(sock) == b""
        assert 0.3 <= time.monotonic() - t0 < 2


def test_reset_peer_resets_the_client(toxiproxy: Any, upstream: Any) -> None:
    proxy = toxiproxy.create(upstream=_addr(upstream), name="rst")
    with connect(proxy) as sock:
        roundtrip(sock, b"alive")
        t0 = time.monotonic()
        proxy.add_toxic(type="reset_peer", attributes={"timeout": 200})
        with pytest.raises(ConnectionResetError):
            sock.recv(100)
        assert 0.2 <= time.monotonic() - t0 < 2
    proxy.destroy_toxic("reset_peer_downstream")
    proxy.add_toxic(type="reset_peer", attributes={"timeout": 0})
    t0 = time.monotonic()
    with pytest.raises(ConnectionResetError):  # the RST may even beat connect() returning
        with connect(proxy) as sock:  # a new connection: timeout 0 resets it at once
            sock.recv(100)
    assert time.monotonic() - t0 < 0.2


def test_limit_data_downstream_closes_after_n_bytes(toxiproxy: Any, upstream: Any) -> None:
    proxy = toxiproxy.create(upstream=_addr(upstream), name="limit")
    proxy.add_toxic(type="limit_data", attributes={"bytes": 10})
    with connect(proxy) as sock:
        sock.sendall(b"abcdefghijklmnopqrstuvwxyz0123")
        assert recv_to_eof(sock) == b"ABCDEFGHIJ"
    assert upstream.received == b"abcdefghijklmnopqrstuvwxyz0123"


def test_limit_data_upstream_closes_after_n_bytes(toxiproxy: Any, upstream: Any) -> None:
    proxy = toxiproxy.create(upstream=_addr(upstream), name="limit")
    proxy.add_toxic(type="limit_data", stream="upstream", attributes={"bytes": 5})
    with connect(proxy) as sock:
        sock.sendall(b"abcdefghijklmnopqrstuvwxyz0123")
        assert recv_to_eof(sock) == b""  # both sides close before the echo can come back
    assert upstream.ended.wait(5)
    assert upstream.received == b"abcde"


def test_bandwidth_paces_the_data(toxiproxy: Any, upstream: Any) -> None:
    proxy = toxiproxy.create(upstream=_addr(upstream), name="thin")
    proxy.add_toxic(type="bandwidth", attributes={"rate": 50})  # 50 KB/s
    payload = os.urandom(20_000)
    with connect(proxy) as sock:
        took = roundtrip(sock, payload)  # 20 kB at 50 KB/s: 0.4 s
    assert 0.35 <= took < 3


def test_slicer_delays_between_slices(toxiproxy: Any, upstream: Any) -> None:
    proxy = toxiproxy.create(upstream=_addr(upstream), name="sliced")
    proxy.add_toxic(
        type="slicer", attributes={"average_size": 10, "size_variation": 3, "delay": 20_000}
    )
    with connect(proxy) as sock:
        took = roundtrip(sock, b"0123456789abcdefghij" * 5)  # >= 7 slices, >= 6 pauses of 20 ms
    assert 0.12 <= took < 3


def test_disable_closes_connections_and_refuses_then_enable_restores(
    toxiproxy: Any, upstream: Any
) -> None:
    proxy = toxiproxy.create(upstream=_addr(upstream), name="switch")
    address = split_address(proxy.listen)
    with connect(proxy) as live:
        roundtrip(live, b"alive")
        proxy.disable()
        assert recv_to_eof(live) == b""
    assert toxiproxy.get_proxy("switch").enabled is False
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address, timeout=2).close()
    proxy.enable()
    assert toxiproxy.get_proxy("switch").listen == proxy.listen  # the same port again
    with connect(proxy) as again:
        roundtrip(again, b"again")
    with proxy.down():
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(address, timeout=2).close()
    with connect(proxy) as back:
        roundtrip(back, b"back")


def test_reset_enables_proxies_and_removes_toxics(toxiproxy: Any, upstream: Any) -> None:
    proxy = toxiproxy.create(upstream=_addr(upstream), name="messy")
    proxy.add_toxic(type="latency", attributes={"latency": 2000})
    proxy.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 0})
    proxy.disable()
    assert len(proxy.toxics()) == 2
    assert toxiproxy.reset() is True
    assert proxy.toxics() == {}
    assert toxiproxy.get_proxy("messy").enabled is True
    with connect(proxy) as sock:
        assert roundtrip(sock, b"clean") < 0.5
