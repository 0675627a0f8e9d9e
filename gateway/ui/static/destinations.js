// Destinations: queues or topics, one server-side page at a time, and the queue browser.
//
// The browser lists a queue's pending messages without consuming them, as a QueueBrowser
// does (Jakarta Messaging 3.1, the QueueBrowser interface): the first BROWSE_LIMIT, in
// delivery order. Purge removes every pending message (EMS "purge queue"), once the user
// confirms.

import { get, post, segment } from "./api.js";
import { bytes, clip, count, fill, h, timestamp, toast } from "./dom.js";
import { PagedList } from "./paged.js";

const BROWSE_LIMIT = 100;
const BODY_PREVIEW = 200; // characters of a body shown in the table (all of it on hover)

const HEADS = {
  queues: ["Name", "Pending", "In flight", "Consumers", "In", "Out", "Bytes", "Properties", ""],
  topics: ["Name", "Subscriptions", "In", "Properties"],
};
const NUMERIC = new Set(
  ["Pending", "In flight", "Consumers", "In", "Out", "Bytes", "Subscriptions"]);

export class Destinations {
  constructor() {
    this.kind = "queues";
    this.browsing = null; // the queue the browser shows
    this.table = document.getElementById("destinations");
    this.list = new PagedList({
      path: "/api/v1/queues",
      filter: document.getElementById("dest-filter"),
      pager: document.getElementById("dest-pager"),
      render: (rows) => this.render(rows),
    });
    for (const button of document.querySelectorAll("#view-destinations .segmented button")) {
      button.addEventListener("click", () => this.show(button.dataset.kind));
    }
    const on = (id, action) => document.getElementById(id).addEventListener("click", action);
    on("browser-refresh", () => this.browse(this.browsing));
    on("browser-purge", () => this.purge(this.browsing));
    on("browser-close", () => this.closeBrowser());
    this.drawHead();
  }

  /** Switch between queues and topics. */
  show(kind) {
    this.kind = kind;
    this.list.path = `/api/v1/${kind}`;
    for (const button of document.querySelectorAll("#view-destinations .segmented button")) {
      button.classList.toggle("active", button.dataset.kind === kind);
    }
    this.drawHead();
    fill(this.table.tBodies[0], []);
    return this.list.goTo(0);
  }

  refresh() {
    return this.list.refresh();
  }

  drawHead() {
    this.table.tHead.replaceChildren(h("tr", {}, HEADS[this.kind].map(
      (name) => h("th", { class: NUMERIC.has(name) ? "num" : null }, name))));
  }

  render(rows) {
    const draw = this.kind === "queues" ? (r) => this.queueRow(r) : (r) => topicRow(r);
    fill(this.table.tBodies[0], rows.map(draw));
    document.getElementById("dest-empty").hidden = rows.length > 0;
  }

  queueRow(q) {
    return h("tr", { dataset: { name: q.name } },
      h("td", {},
        h("button", { class: "link name", title: "browse the queue's messages",
          onclick: () => this.browse(q.name) }, q.name),
        q.temporary ? h("span", { class: "tag" }, "temporary") : null),
      h("td", { class: "num pending" }, count(q.pending)),
      h("td", { class: "num" }, count(q.in_flight)),
      h("td", { class: "num" }, count(q.consumers)),
      h("td", { class: "num" }, count(q.total_in)),
      h("td", { class: "num" }, count(q.total_out)),
      h("td", { class: "num" }, bytes(q.bytes)),
      h("td", {}, properties(q.properties)),
      h("td", { class: "actions" },
        h("button", { class: "purge danger small", onclick: () => this.purge(q.name) }, "Purge")),
    );
  }

  /** Show the first BROWSE_LIMIT pending messages of queue `name`. */
  async browse(name) {
    this.browsing = name;
    const panel = document.getElementById("browser");
    panel.hidden = false;
    document.getElementById("browser-name").textContent = name;
    const messages = await get(`/api/v1/queues/${segment(name)}/messages`, { limit: BROWSE_LIMIT });
    if (this.browsing !== name) return; // another queue was opened meanwhile
    document.getElementById("browser-count").textContent = messages.length >= BROWSE_LIMIT
      ? `(the first ${BROWSE_LIMIT} pending messages)` : `(${count(messages.length)} pending)`;
    fill(document.querySelector("#messages tbody"), messages.map(messageRow));
    document.getElementById("browser-empty").hidden = messages.length > 0;
    panel.scrollIntoView({ block: "nearest" });
  }

  closeBrowser() {
    this.browsing = null;
    document.getElementById("browser").hidden = true;
  }

  /** Purge queue `name` once the user confirms; then show the emptied queue. */
  async purge(name) {
    const question = `Purge every pending message of queue "${name}"? This cannot be undone.`;
    if (!window.confirm(question)) return;
    const { purged } = await post(`/api/v1/queues/${segment(name)}/purge`);
    toast(`Purged ${count(purged)} message${purged === 1 ? "" : "s"} from ${name}.`);
    await this.list.refresh();
    if (this.browsing === name) await this.browse(name);
  }
}

function topicRow(t) {
  return h("tr", { dataset: { name: t.name } },
    h("td", {}, t.name, t.temporary ? h("span", { class: "tag" }, "temporary") : null,
      t.static ? null : h("span", { class: "tag" }, "dynamic")),
    h("td", { class: "num" }, count(t.subscriptions)),
    h("td", { class: "num" }, count(t.total_in)),
    h("td", {}, properties(t.properties)),
  );
}

/** A destination's properties as tags: "maxbytes=10485760", "secure". */
function properties(props) {
  return Object.entries(props ?? {}).map(([key, value]) =>
    h("span", { class: "tag" }, value === true ? key : `${key}=${value}`));
}

/**
 * A body as text, and what it is. A bytes body comes as base64: shown decoded when it is
 * UTF-8 text (a STOMP frame without content-type, an MQTT payload), as base64 otherwise.
 */
function bodyOf(m) {
  if (m.body === null || m.body === undefined) return { kind: m.body_type, text: "" };
  if (m.body_type !== "bytes") return { kind: m.body_type, text: String(m.body) };
  try {
    const raw = Uint8Array.from(atob(m.body), (c) => c.charCodeAt(0));
    return { kind: "bytes", text: new TextDecoder("utf-8", { fatal: true }).decode(raw) };
  } catch {
    return { kind: "bytes, base64", text: m.body };
  }
}

function messageRow(m) {
  const props = Object.entries(m.properties ?? {})
    .map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(", ");
  const body = bodyOf(m);
  return h("tr", {},
    h("td", { class: "mono" }, m.message_id ?? "–"),
    h("td", {}, timestamp(m.timestamp)),
    h("td", { class: "num" }, m.priority),
    h("td", {}, m.delivery_mode, m.redelivered ? h("span", { class: "tag" }, "redelivered") : null),
    h("td", { class: "num" }, count(m.delivery_count)),
    h("td", { class: "mono", title: props }, clip(props, 80)),
    h("td", { class: "mono body", title: body.text },
      h("span", { class: "tag" }, body.kind), " ", clip(body.text, BODY_PREVIEW)),
    h("td", { class: "num" }, bytes(m.size)),
  );
}
