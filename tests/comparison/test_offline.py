"""Offline evaluation: function evaluators over a golden set run on two versions (the
planted difference found without a cluster), and over recorded turns as they ended."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pyrula_stream import AgentContext, kafka_agent
from pyrula_stream.bench.planted import PLANTED, planted_agent
from pyrula_stream.cli import main
from pyrula_stream.comparison.offline import OfflineEvaluator, evaluate, recorded_turn
from pyrula_stream.state.history import TurnRecording
from pyrula_stream.wire.serde import JournalEntry, TurnRequest

agent = planted_agent("adder", PLANTED, {"1": 0.5, "2": 0.5})
"""Version 1 answers 30% of the questions wrongly, version 2 5%; scored by ``correct``."""


@kafka_agent(name="bare")
async def bare(ctx: AgentContext) -> str:
    return "no evaluators here"


def short(turn: Any) -> dict[str, Any]:
    return {"number": len(str(turn.result["answer"])), "reason": "characters"}


def matches(turn: Any) -> bool:
    return bool(turn.result == str(turn.expected))


def broken(turn: Any) -> bool:
    raise KeyError("no such field")


def test_a_golden_set_finds_the_planted_difference_offline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = tmp_path / "golden.jsonl"
    cases = [{"id": f"q{n}", "params": {"n": n}, "expected": n + 7} for n in range(100)]
    golden.write_text("\n".join(json.dumps(c) for c in cases) + "\n")
    argv = ["evals", "offline", f"{__name__}:agent", "--golden", str(golden), "--json"]
    # The agent's own evaluator (correct: the answer is the sum), as online.
    assert main([*argv, "--baseline", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["scores"] == 200  # 100 cases x 2 versions
    (correct_rate,) = report["measures"]
    assert correct_rate["evaluator"] == "correct"
    one, two = correct_rate["versions"]
    # The same 100 questions on each version: the planted shares, to a question.
    assert (one["version"], one["n"], two["version"], two["n"]) == ("1", 100, "2", 100)
    assert one["value"] == pytest.approx(0.7, abs=0.011)
    assert two["value"] == pytest.approx(0.95, abs=0.011)
    assert correct_rate["comparisons"][0]["verdict"] == "significantly higher"
    # --evaluator names others instead: a number gives a mean.
    assert main([*argv, "--evaluator", f"{__name__}:short", "--version", "2"]) == 0
    (lengths,) = json.loads(capsys.readouterr().out)["measures"]
    assert (lengths["evaluator"], lengths["measure"]) == ("short", "mean")
    assert [v["version"] for v in lengths["versions"]] == ["2"]


def test_recorded_turns_are_scored_as_they_ended(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for n, (version, answer) in enumerate([("1", "8"), ("2", "9"), ("2", "wrong")]):
        turn_id = f"t{n}"
        request = TurnRequest(turn_id=turn_id, agent="adder", params={"n": 1 + n})
        start = JournalEntry(
            turn_id, 0, "start", "start", data={"version": version, "started_ms": 5}
        )
        tool = JournalEntry(turn_id, 1, "tool", "lookup_order", data={"output": "{}"})
        ended = {"type": "run:complete", "result": answer}
        TurnRecording(request, [start, tool], ended, version).dump(tmp_path / f"{turn_id}.json")
    turns = [recorded_turn(TurnRecording.load(p)) for p in sorted(tmp_path.glob("*.json"))]
    assert [(t.agent_version, t.result, t.params) for t in turns] == [
        ("1", "8", {"n": 1}),
        ("2", "9", {"n": 2}),
        ("2", "wrong", {"n": 3}),
    ]
    assert {(t.tools, t.started_ms) for t in turns} == {(("lookup_order",), 5)}
    plus_seven = OfflineEvaluator("plus_seven", lambda t: t.result == str(t.params["n"] + 7))
    scores = evaluate(turns, [plus_seven, OfflineEvaluator.of(broken)])
    assert [(s.evaluator, s.passed, s.label) for s in scores] == [
        ("plus_seven", True, None),
        ("broken", None, "error"),
        ("plus_seven", True, None),
        ("broken", None, "error"),
        ("plus_seven", False, None),
        ("broken", None, "error"),
    ]
    assert "KeyError" in scores[1].reason

    argv = ["evals", "offline", f"{__name__}:agent", "--turns", str(tmp_path / "*.json")]
    assert main([*argv, "--evaluator", f"{__name__}:matches"]) == 0
    out = capsys.readouterr().out
    assert "version 1: n=1" in out and "version 2: n=2" in out
    assert "nothing to compare" not in out
    only_two = ["evals", "offline", f"{__name__}:agent", "--turns", str(tmp_path / "t[12].json")]
    assert main([*only_two, "--evaluator", f"{__name__}:matches"]) == 0
    assert "(one version has scores: nothing to compare yet)" in capsys.readouterr().out


def test_judges_are_refused_offline_and_a_missing_evaluator_is_named(
    capsys: pytest.CaptureFixture[str],
) -> None:
    class Judge:
        name, kind = "helpful", "judge"

    with pytest.raises(Exception, match="offline evaluation runs function evaluators only"):
        OfflineEvaluator.of(Judge())
    argv = ["evals", "offline", f"{__name__}:bare", "--turns", "nothing*.json"]
    assert main(argv) == 2
    assert "no function evaluators for 'bare'" in capsys.readouterr().err


def test_an_offline_turn_has_everything_an_online_evaluator_reads() -> None:
    """An evaluator written for ``ScoredTurn`` runs offline unchanged."""
    import dataclasses

    from pyrula_stream.comparison.offline import OfflineTurn
    from pyrula_stream.evals.turns import ScoredTurn

    online = {f.name for f in dataclasses.fields(ScoredTurn)} | {"completed", "read"}
    assert online <= {f.name for f in dataclasses.fields(OfflineTurn)} | set(dir(OfflineTurn))
