"""What an evaluator reads of a finished turn: its result record, and the version of the
agent that ran it (the ``pyrula.agent-version`` header of the result)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyrula_stream.errors import MalformedRecordError
from pyrula_stream.wire.serde import AGENT_VERSION_HEADER, TurnResult, decode_turn_result


@dataclass(frozen=True, slots=True)
class ScoredTurn:
    """A finished turn as evaluators see it (``<agent>.results``, read committed)."""

    turn_id: str
    agent: str
    status: str
    """``completed`` or ``failed``."""
    result: Any = None
    error_code: str | None = None
    error_message: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    cost_usd: float = 0.0
    duration_ms: int = 0
    finished_ms: int = 0
    thread_id: str | None = None
    tenant: str | None = None
    agent_version: str = ""
    """The version that ran the turn (``@kafka_agent(version=...)``); empty without one."""
    started_ms: int = 0
    tools: tuple[str, ...] = ()
    """The tools it called, in order: read from its events only for an evaluator that
    asks (``reads_tools=True``), else empty."""

    @property
    def completed(self) -> bool:
        return self.status == "completed"

    @classmethod
    def of(cls, result: TurnResult, agent_version: str | None = None) -> ScoredTurn:
        return cls(
            turn_id=result.turn_id,
            agent=result.agent,
            status=result.status,
            result=result.result,
            error_code=result.error_code,
            error_message=result.error_message,
            usage=dict(result.usage),
            cost_usd=result.cost_usd,
            duration_ms=result.duration_ms,
            finished_ms=result.finished_ms,
            thread_id=result.thread_id,
            tenant=result.tenant,
            agent_version=agent_version or "",
            started_ms=result.started_ms,
        )

    @classmethod
    def from_record(cls, value: bytes | None, headers: Mapping[str, str]) -> ScoredTurn:
        """A results record; ``MalformedRecordError`` when it is not one."""
        if value is None:
            raise MalformedRecordError("result record: empty value")
        return cls.of(decode_turn_result(value, headers), headers.get(AGENT_VERSION_HEADER))

    def data(self) -> dict[str, Any]:
        """The turn as JSON (what a deferred outcome keeps while it waits)."""
        return {
            "turn_id": self.turn_id,
            "agent": self.agent,
            "status": self.status,
            "result": self.result,
            "error_code": self.error_code,
            "error_message": self.error_message,
            "usage": self.usage,
            "cost_usd": self.cost_usd,
            "duration_ms": self.duration_ms,
            "finished_ms": self.finished_ms,
            "thread_id": self.thread_id,
            "tenant": self.tenant,
            "agent_version": self.agent_version,
            "started_ms": self.started_ms,
            "tools": list(self.tools),
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> ScoredTurn:
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        fields["tools"] = tuple(fields.get("tools") or ())
        try:
            return cls(**fields)
        except TypeError as exc:
            raise MalformedRecordError(f"scored turn: {exc}") from None

    def read(self) -> dict[str, Any]:
        """What a score says its evaluator read by default (small: no params, no text
        beyond the result)."""
        read = {
            "status": self.status,
            "result": self.result,
            "error_code": self.error_code,
            "cost_usd": self.cost_usd,
            "llm_calls": self.usage.get("llm_calls", 0),
        }
        if self.tools:
            read["tools"] = list(self.tools)
        return read
