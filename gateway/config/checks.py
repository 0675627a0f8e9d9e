"""What ``gateway serve`` would refuse at start, found when the configuration loads.

How this works. The parsers of each file check each line; the loader's cross-file checks
then run, and these are the ones that look beyond the text: whether the module of each
listener's protocol is installed, whether a listener's host name resolves and whether two
listeners would bind one address, whether the store's and the delivery log's directories
can be made, whether the declarative mappings (``mappings/*.yaml``) compile, and whether the
RV-style bus parameters of ``routers.conf``, ``transports.conf`` and ``ft_network`` name an
interface of this host. ``gateway check-config`` and ``gateway serve`` both load through
:func:`gateway.config.load_config`, so both refuse such a configuration with the same
``file:line`` lines (exit status 1 and 2 as before). Nothing here binds a socket or
connects to a peer: a port in use, a store another gateway holds and an unreachable peer are
still found only at start (exit status 1). A host name is resolved (the system's resolver),
and the interfaces of this host are listed, so a configuration checked on another machine
may be answered differently there.

Modules outside the core (the adapters, the mapping engine, the RV-style bus's parameter
parsers) are loaded by name through :mod:`gateway.registry`, as at start.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import socket
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from gateway import registry
from gateway.config.gateway_conf import GatewaySettings, Listener
from gateway.config.routers import RouterDef
from gateway.config.transports import TransportDef
from gateway.errors import ConfigError, ConfigErrors

MAPPING_SET = "mappings.engine:MappingSet"
RV_PARSE_SERVICE = "transports.rv.net:parse_service"
RV_PARSE_NETWORK = "transports.rv.net:parse_network"
RV_RESOLVE_NETWORK = "transports.rv.net:resolve_network"

# A listener's bound addresses: ("*", family) for every address of that family, else
# (address, family). asyncio binds an IPv6 socket IPV6_V6ONLY, so "::" and "0.0.0.0" do not
# overlap, and every address of a host name (``localhost``: 127.0.0.1 and ::1).
Bound = tuple[str, int]


def listener_problems(settings: GatewaySettings, conf: str) -> list[ConfigError]:
    """The ``listen`` lines start would fail on: a protocol whose module is not installed,
    a host that is neither an address nor a name that resolves, and a listener that would
    bind an address and port an earlier line binds (equal addresses, an address and the
    wildcard of its family, a name and one of its addresses)."""
    errors: list[ConfigError] = []
    bound: list[tuple[Listener, set[Bound]]] = []
    for lst in settings.listen:
        reason = _unavailable(registry.ADAPTERS.get(lst.scheme, ""))
        if reason is not None:
            errors.append(ConfigError(conf, lst.line, f"listen {lst.url()}: {reason}"))
            continue
        try:
            addresses = _bound_addresses(lst.host, lst.port)
        except OSError as exc:
            errors.append(ConfigError(
                conf, lst.line, f"listen {lst.url()}: {lst.host!r} is neither an IP address "
                f"nor a host name that resolves ({exc.strerror or exc})"))
            continue
        if lst.port != 0:
            for other, theirs in bound:
                if other.port == lst.port and _overlap(addresses, theirs):
                    errors.append(ConfigError(
                        conf, lst.line, f"listen {lst.url()} binds an address and port that "
                        f"listen {other.url()} (line {other.line}) binds already"))
                    break
        bound.append((lst, addresses))
    return errors


def _unavailable(entry: str) -> str | None:
    """Why the registry entry ``module:attribute`` cannot be loaded (its module is not
    installed), without importing it; None when it can."""
    module = entry.partition(":")[0]
    if not module:
        return "unknown listener protocol"
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        found = False
    return None if found else f"{module} is not available in this build"


def _bound_addresses(host: str, port: int) -> set[Bound]:
    if host == "":  # every interface: asyncio binds 0.0.0.0 and ::
        return {("*", socket.AF_INET), ("*", socket.AF_INET6)}
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        return {_one(str(info[4][0]), int(info[0])) for info in infos}
    return {_one(str(ip), socket.AF_INET6 if ip.version == 6 else socket.AF_INET)}


def _one(address: str, family: int) -> Bound:
    return ("*" if ipaddress.ip_address(address.split("%")[0]).is_unspecified else address,
            family)


def _overlap(a: set[Bound], b: set[Bound]) -> bool:
    for addr, fam in a:
        for other, other_fam in b:
            if fam == other_fam and (addr == other or "*" in (addr, other)):
                return True
    return False


def directory_problems(settings: GatewaySettings, conf: str) -> list[ConfigError]:
    """The store's and the delivery log's directories, made at start (``os.makedirs``):
    refused where a path leading to them is a file. Permissions are left to start, which
    may run as another user than the check."""
    errors = []
    for key in ("store", "delivery_log_dir"):
        if key == "delivery_log_dir" and key not in settings.lines:
            continue  # under the store's directory: reported there
        path = Path(str(getattr(settings, key)))
        blocker = next((p for p in (path, *path.parents) if p.exists()), None)
        if blocker is not None and not blocker.is_dir():
            what = "is not a directory" if blocker == path else f"is under {str(blocker)!r}, " \
                   "a file"
            errors.append(ConfigError(conf, settings.lines.get(key),
                                      f"{key}: {str(path)!r} {what}"))
    return errors


def load_mappings(config_dir: Path, errors: list[ConfigError]) -> Any:
    """The declarative mappings of ``<config dir>/mappings/*.yaml`` (None without any),
    compiled as the gateway runs them; their problems go to ``errors``."""
    folder = config_dir / "mappings"
    if not folder.is_dir() or not any(folder.glob("*.yaml")):
        return None
    try:
        mapping_set = registry.import_string(MAPPING_SET)
        return mapping_set.load([folder])
    except ConfigErrors as exc:
        errors.extend(exc.errors)
    except registry.NotAvailableError as exc:
        errors.append(ConfigError(str(folder), None, f"mappings: {exc}"))
    return None


def rv_problems(settings: GatewaySettings, transports: Iterable[TransportDef],
                routers: Iterable[RouterDef], conf: str) -> list[ConfigError]:
    """The RV-style bus parameters the gateway opens sockets with at start: each router's
    buses, each ``type = rv`` transport that runs, and ``ft_group``'s ``ft_network``. A
    service must be a port or a udp service name, a network must parse and its interface
    be one of this host's (transports/rv/net.py, loaded by name)."""
    jobs: list[tuple[str, int | None, str, str]] = []  # file, line, service, network
    for r in routers:
        for service, network in r.buses.values():
            jobs.append((r.file, r.line, service, network))
    for t in transports:
        if t.type == "rv" and settings.transports_enabled("rv"):
            jobs.append((t.file, t.line, str(t.params.get("service", "")),
                         str(t.params.get("network", ""))))
    if settings.ft_group:
        jobs.append((conf, settings.lines.get("ft_network", settings.lines.get("ft_group")),
                     str(settings.ft_service), settings.ft_network))
    if not jobs:
        return []
    try:
        parse_service: Callable[[str], Any] = registry.import_string(RV_PARSE_SERVICE)
        parse_network: Callable[[str], Any] = registry.import_string(RV_PARSE_NETWORK)
        resolve_network: Callable[[Any], Any] = registry.import_string(RV_RESOLVE_NETWORK)
    except registry.NotAvailableError as exc:
        file, line, _, _ = jobs[0]
        return [ConfigError(file, line, str(exc))]
    errors = []
    for file, line, service, network in jobs:
        try:
            parse_service(service)
            resolve_network(parse_network(network))
        except ValueError as exc:  # transports.rv.net.ParameterError
            errors.append(ConfigError(file, line, str(exc)))
    return errors

