"""Redriving dead letters on the real broker: a fixed cause, the command run twice (and
twice at once), the turn run once; a quarantined poison turn redriven after its fix."""

from __future__ import annotations

import asyncio
import json

import pytest

from pyrula_stream import (
    AgentContext,
    KafkaAgentClient,
    Poison,
    ToolContext,
    WorkerOptions,
    kafka_agent,
    tool,
)
from pyrula_stream.agent.definition import AgentTopics
from pyrula_stream.cli import main
from pyrula_stream.client.redrive import REDRIVE_OF_HEADER, DeadLetter, DeadLetters
from pyrula_stream.errors import UnknownTopicError
from pyrula_stream.kafka.admin import missing_topics
from pyrula_stream.kafka.once import RawRecord, WriteNotDone
from pyrula_stream.llm import FakeLLM, reply_tool_call
from pyrula_stream.testing import read_topic, running_worker, unique_name, wait_for
from pyrula_stream.wire.events import decode_event
from pyrula_stream.wire.fitting import TRIMMED_HEADER
from pyrula_stream.wire.guard import DecodeLimits


def _event_types(bootstrap: str, topic: str, turn_id: str) -> list[str]:
    """The types of one turn's events on ``<agent>.events``, in order."""
    events = (decode_event(v or b"", h) for _, v, h in read_topic(bootstrap, topic))
    return [e.type for e in events if e.turn_id == turn_id]


def _copies(bootstrap: str, topic: str) -> list[dict[str, str]]:
    """The headers of every redriven record on ``topic``."""
    return [h for _, _, h in read_topic(bootstrap, topic) if REDRIVE_OF_HEADER in h]


