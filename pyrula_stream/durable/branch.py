"""Branches: a new turn that replays a recorded turn up to a step, then runs live with a
change (new params, system prompt or model), without repeating the original's effects.

A branch is an ordinary turn request whose metadata names the original turn and the
step to fork at. The worker reads the original from ``<agent>.history`` (so branching
needs ``keep_history=True``) every time the branch starts or resumes; steps before
``from_step`` are taken from the original as recorded, whatever their input now is (the
branch's own start step is its own). From ``from_step`` on, the model runs live;
a ``read_only`` tool runs live; any other tool returns the original's recorded result
when the original made the same call (name and arguments), else the branch ends with
``write_tool_blocked`` (reason ``write`` for a ``writes=True`` tool, ``unmarked`` for a
tool marked neither way, ``step`` for a ``ctx.step``, ``effect`` for any other effect).
A branch never starts a child turn: a sub-agent call and its reply are the original's
(its child's result) when the original made the same call, else ``effect``; the child's
own tools may write, so a new child would repeat effects no guard here could see.
A refusal ends the branch even if the body catches it. The original is never touched.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from pyrula_stream.durable.journal import TurnJournal
from pyrula_stream.errors import BranchUnresumable, ConfigurationError, WriteToolBlocked
from pyrula_stream.llm.base import LLMClient
from pyrula_stream.state.history import TurnRecording
from pyrula_stream.wire.serde import JournalEntry, TurnRequest

BRANCH_OF = "pyrula.branch_of"
FROM_STEP = "pyrula.branch_from_step"
SYSTEM = "pyrula.branch_system"
MODEL = "pyrula.branch_model"


def branch_metadata(
    original: str, from_step: int, system: str | None = None, model: str | None = None
) -> dict[str, Any]:
    """The metadata that makes a turn request a branch of ``original``."""
    meta: dict[str, Any] = {BRANCH_OF: original, FROM_STEP: from_step}
    if system is not None:
        meta[SYSTEM] = system
    if model is not None:
        meta[MODEL] = model
    return meta


def branch_of(request: TurnRequest) -> str | None:
    value = request.metadata.get(BRANCH_OF)
    return str(value) if value else None


def check_from_step(original: TurnRecording, from_step: int) -> None:
    """A branch forks after the start step and at most after the last recorded step."""
    last = max((s.step for s in original.steps), default=0)
    if not 1 <= from_step <= last + 1:
        raise ConfigurationError(
            f"from_step must be between 1 and {last + 1} for turn {original.turn_id} "
            f"(it recorded steps 0..{last}); got {from_step}"
        )


@dataclass
class Branch:
    """The rules of one running branch (see the module docstring)."""

    original: TurnRecording
    from_step: int
    system: str | None = None
    model: str | None = None
    _taken: set[int] = field(default_factory=set)

    @classmethod
    def of(cls, request: TurnRequest, original: TurnRecording | None) -> Branch:
        parent = branch_of(request) or ""
        if original is None:
            raise BranchUnresumable(
                f"branch {request.turn_id} cannot run: its original turn {parent} is no "
                "longer in the history topic (deleted or past retention)",
                detail={"reason": "parent_missing", "branch_of": parent},
            )
        meta = request.metadata
        if not isinstance(meta.get(FROM_STEP), int):
            raise BranchUnresumable(
                f"branch {request.turn_id} has no integer {FROM_STEP} in its metadata; "
                "start branches with KafkaAgentClient.branch",
                detail={"reason": "bad_request", "branch_of": parent},
            )
        system, model = meta.get(SYSTEM), meta.get(MODEL)
        return cls(
            original,
            meta[FROM_STEP],
            str(system) if system is not None else None,
            str(model) if model is not None else None,
        )

    def llm(self, llm: LLMClient) -> LLMClient:
        """The agent's model client, or a copy that calls ``model`` instead (same
        provider, connection and rate limit)."""
        if self.model is None:
            return llm
        other = copy.copy(llm)
        other.model = self.model
        return other

    @property
    def turn_id(self) -> str:
        return self.original.turn_id

    def prefill(self, journal: TurnJournal) -> None:
        """Put the original's steps before ``from_step`` (not its start) in the branch's
        journal, as recorded: the branch replays them even though its input changed."""
        forked = set(journal.forked)
        for entry in self.original.steps:
            if 1 <= entry.step < self.from_step:
                journal.steps.setdefault(entry.step, entry)
                forked.add(entry.step)
        journal.forked = frozenset(forked)

    def tool_result(
        self, step: int | None, name: str, input_hash: str, *, read_only: bool, writes: bool
    ) -> dict[str, Any] | None:
        """``None`` when the tool may run live; else the original's recorded result."""
        if read_only:
            return None
        reason = "write" if writes else "unmarked"
        return self._recorded("tool", name, input_hash, step, reason).data

    def step_result(self, step: int | None, name: str, input_hash: str) -> dict[str, Any]:
        """The original's result of this ``ctx.step``; a branch never runs one live."""
        return self._recorded("step", name, input_hash, step, "step").data

    def agent_result(self, kind: str, step: int | None, name: str, input_hash: str) -> Any:
        """The original's record of this sub-agent call or reply (``kind``); a branch
        never starts a child turn of its own."""
        return self._recorded(kind, name, input_hash, step, "effect", f"agent:{name}").data

    def refuse_effect(self, what: str, step: int | None = None) -> WriteToolBlocked:
        """The error for an effect that is neither a tool nor a step: a memory write
        (``ctx.memory.put``/``delete``), which a branch never makes."""
        return self._blocked(what, "effect", step)

    def _recorded(
        self,
        kind: str,
        name: str,
        input_hash: str,
        step: int | None,
        reason: str,
        what: str | None = None,
    ) -> JournalEntry:
        for entry in self.original.steps:
            if (
                entry.kind == kind
                and entry.name == name
                and entry.input_hash == input_hash
                and entry.step not in self._taken
            ):
                self._taken.add(entry.step)
                return entry
        what = what or f"{'ctx.step' if kind == 'step' else 'tool'}:{name}"
        raise self._blocked(what, reason, step)

    def _blocked(self, what: str, reason: str, step: int | None) -> WriteToolBlocked:
        where = f" at step {step}" if step is not None else ""
        return WriteToolBlocked(
            f"branch of turn {self.turn_id} stopped{where}: {what} was not called "
            f"this way in the original, and a branch never repeats an effect (reason: {reason}); "
            + (
                "branch after it"
                if reason in ("step", "effect")
                else "branch after it, or mark the tool read_only=True if it has no side effects"
            ),
            detail={"reason": reason, "call": what, "step": step, "branch_of": self.turn_id},
        )
