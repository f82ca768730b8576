"""What the chaos harness follows while a run goes on: the events topic (which turns
have ended, and the longest time none did) and, for its kills, the replies topic."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from pyrula_stream.kafka.io import PartitionReader
from pyrula_stream.wire.events import decode_event


def replies_watch(bootstrap: str, topic: str, partitions: int) -> Callable[[], PartitionReader]:
    """Opens a read_committed reader of the parent's replies, at their end now."""

    def open_reader() -> PartitionReader:
        reader = PartitionReader(
            bootstrap, topic, client_id=f"chaos-replies-{uuid.uuid4().hex[:6]}"
        )
        reader.seek_partitions(list(range(partitions)), int(time.time() * 1000))
        return reader

    return open_reader


class EventMonitor(threading.Thread):
    """Follows the events topic (read_committed) during the run: which turns have ended."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        *,
        kafka_config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(name="chaos-event-monitor", daemon=True)
        client_id = f"chaos-monitor-{uuid.uuid4().hex[:6]}"
        self._reader = PartitionReader(
            bootstrap, topic, client_id=client_id, kafka_config=kafka_config
        )
        self._reader.seek_partitions(list(range(partitions)), None)
        self.finished: set[str] = set()
        self.finish_times: list[float] = []
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                for _, value, headers, _, _ in self._reader.poll(0.1):
                    if value is None:
                        continue
                    event = decode_event(value, headers)
                    if event.is_terminal and event.turn_id not in self.finished:
                        self.finished.add(event.turn_id)
                        self.finish_times.append(time.monotonic())
        finally:
            self._reader.close()

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(10)

    def longest_stall(self, start: float, end: float) -> tuple[float, float]:
        """The longest time (and when, from ``start``) no turn ended while some were open."""
        marks = [start, *sorted(t for t in self.finish_times if start <= t <= end), end]
        gap, at = max(
            ((b - a, a - start) for a, b in itertools.pairwise(marks)), default=(0.0, 0.0)
        )
        return round(gap, 1), round(at, 1)
