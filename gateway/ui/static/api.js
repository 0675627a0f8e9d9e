// Calls to the gateway's admin API (/api/v1) with the dashboard's bearer token.
//
// The login form trades a user name and password (HTTP Basic, RFC 7617) for a token
// (POST /api/v1/tokens); the token is kept in sessionStorage, so it lasts as long as the
// browser tab, and is sent as "Authorization: Bearer" (RFC 6750, section 2.1) on every call.
// A 401 means the token expired or was revoked: it is forgotten and `Unauthorized` is thrown,
// which sends the page back to the login form.
//
// Every fetch uses credentials: "omit". The page needs no cookie and no credential the
// browser remembers, and a 401 answer to a request made without credentials is never turned
// into the browser's own login dialog (Fetch Standard, "HTTP-network-or-cache fetch"), which
// the API's "WWW-Authenticate: Basic" would open otherwise. The price: no TLS client
// certificate goes with these calls either.

const TOKEN_KEY = "gateway.token";

/** The admin API refused the token (or there is none): sign in again. */
export class Unauthorized extends Error {}

/** Any other error answer: `status` and the API's {"error": ...} message. */
export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function hasToken() {
  return sessionStorage.getItem(TOKEN_KEY) !== null;
}

/** Base64 of a string's UTF-8 bytes (btoa alone takes Latin-1 only). */
function base64Utf8(text) {
  const bytes = new TextEncoder().encode(text);
  return btoa(Array.from(bytes, (b) => String.fromCharCode(b)).join(""));
}

/** The API's error message of a failed answer, or its status line. */
async function errorMessage(response) {
  try {
    const body = await response.json();
    if (body && typeof body.error === "string") return body.error;
  } catch {
    // not JSON: fall back to the status line
  }
  return `${response.status} ${response.statusText}`;
}

/** Obtain a token with Basic credentials; throws ApiError (401: bad name or password). */
export async function login(user, password) {
  const response = await fetch("/api/v1/tokens", {
    method: "POST",
    credentials: "omit",
    headers: { Authorization: `Basic ${base64Utf8(`${user}:${password}`)}` },
  });
  if (!response.ok) throw new ApiError(response.status, await errorMessage(response));
  const { token } = await response.json();
  sessionStorage.setItem(TOKEN_KEY, token);
}

/** Revoke the token on the server (best effort) and forget it. */
export async function logout() {
  try {
    await request("DELETE", "/api/v1/tokens/current");
  } catch {
    // expired already, or the gateway is gone: forgetting it is all that is left to do
  }
  sessionStorage.removeItem(TOKEN_KEY);
}

/**
 * One call: `path` with `query` (an object; empty values left out) and `body` (sent as
 * JSON). Resolves to the fetch Response once it is known to be a success.
 */
async function request(method, path, { query, body } = {}) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token === null) throw new Unauthorized("not signed in");
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(query ?? {})) {
    if (value !== undefined && value !== null && value !== "") params.set(key, String(value));
  }
  const url = params.size ? `${path}?${params}` : path;
  const headers = { Authorization: `Bearer ${token}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(url, {
    method,
    credentials: "omit",
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    throw new Unauthorized(await errorMessage(response));
  }
  if (!response.ok) throw new ApiError(response.status, await errorMessage(response));
  return response;
}

/** GET a JSON view. */
export async function get(path, query) {
  return (await request("GET", path, { query })).json();
}

/** POST and return the JSON answer. */
export async function post(path, body = {}) {
  return (await request("POST", path, { body })).json();
}

/**
 * One page of a list route: `limit` rows from `offset` of the rows whose name matches the
 * pattern `q` (the server sorts and filters). `total` is the server's X-Total-Count: how many
 * rows match in all.
 */
export async function getPage(path, { limit, offset, q }) {
  const response = await request("GET", path, { query: { limit, offset, q } });
  const rows = await response.json();
  const header = response.headers.get("X-Total-Count");
  return {
    rows: rows.slice(0, limit), // never more than a page, whatever the answer holds
    total: header === null ? offset + rows.length : Number(header),
  };
}

/** A path segment naming a destination (names may hold "/", "?", "#" or "%"). */
export function segment(name) {
  return encodeURIComponent(name);
}
