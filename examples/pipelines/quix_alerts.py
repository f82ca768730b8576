"""Alerts → turns → the agent's results → a Quix ``StreamingDataFrame`` → a summary topic.

Two processes, in an environment with the ``quix`` extra:

    pyrula-stream worker examples.pipelines.quix_alerts:triage   # runs the turns
    python -m examples.pipelines.quix_alerts                     # the Quix app

The Quix app never calls the model: one dataframe turns each alert into a turn request
(``to_topic``), a second reads the results, keeps the completed ones and writes a summary
per alert. It runs with ``processing_guarantee="exactly-once"``; our worker writes each
result exactly once in the turn's own transaction.

``KAFKA_BOOTSTRAP_SERVERS`` names the cluster; ``PIPELINE`` (default ``alerts``) names the
Quix consumer group and its topics, and prefixes the agent's topics.
"""

from __future__ import annotations

import json
import os
from typing import Any

from pydantic import BaseModel
from quixstreams import Application

from pyrula_stream import AgentContext, kafka_agent
from pyrula_stream.integrations.quix import TurnRequestSerializer, TurnResultDeserializer
from pyrula_stream.llm import FakeLLM, ModelResponse, ToolDefinition
from pyrula_stream.llm.fake import reply_text

PIPELINE = os.environ.get("PIPELINE", "alerts")
BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092")
PARTITIONS = 2
MODEL_LATENCY_S = float(os.environ.get("PIPELINE_MODEL_LATENCY_S", "0"))


class Assessment(BaseModel):
    """What the agent answers for an alert."""

    alert_id: str
    severity: str
    summary: str


def scripted_model(messages: list[dict[str, Any]], tools: list[ToolDefinition]) -> ModelResponse:
    """A stand-in model: critical when the alert mentions damage, else low."""
    alert = json.loads(str(messages[0]["content"]))
    critical = "damaged" in alert["text"]
    answer = {
        "alert_id": alert["alert_id"],
        "severity": "critical" if critical else "low",
        "summary": f"{'Page on-call' if critical else 'Log it'}: {alert['text']}",
    }
    return reply_text(json.dumps(answer))


@kafka_agent(
    name="triage",
    prefix=PIPELINE,
    partitions=PARTITIONS,
    llm=FakeLLM(scripted_model, latency_s=MODEL_LATENCY_S),
    output_type=Assessment,
)
async def triage(ctx: AgentContext, alert_id: str, text: str) -> str:
    content = json.dumps({"alert_id": alert_id, "text": text})
    return await ctx.llm.run([{"role": "user", "content": content}], system="Assess the alert.")


def build_app() -> Application:
    app = Application(
        broker_address=BOOTSTRAP,
        consumer_group=f"{PIPELINE}-quix",
        processing_guarantee="exactly-once",
        auto_offset_reset="earliest",
        state_dir=os.environ.get("PIPELINE_STATE_DIR", "state"),
    )
    alerts = app.topic(f"{PIPELINE}.alerts", key_deserializer="str", value_deserializer="json")
    turns = app.topic(
        triage.topics.turns, key_serializer="str", value_serializer=TurnRequestSerializer("triage")
    )
    results = app.topic(
        triage.topics.results, key_deserializer="str", value_deserializer=TurnResultDeserializer()
    )
    summary = app.topic(f"{PIPELINE}.summary", key_serializer="str", value_serializer="json")

    requests = app.dataframe(alerts)
    requests = requests.apply(
        lambda alert: {
            "params": {"alert_id": alert["alert_id"], "text": alert["text"]},
            "correlation_id": alert["alert_id"],
        }
    )
    requests.to_topic(turns)

    answers = app.dataframe(results)
    answers = answers.filter(lambda result: result["status"] == "completed")
    answers = answers.apply(
        lambda result: {
            "alert_id": result["correlation_id"],
            "severity": result["result"]["severity"],
            "summary": result["result"]["summary"],
            "cost_usd": result["cost_usd"],
        }
    )
    answers.to_topic(summary)
    return app


if __name__ == "__main__":
    build_app().run()
