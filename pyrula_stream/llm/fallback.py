"""``FallbackLLM``: when one model's provider is down, the same call goes to the next.

Each client keeps its own retries; only once they are spent with one of the ``on`` codes
does the call move on. It moves on only while nothing of the answer was shown: once a
model has streamed text, a failure is that model's (a second model's answer would follow
the first one's half sentence in the ``llm:delta`` events). The response says which model
answered (``model``, and ``provider``, which only a fallback sets), so the journal
records it: a replay takes the recorded answer and asks no provider, and the cost, the
metrics and ``llm:complete`` name the model that answered.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

from pyrula_stream.errors import ConfigurationError, ErrorCode, PyrulaError
from pyrula_stream.llm.base import (
    OPTIONAL_FIELDS,
    LLMClient,
    ModelRequest,
    ModelResponse,
    RequestClient,
    StreamItem,
)

log = logging.getLogger(__name__)

DEFAULT_ON = (ErrorCode.LLM_PROVIDER_UNAVAILABLE.value, ErrorCode.LLM_RATE_LIMITED.value)


class FallbackLLM(RequestClient):
    """``FallbackLLM([primary, secondary, ...], on=("llm_provider_unavailable",
    "llm_rate_limited"))``: the first client that answers answers."""

    def __init__(self, clients: Sequence[LLMClient], *, on: Sequence[str] = DEFAULT_ON) -> None:
        if not clients:
            raise ConfigurationError("FallbackLLM needs at least one model client")
        known = {code.value for code in ErrorCode}
        unknown = sorted(set(on) - known)
        if unknown:
            raise ConfigurationError(f"FallbackLLM(on=...) names unknown error codes {unknown}")
        self.clients = list(clients)
        self.on = frozenset(on)
        primary = self.clients[0]
        self.model = primary.model
        self.provider = primary.provider
        self.max_retries = primary.max_retries

    def describe(self) -> str:
        return "FallbackLLM(" + ", ".join(c.describe() for c in self.clients) + ")"

    def __repr__(self) -> str:
        return self.describe()

    async def stream_request(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        """The stream of the first client that answers (``tool_choice`` and
        ``output_format`` reach each client that takes them)."""
        for index, client in enumerate(self.clients):
            shown = False
            try:
                async for item in client.stream_request(_taken_by(client, request)):
                    if isinstance(item, ModelResponse):
                        yield item.model_copy(
                            update={
                                "model": item.model or client.model,
                                "provider": client.provider or type(client).__name__,
                            }
                        )
                    else:
                        shown = True
                        yield item
                return
            except PyrulaError as exc:
                code = exc.code.value if exc.code is not None else ""
                last = index == len(self.clients) - 1
                if shown or last or code not in self.on:
                    raise
                log.warning(
                    "%s failed (%s: %s); falling back to %s",
                    client.describe(),
                    code,
                    exc,
                    self.clients[index + 1].describe(),
                )

    def accepts_keyword(self, name: str) -> bool:
        return name in OPTIONAL_FIELDS and any(c.accepts_keyword(name) for c in self.clients)


def _taken_by(client: LLMClient, request: ModelRequest) -> ModelRequest:
    """``request`` without the optional fields ``client``'s ``stream`` does not take."""
    left_out: dict[str, Any] = {
        name: None
        for name in OPTIONAL_FIELDS
        if getattr(request, name) is not None and not client.accepts_keyword(name)
    }
    return dataclasses.replace(request, **left_out) if left_out else request
