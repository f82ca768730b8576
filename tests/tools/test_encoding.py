"""Result encoding, canonical JSON, truncation for the model, and RetryPolicy decisions."""

import asyncio
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from pyrula_stream.errors import ConfigurationError, Fatal, Poison, ToolTimeout
from pyrula_stream.tools.contract import (
    UnserializableToolResult,
    canonical_json,
    encode_result,
)
from pyrula_stream.tools.retry import RetryPolicy
from pyrula_stream.wire.text import truncate_utf8

MARKER = re.compile(r"\n\[truncated: showed (\d+) of (\d+) bytes\]$")


class Point(BaseModel):
    y: int
    x: int


# --- encoding ------------------------------------------------------------------------------------


def test_encode_result_forms() -> None:
    assert encode_result("as is, {not json}", "t") == "as is, {not json}"
    assert encode_result({"b": 1, "a": [1, 2]}, "t") == '{"a":[1,2],"b":1}'
    assert encode_result(Point(y=2, x=1), "t") == '{"x":1,"y":2}'
    assert encode_result({"p": [Point(y=0, x=0)]}, "t") == '{"p":[{"x":0,"y":0}]}'
    assert encode_result(None, "t") == "null"
    assert encode_result("ø", "t") == "ø" and encode_result(["ø"], "t") == '["ø"]'


def test_encode_result_names_the_tool_when_not_serializable() -> None:
    with pytest.raises(UnserializableToolResult, match=r"tool 'export'.*set is not JSON"):
        encode_result({"ids": {1, 2}}, "export")
    with pytest.raises(UnserializableToolResult, match=r"^step 'load' returned"):
        encode_result(object(), "load", kind="step")


@given(st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=6))
def test_canonical_json_ignores_key_order(mapping: dict[str, object]) -> None:
    reordered = dict(reversed(list(mapping.items())))
    assert canonical_json(mapping) == canonical_json(reordered)


# --- truncation ----------------------------------------------------------------------------------


def test_truncate_keeps_short_text_and_none_means_whole() -> None:
    assert truncate_utf8("abc", 3) == "abc"
    assert truncate_utf8("x" * 500_000, None) == "x" * 500_000


def test_truncate_cuts_at_a_character_boundary() -> None:
    text = "é" * 10  # 2 bytes each
    assert truncate_utf8(text, 5) == "éé\n[truncated: showed 4 of 20 bytes]"
    assert truncate_utf8("a🙂b", 4) == "a\n[truncated: showed 1 of 6 bytes]"
    assert truncate_utf8("🙂", 0) == "\n[truncated: showed 0 of 4 bytes]"
    with pytest.raises(ValueError, match="max_bytes"):
        truncate_utf8("x", -1)


@given(st.text(), st.integers(min_value=0, max_value=200))
def test_truncate_property(text: str, max_bytes: int) -> None:
    result = truncate_utf8(text, max_bytes)
    total = len(text.encode("utf-8"))
    if total <= max_bytes:
        assert result == text
        return
    match = MARKER.search(result)
    assert match is not None
    shown = result[: match.start()]
    shown_bytes = shown.encode("utf-8")  # valid UTF-8: encodes without error
    assert text.startswith(shown)
    assert len(shown_bytes) <= max_bytes
    assert max_bytes - len(shown_bytes) < 4  # never drops more than one partial character
    assert (int(match.group(1)), int(match.group(2))) == (len(shown_bytes), total)


# --- RetryPolicy ---------------------------------------------------------------------------------


def test_from_retries_means_retries_with_no_wait() -> None:
    policy = RetryPolicy.from_retries(2)
    assert policy.max_attempts == 3
    assert [policy.delay_for(n) for n in (1, 2, 3)] == [0.0, 0.0, 0.0]
    assert RetryPolicy().max_attempts == 1


def test_should_retry_decisions() -> None:
    policy = RetryPolicy(
        max_attempts=3, retry_on=(OSError, Fatal), non_retryable=(FileNotFoundError,)
    )
    assert policy.should_retry(ConnectionError("x"), 1)
    assert policy.should_retry(OSError("x"), 2)
    assert not policy.should_retry(OSError("x"), 3)  # attempts used up
    assert not policy.should_retry(FileNotFoundError("x"), 1)  # non_retryable wins
    assert not policy.should_retry(ValueError("x"), 1)  # not in retry_on
    assert not policy.should_retry(Fatal("x"), 1)  # never, even when listed
    assert not RetryPolicy(max_attempts=9).should_retry(Poison("x"), 1)
    assert RetryPolicy(max_attempts=9).should_retry(ToolTimeout("x"), 1)
    everything = RetryPolicy(max_attempts=9, retry_on=(BaseException,))
    assert not everything.should_retry(asyncio.CancelledError(), 1)


def test_delays_grow_and_are_capped() -> None:
    policy = RetryPolicy(initial_interval=0.1, backoff_coefficient=3, max_interval=1.0, jitter=0)
    assert [round(policy.delay_for(n), 6) for n in (1, 2, 3, 4)] == [0.1, 0.3, 0.9, 1.0]
    assert policy.delay_for(100_000) == 1.0  # no overflow


@given(
    st.integers(min_value=1, max_value=60),
    st.floats(min_value=0, max_value=5),
    st.floats(min_value=1, max_value=4),
    st.floats(min_value=0, max_value=30),
    st.floats(min_value=0, max_value=1),
)
def test_jittered_delay_stays_in_bounds(
    attempt: int, initial: float, coefficient: float, cap: float, jitter: float
) -> None:
    policy = RetryPolicy(
        initial_interval=initial, backoff_coefficient=coefficient, max_interval=cap, jitter=jitter
    )
    base = policy.base_delay_for(attempt)
    delay = policy.delay_for(attempt)
    assert base <= cap
    assert base * (1 - jitter) - 1e-9 <= delay <= min(cap, base * (1 + jitter)) + 1e-9


@pytest.mark.parametrize(
    "options",
    [
        {"max_attempts": 0},
        {"max_attempts": 1.5},
        {"initial_interval": -1},
        {"max_interval": float("inf")},
        {"backoff_coefficient": 0.5},
        {"jitter": 2},
        {"retry_on": (ValueError, "nope")},
        {"non_retryable": [KeyError]},
    ],
)
def test_invalid_policies_are_refused(options: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        RetryPolicy(**options)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        RetryPolicy.from_retries(-1)
