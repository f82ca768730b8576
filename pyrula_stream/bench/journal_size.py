"""Journal bytes per turn for turns of 1, 5 and 20 steps, and what stays after they end.

Each turn makes N ``ctx.step`` calls with a ~100-byte result (plus the ``start`` step
every turn has). Bytes are key + value + headers of every journal record the turn caused
(steps, progress records, tombstones, the terminal record), read back under
``read_committed``; they must grow linearly in N because the journal holds deltas, never
a snapshot of the conversation. "Live" applies tombstones: the latest value per key,
counting only keys whose latest value is not a tombstone, i.e. what compaction keeps.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyrula_stream.bench.harness import agent_topics, drop_topics, in_process_worker, unique
from pyrula_stream.bench.load import CompletionReader, Submitter, read_records, turn_requests
from pyrula_stream.bench.stats import line_fit
from pyrula_stream.bench.workload import steps_agent
from pyrula_stream.testing import wait_for
from pyrula_stream.wire.serde import decode_turn_request, headers_dict


@dataclass
class StepSize:
    steps: int
    turns: int
    records_per_turn: float
    bytes_per_turn: float
    live_records_per_turn: float
    live_bytes_per_turn: float

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 1) if isinstance(v, float) else v for k, v in vars(self).items()}


def _size(key: str, value: bytes | None, headers: dict[str, str]) -> int:
    return len(key) + len(value or b"") + sum(len(k) + len(v) for k, v in headers.items())


async def run_journal_size(
    bootstrap: str, *, steps: Sequence[int], turns_per_size: int, keep_topics: bool = False
) -> dict[str, Any]:
    """Run ``turns_per_size`` turns of each size on one worker; measure their journal."""
    agent = steps_agent(unique("jrnl"))
    requests = [r for n in steps for r in turn_requests(agent.name, turns_per_size, {"steps": n})]
    size_of: dict[str, int] = {}
    for req_key, req_value, req_headers in requests:
        request = decode_turn_request(req_value, headers_dict(req_headers))
        size_of[req_key.decode()] = int(request.params["steps"])
    submitter = Submitter(bootstrap)
    try:
        async with in_process_worker(agent, bootstrap):
            reader = CompletionReader(bootstrap, agent.topics.events, agent.partitions)
            try:
                await asyncio.to_thread(submitter.send_all, agent.topics.turns, requests)
                await wait_for(lambda: reader.reached(len(requests)), 300, "journal-size turns")
            finally:
                reader.close()
        records = await asyncio.to_thread(
            read_records, bootstrap, agent.topics.journal, agent.partitions
        )
    finally:
        submitter.close()
        if not keep_topics:
            await asyncio.to_thread(drop_topics, bootstrap, agent_topics(agent))
    written: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    latest: dict[str, tuple[int, int | None]] = {}
    for _, key, value, headers in records:
        n = size_of.get(key.split("/", 1)[0])
        if n is None:
            continue
        size = _size(key, value, headers)
        written[n][0] += 1
        written[n][1] += size
        latest[key] = (n, size if value is not None else None)
    live: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for n, live_size in latest.values():
        if live_size is not None:
            live[n][0] += 1
            live[n][1] += live_size
    sizes = [
        StepSize(
            n,
            turns_per_size,
            written[n][0] / turns_per_size,
            written[n][1] / turns_per_size,
            live[n][0] / turns_per_size,
            live[n][1] / turns_per_size,
        )
        for n in steps
    ]
    slope, intercept, r2 = line_fit([s.steps for s in sizes], [s.bytes_per_turn for s in sizes])
    return {
        "sizes": [s.as_dict() for s in sizes],
        "journal_bytes_per_step": round(slope, 1),
        "journal_bytes_per_turn_fixed": round(intercept, 1),
        "linear_r2": round(r2, 5),
        "live_bytes_per_finished_turn": round(max(s.live_bytes_per_turn for s in sizes), 1),
    }
