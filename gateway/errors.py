"""The gateway's exceptions.

Every error the core raises to an adapter, a transport or an in-process client is a
:class:`GatewayError`. Each carries a short machine-readable ``reason`` that a protocol
shell turns into its own error form (an MQTT reason code, a STOMP ``ERROR`` frame, an AMQP
error condition), and a human message that says exactly what was wrong::

    GatewayError
    ├── ProtocolError                 a codec saw bytes it cannot accept
    │   ├── RemoteProtocolError       the peer broke the protocol
    │   └── LocalProtocolError        we were asked to send something illegal
    ├── ConfigError                   a bad line in a config file (file and line named)
    ├── InvalidDestinationError       a name breaks the EMS destination syntax or may not be created
    ├── InvalidSelectorError          a selector does not parse; says where it failed
    ├── MessageFormatError            a value cannot be read as the type asked for (JMS table)
    ├── SecurityError                 authentication failed or a permission is missing
    ├── IllegalStateError             the call is not allowed now (closed session, no tx, ...)
    ├── LimitExceededError            a destination or server limit rejects the message
    └── TransactionRolledBackError    commit failed; the transaction was rolled back

Only ``ProtocolError`` may leave a codec; anything else escaping one is a bug.
"""

from __future__ import annotations


class GatewayError(Exception):
    """Base of every error the gateway raises on purpose."""

    reason = "error"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class ProtocolError(GatewayError):
    reason = "protocol-error"


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol does not allow."""


class LocalProtocolError(ProtocolError):
    """We were asked to send something the protocol does not allow."""


class ConfigError(GatewayError):
    """A configuration problem, always tied to a file and, where there is one, a line."""

    reason = "config"

    def __init__(self, file: str, line: int | None, message: str) -> None:
        self.file = file
        self.line = line
        self.detail = message
        where = f"{file}:{line}" if line is not None else file
        super().__init__(f"{where}: {message}")


class ConfigErrors(GatewayError):
    """Several configuration problems found in one load; the gateway refuses to start."""

    reason = "config"

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


class InvalidDestinationError(GatewayError):
    reason = "invalid-destination"


class InvalidSelectorError(GatewayError):
    """A selector that does not parse or type-check.

    ``position`` is the 0-based character offset where parsing failed (or ``None``);
    the message shows the selector with a caret under that position.
    """

    reason = "invalid-selector"

    def __init__(self, message: str, selector: str = "", position: int | None = None) -> None:
        self.selector = selector
        self.position = position
        if position is not None and selector:
            message = f"{message}\n  {selector}\n  {' ' * position}^"
        super().__init__(message)


class MessageFormatError(GatewayError):
    reason = "message-format"


class SecurityError(GatewayError):
    reason = "not-authorized"


class IllegalStateError(GatewayError):
    reason = "illegal-state"


class LimitExceededError(GatewayError):
    reason = "limit-exceeded"


class UnavailableError(GatewayError):
    """What the gateway cannot take now but may later: a cluster node whose NATS servers are
    out of reach refuses persistent messages rather than keep them where they would not
    survive it."""

    reason = "unavailable"


class TransactionRolledBackError(GatewayError):
    reason = "transaction-rolled-back"
