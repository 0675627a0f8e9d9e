"""Service, network and daemon parameters: every form, every error (TIBCO Rendezvous
Concepts, Transports, Network Transport Parameters), and the options of the sockets they
open (no traffic: tests/interop/test_rv_sockets.py sends datagrams)."""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable

import pytest

from transports.rv import net
from transports.rv.net import (
    Daemon,
    Network,
    ParameterError,
    Service,
    open_sockets,
    parse_daemon,
    parse_network,
    parse_service,
    resolve_interface,
    resolve_network,
)

LINUX = sys.platform.startswith("linux")
# TEST-NET-2 (RFC 5737): documentation only, an address of no host.
FOREIGN = "198.51.100.7"


def _getservbyname(table: dict[str, int]) -> Callable[[str, str], int]:
    real = socket.getservbyname

    def lookup(name: str, proto: str = "udp") -> int:
        assert proto == "udp"
        if name in table:
            return table[name]
        if name == "rendezvous":
            raise OSError("service/proto not found")
        return real(name, proto)

    return lookup


@pytest.fixture
def no_rendezvous_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "getservbyname", _getservbyname({}))


# -- service ---------------------------------------------------------------------------------


@pytest.mark.usefixtures("no_rendezvous_entry")
@pytest.mark.parametrize("value", [None, "", "  "])
def test_service_default_falls_back_to_7500(value: str | None) -> None:
    assert parse_service(value) == Service(7500, 0, value)


def test_service_default_is_the_rendezvous_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "getservbyname", _getservbyname({"rendezvous": 7600}))
    assert parse_service(None).port == 7600
    assert parse_service("rendezvous:5238") == Service(7600, 5238, "rendezvous:5238")


@pytest.mark.usefixtures("no_rendezvous_entry")
@pytest.mark.parametrize(("value", "port", "inbox"), [
    ("7890", 7890, 0),
    (7890, 7890, 0),
    ("1", 1, 0),
    ("65535", 65535, 0),
    ("7706:7707", 7706, 7707),
    (":0", 7500, 0),
    (":", 7500, 0),
    ("7706:", 7706, 0),
    (":7501", 7500, 7501),
    (" 7706 : 7707 ", 7706, 7707),
])
def test_service_numbers_and_the_inbox_port(value: str | int, port: int, inbox: int) -> None:
    service = parse_service(value)
    assert (service.port, service.inbox_port) == (port, inbox)


def test_service_name_from_the_services_database() -> None:
    try:
        expected = socket.getservbyname("domain", "udp")
    except OSError:
        pytest.skip("this host's services database has no domain/udp entry")
    assert parse_service("domain").port == expected
    assert parse_service("domain:7000") == Service(expected, 7000, "domain:7000")


@pytest.mark.usefixtures("no_rendezvous_entry")
@pytest.mark.parametrize(("value", "reason"), [
    ("0", "port 0 is not in 1..65535"),
    ("65536", "port 65536 is not in 1..65535"),
    ("no-such-service-here", "neither a port number nor a udp service name"),
    ("-1", "neither a port number nor a udp service name"),
    ("7500:7500", "must differ"),
    (":7500", "must differ"),
    ("7500:x", "inbox port 'x' is not a number"),
    ("7500:65536", "inbox port 65536 is not in 0..65535"),
    ("7500:1:2", "inbox port '1:2' is not a number"),
    (b"7500", "must be a string"),
    (True, "must be a string"),
])
def test_service_errors(value: object, reason: str) -> None:
    with pytest.raises(ParameterError) as info:
        parse_service(value)  # type: ignore[arg-type]
    assert info.value.parameter == "service"
    assert reason in str(info.value)
    assert str(info.value).startswith(f"service {value!r}: ")


def test_parameter_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"^service '0': port 0"):
        parse_service("0")


# -- network ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "interface", "groups", "send", "broadcast"), [
    (None, "", (), None, True),
    ("", "", (), None, True),
    ("lan0", "lan0", (), None, True),
    ("lan0;225.1.1.1", "lan0", ("225.1.1.1",), None, False),
    ("lan0;225.1.1.1,225.1.1.5;225.1.1.6", "lan0", ("225.1.1.1", "225.1.1.5"), "225.1.1.6",
     False),
    ("lan0;;225.1.1.6", "lan0", (), "225.1.1.6", False),
    (";239.192.75.1", "", ("239.192.75.1",), None, False),
    ("lan0;;", "lan0", (), None, True),
    (" 127.0.0.1 ; 239.192.75.1 , 239.192.75.2 ; ", "127.0.0.1",
     ("239.192.75.1", "239.192.75.2"), None, False),
    ("lan0;224.0.0.0,239.255.255.255", "lan0", ("224.0.0.0", "239.255.255.255"), None, False),
    ("lan0;;127.255.255.255", "lan0", (), "127.255.255.255", False),
])
def test_network_forms(value: str | None, interface: str, groups: tuple[str, ...],
                       send: str | None, broadcast: bool) -> None:
    network = parse_network(value)
    assert (network.interface, network.groups, network.send_address) == (
        interface, groups, send)
    assert network.broadcast is broadcast


