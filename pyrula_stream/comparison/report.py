"""The report of ``pyrula-stream evals report``: each evaluator's scores by agent version.

Scores are grouped by evaluator (and evaluator version: two versions of a judge are two
instruments) and by the agent version that answered (the experiment's variant). Each
group gets its sample size and its pass rate (``passed``) or mean (``number``) with a 95%
interval; every other version is compared with a baseline (``--baseline``, else the
version with the most scores, which an experiment gives to its control) by the
difference's 95% interval and p-value (``stats``). The verdict is in words: "not yet
significant" while the interval holds 0, else which way the candidate differs. Labels
are counted per version, without a test.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from pyrula_stream.comparison.stats import (
    Difference,
    Estimate,
    mean_estimate,
    newcombe,
    welch,
    wilson,
)
from pyrula_stream.wire.scores import Score

Measure = Literal["pass_rate", "mean"]


@dataclass(frozen=True)
class VersionFigures:
    """One agent version's scores by one evaluator."""

    version: str
    estimate: Estimate
    timed_out: int = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "n": self.estimate.n,
            "value": _number(self.estimate.value),
            "ci95": [_number(self.estimate.interval.low), _number(self.estimate.interval.high)],
            "timed_out": self.timed_out,
        }


@dataclass(frozen=True)
class Comparison:
    """``candidate - baseline`` for one evaluator and measure."""

    baseline: str
    candidate: str
    difference: Difference

    def as_json(self) -> dict[str, Any]:
        d = self.difference
        return {
            "baseline": self.baseline,
            "candidate": self.candidate,
            "difference": _number(d.value),
            "ci95": [_number(d.interval.low), _number(d.interval.high)],
            "p_value": None if math.isnan(d.p_value) else float(f"{d.p_value:.4g}"),
            "method": d.method,
            "significant": d.significant,
            "verdict": d.verdict,
        }


@dataclass(frozen=True)
class MeasureReport:
    """One evaluator's pass rate or mean, per version, and the comparisons."""

    evaluator: str
    evaluator_version: str
    measure: Measure
    versions: list[VersionFigures]
    comparisons: list[Comparison]

    def as_json(self) -> dict[str, Any]:
        return {
            "evaluator": self.evaluator,
            "evaluator_version": self.evaluator_version,
            "measure": self.measure,
            "versions": [v.as_json() for v in self.versions],
            "comparisons": [c.as_json() for c in self.comparisons],
        }


@dataclass
class EvalReport:
    agent: str
    measures: list[MeasureReport] = field(default_factory=list)
    labels: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    """evaluator -> agent version -> label -> count."""
    scores: int = 0
    duplicates: int = 0
    malformed: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "scores": self.scores,
            "duplicates": self.duplicates,
            "malformed": len(self.malformed),
            "measures": [m.as_json() for m in self.measures],
            "labels": self.labels,
        }

    def text(self) -> str:
        """The report for a person at a terminal."""
        lines = [f"agent {self.agent}: {self.scores} scores"]
        if self.duplicates or self.malformed:
            lines[0] += (
                f" ({self.duplicates} duplicate copies ignored, "
                f"{len(self.malformed)} malformed records skipped)"
            )
        if not self.measures and not self.labels:
            lines.append("no scores to report")
        for m in self.measures:
            what = "pass rate" if m.measure == "pass_rate" else "mean"
            lines.append("")
            lines.append(f"{m.evaluator} (evaluator v{m.evaluator_version}): {what}")
            for v in m.versions:
                e = v.estimate
                late = f", {v.timed_out} timed out" if v.timed_out else ""
                lines.append(
                    f"  version {v.version or '(none)'}: n={e.n} {what}={_fmt(e.value, m.measure)} "
                    f"95% CI [{_fmt(e.interval.low, m.measure)}, "
                    f"{_fmt(e.interval.high, m.measure)}]{late}"
                )
            if len(m.versions) == 1:
                lines.append("  (one version has scores: nothing to compare yet)")
            for c in m.comparisons:
                d, cand, base = c.difference, c.candidate or "(none)", c.baseline or "(none)"
                verdict = f"{cand} is {d.verdict} than {base}" if d.significant else d.verdict
                lines.append(
                    f"  {cand} - {base}: {_signed(d.value, m.measure)} "
                    f"95% CI [{_signed(d.interval.low, m.measure)}, "
                    f"{_signed(d.interval.high, m.measure)}] p={d.p_value:.3g}: {verdict}"
                )
        for evaluator, by_version in self.labels.items():
            lines.append("")
            lines.append(f"{evaluator}: labels")
            for version, counts in by_version.items():
                shown = ", ".join(f"{label}={n}" for label, n in sorted(counts.items()))
                lines.append(f"  version {version or '(none)'}: {shown}")
        return "\n".join(lines)


