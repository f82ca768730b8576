"""The benchmark still runs: ``--quick`` against the suite's broker, JSON line checked.

A benchmark is not a test, so nothing here looks at a timing: only that every phase ran
and reported each key with a sane type.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pyrula_stream.bench.harness import machine
from pyrula_stream.bench.headline import HEADLINE_KEYS
from pyrula_stream.bench.targets import baseline_table

NUMBER_KEYS = (
    *HEADLINE_KEYS,
    "in_flight",
    "inflight_turns_per_s",
    "inflight_fraction_of_ideal",
    "in_worker_overhead_p50_ms",
    "journal_linear_r2",
    "live_journal_bytes_per_finished_turn",
    "restore_live_entries",
    "thread_restore_threads_per_s",
    "memory_visible_ms_p50",
    "soak_turns",
    "telemetry_turns_per_s_off",
    "telemetry_turns_per_s_on",
    "telemetry_overhead_p50_ms_off",
    "telemetry_overhead_p50_ms_on",
    "parked_turns_per_worker",
    "call_round_trip_p50_ms",
    "call_round_trip_p99_ms",
    "turns",
    "seconds",
    "latency_floor_p50_ms",
    "latency_floor_p99_ms",
    "cpu_ms_per_turn",
    "turns_per_s_1_process",
    "turns_per_s_2_processes",
    "turns_per_s_20_steps",
    "broker_share_of_cores_2_processes",
    "turns_per_s_all_cores",
    "ratio_all_cores",
    "all_cores_processes",
    "latency_floor_two_commit_p50_ms",
    "latency_floor_two_commit_p99_ms",
    "baseline_ratio",
    "baseline_cpu_ms_per_turn",
    "baseline_cpu_ms_per_step",
    "loop_stall_max_ms",
    "loop_stall_max_ms_expiring",
    "keyed_turns_per_s",
    "keyed_expired_keys",
    "cpu_ms_per_turn_200ms_model",
    "cpu_ms_per_turn_2s_model",
    "records_per_turn",
    "records_per_turn_200ms_model",
    "records_per_turn_2s_model",
    "inflight_cpu_ms_per_turn",
    "in_flight_together",
    "inflight_together_fraction_of_ideal",
    "inflight_together_rss_kb_per_inflight_turn",
    "inflight_together_cpu_ms_per_turn",
)
SIGNED_KEYS = (
    "overhead_over_floor_p50_ms",
    "overhead_over_floor_p99_ms",
    "cpu_ms_per_step",
    "cpu_ms_per_step_200_steps",
    "overhead_over_floor_effect_p50_ms",
    "overhead_over_floor_effect_p99_ms",
    "telemetry_cost_fraction",
    "rss_kb_per_parked_turn",
    "tracemalloc_kb_per_parked_turn",
    "telemetry_cpu_cost_fraction",
    "payload_added_latency_ms_per_mb_local",
    "payload_added_latency_ms_per_mb_s3",
    "payload_cpu_ms_per_mb_local",
    "payload_cpu_ms_per_mb_s3",
)
"""Differences of two measured figures: on a tiny run either side can be the larger."""


@pytest.mark.slow
def test_quick_bench_prints_every_figure(kafka_bootstrap_servers: str, tmp_path: Path) -> None:
    docs = tmp_path / "BENCHMARKS.md"
    baseline = baseline_table(
        [
            {
                "cpu": machine()["cpu"],
                "commit": "b71eb38",
                "ratio": 0.071,
                "cpu_ms_per_turn": 1.67,
                "cpu_ms_per_step": 0.98,
            }
        ]
    )
    docs.write_text(f"# Benchmarks\n\nprose stays\n\n{baseline}\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pyrula_stream.bench",
            "--quick",
            "--bootstrap-servers",
            kafka_bootstrap_servers,
            "--out-dir",
            str(tmp_path / "results"),
            "--write-docs",
            "--docs",
            str(docs),
        ],
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    figures = json.loads(last)
    for key in NUMBER_KEYS:
        value = figures[key]
        assert isinstance(value, int | float) and not isinstance(value, bool), (key, value)
        assert value >= 0, (key, value)
    # RSS can shrink over a short soak, so this figure may be negative; it must be there.
    for key in ("rss_bytes_per_finished_turn", *SIGNED_KEYS):
        value = figures[key]
        assert isinstance(value, int | float) and not isinstance(value, bool), (key, value)
    assert figures["quick"] is True
    assert (figures["baseline_ratio"], figures["baseline_commit"]) == (0.071, "b71eb38")
    assert figures["targets_met"] + figures["targets_missed"] >= 1
    assert figures["ratio"] > 0
    assert 0 < figures["journal_linear_r2"] <= 1.0

    results = json.loads(Path(figures["results_file"]).read_text())
    assert {
        "throughput",
        "latency",
        "cpu",
        "concurrency",
        "journal",
        "restore",
        "soak",
        "subagents",
        "gateway",
        "keyed",
        "payloads",
        "cost",
        "machine",
        "baseline",
        "targets",
    } <= set(results)
    for store in ("local", "s3"):  # each size stored by reference: request and result
        runs = results["payloads"][store]["runs"]
        assert [r["value_bytes"] for r in runs] == [1_000, 1_000_000, 5_000_000]
        assert runs[0]["mb_put_per_turn"] == 0 < runs[1]["mb_put_per_turn"]
    assert [s["steps"] for s in results["journal"]["sizes"]] == [1, 5, 20]
    assert len(results["throughput"]["framework_runs"]) == len(results["throughput"]["floor_runs"])
    assert [(r["processes"], r["steps_per_turn"]) for r in results["cpu"]["runs"]] == [
        (1, 1),
        (2, 1),
        (1, 20),
    ]
    assert [r["model_latency_s"] for r in results["cpu"]["model_latency_runs"]] == [0.2, 2.0]
    assert figures["records_per_turn_200ms_model"] > 0 < figures["records_per_turn"]
    assert results["concurrency"]["model_latency_spread"] > 0  # the spread run
    assert results["concurrency"]["together"]["model_latency_spread"] == 0
    assert "step_cost_growth" in figures  # from the long_turns phase
    assert results["cpu"]["broker_measured"] is True  # the suite's broker runs here
    assert len(results["latency"]["floor_latencies_ms"]) == results["latency"]["turns"]
    lat = results["latency"]
    assert len(lat["floor_two_commit_latencies_ms"]) == lat["turns"]
    # Two transactions per input (warm-up included) against one for the read-only floor.
    assert lat["floor_two_commit_transactions"] == 2 * lat["floor_transactions"]
    assert Path(results["plot"]).stat().st_size > 0
    # issue 47's ten rows, issue 27's seven others, issue 49's two
    assert len(results["targets"]) == 20
    tp = results["throughput"]
    assert [r["turns"] for r in tp["floor_runs"]] == [tp["floor_turns"]] * len(tp["floor_runs"])
    assert len(tp["ratio_per_pair"]) == len(tp["framework_runs"])
    assert tp["ratio_spread"]["min"] <= figures["ratio"] <= tp["ratio_spread"]["max"]
    assert isinstance(figures["floor_unstable"], bool)  # two rounds: the floor can say
    for side in ("framework", "floor"):  # the suite's broker runs here: its CPU is read
        assert all(r["broker_cpu_ms_per_turn"] > 0 for r in tp[f"{side}_runs"]), side
    assert lat["overhead_over_floor_pairs"] == lat["turns"]
    machine_seen = results["machine"]
    assert 0 <= machine_seen["steal_fraction"] <= 1
    assert machine_seen["load_avg_1m_at_end"] >= 0
    assert results["subagents"]["parked_at_end"] >= results["subagents"]["parked_turns"]
    assert results["throughput"]["written_per_turn"]["results_records_per_turn"] == 1.0
    gateway = results["gateway"]
    assert gateway["events_measured_sse"] == gateway["events_measured_client"] > 0
    assert isinstance(figures["gateway_added_p50_ms"], float)
    text = docs.read_text()
    assert "prose stays" in text
    assert baseline in text  # --write-docs rewrote the results, not the baseline
    assert (
        "| 27 | ratio framework / floor, one process, against the baseline | 0.071 "
        "| >= 2 x baseline |" in text
    )
    assert "| ratio framework / floor, median of per-round ratios (min - max) |" in text
    assert "load average (1 min)" in text
    assert "| RSS per finished turn over 1,000 turns (bytes) |" in text
    assert "| worker CPU per turn, own process (ms) |" in text
    assert "| latency floor p50 / p99, raw loop, same rate (ms) |" in text
