"""Offline replay: today's agent code against a recorded turn, with no Kafka and no model.

The recorded steps fill a journal that answers every durable call, and the turn runs
through the production executor (the same ``AgentContext``, ``ToolLoop`` and
``ToolCalls``), so the comparison is the one a worker makes when it resumes a turn after
a deploy. Nothing runs live (no model, memory store or MCP server is asked): a call the
recording does not have is itself a divergence.
The report names the first step where the code asks for something different (what
changed: system prompt, tools, messages, arguments, or another kind of call), or says the
turn replays cleanly.
"""

from __future__ import annotations

import asyncio
import glob
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.durable.journal import TurnJournal
from pyrula_stream.durable.turn import TurnRuntime, TurnTopics
from pyrula_stream.errors import ConfigurationError, ErrorCode, ReplayInputChanged
from pyrula_stream.llm.fake import FakeLLM
from pyrula_stream.objects.resolver import PayloadStores
from pyrula_stream.objects.urls import default_payloads
from pyrula_stream.runtime.closing import OFFLINE_CLOSERS
from pyrula_stream.runtime.execution import TurnExecutor
from pyrula_stream.runtime.options import WorkerOptions
from pyrula_stream.state.history import TurnRecording
from pyrula_stream.tools.cache import InProcessCacheStore
from pyrula_stream.wire.events import Event, EventRouting, decode_event
from pyrula_stream.wire.records import OutRecord
from pyrula_stream.wire.serde import JournalEntry, headers_dict

if TYPE_CHECKING:
    from pyrula_stream.mcp.pool import MCPPool

REPLAY_EVENTS = "replay.events"
REPLAY_JOURNAL = "replay.journal"
OFFLINE_RECORD_BYTES = 1 << 62
"""An offline replay's records never reach a broker: no size limit refuses them (a turn
whose values travelled by reference replays with them whole)."""


@dataclass
class ReplayReport:
    """What a replay found: ``clean``, or the first step that differs and how."""

    turn_id: str
    clean: bool
    message: str
    step: int | None = None
    detail: Any = None

    def __str__(self) -> str:
        return f"turn {self.turn_id}: {self.message}"


@dataclass
class RecordedJournal(TurnJournal):
    """A journal that holds only the recording: a step it lacks is a divergence, since
    offline nothing may run live."""

    used: set[int] = field(default_factory=set)

    def recorded(self, step: int, kind: str, name: str, input_hash: str) -> JournalEntry | None:
        if step not in self.steps:
            raise ReplayInputChanged(
                f"step {step}: the code now makes {kind} '{name}', which the recording does "
                f"not have (it has {len(self.steps)} steps)",
                detail={"step": step, "recorded": None, "live": [kind, name]},
            )
        self.used.add(step)
        return super().recorded(step, kind, name, input_hash)


class MemoryOutput:
    """A ``TurnOutput`` that keeps the turn's records in memory instead of committing."""

    def __init__(self) -> None:
        self.records: list[OutRecord] = []

    def add(self, turn: TurnRuntime, records: list[OutRecord]) -> None:
        self.records += records

    def durable(
        self, turn: TurnRuntime, records: list[OutRecord], *, urgent: bool = True
    ) -> asyncio.Future[None]:
        self.records += records
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def hurry(self) -> None:
        pass

    def room(self, waited_s: float) -> None:
        """Always room: nothing is committed."""
        return None

    def events(self) -> list[Event]:
        return [
            decode_event(r.value, headers_dict(list(r.headers)))
            for r in self.records
            if r.topic == REPLAY_EVENTS and r.value is not None
        ]


class OfflineMemory:
    """The ``MemoryBackend`` of a replay: every memory call takes its recorded answer
    (the ``RecordedJournal`` reports a call it lacks first), so no store is ever asked."""

    def _unreachable(self, *args: Any, **kwargs: Any) -> Any:
        raise ConfigurationError("offline replay has no memory store; this call was not recorded")

    put = get = delete = list = search = _unreachable


async def _no_topics(topic: str) -> bool:
    """Offline there is no Kafka: a sub-agent call the recording lacks cannot be made."""
    return False


