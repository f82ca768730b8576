"""One outcomes partition's joins: the waits and early events it holds, and what an
arriving record or the clock decides.

A wait joins the earliest kept event of its (evaluator, join key) whose timestamp is
within its window (the turn's finish, give or take the window); an event joins every
kept wait whose window it is in. A joined wait
is gone (the runner tombstones it with the score); an event stays until it expires, so a
second turn naming the same key joins it too. ``restore`` rebuilds the state from the
partition: records before the group's committed offset were decided already (their
effects, tombstones included, are in the topic), later ones are read again by the group.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pyrula_stream.evals.stream.state import Early, Wait, parse
from pyrula_stream.kafka.offsets import ConsumedRecord


@dataclass(frozen=True, slots=True)
class Joined:
    wait: Wait
    event: Early


Join = tuple[str, str]
"""(evaluator, join key): what a wait and an event must share to join."""


@dataclass
class Joins:
    """The state of one partition of ``<agent>.outcomes``, indexed by join."""

    waits: dict[str, Wait] = field(default_factory=dict)
    events: dict[str, Early] = field(default_factory=dict)
    _by_join: dict[Join, set[str]] = field(default_factory=dict)
    """The record keys of each join's waits and events (arrivals look up one join)."""

    def _index(self, item: Wait | Early) -> None:
        self._by_join.setdefault((item.evaluator, item.join_key), set()).add(item.key)

    def _unindex(self, item: Wait | Early) -> None:
        keys = self._by_join.get((item.evaluator, item.join_key))
        if keys is not None:
            keys.discard(item.key)
            if not keys:
                del self._by_join[(item.evaluator, item.join_key)]

    def _of(self, item: Wait | Early) -> list[str]:
        return sorted(self._by_join.get((item.evaluator, item.join_key), ()))

    @classmethod
    def restore(cls, records: Iterable[ConsumedRecord], committed: int) -> Joins:
        joins = cls()
        for rec in records:
            if rec.value is None:
                joins.forget(rec.key)
            elif rec.offset < committed:
                joins.keep(parse(rec.value))
        return joins

    def keep(self, item: Wait | Early) -> None:
        if isinstance(item, Wait):
            self.waits[item.key] = item
        else:
            self.events[item.key] = item
        self._index(item)

    def forget(self, key: str) -> None:
        item = self.waits.pop(key, None) or self.events.pop(key, None)
        if item is not None:
            self._unindex(item)

    def arrive(self, item: Wait | Early) -> list[Joined]:
        """What ``item`` joins now (an item seen before joins nothing again)."""
        if item.key in self.waits or item.key in self.events:
            return []
        if isinstance(item, Wait):
            matches = [e for k in self._of(item) if (e := self.events.get(k)) and item.meets(e)]
            if matches:
                return [Joined(item, min(matches, key=lambda e: (e.ts_ms, e.key)))]
            self.keep(item)
            return []
        self.keep(item)
        joined = [
            Joined(w, item) for k in self._of(item) if (w := self.waits.get(k)) and w.meets(item)
        ]
        for j in joined:
            self.forget(j.wait.key)
        return joined

    def due(self, now_ms: int) -> tuple[list[Wait], list[Early]]:
        """Waits whose window (and grace) closed, and events past keeping; both removed."""
        waits = [w for w in self.waits.values() if w.fire_ms <= now_ms]
        events = [e for e in self.events.values() if e.expire_ms <= now_ms]
        for key in [w.key for w in waits] + [e.key for e in events]:
            self.forget(key)
        return waits, events
