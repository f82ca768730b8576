"""The UI process's one shared consumer: it follows the events and DLQ topics of the
agents, folds what it reads into ``UIState``, and wakes the live streams.

It reads under ``read_committed`` (a turn's events are seen once, in ``seq`` order, and
never from an aborted transaction) and starts ``history_s`` back in time, so opening the
UI on a busy cluster does not replay days of events. A turn older than that is read on
demand, by id, from its partition (``load_turn``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pyrula_stream.agent.definition import AgentTopics
from pyrula_stream.comparison.scores import scores_topic
from pyrula_stream.errors import MalformedRecordError
from pyrula_stream.kafka.config import registry_config, resolve
from pyrula_stream.kafka.consumers import read_key
from pyrula_stream.kafka.io import TopicFollower, TopicRecord
from pyrula_stream.objects.resolver import PayloadStores, has_refs
from pyrula_stream.objects.urls import store_from_environment
from pyrula_stream.ui.model import TurnView, UIState, turn_from_events
from pyrula_stream.ui.scores import ScoreBoard
from pyrula_stream.wire.events import Event, decode_event
from pyrula_stream.wire.scores import parse_score
from pyrula_stream.wire.serde import ValueCodec

log = logging.getLogger(__name__)

DISCOVERY_INTERVAL_S = 5.0  # how often new agents' topics are looked for
RETRY_S = 2.0  # pause before a new consumer after a Kafka failure


@dataclass(frozen=True)
class FeedOptions:
    """What the feed reads: which agents (None: every agent found), from how far back."""

    bootstrap_servers: str
    prefix: str = "pyrula"
    agents: tuple[str, ...] | None = None
    history_s: float = 3600.0
    kafka_config: Mapping[str, Any] | None = None
    """The user's client settings (security, ``client.id``); None: ``PYRULA_KAFKA_CONFIG``."""
    object_store: Any = field(default=None, repr=False)
    """Where values stored by reference are (a store or its setting; None:
    ``PYRULA_OBJECT_STORE``): a turn's view reads them back."""

    def __post_init__(self) -> None:
        # Resolved once, as WorkerOptions does: a repr then hides the secrets.
        object.__setattr__(self, "kafka_config", resolve(self.kafka_config))


