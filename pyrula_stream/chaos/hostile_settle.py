"""After the last valid turn of a ``--hostile`` run: wait for the hostile records' outcomes.

The harness waits until every record's documented outcome shows (a dead letter, a log
line, each signal journaled or dead-lettered), or ``settle_s``, restarting crashed
workers meanwhile (they stay counted), then until each worker has counted the unreadable
control records it read again.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pyrula_stream.agent.definition import AgentTopics
from pyrula_stream.chaos import hostile_check
from pyrula_stream.chaos.hostile import HostileSender
from pyrula_stream.chaos.hostile_caps_check import journaled_signals
from pyrula_stream.chaos.processes import Worker
from pyrula_stream.kafka.admin import DEFAULT_PREFIX
from pyrula_stream.kafka.consumers import read_topic


def control_skips(worker: Worker, agent: str) -> int:
    """The worker's ``pyrula_skipped_records`` for control records (-1: unreadable)."""
    try:
        url = f"http://127.0.0.1:{worker.health_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return hostile_check.control_skips(resp.read().decode(), agent)
    except (OSError, ValueError):
        return -1


def settle_hostile(
    sender: HostileSender,
    bootstrap: str,
    agent: str,
    workers: list[Worker],
    run_dir: Path,
    settle_s: float,
    restart_crashed: Callable[[], None],
    say: Callable[[str], None],
    *,
    kafka_config: Mapping[str, Any] | None = None,
) -> dict[str, int]:
    """Wait as the module docstring says; returns each worker's skipped-control count."""
    topics = AgentTopics.for_agent(agent, DEFAULT_PREFIX)
    sender.join(settle_s)
    deadline = time.monotonic() + settle_s
    signals = any(rec.expect in ("flood", "not_taken") for rec in sender.sent)
    while True:
        # Signals are decided when journaled under their turn or dead-lettered.
        held = (
            journaled_signals(read_topic(bootstrap, topics.journal, kafka_config=kafka_config))
            if signals
            else {}
        )
        outcomes = hostile_check.Outcomes(
            read_topic(bootstrap, topics.dlq, kafka_config=kafka_config),
            hostile_check.control_log_markers(run_dir.glob("worker-*.log")),
            held,
        )
        left = hostile_check.pending(sender.sent, outcomes)
        if not left and not sender.is_alive():
            break
        if time.monotonic() > deadline:
            say(
                f"  {len(left)} hostile records without their outcome after {settle_s}s, "
                f"e.g. {left[0].describe() if left else ''}"
            )
            break
        restart_crashed()
        time.sleep(1.0)
    # A worker restarted late counts the control records once it has read them again.
    unreadable = sum(1 for rec in sender.sent if rec.expect == "skipped")
    deadline = time.monotonic() + 30.0
    while True:
        skips = {w.worker_id: control_skips(w, agent) for w in workers}
        counts = skips.values()
        if min(counts, default=0) >= unreadable or all(n < 0 for n in counts):
            return skips  # all counted, or no worker serves /metrics (a mesh)
        if time.monotonic() > deadline:
            return skips
        time.sleep(0.5)
