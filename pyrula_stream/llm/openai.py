"""``OpenAILLM``: Chat Completions through the official ``openai`` SDK.

Internal messages are Anthropic-shaped; this module converts them to Chat Completions
(``tool_use`` blocks become ``tool_calls``, ``tool_result`` blocks become ``role: tool``
messages) and folds the streamed chunks back into one ``ModelResponse``. ``base_url``
can point at any OpenAI-compatible server.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyrula_stream.errors import ConfigurationError, ProviderStreamTruncated
from pyrula_stream.llm._adapter import SDKAdapter, broken_read
from pyrula_stream.llm._chat_stream import CompletionState, completion_response
from pyrula_stream.llm._openai_convert import (
    to_openai_messages,
    to_openai_response_format,
    to_openai_tool_choice,
    to_openai_tools,
)
from pyrula_stream.llm._retry import FailureKind, ProviderFailure, parse_retry_after
from pyrula_stream.llm.base import ModelRequest, ModelResponse, StreamItem, TextDelta

if TYPE_CHECKING:
    from openai import AsyncOpenAI


# Error objects sent inside a 200 stream have no status; their type or code says what.
_STREAM_ERROR_KINDS: dict[str, FailureKind] = {
    "server_error": "unavailable",
    "rate_limit_exceeded": "rate_limited",
    "requests": "rate_limited",
    "tokens": "rate_limited",
}


def _import_sdk() -> None:
    try:
        import openai  # noqa: F401
    except ImportError:
        raise ConfigurationError(
            "OpenAILLM needs the openai SDK: pip install 'pyrula-stream[openai]'"
        ) from None


@dataclass(eq=False, repr=False, kw_only=True)
class OpenAILLM(SDKAdapter):
    """OpenAI Chat Completions adapter (also for OpenAI-compatible servers via ``base_url``).

    Beside the settings every adapter takes (see ``SDKAdapter``) it takes the sampling
    keywords ``top_p``, ``seed`` and ``parallel_tool_calls``, sent only when set.
    ``max_tokens`` is sent as ``max_completion_tokens``. ``llm_call_timeout`` is the
    per-request timeout in seconds.
    ``structured_output=False`` keeps an ``output_type``'s schema out of
    ``response_format`` (for models or compatible servers without ``json_schema``).
    The API key is never part of ``repr``, ``describe`` or any raised message.
    """

    provider = "openai"
    api_key_env = "OPENAI_API_KEY"

    top_p: float | None = None
    seed: int | None = None
    parallel_tool_calls: bool | None = None

    def __post_init__(self, api_key: str | None) -> None:
        _import_sdk()
        super().__post_init__(api_key)
        self._client: AsyncOpenAI | None = None

    def _sdk_client(self) -> AsyncOpenAI:
        """The SDK client, made on first use so it belongs to the loop that uses it."""
        if self._client is None:
            import openai

            try:
                # max_retries=0: the SDK must not retry behind our back (see _retry).
                self._client = openai.AsyncOpenAI(
                    api_key=self._api_key, base_url=self.base_url, max_retries=0
                )
            except openai.OpenAIError:
                raise ConfigurationError(
                    "OpenAILLM has no API key: pass api_key= or set OPENAI_API_KEY"
                ) from None
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    def build_request(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments for ``chat.completions.create`` (without ``timeout``)."""
        params: dict[str, Any] = {
            "model": self.model,
            "messages": to_openai_messages(request.messages, request.system),
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_completion_tokens": self.max_tokens,
        }
        optional = {"temperature": self.temperature, "top_p": self.top_p, "seed": self.seed}
        params.update({k: v for k, v in optional.items() if v is not None})
        tool_choice = request.tool_choice
        if request.tools:
            params["tools"] = to_openai_tools(request.tools)
            parallel = self.parallel_tool_calls
            if tool_choice and tool_choice.get("disable_parallel_tool_use"):
                parallel = False
            if parallel is not None:  # the API refuses parallel_tool_calls without tools
                params["parallel_tool_calls"] = parallel
            if tool_choice:
                params["tool_choice"] = to_openai_tool_choice(tool_choice)
        if request.output_format is not None:
            params["response_format"] = to_openai_response_format(request.output_format)
        return params

    def batch_body(self, request: ModelRequest) -> dict[str, Any]:
        """The body of the same call inside a batch: ``build_request`` without streaming,
        which a batched call cannot do."""
        body = self.build_request(request)
        del body["stream"], body["stream_options"]
        return body

    def response_of_completion(self, completion: Any, request: ModelRequest) -> ModelResponse:
        """The ``ModelResponse`` of a whole ``chat.completion`` (a batch's result), built
        as a streamed call's is."""
        state = CompletionState(self.model)
        state.apply_completion(completion)
        self._check_buffer(state.size)
        return completion_response(self, state, request)

    async def _attempt(self, request: ModelRequest) -> AsyncGenerator[StreamItem, None]:
        params = self.build_request(request)
        extra: dict[str, Any] = {}
        if self.llm_call_timeout is not None:
            extra["timeout"] = self.llm_call_timeout
        stream = await self._sdk_client().chat.completions.create(**params, **extra)
        state = CompletionState(self.model)
        async with stream:
            try:
                async for chunk in stream:
                    text = state.apply(chunk)
                    self._check_buffer(state.size)
                    if text:
                        yield TextDelta(text)
            except Exception as exc:  # a body read that failed: see broken_read
                if (broken := broken_read(exc)) is None:
                    raise
                raise broken from None
        if state.finish_reason is None:
            raise ProviderStreamTruncated("openai stream ended without a finish_reason")
        yield completion_response(self, state, request)

    def _classify(self, exc: BaseException) -> ProviderFailure | None:
        import httpx2
        import openai

        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            message = _error_message(exc, f"HTTP {status}")
            retry_after = parse_retry_after(exc.response.headers)
            kind: FailureKind = "fatal"
            if status == 429:
                # An exhausted quota needs a person (billing), not another try.
                kind = "fatal" if exc.code == "insufficient_quota" else "rate_limited"
            elif status >= 500:
                kind = "unavailable"
            elif status == 400 and exc.code == "context_length_exceeded":
                kind = "context_window"
            return ProviderFailure(kind, message, status, retry_after, exc.request_id)
        if isinstance(exc, openai.APIConnectionError):
            timed_out = isinstance(exc, openai.APITimeoutError)
            return ProviderFailure(
                "unavailable", "request timed out" if timed_out else "connection error"
            )
        if isinstance(exc, httpx2.TimeoutException):
            return ProviderFailure("unavailable", "stream read timed out")
        if isinstance(exc, httpx2.TransportError):
            return ProviderFailure("unavailable", f"connection broken ({type(exc).__name__})")
        if isinstance(exc, openai.APIError):  # an error object inside a successful stream
            kind = _STREAM_ERROR_KINDS.get(
                exc.code or "", _STREAM_ERROR_KINDS.get(exc.type or "", "fatal")
            )
            return ProviderFailure(kind, _error_message(exc, "error in stream"))
        return None


def _error_message(exc: Any, fallback: str) -> str:
    body = exc.body
    message = body.get("message") if isinstance(body, dict) else None
    label = exc.code or exc.type
    text = str(message) if message else fallback
    return f"{label}: {text}" if label else text
