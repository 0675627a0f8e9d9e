"""The report of a reconciliation run: one HTML file that a person opens offline.

``write_report`` takes the run's verdict rows (``spark.verdicts.VERDICT_COLUMNS``), its
summary (per route per hour: hour, gw, dest, exit, via, messages, the count of each verdict,
the loss and duplicate rates and the latency quantiles), the delivery-log records it read and
their route rows (``spark.routes.routes``), and writes a page with:

- the number of rows of each verdict, and the routes' totals (the summary's hours added up);
- a latency histogram per route (the ``delivered`` rows' ``latency_ms``, one gateway's clock);
- loss and duplicates hour by hour (the summary's hours);
- a route diagram: gateway, destination, exit (deliveries to consumers, exports through
  each transport, messages that never left), and the gateway a transport's exports were
  imported at (an ``import`` at one gateway of a trace id exported at another), with counts;
- the worst messages (lost, lost in transit, changed, duplicated, reordered first, then the
  highest latency) with every record of their trace ids in time order, across gateways.

Only small aggregates reach the driver, each bounded whatever the size of the run: the
verdict totals (one row per verdict), the histogram bins (computed in Spark: at most
``MAX_HISTOGRAMS`` routes times ``HISTOGRAM_BINS`` bins), the latest ``MAX_HOURS`` hours,
the ``MAX_ROUTES`` busiest routes and the hops out of them, and the ``worst`` messages with
at most ``MAX_HISTORY`` records and ``MAX_VERDICTS`` verdict rows each. What is left out is
said on the page.

The page needs nothing but itself: the plots are matplotlib figures rendered to SVG and
written inline (text drawn as paths, so no font is fetched), the style sheet is inline and
there is no script. Every string that comes from the logs is escaped (``html.escape``), on the
page and in the plots' labels (matplotlib would read ``$...$`` in a destination name as
mathematics).
"""

from __future__ import annotations

import html
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from spark.routes import routes as all_routes
from spark.schema import DELIVER, EXPORT
from spark.verdicts import (
    CHANGED,
    DEAD_LETTERED,
    DELIVERED,
    DISCARDED,
    DROPPED,
    DUPLICATED,
    EXPIRED,
    LOST,
    LOST_IN_TRANSIT,
    PENDING,
    REORDERED,
)

# The verdicts that make a message one of the worst, worst first; the others follow by
# their highest latency.
SEVERITY: tuple[str, ...] = (LOST, LOST_IN_TRANSIT, CHANGED, DUPLICATED, REORDERED)

HISTOGRAM_BINS = 24
MAX_HISTOGRAMS = 12  # routes with a latency histogram, the busiest first
MAX_HOURS = 24 * 31  # hours plotted, the latest; a month stays readable on one axis
MAX_ROUTES = 40  # routes in the diagram and the routes table, the busiest first
MAX_HISTORY = 200  # records shown per worst message (a message redelivered without end)
MAX_VERDICTS = 50  # verdict rows shown per worst message (a topic message to many consumers)

ROUTE = ("gw", "dest", "exit", "via")
_COUNTS = ("messages", DELIVERED, "late", LOST, PENDING, LOST_IN_TRANSIT, DUPLICATED,
           CHANGED, REORDERED, EXPIRED, DEAD_LETTERED, DROPPED, DISCARDED)

# A colour per verdict, used in the totals and in the plots (colour-blind safe: Okabe-Ito).
_COLOURS = {
    DELIVERED: "#009E73", LOST: "#D55E00", LOST_IN_TRANSIT: "#E69F00",
    DUPLICATED: "#0072B2", CHANGED: "#CC79A7", REORDERED: "#56B4E9", PENDING: "#999999",
}
_GATEWAY_COLOURS = ("#cfe2f3", "#d9ead3", "#fff2cc", "#f4cccc", "#d9d2e9", "#fce5cd")


@dataclass(frozen=True)
class Histogram:
    """The latency histogram of one route: ``counts[i]`` delivered rows with a latency in
    ``[edges[i], edges[i + 1])`` (the last bin includes its upper edge)."""

    route: tuple[str | None, ...]
    edges: list[float]
    counts: list[int]