class EventFeed:
    """Follows the agents' topics in one consumer; ``run`` until ``stop``."""

    def __init__(self, options: FeedOptions, state: UIState) -> None:
        self.options = options
        self.state = state
        self.scores = ScoreBoard()
        self.undecodable = 0
        self.unshowable = 0  # decoded events the timeline could not fold (odd data)
        self.error: str | None = None
        self._resume: dict[tuple[str, int], int] = {}
        self._topic_agent: dict[str, tuple[str, str]] = {}
        self._changed = asyncio.Condition()
        self._stopping = asyncio.Event()
        self._events_pattern = re.compile(rf"^{re.escape(options.prefix)}\.(.+)\.events$")
        self._codec: ValueCodec | None = None
        if registry_config(options.kafka_config) is not None:  # registry-framed events too
            from pyrula_stream.kafka.schema_registry import reader_codec

            self._codec = reader_codec(options.kafka_config)
        for agent in options.agents or ():
            state.add_agent(agent)
        store = store_from_environment(options.object_store)
        self.payloads = PayloadStores([store] if store is not None else [])
        """Reads back the values a turn's events hold by reference (``load_turn``)."""

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def stop(self) -> None:
        """Stop reading and release every live stream waiting for a change."""
        self._stopping.set()
        await self._notify()
        if self._codec is not None:
            self._codec.close()

    async def wait_changed(self, since: int, timeout_s: float) -> bool:
        """Wait until the state is newer than ``since`` (True), or stopping or timeout."""
        async with self._changed:
            try:
                async with asyncio.timeout(timeout_s):
                    await self._changed.wait_for(
                        lambda: self.state.version > since or self.stopping
                    )
            except TimeoutError:
                return False
        return self.state.version > since and not self.stopping

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def run(self) -> None:
        """Follow until ``stop``. A Kafka failure is shown on the page (``error``) and the
        consumer is made again; what was read stays, and reading resumes where it was."""
        while not self.stopping:
            try:
                await self._follow()
            except Exception as exc:  # any client failure: say it, keep the UI up
                log.warning("reading Kafka failed, retrying: %s", exc)
                self.error = f"reading Kafka failed: {exc}"
                self.state.touch()
                await self._notify()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), RETRY_S)

    async def _follow(self) -> None:
        follower = await asyncio.to_thread(
            TopicFollower,
            self.options.bootstrap_servers,
            client_id=f"pyrula-ui-{uuid.uuid4().hex[:8]}",
            kafka_config=self.options.kafka_config,
        )
        loop = asyncio.get_running_loop()
        next_discovery = 0.0
        try:
            while not self.stopping:
                if loop.time() >= next_discovery:
                    await asyncio.to_thread(self._discover, follower)
                    next_discovery = loop.time() + DISCOVERY_INTERVAL_S
                records = await asyncio.to_thread(follower.poll, 0.2)
                changed = self._fold(records) if records else False
                if self.error is not None:
                    self.error, changed = None, True
                    self.state.touch()
                if changed:
                    await self._notify()
        finally:
            await asyncio.to_thread(follower.close)

    def _discover(self, follower: TopicFollower) -> None:
        """Follow the topics of the named agents, or of every agent the cluster has."""
        agents = self.options.agents
        if agents is None:
            names = follower.topic_names()
            agents = tuple(
                sorted(m.group(1) for n in names if (m := self._events_pattern.match(n)))
            )
        wanted: list[str] = []
        for agent in agents:
            topics = AgentTopics.for_agent(agent, self.options.prefix)
            self._topic_agent[topics.events] = (agent, "events")
            self._topic_agent[topics.dlq] = (agent, "dlq")
            scores = scores_topic(agent, self.options.prefix)
            self._topic_agent[scores] = (agent, "scores")
            wanted += [topics.events, topics.dlq, scores]
        since = int((time.time() - self.options.history_s) * 1000)
        for topic in follower.follow(wanted, since, self._resume):
            agent, _ = self._topic_agent[topic]
            self.state.add_agent(agent)
            log.info("following %s", topic)

    def _fold(self, records: list[TopicRecord]) -> bool:
        changed = False
        for record in records:
            self._resume[(record.topic, record.partition)] = record.offset + 1
            agent, kind = self._topic_agent.get(record.topic, ("", ""))
            if kind == "dlq":
                self.state.add_dead_letter(
                    agent,
                    record.partition,
                    record.offset,
                    record.ts_ms,
                    record.key,
                    record.value,
                    record.headers,
                )
                changed = True
            elif kind == "scores":
                changed = self._score(agent, record) or changed
            elif kind == "events" and record.value is not None:
                try:
                    event = decode_event(record.value, record.headers, self._codec)
                except MalformedRecordError as exc:
                    self.undecodable += 1
                    self.state.touch()
                    changed = True
                    log.warning(
                        "%s[%d]@%d is not an event: %s",
                        record.topic,
                        record.partition,
                        record.offset,
                        exc,
                    )
                    continue
                try:
                    changed = self.state.apply(event) is not None or changed
                except Exception as exc:  # one odd event must not stop the whole page
                    self.unshowable += 1
                    self.state.touch()
                    changed = True
                    log.warning(
                        "%s[%d]@%d: cannot show %s of turn %s: %r",
                        record.topic,
                        record.partition,
                        record.offset,
                        event.type,
                        event.turn_id,
                        exc,
                    )
        return changed

    def _score(self, agent: str, record: TopicRecord) -> bool:
        """Keep a score; the scored turn's page is sent again with it."""
        try:
            score = parse_score(record.value)
        except MalformedRecordError as exc:
            self.undecodable += 1
            log.warning(
                "%s[%d]@%d is not a score: %s", record.topic, record.partition, record.offset, exc
            )
            self.state.touch()
            return True
        if not self.scores.add(agent, score):
            return False
        self.state.touch()
        turn = self.state.find(agent, score.turn_id)
        if turn is not None:
            turn.version = self.state.version
        return True

    async def load_turn(self, agent: str, turn_id: str) -> TurnView | None:
        """Read one turn's events by id from its partition (a turn the feed does not hold,
        holds only partly, or holds with values stored by reference, read back here);
        None when the events topic has none."""
        events = await asyncio.to_thread(self._read_turn, agent, turn_id)
        turn = turn_from_events(agent, turn_id, events)
        if turn is not None:
            self.state.replace(turn)
            await self._notify()
        return turn

    def _read_turn(self, agent: str, turn_id: str) -> list[Event]:
        """The turn's events with their references resolved (blocking)."""
        topic = AgentTopics.for_agent(agent, self.options.prefix).events
        records = read_key(
            self.options.bootstrap_servers,
            topic,
            turn_id,
            client_id=f"pyrula-ui-load-{uuid.uuid4().hex[:8]}",
            kafka_config=self.options.kafka_config,
        )
        events = []
        for record in records:
            assert record.value is not None  # read_key leaves tombstones out
            try:
                event = decode_event(record.value, record.headers, self._codec)
            except MalformedRecordError:
                self.undecodable += 1
                continue
            if has_refs(event.data):
                event = replace(event, data=self.payloads.resolve(event.data))
            events.append(event)
        return events
