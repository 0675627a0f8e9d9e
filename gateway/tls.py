"""The TLS context of the gateway's TLS listeners (``mqtts``, ``amqps``, ``stomps``, ``https``).

One function, so that every protocol reads ``tls_cert``, ``tls_key``, ``tls_ca`` and
``tls_require_client_cert`` from ``gateway.conf`` the same way (TIBCO EMS User's Guide,
"tibemsd.conf", ssl_require_client_cert).
"""

from __future__ import annotations

import ssl
from typing import Any

from gateway.errors import GatewayError


def server_context(broker: Any, scheme: str) -> ssl.SSLContext:
    """A server-side context from ``gateway.conf``; GatewayError if ``tls_cert`` is unset."""
    gw = broker.config.gateway
    if not gw.tls_cert:
        raise GatewayError(f"{scheme} listener needs tls_cert (and tls_key) in gateway.conf")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(gw.tls_cert), str(gw.tls_key) if gw.tls_key else None)
    if gw.tls_ca:
        ctx.load_verify_locations(str(gw.tls_ca))
        if getattr(gw, "tls_require_client_cert", False):
            ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx
