"""``GET /metrics``: the gateway's figures in the Prometheus text format, for a Prometheus server
to scrape (Prometheus documentation, "Exposition formats"; with ``Accept:
application/openmetrics-text``, OpenMetrics).

How this works. Every value is read from the broker's state when the page is asked for, by one
:class:`GatewayCollector` registered in a registry of the HTTP listener's own (not the
process's default registry), on the loop, as the admin API's views are
(TIBCO EMS User's Guide, "Monitoring Server Activity" and "Command Listing", ``show
queues``/``show topics``/``show server``: the same figures, there as commands). Like every
``/api/`` route it needs credentials, and the administrator permission ``view-server``
(:mod:`gateway.admin_auth`). On the message path only what no existing figure gives is
counted: the bytes of each endpoint's messages in and out, and the per-protocol deliveries and
their latency (below).

Names and labels (counters end in ``_total``; every counter only grows while the gateway runs,
except as noted for destinations):

Destinations, labels ``kind`` (``queue`` or ``topic``) and ``destination``:

=============================================  =========================================================
``gateway_destination_messages_in_total``      messages put on the queue (sent to it; recovered from
                                               the store at start); messages published to the topic
``gateway_destination_messages_out_total``     deliveries to consumers (redeliveries too): of the
                                               queue; of the topic's subscriptions
``gateway_destination_bytes_in_total``         sizes of the messages counted in ``messages_in``
``gateway_destination_bytes_out_total``        sizes of the messages counted in ``messages_out``
``gateway_destination_pending_messages``       messages waiting for a consumer: ready, held for a
                                               delivery or redelivery delay, or (a durable
                                               subscription's tail) in the store only
``gateway_destination_in_flight_messages``     delivered and not yet acknowledged
``gateway_destination_message_bytes``          sizes of the pending and in-flight messages (what
                                               ``maxbytes`` limits)
``gateway_destination_consumers``              consumers attached
=============================================  =========================================================

A topic's figures but ``messages_in`` are the sums over its subscriptions, whose
``destination`` is the name they subscribed with: a wildcard subscription's is its pattern
(``orders.>``). Every name has a series of its own up to ``metrics_max_destinations``
(gateway.conf, default 100; 0: no limit) of each kind, taken in name order, as the admin API
sorts them; the names after those, and every temporary destination (whose names are made per
connection), are added up in one series, ``destination="_other"``. Name order keeps a
destination's series in place from one scrape to the next (ranking by traffic would move
destinations in and out of ``_other``). A series is the sum over what exists now: when a
destination, a temporary one or a subscription (a topic's) ends, its counts leave the sum,
which Prometheus's ``rate`` takes for a counter reset.

Protocols, label ``protocol`` (the connection's: ``mqtt``, ``amqp``, ``stomp``, ``inproc`` for
in-process clients, ``transport:<type>`` for a transport's connection to the core):

=============================================  =========================================================
``gateway_connections``                        connections open now (0 for a protocol that listens and
                                               has none)
``gateway_protocol_messages_in_total``         messages the protocol's connections published
``gateway_protocol_bytes_in_total``            sizes of those messages
``gateway_protocol_messages_out_total``        deliveries to the consumers of the protocol's
                                               connections (redeliveries too)
``gateway_protocol_bytes_out_total``           sizes of those messages
``gateway_delivery_latency_seconds``           histogram: from a message's timestamp (given at publish
                                               unless its producer set one) to its first delivery to a
                                               consumer of the protocol; the timestamp has millisecond
                                               resolution, so the first bucket, ``le="0.001"``, holds
                                               everything under 2 ms. A message imported by a
                                               transport keeps the far side's timestamp, so its time
                                               includes the time it took there (and the two clocks'
                                               difference)
=============================================  =========================================================

The protocol figures are counted as each message is published and delivered
(:class:`gateway.consumer.Traffic`, a few integer operations), from the gateway's start.

Transports, labels ``transport`` (its name in transports.conf) and ``type``, from the rows of
``GET /api/v1/transports``:

=============================================  =========================================================
``gateway_transport_up``                       1 while connected, else 0
``gateway_transport_state``                    1, with the label ``state``: ``up``, ``connecting``,
                                               ``down`` or ``stopped``
``gateway_transport_messages_in_total``        messages imported into the gateway
``gateway_transport_messages_out_total``       messages exported to the far side
``gateway_transport_events_total``             label ``event``: ``connects``, ``failed`` (exports the
                                               far side refused), ``discarded``, ``duplicates``,
                                               ``dropped_loop`` (imports dropped as loops), and for
                                               RV-style transports ``dataloss``, ``slowconsumer``
``gateway_transport_spooled_messages``         messages waiting in its export spools
``gateway_transport_inbound_messages``         imported messages waiting to be published
=============================================  =========================================================

The store, from its group-commit statistics (``GET /api/v1/store``):

=============================================  =========================================================
``gateway_store_commits_total``                units of work made durable (a publish, an ack, ...)
``gateway_store_batches_total``                transactions committed, each holding some units (group
                                               commit): ``rate(commits) / rate(batches)`` is the mean
                                               batch size
``gateway_store_ops_total``                    operations in the committed units
``gateway_store_netted_ops_total``             operations cancelled before they were written (a
                                               message acknowledged before its write)
``gateway_store_errors_total``                 units that failed
``gateway_store_failed_batches_total``         transactions that failed
``gateway_store_max_batch_commits``            most units one batch held
``gateway_store_last_batch_seconds``           how long the last batch took, its fsync included
``gateway_store_batch_seconds``                histogram: how long each batch took, its fsync
                                               included (SQLite store)
``gateway_store_batch_commits``                histogram: units per batch (SQLite store)
=============================================  =========================================================

A node of a cluster, label ``node`` (every node, from the heartbeats this one hears:
``cluster/members.py``):

=============================================  =========================================================
``gateway_cluster_node_up``                    1 while the node's heartbeats arrive, else 0
``gateway_cluster_node_connections``           its open connections
``gateway_cluster_node_messages_published``    messages it accepted, as of its last heartbeat
``gateway_cluster_node_message_memory_bytes``  memory it charges for messages held
=============================================  =========================================================

What JetStream keeps for the whole cluster, as read every 5 s (``GET /api/v1/cluster/store``),
bounded by ``metrics_max_destinations`` as the destinations are:

=============================================  =========================================================
``gateway_cluster_queue_messages``             a queue's messages, label ``queue``
``gateway_cluster_durable_messages``           a durable subscription's, to deliver and unacknowledged,
                                               label ``subscription`` (its key)
=============================================  =========================================================

The delivery log and the broker:

=============================================  =========================================================
``gateway_delivery_log_pending_records``       records appended and not yet taken by its writer
``gateway_delivery_log_records_written_total`` records written to its files
``gateway_delivery_log_write_errors_total``    failed writes
``gateway_delivery_log_stalls_total``          times a publish waited for the writer (backlog full)
``gateway_messages_published_total``           messages accepted by the broker, every protocol
``gateway_message_memory_bytes``               memory charged for messages held (``max_msg_memory``)
=============================================  =========================================================
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from gateway.admin_auth import Need, needs
from gateway.consumer import LATENCY_BOUNDS_MS
from gateway.message import TEMP_PREFIX

OTHER = "_other"  # the destination label of what has no series of its own
DEST_LABELS = ["kind", "destination"]
TRANSPORT_LABELS = ["transport", "type"]
# Counters of a transport's row that are events, not messages in or out.
TRANSPORT_EVENTS = ("connects", "failed", "discarded", "duplicates", "dropped_loop", "dataloss",
                    "slowconsumer")
# The store's statistics (gateway.store.sqlite.SqliteStore) exposed as counters.
STORE_COUNTERS = (("commits", "gateway_store_commits", "units of work made durable"),
                  ("batches", "gateway_store_batches", "transactions committed"),
                  ("ops", "gateway_store_ops", "operations in the committed units"),
                  ("netted", "gateway_store_netted_ops",
                   "operations cancelled before they were written"),
                  ("errors", "gateway_store_errors", "units that failed"),
                  ("failed_batches", "gateway_store_failed_batches", "transactions that failed"))


@dataclass(slots=True)
class Figures:
    """One destination series' values: one destination's, or the sum of several."""

    messages_in: int = 0
    messages_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    pending: int = 0
    in_flight: int = 0
    bytes: int = 0
    consumers: int = 0

    def add_endpoint(self, ep: Any) -> None:
        """A queue's or a subscription's figures (``gateway.endpoint.Endpoint``); a topic's
        ``messages_in`` is its own (:meth:`add`), not its subscriptions'."""
        waiting = ep.npending + len(ep.held) + ep.tail
        self.messages_out += ep.stats_out
        self.bytes_out += ep.stats_bytes_out
        self.pending += waiting
        self.in_flight += ep.count - waiting
        self.bytes += ep.bytes
        self.consumers += len(ep.consumers)

    def add(self, other: Figures) -> None:
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


