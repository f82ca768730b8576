"""``RetryPolicy``: how many times a tool (or step) is tried and how long to wait between.

The policy is pure data plus two decisions (``should_retry`` and ``delay_for``) so the code
that runs attempts stays small and the decisions can be tested without running anything.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pyrula_stream.errors import ConfigurationError, Fatal, Poison

__all__ = ["RetryPolicy", "RetryResult", "run_with_retry"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    """Attempts, jittered exponential backoff, and which errors deserve another try.

    ``max_attempts`` counts the first attempt, so ``RetryPolicy()`` tries once. ``Fatal``
    and ``Poison`` are never retried, whatever ``retry_on`` says: the tool raised them to
    say that trying again cannot help. ``non_retryable`` wins over ``retry_on``.
    """

    max_attempts: int = 1
    initial_interval: float = 0.1
    backoff_coefficient: float = 2.0
    max_interval: float = 10.0
    jitter: float = 0.2
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    non_retryable: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        # Fail where the policy is written, not on the first failing call in production.
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise ConfigurationError(f"max_attempts must be an int, got {self.max_attempts!r}")
        if self.max_attempts < 1:
            raise ConfigurationError(
                f"max_attempts counts the first attempt and must be >= 1, got {self.max_attempts}"
            )
        for field_name in ("initial_interval", "max_interval"):
            value = getattr(self, field_name)
            if not _is_finite_number(value) or value < 0:
                raise ConfigurationError(
                    f"{field_name} must be a finite number >= 0, got {value!r}"
                )
        if not _is_finite_number(self.backoff_coefficient) or self.backoff_coefficient < 1:
            raise ConfigurationError(
                "backoff_coefficient must be a finite number >= 1, "
                f"got {self.backoff_coefficient!r}"
            )
        if not _is_finite_number(self.jitter) or not 0 <= self.jitter <= 1:
            raise ConfigurationError(f"jitter is a fraction in [0, 1], got {self.jitter!r}")
        for field_name in ("retry_on", "non_retryable"):
            classes = getattr(self, field_name)
            if not isinstance(classes, tuple) or not all(
                isinstance(c, type) and issubclass(c, BaseException) for c in classes
            ):
                raise ConfigurationError(
                    f"{field_name} must be a tuple of exception classes, got {classes!r}"
                )

    @classmethod
    def from_retries(cls, retries: int) -> RetryPolicy:
        """The ``@tool(retry=<int>)`` form: that many retries after the first try, no wait."""
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ConfigurationError(f"retry must be an int >= 0 or a RetryPolicy, got {retries!r}")
        return cls(max_attempts=retries + 1, initial_interval=0.0, max_interval=0.0, jitter=0.0)

    def base_delay_for(self, attempt: int) -> float:
        """The un-jittered wait after failed attempt ``attempt`` (1-based), capped."""
        if attempt < 1:
            raise ValueError(f"attempt is 1-based, got {attempt}")
        try:
            raw = self.initial_interval * self.backoff_coefficient ** (attempt - 1)
        except OverflowError:
            return self.max_interval
        return min(self.max_interval, raw)

    def delay_for(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based) before the next one.

        Jitter spreads retries of many turns that failed together (a backend blip) so they
        do not hit the backend again in lockstep. The result stays within
        ``[base * (1 - jitter), min(max_interval, base * (1 + jitter))]``.
        """
        base = self.base_delay_for(attempt)
        if base == 0 or self.jitter == 0:
            return base
        jittered = base * (1 + self.jitter * random.uniform(-1.0, 1.0))
        return max(0.0, min(self.max_interval, jittered))

    def should_retry(self, exc: BaseException, attempt: int) -> bool:
        """Whether failed attempt ``attempt`` (1-based), which raised ``exc``, gets another."""
        if attempt >= self.max_attempts:
            return False
        # Cancellation, KeyboardInterrupt and SystemExit are the process talking, not the tool.
        if not isinstance(exc, Exception):
            return False
        if isinstance(exc, Fatal | Poison):
            return False
        if self.non_retryable and isinstance(exc, self.non_retryable):
            return False
        return isinstance(exc, self.retry_on)


@dataclass(frozen=True)
class RetryResult:
    """How a retried operation ended: a value, or the last error (returned, not raised)."""

    value: Any
    error: Exception | None
    attempts: int


def _never_give_up(exc: Exception) -> bool:
    return False


async def run_with_retry(
    policy: RetryPolicy,
    attempt: Callable[[], Awaitable[Any]],
    *,
    give_up: Callable[[Exception], bool] = _never_give_up,
    label: str = "operation",
) -> RetryResult:
    """Run ``attempt`` until it succeeds or ``policy`` (or ``give_up``) says stop.

    Shared by tools and steps so both count attempts and wait the same way. Only
    ``Exception`` is caught: cancellation propagates at once, mid-attempt or mid-wait.
    """
    number = 0
    while True:
        number += 1
        try:
            value = await attempt()
        except Exception as exc:
            if give_up(exc) or not policy.should_retry(exc, number):
                return RetryResult(None, exc, number)
            delay = policy.delay_for(number)
            logger.info("%s attempt %d failed (%r); retrying in %.3fs", label, number, exc, delay)
            if delay > 0:
                await asyncio.sleep(delay)
            continue
        return RetryResult(value, None, number)


def _is_finite_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
