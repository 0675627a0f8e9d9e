"""AMQP addresses ⇄ destinations (OASIS AMQP JMS Mapping, JMSDestination and JMSReplyTo).

How this works. A ``queue://`` or ``topic://`` prefix names the kind, else the
``x-opt-jms-dest`` / ``x-opt-jms-reply-to`` type byte, else the link's default; the gateway
always sends the prefix. Parsed addresses are cached (a producer sends to few). Used by the
default AMQP mapping (:mod:`mappings.amqp`) and its fast path.
"""

from __future__ import annotations

from gateway.message import QUEUE, TOPIC, Destination, DestKind

__all__ = ["QUEUE_PREFIX", "TOPIC_PREFIX", "dest_type_code", "format_address", "parse_address"]

QUEUE_PREFIX, TOPIC_PREFIX = "queue://", "topic://"


_KIND_BY_HINT: dict[int, DestKind] = {0: QUEUE, 1: TOPIC, 2: QUEUE, 3: TOPIC}
_ADDRESS_CACHE: dict[tuple[str, DestKind], Destination] = {}
_ADDRESS_CACHE_MAX = 4096  # distinct addresses in use are few; past this, parse each time


def parse_address(
    address: str, *, hint: int | None = None, default: DestKind = QUEUE
) -> Destination:
    """The destination an AMQP address names (JMS Mapping, JMSDestination and JMSReplyTo).

    A ``queue://`` or ``topic://`` prefix decides the kind; otherwise ``hint``, the
    ``x-opt-jms-dest`` / ``x-opt-jms-reply-to`` byte (0 queue, 1 topic, 2 temporary queue,
    3 temporary topic; any other value is ignored); otherwise ``default``. A temporary hint
    gives the same kind: a destination is temporary by its name (``Destination.is_temporary``).

    Raises:
        ValueError: the name is empty.
    """
    if address.startswith(QUEUE_PREFIX):
        kind, name = QUEUE, address[8:]
    elif address.startswith(TOPIC_PREFIX):
        kind, name = TOPIC, address[8:]
    else:
        # a boolean is an int to Python, not a type byte to AMQP: ignored like any other value
        ok = isinstance(hint, int) and not isinstance(hint, bool)
        kind = _KIND_BY_HINT.get(hint, default) if ok else default  # type: ignore[arg-type]
        name = address
    dest = _ADDRESS_CACHE.get((name, kind))
    if dest is None:
        if not name:
            raise ValueError(f"AMQP address {address!r} names no destination")
        dest = Destination(kind, name)
        if len(_ADDRESS_CACHE) < _ADDRESS_CACHE_MAX:
            _ADDRESS_CACHE[name, kind] = dest
    return dest


def format_address(dest: Destination) -> str:
    """``queue://name`` or ``topic://name``: the prefix tells any AMQP peer the kind."""
    return (TOPIC_PREFIX if dest.kind is TOPIC else QUEUE_PREFIX) + dest.name


def dest_type_code(dest: Destination) -> int:
    """The ``x-opt-jms-dest`` / ``x-opt-jms-reply-to`` byte: 0/1 queue/topic, 2/3 temporary."""
    return (1 if dest.kind is TOPIC else 0) + (2 if dest.is_temporary else 0)
