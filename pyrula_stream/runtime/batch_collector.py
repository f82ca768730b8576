"""The batch lane's collector: gathers a worker's queued batch calls, submits them as
batches, polls them and journals each call's outcome exactly once.

**One collector's batches belong to one partition.** A batch holds only calls of turns of
one partition, and its record (``batch/<tag>``, ``wire/batches.py``) lives in that
partition's journal. The worker that owns the partition owns its batches: it restores
them with the journal, and every record it writes about them commits with the
partition's input offset, so a worker that lost the partition is fenced instead of
writing. Mixing partitions in one batch would need a batch's outcomes journaled across
partitions whose owners change independently; per partition, the whole path (queue,
batch record, outcomes, resume) is one owner's, as a reply's is. A batch is therefore at
most one partition's queue: with few partitions and a deep backlog that is still
thousands of calls; ``max_age_s`` bounds the wait of a thin one.

**Each call is submitted once.** A batch's record (its tag and its calls' custom ids) is
committed *before* the batch is submitted, and again with the provider's batch id after.
A new owner that finds a record without a batch id asks the provider for the tag
(``BatchClient.find``) and submits only if the provider never saw it. A call is queued
again only if no batch record names it.

**Each outcome is journaled once.** When a batch has ended, its outcomes
(``turn_id/batch:<custom id>``) commit in one transaction with the batch record's
tombstone: a crash before it repeats the download, one after finds no batch. Only a turn
that still waits for that call (parked on it) gets its outcome; the others' are dropped
(counted), and a batch whose turns are all gone is cancelled at the provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from pyrula_stream.agent.batch import BatchLane
from pyrula_stream.context.batch_calls import request_from_data
from pyrula_stream.llm.batch import BatchCall, BatchOutcome, BatchState
from pyrula_stream.observability.batch_metrics import BatchMetrics
from pyrula_stream.runtime.committer import GroupCommitter
from pyrula_stream.runtime.parking import ParkedTurns
from pyrula_stream.runtime.partition import PartitionState
from pyrula_stream.wire.batches import (
    BatchRecord,
    call_id,
    new_tag,
    provider_id,
    result_record,
)

log = logging.getLogger(__name__)

TICK_S = 0.2
"""How often the collector looks for a batch to submit or poll."""
REVOKE_WAIT_S = 10.0
"""How long a revoke waits for a submit in flight (so the next owner's ``find`` sees it)."""


def batch_owner(partition: int) -> str:
    """The committer's owner tag of a partition's batch records (not a turn id)."""
    return f"~batch/{partition}"


@dataclass
class _Lane:
    """The collector's view of one owned partition."""

    queued: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    """Per (provider, model), calls waiting for a batch: custom id -> turn id."""
    since: dict[tuple[str, str], float] = field(default_factory=dict)
    """Per (provider, model), when its oldest queued call was queued (monotonic)."""
    in_batch: set[str] = field(default_factory=set)
    """Custom ids a journaled batch holds."""
    next_poll: dict[str, float] = field(default_factory=dict)
    """Per batch tag, when to ask its status next (monotonic)."""
    resolving: set[str] = field(default_factory=set)
    """Tags being submitted or looked up now: never two at once (a lookup that ran while
    the submit was still on its way would not find it, and submit it again)."""
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    """What runs for the partition now, by what it works on (a tag, a group)."""


class BatchCollector:
    """Submits, polls and applies the batches of the partitions a worker owns."""

    def __init__(
        self,
        lane: BatchLane,
        parts: dict[int, PartitionState],
        journal_topic: str,
        *,
        committer: Callable[[], GroupCommitter],
        parked: ParkedTurns,
        metrics: BatchMetrics,
    ) -> None:
        self.lane = lane
        self._parts = parts
        self._journal = journal_topic
        self._committer = committer
        self._parked = parked
        self.metrics = metrics
        self._lanes: dict[int, _Lane] = {}
        metrics.watch_queued(lambda: self.queued_count)

    @property
    def queued_count(self) -> int:
        """Calls waiting for a batch to be submitted."""
        return sum(len(q) for lane in self._lanes.values() for q in lane.queued.values())

    @property
    def open_batches(self) -> int:
        """Batches journaled and not yet applied, across owned partitions."""
        return sum(len(ps.journal.batches) for p, ps in self._parts.items() if p in self._lanes)

    # -- partitions -----------------------------------------------------------------------

    def assigned(self, partition: int) -> None:
        """A partition was restored: its journaled batches are this worker's to finish
        (before its parked turns are re-armed, which queues their calls)."""
        ps = self._parts.get(partition)
        if ps is None:
            return
        lane = self._lanes[partition] = _Lane()
        now = time.monotonic()
        for tag, record in ps.journal.batches.items():
            lane.in_batch.update(c for c, _ in record.calls)
            lane.next_poll[tag] = now

    async def revoked(self, partitions: set[int]) -> None:
        """The partitions left this worker: stop their work. A submit in flight is let
        finish (within ``REVOKE_WAIT_S``): the next owner then finds its batch by tag."""
        submits: list[asyncio.Task[None]] = []
        for p in partitions:
            lane = self._lanes.pop(p, None)
            if lane is None:
                continue
            for what, task in lane.tasks.items():
                if what.startswith("submit:"):
                    submits.append(task)
                else:
                    task.cancel()
        if submits:
            await asyncio.wait(submits, timeout=REVOKE_WAIT_S)

    def queue(self, partition: int, turn_id: str, batch: dict[str, Any]) -> None:
        """A turn parked for the batch call ``batch`` (its park record's): queue the call
        unless a batch holds it already."""
        lane = self._lanes.get(partition)
        ps = self._parts.get(partition)
        custom_id = str(batch.get("custom_id"))
        if lane is None or ps is None or custom_id in lane.in_batch:
            return
        if turn_id not in ps.parked or turn_id in ps.resuming:
            return  # resumed already (its outcome is in, or it was cancelled)
        group = (str(batch.get("provider")), str(batch.get("model")))
        calls = lane.queued.setdefault(group, {})
        if custom_id in calls:
            return
        calls[custom_id] = turn_id
        lane.since.setdefault(group, time.monotonic())

    # -- the loop -------------------------------------------------------------------------

    async def run(self) -> None:
        """Until cancelled: submit groups that are full or old enough, resolve batches
        without a provider id, poll the others when due."""
        try:
            while True:
                await asyncio.sleep(TICK_S)
                self.tick()
        finally:
            for lane in self._lanes.values():
                for task in lane.tasks.values():
                    task.cancel()

    def tick(self) -> None:
        now = time.monotonic()
        for p, lane in list(self._lanes.items()):
            ps = self._parts.get(p)
            if ps is None:
                continue
            for group, calls in list(lane.queued.items()):
                full = len(calls) >= self.lane.batch_size
                old = now - lane.since.get(group, now) >= self.lane.max_age_s
                if calls and (full or old):
                    self._start(p, lane, f"submit:{group[0]}/{group[1]}", self._flush(p, group))
            for tag, record in list(ps.journal.batches.items()):
                if now < lane.next_poll.get(tag, now) or tag in lane.resolving:
                    continue
                if record.batch_id is None:
                    self._start(p, lane, f"submit:{tag}", self._resolve(p, record, look=True))
                else:
                    self._start(p, lane, f"poll:{tag}", self._poll(p, record))

    def _start(self, p: int, lane: _Lane, what: str, work: Any) -> None:
        if what in lane.tasks:
            work.close()  # the coroutine never runs: one task per thing at a time
            return
        task = asyncio.create_task(work, name=f"batch-{p}-{what}")
        lane.tasks[what] = task
        task.add_done_callback(lambda t: self._done(p, lane, what, t))

    def _done(self, p: int, lane: _Lane, what: str, task: asyncio.Task[None]) -> None:
        if lane.tasks.get(what) is task:
            del lane.tasks[what]
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            log.warning("batch lane, partition %d, %s failed (retried): %r", p, what, error)

    def _waiting(self, ps: PartitionState, turn_id: str, custom_id: str) -> bool:
        """Whether the turn is parked on this call (not ended, not resumed for another
        reason)."""
        parked = ps.parked.get(turn_id)
        return parked is not None and parked.batch == custom_id

    async def _commit(self, p: int, records: list[Any]) -> None:
        await self._committer().durable_records(batch_owner(p), records)

    # -- building and submitting ----------------------------------------------------------

    async def _flush(self, p: int, group: tuple[str, str]) -> None:
        """Journal a batch of the group's queued calls, then submit it."""
        lane, ps = self._lanes.get(p), self._parts.get(p)
        if lane is None or ps is None:
            return
        queued = lane.queued.get(group, {})
        take = list(queued.items())[: self.lane.batch_size]
        for custom_id, _ in take:
            del queued[custom_id]
        if queued:
            lane.since[group] = time.monotonic()
        else:
            lane.queued.pop(group, None)
            lane.since.pop(group, None)
        calls = tuple((c, t) for c, t in take if self._waiting(ps, t, c))
        if not calls:
            return
        record = BatchRecord(
            new_tag(), group[0], group[1], calls, created_ms=int(time.time() * 1000)
        )
        lane.in_batch.update(c for c, _ in calls)
        ps.journal.batches[record.tag] = record
        lane.next_poll[record.tag] = float("inf")  # submitted below, not by the tick
        try:
            await self._commit(p, [record.record(self._journal, p)])
        except BaseException:
            # Not journaled: the calls go back to the queue (a later batch takes them).
            ps.journal.batches.pop(record.tag, None)
            lane.next_poll.pop(record.tag, None)
            lane.in_batch.difference_update(c for c, _ in calls)
            for c, t in calls:
                self.queue(p, t, {"custom_id": c, "provider": group[0], "model": group[1]})
            raise
        await self._resolve(p, record, look=False)

    async def _resolve(self, p: int, record: BatchRecord, *, look: bool) -> None:
        """Give a journaled batch its provider id: found by its tag (``look``: after a
        takeover or a failed try, it may have been submitted), else submitted now."""
        lane, ps = self._lanes.get(p), self._parts.get(p)
        if lane is None or ps is None or record.tag in lane.resolving:
            return
        lane.resolving.add(record.tag)
        try:
            await self._submit(p, lane, ps, record, look=look)
        finally:
            lane.resolving.discard(record.tag)
            if record.tag in ps.journal.batches:  # a failed try: again after the interval
                lane.next_poll[record.tag] = time.monotonic() + self.lane.poll_interval_s

    async def _submit(
        self, p: int, lane: _Lane, ps: PartitionState, record: BatchRecord, *, look: bool
    ) -> None:
        client = self.lane.client
        submitted_at = record.created_ms / 1000 if record.created_ms else None
        batch_id = await client.find(record.tag, submitted_at=submitted_at) if look else None
        if batch_id is not None:
            self.metrics.batch("found")
        else:
            calls = self._calls(ps, record)
            if not calls:  # every turn went away before the batch was sent
                await self._commit(p, [record.tombstone(self._journal, p)])
                self._forget(p, record)
                return
            batch_id = await client.submit(calls, tag=record.tag)
            self.metrics.submitted(len(calls))
        submitted = replace(record, batch_id=batch_id, submitted_ms=int(time.time() * 1000))
        await self._commit(p, [submitted.record(self._journal, p)])
        if ps.journal.batches.get(record.tag) is not None:
            ps.journal.batches[record.tag] = submitted
        lane.next_poll[record.tag] = time.monotonic() + self.lane.poll_interval_s

    def _calls(self, ps: PartitionState, record: BatchRecord) -> list[BatchCall]:
        """The batch's calls whose turns still wait for them, with their requests (from
        their park records)."""
        out: list[BatchCall] = []
        for custom_id, turn_id in record.calls:
            if not self._waiting(ps, turn_id, custom_id):
                continue
            journal = ps.journal.turns.get(turn_id) or ps.journal.parked.get(turn_id)
            batch = (journal.park or {}).get("batch") if journal is not None else None
            if not isinstance(batch, dict) or batch.get("custom_id") != custom_id:
                continue
            request = request_from_data(batch["request"])
            out.append(BatchCall(provider_id(record.tag, custom_id), request))
        return out

    # -- polling and applying -------------------------------------------------------------

    async def _poll(self, p: int, record: BatchRecord) -> None:
        """Ask the batch's status; once it has ended, journal its outcomes."""
        lane, ps = self._lanes.get(p), self._parts.get(p)
        if lane is None or ps is None or record.batch_id is None:
            return
        client = self.lane.client
        lane.next_poll[record.tag] = time.monotonic() + self.lane.poll_interval_s
        status = await client.status(record.batch_id)
        if status.state == BatchState.IN_PROGRESS:
            if not any(self._waiting(ps, t, c) for c, t in record.calls):
                await client.cancel(record.batch_id)  # its turns are all gone
                self.metrics.batch("cancelled")
            return
        outcomes = await client.results(record.batch_id)
        await self._apply(p, record, status.state, outcomes, status.error)

    async def _apply(
        self,
        p: int,
        record: BatchRecord,
        state: BatchState,
        outcomes: list[BatchOutcome],
        error: str | None,
    ) -> None:
        """One transaction: each waiting turn's outcome and the batch's tombstone."""
        ps = self._parts.get(p)
        if ps is None:
            return
        by_id = {call_id(o.custom_id): o for o in outcomes}
        records = [record.tombstone(self._journal, p)]
        applied: list[tuple[str, str, dict[str, Any]]] = []
        dropped = 0
        for custom_id, turn_id in record.calls:
            if not self._waiting(ps, turn_id, custom_id):
                dropped += 1
                continue
            data = _outcome_data(record, state, by_id.get(custom_id), error)
            records.append(result_record(self._journal, p, turn_id, custom_id, data))
            applied.append((turn_id, custom_id, data))
        await self._commit(p, records)
        self._forget(p, record)
        self.metrics.batch(str(state))
        self.metrics.call("dropped", dropped)
        self.metrics.call("resumed", sum(1 for _, _, d in applied if "response" in d))
        self.metrics.waited(time.time() - record.created_ms / 1000)
        for turn_id, custom_id, data in applied:
            with contextlib.suppress(Exception):  # durable: a restore applies it
                self._parked.batch_committed(p, turn_id, custom_id, data)

    def _forget(self, p: int, record: BatchRecord) -> None:
        ps, lane = self._parts.get(p), self._lanes.get(p)
        if ps is not None:
            ps.journal.batches.pop(record.tag, None)
        if lane is not None:
            lane.next_poll.pop(record.tag, None)
            lane.in_batch.difference_update(c for c, _ in record.calls)


def _outcome_data(
    record: BatchRecord, state: BatchState, outcome: BatchOutcome | None, error: str | None
) -> dict[str, Any]:
    """What a call's outcome journals: its response, or why it has none."""
    data: dict[str, Any] = {"batch_id": record.batch_id, "tag": record.tag}
    if outcome is not None and outcome.response is not None:
        data["response"] = outcome.response.model_dump(mode="json")
    elif outcome is not None:
        data["kind"] = str(outcome.kind)
        data["error"] = outcome.error or f"the call {outcome.kind} in batch {state}"
    else:
        data["error"] = f"batch {state}" + (f": {error}" if error else ": no result for the call")
    return data
