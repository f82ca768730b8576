"""The UI's open questions: one follower of the agents' journals, folded as it reads.

``GET /api/waiting`` used to read every followed agent's whole journal with a new
consumer on each poll (every 2 s per open tab). Here one consumer reads each journal
once, from its start, then follows it; each request answers from what was folded. Only
what an open question needs is kept: each turn's latest park that asks something, and
the answers its signals gave, both dropped when the turn ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable

from pyrula_stream.agent.definition import AgentTopics
from pyrula_stream.client.signals import PendingQuestion
from pyrula_stream.kafka.io import TopicFollower, TopicRecord
from pyrula_stream.ui.feed import DISCOVERY_INTERVAL_S, RETRY_S, FeedOptions
from pyrula_stream.wire.journal_keys import PARK, SIGNAL, TERMINAL
from pyrula_stream.wire.serde import decode_journal_entry

log = logging.getLogger(__name__)

Question = dict[str, object]


class QuestionBoard:
    """Open questions of the agents ``agents()`` names, from one journal follower."""

    def __init__(self, options: FeedOptions, agents: Callable[[], set[str]]) -> None:
        self.options = options
        self._agents = agents
        self._asks: dict[tuple[str, str], Question] = {}
        """(agent, turn) -> the question of the turn's latest park."""
        self._answered: dict[tuple[str, str], set[str]] = {}
        self._topic_agent: dict[str, str] = {}
        self._stopping = asyncio.Event()
        self.consumers_made = 0
        """Journal consumers made so far: one, unless Kafka failed."""

    def questions(self) -> tuple[list[PendingQuestion], list[str]]:
        """The open questions, oldest first, and the agents whose journal is not read."""
        found = []
        for (agent, turn_id), q in self._asks.items():
            key = str(q.get("key"))
            if key in self._answered.get((agent, turn_id), ()):
                continue
            asked = q.get("asked_ms")
            found.append(
                PendingQuestion(
                    agent,
                    turn_id,
                    key,
                    str(q.get("reason")),
                    int(asked) if isinstance(asked, int | float) else 0,
                    q.get("deadline_ms"),  # type: ignore[arg-type]
                    q.get("tool_name"),  # type: ignore[arg-type]
                    q.get("tool_input"),  # type: ignore[arg-type]
                    q.get("question"),
                )
            )
        found.sort(key=lambda p: (p.asked_ms, p.turn_id))
        followed = set(self._topic_agent.values())
        missing = [
            f"{agent}: its journal is not read (yet)"
            for agent in sorted(self._agents())
            if agent not in followed
        ]
        return found, missing

    async def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        """Follow until ``stop``; after a Kafka failure, read the journals anew."""
        while not self._stopping.is_set():
            try:
                await self._follow()
            except Exception as exc:  # keep the UI up; the next consumer reads anew
                log.warning("reading the journals failed, retrying: %s", exc)
                self._asks, self._answered, self._topic_agent = {}, {}, {}
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), RETRY_S)

    async def _follow(self) -> None:
        follower = await asyncio.to_thread(
            TopicFollower,
            self.options.bootstrap_servers,
            client_id=f"pyrula-ui-questions-{uuid.uuid4().hex[:8]}",
            kafka_config=self.options.kafka_config,
        )
        self.consumers_made += 1
        loop = asyncio.get_running_loop()
        next_discovery = 0.0
        try:
            while not self._stopping.is_set():
                if loop.time() >= next_discovery:
                    await asyncio.to_thread(self._discover, follower)
                    next_discovery = loop.time() + DISCOVERY_INTERVAL_S
                for record in await asyncio.to_thread(follower.poll, 0.2):
                    self._fold(record)
        finally:
            await asyncio.to_thread(follower.close)

    def _discover(self, follower: TopicFollower) -> None:
        wanted = {}
        for agent in self._agents():
            wanted[AgentTopics.for_agent(agent, self.options.prefix).journal] = agent
        new = [t for t in wanted if t not in follower.followed]
        for topic in follower.follow(new, None):  # from the start: parks may be old
            self._topic_agent[topic] = wanted[topic]

    def _fold(self, record: TopicRecord) -> None:
        agent = self._topic_agent.get(record.topic)
        if agent is None or record.key is None:
            return
        turn_id, _, suffix = record.key.decode(errors="replace").rpartition("/")
        if not turn_id:
            return
        where = (agent, turn_id)
        if suffix == TERMINAL:
            if record.value is not None:
                self._asks.pop(where, None)
                self._answered.pop(where, None)
            return
        if suffix != PARK and not suffix.startswith(SIGNAL):
            return
        data = self._data(record)
        if suffix == PARK:
            question = data.get("question") if data is not None else None
            if isinstance(question, dict):
                self._asks[where] = question
            else:  # a park that asks nothing, or its tombstone
                self._asks.pop(where, None)
        elif data is not None and data.get("answer"):
            self._answered.setdefault(where, set()).add(str(data.get("name")))

    @staticmethod
    def _data(record: TopicRecord) -> dict[str, object] | None:
        if record.value is None:
            return None
        try:
            return decode_journal_entry(record.value, {}).data
        except Exception:  # anyone may write the journal: an unreadable entry asks nothing
            return None


__all__ = ["QuestionBoard"]
