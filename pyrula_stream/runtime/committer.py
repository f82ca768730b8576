"""Group commit: steps that become durable while a commit is in flight ride the next one.

With no commit in flight a step commits at once, so latency stays near one commit; under
load many turns share each transaction, so throughput grows with load. Each commit holds
the records, the progress record of every turn it touches, and the input offsets.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from pyrula_stream.durable.turn import TurnRuntime
from pyrula_stream.kafka.transactions import Offsets, TransactionAborted
from pyrula_stream.observability.telemetry import WorkerTelemetry
from pyrula_stream.records import OutRecord

log = logging.getLogger(__name__)

WriteBatch = Callable[[list[OutRecord], Offsets], Awaitable[None]]


@dataclass
class _Batch:
    records: list[tuple[str | None, OutRecord]] = field(default_factory=list)
    waiters: list[tuple[str | None, asyncio.Future[None]]] = field(default_factory=list)
    turns: dict[str, TurnRuntime] = field(default_factory=dict)
    fence: bool = False

    def empty(self) -> bool:
        return not self.records and not self.waiters


@dataclass
class CommitStats:
    commits: int = 0
    records: int = 0
    aborts: int = 0
    seconds: float = 0.0


ABORT_RETRY_S = 0.1
"""After an abort, how soon records that someone waits for are committed again."""


class GroupCommitter:
    """Buffers turn records and commits them in batches, one batch in flight at a time.

    ``on_committed`` hears the input offsets each successful commit made durable (what a
    crash can no longer re-read), so the worker can forget what lies below them.
    """

    def __init__(
        self,
        write: WriteBatch,
        offsets: Callable[[], Offsets],
        on_abort: Callable[[set[str]], None],
        *,
        interval_s: float = 0.0,
        telemetry: WorkerTelemetry,
        on_committed: Callable[[Offsets], None] | None = None,
    ) -> None:
        self._write = write
        self._telemetry = telemetry
        self._on_committed = on_committed
        self._offsets = offsets
        self._on_abort = on_abort
        self._interval_s = interval_s
        self._pending = _Batch()
        self._wake = asyncio.Event()
        self._last_offsets: Offsets = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self._looped = asyncio.Event()
        self.stats = CommitStats()

    # -- what turns call ------------------------------------------------------------------

    def add(self, turn: TurnRuntime, records: list[OutRecord]) -> None:
        self._pending.records.extend((turn.turn_id, r) for r in records)
        self._pending.turns[turn.turn_id] = turn
        self._wake.set()

    def durable(self, turn: TurnRuntime, records: list[OutRecord]) -> asyncio.Future[None]:
        self.add(turn, records)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.waiters.append((turn.turn_id, fut))
        return fut

    def add_records(self, records: list[OutRecord]) -> None:
        """Records that belong to no turn (dead letters, housekeeping tombstones)."""
        self._pending.records.extend((None, r) for r in records)
        self._wake.set()

    def durable_records(self, owner: str, records: list[OutRecord]) -> asyncio.Future[None]:
        """Records of no turn that must commit with every owned partition's input offset
        (a reply and its read position): the offsets carry the group generation, so a
        worker that lost the partition is fenced instead of writing them. An abort keeps
        them for the next commit; ``purge({owner})`` drops them (the partition was
        revoked). The future resolves when they are durable."""
        self._pending.records.extend((owner, r) for r in records)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.waiters.append((owner, fut))
        self._pending.fence = True
        self._wake.set()
        return fut

    def offsets_changed(self) -> None:
        self._wake.set()

    def purge(self, turn_ids: set[str]) -> None:
        """Drop buffered records of turns this worker no longer owns (never committed)."""
        batch = self._pending
        batch.records = [(t, r) for t, r in batch.records if t not in turn_ids]
        for t, fut in batch.waiters:
            if t in turn_ids and not fut.done():
                fut.cancel()
        batch.waiters = [(t, f) for t, f in batch.waiters if t not in turn_ids]
        for t in turn_ids:
            batch.turns.pop(t, None)

    async def wait_idle(self) -> None:
        """Wait until no commit is in flight."""
        await self._idle.wait()

    async def flush(self) -> None:
        """Commit whatever is buffered now and wait for it."""
        while not self._pending.empty() or self._offsets_dirty():
            self._looped.clear()
            self._wake.set()
            await self._looped.wait()
        await self._idle.wait()

    def _offsets_dirty(self) -> bool:
        return any(self._last_offsets.get(k) != v for k, v in self._offsets().items())

    def forget_offsets(self, keys: set[tuple[str, int]]) -> None:
        """Partitions we lost: commit their offsets afresh if they come back."""
        for key in keys:
            self._last_offsets.pop(key, None)

    # -- the loop -------------------------------------------------------------------------

    async def run(self) -> None:
        last = 0.0
        while True:
            self._looped.set()
            await self._wake.wait()
            self._wake.clear()
            if self._interval_s:
                await asyncio.sleep(max(0.0, last + self._interval_s - time.monotonic()))
            if await self._commit_pending():
                last = time.monotonic()

    async def _commit_pending(self) -> bool:
        """Commit what is buffered and the changed offsets; True when a commit succeeded.

        A method of its own so that nothing of a committed batch (its records, its turns'
        runtimes) stays referenced by the loop while the worker waits for the next one.
        """
        offsets = self._offsets()
        changed = {k: v for k, v in offsets.items() if self._last_offsets.get(k) != v}
        batch, self._pending = self._pending, _Batch()
        if batch.fence:
            changed = dict(offsets)
        if batch.empty() and not changed:
            return False
        records = [r for _, r in batch.records]
        for turn in batch.turns.values():
            if not turn.finished:
                records.append(turn.progress_record())
        seqs = {t: turn.next_seq for t, turn in batch.turns.items()}
        self._idle.clear()
        started = time.monotonic()
        observed = self._telemetry.commit((t.telemetry for t in batch.turns.values()), records)
        try:
            await self._write(records, changed)
        except TransactionAborted:
            self.stats.aborts += 1
            observed.aborted()
            # Records of no turn (dead letters, housekeeping) ride the next commit;
            # turn records are rebuilt by rerunning their turns from the journal.
            orphans = [(t, r) for t, r in batch.records if t not in batch.turns]
            # What the aborted turns buffered since belongs to an attempt that restarts.
            self.purge(set(batch.turns))
            self._pending.records[:0] = orphans
            kept = [(t, f) for t, f in batch.waiters if t not in batch.turns]
            self._pending.waiters[:0] = kept
            self._pending.fence = self._pending.fence or batch.fence
            for t, fut in batch.waiters:
                if t in batch.turns and not fut.done():
                    fut.cancel()
            self._on_abort(set(batch.turns))
            if self._pending.waiters:
                # Someone waits for kept records (an intake mark before a partition's
                # first turn): retry soon even if nothing else wakes the loop.
                await asyncio.sleep(ABORT_RETRY_S)
                self._wake.set()
            return False
        except BaseException as exc:
            observed.failed(exc)
            for _, fut in batch.waiters:
                if not fut.done():
                    fut.set_exception(exc)
            raise
        finally:
            self._idle.set()
            observed.end()
        self.stats.commits += 1
        self.stats.records += len(records)
        self.stats.seconds += time.monotonic() - started
        self._last_offsets.update(changed)
        if changed and self._on_committed is not None:
            self._on_committed(changed)
        for t, turn in batch.turns.items():
            turn.committed_seq = seqs[t]
        for _, fut in batch.waiters:
            if not fut.done():
                fut.set_result(None)
        return True
