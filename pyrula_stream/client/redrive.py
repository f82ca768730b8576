"""Redriving dead letters: an operator sends chosen ones back to their source topic, once.

A dead letter on ``<agent>.dlq`` keeps the record it stands for: its key and value, its
headers as ``pyrula.original.<name>``, and where it was read in ``pyrula.dlq.source``
(``topic[partition]@offset``). Once the cause is fixed (a limit raised, a version
deployed, a tool repaired), ``redrive`` produces that record again to the same topic
and partition, with ``pyrula.redrive.of`` naming the dead letter.

Each redrive is noted on the compacted ``<agent>.dlq-redrives`` topic, keyed by the dead
letter's offset (who, when, where to). The note and the redriven record are written in
one transaction, under one transactional id per agent, after that id's earlier producers
are fenced and the notes read: a dead letter already noted is skipped, so the command
run twice (or twice at once) redrives it once, and a crash between the two writes
leaves neither. A quarantined poison record (``poison_quarantine``, written without a
source) goes back to the agent's turns topic the same way.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pyrula_stream.agent.definition import AgentTopics
from pyrula_stream.errors import ErrorCode, MalformedRecordError, UnknownTopicError, UserError
from pyrula_stream.kafka.acls import redrive_transactional_id
from pyrula_stream.kafka.admin import DEFAULT_PREFIX, TopicSpec, agent_topic_specs, apply_topics
from pyrula_stream.kafka.consumers import reader_group_id
from pyrula_stream.kafka.once import OnceWriter, RawRecord, read_raw
from pyrula_stream.wire import guard
from pyrula_stream.wire.fitting import TRIMMED_HEADER
from pyrula_stream.wire.records import JSON_CONTENT_TYPE, OutRecord

ORIGINAL_PREFIX = "pyrula.original."
REDRIVE_OF_HEADER = "pyrula.redrive.of"
"""On a redriven record: the dead letter it came from, ``<dlq>[partition]@offset``."""
REDRIVE_BY_HEADER = "pyrula.redrive.by"
"""On a redriven record: who redrove it."""

_SOURCE = re.compile(r"^(?P<topic>[^\[\]]+)\[(?P<partition>\d+)\]@(?P<offset>\d+)$")

Outcome = Literal["redriven", "already_redriven", "not_redrivable"]


@dataclass(frozen=True, slots=True)
class RedriveNote:
    """What ``<agent>.dlq-redrives`` holds for one redriven dead letter."""

    dlq_offset: int
    by: str
    at_ms: int
    topic: str
    partition: int | None

    def as_json(self) -> dict[str, Any]:
        return {
            "dlq_offset": self.dlq_offset,
            "by": self.by,
            "at_ms": self.at_ms,
            "topic": self.topic,
            "partition": self.partition,
        }

    @classmethod
    def parse(cls, value: bytes | None) -> RedriveNote | None:
        """The note a record holds, or ``None`` (a tombstone, or bytes we did not write)."""
        try:
            body = guard.loads_object(value, "a redrive note")
            partition = body.get("partition")
            return cls(
                int(body["dlq_offset"]),
                str(body["by"]),
                int(body["at_ms"]),
                str(body["topic"]),
                None if partition is None else int(partition),
            )
        except (MalformedRecordError, ValueError, TypeError, KeyError):
            return None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One record of ``<agent>.dlq``, with the record it stands for and its redrive."""

    offset: int
    ts_ms: int
    code: str
    reason: str
    worker: str
    source: str | None
    key: bytes | None = field(repr=False)
    value: bytes | None = field(repr=False)
    original_headers: tuple[tuple[str, bytes], ...] = field(repr=False)
    """The record's own headers: never in a repr (a producer may put a credential there)."""
    redrive: RedriveNote | None = None
    trimmed: str | None = None
    """What was cut to fit the letter in a record (``pyrula.dlq.trimmed``), if anything."""

    @classmethod
    def from_record(cls, record: RawRecord, redrive: RedriveNote | None) -> DeadLetter:
        own = {k: v.decode("utf-8", "replace") for k, v in record.headers}
        return cls(
            offset=record.offset,
            ts_ms=record.ts_ms,
            code=own.get("pyrula.dlq.code", ""),
            reason=own.get("pyrula.dlq.reason", ""),
            worker=own.get("pyrula.dlq.worker", ""),
            source=own.get("pyrula.dlq.source"),
            key=record.key or None,
            value=record.value,
            original_headers=tuple(
                (k.removeprefix(ORIGINAL_PREFIX), v)
                for k, v in record.headers
                if k.startswith(ORIGINAL_PREFIX)
            ),
            redrive=redrive,
            trimmed=own.get(TRIMMED_HEADER),
        )

    def target(self, topics: AgentTopics) -> tuple[str, int | None] | str:
        """Where a redrive sends the record, ``(topic, partition)``; or why it cannot."""
        if self.value is None:
            return "the dead letter kept no value (the broker refused the record)"
        if self.trimmed is not None:
            return f"the dead letter holds a cut copy of the record ({self.trimmed})"
        if self.source is None:
            if self.code == ErrorCode.POISON_QUARANTINE:
                return topics.turns, None  # the turn's key picks its partition again
            return "the dead letter names no source topic"
        found = _SOURCE.match(self.source)
        if found is None:
            return f"source {self.source!r} is not topic[partition]@offset"
        topic = found["topic"]
        base = topics.turns.removesuffix("turns")
        if not topic.startswith(base) or topic in (topics.dlq, topics.dlq_redrives):
            return f"source {topic} is not a topic this agent reads"
        return topic, int(found["partition"])

    def matches(self, offsets: Collection[int], reason: str | None, code: str | None) -> bool:
        """Chosen by every selector given (offsets, a reason substring, a code)."""
        return (
            (not offsets or self.offset in offsets)
            and (reason is None or reason.lower() in self.reason.lower())
            and (code is None or code == self.code)
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "offset": self.offset,
            "source": self.source,
            "code": self.code,
            "reason": self.reason,
            "ts_ms": self.ts_ms,
            "worker": self.worker,
            "redriven": None if self.redrive is None else self.redrive.as_json(),
        }


