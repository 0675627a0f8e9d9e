// The overview: the server's counts, the message rates, and their chart.
//
// The server counts messages in ("published") and out ("delivered") since it started; a
// rate is the difference between two polls divided by the time between them, as an EMS
// administrator reads "show server" twice (TIBCO EMS User's Guide, "Monitoring Server
// Activity"). The samples are kept here, in the page, for the last ten minutes: the chart
// starts empty when the page is opened and fills as it polls.

import { bytes, count, h, rate } from "./dom.js";

const WINDOW_S = 600; // the chart's span: ten minutes

const CHART_HEIGHT = 300; // pixels

export class Overview {
  constructor() {
    this.previous = null; // {t, published, delivered} of the last poll
    this.times = []; // Unix seconds of each sample
    this.ins = []; // messages in per second
    this.outs = []; // messages out per second
    this.chart = null;
  }

  /** Take one sample of GET /api/v1/server (`info`) at `now` (Unix seconds) and redraw. */
  update(info, now) {
    const sample = { t: now, published: info.published, delivered: info.delivered };
    const inRate = this.rateOf(sample, "published");
    const outRate = this.rateOf(sample, "delivered");
    this.previous = sample;
    if (inRate !== null || outRate !== null) this.record(now, inRate, outRate);
    this.showFigures(info, inRate, outRate);
    this.draw();
  }

  /**
   * Messages per second of counter `key` since the last sample; null on the first sample,
   * when the server does not report the counter, or when it went back (the gateway restarted).
   */
  rateOf(sample, key) {
    const before = this.previous;
    if (before === null || typeof sample[key] !== "number" || typeof before[key] !== "number") {
      return null;
    }
    const delta = sample[key] - before[key];
    const seconds = sample.t - before.t;
    return delta >= 0 && seconds > 0 ? delta / seconds : null;
  }

  record(now, inRate, outRate) {
    this.times.push(now);
    this.ins.push(inRate);
    this.outs.push(outRate);
    while (this.times.length && this.times[0] < now - WINDOW_S) {
      this.times.shift();
      this.ins.shift();
      this.outs.shift();
    }
  }

  showFigures(info, inRate, outRate) {
    setFigure("in-rate", rate(inRate), inRate);
    setFigure("out-rate", rate(outRate), outRate);
    setFigure("stat-connections", count(info.connections), info.connections);
    setFigure("stat-queues", count(info.queues), info.queues);
    setFigure("stat-topics", count(info.topics), info.topics);
    setFigure("stat-memory", bytes(info.memory), info.memory);
    document.getElementById("stat-memory-max").textContent =
      info.max_msg_memory ? `of ${bytes(info.max_msg_memory)}` : "no limit";
    document.getElementById("server-name").textContent = info.name ? `server ${info.name}` : "";
    const totals = [
      ["Published", info.published], ["Delivered", info.delivered],
      ["Durables", info.durables], ["Subscriptions", info.subscriptions],
      ["Swapped", info.swapped], ["Expired", info.expired], ["Discarded", info.discarded],
      ["Rejected", info.rejected],
    ];
    document.getElementById("totals").replaceChildren(...totals.flatMap(([label, value]) => [
      h("dt", {}, label), h("dd", {}, count(value)),
    ]));
  }

  /** Draw the chart (created on the first sample, when the page shows it). */
  draw() {
    const data = [this.times, this.ins, this.outs];
    if (this.chart === null) {
      const box = document.getElementById("rate-chart");
      this.chart = new uPlot(chartOptions(box.clientWidth), data, box);
      // follow the card's width (also when the overview is shown after another view)
      new ResizeObserver(() => {
        if (box.clientWidth > 0) {
          this.chart.setSize({ width: box.clientWidth, height: CHART_HEIGHT });
        }
      }).observe(box);
    } else {
      this.chart.setData(data);
    }
  }
}

/** A figure's text, and its raw value in data-value (for scripts that read the page). */
function setFigure(id, text, value) {
  const el = document.getElementById(id);
  el.textContent = text;
  el.dataset.value = typeof value === "number" ? String(value) : "";
}

/** A tick's time of day, hours and minutes in the browser's locale ("14:05"). */
function clock(seconds) {
  return new Date(seconds * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
}

/** uPlot's options: time on x, the last WINDOW_S seconds; messages per second on y. */
function chartOptions(width) {
  return {
    width: Math.max(width, 300),
    height: CHART_HEIGHT,
    scales: {
      // a sliding window ending at the last sample (now, before the first)
      x: { time: true, range: (_, min, max) => {
        const end = max ?? Date.now() / 1000;
        return [end - WINDOW_S, end];
      } },
      y: { range: (_, min, max) => [0, Math.max(1, max * 1.1)] },
    },
    series: [
      {},
      { label: "in /s", stroke: "#2563eb", fill: "rgba(37, 99, 235, 0.08)", width: 2 },
      { label: "out /s", stroke: "#ea580c", width: 2 },
    ],
    axes: [
      { space: 80, values: (_, ticks) => ticks.map(clock) },
      { label: "messages / s", size: 60 },
    ],
    legend: { live: false }, // the series' names only; the figures are in the cards above
  };
}
