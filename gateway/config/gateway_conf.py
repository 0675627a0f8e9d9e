"""``gateway.conf``: the gateway's own parameters (the counterpart of EMS's ``tibemsd.conf``).

How this works. Each line is ``name = value`` (TIBCO EMS User's Guide,
"Mechanics of Configuration"); ``#`` starts a comment; a value holding blanks may be
double-quoted. Every parameter is optional; ``listen`` may be repeated, any other parameter
given twice is an error, and so is a parameter the table below does not name (EMS's JSON
configuration silently ignores unknown names, EMS User's Guide, "tibemsd.conf",
startup_abort_list; we do not). Relative paths resolve against the config directory, or against
the working directory for the embedded default configuration.

==================================  =================  ===============================================
parameter                           default            meaning
==================================  =================  ===============================================
``server``                          ``gateway``        gateway name: at most 64 characters, no ``.``
                                                       (EMS ``server``, EMS User's Guide,
                                                       "tibemsd.conf")
``listen``                          see below          ``scheme://host:port``, repeatable
                                                       (EMS User's Guide, "tibemsd.conf", listen).
                                                       ``host`` may be ``[::1]``; no host
                                                       (``mqtt://:1883``, ``mqtt://1883``) means all
                                                       interfaces; the port defaults per scheme
                                                       (mqtt 1883, mqtts 8883, amqp 5672, amqps
                                                       5671, stomp 61613, stomps 61614, http 8080,
                                                       https 8443). ``listen = none``: no
                                                       listener. Without any ``listen`` line:
                                                       mqtt, amqp, stomp and http on 127.0.0.1
                                                       at their default ports
``store``                           ``data``           directory of the message store
``store_type``                      ``sqlite``         ``sqlite`` or ``memory`` (nothing survives a
                                                       restart)
``store_sync``                      enabled            fsync once per group commit
``delivery_log``                    enabled            write the delivery log
``delivery_log_dir``                ``<store>/delivery-log``  where delivery log files go
``delivery_log_max_file_size``      64MB               roll to a new file past this size; 0 = never
``authorization``                   disabled           authenticate users and check ACLs on ``secure``
                                                       destinations (EMS User's Guide,
                                                       "tibemsd.conf", authorization);
                                                       disabled: every connection is accepted,
                                                       whatever user name and password it gives
                                                       (EMS User's Guide, "Enabling Access Control")
``allow_anonymous``                 enabled            with ``authorization`` enabled, accept
                                                       connections without a user name (EMS's
                                                       ``anonymous`` user, EMS User's Guide,
                                                       "Users and Groups", "Users")
``flow_control``                    disabled           enforce destinations' ``flowControl``
                                                       (EMS User's Guide, "tibemsd.conf",
                                                       flow_control)
``max_msg_memory``                  512MB              memory for pending messages; 0 = unlimited
                                                       (EMS User's Guide, "tibemsd.conf",
                                                       max_msg_memory). Past it a producer is
                                                       held (``flow_control`` enabled) or refused
``msg_swapping``                    enabled            persistent queue messages leave memory for
                                                       the store past 75% of ``max_msg_memory`` and
                                                       are read back before delivery
                                                       (EMS User's Guide, "tibemsd.conf",
                                                       msg_swapping)
``destination_backlog_swapout``     1024               with ``msg_swapping``, pending messages a
                                                       queue keeps in memory; those behind them
                                                       are swapped out as they come; 0 = all
                                                       (EMS User's Guide, "tibemsd.conf",
                                                       Connection and Memory Parameters). A
                                                       durable subscription (an MQTT persistent
                                                       session's too) keeps as many (at least 1)
                                                       and leaves the persistent messages after
                                                       them in the store only
``max_client_msg_size``             0                  reject larger incoming messages; 0 = any size;
                                                       at most 2GB (EMS User's Guide,
                                                       "tibemsd.conf", max_client_msg_size)
``max_connections``                 0                  simultaneous client connections; 0 = unlimited
                                                       (EMS User's Guide, "tibemsd.conf",
                                                       max_connections)
``listen_backlog``                  0                  accept queue of every listener (MQTT, AMQP,
                                                       STOMP, HTTP): connections the system completes
                                                       before the gateway accepts them; 0 = the
                                                       system's maximum, ``net.core.somaxconn``
                                                       (4096 where it cannot be read); the system
                                                       caps any value at ``somaxconn``
``selector_logical_operator_limit`` 5000               accepted for EMS compatibility
                                                       (EMS User's Guide, "tibemsd.conf",
                                                       selector_logical_operator_limit) but not
                                                       needed: selectors are compiled, never
                                                       recurse, and their nesting is capped
                                                       when compiled
``mqtt_max_inflight_messages``      20                 outgoing QoS 1 and 2 messages in flight (sent,
                                                       not yet acknowledged) per MQTT 3.1/3.1.1
                                                       client, as mosquitto's
                                                       ``max_inflight_messages``; 0 = 65,535. An
                                                       MQTT 5 client's own Receive Maximum is used
                                                       for it (MQTT 5.0 §3.1.2.11.3)
``mqtt_max_queued_messages``        1000               messages queued (beyond those in flight) per
                                                       subscription of an MQTT session, connected
                                                       or offline, as mosquitto's
                                                       ``max_queued_messages``; past it a QoS 0
                                                       message is dropped for that client and a
                                                       QoS 1/2 one follows the topic's
                                                       ``overflowPolicy``; 0 = no limit
``mqtt_max_queued_bytes``           0                  the same bound in bytes (queued and in
                                                       flight), as mosquitto's
                                                       ``max_queued_bytes``; 0 = no limit
``mqtt_transports``                 disabled           run the ``type = mqtt`` transports of
                                                       ``transports.conf`` (as EMS's
                                                       ``tibrv_transports``, EMS User's Guide,
                                                       "tibemsd.conf", tibrv_transports)
``amqp_transports``                 disabled           the same for ``type = amqp``
``stomp_transports``                disabled           the same for ``type = stomp``
``rv_transports``                   disabled           the same for ``type = rv``
``startup_abort_list``              (empty)            stop at start-up on failures of these kinds:
                                                       ``TLS`` (alias ``SSL``), ``TRANSPORTS``,
                                                       ``LISTENERS``, ``CONFIG_FILES``,
                                                       ``CONFIG_ERRORS``, ``DB_FILES``
                                                       (EMS User's Guide, "tibemsd.conf",
                                                       startup_abort_list). Config errors
                                                       always stop the gateway;
                                                       ``CONFIG_ERRORS`` is accepted for EMS
                                                       compatibility
``tls_cert``                        (none)             PEM certificate chain for TLS listeners;
                                                       required when a TLS listener is configured
``tls_key``                         (none)             PEM private key (if not in ``tls_cert``)
``tls_ca``                          (none)             PEM CA bundle to verify client certificates
``tls_require_client_cert``         disabled           TLS clients must present a certificate that
                                                       ``tls_ca`` verifies (EMS User's Guide,
                                                       "tibemsd.conf", ssl_require_client_cert)
``mqtt_max_keepalive``              0                  the longest MQTT Keep Alive, in seconds (at most
                                                       65535), as mosquitto's ``max_keepalive``: an
                                                       MQTT 5 client asking more, or 0 (none), is
                                                       told this value (CONNACK Server Keep Alive)
                                                       and held to it; a 3.1/3.1.1 client, which
                                                       cannot be told, is held to it too. 0 = no
                                                       maximum: the client's Keep Alive stands
``ft_group``                        (none)             run as a member of this fault-tolerance group
                                                       of the RV-style bus: the gateway starts only
                                                       when the group activates it, and gives way
                                                       when it deactivates it (gateways sharing a
                                                       ``store`` directory: a primary and backups)
``ft_service``                      ``7500``           the bus service (UDP port) of the group
``ft_network``                      ""                 the bus network of the group
``ft_weight``                       50                 this gateway's weight in the group
``ft_heartbeat``                    1 sec              the group's heartbeat interval
``ft_activation``                   3 sec              the group's activation interval: how long a
                                                       silent active gateway is waited for
``amqp_default_destination``        ``queue``          what a bare AMQP address (no ``queue://`` or
                                                       ``topic://`` prefix, no capability or
                                                       ``x-opt-jms-dest`` saying) names: ``queue``
                                                       or ``topic``
``admin_token_lifetime``            1 hour             how long a bearer token of the admin API
                                                       (``POST /api/v1/tokens``) stays valid; a
                                                       bare number is seconds
``metrics_max_destinations``        100                destinations of each kind (queues, topics) that
                                                       ``GET /metrics`` gives series of their own,
                                                       the first in name order; the others, and
                                                       temporary ones, add up in one series
                                                       ``destination="_other"``; 0 = every one
                                                       (``gateway.metrics``)
``monitor_metrics_interval``        60 sec             seconds between the metrics messages on
                                                       ``$sys.monitor.metrics.*`` topics, each sent
                                                       only while it has a subscriber (Sun MQ's
                                                       ``imq.metrics.topic.interval``, Sun MQ
                                                       Administration Guide, "Monitoring Service
                                                       Properties"); 0 = none (``gateway/monitor.py``)
``cluster``                         (none)             ``nats://host:port[,nats://host:port...]``: run
                                                       as a node of a cluster of gateways that share
                                                       topics through these NATS servers (cluster/);
                                                       without it the gateway runs alone
``cluster_name``                    ``gateway``        the cluster's name: the prefix of its NATS
                                                       subjects (letters, digits, ``-``, ``_``)
``node_id``                         the store's id     this node's name in the cluster, unique in it
                                                       (letters, digits, ``-``, ``_``); also the
                                                       gateway's id (message ids, trace ids, the
                                                       delivery log's ``gw`` and file names)
``cluster_replicas``                3                  copies JetStream keeps of the cluster's
                                                       queues (1 to 5; no more than the NATS
                                                       servers it has)
``cluster_ack_wait``                30 sec             how long a queue message taken by a node
                                                       that stops answering waits before another
                                                       node may deliver it (JetStream's
                                                       ``ack_wait``; a live node renews what it
                                                       holds)
``log_level``                       ``info``           ``debug``, ``info``, ``warning`` or ``error``:
                                                       the level of the gateway's log (its root
                                                       logger) under ``gateway serve``; the
                                                       command's ``--log-level`` overrides it, and
                                                       ``PUT /api/v1/log`` changes it at run time
``log_format``                      ``text``           ``text``: ``time level logger: message``
                                                       lines; ``json``: one JSON object per line,
                                                       ``time`` (ISO 8601, UTC), ``level``,
                                                       ``logger``, ``message`` and, when there is
                                                       one, ``exception`` (the traceback's text)
==================================  =================  ===============================================
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from gateway.config.files import (
    SourceLine,
    parse_bool,
    parse_duration_ms,
    parse_int,
    parse_list,
    parse_size,
    resolve_path,
    unquote,
)
from gateway.errors import ConfigError
from gateway.tls import load_problems

MAX_SERVER_NAME = 64  # EMS User's Guide, "tibemsd.conf", server
# EMS User's Guide, "tibemsd.conf", max_client_msg_size: "maximum 2 GB"
MAX_CLIENT_MSG_SIZE = 2 * 1024**3
MAX_KEEPALIVE = 65535  # MQTT Keep Alive is a Two Byte Integer (MQTT 5.0 3.1.2.10)

DEFAULT_PORTS: dict[str, int] = {
    "mqtt": 1883,
    "mqtts": 8883,
    "amqp": 5672,
    "amqps": 5671,
    "stomp": 61613,
    "stomps": 61614,
    "http": 8080,
    "https": 8443,
}
TLS_SCHEMES = frozenset({"mqtts", "amqps", "stomps", "https", "wss", "ssl"})
ABORT_KINDS = frozenset(
    {"TLS", "TRANSPORTS", "LISTENERS", "CONFIG_FILES", "CONFIG_ERRORS", "DB_FILES"}
)
DEFAULT_STORE = "data"
DEFAULT_BACKLOG = 4096  # listen() backlog where somaxconn cannot be read: Linux's default
MAX_BACKLOG = 65535  # bound on listen_backlog: a larger accept queue is a typo, not a need
SOMAXCONN_PATH = "/proc/sys/net/core/somaxconn"
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")
STORE_TYPES = ("sqlite", "memory")
DEST_KINDS = ("queue", "topic")
DEFAULT_TOKEN_LIFETIME = 3600.0  # seconds an admin API bearer token lasts unless configured

_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")
_HOSTNAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?|\*")
_PARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


@dataclass(frozen=True, slots=True)
class Listener:
    """One ``listen`` line. ``host == ""`` means every interface; ``line`` is where it was."""

    scheme: str
    host: str
    port: int
    line: int | None = field(default=None, compare=False)

    @property
    def tls(self) -> bool:
        return self.scheme in TLS_SCHEMES

    @property
    def loopback(self) -> bool:
        """Whether only this host can reach the listener: a loopback address or ``localhost``.
        Every interface (``host == ""``) and any other name or address is not."""
        if self.host.lower() == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:  # "" (every interface) or a host name, which may resolve anywhere
            return False

    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


DEFAULT_LISTENERS: tuple[Listener, ...] = (
    Listener("mqtt", "127.0.0.1", 1883),
    Listener("amqp", "127.0.0.1", 5672),
    Listener("stomp", "127.0.0.1", 61613),
    Listener("http", "127.0.0.1", 8080),
)


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    """The typed contents of ``gateway.conf``; the table in the module docstring says more."""

    server: str = "gateway"
    listen: tuple[Listener, ...] = DEFAULT_LISTENERS
    store: str = DEFAULT_STORE
    store_type: str = "sqlite"
    store_sync: bool = True
    delivery_log: bool = True
    delivery_log_dir: str = ""  # "" means <store>/delivery-log (filled in on construction)
    delivery_log_max_file_size: int = 64 * 1024**2
    authorization: bool = False
    allow_anonymous: bool = True
    flow_control: bool = False
    max_msg_memory: int = 512 * 1024**2
    msg_swapping: bool = True
    destination_backlog_swapout: int = 1024
    max_client_msg_size: int = 0
    max_connections: int = 0
    listen_backlog: int = 0  # 0: system_backlog()
    selector_logical_operator_limit: int = 5000
    mqtt_max_inflight_messages: int = 20
    mqtt_max_queued_messages: int = 1000
    mqtt_max_queued_bytes: int = 0
    mqtt_transports: bool = False
    amqp_transports: bool = False
    stomp_transports: bool = False
    rv_transports: bool = False
    startup_abort_list: frozenset[str] = field(default_factory=frozenset)
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    tls_require_client_cert: bool = False
    amqp_default_destination: str = "queue"
    ft_group: str | None = None
    ft_service: int = 7500
    ft_network: str = ""
    ft_weight: int = 50
    ft_heartbeat: float = 1.0
    ft_activation: float = 3.0
    mqtt_max_keepalive: int = 0
    admin_token_lifetime: float = DEFAULT_TOKEN_LIFETIME
    monitor_metrics_interval: float = 60.0
    metrics_max_destinations: int = 100
    cluster: tuple[str, ...] = ()
    cluster_name: str = "gateway"
    node_id: str | None = None
    cluster_replicas: int = 3
    cluster_ack_wait: float = 30.0
    log_level: str = "info"
    log_format: str = "text"
    # parameter name -> its line in gateway.conf, for the checks that span files (checks.py)
    lines: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.delivery_log_dir:
            object.__setattr__(self, "delivery_log_dir", os.path.join(self.store, "delivery-log"))

    def transports_enabled(self, transport_type: str) -> bool:
        """Whether transports of ``transport_type`` (``mqtt``, ``amqp``, ``stomp``, ``rv``) run."""
        return bool(getattr(self, f"{transport_type}_transports", False))

    def aborts_on(self, kind: str) -> bool:
        """Whether ``kind`` (e.g. ``"TRANSPORTS"``) is in ``startup_abort_list``."""
        return kind.upper() in self.startup_abort_list


def system_backlog() -> int:
    """The system's largest accept queue (``net.core.somaxconn``), 4096 where unreadable."""
    try:
        with open(SOMAXCONN_PATH, encoding="ascii") as f:
            n = int(f.read().strip())
    except (OSError, ValueError):
        return DEFAULT_BACKLOG
    return n if n > 0 else DEFAULT_BACKLOG