def build_report(
    agent: str,
    scores: Iterable[Score],
    *,
    evaluator: str | None = None,
    baseline: str | None = None,
    duplicates: int = 0,
    malformed: list[str] | None = None,
) -> EvalReport:
    """Group ``scores`` (already distinct) and compare the versions."""
    chosen = [s for s in scores if evaluator is None or s.evaluator == evaluator]
    report = EvalReport(agent, scores=len(chosen), duplicates=duplicates)
    report.malformed = list(malformed or [])
    groups: dict[tuple[str, str], list[Score]] = defaultdict(list)
    for score in chosen:
        groups[(score.evaluator, score.evaluator_version)].append(score)
    for (name, version), group in sorted(groups.items()):
        passes = [s for s in group if s.passed is not None]
        numbers = [s for s in group if s.number is not None]
        if passes:
            report.measures.append(_measure(name, version, "pass_rate", passes, baseline))
        if numbers:
            report.measures.append(_measure(name, version, "mean", numbers, baseline))
        labelled = [s for s in group if s.label is not None]
        if labelled:
            counts: dict[str, Counter[str]] = defaultdict(Counter)
            for s in labelled:
                counts[s.agent_version][s.label or ""] += 1
            report.labels[name] = {v: dict(c) for v, c in sorted(counts.items())}
    return report


def _measure(
    evaluator: str,
    evaluator_version: str,
    measure: Measure,
    scores: list[Score],
    baseline: str | None,
) -> MeasureReport:
    by_version: dict[str, list[Score]] = defaultdict(list)
    for s in scores:
        by_version[s.agent_version].append(s)
    figures = [
        VersionFigures(v, _estimate(measure, group), sum(s.timed_out for s in group))
        for v, group in sorted(by_version.items())
    ]
    base = baseline if baseline in by_version else _largest(by_version)
    comparisons = [
        Comparison(base, v, _difference(measure, by_version[base], group))
        for v, group in sorted(by_version.items())
        if v != base
    ]
    return MeasureReport(evaluator, evaluator_version, measure, figures, comparisons)


def _largest(by_version: dict[str, list[Score]]) -> str:
    """The control of an experiment: the version with the most scores (ties: first name)."""
    return min(by_version, key=lambda v: (-len(by_version[v]), v))


def _estimate(measure: Measure, scores: list[Score]) -> Estimate:
    if measure == "pass_rate":
        return wilson(sum(bool(s.passed) for s in scores), len(scores))
    return mean_estimate([float(s.number or 0.0) for s in scores])


def _difference(measure: Measure, base: list[Score], other: list[Score]) -> Difference:
    if measure == "pass_rate":
        return newcombe(
            sum(bool(s.passed) for s in base),
            len(base),
            sum(bool(s.passed) for s in other),
            len(other),
        )
    return welch([float(s.number or 0.0) for s in base], [float(s.number or 0.0) for s in other])


def _number(value: float) -> float | None:
    """JSON has no NaN or infinity: an unknown figure is ``null``."""
    return None if math.isnan(value) or math.isinf(value) else round(value, 6)


def _fmt(value: float, measure: Measure) -> str:
    if math.isnan(value) or math.isinf(value):
        return "n/a"
    return f"{value:.1%}" if measure == "pass_rate" else f"{value:.4g}"


def _signed(value: float, measure: Measure) -> str:
    if math.isnan(value) or math.isinf(value):
        return "n/a"
    if measure == "pass_rate":
        return f"{value * 100:+.1f} pts"
    return f"{value:+.4g}"
