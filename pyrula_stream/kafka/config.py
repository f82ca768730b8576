"""Client configuration shared by every producer, consumer and admin client we create.

Every client's log and error callbacks feed the process's connection log
(``kafka.connection_log``), so an outage prints a few lines, not thousands.

Every Kafka client of the package is built here (``new_producer``, ``new_consumer``,
``new_admin``), so the user's settings (``kafka_config``: ``security.protocol``,
``sasl.*``, ``ssl.*``, ``client.id``, ...) reach all of them. Without an explicit
``kafka_config``, the properties file named by ``PYRULA_KAFKA_CONFIG`` is used, with
``PYRULA_KAFKA_*`` variables over it (a pod's Secret fills the environment, not a file).

Order of precedence: our low-latency defaults, then the user's settings, then what a
client's role depends on (group, isolation level, transactions, idempotence), except
``client.id``, where the user's choice wins (quotas and audit logs key on it).
Secret values never leave in a repr, a log line or an error message (``redaction``).
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from pyrula_stream.errors import (
    ConfigurationError,
    KafkaAuthenticationError,
    KafkaAuthorizationError,
)
from pyrula_stream.kafka.connection_log import ClientLogger, on_client_error
from pyrula_stream.kafka.guarded import GuardedConsumer
from pyrula_stream.kafka.partitioner import PARTITIONER
from pyrula_stream.redaction import REGISTRY_PREFIX, redacted, scrub

REGISTRY_TIMEOUT_S = 30
"""Seconds a Schema Registry request may take (``schema.registry.timeout`` overrides it)."""

KAFKA_CONFIG_ENV = "PYRULA_KAFKA_CONFIG"
"""Path of a librdkafka properties file used when no ``kafka_config`` is given."""

KAFKA_PROPERTY_ENV_PREFIX = "PYRULA_KAFKA_"
"""``PYRULA_KAFKA_SASL_PASSWORD`` is ``sasl.password``: see ``property_name``."""


def _dotted(overrides: dict[str, Any]) -> dict[str, Any]:
    """``linger_ms=1`` -> ``linger.ms``; callbacks (``stats_cb``) keep their names."""
    return {k if k.endswith("_cb") else k.replace("_", "."): v for k, v in overrides.items()}


USER_WINS = frozenset({"client.id"})


class KafkaSettings(Mapping[str, Any]):
    """Read-only librdkafka settings whose repr never shows a secret."""

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        self._data = dict(settings or {})

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self) == dict(other)

    def __hash__(self) -> int:
        return hash(tuple(sorted((k, str(v)) for k, v in self._data.items())))

    def __repr__(self) -> str:
        return f"KafkaSettings({redacted(self._data)!r})"


def load_properties(path: str | Path) -> dict[str, str]:
    """A librdkafka / Java client properties file: ``key=value`` lines, ``#``/``!`` comments."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigurationError(f"cannot read the Kafka client config {file}: {exc}") from None
    settings: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            key, sep, value = line.partition(":")
        if not sep or not key.strip():
            raise ConfigurationError(
                f"{file}:{number}: expected key=value, got {scrub_line(line)!r}"
            )
        settings[key.strip()] = value.strip()
    return settings


def scrub_line(line: str) -> str:
    """A bad config line for an error message: only its first characters (it may be secret)."""
    return line[:12] + ("..." if len(line) > 12 else "")


def property_name(variable: str) -> str:
    """The client property of a ``PYRULA_KAFKA_*`` variable, as Confluent's images name
    theirs: prefix dropped, lower case, ``_`` -> ``.``, ``__`` -> ``_``, ``___`` -> ``-``
    (``PYRULA_KAFKA_SASL_OAUTHBEARER_CLIENT_ID`` -> ``sasl.oauthbearer.client.id``)."""
    name = variable.removeprefix(KAFKA_PROPERTY_ENV_PREFIX).lower()
    return (
        name.replace("___", "\0").replace("__", "\1").replace("_", ".").translate({0: "-", 1: "_"})
    )


