"""What the batch lane needs of a provider's batch API: submit, look up, poll, collect,
cancel.

Both providers sell the same calls at about half price through a batch API (OpenAI: a
JSONL file uploaded with ``client.files`` and a ``client.batches`` job; Anthropic:
``client.messages.batches``), with results within 24 hours. Each call carries a
``custom_id`` that comes back with its result. A batch is submitted with a ``tag`` (the
lane's own id for it, journaled *before* the submit) so a worker that took over after a
crash between the submit and the journaling of the provider's batch id can find the batch
instead of submitting its calls twice (``find``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from pyrula_stream.llm.base import ModelRequest, ModelResponse


@dataclass(frozen=True, slots=True)
class BatchCall:
    """One model call queued for a batch; ``custom_id`` names it in the results."""

    custom_id: str
    request: ModelRequest


class BatchState(StrEnum):
    """A submitted batch's state, the same for every provider."""

    IN_PROGRESS = "in_progress"
    """Accepted (validating, queued or running): poll again later."""
    ENDED = "ended"
    """Results are ready (some calls may still have failed one by one)."""
    EXPIRED = "expired"
    """The provider's window passed; calls without a result did not run."""
    CANCELLED = "cancelled"
    FAILED = "failed"
    """The batch as a whole was refused (bad file, bad request)."""


@dataclass(frozen=True, slots=True)
class BatchStatus:
    batch_id: str
    state: BatchState
    total: int = 0
    succeeded: int = 0
    failed: int = 0
    error: str | None = None


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """One call's result: a response, or why it has none (``error``)."""

    custom_id: str
    response: ModelResponse | None = None
    error: str | None = None
    extra: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class BatchClient(Protocol):
    """A provider's batch API for one model, through the provider's official SDK."""

    @property
    def provider(self) -> str:
        """``"openai"``, ``"anthropic"``, ...: what the lane groups calls by (with
        ``model``) and what cost tables price."""
        ...

    @property
    def model(self) -> str: ...

    @property
    def max_calls(self) -> int:
        """The most calls one batch may hold at this provider."""
        ...

    async def submit(self, calls: Sequence[BatchCall], *, tag: str) -> str:
        """Submit the calls as one batch labelled ``tag``; the provider's batch id."""
        ...

    async def find(self, tag: str) -> str | None:
        """The provider's id of a batch submitted with ``tag``, or ``None`` when none was
        (the lookup after a crash between ``submit`` and journaling its answer)."""
        ...

    async def status(self, batch_id: str) -> BatchStatus: ...

    async def results(self, batch_id: str) -> list[BatchOutcome]:
        """Every call's outcome of an ended (or expired, or cancelled) batch."""
        ...

    async def cancel(self, batch_id: str) -> None:
        """Ask the provider to stop the batch; cancelling an ended one is not an error."""
        ...
