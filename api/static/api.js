// The API: every request but the SSE stream (follow.js), and where the API key is kept.
import { state } from "./state.js";

const KEY_STORE = "promptjobs.apiKey";

export class ApiError extends Error {
  constructor(status, problem) {
    super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

export async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${state.key}`, Accept: "application/json" };
  const init = { method, headers };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const text = await response.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = { detail: text.slice(0, 200) };
    }
  }
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

// -- the key: in localStorage, so a reopened tab still has it ------------------------------

export function takeKeyFromUrl() {
  // ?key= is taken once, stored, and removed from the address bar and history.
  const url = new URL(window.location.href);
  const key = url.searchParams.get("key");
  if (!key) return;
  localStorage.setItem(KEY_STORE, key);
  url.searchParams.delete("key");
  history.replaceState(null, "", `${url.pathname}${url.search}${url.hash}`);
}

export function storedKey() {
  return localStorage.getItem(KEY_STORE);
}

// An empty key forgets the stored one.
export function storeKey(key) {
  if (key) localStorage.setItem(KEY_STORE, key);
  else localStorage.removeItem(KEY_STORE);
}
