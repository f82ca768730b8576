"""Small statistics the figures need: percentiles, medians and a least-squares line."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation between closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def line_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """``(slope, intercept, r_squared)`` of the least-squares line through the points."""
    fit = statistics.linear_regression(xs, ys)
    mean_y = statistics.fmean(ys)
    total = sum((y - mean_y) ** 2 for y in ys)
    residual = sum((y - (fit.slope * x + fit.intercept)) ** 2 for x, y in zip(xs, ys, strict=True))
    return fit.slope, fit.intercept, 1.0 - residual / total if total else 1.0


def spread(values: Sequence[float]) -> dict[str, float | None]:
    """How far a figure's runs lie apart: min, max, quartiles and ``(max - min) / median``.

    The relative spread is what says whether the runs agree: a floor whose own runs
    differ by more than 15% of their median is no steady yardstick.
    """
    if not values:
        return {"min": None, "max": None, "p25": None, "p75": None, "relative": None}
    mid = median(values)
    return {
        "min": round(min(values), 4),
        "max": round(max(values), 4),
        "p25": round(percentile(values, 25), 4),
        "p75": round(percentile(values, 75), 4),
        "relative": round((max(values) - min(values)) / mid, 4) if mid else None,
    }


def paired_differences(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """``a[i] - b[i]`` for each pair: two runs of the same schedule, sample by sample.

    The percentiles of these differences are the overhead; the difference of two
    separate percentiles is not (each side's tail comes from different samples, so a
    p99 overhead taken that way can even be negative).
    """
    if len(a) != len(b):
        raise ValueError(f"unpaired samples: {len(a)} against {len(b)}")
    return [x - y for x, y in zip(a, b, strict=True)]


def paired_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """``a[i] / b[i]`` per pair (same round): drift between rounds cancels within one."""
    if len(a) != len(b):
        raise ValueError(f"unpaired runs: {len(a)} against {len(b)}")
    return [x / y for x, y in zip(a, b, strict=True) if y]
