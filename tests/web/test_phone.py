"""The Now Session on a phone (390 px wide, as an iPhone 12 to 15): nothing overflows sideways,
whatever the card holds, and a chain's child says whose answer it waits for."""

from __future__ import annotations

from playwright.async_api import Browser, Page, expect

from tests.conftest import Stack
from tests.web.conftest import RECORD_SEEN, screenshot
from tests.web.test_now_session import card, submit_through_page

PHONE = {"width": 390, "height": 844}


async def overflow(page: Page) -> int:
    """How far the page reaches past the screen's width, in CSS pixels."""
    width: int = await page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    return width


async def test_the_page_fits_a_phone_and_a_chain_child_names_its_parent(
    browser: Browser, web_stack: Stack
) -> None:
    context = await browser.new_context(
        base_url=web_stack.base_url, viewport=PHONE, is_mobile=True, has_touch=True
    )
    context.set_default_timeout(20_000)
    await context.add_init_script(RECORD_SEEN)
    try:
        page = await context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        await page.goto(f"/?key={web_stack.api_key}")
        await expect(page.locator("#connection")).to_have_attribute("data-mode", "live")

        # A long unbroken word, and a job that fails so that its retry buttons show.
        long_word = "supercalifragilistic" * 8
        failing = await submit_through_page(
            page, f"A prompt with {long_word} in it", {"fake": {"fail": ["auth"]}}
        )
        await expect(card(page, failing["prompt_id"])).to_have_attribute("data-state", "failed")
        await card(page, failing["prompt_id"]).locator("button.retry-with").click()
        await expect(card(page, failing["prompt_id"]).locator(".retry-form")).to_be_visible()

        # A chain child of a parent that runs for a while: it waits, naming the parent.
        parent = await submit_through_page(
            page, "List three risks of queues", {"fake": {"latency_ms": 6000}}
        )
        child = await web_stack.http.post(
            "/v1/prompts",
            json={"prompt": "Rank these: {{after[0]}}", "after": [parent["prompt_id"]]},
        )
        assert child.status_code == 202, child.text
        child_card = card(page, child.json()["prompt_id"])
        await expect(child_card).to_have_attribute("data-state", "queued")
        await expect(child_card.locator(".text")).to_have_text(
            "Rank these: [the answer of “List three risks of queues”]"
        )
        await expect(child_card.locator(".head .detail")).to_have_text(
            "waiting for “List three risks of queues”"
        )

        await screenshot(page, "now-session-phone")
        assert await overflow(page) <= 0
        assert errors == []
    finally:
        await context.close()
