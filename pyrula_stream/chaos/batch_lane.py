"""``--batch``: the chaos turns' model calls go by the batch lane, to a provider process
that outlives the workers the monkey kills.

The provider is ``python -m pyrula_stream.testing_servers openai`` (OpenAI's Batch API
wire format, through the official SDK in ``OpenAIBatchClient``), answering as the chaos
model server does (``respond``: the tool call, then the answer) after ``delay_s``, and
logging every call it is submitted before it answers the submit: the witness of calls
submitted twice. The agent's lane (``chaos_lane``) batches every call, flushes a batch
after ``MAX_AGE_S`` and polls every ``POLL_S``, so a backlog keeps batches in every
state (being built, submitted, polled, resumed) while the kills land.

Checks (``check_batches``), all from the outside:

- ``batch_calls_submitted_twice``: a call's id (behind its batch's tag) more than once
  in the provider's log;
- ``batch_responses_applied_twice``: a call's outcome journaled more than once, or its
  response journaled as more than one model step;
- ``cost_counted_twice``: a model call with more than one ``llm:complete`` event, or a
  turn whose result counts more model calls than it has;
Besides the monkey's kills, ``BatchKiller`` SIGKILLs a partition's owner right after one
of its batches is journaled (``TAG_KILLS`` times): the window where a crash could submit
the calls twice.

- ``kills_during_batches`` (at least ``MIN_KILLS_DURING_BATCHES``): kills that landed
  while a batch was journaled and its outcomes not yet; ``kills_by_batch_phase`` says how
  many landed while some batch was being submitted (journaled, no provider id yet),
  polled, or had its turns resuming (its outcomes journaled in the last 2 s).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pyrula_stream.agent.definition import AgentTopics
from pyrula_stream.chaos.model_server import MODEL, TURN_PATTERN, answer_for
from pyrula_stream.chaos.monkey import KillRecord, Monkey
from pyrula_stream.chaos.processes import Managed, child_env
from pyrula_stream.chaos.verify import Findings, Record, readable_events
from pyrula_stream.kafka.admin import DEFAULT_PREFIX, group_assignment
from pyrula_stream.kafka.io import PartitionReader
from pyrula_stream.wire import serde
from pyrula_stream.wire.batches import BATCH_RESULT_KIND, call_id, is_batch_key
from pyrula_stream.wire.events import EventType
from pyrula_stream.wire.journal_keys import BATCH_RESULT

BATCH_URL_ENV = "PYRULA_CHAOS_BATCH_URL"
"""Set (the provider's ``/v1`` URL): the chaos agent's calls go by the batch lane."""
DELAY_S = 2.0
"""Seconds from a batch's submit to its end at the provider."""
MAX_AGE_S = 1.0
POLL_S = 0.5
BATCH_KEYS = (
    "batch_calls_submitted_twice",
    "batch_responses_applied_twice",
    "cost_counted_twice",
)
MIN_KILLS_DURING_BATCHES = 4
TAG_KILLS = 3
"""Kills aimed at the window between a batch's journaling and its provider id's."""
RESUME_WINDOW_MS = 2000
"""A kill this soon after a batch's outcomes were journaled lands while its turns resume."""
TOOL_NAME = "record_effect"


def respond(prompt: Any) -> Any:
    """The chaos model's answer to a batched (or live) call: ``record_effect`` first,
    then the text the harness checks results against."""
    from pyrula_stream.testing_servers.answers import Answer, ToolCall

    match = TURN_PATTERN.search(prompt.user_text)
    turn = match.group(1) if match else "unknown"
    if prompt.assistant_messages == 0:
        call = ToolCall(f"call_{turn[:12]}_0", TOOL_NAME, {"turn": turn})
        return Answer(tool_calls=(call,))
    return Answer(text=answer_for(turn))


def chaos_lane() -> Any:
    """The chaos agent's ``BatchLane`` when ``$PYRULA_CHAOS_BATCH_URL`` is set, else
    ``None``."""
    url = os.environ.get(BATCH_URL_ENV)
    if not url:
        return None
    from pyrula_stream.agent.batch import BatchLane
    from pyrula_stream.llm import OpenAILLM
    from pyrula_stream.llm.openai_batch import OpenAIBatchClient

    llm = OpenAILLM(MODEL, base_url=url, api_key="chaos-no-key", llm_call_timeout=30.0)
    return BatchLane(
        OpenAIBatchClient(llm), when="always", max_age_s=MAX_AGE_S, poll_interval_s=POLL_S
    )


class BatchProvider(Managed):
    """The OpenAI batch server as its own process (its batches outlive the workers)."""

    def __init__(self, run_dir: Path, log: Path, delay_s: float = DELAY_S) -> None:
        argv = [
            sys.executable,
            "-m",
            "pyrula_stream.testing_servers",
            "openai",
            "--delay",
            str(delay_s),
            "--log",
            str(log),
            "--responder",
            "pyrula_stream.chaos.batch_lane:respond",
        ]
        super().__init__("batch-provider", argv, child_env({}), run_dir / "batch_provider.log")
        self.call_log = log

    def start_and_wait(self) -> str:
        self.start(stdout=subprocess.PIPE)
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline().decode().strip()
        if not line.startswith("PORT "):
            self.kill()
            raise RuntimeError(f"batch provider did not start (said {line!r}); see {self.log_path}")
        return f"http://127.0.0.1:{int(line.split()[1])}/v1"


def check_batches(
    turn_ids: Iterable[str],
    journal: list[Record],
    events: list[Record],
    provider_log: list[dict[str, Any]],
    kills: list[KillRecord],
    f: Findings,
) -> list[dict[str, Any]]:
    """The gated counts above; returns the batched calls as the model-call check reads
    them (``turn``, ``call``, ``ts``), mapped through the journal."""
    f.zero(*BATCH_KEYS, "kills_during_batches", "batch_failures")
    wanted = set(turn_ids)
    submitted = Counter(
        call_id(str(c["custom_id"])) for c in provider_log if c.get("via") == "batch"
    )
    for cid, n in submitted.items():
        if n > 1:
            f.add("batch_calls_submitted_twice", n - 1, example=f"call {cid} submitted {n} times")
    f.counts["batch_calls_submitted"] = sum(submitted.values())
    results: Counter[tuple[str, str]] = Counter()
    steps_of: dict[str, set[tuple[str, int]]] = defaultdict(set)
    calls_of: dict[str, tuple[str, int]] = {}
    """Each queued call's turn and index, from the park records that queued it."""
    opened: dict[str, int] = {}
    submitted_ms: dict[str, int] = {}
    intervals: list[tuple[int, int]] = []
    phases: list[tuple[str, int, int]] = []
    """(phase, from, to) of every batch: journaled and not yet submitted, submitted and
    polled, its outcomes just applied (``RESUME_WINDOW_MS`` after)."""
    batches = 0
    for rec in sorted(journal, key=lambda r: (r.partition, r.offset)):
        if is_batch_key(rec.key):
            if rec.value is not None and rec.key not in opened:
                opened[rec.key] = rec.ts_ms
                batches += 1
            elif rec.value is not None and rec.key not in submitted_ms:
                submitted_ms[rec.key] = rec.ts_ms
            elif rec.value is None and rec.key in opened:
                start = opened.pop(rec.key)
                sent = submitted_ms.pop(rec.key, start)
                intervals.append((start, rec.ts_ms))
                phases += [
                    ("submitting", start, sent),
                    ("polling", sent, rec.ts_ms),
                    ("resuming", rec.ts_ms, rec.ts_ms + RESUME_WINDOW_MS),
                ]
            continue
        if rec.value is None:
            continue
        turn, _, suffix = rec.key.rpartition("/")
        if turn not in wanted:
            continue
        entry = serde.decode_journal_entry(rec.value, rec.headers)
        if suffix.startswith(BATCH_RESULT) and entry.kind == BATCH_RESULT_KIND:
            results[(turn, suffix[len(BATCH_RESULT) :])] += 1
            if "error" in entry.data:
                f.add("batch_failures", example=f"{turn}: {entry.data['error']}")
        elif suffix.isdigit() and entry.kind == "llm" and isinstance(entry.data.get("batch"), dict):
            cid = str(entry.data["batch"].get("custom_id"))
            steps_of[cid].add((turn, int(entry.data.get("call", -1))))
        elif suffix == "park" and isinstance(entry.data.get("batch"), dict):
            queued = entry.data["batch"]
            calls_of[str(queued.get("custom_id"))] = (turn, int(queued.get("call", -1)))
    end = int(time.time() * 1000)
    intervals += [(start, end) for start in opened.values()]
    for (turn, cid), n in results.items():
        if n > 1:
            f.add("batch_responses_applied_twice", n - 1, example=f"{turn} {cid}: {n} outcomes")
    for cid, steps in steps_of.items():
        if len(steps) > 1:
            f.add("batch_responses_applied_twice", len(steps) - 1, example=f"{cid}: {steps}")
    f.counts["batches"] = batches
    f.counts["batch_steps_journaled"] = len(steps_of)
    f.counts["kills_during_batches"] = sum(
        1 for k in kills if any(a <= k.wall_ts * 1000 <= b for a, b in intervals)
    )
    f.counts["kills_after_batch_tag"] = sum(1 for k in kills if k.kind == "after_batch_tag")
    f.counts["kills_by_batch_phase"] = {
        phase: sum(
            1 for k in kills if any(p == phase and a <= k.wall_ts * 1000 < b for p, a, b in phases)
        )
        for phase in ("submitting", "polling", "resuming")
    }
    _check_costs(wanted, events, f)
    out: list[dict[str, Any]] = []
    for c in provider_log:
        queued = calls_of.get(call_id(str(c.get("custom_id")))) if c.get("via") == "batch" else None
        if queued is not None:
            out.append({"turn": queued[0], "call": queued[1], "ts": float(c["ts"])})
    return out


def _check_costs(wanted: set[str], events: list[Record], f: Findings) -> None:
    """Each model call billed once: one ``llm:complete`` per call, and the result's count
    of model calls equal to the calls made."""
    completes: dict[str, Counter[int]] = defaultdict(Counter)
    seen: set[tuple[str, int]] = set()
    counted: dict[str, int] = {}
    batched = 0
    for event in readable_events(events):
        if event.turn_id not in wanted or (event.turn_id, event.seq) in seen:
            continue  # a duplicate event is duplicate_events' finding
        seen.add((event.turn_id, event.seq))
        if event.type == EventType.LLM_COMPLETE:
            completes[event.turn_id][int(event.data.get("call", -1))] += 1
            batched += 1 if event.data.get("batch") else 0
        elif event.type == EventType.RUN_COMPLETE:
            usage = event.data.get("usage") or {}
            counted[event.turn_id] = int(usage.get("llm_calls", 0))
    for turn, calls in completes.items():
        doubled = sum(n - 1 for n in calls.values() if n > 1)
        if doubled:
            f.add("cost_counted_twice", doubled, example=f"{turn}: llm:complete {dict(calls)}")
        elif turn in counted and counted[turn] > len(calls):
            f.add(
                "cost_counted_twice",
                counted[turn] - len(calls),
                example=f"{turn}: result counts {counted[turn]} calls, made {len(calls)}",
            )
    f.counts["model_calls_by_batch"] = batched


class BatchKiller(threading.Thread):
    """Kills the owner of a partition right after one of its batches is journaled, before
    its provider id is: the window where a crash could submit the batch's calls twice.

    Random kills rarely land in it (a submit takes milliseconds), so this thread follows
    the journal (read_committed) and, for the first record of a ``batch/<tag>`` key (the
    one written before the submit), SIGKILLs the worker that owns its partition (a random
    live one when the owner is unknown) and restarts it: at most ``kills`` times,
    ``min_gap_s`` apart so the group settles between them.
    """

    def __init__(
        self,
        bootstrap: str,
        agent: str,
        partitions: int,
        monkey: Monkey,
        rng: random.Random,
        all_done: Callable[[], bool],
        *,
        kills: int = TAG_KILLS,
        min_gap_s: float = 5.0,
    ) -> None:
        super().__init__(name="chaos-batch-killer", daemon=True)
        self.bootstrap, self.monkey, self.rng, self.all_done = bootstrap, monkey, rng, all_done
        self.max_kills, self.min_gap_s = kills, min_gap_s
        topics = AgentTopics.for_agent(agent, DEFAULT_PREFIX)
        self.turns = topics.turns
        self.group = f"{DEFAULT_PREFIX}.{agent}.workers"
        self.kills = 0
        self.errors: list[str] = []
        self._seen: set[str] = set()
        self._halt = threading.Event()
        self._reader = PartitionReader(
            bootstrap, topics.journal, client_id=f"chaos-batches-{uuid.uuid4().hex[:6]}"
        )
        self._reader.seek_partitions(list(range(partitions)), int(time.time() * 1000))

    def run(self) -> None:
        try:
            while not self._halt.is_set() and self.kills < self.max_kills:
                try:
                    records = list(self._reader.poll(0.02))
                except Exception as exc:  # the broker may be busy: read on
                    self.errors.append(repr(exc))
                    self._halt.wait(0.5)
                    continue
                for key, value, _, partition, _ in records:
                    name = (key or b"").decode(errors="replace")
                    if value is None or not is_batch_key(name) or name in self._seen:
                        continue
                    self._seen.add(name)
                    self._kill_owner(partition, name)
        finally:
            self._reader.close()

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(30)

    def _kill_owner(self, partition: int, key: str) -> None:
        last = self.monkey.kills[-1].wall_ts if self.monkey.kills else 0.0
        if time.time() - last < self.min_gap_s or self.all_done() or self._halt.is_set():
            return
        owners = group_assignment(self.bootstrap, self.group, self.turns, 3.0) or {}
        workers = self.monkey.workers
        owner = next((w for w in workers if w.worker_id == owners.get(partition)), None)
        victim = owner or self.rng.choice([w for w in workers if w.alive()] or workers)
        self.kills += 1
        detail = f"{key} journaled at partition {partition}, {'owner' if owner else 'random'}"
        self.monkey.kill_and_restart(victim, "after_batch_tag", detail)
