"""A local server speaking the OpenAI Chat Completions wire format (``POST /chat/completions``).

A stream is a sequence of ``chat.completion.chunk`` objects as bare ``data:`` lines: a
first chunk with the role, content deltas, tool call deltas (``index``, then ``id`` and
``function.name`` once, then ``function.arguments`` fragments), a chunk carrying
``finish_reason``, a usage chunk with empty ``choices`` when
``stream_options.include_usage`` is set, and the literal ``data: [DONE]``.
Errors use ``{"error": {"message", "type", "param", "code"}}``.

Built with ``prompt_cache=True``, the server keeps OpenAI's automatic prompt cache
(``OpenAIPromptCache``, by model and ``prompt_cache_key``) and each streamed reply reports
the prompt and cached tokens of the request it answers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pyrula_stream.testing_servers.prompt_cache import OpenAIPromptCache
from pyrula_stream.testing_servers.scripted_http import (
    RecordedRequest,
    Reply,
    WireServer,
    json_reply,
    sse_frame,
    sse_reply,
)

MODEL = "gpt-5.4-mini"


@dataclass(frozen=True)
class Call:
    """One tool call whose ``arguments`` JSON is streamed in ``chunk`` character fragments."""

    id: str
    name: str
    arguments: dict[str, Any]
    chunk: int = 6


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _chunk(delta: dict[str, Any], finish_reason: str | None = None, *, model: str) -> bytes:
    return sse_frame(
        {
            "id": "chatcmpl-wire",
            "object": "chat.completion.chunk",
            "created": 1_790_000_000,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }
    )


def completion_frames(
    text: str = "",
    calls: list[Call] | None = None,
    *,
    finish_reason: str | None = None,
    model: str = MODEL,
    prompt_tokens: int = 13,
    completion_tokens: int = 5,
    cached_tokens: int | None = None,
    include_usage: bool = True,
    text_chunk: int = 4,
) -> list[bytes]:
    """A full chunk sequence; ``finish_reason`` defaults to tool_calls/stop from the content."""
    frames = [_chunk({"role": "assistant", "content": ""}, model=model)]
    frames += [_chunk({"content": p}, model=model) for p in _pieces(text, text_chunk)]
    for index, call in enumerate(calls or []):
        head = {
            "index": index,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        frames.append(_chunk({"tool_calls": [head]}, model=model))
        for piece in _pieces(json.dumps(call.arguments), call.chunk):
            frag = {"index": index, "function": {"arguments": piece}}
            frames.append(_chunk({"tool_calls": [frag]}, model=model))
    reason = finish_reason or ("tool_calls" if calls else "stop")
    frames.append(_chunk({}, reason, model=model))
    if include_usage:
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        if cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
        frames.append(
            sse_frame(
                {
                    "id": "chatcmpl-wire",
                    "object": "chat.completion.chunk",
                    "created": 1_790_000_000,
                    "model": model,
                    "choices": [],
                    "usage": usage,
                }
            )
        )
    frames.append(sse_frame("[DONE]"))
    return frames


def error_body(message: str, error_type: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


class OpenAIWireServer(WireServer):
    """Scripted Chat Completions endpoint; the ``reply_*`` helpers queue common behaviours."""

    def __init__(self, *, prompt_cache: bool = False) -> None:
        super().__init__()
        self.cache = OpenAIPromptCache() if prompt_cache else None

    def reply_stream(self, text: str = "", calls: list[Call] | None = None, **kwargs: Any) -> None:
        """A complete stream (see ``completion_frames`` for the keywords); with the prompt
        cache on, its prompt usage is the request's."""
        cache = self.cache
        if cache is None:
            self.enqueue(sse_reply(completion_frames(text, calls, **kwargs), headers=_request_id()))
            return

        def billed(request: RecordedRequest) -> Reply:
            prompt, cached = cache.usage(request.body)
            frames = completion_frames(
                text, calls, **{**kwargs, "prompt_tokens": prompt, "cached_tokens": cached}
            )
            return sse_reply(frames, headers=_request_id())

        self.enqueue(billed)

    def reply_text(self, text: str, **kwargs: Any) -> None:
        self.reply_stream(text, **kwargs)

    def reply_truncated(self, text: str = "", calls: list[Call] | None = None) -> None:
        """A stream that ends cleanly before the chunk with ``finish_reason`` (no [DONE])."""
        frames = completion_frames(text, calls)
        self.enqueue(sse_reply(frames[:-3]))

    def reply_aborted(self, text: str = "", *, keep: int = 2) -> None:
        """A stream whose connection breaks mid-body after ``keep`` frames."""
        self.enqueue(sse_reply(completion_frames(text)[:keep], abort=True))

    def reply_error(
        self,
        status: int,
        message: str = "error",
        error_type: str = "invalid_request_error",
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.enqueue(
            json_reply(
                status, error_body(message, error_type, code), {**_request_id(), **(headers or {})}
            )
        )

    def reply_rate_limited(self, retry_after: str | None = "0", **headers: str) -> None:
        """A 429; ``retry_after`` is the ``retry-after`` header (``None`` leaves it out)."""
        extra = {"retry-after": retry_after} if retry_after is not None else {}
        extra.update({k.replace("_", "-"): v for k, v in headers.items()})
        self.reply_error(
            429, "Rate limit reached for requests", "requests", "rate_limit_exceeded", extra
        )

    def reply_server_error(self, status: int = 500) -> None:
        self.reply_error(
            status, "The server had an error while processing your request.", "server_error"
        )

    def reply_raw(self, reply: Reply) -> None:
        self.enqueue(reply)


def _request_id() -> dict[str, str]:
    return {"x-request-id": "req_wire_openai"}
