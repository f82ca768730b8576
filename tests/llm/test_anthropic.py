"""AnthropicLLM through the real ``anthropic`` SDK against a local Messages API server:
conversion, streaming, secrets.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
from pydantic import BaseModel, Field

from pyrula_stream.agent.output import OutputSpec
from pyrula_stream.errors import (
    ConfigurationError,
    ErrorCode,
    LLMError,
    LLMRateLimited,
)
from pyrula_stream.llm import AnthropicLLM, ToolDefinition, Usage
from pyrula_stream.testing_servers.anthropic_server import MODEL, AnthropicWireServer, Text, ToolUse
from tests.llm.servers.fixtures import SECRET_KEY, assert_secret_free, collect

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


# -- streaming and conversion -------------------------------------------------------------


async def test_text_streams_deltas_then_one_response(
    llm: AnthropicLLM,
    anthropic_server: AnthropicWireServer,
) -> None:
    anthropic_server.reply_stream([Text("Hello world", chunk=5)])
    deltas, response = await collect(llm, HELLO)
    assert deltas == ["Hello", " worl", "d"]
    assert response.text == "Hello world"
    assert response.stop_reason == "end_turn"
    assert response.model == MODEL
    assert response.tool_calls == []


async def test_request_body_carries_system_and_tools(
    llm: AnthropicLLM,
    anthropic_server: AnthropicWireServer,
) -> None:
    """A prompt this short is below the model's cacheable minimum: no breakpoints."""
    anthropic_server.reply_text("ok")
    await collect(llm, HELLO, tools=[LOOKUP, REFUND], system="Be brief.")
    request = anthropic_server.last_request
    assert request.method == "POST" and request.path == "/v1/messages"
    assert request.body == {
        "model": MODEL,
        "max_tokens": 1024,
        "stream": True,
        "messages": [{"role": "user", "content": "hello"}],
        "system": "Be brief.",
        "tools": [
            {
                "name": "lookup",
                "description": "Find an order by id.",
                "input_schema": LOOKUP.input_schema,
            },
            {
                "name": "refund",
                "description": "Refund an order.",
                "input_schema": REFUND.input_schema,
            },
        ],
    }


async def test_tool_call_round_trip(
    llm: AnthropicLLM,
    anthropic_server: AnthropicWireServer,
) -> None:
    anthropic_server.reply_stream(
        [Text("Let me look."), ToolUse("toolu_01", "lookup", {"id": "A-17", "n": [1, 2]})],
        stop_reason="tool_use",
    )
    anthropic_server.reply_text("Order A-17 shipped.")
    deltas, first = await collect(llm, HELLO, tools=[LOOKUP])
    assert "".join(deltas) == "Let me look."
    assert first.stop_reason == "tool_use"
    [call] = first.tool_calls
    assert (call.id, call.name, call.input) == ("toolu_01", "lookup", {"id": "A-17", "n": [1, 2]})

    conversation = [
        *HELLO,
        first.as_message(),
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01",
                    "content": "shipped",
                    "is_error": False,
                },
            ],
        },
    ]
    _, second = await collect(llm, conversation, tools=[LOOKUP])
    assert second.text == "Order A-17 shipped."
    assert anthropic_server.last_request.body["messages"] == [
        {"role": "user", "content": "hello"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {
                    "type": "tool_use",
                    "id": "toolu_01",
                    "name": "lookup",
                    "input": {"id": "A-17", "n": [1, 2]},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01",
                    "content": "shipped",
                    "is_error": False,
                },
            ],
        },
    ]


async def test_usage_includes_cache_tokens(
    llm: AnthropicLLM,
    anthropic_server: AnthropicWireServer,
) -> None:
    anthropic_server.reply_stream(
        [Text("hi")],
        input_tokens=21,
        output_tokens=9,
        cache_creation_input_tokens=300,
        cache_read_input_tokens=1200,
    )
    _, response = await collect(llm, HELLO)
    assert response.usage == Usage(
        input_tokens=21,
        output_tokens=9,
        cache_creation_input_tokens=300,
        cache_read_input_tokens=1200,
    )


async def test_an_output_format_goes_as_output_config_in_the_api_s_dialect(
    llm: AnthropicLLM,
    anthropic_server: AnthropicWireServer,
) -> None:
    class Ticket(BaseModel):
        order_id: str = Field(min_length=1)
        tags: list[str]

    output = OutputSpec(Ticket).native_format()
    assert output is not None
    anthropic_server.reply_text('{"order_id": "9", "tags": []}')
    assert llm.accepts_keyword("output_format")
    _, response = await collect(llm, HELLO, tools=[LOOKUP], output_format=output)
    assert response.text == '{"order_id": "9", "tags": []}'
    body = anthropic_server.last_request.body
    schema = body["output_config"]["format"]["schema"]
    assert body["output_config"]["format"]["type"] == "json_schema"
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["order_id", "tags"]
    # What the API does not constrain becomes a hint in the description (the SDK's rule).
    assert "minLength" not in schema["properties"]["order_id"]
    assert "minLength: 1" in schema["properties"]["order_id"]["description"]
    assert "tool_choice" not in body and body["tools"][0]["name"] == "lookup"


