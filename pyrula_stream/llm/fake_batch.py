"""``FakeBatch``: a batch API in this process that answers with a ``FakeLLM``.

For tests and examples of the batch lane, as ``FakeLLM`` is for live calls: a batch
ends ``delay_s`` after it was submitted, each call answered by the scripted model.
``submitted`` logs every custom id each submit carried (a call submitted twice shows
twice). It lives in the process that made it, so it does not outlive a killed worker:
the chaos run uses the provider servers in ``tests/llm/servers/`` instead.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from pyrula_stream.llm.base import ModelResponse
from pyrula_stream.llm.batch import (
    BatchCall,
    BatchOutcome,
    BatchState,
    BatchStatus,
    OutcomeKind,
    check_calls,
)
from pyrula_stream.llm.fake import FakeLLM


@dataclass
class _Batch:
    tag: str
    calls: list[BatchCall]
    created: float
    state: BatchState = BatchState.IN_PROGRESS
    outcomes: list[BatchOutcome] = field(default_factory=list)


class FakeBatch:
    """A ``BatchClient`` over a ``FakeLLM`` (see the module docstring)."""

    def __init__(
        self,
        llm: FakeLLM,
        *,
        delay_s: float = 0.0,
        max_calls: int = 10_000,
        expire: bool = False,
        fail_after_submit: int = 0,
        submit_delay_s: float = 0.0,
    ) -> None:
        self.llm = llm
        self.delay_s = delay_s
        self._max_calls = max_calls
        self.expire = expire
        """Batches expire instead of ending: no call gets a result."""
        self.fail_after_submit = fail_after_submit
        """The next this many submits create their batch, then raise (as if the worker
        died before it could journal the batch's id)."""
        self.submit_delay_s = submit_delay_s
        """How long a submit takes before the batch exists (a slow upload)."""
        self.submitted: list[str] = []
        self.cancelled: list[str] = []
        self._batches: dict[str, _Batch] = {}
        self._ids = itertools.count(1)

    @property
    def provider(self) -> str:
        return self.llm.provider or "fake"

    @property
    def model(self) -> str:
        return self.llm.model

    @property
    def max_calls(self) -> int:
        return self._max_calls

    async def submit(self, calls: Sequence[BatchCall], *, tag: str) -> str:
        check_calls(calls, tag, self._max_calls)
        if self.submit_delay_s:
            await asyncio.sleep(self.submit_delay_s)
        batch_id = f"fbatch_{next(self._ids)}"
        self._batches[batch_id] = _Batch(tag, list(calls), time.monotonic())
        self.submitted += [c.custom_id for c in calls]
        if self.fail_after_submit > 0:
            self.fail_after_submit -= 1
            raise ConnectionError("the connection dropped after the batch was created")
        return batch_id

    async def find(self, tag: str, *, submitted_at: float | None = None) -> str | None:
        for batch_id, batch in self._batches.items():
            if batch.tag == tag:
                return batch_id
        return None

    async def status(self, batch_id: str) -> BatchStatus:
        batch = self._batches[batch_id]
        due = time.monotonic() >= batch.created + self.delay_s
        if batch.state == BatchState.IN_PROGRESS and due:
            batch.state = BatchState.EXPIRED if self.expire else BatchState.ENDED
            if not self.expire:
                batch.outcomes = [await self._answer(c) for c in batch.calls]
        done = sum(1 for o in batch.outcomes if o.response is not None)
        return BatchStatus(batch_id, batch.state, len(batch.calls), done, len(batch.calls) - done)

    async def _answer(self, call: BatchCall) -> BatchOutcome:
        final: ModelResponse | None = None
        async for item in self.llm.stream_request(call.request):
            if isinstance(item, ModelResponse):
                final = item
        if final is None:
            return BatchOutcome(call.custom_id, None, "no response", kind=OutcomeKind.ERRORED)
        return BatchOutcome(call.custom_id, final)

    async def results(self, batch_id: str) -> list[BatchOutcome]:
        return list(self._batches[batch_id].outcomes)

    async def cancel(self, batch_id: str) -> None:
        batch = self._batches[batch_id]
        if batch.state == BatchState.IN_PROGRESS:
            batch.state = BatchState.CANCELLED
            self.cancelled.append(batch_id)
