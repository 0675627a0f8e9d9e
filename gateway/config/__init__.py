"""The gateway's configuration, read the way TIBCO EMS reads its own (TIBCO EMS User's Guide,
chapter "Using the Configuration Files").

A config directory holds ``gateway.conf`` (:mod:`gateway.config.gateway_conf`),
``topics.conf`` / ``queues.conf`` (:mod:`gateway.config.destinations`), ``users.conf``,
``groups.conf`` and ``acl.conf`` (:mod:`gateway.config.security`), ``transports.conf``
(:mod:`gateway.config.transports`) and ``routers.conf`` (:mod:`gateway.config.routers`).
:func:`load_config` reads them all, reports every bad line at once as
:class:`~gateway.errors.ConfigErrors`, and returns a :class:`Config`.
"""

from gateway.config.destinations import (
    DEFAULT_PREFETCH,
    DestinationEntry,
    DestinationProps,
    DestinationTable,
    OverflowPolicy,
)
from gateway.config.files import parse_bool, parse_duration_ms, parse_size
from gateway.config.gateway_conf import GatewaySettings, Listener, parse_listener
from gateway.config.loader import CONFIG_FILES, DEFAULT_CONFIG_DIR, Config, load_config
from gateway.config.security import (
    AclEntry,
    Group,
    Security,
    User,
    hash_password,
    verify_password,
)
from gateway.config.transports import (
    TRANSPORT_TYPES,
    DiscardPolicy,
    Endpoint,
    QueuePolicy,
    TransportDef,
    parse_queue_policy,
)

__all__ = [
    "CONFIG_FILES",
    "DEFAULT_CONFIG_DIR",
    "DEFAULT_PREFETCH",
    "TRANSPORT_TYPES",
    "AclEntry",
    "Config",
    "DestinationEntry",
    "DestinationProps",
    "DestinationTable",
    "DiscardPolicy",
    "Endpoint",
    "GatewaySettings",
    "Group",
    "Listener",
    "OverflowPolicy",
    "QueuePolicy",
    "Security",
    "TransportDef",
    "User",
    "hash_password",
    "load_config",
    "parse_bool",
    "parse_duration_ms",
    "parse_listener",
    "parse_queue_policy",
    "parse_size",
    "verify_password",
]
