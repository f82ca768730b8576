"""The tool loop: model call, tool dispatch, unknown tools, limits, result truncation.

Each model call and each tool call is a durable step of the turn (see ``durable/turn.py``), so a
replayed turn rebuilds the same conversation without calling the model or the tools again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyrula_stream.agent.as_tool import AgentTool
from pyrula_stream.agent.limits import (
    AgentLimits,
    Spend,
    bill,
    check_model_budget,
    check_tool_budget,
    check_wall_time,
)
from pyrula_stream.context.approvals import Question, QuestionPending, ask
from pyrula_stream.context.batch_calls import batch_factor
from pyrula_stream.context.compaction import compacted_history
from pyrula_stream.context.tool_calls import MAX_UNKNOWN_NAME, ToolCall, ToolCalls
from pyrula_stream.durable.journal import model_call_fingerprint, tools_fingerprint
from pyrula_stream.durable.steps import ModelSteps, StepData
from pyrula_stream.errors import (
    LLMError,
    LLMProviderUnavailable,
    LLMRateLimited,
    ProviderStreamTruncated,
    ToolRegistrationError,
)
from pyrula_stream.llm.base import (
    LLMClient,
    ModelRequest,
    ModelResponse,
    OutputFormat,
    TextBlock,
    TextDelta,
    ToolUseBlock,
)
from pyrula_stream.llm.tokens import RunningEstimate
from pyrula_stream.tools.contract import InvalidToolArguments, ToolCallable, check_bindable
from pyrula_stream.wire.events import LlmComplete, LlmDelta
from pyrula_stream.wire.fingerprint import RunningFingerprint
from pyrula_stream.wire.records import OutRecord
from pyrula_stream.wire.subagents import TurnParked

if TYPE_CHECKING:
    from pyrula_stream.context.agent_calls import AgentCalls
    from pyrula_stream.context.batch_calls import BatchCalls
    from pyrula_stream.mcp.discovery import MCPToolbox

PROVIDER_FAILURES = (ProviderStreamTruncated, LLMProviderUnavailable, LLMRateLimited, LLMError)
"""Provider failures that are journaled as the call's outcome (most specific first)."""

DELTA_FLUSH_SECONDS = 0.05
DELTA_FLUSH_CHARS = 512


@dataclass(frozen=True, slots=True)
class ToolResultBlock:
    """A tool's result as the model reads it (what ``ctx.llm.stream`` yields for tools)."""

    tool_use_id: str
    name: str
    content: str
    is_error: bool
    type: str = "tool_result"


