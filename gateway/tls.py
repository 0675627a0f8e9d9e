"""The TLS context of the gateway's TLS listeners (``mqtts``, ``amqps``, ``stomps``, ``https``).

One function, so that every protocol reads ``tls_cert``, ``tls_key``, ``tls_ca`` and
``tls_require_client_cert`` from ``gateway.conf`` the same way (TIBCO EMS User's Guide,
"tibemsd.conf", ssl_require_client_cert). The configuration's loader builds the same context
once when a TLS listener is configured (:func:`load_problems`), so that a certificate that
is missing, unreadable, not PEM or not the key's is refused by ``gateway check-config`` as by
``gateway serve``, naming the line.

A private key protected by a passphrase is refused: a gateway runs unattended, and OpenSSL's
default would be to prompt for it on the terminal and wait.
"""

from __future__ import annotations

import ssl
from typing import Any

from gateway.errors import GatewayError


def _no_passphrase() -> bytes:
    """OpenSSL's password callback: no passphrase (an encrypted key fails to load)."""
    return b""


def _load_chain(ctx: ssl.SSLContext, cert: str, key: str | None) -> None:
    ctx.load_cert_chain(cert, key, password=_no_passphrase)


def make_server_context(cert: str, key: str | None, ca: str | None,
                        require_client_cert: bool) -> ssl.SSLContext:
    """A server-side context; raises ``ssl.SSLError`` or ``OSError`` for a file that does not
    load."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    _load_chain(ctx, cert, key)
    if ca:
        ctx.load_verify_locations(ca)
        if require_client_cert:
            ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def make_client_context(cert: str | None, key: str | None, ca: str | None) -> ssl.SSLContext:
    """A client-side context (a transport's TLS connection): verifies the far side with ``ca``
    (the system's CAs without it), presents ``cert`` / ``key`` when given; raises as
    :func:`make_server_context`."""
    ctx = ssl.create_default_context(cafile=ca)
    if cert:
        _load_chain(ctx, cert, key)
    return ctx


def _reason(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.strerror and not isinstance(exc, ssl.SSLError):
        return exc.strerror
    return str(exc) or type(exc).__name__


def load_problems(cert: str | None, key: str | None, ca: str | None,
                  client: bool = False) -> list[tuple[str, str]]:
    """What stops these files from loading into a context, as ``(parameter, message)``
    pairs: ``tls_cert`` for the certificate and key (not PEM, unreadable, the key not the
    certificate's, a key with a passphrase), ``tls_ca`` for the CA bundle. Empty when they
    load. ``client``: a transport's context (its CA replaces the system's)."""
    problems: list[tuple[str, str]] = []
    if ca:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_verify_locations(ca)
        except (ssl.SSLError, OSError, ValueError) as exc:
            problems.append(("tls_ca", f"tls_ca: cannot load the CA certificates {ca!r}: "
                                       f"{_reason(exc)}"))
    if cert:
        purpose = ssl.Purpose.SERVER_AUTH if client else ssl.Purpose.CLIENT_AUTH
        try:
            _load_chain(ssl.create_default_context(purpose), cert, key)
        except (ssl.SSLError, OSError, ValueError) as exc:
            files = f"{cert!r} and key {key!r}" if key else repr(cert)
            problems.append(("tls_cert", f"tls_cert: cannot load the certificate {files}: "
                                         f"{_reason(exc)} (a PEM certificate chain and its "
                                         "unencrypted private key are needed)"))
    return problems


def server_context(broker: Any, scheme: str) -> ssl.SSLContext:
    """A server-side context from ``gateway.conf``; GatewayError if ``tls_cert`` is unset."""
    gw = broker.config.gateway
    if not gw.tls_cert:
        raise GatewayError(f"{scheme} listener needs tls_cert (and tls_key) in gateway.conf")
    return make_server_context(str(gw.tls_cert), str(gw.tls_key) if gw.tls_key else None,
                               str(gw.tls_ca) if gw.tls_ca else None,
                               bool(getattr(gw, "tls_require_client_cert", False)))
