"""What the RV-style engine hands its shell: events, advisories, counters, and its errors.

Datagrams go to a :data:`Dest`: :data:`MULTICAST` or an (ip, port) pair.
:class:`Delivered` is one whole message from another engine; :class:`Advisory` is a system
advisory as plain data (the Rendezvous subject and its fields, named as in TIBCO Rendezvous
Concepts, Appendix A, System Advisory Messages), which the API layer turns into a message;
:class:`Stats` holds the counters HOST.STATUS reports. :mod:`transports.rv.engine` re-exports
the events, advisory subjects, counters and errors.
"""

from __future__ import annotations

from typing import Final

#: The largest message (TIBCO Rendezvous Concepts, Guidelines for Programming, Control Message
#: Sizes: 64 MB).
MAX_MESSAGE: Final = 64 * 1024 * 1024
#: Who sent a message: (IP, inbox port, incarnation).
Sender = tuple[str, int, int]
#: Where a datagram goes: MULTICAST (the service's group or broadcast address) or (ip, port).
MULTICAST: Final = None
Dest = tuple[str, int] | None

DATALOSS_INBOUND_BCAST: Final = "_RV.ERROR.SYSTEM.DATALOSS.INBOUND.BCAST"
DATALOSS_INBOUND_PTP: Final = "_RV.ERROR.SYSTEM.DATALOSS.INBOUND.PTP"
DATALOSS_OUTBOUND_BCAST: Final = "_RV.ERROR.SYSTEM.DATALOSS.OUTBOUND.BCAST"
DATALOSS_OUTBOUND_PTP: Final = "_RV.ERROR.SYSTEM.DATALOSS.OUTBOUND.PTP"
RETRANSMISSION_INBOUND_EXPECTED: Final = "_RV.INFO.SYSTEM.RETRANSMISSION.INBOUND.EXPECTED"
RETRANSMISSION_OUTBOUND_SENT: Final = "_RV.INFO.SYSTEM.RETRANSMISSION.OUTBOUND.SENT"


class MessageTooLarge(ValueError):
    """A message over 64 MiB (TIBCO Rendezvous Concepts, Guidelines for Programming, "Control
    Message Sizes"): nothing was sent. ``lost`` is the packets it would have needed, for the
    ``DATALOSS.MSG_TOO_LARGE`` advisory (Appendix A), when the engine raised it; the codec,
    which does not know the packet size, leaves it 0."""

    def __init__(self, size: int, lost: int = 0) -> None:
        super().__init__(f"message of {size} bytes is over the {MAX_MESSAGE}-byte limit")
        self.size = size
        self.lost = lost


class EngineClosed(RuntimeError):
    """The engine was closed; it sends nothing more."""


class Delivered:
    """A whole message from another engine (``ptp``: on a point-to-point stream)."""

    __slots__ = ("payload", "sender", "ptp")

    def __init__(self, payload: bytes, sender: Sender, ptp: bool) -> None:
        self.payload = payload
        self.sender = sender
        self.ptp = ptp

    def __repr__(self) -> str:
        return f"Delivered({len(self.payload)} bytes, sender={self.sender}, ptp={self.ptp})"


class Advisory:
    """A system advisory as plain data: the Rendezvous subject and its fields."""

    __slots__ = ("subject", "fields")

    def __init__(self, subject: str, fields: dict[str, str | int]) -> None:
        self.subject = subject
        self.fields = fields

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Advisory) and other.subject == self.subject
                and other.fields == self.fields)

    def __repr__(self) -> str:
        return f"Advisory({self.subject!r}, {self.fields!r})"


Event = Delivered | Advisory


class Stats:
    """Counters since the engine started; :meth:`host_status` names them as HOST.STATUS does
    (TIBCO Rendezvous Concepts, Appendix A, HOST.STATUS)."""

    __slots__ = ("packets_sent", "packets_received", "messages_sent", "messages_received",
                 "bytes_sent", "bytes_received", "retransmitted", "packets_missed",
                 "inbound_data_loss", "outbound_data_loss", "naks_sent", "naks_received",
                 "acks_sent", "duplicates", "malformed", "foreign", "looped", "overflow")

    def __init__(self) -> None:
        self.packets_sent = 0  # every datagram, control packets and retransmissions too
        self.packets_received = 0  # every valid packet of this service from another engine
        self.messages_sent = 0
        self.messages_received = 0  # delivered
        self.bytes_sent = 0  # message bytes
        self.bytes_received = 0
        self.retransmitted = 0  # DATA packets sent again (NAK or RTO)
        self.packets_missed = 0  # gaps seen (whether recovered or not)
        self.inbound_data_loss = 0  # packets given up as a receiver
        self.outbound_data_loss = 0  # packets denied or given up as a sender
        self.naks_sent = 0
        self.naks_received = 0
        self.acks_sent = 0
        self.duplicates = 0  # DATA already delivered or buffered
        self.malformed = 0  # not a packet of this protocol
        self.foreign = 0  # another service, or an ended incarnation
        self.looped = 0  # our own multicast, come back
        self.overflow = 0  # out-of-order packets dropped past the buffer bound

    def host_status(self) -> dict[str, int]:
        return {"ms": self.messages_sent, "bs": self.bytes_sent,
                "mr": self.messages_received, "br": self.bytes_received,
                "ps": self.packets_sent, "pr": self.packets_received,
                "rx": self.retransmitted, "pm": self.packets_missed,
                "idl": self.inbound_data_loss, "odl": self.outbound_data_loss}
