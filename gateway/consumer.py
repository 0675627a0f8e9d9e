"""Consumers and their deliveries: who takes messages from an endpoint, and what each gets.

How this works. A :class:`Consumer` is attached to one endpoint (a queue or a topic
subscription, :mod:`gateway.endpoint`) and owned by a session (:mod:`gateway.client`). It
is *ready* while it is active, not paused by its adapter, and holds fewer unacknowledged
deliveries than its window (EMS ``prefetch``, AMQP credit, MQTT Receive Maximum); the
endpoint's dispatch hands a message only to a ready consumer. Each message handed over is a
:class:`Delivery`: the message, the session's tag for acknowledging it, and how many times
this endpoint delivered it (``JMSXDeliveryCount``). The listener is called with it on the
loop, synchronously, from inside dispatch; the session keeps it until it is acknowledged,
returned or rejected (the endpoint's settlement).

What deliveries add up to, for the ``/metrics`` endpoint (:mod:`gateway.metrics`): each
consumer holds the :class:`Traffic` of its connection's protocol, to which the endpoint adds
every delivery (messages, bytes) and, for a first delivery, how long after its timestamp the
message was delivered -- a few integer operations a delivery, no allocation. The table of them
is the broker's (``Broker.traffic``); each connection holds its protocol's.

Everything here runs on the loop thread and never awaits.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from gateway.message import Message

if TYPE_CHECKING:
    from gateway.client import Session
    from gateway.endpoint import Endpoint
    from gateway.selector import Selector


class Delivery:
    """One delivery of a message to one consumer; what a listener receives.

    ``count`` is ``JMSXDeliveryCount`` (1 on the first delivery); ``redelivered`` is
    ``JMSRedelivered``. ``tag`` identifies the delivery within its session for acks.
    """

    __slots__ = ("msg", "tag", "count", "consumer", "settled")

    def __init__(self, msg: Message, tag: int, count: int, consumer: Consumer) -> None:
        self.msg = msg
        self.tag = tag
        self.count = count
        self.consumer = consumer
        self.settled = False

    @property
    def redelivered(self) -> bool:
        return self.count > 1

    def __repr__(self) -> str:
        return f"<Delivery tag={self.tag} count={self.count} {self.msg!r}>"


Listener = Callable[[Delivery], None]

# Upper bounds (ms) of the publish -> deliver latency histogram's buckets, the last one open:
# a message's timestamp has millisecond resolution, so nothing finer is measurable.
LATENCY_BOUNDS_MS: Final = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000,
                            30000, 60000)
LATENCY_FIRST_MS: Final = 1  # LATENCY_BOUNDS_MS[0]: the common case, counted without a search


class Traffic:
    """What the consumers of one protocol's connections were delivered: ``messages`` and
    ``bytes`` (message sizes), every delivery; ``messages_in`` and ``bytes_in``, what those
    connections published; ``latency`` counts first deliveries by how
    many milliseconds after the message's timestamp they came (one count per bucket of
    :data:`LATENCY_BOUNDS_MS`, then one for the rest), ``latency_ms`` sums those times."""

    __slots__ = ("messages", "bytes", "messages_in", "bytes_in", "latency", "latency_ms")

    def __init__(self) -> None:
        self.messages = 0
        self.bytes = 0
        self.messages_in = 0  # published by these connections (Broker.publish)
        self.bytes_in = 0
        self.latency = [0] * (len(LATENCY_BOUNDS_MS) + 1)
        self.latency_ms = 0

    def observe(self, ms: int) -> None:
        """A first delivery, ``ms`` after the message's timestamp; less than 0 (a producer's
        clock ahead of ours) counts as 0."""
        if ms <= LATENCY_FIRST_MS:
            self.latency[0] += 1
            if ms > 0:
                self.latency_ms += ms
            return
        self.latency[bisect_left(LATENCY_BOUNDS_MS, ms)] += 1
        self.latency_ms += ms


class TrafficTable:
    """:class:`Traffic` by protocol name (a connection's ``protocol``: ``mqtt``, ``amqp``,
    ``stomp``, ``inproc``, ``transport:<type>``), made on first use and never dropped, so
    that what it counts only grows."""

    def __init__(self) -> None:
        self.protocols: dict[str, Traffic] = {}

    def totals(self) -> tuple[int, int]:
        """Every delivery since start, and the bytes of those messages, every protocol."""
        ts = list(self.protocols.values())
        return sum(t.messages for t in ts), sum(t.bytes for t in ts)

    def of(self, protocol: str) -> Traffic:
        traffic = self.protocols.get(protocol)
        if traffic is None:
            traffic = self.protocols[protocol] = Traffic()
        return traffic



class Consumer:
    """A consumer attached to one endpoint, owned by a session.

    ``window`` is the most unacknowledged deliveries it may hold (``None`` = unlimited);
    ``listener`` is called on the loop for each delivery. Adapters pause a consumer when
    their socket's write buffer is full and resume it when it drains.
    """

    __slots__ = (
        "id",
        "session",
        "endpoint",
        "selector",
        "no_local",
        "window",
        "unacked",
        "listener",
        "active",
        "paused",
        "track",
        "delivered_total",
        "name",
        "log_client",
        "traffic",
    )

    def __init__(
        self,
        cid: int,
        session: Session,
        endpoint: Endpoint,
        listener: Listener,
        *,
        selector: Selector | None = None,
        no_local: bool = False,
        window: int | None = None,
        name: str = "",
    ) -> None:
        self.id = cid
        self.session = session
        self.endpoint = endpoint
        self.selector = selector
        self.no_local = no_local
        self.window = window
        self.unacked = 0
        self.listener = listener
        self.active = True
        self.paused = False
        # Deliveries are tracked for acknowledgement unless the session acknowledges nothing.
        self.track = not session.no_ack
        self.delivered_total = 0
        self.name = name
        # The ``client`` of its deliver, redeliver and ack records; None: none are written
        # (a transport's consumer, see ``Connection.logs_deliveries``).
        conn = session.connection
        self.log_client: str | None = conn.id if conn.logs_deliveries else None
        self.traffic = conn.traffic

    @property
    def ready(self) -> bool:
        w = self.window
        return (
            self.active
            and not self.paused
            and self.session.connection.started
            and (w is None or self.unacked < w)
        )

    def set_window(self, window: int | None) -> None:
        """Change the window (credit); more room dispatches waiting messages at once."""
        self.window = window
        self.endpoint.dispatch()
        if self.endpoint.feed is not None:  # more room may be more to pull (cluster/)
            self.endpoint.tell_feed()

    def pause(self) -> None:
        if not self.paused:
            self.paused = True
            if self.endpoint.feed is not None:
                self.endpoint.tell_feed()

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self.endpoint.dispatch()
            if self.endpoint.feed is not None:
                self.endpoint.tell_feed()

    def __repr__(self) -> str:
        return f"<Consumer {self.id} on {self.endpoint.key}>"