@dataclass(frozen=True)
class WorstMessage:
    """One of the worst messages: its verdict rows and every record of its trace id in time
    order (``history``), each as a dict; ``more_verdicts`` / ``more_history`` rows left out."""

    trace_id: str
    severity: str | None
    latency_ms: float | None
    verdicts: list[dict[str, Any]]
    history: list[dict[str, Any]]
    more_verdicts: int
    more_history: int


def write_report(path: str | Path, verdicts: DataFrame, summary: DataFrame,
                 records: DataFrame, *, route_rows: DataFrame | None = None,
                 title: str = "Reconciliation report", worst: int = 20) -> None:
    """Write the report of one run to ``path`` (an HTML file needing nothing else to be
    read: no script, no network, no external style sheet or font). ``route_rows`` is
    ``spark.routes.routes(records)``, given when the caller has it already."""
    totals = verdict_totals(verdicts)
    histograms = latency_histograms(verdicts)
    hours = hourly(summary)
    routes, route_count = route_totals(summary)
    hops = gateway_hops(route_rows if route_rows is not None else all_routes(records))
    entered = entries_per_destination(summary)
    worst_rows = worst_messages(verdicts, records, worst)
    span = records.agg(F.count(F.lit(1)).alias("n"), F.min("ts").alias("first"),
                       F.max("ts").alias("last")).first()
    assert span is not None

    figures = _Figures()
    parts = [
        f"<h1>{_e(title)}</h1>",
        f"<p class='meta'>{span['n']} records"
        + (f", {_e(_time(span['first']))} to {_e(_time(span['last']))} (UTC)"
           if span["first"] is not None else "") + "</p>",
        "<h2>Verdicts</h2>", _totals_table(totals),
        "<h2>Routes</h2>",
        figures.add("routes", "Route diagram", _route_diagram(routes, hops, entered)),
        _routes_table(routes, route_count),
        "<h2>Loss and duplicates by hour</h2>",
        figures.add("hours", "Loss and duplicates by hour", _hours_figure(hours))
        if hours else "<p>No hours in the summary.</p>",
        "<h2>Latency by route</h2>",
        "<p class='note'>Entry to exit on the route's gateway (one clock), delivered rows; "
        f"the {MAX_HISTOGRAMS} busiest routes at most.</p>",
        "<div class='grid'>"
        + "".join(figures.add("latency", _route_name(h.route), _histogram_figure(h))
                  for h in histograms) + "</div>"
        if histograms else "<p>No delivered rows.</p>",
        f"<h2>Worst messages</h2>{_worst_table(worst_rows)}",
    ]
    page = ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>"
            + "\n".join(parts) + "</body></html>\n")
    Path(path).write_text(page, encoding="utf-8")


# ---- aggregates (Spark; each collect is bounded) ----------------------------------------


def verdict_totals(verdicts: DataFrame) -> list[tuple[str, int]]:
    """The number of rows of each verdict, by verdict name."""
    return [(r["verdict"], r["count"])
            for r in verdicts.groupBy("verdict").count().orderBy("verdict").collect()]


