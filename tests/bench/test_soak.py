"""The soak's load shape (pure logic): the warm-up reaches the backlog the measured
chunks have, so the baseline RSS already holds the allocator's high-water mark and the
figure is what finished turns keep, not a bigger backlog than the warm-up's."""

from __future__ import annotations

import pytest

from pyrula_stream.bench.soak import BURST, bursts, soak_plan


@pytest.mark.parametrize(
    ("turns", "warmup", "chunks"),
    [(200_000, 5_000, 10), (60_000, 5_000, 10), (1_000, 200, 10), (7, 3, 2), (10, 0, 10)],
)
def test_no_measured_burst_is_larger_than_the_warm_ups(
    turns: int, warmup: int, chunks: int
) -> None:
    plan = soak_plan(turns, warmup, chunks)
    assert max((max(sends, default=1) for sends in plan.warmup), default=1) == plan.burst
    assert plan.burst <= BURST
    assert max(max(sends) for sends in plan.measured) <= plan.burst
    assert sum(map(sum, plan.warmup)) == warmup
    assert sum(map(sum, plan.measured)) == turns


def test_the_default_soak_sends_its_20000_turn_chunks_in_bursts() -> None:
    plan = soak_plan(200_000, 5_000, 10)
    assert plan.measured[0] == [2_500] * 8
    assert plan.warmup == ([2_500], [2_500])


def test_bursts_split_a_count_without_losing_any() -> None:
    assert bursts(7, 3) == [3, 3, 1]
    assert bursts(0, 3) == []
