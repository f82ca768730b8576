"""Who owns a turn, and how many streams each caller holds open.

The gateway keeps no state of its own: a turn's owner is read from its request record
(``metadata["owner"]``, as the gateway wrote it), on the one partition of the request's
key. What is read is cached, since a request never changes; any gateway process reads
the same answer. Stream counts are per process: a limit protects this process.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from pyrula_stream.access.api_keys import OWNER_METADATA
from pyrula_stream.agent.definition import AgentTopics
from pyrula_stream.client.turn_status import request_turn_id
from pyrula_stream.errors import ErrorCode
from pyrula_stream.gateway.errors import GatewayRefusal
from pyrula_stream.kafka.consumers import reader_group_id
from pyrula_stream.kafka.offsets import ConsumedRecord
from pyrula_stream.kafka.turn_lookup import TurnLookup
from pyrula_stream.wire import serde

REMEMBERED_OWNERS = 10_000
MISS_TTL_S = 10.0
"""How long "no such turn" is remembered: a repeated ask for a turn id that is not there
(a guess, a typo) reads the turns partition once per this, not once per request. Short,
so a turn submitted through another gateway process is found soon after."""
NOBODY = ""
"""The owner of a request that names none (submitted without keys, or not over HTTP)."""


class TurnOwners:
    """The owner of each turn, read once from its request record (see module doc)."""

    def __init__(
        self, bootstrap_servers: str, *, kafka_config: Mapping[str, Any] | None, timeout_s: float
    ) -> None:
        self._bootstrap = bootstrap_servers
        self._kafka_config = kafka_config
        self._timeout_s = timeout_s
        self._known: OrderedDict[tuple[str, str], tuple[str, int]] = OrderedDict()
        self._missing: OrderedDict[tuple[str, str], float] = OrderedDict()
        self.reads = 0
        """Reads of a turns partition so far (each scans up to a whole partition)."""

    def remember(self, agent: str, turn_id: str, owner: str, submitted_ms: int) -> None:
        """What this process submitted it knows without a read."""
        self._missing.pop((agent, turn_id), None)
        self._known[(agent, turn_id)] = (owner, submitted_ms)
        while len(self._known) > REMEMBERED_OWNERS:
            self._known.popitem(last=False)

    async def owner(self, prefix: str, agent: str, turn_id: str, key: str) -> str | None:
        """The turn's owner (``NOBODY`` if its request names none), ``None`` when no
        request of that turn is on its key's partition."""
        known = self._known.get((agent, turn_id))
        if known is not None:
            return known[0]
        missed_at = self._missing.get((agent, turn_id))
        if missed_at is not None and time.monotonic() - missed_at < MISS_TTL_S:
            return None
        self.reads += 1
        found = await asyncio.to_thread(self._read, prefix, agent, turn_id, key)
        if found is None:
            self._missing[(agent, turn_id)] = time.monotonic()
            self._missing.move_to_end((agent, turn_id))
            while len(self._missing) > REMEMBERED_OWNERS:
                self._missing.popitem(last=False)
            return None
        self._missing.pop((agent, turn_id), None)
        self.remember(agent, turn_id, *found)
        return found[0]

    def submitted_ms(self, agent: str, turn_id: str) -> int | None:
        """When the turn was submitted, if its request was seen (a stream starts reading
        there instead of at the partition's start)."""
        known = self._known.get((agent, turn_id))
        return known[1] if known is not None and known[1] > 0 else None

    def _read(self, prefix: str, agent: str, turn_id: str, key: str) -> tuple[str, int] | None:
        topics = AgentTopics.for_agent(agent, prefix)
        with TurnLookup(
            self._bootstrap,
            client_id=f"pyrula-gateway-{uuid.uuid4().hex[:8]}",
            group_id=reader_group_id(prefix, agent),
            kafka_config=self._kafka_config,
            timeout_s=self._timeout_s,
        ) as lookup:
            partition = lookup.partition_of(topics.turns, key)
            if partition is None:
                return None

            def requested(record: ConsumedRecord) -> bool:
                return request_turn_id(agent, topics.turns, record) == turn_id

            records = lookup.read(topics.turns, partition, requested)
        for record in records:
            request = serde.decode_turn_request(
                record.value, record.headers, default_turn_id=turn_id, default_agent=agent
            )
            owner = request.metadata.get(OWNER_METADATA)
            return (owner if isinstance(owner, str) else NOBODY), request.submitted_ms
        return None


class StreamSlots:
    """Open SSE streams of this process, in all and per owner (``None``: no limit)."""

    def __init__(self, max_streams: int | None, max_per_owner: int | None) -> None:
        self.max_streams = max_streams
        self.max_per_owner = max_per_owner
        self.open = 0
        self._by_owner: dict[str, int] = {}

    def take(self, owner: str) -> None:
        """Count one more stream of ``owner``, or refuse with ``429`` (the caller's own
        limit first: it says what the caller can do about it)."""
        held = self._by_owner.get(owner, 0)
        # without keys every caller is NOBODY: only the process-wide limit applies
        if self.max_per_owner is not None and owner != NOBODY and held >= self.max_per_owner:
            raise GatewayRefusal(
                429,
                f"this caller already has {held} open streams on this gateway, its limit "
                "(sse_max_streams_per_owner); close one first",
                code=ErrorCode.BACKPRESSURE_REJECTED,
                headers={"Retry-After": "5"},
            )
        if self.max_streams is not None and self.open >= self.max_streams:
            raise GatewayRefusal(
                429,
                f"this gateway has {self.open} open streams, its limit (sse_max_streams); "
                "retry later or on another gateway",
                code=ErrorCode.BACKPRESSURE_REJECTED,
                headers={"Retry-After": "5"},
            )
        self.open += 1
        self._by_owner[owner] = held + 1

    def give_back(self, owner: str) -> None:
        self.open -= 1
        left = self._by_owner.get(owner, 1) - 1
        if left > 0:
            self._by_owner[owner] = left
        else:
            self._by_owner.pop(owner, None)