def latency_histograms(verdicts: DataFrame, bins: int = HISTOGRAM_BINS,
                       max_routes: int = MAX_HISTOGRAMS) -> list[Histogram]:
    """The latency histogram of each of the ``max_routes`` routes (gw, dest, exit, via)
    with the most delivered rows, binned in Spark: ``bins`` bins from 0 to the route's
    highest latency, of equal width in log10(1 + ms) (latencies spread over orders of
    magnitude). A negative latency (a clock stepped back) counts in the first bin."""
    rows = (verdicts.where((F.col("verdict") == F.lit(DELIVERED))
                           & F.col("latency_ms").isNotNull())
            .select("gw", "dest", "exit", _via().alias("via"),
                    F.greatest(F.col("latency_ms"), F.lit(0.0)).alias("lat")))
    top = (rows.groupBy(*ROUTE).agg(F.count(F.lit(1)).alias("n"), F.max("lat").alias("top"))
           .orderBy(F.desc("n"), *[F.asc_nulls_first(c) for c in ROUTE])
           .limit(max_routes)
           .select(*[F.col(c).alias(f"t_{c}") for c in ROUTE], "n", "top"))
    same = _null_safe_equal(rows, top, ROUTE)
    scale = F.log10(F.col("top") + 1.0)
    index = F.when(F.col("top") <= 0, F.lit(0)).otherwise(
        F.least(F.floor(F.log10(F.col("lat") + 1.0) / scale * bins).cast("int"),
                F.lit(bins - 1)))
    binned = (rows.join(F.broadcast(top), same, "inner")
              .groupBy(*[f"t_{c}" for c in ROUTE], "n", "top", index.alias("bin"))
              .count()
              .collect())
    found: dict[tuple[Any, ...], tuple[int, float, list[int]]] = {}
    for r in binned:
        key = tuple(r[f"t_{c}"] for c in ROUTE)
        n, top_ms, counts = found.setdefault(key, (r["n"], r["top"], [0] * bins))
        counts[r["bin"]] += r["count"]
    out = []
    for key, (_, top_ms, counts) in sorted(found.items(),
                                           key=lambda kv: (-kv[1][0], _sort_key(kv[0]))):
        step = math.log10(top_ms + 1.0) / bins
        edges = [10 ** (i * step) - 1.0 for i in range(bins + 1)] if top_ms > 0 else \
            [float(i) for i in range(bins + 1)]
        out.append(Histogram(key, edges, counts))
    return out


def hourly(summary: DataFrame, max_hours: int = MAX_HOURS) -> list[dict[str, Any]]:
    """Per hour (the latest ``max_hours``), over every route: messages, lost,
    lost_in_transit and duplicated, and the loss and duplicate rates."""
    sums = [F.sum(c).alias(c) for c in ("messages", LOST, LOST_IN_TRANSIT, DUPLICATED)]
    got = (summary.groupBy("hour").agg(*sums)
           .orderBy(F.desc("hour")).limit(max_hours).collect())
    out = []
    for r in reversed(got):
        row = {c: r[c] or 0 for c in ("messages", LOST, LOST_IN_TRANSIT, DUPLICATED)}
        row["hour"] = r["hour"]
        n = row["messages"]
        row["loss_rate"] = (row[LOST] + row[LOST_IN_TRANSIT]) / n if n else 0.0
        row["duplicate_rate"] = row[DUPLICATED] / n if n else 0.0
        out.append(row)
    return out


def route_totals(summary: DataFrame, max_routes: int = MAX_ROUTES
                 ) -> tuple[list[dict[str, Any]], int]:
    """The summary's hours added up per route (gw, dest, exit, via), the ``max_routes``
    routes with the most messages; and how many routes there are in all. Quantiles do not
    add up across hours: the latency columns are the worst hour's."""
    aggs = [F.sum(c).alias(c) for c in _COUNTS]
    aggs += [F.max("latency_p99_ms").alias("worst_p99_ms"),
             F.max("latency_max_ms").alias("max_ms")]
    grouped = summary.groupBy(*ROUTE).agg(*aggs)
    total = grouped.count()
    top = (grouped.orderBy(F.desc("messages"), *[F.asc_nulls_first(c) for c in ROUTE])
           .limit(max_routes).collect())
    return [{k: (r[k] if r[k] is not None or k in ROUTE or k.endswith("_ms") else 0)
             for k in r.asDict()} for r in top], total


