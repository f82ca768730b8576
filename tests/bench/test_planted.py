"""The planted-difference proof (issue 51, done-when 2).

End to end on the broker, small: an experiment between a version that answers wrongly
30% of the time and one that does 5%, scored by a function evaluator in the evaluators'
own consumer group, is reported significant in favour of the second.
On score records alone, large: the report's verdicts have the power and the false
positive rate a 95% interval promises, over many simulated experiments.
"""

from __future__ import annotations

import random

import pytest

from pyrula_stream.bench.planted import PLANTED, answers_wrongly, run_planted
from pyrula_stream.comparison.report import build_report
from pyrula_stream.wire.scores import Score


@pytest.mark.timeout(240)
async def test_a_planted_difference_is_reported_significant_with_its_sign(
    kafka_bootstrap_servers: str,
) -> None:
    # 80 turns a side at 70% vs 95% pass: a power of 99% (the split and the answers are
    # the same on every run: turn ids come from idempotency keys).
    run = await run_planted(kafka_bootstrap_servers, turns=160, wrong=PLANTED)
    summary, text = run.summary(), run.report.text()
    one, two = summary["versions"]
    assert one["n"] + two["n"] == 160, "every turn was scored once"
    assert one["n"] > 50 and two["n"] > 50, "the experiment split the turns"
    assert summary["candidate"] == "2" and summary["verdict"] == "significantly higher", text
    assert summary["ci95"][0] > 0
    assert "2 is significantly higher than 1" in text
    # The evaluators' Prometheus series count the same scores, by version and outcome.
    for v in (one, two):
        labels = {"agent": run.agent, "evaluator": "correct", "version": v["version"]}
        passed = run.metrics.get_sample_value(
            "pyrula_eval_scores_total", {**labels, "outcome": "pass"}
        )
        failed = run.metrics.get_sample_value(
            "pyrula_eval_scores_total", {**labels, "outcome": "fail"}
        )
        assert (passed, (passed or 0) + (failed or 0)) == (round(v["value"] * v["n"]), v["n"])


def _experiment(rng: random.Random, wrong: dict[str, float], turns: int) -> list[Score]:
    """A simulated experiment: each turn goes to a version at random and is answered
    wrongly with the version's planted probability."""
    scores = []
    for n in range(turns):
        version = rng.choice(("1", "2"))
        scores.append(
            Score(
                turn_id=f"t{n}",
                agent="sim",
                evaluator="correct",
                agent_version=version,
                passed=rng.random() >= wrong[version],
            )
        )
    return scores


def _verdict(scores: list[Score]) -> str:
    (measure,) = build_report("sim", scores, baseline="1").measures
    return measure.comparisons[0].difference.verdict


def test_verdicts_have_power_and_a_five_percent_false_positive_rate() -> None:
    rng = random.Random(51)
    planted = [_verdict(_experiment(rng, PLANTED, 300)) for _ in range(200)]
    null = [_verdict(_experiment(rng, {"1": 0.1, "2": 0.1}, 300)) for _ in range(200)]
    # 150 turns a side at 70% vs 95%: the power is above 99%.
    assert planted.count("significantly higher") >= 196
    assert planted.count("significantly lower") == 0
    # No difference: about 5% of experiments look significant (binomial sd ~ 3 of 200).
    assert null.count("not yet significant") >= 180


def test_the_planted_shares_are_what_the_model_gets_wrong() -> None:
    for share in (0.05, 0.1, 0.3):
        wrong = sum(answers_wrongly(n, share) for n in range(1000))
        assert abs(wrong - 1000 * share) <= 2
