"""Group commit: steps that become durable while a commit is in flight ride the next one.

With no commit in flight a step commits at once, so latency stays near one commit; under
load many turns share each transaction, so throughput grows with load. Each commit holds
the records, the progress record of every turn it touches, and the input offsets.

A record the broker refuses (its delivery failed) aborts its whole transaction. Such a
record is bounded: the next commit waits a backoff that doubles with each failure, and a
turn whose records failed ``max_delivery_attempts`` commits in a row is ended with
``record_undeliverable`` instead of being rerun; a record of no turn is replaced by a dead
letter that names it. A record ``produce()`` itself refused (too large), or one bound for
a topic the broker denies this principal WRITE on (``TOPIC_AUTHORIZATION_FAILED``), would
fail every try alike: that is its last strike at once. A turn ended for a denied topic
writes, in its ending, a dead letter in place of each record bound there (a forged
sub-agent lineage names a parent's replies topic this worker may not write: its ending
must not try the same topic again). Either way the partition moves on.

A turn's terminal records carry its input offset: ``finished_offsets`` gives the offsets
as if the turns finishing in the batch were done, so the end of a turn and the end of its
input are one transaction (as a hand-written read-process-write loop commits them), not a
commit for the records and a second one for the offset. Offsets sent only ever move
forward: until the worker marks such a turn done, its own watermark still holds it.

The buffer is bounded: past ``max_pending_records`` a turn whose slow model call returned
waits (``room``) before it writes its deltas and response, in arrival order, until a commit
takes the buffer. Thousands of turns whose model calls return together would otherwise
build all their records at once, and the allocator keeps that high-water mark for good.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field

from pyrula_stream.durable.turn import TurnRuntime
from pyrula_stream.kafka.transactions import (
    FailedDelivery,
    Offsets,
    TransactionAborted,
    describe_failures,
)
from pyrula_stream.objects.resolver import PayloadStores
from pyrula_stream.observability.telemetry import WorkerTelemetry
from pyrula_stream.wire.records import OutRecord, latest_only

log = logging.getLogger(__name__)

WriteBatch = Callable[[list[OutRecord], Offsets], Awaitable[None]]

DELIVERY_BACKOFF_S = (0.2, 5.0)
"""First and longest pause before the commit after one whose records failed delivery."""

NOT_THE_RECORD = frozenset(
    {"_PURGE_QUEUE", "_PURGE_INFLIGHT", "_MSG_TIMED_OUT", "_TIMED_OUT", "_TRANSPORT"}
)
"""Delivery errors that say nothing against the record itself: dropped because another
record of the batch failed, or not sent in time (a broker away: waiting is right, and the
producer is replaced after each, so a stale one cannot keep failing them)."""


@dataclass
class _Batch:
    records: list[OutRecord] = field(default_factory=list)
    owners: list[str | None] = field(default_factory=list)
    """Who wrote each of ``records`` (a turn id; ``None``: no turn), side by side: a
    pair per record was a tuple per record alive until its commit."""
    waiters: list[tuple[str | None, asyncio.Future[None]]] = field(default_factory=list)
    futures: dict[str, asyncio.Future[None]] = field(default_factory=dict)
    """Each turn's one future in this batch: what it writes here shares one fate (commit,
    abort or purge), so every ``durable`` call of the turn gets the same future."""
    turns: dict[str, TurnRuntime] = field(default_factory=dict)
    fence: bool = False

    def empty(self) -> bool:
        return not self.records and not self.waiters


def blamed(failed: tuple[FailedDelivery, ...]) -> list[FailedDelivery]:
    """The failures that are the record's own: the broker refused it, or it names a topic
    or partition that is not there."""
    return [f for f in failed if f.code not in NOT_THE_RECORD]


@dataclass
class CommitStats:
    commits: int = 0
    records: int = 0
    largest: int = 0
    """The most records one commit sent."""
    held: int = 0
    """Model calls that waited for room in the buffer."""
    aborts: int = 0
    seconds: float = 0.0


ABORT_RETRY_S = 0.1
"""After an abort, how soon records that someone waits for are committed again."""

OBJECT_STORE_BACKOFF_S = 1.0
"""After an object store refused a put, how long before the aborted turns commit again."""

CHAOS_KILL_ENV = "PYRULA_CHAOS_KILL_AFTER_OBJECTS"
"""A share (0..1) of commits that store objects after which the worker SIGKILLs itself,
before the transaction: the chaos harness's kill point between the object write and the
commit (``make chaos ARGS=--large``). Unset in any real deployment."""


def _chaos_kill_share() -> float:
    try:
        return max(0.0, min(1.0, float(os.environ.get(CHAOS_KILL_ENV, "0") or 0)))
    except ValueError:
        return 0.0


class GroupCommitter:
    """Buffers turn records and commits them in batches, one batch in flight at a time.

    ``on_committed`` hears the input offsets each successful commit made durable (what a
    crash can no longer re-read), so the worker can forget what lies below them, and the
    turns whose terminal records the commit held (``finished_offsets`` may have passed
    their inputs too).
    """

    def __init__(
        self,
        write: WriteBatch,
        offsets: Callable[[], Offsets],
        on_abort: Callable[[set[str]], None],
        *,
        interval_s: float = 0.0,
        linger_s: float = 0.0,
        telemetry: WorkerTelemetry,
        on_committed: Callable[[Offsets, Collection[str]], None] | None = None,
        on_undeliverable: Callable[[str, str], None] | None = None,
        dead_letter: Callable[[OutRecord, str], OutRecord | None] | None = None,
        max_delivery_attempts: int = 5,
        max_pending_records: int = 0,
        payloads: PayloadStores | None = None,
        finished_offsets: Callable[[Collection[str]], Offsets] | None = None,
    ) -> None:
        self._write = write
        self._finished_offsets = finished_offsets
        """``offsets`` as if the given finishing turns were done (``None``: ``offsets``)."""
        self._payloads = payloads
        """Where values records carry by reference are put before their commit."""
        self._kill_share = _chaos_kill_share()
        self._max_pending = max_pending_records
        """0: unbounded."""
        self._room_waiters: deque[asyncio.Future[None]] = deque()
        self._commit_s = 0.0
        """A running mean of how long a commit takes (what paces a step that awaits one)."""
        self._records_per_waiter = 8.0
        """A running mean of the records a commit took per waiter let go before it: how
        many waiters fit in the room left."""
        self._released = 0
        """Waiters let go since the last commit took the buffer."""
        self._on_undeliverable = on_undeliverable
        self._dead_letter = dead_letter
        self._max_attempts = max(1, max_delivery_attempts)
        self._turn_strikes: dict[str, int] = {}
        """Commits in a row in which a record of the turn failed delivery."""
        self._record_strikes: dict[int, tuple[OutRecord, int]] = {}
        """The same for records of no turn, by identity (they ride the next commit as is)."""
        self._refused_at_produce: set[int] = set()
        """Records of no turn among those that ``produce()`` itself refused."""
        self._barred: dict[str, dict[str, str]] = {}
        """Turns ended for a topic the broker denies: each such topic, with why. What the
        turn's ending writes there is dead-lettered instead (``_bar``)."""
        self._backoff_s = 0.0
        self._telemetry = telemetry
        self._on_committed = on_committed
        self._offsets = offsets
        self._on_abort = on_abort
        self._interval_s = interval_s
        self._linger_s = linger_s
        self._linger: asyncio.TimerHandle | None = None
        self._pending = _Batch()
        self._wake = asyncio.Event()
        self._last_offsets: Offsets = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self._looped = asyncio.Event()
        self.stats = CommitStats()

    # -- what turns call ------------------------------------------------------------------

    def add(self, turn: TurnRuntime, records: list[OutRecord], *, urgent: bool = False) -> None:
        """Records no one waits for (events while the turn runs, a step's entry): they
        linger up to ``linger_s`` for a commit that someone does wait for, so a turn's
        last delta and its terminal event share one commit instead of queueing."""
        turn_id = turn.turn_id
        barred = self._barred.get(turn_id)
        if barred is not None:
            records = self._bar(records, barred)
        self._pending.records += records
        self._pending.owners += [turn_id] * len(records)
        self._pending.turns[turn_id] = turn
        if self._max_pending and len(self._pending.records) >= self._max_pending:
            urgent = True
        if urgent or not self._linger_s:
            self._wake.set()
        elif self._linger is None and not self._wake.is_set():
            self._linger = asyncio.get_running_loop().call_later(self._linger_s, self._wake.set)

    def durable(
        self, turn: TurnRuntime, records: list[OutRecord], *, urgent: bool = True
    ) -> asyncio.Future[None]:
        """``records`` and a future of their commit (the turn's one future in the batch
        they join); ``urgent=False``: no one awaits it yet (a step's entry), so it may
        linger (``hurry`` when someone starts to)."""
        self.add(turn, records, urgent=urgent)
        batch = self._pending
        fut = batch.futures.get(turn.turn_id)
        if fut is None or fut.done():
            fut = asyncio.get_running_loop().create_future()
            batch.futures[turn.turn_id] = fut
            batch.waiters.append((turn.turn_id, fut))
        return fut

    def hurry(self) -> None:
        """Someone waits for lingering records: commit them now."""
        self._wake.set()

    def room(self, waited_s: float) -> asyncio.Future[None] | None:
        """``None`` while the buffer has room (the common case: nothing to await), else a
        future that resolves, in arrival order, once a commit has taken the buffer.

        A call that waited its model less than two commits take is ``None`` too: such
        steps are paced by the commits they await, and holding them back only splits a
        busy worker's rounds over more commits. The bursts come from slow calls that
        return together, which nothing paced while they waited."""
        if (
            not self._max_pending
            or waited_s < 2 * self._commit_s
            or (not self._room_waiters and len(self._pending.records) < self._max_pending)
        ):
            return None
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._room_waiters.append(fut)
        self.stats.held += 1
        self._wake.set()
        return fut

    def _release_room(self) -> None:
        """Let as many waiting turns go on as the buffer has room for, the longest waiting
        first (at least one, so waiters always move on)."""
        free = float(self._max_pending - len(self._pending.records))
        while self._room_waiters and free > 0:
            fut = self._room_waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                self._released += 1
                free -= self._records_per_waiter

    def _took(self, batch: _Batch) -> None:
        """A commit took ``batch``: learn how many records a waiter let go brings, and let
        the next waiters go."""
        if self._released:
            taken = len(batch.records) / self._released
            self._records_per_waiter += (max(1.0, taken) - self._records_per_waiter) / 4
            self._released = 0
        self._release_room()

    def add_records(self, records: list[OutRecord], *, wake: bool = True) -> None:
        """Records that belong to no turn (dead letters, housekeeping tombstones).

        ``wake=False``: they ride the next commit something else starts (or ``flush``),
        for cleanup no one waits for: a tombstone per finished turn must not cost a
        commit of its own."""
        self._pending.records += records
        self._pending.owners += [None] * len(records)
        if wake:
            self._wake.set()

    def durable_records(self, owner: str, records: list[OutRecord]) -> asyncio.Future[None]:
        """Records of no turn that must commit with every owned partition's input offset
        (a reply and its read position): the offsets carry the group generation, so a
        worker that lost the partition is fenced instead of writing them. An abort keeps
        them for the next commit; ``purge({owner})`` drops them (the partition was
        revoked). The future resolves when they are durable."""
        self._pending.records += records
        self._pending.owners += [owner] * len(records)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.waiters.append((owner, fut))
        self._pending.fence = True
        self._wake.set()
        return fut

    def offsets_changed(self) -> None:
        """A turn's input is done: commit its offset, unless a commit already sent it
        (the turn's terminal commit, which carries it)."""
        if self._offsets_dirty():
            self._wake.set()

    def purge(self, turn_ids: set[str]) -> None:
        """Drop buffered records of turns this worker no longer owns (never committed)."""
        batch = self._pending
        kept = [i for i, t in enumerate(batch.owners) if t not in turn_ids]
        if len(kept) < len(batch.records):
            batch.records = [batch.records[i] for i in kept]
            batch.owners = [batch.owners[i] for i in kept]
        for t, fut in batch.waiters:
            if t in turn_ids and not fut.done():
                fut.cancel()
        batch.waiters = [(t, f) for t, f in batch.waiters if t not in turn_ids]
        for t in turn_ids:
            batch.turns.pop(t, None)
            batch.futures.pop(t, None)
        self._release_room()

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
        last = self._last_offsets
        return any(k not in last or v > last[k] for k, v in self._offsets().items())

    def _forward(self, offsets: Offsets) -> Offsets:
        """``offsets``, none behind what a commit already sent: a terminal commit sends its
        turn's offset before the worker's watermark counts the turn done."""
        last = self._last_offsets
        return {k: max(v, last[k]) if k in last else v for k, v in offsets.items()}

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
            if self._backoff_s:
                await asyncio.sleep(self._backoff_s)
                self._backoff_s = 0.0
            if await self._commit_pending():
                last = time.monotonic()

    async def _commit_pending(self) -> bool:
        """Commit what is buffered and the changed offsets; True when a commit succeeded.

        A method of its own so that nothing of a committed batch (its records, its turns'
        runtimes) stays referenced by the loop while the worker waits for the next one.
        """
        batch, self._pending = self._pending, _Batch()
        finishing = [t for t, turn in batch.turns.items() if turn.finished]
        if finishing and self._finished_offsets is not None:
            offsets = self._forward(self._finished_offsets(finishing))
        else:
            offsets = self._forward(self._offsets())
        changed = {k: v for k, v in offsets.items() if self._last_offsets.get(k) != v}
        if self._room_waiters or self._released:
            self._took(batch)
        if self._linger is not None:  # what lingered rides this commit
            self._linger.cancel()
            self._linger = None
        if batch.fence:
            changed = dict(offsets)
        if batch.empty() and not changed:
            return False
        records = list(batch.records)
        owners = list(batch.owners)  # who wrote each, for a failure
        for turn_id, turn in batch.turns.items():
            if not turn.finished:
                records.append(turn.progress_record())
                owners.append(turn_id)
                turn.progress_sent = True
        sent = latest_only(records)
        if len(sent) < len(records):
            records = [records[i] for i in sent]
            owners = [owners[i] for i in sent]
        for record in records:
            record.materialize()
        seqs = {t: turn.next_seq for t, turn in batch.turns.items()}
        self._idle.clear()
        started = time.monotonic()
        observed = self._telemetry.commit((t.telemetry for t in batch.turns.values()), records)
        try:
            await self._store_objects(records)
            await self._write(records, changed)
        except TransactionAborted as aborted:
            self.stats.aborts += 1
            observed.aborted()
            given_up = self._count_failures(batch, records, owners, aborted.failed)
            # Records of no turn (dead letters, housekeeping) ride the next commit;
            # turn records are rebuilt by rerunning their turns from the journal.
            orphans: list[OutRecord] = []
            orphan_owners: list[str | None] = []
            for t, r in zip(batch.owners, batch.records, strict=True):
                letter = self._replacement(r) if t not in batch.turns else None
                if letter is not None:
                    orphans.append(letter)
                    orphan_owners.append(t)
            # What the aborted turns buffered since belongs to an attempt that restarts.
            self.purge(set(batch.turns))
            self._pending.records[:0] = orphans
            self._pending.owners[:0] = orphan_owners
            kept = [(t, f) for t, f in batch.waiters if t not in batch.turns]
            self._pending.waiters[:0] = kept
            self._pending.fence = self._pending.fence or batch.fence
            for t, fut in batch.waiters:
                if t in batch.turns and not fut.done():
                    fut.cancel()
            self._on_abort(set(batch.turns) - set(given_up))
            for turn_id, reason in given_up.items():
                assert self._on_undeliverable is not None
                self._on_undeliverable(turn_id, reason)
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
        for t, turn in batch.turns.items():
            if turn.finished:  # a turn's records may fail in a later commit than these
                self._turn_strikes.pop(t, None)
                self._barred.pop(t, None)
        if self._record_strikes:
            for r in batch.records:
                self._record_strikes.pop(id(r), None)
                self._refused_at_produce.discard(id(r))
        self.stats.commits += 1
        self.stats.records += len(records)
        self.stats.largest = max(self.stats.largest, len(records))
        took = time.monotonic() - started
        self.stats.seconds += took
        self._commit_s += (took - self._commit_s) / 4
        self._last_offsets.update(changed)
        if (changed or finishing) and self._on_committed is not None:
            self._on_committed(changed, finishing)
        for t, turn in batch.turns.items():
            turn.committed_seq = seqs[t]
        for _, fut in batch.waiters:
            if not fut.done():
                fut.set_result(None)
        return True

    async def _store_objects(self, records: list[OutRecord]) -> None:
        """Put the values ``records`` carry by reference in their store, off the event
        loop, before the transaction that sends the references: a crash in between leaves
        an orphan (the sweeper's), never a record that points at nothing. A store that
        refuses aborts the batch: its turns rerun from the journal, after a pause."""
        stored = [v for r in records for v in r.objects]
        if not stored:
            return
        if self._payloads is None:
            raise RuntimeError("records carry payload references but no object store is set")
        try:
            size = await asyncio.to_thread(self._payloads.put, stored)
        except Exception as exc:
            log.error("object store refused %d value(s): %s", len(stored), exc)
            self._backoff_s = max(self._backoff_s, OBJECT_STORE_BACKOFF_S)
            raise TransactionAborted(f"object store: {exc}") from exc
        self._telemetry.metrics.stored_objects(size)
        if self._kill_share and random.random() < self._kill_share:
            log.warning("%s: killing this worker between object write and commit", CHAOS_KILL_ENV)
            os.kill(os.getpid(), signal.SIGKILL)

    # -- records the broker refuses ---------------------------------------------------------

    def _count_failures(
        self,
        batch: _Batch,
        records: list[OutRecord],
        owners: list[str | None],
        failed: tuple[FailedDelivery, ...],
    ) -> dict[str, str]:
        """Count a strike for each owner of a failed record and set the backoff; the turns
        that reached ``max_delivery_attempts``, each with what failed (to end them).

        ``owners`` names the writer of each of the ``records`` sent (a turn id; a record of
        no turn is counted on itself, by identity, as it rides on as is).
        """
        own = blamed(failed)
        if not own:
            return {}
        by_turn: dict[str, list[FailedDelivery]] = {}
        refused: set[int] = set()  # records produce() refused: every try fails alike
        for f in own:
            owner = owners[f.index] if 0 <= f.index < len(owners) else None
            if owner is not None and owner in batch.turns:
                by_turn.setdefault(owner, []).append(f)
            elif 0 <= f.index < len(records):
                record = records[f.index]
                _, n = self._record_strikes.get(id(record), (record, 0))
                n = self._max_attempts if f.final else n + 1
                self._record_strikes[id(record)] = (record, n)
                if f.final:
                    refused.add(id(record))
                    self._refused_at_produce.add(id(record))
        given_up: dict[str, str] = {}
        for owner, failures in by_turn.items():
            strikes = self._turn_strikes.get(owner, 0) + 1
            at_produce = any(f.at_produce for f in failures)
            denied = [f for f in failures if f.denied]
            if at_produce or denied:
                strikes = max(strikes, self._max_attempts)
            self._turn_strikes[owner] = strikes
            if strikes >= self._max_attempts and self._on_undeliverable is not None:
                self._turn_strikes.pop(owner, None)
                if denied:
                    barred = self._barred.setdefault(owner, {})
                    for f in denied:
                        barred[f.topic] = f"the broker refused the turn's record for {f}"
                given_up[owner] = (
                    "the broker denies this worker WRITE on a topic of the turn"
                    if denied
                    else "produce() refused a record of the turn"
                    if at_produce
                    else f"{strikes} commits in a row failed to deliver a record of the turn"
                ) + f": {describe_failures(failures)}"
        worst = max(
            [
                1,
                *self._turn_strikes.values(),
                *(n for k, (_, n) in self._record_strikes.items() if k not in refused),
            ]
        )
        first, longest = DELIVERY_BACKOFF_S
        self._backoff_s = min(longest, first * 2 ** (worst - 1))
        log.warning(
            "%d record(s) failed delivery (%s); next commit in %.1fs%s",
            len(own),
            describe_failures(own),
            self._backoff_s,
            f"; ending turns {sorted(given_up)} with record_undeliverable" if given_up else "",
        )
        return given_up

    def _bar(self, records: list[OutRecord], barred: dict[str, str]) -> list[OutRecord]:
        """``records`` of a turn ended for a denied topic, with a dead letter in place of
        each bound for such a topic (none, for one that is itself a dead letter)."""
        out: list[OutRecord] = []
        for record in records:
            reason = barred.get(record.topic)
            if reason is None:
                out.append(record)
                continue
            letter = self._dead_letter(record, reason) if self._dead_letter is not None else None
            log.error("dead-lettered a turn's record for %s: %s", record.topic, reason)
            if letter is not None:
                out.append(letter)
        return out

    def _replacement(self, record: OutRecord) -> OutRecord | None:
        """A record of no turn that failed ``max_delivery_attempts`` commits is replaced by
        its dead letter (``None``: dropped, when it is itself one); else kept as it is."""
        entry = self._record_strikes.get(id(record))
        if entry is None or entry[1] < self._max_attempts:
            return record
        del self._record_strikes[id(record)]
        reason = (
            f"produce() refused this record for {record.topic} (partition "
            f"{record.partition}); its every try would fail alike"
            if id(record) in self._refused_at_produce
            else f"{entry[1]} commits in a row failed to deliver this record to "
            f"{record.topic} (partition {record.partition})"
        )
        self._refused_at_produce.discard(id(record))
        letter = self._dead_letter(record, reason) if self._dead_letter is not None else None
        if letter is None:
            log.error("dropped a record of no turn for %s: %s", record.topic, reason)
        else:
            log.error("dead-lettered a record of no turn for %s: %s", record.topic, reason)
        return letter