def gateway_hops(route_rows: DataFrame) -> list[dict[str, Any]]:
    """The gateway-to-gateway hops: per export (gw, dest, via = the transport) and gateway
    ``to_gw`` that imported some of its trace ids, the number of trace ids imported there;
    from the route rows (``spark.routes.routes``: one per exported message and transport,
    with the gateways that imported the message)."""
    hops = (route_rows.where(F.col("exit") == F.lit(EXPORT))
            .select("gw", "dest", F.col("exit_client").alias("via"),
                    F.explode("import_gws").alias("to_gw"))
            .where(F.col("gw") != F.col("to_gw"))
            .groupBy("gw", "dest", "via", "to_gw")
            .agg(F.count(F.lit(1)).alias("imported"))
            .orderBy(F.desc("imported"), "gw", "dest", "via", "to_gw")
            .limit(MAX_ROUTES * 4))
    return [r.asDict() for r in hops.collect()]


def entries_per_destination(summary: DataFrame) -> dict[tuple[str, str], int]:
    """The number of messages that entered each (gw, dest) (publish or import), for the
    ``MAX_ROUTES * 4`` busiest: the summary's entry rows (``exit`` null) added up."""
    got = (summary.where(F.col("exit").isNull() & (F.col("messages") > 0))
           .groupBy("gw", "dest").agg(F.sum("messages").alias("n"))
           .orderBy(F.desc("n"), "gw", "dest").limit(MAX_ROUTES * 4).collect())
    return {(r["gw"], r["dest"]): r["n"] for r in got}


def worst_messages(verdicts: DataFrame, records: DataFrame, n: int) -> list[WorstMessage]:
    """The ``n`` worst messages (trace ids): a message with a verdict of ``SEVERITY`` first,
    in that order of its worst verdict, then by its highest ``latency_ms``; each with its
    verdict rows and every record of its trace id in time order, across gateways
    (``ts``, one gateway's clock each)."""
    if n <= 0:
        return []
    rank = F.lit(len(SEVERITY))
    for i, name in reversed(list(enumerate(SEVERITY))):
        rank = F.when(F.col("verdict") == F.lit(name), F.lit(i)).otherwise(rank)
    traced = verdicts.where(F.col("trace_id").isNotNull())
    # The messages with a verdict of SEVERITY (few, as a rule) are ranked with all their
    # rows; only if they are fewer than n do the others follow, by their highest latency
    # (``_slowest``: no aggregation of every row).
    severe = traced.where(F.col("verdict").isin(list(SEVERITY))).select("trace_id")
    chosen: list[tuple[str, int, float | None]] = [
        (r["trace_id"], r["rank"], r["worst_latency"]) for r in
        traced.join(severe.distinct(), "trace_id", "left_semi")
        .groupBy("trace_id")
        .agg(F.min(rank).alias("rank"), F.max("latency_ms").alias("worst_latency"))
        .orderBy("rank", F.desc_nulls_last("worst_latency"), "trace_id")
        .limit(n).collect()]
    if len(chosen) < n:
        chosen += [(t, len(SEVERITY), ms) for t, ms in
                   _slowest(traced, {t for t, _, _ in chosen}, n - len(chosen))]
    if not chosen:
        return []
    spark = verdicts.sparkSession
    ids = F.broadcast(spark.createDataFrame([(t,) for t, _, _ in chosen], "trace_id string"))
    by_trace = Window.partitionBy("trace_id")
    vrows = _first_rows(verdicts.join(ids, "trace_id"), by_trace,
                        [F.asc_nulls_last("exit_ts"), "gw", "dest", "verdict"], MAX_VERDICTS)
    hrows = _first_rows(records.join(ids, "trace_id"), by_trace,
                        ["ts", "gw", "event", "client"], MAX_HISTORY)
    v_of: dict[str, list[dict[str, Any]]] = {}
    h_of: dict[str, list[dict[str, Any]]] = {}
    for target, got in ((v_of, vrows), (h_of, hrows)):
        for r in got:
            target.setdefault(r["trace_id"], []).append(r.asDict())
    out = []
    for trace_id, rank_, latency in chosen:
        vs, hs = v_of.get(trace_id, []), h_of.get(trace_id, [])
        out.append(WorstMessage(
            trace_id, SEVERITY[rank_] if rank_ < len(SEVERITY) else None, latency, vs, hs,
            vs[0]["_of"] - len(vs) if vs else 0, hs[0]["_of"] - len(hs) if hs else 0))
    return out


