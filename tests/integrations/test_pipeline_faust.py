"""examples/pipelines/faust_orders.py against the real broker: exactly once end to end."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from pyrula_stream.testing import unique_name
from tests.pipeline_harness import run_pipeline

FULL = 1_000
"""The issue's size: ``make pipelines`` (or PYRULA_PIPELINE_RECORDS=1000) runs it."""
RECORDS = int(os.environ.get("PYRULA_PIPELINE_RECORDS", "200"))


@pytest.mark.slow
def test_faust_orders_exactly_once_under_a_worker_kill(
    kafka_bootstrap_servers: str, tmp_path: Path
) -> None:
    pipeline = unique_name("faust")
    run = run_pipeline(
        kafka_bootstrap_servers,
        tmp_path,
        pipeline=pipeline,
        agent_spec="examples.pipelines.faust_orders:triage",
        agent_name="triage",
        processor_argv=[
            *(sys.executable, "-m", "examples.pipelines.faust_orders"),
            *("--datadir", str(tmp_path / "faust"), "worker", "--without-web", "-l", "warn"),
        ],
        input_topic=f"{pipeline}.orders",
        downstream_topic=f"{pipeline}.answered",
        records=RECORDS,
    )
    orders = {f"o{i}" for i in range(RECORDS)}
    assert run.worker_starts == 2 and run.results_when_killed < RECORDS  # killed mid-run
    assert set(run.results) == orders and max(run.results.values()) == 1
    assert set(run.downstream) == orders and max(run.downstream.values()) == 1
