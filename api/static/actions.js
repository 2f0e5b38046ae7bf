// What a card's buttons do: cancel, retry, and "Retry with…" other options.
import { api } from "./api.js";
import { schedulePoll } from "./follow.js";
import { fetchPrompt, latestJob, onJob } from "./jobs.js";
import { el, state, view } from "./state.js";

// "Retry with…": the new job's options, priority and max_attempts, prefilled with the current
// job's; the API validates them as it validates a submission and its problem shows here.
export function buildRetryForm(entry) {
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

export async function openRetryForm(entry) {
  let job = latestJob(entry);
  if (!job) return;
  const form = entry.parts.retryForm;
  // A listing leaves long options out (options_omitted): the job's own read has them.
  if (job.options_omitted) {
    try {
      job = await api("GET", `/v1/jobs/${encodeURIComponent(job.job_id)}`);
    } catch (err) {
      form.querySelector(".retry-error").textContent = err.message;
    }
  }
  form.querySelector(".retry-options").value = JSON.stringify(job.options || {});
  form.querySelector(".retry-priority").value = String(job.priority ?? "");
  form.querySelector(".retry-max-attempts").value = String(job.max_attempts ?? "");
  form.querySelector(".retry-error").textContent = "";
  form.hidden = false;
  form.querySelector(".retry-options").focus();
}

export async function act(entry, action, body) {
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
    view.render(entry);
  }
}
