"""Our own retry loop for provider calls.

The SDKs' built-in retries are switched off (``max_retries=0``) because they cannot know
what we already showed the caller: a stream may only be restarted before its first delta
left the adapter, otherwise the display would silently show text from two different
answers. The loop also owns the rate limiter, so every attempt pays for its request.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Literal

from pyrula_stream.errors import (
    ConfigurationError,
    ContextWindowExceeded,
    LLMError,
    LLMProviderUnavailable,
    LLMRateLimited,
    ProviderStreamTruncated,
    PyrulaError,
)
from pyrula_stream.llm.base import DEFAULT_MAX_RETRIES, ModelResponse, StreamItem
from pyrula_stream.llm.ratelimit import RateLimiter

FailureKind = Literal[
    "rate_limited", "unavailable", "truncated", "context_window", "configuration", "fatal"
]
_RETRIABLE: frozenset[FailureKind] = frozenset({"rate_limited", "unavailable", "truncated"})


@dataclass(frozen=True, slots=True)
class ProviderFailure:
    """A provider error reduced to what the retry loop needs; ``message`` is already redacted."""

    kind: FailureKind
    message: str
    status: int | None = None
    retry_after_s: float | None = None
    request_id: str | None = None

    @property
    def retriable(self) -> bool:
        return self.kind in _RETRIABLE


@dataclass(frozen=True, slots=True)
class ProviderRetryPolicy:
    """How many times and how long to wait; ``backoff_base_s`` is small in tests."""

    max_retries: int = DEFAULT_MAX_RETRIES
    backoff_base_s: float = 0.5
    backoff_max_s: float = 20.0
    max_retry_after_s: float = 60.0

    def delay_s(self, retry: int, retry_after_s: float | None) -> float:
        """The wait before retry number ``retry`` (0-based).

        A provider's ``retry-after`` wins (capped so one header cannot park a worker for
        long); otherwise exponential backoff with "equal jitter", so concurrent callers
        that failed together do not come back together.
        """
        if retry_after_s is not None:
            return min(max(retry_after_s, 0.0), self.max_retry_after_s)
        ceiling = min(self.backoff_max_s, self.backoff_base_s * (2.0**retry))
        return ceiling / 2 + random.uniform(0, ceiling / 2)


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``retry-after`` (seconds or HTTP date)."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return max(float(raw_ms) / 1000.0, 0.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(float(raw), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def failure_to_error(failure: ProviderFailure, provider: str, attempts: int) -> PyrulaError:
    """The user-facing exception for a failure the loop gives up on."""
    where = f"HTTP {failure.status}" if failure.status else "no HTTP status"
    tries = f"{attempts} attempt{'s' if attempts != 1 else ''}"
    text = f"{provider}: {failure.message} ({where}, {tries})"
    detail = {
        "provider": provider,
        "status": failure.status,
        "request_id": failure.request_id,
        "attempts": attempts,
        "retry_after_s": failure.retry_after_s,
    }
    if failure.kind == "rate_limited":
        return LLMRateLimited(text, detail=detail)
    if failure.kind == "truncated":
        return ProviderStreamTruncated(text, detail=detail)
    if failure.kind == "unavailable":
        return LLMProviderUnavailable(text, detail=detail)
    if failure.kind == "context_window":
        return ContextWindowExceeded(text, detail=detail)
    if failure.kind == "configuration":
        return ConfigurationError(f"{provider}: {failure.message}")
    return LLMError(text, detail=detail)


Classifier = Callable[[BaseException], ProviderFailure | None]
Sleep = Callable[[float], Awaitable[None]]


async def stream_with_retries(
    attempt: Callable[[], AsyncGenerator[StreamItem, None]],
    *,
    classify: Classifier,
    policy: ProviderRetryPolicy,
    provider: str,
    limiter: RateLimiter | None = None,
    estimated_tokens: int = 0,
    sleep: Sleep = asyncio.sleep,
) -> AsyncGenerator[StreamItem, None]:
    """Run ``attempt`` until it completes, retrying retriable failures before any output.

    ``classify`` maps an SDK exception to a ``ProviderFailure`` (or ``None`` to let it
    through untouched). Errors are raised outside the ``except`` block so the SDK
    exception, which holds the request and its auth header, is not chained onto ours.
    """
    retries = 0
    while True:
        if limiter is not None:
            await limiter.acquire(estimated_tokens)
        yielded = False
        billed: int | None = None
        try:
            async with aclosing(attempt()) as items:
                async for item in items:
                    if isinstance(item, ModelResponse):
                        billed = item.usage.billed_tokens
                    yielded = True
                    yield item
        except ProviderStreamTruncated as exc:
            failure = ProviderFailure("truncated", exc.message)
        except Exception as exc:
            classified = classify(exc)
            if classified is None:
                raise
            failure = classified
        else:
            if limiter is not None:
                limiter.settle(estimated_tokens, billed if billed is not None else estimated_tokens)
            return
        if limiter is not None:
            limiter.settle(estimated_tokens, 0)  # a failed attempt is refunded its tokens
        if yielded or not failure.retriable or retries >= policy.max_retries:
            raise failure_to_error(failure, provider, attempts=retries + 1)
        await sleep(policy.delay_s(retries, failure.retry_after_s))
        retries += 1
