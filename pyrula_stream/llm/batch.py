"""What the batch lane needs of a provider's batch API: submit, look up, poll, collect,
cancel.

Both providers sell the same calls at about half price through a batch API (OpenAI: a
JSONL file uploaded with ``client.files`` and a ``client.batches`` job; Anthropic:
``client.messages.batches``), with results within 24 hours. Each call carries a
``custom_id`` that comes back with its result. A batch is submitted with a ``tag`` (the
lane's own id for it, journaled *before* the submit) so a worker that took over after a
crash between the submit and the journaling of the provider's batch id can find the batch
instead of submitting its calls twice (``find``).

Custom ids carry the tag: ``<tag>-<rest>`` (``custom_id_for``), because Anthropic's
batches have no metadata and their calls' ids are the only thing a lookup can read back.
A tag is 1-40 characters of ``[A-Za-z0-9_]`` (no ``-``, so ``tag_of`` is exact); a custom
id 1-64 characters of ``[A-Za-z0-9_-]`` (Anthropic's rule, applied to every provider so
a lane works the same on each). ``check_calls`` enforces both before anything is sent.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from pyrula_stream.errors import ConfigurationError, LLMProviderUnavailable
from pyrula_stream.llm.base import ModelRequest, ModelResponse

TAG_PATTERN = re.compile(r"[A-Za-z0-9_]{1,40}")
CUSTOM_ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")


def custom_id_for(tag: str, suffix: str | int) -> str:
    """The custom id of one call of the batch ``tag``: ``<tag>-<suffix>``."""
    return f"{tag}-{suffix}"


def tag_of(custom_id: str) -> str:
    """The tag a custom id made by ``custom_id_for`` carries."""
    return custom_id.partition("-")[0]


def check_calls(calls: Sequence[BatchCall], tag: str, max_calls: int) -> None:
    """Refuse a batch the provider would refuse, or ``find`` could not find again."""
    if not TAG_PATTERN.fullmatch(tag):
        raise ConfigurationError(f"batch tag {tag!r} is not 1-40 characters of [A-Za-z0-9_]")
    if not calls:
        raise ConfigurationError(f"batch {tag!r} has no calls")
    if len(calls) > max_calls:
        raise ConfigurationError(f"batch {tag!r} has {len(calls)} calls; at most {max_calls}")
    seen: set[str] = set()
    for call in calls:
        cid = call.custom_id
        if not CUSTOM_ID_PATTERN.fullmatch(cid) or tag_of(cid) != tag or cid == tag:
            raise ConfigurationError(
                f"custom_id {cid!r} of batch {tag!r} is not '{tag}-<suffix>' "
                "(1-64 characters of [A-Za-z0-9_-])"
            )
        if cid in seen:
            raise ConfigurationError(f"custom_id {cid!r} appears twice in batch {tag!r}")
        seen.add(cid)


class BatchLookupPending(LLMProviderUnavailable):
    """``find`` cannot answer yet: a batch that may carry the tag is still running and
    the provider shows its calls only once it ends (Anthropic). Ask again later; never
    submit again on this answer."""


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
    """A batch as the provider reports it; ``failed`` counts every call without a
    response (errored, expired or cancelled), as far as the provider has counted."""

    batch_id: str
    state: BatchState
    total: int = 0
    succeeded: int = 0
    failed: int = 0
    error: str | None = None


class OutcomeKind(StrEnum):
    """What became of one call of a batch."""

    SUCCEEDED = "succeeded"
    ERRORED = "errored"
    """The provider ran the call and it failed (or the batch has no result for it)."""
    EXPIRED = "expired"
    """The batch's window passed before the call ran: it did not run, and is not billed."""
    CANCELLED = "cancelled"
    """The batch was cancelled before the call ran: it did not run, and is not billed."""


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """One call's result: a response, or why it has none (``error``)."""

    custom_id: str
    response: ModelResponse | None = None
    error: str | None = None
    extra: dict[str, str] = field(default_factory=dict)
    kind: OutcomeKind = OutcomeKind.SUCCEEDED


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
        """Submit the calls as one batch labelled ``tag``; the provider's batch id.

        Every call's ``custom_id`` must be ``custom_id_for(tag, ...)`` (``check_calls``).
        """
        ...

    async def find(self, tag: str, *, submitted_at: float | None = None) -> str | None:
        """The provider's id of a batch submitted with ``tag``, or ``None`` when none was
        (the lookup after a crash between ``submit`` and journaling its answer).

        ``submitted_at`` (epoch seconds, journaled before the submit) narrows the search
        to batches created near it; without it the client's most recent batches are
        searched. Raises ``BatchLookupPending`` when it cannot tell yet.
        """
        ...

    async def status(self, batch_id: str) -> BatchStatus: ...

    async def results(self, batch_id: str) -> list[BatchOutcome]:
        """Every call's outcome of an ended (or expired, or cancelled) batch."""
        ...

    async def cancel(self, batch_id: str) -> None:
        """Ask the provider to stop the batch; cancelling an ended one is not an error."""
        ...
