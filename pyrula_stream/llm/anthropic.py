"""``AnthropicLLM``: the Messages API through the official ``anthropic`` SDK.

Our internal messages are already Anthropic-shaped, so the request side is mostly prompt
caching; the response side rebuilds a ``ModelResponse`` from the raw stream events and
insists on ``message_stop``, because a proxy closing the connection cleanly looks like a
normal end to the SDK.
"""

from __future__ import annotations

import json
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
    ``prompt_caching`` marks the system prompt and the tool definitions as cache
    breakpoints (``cache_ttl`` "5m" or "1h"). ``llm_call_timeout`` is the per-request
    timeout in seconds. ``backoff_base_s`` and ``max_retry_wait_s`` tune our retries.
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
            if self.prompt_caching:
                block = {"type": "text", "text": system, "cache_control": self._cache_control()}
                params["system"] = [block]
            else:
                params["system"] = system
        if tools:
            wire_tools: list[dict[str, Any]] = [
                {"name": t.name, "description": t.description, "input_schema": t.input_schema}
                for t in tools
            ]
            if self.prompt_caching:
                # One breakpoint after the last tool caches every definition before it.
                wire_tools[-1]["cache_control"] = self._cache_control()
            params["tools"] = wire_tools
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
