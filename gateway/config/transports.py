"""``transports.conf``: the gateway's connections, as a client, to systems outside it.

How this works. The file follows EMS's grammar (TIBCO EMS User's Guide, "transports.conf"): one
``[name]`` section per transport, then ``key = value`` lines; ``type`` is required. Sections
are collected first and validated whole, so ``type`` may come anywhere in its section. The
result is one :class:`TransportDef` per section whose ``params`` holds every parameter of
its type, typed and defaulted (``None`` where there is no default). Durations are float
seconds, sizes bytes, paths absolute.

Common parameters (every type; EMS User's Guide, "transports.conf"):

========================  =====================  =============================================
``type``                  (required)             ``mqtt``, ``amqp``, ``stomp`` or ``rv`` (alias
                                                 ``tibrv``)
``topic_import_dm``       ``NON_PERSISTENT``     delivery mode of imported topic messages:
                                                 ``PERSISTENT``, ``NON_PERSISTENT``, ``RELIABLE``
                                                 (``TIBEMS_`` prefix accepted) → ``DeliveryMode``
``queue_import_dm``       ``NON_PERSISTENT``     the same for imported queue messages
``export_headers``        true                   carry JMS headers on exported messages
``export_properties``     true                   carry JMS properties on exported messages
``inbound_queue_policy``  ``DISCARD_NONE``       ``POLICY:max_msgs:qty_discard`` (alias
                                                 ``rv_queue_policy``; EMS User's Guide,
                                                 "Configuring Transports for Rendezvous",
                                                 rv_queue_policy); a bad value is a warning and
                                                 means DISCARD_NONE (EMS User's Guide, appendix
                                                 "Error and Status Messages") → :class:`QueuePolicy`
``required``              false                  the gateway stops if this transport cannot start
``max_hops``              8                      drop imported messages that crossed more
                                                 gateways than this (loop prevention)
========================  =====================  =============================================

Client transports (``mqtt``, ``amqp``, ``stomp``) also take ``reconnect_min`` (1 s) and
``reconnect_max`` (60 s) — the back-off bounds; ``spool_max_msgs`` (100000) and
``spool_max_bytes`` (64MB) — the export spool kept while the far side is down, 0 =
unlimited; ``spool_policy`` (``block`` | ``reject``) when the spool is full; ``tls_ca``,
``tls_cert``, ``tls_key``.

========  ===========================================================================
``mqtt``  ``url`` (required; ``mqtt://host:port`` or ``mqtts://``), ``client_id``,
          ``username``, ``password``, ``protocol_version`` (``3.1.1`` | ``5``; 5),
          ``qos`` (0-2; 1), ``clean_start`` (false), ``keepalive`` (60 s),
          ``remote_prefix`` (prepended to remote topic names; "")
``amqp``  ``url`` (required; ``amqp://`` or ``amqps://``), ``container_id``, ``username``,
          ``password``, ``settle`` (``at-most-once`` | ``at-least-once``; at-least-once),
          ``address_prefix_topic`` (``topic://``), ``address_prefix_queue`` (``queue://``),
          ``idle_timeout`` (60 s), ``durable_subscriptions`` (false; topic imports),
          ``anonymous_relay`` (false; true: one sender link for every export when the
          peer offers ``ANONYMOUS-RELAY``)
``stomp`` ``url`` (``stomp://`` or ``stomps://``) or ``host`` and ``port`` (61613),
          ``login``, ``passcode``, ``vhost``, ``heartbeat`` (``cx,cy`` ms; 10000,10000),
          ``receipts`` (true), ``topic_prefix`` (``/topic/``), ``queue_prefix``
          (``/queue/``), ``client_id``, ``durable_subscriptions`` (false; topic imports).
          ``params["url"]``, ``["host"]`` and ``["port"]`` are always set
``rv``    ``service`` (a UDP port, or a udp service name looked up in the services
          database when the file is read, an empty one as ``rendezvous``; 7500; the
          parameter holds the port), ``network`` (""), ``daemon`` (""),
          ``temp_destination_timeout`` (60 s; EMS User's Guide,
          "Configuring Transports for Rendezvous", temp_destination_timeout).
          Certified delivery (EMS's ``tibrvcm`` parameters, EMS User's Guide,
          "Configuring Transports for Rendezvous Certified Messaging"): ``cm_name``
          (the correspondent name; certified delivery is on when it is given),
          ``ledger_file`` (a file ledger, resolved against the configuration directory;
          none: in memory), ``sync_ledger`` (false), ``request_old`` (false),
          ``explicit_config_only`` (false), ``default_ttl`` (0 s = none; the time limit
          of exports), ``cm_listener`` (``NAME SUBJECT[, NAME SUBJECT ...]``: listeners
          registered in advance, as EMS's tibrvcm.conf; no wildcards). The others need
          ``cm_name``
========  ===========================================================================
"""

