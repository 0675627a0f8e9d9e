"""``routers.conf``: routers between RV-style buses that the gateway runs
(``transports/rv/router.py``, after the Rendezvous routing daemon, rvrd).

How this works. The file has the grammar of ``transports.conf``: one ``[name]`` section per
router (the name is the router's, unique among the routers of the routed network), then
``key = value`` lines. Sections are collected first and validated whole; every bad line is
an error naming file and line.

================  ============  ====================================================
``bus``           (2 or more)   ``NETWORK-NAME SERVICE NETWORK``: a bus to link, by its
                                network name (unique across the routed network, 1..127
                                bytes), the service (a UDP port or service name) and the
                                network parameter (``"127.0.0.1;239.192.80.1"``; quotes
                                optional)
``forward``       (none)        subjects always forwarded, comma-separated (``_RVCM.>``,
                                ``_RVFT.>``: certified delivery and fault tolerance
                                traffic, which carry no listen advisories)
``interval``      1 sec         between two state announcements of the router
``hop_limit``     16            routers a message may cross (1..255)
``requery``       60 sec        between two LISTEN.QUERY on each bus; a subject no
                                answer repeats is forgotten (its listener was killed);
                                0: only at start
``ttl``           1             the multicast TTL of the router's transports
================  ============  ====================================================

The gateway starts every router after its transports and stops them before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gateway.config.files import (
    SourceLine,
    parse_duration_ms,
    parse_int,
    parse_list,
    unquote,
)
from gateway.errors import ConfigError

_SECTION_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
MAX_ROUTER_NAME = 127
MAX_NETWORK_NAME = 127  # bytes (transports/rv/router.py: it travels in the envelope)
_NEVER_FORWARDED = ("_RV.", "_LOCAL.", "_RVRD.", "_INBOX.")


@dataclass(slots=True)
class RouterDef:
    """One ``[name]`` section of ``routers.conf``."""

    name: str
    file: str
    line: int
    buses: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (service, network)
    forward: tuple[str, ...] = ()
    interval: float = 1.0
    hop_limit: int = 16
    requery: float = 60.0
    ttl: int = 1

    def where(self) -> str:
        return f"{self.file}:{self.line}"


def _forward_subject(s: str) -> str:
    elements = s.split(".")
    if any(not e for e in elements) or len(s.encode()) > 255:
        raise ValueError(f"{s!r} is not a subject")
    for i, e in enumerate(elements):
        if ("*" in e and e != "*") or (">" in e and (e != ">" or i != len(elements) - 1)):
            raise ValueError(f"{s!r}: a wildcard is a whole element, '>' only the last")
    if (s + ".").startswith(_NEVER_FORWARDED):
        raise ValueError(f"{s!r} is never forwarded by a router")
    return s


def _bus(value: str, known: dict[str, tuple[str, str]]) -> tuple[str, str, str]:
    parts = value.split(None, 2)
    if len(parts) != 3:
        raise ValueError("bus is NETWORK-NAME SERVICE NETWORK")
    name, service, network = parts[0], parts[1], unquote(parts[2].strip())
    if len(name.encode()) > MAX_NETWORK_NAME or "\0" in name:
        raise ValueError(f"network name {name!r} is longer than {MAX_NETWORK_NAME} bytes")
    if name in known:
        raise ValueError(f"bus {name!r} is given twice")
    return name, service, network


def parse_routers(lines: list[SourceLine] | None,
                  errors: list[ConfigError]) -> dict[str, RouterDef]:
    """Validate the sections of ``routers.conf``; bad lines go to ``errors``."""
    out: dict[str, RouterDef] = {}
    current: RouterDef | None = None
    skipping = False
    for sl in lines or ():
        if sl.text.startswith("["):
            current, skipping = None, True
            if not sl.text.endswith("]"):
                errors.append(sl.error("missing ']' in the router name"))
                continue
            name = sl.text[1:-1].strip()
            if not _SECTION_NAME.fullmatch(name) or len(name) > MAX_ROUTER_NAME:
                errors.append(sl.error(f"invalid router name {name!r}"))
                continue
            if name in out:
                errors.append(sl.error(f"duplicate router {name!r} (first defined at "
                                       f"line {out[name].line})"))
                continue
            current, skipping = RouterDef(name, sl.file, sl.line), False
            out[name] = current
            continue
        if current is None:
            if not skipping:
                errors.append(sl.error("parameter outside a [router] section"))
            continue
        key, eq, value = sl.text.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not eq or not value:
            errors.append(sl.error(f"expected 'key = value', got {sl.text!r}"))
            continue
        try:
            if key == "bus":
                bus, service, network = _bus(value, current.buses)
                current.buses[bus] = (service, network)
            elif key == "forward":
                current.forward += tuple(_forward_subject(s) for s in parse_list(value))
            elif key == "interval":
                ms = parse_duration_ms(value)
                if ms <= 0:
                    raise ValueError("interval must be more than 0")
                current.interval = ms / 1000.0
            elif key == "hop_limit":
                current.hop_limit = parse_int(value, minimum=1, maximum=255)
            elif key == "requery":
                current.requery = parse_duration_ms(value) / 1000.0
            elif key == "ttl":
                current.ttl = parse_int(value, minimum=0, maximum=255)
            else:
                raise ValueError(f"unknown router parameter {key!r} "
                                 "(bus, forward, interval, hop_limit, requery, ttl)")
        except ValueError as exc:
            errors.append(sl.error(f"{key}: {exc}"))
    for r in list(out.values()):
        if len(r.buses) < 2:
            errors.append(ConfigError(r.file, r.line,
                                      f"router {r.name!r} needs two or more 'bus' lines"))
            del out[r.name]
    return out
