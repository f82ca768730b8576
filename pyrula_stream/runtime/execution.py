"""Running one turn's agent body to its end.

Before a rerun it decides whether the turn is poison (attempts without progress); then it
journals the start, runs the body with an ``AgentContext`` whose durable calls replay the
journal, and publishes exactly one terminal event: ``run:complete`` or ``run:error``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from pydantic import ValidationError

from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.agent.output import OutputSpec
from pyrula_stream.context.agent_calls import AgentCalls, inherited_limits
from pyrula_stream.context.agent_context import AgentContext
from pyrula_stream.context.batch_calls import BatchCalls
from pyrula_stream.context.memory_calls import AgentMemory
from pyrula_stream.context.tool_calls import ToolCalls
from pyrula_stream.context.tool_loop import ToolLoop
from pyrula_stream.durable.branch import Branch, branch_of
from pyrula_stream.durable.steps import StepData
from pyrula_stream.durable.turn import TurnRuntime
from pyrula_stream.errors import ErrorCode, Poison, PyrulaError, VersionUnavailable
from pyrula_stream.kafka.stores.memory import KafkaMemory
from pyrula_stream.kafka.transactions import writer_record_room
from pyrula_stream.llm.base import LLMClient
from pyrula_stream.mcp.discovery import MCPToolbox
from pyrula_stream.mcp.pool import MCPPool
from pyrula_stream.runtime.options import WorkerOptions
from pyrula_stream.runtime.versions import body_for, known_versions, turn_version
from pyrula_stream.state.history import TurnRecording
from pyrula_stream.state.memory import MemoryBackend
from pyrula_stream.state.threads import is_thread_delete
from pyrula_stream.tools.cache import CacheStore
from pyrula_stream.tools.contract import encode_result
from pyrula_stream.tools.deadlines import Deadline
from pyrula_stream.wire import serde
from pyrula_stream.wire.events import RunComplete, RunDeferred, RunError, RunStart
from pyrula_stream.wire.records import OutRecord, dead_letter, request_headers
from pyrula_stream.wire.serde import TurnRequest
from pyrula_stream.wire.subagents import Park, TurnParked

log = logging.getLogger(__name__)


class TurnExecutor:
    """Runs turns of one agent; shared by every turn of a worker."""

    def __init__(
        self,
        agent: KafkaAgent,
        llm: LLMClient,
        *,
        http: httpx.AsyncClient,
        cache: CacheStore,
        options: WorkerOptions,
        worker_id: str,
        add_records: Callable[[list[OutRecord]], None],
        topic_exists: Callable[[str], Awaitable[bool]],
        mcp_pool: MCPPool | None = None,
        load_recording: Callable[[str], Awaitable[TurnRecording | None]] | None = None,
        memory: MemoryBackend | None = None,
        backlog: Callable[[], int] = lambda: 0,
    ) -> None:
        self.topic_exists = topic_exists
        self.backlog = backlog
        """Turns read and not finished on this worker: what ``BatchLane(when="lag")`` reads."""
        self.agent = agent
        self.memory = memory
        self.mcp_pool = mcp_pool
        self.llm = llm
        self.http = http
        self.cache = cache
        self.options = options
        self.worker_id = worker_id
        self.add_records = add_records
        self.load_recording = load_recording

    async def finish_duplicate(self, runtime: TurnRuntime, original: str) -> None:
        """Another turn already took this idempotency key: point the submitter at it."""
        key = runtime.request.idempotency_key
        await runtime.finish(
            RunError(
                code=ErrorCode.DUPLICATE_RUN,
                message=f"idempotency key {key!r} already ran as turn {original}; "
                "read that turn's events for its result",
                original_turn_id=original,
            )
        )

    async def execute(self, runtime: TurnRuntime) -> None:
        """Run the agent body once (replaying what the journal holds) and finish the turn."""
        if is_thread_delete(runtime.request):  # a delete only tombstones, in the thread's order
            deleted = len(runtime.thread.turns) if runtime.thread is not None else 0
            await runtime.finish(RunComplete({"deleted_turns": deleted}, {}))
            return
        journal = runtime.journal
        if runtime.attempt > 1 and not runtime.resumed:
            progressed = journal.progress is not None and int(
                journal.progress.data.get("steps_at_start", -1)
            ) != len(journal.steps)
            fresh = journal.progress is not None and (
                time.time() * 1000 - journal.progress.ts_ms > self.options.poison.retry_ttl_s * 1000
            )
            stalled = 0 if progressed or fresh else journal.stalled_attempts + 1
            if stalled >= self.options.poison.max_retries:
                await self.quarantine(runtime, f"{stalled} attempts made no progress")
                return
            await runtime.begin_attempt(stalled)
        try:
            if await self._over_quota(runtime):
                return
            # The body is awaited here, not in a helper: a frame fewer per turn in flight.
            body, ctx, loop = await self._start_body(runtime)
            try:
                async with Deadline(self.agent.timeout):
                    result = await body(ctx, **runtime.body_params)
            except Exception as exc:
                if runtime.refusal is not None and exc is not runtime.refusal:
                    raise runtime.refusal from exc
                raise
            await self._finish_body(runtime, loop, result)
        except TurnParked as wait:
            await runtime.park(
                Park(
                    runtime.request,
                    wait.children,
                    wait.wake_at_ms,
                    wait.signals,
                    wait.question,
                    wait.batch,
                )
            )
        except asyncio.CancelledError:
            raise
        except Poison as exc:
            await self.quarantine(runtime, f"tool raised Poison: {exc.message}")
        except TimeoutError:
            await runtime.finish(
                RunError(
                    code=ErrorCode.TURN_TIMEOUT,
                    message=f"turn exceeded the agent timeout of {self.agent.timeout}s",
                )
            )
        except PyrulaError as exc:
            await runtime.finish(RunError.of(exc))
        except TypeError as exc:
            bad_params = "argument" in str(exc)
            await runtime.finish(
                RunError(
                    code=ErrorCode.INVALID_REQUEST if bad_params else ErrorCode.AGENT_ERROR,
                    message=f"{type(exc).__name__}: {exc}",
                )
            )
        except Exception as exc:
            log.exception("turn %s failed", runtime.turn_id)
            await runtime.finish(
                RunError(code=ErrorCode.AGENT_ERROR, message=f"{type(exc).__name__}: {exc}")
            )

    async def _start_body(
        self, runtime: TurnRuntime
    ) -> tuple[Callable[..., Awaitable[Any]], AgentContext, ToolLoop]:
        """Journal the start; the body to run, its context and the turn's tool loop."""
        request = runtime.request
        version = runtime.version = turn_version(self.agent, runtime.journal, request)
        body = body_for(self.agent, version)
        if body is None:  # the worker hands such turns on; this is the last line of defence
            raise VersionUnavailable(
                f"turn started on version {version!r}; this worker has "
                f"{known_versions(self.agent)}: keep that body in @kafka_agent(versions=...)"
            )
        running = version if self.agent.version_behavior == "pinned" else self.agent.version
        if running is not None:  # events carry the version of the code that publishes them
            runtime.events.common["version"] = running
        parent = branch_of(request)
        if parent is not None:
            runtime.events.common["branch_of"] = parent
            original = await self.load_recording(parent) if self.load_recording else None
            runtime.branch = Branch.of(request, original)
            runtime.branch.prefill(runtime.journal)
            if runtime.thread is None and original is not None:  # its thread, as it was
                runtime.thread = original.thread_handle()
        await runtime.resolve_recorded()  # values stored by reference, before any replay
        meter = runtime.meter
        data, _ = await runtime.durable_step(
            "start",
            "start",
            "",
            self._start_data(request, runtime, version),
            lambda d: [_run_start(d)],
            effects=(lambda _: meter.turn_started()) if meter is not None else None,
        )
        # The wall-time budget counts from the first attempt's start, on any worker.
        runtime.started_ms = int(data.get("started_ms") or time.time() * 1000)
        limits = inherited_limits(self.agent.limits, request.lineage)
        tool_calls = ToolCalls(
            runtime,
            limits,
            http=self.http,
            deps=self.agent.deps,
            cache_store=self.cache,
            human_in_the_loop=self.agent.human_in_the_loop,
        )
        llm = self.llm if runtime.branch is None else runtime.branch.llm(self.llm)
        output = self.agent.output
        native = output.native_format() if output is not None else None
        if not llm.accepts_keyword("output_format"):
            native = None
        prompted = output is not None and not output.is_text and native is None
        loop = ToolLoop(
            runtime,
            llm,
            self.agent.tools,
            limits,
            tool_calls,
            mcp=self._mcp_toolbox(runtime),
            output_instructions=output.instructions() if output is not None and prompted else None,
            output_format=native,
        )
        agent_calls = AgentCalls(
            runtime,
            limits,
            prefix=self.agent.prefix,
            max_record_bytes=runtime.max_record_bytes,
            topic_exists=self.topic_exists,
        )
        loop.agent_calls = agent_calls
        if self.agent.batch is not None:
            loop.batch = BatchCalls(runtime, self.agent.batch, self.backlog)
        memory = None
        if isinstance(self.memory, KafkaMemory):  # writes ride the turn's transaction
            memory = AgentMemory(runtime, self.memory, record_for=self.memory.record)
        elif self.memory is not None:
            memory = AgentMemory(runtime, self.memory)
        ctx = AgentContext(
            runtime,
            loop,
            tool_calls,
            agent_calls,
            deps=self.agent.deps,
            durable_timer_after_s=self.options.durable_timer_after_s,
            memory=memory,
        )
        return body, ctx, loop

    async def _finish_body(self, runtime: TurnRuntime, loop: ToolLoop, result: Any) -> None:
        """Finish with the body's result (or raise what ends the turn instead)."""
        output = self.agent.output
        if runtime.refusal is not None:  # a Kafka limit the body caught still ends the turn
            raise runtime.refusal
        runtime.raise_if_cancelled()
        if output is None:
            value = _jsonable(result, self.agent.name)
        else:
            value = await self._validated(output, loop, result)
        await runtime.finish(RunComplete(value, runtime.spend.as_dict()))

    async def _over_quota(self, runtime: TurnRuntime) -> bool:
        """Before a turn starts (not once it has): whether its tenant is over a quota.
        Then it is deferred (``run:deferred``, parked with a durable timer until the
        window has room) or, with ``on_quota="fail"``, ends with ``budget_exceeded``."""
        meter = runtime.meter
        if meter is None or runtime.journal.steps.get(0) is not None:
            return False
        deferral = meter.admission()
        if deferral is None:
            return False
        if meter.on_quota == "fail":
            await runtime.finish(
                RunError(
                    code=ErrorCode.BUDGET_EXCEEDED,
                    message=f"tenant {deferral.tenant!r} reached its {deferral.reason}",
                    error_type="BudgetExceeded",
                    detail={
                        "reason": "tenant_quota",
                        "limit": deferral.reason,
                        "tenant": deferral.tenant,
                    },
                )
            )
            return True
        runtime.telemetry.deferred(deferral.reason)
        runtime.emit(RunDeferred(deferral.reason, deferral.tenant, deferral.resume_at_ms))
        raise TurnParked(wake_at_ms=deferral.resume_at_ms)

    def _mcp_toolbox(self, runtime: TurnRuntime) -> MCPToolbox | None:
        """MCP: the turn's view of the agent's servers (discovered on first use)."""
        if not self.agent.mcp_servers or self.mcp_pool is None:
            return None
        names = [t.name for t in self.agent.tools]
        return MCPToolbox(runtime, self.mcp_pool, self.agent.mcp_servers, reserved_names=names)

    async def _validated(self, output: OutputSpec, loop: ToolLoop, result: Any) -> Any:
        """The result checked against ``output_type``; the model's own answer that fails
        is sent back with the error (each retry a journaled model call, so it replays)."""
        attempts = 1
        while True:
            try:
                return output.validate(result)
            except ValidationError as exc:
                is_model_answer = isinstance(result, str) and result == loop.last_answer
                if not is_model_answer or attempts > self.agent.output_retries:
                    raise output.failure(exc, attempts) from None
                attempts += 1
                result = await loop.ask_again(output.feedback(exc))

    def _start_data(self, request: TurnRequest, runtime: TurnRuntime, version: str | None) -> Any:
        async def live() -> StepData:
            data: StepData = {
                "params": request.params,
                "metadata": request.metadata,
                "thread_id": request.thread_id,
                "worker": self.worker_id,
                "started_ms": int(time.time() * 1000),
                "trace": runtime.telemetry.trace,  # a resumed turn continues this trace
            }
            if version is not None:
                data["version"] = version
            if request.tenant is not None:  # what `status` says of a running turn
                data["tenant"] = request.tenant
            if request.lineage is not None:  # who called: from headers, not metadata
                lineage = request.lineage
                data["parent"] = {
                    "agent": lineage.parent_agent,
                    "turn_id": lineage.parent_turn_id,
                }
            return data

        return live

    async def quarantine(self, runtime: TurnRuntime, reason: str) -> None:
        req = runtime.request
        self.add_records(
            [
                dead_letter(
                    self.agent.topics.dlq,
                    reason,
                    ErrorCode.POISON_QUARANTINE,
                    worker=self.worker_id,
                    key=req.key.encode(),
                    value=serde.encode("turn_request", req),
                    headers=request_headers(req),
                    max_bytes=writer_record_room(
                        self.options.kafka_config, self.options.producer_config
                    ),
                )
            ]
        )
        await runtime.finish(
            RunError(code=ErrorCode.POISON_QUARANTINE, message=f"turn quarantined: {reason}")
        )


def _run_start(data: StepData) -> RunStart:
    return RunStart(
        params=data["params"],
        metadata=data["metadata"],
        thread_id=data["thread_id"],
        worker=data["worker"],
        started_ms=int(data.get("started_ms") or 0),
        parent=data.get("parent"),
    )


def _jsonable(value: Any, agent: str) -> Any:
    """The agent's return value as JSON data (pydantic models dumped)."""
    return json.loads(encode_result(value, agent)) if not isinstance(value, str) else value
