// The prompts and jobs the page knows: how rows are ordered and merged, whichever source
// (a page of prompts, an SSE event, a poll, an action's answer) they come from.
import { api } from "./api.js";
import { render } from "./cards.js";
import { notice, state } from "./state.js";

export const IN_FLIGHT = new Set(["queued", "running"]);
// As the API allows: a settled job that has not been replaced yet.
export const RETRYABLE = new Set(["succeeded", "failed", "cancelled"]);

// -- ordering -----------------------------------------------------------------------------

// ISO-8601 UTC stamps with microseconds padded, so they compare as strings.
export function stamp(iso) {
  if (!iso) return "";
  const m = /^(.*?)(?:\.(\d+))?(?:Z|[+-]00:00)$/.exec(iso);
  return m ? `${m[1]}.${(m[2] || "").padEnd(6, "0")}` : iso;
}

function laterCursor(a, b) {
  return BigInt(a) >= BigInt(b) ? a : b;
}

export function advance(cursor) {
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

export function latestJob(entry) {
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

export function anyInFlight() {
  for (const entry of state.prompts.values()) {
    const job = latestJob(entry);
    if (job && IN_FLIGHT.has(job.state)) return true;
  }
  return false;
}

// -- merging what the API says ------------------------------------------------------------

export function upsertPrompt(prompt) {
  let entry = state.prompts.get(prompt.prompt_id);
  if (!entry) {
    entry = { prompt, jobs: new Map(), el: null, sort: null };
    state.prompts.set(prompt.prompt_id, entry);
  }
  entry.prompt = prompt;
  for (const job of prompt.jobs || []) mergeJob(entry, job);
  render(entry);
}

export function onJob(job) {
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

export async function fetchPrompt(promptId) {
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

export async function fetchResponse(entry, responseId) {
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
