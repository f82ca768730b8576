"""The chaos monkey: SIGKILLs workers on a schedule and restarts them with their old id.

Kinds of kill:

- ``after_effect``: watch the effects file and SIGKILL the worker that just applied a side
  effect, within about a millisecond: it dies between the tool's effect and the commit of
  the tool's journal entry, so the next owner runs the tool again (and must dedupe);
- ``after_answer`` (``--approvals``, made by ``answer_kills.AnswerKiller`` through
  ``kill_and_restart``): the owner of a turn's partition as soon as its answer commits;
- ``random``: a random live worker at a random moment (mid model call, mid commit, mid
  restore, ...);
- ``after_reply`` (``--subagents``): follow the parent agent's replies topic
  (read_committed) and SIGKILL every worker the moment a child's reply becomes visible:
  between the child's terminal commit and the parent's pickup of the reply, whichever
  process owns the parent's partition (each runs both agents).

Every kill is followed at once by a restart with the same ``--worker-id``, so the new
transactional producer fences the dead one and aborts its open transaction.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyrula_stream.chaos.hostile import KIND_HEADER
from pyrula_stream.chaos.processes import Worker
from pyrula_stream.kafka.io import PartitionReader


@dataclass
class KillRecord:
    at_s: float
    worker: str
    pid: int
    kind: str
    detail: str = ""
    wall_ts: float = 0.0


def kill_plan(
    kills: int, window_s: float, rng: random.Random, *, after_reply: bool = False
) -> list[tuple[float, str]]:
    """``kills`` moments spread over ``window_s``; every other one right after an effect
    (with ``after_reply``, every third one right after a sub-agent's reply instead)."""
    kinds = ("after_effect", "after_reply", "random") if after_reply else ("after_effect", "random")
    return [
        (window_s * (i + rng.uniform(0.15, 0.85)) / kills, kinds[i % len(kinds)])
        for i in range(kills)
    ]


class Monkey(threading.Thread):
    """Runs a kill plan (seconds from its start) against the workers."""

    def __init__(
        self,
        workers: list[Worker],
        plan: list[tuple[float, str]],
        effects: Path,
        rng: random.Random,
        all_done: Callable[[], bool],
        log: Callable[[str], None],
        lock: threading.Lock,
        replies: Callable[[], PartitionReader] | None = None,
    ) -> None:
        super().__init__(name="chaos-monkey", daemon=True)
        self.workers = workers
        self.plan = plan
        self.effects = effects
        self.rng = rng
        self.all_done = all_done
        self.log = log
        self.lock = lock
        self.replies = replies
        self.kills: list[KillRecord] = []
        self.found_dead: list[str] = []
        """Victims that had exited on their own before the kill (crashes, not kills)."""
        self.started = time.monotonic()
        self._halt = threading.Event()

    def run(self) -> None:
        # Opened here, in the monkey's thread (a consumer is not shared across threads),
        # and positioned at the end now, so only replies from later on count.
        watch = self.replies() if self.replies is not None else None
        try:
            self._run(watch)
        finally:
            if watch is not None:
                watch.close()

    def _run(self, watch: PartitionReader | None) -> None:
        for at, kind in self.plan:
            while time.monotonic() - self.started < at:
                if self._halt.wait(0.05) or self.all_done():
                    return
            victim: Worker | None = None
            detail = ""
            if kind == "after_reply" and watch is not None:
                detail = self._wait_for_reply(watch, 30.0)
                if detail:
                    self._kill_all_and_restart(kind, detail)
                    continue
                kind, detail = "random", "(no reply seen within 30s)"
            if kind == "after_effect":
                victim, detail = self._wait_for_effect(5.0)
                if victim is None:
                    kind, detail = "random", "(no effect logged within 5s)"
            if self._halt.is_set():
                return
            if victim is None:
                victim = self.rng.choice([w for w in self.workers if w.alive()] or self.workers)
            self.kill_and_restart(victim, kind, detail)

    def _wait_for_effect(self, timeout_s: float) -> tuple[Worker | None, str]:
        """Tail the effects file; return the live worker that applies the next effect."""
        try:
            offset = self.effects.stat().st_size
        except FileNotFoundError:
            offset = 0
        deadline = time.monotonic() + timeout_s
        buf = b""
        while time.monotonic() < deadline and not self._halt.is_set():
            try:
                with open(self.effects, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except FileNotFoundError:
                data = b""
            offset += len(data)
            buf += data
            *lines, buf = buf.split(b"\n")
            for line in lines:
                entry = _json_line(line)
                if entry and entry.get("applied"):
                    pid = int(entry.get("pid", -1))
                    for w in self.workers:
                        if w.pid == pid and w.alive():
                            return w, f"effect {entry.get('key')}"
            time.sleep(0.001)
        return None, ""

    def _wait_for_reply(self, watch: PartitionReader, timeout_s: float) -> str:
        """Wait for the next reply record to become visible; return what it was ("" if
        none came before the timeout or the end of the run)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self._halt.is_set() and not self.all_done():
            for _, value, headers, partition, offset in watch.poll(0.05):
                if value is not None and KIND_HEADER not in headers:  # a child's, not forged
                    child = headers.get("pyrula-child-turn-id", "?")
                    return f"reply of child {child} at replies[{partition}]@{offset}"
        return ""

    def _kill_all_and_restart(self, kind: str, detail: str) -> None:
        """SIGKILL every live worker at once, then restart each with its old id."""
        with self.lock:
            victims = [w for w in self.workers if w.alive()]
            pids = {w.worker_id: w.pid or -1 for w in victims}
            for w in victims:
                w.kill()
            at = time.monotonic() - self.started
            for w in victims:
                self.kills.append(
                    KillRecord(
                        round(at, 2), w.worker_id, pids[w.worker_id], kind, detail, time.time()
                    )
                )
                w.start()
        self.log(f"  t={at:6.1f}s SIGKILL {', '.join(pids)} ({kind}: {detail}); restarted")

    def kill_and_restart(self, worker: Worker, kind: str, detail: str) -> None:
        with self.lock:
            pid = worker.pid or -1
            if worker.proc is not None and not worker.alive():
                at = time.monotonic() - self.started
                code = worker.proc.returncode
                self.found_dead.append(f"t={at:.1f}s {worker.worker_id} pid {pid} exited {code}")
            worker.kill()
            at = time.monotonic() - self.started
            self.kills.append(
                KillRecord(round(at, 2), worker.worker_id, pid, kind, detail, time.time())
            )
            worker.start()
        self.log(
            f"  t={at:6.1f}s SIGKILL {worker.worker_id} (pid {pid}, {kind}"
            f"{': ' + detail if detail else ''}); restarted as pid {worker.pid}"
        )

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(30)


def _json_line(line: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
