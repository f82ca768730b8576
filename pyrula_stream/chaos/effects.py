"""The side-effect store of the chaos agent, and the environment the harness sets.

The chaos tool dedupes on ``ctx.idempotency_key``: under an exclusive file lock it reads
the effects file and appends an ``applied`` line only if the key has not taken effect yet
(else a ``deduped`` line, which tells the harness the tool ran again). Each line is one
``write`` on an ``O_APPEND`` descriptor followed by ``fsync``, so a SIGKILL leaves either
the whole line or nothing, and the lock dies with its holder.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from typing import Any

AGENT_ENV = "PYRULA_CHAOS_AGENT"
PARTITIONS_ENV = "PYRULA_CHAOS_PARTITIONS"
MODEL_URL_ENV = "PYRULA_CHAOS_MODEL_URL"
EFFECTS_ENV = "PYRULA_CHAOS_EFFECTS"
SUBAGENTS_ENV = "PYRULA_CHAOS_SUBAGENTS"
"""Set to 1: each chaos turn also calls two children on the ``<agent>-child`` agent."""
APPROVALS_ENV = "PYRULA_CHAOS_APPROVALS"
"""Set to 1: each chaos turn makes one approval-gated call (``chaos/approvals.py``)."""
HOSTILE_ENV = "PYRULA_CHAOS_HOSTILE"
"""Set to 1: turns may ask (``ask``: park on a gated call nobody legitimate answers) and
have tenants, the unknown ones held to ``hostile_caps.UNKNOWN_TENANT_LIMITS``."""
GATED_EFFECTS_ENV = "PYRULA_CHAOS_GATED_EFFECTS"
"""The effects file of the gated tool (apart: the checks of ``record_effect`` stay as they are)."""


def read_effects(path: str) -> Iterator[dict[str, Any]]:
    """Every complete line of the effects file (a torn last line is skipped)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            yield json.loads(raw)
        except ValueError:
            continue


def apply_effect_once(path: str, key: str, turn: str) -> bool:
    """Make the effect of ``key`` happen once; True if it happened now, False if deduped."""
    lock_fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        applied = not any(e.get("key") == key and e.get("applied") for e in read_effects(path))
        record = {
            "key": key,
            "turn": turn,
            "applied": applied,
            "ts": time.time(),
            "pid": os.getpid(),
        }
        line = json.dumps(record, separators=(",", ":")) + "\n"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return applied
    finally:
        os.close(lock_fd)  # closing releases the flock (as does dying)