def _slowest(rows: DataFrame, skip: set[str], n: int) -> list[tuple[str, float | None]]:
    """The ``n`` trace ids of ``rows`` not in ``skip`` with the highest ``latency_ms`` on any
    of their rows (none last, ties by trace id), each with that latency. Read from the rows
    in that order, the first ``limit`` of them (Spark's top-k, no shuffle of every row),
    until n trace ids are found or no row is left."""
    order = [F.desc_nulls_last("latency_ms"), F.asc("trace_id")]
    limit = 64 * (n + len(skip))
    while True:
        top = rows.select("trace_id", "latency_ms").orderBy(*order).limit(limit).collect()
        found: dict[str, float | None] = {}
        for r in top:  # a trace id's first row in this order has its highest latency
            if r["trace_id"] not in skip and r["trace_id"] not in found:
                found[r["trace_id"]] = r["latency_ms"]
                if len(found) == n:
                    return list(found.items())
        if len(top) < limit:
            return list(found.items())
        limit *= 8


def _first_rows(df: DataFrame, by: WindowSpec, order: Sequence[str | Column],
                limit: int) -> list[Any]:
    """The first ``limit`` rows of each partition of ``by`` in ``order`` (with ``_of``, the
    partition's size), in that order."""
    numbered = (df.withColumn("_n", F.row_number().over(by.orderBy(*order)))
                .withColumn("_of", F.count(F.lit(1)).over(by)))
    return numbered.where(F.col("_n") <= limit).orderBy("trace_id", "_n").collect()


def _via() -> Column:
    """The summary's ``via``: the transport of an export, null for any other exit."""
    return F.when(F.col("exit") == F.lit(EXPORT), F.col("exit_client"))


def _null_safe_equal(left: DataFrame, right: DataFrame, cols: Iterable[str]) -> Column:
    cond: Column | None = None
    for c in cols:
        one = left[c].eqNullSafe(right[f"t_{c}"])
        cond = one if cond is None else cond & one
    assert cond is not None
    return cond


# ---- figures (matplotlib, rendered to SVG) ----------------------------------------------


class _Figures:
    """Renders each figure to inline SVG, numbering them so that the ids matplotlib writes
    (clip paths, markers) differ between the figures of one page and stay the same from one
    run to the next."""

    def __init__(self) -> None:
        self.count = 0

    def add(self, kind: str, caption: str, fig: Any) -> str:
        import matplotlib

        self.count += 1
        buf = io.StringIO()
        with matplotlib.rc_context({"svg.hashsalt": f"plot{self.count}",
                                    "svg.fonttype": "path"}):
            fig.savefig(buf, format="svg", metadata={"Date": None})
        svg = buf.getvalue()
        svg = svg[svg.index("<svg"):]  # no XML declaration or DOCTYPE inside HTML
        return (f"<figure class='plot' data-plot='{_e(kind)}'>{svg}"
                f"<figcaption>{_e(caption)}</figcaption></figure>")


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    # A Figure with no pyplot: no global backend, no window, nothing kept after rendering.
    return Figure(figsize=(width, height), dpi=96, layout="constrained")


