"""Batch-lane records of the journal: a partition's batches and each call's outcome.

A call waiting in a batch is named by a ``custom_id`` derived from its turn, its step and
its input, so a replay of the turn names the same call and the provider's result finds
its turn. A batch is a ``batch/<tag>`` record of the partition that owns every one of its
calls' turns: written before the batch is submitted (the provider's id empty), again with
the provider's id once it answers, and tombstoned in the transaction that journals its
calls' outcomes (``turn_id/batch:<custom id>``), so an outcome is journaled exactly once.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass
from typing import Any

from pyrula_stream.errors import MalformedRecordError
from pyrula_stream.wire import serde
from pyrula_stream.wire.journal_keys import BATCH_PREFIX, batch_key, batch_result_key
from pyrula_stream.wire.records import OutRecord, tombstone, wire_record
from pyrula_stream.wire.serde import JournalEntry

BATCH_KIND = "batch"
"""Journal kind of a ``batch/<tag>`` record."""
BATCH_RESULT_KIND = "batch_result"
"""Journal kind of a call's outcome."""


def custom_id_for(turn_id: str, step: int, input_hash: str) -> str:
    """The call's name at the provider: 41 characters of ``[a-z0-9]``, within both
    providers' rule for a custom id (``^[a-zA-Z0-9_-]{1,64}$``), the same on every replay."""
    digest = hashlib.sha256(f"{turn_id}|{step}|{input_hash}".encode()).hexdigest()
    return "c" + digest[:40]


def new_tag() -> str:
    """A batch's own id, journaled before it is submitted: 21 characters of
    ``[a-z0-9]``, so ``<tag>-<custom id>`` (what the provider is given, ``provider_id``)
    fits the providers' 64."""
    return "p" + uuid.uuid4().hex[:20]


def provider_id(tag: str, custom_id: str) -> str:
    """The id a call carries at the provider: its batch's tag, then its own custom id
    (the tag rides in every id: Anthropic's batches keep nothing else a lookup can read,
    and a call sent in two batches shows its custom id twice in the provider's log)."""
    return f"{tag}-{custom_id}"


def call_id(provider_custom_id: str) -> str:
    """The lane's custom id in the id ``provider_id`` made."""
    return provider_custom_id.partition("-")[2]


def is_batch_key(key: str) -> bool:
    return key.startswith(BATCH_PREFIX)


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """One batch of a partition's calls: ``calls`` pairs each custom id with its turn."""

    tag: str
    provider: str
    model: str
    calls: tuple[tuple[str, str], ...]
    batch_id: str | None = None
    created_ms: int = 0
    submitted_ms: int | None = None

    def data(self) -> dict[str, Any]:
        return {
            "tag": self.tag,
            "provider": self.provider,
            "model": self.model,
            "calls": [list(c) for c in self.calls],
            "batch_id": self.batch_id,
            "created_ms": self.created_ms,
            "submitted_ms": self.submitted_ms,
        }

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> BatchRecord:
        try:
            calls = tuple((str(c), str(t)) for c, t in data["calls"])
            return cls(
                str(data["tag"]),
                str(data["provider"]),
                str(data["model"]),
                calls,
                None if data.get("batch_id") is None else str(data["batch_id"]),
                int(data.get("created_ms") or 0),
                None if data.get("submitted_ms") is None else int(data["submitted_ms"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise MalformedRecordError(f"batch record unreadable: {exc!r}") from None

    def record(self, topic: str, partition: int) -> OutRecord:
        entry = JournalEntry(
            "", -1, BATCH_KIND, self.tag, data=self.data(), ts_ms=int(time.time() * 1000)
        )
        return wire_record(
            topic,
            batch_key(self.tag).encode(),
            serde.encode("journal_entry", entry),
            "journal_entry",
            partition=partition,
        )

    def tombstone(self, topic: str, partition: int) -> OutRecord:
        return tombstone(topic, batch_key(self.tag), partition)


def result_record(
    topic: str, partition: int, turn_id: str, custom_id: str, data: dict[str, Any]
) -> OutRecord:
    """A call's outcome (``{"response": ...}`` or ``{"error": ...}``) in its turn's journal."""
    entry = JournalEntry(
        turn_id, -1, BATCH_RESULT_KIND, custom_id, data=data, ts_ms=int(time.time() * 1000)
    )
    return wire_record(
        topic,
        batch_result_key(turn_id, custom_id).encode(),
        serde.encode("journal_entry", entry),
        "journal_entry",
        partition=partition,
    )