async def replay_turn(
    agent: KafkaAgent, recording: TurnRecording, payloads: PayloadStores | None = None
) -> ReplayReport:
    """Run ``agent``'s current code against ``recording`` and report the first difference.
    Values the recording holds by reference are read through ``payloads`` (default:
    ``PYRULA_OBJECT_STORE``'s store)."""
    turn_id = recording.turn_id
    journal = RecordedJournal(turn_id, steps={s.step: s for s in recording.steps})
    output = MemoryOutput()
    runtime = TurnRuntime(
        request=recording.request,
        topics=TurnTopics(REPLAY_JOURNAL, EventRouting(REPLAY_EVENTS), 0),
        output=output,
        journal=journal,
        closers=OFFLINE_CLOSERS,
        thread=recording.thread_handle(),
        payloads=default_payloads(payloads),
        max_record_bytes=OFFLINE_RECORD_BYTES,
    )
    async with httpx.AsyncClient() as http:
        executor = TurnExecutor(
            agent,
            agent.llm or FakeLLM(),  # never called: every step comes from the recording
            http=http,
            cache=InProcessCacheStore(),
            options=WorkerOptions(),
            worker_id="replay",
            add_records=output.records.extend,
            load_recording=_recorded_original(recording),
            topic_exists=_no_topics,
            memory=OfflineMemory(),
            mcp_pool=_unconnected_pool(agent),
        )
        await executor.execute(runtime)
    terminal = next((e for e in reversed(output.events()) if e.is_terminal), None)
    if terminal is None:
        return ReplayReport(turn_id, False, "the code ended without a terminal event")
    if terminal.data.get("code") in (ErrorCode.REPLAY_INPUT_CHANGED, ErrorCode.VERSION_SKEW):
        detail = terminal.data.get("detail")
        step = detail.get("step") if isinstance(detail, dict) else None
        return ReplayReport(turn_id, False, terminal.data["message"], step, detail)
    recorded_code = recording.terminal.get("code")
    live_code = terminal.data.get("code")
    if live_code is not None and live_code != recorded_code:
        return ReplayReport(
            turn_id,
            False,
            f"the turn now ends with run:error {live_code}: {terminal.data.get('message')}",
            detail=terminal.data.get("detail"),
        )
    unused = sorted(set(journal.steps) - journal.used)
    if unused:
        return ReplayReport(
            turn_id,
            False,
            f"the code ended after step {max(journal.used, default=-1)}, but the recording "
            f"goes on to step {unused[-1]} ({len(unused)} recorded steps were not asked for)",
            unused[0],
        )
    if recording.terminal and recorded_code != live_code:
        return ReplayReport(
            turn_id,
            False,
            f"the turn now ends with {terminal.type} {live_code or ''}".rstrip()
            + f", the recording ended with {recording.terminal.get('type')} "
            f"{recorded_code or ''}".rstrip(),
        )
    return ReplayReport(turn_id, True, "replays cleanly")


def _unconnected_pool(agent: KafkaAgent) -> MCPPool | None:
    """MCP servers stay down: the journaled tool lists and calls answer for them."""
    if not agent.mcp_servers:
        return None
    from pyrula_stream.mcp.pool import MCPPool

    return MCPPool(agent.mcp_servers)


def _recorded_original(
    recording: TurnRecording,
) -> Callable[[str], Awaitable[TurnRecording | None]]:
    """A branch's recording holds the steps it took from its original, so it serves as
    the original when the branch is replayed."""

    async def load(turn_id: str) -> TurnRecording | None:
        return recording

    return load


async def replay_files(agent: KafkaAgent, pattern: str | Path) -> list[ReplayReport]:
    """Replay every recorded turn file matching ``pattern`` (a path or a glob)."""
    paths = sorted(glob.glob(str(pattern)))
    if not paths:
        raise ConfigurationError(
            f"no recorded turns match {str(pattern)!r}; export one with "
            "`pyrula-stream turn export TURN_ID > turn.json`"
        )
    return [await replay_turn(agent, TurnRecording.load(p)) for p in paths]
