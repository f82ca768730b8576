"""``OpenAIBatchClient``: OpenAI's Batch API (``client.files`` + ``client.batches``) as a
``BatchClient``.

A batch is one JSONL file of Chat Completions calls, uploaded with ``purpose="batch"``,
then a batch job over it (``completion_window="24h"``) whose ``metadata`` carries the
lane's tag (``pyrula_tag``): ``find`` lists the newest batches and reads it back. Each
call's body is what ``OpenAILLM.build_request`` sends live, without streaming; each result
is parsed as a live call's reply is, usage included.

Limits: at most 50,000 calls and 200 MB a batch (the API's); one model a batch. A crash
between the upload and the batch's creation leaves an unused input file, which the
provider deletes when it expires.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pyrula_stream.errors import LLMError
from pyrula_stream.llm._batch_sdk import (
    FIND_MARGIN_S,
    FIND_WINDOW,
    SDKBatchClient,
    guarded,
    outside_window,
)
from pyrula_stream.llm.base import ModelRequest
from pyrula_stream.llm.batch import (
    BatchCall,
    BatchOutcome,
    BatchState,
    BatchStatus,
    OutcomeKind,
    check_calls,
)

if TYPE_CHECKING:
    from openai import AsyncOpenAI
    from openai.types import Batch

    from pyrula_stream.llm.openai import OpenAILLM

ENDPOINT: Literal["/v1/chat/completions"] = "/v1/chat/completions"
TAG_KEY = "pyrula_tag"
"""The batch ``metadata`` key that holds the lane's tag."""
MAX_CALLS = 50_000

_STATES: dict[str, BatchState] = {
    "validating": BatchState.IN_PROGRESS,
    "in_progress": BatchState.IN_PROGRESS,
    "finalizing": BatchState.IN_PROGRESS,
    "cancelling": BatchState.IN_PROGRESS,
    "completed": BatchState.ENDED,
    "expired": BatchState.EXPIRED,
    "cancelled": BatchState.CANCELLED,
    "failed": BatchState.FAILED,
}
# What a call without a line in the output or error file became, by the batch's state.
_MISSING: dict[BatchState, OutcomeKind] = {
    BatchState.EXPIRED: OutcomeKind.EXPIRED,
    BatchState.CANCELLED: OutcomeKind.CANCELLED,
}
_LINE_ERRORS: dict[str, OutcomeKind] = {
    "batch_expired": OutcomeKind.EXPIRED,
    "batch_cancelled": OutcomeKind.CANCELLED,
}
_NO_REQUEST = ModelRequest(messages=[])
"""What a result is parsed against: the calls are not kept, and a result has usage."""


