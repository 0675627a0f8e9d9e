// Connections, one server-side page at a time, grouped by protocol on the page.
//
// The rows come sorted by name from the server; here each page is regrouped under one
// heading per protocol (MQTT, STOMP, AMQP, a transport's bridge connection, ...), the
// protocols in the order their first connection appears.

import { bytes, count, fill, h } from "./dom.js";
import { PagedList } from "./paged.js";

const COLUMNS = 8;

export class Connections {
  constructor() {
    this.tbody = document.querySelector("#connections tbody");
    this.list = new PagedList({
      path: "/api/v1/connections",
      filter: document.getElementById("conn-filter"),
      pager: document.getElementById("conn-pager"),
      render: (rows) => this.render(rows),
    });
  }

  refresh() {
    return this.list.refresh();
  }

  render(rows) {
    const groups = new Map(); // protocol -> its connections, in the order first seen
    for (const c of rows) {
      const protocol = c.protocol || c.kind || "other";
      groups.set(protocol, [...(groups.get(protocol) ?? []), c]);
    }
    fill(this.tbody, [...groups].flatMap(([protocol, conns]) => [
      h("tr", { class: "group", dataset: { protocol } },
        h("th", { colspan: COLUMNS }, protocol.toUpperCase(), " ",
          h("span", { class: "muted" }, `${count(conns.length)} on this page`))),
      ...conns.map(connectionRow),
    ]));
    document.getElementById("conn-empty").hidden = rows.length > 0;
  }
}

function connectionRow(c) {
  return h("tr", { dataset: { id: c.id } },
    h("td", { class: "mono" }, c.id),
    h("td", {}, c.client_id ?? "–"),
    h("td", {}, c.user ?? "–"),
    h("td", {}, c.kind),
    h("td", { class: "mono" }, c.address ?? "–"),
    h("td", { class: "num" }, count(c.sessions)),
    h("td", { class: "num" }, bytes(c.buffered)),
    h("td", {}, c.slow ? h("span", { class: "badge bad" }, "slow") : ""),
  );
}
