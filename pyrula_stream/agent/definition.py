"""``@kafka_agent``: binds an agent body to its model, tools, limits and topics.

Binding is where the Kafka limits are enforced: by default a tool that needs a person's
approval cannot be offered, so the decorator refuses it at import time rather than letting
a turn hang later. ``human_in_the_loop=True`` lifts that refusal: the agent's turns then
park for a reviewer's answer as they park for a sub-agent's reply.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cached_property
from typing import Any, Literal

from pydantic.errors import PydanticUserError

from pyrula_stream.agent.batch import BatchLane
from pyrula_stream.agent.experiments import Experiment, check_experiment
from pyrula_stream.agent.limits import AgentLimits
from pyrula_stream.agent.output import OutputSpec
from pyrula_stream.agent.tenants import (
    OnQuota,
    Tenancy,
    TenantLimits,
    TenantSource,
    UnknownTenants,
    check_tenancy,
)
from pyrula_stream.errors import (
    AgentRegistrationError,
    ConfigurationError,
    ToolRegistrationError,
)
from pyrula_stream.evals.evaluators import Evaluator
from pyrula_stream.evals.outcomes import OutcomeEvaluator
from pyrula_stream.kafka.acls import check_name_piece, shared_prefix
from pyrula_stream.kafka.admin import (
    DEFAULT_PARTITIONS,
    DEFAULT_PREFIX,
    TopicSpec,
    agent_topic_specs,
)
from pyrula_stream.llm.base import LLMClient
from pyrula_stream.tools.contract import (
    HUMAN_IN_THE_LOOP_HINT,
    KAFKA_APPROVAL_LIMIT,
    ToolCallable,
    check_bindable,
)
from pyrula_stream.tools.mcp_servers import MCPServer
from pyrula_stream.wire.events import RESULTS, ROUTABLE, EventRouting
from pyrula_stream.wire.scores import SCORES_TOPIC_SUFFIX
from pyrula_stream.wire.serde import WireFormat

_AGENT_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,100}$")

_REGISTERED: dict[tuple[str, str], KafkaAgent] = {}
"""Agents bound in this process, by (prefix, name); what ``registered_agents`` lists.
The seeds' API asks for it: binding is import time, and a worker of several agents or a
``call_agent`` by name finds them here. Re-binding a name replaces the earlier agent."""


def registered_agents() -> list[KafkaAgent]:
    """Every agent bound with ``@kafka_agent`` in this process, in the order bound."""
    return list(_REGISTERED.values())


@dataclass(frozen=True)
class AgentTopics:
    """The names of one agent's topics.

    Two of them hold "history" of different kinds: ``history`` is recorded turns (one
    record a finished turn, with ``keep_history``), ``threads`` is a thread's messages
    (what a later turn of the thread sends the model).
    """

    turns: str
    events: str
    journal: str
    control: str
    dlq: str
    history: str
    """Recorded turns: a finished turn's request, steps and outcome (``keep_history``)."""
    replies: str
    """Sub-agent outcomes: only the workers of the agents it calls write here."""
    results: str
    threads: str
    """Thread messages: the conversation a thread's next turn continues."""
    tenants: str
    """Operators' tenant limits, keyed by tenant (``pyrula-stream tenants set``)."""
    tenant_usage: str
    """What each tenant used, per window and model call, shared by the worker group."""
    signals: str
    """Clients' signals to waiting turns (not answers): what a client may send."""
    answers: str
    """Answers to questions (approvals, interrupts): what only a reviewer may write."""

    @classmethod
    def for_agent(cls, agent: str, prefix: str = DEFAULT_PREFIX) -> AgentTopics:
        base = f"{prefix}.{agent}"
        return cls(
            f"{base}.turns",
            f"{base}.events",
            f"{base}.journal",
            f"{base}.control",
            f"{base}.dlq",
            f"{base}.history",
            f"{base}.replies",
            f"{base}.results",
            f"{base}.threads",
            f"{base}.tenants",
            f"{base}.tenant-usage",
            f"{base}.signals",
            f"{base}.answers",
        )

    @property
    def dlq_redrives(self) -> str:
        """Redriven dead letters, keyed by dlq offset (``pyrula-stream dlq redrive``)."""
        return f"{self.dlq}-redrives"

    @property
    def scores(self) -> str:
        """Evaluators' scores of the agent's turns, keyed by turn id (``evals``)."""
        return f"{self.turns.removesuffix('.turns')}.{SCORES_TOPIC_SUFFIX}"

    @property
    def outcomes(self) -> str:
        """Deferred outcomes' waits and early events (compacted; ``evals``)."""
        return f"{self.turns.removesuffix('.turns')}.outcomes"


