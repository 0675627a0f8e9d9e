// Building elements and formatting figures.
//
// Every string from the gateway (names, message bodies, errors) reaches the page as a text
// node (Node.append with a string, textContent), never as markup.

/**
 * An element: `h("td", {class: "num"}, "12")`. Attributes named on* are event listeners;
 * `true` sets an empty attribute, false/null/undefined leave it out. Children are nodes or
 * strings (text), nested arrays flattened, null/undefined skipped.
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (value === true) el.setAttribute(key, "");
    else if (value !== false && value !== null && value !== undefined) el.setAttribute(key, value);
  }
  el.append(...children.flat(Infinity).filter((c) => c !== null && c !== undefined)
    .map((c) => (c instanceof Node ? c : String(c))));
  return el;
}

const integer = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });
const decimal = new Intl.NumberFormat(undefined, { maximumFractionDigits: 1 });

/** A count: "12,345"; "–" when unknown. */
export function count(n) {
  return typeof n === "number" ? integer.format(n) : "–";
}

/** A rate: one decimal below 100 per second, whole numbers above. */
export function rate(perSecond) {
  if (typeof perSecond !== "number") return "–";
  return perSecond < 100 ? decimal.format(perSecond) : integer.format(perSecond);
}

/** Bytes in binary units: "1.5 MiB". */
export function bytes(n) {
  if (typeof n !== "number") return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${i === 0 ? n : decimal.format(n)} ${units[i]}`;
}

/** How long ago a Unix time (seconds) was: "42 s", "3 min", "2 h", "5 d". */
export function ago(seconds) {
  if (typeof seconds !== "number") return "–";
  const s = Math.max(0, Date.now() / 1000 - seconds);
  if (s < 60) return `${Math.floor(s)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 86400) return `${Math.floor(s / 3600)} h`;
  return `${Math.floor(s / 86400)} d`;
}

/** A time in milliseconds since the epoch, in the browser's locale. */
export function timestamp(ms) {
  return typeof ms === "number" && ms > 0 ? new Date(ms).toLocaleString() : "–";
}

/** `text` cut to `max` characters, with an ellipsis when cut. */
export function clip(text, max) {
  return text.length > max ? `${text.slice(0, max)}…` : text;
}

/** Replace a table body's rows. */
export function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

let toastTimer = 0;

/** A short message at the foot of the page for a few seconds (`error`: in red). */
export function toast(message, { error = false } = {}) {
  const el = document.getElementById("toast");
  el.textContent = message;
  el.classList.toggle("error", error);
  el.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => {
    el.hidden = true;
  }, 5000);
}