def _figures(series: dict[str, Figures], name: str) -> Figures:
    """The figures of ``name`` in ``series``; a temporary destination's go to ``_other``."""
    key = OTHER if name.startswith(TEMP_PREFIX) else name
    f = series.get(key)
    if f is None:
        f = series[key] = Figures()
    return f


def bounded(series: dict[str, Figures], limit: int) -> dict[str, Figures]:
    """``series`` with the names after the first ``limit`` (name order; 0: no limit) added
    up in ``_other``."""
    names = sorted(n for n in series if n != OTHER)
    out = {n: series[n] for n in (names[:limit] if limit else names)}
    rest = [series[n] for n in names[len(out):]]
    if OTHER in series:
        rest.append(series[OTHER])
    if rest:
        other = out[OTHER] = Figures()
        for f in rest:
            other.add(f)
    return out


def _bounded_counts(counts: dict[str, int], limit: int) -> list[tuple[str, int]]:
    """``counts`` by name, the names after the first ``limit`` (0: no limit) added up in
    ``_other``."""
    names = sorted(counts)
    kept = names[:limit] if limit else names
    out = [(n, counts[n]) for n in kept]
    if len(kept) < len(names):
        out.append((OTHER, sum(counts[n] for n in names[len(kept):])))
    return out


def destination_figures(broker: Any, limit: int) -> dict[str, dict[str, Figures]]:
    """Figures by kind (``queue``, ``topic``) and destination label."""
    queues: dict[str, Figures] = {}
    for q in broker.queues.values():
        f = _figures(queues, q.name)
        f.messages_in += q.stats_in
        f.bytes_in += q.stats_bytes_in
        f.add_endpoint(q)
    topics: dict[str, Figures] = {}
    for t in broker.topics.values():
        f = _figures(topics, t.name)
        f.messages_in += t.stats_in
        f.bytes_in += t.stats_bytes_in
    for sub in broker.all_subscriptions():
        _figures(topics, sub.pattern).add_endpoint(sub)
    return {"queue": bounded(queues, limit), "topic": bounded(topics, limit)}


