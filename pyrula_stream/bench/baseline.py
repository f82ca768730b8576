"""The baseline measured again in the same run: an older commit's framework, side by side.

A typed baseline (a figure copied from an older run) compares this run's machine, broker
and noise with another day's. With ``--baseline-commit C`` the bench unpacks commit ``C``
into a cache folder (``git archive``: no checkout, no network) and runs that tree's own
``run_framework`` in a subprocess whose ``PYTHONPATH`` puts the old tree first, on the
installed dependencies of this one (no virtualenv to build). It runs in each throughput
round beside the framework and the floor, against the same broker and workload, so each
``baseline_*`` factor compares like with like.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CACHE = Path(tempfile.gettempdir()) / "pyrula-bench-baseline"

_DRIVER = """
import asyncio, inspect, json, sys, time
from pyrula_stream.bench.framework import run_framework
args = json.loads(sys.argv[1])
wanted = {"turns": args["turns"], "partitions": args["partitions"],
          "concurrency": args["concurrency"]}
params = inspect.signature(run_framework).parameters
kw = {k: v for k, v in wanted.items() if k in params}
try:
    from pyrula_stream.runtime import event_loop
    run_loop = event_loop.run
except ImportError:
    run_loop = asyncio.run
cpu0 = time.process_time()
run = run_loop(run_framework(args["bootstrap"], **kw))
print(json.dumps({"turns": run.turns, "seconds": run.seconds, "commits": run.commits,
                  "records_committed": run.records_committed,
                  "process_cpu_s": time.process_time() - cpu0}))
"""
"""Runs inside the old tree: only its ``run_framework``, whose keywords have not changed
since the bench began (the ones it lacks are left out)."""


def resolve_commit(commit: str, repo: Path = REPO) -> str:
    """The full hash of ``commit`` (a short hash, ``HEAD~3``, a tag) in ``repo``."""
    out = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", f"{commit}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"--baseline-commit {commit}: {out.stderr.strip() or 'unknown'}")
    return out.stdout.strip()


def baseline_tree(commit: str, cache: Path = DEFAULT_CACHE, repo: Path = REPO) -> Path:
    """The source tree of ``commit``, unpacked once into ``cache/<hash>`` and reused."""
    sha = resolve_commit(commit, repo)
    tree = cache / sha
    if (tree / ".complete").exists():
        return tree
    tree.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile() as archive:
        subprocess.run(
            ["git", "-C", str(repo), "archive", "--format=tar", sha], stdout=archive, check=True
        )
        archive.seek(0)
        with tarfile.open(fileobj=archive) as tar:
            tar.extractall(tree, filter="data")
    (tree / ".complete").write_text(sha + "\n")
    return tree


def run_baseline_framework(
    tree: Path,
    bootstrap: str,
    *,
    turns: int,
    partitions: int,
    concurrency: int,
    timeout_s: float = 900.0,
) -> dict[str, Any]:
    """One throughput run of the old tree's framework (blocking): turns/s as its own
    bench counted them, first submit to last ``run:complete`` read back."""
    args = {
        "bootstrap": bootstrap,
        "turns": turns,
        "partitions": partitions,
        "concurrency": concurrency,
    }
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", _DRIVER, json.dumps(args)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"baseline run in {tree} failed: {out.stderr[-2000:]}")
    run: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    seconds = float(run["seconds"])
    return {
        "turns_per_s": round(run["turns"] / seconds, 1),
        "seconds": round(seconds, 3),
        "commits": run["commits"],
        "records_committed": run["records_committed"],
    }
