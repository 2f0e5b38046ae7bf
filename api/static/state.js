// What the page knows, shared by every module, the DOM helpers they all use, and the view:
// how a change is shown.

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

// How a change is shown: app.js sets these to cards.js's renderers, so the modules that
// merge what the API sends (jobs.js, actions.js) call them without importing the cards,
// which import them. Imports run one way.
export const view = {
  render: (_entry) => {},
  renderOutput: (_entry) => {},
};

export const $ = (id) => document.getElementById(id);

export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

export function notice(message) {
  const node = $("notice");
  node.hidden = !message;
  node.textContent = message || "";
}
