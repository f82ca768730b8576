"""What metrics and tracing cost: the same workload with telemetry off and on, same run.

"Off" is ``WorkerOptions(telemetry=False)``: no per-turn metrics and no spans. "On"
records every metric and exports every span through the OpenTelemetry SDK's batch
processor (to an exporter that drops them, so the figure is our cost and the SDK's, not
a collector's network). Throughput alternates off and on (A B A B ...) like the
throughput phase; latency runs off then on at the same rate and model latency.
``telemetry_cost_fraction`` is ``(turns/s off - turns/s on) / turns/s off``: the share of
throughput telemetry costs.
``cpu_cost_fraction`` is the process CPU per turn added (steadier than turns/s on a
machine shared with other work).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from pyrula_stream.bench.framework import run_framework
from pyrula_stream.bench.latency import run_latency
from pyrula_stream.bench.stats import median


def install_sdk_tracing() -> bool:
    """A global SDK tracer provider exporting to nowhere (once per process).

    Returns False when the SDK is not installed (``pip install 'pyrula-stream[otel]'``):
    then "on" prices the metrics only.
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
        return False

    class Discard(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(Discard()))
        trace.set_tracer_provider(provider)
    return True


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
    traced = install_sdk_tracing()
    tput: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rounds):
        for on in (False, True):
            started = time.process_time()
            run = await run_framework(
                bootstrap,
                turns=turns,
                partitions=partitions,
                concurrency=concurrency,
                keep_topics=keep_topics,
                telemetry=on,
            )
            tput[on].append(round(run.turns_per_s, 1))
            cpu[on].append(round(1000 * (time.process_time() - started) / turns, 3))
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
        p50[on] = lat.summary()["overhead_p50_ms"]
    off_tps, on_tps = median(tput[False]), median(tput[True])
    off_cpu, on_cpu = median(cpu[False]), median(cpu[True])
    return {
        "tracing_exported": traced,
        "turns": turns,
        "turns_per_s_off": round(off_tps, 1),
        "turns_per_s_on": round(on_tps, 1),
        "turns_per_s_runs_off": tput[False],
        "turns_per_s_runs_on": tput[True],
        "turns_per_s_cost_pct": round(100 * (off_tps - on_tps) / off_tps, 1),
        "telemetry_cost_fraction": round((off_tps - on_tps) / off_tps, 3),
        "cpu_ms_per_turn_off": round(off_cpu, 3),
        "cpu_ms_per_turn_on": round(on_cpu, 3),
        "cpu_ms_per_turn_runs_off": cpu[False],
        "cpu_ms_per_turn_runs_on": cpu[True],
        "cpu_cost_fraction": round((on_cpu - off_cpu) / off_cpu, 3),
        "latency_turns": latency_turns,
        "overhead_p50_ms_off": p50[False],
        "overhead_p50_ms_on": p50[True],
        "overhead_p50_cost_ms": round(p50[True] - p50[False], 1),
    }
