// What the page knows, shared by every module, and the two DOM helpers they all use.

export const state = {
  key: null,
  // prompt_id -> {prompt, jobs: Map(job_id -> job row), el, sort}
  prompts: new Map(),
  responses: new Map(), // response_id -> text, once fetched
  // job_id -> the text its current attempt has streamed: {attempt, text, length, done, again}
  outputs: new Map(),
  fetching: new Set(), // prompt ids, response ids and job ids (their output) being fetched
  cursor: "0", // the event cursor: advanced by SSE event ids and by polls alike
  nextBefore: null,
  source: null,
  live: false,
  reconnects: 0,
  pollTimer: null,
  // Bumped when the key changes, so answers to the previous key's requests are dropped.
  generation: 0,
};

export const $ = (id) => document.getElementById(id);

export function notice(message) {
  const node = $("notice");
  node.hidden = !message;
  node.textContent = message || "";
}
