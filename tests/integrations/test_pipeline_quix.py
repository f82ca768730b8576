"""examples/pipelines/quix_alerts.py against the real broker: exactly once end to end.

Runs in ``.venv-quix`` (``make setup`` builds it: ``quixstreams`` pins confluent-kafka and
pydantic below this project's newest versions), so our worker here also runs on the
lowest confluent-kafka and pydantic this project supports.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pyrula_stream.testing import unique_name
from tests.pipeline_harness import run_pipeline

QUIX_PYTHON = Path(__file__).resolve().parents[2] / ".venv-quix" / "bin" / "python"
RECORDS = int(os.environ.get("PYRULA_PIPELINE_RECORDS", "200"))


@pytest.mark.slow
def test_quix_alerts_exactly_once_under_a_worker_kill(
    kafka_bootstrap_servers: str, tmp_path: Path
) -> None:
    assert QUIX_PYTHON.exists(), f"{QUIX_PYTHON} is missing: run 'make setup' (it builds it)"
    pipeline = unique_name("quix")
    run = run_pipeline(
        kafka_bootstrap_servers,
        tmp_path,
        pipeline=pipeline,
        agent_spec="examples.pipelines.quix_alerts:triage",
        agent_name="triage",
        processor_argv=[str(QUIX_PYTHON), "-m", "examples.pipelines.quix_alerts"],
        input_topic=f"{pipeline}.alerts",
        id_field="alert_id",
        downstream_topic=f"{pipeline}.summary",
        records=RECORDS,
        python=str(QUIX_PYTHON),
    )
    alerts = {f"o{i}" for i in range(RECORDS)}
    assert run.worker_starts == 2 and run.results_when_killed < RECORDS  # killed mid-run
    assert set(run.results) == alerts and max(run.results.values()) == 1
    assert set(run.downstream) == alerts and max(run.downstream.values()) == 1
