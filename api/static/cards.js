// Rendering: each prompt card is built once and updated in place, so what the user has open
// (a card's History, a "Retry with…" form being filled in) survives every update.
import { act, buildRetryForm, openRetryForm } from "./actions.js";
import { fetchOutput, fetchResponse, IN_FLIGHT, latestJob, mayHaveOutput, RETRYABLE, stamp } from "./jobs.js";
import { $, el, state } from "./state.js";

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
  const output = el("pre", "output");
  const response = el("pre", "response");
  const usage = el("p", "usage");
  usage.title = "Tokens in and out over all the job's attempts, and what they cost";
  const history = el("details", "history");
  history.append(el("summary"), el("ol"));
  li.append(head, retryForm, text, error, note, output, response, usage, history);
  entry.el = li;
  entry.parts = {
    badge, when, detail, cancel, retry, retryWith, retryForm, text, error, note, output, response, usage, history,
  };
  return li;
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
      // Waiting for room in its provider budget (the row says why, and until about when).
      if (job.waiting_for) return job.waiting_for;
      // A chain's child: it runs once these parent prompts' jobs have succeeded.
      if (job.attempt === 0 && job.waiting_on && job.waiting_on.length) return `waiting for ${job.waiting_on.map(parentName).join(", ")}`;
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

// A parent prompt as a reader knows it: the start of its text if the page has it, else its id.
function parentName(promptId) {
  const parent = state.prompts.get(promptId);
  if (!parent || !parent.prompt || !parent.prompt.prompt) return promptId;
  const text = parent.prompt.prompt.replace(/\s+/g, " ").trim();
  return `“${text.length > 40 ? `${text.slice(0, 40)}…` : text}”`;
}

// A chain child's text with its placeholders ({{after[0]}}, {{after.pmt_…}}) shown as what
// they will be: the answer of a named parent.
function readableText(prompt) {
  const after = prompt.after || [];
  return prompt.prompt.replace(/\{\{\s*after(?:\[(\d+)\]|\.([A-Za-z0-9_]+))\s*\}\}/g, (whole, index, id) => {
    const parent = id || after[Number(index)];
    return parent ? `[the answer of ${parentName(parent)}]` : whole;
  });
}

function usage(job) {
  const cost = job.cost_usd;
  const price =
    cost === null || cost === undefined
      ? "cost unknown"
      : cost === 0
        ? "$0"
        : cost < 0.000001
          ? "< $0.000001"
          : `$${cost.toFixed(cost < 1 ? 6 : 2)}`;
  return `${job.input_tokens ?? 0} in · ${job.output_tokens ?? 0} out tokens · ${price}`;
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

export function render(entry) {
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
  p.text.textContent = readableText(entry.prompt);
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
  renderOutput(entry);
  // What the job consumed, once it has: a running first attempt has recorded nothing yet.
  const consumed = job.attempt > 0 && (RETRYABLE.has(job.state) || job.input_tokens > 0 || job.output_tokens > 0);
  p.usage.hidden = !consumed;
  p.usage.textContent = consumed ? usage(job) : "";

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
    else if (j.options_omitted) item.append(el("code", "job-options", "(long options: Retry with… shows them)"));
    return item;
  });
  p.history.lastChild.replaceChildren(...items);
}

// The text the job's attempt streams, growing while it runs, until the response replaces it;
// a failed or cancelled job keeps what its last attempt streamed. Called on every output
// change, so it touches only its own element.
export function renderOutput(entry) {
  const job = latestJob(entry);
  if (!job || !entry.el) return;
  const output = state.outputs.get(job.job_id);
  if (!output && mayHaveOutput(job)) fetchOutput(job.job_id); // first shown: what streamed so far
  const text = output ? output.text : "";
  const streaming = job.state === "running";
  const node = entry.parts.output;
  node.hidden = !entry.parts.response.hidden || (!streaming && !text);
  if (node.textContent !== text) node.textContent = text;
  node.classList.toggle("streaming", streaming);
  node.classList.toggle("partial", !streaming && job.state !== "succeeded");
  node.title = streaming ? "streaming…" : job.state === "succeeded" ? "" : "what was streamed before the attempt ended";
}