from __future__ import annotations

import enum
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from gateway.config.files import (
    SourceLine,
    parse_bool,
    parse_duration_ms,
    parse_int,
    parse_size,
    resolve_path,
    unquote,
)
from gateway.config.gateway_conf import parse_listener
from gateway.errors import ConfigError
from gateway.message import DeliveryMode
from gateway.tls import load_problems

TRANSPORT_TYPES = ("mqtt", "amqp", "stomp", "rv")
_TYPE_ALIASES = {"tibrv": "rv"}
_SECTION_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_TRANSPORT_NAME = 127
# EMS User's Guide, appendix "Error and Status Messages": "at least 10% of the maxEvents"
DISCARD_TOO_SMALL_FRACTION = 10


class DiscardPolicy(enum.Enum):
    """What a full inbound queue drops (EMS User's Guide,
    "Configuring Transports for Rendezvous", rv_queue_policy)."""

    NONE = "DISCARD_NONE"
    FIRST = "DISCARD_FIRST"  # the oldest, next to be dispatched
    LAST = "DISCARD_LAST"  # the most recently received


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """``inbound_queue_policy``: when ``max_msgs`` wait, drop ``qty_discard`` of them."""

    policy: DiscardPolicy = DiscardPolicy.NONE
    max_msgs: int = 0
    qty_discard: int = 0


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a client transport connects."""

    scheme: str
    host: str
    port: int

    @property
    def tls(self) -> bool:
        return self.scheme.endswith("s")

    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


@dataclass(frozen=True, slots=True, eq=False)
class TransportDef:
    """One ``[name]`` section of ``transports.conf``, validated and typed."""

    name: str
    type: str
    params: Mapping[str, Any]
    line: int | None = None
    file: str = "transports.conf"

    def where(self) -> str:
        return self.file if self.line is None else f"{self.file}:{self.line}"


# -- value parsers ---------------------------------------------------------------------

_REQUIRED = object()  # "no default: the parameter must be given"


def _dm(v: str) -> DeliveryMode:
    word = v.upper()
    word = word.removeprefix("TIBEMS_")
    try:
        return DeliveryMode[word]
    except KeyError:
        raise ValueError(
            f"{v!r} is not a delivery mode (PERSISTENT, NON_PERSISTENT or RELIABLE)"
        ) from None


def _seconds(v: str) -> float:
    return parse_duration_ms(v) / 1000.0


def _text(v: str) -> str:
    if not v:
        raise ValueError("value is empty")
    return v


def _any_text(v: str) -> str:
    return v


def _choice(*options: str) -> Callable[[str], str]:
    def parse(v: str) -> str:
        if v.lower() not in options:
            raise ValueError(f"{v!r} is not one of {', '.join(options)}")
        return v.lower()

    return parse


RV_DEFAULT_SERVICE = 7500  # TIBCO Rendezvous Concepts, "Service Parameter": the default port
RV_SERVICE_NAME = "rendezvous"  # the services-database name an empty service looks up


def _rv_service(v: str) -> int:
    """The RV ``service``: a UDP port number, or a service name looked up in the services
    database (``getservbyname``, udp); empty looks up ``rendezvous`` and falls back to 7500
    (TIBCO Rendezvous Concepts, Transports, "Service Parameter"; as transports/rv/net.py)."""
    text = v.strip()
    if not text:
        try:
            return socket.getservbyname(RV_SERVICE_NAME, "udp")
        except OSError:
            return RV_DEFAULT_SERVICE
    if text.isdigit():
        return parse_int(text, minimum=1, maximum=65535)
    try:
        return socket.getservbyname(text, "udp")
    except OSError:
        raise ValueError(f"{text!r} is neither a port number nor a udp service name in the "
                         "services database") from None


def _int_range(lo: int, hi: int | None = None) -> Callable[[str], int]:
    return lambda v: parse_int(v, minimum=lo, maximum=hi)


def _endpoint(*schemes: str) -> Callable[[str], Endpoint]:
    def parse(v: str) -> Endpoint:
        lst = parse_listener(v)
        if lst.scheme not in schemes:
            raise ValueError(f"{v!r}: the scheme must be {' or '.join(schemes)}")
        if not lst.host:
            raise ValueError(f"{v!r} names no host")
        return Endpoint(lst.scheme, lst.host, lst.port)

    return parse


def _mqtt_version(v: str) -> str:
    if v in ("3.1.1", "311", "4"):
        return "3.1.1"
    if v in ("5", "5.0"):
        return "5"
    raise ValueError(f"{v!r} is not an MQTT protocol version (3.1.1 or 5)")


def _heartbeat(v: str) -> tuple[int, int]:
    parts = [p.strip() for p in v.split(",")]
    if len(parts) != 2:
        raise ValueError(f"{v!r} is not 'cx,cy' (two millisecond values)")
    return parse_int(parts[0]), parse_int(parts[1])


def _cm_name(v: str) -> str:
    """A correspondent name, or a CM listener's subject: a bus subject (dot-separated
    non-empty elements, at most 255 bytes) with no wildcard, not starting with ``_`` (TIBCO
    Rendezvous Concepts, Certified Message Delivery: names follow subject syntax)."""
    elements = v.split(".")
    if not v or len(v.encode()) > 255 or "" in elements or "\0" in v:
        raise ValueError(f"{v!r} is not a subject name (dot-separated, no empty element, "
                         "at most 255 bytes)")
    if "*" in elements or ">" in elements:
        raise ValueError(f"{v!r} takes no wildcard")
    if v.startswith("_"):
        raise ValueError(f"{v!r} starts with '_' (reserved)")
    return v


def _cm_listeners(v: str) -> tuple[tuple[str, str], ...]:
    """``NAME SUBJECT[, NAME SUBJECT ...]``: CM listeners registered in advance."""
    out = []
    for item in v.split(","):
        parts = item.split()
        if len(parts) != 2:
            raise ValueError(f"{item.strip()!r} is not 'NAME SUBJECT'")
        out.append((_cm_name(parts[0]), _cm_name(parts[1])))
    return tuple(out)


CM_PARAMS = ("ledger_file", "sync_ledger", "request_old", "explicit_config_only",
             "default_ttl", "cm_listener")

_PATH = object()  # marker: the value is a file path, resolved and checked

Spec = dict[str, tuple[Callable[[str], Any], Any]]

_COMMON: Spec = {
    "type": (_text, _REQUIRED),
    "topic_import_dm": (_dm, DeliveryMode.NON_PERSISTENT),
    "queue_import_dm": (_dm, DeliveryMode.NON_PERSISTENT),
    "export_headers": (parse_bool, True),
    "export_properties": (parse_bool, True),
    "inbound_queue_policy": (_text, QueuePolicy()),  # parsed by parse_queue_policy
    "required": (parse_bool, False),
    "max_hops": (_int_range(1, 255), 8),
}
_CLIENT: Spec = {
    "reconnect_min": (_seconds, 1.0),
    "reconnect_max": (_seconds, 60.0),
    "spool_max_msgs": (_int_range(0), 100_000),
    "spool_max_bytes": (parse_size, 64 * 1024**2),
    "spool_policy": (_choice("block", "reject"), "block"),
    "tls_ca": (_text, None),
    "tls_cert": (_text, None),
    "tls_key": (_text, None),
}
_PATH_PARAMS = ("tls_ca", "tls_cert", "tls_key")
SPECS: dict[str, Spec] = {
    "mqtt": {
        **_COMMON,
        **_CLIENT,
        "url": (_endpoint("mqtt", "mqtts"), _REQUIRED),
        "client_id": (_text, None),
        "username": (_any_text, None),
        "password": (_any_text, None),
        "protocol_version": (_mqtt_version, "5"),
        "qos": (_int_range(0, 2), 1),
        "clean_start": (parse_bool, False),
        "keepalive": (_seconds, 60.0),
        "remote_prefix": (_any_text, ""),
    },
    "amqp": {
        **_COMMON,
        **_CLIENT,
        "url": (_endpoint("amqp", "amqps"), _REQUIRED),
        "container_id": (_text, None),
        "username": (_any_text, None),
        "password": (_any_text, None),
        "settle": (_choice("at-most-once", "at-least-once"), "at-least-once"),
        "address_prefix_topic": (_any_text, "topic://"),
        "address_prefix_queue": (_any_text, "queue://"),
        "idle_timeout": (_seconds, 60.0),
        "durable_subscriptions": (parse_bool, False),
        "anonymous_relay": (parse_bool, False),
    },
    "stomp": {
        **_COMMON,
        **_CLIENT,
        "url": (_endpoint("stomp", "stomps"), None),
        "host": (_text, None),
        "port": (_int_range(1, 65535), None),
        "login": (_any_text, None),
        "passcode": (_any_text, None),
        "vhost": (_text, None),
        "heartbeat": (_heartbeat, (10_000, 10_000)),
        "receipts": (parse_bool, True),
        "topic_prefix": (_any_text, "/topic/"),
        "queue_prefix": (_any_text, "/queue/"),
        "client_id": (_text, None),
        "durable_subscriptions": (parse_bool, False),
    },
    "rv": {
        **_COMMON,
        "service": (_rv_service, RV_DEFAULT_SERVICE),
        "network": (_any_text, ""),
        "daemon": (_any_text, ""),
        "temp_destination_timeout": (_seconds, 60.0),
        "cm_name": (_cm_name, None),
        "ledger_file": (_text, None),
        "sync_ledger": (parse_bool, False),
        "request_old": (parse_bool, False),
        "explicit_config_only": (parse_bool, False),
        "default_ttl": (_seconds, 0.0),
        "cm_listener": (_cm_listeners, ()),
    },
}


def parse_queue_policy(value: str, warn: Callable[[str], None]) -> QueuePolicy:
    """Parse ``POLICY:max_msgs:qty_discard`` with EMS's rules (EMS User's Guide, appendix
    "Error and Status Messages").

    Every problem is a warning (passed to ``warn``) and gives ``DISCARD_NONE``, except a
    discard amount under 10% of ``max_msgs``, which warns and keeps the policy.
    """
    parts = [p.strip() for p in value.split(":")]
    word = parts[0].upper().removeprefix("TIBRVQUEUE_")
    policy = next((p for p in DiscardPolicy if p.value == word), None)
    none = QueuePolicy()
    if len(parts) not in (1, 3) or any(not re.fullmatch(r"-?\d+", p) for p in parts[1:]):
        warn(f"error parsing the queue limit policy value {value!r}; using DISCARD_NONE")
        return none
    if policy is None:
        warn(f"queue limit policy {parts[0]!r} unknown or not supported; using DISCARD_NONE")
        return none
    if policy is DiscardPolicy.NONE:
        return none
    if len(parts) == 1:
        warn(f"queue limit policy {value!r} needs :max_msgs:qty_discard; using DISCARD_NONE")
        return none
    max_msgs, qty = int(parts[1]), int(parts[2])
    if max_msgs <= 0 or qty <= 0:
        warn(
            "max_msgs and qty_discard must be strictly positive for a queue limit policy "
            "other than DISCARD_NONE; using DISCARD_NONE"
        )
        return none
    if qty > max_msgs:
        warn(
            f"the discard amount {qty} is too big compared to max_msgs {max_msgs}; "
            "using DISCARD_NONE"
        )
        return none
    if qty * DISCARD_TOO_SMALL_FRACTION < max_msgs:
        warn(
            f"the discard amount {qty} is too small for the queue limit policy; "
            "at least 10% of max_msgs is recommended"
        )
    return QueuePolicy(policy, max_msgs, qty)


def parse_transports(
    lines: list[SourceLine] | None,
    base_dir: str | os.PathLike[str],
    errors: list[ConfigError],
    warnings: list[str],
    seen_names: set[str] | None = None,
) -> dict[str, TransportDef]:
    """Validate the sections of ``transports.conf``; bad lines go to ``errors``.

    ``seen_names``, if given, receives every section name, valid or not (so that a
    destination naming a transport whose section has errors is not reported twice).
    """
    sections: list[tuple[SourceLine, str, list[SourceLine]]] = []
    seen: dict[str, SourceLine] = {}
    current: list[SourceLine] | None = None
    for sl in lines or ():
        if sl.text.startswith("["):
            current = None
            if not sl.text.endswith("]"):
                errors.append(sl.error("missing ']' in the transport name"))
                current = []  # swallow the section's lines
                continue
            name = sl.text[1:-1].strip()
            if not _SECTION_NAME.fullmatch(name) or len(name) > MAX_TRANSPORT_NAME:
                errors.append(sl.error(f"invalid transport name {name!r}"))
                current = []
                continue
            if name in seen:
                errors.append(
                    sl.error(
                        f"duplicate transport {name!r} (first defined at line {seen[name].line})"
                    )
                )
                current = []
                continue
            seen[name] = sl
            if seen_names is not None:
                seen_names.add(name)
            current = []
            sections.append((sl, name, current))
        elif current is None:
            errors.append(sl.error("parameter outside a [transport] section"))
        else:
            current.append(sl)
    out: dict[str, TransportDef] = {}
    for header, name, body in sections:
        t = _section(header, name, body, base_dir, errors, warnings)
        if t is not None:
            out[name] = t
    return out


def _section(
    header: SourceLine,
    name: str,
    body: list[SourceLine],
    base_dir: str | os.PathLike[str],
    errors: list[ConfigError],
    warnings: list[str],
) -> TransportDef | None:
    before = len(errors)
    kv: dict[str, tuple[str, SourceLine]] = {}
    for sl in body:
        key, sep, raw = sl.text.partition("=")
        key = key.strip().lower()
        if not sep or not _KEY.fullmatch(key):
            errors.append(sl.error(f"expected 'key = value', got {sl.text!r}"))
            continue
        if key == "rv_queue_policy":
            key = "inbound_queue_policy"  # EMS spelling (EMS User's Guide, "transports.conf")
        if key in kv:
            what = "transport type" if key == "type" else f"parameter {key!r}"
            errors.append(
                sl.error(f"duplicate specification of {what} (first at line {kv[key][1].line})")
            )
            continue
        try:
            kv[key] = (unquote(raw.strip()), sl)
        except ValueError as e:
            errors.append(sl.error(f"{key}: {e}"))
    if "type" not in kv:
        errors.append(
            header.error(f"transport {name!r} has no type (type = {' | '.join(TRANSPORT_TYPES)})")
        )
        return None
    type_text, type_line = kv["type"]
    ttype = _TYPE_ALIASES.get(type_text.lower(), type_text.lower())
    if ttype not in SPECS:
        errors.append(type_line.error(f"invalid transport type {type_text!r}"))
        return None
    spec = SPECS[ttype]
    params: dict[str, Any] = {"type": ttype}
    for key, (value, sl) in kv.items():
        if key == "type":
            continue
        if key not in spec:
            errors.append(sl.error(f"invalid transport parameter {key!r} for type {ttype!r}"))
            continue
        if key == "inbound_queue_policy":
            where = sl.where()
            found: list[str] = []
            params[key] = parse_queue_policy(value, found.append)
            warnings.extend(f"{where}: {m}" for m in found)
            continue
        try:
            params[key] = spec[key][0](value)
        except ValueError as e:
            errors.append(sl.error(f"{key}: {e}"))
            continue
        if key == "ledger_file":
            params[key] = resolve_path(params[key], base_dir)
        if key in _PATH_PARAMS:
            params[key] = resolve_path(params[key], base_dir)
            if not os.path.isfile(params[key]):
                errors.append(sl.error(f"{key}: file {params[key]!r} does not exist"))
    for key, (_, default) in spec.items():
        if key in params or key in kv:
            continue
        if default is _REQUIRED:
            errors.append(header.error(f"transport {name!r} (type {ttype}) needs {key!r}"))
        else:
            params[key] = default
    if ttype == "stomp":
        if any(k in kv for k in ("url", "host", "port")):
            _stomp_address(kv, params, errors)
        else:
            errors.append(header.error(f"transport {name!r} (type stomp) needs 'url' or 'host'"))
    if "reconnect_min" in params and len(errors) == before:
        if params["reconnect_min"] > params["reconnect_max"]:
            at = kv.get("reconnect_min", kv.get("reconnect_max", ("", header)))[1]
            errors.append(at.error("reconnect_min is larger than reconnect_max"))
    if ttype == "rv" and "cm_name" not in kv:
        for key in CM_PARAMS:
            if key in kv:
                errors.append(kv[key][1].error(f"{key} needs cm_name (certified delivery)"))
    if "tls_key" in kv and "tls_cert" not in kv:
        errors.append(kv["tls_key"][1].error("tls_key is set but tls_cert is not"))
    url = params.get("url")
    if isinstance(url, Endpoint) and not url.tls:
        for key in _PATH_PARAMS:
            if key in kv:
                warnings.append(f"{kv[key][1].where()}: {key} is ignored: {url.url()} is not TLS")
    elif isinstance(url, Endpoint) and len(errors) == before:
        # Loaded now as at every connect, where a file that does not load would only be
        # a failed connection retried for ever (gateway/tls.py).
        for key, msg in load_problems(params.get("tls_cert"), params.get("tls_key"),
                                      params.get("tls_ca"), client=True):
            errors.append(kv[key][1].error(msg))
    if len(errors) > before:
        return None
    return TransportDef(name, ttype, MappingProxyType(params), header.line, header.file)


def _stomp_address(
    kv: dict[str, tuple[str, SourceLine]],
    params: dict[str, Any],
    errors: list[ConfigError],
) -> None:
    """STOMP takes ``url`` or ``host`` [+ ``port``]; fill ``url``, ``host`` and ``port``."""
    if "url" in kv:
        for key in ("host", "port"):
            if key in kv:
                errors.append(kv[key][1].error(f"give either 'url' or '{key}', not both"))
        url = params.get("url")
        if isinstance(url, Endpoint):
            params["host"], params["port"] = url.host, url.port
        return
    if "host" not in kv:
        errors.append(kv["port"][1].error("'port' needs 'host' (or use 'url')"))
        return
    host = params.get("host")
    port = params.get("port") or 61613
    if isinstance(host, str):
        params["port"] = port
        params["url"] = Endpoint("stomp", host, port)
