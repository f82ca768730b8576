"""What the SDK-backed adapters share: settings, retries, rate limit, buffer cap, secrets.

Each provider module only converts requests and responses and classifies its SDK's
exceptions; everything that must behave the same across providers lives here.
"""

from __future__ import annotations

import os
from abc import abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import InitVar, dataclass, field
from typing import Any, ClassVar

from pyrula_stream.errors import ConfigurationError, ErrorCode, LLMError, MalformedRecordError
from pyrula_stream.llm._retry import ProviderFailure, ProviderRetryPolicy, stream_with_retries
from pyrula_stream.llm.base import (
    DEFAULT_MAX_RETRIES,
    LLMRate,
    ModelRequest,
    RequestClient,
    StreamingMode,
    StreamItem,
)
from pyrula_stream.llm.ratelimit import RateLimiter
from pyrula_stream.llm.tokens import request_tokens
from pyrula_stream.redaction import redact, safe_url
from pyrula_stream.wire import guard


@dataclass(eq=False, repr=False, kw_only=True)
class SDKAdapter(RequestClient):
    """Base for adapters built on an official provider SDK.

    The settings every provider takes are declared once, here, as dataclass fields: a
    provider class adds its own fields and the generated constructor keeps one keyword
    signature, ``Provider(model, *, streaming_mode=..., ..., <provider keywords>)``.
    ``api_key`` is an init-only value: it is kept privately and never shown.
    """

    provider = ""
    api_key_env: ClassVar[str] = ""
    """The environment variable the SDK reads the key from when none is passed."""

    model: str = field(kw_only=False)
    streaming_mode: StreamingMode = StreamingMode.SAFE
    max_buffer_bytes: int = 5 * 1024 * 1024
    max_retries: int = DEFAULT_MAX_RETRIES
    api_key: InitVar[str | None] = None
    base_url: str | None = None
    max_tokens: int = 8192
    temperature: float | None = None
    llm_call_timeout: float | None = None
    rate_limit: LLMRate | None = None
    backoff_base_s: float = 0.5
    max_retry_wait_s: float = 60.0
    structured_output: bool = True

    def __post_init__(self, api_key: str | None) -> None:
        if not self.model:
            raise ConfigurationError(f"{type(self).__name__} needs a model id")
        if self.max_retries < 0 or self.max_tokens <= 0 or self.max_buffer_bytes <= 0:
            raise ConfigurationError(
                "max_retries must be >= 0, max_tokens and max_buffer_bytes > 0"
            )
        if self.llm_call_timeout is not None and self.llm_call_timeout <= 0:
            raise ConfigurationError("llm_call_timeout must be positive")
        self.streaming_mode = StreamingMode(self.streaming_mode)
        self.retry_policy = ProviderRetryPolicy(
            max_retries=self.max_retries,
            backoff_base_s=self.backoff_base_s,
            max_retry_after_s=self.max_retry_wait_s,
        )
        self._api_key = api_key
        self._limiter = RateLimiter(self.rate_limit) if self.rate_limit is not None else None

    def accepts_keyword(self, name: str) -> bool:
        """``output_format`` only with ``structured_output`` on: a model without the
        provider's structured output would refuse the request, so it gets the schema in
        the prompt instead."""
        if name == "output_format" and not self.structured_output:
            return False
        return super().accepts_keyword(name)

    # -- secrets -------------------------------------------------------------------------

    def _secrets(self) -> list[str | None]:
        return [self._api_key, os.environ.get(self.api_key_env) if self.api_key_env else None]

    def redact(self, text: str) -> str:
        """``text`` with this adapter's key (and anything shaped like a key) removed."""
        return redact(text, self._secrets())

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(model={self.model!r}, base_url={safe_url(self.base_url)!r}, "
            f"max_retries={self.max_retries}, max_tokens={self.max_tokens})"
        )

    # -- the call --------------------------------------------------------------------------

    async def stream_request(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        """Yield text deltas, then one ``ModelResponse``; retried only before the first delta.

        The request's ``output_format`` asks the provider for a final answer matching its
        JSON Schema (the model may still call tools first).

        Raises ``LLMRateLimited`` (429s exhausted), ``LLMProviderUnavailable`` (5xx or
        connection errors exhausted), ``ProviderStreamTruncated`` (stream ended without its
        terminal event), ``ContextWindowExceeded`` (prompt too long) or ``LLMError``.
        """
        estimated = request_tokens(request) if self._limiter else 0

        def attempt() -> AsyncGenerator[StreamItem, None]:
            return self._attempt(request)

        items = stream_with_retries(
            attempt,
            classify=self._classify_safely,
            policy=self.retry_policy,
            provider=self.provider,
            limiter=self._limiter,
            estimated_tokens=estimated,
        )
        async with aclosing(items):  # a caller that stops early releases the connection now
            async for item in items:
                yield item

    def _classify_safely(self, exc: BaseException) -> ProviderFailure | None:
        failure = self._classify(exc)
        if failure is None:
            return None
        return ProviderFailure(
            failure.kind,
            self.redact(failure.message),
            failure.status,
            failure.retry_after_s,
            failure.request_id,
        )

    @abstractmethod
    def _attempt(self, request: ModelRequest) -> AsyncGenerator[StreamItem, None]:
        """One request: deltas then the response; raises SDK errors as they come."""

    @abstractmethod
    def _classify(self, exc: BaseException) -> ProviderFailure | None:
        """Map an SDK exception to a failure kind, or ``None`` for exceptions not ours."""

    async def aclose(self) -> None:
        """Close the SDK client's connection pool (idempotent)."""

    # -- helpers for subclasses ---------------------------------------------------------

    def _check_buffer(self, size: int) -> None:
        """Refuse a reply larger than ``max_buffer_bytes`` instead of holding it in memory."""
        if size > self.max_buffer_bytes:
            raise LLMError(
                f"{self.provider} reply exceeded max_buffer_bytes={self.max_buffer_bytes}",
                code=ErrorCode.BUFFER_OVERFLOW,
            )

    def _parse_tool_input(self, name: str, raw: str, *, cut_short: bool) -> dict[str, Any] | None:
        """Tool arguments from streamed JSON; ``None`` if the reply was cut by max_tokens."""
        try:
            parsed = guard.loads(raw, f"arguments for tool '{name}'") if raw.strip() else {}
        except MalformedRecordError as exc:
            if cut_short:
                return None
            raise LLMError(
                f"{self.provider} sent invalid JSON arguments for tool '{name}': {exc}"
            ) from None
        if not isinstance(parsed, dict):
            raise LLMError(f"{self.provider} sent non-object arguments for tool '{name}'")
        return parsed


def broken_read(exc: BaseException) -> BaseException | None:
    """The transport error under an SDK's connection error raised by a response body's read.

    The SDKs (anthropic 2.17, openai 3.60) wrap a stream that breaks once it has begun in
    the same ``APIConnectionError`` as a request that never reached the server; raised as
    the transport error it is, it is classified as what happened: "connection broken" or
    "stream read timed out", after some of the answer may have been seen (so not retried).
    """
    import httpx2

    cause = exc.__cause__
    if isinstance(cause, httpx2.TransportError) and not isinstance(exc, httpx2.TransportError):
        return cause
    return None
