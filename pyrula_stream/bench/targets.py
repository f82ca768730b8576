"""The baseline a run is judged against, and issues 47's and 27's targets: met or missed.

CPU figures move with the machine, so the CPU targets are factors of the baseline
commit's figures on the same CPU model. Best, the baseline is measured in the same run
(``--baseline-commit``: ``measured_baseline``); else it comes from ``--baseline FILE`` (a
bench JSON of the baseline commit: the results file, or the headline line) or from the
"Baseline" section of ``docs/BENCHMARKS.md``: a table between ``BASELINE_BEGIN`` and
``BASELINE_END`` whose header cells are the headline's key names and whose ``cpu`` column
is the CPU model as ``/proc/cpuinfo`` names it. ``--write-docs`` rewrites only the
results section, so that table stays as written.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyrula_stream.bench.headline import headline

BASELINE_BEGIN = "<!-- bench:baseline:begin (read by python -m pyrula_stream.bench) -->"
BASELINE_END = "<!-- bench:baseline:end -->"

BASELINE_FIGURES = (
    "ratio",
    "ratio_all_cores",
    "cpu_ms_per_turn",
    "cpu_ms_per_step",
    "step_cost_growth",
    "overhead_over_floor_p50_ms",
    "overhead_over_floor_p99_ms",
    "overhead_over_floor_effect_p50_ms",
    "overhead_over_floor_effect_p99_ms",
    "inflight_fraction_of_ideal",
    "rss_kb_per_inflight_turn",
    "rss_kb_per_parked_turn",
    "telemetry_cost_fraction",
    "rss_bytes_per_finished_turn",
)
"""What a baseline holds: the figures of the targets table (headline key names)."""


def figures_of(data: Mapping[str, Any]) -> dict[str, float | None]:
    """The baseline figures of a bench JSON: a results file or a headline line.

    A bench older than these keys lacks some; its parked figure (read in the bench's own
    process, without the tracemalloc cross-check) is an artifact and left out; two are
    derived the way issue 27 read them:
    ``ratio_all_cores`` from the CPU phase's two-process turns/s over the floor's (on a
    2-core machine that is ``--processes auto``), ``telemetry_cost_fraction`` from the
    telemetry phase's cost in percent.
    """
    flat = dict(headline(dict(data))) if "throughput" in data or "machine" in data else dict(data)
    out = {k: _number(flat.get(k)) for k in BASELINE_FIGURES}
    if out["ratio_all_cores"] is None:
        two = _number(flat.get("turns_per_s_2_processes"))
        floor = _number(flat.get("floor_turns_per_s"))
        if two is not None and floor:
            out["ratio_all_cores"] = round(two / floor, 4)
    if flat.get("tracemalloc_kb_per_parked_turn") is None:
        out["rss_kb_per_parked_turn"] = None  # the old in-process reading: an artifact
    if out["telemetry_cost_fraction"] is None:
        pct = _number(data.get("telemetry", {}).get("turns_per_s_cost_pct"))
        if pct is not None:
            out["telemetry_cost_fraction"] = round(pct / 100, 3)
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return None if math.isnan(value) else float(value)


def read_bench_json(path: Path) -> dict[str, Any]:
    """A results file, or the bench's stdout (its last line is the headline JSON)."""
    text = path.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = json.loads(text.strip().splitlines()[-1])
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a bench JSON object")
    return data


def baseline_from_file(path: Path) -> dict[str, Any]:
    """``--baseline FILE``: the figures of that run, with its commit and CPU if it says."""
    data = read_bench_json(path)
    # A bench older than the "commit" key: a name like <stamp>-b71eb38.json says it.
    suffix = path.stem.rsplit("-", 1)[-1]
    named = suffix if len(suffix) >= 7 and all(c in "0123456789abcdef" for c in suffix) else None
    return {
        "source": str(path),
        "commit": data.get("commit") or named,
        "cpu": data.get("machine", {}).get("cpu"),
        **figures_of(data),
    }


MEASURED = {"ratio": "baseline_ratio"}
"""Baseline figures a run measures itself (``--baseline-commit``): figure -> results key
in the throughput section."""