class ToolLoop:
    """Runs the model's tool loop for one turn, every call journaled."""

    __slots__ = (
        "_last_run",
        "agent_calls",
        "batch",
        "last_answer",
        "limits",
        "llm",
        "mcp",
        "output_format",
        "output_instructions",
        "tool_calls",
        "tools",
        "turn",
    )  # one per turn in flight

    def __init__(
        self,
        turn: ModelSteps,
        llm: LLMClient,
        tools: Sequence[ToolCallable],
        limits: AgentLimits,
        tool_calls: ToolCalls,
        *,
        mcp: MCPToolbox | None = None,
        output_instructions: str | None = None,
        output_format: OutputFormat | None = None,
    ) -> None:
        self.turn = turn
        self.mcp = mcp
        self.llm = llm
        self.tools = list(tools)
        self.limits = limits
        self.tool_calls = tool_calls
        self.agent_calls: AgentCalls | None = None
        """Set by the executor: how a sub-agent offered as a tool is called."""
        self.batch: BatchCalls | None = None
        """Set by the executor for an agent with a batch lane: calls that may wait."""
        self.output_instructions = output_instructions
        self.output_format = output_format
        """The output schema for providers that take it natively (then not in the prompt)."""
        self.last_answer: str | None = None
        """The final text of the last ``run``: what output validation may send back."""
        self._last_run: tuple[list[dict[str, Any]], list[ToolCallable] | None, str | None, bool] = (
            [],
            None,
            None,
            True,
        )

    # -- public: what ctx.llm exposes -----------------------------------------------------

    def run(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: Sequence[ToolCallable] | None = None,
        system: str | None = None,
        history: bool = True,
    ) -> Coroutine[Any, Any, str]:
        """Run the loop until the model answers without tools; return its final text.

        A plain function handing back the loop's coroutine: a frame fewer held by each
        turn in flight (thousands wait in a model call at once)."""
        return self._run(list(messages), messages, tools, system, history)

    def ask_again(self, feedback: str) -> Coroutine[Any, Any, str]:
        """Continue the last ``run``'s conversation with ``feedback``; the new final text."""
        conversation, tools, system, history = self._last_run
        ask = {"role": "user", "content": feedback}
        return self._run([*conversation, ask], [ask], tools, system, history)

    async def _run(
        self,
        conversation: list[dict[str, Any]],
        new_input: list[dict[str, Any]],
        tools: Sequence[ToolCallable] | None,
        system: str | None,
        history: bool,
    ) -> str:
        """``_loop`` without its blocks: a coroutine, not an async generator and the frame
        that drives it, as ``run`` needs only the final text."""
        tokens = RunningEstimate()  # the conversation only grows: count each message once
        offered, system, earlier, added = await self._prepare(
            conversation, new_input, tools, system, history, tokens
        )
        running = RunningFingerprint()  # the conversation only grows: hash each message once
        while True:
            response = await self.model_call(
                earlier + conversation, offered, system, running=running, tokens=tokens
            )
            _append(response.as_message(), conversation, added)
            calls = response.tool_calls
            if not calls:
                break
            results = await self.dispatch(response, calls, offered)
            # Not held while the next call waits: the conversation has its message, and a
            # parsed response (three models, each with a dict and a field set) is ~1.5 KB.
            del response, calls
            _append(_results_message(results), conversation, added)
            del results
        self._last_run = (conversation, None if tools is None else list(tools), system, history)
        self.last_answer = response.text
        return response.text

    def stream(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: Sequence[ToolCallable] | None = None,
        system: str | None = None,
        history: bool = True,
    ) -> AsyncIterator[TextBlock | ToolUseBlock | ToolResultBlock | ModelResponse]:
        """The same loop as an iterator: content blocks as they complete, and each response.

        In a thread the earlier turns' messages go first (unless ``history=False``); what
        this call adds (the body's messages, responses, tool results) joins the thread
        when the turn completes.
        """
        return self._loop(
            list(messages), list(messages), tools=tools, system=system, history=history
        )

    async def _loop(
        self,
        conversation: list[dict[str, Any]],
        new_input: list[dict[str, Any]],
        *,
        tools: Sequence[ToolCallable] | None,
        system: str | None,
        history: bool,
    ) -> AsyncIterator[TextBlock | ToolUseBlock | ToolResultBlock | ModelResponse]:
        """The loop, appending each response and tool result to ``conversation`` (and to
        the thread's new messages, with ``new_input`` first)."""
        tokens = RunningEstimate()  # the conversation only grows: count each message once
        offered, system, earlier, added = await self._prepare(
            conversation, new_input, tools, system, history, tokens
        )
        running = RunningFingerprint()  # the conversation only grows: hash each message once
        while True:
            response = await self.model_call(
                earlier + conversation, offered, system, running=running, tokens=tokens
            )
            _append(response.as_message(), conversation, added)
            for block in response.content:
                yield block
            yield response
            calls = response.tool_calls
            if not calls:
                return
            results = await self.dispatch(response, calls, offered)
            del response, calls  # as in ``_run``: not held while the next call waits
            _append(_results_message(results), conversation, added)
            for r in results:
                yield r

    async def _prepare(
        self,
        conversation: list[dict[str, Any]],
        new_input: list[dict[str, Any]],
        tools: Sequence[ToolCallable] | None,
        system: str | None,
        history: bool,
        tokens: RunningEstimate | None = None,
    ) -> tuple[list[ToolCallable], str | None, list[dict[str, Any]], list[dict[str, Any]] | None]:
        """What a loop starts from: the tools offered (checked), the system prompt, the
        thread's earlier messages and the list of what joins the thread (``None``: no
        thread, nothing kept)."""
        offered = list(self.tools if tools is None else tools)
        if tools is None and self.mcp is not None:  # MCP: discovered tools beside the @tools
            offered += await self.mcp.tools()
        for t in offered:  # tools passed at run time get the bind-time refusals too
            try:
                check_bindable(
                    t,
                    agent_name=self.turn.agent,
                    human_in_the_loop=self.tool_calls.human_in_the_loop,
                )
            except ToolRegistrationError as exc:
                raise self.turn.refuse(exc) from None
        if self.output_instructions:
            system = (
                f"{system}\n\n{self.output_instructions}" if system else self.output_instructions
            )
        thread = self.turn.thread
        # What joins the thread when the turn completes; a turn without one keeps nothing.
        added = self.turn.thread_messages if thread is not None else None
        earlier: list[dict[str, Any]] = []
        if thread is not None and history:
            earlier = await compacted_history(
                self.turn,
                self.limits,
                self.llm,
                thread.messages,
                conversation,
                system,
                [t.definition() for t in offered],
                tokens,
                conversation_cache_key(self.turn),
            )
        if added is not None:
            added += new_input
        return offered, system, earlier, added

    # -- model calls ----------------------------------------------------------------------

    async def model_call(
        self,
        messages: list[dict[str, Any]],
        offered: list[ToolCallable],
        system: str | None,
        *,
        running: RunningFingerprint | None = None,
        tokens: RunningEstimate | None = None,
    ) -> ModelResponse:
        turn = self.turn
        if turn.branch is not None and turn.branch.system is not None:
            system = turn.branch.system  # a branch that changes the system prompt
        index = turn.model_calls
        turn.model_calls += 1
        definitions = [t.definition() for t in offered]
        input_hash = model_call_fingerprint(
            messages,
            system,
            tools_fingerprint(
                definitions,
                lambda: [
                    {"name": d.name, "description": d.description, "schema": d.input_schema}
                    for d in definitions
                ],
            ),
            None
            if self.output_format is None
            else {"name": self.output_format.name, "schema": self.output_format.schema},
            running=running,
        )

        live_response: list[ModelResponse] = []
        """The live call's response, with the values of the JSON the journal records (so
        a live turn and its replay continue from the same values)."""

        cost_before = turn.spend.cost_usd
        with turn.telemetry.model_call(self.llm) as observed:
            # ``durable_step`` in two halves around the live call, awaited here: a frame
            # fewer per turn waiting on its model.
            step, recorded = turn.replayed_step("llm", "llm", input_hash)
            replayed = recorded is not None
            if recorded is not None:
                data = recorded
            else:
                request = ModelRequest(
                    messages,
                    definitions,
                    system,
                    output_format=self.output_format,
                    tokens=tokens,
                    cache_key=conversation_cache_key(turn),
                )
                batched = None
                if self.batch is not None and self.batch.applies():
                    batched = self.batch.call(index, step, input_hash, request, self._checks)
                    if batched is not None and "response" in batched:
                        live_response.append(ModelResponse.model_validate(batched["response"]))
                if batched is None:
                    data = await self._live_call(index, request, live_response)
                else:
                    data = batched
                records = _LiveCallRecords(self, index, live_response)  # made only now
                turn.record_step(
                    step, "llm", "llm", input_hash, data, records.events, records.usage
                )
            response = None
            if "error" not in data:
                response = (
                    ModelResponse.model_validate(data["response"]) if replayed else live_response[0]
                )
            observed.recorded(data, replayed, turn.spend.cost_usd - cost_before, response)
        if response is None:
            failure = {cls.__name__: cls for cls in PROVIDER_FAILURES}[data["error"]["type"]]
            raise failure(data["error"]["message"])
        if replayed:
            bill(turn.spend, response, self.limits, self.llm.model, _price_factor(data))
        return response

    def _checks(self, request: ModelRequest) -> None:
        """What a live call checks before it goes out, for a call queued on the batch lane
        instead: the wall time, the turn's budget and its tenant's quotas."""
        turn = self.turn
        check_wall_time(self.limits, turn.started_ms)
        check_model_budget(
            self.limits,
            turn.spend,
            self.llm.model,
            request.messages,
            request.system,
            request.tools,
            request.tokens,
        )
        if turn.meter is not None:
            turn.meter.before_model_call()

    async def _live_call(
        self, index: int, request: ModelRequest, parsed: list[ModelResponse]
    ) -> StepData:
        """Call the provider, coalescing text deltas into ``llm:delta`` events; the step's
        data, with the response into ``parsed`` as the JSON the journal records gives it
        back (so a live turn and its replay continue from the same values).

        Past the commit buffer's bound a slow call waits for room before its first
        write: thousands of calls that return together then do not build all their
        records at once. The checks, the stream and the record in one coroutine (no closure, no
        streaming helper): thousands of turns wait here at once, each holding its
        frames."""
        turn = self.turn
        check_wall_time(self.limits, turn.started_ms)
        check_model_budget(
            self.limits,
            turn.spend,
            self.llm.model,
            request.messages,
            request.system,
            request.tools,
            request.tokens,
        )
        if turn.meter is not None:  # the tenant's token and cost caps, group-wide
            turn.meter.before_model_call()
        pending: list[str] = []
        pending_chars = 0
        called = last_flush = time.monotonic()
        final: ModelResponse | None = None
        gated: Awaitable[None] | None = None
        """What ``room`` said when the call last had to wait for it: a call waits once at
        most, so a turn let go writes its records up to its next commit."""
        try:
            async for item in self.llm.stream_request(request):
                if isinstance(item, TextDelta):
                    pending.append(item.text)
                    pending_chars += len(item.text)
                    if (
                        pending_chars >= DELTA_FLUSH_CHARS
                        or time.monotonic() - last_flush >= DELTA_FLUSH_SECONDS
                    ):
                        if gated is None:
                            gated = turn.output.room(time.monotonic() - called)
                            if gated is not None:  # the commit buffer is full
                                await gated
                        self._flush_deltas(index, pending)
                        pending_chars, last_flush = 0, time.monotonic()
                else:
                    final = item
            if gated is None:
                gated = turn.output.room(time.monotonic() - called)
                if gated is not None:
                    await gated
            self._flush_deltas(index, pending)
            if final is None:
                raise ProviderStreamTruncated(
                    f"{self.llm.describe()} stream ended without a complete response"
                )
        except PROVIDER_FAILURES as exc:
            # Journaled, so a replay raises the same failure instead of calling again.
            return {"call": index, "error": {"type": type(exc).__name__, "message": exc.message}}
        recorded = final.model_dump(mode="json")
        same = _same_as_recorded(final, recorded)
        parsed.append(final if same else ModelResponse.model_validate(recorded))
        return {"call": index, "response": recorded}

    def _flush_deltas(self, index: int, pending: list[str]) -> None:
        """The text gathered since the last flush as one ``llm:delta`` event."""
        if pending:
            self.turn.emit(LlmDelta(index, "".join(pending)))
            pending.clear()

    # -- tools ----------------------------------------------------------------------------

    async def dispatch(
        self, response: ModelResponse, calls: list[ToolUseBlock], offered: list[ToolCallable]
    ) -> list[ToolResultBlock]:
        """Run one response's tool calls concurrently (a lone call inline); results in the
        order the model asked.

        If one call fails the turn (``Poison``, a result that cannot be encoded or is too
        large), the others are cancelled and awaited before the error goes on, so none of
        them writes anything after the turn's terminal record.
        """
        turn = self.turn
        index = turn.model_calls - 1
        check_tool_budget(self.limits, turn.spend, len(calls))
        turn.spend.tool_calls += len(calls)
        first = turn.allocate_steps(len(calls))
        by_name = {t.name: t for t in offered}
        names = tuple(by_name)
        # A lone call has nothing to wait for: no gate (a Semaphore per step is not free).
        gate = (
            asyncio.Semaphore(max(1, self.limits.max_parallel_tool_calls))
            if len(calls) > 1
            else None
        )
        # Sub-agents offered as tools take two steps (call, reply): a second range, so the
        # indices stay the same on replay whatever order the calls finish in.
        agents = any(isinstance(by_name.get(c.name), AgentTool) for c in calls)
        replies = turn.allocate_steps(len(calls)) if agents else 0
        parked: list[str] = []
        questions: list[tuple[int, Question]] = []

        async def one(j: int, call: ToolUseBlock) -> ToolResultBlock:
            target = by_name.get(call.name)
            if isinstance(target, AgentTool) and self.agent_calls is not None:
                block = await self._agent_tool(
                    target, call, f"{index}.{j}", first + j, replies + j, parked
                )
                if block is not None:
                    return block
            request = ToolCall(
                call_key=f"{index}.{j}",
                name=call.name,
                arguments=call.input,
                tool=by_name.get(call.name),
                offered=names,
                tool_use_id=call.id,
                step=first + j,
            )
            try:
                if gate is None:
                    data = await self.tool_calls.run(request)
                else:
                    async with gate:
                        data = await self.tool_calls.run(request)
            except QuestionPending as pending:  # asked after the batch, in call order
                questions.append((j, pending.question))
                return ToolResultBlock(call.id, call.name, "", False)
            return ToolResultBlock(
                call.id,
                call.name[:MAX_UNKNOWN_NAME],
                self.tool_calls.model_text(data),
                data["status"] != "ok",
            )

        if len(calls) == 1:  # nothing to run beside it: no task, no group
            results = [await one(0, calls[0])]
        else:
            try:
                async with asyncio.TaskGroup() as group:
                    tasks = [group.create_task(one(j, c)) for j, c in enumerate(calls)]
            except BaseExceptionGroup as failed:
                raise _first_error(failed) from None
            results = [t.result() for t in tasks]
        if questions:  # one gated call at a time: the first in call order asks
            park = ask(turn, min(questions, key=lambda q: q[0])[1])
            park.children = tuple(parked)
            raise park
        if parked:  # after the batch's other calls ended and were journaled
            raise TurnParked(tuple(parked))
        return results

    async def _agent_tool(
        self,
        target: AgentTool,
        call: ToolUseBlock,
        key: str,
        call_step: int,
        reply_step: int,
        parked: list[str],
    ) -> ToolResultBlock | None:
        """A model's call of a sub-agent tool: a ``call_agent`` with the batch's step
        indices; ``None`` for invalid arguments (the tool path reports them)."""
        assert self.agent_calls is not None
        try:
            params = target.validate_arguments(call.input)
        except InvalidToolArguments:
            return None
        child = await self.agent_calls.start(target.agent, params, id=f"tool:{key}", step=call_step)
        if child[1] not in self.turn.journal.replies:
            parked.append(child[1])
            return ToolResultBlock(call.id, call.name, "", False)
        reply = await self.agent_calls.take(child, step=reply_step)
        if reply.status == "completed":
            text = reply.result if isinstance(reply.result, str) else json.dumps(reply.result)
            return ToolResultBlock(call.id, call.name, text, False)
        text = f"sub-agent '{reply.agent}' failed ({reply.code}): {reply.message}"
        return ToolResultBlock(call.id, call.name, text, True)


