"""Long turns: the worker's CPU per step for turns of 20, 200 and 1,000 steps, with a
context window set (so every model call is checked against it, as a user's long turn is).

A step is a model call asking for ``lookup_order`` and the tool call; a turn of N steps
then answers with one more model call. The conversation grows by two messages a step,
so anything the worker redoes over the whole conversation on each call (encoding it,
estimating its tokens, copying it) shows up here as a per-step cost that grows with N.

One spawned worker process serves every length (the step count is in the question, read
by ``StepsModel``), so all figures come from one interpreter, warmed up once. Each round
runs one-step turns, then 20-, 200- and 1,000-step turns (A B C D, A B C D ...: drift on
a busy machine hits every length alike), each length with the same turns in flight
(``concurrency``) and about the same number of steps, so commits batch alike. The CPU of
a run is the worker process's user + system time over it (psutil); a step's CPU is
``(CPU per N-step turn - CPU per one-step turn) / (N - 1)`` against the same round's
one-step run, and each figure is the median over the rounds. ``step_cost_growth`` is the
per-step CPU at 1,000 steps over that at 20: 1.0 when a step costs the same however long
the turn (target <= 1.1).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
from collections.abc import AsyncIterator, Sequence
from typing import Any

from pyrula_stream import AgentContext, kafka_agent
from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.agent.limits import AgentLimits
from pyrula_stream.bench.cpu import _cpu_seconds, broker_pid
from pyrula_stream.bench.harness import PREFIX, agent_topics, create_topics, drop_topics, unique
from pyrula_stream.bench.load import CompletionReader, Submitter, turn_requests
from pyrula_stream.bench.stats import median
from pyrula_stream.bench.workload import SYSTEM, lookup_order
from pyrula_stream.llm.base import (
    LLMClient,
    StreamItem,
    TextBlock,
    TextDelta,
    ToolDefinition,
    Usage,
)
from pyrula_stream.llm.fake import reply_text, reply_tool_call
from pyrula_stream.runtime import event_loop
from pyrula_stream.runtime.collector import tune_for_worker
from pyrula_stream.runtime.worker import WorkerOptions
from pyrula_stream.testing import running_worker, wait_for

STEP_COUNTS = (20, 200, 1000)
CONTEXT_WINDOW = 1_000_000
"""Above what a 1,000-step turn reaches (about 90,000 estimated tokens): every call is
checked against it and none is refused."""


class StepsModel(LLMClient):
    """Asks for ``lookup_order`` until the conversation holds as many steps as the first
    message's last word says, then answers. Constant work per call, as ``ScriptModel``:
    the reply is picked by the conversation's length, its usage fixed."""

    provider = "fake"

    def __init__(self, max_steps: int) -> None:
        self.model = "fake"
        usage = Usage(input_tokens=100, output_tokens=20)
        self._calls = [
            reply_tool_call("lookup_order", order_id=str(1234 + i)).model_copy(
                update={"usage": usage, "model": self.model}
            )
            for i in range(max_steps)
        ]
        self._answer = reply_text("Order 1234 shipped with DHL.").model_copy(
            update={"usage": usage, "model": self.model}
        )

    async def stream(
        self,
        messages: list[dict[str, Any]],
        tools: list[ToolDefinition] | None = None,
        system: str | None = None,
    ) -> AsyncIterator[StreamItem]:
        steps = int(str(messages[0]["content"]).rsplit(" ", 1)[-1])
        done = (len(messages) - 1) // 2
        response = self._calls[done] if done < steps else self._answer
        for block in response.content:
            if isinstance(block, TextBlock):
                yield TextDelta(block.text)
        yield response


def long_turn_agent(name: str, *, partitions: int, max_steps: int) -> KafkaAgent:
    """Turns of ``steps`` (a parameter) model-and-tool steps, then an answer, with a
    context window on every model call."""
    limits = AgentLimits(
        max_llm_calls=max_steps + 1, max_tool_calls=max_steps, context_window=CONTEXT_WINDOW
    )

    @kafka_agent(
        name=name,
        prefix=PREFIX,
        llm=StepsModel(max_steps),
        tools=[lookup_order],
        partitions=partitions,
        limits=limits,
    )
    async def long_turn(ctx: AgentContext, steps: int) -> str:
        ask = f"Where is order 1234? Take {steps}"
        return await ctx.llm.run([{"role": "user", "content": ask}], system=SYSTEM)

    return long_turn


def _worker_process(
    bootstrap: str,
    name: str,
    partitions: int,
    max_steps: int,
    concurrency: int,
    owned: Any,
    stop: Any,
) -> None:
    """The spawned interpreter: one worker until ``stop``; ``owned`` is its partition count."""
    agent = long_turn_agent(name, partitions=partitions, max_steps=max_steps)

    async def main() -> None:
        tune_for_worker()  # as `pyrula-stream worker` does
        options = WorkerOptions(max_concurrent_turns=concurrency)
        async with running_worker(agent, bootstrap, options, wait_assigned=False) as worker:
            while not stop.is_set() and not worker.done:
                owned.value = worker.assigned_partitions
                await asyncio.sleep(0.2)

    event_loop.run(main())


