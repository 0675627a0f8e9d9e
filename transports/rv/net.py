"""Service, network and daemon parameters, and the two UDP sockets they describe.

A Rendezvous transport is defined by three strings (TIBCO Rendezvous Concepts, Transports,
Network Transport Parameters): *service*, *network* and *daemon*. This module turns them into
sockets in three steps, each usable on its own:

1. **Parse** (no lookups beyond the services database): :func:`parse_service`,
   :func:`parse_network`, :func:`parse_daemon`. A malformed value raises
   :class:`ParameterError`, a ``ValueError`` that names the parameter, the value and what is
   wrong with it.
2. **Resolve** the network's first part to one local IPv4 interface
   (:func:`resolve_interface`, :func:`resolve_network`): an IP address of this host, a host
   name, a Linux interface name (``socket.if_nameindex`` plus the ``SIOCGIFADDR`` family of
   ioctls), a network number (``"192.0.2"`` or ``"192.0.2.0"``) matched against the local
   interfaces, or ``""`` for the interface of this host's name (``gethostname()``). Network
   names from the networks database are not looked up (the standard library has no
   ``getnetbyname``); such a value is reported as unresolvable. "Local" is checked by binding
   a throw-away UDP socket to the address, so an address the kernel accepts as its own (say
   127.0.1.1 on the loopback network) counts even when no interface lists it first.
3. **Open** the two sockets (:func:`open_sockets`):

   * the *service socket*, bound to ``('', service port)`` with ``SO_REUSEADDR`` and
     ``SO_REUSEPORT`` so that several processes on one host share a service (each gets its
     own copy of every multicast or broadcast datagram), joined to each multicast group on
     the interface, with a large ``SO_RCVBUF``. On Linux it also sets
     ``IP_MULTICAST_ALL = 0``, so it receives only the groups it joined itself, not every
     group some other socket on the host joined on that port. It only receives.
   * the *inbox socket*, bound to ``(interface address, inbox port)`` without any reuse
     option, so a unicast datagram to it reaches exactly one process. The inbox port is
     ephemeral unless the service is given as ``"service:inbox"``. Every datagram the
     engine sends leaves from this socket, multicast and broadcast included
     (``IP_MULTICAST_IF`` = the interface, ``IP_MULTICAST_LOOP = 1`` so engines on the same
     host hear each other, ``IP_MULTICAST_TTL`` = ``ttl``, ``SO_BROADCAST`` when the send
     address is not a multicast one). That way the source address of anything an engine
     sent is its inbox, and a receiver can answer it (a NAK, an ACK) by unicast to that
     address.

Network modes: groups given → multicast, sent to the send address (part 3) or else to the
first group; no group and no send address → broadcast to the interface's broadcast address
(for the loopback interface, its directed broadcast, 127.255.255.255; 255.255.255.255 when
the interface has none). The default network ``""`` is therefore *broadcast on the interface
of this host's name*, as in Rendezvous. Where that is not wanted (a shared LAN, CI, a
container) give the network explicitly, for example ``"127.0.0.1;239.192.75.1"``: loopback
interface, one multicast group.

The daemon parameter is parsed and recorded only: the engine runs inside the process (as
Rendezvous' in-process IPM library does), so there is no daemon to connect to.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import sys
from dataclasses import dataclass, field

DEFAULT_SERVICE_NAME = "rendezvous"
# Rendezvous' hard default when the services database has no "rendezvous" entry (TIBCO
# Rendezvous Concepts, Transports, Network Transport Parameters, Service Parameter).
DEFAULT_SERVICE_PORT = 7500
# The default client socket of a local daemon (same section, Daemon Parameter).
DEFAULT_DAEMON_PORT = 7500
# One hop: multicast stays on the local network unless the user asks for more.
DEFAULT_MULTICAST_TTL = 1
# Asked for; the kernel caps it at net.core.rmem_max (often 208 KiB .. 4 MiB). A burst of
# 1,400-byte packets is what it has to absorb while the loop is busy elsewhere.
RECEIVE_BUFFER_SIZE = 4 * 1024 * 1024
LIMITED_BROADCAST = "255.255.255.255"

_MULTICAST_NET = ipaddress.IPv4Network("224.0.0.0/4")
# Linux <linux/sockios.h>; the standard library has the ioctl call but not the numbers.
_SIOCGIFFLAGS = 0x8913
_SIOCGIFADDR = 0x8915
_SIOCGIFBRDADDR = 0x8919
_SIOCGIFNETMASK = 0x891B
_IFF_BROADCAST = 0x2
_IFF_LOOPBACK = 0x8
# <linux/in.h>; Python does not export it.
_IP_MULTICAST_ALL: int | None = getattr(
    socket, "IP_MULTICAST_ALL", 49 if sys.platform.startswith("linux") else None
)


class ParameterError(ValueError):
    """A service, network or daemon parameter that is malformed or cannot be resolved."""

    def __init__(self, parameter: str, value: object, reason: str) -> None:
        self.parameter = parameter
        self.value = value
        self.reason = reason
        super().__init__(f"{parameter} {value!r}: {reason}")


# -- service ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Service:
    """A parsed service: the UDP port shared by the service group, and the inbox port."""

    port: int
    inbox_port: int  # 0: ephemeral
    text: str | None  # as given


def _service_port(part: str, value: object) -> int:
    if part == "":
        try:
            return socket.getservbyname(DEFAULT_SERVICE_NAME, "udp")
        except OSError:
            return DEFAULT_SERVICE_PORT
    if part.isdigit():
        port = int(part)
        if not 0 < port < 65536:
            raise ParameterError("service", value, f"port {port} is not in 1..65535")
        return port
    try:
        return socket.getservbyname(part, "udp")
    except OSError:
        raise ParameterError(
            "service", value, f"{part!r} is neither a port number nor a udp service name "
            "in the services database"
        ) from None


def parse_service(value: str | int | None) -> Service:
    """Parse a service: ``None``/``""``, a port number, a service name, or ``"a:b"``.

    TIBCO Rendezvous Concepts, Transports, Network Transport Parameters, Service Parameter:
    a name is looked up with ``getservbyname`` (udp); a decimal string is the port; the
    default looks up ``rendezvous`` and falls back to 7500. The two-part form
    ``"service:inbox"`` gives the inbox (direct) port; ``0`` or nothing after the colon
    means an ephemeral one, and the two ports must differ.
    """
    if value is None:
        return Service(_service_port("", value), 0, None)
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise ParameterError("service", value, "must be a string")
    text = value.strip()
    first, colon, second = text.partition(":")
    port = _service_port(first.strip(), value)
    inbox = 0
    if colon:
        second = second.strip()
        if second and not second.isdigit():
            raise ParameterError("service", value, f"inbox port {second!r} is not a number")
        inbox = int(second) if second else 0
        if inbox > 65535:
            raise ParameterError("service", value, f"inbox port {inbox} is not in 0..65535")
        if inbox == port:
            raise ParameterError(
                "service", value, "the service port and the inbox port must differ"
            )
    return Service(port, inbox, value)


# -- network ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Network:
    """A parsed network parameter ``"interface;group1,group2;send-address"`` (no lookups)."""

    interface: str  # part 1 as given; "" = the interface of this host's name
    groups: tuple[str, ...]
    send_address: str | None  # part 3; None: the first group, or broadcast
    text: str

    @property
    def broadcast(self) -> bool:
        """No group and no send address: broadcast on the interface (Network Parameter)."""
        return not self.groups and self.send_address is None


def _ipv4(text: str, value: object, what: str) -> ipaddress.IPv4Address:
    try:
        return ipaddress.IPv4Address(text)
    except ValueError:
        raise ParameterError("network", value, f"{what} {text!r} is not an IPv4 address") from None


def parse_network(value: str | None) -> Network:
    """Parse a network parameter into its three parts; names are resolved later.

    TIBCO Rendezvous Concepts, Transports, Network Transport Parameters, Network Parameter:
    up to three parts separated by ``;`` — the network (interface), zero or more multicast
    groups separated by ``,``, and one send address (an IP address, not a name). With groups
    but no send address the first group is the send address; with neither, broadcast.
    """
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise ParameterError("network", value, "must be a string")
    parts = [p.strip() for p in value.split(";")]
    if len(parts) > 3:
        raise ParameterError(
            "network", value, "has more than three ';'-separated parts "
            "(interface;groups;send-address)"
        )
    parts += [""] * (3 - len(parts))
    interface, group_text, send_text = parts
    groups: list[str] = []
    if group_text:
        for g in group_text.split(","):
            g = g.strip()
            if not g:
                raise ParameterError("network", value, "has an empty multicast group")
            address = _ipv4(g, value, "multicast group")
            if address not in _MULTICAST_NET:
                raise ParameterError(
                    "network", value, f"group {g} is not a multicast address (224.0.0.0/4)"
                )
            if str(address) in groups:
                raise ParameterError("network", value, f"group {g} is listed twice")
            groups.append(str(address))
    send: str | None = None
    if send_text:
        send = str(_ipv4(send_text, value, "send address"))
    return Network(interface, tuple(groups), send, value)


# -- daemon ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Daemon:
    """A parsed daemon parameter, recorded only (the engine runs in the process)."""

    host: str | None  # None: the local daemon
    port: int
    text: str | None


def parse_daemon(value: str | int | None) -> Daemon:
    """Parse a daemon parameter: ``None``/``""``, ``"port"`` or ``"host:port"``.

    TIBCO Rendezvous Concepts, Transports, Network Transport Parameters, Daemon Parameter:
    the default client socket is 7500; ``"host:port"`` names a remote (or, with the loopback
    address, a local non-auto-started) daemon. The secure form ``"ssl:host:port"`` is
    refused: there is no daemon process to secure.
    """
    if value is None:
        return Daemon(None, DEFAULT_DAEMON_PORT, None)
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise ParameterError("daemon", value, "must be a string")
    text = value.strip()
    if text == "":
        return Daemon(None, DEFAULT_DAEMON_PORT, value)
    if text.lower().startswith("ssl:"):
        raise ParameterError(
            "daemon", value, "a secure daemon (ssl:) is not supported: the bus runs in the "
            "process and has no daemon connection"
        )
    host, colon, port_text = text.rpartition(":")
    if not colon:
        host, port_text = "", text
    elif not host:
        raise ParameterError("daemon", value, "has ':' but no host before it")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ParameterError("daemon", value, f"port {port_text!r} is not in 1..65535")
    return Daemon(host or None, int(port_text), value)


# -- interfaces ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Interface:
    """A local IPv4 interface: its address, name (when known) and broadcast address."""

    address: str
    name: str | None
    broadcast: str
    netmask: str = "255.255.255.255"


def _ioctl_address(sock: socket.socket, request: int, name: str) -> str | None:
    import fcntl

    try:
        reply = fcntl.ioctl(sock.fileno(), request, struct.pack("256s", name.encode()[:15]))
    except OSError:
        return None
    return socket.inet_ntoa(reply[20:24])


def local_interfaces() -> list[Interface]:
    """The IPv4 interfaces of this host (Linux: their primary addresses), in index order.

    Empty where ``if_nameindex`` or the ``SIOCGIFADDR`` ioctls are not available.
    """
    if not sys.platform.startswith("linux"):
        return []
    import fcntl

    found: list[Interface] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _index, name in socket.if_nameindex():
            address = _ioctl_address(s, _SIOCGIFADDR, name)
            if address is None:
                continue
            netmask = _ioctl_address(s, _SIOCGIFNETMASK, name) or "255.255.255.255"
            flags_reply = fcntl.ioctl(
                s.fileno(), _SIOCGIFFLAGS, struct.pack("256s", name.encode()[:15])
            )
            flags = struct.unpack_from("H", flags_reply, 16)[0]
            broadcast = LIMITED_BROADCAST
            if flags & _IFF_BROADCAST:
                broadcast = _ioctl_address(s, _SIOCGIFBRDADDR, name) or LIMITED_BROADCAST
            elif flags & _IFF_LOOPBACK:
                # The loopback interface has no broadcast flag, but the kernel delivers its
                # network's directed broadcast (127.255.255.255) locally.
                net = ipaddress.IPv4Network(f"{address}/{netmask}", strict=False)
                broadcast = str(net.broadcast_address)
            found.append(Interface(address, name, broadcast, netmask))
    return found


def is_local_address(address: str) -> bool:
    """True when a UDP socket can bind to ``address``: the kernel treats it as this host's."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind((address, 0))
        except OSError:
            return False
    return True