@dataclass(frozen=True, slots=True)
class RedriveResult:
    """What ``redrive`` did with one chosen dead letter."""

    offset: int
    outcome: Outcome
    detail: str
    topic: str | None = None
    partition: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "offset": self.offset,
            "outcome": self.outcome,
            "detail": self.detail,
            "topic": self.topic,
            "partition": self.partition,
        }


def redrive_topic_spec(agent: str, prefix: str = DEFAULT_PREFIX) -> TopicSpec:
    """The spec of ``<agent>.dlq-redrives`` (``topics/agent.yaml``): created by ``topics
    apply`` and by the first redrive, never by workers, which do not use it."""
    name = AgentTopics.for_agent(agent, prefix).dlq_redrives
    (spec,) = [
        s for s in agent_topic_specs(agent, prefix=prefix, dlq_redrives=True) if s.name == name
    ]
    return spec


class DeadLetters:
    """An agent's dead letters: list them, and redrive chosen ones (blocking calls)."""

    def __init__(
        self,
        bootstrap_servers: str,
        agent: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        kafka_config: Mapping[str, Any] | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.agent = agent
        self.prefix = prefix
        self.topics = AgentTopics.for_agent(agent, prefix)
        self.kafka_config = kafka_config
        self.timeout_s = timeout_s

    def _read(self, topic: str) -> list[RawRecord]:
        try:
            return read_raw(
                self.bootstrap_servers,
                topic,
                timeout_s=self.timeout_s,
                kafka_config=self.kafka_config,
                group_id=reader_group_id(self.prefix, self.agent),
            )
        except UnknownTopicError:
            raise UnknownTopicError(
                f"no topic {topic}: is {self.agent!r} (prefix {self.prefix!r}) the agent? "
                "`pyrula-stream topics apply` (or a starting worker) creates its topics",
                topic=topic,
            ) from None

    def notes(self) -> dict[int, RedriveNote]:
        """Every redrive so far, by dead-letter offset (the latest note of each); none
        before the first redrive created their topic."""
        found: dict[int, RedriveNote] = {}
        try:
            records = self._read(self.topics.dlq_redrives)
        except UnknownTopicError:
            return found
        for record in records:
            note = RedriveNote.parse(record.value)
            if note is not None:
                found[note.dlq_offset] = note
        return found

    def find(
        self,
        *,
        offsets: Collection[int] = (),
        reason: str | None = None,
        code: str | None = None,
    ) -> list[DeadLetter]:
        """The dead letters retained now that match every selector given, oldest first."""
        return self._letters(self.notes(), offsets, reason, code)

    def _letters(
        self,
        notes: Mapping[int, RedriveNote],
        offsets: Collection[int],
        reason: str | None,
        code: str | None,
    ) -> list[DeadLetter]:
        letters = (
            DeadLetter.from_record(r, notes.get(r.offset))
            for r in self._read(self.topics.dlq)
            if r.partition == 0  # <agent>.dlq has one partition
        )
        return [d for d in letters if d.matches(offsets, reason, code)]

    def redrive(
        self,
        *,
        by: str,
        offsets: Collection[int] = (),
        reason: str | None = None,
        code: str | None = None,
    ) -> list[RedriveResult]:
        """Produce each chosen dead letter's record to its source again, unless a note says
        it was; the records and their notes in one transaction."""
        if not offsets and reason is None and code is None:
            raise UserError("choose dead letters to redrive: --offset, --reason or --code")
        if not by.strip():
            raise UserError("say who redrives (--by)")
        apply_topics(
            self.bootstrap_servers,
            [redrive_topic_spec(self.agent, self.prefix)],
            self.timeout_s,
            kafka_config=self.kafka_config,
        )  # creates the notes topic on the first redrive
        writer = OnceWriter(
            self.bootstrap_servers,
            redrive_transactional_id(self.prefix, self.agent),
            kafka_config=self.kafka_config,
        )
        try:
            writer.start()  # fences an earlier run: the notes read next are all there are
            letters = self._letters(self.notes(), offsets, reason, code)
            results, records = self._plan(letters, by)
            missing = set(offsets) - {d.offset for d in letters}
            results += [
                RedriveResult(o, "not_redrivable", "no dead letter at this offset matches")
                for o in sorted(missing)
            ]
            if records:
                writer.write(records)
        finally:
            writer.close()
        return sorted(results, key=lambda r: r.offset)

    def _plan(
        self, letters: Iterable[DeadLetter], by: str
    ) -> tuple[list[RedriveResult], list[OutRecord]]:
        results: list[RedriveResult] = []
        records: list[OutRecord] = []
        now = int(time.time() * 1000)
        for letter in letters:
            if letter.redrive is not None:
                note = letter.redrive
                results.append(
                    RedriveResult(
                        letter.offset,
                        "already_redriven",
                        f"redriven by {note.by} at {note.at_ms}",
                        note.topic,
                        note.partition,
                    )
                )
                continue
            target = letter.target(self.topics)
            if isinstance(target, str):
                results.append(RedriveResult(letter.offset, "not_redrivable", target))
                continue
            topic, partition = target
            note = RedriveNote(letter.offset, by, now, topic, partition)
            records += [self._copy(letter, topic, partition, by), self._note(note)]
            results.append(
                RedriveResult(letter.offset, "redriven", f"to {topic}", topic, partition)
            )
        return results, records

    def _copy(self, letter: DeadLetter, topic: str, partition: int | None, by: str) -> OutRecord:
        kept = [
            (k, v)
            for k, v in letter.original_headers
            if k not in (REDRIVE_OF_HEADER, REDRIVE_BY_HEADER)
        ]
        of = f"{self.topics.dlq}[0]@{letter.offset}"
        headers = [*kept, (REDRIVE_OF_HEADER, of.encode()), (REDRIVE_BY_HEADER, by.encode())]
        return OutRecord(topic, letter.key or b"", letter.value, headers, partition)

    def _note(self, note: RedriveNote) -> OutRecord:
        value = json.dumps(note.as_json()).encode()
        return OutRecord(
            self.topics.dlq_redrives,
            str(note.dlq_offset).encode(),
            value,
            [JSON_CONTENT_TYPE],
            0,
            compacted=True,
        )
