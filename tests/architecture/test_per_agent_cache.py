"""What is the same for every turn of an agent is built once: a tool's definition and the
keywords a model client's ``stream`` takes (each was rebuilt on every turn)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from pyrula_stream import ToolContext, tool
from pyrula_stream.llm.base import LLMClient, OutputFormat, StreamItem, ToolDefinition


@tool(read_only=True)
async def lookup(ctx: ToolContext, order_id: str) -> str:
    """Look up an order."""
    return "shipped"


def test_a_tool_definition_is_built_once_and_never_the_specs_own_schema() -> None:
    first = lookup.definition()
    assert lookup.definition() is first
    assert first.input_schema == lookup.spec.input_schema
    assert first.input_schema is not lookup.spec.input_schema


class Native(LLMClient):
    """A client whose ``stream`` takes ``output_format``."""

    async def stream(
        self,
        messages: list[dict[str, Any]],
        tools: list[ToolDefinition] | None = None,
        system: str | None = None,
        output_format: OutputFormat | None = None,
    ) -> AsyncIterator[StreamItem]:
        return  # only its signature is read: it is never streamed
        yield


async def _plain(
    messages: list[dict[str, Any]],
    tools: list[ToolDefinition] | None = None,
    system: str | None = None,
) -> AsyncIterator[StreamItem]:
    return  # only its signature is read: it is never streamed
    yield


def test_accepted_keywords_follow_the_stream_function_each_client_has() -> None:
    native = Native()
    assert native.accepts_keyword("output_format")
    assert Native().accepts_keyword("output_format")
    assert not native.accepts_keyword("temperature")
    patched = Native()
    patched.stream = _plain  # type: ignore[method-assign]
    assert not patched.accepts_keyword("output_format")
    assert native.accepts_keyword("output_format")
