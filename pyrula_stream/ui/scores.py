"""The scores the UI shows: each turn's scores for its page, and per agent the versions'
summary (the report of ``pyrula-stream evals report``, over the scores the UI read).

Scores come from ``<agent>.scores`` (read committed, from the UI's history window on);
a second copy of a score (same ``score_id``) is dropped, as the report does. Memory is
bounded: the newest ``max_scores`` scores per agent are kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from pyrula_stream.comparison.report import build_report
from pyrula_stream.wire.scores import Score

MAX_SCORES = 20_000


class ScoreBoard:
    """Scores by agent, in arrival order, each ``score_id`` once."""

    def __init__(self, max_scores: int = MAX_SCORES) -> None:
        self.max_scores = max_scores
        self._scores: dict[str, OrderedDict[str, Score]] = {}
        self._by_turn: dict[str, dict[str, list[str]]] = {}

    def add(self, agent: str, score: Score) -> bool:
        """Keep ``score``; False when it was a copy of one already kept."""
        kept = self._scores.setdefault(agent, OrderedDict())
        if score.score_id in kept:
            return False
        kept[score.score_id] = score
        by_turn = self._by_turn.setdefault(agent, {})
        by_turn.setdefault(score.turn_id, []).append(score.score_id)
        while len(kept) > self.max_scores:
            _, old = kept.popitem(last=False)
            ids = by_turn.get(old.turn_id, [])
            if old.score_id in ids:
                ids.remove(old.score_id)
            if not ids:
                by_turn.pop(old.turn_id, None)
        return True

    def of_turn(self, agent: str, turn_id: str) -> list[dict[str, Any]]:
        """The turn's scores as JSON, in the order they arrived."""
        kept: Mapping[str, Score] = self._scores.get(agent, {})
        ids = self._by_turn.get(agent, {}).get(turn_id, [])
        return [kept[i].data() for i in ids if i in kept]

    def summary(self, agent: str) -> dict[str, Any]:
        """The versions compared, as ``evals report --json`` gives it."""
        return build_report(agent, list(self._scores.get(agent, {}).values())).as_json()

    def agents(self) -> list[str]:
        return sorted(self._scores)
