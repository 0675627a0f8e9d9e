"""Rebuild queues, durable subscriptions and their messages from the store at start-up.

How this works. The store returns every endpoint definition (queues that held persistent
messages, durable subscriptions), the entries still pending on each in the order they were
written, and the messages those entries reference (TIBCO EMS User's Guide,
"How EMS Manages Persistent Messages": persistent queue messages and persistent topic messages
for durable subscribers survive a restart). Each message is put back on its endpoints with its
stored delivery count, so redelivery limits keep counting across a restart (stronger than EMS,
which resets JMSXDeliveryCount, EMS User's Guide, "Destination Properties", maxRedelivery).
Entries whose endpoint no longer exists are removed. With message swapping the store gives
each durable subscription only its first ``destination_backlog_swapout`` entries with their
messages; the rest it only counts, and they become the subscription's tail (see
:mod:`gateway.backlog`), read back as consumers take what is in memory -- so a deep durable
backlog is not read whole into memory at start.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from gateway.backlog import MESSAGE_OVERHEAD
from gateway.endpoint import Endpoint, Subscription
from gateway.message import estimate_size
from gateway.selector import compile_selector

if TYPE_CHECKING:
    from gateway.broker import Broker

log = logging.getLogger("gateway.recovery")


def recover(broker: Broker, recovered: Any) -> dict[str, int]:
    """Apply ``recovered`` (a ``gateway.store.Recovered``) to an empty broker."""
    store = broker.store
    endpoints: dict[str, Endpoint] = {}
    for key, d in recovered.endpoints.items():
        kind = d.get("type")
        if kind == "queue":
            q = broker._ensure_queue(d["name"], system=d["name"].startswith("$"))
            q.stored = True
            endpoints[key] = q
        elif kind == "durable":
            sel = compile_selector(d.get("selector"))
            sub = Subscription(
                broker, key, d["pattern"], durable=True, shared=bool(d.get("shared")),
                name=d.get("name"), client_id=d.get("client_id"), selector=sel,
                no_local=bool(d.get("no_local")), owner=None,
                parent_match=bool(d.get("parent_match")),
            )
            broker.durables[key] = sub
            broker.subs.insert(sub.pattern, sub, parent_match=sub.parent_match)
            endpoints[key] = sub
        else:
            log.warning("store holds an endpoint %r of unknown type %r; left alone", key, kind)
    now = broker.now()
    restored = orphans = 0
    for key, entries in recovered.entries.items():
        ep = endpoints.get(key)
        for store_id, count in entries:
            msg = recovered.messages.get(store_id)
            if ep is None or msg is None:
                store.remove_entry(key, store_id)
                orphans += 1
                continue
            msg.store_id = store_id
            msg.refs += 1
            if not msg.size:
                msg.size = estimate_size(msg)
            broker.memory += msg.size + MESSAGE_OVERHEAD
            ep.restore(msg, count, now)
            ep.fresh += 1  # the swap pass after start looks at it
            restored += 1
    for key, (n, nbytes, cursor) in getattr(recovered, "tails", {}).items():
        ep = endpoints.get(key)
        if ep is None:
            continue  # its entries went with its unknown definition's
        ep.tail = n
        ep.tail_bytes = nbytes
        ep.tail_after = cursor
        ep.count += n
        ep.bytes += nbytes
    if orphans:
        store.commit(None)
    log.info("recovered %d endpoints and %d pending messages", len(endpoints), restored)
    return {"endpoints": len(endpoints), "messages": restored, "orphans": orphans}
