"""Crash quarantine: a record that kills worker processes goes to the DLQ, not round again.

Decoding cannot kill a worker any more, but a record may still make a process die in a
way nobody foresaw (a native crash, ``os._exit`` in a tool, the OOM killer). A dying
process writes nothing, so its successor must count. The count lives in the partition's
journal, as one *intake mark* (key ``cursor/intake``) that restore reads anyway:

- On assignment the owner commits ``{offset: committed input offset, open: true}``
  before any turn of the partition starts; a clean handover (revoke, stop) tombstones
  it. One write per assignment (and one per handover), none per turn.
- The next owner that finds the mark still open knows the previous process died, but
  not why: with many turns running, any of them, or something outside (a SIGKILL of
  every worker, the OOM killer), may have killed it. So it charges nothing yet and runs
  *carefully*: the partition's turns start one at a time, each after a mark at its own
  offset (saying ``careful``) is durable, until the records the dead process could have
  read are behind it.
- Only a death in that mode is charged: when the open mark is a careful one and still
  names the lowest record not committed, that record was the one new turn running, and
  it gets a crash (added to the mark's count, within ``retry_ttl_s`` of it). An
  innocent record, by finishing, moves the count on at zero to the next.
- Once a record has ``max_retries`` crashes charged it is quarantined: dead-lettered with
  code ``poison_quarantine`` and ended with a ``run:error``, without running. A record
  that kills every process that runs it is thus quarantined by the ``max_retries + 2``-th
  owner: the first death switches to careful mode, the next ``max_retries`` are counted.
- Marks name the process that wrote them: a process that finds its own mark open (its
  session failed, or a handover could not commit) knows nobody died and charges nothing,
  unless its sessions keep ending on that partition's committed offset
  (``runtime/restarts.py``): from the second ending in a row it runs carefully, and an
  ending under a careful mark that names that offset is charged like a death.

Within one process a turn that keeps failing without progress is counted by its own
attempts in its journal, the other half of ``PoisonOptions``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyrula_stream.runtime.options import PoisonOptions
from pyrula_stream.wire import serde
from pyrula_stream.wire.journal_keys import INTAKE_MARK_KEY
from pyrula_stream.wire.records import OutRecord, wire_record
from pyrula_stream.wire.serde import JournalEntry

log = logging.getLogger(__name__)


PROCESS = uuid.uuid4().hex
"""This process, in the marks it writes: a mark it finds open again was left by a
session that failed or a handover that could not commit, not by a death."""


def intake_owner(partition: int) -> str:
    """The committer owner of a partition's intake marks (purged when it is revoked)."""
    return f"{INTAKE_MARK_KEY}/{partition}"


@dataclass(frozen=True, slots=True)
class IntakeMark:
    """Who owns a partition's intake, from which committed offset, after how many crashes."""

    offset: int
    crashes: int = 0
    open: bool = True
    worker: str = ""
    ts_ms: int = 0
    careful: bool = False
    """Written in careful mode: the record at ``offset`` runs alone once this is durable."""
    process: str = ""

    def record(self, journal_topic: str, partition: int) -> OutRecord:
        data = {
            "offset": self.offset,
            "crashes": self.crashes,
            "open": self.open,
            "worker": self.worker,
            "careful": self.careful,
            "process": self.process,
        }
        entry = JournalEntry("", -1, "intake_mark", data=data, ts_ms=self.ts_ms)
        return wire_record(
            journal_topic,
            INTAKE_MARK_KEY.encode(),
            serde.encode("journal_entry", entry),
            "journal_entry",
            partition=partition,
        )

    @classmethod
    def from_entry(cls, data: dict[str, Any] | None, ts_ms: int) -> IntakeMark | None:
        """The mark a restored journal held (``None``: none, or unreadable)."""
        if not data:
            return None
        offset, crashes, is_open = data.get("offset"), data.get("crashes"), data.get("open")
        if not (isinstance(offset, int) and isinstance(crashes, int) and isinstance(is_open, bool)):
            return None
        careful = data.get("careful") is True  # a mark from before this field: not careful
        process = str(data.get("process") or "")
        return cls(offset, crashes, is_open, str(data.get("worker") or ""), ts_ms, careful, process)


MarkWriter = Callable[[IntakeMark], "asyncio.Future[None]"]
Admit = Callable[[Any], None]