def conversation_cache_key(turn: ModelSteps) -> str:
    """The prompt cache key of the turn's conversation: its agent and thread (the turn,
    without one), hashed so no id reaches the provider, and stable across the turn's
    steps and the thread's turns."""
    thread = turn.thread
    conversation = f"thread:{thread.thread_id}" if thread is not None else f"turn:{turn.turn_id}"
    digest = hashlib.sha256(f"{turn.agent}\0{conversation}".encode()).hexdigest()
    return f"pyrula-{digest[:32]}"


def _same_as_recorded(response: ModelResponse, recorded: dict[str, Any]) -> bool:
    """Whether ``response`` holds the values its JSON (``recorded``) gives back, so the
    live turn may go on with it as it is. Only a tool call's input can hold others (a
    custom client's tuple, datetime or integer key); the rest are strings and numbers."""
    for block, dumped in zip(response.content, recorded["content"], strict=True):
        if isinstance(block, ToolUseBlock) and block.input != dumped["input"]:
            return False
    return True


class _LiveCallRecords:
    """What a live model call's step commits beside its entry: ``llm:complete`` (which
    bills the turn) and the tenant's usage (never replayed). Made once the call returns,
    so none of the thousands of calls in flight holds it while it waits."""

    __slots__ = ("index", "loop", "response")

    def __init__(self, loop: ToolLoop, index: int, response: list[ModelResponse]) -> None:
        self.loop = loop
        self.index = index
        self.response = response
        """The live call's parsed response (empty if the call failed)."""

    def events(self, data: StepData) -> list[LlmComplete]:
        if "error" in data:
            return []
        loop, turn, response = self.loop, self.loop.turn, self.response[0]
        factor = _price_factor(data)
        bill(turn.spend, response, loop.limits, loop.llm.model, factor)
        if factor != 1.0:
            _saved(loop, response, factor)
        turn.telemetry.tenant_prompt(response.usage)  # the tenant's cached fraction
        return [
            LlmComplete(
                call=self.index,
                model=response.model,
                text=response.text,
                tool_calls=[
                    {"id": c.id, "name": c.name, "input": c.input} for c in response.tool_calls
                ],
                stop_reason=response.stop_reason,
                usage=response.usage.as_dict(),
                total=turn.spend.as_dict(),
                batch=data.get("batch"),
            )
        ]

    def usage(self, data: StepData) -> list[OutRecord]:
        loop, turn = self.loop, self.loop.turn
        if turn.meter is None or "error" in data:
            return []
        call = Spend()
        bill(call, self.response[0], loop.limits, loop.llm.model, _price_factor(data))
        turn.telemetry.tenant_used(call.billed_tokens)
        return turn.meter.model_used(self.index, call.billed_tokens, call.cost_usd)