def measured_baseline(
    results: Mapping[str, Any], typed: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """The baseline figures this run measured of ``--baseline-commit`` over the typed
    ones (``typed`` fills in what the run did not measure; None: neither)."""
    tp = results.get("throughput") or {}
    measured = {k: _number(tp.get(v)) for k, v in MEASURED.items()}
    measured = {k: v for k, v in measured.items() if v is not None}
    if not measured:
        return dict(typed) if typed is not None else None
    base = dict(typed or dict.fromkeys(BASELINE_FIGURES))
    return (
        base
        | measured
        | {
            "source": "measured in this run" + (f" (else {typed['source']})" if typed else ""),
            "commit": tp.get("baseline_commit"),
            "cpu": results.get("machine", {}).get("cpu"),
            "measured": sorted(measured),
        }
    )


def baseline_from_docs(docs: Path, cpu: str) -> dict[str, Any] | None:
    """The row of the docs' Baseline table for this CPU model (None: no such row)."""
    if not docs.exists():
        return None
    text = docs.read_text()
    begin, end = text.find(BASELINE_BEGIN), text.find(BASELINE_END)
    if begin < 0 or end < begin:
        return None
    table = [
        [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        for line in text[begin + len(BASELINE_BEGIN) : end].splitlines()
        if line.strip().startswith("|")
    ]
    if len(table) < 3:
        return None
    header = table[0]
    for cells in table[2:]:
        row = dict(zip(header, cells, strict=False))
        if row.get("cpu") == cpu:
            found: dict[str, Any] = {"source": f"{docs} (Baseline)", "commit": row.get("commit")}
            return found | {"cpu": cpu} | {k: _cell(row.get(k)) for k in BASELINE_FIGURES}
    return None


def _cell(text: str | None) -> float | None:
    if text is None or text.strip() in ("", "-", "—"):
        return None
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def baseline_table(rows: list[Mapping[str, Any]]) -> str:
    """The Baseline section's table (what ``baseline_from_docs`` reads back)."""
    header = ["cpu", "commit", *BASELINE_FIGURES]
    lines = [
        "| " + " | ".join(f"`{h}`" if h in BASELINE_FIGURES else h for h in header) + " |",
        "| " + " | ".join(["---", "---", *(["---:"] * len(BASELINE_FIGURES))]) + " |",
    ]
    for row in rows:
        cells = [str(row.get("cpu")), str(row.get("commit") or "-")]
        cells += ["-" if row.get(k) is None else f"{row[k]:g}" for k in BASELINE_FIGURES]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join([BASELINE_BEGIN, "", *lines, "", BASELINE_END])


@dataclass(frozen=True)
class Part:
    """One figure of a target row: ``value <op> bound`` (``factor``: bound x baseline)."""

    key: str
    op: str
    bound: float
    factor: bool = False
    digits: int = 3
    of: str | None = None
    """A factor of another figure of the same run (``bound x figures[of]``), not of the
    baseline: then "baseline" is that figure."""

    def limit(self, baseline: float | None) -> float | None:
        if not self.factor and self.of is None:
            return self.bound
        return None if baseline is None else self.bound * baseline

    def target_text(self) -> str:
        sign = ">=" if self.op == "ge" else "<="
        if self.of is not None:
            return f"{sign} {self.bound:g} x `{self.of}`"
        return f"{sign} {self.bound:g} x baseline" if self.factor else f"{sign} {self.bound:g}"

    def met(self, value: float | None, baseline: float | None) -> bool | None:
        limit = self.limit(baseline)
        if value is None or limit is None:
            return None
        return value >= limit if self.op == "ge" else value <= limit


@dataclass(frozen=True)
class Target:
    figure: str
    parts: tuple[Part, ...]
    issue: int = 27
    stable_floor: bool = False
    """Judged only against a floor whose own runs agreed within 15% (``floor_unstable``
    false): a ratio to a floor that moved says more about the machine than the code."""


def _p(key: str, op: str, bound: float, **kw: Any) -> Part:
    return Part(key, op, bound, **kw)


ISSUE_47 = (
    Target(
        "gateway, 5,000 SSE streams: added p50 / p99 against the Kafka client (ms)",
        (
            _p("gateway_added_p50_ms", "le", 20, digits=1),
            _p("gateway_added_p99_ms", "le", 100, digits=1),
        ),
        47,
    ),
    Target(
        "gateway memory per stream (KB)", (_p("gateway_kb_per_stream", "le", 20, digits=1),), 47
    ),
    Target(
        "20,000 in flight, spread returns: fraction of ideal",
        (_p("inflight_fraction_of_ideal", "ge", 0.9),),
        47,
    ),
    Target(
        "memory per in-flight turn (KB)", (_p("rss_kb_per_inflight_turn", "le", 16, digits=1),), 47
    ),
    Target(
        "per-step CPU at 1,000 steps / at 20, context window on (`step_cost_growth`)",
        (_p("step_cost_growth", "le", 1.1, digits=2),),
        47,
    ),
    Target(
        "overhead over the floor, read-only tool, paired p50 / p99 (ms)",
        (
            _p("overhead_over_floor_p50_ms", "le", 5, digits=1),
            _p("overhead_over_floor_p99_ms", "le", 15, digits=1),
        ),
        47,
    ),
    Target("ratio framework / floor, one process", (_p("ratio", "ge", 0.25),), 47, True),
    Target(
        "ratio, `--processes auto` (`ratio_all_cores`)",
        (_p("ratio_all_cores", "ge", 0.35),),
        47,
        True,
    ),
    Target(
        "worker CPU per turn, 200 ms model (ms)",
        (_p("cpu_ms_per_turn_200ms_model", "le", 1.3, of="cpu_ms_per_turn"),),
        47,
    ),
    Target(
        "event-loop stall, 2,000 keyed turns/s across an expiry (ms)",
        (_p("loop_stall_max_ms", "le", 50, digits=1),),
        47,
    ),
)
"""Issue 47's "Done when", row for row (the docs line is the bench's own output)."""

ISSUE_27 = (
    Target(
        "ratio framework / floor, one process, against the baseline",
        (_p("ratio", "ge", 2, factor=True),),
        stable_floor=True,
    ),
    Target("worker CPU per one-step turn (ms)", (_p("cpu_ms_per_turn", "le", 0.5, factor=True),)),
    Target(
        "worker CPU per extra step, 20-step turns (ms)",
        (_p("cpu_ms_per_step", "le", 0.4, factor=True),),
    ),
    Target(
        "overhead over the two-commit floor, tool with effects, paired p50 / p99 (ms)",
        (
            _p("overhead_over_floor_effect_p50_ms", "le", 5, digits=1),
            _p("overhead_over_floor_effect_p99_ms", "le", 15, digits=1),
        ),
    ),
    Target(
        "memory per parked turn (`rss_kb_per_parked_turn`, KB)",
        (_p("rss_kb_per_parked_turn", "le", 0.5),),
    ),
    Target(
        "metrics and tracing on, the worker's default sampler: throughput lost "
        "(`telemetry_cost_fraction`)",
        (_p("telemetry_cost_fraction", "le", 0.10),),
    ),
    Target(
        "memory per finished turn, soak (bytes)",
        (_p("rss_bytes_per_finished_turn", "le", 20, digits=1),),
    ),
)
"""Issue 27's rows that issue 47 did not tighten (its ratio_all_cores, step growth,
in-flight and overhead rows are issue 47's now, with stricter bounds)."""

ISSUE_49 = (
    Target(
        "a 20-step turn's billed input cost, the runtime's prompt caching / none "
        "(`cache_cost_fraction`)",
        (_p("cache_cost_fraction", "le", 0.35),),
        49,
    ),
    Target(
        "the same, the turn compacting its thread's history first "
        "(`cache_cost_fraction_after_compaction`)",
        (_p("cache_cost_fraction_after_compaction", "le", 0.45),),
        49,
    ),
    Target(
        "three-step backlog turns, dollars per 1,000 on the batch lane / live "
        "(`batch_cost_fraction`)",
        (_p("batch_cost_fraction", "le", 0.55),),
        49,
    ),
)
"""Issue 49's cost rows (the cost phase)."""

TARGETS = ISSUE_47 + ISSUE_27 + ISSUE_49


def target_rows(
    figures: Mapping[str, Any], baseline: Mapping[str, Any] | None
) -> list[dict[str, Any]]:
    """Each target with this run's figures, the baseline's, their factor and met/missed.

    ``met`` None is "not judged", with ``why``: a figure missing ("not measured", never
    "met"), the baseline missing, or a ratio against a floor that did not hold still.
    """
    base = baseline or {}
    unstable = figures.get("floor_unstable")
    out: list[dict[str, Any]] = []
    for target in TARGETS:
        parts = []
        for part in target.parts:
            value = _number(figures.get(part.key))
            was = _number(figures.get(part.of) if part.of else base.get(part.key))
            parts.append(
                {
                    "key": part.key,
                    "value": value,
                    "baseline": was,
                    "factor": None if value is None or not was else round(value / was, 3),
                    "target": part.target_text(),
                    "limit": part.limit(was),
                    "met": part.met(value, was),
                }
            )
        verdicts = [p["met"] for p in parts]
        met = None if None in verdicts else all(verdicts)
        why = None
        if any(p["value"] is None for p in parts):
            why = "not measured"
        elif met is None:
            why = "no baseline"
        elif target.stable_floor and unstable is not False:
            met = None
            why = "floor unstable" if unstable else "floor stability unknown"
        out.append(
            {"figure": target.figure, "issue": target.issue, "parts": parts, "met": met, "why": why}
        )
    return out


def markdown_targets(rows: list[dict[str, Any]], fmt: Callable[[Any, int], str]) -> list[str]:
    """The results section's targets table: figure, baseline, target, this run, factor."""
    digits = {p.key: p.digits for t in TARGETS for p in t.parts}
    verdict = {True: "met", False: "missed", None: "-"}
    lines = [
        "| issue | figure | baseline | target | this run | factor (run / baseline) | met? |",
        "| --- | --- | ---: | --- | ---: | ---: | --- |",
    ]
    for row in rows:
        parts = row["parts"]

        def joined(name: str, parts: list[dict[str, Any]] = parts) -> str:
            return " / ".join(fmt(p[name], digits[p["key"]]) for p in parts)

        targets = " / ".join(dict.fromkeys(p["target"] for p in parts))
        said = verdict[row["met"]] if row.get("why") is None else f"not judged: {row['why']}"
        lines.append(
            f"| {row.get('issue', 27)} | {row['figure']} | {joined('baseline')} | {targets} "
            f"| {joined('value')} | {' / '.join(fmt(p['factor'], 2) for p in parts)} | {said} |"
        )
    return lines