def listen_backlog(settings: GatewaySettings) -> int:
    """The backlog every listener is created with: ``listen_backlog``, or when it is 0 the
    system's maximum, so a burst of connecting clients waits in the kernel's accept queue
    instead of in its SYN retries (asyncio's default backlog is 100; aiohttp's 128)."""
    return settings.listen_backlog or system_backlog()


def parse_listener(value: str, line: int | None = None) -> Listener:
    """Parse ``scheme://host:port`` (EMS User's Guide, "tibemsd.conf", listen: IPv6 in
    brackets, no host = all).

    Raises:
        ValueError: saying what is wrong with ``value``.
    """
    scheme, sep, rest = value.strip().partition("://")
    scheme = scheme.lower()
    if not sep or not _SCHEME.fullmatch(scheme):
        raise ValueError(f"listen {value!r} is not scheme://host:port")
    if "/" in rest or "?" in rest:
        raise ValueError(f"listen {value!r} may not have a path")
    host: str
    port_text: str | None
    if rest.startswith("["):
        end = rest.find("]")
        if end < 0:
            raise ValueError(f"listen {value!r}: unclosed '[' in an IPv6 address")
        host = rest[1:end]
        tail = rest[end + 1 :]
        if tail and not tail.startswith(":"):
            raise ValueError(f"listen {value!r}: expected ':port' after ']'")
        port_text = tail[1:] if tail else None
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"listen {value!r}: {host!r} is not an IPv6 address") from None
    elif rest.isdigit():
        host, port_text = "", rest  # EMS tcp://7222: port only, every interface
    else:
        host, colon, port_text_ = rest.partition(":")
        port_text = port_text_ if colon else None
        if host and not _HOSTNAME.fullmatch(host):
            raise ValueError(f"listen {value!r}: {host!r} is not a host name or address")
    if host == "*":
        host = ""
    if port_text is None or port_text == "":
        if scheme not in DEFAULT_PORTS:
            raise ValueError(f"listen {value!r}: a port is required for scheme {scheme!r}")
        port = DEFAULT_PORTS[scheme]
    else:
        if not port_text.isdigit() or int(port_text) > 65535:
            raise ValueError(f"listen {value!r}: {port_text!r} is not a port (0-65535)")
        port = int(port_text)
    return Listener(scheme, host, port, line)


