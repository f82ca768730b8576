"""``AnthropicLLM``: the Messages API through the official ``anthropic`` SDK.

Our internal messages are already Anthropic-shaped, so the request side is mostly prompt
caching; the response side rebuilds a ``ModelResponse`` from the raw stream events and
insists on ``message_stop``, because a proxy closing the connection cleanly looks like a
normal end to the SDK.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyrula_stream.errors import ConfigurationError, ProviderStreamTruncated
from pyrula_stream.llm._adapter import SDKAdapter, broken_read
from pyrula_stream.llm._retry import FailureKind, ProviderFailure, parse_retry_after
from pyrula_stream.llm.base import (
    ModelRequest,
    ModelResponse,
    StreamItem,
    TextBlock,
    TextDelta,
    ToolUseBlock,
    Usage,
)
from pyrula_stream.llm.tokens import estimate_tokens, request_tokens

if TYPE_CHECKING:
    from anthropic import AsyncAnthropic
    from anthropic.types import Message, RawMessageDeltaEvent, RawMessageStreamEvent

CACHE_TTLS = ("5m", "1h")

# Error events inside a 200 stream carry no status; their type says what happened.
_STREAM_ERROR_KINDS: dict[str, FailureKind] = {
    "overloaded_error": "unavailable",
    "api_error": "unavailable",
    "timeout_error": "unavailable",
    "rate_limit_error": "rate_limited",
}


def _import_sdk() -> None:
    try:
        import anthropic  # noqa: F401
    except ImportError:
        raise ConfigurationError(
            "AnthropicLLM needs the anthropic SDK: pip install 'pyrula-stream[anthropic]'"
        ) from None


@dataclass
class _Block:
    kind: str
    parts: list[str] = field(default_factory=list)
    id: str = ""
    name: str = ""


@dataclass
class _MessageState:
    """What the stream has said so far about one message."""

    model: str
    blocks: dict[int, _Block] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    stop_reason: str | None = None
    stopped: bool = False
    size: int = 0

    def apply(self, event: RawMessageStreamEvent) -> str | None:
        """Fold one event in; return the text it adds, if any."""
        if event.type == "message_start":
            self.model = event.message.model or self.model
            u = event.message.usage
            self.usage = Usage(
                input_tokens=u.input_tokens,
                output_tokens=u.output_tokens,
                cache_creation_input_tokens=u.cache_creation_input_tokens or 0,
                cache_read_input_tokens=u.cache_read_input_tokens or 0,
                cache_creation_1h_input_tokens=_written_for_an_hour(u),
            )
        elif event.type == "content_block_start":
            cb = event.content_block
            if cb.type == "text":
                started = self.blocks[event.index] = _Block("text")
                if cb.text:
                    return self._add(started, cb.text)
            elif cb.type == "tool_use":
                self.blocks[event.index] = _Block("tool_use", id=cb.id, name=cb.name)
        elif event.type == "content_block_delta":
            block = self.blocks.get(event.index)
            delta = event.delta
            if block is not None and delta.type == "text_delta" and block.kind == "text":
                return self._add(block, delta.text)
            if block is not None and delta.type == "input_json_delta":
                self._add(block, delta.partial_json)
        elif event.type == "message_delta":
            self.stop_reason = event.delta.stop_reason or self.stop_reason
            self._update_usage(event)
        elif event.type == "message_stop":
            self.stopped = True
        return None

    def apply_message(self, message: Message) -> None:
        """Fold in a whole (not streamed) message, as a batch returns it: the same
        content, stop reason and usage the stream's events carry."""
        self.model = message.model or self.model
        u = message.usage
        self.usage = Usage(
            input_tokens=u.input_tokens,
            output_tokens=u.output_tokens,
            cache_creation_input_tokens=u.cache_creation_input_tokens or 0,
            cache_read_input_tokens=u.cache_read_input_tokens or 0,
        )
        for index, cb in enumerate(message.content):
            if cb.type == "text":
                self._add(self.blocks.setdefault(index, _Block("text")), cb.text)
            elif cb.type == "tool_use":
                block = self.blocks[index] = _Block("tool_use", id=cb.id, name=cb.name)
                self._add(block, json.dumps(cb.input))
        self.stop_reason = message.stop_reason or self.stop_reason
        self.stopped = True

    def _add(self, block: _Block, piece: str) -> str:
        block.parts.append(piece)
        self.size += len(piece.encode())
        return piece

    def _update_usage(self, event: RawMessageDeltaEvent) -> None:
        # message_delta usage is cumulative; fields it leaves out keep their start values.
        u = event.usage
        fields = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        update: dict[str, int] = {"output_tokens": u.output_tokens}
        update.update({f: getattr(u, f) for f in fields if getattr(u, f, None) is not None})
        self.usage = self.usage.model_copy(update=update)


