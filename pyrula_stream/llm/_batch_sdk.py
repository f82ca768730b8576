"""What both batch clients share: their settings, SDK errors as ours, and a lookup's time
window."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Generic, TypeVar

from pyrula_stream.llm._adapter import SDKAdapter
from pyrula_stream.llm._retry import ProviderFailure, failure_to_error

T = TypeVar("T")
L = TypeVar("L", bound=SDKAdapter)

FIND_WINDOW = 100
"""Without a submit time, ``find`` looks at this many of the newest batches."""

FIND_MARGIN_S = 600.0
"""How far a batch's creation time may lie from the journaled submit time and still be
the one (clock skew between the worker and the provider, and a slow submit)."""


async def guarded(adapter: SDKAdapter, call: Awaitable[T]) -> T:
    """``await call``, its SDK errors raised as ours (classified and redacted as the live
    adapter's are: ``LLMRateLimited``, ``LLMProviderUnavailable``, ``LLMError``, ...).

    One attempt: the batch lane polls again on its own schedule, and a submit retried
    blindly could create the batch twice.
    """
    failure: ProviderFailure | None = None
    try:
        return await call
    except Exception as exc:
        failure = adapter._classify_safely(exc)
        if failure is None:
            raise
    # Raised outside the except block: the SDK error (which holds the request and its
    # auth header) is not chained onto ours.
    raise failure_to_error(failure, adapter.provider, attempts=1)


def outside_window(created_at: float, submitted_at: float | None, margin_s: float) -> str | None:
    """``"older"`` or ``"newer"`` when a batch created at ``created_at`` cannot be the one
    submitted at ``submitted_at``; ``None`` when it may be."""
    if submitted_at is None:
        return None
    if created_at < submitted_at - margin_s:
        return "older"
    if created_at > submitted_at + margin_s:
        return "newer"
    return None


class SDKBatchClient(Generic[L]):
    """The batch API of the live adapter ``llm`` (its SDK client, key and model): how many
    calls a batch may hold and how far ``find`` looks."""

    def __init__(
        self,
        llm: L,
        *,
        max_calls: int,
        find_window: int = FIND_WINDOW,
        find_margin_s: float = FIND_MARGIN_S,
    ) -> None:
        self.llm = llm
        self._max_calls = max_calls
        self._find_window = find_window
        self._find_margin_s = find_margin_s

    @property
    def model(self) -> str:
        return str(self.llm.model)

    @property
    def max_calls(self) -> int:
        return self._max_calls

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.llm!r})"
