"""The demo agent's golden turns (recorded on a real broker by
``python -m examples.support_triage.record_golden``) still replay on today's code, so a
change that would fail in-flight turns is caught here, before it is deployed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from examples.support_triage.agent import support
from pyrula_stream import tool
from pyrula_stream.testing import assert_replays

GOLDEN = Path(__file__).parents[2] / "examples" / "support_triage" / "golden"


def test_the_support_agents_golden_turns_replay() -> None:
    assert len(list(GOLDEN.glob("*.json"))) == 6
    assert_replays(support, GOLDEN / "*.json")


def test_a_changed_tool_description_breaks_the_golden_turns() -> None:
    lookup = support.tools[0]
    renamed = tool(name=lookup.name, description="Find an order.")(lookup.__wrapped__)
    changed = dataclasses.replace(support, tools=(renamed, *support.tools[1:]))
    with pytest.raises(AssertionError, match="the offered tools"):
        assert_replays(changed, GOLDEN / "*.json")


def test_a_pattern_that_matches_nothing_is_an_error() -> None:
    with pytest.raises(Exception, match="no recorded turns match"):
        assert_replays(support, GOLDEN / "missing-*.json")
