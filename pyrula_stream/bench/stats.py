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
