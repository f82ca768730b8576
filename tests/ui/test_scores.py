"""Scores in the UI: folded from ``<agent>.scores`` once each, shown on the scored turn's
page, and summed up per agent version as ``evals report`` does."""

from __future__ import annotations

from pyrula_stream.kafka.io import TopicRecord
from pyrula_stream.ui.feed import EventFeed, FeedOptions
from pyrula_stream.ui.model import UIState
from pyrula_stream.ui.scores import ScoreBoard
from pyrula_stream.wire.events import Event
from pyrula_stream.wire.scores import Score, score_record

TOPIC = "pyrula.support.scores"


def record(offset: int, score: Score | None, value: bytes | None = None) -> TopicRecord:
    out = score_record(TOPIC, score) if score is not None else None
    body = out.value if out is not None else value
    return TopicRecord(TOPIC, 0, offset, b"k", body, {}, 1_000)


def test_scores_reach_their_turn_once_and_the_summary_compares_versions() -> None:
    state = UIState()
    feed = EventFeed(FeedOptions("localhost:9", agents=("support",)), state)
    feed._topic_agent[TOPIC] = ("support", "scores")
    state.apply(Event("run:start", "t1", "support", 0, 1_000, 1, {"version": "2"}))
    before = state.find("support", "t1").version  # type: ignore[union-attr]
    good = Score("t1", "support", "correct", agent_version="2", passed=True, reason="sum ok")
    scores = [
        Score(f"a{i}", "support", "correct", agent_version="1", passed=i < 2) for i in range(10)
    ]
    records = [record(0, good), record(1, good), record(2, None, b"not json")]
    records += [record(3 + i, s) for i, s in enumerate(scores)]
    assert feed._fold(records)
    assert feed.undecodable == 1
    turn = state.find("support", "t1")
    assert turn is not None and turn.version > before, "the turn's page is sent again"
    assert turn.agent_version == "2"
    (shown,) = feed.scores.of_turn("support", "t1")
    assert (shown["evaluator"], shown["passed"], shown["reason"]) == ("correct", True, "sum ok")
    (measure,) = feed.scores.summary("support")["measures"]
    assert [(v["version"], v["n"]) for v in measure["versions"]] == [("1", 10), ("2", 1)]
    (comparison,) = measure["comparisons"]
    assert (comparison["baseline"], comparison["candidate"]) == ("1", "2")
    assert comparison["verdict"] == "not yet significant"


def test_the_board_keeps_the_newest_scores() -> None:
    board = ScoreBoard(max_scores=3)
    for i in range(5):
        board.add("support", Score(f"t{i}", "support", "correct", passed=True))
    assert board.of_turn("support", "t0") == []
    assert len(board.of_turn("support", "t4")) == 1
    assert board.summary("support")["scores"] == 3
