"""Experiments: a deterministic, salted split by key, and refusals at bind time."""

from __future__ import annotations

import pytest

from pyrula_stream import AgentContext, Experiment, kafka_agent
from pyrula_stream.errors import AgentRegistrationError


async def body(ctx: AgentContext) -> str:
    return "ok"


def test_the_split_is_deterministic_and_near_the_shares() -> None:
    exp = Experiment("prompt", {"1": 0.8, "2": 0.2})
    keys = [f"thread-{i}" for i in range(10_000)]
    first = [exp.variant_for(k) for k in keys]
    assert first == [exp.variant_for(k) for k in keys]  # every worker, every time
    # Declaration order does not move a key: workers with differently ordered code agree.
    assert first == [Experiment("prompt", {"2": 0.2, "1": 0.8}).variant_for(k) for k in keys]
    # 20% of 10,000: sd = 40, so 4 sd either side.
    assert 1840 <= first.count("2") <= 2160
    # The name salts the hash: another experiment splits the same keys differently.
    other = [Experiment("model", {"1": 0.8, "2": 0.2}).variant_for(k) for k in keys]
    assert other != first


@pytest.mark.parametrize(
    ("variants", "message"),
    [
        ({"1": 1.0}, "at least two variants"),
        ({"1": 0.5, "2": 0.4}, "add up to 0.9, not 1"),
        ({"1": 1.0, "2": 0.0}, "a share is a number > 0"),
        ({"1": 0.5, "": 0.5}, "must be a version name"),
    ],
)
def test_bad_experiments_are_refused(variants: dict[str, float], message: str) -> None:
    with pytest.raises(AgentRegistrationError, match=message):
        Experiment("e", variants)


def test_every_variant_must_be_a_version_of_the_code() -> None:
    exp = Experiment("e", {"1": 0.5, "2": 0.5})
    with pytest.raises(AgentRegistrationError, match=r"versions \['1'\] that this code lacks"):
        kafka_agent(name="x", version="2", experiment=exp)(body)
    with pytest.raises(AgentRegistrationError, match="needs version_behavior='pinned'"):
        kafka_agent(
            name="x",
            version="2",
            versions={"1": body},
            version_behavior="auto_upgrade",
            experiment=exp,
        )(body)
    agent = kafka_agent(name="x", version="2", versions={"1": body}, experiment=exp)(body)
    assert agent.experiment is exp