VersionBehavior = Literal["pinned", "auto_upgrade"]


def _history_retention_ms(agent_name: str, keep_history: bool | timedelta) -> int | None:
    """The retention of the recorded-turns topic a ``timedelta`` sets (``None``: the spec's)."""
    if isinstance(keep_history, timedelta) and keep_history.total_seconds() >= 1:
        return int(keep_history.total_seconds() * 1000)
    if isinstance(keep_history, bool):
        return None
    raise AgentRegistrationError(
        f"agent '{agent_name}': keep_history must be True, False or a timedelta of at least "
        f"a second (how long <agent>.history keeps a turn); got {keep_history!r}"
    )


@dataclass(frozen=True)
class KafkaAgent:
    """An agent bound to Kafka: what ``pyrula-stream worker MODULE:AGENT`` runs."""

    name: str
    fn: Callable[..., Any]
    llm: LLMClient | None
    tools: tuple[ToolCallable, ...]
    limits: AgentLimits
    prefix: str = DEFAULT_PREFIX
    partitions: int = DEFAULT_PARTITIONS
    deps: Any = field(default=None, repr=False)
    """The user's own objects (clients with their keys): never in the agent's repr."""
    output_topics: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    timeout: float = 600.0
    mcp_servers: tuple[MCPServer, ...] = ()
    keep_history: bool = False
    history_retention_ms: int | None = None
    """``<agent>.history``'s ``retention.ms`` when ``keep_history`` gave one."""
    max_thread_turns: int = 0
    version: str | None = None
    version_behavior: VersionBehavior = "auto_upgrade"
    versions: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    experiment: Experiment | None = None
    """Which version a new turn starts on, by a hash of its key (``experiments.py``)."""
    output_type: Any = None
    output_retries: int = 1
    event_format: WireFormat = "avro"
    trust_domain: str | None = None
    human_in_the_loop: bool = False
    """Opted in to parking turns for a person (tool approvals, ``ctx.interrupt``)."""
    tenancy: Tenancy = field(default_factory=Tenancy)
    """Where a turn's tenant comes from and what each tenant may use (``tenants.py``)."""
    batch: BatchLane | None = None
    """Model calls that may wait for the provider's batch API (``batch.py``)."""
    evaluators: tuple[Evaluator, ...] = ()
    """What scores the agent's turns (``pyrula-stream evals run`` runs them)."""

    @property
    def shared_prefix(self) -> str:
        """Prefix of the memory and tool cache topics this agent shares (its trust domain's)."""
        return shared_prefix(self.prefix, self.trust_domain)

    @cached_property
    def topics(self) -> AgentTopics:
        """Built once: the worker reads it for every turn (the agent is frozen)."""
        return AgentTopics.for_agent(self.name, self.prefix)

    def topic_specs(self) -> list[TopicSpec]:
        return agent_topic_specs(
            self.name,
            prefix=self.prefix,
            partitions=self.partitions,
            keep_history=self.keep_history,
            history_retention_ms=self.history_retention_ms,
            tenants=self.tenancy.enabled,
            outcomes=any(isinstance(e, OutcomeEvaluator) for e in self.evaluators),
        )

    @cached_property
    def event_routing(self) -> EventRouting:
        """``<agent>.events`` / ``<agent>.results``, plus the routed output topics."""
        return EventRouting(
            self.topics.events, self.output_topics, self.topics.results, self.event_format
        )

    @cached_property
    def output(self) -> OutputSpec | None:
        """How the result is validated, or ``None`` without ``output_type``."""
        return None if self.output_type is None else OutputSpec(self.output_type)

    async def __call__(self, ctx: Any, /, **params: Any) -> Any:
        return await self.fn(ctx, **params)


