// The Now Session: submit prompts and follow their jobs live (SSE, or polling when SSE is
// unavailable). Vanilla JS on purpose: the API serves this file as is, no build step.
"use strict";

const KEY_STORE = "promptjobs.apiKey";
const PAGE_SIZE = 50;
const POLL_MS = 1000;
const POLL_BATCH = 200;
const RECONNECT_MS = [1000, 2000, 5000, 10000, 30000];
const IN_FLIGHT = new Set(["queued", "running"]);
// As the API allows: a settled job that has not been replaced yet.
const RETRYABLE = new Set(["succeeded", "failed", "cancelled"]);

const $ = (id) => document.getElementById(id);

const state = {
  key: null,
  // prompt_id -> {prompt, jobs: Map(job_id -> job row), el, sort}
  prompts: new Map(),
  responses: new Map(), // response_id -> text, once fetched
  fetching: new Set(), // prompt ids and response ids being fetched
  cursor: "0", // the event cursor: advanced by SSE event ids and by polls alike
  nextBefore: null,
  source: null,
  live: false,
  reconnects: 0,
  pollTimer: null,
  // Bumped when the key changes, so answers to the previous key's requests are dropped.
  generation: 0,
};

// -- the API ------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, problem) {
    super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

async function api(method, path, body) {
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

// -- ordering -----------------------------------------------------------------------------

// ISO-8601 UTC stamps with microseconds padded, so they compare as strings.
function stamp(iso) {
  if (!iso) return "";
  const m = /^(.*?)(?:\.(\d+))?(?:Z|[+-]00:00)$/.exec(iso);
  return m ? `${m[1]}.${(m[2] || "").padEnd(6, "0")}` : iso;
}

function laterCursor(a, b) {
  return BigInt(a) >= BigInt(b) ? a : b;
}

function advance(cursor) {
  if (cursor && /^\d+$/.test(cursor)) state.cursor = laterCursor(state.cursor, cursor);
}

// A job row changes only forwards: keep whichever copy is newer, so a stale read arriving
// late (a page loaded before an SSE event, a replayed event) never undoes a newer one.
function mergeJob(entry, job) {
  const known = entry.jobs.get(job.job_id);
  if (known && stamp(job.updated_at) < stamp(known.updated_at)) return false;
  entry.jobs.set(job.job_id, job);
  return true;
}

function latestJob(entry) {
  let latest = null;
  for (const job of entry.jobs.values()) {
    if (
      latest === null ||
      stamp(job.created_at) > stamp(latest.created_at) ||
      (stamp(job.created_at) === stamp(latest.created_at) && job.job_id > latest.job_id)
    ) {
      latest = job;
    }
  }
  return latest;
}

function anyInFlight() {
  for (const entry of state.prompts.values()) {
    const job = latestJob(entry);
    if (job && IN_FLIGHT.has(job.state)) return true;
  }
  return false;
}

// -- merging what the API says ------------------------------------------------------------

function upsertPrompt(prompt) {
  let entry = state.prompts.get(prompt.prompt_id);
  if (!entry) {
    entry = { prompt, jobs: new Map(), el: null, sort: null };
    state.prompts.set(prompt.prompt_id, entry);
  }
  entry.prompt = prompt;
  for (const job of prompt.jobs || []) mergeJob(entry, job);
  render(entry);
}

function onJob(job) {
  const entry = state.prompts.get(job.prompt_id);
  if (!entry) {
    // A prompt this page has not seen (submitted elsewhere, or on an older page).
    fetchPrompt(job.prompt_id);
    return;
  }
  mergeJob(entry, job);
  if (job.superseded_by && !entry.jobs.has(job.superseded_by)) fetchPrompt(job.prompt_id);
  render(entry);
}

async function fetchPrompt(promptId) {
  if (state.fetching.has(promptId)) return;
  state.fetching.add(promptId);
  const generation = state.generation;
  try {
    const prompt = await api("GET", `/v1/prompts/${encodeURIComponent(promptId)}`);
    if (generation === state.generation) upsertPrompt(prompt);
  } catch (err) {
    if (generation === state.generation) notice(`Could not load prompt ${promptId}: ${err.message}`);
  } finally {
    state.fetching.delete(promptId);
  }
}

async function fetchResponse(entry, responseId) {
  if (state.responses.has(responseId) || state.fetching.has(responseId)) return;
  state.fetching.add(responseId);
  const generation = state.generation;
  try {
    const response = await api("GET", `/v1/responses/${encodeURIComponent(responseId)}`);
    if (generation !== state.generation) return;
    state.responses.set(responseId, response.text);
    render(entry);
  } catch (err) {
    if (generation !== state.generation) return;
    entry.note = `Could not load the response: ${err.message}`;
    render(entry);
  } finally {
    state.fetching.delete(responseId);
  }
}

// -- rendering: each prompt card is built once and updated in place -----------------------

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function buildCard(entry) {
  const li = el("li", "prompt");
  li.dataset.promptId = entry.prompt.prompt_id;
  const head = el("div", "head");
  const badge = el("span", "badge");
  const when = el("time", "when");
  const detail = el("span", "detail");
  const actions = el("span", "actions");
  const cancel = el("button", "cancel", "Cancel");
  const retry = el("button", "retry", "Retry");
  const retryWith = el("button", "retry-with", "Retry with…");
  cancel.type = retry.type = retryWith.type = "button";
  cancel.addEventListener("click", () => act(entry, "cancel"));
  retry.addEventListener("click", () => act(entry, "retry"));
  retryWith.addEventListener("click", () => openRetryForm(entry));
  actions.append(cancel, retry, retryWith);
  head.append(badge, when, detail, actions);
  const retryForm = buildRetryForm(entry);
  const text = el("p", "text");
  const error = el("p", "error-line");
  const note = el("p", "note");
  const response = el("pre", "response");
  const history = el("details", "history");
  history.append(el("summary"), el("ol"));
  li.append(head, retryForm, text, error, note, response, history);
  entry.el = li;
  entry.parts = { badge, when, detail, cancel, retry, retryWith, retryForm, text, error, note, response, history };
  return li;
}

// "Retry with…": the new job's options, priority and max_attempts, prefilled with the current
// job's; the API validates them as it validates a submission and its problem shows here.
function buildRetryForm(entry) {
  const form = el("form", "retry-form");
  form.hidden = true;
  form.noValidate = true; // the API's problem details say what is wrong, as for a submission
  const field = (label, input) => {
    const wrap = el("label", "retry-field", label);
    wrap.append(input);
    return wrap;
  };
  const options = el("textarea", "retry-options");
  options.rows = 2;
  options.spellcheck = false;
  const priority = el("input", "retry-priority");
  priority.type = "number";
  const maxAttempts = el("input", "retry-max-attempts");
  maxAttempts.type = "number";
  const run = el("button", "retry-run", "Run again");
  run.type = "submit";
  const close = el("button", "retry-close", "Close");
  close.type = "button";
  close.addEventListener("click", () => {
    form.hidden = true;
  });
  const problem = el("span", "retry-error");
  problem.setAttribute("role", "alert");
  form.append(
    field("options (JSON)", options),
    field("priority", priority),
    field("max_attempts", maxAttempts),
    run,
    close,
    problem,
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    problem.textContent = "";
    let body;
    try {
      body = retryBody(options.value, priority.value, maxAttempts.value);
    } catch (err) {
      problem.textContent = err.message;
      return;
    }
    act(entry, "retry", body);
  });
  return form;
}