def _interface_for_address(address: str, interfaces: list[Interface]) -> Interface:
    for itf in interfaces:
        if itf.address == address:
            return itf
    ip = ipaddress.IPv4Address(address)
    for itf in interfaces:
        if ip in ipaddress.IPv4Network(f"{itf.address}/{itf.netmask}", strict=False):
            return Interface(address, itf.name, itf.broadcast, itf.netmask)
    return Interface(address, None, LIMITED_BROADCAST)


def _is_network_number(text: str) -> bool:
    parts = text.split(".")
    return 1 <= len(parts) <= 3 and all(p.isdigit() and int(p) < 256 for p in parts)


def resolve_interface(part: str, value: object = None) -> Interface:
    """Resolve the network parameter's first part to a local IPv4 interface.

    TIBCO Rendezvous Concepts, Transports, Network Transport Parameters, Network Parameter:
    a host name, a host IP address, a network number, an interface name, or the default, the
    interface that matches ``gethostname()``. ``value`` is the whole parameter, for errors.
    """
    if value is None:
        value = part
    interfaces = local_interfaces()
    if part == "":
        host = socket.gethostname()
        try:
            address = socket.gethostbyname(host)
        except OSError:
            raise ParameterError(
                "network", value, f"the default interface is the one of this host's name, "
                f"and {host!r} does not resolve; give the interface, e.g. "
                "'127.0.0.1;239.192.75.1'"
            ) from None
        if not is_local_address(address):
            raise ParameterError(
                "network", value, f"the default interface is the one of this host's name, "
                f"and {host!r} resolves to {address}, which is not an address of this host"
            )
        return _interface_for_address(address, interfaces)
    if _is_network_number(part):
        prefix = [int(p) for p in part.split(".")]
        for itf in interfaces:
            if [int(p) for p in itf.address.split(".")[: len(prefix)]] == prefix:
                return itf
        if not interfaces:
            raise ParameterError(
                "network", value, "network numbers are resolved only where the interfaces "
                "can be listed (Linux); give an IP address of this host"
            )
        raise ParameterError(
            "network", value, f"no interface of this host is on network {part}"
        )
    try:
        ip = ipaddress.IPv4Address(part)
    except ValueError:
        pass
    else:
        for itf in interfaces:  # a network number written in full, "192.0.2.0"
            net = ipaddress.IPv4Network(f"{itf.address}/{itf.netmask}", strict=False)
            if net.network_address == ip and net.prefixlen < 32:
                return itf
        if is_local_address(part):
            return _interface_for_address(part, interfaces)
        raise ParameterError(
            "network", value, f"{part} is neither an address of this host nor the network "
            "number of one of its interfaces"
        )
    for itf in interfaces:
        if itf.name == part:
            return itf
    if sys.platform.startswith("linux") and any(n == part for _, n in socket.if_nameindex()):
        raise ParameterError("network", value, f"interface {part} has no IPv4 address")
    try:
        address = socket.gethostbyname(part)
    except OSError:
        raise ParameterError(
            "network", value, f"{part!r} is not an IP address, network number, interface "
            "name or host name of this host (network names from the networks database are "
            "not looked up)"
        ) from None
    if not is_local_address(address):
        raise ParameterError(
            "network", value, f"host name {part!r} resolves to {address}, which is not an "
            "address of this host"
        )
    return _interface_for_address(address, interfaces)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A resolved network: the interface, the groups to join, where multicast data goes."""

    interface: Interface
    groups: tuple[str, ...]
    send_address: str
    broadcast: bool

    @property
    def send_is_multicast(self) -> bool:
        return ipaddress.IPv4Address(self.send_address) in _MULTICAST_NET


def resolve_network(network: Network) -> Endpoint:
    """Resolve a parsed network: interface, groups, and the send address (or broadcast)."""
    interface = resolve_interface(network.interface, network.text)
    if network.send_address is not None:
        send = network.send_address
    elif network.groups:
        send = network.groups[0]
    else:
        send = interface.broadcast
    return Endpoint(interface, network.groups, send, network.broadcast)


# -- sockets ---------------------------------------------------------------------------------


def open_service_socket(
    port: int, endpoint: Endpoint, receive_buffer: int = RECEIVE_BUFFER_SIZE
) -> socket.socket:
    """The shared service socket: bound to ``('', port)``, joined to every group."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "SO_REUSEPORT"):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        if _IP_MULTICAST_ALL is not None:
            sock.setsockopt(socket.IPPROTO_IP, _IP_MULTICAST_ALL, 0)
        sock.bind(("", port))
        itf = socket.inet_aton(endpoint.interface.address)
        for group in endpoint.groups:
            sock.setsockopt(
                socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, socket.inet_aton(group) + itf
            )
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def open_inbox_socket(port: int, endpoint: Endpoint, ttl: int) -> socket.socket:
    """The engine's own socket: unicast in, everything out (multicast, broadcast, unicast)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind((endpoint.interface.address, port))
        itf = socket.inet_aton(endpoint.interface.address)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, itf)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)
        if not endpoint.send_is_multicast:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


@dataclass(slots=True)
class Sockets:
    """What :func:`open_sockets` opened, with the parameters it opened them from."""

    service: Service
    network: Network
    daemon: Daemon
    endpoint: Endpoint
    ttl: int
    service_socket: socket.socket
    inbox_socket: socket.socket
    inbox_port: int = field(init=False)
    send_destination: tuple[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.inbox_port = self.inbox_socket.getsockname()[1]
        self.send_destination = (self.endpoint.send_address, self.service.port)

    def close(self) -> None:
        self.service_socket.close()
        self.inbox_socket.close()


def open_sockets(
    service: str | int | None = None,
    network: str | None = "",
    daemon: str | int | None = None,
    *,
    ttl: int = DEFAULT_MULTICAST_TTL,
    receive_buffer: int = RECEIVE_BUFFER_SIZE,
) -> Sockets:
    """Parse and resolve the three parameters and open the service and inbox sockets.

    ``ttl`` is the multicast TTL (0 keeps multicast on this host; 1, the default, on the
    local network). Raises :class:`ParameterError` for a bad parameter, ``OSError`` when the
    system refuses a socket operation (a port in use, a group it cannot join).
    """
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 0 <= ttl <= 255:
        raise ParameterError("ttl", ttl, "must be an integer in 0..255")
    parsed_service = parse_service(service)
    parsed_network = parse_network(network)
    parsed_daemon = parse_daemon(daemon)
    endpoint = resolve_network(parsed_network)
    service_socket = open_service_socket(parsed_service.port, endpoint, receive_buffer)
    try:
        inbox_socket = open_inbox_socket(parsed_service.inbox_port, endpoint, ttl)
    except BaseException:
        service_socket.close()
        raise
    return Sockets(
        parsed_service, parsed_network, parsed_daemon, endpoint, ttl, service_socket,
        inbox_socket,
    )
