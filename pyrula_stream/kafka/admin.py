"""Topic specs from ``topics/agent.yaml`` and applying them: create missing, report drift.

Applying never deletes or alters an existing topic: a difference is reported as drift so a
person decides, because repartitioning a co-partitioned journal would lose turns.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any

import yaml
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicCollection
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, not in __all__
    AclOperation,
    AdminClient,
    ConfigResource,
    NewTopic,
)

from pyrula_stream.errors import BrokerUnavailableError, ConfigurationError
from pyrula_stream.kafka.config import (
    authorization_error,
    client_config,
    is_authorization_failure,
    new_admin,
)
from pyrula_stream.kafka.connection_log import unreachable_reason
from pyrula_stream.kafka.offsets import kafka_error

DEFAULT_PREFIX = "pyrula"
DEFAULT_PARTITIONS = 6


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)
    replicas: int | None = None
    """Copies of each partition; ``None``: ``min(3, brokers)`` of the cluster applied to
    (``cluster_replicas``), and ``min.insync.replicas`` one less unless the config says."""


def cluster_replicas(brokers: int) -> int:
    """The default replication of the project's topics on a cluster of ``brokers``."""
    return min(3, max(1, brokers))


def with_replication(spec: TopicSpec, brokers: int) -> tuple[int, dict[str, str]]:
    """The replication factor and config a spec gets on a cluster of ``brokers``; a spec
    asking for more copies than there are brokers is refused, naming both."""
    replicas = spec.replicas or cluster_replicas(brokers)
    if replicas > brokers:
        raise ConfigurationError(
            f"topic {spec.name} asks for {replicas} replicas but the cluster has "
            f"{brokers} broker(s): lower its replicas or add brokers"
        )
    config = dict(spec.config)
    config.setdefault("min.insync.replicas", str(max(1, replicas - 1)))
    return replicas, config


@dataclass
class ApplyReport:
    created: list[str] = field(default_factory=list)
    matched: list[str] = field(default_factory=list)
    drift: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.drift

    def describe(self) -> str:
        lines = [f"created {name}" for name in self.created]
        lines += [f"ok      {name}" for name in self.matched]
        lines += [f"DRIFT   {d}" for d in self.drift]
        return "\n".join(lines)


def topic_specs(
    spec_file: str, fill: Mapping[str, str], *, options: Mapping[str, bool] | None = None
) -> list[TopicSpec]:
    """The topics of a declarative spec shipped with the package (``topics/<spec_file>``),
    their ``{fields}`` filled in; a topic marked ``only_with: X`` needs ``options[X]``."""
    text = resources.files("pyrula_stream").joinpath("topics", spec_file).read_text()
    chosen = options or {}
    return [
        TopicSpec(
            name=str(t["name"]).format(**fill),
            partitions=int(str(t["partitions"]).format(**fill)),
            config={k: str(v).format(**fill) for k, v in (t.get("config") or {}).items()},
            replicas=int(t["replicas"]) if t.get("replicas") is not None else None,
        )
        for t in yaml.safe_load(text)["topics"]
        if chosen.get(t.get("only_with") or "", True)
    ]


def agent_topic_specs(
    agent: str,
    *,
    prefix: str = DEFAULT_PREFIX,
    partitions: int = DEFAULT_PARTITIONS,
    keep_history: bool = False,
    history_retention_ms: int | None = None,
    tenants: bool = False,
    dlq_redrives: bool = False,
    outcomes: bool = False,
) -> list[TopicSpec]:
    """The agent's topics from ``topics/agent.yaml`` (``<agent>.history`` only with
    ``keep_history``, its ``retention.ms`` overridden by ``history_retention_ms``; the
    tenants and tenant-usage topics only with ``tenants``; ``<agent>.dlq-redrives``, which
    only operators use, only with ``dlq_redrives``; ``<agent>.outcomes`` only with
    ``outcomes``: an agent with a deferred-outcome evaluator)."""
    fill = {"prefix": prefix, "agent": agent, "partitions": str(partitions)}
    chosen = {
        "keep_history": keep_history,
        "tenants": tenants,
        "dlq_redrives": dlq_redrives,
        "outcomes": outcomes,
    }
    specs = topic_specs("agent.yaml", fill, options=chosen)
    if history_retention_ms is not None:
        for spec in specs:
            if spec.name == f"{prefix}.{agent}.history":
                spec.config["retention.ms"] = str(history_retention_ms)
    return specs


