"""``--approvals``: every chaos turn makes one gated call, and a reviewer answers it.

The chaos agent (``human_in_the_loop=True`` under ``PYRULA_CHAOS_APPROVALS=1``) calls
``gated_effect`` from its body after the tool loop; the call parks the turn until the
reviewer answers. The reviewer (a thread of the harness with its own
``KafkaAgentClient``) lists the open questions, picks approve or reject at random and
answers each once, after a random delay, while the monkey SIGKILLs workers; for a share
of the answers the worker that owns the turn is SIGKILLed the moment the answer commits
(``answer_kills.py``). Afterwards:

- ``approved_not_run``: approved calls whose tool never took effect;
- ``rejected_ran``: rejected (or expired) calls whose tool took effect;
- ``answers_lost``: answers the reviewer sent that no turn's ``tool:result`` reflects;
- ``answers_doubled``: questions with more than one answer journaled, or an answer
  refused as already answered, or a gated ``tool:result`` published twice.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyrula_stream.chaos.answer_kills import TARGET_SHARE, AnswerKiller
from pyrula_stream.chaos.effects import read_effects
from pyrula_stream.chaos.verify import Findings, Record
from pyrula_stream.client.kafka_client import KafkaAgentClient
from pyrula_stream.errors import MalformedRecordError, SignalRefused
from pyrula_stream.kafka.admin import DEFAULT_PREFIX
from pyrula_stream.wire.events import EventType, decode_event
from pyrula_stream.wire.journal_keys import SIGNAL
from pyrula_stream.wire.serde import decode_journal_entry

APPROVAL_KEYS = ("approved_not_run", "rejected_ran", "answers_lost", "answers_doubled")
REVIEWER = "chaos-reviewer"


class Reviewer(threading.Thread):
    """Answers every open question of the agent once: approve or reject at random."""

    def __init__(
        self,
        bootstrap: str,
        agent: str,
        log_path: Path,
        rng: random.Random,
        say: Callable[[str], None],
        *,
        max_delay_s: float = 2.0,
        killer: AnswerKiller | None = None,
    ) -> None:
        super().__init__(name="chaos-reviewer", daemon=True)
        self.bootstrap, self.agent, self.log_path = bootstrap, agent, log_path
        self.rng, self.say, self.max_delay_s = rng, say, max_delay_s
        self.killer = killer
        self.seen: set[tuple[str, str]] = set()
        self.errors: list[str] = []
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        try:
            asyncio.run(self._review())
        except BaseException as exc:  # a finding, reported by the check
            self.errors.append(repr(exc))

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(30)

    def _log(self, line: dict[str, Any]) -> None:
        with self._lock, self.log_path.open("a") as f:
            f.write(json.dumps(line) + "\n")

    async def _review(self) -> None:
        async with KafkaAgentClient(self.bootstrap, prefix=DEFAULT_PREFIX, timeout=120) as client:
            answering: set[asyncio.Task[None]] = set()
            while not self._halt.is_set():
                try:
                    questions = await client.pending(self.agent)
                except Exception as exc:  # the broker may be restarting: look again
                    self.say(f"  reviewer: listing the questions failed ({exc!r})")
                    questions = []
                for q in questions:
                    if (q.turn_id, q.key) in self.seen:
                        continue
                    self.seen.add((q.turn_id, q.key))
                    answer = "approve" if self.rng.random() < 0.5 else "reject"
                    delay = self.rng.uniform(0, self.max_delay_s)
                    if self.killer is not None and self.rng.random() < TARGET_SHARE:
                        self.killer.target(q.turn_id)
                    task = asyncio.create_task(
                        self._answer(client, q.turn_id, q.key, answer, delay)
                    )
                    answering.add(task)
                    task.add_done_callback(answering.discard)
                await asyncio.sleep(0.3)
            if answering:
                await asyncio.wait(answering, timeout=60)

    async def _answer(
        self, client: KafkaAgentClient, turn_id: str, key: str, answer: str, delay: float
    ) -> None:
        await asyncio.sleep(delay)
        line: dict[str, Any] = {"turn": turn_id, "key": key, "answer": answer}
        try:
            receipt = await client.resume(
                self.agent, turn_id, key, answer, reason="chaos", sender=REVIEWER, wait=10
            )
            line["accepted"] = receipt.accepted
        except SignalRefused as exc:
            line["refused"] = exc.reason
        except Exception as exc:  # not sent: the check counts it as lost
            line["error"] = repr(exc)
        if self.killer is not None and not line.get("accepted"):
            self.killer.untarget(turn_id)
        self._log(line)


def read_answers(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_approvals(
    ids: list[str],
    events: list[Record],
    journal: list[Record],
    answers: list[dict[str, Any]],
    gated_effects: str,
    reviewer_errors: list[str],
    f: Findings,
) -> None:
    """The four counts of the module docstring, from the topics and the files."""
    f.zero(*APPROVAL_KEYS)
    wanted = set(ids)
    applied = Counter(e["turn"] for e in read_effects(gated_effects) if e.get("applied"))
    verdicts: dict[str, list[str]] = {}
    seen_events: set[tuple[str, int]] = set()
    for rec in events:
        if rec.value is None:
            continue
        event = decode_event(rec.value, rec.headers)
        if event.type != EventType.TOOL_RESULT or "approval" not in event.data:
            continue
        if (event.turn_id, event.seq) in seen_events:
            continue  # duplicate_events counts those
        seen_events.add((event.turn_id, event.seq))
        verdicts.setdefault(event.turn_id, []).append(str(event.data["approval"]))
    journaled: Counter[tuple[str, str]] = Counter()
    ids_seen: set[str] = set()
    for rec in journal:
        turn_id, _, suffix = rec.key.rpartition("/")
        if rec.value is None or not suffix.startswith(SIGNAL) or suffix in ids_seen:
            continue
        ids_seen.add(suffix)
        try:
            data = decode_journal_entry(rec.value, {}).data
        except MalformedRecordError:
            continue
        if data.get("answer"):
            journaled[(turn_id, str(data.get("name")))] += 1
    for (turn_id, key), n in journaled.items():
        if n > 1:
            f.add("answers_doubled", 1, example=f"{turn_id} {key}: {n} answers journaled")
    for turn_id, got in verdicts.items():
        if len(got) > 1:
            f.add("answers_doubled", 1, example=f"{turn_id}: gated tool:result {got}")
    for a in answers:
        turn_id, answer = a["turn"], a["answer"]
        if turn_id not in wanted:
            continue
        if a.get("refused"):
            f.add("answers_doubled", 1, example=f"{turn_id}: refused ({a['refused']})")
            continue
        expected = "approved" if answer == "approve" else "rejected"
        got = verdicts.get(turn_id, [])
        if "error" in a or expected not in got:
            f.add("answers_lost", 1, example=f"{turn_id}: sent {answer}, results {got}")
        if answer == "approve" and applied[turn_id] == 0:
            f.add("approved_not_run", 1, example=f"{turn_id}: approved, no effect")
        if answer != "approve" and applied[turn_id] > 0:
            f.add("rejected_ran", 1, example=f"{turn_id}: rejected, took effect")
    for turn_id, n in applied.items():
        if n > 1:
            f.add("duplicate_effects", 1, example=f"{turn_id}: gated effect applied {n} times")
    for turn_id, got in verdicts.items():
        if "expired" in got and applied[turn_id] > 0:
            f.add("rejected_ran", 1, example=f"{turn_id}: expired, took effect")
    answered = {a["turn"] for a in answers}
    f.zero("questions_unanswered")  # reported, not gated: such a turn never ends (lost)
    for turn_id in sorted(wanted - answered):
        f.add("questions_unanswered", 1, example=f"{turn_id}: its question was never answered")
    f.counts["approvals_answered"] = len(answers)
    f.counts["approvals_approved"] = sum(1 for a in answers if a["answer"] == "approve")
    for error in reviewer_errors[:3]:
        f.add("answers_lost", 1, example=f"reviewer failed: {error}")
