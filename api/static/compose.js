// The compose box: submit a prompt. It is never re-rendered, so what is typed in it stays.
import { api } from "./api.js";
import { schedulePoll } from "./follow.js";
import { fetchPrompt, upsertPrompt } from "./jobs.js";
import { $, notice, state } from "./state.js";

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

export function initCompose() {
  $("compose").addEventListener("submit", submitPrompt);
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      $("compose").requestSubmit();
    }
  });
}
