"""Client configuration shared by every producer, consumer and admin client we create.

Every Kafka client of the package is built here (``new_producer``, ``new_consumer``,
``new_admin``), so the user's settings (``kafka_config``: ``security.protocol``,
``sasl.*``, ``ssl.*``, ``client.id``, ...) reach all of them. Without an explicit
``kafka_config``, the properties file named by ``PYRULA_KAFKA_CONFIG`` is used.

Order of precedence: our low-latency defaults, then the user's settings, then what a
client's role depends on (group, isolation level, transactions, idempotence), except
``client.id``, where the user's choice wins (quotas and audit logs key on it).
Secret values never leave this module in a repr, a log line or an error message.
"""

from __future__ import annotations

import logging
import os
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

librdkafka_logger = logging.getLogger("pyrula_stream.librdkafka")

KAFKA_CONFIG_ENV = "PYRULA_KAFKA_CONFIG"
"""Path of a librdkafka properties file used when no ``kafka_config`` is given."""

SECRET_KEYS = frozenset(
    {
        "sasl.password",
        "sasl.jaas.config",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.config",
        "ssl.key.password",
        "ssl.key.pem",
        "ssl_key",
        "ssl.keystore.password",
        "ssl.truststore.password",
        "basic.auth.user.info",
        "bearer.auth.token",
        "bearer.auth.client.secret",
    }
)
REDACTED = "[redacted]"
USER_WINS = frozenset({"client.id"})


REGISTRY_PREFIX = "schema.registry."
"""Settings for the Schema Registry client ride in the same file: ``schema.registry.url``,
``schema.registry.basic.auth.user.info``, ``schema.registry.ssl.ca.location``, ..."""


def is_secret(key: str) -> bool:
    return key.removeprefix(REGISTRY_PREFIX) in SECRET_KEYS or key.endswith(
        (".password", ".secret", ".user.info")
    )


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


def redacted(conf: Mapping[str, Any]) -> dict[str, Any]:
    """``conf`` with every secret value replaced (for logs and reprs)."""
    return {k: REDACTED if is_secret(k) else v for k, v in conf.items()}


def scrub(text: str, conf: Mapping[str, Any]) -> str:
    """``text`` with every secret value of ``conf`` blanked out (for error messages)."""
    for key, value in conf.items():
        if is_secret(key) and isinstance(value, str) and value:
            text = text.replace(value, REDACTED)
    return text


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


def settings_from_env() -> KafkaSettings:
    """The file named by ``PYRULA_KAFKA_CONFIG``, or no settings."""
    path = os.environ.get(KAFKA_CONFIG_ENV)
    return KafkaSettings(load_properties(path) if path else None)


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
        "logger": librdkafka_logger,
        "log_level": 3,
        # Small requests (transaction control, offsets) must not wait on Nagle's algorithm,
        # and a transaction that follows another is retried at once while the previous
        # one's markers land (CONCURRENT_TRANSACTIONS); together ~114 ms -> ~14 ms a commit.
        "socket.nagle.disable": True,
        "retry.backoff.ms": 1,
        "retry.backoff.max.ms": 50,
    }
    user = {k: v for k, v in resolve(kafka_config).items() if not k.startswith(REGISTRY_PREFIX)}
    conf.update(user)
    conf.update({k if k.endswith("_cb") else k.replace("_", "."): v for k, v in role.items()})
    conf.update({k: v for k, v in user.items() if k in USER_WINS})
    conf["bootstrap.servers"] = bootstrap_servers
    return conf


def base_config(bootstrap_servers: str, **overrides: Any) -> dict[str, Any]:
    """``client_config`` with the environment's settings (kept for existing callers)."""
    return client_config(bootstrap_servers, None, **overrides)


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
        "`pyrula-stream acls MODULE:AGENT --apply` (see README: ACLs)"
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
    """A consumer from a ``client_config`` result; bad settings raise ``ConfigurationError``."""
    consumer: Consumer = _build(Consumer, conf)
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

    try:
        return SchemaRegistryClient(conf)
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(
            f"invalid Schema Registry settings: {scrub(str(exc), conf)}"
        ) from None


def new_admin(conf: dict[str, Any]) -> AdminClient:
    """An admin client from a ``client_config`` result."""
    admin: AdminClient = _build(AdminClient, conf)
    return admin
