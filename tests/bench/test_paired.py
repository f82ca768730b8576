"""The bench's paired figures (pure logic, no broker): overhead over the floor from the
differences of paired samples, ratios from per-round pairs, the floor's own spread, and
what the machine's neighbours did over a run."""

from __future__ import annotations

import time

import pytest

from pyrula_stream.bench.harness import cpu_ticks, neighbours
from pyrula_stream.bench.paired import over_floor, throughput_figures


def test_overhead_over_the_floor_is_a_percentile_of_paired_differences() -> None:
    # The same schedule on both sides: the floor's one slow input is turn 0, the
    # framework's own hiccup is turn 99; every other turn costs the framework 2 ms more.
    floor = [10.0] * 100
    floor[0] = 60.0
    framework = [f + 2.0 for f in floor]
    framework[99] = 70.0
    figures = over_floor(framework, floor)
    assert figures["overhead_over_floor_pairs"] == 100
    assert figures["overhead_over_floor_p50_ms"] == 2.0
    # The differences are [2] x 99 and 60 (turn 99): their p99 is 2.58, where the
    # difference of the two p99s (62.08 - 10.5) would blame the floor's slow turn too.
    assert figures["overhead_over_floor_p99_ms"] == pytest.approx(2.6, abs=0.05)
    assert figures["latency_floor_p99_ms"] == 10.5


def test_unpaired_latency_samples_are_refused() -> None:
    with pytest.raises(ValueError, match="unpaired"):
        over_floor([1.0, 2.0], [1.0])


def test_the_ratio_is_the_median_of_per_round_ratios_with_its_spread() -> None:
    figures = throughput_figures(
        framework=[1000.0, 2000.0, 3000.0],
        floor=[10000.0, 4000.0, 10000.0],
        all_cores=[4000.0, 2000.0, 3000.0],
        baseline=[700.0, 300.0, 800.0],
    )
    assert figures["ratio_per_pair"] == [0.1, 0.5, 0.3]
    assert figures["ratio"] == 0.3  # not median(framework) / median(floor) = 0.2
    assert (figures["ratio_spread"]["min"], figures["ratio_spread"]["max"]) == (0.1, 0.5)
    assert figures["ratio_all_cores"] == 0.4
    assert figures["baseline_ratio"] == 0.075
    assert figures["floor_spread"] == 0.6  # (10000 - 4000) / 10000
    assert figures["floor_unstable"] is True


def test_a_floor_within_fifteen_percent_is_stable_and_one_run_cannot_say() -> None:
    steady = throughput_figures([1.0, 1.0], [1000.0, 1140.0], [1.0, 1.0], [])
    assert steady["floor_unstable"] is False
    assert "baseline_ratio" not in steady
    alone = throughput_figures([1.0], [1000.0], [1.0], [])
    assert (alone["floor_spread"], alone["floor_unstable"]) == (None, None)


def test_the_machine_section_says_load_and_steal_over_the_run() -> None:
    start = cpu_ticks()
    assert {"user", "idle", "steal"} <= set(start)
    deadline = time.monotonic() + 10
    while cpu_ticks() == start and time.monotonic() < deadline:
        sum(i * i for i in range(50_000))  # a clock tick passes between the readings
    seen = neighbours(start, load_at_start=1.5)
    assert seen["load_avg_1m_at_start"] == 1.5
    assert seen["load_avg_1m_at_end"] >= 0
    assert 0 <= seen["steal_fraction"] <= 1
    assert seen["steal_s"] >= 0


def test_the_latency_run_alternates_blocks_of_one_schedule() -> None:
    from pyrula_stream.bench.runner import block_sizes

    assert block_sizes(2000, 4) == [500] * 4
    assert block_sizes(10, 4) == [3, 3, 2, 2]
    assert block_sizes(3, 8) == [1, 1, 1]  # never an empty block
