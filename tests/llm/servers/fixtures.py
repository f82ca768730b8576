"""Pytest fixtures and helpers for the wire servers and the adapters on top of them.

``tests/llm/conftest.py`` offers them to the model tests; a test module elsewhere brings
one in by assignment::

    from tests.llm.servers import fixtures

    anthropic_server = fixtures.anthropic_server

Each server fixture starts a fresh server on a free loopback port for one test and stops
it afterwards; queue replies with its ``reply_*`` helpers or ``enqueue``, read what the
SDK sent from ``requests``. The adapter fixtures point an adapter with a known secret key
and near-zero backoff at that server and close it after the test.
"""

from __future__ import annotations

import traceback
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from pyrula_stream.llm import AnthropicLLM, LLMClient, ModelResponse, OpenAILLM, TextDelta
from pyrula_stream.testing_servers.anthropic_server import MODEL as ANTHROPIC_MODEL
from pyrula_stream.testing_servers.anthropic_server import AnthropicWireServer
from pyrula_stream.testing_servers.openai_server import MODEL as OPENAI_MODEL
from pyrula_stream.testing_servers.openai_server import OpenAIWireServer

SECRET_KEY = "sk-ant-wire-SECRET-0123456789abcdef"
"""An Anthropic API key that must never show up in anything the adapters raise or print."""

OPENAI_SECRET_KEY = "sk-proj-wire-SECRET-0123456789abcdef"
"""The same for OpenAI."""


@pytest.fixture
def anthropic_server() -> Iterator[AnthropicWireServer]:
    with AnthropicWireServer() as server:
        yield server


@pytest.fixture
def openai_server() -> Iterator[OpenAIWireServer]:
    with OpenAIWireServer() as server:
        yield server


@pytest.fixture
async def anthropic_llm(anthropic_server: AnthropicWireServer) -> AsyncIterator[AnthropicLLM]:
    adapter = AnthropicLLM(
        ANTHROPIC_MODEL,
        api_key=SECRET_KEY,
        base_url=anthropic_server.base_url,
        max_tokens=1024,
        backoff_base_s=0.001,
    )
    yield adapter
    await adapter.aclose()


@pytest.fixture
async def openai_llm(openai_server: OpenAIWireServer) -> AsyncIterator[OpenAILLM]:
    adapter = OpenAILLM(
        OPENAI_MODEL,
        api_key=OPENAI_SECRET_KEY,
        base_url=openai_server.base_url,
        max_tokens=512,
        backoff_base_s=0.001,
    )
    yield adapter
    await adapter.aclose()


async def collect(
    llm: LLMClient, messages: list[dict[str, Any]], **kwargs: Any
) -> tuple[list[str], ModelResponse]:
    """The text deltas and the single final response of one call (asserting the shape)."""
    items = [item async for item in llm.stream(messages, **kwargs)]
    responses = [i for i in items if isinstance(i, ModelResponse)]
    assert len(responses) == 1 and items[-1] is responses[0], "one response, last"
    return [i.text for i in items if isinstance(i, TextDelta)], responses[0]


def assert_secret_free(exc: BaseException, secret: str) -> None:
    """Nothing reachable from the exception, as printed or inspected, holds ``secret``."""
    assert secret not in "".join(traceback.format_exception(exc))
    assert secret not in repr(exc)
    assert secret not in repr(getattr(exc, "detail", None))
    # The SDK exception (which holds the request and its auth header) is not chained on.
    assert exc.__cause__ is None and exc.__context__ is None