def _server_name(v: str) -> str:
    if not v or len(v) > MAX_SERVER_NAME:
        raise ValueError(f"server name must have 1 to {MAX_SERVER_NAME} characters")
    if "." in v or any(c.isspace() for c in v):
        raise ValueError(f"server name {v!r} may not contain '.' or blanks")
    return v


def _choice(options: tuple[str, ...]) -> Callable[[str], str]:
    def parse(v: str) -> str:
        w = v.lower()
        if w not in options:
            raise ValueError(f"{v!r} is not one of {', '.join(options)}")
        return w

    return parse


def _abort_list(v: str) -> frozenset[str]:
    kinds = set()
    for item in parse_list(v):
        k = item.upper()
        if k == "SSL":
            k = "TLS"
        if k not in ABORT_KINDS:
            raise ValueError(f"{item!r} is not one of {', '.join(sorted(ABORT_KINDS | {'SSL'}))}")
        kinds.add(k)
    return frozenset(kinds)


def _client_msg_size(v: str) -> int:
    n = parse_size(v)
    if n > MAX_CLIENT_MSG_SIZE:
        raise ValueError(f"{v!r} is larger than the maximum of 2GB")
    return n


def _count(v: str) -> int:
    return parse_int(v, minimum=0)


def _backlog(v: str) -> int:
    return parse_int(v, minimum=0, maximum=MAX_BACKLOG)


