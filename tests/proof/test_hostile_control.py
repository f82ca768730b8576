"""A control record no worker can read is skipped and counted; the worker keeps running.

Issue 46: a JSON string of 300 ``[`` on ``<agent>.control`` made the depth scan raise
``ValueError``, which passed ``ControlRequest.parse`` and ended the worker. Every worker
reads the control topic from its start, so each restart died on the same record.
"""

from __future__ import annotations

import json

from pyrula_stream import AgentContext, KafkaAgentClient, KafkaWorker, kafka_agent
from pyrula_stream.kafka.io import RecordProducer
from pyrula_stream.llm import FakeLLM
from pyrula_stream.observability.series import CounterChild
from pyrula_stream.testing import running_worker, unique_name, wait_for

JSON = [("content-type", b"application/json")]


async def test_a_control_record_of_brackets_does_not_stop_the_worker(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("control"), llm=FakeLLM(["fine"]), partitions=1)
    async def agent(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}])

    hostile = [
        json.dumps("[" * 300).encode(),
        json.dumps("{" * 300).encode(),
        json.dumps({"turn_id": "[" * 300}).encode(),  # no action
        json.dumps({"turn_id": "t" * 100_000, "action": "cancel"}).encode(),  # MAX_TURN_ID_CHARS
        json.dumps({"turn_id": "[" * 300, "action": "cancel"}).encode(),  # readable: kept
    ]
    producer = RecordProducer(kafka_bootstrap_servers)
    try:
        for restart in (False, True):  # the second worker reads them from the topic's start
            async with running_worker(agent, kafka_bootstrap_servers) as worker:
                skipped = worker.metrics.skipped_records.labels(agent.name, "control")

                def counted(worker: KafkaWorker = worker, skipped: CounterChild = skipped) -> bool:
                    return worker.done or skipped.value >= 4

                if not restart:
                    for value in hostile:
                        await producer.send(agent.topics.control, b"k", value, JSON)
                await wait_for(counted, 60, "control skips")
                assert not worker.done
                events = await client.run(agent.name, question="still there?", timeout=60)
                assert events[-1].type == "run:complete"
                assert not worker.done
                assert skipped.value == 4  # the readable one is remembered, not skipped
    finally:
        producer.close()
