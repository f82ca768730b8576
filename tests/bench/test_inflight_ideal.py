"""The in-flight phase's ideal: a worker that costs nothing, on the same model latencies."""

from __future__ import annotations

import random

from pyrula_stream.bench.concurrency import ideal_seconds
from pyrula_stream.bench.workload import model_latency


def test_without_spread_the_ideal_is_waves_of_two_model_calls() -> None:
    assert ideal_seconds(4000, 2000, 1.0, 0.0) == 4.0
    assert ideal_seconds(4001, 2000, 1.0, 0.0) == 6.0  # a third wave for the last turn


def test_with_spread_the_tail_of_the_last_turns_counts() -> None:
    # Latencies 5 s +- 50 %: two waves average 20 s, but the last turns to start end late;
    # a greedy schedule ends within (work / slots) + the longest turn (15 s).
    ideal = ideal_seconds(40_000, 20_000, 5.0, 0.5)
    assert 20.0 < ideal < 35.0
    assert ideal_seconds(40_000, 20_000, 5.0, 0.5) == ideal  # seeded: the same every run


def test_a_drawn_latency_stays_within_its_spread() -> None:
    rng = random.Random(3)
    draws = [model_latency(5.0, 0.5, rng) for _ in range(10_000)]
    assert min(draws) >= 2.5 and max(draws) <= 7.5
    assert abs(sum(draws) / len(draws) - 5.0) < 0.05
    assert model_latency(5.0, 0.0, rng) == 5.0
