"""The chaos monkey: SIGKILLs workers on a schedule and restarts them with their old id.

Kinds of kill:

- ``after_effect``: watch the effects file and SIGKILL the worker that just applied a side
  effect, within about a millisecond: it dies between the tool's effect and the commit of
  the tool's journal entry, so the next owner runs the tool again (and must dedupe);
- ``random``: a random live worker at a random moment (mid model call, mid commit, mid
  restore, ...).

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

from pyrula_stream.chaos.processes import Worker


@dataclass
class KillRecord:
    at_s: float
    worker: str
    pid: int
    kind: str
    detail: str = ""
    wall_ts: float = 0.0


def kill_plan(kills: int, window_s: float, rng: random.Random) -> list[tuple[float, str]]:
    """``kills`` moments spread over ``window_s``; every other one right after an effect."""
    return [
        (
            window_s * (i + rng.uniform(0.15, 0.85)) / kills,
            "after_effect" if i % 2 == 0 else "random",
        )
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
    ) -> None:
        super().__init__(name="chaos-monkey", daemon=True)
        self.workers = workers
        self.plan = plan
        self.effects = effects
        self.rng = rng
        self.all_done = all_done
        self.log = log
        self.lock = lock
        self.kills: list[KillRecord] = []
        self.started = time.monotonic()
        self._halt = threading.Event()

    def run(self) -> None:
        for at, kind in self.plan:
            while time.monotonic() - self.started < at:
                if self._halt.wait(0.05) or self.all_done():
                    return
            victim: Worker | None = None
            detail = ""
            if kind == "after_effect":
                victim, detail = self._wait_for_effect(5.0)
                if victim is None:
                    kind, detail = "random", "(no effect logged within 5s)"
            if self._halt.is_set():
                return
            if victim is None:
                victim = self.rng.choice([w for w in self.workers if w.alive()] or self.workers)
            self._kill_and_restart(victim, kind, detail)

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

    def _kill_and_restart(self, worker: Worker, kind: str, detail: str) -> None:
        with self.lock:
            pid = worker.pid or -1
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
