"""``examples/web_chat`` in a real browser: the gateway serves the page (``--static``) and
its routes under uvicorn, a worker runs the turn on the real broker, and Debian's Chromium
signs in with a key, types a question and watches the answer stream in through its own
``EventSource``: the first words while the turn still runs, the tool call as it happens,
then the result."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from playwright.async_api import Page, expect

from pyrula_stream import AgentContext, ToolContext, kafka_agent, tool
from pyrula_stream.access.api_keys import APIKeyAuth
from pyrula_stream.gateway import AppOptions, create_app
from pyrula_stream.gateway.serve import running_gateway
from pyrula_stream.llm import FakeLLM, TextDelta, reply_tool_calls
from pyrula_stream.llm.base import StreamItem, ToolDefinition
from pyrula_stream.llm.fake import count_model_calls
from pyrula_stream.testing import running_worker, unique_name
from tests.browsers import WAIT_MS
from tests.mcp_servers.processes import ROOT

KEY = "web-chat-key-0123456789abcdef0123456789"


@tool(read_only=True)
async def track_parcel(ctx: ToolContext, parcel: str) -> dict[str, Any]:
    """Where a parcel is."""
    return {"parcel": parcel, "status": "out for delivery"}


class HeldModel(FakeLLM):
    """Asks for the tool, then streams the answer's first words and holds the rest until
    the test has seen them in the page (a provider mid-answer)."""

    def __init__(self, hold: asyncio.Event) -> None:
        super().__init__(
            [
                reply_tool_calls(("track_parcel", {"parcel": "P-7"}), text="Let me look."),
                "Parcel P-7 is out for delivery and arrives today.",
            ],
            chunk_chars=12,
        )
        self.hold = hold

    async def stream(
        self,
        messages: list[dict[str, Any]],
        tools: list[ToolDefinition] | None = None,
        system: str | None = None,
    ) -> AsyncIterator[StreamItem]:
        answering = count_model_calls(messages) == 1
        async for item in super().stream(messages, tools, system):
            yield item
            if answering and isinstance(item, TextDelta):
                answering = False
                await asyncio.sleep(0.06)  # deltas flush 50 ms apart: this one goes out now
                yield TextDelta("")
                await self.hold.wait()


async def test_the_web_chat_streams_an_answer_in_chromium(
    kafka_bootstrap_servers: str, page: Page
) -> None:
    hold = asyncio.Event()

    @kafka_agent(
        name=unique_name("webchat"), llm=HeldModel(hold), tools=[track_parcel], partitions=1
    )
    async def parcels(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}])

    app = create_app(
        agents=[parcels],
        options=AppOptions(
            bootstrap_servers=kafka_bootstrap_servers,
            auth=APIKeyAuth({"web": KEY}),
            static_dir=f"{ROOT}/examples/web_chat",
        ),
    )
    async with running_worker(parcels, kafka_bootstrap_servers), running_gateway(app) as url:
        await page.goto(url + "/")
        await page.fill("input[name=key]", KEY)  # the gateway's sign-in form
        await page.press("input[name=key]", "Enter")
        await expect(page.locator("#state")).to_have_text("ready", timeout=WAIT_MS)
        await expect(page.locator("#agent")).to_have_value(parcels.name)
        await page.fill("textarea[name=question]", "Where is parcel P-7?")
        await page.click("#send")

        answer = page.locator("#answer")
        await expect(answer).to_contain_text("Parcel P-7", timeout=WAIT_MS)
        await expect(page.locator("#turn-state")).to_have_text("running")
        await expect(answer).not_to_contain_text("arrives today")  # the rest is held
        await expect(page.locator("#tools")).to_contain_text('track_parcel({"parcel":"P-7"})')
        await expect(page.locator("#tools")).to_contain_text("→ ok")
        hold.set()

        await expect(page.locator("#turn-state")).to_have_text("completed", timeout=WAIT_MS)
        await expect(answer).to_contain_text("arrives today")
        await expect(page.locator("#result")).to_have_text(
            "Parcel P-7 is out for delivery and arrives today."
        )
