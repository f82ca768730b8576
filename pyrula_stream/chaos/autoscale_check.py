"""The checks and figures of ``--autoscale`` that the other modes lack.

- ``parked_not_resumed`` (gated): parked turns whose terminal event is not a completion
  that came back from its wait (the result's ``parked``);
- ``parked_handed_over``: parked turns that came back in another worker process than the
  one that parked them (``chaos/parking.py`` notes both);
- ``lag_drained_per_wave``: each wave's highest lag and how long after the wave began the
  lag was 0 again;
- ``longest_stall_s``: the longest time the lag was above 0 and no turn ended.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

from pyrula_stream.chaos import verify
from pyrula_stream.chaos.parking import PARK_SIGNAL
from pyrula_stream.wire.events import EventType

AUTOSCALE_KEYS = ("parked_not_resumed", "worker_crashes", "autoscale_short")
"""Gated in an ``--autoscale`` run; ``autoscale_short`` counts the minimums it missed
(``scale_ups``, ``scale_downs``, ``parked_handed_over``): without them it proves nothing."""


def signal_payload(turn_id: str) -> str:
    """What the harness sends a turn parked on a signal, and the turn's result keeps."""
    return f"{PARK_SIGNAL} {turn_id}"


def check_parked(
    parked: Mapping[str, str],
    events: list[verify.Record],
    notes: list[dict[str, Any]],
    f: verify.Findings,
) -> None:
    """``parked``: turn id to its kind; ``notes``: the lines of ``$PYRULA_CHAOS_PARKS``."""
    results: dict[str, Any] = {}
    for event in verify.readable_events(events):
        if event.turn_id in parked and event.is_terminal and event.turn_id not in results:
            ok = event.type == EventType.RUN_COMPLETE
            results[event.turn_id] = (event.data.get("result") or {}) if ok else None
    f.zero("parked_not_resumed", "parked_handed_over")
    for turn, kind in parked.items():
        got = (results.get(turn) or {}).get("parked") or {}
        want = signal_payload(turn) if kind == "signal" else None
        if got.get("kind") != kind or got.get("signal") != want:
            f.add("parked_not_resumed", example=f"{turn} ({kind}): {results.get(turn)}")
    first_park: dict[str, int] = {}
    last_resume: dict[str, int] = {}
    for line in notes:
        turn, pid = str(line.get("turn")), int(line.get("pid", 0))
        if line.get("phase") == "park":
            first_park.setdefault(turn, pid)
        elif line.get("phase") == "resume":
            last_resume[turn] = pid
    for turn, pid in last_resume.items():
        if turn in parked and first_park.get(turn, pid) != pid:
            f.add("parked_handed_over", example=f"{turn}: parked in pid {first_park[turn]}")
    f.counts["parked_turns"] = len(parked)
    f.counts["parked_by_kind"] = {
        k: list(parked.values()).count(k) for k in sorted(set(parked.values()))
    }


def wave_figures(
    waves: list[tuple[float, int]], samples: list[tuple[float, int, int]], t0: float
) -> list[dict[str, Any]]:
    """Per wave (start time, turns): the highest lag seen until the next wave, the most
    workers, and seconds from the wave's start to the first poll with lag 0 after that peak
    (None: never drained)."""
    out = []
    ends = [start for start, _ in waves[1:]] + [float("inf")]
    for i, ((start, turns), end) in enumerate(zip(waves, ends, strict=True)):
        seen = [(t, lag, n) for t, lag, n in samples if start <= t < end]
        peak_lag = max((lag for _, lag, _ in seen), default=0)
        peak_at = next((t for t, lag, _ in seen if lag == peak_lag), start)
        drained = next((t for t, lag, _ in seen if t >= peak_at and lag == 0), None)
        out.append(
            {
                "wave": i + 1,
                "turns": turns,
                "at_s": round(start - t0, 1),
                "peak_lag": peak_lag,
                "most_workers": max((n for _, _, n in seen), default=0),
                "drained_after_s": None if drained is None else round(drained - start, 1),
            }
        )
    return out


def longest_stall(samples: list[tuple[float, int, int]], finishes: Iterable[float]) -> float:
    """The longest time the lag stayed above 0 (from the poll that saw it to the poll that
    saw 0) while no turn ended."""
    ends = sorted(finishes)
    runs: list[tuple[float, float]] = []
    start: float | None = None
    for t, found, _ in samples:
        if found > 0 and start is None:
            start = t
        elif found <= 0 and start is not None:
            runs.append((start, t))
            start = None
    if start is not None:
        runs.append((start, samples[-1][0]))
    worst = 0.0
    for a, b in runs:
        marks = [a, *(e for e in ends if a < e < b), b]
        worst = max(worst, *(y - x for x, y in itertools.pairwise(marks)))
    return round(worst, 1)
