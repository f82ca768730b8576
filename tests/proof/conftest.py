"""Fixtures of the black-box proofs: the three-broker cluster, started once and only for
the tests that ask for it, and stopped when this folder's tests are done (four idle JVMs
would otherwise share the machine's two cores with every test after them)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyrula_stream.kafka.local.cluster import LocalCluster


@pytest.fixture(scope="package")
def kafka_cluster() -> Iterator[LocalCluster]:
    """A local cluster of three brokers and a controller, started once and only when
    a test (marked ``cluster``) asks for it."""
    from pyrula_stream.kafka.local.cluster import start_local_cluster

    cluster = start_local_cluster(3)
    try:
        yield cluster
    finally:
        cluster.stop()
