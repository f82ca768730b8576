"""The ACL list itself; that it is enough and that less is refused is shown on a SASL_SSL
broker in ``test_secured_kafka.py``."""

from __future__ import annotations

import pytest

from pyrula_stream.errors import ConfigurationError
from pyrula_stream.kafka.acls import agent_acls, describe


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
    assert ("User:c", "p.a.journal", "READ") in granted, "client.status reads the journal"
    assert ("User:c", "p.a.turns", "READ") in granted, "and the queued requests"
    groups = {(r.principal, r.name, r.operation) for r in rules if r.resource == "GROUP"}
    assert ("User:c", "p.a.workers", "DESCRIBE") in groups, "and the workers' offset"
    assert ("User:c", "p.a.workers", "READ") not in groups, "never joins the workers"
    without = agent_acls("a", prefix="p", worker_principal="User:w")
    assert not any("history" in r.name or r.name.startswith("p.b.") for r in without)
