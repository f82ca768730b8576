"""The records of ``<agent>.outcomes``: the waits of turns and the early events of
deferred outcomes, keyed so both sides of one join land on one partition.

A wait's key names (evaluator, version, join key, turn); an event's names (evaluator,
join key, where the event was read). Both go to the partition of (evaluator, join key),
so the member that owns it sees every wait and event of the join, and rebuilds them from
the compacted topic when it takes the partition over. A wait is tombstoned when it is
scored (joined or timed out) and an event when its window has passed, each in the
transaction that decided it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from pyrula_stream.errors import MalformedRecordError
from pyrula_stream.wire.records import JSON_CONTENT_TYPE, OutRecord

WAIT = "w"
EVENT = "e"


def join_partition(evaluator: str, join_key: str, partitions: int) -> int:
    """The outcomes partition of one join (stable across processes and releases)."""
    digest = hashlib.sha256(f"{evaluator}\x00{join_key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % partitions


@dataclass(frozen=True, slots=True)
class Wait:
    """A sampled turn waiting for its business event."""

    evaluator: str
    version: str
    join_key: str
    turn: dict[str, Any]
    deadline_ms: int
    """The latest event timestamp that still joins (the turn's finish plus the window)."""
    fire_ms: int
    """When the stream declares the timeout (the deadline plus the grace)."""
    earliest_ms: int = 0
    """The earliest event timestamp that joins (the turn's finish less the window)."""

    def meets(self, event: Early) -> bool:
        """Whether ``event`` is of this join and within the turn's window."""
        return (
            event.evaluator == self.evaluator
            and event.join_key == self.join_key
            and self.earliest_ms <= event.ts_ms <= self.deadline_ms
        )

    @property
    def key(self) -> str:
        return json.dumps([WAIT, self.evaluator, self.version, self.join_key, self.turn["turn_id"]])

    def data(self) -> dict[str, Any]:
        return {
            "kind": WAIT,
            "evaluator": self.evaluator,
            "version": self.version,
            "join_key": self.join_key,
            "turn": self.turn,
            "deadline_ms": self.deadline_ms,
            "fire_ms": self.fire_ms,
            "earliest_ms": self.earliest_ms,
        }


@dataclass(frozen=True, slots=True)
class Early:
    """A business event kept for the turns that may still name its key."""

    evaluator: str
    join_key: str
    event: dict[str, Any]
    expire_ms: int

    @property
    def ts_ms(self) -> int:
        return int(self.event.get("ts_ms", 0))

    @property
    def key(self) -> str:
        e = self.event
        where = f"{e.get('topic')}/{e.get('partition')}/{e.get('offset')}"
        return json.dumps([EVENT, self.evaluator, self.join_key, where])

    def data(self) -> dict[str, Any]:
        return {
            "kind": EVENT,
            "evaluator": self.evaluator,
            "join_key": self.join_key,
            "event": self.event,
            "expire_ms": self.expire_ms,
        }


def parse(value: bytes) -> Wait | Early:
    """A record of ``<agent>.outcomes``; ``MalformedRecordError`` when it is not one."""
    try:
        data = json.loads(value)
        if data["kind"] == WAIT:
            return Wait(
                str(data["evaluator"]),
                str(data["version"]),
                str(data["join_key"]),
                dict(data["turn"]),
                int(data["deadline_ms"]),
                int(data["fire_ms"]),
                int(data.get("earliest_ms", 0)),
            )
        if data["kind"] == EVENT:
            return Early(
                str(data["evaluator"]),
                str(data["join_key"]),
                dict(data["event"]),
                int(data["expire_ms"]),
            )
    except (ValueError, KeyError, TypeError) as exc:
        raise MalformedRecordError(f"outcomes record: {exc!r}") from None
    raise MalformedRecordError(f"outcomes record: unknown kind {data.get('kind')!r}")


def record(topic: str, item: Wait | Early, partitions: int) -> OutRecord:
    """``item`` on its join's partition."""
    return OutRecord(
        topic,
        item.key.encode(),
        json.dumps(item.data(), separators=(",", ":")).encode(),
        [JSON_CONTENT_TYPE],
        join_partition(item.evaluator, item.join_key, partitions),
    )


def deleted(topic: str, key: str, partition: int) -> OutRecord:
    """The tombstone of a decided wait or an expired event."""
    return OutRecord(topic, key.encode(), None, [], partition)