@contextlib.asynccontextmanager
async def _spawned_worker(
    bootstrap: str, name: str, *, partitions: int, max_steps: int, concurrency: int
) -> AsyncIterator[int]:
    """A spawned worker process, yielded (its pid) once it owns every partition."""
    context = multiprocessing.get_context("spawn")
    stop, owned = context.Event(), context.Value("i", 0)
    proc = context.Process(
        target=_worker_process,
        args=(bootstrap, name, partitions, max_steps, concurrency, owned, stop),
        name="long-turns-worker",
        daemon=True,
    )
    proc.start()

    def settled() -> bool:
        if not proc.is_alive():
            raise RuntimeError(f"long-turns worker exited with {proc.exitcode}")
        return bool(owned.value == partitions)

    try:
        await wait_for(settled, 180, f"the long-turns worker owning {partitions} partitions")
        assert proc.pid is not None
        yield proc.pid
    finally:
        stop.set()
        await asyncio.to_thread(proc.join, 60)
        if proc.is_alive():
            proc.kill()


def turns_for(steps: int, *, total_steps: int, concurrency: int) -> int:
    """About ``total_steps`` steps, and never fewer turns than are let in flight."""
    return max(concurrency, total_steps // max(steps, STEP_COUNTS[0]))


async def run_long_turns(
    bootstrap: str,
    *,
    total_steps: int,
    concurrency: int,
    rounds: int,
    partitions: int,
    step_counts: Sequence[int] = STEP_COUNTS,
) -> dict[str, Any]:
    """``rounds`` rounds of one-step turns then each of ``step_counts`` (see the module
    docstring); the per-step figures are medians over the rounds."""
    agent = long_turn_agent(unique("long"), partitions=partitions, max_steps=max(step_counts))
    await asyncio.to_thread(create_topics, bootstrap, agent.topic_specs())
    submitter = Submitter(bootstrap)
    reader = CompletionReader(bootstrap, agent.topics.events, partitions)
    broker = broker_pid(bootstrap)
    runs: list[dict[str, Any]] = []
    sent = 0
    try:
        async with _spawned_worker(
            bootstrap,
            agent.name,
            partitions=partitions,
            max_steps=max(step_counts),
            concurrency=concurrency,
        ) as pid:

            async def run(steps: int, turns: int) -> dict[str, Any]:
                nonlocal sent
                requests = turn_requests(agent.name, turns, {"steps": steps})
                before = _cpu_seconds(pid), _cpu_seconds(broker) if broker else 0.0
                started = await asyncio.to_thread(submitter.send_all, agent.topics.turns, requests)
                sent += turns
                await wait_for(
                    lambda: reader.reached(sent),
                    max(600.0, turns * steps / 20),
                    f"long turns: {steps}-step turns, {reader.terminal}/{sent} done",
                )
                worker_s = _cpu_seconds(pid) - before[0]
                broker_s = (_cpu_seconds(broker) - before[1]) if broker else None
                seconds = reader.last_done - started
                return {
                    "steps_per_turn": steps,
                    "turns": turns,
                    "seconds": round(seconds, 3),
                    "worker_cpu_s": round(worker_s, 3),
                    "cpu_ms_per_turn": 1000 * worker_s / turns,
                    "broker_cpu_s": None if broker_s is None else round(broker_s, 3),
                }

            await run(1, concurrency)  # warm-up: imports, first commits, caches
            await run(min(step_counts), concurrency)
            for _ in range(rounds):
                one = await run(1, turns_for(1, total_steps=total_steps, concurrency=concurrency))
                runs.append(one)
                for steps in step_counts:
                    turns = turns_for(steps, total_steps=total_steps, concurrency=concurrency)
                    long = await run(steps, turns)
                    long["cpu_ms_per_step"] = (long["cpu_ms_per_turn"] - one["cpu_ms_per_turn"]) / (
                        steps - 1
                    )
                    runs.append(long)
    finally:
        reader.close()
        submitter.close()
        await asyncio.to_thread(drop_topics, bootstrap, agent_topics(agent))
    per_step = {
        steps: median([r["cpu_ms_per_step"] for r in runs if r["steps_per_turn"] == steps])
        for steps in step_counts
    }
    first, last = per_step[min(step_counts)], per_step[max(step_counts)]
    for r in runs:
        r["cpu_ms_per_turn"] = round(r["cpu_ms_per_turn"], 3)
        if "cpu_ms_per_step" in r:
            r["cpu_ms_per_step"] = round(r["cpu_ms_per_step"], 4)
    return {
        **{f"cpu_ms_per_step_{s}_steps": round(v, 4) for s, v in per_step.items()},
        "step_cost_growth": round(last / first, 3) if first > 0 else None,
        "cpu_ms_per_turn_1_step": round(
            median([r["cpu_ms_per_turn"] for r in runs if r["steps_per_turn"] == 1]), 3
        ),
        "context_window": CONTEXT_WINDOW,
        "concurrency": concurrency,
        "total_steps": total_steps,
        "rounds": rounds,
        "step_counts": list(step_counts),
        "cores": os.cpu_count(),
        "runs": runs,
    }
