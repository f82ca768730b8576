"""LLM judges: an evaluator whose verdict is another Kafka agent's turn.

The judge is an ordinary agent (journaled, exactly once, budgeted by its own limits, on
any provider). The evaluator stream writes the judge's turn request in the transaction
that consumes the scored turn, under a turn id derived from (scored turn, evaluator,
version): a rerun that somehow writes it again names the same judge turn, which the
judge's workers run once (the id is also its idempotency key). The judge's result comes
back on ``<judge>.results`` with the reply header ``pyrula-eval`` naming the scored turn,
and the stream scores from it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pyrula_stream.errors import ConfigurationError
from pyrula_stream.evals.evaluators import Evaluator, Verdict
from pyrula_stream.evals.turns import ScoredTurn

JUDGE_NAMESPACE = uuid.UUID("6f1d6a0e-51e7-4c55-9a51-0a11e7a1d9e5")
EVAL_REPLY_HEADER = "pyrula-eval"
"""The reply header of a judge's request (and so of its result): which turn it scores."""


def judge_turn_id(turn_id: str, evaluator: str, version: str) -> str:
    """The judge turn that scores ``turn_id`` for one evaluator version: always the same."""
    return uuid.uuid5(JUDGE_NAMESPACE, f"{turn_id}\x00{evaluator}\x00{version}").hex


def _default_params(turn: ScoredTurn) -> dict[str, Any]:
    return {"turn_id": turn.turn_id, "status": turn.status, "result": turn.result}


@dataclass(frozen=True)
class JudgeEvaluator(Evaluator):
    """Scores a turn by the result of a turn of the ``judge`` agent (its name).

    ``params(turn)`` are the judge turn's params (default: the scored turn's id, status
    and result); ``read(result)`` turns the judge's result into a verdict (default: a
    dict with ``passed`` / ``score`` / ``label`` / ``reason``, or a bool, number or
    label). A judge turn that fails gives an error score with its error.
    """

    judge: str = ""
    judge_prefix: str | None = None
    """The judge's topic prefix; ``None``: the scored agent's."""
    params: Callable[[ScoredTurn], dict[str, Any]] = field(default=_default_params, repr=False)
    read: Callable[[Any], Any] = field(default=Verdict.of, repr=False)
    kind: ClassVar[str] = "judge"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.judge:
            raise ConfigurationError(f"judge evaluator {self.name!r} names no judge agent")

    def turn_id_for(self, turn_id: str) -> str:
        return judge_turn_id(turn_id, self.name, self.version)


def judge(
    name: str,
    agent: Any,
    *,
    params: Callable[[ScoredTurn], dict[str, Any]] | None = None,
    read: Callable[[Any], Any] | None = None,
    version: str = "1",
    sample_rate: float = 1.0,
    reads_tools: bool = False,
) -> JudgeEvaluator:
    """A judge evaluator; ``agent`` is the judge agent (a ``KafkaAgent``) or its name."""
    agent_name = agent if isinstance(agent, str) else str(getattr(agent, "name", ""))
    prefix = None if isinstance(agent, str) else getattr(agent, "prefix", None)
    return JudgeEvaluator(
        name,
        version,
        sample_rate,
        reads_tools,
        judge=agent_name,
        judge_prefix=prefix,
        params=params or _default_params,
        read=read or Verdict.of,
    )
