"""OpenAILLM through the real ``openai`` SDK against a local Chat Completions server:
conversion, streaming, secrets.
"""

from __future__ import annotations

import datetime
import sys

import pytest
from pydantic import BaseModel, Field

from pyrula_stream.agent.output import OutputSpec
from pyrula_stream.errors import (
    ConfigurationError,
    ErrorCode,
    LLMError,
    LLMProviderUnavailable,
)
from pyrula_stream.llm import OpenAILLM, ToolDefinition, Usage
from pyrula_stream.testing_servers.openai_server import (
    MODEL,
    Call,
    OpenAIWireServer,
    completion_frames,
)
from pyrula_stream.testing_servers.scripted_http import sse_reply
from tests.llm.servers.fixtures import OPENAI_SECRET_KEY as SECRET
from tests.llm.servers.fixtures import assert_secret_free, collect

LOOKUP = ToolDefinition(
    name="lookup",
    description="Find an order by id.",
    input_schema={"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
)
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture
def llm(openai_llm: OpenAILLM) -> OpenAILLM:
    return openai_llm


# -- streaming and conversion -------------------------------------------------------------


async def test_text_streams_deltas_then_one_response(
    llm: OpenAILLM,
    openai_server: OpenAIWireServer,
) -> None:
    openai_server.reply_stream("Hello world", text_chunk=4)
    deltas, response = await collect(llm, HELLO)
    assert deltas == ["Hell", "o wo", "rld"]
    assert response.text == "Hello world"
    assert response.stop_reason == "end_turn"
    assert response.model == MODEL


async def test_request_body_converts_system_and_tools(
    llm: OpenAILLM,
    openai_server: OpenAIWireServer,
) -> None:
    openai_server.reply_text("ok")
    await collect(llm, HELLO, tools=[LOOKUP], system="Be brief.")
    request = openai_server.last_request
    assert request.method == "POST" and request.path == "/chat/completions"
    assert request.body == {
        "model": MODEL,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_completion_tokens": 512,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hello"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "description": "Find an order by id.",
                    "parameters": LOOKUP.input_schema,
                },
            }
        ],
    }


async def test_tool_call_round_trip(
    llm: OpenAILLM,
    openai_server: OpenAIWireServer,
) -> None:
    openai_server.reply_stream(
        "Checking.",
        [Call("call_a", "lookup", {"id": "A-17"}), Call("call_b", "lookup", {"id": "B-2"})],
    )
    openai_server.reply_text("Both shipped.")
    _, first = await collect(llm, HELLO, tools=[LOOKUP])
    assert first.stop_reason == "tool_use"
    assert [(c.id, c.name, c.input) for c in first.tool_calls] == [
        ("call_a", "lookup", {"id": "A-17"}),
        ("call_b", "lookup", {"id": "B-2"}),
    ]
    conversation = [
        *HELLO,
        first.as_message(),
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_a", "content": "shipped"},
                {
                    "type": "tool_result",
                    "tool_use_id": "call_b",
                    "content": [{"type": "text", "text": "not found"}],
                    "is_error": True,
                },
                {"type": "text", "text": "Summarise."},
            ],
        },
    ]
    _, second = await collect(llm, conversation, tools=[LOOKUP])
    assert second.text == "Both shipped."
    assert openai_server.last_request.body["messages"] == [
        {"role": "user", "content": "hello"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"id": "A-17"}'},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"id": "B-2"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "shipped"},
        {"role": "tool", "tool_call_id": "call_b", "content": "Error: not found"},
        {"role": "user", "content": "Summarise."},
    ]


async def test_tool_only_reply_has_null_content_on_the_way_back(
    llm: OpenAILLM,
    openai_server: OpenAIWireServer,
) -> None:
    openai_server.reply_stream("", [Call("call_z", "lookup", {"id": "Z"})])
    openai_server.reply_text("ok")
    _, first = await collect(llm, HELLO, tools=[LOOKUP])
    assert first.text == "" and len(first.tool_calls) == 1
    result = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "call_z", "content": "{}"}],
    }
    await collect(llm, [*HELLO, first.as_message(), result], tools=[LOOKUP])
    assistant = openai_server.last_request.body["messages"][1]
    assert assistant["content"] is None and assistant["tool_calls"][0]["id"] == "call_z"


async def test_usage_maps_cached_tokens_out_of_prompt_tokens(
    llm: OpenAILLM,
    openai_server: OpenAIWireServer,
) -> None:
    openai_server.reply_stream("hi", prompt_tokens=1500, completion_tokens=40, cached_tokens=1024)
    _, response = await collect(llm, HELLO)
    assert response.usage == Usage(input_tokens=476, output_tokens=40, cache_read_input_tokens=1024)


async def test_missing_usage_chunk_is_estimated(
    llm: OpenAILLM,
    openai_server: OpenAIWireServer,
) -> None:
    openai_server.reply_stream("an answer of some length", include_usage=False)
    _, response = await collect(llm, HELLO)
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0


async def test_optional_parameters_only_when_set(
    openai_server: OpenAIWireServer,
) -> None:
    tuned = OpenAILLM(
        MODEL,
        api_key=SECRET,
        base_url=openai_server.base_url,
        temperature=0.3,
        top_p=0.9,
        seed=7,
        parallel_tool_calls=False,
        llm_call_timeout=3.5,
    )
    openai_server.reply_text("a")
    openai_server.reply_text("b")
    try:
        await collect(tuned, HELLO)  # no tools: parallel_tool_calls must stay out
        await collect(tuned, HELLO, tools=[LOOKUP], tool_choice={"type": "any"})
    finally:
        await tuned.aclose()
    without_tools, with_tools = (r.body for r in openai_server.requests)
    assert {k: without_tools[k] for k in ("temperature", "top_p", "seed")} == {
        "temperature": 0.3,
        "top_p": 0.9,
        "seed": 7,
    }
    assert "parallel_tool_calls" not in without_tools and "tool_choice" not in without_tools
    assert with_tools["parallel_tool_calls"] is False
    assert with_tools["tool_choice"] == "required"
    assert openai_server.last_request.headers["x-stainless-read-timeout"] == "3.5"