@dataclass(eq=False, repr=False, kw_only=True)
class AnthropicLLM(SDKAdapter):
    """Anthropic Messages API adapter.

    Takes the settings every adapter takes (see ``SDKAdapter``) and two of its own:
    ``prompt_caching`` (on by default) places the request's cache breakpoints (see
    ``mark_breakpoints``), each written for ``cache_ttl`` ("5m" or "1h").
    ``llm_call_timeout`` is the per-request timeout in seconds. ``backoff_base_s`` and
    ``max_retry_wait_s`` tune our retries.
    ``structured_output=False`` keeps an ``output_type``'s schema out of
    ``output_config`` (for models without structured outputs).
    The API key is never part of ``repr``, ``describe`` or any raised message.
    """

    provider = "anthropic"
    api_key_env = "ANTHROPIC_API_KEY"

    prompt_caching: bool = True
    cache_ttl: str = "5m"

    def __post_init__(self, api_key: str | None) -> None:
        _import_sdk()
        if self.cache_ttl not in CACHE_TTLS:
            raise ConfigurationError(
                f"cache_ttl must be one of {CACHE_TTLS}, got {self.cache_ttl!r}"
            )
        super().__post_init__(api_key)
        self._client: AsyncAnthropic | None = None

    def _sdk_client(self) -> AsyncAnthropic:
        """The SDK client, made on first use so it belongs to the loop that uses it."""
        if self._client is None:
            from anthropic import AsyncAnthropic

            # max_retries=0: the SDK must not retry behind our back (see _retry).
            client = AsyncAnthropic(api_key=self._api_key, base_url=self.base_url, max_retries=0)
            if client.api_key is None and client.auth_token is None and client.credentials is None:
                raise ConfigurationError(
                    "AnthropicLLM has no API key: pass api_key= or set ANTHROPIC_API_KEY"
                )
            self._client = client
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    # -- request ---------------------------------------------------------------------------

    def _cache_control(self) -> dict[str, str]:
        control = {"type": "ephemeral"}
        if self.cache_ttl != "5m":
            control["ttl"] = self.cache_ttl
        return control

    def build_request(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments for ``messages.create`` (without ``stream``/``timeout``)."""
        params: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": [_wire_message(m) for m in request.messages],
        }
        system, tools = request.system, request.tools
        if system:
            params["system"] = system
        if tools:
            params["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.input_schema}
                for t in tools
            ]
        if self.prompt_caching:
            mark_breakpoints(params, request, self._cache_control())
        if request.tool_choice:
            params["tool_choice"] = request.tool_choice
        if request.output_format is not None:
            # Native structured output: the model may still call tools; its final text is
            # JSON matching the schema. The SDK's transform_schema moves what the API does
            # not constrain (e.g. minLength) into descriptions.
            from anthropic import transform_schema

            schema = transform_schema(request.output_format.schema)
            params["output_config"] = {"format": {"type": "json_schema", "schema": schema}}
        if self.temperature is not None:
            # The SDK no longer types a temperature parameter; send it as-is and let the API
            # accept or refuse it for this model.
            params["extra_body"] = {"temperature": self.temperature}
        return params

    def batch_params(self, request: ModelRequest) -> dict[str, Any]:
        """The ``params`` of the same call inside a message batch: ``build_request`` with
        what it sends through ``extra_body`` folded in (a batch takes one JSON object)."""
        params = self.build_request(request)
        params.update(params.pop("extra_body", None) or {})
        return params

    def response_of_message(self, message: Message) -> ModelResponse:
        """The ``ModelResponse`` of a whole message (a batch's result), built as a
        streamed call's is."""
        state = _MessageState(self.model)
        state.apply_message(message)
        self._check_buffer(state.size)
        return self._response(state)

    # -- one attempt -------------------------------------------------------------------------

    async def _attempt(self, request: ModelRequest) -> AsyncGenerator[StreamItem, None]:
        params = self.build_request(request)
        extra: dict[str, Any] = {}
        if self.llm_call_timeout is not None:
            extra["timeout"] = self.llm_call_timeout
        stream = await self._sdk_client().messages.create(**params, stream=True, **extra)
        state = _MessageState(self.model)
        async with stream:
            try:
                async for event in stream:
                    text = state.apply(event)
                    self._check_buffer(state.size)
                    if text:
                        yield TextDelta(text)
            except Exception as exc:  # a body read that failed: see broken_read
                if (broken := broken_read(exc)) is None:
                    raise
                raise broken from None
        if not state.stopped:
            raise ProviderStreamTruncated("anthropic stream ended without message_stop")
        yield self._response(state)

    def _response(self, state: _MessageState) -> ModelResponse:
        cut_short = state.stop_reason == "max_tokens"
        content: list[TextBlock | ToolUseBlock] = []
        for _, block in sorted(state.blocks.items()):
            if block.kind == "text":
                if block.parts:
                    content.append(TextBlock(text="".join(block.parts)))
                continue
            args = self._parse_tool_input(block.name, "".join(block.parts), cut_short=cut_short)
            if args is not None:
                content.append(ToolUseBlock(id=block.id, name=block.name, input=args))
        return ModelResponse(
            content=content,
            stop_reason=state.stop_reason or "end_turn",
            usage=state.usage,
            model=state.model,
        )

    # -- errors ------------------------------------------------------------------------------

    def _classify(self, exc: BaseException) -> ProviderFailure | None:
        import anthropic
        import httpx2

        if isinstance(exc, anthropic.APIStatusError):
            status = exc.status_code
            message = exc.api_message or f"HTTP {status}"
            if exc.type:
                message = f"{exc.type}: {message}"
            if status < 400:  # an error event inside a successful stream
                kind = _STREAM_ERROR_KINDS.get(exc.type or "", "fatal")
                return ProviderFailure(kind, message, request_id=exc.request_id)
            retry_after = parse_retry_after(exc.response.headers)
            kind = _status_kind(status, message)
            return ProviderFailure(kind, message, status, retry_after, exc.request_id)
        if isinstance(exc, anthropic.CredentialsError):
            hint = "pass api_key= or set ANTHROPIC_API_KEY"
            return ProviderFailure("configuration", f"no usable credentials ({hint}): {exc}")
        if isinstance(exc, anthropic.APIConnectionError):
            timed_out = isinstance(exc, anthropic.APITimeoutError)
            return ProviderFailure(
                "unavailable", "request timed out" if timed_out else "connection error"
            )
        if isinstance(exc, httpx2.TimeoutException):
            return ProviderFailure("unavailable", "stream read timed out")
        if isinstance(exc, httpx2.TransportError):
            return ProviderFailure("unavailable", f"connection broken ({type(exc).__name__})")
        if isinstance(exc, anthropic.APIError):
            return ProviderFailure("fatal", f"unusable response ({type(exc).__name__})")
        return None


def _written_for_an_hour(usage: Any) -> int:
    """The part of a message's cache writes made with the 1-hour TTL (priced higher)."""
    creation = getattr(usage, "cache_creation", None)
    return int(getattr(creation, "ephemeral_1h_input_tokens", 0) or 0)


def _status_kind(status: int, message: str) -> FailureKind:
    if status == 429:
        return "rate_limited"
    if status >= 500:
        return "unavailable"
    if status == 400 and "prompt is too long" in message.lower():
        return "context_window"
    return "fatal"


def _wire_message(message: dict[str, Any]) -> dict[str, Any]:
    """A copy of an internal message without empty text blocks, which the API rejects."""
    content = message.get("content")
    if not isinstance(content, list):
        return {"role": message["role"], "content": content}
    blocks = [
        dict(b)
        for b in content
        if not (isinstance(b, dict) and b.get("type") == "text" and not b.get("text"))
    ]
    return {"role": message["role"], "content": blocks}


# -- prompt caching ----------------------------------------------------------------------

MAX_BREAKPOINTS = 4
"""The API refuses a request with more ``cache_control`` blocks."""

_FAMILY = re.compile(r"claude-(opus|sonnet|haiku)-(\d+)(?:-(\d{1,2}))?(?=-|$)")


def min_cacheable_tokens(model: str) -> int:
    """The shortest prefix the provider caches for ``model``: a breakpoint before it
    would only waste one of the four.

    From Anthropic's prompt caching page: Opus 4.5 and later and Haiku 4.5 4,096 tokens;
    Sonnet 4.6 2,048; Haiku 3 and 3.5 2,048; every other model (Sonnet 4 and 4.5, Opus 4
    and 4.1, ...) 1,024. An unknown model gets 1,024, the lowest: a breakpoint that is too
    early costs nothing but its slot.
    """
    if "haiku" in model and re.search(r"claude-3(-5)?-haiku", model):
        return 2048
    match = _FAMILY.search(model)
    if match is None:
        return 1024
    family, major, minor = match.group(1), int(match.group(2)), int(match.group(3) or 0)
    version = (major, minor)
    if family in ("opus", "haiku") and version >= (4, 5):
        return 4096
    if family == "sonnet" and version >= (4, 6):
        return 2048
    return 1024


def message_breakpoints(messages: list[dict[str, Any]]) -> list[int]:
    """The messages worth a breakpoint, least wanted first: the stable message before the
    previous user turn, the latest stable message, and the last message.

    A user turn is a person's message or a tool-result turn. The latest stable message is
    the one before the newest user turn: the conversation up to it is what the last step
    sent, so the write it made is read there. The last message (the newest user turn)
    is sent again on the next step too (the model's answer goes after it), so marking it
    writes the new turn once instead of billing it as uncached input now and writing it
    on the next step (in the cost phase's 20-step turn, a bill 15% lower). The stable
    message before the previous user turn, marked when a slot is left, is where an
    earlier step wrote; it still reads that write when a step in between added more than
    the 20 blocks the provider looks back over (many parallel tool calls).
    """
    users = [i for i, m in enumerate(messages) if m.get("role") == "user" and i > 0]
    wanted = [i - 1 for i in users[-2:]]
    if messages:
        wanted.append(len(messages) - 1)
    return [i for i in dict.fromkeys(wanted) if messages[i].get("content")]


def mark_breakpoints(
    params: dict[str, Any], request: ModelRequest, control: dict[str, str]
) -> None:
    """Put ``cache_control`` on the last tool, the system prompt and the messages of
    ``message_breakpoints`` (the most wanted ones while slots last: four in all), each
    only if the prefix it ends is at least ``min_cacheable_tokens`` long (estimated with
    ``llm.tokens``, which leans high)."""
    minimum = min_cacheable_tokens(str(params["model"]))
    tools, system, messages = request.tools, request.system, request.messages
    if tools and estimate_tokens([], None, tools) >= minimum:
        params["tools"][-1]["cache_control"] = control
    if system and estimate_tokens([], system, tools) >= minimum:
        params["system"] = [{"type": "text", "text": system, "cache_control": control}]
    wanted = message_breakpoints(messages)
    if not wanted:
        return
    total = request_tokens(request)
    marked = sum(1 for key in ("tools", "system") if _marked(params.get(key)))
    for index in wanted[-(MAX_BREAKPOINTS - marked) :]:
        if total - estimate_tokens(messages[index + 1 :]) < minimum:
            continue
        wire = params["messages"][index]
        content = wire["content"]
        if isinstance(content, str):
            wire["content"] = content = [{"type": "text", "text": content}]
        if content:
            content[-1] = {**content[-1], "cache_control": control}


def _marked(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and "cache_control" in value[-1]
