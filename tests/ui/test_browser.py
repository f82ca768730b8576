"""``pyrula-stream ui`` in a real browser: a worker runs turns on a real broker, the UI
follows them, and Debian's Chromium (driven by Playwright) shows what a user would see.

The browser is the system's Chromium (``make browser`` installs it); Playwright never
downloads one. Without it these tests fail and say how to install it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page, expect

from pyrula_stream import (
    AgentContext,
    AgentLimits,
    Event,
    KafkaAgentClient,
    ToolCallRejected,
    ToolContext,
    WorkerOptions,
    kafka_agent,
    tool,
)
from pyrula_stream.access.api_keys import APIKeyAuth
from pyrula_stream.access.http_guard import HTTPAccess
from pyrula_stream.comparison.scores import scores_topic
from pyrula_stream.errors import SubAgentError
from pyrula_stream.kafka.io import RecordProducer
from pyrula_stream.llm import (
    FakeLLM,
    ModelResponse,
    TextDelta,
    reply_text,
    reply_tool_call,
    reply_tool_calls,
)
from pyrula_stream.llm.base import StreamItem, ToolDefinition
from pyrula_stream.llm.fake import count_model_calls
from pyrula_stream.testing import running_worker, unique_name, wait_for
from pyrula_stream.ui.feed import FeedOptions
from pyrula_stream.ui.server import UIOptions, running_ui
from pyrula_stream.wire.scores import Score, score_record
from tests.browsers import WAIT_MS, system_chromium

DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "ui-turn.png"
"""Rewritten only with PYRULA_UPDATE_SCREENSHOT=1, so a test run leaves the tree clean."""


def test_without_chromium_the_browser_tests_fail_and_say_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYRULA_CHROMIUM", "/nonexistent/chromium")
    with pytest.raises(pytest.fail.Exception, match="run `make browser`"):
        system_chromium()


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

    lookups: list[str] = []

    @tool(read_only=True, retry=1)
    async def lookup_order(ctx: ToolContext, order_id: str) -> dict[str, str]:
        """Look up an order."""
        await tool_may_finish.wait()
        lookups.append(order_id)
        if len(lookups) == 1:  # the first try fails; the retry succeeds
            raise ConnectionError("the orders database timed out")
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
    scores = scores_topic(agent.name)  # the worker makes it with the agent's other topics
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
        await expect(steps.nth(1)).to_contain_text("result · 2 attempts")  # the retry shows
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
        # The list's columns, for the turn with a tool call.
        header = [h.strip() for h in await page.locator("table.turns th").all_text_contents()]
        assert header == [
            "status", "turn", "agent", "thread", "attempt", "started", "duration",
            "model calls", "tool calls", "tokens", "cost",
        ]  # fmt: skip
        cells = await row.locator("td").all_text_contents()
        assert [cells[4], cells[7], cells[8]] == ["1", "2", "1"]  # attempt, model/tool calls
        assert cells[6].endswith(("ms", "s")) and int(cells[9].replace(",", "")) > 0
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
            # Something that is not an event on the events topic: counted, not fatal.
            await producer.send(agent.topics.events, b"odd", b"\x00\x01garbage", [])
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
        await page.goto(url)
        await expect(page.get_by_test_id("skipped")).to_have_text(
            "1 event could not be shown (see the UI's log)", timeout=WAIT_MS
        )
        await expect(page.get_by_test_id("turn-row")).to_have_count(2)

        # Evaluators' scores: on the scored turn's page, and per version on Evaluation.
        producer = RecordProducer(kafka_bootstrap_servers)
        try:
            for turn_id, passed in ((handle.turn_id, True), (failed[0].turn_id, False)):
                why = "answered" if passed else "failed"
                out = score_record(
                    scores, Score(turn_id, agent.name, "answered", passed=passed, reason=why)
                )
                await producer.send(out.topic, out.key, out.value, list(out.headers))
        finally:
            producer.close()
        await page.goto(f"{url}/#/turn/{agent.name}/{handle.turn_id}")
        score = page.get_by_test_id("score")
        await expect(score).to_contain_text("answered", timeout=WAIT_MS)
        await expect(score).to_contain_text("pass")
        await page.goto(f"{url}/#/evals")
        await expect(page.get_by_test_id("eval-version")).to_contain_text("50.0%", timeout=WAIT_MS)


async def test_ui_with_allow_actions_cancels_and_terminates_running_turns(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, page: Page
) -> None:
    never = asyncio.Event()

    @tool(read_only=True)
    async def wait_forever(ctx: ToolContext) -> str:
        """Waits until the turn is stopped."""
        await never.wait()
        return "unreachable"

    @tool(read_only=True)
    async def tick(ctx: ToolContext) -> str:
        """One more round: the model asks for it again and again."""
        await asyncio.sleep(0.5)  # a few renders a second: a busy browser still keeps up
        return "tock"

    def script(messages: list[dict[str, Any]], tools: list[ToolDefinition]) -> ModelResponse:
        if messages[0]["content"] == "loop":  # runs until cancelled, one step at a time
            return reply_tool_call("tick")
        first = count_model_calls(messages) == 0
        return reply_tool_call("wait_forever") if first else reply_text("done")

    @kafka_agent(
        name=unique_name("stuck"),
        llm=FakeLLM(script),
        tools=[wait_forever, tick],
        partitions=1,
        # The loop must still run when the click lands on a busy machine, not end on the
        # default 50 model calls (budget_exceeded) first.
        limits=AgentLimits(max_llm_calls=1_000),
    )
    async def agent(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}])

    feed = FeedOptions(kafka_bootstrap_servers, agents=(agent.name,))
    async with (
        running_worker(agent, kafka_bootstrap_servers),
        running_ui(feed, UIOptions(port=0, allow_actions=True)) as url,
    ):
        # Cancel: the turn stops at its next step, with the reason the UI gave.
        looping = await client.submit(agent.name, question="loop")
        await page.goto(f"{url}/#/turn/{agent.name}/{looping.turn_id}")
        await expect(page.get_by_test_id("step").nth(1)).to_contain_text("tick", timeout=WAIT_MS)
        page.once("dialog", lambda dialog: dialog.accept())
        await page.get_by_role("button", name="Cancel").click()
        await expect(page.get_by_test_id("error-code")).to_have_text("cancelled", timeout=WAIT_MS)
        await expect(page.get_by_test_id("outcome")).to_contain_text("from pyrula-stream ui")
        await expect(page.get_by_role("button", name="Cancel")).to_have_count(0)

        handle = await client.submit(agent.name, question="hold on")
        await page.goto(f"{url}/#/turn/{agent.name}/{handle.turn_id}")
        await expect(page.get_by_test_id("step").nth(1)).to_contain_text(
            "wait_forever", timeout=WAIT_MS
        )
        # A cross-site form cannot set the action header, so the server wants it.
        forged = await page.request.post(f"{url}/api/turns/{agent.name}/{handle.turn_id}/terminate")
        assert forged.status == 400
        assert "x-pyrula-action" in (await forged.json())["error"]
        page.once("dialog", lambda dialog: dialog.accept())
        await page.get_by_role("button", name="Terminate").click()
        await expect(page.get_by_test_id("error-code")).to_have_text("cancelled", timeout=WAIT_MS)
        await expect(page.get_by_test_id("status").first).to_have_text("cancelled")
        await expect(page.get_by_role("button", name="Terminate")).to_have_count(0)


async def events_of(client: KafkaAgentClient, agent: str, turn_id: str) -> list[Event]:
    return [e async for e in client.stream(agent, turn_id)]


async def test_ui_links_sub_agent_calls_both_ways_and_filters_by_agent_thread_and_tenant(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, page: Page
) -> None:
    # The children take their parent's tenant ("key" names none for a sub-agent).
    @kafka_agent(
        name=unique_name("refunds"),
        llm=FakeLLM(["ok"]),
        partitions=1,
        tenant="key",
        unknown_tenants="own",
    )
    async def refunds(ctx: AgentContext, order_id: str, cents: int) -> dict[str, Any]:
        if cents > 10_000:
            raise ValueError(f"a refund of {cents} needs a person")
        return {"order_id": order_id, "refunded": cents}

    @kafka_agent(
        name=unique_name("triage"),
        llm=FakeLLM(["ok"]),
        partitions=1,
        tenant=lambda request: request.metadata.get("tenant"),
        unknown_tenants="own",
    )
    async def triage(ctx: AgentContext, order_id: str) -> str:
        # Two calls in a row: the parent parks twice, so its reply steps are attempts 2 and 3.
        small = await ctx.call_agent(refunds, order_id=order_id, cents=500)
        try:
            await ctx.call_agent(refunds, order_id=order_id, cents=20_000)
        except SubAgentError as exc:
            return f"refunded {small['refunded']}, escalated: {exc.child_code}"
        return "refunded both"

    feed = FeedOptions(kafka_bootstrap_servers, agents=(triage.name, refunds.name))
    async with (
        running_worker(refunds, kafka_bootstrap_servers),
        running_worker(triage, kafka_bootstrap_servers),
        running_ui(feed, UIOptions(port=0)) as url,
    ):
        events = await client.run(
            triage.name,
            order_id="7",
            thread_id="customer-42",
            metadata={"tenant": "acme"},
            timeout=120,
        )
        assert events[-1].data["result"] == "refunded 500, escalated: agent_error"
        parent = events[0].turn_id
        children = [e.data["child_turn_id"] for e in events if e.type == "subagent:start"]
        assert len(children) == 2

        await page.goto(f"{url}/#/turn/{triage.name}/{parent}")
        calls = page.locator('[data-testid="step"][data-kind="subagent"]')
        await expect(calls).to_have_count(2, timeout=WAIT_MS)
        await expect(calls.nth(0)).to_contain_text('"refunded": 500')
        await expect(calls.nth(1)).to_contain_text("agent_error")
        await expect(page.get_by_test_id("attempt")).to_have_count(2)
        await expect(page.get_by_test_id("attempt").nth(1)).to_contain_text(
            "resumed when its sub-agent's reply arrived"
        )
        await expect(page.get_by_test_id("outcome")).to_contain_text("escalated: agent_error")

        # The second call links to the child's timeline, and the child back to its caller.
        await calls.nth(1).get_by_test_id("child-link").click()
        await expect(page.get_by_test_id("error-code")).to_have_text("agent_error", timeout=WAIT_MS)
        await expect(page.locator("h1")).to_have_text(children[1])
        await expect(page.get_by_test_id("outcome")).to_contain_text("needs a person")
        await page.get_by_test_id("parent-link").click()
        await expect(page.locator("h1")).to_have_text(parent, timeout=WAIT_MS)

        # The turns list: filter by agent, then by thread.
        await page.goto(url)
        rows = page.get_by_test_id("turn-row")
        await expect(rows).to_have_count(3, timeout=WAIT_MS)
        await page.get_by_label("agent").select_option(refunds.name)
        await expect(rows).to_have_count(2)
        for child in children:
            await expect(page.locator(f'[data-turn-id="{child}"]')).to_have_count(1)
        await page.get_by_label("agent").select_option("")
        await page.get_by_label("thread").fill("customer-42")
        await expect(rows).to_have_count(1)
        await expect(rows).to_have_attribute("data-turn-id", parent)

        # Another tenant's turn (and its two children); then filter by tenant.
        other = await client.run(triage.name, order_id="8", metadata={"tenant": "globex"})
        assert other[-1].type == "run:complete"
        await page.get_by_label("thread").fill("")
        await expect(rows).to_have_count(6, timeout=WAIT_MS)
        await page.get_by_label("tenant").select_option("acme")
        await expect(rows).to_have_count(3)
        for turn in (parent, *children):
            await expect(page.locator(f'[data-turn-id="{turn}"]')).to_have_count(1)
        await expect(rows.get_by_test_id("tenant")).to_have_text(["acme"] * 3)
        await page.get_by_label("tenant").select_option("globex")
        await expect(rows).to_have_count(3)
        await expect(page.locator(f'[data-turn-id="{other[0].turn_id}"]')).to_have_count(1)


async def test_ui_marks_a_crash_opens_an_evicted_turn_by_id_and_stays_bounded(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, page: Page
) -> None:
    gate = asyncio.Event()
    started: list[str] = []

    @tool(writes=True)
    async def refund(ctx: ToolContext, order_id: str) -> str:
        """Refund an order once the test allows it."""
        started.append(order_id)
        await ctx.emit_status(f"refunding order {order_id}")
        await gate.wait()
        return f"refunded {order_id}"

    @kafka_agent(
        name=unique_name("crashy"),
        llm=FakeLLM([reply_tool_calls(("refund", {"order_id": "7"})), "Refunded."]),
        tools=[refund],
        partitions=1,
    )
    async def agent(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}])

    quick_stop = WorkerOptions(shutdown_grace=0.2)
    # The UI keeps one finished turn per agent, so a second turn pushes the first out.
    feed = FeedOptions(kafka_bootstrap_servers, agents=(agent.name,))
    async with running_ui(feed, UIOptions(port=0, max_turns=1)) as url:
        async with running_worker(agent, kafka_bootstrap_servers, quick_stop):
            handle = await client.submit(agent.name, question="refund order 7")
            await wait_for(lambda: len(started) == 1, 60, "the tool started")
        # The worker stopped while the tool ran: model call 1 is journaled, the tool is not.
        gate.set()
        async with running_worker(agent, kafka_bootstrap_servers, quick_stop):
            crashed = await asyncio.wait_for(events_of(client, agent.name, handle.turn_id), 120)
            assert crashed[-1].attempt == 2
            newer = await client.run(agent.name, question="refund order 7", timeout=120)
            assert newer[-1].type == "run:complete"

        await page.goto(url)
        rows = page.get_by_test_id("turn-row")
        await expect(rows).to_have_count(1, timeout=WAIT_MS)
        await expect(rows).to_have_attribute("data-turn-id", newer[0].turn_id)
        # The crashed turn is no longer held: search its id, and open it from Kafka.
        await page.get_by_label("turn id").fill(handle.turn_id)
        await expect(rows).to_have_count(0)
        await page.get_by_role("button", name="Open").click()
        await expect(page.locator("h1")).to_have_text(handle.turn_id, timeout=WAIT_MS)
        await expect(page.get_by_test_id("outcome")).to_contain_text("Refunded.")
        steps = page.get_by_test_id("step")
        await expect(steps.nth(0)).to_contain_text("Model call 1")
        await expect(steps.nth(0)).to_contain_text("replayed")
        attempt = page.get_by_test_id("attempt")
        await expect(attempt).to_have_count(1)
        await expect(attempt).to_contain_text("Attempt 2")
        await expect(attempt).to_contain_text("stopped before finishing")
        # After the mark: the tool runs again (with its status line), then model call 2.
        after = page.locator('[data-testid="attempt"] ~ [data-testid="step"]')
        await expect(after).to_have_count(3)
        await expect(after.nth(0)).to_have_attribute("data-kind", "tool")
        await expect(after.nth(0)).to_contain_text("refunded 7")
        await expect(after.nth(1)).to_have_attribute("data-kind", "status")
        await expect(after.nth(1)).to_contain_text("refunding order 7")
        await expect(after.nth(2)).to_contain_text("Model call 2")
        await expect(after.nth(2)).not_to_contain_text("replayed")

        # The page keeps as many dead letters per agent as the server: here one, the newest.
        await page.goto(f"{url}/#/dlq")
        letters = page.get_by_test_id("dead-letter")
        async with running_worker(agent, kafka_bootstrap_servers, quick_stop):
            producer = RecordProducer(kafka_bootstrap_servers)
            try:
                for n in (1, 2):
                    await producer.send(agent.topics.turns, f"bad-{n}".encode(), b"\x00", [])
                    await expect(letters.first).to_contain_text(f"bad-{n}", timeout=WAIT_MS)
            finally:
                producer.close()
        await expect(letters).to_have_count(1)


async def test_ui_with_api_keys_signs_a_browser_in_with_a_cookie_and_out_again(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, page: Page
) -> None:
    @kafka_agent(name=unique_name("keyed"), llm=FakeLLM(["fine"]), partitions=1)
    async def agent(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}])

    key = "ui-key-0123456789abcdef0123456789abcdef"
    access = HTTPAccess(auth=APIKeyAuth({"web": key}))
    feed = FeedOptions(kafka_bootstrap_servers, agents=(agent.name,))
    async with (
        running_worker(agent, kafka_bootstrap_servers),
        running_ui(feed, UIOptions(port=0, access=access)) as url,
    ):
        done = await client.run(agent.name, question="hi", timeout=60)
        await page.goto(url)
        field = page.get_by_label("API key")
        await field.fill("a guess")
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.get_by_role("alert")).to_have_text("That key is not valid.")
        await field.fill(key)
        await page.get_by_role("button", name="Sign in").click()
        # Signed in: the page, its script and its live stream all ride the cookie.
        row = page.locator(f'[data-testid="turn-row"][data-turn-id="{done[0].turn_id}"]')
        await expect(row).to_be_visible(timeout=WAIT_MS)
        (cookie,) = await page.context.cookies(url)
        assert (cookie["httpOnly"], cookie["sameSite"]) == (True, "Strict")
        assert key not in cookie["value"]
        await page.get_by_role("button", name="Sign out").click()
        await expect(page.get_by_label("API key")).to_be_visible(timeout=WAIT_MS)
        assert await page.context.cookies(url) == []


async def test_ui_waiting_view_approves_one_call_and_rejects_another(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, page: Page
) -> None:
    ran: list[int] = []

    @tool(requires_approval=True)
    async def refund(ctx: ToolContext, cents: int) -> str:
        """Refund money."""
        ran.append(cents)
        return f"refunded {cents}"

    @kafka_agent(
        name=unique_name("gated"),
        llm=FakeLLM(["x"]),
        tools=[refund],
        partitions=1,
        human_in_the_loop=True,
    )
    async def agent(ctx: AgentContext, cents: int) -> str:
        try:
            return str(await refund(ctx, cents=cents))
        except ToolCallRejected as exc:
            return f"not refunded: {exc.reason}"

    feed = FeedOptions(kafka_bootstrap_servers, agents=(agent.name,))
    async with (
        running_worker(agent, kafka_bootstrap_servers) as worker,
        running_ui(feed, UIOptions(port=0, allow_actions=True)) as url,
    ):
        first = await client.submit(agent.name, cents=100)
        await wait_for(lambda: worker.parked_turns == 1, 60, "the first turn asked")
        second = await client.submit(agent.name, cents=900)
        await wait_for(lambda: worker.parked_turns == 2, 60, "both turns asked")
        await page.goto(f"{url}/#/waiting")
        questions = page.get_by_test_id("question")
        await expect(questions).to_have_count(2, timeout=WAIT_MS)
        # Oldest first, with the tool and its arguments.
        await expect(questions.nth(0)).to_contain_text("refund", timeout=WAIT_MS)
        await expect(questions.nth(0).get_by_test_id("question-input")).to_contain_text("100")
        await expect(questions.nth(1).get_by_test_id("question-input")).to_contain_text("900")
        await questions.nth(0).get_by_role("button", name="Approve").click()
        await expect(questions).to_have_count(1, timeout=WAIT_MS)
        await questions.nth(0).get_by_label("reason").fill("over the limit")
        await questions.nth(0).get_by_role("button", name="Reject").click()
        await expect(page.get_by_text("Nothing is waiting.")).to_be_visible(timeout=WAIT_MS)
        await page.goto(f"{url}/#/turn/{agent.name}/{first.turn_id}")
        await expect(page.get_by_test_id("outcome")).to_contain_text(
            "refunded 100", timeout=WAIT_MS
        )
        await page.goto(f"{url}/#/turn/{agent.name}/{second.turn_id}")
        await expect(page.get_by_test_id("outcome")).to_contain_text(
            "not refunded: over the limit", timeout=WAIT_MS
        )
    assert ran == [100]
