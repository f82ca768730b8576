"""What the local batch servers of both providers share: the responder that answers every
call, live or batched, the batch book, the call log, and the live endpoint's handling.

Each provider's server (``anthropic_batch``, ``openai_batch``) adds its routes and its
wire shapes: ``wire_error``, ``wire_reply`` and ``wire_stream``.
"""

from __future__ import annotations

import os
import threading
import time
from abc import abstractmethod
from typing import Any

from pyrula_stream.testing_servers._http import (
    CallLog,
    Request,
    Response,
    RoutedServer,
    json_response,
    sse_response,
)
from pyrula_stream.testing_servers.answers import (
    Answer,
    CallError,
    Prompt,
    Responder,
    ScriptedResponder,
)
from pyrula_stream.testing_servers.batches import BatchBook, call_digest


class BatchProviderServer(RoutedServer):
    """A provider's batch API and live endpoint on a loopback port (see the subclasses).

    ``responder`` answers every call (a ``ScriptedResponder`` when not given). ``book``
    holds the batches and the knobs (``delay_s``, ``fail_ids``, ``expire``); ``log`` (a
    path) appends one JSON line per call submitted, batched or live.
    """

    provider = ""
    batch_id_prefix = ""

    def __init__(
        self,
        responder: Responder | None = None,
        *,
        delay_s: float = 0.2,
        log: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(host, port)
        self.responder: Responder = responder if responder is not None else ScriptedResponder()
        self._log = CallLog(log) if log is not None else None
        self.book = BatchBook(
            self.provider,
            self.responder,
            delay_s=delay_s,
            id_prefix=self.batch_id_prefix,
            log=self._log,
        )
        self.live_calls = 0
        self._lock = threading.Lock()
        self._render_lock = threading.Lock()  # one rendering of a batch's results
        self.add_routes()

    @abstractmethod
    def add_routes(self) -> None:
        """The provider's routes (and the state they keep beside the book)."""

    def stop(self) -> None:
        super().stop()
        if self._log is not None:
            self._log.close()

    # -- the provider's wire shapes --------------------------------------------------------

    @abstractmethod
    def wire_error(self, error: CallError) -> dict[str, Any]:
        """A call's error in the provider's JSON."""

    @abstractmethod
    def wire_reply(self, answer: Answer, prompt: Prompt) -> dict[str, Any]:
        """An answer as the provider's JSON response."""

    @abstractmethod
    def wire_stream(self, answer: Answer, prompt: Prompt) -> list[bytes]:
        """An answer as the provider's SSE frames."""

    def error(self, status: int, message: str, kind: str = "invalid_request_error") -> Response:
        return json_response(status, self.wire_error(CallError(status, kind, message)))

    # -- live --------------------------------------------------------------------------------

    def live(self, request: Request) -> Response:
        """One live call, streamed or not, answered by the same responder as batches."""
        body = request.json()
        if not isinstance(body, dict):
            return self.error(400, "body is not a JSON object")
        with self._lock:
            self.live_calls += 1
        if self._log is not None:
            record = {"via": "live", "provider": self.provider, "digest": call_digest(body)}
            self._log.append({**record, "ts": time.time(), "pid": os.getpid()})
        prompt = Prompt(self.provider, body)
        reply = self.responder(prompt)
        if isinstance(reply, CallError):
            return json_response(reply.status, self.wire_error(reply))
        if body.get("stream"):
            return sse_response(self.wire_stream(reply, prompt))
        return json_response(200, self.wire_reply(reply, prompt))
