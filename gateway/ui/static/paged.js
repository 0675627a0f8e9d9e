// A list that the server pages and filters: a filter box, a pager, and one page of rows.
//
// A gateway may hold tens of thousands of destinations or connections, so the page never
// asks for them all: each list route takes ?limit=&offset=&q= (q: a wildcard pattern the
// rows' names must match, as EMS's "show queues pattern") and says in X-Total-Count how many
// rows match. Typing in the filter box asks again after a short pause; answers that arrive
// after a newer question was asked are dropped, so a slow answer never overwrites a newer one.

import { ApiError, getPage } from "./api.js";
import { count, h } from "./dom.js";

export const PAGE_SIZE = 50;
const TYPING_PAUSE_MS = 300; // wait this long after the last key before asking

export class PagedList {
  /**
   * `path`: the list route; `filter`: the filter <input>; `pager`: the element the pager is
   * drawn in; `render(rows)`: draws one page of rows.
   */
  constructor({ path, filter, pager, render }) {
    this.path = path;
    this.filter = filter;
    this.pager = pager;
    this.render = render;
    this.offset = 0;
    this.total = 0;
    this.asked = 0; // number of the latest question; older answers are dropped
    this.typing = 0;
    filter.addEventListener("input", () => {
      clearTimeout(this.typing);
      this.typing = setTimeout(() => this.goTo(0), TYPING_PAUSE_MS);
    });
  }

  /** The filter as sent: the box's text, trimmed. */
  get pattern() {
    return this.filter.value.trim();
  }

  /** Show the page from `offset`. */
  goTo(offset) {
    this.offset = Math.max(0, offset);
    return this.refresh();
  }

  /** Ask for the current page again (the poll loop calls this every few seconds). */
  async refresh() {
    const asked = ++this.asked;
    let page;
    try {
      page = await getPage(this.path,
        { limit: PAGE_SIZE, offset: this.offset, q: this.pattern });
    } catch (error) {
      // 400: not a pattern (yet: "orders." on the way to "orders.>"); said at the box
      if (!(error instanceof ApiError && error.status === 400) || asked !== this.asked) throw error;
      this.filter.classList.add("invalid");
      this.filter.title = error.message;
      return;
    }
    if (asked !== this.asked) return; // a newer question is on its way
    this.filter.classList.remove("invalid");
    this.filter.title = "";
    if (page.rows.length === 0 && this.offset > 0 && page.total > 0) {
      // the rows shrank under the current page (deleted, or a new filter): go to the last page
      await this.goTo(Math.floor((page.total - 1) / PAGE_SIZE) * PAGE_SIZE);
      return;
    }
    this.total = page.total;
    this.render(page.rows);
    this.drawPager(page.rows.length);
  }

  drawPager(shown) {
    const first = shown ? this.offset + 1 : 0;
    const last = this.offset + shown;
    this.pager.replaceChildren(
      h("button", { class: "prev", disabled: this.offset === 0,
        onclick: () => this.goTo(this.offset - PAGE_SIZE) }, "‹ Prev"),
      h("span", { class: "range" }, `${count(first)}–${count(last)} of ${count(this.total)}`),
      h("button", { class: "next", disabled: last >= this.total,
        onclick: () => this.goTo(this.offset + PAGE_SIZE) }, "Next ›"),
    );
  }
}
