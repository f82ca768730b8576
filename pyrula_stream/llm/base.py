"""The provider-neutral model interface: messages, content blocks, requests, responses, usage.

Messages use one internal shape (Anthropic-like) everywhere: the journal, ``FakeLLM`` and
the tool loop. Each provider adapter converts to and from its own wire format.

A message is ``{"role": "user" | "assistant", "content": str | list[block]}`` where a
block is one of::

    {"type": "text", "text": "..."}
    {"type": "tool_use", "id": "...", "name": "...", "input": {...}}
    {"type": "tool_result", "tool_use_id": "...", "content": "...", "is_error": false}
"""

from __future__ import annotations

import functools
import inspect
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

DEFAULT_MAX_RETRIES = 3


class StreamingMode(StrEnum):
    """SAFE buffers nothing the journal has not seen; deltas are for display only."""

    SAFE = "safe"


@dataclass(frozen=True, slots=True)
class ToolDefinition:
    """What the model sees of one tool."""

    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """The JSON Schema a model's final answer must match, for providers that take one
    natively (OpenAI ``response_format``, Anthropic ``output_config.format``).

    ``schema`` is a closed object schema (see ``pyrula_stream.agent.output``); each adapter
    adapts it to what its API accepts.
    """

    name: str
    schema: dict[str, Any]


class TextBlock(BaseModel):
    model_config = ConfigDict(frozen=True)
    type: Literal["text"] = "text"
    text: str


class ToolUseBlock(BaseModel):
    model_config = ConfigDict(frozen=True)
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


ContentBlock = Annotated[TextBlock | ToolUseBlock, Field(discriminator="type")]


class Usage(BaseModel):
    """Token counts as the provider billed them."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_1h_input_tokens: int = Field(default=0, exclude_if=lambda v: v == 0)
    """Of ``cache_creation_input_tokens``, those written with the 1-hour TTL (Anthropic
    bills them at 2x input instead of 1.25x); left out of the journal when 0, so other
    journals keep their bytes."""

    @property
    def billed_tokens(self) -> int:
        """Tokens that count toward ``max_total_tokens``: cache reads are excluded."""
        return self.input_tokens + self.output_tokens + self.cache_creation_input_tokens

    @property
    def prompt_tokens(self) -> int:
        """Every input token of the call: uncached, written to and read from the cache."""
        return self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens

    def as_dict(self) -> dict[str, int]:
        """``model_dump()``'s dict, built directly: every model call's event carries it."""
        usage = {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
        }
        if self.cache_creation_1h_input_tokens:
            usage["cache_creation_1h_input_tokens"] = self.cache_creation_1h_input_tokens
        return usage

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_creation_input_tokens=self.cache_creation_input_tokens
            + other.cache_creation_input_tokens,
            cache_read_input_tokens=self.cache_read_input_tokens + other.cache_read_input_tokens,
            cache_creation_1h_input_tokens=self.cache_creation_1h_input_tokens
            + other.cache_creation_1h_input_tokens,
        )


class ModelResponse(BaseModel):
    """One complete model reply: what the journal records for a model call."""

    content: list[ContentBlock] = Field(default_factory=list)
    stop_reason: str = "end_turn"
    usage: Usage = Field(default_factory=Usage)
    model: str = ""
    provider: str | None = Field(default=None, exclude_if=lambda v: v is None)
    """Set only by ``FallbackLLM``: which provider answered (absent from the journal
    otherwise, so other journals keep their bytes)."""

    @property
    def text(self) -> str:
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))

    @property
    def tool_calls(self) -> list[ToolUseBlock]:
        return [b for b in self.content if isinstance(b, ToolUseBlock)]

    def as_message(self) -> dict[str, Any]:
        """The assistant message that goes back into the conversation."""
        return {"role": "assistant", "content": [b.model_dump() for b in self.content]}


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of text while the model is still writing (display only, not journaled)."""

    text: str


StreamItem = TextDelta | ModelResponse
"""What ``LLMClient.stream`` yields: any number of deltas, then exactly one response."""

