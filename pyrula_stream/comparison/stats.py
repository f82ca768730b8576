"""The statistics of comparing two versions: intervals and tests, as pure functions.

Pass rates are proportions: each version's 95% interval is Wilson's score interval, the
difference's is Newcombe's hybrid score interval (his method 10), which keeps its
coverage near 95% for small samples and rates near 0 or 1, where the textbook Wald
interval does not; the p-value is the two-proportion z-test's. Numeric scores are means:
each version's interval is Student's t, the difference's is Welch's (unequal variances),
with the Welch-Satterthwaite degrees of freedom. A difference is significant when its
interval leaves out 0.

scipy is not a dependency for three functions: the normal CDF comes from ``math.erfc``,
Student's t CDF from the regularized incomplete beta function (Lentz's continued
fraction), and its quantile from bisection on that CDF.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Z_95 = 1.959963984540054
"""The 97.5th percentile of the standard normal: a two-sided 95% interval."""


@dataclass(frozen=True, slots=True)
class Interval:
    low: float
    high: float

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


@dataclass(frozen=True, slots=True)
class Estimate:
    """One version's figure: ``n`` scores, their pass rate or mean, its 95% interval."""

    n: int
    value: float
    interval: Interval


@dataclass(frozen=True, slots=True)
class Difference:
    """``b - a`` with its 95% interval and the p-value of "no difference"."""

    value: float
    interval: Interval
    p_value: float
    method: str

    @property
    def significant(self) -> bool:
        return self.interval.excludes_zero()

    @property
    def verdict(self) -> str:
        """Plain words: ``not yet significant``, or which way the difference goes."""
        if not self.significant:
            return "not yet significant"
        return "significantly higher" if self.value > 0 else "significantly lower"


def normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def wilson(successes: int, n: int, z: float = Z_95) -> Estimate:
    """Wilson's score interval of a proportion (``n`` = 0 gives the whole of [0, 1])."""
    if n < 0 or not 0 <= successes <= max(n, 0):
        raise ValueError(f"wilson: need 0 <= successes <= n, got {successes}/{n}")
    if n == 0:
        return Estimate(0, math.nan, Interval(0.0, 1.0))
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return Estimate(n, p, Interval(max(0.0, centre - half), min(1.0, centre + half)))


def newcombe(successes_a: int, n_a: int, successes_b: int, n_b: int) -> Difference:
    """The difference of two pass rates ``b - a``: Newcombe's hybrid score interval and
    the pooled two-proportion z-test."""
    if n_a == 0 or n_b == 0:
        return Difference(math.nan, Interval(-1.0, 1.0), 1.0, "newcombe")
    a, b = wilson(successes_a, n_a), wilson(successes_b, n_b)
    d = b.value - a.value
    low = d - math.sqrt((b.value - b.interval.low) ** 2 + (a.interval.high - a.value) ** 2)
    high = d + math.sqrt((b.interval.high - b.value) ** 2 + (a.value - a.interval.low) ** 2)
    pooled = (successes_a + successes_b) / (n_a + n_b)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    p_value = 1.0 if se == 0 else 2 * (1 - normal_cdf(abs(d) / se))
    return Difference(d, Interval(low, high), min(1.0, p_value), "newcombe")


def mean_estimate(values: list[float]) -> Estimate:
    """A mean with Student's t interval (a single value has no spread: its interval is
    unbounded)."""
    n = len(values)
    if n == 0:
        return Estimate(0, math.nan, Interval(-math.inf, math.inf))
    mean = sum(values) / n
    if n == 1:
        return Estimate(1, mean, Interval(-math.inf, math.inf))
    half = t_quantile(0.975, n - 1) * math.sqrt(_variance(values, mean) / n)
    return Estimate(n, mean, Interval(mean - half, mean + half))


def welch(a: list[float], b: list[float]) -> Difference:
    """The difference of two means ``mean(b) - mean(a)``: Welch's t interval and test."""
    if len(a) < 2 or len(b) < 2:
        return Difference(math.nan, Interval(-math.inf, math.inf), 1.0, "welch")
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    va, vb = _variance(a, mean_a) / len(a), _variance(b, mean_b) / len(b)
    d = mean_b - mean_a
    se = math.sqrt(va + vb)
    if se == 0:  # two constant samples: the difference is exact
        return Difference(d, Interval(d, d), 1.0 if d == 0 else 0.0, "welch")
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = t_quantile(0.975, df) * se
    p_value = 2 * (1 - t_cdf(abs(d) / se, df))
    return Difference(d, Interval(d - half, d + half), p_value, "welch")


def _variance(values: list[float], mean: float) -> float:
    return sum((v - mean) ** 2 for v in values) / (len(values) - 1)


def t_cdf(t: float, df: float) -> float:
    """Student's t CDF with ``df`` (real, > 0) degrees of freedom."""
    if df <= 0:
        raise ValueError(f"t_cdf: degrees of freedom must be > 0, got {df}")
    tail = 0.5 * regularized_beta(df / (df + t * t), df / 2, 0.5)
    return 1 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (bisection on ``t_cdf``, to 1e-12)."""
    if not 0 < p < 1:
        raise ValueError(f"t_quantile: p must be in (0, 1), got {p}")
    low, high = -1.0, 1.0
    while t_cdf(low, df) > p:
        low *= 2
    while t_cdf(high, df) < p:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low < 1e-12:
            break
    return (low + high) / 2


def regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), by the continued fraction on whichever side converges fast."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _beta_fraction(x, a, b) / a
    return 1 - math.exp(log_front) * _beta_fraction(1 - x, b, a) / b


def _beta_fraction(x: float, a: float, b: float) -> float:
    """The incomplete beta continued fraction, by the modified Lentz method."""
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < eps:
            break
    return h
