"""The tools a finished turn called, read from ``<agent>.events`` for the evaluators that
ask for them (``@evaluator(reads_tools=True)``).

A turn's events are keyed by its id, so they share one partition; the reader seeks to
the turn's start (its result says when) and reads until the turn's terminal event, which
the turn's terminal transaction wrote with the result the evaluators just read.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from pyrula_stream.errors import MalformedRecordError
from pyrula_stream.kafka.io import PartitionReader
from pyrula_stream.wire.events import EventType, decode_event

SEEK_BACK_MS = 5_000
"""How far before the turn's recorded start to begin (clocks of workers differ)."""


class ToolsCalled:
    """One reader of an agent's events topic, reused for every turn asked about."""

    def __init__(
        self,
        bootstrap_servers: str,
        events_topic: str,
        *,
        client_id: str,
        kafka_config: Mapping[str, Any] | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.timeout_s = timeout_s
        self._reader = PartitionReader(
            bootstrap_servers, events_topic, client_id=client_id, kafka_config=kafka_config
        )

    def of(self, turn_id: str, started_ms: int) -> tuple[str, ...]:
        """The names of the tools ``turn_id`` called, in order (MCP tools as
        ``server.tool``); ``TimeoutError`` when its terminal event is not found."""
        since = max(0, started_ms - SEEK_BACK_MS) if started_ms else None
        self._reader.seek_key(turn_id.encode(), since)
        key = turn_id.encode()
        tools: list[str] = []
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            for k, value, headers, _, _ in self._reader.poll(0.5):
                if k != key or value is None:
                    continue
                try:
                    event = decode_event(value, headers)
                except MalformedRecordError:
                    continue
                if event.type == EventType.TOOL_START:
                    tools.append(str(event.data.get("tool", "")))
                elif event.is_terminal:
                    return tuple(tools)
        raise TimeoutError(f"no terminal event of turn {turn_id} within {self.timeout_s:g}s")

    def close(self) -> None:
        self._reader.close()
