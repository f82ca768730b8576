"""The ACL list itself; that it is enough and that less is refused is shown on a SASL_SSL
broker in ``test_secured_kafka.py``."""

from __future__ import annotations

import pytest

from pyrula_stream import AgentContext, AgentRegistrationError, kafka_agent
from pyrula_stream.cli import main
from pyrula_stream.errors import ConfigurationError
from pyrula_stream.kafka.acls import agent_acls, describe, redrive_transactional_id
from pyrula_stream.llm import FakeLLM


def test_one_principal_as_worker_and_client_gets_each_binding_once() -> None:
    rules = agent_acls("a", prefix="p", worker_principal="User:x", client_principal="User:x")
    bindings = [(r.principal, r.resource, r.name, r.operation, r.pattern) for r in rules]
    assert len(bindings) == len(set(bindings))
    assert ("User:x", "TOPIC", "p.a.turns", "WRITE", "LITERAL") in bindings
    assert ("User:x", "TOPIC", "p.a.turns", "READ", "LITERAL") in bindings


def test_output_topics_are_writable_and_principals_are_checked() -> None:
    rules = agent_acls("a", prefix="p", worker_principal="User:w", output_topics=["orders.out"])
    assert any(r.name == "orders.out" and r.operation == "WRITE" for r in rules)
    assert "TRANSACTIONAL_ID  PREFIXED  p.a." in describe(rules)
    with pytest.raises(ConfigurationError, match="User:name"):
        agent_acls("a", prefix="p", worker_principal="worker")


def test_replies_results_and_history_follow_who_reads_and_writes_them() -> None:
    rules = agent_acls(
        "a",
        prefix="p",
        worker_principal="User:w",
        client_principal="User:c",
        status_principal="User:s",
        keep_history=True,
        calls=["b"],
        called_by=["parent"],
    )
    granted = {(r.principal, r.name, r.operation) for r in rules if r.resource == "TOPIC"}
    assert ("User:w", "p.a.replies", "READ") in granted, "its own sub-agent replies"
    assert ("User:w", "p.a.replies", "WRITE") not in granted, "children write them, not it"
    assert ("User:w", "p.parent.replies", "WRITE") in granted, "replies to its caller"
    assert {("User:w", "p.b.turns", "WRITE"), ("User:w", "p.b.control", "WRITE")} <= granted
    assert ("User:w", "p.a.results", "WRITE") in granted
    assert ("User:c", "p.a.results", "READ") in granted
    assert ("User:w", "p.a.history", "WRITE") in granted
    assert ("User:s", "p.a.journal", "READ") in granted, "client.status reads the journal"
    assert ("User:s", "p.a.turns", "READ") in granted, "and the queued requests"
    groups = {(r.principal, r.name, r.operation) for r in rules if r.resource == "GROUP"}
    assert ("User:s", "p.a.workers", "DESCRIBE") in groups, "and the workers' offset"
    assert ("User:s", "p.a.workers", "READ") not in groups, "never joins the workers"
    without = agent_acls("a", prefix="p", worker_principal="User:w")
    assert not any("history" in r.name or r.name.startswith("p.b.") for r in without)


def test_a_plain_client_asks_but_neither_answers_nor_replies_nor_reads_the_journal() -> None:
    rules = agent_acls("a", prefix="p", worker_principal="User:w", client_principal="User:c")
    client = {(r.resource, r.name, r.operation) for r in rules if r.principal == "User:c"}
    topics = {(name, op) for resource, name, op in client if resource == "TOPIC"}
    assert topics == {
        ("p.a.turns", "WRITE"),
        ("p.a.control", "WRITE"),
        ("p.a.events", "READ"),
        ("p.a.results", "READ"),
        ("p.a.scores", "READ"),
        ("p.a.threads", "DESCRIBE"),
        ("p.a.signals", "WRITE"),  # signals to waiting turns; answers are the reviewer's
    }
    assert not [r for r in rules if r.operation == "IDEMPOTENT_WRITE"], "Kafka >= 3.0"
    legacy = agent_acls(
        "a", prefix="p", worker_principal="User:w", client_principal="User:c", idempotent_write=True
    )
    assert {r.principal for r in legacy if r.operation == "IDEMPOTENT_WRITE"} == {
        "User:w",
        "User:c",
    }


def test_memory_and_cache_are_those_of_the_trust_domain() -> None:
    shared = {r.name for r in agent_acls("a", prefix="p", worker_principal="User:w")}
    assert {"p.memory", "p.cache"} <= shared
    scoped = agent_acls("a", prefix="p", worker_principal="User:w", trust_domain="billing")
    names = {r.name for r in scoped}
    assert {"p.billing.memory", "p.billing.cache"} <= names
    assert not names & {"p.memory", "p.cache"}
    groups = {r.name for r in scoped if r.resource == "GROUP"}
    assert {"p.billing.memory.readers", "p.billing.cache.readers"} <= groups


