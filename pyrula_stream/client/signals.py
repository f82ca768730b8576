"""``KafkaAgentClient.signal`` and the answers to questions: the client's half of a person
in the loop.

A signal is produced to ``<agent>.signals`` and an answer (``resume``, ``approve``,
``reject``) to ``<agent>.answers``, keyed like the turn's request, so it lands on the
turn's partition (``signals.py``). The two topics are apart so that ACLs can tell who asks
from who decides: clients write signals, only reviewers write answers. The sender then
learns what the worker that owns that partition decided: the signal's record in
``<agent>.journal`` (taken) or its dead letter in ``<agent>.dlq`` (refused, with the
reason), both read from where they ended before the send. ``SignalRefused`` reports a
refusal; a decision not seen within the timeout (no worker running) leaves the signal on
its topic, decided when one starts. A sender that may not read the journal and dead
letters (the client role) does not wait: its receipt says no decision was seen.
"""

from __future__ import annotations

import asyncio
import getpass
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from pyrula_stream.agent.definition import AgentTopics
from pyrula_stream.client.outgoing_caps import check_signal
from pyrula_stream.client.parts import ClientParts
from pyrula_stream.errors import (
    KafkaAuthorizationError,
    MalformedRecordError,
    SignalRefused,
    UnknownTopicError,
)
from pyrula_stream.kafka.consumers import read_topic, reader_group_id
from pyrula_stream.kafka.offsets import ConsumedRecord
from pyrula_stream.kafka.turn_lookup import TurnLookup
from pyrula_stream.wire.journal_keys import PARK, SIGNAL, TERMINAL, signal_key
from pyrula_stream.wire.serde import decode_journal_entry
from pyrula_stream.wire.signals import (
    SIGNAL_ID_HEADER,
    Signal,
    new_signal,
    refusal_reason,
    signal_record,
)

APPROVE = "approve"
REJECT = "reject"
ORIGINAL_SIGNAL_ID = f"pyrula.original.{SIGNAL_ID_HEADER}"
"""The signal id as its dead letter keeps it."""
POLL_S = 0.1


@dataclass(frozen=True)
class SignalReceipt:
    """What ``signal`` returns: the signal as sent and whether its turn's worker took it
    (``False``: no decision seen in time; it stays on the topic until one is made).
    ``watched`` is ``False`` when this principal may not read the decision (no READ on
    the journal and dead letters, as the client role): it was sent, not waited for."""

    signal: Signal
    accepted: bool
    watched: bool = True


class SignalsClient(ClientParts):
    """The signal and answer methods of ``KafkaAgentClient`` (a mixin: it supplies the
    connection settings and the producer)."""

    def _sender(self, sender: str | None) -> str:
        """Who is answering: the given name, else the client's principal (its SASL user),
        else the local user."""
        if sender:
            return sender
        user = self.kafka_config.get("sasl.username")
        return str(user) if user else getpass.getuser()

    async def signal(
        self,
        agent: str,
        turn_id: str,
        name: str,
        payload: Any = None,
        *,
        key: str | None = None,
        sender: str | None = None,
        wait: float | None = None,
    ) -> SignalReceipt:
        """Send the signal ``name`` (with a JSON ``payload``) to a turn; a wait for that
        name takes it, now or when the turn gets there. Raises ``SignalRefused`` when the
        turn is unknown on its partition or has ended. ``key`` is the request's key when
        it is not the turn id (a thread's turn: its thread id; turns this client
        submitted need none). ``wait`` bounds the wait for the worker's decision
        (default: the client's ``timeout``)."""
        signal = new_signal(turn_id, name, payload, sender=self._sender(sender))
        return await self._send(agent, signal, key, wait)

    async def resume(
        self,
        agent: str,
        turn_id: str,
        key: str,
        answer: Any,
        *,
        reason: str | None = None,
        turn_key: str | None = None,
        sender: str | None = None,
        wait: float | None = None,
    ) -> SignalReceipt:
        """Answer the question ``key`` a turn parked on (``pending`` lists them):
        ``"approve"`` runs a gated tool, anything else denies it; an interrupt gets
        ``answer`` back. Raises ``SignalRefused`` (``already_answered``, ``ended``,
        ``unknown``) when the answer changes nothing. ``turn_key``: the request's key
        when it is not the turn id (a thread's turn: its thread id)."""
        signal = new_signal(
            turn_id,
            key,
            {"answer": answer, "reason": reason},
            sender=self._sender(sender),
            answer=True,
        )
        return await self._send(agent, signal, turn_key, wait)

    async def approve(
        self, agent: str, turn_id: str, key: str, *, reason: str | None = None, **kw: Any
    ) -> SignalReceipt:
        """``resume(..., "approve")``: the gated call runs."""
        return await self.resume(agent, turn_id, key, APPROVE, reason=reason, **kw)

    async def reject(
        self, agent: str, turn_id: str, key: str, *, reason: str | None = None, **kw: Any
    ) -> SignalReceipt:
        """``resume(..., "reject")``: the gated call does not run; the model reads why."""
        return await self.resume(agent, turn_id, key, REJECT, reason=reason, **kw)

    async def pending(self, agent: str) -> list[PendingQuestion]:
        """The open questions of the agent's parked turns, oldest first: what each turn
        asks (tool and arguments, or the interrupt's question) and since when."""
        topic = AgentTopics.for_agent(agent, self.prefix).journal
        try:
            records = await asyncio.to_thread(
                read_topic,
                self.bootstrap_servers,
                topic,
                timeout_s=self.timeout,
                client_id=f"pyrula-pending-{uuid.uuid4().hex[:8]}",
                kafka_config=self.kafka_config,
                group_id=reader_group_id(self.prefix, agent),
            )
        except UnknownTopicError as exc:
            raise self._no_topic(agent, exc) from None
        return open_questions(agent, records)

    async def _send(
        self, agent: str, signal: Signal, key: str | None, wait: float | None
    ) -> SignalReceipt:
        """Produce the signal (an answer to the answers topic, any other to the signals
        topic) and wait for its decision where this principal may read it. An id past
        its cap (``wire/caps.py``) raises ``OverCapError`` and nothing is sent."""
        topics = AgentTopics.for_agent(agent, self.prefix)
        key = key or self._submitted.get((agent, signal.turn_id)) or signal.turn_id
        check_signal(signal, key)
        lookup = TurnLookup(
            self.bootstrap_servers,
            client_id=f"pyrula-signal-{uuid.uuid4().hex[:8]}",
            group_id=reader_group_id(self.prefix, agent),
            kafka_config=self.kafka_config,
            timeout_s=self.timeout,
        )
        try:
            try:
                starts: dict[tuple[str, int], int] | None = await asyncio.to_thread(
                    _starts, lookup, topics, key
                )
            except KafkaAuthorizationError:
                starts = None  # the client role reads no journal: send, do not wait
            topic = topics.answers if signal.answer else topics.signals
            record = signal_record(topic, key, signal)
            try:
                await self._get_producer().send(
                    record.topic, record.key, record.value, list(record.headers)
                )
            except UnknownTopicError as exc:
                raise self._no_topic(agent, exc) from None
            budget = self.timeout if wait is None else wait
            accepted = starts is not None and await asyncio.to_thread(
                _decision, lookup, starts, signal, budget
            )
        finally:
            await asyncio.to_thread(lookup.close)
        return SignalReceipt(signal, accepted, watched=starts is not None)


