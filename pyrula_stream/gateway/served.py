"""What a gateway app serves and holds: the agents (``ServedAgent``) and the ``Gateway``
itself, a client per topic prefix (each with its one shared event reader), the owners read
so far, the open streams and what it last learned of Kafka. The routes (``app``) and the
event streams (``event_route``) use it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException

from pyrula_stream.access.tenant_signature import signed_tenant_headers
from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.client.kafka_client import KafkaAgentClient, TurnHandle
from pyrula_stream.errors import BrokerUnavailableError, ErrorCode
from pyrula_stream.gateway.depth import QueueDepths
from pyrula_stream.gateway.errors import GatewayRefusal, not_found
from pyrula_stream.gateway.options import GATEWAY_TENANT_HEADER, AppOptions
from pyrula_stream.gateway.owners import NOBODY, StreamSlots, TurnOwners
from pyrula_stream.gateway.pending import PendingStreams
from pyrula_stream.kafka.admin import broker_answers
from pyrula_stream.kafka.connection_log import is_connection_failure
from pyrula_stream.objects.urls import store_from_environment
from pyrula_stream.wire.serde import TurnRequest

READY_CACHE_S = 1.0


@dataclass(frozen=True)
class ServedAgent:
    """An agent the gateway serves: its topics' prefix and, for a ``KafkaAgent``, the
    check of a request's parameters against its signature (``None``: the worker checks)."""

    name: str
    topic_prefix: str
    validate: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    parameters: dict[str, Any] | None = None


def served_agent(agent: KafkaAgent | str, topic_prefix: str) -> ServedAgent:
    """A name is forwarded as is; a ``KafkaAgent`` validates parameters before producing."""
    if isinstance(agent, str):
        return ServedAgent(agent, topic_prefix)
    from pyrula_stream.context.agent_context import AgentContext
    from pyrula_stream.tools.schema import derive_arguments, validate_arguments

    model, schema = derive_arguments(agent.fn, agent.name, schema=None, context_type=AgentContext)

    def validate(params: Mapping[str, Any]) -> dict[str, Any]:
        return validate_arguments(agent.name, schema, model, params)

    return ServedAgent(agent.name, agent.prefix, validate, schema)


