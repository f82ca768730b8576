"""Every Prometheus metric a worker exports, on one registry per worker.

A registry per worker (never prometheus-client's global one) lets several workers run
in one process or test without colliding. Label values are bounded: agent, provider,
model, tool, status, error code, partition; never a turn id. The spine calls the
methods below at the few points where it already has the facts (intake, step, commit,
terminal); nothing else in the code base touches a metric. Those calls run on the
worker's event loop, so the series are ``observability.series``' lock-free ones; the two
gauges written elsewhere (consumer lag from librdkafka's statistics thread, the parked
count read at scrape time) are prometheus-client's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric

from pyrula_stream.llm.base import ModelResponse, Usage
from pyrula_stream.observability.batch_metrics import BatchMetrics
from pyrula_stream.observability.series import LoopCounter, LoopGauge, LoopHistogram
from pyrula_stream.wire.records import OutRecord

SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TURN_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
UNKNOWN_TOOL = "unknown"
"""The ``tool`` label of a call to a tool the agent does not have (its name is the
model's text, so it is not a bounded label value)."""
MAX_TENANT_LABELS = 20
"""Tenants a worker labels by name: the first 20 it sees; later ones share ``other``, so
a tenant id taken from outside input cannot blow up the series count."""
OTHER_TENANT = "other"

TenantMetric = Literal["turns", "tokens", "deferred", "prompt"]
TENANT_METRICS: dict[TenantMetric, tuple[str, str, tuple[str, ...]]] = {
    "turns": (
        "pyrula_tenant_turns",
        "Turns that ended, by tenant (the first 20 tenants seen, then 'other') and outcome.",
        ("outcome",),
    ),
    "tokens": (
        "pyrula_tenant_model_tokens",
        "Tokens of live model calls counted against tenant quotas, by tenant.",
        (),
    ),
    "deferred": (
        "pyrula_tenant_deferred",
        "Turns deferred because their tenant was over a quota, by tenant and limit.",
        ("reason",),
    ),
    "prompt": (
        "pyrula_tenant_prompt_tokens",
        "Prompt tokens of live model calls by tenant and kind (uncached, cache_read, "
        "cache_write): cache_read over their sum is the tenant's cached fraction.",
        ("kind",),
    ),
}
"""The per-tenant counters (name, help, labels after ``agent`` and ``tenant``)."""

METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST
DLQ_CODE_HEADER = "pyrula.dlq.code"


def merged_exposition(registries: Iterable[CollectorRegistry]) -> bytes:
    """Several workers' registries (a mesh: one per agent) as one ``/metrics`` page: each
    metric family once, with the samples of all (their ``agent`` label tells them apart).
    Pasting the pages together would repeat ``# TYPE`` lines, which scrapers refuse."""
    families: dict[str, Metric] = {}
    for registry in registries:
        for metric in registry.collect():
            family = families.get(metric.name)
            if family is None:
                family = families[metric.name] = Metric(
                    metric.name, metric.documentation, metric.type, metric.unit
                )
            family.samples.extend(metric.samples)

    class Merged:
        def collect(self) -> Iterable[Metric]:
            return list(families.values())

    merged = CollectorRegistry(auto_describe=False)
    merged.register(Merged())
    return generate_latest(merged)


class WorkerMetrics:
    """The metrics of one worker of one agent (see docs/operating.md: Metrics)."""

    def __init__(self, agent: str, *, journal_topic: str, dlq_topic: str) -> None:
        self.agent = agent
        self.journal_topic = journal_topic
        self.dlq_topic = dlq_topic
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.turns = LoopCounter(
            "pyrula_turns", "Turns that ended, by outcome.", ["agent", "outcome"], registry=r
        )
        self.turns_started = LoopCounter(
            "pyrula_turns_started",
            "Turn attempts started on this worker (resumed: a rerun after a crash or abort).",
            ["agent", "resumed"],
            registry=r,
        )
        self.turn_failures = LoopCounter(
            "pyrula_turn_failures", "Failed turns by error code.", ["agent", "code"], registry=r
        )
        self.turn_duration = LoopHistogram(
            "pyrula_turn_duration_seconds",
            "From a turn's first start (on any worker) to its terminal event.",
            ["agent", "outcome"],
            buckets=TURN_BUCKETS,
            registry=r,
        )
        self.in_flight = LoopGauge(
            "pyrula_turns_in_flight", "Turns running on this worker now.", ["agent"], registry=r
        )
        self.parked = Gauge(
            "pyrula_turns_parked",
            "Turns of this worker's partitions waiting for sub-agents or a timer, held by "
            "their journal alone (no task, no slot).",
            ["agent"],
            registry=r,
        )
        self.model_calls = LoopCounter(
            "pyrula_model_calls",
            "Live model calls (replayed ones are not counted again).",
            ["agent", "provider", "model", "outcome"],
            registry=r,
        )
        self.model_duration = LoopHistogram(
            "pyrula_model_call_duration_seconds",
            "Duration of live model calls.",
            ["agent", "provider", "model"],
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.model_tokens = LoopCounter(
            "pyrula_model_tokens",
            "Tokens billed by the provider, by kind (input, output, cache_read, cache_creation).",
            ["agent", "provider", "model", "kind"],
            registry=r,
        )
        self.model_cost = LoopCounter(
            "pyrula_model_cost_usd",
            "Cost of model calls in US dollars (priced models only).",
            ["agent", "provider", "model"],
            registry=r,
        )
        self.prompt_cached_fraction = LoopGauge(
            "pyrula_prompt_cached_fraction",
            "Of the prompt tokens of this worker's live model calls, the fraction read from "
            "the provider's prompt cache.",
            ["agent"],
            registry=r,
        )
        self.tenant_prompt_cached_fraction = LoopGauge(
            "pyrula_tenant_prompt_cached_fraction",
            "The same by tenant (the first 20 tenants seen, then 'other').",
            ["agent", "tenant"],
            registry=r,
        )
        self._prompt_totals: dict[str | None, list[int]] = {}
        """Cache-read and all prompt tokens so far: the agent's (``None``) and by tenant
        label."""
        self.tenant_metrics = {
            kind: LoopCounter(name, doc, ["agent", "tenant", *labels], registry=r)
            for kind, (name, doc, labels) in TENANT_METRICS.items()
        }
        """The per-tenant series (``tenant_count``), by kind."""
        self._tenants: set[str] = set()
        self.tool_calls = LoopCounter(
            "pyrula_tool_calls",
            "Live tool calls by tool and status (ok, error).",
            ["agent", "tool", "status"],
            registry=r,
        )
        self.tool_duration = LoopHistogram(
            "pyrula_tool_call_duration_seconds",
            "Duration of live tool calls, retries included.",
            ["agent", "tool"],
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.journal_records = LoopCounter(
            "pyrula_journal_records", "Journal records committed.", ["agent"], registry=r
        )
        self.journal_bytes = LoopCounter(
            "pyrula_journal_bytes", "Bytes of journal records committed.", ["agent"], registry=r
        )
        self.commit_duration = LoopHistogram(
            "pyrula_commit_duration_seconds",
            "Duration of one transaction (records, progress and input offsets).",
            ["agent"],
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.commit_batch = LoopHistogram(
            "pyrula_commit_batch_records",
            "Records per committed transaction.",
            ["agent"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.aborts = LoopCounter(
            "pyrula_transaction_aborts", "Transactions aborted.", ["agent"], registry=r
        )
        self.fenced = LoopCounter(
            "pyrula_fenced",
            "Times this worker was fenced (or lost its session) and rejoined the group.",
            ["agent"],
            registry=r,
        )
        self.session_restarts = LoopCounter(
            "pyrula_session_restarts",
            "Sessions of this worker that ended and rejoined; repeated: on the same input "
            "as the one before (those back off).",
            ["agent", "repeated"],
            registry=r,
        )
        self.quarantined_records = LoopCounter(
            "pyrula_quarantined_records",
            "Input records quarantined (dead-lettered as poison_quarantine) because worker "
            "processes or sessions kept failing on them, by the topic they were read from.",
            ["agent", "source"],
            registry=r,
        )
        self.dead_letters = LoopCounter(
            "pyrula_dead_letters",
            "Records written to the dead-letter topic, by reason code.",
            ["agent", "reason"],
            registry=r,
        )
        self.skipped_records = LoopCounter(
            "pyrula_skipped_records",
            "Unreadable records skipped (not dead-lettered), by where they were read.",
            ["agent", "source"],
            registry=r,
        )
        self.restore_duration = LoopHistogram(
            "pyrula_restore_duration_seconds",
            "Time to read one journal partition when it is assigned.",
            ["agent"],
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.restored_records = LoopCounter(
            "pyrula_restored_records", "Journal records read by restores.", ["agent"], registry=r
        )
        self.objects_stored = LoopCounter(
            "pyrula_objects_stored_bytes",
            "Bytes of values put in the object store by reference (large payloads), "
            "before the transactions that reference them.",
            ["agent"],
            registry=r,
        )
        self.refs_resolved = LoopCounter(
            "pyrula_payload_refs_resolved",
            "Payload references read back from the object store (restore, replay, branch).",
            ["agent"],
            registry=r,
        )
        self.objects_swept = LoopCounter(
            "pyrula_objects_swept",
            "Objects the sweeper deleted: referenced by no live record, older than the grace.",
            ["agent"],
            registry=r,
        )
        self.consumer_lag = Gauge(
            "pyrula_consumer_lag",
            "Turn requests not yet committed, per assigned partition of the turns topic.",
            ["topic", "partition"],
            registry=r,
        )
        self.batch = BatchMetrics(agent, r)
        """The batch lane's series (``batch_metrics.py``)."""
        self._lag_labels: set[tuple[str, str]] = set()
        self._children: dict[tuple[Any, ...], Any] = {}
        self._model_children: dict[tuple[str, str], _ModelChildren] = {}
        self._tool_children: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._in_flight = self.in_flight.labels(agent)
        self._in_flight.set(0)
        for outcome in ("completed", "failed"):
            self.turns.labels(agent, outcome)

    def _child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(agent, *labels)``, cached by metric and labels (the spine calls
        it several times per step)."""
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(self.agent, *labels)
        return child

    def exposition(self) -> bytes:
        """The registry in Prometheus text format (what ``/metrics`` serves)."""
        return generate_latest(self.registry)

    # -- turns ----------------------------------------------------------------------------

    def turn_started(self, attempt: int) -> None:
        self._child(self.turns_started, "true" if attempt > 1 else "false").inc()
        self._in_flight.inc()

    def watch_parked(self, count: Callable[[], int]) -> None:
        """Read the parked-turn count at each scrape (it changes outside any turn)."""
        self.parked.labels(self.agent).set_function(count)

    def turn_left(self) -> None:
        self._in_flight.dec()

    def turn_ended(self, code: str | None, seconds: float | None) -> None:
        outcome = "failed" if code else "completed"
        self._child(self.turns, outcome).inc()
        if code:
            self._child(self.turn_failures, code).inc()
        if seconds is not None:
            self._child(self.turn_duration, outcome).observe(max(0.0, seconds))

    # -- tenants --------------------------------------------------------------------------

    def tenant_label(self, tenant: str) -> str:
        """The tenant's label value: its id for the first ``MAX_TENANT_LABELS``, else
        ``other``."""
        if tenant in self._tenants:
            return tenant
        if len(self._tenants) < MAX_TENANT_LABELS:
            self._tenants.add(tenant)
            return tenant
        return OTHER_TENANT

    def tenant_count(self, kind: TenantMetric, tenant: str, *labels: str, amount: int = 1) -> None:
        """Add ``amount`` to the tenant's series of ``TENANT_METRICS[kind]`` (``labels``:
        its labels after ``tenant``), the tenant label capped by ``tenant_label``."""
        if amount:
            metric = self.tenant_metrics[kind]
            self._child(metric, self.tenant_label(tenant), *labels).inc(amount)

    def tenant_prompt(self, tenant: str, usage: Usage) -> None:
        """A live model call's prompt tokens by kind, and the tenant's cached fraction."""
        label = self.tenant_label(tenant)
        metric = self.tenant_metrics["prompt"]
        kinds = (
            ("uncached", usage.input_tokens),
            ("cache_read", usage.cache_read_input_tokens),
            ("cache_write", usage.cache_creation_input_tokens),
        )
        for kind, amount in kinds:
            if amount:
                self._child(metric, label, kind).inc(amount)
        fraction = self._cached_fraction(label, usage)
        if fraction is not None:
            self._child(self.tenant_prompt_cached_fraction, label).set(fraction)

    def _cached_fraction(self, key: str | None, usage: Usage) -> float | None:
        """The cached fraction of ``key``'s prompt tokens so far, ``usage`` added."""
        totals = self._prompt_totals.setdefault(key, [0, 0])
        totals[0] += usage.cache_read_input_tokens
        totals[1] += usage.prompt_tokens
        return totals[0] / totals[1] if totals[1] else None

    # -- steps ----------------------------------------------------------------------------

    def model_call(
        self,
        provider: str,
        model: str,
        seconds: float,
        response: ModelResponse | None,
        cost_usd: float,
    ) -> None:
        children = self._model_children.get((provider, model))
        if children is None:
            children = self._model_children[(provider, model)] = self._for_model(provider, model)
        children.duration.observe(seconds)
        if response is None:
            children.errors.inc()
            return
        children.ok.inc()
        usage = response.usage
        if usage.input_tokens:
            children.input.inc(usage.input_tokens)
        if usage.output_tokens:
            children.output.inc(usage.output_tokens)
        if usage.cache_read_input_tokens:
            children.cache_read.inc(usage.cache_read_input_tokens)
        if usage.cache_creation_input_tokens:
            children.cache_creation.inc(usage.cache_creation_input_tokens)
        if cost_usd:
            children.cost.inc(cost_usd)
        fraction = self._cached_fraction(None, usage)
        if fraction is not None:
            children.cached_fraction.set(fraction)

    def _for_model(self, provider: str, model: str) -> _ModelChildren:
        """Every child a model call touches, looked up once per provider and model."""
        tokens = self.model_tokens
        return _ModelChildren(
            self._child(self.model_calls, provider, model, "ok"),
            self._child(self.model_calls, provider, model, "error"),
            self._child(self.model_duration, provider, model),
            self._child(tokens, provider, model, "input"),
            self._child(tokens, provider, model, "output"),
            self._child(tokens, provider, model, "cache_read"),
            self._child(tokens, provider, model, "cache_creation"),
            self._child(self.model_cost, provider, model),
            self._child(self.prompt_cached_fraction),
        )

    def tool_call(self, tool: str, status: str, seconds: float) -> None:
        children = self._tool_children.get((tool, status))
        if children is None:
            children = self._tool_children[(tool, status)] = (
                self._child(self.tool_calls, tool, status),
                self._child(self.tool_duration, tool),
            )
        children[0].inc()
        children[1].observe(seconds)

    # -- commits, intake, restore ---------------------------------------------------------

    def committed(self, records: Iterable[OutRecord], seconds: float) -> None:
        count = journal = size = 0
        for record in records:
            count += 1
            if record.topic == self.journal_topic:
                journal += 1
                size += record.size
            elif record.topic == self.dlq_topic:
                self.dead_lettered(_header(record, DLQ_CODE_HEADER) or "unknown")
        self._child(self.commit_duration).observe(seconds)
        self._child(self.commit_batch).observe(count)
        self._child(self.journal_records).inc(journal)
        self._child(self.journal_bytes).inc(size)

    def aborted(self) -> None:
        self.aborts.labels(self.agent).inc()

    def stored_objects(self, size: int) -> None:
        self._child(self.objects_stored).inc(size)

    def resolved_refs(self, count: int) -> None:
        self._child(self.refs_resolved).inc(count)

    def swept_objects(self, count: int) -> None:
        self._child(self.objects_swept).inc(count)

    def was_fenced(self) -> None:
        self.fenced.labels(self.agent).inc()

    def session_restarted(self, repeated: bool) -> None:
        self.session_restarts.labels(self.agent, "true" if repeated else "false").inc()

    def quarantined(self, source: str) -> None:
        """``source``: ``turns`` or ``replies``."""
        self.quarantined_records.labels(self.agent, source).inc()

    def dead_lettered(self, reason: str) -> None:
        self.dead_letters.labels(self.agent, reason).inc()

    def skipped_record(self, source: str) -> None:
        self.skipped_records.labels(self.agent, source).inc()

    def restored(self, seconds: float, records: int) -> None:
        self.restore_duration.labels(self.agent).observe(seconds)
        self.restored_records.labels(self.agent).inc(records)

    def set_lag(self, topic: str, lag: Mapping[int, int]) -> None:
        """The lag of every partition assigned now; partitions no longer assigned vanish."""
        labels = {(topic, str(p)) for p in lag}
        for gone in self._lag_labels - labels:
            self.consumer_lag.remove(*gone)
        for p, value in lag.items():
            self.consumer_lag.labels(topic, str(p)).set(max(0, value))
        self._lag_labels = labels


@dataclass(frozen=True, slots=True)
class _ModelChildren:
    """The children of one provider and model, made at its first call: one lookup per
    call instead of one per series. Each series then shows from 0 (an error count, a
    token kind, the cost) before it first moves, as Prometheus advises for known labels."""

    ok: Any
    errors: Any
    duration: Any
    input: Any
    output: Any
    cache_read: Any
    cache_creation: Any
    cost: Any
    cached_fraction: Any


def _header(record: OutRecord, name: str) -> str | None:
    for key, value in record.headers:
        if key == name:
            return value.decode(errors="replace")
    return None