def properties_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Client properties of ``PYRULA_KAFKA_*`` variables (not ``PYRULA_KAFKA_CONFIG``)."""
    env = os.environ if environ is None else environ
    return {
        property_name(name): value
        for name, value in env.items()
        if name.startswith(KAFKA_PROPERTY_ENV_PREFIX) and name != KAFKA_CONFIG_ENV
    }


def settings_from_env(path: str | Path | None = None) -> KafkaSettings:
    """The file ``path`` (default: the one named by ``PYRULA_KAFKA_CONFIG``), then the
    ``PYRULA_KAFKA_*`` variables over it; no settings when there are neither."""
    path = path or os.environ.get(KAFKA_CONFIG_ENV)
    return KafkaSettings({**(load_properties(path) if path else {}), **properties_from_env()})


def resolve(kafka_config: Mapping[str, Any] | None) -> KafkaSettings:
    """The explicit settings, else those of ``PYRULA_KAFKA_CONFIG``."""
    if kafka_config is None:
        return settings_from_env()
    if isinstance(kafka_config, KafkaSettings):
        return kafka_config
    return KafkaSettings(kafka_config)


def client_config(
    bootstrap_servers: str,
    kafka_config: Mapping[str, Any] | None = None,
    **role: Any,
) -> dict[str, Any]:
    """One client's configuration: defaults, then the user's settings, then the role's."""
    conf: dict[str, Any] = {
        "logger": ClientLogger(),
        "log_level": 3,
        "error_cb": on_client_error,
        "log.connection.close": False,  # a broker closing an idle connection is no failure
        # Small requests (transaction control, offsets) must not wait on Nagle's algorithm,
        # and a transaction that follows another is retried at once while the previous
        # one's markers land (CONCURRENT_TRANSACTIONS); together ~114 ms -> ~14 ms a commit.
        "socket.nagle.disable": True,
        "retry.backoff.ms": 1,
        "retry.backoff.max.ms": 50,
    }
    user = {k: v for k, v in resolve(kafka_config).items() if not k.startswith(REGISTRY_PREFIX)}
    conf.update(user)
    conf.update(_dotted(role))
    conf.update({k: v for k, v in user.items() if k in USER_WINS})
    conf["bootstrap.servers"] = bootstrap_servers
    return conf


