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


def _range(spread: dict[str, Any] | None) -> str:
    """A spread's min - max, three digits (``-`` when there is none)."""
    if not spread:
        return "-"
    return f"{_fmt(spread.get('min'), 3)} - {_fmt(spread.get('max'), 3)}"


def noise_lines(results: dict[str, Any]) -> list[str]:
    """The noisy-neighbour check: load, steal, and a warning when the floor moved."""
    m = results.get("machine", {})
    lines = [
        f"load average (1 min) {_fmt(m.get('load_avg_1m_at_start'), 2)} at the start, "
        f"{_fmt(m.get('load_avg_1m_at_end'), 2)} at the end; steal "
        f"{_fmt(m.get('steal_fraction'), 4)} of CPU time ({_fmt(m.get('steal_s'), 2)} s)"
    ]
    if m.get("floor_unstable"):
        lines.append(
            f"WARNING: the floor moved {_fmt(100 * m['floor_spread'], 0)}% between its own "
            "runs (more than 15%): a noisy machine; the ratio targets are not judged"
        )
    return lines


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
            (
                f"floor turns/s (median of {n}, {tp.get('floor_turns', tp['turns']):,} inputs, "
                "own process)",
                _fmt(tp["floor_turns_per_s"]),
                "",
            ),
            (
                "  floor spread between its runs, (max - min) / median",
                _fmt(tp.get("floor_spread"), 3) + (" UNSTABLE" if tp.get("floor_unstable") else ""),
                "<= 0.15",
            ),
            (
                "ratio framework / floor, median of per-round ratios (min - max)",
                f"{_fmt(tp['ratio'], 3)} ({_range(tp.get('ratio_spread'))})",
                ">= 0.25",
            ),
            (
                "  broker CPU per turn, framework / floor (ms)",
                _fmt(tp.get("framework_broker_cpu_ms_per_turn"), 3)
                + " / "
                + _fmt(tp.get("floor_broker_cpu_ms_per_turn"), 3),
                "",
            ),
        ]
        if tp.get("ratio_all_cores") is not None:
            out += [
                (
                    f"framework turns/s, {tp['all_cores_processes']} worker processes "
                    "(`--processes auto`)",
                    _fmt(tp["turns_per_s_all_cores"]),
                    "",
                ),
                (
                    "  ratio, all cores / floor, median of per-round ratios (min - max)",
                    f"{_fmt(tp['ratio_all_cores'], 3)} "
                    f"({_range(tp.get('ratio_all_cores_spread'))})",
                    ">= 0.35",
                ),
            ]
        if tp.get("baseline_ratio") is not None:
            out += [
                (
                    f"baseline `{tp.get('baseline_commit')}` measured in this run: turns/s",
                    _fmt(tp.get("baseline_turns_per_s")),
                    "",
                ),
                (
                    "  its ratio to the same rounds' floor (min - max)",
                    f"{_fmt(tp['baseline_ratio'], 3)} ({_range(tp.get('baseline_ratio_spread'))})",
                    "",
                ),
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
                f"  overhead over the floor, read-only tool, paired p50 / p99 "
                f"({_fmt(lat.get('overhead_over_floor_pairs'))} pairs) (ms)",
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
                "  overhead over the two-commit floor, paired p50 / p99 (ms)",
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
                f"  turns/s at 1 / {cpu['steps']} steps per turn",
                f"{_fmt(cpu['turns_per_s_1_step'])} / {_fmt(many.get('turns_per_s'))}",
                "",
            ),
            (
                "  CPU per turn, 200 ms / 2 s model (ms)",
                _fmt(cpu.get("cpu_ms_per_turn_200ms_model"), 3)
                + " / "
                + _fmt(cpu.get("cpu_ms_per_turn_2s_model"), 3),
                "<= 1.3 x instant / -",
            ),
            (
                "  records written per turn, instant / 200 ms / 2 s model",
                " / ".join(
                    _fmt(cpu.get(k), 2)
                    for k in (
                        "records_per_turn",
                        "records_per_turn_200ms_model",
                        "records_per_turn_2s_model",
                    )
                ),
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
    long = results.get("long_turns")
    if long:
        out += [
            (
                f"CPU per step at {' / '.join(map(str, long['step_counts']))} steps, "
                "context window on (ms)",
                " / ".join(
                    _fmt(long.get(f"cpu_ms_per_step_{s}_steps"), 3) for s in long["step_counts"]
                ),
                "",
            ),
            (
                f"  step cost growth, per-step CPU at {max(long['step_counts'])} / "
                f"at {min(long['step_counts'])} steps",
                _fmt(long.get("step_cost_growth"), 2),
                "<= 1.1",
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
            ("  fraction of ideal", _fmt(conc["fraction_of_ideal"], 3), ">= 0.9"),
            ("RSS per in-flight turn (KB)", _fmt(conc["rss_kb_per_inflight_turn"]), "<= 16"),
            ("  worker CPU per turn (ms)", _fmt(conc.get("cpu_ms_per_turn"), 3), ""),
        ]
        together = conc.get("together")
        if together:
            out += [
                (
                    f"{together['in_flight']:,} in flight, model calls returning together "
                    f"({_fmt(together['model_latency_s'], 0)} s): fraction of ideal",
                    _fmt(together["fraction_of_ideal"], 3),
                    "",
                ),
                (
                    "  RSS per in-flight turn (KB) / worker CPU per turn (ms)",
                    _fmt(together["rss_kb_per_inflight_turn"])
                    + " / "
                    + _fmt(together.get("cpu_ms_per_turn"), 3),
                    "",
                ),
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
    keyed = results.get("keyed")
    if keyed:
        out += [
            (
                f"{keyed['rate_asked']:g} keyed turns/s asked, {keyed['expired_keys']:,} keys "
                "expired meanwhile: event-loop stall max (ms)",
                _fmt(keyed["loop_stall_max_ms"]),
                f"<= {keyed['stall_target_ms']:g}",
            ),
            (
                f"  stall max within its {keyed['expiries']} expiries / between; p99 (ms)",
                f"{_fmt(keyed['loop_stall_max_ms_expiring'])} / "
                f"{_fmt(keyed['loop_stall_max_ms_between'])}; {_fmt(keyed['loop_stall_p99_ms'])}",
                "",
            ),
            (
                "  wall-clock lateness max; p99, the machine's other work included (ms)",
                f"{_fmt(keyed['loop_stall_wall_max_ms'])}; {_fmt(keyed['loop_stall_wall_p99_ms'])}",
                "",
            ),
            (
                "  keyed turns/s achieved; worker CPU per turn (ms)",
                f"{_fmt(keyed['keyed_turns_per_s'])}; {_fmt(keyed['worker_cpu_ms_per_turn'])}",
                "",
            ),
        ]
    out += _payload_rows(results.get("payloads"))
    cost = results.get("cost") or {}
    if "cache_cost_fraction" in cost:
        cached, uncached = cost["cache_cached"], cost["cache_uncached"]
        out += [
            (
                f"{cost['cache_steps']}-step turn, {cost['cache_system_tokens']:,}-token system "
                "prompt: billed input cost, prompt caching / none",
                _fmt(cost["cache_cost_fraction"], 3),
                "<= 0.35",
            ),
            (
                "  input cost with caching / without ($)",
                f"{cached['input_cost_usd']:.4f} / {uncached['input_cost_usd']:.4f}",
                "",
            ),
            (
                "  the same for a turn that compacts its thread's history first",
                _fmt(cost["cache_cost_fraction_after_compaction"], 3),
                "<= 0.45",
            ),
        ]
    if cost.get("batch_cost_fraction") is not None:
        out += [
            (
                f"{cost['batch_turns']:,} three-step backlog turns: dollars per 1,000, "
                "batch lane / live",
                _fmt(cost["batch_cost_fraction"], 3),
                "<= 0.55",
            ),
            (
                "  drained in, batch lane / live (s)",
                f"{cost['batch_drain_s']} / {cost['live_drain_s']}",
                "",
            ),
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


def _payload_rows(payloads: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """Per store: what one more MB stored by reference adds to a turn."""
    out: list[tuple[str, str, str]] = []
    for store in ("local", "s3"):
        found = (payloads or {}).get(store)
        if not found:
            continue
        sizes = ", ".join(f"{r['value_bytes'] / 1e6:g}" for r in found["runs"][1:])
        server = found.get("server_cpu_ms_per_mb")
        out += [
            (
                f"payloads by reference, {store} store ({sizes} MB values): added latency "
                "per MB stored (ms; fit r2)",
                f"{_fmt(found['added_latency_ms_per_mb'], 2)} ({_fmt(found['latency_fit_r2'], 3)})",
                "",
            ),
            (
                "  CPU per MB stored, client and worker (ms)"
                + ("; the S3 server's apart" if server is not None else ""),
                _fmt(found["cpu_ms_per_mb"], 2)
                + (f"; {_fmt(server, 2)}" if server is not None else ""),
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
        *noise_lines(results),
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
        *(f"- {line}" for line in noise_lines(results)),
    ]
    if results.get("config", {}).get("quick"):
        out += ["", "A `--quick` run: tiny sizes that prove the bench runs, not measurements."]
    base = results.get("baseline")
    if results.get("targets"):
        out += [
            "",
            "Issue 47's and issue 27's targets"
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
        out += ["", "Throughput rounds, in the order they ran:", "", *_rounds_table(tp)]
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


def _rounds_table(tp: dict[str, Any]) -> list[str]:
    """One line per round: each side's turns/s, the broker's CPU per turn, the ratio."""
    n = len(tp["framework_runs"])
    many = tp.get("all_cores_runs") or [{}] * n
    base = tp.get("baseline_runs") or [{}] * n
    ratios = tp.get("ratio_per_pair") or [None] * n
    lines = [
        "| round | framework turns/s (broker CPU ms/turn) | floor turns/s (broker CPU "
        "ms/turn) | ratio | all cores turns/s | baseline turns/s |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for i, (a, b, c, d, r) in enumerate(
        zip(tp["framework_runs"], tp["floor_runs"], many, base, ratios, strict=False)
    ):
        lines.append(
            f"| {i + 1} | {_fmt(a['turns_per_s'])} ({_fmt(a.get('broker_cpu_ms_per_turn'), 3)})"
            f" | {_fmt(b['turns_per_s'])} ({_fmt(b.get('broker_cpu_ms_per_turn'), 3)})"
            f" | {_fmt(r, 3)} | {_fmt(c.get('turns_per_s'))} | {_fmt(d.get('turns_per_s'))} |"
        )
    return lines


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
