"""A client forges sub-agent lineage, on a secured broker with the generated ACLs.

A client of agent F may write F's turns, so it can write a turn request whose lineage
headers name a parent (agent, turn, partition) exactly as ``call_agent`` would. Nothing
at intake tells it from a real call: the turn runs, and its reply is bound for the named
parent's replies topic, which F's worker may not write (F calls no one; F itself, or an
agent F's worker has no rules for at all). The broker refuses that record for
authorization: the turn ends at once with ``record_undeliverable``, the reply becomes a
dead letter on F's own DLQ naming the topic and the error, and the partition's valid
turn behind it completes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from pyrula_stream import AgentContext, KafkaAgentClient, WorkerOptions, kafka_agent
from pyrula_stream.agent.definition import AgentTopics
from pyrula_stream.cli import main as cli_main
from pyrula_stream.client.kafka_client import new_request
from pyrula_stream.kafka.admin import DEFAULT_PREFIX
from pyrula_stream.kafka.local.broker import LocalBroker
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import read_topic, running_worker, unique_name, wait_for
from pyrula_stream.wire.events import Event
from pyrula_stream.wire.lineage import Lineage


async def _events(client: KafkaAgentClient, agent: str, turn_id: str) -> list[Event]:
    async def read() -> list[Event]:
        return [e async for e in client.stream(agent, turn_id)]

    return await asyncio.wait_for(read(), 90)


def _forged(parent_agent: str, parent_turn: str) -> list[tuple[str, bytes]]:
    """Lineage headers as ``call_agent`` writes them, for a call the parent never made."""
    lineage = Lineage(
        root_turn_id=parent_turn,
        parent_turn_id=parent_turn,
        parent_agent=parent_agent,
        parent_prefix=DEFAULT_PREFIX,
        parent_partition=0,
        call_key="agent:forged#0",
        depth=1,
    )
    return lineage.headers()


async def test_a_forged_child_turn_is_dead_lettered_and_its_partition_flows(
    secured_broker: LocalBroker, tmp_path: Path
) -> None:
    name, other = unique_name("fchild"), unique_name("fparent")
    admin = tmp_path / "admin.properties"
    admin.write_text("".join(f"{k}={v}\n" for k, v in secured_broker.admin_settings().items()))
    common = ["--bootstrap-servers", secured_broker.bootstrap_servers, "--kafka-config", str(admin)]
    for agent in (name, other):
        assert cli_main(["topics", "apply", agent, "--partitions", "1", *common]) == 0
    grant = ["acls", name, "--worker-principal", "User:worker_f"]
    assert cli_main([*grant, "--client-principal", "User:client_f", "--apply", *common]) == 0
    assert secured_broker.security is not None
    settings = secured_broker.security.client_settings

    async def answer(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "hi"}])

    agent = kafka_agent(name=name, llm=FakeLLM(["ok"] * 10), partitions=1)(answer)
    options = WorkerOptions(shutdown_grace=0.2, worker_id="f1", kafka_config=settings("worker_f"))
    async with (
        running_worker(agent, secured_broker.bootstrap_servers, options),
        KafkaAgentClient(
            secured_broker.bootstrap_servers, kafka_config=settings("client_f"), timeout=30
        ) as client,
    ):
        # Its own replies topic (DESCRIBE, READ, no WRITE), then one it has no rules on.
        forged = []
        for parent in (name, other):
            request = new_request(name, None, None, None, {})
            handle = await client.submit_request(request, headers=_forged(parent, "p-1"))
            forged.append((handle.turn_id, AgentTopics.for_agent(parent).replies))
        valid = await client.submit(name)
        ends = [await _events(client, name, turn_id) for turn_id, _ in forged]
        valid_events = await _events(client, name, valid.turn_id)

    assert valid_events[-1].type == "run:complete", valid_events[-1].data
    for events in ends:
        assert events[-1].type == "run:error", events[-1].data
        assert events[-1].data["code"] == "record_undeliverable", events[-1].data

    def letters() -> dict[str, str]:
        found = read_topic(
            secured_broker.bootstrap_servers,
            AgentTopics.for_agent(name).dlq,
            kafka_config=secured_broker.admin_settings(),
        )
        return {h.get("pyrula.dlq.source", ""): h.get("pyrula.dlq.reason", "") for _, _, h in found}

    await wait_for(lambda: len(letters()) >= 2, 30, "both forged replies dead-lettered")
    by_source = letters()
    for _, topic in forged:
        reason = by_source[f"{topic}/0"]
        assert topic in reason and "TOPIC_AUTHORIZATION_FAILED" in reason, reason
    for _, topic in forged:  # the reply itself never reached the parent
        assert not read_topic(
            secured_broker.bootstrap_servers, topic, kafka_config=secured_broker.admin_settings()
        )
