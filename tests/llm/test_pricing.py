"""The dated price table, model id lookup, cost arithmetic and the token estimate."""

from __future__ import annotations

import datetime

import pytest

from pyrula_stream.llm import ToolDefinition, Usage
from pyrula_stream.llm.pricing import (
    DEFAULT_PRICES,
    FREE,
    PRICES_AS_OF,
    ModelPrice,
    batch_cost_usd,
    batch_price,
    canonical_model_id,
    cost_usd,
    price_of,
)
from pyrula_stream.llm.tokens import estimate_tokens, text_tokens


def test_table_is_dated_and_fake_is_free() -> None:
    assert datetime.date.fromisoformat(PRICES_AS_OF)
    assert price_of("fake") == ModelPrice(0.0, 0.0, 0.0, 0.0)
    for model, price in DEFAULT_PRICES.items():
        assert min(price.input, price.output, price.cache_write, price.cache_read) >= 0, model


def test_has_current_models_of_both_providers() -> None:
    assert any(m.startswith("claude-") for m in DEFAULT_PRICES)
    assert any(m.startswith("gpt-") for m in DEFAULT_PRICES)


@pytest.mark.parametrize(
    ("model", "canonical"),
    [
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
        ("claude-haiku-4-5-20251001", "claude-haiku-4-5"),
        ("gpt-4o-2024-08-06", "gpt-4o"),
        ("gpt-5.4-mini", "gpt-5.4-mini"),
        ("claude-opus-4-7", "claude-opus-4-7"),
    ],
)
def test_dated_snapshots_fall_back_to_their_canonical_id(model: str, canonical: str) -> None:
    assert canonical_model_id(model) == canonical
    assert price_of(model) is DEFAULT_PRICES[canonical]


def test_exact_id_wins_over_canonical_and_custom_tables_are_used_alone() -> None:
    pinned = ModelPrice(1.0, 2.0, 3.0, 4.0)
    custom = {"claude-sonnet-4-5-20250929": pinned, "claude-sonnet-4-5": ModelPrice(9, 9, 9, 9)}
    assert price_of("claude-sonnet-4-5-20250929", custom) is pinned
    assert price_of("my-deployment", custom) is None
    assert price_of("gpt-4o", {}) is None  # an explicit table does not fall back to defaults
    assert price_of("no-such-model") is None


def test_a_routed_id_is_priced_as_its_bare_model_unless_the_route_is_priced() -> None:
    assert price_of("openai/gpt-4o-mini") is DEFAULT_PRICES["gpt-4o-mini"]
    assert price_of("openrouter/openai/gpt-4o-2024-08-06") is DEFAULT_PRICES["gpt-4o"]
    routed = ModelPrice(1.0, 1.0, 1.0, 1.0)
    assert price_of("azure/gpt-4o", {"azure/gpt-4o": routed, "gpt-4o": FREE}) is routed
    assert price_of("openai/no-such-model") is None


def test_cost_prices_each_kind_of_token_once() -> None:
    price = ModelPrice(input=3.0, output=15.0, cache_write=3.75, cache_read=0.3)
    usage = Usage(
        input_tokens=1_000_000,
        output_tokens=200_000,
        cache_creation_input_tokens=400_000,
        cache_read_input_tokens=2_000_000,
    )
    assert cost_usd(usage, price) == pytest.approx(3.0 + 3.0 + 1.5 + 0.6)
    assert cost_usd(Usage(), price) == 0.0


def test_anthropic_cache_prices_follow_the_published_ratios() -> None:
    sonnet = DEFAULT_PRICES["claude-sonnet-4-6"]
    assert (sonnet.input, sonnet.output) == (3.0, 15.0)
    assert sonnet.cache_write == pytest.approx(3.75) and sonnet.cache_read == pytest.approx(0.3)


# -- token estimate ------------------------------------------------------------------------


def test_estimate_grows_with_every_part_of_the_request() -> None:
    base = [{"role": "user", "content": "hello there"}]
    tool = ToolDefinition("lookup", "Find an order.", {"type": "object"})
    bare = estimate_tokens(base)
    assert estimate_tokens(base, system="You are terse.") > bare
    assert estimate_tokens(base, tools=[tool]) > bare
    assert estimate_tokens([*base, {"role": "assistant", "content": "hi"}]) > bare


def test_estimate_is_conservative() -> None:
    text = "The quick brown fox jumps over the lazy dog. " * 50
    # Real tokenizers give roughly one token per word here (~450); we must not go below.
    assert estimate_tokens([{"role": "user", "content": text}]) >= len(text.split())
    assert text_tokens("日本語のテキスト") == 8  # one per non-ASCII character
    assert text_tokens("abcd" * 10) == 10


def test_estimate_accepts_blocks_and_dict_tools() -> None:
    messages = [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "x", "input": {"q": "y"}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "z" * 400}],
        },
    ]
    as_dict = {"name": "x", "description": "d", "input_schema": {"type": "object"}}
    assert estimate_tokens(messages, None, [as_dict]) > 100


def test_usage_as_dict_is_its_model_dump() -> None:
    usage = Usage(
        input_tokens=1, output_tokens=2, cache_creation_input_tokens=3, cache_read_input_tokens=4
    )
    assert usage.as_dict() == usage.model_dump()
    assert list(usage.as_dict()) == list(Usage.model_fields)


def test_batch_price_is_half_on_every_kind_of_token() -> None:
    usage = Usage(
        input_tokens=1_000_000,
        output_tokens=1_000_000,
        cache_creation_input_tokens=1_000_000,
        cache_read_input_tokens=1_000_000,
    )
    for model, provider in (("claude-sonnet-4-6", "anthropic"), ("gpt-5.4-mini", "openai")):
        price = price_of(model)
        assert price is not None
        assert batch_price(price, provider) == ModelPrice(
            price.input / 2, price.output / 2, price.cache_write / 2, price.cache_read / 2
        )
        assert batch_cost_usd(usage, price, provider) == pytest.approx(cost_usd(usage, price) / 2)
    unknown = ModelPrice(1.0, 2.0, 1.0, 0.5)
    assert batch_price(unknown, "litellm") == unknown  # no known discount: the live price
