"""``LiteLLM``: any provider litellm routes to, through the official ``litellm`` package.

litellm speaks Chat Completions on both sides whatever the provider behind it, so requests
are converted as for ``OpenAILLM`` and the streamed chunks fold the same way
(``_chat_stream``). litellm's own retries are off (``num_retries=0``, ``max_retries=0``)
for the reason ``_retry`` gives; its exceptions subclass the ``openai`` SDK's and carry
an HTTP status, which is what they are classified by.

litellm reads a cost map from the internet when it is imported unless
``LITELLM_LOCAL_MODEL_COST_MAP=True`` is set; the cost of a call here comes from
``pricing`` either way, never from litellm's map.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any

from pyrula_stream.errors import ConfigurationError, ProviderStreamTruncated
from pyrula_stream.llm._adapter import SDKAdapter
from pyrula_stream.llm._chat_stream import CompletionState, completion_response
from pyrula_stream.llm._openai_convert import (
    to_openai_messages,
    to_openai_response_format,
    to_openai_tool_choice,
    to_openai_tools,
)
from pyrula_stream.llm._retry import FailureKind, ProviderFailure, parse_retry_after
from pyrula_stream.llm.base import ModelRequest, StreamItem, TextDelta

# Keywords the adapter sets itself, each from a setting of its own (or never to be changed:
# a retry inside litellm would restart a stream behind the retry loop's back).
_OWN_KEYWORDS = frozenset(
    {
        "model", "messages", "stream", "stream_options", "api_base", "base_url", "api_key",
        "num_retries", "max_retries", "tools", "tool_choice", "parallel_tool_calls",
        "response_format", "max_tokens", "max_completion_tokens", "temperature", "timeout",
    }
)  # fmt: skip
# ``extra`` values under names like these are credentials (aws_secret_access_key,
# vertex_credentials, azure_ad_token): redacted wherever a provider's words are shown.
_SECRET_NAMES = re.compile(r"(?i)key|secret|token|password|credential")
_CONTEXT_WINDOW = re.compile(r"(?i)context_length_exceeded|maximum context length|context window")


def _sdk() -> Any:
    try:
        import litellm
    except ImportError:
        raise ConfigurationError(
            "LiteLLM needs the litellm package: pip install 'pyrula-stream[litellm]'"
        ) from None
    # litellm prints a help banner to stdout on every error it maps; in a worker that is a
    # line of noise per retried 429. The error itself is raised and reported as usual.
    litellm.suppress_debug_info = True
    return litellm


@dataclass(eq=False, repr=False, kw_only=True)
class LiteLLM(SDKAdapter):
    """LiteLLM adapter: routes to any provider litellm supports.

    ``model`` is in litellm's ``provider/model`` form (``openai/gpt-4o-mini``,
    ``anthropic/claude-sonnet-4-6``, ``ollama/llama3.1``); ``max_cost_usd`` prices it as
    the bare model after the last ``/`` unless ``AgentLimits(prices=...)`` names the
    route itself. ``api_base`` and ``api_key`` are forwarded on every call (``base_url``
    is taken as another name for ``api_base``); ``extra`` carries any other
    ``litellm.acompletion`` keyword (``custom_llm_provider``, ``top_p``,
    ``aws_region_name``...), except those the adapter sets from its own settings (see
    ``SDKAdapter``). Without ``api_key``, litellm reads the provider's usual environment
    variable. Credentials in ``api_key`` or in ``extra`` never appear in ``repr``,
    ``describe`` or any raised message.
    """

    provider = "litellm"

    api_base: str | None = None
    extra: dict[str, Any] | None = None

    def __post_init__(self, api_key: str | None) -> None:
        litellm = _sdk()
        super().__post_init__(api_key)
        if self.api_base is None:
            self.api_base = self.base_url
        elif self.base_url not in (None, self.api_base):
            raise ConfigurationError("LiteLLM takes api_base or base_url, not two different URLs")
        self.base_url = self.api_base
        self.extra = dict(self.extra or {})
        own = sorted(_OWN_KEYWORDS.intersection(self.extra))
        if own:
            raise ConfigurationError(
                f"LiteLLM(extra=...) cannot set {own}: each is set from the adapter's own "
                "settings (model, api_base, api_key, max_tokens, temperature, "
                "llm_call_timeout, tools) or must stay off (litellm's retries)"
            )
        try:  # a model litellm cannot route is a mistake to refuse now, not on the first turn
            litellm.get_llm_provider(
                self.model,
                custom_llm_provider=self.extra.get("custom_llm_provider"),
                api_base=self.api_base,
            )
        except litellm.exceptions.BadRequestError as exc:
            first_line = self.redact(_message(exc)).splitlines()[0]
            raise ConfigurationError(
                f"LiteLLM cannot route model '{self.model}' (litellm's names are "
                f"'provider/model'): {first_line}"
            ) from None

    def _secrets(self) -> list[str | None]:
        extra = self.extra or {}
        hidden = [v for k, v in extra.items() if isinstance(v, str) and _SECRET_NAMES.search(k)]
        return [*super()._secrets(), *hidden]

    def build_request(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments for ``litellm.acompletion`` (without the key)."""
        params: dict[str, Any] = {
            **(self.extra or {}),
            "model": self.model,
            "messages": to_openai_messages(request.messages, request.system),
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": self.max_tokens,
            "num_retries": 0,
            "max_retries": 0,
        }
        if self.api_base is not None:
            params["api_base"] = self.api_base
        if self.temperature is not None:
            params["temperature"] = self.temperature
        if self.llm_call_timeout is not None:
            params["timeout"] = self.llm_call_timeout
        tool_choice = request.tool_choice
        if request.tools:
            params["tools"] = to_openai_tools(request.tools)
            if tool_choice:
                params["tool_choice"] = to_openai_tool_choice(tool_choice)
                if tool_choice.get("disable_parallel_tool_use"):
                    params["parallel_tool_calls"] = False
        if request.output_format is not None:
            params["response_format"] = to_openai_response_format(request.output_format)
        return params

    async def _attempt(self, request: ModelRequest) -> AsyncGenerator[StreamItem, None]:
        params = self.build_request(request)
        if self._api_key is not None:
            params["api_key"] = self._api_key
        stream = await _sdk().acompletion(**params)
        state = CompletionState(self.model)
        try:
            async for chunk in stream:
                text = state.apply(chunk)
                self._check_buffer(state.size)
                if text:
                    yield TextDelta(text)
        finally:
            close = getattr(stream, "aclose", None)
            if close is not None:  # a caller that stops early releases the connection now
                await close()
        if state.finish_reason is None:
            raise ProviderStreamTruncated("litellm stream ended without a finish_reason")
        yield completion_response(self, state, request)

    def _classify(self, exc: BaseException) -> ProviderFailure | None:
        import openai

        litellm = _sdk()
        if _client_side(exc):
            # No request was sent: a missing key is the caller's to fix, whatever HTTP
            # status litellm dresses it in (a 500).
            return ProviderFailure("configuration", _message(exc))
        if isinstance(exc, litellm.exceptions.MidStreamFallbackError):
            # A stream that broke after it started; litellm says which way in the message.
            original = exc.original_exception or exc
            message = _message(original)
            if "finish_reason" in message:
                return ProviderFailure("truncated", message)
            return ProviderFailure("unavailable", message)
        if isinstance(exc, litellm.exceptions.ContextWindowExceededError):
            return ProviderFailure("context_window", _message(exc), 400, None, _request_id(exc))
        if isinstance(exc, openai.APIConnectionError):  # litellm's Timeout is one too
            timed_out = isinstance(exc, openai.APITimeoutError)
            return ProviderFailure("unavailable", _message(exc) if not timed_out else "timed out")
        if isinstance(exc, openai.APIError):
            status = getattr(exc, "status_code", None)
            message = _message(exc)
            headers = _headers(exc)
            kind: FailureKind = "fatal"
            if status == 429:
                # An exhausted quota needs a person (billing), not another try.
                kind = "fatal" if "insufficient_quota" in message else "rate_limited"
            elif isinstance(status, int) and (status >= 500 or status == 408):
                kind = "unavailable"
            elif status == 400 and _CONTEXT_WINDOW.search(message):
                kind = "context_window"
            return ProviderFailure(
                kind,
                message,
                status if isinstance(status, int) else None,
                parse_retry_after(headers),
                headers.get("x-request-id"),
            )
        return None


def _client_side(exc: BaseException) -> bool:
    """Whether litellm wrapped a plain ``openai.OpenAIError``: the SDK's refusal to build
    a request (no API key), as opposed to its ``APIError`` for a request that was sent."""
    import openai

    seen: set[int] = set()
    inner: BaseException | None = exc.__cause__ or exc.__context__
    while inner is not None and id(inner) not in seen:
        seen.add(id(inner))
        if isinstance(inner, openai.OpenAIError) and not isinstance(inner, openai.APIError):
            return True
        inner = inner.__cause__ or inner.__context__
    return False


def _message(exc: BaseException) -> str:
    return str(getattr(exc, "message", None) or exc) or type(exc).__name__


def _headers(exc: BaseException) -> Mapping[str, str]:
    headers = getattr(exc, "litellm_response_headers", None)
    if headers is None:
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None)
    return headers if isinstance(headers, Mapping) else {}


def _request_id(exc: BaseException) -> str | None:
    return _headers(exc).get("x-request-id")
