"""A secured cluster for real: SASL_SSL (SCRAM-SHA-512), TLS, KRaft's StandardAuthorizer with
``allow.everyone.if.no.acl.found=false``, and exactly the ACLs ``pyrula-stream acls`` grants.

The broker is the session's secured one (``secured_broker``); this module's agents and
their ACLs are set up once for its tests (``secured_kafka``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pyrula_stream import (
    AgentContext,
    KafkaAgentClient,
    ToolContext,
    WorkerOptions,
    kafka_agent,
    tool,
)
from pyrula_stream.cli import main as cli_main
from pyrula_stream.errors import (
    KafkaAuthenticationError,
    KafkaAuthorizationError,
    ThreadDeleteFailed,
)
from pyrula_stream.kafka.acls import agent_acls, apply_acls
from pyrula_stream.kafka.local.broker import BrokerSecurity, LocalBroker
from pyrula_stream.llm import FakeLLM, ModelResponse, ToolDefinition, reply_text, reply_tool_call
from pyrula_stream.llm.fake import count_model_calls
from pyrula_stream.runtime.worker import KafkaWorker
from pyrula_stream.testing import read_topic, running_worker, unique_name, wait_for

AGENT_A = unique_name("secured_a")
AGENT_B = unique_name("secured_b")
AGENT_C = unique_name("secured_c")  # in its own trust domain
DOMAIN = "vault"
WRONG_PASSWORD = "not-the-password-4f1c2e"
# Users with agent A's worker rights except one: (resource, name, operation) withheld.
WITHHELD = {
    "no_txn": ("TRANSACTIONAL_ID", f"pyrula.{AGENT_A}.", "WRITE"),
    "no_group": ("GROUP", f"pyrula.{AGENT_A}.workers", "READ"),
}


@dataclass
class Secured:
    broker: LocalBroker
    security: BrokerSecurity

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap_servers

    def settings(self, user: str, password: str | None = None) -> dict[str, Any]:
        return self.security.client_settings(user, password)


def _properties(path: Path, settings: dict[str, Any]) -> str:
    path.write_text("# written by the test\n" + "".join(f"{k}={v}\n" for k, v in settings.items()))
    return str(path)


@pytest.fixture(scope="module")
def secured_kafka(
    secured_broker: LocalBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Secured]:
    """Users: worker_a, client_a and status_a (agent A's ACLs), worker_b (agent B's),
    worker_c and client_c (agent C's, trust domain ``vault``), nobody (none).
    Topics and ACLs are made with the CLI as an operator would, as the super user."""
    broker = secured_broker
    assert broker.security is not None
    secured = Secured(broker, broker.security)
    admin_file = _properties(
        tmp_path_factory.mktemp("secured") / "admin.properties", broker.admin_settings()
    )
    common = ["--bootstrap-servers", secured.bootstrap, "--kafka-config", admin_file]
    domain = ["--trust-domain", DOMAIN]
    for agent, more in ((AGENT_A, []), (AGENT_B, []), (AGENT_C, domain)):
        assert cli_main(["topics", "apply", agent, "--partitions", "1", *more, *common]) == 0
    grants = (
        (AGENT_A, "worker_a", ["--client-principal", "User:client_a"]),
        (AGENT_A, "worker_a", ["--status-principal", "User:status_a"]),
        (AGENT_B, "worker_b", []),
        (AGENT_C, "worker_c", ["--client-principal", "User:client_c", *domain]),
    )
    for agent, worker, extra in grants:
        args = ["acls", agent, "--worker-principal", f"User:{worker}", *extra]
        assert cli_main([*args, "--apply", *common]) == 0
    # Agent A's worker rights, each missing one kind.
    for user, (resource, name, operation) in WITHHELD.items():
        rules = agent_acls(AGENT_A, prefix="pyrula", worker_principal=f"User:{user}")
        withheld = (resource, name, operation)
        kept = [r for r in rules if (r.resource, r.name, r.operation) != withheld]
        assert len(kept) == len(rules) - 1
        apply_acls(secured.bootstrap, kept, kafka_config=broker.admin_settings())
    yield secured


class Recorder:
    """Model calls by index and tool effects, with a gate that holds the tool."""

    def __init__(self) -> None:
        self.model_calls: list[int] = []
        self.effects: list[str] = []
        self.gate = asyncio.Event()

    def model(self, messages: list[dict[str, Any]], tools: list[ToolDefinition]) -> ModelResponse:
        index = count_model_calls(messages)
        self.model_calls.append(index)
        return reply_tool_call("effect", item="x") if index == 0 else reply_text("done")


def _agent(name: str, rec: Recorder) -> Any:
    @tool(writes=True)
    async def effect(ctx: ToolContext, item: str) -> str:
        """A side effect that waits for the test's go-ahead."""
        rec.effects.append(ctx.idempotency_key or "")
        await rec.gate.wait()
        return f"did {item}"

    @kafka_agent(name=name, llm=FakeLLM(rec.model), tools=[effect], partitions=1)
    async def agent(ctx: AgentContext, q: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": q}])

    return agent


async def test_least_privilege_worker_and_client_run_turns_and_restore(
    secured_kafka: Secured,
) -> None:
    rec = Recorder()
    agent = _agent(AGENT_A, rec)
    options = WorkerOptions(
        shutdown_grace=0.2, worker_id="w1", kafka_config=secured_kafka.settings("worker_a")
    )
    async with KafkaAgentClient(
        secured_kafka.bootstrap, kafka_config=secured_kafka.settings("client_a")
    ) as client:
        async with running_worker(agent, secured_kafka.bootstrap, options):
            handle = await client.submit(agent.name, q="go")
            await wait_for(lambda: len(rec.effects) == 1, 60, "the tool started")
        # The worker stopped while the tool ran: model call 0 is journaled, the tool is not.
        rec.gate.set()
        async with running_worker(agent, secured_kafka.bootstrap, options) as restarted:
            events = [e async for e in client.stream(agent.name, handle.turn_id)]
            assert restarted.restored_records > 0
            second = await asyncio.wait_for(client.run(agent.name, q="again"), 60)

    assert rec.model_calls == [0, 1, 0, 1], "call 0 of the first turn came from the journal"
    assert events[-1].type == "run:complete" and events[-1].data["result"] == "done"
    assert events[-1].attempt == 2
    assert second[-1].type == "run:complete"


async def test_cli_reads_settings_from_its_file_and_the_environment(
    secured_kafka: Secured,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    client_file = _properties(tmp_path / "client.properties", secured_kafka.settings("client_a"))
    base = ["--bootstrap-servers", secured_kafka.bootstrap]
    tail = ["tail", AGENT_A, "--from-beginning", "--timeout", "3", *base]
    assert await asyncio.to_thread(cli_main, [*tail, "--kafka-config", client_file]) == 0
    from_file = capsys.readouterr().out
    assert "run:complete" in from_file
    monkeypatch.setenv("PYRULA_KAFKA_CONFIG", client_file)
    assert await asyncio.to_thread(cli_main, tail) == 0
    assert capsys.readouterr().out == from_file


async def test_cli_reads_sasl_settings_from_pyrula_kafka_variables(
    secured_kafka: Secured,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """As a pod whose Secret fills the environment: no properties file at all."""
    monkeypatch.delenv("PYRULA_KAFKA_CONFIG", raising=False)
    tail = ["tail", AGENT_A, "--from-beginning", "--timeout", "3"]
    tail += ["--bootstrap-servers", secured_kafka.bootstrap]
    settings = secured_kafka.settings("client_a", WRONG_PASSWORD)
    for key, value in settings.items():
        monkeypatch.setenv("PYRULA_KAFKA_" + key.upper().replace(".", "_"), str(value))
    code = await asyncio.to_thread(cli_main, tail)
    refused = capsys.readouterr()
    assert code == 2, refused.err  # a usage mistake: wrong credentials
    assert "invalid credentials" in refused.err and "User:client_a" in refused.err
    assert WRONG_PASSWORD not in refused.err + refused.out
    monkeypatch.setenv(
        "PYRULA_KAFKA_SASL_PASSWORD", secured_kafka.settings("client_a")["sasl.password"]
    )
    assert await asyncio.to_thread(cli_main, tail) == 0
    assert "run:complete" in capsys.readouterr().out


async def test_a_client_without_rights_gets_a_clear_authorization_error(
    secured_kafka: Secured,
) -> None:
    async with KafkaAgentClient(
        secured_kafka.bootstrap, kafka_config=secured_kafka.settings("nobody")
    ) as client:
        with pytest.raises(KafkaAuthorizationError) as submit:
            await asyncio.wait_for(client.submit(AGENT_A, q="hi"), 30)
        with pytest.raises(KafkaAuthorizationError) as stream:
            await asyncio.wait_for(client.run(AGENT_A, q="hi"), 30)
    message = str(submit.value)
    assert f"User:nobody is not allowed to WRITE topic pyrula.{AGENT_A}.turns" in message
    assert "TOPIC_AUTHORIZATION_FAILED" in message
    # run() subscribes to the turn's events before it submits (so it misses none): the
    # first refusal it meets is the read of the events topic.
    assert f"User:nobody is not allowed to READ topic pyrula.{AGENT_A}.events" in str(stream.value)


async def test_a_client_may_not_read_what_it_may_only_write(secured_kafka: Secured) -> None:
    client_a = secured_kafka.settings("client_a")
    # Clients read turns (status of a queued turn) but only write control records.
    async with KafkaAgentClient(secured_kafka.bootstrap, kafka_config=client_a) as client:
        handle = await client.submit(AGENT_A, q="a turn to cancel")
        await client.cancel(AGENT_A, handle.turn_id)  # an empty topic reads as done
    with pytest.raises(KafkaAuthorizationError, match=r"READ topic pyrula\.\S+\.control"):
        await asyncio.to_thread(
            read_topic,
            secured_kafka.bootstrap,
            f"pyrula.{AGENT_A}.control",
            kafka_config=client_a,
            group_id=f"pyrula.{AGENT_A}.readers",  # its group is allowed: the topic is not
        )


async def test_a_worker_of_agent_b_cannot_read_agent_a(secured_kafka: Secured) -> None:
    worker_b = secured_kafka.settings("worker_b")
    for topic in ("turns", "journal", "events", "control"):
        denied = rf"User:worker_b .* READ topic pyrula\.{AGENT_A}\.{topic}"
        with pytest.raises(KafkaAuthorizationError, match=denied):
            await asyncio.to_thread(
                read_topic,
                secured_kafka.bootstrap,
                f"pyrula.{AGENT_A}.{topic}",
                kafka_config=worker_b,
            )
    # Run as agent A with B's credentials: refused at start, naming what it lacks.
    worker = KafkaWorker(
        _agent(AGENT_A, Recorder()),
        bootstrap_servers=secured_kafka.bootstrap,
        options=WorkerOptions(kafka_config=worker_b),
    )
    with pytest.raises(KafkaAuthorizationError, match=rf"User:worker_b .* topic pyrula\.{AGENT_A}"):
        await asyncio.wait_for(worker.run(), 60)


async def test_a_wrong_password_fails_fast_without_showing_it(
    secured_kafka: Secured, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = secured_kafka.settings("client_a", WRONG_PASSWORD)
    # Long timeouts: a refusal must end the call long before them, not when they expire.
    async with KafkaAgentClient(secured_kafka.bootstrap, kafka_config=wrong, timeout=300) as client:
        assert WRONG_PASSWORD not in repr(client.kafka_config)
        with pytest.raises(KafkaAuthenticationError) as submitted:
            await asyncio.wait_for(client.submit(AGENT_A, q="hi"), 60)
        with pytest.raises(KafkaAuthenticationError) as streamed:
            await asyncio.wait_for(_first_event(client.stream(AGENT_A, "0" * 32)), 60)
    options = WorkerOptions(kafka_config=secured_kafka.settings("worker_a", WRONG_PASSWORD))
    assert WRONG_PASSWORD not in repr(options)
    worker = KafkaWorker(
        _agent(AGENT_A, Recorder()), bootstrap_servers=secured_kafka.bootstrap, options=options
    )
    with pytest.raises(KafkaAuthenticationError) as started:
        await asyncio.wait_for(worker.run(), 30)
    for error in (submitted.value, streamed.value, started.value):
        assert "invalid credentials" in str(error) and "User:" in str(error)
        assert WRONG_PASSWORD not in str(error)
    assert WRONG_PASSWORD not in caplog.text
    assert "is unreachable" not in caplog.text, "it answered: a refusal is no outage"


async def _first_event(events: AsyncIterator[Any]) -> Any:
    async for event in events:
        return event
    return None


@pytest.mark.parametrize(
    ("user", "missing"),
    [
        ("no_txn", rf"WRITE transactional id pyrula\.{AGENT_A}\.w9"),
        ("no_group", rf"READ group pyrula\.{AGENT_A}\.workers"),
    ],
    ids=["no-transactional-id", "no-group"],
)
async def test_a_worker_missing_one_right_is_told_which(
    secured_kafka: Secured, user: str, missing: str
) -> None:
    options = WorkerOptions(worker_id="w9", kafka_config=secured_kafka.settings(user))
    worker = KafkaWorker(
        _agent(AGENT_A, Recorder()), bootstrap_servers=secured_kafka.bootstrap, options=options
    )
    with pytest.raises(KafkaAuthorizationError, match=rf"User:{user} is not allowed to {missing}"):
        await asyncio.wait_for(worker.run(), 60)


async def test_the_clients_rights_cover_get_thread_and_delete_thread(
    secured_kafka: Secured,
) -> None:
    async with KafkaAgentClient(
        secured_kafka.bootstrap, kafka_config=secured_kafka.settings("status_a")
    ) as reader:
        assert (await reader.get_thread(AGENT_A, "t-secured")).turns == ()
    async with KafkaAgentClient(
        secured_kafka.bootstrap, kafka_config=secured_kafka.settings("client_a")
    ) as client:
        # No worker runs now: the delete gets past its topic check and is queued.
        with pytest.raises(ThreadDeleteFailed) as caught:
            await client.delete_thread(AGENT_A, "t-secured", timeout=1)
    assert caught.value.code == "wait_timeout"


async def test_a_client_reads_only_events_and_the_status_reader_the_rest(
    secured_kafka: Secured,
) -> None:
    """Other clients' requests (turns) are the status reader's; another agent's events
    are nobody's but its own clients', and its journal nobody's but its workers', status
    readers' and reviewers' (``test_roles.py``)."""
    client_a = secured_kafka.settings("client_a")
    for topic in (
        f"pyrula.{AGENT_A}.turns",
        f"pyrula.{AGENT_B}.journal",
        f"pyrula.{AGENT_B}.events",
    ):
        with pytest.raises(KafkaAuthorizationError, match=rf"User:client_a .* READ topic {topic}"):
            await asyncio.to_thread(
                read_topic,
                secured_kafka.bootstrap,
                topic,
                kafka_config=client_a,
                group_id=f"pyrula.{AGENT_A}.readers",
            )
    async with KafkaAgentClient(
        secured_kafka.bootstrap, kafka_config=secured_kafka.settings("status_a")
    ) as reader:
        assert (await reader.status(AGENT_A, "no-such-turn")).state == "unknown"


async def test_an_agent_in_a_trust_domain_keeps_its_memory_from_other_agents(
    secured_kafka: Secured,
) -> None:
    @kafka_agent(name=AGENT_C, llm=FakeLLM(["x"]), partitions=1, trust_domain=DOMAIN)
    async def vault(ctx: AgentContext) -> str:
        await ctx.memory.put(("secrets",), "pin", {"pin": "1234"})
        return "stored"

    options = WorkerOptions(
        shutdown_grace=0.2, worker_id="c1", kafka_config=secured_kafka.settings("worker_c")
    )
    async with (
        running_worker(vault, secured_kafka.bootstrap, options),
        KafkaAgentClient(
            secured_kafka.bootstrap, kafka_config=secured_kafka.settings("client_c")
        ) as client,
    ):
        events = await asyncio.wait_for(client.run(AGENT_C), 60)
    assert events[-1].type == "run:complete", events[-1].data
    memory = f"pyrula.{DOMAIN}.memory"
    stored = read_topic(
        secured_kafka.bootstrap, memory, kafka_config=secured_kafka.broker.admin_settings()
    )
    assert len(stored) == 1, "the write went to the domain's memory topic"
    for user, topic in (("worker_a", memory), ("worker_c", "pyrula.memory")):
        with pytest.raises(KafkaAuthorizationError, match=rf"User:{user} .* READ topic {topic}"):
            await asyncio.to_thread(
                read_topic,
                secured_kafka.bootstrap,
                topic,
                kafka_config=secured_kafka.settings(user),
                group_id=f"{topic}.readers",
            )
