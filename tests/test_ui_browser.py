"""``pyrula-stream ui`` in a real browser: a worker runs turns on a real broker, the UI
follows them, and Debian's Chromium (driven by Playwright) shows what a user would see.

The browser is the system's Chromium (``make browser`` installs it); Playwright never
downloads one. Without it these tests fail and say how to install it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from pyrula_stream import AgentContext, KafkaAgentClient, ToolContext, kafka_agent, tool
from pyrula_stream.kafka.io import RecordProducer
from pyrula_stream.llm import FakeLLM, TextDelta, reply_tool_calls
from pyrula_stream.llm.base import StreamItem, ToolDefinition
from pyrula_stream.llm.fake import count_model_calls
from pyrula_stream.testing import running_worker, unique_name
from pyrula_stream.ui.feed import FeedOptions
from pyrula_stream.ui.server import UIOptions, running_ui

DOCS_SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "ui-turn.png"
"""Rewritten only with PYRULA_UPDATE_SCREENSHOT=1, so a test run leaves the tree clean."""
WAIT_MS = 60_000  # generous: the machine running the suite may be busy


def system_chromium() -> str:
    """The system's Chromium: ``PYRULA_CHROMIUM``, else ``chromium`` on the PATH."""
    chosen = os.environ.get("PYRULA_CHROMIUM")
    for candidate in [chosen] if chosen else ["chromium", "chromium-browser"]:
        path = shutil.which(candidate)
        if path:
            return path
    pytest.fail(
        "the UI browser test needs Chromium and found none: run `make browser` "
        "(as root it runs `apt-get install chromium`), or set PYRULA_CHROMIUM=/path/to/chromium"
    )


@pytest.fixture(scope="session")
async def browser() -> AsyncIterator[Browser]:
    """One headless Chromium for the session, started only when a UI test asks for it."""
    executable = system_chromium()
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=executable, headless=True)
        yield launched
        await launched.close()


@pytest.fixture
async def page(browser: Browser) -> AsyncIterator[Page]:
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    yield await context.new_page()
    await context.close()


class StreamingModel(FakeLLM):
    """A scripted model whose second call streams its first words, then holds the rest
    until the test releases it, like a provider mid-answer."""

    def __init__(self, hold: asyncio.Event) -> None:
        super().__init__(
            [
                reply_tool_calls(("lookup_order", {"order_id": "9"}), text="Let me check order 9."),
                "Order 9 has shipped. It arrives on Wednesday.",
            ],
            chunk_chars=20,
        )
        self.hold = hold

    async def stream(
        self,
        messages: list[dict[str, Any]],
        tools: list[ToolDefinition] | None = None,
        system: str | None = None,
    ) -> AsyncIterator[StreamItem]:
        first_delta = count_model_calls(messages) == 1
        async for item in super().stream(messages, tools, system):
            yield item
            if first_delta and isinstance(item, TextDelta):
                first_delta = False
                # Deltas are flushed when an item arrives 50 ms after the last flush; the
                # pause only makes sure that much time passed, the empty delta flushes.
                await asyncio.sleep(0.06)
                yield TextDelta("")
                await self.hold.wait()


