"""A local server speaking Anthropic's Message Batches API and the Messages API, one
responder for both.

- ``POST /v1/messages/batches`` (``requests: [{custom_id, params}]``, custom ids of
  1-64 ``[a-zA-Z0-9_-]``, unique), ``GET /v1/messages/batches/{id}``, ``GET
  /v1/messages/batches`` (newest first; ``limit``, ``after_id``, ``before_id``), ``POST
  /v1/messages/batches/{id}/cancel``, ``GET /v1/messages/batches/{id}/results`` (JSONL of
  ``{custom_id, result: {type: succeeded | errored | canceled | expired, ...}}``).
- ``processing_status`` is ``in_progress`` until the due time, ``canceling`` after a
  cancel, then ``ended``; ``request_counts`` tally ``processing``, ``succeeded``,
  ``errored``, ``canceled`` and ``expired``; ``results_url`` is set once ended.
- ``POST /v1/messages`` answers live calls (streamed or not) from the same responder.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime
from typing import Any

from pyrula_stream.testing_servers._http import (
    Request,
    Response,
    json_response,
)
from pyrula_stream.testing_servers.answers import Answer, CallError, Prompt
from pyrula_stream.testing_servers.batch_provider import BatchProviderServer
from pyrula_stream.testing_servers.batches import Batch, CallResult
from pyrula_stream.testing_servers.wire import anthropic_error, anthropic_message, anthropic_stream

MODEL = "claude-sonnet-4-6"
MAX_CALLS = 100_000
CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_BATCHES = r"/v1/messages/batches"


def _error(status: int, message: str, error_type: str = "invalid_request_error") -> Response:
    return json_response(status, anthropic_error(CallError(status, error_type, message)))


def _not_found(request: Request) -> Response:
    return _error(404, f"message batch {request.match['id']!r} not found", "not_found_error")


def _rfc3339(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


class AnthropicBatchServer(BatchProviderServer):
    """Anthropic's message batches and messages on a loopback port.

    ``responder`` answers every call, live or batched (a ``ScriptedResponder`` when not
    given). ``book`` holds the batches and the knobs (``delay_s``, ``fail_ids``,
    ``expire``); ``log`` (a path) appends one JSON line per call submitted.
    """

    provider = "anthropic"
    batch_id_prefix = "msgbatch_"

    def add_routes(self) -> None:
        self.route("POST", r"/v1/messages", self.live)
        self.route("POST", _BATCHES, self._create)
        self.route("GET", _BATCHES, self._list)
        self.route("GET", _BATCHES + r"/(?P<id>[\w-]+)", self._retrieve)
        self.route("POST", _BATCHES + r"/(?P<id>[\w-]+)/cancel", self._cancel)
        self.route("GET", _BATCHES + r"/(?P<id>[\w-]+)/results", self._results)

    # -- wire shapes -------------------------------------------------------------------

    def wire_error(self, error: CallError) -> dict[str, Any]:
        return anthropic_error(error)

    def wire_reply(self, answer: Answer, prompt: Prompt) -> dict[str, Any]:
        return anthropic_message(answer, prompt)

    def wire_stream(self, answer: Answer, prompt: Prompt) -> list[bytes]:
        return anthropic_stream(answer, prompt)

    # -- batches -------------------------------------------------------------------------

    def _create(self, request: Request) -> Response:
        body = request.json()
        requests = body.get("requests") if isinstance(body, dict) else None
        if not isinstance(requests, list) or not requests:
            return _error(400, "requests: a non-empty list is required")
        if len(requests) > MAX_CALLS:
            return _error(413, f"a batch holds at most {MAX_CALLS} requests")
        calls: list[tuple[str, dict[str, Any]]] = []
        seen: set[str] = set()
        for index, item in enumerate(requests):
            cid = item.get("custom_id") if isinstance(item, dict) else None
            params = item.get("params") if isinstance(item, dict) else None
            where = f"requests.{index}"
            if not isinstance(cid, str) or not CUSTOM_ID.fullmatch(cid):
                return _error(400, f"{where}.custom_id: 1-64 characters of [a-zA-Z0-9_-]")
            if cid in seen:
                return _error(400, f"{where}.custom_id: {cid!r} is not unique in the batch")
            if not isinstance(params, dict) or not all(
                params.get(k) for k in ("model", "max_tokens", "messages")
            ):
                return _error(400, f"{where}.params: model, max_tokens and messages are required")
            if params.get("stream"):
                return _error(400, f"{where}.params.stream: a batched request cannot stream")
            seen.add(cid)
            calls.append((cid, params))
        if self.book.take_refusal():
            return _error(400, "the local server was told to refuse this batch")
        batch = self.book.accept(calls, {})
        return json_response(200, self._batch_object(batch))

    def _retrieve(self, request: Request) -> Response:
        batch = self.book.get(request.match["id"])
        if batch is None:
            return _not_found(request)
        return json_response(200, self._batch_object(batch))

    def _list(self, request: Request) -> Response:
        batches = self.book.newest_first()
        ids = [b.id for b in batches]
        after, before = request.query.get("after_id"), request.query.get("before_id")
        if after is not None:
            batches = batches[ids.index(after) + 1 :] if after in ids else []
        elif before is not None:
            batches = batches[: ids.index(before)] if before in ids else []
        limit = max(1, min(int(request.query.get("limit") or 20), 1000))
        page = batches[-limit:] if before is not None else batches[:limit]
        data = [self._batch_object(b) for b in page]
        return json_response(
            200,
            {
                "data": data,
                "has_more": len(batches) > limit,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
            },
        )

    def _cancel(self, request: Request) -> Response:
        batch = self.book.cancel(request.match["id"])
        if batch is None:
            return _not_found(request)
        return json_response(200, self._batch_object(batch))

    def _results(self, request: Request) -> Response:
        batch = self.book.get(request.match["id"])
        if batch is None:
            return _not_found(request)
        if not batch.ended:
            return _error(400, f"message batch {batch.id} has not ended; results are not ready")
        with self._render_lock:
            if "results" not in batch.meta:
                lines = [self._result_line(batch, i) for i in range(len(batch.calls))]
                batch.meta["results"] = "".join(
                    json.dumps(x, separators=(",", ":")) + "\n" for x in lines
                ).encode()
        return Response(200, batch.meta["results"], content_type="application/binary")

    # -- rendering -----------------------------------------------------------------------

    def _result_line(self, batch: Batch, index: int) -> dict[str, Any]:
        call = batch.calls[index]
        result: dict[str, Any]
        if call.result is CallResult.SUCCEEDED and call.answer is not None:
            prompt = Prompt("anthropic", call.body, call.custom_id)
            message = anthropic_message(call.answer, prompt, batch=True)
            result = {"type": "succeeded", "message": message}
        elif call.result is CallResult.ERRORED and call.error is not None:
            error = {**anthropic_error(call.error), "request_id": f"req_{uuid.uuid4().hex[:24]}"}
            result = {"type": "errored", "error": error}
        elif call.result is CallResult.EXPIRED:
            result = {"type": "expired"}
        else:
            result = {"type": "canceled"}
        return {"custom_id": call.custom_id, "result": result}

    def _batch_object(self, batch: Batch) -> dict[str, Any]:
        if batch.ended:
            status = "ended"
        elif batch.cancel_requested_at is not None:
            status = "canceling"
        else:
            status = "in_progress"
        counts = {
            "processing": 0 if batch.ended else len(batch.calls),
            "succeeded": batch.count(CallResult.SUCCEEDED),
            "errored": batch.count(CallResult.ERRORED),
            "canceled": batch.count(CallResult.CANCELLED),
            "expired": batch.count(CallResult.EXPIRED),
        }
        return {
            "id": batch.id,
            "type": "message_batch",
            "processing_status": status,
            "request_counts": counts,
            "ended_at": _rfc3339(batch.ended_at),
            "created_at": _rfc3339(batch.created_at),
            "expires_at": _rfc3339(batch.created_at + 86_400),
            "archived_at": None,
            "cancel_initiated_at": _rfc3339(batch.cancel_requested_at),
            "results_url": (
                f"{self.base_url}{_BATCHES}/{batch.id}/results" if batch.ended else None
            ),
        }
