"""The Prometheus series of evaluation: scores by agent, evaluator, agent version and
outcome, and the distribution of numeric scores.

``pyrula_eval_scores_total{agent,evaluator,version,outcome}`` counts scores written;
``outcome`` is ``pass``, ``fail``, ``number``, ``label``, ``error`` (the evaluator could
not score) or ``timed_out`` (a deferred outcome whose window closed), so a pass rate per
version is ``pass / (pass + fail)`` over a window.
``pyrula_eval_score_value{agent,evaluator,version}`` is a histogram of numeric scores:
its ``_sum / _count`` is the mean per version.

Labels stay bounded: evaluators and versions are declared in code, but the values come
from records, so each takes its first ``MAX_LABEL_VALUES`` distinct values and the rest
share ``other``; labels (the ``label`` field) are never a label value.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry

from pyrula_stream.observability.series import LoopCounter, LoopHistogram
from pyrula_stream.wire.scores import Score

SCORE_BUCKETS = (0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1, 2, 3, 4, 5, 10, 100)
"""Fine in [0, 1] (judges' probabilities, rates), then the 1-5 and 1-10 scales."""
MAX_LABEL_VALUES = 50
OTHER = "other"
ERROR_LABEL = "error"
"""The label of a score that says its evaluator failed (the evaluators' convention)."""


class ScoreMetrics:
    """Evaluation series on ``registry`` (a worker's, or the evaluators' own)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.scores = LoopCounter(
            "pyrula_eval_scores",
            "Scores written, by agent, evaluator, agent version (the variant) and outcome.",
            ["agent", "evaluator", "version", "outcome"],
            registry=registry,
        )
        self.values = LoopHistogram(
            "pyrula_eval_score_value",
            "Numeric scores, by agent, evaluator and agent version (_sum/_count: the mean).",
            ["agent", "evaluator", "version"],
            buckets=SCORE_BUCKETS,
            registry=registry,
        )
        self._seen: dict[str, set[str]] = {"evaluator": set(), "version": set()}

    def _bounded(self, kind: str, value: str) -> str:
        seen = self._seen[kind]
        if value in seen:
            return value
        if len(seen) < MAX_LABEL_VALUES:
            seen.add(value)
            return value
        return OTHER

    def observe(self, scores: Iterable[Score]) -> None:
        """Count committed scores (call it once a batch of scores has committed)."""
        for score in scores:
            evaluator = self._bounded("evaluator", score.evaluator)
            version = self._bounded("version", score.agent_version)
            self.scores.labels(score.agent, evaluator, version, outcome(score)).inc()
            if score.number is not None:
                self.values.labels(score.agent, evaluator, version).observe(score.number)


def outcome(score: Score) -> str:
    """The ``outcome`` label of a score."""
    if score.timed_out:
        return "timed_out"
    if score.label == ERROR_LABEL and score.passed is None and score.number is None:
        return "error"
    if score.passed is not None:
        return "pass" if score.passed else "fail"
    if score.number is not None:
        return "number"
    return "label"