@dataclass
class CrashGuard:
    """One partition's crash bookkeeping between its restore and its revoke.

    ``admit`` decides per new turn; held turns are handed back to ``release`` (the
    scheduler's admit) once a mark is durable or the careful turn in flight ended.
    """

    partition: int
    committed: int
    crashes: int
    careful_until: int
    options: PoisonOptions
    write_mark: MarkWriter
    release: Admit
    worker: str
    careful: bool = False
    marked_at: int = -1
    in_flight: int | None = None
    gate: asyncio.Future[None] | None = None
    held: deque[Any] = field(default_factory=deque)
    left: set[int] = field(default_factory=set)
    """Offsets of turns admitted here that did not start (pinned to a version this
    worker lacks): not in flight, and no reason to stay careful for them."""

    @classmethod
    def restored(
        cls,
        partition: int,
        mark: IntakeMark | None,
        committed: int,
        restored_end: int,
        *,
        options: PoisonOptions,
        worker: str,
        write_mark: MarkWriter,
        release: Admit,
        restarts: int = 0,
    ) -> CrashGuard:
        """Read the mark the previous owner left and commit this owner's own.
        ``restarts``: this process's sessions that ended in a row with the partition at
        ``committed``."""
        careful, crashes = cls.after(mark, committed, options, restarts)
        if mark is not None and mark.open and mark.process == PROCESS and restarts >= 2:
            log.warning(
                "partition %d: %d sessions of this worker ended in a row at input offset %d "
                "(%d of %d charged before quarantine); running its turns one at a time",
                partition,
                restarts,
                committed,
                crashes,
                options.max_retries,
            )
        elif mark is not None and mark.open and mark.process != PROCESS:
            who = mark.worker or "unknown"
            if crashes:
                log.warning(
                    "partition %d: the previous owner (%s) died running input offset %d "
                    "alone (crash %d of %d before quarantine); running its turns one at a time",
                    partition,
                    who,
                    committed,
                    crashes,
                    options.max_retries,
                )
            else:
                log.warning(
                    "partition %d: the previous owner (%s) died with input offset %d and "
                    "maybe others in progress; no record is charged, running its turns one "
                    "at a time",
                    partition,
                    who,
                    committed,
                )
        guard = cls(
            partition,
            committed,
            crashes,
            restored_end,
            options,
            write_mark,
            release,
            worker,
            careful=careful,
        )
        guard._mark(committed, crashes)
        return guard

    @classmethod
    def after(
        cls, mark: IntakeMark | None, committed: int, options: PoisonOptions, restarts: int = 0
    ) -> tuple[bool, int]:
        """Whether the new owner runs carefully, and the crashes of the record at
        ``committed``, given the mark the previous owner left (and, when this process
        left it, how many of its sessions ended in a row at ``committed``)."""
        if mark is None or not mark.open:
            return False, 0  # a first assignment or a clean handover
        if mark.process == PROCESS and restarts >= 2:
            # This process keeps restarting on the same input: an ending is charged
            # like a death, to the record that ran alone under a careful mark.
            return True, cls._charged(mark, committed, options)
        if mark.process == PROCESS:
            # Left open by this very process (its session failed): nobody died. Keep
            # the mark's mode and count, add nothing.
            same = mark.careful and mark.offset == committed
            return mark.careful, mark.crashes if same else 0
        return True, cls._charged(mark, committed, options)

    @staticmethod
    def _charged(mark: IntakeMark, committed: int, options: PoisonOptions) -> int:
        """The crashes of the record at ``committed`` once its owner died under ``mark``:
        one more than the mark's count when the mark was careful and still names that
        record (it was the one new turn running), else 0 (nothing says which record,
        if any, killed the process)."""
        if not (mark.careful and mark.offset == committed):
            return 0
        fresh = int(time.time() * 1000) - mark.ts_ms <= options.retry_ttl_s * 1000
        return (mark.crashes if fresh else 0) + 1

    @property
    def quarantine_due(self) -> bool:
        return self.crashes >= self.options.max_retries

    def _mark(self, offset: int, crashes: int) -> None:
        now_ms = int(time.time() * 1000)
        mark = IntakeMark(offset, crashes, True, self.worker, now_ms, self.careful, PROCESS)
        self.marked_at = offset
        gate = self.gate = self.write_mark(mark)
        gate.add_done_callback(lambda _: self._release_held())

    def admit(self, queued: Any) -> str:
        """``"run"``, ``"hold"`` (kept until a mark is durable or the careful turn ends)
        or ``"quarantine"`` for one turn read from the partition, about to start."""
        if self.gate is not None and not self.gate.done():
            self.held.append(queued)
            return "hold"
        if not self.careful:
            return "run"
        if self.in_flight is not None:
            self.held.append(queued)
            return "hold"
        at = queued.offset
        if at != self.marked_at:
            self.crashes = 0  # a new suspect: its own count starts now
            self.held.append(queued)
            self._mark(at, 0)
            return "hold"
        self.in_flight = queued.offset
        if self.quarantine_due:
            self.crashes = 0
            return "quarantine"
        return "run"

    def ended(self, offset: int, committable: int | None) -> None:
        """A turn of this partition ended, parked or was not started (``declined``): the
        next careful turn may start. ``committable``: how far the partition's own work
        has got, past the offsets it ``left``."""
        if self.in_flight != offset:
            return
        self.in_flight = None
        if committable is not None and committable >= self.careful_until:
            self.careful = False
        self._release_held()

    def _release_held(self) -> None:
        if self.gate is not None and self.gate.cancelled():
            return  # revoked: the partition's turns are the next owner's
        held, self.held = self.held, deque()
        for queued in held:
            self.release(queued)
