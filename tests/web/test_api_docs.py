"""The API's documentation pages work with no internet: Swagger UI at /docs and ReDoc at /redoc
list the operations, with every script and style served by the API itself."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest
from playwright.async_api import Browser, Route, expect

from tests.conftest import Stack


@pytest.mark.parametrize(
    ("path", "operation"),
    [("/docs", ".opblock-summary-path"), ("/redoc", "[data-section-id^='operation/']")],
)
async def test_the_api_docs_list_the_operations_offline(
    browser: Browser, web_stack: Stack, path: str, operation: str
) -> None:
    api = urlparse(web_stack.base_url).netloc
    elsewhere: list[str] = []

    async def offline(route: Route) -> None:
        if urlparse(route.request.url).netloc == api:
            await route.continue_()
        else:  # as on a machine with no internet: nothing else answers
            elsewhere.append(route.request.url)
            await route.abort()

    context = await browser.new_context(base_url=web_stack.base_url)
    context.set_default_timeout(20_000)
    try:
        await context.route("**/*", offline)
        page = await context.new_page()
        await page.goto(path)
        await expect(page.locator(operation).first).to_be_visible()
        assert await page.locator(operation).count() >= 10
        assert "/v1/prompts" in (await page.content())
    finally:
        await context.close()
    # Nothing but ReDoc's "powered by" badge, an image, is asked of another host.
    assert [url for url in elsewhere if not url.endswith("/redoc/logo-mini.svg")] == []
