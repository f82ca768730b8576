"""The bench's judgement of a run (pure logic, no broker): the baseline it reads, the
targets it calls met or missed, and how the two-commit floor splits a turn's records."""

from __future__ import annotations

import json
from pathlib import Path

from pyrula_stream.bench.floor import split_at_first_tool
from pyrula_stream.bench.framework import TurnRecords
from pyrula_stream.bench.load import event_type
from pyrula_stream.bench.report import DOCS_BEGIN, DOCS_END, refresh_docs
from pyrula_stream.bench.targets import (
    BASELINE_FIGURES,
    baseline_from_docs,
    baseline_from_file,
    baseline_table,
    measured_baseline,
    target_rows,
)
from pyrula_stream.wire import serde
from pyrula_stream.wire.events import Event

CPU = "Intel(R) Xeon(R) Processor"


def _baseline_row(**figures: float) -> dict[str, object]:
    return {"cpu": CPU, "commit": "b71eb38", **dict.fromkeys(BASELINE_FIGURES), **figures}


def test_write_docs_keeps_the_baseline_section_and_the_bench_reads_it_back(
    tmp_path: Path,
) -> None:
    docs = tmp_path / "BENCHMARKS.md"
    other = {**_baseline_row(ratio=0.2), "cpu": "AMD EPYC 7B13"}
    table = baseline_table([other, _baseline_row(ratio=0.071, cpu_ms_per_turn=1.67)])
    docs.write_text(f"# B\n\n## Baseline\n\n{table}\n\n{DOCS_BEGIN}\nold\n{DOCS_END}\n")

    refresh_docs(docs, f"{DOCS_BEGIN}\nnew\n{DOCS_END}")

    assert table in docs.read_text()
    base = baseline_from_docs(docs, CPU)
    assert base is not None
    assert (base["commit"], base["ratio"], base["cpu_ms_per_turn"]) == ("b71eb38", 0.071, 1.67)
    assert base["cpu_ms_per_step"] is None  # "-" in the table: not measured
    assert baseline_from_docs(docs, "Some Other CPU") is None


def test_a_baseline_file_is_a_results_file_or_the_bench_stdout(tmp_path: Path) -> None:
    results = {
        "commit": "b71eb38",
        "machine": {"cpu": CPU},
        "throughput": {"ratio": 0.071, "floor_turns_per_s": 7320.0},
        "cpu": {"cpu_ms_per_turn": 1.67, "cpu_ms_per_step": 0.98, "turns_per_s_2_processes": 622.2},
        "telemetry": {"turns_per_s_cost_pct": 25.0},
        "subagents": {"rss_kb_per_parked_turn": 0.07},  # the old in-process reading
    }
    path = tmp_path / "2026-12-02T045340Z-b71eb38.json"
    path.write_text(json.dumps(results))
    base = baseline_from_file(path)
    assert (base["commit"], base["cpu"], base["ratio"]) == ("b71eb38", CPU, 0.071)
    del results["commit"]  # an older bench: the file's name says the commit
    path.write_text(json.dumps(results))
    assert baseline_from_file(path)["commit"] == "b71eb38"
    assert base["cpu_ms_per_step"] == 0.98
    assert base["ratio_all_cores"] == round(622.2 / 7320.0, 4)  # an older bench's 2 processes
    assert base["telemetry_cost_fraction"] == 0.25
    assert base["rss_kb_per_parked_turn"] is None  # an artifact is no baseline

    stdout = tmp_path / "out.txt"
    stdout.write_text("a table\n" + json.dumps({"ratio": 0.09, "cpu_ms_per_turn": 1.2}) + "\n")
    assert baseline_from_file(stdout)["ratio"] == 0.09


def _rows(figures: dict[str, object], base: dict[str, float] | None) -> dict[str, dict]:
    """The target rows by ``<issue>:<first key>``."""
    return {f"{r['issue']}:{r['parts'][0]['key']}": r for r in target_rows(figures, base)}


def test_targets_are_judged_against_the_baseline_factor_or_the_bound() -> None:
    base = {"ratio": 0.071, "cpu_ms_per_turn": 1.67, "cpu_ms_per_step": 0.98}
    figures = {
        "ratio": 0.15,
        "floor_unstable": False,
        "cpu_ms_per_turn": 0.9,
        "cpu_ms_per_step": 0.3,
        "overhead_over_floor_p50_ms": 4.0,
        "overhead_over_floor_p99_ms": 16.0,
        "rss_kb_per_parked_turn": 0.4,
    }
    rows = _rows(figures, base)
    assert rows["27:ratio"]["met"] is True  # 0.15 >= 2 x 0.071
    assert rows["27:ratio"]["parts"][0]["factor"] == round(0.15 / 0.071, 3)
    assert rows["47:ratio"]["met"] is False  # 0.15 < 0.25
    assert rows["27:cpu_ms_per_turn"]["met"] is False  # 0.9 > 0.5 x 1.67
    assert rows["27:cpu_ms_per_step"]["met"] is True  # 0.3 <= 0.4 x 0.98
    assert rows["47:overhead_over_floor_p50_ms"]["met"] is False  # p99 missed its 15 ms
    assert rows["27:rss_kb_per_parked_turn"]["met"] is True
    assert rows["47:ratio_all_cores"]["met"] is None  # not measured: not judged
    assert rows["47:ratio_all_cores"]["why"] == "not measured"
    no_base = _rows(figures, None)
    assert no_base["27:ratio"]["met"] is None  # a factor needs its baseline
    assert no_base["27:ratio"]["why"] == "no baseline"