def admin_client(
    bootstrap_servers: str, kafka_config: Mapping[str, Any] | None = None
) -> AdminClient:
    return new_admin(client_config(bootstrap_servers, kafka_config))


def cluster_metadata(
    client: AdminClient | Producer | Consumer,
    timeout_s: float,
    topic: str | None = None,
    *,
    serve_errors: bool = True,
) -> Any:
    """``list_topics`` in one-second tries, so refused credentials fail within a second or
    two (``KafkaAuthenticationError`` from the client's error callback) instead of after
    the whole timeout with a bare transport error. ``serve_errors=False`` for a consumer
    with an assignment, whose ``poll`` would take records."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.list_topics(
                topic, timeout=max(0.1, min(1.0, deadline - time.monotonic()))
            )
        except KafkaException:
            if serve_errors:
                client.poll(0)
            if time.monotonic() >= deadline:
                raise


def broker_answers(
    bootstrap_servers: str,
    timeout_s: float = 2.0,
    *,
    kafka_config: Mapping[str, Any] | None = None,
) -> bool:
    """Whether the cluster answers a metadata request within the timeout."""
    try:
        md = cluster_metadata(admin_client(bootstrap_servers, kafka_config), timeout_s)
    except KafkaException:
        return False
    return bool(md.brokers)


def missing_topics(
    bootstrap_servers: str,
    names: list[str],
    timeout_s: float = 30.0,
    *,
    kafka_config: Mapping[str, Any] | None = None,
) -> list[str]:
    """Which of ``names`` do not exist on the cluster."""
    if not names:
        return []
    existing = cluster_metadata(admin_client(bootstrap_servers, kafka_config), timeout_s).topics
    return [name for name in names if name not in existing]


def group_member_count(
    bootstrap_servers: str,
    group_id: str,
    timeout_s: float = 5.0,
    *,
    kafka_config: Mapping[str, Any] | None = None,
) -> int | None:
    """Members of a consumer group now (0 for a group that never existed); ``None`` when
    the cluster did not answer in time."""
    admin = admin_client(bootstrap_servers, kafka_config)  # alive until its future resolves
    futures = admin.describe_consumer_groups([group_id], request_timeout=timeout_s)
    try:
        description = futures[group_id].result(timeout=timeout_s + 1)
    except TimeoutError:
        return None
    except KafkaException as exc:
        err = kafka_error(exc)
        if err is not None and err.code() == KafkaError.GROUP_ID_NOT_FOUND:
            return 0
        return None
    return len(description.members)


def group_assignment(
    bootstrap_servers: str,
    group_id: str,
    topic: str,
    timeout_s: float = 5.0,
    *,
    kafka_config: Mapping[str, Any] | None = None,
) -> dict[int, str] | None:
    """Which member (by its ``client.id``) holds each assigned partition of ``topic`` now
    (a partition mid-rebalance is absent); ``None`` when the cluster did not answer."""
    admin = admin_client(bootstrap_servers, kafka_config)  # alive until its future resolves
    futures = admin.describe_consumer_groups([group_id], request_timeout=timeout_s)
    try:
        description = futures[group_id].result(timeout=timeout_s + 1)
    except (TimeoutError, KafkaException):
        return None
    owners: dict[int, str] = {}
    for member in description.members:
        assignment = member.assignment.topic_partitions if member.assignment else []
        for tp in assignment:
            if tp.topic == topic:
                owners[tp.partition] = str(member.client_id)
    return owners


def apply_topics(
    bootstrap_servers: str,
    specs: list[TopicSpec],
    timeout_s: float = 30.0,
    *,
    kafka_config: Mapping[str, Any] | None = None,
) -> ApplyReport:
    """Create what is missing, leave what matches, report every difference as drift."""
    admin = admin_client(bootstrap_servers, kafka_config)
    conf = client_config(bootstrap_servers, kafka_config)
    try:
        metadata = cluster_metadata(admin, timeout_s)
    except KafkaException as exc:
        err = kafka_error(exc)
        if err is not None and err.code() in (KafkaError._TRANSPORT, KafkaError._TIMED_OUT):
            admin.poll(0)  # serves the error callbacks that say why
            raise BrokerUnavailableError(
                f"cannot reach Kafka at {bootstrap_servers} within {timeout_s:g}s to apply "
                f"topics ({unreachable_reason(bootstrap_servers) or 'no answer'}): check the "
                "bootstrap servers and that the broker is running"
            ) from None
        raise
    report = ApplyReport()
    existing, brokers = metadata.topics, len(metadata.brokers) or 1
    replication = {s.name: with_replication(s, brokers) for s in specs}
    missing = [s for s in specs if s.name not in existing]
    if missing:
        futures = admin.create_topics(
            [
                NewTopic(
                    s.name,
                    s.partitions,
                    replication_factor=replication[s.name][0],
                    config=replication[s.name][1],
                )
                for s in missing
            ],
            operation_timeout=timeout_s,
        )
        for name, fut in futures.items():
            try:
                fut.result()
                report.created.append(name)
            except KafkaException as exc:
                err = kafka_error(exc)
                if err is not None and is_authorization_failure(err):
                    # A topic we may not DESCRIBE looks missing, so say both.
                    raise authorization_error(
                        conf, "CREATE (or, if it exists, DESCRIBE)", f"topic {name}", err
                    ) from None
                if err is None or err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
                report.matched.append(name)
    present = [s for s in specs if s.name in existing]
    if present:
        actual_configs = _describe_configs(admin, [s.name for s in present], timeout_s, conf)
        for spec in present:
            before = len(report.drift)
            actual_parts = len(existing[spec.name].partitions)
            if actual_parts != spec.partitions:
                report.drift.append(
                    f"{spec.name}: partitions is {actual_parts}, spec says {spec.partitions}"
                )
            copies = {len(p.replicas) for p in existing[spec.name].partitions.values()} or {1}
            if spec.replicas is not None and copies != {spec.replicas}:
                report.drift.append(
                    f"{spec.name}: replicas is {sorted(copies)}, spec says {spec.replicas}"
                )
            actual = actual_configs[spec.name]
            # An existing topic is held to the in-sync minimum of the copies it has.
            wanted = with_replication(replace(spec, replicas=max(copies)), max(copies))[1]
            for key, want in wanted.items():
                have = actual.get(key)
                if have != want:
                    report.drift.append(f"{spec.name}: {key} is {have!r}, spec says {want!r}")
            if len(report.drift) == before:
                report.matched.append(spec.name)
    _wait_for_metadata(admin, [s.name for s in missing], timeout_s)
    return report


def weak_exactly_once(
    bootstrap_servers: str,
    timeout_s: float = 10.0,
    *,
    kafka_config: Mapping[str, Any] | None = None,
) -> list[str]:
    """What in the cluster's own settings makes exactly-once weaker than it looks: a
    transaction state log or offsets topic with fewer copies than the cluster could give
    them, a transaction log committing on one copy, unclean leader election. A denied
    or unanswered ``DESCRIBE_CONFIGS`` gives nothing to say."""
    admin = admin_client(bootstrap_servers, kafka_config)
    metadata = cluster_metadata(admin, timeout_s)
    brokers = sorted(metadata.brokers)
    if not brokers:
        return []
    resource = ConfigResource(ConfigResource.Type.BROKER, str(brokers[0]))
    try:
        entries = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result()
    except KafkaException:
        return []
    value = {k: v.value for k, v in entries.items()}
    want = cluster_replicas(len(brokers))
    out: list[str] = []
    for key in ("transaction.state.log.replication.factor", "offsets.topic.replication.factor"):
        have = int(value.get(key) or want)
        if have < want:
            out.append(f"{key} is {have} on a cluster of {len(brokers)} brokers (want {want})")
    min_isr = int(value.get("transaction.state.log.min.isr") or 1)
    if want > 1 and min_isr < 2:
        out.append(
            f"transaction.state.log.min.isr is {min_isr}: a commit may rest on one copy (want 2)"
        )
    if value.get("unclean.leader.election.enable") == "true":
        out.append("unclean.leader.election.enable is true: a failover can drop committed records")
    return out


def _describe_configs(
    admin: AdminClient, names: list[str], timeout_s: float, conf: Mapping[str, Any]
) -> dict[str, dict[str, str]]:
    """Each topic's config. A topic created a moment ago may be unknown to the broker that
    answers (on a cluster, metadata reaches the brokers one by one): asked again until
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    out: dict[str, dict[str, str]] = {}
    pending = list(names)
    while pending:
        resources_ = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in pending]
        pending = []
        for res, fut in admin.describe_configs(resources_, request_timeout=timeout_s).items():
            try:
                entries: dict[str, Any] = fut.result()
            except KafkaException as exc:
                error = exc.args[0]
                if is_authorization_failure(error):
                    raise authorization_error(
                        conf, "DESCRIBE_CONFIGS", f"topic {res.name}", error
                    ) from None
                unknown = error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
                if unknown and time.monotonic() < deadline:
                    pending.append(res.name)
                    continue
                raise
            out[res.name] = {k: v.value for k, v in entries.items()}
        if pending:
            time.sleep(0.2)
    return out


