"""The batch lane (floor 4): which of an agent's model calls may wait for a provider's
batch API, at half the price, and what happens when a batch does not deliver.

``@kafka_agent(..., batch=BatchLane(client, when="always"))``. A call on the lane is not
sent live: its turn journals the queued call and parks (no slot held), a collector in the
worker submits it with others in one batch, and the turn resumes when its result is
journaled (``runtime/batch_collector.py``). ``when`` says which calls may wait:

- ``"always"``: every model call of every turn (unless its request says
  ``deferrable=False``);
- ``"lag"``: while the worker's backlog (turns read and not finished) is at least
  ``lag_threshold``;
- ``"deferrable"``: only turns whose request allows it (``deferrable=True`` or a
  ``deadline`` at least ``min_deadline_s`` away).

A turn a person or a client waits on stays live unless its request says otherwise: the
gateway's streamed submits mark their requests ``deferrable=False``. The request's
fields travel in its metadata (``REQUEST_DEFERRABLE``, ``REQUEST_DEADLINE_MS``): a
reserved name each, so an older worker reads such a request as any other.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pyrula_stream.errors import AgentRegistrationError
from pyrula_stream.llm.batch import BatchClient

LaneWhen = Literal["always", "lag", "deferrable"]
OnBatchFailure = Literal["live", "fail"]

REQUEST_DEFERRABLE = "pyrula.deferrable"
"""Metadata key of a request that may (``True``) or may not (``False``) wait in a batch."""
REQUEST_DEADLINE_MS = "pyrula.deadline_ms"
"""Metadata key of a request's deadline (epoch milliseconds): a batch call waits until
then at most."""

DEFAULT_MAX_WAIT_S = 24 * 3600.0
"""The providers' batch window: a call waits this long at most without a deadline."""


@dataclass(frozen=True, slots=True)
class BatchLane:
    """How an agent's model calls may go by batch (see the module docstring)."""

    client: BatchClient
    """The provider's batch API for the agent's model (``OpenAIBatch``, ``AnthropicBatch``)."""
    when: LaneWhen = "always"
    lag_threshold: int = 1000
    """With ``when="lag"``: the backlog (turns read, not finished) from which calls wait."""
    min_deadline_s: float = 60.0
    """With ``when="deferrable"``: a deadline nearer than this keeps the call live."""
    max_wait_s: float = DEFAULT_MAX_WAIT_S
    """The longest a call waits for its batch when its request gives no deadline; then
    ``on_failure`` decides."""
    max_batch: int | None = None
    """Calls per batch at most (``None``: the client's ``max_calls``): a batch is
    submitted when it holds this many ..."""
    max_age_s: float = 5.0
    """... or when its oldest call has waited this long."""
    poll_interval_s: float = 30.0
    """How often a submitted batch's status is asked."""
    on_failure: OnBatchFailure = "live"
    """A call whose batch failed, expired or was cancelled, or whose deadline passed:
    ``"live"`` sends it live, ``"fail"`` fails it (``LLMError``, which fails the turn
    unless its body catches it)."""

    def __post_init__(self) -> None:
        if not isinstance(self.client, BatchClient):
            raise AgentRegistrationError(
                f"BatchLane(client=...) takes a BatchClient (submit, find, status, results, "
                f"cancel), not {type(self.client).__name__}"
            )
        if self.when not in ("always", "lag", "deferrable"):
            raise AgentRegistrationError(
                f"BatchLane(when=...) is 'always', 'lag' or 'deferrable', not {self.when!r}"
            )
        if self.on_failure not in ("live", "fail"):
            raise AgentRegistrationError(
                f"BatchLane(on_failure=...) is 'live' or 'fail', not {self.on_failure!r}"
            )
        for name in ("max_wait_s", "max_age_s", "poll_interval_s"):
            if float(getattr(self, name)) <= 0:
                raise AgentRegistrationError(f"BatchLane({name}=...) must be > 0 seconds")
        if self.max_batch is not None and self.max_batch < 1:
            raise AgentRegistrationError("BatchLane(max_batch=...) must be at least 1")
        if self.lag_threshold < 0:
            raise AgentRegistrationError("BatchLane(lag_threshold=...) must be >= 0")

    @property
    def batch_size(self) -> int:
        """The most calls one batch of this lane holds."""
        most = max(1, int(self.client.max_calls))
        return most if self.max_batch is None else min(most, self.max_batch)

    def waits(self, metadata: Mapping[str, Any], backlog: int, now_ms: int | None = None) -> bool:
        """Whether a call of a turn with this request ``metadata`` goes on the lane, with
        ``backlog`` turns read and not finished on the worker."""
        deferrable = metadata.get(REQUEST_DEFERRABLE)
        if deferrable is False or deferrable == "false":
            return False
        if self.when == "always":
            return True
        if self.when == "lag":
            return backlog >= self.lag_threshold or deferrable is True
        if deferrable is True or deferrable == "true":
            return True
        deadline = request_deadline_ms(metadata)
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return deadline is not None and deadline - now >= self.min_deadline_s * 1000

    def deadline_ms(self, metadata: Mapping[str, Any], now_ms: int) -> int:
        """When a call queued now stops waiting for its batch."""
        latest = now_ms + int(self.max_wait_s * 1000)
        deadline = request_deadline_ms(metadata)
        return latest if deadline is None else min(latest, deadline)


def request_deadline_ms(metadata: Mapping[str, Any]) -> int | None:
    """The request's deadline (epoch ms), or ``None`` when it has none or it is unreadable."""
    value = metadata.get(REQUEST_DEADLINE_MS)
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


Deadline = datetime | float | int | str
"""A request's deadline: a ``datetime`` (naive: UTC), epoch seconds, or ISO 8601 text."""


def deadline_ms_of(deadline: Deadline) -> int:
    """``deadline`` as epoch milliseconds; ``ValueError`` naming what was wrong."""
    if isinstance(deadline, bool):
        raise ValueError(f"a deadline is a datetime, epoch seconds or ISO 8601, not {deadline!r}")
    if isinstance(deadline, int | float):
        return int(float(deadline) * 1000)
    if isinstance(deadline, str):
        try:
            deadline = datetime.fromisoformat(deadline)
        except ValueError:
            why = f"deadline {deadline!r} is not ISO 8601 (2026-12-24T18:00:00Z)"
            raise ValueError(why) from None
    if isinstance(deadline, datetime):
        when = deadline if deadline.tzinfo is not None else deadline.replace(tzinfo=UTC)
        return int(when.timestamp() * 1000)
    raise ValueError(f"a deadline is a datetime, epoch seconds or ISO 8601, not {deadline!r}")


def lane_metadata(deferrable: bool | None, deadline: Deadline | None) -> dict[str, Any]:
    """What a submit adds to a request's metadata for ``deferrable`` and ``deadline``."""
    out: dict[str, Any] = {}
    if deferrable is not None:
        if not isinstance(deferrable, bool):
            raise ValueError(f"deferrable is true or false, not {deferrable!r}")
        out[REQUEST_DEFERRABLE] = deferrable
    if deadline is not None:
        out[REQUEST_DEADLINE_MS] = deadline_ms_of(deadline)
    return out
