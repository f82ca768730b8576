"""Figures from paired runs: the same work on the framework and on its floor, side by side.

A figure compared with the floor is taken pair by pair (the same round, the same arrival
schedule) and only then summarised, so drift between rounds and the tails of two separate
samples do not leak into it; the floor's own spread says whether it held still.
"""

from __future__ import annotations

from typing import Any

from pyrula_stream.bench.harness import FLOOR_UNSTABLE
from pyrula_stream.bench.stats import (
    median,
    paired_differences,
    paired_ratios,
    percentile,
    spread,
)


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return round(median(values), 3) if values else None


def per_turn_ms(seconds: float | None, turns: int) -> float | None:
    return None if seconds is None else round(1000 * seconds / turns, 3)


def throughput_figures(
    framework: list[float], floor: list[float], all_cores: list[float], baseline: list[float]
) -> dict[str, Any]:
    """The ratios as medians of per-round ratios, each with its spread, and the floor's
    own spread: a floor that moved more than 15% between its runs is marked unstable."""
    per_pair = paired_ratios(framework, floor)
    per_pair_all = paired_ratios(all_cores, floor)
    floor_spread = spread(floor)["relative"] if len(floor) > 1 else None
    out: dict[str, Any] = {
        "framework_turns_per_s": round(median(framework), 1),
        "floor_turns_per_s": round(median(floor), 1),
        "ratio": round(median(per_pair), 4),
        "ratio_per_pair": [round(r, 4) for r in per_pair],
        "ratio_spread": spread(per_pair),
        "turns_per_s_all_cores": round(median(all_cores), 1),
        "ratio_all_cores": round(median(per_pair_all), 4),
        "ratio_all_cores_per_pair": [round(r, 4) for r in per_pair_all],
        "ratio_all_cores_spread": spread(per_pair_all),
        "floor_spread": floor_spread,
        "floor_unstable": None if floor_spread is None else floor_spread > FLOOR_UNSTABLE,
    }
    if baseline:
        per_base = paired_ratios(baseline, floor)
        out |= {
            "baseline_turns_per_s": round(median(baseline), 1),
            "baseline_ratio": round(median(per_base), 4),
            "baseline_ratio_per_pair": [round(r, 4) for r in per_base],
            "baseline_ratio_spread": spread(per_base),
        }
    return out


def over_floor(overheads_ms: list[float], floor_ms: list[float]) -> dict[str, float]:
    """The latency floor and the framework's overhead above it, p50 and p99, paired.

    Both sides ran the same arrival schedule (the same submit times, turn by turn), so
    the i-th framework turn is paired with the i-th floor input and the percentiles are
    taken of the differences. The framework's overhead already has the model's time
    taken out; the floor calls no model, so its whole end-to-end time is the floor.
    """
    diffs = paired_differences(overheads_ms, floor_ms)
    return {
        "latency_floor_p50_ms": round(percentile(floor_ms, 50), 1),
        "latency_floor_p99_ms": round(percentile(floor_ms, 99), 1),
        "overhead_over_floor_p50_ms": round(percentile(diffs, 50), 1),
        "overhead_over_floor_p99_ms": round(percentile(diffs, 99), 1),
        "overhead_over_floor_pairs": len(diffs),
    }
