"""One ``Answer`` in each provider's wire format: a whole JSON object (a batch's result,
a live call without ``stream``) or the SSE frames of a live stream.

The shapes follow the published APIs: Chat Completions' ``chat.completion`` and
``chat.completion.chunk`` (a usage chunk with empty ``choices`` when
``stream_options.include_usage`` is set, then ``data: [DONE]``); the Messages API's
``message`` and its event sequence (``message_start`` ... ``message_stop``).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from pyrula_stream.testing_servers.answers import Answer, CallError, Prompt

_OPENAI_FINISH = {"end_turn": "stop", "tool_use": "tool_calls", "max_tokens": "length"}


def _tokens(answer: Answer, prompt: Prompt) -> tuple[int, int, int]:
    """(whole prompt, cached part of it, output) tokens of the answer."""
    total = answer.input_tokens if answer.input_tokens is not None else prompt.input_estimate()
    output = answer.output_tokens if answer.output_tokens is not None else answer.output_estimate()
    return total, min(answer.cached_tokens, total), output


def sse_frame(data: Any, event: str | None = None) -> bytes:
    """One SSE event: an optional ``event:`` line and a JSON (or literal string) ``data:``."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


# -- OpenAI -----------------------------------------------------------------------------


def openai_usage(answer: Answer, prompt: Prompt) -> dict[str, Any]:
    total, cached, output = _tokens(answer, prompt)
    return {
        "prompt_tokens": total,
        "completion_tokens": output,
        "total_tokens": total + output,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def openai_completion(answer: Answer, prompt: Prompt) -> dict[str, Any]:
    """A ``chat.completion`` object."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.text or None}
    if answer.tool_calls:
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for c in answer.tool_calls
        ]
    elif message["content"] is None:
        message["content"] = ""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": prompt.model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": _OPENAI_FINISH.get(answer.stop_reason, answer.stop_reason),
                "logprobs": None,
            }
        ],
        "usage": openai_usage(answer, prompt),
    }


def openai_stream(answer: Answer, prompt: Prompt) -> list[bytes]:
    """The ``chat.completion.chunk`` frames of a streamed completion, ``[DONE]`` last."""
    cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    created = int(time.time())

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        body = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": prompt.model,
            "choices": choices,
            **extra,
        }
        return sse_frame(body)

    def delta(d: dict[str, Any], finish: str | None = None) -> bytes:
        return chunk([{"index": 0, "delta": d, "finish_reason": finish}])

    frames = [delta({"role": "assistant", "content": ""})]
    frames += [delta({"content": answer.text[i : i + 8]}) for i in range(0, len(answer.text), 8)]
    for index, call in enumerate(answer.tool_calls):
        head = {"index": index, "id": call.id, "type": "function"}
        frames.append(delta({"tool_calls": [{**head, "function": {"name": call.name}}]}))
        args = json.dumps(call.arguments)
        frames += [
            delta({"tool_calls": [{"index": index, "function": {"arguments": args[i : i + 16]}}]})
            for i in range(0, len(args), 16)
        ]
    frames.append(delta({}, _OPENAI_FINISH.get(answer.stop_reason, answer.stop_reason)))
    if (prompt.body.get("stream_options") or {}).get("include_usage"):
        frames.append(chunk([], usage=openai_usage(answer, prompt)))
    frames.append(sse_frame("[DONE]"))
    return frames


def openai_error(error: CallError) -> dict[str, Any]:
    return {"error": {"message": error.message, "type": error.type, "param": None, "code": None}}


# -- Anthropic --------------------------------------------------------------------------


def anthropic_usage(answer: Answer, prompt: Prompt, *, batch: bool = False) -> dict[str, Any]:
    total, cached, output = _tokens(answer, prompt)
    usage: dict[str, Any] = {
        "input_tokens": total - cached,
        "output_tokens": output,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }
    if batch:
        usage["service_tier"] = "batch"
    return usage


def anthropic_message(answer: Answer, prompt: Prompt, *, batch: bool = False) -> dict[str, Any]:
    """A ``message`` object (with ``service_tier: batch`` in its usage inside a batch)."""
    content: list[dict[str, Any]] = [{"type": "text", "text": answer.text}] if answer.text else []
    content += [
        {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}
        for c in answer.tool_calls
    ]
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": prompt.model,
        "content": content,
        "stop_reason": answer.stop_reason,
        "stop_sequence": None,
        "usage": anthropic_usage(answer, prompt, batch=batch),
    }


def anthropic_stream(answer: Answer, prompt: Prompt) -> list[bytes]:
    """The event sequence of a streamed message, ``message_stop`` last."""
    message = anthropic_message(answer, prompt)
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    frames = [
        sse_frame({"type": "message_start", "message": start}, "message_start"),
        sse_frame({"type": "ping"}, "ping"),
    ]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            first: dict[str, Any] = {"type": "text", "text": ""}
            text = block["text"]
            deltas = [
                {"type": "text_delta", "text": text[i : i + 8]} for i in range(0, len(text), 8)
            ]
        else:
            first = {**block, "input": {}}
            raw = json.dumps(block["input"])
            deltas = [
                {"type": "input_json_delta", "partial_json": raw[i : i + 16]}
                for i in range(0, len(raw), 16)
            ]
        frames.append(
            sse_frame(
                {"type": "content_block_start", "index": index, "content_block": first},
                "content_block_start",
            )
        )
        frames += [
            sse_frame(
                {"type": "content_block_delta", "index": index, "delta": d}, "content_block_delta"
            )
            for d in deltas
        ]
        frames.append(
            sse_frame({"type": "content_block_stop", "index": index}, "content_block_stop")
        )
    frames.append(
        sse_frame(
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": usage["output_tokens"]},
            },
            "message_delta",
        )
    )
    frames.append(sse_frame({"type": "message_stop"}, "message_stop"))
    return frames


def anthropic_error(error: CallError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error.type, "message": error.message}}
