"""``make chaos ARGS=--autoscale``: its parts, and its ``--quick`` run on the real broker.

The controller reads the lag KEDA's kafka scaler reads and applies KEDA's rule; the checks
tell a parked turn that came back (elsewhere) from one that did not; and the small run
scales worker processes up and down under waves of turns, some parked, losing nothing.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from pyrula_stream.chaos import verify
from pyrula_stream.chaos.autoscale import AutoscaleConfig, park_kind, run_autoscale
from pyrula_stream.chaos.autoscale_check import check_parked, longest_stall, signal_payload
from pyrula_stream.chaos.harness import GATE_KEYS
from pyrula_stream.chaos.scaler import desired_replicas, lag, lag_reader
from pyrula_stream.wire import serde
from pyrula_stream.wire.events import Event


def test_desired_replicas_is_kedas_rule_capped_by_partitions() -> None:
    assert desired_replicas(0, 5, 6, 1, 4) == 1  # minReplicas
    assert desired_replicas(5, 5, 6, 1, 4) == 1
    assert desired_replicas(6, 5, 6, 1, 4) == 2  # ceil(6 / 5)
    assert desired_replicas(100, 5, 6, 1, 4) == 4  # maxReplicas
    assert desired_replicas(100, 5, 3, 1, 8) == 3  # no more workers than partitions


def test_park_kind_alternates_timers_and_signals() -> None:
    kinds = [park_kind(i, 5) for i in range(20)]
    assert kinds == ["", "", "", "", "sleep"] + [""] * 4 + ["signal"] + [""] * 4 + ["sleep"] + [
        ""
    ] * 4 + ["signal"]


def test_lag_is_end_minus_commit_and_a_partition_without_one_counts_from_earliest(
    kafka_bootstrap_servers: str,
) -> None:
    topic, group = f"lag-{uuid.uuid4().hex[:8]}", f"lag-{uuid.uuid4().hex[:8]}.workers"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap_servers})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": kafka_bootstrap_servers})
    for partition, n in ((0, 5), (1, 3)):
        for i in range(n):
            producer.produce(topic, f"{i}".encode(), partition=partition)
    assert producer.flush(30) == 0
    reader = lag_reader(kafka_bootstrap_servers, group)
    try:
        assert lag(reader, topic, 3) == 8  # nothing committed: every record counts
        # The earliest offset, not 0: records deleted from the log are no lag.
        deleted = admin.delete_records([TopicPartition(topic, 0, 2)])
        for future in deleted.values():
            future.result(30)
        assert lag(reader, topic, 3) == 6
        committer = Consumer({"bootstrap.servers": kafka_bootstrap_servers, "group.id": group})
        try:
            committer.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)
        finally:
            committer.close()
        assert lag(reader, topic, 3) == 1 + 3
    finally:
        reader.close()


def event(turn: str, seq: int, type_: str, data: dict[str, object]) -> verify.Record:
    encoded = serde.encode("event", Event(type_, turn, "chaos", seq, 0, 1, data))
    headers = {serde.CONTENT_TYPE_HEADER: serde.content_type("event")}
    return verify.Record(0, seq, turn, encoded, headers, 0)


def test_parked_turns_count_as_resumed_only_with_their_wait_in_the_result() -> None:
    parked = {"a": "sleep", "b": "signal", "c": "signal", "d": "sleep"}
    came_back = {"kind": "signal", "signal": signal_payload("b")}
    events = [
        event("a", 0, "run:complete", {"result": {"parked": {"kind": "sleep", "signal": None}}}),
        event("b", 0, "run:complete", {"result": {"parked": came_back}}),
        # c ended without its signal (a wrong payload); d failed.
        event("c", 0, "run:complete", {"result": {"parked": {"kind": "signal", "signal": "x"}}}),
        event("d", 0, "run:error", {"code": "wait_timeout", "message": "late"}),
    ]
    notes = [
        {"turn": "a", "phase": "park", "pid": 10},
        {"turn": "a", "phase": "park", "pid": 11},  # the replay on the new owner
        {"turn": "a", "phase": "resume", "pid": 11},
        {"turn": "b", "phase": "park", "pid": 10},
        {"turn": "b", "phase": "resume", "pid": 10},
    ]
    f = verify.Findings()
    check_parked(parked, events, notes, f)
    assert f.counts["parked_not_resumed"] == 2, f.examples
    assert f.counts["parked_handed_over"] == 1  # a: parked in 10, back in 11; b stayed
    assert f.counts["parked_turns"] == 4


def test_longest_stall_is_the_longest_lag_without_a_turn_ending() -> None:
    samples = [(0.0, 0, 1), (2.0, 9, 1), (4.0, 7, 2), (6.0, 3, 2), (8.0, 0, 1), (10.0, 4, 1)]
    # Lag from t=2 to t=8; turns end at 3 and 7.5: the longest stretch is 3 -> 6 (+ poll).
    assert longest_stall(samples, [3.0, 7.5]) == 4.5
    assert longest_stall(samples, [2.0, 4.0, 6.0, 8.0, 10.0]) == 2.0
    assert longest_stall([(0.0, 0, 1), (2.0, 0, 1)], []) == 0.0


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_autoscale_quick_run_scales_both_ways_and_loses_nothing(
    kafka_bootstrap_servers: str, tmp_path: Path
) -> None:
    pytest.importorskip("openai")  # the workers' model client
    result = run_autoscale(
        AutoscaleConfig.quick(
            seed=20261207,
            bootstrap_servers=kafka_bootstrap_servers,
            run_dir=str(tmp_path / "autoscale"),
        )
    )
    c = result.counts
    detail = json.dumps({k: result.examples.get(k) for k in result.examples}, default=str)
    for key in (
        *GATE_KEYS,
        "parked_not_resumed",
        "worker_crashes",
        "seq_gaps",
        "journal_gaps",
        "missing_effects",
        "failed_turns",
        "wrong_results",
        "dead_letters",
    ):
        assert c[key] == 0, (key, detail, c)
    assert c["scale_ups"] >= 3 and c["scale_downs"] >= 3, c["scale_events"]
    assert c["parked_handed_over"] >= 1, c
    assert c["parked_turns"] == c["turns"] // 5
    assert all(code == 0 for code in c["worker_exit_codes"]), c["worker_exit_codes"]
    assert result.ok
