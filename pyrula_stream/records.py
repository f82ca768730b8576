"""An outgoing Kafka record, built by the turn and written by the group committer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class OutRecord:
    topic: str
    key: bytes
    value: bytes | None
    headers: list[tuple[str, bytes]]
    partition: int | None = None

    @property
    def size(self) -> int:
        return (
            len(self.key) + len(self.value or b"") + sum(len(k) + len(v) for k, v in self.headers)
        )
