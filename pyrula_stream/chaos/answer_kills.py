"""``--approvals``' targeted kill: SIGKILL a turn's worker right after its answer commits.

Random kills rarely land in the short window between an answer's commit and the gated
tool's start, which is where an answer could be lost (the tool never runs) or doubled
(it runs twice). So for a share of the answers the reviewer marks the turn as a target
before it sends; this thread follows the journal (read_committed) and, the moment the
answer's signal record is visible (the record ``SignalReceipt.accepted`` waits for), it
SIGKILLs the worker that owns the turn's partition (the consumer group's member whose
``client.id`` is the worker id; a random live worker when the owner is unknown, e.g.
mid-rebalance) and restarts it. Kills are spaced ``min_gap_s`` apart so the group can
settle between them (each takes up to a session timeout).

Afterwards ``kills_after_answer`` counts the targeted kills that landed before the call
went on: before the first committed ``tool:start`` of the gated tool and its first effect
(an approval), or before its denied ``tool:result`` (a rejection).
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from pyrula_stream.agent.definition import AgentTopics
from pyrula_stream.chaos.effects import read_effects
from pyrula_stream.chaos.monkey import Monkey
from pyrula_stream.chaos.processes import Worker
from pyrula_stream.chaos.verify import Findings, Record
from pyrula_stream.kafka.admin import DEFAULT_PREFIX, group_assignment
from pyrula_stream.kafka.io import PartitionReader
from pyrula_stream.kafka.partitioner import partition_for
from pyrula_stream.wire.events import EventType, decode_event
from pyrula_stream.wire.journal_keys import SIGNAL

TARGET_SHARE = 0.25
"""The share of answers whose turn's worker is killed once the answer is taken."""
GATED_TOOL = "gated_effect"


@dataclass
class AnswerKill:
    turn_id: str
    worker: str
    owner: bool
    """Whether the victim was the partition's owner as the group described it."""
    wall_ts: float


class AnswerKiller(threading.Thread):
    """Follows the journal and kills a target turn's worker when its answer shows."""

    def __init__(
        self,
        bootstrap: str,
        agent: str,
        partitions: int,
        monkey: Monkey,
        rng: random.Random,
        all_done: Callable[[], bool],
        *,
        min_gap_s: float = 4.0,
    ) -> None:
        super().__init__(name="chaos-answer-killer", daemon=True)
        self.bootstrap, self.partitions, self.monkey = bootstrap, partitions, monkey
        self.rng, self.all_done, self.min_gap_s = rng, all_done, min_gap_s
        topics = AgentTopics.for_agent(agent, DEFAULT_PREFIX)
        self.journal, self.turns = topics.journal, topics.turns
        self.group = f"{DEFAULT_PREFIX}.{agent}.workers"
        self.kills: list[AnswerKill] = []
        self.errors: list[str] = []
        """Reads of the journal that failed (reported as ``answer_kill_errors``)."""
        self._targets: set[str] = set()
        self._owners: dict[int, str] = {}
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._reader = PartitionReader(
            bootstrap, self.journal, client_id=f"chaos-answers-{uuid.uuid4().hex[:6]}"
        )
        self._reader.seek_partitions(list(range(partitions)), int(time.time() * 1000))
        self._refresher = threading.Thread(
            target=self._refresh_owners, name="chaos-owners", daemon=True
        )

    def target(self, turn_id: str) -> None:
        """Called by the reviewer before it sends the answer of ``turn_id``."""
        with self._lock:
            self._targets.add(turn_id)

    def untarget(self, turn_id: str) -> None:
        with self._lock:
            self._targets.discard(turn_id)

    def run(self) -> None:
        self._refresher.start()
        try:
            while not self._halt.is_set():
                try:
                    records = list(self._reader.poll(0.02))
                except Exception as exc:  # the broker may be restarting: read on
                    self.errors.append(repr(exc))
                    self._halt.wait(0.5)
                    continue
                for key, value, _, _, _ in records:
                    turn_id, _, suffix = (key or b"").decode(errors="replace").rpartition("/")
                    if value is None or not suffix.startswith(SIGNAL):
                        continue
                    with self._lock:
                        hit = turn_id in self._targets
                        self._targets.discard(turn_id)
                    if hit and not self._halt.is_set():
                        self._kill_owner(turn_id)
        finally:
            self._reader.close()

    def stop(self) -> None:
        self._halt.set()
        for t in (self, self._refresher):
            if t.is_alive():
                t.join(30)

    def _refresh_owners(self) -> None:
        """Keeps the partition owners fresh off the kill path (a describe takes a while)."""
        while not self._halt.wait(0.5):
            owners = group_assignment(self.bootstrap, self.group, self.turns, 3.0)
            with self._lock:
                self._owners = owners or {}

    def _kill_owner(self, turn_id: str) -> None:
        last = self.monkey.kills[-1].wall_ts if self.monkey.kills else 0.0
        if time.time() - last < self.min_gap_s or self.all_done():
            return
        partition = partition_for(turn_id.encode(), self.partitions)
        with self._lock:
            owner_id = self._owners.get(partition)
        workers = self.monkey.workers
        owner = next((w for w in workers if w.worker_id == owner_id and w.alive()), None)
        victim: Worker = owner or self.rng.choice([w for w in workers if w.alive()] or workers)
        detail = f"answer of {turn_id} taken, {'owner' if owner else 'owner unknown'}"
        self.kills.append(AnswerKill(turn_id, victim.worker_id, owner is not None, time.time()))
        self.monkey.kill_and_restart(victim, "after_answer", detail)


def check_answer_kills(
    kills: list[AnswerKill],
    events: list[Record],
    gated_effects: str,
    f: Findings,
    errors: list[str] | None = None,
) -> None:
    """``kills_after_answer``: targeted kills that came before the call went on (see the
    module docstring); ``answer_kills`` all targeted kills, ``answer_kills_owner`` those
    that hit the partition's owner."""
    targets = {k.turn_id for k in kills}
    went_on: dict[str, int] = {}

    def mark(turn_id: str, ts_ms: int) -> None:
        went_on[turn_id] = min(ts_ms, went_on.get(turn_id, ts_ms))

    for rec in events:
        if rec.value is None:
            continue
        event = decode_event(rec.value, rec.headers)
        if event.turn_id not in targets:
            continue
        started = event.type == EventType.TOOL_START and event.data.get("tool") == GATED_TOOL
        denied = event.type == EventType.TOOL_RESULT and "approval" in event.data
        if started or (denied and event.data["approval"] != "approved"):
            mark(event.turn_id, rec.ts_ms)
    for effect in read_effects(gated_effects):
        if effect.get("turn") in targets and "ts" in effect:
            mark(str(effect["turn"]), int(float(effect["ts"]) * 1000))
    f.counts["answer_kills"] = len(kills)
    f.counts["answer_kill_errors"] = len(errors or [])
    f.counts["answer_kills_owner"] = sum(1 for k in kills if k.owner)
    f.counts["kills_after_answer"] = sum(
        1 for k in kills if k.turn_id in went_on and k.wall_ts * 1000 < went_on[k.turn_id]
    )
