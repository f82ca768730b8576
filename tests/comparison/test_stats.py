"""The statistics against published values: Wilson's and Newcombe's worked examples
(Newcombe 1998, Statistics in Medicine 17: 857-872 and 873-890), Student's t table, and
a closed form of the t CDF."""

from __future__ import annotations

import math

import pytest

from pyrula_stream.comparison.stats import (
    mean_estimate,
    newcombe,
    normal_cdf,
    t_cdf,
    t_quantile,
    welch,
    wilson,
)


@pytest.mark.parametrize(
    ("successes", "n", "low", "high"),
    [
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_matches_newcombes_examples(successes: int, n: int, low: float, high: float) -> None:
    estimate = wilson(successes, n)
    assert estimate.value == successes / n
    assert estimate.interval.low == pytest.approx(low, abs=5e-5)
    assert estimate.interval.high == pytest.approx(high, abs=5e-5)


@pytest.mark.parametrize(
    ("a", "b", "low", "high"),
    [
        ((48, 80), (56, 70), 0.0524, 0.3339),
        ((3, 10), (9, 10), 0.1705, 0.8090),
        ((0, 29), (5, 56), -0.0381, 0.1926),
    ],
)
def test_newcombe_matches_method_10(
    a: tuple[int, int], b: tuple[int, int], low: float, high: float
) -> None:
    diff = newcombe(a[0], a[1], b[0], b[1])
    assert diff.value == pytest.approx(b[0] / b[1] - a[0] / a[1])
    assert diff.interval.low == pytest.approx(low, abs=5e-5)
    assert diff.interval.high == pytest.approx(high, abs=5e-5)
    assert diff.significant is (low > 0)


def test_a_difference_that_straddles_zero_is_not_yet_significant() -> None:
    diff = newcombe(0, 29, 5, 56)
    assert diff.verdict == "not yet significant"
    assert diff.p_value > 0.05
    lower = newcombe(56, 70, 48, 80)
    assert lower.verdict == "significantly lower"
    assert lower.p_value < 0.05


@pytest.mark.parametrize(
    ("df", "quantile"),
    [(1, 12.7062), (5, 2.5706), (10, 2.2281), (30, 2.0423), (1000, 1.9623)],
)
def test_t_quantile_matches_the_table(df: int, quantile: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(quantile, abs=5e-5)
    assert t_quantile(0.025, df) == pytest.approx(-quantile, abs=5e-5)


@pytest.mark.parametrize("t", [-3.0, -0.5, 0.0, 0.7, 4.0])
def test_t_cdf_with_two_degrees_of_freedom_has_a_closed_form(t: float) -> None:
    assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)


def test_normal_cdf() -> None:
    assert normal_cdf(1.959963984540054) == pytest.approx(0.975, abs=1e-12)


def test_welch_on_the_textbook_samples() -> None:
    """Welch's t-test example 1 (Wikipedia): t = 2.46, df = 24.99, p = 0.021."""
    a1 = [27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7, 21.4]
    a2 = [27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5, 24.4]
    diff = welch(a1, a2)
    assert diff.value == pytest.approx(sum(a2) / 15 - sum(a1) / 15)
    assert diff.p_value == pytest.approx(0.021, abs=5e-4)
    assert diff.verdict == "significantly higher"
    assert welch(a2, a1).verdict == "significantly lower"


def test_mean_interval_uses_students_t() -> None:
    estimate = mean_estimate([1.0, 2.0, 3.0, 4.0])
    half = 3.1824 * math.sqrt((5 / 3) / 4)  # t(0.975, 3) * s / sqrt(n)
    assert estimate.interval.low == pytest.approx(2.5 - half, abs=1e-3)
    assert estimate.interval.high == pytest.approx(2.5 + half, abs=1e-3)


def test_too_few_scores_say_nothing() -> None:
    assert not newcombe(0, 0, 3, 4).significant
    assert not welch([1.0], [2.0, 3.0]).significant
    with pytest.raises(ValueError, match="successes <= n"):
        wilson(5, 4)
