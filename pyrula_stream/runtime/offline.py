"""One turn run offline: today's code on a live model, with no Kafka.

What ``evals offline --golden`` runs for each case of a golden set and each version: the
production executor (the same ``AgentContext``, tool loop and tool calls as a worker)
on a fresh journal, so every model and tool call runs live, and the turn's records are
kept in memory rather than committed. Nothing is shared with a cluster: an agent that
uses the memory store or calls sub-agents cannot run offline, and says so.
"""

from __future__ import annotations

import contextlib
import dataclasses

import httpx

from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.durable.journal import TurnJournal
from pyrula_stream.durable.turn import TurnRuntime, TurnTopics
from pyrula_stream.errors import ConfigurationError
from pyrula_stream.llm.fake import FakeLLM
from pyrula_stream.runtime.closing import OFFLINE_CLOSERS
from pyrula_stream.runtime.execution import TurnExecutor
from pyrula_stream.runtime.options import WorkerOptions
from pyrula_stream.runtime.replay import REPLAY_EVENTS, REPLAY_JOURNAL, MemoryOutput, OfflineMemory
from pyrula_stream.runtime.versions import body_for, known_versions
from pyrula_stream.tools.cache import InProcessCacheStore
from pyrula_stream.wire.events import Event, EventRouting
from pyrula_stream.wire.serde import TurnRequest


def at_version(agent: KafkaAgent, version: str | None) -> KafkaAgent:
    """``agent`` running ``version``'s body for every turn (``None``: its current one)."""
    if version is None or version == agent.version:
        return dataclasses.replace(agent, experiment=None)
    body = body_for(agent, version)
    if body is None or agent.version_behavior != "pinned":
        raise ConfigurationError(
            f"agent {agent.name!r} has no version {version!r} (it has "
            f"{known_versions(agent) or 'no named versions'})"
        )
    return dataclasses.replace(agent, fn=body, version=version, versions={}, experiment=None)


async def _no_topics(topic: str) -> bool:
    return False


async def run_offline(
    agent: KafkaAgent, request: TurnRequest, *, http: httpx.AsyncClient | None = None
) -> list[Event]:
    """Run one turn of ``agent`` to its end, offline; its events, terminal one last.
    ``http`` is the tools' client (one for many turns: making one loads the CA store)."""
    if agent.mcp_servers:
        raise ConfigurationError(
            f"agent {agent.name!r} uses MCP servers; offline runs have none (score its "
            "recorded turns instead, or run the versions as an experiment)"
        )
    output = MemoryOutput()
    runtime = TurnRuntime(
        request=request,
        topics=TurnTopics(REPLAY_JOURNAL, EventRouting(REPLAY_EVENTS), 0),
        output=output,
        journal=TurnJournal(request.turn_id),
        closers=OFFLINE_CLOSERS,
        thread=None,
    )
    async with contextlib.AsyncExitStack() as stack:
        if http is None:
            http = await stack.enter_async_context(httpx.AsyncClient())
        executor = TurnExecutor(
            agent,
            agent.llm or FakeLLM(),
            http=http,
            cache=InProcessCacheStore(),
            options=WorkerOptions(),
            worker_id="offline",
            add_records=output.records.extend,
            load_recording=None,
            topic_exists=_no_topics,
            memory=OfflineMemory(),
            mcp_pool=None,
        )
        await executor.execute(runtime)
    return output.events()
