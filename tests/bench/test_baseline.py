"""``--baseline-commit``: an older commit's framework unpacked beside this one and run
against the suite's broker, so a baseline figure is measured in the same run."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyrula_stream.bench.baseline import baseline_tree, resolve_commit, run_baseline_framework


def test_a_commit_is_unpacked_once_and_reused(tmp_path: Path) -> None:
    tree = baseline_tree("HEAD", cache=tmp_path)
    assert tree == tmp_path / resolve_commit("HEAD")
    assert (tree / "pyrula_stream" / "bench" / "framework.py").is_file()
    stamp = (tree / ".complete").stat().st_mtime_ns
    assert baseline_tree("HEAD", cache=tmp_path) == tree
    assert (tree / ".complete").stat().st_mtime_ns == stamp  # not unpacked again


def test_an_unknown_commit_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no-such-commit"):
        baseline_tree("no-such-commit", cache=tmp_path)


@pytest.mark.slow
def test_the_old_trees_framework_runs_turns_on_the_broker(
    kafka_bootstrap_servers: str, tmp_path: Path
) -> None:
    tree = baseline_tree("HEAD", cache=tmp_path)
    run = run_baseline_framework(
        tree, kafka_bootstrap_servers, turns=12, partitions=2, concurrency=10
    )
    assert run["turns_per_s"] > 0
    assert run["commits"] >= 1
    assert run["records_committed"] >= 12  # at least a terminal event per turn
