"""A dated price table, so ``max_cost_usd`` can turn billed usage into dollars.

Prices change; the table says when it was read (``PRICES_AS_OF``) and callers can pass
their own mapping (``AgentLimits.prices``) which is consulted first. A model in neither
is "unpriced" (``price_of`` returns ``None``) and the caller decides what that means.

Anthropic cache writes are priced at the 5-minute rate; a 1-hour cache (``cache_ttl="1h"``)
costs more per written token, so pass your own price for such models if it matters.
OpenAI does not bill cache writes separately, so its ``cache_write`` equals ``input``.
A call through a provider's batch API costs ``batch_price`` (``batch_cost_usd``): the
table's live prices times the provider's ``BATCH_PRICE_FACTOR``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from pyrula_stream.llm.base import Usage

PRICES_AS_OF = "2026-11-01"
"""When ``DEFAULT_PRICES`` was last checked against the providers' pricing pages."""

_PER_MILLION = 1_000_000.0


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """USD per million tokens of each kind the providers bill."""

    input: float
    output: float
    cache_write: float
    cache_read: float


FREE = ModelPrice(0.0, 0.0, 0.0, 0.0)


def _anthropic(input_: float, output: float) -> ModelPrice:
    """Anthropic's published ratios: 5-minute cache writes 1.25x input, reads 0.1x."""
    return ModelPrice(input_, output, cache_write=input_ * 1.25, cache_read=input_ * 0.1)


def _openai(input_: float, cached: float, output: float) -> ModelPrice:
    return ModelPrice(input_, output, cache_write=input_, cache_read=cached)


DEFAULT_PRICES: dict[str, ModelPrice] = {
    # Anthropic (claude.com/pricing)
    "claude-opus-5": _anthropic(5.0, 25.0),
    "claude-opus-4-8": _anthropic(5.0, 25.0),
    "claude-opus-4-7": _anthropic(5.0, 25.0),
    "claude-opus-4-6": _anthropic(5.0, 25.0),
    "claude-opus-4-5": _anthropic(5.0, 25.0),
    "claude-opus-4-1": _anthropic(15.0, 75.0),
    "claude-sonnet-4-6": _anthropic(3.0, 15.0),
    "claude-sonnet-4-5": _anthropic(3.0, 15.0),
    "claude-sonnet-4": _anthropic(3.0, 15.0),
    "claude-haiku-4-5": _anthropic(1.0, 5.0),
    # OpenAI (openai.com/api/pricing)
    "gpt-5.5": _openai(5.0, 0.5, 30.0),
    "gpt-5.4": _openai(2.5, 0.25, 15.0),
    "gpt-5.4-mini": _openai(0.75, 0.075, 4.5),
    "gpt-5.4-nano": _openai(0.2, 0.02, 1.25),
    "gpt-5": _openai(1.25, 0.125, 10.0),
    "gpt-5-mini": _openai(0.25, 0.025, 2.0),
    "gpt-4.1": _openai(2.0, 0.5, 8.0),
    "gpt-4.1-mini": _openai(0.4, 0.1, 1.6),
    "gpt-4o": _openai(2.5, 1.25, 10.0),
    "gpt-4o-mini": _openai(0.15, 0.075, 0.6),
    # FakeLLM at its default model costs nothing.
    "fake": FREE,
}

# A trailing snapshot date: "-20250514" (Anthropic) or "-2025-04-14" (OpenAI).
_DATE_SUFFIX = re.compile(r"-(?:\d{8}|\d{4}-\d{2}-\d{2})$")


def canonical_model_id(model: str) -> str:
    """``model`` without a trailing snapshot date, the id a price table is keyed by."""
    return _DATE_SUFFIX.sub("", model)


def price_of(model: str, prices: Mapping[str, ModelPrice] | None = None) -> ModelPrice | None:
    """The price of ``model``: the exact id first, then its canonical id; ``None`` if unpriced.

    A routed id (``openai/gpt-4o-mini``, as litellm names models) is looked up as given
    first, so a table can price a route on its own, then as the bare model after the last
    ``/``: the provider bills the model, not the route. ``prices`` defaults to
    ``DEFAULT_PRICES``.
    """
    table = DEFAULT_PRICES if prices is None else prices
    for candidate in dict.fromkeys((model, model.rsplit("/", 1)[-1])):
        if candidate in table:
            return table[candidate]
        price = table.get(canonical_model_id(candidate))
        if price is not None:
            return price
    return None


def cost_usd(usage: Usage, price: ModelPrice) -> float:
    """What ``usage`` cost at ``price``.

    ``usage.input_tokens`` excludes cache reads and writes (Anthropic's convention, which
    the OpenAI adapter follows), so each kind is priced exactly once.
    """
    return (
        usage.input_tokens * price.input
        + usage.output_tokens * price.output
        + usage.cache_creation_input_tokens * price.cache_write
        + usage.cache_read_input_tokens * price.cache_read
    ) / _PER_MILLION


BATCH_PRICE_FACTOR: dict[str, float] = {"openai": 0.5, "anthropic": 0.5}
"""What a provider's batch API charges per token, as a fraction of its live price: half,
on every kind of token (input, output, cache writes and reads), for both providers."""


def batch_price(price: ModelPrice, provider: str) -> ModelPrice:
    """``price`` as the provider's batch API bills it; unchanged for a provider without a
    known batch discount."""
    factor = BATCH_PRICE_FACTOR.get(provider, 1.0)
    return ModelPrice(
        price.input * factor,
        price.output * factor,
        price.cache_write * factor,
        price.cache_read * factor,
    )


def batch_cost_usd(usage: Usage, price: ModelPrice, provider: str) -> float:
    """What ``usage`` cost when the call went through ``provider``'s batch API."""
    return cost_usd(usage, batch_price(price, provider))
