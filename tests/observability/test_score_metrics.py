"""Evaluation series: one per agent, evaluator, version and outcome, with bounded labels."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from pyrula_stream.observability.score_metrics import MAX_LABEL_VALUES, ScoreMetrics
from pyrula_stream.wire.scores import Score


def _score(**fields: object) -> Score:
    base: dict[str, object] = {"turn_id": "t", "agent": "support", "evaluator": "correct"}
    return Score(**{**base, **fields})  # type: ignore[arg-type]


def test_scores_are_counted_by_version_and_outcome() -> None:
    registry = CollectorRegistry()
    metrics = ScoreMetrics(registry)
    metrics.observe(
        [
            _score(agent_version="1", passed=True),
            _score(agent_version="1", passed=False),
            _score(agent_version="2", passed=True),
            _score(agent_version="2", evaluator="helpful", number=4.0),
            _score(agent_version="2", evaluator="helpful", number=2.0),
            _score(agent_version="2", evaluator="refund", timed_out=True, passed=False),
            _score(agent_version="2", evaluator="helpful", label="error", reason="judge failed"),
        ]
    )

    def total(evaluator: str, version: str, outcome: str) -> float | None:
        labels = {"agent": "support", "evaluator": evaluator, "version": version}
        return registry.get_sample_value("pyrula_eval_scores_total", {**labels, "outcome": outcome})

    assert total("correct", "1", "pass") == 1 and total("correct", "1", "fail") == 1
    assert total("correct", "2", "pass") == 1
    assert total("helpful", "2", "number") == 2
    assert total("helpful", "2", "error") == 1
    assert total("refund", "2", "timed_out") == 1
    helpful = {"agent": "support", "evaluator": "helpful", "version": "2"}
    assert registry.get_sample_value("pyrula_eval_score_value_sum", helpful) == 6.0
    assert registry.get_sample_value("pyrula_eval_score_value_count", helpful) == 2
    assert b"# TYPE pyrula_eval_scores_total counter" in generate_latest(registry)


def test_versions_from_records_cannot_blow_up_the_series() -> None:
    registry = CollectorRegistry()
    metrics = ScoreMetrics(registry)
    metrics.observe([_score(agent_version=f"v{i}", passed=True) for i in range(200)])
    versions = {
        s.labels["version"]
        for family in registry.collect()
        for s in family.samples
        if s.name == "pyrula_eval_scores_total"
    }
    assert len(versions) == MAX_LABEL_VALUES + 1 and "other" in versions


def test_evals_run_serves_the_series_it_counts() -> None:
    """``evals run --metrics-port``: what the stream's committed batches count is on
    ``/metrics``."""
    import httpx

    from pyrula_stream.cli import build_parser
    from pyrula_stream.cli.evals import serve_score_metrics

    args = build_parser().parse_args(["evals", "run", "m:a", "--metrics-port", "9109"])
    assert (args.metrics_port, args.metrics_host) == (9109, "127.0.0.1")
    metrics, url = serve_score_metrics("127.0.0.1", 0)
    metrics.observe([_score(agent_version="2", passed=True)])
    page = httpx.get(url, timeout=10).text
    assert (
        'pyrula_eval_scores_total{agent="support",evaluator="correct",outcome="pass",'
        'version="2"} 1.0'
    ) in page