def _price_factor(data: StepData) -> float:
    """What a model call's step is billed at: its provider's batch price when it went by
    batch (``batch_factor``)."""
    batch = data.get("batch")
    return batch_factor(batch.get("provider")) if isinstance(batch, dict) else 1.0


def _saved(loop: ToolLoop, response: ModelResponse, factor: float) -> None:
    """Count what a batch call saved against its live price (priced models only)."""
    metrics = loop.turn.telemetry.metrics
    if metrics is None:
        return
    live = Spend()
    bill(live, response, loop.limits, loop.llm.model)
    metrics.batch.saved(live.cost_usd * (1.0 - factor))


def _append(
    message: dict[str, Any], conversation: list[dict[str, Any]], added: list[dict[str, Any]] | None
) -> None:
    """One message joins the conversation and (in a thread) the thread's new messages:
    one copy, shared by both."""
    conversation.append(message)
    if added is not None:
        added.append(message)


def _results_message(results: list[ToolResultBlock]) -> dict[str, Any]:
    """One response's tool results as the user message the model reads next."""
    return {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": r.tool_use_id,
                "content": r.content,
                "is_error": r.is_error,
            }
            for r in results
        ],
    }


def _first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first error of a failed batch (nested groups flattened)."""
    first = group.exceptions[0]
    return _first_error(first) if isinstance(first, BaseExceptionGroup) else first
