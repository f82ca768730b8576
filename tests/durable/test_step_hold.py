"""Steps that may be redone keep their journal entries in the turn for a while.

- A turn that ends within ``STEP_HOLD_S`` of its held steps sends none of their entries
  (nor their tombstones), even when commits ran while it waited on its model.
- A held step goes out with the next step recorded once it is older than
  ``STEP_HOLD_S``, and the steps before it with it: the journal never has a gap.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from pyrula_stream import AgentContext, KafkaAgentClient, ToolContext, kafka_agent, tool
from pyrula_stream.durable.turn import STEP_HOLD_S
from pyrula_stream.kafka.consumers import read_topic
from pyrula_stream.llm import FakeLLM, reply_tool_call
from pyrula_stream.llm.base import StreamItem
from pyrula_stream.testing import running_worker, unique_name
from pyrula_stream.wire.serde import decode_journal_entry


@tool(read_only=True)
async def look(ctx: ToolContext) -> str:
    """Read something."""
    return "looked"


class Thinking(FakeLLM):
    """A scripted model whose n-th call takes ``pauses[n]`` seconds before it answers."""

    def __init__(self, script: Sequence[Any], pauses: Sequence[float]) -> None:
        super().__init__(script)
        self.pauses = list(pauses)
        self.calls = 0

    async def stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[StreamItem]:
        pause = self.pauses[min(self.calls, len(self.pauses) - 1)]
        self.calls += 1
        await asyncio.sleep(pause)  # commits of the steps before run meanwhile
        async for item in super().stream(*args, **kwargs):
            yield item


async def sent_steps(
    bootstrap: str, llm: FakeLLM, client: KafkaAgentClient
) -> tuple[list[str], int]:
    """Run one turn of ``llm`` with the read-only tool; the kinds of the step entries the
    journal received (in step order) and how many tombstones of step keys it received."""

    @kafka_agent(name=unique_name("hold"), llm=llm, tools=[look], partitions=1)
    async def agent(ctx: AgentContext, q: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": q}])

    async with running_worker(agent, bootstrap):
        events = await client.run(agent.name, q="look twice", timeout=60)
    assert events[-1].type == "run:complete"
    turn_id = events[-1].turn_id
    records = read_topic(bootstrap, agent.topics.journal)
    steps = [r for r in records if r.key.startswith(f"{turn_id}/") and r.key[-1].isdigit()]
    entries = [decode_journal_entry(r.value, r.headers) for r in steps if r.value is not None]
    kinds = [e.kind for e in sorted(entries, key=lambda e: e.step)]
    return kinds, sum(1 for r in steps if r.value is None)


async def test_a_turn_that_ends_within_the_hold_sends_no_step_entry(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    script: list[Any] = [reply_tool_call("look"), "done"]
    llm = Thinking(script, pauses=[0.0, STEP_HOLD_S / 3])
    kinds, tombstones = await sent_steps(kafka_bootstrap_servers, llm, client)
    assert (kinds, tombstones) == ([], 0)


async def test_a_held_step_goes_out_with_the_next_once_older_than_the_hold(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """Steps: 0 start, 1 model, 2 tool (held at once), 3 model after a long call (sends
    0-3), 4 tool (held again), 5 the answer after another long call (ends the turn: 4 and 5
    meet their tombstones in the terminal commit)."""
    script: list[Any] = [reply_tool_call("look"), reply_tool_call("look"), "done"]
    slow = STEP_HOLD_S + 0.3
    llm = Thinking(script, pauses=[0.0, slow, slow])
    kinds, tombstones = await sent_steps(kafka_bootstrap_servers, llm, client)
    assert kinds == ["start", "llm", "tool", "llm"]
    assert tombstones == 4
