"""Function evaluators on a real broker: each sampled turn gets exactly one score per
evaluator, the sampling is the same on every run, an evaluator that raises writes an
error score (the turn it scores completed all the same), one that asks reads the tools
the turn called, and a second member of the evaluators' group taking over writes no
score twice."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

from pyrula_stream import AgentContext, KafkaAgentClient, ToolContext, kafka_agent, tool
from pyrula_stream.evals import ScoredTurn, Verdict, evaluator, sampled
from pyrula_stream.kafka.once import read_raw
from pyrula_stream.llm import FakeLLM, ModelResponse, reply_text, reply_tool_call
from pyrula_stream.llm.fake import count_model_calls
from pyrula_stream.testing import running_worker, wait_for
from pyrula_stream.wire.scores import parse_score
from tests.evals.streaming import streaming


@evaluator(sample_rate=0.5)
def even(turn: ScoredTurn) -> bool:
    return int(turn.result["n"]) % 2 == 0


@evaluator()
def cheap(turn: ScoredTurn) -> float:
    return turn.cost_usd


@evaluator(name="broken")
def broken(turn: ScoredTurn) -> bool:
    raise RuntimeError("evaluator bug")


@evaluator(reads_tools=True)
def tooled(turn: ScoredTurn) -> Verdict:
    return Verdict(label=",".join(turn.tools) or "none", passed=len(turn.tools) <= 1)


@tool(read_only=True)
async def shout(ctx: ToolContext, text: str) -> str:
    """Upper-case the text."""
    return text.upper()


def _model(messages: list[dict[str, Any]], tools: Any) -> ModelResponse:
    """Every third turn calls ``shout`` once, then answers."""
    if messages[0]["content"] == "use a tool" and count_model_calls(messages) == 0:
        return reply_tool_call("shout", text="hi")
    return reply_text("ok")


def _agent() -> Any:
    @kafka_agent(
        name=f"scored-{uuid.uuid4().hex[:8]}",
        llm=FakeLLM(_model),
        tools=[shout],
        partitions=2,
        version="2",
        evaluators=[even, cheap, broken, tooled],
    )
    async def body(ctx: AgentContext, n: int) -> dict[str, Any]:
        ask = "use a tool" if n % 3 == 0 else "answer"
        return {"n": n, "text": await ctx.llm.run([{"role": "user", "content": ask}])}

    return body


async def test_each_sampled_turn_scored_once_across_a_takeover(
    kafka_bootstrap_servers: str,
) -> None:
    agent = _agent()
    bootstrap = kafka_bootstrap_servers
    async with running_worker(agent, bootstrap), KafkaAgentClient(bootstrap) as client:
        first = [(await client.submit(agent.name, n=n)).turn_id for n in range(6)]
        want_first = 3 * len(first) + sum(sampled(t, "even", 0.5) for t in first)
        with streaming(agent, bootstrap, "a") as stream:
            await wait_for(lambda: stream.stats["scores"] >= want_first, 60, "first scores")
        second = [(await client.submit(agent.name, n=n)).turn_id for n in range(6, 12)]
        with streaming(agent, bootstrap, "b") as stream:
            want = 3 * len(second) + sum(sampled(t, "even", 0.5) for t in second)
            await wait_for(lambda: stream.stats["scores"] >= want, 60, "second scores")
            await asyncio.sleep(0.5)  # a doubled score would be written by now
        results = {(r.key or b"").decode() for r in read_raw(bootstrap, agent.topics.results)}
    turns = first + second
    assert results == set(turns)  # the turn the broken evaluator scored completed
    scores = [parse_score(r.value) for r in read_raw(bootstrap, agent.topics.scores)]
    counted = Counter((s.turn_id, s.evaluator) for s in scores)
    assert set(counted.values()) == {1}, "a score was written twice"
    expected = {(t, ev) for t in turns for ev in ("cheap", "broken", "tooled")}
    expected |= {(t, "even") for t in turns if sampled(t, "even", 0.5)}
    assert set(counted) == expected
    assert 0 < sum(1 for t in turns if sampled(t, "even", 0.5)) < len(turns)
    by = {(s.turn_id, s.evaluator): s for s in scores}
    for t, n in zip(turns, range(12), strict=True):
        if (t, "even") in by:
            assert by[(t, "even")].passed is (n % 2 == 0)
        assert by[(t, "broken")].label == "error"
        assert "RuntimeError: evaluator bug" in by[(t, "broken")].reason
        assert by[(t, "cheap")].number == 0.0
        assert by[(t, "cheap")].kind == "function"
        assert by[(t, "cheap")].agent_version == "2"  # the variant that answered
        assert by[(t, "tooled")].label == ("shout" if n % 3 == 0 else "none")