class Gateway:
    """What one app holds: a client per topic prefix (each with its one shared event
    reader), the owners read so far and the open streams."""

    def __init__(self, agents: Sequence[ServedAgent], options: AppOptions) -> None:
        self.options = options
        self.agents = {a.name: a for a in agents}
        self.owners = TurnOwners(
            options.bootstrap_servers,
            kafka_config=options.kafka_config,
            timeout_s=options.kafka_timeout,
        )
        self.slots = StreamSlots(options.sse_max_streams, options.sse_max_streams_per_owner)
        self.depths = QueueDepths(
            options.bootstrap_servers,
            kafka_config=options.kafka_config,
            timeout_s=options.kafka_timeout,
        )
        self.store = store_from_environment(options.object_store)
        """Where uploads and large parameters go, and references are read from."""
        self._clients: dict[str, KafkaAgentClient] = {}
        self._probed: tuple[float, bool] = (0.0, False)
        """``/readyz``'s own last answer: it reports what it asked Kafka, nothing else."""
        self._seen: tuple[float, bool] = (0.0, False)
        """The latest news of Kafka, from the probe or from a submit."""
        self._asking: asyncio.Task[bool] | None = None
        self.pending = PendingStreams()

    def client(self, agent: ServedAgent) -> KafkaAgentClient:
        found = self._clients.get(agent.topic_prefix)
        if found is None:
            found = self._clients[agent.topic_prefix] = KafkaAgentClient(
                self.options.bootstrap_servers,
                prefix=agent.topic_prefix,
                timeout=self.options.kafka_timeout,
                kafka_config=self.options.kafka_config,
                object_store=self.store,
            )
        return found

    async def close(self) -> None:
        self.pending.close()
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()

    def agent(self, name: str) -> ServedAgent:
        found = self.agents.get(name)
        if found is None:
            raise not_found(f"agent '{name}'")
        return found

    def tenant_headers(
        self, agent: str, turn_id: str, principal: str | None
    ) -> list[tuple[str, bytes]]:
        """The caller's tenant (``options.tenants``, else the principal itself), signed
        for this turn when the gateway has the workers' ``tenant_key``; none without keys."""
        if principal is None:
            return []
        tenant = (self.options.tenants or {}).get(principal, principal)
        key = self.options.tenant_key
        if key is None:
            return [(GATEWAY_TENANT_HEADER, tenant.encode())]
        return signed_tenant_headers(key, agent, turn_id, tenant, GATEWAY_TENANT_HEADER)

    def thread_key(self, principal: str | None, thread_id: str) -> str:
        """With keys, a thread id is the caller's own: ``<principal>:<thread_id>`` on
        Kafka, so no other principal can read, extend or delete it."""
        return thread_id if principal is None else f"{principal}:{thread_id}"

    async def check_owner(
        self, agent: ServedAgent, turn_id: str, thread_id: str | None, principal: str | None
    ) -> str:
        """The principal may see the turn, or ``404`` as if it did not exist. Without
        keys every caller may see every turn."""
        if principal is None:
            return NOBODY
        key = self.thread_key(principal, thread_id) if thread_id else turn_id
        owner = await self.owners.owner(agent.topic_prefix, agent.name, turn_id, key)
        if owner != principal:
            raise not_found(f"turn {turn_id} of agent '{agent.name}'")
        return owner

    async def admit(self, agent: ServedAgent) -> None:
        """``429`` while more turns wait for the agent's workers than ``max_queue_depth``."""
        limit = self.options.max_queue_depth
        if limit is None:
            return
        waiting = await self.depths.depth(agent.topic_prefix, agent.name)
        if waiting > limit:
            raise GatewayRefusal(
                429,
                f"{waiting} turns of agent '{agent.name}' wait for a worker, more than "
                f"max_queue_depth={limit}; retry later",
                code=ErrorCode.BACKPRESSURE_REJECTED,
                headers={"Retry-After": str(self.options.retry_after_s)},
            )

    async def ready(self) -> bool:
        """Whether Kafka answers (asked at most once a second). A submit's success is not
        taken for an answer here: a probe right after a cut must ask."""
        at, answer = self._probed
        if time.monotonic() - at < READY_CACHE_S:
            return answer
        answer = await asyncio.to_thread(
            broker_answers,
            self.options.bootstrap_servers,
            min(2.0, self.options.kafka_timeout),
            kafka_config=self.options.kafka_config,
        )
        self._probed = self._seen = (time.monotonic(), answer)
        return answer

    def refuse_while_down(self) -> None:
        """``503`` at once while the gateway already knows Kafka is unreachable (``/readyz``
        said so, or a submit found it so), instead of after the produce deadline. A stale
        answer is asked again in the background: a later request sees the news."""
        at, answer = self._seen
        if answer or at == 0.0:
            return
        if time.monotonic() - at >= READY_CACHE_S and (self._asking is None or self._asking.done()):
            self._asking = asyncio.create_task(self.ready(), name="pyrula-gateway-ready")
        raise GatewayRefusal(
            503,
            "Kafka is not reachable (see /readyz); retry later",
            code=ErrorCode.STORE_UNAVAILABLE,
            headers={"Retry-After": str(self.options.retry_after_s)},
        )

    def saw_kafka(self, answers: bool) -> None:
        """What a request to Kafka just showed (the next ``refuse_while_down`` uses it)."""
        self._seen = (time.monotonic(), answers)

    async def submit(
        self, served: ServedAgent, turn: TurnRequest, headers: list[tuple[str, bytes]]
    ) -> TurnHandle:
        """Produce the turn, its stream opened first (for the events request that
        follows: see ``PendingStreams``) unless an idempotency key may name an older turn."""
        self.refuse_while_down()
        client = self.client(served)
        stream = None
        try:
            if turn.idempotency_key is None:
                stream = await client.open_stream(served.name, turn.turn_id, new_turn=True)
            handle = await client.submit_request(turn, headers=headers)
        except BaseException as exc:
            if isinstance(exc, BrokerUnavailableError) or (
                isinstance(exc, KafkaException) and is_connection_failure(exc)
            ):
                # Whichever call found Kafka gone: a stream's lookup can fail before the
                # produce, sooner than the cached "ready" of the last submit expires.
                self.saw_kafka(False)
            if stream is not None:
                stream.drop()
            raise
        self.saw_kafka(True)
        if stream is not None:
            self.pending.keep(served.name, turn.turn_id, stream)
        return handle