class OpenAIBatchClient(SDKBatchClient["OpenAILLM"]):
    """The Batch API for the model of ``llm``, through the SDK client ``llm`` uses (same
    key, ``base_url`` and request building).

    ``find_window`` and ``find_margin_s`` bound ``find``'s search (see ``find``).
    """

    provider = "openai"

    def __init__(
        self,
        llm: OpenAILLM,
        *,
        max_calls: int = MAX_CALLS,
        find_window: int = FIND_WINDOW,
        find_margin_s: float = FIND_MARGIN_S,
    ) -> None:
        super().__init__(
            llm, max_calls=max_calls, find_window=find_window, find_margin_s=find_margin_s
        )

    def _sdk(self) -> AsyncOpenAI:
        return self.llm._sdk_client()

    async def submit(self, calls: Sequence[BatchCall], *, tag: str) -> str:
        check_calls(calls, tag, self._max_calls)
        lines = [
            {
                "custom_id": call.custom_id,
                "method": "POST",
                "url": ENDPOINT,
                "body": self.llm.batch_body(call.request),
            }
            for call in calls
        ]
        data = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines).encode()
        sdk = self._sdk()
        uploaded = await guarded(
            self.llm,
            sdk.files.create(file=(f"{tag}.jsonl", data, "application/jsonl"), purpose="batch"),
        )
        batch = await guarded(
            self.llm,
            sdk.batches.create(
                input_file_id=uploaded.id,
                endpoint=ENDPOINT,
                completion_window="24h",
                metadata={TAG_KEY: tag},
            ),
        )
        return batch.id

    async def find(self, tag: str, *, submitted_at: float | None = None) -> str | None:
        """The newest batch whose metadata carries ``tag``.

        Batches are listed newest first: with ``submitted_at``, down to the first one
        created ``find_margin_s`` before it; without, the ``find_window`` newest.
        """
        page = await guarded(self.llm, self._sdk().batches.list(limit=100))
        seen = 0
        while True:
            for batch in page.data:
                seen += 1
                where = outside_window(batch.created_at, submitted_at, self._find_margin_s)
                if where == "older" or (submitted_at is None and seen > self._find_window):
                    return None
                if where is None and (batch.metadata or {}).get(TAG_KEY) == tag:
                    return batch.id
            if not page.has_next_page():
                return None
            page = await guarded(self.llm, page.get_next_page())

    async def status(self, batch_id: str) -> BatchStatus:
        return _status(await self._retrieve(batch_id))

    async def _retrieve(self, batch_id: str) -> Batch:
        return await guarded(self.llm, self._sdk().batches.retrieve(batch_id))

    async def results(self, batch_id: str) -> list[BatchOutcome]:
        """Every call's outcome: the output file's answers, the error file's failures,
        and for calls in neither (an expired, cancelled or failed batch) what the
        batch's state says became of them, read from the input file."""
        batch = await self._retrieve(batch_id)
        status = _status(batch)
        if status.state is BatchState.IN_PROGRESS:
            raise LLMError(f"openai batch {batch_id} has not ended ({batch.status})")
        outcomes: dict[str, BatchOutcome] = {}
        for file_id in (batch.output_file_id, batch.error_file_id):
            if file_id:
                for line in await self._lines(file_id):
                    outcome = self._outcome(line)
                    outcomes[outcome.custom_id] = outcome
        if len(outcomes) < status.total or status.state is BatchState.FAILED:
            kind = _MISSING.get(status.state, OutcomeKind.ERRORED)
            reason = status.error or f"no result in a batch that is {batch.status}"
            for line in await self._lines(batch.input_file_id):
                cid = str(line.get("custom_id"))
                if cid not in outcomes:
                    outcomes[cid] = BatchOutcome(cid, error=reason, kind=kind)
        return list(outcomes.values())

    async def _lines(self, file_id: str) -> list[dict[str, Any]]:
        content = await guarded(self.llm, self._sdk().files.content(file_id))
        return [json.loads(text) for text in content.text.splitlines() if text.strip()]

    def _outcome(self, line: dict[str, Any]) -> BatchOutcome:
        from openai.types.chat import ChatCompletion

        cid = str(line.get("custom_id"))
        extra = {"batch_request_id": str(line.get("id"))}
        response = line.get("response")
        error = line.get("error")
        if isinstance(response, dict):
            if response.get("request_id"):
                extra["request_id"] = str(response["request_id"])
            status, body = response.get("status_code"), response.get("body")
            if status == 200 and isinstance(body, dict):
                try:
                    completion = ChatCompletion.model_validate(body)
                    parsed = self.llm.response_of_completion(completion, _NO_REQUEST)
                except Exception as exc:  # one unusable answer is that call's failure
                    text = self.llm.redact(f"unusable answer: {exc}")
                    return BatchOutcome(cid, error=text, extra=extra, kind=OutcomeKind.ERRORED)
                return BatchOutcome(cid, response=parsed, extra=extra)
            detail = body.get("error") if isinstance(body, dict) else None
            message = detail.get("message") if isinstance(detail, dict) else None
            text = f"HTTP {status}: {message or 'error'}"
            return BatchOutcome(cid, error=text, extra=extra, kind=OutcomeKind.ERRORED)
        code = str(error.get("code")) if isinstance(error, dict) else ""
        message = error.get("message") if isinstance(error, dict) else None
        kind = _LINE_ERRORS.get(code, OutcomeKind.ERRORED)
        text = f"{code}: {message or 'no response'}"
        return BatchOutcome(cid, error=text, extra=extra, kind=kind)

    async def cancel(self, batch_id: str) -> None:
        """Cancel a running batch; one already ended (or being cancelled) is left as is."""
        batch = await self._retrieve(batch_id)
        if _STATES.get(batch.status) is not BatchState.IN_PROGRESS or batch.status == "cancelling":
            return
        try:
            await guarded(self.llm, self._sdk().batches.cancel(batch_id))
        except LLMError:  # refused: it ended meanwhile, which is no error
            if (await self.status(batch_id)).state is BatchState.IN_PROGRESS:
                raise


def _status(batch: Batch) -> BatchStatus:
    state = _STATES.get(batch.status, BatchState.IN_PROGRESS)
    counts = batch.request_counts
    total = counts.total if counts is not None else 0
    succeeded = counts.completed if counts is not None else 0
    failed = counts.failed if counts is not None else 0
    if state in (BatchState.EXPIRED, BatchState.CANCELLED, BatchState.FAILED):
        failed = max(total - succeeded, failed)
    error = None
    if batch.errors is not None and batch.errors.data:
        error = "; ".join(
            f"line {e.line}: {e.message}" if e.line else str(e.message) for e in batch.errors.data
        )
    return BatchStatus(batch.id, state, total, succeeded, failed, error)
