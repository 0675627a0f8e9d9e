"""The store interface: what the broker asks of a message store, and what it gets back at open.

How this works. Persistent messages to queues, and to topics with durable subscribers, are
written on receipt and survive a restart (TIBCO EMS User's Guide,
"How EMS Manages Persistent Messages"); durable subscription and queue definitions are kept
with them (EMS keeps these in ``$sys.meta``, EMS User's Guide,
"Store Messages in Multiple Stores"). The broker describes every change as a small call -- a
message, an *entry* (a message pending on an endpoint, with its delivery count), an endpoint
definition, a generic key/value record -- and ends each unit of work with :meth:`Store.commit`.
A store makes each unit durable as a whole, many units per disk flush (group commit), and then
calls the unit's callback on the event loop thread; the producer of a persistent message is
confirmed only from there.

Contracts (all calls but :meth:`Store.flush` and :meth:`Store.close` run on the loop thread,
never block and never raise for I/O reasons; I/O errors come back through ``on_error``):

- ``add_entry`` is for a pair (endpoint, id) not already pending; a second add updates the
  delivery count in place. A message row deleted while entries still reference it is a caller
  bug that ``open`` repairs by dropping the dangling entries.
- A durable subscription's *tail* (its pending messages past the first
  ``destination_backlog_swapout``, which the broker keeps in the store only) is the set of its
  entries whose message id is above a cursor: for a subscription, entry order and id order
  agree, because an entry is only ever added while its message is routed, right after its id
  was assigned, and ids increase. The broker reads a tail back in batches
  (:meth:`Store.read_entries`), and a message row a tail may still reference is deleted with
  :meth:`Store.delete_unreferenced`, which keeps it while any entry references it.
- Store ids are assigned by ``put_message``, increase monotonically and are never reused after
  a unit holding them has been committed.
- A unit whose write fails is rolled back as a whole: its callback is never called; its
  ``on_error`` (if any) is called on the loop thread with the exception, the failure is
  counted in ``stats["errors"]`` and logged, and :meth:`Store.flush` raises
  :class:`StoreError` if the unit it waited for failed.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.errors import GatewayError
from gateway.message import Message

Callback = Callable[[], None]
ErrorCallback = Callable[[Exception], None]
# Called on the loop thread with the messages read, by store id (see Store.read_messages).
ReadCallback = Callable[[dict[int, Message]], None]
# Called on the loop thread with (store id, delivery count, message or None if it does not
# decode) in entry order (see Store.read_entries).
EntriesCallback = Callable[[list[tuple[int, int, "Message | None"]]], None]


# Upper bounds of the group-commit histograms (the last bucket is open): how long a batch
# took, its fsync included (microseconds), and how many commit units it held.
BATCH_US_BOUNDS = (100, 250, 500, 1000, 2500, 5000, 10_000, 25_000, 50_000, 100_000,
                   250_000, 1_000_000)
BATCH_SIZE_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Buckets:
    """A histogram's counts: one per upper bound of ``bounds`` and one past the last, and the
    sum of what was observed (for the ``/metrics`` endpoint). Written by one thread."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[int, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0

    def observe(self, value: int) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value


class StoreError(GatewayError):
    """The store cannot be opened, or a write failed (the cause is chained)."""

    reason = "store"


class StoreLocked(StoreError):
    """The store's lock is held: another gateway process has the store open (a fault-tolerant
    backup waits for it to be released)."""


@dataclass
class Recovered:
    """Everything a store holds, as returned by :meth:`Store.open`."""

    endpoints: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> definition
    # endpoint key -> [(store_id, delivery_count)] in the order the entries were added
    entries: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    # store_id -> message (only messages some entry references; store_id is set on each)
    messages: dict[int, Message] = field(default_factory=dict)
    kv: dict[str, dict[str, bytes]] = field(default_factory=dict)  # namespace -> key -> value
    # durable subscription key -> (entries, bytes, cursor) left in the store at open (see
    # Store.open's ``backlog``): its entries with a message id above the cursor; ``entries``
    # above holds the others, with their messages.
    tails: dict[str, tuple[int, int, int]] = field(default_factory=dict)


