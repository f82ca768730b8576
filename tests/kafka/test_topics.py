"""`topics apply` creates what is missing, keeps what matches, reports drift, never deletes."""

from __future__ import annotations

from datetime import timedelta

import pytest

from pyrula_stream import AgentContext, AgentRegistrationError, TopicDriftError, kafka_agent
from pyrula_stream.kafka.admin import agent_topic_specs, apply_topics
from pyrula_stream.kafka.stores.cache import cache_topic_spec
from pyrula_stream.kafka.stores.memory import memory_topic_spec
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import running_worker, unique_name


def test_apply_creates_then_matches(kafka_bootstrap_servers: str) -> None:
    agent = unique_name("topics")
    specs = agent_topic_specs(agent, partitions=3)
    assert [s.name for s in specs] == [
        f"pyrula.{agent}.turns",
        f"pyrula.{agent}.events",
        f"pyrula.{agent}.journal",
        f"pyrula.{agent}.replies",
        f"pyrula.{agent}.signals",
        f"pyrula.{agent}.answers",
        f"pyrula.{agent}.threads",
        f"pyrula.{agent}.control",
        f"pyrula.{agent}.dlq",
        f"pyrula.{agent}.results",
        f"pyrula.{agent}.scores",
    ]
    journal = specs[2]
    assert journal.config["cleanup.policy"] == "compact"
    assert journal.partitions == specs[0].partitions == 3

    first = apply_topics(kafka_bootstrap_servers, specs)
    assert sorted(first.created) == sorted(s.name for s in specs)
    assert first.ok

    again = apply_topics(kafka_bootstrap_servers, specs)
    assert again.created == []
    assert sorted(again.matched) == sorted(s.name for s in specs)


def test_drift_is_reported_and_nothing_changes(kafka_bootstrap_servers: str) -> None:
    agent = unique_name("drift")
    apply_topics(kafka_bootstrap_servers, agent_topic_specs(agent, partitions=2))
    report = apply_topics(kafka_bootstrap_servers, agent_topic_specs(agent, partitions=4))
    assert not report.ok
    assert f"pyrula.{agent}.turns: partitions is 2, spec says 4" in report.drift
    assert f"pyrula.{agent}.journal: partitions is 2, spec says 4" in report.drift
    # still 2: apply never alters an existing topic
    unchanged = apply_topics(kafka_bootstrap_servers, agent_topic_specs(agent, partitions=2))
    assert unchanged.ok


async def test_worker_refuses_to_start_on_drift(kafka_bootstrap_servers: str) -> None:
    name = unique_name("refuse")
    apply_topics(kafka_bootstrap_servers, agent_topic_specs(name, partitions=1))

    @kafka_agent(name=name, partitions=3, llm=FakeLLM())
    async def agent(ctx: AgentContext) -> str:
        return "never"

    with pytest.raises(TopicDriftError, match="partitions is 1, spec says 3"):
        async with running_worker(agent, kafka_bootstrap_servers):
            pass


def test_the_history_topic_comes_only_with_keep_history() -> None:
    agent = unique_name("hist")
    assert not any(s.name.endswith(".history") for s in agent_topic_specs(agent))
    (history,) = [
        s
        for s in agent_topic_specs(agent, partitions=3, keep_history=True)
        if s.name.endswith(".history")
    ]
    assert history.name == f"pyrula.{agent}.history"
    assert history.config["cleanup.policy"] == "delete"
    assert history.partitions == 3


def test_the_shared_topics_come_from_their_spec_files() -> None:
    """The cache and memory topics are read by the same loader as an agent's topics."""
    cache = cache_topic_spec(prefix="acme", partitions=4)
    memory = memory_topic_spec(prefix="acme")
    assert (cache.name, cache.partitions) == ("acme.cache", 4)
    assert (memory.name, memory.partitions) == ("acme.memory", 3)
    assert cache.config["cleanup.policy"] == memory.config["cleanup.policy"] == "compact"
    assert cache.config["delete.retention.ms"] == "3600000"
    assert memory.config["delete.retention.ms"] == "86400000"


async def test_keep_history_as_a_retention_sets_the_history_topics_retention(
    kafka_bootstrap_servers: str,
) -> None:
    @kafka_agent(name=unique_name("histret"), llm=FakeLLM(), keep_history=timedelta(days=30))
    async def agent(ctx: AgentContext) -> str:
        return "ok"

    assert agent.keep_history
    async with running_worker(agent, kafka_bootstrap_servers):  # creates the topics
        pass
    month = "2592000000"
    history = agent.topics.history
    assert apply_topics(kafka_bootstrap_servers, agent.topic_specs()).ok
    week = agent_topic_specs(agent.name, partitions=agent.partitions, keep_history=True)
    drift = apply_topics(kafka_bootstrap_servers, week).drift
    assert drift == [f"{history}: retention.ms is {month!r}, spec says '604800000'"]

    with pytest.raises(AgentRegistrationError, match="keep_history must be"):
        kafka_agent(name="x", keep_history=30)(agent.fn)  # type: ignore[arg-type]
    with pytest.raises(AgentRegistrationError, match="keep_history must be"):
        kafka_agent(name="x", keep_history=timedelta(0))(agent.fn)
