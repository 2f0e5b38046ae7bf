"""The Now Session page in headless Chromium against the whole running service."""

from __future__ import annotations

import json
import re
from typing import Any

from playwright.async_api import BrowserContext, Page, Route, expect

from activities.adapters.fake import fake_output
from tests.conftest import Stack, eventually
from tests.web.conftest import PRICED_MODEL, OpenPage, screenshot

SETTLED = re.compile(r"^(succeeded|failed|cancelled|superseded)$")


async def submit_through_page(
    page: Page, prompt: str, options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Type into the compose box as a user would; return the API's 202 body."""
    await page.fill("#prompt", prompt)
    if options is not None:
        advanced = page.locator("details.advanced")
        if await advanced.get_attribute("open") is None:
            await advanced.locator("summary").click()
        await page.fill("#options", json.dumps(options))
    async with page.expect_response(
        lambda r: r.url.endswith("/v1/prompts") and r.request.method == "POST"
    ) as answer:
        await page.click("#submit")
    response = await answer.value
    assert response.status == 202, await response.text()
    accepted: dict[str, Any] = await response.json()
    return accepted


def card(page: Page, prompt_id: str) -> Any:
    return page.locator(f'li.prompt[data-prompt-id="{prompt_id}"]')


async def saw(page: Page, prompt_id: str, state: str) -> None:
    """Wait until the card has shown `state`, however briefly."""
    await page.wait_for_function(
        "([id, state]) => (window.__seenStates[id] || []).includes(state)", arg=[prompt_id, state]
    )


async def seen_states(page: Page, prompt_id: str) -> list[str]:
    states: list[str] = await page.evaluate(f"window.__seenStates[{json.dumps(prompt_id)}] || []")
    return states


async def seen_outputs(page: Page, prompt_id: str) -> list[str]:
    """Every text the card's streamed output has shown, in order (since the page loaded)."""
    texts: list[str] = await page.evaluate(f"window.__seenOutputs[{json.dumps(prompt_id)}] || []")
    return texts


async def shows_part_of(page: Page, prompt_id: str, full: str, state: str = "running") -> str:
    """Wait until the card, its job in `state`, shows a non-empty proper prefix of `full`."""
    handle = await page.wait_for_function(
        """([id, full, state]) => {
          const item = document.querySelector(`li.prompt[data-prompt-id="${id}"]`);
          const output = item && item.querySelector(".output");
          if (!output || output.hidden || item.dataset.state !== state) return false;
          const text = output.textContent;
          return text && text.length < full.length && full.startsWith(text) ? text : false;
        }""",
        arg=[prompt_id, full, state],
    )
    text: str = await handle.json_value()
    return text


def assert_only_grew(seen: list[str], full: str) -> None:
    """Each text shown was a prefix of the answer and longer than the one before it: no
    piece shown twice, none skipped, no attempt's text glued to another's."""
    assert seen, "the card never showed streamed text"
    assert all(full.startswith(text) for text in seen), seen
    assert [len(text) for text in seen] == sorted({len(text) for text in seen}), seen


async def test_submitted_prompt_goes_queued_running_succeeded_without_reloading(
    web_stack: Stack, open_page: OpenPage
) -> None:
    page, errors = await open_page(f"/?key={web_stack.api_key}")
    # The key is taken once: stored for next time, gone from the address bar.
    await expect(page.locator("#connection")).to_have_attribute("data-mode", "live")
    assert "key=" not in page.url
    assert await page.evaluate("localStorage.getItem('promptjobs.apiKey')") == web_stack.api_key
    await page.evaluate("window.__sameDocument = true")

    accepted = await submit_through_page(
        page, "Write a haiku about queues", {"fake": {"latency_ms": 1500}}
    )
    item = card(page, accepted["prompt_id"])
    await saw(page, accepted["prompt_id"], "running")
    # What the user types while the job runs survives every update of the list.
    await page.fill("#prompt", "a draft in progress")
    await screenshot(page, "now-session-running")
    await expect(item).to_have_attribute("data-state", "succeeded")
    await expect(item.locator(".response")).to_have_text(fake_output("Write a haiku about queues"))

    assert await seen_states(page, accepted["prompt_id"]) == ["queued", "running", "succeeded"]
    assert await page.evaluate("window.__sameDocument") is True
    assert await page.input_value("#prompt") == "a draft in progress"
    assert await item.locator(".badge").first.inner_text() == "SUCCEEDED"
    await expect(item.locator("button.cancel")).to_be_hidden()
    # A succeeded job can be run again too, as the API allows.
    await expect(item.locator("button.retry")).to_be_visible()
    await screenshot(page, "now-session-succeeded")
    assert errors == []


async def test_the_answer_grows_live_on_the_card_then_becomes_the_response(
    web_stack: Stack, open_page: OpenPage
) -> None:
    page, errors = await open_page(f"/?key={web_stack.api_key}")
    prompt = "Explain slowly, word by word, why a durable queue keeps every job it accepts"
    full = fake_output(prompt)
    accepted = await submit_through_page(page, prompt, {"fake": {"latency_ms": 4000}})
    item = card(page, accepted["prompt_id"])

    first = await shows_part_of(page, accepted["prompt_id"], full)
    await expect(item.locator(".output")).to_have_class(re.compile(r"\bstreaming\b"))
    # It grows while the job still runs.
    await page.wait_for_function(
        "([id, n]) => (window.__seenOutputs[id] || []).some((t) => t.length > n)",
        arg=[accepted["prompt_id"], len(first)],
    )
    await screenshot(page, "now-session-streaming")

    await expect(item).to_have_attribute("data-state", "succeeded")
    await expect(item.locator(".response")).to_have_text(full)
    await expect(item.locator(".output")).to_be_hidden()
    assert_only_grew(await seen_outputs(page, accepted["prompt_id"]), full)
    assert errors == []


async def test_a_reload_mid_stream_shows_the_text_so_far_then_goes_on(
    web_stack: Stack, open_page: OpenPage
) -> None:
    page, errors = await open_page(f"/?key={web_stack.api_key}")
    # Offsets count characters as Python does: 🚀 is one, not JavaScript's two.
    prompt = "Reload me 🚀 in the middle of a long and winding answer about idempotent activities"
    full = fake_output(prompt)
    accepted = await submit_through_page(page, prompt, {"fake": {"latency_ms": 5000}})
    before = await shows_part_of(page, accepted["prompt_id"], full)

    await page.reload()

    # At once, what was streamed before the reload (read from the API), then the rest live.
    await shows_part_of(page, accepted["prompt_id"], full)
    await expect(page.locator("#connection")).to_have_attribute("data-mode", "live")
    item = card(page, accepted["prompt_id"])
    await expect(item).to_have_attribute("data-state", "succeeded")
    await expect(item.locator(".response")).to_have_text(full)
    seen = await seen_outputs(page, accepted["prompt_id"])
    assert len(seen[0]) >= len(before), seen
    assert_only_grew(seen, full)
    assert errors == []


async def test_a_retried_attempt_starts_its_text_over(
    web_stack: Stack, open_page: OpenPage
) -> None:
    """The first attempt streams half the answer and fails; the second starts over."""
    page, errors = await open_page(f"/?key={web_stack.api_key}")
    prompt = "Start over when the provider fails halfway through this sentence"
    full = fake_output(prompt)
    failing = {"fake": {"latency_ms": 1500, "fail": ["provider_5xx"]}}
    accepted = await submit_through_page(page, prompt, failing)
    item = card(page, accepted["prompt_id"])

    # While the retry waits, the card keeps what the failed attempt streamed.
    await shows_part_of(page, accepted["prompt_id"], full, state="queued")
    await expect(item.locator(".output")).to_have_class(re.compile(r"\bpartial\b"))
    await screenshot(page, "now-session-retry-waiting")
    await expect(item).to_have_attribute("data-state", "succeeded")
    await expect(item.locator(".response")).to_have_text(full)

    seen = await seen_outputs(page, accepted["prompt_id"])
    assert all(full.startswith(text) for text in seen), seen
    # The first attempt's half was dropped when the second began: the text got shorter once.
    shrank = [i for i in range(1, len(seen)) if len(seen[i]) < len(seen[i - 1])]
    assert len(shrank) == 1, seen
    assert_only_grew(seen[shrank[0] :], full)
    assert (await web_stack.job(accepted["job_id"]))["attempt"] == 2
    assert errors == []


async def test_a_cancelled_job_keeps_the_text_it_streamed(
    web_stack: Stack, open_page: OpenPage
) -> None:
    page, errors = await open_page(f"/?key={web_stack.api_key}")
    prompt = "Cancel me while I am still talking about workflows and their histories"
    full = fake_output(prompt)
    accepted = await submit_through_page(page, prompt, {"fake": {"latency_ms": 5000}})
    item = card(page, accepted["prompt_id"])
    before = await shows_part_of(page, accepted["prompt_id"], full)

    await item.locator("button.cancel").click()

    await expect(item).to_have_attribute("data-state", "cancelled")
    kept = await shows_part_of(page, accepted["prompt_id"], full, state="cancelled")
    assert len(kept) >= len(before)
    await expect(item.locator(".output")).to_have_class(re.compile(r"\bpartial\b"))
    await expect(item.locator(".response")).to_be_hidden()
    # The cut call's tokens are recorded just after the cancel (a job.usage event).
    job = await eventually(
        lambda: web_stack.job(accepted["job_id"]), lambda j: bool(j["output_tokens"])
    )
    await expect(item.locator(".usage")).to_have_text(
        f"{job['input_tokens']} in · {job['output_tokens']} out tokens · $0"
    )
    await screenshot(page, "now-session-cancelled-partial")
    # Still there after a reload: read from the API.
    await page.reload()
    await shows_part_of(page, accepted["prompt_id"], full, state="cancelled")
    assert errors == []


async def test_a_settled_job_shows_its_tokens_and_cost(
    web_stack: Stack, open_page: OpenPage
) -> None:
    page, errors = await open_page(f"/?key={web_stack.api_key}")
    priced = await submit_through_page(page, "what does this cost", {"model": PRICED_MODEL})
    unpriced = await submit_through_page(page, "and this one", {"model": "unpriced-1"})

    for accepted in (priced, unpriced):
        await expect(card(page, accepted["prompt_id"])).to_have_attribute("data-state", "succeeded")
    job = await web_stack.job(priced["job_id"])
    assert job["input_tokens"] > 0 and job["output_tokens"] > 0 and job["cost_usd"] > 0
    await expect(card(page, priced["prompt_id"]).locator(".usage")).to_have_text(
        f"{job['input_tokens']} in · {job['output_tokens']} out tokens · ${job['cost_usd']:.6f}"
    )
    job = await web_stack.job(unpriced["job_id"])
    assert job["cost_usd"] is None
    await expect(card(page, unpriced["prompt_id"]).locator(".usage")).to_have_text(
        f"{job['input_tokens']} in · {job['output_tokens']} out tokens · cost unknown"
    )
    await screenshot(page, "now-session-usage")
    assert errors == []


async def test_closing_the_tab_does_not_stop_the_job(web_stack: Stack, open_page: OpenPage) -> None:
    page, _ = await open_page(f"/?key={web_stack.api_key}")
    accepted = await submit_through_page(page, "survive the tab", {"fake": {"latency_ms": 5000}})
    # Closed while its attempt runs, as the API says (a loaded machine may start it late, and
    # the page's own view of it is not the point here).
    await eventually(
        lambda: web_stack.job(accepted["job_id"]), lambda j: j["state"] == "running", timeout=60
    )
    await page.close()

    job = await web_stack.settled(accepted["job_id"], timeout=60)
    assert job["state"] == "succeeded"

    # Reopened without ?key=: the key is remembered, the list is read from the API.
    reopened, errors = await open_page("/")
    item = card(reopened, accepted["prompt_id"])
    await expect(item).to_have_attribute("data-state", "succeeded")
    await expect(item.locator(".response")).to_have_text(fake_output("survive the tab"))
    assert errors == []


async def test_existing_prompts_are_listed_in_submission_order_not_completion_order(
    web_stack: Stack, open_page: OpenPage
) -> None:
    slow = await web_stack.submit(
        "submitted first, finishes last", options={"fake": {"latency_ms": 800}}
    )
    fast = await web_stack.submit("submitted second, finishes first")
    await web_stack.settled(fast["job_id"])
    await web_stack.settled(slow["job_id"])

    page, errors = await open_page(f"/?key={web_stack.api_key}")
    await expect(page.locator("li.prompt")).to_have_count(2)
    order = await page.locator("li.prompt").evaluate_all(
        "cards => cards.map(c => c.dataset.promptId)"
    )

    assert order == [fast["prompt_id"], slow["prompt_id"]]
    assert errors == []


async def test_failed_prompt_shows_failed_and_retry_runs_a_new_job(
    web_stack: Stack, open_page: OpenPage
) -> None:
    page, errors = await open_page(f"/?key={web_stack.api_key}")
    accepted = await submit_through_page(page, "bad credentials", {"fake": {"fail": ["auth"]}})
    item = card(page, accepted["prompt_id"])
    await expect(item).to_have_attribute("data-state", "failed")
    await expect(item.locator(".error-line")).to_contain_text("auth")
    await expect(item.locator("button.retry")).to_be_visible()
    await screenshot(page, "now-session-failed")

    await item.locator("button.retry").click()

    # The retry is a new job of the same prompt; the card follows it, the old one is history.
    await expect(item).not_to_have_attribute("data-job-id", accepted["job_id"])
    retried_id = await item.get_attribute("data-job-id")
    assert retried_id is not None
    # The fake adapter fails per attempt and a retried job starts again at attempt 1 with the
    # prompt's same options: this job also ends failed — which shows the retry really ran.
    await expect(item).to_have_attribute("data-state", "failed")
    history = item.locator(".history")
    await expect(history.locator(f'[data-job-id="{accepted["job_id"]}"]')).to_have_attribute(
        "data-state", "superseded"
    )
    await expect(history.locator(f'[data-job-id="{retried_id}"]')).to_have_attribute(
        "data-state", "failed"
    )
    old = await web_stack.job(accepted["job_id"])
    assert old["state"] == "superseded" and old["superseded_by"] == retried_id
    assert (await web_stack.job(retried_id))["supersedes"] == accepted["job_id"]
    await history.locator("summary").click()
    await screenshot(page, "now-session-failed-retried")
    assert errors == []


async def test_retry_with_other_options_from_the_page_runs_them(
    web_stack: Stack, open_page: OpenPage
) -> None:
    page, errors = await open_page(f"/?key={web_stack.api_key}")
    failing = {"fake": {"fail": ["auth"]}}
    accepted = await submit_through_page(page, "weak model", failing)
    item = card(page, accepted["prompt_id"])
    await expect(item).to_have_attribute("data-state", "failed")

    await item.locator("button.retry-with").click()
    form = item.locator("form.retry-form")
    await expect(form).to_be_visible()
    # Prefilled with what the failed job ran with.
    assert json.loads(await form.locator(".retry-options").input_value()) == failing
    await expect(form.locator(".retry-priority")).to_have_value("50")
    await expect(form.locator(".retry-max-attempts")).to_have_value("3")

    # A value the API refuses is shown in the form, and nothing is retried.
    await form.locator(".retry-priority").fill("101")
    await form.locator("button.retry-run").click()
    await expect(form.locator(".retry-error")).to_contain_text("priority")
    assert (await web_stack.job(accepted["job_id"]))["state"] == "failed"

    healthy = {"fake": {"latency_ms": 10}}
    await form.locator(".retry-options").fill(json.dumps(healthy))
    await form.locator(".retry-priority").fill("5")
    await form.locator(".retry-max-attempts").fill("1")
    await screenshot(page, "now-session-retry-with")
    await form.locator("button.retry-run").click()

    await expect(form).to_be_hidden()
    await expect(item).not_to_have_attribute("data-job-id", accepted["job_id"])
    await expect(item).to_have_attribute("data-state", "succeeded")
    await expect(item.locator(".response")).to_have_text(fake_output("weak model"))
    retried = await web_stack.job(str(await item.get_attribute("data-job-id")))
    assert (retried["options"], retried["priority"], retried["max_attempts"]) == (healthy, 5, 1)
    # The history says which options each job ran with.
    history = item.locator(".history")
    await history.locator("summary").click()
    await expect(history.locator(".job-options")).to_have_text(
        [json.dumps(failing, separators=(",", ":")), json.dumps(healthy, separators=(",", ":"))]
    )
    assert errors == []


async def cancel_running_job(page: Page) -> tuple[dict[str, Any], Any]:
    accepted = await submit_through_page(page, "changed my mind", {"fake": {"latency_ms": 3000}})
    item = card(page, accepted["prompt_id"])
    await expect(item).to_have_attribute("data-state", "running")
    await item.locator("button.cancel").click()
    await expect(item).to_have_attribute("data-state", SETTLED)
    return accepted, item


async def test_cancelling_a_running_job_then_retrying_it_succeeds(
    web_stack: Stack, open_page: OpenPage
) -> None:
    page, errors = await open_page(f"/?key={web_stack.api_key}")
    accepted, item = await cancel_running_job(page)
    assert await item.get_attribute("data-state") == "cancelled"
    await expect(item.locator("button.retry")).to_be_visible()
    await expect(item.locator("button.cancel")).to_be_hidden()

    await item.locator("button.retry").click()

    await expect(item).not_to_have_attribute("data-job-id", accepted["job_id"])
    await expect(item).to_have_attribute("data-state", "succeeded")
    await expect(item.locator(".response")).to_have_text(fake_output("changed my mind"))
    old = await web_stack.job(accepted["job_id"])
    assert old["state"] == "superseded"
    assert old["superseded_by"] == await item.get_attribute("data-job-id")
    assert errors == []


async def test_a_job_waiting_for_temporal_can_be_cancelled_and_retried(
    stack_without_temporal: Stack, open_page_without_temporal: OpenPage
) -> None:
    """Temporal is down: the job waits queued; the user cancels it and asks again."""
    page, errors = await open_page_without_temporal(f"/?key={stack_without_temporal.api_key}")
    accepted = await submit_through_page(page, "Temporal is down")
    item = card(page, accepted["prompt_id"])
    await expect(item).to_have_attribute("data-state", "queued")
    await expect(item.locator(".head .detail")).to_have_text("waiting for a worker")
    await screenshot(page, "now-session-queued")

    await item.locator("button.cancel").click()
    await expect(item).to_have_attribute("data-state", "cancelled")
    await screenshot(page, "now-session-cancelled")
    await item.locator("button.retry").click()

    await expect(item).not_to_have_attribute("data-job-id", accepted["job_id"])
    await expect(item).to_have_attribute("data-state", "queued")
    await expect(item.locator(f'.history [data-job-id="{accepted["job_id"]}"]')).to_have_attribute(
        "data-state", "superseded"
    )
    assert await seen_states(page, accepted["prompt_id"]) == ["queued", "cancelled", "queued"]
    await item.locator(".history summary").click()
    await screenshot(page, "now-session-cancelled-retried")
    assert errors == []


async def test_page_falls_back_to_polling_when_sse_is_blocked(
    web_stack: Stack, browser_context: BrowserContext, open_page: OpenPage
) -> None:
    streams: list[str] = []
    polls: list[str] = []

    async def block(route: Route) -> None:
        streams.append(route.request.url)
        await route.abort()

    await browser_context.route("**/v1/events?*", block)
    page, errors = await open_page(f"/?key={web_stack.api_key}")
    page.on("request", lambda r: polls.append(r.url) if "/v1/jobs?since=" in r.url else None)
    reads: list[str] = []
    page.on("request", lambda r: reads.append(r.url) if "/output?since=" in r.url else None)
    await expect(page.locator("#connection")).not_to_have_attribute("data-mode", "connecting")

    prompt = "no live stream, so the text arrives by polling its output"
    full = fake_output(prompt)
    accepted = await submit_through_page(page, prompt, {"fake": {"latency_ms": 4000}})
    item = card(page, accepted["prompt_id"])
    await shows_part_of(page, accepted["prompt_id"], full)
    await expect(item).to_have_attribute("data-state", "succeeded")
    await expect(item.locator(".response")).to_have_text(full)

    assert await seen_states(page, accepted["prompt_id"]) == ["queued", "running", "succeeded"]
    assert "polling" in await page.evaluate("window.__seenModes")
    assert "live" not in await page.evaluate("window.__seenModes")
    assert streams, "the page never tried SSE"
    assert polls, "the page never polled"
    # The text is read on from where the page's copy ends, never again from the start.
    assert any(not url.endswith("since=0") for url in reads), reads
    assert_only_grew(await seen_outputs(page, accepted["prompt_id"]), full)
    # Nothing in flight: the page stops polling rather than poll forever.
    await expect(page.locator("#connection")).to_have_attribute("data-mode", "idle")
    await screenshot(page, "now-session-polling")
    assert errors == []


async def test_older_prompts_load_on_demand(
    stack_without_temporal: Stack, open_page_without_temporal: OpenPage
) -> None:
    submitted = [await stack_without_temporal.submit(f"prompt {i}") for i in range(52)]

    page, errors = await open_page_without_temporal(f"/?key={stack_without_temporal.api_key}")
    cards = page.locator("li.prompt")
    await expect(cards).to_have_count(50)
    await page.click("#older")
    await expect(cards).to_have_count(52)
    await expect(page.locator("#older")).to_be_hidden()

    order = await cards.evaluate_all("cards => cards.map(c => c.dataset.promptId)")
    assert order == [accepted["prompt_id"] for accepted in reversed(submitted)]
    assert errors == []
