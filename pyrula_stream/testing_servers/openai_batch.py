"""A local server speaking OpenAI's Batch API and Chat Completions, one responder for both.

Batch API (paths with or without the ``/v1`` prefix, as ``base_url`` is set):

- ``POST /files`` (multipart: ``purpose=batch`` and a JSONL ``file`` of
  ``{custom_id, method: "POST", url: "/v1/chat/completions", body}`` lines), ``GET
  /files/{id}``, ``GET /files/{id}/content``;
- ``POST /batches`` (``input_file_id``, ``endpoint``, ``completion_window: "24h"``,
  ``metadata``), ``GET /batches/{id}``, ``GET /batches`` (newest first, ``after`` and
  ``limit``), ``POST /batches/{id}/cancel``.

A batch is ``validating`` in the reply that creates it, ``in_progress`` until its due
time, then ``completed`` (``output_file_id`` holds the answered calls, ``error_file_id``
the errored ones), ``expired`` (the calls that did not run are in the error file with
code ``batch_expired``), or after a cancel ``cancelling`` then ``cancelled``. A bad input
file makes it ``failed`` with ``errors``. ``POST /chat/completions`` answers live calls
(streamed or not) from the same responder.
"""

from __future__ import annotations

import json
import time
import uuid
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

from pyrula_stream.testing_servers._http import (
    Request,
    Response,
    json_response,
)
from pyrula_stream.testing_servers.answers import Answer, CallError, Prompt
from pyrula_stream.testing_servers.batch_provider import BatchProviderServer
from pyrula_stream.testing_servers.batches import Batch, CallResult, Ending
from pyrula_stream.testing_servers.wire import openai_completion, openai_error, openai_stream

MODEL = "gpt-5.4-mini"
ENDPOINT = "/v1/chat/completions"
MAX_CALLS = 50_000
MAX_METADATA = 16
_V1 = r"(?:/v1)?"


def _error(status: int, message: str, error_type: str = "invalid_request_error") -> Response:
    return json_response(status, openai_error(CallError(status, error_type, message)))