async def test_ui_shows_live_turns_timelines_failures_and_dead_letters(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, page: Page, tmp_path: Path
) -> None:
    tmp_shot = tmp_path / "ui-turn.png"
    tool_may_finish = asyncio.Event()
    model_may_finish = asyncio.Event()

    @tool(read_only=True)
    async def lookup_order(ctx: ToolContext, order_id: str) -> dict[str, str]:
        """Look up an order."""
        await tool_may_finish.wait()
        return {"order_id": order_id, "status": "shipped", "eta": "Wednesday"}

    @kafka_agent(
        name=unique_name("support"),
        llm=StreamingModel(model_may_finish),
        tools=[lookup_order],
        partitions=1,
    )
    async def agent(ctx: AgentContext, question: str) -> str:
        if question.startswith("refund"):
            raise LookupError("order 7 is not in the orders database")
        return await ctx.llm.run([{"role": "user", "content": question}], system="Be brief.")

    feed = FeedOptions(kafka_bootstrap_servers, agents=(agent.name,))
    async with (
        running_worker(agent, kafka_bootstrap_servers),
        running_ui(feed, UIOptions(port=0)) as url,
    ):
        handle = await client.submit(agent.name, question="Where is order 9?")
        await page.goto(url)

        # The running turn appears in the list, live, without a reload.
        row = page.locator(f'[data-testid="turn-row"][data-turn-id="{handle.turn_id}"]')
        await expect(row).to_be_visible(timeout=WAIT_MS)
        await expect(row.get_by_test_id("status")).to_have_text("running", timeout=WAIT_MS)

        # Its timeline: the first model call's streamed text, then the tool call running.
        await row.get_by_role("link").click()
        steps = page.get_by_test_id("step")
        await expect(steps.nth(0)).to_contain_text("Model call 1", timeout=WAIT_MS)
        await expect(steps.nth(0).get_by_test_id("model-text")).to_have_text(
            "Let me check order 9."
        )
        await expect(steps.nth(1)).to_contain_text("lookup_order", timeout=WAIT_MS)
        await expect(steps.nth(1)).to_contain_text('"order_id": "9"')
        await expect(steps.nth(1)).to_contain_text("running")
        # Without --allow-actions the page offers no action and the server refuses one.
        await expect(page.get_by_role("button", name="Terminate")).to_have_count(0)
        refused = await page.request.post(
            f"{url}/api/turns/{agent.name}/{handle.turn_id}/terminate",
            headers={"x-pyrula-action": "terminate"},
        )
        assert refused.status == 403
        assert "--allow-actions" in (await refused.json())["error"]

        # The second model call's text shows while the model is still streaming it.
        tool_may_finish.set()
        await expect(steps.nth(1)).to_contain_text('"eta": "Wednesday"', timeout=WAIT_MS)
        second = steps.nth(2)
        await expect(second).to_contain_text("Model call 2", timeout=WAIT_MS)
        await expect(second.get_by_test_id("model-text")).to_contain_text(
            "Order 9 has shipped.", timeout=WAIT_MS
        )
        await expect(second).to_contain_text("running")
        await expect(second.get_by_test_id("model-text")).not_to_contain_text("Wednesday")

        model_may_finish.set()
        outcome = page.get_by_test_id("outcome")
        await expect(outcome).to_contain_text("Completed", timeout=WAIT_MS)
        await expect(outcome).to_contain_text("Order 9 has shipped. It arrives on Wednesday.")
        await expect(steps).to_have_count(3)
        await expect(page.get_by_test_id("status").first).to_have_text("completed")
        shot = DOCS_SCREENSHOT if os.environ.get("PYRULA_UPDATE_SCREENSHOT") else tmp_shot
        await page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000, "the timeline rendered"

        # A failed turn shows its error code and message.
        failed = await client.run(agent.name, question="refund order 7", timeout=120)
        assert failed[-1].type == "run:error"
        await page.goto(f"{url}/#/turn/{agent.name}/{failed[0].turn_id}")
        await expect(page.get_by_test_id("error-code")).to_have_text("agent_error", timeout=WAIT_MS)
        await expect(page.get_by_test_id("outcome")).to_contain_text(
            "order 7 is not in the orders database"
        )
        await page.goto(url)
        failed_row = page.locator(f'[data-testid="turn-row"][data-turn-id="{failed[0].turn_id}"]')
        await expect(failed_row).to_contain_text("agent_error", timeout=WAIT_MS)
        rows = page.get_by_test_id("turn-row")
        await page.get_by_label("status").select_option("failed")
        await expect(rows).to_have_count(1)
        await expect(rows).to_have_attribute("data-turn-id", failed[0].turn_id)
        await page.get_by_label("status").select_option("")
        await page.get_by_label("turn id").fill(handle.turn_id[:8])
        await expect(rows).to_have_count(1)
        await expect(rows).to_have_attribute("data-turn-id", handle.turn_id)

        # A record the worker cannot decode shows on the DLQ page with its reason.
        producer = RecordProducer(kafka_bootstrap_servers)
        try:
            await producer.send(
                agent.topics.turns, b"bad-1", b"\x00\x01garbage", [("origin", b"ui-test")]
            )
        finally:
            producer.close()
        await page.goto(f"{url}/#/dlq")
        letter = page.get_by_test_id("dead-letter")
        await expect(letter.get_by_test_id("reason")).to_contain_text(
            "does not decode as turn_request.avsc", timeout=WAIT_MS
        )
        await expect(letter).to_contain_text("invalid_request")
        await expect(letter).to_contain_text(f"{agent.topics.turns}[0]@")
        await expect(letter).to_contain_text("ui-test")  # the original header


async def test_ui_with_allow_actions_terminates_a_running_turn(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, page: Page
) -> None:
    never = asyncio.Event()

    @tool(read_only=True)
    async def wait_forever(ctx: ToolContext) -> str:
        """Waits until the turn is stopped."""
        await never.wait()
        return "unreachable"

    @kafka_agent(
        name=unique_name("stuck"),
        llm=FakeLLM([reply_tool_calls(("wait_forever", {})), "done"]),
        tools=[wait_forever],
        partitions=1,
    )
    async def agent(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}])

    feed = FeedOptions(kafka_bootstrap_servers, agents=(agent.name,))
    async with (
        running_worker(agent, kafka_bootstrap_servers),
        running_ui(feed, UIOptions(port=0, allow_actions=True)) as url,
    ):
        handle = await client.submit(agent.name, question="hold on")
        await page.goto(f"{url}/#/turn/{agent.name}/{handle.turn_id}")
        await expect(page.get_by_test_id("step").nth(1)).to_contain_text(
            "wait_forever", timeout=WAIT_MS
        )
        page.once("dialog", lambda dialog: dialog.accept())
        await page.get_by_role("button", name="Terminate").click()
        await expect(page.get_by_test_id("error-code")).to_have_text("cancelled", timeout=WAIT_MS)
        await expect(page.get_by_test_id("status").first).to_have_text("cancelled")
        await expect(page.get_by_role("button", name="Terminate")).to_have_count(0)