@pytest.mark.parametrize(("value", "reason"), [
    ("lan0;225.1.1.1;225.1.1.6;x", "more than three ';'-separated parts"),
    ("lan0;10.0.0.1", "group 10.0.0.1 is not a multicast address"),
    ("lan0;240.0.0.1", "group 240.0.0.1 is not a multicast address"),
    ("lan0;239.1.1", "multicast group '239.1.1' is not an IPv4 address"),
    ("lan0;239.1.1.1,,239.1.1.2", "empty multicast group"),
    ("lan0;239.1.1.1,", "empty multicast group"),
    ("lan0;239.1.1.1,239.1.1.1", "group 239.1.1.1 is listed twice"),
    ("lan0;group.example", "multicast group 'group.example' is not an IPv4 address"),
    ("lan0;239.1.1.1;send.example", "send address 'send.example' is not an IPv4 address"),
    ("lan0;;239.1.1.256", "send address '239.1.1.256' is not an IPv4 address"),
    (7, "must be a string"),
])
def test_network_errors(value: object, reason: str) -> None:
    with pytest.raises(ParameterError) as info:
        parse_network(value)  # type: ignore[arg-type]
    assert info.value.parameter == "network"
    assert reason in str(info.value)


# -- daemon ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "host", "port"), [
    (None, None, 7500),
    ("", None, 7500),
    ("6555", None, 6555),
    (6555, None, 6555),
    ("purple_host:6555", "purple_host", 6555),
    ("127.0.0.1:7500", "127.0.0.1", 7500),
])
def test_daemon_forms(value: str | int | None, host: str | None, port: int) -> None:
    daemon = parse_daemon(value)
    assert (daemon.host, daemon.port) == (host, port)


@pytest.mark.parametrize(("value", "reason"), [
    ("ssl:myhost.net:8344", "secure daemon (ssl:) is not supported"),
    ("ssl::8344", "secure daemon (ssl:) is not supported"),
    (":7500", "has ':' but no host before it"),
    ("host:", "port '' is not in 1..65535"),
    ("host:0", "port '0' is not in 1..65535"),
    ("host:65536", "port '65536' is not in 1..65535"),
    ("daemonhost", "port 'daemonhost' is not in 1..65535"),
    ([7500], "must be a string"),
])
def test_daemon_errors(value: object, reason: str) -> None:
    with pytest.raises(ParameterError) as info:
        parse_daemon(value)  # type: ignore[arg-type]
    assert info.value.parameter == "daemon"
    assert reason in str(info.value)


# -- interface resolution --------------------------------------------------------------------


def _loopback_name() -> str:
    for itf in net.local_interfaces():
        if itf.address == "127.0.0.1":
            assert itf.name is not None
            return itf.name
    pytest.skip("no interface lists 127.0.0.1 (interfaces are listed on Linux only)")


@pytest.mark.parametrize("part", ["127.0.0.1", "localhost"])
def test_interface_by_address_or_host_name(part: str) -> None:
    itf = resolve_interface(part)
    assert itf.address == "127.0.0.1"
    if LINUX:
        assert itf.broadcast == "127.255.255.255"


def test_interface_by_name() -> None:
    name = _loopback_name()
    itf = resolve_interface(name)
    assert (itf.address, itf.name, itf.broadcast) == ("127.0.0.1", name, "127.255.255.255")


@pytest.mark.parametrize("part", ["127", "127.0", "127.0.0", "127.0.0.0"])
def test_interface_by_network_number(part: str) -> None:
    _loopback_name()
    assert resolve_interface(part).address == "127.0.0.1"


def test_interface_by_a_loopback_address_no_interface_lists() -> None:
    """127.0.1.1 is this host's (the kernel binds it) though lo lists only 127.0.0.1: it is
    used as given, with the loopback network's broadcast address."""
    if not net.is_local_address("127.0.1.1"):
        pytest.skip("this kernel does not treat 127.0.1.1 as local")
    _loopback_name()
    itf = resolve_interface("127.0.1.1")
    assert (itf.address, itf.broadcast) == ("127.0.1.1", "127.255.255.255")


def test_default_interface_is_the_one_of_the_host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "localhost")
    assert resolve_interface("").address == "127.0.0.1"


def test_default_interface_when_the_host_name_is_not_local(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "far-host")
    monkeypatch.setattr(socket, "gethostbyname", lambda name: FOREIGN)
    with pytest.raises(ParameterError, match="which is not an address of this host"):
        resolve_interface("")


