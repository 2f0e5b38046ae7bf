// Following changes: SSE first, polling while SSE is unavailable. SSE event ids and the
// polls' next_cursor advance one cursor, so switching between them loses nothing.
import { api } from "./api.js";
import { advance, anyInFlight, onJob, onOutput, onOutputReset, pollOutputs } from "./jobs.js";
import { $, notice, state } from "./state.js";

const POLL_MS = 1000;
const POLL_BATCH = 200;
const RECONNECT_MS = [1000, 2000, 5000, 10000, 30000];

// What each SSE event type carries, and who takes it. A job.usage row (a cancelled call's
// last tokens, recorded after the job settled) and a job.done row (the job's final row: its
// text and usage are all in) merge like any other row.
const EVENTS = {
  "job.state_changed": onJob,
  "job.usage": onJob,
  "job.done": onJob,
  "job.output": onOutput,
  "job.output_reset": onOutputReset,
};

export function setMode(mode) {
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

export function follow() {
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
  for (const [type, take] of Object.entries(EVENTS)) {
    source.addEventListener(type, (event) => {
      advance(event.lastEventId);
      take(JSON.parse(event.data));
    });
  }
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

export function schedulePoll(delay = POLL_MS) {
  if (state.live || state.pollTimer !== null || !state.key) return;
  state.pollTimer = setTimeout(pollOnce, delay);
}

// Polling is a fallback and costs requests: it runs only while a job is in flight (or a
// settled job's last text is still to be read).
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
    // Job rows carry no text: each job whose text may still grow is read on from its end.
    await pollOutputs();
    if (generation !== state.generation) return;
  } catch (err) {
    if (generation !== state.generation) return;
    notice(`Could not reach the API: ${err.message}`);
  }
  schedulePoll();
}
