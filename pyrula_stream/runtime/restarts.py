"""Session restarts: a worker whose sessions keep ending on the same input backs off.

A session ends when the worker is fenced, loses its group session, or ends it on purpose
(``SessionLost``: a rebalance callback failed, a reply could not be decided). Most such
endings are one-offs, and the worker rejoins at once. When they repeat while a partition
stays where its restore found it (the same committed input offset), the worker is
restarting on the same input: each further restart waits longer (``restart_backoff_s``
doubled per repeat, up to ``restart_backoff_max_s``), and the partition's next restore
runs it carefully (``runtime/poison.py``), so the record running alone when the session
ends again is charged like a crash and quarantined after ``max_retries`` charges.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from pyrula_stream.runtime.options import PoisonOptions

REPEAT_WINDOW_S = 300.0
"""A session ending longer than this after the one before is not a repeat of it."""

NO_PARTITION = -1
"""Where a session stood that ended before any partition was restored (a failing
restore): its endings repeat too."""


@dataclass(frozen=True, slots=True)
class _Standing:
    committed: int | None
    repeats: int
    at: float


class SessionRestarts:
    """Counts, per partition, the sessions that ended while it stood at one offset."""

    def __init__(self, options: PoisonOptions) -> None:
        self._options = options
        self._by_partition: dict[int, _Standing] = {}

    def ended(self, standing: Mapping[int, int | None], now: float | None = None) -> int:
        """A session ended with these partitions restored at these committed offsets;
        the number of sessions in a row that ended on the same input (1: not a repeat)."""
        now = time.monotonic() if now is None else now
        positions = dict(standing) or {NO_PARTITION: None}
        worst = 1
        for partition, committed in positions.items():
            before = self._by_partition.get(partition)
            repeat = (
                before is not None
                and before.committed == committed
                and now - before.at <= REPEAT_WINDOW_S
            )
            repeats = before.repeats + 1 if repeat and before is not None else 1
            self._by_partition[partition] = _Standing(committed, repeats, now)
            worst = max(worst, repeats)
        return worst

    def repeats(self, partition: int, committed: int | None) -> int:
        """How many sessions in a row ended with ``partition`` restored at ``committed``."""
        before = self._by_partition.get(partition)
        return before.repeats if before is not None and before.committed == committed else 0

    def delay_s(self, repeats: int) -> float:
        """How long to wait before rejoining after the ``repeats``-th ending in a row."""
        if repeats <= 1:
            return 0.0
        base, cap = self._options.restart_backoff_s, self._options.restart_backoff_max_s
        return float(min(cap, base * 2 ** (repeats - 2)))
