"""Evaluators: what scores an agent's turns (floor 4, declarations).

An evaluator reads a finished turn (``ScoredTurn``) and gives a verdict, written as a
``Score`` on ``<agent>.scores``. ``FunctionEvaluator`` is a plain function,
``JudgeEvaluator`` asks a judge agent (a Kafka agent itself), ``OutcomeEvaluator`` waits
for a business event joined by a key the turn named. Each samples turns at its own rate,
deterministically by turn id. The stream that runs them is ``evals.stream`` (floor 7).
"""

from pyrula_stream.evals.evaluators import (
    ERROR_LABEL,
    Evaluator,
    FunctionEvaluator,
    Verdict,
    error_score,
    evaluator,
    run_function,
    sampled,
)
from pyrula_stream.evals.judges import JudgeEvaluator, judge
from pyrula_stream.evals.outcomes import BusinessEvent, OutcomeEvaluator, outcome
from pyrula_stream.evals.turns import ScoredTurn

__all__ = [
    "ERROR_LABEL",
    "BusinessEvent",
    "Evaluator",
    "FunctionEvaluator",
    "JudgeEvaluator",
    "OutcomeEvaluator",
    "ScoredTurn",
    "Verdict",
    "error_score",
    "evaluator",
    "judge",
    "outcome",
    "run_function",
    "sampled",
]
