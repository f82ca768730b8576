"""The headline: the one JSON object the bench prints last, flattened from a results dict.

Its own module so that both the report and the targets (which flatten a baseline bench's
JSON the same way) can use it without importing each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

HEADLINE_KEYS = (
    "turns_per_s",
    "floor_turns_per_s",
    "ratio",
    "overhead_p50_ms",
    "overhead_p99_ms",
    "journal_bytes_per_step",
    "restore_records_per_s",
    "rss_kb_per_inflight_turn",
)


def _anywhere(results: dict[str, Any], key: str) -> Any:
    """A figure from whichever phase's section reports it (None: no phase measured it)."""
    for section in results.values():
        if isinstance(section, dict) and section.get(key) is not None:
            return section[key]
    return None


def headline(results: dict[str, Any], json_path: Path | None = None) -> dict[str, Any]:
    """The last line the bench prints: the issue's eight keys, then useful extras."""
    tp = results.get("throughput", {})
    lat = results.get("latency", {})
    conc = results.get("concurrency", {})
    jr = results.get("journal", {})
    rs = results.get("restore", [])
    soak = results.get("soak", {})
    tel = results.get("telemetry", {})
    th = results.get("threads", {})
    largest = max(rs, key=lambda r: r["live_entries"]) if rs else {}
    sub = results.get("subagents", {})
    gw = results.get("gateway", {})
    fair = results.get("fairness", {})
    keyed = results.get("keyed", {})
    payloads = results.get("payloads", {})
    cost = results.get("cost") or {}
    cpu = results.get("cpu", {})
    long = results.get("long_turns") or {}
    base = results.get("baseline") or {}
    mach = results.get("machine", {})
    return {
        "turns_per_s": tp.get("framework_turns_per_s"),
        "floor_turns_per_s": tp.get("floor_turns_per_s"),
        "ratio": tp.get("ratio"),
        "overhead_p50_ms": lat.get("overhead_p50_ms"),
        "overhead_p99_ms": lat.get("overhead_p99_ms"),
        "journal_bytes_per_step": jr.get("journal_bytes_per_step"),
        "restore_records_per_s": largest.get("records_per_s"),
        "rss_kb_per_inflight_turn": conc.get("rss_kb_per_inflight_turn"),
        "latency_floor_p50_ms": lat.get("latency_floor_p50_ms"),
        "latency_floor_p99_ms": lat.get("latency_floor_p99_ms"),
        "overhead_over_floor_p50_ms": lat.get("overhead_over_floor_p50_ms"),
        "overhead_over_floor_p99_ms": lat.get("overhead_over_floor_p99_ms"),
        "latency_floor_two_commit_p50_ms": lat.get("latency_floor_two_commit_p50_ms"),
        "latency_floor_two_commit_p99_ms": lat.get("latency_floor_two_commit_p99_ms"),
        "overhead_over_floor_effect_p50_ms": lat.get("overhead_over_floor_effect_p50_ms"),
        "overhead_over_floor_effect_p99_ms": lat.get("overhead_over_floor_effect_p99_ms"),
        "turns_per_s_all_cores": tp.get("turns_per_s_all_cores"),
        "ratio_all_cores": tp.get("ratio_all_cores"),
        "ratio_min": (tp.get("ratio_spread") or {}).get("min"),
        "ratio_max": (tp.get("ratio_spread") or {}).get("max"),
        "ratio_all_cores_min": (tp.get("ratio_all_cores_spread") or {}).get("min"),
        "ratio_all_cores_max": (tp.get("ratio_all_cores_spread") or {}).get("max"),
        "floor_spread": tp.get("floor_spread"),
        "floor_unstable": tp.get("floor_unstable"),
        "framework_broker_cpu_ms_per_turn": tp.get("framework_broker_cpu_ms_per_turn"),
        "floor_broker_cpu_ms_per_turn": tp.get("floor_broker_cpu_ms_per_turn"),
        "load_avg_1m_at_start": mach.get("load_avg_1m_at_start"),
        "load_avg_1m_at_end": mach.get("load_avg_1m_at_end"),
        "steal_fraction": mach.get("steal_fraction"),
        "all_cores_processes": tp.get("all_cores_processes"),
        "cpu_ms_per_turn": cpu.get("cpu_ms_per_turn"),
        "cpu_ms_per_turn_200ms_model": _anywhere(results, "cpu_ms_per_turn_200ms_model"),
        "cpu_ms_per_step": cpu.get("cpu_ms_per_step"),
        # The long-turns phase's figures (context window on, up to 1,000 steps) when it ran.
        "cpu_ms_per_step_20_steps": long.get("cpu_ms_per_step_20_steps"),
        "cpu_ms_per_step_200_steps": long.get("cpu_ms_per_step_200_steps"),
        "cpu_ms_per_step_1000_steps": long.get("cpu_ms_per_step_1000_steps"),
        "step_cost_growth": long.get("step_cost_growth"),
        "cpu_ms_per_turn_2s_model": cpu.get("cpu_ms_per_turn_2s_model"),
        "records_per_turn": cpu.get("records_per_turn"),
        "records_per_turn_200ms_model": cpu.get("records_per_turn_200ms_model"),
        "records_per_turn_2s_model": cpu.get("records_per_turn_2s_model"),
        "turns_per_s_1_process": cpu.get("turns_per_s_1_process"),
        "turns_per_s_2_processes": cpu.get("turns_per_s_2_processes"),
        "turns_per_s_20_steps": cpu.get("turns_per_s_20_steps"),
        "broker_share_of_cores_2_processes": cpu.get("broker_share_of_cores_2_processes"),
        "in_flight": conc.get("in_flight"),
        "inflight_turns_per_s": conc.get("turns_per_s"),
        "inflight_fraction_of_ideal": conc.get("fraction_of_ideal"),
        "inflight_cpu_ms_per_turn": conc.get("cpu_ms_per_turn"),
        "in_flight_together": conc.get("together", {}).get("in_flight"),
        "inflight_together_fraction_of_ideal": conc.get("together", {}).get("fraction_of_ideal"),
        "inflight_together_rss_kb_per_inflight_turn": conc.get("together", {}).get(
            "rss_kb_per_inflight_turn"
        ),
        "inflight_together_cpu_ms_per_turn": conc.get("together", {}).get("cpu_ms_per_turn"),
        "in_worker_overhead_p50_ms": lat.get("in_worker_overhead_p50_ms"),
        "journal_linear_r2": jr.get("linear_r2"),
        "live_journal_bytes_per_finished_turn": jr.get("live_bytes_per_finished_turn"),
        "restore_live_entries": largest.get("live_entries"),
        "thread_restore_threads_per_s": th.get("thread_restore_threads_per_s"),
        "memory_visible_ms_p50": th.get("memory_visible_ms_p50"),
        "rss_bytes_per_finished_turn": soak.get("rss_bytes_per_finished_turn"),
        "soak_turns": soak.get("turns"),
        "telemetry_turns_per_s_off": tel.get("turns_per_s_off"),
        "telemetry_turns_per_s_on": tel.get("turns_per_s_on"),
        "telemetry_cost_fraction": tel.get("telemetry_cost_fraction"),
        "telemetry_trace_ratio": tel.get("trace_ratio"),
        "telemetry_turns_per_s_every_turn": tel.get("turns_per_s_every_turn"),
        "telemetry_cost_fraction_every_turn": tel.get("telemetry_cost_fraction_every_turn"),
        "telemetry_cpu_cost_fraction": tel.get("cpu_cost_fraction"),
        "telemetry_overhead_p50_ms_off": tel.get("overhead_p50_ms_off"),
        "telemetry_overhead_p50_ms_on": tel.get("overhead_p50_ms_on"),
        "parked_turns_per_worker": sub.get("parked_turns"),
        "rss_kb_per_parked_turn": sub.get("rss_kb_per_parked_turn"),
        "tracemalloc_kb_per_parked_turn": sub.get("tracemalloc_kb_per_parked_turn"),
        "call_round_trip_p50_ms": sub.get("call_round_trip_p50_ms"),
        "call_round_trip_p99_ms": sub.get("call_round_trip_p99_ms"),
        "gateway_added_p50_ms": gw.get("gateway_added_p50_ms"),
        "gateway_added_p99_ms": gw.get("gateway_added_p99_ms"),
        "gateway_kb_per_stream": gw.get("gateway_kb_per_stream"),
        "tenant_isolation_p99_ratio": fair.get("tenant_isolation_p99_ratio"),
        "loop_stall_max_ms": keyed.get("loop_stall_max_ms"),
        "loop_stall_max_ms_expiring": keyed.get("loop_stall_max_ms_expiring"),
        "loop_stall_max_ms_between": keyed.get("loop_stall_max_ms_between"),
        "keyed_turns_per_s": keyed.get("keyed_turns_per_s"),
        "keyed_expired_keys": keyed.get("expired_keys"),
        **{
            f"payload_{figure}_{store}": payloads.get(store, {}).get(figure)
            for store in ("local", "s3")
            for figure in ("added_latency_ms_per_mb", "cpu_ms_per_mb")
        },
        "cache_cost_fraction": cost.get("cache_cost_fraction"),
        "cache_cost_fraction_after_compaction": cost.get("cache_cost_fraction_after_compaction"),
        "batch_cost_fraction": cost.get("batch_cost_fraction"),
        "baseline_cpu_ms_per_turn": base.get("cpu_ms_per_turn"),
        "baseline_cpu_ms_per_step": base.get("cpu_ms_per_step"),
        "baseline_ratio": base.get("ratio"),
        "baseline_turns_per_s": tp.get("baseline_turns_per_s"),
        "baseline_commit": base.get("commit"),
        "targets_met": sum(1 for t in results.get("targets", []) if t["met"] is True),
        "targets_missed": sum(1 for t in results.get("targets", []) if t["met"] is False),
        "turns": tp.get("turns"),
        "quick": results.get("config", {}).get("quick"),
        "seconds": results.get("seconds"),
        "cores": results.get("machine", {}).get("logical_cores"),
        "results_file": str(json_path) if json_path else None,
    }
