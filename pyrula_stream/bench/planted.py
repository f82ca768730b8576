"""The planted-difference proof: an experiment whose versions differ by a known share of
wrong answers is reported significant, with the right sign; one without is not.

Two versions of one agent ask the same scripted model (``FakeLLM``) to add two numbers;
the model answers version 1's prompt wrongly a planted share of the time and version 2's
another share. An experiment splits the turns between the versions by key, a function
evaluator (``correct``: the answer is the sum) declared on the agent scores every
finished turn onto ``<agent>.scores`` through the evaluators' own consumer group
(``EvalStream``, exactly once), and ``evals report``'s reading and report
(``comparison/``) compare the versions. The evaluators' Prometheus series are fed by the
same committed batches. Turns are submitted with idempotency keys, so their ids, and with them the
experiment's split, are the same on every run: the outcome is reproducible.

``python -m pyrula_stream.bench.planted [--turns 400]`` runs a planted experiment
(30% vs 5% wrong) and a null one (10% vs 10%) on a local broker (or
``--bootstrap-servers``), prints both reports and one JSON line, and exits 0 when the
first is significant in favour of version 2 and the second is not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from pyrula_stream.agent.definition import KafkaAgent, kafka_agent
from pyrula_stream.agent.experiments import Experiment
from pyrula_stream.client.kafka_client import KafkaAgentClient
from pyrula_stream.comparison.report import EvalReport, build_report
from pyrula_stream.comparison.scores import read_scores
from pyrula_stream.context.agent_context import AgentContext
from pyrula_stream.evals.evaluators import evaluator
from pyrula_stream.evals.stream.runner import EvalStream
from pyrula_stream.evals.turns import ScoredTurn
from pyrula_stream.kafka.admin import apply_topics
from pyrula_stream.llm.base import ModelResponse, ToolDefinition
from pyrula_stream.llm.fake import FakeLLM, reply_text
from pyrula_stream.observability.score_metrics import ScoreMetrics
from pyrula_stream.testing import local_kafka, running_worker, unique_name, wait_for
from pyrula_stream.wire.events import Event

GOLDEN = 0.6180339887498949
"""Question n is answered wrongly when frac(n * GOLDEN) < share: a low-discrepancy
sequence, so the wrong answers are spread evenly over the questions."""
ADDEND = 7
PLANTED = {"1": 0.30, "2": 0.05}
NULL = {"1": 0.10, "2": 0.10}
_QUESTION = re.compile(r"^version (\S+) asks #(\d+): what is (\d+) \+ (\d+)\?$")


def answers_wrongly(n: int, share: float) -> bool:
    return (n * GOLDEN) % 1.0 < share


def planted_model(wrong: Mapping[str, float]) -> FakeLLM:
    """A model that adds correctly except for ``wrong[version]`` of the questions."""

    def respond(messages: list[dict[str, Any]], tools: list[ToolDefinition]) -> ModelResponse:
        match = _QUESTION.match(str(messages[-1]["content"]))
        if match is None:
            return reply_text("I do not understand")
        version, n, a, b = match[1], int(match[2]), int(match[3]), int(match[4])
        return reply_text(str(a + b + (1 if answers_wrongly(n, wrong[version]) else 0)))

    return FakeLLM(respond)


@evaluator()
def correct(turn: ScoredTurn) -> bool:
    """The function evaluator: the answer is the sum."""
    result = turn.result if isinstance(turn.result, dict) else {}
    return turn.completed and str(result.get("answer")).strip() == str(
        int(result.get("n", -1)) + ADDEND
    )


def planted_agent(name: str, wrong: Mapping[str, float], shares: Mapping[str, float]) -> KafkaAgent:
    """Versions 1 and 2 of an adding agent under the experiment ``planted``, scored by
    ``correct``. A turn's result is ``{"n": n, "answer": "..."}``."""

    async def ask(ctx: AgentContext, version: str, n: int) -> dict[str, Any]:
        question = f"version {version} asks #{n}: what is {n} + {ADDEND}?"
        return {"n": n, "answer": await ctx.llm.run([{"role": "user", "content": question}])}

    async def version_1(ctx: AgentContext, n: int) -> dict[str, Any]:
        return await ask(ctx, "1", n)

    @kafka_agent(
        name=name,
        llm=planted_model(wrong),
        partitions=2,
        version="2",
        versions={"1": version_1},
        experiment=Experiment("planted", dict(shares)),
        evaluators=[correct],
    )
    async def version_2(ctx: AgentContext, n: int) -> dict[str, Any]:
        return await ask(ctx, "2", n)

    return version_2