def kafka_agent(
    *,
    name: str | None = None,
    llm: LLMClient | None = None,
    tools: Sequence[ToolCallable] = (),
    limits: AgentLimits | None = None,
    prefix: str = DEFAULT_PREFIX,
    partitions: int = DEFAULT_PARTITIONS,
    deps: Any = None,
    mcp_servers: Sequence[MCPServer] = (),
    output_topics: Mapping[str, Sequence[str]] | None = None,
    timeout: float = 600.0,
    keep_history: bool | timedelta = False,
    max_thread_turns: int = 0,
    version: str | None = None,
    version_behavior: VersionBehavior | None = None,
    versions: Mapping[str, Callable[..., Any]] | None = None,
    experiment: Experiment | None = None,
    output_type: Any = None,
    output_retries: int = 1,
    event_format: WireFormat = "avro",
    trust_domain: str | None = None,
    human_in_the_loop: bool = False,
    tenant: TenantSource | None = None,
    tenant_limits: TenantLimits | None = None,
    tenant_overrides: Mapping[str, TenantLimits] | None = None,
    on_quota: OnQuota = "defer",
    unknown_tenants: UnknownTenants = "shared",
    batch: BatchLane | None = None,
    evaluators: Sequence[Evaluator] = (),
) -> Callable[[Callable[..., Any]], KafkaAgent]:
    """Bind an ``async def body(ctx, **params)`` as a Kafka agent.

    ``output_topics`` routes event types (or ``"*"``), and ``"results"`` (the result
    record), to extra topics, e.g. ``{"run:complete": ["orders.answers"]}``; every event
    also goes to ``<agent>.events`` and every result to ``<agent>.results``.
    ``output_type`` (anything pydantic validates) checks the result; a model answer that
    fails is sent back to the model up to ``output_retries`` times, then the turn fails
    with ``output_validation``. ``event_format="json"`` writes events and results as JSON.
    ``keep_history`` writes each finished turn's steps to ``<agent>.history`` (kept 7
    days, or as long as a ``timedelta`` given instead of ``True`` says).
    ``max_thread_turns`` keeps only a thread's newest turns in ``<agent>.threads`` (0
    keeps all).
    ``version`` names this body's version (journaled when a turn starts);
    ``version_behavior`` is ``"pinned"`` (the default with a version: a turn finishes on
    the version it started on, from ``versions={"1": old_body}``) or ``"auto_upgrade"``
    (the default without one: the newest body continues every turn).
    ``experiment`` starts a share of new turns on each of its variants (versions this
    code has), keyed by thread so a conversation stays on one version: see
    docs/evaluation.md.
    ``trust_domain`` gives the agent the memory and tool cache of that domain
    (``<prefix>.<domain>.memory``, ``<prefix>.<domain>.cache``) instead of the shared
    ``<prefix>.memory`` / ``<prefix>.cache``: agents in other domains neither read nor
    poison them, and ``pyrula-stream acls`` grants only the domain's topics.
    ``human_in_the_loop=True`` lets the agent offer approval-gated tools (and MCP servers
    with ``requires_approval``) and call ``ctx.interrupt``: the turn parks until someone
    answers (``pyrula-stream approve|reject``, ``KafkaAgentClient.resume``).
    ``tenant`` says whose a turn is: ``"key"`` (the record key), ``"header:<name>"``, or a
    function of the request; workers admit turns round-robin across tenants and hold
    each to ``tenant_limits`` (or its entry in ``tenant_overrides``); a turn over a quota
    is deferred (``on_quota="defer"``) or fails with ``budget_exceeded`` (``"fail"``).
    A tenant nobody configured (no override in code or in the tenants topic, no signature
    under the workers' ``tenant_key``) runs as the one shared tenant ``"unknown"``
    (``unknown_tenants="own"`` gives each id its own share). See docs/tenants.md.
    ``batch=BatchLane(client, when=...)`` lets model calls that may wait go to the
    provider's batch API at its batch price, the turn parked meanwhile. See
    docs/batch-lane.md.
    ``evaluators`` score finished turns onto ``<agent>.scores``, off the turn's path, in
    their own consumer group (``pyrula-stream evals run``). See docs/evaluation.md.
    """

    def bind(fn: Callable[..., Any]) -> KafkaAgent:
        """Build the agent, then refuse it by ``_BIND_CHECKS`` (``keep_history`` is
        checked while building: it becomes the history topic's retention)."""
        agent_name = name or fn.__name__
        agent = KafkaAgent(
            name=agent_name,
            fn=fn,
            llm=llm,
            tools=tuple(tools),
            limits=limits or AgentLimits(),
            prefix=prefix,
            partitions=partitions,
            deps=deps,
            output_topics={k: tuple(v) for k, v in (output_topics or {}).items()},
            timeout=timeout,
            mcp_servers=tuple(mcp_servers),
            keep_history=bool(keep_history),
            history_retention_ms=_history_retention_ms(agent_name, keep_history),
            max_thread_turns=max_thread_turns,
            version=version,
            version_behavior=version_behavior or ("pinned" if version else "auto_upgrade"),
            versions=dict(versions or {}),
            experiment=experiment,
            output_type=output_type,
            output_retries=output_retries,
            event_format=event_format,
            trust_domain=trust_domain,
            human_in_the_loop=human_in_the_loop,
            tenancy=Tenancy(
                tenant,
                tenant_limits or TenantLimits(),
                dict(tenant_overrides or {}),
                on_quota,
                unknown_tenants,
            ),
            batch=_batch_lane(agent_name, batch),
            evaluators=tuple(evaluators),
        )
        for check in _BIND_CHECKS:
            check(agent)
        _REGISTERED.pop((prefix, agent_name), None)
        _REGISTERED[(prefix, agent_name)] = agent
        return agent

    return bind


