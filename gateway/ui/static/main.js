// The dashboard's start: sign-in, the views, and the poll loop.
//
// Every POLL_MS the page reads GET /api/v1/server (for the rates, which need a sample every
// poll whatever view is shown) and the data of the view on screen. The next poll is planned
// when the last one has finished, so a slow gateway is never asked twice at once. The view is
// named in the URL's fragment (#destinations), so a reload stays on it.
//
// Errors are handled in one place (`failed`): a 401 anywhere (Unauthorized) shows the login
// form again; any other error is shown for a few seconds and the loop goes on.

import { ApiError, Unauthorized, get, hasToken, login, logout } from "./api.js";
import { Connections } from "./connections.js";
import { Destinations } from "./destinations.js";
import { toast } from "./dom.js";
import { Overview } from "./overview.js";
import { Transports } from "./transports.js";

const POLL_MS = 2000;

const overview = new Overview();
const views = {
  overview: { refresh: async () => {} }, // polled on every tick anyway
  destinations: new Destinations(),
  connections: new Connections(),
  transports: new Transports(),
};

let current = "overview";
let pollTimer = 0;

/** The view named in the URL's fragment (the overview if none or unknown). */
function viewOfLocation() {
  const name = location.hash.slice(1);
  return Object.hasOwn(views, name) ? name : "overview";
}

/** Show view `name` and load its data at once. */
function showView(name) {
  current = name;
  for (const section of document.querySelectorAll("main > .view")) {
    section.hidden = section.id !== `view-${name}`;
  }
  for (const link of document.querySelectorAll("nav a")) {
    link.classList.toggle("active", link.dataset.view === name);
  }
  views[name].refresh().catch(failed);
}

/** One poll: the server's figures, then the view on screen; the next one when done. */
async function poll() {
  clearTimeout(pollTimer);
  try {
    const info = await get("/api/v1/server");
    overview.update(info, Date.now() / 1000);
    await views[current].refresh();
    setStatus(true);
  } catch (error) {
    failed(error);
    if (error instanceof Unauthorized) return; // signed out: the loop starts again on sign-in
  }
  pollTimer = setTimeout(poll, POLL_MS);
}

function setStatus(ok, message = "") {
  const status = document.getElementById("status");
  status.classList.toggle("ok", ok);
  status.title = ok ? `updated ${new Date().toLocaleTimeString()}` : message;
}

/** The one error handler (also for the promises of buttons and the filter boxes). */
function failed(error) {
  if (error instanceof Unauthorized) {
    showLogin("Your session has ended: please sign in again.");
  } else if (error instanceof ApiError) {
    toast(error.message, { error: true });
  } else {
    setStatus(false, String(error));
    toast(`The gateway does not answer (${error.message ?? error}).`, { error: true });
  }
}

function showLogin(message = "") {
  clearTimeout(pollTimer);
  document.getElementById("app").hidden = true;
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = message;
  document.getElementById("login-password").focus();
}

function showApp() {
  document.getElementById("login").hidden = true;
  document.getElementById("app").hidden = false;
  showView(viewOfLocation());
  poll();
}

document.getElementById("login-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = event.target;
  try {
    await login(form.user.value, form.password.value);
  } catch (error) {
    const wrong = error instanceof ApiError && error.status === 401;
    document.getElementById("login-error").textContent =
      wrong ? "Wrong user name or password." : `Cannot sign in: ${error.message}`;
    return;
  }
  form.password.value = "";
  showApp();
});

document.getElementById("logout").addEventListener("click", async () => {
  await logout();
  showLogin();
});

window.addEventListener("hashchange", () => showView(viewOfLocation()));
// a button's or the filter box's failed call ends here
window.addEventListener("unhandledrejection", (event) => {
  event.preventDefault();
  failed(event.reason);
});

if (hasToken()) showApp();
else showLogin();
