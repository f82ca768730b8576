"""A cooperative rebalance moves the group to its next generation before the worker's
hooks run, and the hooks wait for commits (the intake mark of an assigned partition, the
clean-handover mark of a revoked one). Made with the generation of the poll before,
each of those commits aborted with ILLEGAL_GENERATION and was retried until a hook gave
up; in a loaded suite that loop held a partition for over a minute.
"""

from __future__ import annotations

from pyrula_stream import AgentContext, KafkaAgentClient, WorkerOptions, kafka_agent
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import running_worker, unique_name, wait_for


async def test_a_rebalance_commits_its_marks_without_an_abort(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("handover"), llm=FakeLLM(["done"]), partitions=2)
    async def handover(ctx: AgentContext, n: int) -> str:
        return f"done {n}"

    async with running_worker(
        handover,
        kafka_bootstrap_servers,
        WorkerOptions(shutdown_grace=0.2, worker_id="first"),
        all_partitions=True,
    ) as first:
        before = [await client.run(handover.name, n=n, timeout=60) for n in range(4)]
        assert all(events[-1].type == "run:complete" for events in before)
        async with running_worker(
            handover, kafka_bootstrap_servers, WorkerOptions(shutdown_grace=0.2, worker_id="second")
        ) as second:
            await wait_for(
                lambda: first.assigned_partitions == 1 and second.assigned_partitions == 1,
                60,
                "the partitions were shared",
            )
            after = [await client.run(handover.name, n=n, timeout=60) for n in range(4, 8)]
            assert all(events[-1].type == "run:complete" for events in after)
            await second.committer.flush()
            await first.committer.flush()
            assert second.committer.stats.aborts == 0
            assert first.committer.stats.aborts == 0
