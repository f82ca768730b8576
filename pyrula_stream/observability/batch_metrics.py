"""The batch lane's Prometheus series: calls queued, batch sizes, waits, failures and the
dollars saved against the live price. Written on the worker's event loop (the lane's
collector and the turns' model calls), so they are ``observability.series``' lock-free
ones; the count of calls queued now is read at scrape time."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge

from pyrula_stream.observability.series import LoopCounter, LoopHistogram

BATCH_SIZE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 50000)
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 900, 1800, 3600, 7200, 21600, 86400)


class BatchMetrics:
    """The lane's series of one worker (``WorkerMetrics.batch``)."""

    def __init__(self, agent: str, registry: CollectorRegistry) -> None:
        self.agent = agent
        r = registry
        self.calls = LoopCounter(
            "pyrula_batch_calls",
            "Model calls of the batch lane, by event (queued, submitted, resumed, failed, "
            "dropped: an outcome for a turn that no longer waits).",
            ["agent", "event"],
            registry=r,
        )
        self.queued = Gauge(
            "pyrula_batch_calls_queued",
            "Calls waiting in this worker's collector for a batch to be submitted.",
            ["agent"],
            registry=r,
        )
        self.sizes = LoopHistogram(
            "pyrula_batch_size_calls",
            "Calls per submitted batch.",
            ["agent"],
            buckets=BATCH_SIZE_BUCKETS,
            registry=r,
        )
        self.waits = LoopHistogram(
            "pyrula_batch_wait_seconds",
            "From a batch's journaling to its results' journaling.",
            ["agent"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.batches = LoopCounter(
            "pyrula_batches",
            "Batches by outcome (submitted, found: a takeover found it at the provider, "
            "ended, expired, failed, cancelled).",
            ["agent", "outcome"],
            registry=r,
        )
        self.savings = LoopCounter(
            "pyrula_batch_savings_usd",
            "Dollars saved by calls that went by batch (their live price minus their batch "
            "price; priced models only).",
            ["agent"],
            registry=r,
        )

    def call(self, event: str, amount: int = 1) -> None:
        if amount:
            self.calls.labels(self.agent, event).inc(amount)

    def batch(self, outcome: str) -> None:
        self.batches.labels(self.agent, outcome).inc()

    def submitted(self, size: int) -> None:
        self.sizes.labels(self.agent).observe(size)
        self.call("submitted", size)
        self.batch("submitted")

    def waited(self, seconds: float) -> None:
        self.waits.labels(self.agent).observe(max(0.0, seconds))

    def saved(self, usd: float) -> None:
        if usd > 0:
            self.savings.labels(self.agent).inc(usd)

    def watch_queued(self, count: Callable[[], int]) -> None:
        self.queued.labels(self.agent).set_function(count)
