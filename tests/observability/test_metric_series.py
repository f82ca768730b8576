"""The lock-free series expose exactly what prometheus-client's own classes would."""

from __future__ import annotations

import re
import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pyrula_stream.observability.series import LoopCounter, LoopGauge, LoopHistogram

BUCKETS = (0.01, 0.1, 1, 10)


def _exposition(registry: CollectorRegistry) -> str:
    """The page without the ``_created`` timestamps (they differ by construction time)."""
    text = generate_latest(registry).decode()
    return re.sub(r"(_created\{[^}]*\}) \S+", r"\1 T", text)


def _fill(counter: object, gauge: object, histogram: object) -> None:
    for agent, amount in (("a", 1), ("a", 2.5), ("b", 4)):
        counter.labels(agent, "ok").inc(amount)  # type: ignore[attr-defined]
    gauge.labels("a").inc()  # type: ignore[attr-defined]
    gauge.labels("a").inc(3)  # type: ignore[attr-defined]
    gauge.labels("a").dec()  # type: ignore[attr-defined]
    gauge.labels("b").set(7)  # type: ignore[attr-defined]
    for value in (0.0, 0.01, 0.05, 0.1, 0.5, 1, 9.99, 10, 11, 1000):
        histogram.labels("a").observe(value)  # type: ignore[attr-defined]
    histogram.labels("b")  # type: ignore[attr-defined]


def test_the_page_matches_prometheus_client() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    _fill(
        LoopCounter("t_calls", "Calls.", ["agent", "status"], registry=ours),
        LoopGauge("t_in_flight", "In flight.", ["agent"], registry=ours),
        LoopHistogram("t_seconds", "Durations.", ["agent"], buckets=BUCKETS, registry=ours),
    )
    _fill(
        Counter("t_calls", "Calls.", ["agent", "status"], registry=theirs),
        Gauge("t_in_flight", "In flight.", ["agent"], registry=theirs),
        Histogram("t_seconds", "Durations.", ["agent"], buckets=BUCKETS, registry=theirs),
    )
    assert _exposition(ours) == _exposition(theirs)
    assert ours.get_sample_value("t_calls_total", {"agent": "a", "status": "ok"}) == 3.5
    # ``le`` is inclusive: 0.01 and 0.0 fall in the first bucket, 10 in the fourth.
    assert ours.get_sample_value("t_seconds_bucket", {"agent": "a", "le": "0.01"}) == 2
    assert ours.get_sample_value("t_seconds_bucket", {"agent": "a", "le": "10.0"}) == 8
    assert ours.get_sample_value("t_seconds_count", {"agent": "a"}) == 10


def test_a_scraper_parses_every_family() -> None:
    registry = CollectorRegistry()
    histogram = LoopHistogram(
        "t_seconds", "Durations.", ["agent"], buckets=BUCKETS, registry=registry
    )
    histogram.labels("a").observe(0.2)
    families = {
        f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())
    }
    assert families["t_seconds"].type == "histogram"


def test_misuse_is_refused_as_prometheus_client_refuses_it() -> None:
    registry = CollectorRegistry()
    counter = LoopCounter("t_calls", "Calls.", ["agent"], registry=registry)
    with pytest.raises(ValueError, match="non-negative"):
        counter.labels("a").inc(-1)
    with pytest.raises(ValueError, match="takes labels"):
        counter.labels("a", "extra")
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        LoopCounter("t_calls", "Again.", ["agent"], registry=registry)
    with pytest.raises(ValueError, match="sorted"):
        LoopHistogram("t_h", "H.", [], buckets=(1, 0.5), registry=registry)


def test_a_scrape_on_another_thread_reads_while_the_loop_writes() -> None:
    """A histogram's count is the sum of its buckets as read, so a scrape between an
    observation's bucket and sum never shows a count that disagrees with ``+Inf``."""
    registry = CollectorRegistry()
    histogram = LoopHistogram("t_seconds", "Durations.", [], buckets=BUCKETS, registry=registry)
    child = histogram.labels()
    stop = threading.Event()
    pages: list[tuple[float, float]] = []

    def scrape() -> None:
        while not stop.is_set():
            samples = {
                (s.name, s.labels.get("le")): s.value
                for family in registry.collect()
                for s in family.samples
            }
            pages.append(
                (samples[("t_seconds_count", None)], samples[("t_seconds_bucket", "+Inf")])
            )

    scraper = threading.Thread(target=scrape)
    scraper.start()
    for i in range(200_000):
        child.observe(i % 13)
    stop.set()
    scraper.join()
    assert pages and all(count == inf for count, inf in pages)
    assert registry.get_sample_value("t_seconds_count") == 200_000
