"""What an operator sees in the Temporal Web UI of the dev server: a failed job is a Failed
workflow whose page names its error kind and attempt, found by `PromptJobState="failed"`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote

import pytest
from playwright.async_api import Browser, Page, expect
from temporalio.testing import WorkflowEnvironment

from promptjobs.launch import DEV_SERVER_ARGS
from promptjobs.runtime import temporal_cli
from tests.conftest import eventually, free_port, running_stack
from tests.web.conftest import screenshot, sqlite_settings
from workflows import search_attributes

# The Web UI renders from Temporal's visibility store, later on a loaded machine.
UI_WAIT_MS = 30_000


@pytest.fixture(scope="module")
async def dev_server_with_ui() -> AsyncIterator[tuple[WorkflowEnvironment, str]]:
    """The dev server as `promptjobs dev` runs it, Web UI included, on free ports."""
    ui_port = free_port()
    env = await WorkflowEnvironment.start_local(
        port=free_port(),
        ui=True,
        ui_port=ui_port,
        search_attributes=search_attributes.ALL,
        dev_server_existing_path=temporal_cli(),
        dev_server_extra_args=DEV_SERVER_ARGS,
        dev_server_log_level="error",
    )
    try:
        yield env, f"http://127.0.0.1:{ui_port}/namespaces/{env.client.namespace}"
    finally:
        await env.shutdown()


async def test_a_failed_job_is_a_failed_workflow_in_the_web_ui(
    browser: Browser, dev_server_with_ui: tuple[WorkflowEnvironment, str], tmp_path: Path
) -> None:
    env, ui = dev_server_with_ui
    settings = sqlite_settings(tmp_path, backoff_initial_s=1.0, backoff_jitter=0.0)
    async with running_stack(settings, env.client) as stack:
        accepted = await stack.submit(
            "no key", max_attempts=3, options={"fake": {"fail": ["provider_5xx", "auth"]}}
        )
        job = await stack.settled(accepted["job_id"])
        assert (job["state"], job["error_kind"], job["attempt"]) == ("failed", "auth", 2)
        job_id = job["job_id"]
        query = f'PromptJobState="failed" AND TaskQueue="{settings.temporal_task_queue}"'

        async def listed() -> list[str]:
            return [wf.id async for wf in env.client.list_workflows(query)]

        await eventually(listed, lambda ids: ids == [job_id], timeout=30)

    context = await browser.new_context(viewport={"width": 1600, "height": 1200})
    context.set_default_timeout(30_000)
    try:
        page = await context.new_page()
        await page.goto(f"{ui}/workflows/{job_id}")
        await _shows(page, job["error_message"])  # the workflow's failure: the row's message
        await expect(page.get_by_text("Failed", exact=True).first).to_be_visible(timeout=UI_WAIT_MS)
        await screenshot(page, "temporal-ui-failed-job")
        # Its search attributes: the error kind and the attempt, as the projection has them.
        await page.get_by_text("Search Attributes", exact=True).click()
        attributes = page.locator("main")
        for shown in ['"PromptJobErrorKind": "auth"', '"PromptJobAttempt": 2']:
            await expect(attributes).to_contain_text(shown, timeout=UI_WAIT_MS)
        await screenshot(page, "temporal-ui-failed-job-attributes")

        await page.goto(f"{ui}/workflows?query={quote(query)}")
        await expect(page.get_by_text(job_id).first).to_be_visible(timeout=UI_WAIT_MS)
        await expect(page.get_by_text("Failed", exact=True).first).to_be_visible(timeout=UI_WAIT_MS)
        await screenshot(page, "temporal-ui-failed-jobs-list")
    finally:
        await context.close()


async def _shows(page: Page, text: str) -> None:
    await expect(page.get_by_text(text, exact=False).first).to_be_visible(timeout=UI_WAIT_MS)