@dataclass
class PlantedRun:
    agent: str
    turns: int
    wrong: Mapping[str, float]
    report: EvalReport
    metrics: CollectorRegistry
    """The evaluators' Prometheus series, fed by the committed batches."""

    def summary(self) -> dict[str, Any]:
        (measure,) = [m for m in self.report.measures if m.measure == "pass_rate"]
        (comparison,) = measure.comparisons
        return {
            "planted_wrong": dict(self.wrong),
            "turns": self.turns,
            "versions": [v.as_json() for v in measure.versions],
            **comparison.as_json(),
        }


async def run_planted(
    bootstrap_servers: str,
    *,
    turns: int,
    wrong: Mapping[str, float],
    shares: Mapping[str, float] | None = None,
    timeout_s: float = 120.0,
) -> PlantedRun:
    """Run ``turns`` turns through the experiment, score them with the evaluators'
    stream, and report."""
    name = unique_name("planted")
    agent = planted_agent(name, wrong, shares or {"1": 0.5, "2": 0.5})
    await asyncio.to_thread(apply_topics, bootstrap_servers, agent.topic_specs())
    registry = CollectorRegistry()
    stream = EvalStream(
        agent,
        bootstrap_servers,
        instance=f"{name}-proof",
        on_batch=ScoreMetrics(registry).observe,
    )
    stop = threading.Event()
    scoring = threading.Thread(target=stream.run, args=(stop,), name="planted-evals")
    scoring.start()
    try:
        async with (
            KafkaAgentClient(bootstrap_servers) as client,
            running_worker(agent, bootstrap_servers, all_partitions=True),
        ):
            handles = [
                await client.submit(name, idempotency_key=f"planted-{n}", n=n) for n in range(turns)
            ]
            await asyncio.gather(
                *(asyncio.wait_for(_terminal(client, name, h.turn_id), timeout_s) for h in handles)
            )
        await wait_for(lambda: stream.stats["scores"] >= turns, timeout_s, "every turn scored")
    finally:
        stop.set()
        await asyncio.to_thread(scoring.join, 60)
    read = await asyncio.to_thread(read_scores, bootstrap_servers, name)
    report = build_report(name, read.scores, baseline="1", duplicates=read.duplicates)
    return PlantedRun(name, turns, wrong, report, registry)


async def _terminal(client: KafkaAgentClient, agent: str, turn_id: str) -> Event:
    events = [e async for e in client.stream(agent, turn_id)]
    return events[-1]


def verdicts_hold(planted: PlantedRun, null: PlantedRun) -> bool:
    """Planted: version 2 significantly higher; null: not yet significant."""
    return (
        planted.summary()["verdict"] == "significantly higher" and not null.summary()["significant"]
    )


async def _main(bootstrap: str, turns: int) -> int:
    planted = await run_planted(bootstrap, turns=turns, wrong=PLANTED)
    null = await run_planted(bootstrap, turns=turns, wrong=NULL)
    for run in (planted, null):
        print(f"# planted wrong shares {dict(run.wrong)}")
        print(run.report.text())
        print()
    ok = verdicts_hold(planted, null)
    print(json.dumps({"planted": planted.summary(), "null": null.summary(), "ok": ok}))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pyrula_stream.bench.planted")
    parser.add_argument("--turns", type=int, default=400, help="turns per experiment")
    parser.add_argument("--bootstrap-servers", default=None)
    args = parser.parse_args(argv)
    if args.bootstrap_servers:
        return asyncio.run(_main(args.bootstrap_servers, args.turns))
    with local_kafka() as bootstrap:
        return asyncio.run(_main(bootstrap, args.turns))


if __name__ == "__main__":
    sys.exit(main())