def _batch_lane(agent_name: str, batch: Any) -> BatchLane | None:
    if batch is None or isinstance(batch, BatchLane):
        return batch
    raise AgentRegistrationError(
        f"agent '{agent_name}': batch= takes a BatchLane(client, ...), not {type(batch).__name__}"
    )


# -- the refusals at bind time: one check a rule, run in order by ``kafka_agent`` ---------


def _refuse(agent: KafkaAgent, why: str) -> AgentRegistrationError:
    return AgentRegistrationError(f"agent '{agent.name}': {why}")


def _check_name(agent: KafkaAgent) -> None:
    """The name is part of every topic name, so it must be a valid topic-name piece."""
    if not _AGENT_NAME.match(agent.name):
        raise AgentRegistrationError(
            f"agent name {agent.name!r} must match [a-zA-Z0-9_-]{{1,100}}: it names topics"
        )


def _check_body(agent: KafkaAgent) -> None:
    """The worker awaits the body between durable steps: a plain function would block."""
    if not inspect.iscoroutinefunction(agent.fn):
        raise AgentRegistrationError(f"agent '{agent.name}' must be an async def")


def _check_tools(agent: KafkaAgent) -> None:
    """Only a ``@tool`` carries the schema and the effect the journal needs, and a tool
    that needs a person's approval is refused unless the agent opted in."""
    for t in agent.tools:
        if not isinstance(t, ToolCallable):
            raise ToolRegistrationError(
                f"agent '{agent.name}': {t!r} is not a @tool; decorate it with @tool"
            )
        check_bindable(t, agent_name=agent.name, human_in_the_loop=agent.human_in_the_loop)


def _check_mcp_servers(agent: KafkaAgent) -> None:
    """An MCP server must be declared (the worker connects to it) and, like a tool,
    is refused when it gates tools for a person's approval, unless the agent opted in."""
    for server in agent.mcp_servers:
        if not isinstance(server, MCPServer):
            raise ToolRegistrationError(
                f"agent '{agent.name}': {server!r} is not an MCPServer; declare it as "
                "MCPServer(name, url=...) or MCPServer(name, command=[...])"
            )
        if server.requires_approval and not agent.human_in_the_loop:
            raise ToolRegistrationError(
                f"agent '{agent.name}': MCP server '{server.name}' sets requires_approval, "
                f"but {KAFKA_APPROVAL_LIMIT} by default; {HUMAN_IN_THE_LOOP_HINT}"
            )


def _check_unique_names(agent: KafkaAgent) -> None:
    """The model calls tools by name and the journal keys MCP calls by server: a name
    used twice would make a recorded call ambiguous on replay."""
    servers = [s.name for s in agent.mcp_servers]
    if len(set(servers)) != len(servers):
        raise ToolRegistrationError(f"agent '{agent.name}': MCP server names repeat: {servers}")
    names = [t.name for t in agent.tools]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ToolRegistrationError(f"agent '{agent.name}': tool names repeat: {dupes}")


