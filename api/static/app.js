// The Now Session: submit prompts and follow their jobs live (SSE, or polling when SSE is
// unavailable). Vanilla JS on purpose: the API serves these files as they are, no build step.
// This is the entry point, loaded by index.html as a module; the modules it imports:
//   state.js    what the page knows, shared by every module
//   api.js      requests to the API, and where the API key is kept
//   jobs.js     ordering and merging the job rows the API sends, and each job's streamed text
//   cards.js    rendering: one card per prompt, updated in place
//   actions.js  a card's Cancel, Retry and "Retry with…"
//   compose.js  the compose box
//   follow.js   SSE, and polling while SSE is unavailable
// Imports run one way (a test checks): jobs.js and actions.js show a change through
// state.js's `view`, which this module points at cards.js's renderers.
import { ApiError, api, storedKey, storeKey, takeKeyFromUrl } from "./api.js";
import { render, renderOutput } from "./cards.js";
import { initCompose } from "./compose.js";
import { follow, setMode } from "./follow.js";
import { upsertPrompt } from "./jobs.js";
import { $, notice, state, view } from "./state.js";

view.render = render;
view.renderOutput = renderOutput;

const PAGE_SIZE = 50;

function stopFollowing() {
  state.generation += 1;
  if (state.source) state.source.close();
  state.source = null;
  state.live = false;
  clearTimeout(state.pollTimer);
  state.pollTimer = null;
  state.prompts.clear();
  state.responses.clear();
  state.outputs.clear();
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

function init() {
  takeKeyFromUrl();
  state.key = storedKey();
  $("api-key").value = state.key || "";
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("api-key").value.trim();
    storeKey(key);
    state.key = key || null;
    start();
  });
  initCompose();
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
