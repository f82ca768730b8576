"""Sessions that keep ending on the same input back off and are charged like crashes:
the count per partition, the backoff and what the next restore makes of its own open
mark as pure logic; then a worker on the real broker whose restores keep failing (more
in tests/durable/test_reply_not_lost.py and tests/runtime/test_poison_quarantine.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from pyrula_stream import (
    AgentContext,
    KafkaAgentClient,
    KafkaWorker,
    PoisonOptions,
    WorkerOptions,
    kafka_agent,
)
from pyrula_stream.llm import FakeLLM
from pyrula_stream.runtime.handover import keys_file_name
from pyrula_stream.runtime.partition import OffsetWatermark, QueuedTurn
from pyrula_stream.runtime.poison import PROCESS, CrashGuard, IntakeMark
from pyrula_stream.runtime.restarts import NO_PARTITION, REPEAT_WINDOW_S, SessionRestarts
from pyrula_stream.testing import running_worker, unique_name, wait_for
from pyrula_stream.wire.serde import TurnRequest

OPTIONS = PoisonOptions(max_retries=3, retry_ttl_s=60.0, restart_backoff_s=0.5)


def test_sessions_that_end_on_the_same_input_count_up_and_progress_resets_them() -> None:
    restarts = SessionRestarts(OPTIONS)
    assert restarts.ended({0: 10, 1: 4}, now=0.0) == 1
    assert restarts.ended({0: 10, 1: 5}, now=1.0) == 2  # partition 0 is stuck at 10
    assert restarts.ended({0: 10, 1: 6}, now=2.0) == 3
    assert (restarts.repeats(0, 10), restarts.repeats(1, 6)) == (3, 1)
    assert restarts.repeats(0, 11) == 0  # another offset: not this input
    assert restarts.ended({0: 11, 1: 7}, now=3.0) == 1  # both moved on
    # An ending long after the one before is no repeat of it, at the same offset too.
    assert restarts.ended({0: 11}, now=3.0 + REPEAT_WINDOW_S + 1) == 1


def test_a_session_that_ends_before_any_restore_repeats_too() -> None:
    restarts = SessionRestarts(OPTIONS)
    assert [restarts.ended({}, now=float(t)) for t in range(3)] == [1, 2, 3]
    assert restarts.repeats(NO_PARTITION, None) == 3


def test_the_backoff_doubles_per_repeat_up_to_its_cap() -> None:
    restarts = SessionRestarts(PoisonOptions(restart_backoff_s=0.5, restart_backoff_max_s=3.0))
    assert [restarts.delay_s(n) for n in range(1, 7)] == [0.0, 0.5, 1.0, 2.0, 3.0, 3.0]


def test_a_process_that_keeps_restarting_on_a_record_charges_it_like_a_crash() -> None:
    now_ms = int(time.time() * 1000)
    own = IntakeMark(7, crashes=0, ts_ms=now_ms, process=PROCESS)
    # The first ending in a row is a one-off (a fence): nothing changes.
    assert CrashGuard.after(own, 7, OPTIONS, restarts=1) == (False, 0)
    # From the second, the partition runs carefully; nothing ran alone yet: no charge.
    assert CrashGuard.after(own, 7, OPTIONS, restarts=2) == (True, 0)
    # An ending while the record ran alone under a careful mark is charged to it.
    careful = IntakeMark(7, crashes=2, ts_ms=now_ms, careful=True, process=PROCESS)
    assert CrashGuard.after(careful, 7, OPTIONS, restarts=3) == (True, 3)
    # ... but not when the careful mark names another record than the stuck one.
    assert CrashGuard.after(careful, 8, OPTIONS, restarts=3) == (True, 0)
    # Without repeated endings, an own mark is still no crash (as before).
    assert CrashGuard.after(careful, 7, OPTIONS, restarts=0) == (True, 2)


def test_a_careful_turn_that_does_not_start_lets_the_next_one_run() -> None:
    """Issue 46: a turn left for a worker with its version must not stay in flight, and
    careful mode ends once all else below where it ends is done."""
    watermark = OffsetWatermark()
    for offset in (5, 6):
        watermark.track(offset)
    released: list[int] = []

    async def scenario() -> bool:
        loop = asyncio.get_running_loop()

        def durable(mark: IntakeMark) -> asyncio.Future[None]:
            done: asyncio.Future[None] = loop.create_future()
            done.set_result(None)
            return done

        guard = CrashGuard(0, 5, 0, 7, OPTIONS, durable, lambda q: released.append(q.offset), "w")
        guard.careful, guard.marked_at = True, 5
        assert guard.admit(QueuedTurn(5, TurnRequest("t5", "a", {}))) == "run"
        assert guard.admit(QueuedTurn(6, TurnRequest("t6", "a", {}))) == "hold"
        guard.left.add(5)  # the scheduler declined turn 5 (pinned elsewhere)
        guard.ended(5, watermark.committable_past(guard.left))
        assert released == [6] and guard.careful  # 6 is not done yet: still careful
        watermark.done(6)
        guard.in_flight = 6
        guard.ended(6, watermark.committable_past(guard.left))
        return guard.careful

    assert asyncio.run(scenario()) is False
    assert watermark.committable() == 5  # offset 5 itself is never committed here
    assert watermark.committable_past({5}) == 7


async def test_a_worker_whose_sessions_keep_ending_backs_off_then_recovers(
    kafka_bootstrap_servers: str,
    client: KafkaAgentClient,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    @kafka_agent(name=unique_name("restarts"), llm=FakeLLM(["ok"]), partitions=1)
    async def agent(ctx: AgentContext) -> str:
        return "ran"

    options = WorkerOptions(
        shutdown_grace=0.2,
        state_dir=tmp_path,
        worker_id="w1",
        poison=PoisonOptions(restart_backoff_s=0.1, restart_backoff_max_s=0.3),
    )
    # The partition's local table cannot be made (a directory holds its path), so every
    # restore fails and ends the session, before any partition is installed.
    blocked = tmp_path / keys_file_name(f"{agent.prefix}.{agent.name}.workers", "w1", "0")
    blocked.mkdir()
    caplog.set_level(logging.WARNING, logger="pyrula_stream.runtime.worker")
    async with running_worker(
        agent, kafka_bootstrap_servers, options, wait_assigned=False
    ) as worker:
        await wait_for(lambda: repeated(worker) >= 3, 120, "sessions ending on the same input")
        blocked.rmdir()  # the cause is fixed: the next session restores and runs turns
        events = await client.run(agent.name, timeout=120)

    assert events[-1].type == "run:complete" and events[-1].data["result"] == "ran"
    assert "rejoining in 0.1s (session 2 in a row" in caplog.text
    assert "rejoining in 0.2s (session 3 in a row" in caplog.text  # doubled
    assert "rejoining in 0.3s (session 4 in a row" in caplog.text  # capped


def repeated(worker: KafkaWorker) -> float:
    """This worker's ``pyrula_session_restarts_total{repeated="true"}``."""
    for line in worker.metrics.exposition().decode().splitlines():
        if line.startswith("pyrula_session_restarts_total{") and 'repeated="true"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0