def test_default_interface_when_the_host_name_does_not_resolve(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(name: str) -> str:
        raise socket.gaierror("no such name")

    monkeypatch.setattr(socket, "gethostname", lambda: "nameless")
    monkeypatch.setattr(socket, "gethostbyname", fail)
    with pytest.raises(ParameterError, match=r"'nameless' does not resolve; give the "
                                             r"interface, e.g. '127.0.0.1;239.192.75.1'"):
        resolve_interface("")


def test_interface_errors() -> None:
    if net.is_local_address(FOREIGN):
        pytest.skip(f"{FOREIGN} is an address of this host")
    with pytest.raises(ParameterError, match="neither an address of this host nor the "
                                             "network number of one of its interfaces"):
        resolve_interface(FOREIGN)
    with pytest.raises(ParameterError, match="not an IP address, network number, interface "
                                             "name or host name of this host"):
        resolve_interface("no-such-interface.invalid")
    with pytest.raises(ParameterError, match="not an IP address, network number"):
        resolve_interface("1.2.3.4.5")
    if LINUX:
        with pytest.raises(ParameterError, match="no interface of this host is on network "
                                                 "198.51.100"):
            resolve_interface("198.51.100")


def test_interface_without_an_ipv4_address() -> None:
    listed = {itf.name for itf in net.local_interfaces()}
    bare = [name for _, name in socket.if_nameindex() if name not in listed] if LINUX else []
    if not bare:
        pytest.skip("every interface here has an IPv4 address")
    with pytest.raises(ParameterError, match=f"interface {bare[0]} has no IPv4 address"):
        resolve_interface(bare[0])


def test_interface_error_names_the_whole_parameter() -> None:
    with pytest.raises(ParameterError) as info:
        resolve_network(parse_network("no-such-interface.invalid;239.192.75.1"))
    assert info.value.value == "no-such-interface.invalid;239.192.75.1"


@pytest.mark.parametrize(("value", "send", "broadcast"), [
    ("127.0.0.1;239.192.75.1,239.192.75.2", "239.192.75.1", False),
    ("127.0.0.1;239.192.75.1;239.192.75.9", "239.192.75.9", False),
    ("127.0.0.1;;239.192.75.9", "239.192.75.9", False),
    ("127.0.0.1", "127.255.255.255", True),
])
def test_send_address(value: str, send: str, broadcast: bool) -> None:
    if broadcast and not LINUX:
        send = net.LIMITED_BROADCAST
    endpoint = resolve_network(parse_network(value))
    assert (endpoint.interface.address, endpoint.send_address, endpoint.broadcast) == (
        "127.0.0.1", send, broadcast)


# -- sockets ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.parametrize("ttl", [-1, 256, True, "1", 1.0])
def test_ttl_errors(ttl: object) -> None:
    with pytest.raises(ParameterError, match=r"^ttl .*: must be an integer in 0..255"):
        open_sockets(str(free_port()), "127.0.0.1;239.192.75.1", ttl=ttl)  # type: ignore[arg-type]


def test_socket_options_multicast() -> None:
    sockets = open_sockets(f"{free_port()}:0", "127.0.0.1;239.192.75.3", "7600", ttl=0)
    try:
        service, inbox = sockets.service_socket, sockets.inbox_socket
        assert service.getsockname() == ("0.0.0.0", sockets.service.port)
        assert service.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR)
        assert service.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)
        # the kernel doubles what it is asked and caps it at net.core.rmem_max
        default = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with default:
            assert service.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) >= min(
                default.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF), 200_000)
        assert inbox.getsockname() == ("127.0.0.1", sockets.inbox_port)
        assert sockets.inbox_port != 0
        assert not inbox.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR)
        assert not inbox.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)
        assert inbox.getsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL) == 0
        assert inbox.getsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP) == 1
        assert socket.inet_ntoa(inbox.getsockopt(
            socket.IPPROTO_IP, socket.IP_MULTICAST_IF, 4)) == "127.0.0.1"
        assert not inbox.getsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST)
        assert sockets.send_destination == ("239.192.75.3", sockets.service.port)
        assert sockets.daemon == Daemon(None, 7600, "7600")
        assert sockets.network == Network("127.0.0.1", ("239.192.75.3",), None,
                                          "127.0.0.1;239.192.75.3")
        assert sockets.ttl == 0
    finally:
        sockets.close()
    assert service.fileno() == -1 and inbox.fileno() == -1


def test_socket_options_broadcast() -> None:
    sockets = open_sockets(f"{free_port()}:0", "127.0.0.1")
    try:
        inbox = sockets.inbox_socket
        assert inbox.getsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST)
        assert inbox.getsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL) == 1
    finally:
        sockets.close()


def test_inbox_port_given_and_in_use() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as holder:
        holder.bind(("127.0.0.1", 0))
        taken = holder.getsockname()[1]
        with pytest.raises(OSError):
            open_sockets(f"{free_port()}:{taken}", "127.0.0.1;239.192.75.3")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind(("127.0.0.1", 0))
            free = probe.getsockname()[1]
        sockets = open_sockets(f"{free_port()}:{free}", "127.0.0.1;239.192.75.3")
        try:
            assert sockets.inbox_port == free
        finally:
            sockets.close()