CLUSTER_GAUGES = (
    ("up", "gateway_cluster_node_up", "1 while the node's heartbeats arrive"),
    ("connections", "gateway_cluster_node_connections", "the node's open connections"),
    ("published", "gateway_cluster_node_messages_published",
     "messages the node accepted (its last heartbeat)"),
    ("memory", "gateway_cluster_node_message_memory_bytes",
     "memory the node charges for messages held"),
)

STORE_HISTOGRAMS = (
    ("batch_us", "gateway_store_batch_seconds",
     "how long the store's group commits took, their fsync included", 1e-6),
    ("batch_units", "gateway_store_batch_commits",
     "commit units (transactions, sends) per group commit", 1),
)


def cumulative(bounds: Iterable[float], counts: list[int], scale: float
               ) -> list[tuple[str, float]]:
    """Prometheus' buckets from per-bucket ``counts`` (one per upper bound of ``bounds``,
    then one past the last): the bound, multiplied by ``scale``, and the running total."""
    out: list[tuple[str, float]] = []
    total = 0
    for bound, n in zip((*bounds, None), counts, strict=True):
        total += n
        out.append((f"{bound * scale:g}" if bound is not None else "+Inf", total))
    return out


def histogram(name: str, documentation: str, buckets: Any, scale: float) -> Metric:
    """A histogram family from :class:`gateway.store.base.Buckets` (a copy of the counts:
    another thread writes them), its bounds multiplied by ``scale``."""
    family = HistogramMetricFamily(name, documentation)
    family.add_metric([], cumulative(buckets.bounds, list(buckets.counts), scale),
                      buckets.total * scale)
    return family


