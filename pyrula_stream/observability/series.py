"""Counters, gauges and histograms that the worker's event loop updates without a lock.

prometheus-client takes a ``threading.Lock`` on every ``inc`` and ``observe``, and checks
the metric's labels each time. A one-tool turn made 19 such calls: about 15 us of the
40 us its telemetry cost, measured in-process. Each worker's series are written by one
thread only, its event loop, so a plain float per series is enough. The scrape runs on
another thread and reads each float under the GIL, so it sees every value as of some
moment. A histogram's ``_count`` is the sum of its buckets as read, so the two always
agree.

Each class here is a collector registered on the worker's registry with the names,
labels, buckets and ``_created`` samples of prometheus-client's classes, so ``/metrics``
and ``registry.get_sample_value`` read them as before. Metrics written from other threads
(the consumer-lag gauge, set from librdkafka's statistics callback) stay prometheus-client
metrics.
"""

from __future__ import annotations

import math
import os
import time
from abc import ABC, abstractmethod
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

_CREATED = os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "false").lower() not in (
    "true",
    "1",
    "t",
)
"""Whether counters and histograms expose ``_created``. prometheus-client's own setting,
read the way it reads it."""


class CounterChild:
    """One labelled series of a ``LoopCounter``."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("counters can only be incremented by non-negative amounts")
        self.value += amount


class GaugeChild:
    """One labelled series of a ``LoopGauge``."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount

    def dec(self, amount: float = 1) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = float(value)


class HistogramChild:
    """One labelled series of a ``LoopHistogram``: per-bucket counts (not cumulative;
    the last is ``+Inf``) and the sum."""

    __slots__ = ("counts", "created", "sum", "upper")

    def __init__(self, upper: tuple[float, ...]) -> None:
        self.upper = upper
        self.counts = [0.0] * len(upper)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        # ``le`` is inclusive: the first bound at or above the value.
        self.counts[bisect_left(self.upper, value)] += 1
        self.sum += value


C = TypeVar("C", CounterChild, GaugeChild, HistogramChild)


class _LoopMetric(ABC, Generic[C]):
    """A metric family: its children by label values, collected at each scrape."""

    kind = ""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        *,
        registry: CollectorRegistry,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], C] = {}
        registry.register(self)

    def labels(self, *values: str) -> C:
        """The series of these label values, made at first use (and then exposed at 0)."""
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
            child = self._children[values] = self._new_child()
        return child

    def remove(self, *values: str) -> None:
        self._children.pop(values, None)

    @abstractmethod
    def _new_child(self) -> C:
        """A series at zero."""

    def describe(self) -> Iterable[Metric]:
        """The family without samples: what the registry checks names against."""
        return [Metric(self.name, self.documentation, self.kind)]

    def collect(self) -> Iterable[Metric]:
        metric = Metric(self.name, self.documentation, self.kind)
        # A copy: the loop may add a child while the scrape thread iterates.
        for values, child in list(self._children.items()):
            self._samples(metric, dict(zip(self.labelnames, values, strict=True)), child)
        return [metric]

    @abstractmethod
    def _samples(self, metric: Metric, labels: dict[str, str], child: C) -> None:
        """Add one series' samples to ``metric``."""


class LoopCounter(_LoopMetric[CounterChild]):
    """``prometheus_client.Counter`` for one writer thread (exposed as ``<name>_total``)."""

    kind = "counter"

    def _new_child(self) -> CounterChild:
        return CounterChild()

    def _samples(self, metric: Metric, labels: dict[str, str], child: CounterChild) -> None:
        metric.add_sample(f"{self.name}_total", labels, child.value)
        if _CREATED:
            metric.add_sample(f"{self.name}_created", labels, child.created)


class LoopGauge(_LoopMetric[GaugeChild]):
    """``prometheus_client.Gauge`` for one writer thread."""

    kind = "gauge"

    def _new_child(self) -> GaugeChild:
        return GaugeChild()

    def _samples(self, metric: Metric, labels: dict[str, str], child: GaugeChild) -> None:
        metric.add_sample(self.name, labels, child.value)


class LoopHistogram(_LoopMetric[HistogramChild]):
    """``prometheus_client.Histogram`` for one writer thread (``+Inf`` added to the
    buckets, as there)."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        upper = tuple(float(b) for b in buckets)
        if list(upper) != sorted(upper):
            raise ValueError(f"{name}: buckets must be sorted")
        self.upper = upper if upper and math.isinf(upper[-1]) else (*upper, math.inf)
        self._le: tuple[str, ...] = tuple(
            floatToGoString(b)  # type: ignore[no-untyped-call]
            for b in self.upper
        )
        super().__init__(name, documentation, labelnames, registry=registry)

    def _new_child(self) -> HistogramChild:
        return HistogramChild(self.upper)

    def _samples(self, metric: Metric, labels: dict[str, str], child: HistogramChild) -> None:
        total = 0.0
        for le, count in zip(self._le, list(child.counts), strict=True):
            total += count
            metric.add_sample(f"{self.name}_bucket", {**labels, "le": le}, total)
        metric.add_sample(f"{self.name}_count", labels, total)
        metric.add_sample(f"{self.name}_sum", labels, child.sum)
        if _CREATED:
            metric.add_sample(f"{self.name}_created", labels, child.created)
