"""A client-side limiter for ``LLMRate``: requests and tokens per minute, token buckets.

Staying under the provider's limits is cheaper than meeting its 429s: every turn in a
worker shares one adapter, so one limiter per adapter instance paces all of them.
Waiters queue in arrival order behind an ``asyncio.Lock`` and sleep exactly as long as
the buckets need to refill; nothing polls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from pyrula_stream.errors import ConfigurationError
from pyrula_stream.llm.base import LLMRate


class TokenBucket:
    """``capacity`` units that refill continuously at ``capacity`` per minute.

    The level may go negative: a request larger than the bucket is let through once the
    bucket is full, and the debt it leaves delays whoever comes next.
    """

    def __init__(self, per_minute: float, now: float) -> None:
        if per_minute <= 0:
            raise ConfigurationError(f"rate limits must be positive, got {per_minute}")
        self.capacity = float(per_minute)
        self.per_second = self.capacity / 60.0
        self.level = self.capacity
        self._updated = now

    def refill(self, now: float) -> None:
        elapsed = max(now - self._updated, 0.0)
        self.level = min(self.capacity, self.level + elapsed * self.per_second)
        self._updated = now

    def wait_s(self, amount: float) -> float:
        """Seconds until ``amount`` (at most the capacity) is available."""
        deficit = min(amount, self.capacity) - self.level
        return 0.0 if deficit <= 0 else deficit / self.per_second


class RateLimiter:
    """Paces calls to at most ``requests_per_minute`` and ``tokens_per_minute``.

    ``acquire(tokens)`` reserves one request and an estimate of the tokens before a call;
    ``settle(reserved, actual)`` corrects the token bucket once the provider has said what
    the call really used (0 for a call that failed).
    """

    def __init__(
        self,
        rate: LLMRate,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.rate = rate
        self._clock = clock
        self._sleep = sleep
        now = clock()
        self._requests = (
            TokenBucket(rate.requests_per_minute, now) if rate.requests_per_minute else None
        )
        self._tokens = TokenBucket(rate.tokens_per_minute, now) if rate.tokens_per_minute else None
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None

    def _queue(self) -> asyncio.Lock:
        """One FIFO lock per event loop (an ``asyncio.Lock`` cannot cross loops)."""
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        return self._lock

    def _wait_s(self, tokens: int) -> float:
        now = self._clock()
        wait = 0.0
        if self._requests is not None:
            self._requests.refill(now)
            wait = max(wait, self._requests.wait_s(1))
        if self._tokens is not None:
            self._tokens.refill(now)
            wait = max(wait, self._tokens.wait_s(tokens))
        return wait

    async def acquire(self, tokens: int = 0) -> None:
        """Wait until one request and ``tokens`` tokens fit, then take them."""
        async with self._queue():
            while (wait := self._wait_s(tokens)) > 0:
                await self._sleep(wait)
            if self._requests is not None:
                self._requests.level -= 1
            if self._tokens is not None:
                self._tokens.level -= tokens

    def settle(self, reserved: int, actual: int) -> None:
        """Replace a reservation of ``reserved`` tokens by what the call really used."""
        if self._tokens is None or reserved == actual:
            return
        self._tokens.refill(self._clock())
        self._tokens.level = min(self._tokens.capacity, self._tokens.level + reserved - actual)
