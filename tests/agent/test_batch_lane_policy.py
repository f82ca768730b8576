"""``BatchLane``: which calls may wait for a batch, until when, and what a submit puts in
the request for it (no broker: the lane's decisions are plain functions)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

import pytest

from pyrula_stream.agent.batch import (
    REQUEST_DEADLINE_MS,
    REQUEST_DEFERRABLE,
    BatchLane,
    deadline_ms_of,
    lane_metadata,
)
from pyrula_stream.cli import build_parser
from pyrula_stream.cli.turns import _deadline
from pyrula_stream.context.batch_calls import person_waits
from pyrula_stream.durable.journal import TurnJournal
from pyrula_stream.errors import AgentRegistrationError
from pyrula_stream.llm import FakeLLM
from pyrula_stream.llm.fake_batch import FakeBatch

NOW = 1_000_000_000_000


def lane(**kw: object) -> BatchLane:
    return BatchLane(FakeBatch(FakeLLM()), **kw)  # type: ignore[arg-type]


def test_always_waits_unless_the_request_says_it_may_not() -> None:
    always = lane()
    assert always.waits({}, backlog=0)
    assert not always.waits({REQUEST_DEFERRABLE: False}, backlog=10_000)


def test_lag_waits_from_the_threshold_or_when_the_request_defers() -> None:
    by_lag = lane(when="lag", lag_threshold=100)
    assert not by_lag.waits({}, backlog=99)
    assert by_lag.waits({}, backlog=100)
    assert by_lag.waits({REQUEST_DEFERRABLE: True}, backlog=0)
    assert not by_lag.waits({REQUEST_DEFERRABLE: False}, backlog=100)


def test_deferrable_waits_for_the_flag_or_a_deadline_far_enough_away() -> None:
    asked = lane(when="deferrable", min_deadline_s=60)
    assert not asked.waits({}, backlog=10_000, now_ms=NOW)
    assert asked.waits({REQUEST_DEFERRABLE: True}, backlog=0, now_ms=NOW)
    assert asked.waits({REQUEST_DEADLINE_MS: NOW + 3_600_000}, backlog=0, now_ms=NOW)
    assert not asked.waits({REQUEST_DEADLINE_MS: NOW + 30_000}, backlog=0, now_ms=NOW)


def test_a_call_waits_until_the_request_deadline_or_the_lane_max_wait() -> None:
    capped = lane(max_wait_s=600)
    assert capped.deadline_ms({}, NOW) == NOW + 600_000
    assert capped.deadline_ms({REQUEST_DEADLINE_MS: NOW + 60_000}, NOW) == NOW + 60_000
    assert capped.deadline_ms({REQUEST_DEADLINE_MS: NOW + 6_000_000}, NOW) == NOW + 600_000


def test_a_deadline_is_a_datetime_epoch_seconds_or_iso_text() -> None:
    when = datetime(2026, 12, 24, 18, 0, tzinfo=UTC)
    ms = int(when.timestamp() * 1000)
    assert deadline_ms_of(when) == deadline_ms_of(when.timestamp()) == ms
    assert deadline_ms_of("2026-12-24T18:00:00+00:00") == ms
    assert lane_metadata(True, when) == {REQUEST_DEFERRABLE: True, REQUEST_DEADLINE_MS: ms}
    with pytest.raises(ValueError, match="not ISO 8601"):
        deadline_ms_of("next tuesday")
    with pytest.raises(ValueError, match="deferrable is true or false"):
        lane_metadata("yes", None)  # type: ignore[arg-type]


def test_a_lane_refuses_what_it_cannot_do() -> None:
    with pytest.raises(AgentRegistrationError, match="takes a BatchClient"):
        BatchLane(FakeLLM())  # type: ignore[arg-type]
    with pytest.raises(AgentRegistrationError, match="'always', 'lag' or 'deferrable'"):
        lane(when="sometimes")
    with pytest.raises(AgentRegistrationError, match="'live' or 'fail'"):
        lane(on_failure="retry")
    assert lane(max_batch=5).batch_size == 5


def test_a_turn_a_person_answered_stays_live() -> None:
    assert not person_waits(TurnJournal("t"))
    asked = TurnJournal("t", park={"question": {"key": "refund"}, "request": {}})
    answered = TurnJournal("t", signals={"s1": {"name": "refund", "answer": True}})
    signalled = TurnJournal("t", signals={"s1": {"name": "go", "answer": False}})
    assert person_waits(asked) and person_waits(answered)
    assert not person_waits(signalled)


def test_the_cli_submit_takes_deferrable_and_a_deadline() -> None:
    def submit(*flags: str) -> argparse.Namespace:
        return build_parser({}).parse_args(["submit", "enrich", "x=1", *flags])

    assert submit().deferrable is None and submit().deadline is None
    asked = submit("--deferrable", "--deadline", "1798135200")
    assert asked.deferrable is True and _deadline(asked.deadline) == 1798135200.0
    assert submit("--no-deferrable").deferrable is False
    assert _deadline("2026-12-24T18:00:00+00:00") == "2026-12-24T18:00:00+00:00"
