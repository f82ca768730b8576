"""``KafkaAgentClient.cancel``, ``terminate`` and ``status``: the client's control of a turn
it may not have submitted.

A cancel or terminate is a control record on ``<agent>.control``, keyed by the turn id;
the worker that owns the turn acts on it (``runtime``). A status reads only the partition
of the turn's key (``turn_status``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import TYPE_CHECKING

from pyrula_stream.agent.definition import AgentTopics
from pyrula_stream.client.outgoing_caps import check_turn_id
from pyrula_stream.client.parts import ClientParts
from pyrula_stream.client.turn_status import TurnStatus, read_turn_status
from pyrula_stream.errors import ConfigurationError, UnknownTopicError
from pyrula_stream.kafka.consumers import reader_group_id
from pyrula_stream.kafka.turn_lookup import TurnLookup
from pyrula_stream.wire import serde
from pyrula_stream.wire.events import Event
from pyrula_stream.wire.records import ControlRequest

MAX_REASON = 500
"""The longest ``reason`` a cancel or terminate carries."""


class ControlClient(ClientParts):
    """The control methods of ``KafkaAgentClient`` (a mixin: it supplies the connection
    settings, the producer, the topics and the turn's stream)."""

    if TYPE_CHECKING:  # supplied by KafkaAgentClient

        def _topics(self, agent: str) -> AgentTopics: ...

        def _reader_codec(self) -> serde.ValueCodec | None: ...

        def stream(self, agent: str, turn_id: str) -> AsyncIterator[Event]: ...

    async def cancel(self, agent: str, turn_id: str, *, reason: str | None = None) -> None:
        """Ask the owning worker to stop the turn at its next step boundary."""
        await self._control(agent, turn_id, "cancel", reason)

    async def terminate(
        self,
        agent: str,
        turn_id: str,
        *,
        reason: str | None = None,
        timeout: float = 60.0,  # noqa: ASYNC109 (seconds to wait for the turn to end)
    ) -> TurnStatus:
        """End the turn now (its worker does not wait for a step boundary); return what
        was stopped: the turn's attempt and last step, and how it ended.

        A turn that had already ended is returned as it ended (nothing was stopped); a
        turn nothing is known of yet is returned ``unknown`` (workers remember the
        request and stop the turn when it arrives).
        """
        before = await self.status(agent, turn_id)
        if before.state in ("completed", "failed"):
            return before
        await self._control(agent, turn_id, "terminate", reason)
        if before.state == "unknown":
            return before
        async with asyncio.timeout(timeout):
            async for _ in self.stream(agent, turn_id):
                pass
        after = await self.status(agent, turn_id)
        return replace(after, attempt=before.attempt, last_step=before.last_step)

    async def status(self, agent: str, turn_id: str, *, key: str | None = None) -> TurnStatus:
        """Where the turn stands (see ``TurnStatus``), whoever submitted it.

        Reads only the partition of the request's key: the journal partition (running,
        or ended while its terminal record is kept), then the results partition, then the
        turns partition past the committed offset of ``<prefix>.<agent>.workers``
        (queued). ``key`` is the key the request was produced with, when it is not the
        turn id: the thread id of a turn in a thread, or a key a non-Python producer
        chose. Turns this client submitted need none.
        """
        key = key or self._submitted.get((agent, turn_id)) or turn_id
        return await asyncio.to_thread(self._read_status, agent, turn_id, key)

    def _read_status(self, agent: str, turn_id: str, key: str) -> TurnStatus:
        topics = self._topics(agent)
        with TurnLookup(
            self.bootstrap_servers,
            client_id=f"pyrula-status-{uuid.uuid4().hex[:8]}",
            group_id=reader_group_id(self.prefix, agent),
            kafka_config=self.kafka_config,
            timeout_s=self.timeout,
        ) as lookup:
            status = read_turn_status(
                lookup,
                agent,
                topics,
                turn_id,
                key,
                workers_group=f"{self.prefix}.{agent}.workers",
                codec=self._reader_codec(),
            )
        if status is None:
            unknown = UnknownTopicError(f"no topic {topics.turns}", topic=topics.turns)
            raise self._no_topic(agent, unknown)
        return status

    async def _control(self, agent: str, turn_id: str, action: str, reason: str | None) -> None:
        check_turn_id(turn_id)
        if reason is not None and len(reason) > MAX_REASON:
            raise ConfigurationError(f"reason is {len(reason)} characters; at most {MAX_REASON}")
        record = ControlRequest(turn_id, action, reason).record(self._topics(agent).control)
        try:
            await self._get_producer().send(
                record.topic, record.key, record.value, list(record.headers)
            )
        except UnknownTopicError as exc:
            raise self._no_topic(agent, exc) from None
