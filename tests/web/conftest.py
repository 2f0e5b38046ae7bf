"""Browser fixtures: Debian's headless Chromium driven by Playwright, and a SQLite-only stack."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, BrowserContext, Page, async_playwright, expect
from temporalio.testing import WorkflowEnvironment

from promptjobs.runtime import connect_temporal
from promptjobs.settings import Settings
from tests.conftest import Stack, free_port, make_settings, running_stack

# What the page shows comes from a real service; on a machine running the suite on several
# workers, give it longer than Playwright's 5 s.
expect.set_options(timeout=15_000)

CHROMIUM = Path("/usr/bin/chromium")
HAVE_CHROMIUM = CHROMIUM.exists()
# Never a browser download: Debian's Chromium, with nothing that reaches out to the network.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

# Records every state a prompt card and the connection pill take, and every text a card's
# streamed output shows, in order, so a test can tell what the user saw even when it lasted
# only a few milliseconds.
RECORD_SEEN = """
window.__seenStates = {};
window.__seenModes = [];
window.__seenOutputs = {};
const remember = (seen, values) => {
  for (const value of values) if (value && seen[seen.length - 1] !== value) seen.push(value);
};
new MutationObserver((records) => {
  for (const record of records) {
    const node = record.target;
    if (node.id === "connection") {
      remember(window.__seenModes, [record.oldValue, node.dataset.mode]);
    } else if (node.classList && node.classList.contains("prompt")) {
      const seen = (window.__seenStates[node.dataset.promptId] ||= []);
      remember(seen, [record.oldValue, node.dataset.state]);
    } else if (record.type === "childList" && node.classList && node.classList.contains("output")) {
      // The page replaces the text whole: the added node is the text shown at that moment.
      const seen = (window.__seenOutputs[node.closest(".prompt").dataset.promptId] ||= []);
      remember(seen, [record.addedNodes.length ? record.addedNodes[0].data : ""]);
    }
  }
}).observe(document, {
  subtree: true, childList: true, attributes: true, attributeOldValue: true,
  attributeFilter: ["data-state", "data-mode"],
});
"""

# A model the web stack's workers price (the fake provider answers for any model name): its
# jobs have a cost; `fake*` models cost 0 and any other name's cost is unknown.
PRICED_MODEL = "priced-1"


@pytest.fixture(scope="session")
async def browser() -> AsyncIterator[Browser]:
    if not HAVE_CHROMIUM:
        pytest.skip("Debian's chromium is not installed (./run test installs it as root)")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS
        )
        yield browser
        await browser.close()


def sqlite_settings(tmp_path: Path, **overrides: Any) -> Settings:
    return make_settings(
        tmp_path, database_url=f"sqlite:///{tmp_path / 'projection.db'}", **overrides
    )


@pytest.fixture
async def web_stack(dev_server: WorkflowEnvironment, tmp_path: Path) -> AsyncIterator[Stack]:
    """The whole service on SQLite only: the page, not the store, is under test here. A
    failed attempt is retried within a second (not 5 s), and one model has a price."""
    prices = tmp_path / "prices.toml"
    prices.write_text(f'[models."{PRICED_MODEL}"]\ninput = 1000.0\noutput = 2000.0\n')
    settings = sqlite_settings(tmp_path, prices_file=prices, backoff_initial_s=0.5)
    async with running_stack(settings, dev_server.client) as running:
        yield running


@pytest.fixture
async def stack_without_temporal(tmp_path: Path) -> AsyncIterator[Stack]:
    """The API and its dispatcher while Temporal is unreachable: submissions wait, queued."""
    settings = sqlite_settings(tmp_path, temporal_address=f"127.0.0.1:{free_port()}")
    client = await connect_temporal(settings, lazy=True)
    async with running_stack(settings, client, run_worker=False) as running:
        yield running


PageErrors = list[str]
OpenPage = Callable[[str], Awaitable[tuple[Page, PageErrors]]]


@asynccontextmanager
async def user_browser(browser: Browser, stack: Stack) -> AsyncIterator[BrowserContext]:
    """One user's browser profile (its localStorage outlives a closed tab)."""
    context = await browser.new_context(base_url=stack.base_url)
    context.set_default_timeout(20_000)
    await context.add_init_script(RECORD_SEEN)
    try:
        yield context
    finally:
        await context.close()


def page_opener(context: BrowserContext) -> OpenPage:
    async def open_page(path: str = "/") -> tuple[Page, PageErrors]:
        page = await context.new_page()
        errors: PageErrors = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        await page.goto(path)
        return page, errors

    return open_page


# The browser closes before its stack stops, so no SSE stream holds the API open.
@pytest.fixture
async def browser_context(browser: Browser, web_stack: Stack) -> AsyncIterator[BrowserContext]:
    async with user_browser(browser, web_stack) as context:
        yield context


@pytest.fixture
def open_page(browser_context: BrowserContext) -> OpenPage:
    return page_opener(browser_context)


@pytest.fixture
async def open_page_without_temporal(
    browser: Browser, stack_without_temporal: Stack
) -> AsyncIterator[OpenPage]:
    async with user_browser(browser, stack_without_temporal) as context:
        yield page_opener(context)


async def screenshot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    return path
