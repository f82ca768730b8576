"""Fixtures of the black-box proofs: the three-broker cluster, started once per session
and only for the tests that ask for it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyrula_stream.kafka.local.cluster import LocalCluster


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[LocalCluster]:
    """A local cluster of three brokers and a controller, started once per session and
    only when a test (marked ``cluster``) asks for it."""
    from pyrula_stream.kafka.local.cluster import start_local_cluster

    cluster = start_local_cluster(3)
    try:
        yield cluster
    finally:
        cluster.stop()
