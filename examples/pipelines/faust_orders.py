"""Orders → a Faust agent submits a turn per order → the agent's results → a Faust table.

Two processes, each a Kafka consumer group:

    pyrula-stream worker examples.pipelines.faust_orders:triage      # runs the turns
    python -m examples.pipelines.faust_orders worker --without-web   # the Faust app

The Faust app runs with ``processing_guarantee="exactly_once"``: a turn request is
committed in the same Faust transaction as the order's offset, and each answered order
is written to the ``answered`` table and the ``<pipeline>.answered`` topic in the same
transaction as the result's offset. Our worker writes each result exactly once in the
turn's own transaction, so no order is answered twice, even when a worker is killed.

``KAFKA_BOOTSTRAP_SERVERS`` names the cluster; ``PIPELINE`` (default ``orders``) names the
Faust app and its topics, and prefixes the agent's topics.
"""

from __future__ import annotations

import json
import os
from typing import Any

import faust
from pydantic import BaseModel

from pyrula_stream import AgentContext, kafka_agent
from pyrula_stream.integrations.faust import results_topic, submit_turn, turns_topic
from pyrula_stream.llm import FakeLLM, ModelResponse, ToolDefinition
from pyrula_stream.llm.fake import reply_text
from pyrula_stream.wire.serde import TurnResult

PIPELINE = os.environ.get("PIPELINE", "orders")
BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092")
PARTITIONS = 2
MODEL_LATENCY_S = float(os.environ.get("PIPELINE_MODEL_LATENCY_S", "0"))


class Triage(BaseModel):
    """What the agent answers for an order."""

    order_id: str
    priority: str
    reply: str


def scripted_model(messages: list[dict[str, Any]], tools: list[ToolDefinition]) -> ModelResponse:
    """A stand-in model: urgent when the order mentions damage, else normal."""
    order = json.loads(str(messages[0]["content"]))
    urgent = "damaged" in order["text"]
    answer = {
        "order_id": order["order_id"],
        "priority": "urgent" if urgent else "normal",
        "reply": "We are sending a replacement." if urgent else "Your order is on its way.",
    }
    return reply_text(json.dumps(answer))


@kafka_agent(
    name="triage",
    prefix=PIPELINE,
    partitions=PARTITIONS,
    llm=FakeLLM(scripted_model, latency_s=MODEL_LATENCY_S),
    output_type=Triage,
)
async def triage(ctx: AgentContext, order_id: str, text: str) -> str:
    content = json.dumps({"order_id": order_id, "text": text})
    return await ctx.llm.run([{"role": "user", "content": content}], system="Triage the order.")


app = faust.App(
    f"{PIPELINE}-faust",
    broker=f"kafka://{BOOTSTRAP}",
    processing_guarantee="exactly_once",
    store="memory://",
    topic_partitions=PARTITIONS,
    web_enabled=False,
)
orders = app.topic(f"{PIPELINE}.orders", key_serializer="raw", value_serializer="json")
answered_topic = app.topic(f"{PIPELINE}.answered", key_serializer="raw", value_serializer="json")
turns = turns_topic(app, triage.name, prefix=PIPELINE)
results = results_topic(app, triage.name, prefix=PIPELINE)
answered = app.Table(f"{PIPELINE}-answered", default=dict, partitions=PARTITIONS)


@app.agent(orders)
async def submit_orders(stream: faust.StreamT[dict[str, Any]]) -> None:
    """One turn per order, keyed by order id, the order id echoed as correlation id."""
    async for order in stream:
        params = {"order_id": order["order_id"], "text": order["text"]}
        await submit_turn(
            turns, triage.name, params, key=order["order_id"], correlation_id=order["order_id"]
        )


@app.agent(results)
async def collect_answers(stream: faust.StreamT[TurnResult]) -> None:
    """Each result lands in the table and on the downstream topic."""
    async for result in stream:
        order_id = result.correlation_id or result.turn_id
        answer = {"order_id": order_id, "status": result.status, "answer": result.result}
        answered[order_id] = answer
        await answered_topic.send(key=order_id.encode(), value=answer)


if __name__ == "__main__":
    app.main()