function retryBody(rawOptions, priority, maxAttempts) {
  const body = {};
  if (rawOptions.trim()) {
    let options;
    try {
      options = JSON.parse(rawOptions);
    } catch (err) {
      throw new Error(`options must be JSON: ${err.message}`);
    }
    if (options === null || typeof options !== "object" || Array.isArray(options)) {
      throw new Error("options must be a JSON object");
    }
    body.options = options;
  }
  if (priority !== "") body.priority = Number(priority);
  if (maxAttempts !== "") body.max_attempts = Number(maxAttempts);
  return body;
}

function openRetryForm(entry) {
  const job = latestJob(entry);
  if (!job) return;
  const form = entry.parts.retryForm;
  form.querySelector(".retry-options").value = JSON.stringify(job.options || {});
  form.querySelector(".retry-priority").value = String(job.priority ?? "");
  form.querySelector(".retry-max-attempts").value = String(job.max_attempts ?? "");
  form.querySelector(".retry-error").textContent = "";
  form.hidden = false;
  form.querySelector(".retry-options").focus();
}

function place(entry) {
  const sort = `${stamp(entry.prompt.created_at)} ${entry.prompt.prompt_id}`;
  if (entry.sort === sort) return;
  entry.sort = sort;
  entry.el.dataset.sort = sort;
  const list = $("prompts");
  for (const other of list.children) {
    if (other !== entry.el && other.dataset.sort < sort) {
      list.insertBefore(entry.el, other);
      return;
    }
  }
  list.appendChild(entry.el);
}