def _inflight(v: str) -> int:
    return parse_int(v, minimum=0, maximum=65535)  # a packet id's range (MQTT 5.0 §2.2.1)


def _keepalive(v: str) -> int:
    return parse_int(v, minimum=0, maximum=MAX_KEEPALIVE)


def _text(v: str) -> str:
    if not v:
        raise ValueError("value is empty")
    return v


_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _token(v: str) -> str:
    """A name that is one token of a NATS subject (and of a stream's name)."""
    if not _TOKEN.fullmatch(v):
        raise ValueError(f"{v!r} must be 1 to 64 letters, digits, '-' or '_'")
    return v


def _nats_urls(v: str) -> tuple[str, ...]:
    """``nats://host:port`` URLs, comma-separated (``tls://`` for TLS)."""
    urls = tuple(u.strip() for u in v.split(",") if u.strip())
    if not urls:
        raise ValueError("no NATS server URL given")
    for u in urls:
        parts = urlsplit(u)
        if parts.scheme not in ("nats", "tls") or not parts.hostname:
            raise ValueError(f"{u!r} is not a nats://host:port URL")
        try:
            parts.port  # noqa: B018 - parsing it checks it
        except ValueError:
            raise ValueError(f"{u!r} has a bad port") from None
    return urls


# name -> parser of the (unquoted) value; paths are resolved afterwards (_PATHS).
_PARAMS: dict[str, Callable[[str], Any]] = {
    "server": _server_name,
    "store": _text,
    "store_type": _choice(STORE_TYPES),
    "store_sync": parse_bool,
    "delivery_log": parse_bool,
    "delivery_log_dir": _text,
    "delivery_log_max_file_size": parse_size,
    "authorization": parse_bool,
    "allow_anonymous": parse_bool,
    "flow_control": parse_bool,
    "max_msg_memory": parse_size,
    "msg_swapping": parse_bool,
    "destination_backlog_swapout": _count,
    "max_client_msg_size": _client_msg_size,
    "max_connections": _count,
    "listen_backlog": _backlog,
    "selector_logical_operator_limit": _count,
    "mqtt_max_inflight_messages": _inflight,
    "mqtt_max_queued_messages": _count,
    "mqtt_max_queued_bytes": parse_size,
    "mqtt_transports": parse_bool,
    "amqp_transports": parse_bool,
    "stomp_transports": parse_bool,
    "rv_transports": parse_bool,
    "startup_abort_list": _abort_list,
    "ft_group": _text,
    "ft_service": lambda v: parse_int(v, minimum=1, maximum=65535),
    "ft_network": lambda v: v,
    "ft_weight": lambda v: parse_int(v, minimum=0),
    "ft_heartbeat": lambda v: _positive_seconds(v),
    "ft_activation": lambda v: _positive_seconds(v),
    "tls_cert": _text,
    "tls_key": _text,
    "tls_ca": _text,
    "tls_require_client_cert": parse_bool,
    "amqp_default_destination": _choice(DEST_KINDS),
    "mqtt_max_keepalive": _keepalive,
    "admin_token_lifetime": lambda v: _positive_seconds(v),
    "monitor_metrics_interval": lambda v: parse_duration_ms(v) / 1000.0,
    "metrics_max_destinations": _count,
    "cluster": _nats_urls,
    "cluster_name": _token,
    "node_id": _token,
    "cluster_replicas": lambda v: parse_int(v, minimum=1, maximum=5),
    "cluster_ack_wait": lambda v: _positive_seconds(v),
    "log_level": _choice(LOG_LEVELS),
    "log_format": _choice(LOG_FORMATS),
}
_PATHS = ("store", "delivery_log_dir", "tls_cert", "tls_key", "tls_ca")
_TLS_FILES = ("tls_cert", "tls_key", "tls_ca")
PARAMETERS = frozenset(_PARAMS) | {"listen"}


