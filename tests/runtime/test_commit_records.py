"""What one commit sends, and when a turn waits for its commits.

- Of the journal records of one key in one commit only the latest is sent, and a step's
  entry and its tombstone that meet in one commit are not sent at all.
- A ``read_only`` tool runs before the model response that asked for it is committed; a
  tool with effects waits for that commit.
- A turn's terminal records and its input offset commit in one transaction.
- Past ``max_pending_records``, a turn whose model call was slow waits for a commit to take
  the buffer before it journals its model's response; a quick one does not.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pyrula_stream import AgentContext, KafkaAgentClient, ToolContext, kafka_agent, tool
from pyrula_stream.errors import PayloadTooLarge
from pyrula_stream.kafka.admin import committed_offsets
from pyrula_stream.kafka.consumers import read_topic
from pyrula_stream.llm import FakeLLM, reply_tool_call
from pyrula_stream.llm.base import ModelResponse, StreamItem
from pyrula_stream.runtime.options import WorkerOptions
from pyrula_stream.testing import running_worker, unique_name, wait_for
from pyrula_stream.wire import serde
from pyrula_stream.wire.events import Event, decode_event
from pyrula_stream.wire.records import (
    OutRecord,
    _size,
    content_type_header,
    latest_only,
    tombstone,
    wire_record,
)
from pyrula_stream.wire.serde import JournalEntry, decode_journal_entry


async def _all(stream: AsyncIterator[Event]) -> list[Event]:
    return [e async for e in stream]


def entry(key: bytes, value: bytes = b"v", *, topic: str = "j") -> OutRecord:
    return OutRecord(topic, key, value, [], 0, compacted=True)


def test_only_the_latest_record_of_a_journal_key_is_sent() -> None:
    event = OutRecord("events", b"t1", b"e", [], None)
    records = [entry(b"t1/progress", b"1"), event, entry(b"t1/progress", b"2"), entry(b"t1/0")]
    assert latest_only(records) == [1, 2, 3]


def test_a_step_and_its_tombstone_in_one_commit_are_not_sent() -> None:
    step = entry(b"t1/1")
    gone = tombstone("j", "t1/1", 0, unsent_key=True)
    terminal = entry(b"t1/terminal")
    assert latest_only([step, gone, terminal]) == [2]


def test_a_tombstone_of_a_key_an_earlier_commit_may_hold_is_sent() -> None:
    # The key's entry rode an earlier commit (no write in this one), or it was restored.
    unsent = tombstone("j", "t1/1", 0, unsent_key=True)
    restored = tombstone("j", "t1/0", 0)
    assert latest_only([unsent, restored]) == [0, 1]
    # A restored key written again in this commit: the tombstone still goes out.
    assert latest_only([entry(b"t1/0"), restored]) == [1]


def test_records_of_other_topics_and_partitions_are_kept() -> None:
    records = [entry(b"k", topic="a"), entry(b"k", topic="b"), OutRecord("a", b"k", None, [], 0)]
    other = OutRecord("j", b"t1/1", b"v", [], 1, compacted=True)
    assert latest_only([*records, entry(b"t1/1"), other]) == [0, 1, 2, 3, 4]


def test_a_deferred_entry_is_encoded_only_when_sent_as_it_was_when_written() -> None:
    data: dict[str, Any] = {"call": 0, "response": {"text": "before"}}
    step = JournalEntry("t1", 1, "llm", "llm", "h", data, 1, 5)
    prepared = {"data": serde.json_text(data)}
    encodes: list[int] = []

    def encode() -> bytes:
        encodes.append(1)
        return serde.encode_prepared("journal_entry", step, prepared)

    deferred = OutRecord("j", b"t1/1", None, [], 0, compacted=True, deferred=encode)
    assert not deferred.is_tombstone
    gone = tombstone("j", "t1/1", 0, unsent_key=True)
    assert latest_only([deferred, gone, entry(b"t1/terminal")]) == [2]
    assert latest_only([gone, deferred]) == [1], "a write after the tombstone is sent"
    data["response"]["text"] = "changed after the step was journaled"
    deferred.materialize()
    deferred.materialize()
    assert encodes == [1] and deferred.value is not None
    decoded = decode_journal_entry(deferred.value, {})
    assert decoded.data == {"call": 0, "response": {"text": "before"}}
    assert deferred.value == serde.encode(
        "journal_entry", JournalEntry("t1", 1, "llm", "llm", "h", decoded.data, 1, 5)
    )


async def test_a_read_only_tool_runs_before_the_response_is_committed_and_others_wait(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """Whether the model call asking for each tool was committed when the tool began."""
    seen: dict[str, bool] = {}

    def committed_model_call(ctx: ToolContext) -> bool:
        """Whether the model call that asked for this tool is committed (steps: 0 the
        start, then a model call and a tool call per round)."""
        turn = ctx.runtime._turn  # type: ignore[union-attr]  # the turn the tool runs in
        model_call = max(i for i, e in turn._written.items() if e.kind == "llm")
        return model_call in turn.journal.steps

    @tool(read_only=True)
    async def look(ctx: ToolContext) -> str:
        """Read something."""
        seen["read_only"] = committed_model_call(ctx)
        return "looked"

    @tool
    async def act(ctx: ToolContext) -> str:
        """Change something."""
        seen["effect"] = committed_model_call(ctx)
        return "acted"

    script: list[Any] = [reply_tool_call("look"), reply_tool_call("act"), "done"]

    @kafka_agent(name=unique_name("barrier"), llm=FakeLLM(script), tools=[look, act])
    async def agent(ctx: AgentContext, q: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": q}])

    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, q="read, then write", timeout=60)
    assert events[-1].type == "run:complete"
    assert seen == {"read_only": False, "effect": True}


async def test_the_end_of_a_turn_commits_its_input_offset_in_the_same_transaction(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """Once a turn's terminal event can be read, its request's offset is committed: the
    worker does not wait for a second commit to move it (commits are 5 s apart here)."""

    @kafka_agent(name=unique_name("endoffset"), llm=FakeLLM(["done"] * 3), partitions=1)
    async def agent(ctx: AgentContext, q: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": q}])

    options = WorkerOptions(commit_interval_s=5.0, shutdown_grace=1.0)
    async with running_worker(agent, kafka_bootstrap_servers, options) as worker:
        for q in ("one", "two"):
            handle = await client.submit(agent.name, q=q)
            stream = client.stream(agent.name, handle.turn_id, since_ms=handle.submitted_ms)
            events = await asyncio.wait_for(_all(stream), 30)
            assert events[-1].type == "run:complete"
            done = committed_offsets(kafka_bootstrap_servers, worker.group_id, agent.topics.turns)
            assert done.get(0) == handle.offset + 1, (q, done, handle.offset)


async def test_records_no_one_waits_for_linger_and_ride_the_commit_someone_waits_for(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """With a linger far longer than the turn's timeout, the turn still ends: the tool with
    effects hurries its response's commit, and the end commits at once, with the last
    delta and ``llm:complete`` in the same transaction (consecutive offsets: a commit
    marker would take one between them)."""

    @tool
    async def act(ctx: ToolContext) -> str:
        """Change something."""
        return "acted"

    class Pausing(FakeLLM):
        """Streams its text in one 600-character delta (past the coalescing size, so the
        delta is emitted at once), then thinks before the response."""

        async def stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[StreamItem]:
            async for item in super().stream(*args, **kwargs):
                if isinstance(item, ModelResponse):
                    await asyncio.sleep(0.5)  # with no linger, the delta commits meanwhile
                yield item

    script: list[Any] = [reply_tool_call("act"), "x" * 600]
    llm = Pausing(script, chunk_chars=600)

    @kafka_agent(name=unique_name("linger"), llm=llm, tools=[act], partitions=1)
    async def agent(ctx: AgentContext, q: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": q}])

    options = WorkerOptions(commit_linger_s=600.0, shutdown_grace=1.0)
    async with running_worker(agent, kafka_bootstrap_servers, options):
        events = await client.run(agent.name, q="act", timeout=30)
    assert events[-1].type == "run:complete"
    records = read_topic(kafka_bootstrap_servers, agent.topics.events)
    kinds = [(r.offset, decode_event(r.value, r.headers).type) for r in records]
    tail = [k for k in kinds if k[1] in ("llm:delta", "llm:complete", "run:complete")][-3:]
    assert [t for _, t in tail] == ["llm:delta", "llm:complete", "run:complete"], kinds
    offsets = [o for o, _ in tail]
    assert offsets == list(range(offsets[0], offsets[0] + 3)), kinds


async def test_model_calls_that_return_together_fill_the_commit_buffer_only_to_its_bound(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """Forty model calls return at once with room for eight records: the turns past the
    bound wait for a commit to take the buffer before they journal their responses, so
    no commit carries the burst (each turn writes five records or more after its model
    call), and every turn still ends once."""
    turns, started = 40, 0
    together = asyncio.Event()

    class Together(FakeLLM):
        """Holds every model call until the test lets them all return."""

        async def stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[StreamItem]:
            nonlocal started
            started += 1
            await together.wait()
            async for item in super().stream(*args, **kwargs):
                yield item

    @kafka_agent(name=unique_name("room"), llm=Together(["done"]), partitions=1)
    async def agent(ctx: AgentContext, i: int) -> str:
        return await ctx.llm.run([{"role": "user", "content": str(i)}])

    options = WorkerOptions(max_concurrent_turns=turns, max_pending_records=8)
    async with running_worker(agent, kafka_bootstrap_servers, options) as worker:
        handles = [await client.submit(agent.name, i=i) for i in range(turns)]
        streams = asyncio.gather(*(_collect(client, agent.name, h.turn_id) for h in handles))
        committer = worker.committer
        # The turns' starts are not bounded (only journaling a response waits): let them
        # commit, then count from the moment every model call returns.
        await wait_for(lambda: started == turns and not committer._pending.records, 60, "starts")
        await committer.wait_idle()
        committer.stats.largest = 0
        together.set()
        results = await asyncio.wait_for(streams, 90)
    for events in results:
        assert [e.type for e in events].count("run:complete") == 1
    assert committer.stats.held > 0, committer.stats
    # Unbounded, most of the 40 turns (5+ records each) ride one commit; bounded, a commit
    # holds the 8 plus what admitted turns wrote and their progress records (28 seen in CI).
    assert committer.stats.largest <= 5 * 8, committer.stats


async def test_quick_model_calls_are_not_held_back_by_the_bound(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """Forty turns on an instant model overfill a buffer of eight, but each call took less
    than a commit: such steps are paced by the commits they await, so none is held back
    (holding them would only split the worker's rounds over more commits)."""

    @kafka_agent(name=unique_name("quick"), llm=FakeLLM(["done"]), partitions=1)
    async def agent(ctx: AgentContext, i: int) -> str:
        return await ctx.llm.run([{"role": "user", "content": str(i)}])

    options = WorkerOptions(max_concurrent_turns=40, max_pending_records=8)
    async with running_worker(agent, kafka_bootstrap_servers, options) as worker:
        await client.run(agent.name, i=-1, timeout=30)  # the worker learns how long a commit takes
        handles = [await client.submit(agent.name, i=i) for i in range(40)]
        results = await asyncio.gather(*(_collect(client, agent.name, h.turn_id) for h in handles))
        stats = worker.committer.stats
    for events in results:
        assert [e.type for e in events].count("run:complete") == 1
    assert stats.largest > 8, stats  # the buffer did pass its bound
    assert stats.held == 0, stats


async def _collect(client: KafkaAgentClient, agent: str, turn_id: str) -> list[Any]:
    return [e async for e in client.stream(agent, turn_id)]


def test_the_size_checked_before_a_record_is_built_is_its_size() -> None:
    headers = [("pyrula.trace", b"00-abc"), ("x", b"")]
    for value in (None, b"", b"v" * 300):
        rec = wire_record("t", b"key", value, "event", headers=headers)
        assert _size(b"key", value, content_type_header("event"), headers) == rec.size
    size = wire_record("t", b"key", b"v" * 300, "event").size
    wire_record("t", b"key", b"v" * 300, "event", max_bytes=size)
    with pytest.raises(PayloadTooLarge, match=f"would be {size} bytes"):
        wire_record("t", b"key", b"v" * 300, "event", max_bytes=size - 1)
