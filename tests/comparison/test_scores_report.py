"""``pyrula-stream evals report`` on real score records: committed ones only, each
``score_id`` once, a bad record counted, and the versions compared."""

from __future__ import annotations

import argparse
import json
import time

import pytest
from confluent_kafka import Producer

from pyrula_stream.cli import main
from pyrula_stream.cli.evals import since_ms
from pyrula_stream.comparison.scores import read_scores, scores_topic
from pyrula_stream.kafka.admin import TopicSpec, apply_topics
from pyrula_stream.testing import unique_name
from pyrula_stream.wire.scores import Score, score_record


def _scores(agent: str, version: str, passed: int, failed: int, start: int = 0) -> list[Score]:
    return [
        Score(
            turn_id=f"{version}-{i}",
            agent=agent,
            evaluator="correct",
            agent_version=version,
            passed=i - start < passed,
            number=1.0 if i - start < passed else 0.0,
        )
        for i in range(start, start + passed + failed)
    ]


def _produce(bootstrap: str, topic: str, scores: list[Score], *, abort: bool = False) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": unique_name("scores-tx")}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for score in scores:
        record = score_record(topic, score)
        producer.produce(record.topic, key=record.key, value=record.value, headers=record.headers)
    if abort:
        producer.abort_transaction(30)
    else:
        producer.commit_transaction(30)


@pytest.fixture(scope="module")
def scored(kafka_bootstrap_servers: str) -> str:
    """An agent whose version 2 passes 45 of 50 and version 1 20 of 50, with a second
    copy of 10 scores, an aborted batch of failures and one record that is not a score."""
    agent = unique_name("scored")
    topic = scores_topic(agent)
    apply_topics(kafka_bootstrap_servers, [TopicSpec(topic, 2)])
    one, two = _scores(agent, "1", 20, 30), _scores(agent, "2", 45, 5)
    _produce(kafka_bootstrap_servers, topic, one + two)
    _produce(kafka_bootstrap_servers, topic, two[:10])  # copies: same score_id
    _produce(kafka_bootstrap_servers, topic, _scores(agent, "2", 0, 40, start=100), abort=True)
    producer = Producer({"bootstrap.servers": kafka_bootstrap_servers})
    producer.produce(topic, key=b"x", value=b"not json")
    producer.flush(30)
    return agent


def test_reads_committed_scores_once_and_counts_the_bad_record(
    kafka_bootstrap_servers: str, scored: str
) -> None:
    read = read_scores(kafka_bootstrap_servers, scored)
    assert len(read.scores) == 100
    assert read.duplicates == 10
    assert len(read.malformed) == 1 and "not JSON" in read.malformed[0]
    assert {s.agent_version for s in read.scores} == {"1", "2"}


def test_evals_report_json_compares_the_versions(
    kafka_bootstrap_servers: str, scored: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["evals", "report", scored, "--bootstrap-servers", kafka_bootstrap_servers]
    assert main([*argv, "--json", "--baseline", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["scores"], report["duplicates"], report["malformed"]) == (100, 10, 1)
    pass_rate, mean = report["measures"]
    assert (pass_rate["measure"], mean["measure"]) == ("pass_rate", "mean")
    one, two = pass_rate["versions"]
    assert (one["version"], one["n"], one["value"]) == ("1", 50, 0.4)
    assert (two["version"], two["n"], two["value"]) == ("2", 50, 0.9)
    (diff,) = pass_rate["comparisons"]
    assert (diff["baseline"], diff["candidate"]) == ("1", "2")
    assert diff["difference"] == pytest.approx(0.5)
    assert diff["ci95"][0] > 0 and diff["significant"]
    assert diff["verdict"] == "significantly higher"
    assert mean["comparisons"][0]["verdict"] == "significantly higher"

    assert main([*argv, "--evaluator", "correct"]) == 0
    text = capsys.readouterr().out
    assert "version 1: n=50 pass rate=40.0%" in text
    assert "2 is significantly higher than 1" in text

    assert main([*argv, "--evaluator", "nobody"]) == 0
    assert "no scores to report" in capsys.readouterr().out
    assert main([*argv, "--since", "2999-01-01"]) == 0  # written before then: none
    assert "no scores to report" in capsys.readouterr().out
    assert main([*argv, "--since", "1h", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["scores"] == 100


def test_since_takes_an_age_or_a_date() -> None:
    now_ms = time.time() * 1000
    assert since_ms("30m") == pytest.approx(now_ms - 1_800_000, abs=5_000)
    assert since_ms("7d") == pytest.approx(now_ms - 7 * 86_400_000, abs=5_000)
    assert since_ms("2026-12-01") == 1_796_083_200_000  # midnight UTC
    with pytest.raises(argparse.ArgumentTypeError, match="an age"):
        since_ms("yesterday")


def test_evals_report_names_a_missing_topic(
    kafka_bootstrap_servers: str, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = unique_name("noscores")
    assert main(["evals", "report", missing, "--bootstrap-servers", kafka_bootstrap_servers]) == 2
    assert f"no topic pyrula.{missing}.scores" in capsys.readouterr().err
