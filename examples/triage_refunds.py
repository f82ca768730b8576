"""Two agents, one call: a triage agent asks a refunds agent, over Kafka.

Run both in one process, then submit a turn:

    pyrula-stream worker examples.triage_refunds:triage examples.triage_refunds:refunds
    pyrula-stream submit triage order_id=7 complaint="arrived broken" --wait

The triage turn parks while the refunds turn runs (on any refunds worker), and resumes
by replay when the refund's reply arrives. Both models are scripted (``FakeLLM``).
"""

from __future__ import annotations

from typing import Any

from pyrula_stream import AgentContext, AgentLimits, SubAgentError, kafka_agent
from pyrula_stream.llm import FakeLLM

REFUND_LIMIT_CENTS = 10_000


@kafka_agent(name="refunds", llm=FakeLLM(["unused"]))
async def refunds(ctx: AgentContext, order_id: str, cents: int) -> dict[str, Any]:
    """Refund an order, up to a limit."""
    if cents > REFUND_LIMIT_CENTS:
        raise ValueError(f"refunds over {REFUND_LIMIT_CENTS} cents need a person")
    receipt = await ctx.step("refund", lambda: f"refund-{order_id}-{cents}")
    return {"order_id": order_id, "refunded": cents, "receipt": receipt}


@kafka_agent(
    name="triage",
    llm=FakeLLM(["Sorry about that: your refund is on its way."]),
    limits=AgentLimits(max_agent_depth=1, max_total_tokens=20_000),
)
async def triage(ctx: AgentContext, order_id: str, complaint: str) -> str:
    try:
        done = await ctx.call_agent(refunds, order_id=order_id, cents=1_200)
    except SubAgentError as exc:
        return f"escalated to a person ({exc.child_code})"
    prompt = f"Complaint: {complaint}. Refund: {done}. Answer the customer."
    return await ctx.llm.run([{"role": "user", "content": prompt}])
