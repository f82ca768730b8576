"""The chaos agent: two model calls and one side-effect tool call per turn.

Worker processes import it as ``pyrula_stream.chaos.agent:chaos``. The harness configures
it through the environment, so each run gets its own agent name (hence its own topics):

- ``PYRULA_CHAOS_AGENT``: the agent name (default ``chaos``);
- ``PYRULA_CHAOS_PARTITIONS``: partitions of its topics (default 6);
- ``PYRULA_CHAOS_MODEL_URL``: base URL of the chaos model server (OpenAI-compatible);
- ``PYRULA_CHAOS_EFFECTS``: the effects file the tool appends to;
- ``PYRULA_CHAOS_SUBAGENTS=1``: after its tool loop each turn calls two children on
  ``<agent>-child`` (``chaos_child``, model-free), one with ``call_agent`` and one with
  ``gather_subagents``;
- ``PYRULA_CHAOS_APPROVALS=1``: the agent opts in (``human_in_the_loop``) and each turn
  then calls ``gated_effect`` directly, which waits for the harness's reviewer and
  records its effect in ``PYRULA_CHAOS_GATED_EFFECTS`` only when approved;
- ``PYRULA_CHAOS_TENANTS=1``: turns have tenants (``metadata["tenant"]``) held to the
  small quotas of ``chaos/tenants.py``;
- ``park="sleep"`` or ``park="signal"`` (``--autoscale``): after its tool call the turn
  parks on a durable timer or a signal (``chaos/parking.py``);
- ``PYRULA_CHAOS_BATCH_URL``: the model calls go by the batch lane to the provider
  there (``chaos/batch_lane.py``);
- ``PYRULA_CHAOS_HOSTILE=1``: a turn with ``ask=True`` (sent by the hostile producer, never
  by the submitter) parks on ``gated_effect`` at once; turns have tenants, a tenant not
  in ``chaos/tenants.py`` held to ``hostile_caps.UNKNOWN_TENANT_LIMITS``.

The tool dedupes on ``ctx.idempotency_key`` (see ``effects.py``).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from pyrula_stream.agent.definition import kafka_agent
from pyrula_stream.agent.limits import DEFAULT_MAX_TOOL_RESULT_BYTES, AgentLimits
from pyrula_stream.chaos.batch_lane import chaos_lane
from pyrula_stream.chaos.effects import (
    AGENT_ENV,
    APPROVALS_ENV,
    EFFECTS_ENV,
    GATED_EFFECTS_ENV,
    HOSTILE_ENV,
    MODEL_URL_ENV,
    PARTITIONS_ENV,
    SUBAGENTS_ENV,
    apply_effect_once,
)
from pyrula_stream.chaos.hostile_caps import UNKNOWN_TENANT_LIMITS
from pyrula_stream.chaos.large import LARGE_ENV, large_tool_result
from pyrula_stream.chaos.model_server import MODEL, prompt_for
from pyrula_stream.chaos.parking import park as park_turn
from pyrula_stream.chaos.tenants import TENANTS_ENV, tenancy_options
from pyrula_stream.context.agent_context import AgentContext
from pyrula_stream.errors import ToolCallRejected
from pyrula_stream.llm.base import LLMClient
from pyrula_stream.llm.fake import FakeLLM
from pyrula_stream.tools.contract import ToolContext, tool

SYSTEM = "You are the chaos agent. Record the turn's effect with the tool, then answer."


@tool(writes=True)
async def record_effect(ctx: ToolContext, turn: str) -> dict[str, Any]:
    """Record this turn's side effect (exactly once per idempotency key)."""
    path = os.environ.get(EFFECTS_ENV)
    key = ctx.idempotency_key
    if not path or not key:
        raise RuntimeError(f"record_effect needs ${EFFECTS_ENV} and an idempotency key")
    await asyncio.to_thread(apply_effect_once, path, key, turn)
    # The same answer whether it applied now or was deduped: the result is deterministic.
    report = large_tool_result(turn) if os.environ.get(LARGE_ENV) == "1" else None
    if report is not None:  # --large: stored by reference
        return {"turn": turn, "key": key, "recorded": True, "report": report}
    return {"turn": turn, "key": key, "recorded": True}


