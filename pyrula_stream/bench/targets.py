"""The baseline a run is judged against, and issue 27's targets: met or missed.

CPU figures move with the machine, so the CPU targets are factors of the baseline
commit's figures on the same CPU model. The baseline comes from ``--baseline FILE`` (a
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

    def limit(self, baseline: float | None) -> float | None:
        if not self.factor:
            return self.bound
        return None if baseline is None else self.bound * baseline

    def target_text(self) -> str:
        sign = ">=" if self.op == "ge" else "<="
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


def _p(key: str, op: str, bound: float, **kw: Any) -> Part:
    return Part(key, op, bound, **kw)


TARGETS = (
    Target("ratio framework / floor, one process", (_p("ratio", "ge", 2, factor=True),)),
    Target("ratio, `--processes auto` (`ratio_all_cores`)", (_p("ratio_all_cores", "ge", 0.25),)),
    Target("worker CPU per one-step turn (ms)", (_p("cpu_ms_per_turn", "le", 0.5, factor=True),)),
    Target(
        "worker CPU per extra step, 20-step turns (ms)",
        (_p("cpu_ms_per_step", "le", 0.4, factor=True),),
    ),
    Target(
        "CPU per step at 200 steps / at 20 steps (`step_cost_growth`)",
        (_p("step_cost_growth", "le", 1.3, digits=2),),
    ),
    Target(
        "overhead over the floor, read-only tool, p50 / p99 (ms)",
        (
            _p("overhead_over_floor_p50_ms", "le", 5, digits=1),
            _p("overhead_over_floor_p99_ms", "le", 15, digits=1),
        ),
    ),
    Target(
        "overhead over the two-commit floor, tool with effects, p50 / p99 (ms)",
        (
            _p("overhead_over_floor_effect_p50_ms", "le", 5, digits=1),
            _p("overhead_over_floor_effect_p99_ms", "le", 15, digits=1),
        ),
    ),
    Target(
        "2,000 in flight, 1 s model: fraction of ideal",
        (_p("inflight_fraction_of_ideal", "ge", 0.85),),
    ),
    Target("memory per in-flight turn (KB)", (_p("rss_kb_per_inflight_turn", "le", 20, digits=1),)),
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
"""Issue 27's targets table, row for row."""


def target_rows(
    figures: Mapping[str, Any], baseline: Mapping[str, Any] | None
) -> list[dict[str, Any]]:
    """Each target with this run's figures, the baseline's, their factor and met/missed
    (``met`` None: a figure or the baseline is missing, so it cannot be judged)."""
    base = baseline or {}
    out: list[dict[str, Any]] = []
    for target in TARGETS:
        parts = []
        for part in target.parts:
            value, was = _number(figures.get(part.key)), _number(base.get(part.key))
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
        out.append({"figure": target.figure, "parts": parts, "met": met})
    return out


def markdown_targets(rows: list[dict[str, Any]], fmt: Callable[[Any, int], str]) -> list[str]:
    """The results section's targets table: figure, baseline, target, this run, factor."""
    digits = {p.key: p.digits for t in TARGETS for p in t.parts}
    verdict = {True: "met", False: "missed", None: "-"}
    lines = [
        "| figure | baseline | target | this run | factor (run / baseline) | met? |",
        "| --- | ---: | --- | ---: | ---: | --- |",
    ]
    for row in rows:
        parts = row["parts"]

        def joined(name: str, parts: list[dict[str, Any]] = parts) -> str:
            return " / ".join(fmt(p[name], digits[p["key"]]) for p in parts)

        targets = " / ".join(dict.fromkeys(p["target"] for p in parts))
        lines.append(
            f"| {row['figure']} | {joined('baseline')} | {targets} | {joined('value')} "
            f"| {' / '.join(fmt(p['factor'], 2) for p in parts)} | {verdict[row['met']]} |"
        )
    return lines
