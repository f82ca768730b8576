"""The least-privilege ACLs of one agent: what its workers and its clients need, no more.

``agent_acls`` lists them (``pyrula-stream acls`` prints the table), ``apply_acls``
creates them through the admin API. Creating an ACL that exists is a no-op in Kafka, so
applying twice is safe.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, not in __all__
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from pyrula_stream.errors import ConfigurationError
from pyrula_stream.kafka.admin import admin_client
from pyrula_stream.kafka.consumers import reader_group_id

CLUSTER = "kafka-cluster"
NAME_PIECE = re.compile(r"^[a-zA-Z0-9_-]{1,100}$")
"""A prefix, agent name or trust domain: no dot, so ``<prefix>.<agent>.`` (the PREFIXED
rule on transactional ids) and ``<prefix>.<agent>.<kind>`` name one agent only."""


def check_name_piece(what: str, value: str) -> None:
    """Refuse a prefix, agent or trust domain that could make one agent's names another's:
    with ``.`` allowed, prefix ``p.a`` and agent ``x`` give ``p.a.x.<worker>``, which
    agent ``a`` of prefix ``p`` (rule ``p.a.`` PREFIXED) could then use."""
    if not NAME_PIECE.match(value):
        raise ConfigurationError(
            f"{what} {value!r} must match [a-zA-Z0-9_-]{{1,100}} (no dot): it starts the "
            "names of topics and transactional ids, and a dot would let one agent's "
            "prefix match another's"
        )


def redrive_transactional_id(prefix: str, agent: str) -> str:
    """The one transactional id of ``pyrula-stream dlq redrive`` for ``agent``: two runs
    fence each other, and never a worker. With no dot in ``prefix`` or ``agent``
    (``check_name_piece``) it has exactly one dot, so no worker id (``<prefix>.<agent>.
    <worker>``, two dots) is it and no agent's PREFIXED rule ``<prefix>.<agent>.`` covers
    it; another agent's redrive id differs in the agent name, and the operator's rule on
    it is LITERAL."""
    return f"{prefix}.{agent}-dlq-redrive"


@dataclass(frozen=True)
class Acl:
    """One ALLOW rule: ``principal`` may ``operation`` on ``resource`` ``name``."""

    principal: str
    resource: str  # TOPIC, GROUP, TRANSACTIONAL_ID, CLUSTER
    name: str
    operation: str  # READ, WRITE, DESCRIBE, DESCRIBE_CONFIGS, IDEMPOTENT_WRITE
    pattern: str = "LITERAL"  # or PREFIXED
    why: str = ""


def shared_prefix(prefix: str, trust_domain: str | None) -> str:
    """The prefix of the memory and tool cache topics: ``<prefix>.<domain>`` in a trust
    domain, else ``<prefix>`` (one ``<prefix>.memory`` / ``<prefix>.cache`` for all)."""
    return f"{prefix}.{trust_domain}" if trust_domain else prefix


def agent_acls(
    agent: str,
    *,
    prefix: str,
    worker_principal: str,
    client_principal: str | None = None,
    status_principal: str | None = None,
    gateway_principal: str | None = None,
    reviewer_principal: str | None = None,
    operator_principal: str | None = None,
    tenants: bool = False,
    output_topics: Iterable[str] = (),
    keep_history: bool = False,
    calls: Iterable[str] = (),
    called_by: Iterable[str] = (),
    trust_domain: str | None = None,
    idempotent_write: bool = False,
    evaluator_principal: str | None = None,
    judges: Iterable[str] = (),
    outcome_topics: Iterable[str] = (),
) -> list[Acl]:
    """The ACLs a worker of ``agent`` (and optionally its clients) need on the cluster.

    Sub-agents cross agents: a worker that calls agent B (``calls``) writes B's turns (the
    call) and control (a cancel that follows the parent's) topics, and a worker called by
    agent A (``called_by``, its callers) writes its outcome to A's replies topic, and to
    no other agent's. Each worker reads only its own agent's replies. Memory and the tool
    cache are those of the agent's ``trust_domain``. A client (``client_principal``)
    submits, cancels, sends signals (``<agent>.signals``) and reads events and results;
    it cannot answer a question, write a reply, or read the journal or dead letters.
    Answers (approvals, interrupts) go to ``<agent>.answers``, which only the reviewer
    (``reviewer_principal``) writes; it reads the journal (the open questions) and the
    dead letters (a refused answer's reason). Reading requests, the journal and threads
    (``status``, ``get_thread``) is the status reader's role (``status_principal``). The
    HTTP gateway (``gateway_principal``) is a client and a status reader: it submits,
    cancels and streams, and reads a turn's request (its owner) and status. With
    ``tenants``, workers read the tenants' limits and share their usage, and only the
    operator (``operator_principal``) writes the limits. The operator also lists and
    redrives dead letters (``pyrula-stream dlq``): it reads the DLQ, keeps its notes on
    ``<agent>.dlq-redrives`` under transactional id ``<prefix>.<agent>-dlq-redrive`` and
    writes the redriven records back to turns and signals, what a client may write (a
    control record is skipped, never dead-lettered: none to redrive). Not to answers (an
    operator that redrives an answer must also be the reviewer: give one principal both
    roles) nor to replies (only the called agents' workers vouch for a sub-agent's
    outcome).
    ``idempotent_write`` adds CLUSTER IDEMPOTENT_WRITE, which only
    brokers before Kafka 3.0 need (since KIP-679, WRITE on a topic implies it).
    The evaluators (``evaluator_principal``, ``pyrula-stream evals run``) read results
    and write ``<agent>.scores`` in their own group ``<agent>.evals``; with ``judges``
    they submit to those agents' turns topics and read their results, and with
    ``outcome_topics`` (deferred outcomes) they read those business topics and keep
    their joins in ``<agent>.outcomes``. Clients and status readers read the scores.
    """
    principals = (
        worker_principal,
        client_principal,
        status_principal,
        gateway_principal,
        reviewer_principal,
        operator_principal,
    )
    for principal in (*principals, evaluator_principal):
        if principal is not None and not principal.startswith("User:"):
            raise ConfigurationError(f"a principal looks like User:name, got {principal!r}")
    check_name_piece("prefix", prefix)
    for name in (agent, *calls, *called_by, *judges):
        check_name_piece("agent", name)
    if trust_domain is not None:
        check_name_piece("trust domain", trust_domain)
    base = f"{prefix}.{agent}"
    readers = reader_group_id(prefix, agent)
    shared = shared_prefix(prefix, trust_domain)
    cache = f"{shared}.cache"
    memory = f"{shared}.memory"
    own = ["turns", "events", "journal", "replies", "signals", "answers", "threads"]
    own += ["control", "dlq", "results", "scores"]
    outcome_topics = sorted(set(outcome_topics))
    if outcome_topics:
        own.append("outcomes")
    if keep_history:
        own.append("history")
    if tenants:
        own += ["tenants", "tenant-usage"]
    w = worker_principal
    rules = [
        Acl(w, "TOPIC", f"{base}.turns", "READ", why="consume turn requests"),
        Acl(w, "TOPIC", f"{base}.control", "READ", why="cancel / terminate requests"),
        Acl(w, "TOPIC", f"{base}.journal", "READ", why="restore turns"),
        Acl(w, "TOPIC", f"{base}.journal", "WRITE", why="journal steps"),
        Acl(w, "TOPIC", f"{base}.replies", "READ", why="outcomes of its sub-agent calls"),
        Acl(w, "TOPIC", f"{base}.signals", "READ", why="clients' signals to waiting turns"),
        Acl(w, "TOPIC", f"{base}.answers", "READ", why="reviewers' answers to questions"),
        Acl(w, "TOPIC", f"{base}.threads", "READ", why="restore conversations"),
        Acl(w, "TOPIC", f"{base}.threads", "WRITE", why="a finished turn joins its thread"),
        Acl(w, "TOPIC", f"{base}.events", "WRITE", why="publish events"),
        Acl(w, "TOPIC", f"{base}.results", "WRITE", why="one result per turn"),
        Acl(w, "TOPIC", f"{base}.dlq", "WRITE", why="dead letters"),
        Acl(w, "TOPIC", cache, "READ", why="shared tool cache table"),
        Acl(w, "TOPIC", cache, "WRITE", why="shared tool cache table"),
        Acl(w, "TOPIC", memory, "READ", why="ctx.memory table"),
        Acl(w, "TOPIC", memory, "WRITE", why="ctx.memory writes"),
        *[
            Acl(w, "TOPIC", f"{base}.{t}", "DESCRIBE_CONFIGS", why="check topics at start")
            for t in own
        ],
        *[
            Acl(w, "TOPIC", f"{base}.{t}", "DESCRIBE", why="evaluators' topic: seen at start")
            for t in own
            if t in ("scores", "outcomes")
        ],
        Acl(w, "TOPIC", cache, "DESCRIBE_CONFIGS", why="check the cache topic at start"),
        Acl(w, "TOPIC", memory, "DESCRIBE_CONFIGS", why="check the memory topic at start"),
        *[Acl(w, "TOPIC", t, "WRITE", why="output_topics route") for t in sorted(output_topics)],
        Acl(w, "GROUP", f"{base}.workers", "READ", why="the workers' consumer group"),
        Acl(w, "GROUP", readers, "DESCRIBE", why="restore, control, replies readers"),
        Acl(w, "GROUP", f"{cache}.readers", "DESCRIBE", why="cache table reader"),
        Acl(w, "GROUP", f"{memory}.readers", "DESCRIBE", why="memory table reader"),
        Acl(w, "TRANSACTIONAL_ID", f"{base}.", "WRITE", "PREFIXED", "one per worker id"),
    ]
    if keep_history:
        rules += [
            Acl(w, "TOPIC", f"{base}.history", "WRITE", why="record finished turns"),
            Acl(w, "TOPIC", f"{base}.history", "READ", why="branch / replay a recorded turn"),
        ]
    if tenants:
        rules += [
            Acl(w, "TOPIC", f"{base}.tenants", "READ", why="operators' tenant limits"),
            Acl(w, "TOPIC", f"{base}.tenant-usage", "READ", why="the group's tenant usage"),
            Acl(w, "TOPIC", f"{base}.tenant-usage", "WRITE", why="what its turns used"),
            Acl(w, "GROUP", f"{base}.tenants.readers", "DESCRIBE", why="limits reader"),
            Acl(w, "GROUP", f"{base}.tenant-usage.readers", "DESCRIBE", why="usage reader"),
        ]
        if operator_principal is not None:
            o = operator_principal
            rules += [
                Acl(o, "TOPIC", f"{base}.tenants", "WRITE", why="tenants set"),
                Acl(o, "TOPIC", f"{base}.tenants", "READ", why="tenants set merges, show"),
                Acl(o, "TOPIC", f"{base}.tenant-usage", "READ", why="tenants show"),
                Acl(o, "GROUP", f"{base}.tenants.readers", "DESCRIBE", why="its readers"),
                Acl(o, "GROUP", f"{base}.tenant-usage.readers", "DESCRIBE", why="its readers"),
            ]
    if operator_principal is not None:
        rules += _redrive_acls(
            operator_principal, base, readers, redrive_transactional_id(prefix, agent)
        )
    for child in sorted(set(calls)):
        rules += [
            Acl(w, "TOPIC", f"{prefix}.{child}.turns", "WRITE", why=f"call sub-agent {child}"),
            Acl(w, "TOPIC", f"{prefix}.{child}.control", "WRITE", why=f"cancel {child}'s turn"),
        ]
    for parent in sorted(set(called_by)):
        rules.append(
            Acl(w, "TOPIC", f"{prefix}.{parent}.replies", "WRITE", why=f"reply to {parent}")
        )
    if evaluator_principal is not None:
        rules += _evaluator_acls(
            evaluator_principal, prefix, base, sorted(set(judges)), outcome_topics
        )
    clients = [p for p in (client_principal, gateway_principal) if p is not None]
    for c in clients:
        rules += [
            Acl(c, "TOPIC", f"{base}.turns", "WRITE", why="submit turns"),
            Acl(c, "TOPIC", f"{base}.control", "WRITE", why="cancel / terminate"),
            Acl(c, "TOPIC", f"{base}.events", "READ", why="stream a turn's events"),
            Acl(c, "TOPIC", f"{base}.results", "READ", why="read turn results"),
            Acl(c, "TOPIC", f"{base}.scores", "READ", why="read evaluators' scores"),
            Acl(c, "TOPIC", f"{base}.threads", "DESCRIBE", why="delete_thread: topic check"),
            Acl(c, "TOPIC", f"{base}.signals", "WRITE", why="signals to its waiting turns"),
            Acl(c, "GROUP", readers, "DESCRIBE", why="event readers"),
        ]
    if reviewer_principal is not None:
        r = reviewer_principal
        rules += [
            Acl(r, "TOPIC", f"{base}.answers", "WRITE", why="approve, reject, resume"),
            Acl(r, "TOPIC", f"{base}.journal", "READ", why="pending: the open questions"),
            Acl(r, "TOPIC", f"{base}.dlq", "READ", why="a refused answer's reason"),
            Acl(r, "GROUP", readers, "DESCRIBE", why="its readers"),
        ]
    for s in [p for p in (status_principal, gateway_principal) if p is not None]:
        rules += [
            Acl(s, "TOPIC", f"{base}.journal", "READ", why="status of a turn"),
            Acl(s, "TOPIC", f"{base}.turns", "READ", why="status: a queued turn's request"),
            Acl(s, "TOPIC", f"{base}.results", "READ", why="status: a finished turn's result"),
            Acl(s, "TOPIC", f"{base}.scores", "READ", why="a turn's scores, evals report"),
            Acl(s, "TOPIC", f"{base}.threads", "READ", why="get_thread"),
            Acl(s, "GROUP", readers, "DESCRIBE", why="status readers"),
            Acl(s, "GROUP", f"{base}.workers", "DESCRIBE", why="status: the workers' offset"),
        ]
        if keep_history:
            rules.append(Acl(s, "TOPIC", f"{base}.history", "READ", why="a recorded turn"))
    if keep_history:
        rules += [
            Acl(c, "TOPIC", f"{base}.history", "READ", why="branch a recorded turn")
            for c in clients
        ]
    if idempotent_write:
        rules += [
            Acl(p, "CLUSTER", CLUSTER, "IDEMPOTENT_WRITE", why="idempotent producer (Kafka < 3.0)")
            for p in (
                worker_principal,
                *clients,
                reviewer_principal,
                operator_principal,
                evaluator_principal,
            )
            if p is not None
        ]
    # One principal may be both worker and client; the admin API refuses duplicate bindings.
    seen: set[tuple[str, ...]] = set()
    unique = []
    for rule in rules:
        binding = (rule.principal, rule.resource, rule.name, rule.operation, rule.pattern)
        if binding not in seen:
            seen.add(binding)
            unique.append(rule)
    return unique


def _evaluator_acls(
    e: str, prefix: str, base: str, judges: Sequence[str], outcome_topics: Sequence[str]
) -> list[Acl]:
    """What ``pyrula-stream evals run`` needs (``evals/stream``)."""
    rules = [
        Acl(e, "TOPIC", f"{base}.results", "READ", why="evals: the finished turns"),
        Acl(e, "TOPIC", f"{base}.scores", "WRITE", why="evals: one score per turn"),
        Acl(e, "TOPIC", f"{base}.dlq", "WRITE", why="evals: records it cannot read"),
        Acl(e, "GROUP", f"{base}.evals", "READ", why="the evaluators' consumer group"),
        Acl(e, "TRANSACTIONAL_ID", f"{base}.evals-", "WRITE", "PREFIXED", "one per member"),
    ]
    for judge in judges:
        rules += [
            Acl(e, "TOPIC", f"{prefix}.{judge}.turns", "WRITE", why=f"evals: ask judge {judge}"),
            Acl(e, "TOPIC", f"{prefix}.{judge}.results", "READ", why="evals: the judge's verdict"),
        ]
    if outcome_topics:
        rules += [
            Acl(e, "TOPIC", f"{base}.outcomes", "READ", why="evals: deferred outcomes' joins"),
            Acl(e, "TOPIC", f"{base}.outcomes", "WRITE", why="evals: deferred outcomes' joins"),
            *[Acl(e, "TOPIC", t, "READ", why="evals: business events") for t in outcome_topics],
        ]
    return rules


def _redrive_acls(o: str, base: str, readers: str, transactional_id: str) -> list[Acl]:
    """What ``pyrula-stream dlq list|redrive`` needs (``client/redrive.py``)."""
    notes = f"{base}.dlq-redrives"
    return [
        Acl(o, "TOPIC", f"{base}.dlq", "READ", why="dlq list, redrive: the dead letters"),
        Acl(o, "TOPIC", notes, "READ", why="dlq redrive: what was redriven"),
        Acl(o, "TOPIC", notes, "WRITE", why="dlq redrive: note each redrive"),
        Acl(o, "TOPIC", notes, "CREATE", why="the first redrive creates the notes topic"),
        Acl(o, "TOPIC", notes, "DESCRIBE_CONFIGS", why="dlq redrive checks the notes topic"),
        *[
            Acl(o, "TOPIC", f"{base}.{t}", "WRITE", why="dlq redrive to its source topic")
            for t in ("turns", "signals")
        ],
        Acl(o, "TRANSACTIONAL_ID", transactional_id, "WRITE", why="dlq redrive, done once"),
        Acl(o, "GROUP", readers, "DESCRIBE", why="its readers"),
    ]


def describe(rules: Sequence[Acl]) -> str:
    """The rules as an aligned table, one per line."""
    rows = [("principal", "resource", "pattern", "name", "operation", "why")]
    rows += [(r.principal, r.resource, r.pattern, r.name, r.operation, r.why) for r in rules]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row[:5], widths, strict=True))
        + f"  {row[5]}"
        for row in rows
    )


def _binding(rule: Acl) -> AclBinding:
    resource = "BROKER" if rule.resource == "CLUSTER" else rule.resource
    return AclBinding(
        ResourceType[resource],
        rule.name,
        ResourcePatternType[rule.pattern],
        rule.principal,
        "*",
        AclOperation[rule.operation],
        AclPermissionType.ALLOW,
    )


def apply_acls(
    bootstrap_servers: str,
    rules: Sequence[Acl],
    *,
    kafka_config: Mapping[str, Any] | None = None,
    timeout_s: float = 30.0,
) -> None:
    """Create ``rules`` on the cluster (needs ALTER on the cluster, e.g. a super user)."""
    admin = admin_client(bootstrap_servers, kafka_config)
    futures = admin.create_acls([_binding(r) for r in rules], request_timeout=timeout_s)
    failed = []
    for binding, future in futures.items():
        try:
            future.result()
        except KafkaException as exc:
            failed.append(f"{binding}: {exc.args[0].str() if exc.args else exc}")
    if failed:
        raise ConfigurationError(
            "could not create ACLs (the admin principal needs ALTER on the cluster):\n  "
            + "\n  ".join(failed)
        )
    _wait_until_in_force(admin, [_binding(r) for r in rules], timeout_s)


def _wait_until_in_force(admin: AdminClient, bindings: list[AclBinding], timeout_s: float) -> None:
    """Return once the broker lists every binding. Creating an ACL commits it to the
    metadata log; the broker's authorizer applies it a moment later, and a client that
    acts at once (a script: ``acls --apply`` then ``tenants set``) would be refused."""
    # None matches any name, principal and host (the filter's documented wildcard).
    every = AclBindingFilter(
        ResourceType.ANY,
        None,  # type: ignore[arg-type]
        ResourcePatternType.ANY,
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    wanted = set(bindings)
    deadline = time.monotonic() + timeout_s
    while True:
        listed = set(admin.describe_acls(every, request_timeout=timeout_s).result())
        missing = wanted - listed
        if not missing:
            return
        if time.monotonic() > deadline:
            raise ConfigurationError(
                f"{len(missing)} ACLs were created but the broker does not list them after "
                f"{timeout_s:.0f} s, e.g. {next(iter(missing))}"
            )
        time.sleep(0.1)