async def test_defaults_send_no_optional_parameters(
    llm: OpenAILLM,
    openai_server: OpenAIWireServer,
) -> None:
    openai_server.reply_text("ok")
    await collect(llm, HELLO, tools=[LOOKUP], tool_choice={"type": "tool", "name": "lookup"})
    body = openai_server.last_request.body
    for name in ("temperature", "top_p", "seed", "parallel_tool_calls", "max_tokens"):
        assert name not in body
    assert body["tool_choice"] == {"type": "function", "function": {"name": "lookup"}}


async def test_an_output_format_is_strict_only_when_strict_mode_takes_the_schema(
    llm: OpenAILLM,
    openai_server: OpenAIWireServer,
) -> None:
    class Strict(BaseModel):
        order_id: str
        due: datetime.date

    class Loose(BaseModel):
        order_id: str = Field(min_length=1)
        note: str | None = None  # optional: strict mode has no optional fields

    for model in (Strict, Loose):
        output = OutputSpec(model).native_format()
        assert output is not None
        openai_server.reply_text('{"order_id": "9"}')
        assert llm.accepts_keyword("output_format")
        await collect(llm, HELLO, output_format=output)
    strict, loose = (r.body["response_format"] for r in openai_server.requests)
    assert strict["type"] == "json_schema"
    assert strict["json_schema"]["name"] == "Strict"
    assert strict["json_schema"]["strict"] is True
    assert strict["json_schema"]["schema"]["properties"]["due"]["format"] == "date"
    assert loose["json_schema"]["strict"] is False  # sent as guidance, validated after
    assert loose["json_schema"]["schema"]["properties"]["order_id"]["minLength"] == 1
    assert loose["json_schema"]["schema"]["additionalProperties"] is False


async def test_finish_reason_length_drops_a_cut_tool_call(
    llm: OpenAILLM,
    openai_server: OpenAIWireServer,
) -> None:
    frames = completion_frames("", [Call("call_c", "lookup", {"id": "x"})], finish_reason="length")
    openai_server.enqueue(sse_reply([f.replace(b'\\"}', b"") for f in frames]))
    _, response = await collect(llm, HELLO, tools=[LOOKUP])
    assert response.stop_reason == "max_tokens" and response.tool_calls == []


async def test_reply_over_max_buffer_bytes_fails(openai_server: OpenAIWireServer) -> None:
    llm = OpenAILLM(MODEL, api_key=SECRET, base_url=openai_server.base_url, max_buffer_bytes=8)
    openai_server.reply_text("y" * 30)
    try:
        with pytest.raises(LLMError) as info:
            await collect(llm, HELLO)
    finally:
        await llm.aclose()
    assert info.value.code == ErrorCode.BUFFER_OVERFLOW


# -- secrets and packaging -----------------------------------------------------------------------


async def test_api_key_is_sent_but_never_shown(
    llm: OpenAILLM,
    openai_server: OpenAIWireServer,
) -> None:
    openai_server.reply_error(
        401, f"Incorrect API key provided: {SECRET}", "invalid_request_error", "invalid_api_key"
    )
    with pytest.raises(LLMError) as info:
        await collect(llm, HELLO)
    assert openai_server.last_request.headers["authorization"] == f"Bearer {SECRET}"
    assert "invalid_api_key" in str(info.value)
    assert_secret_free(info.value, SECRET)
    for _ in range(llm.max_retries + 1):
        openai_server.reply_error(500, f"upstream saw {SECRET}", "server_error")
    with pytest.raises(LLMProviderUnavailable) as unavailable:
        await collect(llm, HELLO)
    assert_secret_free(unavailable.value, SECRET)
    assert SECRET not in repr(llm) and SECRET not in llm.describe()


def test_missing_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)
    with pytest.raises(ConfigurationError, match=r"pip install 'pyrula-stream\[openai\]'"):
        OpenAILLM(MODEL)


async def test_missing_key_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
    openai_server: OpenAIWireServer,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    llm = OpenAILLM(MODEL, base_url=openai_server.base_url)
    with pytest.raises(ConfigurationError, match="OPENAI_API_KEY"):
        await collect(llm, HELLO)
    assert openai_server.requests == []


def test_importing_the_package_does_not_import_the_sdks() -> None:
    import subprocess

    code = (
        "import sys, pyrula_stream.llm as llm; "
        "assert 'anthropic' not in sys.modules and 'openai' not in sys.modules; "
        "assert llm.AnthropicLLM.provider == 'anthropic' and 'anthropic' not in sys.modules; "
        "llm.OpenAILLM('m', api_key='k'); assert 'openai' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


async def test_the_key_and_address_come_from_the_sdks_variables(
    monkeypatch: pytest.MonkeyPatch,
    openai_server: OpenAIWireServer,
) -> None:
    """A pod sets OPENAI_API_KEY (and OPENAI_BASE_URL) from a Secret; nothing is passed."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.base_url)
    llm = OpenAILLM(MODEL)
    openai_server.reply_stream("from the environment")
    _, response = await collect(llm, HELLO)
    assert response.text == "from the environment"
    assert openai_server.requests[-1].headers["authorization"] == f"Bearer {SECRET}"
    assert SECRET not in repr(llm)
