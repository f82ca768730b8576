"""``Deadline`` keeps ``asyncio.timeout``'s contract with one timer per loop."""

from __future__ import annotations

import asyncio

import pytest

from pyrula_stream.tools import deadlines
from pyrula_stream.tools.deadlines import TICK_S, Deadline


async def test_a_block_that_outlives_its_deadline_raises_timeout_error() -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):
        async with Deadline(0.1) as deadline:
            await asyncio.sleep(10)
    assert deadline.expired()
    assert 0.1 <= loop.time() - started < 5  # never early; the bound only catches a hang


async def test_a_block_that_ends_in_time_is_untouched_and_leaves_nothing_open() -> None:
    async with Deadline(5) as deadline:
        await asyncio.sleep(0)
    assert not deadline.expired()
    sweep = deadlines._sweep_of(asyncio.get_running_loop())
    assert not any(sweep._buckets.values())


async def test_none_is_no_deadline() -> None:
    async with Deadline(None) as deadline:
        await asyncio.sleep(2 * TICK_S)
    assert not deadline.expired()


async def test_a_deadline_already_past_fires_at_the_first_wait() -> None:
    with pytest.raises(TimeoutError):
        async with Deadline(-1):
            await asyncio.sleep(1)


async def test_the_blocks_own_timeout_error_is_not_the_deadlines() -> None:
    with pytest.raises(TimeoutError, match="the tool's own") as caught:
        async with Deadline(5) as deadline:
            raise TimeoutError("the tool's own")
    assert not deadline.expired()
    assert caught.value.__cause__ is None


async def test_a_cancellation_from_outside_passes_through() -> None:
    async def body() -> None:
        async with Deadline(5):
            await asyncio.sleep(10)

    task = asyncio.create_task(body())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_outer_cancel_during_expiry_stays_a_cancellation() -> None:
    """As with asyncio.timeout: a task cancelled by someone else as well is cancelled."""

    async def body() -> None:
        async with Deadline(0.05):
            try:
                await asyncio.sleep(10)
            finally:
                asyncio.current_task().cancel()  # type: ignore[union-attr]
                await asyncio.sleep(0)

    task = asyncio.create_task(body())
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_many_deadlines_fire_in_order_of_their_time() -> None:
    fired: list[int] = []

    async def wait(i: int, seconds: float) -> None:
        try:
            async with Deadline(seconds):
                await asyncio.sleep(10)
        except TimeoutError:
            fired.append(i)

    # Entered latest-first, so each new one is the earliest and re-arms the timer.
    await asyncio.gather(*(wait(i, 0.05 + 0.1 * i) for i in reversed(range(5))))
    assert fired == [0, 1, 2, 3, 4]


async def test_nested_deadlines_each_raise_at_their_own_exit() -> None:
    with pytest.raises(TimeoutError):
        async with Deadline(5) as outer:
            with pytest.raises(TimeoutError):
                async with Deadline(0.05) as inner:
                    await asyncio.sleep(10)
            assert inner.expired()
            assert not outer.expired()
            raise TimeoutError("outer body")
