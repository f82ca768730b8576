"""AnthropicLLM through the real ``anthropic`` SDK against a local Messages API server:
retries and broken streams.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from pyrula_stream.errors import (
    ContextWindowExceeded,
    ErrorCode,
    LLMError,
    LLMProviderUnavailable,
    LLMRateLimited,
    ProviderStreamTruncated,
)
from pyrula_stream.llm import AnthropicLLM, TextDelta, ToolDefinition
from pyrula_stream.testing_servers.anthropic_server import MODEL, AnthropicWireServer, Text, ToolUse
from tests.llm.servers.fixtures import SECRET_KEY, collect

LOOKUP = ToolDefinition(
    name="lookup",
    description="Find an order by id.",
    input_schema={"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
)
REFUND = ToolDefinition(
    name="refund",
    description="Refund an order.",
    input_schema={"type": "object", "properties": {"id": {"type": "string"}}},
)
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture
def llm(anthropic_llm: AnthropicLLM) -> AnthropicLLM:
    return anthropic_llm


# -- retries ---------------------------------------------------------------------------------


async def test_429_waits_for_retry_after_then_succeeds(
    anthropic_server: AnthropicWireServer,
) -> None:
    # A huge backoff base proves the wait came from the header, not from backoff.
    llm = AnthropicLLM(
        MODEL, api_key=SECRET_KEY, base_url=anthropic_server.base_url, backoff_base_s=30.0
    )
    anthropic_server.reply_rate_limited(retry_after="0.2")
    anthropic_server.reply_rate_limited(retry_after=None, retry_after_ms="100")
    anthropic_server.reply_text("finally")
    started = time.monotonic()
    try:
        async with asyncio.timeout(5):
            deltas, response = await collect(llm, HELLO)
    finally:
        await llm.aclose()
    assert time.monotonic() - started >= 0.3
    assert response.text == "finally" and "".join(deltas) == "finally"
    assert len(anthropic_server.requests) == 3


async def test_429_exhausted_raises_rate_limited(
    llm: AnthropicLLM,
    anthropic_server: AnthropicWireServer,
) -> None:
    for _ in range(llm.max_retries + 1):
        anthropic_server.reply_rate_limited(retry_after="0")
    with pytest.raises(LLMRateLimited) as info:
        await collect(llm, HELLO)
    assert len(anthropic_server.requests) == llm.max_retries + 1
    assert info.value.retriable and info.value.code == ErrorCode.LLM_RATE_LIMITED
    assert info.value.detail["status"] == 429
    assert info.value.detail["attempts"] == llm.max_retries + 1
    assert info.value.detail["request_id"] == "req_wire_anthropic"


async def test_5xx_is_retried_then_raises_unavailable(
    llm: AnthropicLLM,
    anthropic_server: AnthropicWireServer,
) -> None:
    anthropic_server.reply_server_error(500)
    anthropic_server.reply_server_error(529)
    anthropic_server.reply_text("recovered")
    assert (await collect(llm, HELLO))[1].text == "recovered"

    for _ in range(llm.max_retries + 1):
        anthropic_server.reply_server_error(503)
    with pytest.raises(LLMProviderUnavailable) as info:
        await collect(llm, HELLO)
    assert type(info.value) is LLMProviderUnavailable
    assert len(anthropic_server.requests) == 3 + llm.max_retries + 1


async def test_other_4xx_fail_at_once(
    llm: AnthropicLLM,
    anthropic_server: AnthropicWireServer,
) -> None:
    anthropic_server.reply_error(400, "invalid_request_error", "messages: field required")
    with pytest.raises(LLMError, match="field required") as info:
        await collect(llm, HELLO)
    assert not info.value.retriable
    anthropic_server.reply_error(
        400, "invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum"
    )
    with pytest.raises(ContextWindowExceeded):
        await collect(llm, HELLO)
    assert len(anthropic_server.requests) == 2


async def test_sdk_does_not_retry_on_its_own(
    anthropic_server: AnthropicWireServer,
) -> None:
    llm = AnthropicLLM(MODEL, api_key=SECRET_KEY, base_url=anthropic_server.base_url, max_retries=0)
    anthropic_server.reply_rate_limited(retry_after="0")
    anthropic_server.reply_text("never read")
    try:
        with pytest.raises(LLMRateLimited):
            await collect(llm, HELLO)
    finally:
        await llm.aclose()
    assert len(anthropic_server.requests) == 1 and anthropic_server.pending == 1


# -- broken streams ---------------------------------------------------------------------------


async def test_truncated_stream_after_text_raises_without_retry(
    llm: AnthropicLLM,
    anthropic_server: AnthropicWireServer,
) -> None:
    anthropic_server.reply_truncated([Text("partial answer")])
    anthropic_server.reply_text("never read")
    seen: list[str] = []
    with pytest.raises(ProviderStreamTruncated, match="message_stop"):
        async for item in llm.stream(HELLO):
            assert isinstance(item, TextDelta), "no response may follow a truncated stream"
            seen.append(item.text)
    assert "".join(seen) == "partial answer"
    assert len(anthropic_server.requests) == 1


async def test_truncated_stream_before_any_text_is_retried(
    llm: AnthropicLLM,
    anthropic_server: AnthropicWireServer,
) -> None:
    anthropic_server.reply_truncated([Text("lost")], keep=2)  # message_start and ping only
    anthropic_server.reply_text("second try")
    assert (await collect(llm, HELLO))[1].text == "second try"

    for _ in range(llm.max_retries + 1):
        anthropic_server.reply_truncated([ToolUse("t", "lookup", {"id": "1"})])
    with pytest.raises(ProviderStreamTruncated):
        await collect(llm, HELLO)
    assert len(anthropic_server.requests) == 2 + llm.max_retries + 1


async def test_connection_broken_mid_stream_raises_unavailable(
    llm: AnthropicLLM,
    anthropic_server: AnthropicWireServer,
) -> None:
    anthropic_server.reply_aborted([Text("some text here")], keep=4)
    with pytest.raises(LLMProviderUnavailable, match="connection broken"):
        await collect(llm, HELLO)
    assert len(anthropic_server.requests) == 1


async def test_error_event_inside_stream_raises_unavailable(
    llm: AnthropicLLM,
    anthropic_server: AnthropicWireServer,
) -> None:
    anthropic_server.reply_stream_error([Text("half")])
    with pytest.raises(LLMProviderUnavailable, match="overloaded_error"):
        await collect(llm, HELLO)
    assert len(anthropic_server.requests) == 1


async def test_llm_call_timeout_bounds_a_silent_provider(
    anthropic_server: AnthropicWireServer,
) -> None:
    from dataclasses import replace

    from pyrula_stream.testing_servers.anthropic_server import message_frames
    from pyrula_stream.testing_servers.scripted_http import sse_reply

    llm = AnthropicLLM(
        MODEL,
        api_key=SECRET_KEY,
        base_url=anthropic_server.base_url,
        llm_call_timeout=0.2,
        max_retries=0,
    )
    anthropic_server.enqueue(replace(sse_reply(message_frames([Text("slow")])), delay_s=1.0))
    started = time.monotonic()
    try:
        with pytest.raises(LLMProviderUnavailable, match="timed out"):
            await collect(llm, HELLO)
    finally:
        await llm.aclose()
    assert time.monotonic() - started < 0.9