@tool(requires_approval=True)
async def gated_effect(ctx: ToolContext, turn: str) -> dict[str, Any]:
    """An effect a reviewer must approve (exactly once per idempotency key)."""
    path = os.environ.get(GATED_EFFECTS_ENV)
    key = ctx.idempotency_key
    if not path or not key:
        raise RuntimeError(f"gated_effect needs ${GATED_EFFECTS_ENV} and an idempotency key")
    await asyncio.to_thread(apply_effect_once, path, key, turn)
    return {"turn": turn, "approved": True}


def chaos_llm() -> LLMClient:
    """``OpenAILLM`` pointed at the chaos model server."""
    from pyrula_stream.llm import OpenAILLM

    base_url = os.environ.get(MODEL_URL_ENV, "http://127.0.0.1:9/v1")
    return OpenAILLM(MODEL, base_url=base_url, api_key="chaos-no-key", llm_call_timeout=30.0)


AGENT_NAME = os.environ.get(AGENT_ENV, "chaos")
HOSTILE = os.environ.get(HOSTILE_ENV) == "1"


def _tenancy() -> dict[str, Any]:
    if os.environ.get(TENANTS_ENV) == "1":
        return tenancy_options(UNKNOWN_TENANT_LIMITS if HOSTILE else None)
    return tenancy_options(UNKNOWN_TENANT_LIMITS) if HOSTILE else {}


CHILD_NAME = f"{AGENT_NAME}-child"


@kafka_agent(
    name=CHILD_NAME,
    llm=FakeLLM(["model-free"]),
    partitions=int(os.environ.get(PARTITIONS_ENV, "6")),
)
async def chaos_child(ctx: AgentContext, parent: str, i: int) -> dict[str, Any]:
    """A model-free child: its result names its parent and its place."""
    return {"parent": parent, "i": i}


@kafka_agent(
    name=AGENT_NAME,
    llm=chaos_llm(),
    tools=[record_effect],
    limits=AgentLimits(
        max_llm_calls=4,
        max_tool_calls=2,
        # --large: the whole tool result in its event and the model's input, by reference
        max_tool_result_bytes=None
        if os.environ.get(LARGE_ENV) == "1"
        else DEFAULT_MAX_TOOL_RESULT_BYTES,
    ),
    partitions=int(os.environ.get(PARTITIONS_ENV, "6")),
    timeout=300.0,
    human_in_the_loop=os.environ.get(APPROVALS_ENV) == "1" or HOSTILE,
    batch=chaos_lane(),
    **_tenancy(),
)
async def chaos(
    ctx: AgentContext, n: int, ask: bool = False, park: str = "", blob: str = ""
) -> dict[str, Any]:
    if ask and HOSTILE:  # a hostile record's turn: parks on a question only a reviewer answers
        gated = await gated_effect(ctx, turn=ctx.turn_id)
        return {"turn": ctx.turn_id, "asked": gated}
    # history=False: the model server reads the turn from the request; the thread still
    # records each turn's messages (what `--threads` checks).
    answer = await ctx.llm.run(
        [{"role": "user", "content": prompt_for(ctx.turn_id, n)}], system=SYSTEM, history=False
    )
    if os.environ.get(APPROVALS_ENV) == "1":
        try:
            gated = await gated_effect(ctx, turn=ctx.turn_id)
        except ToolCallRejected as exc:
            gated = {"turn": ctx.turn_id, "rejected": exc.reason, "expired": exc.expired}
        return {"turn": ctx.turn_id, "n": n, "answer": answer, "gated": gated}
    if park:
        parked = await park_turn(ctx, park)
        return {"turn": ctx.turn_id, "n": n, "answer": answer, "parked": parked}
    if blob:  # --large: a large request comes back in a large result
        return {"turn": ctx.turn_id, "n": n, "answer": answer, "blob": blob}
    if os.environ.get(SUBAGENTS_ENV) != "1":
        return {"turn": ctx.turn_id, "n": n, "answer": answer}
    first = await ctx.call_agent(chaos_child, parent=ctx.turn_id, i=0)
    (second,) = await ctx.gather_subagents((chaos_child, {"parent": ctx.turn_id, "i": 1}))
    return {"turn": ctx.turn_id, "n": n, "answer": answer, "children": [first, second]}
