"""Structured logs: who a log line is about (agent, turn, attempt, partition, worker).

The worker binds ``agent`` and ``worker_id`` when it runs and each turn task binds its
turn (``turn_id``, ``attempt`` and ``partition``); the values live in context variables, so every
line logged from inside a turn (the worker's, a tool's, a provider client's) carries them
without being passed around. ``JsonFormatter`` writes one JSON object per line
(``pyrula-stream worker --log-format json``); a line logged inside an OpenTelemetry span
also carries its ``trace_id`` and ``span_id`` (hex, as trace back ends show them), so a
log search leads to the trace. Nothing here logs payloads: model text,
tool arguments and results stay in the journal and events, never in logs at INFO.
"""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Protocol

from opentelemetry import trace

LOG_FIELDS = ("agent", "worker_id", "turn_id", "attempt", "partition", "trace_id", "span_id")

_context: ContextVar[dict[str, Any] | None] = ContextVar("pyrula_log_context", default=None)


class TurnLogFields(Protocol):
    """What a turn's log lines carry, asked for only when a line is logged."""

    def log_fields(self) -> dict[str, Any]: ...


_turn: ContextVar[TurnLogFields | None] = ContextVar("pyrula_log_turn", default=None)


def bind(**fields: Any) -> None:
    """Add fields to the log context of the current task (and tasks it starts later)."""
    _context.set({**(_context.get() or {}), **fields})


def bind_turn(turn: TurnLogFields) -> None:
    """The turn the current task runs: a reference, not a dict of its fields per turn in
    flight (thousands at once), read when a line is logged."""
    _turn.set(turn)


class ContextFilter(logging.Filter):
    """Copies the bound fields onto each record (``record.agent``, ``record.turn_id``...),
    and the ids of the current span, if one records."""

    def filter(self, record: logging.LogRecord) -> bool:
        turn = _turn.get()
        for fields in (_context.get(), turn.log_fields() if turn is not None else None):
            for key, value in (fields or {}).items():
                if not hasattr(record, key):
                    setattr(record, key, value)
        span = trace.get_current_span().get_span_context()
        if span.is_valid and not hasattr(record, "trace_id"):
            record.trace_id = f"{span.trace_id:032x}"
            record.span_id = f"{span.span_id:016x}"
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the bound fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in LOG_FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                out[key] = value
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure(level: int, fmt: str) -> None:
    """Root logging for the CLI: ``text`` (readable, one line) or ``json``."""
    handler = logging.StreamHandler()
    handler.addFilter(ContextFilter())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)