def test_a_childs_worker_writes_only_the_replies_of_its_callers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["acls", "refunds", "--worker-principal", "User:w", "--callers", "triage"]
    assert main([*args, "--trust-domain", "billing"]) == 0
    printed = capsys.readouterr().out
    replies = [line for line in printed.splitlines() if ".replies" in line and "WRITE" in line]
    assert len(replies) == 1 and "pyrula.triage.replies" in replies[0], printed
    assert "pyrula.billing.memory" in printed and "pyrula.memory " not in printed


def test_the_gateway_submits_streams_and_reads_owners_and_status() -> None:
    rules = agent_acls("a", prefix="p", worker_principal="User:w", gateway_principal="User:g")
    gateway = {(r.resource, r.name, r.operation) for r in rules if r.principal == "User:g"}
    assert {
        ("TOPIC", "p.a.turns", "WRITE"),
        ("TOPIC", "p.a.control", "WRITE"),
        ("TOPIC", "p.a.events", "READ"),
        ("TOPIC", "p.a.turns", "READ"),  # a turn's owner is in its request
        ("TOPIC", "p.a.journal", "READ"),
        ("GROUP", "p.a.readers", "DESCRIBE"),
    } <= gateway
    assert not any(
        op == "WRITE" and name.endswith((".events", ".journal")) for _, name, op in gateway
    )
    assert not any(res == "TRANSACTIONAL_ID" for res, _, _ in gateway)


def test_only_the_reviewer_writes_answers_and_it_reads_what_it_decides_on() -> None:
    rules = agent_acls(
        "a",
        prefix="p",
        worker_principal="User:w",
        client_principal="User:c",
        status_principal="User:s",
        gateway_principal="User:g",
        reviewer_principal="User:r",
        calls=["b"],
        called_by=["parent"],
    )
    writers = {r.principal for r in rules if r.name == "p.a.answers" and r.operation == "WRITE"}
    assert writers == {"User:r"}
    reviewer = {(r.name, r.operation) for r in rules if r.principal == "User:r"}
    assert reviewer == {
        ("p.a.answers", "WRITE"),
        ("p.a.journal", "READ"),  # pending: what each question asks
        ("p.a.dlq", "READ"),  # a refused answer's reason
        ("p.a.readers", "DESCRIBE"),
    }
    reply_writers = {
        r.principal for r in rules if r.name.endswith(".replies") and r.operation == "WRITE"
    }
    assert reply_writers == {"User:w"}, "only workers write replies (of their callers)"
    readers = {r.name for r in rules if r.principal == "User:w" and r.operation == "READ"}
    assert {"p.a.replies", "p.a.signals", "p.a.answers"} <= readers


def test_tenant_topics_are_read_by_workers_and_written_by_the_operator() -> None:
    rules = agent_acls(
        "a",
        prefix="p",
        worker_principal="User:w",
        client_principal="User:c",
        operator_principal="User:o",
        tenants=True,
    )
    granted = {(r.principal, r.name, r.operation) for r in rules if r.resource == "TOPIC"}
    assert {("User:w", "p.a.tenants", "READ"), ("User:w", "p.a.tenant-usage", "WRITE")} <= granted
    assert ("User:w", "p.a.tenants", "WRITE") not in granted, "a worker cannot lift limits"
    assert {p for p, name, op in granted if name == "p.a.tenants" and op == "WRITE"} == {"User:o"}
    assert not [g for g in granted if g[0] == "User:c" and "tenant" in g[1]]
    untenanted = agent_acls("a", prefix="p", worker_principal="User:w", operator_principal="User:o")
    assert not [r for r in untenanted if "tenant" in r.name]