def _wait_for_metadata(admin: AdminClient, names: list[str], timeout_s: float) -> None:
    """New topics are usable only once every partition has a leader."""
    deadline = time.monotonic() + timeout_s
    pending = set(names)
    while pending and time.monotonic() < deadline:
        topics = admin.list_topics(timeout=timeout_s).topics
        for name in list(pending):
            t = topics.get(name)
            if t and t.error is None and all(p.leader >= 0 for p in t.partitions.values()):
                pending.discard(name)
        if pending:
            time.sleep(0.05)


def committed_offsets(
    bootstrap_servers: str,
    group_id: str,
    topic: str,
    *,
    kafka_config: Mapping[str, Any] | None = None,
) -> dict[int, int]:
    """The offsets ``group_id`` has committed on ``topic``, by partition (none: absent)."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    admin = admin_client(bootstrap_servers, kafka_config)
    request = ConsumerGroupTopicPartitions(group_id)
    futures = admin.list_consumer_group_offsets([request])
    result = futures[group_id].result()
    return {
        tp.partition: tp.offset
        for tp in result.topic_partitions or []
        if tp.topic == topic and tp.offset >= 0
    }


def unwritable_topics(
    bootstrap_servers: str,
    names: list[str],
    timeout_s: float = 5.0,
    *,
    kafka_config: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """Which of ``names`` this principal may not WRITE, each with why, from the broker's
    own answer (the topics' authorized operations); empty when the broker does not say.

    A transaction that touched a forbidden topic fails as a whole with
    ``TOPIC_AUTHORIZATION_FAILED`` and its records are only "purged": this tells which
    of them was the one refused, so that one is charged and the others go on.
    """
    if not names:
        return {}
    admin = admin_client(bootstrap_servers, kafka_config)
    try:
        futures = admin.describe_topics(
            TopicCollection(sorted(set(names))),
            include_authorized_operations=True,
            request_timeout=timeout_s,
        )
    except (KafkaException, ValueError, TypeError):
        return {}
    denied: dict[str, str] = {}
    for name, future in futures.items():
        try:
            described = future.result(timeout=timeout_s + 1)
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                denied[name] = "TOPIC_AUTHORIZATION_FAILED (not even DESCRIBE)"
            continue
        except Exception:  # a timeout, or a broker that cannot say: nothing learnt
            continue
        ops = described.authorized_operations
        if ops is None:
            continue
        if not {AclOperation.WRITE, AclOperation.ALL} & set(ops):
            denied[name] = "TOPIC_AUTHORIZATION_FAILED (no WRITE)"
    return denied
