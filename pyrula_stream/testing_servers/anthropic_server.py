"""A local server speaking the Anthropic Messages API wire format (``POST /v1/messages``).

Streams follow the published event sequence: ``message_start``, ``ping``, then per
content block ``content_block_start`` / ``content_block_delta`` (``text_delta`` or
``input_json_delta``) / ``content_block_stop``, then ``message_delta`` (stop reason and
cumulative usage) and ``message_stop``. Errors use ``{"type": "error", "error": {...}}``.

Built with ``prompt_cache=True``, the server keeps Anthropic's prompt cache
(``AnthropicPromptCache``) and each streamed reply reports the input, cache write and
cache read tokens of the request it answers; ``cache.advance(seconds)`` lets TTLs run out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pyrula_stream.testing_servers.prompt_cache import (
    AnthropicPromptCache,
    CacheRefused,
    CacheUsage,
)
from pyrula_stream.testing_servers.scripted_http import (
    RecordedRequest,
    Reply,
    WireServer,
    json_reply,
    sse_frame,
    sse_reply,
)

MODEL = "claude-sonnet-4-6"


@dataclass(frozen=True)
class Text:
    """A text block, streamed in ``chunk`` character pieces."""

    text: str
    chunk: int = 5


@dataclass(frozen=True)
class ToolUse:
    """A tool_use block whose input JSON is streamed in ``chunk`` character fragments."""

    id: str
    name: str
    input: dict[str, Any]
    chunk: int = 7


Block = Text | ToolUse


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def message_frames(
    blocks: list[Block],
    *,
    stop_reason: str = "end_turn",
    model: str = MODEL,
    input_tokens: int = 11,
    output_tokens: int = 7,
    cache_creation_input_tokens: int = 0,
    cache_read_input_tokens: int = 0,
    cache_creation_1h_input_tokens: int = 0,
    message_id: str = "msg_wire_1",
) -> list[bytes]:
    """The full SSE event sequence of one message, in wire order."""
    start_usage: dict[str, Any] = {
        "input_tokens": input_tokens,
        "output_tokens": 1,
        "cache_creation_input_tokens": cache_creation_input_tokens,
        "cache_read_input_tokens": cache_read_input_tokens,
    }
    if cache_creation_input_tokens:
        start_usage["cache_creation"] = {
            "ephemeral_5m_input_tokens": cache_creation_input_tokens
            - cache_creation_1h_input_tokens,
            "ephemeral_1h_input_tokens": cache_creation_1h_input_tokens,
        }
    frames = [
        sse_frame(
            {
                "type": "message_start",
                "message": {
                    "id": message_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": start_usage,
                },
            },
            "message_start",
        ),
        sse_frame({"type": "ping"}, "ping"),
    ]
    for index, block in enumerate(blocks):
        frames += _block_frames(index, block)
    frames.append(
        sse_frame(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": output_tokens},
            },
            "message_delta",
        )
    )
    frames.append(sse_frame({"type": "message_stop"}, "message_stop"))
    return frames


def _block_frames(index: int, block: Block) -> list[bytes]:
    if isinstance(block, Text):
        start: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": p} for p in _pieces(block.text, block.chunk)]
    else:
        start = {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
        encoded = json.dumps(block.input)
        deltas = [
            {"type": "input_json_delta", "partial_json": p} for p in _pieces(encoded, block.chunk)
        ]
    frames = [
        sse_frame(
            {"type": "content_block_start", "index": index, "content_block": start},
            "content_block_start",
        )
    ]
    frames += [
        sse_frame(
            {"type": "content_block_delta", "index": index, "delta": d}, "content_block_delta"
        )
        for d in deltas
    ]
    frames.append(sse_frame({"type": "content_block_stop", "index": index}, "content_block_stop"))
    return frames


def error_body(error_type: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}}


class AnthropicWireServer(WireServer):
    """Scripted Anthropic endpoint; the ``reply_*`` helpers queue common behaviours."""

    def __init__(self, *, prompt_cache: bool = False) -> None:
        super().__init__()
        self.cache = AnthropicPromptCache() if prompt_cache else None
        self.bills: list[CacheUsage] = []
        """The input usage of each request billed with the prompt cache on, in order."""

    def reply_stream(self, blocks: list[Block], **kwargs: Any) -> None:
        """A complete streamed message (see ``message_frames`` for the keywords); with the
        prompt cache on, its input usage is the request's."""
        cache = self.cache
        if cache is None:
            self.enqueue(sse_reply(message_frames(blocks, **kwargs), headers=_request_id()))
            return

        def billed(request: RecordedRequest) -> Reply:
            try:
                usage = cache.usage(request.body)
                self.bills.append(usage)
            except CacheRefused as exc:
                body = error_body("invalid_request_error", str(exc))
                return json_reply(400, body, _request_id())
            frames = message_frames(
                blocks,
                **{
                    **kwargs,
                    "input_tokens": usage.input_tokens,
                    "cache_creation_input_tokens": usage.cache_creation_input_tokens,
                    "cache_read_input_tokens": usage.cache_read_input_tokens,
                    "cache_creation_1h_input_tokens": usage.cache_creation_1h_input_tokens,
                },
            )
            return sse_reply(frames, headers=_request_id())

        self.enqueue(billed)

    def reply_text(self, text: str, **kwargs: Any) -> None:
        self.reply_stream([Text(text)], **kwargs)

    def reply_truncated(self, blocks: list[Block], *, keep: int | None = None) -> None:
        """A stream that ends cleanly before ``message_delta``/``message_stop``.

        ``keep`` cuts it after that many frames instead (counting from ``message_start``).
        """
        frames = message_frames(blocks)[:-2]
        self.enqueue(sse_reply(frames if keep is None else frames[:keep]))

    def reply_aborted(self, blocks: list[Block], *, keep: int = 3) -> None:
        """A stream whose connection breaks mid-body after ``keep`` frames."""
        self.enqueue(sse_reply(message_frames(blocks)[:keep], abort=True))

    def reply_stream_error(self, blocks: list[Block], error_type: str = "overloaded_error") -> None:
        """A stream that starts and then reports an ``error`` event, as the API does."""
        frames = message_frames(blocks)[:-2]
        frames.append(sse_frame(error_body(error_type, "Overloaded"), "error"))
        self.enqueue(sse_reply(frames))

    def reply_error(
        self,
        status: int,
        error_type: str,
        message: str = "error",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.enqueue(
            json_reply(
                status, error_body(error_type, message), {**_request_id(), **(headers or {})}
            )
        )

    def reply_rate_limited(self, retry_after: str | None = "0", **headers: str) -> None:
        """A 429; ``retry_after`` is the ``retry-after`` header (``None`` leaves it out)."""
        extra = {"retry-after": retry_after} if retry_after is not None else {}
        self.reply_error(
            429,
            "rate_limit_error",
            "Number of requests has exceeded your rate limit",
            {**extra, **{k.replace("_", "-"): v for k, v in headers.items()}},
        )

    def reply_server_error(self, status: int = 500) -> None:
        self.reply_error(status, "api_error", "Internal server error")

    def reply_raw(self, reply: Reply) -> None:
        self.enqueue(reply)


def _request_id() -> dict[str, str]:
    return {"request-id": "req_wire_anthropic"}