def _positive_seconds(v: str) -> float:
    seconds = parse_duration_ms(v) / 1000.0
    if seconds <= 0:
        raise ValueError(f"{v!r} is not a positive duration")
    return seconds


def parse_gateway_conf(
    lines: list[SourceLine],
    base_dir: str | os.PathLike[str],
    errors: list[ConfigError],
    warnings: list[str],
) -> GatewaySettings:
    """Build :class:`GatewaySettings` from the lines of ``gateway.conf``.

    Bad lines are appended to ``errors``; the settings returned then use defaults for them.
    """
    values: dict[str, Any] = {}
    seen: dict[str, SourceLine] = {}
    listeners: list[Listener] = []
    listen_none: SourceLine | None = None
    for sl in lines:
        name, sep, raw = sl.text.partition("=")
        name = name.strip()
        if not sep or not _PARAM_NAME.fullmatch(name):
            errors.append(sl.error(f"expected 'name = value', got {sl.text!r}"))
            continue
        key = name.lower()
        if key not in PARAMETERS:
            errors.append(sl.error(f"unknown parameter {name!r}"))
            continue
        try:
            value = unquote(raw.strip())
        except ValueError as e:
            errors.append(sl.error(f"{name}: {e}"))
            continue
        if key == "listen":
            _add_listener(sl, value, listeners, errors)
            if value.lower() == "none":
                listen_none = sl
            continue
        if key in seen:
            errors.append(
                sl.error(f"duplicate parameter {name!r} (first set at line {seen[key].line})")
            )
            continue
        seen[key] = sl
        try:
            values[key] = _PARAMS[key](value)
        except ValueError as e:
            errors.append(sl.error(f"{name}: {e}"))
    if listen_none is not None and listeners:
        errors.append(listen_none.error("'listen = none' cannot be combined with other listeners"))
    for key in _PATHS:
        if key in values:
            values[key] = resolve_path(values[key], base_dir)
    if "store" not in values:
        values["store"] = resolve_path(DEFAULT_STORE, base_dir)
    tls_files_missing = False
    for key in _TLS_FILES:
        if key in values and not os.path.isfile(values[key]):
            errors.append(seen[key].error(f"{key}: file {values[key]!r} does not exist"))
            tls_files_missing = True
    if "tls_key" in values and "tls_cert" not in values:
        errors.append(seen["tls_key"].error("tls_key is set but tls_cert is not"))
    if "allow_anonymous" in values and not values["allow_anonymous"] and not values.get(
        "authorization"
    ):
        warnings.append(
            f"{seen['allow_anonymous'].where()}: allow_anonymous = disabled has no effect while"
            " authorization is disabled: every connection is accepted"
        )
    if values.get("ft_heartbeat", 1.0) >= values.get("ft_activation", 3.0):
        at = seen.get("ft_heartbeat") or seen["ft_activation"]
        errors.append(at.error("ft_heartbeat must be less than ft_activation"))
    if values.get("tls_require_client_cert") and "tls_ca" not in values:
        errors.append(seen["tls_require_client_cert"].error("tls_require_client_cert needs tls_ca"))
    values["lines"] = {k: sl.line for k, sl in seen.items() if sl.line is not None}
    if listen_none is not None:
        values["listen"] = ()
    elif listeners:
        values["listen"] = tuple(listeners)
        if "tls_cert" not in values:
            for lst in listeners:
                if lst.tls:
                    errors.append(
                        ConfigError(
                            lines[0].file,
                            lst.line,
                            f"listen {lst.url()} uses TLS but tls_cert is not set",
                        )
                    )
        elif any(lst.tls for lst in listeners) and not tls_files_missing:
            # The context every TLS listener is started with (gateway/tls.py), built now.
            for key, msg in load_problems(values["tls_cert"], values.get("tls_key"),
                                          values.get("tls_ca")):
                errors.append(seen[key].error(msg))
    return GatewaySettings(**values)


def _add_listener(
    sl: SourceLine, value: str, listeners: list[Listener], errors: list[ConfigError]
) -> None:
    if value.lower() == "none":
        return
    try:
        lst = parse_listener(value, sl.line)
    except ValueError as e:
        errors.append(sl.error(str(e)))
        return
    if lst.scheme not in DEFAULT_PORTS:  # the listener protocols of gateway/registry.py
        errors.append(sl.error(f"listen {value!r}: unknown listener protocol {lst.scheme!r} "
                               f"(one of {', '.join(DEFAULT_PORTS)})"))
        return
    for other in listeners:
        if lst.port != 0 and other.port == lst.port and _same_host(other.host, lst.host):
            errors.append(
                sl.error(f"listen {lst.url()} uses the same address as line {other.line}")
            )
            return
    listeners.append(lst)


def _same_host(a: str, b: str) -> bool:
    return a == b or a == "" or b == ""
