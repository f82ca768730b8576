"""Fixtures of the Kafka tests: the schema registry, started once for the tests of this
folder that ask for it and stopped when they are done (the plugin's own fixture would
keep its JVM running to the end of the session), and one secured broker (SASL_SSL,
StandardAuthorizer) shared by the modules that test ACLs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pyrula_stream.kafka.local.broker import LocalBroker, start_local_broker
from pyrula_stream.testing import local_schema_registry, unique_name

SECURED_USERS = (
    # test_secured_kafka.py
    "worker_a",
    "client_a",
    "status_a",
    "worker_b",
    "worker_c",
    "client_c",
    "nobody",
    "no_txn",
    "no_group",
    # test_roles.py
    "worker_x",
    "client_x",
    "client_y",
    "reviewer_x",
    "worker_caller",
    "worker_child",
    "operator_t",
    "operator_x",
    "evals_x",
    # test_forged_lineage.py
    "worker_f",
    "client_f",
)
"""The SCRAM users of the secured broker (made when it is formatted, so listed here)."""


@pytest.fixture(scope="package")
def schema_registry_url() -> Iterator[str]:
    with local_schema_registry() as url:
        yield url


@pytest.fixture(scope="session")
def secured_broker() -> Iterator[LocalBroker]:
    """A SASL_SSL broker (SCRAM-SHA-512, TLS, KRaft's StandardAuthorizer with
    ``allow.everyone.if.no.acl.found=false``) with ``SECURED_USERS`` and no ACLs: each
    module grants its own agents' ACLs, as an operator would."""
    broker = start_local_broker(scram_users={name: unique_name("pw") for name in SECURED_USERS})
    try:
        yield broker
    finally:
        broker.stop()