class OpenAIBatchServer(BatchProviderServer):
    """OpenAI's files, batches and chat completions on a loopback port.

    ``responder`` answers every call, live or batched (a ``ScriptedResponder`` when not
    given: queue answers with ``responder.enqueue``). ``book`` holds the batches and the
    knobs (``delay_s``, ``fail_ids``, ``expire``); ``log`` (a path) appends one JSON line
    per call submitted, batched or live.
    """

    provider = "openai"
    batch_id_prefix = "batch_"

    def add_routes(self) -> None:
        self._files: dict[str, tuple[dict[str, Any], bytes]] = {}
        self.route("POST", _V1 + r"/chat/completions", self.live)
        self.route("POST", _V1 + r"/files", self._upload)
        self.route("GET", _V1 + r"/files/(?P<id>[\w-]+)", self._file)
        self.route("GET", _V1 + r"/files/(?P<id>[\w-]+)/content", self._content)
        self.route("POST", _V1 + r"/batches", self._create)
        self.route("GET", _V1 + r"/batches", self._list)
        self.route("GET", _V1 + r"/batches/(?P<id>[\w-]+)", self._retrieve)
        self.route("POST", _V1 + r"/batches/(?P<id>[\w-]+)/cancel", self._cancel)

    # -- wire shapes -------------------------------------------------------------------

    def wire_error(self, error: CallError) -> dict[str, Any]:
        return openai_error(error)

    def wire_reply(self, answer: Answer, prompt: Prompt) -> dict[str, Any]:
        return openai_completion(answer, prompt)

    def wire_stream(self, answer: Answer, prompt: Prompt) -> list[bytes]:
        return openai_stream(answer, prompt)

    # -- files ---------------------------------------------------------------------------

    def _store_file(self, filename: str, purpose: str, data: bytes) -> dict[str, Any]:
        file_id = f"file-{uuid.uuid4().hex[:24]}"
        obj = {
            "id": file_id,
            "object": "file",
            "bytes": len(data),
            "created_at": int(time.time()),
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
        }
        with self._lock:
            self._files[file_id] = (obj, data)
        return obj

    def _upload(self, request: Request) -> Response:
        content_type = request.content_type
        if not content_type.startswith("multipart/form-data"):
            return _error(400, "files are uploaded as multipart/form-data")
        head = f"Content-Type: {content_type}\r\n\r\n".encode()
        message = BytesParser(policy=HTTP).parsebytes(head + request.raw)
        fields: dict[str, tuple[str | None, bytes]] = {}
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            payload = part.get_payload(decode=True)
            if isinstance(name, str) and isinstance(payload, bytes):
                fields[name] = (part.get_filename(), payload)
        if "file" not in fields or "purpose" not in fields:
            return _error(400, "an upload needs 'file' and 'purpose'")
        purpose = fields["purpose"][1].decode()
        if purpose != "batch":
            return _error(400, f"this server takes purpose=batch, not {purpose!r}")
        filename, data = fields["file"]
        return json_response(200, self._store_file(filename or "upload.jsonl", purpose, data))

    def _file(self, request: Request) -> Response:
        with self._lock:
            found = self._files.get(request.match["id"])
        if found is None:
            return _error(404, f"No such File object: {request.match['id']}")
        return json_response(200, found[0])

    def _content(self, request: Request) -> Response:
        with self._lock:
            found = self._files.get(request.match["id"])
        if found is None:
            return _error(404, f"No such File object: {request.match['id']}")
        return Response(200, found[1], content_type="application/octet-stream")

    # -- batches -------------------------------------------------------------------------

    def _create(self, request: Request) -> Response:
        body = request.json()
        if not isinstance(body, dict):
            return _error(400, "body is not a JSON object")
        endpoint = body.get("endpoint")
        if endpoint != ENDPOINT:
            return _error(400, f"this server batches {ENDPOINT} only, not {endpoint!r}")
        if body.get("completion_window") != "24h":
            return _error(400, "completion_window must be '24h'")
        metadata = body.get("metadata") or {}
        if not isinstance(metadata, dict) or len(metadata) > MAX_METADATA:
            return _error(400, f"metadata holds at most {MAX_METADATA} pairs")
        for key, value in metadata.items():
            if len(str(key)) > 64 or not isinstance(value, str) or len(value) > 512:
                return _error(400, f"metadata {key!r}: keys of <= 64, string values of <= 512")
        file_id = str(body.get("input_file_id") or "")
        with self._lock:
            found = self._files.get(file_id)
        if found is None:
            return _error(400, f"No such File object: {file_id!r}")
        meta = {
            "input_file_id": file_id,
            "endpoint": endpoint,
            "completion_window": "24h",
            "metadata": metadata or None,
        }
        calls, problem = _parse_input(found[1])
        if problem is None and self.book.take_refusal():
            problem = (0, "the local server was told to refuse this batch")
        if problem is not None:
            line, message = problem
            meta["errors"] = [{"code": "invalid_request", "message": message, "line": line}]
            batch = self.book.refuse(meta, message)
        else:
            meta["model"] = calls[0][1].get("model")
            batch = self.book.accept(calls, meta)
        return json_response(200, self._batch_object(batch, fresh=True))

    def _retrieve(self, request: Request) -> Response:
        batch = self.book.get(request.match["id"])
        if batch is None:
            return _error(404, f"No batch found with id '{request.match['id']}'.")
        return json_response(200, self._batch_object(batch))

    def _list(self, request: Request) -> Response:
        batches = self.book.newest_first()
        after = request.query.get("after")
        if after is not None:
            ids = [b.id for b in batches]
            batches = batches[ids.index(after) + 1 :] if after in ids else []
        limit = max(1, min(int(request.query.get("limit") or 20), 100))
        page = batches[:limit]
        data = [self._batch_object(b) for b in page]
        return json_response(
            200,
            {
                "object": "list",
                "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
                "has_more": len(batches) > limit,
            },
        )

    def _cancel(self, request: Request) -> Response:
        batch = self.book.get(request.match["id"])
        if batch is None:
            return _error(404, f"No batch found with id '{request.match['id']}'.")
        if batch.ended and batch.ending is not Ending.CANCELLED:
            return _error(409, f"Cannot cancel a batch with status {self._status(batch)}.")
        batch = self.book.cancel(batch.id) or batch
        return json_response(200, self._batch_object(batch))

    # -- rendering -----------------------------------------------------------------------

    def _status(self, batch: Batch, *, fresh: bool = False) -> str:
        if batch.ending is not None:
            return str(batch.ending)
        if batch.cancel_requested_at is not None:
            return "cancelling"
        return "validating" if fresh else "in_progress"

    def _batch_object(self, batch: Batch, *, fresh: bool = False) -> dict[str, Any]:
        meta = batch.meta
        with self._render_lock:
            if batch.ended and "output_file_id" not in meta:
                meta["output_file_id"], meta["error_file_id"] = self._result_files(batch)
        status = self._status(batch, fresh=fresh)
        ended = int(batch.ended_at) if batch.ended_at is not None else None
        errors = meta.get("errors")
        return {
            "id": batch.id,
            "object": "batch",
            "endpoint": meta.get("endpoint", ENDPOINT),
            "errors": {"object": "list", "data": errors} if errors else None,
            "input_file_id": meta.get("input_file_id", ""),
            "completion_window": "24h",
            "status": status,
            "output_file_id": meta.get("output_file_id"),
            "error_file_id": meta.get("error_file_id"),
            "created_at": int(batch.created_at),
            "in_progress_at": None if fresh else int(batch.created_at),
            "expires_at": int(batch.created_at) + 86_400,
            "finalizing_at": ended if batch.ending is Ending.COMPLETED else None,
            "completed_at": ended if batch.ending is Ending.COMPLETED else None,
            "failed_at": ended if batch.ending is Ending.FAILED else None,
            "expired_at": ended if batch.ending is Ending.EXPIRED else None,
            "cancelling_at": (
                int(batch.cancel_requested_at) if batch.cancel_requested_at is not None else None
            ),
            "cancelled_at": ended if batch.ending is Ending.CANCELLED else None,
            "request_counts": {
                "total": len(batch.calls),
                "completed": batch.count(CallResult.SUCCEEDED),
                "failed": batch.count(CallResult.ERRORED),
            },
            "metadata": meta.get("metadata"),
            "model": meta.get("model"),
        }

    def _result_files(self, batch: Batch) -> tuple[str | None, str | None]:
        """The output and error files of an ended batch (``None`` when empty)."""
        output: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        for call in batch.calls:
            line: dict[str, Any] = {
                "id": f"batch_req_{uuid.uuid4().hex[:24]}",
                "custom_id": call.custom_id,
                "response": None,
                "error": None,
            }
            request_id = f"req_{uuid.uuid4().hex[:24]}"
            if call.result is CallResult.SUCCEEDED and call.answer is not None:
                prompt = Prompt("openai", call.body, call.custom_id)
                body = openai_completion(call.answer, prompt)
                line["response"] = {"status_code": 200, "request_id": request_id, "body": body}
                output.append(line)
            elif call.result is CallResult.ERRORED and call.error is not None:
                line["response"] = {
                    "status_code": call.error.status,
                    "request_id": request_id,
                    "body": openai_error(call.error),
                }
                errors.append(line)
            elif call.result is CallResult.EXPIRED:
                line["error"] = {
                    "code": "batch_expired",
                    "message": "This request could not be executed before the "
                    "completion window expired.",
                }
                errors.append(line)
        ids: list[str | None] = []
        for kind, lines in (("output", output), ("error", errors)):
            if not lines:
                ids.append(None)
                continue
            data = "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines).encode()
            ids.append(self._store_file(f"batch_{kind}.jsonl", "batch_output", data)["id"])
        return ids[0], ids[1]