def _check_topic_settings(agent: KafkaAgent) -> None:
    """Partitions and the thread cap become topic settings: refuse values Kafka would
    refuse later, or that mean nothing (a negative number of kept turns)."""
    if agent.partitions < 1:
        raise _refuse(agent, "partitions must be >= 1")
    if agent.max_thread_turns < 0:
        raise _refuse(
            agent,
            f"max_thread_turns must be >= 0 (0 keeps every turn), got {agent.max_thread_turns}",
        )


def _check_versions(agent: KafkaAgent) -> None:
    """A pinned turn is resumed by the body it started on, so the older bodies must be
    named against this one, must not include it, and must be awaitable like it."""
    if agent.version_behavior not in ("pinned", "auto_upgrade"):
        raise _refuse(
            agent,
            f"version_behavior must be 'pinned' or 'auto_upgrade', got {agent.version_behavior!r}",
        )
    if agent.versions and agent.version is None:
        raise _refuse(agent, "versions= needs version= (the version of this body)")
    if agent.version is not None and agent.version in agent.versions:
        raise _refuse(
            agent, f"version {agent.version!r} is this body; versions= lists only older bodies"
        )
    for v, body in agent.versions.items():
        if not inspect.iscoroutinefunction(body):
            raise _refuse(agent, f"versions[{v!r}] must be an async def")
    why = check_experiment(agent.name, agent.experiment, agent.version, agent.versions)
    if why is None and agent.experiment is not None and agent.version_behavior != "pinned":
        why = "an experiment needs version_behavior='pinned': a turn finishes on its variant"
    if why is not None:
        raise _refuse(agent, why)


def _check_outputs(agent: KafkaAgent) -> None:
    """Where events go and how they are written is fixed per agent: an unroutable key or
    an unknown format would drop records silently later."""
    unknown = sorted(set(agent.output_topics) - ROUTABLE)
    if unknown:
        raise _refuse(
            agent,
            f"output_topics keys {unknown} are not routable; use event types, '*' or '{RESULTS}'",
        )
    if agent.event_format not in ("avro", "json"):
        raise _refuse(agent, f"event_format must be 'avro' or 'json', not {agent.event_format!r}")
    if agent.output_retries < 0:
        raise _refuse(agent, "output_retries must be >= 0")


def _check_trust_domain(agent: KafkaAgent) -> None:
    """The trust domain names the memory and cache topics the agent shares; the prefix
    starts every topic and transactional id, so a dot in it would let one agent's
    PREFIXED ACL (``<prefix>.<agent>.``) match another agent's ids."""
    try:
        check_name_piece("prefix", agent.prefix)
    except ConfigurationError as exc:
        raise _refuse(agent, str(exc)) from None
    if agent.trust_domain is not None and not _AGENT_NAME.match(agent.trust_domain):
        raise _refuse(
            agent,
            f"trust_domain {agent.trust_domain!r} must match [a-zA-Z0-9_-]{{1,100}}: it names "
            "the domain's memory and cache topics",
        )


def _check_output_type(agent: KafkaAgent) -> None:
    """The result validator is built now, so a type pydantic cannot validate fails at
    import rather than at a turn's end."""
    try:
        agent.output  # noqa: B018 (builds the validator)
    except PydanticUserError as exc:
        raise _refuse(
            agent,
            f"output_type {agent.output_type!r} is not a type pydantic can validate: {exc}",
        ) from None


def _check_evaluators(agent: KafkaAgent) -> None:
    """Scores are told apart by evaluator name: one name twice would merge two series."""
    for ev in agent.evaluators:
        if not isinstance(ev, Evaluator):
            raise _refuse(agent, f"{ev!r} is not an evaluator (use @evaluator, judge, outcome)")
    names = [e.name for e in agent.evaluators]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise _refuse(agent, f"evaluator names repeat: {dupes}")


def _check_tenancy(agent: KafkaAgent) -> None:
    """A tenant source the worker could not read would put every turn in one tenant."""
    check_tenancy(agent.name, agent.tenancy)


_BIND_CHECKS: tuple[Callable[[KafkaAgent], None], ...] = (
    _check_name,
    _check_body,
    _check_tools,
    _check_mcp_servers,
    _check_unique_names,
    _check_topic_settings,
    _check_versions,
    _check_outputs,
    _check_trust_domain,
    _check_output_type,
    _check_tenancy,
    _check_evaluators,
)
"""What ``@kafka_agent`` refuses, in the order it asks."""
