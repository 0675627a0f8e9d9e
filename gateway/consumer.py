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

Everything here runs on the loop thread and never awaits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

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

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self.endpoint.dispatch()

    def __repr__(self) -> str:
        return f"<Consumer {self.id} on {self.endpoint.key}>"