def _parse_input(
    data: bytes,
) -> tuple[list[tuple[str, dict[str, Any]]], tuple[int, str] | None]:
    """The calls of a batch input file, or (line, reason) of the first bad line."""
    calls: list[tuple[str, dict[str, Any]]] = []
    seen: set[str] = set()
    models: set[str] = set()
    for number, text in enumerate(data.decode("utf-8", "replace").splitlines(), start=1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
        except ValueError:
            return [], (number, "line is not JSON")
        if not isinstance(line, dict):
            return [], (number, "line is not a JSON object")
        cid, body = line.get("custom_id"), line.get("body")
        if not isinstance(cid, str) or not cid:
            return [], (number, "custom_id is missing")
        if cid in seen:
            return [], (number, f"custom_id {cid!r} is not unique")
        if line.get("method") != "POST" or line.get("url") != ENDPOINT:
            return [], (number, f"method must be POST and url {ENDPOINT}")
        if not isinstance(body, dict) or not body.get("model"):
            return [], (number, "body must be an object naming a model")
        if body.get("stream"):
            return [], (number, "a batched request cannot stream")
        seen.add(cid)
        models.add(str(body["model"]))
        calls.append((cid, body))
    if not calls:
        return [], (0, "the input file holds no requests")
    if len(calls) > MAX_CALLS:
        return [], (0, f"a batch holds at most {MAX_CALLS} requests")
    if len(models) > 1:
        return [], (0, f"a batch uses one model, not {sorted(models)}")
    return calls, None
