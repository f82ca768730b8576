"""The depth scan of ``wire.guard`` on text whose every bracket sits inside a string.

Issue 46: a control record holding a JSON string of 300 ``[`` made ``json_depth`` call
``max()`` on an empty sequence; the ``ValueError`` passed every ``except
MalformedRecordError`` and ended the worker, and every restart died on the same record.
"""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyrula_stream.errors import LLMError, MalformedRecordError
from pyrula_stream.llm import AnthropicLLM
from pyrula_stream.tools.cache import InProcessCacheStore, read_cached_result
from pyrula_stream.wire import guard
from pyrula_stream.wire.records import ControlRequest

BRACKETS = "[" * 300


@pytest.mark.parametrize(
    "text",
    [
        json.dumps(BRACKETS),
        json.dumps("{" * 300),
        json.dumps("[{" * 200),
        " " + json.dumps(BRACKETS) + "\n",
        json.dumps(BRACKETS + "\\" + "]"),
    ],
)
def test_a_string_of_brackets_is_a_value_not_a_crash(text: str) -> None:
    assert guard.json_depth(text) == 0
    assert guard.loads(text, "value") == json.loads(text)
    assert guard.loads(text.encode(), "value") == json.loads(text)


def test_an_object_whose_only_string_holds_brackets_reads() -> None:
    text = json.dumps({"turn_id": BRACKETS})
    assert guard.json_depth(text) == 1
    assert guard.loads_object(text, "value") == {"turn_id": BRACKETS}


def test_a_control_record_of_brackets_is_unreadable_not_fatal() -> None:
    assert ControlRequest.parse(json.dumps(BRACKETS).encode()) is None
    with pytest.raises(MalformedRecordError, match="must be a JSON object, not str"):
        guard.loads_object(json.dumps(BRACKETS).encode(), "control record")


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(['"', "[", "]", "{", "}", "\\", "a", ",", ":", " ", "1"]), max_size=400
    )
)
def test_any_bracket_text_ends_in_a_value_or_malformed(parts: list[str]) -> None:
    text = "".join(parts)
    for limits in (guard.DEFAULT_LIMITS, guard.DecodeLimits(max_depth=0)):
        with contextlib.suppress(MalformedRecordError):
            guard.loads(text, "value", limits)
        assert guard.json_depth(text) >= 0  # the scan itself raises nothing


def test_stray_closing_brackets_do_not_make_a_negative_depth() -> None:
    assert guard.json_depth("]]]" + json.dumps(BRACKETS)) == 0


def test_tool_arguments_of_brackets_are_a_clean_llm_error() -> None:
    """A model's tool arguments shaped like that were an ``internal`` error."""
    llm = AnthropicLLM("claude-test", api_key="k", base_url="http://127.0.0.1:9")
    with pytest.raises(LLMError, match="non-object arguments for tool 'lookup'"):
        llm._parse_tool_input("lookup", json.dumps(BRACKETS), cut_short=False)
    assert llm._parse_tool_input("lookup", json.dumps({"q": BRACKETS}), cut_short=False) == {
        "q": BRACKETS
    }


async def test_a_cached_tool_result_of_brackets_reads_back() -> None:
    store = InProcessCacheStore()
    await store.set("k", {"text": json.dumps(BRACKETS), "is_str": False}, 60.0)
    assert await read_cached_result(store, "k") == (BRACKETS, json.dumps(BRACKETS))