def test_the_operator_redrives_to_what_a_client_may_write_and_no_further() -> None:
    rules = agent_acls(
        "a",
        prefix="p",
        worker_principal="User:w",
        client_principal="User:c",
        reviewer_principal="User:r",
        operator_principal="User:o",
    )
    operator = {
        (r.resource, r.name, r.operation, r.pattern) for r in rules if r.principal == "User:o"
    }
    assert operator == {
        ("TOPIC", "p.a.dlq", "READ", "LITERAL"),
        ("TOPIC", "p.a.dlq-redrives", "READ", "LITERAL"),
        ("TOPIC", "p.a.dlq-redrives", "WRITE", "LITERAL"),
        ("TOPIC", "p.a.dlq-redrives", "CREATE", "LITERAL"),
        ("TOPIC", "p.a.dlq-redrives", "DESCRIBE_CONFIGS", "LITERAL"),
        ("TOPIC", "p.a.turns", "WRITE", "LITERAL"),
        ("TOPIC", "p.a.signals", "WRITE", "LITERAL"),
        ("TRANSACTIONAL_ID", "p.a-dlq-redrive", "WRITE", "LITERAL"),
        ("GROUP", "p.a.readers", "DESCRIBE", "LITERAL"),
    }
    client = {(r.name, r.operation) for r in rules if r.principal == "User:c"}
    topics = {(n, op) for res, n, op, _ in operator if res == "TOPIC" and op == "WRITE"}
    redriven = topics - {("p.a.dlq-redrives", "WRITE")}
    assert redriven <= client, "a redrive writes only where a client may"
    writers = {r.principal for r in rules if r.name == "p.a.answers" and r.operation == "WRITE"}
    assert writers == {"User:r"}, "an answer is redriven only by an operator who reviews"
    assert redrive_transactional_id("p", "a") == "p.a-dlq-redrive"


def test_no_transactional_id_rule_covers_another_agents_redrive_id() -> None:
    """Agents ``a``, ``a-dlq-redrive`` and ``a-dlq`` side by side: each worker's PREFIXED
    rule and each operator's LITERAL rule covers that agent's ids only."""
    agents = ["a", "a-dlq-redrive", "a-dlq", "b"]
    rules = [
        rule
        for agent in agents
        for rule in agent_acls(
            agent,
            prefix="p",
            worker_principal=f"User:w-{agent}",
            operator_principal=f"User:o-{agent}",
        )
        if rule.resource == "TRANSACTIONAL_ID"
    ]
    ids = {f"p.{agent}.worker-1": agent for agent in agents}
    ids |= {redrive_transactional_id("p", agent): agent for agent in agents}
    assert len(ids) == 2 * len(agents)
    for tid, owner in ids.items():
        covering = {
            r.principal
            for r in rules
            if (tid.startswith(r.name) if r.pattern == "PREFIXED" else tid == r.name)
        }
        who = "w" if tid.endswith(".worker-1") else "o"
        assert covering == {f"User:{who}-{owner}"}, tid


@pytest.mark.parametrize(
    ("prefix", "agent"),
    [("p.a", "x"), ("p", "a.x"), ("", "x"), ("p*", "x")],
    ids=["dotted-prefix", "dotted-agent", "empty-prefix", "wildcard"],
)
def test_a_prefix_that_could_match_another_agents_names_is_refused(prefix: str, agent: str) -> None:
    """With prefix ``p.a``, agent ``x``'s transactional ids ``p.a.x.<worker>`` would fall
    under agent ``a``'s PREFIXED rule ``p.a.``."""
    with pytest.raises(ConfigurationError, match=r"no dot"):
        agent_acls(agent, prefix=prefix, worker_principal="User:w")


def test_an_agent_with_a_dotted_prefix_is_refused_at_binding() -> None:
    async def body(ctx: AgentContext) -> str:
        return "x"

    with pytest.raises(AgentRegistrationError, match=r"prefix 'acme\.prod' .*\(no dot\)"):
        kafka_agent(name="a", llm=FakeLLM(["x"]), prefix="acme.prod")(body)
    assert kafka_agent(name="a", llm=FakeLLM(["x"]), prefix="acme-prod")(body).prefix == "acme-prod"


def test_the_evaluators_read_results_write_scores_and_ask_only_their_judges() -> None:
    rules = agent_acls(
        "a",
        prefix="p",
        worker_principal="User:w",
        evaluator_principal="User:e",
        judges=["j"],
        outcome_topics=["shop.orders"],
    )
    ev = {(r.resource, r.name, r.operation, r.pattern) for r in rules if r.principal == "User:e"}
    assert ev == {
        ("TOPIC", "p.a.results", "READ", "LITERAL"),
        ("TOPIC", "p.a.scores", "WRITE", "LITERAL"),
        ("TOPIC", "p.a.dlq", "WRITE", "LITERAL"),
        ("TOPIC", "p.j.turns", "WRITE", "LITERAL"),
        ("TOPIC", "p.j.results", "READ", "LITERAL"),
        ("TOPIC", "p.a.outcomes", "READ", "LITERAL"),
        ("TOPIC", "p.a.outcomes", "WRITE", "LITERAL"),
        ("TOPIC", "shop.orders", "READ", "LITERAL"),
        ("GROUP", "p.a.evals", "READ", "LITERAL"),
        ("TRANSACTIONAL_ID", "p.a.evals-", "WRITE", "PREFIXED"),
    }
    worker = {(r.name, r.operation) for r in rules if r.principal == "User:w"}
    assert ("p.a.scores", "WRITE") not in worker  # only the evaluators score
