"""What metrics and tracing cost: the same workload with telemetry off and on, same run.

"Off" is ``WorkerOptions(telemetry=False)``: no per-turn metrics and no spans. "On"
records every metric and traces as ``pyrula-stream worker`` does when tracing is turned
on (``OTEL_EXPORTER_OTLP_ENDPOINT``): its default sampler (``default_sampler``: one turn
in ten without a sampled parent) and the SDK's batch processor, to an exporter that drops
the spans, so the figure is our cost and the SDK's, not a collector's network. "Every
turn" is the same with ``parentbased_always_on`` (every turn's spans exported).
Throughput alternates off, on, every turn (A B C A B C ...) like the throughput phase;
latency runs off then on at the same rate and model latency.
``telemetry_cost_fraction`` is ``(turns/s off - turns/s on) / turns/s off``, the share of
throughput telemetry costs, of each round's off and on runs (back to back), and its median
over the rounds; ``telemetry_cost_fraction_every_turn`` the same with every turn traced.
``cpu_cost_fraction`` is the process CPU per turn added, paired the same way (steadier
than turns/s on a machine shared with other work).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pyrula_stream.bench.framework import run_framework
from pyrula_stream.bench.latency import run_latency
from pyrula_stream.bench.stats import median, percentile
from pyrula_stream.observability.tracing import DEFAULT_TRACE_RATIO, default_sampler, tracer

if TYPE_CHECKING:  # the SDK is an extra (``otel``)
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import Sampler

ARMS = ("off", "on", "every_turn")


class _Samplers:
    """The installed provider's sampler, set for each arm of the run before its worker
    starts (a worker's tracer takes the provider's sampler when it is made). Set, not
    wrapped: a sampler that forwards each call would add its own cost to every turn's
    span, which no worker pays."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

        self.provider = provider
        self.default: Sampler = default_sampler() or _env_sampler()
        self.every_turn: Sampler = ParentBased(ALWAYS_ON)
        self.use(self.default)

    def use(self, sampler: Sampler) -> None:
        from opentelemetry.sdk.trace import Tracer as SDKTracer

        self.provider.sampler = sampler
        # The provider keeps one tracer per scope, made with the sampler of its time.
        spans = tracer()
        if isinstance(spans, SDKTracer):
            spans.sampler = sampler


def _env_sampler() -> Any:
    """The sampler ``OTEL_TRACES_SAMPLER`` names (what a provider built without one reads)."""
    from opentelemetry.sdk.trace import TracerProvider

    return TracerProvider(shutdown_on_exit=False).sampler


def install_sdk_tracing() -> _Samplers | None:
    """A global SDK tracer provider exporting to nowhere (once per process).

    Returns ``None`` when the SDK is not installed (``pip install 'pyrula-stream[otel]'``)
    or a provider was already installed: then "on" prices what that provider does.
    """
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )
    except ImportError:
        return None

    class Discard(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    if isinstance(trace.get_tracer_provider(), TracerProvider):
        return None
    provider = TracerProvider()
    samplers = _Samplers(provider)
    provider.add_span_processor(BatchSpanProcessor(Discard()))
    trace.set_tracer_provider(provider)
    return samplers


async def run_telemetry_cost(
    bootstrap: str,
    *,
    turns: int,
    rounds: int,
    partitions: int,
    concurrency: int,
    latency_turns: int,
    latency_rate: float,
    latency_model_s: float,
    keep_topics: bool = False,
) -> dict[str, Any]:
    samplers = install_sdk_tracing()
    arms = ARMS if samplers is not None else ARMS[:2]
    tput: dict[str, list[float]] = {arm: [] for arm in arms}
    cpu: dict[str, list[float]] = {arm: [] for arm in arms}
    for _ in range(rounds):
        for arm in arms:
            if samplers is not None:
                samplers.use(samplers.every_turn if arm == "every_turn" else samplers.default)
            started = time.process_time()
            run = await run_framework(
                bootstrap,
                turns=turns,
                partitions=partitions,
                concurrency=concurrency,
                keep_topics=keep_topics,
                telemetry=arm != "off",
            )
            tput[arm].append(round(run.turns_per_s, 1))
            cpu[arm].append(round(1000 * (time.process_time() - started) / turns, 3))
    if samplers is not None:
        samplers.use(samplers.default)
    p50: dict[bool, float] = {}
    for on in (False, True):
        lat = await run_latency(
            bootstrap,
            turns=latency_turns,
            rate=latency_rate,
            model_latency_s=latency_model_s,
            partitions=partitions,
            keep_topics=keep_topics,
            telemetry=on,
        )
        p50[on] = round(percentile(lat.overheads_ms, 50), 1)
    tps = {arm: median(runs) for arm, runs in tput.items()}
    per_turn = {arm: median(runs) for arm, runs in cpu.items()}
    off_tps, on_tps, off_cpu, on_cpu = tps["off"], tps["on"], per_turn["off"], per_turn["on"]
    lost = _paired(tput, "on", lambda off, on: (off - on) / off)
    added = _paired(cpu, "on", lambda off, on: (on - off) / off)
    out: dict[str, Any] = {
        "tracing_exported": samplers is not None,
        "sampler": samplers.default.get_description() if samplers is not None else None,
        "trace_ratio": DEFAULT_TRACE_RATIO if samplers is not None else None,
        "turns": turns,
        "turns_per_s_off": round(off_tps, 1),
        "turns_per_s_on": round(on_tps, 1),
        "turns_per_s_runs_off": tput["off"],
        "turns_per_s_runs_on": tput["on"],
        "turns_per_s_cost_pct": round(100 * median(lost), 1),
        "telemetry_cost_fraction": round(median(lost), 3),
        "telemetry_cost_fraction_runs": [round(x, 3) for x in lost],
        "cpu_ms_per_turn_off": round(off_cpu, 3),
        "cpu_ms_per_turn_on": round(on_cpu, 3),
        "cpu_ms_per_turn_runs_off": cpu["off"],
        "cpu_ms_per_turn_runs_on": cpu["on"],
        "cpu_cost_fraction": round(median(added), 3),
        "latency_turns": latency_turns,
        "overhead_p50_ms_off": p50[False],
        "overhead_p50_ms_on": p50[True],
        "overhead_p50_cost_ms": round(p50[True] - p50[False], 1),
    }
    if "every_turn" in tps:
        every_tps, every_cpu = tps["every_turn"], per_turn["every_turn"]
        every_lost = _paired(tput, "every_turn", lambda off, on: (off - on) / off)
        every_added = _paired(cpu, "every_turn", lambda off, on: (on - off) / off)
        out |= {
            "turns_per_s_every_turn": round(every_tps, 1),
            "turns_per_s_runs_every_turn": tput["every_turn"],
            "telemetry_cost_fraction_every_turn": round(median(every_lost), 3),
            "cpu_ms_per_turn_every_turn": round(every_cpu, 3),
            "cpu_ms_per_turn_runs_every_turn": cpu["every_turn"],
            "cpu_cost_fraction_every_turn": round(median(every_added), 3),
        }
    return out


def _paired(
    runs: dict[str, list[float]], arm: str, cost: Callable[[float, float], float]
) -> list[float]:
    """``cost(off, arm)`` of each round's own pair of runs, which ran back to back: a
    machine that slows down between rounds moves both figures of a pair alike, where a
    ratio of medians taken across rounds would count the slowdown as telemetry's."""
    return [cost(off, on) for off, on in zip(runs["off"], runs[arm], strict=True)]