function describe(job) {
  const attempts = `attempt ${job.attempt} of ${job.max_attempts}`;
  switch (job.state) {
    case "queued":
      // A chain's child: it runs once these parent prompts' jobs have succeeded.
      if (job.attempt === 0 && job.waiting_on && job.waiting_on.length) return `waiting for ${job.waiting_on.join(", ")}`;
      if (job.attempt === 0) return job.scheduled_for ? `scheduled for ${clock(job.scheduled_for)}` : "waiting for a worker";
      return job.next_attempt_at
        ? `attempt ${job.attempt + 1} of ${job.max_attempts} at ${clock(job.next_attempt_at)}`
        : `waiting to retry (${attempts} failed)`;
    case "running":
      return attempts;
    case "succeeded":
      return `${attempts} · ${duration(job.created_at, job.finished_at)}`;
    case "failed":
      return `${attempts} · ${job.error_kind || "error"}`;
    case "cancelled":
      return `cancelled · ${duration(job.created_at, job.finished_at)}`;
    case "superseded":
      return "replaced by a retry";
    default:
      return job.state;
  }
}

function clock(iso) {
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? "" : date.toLocaleTimeString();
}

function duration(from, to) {
  const ms = new Date(to) - new Date(from);
  if (!Number.isFinite(ms) || ms < 0) return "";
  return ms < 10000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.round(ms / 1000)} s`;
}

function render(entry) {
  const job = latestJob(entry);
  if (!job) return;
  if (!entry.el) buildCard(entry);
  place(entry);
  const p = entry.parts;
  const li = entry.el;
  li.dataset.state = job.state;
  li.dataset.jobId = job.job_id;
  p.badge.textContent = job.state;
  p.badge.className = `badge state-${job.state}`;
  p.when.textContent = clock(entry.prompt.created_at);
  p.when.dateTime = entry.prompt.created_at || "";
  p.detail.textContent = describe(job);
  p.text.textContent = entry.prompt.prompt;
  p.cancel.hidden = !IN_FLIGHT.has(job.state);
  p.retry.hidden = p.retryWith.hidden = !RETRYABLE.has(job.state);
  if (!RETRYABLE.has(job.state)) p.retryForm.hidden = true;
  if (!entry.busy) p.cancel.disabled = p.retry.disabled = p.retryWith.disabled = false;

  const failed = job.error_kind && (job.state === "failed" || job.state === "queued");
  p.error.hidden = !failed;
  p.error.textContent = failed ? `${job.error_kind}: ${job.error_message || ""}` : "";
  p.note.hidden = !entry.note;
  p.note.textContent = entry.note || "";

  const text = job.response_id ? state.responses.get(job.response_id) : undefined;
  p.response.hidden = text === undefined;
  p.response.textContent = text === undefined ? "" : text;
  if (job.state === "succeeded" && job.response_id && text === undefined) {
    fetchResponse(entry, job.response_id);
  }

  // Every job of the prompt, oldest first; the <details> element stays, so it stays open.
  const jobs = [...entry.jobs.values()].sort((a, b) => (stamp(a.created_at) < stamp(b.created_at) ? -1 : 1));
  p.history.hidden = jobs.length < 2;
  p.history.firstChild.textContent = `History (${jobs.length} jobs)`;
  const items = jobs.map((j) => {
    const item = el("li", `history-job state-${j.state}`);
    item.dataset.jobId = j.job_id;
    item.dataset.state = j.state;
    item.append(el("span", `badge state-${j.state}`, j.state), el("span", "detail", describe(j)), el("code", "job-id", j.job_id));
    // Which options each job ran with (a retry may have changed them).
    if (j.options) item.append(el("code", "job-options", JSON.stringify(j.options)));
    return item;
  });
  p.history.lastChild.replaceChildren(...items);
}

async function act(entry, action, body) {
  const job = latestJob(entry);
  if (!job || entry.busy) return;
  entry.busy = true;
  entry.note = "";
  const p = entry.parts;
  p.cancel.disabled = p.retry.disabled = p.retryWith.disabled = true;
  const generation = state.generation;
  try {
    const answer = await api("POST", `/v1/jobs/${encodeURIComponent(job.job_id)}/${action}`, body);
    if (generation !== state.generation) return;
    p.retryForm.hidden = true;
    onJob(answer);
    if (!state.live) schedulePoll(0);
    // A retry also supersedes the old job; read the prompt so both rows are current now.
    if (action === "retry") fetchPrompt(entry.prompt.prompt_id);
  } catch (err) {
    if (body !== undefined) {
      // A refused "Retry with…": say why next to the fields, which keep what was typed.
      p.retryForm.querySelector(".retry-error").textContent = err.message;
    } else {
      entry.note = `Could not ${action}: ${err.message}`;
    }
    fetchPrompt(entry.prompt.prompt_id);
  } finally {
    entry.busy = false;
    render(entry);
  }
}

// -- submitting ---------------------------------------------------------------------------

function composeError(message) {
  $("compose-error").textContent = message || "";
}

async function submitPrompt(event) {
  event.preventDefault();
  composeError("");
  if (!state.key) {
    composeError("Enter an API key first.");
    return;
  }
  const text = $("prompt").value;
  if (!text.trim()) {
    composeError("Write a prompt first.");
    return;
  }
  const body = { prompt: text };
  const rawOptions = $("options").value.trim();
  if (rawOptions) {
    let options;
    try {
      options = JSON.parse(rawOptions);
    } catch (err) {
      composeError(`options must be JSON: ${err.message}`);
      return;
    }
    if (options === null || typeof options !== "object" || Array.isArray(options)) {
      composeError("options must be a JSON object");
      return;
    }
    body.options = options;
  }
  if ($("priority").value !== "") body.priority = Number($("priority").value);
  if ($("max-attempts").value !== "") body.max_attempts = Number($("max-attempts").value);

  const button = $("submit");
  button.disabled = true;
  try {
    const accepted = await api("POST", "/v1/prompts", body);
    // Clear only what was sent: anything typed while the request was out is kept.
    if ($("prompt").value === text) $("prompt").value = "";
    showAccepted(accepted, text);
    fetchPrompt(accepted.prompt_id);
  } catch (err) {
    composeError(err.message);
  } finally {
    button.disabled = false;
  }
}

// The 202 is the truth at once: show the queued job before the full prompt is read back.
function showAccepted(accepted, text) {
  notice("");
  if (!state.live) schedulePoll(0);
  if (state.prompts.has(accepted.prompt_id)) return;
  const now = new Date().toISOString();
  const job = {
    job_id: accepted.job_id,
    prompt_id: accepted.prompt_id,
    state: accepted.state,
    attempt: 0,
    max_attempts: 0,
    created_at: now,
    updated_at: "", // older than any row the API sends
  };
  upsertPrompt({ prompt_id: accepted.prompt_id, prompt: text, created_at: now, jobs: [job] });
}

// -- following changes: SSE first, polling while SSE is unavailable ------------------------

function setMode(mode) {
  const badge = $("connection");
  badge.dataset.mode = mode;
  badge.textContent = {
    live: "live",
    polling: "polling",
    idle: "idle · no live stream",
    connecting: "connecting…",
    offline: "offline",
  }[mode];
}

function follow() {
  if (!window.EventSource) {
    setLive(false);
    return;
  }
  const generation = state.generation;
  // EventSource cannot send headers: GET /v1/events alone takes the key as access_token.
  const url =
    `/v1/events?since=${encodeURIComponent(state.cursor)}` +
    `&access_token=${encodeURIComponent(state.key)}`;
  const source = new EventSource(url);
  state.source = source;
  setMode("connecting");
  source.addEventListener("open", () => {
    state.reconnects = 0;
    setLive(true);
  });
  source.addEventListener("job.state_changed", (event) => {
    advance(event.lastEventId);
    onJob(JSON.parse(event.data));
  });
  source.addEventListener("error", () => {
    if (generation !== state.generation) return;
    setLive(false);
    if (source.readyState === EventSource.CLOSED) {
      // The browser gave up (an HTTP error): try again ourselves, from our own cursor.
      state.source = null;
      const delay = RECONNECT_MS[Math.min(state.reconnects, RECONNECT_MS.length - 1)];
      state.reconnects += 1;
      setTimeout(() => {
        if (generation === state.generation && state.source === null) follow();
      }, delay);
    }
  });
}

function setLive(live) {
  state.live = live;
  if (live) {
    clearTimeout(state.pollTimer);
    state.pollTimer = null;
    setMode("live");
  } else {
    schedulePoll(0);
  }
}

function schedulePoll(delay = POLL_MS) {
  if (state.live || state.pollTimer !== null || !state.key) return;
  state.pollTimer = setTimeout(pollOnce, delay);
}

// Polling is a fallback and costs requests: it runs only while a job is in flight.
async function pollOnce() {
  state.pollTimer = null;
  if (state.live) return;
  if (!anyInFlight()) {
    setMode("idle");
    return;
  }
  setMode("polling");
  const generation = state.generation;
  try {
    for (;;) {
      const page = await api("GET", `/v1/jobs?since=${state.cursor}&limit=${POLL_BATCH}`);
      if (generation !== state.generation) return;
      advance(page.next_cursor);
      for (const job of page.jobs) onJob(job);
      if (page.jobs.length < POLL_BATCH) break;
    }
  } catch (err) {
    if (generation !== state.generation) return;
    notice(`Could not reach the API: ${err.message}`);
  }
  schedulePoll();
}

// -- start-up -----------------------------------------------------------------------------

function notice(message) {
  const node = $("notice");
  node.hidden = !message;
  node.textContent = message || "";
}

function stopFollowing() {
  state.generation += 1;
  if (state.source) state.source.close();
  state.source = null;
  state.live = false;
  clearTimeout(state.pollTimer);
  state.pollTimer = null;
  state.prompts.clear();
  state.responses.clear();
  state.cursor = "0";
  state.nextBefore = null;
  $("prompts").replaceChildren();
  $("older").hidden = true;
}

async function loadPage(before) {
  const query = new URLSearchParams({ limit: String(PAGE_SIZE) });
  if (before) query.set("before", before);
  const page = await api("GET", `/v1/prompts?${query}`);
  for (const prompt of page.prompts) upsertPrompt(prompt);
  state.nextBefore = page.next_before;
  $("older").hidden = !state.nextBefore;
  return page;
}

async function start() {
  stopFollowing();
  notice("");
  if (!state.key) {
    setMode("offline");
    notice("Enter an API key to see your prompts. `promptjobs dev` prints one.");
    return;
  }
  const generation = state.generation;
  try {
    const page = await loadPage(null);
    if (generation !== state.generation) return;
    // The page's cursor was read before its prompts: following from it misses nothing.
    state.cursor = page.cursor;
    if (page.prompts.length === 0) notice("No prompts yet: submit one above.");
    follow();
  } catch (err) {
    if (generation !== state.generation) return;
    setMode("offline");
    if (err instanceof ApiError && err.status === 401) {
      notice(`The API key was refused: ${err.message}`);
    } else {
      notice(`Could not load your prompts (${err.message}); trying again…`);
      setTimeout(() => generation === state.generation && start(), 3000);
    }
  }
}

function takeKeyFromUrl() {
  // ?key= is taken once, stored, and removed from the address bar and history.
  const url = new URL(window.location.href);
  const key = url.searchParams.get("key");
  if (!key) return;
  localStorage.setItem(KEY_STORE, key);
  url.searchParams.delete("key");
  history.replaceState(null, "", `${url.pathname}${url.search}${url.hash}`);
}

function init() {
  takeKeyFromUrl();
  state.key = localStorage.getItem(KEY_STORE);
  $("api-key").value = state.key || "";
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("api-key").value.trim();
    if (key) localStorage.setItem(KEY_STORE, key);
    else localStorage.removeItem(KEY_STORE);
    state.key = key || null;
    start();
  });
  $("compose").addEventListener("submit", submitPrompt);
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      $("compose").requestSubmit();
    }
  });
  $("older").addEventListener("click", async () => {
    const generation = state.generation;
    try {
      await loadPage(state.nextBefore);
    } catch (err) {
      if (generation === state.generation) notice(`Could not load older prompts: ${err.message}`);
    }
  });
  start();
}

init();