async def test_options_reach_the_wire(anthropic_server: AnthropicWireServer) -> None:
    llm = AnthropicLLM(
        MODEL,
        api_key=SECRET_KEY,
        base_url=anthropic_server.base_url,
        temperature=0.2,
        llm_call_timeout=2.5,
    )
    anthropic_server.reply_text("ok")
    try:
        assert llm.accepts_keyword("tool_choice")
        await collect(llm, HELLO, tools=[LOOKUP], tool_choice={"type": "tool", "name": "lookup"})
    finally:
        await llm.aclose()
    request = anthropic_server.last_request
    assert request.body["temperature"] == 0.2
    assert request.body["tool_choice"] == {"type": "tool", "name": "lookup"}
    assert request.headers["x-stainless-timeout"] == "2.5"  # the SDK's per-request timeout
    assert request.headers["x-stainless-retry-count"] == "0"


async def test_complete_drains_the_stream(
    llm: AnthropicLLM,
    anthropic_server: AnthropicWireServer,
) -> None:
    anthropic_server.reply_text("done")
    assert (await llm.complete(HELLO, system="S")).text == "done"


async def test_tool_input_cut_by_max_tokens_is_dropped_but_broken_json_is_an_error(
    llm: AnthropicLLM,
    anthropic_server: AnthropicWireServer,
) -> None:
    from pyrula_stream.testing_servers.anthropic_server import message_frames
    from pyrula_stream.testing_servers.scripted_http import sse_reply

    def broken_tool(stop_reason: str) -> list[bytes]:
        frames = message_frames(
            [ToolUse("toolu_9", "lookup", {"id": "x"})], stop_reason=stop_reason
        )
        return [f.replace(b'\\"x\\"}', b'\\"x') for f in frames]

    anthropic_server.enqueue(sse_reply(broken_tool("max_tokens")))
    _, response = await collect(llm, HELLO, tools=[LOOKUP])
    assert response.stop_reason == "max_tokens" and response.tool_calls == []
    anthropic_server.enqueue(sse_reply(broken_tool("tool_use")))
    with pytest.raises(LLMError, match="invalid JSON"):
        await collect(llm, HELLO, tools=[LOOKUP])


async def test_reply_over_max_buffer_bytes_fails(
    anthropic_server: AnthropicWireServer,
) -> None:
    llm = AnthropicLLM(
        MODEL, api_key=SECRET_KEY, base_url=anthropic_server.base_url, max_buffer_bytes=16
    )
    anthropic_server.reply_text("x" * 40)
    try:
        with pytest.raises(LLMError) as info:
            await collect(llm, HELLO)
    finally:
        await llm.aclose()
    assert info.value.code == ErrorCode.BUFFER_OVERFLOW


# -- secrets and packaging -----------------------------------------------------------------------


async def test_api_key_is_sent_but_never_shown(
    llm: AnthropicLLM,
    anthropic_server: AnthropicWireServer,
) -> None:
    echo = f"invalid x-api-key: {SECRET_KEY}"
    anthropic_server.reply_error(401, "authentication_error", echo)
    with pytest.raises(LLMError) as info:
        await collect(llm, HELLO)
    headers = anthropic_server.last_request.headers
    assert SECRET_KEY in headers.get("x-api-key", "") + headers.get("authorization", "")
    assert "authentication_error" in str(info.value)
    assert_secret_free(info.value, SECRET_KEY)

    for _ in range(llm.max_retries + 1):
        anthropic_server.reply_error(
            429, "rate_limit_error", f"slow down {SECRET_KEY}", {"retry-after": "0"}
        )
    with pytest.raises(LLMRateLimited) as limited:
        await collect(llm, HELLO)
    assert_secret_free(limited.value, SECRET_KEY)

    for text in (repr(llm), llm.describe(), str(vars(llm).get("retry_policy"))):
        assert SECRET_KEY not in text
    assert "claude-sonnet-4-6" in repr(llm)


def test_repr_hides_credentials_in_base_url() -> None:
    llm = AnthropicLLM(MODEL, api_key=SECRET_KEY, base_url="https://user:pw@proxy.local:8443/a?k=1")
    assert repr(llm) == (
        "AnthropicLLM(model='claude-sonnet-4-6', base_url='https://proxy.local:8443/a', "
        "max_retries=3, max_tokens=8192)"
    )


def test_missing_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "anthropic", None)
    with pytest.raises(ConfigurationError, match=r"pip install 'pyrula-stream\[anthropic\]'"):
        AnthropicLLM(MODEL)


async def test_missing_key_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
    anthropic_server: AnthropicWireServer,
    tmp_path: Any,
) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ANTHROPIC_CONFIG_DIR", str(tmp_path))
    llm = AnthropicLLM(MODEL, base_url=anthropic_server.base_url)
    with pytest.raises(ConfigurationError, match="ANTHROPIC_API_KEY"):
        await collect(llm, HELLO)
    assert anthropic_server.requests == []


async def test_the_key_and_address_come_from_the_sdks_variables(
    monkeypatch: pytest.MonkeyPatch,
    anthropic_server: AnthropicWireServer,
) -> None:
    """A pod sets ANTHROPIC_API_KEY (and ANTHROPIC_BASE_URL) from a Secret: nothing passed."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET_KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", anthropic_server.base_url)
    llm = AnthropicLLM(MODEL, prompt_caching=False)
    anthropic_server.reply_text("from the environment")
    _, response = await collect(llm, HELLO)
    assert response.text == "from the environment"
    headers = anthropic_server.requests[-1].headers
    assert SECRET_KEY in headers.get("x-api-key", "") + headers.get("authorization", "")
    assert SECRET_KEY not in repr(llm)
