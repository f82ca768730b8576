"""``AnthropicBatchClient``: Anthropic's Message Batches (``client.messages.batches``) as
a ``BatchClient``.

Each call's ``params`` are what ``AnthropicLLM.build_request`` sends live (prompt-cache
breakpoints included); each result is parsed as a live call's reply is, usage included.

Finding a batch by tag: message batches carry no metadata, and a running batch's calls
cannot be read back (results exist only once it ends). So the tag rides in every
``custom_id`` (``<tag>-<suffix>``, see ``pyrula_stream.llm.batch``) and ``find`` lists
the newest batches, reading the first result line of each ended one near the submit
time. While a batch that may be the one is still running, ``find`` raises
``BatchLookupPending`` rather than answer ``None`` (which would have the calls submitted
twice): the answer can wait as long as that batch runs (up to the provider's 24 hours).
Without ``submitted_at`` every running batch among the ``find_window`` newest counts as
such a batch. Limits: at most 100,000 calls and 256 MB a batch (the API's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyrula_stream.errors import LLMError
from pyrula_stream.llm._batch_sdk import (
    FIND_MARGIN_S,
    FIND_WINDOW,
    SDKBatchClient,
    guarded,
    outside_window,
)
from pyrula_stream.llm.batch import (
    BatchCall,
    BatchLookupPending,
    BatchOutcome,
    BatchState,
    BatchStatus,
    OutcomeKind,
    check_calls,
    tag_of,
)

if TYPE_CHECKING:
    from anthropic import AsyncAnthropic
    from anthropic.types.messages import MessageBatch, MessageBatchIndividualResponse

    from pyrula_stream.llm.anthropic import AnthropicLLM

MAX_CALLS = 100_000


class AnthropicBatchClient(SDKBatchClient["AnthropicLLM"]):
    """Message Batches for the model of ``llm``, through the SDK client ``llm`` uses
    (same key, ``base_url`` and request building).

    ``find_window`` and ``find_margin_s`` bound ``find``'s search (see the module).
    """

    provider = "anthropic"

    def __init__(
        self,
        llm: AnthropicLLM,
        *,
        max_calls: int = MAX_CALLS,
        find_window: int = FIND_WINDOW,
        find_margin_s: float = FIND_MARGIN_S,
    ) -> None:
        super().__init__(
            llm, max_calls=max_calls, find_window=find_window, find_margin_s=find_margin_s
        )

    def _sdk(self) -> AsyncAnthropic:
        return self.llm._sdk_client()

    async def submit(self, calls: Sequence[BatchCall], *, tag: str) -> str:
        check_calls(calls, tag, self._max_calls)
        requests = [
            {"custom_id": call.custom_id, "params": self.llm.batch_params(call.request)}
            for call in calls
        ]
        batch = await guarded(
            self.llm,
            self._sdk().messages.batches.create(requests=requests),  # type: ignore[arg-type]
        )
        return batch.id

    async def find(self, tag: str, *, submitted_at: float | None = None) -> str | None:
        page = await guarded(self.llm, self._sdk().messages.batches.list(limit=100))
        seen = running = 0
        while True:
            for batch in page.data:
                seen += 1
                where = outside_window(
                    batch.created_at.timestamp(), submitted_at, self._find_margin_s
                )
                if where == "older" or (submitted_at is None and seen > self._find_window):
                    self._check_running(tag, running)
                    return None
                if where == "newer":
                    continue
                if batch.processing_status != "ended":
                    running += 1
                elif batch.results_url and await self._first_tag(batch.id) == tag:
                    return batch.id
            if not page.has_next_page():
                self._check_running(tag, running)
                return None
            page = await guarded(self.llm, page.get_next_page())

    def _check_running(self, tag: str, running: int) -> None:
        """Not found; but a running batch may still be the one: say so."""
        if running:
            raise BatchLookupPending(
                f"anthropic: {running} running batch(es) may hold tag {tag!r}; "
                "their calls can be read once they end"
            )

    async def _first_tag(self, batch_id: str) -> str | None:
        """The tag of the batch's first result line (every line carries the same)."""
        decoder = await guarded(self.llm, self._sdk().messages.batches.results(batch_id))
        try:
            async for item in decoder:
                return tag_of(item.custom_id)
        finally:
            await decoder.close()
        return None

    async def _retrieve(self, batch_id: str) -> MessageBatch:
        return await guarded(self.llm, self._sdk().messages.batches.retrieve(batch_id))

    async def status(self, batch_id: str) -> BatchStatus:
        batch = await self._retrieve(batch_id)
        c = batch.request_counts
        total = c.processing + c.succeeded + c.errored + c.canceled + c.expired
        if batch.processing_status != "ended":
            state = BatchState.IN_PROGRESS
        elif batch.cancel_initiated_at is not None:
            state = BatchState.CANCELLED
        elif c.expired:
            state = BatchState.EXPIRED
        else:
            state = BatchState.ENDED
        failed = c.errored + c.canceled + c.expired
        return BatchStatus(batch.id, state, total, c.succeeded, failed)

    async def results(self, batch_id: str) -> list[BatchOutcome]:
        batch = await self._retrieve(batch_id)
        if batch.processing_status != "ended" or not batch.results_url:
            raise LLMError(
                f"anthropic batch {batch_id} has no results yet ({batch.processing_status})"
            )
        decoder = await guarded(self.llm, self._sdk().messages.batches.results(batch_id))
        outcomes: list[BatchOutcome] = []
        try:
            async for item in decoder:
                outcomes.append(self._outcome(item))
        finally:
            await decoder.close()
        return outcomes

    def _outcome(self, item: MessageBatchIndividualResponse) -> BatchOutcome:
        cid, result = item.custom_id, item.result
        if result.type == "succeeded":
            try:
                response = self.llm.response_of_message(result.message)
            except Exception as exc:  # one unusable answer is that call's failure
                text = self.llm.redact(f"unusable answer: {exc}")
                return BatchOutcome(cid, error=text, kind=OutcomeKind.ERRORED)
            return BatchOutcome(cid, response=response, extra={"message_id": result.message.id})
        if result.type == "errored":
            error = result.error.error
            extra = {"request_id": result.error.request_id} if result.error.request_id else {}
            return BatchOutcome(
                cid, error=f"{error.type}: {error.message}", extra=extra, kind=OutcomeKind.ERRORED
            )
        if result.type == "expired":
            return BatchOutcome(cid, error="expired before it ran", kind=OutcomeKind.EXPIRED)
        return BatchOutcome(cid, error="cancelled before it ran", kind=OutcomeKind.CANCELLED)

    async def cancel(self, batch_id: str) -> None:
        """Cancel a running batch; one already ended (or being cancelled) is left as is."""
        batch = await self._retrieve(batch_id)
        if batch.processing_status != "in_progress":
            return
        try:
            await guarded(self.llm, self._sdk().messages.batches.cancel(batch_id))
        except LLMError:  # refused: it ended meanwhile, which is no error
            if (await self._retrieve(batch_id)).processing_status == "in_progress":
                raise
