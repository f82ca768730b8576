"""Parked chaos turns (``--autoscale``): a turn that waits on a durable timer or a signal.

A turn submitted with ``park="sleep"`` sleeps ``PARK_SLEEP_S`` after its model call and
tool call (long enough to park: past ``WorkerOptions.durable_timer_after_s``); one with
``park="signal"`` waits for the signal ``PARK_SIGNAL`` that the harness sends later. The
agent notes, in ``$PYRULA_CHAOS_PARKS``, which worker process reached the wait and which
one came back from it, so the harness can tell the parked turns that resumed elsewhere.
A replay notes ``park`` again; the first ``park`` of a turn is the worker that parked it.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from pyrula_stream.context.agent_context import AgentContext

PARKS_ENV = "PYRULA_CHAOS_PARKS"
PARK_SLEEP_S = 7.0
"""Past the default ``durable_timer_after_s`` (5 s): the turn parks, its slot is freed."""
PARK_SIGNAL = "go"
PARK_SIGNAL_TIMEOUT_S = 600.0
"""A durable timer on the wait; far past any run, so a missing signal shows as not resumed."""
KINDS = ("sleep", "signal")


def note(kind: str, turn_id: str, phase: str) -> None:
    """Append one line (one ``write`` on ``O_APPEND``: lines of several workers never mix)."""
    path = os.environ.get(PARKS_ENV)
    if not path:
        return
    line = {"turn": turn_id, "kind": kind, "phase": phase, "pid": os.getpid(), "t": time.time()}
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


async def park(ctx: AgentContext, kind: str) -> dict[str, Any]:
    """Wait as ``kind`` says; returns what the turn's result records of it."""
    if kind not in KINDS:
        raise ValueError(f"park must be one of {KINDS}, not {kind!r}")
    note(kind, ctx.turn_id, "park")
    if kind == "sleep":
        await ctx.sleep(PARK_SLEEP_S)
        got: Any = None
    else:
        got = (await ctx.wait_for_signal(PARK_SIGNAL, timeout=PARK_SIGNAL_TIMEOUT_S)).payload
    note(kind, ctx.turn_id, "resume")
    return {"kind": kind, "signal": got}