class Store(Protocol):
    """A message store (:mod:`gateway.store.sqlite` is the default)."""

    stats: dict[str, int]
    # The store can give messages back (read_messages), so the broker may drop their bodies
    # from memory (message swapping); false for a store that keeps nothing.
    swappable: bool

    def open(self, call_soon_threadsafe: Callable[..., object], backlog: int = 0) -> Recovered:
        """Open or create the store and return everything to recover.

        ``call_soon_threadsafe`` is the event loop's (or a test stub); the store hands
        completions back to the loop thread only through it. With ``backlog`` (a swappable
        store only), each durable subscription gets only its first ``backlog`` entries with
        their messages; the rest stays in the store as its tail (``Recovered.tails``).
        """
        ...

    def put_endpoint(self, key: str, definition: dict[str, Any]) -> None:
        """Create or replace a durable subscription or queue definition (a JSON-able dict)."""
        ...

    def delete_endpoint(self, key: str) -> None:
        """Delete an endpoint definition and every entry pending on it."""
        ...

    def put_message(self, msg: Message) -> int:
        """Write ``msg``; assigns ``msg.store_id`` first if it is 0. Returns the id.

        Raises:
            MessageFormatError: the message has a value the codec cannot encode (nothing
                is written and ``store_id`` is left alone).
        """
        ...

    def delete_message(self, store_id: int) -> None: ...

    def delete_unreferenced(self, store_id: int) -> None:
        """Delete the message once no entry references it, entries removed in the same unit
        (or before) aside: for a message a durable subscription's tail may still hold."""
        ...

    def add_entry(self, endpoint_key: str, store_id: int, delivery_count: int = 0) -> None:
        """The message is pending on that endpoint (after all entries added before it)."""
        ...

    def remove_entry(self, endpoint_key: str, store_id: int) -> None: ...

    def update_entry(self, endpoint_key: str, store_id: int, delivery_count: int) -> None: ...

    def put_kv(self, namespace: str, key: str, value: bytes) -> None:
        """A small generic record (MQTT retained messages, sessions, the gateway id, ...)."""
        ...

    def delete_kv(self, namespace: str, key: str) -> None: ...

    def commit(
        self, callback: Callback | None = None, on_error: ErrorCallback | None = None
    ) -> None:
        """End a unit of work: everything submitted since the last commit, atomically.

        It becomes durable in the next group commit; then ``callback`` is called on the loop
        thread. If the write fails, ``on_error(exc)`` is called there instead.
        """
        ...

    def read_messages(self, store_ids: list[int], callback: ReadCallback) -> None:
        """Read stored messages back (message swapping): ``callback`` gets, on the loop
        thread, the messages found by id, read after every unit committed before this call
        (so a message put in such a unit is found until a later unit deletes it). An id not
        found (deleted meanwhile, or a read error, which is logged) is left out."""
        ...

    def read_entries(self, endpoint_key: str, after: int, limit: int,
                     callback: EntriesCallback) -> None:
        """Read back up to ``limit`` entries of an endpoint whose message id is above
        ``after``, in id order, with their delivery counts and messages (a durable
        subscription's tail), after every unit committed before this call, as
        :meth:`read_messages`; ``callback`` gets them on the loop thread. A message that does
        not decode is logged and comes as ``None``; fewer than ``limit`` rows (a read error
        is logged and gives none) means there are no more."""
        ...

    def read_now(self, store_ids: list[int]) -> dict[int, Message]:
        """:meth:`read_messages`, blocking the caller until the read is done: for the rare
        paths that need a body at once (a queue browser's snapshot)."""
        ...

    def flush(self) -> None:
        """Block until everything submitted so far is durable (shutdown and tests).

        Raises:
            StoreError: the last unit could not be written.
        """
        ...

    def close(self) -> None:
        """Flush, stop the writer and close the database. Safe to call twice.

        Raises:
            StoreError: the final flush failed (the store is closed all the same).
        """
        ...


# Operation codes of a unit of work, shared by the store implementations. An op is a tuple
# whose first item is its code:
OP_PUT_MESSAGE = 1  # (code, store_id, encoded bytes | Message, fresh: bool)
OP_DELETE_MESSAGE = 2  # (code, store_id)
OP_ADD_ENTRY = 3  # (code, endpoint, store_id, delivery_count)
OP_REMOVE_ENTRY = 4  # (code, endpoint, store_id)
OP_UPDATE_ENTRY = 5  # (code, endpoint, store_id, delivery_count)
OP_PUT_ENDPOINT = 6  # (code, key, definition as JSON text)
OP_DELETE_ENDPOINT = 7  # (code, key)
OP_PUT_KV = 8  # (code, namespace, key, value)
OP_DELETE_KV = 9  # (code, namespace, key)
OP_DELETE_UNREFERENCED = 10  # (code, store_id)
