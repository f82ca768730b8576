"""What a function evaluator's return becomes, and sampling: the same turns every time,
at about the rate asked, and a verdict of the wrong shape is an error score, not a raise."""

from __future__ import annotations

import pytest

from pyrula_stream.errors import ConfigurationError
from pyrula_stream.evals import ERROR_LABEL, ScoredTurn, Verdict, evaluator, run_function, sampled

TURN = ScoredTurn("t1", "shop", "completed", result={"n": 1}, agent_version="2")


def test_what_an_evaluator_returns_becomes_a_verdict() -> None:
    assert Verdict.of(True) == Verdict(passed=True)
    assert Verdict.of(3) == Verdict(number=3.0)
    assert Verdict.of("polite") == Verdict(label="polite")
    assert Verdict.of({"score": 7, "passed": False, "reason": "slow"}) == Verdict(
        7.0, None, False, "slow"
    )
    with pytest.raises(TypeError, match="'passed' must be true or false"):
        Verdict.of({"passed": "yes"})


def test_a_wrong_verdict_is_an_error_score_and_none_is_no_score() -> None:
    @evaluator()
    def wrong(turn: ScoredTurn) -> object:
        return [1, 2]

    @evaluator()
    def not_mine(turn: ScoredTurn) -> None:
        return None

    score = run_function(wrong, TURN)
    assert score is not None
    assert (score.label, score.agent_version, score.kind) == (ERROR_LABEL, "2", "function")
    assert "not list" in score.reason
    assert run_function(not_mine, TURN) is None


def test_sampling_is_the_same_every_time_and_near_its_rate() -> None:
    ids = [f"turn-{i}" for i in range(4000)]
    picked = [t for t in ids if sampled(t, "quality", 0.3)]
    assert picked == [t for t in ids if sampled(t, "quality", 0.3)]
    assert 0.27 < len(picked) / len(ids) < 0.33
    other = {t for t in ids if sampled(t, "brevity", 0.3)}
    assert other != set(picked)  # each evaluator samples its own turns
    assert all(sampled(t, "x", 1.0) for t in ids[:10])
    assert not any(sampled(t, "x", 0.0) for t in ids[:10])
    with pytest.raises(ConfigurationError, match="sample_rate"):
        evaluator("greedy", sample_rate=1.5)(lambda turn: True)
