"""Fixtures of the browser tests: one headless Chromium per session, a page per test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page, Route


@pytest.fixture(scope="package")
async def browser() -> AsyncIterator[Browser]:
    """One headless Chromium for the session (the UI's and the web chat's tests), started
    only when a browser test asks for it."""
    from playwright.async_api import async_playwright

    from tests.browsers import system_chromium

    executable = system_chromium()
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=executable, headless=True)
        yield launched
        await launched.close()


@pytest.fixture
async def page(browser: Browser) -> AsyncIterator[Page]:
    """A page that may load only from this machine: the pages must work offline, so a
    request anywhere else (a CDN, a font service) is refused and fails the test."""
    from urllib.parse import urlsplit

    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    elsewhere: list[str] = []

    async def only_local(route: Route) -> None:
        host = urlsplit(route.request.url).hostname
        if host in ("127.0.0.1", "localhost", "::1"):
            await route.continue_()
        else:
            elsewhere.append(route.request.url)
            await route.abort()

    await context.route("**/*", only_local)
    yield await context.new_page()
    await context.close()
    assert not elsewhere, f"the page loaded from outside this machine: {elsewhere}"
