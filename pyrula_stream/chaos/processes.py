"""The processes of a chaos run: the model server and the workers, each in its own group.

Every process is started with ``start_new_session=True`` so a kill reaches the whole
process group and nothing is left behind; ``stop()`` and ``kill()`` always reap.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO

import pyrula_stream
from pyrula_stream.kafka.local.broker import free_port

AGENT_SPEC = "pyrula_stream.chaos.agent:chaos"
CHILD_SPEC = "pyrula_stream.chaos.agent:chaos_child"


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """Our environment plus ``extra``, with this checkout first on ``PYTHONPATH``."""
    root = str(Path(pyrula_stream.__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else ""), **extra}


class Managed:
    """One child process in its own process group, its output in a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.starts = 0
        self.exit_codes: list[int] = []

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, stdout: int | None = None) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in _reap)
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=stdout if stdout is not None else self._log,
            stderr=self._log,
            start_new_session=True,
        )
        self.starts += 1

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL the process group and reap it."""
        self.signal(signal.SIGKILL)
        self._reap(10.0)

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM, wait ``grace_s``, then SIGKILL; returns the exit code of the SIGTERM."""
        if self.proc is None:
            return None
        self.signal(signal.SIGTERM)
        try:
            code = self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            code = None
        self.kill()
        return code

    def _reap(self, timeout_s: float) -> None:
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.exit_codes.append(self.proc.wait(timeout_s))
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None


class ModelServer(Managed):
    """``python -m pyrula_stream.chaos.model_server`` on a loopback port."""

    def __init__(
        self,
        run_dir: Path,
        call_log: Path,
        *,
        min_latency_ms: float,
        max_latency_ms: float,
        seed: int,
    ) -> None:
        argv = [
            sys.executable,
            "-m",
            "pyrula_stream.chaos.model_server",
            "--log",
            str(call_log),
            "--min-latency-ms",
            str(min_latency_ms),
            "--max-latency-ms",
            str(max_latency_ms),
            "--seed",
            str(seed),
        ]
        super().__init__("model-server", argv, child_env({}), run_dir / "model_server.log")
        self.port = 0

    def start_and_wait(self, timeout_s: float = 30.0) -> str:
        self.start(stdout=subprocess.PIPE)
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline().decode().strip()
        if not line.startswith("PORT "):
            self.kill()
            raise RuntimeError(f"model server did not start (said {line!r}); see {self.log_path}")
        self.port = int(line.split()[1])
        url = f"http://127.0.0.1:{self.port}/v1"
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    return url
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


class Worker(Managed):
    """``python -m pyrula_stream.cli worker ... --worker-id chaos-<i>`` (stable id)."""

    def __init__(
        self,
        index: int,
        run_dir: Path,
        bootstrap: str,
        env: dict[str, str],
        *,
        shutdown_grace: float,
        extra_args: list[str] | None = None,
        specs: tuple[str, ...] = (AGENT_SPEC,),
    ) -> None:
        self.worker_id = f"chaos-{index}"
        self.health_port = 0
        self._base = [
            sys.executable,
            "-m",
            "pyrula_stream.cli",
            "worker",
            *specs,
            "--bootstrap-servers",
            bootstrap,
            "--worker-id",
            self.worker_id,
            "--shutdown-grace",
            str(shutdown_grace),
            *(extra_args or []),
        ]
        super().__init__(
            self.worker_id, list(self._base), env, run_dir / f"worker-{self.worker_id}.log"
        )

    def start(self, stdout: int | None = None) -> None:
        self.health_port = free_port()
        self.argv = [*self._base, "--health-port", str(self.health_port)]
        super().start(stdout)

    def ready(self) -> bool:
        if not self.alive():
            return False
        try:
            url = f"http://127.0.0.1:{self.health_port}/readyz"
            with urllib.request.urlopen(url, timeout=1) as resp:
                return int(resp.status) == 200
        except OSError:
            return False