content_blocks_adapter: TypeAdapter[list[ContentBlock]] = TypeAdapter(list[ContentBlock])


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One model call as one value: what the tool loop or compaction asks a model.

    It goes whole through ``stream_request``, the fallback chain, the retry loop and each
    adapter's ``build_request``, so a new field is added here (and as a keyword of
    ``RequestClient.stream``) instead of to every adapter's signatures, the way temporalio
    passes its frozen input dataclasses. ``tool_choice`` and ``output_format`` are
    optional: a client is given one only when it is set (and ``FallbackLLM`` gives each
    client only those its ``stream`` takes).
    """

    messages: list[dict[str, Any]]
    tools: list[ToolDefinition] = field(default_factory=list)
    system: str | None = None
    tool_choice: dict[str, Any] | None = None
    output_format: OutputFormat | None = None
    tokens: Any = field(default=None, compare=False, repr=False)
    """The tool loop's ``RunningEstimate`` of its growing conversation, if any: what the
    rate limiter's estimate counts with, so a long turn's request is not counted again."""
    cache_key: str | None = None
    """A stable name of the conversation (the tool loop's: its agent and thread), for
    providers that route requests to a prompt cache by key (OpenAI's
    ``prompt_cache_key``)."""

    def keywords(self) -> dict[str, Any]:
        """The optional fields that are set, as ``stream`` keywords."""
        return {
            name: value for name in OPTIONAL_FIELDS if (value := getattr(self, name)) is not None
        }


OPTIONAL_FIELDS = ("tool_choice", "output_format")
"""The fields of ``ModelRequest`` a client's ``stream`` takes as optional keywords."""


@dataclass(frozen=True, slots=True)
class LLMRate:
    """A request and token budget per minute, shared by every turn in a worker process."""

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None


@functools.cache
def _parameters(stream: Callable[..., Any]) -> frozenset[str]:
    """The parameter names of a ``stream`` function (``inspect.signature`` on every turn
    was 7% of a one-tool turn's CPU in the profile)."""
    return frozenset(inspect.signature(stream).parameters)


class LLMClient(ABC):
    """Abstract base for provider adapters.

    The frozen core is ``stream`` and ``complete``: a client implements ``stream``, and
    optional keywords (``tool_choice``, ``output_format``) are passed only when
    ``accepts_keyword`` finds them on its signature. The library calls
    ``stream_request`` with a ``ModelRequest``, which by default calls ``stream`` with the
    request's fields; a client built on the request itself (``RequestClient``) overrides it.
    """

    provider: str | None = None
    model: str = ""
    streaming_mode: StreamingMode = StreamingMode.SAFE
    max_buffer_bytes: int = 5 * 1024 * 1024
    max_retries: int = DEFAULT_MAX_RETRIES

    @abstractmethod
    def stream(
        self,
        messages: list[dict[str, Any]],
        tools: list[ToolDefinition] | None = None,
        system: str | None = None,
    ) -> AsyncIterator[StreamItem]:
        """Yield text deltas while the model writes, then the complete ``ModelResponse``."""

    def stream_request(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        """``stream`` of one request: its fields as arguments, optional ones only when set."""
        return self.stream(
            request.messages, request.tools or None, request.system, **request.keywords()
        )

    async def complete(
        self, messages: list[dict[str, Any]], system: str | None = None
    ) -> ModelResponse:
        """One call without tools (``complete_request`` of the request they make)."""
        return await self.complete_request(ModelRequest(messages, system=system))

    async def complete_request(self, request: ModelRequest) -> ModelResponse:
        """One call's complete response; the default drains ``stream_request``."""
        final: ModelResponse | None = None
        async for item in self.stream_request(request):
            if isinstance(item, ModelResponse):
                final = item
        if final is None:
            from pyrula_stream.errors import ProviderStreamTruncated

            raise ProviderStreamTruncated(f"{self.provider} stream ended without a response")
        return final

    def accepts_keyword(self, name: str) -> bool:
        """Whether ``stream`` takes the optional keyword ``name`` (asked once per turn: the
        signature is read once per ``stream`` function, not on every call)."""
        func = getattr(self.stream, "__func__", None)
        if func is None:  # a callable set on the instance: read it each time
            return name in inspect.signature(self.stream).parameters
        return name in _parameters(func)

    def describe(self) -> str:
        """A short label for logs and the demo banner; never includes secrets."""
        return f"{type(self).__name__}({self.model})"


class RequestClient(LLMClient):
    """A client built on ``ModelRequest`` (the SDK adapters, ``FallbackLLM``): it
    implements ``stream_request``, and its ``stream`` takes every field of the request."""

    def stream(
        self,
        messages: list[dict[str, Any]],
        tools: list[ToolDefinition] | None = None,
        system: str | None = None,
        tool_choice: dict[str, Any] | None = None,
        output_format: OutputFormat | None = None,
        cache_key: str | None = None,
    ) -> AsyncIterator[StreamItem]:
        """``stream_request`` of the request these arguments make."""
        return self.stream_request(
            ModelRequest(
                messages, tools or [], system, tool_choice, output_format, cache_key=cache_key
            )
        )

    @abstractmethod
    def stream_request(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        """Yield text deltas while the model writes, then the complete ``ModelResponse``."""
