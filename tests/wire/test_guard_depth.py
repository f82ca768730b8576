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

from pyrula_stream.errors import MalformedRecordError
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