async def test_a_fixed_dead_letter_redriven_twice_runs_once(
    kafka_bootstrap_servers: str,
    client: KafkaAgentClient,
    capsys: pytest.CaptureFixture[str],
) -> None:
    runs: list[int] = []

    @kafka_agent(name=unique_name("redrive"), llm=FakeLLM(["ok"]), partitions=1)
    async def agent(ctx: AgentContext, question: str) -> str:
        runs.append(len(question))
        return "answered"

    bs = kafka_bootstrap_servers
    small = WorkerOptions(decode_limits=DecodeLimits(max_bytes=2000))
    async with running_worker(agent, bs, small):
        handle = await client.submit(agent.name, question="x" * 5000)
        await wait_for(lambda: len(read_topic(bs, agent.topics.dlq)) == 1, 30, "a dead letter")
    assert runs == []
    notes_topic = agent.topics.dlq_redrives
    assert missing_topics(bs, [notes_topic]) == [notes_topic]  # workers never use it

    capsys.readouterr()
    assert main(["dlq", "list", agent.name, "--bootstrap-servers", bs]) == 0
    (listed,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert listed["offset"] == 0
    assert listed["code"] == "invalid_request"
    assert "max_bytes" in listed["reason"]
    assert listed["source"] == f"{agent.topics.turns}[0]@{handle.offset}"
    assert listed["redriven"] is None

    argv = ["dlq", "redrive", agent.name, "--offset", "0", "--bootstrap-servers", bs]
    async with running_worker(agent, bs):  # the cause fixed: default limits
        assert await asyncio.to_thread(main, [*argv, "--by", "ops-ann"]) == 0
        assert await asyncio.to_thread(main, [*argv, "--by", "ops-bob"]) == 0
        first, second = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert first["outcome"] == "redriven", first
        assert second["outcome"] == "already_redriven", second
        assert "ops-ann" in second["detail"]
        events = [e async for e in client.stream(agent.name, handle.turn_id)]
        assert events[-1].type == "run:complete"
        after = await client.run(agent.name, question="later")  # behind any second copy
        assert after[-1].type == "run:complete"

    assert runs == [5000, 5]
    (copy,) = _copies(bs, agent.topics.turns)
    assert copy[REDRIVE_OF_HEADER] == f"{agent.topics.dlq}[0]@0"
    assert copy["pyrula.redrive.by"] == "ops-ann"
    notes = read_topic(bs, agent.topics.dlq_redrives)
    assert [k for k, _, _ in notes] == [b"0"]
    assert json.loads(notes[0][1] or b"")["by"] == "ops-ann"

    assert main(["dlq", "list", agent.name, "--bootstrap-servers", bs]) == 0
    (listed,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert listed["redriven"]["by"] == "ops-ann"


async def test_two_redrives_at_once_copy_a_dead_letter_once(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("redrive2"), llm=FakeLLM(["ok"]), partitions=1)
    async def agent(ctx: AgentContext, question: str) -> str:
        return "answered"

    bs = kafka_bootstrap_servers
    small = WorkerOptions(decode_limits=DecodeLimits(max_bytes=2000))
    async with running_worker(agent, bs, small):
        for _ in range(3):
            await client.submit(agent.name, question="y" * 5000)
        await wait_for(lambda: len(read_topic(bs, agent.topics.dlq)) == 3, 30, "dead letters")

    def redrive(by: str) -> list[str]:
        try:
            letters = DeadLetters(bs, agent.name).redrive(by=by, reason="max_bytes")
        except WriteNotDone:  # fenced by the other run: it wrote nothing
            return []
        return [r.outcome for r in letters]

    outcomes = await asyncio.gather(
        *(asyncio.to_thread(redrive, by) for by in ("a", "b", "c", "d"))
    )
    assert sum(o.count("redriven") for o in outcomes) <= 3
    leftover = redrive("e")  # whatever no run finished, this one does
    assert len(leftover) == 3
    assert len(_copies(bs, agent.topics.turns)) == 3
    offsets = [str(d.offset).encode() for d in DeadLetters(bs, agent.name).find()]
    assert sorted(k for k, _, _ in read_topic(bs, agent.topics.dlq_redrives)) == offsets


async def test_a_quarantined_poison_turn_is_redriven_after_its_fix(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    broken = [True]

    @tool
    async def lookup(ctx: ToolContext) -> str:
        """Fails for good while the tenant it needs is missing."""
        if broken[0]:
            raise Poison("record refers to a deleted tenant")
        return "found"

    @kafka_agent(
        name=unique_name("redrivepoison"),
        llm=FakeLLM([reply_tool_call("lookup"), "done"]),
        tools=[lookup],
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "go"}])

    bs = kafka_bootstrap_servers
    async with running_worker(agent, bs, all_partitions=True):
        handle = await client.submit(agent.name)
        events = [e async for e in client.stream(agent.name, handle.turn_id)]
        assert events[-1].data["code"] == "poison_quarantine"

        broken[0] = False
        (result,) = await asyncio.to_thread(
            DeadLetters(bs, agent.name).redrive, by="ops", code="poison_quarantine"
        )
        assert result.outcome == "redriven", result
        assert result.topic == agent.topics.turns

        def types() -> list[str]:
            return _event_types(bs, agent.topics.events, handle.turn_id)

        await wait_for(lambda: "run:complete" in types(), 60, "the redriven turn completes")
    assert types().count("run:error") == 1


def test_an_agent_without_its_topics_gets_a_clear_error(kafka_bootstrap_servers: str) -> None:
    letters = DeadLetters(kafka_bootstrap_servers, unique_name("nosuch"), timeout_s=5)
    with pytest.raises(UnknownTopicError, match="topics apply") as missing:
        letters.find()
    assert letters.topics.dlq in str(missing.value)


def test_topics_apply_creates_the_notes_topic(kafka_bootstrap_servers: str) -> None:
    agent = unique_name("redriveapply")
    args = ["topics", "apply", agent, "--partitions", "1"]
    assert main([*args, "--bootstrap-servers", kafka_bootstrap_servers]) == 0
    assert missing_topics(kafka_bootstrap_servers, [f"pyrula.{agent}.dlq-redrives"]) == []


def test_a_trimmed_dead_letter_is_not_redriven_cut() -> None:
    """A letter cut to fit a record holds part of the record: sending that back would run
    a different request, so it is refused with what was cut."""
    topics = AgentTopics.for_agent("trimmed")
    source = (("pyrula.dlq.source", f"{topics.turns}[0]@7".encode()),)
    whole = RawRecord(0, 3, b"k", b"{}", (("pyrula.dlq.code", b"invalid_request"), *source))
    cut = RawRecord(
        0,
        4,
        b"k",
        b"{",
        (
            ("pyrula.dlq.code", b"invalid_request"),
            *source,
            (TRIMMED_HEADER, b"value: kept 1 of 1044188 bytes"),
        ),
    )
    assert DeadLetter.from_record(whole, None).target(topics) == (topics.turns, 0)
    why = DeadLetter.from_record(cut, None).target(topics)
    assert why == "the dead letter holds a cut copy of the record (value: kept 1 of 1044188 bytes)"


@pytest.mark.parametrize(
    "value",
    [b"[" * 100_000, b'{"dlq_offset": ' + b"[" * 100_000, b"\xff\xfe", b"[]", b"null"],
)
def test_a_note_we_did_not_write_reads_as_no_note(value: bytes) -> None:
    """Anyone who may write the notes topic may write anything there: a note nested past
    the parser's depth, or not UTF-8, reads as "not redriven", never as a crash of
    ``dlq list``."""
    from pyrula_stream.client.redrive import RedriveNote

    assert RedriveNote.parse(value) is None
