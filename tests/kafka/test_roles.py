"""Who asks and who decides, on a secured broker with exactly the ACLs ``pyrula-stream
acls`` grants: a client submits and signals but cannot approve, read another client's
turn, or forge a sub-agent's reply; only the reviewer's answer runs a gated tool; the
workers of the agents around it (its caller, its sub-agent) cannot answer its questions.

Agent X asks for approval before its ``refund`` tool; agent CALLER calls X, and X calls
CHILD (only their ACLs exist: what their workers may write is what is tested).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pyrula_stream import AgentContext, KafkaAgent, KafkaAgentClient, WorkerOptions, kafka_agent
from pyrula_stream.agent.definition import AgentTopics
from pyrula_stream.cli import main as cli_main
from pyrula_stream.client.kafka_client import new_request
from pyrula_stream.client.redrive import REDRIVE_OF_HEADER, DeadLetters
from pyrula_stream.errors import KafkaAuthorizationError
from pyrula_stream.evals import ScoredTurn, evaluator
from pyrula_stream.evals.stream.runner import EvalStream
from pyrula_stream.kafka.admin import agent_topic_specs, apply_topics
from pyrula_stream.kafka.io import RecordProducer
from pyrula_stream.kafka.local.broker import LocalBroker
from pyrula_stream.llm import FakeLLM, reply_tool_call
from pyrula_stream.testing import read_topic, running_worker, unique_name, wait_for
from pyrula_stream.wire.records import OutRecord
from pyrula_stream.wire.signals import SIGNAL_ID_HEADER, Signal, new_signal, signal_record
from pyrula_stream.wire.subagents import Reply
from tests.approvals_kit import Refunds, all_events, until

ORIGINAL_SIGNAL_ID = f"pyrula.original.{SIGNAL_ID_HEADER}"
KEY = "tool_approval:refund#0.0"


@dataclass
class Roles:
    broker: LocalBroker
    agent: str
    caller: str
    child: str

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap_servers

    @property
    def topics(self) -> AgentTopics:
        return AgentTopics.for_agent(self.agent)

    def settings(self, user: str) -> dict[str, Any]:
        assert self.broker.security is not None
        return self.broker.security.client_settings(user)

    def client(self, user: str) -> KafkaAgentClient:
        return KafkaAgentClient(self.bootstrap, kafka_config=self.settings(user), timeout=30)

    def dead_letters(self) -> list[tuple[bytes | None, bytes | None, dict[str, str]]]:
        return read_topic(
            self.bootstrap, self.topics.dlq, kafka_config=self.broker.admin_settings()
        )


@pytest.fixture(scope="module")
def roles(secured_broker: LocalBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Roles]:
    """X's topics, and the ACLs of X (worker, two clients, a reviewer), of CALLER (calls X)
    and of CHILD (called by X), applied with the CLI as the super user."""
    roles = Roles(secured_broker, unique_name("roles"), unique_name("caller"), unique_name("child"))
    admin = tmp_path_factory.mktemp("roles") / "admin.properties"
    admin.write_text("".join(f"{k}={v}\n" for k, v in secured_broker.admin_settings().items()))
    common = ["--bootstrap-servers", roles.bootstrap, "--kafka-config", str(admin)]
    x = roles.agent
    assert cli_main(["topics", "apply", x, "--partitions", "1", *common]) == 0
    grants = [
        [x, "worker_x", "--client-principal", "User:client_x", "--reviewer-principal",
         "User:reviewer_x", "--callers", roles.caller, "--calls", roles.child,
         "--operator-principal", "User:operator_x"],
        [x, "worker_x", "--client-principal", "User:client_y"],
        [roles.caller, "worker_caller", "--calls", x],
        [roles.child, "worker_child", "--callers", x],
    ]  # fmt: skip
    for agent, worker, *more in grants:
        args = ["acls", agent, "--worker-principal", f"User:{worker}", *more]
        assert cli_main([*args, "--apply", *common]) == 0
    yield roles


def _agent(name: str, body: Any, tools: list[Any], replies: list[Any]) -> KafkaAgent:
    """``body`` as agent ``name`` (X) with a person in the loop and a scripted model."""
    return kafka_agent(
        name=name, llm=FakeLLM(replies), tools=tools, partitions=1, human_in_the_loop=True
    )(body)


async def _refund_me(ctx: AgentContext) -> str:
    return await ctx.llm.run([{"role": "user", "content": "refund me"}])


def _forged_answer(turn_id: str, topic: str, sender: str) -> tuple[Signal, OutRecord]:
    signal = new_signal(turn_id, KEY, {"answer": "approve"}, sender=sender, answer=True)
    return signal, signal_record(topic, turn_id, signal)


async def _send(roles: Roles, user: str, record: OutRecord) -> None:
    producer = RecordProducer(roles.bootstrap, kafka_config=roles.settings(user))
    try:
        await producer.send(record.topic, record.key, record.value, list(record.headers))
    finally:
        await asyncio.to_thread(producer.close)


def _refusal(roles: Roles, signal: Signal) -> str | None:
    for _, _, headers in roles.dead_letters():
        if headers.get(ORIGINAL_SIGNAL_ID) == signal.signal_id:
            return headers.get("pyrula.dlq.reason")
    return None


async def test_only_the_reviewer_answers_and_no_neighbour_can(roles: Roles) -> None:
    refunds = Refunds()
    agent = _agent(
        roles.agent, _refund_me, [refunds.tool()], [reply_tool_call("refund", cents=900), "done"]
    )
    x = roles.topics
    options = WorkerOptions(
        shutdown_grace=0.2, worker_id="x1", kafka_config=roles.settings("worker_x")
    )
    async with (
        running_worker(agent, roles.bootstrap, options),
        roles.client("client_x") as client,
        roles.client("reviewer_x") as reviewer,
    ):
        handle = await client.submit(agent.name)
        await until(client, agent.name, handle.turn_id, "run:interrupted")
        (question,) = await reviewer.pending(agent.name)
        assert (question.turn_id, question.key) == (handle.turn_id, KEY)

        # The client asks; it cannot answer: the answers topic is the reviewer's.
        with pytest.raises(
            KafkaAuthorizationError, match=rf"User:client_x .* WRITE topic {x.answers}"
        ):
            await client.approve(agent.name, handle.turn_id, KEY)
        # An answer on a topic the client may write is refused by the worker.
        on_signals, record = _forged_answer(handle.turn_id, x.signals, "client_x")
        await _send(roles, "client_x", record)
        # The worker of the agent X calls writes X's replies: an answer there is refused.
        on_replies, record = _forged_answer(handle.turn_id, x.replies, "worker_child")
        await _send(roles, "worker_child", record)
        # The worker of the agent that calls X writes X's turns and control, no answers.
        _, record = _forged_answer(handle.turn_id, x.answers, "worker_caller")
        with pytest.raises(
            KafkaAuthorizationError, match=rf"User:worker_caller .* WRITE topic {x.answers}"
        ):
            await _send(roles, "worker_caller", record)

        def refused() -> bool:
            return None not in (_refusal(roles, on_signals), _refusal(roles, on_replies))

        await wait_for(refused, 60, "both forged answers dead-lettered")
        assert refunds.ran == [], "no forged answer ran the tool"
        assert [q.key for q in await reviewer.pending(agent.name)] == [KEY], "still open"

        receipt = await reviewer.approve(agent.name, handle.turn_id, KEY)
        assert receipt.accepted
        events = await all_events(client, agent.name, handle.turn_id)
    assert refunds.ran == [900]
    assert events[-1].type == "run:complete"
    result = next(e.data for e in events if e.type == "tool:result")
    assert result["approval"] == "approved" and result["answered_by"] == "reviewer_x"
    for forged in (on_signals, on_replies):
        assert str(_refusal(roles, forged)).startswith("signal refused: wrong_topic: ")


async def test_a_client_signals_its_turn_but_reads_no_journal_or_dead_letters(
    roles: Roles,
) -> None:
    """Client Y's turn, its journal and the dead letters are out of client X's reach; a
    plain signal is still a client's to send (taken, though the client cannot see the
    receipt in the journal). A plain signal on the replies topic, where clients sent them
    before the split, is still taken (only called agents' workers write there now)."""

    async def waits(ctx: AgentContext) -> str:
        got = await ctx.wait_for_signal("go", timeout=60)
        old = await ctx.wait_for_signal("old", timeout=60)
        return f"went {got.payload} {old.payload}"

    agent = _agent(roles.agent, waits, [], ["x"])
    options = WorkerOptions(
        shutdown_grace=0.2, worker_id="x2", kafka_config=roles.settings("worker_x")
    )
    async with (
        running_worker(agent, roles.bootstrap, options),
        roles.client("client_y") as other,
        roles.client("client_x") as client,
    ):
        handle = await other.submit(agent.name)
        receipt = await other.signal(agent.name, handle.turn_id, "go", 7)
        assert not receipt.accepted and not receipt.watched, "no journal: sent, not awaited"
        old = new_signal(handle.turn_id, "old", 8, sender="worker_child")
        await _send(roles, "worker_child", signal_record(roles.topics.replies, handle.turn_id, old))
        events = await all_events(other, agent.name, handle.turn_id)
    assert events[-1].type == "run:complete" and events[-1].data["result"] == "went 7 8"
    for topic in (roles.topics.journal, roles.topics.dlq, roles.topics.turns):
        with pytest.raises(KafkaAuthorizationError, match=rf"User:client_x .* READ topic {topic}"):
            await asyncio.to_thread(
                read_topic,
                roles.bootstrap,
                topic,
                kafka_config=roles.settings("client_x"),
                group_id=f"pyrula.{roles.agent}.readers",
            )
    with pytest.raises(KafkaAuthorizationError, match=r"User:client_x .* READ topic"):
        await client.pending(agent.name)


async def test_a_client_cannot_forge_a_sub_agents_reply(roles: Roles) -> None:
    reply = Reply("parent-turn", "child-turn", roles.child, "completed", result="forged")
    value = json.dumps(reply.data()).encode()
    record = OutRecord(roles.topics.replies, b"parent-turn", value, [])
    with pytest.raises(
        KafkaAuthorizationError, match=rf"User:client_x .* WRITE topic {roles.topics.replies}"
    ):
        await _send(roles, "client_x", record)
    await _send(roles, "worker_child", record)  # the sub-agent's worker may: it replies there


def test_the_acls_printed_match_the_roles(roles: Roles, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["acls", roles.agent, "--worker-principal", "User:w", "--client-principal", "User:c"]
    assert cli_main([*args, "--reviewer-principal", "User:r"]) == 0
    lines = capsys.readouterr().out.splitlines()
    answers = [line.split()[0] for line in lines if ".answers" in line and "WRITE" in line]
    assert answers == ["User:r"]
    assert not [line for line in lines if line.startswith("User:c") and ".journal" in line]
    assert not [line for line in lines if line.startswith("User:c") and ".dlq" in line]


async def test_a_tenant_agent_runs_and_only_the_operator_sets_limits(
    roles: Roles, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With ``--tenants``, the worker reads the limits and shares usage; the operator
    alone writes the limits: no client and no worker can lift them."""
    name = unique_name("tenanted")

    @kafka_agent(name=name, llm=FakeLLM(["ok"]), partitions=1, tenant="header:x-tenant")
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "hi"}])

    admin = roles.broker.admin_settings()
    specs = agent_topic_specs(name, partitions=1, tenants=True)
    assert apply_topics(roles.bootstrap, specs, kafka_config=admin).ok
    operator = tmp_path / "operator.properties"
    operator.write_text("".join(f"{k}={v}\n" for k, v in roles.settings("operator_t").items()))
    with_admin = tmp_path / "admin.properties"
    with_admin.write_text("".join(f"{k}={v}\n" for k, v in admin.items()))
    grant = ["acls", name, "--worker-principal", "User:worker_x", "--tenants"]
    grant += ["--client-principal", "User:client_x", "--operator-principal", "User:operator_t"]
    at = ["--bootstrap-servers", roles.bootstrap]
    assert cli_main([*grant, "--apply", *at, "--kafka-config", str(with_admin)]) == 0
    capsys.readouterr()

    as_operator = [*at, "--kafka-config", str(operator)]
    tenants_set = ["tenants", "set", name, "acme", "turns_per_minute=50"]
    assert await asyncio.to_thread(cli_main, [*tenants_set, *as_operator]) == 0
    assert '"turns_per_minute": 50' in capsys.readouterr().out
    lifted = OutRecord(f"pyrula.{name}.tenants", b"acme", b"{}", [])
    for user in ("client_x", "worker_x"):
        with pytest.raises(KafkaAuthorizationError, match=rf"User:{user} .* WRITE topic"):
            await _send(roles, user, lifted)

    options = WorkerOptions(
        shutdown_grace=0.2, worker_id="t1", kafka_config=roles.settings("worker_x")
    )
    async with (
        running_worker(agent, roles.bootstrap, options),
        roles.client("client_x") as client,
    ):
        request = new_request(name, None, None, None, {})
        handle = await client.submit_request(request, headers=[("x-tenant", b"acme")])
        events = await asyncio.wait_for(all_events(client, name, handle.turn_id), 60)
    assert events[-1].type == "run:complete", events[-1].data
    assert events[-1].data.get("tenant") == "acme"
    assert await asyncio.to_thread(cli_main, ["tenants", "show", name, *as_operator]) == 0
    assert '"tenant": "acme"' in capsys.readouterr().out


def _letters(roles: Roles, user: str) -> DeadLetters:
    return DeadLetters(roles.bootstrap, roles.agent, kafka_config=roles.settings(user))


async def test_the_operator_redrives_dead_letters_and_a_client_cannot(
    roles: Roles, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The operator lists the dead letters and redrives one to its turns topic (once); an
    answer's dead letter needs the reviewer role too, so its redrive writes nothing; a
    client reads no dead letter and redrives none."""
    x = roles.topics
    admin = RecordProducer(roles.bootstrap, kafka_config=roles.broker.admin_settings())
    letters = {}
    try:
        for source in ("turns", "answers"):
            tag = unique_name(source)
            headers = [("pyrula.dlq.reason", tag.encode()), ("pyrula.dlq.code", b"test")]
            headers.append(("pyrula.dlq.source", f"{x.turns[:-5]}{source}[0]@0".encode()))
            await admin.send(x.dlq, tag.encode(), b"{}", headers)
            letters[source] = tag
    finally:
        await asyncio.to_thread(admin.close)

    operator = _letters(roles, "operator_x")
    found = {d.reason: d for d in await asyncio.to_thread(operator.find)}
    turn, answer = found[letters["turns"]], found[letters["answers"]]
    for _ in range(2):
        (done,) = await asyncio.to_thread(operator.redrive, by="ops", offsets=[turn.offset])
    assert (done.outcome, done.topic) == ("already_redriven", x.turns), done
    as_admin = roles.broker.admin_settings()
    copies = [
        (k, h)
        for k, _, h in read_topic(roles.bootstrap, x.turns, kafka_config=as_admin)
        if h.get(REDRIVE_OF_HEADER) == f"{x.dlq}[0]@{turn.offset}"
    ]
    assert copies == [(letters["turns"].encode(), copies[0][1])], "redriven once"

    with pytest.raises(
        KafkaAuthorizationError, match=rf"User:operator_x .* WRITE topic {x.answers}"
    ):
        await asyncio.to_thread(operator.redrive, by="ops", offsets=[answer.offset])
    (still,) = await asyncio.to_thread(operator.find, offsets=[answer.offset])
    assert still.redrive is None, "nothing noted: the redrive wrote nothing"

    props = tmp_path / "operator.properties"
    props.write_text("".join(f"{k}={v}\n" for k, v in roles.settings("operator_x").items()))
    cli = ["dlq", "list", roles.agent, "--reason", letters["turns"]]
    cli += ["--bootstrap-servers", roles.bootstrap, "--kafka-config", str(props)]
    capsys.readouterr()
    assert await asyncio.to_thread(cli_main, cli) == 0
    assert '"redriven": {' in capsys.readouterr().out

    client = _letters(roles, "client_x")
    with pytest.raises(KafkaAuthorizationError, match=rf"User:client_x .* READ topic {x.dlq}"):
        await asyncio.to_thread(client.find)
    with pytest.raises(KafkaAuthorizationError, match=r"User:client_x "):
        await asyncio.to_thread(client.redrive, by="client_x", offsets=[answer.offset])
    (still,) = await asyncio.to_thread(operator.find, offsets=[answer.offset])
    assert still.redrive is None


async def test_the_evaluators_score_with_the_acls_granted_and_no_more(
    roles: Roles, tmp_path: Path
) -> None:
    """``--evaluator-principal``: the evaluators read results and write scores in their
    own group and transactions, and may not write the agent's results."""
    name = unique_name("scored")

    @evaluator()
    def answered(turn: ScoredTurn) -> bool:
        return turn.completed

    @kafka_agent(name=name, llm=FakeLLM(["ok"]), partitions=1, evaluators=[answered])
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "hi"}])

    admin = roles.broker.admin_settings()
    assert apply_topics(roles.bootstrap, agent.topic_specs(), kafka_config=admin).ok
    with_admin = tmp_path / "admin.properties"
    with_admin.write_text("".join(f"{k}={v}\n" for k, v in admin.items()))
    grant = ["acls", name, "--worker-principal", "User:worker_x"]
    grant += ["--client-principal", "User:client_x", "--evaluator-principal", "User:evals_x"]
    common = ["--bootstrap-servers", roles.bootstrap, "--kafka-config", str(with_admin)]
    assert cli_main([*grant, "--apply", *common]) == 0
    options = WorkerOptions(shutdown_grace=0.2, kafka_config=roles.settings("worker_x"))
    async with running_worker(agent, roles.bootstrap, options), roles.client("client_x") as c:
        turn = (await c.submit(name)).turn_id
        stream = EvalStream(agent, roles.bootstrap, kafka_config=roles.settings("evals_x"))
        stop = threading.Event()
        runner = threading.Thread(target=stream.run, args=(stop,), daemon=True)
        runner.start()
        try:
            await wait_for(lambda: stream.stats["scores"] >= 1 or not runner.is_alive(), 60, "")
        finally:
            stop.set()
            await asyncio.to_thread(runner.join, 30)
    assert stream.stats["scores"] == 1
    scores = read_topic(roles.bootstrap, agent.topics.scores, kafka_config=admin)
    assert [json.loads(value or b"{}")["turn_id"] for _, value, _ in scores] == [turn]
    forged = OutRecord(agent.topics.results, b"k", b"{}", [])
    with pytest.raises(
        KafkaAuthorizationError, match=rf"User:evals_x .* WRITE topic {agent.topics.results}"
    ):
        await _send(roles, "evals_x", forged)