class GatewayCollector(Collector):
    """Every metric of the module docstring, read from ``broker`` at each scrape."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.max_destinations = int(broker.config.gateway.metrics_max_destinations)

    def collect(self) -> Iterable[Metric]:
        yield from self._destinations()
        yield from self._protocols()
        yield from self._transports()
        yield from self._store()
        yield from self._server()
        yield from self._cluster()

    def _destinations(self) -> Iterator[Metric]:
        families = [
            (CounterMetricFamily, "gateway_destination_messages_in",
             "messages put on the queue, or published to the topic", "messages_in"),
            (CounterMetricFamily, "gateway_destination_messages_out",
             "deliveries to consumers, redeliveries included", "messages_out"),
            (CounterMetricFamily, "gateway_destination_bytes_in",
             "sizes of the messages put on the queue, or published to the topic", "bytes_in"),
            (CounterMetricFamily, "gateway_destination_bytes_out",
             "sizes of the messages delivered", "bytes_out"),
            (GaugeMetricFamily, "gateway_destination_pending_messages",
             "messages waiting for a consumer", "pending"),
            (GaugeMetricFamily, "gateway_destination_in_flight_messages",
             "messages delivered and not yet acknowledged", "in_flight"),
            (GaugeMetricFamily, "gateway_destination_message_bytes",
             "sizes of the pending and in-flight messages", "bytes"),
            (GaugeMetricFamily, "gateway_destination_consumers", "consumers attached",
             "consumers"),
        ]
        by_kind = destination_figures(self.broker, self.max_destinations)
        for family, name, documentation, field in families:
            metric = family(name, documentation, labels=DEST_LABELS)
            for kind, series in by_kind.items():
                for dest, figures in series.items():
                    metric.add_metric([kind, dest], getattr(figures, field))
            yield metric

    def _protocols(self) -> Iterator[Metric]:
        connections = dict.fromkeys(self.broker.adapter_servers, 0)
        for conn in list(self.broker.connections.values()):
            connections[conn.protocol] = connections.get(conn.protocol, 0) + 1
        metric = GaugeMetricFamily("gateway_connections", "connections open",
                                   labels=["protocol"])
        for protocol, n in sorted(connections.items()):
            metric.add_metric([protocol], n)
        yield metric
        messages = CounterMetricFamily("gateway_protocol_messages_out",
                                       "deliveries to the protocol's consumers",
                                       labels=["protocol"])
        size = CounterMetricFamily("gateway_protocol_bytes_out",
                                   "sizes of the messages delivered to the protocol's consumers",
                                   labels=["protocol"])
        latency = HistogramMetricFamily(
            "gateway_delivery_latency_seconds",
            "time from a message's timestamp to its first delivery to a consumer",
            labels=["protocol"], unit="seconds")
        messages_in = CounterMetricFamily("gateway_protocol_messages_in",
                                          "messages published by the protocol's connections",
                                          labels=["protocol"])
        size_in = CounterMetricFamily("gateway_protocol_bytes_in",
                                      "sizes of the messages the protocol's connections "
                                      "published", labels=["protocol"])
        for protocol, traffic in sorted(self.broker.traffic.protocols.items()):
            messages.add_metric([protocol], traffic.messages)
            size.add_metric([protocol], traffic.bytes)
            messages_in.add_metric([protocol], traffic.messages_in)
            size_in.add_metric([protocol], traffic.bytes_in)
            latency.add_metric([protocol], cumulative(LATENCY_BOUNDS_MS, traffic.latency,
                                                      1e-3), traffic.latency_ms / 1000)
        yield messages_in
        yield size_in
        yield messages
        yield size
        yield latency

    def _transports(self) -> Iterator[Metric]:
        manager = self.broker.transports
        rows = manager.info() if manager is not None else []
        up = GaugeMetricFamily("gateway_transport_up", "1 while connected, else 0",
                               labels=TRANSPORT_LABELS)
        state = GaugeMetricFamily("gateway_transport_state", "1 for the transport's state",
                                  labels=[*TRANSPORT_LABELS, "state"])
        m_in = CounterMetricFamily("gateway_transport_messages_in", "messages imported",
                                   labels=TRANSPORT_LABELS)
        m_out = CounterMetricFamily("gateway_transport_messages_out", "messages exported",
                                    labels=TRANSPORT_LABELS)
        events = CounterMetricFamily("gateway_transport_events", "events by kind",
                                     labels=[*TRANSPORT_LABELS, "event"])
        spooled = GaugeMetricFamily("gateway_transport_spooled_messages",
                                    "messages waiting in its export spools",
                                    labels=TRANSPORT_LABELS)
        inbound = GaugeMetricFamily("gateway_transport_inbound_messages",
                                    "imported messages waiting to be published",
                                    labels=TRANSPORT_LABELS)
        for row in rows:
            labels = [row["name"], row["type"]]
            up.add_metric(labels, 1 if row["state"] == "up" else 0)
            state.add_metric([*labels, row["state"]], 1)
            m_in.add_metric(labels, row.get("imported", 0))
            m_out.add_metric(labels, row.get("exported", 0))
            for event in TRANSPORT_EVENTS:
                if event in row:
                    events.add_metric([*labels, event], row[event])
            spooled.add_metric(labels, row.get("spooled", 0))
            inbound.add_metric(labels, row.get("inbound_queue", 0))
        yield from (up, state, m_in, m_out, events, spooled, inbound)

    def _store(self) -> Iterator[Metric]:
        stats = dict(getattr(self.broker.store, "stats", {}))
        for key, name, documentation in STORE_COUNTERS:
            yield CounterMetricFamily(name, documentation, value=stats.get(key, 0))
        yield GaugeMetricFamily("gateway_store_max_batch_commits", "most units one batch held",
                                value=stats.get("max_batch", 0))
        yield GaugeMetricFamily("gateway_store_last_batch_seconds",
                                "how long the last batch took, its fsync included",
                                value=stats.get("last_batch_us", 0) / 1e6, unit="seconds")
        store = self.broker.store
        for attr, name, documentation, scale in STORE_HISTOGRAMS:
            buckets = getattr(store, attr, None)
            if buckets is not None:
                yield histogram(name, documentation, buckets, scale)

    def _cluster(self) -> Iterator[Metric]:
        """Every node of the cluster, from the heartbeats this node hears (cluster.members)."""
        link = self.broker.cluster
        if link is None:
            return
        families = {field: GaugeMetricFamily(name, documentation, labels=["node"])
                    for field, name, documentation in CLUSTER_GAUGES}
        for row in link.nodes():
            node = str(row["node_id"])
            for field, family in families.items():
                family.add_metric([node], float(row.get(field) or 0))
        yield from families.values()
        view = link.store_figures  # what JetStream keeps for the whole cluster
        if view is None:
            return
        queues = GaugeMetricFamily("gateway_cluster_queue_messages",
                                   "messages JetStream keeps for the queue, delivered or not, "
                                   "on every node", labels=["queue"])
        for name, n in _bounded_counts({q["name"]: q["messages"] for q in view["queues"]},
                                       self.max_destinations):
            queues.add_metric([name], float(n))
        yield queues
        pending = GaugeMetricFamily("gateway_cluster_durable_messages",
                                    "messages JetStream keeps for the durable subscription, "
                                    "to deliver and delivered unacknowledged",
                                    labels=["subscription"])
        for key, n in _bounded_counts({d["key"]: d["pending"] + d["unacknowledged"]
                                       for d in view["durables"]}, self.max_destinations):
            pending.add_metric([key], float(n))
        yield pending

    def _server(self) -> Iterator[Metric]:
        broker = self.broker
        dlog = broker.dlog
        yield GaugeMetricFamily("gateway_delivery_log_pending_records",
                                "records not yet taken by the delivery log's writer",
                                value=dlog.pending)
        yield CounterMetricFamily("gateway_delivery_log_records_written",
                                  "records written to the delivery log's files",
                                  value=dlog.records_written)
        yield CounterMetricFamily("gateway_delivery_log_write_errors",
                                  "failed writes of the delivery log", value=dlog.write_errors)
        yield CounterMetricFamily("gateway_delivery_log_stalls",
                                  "times a publish waited for the delivery log's writer",
                                  value=dlog.stalls)
        yield CounterMetricFamily("gateway_messages_published", "messages accepted",
                                  value=broker.published)
        yield GaugeMetricFamily("gateway_message_memory_bytes",
                                "memory charged for the messages held", value=broker.memory)


def routes(broker: Any) -> list[web.RouteDef]:
    """``GET /metrics`` (and ``HEAD``) for the HTTP listener's application, with a registry of
    its own holding one :class:`GatewayCollector` of ``broker``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GatewayCollector(broker))

    @needs(Need("view-server"))
    async def metrics(request: web.Request) -> web.Response:
        """The page in the format the scraper asks for (``Accept``): the Prometheus text
        format unless it asks for OpenMetrics."""
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encode(registry), headers={"Content-Type": content_type})

    return [web.get("/metrics", metrics)]