def test_issue_47s_targets_are_all_there_and_a_missing_figure_is_never_met() -> None:
    rows = _rows({}, None)
    bounds = {
        (p["key"], p["target"])
        for r in target_rows({}, None)
        if r["issue"] == 47
        for p in r["parts"]
    }
    assert bounds == {
        ("gateway_added_p50_ms", "<= 20"),
        ("gateway_added_p99_ms", "<= 100"),
        ("gateway_kb_per_stream", "<= 20"),
        ("inflight_fraction_of_ideal", ">= 0.9"),
        ("rss_kb_per_inflight_turn", "<= 16"),
        ("step_cost_growth", "<= 1.1"),
        ("overhead_over_floor_p50_ms", "<= 5"),
        ("overhead_over_floor_p99_ms", "<= 15"),
        ("ratio", ">= 0.25"),
        ("ratio_all_cores", ">= 0.35"),
        ("cpu_ms_per_turn_200ms_model", "<= 1.3 x `cpu_ms_per_turn`"),
        ("loop_stall_max_ms", "<= 50"),
    }
    assert all(r["met"] is None and r["why"] == "not measured" for r in rows.values())


def test_issue_49s_targets_are_judged_on_the_cost_phases_figures() -> None:
    figures = {
        "cache_cost_fraction": 0.21,
        "cache_cost_fraction_after_compaction": 0.5,
        "batch_cost_fraction": 0.5,
    }
    rows = {
        p["key"]: (p["target"], r["met"])
        for r in target_rows(figures, None)
        if r["issue"] == 49
        for p in r["parts"]
    }
    assert rows == {
        "cache_cost_fraction": ("<= 0.35", True),
        "cache_cost_fraction_after_compaction": ("<= 0.45", False),
        "batch_cost_fraction": ("<= 0.55", True),
    }


def test_the_ratio_targets_are_judged_only_against_a_floor_that_held_still() -> None:
    figures = {"ratio": 0.3, "ratio_all_cores": 0.2}
    stable = _rows({**figures, "floor_unstable": False}, None)
    assert (stable["47:ratio"]["met"], stable["47:ratio_all_cores"]["met"]) == (True, False)
    for unstable, why in ((True, "floor unstable"), (None, "floor stability unknown")):
        rows = _rows({**figures, "floor_unstable": unstable}, None)
        for key in ("47:ratio", "47:ratio_all_cores"):
            assert (rows[key]["met"], rows[key]["why"]) == (None, why)


def test_cpu_at_a_200ms_model_is_judged_against_the_same_runs_instant_model() -> None:
    def verdict(at_200ms: float) -> bool | None:
        figures = {"cpu_ms_per_turn": 1.0, "cpu_ms_per_turn_200ms_model": at_200ms}
        return _rows(figures, None)["47:cpu_ms_per_turn_200ms_model"]["met"]

    assert (verdict(1.25), verdict(1.4)) == (True, False)


def test_a_baseline_measured_in_the_run_wins_over_the_typed_one() -> None:
    typed = {**_baseline_row(ratio=0.071, cpu_ms_per_turn=1.67), "source": "docs"}
    results = {
        "machine": {"cpu": CPU},
        "throughput": {"baseline_ratio": 0.09, "baseline_commit": "b71eb38"},
    }
    base = measured_baseline(results, typed)
    assert base is not None
    assert (base["ratio"], base["cpu_ms_per_turn"]) == (0.09, 1.67)
    assert base["measured"] == ["ratio"]
    assert base["source"].startswith("measured in this run")
    assert measured_baseline({"throughput": {}}, typed) == typed  # nothing measured
    assert measured_baseline({}, None) is None


def _event(type_: str, seq: int) -> bytes:
    return serde.encode("event", Event(type_, "t1", "a", seq, 0))


def test_the_two_commit_floor_commits_up_to_the_first_tool_first() -> None:
    events = ["run:start", "llm:complete", "tool:start", "tool:result", "run:complete"]
    journal = ["t1/0", "t1/progress", "t1/1", "t1/progress", "t1/2", "t1/terminal"]
    template: TurnRecords = [
        *(("journal", key.encode(), b"x", []) for key in journal),
        *(("events", b"t1", _event(t, i), []) for i, t in enumerate(events)),
        ("results", b"t1", b"result", []),
    ]
    first, second = split_at_first_tool(template)
    assert [event_type(r[2]) for r in first if r[0] == "events"] == events[:2]
    assert [event_type(r[2]) for r in second if r[0] == "events"] == events[2:]
    assert sorted(map(repr, first + second)) == sorted(map(repr, template))  # each once
    assert [r[0] for r in second][-1] == "results"  # the result rides the last commit
    # The model's response (step 0) and its progress record, not the tool's result.
    assert [r[1] for r in first if r[0] == "journal"] == [b"t1/0", b"t1/progress"]


def test_without_numbered_steps_the_journal_splits_as_the_events_do() -> None:
    events = ["run:start", "llm:complete", "tool:start", "run:complete"]
    template: TurnRecords = [
        *(("journal", f"t1/j{i}".encode(), b"x", []) for i in range(4)),
        *(("events", b"t1", _event(t, i), []) for i, t in enumerate(events)),
    ]
    first, _ = split_at_first_tool(template)
    assert [r[1] for r in first if r[0] == "journal"] == [b"t1/j0", b"t1/j1"]
