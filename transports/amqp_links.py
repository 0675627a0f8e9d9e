"""The amqp transport's parts below the transport: its socket shell, its link records, the
loop markers' names and the far-side name rules (:mod:`transports.amqp` is the transport
itself, :mod:`transports.amqp_export` its export side).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from proton import Message as ProtonMessage

from gateway import subject
from gateway.errors import GatewayError
from gateway.message import Destination
from mappings.amqp import MA_PREFIX

if TYPE_CHECKING:
    from gateway.consumer import Delivery as CoreDelivery
    from transports.base import ExportBinding

__all__ = [
    "BINDING_KEY_PREFIXES", "GW_PREFIXES", "WRITE_HIGH_WATER", "ReceiverLink", "SenderLink",
    "far_address", "name_candidates",
]  # fmt: skip

ORIGIN = "x-opt-gw-origin"  # message annotation: the id of the gateway that exported it
HOPS = "x-opt-gw-hops"  # message annotation: bridges crossed before this export
PROP_ORIGIN = MA_PREFIX + ORIGIN  # how the mapping carries them as properties
PROP_HOPS = MA_PREFIX + HOPS

GW_PREFIXES = ("topic://", "queue://")  # the gateway's own addresses (JMS mapping)
BINDING_KEY_PREFIXES = ("/topic/", "/exchange/")  # RabbitMQ: the rest is a 0-9-1 binding key
WRITE_HIGH_WATER = 1 << 20  # bytes buffered in the socket before exports pause (adapter's)


def far_address(prefix: str, pattern: str) -> str:
    """The far-side address of a core name or pattern (see the module docstring)."""
    if subject.GT in pattern and prefix.startswith(BINDING_KEY_PREFIXES):
        pattern = ".".join("#" if el == subject.GT else el for el in pattern.split("."))
    return prefix + pattern


def name_candidates(address: str | None, subj: str | None, prefix: str) -> list[tuple[str, bool]]:
    """The core names a message on a wildcard link may have, best first: from ``to`` (the far
    prefix or a gateway prefix stripped), then from ``subject`` (flagged True)."""
    out: list[tuple[str, bool]] = []
    if address:
        if prefix and address.startswith(prefix):
            out.append((address[len(prefix):], False))
        elif address.startswith(GW_PREFIXES):
            out.append((address[8:], False))
    if subj:
        out.append((subj, True))
    return out


def peer_error(endpoint: Any) -> str:
    """The error a peer gave when it closed a connection, session or link."""
    cond = endpoint.remote_condition
    return f"{cond.name}: {cond.description}" if cond else "no error given"


def maybe_redelivered(data: bytearray) -> bool:
    """Whether a transfer's header leaves open that it was delivered before (AMQP 1.0 §3.2.1:
    first-acquirer false, its default, or a delivery-count above 0)."""
    pm = ProtonMessage()
    pm.decode(data)  # type: ignore[arg-type]
    return not pm.first_acquirer or pm.delivery_count > 0


def valid_name(name: str) -> bool:
    try:
        subject.validate(name)
    except GatewayError:
        return False
    return True


class Shell(asyncio.Protocol):
    """The socket: bytes to the transport, its output to the socket; nothing else."""

    def __init__(self, owner: Any) -> None:
        self.owner = owner
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if self.owner.shell is self:
            self.owner.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.owner.shell is self:
            self.owner.gone(f"connection lost: {exc}" if exc else "connection closed by peer")

    def pause_writing(self) -> None:
        if self.owner.shell is self:
            self.owner.pause_writing()

    def resume_writing(self) -> None:
        if self.owner.shell is self:
            self.owner.resume_writing()

    def write(self, data: bytes) -> None:
        t = self.transport
        if t is not None and not t.is_closing():
            t.write(data)

    def close(self) -> None:
        t = self.transport
        if t is not None and not t.is_closing():
            t.close()


class SenderLink:
    """One sender link: the exports to one far address."""

    __slots__ = ("link", "raw", "name", "pending", "blocked", "closed", "refused",
                 "refused_until")

    def __init__(self, link: Any, name: str) -> None:
        self.link = link
        self.raw = link._impl  # proton's pn_link_t: the hot path calls proton's C API on it
        self.name = name  # the core name
        self.pending: dict[Any, tuple[CoreDelivery, ExportBinding]] = {}  # pn_delivery_t → ...
        self.blocked: set[ExportBinding] = set()  # bindings paused for this link's credit
        self.closed = False
        self.refused: str | None = None  # why the peer refused the link, if it did
        self.refused_until = 0.0


class ReceiverLink:
    """One receiver link: a far-side subscription, refcounted by (kind, pattern)."""

    __slots__ = ("link", "raw", "pattern", "kind", "dest", "prefix", "outstanding", "closed",
                 "users", "route")

    def __init__(self, link: Any, pattern: str, kind: Any, prefix: str) -> None:
        self.link = link
        self.raw = link._impl
        self.pattern = pattern
        self.kind = kind
        # A concrete name is every message's destination; a wildcard's come from each message.
        self.dest = None if subject.is_wildcard(pattern) else Destination(kind, pattern)
        self.prefix = prefix
        self.outstanding = 0  # transfers received, not yet settled
        self.closed = False
        self.users = 1
        self.route: str | None = None  # a reply route's far address (its temporary dest)
