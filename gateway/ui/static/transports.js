// Transports: each bridge to another messaging system, its state and spool.
//
// "Spooled" is the spool depth: messages bound for the remote side that wait in the export
// queues while it is unreachable or slow; "Inbound" is what came from it and waits for the
// core. The states are the transport's own ("up", "down", "connecting", ...); only "up" is
// drawn green.

import { get } from "./api.js";
import { ago, count, fill, h } from "./dom.js";

export class Transports {
  constructor() {
    this.tbody = document.querySelector("#transports tbody");
  }

  async refresh() {
    const rows = await get("/api/v1/transports");
    fill(this.tbody, rows.map(transportRow));
    document.getElementById("transports-empty").hidden = rows.length > 0;
  }
}

function transportRow(t) {
  return h("tr", { dataset: { name: t.name } },
    h("td", {}, t.name),
    h("td", { class: "type" }, t.type),
    h("td", {}, h("span", { class: `badge ${t.state === "up" ? "good" : "bad"}` }, t.state)),
    h("td", { title: t.since ? new Date(t.since * 1000).toLocaleString() : "" }, ago(t.since)),
    h("td", { class: "num spooled" }, count(t.spooled)),
    h("td", { class: "num" }, count(t.inbound_queue)),
    h("td", { class: "num" }, count(t.imported)),
    h("td", { class: "num" }, count(t.exported)),
    h("td", { class: "num" }, count(t.failed)),
    h("td", { class: "num" }, count(t.discarded)),
    // the last error stays after a reconnection: shown grey while the transport is up
    h("td", { class: t.state === "up" ? "muted" : "error-text" }, t.last_error ?? ""),
  );
}
