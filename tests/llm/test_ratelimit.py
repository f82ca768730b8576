"""The client-side ``LLMRate`` limiter: token buckets on a fake clock, then through an adapter."""

from __future__ import annotations

import asyncio
import time

import pytest

from pyrula_stream.errors import ConfigurationError
from pyrula_stream.llm import AnthropicLLM, LLMRate
from pyrula_stream.llm.ratelimit import RateLimiter
from pyrula_stream.testing_servers.anthropic_server import MODEL, AnthropicWireServer, Text
from tests.llm.servers.fixtures import SECRET_KEY


class FakeClock:
    """Time that moves only when someone sleeps; records every sleep."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


def limiter(rate: LLMRate) -> tuple[RateLimiter, FakeClock]:
    clock = FakeClock()
    return RateLimiter(rate, clock=clock, sleep=clock.sleep), clock


async def test_requests_per_minute_allows_a_burst_then_paces() -> None:
    rl, clock = limiter(LLMRate(requests_per_minute=60))
    for _ in range(60):
        await rl.acquire()
    assert clock.sleeps == []
    await rl.acquire()
    await rl.acquire()
    assert clock.now == pytest.approx(1002.0)  # one request per second once the bucket is empty


async def test_tokens_per_minute_waits_for_enough_tokens() -> None:
    rl, clock = limiter(LLMRate(tokens_per_minute=600))  # 10 tokens per second
    await rl.acquire(500)
    await rl.acquire(200)  # 100 left: wait for 100 more
    assert clock.now == pytest.approx(1010.0)


async def test_settle_charges_real_usage_and_refunds_failures() -> None:
    rl, clock = limiter(LLMRate(tokens_per_minute=600))
    await rl.acquire(100)
    rl.settle(100, 700)  # the call really used 700 of 600: the bucket is 100 in debt
    await rl.acquire(50)
    assert clock.now == pytest.approx(1015.0)  # (100 debt + 50) / 10 per second
    rl2, clock2 = limiter(LLMRate(tokens_per_minute=600))
    await rl2.acquire(600)
    rl2.settle(600, 0)  # a failed call gives its reservation back
    await rl2.acquire(600)
    assert clock2.sleeps == []


async def test_oversized_request_waits_for_a_full_bucket_instead_of_forever() -> None:
    rl, clock = limiter(LLMRate(tokens_per_minute=60))
    await rl.acquire(10)
    await rl.acquire(1000)  # more than the bucket holds: needs a full bucket, not 1000 tokens
    assert clock.now == pytest.approx(1010.0)


async def test_waiters_are_served_in_arrival_order() -> None:
    rl, _ = limiter(LLMRate(requests_per_minute=1))
    await rl.acquire()
    order: list[int] = []

    async def call(i: int) -> None:
        await rl.acquire()
        order.append(i)

    await asyncio.gather(*(call(i) for i in range(5)))
    assert order == [0, 1, 2, 3, 4]


def test_rates_must_be_positive() -> None:
    with pytest.raises(ConfigurationError):
        RateLimiter(LLMRate(requests_per_minute=-1))


async def test_adapter_shares_one_limiter_across_calls(
    anthropic_server: AnthropicWireServer,
) -> None:
    # 1000 tokens/s. The first reply reports far more input than the bucket holds, so
    # the next call through the same adapter must wait for the debt to refill.
    llm = AnthropicLLM(
        MODEL,
        api_key=SECRET_KEY,
        base_url=anthropic_server.base_url,
        rate_limit=LLMRate(tokens_per_minute=60_000),
    )
    anthropic_server.reply_stream([Text("a")], input_tokens=60_300, output_tokens=1)
    anthropic_server.reply_text("b")
    try:
        assert (await llm.complete([{"role": "user", "content": "x"}])).text == "a"
        started = time.monotonic()
        assert (await llm.complete([{"role": "user", "content": "x"}])).text == "b"
        assert time.monotonic() - started >= 0.3
    finally:
        await llm.aclose()
