"""Turning a results dict into the headline JSON, a table, a plot and the docs section.

Every figure in ``docs/BENCHMARKS.md`` comes from ``markdown(results)``: the bench
rewrites the part of that file between the two markers, so no figure is typed by hand.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

from pyrula_stream.bench.targets import markdown_targets

DOCS_BEGIN = "<!-- bench:results:begin (written by python -m pyrula_stream.bench) -->"
DOCS_END = "<!-- bench:results:end -->"
PLOTS_DIR = "plots"
"""Beside the docs page: where the page's plot is copied (see ``docs_plot``)."""


def _run_of(cpu: dict[str, Any], processes: int, steps: int = 1) -> dict[str, Any]:
    """The CPU phase's run with that many processes and steps per turn ({} if none)."""
    for run in cpu.get("runs", []):
        if run["processes"] == processes and run["steps_per_turn"] == steps:
            return dict(run)
    return {}


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def rows(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(figure, value, target)`` rows shared by the terminal table and the docs."""
    tp = results.get("throughput")
    lat = results.get("latency")
    conc = results.get("concurrency")
    jr = results.get("journal")
    rs = results.get("restore")
    soak = results.get("soak")
    sub = results.get("subagents")
    th = results.get("threads")
    out: list[tuple[str, str, str]] = []
    if tp:
        n = len(tp["framework_runs"])
        out += [
            (
                f"framework turns/s (median of {n}, {tp['turns']:,} turns)",
                _fmt(tp["framework_turns_per_s"]),
                "",
            ),
            (f"floor turns/s (median of {n})", _fmt(tp["floor_turns_per_s"]), ""),
            ("ratio framework / floor", _fmt(tp["ratio"], 3), ">= 2 x baseline"),
        ]
        if tp.get("ratio_all_cores") is not None:
            out += [
                (
                    f"framework turns/s, {tp['all_cores_processes']} worker processes "
                    "(`--processes auto`)",
                    _fmt(tp["turns_per_s_all_cores"]),
                    "",
                ),
                ("  ratio, all cores / floor", _fmt(tp["ratio_all_cores"], 3), ">= 0.25"),
            ]
    if lat:
        out += [
            (
                f"overhead per turn p50, {_fmt(lat['model_latency_ms'], 0)} ms model (ms)",
                _fmt(lat["overhead_p50_ms"]),
                "",
            ),
            ("overhead per turn p99 (ms)", _fmt(lat["overhead_p99_ms"]), ""),
            (
                "latency floor p50 / p99, raw loop, same rate (ms)",
                _fmt(lat.get("latency_floor_p50_ms"))
                + " / "
                + _fmt(lat.get("latency_floor_p99_ms")),
                "",
            ),
            (
                "  overhead over the floor, read-only tool, p50 / p99 (ms)",
                _fmt(lat.get("overhead_over_floor_p50_ms"))
                + " / "
                + _fmt(lat.get("overhead_over_floor_p99_ms")),
                "<= 5 / <= 15",
            ),
            (
                "tool with effects: overhead per turn p50 / p99 (ms)",
                _fmt(lat.get("effect_overhead_p50_ms"))
                + " / "
                + _fmt(lat.get("effect_overhead_p99_ms")),
                "",
            ),
            (
                "  two-commit latency floor p50 / p99 (ms)",
                _fmt(lat.get("latency_floor_two_commit_p50_ms"))
                + " / "
                + _fmt(lat.get("latency_floor_two_commit_p99_ms")),
                "",
            ),
            (
                "  overhead over the two-commit floor, p50 / p99 (ms)",
                _fmt(lat.get("overhead_over_floor_effect_p50_ms"))
                + " / "
                + _fmt(lat.get("overhead_over_floor_effect_p99_ms")),
                "<= 5 / <= 15",
            ),
            ("  mean transaction commit (ms)", _fmt(lat.get("commit_ms_mean")), ""),
            (
                "  inside the worker, p50 / p99 (ms)",
                _fmt(lat["in_worker_overhead_p50_ms"])
                + " / "
                + _fmt(lat["in_worker_overhead_p99_ms"]),
                "",
            ),
        ]
    cpu = results.get("cpu")
    if cpu:
        many = _run_of(cpu, 1, cpu["steps"])
        of = f" (median of {cpu['rounds']})" if cpu["rounds"] > 1 else ""
        out += [
            (
                f"worker CPU per turn, own process{of} (ms)",
                _fmt(cpu["cpu_ms_per_turn"], 3),
                "<= 0.5 x baseline",
            ),
            (
                f"  CPU per step, ({cpu['steps']} steps - 1 step) / {cpu['steps'] - 1} (ms)",
                _fmt(cpu["cpu_ms_per_step"], 3),
                "<= 0.4 x baseline",
            ),
            (
                f"  CPU per step at {cpu.get('long_steps', '-')} steps (ms)",
                _fmt(cpu.get("cpu_ms_per_step_200_steps"), 3),
                "",
            ),
            (
                f"  step cost growth, per-step CPU at {cpu.get('long_steps', '-')} / "
                f"at {cpu['steps']} steps",
                _fmt(cpu.get("step_cost_growth"), 2),
                "<= 1.3",
            ),
            (
                f"  turns/s at 1 / {cpu['steps']} steps per turn",
                f"{_fmt(cpu['turns_per_s_1_step'])} / {_fmt(many.get('turns_per_s'))}",
                "",
            ),
            (
                f"turns/s with 1 / 2 worker processes{of}",
                f"{_fmt(cpu['turns_per_s_1_process'])} / {_fmt(cpu['turns_per_s_2_processes'])}",
                "",
            ),
            (
                "  cores used by broker, 1 / 2 processes (of "
                f"{results.get('machine', {}).get('logical_cores', '?')})",
                _fmt(cpu["broker_cores_used_1_process"], 2)
                + " / "
                + _fmt(cpu["broker_cores_used_2_processes"], 2),
                "",
            ),
        ]
    if conc:
        out += [
            (
                f"{conc['in_flight']:,} in flight, {_fmt(conc['model_latency_s'], 0)} s model: "
                "turns/s (ideal)",
                f"{_fmt(conc['turns_per_s'])} ({_fmt(conc['ideal_turns_per_s'])})",
                "",
            ),
            ("  fraction of ideal", _fmt(conc["fraction_of_ideal"], 3), ">= 0.85"),
            ("RSS per in-flight turn (KB)", _fmt(conc["rss_kb_per_inflight_turn"]), "<= 20"),
        ]
    if jr:
        per_turn = " / ".join(_fmt(s["bytes_per_turn"], 0) for s in jr["sizes"])
        steps = "/".join(str(s["steps"]) for s in jr["sizes"])
        out += [
            ("journal bytes per step (slope)", _fmt(jr["journal_bytes_per_step"]), "linear"),
            (f"  bytes per turn of {steps} steps (R² {jr['linear_r2']})", per_turn, ""),
            ("journal bytes live per finished turn", _fmt(jr["live_bytes_per_finished_turn"]), ""),
        ]
    for r in rs or []:
        out.append(
            (
                f"restore {r['live_entries']:,} live entries: records/s (takeover s)",
                f"{_fmt(r['records_per_s'])} ({_fmt(r['takeover_s'], 2)})",
                ">= 100,000",
            )
        )
    if sub:
        out += [
            (
                f"parked turns on one worker, timer an hour ahead ({sub['max_concurrent_turns']} "
                f"slots, {sub['running_while_parked']} running)",
                _fmt(sub["parked_turns"]),
                "> slots",
            ),
            (
                "  RSS per parked turn, fresh process (KB)",
                _fmt(sub["rss_kb_per_parked_turn"], 3),
                "<= 0.5",
            ),
            (
                f"  traced Python heap per parked turn, tracemalloc "
                f"({_fmt(sub.get('tracemalloc_parked_turns'))} more) (KB)",
                _fmt(sub.get("tracemalloc_kb_per_parked_turn"), 3),
                "",
            ),
            (
                f"call_agent round trip, model-free child, p50 / p99 (ms, {sub['round_trips']})",
                _fmt(sub["call_round_trip_p50_ms"]) + " / " + _fmt(sub["call_round_trip_p99_ms"]),
                "",
            ),
        ]
    if th:
        out += [
            (
                f"restore {th['threads']:,} threads of {th['turns_per_thread']} turns: threads/s",
                _fmt(th["thread_restore_threads_per_s"]),
                "",
            ),
            (
                "memory write visible on another worker, p50 / p99 (ms)",
                _fmt(th["memory_visible_ms_p50"]) + " / " + _fmt(th["memory_visible_ms_p99"]),
                "",
            ),
        ]
    if soak:
        out.append(
            (
                f"RSS per finished turn over {soak['turns']:,} turns (bytes)",
                _fmt(soak["rss_bytes_per_finished_turn"]),
                "<= 20",
            )
        )
    gw = results.get("gateway")
    if gw:
        out += [
            (
                f"gateway: {gw['streams']} SSE streams, added to an event's way to the client "
                "p50 / p99 (ms)",
                _fmt(gw["gateway_added_p50_ms"]) + " / " + _fmt(gw["gateway_added_p99_ms"]),
                "",
            ),
            (
                "  event made -> SSE client p50 / p99; -> KafkaAgentClient.stream (ms)",
                f"{_fmt(gw['sse_p50_ms'])} / {_fmt(gw['sse_p99_ms'])}; "
                f"{_fmt(gw['client_p50_ms'])} / {_fmt(gw['client_p99_ms'])}",
                "",
            ),
            ("  gateway RSS per open stream (KB)", _fmt(gw["gateway_kb_per_stream"]), ""),
        ]
    tel = results.get("telemetry")
    if tel:
        what = "metrics + tracing" if tel["tracing_exported"] else "metrics (no OTel SDK)"
        out += [
            (
                f"{what}: turns/s off / on (cost %)",
                f"{_fmt(tel['turns_per_s_off'])} / {_fmt(tel['turns_per_s_on'])} "
                f"({_fmt(tel['turns_per_s_cost_pct'])})",
                "",
            ),
            (
                f"  throughput lost to telemetry (fraction; {_sampled(tel)})",
                _fmt(tel.get("telemetry_cost_fraction"), 3),
                "<= 0.10",
            ),
        ]
        if tel.get("turns_per_s_every_turn") is not None:
            out.append(
                (
                    "  every turn traced: turns/s; throughput lost (fraction)",
                    f"{_fmt(tel['turns_per_s_every_turn'])}; "
                    f"{_fmt(tel.get('telemetry_cost_fraction_every_turn'), 3)}",
                    "",
                )
            )
        out += [
            (
                f"{what}: overhead p50 off / on (ms)",
                f"{_fmt(tel['overhead_p50_ms_off'])} / {_fmt(tel['overhead_p50_ms_on'])}",
                "",
            ),
        ]
    return out


def _sampled(tel: dict[str, Any]) -> str:
    """Which turns the "on" arm traced: the worker's default sampler's share."""
    ratio = tel.get("trace_ratio")
    return f"1 turn in {round(1 / ratio)} traced" if ratio else "as the provider samples"


def table(results: dict[str, Any]) -> str:
    """The human table printed before the JSON line."""
    m = results["machine"]
    body = rows(results)
    w0 = max([len(r[0]) for r in body] + [6])
    w1 = max([len(r[1]) for r in body] + [5])
    lines = [
        "",
        f"== pyrula-stream bench, {results['date']} ==",
        f"machine: {m['logical_cores']} cores, {m['memory_gb']} GB, {m['cpu']}; "
        f"broker: {results['broker']}",
        f"{'figure':<{w0}}  {'value':>{w1}}  target",
    ]
    lines += [f"{a:<{w0}}  {b:>{w1}}  {c}" for a, b, c in body]
    return "\n".join(lines)


def write_json(results: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")


def markdown(results: dict[str, Any], plot_link: str | None) -> str:
    """The docs section: command, machine, the figures, and the plot of this run."""
    m = results["machine"]
    out = [
        DOCS_BEGIN,
        "",
        f"Run of {results['date']}, {results['seconds']:.0f} s in all:",
        "",
        "```",
        results["command"].strip(),
        "```",
        "",
        f"- Machine: {m['logical_cores']} logical cores ({m['physical_cores']} physical), "
        f"{m['memory_gb']} GB memory, {m['cpu']}; {m['os']}; 1-minute load average "
        f"{m.get('load_avg_1m_at_start', '?')} when the run started",
        f"- Python {m['python']}, confluent-kafka {m['confluent_kafka']}, "
        f"librdkafka {m['librdkafka']}, event loop {m.get('event_loop', 'asyncio')}",
        f"- Broker: {results['broker']}",
    ]
    if results.get("config", {}).get("quick"):
        out += ["", "A `--quick` run: tiny sizes that prove the bench runs, not measurements."]
    base = results.get("baseline")
    if results.get("targets"):
        out += [
            "",
            "Issue 27's targets"
            + (
                f", against the baseline `{base.get('commit') or '?'}` ({base.get('source')})"
                if base
                else " (no baseline for this CPU: the factors cannot be judged)"
            )
            + ":",
            "",
            *markdown_targets(results["targets"], _fmt),
        ]
    out += [
        "",
        "Every figure of the run:",
        "",
        "| figure | value | target |",
        "| --- | ---: | --- |",
    ]
    out += [f"| {a.strip()} | {b} | {c} |" for a, b, c in rows(results)]
    tp = results.get("throughput")
    if tp:
        many = tp.get("all_cores_runs") or [{} for _ in tp["framework_runs"]]
        out += ["", "Throughput runs, in the order they ran (A B C A B C):", ""]
        out += [
            "| run | framework turns/s | floor turns/s | framework, all cores, turns/s |",
            "| --- | ---: | ---: | ---: |",
        ]
        for i, (a, b, c) in enumerate(
            zip(tp["framework_runs"], tp["floor_runs"], many, strict=False)
        ):
            out.append(
                f"| {i + 1} | {_fmt(a['turns_per_s'])} | {_fmt(b['turns_per_s'])} "
                f"| {_fmt(c.get('turns_per_s'))} |"
            )
        w = tp["written_per_turn"]
        if w:
            out += [
                "",
                "Records the framework wrote per turn (and the floor copies): "
                f"{_fmt(w.get('journal_records_per_turn'))} journal records "
                f"({_fmt(w.get('journal_tombstones_per_turn'))} of them tombstones, "
                f"{_fmt(w.get('journal_bytes_per_turn'), 0)} bytes), "
                f"{_fmt(w.get('events_records_per_turn'))} events "
                f"({_fmt(w.get('events_bytes_per_turn'), 0)} bytes) and "
                f"{_fmt(w.get('results_records_per_turn'))} result record "
                f"({_fmt(w.get('results_bytes_per_turn'), 0)} bytes).",
            ]
    if plot_link:
        out += ["", f"![throughput, latency, journal and restore of this run]({plot_link})"]
    out += ["", DOCS_END]
    return "\n".join(out)


def docs_plot(png_path: Path, docs: Path) -> str:
    """Copy the plot into ``plots/`` beside the docs page and return its relative link.

    The docs site serves only its own folder, so a link to ``bench/results/`` would be a
    broken image there; the folder keeps only the plot the page shows.
    """
    folder = docs.parent / PLOTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.png"):
        if old.name != png_path.name:
            old.unlink()
    shutil.copyfile(png_path, folder / png_path.name)
    return f"{PLOTS_DIR}/{png_path.name}"


def refresh_docs(path: Path, section: str) -> None:
    """Replace the marked section of ``path`` (append it when the markers are missing)."""
    text = path.read_text() if path.exists() else ""
    begin, end = text.find(DOCS_BEGIN), text.find(DOCS_END)
    if begin >= 0 and end > begin:
        text = text[:begin] + section + text[end + len(DOCS_END) :]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    path.write_text(text)
