"""``pyrula-stream worker ... --processes N``: one worker process per core, supervised.

Python runs one event loop on one core, so a machine's other cores need other processes.
The supervisor starts N workers of the same agent in one consumer group, each with a
stable, distinct worker id (``<id>-<i>``), so a restarted child keeps its transactional id
(and, with static membership, its partitions). A child that dies is restarted with
backoff; SIGTERM or SIGINT is passed to every child, which drains as a single worker does,
and the supervisor exits once all of them have.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pyrula_stream.runtime.cpu_limit import CGROUP_ROOT, cpu_limit

log = logging.getLogger(__name__)

RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)
STABLE_AFTER_S = 30.0
"""A child that ran this long before dying is restarted without backoff."""


def process_count(
    value: str, *, cgroup_root: Path = CGROUP_ROOT, own_cgroup: str | None = None
) -> int:
    """``auto`` (the cores the container may use: its CPU quota) or a positive integer."""
    if value == "auto":
        return cpu_limit(cgroup_root, own_cgroup)
    count = int(value)
    if count < 1:
        raise ValueError(f"--processes must be >= 1 or auto, got {value!r}")
    return count


@dataclass
class _Child:
    worker_id: str
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    failures: int = 0
    exit_codes: list[int] = field(default_factory=list)

    def start(self) -> None:
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, env=child_env())
        self.started = time.monotonic()
        log.warning("worker %s started (pid %d)", self.worker_id, self.proc.pid)


class Supervisor:
    """Runs ``count`` copies of ``worker_argv`` (the CLI's own worker command)."""

    def __init__(
        self,
        worker_argv: Sequence[str],
        *,
        count: int,
        base_id: str,
        health_port: int | None = None,
    ) -> None:
        self.children = []
        for i in range(count):
            argv = [*worker_argv, "--worker-id", f"{base_id}-{i}"]
            if health_port is not None:
                argv += ["--health-port", str(health_port + i)]
            self.children.append(_Child(f"{base_id}-{i}", argv))
        self._stopping = False
        self._next_restart: dict[str, float] = {}

    def stop(self, *_: object) -> None:
        """Pass the stop to every child; ``run`` returns once they have exited."""
        if self._stopping:
            return
        self._stopping = True
        for child in self.children:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)

    def run(self) -> int:
        """Start every child, keep them running until stopped; 0 when all drained cleanly."""
        for child in self.children:
            child.start()
        while True:
            alive = 0
            for child in self.children:
                code = child.proc.poll() if child.proc is not None else 0
                if code is None:
                    alive += 1
                    continue
                if child.proc is not None:
                    child.exit_codes.append(code)
                    child.proc = None
                    if not self._stopping:
                        self._schedule_restart(child, code)
                if not self._stopping and self._due(child):
                    child.start()
                    alive += 1
            if self._stopping and alive == 0:
                break
            time.sleep(0.1)
        failed = [c.worker_id for c in self.children if c.exit_codes and c.exit_codes[-1] != 0]
        return 1 if failed else 0

    def _schedule_restart(self, child: _Child, code: int) -> None:
        ran = time.monotonic() - child.started
        child.failures = 0 if ran > STABLE_AFTER_S else child.failures + 1
        delay = RESTART_BACKOFF_S[min(child.failures, len(RESTART_BACKOFF_S) - 1)]
        log.error(
            "worker %s exited with %d after %.1fs; restarting in %gs",
            child.worker_id,
            code,
            ran,
            delay,
        )
        self._next_restart[child.worker_id] = time.monotonic() + delay

    def _due(self, child: _Child) -> bool:
        at = self._next_restart.get(child.worker_id)
        if child.proc is not None or at is None or time.monotonic() < at:
            return False
        del self._next_restart[child.worker_id]
        return True


OWN_FLAGS = {"--processes": 1, "--worker-id": 1, "--health-port": 1}
"""Options the supervisor sets per child (with how many values they take)."""


def child_args(cli_args: Sequence[str]) -> tuple[list[str], int | None]:
    """The worker command line without the per-child options, and ``--health-port``.

    Everything else passes through unchanged, so a child runs exactly what was asked.
    """
    out: list[str] = []
    health: int | None = None
    args = list(cli_args)
    i = 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if name in OWN_FLAGS:
            if not eq:
                i += 1
                value = args[i] if i < len(args) else ""
            if name == "--health-port":
                health = int(value)
        else:
            out.append(args[i])
        i += 1
    return out, health


PER_SUPERVISOR_ENV = ("PYRULA_PROCESSES", "PYRULA_WORKER_ID", "PYRULA_HEALTH_PORT")
"""Variables (``cli.env``) that configure the supervisor, not its children: a child that
inherited ``PYRULA_PROCESSES`` would be a supervisor itself."""


def child_env() -> dict[str, str]:
    """The supervisor's environment without what it sets per child."""
    return {k: v for k, v in os.environ.items() if k not in PER_SUPERVISOR_ENV}


def run_supervisor(
    cli_args: Sequence[str], *, count: int, base_id: str, health_port: int | None = None
) -> int:
    """Supervise ``count`` processes of ``pyrula-stream <cli_args>`` (a worker command).

    With a health port ``P`` (``--health-port``, else ``health_port``: it may come from
    ``PYRULA_HEALTH_PORT``) child ``i`` serves its probes on ``P + i``.
    """
    worker_args, health = child_args(cli_args)
    health = health if health is not None else health_port
    argv = [sys.executable, "-m", "pyrula_stream.cli", *worker_args]
    supervisor = Supervisor(argv, count=count, base_id=base_id, health_port=health)
    signal.signal(signal.SIGTERM, supervisor.stop)
    signal.signal(signal.SIGINT, supervisor.stop)
    return supervisor.run()
