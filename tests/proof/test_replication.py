"""The replication a topic spec gets from the cluster it is applied to."""

from __future__ import annotations

import pytest

from pyrula_stream.errors import ConfigurationError
from pyrula_stream.kafka.admin import TopicSpec, cluster_replicas, with_replication


def test_the_default_is_three_copies_or_every_broker_with_one_less_in_sync() -> None:
    assert [cluster_replicas(n) for n in (1, 2, 3, 5)] == [1, 2, 3, 3]
    spec = TopicSpec("pyrula.a.journal", 6, {"cleanup.policy": "compact"})
    assert with_replication(spec, 1) == (
        1,
        {"cleanup.policy": "compact", "min.insync.replicas": "1"},
    )
    assert with_replication(spec, 5)[0] == 3
    assert with_replication(spec, 5)[1]["min.insync.replicas"] == "2"


def test_a_spec_may_set_its_own_and_is_refused_past_the_brokers() -> None:
    own = TopicSpec("pyrula.a.dlq", 1, {"min.insync.replicas": "1"}, replicas=2)
    assert with_replication(own, 3) == (2, {"min.insync.replicas": "1"})
    with pytest.raises(ConfigurationError, match=r"pyrula\.a\.dlq asks for 2 replicas .* 1 broker"):
        with_replication(own, 1)