def _histogram_figure(h: Histogram) -> Any:
    fig = _figure(4.2, 2.4)
    ax = fig.add_subplot()
    ax.stairs(h.counts, h.edges, fill=True, color=_COLOURS[DELIVERED], alpha=0.85)
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlim(0, max(h.edges[-1], 1.0))
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("messages")
    ax.set_title(_label(_route_name(h.route)), fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    return fig


def _hours_figure(hours: list[dict[str, Any]]) -> Any:
    fig = _figure(9.0, 3.4)
    counts, rates = fig.subplots(2, 1, sharex=True)
    x = [h["hour"] for h in hours]
    for name in (LOST, LOST_IN_TRANSIT, DUPLICATED):
        counts.plot(x, [h[name] for h in hours], marker="o", markersize=3,
                    color=_COLOURS[name], label=name)
    counts.set_ylabel("rows")
    counts.set_ylim(bottom=0)
    counts.legend(loc="upper left", fontsize=8, ncols=3)
    rates.plot(x, [100 * h["loss_rate"] for h in hours], marker="o", markersize=3,
               color=_COLOURS[LOST], label="loss rate")
    rates.plot(x, [100 * h["duplicate_rate"] for h in hours], marker="o", markersize=3,
               color=_COLOURS[DUPLICATED], label="duplicate rate")
    rates.set_ylabel("% of messages")
    rates.set_ylim(bottom=0)
    rates.legend(loc="upper left", fontsize=8, ncols=2)
    rates.set_xlabel("hour (UTC, of entry)")
    for ax in (counts, rates):
        ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    return fig


def _route_diagram(routes: list[dict[str, Any]], hops: list[dict[str, Any]],
                   entered: dict[tuple[str, str], int]) -> Any:
    """Gateway → destination → exit (→ the gateway a transport's exports were imported at),
    one band per gateway, gateways that import after those that export to them."""
    gateways = _gateway_order({r["gw"] for r in routes} | {h["to_gw"] for h in hops},
                              {(h["gw"], h["to_gw"]) for h in hops})
    colour = {g: _GATEWAY_COLOURS[i % len(_GATEWAY_COLOURS)] for i, g in enumerate(gateways)}
    hops_of: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for h in hops:
        hops_of.setdefault((h["gw"], h["dest"], h["via"]), []).append(h)

    # One row per exit (and per further gateway of an export); a destination spans its
    # exits' rows and a gateway its destinations'.
    exit_order = {DELIVER: 0, EXPORT: 1}
    layout: list[tuple[str, list[tuple[str, list[dict[str, Any]]]]]] = []
    for g in gateways:
        mine = [r for r in routes if r["gw"] == g]
        dests = sorted({r["dest"] for r in mine}, key=_sort_key1)
        layout.append((g, [(d, sorted((r for r in mine if r["dest"] == d),
                                      key=lambda r: (exit_order.get(r["exit"], 2),
                                                     _sort_key1(r["via"]))))
                           for d in dests]))
    rows = sum(max(1, len(hops_of.get((g, d, r["via"]), ())))
               for g, ds in layout for d, rs in ds for r in rs)
    fig = _figure(11.0, 0.5 + 0.5 * max(rows, 1))
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.set_xlim(0, 4.4)
    ax.set_ylim(-max(rows, 1) + 0.4, 0.6)
    if not routes:
        ax.text(2.2, 0, "no routes", ha="center", va="center")
        return fig
    col = (0.45, 1.45, 2.6, 3.85)

    def node(x: float, y: float, text: str, fc: str, ec: str = "#555555") -> Any:
        return ax.text(x, y, _label(text), ha="center", va="center", fontsize=8,
                       bbox={"boxstyle": "round,pad=0.35", "fc": fc, "ec": ec})

    def arrow(a: Any, b: Any, label: str = "") -> None:
        ax.annotate("", xy=(0.0, 0.5), xycoords=b, xytext=(1.0, 0.5), textcoords=a,
                    arrowprops={"arrowstyle": "->", "color": "#444444",
                                "shrinkA": 4, "shrinkB": 4})

    y = 0.0
    for g, dests in layout:
        top = y
        dnodes = []
        for d, rs in dests:
            dtop = y
            xnodes = []
            for r in rs:
                rtop = y
                far = hops_of.get((g, d, r["via"]), []) if r["exit"] == EXPORT else []
                n_rows = max(1, len(far))
                ey = rtop - (n_rows - 1) / 2
                x_node = node(col[2], ey, _exit_label(r), *_exit_colours(r))
                for i, h in enumerate(far):
                    text = f"→ {h['to_gw']}: {h['imported']} imported"
                    if r.get(LOST_IN_TRANSIT):
                        text += f"\n{r[LOST_IN_TRANSIT]} lost in transit"
                    hop = node(col[3], rtop - i, text, colour.get(h["to_gw"], "#eeeeee"),
                               _COLOURS[LOST_IN_TRANSIT] if r.get(LOST_IN_TRANSIT)
                               else "#555555")
                    arrow(x_node, hop)
                xnodes.append(x_node)
                y -= n_rows
            n = entered.get((g, d))
            dn = node(col[1], (dtop + y + 1) / 2,
                      _short(d) + ("" if n is None else f"\n{n} entered"), "#eeeeee")
            for x_node in xnodes:
                arrow(dn, x_node)
            dnodes.append(dn)
        gn = node(col[0], (top + y + 1) / 2, _short(g), colour[g])
        for dn in dnodes:
            arrow(gn, dn)
    return fig


def _exit_label(r: dict[str, Any]) -> str:
    if r["exit"] == DELIVER:
        head = f"deliver: {r[DELIVERED]} delivered"
    elif r["exit"] == EXPORT:
        head = f"export via {_short(r['via'], 18)}: {r[DELIVERED]}"
    else:
        head = "never left"
    notes = [f"{r[k]} {k.replace('_', ' ')}" for k in
             (LOST, PENDING, DUPLICATED, CHANGED, REORDERED, "late", EXPIRED,
              DEAD_LETTERED, DROPPED, DISCARDED) if r.get(k)]
    return head + ("\n" + ", ".join(notes[:3]) if notes else "")


def _exit_colours(r: dict[str, Any]) -> tuple[str, str]:
    bad = r.get(LOST) or r.get(LOST_IN_TRANSIT) or r.get(CHANGED)
    fc = {DELIVER: "#d9f2e6", EXPORT: "#dcebf7"}.get(r["exit"] or "", "#f2f2f2")
    return fc, (_COLOURS[LOST] if bad else "#555555")


def _gateway_order(gateways: set[str], edges: set[tuple[str, str]]) -> list[str]:
    """The gateways in an order where one that imports from another comes after it when
    the hops allow (Kahn's algorithm, by name among equals; the rest of a cycle by name)."""
    incoming = {g: {a for a, b in edges if b == g and a != g} for g in gateways}
    out: list[str] = []
    left = set(gateways)
    while left:
        ready = sorted(g for g in left if not (incoming[g] & left)) or sorted(left)[:1]
        out.append(ready[0])
        left.remove(ready[0])
    return out


# ---- HTML -------------------------------------------------------------------------------


def _totals_table(totals: list[tuple[str, int]]) -> str:
    if not totals:
        return "<p>No verdicts.</p>"
    cells = "".join(
        f"<tr><td><span class='chip' style='background:{_COLOURS.get(v, '#bbbbbb')}'>"
        f"</span>{_e(v)}</td><td class='num'>{n}</td></tr>" for v, n in totals)
    return f"<table class='totals'><tr><th>verdict</th><th>rows</th></tr>{cells}</table>"


def _routes_table(routes: list[dict[str, Any]], total: int) -> str:
    cols = ["gw", "dest", "exit", "via", *_COUNTS, "worst_p99_ms", "max_ms"]
    head = "".join(f"<th>{_e(c.replace('_', ' '))}</th>" for c in cols)
    body = "".join("<tr>" + "".join(_cell(r.get(c)) for c in cols) + "</tr>" for r in routes)
    more = (f"<p class='note'>{total - len(routes)} more routes not shown.</p>"
            if total > len(routes) else "")
    return (f"<div class='wide'><table class='routes'><tr>{head}</tr>{body}</table></div>"
            "<p class='note'>Totals over the summary's hours; latency: the worst hour's p99 "
            f"and the highest (ms).</p>{more}")


_HISTORY_COLUMNS = ("ts", "gw", "event", "dest", "client", "count", "reason", "msg_id",
                    "body_hash", "props_hash", "rules", "far_id", "far_dest")
_VERDICT_SHOWN = ("verdict", "gw", "dest", "exit", "exit_client", "latency_ms",
                  "e2e_latency_ms", "copies", "changed_parts", "reason")


def _worst_table(worst: list[WorstMessage]) -> str:
    if not worst:
        return "<p>No messages.</p>"
    rows = []
    for i, m in enumerate(worst):
        kinds = sorted({v["verdict"] for v in m.verdicts})
        vhead = "".join(f"<th>{_e(c.replace('_', ' '))}</th>" for c in _VERDICT_SHOWN)
        vbody = "".join("<tr>" + "".join(_cell(v.get(c)) for c in _VERDICT_SHOWN) + "</tr>"
                        for v in m.verdicts)
        hhead = "".join(f"<th>{_e(c.replace('_', ' '))}</th>" for c in _HISTORY_COLUMNS)
        hbody = "".join(
            "<tr>" + "".join(_cell(_time(h["ts"]) if c == "ts" else h.get(c))
                             for c in _HISTORY_COLUMNS) + "</tr>" for h in m.history)
        more = "".join(f"<p class='note'>{k} more {what} not shown.</p>" for k, what in
                       ((m.more_verdicts, "verdict rows"), (m.more_history, "records")) if k)
        latency = "" if m.latency_ms is None else f"{m.latency_ms:.1f}"
        rows.append(
            f"<tr class='msg'><td class='num'>{i + 1}</td>"
            f"<td class='trace'>{_e(m.trace_id)}</td><td>{_e(', '.join(kinds))}</td>"
            f"<td class='num'>{latency}</td></tr>"
            f"<tr><td></td><td colspan='3'><details{' open' if i < 3 else ''}>"
            "<summary>verdicts and history</summary>"
            f"<div class='wide'><table class='inner'><tr>{vhead}</tr>{vbody}</table>"
            f"<table class='inner'><tr>{hhead}</tr>{hbody}</table></div>{more}"
            "</details></td></tr>")
    return ("<table class='worst'><tr><th>#</th><th>trace id</th><th>verdicts</th>"
            "<th>highest latency (ms)</th></tr>" + "".join(rows) + "</table>"
            "<p class='note'>History: every record of the trace id in time order; each "
            "gateway's time is its own clock.</p>")


def _cell(v: Any) -> str:
    if v is None:
        return "<td class='null'></td>"
    if isinstance(v, bool):
        return f"<td>{'yes' if v else 'no'}</td>"
    if isinstance(v, float):
        return f"<td class='num'>{v:.1f}</td>"
    if isinstance(v, int):
        return f"<td class='num'>{v}</td>"
    return f"<td>{_e(str(v))}</td>"


def _time(ts_ms: float) -> str:
    return datetime.fromtimestamp(ts_ms / 1000.0, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _label(text: str) -> str:
    """A string from the logs as a plot label: literal text, never mathtext."""
    return text.replace("$", r"\$")


def _short(text: str | None, width: int = 26) -> str:
    text = "" if text is None else text
    return text if len(text) <= width else text[:width - 1] + "…"


def _route_name(route: tuple[str | None, ...]) -> str:
    gw, dest, exit_, via = route
    how = f"export via {via}" if exit_ == EXPORT else (exit_ or "never left")
    return f"{gw} · {dest} · {how}"


def _sort_key(route: tuple[Any, ...]) -> tuple[tuple[bool, str], ...]:
    return tuple(_sort_key1(v) for v in route)


def _sort_key1(v: str | None) -> tuple[bool, str]:
    return (v is not None, v or "")


_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em auto;max-width:1200px;padding:0 1em;
color:#222}
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.2em;margin-top:1.6em;
border-bottom:1px solid #ddd}
.meta,.note{color:#666;font-size:.9em}
table{border-collapse:collapse;margin:.4em 0}
th,td{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#f4f4f4;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums}
td.null{background:#fafafa}
.trace{font-family:ui-monospace,monospace}
.chip{display:inline-block;width:.8em;height:.8em;border-radius:2px;margin-right:.4em}
.grid{display:flex;flex-wrap:wrap;gap:8px}
figure{margin:.5em 0}figure svg{max-width:100%;height:auto}
figcaption{font-size:.85em;color:#666}
.wide{overflow-x:auto}table.inner{font-size:.85em}
details summary{cursor:pointer;color:#0072B2}
"""
