"""Adapters and transports by name: the core loads them by string, never imports them.

Each listener scheme in ``gateway.conf`` (``listen = mqtt://127.0.0.1:1883``) names an entry
of :data:`ADAPTERS`; each ``type`` in ``transports.conf`` names an entry of
:data:`TRANSPORTS`. An entry is ``"module:attribute"``; the attribute is an async factory
``start(broker, spec) -> handle`` whose handle has an async ``close()``. An entry whose
module (or its entry point) is not there is reported as "not available in this build"
instead of failing with a traceback.
"""

from __future__ import annotations

import importlib
from typing import Any

from gateway.errors import GatewayError

ADAPTERS: dict[str, str] = {
    "http": "gateway.admin:start",
    "https": "gateway.admin:start",
    "mqtt": "adapters.mqtt.server:start",
    "mqtts": "adapters.mqtt.server:start",
    "amqp": "adapters.amqp.server:start",
    "amqps": "adapters.amqp.server:start",
    "stomp": "adapters.stomp.server:start",
    "stomps": "adapters.stomp.server:start",
}

# Fault tolerance of the gateway itself (``ft_group`` in gateway.conf): the group lives on the
# RV-style bus.
FT_STANDBY = "transports.rv.ftgateway:standby"
# Routers between RV-style buses (``routers.conf``).
RV_ROUTERS = "transports.rv.router:start_routers"
CLUSTER = "cluster.link:start_cluster"  # gateway.conf ``cluster``

TRANSPORTS: dict[str, str] = {
    "mqtt": "transports.mqtt:start",
    "amqp": "transports.amqp:start",
    "stomp": "transports.stomp:start",
    "rv": "transports.rv:start",
}


class NotAvailableError(GatewayError):
    reason = "not-available"


def import_string(entry: str) -> Any:
    module, _, attr = entry.partition(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            raise NotAvailableError(f"{module} is not available in this build") from None
        raise
    try:
        return getattr(mod, attr)
    except AttributeError:  # the package is there, its entry point not (yet)
        raise NotAvailableError(f"{module}:{attr} is not available in this build") from None


def adapter(scheme: str) -> Any:
    entry = ADAPTERS.get(scheme)
    if entry is None:
        raise NotAvailableError(f"unknown listener protocol {scheme!r}")
    return import_string(entry)


def transport(kind: str) -> Any:
    entry = TRANSPORTS.get(kind)
    if entry is None:
        raise NotAvailableError(f"unknown transport type {kind!r}")
    return import_string(entry)
