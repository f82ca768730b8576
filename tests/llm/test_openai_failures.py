"""OpenAILLM through the real ``openai`` SDK against a local Chat Completions server:
retries and broken streams.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from pyrula_stream.errors import (
    ContextWindowExceeded,
    LLMError,
    LLMProviderUnavailable,
    LLMRateLimited,
    ProviderStreamTruncated,
)
from pyrula_stream.llm import OpenAILLM, TextDelta, ToolDefinition
from pyrula_stream.testing_servers.openai_server import (
    MODEL,
    Call,
    OpenAIWireServer,
    completion_frames,
)
from pyrula_stream.testing_servers.scripted_http import sse_frame, sse_reply
from tests.llm.servers.fixtures import OPENAI_SECRET_KEY as SECRET
from tests.llm.servers.fixtures import collect

LOOKUP = ToolDefinition(
    name="lookup",
    description="Find an order by id.",
    input_schema={"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
)
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture
def llm(openai_llm: OpenAILLM) -> OpenAILLM:
    return openai_llm


# -- retries ---------------------------------------------------------------------------------


async def test_429_waits_for_retry_after_then_succeeds(
    openai_server: OpenAIWireServer,
) -> None:
    llm = OpenAILLM(MODEL, api_key=SECRET, base_url=openai_server.base_url, backoff_base_s=30.0)
    openai_server.reply_rate_limited(retry_after="0.2")
    openai_server.reply_rate_limited(retry_after=None, retry_after_ms="100")
    openai_server.reply_text("finally")
    started = time.monotonic()
    try:
        async with asyncio.timeout(5):
            _, response = await collect(llm, HELLO)
    finally:
        await llm.aclose()
    assert time.monotonic() - started >= 0.3
    assert response.text == "finally" and len(openai_server.requests) == 3


async def test_429_exhausted_raises_rate_limited(
    llm: OpenAILLM,
    openai_server: OpenAIWireServer,
) -> None:
    for _ in range(llm.max_retries + 1):
        openai_server.reply_rate_limited(retry_after="0")
    with pytest.raises(LLMRateLimited, match="rate_limit_exceeded") as info:
        await collect(llm, HELLO)
    assert len(openai_server.requests) == llm.max_retries + 1
    assert info.value.detail["request_id"] == "req_wire_openai"


async def test_insufficient_quota_is_not_retried(
    llm: OpenAILLM,
    openai_server: OpenAIWireServer,
) -> None:
    openai_server.reply_error(
        429,
        "You exceeded your current quota",
        "insufficient_quota",
        "insufficient_quota",
        {"retry-after": "0"},
    )
    with pytest.raises(LLMError) as info:
        await collect(llm, HELLO)
    assert not isinstance(info.value, LLMRateLimited)
    assert len(openai_server.requests) == 1


async def test_5xx_is_retried_then_raises_unavailable(
    llm: OpenAILLM,
    openai_server: OpenAIWireServer,
) -> None:
    openai_server.reply_server_error(500)
    openai_server.reply_text("recovered")
    assert (await collect(llm, HELLO))[1].text == "recovered"
    for _ in range(llm.max_retries + 1):
        openai_server.reply_server_error(502)
    with pytest.raises(LLMProviderUnavailable) as info:
        await collect(llm, HELLO)
    assert type(info.value) is LLMProviderUnavailable
    assert len(openai_server.requests) == 2 + llm.max_retries + 1


async def test_other_4xx_fail_at_once(
    llm: OpenAILLM,
    openai_server: OpenAIWireServer,
) -> None:
    openai_server.reply_error(400, "Invalid 'messages'", "invalid_request_error")
    with pytest.raises(LLMError, match="Invalid 'messages'"):
        await collect(llm, HELLO)
    openai_server.reply_error(
        400,
        "maximum context length is 128000 tokens",
        "invalid_request_error",
        "context_length_exceeded",
    )
    with pytest.raises(ContextWindowExceeded):
        await collect(llm, HELLO)
    assert len(openai_server.requests) == 2


# -- broken streams ---------------------------------------------------------------------------


async def test_truncated_stream_after_text_raises_without_retry(
    llm: OpenAILLM,
    openai_server: OpenAIWireServer,
) -> None:
    openai_server.reply_truncated("partial answer")
    openai_server.reply_text("never read")
    seen: list[str] = []
    with pytest.raises(ProviderStreamTruncated, match="finish_reason"):
        async for item in llm.stream(HELLO):
            assert isinstance(item, TextDelta)
            seen.append(item.text)
    assert "".join(seen) == "partial answer" and len(openai_server.requests) == 1


async def test_truncated_tool_call_stream_is_retried_then_raises(
    llm: OpenAILLM,
    openai_server: OpenAIWireServer,
) -> None:
    for _ in range(llm.max_retries + 1):
        openai_server.reply_truncated("", [Call("call_t", "lookup", {"id": "1"})])
    with pytest.raises(ProviderStreamTruncated):
        await collect(llm, HELLO, tools=[LOOKUP])
    assert len(openai_server.requests) == llm.max_retries + 1


async def test_connection_broken_mid_stream_raises_unavailable(
    llm: OpenAILLM,
    openai_server: OpenAIWireServer,
) -> None:
    openai_server.reply_aborted("some text here", keep=3)
    with pytest.raises(LLMProviderUnavailable, match="connection broken"):
        await collect(llm, HELLO)
    assert len(openai_server.requests) == 1


async def test_error_object_inside_stream_raises_unavailable(
    llm: OpenAILLM,
    openai_server: OpenAIWireServer,
) -> None:
    frames = completion_frames("half")[:3]
    frames.append(
        sse_frame(
            {
                "error": {
                    "message": "The server had an error",
                    "type": "server_error",
                    "param": None,
                    "code": None,
                }
            }
        )
    )
    openai_server.enqueue(sse_reply(frames))
    with pytest.raises(LLMProviderUnavailable, match="server had an error"):
        await collect(llm, HELLO)