def producer_config(
    bootstrap_servers: str,
    kafka_config: Mapping[str, Any] | None = None,
    *,
    transactional_id: str | None = None,
    transaction_timeout_ms: int = 10_000,
    extra: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """Every producer we create: idempotent, ``acks=all``, 1 ms linger, our partitioner.

    The partitioner must be the same everywhere (clients, worker, tables), or a key's
    records would land on different partitions depending on who wrote them.
    ``transactional_id`` makes it a transactional (EOS v2) producer. ``extra`` is the
    user's own producer settings (``WorkerOptions.producer_config``), applied last as given.
    """
    role: dict[str, Any] = {
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 1,
        "partitioner": PARTITIONER,
    }
    role.update(_dotted(overrides))
    if transactional_id is not None:
        role["transactional.id"] = transactional_id
        role["transaction.timeout.ms"] = transaction_timeout_ms
    conf = client_config(bootstrap_servers, kafka_config, **role)
    conf.update(extra or {})
    return conf


def reader_config(
    bootstrap_servers: str,
    kafka_config: Mapping[str, Any] | None = None,
    *,
    client_id: str,
    group_id: str | None = None,
) -> dict[str, Any]:
    """A group-less reader: assigned partitions, committed records only, never commits.

    It never joins ``group_id`` nor commits to it, but librdkafka looks up its coordinator,
    so on a secured cluster the principal needs DESCRIBE on it: an agent's readers use
    ``reader_group_id`` (``pyrula-stream acls`` grants it).
    """
    return client_config(
        bootstrap_servers,
        kafka_config,
        **{
            "group.id": group_id or f"{client_id}-reader",
            "client.id": client_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 10,
        },
    )


def principal(conf: Mapping[str, Any]) -> str:
    """Who the cluster sees, for error messages: ``User:<sasl.username>`` or the protocol."""
    user = conf.get("sasl.username")
    if user:
        return f"User:{user}"
    return f"this client ({conf.get('security.protocol', 'PLAINTEXT')})"


def authorization_error(
    conf: Mapping[str, Any], operation: str, resource: str, err: KafkaError
) -> KafkaAuthorizationError:
    """A denied request, said plainly: who, which operation, on what, and what to do."""
    return KafkaAuthorizationError(
        f"{principal(conf)} is not allowed to {operation} {resource} at "
        f"{conf.get('bootstrap.servers')} ({err.name()}); grant it, e.g. with "
        "`pyrula-stream acls MODULE:AGENT --apply` (see docs/cluster.md: Least-privilege ACLs)"
    )


def is_authorization_failure(err: KafkaError) -> bool:
    return err.code() in (
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    )


def _fail_fast_on_bad_credentials(conf: dict[str, Any]) -> None:
    """Make the client's next poll/flush raise when the cluster refuses our credentials,
    instead of librdkafka reconnecting forever (a user callback still runs first)."""
    user_cb = conf.get("error_cb")
    safe = {k: v for k, v in conf.items() if k not in ("error_cb", "logger")}

    def on_error(err: KafkaError) -> None:
        if user_cb is not None:
            user_cb(err)
        if err.code() == KafkaError._AUTHENTICATION:
            raise KafkaAuthenticationError(
                f"Kafka at {safe.get('bootstrap.servers')} refused the credentials of "
                f"{principal(safe)}: {scrub(err.str(), safe)}; check sasl.username and "
                "sasl.password (or the certificate) in kafka_config"
            )

    conf["error_cb"] = on_error


def _build(kind: type[Any], conf: dict[str, Any]) -> Any:
    conf = dict(conf)
    _fail_fast_on_bad_credentials(conf)
    try:
        return kind(conf)
    except (KafkaException, ValueError, TypeError) as exc:
        raise ConfigurationError(
            f"invalid Kafka client settings: {scrub(str(exc), conf)}; check kafka_config "
            f"(or the file in ${KAFKA_CONFIG_ENV})"
        ) from None


def new_producer(conf: dict[str, Any]) -> Producer:
    """A producer from a ``client_config`` result; bad settings raise ``ConfigurationError``."""
    producer: Producer = _build(Producer, conf)
    return producer


def new_consumer(conf: dict[str, Any]) -> Consumer:
    """A consumer from a ``client_config`` result; bad settings raise ``ConfigurationError``.

    It is a ``GuardedConsumer``: closing it waits for a poll still running in a thread.
    """
    consumer: Consumer = _build(GuardedConsumer, conf)
    return consumer


def registry_config(kafka_config: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The Schema Registry client's settings (``schema.registry.*`` keys), or None."""
    settings = resolve(kafka_config)
    conf = {
        k.removeprefix(REGISTRY_PREFIX): v
        for k, v in settings.items()
        if k.startswith(REGISTRY_PREFIX)
    }
    return conf if conf.get("url") else None


SERIALIZATIONS = ("avro", "schema_registry")


def check_serialization(serialization: str, kafka_config: Mapping[str, Any] | None) -> None:
    """``serialization`` is known, and ``schema_registry`` has a registry to talk to."""
    if serialization not in SERIALIZATIONS:
        raise ConfigurationError(
            f"serialization must be one of {', '.join(SERIALIZATIONS)}, got {serialization!r}"
        )
    if serialization == "schema_registry" and registry_config(kafka_config) is None:
        raise ConfigurationError(
            'serialization="schema_registry" needs schema.registry.url in kafka_config '
            f"(or in the file named by ${KAFKA_CONFIG_ENV})"
        )


def new_registry(conf: dict[str, Any]) -> Any:
    """A ``SchemaRegistryClient`` from ``registry_config``; the import stays contained here."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    # Without a timeout a request may wait forever.
    conf = {"timeout": REGISTRY_TIMEOUT_S, **_userinfo_as_basic_auth(conf)}
    try:
        return SchemaRegistryClient(conf)
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(
            f"invalid Schema Registry settings: {scrub(str(exc), conf)}"
        ) from None


def _userinfo_as_basic_auth(conf: dict[str, Any]) -> dict[str, Any]:
    """Credentials in ``url`` moved to ``basic.auth.user.info``: the registry client sends
    them either way, but its HTTP library logs each request's URL (at INFO)."""
    try:
        urls = [urllib.parse.urlsplit(u.strip()) for u in str(conf.get("url", "")).split(",")]
    except ValueError:
        return conf  # the client's own error says what is wrong with it
    if not urls[0].password or "basic.auth.user.info" in conf:
        return conf  # the client itself refuses both at once
    user = urllib.parse.unquote(urls[0].username or "")
    bare = [u._replace(netloc=u.netloc.rpartition("@")[2]).geturl() for u in urls]
    return {
        **conf,
        "url": ",".join(bare),
        "basic.auth.user.info": f"{user}:{urllib.parse.unquote(urls[0].password)}",
    }


def new_admin(conf: dict[str, Any]) -> AdminClient:
    """An admin client from a ``client_config`` result."""
    admin: AdminClient = _build(AdminClient, conf)
    return admin