@dataclass(frozen=True)
class PendingQuestion:
    """One open question: the turn, the key to answer, what it asks, and since when."""

    agent: str
    turn_id: str
    key: str
    reason: str
    asked_ms: int
    deadline_ms: int | None
    tool_name: str | None
    tool_input: dict[str, Any] | None
    question: Any

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def open_questions(agent: str, records: list[ConsumedRecord]) -> list[PendingQuestion]:
    """The questions of parked turns in a journal read to its end, without an answer."""
    latest: dict[str, bytes | None] = {}
    for r in records:
        latest[r.key] = r.value
    answered: set[tuple[str, str]] = set()
    parks: dict[str, dict[str, Any]] = {}
    ended: set[str] = set()
    for key, value in latest.items():
        turn_id, _, suffix = key.rpartition("/")
        if value is None or not turn_id:
            continue
        if suffix == TERMINAL:
            ended.add(turn_id)
            continue
        if suffix != PARK and not suffix.startswith(SIGNAL):
            continue
        try:
            data = decode_journal_entry(value, {}).data
        except MalformedRecordError:
            continue
        if suffix == PARK and isinstance(data.get("question"), dict):
            parks[turn_id] = data["question"]
        elif data.get("answer"):
            answered.add((turn_id, str(data.get("name"))))
    found = [
        PendingQuestion(
            agent,
            turn_id,
            str(q.get("key")),
            str(q.get("reason")),
            int(q.get("asked_ms") or 0),
            q.get("deadline_ms"),
            q.get("tool_name"),
            q.get("tool_input"),
            q.get("question"),
        )
        for turn_id, q in parks.items()
        if turn_id not in ended and (turn_id, str(q.get("key"))) not in answered
    ]
    return sorted(found, key=lambda p: (p.asked_ms, p.turn_id))


def _starts(lookup: TurnLookup, topics: AgentTopics, key: str) -> dict[tuple[str, int], int]:
    """Where the journal and dead-letter partitions of ``key`` end before the send."""
    out: dict[tuple[str, int], int] = {}
    for topic in (topics.journal, topics.dlq):
        partition = lookup.partition_of(topic, key)
        if partition is None:
            raise UnknownTopicError(f"no topic {topic}", topic=topic)
        out[(topic, partition)] = lookup.end_offset(topic, partition)
    return out


def _decision(
    lookup: TurnLookup, starts: dict[tuple[str, int], int], signal: Signal, budget: float
) -> bool:
    """``True`` once the signal's journal record is read, ``SignalRefused`` once its dead
    letter is; ``False`` when neither came within ``budget`` seconds."""
    journal_key = signal_key(signal.turn_id, signal.signal_id)
    positions = dict(starts)
    give_up = time.monotonic() + budget
    while True:
        for (topic, partition), start in positions.items():
            records = lookup.read(topic, partition, lambda r: True, start=start)
            for r in records:
                if r.key == journal_key and r.value is not None:
                    return True
                if r.headers.get(ORIGINAL_SIGNAL_ID) == signal.signal_id:
                    why = r.headers.get("pyrula.dlq.reason", "signal refused")
                    raise SignalRefused(
                        why, reason=refusal_reason(why), turn_id=signal.turn_id, name=signal.name
                    )
            if records:
                positions[(topic, partition)] = records[-1].offset + 1
        if time.monotonic() >= give_up:
            return False
        time.sleep(POLL_S)
