"""Streams opened when a turn is submitted, kept for the events request that follows.

A browser submits a turn, then opens its ``events_url``. Subscribed at submit time, before
the turn's request is produced, the stream needs no lookup of where the turn's events
start and no read of older records: it follows the shared reader from where it is. The
events request of the same process takes it over; a request that lands on another gateway
process (or comes after ``keep_s``) reads from ``since_ms`` instead. A kept stream holds
at most ``QUEUE_RECORDS`` events (beyond that it reads the rest from Kafka when taken).
"""

from __future__ import annotations

import time
from collections import OrderedDict

from pyrula_stream.client.event_reader import TurnStream

KEEP_S = 10.0
"""How long a submitted turn's stream waits for its events request."""
MAX_KEPT = 10_000
"""Streams kept at most (the oldest are dropped first)."""


class PendingStreams:
    """Streams of submitted turns by ``(agent, turn_id)``, until taken or dropped."""

    def __init__(self, *, keep_s: float = KEEP_S, limit: int = MAX_KEPT) -> None:
        self.keep_s = keep_s
        self.limit = limit
        self._kept: OrderedDict[tuple[str, str], tuple[float, TurnStream]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, agent: str, turn_id: str, stream: TurnStream) -> None:
        self._drop_old()
        old = self._kept.pop((agent, turn_id), None)
        if old is not None:
            old[1].drop()
        self._kept[(agent, turn_id)] = (time.monotonic(), stream)
        while len(self._kept) > self.limit:
            self._kept.popitem(last=False)[1][1].drop()

    def take(self, agent: str, turn_id: str) -> TurnStream | None:
        """The turn's kept stream (once), ``None`` when there is none."""
        self._drop_old()
        found = self._kept.pop((agent, turn_id), None)
        return None if found is None else found[1]

    def drop(self, agent: str, turn_id: str) -> None:
        found = self._kept.pop((agent, turn_id), None)
        if found is not None:
            found[1].drop()

    def _drop_old(self) -> None:
        oldest = time.monotonic() - self.keep_s
        while self._kept:
            at, stream = next(iter(self._kept.values()))
            if at > oldest:
                return
            self._kept.popitem(last=False)
            stream.drop()

    def close(self) -> None:
        while self._kept:
            self._kept.popitem(last=False)[1][1].drop()
