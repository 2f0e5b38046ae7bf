// The prompts and jobs the page knows: how rows are ordered and merged, whichever source
// (a page of prompts, an SSE event, a poll, an action's answer) they come from.
import { api } from "./api.js";
import { notice, state, view } from "./state.js";

export const IN_FLIGHT = new Set(["queued", "running"]);
// As the API allows: a settled job that has not been replaced yet.
export const RETRYABLE = new Set(["succeeded", "failed", "cancelled"]);
// As projections/domain/lifecycle.py's OUTPUT_STATES: the current attempt's text may still grow
// (running, or the last batch of a call cut by a cancel or a failure, landing just after).
const OUTPUT_STATES = new Set(["running", "cancelled", "failed"]);

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
  if (known && !newerRow(job, known)) return false;
  entry.jobs.set(job.job_id, job);
  return true;
}

function newerRow(job, known) {
  const [at, knownAt] = [stamp(job.updated_at), stamp(known.updated_at)];
  if (at !== knownAt) return at > knownAt;
  // A job.usage row keeps the settled row's updated_at: its token sums only grow.
  return tokens(job) >= tokens(known);
}

const tokens = (job) => (job.input_tokens ?? 0) + (job.output_tokens ?? 0);

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

// Whether polling has something to follow: a job in flight, or a settled job whose last
// text has not been read yet.
export function anyInFlight() {
  for (const entry of state.prompts.values()) {
    const job = latestJob(entry);
    if (job && (IN_FLIGHT.has(job.state) || outputPending(job))) return true;
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
  view.render(entry);
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
  view.render(entry);
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

// An answer as the page shows it: its text (the parsed JSON, laid out, for a job with an
// output schema), then each tool call it asks for, as a conversation's transcript writes one
// ("→ name(arguments)").
function answerText(response) {
  const calls = (response.tool_calls || []).map(
    (call) => `→ ${call.function.name}(${call.function.arguments})`,
  );
  const parsed = response.output_json;
  const text =
    parsed === null || parsed === undefined ? response.text : JSON.stringify(parsed, null, 2);
  return [text, ...calls].filter((line) => line !== "").join("\n");
}

export async function fetchResponse(entry, responseId) {
  if (state.responses.has(responseId) || state.fetching.has(responseId)) return;
  state.fetching.add(responseId);
  const generation = state.generation;
  try {
    const response = await api("GET", `/v1/responses/${encodeURIComponent(responseId)}`);
    if (generation !== state.generation) return;
    state.responses.set(responseId, answerText(response));
    view.render(entry);
  } catch (err) {
    if (generation !== state.generation) return;
    entry.note = `Could not load the response: ${err.message}`;
    view.render(entry);
  } finally {
    state.fetching.delete(responseId);
  }
}

// -- streamed output ------------------------------------------------------------------------
// Each job's text as its current attempt streams it, from job.output events and from reads of
// GET /v1/jobs/{id}/output alike. Offsets count characters as the API does (code points, not
// JavaScript's UTF-16 units), so an event, a read and the seam between them line up exactly.

const length = (text) => Array.from(text).length;

function outputOf(jobId) {
  let output = state.outputs.get(jobId);
  if (!output) {
    output = { attempt: 0, text: "", length: 0, done: false, again: false };
    state.outputs.set(jobId, output);
  }
  return output;
}

function entryOf(jobId) {
  for (const entry of state.prompts.values()) if (entry.jobs.has(jobId)) return entry;
  return null;
}

// A later attempt starts over: the text of the one before is dropped, never glued to it.
function startAttempt(output, attempt) {
  if (attempt <= output.attempt) return false;
  Object.assign(output, { attempt, text: "", length: 0, done: false });
  return true;
}

// Takes a piece {attempt, offset, text} of a job's text. What is already held is skipped, so
// a replayed event or a read overlapping the events adds nothing twice; an earlier attempt's
// piece is stale; a piece past the end leaves a gap, read from the API. True if it changed.
function takeOutput(jobId, piece) {
  const output = outputOf(jobId);
  if (piece.attempt < output.attempt) return false;
  const reset = startAttempt(output, piece.attempt);
  if (piece.offset > output.length) {
    fetchOutput(jobId);
    return reset;
  }
  const held = output.length - piece.offset;
  const fresh = held === 0 ? piece.text : Array.from(piece.text).slice(held).join("");
  if (!fresh) return reset;
  output.text += fresh;
  output.length += length(fresh);
  return true;
}

// A job.output event. A job of a prompt the page has not loaded yet is skipped: its state
// change is loading the prompt, and showing the card reads the text so far.
export function onOutput(chunk) {
  const entry = entryOf(chunk.job_id);
  if (entry && takeOutput(chunk.job_id, chunk)) view.renderOutput(entry);
}

// A job.output_reset event: a new attempt, whose text follows from offset 0.
export function onOutputReset(reset) {
  const entry = entryOf(reset.job_id);
  if (entry && startAttempt(outputOf(reset.job_id), reset.attempt)) view.renderOutput(entry);
}

// Whether the job's text may still change: it runs, or it has just ended and its last text
// has not been read yet.
export function outputPending(job) {
  if (job.state === "running") return true;
  const output = state.outputs.get(job.job_id);
  return Boolean(output) && !output.done && OUTPUT_STATES.has(job.state);
}

// Whether a job shown for the first time has text to read: it has started an attempt and has
// not succeeded (the response is a succeeded job's whole text; a superseded job is not shown).
export function mayHaveOutput(job) {
  return job.attempt > 0 && (OUTPUT_STATES.has(job.state) || job.state === "queued");
}

// Reads the job's text from the end of what is held on.
export async function fetchOutput(jobId) {
  const output = outputOf(jobId);
  if (state.fetching.has(jobId)) {
    output.again = true; // the read under way may predate the gap: read once more after it
    return;
  }
  state.fetching.add(jobId);
  const generation = state.generation;
  try {
    const read = await api("GET", `/v1/jobs/${encodeURIComponent(jobId)}/output?since=${output.length}`);
    if (generation !== state.generation) return;
    takeOutput(jobId, read);
    if (read.attempt === output.attempt) output.done = read.done;
    const entry = entryOf(jobId);
    if (entry) view.renderOutput(entry);
  } catch (err) {
    if (generation !== state.generation) return;
    notice(`Could not load the text of ${jobId}: ${err.message}`);
    // Nothing held yet: forget the job's copy, so that showing the card again reads again.
    if (output.attempt === 0 && output.length === 0) state.outputs.delete(jobId);
  } finally {
    state.fetching.delete(jobId);
    if (output.again && generation === state.generation) {
      output.again = false;
      fetchOutput(jobId);
    }
  }
}

// While polling: read on the text of every shown job whose text may still change.
export function pollOutputs() {
  const reads = [];
  for (const entry of state.prompts.values()) {
    const job = latestJob(entry);
    if (job && outputPending(job) && !state.fetching.has(job.job_id)) reads.push(fetchOutput(job.job_id));
  }
  return Promise.all(reads);
}
