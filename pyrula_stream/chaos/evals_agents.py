"""The agents of ``--evals``: a shop whose turns name an order, a judge agent, and the
shop's three evaluators (a function, the judge, a deferred outcome on the orders topic).

Worker and evaluator processes import ``pyrula_stream.chaos.evals_agents:shop`` (and
``:grader``). The harness sets, through the environment: ``PYRULA_CHAOS_AGENT`` (the
shop's name; the judge is ``<name>-judge``, the orders topic ``<name>-orders``),
``PYRULA_CHAOS_PARTITIONS``, and the outcome's window and grace in seconds
(``PYRULA_CHAOS_WINDOW_S``, ``PYRULA_CHAOS_GRACE_S``). Both agents' models are
``FakeLLM`` responders: the shop answers, the judge passes an order unless its number is
a multiple of three, so the checker knows every right verdict.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from typing import Any

from pyrula_stream.agent.definition import kafka_agent
from pyrula_stream.chaos.effects import AGENT_ENV, PARTITIONS_ENV
from pyrula_stream.context.agent_context import AgentContext
from pyrula_stream.evals import ScoredTurn, evaluator, judge, outcome
from pyrula_stream.llm.base import ModelResponse, ToolDefinition
from pyrula_stream.llm.fake import FakeLLM, reply_text

WINDOW_ENV = "PYRULA_CHAOS_WINDOW_S"
GRACE_ENV = "PYRULA_CHAOS_GRACE_S"
FUNCTION_RATE = 0.7
JUDGE_RATE = 0.6
OUTCOME_RATE = 0.8

NAME = os.environ.get(AGENT_ENV, "evalshop")
PARTITIONS = int(os.environ.get(PARTITIONS_ENV, "3"))
WINDOW = timedelta(seconds=float(os.environ.get(WINDOW_ENV, "4")))
GRACE = timedelta(seconds=float(os.environ.get(GRACE_ENV, "20")))


def orders_topic(agent: str) -> str:
    return f"{agent}-orders"


def judged_passes(n: int) -> bool:
    """The judge's verdict on order ``n``."""
    return n % 3 != 0


def _grade(messages: list[dict[str, Any]], tools: list[ToolDefinition]) -> ModelResponse:
    n = int(str(messages[-1]["content"]).rsplit("o", 1)[1])
    return reply_text(json.dumps({"passed": judged_passes(n), "reason": f"order {n}"}))


def _answer(messages: list[dict[str, Any]], tools: list[ToolDefinition]) -> ModelResponse:
    return reply_text(f"placed {messages[-1]['content']}")


@kafka_agent(name=f"{NAME}-judge", llm=FakeLLM(_grade), partitions=PARTITIONS)
async def grader(ctx: AgentContext, answer: str) -> Any:
    return json.loads(await ctx.llm.run([{"role": "user", "content": answer}]))


@evaluator(sample_rate=FUNCTION_RATE)
def short(turn: ScoredTurn) -> bool:
    """A function evaluator: the answer stays short."""
    return len(json.dumps(turn.result)) < 200


def _judge_params(turn: ScoredTurn) -> dict[str, Any]:
    return {"answer": turn.result["order_id"]}


quality = judge("quality", grader, params=_judge_params, sample_rate=JUDGE_RATE)
delivered = outcome(
    "delivered",
    topic=orders_topic(NAME),
    key="order_id",
    window=WINDOW,
    grace=GRACE,
    sample_rate=OUTCOME_RATE,
)


@kafka_agent(
    name=NAME,
    llm=FakeLLM(_answer),
    partitions=PARTITIONS,
    evaluators=[short, quality, delivered],
)
async def shop(ctx: AgentContext, n: int) -> dict[str, Any]:
    text = await ctx.llm.run([{"role": "user", "content": f"order o{n}"}])
    return {"order_id": f"o{n}", "n": n, "text": text}
