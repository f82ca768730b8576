"""``--secured``: a chaos run on a SASL_SSL broker with the generated ACLs, one principal a role.

The harness starts its own local broker with SCRAM users (``ROLES``; ``admin`` is the
super user) and KRaft's ``StandardAuthorizer`` denying whatever no ACL allows, creates the
run's topics as ``admin`` and applies what ``pyrula-stream acls`` generates for the chaos
agent (worker, client, reviewer and operator principals). Then each part of the run
connects as the role it plays: the workers as ``chaos_worker`` (a properties file given
with ``--kafka-config``), the submitter and the hostile records on the topics a client
may write (``hostile.client_topics``) as ``chaos_client``; hostile replies, and the
harness's own readers (monitor, settle, checks), as ``admin``. So a forged answer is
refused by the broker (no WRITE on ``<agent>.answers`` or ``.replies``) or by the worker
(``wrong_topic`` on ``<agent>.signals``), as it would be on a secured cluster.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyrula_stream.errors import ConfigurationError
from pyrula_stream.kafka.acls import agent_acls, apply_acls
from pyrula_stream.kafka.admin import DEFAULT_PREFIX, TopicSpec
from pyrula_stream.kafka.local.broker import LocalBroker, start_local_broker
from pyrula_stream.kafka.stores.cache import cache_topic_spec
from pyrula_stream.kafka.stores.memory import memory_topic_spec

WORKER = "chaos_worker"
CLIENT = "chaos_client"
REVIEWER = "chaos_reviewer"
OPERATOR = "chaos_operator"
ROLES = (WORKER, CLIENT, REVIEWER, OPERATOR)


@dataclass
class SecuredBroker:
    """The run's secured broker and the client settings of each role."""

    broker: LocalBroker
    run_dir: Path

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap_servers

    def settings(self, user: str) -> dict[str, Any]:
        assert self.broker.security is not None
        return self.broker.security.client_settings(user)

    @property
    def admin(self) -> dict[str, Any]:
        return self.broker.admin_settings()

    def properties_file(self, user: str) -> Path:
        """``user``'s settings as a ``--kafka-config`` file, readable by us alone."""
        path = self.run_dir / f"{user}.properties"
        text = "".join(f"{k}={v}\n" for k, v in self.settings(user).items())
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
        return path

    def grant(self, agent: str, *, tenants: bool) -> int:
        """Apply the generated ACLs of ``agent`` for the four roles; returns how many."""
        rules = agent_acls(
            agent,
            prefix=DEFAULT_PREFIX,
            worker_principal=f"User:{WORKER}",
            client_principal=f"User:{CLIENT}",
            reviewer_principal=f"User:{REVIEWER}",
            operator_principal=f"User:{OPERATOR}",
            tenants=tenants,
        )
        apply_acls(self.bootstrap, rules, kafka_config=self.admin)
        return len(rules)


def shared_topic_specs() -> list[TopicSpec]:
    """The shared tool cache and memory topics: a worker may not create them (no CREATE
    right), so the harness does, as ``pyrula-stream topics apply`` would."""
    return [cache_topic_spec(prefix=DEFAULT_PREFIX), memory_topic_spec(prefix=DEFAULT_PREFIX)]


def check_secured(
    *,
    bootstrap_servers: str | None,
    broker_restarts: int,
    brokers: int,
    subagents: bool,
    approvals: bool,
) -> None:
    """A secured run has its own single broker and no part that would need more roles
    (``$KAFKA_BOOTSTRAP_SERVERS`` only turns the default off: see ``__main__``)."""
    clash = [
        name
        for name, on in (
            ("--bootstrap-servers", bool(bootstrap_servers)),
            ("--broker-restarts", broker_restarts > 0),
            ("--brokers", brokers > 1),
            ("--subagents", subagents),
            ("--approvals", approvals),
        )
        if on
    ]
    if clash:
        raise ConfigurationError(
            f"--secured runs its own SASL broker with the chaos agent's ACLs; it does not "
            f"combine with {', '.join(clash)} (use --no-secured)"
        )


@contextlib.contextmanager
def secured_broker(run_dir: Path) -> Iterator[SecuredBroker]:
    """A SASL_SSL local broker with the users of ``ROLES``, stopped at the end."""
    broker = start_local_broker(
        data_dir=run_dir / "kafka-secured",
        scram_users={name: uuid.uuid4().hex for name in ROLES},
    )
    try:
        yield SecuredBroker(broker, run_dir)
    finally:
        broker.stop()
