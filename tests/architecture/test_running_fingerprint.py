"""The model-call fingerprint costs one encode per message per turn, not one per call.

``RunningFingerprint`` must give exactly ``fingerprint``'s bytes (recorded journals replay),
and a tool loop must encode each message of its conversation once however many steps run.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pyrula_stream import AgentContext, KafkaAgentClient, ToolContext, kafka_agent, tool
from pyrula_stream.agent.limits import AgentLimits
from pyrula_stream.bench.workload import ScriptModel
from pyrula_stream.llm import reply_text, reply_tool_call
from pyrula_stream.testing import running_worker, unique_name
from pyrula_stream.wire.fingerprint import RunningFingerprint, fingerprint

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(json_values, max_size=4), max_size=5))
def test_a_growing_list_hashes_as_fingerprint_does(chunks: list[list[Any]]) -> None:
    running = RunningFingerprint()
    items: list[Any] = []
    assert running.of(items) == fingerprint(items)
    for chunk in chunks:
        items.extend(chunk)
        assert running.of(items) == fingerprint(items)


def test_a_list_that_is_not_the_last_one_extended_starts_over() -> None:
    running = RunningFingerprint()
    first = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    running.of(first)
    other = [{"role": "user", "content": "c"}]
    assert running.of(other) == fingerprint(other)
    assert running.of([*other, "d"]) == fingerprint([*other, "d"])
    assert running.of(first[:1]) == fingerprint(first[:1])
    # Another first item before the same last one: not the list hashed, so it starts over.
    running.of(first)
    swapped = [{"role": "user", "content": "z"}, first[1]]
    assert running.of(swapped) == fingerprint(swapped)
    # The same items in a new list (what a tool loop passes each call) go on from the hash.
    assert running.of([*swapped, "e"]) == fingerprint([*swapped, "e"])


class CountsEncodes:
    """A message content the canonical encoder turns into text with ``str`` (its
    ``default``): each encode of the message calls ``__str__`` once."""

    def __init__(self) -> None:
        self.encodes = 0

    def __str__(self) -> str:
        self.encodes += 1
        return "Where is order 1234?"


@tool(read_only=True)
async def lookup(ctx: ToolContext, order_id: str) -> str:
    """Look up an order."""
    return "shipped"


async def test_a_long_tool_loop_encodes_each_message_once(kafka_bootstrap_servers: str) -> None:
    steps = 30
    content = CountsEncodes()
    llm = ScriptModel(
        [*(reply_tool_call("lookup", order_id=str(i)) for i in range(steps)), reply_text("done")]
    )

    @kafka_agent(
        name=unique_name("fpcost"),
        llm=llm,
        tools=[lookup],
        limits=AgentLimits(max_llm_calls=steps + 1),
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": content}])

    async with (
        KafkaAgentClient(kafka_bootstrap_servers) as client,
        running_worker(agent, kafka_bootstrap_servers),
    ):
        events = await client.run(agent.name, timeout=120)
    assert events[-1].type == "run:complete"
    assert sum(e.type == "tool:result" for e in events) == steps
    assert content.encodes == 1  # was steps + 1: the whole conversation on every call
